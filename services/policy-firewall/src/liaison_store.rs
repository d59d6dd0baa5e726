//! Liaison sessions, their signed plans and their events, on SQLite or PostgreSQL. Each event takes its
//! number from its session row's counter in the same transaction (a row lock on PostgreSQL), so a
//! stream that resumes after event `n` misses none and sees none twice. A plan moves `minted` ->
//! `claimed` (by one request, atomically) -> `committed`, or back to `minted` when the claiming
//! completion failed before any answer.

use brainstorm_common::store::Database;
use brainstorm_proto::policy::{LiaisonEvent, LiaisonPlan};
use sqlx::any::AnyRow;
use sqlx::{Any, Row, Transaction};

use crate::store::StoreResult;

/// A plan waiting for its completion.
pub const MINTED: &str = "minted";
/// A plan a completion in flight holds.
pub const CLAIMED: &str = "claimed";
/// A plan a completion was answered under.
pub const COMMITTED: &str = "committed";

/// A session as stored.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SessionRow {
    pub tenant_id: String,
    pub session_id: String,
    pub key_id: String,
    pub agent_id: String,
    pub label: String,
    pub metadata_json: String,
    /// `open` or `closed` (an open session past `expires_at` is expired).
    pub status: String,
    pub opened_at: String,
    pub expires_at: String,
    pub closed_at: Option<String>,
    pub event_seq: i64,
}

/// A plan as stored: the signed envelope, and what became of it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PlanRow {
    pub plan: LiaisonPlan,
    pub session_id: String,
    pub expires_epoch: i64,
    pub claimed_by: Option<String>,
    pub committed_request_id: Option<String>,
    pub cost_nanos: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub audit_commitment: Option<String>,
    pub denials: i64,
}

/// What a settled completion leaves on its plan.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Settlement<'a> {
    pub request_id: &'a str,
    pub answered: bool,
    pub committed_at: &'a str,
    pub cost_nanos: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub audit_commitment: &'a str,
}

/// An event to append: its kind and its fields as JSON text.
pub type NewEvent = (&'static str, String);

/// The liaison tables.
#[derive(Clone)]
pub struct LiaisonStore {
    database: Database,
}

const SESSION_COLUMNS: &str =
    "tenant_id, session_id, key_id, agent_id, label, metadata_json, status, opened_at, expires_at, closed_at, event_seq";
const PLAN_COLUMNS: &str = "session_id, envelope_json, signature, expires_epoch, state, claimed_by, committed_request_id, cost_nanos, \
     input_tokens, output_tokens, audit_commitment, denials";

impl LiaisonStore {
    /// The store over a migrated database.
    pub fn new(database: Database) -> Self {
        LiaisonStore { database }
    }

    /// Stores a new session and its `liaison.opened` event.
    pub async fn insert_session(&self, session: &SessionRow, opened: String) -> StoreResult<()> {
        let mut transaction = self.database.begin().await?;
        sqlx::query(
            "INSERT INTO liaison_sessions (tenant_id, session_id, key_id, agent_id, label, metadata_json, status, opened_at, expires_at, \
             event_seq) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 0)",
        )
        .bind(&session.tenant_id)
        .bind(&session.session_id)
        .bind(&session.key_id)
        .bind(&session.agent_id)
        .bind(&session.label)
        .bind(&session.metadata_json)
        .bind(&session.status)
        .bind(&session.opened_at)
        .bind(&session.expires_at)
        .execute(&mut *transaction)
        .await?;
        append(&mut transaction, &session.tenant_id, &session.session_id, &session.opened_at, ("liaison.opened", opened)).await?;
        transaction.commit().await
    }

    /// One session.
    pub async fn session(&self, tenant_id: &str, session_id: &str) -> StoreResult<Option<SessionRow>> {
        let row = sqlx::query(&format!("SELECT {SESSION_COLUMNS} FROM liaison_sessions WHERE tenant_id = $1 AND session_id = $2"))
            .bind(tenant_id)
            .bind(session_id)
            .fetch_optional(self.database.pool())
            .await?;
        row.as_ref().map(session_from_row).transpose()
    }

    /// Stores a minted plan and its event, if its session is still open at `now`; false otherwise.
    pub async fn insert_plan(&self, row: &PlanRow, now: &str, minted: String) -> StoreResult<bool> {
        let plan = &row.plan;
        let envelope_json = String::from_utf8(crate::liaison::envelope_bytes(plan)).unwrap_or_default();
        let mut transaction = self.database.begin().await?;
        let open = sqlx::query(
            "SELECT 1 AS open FROM liaison_sessions WHERE tenant_id = $1 AND session_id = $2 AND status = 'open' AND expires_at > $3",
        )
        .bind(&plan.tenant_id)
        .bind(&row.session_id)
        .bind(now)
        .fetch_optional(&mut *transaction)
        .await?;
        if open.is_none() {
            return Ok(false);
        }
        sqlx::query(
            "INSERT INTO liaison_plans (tenant_id, plan_id, session_id, envelope_json, signature, expires_epoch, state, cost_nanos, \
             input_tokens, output_tokens, denials) VALUES ($1, $2, $3, $4, $5, $6, $7, 0, 0, 0, 0)",
        )
        .bind(&plan.tenant_id)
        .bind(&plan.plan_id)
        .bind(&row.session_id)
        .bind(&envelope_json)
        .bind(&plan.signature)
        .bind(row.expires_epoch)
        .bind(MINTED)
        .execute(&mut *transaction)
        .await?;
        append(&mut transaction, &plan.tenant_id, &row.session_id, now, ("plan.minted", minted)).await?;
        transaction.commit().await?;
        Ok(true)
    }

    /// One plan (an envelope that no longer reads comes back blank but for its signature, which then
    /// fails verification).
    pub async fn plan(&self, tenant_id: &str, plan_id: &str) -> StoreResult<Option<PlanRow>> {
        let row = sqlx::query(&format!("SELECT {PLAN_COLUMNS} FROM liaison_plans WHERE tenant_id = $1 AND plan_id = $2"))
            .bind(tenant_id)
            .bind(plan_id)
            .fetch_optional(self.database.pool())
            .await?;
        row.as_ref().map(plan_from_row).transpose()
    }

    /// A session's plans, in commit order (uncommitted ones first).
    pub async fn plans(&self, tenant_id: &str, session_id: &str) -> StoreResult<Vec<PlanRow>> {
        let rows = sqlx::query(&format!(
            "SELECT {PLAN_COLUMNS} FROM liaison_plans WHERE tenant_id = $1 AND session_id = $2 ORDER BY committed_at, plan_id"
        ))
        .bind(tenant_id)
        .bind(session_id)
        .fetch_all(self.database.pool())
        .await?;
        rows.iter().map(plan_from_row).collect()
    }

    /// Claims a minted plan for `request_id` while it is within its time to live; false when another
    /// request holds it, it was committed, or it expired.
    pub async fn claim(&self, tenant_id: &str, plan_id: &str, request_id: &str, now_epoch: i64) -> StoreResult<bool> {
        let claimed = sqlx::query(
            "UPDATE liaison_plans SET state = $1, claimed_by = $2 WHERE tenant_id = $3 AND plan_id = $4 AND state = $5 AND expires_epoch > $6",
        )
        .bind(CLAIMED)
        .bind(request_id)
        .bind(tenant_id)
        .bind(plan_id)
        .bind(MINTED)
        .bind(now_epoch)
        .execute(self.database.pool())
        .await?;
        Ok(claimed.rows_affected() == 1)
    }

    /// Counts a denial on a plan and appends its event.
    pub async fn record_denial(&self, tenant_id: &str, session_id: &str, plan_id: &str, now: &str, denied: String) -> StoreResult<()> {
        let mut transaction = self.database.begin().await?;
        sqlx::query("UPDATE liaison_plans SET denials = denials + 1 WHERE tenant_id = $1 AND plan_id = $2")
            .bind(tenant_id)
            .bind(plan_id)
            .execute(&mut *transaction)
            .await?;
        append(&mut transaction, tenant_id, session_id, now, ("plan.denied", denied)).await?;
        transaction.commit().await
    }

    /// Settles the plan `settlement.request_id` claimed: committed when the completion was answered,
    /// released otherwise; the events are appended with it. The plan's new state, None when that
    /// request held no claim on it.
    pub async fn settle(
        &self,
        tenant_id: &str,
        session_id: &str,
        plan_id: &str,
        settlement: &Settlement<'_>,
        events: Vec<NewEvent>,
    ) -> StoreResult<Option<&'static str>> {
        let mut transaction = self.database.begin().await?;
        let (state, settled) = if settlement.answered {
            let settled = sqlx::query(
                "UPDATE liaison_plans SET state = $1, committed_request_id = $2, committed_at = $3, cost_nanos = $4, input_tokens = $5, \
                 output_tokens = $6, audit_commitment = $7 WHERE tenant_id = $8 AND plan_id = $9 AND state = $10 AND claimed_by = $2",
            )
            .bind(COMMITTED)
            .bind(settlement.request_id)
            .bind(settlement.committed_at)
            .bind(settlement.cost_nanos)
            .bind(settlement.input_tokens)
            .bind(settlement.output_tokens)
            .bind(settlement.audit_commitment)
            .bind(tenant_id)
            .bind(plan_id)
            .bind(CLAIMED)
            .execute(&mut *transaction)
            .await?;
            (COMMITTED, settled.rows_affected())
        } else {
            let settled = sqlx::query(
                "UPDATE liaison_plans SET state = $1, claimed_by = NULL WHERE tenant_id = $2 AND plan_id = $3 AND state = $4 AND claimed_by = $5",
            )
            .bind(MINTED)
            .bind(tenant_id)
            .bind(plan_id)
            .bind(CLAIMED)
            .bind(settlement.request_id)
            .execute(&mut *transaction)
            .await?;
            (MINTED, settled.rows_affected())
        };
        if settled != 1 {
            return Ok(None);
        }
        for event in events {
            append(&mut transaction, tenant_id, session_id, settlement.committed_at, event).await?;
        }
        transaction.commit().await?;
        Ok(Some(state))
    }

    /// A session's events after `after_seq`, oldest first.
    pub async fn events(&self, tenant_id: &str, session_id: &str, after_seq: i64, limit: u32) -> StoreResult<Vec<LiaisonEvent>> {
        let rows = sqlx::query(
            "SELECT seq, kind, data_json, created_at FROM liaison_events WHERE tenant_id = $1 AND session_id = $2 AND seq > $3 \
             ORDER BY seq LIMIT $4",
        )
        .bind(tenant_id)
        .bind(session_id)
        .bind(after_seq)
        .bind(i64::from(limit))
        .fetch_all(self.database.pool())
        .await?;
        rows.iter()
            .map(|row| {
                Ok(LiaisonEvent {
                    seq: row.try_get("seq")?,
                    kind: row.try_get("kind")?,
                    data_json: row.try_get("data_json")?,
                    created_at: row.try_get("created_at")?,
                })
            })
            .collect()
    }

    /// Closes an open session and appends its `liaison.closed` event (built from the session's final
    /// state by `closed`); false when it was closed already.
    pub async fn close(&self, tenant_id: &str, session_id: &str, now: &str, closed: String) -> StoreResult<bool> {
        let mut transaction = self.database.begin().await?;
        let changed = sqlx::query(
            "UPDATE liaison_sessions SET status = 'closed', closed_at = $1 WHERE tenant_id = $2 AND session_id = $3 AND status = 'open'",
        )
        .bind(now)
        .bind(tenant_id)
        .bind(session_id)
        .execute(&mut *transaction)
        .await?;
        if changed.rows_affected() != 1 {
            return Ok(false);
        }
        append(&mut transaction, tenant_id, session_id, now, ("liaison.closed", closed)).await?;
        transaction.commit().await?;
        Ok(true)
    }
}

/// Appends an event numbered from its session's counter (the `UPDATE` takes the row's lock first).
async fn append(transaction: &mut Transaction<'_, Any>, tenant_id: &str, session_id: &str, now: &str, event: NewEvent) -> StoreResult<()> {
    let seq: i64 =
        sqlx::query("UPDATE liaison_sessions SET event_seq = event_seq + 1 WHERE tenant_id = $1 AND session_id = $2 RETURNING event_seq")
            .bind(tenant_id)
            .bind(session_id)
            .fetch_one(&mut **transaction)
            .await?
            .try_get("event_seq")?;
    let (kind, data_json) = event;
    sqlx::query("INSERT INTO liaison_events (tenant_id, session_id, seq, kind, data_json, created_at) VALUES ($1, $2, $3, $4, $5, $6)")
        .bind(tenant_id)
        .bind(session_id)
        .bind(seq)
        .bind(kind)
        .bind(data_json)
        .bind(now)
        .execute(&mut **transaction)
        .await?;
    Ok(())
}

fn session_from_row(row: &AnyRow) -> StoreResult<SessionRow> {
    Ok(SessionRow {
        tenant_id: row.try_get("tenant_id")?,
        session_id: row.try_get("session_id")?,
        key_id: row.try_get("key_id")?,
        agent_id: row.try_get("agent_id")?,
        label: row.try_get("label")?,
        metadata_json: row.try_get("metadata_json")?,
        status: row.try_get("status")?,
        opened_at: row.try_get("opened_at")?,
        expires_at: row.try_get("expires_at")?,
        closed_at: row.try_get("closed_at")?,
        event_seq: row.try_get("event_seq")?,
    })
}

fn plan_from_row(row: &AnyRow) -> StoreResult<PlanRow> {
    let envelope_json: String = row.try_get("envelope_json")?;
    let mut plan = crate::liaison::plan_from_envelope(&envelope_json).unwrap_or_default();
    plan.signature = row.try_get("signature")?;
    plan.state = row.try_get("state")?;
    Ok(PlanRow {
        plan,
        session_id: row.try_get("session_id")?,
        expires_epoch: row.try_get("expires_epoch")?,
        claimed_by: row.try_get("claimed_by")?,
        committed_request_id: row.try_get("committed_request_id")?,
        cost_nanos: row.try_get("cost_nanos")?,
        input_tokens: row.try_get("input_tokens")?,
        output_tokens: row.try_get("output_tokens")?,
        audit_commitment: row.try_get("audit_commitment")?,
        denials: row.try_get("denials")?,
    })
}
