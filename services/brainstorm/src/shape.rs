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
use axum::serve::ListenerExt;
use brainstorm_common::bus::{EventBus, InProcessBus};
use brainstorm_common::config::{ServiceName, Settings};
use brainstorm_common::outbox::MailOutbox;
use brainstorm_common::store::Database;
use brainstorm_edge_router::{EdgeOptions, edge_router};
use brainstorm_identity::{IdentityOptions, IdentityServiceImpl};
use brainstorm_proto::identity::IdentityClient;
use tonic::transport::Endpoint;

use crate::shutdown::Shutdown;

/// Services this build can host.
const HOSTABLE: [ServiceName; 2] = [ServiceName::EdgeRouter, ServiceName::Identity];

/// How long the edge trusts a resolved API key before asking identity again (revocations through
/// this edge, and through the bus, apply at once).
const AUTH_CACHE_TTL: Duration = Duration::from_secs(30);

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
    let identity = IdentityClient::local(identity_service(&settings, database.clone(), bus.clone()));
    let shutdown = Shutdown::on_signals();
    tracing::info!(listen = %settings.listen, data_dir = %settings.data_dir.display(), "brainstorm up: every service in one process");
    serve_edge(&settings, identity, bus, shutdown).await?;
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
    let bus: Arc<dyn EventBus> = Arc::new(InProcessBus::new());
    if settings.kafka_brokers.is_some() {
        tracing::warn!("BR_KAFKA_BROKERS is set but this build's bus is in-process: edges learn of revocations by cache expiry");
    }

    let mut database = None;
    let identity = if hosted.contains(&ServiceName::Identity) {
        let url = settings.database_url.as_ref().context("identity needs a database: set BR_DATABASE_URL (or --database-url)")?;
        let connected = Database::connect(url.expose()).await?;
        connected.ensure_migrated().await?;
        let client = IdentityClient::local(identity_service(&settings, connected.clone(), bus.clone()));
        database = Some(connected);
        Some(client)
    } else {
        None
    };
    let identity = match identity {
        Some(identity) => identity,
        None if hosted.contains(&ServiceName::EdgeRouter) => remote_identity(&settings)?,
        None => bail!("nothing to serve"),
    };

    let shutdown = Shutdown::on_signals();
    let mut tasks = tokio::task::JoinSet::new();
    if hosted.contains(&ServiceName::Identity) {
        let address = settings.grpc_listen;
        let service = identity.as_grpc_service();
        let stop = shutdown.clone();
        tracing::info!(%address, "serving identity over gRPC");
        tasks.spawn(async move {
            tonic::transport::Server::builder()
                .tcp_nodelay(true)
                .add_service(service)
                .serve_with_shutdown(address, stop.requested())
                .await
                .with_context(|| format!("gRPC server on {address} failed"))
        });
    }
    if hosted.contains(&ServiceName::EdgeRouter) {
        let settings = settings.clone();
        let (identity, bus, stop) = (identity.clone(), bus.clone(), shutdown.clone());
        tasks.spawn(async move { serve_edge(&settings, identity, bus, stop).await });
    } else {
        let listen = settings.listen;
        let stop = shutdown.clone();
        tasks.spawn(async move { serve_health_only(listen, stop).await });
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

fn identity_service(settings: &Settings, database: Database, bus: Arc<dyn EventBus>) -> IdentityServiceImpl {
    let options = IdentityOptions {
        dashboard_url: settings.dashboard_url.clone(),
        registration_mode: settings.registration_mode,
        outbox: MailOutbox::new(&settings.mail_outbox),
    };
    IdentityServiceImpl::new(database, bus, options)
}

fn remote_identity(settings: &Settings) -> anyhow::Result<IdentityClient> {
    let url = settings.service_urls.get(&ServiceName::Identity).with_context(|| {
        format!(
            "edge-router needs identity: run it in this process (`serve edge-router identity`) or set {}",
            ServiceName::Identity.url_variable()
        )
    })?;
    let endpoint = Endpoint::from_shared(url.clone())
        .with_context(|| format!("{} is not a valid URL", ServiceName::Identity.url_variable()))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30));
    // Lazy: the edge starts even if identity is not up yet, and reconnects when it comes back.
    Ok(IdentityClient::grpc(endpoint.connect_lazy()))
}

async fn serve_edge(settings: &Settings, identity: IdentityClient, bus: Arc<dyn EventBus>, shutdown: Shutdown) -> anyhow::Result<()> {
    let options = EdgeOptions { platform_admin_key: settings.platform_admin_key.clone(), auth_cache_ttl: AUTH_CACHE_TTL };
    let (router, authenticator) = edge_router(identity, &options);
    let follower = tokio::spawn(authenticator.follow_identity_events(bus, "edge-router".to_string()));
    let result = serve_http(settings.listen, router, shutdown).await;
    follower.abort();
    result
}

async fn serve_health_only(listen: std::net::SocketAddr, shutdown: Shutdown) -> anyhow::Result<()> {
    let router = Router::new().route("/health", get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }));
    serve_http(listen, router, shutdown).await
}

async fn serve_http(listen: std::net::SocketAddr, router: Router, shutdown: Shutdown) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
    let listener = listener.tap_io(|stream| {
        // Without it, small responses on a reused connection wait for the peer's delayed ack.
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY");
        }
    });
    tracing::info!(address = %listen, "serving REST");
    axum::serve(listener, router).with_graceful_shutdown(shutdown.requested()).await.context("REST server failed")?;
    tracing::info!(address = %listen, "REST server stopped");
    Ok(())
}
