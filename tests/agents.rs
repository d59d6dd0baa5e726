//! Agent profiles end to end in both shapes: create, read, change and delete them, move them
//! through their lifecycle (every move the table forbids is a 409), with the roles that may do
//! each, and the owner-required switch.

use brainstorm_e2e::{Gateway, Shape};
use reqwest::Method;
use serde_json::{Value, json};

type TestResult = anyhow::Result<()>;

brainstorm_e2e::in_both_shapes!(profiles_are_managed_and_moved_through_their_lifecycle, the_owner_required_switch_refuses_ownerless_agents);

async fn key_with_role(gateway: &Gateway, admin: &str, role: &str) -> anyhow::Result<String> {
    let reply = gateway.call(Method::POST, "/v1/api-keys", Some(admin), Some(json!({"name": role, "role": role}))).await?;
    assert_eq!(reply.status, 201, "{}", reply.text);
    Ok(reply.body["api_key"]["key"].as_str().unwrap_or_default().to_string())
}

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
    let developer = key_with_role(&gateway, &admin, "developer").await?;
    let auditor = key_with_role(&gateway, &admin, "auditor").await?;
    let operator = key_with_role(&gateway, &admin, "operator").await?;
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
