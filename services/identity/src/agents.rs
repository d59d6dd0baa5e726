//! Agent profiles: a tenant's agents (owner, cost center, budgets, role, metadata) and their
//! lifecycle (`provisioned` -> `active` <-> `quarantined`, `suspended` -> `terminated`), stored in
//! `agent_profiles` on SQLite or PostgreSQL.

use brainstorm_common::store::Database;
use brainstorm_common::time::now_timestamp;
use brainstorm_proto::ServiceError;
use brainstorm_proto::identity::{AgentProfile, CreateAgentProfileRequest, UpdateAgentProfileRequest};
use sqlx::Row;
use sqlx::any::AnyRow;

/// Roles an agent profile may hold.
pub const AGENT_ROLES: [&str; 3] = ["agent", "operator", "admin"];
/// Lifecycle states, in the order an agent usually meets them.
pub const LIFECYCLE_STATES: [&str; 5] = ["provisioned", "active", "quarantined", "suspended", "terminated"];
/// Longest display name or cost center.
const MAX_TEXT_CHARS: usize = 128;
/// Largest metadata object, as JSON text.
const MAX_METADATA_BYTES: usize = 16 * 1024;
/// Members an update may clear by setting them to null.
const CLEARABLE: [&str; 5] = ["display_name", "owner_id", "cost_center", "budget_daily_nanos", "budget_monthly_nanos"];

const COLUMNS: &str = "id, tenant_id, agent_id, display_name, owner_id, cost_center, budget_daily_nanos, budget_monthly_nanos, role, \
                       lifecycle_state, manifest_id, parent_agent_id, expires_at, metadata, created_at, updated_at";

/// Whether the lifecycle may move from `from` to `to` (the spec's table; anything else is a 409).
pub fn may_move(from: &str, to: &str) -> bool {
    matches!(
        (from, to),
        ("provisioned", "active")
            | ("active", "quarantined" | "suspended")
            | ("quarantined", "active" | "suspended")
            | ("suspended", "active" | "terminated")
    )
}

/// The agent id rule: 3 to 64 characters, lowercase letters, digits and hyphens.
pub fn validated_agent_id(agent_id: &str) -> Result<&str, ServiceError> {
    if agent_id.is_empty() {
        return Err(ServiceError::invalid("agent_id_required", "agentId is required"));
    }
    let valid = (3..=64).contains(&agent_id.len())
        && agent_id.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-');
    if valid {
        Ok(agent_id)
    } else {
        Err(ServiceError::invalid("invalid_agent_id", "agentId must be 3 to 64 lowercase letters, digits or hyphens"))
    }
}

fn validated_text(field: &str, text: Option<&str>) -> Result<Option<String>, ServiceError> {
    bounded_text(text, MAX_TEXT_CHARS)
        .map_err(|()| ServiceError::invalid("invalid_field", format!("{field} must be at most {MAX_TEXT_CHARS} printable characters")))
}

/// `text` trimmed (None when empty); Err when it is longer than `max_chars` or holds a control
/// character.
pub(crate) fn bounded_text(text: Option<&str>, max_chars: usize) -> Result<Option<String>, ()> {
    let Some(text) = text.map(str::trim).filter(|text| !text.is_empty()) else { return Ok(None) };
    if text.chars().count() > max_chars || text.chars().any(char::is_control) {
        return Err(());
    }
    Ok(Some(text.to_string()))
}

fn validated_budget(field: &str, nanos: Option<i64>) -> Result<Option<i64>, ServiceError> {
    match nanos {
        Some(nanos) if nanos < 0 => Err(ServiceError::invalid("invalid_budget", format!("{field} must not be negative"))),
        other => Ok(other),
    }
}

fn validated_role(role: Option<&str>) -> Result<Option<String>, ServiceError> {
    match role {
        None => Ok(None),
        Some(role) if AGENT_ROLES.contains(&role) => Ok(Some(role.to_string())),
        Some(_) => Err(ServiceError::invalid("invalid_role", format!("role must be one of {}", AGENT_ROLES.join(", ")))),
    }
}

fn validated_metadata(metadata: Option<&str>) -> Result<Option<String>, ServiceError> {
    let Some(text) = metadata else { return Ok(None) };
    let refused =
        || ServiceError::invalid("invalid_metadata", format!("metadata must be a JSON object of at most {MAX_METADATA_BYTES} bytes"));
    if text.len() > MAX_METADATA_BYTES {
        return Err(refused());
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(value @ serde_json::Value::Object(_)) => Ok(Some(value.to_string())),
        _ => Err(refused()),
    }
}

/// A new profile from a create request (state `provisioned`); refuses an ownerless agent when
/// `require_owner` (the gateway's owner-required switch) is on.
pub fn new_profile(request: &CreateAgentProfileRequest, require_owner: bool) -> Result<AgentProfile, ServiceError> {
    let agent_id = validated_agent_id(request.agent_id.trim())?.to_string();
    let owner_id = validated_text("ownerId", request.owner_id.as_deref())?;
    if require_owner && owner_id.is_none() {
        return Err(ServiceError::invalid("owner_required", "this gateway requires every agent to have an owner: set ownerId"));
    }
    let now = now_timestamp();
    Ok(AgentProfile {
        id: uuid::Uuid::new_v4().to_string(),
        tenant_id: request.tenant_id.clone(),
        agent_id,
        display_name: validated_text("displayName", request.display_name.as_deref())?,
        owner_id,
        cost_center: validated_text("costCenter", request.cost_center.as_deref())?,
        budget_daily_nanos: validated_budget("budgetDailyUsd", request.budget_daily_nanos)?,
        budget_monthly_nanos: validated_budget("budgetMonthlyUsd", request.budget_monthly_nanos)?,
        role: validated_role(request.role.as_deref())?.unwrap_or_else(|| "agent".to_string()),
        lifecycle_state: "provisioned".to_string(),
        manifest_id: None,
        parent_agent_id: None,
        expires_at: None,
        metadata_json: validated_metadata(request.metadata_json.as_deref())?.unwrap_or_else(|| "{}".to_string()),
        created_at: now.clone(),
        updated_at: now,
    })
}

/// `profile` with an update applied (set members replaced, `cleared` ones emptied).
pub fn updated_profile(
    mut profile: AgentProfile,
    request: &UpdateAgentProfileRequest,
    require_owner: bool,
) -> Result<AgentProfile, ServiceError> {
    for member in &request.cleared {
        match member.as_str() {
            "display_name" => profile.display_name = None,
            "owner_id" => profile.owner_id = None,
            "cost_center" => profile.cost_center = None,
            "budget_daily_nanos" => profile.budget_daily_nanos = None,
            "budget_monthly_nanos" => profile.budget_monthly_nanos = None,
            other => {
                return Err(ServiceError::invalid(
                    "invalid_field",
                    format!("`{other}` cannot be cleared; clearable: {}", CLEARABLE.join(", ")),
                ));
            }
        }
    }
    if let Some(name) = validated_text("displayName", request.display_name.as_deref())? {
        profile.display_name = Some(name);
    }
    if let Some(owner) = validated_text("ownerId", request.owner_id.as_deref())? {
        profile.owner_id = Some(owner);
    }
    if require_owner && profile.owner_id.is_none() {
        return Err(ServiceError::invalid(
            "owner_required",
            "this gateway requires every agent to have an owner: ownerId cannot be removed",
        ));
    }
    if let Some(center) = validated_text("costCenter", request.cost_center.as_deref())? {
        profile.cost_center = Some(center);
    }
    if let Some(nanos) = validated_budget("budgetDailyUsd", request.budget_daily_nanos)? {
        profile.budget_daily_nanos = Some(nanos);
    }
    if let Some(nanos) = validated_budget("budgetMonthlyUsd", request.budget_monthly_nanos)? {
        profile.budget_monthly_nanos = Some(nanos);
    }
    if let Some(role) = validated_role(request.role.as_deref())? {
        profile.role = role;
    }
    if let Some(metadata) = validated_metadata(request.metadata_json.as_deref())? {
        profile.metadata_json = metadata;
    }
    profile.updated_at = now_timestamp();
    Ok(profile)
}

/// The `agent_profiles` table.
#[derive(Debug, Clone)]
pub struct AgentStore {
    database: Database,
}

impl AgentStore {
    /// The table in `database`.
    pub fn new(database: Database) -> Self {
        AgentStore { database }
    }

    /// Inserts a profile; false when the tenant already has an agent of that id.
    pub async fn insert(&self, profile: &AgentProfile) -> Result<bool, sqlx::Error> {
        let mut connection = self.database.pool().acquire().await?;
        insert_profile(&mut connection, profile).await
    }

    /// One agent of a tenant.
    pub async fn get(&self, tenant_id: &str, agent_id: &str) -> Result<Option<AgentProfile>, sqlx::Error> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM agent_profiles WHERE tenant_id = $1 AND agent_id = $2"))
            .bind(tenant_id)
            .bind(agent_id)
            .fetch_optional(self.database.pool())
            .await?;
        row.as_ref().map(profile_of).transpose()
    }

    /// Every agent of a tenant, by agent id.
    pub async fn list(&self, tenant_id: &str) -> Result<Vec<AgentProfile>, sqlx::Error> {
        let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM agent_profiles WHERE tenant_id = $1 ORDER BY agent_id"))
            .bind(tenant_id)
            .fetch_all(self.database.pool())
            .await?;
        rows.iter().map(profile_of).collect()
    }

    /// Writes a profile's changeable members, if it is still in `expected_state` (a concurrent
    /// lifecycle move makes this a no-op: false).
    pub async fn update(&self, profile: &AgentProfile, expected_state: &str) -> Result<bool, sqlx::Error> {
        let result = sqlx::query(
            "UPDATE agent_profiles SET display_name = $1, owner_id = $2, cost_center = $3, budget_daily_nanos = $4, \
             budget_monthly_nanos = $5, role = $6, lifecycle_state = $7, metadata = $8, updated_at = $9 \
             WHERE tenant_id = $10 AND agent_id = $11 AND lifecycle_state = $12",
        )
        .bind(&profile.display_name)
        .bind(&profile.owner_id)
        .bind(&profile.cost_center)
        .bind(profile.budget_daily_nanos)
        .bind(profile.budget_monthly_nanos)
        .bind(&profile.role)
        .bind(&profile.lifecycle_state)
        .bind(&profile.metadata_json)
        .bind(&profile.updated_at)
        .bind(&profile.tenant_id)
        .bind(&profile.agent_id)
        .bind(expected_state)
        .execute(self.database.pool())
        .await?;
        Ok(result.rows_affected() == 1)
    }

    /// Moves part of a parent's daily budget to a new child profile, in one transaction: the parent's
    /// budget becomes `parent_budget_after` only if it still holds what `parent` says, and the child is
    /// inserted only if its id is free.
    pub async fn delegate(&self, parent: &AgentProfile, parent_budget_after: i64, child: &AgentProfile) -> Result<Delegation, sqlx::Error> {
        let mut transaction = self.database.begin().await?;
        let moved = sqlx::query(
            "UPDATE agent_profiles SET budget_daily_nanos = $1, updated_at = $2 \
             WHERE id = $3 AND lifecycle_state = 'active' AND budget_daily_nanos = $4",
        )
        .bind(parent_budget_after)
        .bind(&child.created_at)
        .bind(&parent.id)
        .bind(parent.budget_daily_nanos)
        .execute(&mut *transaction)
        .await?;
        if moved.rows_affected() != 1 {
            return Ok(Delegation::ParentChanged);
        }
        if !insert_profile(&mut transaction, child).await? {
            return Ok(Delegation::ChildExists);
        }
        transaction.commit().await?;
        Ok(Delegation::Done)
    }

    /// Terminates a parent's child still in `child.lifecycle_state` and gives `refund` back to the
    /// parent's daily budget, in one transaction; false when the child moved meanwhile.
    pub async fn end_child(&self, parent: &AgentProfile, child: &AgentProfile, refund: i64, now: &str) -> Result<bool, sqlx::Error> {
        let mut transaction = self.database.begin().await?;
        let ended = sqlx::query(
            "UPDATE agent_profiles SET lifecycle_state = 'terminated', updated_at = $1 \
             WHERE id = $2 AND parent_agent_id = $3 AND lifecycle_state = $4",
        )
        .bind(now)
        .bind(&child.id)
        .bind(&parent.agent_id)
        .bind(&child.lifecycle_state)
        .execute(&mut *transaction)
        .await?;
        if ended.rows_affected() != 1 {
            return Ok(false);
        }
        sqlx::query("UPDATE agent_profiles SET budget_daily_nanos = COALESCE(budget_daily_nanos, 0) + $1, updated_at = $2 WHERE id = $3")
            .bind(refund)
            .bind(now)
            .bind(&parent.id)
            .execute(&mut *transaction)
            .await?;
        transaction.commit().await?;
        Ok(true)
    }

    /// Deletes one agent; false when there was none.
    pub async fn delete(&self, tenant_id: &str, agent_id: &str) -> Result<bool, sqlx::Error> {
        let result = sqlx::query("DELETE FROM agent_profiles WHERE tenant_id = $1 AND agent_id = $2")
            .bind(tenant_id)
            .bind(agent_id)
            .execute(self.database.pool())
            .await?;
        Ok(result.rows_affected() == 1)
    }
}

/// How a delegation's transaction ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delegation {
    Done,
    /// The parent's budget or state changed since it was read: read again.
    ParentChanged,
    /// The child's agent id is taken.
    ChildExists,
}

/// Inserts a profile on `connection`; false when the tenant already has an agent of that id.
async fn insert_profile(connection: &mut sqlx::AnyConnection, profile: &AgentProfile) -> Result<bool, sqlx::Error> {
    let result = sqlx::query(
        "INSERT INTO agent_profiles (id, tenant_id, agent_id, display_name, owner_id, cost_center, budget_daily_nanos, \
         budget_monthly_nanos, role, lifecycle_state, manifest_id, parent_agent_id, expires_at, metadata, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
    )
    .bind(&profile.id)
    .bind(&profile.tenant_id)
    .bind(&profile.agent_id)
    .bind(&profile.display_name)
    .bind(&profile.owner_id)
    .bind(&profile.cost_center)
    .bind(profile.budget_daily_nanos)
    .bind(profile.budget_monthly_nanos)
    .bind(&profile.role)
    .bind(&profile.lifecycle_state)
    .bind(&profile.manifest_id)
    .bind(&profile.parent_agent_id)
    .bind(&profile.expires_at)
    .bind(&profile.metadata_json)
    .bind(&profile.created_at)
    .bind(&profile.updated_at)
    .execute(&mut *connection)
    .await;
    match result {
        Ok(_) => Ok(true),
        Err(error) if brainstorm_common::store::is_unique_violation(&error) => Ok(false),
        Err(error) => Err(error),
    }
}

fn profile_of(row: &AnyRow) -> Result<AgentProfile, sqlx::Error> {
    Ok(AgentProfile {
        id: row.try_get("id")?,
        tenant_id: row.try_get("tenant_id")?,
        agent_id: row.try_get("agent_id")?,
        display_name: row.try_get("display_name")?,
        owner_id: row.try_get("owner_id")?,
        cost_center: row.try_get("cost_center")?,
        budget_daily_nanos: row.try_get("budget_daily_nanos")?,
        budget_monthly_nanos: row.try_get("budget_monthly_nanos")?,
        role: row.try_get("role")?,
        lifecycle_state: row.try_get("lifecycle_state")?,
        manifest_id: row.try_get("manifest_id")?,
        parent_agent_id: row.try_get("parent_agent_id")?,
        expires_at: row.try_get("expires_at")?,
        metadata_json: row.try_get("metadata")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lifecycle_follows_the_table_and_terminated_is_final() {
        let allowed = [
            ("provisioned", "active"),
            ("active", "quarantined"),
            ("active", "suspended"),
            ("quarantined", "active"),
            ("quarantined", "suspended"),
            ("suspended", "active"),
            ("suspended", "terminated"),
        ];
        for from in LIFECYCLE_STATES {
            for to in LIFECYCLE_STATES {
                assert_eq!(may_move(from, to), allowed.contains(&(from, to)), "{from} -> {to}");
            }
        }
    }

    #[test]
    fn agent_ids_are_short_lowercase_words() {
        for good in ["abc", "crawler-2", &"a".repeat(64)] {
            assert!(validated_agent_id(good).is_ok(), "{good}");
        }
        for bad in ["ab", "Crawler", "crawler_2", "agent.one", &"a".repeat(65)] {
            assert_eq!(validated_agent_id(bad).err().map(|error| error.reason), Some("invalid_agent_id".to_string()), "{bad}");
        }
        assert_eq!(validated_agent_id("").err().map(|error| error.reason), Some("agent_id_required".to_string()));
    }

    #[test]
    fn metadata_is_an_object() {
        assert_eq!(validated_metadata(Some("{\"can_delegate\": true}")).ok().flatten().as_deref(), Some("{\"can_delegate\":true}"));
        for bad in ["[]", "3", "{", "null"] {
            assert!(validated_metadata(Some(bad)).is_err(), "{bad}");
        }
    }
}
