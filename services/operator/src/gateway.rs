//! The gateway side of reconciliation: what a `Tenant` or `KillSwitch` asks of identity and
//! policy-firewall, done over their clients (gRPC in a cluster, local in tests) and idempotent, so a
//! retry after any failure converges to the same state. Each change it makes (keys minted and
//! revoked, kill switches set and lifted, the tenant's status moved) reaches the tenant's SIEM through the fan-out as the same
//! `audit.<action>` event the edge announces for the change made over REST, its actor the resource.

use brainstorm_observability_fanout::events::tenant_status_changed;
use brainstorm_proto::identity::{
    CreateApiKeyRequest, IdentityClient, RegisterRequest, RevokeApiKeyRequest, SetTenantPlanRequest, SetTenantStatusRequest, Tenant,
    TenantRef, UpdateTenantRequest,
};
use brainstorm_proto::observability::{ActivityEvent, ObservabilityFanoutClient};
use brainstorm_proto::policy::{
    ActivateKillSwitchRequest, ActivateScopeRequest, DeactivateKillSwitchRequest, PolicyFirewallClient, ScopeRef,
    TenantRef as PolicyTenantRef,
};
use brainstorm_proto::{ErrorKind, ServiceError};

use crate::crd::{AppliedSwitch, Scope, TenantSpec};

/// The name given to admin keys the operator mints for a `Tenant`'s Secret.
const OPERATOR_KEY_NAME: &str = "kubernetes-operator";

/// The services the operator drives.
#[derive(Clone, Debug)]
pub struct Gateway {
    pub identity: IdentityClient,
    pub policy: PolicyFirewallClient,
    /// Where the changes are announced to the tenant's destinations; None announces nothing.
    pub observability: Option<ObservabilityFanoutClient>,
}

/// A tenant after convergence, and the admin key minted for its Secret if one was needed.
#[derive(Debug)]
pub struct TenantOutcome {
    pub tenant: Tenant,
    pub minted: Option<MintedKey>,
    /// Whether this call registered the tenant.
    pub registered: bool,
    /// With a key minted for an existing tenant: the keys it replaces, to revoke once the new one
    /// is stored (the key registration made and keys minted before for this resource, unless the
    /// Secret holds them). A retry after a crash between minting and writing the Secret leaves no
    /// live key that nobody holds.
    pub superseded: Vec<String>,
}

/// A freshly minted admin key: the plaintext exists only here and in the Secret it is written to.
pub struct MintedKey {
    pub id: String,
    pub prefix: String,
    pub plaintext: String,
}

impl std::fmt::Debug for MintedKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("MintedKey").field("id", &self.id).field("prefix", &self.prefix).finish_non_exhaustive()
    }
}

/// A switch a `KillSwitch` resource asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredSwitch {
    pub switch: AppliedSwitch,
    pub active: bool,
    pub reason: String,
}

/// The gateway's switch after convergence.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SwitchOutcome {
    pub active: bool,
    pub activated_at: Option<String>,
    pub activated_by: Option<String>,
    /// The switch this actor holds on now (None when it is off or somebody else set it).
    pub applied: Option<AppliedSwitch>,
}

impl Gateway {
    /// Makes tenant `tenant_id` match `spec`: registers it under that id on first sight, then sets
    /// its name, plan (when the spec names one) and status (`active`, or `rejected` when suspended).
    /// Mints an admin key when `held_key` (the key id the Secret holds) is absent or no longer valid.
    pub async fn converge_tenant(
        &self,
        tenant_id: &str,
        spec: &TenantSpec,
        held_key: Option<&str>,
        actor: &str,
    ) -> Result<TenantOutcome, ServiceError> {
        let name = spec.display_name.trim();
        let (mut tenant, mut minted) = match self.identity.get_tenant(TenantRef { tenant_id: tenant_id.to_string() }).await {
            Ok(tenant) => (tenant, None),
            Err(error) if error.kind == ErrorKind::NotFound => {
                let request = RegisterRequest { tenant_name: name.to_string(), invite_code: None, tenant_id: Some(tenant_id.to_string()) };
                let registered = self.identity.register(request).await?;
                let tenant = registered.tenant.ok_or_else(|| missing("register answered without a tenant"))?;
                let key = registered.api_key.ok_or_else(|| missing("register answered without a key"))?;
                let record = key.key.ok_or_else(|| missing("register answered without the key's record"))?;
                tracing::info!(tenant_id, actor, "tenant registered");
                (tenant, Some(MintedKey { id: record.id, prefix: record.prefix, plaintext: key.plaintext }))
            }
            Err(error) => return Err(error),
        };
        let registered = minted.is_some();
        if tenant.name != name {
            tenant =
                self.identity.update_tenant(UpdateTenantRequest { tenant_id: tenant_id.to_string(), name: Some(name.to_string()) }).await?;
        }
        if let Some(plan) = spec.plan.filter(|plan| plan.as_str() != tenant.plan) {
            tenant = self
                .identity
                .set_tenant_plan(SetTenantPlanRequest { tenant_id: tenant_id.to_string(), plan: plan.as_str().to_string() })
                .await?;
        }
        let status = if spec.suspended { "rejected" } else { "active" };
        if tenant.status != status {
            let moved = self
                .identity
                .set_tenant_status(SetTenantStatusRequest { tenant_id: tenant_id.to_string(), status: status.to_string() })
                .await?;
            if moved.changed {
                self.announce(tenant_status_changed(tenant_id, actor.to_string(), &moved.previous_status, status));
            }
            tenant = moved.tenant.unwrap_or_default();
        }
        let mut superseded = Vec::new();
        if minted.is_none() {
            let keys = self.identity.list_api_keys(TenantRef { tenant_id: tenant_id.to_string() }).await?.keys;
            let held_live = held_key.is_some_and(|held| keys.iter().any(|key| key.id == held && key.revoked_at.is_none()));
            if !held_live {
                superseded = keys
                    .iter()
                    .filter(|key| key.revoked_at.is_none() && Some(key.id.as_str()) != held_key)
                    .filter(|key| is_registration_key(key) || (key.name == OPERATOR_KEY_NAME && key.created_by.as_deref() == Some(actor)))
                    .map(|key| key.id.clone())
                    .collect();
                minted = Some(self.mint_admin_key(tenant_id, actor).await?);
            }
        }
        Ok(TenantOutcome { tenant, minted, registered, superseded })
    }

    async fn mint_admin_key(&self, tenant_id: &str, actor: &str) -> Result<MintedKey, ServiceError> {
        let permissions = brainstorm_identity::rbac::role_permissions("admin").unwrap_or_default();
        let request = CreateApiKeyRequest {
            tenant_id: tenant_id.to_string(),
            name: OPERATOR_KEY_NAME.to_string(),
            role: "admin".to_string(),
            scopes: vec!["admin".to_string()],
            created_by: actor.to_string(),
            creator_permissions: permissions.iter().map(|permission| (*permission).to_string()).collect(),
            ..CreateApiKeyRequest::default()
        };
        let created = self.identity.create_api_key(request).await?;
        let record = created.key.ok_or_else(|| missing("create_api_key answered without the key's record"))?;
        tracing::info!(tenant_id, key_id = %record.id, actor, "admin key minted for the tenant's Secret");
        let mut event = activity(tenant_id, "api_key.created", actor, &record.id, 1);
        event.data_json =
            serde_json::json!({"name": record.name, "role": record.role, "prefix": record.prefix, "scopes": record.scopes}).to_string();
        self.announce(event);
        Ok(MintedKey { id: record.id, prefix: record.prefix, plaintext: created.plaintext })
    }

    /// Revokes a key (`actor` revoking it); a key or tenant that is already gone counts as revoked.
    pub async fn revoke_key(&self, tenant_id: &str, key_id: &str, actor: &str) -> Result<(), ServiceError> {
        let request = RevokeApiKeyRequest { tenant_id: tenant_id.to_string(), key_id: key_id.to_string() };
        match self.identity.revoke_api_key(request).await {
            Ok(revoked) => {
                if let (true, Some(key)) = (revoked.changed, revoked.key) {
                    let mut event = activity(tenant_id, "api_key.revoked", actor, &key.id, 3);
                    event.data_json = serde_json::json!({"name": key.name, "role": key.role, "prefix": key.prefix}).to_string();
                    self.announce(event);
                }
                Ok(())
            }
            Err(error) if matches!(error.kind, ErrorKind::NotFound | ErrorKind::Conflict) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Hands a change to the fan-out, when there is one, off the reconciliation.
    fn announce(&self, event: ActivityEvent) {
        if let Some(observability) = &self.observability {
            brainstorm_observability_fanout::events::announce(observability, event);
        }
    }

    /// Sets a tenant's status to `rejected` (its keys stop authenticating; `actor` doing it); a
    /// missing tenant is fine.
    pub async fn suspend_tenant(&self, tenant_id: &str, actor: &str) -> Result<(), ServiceError> {
        let request = SetTenantStatusRequest { tenant_id: tenant_id.to_string(), status: "rejected".to_string() };
        match self.identity.set_tenant_status(request).await {
            Ok(moved) => {
                if moved.changed {
                    self.announce(tenant_status_changed(tenant_id, actor.to_string(), &moved.previous_status, "rejected"));
                }
                Ok(())
            }
            Err(error) if error.kind == ErrorKind::NotFound => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Whether a tenant exists in the gateway.
    pub async fn tenant_exists(&self, tenant_id: &str) -> Result<bool, ServiceError> {
        match self.identity.get_tenant(TenantRef { tenant_id: tenant_id.to_string() }).await {
            Ok(_) => Ok(true),
            Err(error) if error.kind == ErrorKind::NotFound => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Brings the gateway's switches to what `desired` asks (None: the resource is being deleted).
    /// A switch this actor set earlier (`applied`) and no longer wanted is lifted; a switch somebody
    /// else set is never lifted (fail closed: an incident responder's switch outlives any resource).
    pub async fn converge_switch(
        &self,
        desired: Option<&DesiredSwitch>,
        applied: Option<&AppliedSwitch>,
        actor: &str,
    ) -> Result<SwitchOutcome, ServiceError> {
        if let Some(applied) = applied {
            let still_wanted = desired.is_some_and(|desired| desired.active && desired.switch == *applied);
            if !still_wanted {
                self.lift(applied, actor).await?;
            }
        }
        let Some(desired) = desired else { return Ok(SwitchOutcome::default()) };
        let mut seen = self.observe(&desired.switch).await?;
        if desired.active && !seen.active {
            self.set(&desired.switch, &desired.reason, actor).await?;
            seen = self.observe(&desired.switch).await?;
        }
        let ours = seen.active && seen.activated_by.as_deref() == Some(actor);
        Ok(SwitchOutcome { applied: ours.then(|| desired.switch.clone()), ..seen })
    }

    async fn observe(&self, switch: &AppliedSwitch) -> Result<SwitchOutcome, ServiceError> {
        let tenant = PolicyTenantRef { tenant_id: switch.tenant_id.clone() };
        match (switch.scope, switch.target.as_deref()) {
            (Scope::Tenant, _) => {
                let status = self.policy.get_kill_switch_status(tenant).await?;
                let on = status.active;
                Ok(SwitchOutcome {
                    active: on,
                    activated_at: status.activated_at.filter(|_| on),
                    activated_by: status.activated_by.filter(|_| on),
                    applied: None,
                })
            }
            (scope, target) => {
                let scopes = self.policy.list_scopes(tenant).await?;
                let found = scopes
                    .scopes
                    .into_iter()
                    .find(|entry| entry.active && entry.r#type == scope.as_str() && Some(entry.id.as_str()) == target);
                Ok(found.map_or_else(SwitchOutcome::default, |entry| SwitchOutcome {
                    active: true,
                    activated_at: Some(entry.activated_at),
                    activated_by: Some(entry.activated_by),
                    applied: None,
                }))
            }
        }
    }

    async fn set(&self, switch: &AppliedSwitch, reason: &str, actor: &str) -> Result<(), ServiceError> {
        let result = match (switch.scope, &switch.target) {
            (Scope::Tenant, _) => self
                .policy
                .activate_kill_switch(ActivateKillSwitchRequest {
                    tenant_id: switch.tenant_id.clone(),
                    reason: reason.to_string(),
                    activated_by: actor.to_string(),
                })
                .await
                .map(drop),
            (scope, target) => self
                .policy
                .activate_scope(ActivateScopeRequest {
                    tenant_id: switch.tenant_id.clone(),
                    r#type: scope.as_str().to_string(),
                    id: target.clone().unwrap_or_default(),
                    reason: Some(reason.to_string()),
                    activated_by: actor.to_string(),
                })
                .await
                .map(drop),
        };
        match result {
            // Somebody switched it on between the read and the write: on is what was asked.
            Err(error) if error.kind == ErrorKind::Conflict => Ok(()),
            Err(error) => Err(error),
            Ok(()) => {
                let mut event = match switch.scope {
                    Scope::Tenant => activity(&switch.tenant_id, "kill_switch.activated", actor, &switch.tenant_id, 5),
                    scope => activity(&switch.tenant_id, "kill_switch.scope_activated", actor, &scope_subject(scope, &switch.target), 4),
                };
                event.reason = reason.to_string();
                self.announce(event);
                Ok(())
            }
        }
    }

    /// Switches `switch` off if it is on and this actor set it.
    async fn lift(&self, switch: &AppliedSwitch, actor: &str) -> Result<(), ServiceError> {
        let seen = self.observe(switch).await?;
        if !seen.active || seen.activated_by.as_deref() != Some(actor) {
            return Ok(());
        }
        let result = match (switch.scope, &switch.target) {
            (Scope::Tenant, _) => self
                .policy
                .deactivate_kill_switch(DeactivateKillSwitchRequest {
                    tenant_id: switch.tenant_id.clone(),
                    deactivated_by: actor.to_string(),
                })
                .await
                .map(drop),
            (scope, target) => self
                .policy
                .deactivate_scope(ScopeRef {
                    tenant_id: switch.tenant_id.clone(),
                    r#type: scope.as_str().to_string(),
                    id: target.clone().unwrap_or_default(),
                })
                .await
                .map(drop),
        };
        tracing::info!(tenant_id = %switch.tenant_id, scope = switch.scope.as_str(), target = ?switch.target, actor, "kill switch lifted");
        match result {
            Err(error) if matches!(error.kind, ErrorKind::Conflict | ErrorKind::NotFound) => Ok(()),
            Err(error) => Err(error),
            Ok(()) => {
                self.announce(match switch.scope {
                    Scope::Tenant => activity(&switch.tenant_id, "kill_switch.deactivated", actor, &switch.tenant_id, 3),
                    scope => activity(&switch.tenant_id, "kill_switch.scope_deactivated", actor, &scope_subject(scope, &switch.target), 3),
                });
                Ok(())
            }
        }
    }
}

/// A change `actor` (the resource, `kubernetes:<namespace>/<name>`) made now on `subject`.
fn activity(tenant_id: &str, action: &str, actor: &str, subject: &str, severity: u32) -> ActivityEvent {
    brainstorm_observability_fanout::events::activity(tenant_id, action, actor.to_string(), subject, severity)
}

/// A scoped switch as activity events name it: `<scope>:<target>`, as the edge does.
fn scope_subject(scope: Scope, target: &Option<String>) -> String {
    format!("{}:{}", scope.as_str(), target.as_deref().unwrap_or_default())
}

/// The admin key registration makes (named `registration`, created by nobody).
fn is_registration_key(key: &brainstorm_proto::identity::ApiKey) -> bool {
    key.name == "registration" && key.created_by.is_none()
}

fn missing(what: &str) -> ServiceError {
    ServiceError::new(ErrorKind::Internal, "incomplete_answer", what)
}
