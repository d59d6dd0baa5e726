//! The Kubernetes side: two kube-runtime controllers (Tenants, owning their Secrets, and
//! KillSwitches) that read the resources, call `Gateway`, and write Secrets, finalizers and status.
//!
//! Every write is a JSON merge patch (or a create), so the operator needs no server-side apply and
//! works against any API server that speaks the common verbs.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde_json::json;

use crate::crd::{AppliedSwitch, Condition, DeletionPolicy, KillSwitch, KillSwitchStatus, Scope, Tenant, TenantStatus};
use crate::gateway::{DesiredSwitch, Gateway, MintedKey};

/// Held on every resource the operator has acted on, so deleting it waits for the gateway's cleanup.
pub const FINALIZER: &str = "brainstorm.dev/operator";
/// Label on the Secrets the operator writes (and the only Secrets it watches).
const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "brainstorm-operator");
/// Annotation naming the gateway key a Secret holds.
const KEY_ID_ANNOTATION: &str = "brainstorm.dev/api-key-id";
/// Retry delay after a failed reconciliation.
const RETRY: Duration = Duration::from_secs(5);
/// How soon a kill switch whose Tenant has no gateway id yet looks again.
const WAITING: Duration = Duration::from_secs(2);

/// How the operator runs.
#[derive(Clone, Debug)]
pub struct OperatorOptions {
    /// Only this namespace's resources (None: every namespace).
    pub namespace: Option<String>,
    /// How often each resource is reconciled again without a change, to undo drift made through
    /// the REST API (a plan changed, a switch the operator set lifted by hand).
    pub resync: Duration,
}

/// Why a reconciliation did not finish.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("gateway: {0}")]
    Gateway(#[from] brainstorm_proto::ServiceError),
    #[error("kubernetes: {0}")]
    Kubernetes(#[from] kube::Error),
    #[error("{0}")]
    Invalid(String),
}

struct Context {
    client: Client,
    gateway: Gateway,
    options: OperatorOptions,
    /// Kubernetes Events on the resources (`kubectl describe` shows what the operator did).
    recorder: Recorder,
}

impl Context {
    /// Publishes an Event about `resource`; a refused Event is logged, never a failed reconciliation.
    async fn event(&self, resource: &impl Resource<DynamicType = ()>, warning: bool, reason: &str, note: String) {
        let event = Event {
            type_: if warning { EventType::Warning } else { EventType::Normal },
            reason: reason.to_string(),
            note: Some(note),
            action: reason.to_string(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &resource.object_ref(&())).await {
            tracing::debug!(%error, reason, "could not publish an Event");
        }
    }
}

/// Runs both controllers until `shutdown` resolves.
pub async fn run(client: Client, gateway: Gateway, options: OperatorOptions, shutdown: impl Future<Output = ()> + Send + 'static) {
    let reporter = Reporter { controller: "brainstorm-operator".to_string(), instance: std::env::var("HOSTNAME").ok() };
    let recorder = Recorder::new(client.clone(), reporter);
    let context = Arc::new(Context { client: client.clone(), gateway, options: options.clone(), recorder });
    let (tenants, kill_switches, secrets) = match &options.namespace {
        Some(namespace) => (
            Api::<Tenant>::namespaced(client.clone(), namespace),
            Api::<KillSwitch>::namespaced(client.clone(), namespace),
            Api::<Secret>::namespaced(client, namespace),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone()), Api::all(client)),
    };
    let (stop_tenants, stop_switches) = {
        let shared = futures::FutureExt::shared(Box::pin(shutdown));
        (shared.clone(), shared)
    };
    let managed = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
    let tenant_controller = Controller::new(tenants, watcher::Config::default())
        .owns(secrets, watcher::Config::default().labels(&managed))
        .graceful_shutdown_on(stop_tenants)
        .run(reconcile_tenant, retry_tenant, context.clone())
        .for_each(|result| async move { log_outcome("Tenant", result.map(|(object, _)| object.name).map_err(|error| error.to_string())) });
    let switch_controller = Controller::new(kill_switches, watcher::Config::default())
        .graceful_shutdown_on(stop_switches)
        .run(reconcile_kill_switch, retry_kill_switch, context)
        .for_each(
            |result| async move { log_outcome("KillSwitch", result.map(|(object, _)| object.name).map_err(|error| error.to_string())) },
        );
    tracing::info!(namespace = ?options.namespace, resync_seconds = options.resync.as_secs(), "operator watching Tenants and KillSwitches");
    futures::join!(tenant_controller, switch_controller);
}

fn log_outcome(kind: &str, outcome: Result<String, String>) {
    match outcome {
        Ok(name) => tracing::debug!(kind, %name, "reconciled"),
        Err(error) => tracing::warn!(kind, %error, "reconciliation failed"),
    }
}

fn retry_tenant(_: Arc<Tenant>, _: &ReconcileError, _: Arc<Context>) -> Action {
    Action::requeue(RETRY)
}

fn retry_kill_switch(_: Arc<KillSwitch>, _: &ReconcileError, _: Arc<Context>) -> Action {
    Action::requeue(RETRY)
}

/// Who the gateway records as the actor of this resource's changes.
fn actor_of(resource: &impl Resource) -> String {
    format!("kubernetes:{}/{}", resource.namespace().unwrap_or_default(), resource.name_any())
}

async fn reconcile_tenant(tenant: Arc<Tenant>, context: Arc<Context>) -> Result<Action, ReconcileError> {
    let namespace = tenant.namespace().ok_or_else(|| ReconcileError::Invalid("a Tenant is namespaced".to_string()))?;
    let tenants: Api<Tenant> = Api::namespaced(context.client.clone(), &namespace);
    let secrets: Api<Secret> = Api::namespaced(context.client.clone(), &namespace);
    let uid = tenant.uid().ok_or_else(|| ReconcileError::Invalid("the Tenant has no metadata.uid".to_string()))?;
    let status = tenant.status.clone().unwrap_or_default();
    let gateway = &context.gateway;

    if tenant.meta().deletion_timestamp.is_some() {
        if has_finalizer(tenant.as_ref()) {
            if let Some(key_id) = &status.api_key_id {
                gateway.revoke_key(&uid, key_id, &actor_of(tenant.as_ref())).await?;
            }
            if tenant.spec.deletion_policy == DeletionPolicy::Suspend {
                gateway.suspend_tenant(&uid, &actor_of(tenant.as_ref())).await?;
            }
            tracing::info!(tenant_id = %uid, policy = ?tenant.spec.deletion_policy, "Tenant deleted: its operator key revoked");
            set_finalizer(&tenants, tenant.as_ref(), false).await?;
        }
        return Ok(Action::await_change());
    }
    set_finalizer(&tenants, tenant.as_ref(), true).await?;

    let secret_name = tenant.spec.secret_name.clone().unwrap_or_else(|| format!("{}-brainstorm", tenant.name_any()));
    let outcome = async {
        let held_key = held_key(&secrets, &secret_name, &uid).await?;
        let converged = gateway.converge_tenant(&uid, &tenant.spec, held_key.as_deref(), &actor_of(tenant.as_ref())).await?;
        if converged.registered {
            context.event(tenant.as_ref(), false, "Registered", format!("tenant {uid} registered in the gateway")).await;
        }
        let key = match &converged.minted {
            Some(minted) => {
                write_secret(&secrets, &secret_name, tenant.as_ref(), minted).await?;
                // The key the Secret held before (deleted, or revoked by hand) goes: rotation.
                let mut previous: Vec<&str> = [status.api_key_id.as_deref(), held_key.as_deref()]
                    .into_iter()
                    .flatten()
                    .chain(converged.superseded.iter().map(String::as_str))
                    .filter(|old| *old != minted.id)
                    .collect();
                previous.sort_unstable();
                previous.dedup();
                for old in &previous {
                    gateway.revoke_key(&uid, old, &actor_of(tenant.as_ref())).await?;
                }
                // Distinct reasons: the recorder folds Events of one reason into a series (same note).
                let (reason, note) = match previous.is_empty() {
                    true => ("KeyWritten", format!("admin key {}... written to Secret {secret_name}", minted.prefix)),
                    false => {
                        ("KeyRotated", format!("admin key {}... written to Secret {secret_name}; the previous key revoked", minted.prefix))
                    }
                };
                context.event(tenant.as_ref(), false, reason, note).await;
                Some((minted.id.clone(), minted.prefix.clone()))
            }
            None => held_key.map(|id| (id, status.api_key_prefix.clone().unwrap_or_default())),
        };
        Ok::<_, ReconcileError>((converged.tenant, key))
    }
    .await;
    let next = match outcome {
        Ok((gateway_tenant, key)) => TenantStatus {
            phase: Some("Ready".to_string()),
            tenant_id: Some(gateway_tenant.id),
            slug: Some(gateway_tenant.slug),
            plan: Some(gateway_tenant.plan),
            tier: Some(gateway_tenant.tier),
            state: Some(gateway_tenant.status),
            secret_name: Some(secret_name),
            api_key_id: key.as_ref().map(|(id, _)| id.clone()),
            api_key_prefix: key.map(|(_, prefix)| prefix).filter(|prefix| !prefix.is_empty()),
            message: None,
            observed_generation: tenant.meta().generation,
            conditions: ready(&status.conditions, true, "Reconciled", "", tenant.meta().generation),
        },
        Err(error) => {
            let phase = phase_of_failure(&error);
            if tenant.status.as_ref().and_then(|status| status.message.as_deref()) != Some(error.to_string().as_str()) {
                context.event(tenant.as_ref(), true, "ReconcileFailed", error.to_string()).await;
            }
            let failed = TenantStatus {
                phase: Some(phase.to_string()),
                message: Some(error.to_string()),
                observed_generation: tenant.meta().generation,
                conditions: ready(&status.conditions, false, phase, &error.to_string(), tenant.meta().generation),
                ..status.clone()
            };
            write_status(&tenants, tenant.as_ref(), tenant.status.as_ref(), &failed).await?;
            return Err(error);
        }
    };
    if status.state.is_some() && status.state != next.state {
        let state = next.state.clone().unwrap_or_default();
        context.event(tenant.as_ref(), false, "StateChanged", format!("tenant status is now {state}")).await;
    }
    write_status(&tenants, tenant.as_ref(), tenant.status.as_ref(), &next).await?;
    Ok(Action::requeue(context.options.resync))
}

/// The key id the tenant's Secret holds, when the Secret is this Tenant's; an existing Secret of the
/// same name that this Tenant does not own is never overwritten.
async fn held_key(secrets: &Api<Secret>, name: &str, owner_uid: &str) -> Result<Option<String>, ReconcileError> {
    let Some(secret) = secrets.get_opt(name).await? else { return Ok(None) };
    if !secret.owner_references().iter().any(|owner| owner.uid == owner_uid) {
        return Err(ReconcileError::Invalid(format!(
            "Secret `{name}` exists and does not belong to this Tenant; delete it or set spec.secretName"
        )));
    }
    let has_key = secret.data.as_ref().is_some_and(|data| data.contains_key("api-key"));
    Ok(secret.annotations().get(KEY_ID_ANNOTATION).filter(|_| has_key).cloned())
}

async fn write_secret(secrets: &Api<Secret>, name: &str, tenant: &Tenant, key: &MintedKey) -> Result<(), ReconcileError> {
    let uid = tenant.uid().unwrap_or_default();
    let owner = tenant.controller_owner_ref(&()).ok_or_else(|| ReconcileError::Invalid("the Tenant has no uid".to_string()))?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: tenant.namespace(),
            labels: Some(BTreeMap::from([(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string())])),
            annotations: Some(BTreeMap::from([(KEY_ID_ANNOTATION.to_string(), key.id.clone())])),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([
            ("api-key".to_string(), ByteString(key.plaintext.clone().into_bytes())),
            ("tenant-id".to_string(), ByteString(uid.into_bytes())),
        ])),
        type_: Some("Opaque".to_string()),
        ..Secret::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            secrets.patch(name, &PatchParams::default(), &Patch::Merge(&secret)).await?;
            Ok(())
        }
        Err(error) => Err(error.into()),
    }
}

async fn reconcile_kill_switch(switch: Arc<KillSwitch>, context: Arc<Context>) -> Result<Action, ReconcileError> {
    let namespace = switch.namespace().ok_or_else(|| ReconcileError::Invalid("a KillSwitch is namespaced".to_string()))?;
    let switches: Api<KillSwitch> = Api::namespaced(context.client.clone(), &namespace);
    let status = switch.status.clone().unwrap_or_default();
    let actor = actor_of(switch.as_ref());
    let gateway = &context.gateway;

    if switch.meta().deletion_timestamp.is_some() {
        if has_finalizer(switch.as_ref()) {
            gateway.converge_switch(None, status.applied.as_ref(), &actor).await?;
            if status.applied.is_some() {
                context
                    .event(switch.as_ref(), false, "SwitchLifted", "the resource is being deleted: the switch it set is off".to_string())
                    .await;
            }
            set_finalizer(&switches, switch.as_ref(), false).await?;
        }
        return Ok(Action::await_change());
    }
    set_finalizer(&switches, switch.as_ref(), true).await?;

    let desired = match desired_switch(switch.as_ref(), &context.client, &namespace, gateway).await {
        Ok(Some(desired)) => desired,
        Ok(None) => {
            let reference = switch.spec.tenant_ref.clone().unwrap_or_default();
            let message = format!("waiting for Tenant `{reference}` to be registered");
            let waiting = KillSwitchStatus {
                phase: Some("Pending".to_string()),
                conditions: ready(&status.conditions, false, "Pending", &message, switch.meta().generation),
                message: Some(message),
                observed_generation: switch.meta().generation,
                ..status.clone()
            };
            write_status(&switches, switch.as_ref(), switch.status.as_ref(), &waiting).await?;
            return Ok(Action::requeue(WAITING));
        }
        Err(error) => {
            return fail_kill_switch(&context, &switches, switch.as_ref(), &status, error).await;
        }
    };
    let outcome = gateway.converge_switch(Some(&desired), status.applied.as_ref(), &actor).await;
    let next = match outcome {
        Ok(outcome) => {
            if outcome.applied.is_some() && outcome.applied != status.applied {
                context.event(switch.as_ref(), false, "SwitchSet", format!("switch on: {}", desired.reason)).await;
            } else if status.applied.is_some() && outcome.applied.is_none() {
                context.event(switch.as_ref(), false, "SwitchLifted", "the switch this resource set is off".to_string()).await;
            }
            let held_by_other = outcome.active && outcome.applied.is_none();
            let message = (held_by_other && !desired.active).then(|| {
                format!(
                    "the switch is on, set by {}; the operator lifts only switches it set",
                    outcome.activated_by.as_deref().unwrap_or("somebody else")
                )
            });
            let converged = outcome.active == desired.active;
            let reason = match (converged, outcome.active) {
                (true, true) => "Active",
                (true, false) => "Inactive",
                (false, _) => "HeldByOther",
            };
            KillSwitchStatus {
                phase: Some(if outcome.active { "Active" } else { "Inactive" }.to_string()),
                active: Some(outcome.active),
                activated_at: outcome.activated_at,
                activated_by: outcome.activated_by.clone(),
                applied: outcome.applied,
                conditions: ready(&status.conditions, converged, reason, message.as_deref().unwrap_or_default(), switch.meta().generation),
                message,
                observed_generation: switch.meta().generation,
            }
        }
        Err(error) => return fail_kill_switch(&context, &switches, switch.as_ref(), &status, error.into()).await,
    };
    write_status(&switches, switch.as_ref(), switch.status.as_ref(), &next).await?;
    Ok(Action::requeue(context.options.resync))
}

/// Reports a KillSwitch that could not be applied; whatever it set before stays set until the spec is
/// fixed or the resource deleted (lifting it here would fail open).
async fn fail_kill_switch(
    context: &Context,
    switches: &Api<KillSwitch>,
    switch: &KillSwitch,
    status: &KillSwitchStatus,
    error: ReconcileError,
) -> Result<Action, ReconcileError> {
    let phase = phase_of_failure(&error);
    if status.message.as_deref() != Some(error.to_string().as_str()) {
        context.event(switch, true, "ReconcileFailed", error.to_string()).await;
    }
    let failed = KillSwitchStatus {
        phase: Some(phase.to_string()),
        message: Some(error.to_string()),
        observed_generation: switch.meta().generation,
        conditions: ready(&status.conditions, false, phase, &error.to_string(), switch.meta().generation),
        ..status.clone()
    };
    write_status(switches, switch, switch.status.as_ref(), &failed).await?;
    Err(error)
}

/// The `Ready` condition after this reconciliation: its transition time moves only when its status
/// does, so an unchanged condition leaves the status unchanged (and unwritten).
fn ready(previous: &[Condition], is_ready: bool, reason: &str, message: &str, generation: Option<i64>) -> Vec<Condition> {
    let status = if is_ready { "True" } else { "False" };
    let last_transition_time = previous
        .iter()
        .find(|condition| condition.kind == "Ready" && condition.status == status)
        .map(|condition| condition.last_transition_time.clone())
        .unwrap_or_else(|| chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    vec![Condition {
        kind: "Ready".to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        last_transition_time,
        observed_generation: generation,
    }]
}

/// The switch a KillSwitch's spec asks for; None while its Tenant has no gateway id yet.
async fn desired_switch(
    switch: &KillSwitch,
    client: &Client,
    namespace: &str,
    gateway: &Gateway,
) -> Result<Option<DesiredSwitch>, ReconcileError> {
    let spec = &switch.spec;
    let tenant_id = match (spec.tenant_ref.as_deref(), spec.tenant_id.as_deref()) {
        (Some(reference), None) => {
            let tenants: Api<Tenant> = Api::namespaced(client.clone(), namespace);
            let Some(tenant) = tenants.get_opt(reference).await? else { return Ok(None) };
            match tenant.status.and_then(|status| status.tenant_id) {
                Some(id) => id,
                None => return Ok(None),
            }
        }
        (None, Some(id)) => {
            if !gateway.tenant_exists(id).await? {
                return Err(ReconcileError::Invalid(format!("the gateway has no tenant `{id}`")));
            }
            id.to_string()
        }
        _ => return Err(ReconcileError::Invalid("set exactly one of spec.tenantRef and spec.tenantId".to_string())),
    };
    let target = spec.target.as_deref().map(str::trim).filter(|target| !target.is_empty()).map(str::to_string);
    match (spec.scope, &target) {
        (Scope::Tenant, Some(_)) => {
            return Err(ReconcileError::Invalid("spec.target is only for agent, tool and provider scopes".to_string()));
        }
        (Scope::Agent | Scope::Tool | Scope::Provider, None) => {
            return Err(ReconcileError::Invalid(format!("spec.target is required for scope {}", spec.scope.as_str())));
        }
        _ => {}
    }
    let reason = spec.reason.as_deref().map(str::trim).unwrap_or_default().to_string();
    if spec.active && reason.is_empty() {
        return Err(ReconcileError::Invalid("spec.reason is required while the switch is active".to_string()));
    }
    Ok(Some(DesiredSwitch { switch: AppliedSwitch { tenant_id, scope: spec.scope, target }, active: spec.active, reason }))
}

fn phase_of_failure(error: &ReconcileError) -> &'static str {
    match error {
        ReconcileError::Invalid(_) => "Failed",
        ReconcileError::Gateway(error) if error.kind == brainstorm_proto::ErrorKind::InvalidArgument => "Failed",
        _ => "Pending",
    }
}

fn has_finalizer(resource: &impl Resource) -> bool {
    resource.finalizers().iter().any(|name| name == FINALIZER)
}

/// Adds or removes the operator's finalizer with a merge patch (guarded by the resource version
/// the controller saw, so a concurrent edit of the list makes the patch fail and retry).
async fn set_finalizer<K>(api: &Api<K>, resource: &K, present: bool) -> Result<(), ReconcileError>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if has_finalizer(resource) == present {
        return Ok(());
    }
    let mut finalizers: Vec<String> = resource.finalizers().iter().filter(|name| *name != FINALIZER).cloned().collect();
    if present {
        finalizers.push(FINALIZER.to_string());
    }
    let mut metadata = json!({ "finalizers": finalizers });
    if let Some(version) = resource.meta().resource_version.as_deref() {
        metadata["resourceVersion"] = json!(version);
    }
    api.patch(&resource.name_any(), &PatchParams::default(), &Patch::Merge(json!({ "metadata": metadata }))).await?;
    Ok(())
}

/// Writes a status when it changed (an unchanged status is not written, so writing never wakes the
/// controller into a loop).
async fn write_status<K, S>(api: &Api<K>, resource: &K, current: Option<&S>, next: &S) -> Result<(), ReconcileError>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    S: Serialize + PartialEq,
{
    if current == Some(next) {
        return Ok(());
    }
    // A merge patch keeps members it does not name: every member the status type knows is written,
    // absent ones as null, so a cleared message really clears.
    let mut status = serde_json::to_value(next).map_err(|error| ReconcileError::Invalid(error.to_string()))?;
    let previous = current.and_then(|current| serde_json::to_value(current).ok());
    if let (Some(written), Some(serde_json::Value::Object(previous))) = (status.as_object_mut(), previous) {
        for member in previous.keys() {
            written.entry(member.clone()).or_insert(serde_json::Value::Null);
        }
    }
    api.patch_status(&resource.name_any(), &PatchParams::default(), &Patch::Merge(json!({ "status": status }))).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_condition_moves_its_transition_time_only_with_its_status() {
        let earlier = Condition {
            kind: "Ready".to_string(),
            status: "True".to_string(),
            reason: "Reconciled".to_string(),
            message: String::new(),
            last_transition_time: "2026-01-02T03:04:05Z".to_string(),
            observed_generation: Some(1),
        };
        let held = ready(std::slice::from_ref(&earlier), true, "Reconciled", "", Some(2));
        assert_eq!(held[0].last_transition_time, earlier.last_transition_time);
        assert_eq!(held[0].observed_generation, Some(2));
        let failed = ready(&held, false, "Failed", "spec.reason is required", Some(3));
        assert_eq!((failed[0].status.as_str(), failed[0].reason.as_str()), ("False", "Failed"));
        assert_ne!(failed[0].last_transition_time, earlier.last_transition_time);
        assert_eq!(ready(&failed, false, "Failed", "spec.reason is required", Some(3)), failed);
    }
}
