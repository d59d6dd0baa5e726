//! What the edge calls: publish a record on `audit.records` and get its commitment for `X-BR-Audit-Hash`.

use brainstorm_common::bus::{BusError, EventBus};
use brainstorm_proto::audit::{AUDIT_RECORDS_TOPIC, AuditRecord};
use bytes::Bytes;
use prost::Message;

use crate::canonical::commitment;

/// Publishes `record` keyed by its tenant id (one tenant's records stay in order) and returns its
/// commitment, the value of `X-BR-Audit-Hash`. The record is chained later by the consumer; the
/// lineage and verify answers show the same commitment once it is.
pub async fn publish_record(bus: &dyn EventBus, record: &AuditRecord) -> Result<String, BusError> {
    let commitment = commitment(record);
    bus.publish(AUDIT_RECORDS_TOPIC, &record.tenant_id, Bytes::from(record.encode_to_vec())).await?;
    Ok(commitment)
}
