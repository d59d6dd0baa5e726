//! `mock-upstream`: serves the fake OpenAI, Anthropic and Gemini APIs until SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use brainstorm_mock_upstream::{MockConfig, MockUpstream};
use clap::Parser;
use tracing_subscriber::EnvFilter;

/// A fast, deterministic fake of the OpenAI, Anthropic and Gemini APIs.
#[derive(Debug, Parser)]
#[command(name = "mock-upstream", version)]
struct Cli {
    /// Address to listen on (port 0 picks a free port; the address is logged).
    #[arg(long, default_value = "127.0.0.1:9100")]
    listen: SocketAddr,
    /// A key accepted by every provider; repeat for several. Without any, every key is accepted.
    #[arg(long = "valid-key", value_name = "KEY")]
    valid_keys: Vec<String>,
    /// Milliseconds to wait between the chunks of a stream.
    #[arg(long, default_value_t = 0, value_name = "MS")]
    chunk_delay_ms: u64,
    /// Milliseconds to wait before a whole (non-streamed) successful reply.
    #[arg(long, default_value_t = 0, value_name = "MS")]
    reply_delay_ms: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let colored = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(colored).with_writer(std::io::stderr).init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let config = MockConfig {
            valid_keys: cli.valid_keys,
            chunk_delay: Duration::from_millis(cli.chunk_delay_ms),
            reply_delay: Duration::from_millis(cli.reply_delay_ms),
        };
        let keys = config.valid_keys.len();
        let mock = match MockUpstream::start_on(cli.listen, config).await {
            Ok(mock) => mock,
            Err(error) => {
                tracing::error!(%error, listen = %cli.listen, "cannot listen");
                return ExitCode::FAILURE;
            }
        };
        tracing::info!(address = %mock.address(), base_url = mock.base_url(), valid_keys = keys, chunk_delay_ms = cli.chunk_delay_ms, "mock upstream listening");
        wait_for_signal().await;
        tracing::info!("mock upstream stopping");
        drop(mock);
        ExitCode::SUCCESS
    })
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = terminate.recv() => {}
                }
                return;
            }
            Err(error) => tracing::warn!(%error, "cannot listen for SIGTERM; only SIGINT stops the mock"),
        }
    }
    if let Err(error) = tokio::signal::ctrl_c().await {
        tracing::warn!(%error, "cannot listen for SIGINT");
        std::future::pending::<()>().await;
    }
}
