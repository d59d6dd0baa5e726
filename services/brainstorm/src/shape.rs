//! Wiring of the two shapes: the same service code, handed different plumbing.
//!
//! `up` gives every service a local client, the embedded SQLite store and the in-process bus.
//! `serve` hosts the named services (with their gRPC server) and reaches the others over gRPC at
//! `BR_<SERVICE>_URL`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use axum::Router;
use axum::routing::get;
use axum::serve::{ListenerExt, TapIo};
use brainstorm_audit_lineage::{
    ArtifactSigner, AuditLineageOptions, AuditLineageServiceImpl, AuditPublisher, PublisherOptions, spawn_audit_consumer,
};
use brainstorm_budget_ledger::{BudgetGuard, BudgetLedgerOptions, BudgetLedgerServiceImpl, spawn_settlement_consumer};
use brainstorm_catalog::{CatalogOptions, CatalogServiceImpl};
use brainstorm_common::bus::{Batching, EventBus, InProcessBus, consume, select_broadcast_bus, select_bus};
use brainstorm_common::config::{ServiceName, Settings};
use brainstorm_common::outbox::MailOutbox;
use brainstorm_common::store::Database;
use brainstorm_edge_router::{CircuitOptions, Edge, EdgeDependencies, EdgeOptions};
use brainstorm_identity::{AgentCertificateAuthority, AgentTokenSigner, IdentityOptions, IdentityServiceImpl};
use brainstorm_mcp_gateway::{McpGatewayOptions, McpGatewayServiceImpl};
use brainstorm_observability_fanout::{ObservabilityFanoutServiceImpl, spawn_fanout_consumers};
use brainstorm_policy_firewall::{AnomalyConsumer, Guardian, GuardianOptions, PolicyFirewallOptions, PolicyFirewallServiceImpl};
use brainstorm_prompts_eval::PromptsEvalServiceImpl;
use brainstorm_proto::audit::{self, AuditLineageClient};
use brainstorm_proto::budget::{self, BudgetLedgerClient, CurrentTotalsRequest};
use brainstorm_proto::catalog::CatalogClient;
use brainstorm_proto::identity::IdentityClient;
use brainstorm_proto::mcp::McpGatewayClient;
use brainstorm_proto::observability::{FanoutEvents, ObservabilityFanoutClient};
use brainstorm_proto::policy::PolicyFirewallClient;
use brainstorm_proto::prompts::PromptsEvalClient;
use brainstorm_providers::catalog::ModelCatalog;
use brainstorm_providers::upstream::UpstreamClient;
use brainstorm_providers::vault::MasterKey;
use tokio::sync::watch;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint};

use crate::shutdown::Shutdown;
use crate::writer_thread::WriterThread;

/// Services this build can host.
const HOSTABLE: [ServiceName; 9] = [
    ServiceName::EdgeRouter,
    ServiceName::Identity,
    ServiceName::CatalogHealthSentinel,
    ServiceName::BudgetLedger,
    ServiceName::AuditLineage,
    ServiceName::PolicyFirewall,
    ServiceName::McpGateway,
    ServiceName::PromptsEval,
    ServiceName::ObservabilityFanout,
];

/// How long one operation on a registered MCP server (a whole session) may take.
const MCP_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// At a graceful stop, how long the audit publisher may take to hand its buffer to the bus, and the
/// chain and ledger writers to write what waits there.
const FINISH_PUBLISHING: Duration = Duration::from_secs(5);
const FINISH_WRITING: Duration = Duration::from_secs(15);

/// The file holding embedded mode's generated master key.
const MASTER_KEY_FILE: &str = "master.key";

/// `brainstorm up`: every service in this process.
pub async fn up(settings: Settings) -> anyhow::Result<()> {
    let database = match &settings.database_url {
        Some(url) => Database::connect(url.expose()).await?,
        None => Database::open_embedded(&settings.data_dir)
            .await
            .with_context(|| format!("cannot open the data dir {}", settings.data_dir.display()))?,
    };
    database.migrate().await?;
    let bus: Arc<dyn EventBus> = Arc::new(InProcessBus::new());
    let upstream = UpstreamClient::new(&settings.egress_proxy)?;
    let master_key = match &settings.master_key {
        Some(key) => MasterKey::from_hex(key.expose())?,
        None => embedded_master_key(&settings).await?,
    };
    let identity = IdentityClient::local(identity_service(&settings, database.clone(), bus.clone(), Some(&master_key))?);
    let catalog = CatalogClient::local(catalog_service(&settings, database.clone(), bus.clone(), upstream.clone(), master_key.clone()));
    let mcp = McpGatewayClient::local(mcp_service(&settings, database.clone(), master_key.clone()));
    let prompts = PromptsEvalClient::local(PromptsEvalServiceImpl::new(database.clone()));
    let shutdown = Shutdown::on_signals();
    let audit_service = audit_service(database.clone(), &master_key)?;
    // The chain and the ledger stop after the edge (see `finish_writes`), not at the signal, and run
    // on a thread of their own (see `WriterThread`).
    let (stop_writers, writers_stop) = Shutdown::requested_by_hand();
    let writer_thread = WriterThread::start()?;
    let writers_runtime = writer_thread.runtime();
    let chain =
        spawn_audit_consumer(writers_runtime, &bus, audit_service.clone(), settings.write_linger, writers_stop.clone().requested()).await?;
    let audit = AuditLineageClient::local(audit_service);
    let (audit_publisher, _publishing) = AuditPublisher::spawn(bus.clone(), PublisherOptions::default());
    let policy =
        PolicyFirewallClient::local(policy_service(database.clone(), bus.clone(), Some(master_key.clone()), &settings, &shutdown).await?);
    // The fan-out reads the settlements and audit records off the bus as their owners do, on the
    // writers' thread too, and stops with them.
    let fanout = ObservabilityFanoutServiceImpl::new(
        database.clone(),
        master_key.clone(),
        writers_runtime,
        settings.observability_allow_private_urls,
    );
    let fanout_consumers = spawn_fanout_consumers(
        writers_runtime,
        &bus,
        fanout.clone(),
        settings.write_linger,
        writers_stop.clone().requested(),
        writers_stop.clone().requested(),
    )
    .await?;
    let ledger = BudgetLedgerServiceImpl::new(database.clone(), BudgetLedgerOptions::default());
    let ledger_writer =
        spawn_settlement_consumer(writers_runtime, &bus, ledger.clone(), settings.write_linger, writers_stop.requested()).await?;
    let budget = BudgetLedgerClient::local(ledger);
    let guard = budget_guard(&settings, bus.clone(), &budget).await?;
    let guardian = guardian(&policy, &settings);
    let observability = ObservabilityFanoutClient::local(fanout);
    tracing::info!(listen = %settings.listen, data_dir = %settings.data_dir.display(), "brainstorm up: every service in one process");
    // With a gRPC address configured, the embedded services also answer gRPC there (for the
    // Kubernetes operator, or an edge elsewhere); by default `up` opens no port but the edge's.
    let grpc = if settings.grpc_listen_configured {
        let incoming = grpc_listener(settings.grpc_listen)?;
        let mut routes = tonic::service::RoutesBuilder::default();
        routes
            .add_service(identity.as_grpc_service())
            .add_service(catalog.as_grpc_service())
            .add_service(audit.as_grpc_service())
            .add_service(policy.as_grpc_service())
            .add_service(budget.as_grpc_service())
            .add_service(mcp.as_grpc_service())
            .add_service(prompts.as_grpc_service())
            .add_service(observability.as_grpc_service());
        tracing::info!(address = %settings.grpc_listen, "serving the embedded services over gRPC");
        Some(tokio::spawn(serve_grpc(incoming, routes.routes(), shutdown.clone())))
    } else {
        None
    };
    let dependencies = EdgeDependencies {
        identity,
        catalog,
        upstream,
        models: Arc::new(model_catalog(&settings)?),
        budget,
        guard,
        audit,
        audit_publisher: audit_publisher.clone(),
        guardian: guardian.clone(),
        policy,
        mcp: Some(mcp),
        prompts: Some(prompts),
        observability: Some(observability),
    };
    serve_edge(&settings, dependencies, bus, shutdown).await?;
    if let Some(grpc) = grpc {
        grpc.await.context("the gRPC server panicked")??;
    }
    flush_evidence(&audit_publisher, &guardian).await;
    let mut writers = vec![chain, ledger_writer];
    writers.extend(fanout_consumers);
    finish_writes(&stop_writers, writers).await;
    drop(writer_thread);
    database.close().await;
    Ok(())
}

/// `brainstorm serve <service>...`.
pub async fn serve(settings: Settings, names: &[String]) -> anyhow::Result<()> {
    let mut hosted = BTreeSet::new();
    for name in names {
        let service: ServiceName = name.parse()?;
        if !HOSTABLE.contains(&service) {
            bail!("service `{service}` is not part of this build yet; hostable services: {}", HOSTABLE.map(ServiceName::as_str).join(", "));
        }
        hosted.insert(service);
    }
    // With Kafka, every process shares one bus: edges publish settlements and audit records, the
    // services that own them consume, and every edge hears every invalidation. Without it, each
    // process has its own bus and the edge relays settlements and records over gRPC.
    let on_kafka = settings.kafka_brokers.is_some();
    let bus = select_bus(settings.kafka_brokers.as_deref()).context("cannot reach the Kafka bus (BR_KAFKA_BROKERS)")?;
    let hosts_edge = hosted.contains(&ServiceName::EdgeRouter);
    let needs_database = [
        ServiceName::Identity,
        ServiceName::CatalogHealthSentinel,
        ServiceName::BudgetLedger,
        ServiceName::AuditLineage,
        ServiceName::PolicyFirewall,
        ServiceName::McpGateway,
        ServiceName::PromptsEval,
        ServiceName::ObservabilityFanout,
    ]
    .iter()
    .any(|service| hosted.contains(service));
    let database = if needs_database {
        let url = settings
            .database_url
            .as_ref()
            .context("identity, catalog-health-sentinel and budget-ledger need a database: set BR_DATABASE_URL (or --database-url)")?;
        let connected = Database::connect(url.expose()).await?;
        connected.ensure_migrated().await?;
        Some(connected)
    } else {
        None
    };
    let upstream = UpstreamClient::new(&settings.egress_proxy)?;

    let identity = match (&database, hosted.contains(&ServiceName::Identity)) {
        (Some(database), true) => {
            // Without a master key identity still serves everything but agent JWTs (503 on bootstrap).
            let master_key = settings.master_key.as_ref().map(|key| MasterKey::from_hex(key.expose())).transpose()?;
            Some(IdentityClient::local(identity_service(&settings, database.clone(), bus.clone(), master_key.as_ref())?))
        }
        _ if hosts_edge => Some(IdentityClient::grpc(remote(&settings, ServiceName::Identity)?)),
        _ => None,
    };
    let catalog = match (&database, hosted.contains(&ServiceName::CatalogHealthSentinel)) {
        (Some(database), true) => {
            let master_key = required_master_key(&settings, "catalog-health-sentinel", "seal provider keys")?;
            Some(CatalogClient::local(catalog_service(&settings, database.clone(), bus.clone(), upstream.clone(), master_key)))
        }
        _ if hosts_edge => Some(CatalogClient::grpc(remote(&settings, ServiceName::CatalogHealthSentinel)?)),
        _ => None,
    };

    let shutdown = Shutdown::on_signals();
    // The chain and ledger writers and the edge's relays stop after the servers (see `finish_writes`).
    let (stop_writers, writers_stop) = Shutdown::requested_by_hand();
    let mut writers = Vec::new();
    let current = tokio::runtime::Handle::current();
    let budget = match (&database, hosted.contains(&ServiceName::BudgetLedger)) {
        (Some(database), true) => {
            let ledger = BudgetLedgerServiceImpl::new(database.clone(), BudgetLedgerOptions::default());
            writers.push(
                spawn_settlement_consumer(&current, &bus, ledger.clone(), settings.write_linger, writers_stop.clone().requested()).await?,
            );
            Some(BudgetLedgerClient::local(ledger))
        }
        _ if hosts_edge => {
            let remote = BudgetLedgerClient::grpc(remote(&settings, ServiceName::BudgetLedger)?);
            // Without a shared bus, settlements published on this process's bus reach the remote
            // ledger in batches through its RecordEvents call (idempotent per request id).
            if !on_kafka {
                let ledger = remote.clone();
                let relay = move |events| relay_budget_events(ledger.clone(), events);
                writers.push(spawn_relay(&bus, budget::SETTLEMENTS_TOPIC, "settlement-forwarder", &writers_stop, relay));
            }
            Some(remote)
        }
        _ => None,
    };
    let audit = match (&database, hosted.contains(&ServiceName::AuditLineage)) {
        (Some(database), true) => {
            let master_key = required_master_key(&settings, "audit-lineage", "sign evidence artifacts")?;
            let service = audit_service(database.clone(), &master_key)?;
            writers.push(
                spawn_audit_consumer(&current, &bus, service.clone(), settings.write_linger, writers_stop.clone().requested()).await?,
            );
            Some(AuditLineageClient::local(service))
        }
        _ if hosts_edge => {
            let remote = AuditLineageClient::grpc(remote(&settings, ServiceName::AuditLineage)?);
            // Without a shared bus, records queued on this process's bus reach the remote chain writer
            // in batches through its idempotent RecordAuditBatch call.
            if !on_kafka {
                let chain = remote.clone();
                let relay = move |records| relay_audit_records(chain.clone(), records);
                writers.push(spawn_relay(&bus, audit::AUDIT_RECORDS_TOPIC, "audit-forwarder", &writers_stop, relay));
            }
            Some(remote)
        }
        _ => None,
    };
    let policy = match (&database, hosted.contains(&ServiceName::PolicyFirewall)) {
        (Some(database), true) => {
            let master_key = settings.master_key.as_ref().map(|key| MasterKey::from_hex(key.expose())).transpose()?;
            Some(PolicyFirewallClient::local(policy_service(database.clone(), bus.clone(), master_key, &settings, &shutdown).await?))
        }
        _ if hosts_edge => Some(PolicyFirewallClient::grpc(remote(&settings, ServiceName::PolicyFirewall)?)),
        _ => None,
    };
    let mcp = match (&database, hosted.contains(&ServiceName::McpGateway)) {
        (Some(database), true) => {
            let master_key = required_master_key(&settings, "mcp-gateway", "seal MCP server credentials")?;
            Some(McpGatewayClient::local(mcp_service(&settings, database.clone(), master_key)))
        }
        // The edge routes completions without it: `/v1/mcp/*` answers 503 until BR_MCP_GATEWAY_URL is set.
        _ if hosts_edge && settings.service_urls.contains_key(&ServiceName::McpGateway) => {
            Some(McpGatewayClient::grpc(remote(&settings, ServiceName::McpGateway)?))
        }
        _ => None,
    };
    let prompts = match (&database, hosted.contains(&ServiceName::PromptsEval)) {
        (Some(database), true) => Some(PromptsEvalClient::local(PromptsEvalServiceImpl::new(database.clone()))),
        // As for mcp-gateway: `/v1/prompts/*` answers 503 until BR_PROMPTS_EVAL_URL is set.
        _ if hosts_edge && settings.service_urls.contains_key(&ServiceName::PromptsEval) => {
            Some(PromptsEvalClient::grpc(remote(&settings, ServiceName::PromptsEval)?))
        }
        _ => None,
    };
    let observability = match (&database, hosted.contains(&ServiceName::ObservabilityFanout)) {
        (Some(database), true) => {
            let master_key = required_master_key(&settings, "observability-fanout", "seal destination secrets")?;
            let fanout =
                ObservabilityFanoutServiceImpl::new(database.clone(), master_key, &current, settings.observability_allow_private_urls);
            // On Kafka it reads the topics itself; without, edges relay to it (below, or in theirs).
            let consumers = spawn_fanout_consumers(
                &current,
                &bus,
                fanout.clone(),
                settings.write_linger,
                writers_stop.clone().requested(),
                writers_stop.clone().requested(),
            )
            .await?;
            writers.extend(consumers);
            Some(ObservabilityFanoutClient::local(fanout))
        }
        _ if hosts_edge && settings.service_urls.contains_key(&ServiceName::ObservabilityFanout) => {
            let remote = ObservabilityFanoutClient::grpc(remote(&settings, ServiceName::ObservabilityFanout)?);
            // Without a shared bus, the settlements and audit records of this edge reach the fan-out
            // in batches through its RecordEvents call.
            if !on_kafka {
                let (usage, audit) = (remote.clone(), remote.clone());
                let relay_usage = move |events: Vec<budget::BudgetEvent>| relay_fanout(usage.clone(), encoded(&events), Vec::new());
                writers.push(spawn_relay(&bus, budget::SETTLEMENTS_TOPIC, "fanout-settlement-forwarder", &writers_stop, relay_usage));
                let relay_audit = move |records: Vec<audit::AuditRecord>| relay_fanout(audit.clone(), Vec::new(), encoded(&records));
                writers.push(spawn_relay(&bus, audit::AUDIT_RECORDS_TOPIC, "fanout-audit-forwarder", &writers_stop, relay_audit));
            }
            Some(remote)
        }
        _ => None,
    };
    let mut tasks = tokio::task::JoinSet::new();
    let mut routes = tonic::service::RoutesBuilder::default();
    if let (true, Some(identity)) = (hosted.contains(&ServiceName::Identity), &identity) {
        routes.add_service(identity.as_grpc_service());
    }
    if let (true, Some(catalog)) = (hosted.contains(&ServiceName::CatalogHealthSentinel), &catalog) {
        routes.add_service(catalog.as_grpc_service());
    }
    if let (true, Some(audit)) = (hosted.contains(&ServiceName::AuditLineage), &audit) {
        routes.add_service(audit.as_grpc_service());
    }
    if let (true, Some(policy)) = (hosted.contains(&ServiceName::PolicyFirewall), &policy) {
        routes.add_service(policy.as_grpc_service());
    }
    if let (true, Some(budget)) = (hosted.contains(&ServiceName::BudgetLedger), &budget) {
        routes.add_service(budget.as_grpc_service());
    }
    if let (true, Some(mcp)) = (hosted.contains(&ServiceName::McpGateway), &mcp) {
        routes.add_service(mcp.as_grpc_service());
    }
    if let (true, Some(prompts)) = (hosted.contains(&ServiceName::PromptsEval), &prompts) {
        routes.add_service(prompts.as_grpc_service());
    }
    if let (true, Some(observability)) = (hosted.contains(&ServiceName::ObservabilityFanout), &observability) {
        routes.add_service(observability.as_grpc_service());
    }
    if hosted.iter().any(|service| *service != ServiceName::EdgeRouter) {
        tracing::info!(address = %settings.grpc_listen, services = ?hosted, "serving gRPC");
        tasks.spawn(serve_grpc(grpc_listener(settings.grpc_listen)?, routes.routes(), shutdown.clone()));
    }
    match (hosts_edge, identity, catalog, budget, audit, policy) {
        (true, Some(identity), Some(catalog), Some(budget), Some(audit), Some(policy)) => {
            let guard = budget_guard(&settings, bus.clone(), &budget).await?;
            let (audit_publisher, _publishing) = AuditPublisher::spawn(bus.clone(), PublisherOptions::default());
            let guardian = guardian(&policy, &settings);
            let dependencies = EdgeDependencies {
                identity,
                catalog,
                upstream,
                models: Arc::new(model_catalog(&settings)?),
                budget,
                guard,
                audit,
                audit_publisher: audit_publisher.clone(),
                guardian: guardian.clone(),
                policy,
                mcp,
                prompts,
                observability,
            };
            let broadcast = select_broadcast_bus(settings.kafka_brokers.as_deref(), &bus)?;
            let (settings, stop) = (settings.clone(), shutdown.clone());
            tasks.spawn(async move {
                let served = serve_edge(&settings, dependencies, broadcast, stop).await;
                flush_evidence(&audit_publisher, &guardian).await;
                served
            });
        }
        _ => {
            let listen = settings.listen;
            let stop = shutdown.clone();
            tasks.spawn(async move { serve_health_only(listen, stop).await });
        }
    }
    let mut outcome = Ok(());
    while let Some(joined) = tasks.join_next().await {
        let result = joined.context("a server task panicked").and_then(|result| result);
        if let Err(error) = result {
            tracing::error!(error = %format!("{error:#}"), "server stopped");
            outcome = Err(error);
            tasks.abort_all();
        }
    }
    finish_writes(&stop_writers, writers).await;
    if let Some(database) = database {
        database.close().await;
    }
    outcome
}

/// `brainstorm migrate`.
pub async fn migrate(settings: Settings) -> anyhow::Result<()> {
    let database = match &settings.database_url {
        Some(url) => Database::connect(url.expose()).await?,
        None => Database::open_embedded(&settings.data_dir).await?,
    };
    database.migrate().await?;
    tracing::info!(engine = ?database.engine(), "migrations applied");
    database.close().await;
    Ok(())
}

fn identity_service(
    settings: &Settings,
    database: Database,
    bus: Arc<dyn EventBus>,
    master_key: Option<&MasterKey>,
) -> anyhow::Result<IdentityServiceImpl> {
    let options = IdentityOptions {
        dashboard_url: settings.dashboard_url.clone(),
        registration_mode: settings.registration_mode,
        outbox: MailOutbox::new(&settings.mail_outbox),
        require_agent_owner: settings.require_agent_owner,
        agent_tokens: master_key.map(|key| AgentTokenSigner::new(key.agent_token_secret(), settings.agent_token_ttl)),
        agent_ca: master_key.map(|key| AgentCertificateAuthority::from_seed(key.agent_ca_secret()).map(Arc::new)).transpose()?,
    };
    Ok(IdentityServiceImpl::new(database, bus, options))
}

fn catalog_service(
    settings: &Settings,
    database: Database,
    bus: Arc<dyn EventBus>,
    upstream: UpstreamClient,
    master_key: MasterKey,
) -> CatalogServiceImpl {
    let options = CatalogOptions { master_key, base_urls: settings.provider_base_urls.clone() };
    CatalogServiceImpl::new(database, bus, upstream, options)
}

/// The master key `service` cannot run without (it needs it to `purpose`).
fn required_master_key(settings: &Settings, service: &str, purpose: &str) -> anyhow::Result<MasterKey> {
    let key = settings.master_key.as_ref().with_context(|| format!("{service} needs BR_MASTER_KEY (64 hex characters) to {purpose}"))?;
    Ok(MasterKey::from_hex(key.expose())?)
}

/// The mcp-gateway service, sealing server credentials with the master key.
fn mcp_service(settings: &Settings, database: Database, master_key: MasterKey) -> McpGatewayServiceImpl {
    let options = McpGatewayOptions { master_key, call_timeout: MCP_CALL_TIMEOUT, allow_private_urls: settings.mcp_allow_private_urls };
    McpGatewayServiceImpl::new(database, options)
}

/// The edge's budget counters: shared by every replica through Redis when `BR_REDIS_URL` is set,
/// otherwise in this process (seeded from the ledger, so a restart keeps the current periods' spend).
async fn budget_guard(settings: &Settings, bus: Arc<dyn EventBus>, budget: &BudgetLedgerClient) -> anyhow::Result<Arc<BudgetGuard>> {
    let guard = match &settings.redis_url {
        Some(url) => BudgetGuard::redis(url.expose(), "br", bus).await.context("cannot reach Redis at BR_REDIS_URL")?,
        None => BudgetGuard::in_process(bus),
    };
    match budget.get_current_totals(CurrentTotalsRequest::default()).await {
        Ok(totals) => {
            let seeded = guard.seed_from_totals(&totals).await?;
            tracing::info!(seeded, "budget counters seeded from the ledger");
        }
        Err(error) => tracing::warn!(%error, "cannot seed budget counters from the ledger; they start from zero"),
    }
    Ok(Arc::new(guard))
}

/// The policy-firewall service, with its anomaly detector fed from the settlements.
async fn policy_service(
    database: Database,
    bus: Arc<dyn EventBus>,
    master_key: Option<MasterKey>,
    settings: &Settings,
    shutdown: &Shutdown,
) -> anyhow::Result<PolicyFirewallServiceImpl> {
    let options = PolicyFirewallOptions { master_key, ..PolicyFirewallOptions::default() };
    let service = PolicyFirewallServiceImpl::new(database, bus.clone(), options);
    let consumer = AnomalyConsumer::subscribe(&bus, service.clone()).await?.with_linger(settings.write_linger);
    tokio::spawn(consumer.run(shutdown.clone().requested()));
    Ok(service)
}

/// After the edge stopped taking requests: their audit records go from the publisher's buffer to the
/// bus and their firewall interceptions to the store (each wait bounded, so a stuck store cannot hold
/// the process forever). `finish_writes` then empties the bus.
async fn flush_evidence(publisher: &AuditPublisher, guardian: &Guardian) {
    // Tasks the last requests woke (a settlement on its way to the bus) run first.
    tokio::task::yield_now().await;
    if tokio::time::timeout(FINISH_PUBLISHING, publisher.flushed()).await.is_err() {
        tracing::warn!(buffered = publisher.stats().buffered, "audit records still unpublished at exit");
    }
    if tokio::time::timeout(FINISH_PUBLISHING, guardian.interceptions_flushed()).await.is_err() {
        tracing::warn!("firewall interceptions still unstored at exit");
    }
}

/// After the servers stopped and the evidence was flushed to the bus: the chain and ledger consumers
/// write what waits on it, and an edge's relays send it to their services, then they end, so a
/// graceful stop loses no evidence (bounded: a store or service that stays away cannot hold the
/// process forever).
async fn finish_writes(stop: &watch::Sender<bool>, writers: Vec<tokio::task::JoinHandle<()>>) {
    let _no_writers_left = stop.send(true);
    let finished = async {
        for writer in writers {
            if let Err(error) = writer.await {
                tracing::warn!(%error, "a chain or ledger writer failed while finishing");
            }
        }
    };
    if tokio::time::timeout(FINISH_WRITING, finished).await.is_err() {
        tracing::warn!("the chain and ledger writers or relays did not finish before exit; records left on the bus are lost");
    }
}

/// The edge's in-memory guardian over the policy-firewall client.
fn guardian(policy: &PolicyFirewallClient, settings: &Settings) -> Arc<Guardian> {
    let options = GuardianOptions { interception_linger: settings.write_linger, ..GuardianOptions::default() };
    Arc::new(Guardian::new(policy.clone(), options))
}

/// The audit service, signing artifacts with a key derived from the master key.
fn audit_service(database: Database, master_key: &MasterKey) -> anyhow::Result<AuditLineageServiceImpl> {
    let signer = ArtifactSigner::new(&master_key.artifact_secret()).context("cannot build the artifact signer")?;
    Ok(AuditLineageServiceImpl::new(database, AuditLineageOptions::new(signer)))
}

/// Most messages relayed in one call.
const RELAY_BATCH: usize = 256;

/// Relays `topic` to a remote service on a task of its own (see `forward_in_batches`) until `stop`.
fn spawn_relay<M, Relayed>(
    bus: &Arc<dyn EventBus>,
    topic: &'static str,
    group: &'static str,
    stop: &Shutdown,
    relay: impl Fn(Vec<M>) -> Relayed + Send + Sync + 'static,
) -> tokio::task::JoinHandle<()>
where
    M: prost::Message + Default + Clone + 'static,
    Relayed: std::future::Future<Output = ()> + Send + 'static,
{
    tokio::spawn(forward_in_batches(bus.clone(), topic, group, stop.clone().requested(), relay))
}

/// Relays the messages of `topic` from this process's bus to a remote service in batches: whatever
/// waits when the previous call returns, up to `RELAY_BATCH` (no linger, so a lone message goes at
/// once), in bus order, until `stop`; then what waits goes too. Undecodable messages are skipped;
/// `relay` retries until the service takes the batch, so each delivery is acked after its batch went.
async fn forward_in_batches<M, Relayed>(
    bus: Arc<dyn EventBus>,
    topic: &'static str,
    group: &'static str,
    stop: impl std::future::Future<Output = ()>,
    relay: impl Fn(Vec<M>) -> Relayed,
) where
    M: prost::Message + Default + Clone + 'static,
    Relayed: std::future::Future<Output = ()>,
{
    let mut subscription = match bus.subscribe(topic, group).await {
        Ok(subscription) => subscription,
        Err(error) => {
            tracing::error!(%error, topic, "cannot forward to the remote service");
            return;
        }
    };
    let batching = Batching { max: RELAY_BATCH, linger: Duration::ZERO, retry_pause: Duration::ZERO };
    let relay = &relay;
    let forwarded = consume(subscription.as_mut(), batching, stop, |deliveries| async move {
        let mut messages = Vec::with_capacity(deliveries.len());
        for delivery in &deliveries {
            match delivery.message().decode::<M>() {
                Ok(message) => messages.push(Arc::unwrap_or_clone(message)),
                Err(error) => tracing::warn!(%error, topic, "skipping an undecodable message"),
            }
        }
        relay(messages).await;
        for delivery in deliveries {
            delivery.ack();
        }
        // `relay` returns once the service took the batch: nothing comes back to retry.
        false
    })
    .await;
    if let Err(error) = forwarded {
        tracing::error!(%error, topic, "forwarding to the remote service stopped");
    }
}

/// Chains `records` remotely; a batch refused as invalid goes again record by record.
async fn relay_audit_records(chain: AuditLineageClient, records: Vec<audit::AuditRecord>) {
    if records.is_empty()
        || delivered("audit-lineage", || chain.record_audit_batch(audit::AuditRecordBatch { records: records.clone() })).await
    {
        return;
    }
    for record in records {
        delivered("audit-lineage", || chain.record_audit(record.clone())).await;
    }
}

/// Calls `send` until the service takes the call (true) or refuses it as invalid (false, logged),
/// pausing with a doubling backoff while the service is unreachable.
async fn delivered<T, Call>(service: &str, mut send: impl FnMut() -> Call) -> bool
where
    Call: std::future::Future<Output = Result<T, brainstorm_proto::ServiceError>>,
{
    let mut backoff = Duration::from_millis(100);
    loop {
        match send().await {
            Ok(_) => return true,
            Err(error) if error.kind == brainstorm_proto::ErrorKind::InvalidArgument => {
                tracing::warn!(%error, service, "the service refused what was relayed");
                return false;
            }
            Err(error) => {
                tracing::warn!(%error, service, "the service is unreachable; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// Records `events` remotely; a batch refused as invalid goes again event by event.
async fn relay_budget_events(ledger: BudgetLedgerClient, events: Vec<budget::BudgetEvent>) {
    if events.is_empty() || delivered("budget-ledger", || ledger.record_events(budget::BudgetEventBatch { events: events.clone() })).await {
        return;
    }
    for event in events {
        delivered("budget-ledger", || ledger.record_event(event.clone())).await;
    }
}

/// Messages as they travel on the bus.
fn encoded<M: prost::Message>(messages: &[M]) -> Vec<Vec<u8>> {
    messages.iter().map(prost::Message::encode_to_vec).collect()
}

/// Hands settlements and audit records to a remote fan-out (retried while it is unreachable; a
/// batch it refuses as invalid is dropped: the fan-out is not evidence).
async fn relay_fanout(fanout: ObservabilityFanoutClient, budget_events: Vec<Vec<u8>>, audit_records: Vec<Vec<u8>>) {
    if budget_events.is_empty() && audit_records.is_empty() {
        return;
    }
    let batch = FanoutEvents { budget_events, audit_records, ..FanoutEvents::default() };
    delivered("observability-fanout", || fanout.record_events(batch.clone())).await;
}

fn model_catalog(settings: &Settings) -> anyhow::Result<ModelCatalog> {
    Ok(match &settings.model_catalog {
        Some(path) => ModelCatalog::load(path).with_context(|| "invalid setting `model_catalog (BR_MODEL_CATALOG)`")?,
        None => ModelCatalog::bundled()?,
    })
}

/// Embedded mode keeps a generated master key in the data dir (created once, readable by the owner only).
async fn embedded_master_key(settings: &Settings) -> anyhow::Result<MasterKey> {
    let path = settings.data_dir.join(MASTER_KEY_FILE);
    match tokio::fs::read_to_string(&path).await {
        Ok(text) => return MasterKey::from_hex(&text).with_context(|| format!("{} is not a valid master key", path.display())),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error).with_context(|| format!("cannot read {}", path.display())),
    }
    let generated = MasterKey::generate_hex();
    write_private(&path, &generated).await.with_context(|| format!("cannot write {}", path.display()))?;
    tracing::info!(path = %path.display(), "generated the embedded master key");
    Ok(MasterKey::from_hex(&generated)?)
}

#[cfg(unix)]
async fn write_private(path: &std::path::Path, contents: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = path.to_path_buf();
    let contents = contents.to_string();
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
        file.write_all(contents.as_bytes())
    })
    .await
    .map_err(std::io::Error::other)?
}

#[cfg(not(unix))]
async fn write_private(path: &std::path::Path, contents: &str) -> std::io::Result<()> {
    tokio::fs::write(path, contents).await
}

fn remote(settings: &Settings, service: ServiceName) -> anyhow::Result<Channel> {
    service_channel(settings, service, || {
        format!("edge-router needs {service}: run it in this process (`serve edge-router {service}`) or set {}", service.url_variable())
    })
}

/// A lazy gRPC channel to `service` at its `BR_<SERVICE>_URL`; `missing` says what to do without one.
fn service_channel(settings: &Settings, service: ServiceName, missing: impl FnOnce() -> String) -> anyhow::Result<Channel> {
    let url = settings.service_urls.get(&service).with_context(missing)?;
    let endpoint = Endpoint::from_shared(url.clone())
        .with_context(|| format!("{} is not a valid URL", service.url_variable()))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(60));
    // Lazy: the edge starts even if the service is not up yet, and reconnects when it comes back.
    Ok(endpoint.connect_lazy())
}

async fn serve_edge(settings: &Settings, dependencies: EdgeDependencies, bus: Arc<dyn EventBus>, shutdown: Shutdown) -> anyhow::Result<()> {
    let options = EdgeOptions {
        platform_admin_key: settings.platform_admin_key.clone(),
        cache_ttl: settings.cache_ttl,
        response_cache: settings.response_cache,
        base_urls: settings.provider_base_urls.clone(),
        trace_requests: settings.otel_exporter_otlp_endpoint.is_some(),
        circuits: CircuitOptions { failures_to_open: settings.circuit_failures, open_for: settings.circuit_open },
        sentinel_interval: settings.sentinel_interval,
        xdr_bidirectional: settings.xdr_bidirectional,
        serves_tls: settings.tls.is_some(),
        forwarded_certificates: settings.forwarded_client_certificates.clone(),
        idp: settings.idp.clone(),
        dashboard_url: settings.dashboard_url.clone(),
        stopping: shutdown.watch(),
    };
    let edge = Arc::new(Edge::new(dependencies, &options));
    let follower = {
        let edge = edge.clone();
        tokio::spawn(async move { edge.follow_bus(bus, "edge-router").await })
    };
    if let Some(forwarded) = &settings.forwarded_client_certificates {
        let proxies: Vec<String> = forwarded.trusted_proxies.iter().map(ToString::to_string).collect();
        tracing::info!(header = %forwarded.header, proxies = %proxies.join(","), "agent client certificates forwarded by these proxies are accepted");
    }
    let result = match &settings.tls {
        Some(files) => crate::tls::serve_https(settings.listen, edge.router.clone(), files, shutdown).await,
        // Forwarded certificates are trusted by the peer's address, which the plain listener then
        // puts on every request.
        None if settings.forwarded_client_certificates.is_some() => {
            serve_http_with_peers(settings.listen, edge.router.clone(), shutdown).await
        }
        None => serve_http(settings.listen, edge.router.clone(), shutdown).await,
    };
    follower.abort();
    result
}

/// `brainstorm operator`: the Kubernetes operator, with `GET /health` on the REST address.
pub async fn operator(settings: Settings, arguments: &crate::cli::OperatorArgs) -> anyhow::Result<()> {
    let channel = |service: ServiceName| {
        service_channel(&settings, service, || format!("the operator needs {service}: set {}", service.url_variable()))
    };
    // The fan-out is optional: without it, the operator's changes reach no SIEM.
    let observability = if settings.service_urls.contains_key(&ServiceName::ObservabilityFanout) {
        Some(ObservabilityFanoutClient::grpc(channel(ServiceName::ObservabilityFanout)?))
    } else {
        None
    };
    let gateway = brainstorm_operator::Gateway {
        identity: IdentityClient::grpc(channel(ServiceName::Identity)?),
        policy: PolicyFirewallClient::grpc(channel(ServiceName::PolicyFirewall)?),
        observability,
    };
    let client = kube::Client::try_default().await.context("cannot reach the Kubernetes API (KUBECONFIG or the pod's service account)")?;
    let options = brainstorm_operator::OperatorOptions {
        namespace: arguments.namespace.clone(),
        resync: Duration::from_secs(arguments.resync_seconds),
    };
    let shutdown = Shutdown::on_signals();
    let health = tokio::spawn(serve_health_only(settings.listen, shutdown.clone()));
    brainstorm_operator::run(client, gateway, options, shutdown.requested()).await;
    health.abort();
    tracing::info!("operator stopped");
    Ok(())
}

/// The gRPC address bound (TCP_NODELAY on every accepted connection), so a taken port stops start-up.
fn grpc_listener(address: std::net::SocketAddr) -> anyhow::Result<TcpIncoming> {
    let incoming = TcpIncoming::bind(address).with_context(|| format!("cannot listen for gRPC on {address}"))?;
    Ok(incoming.with_nodelay(Some(true)))
}

/// The gRPC server of `routes` on a bound address until shutdown.
async fn serve_grpc(incoming: TcpIncoming, routes: tonic::service::Routes, shutdown: Shutdown) -> anyhow::Result<()> {
    tonic::transport::Server::builder()
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, shutdown.requested())
        .await
        .context("the gRPC server failed")
}

async fn serve_health_only(listen: std::net::SocketAddr, shutdown: Shutdown) -> anyhow::Result<()> {
    let router = Router::new().route("/health", get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }));
    serve_http(listen, router, shutdown).await
}

async fn serve_http(listen: std::net::SocketAddr, router: Router, shutdown: Shutdown) -> anyhow::Result<()> {
    let listener = rest_listener(listen).await?;
    axum::serve(listener, router).with_graceful_shutdown(shutdown.requested()).await.context("REST server failed")?;
    tracing::info!(address = %listen, "REST server stopped");
    Ok(())
}

/// `serve_http`, with each connection's peer address (`ConnectInfo<SocketAddr>`) on its requests.
async fn serve_http_with_peers(listen: std::net::SocketAddr, router: Router, shutdown: Shutdown) -> anyhow::Result<()> {
    let listener = rest_listener(listen).await?;
    axum::serve(listener, router.into_make_service_with_connect_info::<std::net::SocketAddr>())
        .with_graceful_shutdown(shutdown.requested())
        .await
        .context("REST server failed")?;
    tracing::info!(address = %listen, "REST server stopped");
    Ok(())
}

/// The REST address bound, TCP_NODELAY on every accepted connection.
async fn rest_listener(listen: std::net::SocketAddr) -> anyhow::Result<TapIo<tokio::net::TcpListener, fn(&mut tokio::net::TcpStream)>> {
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
    tracing::info!(address = %listen, "serving REST");
    Ok(listener.tap_io(set_nodelay))
}

/// Without it, small responses on a reused connection wait for the peer's delayed ack.
fn set_nodelay(stream: &mut tokio::net::TcpStream) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "cannot set TCP_NODELAY");
    }
}
