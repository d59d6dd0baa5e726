//! `stack-relay --listen ADDR --upstream HOST:PORT`: relays every request to the upstream until SIGINT
//! or SIGTERM (the library's `Relay`), on the runtime the gateway would choose (one CPU: tokio's
//! single-threaded scheduler) and with the gateway's allocator.

use std::net::SocketAddr;
use std::process::ExitCode;

use brainstorm_stack_relay::Relay;
use http::uri::Authority;
use tracing_subscriber::EnvFilter;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const USAGE: &str = "usage: stack-relay --listen ADDR --upstream HOST:PORT";

fn main() -> ExitCode {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let (listen, upstream) = match arguments(std::env::args().skip(1)) {
        Ok(parsed) => parsed,
        Err(message) => {
            tracing::error!("{message}; {USAGE}");
            return ExitCode::from(2);
        }
    };
    let one_cpu = std::thread::available_parallelism().is_ok_and(|cpus| cpus.get() == 1);
    let mut builder = if one_cpu { tokio::runtime::Builder::new_current_thread() } else { tokio::runtime::Builder::new_multi_thread() };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let relay = match Relay::new(upstream) {
            Ok(relay) => relay,
            Err(error) => {
                tracing::error!(%error, "the upstream is not a valid Host header");
                return ExitCode::from(2);
            }
        };
        let listener = match tokio::net::TcpListener::bind(listen).await {
            Ok(listener) => listener,
            Err(error) => {
                tracing::error!(%error, %listen, "cannot listen");
                return ExitCode::FAILURE;
            }
        };
        tokio::select! {
            result = relay.serve(listener) => match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    tracing::error!(%error, "relay stopped");
                    ExitCode::FAILURE
                }
            },
            () = stopped() => ExitCode::SUCCESS,
        }
    })
}

/// `--listen` and `--upstream`, each required once.
fn arguments(mut words: impl Iterator<Item = String>) -> Result<(SocketAddr, Authority), String> {
    let (mut listen, mut upstream) = (None, None);
    while let Some(word) = words.next() {
        let value = words.next().ok_or_else(|| format!("{word} needs a value"))?;
        match word.as_str() {
            "--listen" => listen = Some(value.parse::<SocketAddr>().map_err(|error| format!("--listen {value}: {error}"))?),
            "--upstream" => upstream = Some(value.parse::<Authority>().map_err(|error| format!("--upstream {value}: {error}"))?),
            _ => return Err(format!("unknown argument {word}")),
        }
    }
    Ok((listen.ok_or("--listen is required")?, upstream.ok_or("--upstream is required")?))
}

async fn stopped() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        }
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGTERM; only SIGINT stops the relay");
            let _interrupted = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(words: &[&str]) -> Result<(SocketAddr, Authority), String> {
        arguments(words.iter().map(|word| (*word).to_string()))
    }

    #[test]
    fn both_addresses_are_required_and_checked() {
        let (listen, upstream) = parse(&["--listen", "127.0.0.1:8080", "--upstream", "127.0.0.1:9100"]).unwrap();
        assert_eq!(listen.port(), 8080);
        assert_eq!(upstream.as_str(), "127.0.0.1:9100");
        assert!(parse(&["--listen", "127.0.0.1:8080"]).is_err_and(|error| error.contains("--upstream")));
        assert!(parse(&["--listen", "nowhere", "--upstream", "127.0.0.1:9100"]).is_err());
        assert!(parse(&["--listen"]).is_err_and(|error| error.contains("needs a value")));
        assert!(parse(&["--port", "1"]).is_err_and(|error| error.contains("unknown")));
    }
}
