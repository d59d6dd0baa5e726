//! The audit-lineage service: the `AuditLineageService` contract over the chain store.

use std::borrow::{Borrow, Cow};
use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use brainstorm_common::store::{Database, store_failure as common_store_failure};
use brainstorm_common::time::{format_timestamp, normalise_timestamp, parse_timestamp};
use brainstorm_proto::audit::*;
use brainstorm_proto::{ErrorKind, ServiceError, ServiceResult};
use chrono::{DateTime, Duration, Utc};

use crate::artifact::ArtifactSigner;
use crate::canonical::{CHAIN_SCHEMA_VERSION, DecodedPayload, ObjectBuilder, canonical_payload, capture_digest, decode_payload};
use crate::chain::{
    CaptureState, ChainPoint, ChainRow, ChainVerifier, DEFAULT_PROVENANCE_CHECKS, MAX_PROVENANCE_CHECKS, Provenance, provenance_of,
    row_integrity,
};
use crate::export::{header_line, row_line};
use crate::inventory::InventoryBuilder;
use crate::lineage::{EpisodeNode, anomaly, order_episode, relation};
use crate::replay::{self, PriceTable, STRATEGIES};
use crate::store::{Appended, AuditStore, NewEntry, StoredCapture};

/// Rows read per page when walking a chain or a window.
const PAGE_ROWS: i64 = 1000;
const DEFAULT_EXPORT_ROWS: u32 = 1000;
const MAX_EXPORT_ROWS: u32 = 10_000;
const DEFAULT_DECISIONS: u32 = 100;
const MAX_DECISIONS: u32 = 1000;
/// The most records of one trace an episode reads.
const MAX_EPISODE_RECORDS: i64 = 1000;
/// The most records a window aggregate (inventory, simulate, compare) reads.
const MAX_WINDOW_RECORDS: usize = 500_000;
const OUTCOMES: [&str; 3] = ["allowed", "denied", "error"];
const RECORDED_COVERAGE: [&str; 4] = ["captured", "sampled_out", "dropped", "aggregated"];

/// The service's notion of now; tests move it.
pub type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// What the service needs besides its store.
#[derive(Clone)]
pub struct AuditLineageOptions {
    /// Signs evidence artifacts.
    pub signer: ArtifactSigner,
    pub clock: Clock,
}

impl AuditLineageOptions {
    /// Options with the real clock.
    pub fn new(signer: ArtifactSigner) -> Self {
        AuditLineageOptions { signer, clock: Arc::new(Utc::now) }
    }
}

/// The audit-lineage service.
#[derive(Clone)]
pub struct AuditLineageServiceImpl {
    store: AuditStore,
    options: Arc<AuditLineageOptions>,
}

/// The payload to chain: the one the edge encoded and committed to, carried with the record, or the
/// record encoded here when none came with it (a record from an older edge, or from a test).
fn payload_of(record: &AuditRecord) -> Cow<'_, str> {
    if record.canonical_payload.is_empty() { Cow::Owned(canonical_payload(record)) } else { Cow::Borrowed(&record.canonical_payload) }
}

/// Items grouped by their tenant: each tenant's in their order, tenants in the order they first
/// appear (what a chain append needs: one tenant per transaction, its records in order).
pub(crate) fn by_tenant<T>(items: impl IntoIterator<Item = T>, tenant_of: impl Fn(&T) -> &str) -> Vec<(String, Vec<T>)> {
    let mut tenants: Vec<(String, Vec<T>)> = Vec::new();
    for item in items {
        match tenants.iter_mut().find(|(tenant_id, _)| tenant_id == tenant_of(&item)) {
            Some((_, group)) => group.push(item),
            None => tenants.push((tenant_of(&item).to_string(), vec![item])),
        }
    }
    tenants
}

/// What `RecordAudit` answers for an append.
fn recorded(appended: Appended) -> RecordAuditResponse {
    match appended {
        Appended::Chained { sequence, hash, commitment } => RecordAuditResponse { recorded: true, sequence, hash, commitment },
        Appended::Duplicate { sequence, hash, commitment } => RecordAuditResponse { recorded: false, sequence, hash, commitment },
    }
}

fn store_failure(error: sqlx::Error) -> ServiceError {
    common_store_failure("audit-lineage", error)
}

fn required<'a>(field: &str, value: &'a str) -> ServiceResult<&'a str> {
    if value.is_empty() { Err(ServiceError::invalid("missing_field", format!("{field} is required"))) } else { Ok(value) }
}

/// The record's `occurred_at` normalised the one way timestamps are stored.
fn normalised_time(text: &str) -> ServiceResult<String> {
    normalise_timestamp(text).ok_or_else(|| invalid_time(text))
}

/// The error for an `occurred_at` that is not an RFC 3339 instant.
fn invalid_time(text: &str) -> ServiceError {
    ServiceError::invalid("invalid_timestamp", format!("`{text}` is not an RFC 3339 timestamp"))
}

/// Checks what chaining relies on; the edge may call it before publishing.
pub fn validate_record(record: &AuditRecord) -> ServiceResult<()> {
    required("request_id", &record.request_id)?;
    required("tenant_id", &record.tenant_id)?;
    // Parsed only: the normal form is not needed here (this runs twice per request).
    if parse_timestamp(&record.occurred_at).is_none() {
        return Err(invalid_time(&record.occurred_at));
    }
    if !OUTCOMES.contains(&record.outcome.as_str()) {
        return Err(ServiceError::invalid("invalid_outcome", format!("outcome `{}` is not allowed, denied or error", record.outcome)));
    }
    if !record.coverage.is_empty() && !RECORDED_COVERAGE.contains(&record.coverage.as_str()) {
        return Err(ServiceError::invalid("invalid_coverage", format!("coverage `{}` cannot be recorded", record.coverage)));
    }
    if record.cost_nanos < 0 || record.input_tokens < 0 || record.output_tokens < 0 || record.latency_ms < 0 {
        return Err(ServiceError::invalid("invalid_amount", "tokens, cost and latency cannot be negative"));
    }
    Ok(())
}

/// The instant a `req_<UUIDv7>` request id was issued.
fn request_time(request_id: &str) -> Option<DateTime<Utc>> {
    let uuid = uuid::Uuid::parse_str(request_id.strip_prefix("req_").unwrap_or(request_id)).ok()?;
    let (seconds, nanos) = uuid.get_timestamp()?.to_unix();
    DateTime::from_timestamp(i64::try_from(seconds).ok()?, nanos)
}

fn capture_state(decoded: &DecodedPayload, stored: Option<&StoredCapture>) -> CaptureState {
    if decoded.capture_digest.is_none() {
        return CaptureState::Unknown;
    }
    match stored {
        None => CaptureState::Missing,
        Some(stored) if stored.redacted_at.is_some() => CaptureState::Redacted,
        Some(stored) => CaptureState::Stored(Capture {
            prompt: stored.prompt.clone().unwrap_or_default(),
            completion: stored.completion.clone().unwrap_or_default(),
        }),
    }
}

impl AuditLineageServiceImpl {
    /// The service over a migrated database.
    pub fn new(database: Database, options: AuditLineageOptions) -> Self {
        AuditLineageServiceImpl { store: AuditStore::new(database), options: Arc::new(options) }
    }

    fn now(&self) -> DateTime<Utc> {
        (self.options.clock)()
    }

    /// Chains a record once per request id: the consumer's path and `RecordAudit`'s.
    pub async fn append(&self, record: &AuditRecord) -> ServiceResult<(Appended, String)> {
        validate_record(record)?;
        let payload = payload_of(record).into_owned();
        let occurred_at = normalised_time(&record.occurred_at)?;
        let trace_id = record.trace.as_ref().map(|trace| trace.trace_id.clone()).unwrap_or_default();
        let digest = record.capture.as_ref().map(capture_digest);
        let capture = match (&record.capture, &digest) {
            (Some(capture), Some(digest)) => Some((digest.as_str(), capture.prompt.as_str(), capture.completion.as_str())),
            _ => None,
        };
        let entry = NewEntry {
            tenant_id: &record.tenant_id,
            request_id: &record.request_id,
            occurred_at: &occurred_at,
            trace_id: &trace_id,
            payload: &payload,
            capture,
        };
        let appended = self.store.append(&entry, &format_timestamp(self.now())).await.map_err(store_failure)?;
        if let Appended::Duplicate { commitment, .. } = &appended
            && *commitment != crate::canonical::payload_commitment(&payload)
        {
            tracing::warn!(tenant_id = %record.tenant_id, request_id = %record.request_id, "a redelivered audit record differs from the chained one; the chained one stays");
        }
        Ok((appended, payload))
    }

    /// Chains several records of one tenant in one transaction, in order; each must pass
    /// `validate_record` (the consumer checks them one by one first).
    pub async fn append_batch<R: Borrow<AuditRecord>>(&self, tenant_id: &str, records: &[R]) -> ServiceResult<Vec<Appended>> {
        struct Prepared<'a> {
            payload: Cow<'a, str>,
            occurred_at: String,
            trace_id: String,
            digest: Option<String>,
        }
        let mut prepared = Vec::with_capacity(records.len());
        for (index, record) in records.iter().enumerate() {
            brainstorm_common::bus::share_thread(index).await;
            let record = record.borrow();
            validate_record(record)?;
            if record.tenant_id != tenant_id {
                return Err(ServiceError::invalid("mixed_tenants", "a batch holds one tenant's records"));
            }
            prepared.push(Prepared {
                payload: payload_of(record),
                occurred_at: normalised_time(&record.occurred_at)?,
                trace_id: record.trace.as_ref().map(|trace| trace.trace_id.clone()).unwrap_or_default(),
                digest: record.capture.as_ref().map(capture_digest),
            });
        }
        let entries: Vec<NewEntry<'_>> = records
            .iter()
            .map(Borrow::borrow)
            .zip(&prepared)
            .map(|(record, prepared)| NewEntry {
                tenant_id,
                request_id: &record.request_id,
                occurred_at: &prepared.occurred_at,
                trace_id: &prepared.trace_id,
                payload: prepared.payload.as_ref(),
                capture: match (&record.capture, &prepared.digest) {
                    (Some(capture), Some(digest)) => Some((digest.as_str(), capture.prompt.as_str(), capture.completion.as_str())),
                    _ => None,
                },
            })
            .collect();
        self.store.append_batch(tenant_id, &entries, &format_timestamp(self.now())).await.map_err(store_failure)
    }

    /// One pass of verification from the anchor; returns the report and the head it compared with.
    async fn verify_once(&self, tenant_id: &str, max_checks: u32) -> ServiceResult<(ChainReport, ChainPoint)> {
        let anchor = self.anchor(tenant_id).await?;
        let head = self.store.head(tenant_id).await.map_err(store_failure)?.map_or_else(ChainPoint::genesis, |head| head.point);
        let mut verifier = ChainVerifier::new(tenant_id, anchor.clone(), max_checks);
        let mut after = anchor.sequence;
        loop {
            let rows = self.store.rows_after(tenant_id, after, PAGE_ROWS).await.map_err(store_failure)?;
            let Some(last) = rows.last() else { break };
            let captures: HashMap<String, StoredCapture> = self
                .store
                .captures_between(tenant_id, after, last.sequence)
                .await
                .map_err(store_failure)?
                .into_iter()
                .map(|capture| (capture.request_id.clone(), capture))
                .collect();
            after = last.sequence;
            for row in &rows {
                let capture = match decode_payload(&row.payload) {
                    Ok(decoded) => capture_state(&decoded, captures.get(&row.request_id)),
                    Err(_) => CaptureState::Unknown,
                };
                verifier.push(row, &capture);
            }
            if (rows.len() as i64) < PAGE_ROWS {
                break;
            }
        }
        Ok((verifier.finish(Some(&head)).to_proto(), head))
    }

    async fn anchor(&self, tenant_id: &str) -> ServiceResult<ChainPoint> {
        Ok(self.store.checkpoint(tenant_id).await.map_err(store_failure)?.map_or_else(ChainPoint::genesis, |checkpoint| checkpoint.point))
    }

    async fn row(&self, tenant_id: &str, request_id: &str) -> ServiceResult<ChainRow> {
        self.store
            .row_by_request(tenant_id, request_id)
            .await
            .map_err(store_failure)?
            .ok_or_else(|| ServiceError::not_found("audit_record_not_found", format!("no audit record for request `{request_id}`")))
    }

    /// The row's own check, its decoded payload, and its provenance.
    async fn checked_node(&self, row: ChainRow) -> ServiceResult<EpisodeNode> {
        let integrity = row_integrity(&row);
        let capture = match &integrity {
            Ok(decoded) if decoded.capture_digest.is_some() => {
                let stored = self.store.capture(&row.tenant_id, &row.request_id).await.map_err(store_failure)?;
                capture_state(decoded, stored.as_ref())
            }
            Ok(_) | Err(_) => CaptureState::Unknown,
        };
        let (provenance, _) = provenance_of(&integrity, &capture);
        // A row that fails its own check may still decode: show what it claims, labelled unverified.
        let record = match integrity {
            Ok(decoded) => Some(decoded.record),
            Err(_) => decode_payload(&row.payload).ok().map(|decoded| decoded.record),
        };
        Ok(EpisodeNode { row, record, provenance })
    }

    async fn episode_nodes(&self, tenant_id: &str, trace_id: &str) -> ServiceResult<Vec<EpisodeNode>> {
        let rows = self.store.rows_by_trace(tenant_id, trace_id, MAX_EPISODE_RECORDS).await.map_err(store_failure)?;
        let mut nodes = Vec::with_capacity(rows.len());
        for row in rows {
            nodes.push(self.checked_node(row).await?);
        }
        Ok(nodes)
    }

    /// Decoded records of a window, in chain order (rows that do not decode are skipped and logged).
    async fn window_records(&self, tenant_id: &str, since: &str, until: &str) -> ServiceResult<Vec<AuditRecord>> {
        let mut records = Vec::new();
        let mut after = 0;
        loop {
            let rows = self.store.rows_between(tenant_id, since, until, after, PAGE_ROWS).await.map_err(store_failure)?;
            let Some(last) = rows.last() else { break };
            after = last.sequence;
            let full_page = rows.len() as i64 == PAGE_ROWS;
            for row in rows {
                match decode_payload(&row.payload) {
                    Ok(decoded) => records.push(decoded.record),
                    Err(error) => tracing::warn!(%error, tenant_id, sequence = row.sequence, "skipping an undecodable audit row"),
                }
            }
            if !full_page || records.len() >= MAX_WINDOW_RECORDS {
                break;
            }
        }
        Ok(records)
    }

    /// The coverage of a request id with no row: expired, predating the rollout, or unknown.
    async fn missing_coverage(&self, tenant_id: &str, request_id: &str) -> ServiceResult<&'static str> {
        let not_found = || ServiceError::not_found("lineage_not_found", format!("no lineage for request `{request_id}`"));
        let Some(issued) = request_time(request_id) else { return Err(not_found()) };
        let issued = format_timestamp(issued);
        if let Some(checkpoint) = self.store.checkpoint(tenant_id).await.map_err(store_failure)?
            && issued <= checkpoint.through_occurred_at
        {
            return Ok("expired_by_retention");
        }
        match self.store.head(tenant_id).await.map_err(store_failure)? {
            None => Ok("pre_rollout"),
            Some(head) if issued < head.first_occurred_at => Ok("pre_rollout"),
            Some(_) => Err(not_found()),
        }
    }

    fn window(&self, since: Option<&str>, until: Option<&str>, default_span: Duration) -> ServiceResult<(String, String)> {
        let until = match until {
            Some(text) => {
                parse_timestamp(text).ok_or_else(|| ServiceError::invalid("invalid_until", "until is not an RFC 3339 timestamp"))?
            }
            None => self.now(),
        };
        let since = match since {
            Some(text) => {
                parse_timestamp(text).ok_or_else(|| ServiceError::invalid("invalid_since", "since is not an RFC 3339 timestamp"))?
            }
            None => until - default_span,
        };
        if since >= until {
            return Err(ServiceError::invalid("invalid_period", "since must be before until"));
        }
        Ok((format_timestamp(since), format_timestamp(until)))
    }

    fn artifact_accountability(record: &AuditRecord, registry: Option<&AgentRegistry>) -> Option<crate::canonical::Canonical<'static>> {
        let agent = record.agent.clone().unwrap_or_default();
        let agent_id = record.agent_id.clone().filter(|agent_id| !agent_id.is_empty());
        let registered_owner = agent_id.as_ref().and_then(|agent_id| {
            registry?.agents.iter().find(|entry| entry.agent_id == *agent_id)?.owner_id.clone().filter(|owner| !owner.is_empty())
        });
        let principal_owner = record.principal.as_ref().and_then(|principal| principal.owner_id.clone()).filter(|owner| !owner.is_empty());
        let (owner_id, owner_source, evidence) = match (agent.owner_id.filter(|owner| !owner.is_empty()), registered_owner, principal_owner)
        {
            (Some(owner), _, _) => {
                let source = if agent.owner_source.is_empty() { "agent_profile".to_string() } else { agent.owner_source };
                (owner, source, "committed")
            }
            (None, Some(owner), _) => (owner, "agent_profile".to_string(), "recorded"),
            (None, None, Some(owner)) => (owner, "api_key_user".to_string(), "committed"),
            (None, None, None) => return None,
        };
        Some(
            ObjectBuilder::new()
                .optional_text("agentId", agent_id)
                .text("ownerId", owner_id)
                .text("ownerSource", owner_source)
                .text("evidence", evidence)
                .build(),
        )
    }
}

#[async_trait]
impl AuditLineageService for AuditLineageServiceImpl {
    async fn record_audit(&self, request: AuditRecord) -> ServiceResult<RecordAuditResponse> {
        let (appended, _) = self.append(&request).await?;
        Ok(recorded(appended))
    }

    async fn record_audit_batch(&self, request: AuditRecordBatch) -> ServiceResult<RecordAuditBatchResponse> {
        for (index, record) in request.records.iter().enumerate() {
            validate_record(record).map_err(|error| ServiceError::invalid(error.reason, format!("records[{index}]: {}", error.message)))?;
        }
        // One append per tenant; the results go back in the batch's order.
        let mut results = vec![RecordAuditResponse::default(); request.records.len()];
        for (tenant_id, group) in by_tenant(request.records.into_iter().enumerate(), |(_, record)| &record.tenant_id) {
            let (indexes, records): (Vec<usize>, Vec<AuditRecord>) = group.into_iter().unzip();
            for (index, appended) in indexes.into_iter().zip(self.append_batch(&tenant_id, &records).await?) {
                results[index] = recorded(appended);
            }
        }
        Ok(RecordAuditBatchResponse { results })
    }

    async fn verify_chain(&self, request: VerifyChainRequest) -> ServiceResult<ChainReport> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let max_checks = request.max_provenance_checks.unwrap_or(DEFAULT_PROVENANCE_CHECKS).min(MAX_PROVENANCE_CHECKS);
        // The head and the rows are read one after the other: a record appended in between shows as
        // a head mismatch that is not one. When the head moved meanwhile, verify again (a real
        // mismatch stays put; appends cannot keep moving the head for long).
        let mut attempts = 0;
        loop {
            attempts += 1;
            let (report, head) = self.verify_once(tenant_id, max_checks).await?;
            let raced = !report.valid
                && report.first_broken.as_ref().is_some_and(|broken| broken.reason == "head_mismatch")
                && self.store.head(tenant_id).await.map_err(store_failure)?.map(|now| now.point) != Some(head.clone());
            if raced && attempts < 3 {
                continue;
            }
            if !report.valid {
                tracing::warn!(tenant_id, first_broken = ?report.first_broken, "audit chain verification failed");
            }
            return Ok(report);
        }
    }
    async fn export_chain(&self, request: ExportChainRequest) -> ServiceResult<ChainExportPage> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let limit = request.limit.unwrap_or(DEFAULT_EXPORT_ROWS).clamp(1, MAX_EXPORT_ROWS);
        let mut lines = Vec::new();
        let after = match request.after_sequence {
            Some(after) => after,
            None => {
                let anchor = self.anchor(tenant_id).await?;
                lines.push(header_line(tenant_id, &anchor));
                anchor.sequence
            }
        };
        let rows = self.store.rows_after(tenant_id, after, i64::from(limit)).await.map_err(store_failure)?;
        let next_after_sequence = (rows.len() == limit as usize).then(|| rows.last().map(|row| row.sequence)).flatten();
        lines.extend(rows.iter().map(row_line));
        Ok(ChainExportPage { lines, next_after_sequence })
    }

    async fn explain(&self, request: RequestRef) -> ServiceResult<Explanation> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let row = self.row(tenant_id, required("request_id", &request.request_id)?).await?;
        let decoded = decode_payload(&row.payload)
            .map_err(|_| ServiceError::conflict("audit_record_unreadable", "the stored audit record does not decode; verify the chain"))?;
        let record = decoded.record;
        let decision = record.decision.clone().unwrap_or_default();
        let alternatives = decision
            .candidates
            .iter()
            .filter(|candidate| candidate.model != decision.selected_model || candidate.status != "selected")
            .map(|candidate| PricedAlternative {
                model: candidate.model.clone(),
                provider: candidate.provider.clone(),
                estimated_cost_nanos: candidate.estimated_cost_nanos,
                score_micros: candidate.score_micros,
                status: candidate.status.clone(),
                reason: candidate.reason.clone(),
            })
            .collect();
        Ok(Explanation {
            request_id: record.request_id,
            occurred_at: record.occurred_at,
            outcome: record.outcome,
            reason_code: record.reason_code,
            model_requested: record.model_requested,
            model_resolved: record.model_resolved,
            model_executed: record.model_executed,
            provider: record.provider,
            strategy: record.strategy,
            selected_model: decision.selected_model,
            score_micros: decision.score_micros,
            selection_method: decision.selection_method,
            selection_reason: decision.reason,
            complexity_level: decision.complexity_level,
            complexity_score: decision.complexity_score,
            alternatives,
            decision_path: decision.steps,
            cost_nanos: record.cost_nanos,
            input_tokens: record.input_tokens,
            output_tokens: record.output_tokens,
            latency_ms: record.latency_ms,
            audit_hash: row.hash,
            commitment: row.commitment,
        })
    }

    async fn get_lineage(&self, request: RequestRef) -> ServiceResult<Lineage> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let request_id = required("request_id", &request.request_id)?;
        let Some(row) = self.store.row_by_request(tenant_id, request_id).await.map_err(store_failure)? else {
            let coverage = self.missing_coverage(tenant_id, request_id).await?;
            return Ok(Lineage { request_id: request_id.to_string(), coverage: coverage.to_string(), ..Lineage::default() });
        };
        let subject_node = self.checked_node(row).await?;
        let record = subject_node.record.clone().unwrap_or_default();
        let trace = record.trace.clone().unwrap_or_default();
        let nodes =
            if trace.trace_id.is_empty() { vec![subject_node.clone()] } else { self.episode_nodes(tenant_id, &trace.trace_id).await? };
        let subject = nodes.iter().position(|node| node.row.request_id == request_id).unwrap_or(0);
        let episode = order_episode(&nodes);
        let mut anomalies = episode.anomalies.clone();
        if trace.trace_id.is_empty() {
            anomalies.push(anomaly("missing_trace", request_id, "the record carries no trace context".to_string()));
        }
        let depth = episode.order.iter().find(|(index, _)| *index == subject).map_or(0, |(_, depth)| *depth);
        let causal_neighbors = episode
            .order
            .iter()
            .filter(|(index, _)| *index != subject)
            .map(|(index, _)| {
                let node = &nodes[*index];
                let neighbour = node.record.clone().unwrap_or_default();
                let neighbour_trace = neighbour.trace.clone().unwrap_or_default();
                CausalNeighbor {
                    request_id: node.row.request_id.clone(),
                    span_id: neighbour_trace.span_id,
                    parent_span_id: neighbour_trace.parent_span_id,
                    relation: relation(&episode, subject, *index).to_string(),
                    edge_label: episode.labels[*index].to_string(),
                    outcome: neighbour.outcome,
                    occurred_at: neighbour.occurred_at,
                    agent_id: neighbour.agent_id,
                }
            })
            .collect();
        let subject_row = &nodes[subject].row;
        let traceparent = if trace.trace_id.is_empty() || trace.span_id.is_empty() {
            String::new()
        } else {
            format!("00-{}-{}-01", trace.trace_id, trace.span_id)
        };
        let coverage = if record.coverage.is_empty() { "captured".to_string() } else { record.coverage.clone() };
        let policy = record.policy.clone().unwrap_or_default();
        Ok(Lineage {
            request_id: request_id.to_string(),
            coverage,
            verified: Some(VerifiedContext {
                outcome: record.outcome.clone(),
                event_hash: subject_row.hash.clone(),
                chain_schema_version: CHAIN_SCHEMA_VERSION,
                provenance_check: nodes[subject].provenance.as_str().to_string(),
                provenance_digest: subject_row.commitment.clone(),
                trace_id: trace.trace_id.clone(),
                edge_provenance: trace.origin.clone(),
                trace_inbound_trusted: trace.inbound_trusted,
            }),
            principal: record.principal.clone(),
            policy_context: Some(PolicyView {
                reason_code: record.reason_code.clone(),
                deny_rule: policy.deny_rule,
                matched_rules: policy.matched_rules,
                verdict_id: policy.verdict_id,
            }),
            grant_context: record.grant.clone(),
            lineage: Some(LineageView {
                binding: Some(LineageBinding {
                    trace_id: trace.trace_id.clone(),
                    span_id: trace.span_id.clone(),
                    parent_span_id: trace.parent_span_id.clone(),
                    sequence: subject_row.sequence,
                    event_hash: subject_row.hash.clone(),
                    prev_hash: subject_row.prev_hash.clone(),
                }),
                edge_label: episode.labels[subject].to_string(),
                episode_size: nodes.len() as u64,
                depth,
            }),
            causal_neighbors,
            anomalies,
            traceparent,
        })
    }

    async fn get_episode(&self, request: EpisodeRequest) -> ServiceResult<Episode> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let trace_id = match (request.trace_id.filter(|trace| !trace.is_empty()), request.request_id.filter(|id| !id.is_empty())) {
            (Some(trace_id), _) => trace_id,
            (None, Some(request_id)) => {
                let node = self.checked_node(self.row(tenant_id, &request_id).await?).await?;
                let trace_id = node.record.and_then(|record| record.trace).map(|trace| trace.trace_id).unwrap_or_default();
                if trace_id.is_empty() {
                    return Err(ServiceError::not_found("lineage_not_found", format!("request `{request_id}` carries no trace context")));
                }
                trace_id
            }
            (None, None) => return Err(ServiceError::invalid("missing_field", "trace_id or request_id is required")),
        };
        let nodes = self.episode_nodes(tenant_id, &trace_id).await?;
        if nodes.is_empty() {
            return Err(ServiceError::not_found("lineage_not_found", format!("no records in trace `{trace_id}`")));
        }
        let episode = order_episode(&nodes);
        let records = episode
            .order
            .iter()
            .map(|(index, depth)| {
                let node = &nodes[*index];
                let record = node.record.clone().unwrap_or_default();
                let trace = record.trace.clone().unwrap_or_default();
                EpisodeRecord {
                    request_id: node.row.request_id.clone(),
                    span_id: trace.span_id,
                    parent_span_id: trace.parent_span_id,
                    depth: *depth,
                    edge_label: episode.labels[*index].to_string(),
                    outcome: record.outcome,
                    reason_code: record.reason_code,
                    occurred_at: node.row.occurred_at.clone(),
                    agent_id: record.agent_id,
                    model_executed: record.model_executed,
                    sequence: node.row.sequence,
                    event_hash: node.row.hash.clone(),
                    provenance_check: node.provenance.as_str().to_string(),
                }
            })
            .collect();
        Ok(Episode { trace_id, records, anomalies: episode.anomalies, chain_schema_version: CHAIN_SCHEMA_VERSION })
    }

    async fn get_artifact(&self, request: ArtifactRequest) -> ServiceResult<SignedArtifact> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let request_id = required("request_id", &request.request_id)?;
        let row = self.row(tenant_id, request_id).await?;
        let node = self.checked_node(row).await?;
        let (record, Provenance::Ok | Provenance::Redacted | Provenance::MissingLineage | Provenance::SampledOut) =
            (node.record.clone(), node.provenance)
        else {
            return Err(ServiceError::conflict(
                "audit_record_unverifiable",
                "the stored audit record does not verify; no artifact is signed",
            ));
        };
        let record = record.unwrap_or_default();
        let row = &node.row;
        let chain = ObjectBuilder::new()
            .integer("sequence", row.sequence)
            .text("hash", &row.hash)
            .text("prevHash", &row.prev_hash)
            .text("commitment", &row.commitment)
            .integer("chainSchemaVersion", row.chain_schema_version)
            .build();
        let summary = ObjectBuilder::new()
            .text("occurredAt", &record.occurred_at)
            .text("endpoint", &record.endpoint)
            .text("outcome", &record.outcome)
            .text("reasonCode", &record.reason_code)
            .text("modelRequested", &record.model_requested)
            .text("modelExecuted", &record.model_executed)
            .text("provider", &record.provider)
            .integer("costNanos", record.cost_nanos)
            .integer("inputTokens", record.input_tokens)
            .integer("outputTokens", record.output_tokens)
            .text("traceId", row.trace_id.as_str())
            .optional_text("keyId", record.key_id.as_ref())
            .optional_text("agentId", record.agent_id.as_ref())
            .text("principalId", record.principal.as_ref().map(|principal| principal.id.as_str()).unwrap_or_default())
            .build();
        let mut artifact = ObjectBuilder::new()
            .text("type", "brainstorm.audit.artifact")
            .integer("artifactVersion", 1)
            .text("requestId", request_id)
            .text("tenantId", tenant_id)
            .value("chain", chain)
            .value("record", summary)
            .text("issuedAt", format_timestamp(self.now()));
        if let Some(accountability) = Self::artifact_accountability(&record, request.registry.as_ref()) {
            artifact = artifact.value("accountability", accountability);
        }
        Ok(self.options.signer.sign(tenant_id, request_id, &artifact.build()))
    }

    async fn get_verification_key(&self, request: TenantRef) -> ServiceResult<VerificationKey> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        Ok(self.options.signer.tenant_key(tenant_id).published(tenant_id))
    }

    async fn get_agent_inventory(&self, request: InventoryRequest) -> ServiceResult<AgentInventory> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let (period, span) = match request.period.as_str() {
            "" | "day" => ("day", Duration::days(1)),
            "week" => ("week", Duration::days(7)),
            "month" => ("month", Duration::days(30)),
            other => return Err(ServiceError::invalid("invalid_period", format!("period `{other}` is not day, week or month"))),
        };
        let (since, until) = self.window(None, None, span)?;
        let records = self.window_records(tenant_id, &since, &until).await?;
        let mut builder = InventoryBuilder::new(request.registry.as_ref());
        for record in &records {
            builder.add(record);
        }
        Ok(builder.finish(InventoryWindow { period: period.to_string(), since, until }))
    }

    async fn list_decisions(&self, request: DecisionsRequest) -> ServiceResult<DecisionList> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let limit = request.limit.unwrap_or(DEFAULT_DECISIONS).clamp(1, MAX_DECISIONS) as usize;
        let (since, _) = self.window(request.since.as_deref(), None, Duration::hours(24))?;
        let mut decisions = Vec::new();
        let mut cursor: Option<(String, i64)> = None;
        'pages: loop {
            let rows = self
                .store
                .rows_newest_first(tenant_id, &since, cursor.as_ref().map(|(at, sequence)| (at.as_str(), *sequence)), PAGE_ROWS)
                .await
                .map_err(store_failure)?;
            let Some(last) = rows.last() else { break };
            cursor = Some((last.occurred_at.clone(), last.sequence));
            let full_page = rows.len() as i64 == PAGE_ROWS;
            for row in rows {
                if let Ok(decoded) = decode_payload(&row.payload)
                    && replay::is_decision(&decoded.record)
                {
                    decisions.push(replay::decision(&decoded.record));
                    if decisions.len() == limit {
                        break 'pages;
                    }
                }
            }
            if !full_page {
                break;
            }
        }
        Ok(DecisionList { count: decisions.len() as u64, decisions })
    }

    async fn simulate_replay(&self, request: SimulateRequest) -> ServiceResult<Simulation> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        if !STRATEGIES.contains(&request.strategy.as_str()) {
            return Err(ServiceError::invalid("invalid_strategy", format!("strategy must be one of {}", STRATEGIES.join(", "))));
        }
        if request.prices.iter().any(|price| price.input_per_million_nanos < 0 || price.output_per_million_nanos < 0) {
            return Err(ServiceError::invalid("invalid_price", "prices cannot be negative"));
        }
        let (since, until) = self.window(request.since.as_deref(), request.until.as_deref(), Duration::days(7))?;
        let records = self.window_records(tenant_id, &since, &until).await?;
        let totals = replay::simulate(&records, &request.strategy, &PriceTable::new(&request.prices));
        Ok(Simulation {
            period: Some(ReplayPeriod { since, until }),
            actual: Some(ActualTotals {
                total_requests: totals.requests,
                total_cost_nanos: totals.actual_cost_nanos,
                avg_latency_ms: totals.actual_avg_latency_ms,
            }),
            simulated: Some(SimulatedTotals {
                strategy: request.strategy.clone(),
                total_requests: totals.requests,
                total_cost_nanos: totals.simulated_cost_nanos,
                avg_latency_ms: totals.simulated_avg_latency_ms,
                cost_savings_vs_actual_nanos: totals.savings_nanos(),
                cost_savings_pct: totals.savings_pct(),
            }),
        })
    }

    async fn compare_strategies(&self, request: CompareRequest) -> ServiceResult<StrategyComparison> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let (since, until) = self.window(request.since.as_deref(), None, Duration::days(7))?;
        let records = self.window_records(tenant_id, &since, &until).await?;
        Ok(StrategyComparison { since, strategies: replay::compare(&records) })
    }

    async fn redact_capture(&self, request: RequestRef) -> ServiceResult<RedactCaptureResponse> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let request_id = required("request_id", &request.request_id)?;
        let redacted = self.store.redact_capture(tenant_id, request_id, &format_timestamp(self.now())).await.map_err(store_failure)?;
        Ok(RedactCaptureResponse { redacted })
    }

    async fn apply_retention(&self, request: RetentionRequest) -> ServiceResult<RetentionResult> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let before = normalised_time(&request.before)?;
        let (pruned, checkpoint) =
            self.store.prune_before(tenant_id, &before, &format_timestamp(self.now())).await.map_err(store_failure)?;
        let checkpoint = match checkpoint {
            Some(checkpoint) => checkpoint.point,
            None => self.anchor(tenant_id).await?,
        };
        if pruned > 0 {
            tracing::info!(tenant_id, pruned, through = checkpoint.sequence, "audit chain pruned by retention");
        }
        Ok(RetentionResult { pruned, checkpoint_sequence: checkpoint.sequence, checkpoint_hash: checkpoint.hash })
    }
}

/// Whether an error means the record itself is bad (ack and log it) rather than the store failing.
pub fn is_rejection(error: &ServiceError) -> bool {
    error.kind == ErrorKind::InvalidArgument
}
