//! Liaison binding contracts end to end in both shapes: sessions opened and closed, plans minted
//! under the spec's grant rules and signed, completions committing them (the faithful one answered,
//! each breach refused with its reason and recorded as a denied audit row, a plan committed once),
//! variant pinning, sandbox plans, streamed commits, and the session's SSE event stream read live and
//! to its end, its trace envelope naming the committed request's audit commitment.

use std::time::Duration;

use brainstorm_e2e::{Gateway, Reply, Shape};
use brainstorm_mock_upstream::{MockConfig, MockUpstream};
use futures::StreamExt;
use reqwest::Method;
use serde_json::{Value, json};

type TestResult = anyhow::Result<()>;

brainstorm_e2e::in_both_shapes!(
    plans_are_minted_under_their_grant_rules_and_committed_once,
    sandbox_plans_commit_the_sandbox_until_a_key_is_added,
    a_session_streams_its_events_and_closes_with_a_summary,
);

const OPENAI_KEY: &str = "sk-liaison-test-0123456789abcdefghijklmn";
const PROMPT: &str = "Summarise the incident report in one line.";

fn code(reply: &Reply) -> &str {
    reply.body["error"]["code"].as_str().unwrap_or_default()
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_string()
}

async fn with_openai(shape: Shape) -> anyhow::Result<(Gateway, MockUpstream, String)> {
    let mock = MockUpstream::start(MockConfig { valid_keys: vec![OPENAI_KEY.to_string()], ..MockConfig::default() }).await?;
    let openai_base = format!("{}/v1", mock.base_url());
    let gateway = Gateway::start_with(shape, &[("BR_PROVIDER_OPENAI_BASE_URL", openai_base.as_str())]).await?;
    let (key, _) = gateway.register("Liaison").await?;
    let reply = gateway.call(Method::POST, "/v1/providers", Some(&key), Some(json!({"provider": "openai", "api_key": OPENAI_KEY}))).await?;
    anyhow::ensure!(reply.status == 201, "registering openai: {} {}", reply.status, reply.text);
    Ok((gateway, mock, key))
}

async fn open(gateway: &Gateway, key: &str) -> anyhow::Result<String> {
    let opened = gateway.call(Method::POST, "/v1/liaison/open", Some(key), Some(json!({"label": "incident triage"}))).await?;
    assert_eq!(opened.status, 201, "{}", opened.text);
    Ok(text(&opened.body["liaison_id"]))
}

async fn mint(gateway: &Gateway, key: &str, liaison: &str, plan: Value) -> anyhow::Result<Reply> {
    gateway.call(Method::POST, &format!("/v1/liaison/{liaison}/plan"), Some(key), Some(plan)).await
}

fn messages(prompt: &str) -> Value {
    json!([{"role": "system", "content": "You are terse."}, {"role": "user", "content": prompt}])
}

/// A completion carrying a plan's headers (either may be left out with `None`).
async fn commit(gateway: &Gateway, key: &str, plan_id: Option<&str>, liaison: Option<&str>, body: &Value) -> anyhow::Result<Reply> {
    let mut request = gateway.request(Method::POST, "/v1/chat/completions", Some(key)).json(body);
    if let Some(plan_id) = plan_id {
        request = request.header("x-br-plan-id", plan_id);
    }
    if let Some(liaison) = liaison {
        request = request.header("x-br-liaison", liaison);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await?;
    Ok(Reply { status, body: serde_json::from_str(&text).unwrap_or(Value::Null), text, headers })
}

fn completion(model: Option<&str>, prompt: &str) -> Value {
    let mut body = json!({"messages": messages(prompt)});
    if let Some(model) = model {
        body["model"] = json!(model);
    }
    body
}

/// The explained record of a request once the chain holds it.
async fn explained(gateway: &Gateway, key: &str, request_id: &str) -> anyhow::Result<Value> {
    for _ in 0..100 {
        let reply = gateway.call(Method::GET, &format!("/v1/explain/{request_id}"), Some(key), None).await?;
        if reply.status == 200 {
            return Ok(reply.body);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!("{request_id} was never explained")
}

async fn plans_are_minted_under_their_grant_rules_and_committed_once(shape: Shape) -> TestResult {
    let (gateway, _mock, key) = with_openai(shape).await?;
    let liaison = open(&gateway, &key).await?;
    assert!(liaison.starts_with("lia_") && liaison.contains('.'), "{liaison}");

    // Minting: the envelope, signed, priced, with the spec's defaults.
    let minted = mint(
        &gateway,
        &key,
        &liaison,
        json!({"messages": messages(PROMPT), "model": "openai/gpt-4o-mini", "max_tokens": 50, "allowed_tools": ["search_*"]}),
    )
    .await?;
    assert_eq!(minted.status, 201, "{}", minted.text);
    let plan = &minted.body;
    let plan_id = text(&plan["plan_id"]);
    assert_eq!((plan["v"].as_u64(), plan["model"].as_str()), (Some(2), Some("openai/gpt-4o-mini")), "{plan}");
    assert_eq!(plan["allowed_models"], json!(["openai/gpt-4o-mini"]), "omitted: only the minted model");
    assert_eq!((plan["ttl_seconds"].as_i64(), plan["max_tokens"].as_i64()), (Some(60), Some(50)));
    let (estimate, ceiling) = (plan["estimated_cost_usd"].as_f64().unwrap_or(0.0), plan["ceiling_usd"].as_f64().unwrap_or(0.0));
    assert!(estimate > 0.0 && (ceiling / estimate - 1.10).abs() < 0.01, "ceiling = estimate * 1.10: {plan}");
    assert_eq!(plan["x402_compat"]["currency"], "USD");
    assert_eq!(plan["x402_compat"]["amount"].as_str().and_then(|amount| amount.parse::<f64>().ok()), Some(ceiling));
    assert_eq!((plan["prompt_fingerprint"].as_str().map(str::len), plan["tenant_id"].is_string()), (Some(64), true));
    assert!(plan["signature"].as_str().is_some_and(|signature| signature.len() >= 43), "{plan}");
    // The grant: named by what it allows, the same for every plan of that scope.
    let grant_id = text(&plan["grant_id"]);
    assert!(grant_id.starts_with("grant_") && grant_id.len() == 30, "{plan}");

    // The grant rules, each refusal named.
    let base = json!({"messages": messages(PROMPT), "model": "openai/gpt-4o-mini"});
    let refused = [
        (json!({"allowed_models": []}), 400, "allowed_models_empty"),
        (json!({"allowed_models": ["*", "openai/gpt-4o"]}), 400, "invalid_allowed_models"),
        (json!({"allowed_models": ["openai/no-such-model"]}), 400, "unknown_allowed_model"),
        (json!({"model": "openai/gpt-4o-mini:fast", "allowed_models": ["openai/gpt-4o-mini"]}), 409, "plan_grant_inconsistent"),
        (json!({"max_cost_usd": 0.0000001}), 402, "ceiling_exceeds_max"),
        (json!({"ttl_seconds": 301}), 400, "invalid_ttl"),
        (json!({"max_tokens": 0}), 400, "invalid_max_tokens"),
        (json!({"max_tokens": 128_001}), 400, "invalid_max_tokens"),
        (json!({"messages": null}), 400, "missing_field"),
        (json!({"allowed_modles": ["*"]}), 400, "invalid_body"),
    ];
    for (change, status, expected) in refused {
        let mut body = base.clone();
        if let (Some(members), Some(changes)) = (body.as_object_mut(), change.as_object()) {
            for (name, value) in changes {
                // A null removes the member.
                if value.is_null() {
                    members.remove(name);
                } else {
                    members.insert(name.clone(), value.clone());
                }
            }
        }
        let reply = mint(&gateway, &key, &liaison, body).await?;
        assert_eq!((reply.status, code(&reply)), (status, expected), "{change}: {}", reply.text);
    }
    let canonical = mint(
        &gateway,
        &key,
        &liaison,
        json!({"messages": messages(PROMPT), "model": "gpt-4o-mini", "allowed_models": ["OpenAI/GPT-4o-mini", "openai/gpt-4o"]}),
    )
    .await?;
    assert_eq!(canonical.body["allowed_models"], json!(["openai/gpt-4o-mini", "openai/gpt-4o"]), "{}", canonical.text);
    let forged = format!("{}x", &liaison[..liaison.len() - 1]);
    assert_eq!(mint(&gateway, &key, &forged, base.clone()).await?.status, 404, "a forged session id is no session");

    // Committing: both headers or neither.
    let faithful = json!({"model": "openai/gpt-4o-mini", "messages": messages(PROMPT),
        "tools": [{"type": "function", "function": {"name": "search_docs", "parameters": {"type": "object"}}}]});
    let half = commit(&gateway, &key, Some(&plan_id), None, &faithful).await?;
    assert_eq!((half.status, code(&half)), (400, "plan_headers_incomplete"), "{}", half.text);
    // Each breach is refused with its reason, recorded as a denied audit row, and leaves the plan committable.
    let breaches = [
        (json!({"model": "openai/gpt-4o", "messages": messages(PROMPT)}), 403, "model_outside_grant"),
        (
            json!({"model": "openai/gpt-4o-mini", "messages": messages(PROMPT), "tools": [{"type": "function", "function": {"name": "shell"}}]}),
            403,
            "tool_outside_grant",
        ),
        (json!({"model": "openai/gpt-4o-mini", "messages": messages(PROMPT), "max_tokens": 4000}), 403, "ceiling_exceeded"),
    ];
    for (body, status, reason) in breaches {
        let reply = commit(&gateway, &key, Some(&plan_id), Some(&liaison), &body).await?;
        assert_eq!((reply.status, code(&reply)), (status, "plan_scope_exceeded"), "{reason}: {}", reply.text);
        assert_eq!(
            (reply.body["error"]["type"].as_str(), reply.body["error"]["reason"].as_str()),
            (Some("permission_error"), Some(reason))
        );
        assert_eq!(reply.body["recovery"]["action"], "renegotiate", "{}", reply.text);
        assert_eq!(reply.body["recovery"]["reason"], reason);
        assert_eq!(reply.body["recovery"]["endpoint"], format!("/v1/liaison/{liaison}/plan"));
        assert_eq!(reply.header("x-br-grant-id"), Some(grant_id.as_str()), "the grant breached: {:?}", reply.headers);
        let request_id = reply.header("x-br-explain").unwrap_or_default().to_string();
        let record = explained(&gateway, &key, &request_id).await?;
        assert!(record.to_string().contains("\"denied\"") && record.to_string().contains("plan_scope_exceeded"), "{record}");
    }
    let reworded =
        commit(&gateway, &key, Some(&plan_id), Some(&liaison), &completion(Some("openai/gpt-4o-mini"), "Something else")).await?;
    assert_eq!((reworded.status, code(&reworded)), (400, "plan_fingerprint_mismatch"), "{}", reworded.text);
    let wrong_session = commit(&gateway, &key, Some(&plan_id), Some(&forged), &faithful).await?;
    assert_eq!((wrong_session.status, code(&wrong_session)), (403, "liaison_invalid"), "{}", wrong_session.text);

    // The faithful completion commits it, once.
    let committed = commit(&gateway, &key, Some(&plan_id), Some(&liaison), &faithful).await?;
    assert_eq!(committed.status, 200, "{}", committed.text);
    assert_eq!(committed.header("x-br-routed-model"), Some("openai/gpt-4o-mini"));
    assert!(committed.header("x-br-route-reason").is_some_and(|reason| reason.contains(&plan_id)), "{:?}", committed.headers);
    // The plan it committed, and that plan's ceiling in USD.
    assert_eq!(committed.header("x-br-plan-id"), Some(plan_id.as_str()));
    let shown_ceiling = committed.header("x-br-plan-ceiling").and_then(|value| value.parse::<f64>().ok()).unwrap_or_default();
    assert!((shown_ceiling - ceiling).abs() < 1e-6, "{shown_ceiling} against the plan's {ceiling}");
    // The grant it ran under, in the answer and in the evidence's WHY answer.
    assert_eq!(committed.header("x-br-grant-id"), Some(grant_id.as_str()));
    let committed_id = committed.header("x-br-explain").unwrap_or_default().to_string();
    explained(&gateway, &key, &committed_id).await?;
    let lineage = gateway.call(Method::GET, &format!("/v1/governance/lineage/{committed_id}"), Some(&key), None).await?;
    assert_eq!(lineage.status, 200, "{}", lineage.text);
    assert_eq!(lineage.body["grant_context"]["grant_id"], grant_id.as_str(), "{}", lineage.text);
    assert_eq!(lineage.body["grant_context"]["plan_id"], plan_id.as_str(), "{}", lineage.text);
    let again = commit(&gateway, &key, Some(&plan_id), Some(&liaison), &faithful).await?;
    assert_eq!((again.status, code(&again)), (409, "plan_already_committed"), "{}", again.text);
    assert_eq!(again.body["recovery"]["action"], "renegotiate");

    // A pinned variant: the base model fails the fingerprint; the variant commits.
    let pinned = mint(&gateway, &key, &liaison, json!({"messages": messages(PROMPT), "model": "openai/gpt-4o-mini:fast"})).await?;
    assert_eq!((pinned.status, pinned.body["model"].as_str()), (201, Some("openai/gpt-4o-mini:fast")), "{}", pinned.text);
    assert_eq!(pinned.body["allowed_models"], json!(["openai/gpt-4o-mini:fast"]));
    let pinned_id = text(&pinned.body["plan_id"]);
    let base_model = commit(&gateway, &key, Some(&pinned_id), Some(&liaison), &completion(Some("openai/gpt-4o-mini"), PROMPT)).await?;
    assert_eq!((base_model.status, code(&base_model)), (400, "plan_fingerprint_mismatch"), "{}", base_model.text);
    let variant = commit(&gateway, &key, Some(&pinned_id), Some(&liaison), &completion(Some("openai/gpt-4o-mini:fast"), PROMPT)).await?;
    assert_eq!(variant.status, 200, "{}", variant.text);

    // `*` grants any model within the ceiling (a pricier one breaks it); the body may also omit the
    // model: the plan's own then.
    let any =
        mint(&gateway, &key, &liaison, json!({"messages": messages(PROMPT), "model": "openai/gpt-4o", "allowed_models": ["*"]})).await?;
    assert_eq!(any.body["allowed_models"], json!(["*"]), "{}", any.text);
    let any_id = text(&any.body["plan_id"]);
    let cheaper = commit(&gateway, &key, Some(&any_id), Some(&liaison), &completion(Some("openai/gpt-4o-mini"), PROMPT)).await?;
    assert_eq!((cheaper.status, cheaper.header("x-br-routed-model")), (200, Some("openai/gpt-4o-mini")), "{}", cheaper.text);
    let cheap =
        mint(&gateway, &key, &liaison, json!({"messages": messages(PROMPT), "model": "openai/gpt-4o-mini", "allowed_models": ["*"]}))
            .await?;
    let pricier =
        commit(&gateway, &key, Some(&text(&cheap.body["plan_id"])), Some(&liaison), &completion(Some("openai/gpt-4o"), PROMPT)).await?;
    assert_eq!((pricier.status, pricier.body["error"]["reason"].as_str()), (403, Some("ceiling_exceeded")), "{}", pricier.text);
    let omitted = mint(&gateway, &key, &liaison, json!({"messages": messages(PROMPT), "model": "openai/gpt-4o-mini"})).await?;
    let omitted_reply = commit(&gateway, &key, Some(&text(&omitted.body["plan_id"])), Some(&liaison), &completion(None, PROMPT)).await?;
    assert_eq!(
        (omitted_reply.status, omitted_reply.header("x-br-routed-model")),
        (200, Some("openai/gpt-4o-mini")),
        "{}",
        omitted_reply.text
    );

    // A plan lapses with its time to live.
    let short =
        mint(&gateway, &key, &liaison, json!({"messages": messages(PROMPT), "model": "openai/gpt-4o-mini", "ttl_seconds": 1})).await?;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let late = commit(&gateway, &key, Some(&text(&short.body["plan_id"])), Some(&liaison), &completion(Some("openai/gpt-4o-mini"), PROMPT))
        .await?;
    assert_eq!((late.status, code(&late)), (403, "plan_expired"), "{}", late.text);

    // Another tenant sees no such session.
    let (stranger, _) = gateway.register("Stranger").await?;
    assert_eq!(gateway.call(Method::GET, &format!("/v1/liaison/{liaison}"), Some(&stranger), None).await?.status, 404);
    let session = gateway.call(Method::GET, &format!("/v1/liaison/{liaison}"), Some(&key), None).await?;
    assert_eq!(session.body["cost_summary"]["plans_committed"], 4, "{}", session.text);
    assert_eq!(session.body["cost_summary"]["denials"], 6, "{}", session.text);
    Ok(())
}

async fn sandbox_plans_commit_the_sandbox_until_a_key_is_added(shape: Shape) -> TestResult {
    let (gateway, _mock, _) = with_openai(shape).await?;
    let (key, _) = gateway.register("Sandboxed").await?;
    let liaison = open(&gateway, &key).await?;
    let minted = mint(&gateway, &key, &liaison, json!({"messages": messages(PROMPT)})).await?;
    assert_eq!(minted.status, 201, "{}", minted.text);
    assert_eq!((minted.body["model"].as_str(), minted.body["estimated_cost_usd"].as_f64()), (Some("brainstorm/sandbox"), Some(0.0)));
    assert_eq!(minted.body["allowed_models"], json!(["brainstorm/sandbox"]));
    let plan_id = text(&minted.body["plan_id"]);
    let named = commit(&gateway, &key, Some(&plan_id), Some(&liaison), &completion(Some("openai/gpt-4o-mini"), PROMPT)).await?;
    assert_eq!((named.status, code(&named)), (400, "plan_fingerprint_mismatch"), "{}", named.text);
    let answered = commit(&gateway, &key, Some(&plan_id), Some(&liaison), &completion(None, PROMPT)).await?;
    assert_eq!(answered.status, 200, "{}", answered.text);

    // A second sandbox plan is void once the tenant adds a provider key.
    let second = mint(&gateway, &key, &liaison, json!({"messages": messages(PROMPT), "model": "brainstorm/sandbox"})).await?;
    assert_eq!(second.status, 201, "{}", second.text);
    let registered =
        gateway.call(Method::POST, "/v1/providers", Some(&key), Some(json!({"provider": "openai", "api_key": OPENAI_KEY}))).await?;
    assert_eq!(registered.status, 201, "{}", registered.text);
    let mut void = Reply { status: 0, body: Value::Null, text: String::new(), headers: Default::default() };
    for _ in 0..50 {
        void =
            commit(&gateway, &key, Some(&text(&second.body["plan_id"])), Some(&liaison), &completion(Some("brainstorm/sandbox"), PROMPT))
                .await?;
        if void.status == 403 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!((void.status, void.body["error"]["reason"].as_str()), (403, Some("sandbox_plan_void")), "{}", void.text);
    Ok(())
}

/// Reads a server-sent event stream until `until` holds for the text so far (or ten seconds pass).
async fn read_events(response: reqwest::Response, until: impl Fn(&str) -> bool) -> anyhow::Result<String> {
    let mut text = String::new();
    let mut chunks = response.bytes_stream();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !until(&text) {
        match tokio::time::timeout_at(deadline, chunks.next()).await {
            Ok(Some(chunk)) => text.push_str(&String::from_utf8_lossy(&chunk?)),
            Ok(None) | Err(_) => break,
        }
    }
    Ok(text)
}

/// Each event of a stream's text: its kind and data.
fn parsed_events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter_map(|block| {
            let kind = block.lines().find_map(|line| line.strip_prefix("event: "))?;
            let data = block.lines().find_map(|line| line.strip_prefix("data: "))?;
            Some((kind.to_string(), serde_json::from_str(data).unwrap_or(Value::Null)))
        })
        .collect()
}

async fn a_session_streams_its_events_and_closes_with_a_summary(shape: Shape) -> TestResult {
    let (mut gateway, _mock, key) = with_openai(shape).await?;
    let liaison = open(&gateway, &key).await?;
    let unknown = gateway.request(Method::GET, "/v1/liaison/lia_00.AAAA/events", Some(&key)).send().await?;
    assert_eq!(unknown.status().as_u16(), 404);

    // A stream opened before anything is committed sees the commit as it happens.
    let live = gateway.request(Method::GET, &format!("/v1/liaison/{liaison}/events"), Some(&key)).send().await?;
    assert_eq!(live.status().as_u16(), 200);
    assert!(live.headers().get("content-type").is_some_and(|value| value.as_bytes().starts_with(b"text/event-stream")));
    let reader = tokio::spawn(read_events(live, |text| text.contains("event: trace.envelope")));
    let minted = mint(&gateway, &key, &liaison, json!({"messages": messages(PROMPT), "model": "openai/gpt-4o-mini"})).await?;
    let plan_id = text(&minted.body["plan_id"]);
    let denied = commit(&gateway, &key, Some(&plan_id), Some(&liaison), &completion(Some("openai/gpt-4o"), PROMPT)).await?;
    assert_eq!(denied.status, 403, "{}", denied.text);
    let committed = commit(&gateway, &key, Some(&plan_id), Some(&liaison), &completion(Some("openai/gpt-4o-mini"), PROMPT)).await?;
    assert_eq!(committed.status, 200, "{}", committed.text);
    let commitment = committed.header("x-br-audit-hash").unwrap_or_default().to_string();
    let request_id = committed.header("x-br-explain").unwrap_or_default().to_string();
    let seen = reader.await??;
    let kinds: Vec<String> = parsed_events(&seen).into_iter().map(|(kind, _)| kind).collect();
    assert_eq!(kinds, ["liaison.opened", "plan.minted", "plan.denied", "routing.decision", "trace.envelope"], "{seen}");

    // A streamed completion commits its plan when the stream ends.
    let streamed_plan = mint(&gateway, &key, &liaison, json!({"messages": messages(PROMPT), "model": "openai/gpt-4o-mini"})).await?;
    let mut streamed = completion(Some("openai/gpt-4o-mini"), PROMPT);
    streamed["stream"] = json!(true);
    let stream_reply = commit(&gateway, &key, Some(&text(&streamed_plan.body["plan_id"])), Some(&liaison), &streamed).await?;
    assert_eq!(stream_reply.status, 200, "{}", stream_reply.text);
    assert!(stream_reply.text.contains("[DONE]"), "{}", stream_reply.text);
    let mut summary = Value::Null;
    for _ in 0..100 {
        summary = gateway.call(Method::GET, &format!("/v1/liaison/{liaison}"), Some(&key), None).await?.body;
        if summary["cost_summary"]["plans_committed"] == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(summary["cost_summary"]["plans_committed"], 2, "{summary}");

    // Closing: the summary and the trace digest; the stream, read from the start, ends with it.
    let closed = gateway.call(Method::POST, &format!("/v1/liaison/{liaison}/close"), Some(&key), None).await?;
    assert_eq!((closed.status, closed.body["status"].as_str()), (200, Some("closed")), "{}", closed.text);
    let cost = &closed.body["cost_summary"];
    assert_eq!(
        (cost["plans_minted"].as_i64(), cost["plans_committed"].as_i64(), cost["denials"].as_i64()),
        (Some(2), Some(2), Some(1)),
        "{cost}"
    );
    assert!(cost["committed_cost_usd"].as_f64().is_some_and(|spent| spent > 0.0), "{cost}");
    assert_eq!(cost["request_ids"][0].as_str(), Some(request_id.as_str()), "{cost}");
    assert_eq!(closed.body["trace_digest"].as_str().map(str::len), Some(64), "{}", closed.text);
    let twice = gateway.call(Method::POST, &format!("/v1/liaison/{liaison}/close"), Some(&key), None).await?;
    assert_eq!((twice.status, code(&twice)), (409, "liaison_closed"), "{}", twice.text);
    let after = mint(&gateway, &key, &liaison, json!({"messages": messages(PROMPT)})).await?;
    assert_eq!((after.status, code(&after)), (409, "liaison_closed"), "{}", after.text);

    let whole = gateway.request(Method::GET, &format!("/v1/liaison/{liaison}/events"), Some(&key)).send().await?;
    let text_all = read_events(whole, |_| false).await?;
    let events = parsed_events(&text_all);
    assert_eq!(events.last().map(|(kind, _)| kind.as_str()), Some("liaison.closed"), "the stream ends after it: {text_all}");
    let envelope = events.iter().find(|(kind, _)| kind == "trace.envelope").map(|(_, data)| data.clone()).unwrap_or_default();
    assert_eq!(
        (envelope["request_id"].as_str(), envelope["audit_commitment"].as_str()),
        (Some(request_id.as_str()), Some(commitment.as_str()))
    );
    let decision = events.iter().find(|(kind, _)| kind == "routing.decision").map(|(_, data)| data.clone()).unwrap_or_default();
    assert_eq!(
        (decision["model"].as_str(), decision["plan_id"].as_str()),
        (Some("openai/gpt-4o-mini"), Some(plan_id.as_str())),
        "{decision}"
    );
    let resumed =
        gateway.request(Method::GET, &format!("/v1/liaison/{liaison}/events"), Some(&key)).header("last-event-id", "5").send().await?;
    let resumed = parsed_events(&read_events(resumed, |_| false).await?);
    assert_eq!(resumed.len(), events.len() - 5, "resumed after event 5");

    // An open stream does not hold a graceful stop: it ends when the process is asked to stop.
    let other = open(&gateway, &key).await?;
    let held = gateway.request(Method::GET, &format!("/v1/liaison/{other}/events"), Some(&key)).send().await?;
    let holder = tokio::spawn(read_events(held, |_| false));
    let edge = match shape {
        Shape::Embedded => "up",
        Shape::Distributed => "edge-router",
    };
    gateway.signal_stop(edge)?;
    assert!(gateway.wait_exit(edge, Duration::from_secs(8))?, "the edge stopped cleanly with a stream open");
    assert!(holder.await??.contains("liaison.opened"), "the stream had its events before it ended");
    Ok(())
}
