//! One audit-lineage suite (store, chain, tampering, export, consumer, lineage, artifacts, inventory,
//! replays), run against SQLite and PostgreSQL alike.

use std::sync::{Arc, Mutex};

use brainstorm_audit_lineage::artifact::TenantKey;
use brainstorm_audit_lineage::{
    ArtifactSigner, AuditConsumer, AuditLineageOptions, AuditLineageServiceImpl, Handled, Report, commitment, price_table, publish_record,
    verify_artifact, verify_export,
};
use brainstorm_common::bus::{EventBus, InProcessBus};
use brainstorm_common::store::Database;
use brainstorm_common::time::{format_timestamp, parse_timestamp};
use brainstorm_proto::ErrorKind;
use brainstorm_proto::audit::*;
use brainstorm_providers::catalog::ModelCatalog;
use bytes::Bytes;
use chrono::{DateTime, Duration, Utc};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

struct Harness {
    service: AuditLineageServiceImpl,
    database: Database,
    clock: Arc<Mutex<DateTime<Utc>>>,
    signer: ArtifactSigner,
}

impl Harness {
    fn new(database: Database) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        let start = parse_timestamp("2026-11-20T12:00:00Z").ok_or("bad literal")?;
        let clock = Arc::new(Mutex::new(start));
        let reader = clock.clone();
        let signer = ArtifactSigner::new(b"test secret: thirty-two bytes at least")?;
        let options = AuditLineageOptions {
            signer: signer.clone(),
            clock: Arc::new(move || *reader.lock().unwrap_or_else(std::sync::PoisonError::into_inner)),
        };
        Ok(Harness { service: AuditLineageServiceImpl::new(database.clone(), options), database, clock, signer })
    }

    fn now(&self) -> DateTime<Utc> {
        *self.clock.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn chain(&self, record: &AuditRecord) -> Result<RecordAuditResponse, brainstorm_proto::ServiceError> {
        self.service.record_audit(record.clone()).await
    }

    async fn verify(&self, tenant_id: &str) -> Result<ChainReport, brainstorm_proto::ServiceError> {
        self.service.verify_chain(VerifyChainRequest { tenant_id: tenant_id.to_string(), max_provenance_checks: None }).await
    }

    async fn execute(&self, sql: &str, binds: &[&str]) -> TestResult {
        let mut query = sqlx::query(sql);
        for bind in binds {
            query = query.bind(*bind);
        }
        query.execute(self.database.pool()).await?;
        Ok(())
    }
}

fn request_id_at(instant: DateTime<Utc>) -> String {
    let seconds = u64::try_from(instant.timestamp()).unwrap_or_default();
    let timestamp = uuid::Timestamp::from_unix(uuid::NoContext, seconds, instant.timestamp_subsec_nanos());
    format!("req_{}", uuid::Uuid::new_v7(timestamp))
}

fn record(tenant_id: &str, occurred_at: DateTime<Utc>) -> AuditRecord {
    AuditRecord {
        request_id: request_id_at(occurred_at - Duration::milliseconds(5)),
        tenant_id: tenant_id.to_string(),
        occurred_at: format_timestamp(occurred_at),
        endpoint: "/v1/chat/completions".to_string(),
        key_id: Some("key-1".to_string()),
        principal: Some(Principal { id: "key-1".to_string(), auth_method: "api_key".to_string(), ..Principal::default() }),
        model_requested: "auto".to_string(),
        model_resolved: "openai/gpt-4o-mini".to_string(),
        model_executed: "openai/gpt-4o-mini".to_string(),
        provider: "openai".to_string(),
        strategy: "price".to_string(),
        input_tokens: 1000,
        output_tokens: 500,
        cost_nanos: 450_000,
        outcome: "allowed".to_string(),
        latency_ms: 120,
        trace: Some(TraceContext {
            trace_id: format!("{:032x}", rand_u128()),
            span_id: format!("{:016x}", rand_u128() as u64),
            origin: "generated".to_string(),
            ..TraceContext::default()
        }),
        ..AuditRecord::default()
    }
}

fn rand_u128() -> u128 {
    uuid::Uuid::new_v4().as_u128()
}

fn new_tenant() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn broken(report: &ChainReport) -> Option<(i64, String)> {
    report.first_broken.as_ref().map(|broken| (broken.sequence, broken.reason.clone()))
}

use brainstorm_common::on_both_engines;

on_both_engines!(
    records_are_chained_once_per_request_and_per_tenant,
    editing_a_field_in_the_database_is_caught,
    deleting_a_row_in_the_database_is_caught,
    reordering_rows_in_the_database_is_caught,
    editing_a_lookup_column_is_caught,
    an_export_verifies_offline_and_tampering_in_it_is_caught,
    retention_prunes_behind_a_checkpoint_and_the_rest_still_verifies,
    the_consumer_chains_each_record_once_and_acks_after_commit,
    a_batch_chains_each_tenant_in_order_once_in_one_transaction,
    captured_text_is_chained_by_digest_and_redaction_keeps_the_chain,
    two_racing_writers_never_fork_a_chain,
    lineage_orders_a_trace_by_span_parentage,
    lineage_coverage_of_requests_without_a_row,
    explain_shows_the_decision_path_and_priced_alternatives,
    artifacts_are_signed_and_accountability_is_omitted_without_an_owner,
    the_agents_inventory_covers_its_window,
    replays_list_simulate_and_compare_recorded_decisions,
    invalid_requests_are_refused,
);

async fn records_are_chained_once_per_request_and_per_tenant(database: Database) -> TestResult {
    let harness = Harness::new(database)?;
    let (alpha, beta) = (new_tenant(), new_tenant());
    let mut alpha_records = Vec::new();
    for index in 0..4 {
        let record = record(&alpha, harness.now() - Duration::minutes(10 - index));
        let response = harness.chain(&record).await?;
        assert!(response.recorded);
        assert_eq!(response.sequence, index + 1);
        assert_eq!(response.commitment, commitment(&record), "the row stores the commitment the edge computed");
        alpha_records.push((record, response));
        harness.chain(&record_for_beta(&beta, &harness)).await?;
    }
    let (first, first_response) = &alpha_records[0];
    let again = harness.chain(first).await?;
    assert!(!again.recorded, "a request id is chained once");
    assert_eq!((again.sequence, &again.hash), (first_response.sequence, &first_response.hash));

    for (tenant, rows) in [(&alpha, 4), (&beta, 4)] {
        let report = harness.verify(tenant).await?;
        assert!(report.valid, "{report:?}");
        assert_eq!((report.checked, report.head_sequence), (rows, rows as i64));
        assert_eq!(report.provenance_checks.len(), rows as usize);
        assert_eq!(report.provenance_summary.as_ref().map(|summary| summary.ok), Some(rows));
        assert_eq!(report.chain_schema_version, 2);
    }
    let empty = harness.verify(&new_tenant()).await?;
    assert!(empty.valid && empty.checked == 0);
    Ok(())
}

fn record_for_beta(tenant: &str, harness: &Harness) -> AuditRecord {
    let mut record = record(tenant, harness.now() - Duration::minutes(3));
    record.outcome = "denied".to_string();
    record.reason_code = "budget_exceeded".to_string();
    record.model_executed = String::new();
    record.cost_nanos = 0;
    record
}

async fn chain_of(harness: &Harness, tenant: &str, count: i64) -> Result<Vec<AuditRecord>, brainstorm_proto::ServiceError> {
    let mut records = Vec::new();
    for index in 0..count {
        let record = record(tenant, harness.now() - Duration::minutes(60 - index));
        harness.chain(&record).await?;
        records.push(record);
    }
    Ok(records)
}

async fn editing_a_field_in_the_database_is_caught(database: Database) -> TestResult {
    let harness = Harness::new(database)?;
    let tenant = new_tenant();
    chain_of(&harness, &tenant, 5).await?;
    assert!(harness.verify(&tenant).await?.valid);
    // Someone lowers the recorded cost of request 3.
    harness
        .execute(
            "UPDATE audit_chain SET payload = REPLACE(payload, '\"cost_nanos\":450000', '\"cost_nanos\":1') WHERE tenant_id = $1 AND sequence = 3",
            &[&tenant],
        )
        .await?;
    let report = harness.verify(&tenant).await?;
    assert!(!report.valid);
    assert_eq!(broken(&report), Some((3, "commitment_mismatch".to_string())));
    assert_eq!(report.checked, 3);
    // Recomputing that row's commitment and hash too only moves the break to the next link.
    let (payload,): (String,) = sqlx::query_as("SELECT payload FROM audit_chain WHERE tenant_id = $1 AND sequence = 3")
        .bind(&tenant)
        .fetch_one(harness.database.pool())
        .await?;
    let (prev_hash,): (String,) = sqlx::query_as("SELECT prev_hash FROM audit_chain WHERE tenant_id = $1 AND sequence = 3")
        .bind(&tenant)
        .fetch_one(harness.database.pool())
        .await?;
    let commitment = brainstorm_audit_lineage::canonical::payload_commitment(&payload);
    let hash = brainstorm_audit_lineage::chain_hash(&payload, &prev_hash);
    harness
        .execute("UPDATE audit_chain SET commitment = $1, hash = $2 WHERE tenant_id = $3 AND sequence = 3", &[&commitment, &hash, &tenant])
        .await?;
    let report = harness.verify(&tenant).await?;
    assert_eq!(broken(&report), Some((4, "prev_hash_mismatch".to_string())));
    let request_4 = report.first_broken.map(|broken| broken.request_id).unwrap_or_default();
    assert!(request_4.starts_with("req_"));
    Ok(())
}

async fn deleting_a_row_in_the_database_is_caught(database: Database) -> TestResult {
    let harness = Harness::new(database)?;
    let tenant = new_tenant();
    chain_of(&harness, &tenant, 5).await?;
    harness.execute("DELETE FROM audit_chain WHERE tenant_id = $1 AND sequence = 2", &[&tenant]).await?;
    let report = harness.verify(&tenant).await?;
    assert_eq!(broken(&report), Some((3, "sequence_gap".to_string())));

    let tail = new_tenant();
    chain_of(&harness, &tail, 3).await?;
    harness.execute("DELETE FROM audit_chain WHERE tenant_id = $1 AND sequence = 3", &[&tail]).await?;
    let report = harness.verify(&tail).await?;
    assert_eq!(broken(&report), Some((3, "head_mismatch".to_string())), "a missing last row no longer matches the head");

    let first = new_tenant();
    chain_of(&harness, &first, 3).await?;
    harness.execute("DELETE FROM audit_chain WHERE tenant_id = $1 AND sequence = 1", &[&first]).await?;
    assert_eq!(broken(&harness.verify(&first).await?), Some((2, "sequence_gap".to_string())));
    Ok(())
}

async fn reordering_rows_in_the_database_is_caught(database: Database) -> TestResult {
    let harness = Harness::new(database)?;
    let tenant = new_tenant();
    chain_of(&harness, &tenant, 5).await?;
    // Swap rows 2 and 3 (through a free sequence number, the key being unique).
    for sql in [
        "UPDATE audit_chain SET sequence = -1 WHERE tenant_id = $1 AND sequence = 2",
        "UPDATE audit_chain SET sequence = 2 WHERE tenant_id = $1 AND sequence = 3",
        "UPDATE audit_chain SET sequence = 3 WHERE tenant_id = $1 AND sequence = -1",
    ] {
        harness.execute(sql, &[&tenant]).await?;
    }
    let report = harness.verify(&tenant).await?;
    assert_eq!(broken(&report), Some((2, "prev_hash_mismatch".to_string())));

    // Swapping the contents instead of the numbers is caught the same way.
    let other = new_tenant();
    chain_of(&harness, &other, 4).await?;
    harness.execute("UPDATE audit_chain SET sequence = sequence + 100 WHERE tenant_id = $1 AND sequence IN (3, 4)", &[&other]).await?;
    harness.execute("UPDATE audit_chain SET sequence = 3 WHERE tenant_id = $1 AND sequence = 104", &[&other]).await?;
    harness.execute("UPDATE audit_chain SET sequence = 4 WHERE tenant_id = $1 AND sequence = 103", &[&other]).await?;
    assert_eq!(broken(&harness.verify(&other).await?), Some((3, "prev_hash_mismatch".to_string())));
    Ok(())
}

async fn editing_a_lookup_column_is_caught(database: Database) -> TestResult {
    let harness = Harness::new(database)?;
    let tenant = new_tenant();
    chain_of(&harness, &tenant, 3).await?;
    harness
        .execute("UPDATE audit_chain SET occurred_at = $1 WHERE tenant_id = $2 AND sequence = 2", &["2020-01-01T00:00:00.000Z", &tenant])
        .await?;
    assert_eq!(broken(&harness.verify(&tenant).await?), Some((2, "column_mismatch".to_string())));
    let other = new_tenant();
    chain_of(&harness, &other, 2).await?;
    harness.execute("UPDATE audit_chain SET trace_id = $1 WHERE tenant_id = $2 AND sequence = 1", &["f00d", &other]).await?;
    assert_eq!(broken(&harness.verify(&other).await?), Some((1, "column_mismatch".to_string())));
    Ok(())
}

async fn export_all(harness: &Harness, tenant: &str, page: u32) -> Result<String, brainstorm_proto::ServiceError> {
    let mut lines = Vec::new();
    let mut after = None;
    loop {
        let exported = harness
            .service
            .export_chain(ExportChainRequest { tenant_id: tenant.to_string(), after_sequence: after, limit: Some(page) })
            .await?;
        lines.extend(exported.lines);
        match exported.next_after_sequence {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    Ok(lines.join("\n"))
}

async fn an_export_verifies_offline_and_tampering_in_it_is_caught(database: Database) -> TestResult {
    let harness = Harness::new(database)?;
    let tenant = new_tenant();
    let mut records = chain_of(&harness, &tenant, 4).await?;
    records[0].reason_code = "with \"quotes\", a\nnewline and ünïcode".to_string();
    records[0].request_id = request_id_at(harness.now());
    harness.chain(&records[0]).await?;

    let exported = export_all(&harness, &tenant, 2).await?;
    assert_eq!(exported.lines().count(), 6, "a header and five rows");
    let offline = verify_export(exported.as_bytes())?;
    let online = Report::from_proto(&harness.verify(&tenant).await?);
    assert!(offline.valid, "{offline:?}");
    assert_eq!((offline.checked, &offline.head), (online.checked, &online.head), "offline and online agree");

    let tampered = exported.replacen("\\\"cost_nanos\\\":450000", "\\\"cost_nanos\\\":450001", 1);
    assert_ne!(tampered, exported);
    let report = verify_export(tampered.as_bytes())?;
    assert_eq!(report.first_broken.map(|broken| (broken.sequence, broken.reason)), Some((1, "commitment_mismatch".to_string())));

    let mut lines: Vec<&str> = exported.lines().collect();
    lines.swap(2, 3);
    let report = verify_export(lines.join("\n").as_bytes())?;
    assert_eq!(report.first_broken.map(|broken| (broken.sequence, broken.reason)), Some((3, "sequence_gap".to_string())));
    Ok(())
}

async fn retention_prunes_behind_a_checkpoint_and_the_rest_still_verifies(database: Database) -> TestResult {
    let harness = Harness::new(database)?;
    let tenant = new_tenant();
    let records = chain_of(&harness, &tenant, 6).await?;
    // Records occurred 60, 59, ... 55 minutes ago; prune those older than 57.5 minutes.
    let before = format_timestamp(harness.now() - Duration::seconds(57 * 60 + 30));
    let result = harness.service.apply_retention(RetentionRequest { tenant_id: tenant.clone(), before }).await?;
    assert_eq!((result.pruned, result.checkpoint_sequence), (3, 3));
    let report = harness.verify(&tenant).await?;
    assert!(report.valid, "{report:?}");
    assert_eq!((report.checked, report.anchor_sequence, report.head_sequence), (3, 3, 6));
    assert_eq!(report.anchor_hash, result.checkpoint_hash);
    let offline = verify_export(export_all(&harness, &tenant, 100).await?.as_bytes())?;
    assert!(offline.valid && offline.anchor.sequence == 3);

    let lineage = harness.service.get_lineage(RequestRef { tenant_id: tenant.clone(), request_id: records[0].request_id.clone() }).await?;
    assert_eq!(lineage.coverage, "expired_by_retention");
    assert!(lineage.verified.is_none());

    // Deleting the first kept row is still caught: verification starts at the checkpoint.
    harness.execute("DELETE FROM audit_chain WHERE tenant_id = $1 AND sequence = 4", &[&tenant]).await?;
    assert_eq!(broken(&harness.verify(&tenant).await?), Some((5, "sequence_gap".to_string())));
    Ok(())
}

async fn the_consumer_chains_each_record_once_and_acks_after_commit(database: Database) -> TestResult {
    let harness = Harness::new(database)?;
    let bus: Arc<dyn EventBus> = Arc::new(InProcessBus::new());
    let mut consumer = AuditConsumer::subscribe(&bus, harness.service.clone()).await?;
    let tenant = new_tenant();
    let first = record(&tenant, harness.now() - Duration::minutes(2));
    let second = record(&tenant, harness.now() - Duration::minutes(1));
    let header = publish_record(bus.as_ref(), &first).await?;
    assert_eq!(header, commitment(&first));
    publish_record(bus.as_ref(), &first).await?;
    bus.publish(AUDIT_RECORDS_TOPIC, &tenant, Bytes::from_static(b"\xff\xff not a record")).await?;
    let mut invalid = record(&tenant, harness.now());
    invalid.outcome = "maybe".to_string();
    publish_record(bus.as_ref(), &invalid).await?;
    publish_record(bus.as_ref(), &second).await?;

    let mut outcomes = Vec::new();
    for _ in 0..5 {
        outcomes.push(tokio::time::timeout(std::time::Duration::from_secs(5), consumer.handle_next()).await??);
    }
    assert_eq!(outcomes, [Handled::Chained, Handled::Duplicate, Handled::Rejected, Handled::Rejected, Handled::Chained]);
    let report = harness.verify(&tenant).await?;
    assert!(report.valid && report.checked == 2);

    // A store failure leaves the record unacked; the group's next consumer gets it again.
    let third = record(&tenant, harness.now());
    let failing_database = brainstorm_common::store::testing::fresh_sqlite().await?;
    failing_database.close().await;
    let failing = AuditLineageServiceImpl::new(failing_database, AuditLineageOptions::new(harness.signer.clone()));
    let mut broken_consumer = AuditConsumer::subscribe(&bus, failing).await?;
    publish_record(bus.as_ref(), &third).await?;
    let handled = tokio::time::timeout(std::time::Duration::from_secs(5), broken_consumer.handle_next()).await??;
    assert_eq!(handled, Handled::Retried);
    drop(broken_consumer);
    let handled = tokio::time::timeout(std::time::Duration::from_secs(5), consumer.handle_next()).await??;
    assert_eq!(handled, Handled::Chained);
    let lineage = harness.service.get_lineage(RequestRef { tenant_id: tenant.clone(), request_id: third.request_id.clone() }).await?;
    assert_eq!(lineage.verified.map(|verified| verified.provenance_digest), Some(commitment(&third)));
    assert_eq!(harness.verify(&tenant).await?.checked, 3);
    Ok(())
}

async fn a_batch_chains_each_tenant_in_order_once_in_one_transaction(database: Database) -> TestResult {
    let harness = Harness::new(database)?;
    let bus: Arc<dyn EventBus> = Arc::new(InProcessBus::new());
    let mut consumer = AuditConsumer::subscribe(&bus, harness.service.clone()).await?;
    let (alpha, beta) = (new_tenant(), new_tenant());
    // One record chained before the batch: the batch continues that chain.
    let earlier = record(&alpha, harness.now() - Duration::minutes(30));
    harness.chain(&earlier).await?;
    let mut alpha_records = Vec::new();
    for index in 0..6 {
        let alpha_record = record(&alpha, harness.now() - Duration::minutes(20 - index));
        publish_record(bus.as_ref(), &alpha_record).await?;
        alpha_records.push(alpha_record);
        publish_record(bus.as_ref(), &record(&beta, harness.now() - Duration::minutes(20 - index))).await?;
    }
    // Redeliveries inside the batch and of the row chained before it are duplicates.
    publish_record(bus.as_ref(), &alpha_records[2]).await?;
    publish_record(bus.as_ref(), &earlier).await?;
    let mut invalid = record(&beta, harness.now());
    invalid.outcome = "maybe".to_string();
    publish_record(bus.as_ref(), &invalid).await?;

    let handled = tokio::time::timeout(std::time::Duration::from_secs(5), consumer.handle_batch()).await??;
    assert_eq!(handled.len(), 15, "every waiting delivery is taken in one batch: {handled:?}");
    assert_eq!(handled.iter().filter(|outcome| **outcome == Handled::Chained).count(), 12);
    assert_eq!(handled.iter().filter(|outcome| **outcome == Handled::Duplicate).count(), 2);
    assert_eq!(handled.iter().filter(|outcome| **outcome == Handled::Rejected).count(), 1);
    for (tenant, rows) in [(&alpha, 7), (&beta, 6)] {
        let report = harness.verify(tenant).await?;
        assert!(report.valid, "{report:?}");
        assert_eq!((report.checked, report.head_sequence), (rows, rows as i64));
    }
    // In publish order: the batch's records follow the earlier one.
    for (index, alpha_record) in alpha_records.iter().enumerate() {
        let lineage =
            harness.service.get_lineage(RequestRef { tenant_id: alpha.clone(), request_id: alpha_record.request_id.clone() }).await?;
        let sequence = lineage.verified.map(|verified| verified.event_hash).unwrap_or_default();
        assert!(!sequence.is_empty(), "record {index} is chained");
    }
    let exported = export_all(&harness, &alpha, 100).await?;
    let order: Vec<usize> = alpha_records.iter().map(|record| exported.find(&record.request_id).unwrap_or(usize::MAX)).collect();
    assert!(order.windows(2).all(|pair| pair[0] < pair[1]), "the batch keeps publish order: {order:?}");
    Ok(())
}

async fn captured_text_is_chained_by_digest_and_redaction_keeps_the_chain(database: Database) -> TestResult {
    let harness = Harness::new(database)?;
    let tenant = new_tenant();
    let mut captured = record(&tenant, harness.now());
    captured.capture = Some(Capture { prompt: "what is 2+2?".to_string(), completion: "4".to_string() });
    harness.chain(&captured).await?;
    let (payload,): (String,) =
        sqlx::query_as("SELECT payload FROM audit_chain WHERE tenant_id = $1").bind(&tenant).fetch_one(harness.database.pool()).await?;
    assert!(!payload.contains("what is 2+2?"), "captured text never enters the chained payload");
    assert!(payload.contains("capture_digest"));
    let check = |report: &ChainReport| report.provenance_checks.first().map(|check| check.check.clone());
    assert_eq!(check(&harness.verify(&tenant).await?).as_deref(), Some("ok"));

    harness.execute("UPDATE audit_captures SET completion = $1 WHERE tenant_id = $2", &["5", &tenant]).await?;
    let report = harness.verify(&tenant).await?;
    assert!(report.valid, "provenance checks never flip the chain result");
    assert_eq!(check(&report).as_deref(), Some("failed"));

    let redacted =
        harness.service.redact_capture(RequestRef { tenant_id: tenant.clone(), request_id: captured.request_id.clone() }).await?;
    assert!(redacted.redacted);
    let report = harness.verify(&tenant).await?;
    assert!(report.valid);
    assert_eq!(check(&report).as_deref(), Some("redacted"));
    let (prompt,): (Option<String>,) =
        sqlx::query_as("SELECT prompt FROM audit_captures WHERE tenant_id = $1").bind(&tenant).fetch_one(harness.database.pool()).await?;
    assert_eq!(prompt, None);
    Ok(())
}

async fn two_racing_writers_never_fork_a_chain(database: Database) -> TestResult {
    let first = Harness::new(database.clone())?;
    let second = Harness::new(database)?;
    let tenant = new_tenant();
    let records: Vec<AuditRecord> = (0..40).map(|index| record(&tenant, first.now() - Duration::seconds(index))).collect();
    let (left, right) = records.split_at(20);
    let (left, right) = (left.to_vec(), right.to_vec());
    let (service_a, service_b) = (first.service.clone(), second.service.clone());
    // Each writer also retries the other's records, as a rebalance would hand them over.
    let writer_a = tokio::spawn(async move {
        for record in left.iter().chain(right.iter()) {
            service_a.record_audit(record.clone()).await?;
        }
        Ok::<_, brainstorm_proto::ServiceError>(())
    });
    let (left, right) = records.split_at(20);
    let (left, right) = (left.to_vec(), right.to_vec());
    let writer_b = tokio::spawn(async move {
        for record in right.iter().chain(left.iter()) {
            service_b.record_audit(record.clone()).await?;
        }
        Ok::<_, brainstorm_proto::ServiceError>(())
    });
    writer_a.await??;
    writer_b.await??;
    let report = first.verify(&tenant).await?;
    assert!(report.valid, "{report:?}");
    assert_eq!((report.checked, report.head_sequence), (40, 40));
    Ok(())
}

fn traced(tenant: &str, at: DateTime<Utc>, trace_id: &str, span: &str, parent: Option<&str>, origin: &str) -> AuditRecord {
    let mut record = record(tenant, at);
    record.trace = Some(TraceContext {
        trace_id: trace_id.to_string(),
        span_id: span.to_string(),
        parent_span_id: parent.map(str::to_string),
        origin: origin.to_string(),
        inbound_trusted: false,
    });
    record
}

async fn lineage_orders_a_trace_by_span_parentage(database: Database) -> TestResult {
    let harness = Harness::new(database)?;
    let tenant = new_tenant();
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let now = harness.now();
    // Chained in an order that is not the causal one.
    let child = traced(&tenant, now - Duration::seconds(30), trace, "00000000000000b1", Some("00000000000000a0"), "inbound");
    let grandchild = traced(&tenant, now - Duration::seconds(20), trace, "00000000000000c1", Some("00000000000000b1"), "inbound");
    let mut root = traced(&tenant, now - Duration::seconds(50), trace, "00000000000000a0", Some("1111111111111111"), "inbound");
    root.principal = Some(Principal {
        id: "key-1".to_string(),
        auth_method: "api_key".to_string(),
        spiffe_id: None,
        owner_id: Some("user-7".to_string()),
    });
    root.policy = Some(PolicyContext { matched_rules: vec!["allow-all".to_string()], deny_rule: None, verdict_id: Some("v1".to_string()) });
    let sibling = traced(&tenant, now - Duration::seconds(10), trace, "00000000000000b2", Some("00000000000000a0"), "inbound");
    for record in [&grandchild, &child, &sibling, &root] {
        harness.chain(record).await?;
    }
    harness.chain(&record(&tenant, now)).await?;

    let lineage = harness.service.get_lineage(RequestRef { tenant_id: tenant.clone(), request_id: child.request_id.clone() }).await?;
    assert_eq!(lineage.coverage, "captured");
    let verified = lineage.verified.clone().ok_or("no verified context")?;
    assert_eq!((verified.chain_schema_version, verified.provenance_check.as_str()), (2, "ok"));
    assert_eq!(verified.provenance_digest, commitment(&child));
    assert_eq!((verified.trace_id.as_str(), verified.edge_provenance.as_str()), (trace, "inbound"));
    let view = lineage.lineage.clone().ok_or("no lineage view")?;
    assert_eq!((view.edge_label.as_str(), view.episode_size, view.depth), ("verified", 4, 1), "its parent is a chained record");
    assert_eq!(lineage.traceparent, format!("00-{trace}-00000000000000b1-01"));
    let relations: Vec<(String, String, String)> = lineage
        .causal_neighbors
        .iter()
        .map(|neighbor| {
            let name = [(&root, "root"), (&grandchild, "grandchild"), (&sibling, "sibling")]
                .iter()
                .find(|(record, _)| record.request_id == neighbor.request_id)
                .map_or("?", |(_, name)| name);
            (name.to_string(), neighbor.relation.clone(), neighbor.edge_label.clone())
        })
        .collect();
    let expected = [("root", "parent", "claimed"), ("grandchild", "child", "verified"), ("sibling", "sibling", "verified")];
    assert_eq!(relations, expected.map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string())).to_vec());
    assert!(lineage.anomalies.is_empty());

    let root_lineage = harness.service.get_lineage(RequestRef { tenant_id: tenant.clone(), request_id: root.request_id.clone() }).await?;
    assert_eq!(root_lineage.principal.and_then(|principal| principal.owner_id).as_deref(), Some("user-7"));
    let policy = root_lineage.policy_context.ok_or("no policy context")?;
    assert_eq!((policy.matched_rules, policy.verdict_id), (vec!["allow-all".to_string()], Some("v1".to_string())));

    for request in [
        EpisodeRequest { tenant_id: tenant.clone(), trace_id: Some(trace.to_string()), request_id: None },
        EpisodeRequest { tenant_id: tenant.clone(), trace_id: None, request_id: Some(sibling.request_id.clone()) },
    ] {
        let episode = harness.service.get_episode(request).await?;
        let order: Vec<(&str, u64)> = episode.records.iter().map(|record| (record.span_id.as_str(), record.depth)).collect();
        assert_eq!(order, [("00000000000000a0", 0), ("00000000000000b1", 1), ("00000000000000c1", 2), ("00000000000000b2", 1)]);
        assert_eq!(episode.chain_schema_version, 2);
    }
    // A record whose row no longer checks is labelled unverified in every episode it belongs to.
    harness
        .execute(
            "UPDATE audit_chain SET payload = REPLACE(payload, '\"latency_ms\":120', '\"latency_ms\":1') WHERE tenant_id = $1 AND request_id = $2",
            &[&tenant, &grandchild.request_id],
        )
        .await?;
    let episode = harness
        .service
        .get_episode(EpisodeRequest { tenant_id: tenant.clone(), trace_id: Some(trace.to_string()), request_id: None })
        .await?;
    let labels: Vec<&str> = episode.records.iter().map(|record| record.edge_label.as_str()).collect();
    assert_eq!(labels, ["claimed", "verified", "unverified", "verified"]);
    assert!(episode.anomalies.iter().any(|anomaly| anomaly.kind == "chain_row_unverified"));
    let missing = harness.service.get_episode(EpisodeRequest { tenant_id: tenant, trace_id: Some("0".repeat(32)), request_id: None }).await;
    assert_eq!(missing.err().map(|error| error.kind), Some(ErrorKind::NotFound));
    Ok(())
}

async fn lineage_coverage_of_requests_without_a_row(database: Database) -> TestResult {
    let harness = Harness::new(database)?;
    let tenant = new_tenant();
    let lineage_of = |request_id: String| {
        let service = harness.service.clone();
        let tenant = tenant.clone();
        async move { service.get_lineage(RequestRef { tenant_id: tenant, request_id }).await }
    };
    let early = request_id_at(harness.now() - Duration::days(3));
    assert_eq!(lineage_of(early.clone()).await?.coverage, "pre_rollout", "nothing chained yet");
    let mut sampled = record(&tenant, harness.now() - Duration::hours(1));
    sampled.coverage = "sampled_out".to_string();
    harness.chain(&sampled).await?;
    assert_eq!(lineage_of(early).await?.coverage, "pre_rollout");
    let sampled_lineage = lineage_of(sampled.request_id.clone()).await?;
    assert_eq!(sampled_lineage.coverage, "sampled_out");
    assert_eq!(sampled_lineage.verified.map(|verified| verified.provenance_check).as_deref(), Some("sampled_out"));
    let unknown = lineage_of(request_id_at(harness.now())).await;
    assert_eq!(unknown.err().map(|error| (error.kind, error.reason)), Some((ErrorKind::NotFound, "lineage_not_found".to_string())));
    let garbage = lineage_of("req_not-a-uuid".to_string()).await;
    assert_eq!(garbage.err().map(|error| error.kind), Some(ErrorKind::NotFound));

    let mut untraced = record(&tenant, harness.now());
    untraced.trace = None;
    harness.chain(&untraced).await?;
    let lineage = lineage_of(untraced.request_id.clone()).await?;
    assert_eq!(lineage.verified.map(|verified| verified.provenance_check).as_deref(), Some("missing_lineage"));
    assert_eq!(lineage.lineage.map(|view| view.edge_label).as_deref(), Some("unverified"));
    assert!(lineage.anomalies.iter().any(|anomaly| anomaly.kind == "missing_trace"));
    Ok(())
}

async fn explain_shows_the_decision_path_and_priced_alternatives(database: Database) -> TestResult {
    let harness = Harness::new(database)?;
    let tenant = new_tenant();
    let mut routed = record(&tenant, harness.now());
    routed.decision = Some(DecisionPath {
        selected_model: "openai/gpt-4o-mini".to_string(),
        score_micros: 873_000,
        selection_method: "capability-matched".to_string(),
        reason: "cheapest runnable model at tier 1".to_string(),
        complexity_level: 1,
        complexity_score: 2,
        candidates: vec![
            CandidateDecision {
                model: "openai/gpt-4o-mini".to_string(),
                provider: "openai".to_string(),
                estimated_cost_nanos: Some(600_000),
                score_micros: 873_000,
                status: "selected".to_string(),
                reason: String::new(),
            },
            CandidateDecision {
                model: "anthropic/claude-3-5-haiku".to_string(),
                provider: "anthropic".to_string(),
                estimated_cost_nanos: Some(2_400_000),
                score_micros: 640_000,
                status: "not_tried".to_string(),
                reason: "pricier".to_string(),
            },
        ],
        steps: vec![
            DecisionStep { stage: "budget".to_string(), result: "pass".to_string(), detail: String::new(), elapsed_micros: 80 },
            DecisionStep {
                stage: "routing".to_string(),
                result: "pass".to_string(),
                detail: "auto: tier 1".to_string(),
                elapsed_micros: 35,
            },
        ],
    });
    let chained = harness.chain(&routed).await?;
    let explanation = harness.service.explain(RequestRef { tenant_id: tenant.clone(), request_id: routed.request_id.clone() }).await?;
    assert_eq!((explanation.selected_model.as_str(), explanation.score_micros), ("openai/gpt-4o-mini", 873_000));
    assert_eq!(explanation.alternatives.len(), 1);
    assert_eq!(explanation.alternatives[0].estimated_cost_nanos, Some(2_400_000));
    let stages: Vec<&str> = explanation.decision_path.iter().map(|step| step.stage.as_str()).collect();
    assert_eq!(stages, ["budget", "routing"]);
    assert_eq!((explanation.audit_hash, explanation.commitment), (chained.hash, chained.commitment));
    let missing = harness.service.explain(RequestRef { tenant_id: new_tenant(), request_id: routed.request_id }).await;
    assert_eq!(missing.err().map(|error| error.reason).as_deref(), Some("audit_record_not_found"), "tenant-scoped");
    Ok(())
}

async fn artifact_json(
    harness: &Harness,
    request: ArtifactRequest,
) -> Result<(serde_json::Value, Signature), Box<dyn std::error::Error + Send + Sync>> {
    let signed = harness.service.get_artifact(request).await?;
    let signature = signed.signature.ok_or("unsigned")?;
    Ok((serde_json::from_str(&signed.canonical)?, signature))
}

async fn artifacts_are_signed_and_accountability_is_omitted_without_an_owner(database: Database) -> TestResult {
    let harness = Harness::new(database)?;
    let tenant = new_tenant();
    let published = harness.service.get_verification_key(TenantRef { tenant_id: tenant.clone() }).await?;
    assert_eq!(published.algorithm, "HMAC-SHA256");
    let key = TenantKey::from_published(&published.key)?;

    let mut with_agent_owner = record(&tenant, harness.now());
    with_agent_owner.agent_id = Some("planner".to_string());
    with_agent_owner.agent = Some(AgentContext {
        registered: true,
        owner_id: Some("user-1".to_string()),
        owner_source: "agent_profile".to_string(),
        identity_source: "agent_jwt".to_string(),
        ..AgentContext::default()
    });
    let mut with_key_owner = record(&tenant, harness.now());
    with_key_owner.principal = Some(Principal {
        id: "key-1".to_string(),
        auth_method: "api_key".to_string(),
        spiffe_id: None,
        owner_id: Some("user-2".to_string()),
    });
    let mut ownerless_agent = record(&tenant, harness.now());
    ownerless_agent.agent_id = Some("scout".to_string());
    let anonymous = record(&tenant, harness.now());
    for record in [&with_agent_owner, &with_key_owner, &ownerless_agent, &anonymous] {
        harness.chain(record).await?;
    }
    let request = |record: &AuditRecord, registry: Option<AgentRegistry>| ArtifactRequest {
        tenant_id: tenant.clone(),
        request_id: record.request_id.clone(),
        registry,
    };

    let (artifact, signature) = artifact_json(&harness, request(&with_agent_owner, None)).await?;
    assert_eq!((signature.algorithm.as_str(), signature.key_id.as_str()), ("HMAC-SHA256", published.key_id.as_str()));
    assert!(verify_artifact(&artifact, &signature, &key)?);
    assert_eq!(
        artifact["accountability"],
        serde_json::json!({"agentId": "planner", "ownerId": "user-1", "ownerSource": "agent_profile", "evidence": "committed"})
    );
    let lineage =
        harness.service.get_lineage(RequestRef { tenant_id: tenant.clone(), request_id: with_agent_owner.request_id.clone() }).await?;
    assert_eq!(artifact["chain"]["hash"].as_str(), lineage.verified.as_ref().map(|verified| verified.event_hash.as_str()));
    let mut forged = artifact.clone();
    forged["record"]["costNanos"] = serde_json::json!(1);
    assert!(!verify_artifact(&forged, &signature, &key)?);
    let other_tenant_key = harness.signer.tenant_key(&new_tenant());
    assert!(!verify_artifact(&artifact, &signature, &other_tenant_key)?);

    let (artifact, _) = artifact_json(&harness, request(&with_key_owner, None)).await?;
    assert_eq!(artifact["accountability"]["ownerSource"], "api_key_user");
    assert_eq!(artifact["accountability"]["evidence"], "committed");
    assert!(artifact["accountability"].get("agentId").is_none());

    let registry = AgentRegistry {
        agents: vec![AgentRegistration { agent_id: "scout".to_string(), owner_id: Some("user-3".to_string()), lifecycle_state: None }],
    };
    let (artifact, signature) = artifact_json(&harness, request(&ownerless_agent, Some(registry))).await?;
    assert_eq!(
        artifact["accountability"],
        serde_json::json!({"agentId": "scout", "ownerId": "user-3", "ownerSource": "agent_profile", "evidence": "recorded"})
    );
    assert!(verify_artifact(&artifact, &signature, &key)?);

    for record in [&ownerless_agent, &anonymous] {
        let signed = harness.service.get_artifact(request(record, None)).await?;
        assert!(!signed.canonical.contains("accountability"), "omitted entirely, never null: {}", signed.canonical);
        let artifact: serde_json::Value = serde_json::from_str(&signed.canonical)?;
        assert!(verify_artifact(&artifact, &signed.signature.ok_or("unsigned")?, &key)?);
    }

    harness
        .execute(
            "UPDATE audit_chain SET payload = REPLACE(payload, '\"latency_ms\":120', '\"latency_ms\":2') WHERE tenant_id = $1 AND request_id = $2",
            &[&tenant, &anonymous.request_id],
        )
        .await?;
    let refused = harness.service.get_artifact(request(&anonymous, None)).await;
    assert_eq!(refused.err().map(|error| error.reason).as_deref(), Some("audit_record_unverifiable"));
    Ok(())
}

async fn the_agents_inventory_covers_its_window(database: Database) -> TestResult {
    let harness = Harness::new(database)?;
    let tenant = new_tenant();
    let now = harness.now();
    let agent_record = |agent: Option<&str>, registered: bool, source: &str, at: DateTime<Utc>, key: &str| {
        let mut record = record(&tenant, at);
        record.agent_id = agent.map(str::to_string);
        record.key_id = Some(key.to_string());
        record.agent = Some(AgentContext {
            registered,
            identity_source: source.to_string(),
            mesh_source: (source == "header").then(|| "orchestrator".to_string()),
            mesh_hop_count: if source == "header" { 2 } else { 0 },
            ..AgentContext::default()
        });
        record
    };
    let records = [
        agent_record(Some("planner"), true, "agent_jwt", now - Duration::hours(1), "k1"),
        agent_record(Some("planner"), true, "agent_jwt", now - Duration::hours(2), "k1"),
        agent_record(Some("shadow"), false, "header", now - Duration::hours(3), "k2"),
        agent_record(None, false, "", now - Duration::hours(4), "k3"),
        // Two days old: inside a week, outside a day.
        agent_record(None, false, "", now - Duration::days(2), "k4"),
        // Forty days old: outside every window.
        agent_record(Some("ghost"), false, "header", now - Duration::days(40), "k5"),
    ];
    for record in &records {
        harness.chain(record).await?;
    }
    let inventory = |period: &str, registry: Option<AgentRegistry>| {
        harness.service.get_agent_inventory(InventoryRequest { tenant_id: tenant.clone(), period: period.to_string(), registry })
    };
    let day = inventory("day", None).await?;
    let summary = day.summary.ok_or("no summary")?;
    assert_eq!(summary.total_requests, 4);
    assert_eq!((summary.registered_agents, summary.unregistered_agents, summary.untagged_keys), (1, 1, 1));
    assert_eq!((summary.shadow_requests, summary.shadow_ratio), (2, Some(0.5)));
    assert_eq!((summary.mesh_identities, summary.ownerless_agents), (1, 1));
    assert_eq!(day.mesh.first().map(|mesh| (mesh.identity.as_str(), mesh.max_hop_count)), Some(("orchestrator", 2)));
    let asserted = day.asserted.clone().ok_or("asserted missing")?.agents;
    assert_eq!(asserted.iter().map(|agent| agent.agent_id.as_str()).collect::<Vec<_>>(), ["shadow"]);
    let window = day.window.clone().ok_or("no window")?;
    assert_eq!((window.period.as_str(), window.until.as_str()), ("day", format_timestamp(now).as_str()));

    let week = inventory("week", None).await?.summary.ok_or("no summary")?;
    assert_eq!((week.total_requests, week.untagged_keys, week.shadow_requests), (5, 2, 3));
    let month = inventory("month", None).await?.summary.ok_or("no summary")?;
    assert_eq!(month.total_requests, 5, "forty days is outside a month");

    let registry = AgentRegistry {
        agents: vec![
            AgentRegistration { agent_id: "planner".to_string(), owner_id: Some("user-1".to_string()), lifecycle_state: None },
            AgentRegistration { agent_id: "dormant".to_string(), owner_id: None, lifecycle_state: Some("suspended".to_string()) },
        ],
    };
    let with_registry = inventory("day", Some(registry)).await?;
    let summary = with_registry.summary.ok_or("no summary")?;
    assert_eq!((summary.registered_agents, summary.ownerless_agents), (2, 1));
    assert!(with_registry.agents.iter().any(|agent| agent.agent_id == "dormant" && agent.requests == 0));

    let empty = harness
        .service
        .get_agent_inventory(InventoryRequest { tenant_id: new_tenant(), period: "week".to_string(), registry: None })
        .await?;
    assert_eq!(empty.summary.map(|summary| (summary.total_requests, summary.shadow_ratio)), Some((0, None)));
    Ok(())
}

async fn replays_list_simulate_and_compare_recorded_decisions(database: Database) -> TestResult {
    let harness = Harness::new(database)?;
    let tenant = new_tenant();
    let now = harness.now();
    let catalog = ModelCatalog::bundled()?;
    let prices = price_table(&catalog);
    let mini = catalog.find("openai", "gpt-4o-mini").ok_or("gpt-4o-mini missing")?.clone();
    let big = catalog.find("openai", "gpt-4o").ok_or("gpt-4o missing")?.clone();
    let routed = |at: DateTime<Utc>, executed: &str, strategy: &str, cost: i64, latency: i64| {
        let mut record = record(&tenant, at);
        record.model_executed = executed.to_string();
        record.strategy = strategy.to_string();
        record.input_tokens = 1_000_000;
        record.output_tokens = 100_000;
        record.cost_nanos = cost;
        record.latency_ms = latency;
        record.decision = Some(DecisionPath {
            selected_model: executed.to_string(),
            candidates: ["openai/gpt-4o", "openai/gpt-4o-mini"]
                .iter()
                .map(|model| CandidateDecision {
                    model: model.to_string(),
                    status: "not_tried".to_string(),
                    ..CandidateDecision::default()
                })
                .collect(),
            ..DecisionPath::default()
        });
        record
    };
    let big_cost = big.price.cost(brainstorm_providers::chat::Usage::uncached(1_000_000, 100_000)).nanos();
    let mini_cost = mini.price.cost(brainstorm_providers::chat::Usage::uncached(1_000_000, 100_000)).nanos();
    let records = [
        routed(now - Duration::hours(30), "openai/gpt-4o", "quality", big_cost, 800),
        routed(now - Duration::hours(3), "openai/gpt-4o", "quality", big_cost, 1000),
        routed(now - Duration::hours(2), "openai/gpt-4o-mini", "price", mini_cost, 200),
        routed(now - Duration::hours(1), "openai/gpt-4o", "quality", big_cost, 600),
    ];
    for record in &records {
        harness.chain(record).await?;
    }
    harness.chain(&record_for_beta(&tenant, &harness)).await?;

    let decisions = harness.service.list_decisions(DecisionsRequest { tenant_id: tenant.clone(), limit: None, since: None }).await?;
    assert_eq!(decisions.count, 3, "the last 24 hours, denials excluded");
    let order: Vec<&str> = decisions.decisions.iter().map(|decision| decision.request_id.as_str()).collect();
    assert_eq!(order, [records[3].request_id.as_str(), records[2].request_id.as_str(), records[1].request_id.as_str()]);
    let first = &decisions.decisions[0];
    assert_eq!((first.endpoint_id.as_str(), first.cost_nanos, first.latency_ms), ("openai/gpt-4o", big_cost, 600));
    let limited = harness
        .service
        .list_decisions(DecisionsRequest {
            tenant_id: tenant.clone(),
            limit: Some(1),
            since: Some(format_timestamp(now - Duration::days(2))),
        })
        .await?;
    assert_eq!(limited.count, 1);
    let wide = harness
        .service
        .list_decisions(DecisionsRequest {
            tenant_id: tenant.clone(),
            limit: Some(5000),
            since: Some(format_timestamp(now - Duration::days(2))),
        })
        .await?;
    assert_eq!(wide.count, 4, "limit is capped, not refused");

    let simulation = harness
        .service
        .simulate_replay(SimulateRequest {
            tenant_id: tenant.clone(),
            strategy: "price".to_string(),
            since: None,
            until: None,
            prices: prices.clone(),
        })
        .await?;
    let actual = simulation.actual.ok_or("no actual")?;
    let simulated = simulation.simulated.clone().ok_or("no simulated")?;
    assert_eq!(actual.total_requests, 4);
    assert_eq!(actual.total_cost_nanos, 3 * big_cost + mini_cost);
    assert_eq!(simulated.total_cost_nanos, 4 * mini_cost);
    assert_eq!(simulated.cost_savings_vs_actual_nanos, 3 * (big_cost - mini_cost));
    let pct = simulated.cost_savings_pct.ok_or("no pct")?;
    let expected_pct = 3.0 * (big_cost - mini_cost) as f64 * 100.0 / (3 * big_cost + mini_cost) as f64;
    assert!((pct - expected_pct).abs() < 1e-9);
    assert!((simulated.avg_latency_ms - 200.0).abs() < 1e-9, "every request moves to gpt-4o-mini's recorded latency");
    assert!((actual.avg_latency_ms - 650.0).abs() < 1e-9);
    let period = simulation.period.ok_or("no period")?;
    assert_eq!(period.since, format_timestamp(now - Duration::days(7)));

    let unpriced = harness
        .service
        .simulate_replay(SimulateRequest {
            tenant_id: tenant.clone(),
            strategy: "price".to_string(),
            since: None,
            until: None,
            prices: vec![],
        })
        .await?;
    assert_eq!(unpriced.simulated.map(|simulated| simulated.cost_savings_vs_actual_nanos), Some(0));

    let comparison = harness.service.compare_strategies(CompareRequest { tenant_id: tenant.clone(), since: None }).await?;
    let stats: Vec<(&str, u64, i64)> =
        comparison.strategies.iter().map(|stat| (stat.strategy.as_str(), stat.request_count, stat.p95_latency_ms)).collect();
    assert_eq!(stats, [("price", 1, 200), ("quality", 3, 1000)]);
    assert_eq!(comparison.strategies[1].total_output_tokens, 300_000);
    assert_eq!(comparison.strategies[1].avg_cost_per_request_nanos, big_cost);
    assert!(big_cost > mini_cost && mini_cost > 0);
    Ok(())
}

async fn invalid_requests_are_refused(database: Database) -> TestResult {
    let harness = Harness::new(database)?;
    let tenant = new_tenant();
    let mut bad = record(&tenant, harness.now());
    bad.occurred_at = "yesterday".to_string();
    let refused = harness.chain(&bad).await;
    assert_eq!(refused.err().map(|error| (error.kind, error.reason)), Some((ErrorKind::InvalidArgument, "invalid_timestamp".to_string())));
    let mut bad = record(&tenant, harness.now());
    bad.coverage = "pre_rollout".to_string();
    assert_eq!(harness.chain(&bad).await.err().map(|error| error.reason).as_deref(), Some("invalid_coverage"));
    let strategy = harness
        .service
        .simulate_replay(SimulateRequest { tenant_id: tenant.clone(), strategy: "cheapest".to_string(), ..SimulateRequest::default() })
        .await;
    assert_eq!(strategy.err().map(|error| error.reason).as_deref(), Some("invalid_strategy"));
    let period = harness
        .service
        .get_agent_inventory(InventoryRequest { tenant_id: tenant.clone(), period: "year".to_string(), registry: None })
        .await;
    assert_eq!(period.err().map(|error| error.reason).as_deref(), Some("invalid_period"));
    let since =
        harness.service.list_decisions(DecisionsRequest { tenant_id: tenant.clone(), limit: None, since: Some("soon".to_string()) }).await;
    assert_eq!(since.err().map(|error| error.reason).as_deref(), Some("invalid_since"));
    // A non-normalised but valid timestamp is accepted; its row's column is normalised and still verifies.
    let mut offset = record(&tenant, harness.now());
    offset.occurred_at = "2026-11-20T13:00:00+01:00".to_string();
    harness.chain(&offset).await?;
    assert!(harness.verify(&tenant).await?.valid);
    Ok(())
}
