//! Budgets, plans and rate limits end to end: never overspend under concurrency, 402 and 429 with their
//! headers and recovery, the budget endpoints, and (with Redis) two edge replicas sharing one budget.

use std::time::Duration;

use brainstorm_e2e::{Gateway, Reply, Shape};
use brainstorm_mock_upstream::{MockConfig, MockUpstream};
use reqwest::Method;
use serde_json::{Value, json};

type TestResult = anyhow::Result<()>;

const ANTHROPIC_KEY: &str = "sk-ant-budget-test-0123456789abcdefghijkl";

brainstorm_e2e::in_both_shapes!(
    a_key_budget_is_never_overspent_under_concurrency,
    rate_limits_answer_429_with_retry_after,
    the_sandbox_plan_caps_requests_per_day,
    budget_status_limits_forecast_agents_and_alerts,
    graduation_by_provider_key_and_by_email,
);

async fn with_provider(shape: Shape, env: &[(&str, &str)]) -> anyhow::Result<(Gateway, MockUpstream, String)> {
    let mock = MockUpstream::start(MockConfig::default()).await?;
    let mut all_env = vec![("BR_PROVIDER_ANTHROPIC_BASE_URL", mock.base_url())];
    all_env.extend_from_slice(env);
    let gateway = Gateway::start_with(shape, &all_env).await?;
    let (key, _) = gateway.register("Budgets").await?;
    let registered =
        gateway.call(Method::POST, "/v1/providers", Some(&key), Some(json!({"provider": "anthropic", "api_key": ANTHROPIC_KEY}))).await?;
    anyhow::ensure!(registered.status == 201, "{}", registered.text);
    mock.clear();
    Ok((gateway, mock, key))
}

fn small_completion() -> Value {
    json!({"model": "anthropic/claude-haiku-4-5", "max_tokens": 10, "messages": [{"role": "user", "content": "count to three please"}]})
}

/// Nano-dollars from a six-decimal cost header.
fn header_nanos(value: Option<&str>) -> i64 {
    let Some((whole, fraction)) = value.and_then(|value| value.split_once('.')) else { return 0 };
    whole.parse::<i64>().unwrap_or(0) * 1_000_000_000 + format!("{fraction:0<9}").parse::<i64>().unwrap_or(0)
}

fn assert_budget_exceeded(reply: &Reply) {
    assert_eq!(reply.status, 402, "{}", reply.text);
    assert_eq!(reply.body["error"]["type"], "budget_exceeded");
    assert_eq!(reply.body["error"]["code"], "budget_exceeded");
    assert_eq!(reply.body["recovery"]["action"], "increase_budget");
    for header in ["x-budget-limit", "x-budget-spent", "x-budget-remaining"] {
        assert!(reply.header(header).is_some(), "{header} missing on a 402");
    }
}

async fn fire(gateway: &Gateway, base_url: &str, key: &str, count: usize) -> Vec<Reply> {
    let requests = (0..count).map(|_| {
        let request = gateway.client.post(format!("{base_url}/v1/chat/completions")).bearer_auth(key).json(&small_completion());
        async move {
            let response = request.send().await.ok()?;
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let text = response.text().await.ok()?;
            Some(Reply { status, body: serde_json::from_str(&text).unwrap_or(Value::Null), text, headers })
        }
    });
    futures::future::join_all(requests).await.into_iter().flatten().collect()
}

async fn a_key_budget_is_never_overspent_under_concurrency(shape: Shape) -> TestResult {
    let (gateway, mock, admin) = with_provider(shape, &[]).await?;
    // Each request's worst case is about 0.00006 USD: a 0.001 USD key budget admits a handful.
    let created = gateway
        .call(
            Method::POST,
            "/v1/api-keys",
            Some(&admin),
            Some(json!({"role": "developer", "budget_limit_usd": 0.001, "budget_period": "daily"})),
        )
        .await?;
    let key = created.body["api_key"]["key"].as_str().unwrap_or_default().to_string();
    let replies = fire(&gateway, &gateway.base_url, &key, 200).await;
    assert_eq!(replies.len(), 200);
    let served: Vec<&Reply> = replies.iter().filter(|reply| reply.status == 200).collect();
    let refused: Vec<&Reply> = replies.iter().filter(|reply| reply.status == 402).collect();
    assert_eq!(served.len() + refused.len(), 200, "only 200s and 402s: {:?}", replies.iter().map(|reply| reply.status).collect::<Vec<_>>());
    assert!(!served.is_empty() && !refused.is_empty());
    assert_budget_exceeded(refused[0]);
    let spent: i64 = served.iter().map(|reply| header_nanos(reply.header("x-br-actual-cost"))).sum();
    assert!(spent > 0 && spent <= 1_000_000, "spent {spent} nano-dollars of a 1,000,000 budget");
    assert_eq!(mock.requests().len(), served.len(), "refused requests never reached the provider");
    assert!(served[0].header("x-br-budget-remaining").is_some());

    // The key's status reports the same spend once the ledger has it.
    let mut status = Value::Null;
    for _ in 0..100 {
        status = gateway.call(Method::GET, "/v1/budget/status", Some(&key), None).await?.body;
        let ledger_spent = status["key_budget"]["spent_usd"].as_f64().unwrap_or(0.0);
        if (ledger_spent * 1e9).round() as i64 == spent {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!((status["key_budget"]["spent_usd"].as_f64().unwrap_or(0.0) * 1e9).round() as i64, spent, "{status}");
    assert_eq!(status["key_budget"]["limit_usd"].as_f64(), Some(0.001));
    Ok(())
}

async fn rate_limits_answer_429_with_retry_after(shape: Shape) -> TestResult {
    let gateway = Gateway::start(shape).await?;
    let (admin, _) = gateway.register("Limits").await?;
    let created = gateway.call(Method::POST, "/v1/api-keys", Some(&admin), Some(json!({"role": "developer", "rate_limit_rpm": 3}))).await?;
    let key = created.body["api_key"]["key"].as_str().unwrap_or_default().to_string();
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    for expected_remaining in ["2", "1", "0"] {
        let ok = gateway.call(Method::POST, "/v1/chat/completions", Some(&key), Some(body.clone())).await?;
        assert_eq!(ok.status, 200, "{}", ok.text);
        assert_eq!(ok.header("x-ratelimit-remaining"), Some(expected_remaining));
    }
    let limited = gateway.call(Method::POST, "/v1/chat/completions", Some(&key), Some(body)).await?;
    assert_eq!(limited.status, 429, "{}", limited.text);
    assert_eq!(limited.body["error"]["code"], "rate_limit_exceeded");
    assert_eq!(limited.body["recovery"]["action"], "retry_after");
    assert!(limited.body["recovery"]["wait_ms"].as_u64().is_some_and(|wait| wait > 0));
    assert!(limited.header("retry-after").and_then(|value| value.parse::<u64>().ok()).is_some_and(|seconds| (1..=60).contains(&seconds)));
    Ok(())
}

async fn the_sandbox_plan_caps_requests_per_day(shape: Shape) -> TestResult {
    let gateway = Gateway::start(shape).await?;
    let (key, _) = gateway.register("Sandbox").await?;
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
    for index in 0..100 {
        let reply = gateway.call(Method::POST, "/v1/chat/completions", Some(&key), Some(body.clone())).await?;
        assert_eq!(reply.status, 200, "request {index}: {}", reply.text);
    }
    let capped = gateway.call(Method::POST, "/v1/chat/completions", Some(&key), Some(body)).await?;
    assert_eq!(capped.status, 429, "{}", capped.text);
    assert!(capped.body["error"]["message"].as_str().is_some_and(|message| message.contains("100 requests")));
    // Budget endpoints stay reachable.
    assert_eq!(gateway.call(Method::GET, "/v1/budget/status", Some(&key), None).await?.status, 200);
    Ok(())
}

async fn budget_status_limits_forecast_agents_and_alerts(shape: Shape) -> TestResult {
    let (gateway, _mock, key) = with_provider(shape, &[]).await?;
    let status = gateway.call(Method::GET, "/v1/budget/status", Some(&key), None).await?;
    assert_eq!(status.status, 200, "{}", status.text);
    let day = status.body["daily"]["period_key"].as_str().unwrap_or_default().to_string();
    let month = status.body["monthly"]["period_key"].as_str().unwrap_or_default().to_string();
    assert!(day.len() == 10 && day.as_bytes()[4] == b'-' && day.as_bytes()[7] == b'-', "daily period key {day}");
    assert!(month.len() == 7 && day.starts_with(&month), "monthly period key {month}");
    assert_eq!(status.body["daily"]["limit_usd"].as_f64(), Some(2.0), "the sandbox plan's USD 2 a day");
    assert_eq!(status.body["key_budget"], Value::Null);

    for bad in [json!({"daily_limit_usd": -1}), json!({"daily_limit_usd": "ten"}), json!({"weekly_limit_usd": 1}), json!([1])] {
        let reply = gateway.call(Method::PUT, "/v1/budget/limits", Some(&key), Some(bad.clone())).await?;
        assert_eq!(reply.status, 400, "{bad}: {}", reply.text);
    }
    let set = gateway
        .call(Method::PUT, "/v1/budget/limits", Some(&key), Some(json!({"daily_limit_usd": 0.00005, "monthly_limit_usd": 50})))
        .await?;
    assert_eq!(set.status, 200, "{}", set.text);
    assert_eq!(set.body, json!({"ok": true, "limits": {"dailyLimitUsd": 0.00005, "monthlyLimitUsd": 50}}));
    // The tenant's daily limit now stops provider calls.
    let mut refused = None;
    for _ in 0..10 {
        let reply = gateway.call(Method::POST, "/v1/chat/completions", Some(&key), Some(small_completion())).await?;
        if reply.status == 402 {
            refused = Some(reply);
            break;
        }
        assert_eq!(reply.status, 200, "{}", reply.text);
    }
    assert_budget_exceeded(&refused.ok_or_else(|| anyhow::anyhow!("the daily limit never refused"))?);
    let cleared = gateway.call(Method::PUT, "/v1/budget/limits", Some(&key), Some(json!({"daily_limit_usd": null}))).await?;
    assert_eq!(cleared.body["limits"], json!({"dailyLimitUsd": null, "monthlyLimitUsd": 50}));
    assert_eq!(gateway.call(Method::POST, "/v1/chat/completions", Some(&key), Some(small_completion())).await?.status, 200);

    let forecast = gateway.call(Method::GET, "/v1/budget/forecast", Some(&key), None).await?;
    assert_eq!(forecast.status, 200, "{}", forecast.text);
    for field in ["avgDailySpendUsd", "projectedPeriodSpendUsd", "depletionDate", "daysRemaining", "trend", "confidence"] {
        assert!(forecast.body["forecast"].get(field).is_some(), "forecast.{field} missing: {}", forecast.text);
    }
    assert!(forecast.body["anomalies"].is_array() && forecast.body["daysOfData"].is_number() && forecast.body["limits"].is_object());

    let agent = gateway
        .call(Method::PUT, "/v1/budget/agents/researcher", Some(&key), Some(json!({"perDayUsd": 0.5, "exhaustionAction": "downgrade"})))
        .await?;
    assert_eq!(agent.status, 200, "{}", agent.text);
    assert_eq!(
        gateway
            .call(Method::PUT, "/v1/budget/agents/x", Some(&key), Some(json!({"perDayUsd": 1, "exhaustionAction": "explode"})))
            .await?
            .status,
        400
    );
    let attributed = gateway
        .request(Method::POST, "/v1/chat/completions", Some(&key))
        .header("x-br-agent-id", "researcher")
        .json(&small_completion())
        .send()
        .await?;
    assert_eq!(attributed.status().as_u16(), 200);
    let mut agents = Value::Null;
    for _ in 0..100 {
        agents = gateway.call(Method::GET, "/v1/budget/agents", Some(&key), None).await?.body;
        if agents["leaderboard"].as_array().is_some_and(|board| board.iter().any(|entry| entry["agentId"] == "researcher")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let researcher =
        agents["agents"].as_array().into_iter().flatten().find(|entry| entry["agentId"] == "researcher").cloned().unwrap_or_default();
    assert_eq!(researcher["config"], json!({"perDayUsd": 0.5, "exhaustionAction": "downgrade"}), "{agents}");
    assert!(agents["leaderboard"].as_array().is_some_and(|board| board.iter().any(|entry| entry["agentId"] == "researcher")), "{agents}");

    let alerts = gateway.call(Method::GET, "/v1/budget/alerts/config", Some(&key), None).await?;
    assert_eq!(alerts.body, json!({"thresholds": [80, 90, 95], "webhookUrl": null, "enabled": false}));
    let updated =
        gateway.call(Method::PUT, "/v1/budget/alerts/config", Some(&key), Some(json!({"thresholds": [50, 75], "enabled": true}))).await?;
    assert_eq!(updated.body, json!({"thresholds": [50, 75], "webhookUrl": null, "enabled": true}));
    let history = gateway.call(Method::GET, "/v1/budget/alerts/history?limit=10", Some(&key), None).await?;
    assert!(history.body["alerts"].is_array() && history.body["count"].is_number(), "{}", history.text);
    let usage = gateway.call(Method::GET, "/v1/usage/summary?groupBy=model", Some(&key), None).await?;
    assert_eq!(usage.status, 200, "{}", usage.text);

    // Read-only roles cannot change budgets.
    let auditor = gateway.call(Method::POST, "/v1/api-keys", Some(&key), Some(json!({"role": "auditor"}))).await?;
    let auditor = auditor.body["api_key"]["key"].as_str().unwrap_or_default().to_string();
    assert_eq!(gateway.call(Method::PUT, "/v1/budget/limits", Some(&auditor), Some(json!({"daily_limit_usd": 9}))).await?.status, 403);
    assert_eq!(gateway.call(Method::GET, "/v1/budget/status", Some(&auditor), None).await?.status, 200);
    Ok(())
}

/// Two edge replicas, one Redis: one key's rate limit and one tenant's budget hold across both.
#[tokio::test]
async fn two_edges_share_one_budget_and_one_rate_limit_through_redis() -> TestResult {
    let redis_url = std::env::var("BR_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string());
    let (gateway, _mock, admin) = with_provider(Shape::Distributed, &[("BR_REDIS_URL", redis_url.as_str())]).await?;
    assert_eq!(gateway.edge_urls.len(), 2);
    let (first, second) = (gateway.edge_urls[0].clone(), gateway.edge_urls[1].clone());

    let created = gateway.call(Method::POST, "/v1/api-keys", Some(&admin), Some(json!({"role": "developer", "rate_limit_rpm": 4}))).await?;
    let limited = created.body["api_key"]["key"].as_str().unwrap_or_default().to_string();
    let sandbox_body = json!({"model": "anthropic/claude-haiku-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
    let mut statuses = Vec::new();
    for base in [&first, &second, &first, &second, &first] {
        let response = gateway.client.post(format!("{base}/v1/chat/completions")).bearer_auth(&limited).json(&sandbox_body).send().await?;
        statuses.push(response.status().as_u16());
    }
    assert_eq!(statuses, vec![200, 200, 200, 200, 429], "four requests a minute across both edges");

    let budgeted =
        gateway.call(Method::POST, "/v1/api-keys", Some(&admin), Some(json!({"role": "developer", "budget_limit_usd": 0.001}))).await?;
    let budgeted = budgeted.body["api_key"]["key"].as_str().unwrap_or_default().to_string();
    let (mut replies, more) = (fire(&gateway, &first, &budgeted, 100).await, fire(&gateway, &second, &budgeted, 100).await);
    replies.extend(more);
    let spent: i64 = replies.iter().filter(|reply| reply.status == 200).map(|reply| header_nanos(reply.header("x-br-actual-cost"))).sum();
    assert!(replies.iter().any(|reply| reply.status == 402));
    assert!(spent <= 1_000_000, "two edges spent {spent} nano-dollars of a 1,000,000 budget");
    Ok(())
}

async fn graduation_by_provider_key_and_by_email(shape: Shape) -> TestResult {
    let mock = MockUpstream::start(MockConfig { valid_keys: vec![ANTHROPIC_KEY.to_string()], ..MockConfig::default() }).await?;
    let gateway = Gateway::start_with(shape, &[("BR_PROVIDER_ANTHROPIC_BASE_URL", mock.base_url())]).await?;
    let (key, _) = gateway.register("Graduate").await?;
    let criteria = gateway.call(Method::GET, "/v1/account/graduation", Some(&key), None).await?;
    assert_eq!(criteria.status, 200, "{}", criteria.text);
    assert_eq!(criteria.body["tier"], "community");
    assert_eq!(
        criteria.body["criteria"][0],
        json!({"id": "provider_key_registered", "required": true, "satisfied": false,
        "description": "register a provider key (POST /v1/providers); graduation validates it live"})
    );
    assert_eq!(criteria.body["action"]["endpoint"], "/v1/account/graduate");
    let without_key = gateway.call(Method::POST, "/v1/account/graduate", Some(&key), Some(json!({}))).await?;
    assert_eq!(without_key.status, 400, "{}", without_key.text);
    assert_eq!(without_key.body["recovery"]["action"], "register_provider");

    let registered =
        gateway.call(Method::POST, "/v1/providers", Some(&key), Some(json!({"provider": "anthropic", "api_key": ANTHROPIC_KEY}))).await?;
    assert_eq!(registered.status, 201, "{}", registered.text);
    mock.clear();
    let graduated = gateway.call(Method::POST, "/v1/account/graduate", Some(&key), Some(json!({}))).await?;
    assert_eq!(graduated.body, json!({"graduated": true, "tier": "standard", "budget_usd_per_day": 5}), "{}", graduated.text);
    assert!(mock.requests().iter().any(|request| request.path == "/v1/models"), "graduation validated the key live");
    assert_eq!(gateway.call(Method::GET, "/v1/account", Some(&key), None).await?.body["tenant"]["tier"], "standard");
    let status = gateway.call(Method::GET, "/v1/budget/status", Some(&key), None).await?;
    assert_eq!(status.body["daily"]["limit_usd"].as_f64(), Some(5.0), "{}", status.text);

    // The email path, on another tenant.
    let (other, _) = gateway.register("Verifier").await?;
    let started = gateway.call(Method::POST, "/v1/account/verify-email", Some(&other), Some(json!({"email": "ops@example.com"}))).await?;
    assert_eq!(started.status, 200, "{}", started.text);
    assert_eq!(started.body["expires_in_seconds"], 600);
    assert_eq!(gateway.call(Method::POST, "/v1/account/verify-email", Some(&other), Some(json!({"email": "nope"}))).await?.status, 400);
    let mail =
        gateway.mails()?.into_iter().find(|mail| mail["to"] == "ops@example.com").ok_or_else(|| anyhow::anyhow!("no verification mail"))?;
    let body = mail["body"].as_str().unwrap_or_default().to_string();
    let code: String = body.split(|character: char| !character.is_ascii_digit()).find(|run| run.len() == 6).unwrap_or_default().to_string();
    assert_eq!(code.len(), 6, "a 6-digit code in: {body}");
    let wrong = if code == "000000" { "111111" } else { "000000" };
    let refused = gateway.call(Method::POST, "/v1/account/verify-email/confirm", Some(&other), Some(json!({"code": wrong}))).await?;
    assert_eq!(refused.status, 400, "{}", refused.text);
    assert_eq!(refused.body["error"]["code"], "invalid_code");
    assert_eq!(gateway.call(Method::POST, "/v1/account/verify-email/confirm", Some(&other), Some(json!({"code": ""}))).await?.status, 400);
    let confirmed = gateway.call(Method::POST, "/v1/account/verify-email/confirm", Some(&other), Some(json!({"code": code}))).await?;
    assert_eq!(confirmed.body, json!({"tier": "standard", "budget_usd_per_day": 5}), "{}", confirmed.text);
    let reused = gateway.call(Method::POST, "/v1/account/verify-email/confirm", Some(&other), Some(json!({"code": code}))).await?;
    assert_eq!(reused.status, 400, "a code works once: {}", reused.text);
    Ok(())
}
