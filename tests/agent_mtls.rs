//! Agent mutual TLS end to end in both shapes: the gateway serves HTTPS (`BR_TLS_CERT_FILE`,
//! `BR_TLS_KEY_FILE`); an agent exchanges its JWT for a client certificate at
//! `POST /v1/agent/auth/cert` (its own CSR, or a key the CA makes), then reads itself with nothing
//! but that certificate in the TLS handshake, renews it, and loses it with its profile. Forged
//! certificates, API-key routes, delegation and bootstrap refuse it. Operators list and revoke
//! issued certificates one by one, and so does an agent its own. Behind an ingress that terminates
//! TLS, the certificate a trusted proxy forwards (Envoy's `x-forwarded-client-cert`) works the same
//! way, and from any other peer the header is ignored.

use std::path::Path;

use brainstorm_e2e::{Gateway, Reply, Shape};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, PKCS_ECDSA_P256_SHA256, SanType};
use reqwest::Method;
use serde_json::{Value, json};

type TestResult = anyhow::Result<()>;

brainstorm_e2e::in_both_shapes!(
    agents_authenticate_with_client_certificates_the_gateway_issued,
    one_certificate_is_revoked_while_the_agents_others_keep_working,
    certificates_forwarded_by_a_trusted_proxy_authenticate_agents
);

/// The listener is the same code in both shapes: one shape shows the rotation.
#[tokio::test]
async fn a_rotated_server_certificate_is_served_without_a_restart() -> TestResult {
    let dir = brainstorm_e2e::temp_dir("mtls-rotation")?;
    let (chain, key, old_ca) = server_tls(&dir)?;
    let gateway = Gateway::start_with(Shape::Embedded, &[("BR_TLS_CERT_FILE", &chain), ("BR_TLS_KEY_FILE", &key)]).await?;
    let health = format!("{}/health", gateway.base_url);
    // Fresh clients: pooled connections would keep the handshake they made.
    assert_eq!(client(&old_ca, None)?.get(&health).send().await?.status(), 200);
    // The Secret rotated in place: another CA's certificate and key over the same files.
    let (_, _, new_ca) = server_tls(&dir)?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Ok(response) = client(&new_ca, None)?.get(&health).send().await
            && response.status() == 200
        {
            break;
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "the rotated certificate was not served within 30 s:\n{}", gateway.logs());
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert!(client(&old_ca, None)?.get(&health).send().await.is_err(), "new handshakes must get the new certificate");
    assert!(gateway.logs().contains("new connections get the new certificate"), "{}", gateway.logs());
    Ok(())
}

fn code(reply: &Reply) -> &str {
    reply.body["error"]["code"].as_str().unwrap_or_default()
}

/// A test CA and a server certificate it signed for 127.0.0.1, written as the chain file (server,
/// then CA) and key file the gateway reads; returns the CA's PEM.
fn server_tls(dir: &Path) -> anyhow::Result<(String, String, String)> {
    let ca_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name.push(DnType::CommonName, "test server CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let server = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])?.signed_by(&server_key, &issuer)?;
    let chain = dir.join("server-chain.pem");
    let key = dir.join("server-key.pem");
    std::fs::write(&chain, format!("{}{}", server.pem(), ca.pem()))?;
    std::fs::write(&key, server_key.serialize_pem())?;
    Ok((chain.display().to_string(), key.display().to_string(), ca.pem()))
}

/// A client that trusts the server's CA and presents `certificate` with `key` (PEM) when given.
fn client(server_ca: &str, identity: Option<(&str, &str)>) -> anyhow::Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder().add_root_certificate(reqwest::Certificate::from_pem(server_ca.as_bytes())?);
    if let Some((certificate, key)) = identity {
        builder = builder.identity(reqwest::Identity::from_pem(format!("{certificate}{key}").as_bytes())?);
    }
    Ok(builder.build()?)
}

async fn send(
    client: &reqwest::Client,
    gateway: &Gateway,
    method: Method,
    path: &str,
    bearer: Option<&str>,
    body: Option<Value>,
) -> anyhow::Result<Reply> {
    let mut request = client.request(method, format!("{}{path}", gateway.base_url));
    if let Some(bearer) = bearer {
        request = request.bearer_auth(bearer);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    Reply::read(request.send().await?).await
}

async fn agents_authenticate_with_client_certificates_the_gateway_issued(shape: Shape) -> TestResult {
    let dir = brainstorm_e2e::temp_dir("mtls")?;
    let (chain, key, server_ca) = server_tls(&dir)?;
    let gateway = Gateway::start_with(shape, &[("BR_TLS_CERT_FILE", &chain), ("BR_TLS_KEY_FILE", &key)]).await?;
    assert!(gateway.base_url.starts_with("https://"));
    // API keys work over HTTPS without any client certificate.
    let (admin, _) = gateway.register("Mutual Inc").await?;
    let boot =
        gateway.call(Method::POST, "/v1/agent/bootstrap", Some(&admin), Some(json!({"agent_id": "scout", "owner_id": "u1"}))).await?;
    assert_eq!(boot.status, 201, "{}", boot.text);
    let jwt = boot.body["jwt"].as_str().unwrap_or_default().to_string();

    // The exchange takes the agent's own credential, not a tenant key or nothing.
    let anonymous = gateway.call(Method::POST, "/v1/agent/auth/cert", None, Some(json!({}))).await?;
    assert_eq!((anonymous.status, code(&anonymous)), (401, "agent_token_required"), "{}", anonymous.text);
    let with_key = gateway.call(Method::POST, "/v1/agent/auth/cert", Some(&admin), Some(json!({}))).await?;
    assert_eq!((with_key.status, code(&with_key)), (401, "agent_token_required"), "{}", with_key.text);
    // Bad requests are named.
    let bad_csr = gateway.call(Method::POST, "/v1/agent/auth/cert", Some(&jwt), Some(json!({"csr": "not a csr"}))).await?;
    assert_eq!((bad_csr.status, code(&bad_csr)), (400, "invalid_csr"), "{}", bad_csr.text);
    let short = gateway.call(Method::POST, "/v1/agent/auth/cert", Some(&jwt), Some(json!({"ttl_seconds": 10}))).await?;
    assert_eq!((short.status, code(&short)), (400, "invalid_ttl"), "{}", short.text);
    let fraction = gateway.call(Method::POST, "/v1/agent/auth/cert", Some(&jwt), Some(json!({"ttl_seconds": 3600.5}))).await?;
    assert_eq!((fraction.status, code(&fraction)), (400, "invalid_ttl"), "{}", fraction.text);
    let unknown = gateway.call(Method::POST, "/v1/agent/auth/cert", Some(&jwt), Some(json!({"common_name": "admin"}))).await?;
    assert_eq!(unknown.status, 400, "{}", unknown.text);

    // The agent's own key, by CSR: the certificate comes back without any private key.
    let agent_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let csr = CertificateParams::new(vec!["scout.example".to_string()])?.serialize_request(&agent_key)?.pem()?;
    let issued = gateway.call(Method::POST, "/v1/agent/auth/cert", Some(&jwt), Some(json!({"csr": csr, "ttl_seconds": 3600}))).await?;
    assert_eq!(issued.status, 201, "{}", issued.text);
    assert_eq!(issued.header("cache-control"), Some("no-store"));
    assert_eq!(issued.body["key_source"], "csr");
    assert_eq!(issued.body["mtls_available"], true);
    assert!(issued.body["private_key"].is_null(), "{}", issued.text);
    assert_eq!(issued.body["agent_id"], "scout");
    let spiffe_id = issued.body["spiffe_id"].as_str().unwrap_or_default();
    assert!(spiffe_id.starts_with("spiffe://brainstorm/tenant/") && spiffe_id.ends_with("/agent/scout"), "{spiffe_id}");
    let certificate = issued.body["certificate"].as_str().unwrap_or_default().to_string();
    assert!(certificate.starts_with("-----BEGIN CERTIFICATE-----"), "{certificate}");
    assert!(issued.body["ca_certificate"].as_str().unwrap_or_default().starts_with("-----BEGIN CERTIFICATE-----"));
    let der = pem_der(&certificate)?;
    assert_eq!(issued.body["fingerprint_sha256"].as_str(), Some(hex(ring::digest::digest(&ring::digest::SHA256, &der).as_ref()).as_str()));
    let not_before = chrono::DateTime::parse_from_rfc3339(issued.body["not_before"].as_str().unwrap_or_default())?;
    let not_after = chrono::DateTime::parse_from_rfc3339(issued.body["not_after"].as_str().unwrap_or_default())?;
    assert!((not_after - not_before).num_seconds() >= 3600 && (not_after - not_before).num_seconds() <= 3700);

    // With only the certificate in the handshake, the agent reads itself.
    let key_pem = agent_key.serialize_pem();
    let agent = client(&server_ca, Some((&certificate, &key_pem)))?;
    let status = send(&agent, &gateway, Method::GET, "/v1/agent/status", None, None).await?;
    assert_eq!(status.status, 200, "{}", status.text);
    assert_eq!(status.body["profile"]["agentId"], "scout");
    let me = send(&agent, &gateway, Method::GET, "/v1/agent/profiles/me", None, None).await?;
    assert_eq!((me.status, &me.body["profile"]["agentId"]), (200, &json!("scout")), "{}", me.text);
    let limits = send(&agent, &gateway, Method::GET, "/v1/agent/limits/me", None, None).await?;
    assert_eq!(limits.status, 200, "{}", limits.text);
    let whoami = send(&agent, &gateway, Method::GET, "/v1/self", None, None).await?;
    assert_eq!(whoami.status, 200, "{}", whoami.text);
    assert_eq!((&whoami.body["type"], &whoami.body["auth_method"]), (&json!("agent"), &json!("mtls")), "{}", whoami.text);
    assert_eq!(whoami.body["agent_id"], "scout");
    assert!(whoami.body["jwt_expires_at"].is_null());
    let expires = chrono::DateTime::parse_from_rfc3339(whoami.body["certificate_expires_at"].as_str().unwrap_or_default())?;
    assert_eq!(expires, not_after);
    let reachable: Vec<&str> = whoami.body["capabilities"]["granted"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    assert!(reachable.contains(&"GET /v1/agent/status") && !reachable.contains(&"POST /v1/agent/delegate"), "{reachable:?}");

    // The certificate is not a tenant key, and delegation, sub-agents and bootstrap refuse it.
    let models = send(&agent, &gateway, Method::GET, "/v1/models", None, None).await?;
    assert_eq!(models.status, 401, "{}", models.text);
    let delegate =
        send(&agent, &gateway, Method::POST, "/v1/agent/delegate", None, Some(json!({"agent_id": "kid", "budget_allocation_usd": 1})))
            .await?;
    assert_eq!((delegate.status, code(&delegate)), (403, "agent_jwt_required"), "{}", delegate.text);
    let children = send(&agent, &gateway, Method::GET, "/v1/agent/sub-agents", None, None).await?;
    assert_eq!((children.status, code(&children)), (403, "agent_jwt_required"), "{}", children.text);
    let bootstrap = send(&agent, &gateway, Method::POST, "/v1/agent/bootstrap", None, Some(json!({"agent_id": "scout"}))).await?;
    assert_eq!((bootstrap.status, code(&bootstrap)), (403, "api_key_required"), "{}", bootstrap.text);
    // A bearer credential wins over the certificate: the JWT still reaches delegation's own checks.
    let by_jwt = send(&agent, &gateway, Method::GET, "/v1/agent/sub-agents", Some(&jwt), None).await?;
    assert_eq!(by_jwt.status, 200, "{}", by_jwt.text);

    // Renewal with the certificate alone; without a CSR the CA makes the key and hands it over once.
    let renewed = send(&agent, &gateway, Method::POST, "/v1/agent/auth/cert", None, None).await?;
    assert_eq!(renewed.status, 201, "{}", renewed.text);
    assert_eq!(renewed.body["key_source"], "generated");
    let renewed_certificate = renewed.body["certificate"].as_str().unwrap_or_default().to_string();
    let renewed_key = renewed.body["private_key"].as_str().unwrap_or_default().to_string();
    assert!(renewed_key.starts_with("-----BEGIN PRIVATE KEY-----"), "{}", renewed.text);
    assert_ne!(renewed.body["serial"], issued.body["serial"]);
    let default_life = chrono::DateTime::parse_from_rfc3339(renewed.body["not_after"].as_str().unwrap_or_default())?
        - chrono::DateTime::parse_from_rfc3339(renewed.body["not_before"].as_str().unwrap_or_default())?;
    assert_eq!(default_life.num_seconds(), 24 * 3600 + 60, "a day, from a minute ago");
    let renewed_agent = client(&server_ca, Some((&renewed_certificate, &renewed_key)))?;
    let status = send(&renewed_agent, &gateway, Method::GET, "/v1/agent/status", None, None).await?;
    assert_eq!(status.status, 200, "{}", status.text);

    // A certificate the gateway did not issue, claiming the same agent, is refused; so is none.
    let forger_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut forged = CertificateParams::default();
    forged.subject_alt_names = vec![SanType::URI(spiffe_id.to_string().try_into()?)];
    forged.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let forged = forged.self_signed(&forger_key)?;
    let forger = client(&server_ca, Some((&forged.pem(), &forger_key.serialize_pem())))?;
    let refused = send(&forger, &gateway, Method::GET, "/v1/agent/status", None, None).await?;
    assert_eq!((refused.status, code(&refused)), (401, "invalid_agent_certificate"), "{}", refused.text);
    let nobody = send(&client(&server_ca, None)?, &gateway, Method::GET, "/v1/agent/status", None, None).await?;
    assert_eq!((nobody.status, code(&nobody)), (401, "agent_token_required"), "{}", nobody.text);

    // A suspended agent's certificate stops working at once; back to active, it works again.
    let suspend =
        gateway.call(Method::PATCH, "/v1/agent/profiles/lifecycle/scout", Some(&admin), Some(json!({"state": "suspended"}))).await?;
    assert_eq!(suspend.status, 200, "{}", suspend.text);
    let suspended = send(&agent, &gateway, Method::GET, "/v1/agent/status", None, None).await?;
    assert_eq!((suspended.status, code(&suspended)), (403, "agent_suspended"), "{}", suspended.text);
    let resume = gateway.call(Method::PATCH, "/v1/agent/profiles/lifecycle/scout", Some(&admin), Some(json!({"state": "active"}))).await?;
    assert_eq!(resume.status, 200, "{}", resume.text);
    assert_eq!(send(&agent, &gateway, Method::GET, "/v1/agent/status", None, None).await?.status, 200);
    // Deleted and created again under the same agent id: the old profile's certificates are dead.
    let deleted = gateway.call(Method::DELETE, "/v1/agent/profiles/scout", Some(&admin), None).await?;
    assert_eq!(deleted.status, 200, "{}", deleted.text);
    let again =
        gateway.call(Method::POST, "/v1/agent/bootstrap", Some(&admin), Some(json!({"agent_id": "scout", "owner_id": "u1"}))).await?;
    assert_eq!(again.status, 201, "{}", again.text);
    let revoked = send(&agent, &gateway, Method::GET, "/v1/agent/status", None, None).await?;
    assert_eq!((revoked.status, code(&revoked)), (401, "agent_token_revoked"), "{}", revoked.text);
    Ok(())
}

async fn one_certificate_is_revoked_while_the_agents_others_keep_working(shape: Shape) -> TestResult {
    let dir = brainstorm_e2e::temp_dir("mtls-revocation")?;
    let (chain, key, server_ca) = server_tls(&dir)?;
    let gateway = Gateway::start_with(shape, &[("BR_TLS_CERT_FILE", &chain), ("BR_TLS_KEY_FILE", &key)]).await?;
    let (admin, _) = gateway.register("Revocations Ltd").await?;
    let auditor = gateway.key_with_role(&admin, "auditor").await?;
    let mut jwts = Vec::new();
    for agent_id in ["courier", "sibling"] {
        let boot = gateway.call(Method::POST, "/v1/agent/bootstrap", Some(&admin), Some(json!({"agent_id": agent_id}))).await?;
        assert_eq!(boot.status, 201, "{}", boot.text);
        jwts.push(boot.body["jwt"].as_str().unwrap_or_default().to_string());
    }
    let exchange = |jwt: String| {
        let gateway = &gateway;
        async move {
            let issued = gateway.call(Method::POST, "/v1/agent/auth/cert", Some(&jwt), None).await?;
            anyhow::ensure!(issued.status == 201, "{}", issued.text);
            let text = |name: &str| issued.body[name].as_str().unwrap_or_default().to_string();
            Ok::<_, anyhow::Error>((text("serial"), text("certificate"), text("private_key")))
        }
    };
    let (old_serial, old_certificate, old_key) = exchange(jwts[0].clone()).await?;
    let (new_serial, new_certificate, new_key) = exchange(jwts[0].clone()).await?;
    let (sibling_serial, _, _) = exchange(jwts[1].clone()).await?;
    let old = client(&server_ca, Some((&old_certificate, &old_key)))?;
    let new = client(&server_ca, Some((&new_certificate, &new_key)))?;
    assert_eq!(send(&old, &gateway, Method::GET, "/v1/agent/status", None, None).await?.status, 200);

    // Operators (and auditors) see what was issued, newest first; agents are not operators.
    let listed = gateway.call(Method::GET, "/v1/agent/certificates?agent_id=courier", Some(&auditor), None).await?;
    assert_eq!(listed.status, 200, "{}", listed.text);
    let serials = |reply: &Reply| -> Vec<(String, String)> {
        reply.body["certificates"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| (c["serial"].as_str().unwrap_or_default().to_string(), c["status"].as_str().unwrap_or_default().to_string()))
            .collect()
    };
    let active = |serial: &str| (serial.to_string(), "active".to_string());
    assert_eq!(serials(&listed), vec![active(&new_serial), active(&old_serial)], "{}", listed.text);
    assert_eq!(listed.body["total"], 2);
    let first = &listed.body["certificates"][0];
    assert_eq!((&first["key_source"], &first["agent_id"], &first["revoked_at"]), (&json!("generated"), &json!("courier"), &Value::Null));
    assert!(first.get("certificate").is_none() && first.get("private_key").is_none(), "{first}");
    let everyone = gateway.call(Method::GET, "/v1/agent/certificates", Some(&admin), None).await?;
    assert_eq!(everyone.body["total"], 3, "{}", everyone.text);
    let bad_status = gateway.call(Method::GET, "/v1/agent/certificates?status=valid", Some(&admin), None).await?;
    assert_eq!((bad_status.status, code(&bad_status)), (400, "invalid_status"), "{}", bad_status.text);
    let bad_limit = gateway.call(Method::GET, "/v1/agent/certificates?limit=many", Some(&admin), None).await?;
    assert_eq!(bad_limit.status, 400, "{}", bad_limit.text);
    let by_agent = send(&old, &gateway, Method::GET, "/v1/agent/certificates", None, None).await?;
    assert_eq!(by_agent.status, 401, "{}", by_agent.text);
    let forbidden = gateway.call(Method::POST, &format!("/v1/agent/certificates/{old_serial}/revoke"), Some(&auditor), None).await?;
    assert_eq!(forbidden.status, 403, "{}", forbidden.text);

    // The operator revokes the old certificate: refused at its next request, the new one and the
    // JWT still work.
    let path = format!("/v1/agent/certificates/{old_serial}/revoke");
    let revoked = gateway.call(Method::POST, &path, Some(&admin), Some(json!({"reason": "laptop lost"}))).await?;
    assert_eq!(revoked.status, 200, "{}", revoked.text);
    let certificate = &revoked.body["certificate"];
    assert_eq!((&certificate["status"], &certificate["revoked_reason"]), (&json!("revoked"), &json!("laptop lost")), "{}", revoked.text);
    assert!(certificate["revoked_by"].as_str().unwrap_or_default().starts_with("key:"), "{}", revoked.text);
    let refused = send(&old, &gateway, Method::GET, "/v1/agent/status", None, None).await?;
    assert_eq!((refused.status, code(&refused)), (401, "agent_certificate_revoked"), "{}", refused.text);
    let renewal = send(&old, &gateway, Method::POST, "/v1/agent/auth/cert", None, None).await?;
    assert_eq!((renewal.status, code(&renewal)), (401, "agent_certificate_revoked"), "{}", renewal.text);
    assert_eq!(send(&new, &gateway, Method::GET, "/v1/agent/status", None, None).await?.status, 200);
    // Revoking again changes nothing; an unknown serial is 404.
    let again = gateway.call(Method::POST, &path, Some(&admin), Some(json!({"reason": "again"}))).await?;
    assert_eq!((again.status, &again.body["certificate"]), (200, certificate), "{}", again.text);
    let unknown = gateway.call(Method::POST, "/v1/agent/certificates/00ff/revoke", Some(&admin), None).await?;
    assert_eq!((unknown.status, code(&unknown)), (404, "certificate_not_found"), "{}", unknown.text);
    for (odd, refusal) in [
        ("%00ff", (400, "invalid_path_parameter")),
        ("not-hex", (404, "certificate_not_found")),
        ("%C3%A9", (404, "certificate_not_found")),
    ] {
        let odd = gateway.call(Method::POST, &format!("/v1/agent/certificates/{odd}/revoke"), Some(&admin), None).await?;
        assert_eq!((odd.status, code(&odd)), refusal, "{}", odd.text);
    }
    let odd_agent = gateway.call(Method::GET, "/v1/agent/certificates?agent_id=Not%20an%20Id", Some(&admin), None).await?;
    assert_eq!((odd_agent.status, code(&odd_agent)), (400, "invalid_agent_id"), "{}", odd_agent.text);
    let extra = gateway.call(Method::POST, &path, Some(&admin), Some(json!({"why": "no"}))).await?;
    assert_eq!(extra.status, 400, "{}", extra.text);

    // The agent lists and revokes its own, with its certificate or its JWT, never a sibling's.
    let own = send(&new, &gateway, Method::GET, "/v1/agent/auth/cert", None, None).await?;
    assert_eq!(own.status, 200, "{}", own.text);
    assert_eq!(serials(&own), vec![active(&new_serial), (old_serial.clone(), "revoked".to_string())], "{}", own.text);
    let revoked_list = send(&new, &gateway, Method::GET, "/v1/agent/auth/cert?status=revoked", Some(&jwts[0]), None).await?;
    assert_eq!(serials(&revoked_list), vec![(old_serial.clone(), "revoked".to_string())], "{}", revoked_list.text);
    let sibling_path = format!("/v1/agent/auth/cert/{sibling_serial}/revoke");
    let not_theirs = send(&new, &gateway, Method::POST, &sibling_path, None, None).await?;
    assert_eq!((not_theirs.status, code(&not_theirs)), (404, "certificate_not_found"), "{}", not_theirs.text);
    let own_path = format!("/v1/agent/auth/cert/{new_serial}/revoke");
    let self_revoked = send(&new, &gateway, Method::POST, &own_path, None, Some(json!({"reason": "rotating"}))).await?;
    assert_eq!(self_revoked.status, 200, "{}", self_revoked.text);
    assert_eq!(self_revoked.body["certificate"]["revoked_by"], "agent:courier", "{}", self_revoked.text);
    let gone = send(&new, &gateway, Method::GET, "/v1/agent/status", None, None).await?;
    assert_eq!((gone.status, code(&gone)), (401, "agent_certificate_revoked"), "{}", gone.text);
    // The JWT is not a certificate: it still works, and the sibling's certificate is untouched.
    let status = gateway.call(Method::GET, "/v1/agent/status", Some(&jwts[0]), None).await?;
    assert_eq!(status.status, 200, "{}", status.text);
    let sibling = gateway.call(Method::GET, "/v1/agent/certificates?agent_id=sibling&status=active", Some(&admin), None).await?;
    assert_eq!(serials(&sibling), vec![active(&sibling_serial)], "{}", sibling.text);
    Ok(())
}

/// Percent-encoded as Envoy writes `Cert` (and nginx `$ssl_client_escaped_cert`).
fn escaped(text: &str) -> String {
    text.bytes()
        .map(
            |byte| {
                if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) { (byte as char).to_string() } else { format!("%{byte:02X}") }
            },
        )
        .collect()
}

async fn certificates_forwarded_by_a_trusted_proxy_authenticate_agents(shape: Shape) -> TestResult {
    // Plain HTTP behind an Envoy (or Istio) ingress that verified the client's certificate in its
    // handshake; only the ingress's address (127.0.0.1 here) is trusted to say so.
    let env = [("BR_CLIENT_CERT_HEADER", "X-Forwarded-Client-Cert"), ("BR_CLIENT_CERT_TRUSTED_PROXIES", "127.0.0.1/32, fd00::/8")];
    let gateway = Gateway::start_with(shape, &env).await?;
    let (admin, _) = gateway.register("Forwarded Co").await?;
    let boot = gateway.call(Method::POST, "/v1/agent/bootstrap", Some(&admin), Some(json!({"agent_id": "scout"}))).await?;
    assert_eq!(boot.status, 201, "{}", boot.text);
    let jwt = boot.body["jwt"].as_str().unwrap_or_default().to_string();
    let issued = gateway.call(Method::POST, "/v1/agent/auth/cert", Some(&jwt), None).await?;
    assert_eq!(issued.status, 201, "{}", issued.text);
    assert_eq!(issued.body["mtls_available"], true, "certificates reach this edge through the proxy");
    let certificate = issued.body["certificate"].as_str().unwrap_or_default().to_string();
    let serial = issued.body["serial"].as_str().unwrap_or_default().to_string();
    let spiffe_id = issued.body["spiffe_id"].as_str().unwrap_or_default().to_string();
    let config = gateway.call(Method::GET, "/v1/config", Some(&admin), None).await?;
    assert_eq!(config.body["gateway"]["forwarded_client_certificate_header"], "x-forwarded-client-cert", "{}", config.text);

    let from = |address: [u8; 4]| reqwest::Client::builder().local_address(std::net::IpAddr::from(address)).build();
    let (proxy, stranger) = (from([127, 0, 0, 1])?, from([127, 0, 0, 2])?);
    let xfcc = |pem: &str| {
        format!("By=spiffe://cluster.local/ns/ai/sa/brainstorm;Hash=00;Cert=\"{}\";Subject=\"CN=scout,O=x\";URI={spiffe_id}", escaped(pem))
    };
    let forwarded = |client: &reqwest::Client, method: Method, path: &str, value: String, bearer: Option<&str>| {
        let mut request = client.request(method, format!("{}{path}", gateway.base_url)).header("x-forwarded-client-cert", value);
        if let Some(bearer) = bearer {
            request = request.bearer_auth(bearer);
        }
        if path == "/v1/agent/bootstrap" {
            request = request.json(&json!({"agent_id": "scout"}));
        }
        async move { Reply::read(request.send().await?).await }
    };

    // From the proxy, the forwarded certificate is the agent's credential.
    let me = forwarded(&proxy, Method::GET, "/v1/self", xfcc(&certificate), None).await?;
    assert_eq!(me.status, 200, "{}", me.text);
    assert_eq!((&me.body["auth_method"], &me.body["agent_id"]), (&json!("mtls"), &json!("scout")), "{}", me.text);
    let status = forwarded(&proxy, Method::GET, "/v1/agent/status", xfcc(&certificate), None).await?;
    assert_eq!(status.status, 200, "{}", status.text);
    // Appended by an outer proxy first: the nearest proxy's element (the last) counts.
    let appended = format!("Hash=11;Subject=\"CN=outer\",{}", xfcc(&certificate));
    assert_eq!(forwarded(&proxy, Method::GET, "/v1/agent/status", appended, None).await?.status, 200);
    // From any other peer the same header is a forgery: ignored.
    let stranger_reply = forwarded(&stranger, Method::GET, "/v1/agent/status", xfcc(&certificate), None).await?;
    assert_eq!((stranger_reply.status, code(&stranger_reply)), (401, "agent_token_required"), "{}", stranger_reply.text);
    // The proxy vouches for the handshake, not for the certificate: identity still judges it.
    let forger_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut forged = CertificateParams::default();
    forged.subject_alt_names = vec![SanType::URI(spiffe_id.clone().try_into()?)];
    forged.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let forged = forged.self_signed(&forger_key)?;
    let refused = forwarded(&proxy, Method::GET, "/v1/agent/status", xfcc(&forged.pem()), None).await?;
    assert_eq!((refused.status, code(&refused)), (401, "invalid_agent_certificate"), "{}", refused.text);
    // An element without the certificate itself (Envoy not told to forward it) is no credential.
    let hash_only = forwarded(&proxy, Method::GET, "/v1/agent/status", "Hash=00;Subject=\"CN=scout\"".to_string(), None).await?;
    assert_eq!((hash_only.status, code(&hash_only)), (401, "agent_token_required"), "{}", hash_only.text);
    // As with a handshake certificate: bootstrap wants a tenant key, delegation the JWT, and a
    // bearer credential wins.
    let bootstrap = forwarded(&proxy, Method::POST, "/v1/agent/bootstrap", xfcc(&certificate), None).await?;
    assert_eq!((bootstrap.status, code(&bootstrap)), (403, "api_key_required"), "{}", bootstrap.text);
    let children = forwarded(&proxy, Method::GET, "/v1/agent/sub-agents", xfcc(&certificate), None).await?;
    assert_eq!((children.status, code(&children)), (403, "agent_jwt_required"), "{}", children.text);
    let by_jwt = forwarded(&proxy, Method::GET, "/v1/agent/sub-agents", xfcc(&certificate), Some(&jwt)).await?;
    assert_eq!(by_jwt.status, 200, "{}", by_jwt.text);

    // Revoked: refused however it arrives.
    let revoked = gateway.call(Method::POST, &format!("/v1/agent/certificates/{serial}/revoke"), Some(&admin), None).await?;
    assert_eq!(revoked.status, 200, "{}", revoked.text);
    let after = forwarded(&proxy, Method::GET, "/v1/agent/status", xfcc(&certificate), None).await?;
    assert_eq!((after.status, code(&after)), (401, "agent_certificate_revoked"), "{}", after.text);
    Ok(())
}

fn pem_der(pem: &str) -> anyhow::Result<Vec<u8>> {
    use base64::Engine;
    let body: String = pem.lines().filter(|line| !line.starts_with("-----")).collect();
    Ok(base64::engine::general_purpose::STANDARD.decode(body)?)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}
