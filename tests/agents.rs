//! Agent profiles end to end in both shapes: create, read, change and delete them, move them
//! through their lifecycle (every move the table forbids is a 409), with the roles that may do
//! each, and the owner-required switch; agents bootstrapping with a tenant key and reading
//! themselves with the JWT it mints.

use std::time::Duration;

use brainstorm_e2e::{Gateway, Reply, Shape};
use brainstorm_mock_upstream::{MockConfig, MockUpstream};
use reqwest::Method;
use serde_json::{Value, json};

type TestResult = anyhow::Result<()>;

brainstorm_e2e::in_both_shapes!(
    profiles_are_managed_and_moved_through_their_lifecycle,
    the_owner_required_switch_refuses_ownerless_agents,
    agents_bootstrap_and_read_themselves_with_their_jwt,
    an_ownerless_agent_is_held_to_the_switch_turned_on_later,
    agent_limits_cap_each_agents_budget_and_rate,
    parents_delegate_budget_to_sub_agents_and_get_the_unspent_back,
    an_xdr_risk_score_restricts_an_agent_and_rides_in_its_token,
);

const ANTHROPIC_KEY: &str = "sk-ant-agents-test-0123456789abcdefghijkl";

fn code(reply: &brainstorm_e2e::Reply) -> &str {
    reply.body["error"]["code"].as_str().unwrap_or_default()
}

async fn profiles_are_managed_and_moved_through_their_lifecycle(shape: Shape) -> TestResult {
    let gateway = Gateway::start(shape).await?;
    let (admin, registration) = gateway.register("Agents Inc").await?;
    let tenant_id = registration["tenant"]["id"].as_str().unwrap_or_default().to_string();
    let body = json!({
        "agentId": "crawler", "displayName": "Crawler", "ownerId": "user_42", "costCenter": "growth",
        "budgetDailyUsd": 5.25, "budgetMonthlyUsd": 100, "metadata": {"team": "growth", "can_delegate": false}
    });
    let created = gateway.call(Method::POST, "/v1/agent/profiles", Some(&admin), Some(body.clone())).await?;
    assert_eq!(created.status, 201, "{}", created.text);
    let profile = &created.body["profile"];
    assert_eq!(profile["tenantId"], json!(tenant_id));
    assert_eq!(
        (profile["agentId"].as_str(), profile["lifecycleState"].as_str(), profile["role"].as_str()),
        (Some("crawler"), Some("provisioned"), Some("agent"))
    );
    assert_eq!((profile["budgetDailyUsd"].as_f64(), profile["budgetMonthlyUsd"].as_f64()), (Some(5.25), Some(100.0)));
    assert_eq!(profile["metadata"], json!({"team": "growth", "can_delegate": false}));
    assert!(profile["id"].as_str().is_some_and(|id| id.len() == 36));

    // Refusals: the same id again, no id, a malformed id, metadata that is no object, unknown members.
    let again = gateway.call(Method::POST, "/v1/agent/profiles", Some(&admin), Some(body)).await?;
    assert_eq!((again.status, code(&again)), (409, "agent_exists"), "{}", again.text);
    for (bad, expected) in [
        (json!({"displayName": "x"}), "agent_id_required"),
        (json!({"agentId": "Crawler!"}), "invalid_agent_id"),
        (json!({"agentId": "lister", "metadata": [1]}), "invalid_metadata"),
        (json!({"agentId": "lister", "role": "root"}), "invalid_role"),
        (json!({"agentId": "lister", "budgetDailyUsd": -1}), "invalid_budget"),
    ] {
        let refused = gateway.call(Method::POST, "/v1/agent/profiles", Some(&admin), Some(bad.clone())).await?;
        assert_eq!((refused.status, code(&refused)), (400, expected), "{bad}: {}", refused.text);
    }
    let unknown =
        gateway.call(Method::POST, "/v1/agent/profiles", Some(&admin), Some(json!({"agentId": "lister", "colour": "red"}))).await?;
    assert_eq!(unknown.status, 400, "{}", unknown.text);

    let listed = gateway.call(Method::GET, "/v1/agent/profiles", Some(&admin), None).await?;
    assert_eq!((listed.status, listed.body["total"].as_u64()), (200, Some(1)), "{}", listed.text);
    let read = gateway.call(Method::GET, "/v1/agent/profiles/crawler", Some(&admin), None).await?;
    assert_eq!(read.body["profile"]["displayName"], "Crawler");
    let missing = gateway.call(Method::GET, "/v1/agent/profiles/nobody", Some(&admin), None).await?;
    assert_eq!((missing.status, code(&missing)), (404, "agent_not_found"));

    // Changes: set members change, null ones clear, absent ones stay.
    let changed = gateway
        .call(
            Method::PATCH,
            "/v1/agent/profiles/crawler",
            Some(&admin),
            Some(json!({"displayName": "Web crawler", "costCenter": null, "budgetDailyUsd": 7})),
        )
        .await?;
    assert_eq!(changed.status, 200, "{}", changed.text);
    let profile = &changed.body["profile"];
    assert_eq!(
        (profile["displayName"].as_str(), profile["costCenter"].clone(), profile["budgetDailyUsd"].as_f64()),
        (Some("Web crawler"), Value::Null, Some(7.0))
    );
    assert_eq!(profile["ownerId"], "user_42");

    // The lifecycle: only the table's moves; terminated is final.
    let mut moves = vec![("suspended", 409), ("active", 200), ("active", 409), ("quarantined", 200), ("active", 200), ("suspended", 200)];
    moves.extend([("quarantined", 409), ("terminated", 200), ("active", 409), ("suspended", 409)]);
    for (state, status) in moves {
        let moved =
            gateway.call(Method::PATCH, "/v1/agent/profiles/lifecycle/crawler", Some(&admin), Some(json!({"state": state}))).await?;
        assert_eq!(moved.status, status, "-> {state}: {}", moved.text);
        if status == 200 {
            assert_eq!(moved.body["profile"]["lifecycleState"], state);
        } else {
            assert_eq!(code(&moved), "invalid_transition");
        }
    }
    let invalid =
        gateway.call(Method::PATCH, "/v1/agent/profiles/lifecycle/crawler", Some(&admin), Some(json!({"state": "sleeping"}))).await?;
    assert_eq!((invalid.status, code(&invalid)), (400, "invalid_state"));
    let absent = gateway.call(Method::PATCH, "/v1/agent/profiles/lifecycle/crawler", Some(&admin), Some(json!({}))).await?;
    assert_eq!((absent.status, code(&absent)), (400, "state_required"));

    // Roles: developers see nothing, auditors read, operators manage but do not delete.
    let developer = gateway.key_with_role(&admin, "developer").await?;
    let auditor = gateway.key_with_role(&admin, "auditor").await?;
    let operator = gateway.key_with_role(&admin, "operator").await?;
    assert_eq!(gateway.call(Method::GET, "/v1/agent/profiles", Some(&developer), None).await?.status, 403);
    assert_eq!(gateway.call(Method::GET, "/v1/agent/profiles/crawler", Some(&auditor), None).await?.status, 200);
    let by_auditor = gateway.call(Method::POST, "/v1/agent/profiles", Some(&auditor), Some(json!({"agentId": "auditor-made"}))).await?;
    assert_eq!(by_auditor.status, 403);
    let by_operator =
        gateway.call(Method::POST, "/v1/agent/profiles", Some(&operator), Some(json!({"agentId": "writer", "role": "operator"}))).await?;
    assert_eq!(by_operator.status, 201, "{}", by_operator.text);
    let moved =
        gateway.call(Method::PATCH, "/v1/agent/profiles/lifecycle/writer", Some(&operator), Some(json!({"state": "active"}))).await?;
    assert_eq!(moved.status, 200, "{}", moved.text);
    let operator_delete = gateway.call(Method::DELETE, "/v1/agent/profiles/writer", Some(&operator), None).await?;
    assert_eq!(operator_delete.status, 403);

    let deleted = gateway.call(Method::DELETE, "/v1/agent/profiles/writer", Some(&admin), None).await?;
    assert_eq!(deleted.body, json!({"ok": true, "agentId": "writer"}));
    assert_eq!(gateway.call(Method::GET, "/v1/agent/profiles/writer", Some(&admin), None).await?.status, 404);
    assert_eq!(gateway.call(Method::DELETE, "/v1/agent/profiles/writer", Some(&admin), None).await?.status, 404);

    // Tenants are isolated.
    let (other, _) = gateway.register("Elsewhere").await?;
    let foreign = gateway.call(Method::GET, "/v1/agent/profiles/crawler", Some(&other), None).await?;
    assert_eq!(foreign.status, 404);
    Ok(())
}

async fn the_owner_required_switch_refuses_ownerless_agents(shape: Shape) -> TestResult {
    let gateway = Gateway::start_with(shape, &[("BR_REQUIRE_AGENT_OWNER", "true")]).await?;
    let (admin, _) = gateway.register("Owned").await?;
    let ownerless = gateway.call(Method::POST, "/v1/agent/profiles", Some(&admin), Some(json!({"agentId": "orphan"}))).await?;
    assert_eq!((ownerless.status, code(&ownerless)), (400, "owner_required"), "{}", ownerless.text);
    let owned =
        gateway.call(Method::POST, "/v1/agent/profiles", Some(&admin), Some(json!({"agentId": "owned", "ownerId": "user_1"}))).await?;
    assert_eq!(owned.status, 201, "{}", owned.text);
    let unowning = gateway.call(Method::PATCH, "/v1/agent/profiles/owned", Some(&admin), Some(json!({"ownerId": null}))).await?;
    assert_eq!((unowning.status, code(&unowning)), (400, "owner_required"), "{}", unowning.text);
    Ok(())
}

/// `GET` with an agent JWT.
async fn as_agent(gateway: &Gateway, path: &str, jwt: &str) -> anyhow::Result<Reply> {
    gateway.call(Method::GET, path, Some(jwt), None).await
}

async fn agents_bootstrap_and_read_themselves_with_their_jwt(shape: Shape) -> TestResult {
    let mock = MockUpstream::start(MockConfig::default()).await?;
    let gateway = Gateway::start_with(shape, &[("BR_PROVIDER_ANTHROPIC_BASE_URL", mock.base_url())]).await?;
    let (admin, registration) = gateway.register("Agent Works").await?;
    let admin_key_id = registration["api_key"]["id"].as_str().unwrap_or_default().to_string();
    let registered =
        gateway.call(Method::POST, "/v1/providers", Some(&admin), Some(json!({"provider": "anthropic", "api_key": ANTHROPIC_KEY}))).await?;
    assert_eq!(registered.status, 201, "{}", registered.text);

    let body = json!({"agent_id": "researcher", "display_name": "Researcher", "budget_daily_usd": 2.5, "metadata": {"can_delegate": true}});
    let boot = gateway.call(Method::POST, "/v1/agent/bootstrap", Some(&admin), Some(body.clone())).await?;
    assert_eq!(boot.status, 201, "{}", boot.text);
    let profile = &boot.body["profile"];
    assert_eq!((profile["agentId"].as_str(), profile["lifecycleState"].as_str()), (Some("researcher"), Some("active")));
    assert_eq!(profile["ownerId"], json!(format!("key:{admin_key_id}")), "the bootstrapping key answers for the agent");
    assert_eq!(profile["metadata"], json!({"can_delegate": true}));
    assert_eq!(
        boot.body["budget"],
        json!({"profile_daily_usd": 2.5, "profile_monthly_usd": null, "enforced_daily_usd": 2.5, "enforced_rpm": 600})
    );
    // The enforced rate is a number from the start: bootstrap wrote the agent's limits entry (the
    // gateway's default rate for agents; the bootstrapping key's own rate when it has one).
    let limits = gateway.call(Method::GET, "/v1/agent-limits", Some(&admin), None).await?;
    assert_eq!(
        limits.body["agentLimits"]["agent:researcher"],
        json!({"maxBudgetUsd": null, "maxRequestsPerMinute": 600}),
        "{}",
        limits.text
    );
    let limited_key =
        gateway.call(Method::POST, "/v1/api-keys", Some(&admin), Some(json!({"role": "developer", "rate_limit_rpm": 30}))).await?;
    let limited_key = limited_key.body["api_key"]["key"].as_str().unwrap_or_default().to_string();
    let scout = gateway.call(Method::POST, "/v1/agent/bootstrap", Some(&limited_key), Some(json!({"agent_id": "scout"}))).await?;
    assert_eq!((scout.status, scout.body["budget"]["enforced_rpm"].clone()), (201, json!(30)), "{}", scout.text);
    assert!(boot.body["next_steps"]["completions"].as_str().is_some_and(|step| step.contains("X-BR-Agent-Id: researcher")));
    let jwt = boot.body["jwt"].as_str().unwrap_or_default().to_string();
    assert_eq!(jwt.split('.').count(), 3, "{jwt}");
    let expires_at = chrono::DateTime::parse_from_rfc3339(boot.body["jwt_expires_at"].as_str().unwrap_or_default())?;
    let lifetime = expires_at.signed_duration_since(chrono::Utc::now()).num_seconds();
    assert!((3500..=3600).contains(&lifetime), "an hour by default, got {lifetime} s");
    // A plain-HTTP edge still issues client certificates, and says they cannot reach it (tests/agent_mtls.rs serves HTTPS).
    let certificate = gateway.call(Method::POST, "/v1/agent/auth/cert", Some(&jwt), None).await?;
    assert_eq!(certificate.status, 201, "{}", certificate.text);
    assert_eq!(certificate.body["mtls_available"], false, "{}", certificate.text);
    assert!(
        certificate.body["next_steps"]["authenticate"].as_str().is_some_and(|step| step.contains("BR_TLS_CERT_FILE")),
        "{}",
        certificate.text
    );
    // The enforced budget is the ledger's agent budget, visible where budgets are managed.
    let agents = gateway.call(Method::GET, "/v1/budget/agents", Some(&admin), None).await?;
    let configured = agents.body["agents"].as_array().cloned().unwrap_or_default();
    assert!(
        configured.iter().any(|agent| agent["agentId"] == "researcher" && agent["config"]["perDayUsd"] == json!(2.5)),
        "{}",
        agents.text
    );

    // Again: the same profile, 200, a fresh token.
    let again = gateway.call(Method::POST, "/v1/agent/bootstrap", Some(&admin), Some(body.clone())).await?;
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.body["profile"]["id"], boot.body["profile"]["id"]);
    assert_ne!(again.body["jwt"], boot.body["jwt"]);
    let stolen = gateway
        .call(Method::POST, "/v1/agent/bootstrap", Some(&admin), Some(json!({"agent_id": "researcher", "owner_id": "someone-else"})))
        .await?;
    assert_eq!((stolen.status, code(&stolen)), (409, "agent_exists"), "{}", stolen.text);

    // Who may bootstrap: a key that may call completions; never an agent JWT.
    let with_jwt = gateway.call(Method::POST, "/v1/agent/bootstrap", Some(&jwt), Some(body.clone())).await?;
    assert_eq!((with_jwt.status, code(&with_jwt)), (403, "api_key_required"), "{}", with_jwt.text);
    let developer = gateway.key_with_role(&admin, "developer").await?;
    let auditor = gateway.key_with_role(&admin, "auditor").await?;
    let by_developer = gateway.call(Method::POST, "/v1/agent/bootstrap", Some(&developer), Some(json!({"agent_id": "helper"}))).await?;
    assert_eq!(by_developer.status, 201, "{}", by_developer.text);
    let by_auditor = gateway.call(Method::POST, "/v1/agent/bootstrap", Some(&auditor), Some(json!({"agent_id": "watcher"}))).await?;
    assert_eq!(by_auditor.status, 403, "{}", by_auditor.text);
    assert_eq!(gateway.call(Method::POST, "/v1/agent/bootstrap", None, Some(json!({"agent_id": "nobody"}))).await?.status, 401);
    for (bad, status, expected) in [
        (json!({"display_name": "x"}), 400, "agent_id_required"),
        (json!({"agent_id": "Not Valid"}), 400, "invalid_agent_id"),
        (json!({"agent_id": "lister", "metadata": "text"}), 400, "invalid_metadata"),
        (json!({"agent_id": "lister", "budget_daily_usd": "lots"}), 400, "invalid_json"),
    ] {
        let refused = gateway.call(Method::POST, "/v1/agent/bootstrap", Some(&admin), Some(bad.clone())).await?;
        assert_eq!(refused.status, status, "{bad}: {}", refused.text);
        if expected != "invalid_json" {
            assert_eq!(code(&refused), expected, "{bad}: {}", refused.text);
        }
    }

    // The JWT reads the agent's own views; an API key, nothing, or an edited token does not.
    let me = as_agent(&gateway, "/v1/agent/profiles/me", &jwt).await?;
    assert_eq!((me.status, me.body["profile"]["id"].clone()), (200, boot.body["profile"]["id"].clone()), "{}", me.text);
    let with_key = as_agent(&gateway, "/v1/agent/profiles/me", &admin).await?;
    assert_eq!((with_key.status, code(&with_key)), (401, "agent_token_required"), "{}", with_key.text);
    assert_eq!(with_key.body["recovery"]["endpoint"], "/v1/agent/bootstrap");
    let anonymous = gateway.call(Method::GET, "/v1/agent/status", None, None).await?;
    assert_eq!((anonymous.status, code(&anonymous)), (401, "agent_token_required"));
    let edited = format!("{}A", jwt);
    let forged = as_agent(&gateway, "/v1/agent/status", &edited).await?;
    assert_eq!((forged.status, code(&forged)), (401, "invalid_agent_token"), "{}", forged.text);

    // Spend through the agent shows in its status (the counters the budget is enforced on).
    let completion = json!({"model": "anthropic/claude-haiku-4-5", "max_tokens": 10, "messages": [{"role": "user", "content": "hello"}]});
    let attributed = gateway
        .request(Method::POST, "/v1/chat/completions", Some(&admin))
        .header("x-br-agent-id", "researcher")
        .json(&completion)
        .send()
        .await?;
    assert_eq!(attributed.status().as_u16(), 200);
    // The agent family of headers: who answers for the agent, its state and what its budget leaves.
    let header = |name: &str| attributed.headers().get(name).and_then(|value| value.to_str().ok()).map(str::to_string);
    assert_eq!(
        (header("x-br-agent-id"), header("x-br-agent-assertion"), header("x-br-agent-owner"), header("x-br-agent-lifecycle")),
        (Some("researcher".to_string()), Some("registered".to_string()), Some(format!("key:{admin_key_id}")), Some("active".to_string()))
    );
    let agent_left = header("x-br-agent-budget-remaining").and_then(|left| left.parse::<f64>().ok()).unwrap_or_default();
    assert!(agent_left > 0.0 && agent_left < 2.5, "the agent's daily USD 2.5 less this request: {agent_left}");
    // The chained record names the agent's owner, so its signed artifact answers for it.
    let request_id = header("x-br-request-id").unwrap_or_default();
    let mut artifact = Reply::default();
    for _ in 0..100 {
        artifact = gateway.call(Method::GET, &format!("/v1/governance/artifacts/{request_id}"), Some(&admin), None).await?;
        if artifact.status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        artifact.body["accountability"],
        json!({"agentId": "researcher", "ownerId": format!("key:{admin_key_id}"), "ownerSource": "agent_profile", "evidence": "committed"}),
        "{}",
        artifact.text
    );
    assert!(artifact.body["canonical"].as_str().is_some_and(|signed| signed.contains("\"accountability\"")), "{}", artifact.text);
    let mut status = Reply::default();
    for _ in 0..100 {
        status = as_agent(&gateway, "/v1/agent/status", &jwt).await?;
        if status.body["limits"]["enforced_daily_spent_usd"].as_f64().is_some_and(|spent| spent > 0.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status.status, 200, "{}", status.text);
    let limits = &status.body["limits"];
    let spent = limits["enforced_daily_spent_usd"].as_f64().unwrap_or_default();
    assert!(spent > 0.0, "{}", status.text);
    let remaining = limits["enforced_daily_remaining_usd"].as_f64().unwrap_or_default();
    assert!((remaining + spent - 2.5).abs() < 1e-6, "{}", status.text);
    assert_eq!((limits["enforced_daily_usd"].as_f64(), limits["profile_daily_usd"].as_f64()), (Some(2.5), Some(2.5)));
    assert_eq!(status.body["governance"], json!({"lifecycle_state": "active", "manifest_id": null, "role": "agent"}));
    assert!(status.body["anomaly"]["recent_events"].is_array(), "{}", status.text);
    let my_limits = as_agent(&gateway, "/v1/agent/limits/me", &jwt).await?;
    assert_eq!((my_limits.status, my_limits.body["limits"]["enforced_daily_usd"].as_f64()), (200, Some(2.5)), "{}", my_limits.text);
    let my_anomalies = as_agent(&gateway, "/v1/agent/anomaly/me", &jwt).await?;
    assert!(my_anomalies.status == 200 && my_anomalies.body["events"].is_array(), "{}", my_anomalies.text);
    let this_agent = as_agent(&gateway, "/v1/self", &jwt).await?;
    assert_eq!(
        (this_agent.body["type"].as_str(), this_agent.body["agent_id"].as_str()),
        (Some("agent"), Some("researcher")),
        "{}",
        this_agent.text
    );
    let this_key = as_agent(&gateway, "/v1/self", &admin).await?;
    assert_eq!(
        (this_key.body["type"].as_str(), this_key.body["key_id"].as_str()),
        (Some("api_key"), Some(admin_key_id.as_str())),
        "{}",
        this_key.text
    );

    // Lifecycle: suspended agents are refused at once (tokens and bootstrap); terminated ones for good.
    let mv =
        |state: &str| gateway.call(Method::PATCH, "/v1/agent/profiles/lifecycle/researcher", Some(&admin), Some(json!({"state": state})));
    assert_eq!(mv("suspended").await?.status, 200);
    let suspended = as_agent(&gateway, "/v1/agent/profiles/me", &jwt).await?;
    assert_eq!((suspended.status, code(&suspended)), (403, "agent_suspended"), "{}", suspended.text);
    let rebooted = gateway.call(Method::POST, "/v1/agent/bootstrap", Some(&admin), Some(body.clone())).await?;
    assert_eq!((rebooted.status, code(&rebooted)), (403, "agent_suspended"), "{}", rebooted.text);
    // Its completions too, whichever key sends them, before anything reaches the provider.
    let calls = mock.requests().len();
    let refused = completion_as(&gateway, &admin, "researcher").await?;
    assert_eq!((refused.status, code(&refused)), (403, "agent_suspended"), "{}", refused.text);
    assert_eq!(mock.requests().len(), calls);
    assert_eq!(mv("active").await?.status, 200);
    assert_eq!(as_agent(&gateway, "/v1/agent/status", &jwt).await?.status, 200);
    assert_eq!(completion_as(&gateway, &admin, "researcher").await?.status, 200);
    assert_eq!(mv("quarantined").await?.status, 200);
    let quarantined = completion_as(&gateway, &admin, "researcher").await?;
    assert_eq!((quarantined.status, code(&quarantined)), (403, "agent_quarantined"), "{}", quarantined.text);
    assert_eq!(as_agent(&gateway, "/v1/agent/status", &jwt).await?.status, 200, "a quarantined agent still reads its status");
    assert_eq!(mv("active").await?.status, 200);
    // Agents without a profile are attributed, never refused for it.
    let helper = completion_as(&gateway, &admin, "unregistered-helper").await?;
    assert_eq!(
        (helper.status, helper.header("x-br-agent-assertion"), helper.header("x-br-agent-owner")),
        (200, Some("unregistered"), None),
        "{}",
        helper.text
    );
    assert_eq!(mv("suspended").await?.status, 200);
    assert_eq!(mv("terminated").await?.status, 200);
    let terminated = as_agent(&gateway, "/v1/agent/status", &jwt).await?;
    assert_eq!((terminated.status, code(&terminated)), (403, "agent_terminated"), "{}", terminated.text);

    // Another tenant's agent of the same name is its own.
    let (other, _) = gateway.register("Elsewhere").await?;
    let theirs = gateway.call(Method::POST, "/v1/agent/bootstrap", Some(&other), Some(json!({"agent_id": "researcher"}))).await?;
    assert_eq!(theirs.status, 201, "{}", theirs.text);
    assert_ne!(theirs.body["profile"]["id"], boot.body["profile"]["id"]);
    Ok(())
}

async fn an_ownerless_agent_is_held_to_the_switch_turned_on_later(shape: Shape) -> TestResult {
    let mut gateway = Gateway::start(shape).await?;
    let (admin, _) = gateway.register("Late Rules").await?;
    let created = gateway.call(Method::POST, "/v1/agent/profiles", Some(&admin), Some(json!({"agentId": "orphan"}))).await?;
    assert_eq!((created.status, created.body["profile"]["ownerId"].clone()), (201, Value::Null), "{}", created.text);
    let boot = gateway.call(Method::POST, "/v1/agent/bootstrap", Some(&admin), Some(json!({"agent_id": "orphan"}))).await?;
    assert_eq!(
        (boot.status, boot.body["profile"]["ownerId"].clone()),
        (200, Value::Null),
        "an existing profile keeps its owner: {}",
        boot.text
    );
    let jwt = boot.body["jwt"].as_str().unwrap_or_default().to_string();
    assert_eq!(as_agent(&gateway, "/v1/agent/limits/me", &jwt).await?.status, 200);

    // Identity restarted with the switch on: the agent may read its status and profile and exchange
    // its JWT for a certificate, nothing else.
    let identity = match shape {
        Shape::Embedded => "up",
        Shape::Distributed => "identity",
    };
    gateway.kill(identity)?;
    gateway.restart_with(identity, &[("BR_REQUIRE_AGENT_OWNER", "true")]).await?;
    for path in ["/v1/agent/limits/me", "/v1/agent/anomaly/me", "/v1/self"] {
        let refused = as_agent(&gateway, path, &jwt).await?;
        assert_eq!((refused.status, code(&refused)), (403, "owner_required"), "{path}: {}", refused.text);
        assert_eq!(refused.body["recovery"]["endpoint"], "/v1/agent/profiles/orphan");
    }
    for path in ["/v1/agent/status", "/v1/agent/profiles/me"] {
        assert_eq!(as_agent(&gateway, path, &jwt).await?.status, 200, "{path}");
    }
    // The certificate exchange is the spec's third exemption.
    let certificate = gateway.call(Method::POST, "/v1/agent/auth/cert", Some(&jwt), None).await?;
    assert_eq!(certificate.status, 201, "{}", certificate.text);
    let owned = gateway.call(Method::PATCH, "/v1/agent/profiles/orphan", Some(&admin), Some(json!({"ownerId": "user_7"}))).await?;
    assert_eq!(owned.status, 200, "{}", owned.text);
    assert_eq!(as_agent(&gateway, "/v1/agent/limits/me", &jwt).await?.status, 200);
    Ok(())
}

async fn completion_as(gateway: &Gateway, key: &str, agent: &str) -> anyhow::Result<Reply> {
    let completion = json!({"model": "anthropic/claude-haiku-4-5", "max_tokens": 10, "messages": [{"role": "user", "content": "hello"}]});
    post_as(gateway, key, agent, &completion).await
}

/// `completion` sent with `key` on behalf of `agent` (`X-BR-Agent-Id`).
async fn post_as(gateway: &Gateway, key: &str, agent: &str, completion: &Value) -> anyhow::Result<Reply> {
    let response =
        gateway.request(Method::POST, "/v1/chat/completions", Some(key)).header("x-br-agent-id", agent).json(completion).send().await?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await?;
    Ok(Reply { status, body: serde_json::from_str(&text).unwrap_or(Value::Null), text, headers })
}

async fn agent_limits_cap_each_agents_budget_and_rate(shape: Shape) -> TestResult {
    let mock = MockUpstream::start(MockConfig::default()).await?;
    let gateway = Gateway::start_with(shape, &[("BR_PROVIDER_ANTHROPIC_BASE_URL", mock.base_url())]).await?;
    let (admin, _) = gateway.register("Limited Agents").await?;
    let registered =
        gateway.call(Method::POST, "/v1/providers", Some(&admin), Some(json!({"provider": "anthropic", "api_key": ANTHROPIC_KEY}))).await?;
    assert_eq!(registered.status, 201, "{}", registered.text);

    let empty = gateway.call(Method::GET, "/v1/agent-limits", Some(&admin), None).await?;
    assert_eq!(
        (empty.status, empty.body["agentLimits"].clone(), empty.body["version"].clone()),
        (200, json!({}), json!(0)),
        "{}",
        empty.text
    );
    let put = json!({"agent:chatty": {"maxRequestsPerMinute": 2}, "agent:spender": {"maxBudgetUsd": 0.000001}});
    let written = gateway.call(Method::PUT, "/v1/agent-limits", Some(&admin), Some(put)).await?;
    assert_eq!(written.status, 200, "{}", written.text);
    assert_eq!(written.body["version"], 1);
    assert_eq!(
        written.body["agentLimits"],
        json!({"agent:chatty": {"maxBudgetUsd": null, "maxRequestsPerMinute": 2}, "agent:spender": {"maxBudgetUsd": 0.000001, "maxRequestsPerMinute": null}})
    );
    // PATCH merges (either spelling of the body) and null deletes; PUT replaces.
    let merged = gateway
        .call(Method::PATCH, "/v1/agent-limits", Some(&admin), Some(json!({"agentLimits": {"agent:extra": {"maxRequestsPerMinute": 9}}})))
        .await?;
    assert_eq!((merged.status, merged.body["version"].clone()), (200, json!(2)), "{}", merged.text);
    assert_eq!(merged.body["agentLimits"].as_object().map(|map| map.len()), Some(3));
    let deleted = gateway.call(Method::PATCH, "/v1/agent-limits", Some(&admin), Some(json!({"agent:extra": null}))).await?;
    assert_eq!(
        (deleted.body["version"].clone(), deleted.body["agentLimits"].get("agent:extra").is_none()),
        (json!(3), true),
        "{}",
        deleted.text
    );
    let read = gateway.call(Method::GET, "/v1/agent-limits", Some(&admin), None).await?;
    assert_eq!(read.body["agentLimits"], deleted.body["agentLimits"]);
    for (method, bad, expected) in [
        (Method::PATCH, json!({"chatty": {"maxRequestsPerMinute": 1}}), "invalid_agent_limit_key"),
        (Method::PATCH, json!({"agent:chatty": {}}), "invalid_agent_limit"),
        (Method::PATCH, json!({"agent:chatty": {"maxRequestsPerMinute": 0}}), "invalid_agent_limit"),
        (Method::PATCH, json!({"agent:chatty": {"rpm": 1}}), "invalid_agent_limit"),
        (Method::PUT, json!({"agent:chatty": null}), "invalid_agent_limit"),
        (Method::PUT, json!([1, 2]), "invalid_agent_limits"),
    ] {
        let refused = gateway.call(method.clone(), "/v1/agent-limits", Some(&admin), Some(bad.clone())).await?;
        assert_eq!((refused.status, code(&refused)), (400, expected), "{method} {bad}: {}", refused.text);
    }
    assert_eq!(gateway.call(Method::GET, "/v1/agent-limits", Some(&admin), None).await?.body["version"], 3, "refusals write nothing");
    let developer = gateway.key_with_role(&admin, "developer").await?;
    let auditor = gateway.key_with_role(&admin, "auditor").await?;
    assert_eq!(gateway.call(Method::GET, "/v1/agent-limits", Some(&developer), None).await?.status, 403);
    assert_eq!(gateway.call(Method::PATCH, "/v1/agent-limits", Some(&auditor), Some(json!({"agent:x": null}))).await?.status, 403);

    // The rate holds for the agent whichever key sends its requests; other agents are untouched.
    assert_eq!(completion_as(&gateway, &admin, "chatty").await?.status, 200);
    assert_eq!(completion_as(&gateway, &developer, "chatty").await?.status, 200);
    let limited = completion_as(&gateway, &admin, "chatty").await?;
    assert_eq!(limited.status, 429, "{}", limited.text);
    assert!(limited.body["error"]["message"].as_str().is_some_and(|message| message.contains("agent")), "{}", limited.text);
    assert!(limited.header("retry-after").is_some());
    assert_eq!(completion_as(&gateway, &admin, "quiet").await?.status, 200);
    // The cap on spend: a budget below any request's estimate refuses before the provider is called.
    let calls = mock.requests().len();
    let capped = completion_as(&gateway, &admin, "spender").await?;
    assert_eq!(capped.status, 402, "{}", capped.text);
    assert_eq!(capped.body["error"]["scope"], "agent_daily", "{}", capped.text);
    assert_eq!(mock.requests().len(), calls, "the refused request never reached the provider");

    // The agent sees its enforced limits and this minute's requests.
    let boot = gateway.call(Method::POST, "/v1/agent/bootstrap", Some(&admin), Some(json!({"agent_id": "chatty"}))).await?;
    assert_eq!(boot.status, 201, "{}", boot.text);
    assert_eq!(boot.body["budget"]["enforced_rpm"], 2);
    let jwt = boot.body["jwt"].as_str().unwrap_or_default().to_string();
    let limits = as_agent(&gateway, "/v1/agent/limits/me", &jwt).await?;
    assert_eq!(
        (limits.body["limits"]["enforced_rpm"].clone(), limits.body["limits"]["requests_this_minute"].clone()),
        (json!(2), json!(2)),
        "{}",
        limits.text
    );
    let spender = gateway
        .call(Method::POST, "/v1/agent/bootstrap", Some(&admin), Some(json!({"agent_id": "spender", "budget_daily_usd": 5})))
        .await?;
    assert_eq!(spender.body["budget"]["enforced_daily_usd"], json!(0.000001), "the tighter of budget and cap: {}", spender.text);
    Ok(())
}

async fn parents_delegate_budget_to_sub_agents_and_get_the_unspent_back(shape: Shape) -> TestResult {
    let mock = MockUpstream::start(MockConfig::default()).await?;
    let gateway = Gateway::start_with(shape, &[("BR_PROVIDER_ANTHROPIC_BASE_URL", mock.base_url())]).await?;
    let (admin, _) = gateway.register("Delegation").await?;
    let registered =
        gateway.call(Method::POST, "/v1/providers", Some(&admin), Some(json!({"provider": "anthropic", "api_key": ANTHROPIC_KEY}))).await?;
    assert_eq!(registered.status, 201, "{}", registered.text);
    let lead = gateway
        .call(
            Method::POST,
            "/v1/agent/bootstrap",
            Some(&admin),
            Some(json!({"agent_id": "lead", "budget_daily_usd": 1, "metadata": {"can_delegate": true}})),
        )
        .await?;
    assert_eq!((lead.status, lead.body["budget"]["enforced_rpm"].clone()), (201, json!(600)), "{}", lead.text);
    let lead_jwt = lead.body["jwt"].as_str().unwrap_or_default().to_string();
    // A sub-agent is held to its parent's rate.
    let slowed =
        gateway.call(Method::PATCH, "/v1/agent-limits", Some(&admin), Some(json!({"agent:lead": {"maxRequestsPerMinute": 12}}))).await?;
    assert_eq!(slowed.status, 200, "{}", slowed.text);
    let delegate = |jwt: String, body: Value| {
        let gateway = &gateway;
        async move { gateway.call(Method::POST, "/v1/agent/delegate", Some(&jwt), Some(body)).await }
    };

    let with_key = gateway
        .call(Method::POST, "/v1/agent/delegate", Some(&admin), Some(json!({"agent_id": "scout", "budget_allocation_usd": 0.25})))
        .await?;
    assert_eq!((with_key.status, code(&with_key)), (401, "agent_token_required"), "delegation takes the parent's JWT: {}", with_key.text);
    let body = json!({"agent_id": "scout", "budget_allocation_usd": 0.25, "requested_name": "Scout", "ttl_seconds": 3600, "metadata": {"task": "search"}});
    let scout = delegate(lead_jwt.clone(), body.clone()).await?;
    assert_eq!(scout.status, 201, "{}", scout.text);
    let profile = &scout.body["profile"];
    assert_eq!(
        (
            profile["parentAgentId"].as_str(),
            profile["displayName"].as_str(),
            profile["lifecycleState"].as_str(),
            profile["budgetDailyUsd"].as_f64()
        ),
        (Some("lead"), Some("Scout"), Some("active"), Some(0.25))
    );
    assert!(profile["expiresAt"].is_string(), "{}", scout.text);
    assert_eq!(
        (scout.body["budget"]["enforced_daily_usd"].as_f64(), scout.body["parent"]["budget_daily_usd"].as_f64()),
        (Some(0.25), Some(0.75))
    );
    assert_eq!(scout.body["budget"]["enforced_rpm"], 12, "{}", scout.text);
    let scout_jwt = scout.body["jwt"].as_str().unwrap_or_default().to_string();
    assert_eq!(as_agent(&gateway, "/v1/agent/profiles/me", &scout_jwt).await?.body["profile"]["agentId"], "scout");
    let again = delegate(lead_jwt.clone(), body).await?;
    assert_eq!((again.status, again.body["parent"]["budget_daily_usd"].as_f64()), (200, Some(0.75)), "{}", again.text);
    // What is enforced follows what moved: the parent's ledger budget and the child's.
    let agents = gateway.call(Method::GET, "/v1/budget/agents", Some(&admin), None).await?;
    let per_day = |agent: &str| {
        agents.body["agents"]
            .as_array()
            .and_then(|all| all.iter().find(|entry| entry["agentId"] == agent))
            .map(|entry| entry["config"]["perDayUsd"].clone())
    };
    assert_eq!((per_day("lead"), per_day("scout")), (Some(json!(0.75)), Some(json!(0.25))), "{}", agents.text);

    for (bad, status, expected) in [
        (json!({"agent_id": "boss", "budget_allocation_usd": 0.1, "requested_role": "admin"}), 403, "role_exceeds_parent"),
        (json!({"agent_id": "greedy", "budget_allocation_usd": 0.745}), 402, "insufficient_budget"),
        (json!({"agent_id": "nothing"}), 400, "allocation_required"),
        (json!({"budget_allocation_usd": 0.1}), 400, "agent_id_required"),
        (json!({"agent_id": "lead", "budget_allocation_usd": 0.1}), 409, "agent_exists"),
    ] {
        let refused = delegate(lead_jwt.clone(), bad.clone()).await?;
        assert_eq!((refused.status, code(&refused)), (status, expected), "{bad}: {}", refused.text);
    }
    let by_child = delegate(scout_jwt.clone(), json!({"agent_id": "grandchild", "budget_allocation_usd": 0.01})).await?;
    assert_eq!((by_child.status, code(&by_child)), (403, "delegation_not_allowed"), "{}", by_child.text);

    // The child spends under its own id; ended by its parent, the unspent part goes back.
    assert_eq!(completion_as(&gateway, &admin, "scout").await?.status, 200);
    let mut spent = 0.0;
    for _ in 0..100 {
        let status = as_agent(&gateway, "/v1/agent/status", &scout_jwt).await?;
        spent = status.body["limits"]["enforced_daily_spent_usd"].as_f64().unwrap_or_default();
        if spent > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(spent > 0.0);
    let listed = as_agent(&gateway, "/v1/agent/sub-agents", &lead_jwt).await?;
    assert_eq!(
        (listed.body["total"].as_u64(), listed.body["sub_agents"][0]["agent_id"].as_str()),
        (Some(1), Some("scout")),
        "{}",
        listed.text
    );
    let not_parent = gateway.call(Method::DELETE, "/v1/agent/sub-agents/scout", Some(&scout_jwt), None).await?;
    assert_eq!((not_parent.status, code(&not_parent)), (403, "not_parent"), "{}", not_parent.text);
    let ended = gateway.call(Method::DELETE, "/v1/agent/sub-agents/scout", Some(&lead_jwt), None).await?;
    assert_eq!(ended.status, 200, "{}", ended.text);
    let refunded = ended.body["budget_refunded_usd"].as_f64().unwrap_or_default();
    assert!((refunded + spent - 0.25).abs() < 1e-9, "refund {refunded} + spent {spent}: {}", ended.text);
    assert_eq!((ended.body["terminated_agent_id"].as_str(), ended.body["already_terminated"].as_bool()), (Some("scout"), Some(false)));
    let terminated = as_agent(&gateway, "/v1/agent/status", &scout_jwt).await?;
    assert_eq!((terminated.status, code(&terminated)), (403, "agent_terminated"));
    let twice = gateway.call(Method::DELETE, "/v1/agent/sub-agents/scout", Some(&lead_jwt), None).await?;
    assert_eq!(
        (twice.body["already_terminated"].as_bool(), twice.body["budget_refunded_usd"].as_f64()),
        (Some(true), Some(0.0)),
        "{}",
        twice.text
    );
    let lead_profile = as_agent(&gateway, "/v1/agent/profiles/me", &lead_jwt).await?;
    let lead_budget = lead_profile.body["profile"]["budgetDailyUsd"].as_f64().unwrap_or_default();
    assert!((lead_budget - (0.75 + refunded)).abs() < 1e-9, "{}", lead_profile.text);
    let stopped = completion_as(&gateway, &admin, "scout").await?;
    assert_eq!((stopped.status, code(&stopped)), (403, "agent_terminated"), "a terminated child spends nothing more: {}", stopped.text);

    // A child with a lifetime: its token stops at expiry, and the parent's next call ends it with a full refund.
    let flash = delegate(lead_jwt.clone(), json!({"agent_id": "flash", "budget_allocation_usd": 0.1, "ttl_seconds": 1})).await?;
    assert_eq!(flash.status, 201, "{}", flash.text);
    let flash_jwt = flash.body["jwt"].as_str().unwrap_or_default().to_string();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let expired = as_agent(&gateway, "/v1/agent/status", &flash_jwt).await?;
    assert_eq!((expired.status, code(&expired)), (403, "agent_expired"), "{}", expired.text);
    let listed = as_agent(&gateway, "/v1/agent/sub-agents", &lead_jwt).await?;
    assert_eq!(listed.body["total"], 0, "{}", listed.text);
    let flash_profile = gateway.call(Method::GET, "/v1/agent/profiles/flash", Some(&admin), None).await?;
    assert_eq!(flash_profile.body["profile"]["lifecycleState"], "terminated", "{}", flash_profile.text);
    let lead_after =
        as_agent(&gateway, "/v1/agent/profiles/me", &lead_jwt).await?.body["profile"]["budgetDailyUsd"].as_f64().unwrap_or_default();
    assert!((lead_after - lead_budget).abs() < 1e-9, "the whole 0.1 came back: {lead_after} against {lead_budget}");
    Ok(())
}

/// A completion as `agent` asking for Sonnet with Haiku as its fallback.
async fn sonnet_or_haiku_as(gateway: &Gateway, key: &str, agent: &str) -> anyhow::Result<Reply> {
    let completion = json!({
        "model": "anthropic/claude-sonnet-4-6",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hello"}],
        "route": {"models": ["anthropic/claude-haiku-4-5"]},
    });
    post_as(gateway, key, agent, &completion).await
}

/// The claims of a JWT, unverified.
fn claims(jwt: &str) -> anyhow::Result<Value> {
    use base64::Engine;
    let payload = jwt.split('.').nth(1).ok_or_else(|| anyhow::anyhow!("not a JWT"))?;
    Ok(serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload)?)?)
}

async fn an_xdr_risk_score_restricts_an_agent_and_rides_in_its_token(shape: Shape) -> TestResult {
    use brainstorm_e2e::PLATFORM_ADMIN_KEY as PLATFORM;
    let push = json!({"tenant_id": "t", "agent_id": "researcher", "risk_score": 0.9, "source": "crowdstrike"});
    // Off unless the gateway's bidirectional XDR switch is on.
    let switched_off = Gateway::start(shape).await?;
    let refused = switched_off.call(Method::POST, "/v1/admin/xdr/risk-push", Some(PLATFORM), Some(push)).await?;
    assert_eq!((refused.status, code(&refused)), (403, "feature_disabled"), "{}", refused.text);
    drop(switched_off);

    let mock = MockUpstream::start(MockConfig::default()).await?;
    let gateway =
        Gateway::start_with(shape, &[("BR_PROVIDER_ANTHROPIC_BASE_URL", mock.base_url()), ("BR_XDR_BIDIRECTIONAL", "true")]).await?;
    let (admin, registration) = gateway.register("Risky Agents").await?;
    let tenant_id = registration["tenant"]["id"].as_str().unwrap_or_default().to_string();
    let registered =
        gateway.call(Method::POST, "/v1/providers", Some(&admin), Some(json!({"provider": "anthropic", "api_key": ANTHROPIC_KEY}))).await?;
    assert_eq!(registered.status, 201, "{}", registered.text);
    let boot = gateway.call(Method::POST, "/v1/agent/bootstrap", Some(&admin), Some(json!({"agent_id": "researcher"}))).await?;
    assert_eq!(boot.status, 201, "{}", boot.text);
    assert!(claims(boot.body["jwt"].as_str().unwrap_or_default())?.get("br_trust").is_none(), "no score, no trust envelope");
    let before = sonnet_or_haiku_as(&gateway, &admin, "researcher").await?;
    assert_eq!(before.header("x-br-routed-model"), Some("anthropic/claude-sonnet-4-6"), "{}", before.text);

    // Only the platform administrator pushes; bad input is named.
    let push = json!({"tenant_id": tenant_id, "agent_id": "researcher", "risk_score": 0.85, "source": "crowdstrike", "ttl_seconds": 600});
    let by_tenant = gateway.call(Method::POST, "/v1/admin/xdr/risk-push", Some(&admin), Some(push.clone())).await?;
    assert_eq!(by_tenant.status, 403, "{}", by_tenant.text);
    for (field, bad) in [("risk_score", json!(1.5)), ("source", json!("")), ("ttl_seconds", json!(2_592_001)), ("agent_id", json!(null))] {
        let mut body = push.clone();
        body[field] = bad;
        let reply = gateway.call(Method::POST, "/v1/admin/xdr/risk-push", Some(PLATFORM), Some(body)).await?;
        assert_eq!(reply.status, 400, "{field}: {}", reply.text);
    }
    let mut unknown = push.clone();
    unknown["tenant_id"] = json!("no-such-tenant");
    assert_eq!(gateway.call(Method::POST, "/v1/admin/xdr/risk-push", Some(PLATFORM), Some(unknown)).await?.status, 404);

    // A dry run says what would be set and sets nothing.
    let dry = gateway.call(Method::POST, "/v1/admin/xdr/risk-push?dry_run=true", Some(PLATFORM), Some(push.clone())).await?;
    assert_eq!((dry.status, dry.body["dry_run"].as_bool()), (200, Some(true)), "{}", dry.text);
    assert_eq!((dry.body["would_set"]["risk_score"].as_f64(), dry.body["would_set"]["restricted"].as_bool()), (Some(0.85), Some(true)));
    let jwt = boot.body["jwt"].as_str().unwrap_or_default().to_string();
    assert_eq!(as_agent(&gateway, "/v1/agent/status", &jwt).await?.body["trust"], Value::Null);

    let pushed = gateway.call(Method::POST, "/v1/admin/xdr/risk-push", Some(PLATFORM), Some(push)).await?;
    assert_eq!(pushed.status, 200, "{}", pushed.text);
    assert_eq!((pushed.body["risk"]["risk_score"].as_f64(), pushed.body["risk"]["restricted"].as_bool()), (Some(0.85), Some(true)));
    // Its routing is restricted: the cheapest candidate first, whatever it asked for; others are not.
    let restricted = sonnet_or_haiku_as(&gateway, &admin, "researcher").await?;
    assert_eq!(restricted.status, 200, "{}", restricted.text);
    assert_eq!(restricted.header("x-br-routed-model"), Some("anthropic/claude-haiku-4-5"), "{}", restricted.text);
    assert_eq!(restricted.header("x-br-trust-restricted"), Some("xdr_risk"));
    assert!(restricted.header("x-br-route-reason").is_some_and(|reason| reason.contains("XDR risk 0.85 from crowdstrike")));
    let other = sonnet_or_haiku_as(&gateway, &admin, "writer").await?;
    assert_eq!(other.header("x-br-routed-model"), Some("anthropic/claude-sonnet-4-6"), "{}", other.text);
    // Its next token carries the score; its status shows it.
    let again = gateway.call(Method::POST, "/v1/agent/bootstrap", Some(&admin), Some(json!({"agent_id": "researcher"}))).await?;
    let trust = claims(again.body["jwt"].as_str().unwrap_or_default())?["br_trust"].clone();
    assert_eq!((trust["xdr_risk"].as_f64(), trust["xdr_risk_source"].as_str()), (Some(0.85), Some("crowdstrike")), "{trust}");
    let status = as_agent(&gateway, "/v1/agent/status", &jwt).await?;
    assert_eq!((status.body["trust"]["xdr_risk"].as_f64(), status.body["trust"]["restricted"].as_bool()), (Some(0.85), Some(true)));

    // Cleared (a dry run first): the agent routes as before.
    let clear = json!({"tenant_id": tenant_id, "agent_id": "researcher"});
    let dry_clear = gateway.call(Method::DELETE, "/v1/admin/xdr/risk-push?dry_run=true", Some(PLATFORM), Some(clear.clone())).await?;
    assert_eq!(dry_clear.body["would_clear"]["risk_score"].as_f64(), Some(0.85), "{}", dry_clear.text);
    let cleared = gateway.call(Method::DELETE, "/v1/admin/xdr/risk-push", Some(PLATFORM), Some(clear.clone())).await?;
    assert_eq!((cleared.status, cleared.body["cleared"].as_bool()), (200, Some(true)), "{}", cleared.text);
    let twice = gateway.call(Method::DELETE, "/v1/admin/xdr/risk-push", Some(PLATFORM), Some(clear)).await?;
    assert_eq!(twice.body["cleared"].as_bool(), Some(false));
    let after = sonnet_or_haiku_as(&gateway, &admin, "researcher").await?;
    assert_eq!(after.header("x-br-routed-model"), Some("anthropic/claude-sonnet-4-6"), "{}", after.text);
    Ok(())
}
