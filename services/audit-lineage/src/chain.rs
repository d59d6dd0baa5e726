//! Chain verification, shared by the live check over the database and the offline check of an export.
//!
//! A tenant's chain starts at an anchor (sequence 0 and `GENESIS_HASH`, or the retention checkpoint)
//! and each row must continue it: the next sequence, the previous row's hash as `prev_hash`, and a
//! payload whose commitment and chain hash recompute. The first row that does not is the first broken
//! link; the report names it and the reason. Per-row provenance checks ride along and never change
//! the chain's verdict.

use std::collections::BTreeMap;

use brainstorm_common::time::normalise_timestamp;
use brainstorm_proto::audit::{BrokenLink, Capture, ChainReport, ProvenanceCheck, ProvenanceSummary};
use serde::{Deserialize, Serialize};

use crate::canonical::{CHAIN_SCHEMA_VERSION, DecodedPayload, GENESIS_HASH, capture_digest, commitment_and_chain_hash, decode_payload};

/// Provenance checks listed by default (every row is still verified).
pub const DEFAULT_PROVENANCE_CHECKS: u32 = 1000;
/// The most provenance checks one report lists.
pub const MAX_PROVENANCE_CHECKS: u32 = 10_000;

/// Why a link is broken; the text is the report's `reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakReason {
    SequenceGap,
    SequenceOutOfOrder,
    UnsupportedSchemaVersion,
    PrevHashMismatch,
    CommitmentMismatch,
    HashMismatch,
    MalformedRow,
    ColumnMismatch,
    HeadMismatch,
}

impl BreakReason {
    pub fn as_str(self) -> &'static str {
        match self {
            BreakReason::SequenceGap => "sequence_gap",
            BreakReason::SequenceOutOfOrder => "sequence_out_of_order",
            BreakReason::UnsupportedSchemaVersion => "unsupported_schema_version",
            BreakReason::PrevHashMismatch => "prev_hash_mismatch",
            BreakReason::CommitmentMismatch => "commitment_mismatch",
            BreakReason::HashMismatch => "hash_mismatch",
            BreakReason::MalformedRow => "malformed_row",
            BreakReason::ColumnMismatch => "column_mismatch",
            BreakReason::HeadMismatch => "head_mismatch",
        }
    }
}

/// One row of a chain, as stored and as exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainRow {
    pub tenant_id: String,
    pub sequence: i64,
    pub request_id: String,
    pub occurred_at: String,
    /// Copied from the payload for lookups (empty when the record has no trace).
    pub trace_id: String,
    pub chain_schema_version: i64,
    pub payload: String,
    pub commitment: String,
    pub prev_hash: String,
    pub hash: String,
    pub recorded_at: String,
}

/// A position in a chain: a sequence number and the hash of the row there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainPoint {
    pub sequence: i64,
    pub hash: String,
}

impl ChainPoint {
    /// Before the first row.
    pub fn genesis() -> Self {
        ChainPoint { sequence: 0, hash: GENESIS_HASH.to_string() }
    }
}

/// What is known of a row's captured text when its provenance is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaptureState {
    /// Not known here (an offline export carries no captured text).
    Unknown,
    /// The stored text.
    Stored(Capture),
    /// The text was removed on purpose; its digest stays chained.
    Redacted,
    /// The payload names a capture digest but nothing is stored.
    Missing,
}

/// A row's provenance check value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provenance {
    Ok,
    Redacted,
    MissingLineage,
    ExpiredByRetention,
    SampledOut,
    Failed,
}

impl Provenance {
    pub fn as_str(self) -> &'static str {
        match self {
            Provenance::Ok => "ok",
            Provenance::Redacted => "redacted",
            Provenance::MissingLineage => "missing_lineage",
            Provenance::ExpiredByRetention => "expired_by_retention",
            Provenance::SampledOut => "sampled_out",
            Provenance::Failed => "failed",
        }
    }
}

/// A row checked on its own (not against its neighbours): its payload decodes canonically, its
/// commitment and hash recompute, and its lookup columns agree with the payload.
pub fn row_integrity(row: &ChainRow) -> Result<DecodedPayload, BreakReason> {
    if row.chain_schema_version != CHAIN_SCHEMA_VERSION {
        return Err(BreakReason::UnsupportedSchemaVersion);
    }
    let (commitment, hash) = commitment_and_chain_hash(&row.payload, &row.prev_hash);
    if commitment != row.commitment {
        return Err(BreakReason::CommitmentMismatch);
    }
    if hash != row.hash {
        return Err(BreakReason::HashMismatch);
    }
    let decoded = decode_payload(&row.payload).map_err(|_| BreakReason::MalformedRow)?;
    let trace_id = decoded.record.trace.as_ref().map(|trace| trace.trace_id.as_str()).unwrap_or_default();
    // The column holds the payload's instant normalised the way every timestamp is stored.
    let occurred_at = normalise_timestamp(&decoded.record.occurred_at).unwrap_or_default();
    let columns_agree = decoded.record.request_id == row.request_id
        && decoded.record.tenant_id == row.tenant_id
        && occurred_at == row.occurred_at
        && trace_id == row.trace_id
        && decoded.chain_schema_version == row.chain_schema_version;
    if !columns_agree {
        return Err(BreakReason::ColumnMismatch);
    }
    Ok(decoded)
}

/// Why the link from `previous` to `row` is broken, if it is.
pub fn link_fault(previous: &ChainPoint, row: &ChainRow) -> Option<BreakReason> {
    let expected = previous.sequence + 1;
    if row.sequence > expected {
        return Some(BreakReason::SequenceGap);
    }
    if row.sequence < expected {
        return Some(BreakReason::SequenceOutOfOrder);
    }
    if row.prev_hash != previous.hash {
        return Some(BreakReason::PrevHashMismatch);
    }
    row_integrity(row).err()
}

/// The provenance check of one row, with a detail for anything but `ok`.
pub fn provenance_of(integrity: &Result<DecodedPayload, BreakReason>, capture: &CaptureState) -> (Provenance, String) {
    let decoded = match integrity {
        Ok(decoded) => decoded,
        Err(reason) => return (Provenance::Failed, reason.as_str().to_string()),
    };
    if decoded.record.coverage == "sampled_out" {
        return (Provenance::SampledOut, "the edge sampled this request out of detailed capture".to_string());
    }
    if let Some(digest) = &decoded.capture_digest {
        match capture {
            CaptureState::Stored(stored) if capture_digest(stored) != *digest => {
                return (Provenance::Failed, "stored capture does not match its chained digest".to_string());
            }
            CaptureState::Redacted => return (Provenance::Redacted, "captured text was redacted; its digest stays chained".to_string()),
            CaptureState::Missing => return (Provenance::Failed, "captured text is missing without a redaction".to_string()),
            CaptureState::Stored(_) | CaptureState::Unknown => {}
        }
    }
    let has_trace = decoded.record.trace.as_ref().is_some_and(|trace| !trace.trace_id.is_empty());
    if !has_trace {
        return (Provenance::MissingLineage, "the record carries no trace context".to_string());
    }
    (Provenance::Ok, String::new())
}

/// The first broken link of a chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokenLinkView {
    pub sequence: i64,
    pub request_id: String,
    pub reason: String,
}

/// One row's provenance check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProvenanceEntry {
    pub sequence: i64,
    pub request_id: String,
    pub check: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// A verification report: the JSON shape of `GET /v1/governance/audit/chain/verify` and of
/// `brainstorm audit verify FILE`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub tenant_id: String,
    pub valid: bool,
    pub checked: u64,
    pub first_broken: Option<BrokenLinkView>,
    pub chain_schema_version: i64,
    pub anchor: ChainPoint,
    pub head: ChainPoint,
    #[serde(rename = "provenanceChecks")]
    pub provenance_checks: Vec<ProvenanceEntry>,
    #[serde(rename = "provenanceChecksTruncated")]
    pub provenance_checks_truncated: bool,
    /// Rows per provenance check value.
    #[serde(rename = "provenanceSummary")]
    pub provenance_summary: BTreeMap<String, u64>,
}

impl Report {
    /// The report as the service returns it.
    pub fn to_proto(&self) -> ChainReport {
        let count = |check: Provenance| self.provenance_summary.get(check.as_str()).copied().unwrap_or(0);
        ChainReport {
            tenant_id: self.tenant_id.clone(),
            valid: self.valid,
            checked: self.checked,
            first_broken: self.first_broken.as_ref().map(|broken| BrokenLink {
                sequence: broken.sequence,
                request_id: broken.request_id.clone(),
                reason: broken.reason.clone(),
            }),
            chain_schema_version: self.chain_schema_version,
            anchor_sequence: self.anchor.sequence,
            anchor_hash: self.anchor.hash.clone(),
            head_sequence: self.head.sequence,
            head_hash: self.head.hash.clone(),
            provenance_checks: self
                .provenance_checks
                .iter()
                .map(|entry| ProvenanceCheck {
                    sequence: entry.sequence,
                    request_id: entry.request_id.clone(),
                    check: entry.check.clone(),
                    detail: entry.detail.clone(),
                })
                .collect(),
            provenance_checks_truncated: self.provenance_checks_truncated,
            provenance_summary: Some(ProvenanceSummary {
                ok: count(Provenance::Ok),
                redacted: count(Provenance::Redacted),
                missing_lineage: count(Provenance::MissingLineage),
                expired_by_retention: count(Provenance::ExpiredByRetention),
                sampled_out: count(Provenance::SampledOut),
                failed: count(Provenance::Failed),
            }),
        }
    }

    /// The report from the service's answer (for rendering it as JSON with `serde`).
    pub fn from_proto(report: &ChainReport) -> Self {
        let summary = report.provenance_summary.unwrap_or_default();
        let provenance_summary = [
            (Provenance::Ok, summary.ok),
            (Provenance::Redacted, summary.redacted),
            (Provenance::MissingLineage, summary.missing_lineage),
            (Provenance::ExpiredByRetention, summary.expired_by_retention),
            (Provenance::SampledOut, summary.sampled_out),
            (Provenance::Failed, summary.failed),
        ]
        .into_iter()
        .filter(|(_, count)| *count > 0)
        .map(|(check, count)| (check.as_str().to_string(), count))
        .collect();
        Report {
            tenant_id: report.tenant_id.clone(),
            valid: report.valid,
            checked: report.checked,
            first_broken: report.first_broken.as_ref().map(|broken| BrokenLinkView {
                sequence: broken.sequence,
                request_id: broken.request_id.clone(),
                reason: broken.reason.clone(),
            }),
            chain_schema_version: report.chain_schema_version,
            anchor: ChainPoint { sequence: report.anchor_sequence, hash: report.anchor_hash.clone() },
            head: ChainPoint { sequence: report.head_sequence, hash: report.head_hash.clone() },
            provenance_checks: report
                .provenance_checks
                .iter()
                .map(|check| ProvenanceEntry {
                    sequence: check.sequence,
                    request_id: check.request_id.clone(),
                    check: check.check.clone(),
                    detail: check.detail.clone(),
                })
                .collect(),
            provenance_checks_truncated: report.provenance_checks_truncated,
            provenance_summary,
        }
    }
}

/// Walks a chain row by row, in sequence order.
#[derive(Debug)]
pub struct ChainVerifier {
    tenant_id: String,
    anchor: ChainPoint,
    /// The last row that continued the chain.
    last_valid: ChainPoint,
    /// The last row seen, valid or not.
    last_seen: ChainPoint,
    checked: u64,
    first_broken: Option<BrokenLinkView>,
    max_provenance_checks: usize,
    provenance_checks: Vec<ProvenanceEntry>,
    truncated: bool,
    summary: BTreeMap<String, u64>,
}

impl ChainVerifier {
    /// Starts at `anchor`, listing at most `max_provenance_checks` provenance checks.
    pub fn new(tenant_id: &str, anchor: ChainPoint, max_provenance_checks: u32) -> Self {
        ChainVerifier {
            tenant_id: tenant_id.to_string(),
            last_valid: anchor.clone(),
            last_seen: anchor.clone(),
            anchor,
            checked: 0,
            first_broken: None,
            max_provenance_checks: usize::try_from(max_provenance_checks.min(MAX_PROVENANCE_CHECKS)).unwrap_or(usize::MAX),
            provenance_checks: Vec::new(),
            truncated: false,
            summary: BTreeMap::new(),
        }
    }

    /// Checks the next row (rows must come in stored sequence order).
    pub fn push(&mut self, row: &ChainRow, capture: &CaptureState) {
        let tenant_fault = (row.tenant_id != self.tenant_id).then_some(BreakReason::ColumnMismatch);
        if self.first_broken.is_none() {
            self.checked += 1;
            match tenant_fault.or_else(|| link_fault(&self.last_valid, row)) {
                Some(reason) => {
                    self.first_broken = Some(BrokenLinkView {
                        sequence: row.sequence,
                        request_id: row.request_id.clone(),
                        reason: reason.as_str().to_string(),
                    })
                }
                None => self.last_valid = ChainPoint { sequence: row.sequence, hash: row.hash.clone() },
            }
        }
        self.last_seen = ChainPoint { sequence: row.sequence, hash: row.hash.clone() };
        let integrity = match tenant_fault {
            Some(reason) => Err(reason),
            None => row_integrity(row),
        };
        let (check, detail) = provenance_of(&integrity, capture);
        self.record_provenance(row.sequence, &row.request_id, check, detail);
    }

    /// Records a break found outside the rows (a malformed export line).
    pub fn break_at(&mut self, sequence: i64, request_id: &str, reason: BreakReason) {
        if self.first_broken.is_none() {
            self.checked += 1;
            self.first_broken = Some(BrokenLinkView { sequence, request_id: request_id.to_string(), reason: reason.as_str().to_string() });
        }
    }

    /// The sequence the next row should carry.
    pub fn expected_sequence(&self) -> i64 {
        self.last_seen.sequence + 1
    }

    fn record_provenance(&mut self, sequence: i64, request_id: &str, check: Provenance, detail: String) {
        *self.summary.entry(check.as_str().to_string()).or_insert(0) += 1;
        if self.provenance_checks.len() < self.max_provenance_checks {
            self.provenance_checks.push(ProvenanceEntry {
                sequence,
                request_id: request_id.to_string(),
                check: check.as_str().to_string(),
                detail,
            });
        } else {
            self.truncated = true;
        }
    }

    /// The report; `head` is the stored head of the chain, when one is kept, which the last row must match.
    pub fn finish(mut self, head: Option<&ChainPoint>) -> Report {
        if let (None, Some(head)) = (&self.first_broken, head)
            && *head != self.last_valid
        {
            self.checked += 1;
            self.first_broken = Some(BrokenLinkView {
                sequence: self.last_valid.sequence.min(head.sequence) + 1,
                request_id: String::new(),
                reason: BreakReason::HeadMismatch.as_str().to_string(),
            });
        }
        Report {
            tenant_id: self.tenant_id,
            valid: self.first_broken.is_none(),
            checked: self.checked,
            first_broken: self.first_broken,
            chain_schema_version: CHAIN_SCHEMA_VERSION,
            anchor: self.anchor,
            head: self.last_seen,
            provenance_checks: self.provenance_checks,
            provenance_checks_truncated: self.truncated,
            provenance_summary: self.summary,
        }
    }
}

#[cfg(test)]
mod tests {
    use brainstorm_proto::audit::{AuditRecord, TraceContext};

    use super::*;
    use crate::canonical::{canonical_payload, chain_hash, payload_commitment};

    fn rows(count: i64) -> Vec<ChainRow> {
        let mut previous = ChainPoint::genesis();
        (1..=count)
            .map(|sequence| {
                let record = AuditRecord {
                    request_id: format!("req_{sequence}"),
                    tenant_id: "t".to_string(),
                    occurred_at: "2026-11-22T10:00:00.000Z".to_string(),
                    outcome: "allowed".to_string(),
                    trace: Some(TraceContext { trace_id: "ab".repeat(16), span_id: "cd".repeat(8), ..TraceContext::default() }),
                    ..AuditRecord::default()
                };
                let payload = canonical_payload(&record);
                let hash = chain_hash(&payload, &previous.hash);
                let row = ChainRow {
                    tenant_id: "t".to_string(),
                    sequence,
                    request_id: record.request_id.clone(),
                    occurred_at: record.occurred_at.clone(),
                    trace_id: "ab".repeat(16),
                    chain_schema_version: CHAIN_SCHEMA_VERSION,
                    commitment: payload_commitment(&payload),
                    payload,
                    prev_hash: previous.hash.clone(),
                    hash: hash.clone(),
                    recorded_at: String::new(),
                };
                previous = ChainPoint { sequence, hash };
                row
            })
            .collect()
    }

    fn verify(rows: &[ChainRow]) -> Report {
        let mut verifier = ChainVerifier::new("t", ChainPoint::genesis(), DEFAULT_PROVENANCE_CHECKS);
        for row in rows {
            verifier.push(row, &CaptureState::Unknown);
        }
        verifier.finish(None)
    }

    fn broken(report: &Report) -> Option<(i64, &str)> {
        report.first_broken.as_ref().map(|broken| (broken.sequence, broken.reason.as_str()))
    }

    #[test]
    fn an_intact_chain_verifies() {
        let report = verify(&rows(5));
        assert!(report.valid);
        assert_eq!(report.checked, 5);
        assert_eq!(report.head.sequence, 5);
        assert_eq!(report.provenance_summary.get("ok"), Some(&5));
    }

    #[test]
    fn each_kind_of_tampering_names_its_row() {
        let mut edited = rows(4);
        edited[2].payload = edited[2].payload.replace("req_3", "req_x");
        assert_eq!(broken(&verify(&edited)), Some((3, "commitment_mismatch")));

        let mut deleted = rows(4);
        deleted.remove(1);
        assert_eq!(broken(&verify(&deleted)), Some((3, "sequence_gap")));

        let mut swapped = rows(4);
        swapped.swap(1, 2);
        (swapped[1].sequence, swapped[2].sequence) = (2, 3);
        assert_eq!(broken(&verify(&swapped)), Some((2, "prev_hash_mismatch")));

        let mut column = rows(3);
        column[0].occurred_at = "2020-01-01T00:00:00.000Z".to_string();
        assert_eq!(broken(&verify(&column)), Some((1, "column_mismatch")));

        let mut rehashed = rows(3);
        rehashed[1].hash = "f".repeat(64);
        assert_eq!(broken(&verify(&rehashed)), Some((2, "hash_mismatch")));
    }

    #[test]
    fn a_missing_tail_is_caught_by_the_stored_head() {
        let chain = rows(3);
        let head = ChainPoint { sequence: 3, hash: chain[2].hash.clone() };
        let mut verifier = ChainVerifier::new("t", ChainPoint::genesis(), DEFAULT_PROVENANCE_CHECKS);
        for row in &chain[..2] {
            verifier.push(row, &CaptureState::Unknown);
        }
        let report = verifier.finish(Some(&head));
        assert_eq!(broken(&report), Some((3, "head_mismatch")));
    }

    #[test]
    fn provenance_checks_never_flip_the_verdict_and_are_capped() {
        let chain = rows(3);
        let mut verifier = ChainVerifier::new("t", ChainPoint::genesis(), 2);
        for row in &chain {
            verifier.push(row, &CaptureState::Redacted);
        }
        let report = verifier.finish(None);
        assert!(report.valid);
        assert_eq!(report.provenance_checks.len(), 2);
        assert!(report.provenance_checks_truncated);
        assert_eq!(Report::from_proto(&report.to_proto()), report);
    }
}
