//! The audit-lineage contract over real tonic gRPC, on an in-memory duplex transport (no ports opened).

use brainstorm_audit_lineage::artifact::TenantKey;
use brainstorm_audit_lineage::{ArtifactSigner, AuditLineageOptions, AuditLineageServiceImpl, commitment, verify_artifact};
use brainstorm_common::store::testing;
use brainstorm_common::time::now_timestamp;
use brainstorm_proto::ErrorKind;
use brainstorm_proto::audit::*;

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn remote_audit() -> Result<AuditLineageClient, Box<dyn std::error::Error>> {
    let database = testing::fresh_sqlite().await?;
    let signer = ArtifactSigner::new(&[42u8; 32])?;
    let local = AuditLineageClient::local(AuditLineageServiceImpl::new(database, AuditLineageOptions::new(signer)));

    Ok(local.over_grpc_duplex().await?)
}

fn record(tenant_id: &str, span: &str, parent: Option<&str>) -> AuditRecord {
    AuditRecord {
        request_id: format!("req_{}", uuid::Uuid::now_v7()),
        tenant_id: tenant_id.to_string(),
        occurred_at: now_timestamp(),
        endpoint: "/v1/messages".to_string(),
        key_id: Some("key-9".to_string()),
        principal: Some(Principal {
            id: "key-9".to_string(),
            auth_method: "api_key".to_string(),
            spiffe_id: None,
            owner_id: Some("u9".to_string()),
        }),
        model_requested: "claude".to_string(),
        model_executed: "anthropic/claude-3-5-haiku".to_string(),
        provider: "anthropic".to_string(),
        strategy: "quality".to_string(),
        input_tokens: 10,
        output_tokens: 20,
        cost_nanos: 1234,
        outcome: "allowed".to_string(),
        latency_ms: 42,
        trace: Some(TraceContext {
            trace_id: "0af7651916cd43dd8448eb211c80319c".to_string(),
            span_id: span.to_string(),
            parent_span_id: parent.map(str::to_string),
            origin: "generated".to_string(),
            inbound_trusted: false,
        }),
        ..AuditRecord::default()
    }
}

#[tokio::test]
async fn calls_and_errors_cross_the_grpc_hop_intact() -> TestResult {
    let audit = remote_audit().await?;
    let tenant_id = uuid::Uuid::new_v4().to_string();
    let parent = record(&tenant_id, "b7ad6b7169203331", None);
    let child = record(&tenant_id, "c7ad6b7169203332", Some("b7ad6b7169203331"));

    let recorded = audit.record_audit(parent.clone()).await?;
    assert!(recorded.recorded && recorded.sequence == 1);
    assert_eq!(recorded.commitment, commitment(&parent), "the edge's X-BR-Audit-Hash matches the chained row");
    assert!(!audit.record_audit(parent.clone()).await?.recorded, "idempotent across the hop");
    audit.record_audit(child.clone()).await?;

    let report = audit.verify_chain(VerifyChainRequest { tenant_id: tenant_id.clone(), max_provenance_checks: Some(1) }).await?;
    assert!(report.valid && report.checked == 2);
    assert_eq!(report.first_broken, None, "an unset optional stays unset over the wire");
    assert!(report.provenance_checks_truncated);

    let page = audit.export_chain(ExportChainRequest { tenant_id: tenant_id.clone(), after_sequence: None, limit: None }).await?;
    let report = brainstorm_audit_lineage::verify_export(page.lines.join("\n").as_bytes())?;
    assert!(report.valid && report.checked == 2 && page.next_after_sequence.is_none());

    let lineage = audit.get_lineage(RequestRef { tenant_id: tenant_id.clone(), request_id: child.request_id.clone() }).await?;
    assert_eq!(lineage.causal_neighbors.first().map(|neighbor| neighbor.relation.as_str()), Some("parent"));
    let episode = audit
        .get_episode(EpisodeRequest { tenant_id: tenant_id.clone(), trace_id: None, request_id: Some(child.request_id.clone()) })
        .await?;
    assert_eq!(episode.records.len(), 2);
    let explanation = audit.explain(RequestRef { tenant_id: tenant_id.clone(), request_id: parent.request_id.clone() }).await?;
    assert_eq!(explanation.model_executed, "anthropic/claude-3-5-haiku");

    let key = audit.get_verification_key(TenantRef { tenant_id: tenant_id.clone() }).await?;
    let signed =
        audit.get_artifact(ArtifactRequest { tenant_id: tenant_id.clone(), request_id: parent.request_id.clone(), registry: None }).await?;
    let artifact: serde_json::Value = serde_json::from_str(&signed.canonical)?;
    assert!(verify_artifact(&artifact, &signed.signature.ok_or("unsigned")?, &TenantKey::from_published(&key.key)?)?);

    let inventory =
        audit.get_agent_inventory(InventoryRequest { tenant_id: tenant_id.clone(), period: "day".to_string(), registry: None }).await?;
    assert_eq!(inventory.summary.map(|summary| (summary.total_requests, summary.untagged_keys)), Some((2, 1)));
    let empty = audit
        .get_agent_inventory(InventoryRequest { tenant_id: uuid::Uuid::new_v4().to_string(), period: "day".to_string(), registry: None })
        .await?;
    assert_eq!(empty.summary.and_then(|summary| summary.shadow_ratio), None, "a null ratio stays null over the wire");
    let decisions = audit.list_decisions(DecisionsRequest { tenant_id: tenant_id.clone(), limit: None, since: None }).await?;
    assert_eq!(decisions.count, 2);
    let comparison = audit.compare_strategies(CompareRequest { tenant_id: tenant_id.clone(), since: None }).await?;
    assert_eq!(comparison.strategies.len(), 1);
    let simulation = audit
        .simulate_replay(SimulateRequest { tenant_id: tenant_id.clone(), strategy: "price".to_string(), ..SimulateRequest::default() })
        .await?;
    assert_eq!(simulation.simulated.and_then(|simulated| simulated.cost_savings_pct), Some(0.0));

    let missing =
        audit.explain(RequestRef { tenant_id: tenant_id.clone(), request_id: "req_nothing".to_string() }).await.err().ok_or("found")?;
    assert_eq!((missing.kind, missing.reason.as_str()), (ErrorKind::NotFound, "audit_record_not_found"));
    let invalid = audit
        .simulate_replay(SimulateRequest { tenant_id, strategy: "fastest".to_string(), ..SimulateRequest::default() })
        .await
        .err()
        .ok_or("strategy accepted")?;
    assert_eq!((invalid.kind, invalid.reason.as_str()), (ErrorKind::InvalidArgument, "invalid_strategy"));
    Ok(())
}

#[tokio::test]
async fn a_batch_chains_each_tenant_in_order_across_the_hop() -> TestResult {
    let audit = remote_audit().await?;
    let (first_tenant, second_tenant) = (uuid::Uuid::new_v4().to_string(), uuid::Uuid::new_v4().to_string());
    let a1 = record(&first_tenant, "a7ad6b7169203331", None);
    let b1 = record(&second_tenant, "b7ad6b7169203331", None);
    let a2 = record(&first_tenant, "a7ad6b7169203332", None);
    let already = audit.record_audit(a1.clone()).await?;
    assert_eq!(already.sequence, 1);

    // A redelivered record, another tenant's, and a new one: results in the batch's order.
    let batch = AuditRecordBatch { records: vec![a1.clone(), b1.clone(), a2.clone()] };
    let results = audit.record_audit_batch(batch).await?.results;
    assert_eq!(results.len(), 3);
    assert!(!results[0].recorded && results[0].sequence == 1 && results[0].hash == already.hash, "a duplicate keeps its place");
    assert!(results[1].recorded && results[1].sequence == 1 && results[1].commitment == commitment(&b1));
    assert!(results[2].recorded && results[2].sequence == 2 && results[2].commitment == commitment(&a2));
    for tenant_id in [&first_tenant, &second_tenant] {
        let report = audit.verify_chain(VerifyChainRequest { tenant_id: tenant_id.clone(), max_provenance_checks: None }).await?;
        assert!(report.valid, "{report:?}");
    }

    // One invalid record refuses the whole batch, naming it; nothing of it is chained.
    let mut invalid = record(&first_tenant, "a7ad6b7169203333", None);
    invalid.occurred_at = "yesterday".to_string();
    let a3 = record(&first_tenant, "a7ad6b7169203334", None);
    let error = audit.record_audit_batch(AuditRecordBatch { records: vec![a3, invalid] }).await.err().ok_or("must be refused")?;
    assert_eq!(error.kind, ErrorKind::InvalidArgument);
    assert!(error.message.contains("records[1]"), "{}", error.message);
    let report = audit.verify_chain(VerifyChainRequest { tenant_id: first_tenant.clone(), max_provenance_checks: None }).await?;
    assert_eq!(report.checked, 2);
    Ok(())
}

#[tokio::test]
async fn the_chain_keeps_the_payload_the_edge_committed_to() -> TestResult {
    let audit = remote_audit().await?;
    let tenant_id = uuid::Uuid::new_v4().to_string();
    // As the edge's publisher sends it: the payload it encoded (and answered the commitment of) rides along.
    let mut carried = record(&tenant_id, "d7ad6b7169203331", None);
    carried.canonical_payload = brainstorm_audit_lineage::canonical_payload(&carried);
    let recorded = audit.record_audit(carried.clone()).await?;
    assert_eq!(recorded.commitment, commitment(&carried));
    let page = audit.export_chain(ExportChainRequest { tenant_id: tenant_id.clone(), after_sequence: None, limit: None }).await?;
    assert!(!page.lines.is_empty());
    assert!(brainstorm_audit_lineage::verify_export(page.lines.join("\n").as_bytes())?.valid);
    // Transport only: never part of what the API answers with.
    let json = serde_json::to_value(&carried)?;
    assert!(json.get("canonical_payload").is_none() && json.get("request_id").is_some(), "{json}");
    Ok(())
}
