//! A bare reverse proxy built from the gateway's own HTTP stack: tokio, hyper's HTTP/1.1 server,
//! hyper-util's pooled client, `TCP_NODELAY` on both sides, bodies streamed through untouched. It
//! does nothing a gateway does (no routing, no JSON, no evidence), so `make bench` measures with it
//! what this stack alone costs per request, between nginx's floor and the gateway's figure.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::Either;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;

/// The relay's answer body: the upstream's, streamed, or a short error of its own.
pub type RelayBody = Either<Incoming, Full<Bytes>>;

/// Headers that describe one hop's connection, never forwarded (RFC 9110, section 7.6.1).
const HOP_BY_HOP: [HeaderName; 4] = [header::CONNECTION, header::TE, header::TRAILER, header::UPGRADE];
const KEEP_ALIVE: &str = "keep-alive";
const PROXY_CONNECTION: &str = "proxy-connection";

/// Forwards every request to one upstream (plain HTTP), as nginx's `proxy_pass` to a keepalive pool;
/// `B` is the request body type of the server in front (hyper's own, or axum's).
pub struct Relay<B = Incoming> {
    client: Client<HttpConnector, B>,
    upstream: Arc<Authority>,
    host: HeaderValue,
}

impl<B> Clone for Relay<B> {
    fn clone(&self) -> Self {
        Relay { client: self.client.clone(), upstream: self.upstream.clone(), host: self.host.clone() }
    }
}

impl<B> Relay<B>
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// A relay to `upstream` (`host:port`), with the pool the gateway's upstream client keeps.
    pub fn new(upstream: Authority) -> Result<Relay<B>, http::header::InvalidHeaderValue> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(256)
            .pool_timer(TokioTimer::new())
            .build(connector);
        let host = HeaderValue::from_str(upstream.as_str())?;
        Ok(Relay { client, upstream: Arc::new(upstream), host })
    }

    /// `request` sent upstream with its path and query, its headers less the hop-by-hop ones and the
    /// upstream's `Host`; the answer streamed back, or 502 when the upstream cannot be reached.
    pub async fn forward(&self, request: Request<B>) -> Response<RelayBody> {
        let (mut parts, body) = request.into_parts();
        let path = parts.uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
        parts.uri = match Uri::builder().scheme(Scheme::HTTP).authority(self.upstream.as_ref().clone()).path_and_query(path).build() {
            Ok(uri) => uri,
            Err(error) => return failure(StatusCode::BAD_REQUEST, &format!("cannot relay this target: {error}")),
        };
        strip_hop_by_hop(&mut parts.headers);
        parts.headers.insert(header::HOST, self.host.clone());
        match self.client.request(Request::from_parts(parts, body)).await {
            Ok(response) => {
                let (mut parts, body) = response.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                Response::from_parts(parts, Either::Left(body))
            }
            Err(error) => failure(StatusCode::BAD_GATEWAY, &format!("upstream unreachable: {error}")),
        }
    }
}

impl Relay<Incoming> {
    /// Serves `listener` with hyper's HTTP/1.1 server until the task is dropped: one connection task
    /// per client, no framework between it and `forward`.
    pub async fn serve(self, listener: TcpListener) -> std::io::Result<()> {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(accepted) => accepted,
                // Out of descriptors or a connection reset before accept: the next one may do.
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!(%error, "cannot set TCP_NODELAY");
            }
            let relay = self.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request| {
                    let relay = relay.clone();
                    async move { Ok::<_, Infallible>(relay.forward(request).await) }
                });
                if let Err(error) = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await {
                    tracing::debug!(%error, "connection ended");
                }
            });
        }
    }
}

impl Relay<axum::body::Body> {
    /// Serves `listener` as the gateway serves its edge: `axum::serve` (hyper-util's server, which
    /// tells HTTP/1.1 from HTTP/2) with `TCP_NODELAY`, and an axum `Router` whose fallback forwards, so
    /// the difference from `serve` is what axum costs a request.
    pub async fn serve_axum(self, listener: TcpListener) -> std::io::Result<()> {
        use axum::serve::ListenerExt;
        let listener = listener.tap_io(|stream| {
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!(%error, "cannot set TCP_NODELAY");
            }
        });
        let forward = move |request: Request<axum::body::Body>| {
            let relay = self.clone();
            async move { relay.forward(request).await }
        };
        // The completions path is a matched route, as on the gateway's edge; anything else falls back.
        let router = axum::Router::new().route("/v1/chat/completions", axum::routing::post(forward.clone())).fallback(forward);
        axum::serve(listener, router).await
    }
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(KEEP_ALIVE);
    headers.remove(PROXY_CONNECTION);
}

fn failure(status: StatusCode, message: &str) -> Response<RelayBody> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::from(format!("{message}\n")))));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_dropped_and_the_rest_kept() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "close"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("proxy-connection", "x"),
            ("authorization", "Bearer k"),
            ("content-type", "application/json"),
        ] {
            headers.insert(HeaderName::from_static(name), HeaderValue::from_static(value));
        }
        strip_hop_by_hop(&mut headers);
        let mut kept: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        kept.sort_unstable();
        assert_eq!(kept, ["authorization", "content-type"]);
    }
}
