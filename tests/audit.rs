//! Audit evidence end to end in both shapes: every completion (allowed or denied) carries evidence
//! headers and lands in the tenant's hash chain, which verifies; explain, lineage, artifacts, inventory
//! and replays answer for it; an exported chain verifies offline with `brainstorm audit verify`.

use std::time::Duration;

use brainstorm_e2e::{Gateway, Shape, run_to_end};
use reqwest::Method;
use serde_json::{Value, json};

type TestResult = anyhow::Result<()>;

brainstorm_e2e::in_both_shapes!(
    completions_are_chained_and_explained,
    refusals_at_the_door_are_chained_too,
    mesh_hops_are_answered_and_inventoried
);

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
    assert_eq!((header("x-br-agent-id").as_deref(), header("x-br-agent-assertion").as_deref()), (Some("researcher"), Some("unregistered")));

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
    // The spec's shape: per-row `provenanceChecks[]`; the chain's anchor and head.
    assert_eq!(report["provenanceChecks"].as_array().map(Vec::len), Some(2), "{report}");
    let checks = report["provenanceChecks"].as_array().cloned().unwrap_or_default();
    assert!(checks.iter().any(|check| check["request_id"] == request_id.as_str()), "{report}");
    assert_eq!(report["head"]["sequence"], 2, "{report}");
    assert_eq!(report["head"]["hash"].as_str().map(str::len), Some(64), "{report}");

    let explain = gateway.call(Method::GET, &format!("/v1/explain/{request_id}"), Some(&key), None).await?;
    assert_eq!(explain.status, 200, "{}", explain.text);
    assert!(explain.text.contains("brainstorm/sandbox"), "{}", explain.text);
    // Money in USD and the score as 0-1, as every other answer has them, beside the exact integers.
    assert_eq!(explain.body["cost_usd"].as_f64(), Some(explain.body["cost_nanos"].as_f64().unwrap_or(-1.0) / 1e9), "{}", explain.text);
    assert_eq!(explain.body["score"].as_f64(), Some(explain.body["score_micros"].as_f64().unwrap_or(-1.0) / 1e6), "{}", explain.text);
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
    // `asserted[]`: agent ids presented by header rather than proven, as a list.
    let asserted = inventory.body["asserted"].as_array().cloned().unwrap_or_default();
    assert!(asserted.iter().any(|agent| agent["agent_id"] == "researcher" && agent["sources"][0] == "header"), "{}", inventory.text);
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

    // The exported chain verifies offline; an edited copy does not.
    let export = gateway.call(Method::GET, "/v1/governance/audit/chain/export", Some(&key), None).await?;
    assert_eq!(export.status, 200, "{}", export.text);
    assert_eq!(export.text.lines().count(), 3, "a header and two records: {}", export.text);
    let file = gateway.work_dir.join("chain.jsonl");
    std::fs::write(&file, &export.text)?;
    let (intact, output) = run_to_end(&["audit", "verify", &file.display().to_string()], &[], &gateway.work_dir)?;
    assert!(intact, "{output}");
    assert!(export.text.contains("gpt-4o-mini"), "the records name the model asked for: {}", export.text);
    std::fs::write(&file, export.text.replacen("gpt-4o-mini", "gpt-4o-nano", 1))?;
    let (tampered, output) = run_to_end(&["audit", "verify", &file.display().to_string()], &[], &gateway.work_dir)?;
    assert!(!tampered, "an edited export must fail: {output}");
    Ok(())
}

/// An agent calling on another's behalf (`X-BR-Mesh-*`): the answer carries the headers its next
/// hop sends on, a changed body or a loop is refused, and the inventory lists the calling identity.
async fn mesh_hops_are_answered_and_inventoried(shape: Shape) -> TestResult {
    let gateway = Gateway::start(shape).await?;
    let (key, _) = gateway.register("Meshed").await?;
    let body = serde_json::to_vec(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hop"}]}))?;
    let hash: String = ring::digest::digest(&ring::digest::SHA256, &body).as_ref().iter().map(|byte| format!("{byte:02x}")).collect();
    let send = |headers: Vec<(&'static str, String)>, body: Vec<u8>| {
        let mut request =
            gateway.request(Method::POST, "/v1/chat/completions", Some(&key)).header("content-type", "application/json").body(body);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        request.send()
    };
    let source = ("x-br-mesh-source", "spiffe://corp/agent/planner".to_string());
    let hopped = send(
        vec![source.clone(), ("x-br-mesh-hop-count", "2".to_string()), ("x-br-mesh-payload-hash", format!("sha256:{hash}"))],
        body.clone(),
    )
    .await?;
    assert_eq!(hopped.status().as_u16(), 200);
    let header = |name: &str| hopped.headers().get(name).and_then(|value| value.to_str().ok()).unwrap_or_default().to_string();
    assert_eq!(header("x-br-mesh-source"), "spiffe://corp/agent/planner");
    assert_eq!(header("x-br-mesh-hop-count"), "3", "the hop count with this hop");
    assert_eq!(header("x-br-mesh-payload-hash"), format!("sha256:{hash}"));
    // No mesh trace sent: the request's own trace, for the next hop to carry.
    assert!(header("traceparent").contains(&header("x-br-mesh-trace-id")) && header("x-br-mesh-trace-id").len() == 32);

    // The body changed on the way (its hash is another's), a loop, a hop without its source: refused.
    let mut changed = body.clone();
    changed.extend_from_slice(b" ");
    let tampered = send(vec![source.clone(), ("x-br-mesh-payload-hash", hash.clone())], changed).await?;
    assert_eq!(tampered.status().as_u16(), 400);
    assert_eq!(tampered.json::<Value>().await?["error"]["code"], "mesh_payload_mismatch");
    let looping = send(vec![source.clone(), ("x-br-mesh-hop-count", "16".to_string())], body.clone()).await?;
    assert_eq!(looping.json::<Value>().await?["error"]["code"], "mesh_hop_limit");
    let orphan = send(vec![("x-br-mesh-hop-count", "1".to_string())], body.clone()).await?;
    assert_eq!(orphan.json::<Value>().await?["error"]["code"], "invalid_mesh_header");

    // The inventory's mesh class: the identity, its requests and the deepest hop seen.
    let mut mesh = Value::Null;
    for _ in 0..100 {
        let inventory = gateway.call(Method::GET, "/v1/governance/agents/inventory?period=day", Some(&key), None).await?;
        assert_eq!(inventory.status, 200, "{}", inventory.text);
        mesh = inventory.body["mesh"].clone();
        if inventory.body["summary"]["mesh_identities"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(mesh[0]["identity"], "spiffe://corp/agent/planner", "{mesh}");
    assert_eq!((mesh[0]["requests"].as_u64(), mesh[0]["max_hop_count"].as_i64()), (Some(1), Some(3)), "{mesh}");
    Ok(())
}

/// Refusals before the pipeline runs are evidence as well: an unknown key (the platform chain), a
/// missing permission, an unreadable body and the tenant kill switch (the tenant's chain).
async fn refusals_at_the_door_are_chained_too(shape: Shape) -> TestResult {
    let gateway = Gateway::start(shape).await?;
    let (key, _) = gateway.register("Door").await?;
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});

    let unknown = gateway.call(Method::POST, "/v1/chat/completions", Some("br_live_not_a_key_0000000000"), Some(body.clone())).await?;
    assert_eq!(unknown.status, 401, "{}", unknown.text);
    assert_eq!(unknown.header("x-br-audit-hash").map(str::len), Some(64), "an unknown key is refused on the record");
    let admin = brainstorm_e2e::PLATFORM_ADMIN_KEY;
    let mut platform = Value::Null;
    for _ in 0..100 {
        platform = gateway.call(Method::GET, "/v1/governance/audit/chain/verify", Some(admin), None).await?.body;
        if platform["checked"].as_u64() >= Some(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(platform["valid"], true, "{platform}");
    assert!(platform["checked"].as_u64() >= Some(1), "{platform}");

    let auditor = gateway.call(Method::POST, "/v1/api-keys", Some(&key), Some(json!({"role": "auditor"}))).await?;
    let auditor = auditor.body["api_key"]["key"].as_str().unwrap_or_default().to_string();
    let forbidden = gateway.call(Method::POST, "/v1/chat/completions", Some(&auditor), Some(body.clone())).await?;
    assert_eq!(forbidden.status, 403, "{}", forbidden.text);
    assert!(forbidden.header("x-br-audit-hash").is_some());
    let garbled = gateway
        .request(Method::POST, "/v1/messages", Some(&key))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await?;
    assert_eq!(garbled.status().as_u16(), 400);
    assert!(garbled.headers().get("x-br-audit-hash").is_some());

    let activated = gateway.call(Method::POST, "/v1/killswitch/activate", Some(&key), Some(json!({"reason": "door test"}))).await?;
    assert_eq!(activated.status, 200);
    let switched = gateway.call(Method::POST, "/v1/chat/completions", Some(&key), Some(body)).await?;
    assert_eq!(switched.status, 503, "{}", switched.text);
    let request_id = switched.header("x-br-request-id").unwrap_or_default().to_string();
    assert!(switched.header("x-br-audit-hash").is_some());
    // Other routes' refusals at the door are evidence too.
    let account = gateway.call(Method::GET, "/v1/account", Some(&key), None).await?;
    assert_eq!(account.status, 503, "{}", account.text);
    assert!(account.header("x-br-audit-hash").is_some(), "a kill-switch refusal of any route is recorded");
    let stranger = gateway.call(Method::GET, "/v1/account", Some("br_live_not_a_key_0000000000"), None).await?;
    assert_eq!(stranger.status, 401);
    assert!(stranger.header("x-br-audit-hash").is_some());

    // Four refusals in the tenant's chain, the kill switch's with its reason code.
    let mut report = Value::Null;
    for _ in 0..100 {
        report = gateway.call(Method::GET, "/v1/governance/audit/chain/verify", Some(&key), None).await?.body;
        if report["checked"].as_u64() >= Some(4) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(report["valid"], true, "{report}");
    assert_eq!(report["checked"], 4, "{report}");
    let lineage = gateway.call(Method::GET, &format!("/v1/governance/lineage/{request_id}"), Some(&key), None).await?;
    assert_eq!(lineage.status, 200, "{}", lineage.text);
    assert_eq!(lineage.body["policy_context"]["reason_code"], "kill_switch_active", "{}", lineage.text);
    Ok(())
}
