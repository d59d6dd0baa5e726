//! The chain as JSON lines, and its offline verification (`brainstorm audit verify FILE`).
//!
//! Line 1 is the header: `{"anchor_hash":..,"anchor_sequence":..,"chain_schema_version":2,
//! "format":"brainstorm.audit.chain","tenant_id":..,"type":"header"}`. Every further line is one row in
//! sequence order: `{"chain_schema_version":2,"commitment":..,"hash":..,"occurred_at":..,"payload":"<the
//! canonical payload as a JSON string>","prev_hash":..,"recorded_at":..,"request_id":..,"sequence":..,
//! "tenant_id":..,"trace_id":..,"type":"row"}`. Both are canonical JSON (empty members omitted). The
//! payload travels as a string so its exact bytes survive any JSON tooling.

use std::io::BufRead;

use serde_json::Value;

use crate::canonical::ObjectBuilder;
use crate::chain::{BreakReason, CaptureState, ChainPoint, ChainRow, ChainVerifier, DEFAULT_PROVENANCE_CHECKS, Report};

/// The `format` of the header line.
pub const EXPORT_FORMAT: &str = "brainstorm.audit.chain";

/// Why an export could not be read at all (a broken row is a finding in the report instead).
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("cannot read the export: {0}")]
    Io(#[from] std::io::Error),
    #[error("the export has no header line")]
    MissingHeader,
    #[error("the export header is invalid: {0}")]
    InvalidHeader(String),
}

/// The header line of a tenant's export.
pub fn header_line(tenant_id: &str, anchor: &ChainPoint) -> String {
    ObjectBuilder::new()
        .text("type", "header")
        .text("format", EXPORT_FORMAT)
        .integer("chain_schema_version", crate::canonical::CHAIN_SCHEMA_VERSION)
        .text("tenant_id", tenant_id)
        .integer("anchor_sequence", anchor.sequence)
        .text("anchor_hash", &anchor.hash)
        .build()
        .to_text()
}

/// The line of one row.
pub fn row_line(row: &ChainRow) -> String {
    ObjectBuilder::new()
        .text("type", "row")
        .text("tenant_id", &row.tenant_id)
        .integer("sequence", row.sequence)
        .text("request_id", &row.request_id)
        .text("occurred_at", &row.occurred_at)
        .text("trace_id", &row.trace_id)
        .integer("chain_schema_version", row.chain_schema_version)
        .text("payload", &row.payload)
        .text("commitment", &row.commitment)
        .text("prev_hash", &row.prev_hash)
        .text("hash", &row.hash)
        .text("recorded_at", &row.recorded_at)
        .build()
        .to_text()
}

/// Verifies an exported chain offline, listing up to the default number of provenance checks.
pub fn verify_export(reader: impl BufRead) -> Result<Report, ExportError> {
    verify_export_with(reader, DEFAULT_PROVENANCE_CHECKS)
}

/// Verifies an exported chain offline, listing up to `max_provenance_checks` provenance checks.
pub fn verify_export_with(reader: impl BufRead, max_provenance_checks: u32) -> Result<Report, ExportError> {
    let mut lines = reader.lines();
    let header = loop {
        match lines.next() {
            None => return Err(ExportError::MissingHeader),
            Some(line) => {
                let line = line?;
                if !line.trim().is_empty() {
                    break line;
                }
            }
        }
    };
    let (tenant_id, anchor) = parse_header(&header)?;
    let mut verifier = ChainVerifier::new(&tenant_id, anchor, max_provenance_checks);
    for line in lines {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        match parse_row(&line) {
            Some(row) => verifier.push(&row, &CaptureState::Unknown),
            None => {
                let sequence = verifier.expected_sequence();
                verifier.break_at(sequence, "", BreakReason::MalformedRow);
            }
        }
    }
    Ok(verifier.finish(None))
}

fn parse_header(line: &str) -> Result<(String, ChainPoint), ExportError> {
    let value: Value = serde_json::from_str(line).map_err(|error| ExportError::InvalidHeader(error.to_string()))?;
    let text = |key: &str| value.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
    if text("type") != "header" || text("format") != EXPORT_FORMAT {
        return Err(ExportError::InvalidHeader(format!("expected a `{EXPORT_FORMAT}` header line")));
    }
    let tenant_id = text("tenant_id");
    if tenant_id.is_empty() {
        return Err(ExportError::InvalidHeader("no tenant_id".to_string()));
    }
    let sequence = value.get("anchor_sequence").map_or(Some(0), Value::as_i64);
    let hash = text("anchor_hash");
    match sequence {
        Some(sequence) if sequence >= 0 && hash.len() == 64 => Ok((tenant_id, ChainPoint { sequence, hash })),
        _ => Err(ExportError::InvalidHeader("the anchor is invalid".to_string())),
    }
}

fn parse_row(line: &str) -> Option<ChainRow> {
    let value: Value = serde_json::from_str(line).ok()?;
    let text = |key: &str| match value.get(key) {
        None => Some(String::new()),
        Some(Value::String(text)) => Some(text.clone()),
        Some(_) => None,
    };
    if text("type")? != "row" {
        return None;
    }
    Some(ChainRow {
        tenant_id: text("tenant_id")?,
        sequence: value.get("sequence")?.as_i64()?,
        request_id: text("request_id")?,
        occurred_at: text("occurred_at")?,
        trace_id: text("trace_id")?,
        chain_schema_version: value.get("chain_schema_version")?.as_i64()?,
        payload: text("payload")?,
        commitment: text("commitment")?,
        prev_hash: text("prev_hash")?,
        hash: text("hash")?,
        recorded_at: text("recorded_at")?,
    })
}

#[cfg(test)]
mod tests {
    use brainstorm_proto::audit::AuditRecord;

    use super::*;
    use crate::canonical::{CHAIN_SCHEMA_VERSION, canonical_payload, chain_hash, payload_commitment};

    fn export(count: i64) -> Vec<String> {
        let mut previous = ChainPoint::genesis();
        let mut lines = vec![header_line("t", &previous)];
        for sequence in 1..=count {
            let record = AuditRecord {
                request_id: format!("req_{sequence}"),
                tenant_id: "t".to_string(),
                occurred_at: "2026-11-22T10:00:00.000Z".to_string(),
                outcome: "allowed".to_string(),
                reason_code: "quote \" and\nnewline".to_string(),
                ..AuditRecord::default()
            };
            let payload = canonical_payload(&record);
            let hash = chain_hash(&payload, &previous.hash);
            lines.push(row_line(&ChainRow {
                tenant_id: "t".to_string(),
                sequence,
                request_id: record.request_id.clone(),
                occurred_at: record.occurred_at.clone(),
                trace_id: String::new(),
                chain_schema_version: CHAIN_SCHEMA_VERSION,
                commitment: payload_commitment(&payload),
                payload,
                prev_hash: previous.hash.clone(),
                hash: hash.clone(),
                recorded_at: "2026-11-22T10:00:01.000Z".to_string(),
            }));
            previous = ChainPoint { sequence, hash };
        }
        lines
    }

    fn verify(lines: &[String]) -> Result<Report, ExportError> {
        verify_export(lines.join("\n").as_bytes())
    }

    #[test]
    fn an_export_round_trips_and_verifies() -> Result<(), ExportError> {
        let report = verify(&export(3))?;
        assert!(report.valid, "{report:?}");
        assert_eq!((report.checked, report.head.sequence), (3, 3));
        assert_eq!(report.provenance_summary.get("missing_lineage"), Some(&3), "records without trace context");
        Ok(())
    }

    #[test]
    fn edits_and_garbage_in_an_export_are_caught() -> Result<(), ExportError> {
        let mut lines = export(3);
        lines[2] = lines[2].replace("req_2", "req_9");
        let report = verify(&lines)?;
        assert_eq!(report.first_broken.map(|broken| (broken.sequence, broken.reason)), Some((2, "commitment_mismatch".to_string())));

        let mut lines = export(3);
        lines[2] = "{not json".to_string();
        let report = verify(&lines)?;
        assert_eq!(report.first_broken.map(|broken| (broken.sequence, broken.reason)), Some((2, "malformed_row".to_string())));

        let mut lines = export(3);
        lines.remove(1);
        let report = verify(&lines)?;
        assert_eq!(report.first_broken.map(|broken| (broken.sequence, broken.reason)), Some((2, "sequence_gap".to_string())));
        Ok(())
    }

    #[test]
    fn an_export_without_a_header_is_refused() {
        let lines = export(2);
        assert!(matches!(verify(&lines[1..]), Err(ExportError::InvalidHeader(_))));
        assert!(matches!(verify_export(&b"\n\n"[..]), Err(ExportError::MissingHeader)));
    }
}
