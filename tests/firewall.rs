//! The tool firewall and human approvals on the completion path, end to end in both shapes, against a
//! mock upstream whose model calls the first tool it is offered with `{"query": <the user's text>}`.

use brainstorm_e2e::{Gateway, Reply, Shape, sse_data};
use brainstorm_mock_upstream::{MockConfig, MockUpstream};
use reqwest::Method;
use serde_json::{Value, json};

type TestResult = anyhow::Result<()>;

const OPENAI_KEY: &str = "sk-openai-test-0123456789abcdefghijklmnop";

brainstorm_e2e::in_both_shapes!(
    the_tool_firewall_blocks_masks_substitutes_and_records,
    the_firewall_holds_back_streamed_tool_calls,
    an_approval_is_required_then_consumed_exactly_once,
    guardrail_providers_and_anomaly_baselines_have_routes,
    output_guardrails_judge_whole_replies_streamed_or_not,
    priorities_decide_between_actions_and_rules,
);

struct Setup {
    gateway: Gateway,
    _mock: MockUpstream,
    key: String,
}

async fn setup(shape: Shape) -> anyhow::Result<Setup> {
    let mock = MockUpstream::start(MockConfig { valid_keys: vec![OPENAI_KEY.to_string()], ..MockConfig::default() }).await?;
    let openai_base = format!("{}/v1", mock.base_url());
    let gateway = Gateway::start_with(shape, &[("BR_PROVIDER_OPENAI_BASE_URL", openai_base.as_str())]).await?;
    let (key, _) = gateway.register("Firewalled").await?;
    let reply = gateway.call(Method::POST, "/v1/providers", Some(&key), Some(json!({"provider": "openai", "api_key": OPENAI_KEY}))).await?;
    anyhow::ensure!(reply.status == 201, "registering openai: {} {}", reply.status, reply.text);
    Ok(Setup { gateway, _mock: mock, key })
}

/// A completion offering one tool; the mock calls it with `{"query": "use a tool: <text>"}`.
fn tool_request(tool: &str, text: &str) -> Value {
    json!({
        "model": "openai/gpt-4o-mini",
        "messages": [{"role": "user", "content": format!("use a tool: {text}")}],
        "tools": [{"type": "function", "function": {"name": tool, "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}],
    })
}

async fn complete(gateway: &Gateway, key: &str, body: Value) -> anyhow::Result<Reply> {
    gateway.call(Method::POST, "/v1/chat/completions", Some(key), Some(body)).await
}

fn first_call(reply: &Reply) -> Value {
    reply.body["choices"][0]["message"]["tool_calls"][0].clone()
}

fn call_arguments(call: &Value) -> Value {
    call["function"]["arguments"].as_str().and_then(|text| serde_json::from_str(text).ok()).unwrap_or(Value::Null)
}

async fn the_tool_firewall_blocks_masks_substitutes_and_records(shape: Shape) -> TestResult {
    let setup = setup(shape).await?;
    let (gateway, key) = (&setup.gateway, setup.key.as_str());

    // Nothing configured: the call passes untouched.
    let plain = complete(gateway, key, tool_request("lookup", "weather in Paris")).await?;
    assert_eq!(plain.status, 200, "{}", plain.text);
    assert_eq!(first_call(&plain)["function"]["name"], "lookup");
    assert_eq!(plain.header("x-br-tool-firewall-status"), Some("pass"));
    assert_eq!(plain.header("x-br-guardian-status"), Some("on"));
    assert!(plain.header("x-br-guardian-overhead-ms").is_some_and(|value| value.parse::<f64>().is_ok()));

    let config = json!({
        "mode": "enforce",
        "denyList": ["drop_*"],
        "maskPatterns": [{"name": "ticket", "pattern": "TCK-[0-9]+"}],
        "substitutions": [{"from": "web_search", "to": "safe_search", "mergeArgs": {"safe": true}}],
        "downgradeOnTools": ["bulk_*"],
    });
    let stored = gateway.call(Method::PUT, "/v1/firewall/config", Some(key), Some(config)).await?;
    assert_eq!(stored.status, 200, "{}", stored.text);
    assert_eq!(stored.body["denyList"], json!(["drop_*"]));
    assert_eq!(gateway.call(Method::GET, "/v1/firewall/config", Some(key), None).await?.body["maskPatterns"][0]["name"], "ticket");
    let bad = gateway.call(Method::PUT, "/v1/firewall/config", Some(key), Some(json!({"mode": "sometimes"}))).await?;
    assert_eq!(bad.status, 400, "{}", bad.text);
    let bad_regex =
        gateway.call(Method::PUT, "/v1/firewall/config", Some(key), Some(json!({"maskPatterns": [{"name": "x", "pattern": "("}]}))).await?;
    assert_eq!(bad_regex.status, 400, "{}", bad_regex.text);
    assert_eq!(gateway.call(Method::GET, "/v1/firewall/config", Some(key), None).await?.body["denyList"], json!(["drop_*"]), "kept");

    // Deny list: the call is dropped and the reply finishes with content_filter.
    let blocked = complete(gateway, key, tool_request("drop_users", "drop everything")).await?;
    assert_eq!(blocked.status, 200, "{}", blocked.text);
    assert_eq!(blocked.body["choices"][0]["finish_reason"], "content_filter", "{}", blocked.text);
    assert!(blocked.body["choices"][0]["message"]["tool_calls"].is_null(), "{}", blocked.text);
    assert_eq!(blocked.header("x-br-tool-firewall-status"), Some("block"));
    assert!(blocked.header("x-br-tool-firewall-reason").is_some_and(|reason| reason.contains("deny")));
    assert_eq!(blocked.header("x-br-guardian-status"), Some("blocked"));

    // Command injection in the arguments blocks too.
    let injected = complete(gateway, key, tool_request("lookup", "x; rm -rf /")).await?;
    assert_eq!(injected.body["choices"][0]["finish_reason"], "content_filter", "{}", injected.text);

    // Mask patterns and secrets are redacted in the arguments the agent receives.
    let masked = complete(gateway, key, tool_request("lookup", "status of TCK-4242 please")).await?;
    assert_eq!(masked.header("x-br-tool-firewall-status"), Some("mask"));
    assert_eq!(call_arguments(&first_call(&masked))["query"], "use a tool: status of [REDACTED:ticket] please", "{}", masked.text);

    // Substitution renames the tool and merges arguments.
    let substituted = complete(gateway, key, tool_request("web_search", "rust news")).await?;
    let call = first_call(&substituted);
    assert_eq!(call["function"]["name"], "safe_search", "{}", substituted.text);
    assert_eq!(call_arguments(&call), json!({"query": "use a tool: rust news", "safe": true}));
    assert_eq!(substituted.header("x-br-tool-firewall-status"), Some("substitute"));

    // A downgrade tool on offer routes to the cheapest candidate and says so.
    let downgraded = complete(gateway, key, tool_request("bulk_export", "export")).await?;
    assert_eq!(downgraded.status, 200, "{}", downgraded.text);
    assert!(downgraded.header("x-br-route-reason").is_some_and(|reason| reason.contains("downgraded")), "{:?}", downgraded.headers);

    // A request may tighten the mode, never loosen it; bad modes are refused.
    let loosened = complete(
        gateway,
        key,
        json!({"x_firewall_mode": "off", "model": "openai/gpt-4o-mini",
        "messages": [{"role": "user", "content": "use a tool: drop"}],
        "tools": [{"type": "function", "function": {"name": "drop_users"}}]}),
    )
    .await?;
    assert_eq!(loosened.body["choices"][0]["finish_reason"], "content_filter", "{}", loosened.text);
    let mut invalid = tool_request("lookup", "hi");
    invalid["x_firewall_mode"] = json!("loose");
    let refused = complete(gateway, key, invalid).await?;
    assert_eq!(refused.status, 400, "{}", refused.text);
    assert_eq!(refused.body["error"]["code"], "invalid_firewall_mode");

    // Monitor mode reports what it would do and changes nothing; the request can ask for enforce.
    assert_eq!(gateway.call(Method::PUT, "/v1/firewall/config", Some(key), Some(json!({"mode": "monitor"}))).await?.status, 200);
    let monitored = complete(gateway, key, tool_request("drop_users", "drop")).await?;
    assert_eq!(first_call(&monitored)["function"]["name"], "drop_users", "{}", monitored.text);
    assert_eq!(monitored.header("x-br-tool-firewall-status"), Some("block"));
    assert_eq!(monitored.header("x-br-tool-firewall-mode"), Some("monitor"));
    let mut tightened = tool_request("drop_users", "drop");
    tightened["x_firewall_mode"] = json!("enforce");
    assert_eq!(complete(gateway, key, tightened).await?.body["choices"][0]["finish_reason"], "content_filter");

    // The guardian can be switched off per request by a key that holds security.write.
    let mut off = gateway.request(Method::POST, "/v1/chat/completions", Some(key)).header("x-br-guardian", "off");
    off = off.json(
        &json!({"x_firewall_mode": "enforce", "model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "use a tool: drop"}],
        "tools": [{"type": "function", "function": {"name": "drop_users"}}]}),
    );
    let off = off.send().await?;
    assert_eq!(off.headers().get("x-br-guardian-status").and_then(|value| value.to_str().ok()), Some("off"));
    let off: Value = off.json().await?;
    assert_eq!(off["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "drop_users");

    // Every intervention is logged (the log is written in the background).
    let mut interceptions = Value::Null;
    for _ in 0..50 {
        interceptions = gateway.call(Method::GET, "/v1/firewall/interceptions?limit=2", Some(key), None).await?.body;
        if interceptions["total"].as_u64().unwrap_or(0) >= 7 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(interceptions["total"].as_u64().unwrap_or(0) >= 7, "{interceptions}");
    assert_eq!(interceptions["limit"], 2);
    assert_eq!(interceptions["interceptions"].as_array().map(Vec::len), Some(2));
    let newest = &interceptions["interceptions"][0];
    assert!(newest["actorId"].is_string() && newest["createdAt"].is_string(), "{newest}");
    assert!(newest["details"]["verdicts"].as_array().is_some_and(|verdicts| !verdicts.is_empty()), "{newest}");
    Ok(())
}

async fn the_firewall_holds_back_streamed_tool_calls(shape: Shape) -> TestResult {
    let setup = setup(shape).await?;
    let (gateway, key) = (&setup.gateway, setup.key.as_str());
    let config = json!({"denyList": ["drop_*"], "maskPatterns": [{"name": "ticket", "pattern": "TCK-[0-9]+"}]});
    assert_eq!(gateway.call(Method::PUT, "/v1/firewall/config", Some(key), Some(config)).await?.status, 200);

    let mut body = tool_request("lookup", "look up TCK-77 for me");
    body["stream"] = json!(true);
    let streamed = complete(gateway, key, body).await?;
    assert_eq!(streamed.status, 200, "{}", streamed.text);
    let chunks = sse_data(&streamed.text);
    let arguments: String =
        chunks.iter().filter_map(|chunk| chunk["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str()).collect();
    assert_eq!(
        serde_json::from_str::<Value>(&arguments)?,
        json!({"query": "use a tool: look up [REDACTED:ticket] for me"}),
        "{}",
        streamed.text
    );
    assert!(streamed.text.contains(": x-br-tool-firewall-status=mask"), "{}", streamed.text);
    assert!(streamed.text.trim_end().ends_with("data: [DONE]"));
    // The stream's audit record is completed at its end: the trailer carries its commitment, and the
    // record carries the tokens and the cost the stream used.
    assert!(streamed.text.contains(": x-br-audit-hash="), "{}", streamed.text);
    let request_id = streamed.header("x-br-request-id").unwrap_or_default().to_string();
    let mut decision = Value::Null;
    for _ in 0..50 {
        let decisions = gateway.call(Method::GET, "/v1/replays/decisions", Some(key), None).await?;
        if let Some(found) =
            decisions.body["decisions"].as_array().and_then(|list| list.iter().find(|entry| entry["requestId"] == request_id.as_str()))
        {
            decision = found.clone();
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(decision["outputTokens"].as_i64().is_some_and(|tokens| tokens > 0), "{decision}");
    assert!(decision["costUsd"].as_f64().is_some_and(|cost| cost > 0.0), "{decision}");

    let mut body = tool_request("drop_users", "drop them");
    body["stream"] = json!(true);
    let blocked = complete(gateway, key, body).await?;
    let chunks = sse_data(&blocked.text);
    assert!(chunks.iter().all(|chunk| chunk["choices"][0]["delta"]["tool_calls"].is_null()), "{}", blocked.text);
    let finish = chunks.iter().filter_map(|chunk| chunk["choices"][0]["finish_reason"].as_str()).next_back();
    assert_eq!(finish, Some("content_filter"), "{}", blocked.text);

    // Anthropic clients get the same treatment.
    let anthropic = json!({"model": "openai/gpt-4o-mini", "max_tokens": 100, "stream": true,
        "tools": [{"name": "drop_users", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "use a tool: drop them"}]});
    let blocked = gateway.call(Method::POST, "/v1/messages", Some(key), Some(anthropic)).await?;
    let events = sse_data(&blocked.text);
    assert!(events.iter().all(|event| event["content_block"]["type"] != "tool_use"), "{}", blocked.text);
    let stop = events.iter().find(|event| event["type"] == "message_delta").map(|event| event["delta"]["stop_reason"].clone());
    assert_eq!(stop, Some(json!("refusal")), "{}", blocked.text);
    Ok(())
}

async fn an_approval_is_required_then_consumed_exactly_once(shape: Shape) -> TestResult {
    let setup = setup(shape).await?;
    let (gateway, key) = (&setup.gateway, setup.key.as_str());
    let rules = json!({"rules": [
        {"id": "approve-payments", "action": "require_approval", "priority": 10,
         "conditions": [{"field": "tool.name", "op": "matches", "value": "create_payment"}]},
        {"id": "approve-shell", "action": "require_approval", "priority": 10,
         "conditions": [{"field": "tool.name", "op": "eq", "value": "shell"}]},
    ]});
    assert_eq!(gateway.call(Method::PUT, "/v1/security/policies", Some(key), Some(rules)).await?.status, 200);

    let request = tool_request("create_payment", "pay 10 EUR to Ada");
    let held = complete(gateway, key, request.clone()).await?;
    assert_eq!(held.status, 403, "{}", held.text);
    assert_eq!(held.body["error"]["type"], "approval_required");
    assert_eq!(held.body["error"]["tool_name"], "create_payment");
    assert_eq!(held.body["error"]["surface"], "chat_completions");
    assert_eq!(held.body["error"]["rule"], "approve-payments");
    assert_eq!(held.body["recovery"]["action"], "escalate");
    let approval_id = held.body["error"]["approval_id"].as_str().unwrap_or_default().to_string();
    assert!(!approval_id.is_empty());
    assert_eq!(held.header("x-br-approval-id"), Some(approval_id.as_str()));

    // A retry before approval lands on the same record.
    let again = complete(gateway, key, request.clone()).await?;
    assert_eq!(again.body["error"]["approval_id"], approval_id.as_str(), "{}", again.text);

    // Reviewers see the tool and the argument keys, never the values.
    let pending = gateway.call(Method::GET, "/v1/approvals/pending", Some(key), None).await?;
    assert_eq!(pending.status, 200, "{}", pending.text);
    assert_eq!(pending.body["count"], 1, "{}", pending.text);
    assert_eq!(pending.body["approvals"][0]["argumentKeys"], json!(["query"]));
    assert!(!pending.text.contains("Ada"), "argument values never reach reviewers: {}", pending.text);

    assert_eq!(gateway.call(Method::POST, "/v1/approvals/nope/approve", Some(key), Some(json!({}))).await?.status, 404);
    let bad_scope =
        gateway.call(Method::POST, &format!("/v1/approvals/{approval_id}/approve"), Some(key), Some(json!({"scope": "forever"}))).await?;
    assert_eq!(bad_scope.status, 400, "{}", bad_scope.text);
    let approved = gateway
        .call(
            Method::POST,
            &format!("/v1/approvals/{approval_id}/approve"),
            Some(key),
            Some(json!({"scope": "exact", "note": "invoice 7"})),
        )
        .await?;
    assert_eq!(approved.status, 200, "{}", approved.text);
    assert_eq!(approved.body["status"], "approved");
    assert!(approved.body["expiresAt"].is_string(), "{}", approved.text);

    // The retry consumes the allowance ...
    let allowed = complete(gateway, key, request.clone()).await?;
    assert_eq!(allowed.status, 200, "{}", allowed.text);
    assert_eq!(first_call(&allowed)["function"]["name"], "create_payment");
    assert_eq!(allowed.header("x-br-guardian-status"), Some("approved"));
    let consumed = gateway.call(Method::GET, &format!("/v1/approvals/{approval_id}"), Some(key), None).await?;
    assert!(consumed.body["consumedAt"].is_string(), "{}", consumed.text);
    assert_eq!(consumed.body["consumedByRequestId"].as_str(), allowed.header("x-br-request-id"));

    // ... and never twice: the next call waits for a new approval.
    let second = complete(gateway, key, request.clone()).await?;
    assert_eq!(second.status, 403, "{}", second.text);
    let second_id = second.body["error"]["approval_id"].as_str().unwrap_or_default().to_string();
    assert_ne!(second_id, approval_id);

    // A denial allows nothing: the next call queues anew.
    let denied = gateway.call(Method::POST, &format!("/v1/approvals/{second_id}/deny"), Some(key), Some(json!({"note": "no"}))).await?;
    assert_eq!(denied.status, 200, "{}", denied.text);
    assert_eq!(denied.body["status"], "denied");
    let third = complete(gateway, key, request).await?;
    assert_eq!(third.status, 403);
    assert_ne!(third.body["error"]["approval_id"], second_id.as_str());

    // High-risk tools need a review note.
    let shell = complete(gateway, key, tool_request("shell", "ls")).await?;
    assert_eq!(shell.status, 403, "{}", shell.text);
    let shell_id = shell.body["error"]["approval_id"].as_str().unwrap_or_default().to_string();
    let unnoted = gateway.call(Method::POST, &format!("/v1/approvals/{shell_id}/approve"), Some(key), None).await?;
    assert_eq!(unnoted.status, 400, "{}", unnoted.text);
    let noted = gateway
        .call(Method::POST, &format!("/v1/approvals/{shell_id}/approve"), Some(key), Some(json!({"scope": "tool", "note": "read-only"})))
        .await?;
    assert_eq!(noted.status, 200, "{}", noted.text);
    // Tool scope: any arguments, once.
    assert_eq!(complete(gateway, key, tool_request("shell", "pwd")).await?.status, 200);
    assert_eq!(complete(gateway, key, tool_request("shell", "pwd")).await?.status, 403);
    Ok(())
}

async fn guardrail_providers_and_anomaly_baselines_have_routes(shape: Shape) -> TestResult {
    let setup = setup(shape).await?;
    let (gateway, key) = (&setup.gateway, setup.key.as_str());
    let templates = gateway.call(Method::GET, "/v1/guardrails/templates", Some(key), None).await?;
    assert_eq!(templates.status, 200, "{}", templates.text);
    assert!(templates.text.contains("moderation"), "{}", templates.text);
    let registered = gateway
        .call(
            Method::POST,
            "/v1/guardrails/providers",
            Some(key),
            Some(json!({"id": "acme-guard", "name": "Acme", "endpoint": "https://guard.example.com/check", "template": "flagged", "api_key": "gk-secret-123456789"})),
        )
        .await?;
    assert_eq!(registered.status, 200, "{}", registered.text);
    assert!(!registered.text.contains("gk-secret-123456789"), "the key never comes back");
    let private = gateway
        .call(Method::POST, "/v1/guardrails/providers", Some(key), Some(json!({"id": "inside", "endpoint": "http://127.0.0.1:9/check"})))
        .await?;
    assert_eq!(private.status, 400, "{}", private.text);
    let providers = gateway.call(Method::GET, "/v1/guardrails/providers", Some(key), None).await?;
    assert!(providers.text.contains("acme-guard") && providers.text.contains("pii"), "{}", providers.text);
    assert_eq!(gateway.call(Method::DELETE, "/v1/guardrails/providers/acme-guard", Some(key), None).await?.status, 200);
    assert!(!gateway.call(Method::GET, "/v1/guardrails/providers", Some(key), None).await?.text.contains("acme-guard"));

    let baseline = json!({"entityType": "agent", "entityId": "crawler", "metric": "cost_usd", "count": 20, "mean": 2.0, "m2": 19.0, "min": 1.0, "max": 3.0});
    let imported =
        gateway.call(Method::POST, "/v1/security/anomalies/baselines", Some(key), Some(json!({"baselines": [baseline]}))).await?;
    assert_eq!(imported.status, 200, "{}", imported.text);
    assert_eq!(imported.body["imported"], 1);
    let stats = gateway.call(Method::GET, "/v1/security/anomalies/stats/agent/crawler/cost_usd", Some(key), None).await?;
    assert_eq!(stats.status, 200, "{}", stats.text);
    assert_eq!(stats.body["stats"]["count"], 20);
    assert_eq!(stats.body["stats"]["stdDev"], 1.0);
    let exported = gateway.call(Method::GET, "/v1/security/anomalies/baselines", Some(key), None).await?;
    assert!(exported.text.contains("crawler") && exported.body["node"].is_string(), "{}", exported.text);
    assert_eq!(gateway.call(Method::GET, "/v1/security/anomalies/stats/agent/nobody/cost_usd", Some(key), None).await?.status, 404);
    let refused = gateway
        .call(Method::POST, "/v1/security/anomalies/baselines", Some(key), Some(json!({"baselines": [{"entityType": "agent"}]})))
        .await?;
    assert_eq!(refused.status, 400, "{}", refused.text);
    Ok(())
}

/// With `scanOutput`, the reply is judged before it leaves, streamed or not. The mock's replies start
/// "mock openai reply to:", so a topic keyed on "mock" flags the output and never the prompt.
async fn output_guardrails_judge_whole_replies_streamed_or_not(shape: Shape) -> TestResult {
    let setup = setup(shape).await?;
    let (gateway, key) = (&setup.gateway, setup.key.as_str());
    let config = json!({"enabled": true, "mode": "block", "scanOutput": true,
        "providers": [{"id": "builtin"}, {"id": "pii"}, {"id": "topic-restriction"}],
        "deniedTopics": [{"name": "mocking", "keywords": ["mock"]}]});
    let stored = gateway.call(Method::PUT, "/v1/guardrails/config", Some(key), Some(config)).await?;
    assert_eq!(stored.status, 200, "{}", stored.text);
    let body = json!({"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "hello there"}]});

    let whole = complete(gateway, key, body.clone()).await?;
    assert_eq!(whole.status, 403, "{}", whole.text);
    assert_eq!(whole.body["error"]["type"], "guardrail_blocked");

    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let streamed = complete(gateway, key, streamed_body.clone()).await?;
    assert_eq!(streamed.status, 200);
    assert!(streamed.text.contains("guardrail_blocked"), "{}", streamed.text);
    let text: String = sse_data(&streamed.text).iter().filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, "", "nothing of a blocked reply leaves: {}", streamed.text);

    // In warn mode the reply is released whole, with the verdict as comments.
    assert_eq!(gateway.call(Method::PUT, "/v1/guardrails/config", Some(key), Some(json!({"mode": "warn"}))).await?.status, 200);
    let warned = complete(gateway, key, streamed_body).await?;
    let text: String = sse_data(&warned.text).iter().filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, "mock openai reply to: hello there", "{}", warned.text);
    assert!(warned.text.contains(": x-br-guardrail-status=warn"), "{}", warned.text);
    assert!(warned.text.trim_end().ends_with("data: [DONE]"));
    Ok(())
}

/// Priorities end to end: a call both substituted and masked reports `substitute` and gets both; a
/// tool on the deny list and the downgrade list is blocked; between policy rules the higher priority
/// wins, an `allow` above a `require_approval` lets the call through and a `deny` above both blocks.
async fn priorities_decide_between_actions_and_rules(shape: Shape) -> TestResult {
    let setup = setup(shape).await?;
    let (gateway, key) = (&setup.gateway, setup.key.as_str());
    let config = json!({
        "denyList": ["drop_*"],
        "downgradeOnTools": ["*_bulk"],
        "maskPatterns": [{"name": "ticket", "pattern": "TCK-[0-9]+"}],
        "substitutions": [{"from": "web_search", "to": "safe_search"}],
    });
    assert_eq!(gateway.call(Method::PUT, "/v1/firewall/config", Some(key), Some(config)).await?.status, 200);

    let both = complete(gateway, key, tool_request("web_search", "find TCK-9")).await?;
    assert_eq!(both.header("x-br-tool-firewall-status"), Some("substitute"), "substitute outranks mask");
    let call = first_call(&both);
    assert_eq!(call["function"]["name"], "safe_search");
    assert_eq!(call_arguments(&call)["query"], "use a tool: find [REDACTED:ticket]", "{}", both.text);

    let denied_and_downgraded = complete(gateway, key, tool_request("drop_bulk", "go")).await?;
    assert_eq!(denied_and_downgraded.header("x-br-tool-firewall-status"), Some("block"), "block outranks downgrade");
    assert_eq!(denied_and_downgraded.body["choices"][0]["finish_reason"], "content_filter");

    let rule = |id: &str, action: &str, priority: i64| {
        json!({"id": id, "action": action, "priority": priority,
            "conditions": [{"field": "tool.name", "op": "matches", "value": "create_payment"}]})
    };
    let allow_over_approval = json!({"rules": [rule("hold-payments", "require_approval", 10), rule("trusted-payments", "allow", 20)]});
    assert_eq!(gateway.call(Method::PUT, "/v1/security/policies", Some(key), Some(allow_over_approval)).await?.status, 200);
    let allowed = complete(gateway, key, tool_request("create_payment", "pay 5 EUR")).await?;
    assert_eq!(allowed.status, 200, "{}", allowed.text);
    assert_eq!(first_call(&allowed)["function"]["name"], "create_payment");

    let deny_over_all = json!({"rules": [rule("hold-payments", "require_approval", 10), rule("trusted-payments", "allow", 20),
        rule("no-payments", "deny", 30)]});
    assert_eq!(gateway.call(Method::PUT, "/v1/security/policies", Some(key), Some(deny_over_all)).await?.status, 200);
    let denied = complete(gateway, key, tool_request("create_payment", "pay 5 EUR")).await?;
    assert_eq!(denied.body["choices"][0]["finish_reason"], "content_filter", "{}", denied.text);
    assert!(denied.header("x-br-policy-denied").is_some_and(|reason| reason.contains("no-payments")), "{:?}", denied.headers);
    Ok(())
}
