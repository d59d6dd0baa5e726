//! The Kubernetes operator end to end in both shapes: `brainstorm operator` against a Kubernetes API
//! (kmock's emulator, `tests/operator/kube_emulator.py`) and the gateway's services over gRPC (the
//! distributed shape's, or `brainstorm up --grpc-listen`'s), driven the way kubectl would (create,
//! merge-patch, delete over HTTP), checked at the gateway's REST edge.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine;
use brainstorm_e2e::{Gateway, PLATFORM_ADMIN_KEY, Shape, free_port, siem, temp_dir};
use reqwest::Method;
use serde_json::{Value, json};

type TestResult = anyhow::Result<()>;

brainstorm_e2e::in_both_shapes!(
    the_operators_changes_reach_the_tenants_siem,
    tenants_are_registered_kept_in_line_and_keyed,
    a_suspend_policy_rejects_the_tenant_on_deletion_and_foreign_secrets_are_never_overwritten,
    kill_switches_follow_their_resources_and_never_lift_a_switch_set_by_hand
);

const NAMESPACE: &str = "team-a";
const TENANTS: &str = "/apis/brainstorm.dev/v1alpha1/namespaces/team-a/tenants";
const SWITCHES: &str = "/apis/brainstorm.dev/v1alpha1/namespaces/team-a/killswitches";
const SECRETS: &str = "/api/v1/namespaces/team-a/secrets";

/// The emulated API server, killed on drop.
struct KubeApi {
    url: String,
    child: Child,
    client: reqwest::Client,
    kubeconfig: PathBuf,
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        let _killed = self.child.kill();
        let _reaped = self.child.wait();
    }
}

/// The Python that has kmock: `BR_KUBE_EMULATOR_PYTHON`, else the emulator's cached venv
/// (`tests/operator/ensure-emulator.sh` makes it; make test runs that first).
fn emulator_python() -> anyhow::Result<PathBuf> {
    if let Ok(path) = std::env::var("BR_KUBE_EMULATOR_PYTHON") {
        return Ok(PathBuf::from(path));
    }
    let home = std::env::var("HOME").context("HOME is not set")?;
    let python = Path::new(&home).join(".cache/brainstorm/kube-venv/bin/python");
    if !python.exists() {
        bail!("{} is missing: run tests/operator/ensure-emulator.sh (make test does)", python.display());
    }
    Ok(python)
}

impl KubeApi {
    async fn start() -> anyhow::Result<KubeApi> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("operator/kube_emulator.py");
        let work_dir = temp_dir("kube")?;
        let log = std::fs::File::create(work_dir.join("emulator.log"))?;
        let mut child = Command::new(emulator_python()?)
            .arg(&script)
            .args(["--port", "0"])
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", script.display()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).map(|_| line)
        })
        .await??;
        let url = line.trim().strip_prefix("listening on ").with_context(|| format!("the emulator said {line:?}"))?.to_string();
        let kubeconfig = work_dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: emulator\n  cluster:\n    server: {url}\ncontexts:\n- name: emulator\n  context:\n    cluster: emulator\n    user: tester\n    namespace: {NAMESPACE}\ncurrent-context: emulator\nusers:\n- name: tester\n  user: {{}}\n"
            ),
        )?;
        let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
        Ok(KubeApi { url, child, client, kubeconfig })
    }

    async fn send(&self, method: Method, path: &str, body: Option<Value>) -> anyhow::Result<(u16, Value)> {
        let mut request = self.client.request(method.clone(), format!("{}{path}", self.url));
        if let Some(body) = body {
            let content_type = if method == Method::PATCH { "application/merge-patch+json" } else { "application/json" };
            request = request.header("content-type", content_type).body(body.to_string());
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    async fn create(&self, collection: &str, object: Value) -> anyhow::Result<Value> {
        let (status, body) = self.send(Method::POST, collection, Some(object)).await?;
        if status != 201 && status != 200 {
            bail!("create in {collection}: {status} {body}");
        }
        Ok(body)
    }

    async fn patch(&self, path: &str, patch: Value) -> anyhow::Result<Value> {
        let (status, body) = self.send(Method::PATCH, path, Some(patch)).await?;
        if status != 200 {
            bail!("patch {path}: {status} {body}");
        }
        Ok(body)
    }

    async fn get(&self, path: &str) -> anyhow::Result<Option<Value>> {
        let (status, body) = self.send(Method::GET, path, None).await?;
        match status {
            200 => Ok(Some(body)),
            404 => Ok(None),
            _ => bail!("get {path}: {status} {body}"),
        }
    }

    async fn delete(&self, path: &str) -> anyhow::Result<()> {
        let (status, body) = self.send(Method::DELETE, path, None).await?;
        if status != 200 && status != 202 {
            bail!("delete {path}: {status} {body}");
        }
        Ok(())
    }

    /// Polls `path` until `accept` holds (at most 20 s) and returns the object.
    async fn until(&self, path: &str, what: &str, accept: impl Fn(Option<&Value>) -> bool) -> anyhow::Result<Option<Value>> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let object = self.get(path).await?;
            if accept(object.as_ref()) {
                return Ok(object);
            }
            if Instant::now() > deadline {
                bail!("{what}: still {}", object.map_or_else(|| "absent".to_string(), |object| object.to_string()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The distributed gateway, the emulated API server and the operator watching it (resync every
/// second, so drift made around the operator is undone quickly). Without a Kafka bus the edge hears
/// of the operator's changes to keys and tenants only when its cache expires: half a second here.
async fn cluster(shape: Shape) -> anyhow::Result<(Gateway, KubeApi)> {
    cluster_reporting(shape, false).await
}

/// `cluster`; with `fanout`, the observability fan-out runs too (the distributed shape's own
/// service), the operator reaches it, and destinations may be on this machine.
async fn cluster_reporting(shape: Shape, fanout: bool) -> anyhow::Result<(Gateway, KubeApi)> {
    let grpc_listen = format!("127.0.0.1:{}", free_port()?);
    let mut settings = vec![("BR_CACHE_TTL_MS", "500")];
    if shape == Shape::Embedded {
        settings.push(("BR_GRPC_LISTEN", grpc_listen.as_str()));
    }
    if fanout {
        settings.push(("BR_OBSERVABILITY_ALLOW_PRIVATE_URLS", "true"));
    }
    let mut gateway = Gateway::start_with(shape, &settings).await?;
    if fanout {
        gateway.host_observability_fanout().await?;
    }
    let kube = KubeApi::start().await?;
    gateway.start_operator(&kube.kubeconfig, &[("BR_OPERATOR_RESYNC_SECONDS", "1")]).await?;
    Ok((gateway, kube))
}

fn tenant(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "brainstorm.dev/v1alpha1", "kind": "Tenant", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec})
}

fn kill_switch(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "brainstorm.dev/v1alpha1", "kind": "KillSwitch", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec})
}

/// The Events the operator recorded about `name`, as (type, reason, note).
async fn events_of(kube: &KubeApi, name: &str) -> anyhow::Result<Vec<(String, String, String)>> {
    let list = kube.get(&format!("/apis/events.k8s.io/v1/namespaces/{NAMESPACE}/events")).await?.unwrap_or(Value::Null);
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|event| event["regarding"]["name"] == name)
        .map(|event| {
            let text = |member: &str| event[member].as_str().unwrap_or_default().to_string();
            (text("type"), text("reason"), text("note"))
        })
        .collect())
}

/// Waits (at most 20 s) until an Event of `reason` about `name` is recorded, and returns its note.
async fn event_until(kube: &KubeApi, name: &str, reason: &str, note_holds: &str) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let events = events_of(kube, name).await?;
        if let Some((_, _, note)) = events.iter().find(|(_, seen, note)| seen == reason && note.contains(note_holds)) {
            return Ok(note.clone());
        }
        if Instant::now() > deadline {
            bail!("no {reason} Event about {name} holding {note_holds:?}: {events:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn phase(object: Option<&Value>) -> Option<&str> {
    object.and_then(|object| object["status"]["phase"].as_str())
}

/// The admin key a Tenant's Secret holds.
async fn key_in_secret(kube: &KubeApi, name: &str) -> anyhow::Result<(String, Value)> {
    let secret = kube.get(&format!("{SECRETS}/{name}")).await?.with_context(|| format!("no Secret {name}"))?;
    let encoded = secret["data"]["api-key"].as_str().context("the Secret has no api-key")?;
    let key = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(encoded)?)?;
    Ok((key, secret))
}

async fn account(gateway: &Gateway, key: &str) -> anyhow::Result<(u16, Value)> {
    let reply = gateway.call(Method::GET, "/v1/account", Some(key), None).await?;
    Ok((reply.status, reply.body))
}

/// Waits until the edge answers `key`'s account read with `status` (edges cache identities briefly).
async fn account_until(gateway: &Gateway, key: &str, status: u16) -> anyhow::Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (seen, body) = account(gateway, key).await?;
        if seen == status {
            return Ok(body);
        }
        if Instant::now() > deadline {
            bail!("account read answered {seen} {body}, waited for {status}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn tenants_are_registered_kept_in_line_and_keyed(shape: Shape) -> TestResult {
    let (gateway, kube) = cluster(shape).await?;
    let created = kube.create(TENANTS, tenant("acme", json!({"displayName": "Acme Agents"}))).await?;
    let uid = created["metadata"]["uid"].as_str().context("no uid")?.to_string();
    let ready = kube.until(&format!("{TENANTS}/acme"), "Tenant ready", |object| phase(object) == Some("Ready")).await?;
    let ready = ready.context("Tenant vanished")?;
    let status = &ready["status"];
    assert_eq!(status["tenantId"], json!(uid), "{ready}");
    assert_eq!((status["plan"].as_str(), status["state"].as_str()), (Some("sandbox"), Some("active")), "{ready}");
    assert_eq!(status["secretName"], "acme-brainstorm");
    assert_eq!(ready["metadata"]["finalizers"], json!(["brainstorm.dev/operator"]));
    let condition = &status["conditions"][0];
    assert_eq!(
        (condition["type"].as_str(), condition["status"].as_str(), condition["reason"].as_str()),
        (Some("Ready"), Some("True"), Some("Reconciled")),
        "{ready}"
    );

    // The Secret: owned by the Tenant, holding a key that works at the edge.
    let (key, secret) = key_in_secret(&kube, "acme-brainstorm").await?;
    assert_eq!(secret["metadata"]["ownerReferences"][0]["uid"], json!(uid));
    assert_eq!(secret["metadata"]["annotations"]["brainstorm.dev/api-key-id"], status["apiKeyId"]);
    assert!(!ready.to_string().contains(&key), "the key must not appear in the Tenant");
    let (seen, body) = account(&gateway, &key).await?;
    assert_eq!(seen, 200, "{body}");
    event_until(&kube, "acme", "Registered", &uid).await?;
    event_until(&kube, "acme", "KeyWritten", "acme-brainstorm").await?;
    assert_eq!((body["tenant"]["id"].as_str(), body["tenant"]["name"].as_str()), (Some(uid.as_str()), Some("Acme Agents")), "{body}");

    // Spec changes reach the gateway: the name and the plan.
    kube.patch(&format!("{TENANTS}/acme"), json!({"spec": {"displayName": "Acme Robotics", "plan": "standard"}})).await?;
    kube.until(&format!("{TENANTS}/acme"), "plan standard", |object| {
        object.is_some_and(|object| object["status"]["plan"] == "standard" && object["status"]["observedGeneration"] == 2)
    })
    .await?;
    let body = account_until(&gateway, &key, 200).await?;
    assert_eq!((body["tenant"]["name"].as_str(), body["tenant"]["plan"].as_str()), (Some("Acme Robotics"), Some("standard")), "{body}");

    // Suspension stops every key of the tenant; lifting it lets them in again.
    kube.patch(&format!("{TENANTS}/acme"), json!({"spec": {"suspended": true}})).await?;
    let refused = account_until(&gateway, &key, 403).await?;
    assert_eq!(refused["error"]["code"], "tenant_rejected", "{refused}");
    kube.patch(&format!("{TENANTS}/acme"), json!({"spec": {"suspended": false}})).await?;
    account_until(&gateway, &key, 200).await?;

    // Deleting the Secret rotates the key: a new one is written, the old one stops working.
    kube.delete(&format!("{SECRETS}/acme-brainstorm")).await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let rotated = loop {
        if let Ok((fresh, _)) = key_in_secret(&kube, "acme-brainstorm").await
            && fresh != key
        {
            break fresh;
        }
        if Instant::now() > deadline {
            bail!("no new key after the Secret was deleted");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    account_until(&gateway, &rotated, 200).await?;
    account_until(&gateway, &key, 401).await?;
    event_until(&kube, "acme", "KeyRotated", "previous key revoked").await?;
    event_until(&kube, "acme", "StateChanged", "rejected").await?;

    // Deleting the Tenant revokes the operator's key and keeps the tenant (Retain).
    kube.delete(&format!("{TENANTS}/acme")).await?;
    kube.until(&format!("{TENANTS}/acme"), "Tenant gone", |object| object.is_none()).await?;
    account_until(&gateway, &rotated, 401).await?;
    let kept = gateway.call(Method::GET, &format!("/v1/admin/tenants/{uid}"), Some(PLATFORM_ADMIN_KEY), None).await?;
    assert_eq!(kept.status, 200, "{}", kept.body);
    Ok(())
}

async fn a_suspend_policy_rejects_the_tenant_on_deletion_and_foreign_secrets_are_never_overwritten(shape: Shape) -> TestResult {
    let (gateway, kube) = cluster(shape).await?;
    // A Secret of the wanted name that the Tenant does not own: refused with a message, not replaced.
    kube.create(SECRETS, json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "mine", "namespace": NAMESPACE}, "data": {"api-key": "c2VjcmV0"}}))
        .await?;
    kube.create(TENANTS, tenant("beta", json!({"displayName": "Beta", "secretName": "mine", "deletionPolicy": "Suspend"}))).await?;
    let failed =
        kube.until(&format!("{TENANTS}/beta"), "Tenant failed", |object| phase(object) == Some("Failed")).await?.context("gone")?;
    assert!(failed["status"]["message"].as_str().is_some_and(|message| message.contains("does not belong to this Tenant")), "{failed}");
    let untouched = kube.get(&format!("{SECRETS}/mine")).await?.context("the Secret vanished")?;
    assert_eq!(untouched["data"]["api-key"], "c2VjcmV0");

    kube.patch(&format!("{TENANTS}/beta"), json!({"spec": {"secretName": "beta-key"}})).await?;
    let ready = kube.until(&format!("{TENANTS}/beta"), "Tenant ready", |object| phase(object) == Some("Ready")).await?.context("gone")?;
    assert_eq!(ready["status"]["message"], Value::Null, "a cleared failure leaves no message: {ready}");
    let uid = ready["status"]["tenantId"].as_str().context("no tenant id")?.to_string();
    let (key, _) = key_in_secret(&kube, "beta-key").await?;
    account_until(&gateway, &key, 200).await?;

    kube.delete(&format!("{TENANTS}/beta")).await?;
    kube.until(&format!("{TENANTS}/beta"), "Tenant gone", |object| object.is_none()).await?;
    let kept = gateway.call(Method::GET, &format!("/v1/admin/tenants/{uid}"), Some(PLATFORM_ADMIN_KEY), None).await?;
    assert_eq!((kept.status, kept.body["tenant"]["status"].as_str()), (200, Some("rejected")), "{}", kept.body);
    Ok(())
}

/// Calls a completion until its status is `status` (edges cache the switch for up to 500 ms).
async fn completion_until(gateway: &Gateway, key: &str, agent: Option<&str>, status: u16) -> anyhow::Result<Value> {
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]});
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut request = gateway.request(Method::POST, "/v1/chat/completions", Some(key)).json(&body);
        if let Some(agent) = agent {
            request = request.header("x-br-agent-id", agent);
        }
        let response = request.send().await?;
        let seen = response.status().as_u16();
        let reply: Value = serde_json::from_str(&response.text().await?).unwrap_or(Value::Null);
        let matches = if status == 503 { seen == 503 } else { seen != 503 };
        if matches {
            return Ok(reply);
        }
        if Instant::now() > deadline {
            bail!("completion answered {seen} {reply}, waited for {status}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn kill_switches_follow_their_resources_and_never_lift_a_switch_set_by_hand(shape: Shape) -> TestResult {
    let (gateway, kube) = cluster(shape).await?;
    // A switch whose Tenant does not exist yet waits for it.
    kube.create(SWITCHES, kill_switch("stop-acme", json!({"tenantRef": "acme", "reason": "runaway spend"}))).await?;
    kube.until(&format!("{SWITCHES}/stop-acme"), "switch pending", |object| phase(object) == Some("Pending")).await?;
    kube.create(TENANTS, tenant("acme", json!({"displayName": "Acme"}))).await?;
    kube.until(&format!("{TENANTS}/acme"), "Tenant ready", |object| phase(object) == Some("Ready")).await?;
    let (key, _) = key_in_secret(&kube, "acme-brainstorm").await?;
    let active = kube.until(&format!("{SWITCHES}/stop-acme"), "switch active", |object| phase(object) == Some("Active")).await?;
    assert_eq!(active.as_ref().map(|object| object["status"]["activatedBy"].clone()), Some(json!("kubernetes:team-a/stop-acme")));

    let refused = completion_until(&gateway, &key, None, 503).await?;
    assert_eq!(refused["error"]["code"], "kill_switch_active", "{refused}");
    event_until(&kube, "stop-acme", "SwitchSet", "runaway spend").await?;
    let state = gateway.call(Method::GET, "/v1/killswitch/status", Some(&key), None).await?;
    assert_eq!((state.body["active"].as_bool(), state.body["reason"].as_str()), (Some(true), Some("runaway spend")), "{}", state.body);

    // Switched off in the resource: traffic flows again.
    kube.patch(&format!("{SWITCHES}/stop-acme"), json!({"spec": {"active": false}})).await?;
    kube.until(&format!("{SWITCHES}/stop-acme"), "switch inactive", |object| phase(object) == Some("Inactive")).await?;
    completion_until(&gateway, &key, None, 200).await?;
    event_until(&kube, "stop-acme", "SwitchLifted", "off").await?;

    // A switch an incident responder sets by hand is not the operator's to lift.
    let by_hand = gateway.call(Method::POST, "/v1/killswitch/activate", Some(&key), Some(json!({"reason": "on-call"}))).await?;
    assert_eq!(by_hand.status, 200, "{}", by_hand.body);
    let held = kube
        .until(&format!("{SWITCHES}/stop-acme"), "switch held by hand", |object| {
            object.is_some_and(|object| object["status"]["active"] == true && object["status"]["message"].is_string())
        })
        .await?
        .context("gone")?;
    assert!(held["status"]["applied"].is_null(), "{held}");
    let condition = &held["status"]["conditions"][0];
    assert_eq!((condition["status"].as_str(), condition["reason"].as_str()), (Some("False"), Some("HeldByOther")), "{held}");
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    completion_until(&gateway, &key, None, 503).await?;
    let lifted = gateway.call(Method::POST, "/v1/killswitch/deactivate", Some(&key), None).await?;
    assert_eq!(lifted.status, 200, "{}", lifted.body);

    // A scoped switch stops one agent only; deleting the resource lifts it.
    kube.create(
        SWITCHES,
        kill_switch("stop-crawler", json!({"tenantRef": "acme", "scope": "agent", "target": "crawler", "reason": "loops"})),
    )
    .await?;
    kube.until(&format!("{SWITCHES}/stop-crawler"), "scoped switch active", |object| phase(object) == Some("Active")).await?;
    let stopped = completion_until(&gateway, &key, Some("crawler"), 503).await?;
    assert_eq!(stopped["error"]["code"], "kill_switch_active", "{stopped}");
    completion_until(&gateway, &key, Some("writer"), 200).await?;
    kube.delete(&format!("{SWITCHES}/stop-crawler")).await?;
    kube.until(&format!("{SWITCHES}/stop-crawler"), "scoped switch gone", |object| object.is_none()).await?;
    completion_until(&gateway, &key, Some("crawler"), 200).await?;

    // An invalid spec is reported, not applied.
    kube.create(SWITCHES, kill_switch("no-reason", json!({"tenantRef": "acme"}))).await?;
    let failed =
        kube.until(&format!("{SWITCHES}/no-reason"), "switch failed", |object| phase(object) == Some("Failed")).await?.context("gone")?;
    assert!(failed["status"]["message"].as_str().is_some_and(|message| message.contains("reason")), "{failed}");
    assert_eq!(failed["status"]["conditions"][0]["status"], "False", "{failed}");
    let warnings = events_of(&kube, "no-reason").await?;
    assert!(warnings.iter().any(|(kind, reason, _)| kind == "Warning" && reason == "ReconcileFailed"), "{warnings:?}");
    completion_until(&gateway, &key, None, 200).await?;
    Ok(())
}

async fn the_operators_changes_reach_the_tenants_siem(shape: Shape) -> TestResult {
    let (gateway, kube) = cluster_reporting(shape, true).await?;
    kube.create(TENANTS, tenant("globex", json!({"displayName": "Globex"}))).await?;
    let ready = kube.until(&format!("{TENANTS}/globex"), "Tenant ready", |object| phase(object) == Some("Ready")).await?;
    let uid = ready.context("Tenant vanished")?["status"]["tenantId"].as_str().unwrap_or_default().to_string();
    let (key, secret) = key_in_secret(&kube, "globex-brainstorm").await?;
    let first_key_id = secret["metadata"]["annotations"]["brainstorm.dev/api-key-id"].as_str().unwrap_or_default().to_string();
    let (url, received) = siem().await?;
    let destination = json!({"name": "soc", "type": "webhook", "config": {"url": url}, "event_types": ["audit"],
                             "batch": {"max_size": 10, "flush_interval_ms": 100}});
    let created = gateway.call(Method::POST, "/v1/observability/destinations", Some(&key), Some(destination)).await?;
    assert_eq!(created.status, 201, "{}", created.text);

    // The Secret deleted: the operator mints a key and revokes the one the Secret held.
    kube.delete(&format!("{SECRETS}/globex-brainstorm")).await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let second_key_id = loop {
        if let Ok((fresh, secret)) = key_in_secret(&kube, "globex-brainstorm").await
            && fresh != key
        {
            break secret["metadata"]["annotations"]["brainstorm.dev/api-key-id"].as_str().unwrap_or_default().to_string();
        }
        anyhow::ensure!(Instant::now() < deadline, "no new key after the Secret was deleted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    event_until(&kube, "globex", "KeyRotated", "previous key revoked").await?;
    // A tenant-wide switch set and lifted by its resource; a scoped one set and deleted.
    kube.create(SWITCHES, kill_switch("halt-globex", json!({"tenantRef": "globex", "reason": "incident 42"}))).await?;
    kube.until(&format!("{SWITCHES}/halt-globex"), "switch active", |object| phase(object) == Some("Active")).await?;
    kube.patch(&format!("{SWITCHES}/halt-globex"), json!({"spec": {"active": false}})).await?;
    kube.until(&format!("{SWITCHES}/halt-globex"), "switch inactive", |object| phase(object) == Some("Inactive")).await?;
    let scoped = kill_switch("halt-bot", json!({"tenantRef": "globex", "scope": "agent", "target": "bot", "reason": "loops"}));
    kube.create(SWITCHES, scoped).await?;
    kube.until(&format!("{SWITCHES}/halt-bot"), "scoped switch active", |object| phase(object) == Some("Active")).await?;
    kube.delete(&format!("{SWITCHES}/halt-bot")).await?;
    kube.until(&format!("{SWITCHES}/halt-bot"), "scoped switch gone", |object| object.is_none()).await?;

    // Suspended in the resource and back: every key of the tenant stops, then works again.
    kube.patch(&format!("{TENANTS}/globex"), json!({"spec": {"suspended": true}})).await?;
    kube.until(&format!("{TENANTS}/globex"), "suspended", |object| object.is_some_and(|object| object["status"]["state"] == "rejected"))
        .await?;
    kube.patch(&format!("{TENANTS}/globex"), json!({"spec": {"suspended": false}})).await?;
    kube.until(&format!("{TENANTS}/globex"), "active", |object| object.is_some_and(|object| object["status"]["state"] == "active")).await?;

    // The SIEM hears each change once, named as the edge names them, the resource as the actor.
    let (tenant_actor, switch_actor, scoped_actor) =
        ("kubernetes:team-a/globex", "kubernetes:team-a/halt-globex", "kubernetes:team-a/halt-bot");
    let wanted = [
        ("audit.api_key.created", second_key_id.as_str(), tenant_actor),
        ("audit.api_key.revoked", first_key_id.as_str(), tenant_actor),
        ("audit.kill_switch.activated", uid.as_str(), switch_actor),
        ("audit.kill_switch.deactivated", uid.as_str(), switch_actor),
        ("audit.kill_switch.scope_activated", "agent:bot", scoped_actor),
        ("audit.kill_switch.scope_deactivated", "agent:bot", scoped_actor),
        ("audit.tenant.status_changed", uid.as_str(), tenant_actor),
        ("audit.tenant.status_changed", uid.as_str(), tenant_actor),
    ];
    let seen = |events: &[Value]| -> Vec<(String, String, String)> {
        events
            .iter()
            .filter(|event| {
                event["event"].as_str().is_some_and(|name| {
                    ["audit.api_key.", "audit.kill_switch.", "audit.tenant."].iter().any(|prefix| name.starts_with(prefix))
                })
            })
            .map(|event| {
                let text = |value: &Value| value.as_str().unwrap_or_default().to_string();
                (text(&event["event"]), text(&event["data"]["subject"]), text(&event["data"]["actor"]))
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let events = loop {
        let events = received.events();
        if seen(&events).len() >= wanted.len() || Instant::now() > deadline {
            break events;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut got = seen(&events);
    got.sort();
    let mut expected: Vec<(String, String, String)> =
        wanted.iter().map(|(name, subject, actor)| (name.to_string(), subject.to_string(), actor.to_string())).collect();
    expected.sort();
    assert_eq!(got, expected, "{}", gateway.logs());
    let activated = events.iter().find(|event| event["event"] == "audit.kill_switch.activated").context("no activation")?;
    assert_eq!((&activated["severity"], &activated["data"]["reason"]), (&json!(5), &json!("incident 42")), "{activated}");
    let minted = events.iter().find(|event| event["event"] == "audit.api_key.created").context("no key")?;
    assert_eq!(minted["data"]["role"], "admin", "{minted}");
    let moves: Vec<(Value, Value, Value)> = events
        .iter()
        .filter(|event| event["event"] == "audit.tenant.status_changed")
        .map(|event| (event["data"]["from"].clone(), event["data"]["status"].clone(), event["severity"].clone()))
        .collect();
    assert!(moves.contains(&(json!("active"), json!("rejected"), json!(4))), "{moves:?}");
    assert!(moves.contains(&(json!("rejected"), json!("active"), json!(1))), "{moves:?}");
    Ok(())
}
