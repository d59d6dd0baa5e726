//! The public REST edge: authentication, RBAC, the identity, vault and admin endpoints, and the
//! completion pipeline in the OpenAI and Anthropic formats. Handlers stay thin: extract, call a
//! service client, map the error.

mod activity;
mod agent_loop;
mod auth;
mod budget_cache;
mod circuits;
mod extract;
mod forwarded_certificate;
mod header_value;
mod idp;
mod learned;
mod liaison;
mod mesh;
mod pipeline;
mod reply_guard;
mod request_span;
mod response_cache;
mod routes;
mod routing_cache;
mod sandbox;
mod self_view;
mod sentinel;
mod views;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{Method, Uri};
use axum::routing::{delete, get, patch, post, put};
use brainstorm_audit_lineage::AuditPublisher;
use brainstorm_budget_ledger::BudgetGuard;
use brainstorm_common::ApiError;
use brainstorm_common::bus::EventBus;
use brainstorm_common::config::Secret;
use brainstorm_policy_firewall::Guardian;
use brainstorm_proto::audit::AuditLineageClient;
use brainstorm_proto::budget::BudgetLedgerClient;
use brainstorm_proto::catalog::CatalogClient;
use brainstorm_proto::identity::IdentityClient;
use brainstorm_proto::mcp::McpGatewayClient;
use brainstorm_proto::observability::ObservabilityFanoutClient;
use brainstorm_proto::policy::PolicyFirewallClient;
use brainstorm_proto::prompts::PromptsEvalClient;
use brainstorm_providers::catalog::ModelCatalog;
use brainstorm_providers::upstream::UpstreamClient;

pub use auth::{Authenticator, ClientCertificate};
pub use circuits::CircuitOptions;
pub use routing_cache::RoutingCache;

/// Largest request body accepted (long prompts and tool schemas fit comfortably).
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// How the edge is set up.
#[derive(Debug, Clone)]
pub struct EdgeOptions {
    pub platform_admin_key: Option<Secret>,
    /// How long a resolved key or a tenant's routing configuration is trusted without asking again.
    pub cache_ttl: Duration,
    /// The response cache's TTL and size (`response_cache_max_bytes` 0 turns it off).
    pub response_cache: brainstorm_common::config::ResponseCacheSettings,
    /// `BR_PROVIDER_<ID>_BASE_URL` overrides, by provider id.
    pub base_urls: BTreeMap<String, String>,
    /// One span per request, for trace export (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub trace_requests: bool,
    /// When models' circuits open and for how long.
    pub circuits: CircuitOptions,
    /// How often the sentinel probes the providers it watches.
    pub sentinel_interval: Duration,
    /// Whether the platform administrator may push XDR risk scores (`BR_XDR_BIDIRECTIONAL`).
    pub xdr_bidirectional: bool,
    /// Whether this edge serves HTTPS and so accepts agent client certificates (`BR_TLS_CERT_FILE`).
    pub serves_tls: bool,
    /// Agent client certificates a trusted TLS-terminating proxy forwards in a header; the
    /// listener must then put each connection's `ConnectInfo<SocketAddr>` on its requests.
    pub forwarded_certificates: Option<brainstorm_common::config::ForwardedClientCertificates>,
    /// The identity provider the `/auth/*` bridge routes verify JWTs of; None answers them 503.
    pub idp: Option<brainstorm_common::config::IdpSettings>,
    /// Where browser-facing links point (`BR_DASHBOARD_URL`): the device flow's verification page.
    pub dashboard_url: String,
    /// `true` once the process is stopping: long-lived streams of the edge's own (a liaison's
    /// events) end then, so they never hold a graceful stop.
    pub stopping: tokio::sync::watch::Receiver<bool>,
}

/// The services and data the edge works with.
#[derive(Clone)]
pub struct EdgeDependencies {
    pub identity: IdentityClient,
    pub catalog: CatalogClient,
    pub upstream: UpstreamClient,
    pub models: Arc<ModelCatalog>,
    pub budget: BudgetLedgerClient,
    /// Budget counters and rate limits (in process, or shared through Redis).
    pub guard: Arc<BudgetGuard>,
    pub audit: AuditLineageClient,
    /// Queues every request's audit record for the bus, off the request path.
    pub audit_publisher: AuditPublisher,
    pub policy: PolicyFirewallClient,
    /// Kill switches, guardrails and the tool firewall held in memory for the hot path.
    pub guardian: Arc<Guardian>,
    /// The MCP gateway; None answers `/v1/mcp/*` with 503 (the edge needs no MCP to route completions).
    pub mcp: Option<McpGatewayClient>,
    /// Prompts and evaluations; None answers `/v1/prompts/*` with 503.
    pub prompts: Option<PromptsEvalClient>,
    /// Observability destinations and XDR connectors; None answers `/v1/observability/*` with 503.
    pub observability: Option<ObservabilityFanoutClient>,
}

/// Everything a handler can reach: one shared allocation, so the per-request clones axum makes of
/// the state are one reference count each.
#[derive(Clone)]
pub struct EdgeState {
    shared: Arc<EdgeShared>,
}

impl std::ops::Deref for EdgeState {
    type Target = EdgeShared;

    fn deref(&self) -> &EdgeShared {
        &self.shared
    }
}

/// The services, caches and clients behind [`EdgeState`].
pub struct EdgeShared {
    identity: IdentityClient,
    catalog: CatalogClient,
    authenticator: Arc<Authenticator>,
    routing: Arc<RoutingCache>,
    upstream: UpstreamClient,
    models: Arc<ModelCatalog>,
    base_urls: Arc<BTreeMap<String, String>>,
    budget: BudgetLedgerClient,
    budget_settings: Arc<budget_cache::BudgetSettingsCache>,
    /// What each tenant's traffic taught routing (the default `quality` strategy's rewards).
    learned: Arc<learned::LearnedRouting>,
    guard: Arc<BudgetGuard>,
    audit: AuditLineageClient,
    audit_publisher: AuditPublisher,
    policy: PolicyFirewallClient,
    guardian: Arc<Guardian>,
    /// None when the edge runs without the mcp-gateway service (`/v1/mcp/*` then answers 503).
    mcp: Option<McpGatewayClient>,
    /// None when the edge runs without the prompts-eval service (`/v1/prompts/*` then answers 503).
    prompts: Option<PromptsEvalClient>,
    /// None when the edge runs without the observability-fanout service (`/v1/observability/*` then answers 503).
    observability: Option<ObservabilityFanoutClient>,
    /// Every model's circuit breaker, in this edge's memory.
    circuits: circuits::CircuitBreakers,
    /// Non-streamed replies kept for repeats of their requests; None when turned off.
    response_cache: Option<response_cache::ResponseCache>,
    /// Probes of the providers' APIs.
    sentinel: Arc<sentinel::Sentinel>,
    /// `GET /v1/self`'s tenant parts, kept 30 s.
    tenant_views: self_view::TenantViews,
    /// The last errors answered to each API key and agent.
    recent_errors: self_view::RecentErrors,
    /// Whether `/v1/admin/xdr/risk-push` is on.
    xdr_bidirectional: bool,
    /// Whether this edge serves HTTPS.
    serves_tls: bool,
    /// The header trusted proxies forward agent client certificates in, when configured.
    forwarded_certificate_header: Option<String>,
    /// Verifies identity-provider JWTs for the `/auth/*` bridge routes, when one is configured.
    idp: Option<idp::IdpVerifier>,
    dashboard_url: String,
    stopping: tokio::sync::watch::Receiver<bool>,
    /// When this edge was built (its uptime in `/v1/ops/status`).
    started: std::time::Instant,
}

/// The edge: its router, and the caches the bus keeps fresh.
pub struct Edge {
    pub router: Router,
    authenticator: Arc<Authenticator>,
    routing: Arc<RoutingCache>,
    guardian: Arc<Guardian>,
}

impl Edge {
    /// Builds the edge.
    pub fn new(dependencies: EdgeDependencies, options: &EdgeOptions) -> Edge {
        let authenticator =
            Arc::new(Authenticator::new(dependencies.identity.clone(), options.platform_admin_key.as_ref(), options.cache_ttl));
        let routing = Arc::new(RoutingCache::new(dependencies.catalog.clone(), options.cache_ttl));
        let base_urls = Arc::new(options.base_urls.clone());
        let learned = Arc::new(learned::LearnedRouting::new(dependencies.budget.clone(), dependencies.models.clone(), options.cache_ttl));
        let shared = EdgeShared {
            identity: dependencies.identity,
            catalog: dependencies.catalog,
            authenticator: authenticator.clone(),
            routing: routing.clone(),
            upstream: dependencies.upstream,
            models: dependencies.models,
            sentinel: sentinel::Sentinel::spawn(base_urls.clone(), options.sentinel_interval),
            circuits: circuits::CircuitBreakers::new(options.circuits),
            response_cache: response_cache::ResponseCache::new(options.response_cache),
            tenant_views: self_view::TenantViews::default(),
            recent_errors: self_view::RecentErrors::default(),
            xdr_bidirectional: options.xdr_bidirectional,
            serves_tls: options.serves_tls,
            forwarded_certificate_header: options.forwarded_certificates.as_ref().map(|forwarded| forwarded.header.clone()),
            idp: options.idp.clone().map(idp::IdpVerifier::new),
            dashboard_url: options.dashboard_url.clone(),
            stopping: options.stopping.clone(),
            started: std::time::Instant::now(),
            base_urls,
            budget_settings: Arc::new(budget_cache::BudgetSettingsCache::new(dependencies.budget.clone(), options.cache_ttl)),
            learned,
            budget: dependencies.budget,
            guard: dependencies.guard,
            audit: dependencies.audit,
            audit_publisher: dependencies.audit_publisher,
            policy: dependencies.policy,
            guardian: dependencies.guardian.clone(),
            mcp: dependencies.mcp,
            prompts: dependencies.prompts,
            observability: dependencies.observability,
        };
        let state = EdgeState { shared: Arc::new(shared) };
        let forwarding =
            options.forwarded_certificates.as_ref().map(|settings| Arc::new(forwarded_certificate::CertificateForwarding::new(settings)));
        Edge { router: router(state, options.trace_requests, forwarding), authenticator, routing, guardian: dependencies.guardian }
    }

    /// Follows identity and catalog changes on the bus (runs until the bus closes).
    pub async fn follow_bus(&self, bus: Arc<dyn EventBus>, group: &str) {
        // Every edge process must see every event (they invalidate its own caches): a consumer group
        // of its own.
        let group = format!("{group}-{}", uuid::Uuid::new_v4().simple());
        tokio::join!(
            self.authenticator.clone().follow_identity_events(bus.clone(), group.clone()),
            self.routing.clone().follow_catalog_events(bus.clone(), group.clone()),
            self.guardian.clone().follow_events(bus, group),
        );
    }
}

fn router(state: EdgeState, trace_requests: bool, forwarding: Option<Arc<forwarded_certificate::CertificateForwarding>>) -> Router {
    use routes::{
        admin, agent_certificates, agent_limits, agent_self, agents, bridge, budget, capabilities, completions, config, datasets,
        governance, guardian, identity, insights, leaderboard, liaison, mcp, mcp_connect, memory, oauth, observability, ops, prompts,
        provider_health, providers, usage,
    };
    let routes = Router::new()
        .route("/health", get(routes::health))
        .route("/openapi.json", get(routes::openapi))
        .route("/v1/capabilities", get(capabilities::list))
        .route("/v1/capabilities/{id}/describe", get(capabilities::describe))
        .route("/v1/register", post(identity::register))
        .route("/v1/account", get(identity::get_account).patch(identity::update_account))
        .route("/v1/account/graduation", get(identity::graduation))
        .route("/v1/account/graduate", post(identity::graduate))
        .route("/v1/account/verify-email", post(identity::verify_email))
        .route("/v1/account/verify-email/confirm", post(identity::confirm_email))
        .route("/v1/account/users", get(identity::list_users))
        .route("/v1/account/users/invite", post(identity::invite_user))
        .route("/v1/account/users/{id}", delete(identity::delete_user))
        .route("/v1/tenant/claim-link", post(identity::create_claim_link))
        .route("/v1/api-keys", post(identity::create_api_key).get(identity::list_api_keys))
        .route("/v1/api-keys/{id}", delete(identity::revoke_api_key))
        .route("/v1/admin/tenants", get(admin::list_tenants))
        .route("/v1/admin/tenants/{id}", get(admin::get_tenant))
        .route("/v1/admin/tenants/{id}/approve", post(admin::approve_tenant))
        .route("/v1/admin/tenants/{id}/reject", post(admin::reject_tenant))
        .route("/v1/admin/invite-codes", post(admin::create_invite_code).get(admin::list_invite_codes))
        .route("/v1/admin/invite-codes/{id}", delete(admin::delete_invite_code))
        .route("/v1/admin/digest", get(admin::digest))
        .route("/v1/admin/xdr/risk-push", post(admin::push_risk).delete(admin::clear_risk))
        .route("/v1/oauth/apps", post(oauth::create_app).get(oauth::list_apps))
        .route("/v1/oauth/apps/{id}", delete(oauth::delete_app))
        .route("/auth/oauth/authorize", get(oauth::authorize_view).post(oauth::authorize))
        .route("/auth/oauth/token", post(oauth::token))
        .route("/v1/auth/device/authorize", post(bridge::device_authorize))
        .route("/v1/auth/device/token", post(bridge::device_token))
        .route("/v1/auth/link", post(bridge::link))
        .route("/auth/claim", post(bridge::claim))
        .route("/auth/provision", post(bridge::provision))
        .route("/auth/me", get(bridge::me))
        .route("/auth/device/confirm", post(bridge::device_confirm))
        .route("/auth/budget/status", get(bridge::budget_mirror::status))
        .route("/auth/budget/forecast", get(bridge::budget_mirror::forecast))
        .route("/auth/budget/agents", get(bridge::budget_mirror::agents))
        .route("/auth/budget/agents/{agent_id}", put(bridge::budget_mirror::put_agent))
        .route("/auth/budget/alerts/config", get(bridge::budget_mirror::get_alert_config).put(bridge::budget_mirror::put_alert_config))
        .route("/auth/budget/alerts/history", get(bridge::budget_mirror::alert_history))
        .route("/auth/killswitch/status", get(bridge::guardian_mirror::kill_switch_status))
        .route("/auth/firewall/interceptions", get(bridge::guardian_mirror::interceptions))
        .route("/v1/liaison/open", post(liaison::open))
        .route("/v1/liaison/{liaison_id}", get(liaison::get))
        .route("/v1/liaison/{liaison_id}/plan", post(liaison::plan))
        .route("/v1/liaison/{liaison_id}/events", get(liaison::events))
        .route("/v1/liaison/{liaison_id}/close", post(liaison::close))
        .route("/v1/providers/catalog", get(providers::catalog))
        .route("/v1/providers/test", post(providers::test_key))
        .route("/v1/providers", post(providers::register_key).get(providers::list_keys))
        .route("/v1/providers/{id}", delete(providers::deactivate_key))
        .route("/v1/aliases", get(providers::get_aliases).put(providers::put_aliases))
        .route("/v1/presets", post(providers::create_preset).get(providers::list_presets))
        .route("/v1/presets/{slug}", get(providers::get_preset).put(providers::replace_preset).delete(providers::delete_preset))
        .route("/v1/budget/status", get(budget::status))
        .route("/v1/budget/limits", put(budget::set_limits))
        .route("/v1/budget/forecast", get(budget::forecast))
        .route("/v1/budget/agents", get(budget::agents))
        .route("/v1/budget/agents/{agent_id}", put(budget::put_agent))
        .route("/v1/budget/alerts/config", get(budget::get_alert_config).put(budget::put_alert_config))
        .route("/v1/budget/alerts/history", get(budget::alert_history))
        .route("/v1/usage/summary", get(budget::usage_summary))
        .route("/v1/usage/requests", get(usage::requests))
        .route("/v1/usage/export", get(usage::export))
        .route("/v1/insights/cost", get(insights::cost))
        .route("/v1/insights/reliability", get(insights::reliability))
        .route("/v1/killswitch/activate", post(guardian::activate))
        .route("/v1/killswitch/deactivate", post(guardian::deactivate))
        .route("/v1/killswitch/status", get(guardian::status))
        .route("/v1/killswitch/scope", post(guardian::activate_scope))
        .route("/v1/killswitch/scopes", get(guardian::scopes))
        .route("/v1/killswitch/scope/{kind}/{id}", delete(guardian::deactivate_scope))
        .route("/v1/guardrails/config", get(guardian::guardrails_config).put(guardian::put_guardrails_config))
        .route("/v1/guardrails/test", post(guardian::test_guardrails))
        .route("/v1/security/policies", get(guardian::get_policies).put(guardian::put_policies))
        .route("/v1/security/policies/test", post(guardian::test_policy))
        .route("/v1/security/policies/presets", get(guardian::policy_presets))
        .route("/v1/security/status", get(guardian::security_status))
        .route("/v1/security/anomalies", get(guardian::anomalies))
        .route("/v1/governance/policy/dry-run", post(guardian::dry_run))
        .route("/v1/firewall/interceptions", get(guardian::interceptions))
        .route("/v1/firewall/config", get(guardian::firewall_config).put(guardian::put_firewall_config))
        .route("/v1/guardrails/providers", get(guardian::guardrail_providers).post(guardian::register_guardrail_provider))
        .route("/v1/guardrails/providers/{id}", delete(guardian::delete_guardrail_provider))
        .route("/v1/guardrails/templates", get(guardian::guardrail_templates))
        .route("/v1/security/anomalies/baselines", get(guardian::export_baselines).post(guardian::import_baselines))
        .route("/v1/security/anomalies/stats/{entity_type}/{entity_id}/{metric}", get(guardian::anomaly_stats))
        .route("/v1/approvals/pending", get(guardian::pending_approvals))
        .route("/v1/approvals/{id}", get(guardian::get_approval))
        .route("/v1/approvals/{id}/approve", post(guardian::approve))
        .route("/v1/approvals/{id}/deny", post(guardian::deny))
        .route("/v1/governance/audit/chain/verify", get(governance::verify_chain))
        .route("/v1/governance/audit/chain/export", get(governance::export_chain))
        .route("/v1/governance/lineage", get(governance::episode))
        .route("/v1/governance/lineage/{request_id}", get(governance::lineage))
        .route("/v1/governance/artifacts/{request_id}", get(governance::artifact))
        .route("/v1/governance/artifact-key", get(governance::artifact_key))
        .route("/v1/governance/agents/inventory", get(governance::inventory))
        .route("/v1/explain/{request_id}", get(governance::explain))
        .route("/v1/replays/decisions", get(governance::decisions))
        .route("/v1/replays/simulate", post(governance::simulate))
        .route("/v1/replays/compare", get(governance::compare))
        .route("/v1/agent/bootstrap", post(agent_self::bootstrap))
        .route("/v1/agent/status", get(agent_self::status))
        .route("/v1/agent/limits/me", get(agent_self::my_limits))
        .route("/v1/agent/anomaly/me", get(agent_self::my_anomalies))
        .route("/v1/agent/profiles/me", get(agent_self::my_profile))
        .route("/v1/agent/auth/cert", post(agent_self::exchange_certificate).get(agent_certificates::mine))
        .route("/v1/agent/auth/cert/{serial}/revoke", post(agent_certificates::revoke_mine))
        .route("/v1/agent/certificates", get(agent_certificates::list))
        .route("/v1/agent/certificates/{serial}/revoke", post(agent_certificates::revoke))
        .route("/v1/agent/delegate", post(agent_self::delegate))
        .route("/v1/agent/sub-agents", get(agent_self::sub_agents))
        .route("/v1/agent/sub-agents/{child_agent_id}", delete(agent_self::end_sub_agent))
        .route("/v1/self", get(agent_self::whoami))
        .route("/v1/config", get(config::get))
        .route("/v1/ops/status", get(ops::status))
        .route("/v1/agent-limits", get(agent_limits::get).put(agent_limits::put).patch(agent_limits::patch))
        .route("/v1/agent/profiles", get(agents::list).post(agents::create))
        .route("/v1/agent/profiles/{agent_id}", get(agents::get).patch(agents::update).delete(agents::delete))
        .route("/v1/agent/profiles/lifecycle/{agent_id}", patch(agents::lifecycle))
        .route("/v1/mcp/servers", post(mcp::register).get(mcp::list))
        .route("/v1/mcp/servers/{id}", get(mcp::get).put(mcp::update).delete(mcp::delete))
        .route("/v1/mcp/servers/{id}/discover", post(mcp::discover))
        .route("/v1/mcp/tools", get(mcp::tools))
        .route("/v1/mcp/tools/{server}/{tool}", post(mcp::call))
        .route("/v1/mcp/audit", get(mcp::audit))
        .route("/v1/mcp/governance", get(mcp::governance))
        .route("/v1/mcp/governance/policy", put(mcp::put_policy))
        .route("/v1/mcp/approvals", get(mcp::approvals))
        .route("/v1/mcp/approvals/{id}/approve", post(mcp::approve))
        .route("/v1/mcp/approvals/{id}/deny", post(mcp::deny))
        .route("/v1/mcp/connect", get(mcp_connect::describe).post(mcp_connect::connect).delete(mcp_connect::end_session))
        .route("/v1/prompts", post(prompts::create).get(prompts::list))
        .route("/v1/prompts/{id}", get(prompts::get).put(prompts::update).delete(prompts::archive))
        .route("/v1/prompts/{id}/promote", post(prompts::promote))
        .route("/v1/prompts/{id}/test", post(prompts::test))
        .route("/v1/prompts/{id}/ab", post(prompts::set_ab).get(prompts::get_ab))
        .route("/v1/prompts/{id}/evaluate", post(prompts::evaluate))
        .route("/v1/prompts/{id}/evaluate/results", get(prompts::results))
        .route("/v1/prompts/{id}/evaluate/results/{run_id}/export", get(prompts::export))
        .route("/v1/eval/datasets", post(datasets::create).get(datasets::list))
        .route("/v1/eval/datasets/{id}", get(datasets::get).put(datasets::update).delete(datasets::delete))
        .route("/v1/eval/datasets/{id}/items", post(datasets::add_items).get(datasets::items))
        .route("/v1/eval/datasets/{id}/items/{item_id}", delete(datasets::delete_item))
        .route("/v1/eval/datasets/{id}/import-from-logs", post(datasets::import_from_logs))
        .route("/v1/eval/datasets/{id}/export", get(datasets::export))
        .route("/v1/memory/blocks", get(memory::blocks))
        .route("/v1/memory/blocks/{block}", get(memory::block))
        .route("/v1/memory/entries", get(memory::entries).post(memory::add))
        .route("/v1/memory/entries/{id}", put(memory::update).delete(memory::delete))
        .route("/v1/memory/init", post(memory::init))
        .route("/v1/governance/memory/audit", get(memory::audit))
        .route("/v1/governance/memory/stats", get(memory::stats))
        .route("/v1/governance/memory/compliance", get(memory::compliance))
        .route("/v1/governance/summary", get(memory::summary))
        .route("/v1/governance/sleep-time/report", get(memory::sleep_time_report))
        .route("/v1/observability/destinations", get(observability::list_destinations).post(observability::create_destination))
        .route("/v1/observability/destinations/{id}", put(observability::update_destination).delete(observability::delete_destination))
        .route("/v1/observability/test/{id}", post(observability::test_destination))
        .route("/v1/observability/config", get(observability::get_config).put(observability::put_config))
        .route("/v1/observability/templates", get(observability::templates))
        .route("/v1/observability/templates/{provider}", get(observability::template))
        .route("/v1/observability/xdr/destinations", get(observability::list_xdr).post(observability::create_xdr))
        .route("/v1/observability/xdr/destinations/{id}", put(observability::update_xdr).delete(observability::delete_xdr))
        .route("/v1/observability/xdr/destinations/{id}/test", post(observability::test_xdr))
        .route("/v1/observability/xdr/destinations/{id}/stats", get(observability::xdr_stats))
        .route("/v1/observability/xdr/destinations/{id}/enable", post(observability::enable_xdr))
        .route("/v1/chat/completions", post(completions::chat_completions))
        .route("/v1/messages", post(completions::messages))
        .route("/v1/messages/count_tokens", post(completions::count_tokens))
        .route("/v1/embeddings", post(completions::embeddings))
        .route("/v1/models", get(completions::list_models))
        .route("/v1/health/providers", get(provider_health::providers))
        .route("/v1/models/leaderboard", get(leaderboard::leaderboard))
        .route("/v1/models/{*model}", get(completions::retrieve_model))
        .route("/v1/catalog/runnable", get(completions::runnable))
        .fallback(route_not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES));
    let routes = if trace_requests { routes.layer(axum::middleware::from_fn(request_span::trace_request)) } else { routes };
    let routes = match forwarding {
        Some(forwarding) => routes.layer(axum::middleware::from_fn_with_state(forwarding, forwarded_certificate::apply)),
        None => routes,
    };
    routes.layer(extract::RequestIdLayer).with_state(state)
}

async fn route_not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::route_not_found(method.as_str(), uri.path())
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}
