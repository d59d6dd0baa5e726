//! Typed configuration, read once at start: defaults < TOML file < environment < command-line flags.
//!
//! Each source becomes a `ConfigLayer` of optional values; layers merge, then `Settings::resolve`
//! validates the result and names the bad setting in its error. The environment is passed in as a map,
//! so tests never touch the process environment.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;

use crate::telemetry::LogFormat;

/// The longest `write_linger_ms` accepted.
const MAX_WRITE_LINGER_MS: u64 = 10_000;
/// How long the response cache keeps a reply by default (`response_cache_ttl_ms`): ten minutes.
const DEFAULT_RESPONSE_CACHE_TTL: Duration = Duration::from_secs(600);
/// The longest `response_cache_ttl_ms` accepted: a day.
const MAX_RESPONSE_CACHE_TTL_MS: u64 = 86_400_000;
/// The response cache's default size (`response_cache_max_bytes`): 64 MiB of replies per edge.
const DEFAULT_RESPONSE_CACHE_BYTES: u64 = 64 * 1024 * 1024;
/// The largest `response_cache_max_bytes` accepted: 16 GiB.
const MAX_RESPONSE_CACHE_BYTES: u64 = 16 * 1024 * 1024 * 1024;

/// The longest `cache_ttl_ms` accepted: an hour.
const MAX_CACHE_TTL_MS: u64 = 3_600_000;
/// How long an edge trusts a resolved key or tenant configuration by default.
const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(30);
/// How long an agent JWT lives by default, and the accepted range.
const DEFAULT_AGENT_TOKEN_TTL: Duration = Duration::from_secs(3600);
const AGENT_TOKEN_TTL_SECONDS: std::ops::RangeInclusive<u64> = 60..=86_400;
/// Consecutive provider failures that open a model's circuit: the default and the accepted range.
const DEFAULT_CIRCUIT_FAILURES: u32 = 5;
const CIRCUIT_FAILURES: std::ops::RangeInclusive<u64> = 1..=1_000;
/// How long an open circuit refuses before a trial request: the default and the accepted range.
const DEFAULT_CIRCUIT_OPEN: Duration = Duration::from_secs(30);
const CIRCUIT_OPEN_MS: std::ops::RangeInclusive<u64> = 100..=3_600_000;
/// How often the sentinel probes providers: the default and the accepted range.
const DEFAULT_SENTINEL_INTERVAL: Duration = Duration::from_secs(30);
const SENTINEL_INTERVAL_MS: std::ops::RangeInclusive<u64> = 1_000..=3_600_000;

/// A configuration problem, naming the setting at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid setting `{setting}`: {message}")]
pub struct ConfigError {
    pub setting: String,
    pub message: String,
}

impl ConfigError {
    /// An error about `setting`.
    pub fn new(setting: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError { setting: setting.into(), message: message.into() }
    }
}

/// A secret value: its `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself, for the one place that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("Secret(***)")
    }
}

/// The services of the suite, by their role names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ServiceName {
    EdgeRouter,
    Identity,
    BudgetLedger,
    PolicyFirewall,
    AuditLineage,
    CatalogHealthSentinel,
    McpGateway,
    ObservabilityFanout,
    PromptsEval,
}

impl ServiceName {
    /// Every service.
    pub const ALL: [ServiceName; 9] = [
        ServiceName::EdgeRouter,
        ServiceName::Identity,
        ServiceName::BudgetLedger,
        ServiceName::PolicyFirewall,
        ServiceName::AuditLineage,
        ServiceName::CatalogHealthSentinel,
        ServiceName::McpGateway,
        ServiceName::ObservabilityFanout,
        ServiceName::PromptsEval,
    ];

    /// The role name, as in `brainstorm serve identity`.
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceName::EdgeRouter => "edge-router",
            ServiceName::Identity => "identity",
            ServiceName::BudgetLedger => "budget-ledger",
            ServiceName::PolicyFirewall => "policy-firewall",
            ServiceName::AuditLineage => "audit-lineage",
            ServiceName::CatalogHealthSentinel => "catalog-health-sentinel",
            ServiceName::McpGateway => "mcp-gateway",
            ServiceName::ObservabilityFanout => "observability-fanout",
            ServiceName::PromptsEval => "prompts-eval",
        }
    }

    /// The environment variable holding the service's gRPC address, e.g. `BR_IDENTITY_URL`.
    pub fn url_variable(self) -> String {
        format!("BR_{}_URL", self.as_str().to_uppercase().replace('-', "_"))
    }
}

impl fmt::Display for ServiceName {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

impl FromStr for ServiceName {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        ServiceName::ALL.into_iter().find(|service| service.as_str() == text).ok_or_else(|| {
            let known: Vec<&str> = ServiceName::ALL.iter().map(|service| service.as_str()).collect();
            ConfigError::new("service", format!("unknown service `{text}`; known services: {}", known.join(", ")))
        })
    }
}

/// Who may register a tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RegistrationMode {
    /// Anyone; tenants are active at once.
    Open,
    /// Only with a valid invite code.
    Invite,
    /// Anyone, but tenants without an invite code wait for a platform admin's approval.
    Approval,
}

impl FromStr for RegistrationMode {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "open" => Ok(RegistrationMode::Open),
            "invite" => Ok(RegistrationMode::Invite),
            "approval" => Ok(RegistrationMode::Approval),
            other => Err(ConfigError::new("registration_mode", format!("`{other}` is not one of open, invite, approval"))),
        }
    }
}

/// One source of configuration: every value optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigLayer {
    pub listen: Option<String>,
    pub grpc_listen: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub database_url: Option<Secret>,
    pub redis_url: Option<Secret>,
    pub kafka_brokers: Option<String>,
    pub platform_admin_key: Option<Secret>,
    pub master_key: Option<Secret>,
    pub mail_outbox: Option<PathBuf>,
    pub require_agent_owner: Option<bool>,
    pub mcp_allow_private_urls: Option<bool>,
    pub observability_allow_private_urls: Option<bool>,
    pub xdr_bidirectional: Option<bool>,
    /// The identity provider whose JWTs the `/auth/*` bridge routes accept (see `Settings::idp`).
    pub idp_issuer: Option<String>,
    pub idp_audience: Option<String>,
    pub idp_jwks_url: Option<String>,
    pub idp_jwks_file: Option<PathBuf>,
    /// The REST listener's TLS certificate chain and key (see `Settings::tls`).
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// The header a TLS-terminating proxy forwards clients' certificates in, and the proxies
    /// trusted to send it (see `Settings::forwarded_client_certificates`).
    pub client_cert_header: Option<String>,
    pub client_cert_trusted_proxies: Option<String>,
    pub otel_exporter_otlp_endpoint: Option<String>,
    pub public_url: Option<String>,
    pub dashboard_url: Option<String>,
    pub registration_mode: Option<String>,
    pub log_format: Option<String>,
    /// Milliseconds the background writers gather a batch before writing it (see `Settings::write_linger`).
    pub write_linger_ms: Option<u64>,
    /// Milliseconds an edge trusts a resolved API key or tenant configuration (see `Settings::cache_ttl`).
    pub cache_ttl_ms: Option<u64>,
    /// Milliseconds the response cache keeps a reply (see `Settings::response_cache`).
    pub response_cache_ttl_ms: Option<u64>,
    /// Bytes of replies an edge's response cache holds; 0 turns it off (see `Settings::response_cache`).
    pub response_cache_max_bytes: Option<u64>,
    /// Seconds an agent JWT minted by bootstrap lives (see `Settings::agent_token_ttl`).
    pub agent_token_ttl_seconds: Option<u64>,
    /// Consecutive provider failures that open a model's circuit (see `Settings::circuit_failures`).
    pub circuit_failures: Option<u64>,
    /// Milliseconds an open circuit refuses before a trial request (see `Settings::circuit_open`).
    pub circuit_open_ms: Option<u64>,
    /// Milliseconds between two sentinel probes of a provider (see `Settings::sentinel_interval`).
    pub sentinel_interval_ms: Option<u64>,
    /// A model catalog file replacing the bundled one (prices update without a rebuild).
    pub model_catalog: Option<PathBuf>,
    /// HTTP proxy for calls to providers (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`; upper or lower case).
    pub https_proxy: Option<Secret>,
    pub http_proxy: Option<Secret>,
    pub all_proxy: Option<Secret>,
    /// Hosts reached without the proxy (`NO_PROXY`: comma-separated names, domains, IPs or CIDRs).
    pub no_proxy: Option<String>,
    /// gRPC addresses of services not in this process, by role name.
    #[serde(default)]
    pub services: BTreeMap<String, String>,
    /// Upstream base URL overrides, by provider id.
    #[serde(default)]
    pub provider_base_urls: BTreeMap<String, String>,
}

macro_rules! take_upper {
    ($upper:expr, $lower:expr, $($field:ident),* $(,)?) => {
        ConfigLayer {
            $( $field: $upper.$field.or($lower.$field), )*
            services: { let mut merged = $lower.services; merged.extend($upper.services); merged },
            provider_base_urls: { let mut merged = $lower.provider_base_urls; merged.extend($upper.provider_base_urls); merged },
        }
    };
}

impl ConfigLayer {
    /// Reads a TOML configuration file's text.
    pub fn from_toml(text: &str, origin: &Path) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|error| ConfigError::new(format!("config file {}", origin.display()), error.message().to_string()))
    }

    /// Reads the `BR_*` variables (and `OTEL_EXPORTER_OTLP_ENDPOINT` and the proxy variables curl reads) of an environment map.
    pub fn from_env(env: &HashMap<String, String>) -> Result<Self, ConfigError> {
        let text = |name: &str| env.get(name).filter(|value| !value.is_empty()).cloned();
        let flag = |name: &str| -> Result<Option<bool>, ConfigError> { text(name).map(|value| parse_bool(name, &value)).transpose() };
        let mut layer = ConfigLayer {
            listen: text("BR_LISTEN"),
            grpc_listen: text("BR_GRPC_LISTEN"),
            data_dir: text("BR_DATA_DIR").map(PathBuf::from),
            database_url: text("BR_DATABASE_URL").map(Secret),
            redis_url: text("BR_REDIS_URL").map(Secret),
            kafka_brokers: text("BR_KAFKA_BROKERS"),
            platform_admin_key: text("BR_PLATFORM_ADMIN_KEY").map(Secret),
            master_key: text("BR_MASTER_KEY").map(Secret),
            mail_outbox: text("BR_MAIL_OUTBOX").map(PathBuf::from),
            require_agent_owner: flag("BR_REQUIRE_AGENT_OWNER")?,
            mcp_allow_private_urls: flag("BR_MCP_ALLOW_PRIVATE_URLS")?,
            observability_allow_private_urls: flag("BR_OBSERVABILITY_ALLOW_PRIVATE_URLS")?,
            xdr_bidirectional: flag("BR_XDR_BIDIRECTIONAL")?,
            idp_issuer: text("BR_IDP_ISSUER"),
            idp_audience: text("BR_IDP_AUDIENCE"),
            idp_jwks_url: text("BR_IDP_JWKS_URL"),
            idp_jwks_file: text("BR_IDP_JWKS_FILE").map(PathBuf::from),
            tls_cert_file: text("BR_TLS_CERT_FILE").map(PathBuf::from),
            tls_key_file: text("BR_TLS_KEY_FILE").map(PathBuf::from),
            client_cert_header: text("BR_CLIENT_CERT_HEADER"),
            client_cert_trusted_proxies: text("BR_CLIENT_CERT_TRUSTED_PROXIES"),
            otel_exporter_otlp_endpoint: text("OTEL_EXPORTER_OTLP_ENDPOINT"),
            public_url: text("BR_PUBLIC_URL"),
            dashboard_url: text("BR_DASHBOARD_URL"),
            registration_mode: text("BR_REGISTRATION_MODE"),
            log_format: text("BR_LOG_FORMAT"),
            write_linger_ms: text("BR_WRITE_LINGER_MS")
                .map(|value| parse_millis("write_linger_ms (BR_WRITE_LINGER_MS)", &value))
                .transpose()?,
            cache_ttl_ms: text("BR_CACHE_TTL_MS").map(|value| parse_millis("cache_ttl_ms (BR_CACHE_TTL_MS)", &value)).transpose()?,
            response_cache_ttl_ms: text("BR_RESPONSE_CACHE_TTL_MS")
                .map(|value| parse_millis("response_cache_ttl_ms (BR_RESPONSE_CACHE_TTL_MS)", &value))
                .transpose()?,
            response_cache_max_bytes: text("BR_RESPONSE_CACHE_MAX_BYTES")
                .map(|value| {
                    value.parse().map_err(|_| {
                        ConfigError::new(
                            "response_cache_max_bytes (BR_RESPONSE_CACHE_MAX_BYTES)",
                            format!("`{value}` is not a number of bytes"),
                        )
                    })
                })
                .transpose()?,
            agent_token_ttl_seconds: text("BR_AGENT_TOKEN_TTL_SECONDS")
                .map(|value| {
                    value.parse().map_err(|_| {
                        ConfigError::new(
                            "agent_token_ttl_seconds (BR_AGENT_TOKEN_TTL_SECONDS)",
                            format!("`{value}` is not a number of seconds"),
                        )
                    })
                })
                .transpose()?,
            circuit_failures: text("BR_CIRCUIT_FAILURES")
                .map(|value| {
                    value
                        .parse()
                        .map_err(|_| ConfigError::new("circuit_failures (BR_CIRCUIT_FAILURES)", format!("`{value}` is not a number")))
                })
                .transpose()?,
            circuit_open_ms: text("BR_CIRCUIT_OPEN_MS")
                .map(|value| parse_millis("circuit_open_ms (BR_CIRCUIT_OPEN_MS)", &value))
                .transpose()?,
            sentinel_interval_ms: text("BR_SENTINEL_INTERVAL_MS")
                .map(|value| parse_millis("sentinel_interval_ms (BR_SENTINEL_INTERVAL_MS)", &value))
                .transpose()?,
            model_catalog: text("BR_MODEL_CATALOG").map(PathBuf::from),
            https_proxy: text("HTTPS_PROXY").or_else(|| text("https_proxy")).map(Secret),
            http_proxy: text("HTTP_PROXY").or_else(|| text("http_proxy")).map(Secret),
            all_proxy: text("ALL_PROXY").or_else(|| text("all_proxy")).map(Secret),
            no_proxy: text("NO_PROXY").or_else(|| text("no_proxy")),
            services: BTreeMap::new(),
            provider_base_urls: BTreeMap::new(),
        };
        for service in ServiceName::ALL {
            if let Some(url) = text(&service.url_variable()) {
                layer.services.insert(service.as_str().to_string(), url);
            }
        }
        for (name, value) in env {
            let provider = name.strip_prefix("BR_PROVIDER_").and_then(|rest| rest.strip_suffix("_BASE_URL"));
            if let Some(provider) = provider.filter(|provider| !provider.is_empty() && !value.is_empty()) {
                layer.provider_base_urls.insert(provider.to_lowercase().replace('_', "-"), value.clone());
            }
        }
        Ok(layer)
    }

    /// This layer over `lower`: values set here win.
    pub fn over(self, lower: ConfigLayer) -> ConfigLayer {
        take_upper!(
            self,
            lower,
            listen,
            grpc_listen,
            data_dir,
            database_url,
            redis_url,
            kafka_brokers,
            platform_admin_key,
            master_key,
            mail_outbox,
            require_agent_owner,
            mcp_allow_private_urls,
            observability_allow_private_urls,
            xdr_bidirectional,
            idp_issuer,
            idp_audience,
            idp_jwks_url,
            idp_jwks_file,
            tls_cert_file,
            tls_key_file,
            client_cert_header,
            client_cert_trusted_proxies,
            otel_exporter_otlp_endpoint,
            public_url,
            dashboard_url,
            registration_mode,
            log_format,
            write_linger_ms,
            cache_ttl_ms,
            response_cache_ttl_ms,
            response_cache_max_bytes,
            agent_token_ttl_seconds,
            circuit_failures,
            circuit_open_ms,
            sentinel_interval_ms,
            model_catalog,
            https_proxy,
            http_proxy,
            all_proxy,
            no_proxy,
        )
    }
}

/// Where calls to providers go through an HTTP proxy (the variables curl reads).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EgressProxy {
    /// Proxy for `https://` providers (`HTTPS_PROXY`).
    pub https: Option<Secret>,
    /// Proxy for `http://` providers (`HTTP_PROXY`).
    pub http: Option<Secret>,
    /// Proxy for both when the scheme's own is unset (`ALL_PROXY`).
    pub all: Option<Secret>,
    /// Hosts reached directly (`NO_PROXY`).
    pub no: Option<String>,
}

/// An identity provider: its issuer (`iss`), the audience its tokens must name (`aud`, when set) and
/// where its signing keys are published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdpSettings {
    pub issuer: String,
    pub audience: Option<String>,
    pub jwks: IdpJwks,
}

/// Where an identity provider's JSON Web Key Set is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdpJwks {
    /// Fetched over HTTP(S) and kept for ten minutes.
    Url(String),
    /// Read from a file (a mounted secret or ConfigMap), re-read as often.
    File(PathBuf),
}

/// The REST listener's certificate chain and private key, as PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub certificate_chain: PathBuf,
    pub private_key: PathBuf,
}

/// Client certificates a TLS-terminating proxy (an ingress controller, a mesh sidecar) verified
/// and forwards in a header, and the peers trusted to send that header: from any other peer the
/// header is ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardedClientCertificates {
    /// The header's name, lower case (`x-forwarded-client-cert` is read as Envoy's format).
    pub header: String,
    /// The proxies' addresses: never empty.
    pub trusted_proxies: Vec<crate::net::AddressRange>,
}

/// The edge's response cache (`response_cache_ttl_ms`, `response_cache_max_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseCacheSettings {
    /// How long a stored reply answers repeats of its request.
    pub ttl: Duration,
    /// The bytes of replies one edge holds, oldest evicted first; 0 turns the cache off.
    pub max_bytes: u64,
}

/// Validated settings, shared read-only by every service of the process.
#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: SocketAddr,
    pub grpc_listen: SocketAddr,
    /// Whether `grpc_listen` was set (file, environment or flag) rather than defaulted: `up` serves
    /// its services over gRPC only then.
    pub grpc_listen_configured: bool,
    pub data_dir: PathBuf,
    pub database_url: Option<Secret>,
    pub redis_url: Option<Secret>,
    pub kafka_brokers: Option<String>,
    pub platform_admin_key: Option<Secret>,
    pub master_key: Option<Secret>,
    pub mail_outbox: PathBuf,
    pub require_agent_owner: bool,
    /// Whether MCP servers may be registered at private, loopback or link-local addresses.
    pub mcp_allow_private_urls: bool,
    /// Whether observability destinations and XDR connectors may be at private, loopback or
    /// link-local addresses.
    pub observability_allow_private_urls: bool,
    pub xdr_bidirectional: bool,
    /// The identity provider whose JWTs the `/auth/*` bridge routes accept; None switches them off.
    pub idp: Option<IdpSettings>,
    /// When set, the REST listener speaks HTTPS with this certificate chain and key (PEM files)
    /// and accepts agent client certificates (mTLS); otherwise plain HTTP.
    pub tls: Option<TlsFiles>,
    /// Agent client certificates forwarded by a trusted proxy (`BR_CLIENT_CERT_HEADER`,
    /// `BR_CLIENT_CERT_TRUSTED_PROXIES`), for an edge behind an ingress that terminates TLS.
    pub forwarded_client_certificates: Option<ForwardedClientCertificates>,
    pub otel_exporter_otlp_endpoint: Option<String>,
    /// The gateway's public base URL (`{base_url}` of the spec).
    pub public_url: String,
    /// Where claim and invitation links point (`{dashboard_url}` of the spec).
    pub dashboard_url: String,
    pub registration_mode: RegistrationMode,
    pub log_format: LogFormat,
    /// How long the chain, ledger, anomaly and interception writers gather deliveries after the first
    /// before writing them: how late a record may become queryable, against the CPU each commit costs.
    pub write_linger: Duration,
    /// How long an edge trusts a resolved API key or a tenant's configuration before asking identity
    /// again. Changes made through the same edge, and those every edge hears on the Kafka bus, apply
    /// at once; a change made elsewhere without a shared bus (the operator, another edge) reaches
    /// this edge at most this late.
    pub cache_ttl: Duration,
    /// The edge's response cache: how long it keeps a non-streamed reply and how many bytes of
    /// replies it holds (0 turns it off).
    pub response_cache: ResponseCacheSettings,
    /// How long an agent JWT minted by bootstrap lives (default an hour; 60 s to a day).
    pub agent_token_ttl: Duration,
    /// Consecutive provider failures (5xx, 408, timeouts, no connection) that open a model's circuit
    /// in an edge (default 5).
    pub circuit_failures: u32,
    /// How long an open circuit refuses before it lets a trial request through (default 30 s).
    pub circuit_open: Duration,
    /// How often an edge's sentinel probes the providers it watches (default 30 s).
    pub sentinel_interval: Duration,
    pub model_catalog: Option<PathBuf>,
    pub service_urls: BTreeMap<ServiceName, String>,
    pub provider_base_urls: BTreeMap<String, String>,
    pub egress_proxy: EgressProxy,
}

impl Settings {
    /// Validates a merged layer (defaults are applied here).
    pub fn resolve(layer: ConfigLayer) -> Result<Settings, ConfigError> {
        let listen = parse_address("listen (BR_LISTEN, --listen)", layer.listen.as_deref().unwrap_or("127.0.0.1:8080"))?;
        let grpc_listen_configured = layer.grpc_listen.is_some();
        let grpc_listen =
            parse_address("grpc_listen (BR_GRPC_LISTEN, --grpc-listen)", layer.grpc_listen.as_deref().unwrap_or("127.0.0.1:50051"))?;
        let data_dir = layer.data_dir.unwrap_or_else(|| PathBuf::from("brainstorm-data"));
        if let Some(url) = &layer.database_url {
            let url = url.expose();
            let known = ["sqlite:", "postgres://", "postgresql://"].iter().any(|scheme| url.starts_with(scheme));
            if !known {
                return Err(ConfigError::new("database_url (BR_DATABASE_URL)", "expected a sqlite: or postgres:// url"));
            }
        }
        if let Some(url) = &layer.redis_url
            && !(url.expose().starts_with("redis://") || url.expose().starts_with("rediss://"))
        {
            return Err(ConfigError::new("redis_url (BR_REDIS_URL)", "expected a redis:// or rediss:// url"));
        }
        if let Some(key) = &layer.platform_admin_key {
            let key = key.expose();
            if !key.starts_with("br_live_") || key.len() < 24 {
                return Err(ConfigError::new(
                    "platform_admin_key (BR_PLATFORM_ADMIN_KEY)",
                    "expected a br_live_ key of at least 24 characters",
                ));
            }
        }
        if let Some(key) = &layer.master_key {
            let key = key.expose();
            if key.len() != 64 || !key.bytes().all(|byte| byte.is_ascii_hexdigit()) {
                return Err(ConfigError::new("master_key (BR_MASTER_KEY)", "expected 64 hexadecimal characters (a 32-byte key)"));
            }
        }
        let public_url = match layer.public_url {
            Some(url) => parse_http_url("public_url (BR_PUBLIC_URL)", &url)?,
            None => format!("http://{listen}"),
        };
        let dashboard_url = match layer.dashboard_url {
            Some(url) => parse_http_url("dashboard_url (BR_DASHBOARD_URL)", &url)?,
            None => public_url.clone(),
        };
        let registration_mode = match layer.registration_mode {
            Some(mode) => {
                mode.parse().map_err(|error: ConfigError| ConfigError::new("registration_mode (BR_REGISTRATION_MODE)", error.message))?
            }
            None => RegistrationMode::Open,
        };
        let log_format = match layer.log_format.as_deref() {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => return Err(ConfigError::new("log_format (BR_LOG_FORMAT)", format!("`{other}` is not one of text, json"))),
        };
        let write_linger = match layer.write_linger_ms {
            None => crate::bus::DEFAULT_WRITE_LINGER,
            Some(millis) if millis <= MAX_WRITE_LINGER_MS => Duration::from_millis(millis),
            Some(millis) => {
                return Err(ConfigError::new(
                    "write_linger_ms (BR_WRITE_LINGER_MS)",
                    format!("{millis} is more than {MAX_WRITE_LINGER_MS} ms: records would stay unwritten for too long"),
                ));
            }
        };
        let cache_ttl = match layer.cache_ttl_ms {
            None => DEFAULT_CACHE_TTL,
            Some(millis) if millis <= MAX_CACHE_TTL_MS => Duration::from_millis(millis),
            Some(millis) => {
                return Err(ConfigError::new(
                    "cache_ttl_ms (BR_CACHE_TTL_MS)",
                    format!("{millis} is more than {MAX_CACHE_TTL_MS} ms: a revoked key would keep working for too long"),
                ));
            }
        };
        let response_cache = ResponseCacheSettings {
            ttl: match layer.response_cache_ttl_ms {
                None => DEFAULT_RESPONSE_CACHE_TTL,
                Some(millis) if (1..=MAX_RESPONSE_CACHE_TTL_MS).contains(&millis) => Duration::from_millis(millis),
                Some(millis) => {
                    return Err(ConfigError::new(
                        "response_cache_ttl_ms (BR_RESPONSE_CACHE_TTL_MS)",
                        format!(
                            "{millis} is outside 1..={MAX_RESPONSE_CACHE_TTL_MS} ms (turn the cache off with response_cache_max_bytes = 0)"
                        ),
                    ));
                }
            },
            max_bytes: match layer.response_cache_max_bytes {
                None => DEFAULT_RESPONSE_CACHE_BYTES,
                Some(bytes) if bytes <= MAX_RESPONSE_CACHE_BYTES => bytes,
                Some(bytes) => {
                    return Err(ConfigError::new(
                        "response_cache_max_bytes (BR_RESPONSE_CACHE_MAX_BYTES)",
                        format!("{bytes} is more than {MAX_RESPONSE_CACHE_BYTES} bytes"),
                    ));
                }
            },
        };
        let agent_token_ttl = match layer.agent_token_ttl_seconds {
            None => DEFAULT_AGENT_TOKEN_TTL,
            Some(seconds) if AGENT_TOKEN_TTL_SECONDS.contains(&seconds) => Duration::from_secs(seconds),
            Some(seconds) => {
                return Err(ConfigError::new(
                    "agent_token_ttl_seconds (BR_AGENT_TOKEN_TTL_SECONDS)",
                    format!("{seconds} is outside {}..={} seconds", AGENT_TOKEN_TTL_SECONDS.start(), AGENT_TOKEN_TTL_SECONDS.end()),
                ));
            }
        };
        let circuit_failures = match layer.circuit_failures {
            None => DEFAULT_CIRCUIT_FAILURES,
            Some(count) if CIRCUIT_FAILURES.contains(&count) => u32::try_from(count).unwrap_or(DEFAULT_CIRCUIT_FAILURES),
            Some(count) => {
                return Err(ConfigError::new(
                    "circuit_failures (BR_CIRCUIT_FAILURES)",
                    format!("{count} is outside {}..={}", CIRCUIT_FAILURES.start(), CIRCUIT_FAILURES.end()),
                ));
            }
        };
        let circuit_open =
            within_millis("circuit_open_ms (BR_CIRCUIT_OPEN_MS)", layer.circuit_open_ms, &CIRCUIT_OPEN_MS, DEFAULT_CIRCUIT_OPEN)?;
        let sentinel_interval = within_millis(
            "sentinel_interval_ms (BR_SENTINEL_INTERVAL_MS)",
            layer.sentinel_interval_ms,
            &SENTINEL_INTERVAL_MS,
            DEFAULT_SENTINEL_INTERVAL,
        )?;
        for (setting, proxy) in [
            ("https_proxy (HTTPS_PROXY)", &layer.https_proxy),
            ("http_proxy (HTTP_PROXY)", &layer.http_proxy),
            ("all_proxy (ALL_PROXY)", &layer.all_proxy),
        ] {
            if let Some(proxy) = proxy {
                check_proxy(setting, proxy.expose())?;
            }
        }
        let mut service_urls = BTreeMap::new();
        for (name, url) in layer.services {
            let service: ServiceName = name.parse()?;
            let url = parse_http_url(&service.url_variable(), &url)?;
            service_urls.insert(service, url);
        }
        let mut provider_base_urls = BTreeMap::new();
        for (provider, url) in layer.provider_base_urls {
            let setting = format!("BR_PROVIDER_{}_BASE_URL", provider.to_uppercase().replace('-', "_"));
            provider_base_urls.insert(provider, parse_http_url(&setting, &url)?);
        }
        let idp = match (layer.idp_issuer, layer.idp_jwks_url, layer.idp_jwks_file) {
            (None, None, None) => None,
            (Some(issuer), Some(url), None) => {
                Some(IdpSettings { issuer, audience: layer.idp_audience, jwks: IdpJwks::Url(parse_http_url("BR_IDP_JWKS_URL", &url)?) })
            }
            (Some(issuer), None, Some(file)) => Some(IdpSettings { issuer, audience: layer.idp_audience, jwks: IdpJwks::File(file) }),
            _ => {
                return Err(ConfigError::new(
                    "BR_IDP_ISSUER",
                    "an identity provider needs BR_IDP_ISSUER and exactly one of BR_IDP_JWKS_URL and BR_IDP_JWKS_FILE".to_string(),
                ));
            }
        };
        let tls = match (layer.tls_cert_file, layer.tls_key_file) {
            (None, None) => None,
            (Some(certificate_chain), Some(private_key)) => Some(TlsFiles { certificate_chain, private_key }),
            _ => {
                return Err(ConfigError::new(
                    "BR_TLS_CERT_FILE",
                    "HTTPS needs both BR_TLS_CERT_FILE and BR_TLS_KEY_FILE (PEM files), or neither for plain HTTP".to_string(),
                ));
            }
        };
        let forwarded_client_certificates =
            forwarded_client_certificates(layer.client_cert_header.as_deref(), layer.client_cert_trusted_proxies.as_deref())?;
        Ok(Settings {
            listen,
            grpc_listen,
            grpc_listen_configured,
            mail_outbox: layer.mail_outbox.unwrap_or_else(|| data_dir.join("outbox")),
            data_dir,
            database_url: layer.database_url,
            redis_url: layer.redis_url,
            kafka_brokers: layer.kafka_brokers,
            platform_admin_key: layer.platform_admin_key,
            master_key: layer.master_key,
            require_agent_owner: layer.require_agent_owner.unwrap_or(false),
            mcp_allow_private_urls: layer.mcp_allow_private_urls.unwrap_or(false),
            observability_allow_private_urls: layer.observability_allow_private_urls.unwrap_or(false),
            xdr_bidirectional: layer.xdr_bidirectional.unwrap_or(false),
            idp,
            tls,
            forwarded_client_certificates,
            otel_exporter_otlp_endpoint: layer.otel_exporter_otlp_endpoint,
            public_url,
            dashboard_url,
            registration_mode,
            log_format,
            write_linger,
            cache_ttl,
            response_cache,
            agent_token_ttl,
            circuit_failures,
            circuit_open,
            sentinel_interval,
            model_catalog: layer.model_catalog,
            service_urls,
            provider_base_urls,
            egress_proxy: EgressProxy { https: layer.https_proxy, http: layer.http_proxy, all: layer.all_proxy, no: layer.no_proxy },
        })
    }
}

/// A proxy for provider calls: `http://[user:password@]host:port` or `host:port` (the value itself
/// never appears in the error: it may hold a password).
fn check_proxy(setting: &str, value: &str) -> Result<(), ConfigError> {
    let uri: http::Uri = value.parse().map_err(|_| ConfigError::new(setting, "expected a proxy URL such as http://proxy:3128"))?;
    if uri.host().is_none() {
        return Err(ConfigError::new(setting, "expected a proxy URL such as http://proxy:3128"));
    }
    match uri.scheme_str() {
        None | Some("http") => Ok(()),
        Some(other) => Err(ConfigError::new(
            setting,
            format!("`{other}` proxies are not supported: use an http:// proxy (TLS to the provider runs inside its tunnel)"),
        )),
    }
}

fn parse_bool(setting: &str, value: &str) -> Result<bool, ConfigError> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(ConfigError::new(setting, format!("`{value}` is not a boolean (true or false)"))),
    }
}

/// `millis` as a duration when inside `range`, `default` when unset.
fn within_millis(
    setting: &str,
    millis: Option<u64>,
    range: &std::ops::RangeInclusive<u64>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match millis {
        None => Ok(default),
        Some(millis) if range.contains(&millis) => Ok(Duration::from_millis(millis)),
        Some(millis) => Err(ConfigError::new(setting, format!("{millis} is outside {}..={} ms", range.start(), range.end()))),
    }
}

fn parse_millis(setting: &str, value: &str) -> Result<u64, ConfigError> {
    value.parse().map_err(|_| ConfigError::new(setting, format!("`{value}` is not a number of milliseconds")))
}

fn parse_address(setting: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    value.parse().map_err(|_| ConfigError::new(setting, format!("`{value}` is not a socket address such as 127.0.0.1:8080")))
}

/// Headers that carry the caller's own credentials or frame the message: never a forwarded certificate.
const RESERVED_HEADERS: &[&str] = &["authorization", "x-api-key", "cookie", "host", "content-length", "content-type", "transfer-encoding"];

/// The forwarded-certificate settings: both or neither; a header name that is an HTTP token and
/// not a credential header; one or more comma-separated addresses or CIDR blocks.
fn forwarded_client_certificates(header: Option<&str>, proxies: Option<&str>) -> Result<Option<ForwardedClientCertificates>, ConfigError> {
    let (header, proxies) = match (header, proxies) {
        (None, None) => return Ok(None),
        (Some(header), Some(proxies)) => (header.trim().to_ascii_lowercase(), proxies),
        (Some(_), None) => {
            return Err(ConfigError::new(
                "BR_CLIENT_CERT_TRUSTED_PROXIES",
                "a forwarded client certificate header needs the proxies trusted to send it (addresses or CIDR blocks, comma-separated): from any other peer it would be a forgery".to_string(),
            ));
        }
        (None, Some(_)) => {
            return Err(ConfigError::new(
                "BR_CLIENT_CERT_HEADER",
                "trusted proxies are set without the header they forward client certificates in (x-forwarded-client-cert, ssl-client-cert, ...)".to_string(),
            ));
        }
    };
    let token = |byte: u8| byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte);
    if header.is_empty() || !header.bytes().all(token) || RESERVED_HEADERS.contains(&header.as_str()) {
        return Err(ConfigError::new(
            "BR_CLIENT_CERT_HEADER",
            format!("`{header}` is not a header a proxy can forward a client certificate in"),
        ));
    }
    let trusted_proxies = proxies
        .split(',')
        .map(str::trim)
        .filter(|proxy| !proxy.is_empty())
        .map(|proxy| {
            proxy
                .parse()
                .map_err(|error: crate::net::InvalidAddressRange| ConfigError::new("BR_CLIENT_CERT_TRUSTED_PROXIES", error.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if trusted_proxies.is_empty() {
        return Err(ConfigError::new("BR_CLIENT_CERT_TRUSTED_PROXIES", "names no proxy".to_string()));
    }
    Ok(Some(ForwardedClientCertificates { header, trusted_proxies }))
}

fn parse_http_url(setting: &str, value: &str) -> Result<String, ConfigError> {
    let valid = (value.starts_with("http://") || value.starts_with("https://")) && value.len() > "https://".len();
    if valid {
        Ok(value.trim_end_matches('/').to_string())
    } else {
        Err(ConfigError::new(setting, format!("`{value}` is not an http:// or https:// url")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect()
    }

    #[test]
    fn defaults_apply_when_nothing_is_set() -> Result<(), ConfigError> {
        let settings = Settings::resolve(ConfigLayer::default())?;
        assert_eq!(settings.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(settings.public_url, "http://127.0.0.1:8080");
        assert_eq!(settings.mail_outbox, PathBuf::from("brainstorm-data/outbox"));
        assert_eq!(settings.registration_mode, RegistrationMode::Open);
        assert!(!settings.require_agent_owner);
        Ok(())
    }

    #[test]
    fn forwarded_client_certificates_need_a_header_and_the_proxies_trusted_to_send_it() -> Result<(), ConfigError> {
        let resolve = |pairs: &[(&str, &str)]| Settings::resolve(ConfigLayer::from_env(&env(pairs))?);
        assert_eq!(resolve(&[])?.forwarded_client_certificates, None);
        let settings = resolve(&[
            ("BR_CLIENT_CERT_HEADER", "X-Forwarded-Client-Cert"),
            ("BR_CLIENT_CERT_TRUSTED_PROXIES", "10.0.0.0/8, fd00::/8,127.0.0.1"),
        ])?;
        let forwarded = settings.forwarded_client_certificates.unwrap_or_else(|| panic!("configured"));
        assert_eq!(forwarded.header, "x-forwarded-client-cert");
        let ranges: Vec<String> = forwarded.trusted_proxies.iter().map(ToString::to_string).collect();
        assert_eq!(ranges, ["10.0.0.0/8", "fd00::/8", "127.0.0.1/32"]);
        let refused = |pairs: &[(&str, &str)]| resolve(pairs).err().map(|error| error.setting);
        assert_eq!(refused(&[("BR_CLIENT_CERT_HEADER", "ssl-client-cert")]).as_deref(), Some("BR_CLIENT_CERT_TRUSTED_PROXIES"));
        assert_eq!(refused(&[("BR_CLIENT_CERT_TRUSTED_PROXIES", "10.0.0.1")]).as_deref(), Some("BR_CLIENT_CERT_HEADER"));
        for (header, proxies, setting) in [
            ("Authorization", "10.0.0.1", "BR_CLIENT_CERT_HEADER"),
            ("x-api-key", "10.0.0.1", "BR_CLIENT_CERT_HEADER"),
            ("bad header", "10.0.0.1", "BR_CLIENT_CERT_HEADER"),
            ("ssl-client-cert", "10.0.0.0/33", "BR_CLIENT_CERT_TRUSTED_PROXIES"),
            ("ssl-client-cert", "ingress.example", "BR_CLIENT_CERT_TRUSTED_PROXIES"),
            ("ssl-client-cert", " , ", "BR_CLIENT_CERT_TRUSTED_PROXIES"),
        ] {
            let pairs = [("BR_CLIENT_CERT_HEADER", header), ("BR_CLIENT_CERT_TRUSTED_PROXIES", proxies)];
            assert_eq!(refused(&pairs).as_deref(), Some(setting), "{header} {proxies}");
        }
        Ok(())
    }

    #[test]
    fn provider_calls_take_the_proxy_variables_curl_reads() -> Result<(), ConfigError> {
        let layer = ConfigLayer::from_env(&env(&[
            ("https_proxy", "http://agent:s3cret@proxy.internal:3128"),
            ("HTTP_PROXY", "proxy.internal:3128"),
            ("no_proxy", "localhost,.svc.cluster.local,10.0.0.0/8"),
        ]))?;
        let proxy = Settings::resolve(layer)?.egress_proxy;
        assert_eq!(proxy.https.as_ref().map(Secret::expose), Some("http://agent:s3cret@proxy.internal:3128"));
        assert_eq!(proxy.http.as_ref().map(Secret::expose), Some("proxy.internal:3128"));
        assert_eq!(proxy.all, None);
        assert_eq!(proxy.no.as_deref(), Some("localhost,.svc.cluster.local,10.0.0.0/8"));
        assert!(!format!("{proxy:?}").contains("s3cret"), "a proxy password never prints");

        let socks = ConfigLayer::from_env(&env(&[("ALL_PROXY", "socks5://agent:s3cret@proxy.internal:1080")]))?;
        let error = Settings::resolve(socks).err().unwrap_or_else(|| panic!("a socks proxy is refused"));
        assert_eq!(error.setting, "all_proxy (ALL_PROXY)");
        assert!(!error.message.contains("s3cret"), "{}", error.message);
        Ok(())
    }

    #[test]
    fn an_identity_provider_needs_its_issuer_and_one_key_source() -> Result<(), ConfigError> {
        let resolve = |pairs: &[(&str, &str)]| Settings::resolve(ConfigLayer::from_env(&env(pairs))?);
        assert_eq!(resolve(&[])?.idp, None);
        let from_file = resolve(&[("BR_IDP_ISSUER", "https://idp.example"), ("BR_IDP_JWKS_FILE", "/etc/jwks.json")])?;
        assert_eq!(from_file.idp.map(|idp| idp.jwks), Some(IdpJwks::File(PathBuf::from("/etc/jwks.json"))));
        for broken in [
            vec![("BR_IDP_ISSUER", "https://idp.example")],
            vec![("BR_IDP_JWKS_URL", "https://idp.example/jwks")],
            vec![("BR_IDP_ISSUER", "x"), ("BR_IDP_JWKS_URL", "https://idp.example/jwks"), ("BR_IDP_JWKS_FILE", "/etc/jwks.json")],
            vec![("BR_IDP_ISSUER", "x"), ("BR_IDP_JWKS_URL", "ftp://idp.example/jwks")],
        ] {
            assert!(resolve(&broken).is_err(), "{broken:?}");
        }
        Ok(())
    }

    #[test]
    fn flags_beat_environment_beat_file() -> Result<(), ConfigError> {
        let file = ConfigLayer::from_toml(
            "listen = \"127.0.0.1:1000\"\ngrpc_listen = \"127.0.0.1:1001\"\ndata_dir = \"/file\"\n",
            Path::new("x.toml"),
        )?;
        let environment = ConfigLayer::from_env(&env(&[("BR_LISTEN", "127.0.0.1:2000"), ("BR_DATA_DIR", "/env")]))?;
        let flags = ConfigLayer { listen: Some("127.0.0.1:3000".to_string()), ..ConfigLayer::default() };
        let settings = Settings::resolve(flags.over(environment.over(file)))?;
        assert_eq!(settings.listen.port(), 3000);
        assert_eq!(settings.data_dir, PathBuf::from("/env"));
        assert_eq!(settings.grpc_listen.port(), 1001);
        Ok(())
    }

    #[test]
    fn the_agent_token_ttl_defaults_and_is_bounded() -> Result<(), ConfigError> {
        assert_eq!(Settings::resolve(ConfigLayer::default())?.agent_token_ttl, DEFAULT_AGENT_TOKEN_TTL);
        let file = ConfigLayer::from_toml("agent_token_ttl_seconds = 600\n", Path::new("x.toml"))?;
        assert_eq!(Settings::resolve(file)?.agent_token_ttl, Duration::from_secs(600));
        for refused in ["59", "86401", "soon"] {
            let layer = ConfigLayer::from_env(&env(&[("BR_AGENT_TOKEN_TTL_SECONDS", refused)]));
            let refused_somewhere =
                layer.and_then(Settings::resolve).is_err_and(|error| error.to_string().contains("agent_token_ttl_seconds"));
            assert!(refused_somewhere, "{refused}");
        }
        Ok(())
    }

    #[test]
    fn the_response_cache_defaults_on_and_is_bounded() -> Result<(), ConfigError> {
        let defaults = Settings::resolve(ConfigLayer::default())?.response_cache;
        assert_eq!(defaults, ResponseCacheSettings { ttl: DEFAULT_RESPONSE_CACHE_TTL, max_bytes: DEFAULT_RESPONSE_CACHE_BYTES });
        let file = ConfigLayer::from_toml("response_cache_ttl_ms = 5000\nresponse_cache_max_bytes = 0\n", Path::new("x.toml"))?;
        let off = Settings::resolve(file.clone())?.response_cache;
        assert_eq!(off, ResponseCacheSettings { ttl: Duration::from_secs(5), max_bytes: 0 });
        let environment = ConfigLayer::from_env(&env(&[("BR_RESPONSE_CACHE_MAX_BYTES", "1048576")]))?;
        assert_eq!(Settings::resolve(environment.over(file))?.response_cache.max_bytes, 1_048_576);
        for (name, value) in
            [("BR_RESPONSE_CACHE_TTL_MS", "0"), ("BR_RESPONSE_CACHE_TTL_MS", "86400001"), ("BR_RESPONSE_CACHE_MAX_BYTES", "17179869185")]
        {
            let layer = ConfigLayer::from_env(&env(&[(name, value)]))?;
            assert!(Settings::resolve(layer).is_err_and(|error| error.to_string().contains("response_cache")), "{name}={value}");
        }
        assert!(ConfigLayer::from_env(&env(&[("BR_RESPONSE_CACHE_MAX_BYTES", "lots")])).is_err());
        Ok(())
    }

    #[test]
    fn the_cache_ttl_defaults_and_is_bounded() -> Result<(), ConfigError> {
        assert_eq!(Settings::resolve(ConfigLayer::default())?.cache_ttl, DEFAULT_CACHE_TTL);
        let file = ConfigLayer::from_toml("cache_ttl_ms = 1500\n", Path::new("x.toml"))?;
        assert_eq!(Settings::resolve(file.clone())?.cache_ttl, Duration::from_millis(1500));
        let environment = ConfigLayer::from_env(&env(&[("BR_CACHE_TTL_MS", "0")]))?;
        assert_eq!(Settings::resolve(environment.over(file))?.cache_ttl, Duration::ZERO);
        let too_long = ConfigLayer::from_env(&env(&[("BR_CACHE_TTL_MS", "3600001")]))?;
        assert!(Settings::resolve(too_long).is_err_and(|error| error.to_string().contains("cache_ttl_ms")));
        Ok(())
    }

    #[test]
    fn the_write_linger_defaults_and_can_be_set_from_file_or_environment() -> Result<(), ConfigError> {
        assert_eq!(Settings::resolve(ConfigLayer::default())?.write_linger, crate::bus::DEFAULT_WRITE_LINGER);
        let file = ConfigLayer::from_toml("write_linger_ms = 250\n", Path::new("x.toml"))?;
        assert_eq!(Settings::resolve(file.clone())?.write_linger, Duration::from_millis(250));
        let environment = ConfigLayer::from_env(&env(&[("BR_WRITE_LINGER_MS", "0")]))?;
        assert_eq!(Settings::resolve(environment.over(file))?.write_linger, Duration::ZERO);
        Ok(())
    }

    #[test]
    fn service_and_provider_urls_come_from_the_environment() -> Result<(), ConfigError> {
        let layer = ConfigLayer::from_env(&env(&[
            ("BR_IDENTITY_URL", "http://127.0.0.1:50051/"),
            ("BR_BUDGET_LEDGER_URL", "http://10.0.0.2:50051"),
            ("BR_PROVIDER_AZURE_OPENAI_BASE_URL", "http://127.0.0.1:9100/v1"),
        ]))?;
        let settings = Settings::resolve(layer)?;
        assert_eq!(settings.service_urls.get(&ServiceName::Identity).map(String::as_str), Some("http://127.0.0.1:50051"));
        assert_eq!(settings.service_urls.get(&ServiceName::BudgetLedger).map(String::as_str), Some("http://10.0.0.2:50051"));
        assert_eq!(settings.provider_base_urls.get("azure-openai").map(String::as_str), Some("http://127.0.0.1:9100/v1"));
        Ok(())
    }

    #[test]
    fn a_bad_value_names_its_setting() {
        let cases: [(&str, &str, &str); 8] = [
            ("BR_LISTEN", "nonsense", "listen"),
            ("BR_WRITE_LINGER_MS", "soon", "write_linger_ms"),
            ("BR_WRITE_LINGER_MS", "10001", "write_linger_ms"),
            ("BR_REQUIRE_AGENT_OWNER", "maybe", "BR_REQUIRE_AGENT_OWNER"),
            ("BR_DATABASE_URL", "mysql://x", "database_url"),
            ("BR_MASTER_KEY", "short", "master_key"),
            ("BR_IDENTITY_URL", "127.0.0.1:50051", "BR_IDENTITY_URL"),
            ("BR_REGISTRATION_MODE", "closed", "registration_mode"),
        ];
        for (variable, value, expected_setting) in cases {
            let result = ConfigLayer::from_env(&env(&[(variable, value)])).and_then(Settings::resolve);
            match result {
                Err(error) => assert!(error.setting.contains(expected_setting), "{variable}: {error}"),
                Ok(_) => unreachable!("{variable}={value} must be rejected"),
            }
        }
    }

    #[test]
    fn unknown_file_keys_are_rejected_and_secrets_never_print() {
        let error = ConfigLayer::from_toml("lisen = \"x\"", Path::new("brainstorm.toml")).err();
        assert!(error.is_some_and(|error| error.to_string().contains("brainstorm.toml")));
        let secret = Secret::new("br_live_supersecret");
        assert!(!format!("{secret:?}").contains("supersecret"));
    }
}
