//! Test support: start the real `brainstorm` binary in either shape and talk to it over HTTP.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;
use sqlx::Connection;

/// Declares each listed `async fn name(shape: Shape) -> TestResult` as two tests, `embedded::name`
/// and `distributed::name`, so one suite runs against both shapes.
#[macro_export]
macro_rules! in_both_shapes {
    ($($test:ident),* $(,)?) => {
        mod embedded {
            $( #[tokio::test] async fn $test() -> super::TestResult { super::$test($crate::Shape::Embedded).await } )*
        }
        mod distributed {
            $( #[tokio::test] async fn $test() -> super::TestResult { super::$test($crate::Shape::Distributed).await } )*
        }
    };
}

/// The two shapes of the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `brainstorm up`: one process, SQLite, in-process bus.
    Embedded,
    /// `brainstorm serve identity` + `brainstorm serve edge-router`: two processes over gRPC, PostgreSQL.
    Distributed,
}

/// The master key the distributed test gateways seal provider keys with.
pub const MASTER_KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

/// The platform administrator key every test gateway is started with.
pub const PLATFORM_ADMIN_KEY: &str = "br_live_platform_admin_key_for_tests_0001";

/// How a process was started: label, arguments and settings.
type Launch = (String, Vec<String>, Vec<(String, String)>);

/// A running gateway; its processes are killed when it is dropped.
pub struct Gateway {
    pub base_url: String,
    /// Every edge's base URL (the distributed shape can run several replicas).
    pub edge_urls: Vec<String>,
    /// The database the gateway stores into (SQLite file or PostgreSQL).
    pub database_url: String,
    pub outbox: PathBuf,
    pub work_dir: PathBuf,
    pub client: reqwest::Client,
    /// `https` when the gateway was started with `BR_TLS_CERT_FILE`, else `http`.
    pub edge_scheme: &'static str,
    processes: Vec<(String, Child)>,
    /// The distributed shape's gRPC services: `BR_<SERVICE>_URL` and its value.
    service_urls: Vec<(String, String)>,
    /// How each process was started, so a killed one can be started again.
    launches: Vec<Launch>,
}

/// The `brainstorm` binary next to the test executable (built by `cargo build -p brainstorm`), or
/// `BR_BINARY`.
pub fn binary() -> anyhow::Result<PathBuf> {
    if let Ok(path) = std::env::var("BR_BINARY") {
        return Ok(PathBuf::from(path));
    }
    let test_executable = std::env::current_exe()?;
    let profile_dir = test_executable.parent().and_then(Path::parent).context("unexpected test executable location")?;
    let path = profile_dir.join("brainstorm");
    if !path.exists() {
        bail!("{} is missing: run `cargo build -p brainstorm` first (make test does)", path.display());
    }
    Ok(path)
}

/// A port free at the time of asking, never handed out twice in this test process: two ports asked
/// for one after the other (a gRPC and a health port, say) cannot collide. It is taken from outside
/// the kernel's ephemeral range, so no outgoing connection (the gateway's own, to an upstream or a
/// database) can take it between this check and the child's bind: a port from `bind(":0")` could.
pub fn free_port() -> anyhow::Result<u16> {
    static HANDED_OUT: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<u16>>> = std::sync::OnceLock::new();
    let handed_out = HANDED_OUT.get_or_init(Default::default);
    let hand_out = |port: u16| -> anyhow::Result<bool> {
        let mut taken = handed_out.lock().map_err(|_| anyhow::anyhow!("port registry poisoned"))?;
        Ok(taken.insert(port))
    };
    let ephemeral = ephemeral_range();
    // Ports 10000 to 65535, from a random start.
    let start = (uuid::Uuid::new_v4().as_u128() % 55_536) as u32;
    for step in 0..55_536u32 {
        let port = u16::try_from(10_000 + (start + step) % 55_536)?;
        if ephemeral.contains(&port) || std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        if hand_out(port)? {
            return Ok(port);
        }
    }
    // Every port from 10000 up is ephemeral here: one the kernel picks.
    for _ in 0..100 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if hand_out(port)? {
            return Ok(port);
        }
    }
    bail!("no fresh free port")
}

/// The kernel's ephemeral port range (Linux's `ip_local_port_range`; 32768-60999 where unreadable).
fn ephemeral_range() -> std::ops::RangeInclusive<u16> {
    let read = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok().and_then(|text| {
        let mut ends = text.split_whitespace().map(|end| end.parse::<u16>().ok());
        Some(ends.next()??..=ends.next()??)
    });
    read.unwrap_or(32_768..=60_999)
}

/// A fresh temporary directory.
pub fn temp_dir(label: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::temp_dir().join(format!("brainstorm-e2e-{label}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&path)?;
    Ok(path)
}

/// Where the end-to-end tests find PostgreSQL; `BR_TEST_POSTGRES_URL` overrides.
pub fn postgres_admin_url() -> String {
    std::env::var("BR_TEST_POSTGRES_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string())
}

/// Creates an empty database `brainstorm_e2e_<random>` and returns its URL.
pub async fn fresh_postgres_database() -> anyhow::Result<String> {
    let admin_url = postgres_admin_url();
    let mut connection =
        sqlx::PgConnection::connect(&admin_url).await.with_context(|| format!("cannot reach PostgreSQL at {admin_url}"))?;
    let name = format!("brainstorm_e2e_{}", uuid::Uuid::new_v4().simple());
    // The name is hex generated above: safe to splice into DDL.
    sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut connection).await?;
    connection.close().await?;
    let (base, _) = admin_url.rsplit_once('/').context("the PostgreSQL URL has no database part")?;
    Ok(format!("{base}/{name}"))
}

/// Runs the binary to completion and returns (success, stdout + stderr).
pub fn run_to_end(arguments: &[&str], env: &[(&str, &str)], work_dir: &Path) -> anyhow::Result<(bool, String)> {
    let output = Command::new(binary()?).args(arguments).envs(env.iter().copied()).env_remove("RUST_LOG").current_dir(work_dir).output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    Ok((output.status.success(), text))
}

/// A test setting, not the gateway's: the CPUs (`taskset -c` syntax) every process is pinned to.
pub const PIN_CPUS: &str = "BR_TEST_PIN_CPUS";

impl Gateway {
    /// Starts the gateway in `shape` with the default test settings.
    pub async fn start(shape: Shape) -> anyhow::Result<Gateway> {
        Self::start_with(shape, &[]).await
    }

    /// Starts the gateway in `shape`; `env` adds or overrides settings of every process.
    pub async fn start_with(shape: Shape, env: &[(&str, &str)]) -> anyhow::Result<Gateway> {
        let work_dir = temp_dir(match shape {
            Shape::Embedded => "embedded",
            Shape::Distributed => "distributed",
        })?;
        let outbox = work_dir.join("outbox");
        let edge_port = free_port()?;
        // `BR_TLS_CERT_FILE` given: the edges speak HTTPS, and the client trusts the chain file's last certificate.
        let tls_chain = env.iter().find(|(name, _)| *name == "BR_TLS_CERT_FILE").map(|(_, path)| PathBuf::from(path));
        let edge_scheme = if tls_chain.is_some() { "https" } else { "http" };
        let base_url = format!("{edge_scheme}://127.0.0.1:{edge_port}");
        let mut client = reqwest::Client::builder().timeout(Duration::from_secs(30));
        if let Some(chain) = &tls_chain {
            let text = std::fs::read_to_string(chain)?;
            let root =
                text.rfind("-----BEGIN CERTIFICATE-----").map(|start| &text[start..]).context("no certificate in BR_TLS_CERT_FILE")?;
            client = client.add_root_certificate(reqwest::Certificate::from_pem(root.as_bytes())?);
        }
        let client = client.build()?;
        let mut gateway = Gateway {
            edge_scheme,
            base_url: base_url.clone(),
            edge_urls: vec![base_url],
            database_url: String::new(),
            outbox: outbox.clone(),
            work_dir: work_dir.clone(),
            client,
            processes: Vec::new(),
            service_urls: Vec::new(),
            launches: Vec::new(),
        };
        let outbox_text = outbox.display().to_string();
        let mut common: Vec<(String, String)> = vec![
            ("BR_PLATFORM_ADMIN_KEY".to_string(), PLATFORM_ADMIN_KEY.to_string()),
            ("BR_MAIL_OUTBOX".to_string(), outbox_text),
            ("BR_LOG_FORMAT".to_string(), "text".to_string()),
            ("RUST_LOG".to_string(), "info".to_string()),
            // The response cache is off unless a test turns it on: the others count every call.
            ("BR_RESPONSE_CACHE_MAX_BYTES".to_string(), "0".to_string()),
        ];
        common.extend(env.iter().map(|(name, value)| (name.to_string(), value.to_string())));
        match shape {
            Shape::Embedded => {
                let data_dir = work_dir.join("data");
                gateway.database_url = format!("sqlite://{}", data_dir.join("brainstorm.db").display());
                let data_dir = data_dir.display().to_string();
                let listen = format!("127.0.0.1:{edge_port}");
                gateway.spawn("up", &["up", "--listen", &listen, "--data-dir", &data_dir], &common)?;
                gateway.wait_healthy(edge_port, edge_scheme).await?;
                // `BR_GRPC_LISTEN` given: the embedded services answer gRPC there too.
                if let Some((_, address)) = common.iter().find(|(name, _)| name == "BR_GRPC_LISTEN") {
                    for service in
                        ["identity", "catalog-health-sentinel", "budget-ledger", "audit-lineage", "policy-firewall", "observability-fanout"]
                    {
                        let variable = format!("BR_{}_URL", service.to_uppercase().replace('-', "_"));
                        gateway.service_urls.push((variable, format!("http://{address}")));
                    }
                }
            }
            Shape::Distributed => {
                let database_url = fresh_postgres_database().await?;
                let (migrated, output) = run_to_end(&["migrate", "--database-url", &database_url], &[], &work_dir)?;
                if !migrated {
                    bail!("brainstorm migrate failed:\n{output}");
                }
                gateway.database_url = database_url.clone();
                common.push(("BR_DATABASE_URL".to_string(), database_url));
                common.push(("BR_MASTER_KEY".to_string(), MASTER_KEY.to_string()));
                let mut edge_env = common.clone();
                for (label, service) in [
                    ("identity", "identity"),
                    ("catalog", "catalog-health-sentinel"),
                    ("budget", "budget-ledger"),
                    ("audit", "audit-lineage"),
                    ("policy", "policy-firewall"),
                ] {
                    let grpc_listen = format!("127.0.0.1:{}", free_port()?);
                    let health_port = free_port()?;
                    let health_listen = format!("127.0.0.1:{health_port}");
                    gateway.spawn(label, &["serve", service, "--grpc-listen", &grpc_listen, "--listen", &health_listen], &common)?;
                    gateway.wait_healthy(health_port, "http").await?;
                    let variable = format!("BR_{}_URL", service.to_uppercase().replace('-', "_"));
                    edge_env.push((variable.clone(), format!("http://{grpc_listen}")));
                    gateway.service_urls.push((variable, format!("http://{grpc_listen}")));
                }
                // The edge holds no database and no master key: it reaches both services over gRPC.
                edge_env.retain(|(name, _)| name != "BR_DATABASE_URL" && name != "BR_MASTER_KEY");
                let edge_listen = format!("127.0.0.1:{edge_port}");
                gateway.spawn("edge-router", &["serve", "edge-router", "--listen", &edge_listen], &edge_env)?;
                gateway.wait_healthy(edge_port, edge_scheme).await?;
                // With shared counters (Redis), a second edge replica shows that budgets and rate limits hold across replicas.
                if edge_env.iter().any(|(name, _)| name == "BR_REDIS_URL") {
                    let second_port = free_port()?;
                    let second_listen = format!("127.0.0.1:{second_port}");
                    gateway.spawn("edge-router-2", &["serve", "edge-router", "--listen", &second_listen], &edge_env)?;
                    gateway.wait_healthy(second_port, edge_scheme).await?;
                    gateway.edge_urls.push(format!("{edge_scheme}://{second_listen}"));
                }
            }
        }
        Ok(gateway)
    }

    /// Makes sure the observability fan-out runs and the edges reach it: `up` hosts it already; the
    /// distributed shape gets `serve observability-fanout` (label `fanout`, the services' settings)
    /// and its edges are restarted with `BR_OBSERVABILITY_FANOUT_URL`.
    pub async fn host_observability_fanout(&mut self) -> anyhow::Result<()> {
        self.host_service("fanout", "observability-fanout").await
    }

    /// Makes sure prompts-eval (prompts, evaluations, agent memory) runs and the edges reach it, as
    /// [`Gateway::host_observability_fanout`] does for the fan-out (label `prompts`).
    pub async fn host_prompts_eval(&mut self) -> anyhow::Result<()> {
        self.host_service("prompts", "prompts-eval").await
    }

    /// In the distributed shape, starts `serve <service>` (label `label`, the services' settings) and
    /// restarts the edges with its `BR_<SERVICE>_URL`; `up` hosts every service already.
    async fn host_service(&mut self, label: &str, service: &str) -> anyhow::Result<()> {
        let Some((_, _, env)) = self.launches.iter().find(|(label, _, _)| label == "identity").cloned() else { return Ok(()) };
        let grpc_listen = format!("127.0.0.1:{}", free_port()?);
        let health_port = free_port()?;
        let health_listen = format!("127.0.0.1:{health_port}");
        self.spawn(label, &["serve", service, "--grpc-listen", &grpc_listen, "--listen", &health_listen], &env)?;
        self.wait_healthy(health_port, "http").await?;
        let url = format!("http://{grpc_listen}");
        let variable = format!("BR_{}_URL", service.to_uppercase().replace('-', "_"));
        self.service_urls.push((variable.clone(), url.clone()));
        let edges: Vec<String> =
            self.launches.iter().map(|(label, _, _)| label.clone()).filter(|label| label.starts_with("edge-router")).collect();
        for edge in edges {
            self.kill(&edge)?;
            self.restart_with(&edge, &[(variable.as_str(), &url)]).await?;
        }
        Ok(())
    }

    /// Starts `brainstorm operator` (label `operator`) against the gateway's gRPC services (the
    /// distributed shape's, or `up`'s when started with `BR_GRPC_LISTEN`) and the Kubernetes API
    /// `kubeconfig` points at; `env` adds settings. Waits until it answers /health.
    pub async fn start_operator(&mut self, kubeconfig: &Path, env: &[(&str, &str)]) -> anyhow::Result<()> {
        if self.service_urls.is_empty() {
            bail!("the operator needs gRPC services: the distributed shape, or `up` with BR_GRPC_LISTEN");
        }
        let port = free_port()?;
        let listen = format!("127.0.0.1:{port}");
        let mut settings = self.service_urls.clone();
        settings.push(("KUBECONFIG".to_string(), kubeconfig.display().to_string()));
        settings.push(("BR_LOG_FORMAT".to_string(), "text".to_string()));
        settings.push(("RUST_LOG".to_string(), "info,brainstorm_operator=debug".to_string()));
        settings.extend(env.iter().map(|(name, value)| (name.to_string(), value.to_string())));
        self.spawn("operator", &["operator", "--listen", &listen], &settings)?;
        self.wait_healthy(port, "http").await
    }

    fn spawn(&mut self, label: &str, arguments: &[&str], env: &[(String, String)]) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.work_dir.join(format!("{label}.log")))?;
        // `BR_TEST_PIN_CPUS` runs the process on those CPUs only (`taskset`), as a one-CPU container would.
        let pinned = env.iter().find(|(name, _)| name == PIN_CPUS).map(|(_, cpus)| cpus.as_str());
        let mut command = match pinned {
            Some(cpus) => {
                let mut command = Command::new("taskset");
                command.args(["-c", cpus]).arg(binary()?);
                command
            }
            None => Command::new(binary()?),
        };
        let child = command
            .args(arguments)
            .envs(env.iter().map(|(name, value)| (name.as_str(), value.as_str())))
            .current_dir(&self.work_dir)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start brainstorm {}", arguments.join(" ")))?;
        self.processes.push((label.to_string(), child));
        self.launches.retain(|(launched, _, _)| launched != label);
        self.launches.push((label.to_string(), arguments.iter().map(|argument| argument.to_string()).collect(), env.to_vec()));
        Ok(())
    }

    /// Kills one process outright (SIGKILL), as a crash would.
    pub fn kill(&mut self, label: &str) -> anyhow::Result<()> {
        let index = self.processes.iter().position(|(name, _)| name == label).with_context(|| format!("no process `{label}`"))?;
        let (_, mut child) = self.processes.remove(index);
        child.kill()?;
        child.wait()?;
        Ok(())
    }

    /// Starts a killed process again with its arguments and settings, and waits until it is healthy.
    pub async fn restart(&mut self, label: &str) -> anyhow::Result<()> {
        self.restart_with(label, &[]).await
    }

    /// Starts a killed process again with its arguments and settings, `env` added or overriding,
    /// and waits until it is healthy.
    pub async fn restart_with(&mut self, label: &str, changed: &[(&str, &str)]) -> anyhow::Result<()> {
        let (_, arguments, mut env) =
            self.launches.iter().find(|(name, _, _)| name == label).cloned().with_context(|| format!("`{label}` was never started"))?;
        for (name, value) in changed {
            env.retain(|(existing, _)| existing != name);
            env.push((name.to_string(), value.to_string()));
        }
        let arguments: Vec<&str> = arguments.iter().map(String::as_str).collect();
        let health_port = arguments
            .windows(2)
            .find(|pair| pair[0] == "--listen")
            .and_then(|pair| pair[1].rsplit(':').next())
            .and_then(|port| port.parse::<u16>().ok())
            .with_context(|| format!("`{label}` has no --listen port"))?;
        self.spawn(label, &arguments, &env)?;
        let scheme = if label == "up" || label.starts_with("edge-router") { self.edge_scheme } else { "http" };
        self.wait_healthy(health_port, scheme).await
    }

    async fn wait_healthy(&mut self, port: u16, scheme: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let url = format!("{scheme}://127.0.0.1:{port}/health");
        loop {
            if let Ok(response) = self.client.get(&url).send().await
                && response.status().is_success()
            {
                return Ok(());
            }
            let mut exited = None;
            for (label, child) in &mut self.processes {
                if let Some(status) = child.try_wait()? {
                    exited = Some((label.clone(), status));
                }
            }
            if let Some((label, status)) = exited {
                bail!("{label} exited with {status} before serving:\n{}", self.log_of(&label));
            }
            if Instant::now() > deadline {
                bail!("no health on port {port} within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The log a process wrote so far.
    pub fn log_of(&self, label: &str) -> String {
        std::fs::read_to_string(self.work_dir.join(format!("{label}.log"))).unwrap_or_default()
    }

    /// Every process's log, for failure messages.
    pub fn logs(&self) -> String {
        self.processes.iter().map(|(label, _)| format!("--- {label} ---\n{}", self.log_of(label))).collect()
    }

    /// Sends SIGTERM to every process and waits for each to exit; returns whether all exited cleanly.
    pub fn terminate(&mut self) -> anyhow::Result<bool> {
        let labels: Vec<String> = self.processes.iter().map(|(label, _)| label.clone()).collect();
        for label in &labels {
            self.signal_stop(label)?;
        }
        let mut clean = true;
        for label in &labels {
            clean &= self.wait_exit(label, Duration::from_secs(15))?;
        }
        Ok(clean)
    }

    /// Sends SIGTERM to one process without waiting for it to exit (see `wait_exit`).
    pub fn signal_stop(&self, label: &str) -> anyhow::Result<()> {
        let (_, child) = self.processes.iter().find(|(name, _)| name == label).with_context(|| format!("no process `{label}`"))?;
        if !Command::new("kill").arg("-TERM").arg(child.id().to_string()).status()?.success() {
            bail!("kill -TERM {label} failed");
        }
        Ok(())
    }

    /// Waits up to `within` for process `label` to exit (after `signal_stop`); returns whether it
    /// exited cleanly.
    pub fn wait_exit(&mut self, label: &str, within: Duration) -> anyhow::Result<bool> {
        let index = self.processes.iter().position(|(name, _)| name == label).with_context(|| format!("no process `{label}`"))?;
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.processes[index].1.try_wait()? {
                self.processes.remove(index);
                return Ok(status.success());
            }
            if Instant::now() > deadline {
                bail!("{label} did not stop within {within:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A request to the edge, with `key` as bearer when given.
    pub fn request(&self, method: reqwest::Method, path: &str, key: Option<&str>) -> reqwest::RequestBuilder {
        let builder = self.client.request(method, format!("{}{path}", self.base_url));
        match key {
            Some(key) => builder.bearer_auth(key),
            None => builder,
        }
    }

    /// Sends a request and returns (status, JSON body or Null, headers).
    pub async fn call(&self, method: reqwest::Method, path: &str, key: Option<&str>, body: Option<Value>) -> anyhow::Result<Reply> {
        let mut builder = self.request(method, path, key);
        if let Some(body) = body {
            builder = builder.json(&body);
        }
        Reply::read(builder.send().await?).await
    }

    /// Registers a tenant and returns (admin key, registration body).
    pub async fn register(&self, name: &str) -> anyhow::Result<(String, Value)> {
        let reply = self
            .call(reqwest::Method::POST, "/v1/register", None, Some(serde_json::json!({"tenant_name": name, "accept_tos": true})))
            .await?;
        if reply.status != 201 {
            bail!("registration failed: {} {}", reply.status, reply.body);
        }
        let key = reply.body["api_key"]["key"].as_str().context("no key in registration")?.to_string();
        Ok((key, reply.body))
    }

    /// A new API key of `role` in the tenant of `admin` (an admin key): its plaintext.
    pub async fn key_with_role(&self, admin: &str, role: &str) -> anyhow::Result<String> {
        let body = serde_json::json!({"name": role, "role": role});
        let reply = self.call(reqwest::Method::POST, "/v1/api-keys", Some(admin), Some(body)).await?;
        if reply.status != 201 {
            bail!("creating a {role} key: {} {}", reply.status, reply.text);
        }
        Ok(reply.body["api_key"]["key"].as_str().context("no key in the answer")?.to_string())
    }

    /// Every text value stored in a table, for leak checks.
    pub async fn table_text(&self, table: &str) -> anyhow::Result<String> {
        sqlx::any::install_default_drivers();
        let mut connection = sqlx::AnyConnection::connect(&self.database_url).await?;
        // The table name comes from the test itself, never from input.
        let rows = sqlx::query(&format!("SELECT * FROM {table}")).fetch_all(&mut connection).await?;
        let mut text = String::new();
        for row in rows {
            use sqlx::Row;
            for index in 0..row.len() {
                if let Ok(Some(value)) = row.try_get::<Option<String>, _>(index) {
                    text.push_str(&value);
                    text.push('\n');
                }
            }
        }
        Ok(text)
    }

    /// Mail files written to the outbox so far, parsed.
    pub fn mails(&self) -> anyhow::Result<Vec<Value>> {
        let Ok(entries) = std::fs::read_dir(&self.outbox) else { return Ok(Vec::new()) };
        let mut mails = Vec::new();
        for entry in entries {
            let path = entry?.path();
            if path.extension().is_some_and(|extension| extension == "json") {
                mails.push(serde_json::from_slice(&std::fs::read(&path)?)?);
            }
        }
        Ok(mails)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        for (_, child) in &mut self.processes {
            let _killed = child.kill();
            let _reaped = child.wait();
        }
    }
}

/// A response: status, parsed JSON body (Null when not JSON) and headers.
#[derive(Debug, Default)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
    pub text: String,
    pub headers: reqwest::header::HeaderMap,
}

impl Reply {
    pub async fn read(response: reqwest::Response) -> anyhow::Result<Reply> {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await?;
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Ok(Reply { status, body, text, headers })
    }

    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }
}

/// The JSON payloads of a server-sent event stream's `data:` lines (`[DONE]` and non-JSON skipped).
pub fn sse_data(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .filter_map(|data| serde_json::from_str(data).ok())
        .collect()
}

/// Events a tenant's SIEM (a webhook destination) received.
#[derive(Clone, Default)]
pub struct Siem(std::sync::Arc<std::sync::Mutex<Vec<Value>>>);

impl Siem {
    /// Every event received so far.
    pub fn events(&self) -> Vec<Value> {
        self.0.lock().map(|events| events.clone()).unwrap_or_default()
    }
}

/// A tenant's SIEM: a webhook receiver on this machine keeping every event it is sent; its URL
/// (`/events`) and what it received.
pub async fn siem() -> anyhow::Result<(String, Siem)> {
    let received = Siem::default();
    let store = received.clone();
    let receive = move |body: axum::body::Bytes| {
        let store = store.clone();
        async move {
            let batch: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            if let Ok(mut events) = store.0.lock() {
                events.extend(batch["events"].as_array().cloned().unwrap_or_default());
            }
            axum::http::StatusCode::OK
        }
    };
    let app = axum::Router::new().route("/events", axum::routing::post(receive));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/events", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((url, received))
}
