//! The custom resources: `Tenant` (a gateway tenant and the Secret holding its admin key) and
//! `KillSwitch` (a tenant-wide or scoped kill switch), group `brainstorm.dev`, version `v1alpha1`.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of every Brainstorm custom resource.
pub const GROUP: &str = "brainstorm.dev";

/// A gateway tenant declared in Kubernetes.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "brainstorm.dev",
    version = "v1alpha1",
    kind = "Tenant",
    namespaced,
    status = "TenantStatus",
    shortname = "brt",
    category = "brainstorm",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Tenant ID","type":"string","jsonPath":".status.tenantId"}"#,
    printcolumn = r#"{"name":"Plan","type":"string","jsonPath":".status.plan"}"#,
    printcolumn = r#"{"name":"Secret","type":"string","jsonPath":".status.secretName"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TenantSpec {
    /// The tenant's name in the gateway (1 to 128 characters).
    pub display_name: String,
    /// `sandbox` or `standard`; when absent the gateway's own graduation rules decide the plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
    /// True stops every key of the tenant from authenticating (gateway status `rejected`) until set
    /// back to false; nothing stored is deleted.
    #[serde(default)]
    pub suspended: bool,
    /// The Secret (same namespace) that receives the tenant's admin API key; default `<name>-brainstorm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// What deleting this resource does to the gateway tenant: `Retain` (default: the tenant, its
    /// ledger and its audit chain stay) or `Suspend` (also sets its status to `rejected`). Either
    /// way the admin key the operator minted is revoked and its Secret removed.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
}

/// A tenant's plan.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Plan {
    Sandbox,
    Standard,
}

impl Plan {
    /// The plan's name in the gateway.
    pub fn as_str(self) -> &'static str {
        match self {
            Plan::Sandbox => "sandbox",
            Plan::Standard => "standard",
        }
    }
}

/// What deleting a `Tenant` resource does to the gateway tenant.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DeletionPolicy {
    #[default]
    Retain,
    Suspend,
}

/// What the operator last saw of a tenant.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantStatus {
    /// `Ready` (the gateway matches the spec), `Pending` or `Failed` (see `message`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The gateway's tenant id: this resource's uid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slug: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// The gateway's tenant status: `active` or `rejected`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// The Secret holding the admin key (key `api-key`, and `tenant-id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// The id of the admin key in that Secret (never the key itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`: True once the gateway matches the spec (`kubectl wait --for=condition=Ready`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A kill switch declared in Kubernetes: while `active`, the gateway answers the tenant's
/// non-exempt `/v1` routes (or the scoped agent, tool or provider) with 503 `kill_switch_active`.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "brainstorm.dev",
    version = "v1alpha1",
    kind = "KillSwitch",
    namespaced,
    status = "KillSwitchStatus",
    shortname = "brks",
    category = "brainstorm",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Scope","type":"string","jsonPath":".spec.scope"}"#,
    printcolumn = r#"{"name":"Target","type":"string","jsonPath":".spec.target"}"#,
    printcolumn = r#"{"name":"Activated by","type":"string","jsonPath":".status.activatedBy"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct KillSwitchSpec {
    /// The `Tenant` resource (same namespace) whose traffic the switch stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_ref: Option<String>,
    /// Or the gateway tenant id itself, for a tenant registered through the REST API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<String>,
    /// `tenant` (default: every non-exempt route), `agent`, `tool` or `provider`.
    #[serde(default)]
    pub scope: Scope,
    /// The agent id, tool name or provider id a scoped switch stops; not set for `tenant`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Whether the switch should be on (default true). The operator lifts only a switch it set.
    #[serde(default = "default_active")]
    pub active: bool,
    /// Why; recorded in the switch's history. Required while `active`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

fn default_active() -> bool {
    true
}

/// What a kill switch stops.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    #[default]
    Tenant,
    Agent,
    Tool,
    Provider,
}

impl Scope {
    /// The scope's name in the gateway.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Tenant => "tenant",
            Scope::Agent => "agent",
            Scope::Tool => "tool",
            Scope::Provider => "provider",
        }
    }
}

/// What the operator last saw of a kill switch.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KillSwitchStatus {
    /// `Active` or `Inactive` (the gateway's state), `Pending` (the tenant is not known yet) or
    /// `Failed` (see `message`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Whether the gateway's switch is on, whoever set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activated_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activated_by: Option<String>,
    /// The switch this resource set in the gateway, so that an edit or a deletion lifts it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<AppliedSwitch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`: True once the gateway matches the spec (`kubectl wait --for=condition=Ready`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A condition in the Kubernetes convention (type, status, reason, message, transition time).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Ready`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// One CamelCase word: why the condition is what it is.
    pub reason: String,
    #[serde(default)]
    pub message: String,
    /// When `status` last changed (RFC 3339).
    pub last_transition_time: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// A switch in the gateway: the tenant, the scope and, for a scoped switch, its target.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppliedSwitch {
    pub tenant_id: String,
    pub scope: Scope,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}
