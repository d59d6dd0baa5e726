//! The gateway's contract, driven over HTTP against the real binary, identically in both shapes:
//! embedded (`brainstorm up`) and distributed (`serve identity` + `serve edge-router` on PostgreSQL).

use brainstorm_e2e::{Gateway, PLATFORM_ADMIN_KEY, Reply, Shape};
use reqwest::Method;
use serde_json::{Value, json};

type TestResult = anyhow::Result<()>;

brainstorm_e2e::in_both_shapes!(
    registration_returns_tenant_key_and_claim,
    oauth_apps_trade_a_pkce_code_for_a_scoped_key,
    registration_rejects_bad_bodies_with_the_envelope,
    missing_malformed_unknown_revoked_and_expired_keys_get_401,
    roles_and_permissions_are_enforced,
    capabilities_are_listed_and_described_with_what_the_key_may_call,
    account_profile_and_users,
    claim_links_need_the_admin_scope,
    api_keys_are_masked_and_carry_their_limits,
    platform_admin_manages_tenants_and_invite_codes,
    a_tenants_suspension_and_approval_reach_its_siem,
    sandbox_completions_in_the_openai_format,
    sandbox_messages_in_the_anthropic_format,
    errors_always_carry_the_envelope,
);

fn assert_envelope(reply: &Reply, status: u16, error_type: &str) {
    assert_eq!(reply.status, status, "{}", reply.text);
    assert_eq!(reply.body["error"]["type"], error_type, "{}", reply.text);
    assert!(reply.body["error"]["message"].as_str().is_some_and(|message| !message.is_empty()));
    for field in ["action", "endpoint", "method", "body_template", "docs_url", "message"] {
        assert!(reply.body["recovery"].get(field).is_some(), "recovery.{field} missing: {}", reply.text);
    }
    assert!(reply.header("x-br-recovery-action").is_some(), "no X-BR-Recovery-Action");
    assert!(reply.header("x-br-recovery-endpoint").is_some());
    assert!(reply.header("x-br-recovery-docs").is_some());
    assert!(reply.header("x-br-request-id").is_some_and(|id| id.starts_with("req_")));
}

async fn create_key(gateway: &Gateway, admin_key: &str, body: Value) -> anyhow::Result<String> {
    let reply = gateway.call(Method::POST, "/v1/api-keys", Some(admin_key), Some(body)).await?;
    assert_eq!(reply.status, 201, "{}", reply.text);
    Ok(reply.body["api_key"]["key"].as_str().unwrap_or_default().to_string())
}

async fn registration_returns_tenant_key_and_claim(shape: Shape) -> TestResult {
    let gateway = Gateway::start(shape).await?;
    let reply = gateway.call(Method::POST, "/v1/register", None, Some(json!({"tenant_name": "Acme Rockets", "accept_tos": true}))).await?;
    assert_eq!(reply.status, 201, "{}", reply.text);
    let body = &reply.body;
    assert_eq!(body["tenant"]["name"], "Acme Rockets");
    assert_eq!(body["tenant"]["plan"], "sandbox");
    assert!(body["tenant"]["id"].as_str().is_some_and(|id| !id.is_empty()));
    assert!(body["tenant"]["slug"].as_str().is_some_and(|slug| slug.starts_with("acme-rockets-")));
    assert!(body["api_key"]["key"].as_str().is_some_and(|key| key.starts_with("br_live_")));
    assert_eq!(body["api_key"]["scopes"], json!(["admin"]));
    let token = body["claim"]["token"].as_str().unwrap_or_default();
    assert!(token.starts_with("brct_"));
    assert!(body["claim"]["url"].as_str().is_some_and(|url| url.contains(token)));
    let expires_at = body["claim"]["expires_at"].as_str().unwrap_or_default();
    assert!(expires_at.len() >= 20 && expires_at.contains('T'), "ISO 8601 expected: {expires_at}");

    let key = body["api_key"]["key"].as_str().unwrap_or_default();
    let account = gateway.call(Method::GET, "/v1/account", Some(key), None).await?;
    assert_eq!(account.status, 200, "{}", account.text);
    assert_eq!(account.body["tenant"]["id"], body["tenant"]["id"]);
    assert_eq!(account.body["tenant"]["tier"], "community");
    Ok(())
}

async fn registration_rejects_bad_bodies_with_the_envelope(shape: Shape) -> TestResult {
    let gateway = Gateway::start(shape).await?;
    let cases = [
        json!({"accept_tos": true}),
        json!({"tenant_name": "Acme"}),
        json!({"tenant_name": "Acme", "accept_tos": false}),
        json!({"tenant_name": "", "accept_tos": true}),
        json!({"tenant_name": 42, "accept_tos": true}),
    ];
    for body in cases {
        let reply = gateway.call(Method::POST, "/v1/register", None, Some(body.clone())).await?;
        assert_envelope(&reply, 400, "invalid_request_error");
    }
    let garbage =
        gateway.request(Method::POST, "/v1/register", None).header("content-type", "application/json").body("{not json").send().await?;
    assert_eq!(garbage.status().as_u16(), 400);
    let empty = gateway.request(Method::POST, "/v1/register", None).send().await?;
    assert_eq!(empty.status().as_u16(), 400);
    Ok(())
}

async fn missing_malformed_unknown_revoked_and_expired_keys_get_401(shape: Shape) -> TestResult {
    let gateway = Gateway::start(shape).await?;
    let (admin_key, _) = gateway.register("Acme").await?;

    let missing = gateway.call(Method::GET, "/v1/account", None, None).await?;
    assert_envelope(&missing, 401, "authentication_error");
    assert_eq!(missing.body["recovery"]["action"], "authenticate");
    let malformed = gateway.request(Method::GET, "/v1/account", None).header("authorization", "Token abc").send().await?;
    assert_eq!(malformed.status().as_u16(), 401);
    let not_ours = gateway.call(Method::GET, "/v1/account", Some("sk-123"), None).await?;
    assert_envelope(&not_ours, 401, "authentication_error");
    let unknown = gateway.call(Method::GET, "/v1/account", Some("br_live_ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ"), None).await?;
    assert_envelope(&unknown, 401, "authentication_error");

    // Anthropic clients send x-api-key.
    let via_x_api_key = gateway.request(Method::GET, "/v1/account", None).header("x-api-key", &admin_key).send().await?;
    assert_eq!(via_x_api_key.status().as_u16(), 200);

    // Revoked: the key works, is revoked, then fails at once.
    let created = gateway.call(Method::POST, "/v1/api-keys", Some(&admin_key), Some(json!({"name": "temp", "role": "developer"}))).await?;
    let temp_key = created.body["api_key"]["key"].as_str().unwrap_or_default().to_string();
    let temp_id = created.body["api_key"]["id"].as_str().unwrap_or_default().to_string();
    assert_eq!(gateway.call(Method::GET, "/v1/account", Some(&temp_key), None).await?.status, 200);
    let revoked = gateway.call(Method::DELETE, &format!("/v1/api-keys/{temp_id}"), Some(&admin_key), None).await?;
    assert_eq!(revoked.status, 200, "{}", revoked.text);
    assert_eq!(revoked.body["api_key"]["status"], "revoked");
    let after = gateway.call(Method::GET, "/v1/account", Some(&temp_key), None).await?;
    assert_envelope(&after, 401, "authentication_error");
    assert_eq!(after.body["error"]["code"], "revoked_api_key");
    let missing_key = gateway.call(Method::DELETE, "/v1/api-keys/nope", Some(&admin_key), None).await?;
    assert_envelope(&missing_key, 404, "not_found_error");

    // Expired: a key that expires in two seconds works, then stops.
    let expires_at = (std::time::SystemTime::now() + std::time::Duration::from_secs(2)).duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let expires_at = format_epoch(expires_at);
    let short_lived = create_key(&gateway, &admin_key, json!({"name": "short", "role": "developer", "expires_at": expires_at})).await?;
    assert_eq!(gateway.call(Method::GET, "/v1/account", Some(&short_lived), None).await?.status, 200);
    tokio::time::sleep(std::time::Duration::from_millis(2600)).await;
    let expired = gateway.call(Method::GET, "/v1/account", Some(&short_lived), None).await?;
    assert_envelope(&expired, 401, "authentication_error");
    Ok(())
}

/// Seconds since the epoch as an RFC 3339 UTC instant (days-from-civil, no date library needed).
fn format_epoch(seconds: u64) -> String {
    let days = (seconds / 86_400) as i64;
    let remainder = seconds % 86_400;
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", remainder / 3600, remainder % 3600 / 60, remainder % 60)
}

async fn roles_and_permissions_are_enforced(shape: Shape) -> TestResult {
    let gateway = Gateway::start(shape).await?;
    let (admin_key, _) = gateway.register("Acme").await?;
    let developer = create_key(&gateway, &admin_key, json!({"name": "dev", "role": "developer"})).await?;
    let auditor = create_key(&gateway, &admin_key, json!({"name": "audit", "role": "auditor"})).await?;
    let operator = create_key(&gateway, &admin_key, json!({"name": "ops", "role": "operator"})).await?;

    assert_eq!(gateway.call(Method::GET, "/v1/account", Some(&developer), None).await?.status, 200);
    let patch = gateway.call(Method::PATCH, "/v1/account", Some(&developer), Some(json!({"name": "Renamed"}))).await?;
    assert_envelope(&patch, 403, "forbidden");
    assert_eq!(patch.body["error"]["code"], "forbidden");
    let mint = gateway.call(Method::POST, "/v1/api-keys", Some(&developer), Some(json!({"name": "x"}))).await?;
    assert_envelope(&mint, 403, "forbidden");
    let completion = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    let audit_completion = gateway.call(Method::POST, "/v1/chat/completions", Some(&auditor), Some(completion.clone())).await?;
    assert_envelope(&audit_completion, 403, "forbidden");
    assert_eq!(gateway.call(Method::GET, "/v1/models", Some(&auditor), None).await?.status, 200);
    assert_eq!(gateway.call(Method::POST, "/v1/chat/completions", Some(&developer), Some(completion)).await?.status, 200);

    // An operator may mint keys (config.write) but never one above itself.
    assert_eq!(gateway.call(Method::POST, "/v1/api-keys", Some(&operator), Some(json!({"role": "developer"}))).await?.status, 201);
    let escalation = gateway.call(Method::POST, "/v1/api-keys", Some(&operator), Some(json!({"role": "admin"}))).await?;
    assert_envelope(&escalation, 403, "forbidden");

    // Tenant keys cannot reach platform administration.
    let admin_route = gateway.call(Method::GET, "/v1/admin/tenants", Some(&admin_key), None).await?;
    assert_envelope(&admin_route, 403, "forbidden");
    // And the platform key has no tenant.
    let no_tenant = gateway.call(Method::GET, "/v1/account", Some(PLATFORM_ADMIN_KEY), None).await?;
    assert_eq!(no_tenant.status, 403);
    Ok(())
}

async fn account_profile_and_users(shape: Shape) -> TestResult {
    let gateway = Gateway::start(shape).await?;
    let (admin_key, _) = gateway.register("Acme").await?;
    let renamed = gateway.call(Method::PATCH, "/v1/account", Some(&admin_key), Some(json!({"name": "Acme Labs"}))).await?;
    assert_eq!(renamed.status, 200, "{}", renamed.text);
    assert_eq!(renamed.body["tenant"]["name"], "Acme Labs");
    let empty = gateway.call(Method::PATCH, "/v1/account", Some(&admin_key), Some(json!({"name": ""}))).await?;
    assert_envelope(&empty, 400, "invalid_request_error");
    let unchanged = gateway.call(Method::GET, "/v1/account", Some(&admin_key), None).await?;
    assert_eq!(unchanged.body["tenant"]["name"], "Acme Labs", "a rejected update must not change anything");

    let invited = gateway
        .call(Method::POST, "/v1/account/users/invite", Some(&admin_key), Some(json!({"email": "ada@example.com", "role": "admin"})))
        .await?;
    assert_eq!(invited.status, 201, "{}", invited.text);
    let invitation = &invited.body["invitation"];
    assert_eq!(invitation["email"], "ada@example.com");
    assert_eq!(invitation["role"], "admin");
    let claim_url = invitation["claim_url"].as_str().unwrap_or_default().to_string();
    assert!(claim_url.contains("brct_"));
    assert!(invitation["expires_at"].as_str().is_some());
    let mails = gateway.mails()?;
    assert_eq!(mails.len(), 1, "one invitation mail in the outbox");
    assert_eq!(mails[0]["to"], "ada@example.com");
    assert!(mails[0]["body"].as_str().unwrap_or_default().contains(&claim_url));

    for bad in [json!({}), json!({"email": "not-an-email"}), json!({"email": "bob@example.com", "role": "emperor"})] {
        let reply = gateway.call(Method::POST, "/v1/account/users/invite", Some(&admin_key), Some(bad)).await?;
        assert_envelope(&reply, 400, "invalid_request_error");
    }
    let duplicate =
        gateway.call(Method::POST, "/v1/account/users/invite", Some(&admin_key), Some(json!({"email": "ada@example.com"}))).await?;
    assert_eq!(duplicate.status, 409);

    let users = gateway.call(Method::GET, "/v1/account/users", Some(&admin_key), None).await?;
    assert_eq!(users.body["total"], 1);
    let user_id = users.body["users"][0]["id"].as_str().unwrap_or_default().to_string();
    let account = gateway.call(Method::GET, "/v1/account", Some(&admin_key), None).await?;
    assert_eq!(account.body["tenant"]["user_count"], 1);

    // Another tenant sees none of it.
    let (other_key, _) = gateway.register("Other").await?;
    let other_users = gateway.call(Method::GET, "/v1/account/users", Some(&other_key), None).await?;
    assert_eq!(other_users.body["total"], 0);
    let foreign_delete = gateway.call(Method::DELETE, &format!("/v1/account/users/{user_id}"), Some(&other_key), None).await?;
    assert_envelope(&foreign_delete, 404, "not_found_error");

    let deleted = gateway.call(Method::DELETE, &format!("/v1/account/users/{user_id}"), Some(&admin_key), None).await?;
    assert_eq!(deleted.status, 200, "{}", deleted.text);
    assert_eq!(deleted.body["deleted"], json!({"id": user_id, "email": "ada@example.com"}));
    let again = gateway.call(Method::DELETE, &format!("/v1/account/users/{user_id}"), Some(&admin_key), None).await?;
    assert_envelope(&again, 404, "not_found_error");
    Ok(())
}

async fn claim_links_need_the_admin_scope(shape: Shape) -> TestResult {
    let gateway = Gateway::start(shape).await?;
    let (admin_key, _) = gateway.register("Acme").await?;
    let link = gateway
        .call(Method::POST, "/v1/tenant/claim-link", Some(&admin_key), Some(json!({"role": "member", "max_uses": 5, "expires_in_days": 3})))
        .await?;
    assert_eq!(link.status, 201, "{}", link.text);
    assert!(link.body["url"].as_str().is_some_and(|url| url.contains("brct_")));
    assert_eq!(link.body["max_uses"], 5);
    let bad_role = gateway.call(Method::POST, "/v1/tenant/claim-link", Some(&admin_key), Some(json!({"role": "king"}))).await?;
    assert_envelope(&bad_role, 400, "invalid_request_error");
    let operator = create_key(&gateway, &admin_key, json!({"role": "operator"})).await?;
    let refused = gateway.call(Method::POST, "/v1/tenant/claim-link", Some(&operator), Some(json!({"role": "member"}))).await?;
    assert_envelope(&refused, 403, "forbidden");
    Ok(())
}

async fn api_keys_are_masked_and_carry_their_limits(shape: Shape) -> TestResult {
    let gateway = Gateway::start(shape).await?;
    let (admin_key, _) = gateway.register("Acme").await?;
    let body = json!({
        "name": "ci-bot",
        "role": "developer",
        "budget_limit_usd": 12.5,
        "budget_period": "daily",
        "rate_limit_rpm": 60,
        "expires_at": "2099-01-01T00:00:00Z",
        "allowed_models": ["openai/gpt-4o-mini"]
    });
    let created = gateway.call(Method::POST, "/v1/api-keys", Some(&admin_key), Some(body)).await?;
    assert_eq!(created.status, 201, "{}", created.text);
    let key = &created.body["api_key"];
    let plaintext = key["key"].as_str().unwrap_or_default().to_string();
    assert!(plaintext.starts_with("br_live_"));
    assert_eq!(key["budget_limit_usd"], json!(12.5));
    assert_eq!(key["budget_period"], "daily");
    assert_eq!(key["rate_limit_rpm"], 60);
    assert_eq!(key["allowed_models"], json!(["openai/gpt-4o-mini"]));
    assert_eq!(key["status"], "active");

    let listed = gateway.call(Method::GET, "/v1/api-keys", Some(&admin_key), None).await?;
    assert_eq!(listed.status, 200);
    assert_eq!(listed.body["total"], 2);
    assert!(!listed.text.contains(&plaintext), "the list must never show a plaintext key");
    assert!(!listed.text.contains(&admin_key));
    assert!(
        listed.body["api_keys"]
            .as_array()
            .is_some_and(|keys| keys.iter().all(|key| key.get("key").is_none() && key["masked_key"].as_str().is_some()))
    );

    for bad in [
        json!({"role": "wizard"}),
        json!({"scopes": ["platform.admin"]}),
        json!({"budget_period": "weekly"}),
        json!({"budget_limit_usd": -1}),
        json!({"rate_limit_rpm": 0}),
        json!({"expires_at": "yesterday"}),
        json!({"expires_at": "2001-01-01T00:00:00Z"}),
        json!({"unknown_field": true}),
    ] {
        let reply = gateway.call(Method::POST, "/v1/api-keys", Some(&admin_key), Some(bad.clone())).await?;
        assert!(reply.status == 400 || reply.status == 403, "{bad}: {}", reply.text);
        assert!(reply.body["recovery"].is_object());
    }

    // The model allowlist binds the key.
    let allowed = gateway
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&plaintext),
            Some(json!({"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})),
        )
        .await?;
    assert_eq!(allowed.status, 200, "{}", allowed.text);
    let refused = gateway
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&plaintext),
            Some(json!({"model": "anthropic/claude-opus-4", "messages": [{"role": "user", "content": "hi"}]})),
        )
        .await?;
    assert_envelope(&refused, 403, "forbidden");
    Ok(())
}

async fn a_tenants_suspension_and_approval_reach_its_siem(shape: Shape) -> TestResult {
    let mut gateway = Gateway::start_with(shape, &[("BR_OBSERVABILITY_ALLOW_PRIVATE_URLS", "true")]).await?;
    gateway.host_observability_fanout().await?;
    let (tenant_key, registration) = gateway.register("Watched Co").await?;
    let tenant_id = registration["tenant"]["id"].as_str().unwrap_or_default().to_string();
    let (url, siem) = brainstorm_e2e::siem().await?;
    let destination = json!({"name": "soc", "type": "webhook", "config": {"url": url}, "event_types": ["audit"],
                             "batch": {"max_size": 10, "flush_interval_ms": 100}});
    let created = gateway.call(Method::POST, "/v1/observability/destinations", Some(&tenant_key), Some(destination)).await?;
    assert_eq!(created.status, 201, "{}", created.text);
    let admin = Some(PLATFORM_ADMIN_KEY);
    let path = |verb: &str| format!("/v1/admin/tenants/{tenant_id}/{verb}");
    // Rejected twice (the second changes nothing and says nothing), then approved.
    for verb in ["reject", "reject", "approve"] {
        let reply = gateway.call(Method::POST, &path(verb), admin, None).await?;
        assert_eq!(reply.status, 200, "{}", reply.text);
    }
    let moves = |events: Vec<Value>| -> Vec<(Value, Value, Value, Value, Value)> {
        events
            .into_iter()
            .filter(|event| event["event"] == "audit.tenant.status_changed")
            .map(|event| {
                let data = &event["data"];
                (data["from"].clone(), data["status"].clone(), event["severity"].clone(), data["actor"].clone(), data["subject"].clone())
            })
            .collect()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while moves(siem.events()).len() < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Let a wrongly announced repeat arrive before counting.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let (actor, subject) = (json!("key:platform-admin"), json!(tenant_id));
    let seen = moves(siem.events());
    // The two announcements travel separately: either order.
    assert_eq!(seen.len(), 2, "{seen:?}\n{}", gateway.logs());
    assert!(seen.contains(&(json!("active"), json!("rejected"), json!(4), actor.clone(), subject.clone())), "{seen:?}");
    assert!(seen.contains(&(json!("rejected"), json!("active"), json!(1), actor, subject)), "{seen:?}");
    Ok(())
}

async fn platform_admin_manages_tenants_and_invite_codes(shape: Shape) -> TestResult {
    let gateway = Gateway::start(shape).await?;
    let (tenant_key, registration) = gateway.register("Acme").await?;
    let tenant_id = registration["tenant"]["id"].as_str().unwrap_or_default().to_string();
    let admin = Some(PLATFORM_ADMIN_KEY);

    let tenants = gateway.call(Method::GET, "/v1/admin/tenants", admin, None).await?;
    assert_eq!(tenants.status, 200, "{}", tenants.text);
    assert!(tenants.body["tenants"].as_array().is_some_and(|tenants| tenants.iter().any(|tenant| tenant["id"] == tenant_id.as_str())));
    let one = gateway.call(Method::GET, &format!("/v1/admin/tenants/{tenant_id}"), admin, None).await?;
    assert_eq!(one.body["tenant"]["status"], "active");
    assert_envelope(&gateway.call(Method::GET, "/v1/admin/tenants/missing", admin, None).await?, 404, "not_found_error");
    assert_envelope(&gateway.call(Method::GET, "/v1/admin/tenants?status=zombie", admin, None).await?, 400, "invalid_request_error");

    let rejected = gateway.call(Method::POST, &format!("/v1/admin/tenants/{tenant_id}/reject"), admin, None).await?;
    assert_eq!(rejected.status, 200, "{}", rejected.text);
    assert_eq!(rejected.body["ok"], true);
    let blocked = gateway.call(Method::GET, "/v1/account", Some(&tenant_key), None).await?;
    assert_envelope(&blocked, 403, "forbidden");
    let only_rejected = gateway.call(Method::GET, "/v1/admin/tenants?status=rejected", admin, None).await?;
    assert_eq!(only_rejected.body["tenants"].as_array().map(Vec::len), Some(1));
    let approved = gateway.call(Method::POST, &format!("/v1/admin/tenants/{tenant_id}/approve"), admin, None).await?;
    assert_eq!(approved.body["ok"], true);
    assert_eq!(gateway.call(Method::GET, "/v1/account", Some(&tenant_key), None).await?.status, 200);

    let code = gateway
        .call(
            Method::POST,
            "/v1/admin/invite-codes",
            admin,
            Some(json!({"code": "LAUNCH-2026", "max_uses": 10, "expires_at": "2099-01-01T00:00:00Z"})),
        )
        .await?;
    assert_eq!(code.status, 201, "{}", code.text);
    let code_id = code.body["invite_code"]["id"].as_str().unwrap_or_default().to_string();
    for bad in [json!({"code": ""}), json!({"code": "X", "max_uses": 0}), json!({"code": "Y", "expires_at": "2099-01-01T00:00:00+01:00"})] {
        assert_envelope(&gateway.call(Method::POST, "/v1/admin/invite-codes", admin, Some(bad)).await?, 400, "invalid_request_error");
    }
    let registered_with_code = gateway
        .call(Method::POST, "/v1/register", None, Some(json!({"tenant_name": "Invited", "accept_tos": true, "invite_code": "LAUNCH-2026"})))
        .await?;
    assert_eq!(registered_with_code.status, 201);
    let codes = gateway.call(Method::GET, "/v1/admin/invite-codes", admin, None).await?;
    assert_eq!(codes.body["invite_codes"][0]["uses"], 1);
    assert_eq!(codes.body["invite_codes"][0]["max_uses"], 10);
    let digest = gateway.call(Method::GET, "/v1/admin/digest", admin, None).await?;
    assert_eq!(digest.status, 200);
    assert_eq!(digest.body["digest"]["tenants_total"], 2);
    let deleted = gateway.call(Method::DELETE, &format!("/v1/admin/invite-codes/{code_id}"), admin, None).await?;
    assert_eq!(deleted.body, json!({"deleted": true}));
    assert_envelope(
        &gateway.call(Method::DELETE, &format!("/v1/admin/invite-codes/{code_id}"), admin, None).await?,
        404,
        "not_found_error",
    );
    Ok(())
}

fn sse_data(text: &str) -> Vec<String> {
    text.lines().filter_map(|line| line.strip_prefix("data: ")).map(str::to_string).collect()
}

async fn sandbox_completions_in_the_openai_format(shape: Shape) -> TestResult {
    let gateway = Gateway::start(shape).await?;
    let (key, _) = gateway.register("Acme").await?;
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "tell me a story"}]});
    let reply = gateway.call(Method::POST, "/v1/chat/completions", Some(&key), Some(body)).await?;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.body["object"], "chat.completion");
    assert_eq!(reply.body["model"], "brainstorm/sandbox");
    assert_eq!(reply.body["choices"][0]["message"]["role"], "assistant");
    assert!(reply.body["choices"][0]["message"]["content"].as_str().is_some_and(|content| content.contains("tell me a story")));
    assert_eq!(reply.body["choices"][0]["finish_reason"], "stop");
    let usage = &reply.body["usage"];
    let (prompt, completion, total) =
        (usage["prompt_tokens"].as_u64(), usage["completion_tokens"].as_u64(), usage["total_tokens"].as_u64());
    assert_eq!(prompt.zip(completion).map(|(prompt, completion)| prompt + completion), total);
    assert_eq!(usage["cost_usd"].as_f64(), Some(0.0));
    assert!(usage["routing_strategy"].is_string());
    assert_eq!(reply.header("x-br-routed-model"), Some("brainstorm/sandbox"));
    assert_eq!(reply.header("x-br-actual-cost"), Some("0.000000"));
    assert!(reply.header("x-br-request-id").is_some());

    let stream = json!({"model": "gpt-4o-mini", "stream": true, "messages": [{"role": "user", "content": "stream please"}]});
    let streamed = gateway.call(Method::POST, "/v1/chat/completions", Some(&key), Some(stream)).await?;
    assert_eq!(streamed.status, 200);
    assert!(streamed.header("content-type").is_some_and(|content_type| content_type.starts_with("text/event-stream")));
    let frames = sse_data(&streamed.text);
    assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
    let mut text = String::new();
    let mut finish = Value::Null;
    for frame in &frames[..frames.len() - 1] {
        let chunk: Value = serde_json::from_str(frame)?;
        assert_eq!(chunk["object"], "chat.completion.chunk");
        text.push_str(chunk["choices"][0]["delta"]["content"].as_str().unwrap_or_default());
        if !chunk["choices"][0]["finish_reason"].is_null() {
            finish = chunk["choices"][0]["finish_reason"].clone();
        }
    }
    assert!(text.contains("stream please"));
    assert_eq!(finish, "stop");

    let limited = gateway
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&key),
            Some(json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})),
        )
        .await?;
    assert_eq!(limited.body["choices"][0]["finish_reason"], "length");
    assert_eq!(limited.body["usage"]["completion_tokens"], 4);

    for bad in [
        json!({"messages": [{"role": "user", "content": "hi"}]}),
        json!({"model": "gpt-4o-mini"}),
        json!({"model": "gpt-4o-mini", "messages": "hi"}),
        json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "route": {"strategy": "cheapest"}}),
        json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "temperature": 9}),
    ] {
        let reply = gateway.call(Method::POST, "/v1/chat/completions", Some(&key), Some(bad.clone())).await?;
        assert_envelope(&reply, 400, "invalid_request_error");
    }
    Ok(())
}

async fn sandbox_messages_in_the_anthropic_format(shape: Shape) -> TestResult {
    let gateway = Gateway::start(shape).await?;
    let (key, _) = gateway.register("Acme").await?;
    let body = json!({"model": "claude-sonnet-4", "max_tokens": 256, "system": "be brief", "messages": [{"role": "user", "content": "hello claude"}]});
    let reply = gateway
        .request(Method::POST, "/v1/messages", None)
        .header("x-api-key", &key)
        .header("anthropic-version", "2023-06-01")
        .json(&body)
        .send()
        .await?;
    let reply_status = reply.status().as_u16();
    let message: Value = reply.json().await?;
    assert_eq!(reply_status, 200, "{message}");
    assert_eq!(message["type"], "message");
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["content"][0]["type"], "text");
    assert!(message["content"][0]["text"].as_str().is_some_and(|text| text.contains("hello claude")));
    assert_eq!(message["stop_reason"], "end_turn");
    assert!(message["usage"]["input_tokens"].as_u64().is_some_and(|tokens| tokens > 0));

    let stream =
        json!({"model": "claude-sonnet-4", "max_tokens": 256, "stream": true, "messages": [{"role": "user", "content": "stream it"}]});
    let streamed = gateway.call(Method::POST, "/v1/messages", Some(&key), Some(stream)).await?;
    let events: Vec<&str> = streamed.text.lines().filter_map(|line| line.strip_prefix("event: ")).collect();
    assert_eq!(events.first(), Some(&"message_start"));
    assert_eq!(events.last(), Some(&"message_stop"));
    for name in ["content_block_start", "content_block_delta", "content_block_stop", "message_delta"] {
        assert!(events.contains(&name), "{name} missing from {events:?}");
    }
    let missing_max_tokens = gateway
        .call(Method::POST, "/v1/messages", Some(&key), Some(json!({"model": "claude", "messages": [{"role": "user", "content": "hi"}]})))
        .await?;
    assert_envelope(&missing_max_tokens, 400, "invalid_request_error");
    Ok(())
}

/// A tenant cannot point the fan-out at the gateway's own network (no `BR_OBSERVABILITY_ALLOW_PRIVATE_URLS`).
/// Embedded: this harness's distributed shape runs no fan-out (the service's own suite covers it on
/// both engines, and the SDK suite's distributed shape hosts it).
#[tokio::test]
async fn observability_destinations_inside_the_network_are_refused() -> TestResult {
    let gateway = Gateway::start(Shape::Embedded).await?;
    let (admin, _) = gateway.register("Outward Only").await?;
    for (path, body) in [
        ("/v1/observability/destinations", json!({"name": "meta", "type": "webhook", "config": {"url": "http://169.254.169.254/latest"}})),
        ("/v1/observability/destinations", json!({"name": "local", "type": "otlp", "config": {"endpoint": "http://127.0.0.1:4318"}})),
        (
            "/v1/observability/xdr/destinations",
            json!({"name": "soc", "type": "splunk", "config": {"hec_url": "https://10.0.0.8:8088", "hec_token": "t"}}),
        ),
    ] {
        let refused = gateway.call(Method::POST, path, Some(&admin), Some(body.clone())).await?;
        assert_envelope(&refused, 400, "invalid_request_error");
        assert_eq!(refused.body["error"]["code"], "invalid_destination", "{}", refused.text);
        assert!(refused.text.contains("BR_OBSERVABILITY_ALLOW_PRIVATE_URLS"), "{}", refused.text);
    }
    let public = json!({"name": "hooks", "type": "webhook", "config": {"url": "https://hooks.example.com/brainstorm"}});
    let accepted = gateway.call(Method::POST, "/v1/observability/destinations", Some(&admin), Some(public)).await?;
    assert_eq!(accepted.status, 201, "{}", accepted.text);
    Ok(())
}

async fn errors_always_carry_the_envelope(shape: Shape) -> TestResult {
    let gateway = Gateway::start(shape).await?;
    let unknown_route = gateway.call(Method::GET, "/v1/does-not-exist", None, None).await?;
    assert_envelope(&unknown_route, 404, "not_found_error");
    let wrong_method = gateway.call(Method::PUT, "/v1/register", None, None).await?;
    assert_eq!(wrong_method.status, 405);
    assert!(wrong_method.body["recovery"].is_object());
    let health = gateway.call(Method::GET, "/health", None, None).await?;
    assert_eq!(health.status, 200);
    Ok(())
}

/// RFC 7636's example verifier and its S256 challenge.
const PKCE_VERIFIER: &str = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
const PKCE_CHALLENGE: &str = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM";
const CALLBACK: &str = "http://127.0.0.1:8976/callback";

/// Approves `client_id` with `key` and returns the code from the redirect (the client does not follow it).
async fn approve(gateway: &Gateway, key: &str, client_id: &str) -> anyhow::Result<String> {
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?;
    let url = format!(
        "{}/auth/oauth/authorize?client_id={client_id}&redirect_uri={CALLBACK}&code_challenge={PKCE_CHALLENGE}&code_challenge_method=S256&scope=completions+models&state=x%20y",
        gateway.base_url
    );
    let response = client.post(url).bearer_auth(key).send().await?;
    anyhow::ensure!(response.status().as_u16() == 302, "approval answered {}", response.status());
    let location = response.headers().get("location").and_then(|value| value.to_str().ok()).unwrap_or_default().to_string();
    anyhow::ensure!(location.starts_with(&format!("{CALLBACK}?code=brac_")) && location.ends_with("&state=x%20y"), "{location}");
    Ok(location.split("code=").nth(1).and_then(|rest| rest.split('&').next()).unwrap_or_default().to_string())
}

async fn oauth_apps_trade_a_pkce_code_for_a_scoped_key(shape: Shape) -> TestResult {
    let gateway = Gateway::start(shape).await?;
    let (admin, _) = gateway.register("OAuth Works").await?;
    for bad in [
        json!({"name": "x", "callback_urls": ["http://evil.example/cb"]}),
        json!({"name": "x", "callback_urls": [CALLBACK], "scopes": ["admin"]}),
        json!({"name": "x", "callback_urls": []}),
    ] {
        let refused = gateway.call(Method::POST, "/v1/oauth/apps", Some(&admin), Some(bad.clone())).await?;
        assert_eq!(refused.status, 400, "{bad}: {}", refused.text);
    }
    let app = gateway
        .call(
            Method::POST,
            "/v1/oauth/apps",
            Some(&admin),
            Some(json!({"name": "Notebook", "callback_urls": [CALLBACK], "scopes": ["completions", "models", "usage"]})),
        )
        .await?;
    assert_eq!(app.status, 201, "{}", app.text);
    let client_id = app.body["client_id"].as_str().unwrap_or_default().to_string();
    assert!(client_id.starts_with("br_app_") && app.body.get("client_secret").is_none(), "{}", app.text);
    let listed = gateway.call(Method::GET, "/v1/oauth/apps", Some(&admin), None).await?;
    assert_eq!(listed.body["total"], 1, "{}", listed.text);

    // The consent view; S256 only; a key is needed.
    let query = format!(
        "client_id={client_id}&redirect_uri={CALLBACK}&code_challenge={PKCE_CHALLENGE}&code_challenge_method=S256&scope=completions+models"
    );
    let view = gateway.call(Method::GET, &format!("/auth/oauth/authorize?{query}"), Some(&admin), None).await?;
    assert_eq!((view.status, view.body["app"]["name"].as_str()), (200, Some("Notebook")), "{}", view.text);
    assert_eq!(view.body["scopes"], json!(["completions", "models"]));
    let plain = gateway.call(Method::GET, &format!("/auth/oauth/authorize?{}", query.replace("S256", "plain")), Some(&admin), None).await?;
    assert_eq!(plain.status, 400, "{}", plain.text);
    assert_eq!(gateway.call(Method::GET, &format!("/auth/oauth/authorize?{query}"), None, None).await?.status, 401);

    // A code presented with the wrong verifier is spent.
    let token = |code: &str, verifier: &str| json!({"grant_type": "authorization_code", "code": code, "redirect_uri": CALLBACK, "code_verifier": verifier, "client_id": client_id});
    let first = approve(&gateway, &admin, &client_id).await?;
    let wrong = gateway.call(Method::POST, "/auth/oauth/token", None, Some(token(&first, &PKCE_VERIFIER.replace('d', "e")))).await?;
    assert_eq!((wrong.status, wrong.body["error"]["code"].as_str()), (400, Some("invalid_grant")), "{}", wrong.text);
    let spent = gateway.call(Method::POST, "/auth/oauth/token", None, Some(token(&first, PKCE_VERIFIER))).await?;
    assert_eq!(spent.status, 400, "{}", spent.text);

    // The right verifier buys a 90-day key with the granted scopes, once.
    let code = approve(&gateway, &admin, &client_id).await?;
    let issued = gateway.call(Method::POST, "/auth/oauth/token", None, Some(token(&code, PKCE_VERIFIER))).await?;
    assert_eq!(issued.status, 200, "{}", issued.text);
    assert_eq!(issued.body["scopes"], json!(["completions", "models"]));
    let key = issued.body["key"].as_str().unwrap_or_default().to_string();
    assert!(key.starts_with("br_live_"), "{}", issued.text);
    let expires_at = chrono::DateTime::parse_from_rfc3339(issued.body["expires_at"].as_str().unwrap_or_default())?;
    assert_eq!(expires_at.signed_duration_since(chrono::Utc::now()).num_days(), 89, "90 days less the seconds gone");
    let again = gateway.call(Method::POST, "/auth/oauth/token", None, Some(token(&code, PKCE_VERIFIER))).await?;
    assert_eq!(again.status, 400, "a code is used once: {}", again.text);
    // The key holds what the scopes grant and nothing more.
    assert_eq!(gateway.call(Method::GET, "/v1/models", Some(&key), None).await?.status, 200);
    let completion = json!({"model": "brainstorm/sandbox", "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(gateway.call(Method::POST, "/v1/chat/completions", Some(&key), Some(completion)).await?.status, 200);
    assert_eq!(gateway.call(Method::GET, "/v1/budget/status", Some(&key), None).await?.status, 403);
    assert_eq!(gateway.call(Method::POST, "/v1/api-keys", Some(&key), Some(json!({"name": "more"}))).await?.status, 403);
    let bad_grant = gateway.call(Method::POST, "/auth/oauth/token", None, Some(json!({"grant_type": "password"}))).await?;
    assert_eq!(bad_grant.status, 400, "{}", bad_grant.text);

    let deleted = gateway.call(Method::DELETE, &format!("/v1/oauth/apps/{client_id}"), Some(&admin), None).await?;
    assert_eq!((deleted.status, deleted.body["deleted"].as_bool()), (200, Some(true)), "{}", deleted.text);
    assert_eq!(gateway.call(Method::GET, "/v1/oauth/apps", Some(&admin), None).await?.body["total"], 0);
    Ok(())
}

async fn capabilities_are_listed_and_described_with_what_the_key_may_call(shape: Shape) -> TestResult {
    let gateway = Gateway::start(shape).await?;
    let (admin, _) = gateway.register("Capable").await?;
    let developer = gateway.key_with_role(&admin, "developer").await?;
    let listed = gateway.call(Method::GET, "/v1/capabilities", Some(&developer), None).await?;
    assert_eq!(listed.status, 200, "{}", listed.text);
    let data = listed.body["data"].as_array().cloned().unwrap_or_default();
    assert_eq!(listed.body["total"].as_u64(), Some(data.len() as u64));
    let find = |method: &str, path: &str| {
        data.iter().find(|entry| entry["method"] == method && entry["path"] == path).cloned().unwrap_or_default()
    };
    // Every route the edge serves is a capability, with whether this key may call it.
    let completions = find("POST", "/v1/chat/completions");
    assert_eq!((completions["permission"].as_str(), completions["granted"].as_bool()), (Some("router.write"), Some(true)), "{completions}");
    let approve = find("POST", "/v1/admin/tenants/{id}/approve");
    assert_eq!((approve["permission"].as_str(), approve["granted"].as_bool()), (Some("admin.write"), Some(false)), "{approve}");
    assert!(data.iter().any(|entry| entry["path"] == "/v1/capabilities/{id}/describe"));

    let id = completions["id"].as_str().unwrap_or_default().to_string();
    let describe = completions["describe"].as_str().unwrap_or_default().to_string();
    assert_eq!(describe, format!("/v1/capabilities/{id}/describe"));
    let described = gateway.call(Method::GET, &describe, Some(&developer), None).await?;
    assert_eq!(described.status, 200, "{}", described.text);
    assert_eq!((described.body["id"].as_str(), described.body["method"].as_str()), (Some(id.as_str()), Some("POST")));
    assert!(described.body["description"].as_str().is_some_and(|text| text.contains("/v1/chat/completions")), "{}", described.text);
    assert!(described.body["responses"].is_object(), "{}", described.text);

    let unknown = gateway.call(Method::GET, "/v1/capabilities/no_such_capability/describe", Some(&developer), None).await?;
    assert_eq!((unknown.status, unknown.body["error"]["code"].as_str()), (404, Some("capability_not_found")), "{}", unknown.text);
    assert_eq!(unknown.body["recovery"]["endpoint"], "/v1/capabilities");
    assert_eq!(gateway.call(Method::GET, "/v1/capabilities", None, None).await?.status, 401);
    Ok(())
}
