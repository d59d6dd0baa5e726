//! A fast, deterministic fake of the upstream LLM providers (OpenAI, Anthropic, Gemini) that the
//! gateway's tests and benchmark point the gateway at.
//!
//! In-process:
//!
//! ```no_run
//! # async fn example() -> std::io::Result<()> {
//! use brainstorm_mock_upstream::{FailSpec, MockConfig, MockUpstream};
//!
//! let mock = MockUpstream::start(MockConfig { valid_keys: vec!["sk-test".into()], ..MockConfig::default() }).await?;
//! let _openai_base = format!("{}/v1", mock.base_url());
//! mock.fail_next(FailSpec { count: 1, status: 429, ..FailSpec::default() });
//! let _recorded = mock.requests();
//! # Ok(())
//! # }
//! ```
//!
//! Out of process, the `mock-upstream` binary serves the same API plus `GET|DELETE /__mock/requests`
//! and `POST|DELETE /__mock/fail`.

mod anthropic;
mod conversation;
mod gemini;
mod journal;
mod openai;
mod respond;
mod routes;

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use crate::journal::Shared;
pub use crate::journal::{FailSpec, RECORD_CAPACITY, RecordedRequest};

/// How the mock behaves.
#[derive(Debug, Clone, Default)]
pub struct MockConfig {
    /// Keys accepted by every provider; empty accepts any key, or none.
    pub valid_keys: Vec<String>,
    /// Wait between the chunks of a stream; zero sends a whole stream in one write.
    pub chunk_delay: Duration,
    /// Wait before a whole (non-streamed) successful reply leaves, as a model's generation takes time.
    pub reply_delay: Duration,
}

/// A running mock; it stops (and drops its open connections) when dropped.
pub struct MockUpstream {
    address: SocketAddr,
    base_url: String,
    shared: Arc<Shared>,
    server: JoinHandle<()>,
}

impl MockUpstream {
    /// Starts a mock on a free port of 127.0.0.1.
    pub async fn start(config: MockConfig) -> io::Result<MockUpstream> {
        MockUpstream::start_on(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), config).await
    }

    /// Starts a mock listening on `listen` (port 0 picks a free port).
    pub async fn start_on(listen: SocketAddr, config: MockConfig) -> io::Result<MockUpstream> {
        let listener = TcpListener::bind(listen).await?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared::new(config.valid_keys, config.chunk_delay, config.reply_delay));
        let router = Router::new().fallback(routes::dispatch).with_state(Arc::clone(&shared));
        let server = tokio::spawn(serve(listener, router));
        Ok(MockUpstream { address, base_url: format!("http://{address}"), shared, server })
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The recorded requests, oldest first (at most the last [`RECORD_CAPACITY`]).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.requests()
    }

    /// Forgets the recorded requests.
    pub fn clear(&self) {
        self.shared.clear();
    }

    /// Queues a failure for the next `spec.count` matching requests; queued failures apply oldest first.
    pub fn fail_next(&self, spec: FailSpec) {
        self.shared.fail_next(spec);
    }

    /// Drops every queued failure.
    pub fn clear_failures(&self) {
        self.shared.clear_failures();
    }
}

impl Drop for MockUpstream {
    fn drop(&mut self) {
        // Dropping the accept loop drops its JoinSet, which aborts every connection task.
        self.server.abort();
    }
}

/// The accept loop; each connection is a task of a set owned by this future, so aborting it ends them all.
async fn serve(listener: TcpListener, router: Router) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    // Without it, small responses on a reused connection wait for the peer's delayed ack.
                    if let Err(error) = stream.set_nodelay(true) {
                        tracing::debug!(%error, "cannot set TCP_NODELAY");
                    }
                    let service = TowerToHyperService::new(router.clone());
                    connections.spawn(async move {
                        let builder = Builder::new(TokioExecutor::new());
                        if let Err(error) = builder.serve_connection(TokioIo::new(stream), service).await {
                            tracing::debug!(%error, "connection ended with an error");
                        }
                    });
                }
                Err(error) => {
                    // Usually out of file descriptors: wait for connections to close rather than spin.
                    tracing::warn!(%error, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
            Some(_finished) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}
