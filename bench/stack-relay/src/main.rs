//! `stack-relay --listen ADDR --upstream HOST:PORT [--via hyper|axum]`: relays every request to the
//! upstream until SIGINT or SIGTERM (the library's `Relay`), served by hyper alone or through axum as
//! the gateway's edge is, on the runtime the gateway would choose (one CPU: tokio's single-threaded
//! scheduler) and with the gateway's allocator.

use std::net::SocketAddr;
use std::process::ExitCode;

use brainstorm_stack_relay::Relay;
use futures::FutureExt;
use http::uri::Authority;
use tracing_subscriber::EnvFilter;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const USAGE: &str = "usage: stack-relay --listen ADDR --upstream HOST:PORT [--via hyper|axum]";

/// The server in front of the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// hyper's HTTP/1.1 server and nothing else.
    Hyper,
    /// `axum::serve` and a `Router`, as the gateway's edge.
    Axum,
}

/// What the command line asks for.
#[derive(Debug)]
struct Arguments {
    listen: SocketAddr,
    upstream: Authority,
    via: Via,
}

fn main() -> ExitCode {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let Arguments { listen, upstream, via } = match arguments(std::env::args().skip(1)) {
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
        let listener = match tokio::net::TcpListener::bind(listen).await {
            Ok(listener) => listener,
            Err(error) => {
                tracing::error!(%error, %listen, "cannot listen");
                return ExitCode::FAILURE;
            }
        };
        let served = match via {
            Via::Hyper => Relay::new(upstream).map(|relay| relay.serve(listener).boxed()),
            Via::Axum => Relay::new(upstream).map(|relay| relay.serve_axum(listener).boxed()),
        };
        let served = match served {
            Ok(served) => served,
            Err(error) => {
                tracing::error!(%error, "the upstream is not a valid Host header");
                return ExitCode::from(2);
            }
        };
        tokio::select! {
            result = served => match result {
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

/// `--listen` and `--upstream`, each required; `--via`, hyper unless told.
fn arguments(mut words: impl Iterator<Item = String>) -> Result<Arguments, String> {
    let (mut listen, mut upstream, mut via) = (None, None, Via::Hyper);
    while let Some(word) = words.next() {
        let value = words.next().ok_or_else(|| format!("{word} needs a value"))?;
        match word.as_str() {
            "--listen" => listen = Some(value.parse::<SocketAddr>().map_err(|error| format!("--listen {value}: {error}"))?),
            "--upstream" => upstream = Some(value.parse::<Authority>().map_err(|error| format!("--upstream {value}: {error}"))?),
            "--via" => {
                via = match value.as_str() {
                    "hyper" => Via::Hyper,
                    "axum" => Via::Axum,
                    _ => return Err(format!("--via {value}: hyper or axum")),
                }
            }
            _ => return Err(format!("unknown argument {word}")),
        }
    }
    Ok(Arguments { listen: listen.ok_or("--listen is required")?, upstream: upstream.ok_or("--upstream is required")?, via })
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

    fn parse(words: &[&str]) -> Result<Arguments, String> {
        arguments(words.iter().map(|word| (*word).to_string()))
    }

    #[test]
    fn both_addresses_are_required_and_checked() {
        let parsed = parse(&["--listen", "127.0.0.1:8080", "--upstream", "127.0.0.1:9100"]).unwrap();
        assert_eq!(parsed.listen.port(), 8080);
        assert_eq!(parsed.upstream.as_str(), "127.0.0.1:9100");
        assert_eq!(parsed.via, Via::Hyper);
        assert_eq!(parse(&["--via", "axum", "--listen", "127.0.0.1:8080", "--upstream", "h:1"]).unwrap().via, Via::Axum);
        assert!(
            parse(&["--via", "nginx", "--listen", "127.0.0.1:8080", "--upstream", "h:1"])
                .is_err_and(|error| error.contains("hyper or axum"))
        );
        assert!(parse(&["--listen", "127.0.0.1:8080"]).is_err_and(|error| error.contains("--upstream")));
        assert!(parse(&["--listen", "nowhere", "--upstream", "127.0.0.1:9100"]).is_err());
        assert!(parse(&["--listen"]).is_err_and(|error| error.contains("needs a value")));
        assert!(parse(&["--port", "1"]).is_err_and(|error| error.contains("unknown")));
    }
}
