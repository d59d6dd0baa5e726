//! The fan-out's way out: every request to a destination (deliveries and tests) leaves through one
//! `Egress`, which refuses a URL whose host is `localhost` or a private, loopback, link-local or
//! unspecified address unless the operator allows those (`BR_OBSERVABILITY_ALLOW_PRIVATE_URLS`),
//! and whose client follows redirects only within one origin (a public destination must not
//! bounce the gateway's request into its network). The rule is applied to the URL a request is
//! finally built with, so members that only name part of it (an S3 bucket and region, a Datadog
//! site) are judged too, and a destination saved while the operator allowed private addresses
//! stops once they no longer do.
//! Names are judged when the client resolves them (`common::net::tenant_http_client`), as for MCP
//! servers and guardrail endpoints.

use std::time::Duration;

use brainstorm_common::net::{UrlRefusal, tenant_url};

use crate::formats::HttpRequest;

/// One request's limit.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a request did not deliver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendError {
    /// What happened, for the log and the test route's answer.
    pub message: String,
    /// Whether the same request may succeed later (no connection, a timeout, 408, 429, 5xx).
    pub transient: bool,
    /// The destination's `Retry-After`, in seconds, when it gave one.
    pub retry_after: Option<Duration>,
}

impl SendError {
    /// A failure that will not pass by sending again.
    pub fn permanent(message: String) -> SendError {
        SendError { message, transient: false, retry_after: None }
    }
}

impl std::fmt::Display for SendError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&self.message)
    }
}

/// The HTTP client and the rule on where it may go.
#[derive(Debug, Clone)]
pub struct Egress {
    http: reqwest::Client,
    allow_private: bool,
}

impl Egress {
    /// An egress that reaches private addresses only when `allow_private`.
    pub fn new(allow_private: bool) -> Egress {
        let http = brainstorm_common::net::tenant_http_client(allow_private).build().unwrap_or_default();
        Egress { http, allow_private }
    }

    /// Whether a request may go to `url`: an http(s) URL with a host that is public, or any host
    /// when private ones are allowed.
    pub fn permits(&self, url: &str) -> Result<(), String> {
        match tenant_url(url, self.allow_private) {
            Ok(_) => Ok(()),
            Err(UrlRefusal::NotUrl) => Err("the destination's URL is not a URL".to_string()),
            Err(UrlRefusal::NotHttp) => Err("the destination's URL must be http(s)".to_string()),
            Err(UrlRefusal::NoHost) => Err("the destination's URL has no host".to_string()),
            Err(UrlRefusal::Private(host)) => Err(format!(
                "the destination's host `{host}` is localhost or a private, loopback or link-local address; the operator allows those with BR_OBSERVABILITY_ALLOW_PRIVATE_URLS"
            )),
        }
    }

    /// Sends one request; Ok when the destination answered 2xx (a redirect to another origin is
    /// not followed and counts as a refusal).
    pub async fn send(&self, request: HttpRequest) -> Result<(), SendError> {
        self.permits(&request.url).map_err(SendError::permanent)?;
        let method = reqwest::Method::from_bytes(request.method.as_bytes()).map_err(|error| SendError::permanent(error.to_string()))?;
        let mut builder = self.http.request(method, &request.url).timeout(REQUEST_TIMEOUT).body(request.body);
        for (name, value) in &request.headers {
            builder = builder.header(name, value);
        }
        let response = builder.send().await.map_err(|error| SendError {
            // A request the client could not even build (a bad header value) will not build later.
            transient: !error.is_builder(),
            message: format!("cannot reach the destination: {}", error.without_url()),
            retry_after: None,
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = response.text().await.unwrap_or_default();
        Err(SendError {
            message: format!("the destination answered HTTP {}: {}", status.as_u16(), body.chars().take(200).collect::<String>()),
            transient: status.is_server_error() || status.as_u16() == 408 || status.as_u16() == 429,
            retry_after,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_hosts_are_refused_unless_the_operator_allows_them() {
        let strict = Egress::new(false);
        for url in [
            "http://127.0.0.1:9000/x",
            "http://localhost/x",
            "https://169.254.169.254/latest/meta-data",
            "http://10.1.2.3/hook",
            "http://[::1]:8080/",
            "http://0.0.0.0/",
            "https://user@192.168.1.10/hook",
        ] {
            assert!(strict.permits(url).is_err(), "{url}");
            assert!(Egress::new(true).permits(url).is_ok(), "{url}");
        }
        for url in ["https://hooks.example.com/x", "https://http-intake.logs.datadoghq.com/api/v2/logs", "http://otel-collector:4318"] {
            assert!(strict.permits(url).is_ok(), "{url}");
        }
        for url in ["ftp://hooks.example.com/x", "not a url", "file:///etc/passwd"] {
            assert!(Egress::new(true).permits(url).is_err(), "{url}");
        }
    }

    #[tokio::test]
    async fn a_refused_host_is_not_contacted_and_redirects_are_not_followed() -> Result<(), Box<dyn std::error::Error>> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let contacted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = contacted.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buffer = [0u8; 4096];
                    let _ = socket.read(&mut buffer).await;
                    let answer =
                        "HTTP/1.1 302 Found\r\nlocation: http://169.254.169.254/latest\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
                    let _ = socket.write_all(answer.as_bytes()).await;
                });
            }
        });
        let request = || HttpRequest { method: "POST", url: format!("http://{address}/hook"), headers: Vec::new(), body: b"{}".to_vec() };
        let refused = Egress::new(false).send(request()).await.err().ok_or("a private host must be refused")?;
        assert!(!refused.transient && refused.message.contains("BR_OBSERVABILITY_ALLOW_PRIVATE_URLS"), "{refused}");
        assert_eq!(contacted.load(std::sync::atomic::Ordering::SeqCst), 0);
        let redirected = Egress::new(true).send(request()).await.err().ok_or("a redirect is not a delivery")?;
        assert!(redirected.message.contains("HTTP 302") && !redirected.transient, "{redirected}");
        assert_eq!(contacted.load(std::sync::atomic::Ordering::SeqCst), 1);
        Ok(())
    }
}
