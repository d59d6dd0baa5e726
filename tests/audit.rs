//! Audit evidence end to end in both shapes: every completion (allowed or denied) carries evidence
//! headers and lands in the tenant's hash chain, which verifies; explain, lineage, artifacts, inventory
//! and replays answer for it; an exported chain verifies offline with `brainstorm audit verify`.

use std::time::Duration;

use brainstorm_e2e::{Gateway, Shape};
use reqwest::Method;
use serde_json::{Value, json};

type TestResult = anyhow::Result<()>;

brainstorm_e2e::in_both_shapes!(completions_are_chained_and_explained);

async fn completions_are_chained_and_explained(shape: Shape) -> TestResult {
    let gateway = Gateway::start(shape).await?;
    let (key, _) = gateway.register("Audited").await?;
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let allowed = gateway
        .request(Method::POST, "/v1/chat/completions", Some(&key))
        .header("traceparent", traceparent)
        .header("x-br-agent-id", "researcher")
        .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "audit me"}]}))
        .send()
        .await?;
    assert_eq!(allowed.status().as_u16(), 200);
    let header = |name: &str| allowed.headers().get(name).and_then(|value| value.to_str().ok()).map(str::to_string);
    let request_id = header("x-br-request-id").unwrap_or_default();
    let commitment = header("x-br-audit-hash").unwrap_or_default();
    assert_eq!(commitment.len(), 64, "a SHA-256 commitment");
    assert_eq!(header("x-br-explain"), Some(request_id.clone()));
    assert_eq!(header("x-br-evidence-coverage").as_deref(), Some("captured"));
    assert!(header("traceparent").is_some_and(|value| value.contains("0af7651916cd43dd8448eb211c80319c")), "the trace continues");

    // A denial is evidence too.
    let denied = gateway.call(Method::POST, "/v1/chat/completions", Some(&key), Some(json!({"model": "m", "messages": []}))).await?;
    assert_eq!(denied.status, 400);
    assert!(denied.header("x-br-audit-hash").is_some());

    let mut report = Value::Null;
    for _ in 0..100 {
        report = gateway.call(Method::GET, "/v1/governance/audit/chain/verify", Some(&key), None).await?.body;
        if report["checked"].as_u64() == Some(2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(report["valid"], true, "{report}");
    assert_eq!(report["checked"], 2, "{report}");

    let explain = gateway.call(Method::GET, &format!("/v1/explain/{request_id}"), Some(&key), None).await?;
    assert_eq!(explain.status, 200, "{}", explain.text);
    assert!(explain.text.contains("brainstorm/sandbox"), "{}", explain.text);
    let lineage = gateway.call(Method::GET, &format!("/v1/governance/lineage/{request_id}"), Some(&key), None).await?;
    assert_eq!(lineage.status, 200, "{}", lineage.text);
    assert!(lineage.text.contains(&commitment) || lineage.text.contains("0af7651916cd43dd8448eb211c80319c"), "{}", lineage.text);
    let episode = gateway.call(Method::GET, "/v1/governance/lineage?trace_id=0af7651916cd43dd8448eb211c80319c", Some(&key), None).await?;
    assert_eq!(episode.status, 200, "{}", episode.text);
    assert_eq!(gateway.call(Method::GET, "/v1/governance/lineage", Some(&key), None).await?.status, 400);
    let artifact = gateway.call(Method::GET, &format!("/v1/governance/artifacts/{request_id}"), Some(&key), None).await?;
    assert_eq!(artifact.status, 200, "{}", artifact.text);
    assert!(artifact.text.contains("signature"), "{}", artifact.text);
    assert_eq!(gateway.call(Method::GET, "/v1/governance/artifact-key", Some(&key), None).await?.status, 200);
    let inventory = gateway.call(Method::GET, "/v1/governance/agents/inventory?period=day", Some(&key), None).await?;
    assert_eq!(inventory.status, 200, "{}", inventory.text);
    assert!(inventory.text.contains("researcher"), "{}", inventory.text);
    let decisions = gateway.call(Method::GET, "/v1/replays/decisions", Some(&key), None).await?;
    assert_eq!(decisions.status, 200, "{}", decisions.text);
    let simulated = gateway.call(Method::POST, "/v1/replays/simulate", Some(&key), Some(json!({"strategy": "price"}))).await?;
    assert_eq!(simulated.status, 200, "{}", simulated.text);
    assert_eq!(gateway.call(Method::GET, "/v1/replays/compare", Some(&key), None).await?.status, 200);
    assert_eq!(gateway.call(Method::GET, "/v1/explain/req_unknown", Some(&key), None).await?.status, 404);
    // An auditor reads governance; a developer does not.
    let developer = gateway.call(Method::POST, "/v1/api-keys", Some(&key), Some(json!({"role": "developer"}))).await?;
    let developer = developer.body["api_key"]["key"].as_str().unwrap_or_default().to_string();
    assert_eq!(gateway.call(Method::GET, "/v1/governance/audit/chain/verify", Some(&developer), None).await?.status, 403);
    Ok(())
}
