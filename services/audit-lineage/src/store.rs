//! The chain's tables, read and written with bound parameters on SQLite or PostgreSQL.
//!
//! Appending (one record or a batch of one tenant's) is one transaction: lock and read the tenant's
//! head, insert the batch's rows after it in multi-row statements (a request id already chained is
//! skipped), and move the head forward by compare-and-set. A second writer racing on the same head
//! fails on the `(tenant_id, sequence)` key or the head's compare-and-set and retries from the new head,
//! so even a rebalance that briefly gives a tenant two writers cannot fork the chain.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use brainstorm_common::store::{Database, is_unique_violation, statement_chunks};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::canonical::{CHAIN_SCHEMA_VERSION, commitment_and_chain_hash};
use crate::chain::{ChainPoint, ChainRow};

/// Result of a store operation.
pub type StoreResult<T> = Result<T, sqlx::Error>;

/// Attempts of an append that keeps losing races before giving up (the caller retries later).
const APPEND_ATTEMPTS: u32 = 8;

/// `SELECT <every chain column> FROM audit_chain <rest>`, as one literal.
macro_rules! select_rows {
    ($rest:literal) => {
        concat!(
            "SELECT tenant_id, sequence, request_id, occurred_at, trace_id, chain_schema_version, payload, commitment, prev_hash, hash, \
             recorded_at FROM audit_chain ",
            $rest
        )
    };
}

/// A record ready to be chained.
#[derive(Debug, Clone)]
pub struct NewEntry<'a> {
    pub tenant_id: &'a str,
    pub request_id: &'a str,
    pub occurred_at: &'a str,
    pub trace_id: &'a str,
    pub payload: &'a str,
    /// Captured text and its digest, stored beside the chain.
    pub capture: Option<(&'a str, &'a str, &'a str)>,
}

/// What an append did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Appended {
    /// A new row at this position.
    Chained { sequence: i64, hash: String, commitment: String },
    /// The request id was already chained (a redelivery); its row is untouched.
    Duplicate { sequence: i64, hash: String, commitment: String },
}

/// The head of a tenant's chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub point: ChainPoint,
    /// When the tenant's first chained record occurred: older requests predate the rollout.
    pub first_occurred_at: String,
}

/// Where verification starts after retention.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub point: ChainPoint,
    pub through_occurred_at: String,
}

/// Captured text beside the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCapture {
    pub request_id: String,
    pub digest: String,
    /// Both None once redacted.
    pub prompt: Option<String>,
    pub completion: Option<String>,
    pub redacted_at: Option<String>,
}

/// The audit store.
#[derive(Debug, Clone)]
pub struct AuditStore {
    database: Database,
}

impl AuditStore {
    pub fn new(database: Database) -> Self {
        AuditStore { database }
    }

    /// Chains an entry after the tenant's head, once per request id (a batch of one).
    pub async fn append(&self, entry: &NewEntry<'_>, recorded_at: &str) -> StoreResult<Appended> {
        let mut appended = self.append_batch(entry.tenant_id, std::slice::from_ref(entry), recorded_at).await?;
        appended.pop().ok_or_else(|| sqlx::Error::Protocol("a batch of one appended nothing".to_string()))
    }

    /// Chains several entries of one tenant after its head, in order, in one transaction (what the
    /// consumer does with the deliveries it has at hand); each request id once. Races retry the
    /// whole batch from the new head, like `append`.
    pub async fn append_batch(&self, tenant_id: &str, entries: &[NewEntry<'_>], recorded_at: &str) -> StoreResult<Vec<Appended>> {
        // Nearly every batch is all new: the first attempt skips looking for request ids already
        // chained (a statement less) and finds out from the insert instead; an attempt after one
        // that found a repeat looks first.
        let mut repeats_possible = {
            let mut seen = HashSet::with_capacity(entries.len());
            !entries.iter().all(|entry| seen.insert(entry.request_id))
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let outcome = self.try_append_batch(tenant_id, entries, recorded_at, repeats_possible).await;
            if !repeats_possible && matches!(outcome, Ok(None)) {
                // A repeat, not a race: look first, at once, without spending an attempt.
                repeats_possible = true;
                attempt -= 1;
                continue;
            }
            repeats_possible = true;
            match outcome {
                Ok(Some(appended)) => return Ok(appended),
                Ok(None) if attempt < APPEND_ATTEMPTS => {}
                Err(error) if attempt < APPEND_ATTEMPTS && is_write_conflict(&error) => {}
                Ok(None) => return Err(sqlx::Error::Protocol("the chain head kept moving; giving up this batch".to_string())),
                Err(error) => return Err(error),
            }
            tracing::debug!(tenant_id, attempt, "chain head moved; appending the batch again");
            tokio::time::sleep(Duration::from_millis(5 * u64::from(attempt))).await;
        }
    }

    /// One attempt at a batch; None when another writer moved the head first. The batch costs the
    /// same few statements whatever its size (rows go in multi-row statements): on SQLite every
    /// statement is a round trip to the connection's thread.
    async fn try_append_batch(
        &self,
        tenant_id: &str,
        entries: &[NewEntry<'_>],
        recorded_at: &str,
        repeats_possible: bool,
    ) -> StoreResult<Option<Vec<Appended>>> {
        let mut transaction = self.database.begin_writer().await?;
        // Writing first takes the tenant's head row lock (PostgreSQL) or the write lock (SQLite)
        // before anything is read, so a second writer waits here instead of failing later: SQLite's
        // busy timeout covers a transaction that has not read yet, not one that has. The same
        // statement reads the head back.
        let head = sqlx::query("UPDATE audit_chain_heads SET updated_at = updated_at WHERE tenant_id = $1 RETURNING sequence, hash")
            .bind(tenant_id)
            .fetch_optional(&mut *transaction)
            .await?;
        let start = match &head {
            Some(row) => ChainPoint { sequence: row.try_get("sequence")?, hash: row.try_get("hash")? },
            None => ChainPoint::genesis(),
        };
        // A request id already chained (a redelivery, or twice in this batch) is not chained again.
        let mut known = if repeats_possible { self.chained_among(&mut transaction, tenant_id, entries).await? } else { HashMap::new() };
        let mut previous = start.clone();
        let mut first_occurred_at = None;
        let mut appended = Vec::with_capacity(entries.len());
        let mut rows: Vec<(&NewEntry<'_>, i64, String, String, String)> = Vec::with_capacity(entries.len());
        for (index, entry) in entries.iter().enumerate() {
            brainstorm_common::bus::share_thread(index).await;
            if let Some((sequence, hash, commitment)) = known.get(entry.request_id) {
                appended.push(Appended::Duplicate { sequence: *sequence, hash: hash.clone(), commitment: commitment.clone() });
                continue;
            }
            let sequence = previous.sequence + 1;
            let (commitment, hash) = commitment_and_chain_hash(entry.payload, &previous.hash);
            known.insert(entry.request_id.to_string(), (sequence, hash.clone(), commitment.clone()));
            first_occurred_at.get_or_insert(entry.occurred_at);
            appended.push(Appended::Chained { sequence, hash: hash.clone(), commitment: commitment.clone() });
            rows.push((entry, sequence, commitment, previous.hash.clone(), hash.clone()));
            previous = ChainPoint { sequence, hash };
        }
        let placeholders = self.database.placeholders();
        for chunk in statement_chunks(&rows) {
            let sql = format!(
                "{} INTO audit_chain (tenant_id, sequence, request_id, occurred_at, trace_id, chain_schema_version, payload, \
                 commitment, prev_hash, hash, recorded_at) VALUES {} ON CONFLICT (tenant_id, request_id) DO NOTHING",
                placeholders.batch_insert(),
                placeholders.values(chunk.len(), 11, 1)
            );
            let mut insert = sqlx::query(&sql);
            for (entry, sequence, commitment, prev_hash, hash) in chunk {
                insert = insert
                    .bind(tenant_id)
                    .bind(*sequence)
                    .bind(entry.request_id)
                    .bind(entry.occurred_at)
                    .bind(entry.trace_id)
                    .bind(CHAIN_SCHEMA_VERSION)
                    .bind(entry.payload)
                    .bind(commitment.as_str())
                    .bind(prev_hash.as_str())
                    .bind(hash.as_str())
                    .bind(recorded_at);
            }
            match insert.execute(&mut *transaction).await {
                // Fewer rows than sent: a request id was already chained (when not looked for first)
                // or chained by a racing writer since it was read.
                Ok(result) if result.rows_affected() == chunk.len() as u64 => {}
                Ok(_) => return Ok(None),
                Err(error) if is_unique_violation(&error) => return Ok(None),
                Err(error) => return Err(error),
            }
        }
        let captures: Vec<(&str, i64, (&str, &str, &str))> =
            rows.iter().filter_map(|(entry, sequence, ..)| entry.capture.map(|capture| (entry.request_id, *sequence, capture))).collect();
        for chunk in statement_chunks(&captures) {
            let sql = format!(
                "{} INTO audit_captures (tenant_id, request_id, sequence, digest, prompt, completion) VALUES {}",
                placeholders.batch_insert(),
                placeholders.values(chunk.len(), 6, 1)
            );
            let mut insert = sqlx::query(&sql);
            for (request_id, sequence, (digest, prompt, completion)) in chunk {
                insert = insert.bind(tenant_id).bind(*request_id).bind(*sequence).bind(*digest).bind(*prompt).bind(*completion);
            }
            insert.execute(&mut *transaction).await?;
        }
        if previous.sequence == start.sequence {
            // Only duplicates: nothing moved.
            transaction.commit().await?;
            return Ok(Some(appended));
        }
        let moved = match head {
            Some(_) => sqlx::query(
                "UPDATE audit_chain_heads SET sequence = $1, hash = $2, updated_at = $3 WHERE tenant_id = $4 AND sequence = $5 AND hash = $6",
            )
            .bind(previous.sequence)
            .bind(&previous.hash)
            .bind(recorded_at)
            .bind(tenant_id)
            .bind(start.sequence)
            .bind(&start.hash)
            .execute(&mut *transaction)
            .await?
            .rows_affected(),
            None => sqlx::query(
                "INSERT INTO audit_chain_heads (tenant_id, sequence, hash, first_occurred_at, updated_at) VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (tenant_id) DO NOTHING",
            )
            .bind(tenant_id)
            .bind(previous.sequence)
            .bind(&previous.hash)
            .bind(first_occurred_at.unwrap_or_default())
            .bind(recorded_at)
            .execute(&mut *transaction)
            .await?
            .rows_affected(),
        };
        if moved != 1 {
            return Ok(None);
        }
        transaction.commit().await?;
        Ok(Some(appended))
    }

    /// The chain positions of those of `entries`' request ids the tenant's chain already holds.
    async fn chained_among(
        &self,
        transaction: &mut sqlx::Transaction<'_, sqlx::Any>,
        tenant_id: &str,
        entries: &[NewEntry<'_>],
    ) -> StoreResult<HashMap<String, (i64, String, String)>> {
        let mut known = HashMap::new();
        let placeholders = self.database.placeholders();
        for chunk in statement_chunks(entries) {
            let sql = format!(
                "SELECT request_id, sequence, hash, commitment FROM audit_chain WHERE tenant_id = {} AND request_id IN {}",
                placeholders.nth(1),
                placeholders.values(1, chunk.len(), 2)
            );
            let mut select = sqlx::query(&sql).bind(tenant_id);
            for entry in chunk {
                select = select.bind(entry.request_id);
            }
            for row in select.fetch_all(&mut **transaction).await? {
                known.insert(row.try_get("request_id")?, (row.try_get("sequence")?, row.try_get("hash")?, row.try_get("commitment")?));
            }
        }
        Ok(known)
    }

    pub async fn head(&self, tenant_id: &str) -> StoreResult<Option<Head>> {
        let row = sqlx::query("SELECT sequence, hash, first_occurred_at FROM audit_chain_heads WHERE tenant_id = $1")
            .bind(tenant_id)
            .fetch_optional(self.database.pool())
            .await?;
        row.map(|row| {
            Ok(Head {
                point: ChainPoint { sequence: row.try_get("sequence")?, hash: row.try_get("hash")? },
                first_occurred_at: row.try_get("first_occurred_at")?,
            })
        })
        .transpose()
    }

    pub async fn checkpoint(&self, tenant_id: &str) -> StoreResult<Option<Checkpoint>> {
        let row =
            sqlx::query("SELECT through_sequence, through_hash, through_occurred_at FROM audit_chain_checkpoints WHERE tenant_id = $1")
                .bind(tenant_id)
                .fetch_optional(self.database.pool())
                .await?;
        row.map(|row| {
            Ok(Checkpoint {
                point: ChainPoint { sequence: row.try_get("through_sequence")?, hash: row.try_get("through_hash")? },
                through_occurred_at: row.try_get("through_occurred_at")?,
            })
        })
        .transpose()
    }

    /// Rows after `after_sequence`, in sequence order.
    pub async fn rows_after(&self, tenant_id: &str, after_sequence: i64, limit: i64) -> StoreResult<Vec<ChainRow>> {
        let sql = select_rows!("WHERE tenant_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3");
        let rows = sqlx::query(sql).bind(tenant_id).bind(after_sequence).bind(limit).fetch_all(self.database.pool()).await?;
        rows.iter().map(chain_row).collect()
    }

    /// Rows that occurred in `[since, until)`, after `after_sequence`, in sequence order.
    pub async fn rows_between(
        &self,
        tenant_id: &str,
        since: &str,
        until: &str,
        after_sequence: i64,
        limit: i64,
    ) -> StoreResult<Vec<ChainRow>> {
        let sql = select_rows!(
            "WHERE tenant_id = $1 AND occurred_at >= $2 AND occurred_at < $3 \
             AND sequence > $4 ORDER BY sequence LIMIT $5"
        );
        let rows = sqlx::query(sql)
            .bind(tenant_id)
            .bind(since)
            .bind(until)
            .bind(after_sequence)
            .bind(limit)
            .fetch_all(self.database.pool())
            .await?;
        rows.iter().map(chain_row).collect()
    }

    /// Rows that occurred at or after `since`, newest first, older than the cursor `(occurred_at, sequence)`.
    pub async fn rows_newest_first(
        &self,
        tenant_id: &str,
        since: &str,
        before: Option<(&str, i64)>,
        limit: i64,
    ) -> StoreResult<Vec<ChainRow>> {
        let rows = match before {
            None => {
                let sql = select_rows!(
                    "WHERE tenant_id = $1 AND occurred_at >= $2 \
                     ORDER BY occurred_at DESC, sequence DESC LIMIT $3"
                );
                sqlx::query(sql).bind(tenant_id).bind(since).bind(limit).fetch_all(self.database.pool()).await?
            }
            Some((occurred_at, sequence)) => {
                let sql = select_rows!(
                    "WHERE tenant_id = $1 AND occurred_at >= $2 \
                     AND (occurred_at < $3 OR (occurred_at = $3 AND sequence < $4)) ORDER BY occurred_at DESC, sequence DESC LIMIT $5"
                );
                sqlx::query(sql)
                    .bind(tenant_id)
                    .bind(since)
                    .bind(occurred_at)
                    .bind(sequence)
                    .bind(limit)
                    .fetch_all(self.database.pool())
                    .await?
            }
        };
        rows.iter().map(chain_row).collect()
    }

    pub async fn row_by_request(&self, tenant_id: &str, request_id: &str) -> StoreResult<Option<ChainRow>> {
        let sql = select_rows!("WHERE tenant_id = $1 AND request_id = $2");
        let row = sqlx::query(sql).bind(tenant_id).bind(request_id).fetch_optional(self.database.pool()).await?;
        row.as_ref().map(chain_row).transpose()
    }

    pub async fn row_at(&self, tenant_id: &str, sequence: i64) -> StoreResult<Option<ChainRow>> {
        let sql = select_rows!("WHERE tenant_id = $1 AND sequence = $2");
        let row = sqlx::query(sql).bind(tenant_id).bind(sequence).fetch_optional(self.database.pool()).await?;
        row.as_ref().map(chain_row).transpose()
    }

    /// The rows of one trace, in sequence order (at most `limit`).
    pub async fn rows_by_trace(&self, tenant_id: &str, trace_id: &str, limit: i64) -> StoreResult<Vec<ChainRow>> {
        let sql = select_rows!("WHERE tenant_id = $1 AND trace_id = $2 ORDER BY sequence LIMIT $3");
        let rows = sqlx::query(sql).bind(tenant_id).bind(trace_id).bind(limit).fetch_all(self.database.pool()).await?;
        rows.iter().map(chain_row).collect()
    }

    pub async fn capture(&self, tenant_id: &str, request_id: &str) -> StoreResult<Option<StoredCapture>> {
        let row = sqlx::query(
            "SELECT request_id, digest, prompt, completion, redacted_at FROM audit_captures WHERE tenant_id = $1 AND request_id = $2",
        )
        .bind(tenant_id)
        .bind(request_id)
        .fetch_optional(self.database.pool())
        .await?;
        row.as_ref().map(stored_capture).transpose()
    }

    /// Captures of the rows in `(after_sequence, through_sequence]`.
    pub async fn captures_between(&self, tenant_id: &str, after_sequence: i64, through_sequence: i64) -> StoreResult<Vec<StoredCapture>> {
        let rows = sqlx::query(
            "SELECT request_id, digest, prompt, completion, redacted_at FROM audit_captures \
             WHERE tenant_id = $1 AND sequence > $2 AND sequence <= $3",
        )
        .bind(tenant_id)
        .bind(after_sequence)
        .bind(through_sequence)
        .fetch_all(self.database.pool())
        .await?;
        rows.iter().map(stored_capture).collect()
    }

    /// Removes a request's captured text, keeping its digest; true when something was removed.
    pub async fn redact_capture(&self, tenant_id: &str, request_id: &str, now: &str) -> StoreResult<bool> {
        let result = sqlx::query(
            "UPDATE audit_captures SET prompt = NULL, completion = NULL, redacted_at = $1 \
             WHERE tenant_id = $2 AND request_id = $3 AND redacted_at IS NULL",
        )
        .bind(now)
        .bind(tenant_id)
        .bind(request_id)
        .execute(self.database.pool())
        .await?;
        Ok(result.rows_affected() == 1)
    }

    /// Prunes the longest prefix of the chain whose rows all occurred before `before`, leaving a
    /// checkpoint at its last row. Returns how many rows went and the checkpoint (None when nothing did).
    pub async fn prune_before(&self, tenant_id: &str, before: &str, now: &str) -> StoreResult<(u64, Option<Checkpoint>)> {
        let mut transaction = self.database.begin().await?;
        let first_kept: Option<i64> =
            sqlx::query_scalar("SELECT MIN(sequence) FROM audit_chain WHERE tenant_id = $1 AND occurred_at >= $2")
                .bind(tenant_id)
                .bind(before)
                .fetch_one(&mut *transaction)
                .await?;
        let through = match first_kept {
            Some(first_kept) => first_kept - 1,
            None => sqlx::query_scalar::<_, Option<i64>>("SELECT MAX(sequence) FROM audit_chain WHERE tenant_id = $1")
                .bind(tenant_id)
                .fetch_one(&mut *transaction)
                .await?
                .unwrap_or(0),
        };
        let sql = select_rows!("WHERE tenant_id = $1 AND sequence = $2");
        let last = sqlx::query(sql).bind(tenant_id).bind(through).fetch_optional(&mut *transaction).await?;
        let Some(last) = last.as_ref().map(chain_row).transpose()? else {
            return Ok((0, None));
        };
        let pruned = sqlx::query("DELETE FROM audit_chain WHERE tenant_id = $1 AND sequence <= $2")
            .bind(tenant_id)
            .bind(through)
            .execute(&mut *transaction)
            .await?
            .rows_affected();
        sqlx::query("DELETE FROM audit_captures WHERE tenant_id = $1 AND sequence <= $2")
            .bind(tenant_id)
            .bind(through)
            .execute(&mut *transaction)
            .await?;
        sqlx::query(
            "INSERT INTO audit_chain_checkpoints (tenant_id, through_sequence, through_hash, through_occurred_at, pruned_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant_id) DO UPDATE SET through_sequence = excluded.through_sequence, \
             through_hash = excluded.through_hash, through_occurred_at = excluded.through_occurred_at, pruned_at = excluded.pruned_at",
        )
        .bind(tenant_id)
        .bind(last.sequence)
        .bind(&last.hash)
        .bind(&last.occurred_at)
        .bind(now)
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await?;
        let checkpoint =
            Checkpoint { point: ChainPoint { sequence: last.sequence, hash: last.hash }, through_occurred_at: last.occurred_at };
        Ok((pruned, Some(checkpoint)))
    }
}

fn chain_row(row: &AnyRow) -> StoreResult<ChainRow> {
    Ok(ChainRow {
        tenant_id: row.try_get("tenant_id")?,
        sequence: row.try_get("sequence")?,
        request_id: row.try_get("request_id")?,
        occurred_at: row.try_get("occurred_at")?,
        trace_id: row.try_get("trace_id")?,
        chain_schema_version: row.try_get("chain_schema_version")?,
        payload: row.try_get("payload")?,
        commitment: row.try_get("commitment")?,
        prev_hash: row.try_get("prev_hash")?,
        hash: row.try_get("hash")?,
        recorded_at: row.try_get("recorded_at")?,
    })
}

fn stored_capture(row: &AnyRow) -> StoreResult<StoredCapture> {
    Ok(StoredCapture {
        request_id: row.try_get("request_id")?,
        digest: row.try_get("digest")?,
        prompt: row.try_get("prompt")?,
        completion: row.try_get("completion")?,
        redacted_at: row.try_get("redacted_at")?,
    })
}

/// A write that lost a race with another writer: a unique key taken first, or SQLite's busy/locked
/// (a deferred transaction cannot upgrade to writing after another writer committed).
fn is_write_conflict(error: &sqlx::Error) -> bool {
    if is_unique_violation(error) {
        return true;
    }
    match error {
        sqlx::Error::Database(database_error) => {
            matches!(database_error.code().as_deref(), Some("5" | "6" | "517" | "40001" | "40P01"))
        }
        _ => false,
    }
}
