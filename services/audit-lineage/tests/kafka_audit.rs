//! The distributed audit path over Kafka and PostgreSQL: two edges publish interleaved records for
//! several tenants, the audit-lineage consumer is killed mid-load and a new one takes over; every
//! tenant's chain ends up complete, in each edge's publish order, valid, with nothing lost or doubled.
//! Runs on librdkafka's mock cluster, and on a real broker when `BR_TEST_KAFKA_BROKERS` is set.
#![cfg(feature = "kafka")]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use brainstorm_audit_lineage::{ArtifactSigner, AuditConsumer, AuditLineageOptions, AuditLineageServiceImpl, Handled, publish_record};
use brainstorm_common::bus::EventBus;
use brainstorm_common::bus::kafka::{KafkaBus, KafkaOptions};
use brainstorm_common::store::testing;
use brainstorm_common::time::now_timestamp;
use brainstorm_proto::audit::*;
use rdkafka::mocking::MockCluster;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const TENANTS: usize = 3;
const PER_EDGE_AND_TENANT: usize = 20;

fn bus(brokers: &str, create_topics: bool) -> Result<Arc<dyn EventBus>, Box<dyn std::error::Error + Send + Sync>> {
    let mut options = KafkaOptions::new(brokers);
    options.create_topics = create_topics;
    options.extra.insert("session.timeout.ms".to_string(), "6000".to_string());
    options.extra.insert("heartbeat.interval.ms".to_string(), "500".to_string());
    Ok(Arc::new(KafkaBus::new(options)?))
}

fn record(tenant_id: &str, edge: &str, index: usize) -> AuditRecord {
    AuditRecord {
        request_id: format!("req_{}", uuid::Uuid::now_v7()),
        tenant_id: tenant_id.to_string(),
        occurred_at: now_timestamp(),
        endpoint: "/v1/chat/completions".to_string(),
        conversation_id: Some(format!("{edge}/{index}")),
        model_executed: "openai/gpt-4o-mini".to_string(),
        outcome: "allowed".to_string(),
        cost_nanos: 1000 + index as i64,
        ..AuditRecord::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_cluster_two_edges_one_chain_and_a_consumer_crash() -> TestResult {
    let cluster = MockCluster::new(1)?;
    cluster.create_topic(AUDIT_RECORDS_TOPIC, 6, 1)?;
    // The mock cluster has no CreateTopics: the topic was made on the mock itself.
    two_edges_one_chain_and_a_consumer_crash(&cluster.bootstrap_servers(), false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_broker_two_edges_one_chain_and_a_consumer_crash() -> TestResult {
    match std::env::var("BR_TEST_KAFKA_BROKERS").ok().filter(|brokers| !brokers.is_empty()) {
        Some(brokers) => two_edges_one_chain_and_a_consumer_crash(&brokers, true).await,
        // Without a broker address there is nothing to run against.
        None => Ok(()),
    }
}

async fn two_edges_one_chain_and_a_consumer_crash(brokers: &str, create_topics: bool) -> TestResult {
    let database = testing::fresh_postgres().await?;
    let signer = ArtifactSigner::new(&[9u8; 32])?;
    let service = AuditLineageServiceImpl::new(database, AuditLineageOptions::new(signer));
    let tenants: Vec<String> = (0..TENANTS).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    let expected = TENANTS * 2 * PER_EDGE_AND_TENANT;

    // The first audit-lineage process: it chains until it is killed.
    let chained = Arc::new(AtomicU64::new(0));
    let first_bus = bus(brokers, create_topics)?;
    let mut first = AuditConsumer::subscribe(&first_bus, service.clone()).await?;
    let first_count = chained.clone();
    let first_process = tokio::spawn(async move {
        loop {
            if let Ok(Handled::Chained) = first.handle_next().await {
                first_count.fetch_add(1, Ordering::SeqCst);
            }
        }
    });

    // Two edges publish at once, each tenant's records interleaved with the other edge's.
    let mut publishers = Vec::new();
    let mut origin: HashMap<String, (String, usize)> = HashMap::new();
    for edge in ["edge-a", "edge-b"] {
        let edge_bus = bus(brokers, create_topics)?;
        let mut records = Vec::new();
        for index in 0..PER_EDGE_AND_TENANT {
            for tenant in &tenants {
                let record = record(tenant, edge, index);
                origin.insert(record.request_id.clone(), (edge.to_string(), index));
                records.push(record);
            }
        }
        publishers.push(tokio::spawn(async move {
            for record in &records {
                publish_record(edge_bus.as_ref(), record).await?;
            }
            Ok::<_, brainstorm_common::bus::BusError>(())
        }));
    }

    // Kill the first consumer mid-load.
    tokio::time::timeout(Duration::from_secs(120), async {
        while chained.load(Ordering::SeqCst) < (expected / 4) as u64 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await?;
    first_process.abort();
    let _aborted = first_process.await;
    drop(first_bus);
    let killed_after = chained.load(Ordering::SeqCst);
    assert!((killed_after as usize) < expected, "the crash must happen mid-load ({killed_after} of {expected} chained)");
    for publisher in publishers {
        publisher.await??;
    }

    // A restarted audit-lineage process takes over the group and finishes. Progress is read from the
    // chains themselves: a record whose commit landed just as the first process died is in its chain
    // and comes back to the second process as a duplicate.
    let second_bus = bus(brokers, create_topics)?;
    let mut second = AuditConsumer::subscribe(&second_bus, service.clone()).await?;
    let second_process = tokio::spawn(async move {
        loop {
            match second.handle_next().await {
                Ok(Handled::Chained | Handled::Duplicate) => {}
                Ok(other) => return Err::<(), String>(format!("unexpected {other:?}")),
                Err(error) => return Err(error.to_string()),
            }
        }
    });
    let chained_rows = |service: AuditLineageServiceImpl, tenants: Vec<String>| async move {
        let mut total = 0;
        for tenant in tenants {
            let report = service.verify_chain(VerifyChainRequest { tenant_id: tenant, max_provenance_checks: Some(0) }).await?;
            total += report.checked;
        }
        Ok::<u64, brainstorm_proto::ServiceError>(total)
    };
    tokio::time::timeout(Duration::from_secs(180), async {
        while chained_rows(service.clone(), tenants.clone()).await? < expected as u64 {
            if second_process.is_finished() {
                return Err("the second consumer stopped".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    })
    .await??;
    // Let anything still in flight arrive: it must all be duplicates.
    tokio::time::sleep(Duration::from_millis(500)).await;
    second_process.abort();

    for tenant in &tenants {
        let report = service.verify_chain(VerifyChainRequest { tenant_id: tenant.clone(), max_provenance_checks: None }).await?;
        assert!(report.valid, "{report:?}");
        assert_eq!(report.checked, (2 * PER_EDGE_AND_TENANT) as u64, "nothing lost, nothing doubled");
        let page = service.export_chain(ExportChainRequest { tenant_id: tenant.clone(), after_sequence: None, limit: Some(1000) }).await?;
        let mut last_index: HashMap<String, usize> = HashMap::new();
        for line in page.lines.iter().skip(1) {
            let row: serde_json::Value = serde_json::from_str(line)?;
            let request_id = row["request_id"].as_str().ok_or("no request id")?;
            let (edge, index) = origin.get(request_id).ok_or("a record nobody published")?;
            if let Some(previous) = last_index.insert(edge.clone(), *index) {
                assert!(previous < *index, "{edge}'s records stay in publish order within the tenant's chain");
            }
        }
        assert_eq!(last_index.len(), 2, "both edges feed the one chain");
    }
    Ok(())
}
