//! The identity bridge end to end in both shapes, with an identity provider of the test's own (an
//! Ed25519 key published as a JWKS file): claim tokens redeemed by the provider's users under the
//! spec's role mapping and collision rules, `/auth/me` with `X-BR-Tenant-Id`, the dashboard's budget
//! mirror and OAuth consent with the member's JWT, a device linked by the device authorization grant
//! and answering with the key it was given, a user's own tenant provisioned once, and refused tokens.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use brainstorm_e2e::{Gateway, Reply, Shape};
use reqwest::Method;
use ring::rand::SystemRandom;
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::{Value, json};

type TestResult = anyhow::Result<()>;

brainstorm_e2e::in_both_shapes!(identity_provider_users_claim_tenants_and_link_devices);

const ISSUER: &str = "https://idp.test.example";
const AUDIENCE: &str = "brainstorm-dashboard";

/// The test's identity provider: a signing key and its JWKS file.
struct Provider {
    key: Ed25519KeyPair,
}

impl Provider {
    fn new(jwks_path: &std::path::Path) -> anyhow::Result<Self> {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).map_err(|_| anyhow::anyhow!("keygen"))?;
        let key = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).map_err(|_| anyhow::anyhow!("key"))?;
        let jwks = json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "test-1", "use": "sig", "x": URL_SAFE_NO_PAD.encode(key.public_key().as_ref())}]});
        std::fs::write(jwks_path, serde_json::to_vec(&jwks)?)?;
        Ok(Provider { key })
    }

    fn token_with(&self, claims: &Value) -> String {
        let encode = |value: &Value| URL_SAFE_NO_PAD.encode(serde_json::to_vec(value).unwrap_or_default());
        let input = format!("{}.{}", encode(&json!({"alg": "EdDSA", "kid": "test-1", "typ": "JWT"})), encode(claims));
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(self.key.sign(input.as_bytes()).as_ref()))
    }

    /// A token for `subject` with `email`, valid for five minutes.
    fn token(&self, subject: &str, email: &str) -> String {
        let now = chrono::Utc::now().timestamp();
        self.token_with(&json!({"iss": ISSUER, "aud": AUDIENCE, "sub": subject, "email": email, "iat": now, "exp": now + 300}))
    }
}

fn code(reply: &Reply) -> &str {
    reply.body["error"]["code"].as_str().unwrap_or_default()
}

/// A call with an identity provider token, and `X-BR-Tenant-Id` when given.
async fn as_user(
    gateway: &Gateway,
    method: Method,
    path: &str,
    jwt: &str,
    tenant: Option<&str>,
    body: Option<Value>,
) -> anyhow::Result<Reply> {
    let mut request = gateway.request(method, path, Some(jwt));
    if let Some(tenant) = tenant {
        request = request.header("x-br-tenant-id", tenant);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await?;
    Ok(Reply { status, body: serde_json::from_str(&text).unwrap_or(Value::Null), text, headers })
}

async fn identity_provider_users_claim_tenants_and_link_devices(shape: Shape) -> TestResult {
    // Without a provider configured the bridge's JWT routes say so.
    let plain = Gateway::start(shape).await?;
    let unconfigured = plain.call(Method::GET, "/auth/me", Some("eyJ.x.y"), None).await?;
    assert_eq!((unconfigured.status, code(&unconfigured)), (503, "identity_provider_unconfigured"), "{}", unconfigured.text);
    let no_device = plain.call(Method::POST, "/v1/auth/device/authorize", None, None).await?;
    assert_eq!((no_device.status, code(&no_device)), (503, "identity_provider_unconfigured"), "{}", no_device.text);
    drop(plain);

    let jwks = brainstorm_e2e::temp_dir("jwks")?.join("jwks.json");
    let provider = Provider::new(&jwks)?;
    let jwks_text = jwks.display().to_string();
    let gateway = Gateway::start_with(
        shape,
        &[
            ("BR_IDP_ISSUER", ISSUER),
            ("BR_IDP_AUDIENCE", AUDIENCE),
            ("BR_IDP_JWKS_FILE", &jwks_text),
            ("BR_DASHBOARD_URL", "https://dash.example"),
        ],
    )
    .await?;
    let (admin_a, registered_a) = gateway.register("Bridge A").await?;
    let tenant_a = registered_a["tenant"]["id"].as_str().unwrap_or_default().to_string();
    let (admin_b, registered_b) = gateway.register("Bridge B").await?;
    let tenant_b = registered_b["tenant"]["id"].as_str().unwrap_or_default().to_string();
    let ada = provider.token("user-ada", "ada@example.com");
    let bob = provider.token("user-bob", "bob@example.com");

    // Tokens the bridge refuses.
    let now = chrono::Utc::now().timestamp();
    let refused = [
        provider.token_with(&json!({"iss": "https://evil.example", "aud": AUDIENCE, "sub": "x", "exp": now + 300})),
        provider.token_with(&json!({"iss": ISSUER, "aud": "someone-else", "sub": "x", "exp": now + 300})),
        provider.token_with(&json!({"iss": ISSUER, "aud": AUDIENCE, "sub": "x", "exp": now - 3600})),
        format!("{}x", &ada[..ada.len() - 1]),
        admin_a.clone(),
    ];
    for token in refused {
        let reply = as_user(&gateway, Method::GET, "/auth/me", &token, None, None).await?;
        assert_eq!((reply.status, code(&reply)), (401, "invalid_idp_token"), "{}", reply.text);
    }

    // A single-use browser link claims tenant A once; the role maps owner/admin -> admin.
    let link = gateway.call(Method::POST, "/v1/auth/link", Some(&admin_a), None).await?;
    assert_eq!(link.status, 201, "{}", link.text);
    assert_eq!((link.body["max_uses"].as_u64(), link.body["role"].as_str()), (Some(1), Some("admin")));
    let token = link.body["token"].as_str().unwrap_or_default().to_string();
    assert!(token.starts_with("brct_") && link.body["url"].as_str().is_some_and(|url| url.contains(&token)), "{}", link.text);
    let claimed = as_user(&gateway, Method::POST, "/auth/claim", &ada, None, Some(json!({"token": token}))).await?;
    assert_eq!(claimed.status, 201, "{}", claimed.text);
    assert_eq!((claimed.body["tenant"]["id"].as_str(), claimed.body["role"].as_str()), (Some(tenant_a.as_str()), Some("admin")));
    let used_up = as_user(&gateway, Method::POST, "/auth/claim", &bob, None, Some(json!({"token": token}))).await?;
    assert_eq!((used_up.status, code(&used_up)), (400, "fully_redeemed"), "{}", used_up.text);
    let unknown = as_user(&gateway, Method::POST, "/auth/claim", &bob, None, Some(json!({"token": "brct_nope"}))).await?;
    assert_eq!(unknown.status, 404, "{}", unknown.text);

    // A member link: another email works, `member` maps to developer; the same identity twice is 409.
    let members =
        gateway.call(Method::POST, "/v1/tenant/claim-link", Some(&admin_a), Some(json!({"role": "member", "max_uses": 5}))).await?;
    let member_token = members.body["token"].as_str().unwrap_or_default().to_string();
    let bob_claim = as_user(&gateway, Method::POST, "/auth/claim", &bob, None, Some(json!({"token": member_token}))).await?;
    assert_eq!((bob_claim.status, bob_claim.body["role"].as_str()), (201, Some("developer")), "{}", bob_claim.text);
    let twice = as_user(&gateway, Method::POST, "/auth/claim", &ada, None, Some(json!({"token": member_token}))).await?;
    assert_eq!((twice.status, code(&twice)), (409, "already_claimed"), "{}", twice.text);
    let users = gateway.call(Method::GET, "/v1/account/users", Some(&admin_a), None).await?;
    assert!(users.text.contains("bob@example.com") && users.text.contains("ada@example.com"), "{}", users.text);
    // An invitation is claimed by the invited person's identity: the invited user becomes active.
    let invited = gateway
        .call(Method::POST, "/v1/account/users/invite", Some(&admin_a), Some(json!({"email": "carol@example.com", "role": "member"})))
        .await?;
    let invitation_url = invited.body["invitation"]["claim_url"].as_str().unwrap_or_default().to_string();
    let invitation_token = invitation_url.split("token=").nth(1).unwrap_or_default().to_string();
    let carol = provider.token("user-carol", "carol@example.com");
    let carol_claim = as_user(&gateway, Method::POST, "/auth/claim", &carol, None, Some(json!({"token": invitation_token}))).await?;
    assert_eq!((carol_claim.status, carol_claim.body["role"].as_str()), (201, Some("developer")), "{}", carol_claim.text);
    let carol_id = invited.body["invitation"]["user_id"].as_str().unwrap_or_default();
    assert_eq!(carol_claim.body["user_id"].as_str(), Some(carol_id), "the invited user is the claimant");
    let users = gateway.call(Method::GET, "/v1/account/users", Some(&admin_a), None).await?;
    let carol_row = users.body["users"].as_array().into_iter().flatten().find(|user| user["email"] == "carol@example.com").cloned();
    assert_eq!(carol_row.map(|user| user["status"].clone()), Some(json!("active")), "{}", users.text);

    // An identity owning another tenant keeps both; /auth/me selects with X-BR-Tenant-Id.
    let b_link = gateway.call(Method::POST, "/v1/auth/link", Some(&admin_b), Some(json!({"role": "owner"}))).await?;
    let b_claim = as_user(&gateway, Method::POST, "/auth/claim", &ada, None, Some(json!({"token": b_link.body["token"]}))).await?;
    assert_eq!((b_claim.status, b_claim.body["claim_role"].as_str()), (201, Some("owner")), "{}", b_claim.text);
    let me = as_user(&gateway, Method::GET, "/auth/me", &ada, None, None).await?;
    assert_eq!(me.status, 200, "{}", me.text);
    assert_eq!((me.body["identity"]["subject"].as_str(), me.body["tenants"].as_array().map(Vec::len)), (Some("user-ada"), Some(2)));
    assert_eq!(me.body["tenant"], Value::Null, "two tenants and none selected");
    let selected = as_user(&gateway, Method::GET, "/auth/me", &ada, Some(&tenant_b), None).await?;
    assert_eq!(selected.body["tenant"]["tenant"]["id"].as_str(), Some(tenant_b.as_str()), "{}", selected.text);
    let stranger = as_user(&gateway, Method::GET, "/auth/me", &bob, Some(&tenant_b), None).await?;
    assert_eq!((stranger.status, code(&stranger)), (403, "not_a_member"), "{}", stranger.text);
    let only = as_user(&gateway, Method::GET, "/auth/me", &bob, None, None).await?;
    assert_eq!(only.body["tenant"]["tenant"]["id"].as_str(), Some(tenant_a.as_str()), "the only tenant is selected: {}", only.text);

    // The dashboard's budget mirror: tenant-level data only, in the tenant the member names.
    let ambiguous_budget = as_user(&gateway, Method::GET, "/auth/budget/status", &ada, None, None).await?;
    assert_eq!((ambiguous_budget.status, code(&ambiguous_budget)), (400, "tenant_selection_required"), "{}", ambiguous_budget.text);
    let budget = as_user(&gateway, Method::GET, "/auth/budget/status", &ada, Some(&tenant_a), None).await?;
    assert_eq!(budget.status, 200, "{}", budget.text);
    assert_eq!(
        (budget.body["tenant_id"].as_str(), &budget.body["key_id"], &budget.body["key_budget"]),
        (Some(tenant_a.as_str()), &Value::Null, &Value::Null)
    );
    let put =
        as_user(&gateway, Method::PUT, "/auth/budget/agents/researcher", &ada, Some(&tenant_a), Some(json!({"perDayUsd": 2.5}))).await?;
    assert_eq!(put.status, 200, "{}", put.text);
    let agents = gateway.call(Method::GET, "/v1/budget/agents", Some(&admin_a), None).await?;
    assert!(agents.text.contains("researcher"), "the mirror wrote tenant A's budget: {}", agents.text);
    for path in ["/auth/budget/forecast", "/auth/budget/agents", "/auth/budget/alerts/config", "/auth/budget/alerts/history"] {
        let reply = as_user(&gateway, Method::GET, path, &bob, None, None).await?;
        assert_eq!(reply.status, 200, "{path}: {}", reply.text);
    }
    let developer_write = as_user(&gateway, Method::PUT, "/auth/budget/alerts/config", &bob, None, Some(json!({"enabled": true}))).await?;
    assert_eq!(developer_write.status, 403, "a developer's role does not write budgets: {}", developer_write.text);

    // The kill switch's status and the firewall's interceptions, mirrored for the dashboard alike.
    for path in ["/auth/killswitch/status", "/auth/firewall/interceptions?limit=5"] {
        let mirrored = as_user(&gateway, Method::GET, path, &ada, Some(&tenant_a), None).await?;
        let direct = gateway.call(Method::GET, &path.replace("/auth/", "/v1/"), Some(&admin_a), None).await?;
        assert_eq!((mirrored.status, direct.status), (200, 200), "{path}: {} / {}", mirrored.text, direct.text);
        assert_eq!(mirrored.body, direct.body, "{path}: the mirror answers as the key does");
        let unselected = as_user(&gateway, Method::GET, path, &ada, None, None).await?;
        assert_eq!((unselected.status, code(&unselected)), (400, "tenant_selection_required"), "{path}: {}", unselected.text);
    }
    let unauthenticated = gateway.call(Method::GET, "/auth/killswitch/status", None, None).await?;
    assert_eq!(unauthenticated.status, 401, "{}", unauthenticated.text);

    // The OAuth consent with the member's JWT (an admin of tenant A).
    let app = gateway
        .call(
            Method::POST,
            "/v1/oauth/apps",
            Some(&admin_a),
            Some(json!({"name": "Dash app", "callback_urls": ["http://127.0.0.1:8976/callback"]})),
        )
        .await?;
    let client_id = app.body["client_id"].as_str().unwrap_or_default().to_string();
    let no_redirects = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?;
    let consent = format!(
        "{}/auth/oauth/authorize?client_id={client_id}&redirect_uri=http://127.0.0.1:8976/callback&code_challenge=E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM&code_challenge_method=S256&scope=completions",
        gateway.base_url
    );
    let approved = no_redirects.post(&consent).bearer_auth(&ada).header("x-br-tenant-id", &tenant_a).send().await?;
    assert_eq!(approved.status().as_u16(), 302, "{}", approved.text().await?);
    let by_developer = no_redirects.post(&consent).bearer_auth(&bob).send().await?;
    assert_eq!(by_developer.status().as_u16(), 403, "a developer may not consent for the tenant");

    // The device authorization grant: the device starts and polls, a member confirms in the browser.
    let started = gateway.call(Method::POST, "/v1/auth/device/authorize", None, Some(json!({"client_name": "brainstorm-cli"}))).await?;
    assert_eq!(started.status, 200, "{}", started.text);
    let device_code = started.body["device_code"].as_str().unwrap_or_default().to_string();
    let user_code = started.body["user_code"].as_str().unwrap_or_default().to_string();
    assert_eq!(
        (started.body["verification_uri"].as_str(), started.body["interval"].as_u64()),
        (Some("https://dash.example/device"), Some(5))
    );
    let poll = |device_code: String| {
        let gateway = &gateway;
        async move { gateway.call(Method::POST, "/v1/auth/device/token", None, Some(json!({"device_code": device_code}))).await }
    };
    let pending = poll(device_code.clone()).await?;
    assert_eq!((pending.status, pending.body["status"].as_str()), (200, Some("authorization_pending")), "{}", pending.text);
    let hasty = poll(device_code.clone()).await?;
    assert_eq!(hasty.body["status"].as_str(), Some("slow_down"), "{}", hasty.text);
    let confirm = json!({"user_code": user_code.to_lowercase()});
    let ambiguous = as_user(&gateway, Method::POST, "/auth/device/confirm", &ada, None, Some(confirm.clone())).await?;
    assert_eq!((ambiguous.status, code(&ambiguous)), (400, "tenant_selection_required"), "{}", ambiguous.text);
    let outsider = as_user(&gateway, Method::POST, "/auth/device/confirm", &bob, Some(&tenant_b), Some(confirm.clone())).await?;
    assert_eq!((outsider.status, code(&outsider)), (403, "not_a_member"), "{}", outsider.text);
    let confirmed = as_user(&gateway, Method::POST, "/auth/device/confirm", &ada, Some(&tenant_a), Some(confirm.clone())).await?;
    assert_eq!((confirmed.status, confirmed.body["role"].as_str()), (200, Some("admin")), "{}", confirmed.text);
    let again = as_user(&gateway, Method::POST, "/auth/device/confirm", &ada, Some(&tenant_a), Some(confirm)).await?;
    assert_eq!((again.status, code(&again)), (409, "already_confirmed"), "{}", again.text);
    let no_such =
        as_user(&gateway, Method::POST, "/auth/device/confirm", &ada, Some(&tenant_a), Some(json!({"user_code": "BCDF-GHJK"}))).await?;
    assert_eq!((no_such.status, code(&no_such)), (404, "invalid_user_code"), "{}", no_such.text);
    let linked = poll(device_code.clone()).await?;
    assert_eq!((linked.status, linked.body["status"].as_str()), (200, Some("linked")), "{}", linked.text);
    assert_eq!(linked.body["tenant"]["id"].as_str(), Some(tenant_a.as_str()));
    let device_key = linked.body["api_key"]["key"].as_str().unwrap_or_default().to_string();
    let keys = gateway.call(Method::GET, "/v1/api-keys", Some(&device_key), None).await?;
    assert_eq!(keys.status, 200, "the device's key works: {}", keys.text);
    assert!(keys.text.contains("device: brainstorm-cli"), "{}", keys.text);
    let delivered = poll(device_code).await?;
    assert_eq!((delivered.status, code(&delivered)), (400, "invalid_device_code"), "the key is delivered once: {}", delivered.text);
    let bogus = poll("brdc_unknown".to_string()).await?;
    assert_eq!((bogus.status, code(&bogus)), (400, "invalid_device_code"), "{}", bogus.text);

    // Provisioning: a user's first sign-in makes its own tenant (it as admin, a key shown once);
    // later calls, concurrent ones included, find that tenant and make no other.
    let dora = provider.token("user-dora", "dora@example.com");
    let body = json!({"tenant_name": "Dora's lab"});
    let (first, second) = tokio::join!(
        as_user(&gateway, Method::POST, "/auth/provision", &dora, None, Some(body.clone())),
        as_user(&gateway, Method::POST, "/auth/provision", &dora, None, Some(body.clone())),
    );
    let (first, second) = (first?, second?);
    let mut statuses = [first.status, second.status];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 201], "{} / {}", first.text, second.text);
    let (made, found) = if first.status == 201 { (&first, &second) } else { (&second, &first) };
    let dora_tenant = made.body["membership"]["tenant"]["id"].as_str().unwrap_or_default().to_string();
    assert_eq!(found.body["membership"]["tenant"]["id"].as_str(), Some(dora_tenant.as_str()), "{}", found.text);
    assert_eq!((found.body["created"].as_bool(), found.body["api_key"].clone()), (Some(false), Value::Null), "the key is shown once");
    assert_eq!(
        (
            made.body["membership"]["role"].as_str(),
            made.body["membership"]["claim_role"].as_str(),
            made.body["membership"]["tenant"]["name"].as_str()
        ),
        (Some("admin"), Some("owner"), Some("Dora's lab")),
        "{}",
        made.text
    );
    let dora_key = made.body["api_key"]["key"].as_str().unwrap_or_default().to_string();
    let account = gateway.call(Method::GET, "/v1/account", Some(&dora_key), None).await?;
    assert_eq!((account.status, account.body["tenant"]["id"].as_str()), (200, Some(dora_tenant.as_str())), "{}", account.text);
    let dora_me = as_user(&gateway, Method::GET, "/auth/me", &dora, None, None).await?;
    assert_eq!(dora_me.body["tenant"]["tenant"]["id"].as_str(), Some(dora_tenant.as_str()), "{}", dora_me.text);
    let again = as_user(&gateway, Method::POST, "/auth/provision", &dora, None, None).await?;
    assert_eq!((again.status, again.body["membership"]["tenant"]["id"].as_str()), (200, Some(dora_tenant.as_str())), "{}", again.text);
    // Ada, a member of tenants she claimed, provisions one of her own beside them, named by her email.
    let own = as_user(&gateway, Method::POST, "/auth/provision", &ada, None, None).await?;
    assert_eq!((own.status, own.body["membership"]["tenant"]["name"].as_str()), (201, Some("ada@example.com")), "{}", own.text);
    let bad = as_user(
        &gateway,
        Method::POST,
        "/auth/provision",
        &provider.token("user-eve", "eve@example.com"),
        None,
        Some(json!({"tenant_name": 7})),
    )
    .await?;
    assert_eq!(bad.status, 400, "{}", bad.text);
    let unsigned = gateway.call(Method::POST, "/auth/provision", Some("eyJ.x.y"), None).await?;
    assert_eq!((unsigned.status, code(&unsigned)), (401, "invalid_idp_token"), "{}", unsigned.text);

    // A rejected tenant's members act in it no more than its keys do.
    let rejected =
        gateway.call(Method::POST, &format!("/v1/admin/tenants/{tenant_b}/reject"), Some(brainstorm_e2e::PLATFORM_ADMIN_KEY), None).await?;
    assert_eq!(rejected.status, 200, "{}", rejected.text);
    let refused = as_user(&gateway, Method::GET, "/auth/budget/status", &ada, Some(&tenant_b), None).await?;
    assert_eq!((refused.status, code(&refused)), (403, "tenant_rejected"), "{}", refused.text);
    let still = as_user(&gateway, Method::GET, "/auth/budget/status", &ada, Some(&tenant_a), None).await?;
    assert_eq!(still.status, 200, "their other tenant is unaffected: {}", still.text);
    Ok(())
}
