//! Agent memory: facts in four named blocks with fixed sizes, kept per tenant and memory key. A
//! full block makes room by evicting its oldest unpinned fact to archival storage (kept, out of the
//! block); pinned facts are never evicted. Every operation is in the memory audit trail.

use std::ops::Range;

use brainstorm_common::store::Database;
use brainstorm_common::time::now_timestamp;
use brainstorm_policy_firewall::guardrails::MatchType;
use brainstorm_policy_firewall::guardrails::pii;
use brainstorm_proto::prompts::*;
use brainstorm_proto::{ServiceError, ServiceResult};
use sqlx::Row;
use sqlx::any::AnyRow;

/// The blocks and how many core facts each holds.
pub const BLOCKS: [(&str, u32); 4] = [("human", 50), ("project", 50), ("system", 50), ("general", 100)];
/// Audit operations.
pub const OPERATIONS: [&str; 5] = ["append", "replace", "delete", "pin", "evict"];
const DEFAULT_BLOCK: &str = "general";
const MAX_FACT_CHARS: usize = 2_000;
const PREVIEW_CHARS: usize = 80;
/// Audit reads: the default and the most.
const DEFAULT_AUDIT: u32 = 100;
const MAX_AUDIT: u32 = 500;

fn limit_of(block: &str) -> ServiceResult<u32> {
    BLOCKS.iter().find(|(name, _)| *name == block).map(|(_, limit)| *limit).ok_or_else(|| {
        ServiceError::invalid("invalid_block", format!("block `{block}` is not one of {}", BLOCKS.map(|(name, _)| name).join(", ")))
    })
}

fn failure(error: sqlx::Error) -> ServiceError {
    ServiceError::internal(format!("the memory store failed: {error}"))
}

fn validate_fact(fact: &str) -> ServiceResult<String> {
    let fact = fact.trim();
    if fact.is_empty() || fact.chars().count() > MAX_FACT_CHARS {
        return Err(ServiceError::invalid("invalid_fact", format!("fact is required, at most {MAX_FACT_CHARS} characters")));
    }
    Ok(fact.to_string())
}

fn key_of(key: Option<MemoryKey>) -> ServiceResult<MemoryKey> {
    let mut key = key.ok_or_else(|| ServiceError::invalid("invalid_memory_key", "a memory key is required"))?;
    if key.memory_key.is_empty() {
        key.memory_key = key.tenant_id.clone();
    }
    Ok(key)
}

const ENTRY_COLUMNS: &str = "id, block, fact, pinned, archived, created_at, updated_at";

fn entry_from_row(row: &AnyRow) -> Result<MemoryEntry, sqlx::Error> {
    Ok(MemoryEntry {
        id: row.try_get("id")?,
        block: row.try_get("block")?,
        fact: row.try_get("fact")?,
        pinned: row.try_get::<i64, _>("pinned")? != 0,
        archived: row.try_get::<i64, _>("archived")? != 0,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

/// Memory over the store.
#[derive(Debug, Clone)]
pub struct Memory {
    database: Database,
}

struct Audited<'a> {
    operation: &'a str,
    entry: &'a MemoryEntry,
    actor: &'a str,
    reason: &'a str,
}

impl Memory {
    pub fn new(database: Database) -> Memory {
        Memory { database }
    }

    async fn audit(&self, connection: &mut sqlx::AnyConnection, key: &MemoryKey, audited: Audited<'_>) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO memory_audit (id, tenant_id, memory_key, created_at, operation, block, entry_id, fact_after, actor, reason) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(uuid::Uuid::now_v7().to_string())
        .bind(&key.tenant_id)
        .bind(&key.memory_key)
        .bind(now_timestamp())
        .bind(audited.operation)
        .bind(&audited.entry.block)
        .bind(&audited.entry.id)
        .bind(if audited.operation == "delete" { "" } else { audited.entry.fact.as_str() })
        .bind(audited.actor)
        .bind(audited.reason)
        .execute(connection)
        .await
        .map(drop)
    }

    async fn entry(&self, connection: &mut sqlx::AnyConnection, key: &MemoryKey, id: &str) -> ServiceResult<MemoryEntry> {
        let row = sqlx::query(&format!("SELECT {ENTRY_COLUMNS} FROM memory_entries WHERE tenant_id = $1 AND memory_key = $2 AND id = $3"))
            .bind(&key.tenant_id)
            .bind(&key.memory_key)
            .bind(id)
            .fetch_optional(connection)
            .await
            .map_err(failure)?;
        row.as_ref()
            .map(entry_from_row)
            .transpose()
            .map_err(failure)?
            .ok_or_else(|| ServiceError::not_found("memory_entry_not_found", format!("no memory entry `{id}`")))
    }

    /// Appends a fact; a full block first evicts its oldest unpinned fact (409 when all are pinned).
    pub async fn add(&self, request: AddMemoryRequest) -> ServiceResult<AddMemoryResponse> {
        let key = key_of(request.key)?;
        let block = if request.block.is_empty() { DEFAULT_BLOCK.to_string() } else { request.block };
        let limit = limit_of(&block)?;
        let fact = validate_fact(&request.fact)?;
        let now = now_timestamp();
        let entry = MemoryEntry {
            id: uuid::Uuid::now_v7().to_string(),
            block: block.clone(),
            fact,
            pinned: request.pinned,
            archived: false,
            created_at: now.clone(),
            updated_at: now,
        };
        let mut transaction = self.database.begin().await.map_err(failure)?;
        let rows = sqlx::query(&format!(
            "SELECT {ENTRY_COLUMNS} FROM memory_entries WHERE tenant_id = $1 AND memory_key = $2 AND block = $3 AND archived = 0 ORDER BY created_at, id"
        ))
        .bind(&key.tenant_id)
        .bind(&key.memory_key)
        .bind(&block)
        .fetch_all(&mut *transaction)
        .await
        .map_err(failure)?;
        let held: Vec<MemoryEntry> = rows.iter().map(entry_from_row).collect::<Result<_, _>>().map_err(failure)?;
        let excess = (held.len() + 1).saturating_sub(limit as usize);
        let mut evicted = Vec::new();
        for oldest in held.into_iter().filter(|entry| !entry.pinned).take(excess) {
            sqlx::query("UPDATE memory_entries SET archived = 1, updated_at = $1 WHERE id = $2")
                .bind(&entry.created_at)
                .bind(&oldest.id)
                .execute(&mut *transaction)
                .await
                .map_err(failure)?;
            let oldest = MemoryEntry { archived: true, ..oldest };
            self.audit(
                &mut transaction,
                &key,
                Audited { operation: "evict", entry: &oldest, actor: &request.actor, reason: "block full: moved to archival" },
            )
            .await
            .map_err(failure)?;
            evicted.push(oldest);
        }
        if evicted.len() < excess {
            return Err(ServiceError::conflict(
                "memory_block_full",
                format!("block `{block}` holds {limit} facts and all that could make room are pinned: unpin or delete one"),
            ));
        }
        sqlx::query(&format!(
            "INSERT INTO memory_entries (tenant_id, memory_key, {ENTRY_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
        ))
        .bind(&key.tenant_id)
        .bind(&key.memory_key)
        .bind(&entry.id)
        .bind(&entry.block)
        .bind(&entry.fact)
        .bind(i64::from(entry.pinned))
        .bind(0_i64)
        .bind(&entry.created_at)
        .bind(&entry.updated_at)
        .execute(&mut *transaction)
        .await
        .map_err(failure)?;
        self.audit(&mut transaction, &key, Audited { operation: "append", entry: &entry, actor: &request.actor, reason: &request.reason })
            .await
            .map_err(failure)?;
        if entry.pinned {
            self.audit(&mut transaction, &key, Audited { operation: "pin", entry: &entry, actor: &request.actor, reason: "pinned" })
                .await
                .map_err(failure)?;
        }
        transaction.commit().await.map_err(failure)?;
        Ok(AddMemoryResponse { entry: Some(entry), evicted })
    }

    /// Replaces a fact and/or changes its pin.
    pub async fn update(&self, request: UpdateMemoryRequest) -> ServiceResult<MemoryEntry> {
        let key = key_of(request.key)?;
        if request.fact.is_none() && request.pinned.is_none() {
            return Err(ServiceError::invalid("invalid_fact", "an update needs fact or pinned"));
        }
        let fact = request.fact.as_deref().map(validate_fact).transpose()?;
        let mut transaction = self.database.begin().await.map_err(failure)?;
        let mut entry = self.entry(&mut transaction, &key, &request.id).await?;
        entry.updated_at = now_timestamp();
        if let Some(fact) = fact.filter(|fact| *fact != entry.fact) {
            entry.fact = fact;
            self.audit(&mut transaction, &key, Audited { operation: "replace", entry: &entry, actor: &request.actor, reason: "" })
                .await
                .map_err(failure)?;
        }
        if let Some(pinned) = request.pinned.filter(|pinned| *pinned != entry.pinned) {
            entry.pinned = pinned;
            let reason = if pinned { "pinned" } else { "unpinned" };
            self.audit(&mut transaction, &key, Audited { operation: "pin", entry: &entry, actor: &request.actor, reason })
                .await
                .map_err(failure)?;
        }
        sqlx::query("UPDATE memory_entries SET fact = $1, pinned = $2, updated_at = $3 WHERE id = $4")
            .bind(&entry.fact)
            .bind(i64::from(entry.pinned))
            .bind(&entry.updated_at)
            .bind(&entry.id)
            .execute(&mut *transaction)
            .await
            .map_err(failure)?;
        transaction.commit().await.map_err(failure)?;
        Ok(entry)
    }

    pub async fn delete(&self, request: MemoryEntryRef) -> ServiceResult<MemoryEntry> {
        let key = key_of(request.key)?;
        let mut transaction = self.database.begin().await.map_err(failure)?;
        let entry = self.entry(&mut transaction, &key, &request.id).await?;
        sqlx::query("DELETE FROM memory_entries WHERE id = $1").bind(&entry.id).execute(&mut *transaction).await.map_err(failure)?;
        self.audit(&mut transaction, &key, Audited { operation: "delete", entry: &entry, actor: &request.actor, reason: "" })
            .await
            .map_err(failure)?;
        transaction.commit().await.map_err(failure)?;
        Ok(entry)
    }

    /// Entries (oldest first) and every block's summary.
    pub async fn list(&self, query: MemoryQuery) -> ServiceResult<MemoryView> {
        let key = key_of(query.key)?;
        if !query.block.is_empty() {
            limit_of(&query.block)?;
        }
        // Core entries always (the blocks' summaries count them), archival ones only when asked for:
        // archival storage grows with every eviction, and renders read memory.
        let rows = sqlx::query(&format!(
            "SELECT {ENTRY_COLUMNS} FROM memory_entries WHERE tenant_id = $1 AND memory_key = $2 AND (archived = 0 OR $3 = 1) ORDER BY created_at, id"
        ))
        .bind(&key.tenant_id)
        .bind(&key.memory_key)
        .bind(i64::from(query.include_archival))
        .fetch_all(self.database.pool())
        .await
        .map_err(failure)?;
        let archival: i64 =
            sqlx::query("SELECT COUNT(*) AS archival FROM memory_entries WHERE tenant_id = $1 AND memory_key = $2 AND archived = 1")
                .bind(&key.tenant_id)
                .bind(&key.memory_key)
                .fetch_one(self.database.pool())
                .await
                .and_then(|row| row.try_get("archival"))
                .map_err(failure)?;
        let all: Vec<MemoryEntry> = rows.iter().map(entry_from_row).collect::<Result<_, _>>().map_err(failure)?;
        let count =
            |filter: &dyn Fn(&MemoryEntry) -> bool| u32::try_from(all.iter().filter(|entry| filter(entry)).count()).unwrap_or(u32::MAX);
        let blocks = BLOCKS
            .iter()
            .map(|(name, limit)| BlockSummary {
                name: name.to_string(),
                count: count(&|entry| entry.block == *name && !entry.archived),
                limit: *limit,
                pinned_count: count(&|entry| entry.block == *name && !entry.archived && entry.pinned),
            })
            .collect();
        let total_core_entries = count(&|entry| !entry.archived);
        let total_archival_entries = u32::try_from(archival).unwrap_or(u32::MAX);
        let entries = all.into_iter().filter(|entry| query.block.is_empty() || entry.block == query.block).collect();
        Ok(MemoryView { entries, blocks, total_core_entries, total_archival_entries })
    }

    pub async fn audit_trail(&self, query: MemoryAuditQuery) -> ServiceResult<MemoryAuditList> {
        let key = key_of(query.key)?;
        if !query.operation.is_empty() && !OPERATIONS.contains(&query.operation.as_str()) {
            return Err(ServiceError::invalid("invalid_operation", format!("operation is one of {}", OPERATIONS.join(", "))));
        }
        let limit = match query.limit {
            0 => DEFAULT_AUDIT,
            limit => limit.min(MAX_AUDIT),
        };
        let rows = sqlx::query(
            "SELECT id, created_at, operation, block, entry_id, fact_after, actor, reason FROM memory_audit \
             WHERE tenant_id = $1 AND memory_key = $2 AND created_at >= $3 AND ($4 = '' OR operation = $4) ORDER BY created_at DESC, id DESC LIMIT $5",
        )
        .bind(&key.tenant_id)
        .bind(&key.memory_key)
        .bind(&query.since)
        .bind(&query.operation)
        .bind(i64::from(limit))
        .fetch_all(self.database.pool())
        .await
        .map_err(failure)?;
        let entries = rows
            .iter()
            .map(|row| {
                Ok(MemoryAuditEntry {
                    id: row.try_get("id")?,
                    timestamp: row.try_get("created_at")?,
                    operation: row.try_get("operation")?,
                    block: row.try_get("block")?,
                    entry_id: row.try_get("entry_id")?,
                    fact_after: row.try_get("fact_after")?,
                    actor: row.try_get("actor")?,
                    reason: row.try_get("reason")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(failure)?;
        Ok(MemoryAuditList { entries })
    }

    pub async fn stats(&self, request: MemoryStatsRequest) -> ServiceResult<MemoryStats> {
        let key = key_of(request.key)?;
        let rows = sqlx::query(
            "SELECT operation, COUNT(*) AS operations FROM memory_audit WHERE tenant_id = $1 AND memory_key = $2 AND created_at >= $3 GROUP BY operation",
        )
        .bind(&key.tenant_id)
        .bind(&key.memory_key)
        .bind(&request.since)
        .fetch_all(self.database.pool())
        .await
        .map_err(failure)?;
        let mut counts: Vec<OperationCount> =
            OPERATIONS.iter().map(|operation| OperationCount { operation: operation.to_string(), count: 0 }).collect();
        for row in &rows {
            let operation: String = row.try_get("operation").map_err(failure)?;
            let count: i64 = row.try_get("operations").map_err(failure)?;
            if let Some(slot) = counts.iter_mut().find(|slot| slot.operation == operation) {
                slot.count = u64::try_from(count).unwrap_or_default();
            }
        }
        Ok(MemoryStats { counts })
    }

    pub async fn compliance(&self, key: MemoryKey) -> ServiceResult<ComplianceReport> {
        let view = self.list(MemoryQuery { key: Some(key), block: String::new(), include_archival: false }).await?;
        let violations = view
            .entries
            .iter()
            .filter_map(|entry| {
                let (issues, spans) = findings(&entry.fact);
                (!issues.is_empty()).then(|| Violation {
                    entry_id: entry.id.clone(),
                    block: entry.block.clone(),
                    fact_preview: preview(&entry.fact, spans),
                    issues: issues.into_iter().map(str::to_string).collect(),
                })
            })
            .collect();
        Ok(ComplianceReport { total_entries: view.total_core_entries, violations })
    }
}

/// What in a fact looks personal or secret, by the guardrails' PII and secret detectors (the
/// tool firewall's and prompt guardrails' own): `possible_email`, `possible_phone`, `possible_ssn`,
/// `possible_card_number` (Luhn-valid), `possible_iban` (mod-97-valid), `possible_secret` (API
/// keys, tokens, private keys), each once, with the spans found.
fn findings(fact: &str) -> (Vec<&'static str>, Vec<Range<usize>>) {
    let mut found = Vec::new();
    pii::scan(fact, &mut found);
    let mut issues: Vec<&'static str> = Vec::new();
    for finding in &found {
        let issue = match (finding.match_type, finding.subtype.as_ref()) {
            (MatchType::Secret, _) => "possible_secret",
            (_, "email") => "possible_email",
            (_, "phone") => "possible_phone",
            (_, "us_ssn") => "possible_ssn",
            (_, "credit_card") => "possible_card_number",
            (_, "iban") => "possible_iban",
            _ => "possible_personal_data",
        };
        if !issues.contains(&issue) {
            issues.push(issue);
        }
    }
    (issues, found.into_iter().filter_map(|finding| finding.span).collect())
}

/// What looks personal or secret in a fact.
pub fn issues(fact: &str) -> Vec<&'static str> {
    findings(fact).0
}

/// A fact's preview as the compliance report shows it: what looks personal or secret masked, cut short.
pub fn masked_preview(fact: &str) -> String {
    preview(fact, findings(fact).1)
}

/// A fact's start with every span found masked.
fn preview(fact: &str, mut spans: Vec<Range<usize>>) -> String {
    spans.sort_by_key(|span| span.start);
    let mut masked = String::with_capacity(fact.len());
    let mut at = 0;
    for span in spans {
        // Overlapping spans (a detector's claim inside another's) are masked once.
        if span.start < at || !fact.is_char_boundary(span.start) || !fact.is_char_boundary(span.end) {
            continue;
        }
        masked.push_str(&fact[at..span.start]);
        masked.push_str("[masked]");
        at = span.end;
    }
    masked.push_str(&fact[at..]);
    let mut preview: String = masked.chars().take(PREVIEW_CHARS).collect();
    if masked.chars().count() > PREVIEW_CHARS {
        preview.push_str("...");
    }
    preview
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn personal_data_and_secrets_are_found_and_masked() {
        assert_eq!(issues("reach Ada at ada.lovelace@example.co.uk"), ["possible_email"]);
        assert_eq!(issues("call +1 415-555-0100 after six"), ["possible_phone"]);
        assert_eq!(issues("ssn 123-45-6789"), ["possible_ssn"]);
        assert_eq!(issues("card 4111 1111 1111 1111"), ["possible_card_number"]);
        assert!(issues("order 4111 1111 1111 1112").is_empty(), "not Luhn-valid");
        assert_eq!(issues("key sk-abcdefghijklmnopqrstu"), ["possible_secret"]);
        assert!(issues("prefers tea to coffee; works on project apollo since 2021").is_empty());
        let fact = "mail ada@example.com or card 4111111111111111";
        let shown = preview(fact, findings(fact).1);
        assert!(!shown.contains("ada@") && !shown.contains("4111"), "{shown}");
    }
}
