//! The distributed shape on a real Kafka broker (`BR_TEST_KAFKA_BROKERS`, started by
//! `scripts/ensure-kafka.sh`): two edge replicas publish audit records to one bus, the audit-lineage
//! process is killed mid-load and started again, and the tenant's chain ends up complete and valid with
//! nothing lost or doubled; a kill switch set through one edge reaches the other through the bus.
//! Needs the binary built with `--features kafka` (`make test` does).
#![cfg(feature = "kafka")]

use std::time::{Duration, Instant};

use anyhow::Context;
use brainstorm_e2e::{Gateway, Shape};
use reqwest::Method;
use serde_json::{Value, json};

const REQUESTS_BEFORE_CRASH: usize = 12;
const REQUESTS_DURING_OUTAGE: usize = 8;

fn completion(text: &str) -> Value {
    json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}]})
}

async fn complete_on(gateway: &Gateway, base: &str, key: &str, text: &str) -> anyhow::Result<(u16, String)> {
    let response = gateway.client.post(format!("{base}/v1/chat/completions")).bearer_auth(key).json(&completion(text)).send().await?;
    let status = response.status().as_u16();
    let request_id = response.headers().get("x-br-request-id").and_then(|value| value.to_str().ok()).unwrap_or_default().to_string();
    Ok((status, request_id))
}

#[tokio::test]
async fn two_edges_one_chain_over_kafka_survive_an_audit_crash() -> anyhow::Result<()> {
    let brokers = std::env::var("BR_TEST_KAFKA_BROKERS").context("BR_TEST_KAFKA_BROKERS must name a broker (scripts/ensure-kafka.sh)")?;
    let redis_url = std::env::var("BR_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string());
    let mut gateway =
        Gateway::start_with(Shape::Distributed, &[("BR_KAFKA_BROKERS", brokers.as_str()), ("BR_REDIS_URL", redis_url.as_str())]).await?;
    assert_eq!(gateway.edge_urls.len(), 2);
    let (first, second) = (gateway.edge_urls[0].clone(), gateway.edge_urls[1].clone());
    let (key, _) = gateway.register("Kafka").await?;

    let mut request_ids = Vec::new();
    for index in 0..REQUESTS_BEFORE_CRASH {
        let base = if index % 2 == 0 { &first } else { &second };
        let (status, request_id) = complete_on(&gateway, base, &key, &format!("before {index}")).await?;
        assert_eq!(status, 200, "{}", gateway.logs());
        request_ids.push(request_id);
    }
    // The chain writer crashes; the edges keep answering (they hand records to the bus, not to it).
    gateway.kill("audit")?;
    for index in 0..REQUESTS_DURING_OUTAGE {
        let base = if index % 2 == 0 { &second } else { &first };
        let (status, request_id) = complete_on(&gateway, base, &key, &format!("during {index}")).await?;
        assert_eq!(status, 200);
        request_ids.push(request_id);
    }
    gateway.restart("audit").await?;

    // Every record lands once, in one valid chain (the restarted consumer resumes from the group's
    // committed position; a group rebalance may take the broker's session timeout).
    let expected = request_ids.len() as u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    let report = loop {
        let report = gateway.call(Method::GET, "/v1/governance/audit/chain/verify", Some(&key), None).await?;
        if report.body["checked"].as_u64() >= Some(expected) || Instant::now() > deadline {
            break report;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(report.body["valid"], true, "{}", report.text);
    assert_eq!(report.body["checked"].as_u64(), Some(expected), "nothing lost, nothing doubled: {}\n{}", report.text, gateway.logs());
    for request_id in &request_ids {
        let explained = gateway.call(Method::GET, &format!("/v1/explain/{request_id}"), Some(&key), None).await?;
        assert_eq!(explained.status, 200, "{request_id}: {}", explained.text);
    }

    // A kill switch set through one edge reaches the other through policy events on the bus.
    let activated = gateway
        .client
        .post(format!("{first}/v1/killswitch/activate"))
        .bearer_auth(&key)
        .json(&json!({"reason": "kafka drill"}))
        .send()
        .await?;
    assert_eq!(activated.status().as_u16(), 200);
    let mut statuses = Vec::new();
    for _ in 0..40 {
        statuses.push(complete_on(&gateway, &second, &key, "blocked?").await?.0);
        if statuses.last() == Some(&503) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(statuses.last(), Some(&503), "{statuses:?}");
    Ok(())
}
