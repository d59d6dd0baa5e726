//! Calling providers over HTTP: one pooled client, a request per wire format, streamed replies decoded
//! event by event as bytes arrive (nothing buffered beyond the current event; dropping the stream
//! closes the upstream connection, which cancels the call).

use std::collections::VecDeque;
use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use brainstorm_common::collections::HashMap;
use brainstorm_common::config::EgressProxy;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderName};
use http::{HeaderMap, HeaderValue, Method, Request, Response, Uri};
use http_body_util::{BodyDataStream, BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use serde_json::Value;
use tower::{Service, ServiceExt};

use crate::catalog::{AuthStyle, Provider, WireFormat};
use crate::chat::{ChatEvent, ChatReply, ChatRequest};
use crate::embeddings::{self, EmbeddingReply, EmbeddingRequest};
use crate::sse::{SseEvent, SseParser};
use crate::{anthropic, gemini, openai};

/// The Anthropic API version sent upstream.
const ANTHROPIC_VERSION: &str = "2023-06-01";
/// Longest wait for a non-streamed reply.
const REPLY_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest wait for a key check.
const VALIDATION_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest silence tolerated inside a stream.
const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest wait for a TCP connection (to the provider or to the proxy).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest non-streamed reply (or error body) read from a provider.
const REPLY_LIMIT: usize = 32 * 1024 * 1024;

/// Why an upstream call failed. Messages never contain the provider key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UpstreamError {
    #[error("provider answered {status}: {message}")]
    Status { status: u16, message: String },
    #[error("provider unreachable: {0}")]
    Transport(String),
    #[error("provider timed out")]
    Timeout,
    #[error("provider reply not understood: {0}")]
    Decode(String),
}

impl UpstreamError {
    /// The status to forward to the client.
    pub fn status(&self) -> u16 {
        match self {
            UpstreamError::Status { status, .. } => *status,
            UpstreamError::Transport(_) | UpstreamError::Decode(_) => 502,
            UpstreamError::Timeout => 504,
        }
    }

    /// Whether another candidate might succeed where this one failed (not when the request itself is bad).
    pub fn may_fall_back(&self) -> bool {
        match self {
            UpstreamError::Status { status, .. } => !matches!(status, 400 | 413 | 422),
            UpstreamError::Transport(_) | UpstreamError::Timeout | UpstreamError::Decode(_) => true,
        }
    }
}

/// Where and as whom to call.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub provider: &'static Provider,
    pub base_url: &'a str,
    pub api_key: &'a str,
    /// The model id as the provider knows it.
    pub model: &'a str,
    /// Output budget for formats that require one.
    pub default_max_tokens: u32,
}

/// A stream of neutral events from a provider.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<ChatEvent, UpstreamError>> + Send>>;

/// Most endpoint URLs remembered parsed; past it the memory starts over.
const PARSED_URLS: usize = 1024;

type BoxError = Box<dyn StdError + Send + Sync>;

/// The pooled HTTP client to every provider.
#[derive(Clone)]
pub struct UpstreamClient {
    http: Client<hyper_rustls::HttpsConnector<Egress>, Full<Bytes>>,
    /// Endpoint URLs parsed once, by their text: every call goes to one of a few.
    urls: Arc<RwLock<HashMap<String, Uri>>>,
}

impl std::fmt::Debug for UpstreamClient {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("UpstreamClient").finish_non_exhaustive()
    }
}

/// Opens a connection to a provider: directly, or through an HTTP proxy's `CONNECT` tunnel where
/// the proxy settings say so (TLS then runs end to end inside the tunnel, so the proxy never sees
/// the key).
#[derive(Clone)]
struct Egress {
    direct: HttpConnector,
    proxies: Arc<Matcher>,
}

impl Service<Uri> for Egress {
    type Response = TokioIo<tokio::net::TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.direct.poll_ready(context).map_err(Into::into)
    }

    fn call(&mut self, destination: Uri) -> Self::Future {
        match self.proxies.intercept(&destination) {
            None => {
                let connecting = self.direct.call(destination);
                Box::pin(async move { connecting.await.map_err(Into::into) })
            }
            Some(proxy) => {
                let mut tunnel = Tunnel::new(proxy.uri().clone(), self.direct.clone());
                if let Some(credentials) = proxy.basic_auth() {
                    tunnel = tunnel.with_auth(credentials.clone());
                }
                let destination = with_default_port(destination);
                Box::pin(async move { tunnel.oneshot(destination).await.map_err(Into::into) })
            }
        }
    }
}

/// `uri` with its scheme's port written out (a tunnel asks the proxy for host and port).
fn with_default_port(uri: Uri) -> Uri {
    let (Some(host), None) = (uri.host(), uri.port_u16()) else { return uri };
    let port = if uri.scheme() == Some(&http::uri::Scheme::HTTP) { 80 } else { 443 };
    let authority = format!("{host}:{port}");
    let mut parts = uri.clone().into_parts();
    match authority.parse() {
        Ok(authority) => {
            parts.authority = Some(authority);
            Uri::from_parts(parts).unwrap_or(uri)
        }
        Err(_) => uri,
    }
}

impl UpstreamClient {
    /// A client with connection pooling and `TCP_NODELAY` that never follows redirects (a provider
    /// API answers in place; a redirect is passed on as the provider's error, and the key is never
    /// sent to a host it was not registered for), calling through `proxy` where it says so.
    pub fn new(proxy: &EgressProxy) -> Result<Self, UpstreamError> {
        let mut proxies = Matcher::builder();
        if let Some(all) = &proxy.all {
            proxies = proxies.all(all.expose().to_string());
        }
        if let Some(https) = &proxy.https {
            proxies = proxies.https(https.expose().to_string());
        }
        if let Some(http) = &proxy.http {
            proxies = proxies.http(http.expose().to_string());
        }
        if let Some(no) = &proxy.no {
            proxies = proxies.no(no.clone());
        }
        Self::with_proxies(proxies.build())
    }

    fn with_proxies(proxies: Matcher) -> Result<Self, UpstreamError> {
        let mut direct = HttpConnector::new();
        direct.set_nodelay(true);
        direct.set_connect_timeout(Some(CONNECT_TIMEOUT));
        direct.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
            .map_err(|error| UpstreamError::Transport(format!("TLS setup failed: {error}")))?
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(Egress { direct, proxies: Arc::new(proxies) });
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(256)
            .pool_timer(TokioTimer::new())
            .build(connector);
        Ok(UpstreamClient { http, urls: Arc::default() })
    }

    /// `url` parsed, from memory when it was seen before.
    fn endpoint(&self, url: String) -> Result<Uri, UpstreamError> {
        let known = self.urls.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(&url).cloned();
        if let Some(parsed) = known {
            return Ok(parsed);
        }
        let parsed = parse_endpoint(&url)?;
        let mut urls = self.urls.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if urls.len() >= PARSED_URLS {
            urls.clear();
        }
        urls.insert(url, parsed.clone());
        Ok(parsed)
    }

    fn request(&self, target: &Target<'_>, chat: &ChatRequest) -> Result<Request<Full<Bytes>>, UpstreamError> {
        let base = target.base_url.trim_end_matches('/');
        let (url, body) = match target.provider.format {
            WireFormat::OpenAi => {
                ([base, "/chat/completions"].concat(), json_body(&openai::build_request(chat, target.model, token_limit(target.provider))))
            }
            WireFormat::Anthropic => {
                ([base, "/v1/messages"].concat(), json_body(&anthropic::build_request(chat, target.model, target.default_max_tokens)))
            }
            WireFormat::Gemini => {
                let method = if chat.stream { "streamGenerateContent?alt=sse" } else { "generateContent" };
                ([base, "/v1beta/models/", target.model, ":", method].concat(), json_body(&gemini::build_request(chat)))
            }
        };
        let body = body.map_err(|error| UpstreamError::Decode(error.to_string()))?;
        outgoing(Method::POST, self.endpoint(url)?, target.provider, target.api_key, Some(body))
    }

    /// Sends `request`; resolves with the answer's head once the provider accepted it (2xx).
    async fn send(&self, request: Request<Full<Bytes>>, api_key: &str) -> Result<Response<Incoming>, UpstreamError> {
        let response = self.http.request(request).await.map_err(|error| transport(&error, api_key))?;
        checked(response, api_key).await
    }

    /// The prompt's input tokens as the provider counts them, from Anthropic's `count_tokens` and
    /// Gemini's `countTokens` (free at both, nothing generated); None for a format without such an
    /// endpoint (OpenAI's).
    pub async fn count_tokens(&self, target: &Target<'_>, chat: &ChatRequest) -> Result<Option<u64>, UpstreamError> {
        let chat = with_stream(chat, false);
        let base = target.base_url.trim_end_matches('/');
        let (url, body, member) = match target.provider.format {
            WireFormat::OpenAi => return Ok(None),
            WireFormat::Anthropic => {
                // The endpoint takes the prompt's members and refuses the others (`max_tokens` too).
                let mut body = serde_json::to_value(anthropic::build_request(&chat, target.model, target.default_max_tokens))
                    .map_err(|error| UpstreamError::Decode(error.to_string()))?;
                if let Some(members) = body.as_object_mut() {
                    members.retain(|name, _| ANTHROPIC_COUNTED.contains(&name.as_str()));
                }
                ([base, "/v1/messages/count_tokens"].concat(), body, "input_tokens")
            }
            WireFormat::Gemini => {
                let mut request = gemini::build_request(&chat);
                if let Some(members) = request.as_object_mut() {
                    members.insert("model".to_string(), Value::String(["models/", target.model].concat()));
                }
                let body = serde_json::json!({"generateContentRequest": request});
                ([base, "/v1beta/models/", target.model, ":countTokens"].concat(), body, "totalTokens")
            }
        };
        let answer = self.post_json(target, url, &body).await?;
        serde_json::from_slice::<Value>(&answer)
            .ok()
            .and_then(|answer| answer.get(member).and_then(Value::as_u64))
            .map(Some)
            .ok_or_else(|| UpstreamError::Decode(format!("the token count carries no `{member}`")))
    }

    /// The vectors of an embeddings request, from OpenAI-format providers' `/embeddings` and
    /// Gemini's `batchEmbedContents` (Anthropic's API has none: routing sends it no such request).
    pub async fn embed(&self, target: &Target<'_>, request: &EmbeddingRequest) -> Result<EmbeddingReply, UpstreamError> {
        let base = target.base_url.trim_end_matches('/');
        let (url, body) = match target.provider.format {
            WireFormat::OpenAi => ([base, "/embeddings"].concat(), embeddings::openai_body(request, target.model)),
            WireFormat::Gemini => {
                ([base, "/v1beta/models/", target.model, ":batchEmbedContents"].concat(), embeddings::gemini_body(request, target.model))
            }
            WireFormat::Anthropic => {
                return Err(UpstreamError::Status { status: 400, message: format!("{} has no embeddings API", target.provider.name) });
            }
        };
        let answer = self.post_json(target, url, &body).await?;
        let reply = match target.provider.format {
            WireFormat::Gemini => embeddings::parse_gemini_reply(&answer, request.inputs.len()),
            _ => embeddings::parse_openai_reply(&answer, request.inputs.len()),
        };
        reply.map_err(UpstreamError::Decode)
    }

    /// `body` posted to the provider's `url` with its key; the whole answer of a 2xx.
    async fn post_json(&self, target: &Target<'_>, url: String, body: &Value) -> Result<Bytes, UpstreamError> {
        let body = json_body(body).map_err(|error| UpstreamError::Decode(error.to_string()))?;
        let request = outgoing(Method::POST, self.endpoint(url)?, target.provider, target.api_key, Some(body))?;
        self.answer(request, target.api_key).await
    }

    /// The whole answer to `request` (a 2xx), within the reply timeout.
    async fn answer(&self, request: Request<Full<Bytes>>, api_key: &str) -> Result<Bytes, UpstreamError> {
        tokio::time::timeout(REPLY_TIMEOUT, async {
            let response = self.send(request, api_key).await?;
            read_body(response.into_body(), api_key).await
        })
        .await
        .map_err(|_| UpstreamError::Timeout)?
    }

    /// One complete reply.
    pub async fn complete(&self, target: &Target<'_>, chat: &ChatRequest) -> Result<ChatReply, UpstreamError> {
        let chat = with_stream(chat, false);
        let request = self.request(target, &chat)?;
        let body = self.answer(request, target.api_key).await?;
        let tree = || serde_json::from_slice::<Value>(&body).map_err(|error| error.to_string());
        let reply = match target.provider.format {
            WireFormat::OpenAi => openai::parse_reply(&body),
            WireFormat::Anthropic => anthropic::parse_reply_body(&body),
            WireFormat::Gemini => tree().and_then(|body| gemini::parse_reply(&body, target.model)),
        };
        reply.map_err(UpstreamError::Decode)
    }

    /// A streamed reply: resolves once the provider accepted the call (status checked), then yields
    /// events as they arrive.
    pub async fn stream(&self, target: &Target<'_>, chat: &ChatRequest) -> Result<EventStream, UpstreamError> {
        let chat = with_stream(chat, true);
        let request = self.request(target, &chat)?;
        let response =
            tokio::time::timeout(REPLY_TIMEOUT, self.send(request, target.api_key)).await.map_err(|_| UpstreamError::Timeout)??;
        let reader = match target.provider.format {
            WireFormat::OpenAi => FormatReader::OpenAi(openai::StreamReader),
            WireFormat::Anthropic => FormatReader::Anthropic(anthropic::StreamReader::default()),
            WireFormat::Gemini => FormatReader::Gemini(gemini::StreamReader::default()),
        };
        let state = StreamState {
            bytes: Box::pin(BodyDataStream::new(response.into_body())),
            parser: SseParser::default(),
            reader,
            pending: VecDeque::new(),
            done: false,
        };
        Ok(Box::pin(futures::stream::unfold(state, next_event)))
    }

    /// Checks a key against the provider without spending tokens where the provider allows it
    /// (a model listing); Ok means the provider accepted the key.
    pub async fn validate_key(&self, provider: &'static Provider, base_url: &str, api_key: &str) -> Result<(), UpstreamError> {
        let base = base_url.trim_end_matches('/');
        let (method, url, body) = match (provider.format, provider.id) {
            // Perplexity lists no models: the smallest possible completion proves the key.
            (WireFormat::OpenAi, "perplexity") => (
                Method::POST,
                format!("{base}/chat/completions"),
                Some(br#"{"model":"sonar","max_tokens":1,"messages":[{"role":"user","content":"ping"}]}"#.to_vec()),
            ),
            (WireFormat::OpenAi, _) => (Method::GET, format!("{base}/models"), None),
            (WireFormat::Anthropic, _) => (Method::GET, format!("{base}/v1/models"), None),
            (WireFormat::Gemini, _) => (Method::GET, format!("{base}/v1beta/models"), None),
        };
        let request = outgoing(method, parse_endpoint(&url)?, provider, api_key, body)?;
        tokio::time::timeout(VALIDATION_TIMEOUT, async {
            let response = self.send(request, api_key).await?;
            // Drain the listing so the connection goes back to the pool.
            read_body(response.into_body(), api_key).await.map(|_| ())
        })
        .await
        .map_err(|_| UpstreamError::Timeout)?
    }
}

/// OpenAI's own API and Azure's take the answer's limit as `max_completion_tokens` (their reasoning
/// models refuse `max_tokens`); every other OpenAI-compatible server reads `max_tokens`.
fn token_limit(provider: &Provider) -> openai::TokenLimit {
    match provider.id {
        "openai" | "azure-openai" => openai::TokenLimit::MaxCompletionTokens,
        _ => openai::TokenLimit::MaxTokens,
    }
}

/// The members Anthropic's `count_tokens` takes of a messages body.
const ANTHROPIC_COUNTED: [&str; 6] = ["model", "messages", "system", "tools", "tool_choice", "thinking"];

/// A request body as JSON, written into a buffer sized for a typical request (`to_vec` starts at 128
/// bytes and grew two or three times for one).
fn json_body(body: &impl serde::Serialize) -> serde_json::Result<Vec<u8>> {
    let mut buffer = Vec::with_capacity(1024);
    serde_json::to_writer(&mut buffer, body)?;
    Ok(buffer)
}

fn parse_endpoint(url: &str) -> Result<Uri, UpstreamError> {
    let parsed: Uri = url.parse().map_err(|error| UpstreamError::Transport(format!("invalid provider URL `{url}`: {error}")))?;
    if parsed.scheme().is_none() || parsed.authority().is_none() {
        return Err(UpstreamError::Transport(format!("invalid provider URL `{url}`: not an absolute http(s) URL")));
    }
    Ok(parsed)
}

/// A request to a provider: JSON body (when there is one), the key in the provider's header.
fn outgoing(
    method: Method,
    uri: Uri,
    provider: &Provider,
    api_key: &str,
    body: Option<Vec<u8>>,
) -> Result<Request<Full<Bytes>>, UpstreamError> {
    let has_body = body.is_some();
    let mut request = Request::new(Full::new(body.map(Bytes::from).unwrap_or_default()));
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    let headers = request.headers_mut();
    headers.reserve(4);
    headers.insert(ACCEPT, HeaderValue::from_static("*/*"));
    if has_body {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    authorize(headers, provider, api_key)?;
    Ok(request)
}

/// `chat` asking for a stream or not: borrowed when it already does (the usual case), else a copy.
fn with_stream(chat: &ChatRequest, stream: bool) -> std::borrow::Cow<'_, ChatRequest> {
    if chat.stream == stream {
        return std::borrow::Cow::Borrowed(chat);
    }
    let mut copy = chat.clone();
    copy.stream = stream;
    std::borrow::Cow::Owned(copy)
}

fn authorize(headers: &mut HeaderMap, provider: &Provider, api_key: &str) -> Result<(), UpstreamError> {
    let (name, value) = match provider.auth {
        AuthStyle::Bearer => (AUTHORIZATION, HeaderValue::try_from(["Bearer ", api_key].concat())),
        AuthStyle::XApiKey => (HeaderName::from_static("x-api-key"), HeaderValue::try_from(api_key)),
        AuthStyle::GoogApiKey => (HeaderName::from_static("x-goog-api-key"), HeaderValue::try_from(api_key)),
        AuthStyle::ApiKeyHeader => (HeaderName::from_static("api-key"), HeaderValue::try_from(api_key)),
        AuthStyle::None => {
            anthropic_version(headers, provider);
            return Ok(());
        }
    };
    let mut value =
        value.map_err(|_| UpstreamError::Transport("the provider key holds characters an HTTP header cannot carry".to_string()))?;
    value.set_sensitive(true);
    headers.insert(name, value);
    anthropic_version(headers, provider);
    Ok(())
}

fn anthropic_version(headers: &mut HeaderMap, provider: &Provider) {
    if provider.format == WireFormat::Anthropic {
        headers.insert(HeaderName::from_static("anthropic-version"), HeaderValue::from_static(ANTHROPIC_VERSION));
    }
}

/// Turns a non-2xx answer into an error carrying the provider's own message (key scrubbed).
async fn checked(response: Response<Incoming>, api_key: &str) -> Result<Response<Incoming>, UpstreamError> {
    let status = response.status().as_u16();
    if (200..300).contains(&status) {
        return Ok(response);
    }
    let body = read_body(response.into_body(), api_key).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&body);
    let message = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|body| {
            body.pointer("/error/message")
                .or_else(|| body.get("message"))
                .or_else(|| body.get("error"))
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_else(|| text.chars().take(300).collect());
    Err(UpstreamError::Status { status, message: scrub(&message, api_key) })
}

/// A whole body, up to `REPLY_LIMIT`.
async fn read_body(body: Incoming, api_key: &str) -> Result<Bytes, UpstreamError> {
    match Limited::new(body, REPLY_LIMIT).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            Err(UpstreamError::Decode(format!("the reply is larger than {} MiB", REPLY_LIMIT / (1024 * 1024))))
        }
        Err(error) => Err(UpstreamError::Transport(scrub(&error_chain(error.as_ref()), api_key))),
    }
}

/// An error and its causes, outermost first (`client error (Connect): tcp connect error: ...`).
fn error_chain(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

fn transport(error: &hyper_util::client::legacy::Error, api_key: &str) -> UpstreamError {
    UpstreamError::Transport(scrub(&error_chain(error), api_key))
}

/// Removes every occurrence of the key (and its longer fragments) from a provider's text.
pub fn scrub(text: &str, api_key: &str) -> String {
    if api_key.len() < 8 {
        return text.to_string();
    }
    let mut cleaned = text.replace(api_key, "[REDACTED]");
    // Providers sometimes echo a key partly masked: drop any 12-character run of it as well.
    let characters: Vec<char> = api_key.chars().collect();
    for window in characters.windows(12) {
        let fragment: String = window.iter().collect();
        if cleaned.contains(&fragment) {
            cleaned = cleaned.replace(&fragment, "[REDACTED]");
        }
    }
    cleaned
}

enum FormatReader {
    OpenAi(openai::StreamReader),
    Anthropic(anthropic::StreamReader),
    Gemini(gemini::StreamReader),
}

impl FormatReader {
    fn read(&mut self, event: &SseEvent) -> Result<Vec<ChatEvent>, String> {
        match self {
            FormatReader::OpenAi(reader) => reader.read(&event.data),
            FormatReader::Anthropic(reader) => reader.read(&event.data),
            FormatReader::Gemini(reader) => reader.read(&event.data),
        }
    }
}

type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, hyper::Error>> + Send>>;

struct StreamState {
    bytes: ByteStream,
    parser: SseParser,
    reader: FormatReader,
    pending: VecDeque<ChatEvent>,
    done: bool,
}

async fn next_event(mut state: StreamState) -> Option<(Result<ChatEvent, UpstreamError>, StreamState)> {
    loop {
        if let Some(event) = state.pending.pop_front() {
            return Some((Ok(event), state));
        }
        if state.done {
            return None;
        }
        let next = match tokio::time::timeout(STREAM_IDLE_TIMEOUT, state.bytes.next()).await {
            Ok(next) => next,
            Err(_) => {
                state.done = true;
                return Some((Err(UpstreamError::Timeout), state));
            }
        };
        let events = match next {
            Some(Ok(bytes)) => state.parser.push(&bytes),
            Some(Err(error)) => {
                state.done = true;
                return Some((Err(UpstreamError::Transport(error_chain(&error))), state));
            }
            None => {
                state.done = true;
                state.parser.finish().into_iter().collect()
            }
        };
        for event in events {
            match state.reader.read(&event) {
                Ok(chat_events) => state.pending.extend(chat_events),
                Err(message) => {
                    state.done = true;
                    return Some((Err(UpstreamError::Decode(message)), state));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use axum::Router;
    use axum::routing::{get, post};
    use brainstorm_common::config::Secret;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;
    use crate::catalog::provider_by_id;
    use crate::chat::{Message, Part, Role};

    #[test]
    fn keys_are_scrubbed_from_provider_text() {
        let key = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWXYZ123456";
        let echoed = format!("Incorrect API key provided: {key}. Also sk-proj-ABCDEFGHIJ****3456 and ...MNOPQRSTUVWXYZ12...");
        let cleaned = scrub(&echoed, key);
        assert!(!cleaned.contains("ABCDEFGHIJKLMNOP"), "{cleaned}");
        assert!(!cleaned.contains("MNOPQRSTUVWXYZ12"), "{cleaned}");
        assert!(cleaned.starts_with("Incorrect API key provided: [REDACTED]"));
    }

    #[test]
    fn only_bad_requests_stop_the_fallback() {
        assert!(!UpstreamError::Status { status: 400, message: String::new() }.may_fall_back());
        assert!(UpstreamError::Status { status: 429, message: String::new() }.may_fall_back());
        assert!(UpstreamError::Status { status: 401, message: String::new() }.may_fall_back());
        assert!(UpstreamError::Timeout.may_fall_back());
        assert_eq!(UpstreamError::Timeout.status(), 504);
    }

    const KEY: &str = "sk-test-0123456789abcdefghijklmnop";

    /// A provider answering OpenAI's chat completions and redirecting `/moved`; remembers the
    /// authorization header and body of each call.
    async fn provider() -> (String, Arc<Mutex<Vec<(String, Value)>>>) {
        let seen: Arc<Mutex<Vec<(String, Value)>>> = Arc::default();
        let log = seen.clone();
        let app = Router::new()
            .route(
                "/v1/chat/completions",
                post(move |headers: axum::http::HeaderMap, body: axum::Json<Value>| async move {
                    let authorization = headers.get("authorization").and_then(|value| value.to_str().ok()).unwrap_or_default();
                    log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((authorization.to_string(), body.0));
                    axum::Json(serde_json::json!({
                        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
                    }))
                }),
            )
            .route("/moved/chat/completions", post(|| async { axum::response::Redirect::temporary("/v1/chat/completions") }))
            .route("/v1/models", get(|| async { axum::Json(serde_json::json!({"data": []})) }));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|error| panic!("bind: {error}"));
        let address = listener.local_addr().unwrap_or_else(|error| panic!("address: {error}"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        (format!("http://{address}"), seen)
    }

    /// An HTTP proxy that only tunnels (`CONNECT`), remembering each CONNECT request's head.
    async fn tunnelling_proxy() -> (String, Arc<Mutex<Vec<String>>>) {
        let heads: Arc<Mutex<Vec<String>>> = Arc::default();
        let log = heads.clone();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|error| panic!("bind: {error}"));
        let address = listener.local_addr().unwrap_or_else(|error| panic!("address: {error}"));
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let log = log.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        if client.read_exact(&mut byte).await.is_err() {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    let head = String::from_utf8_lossy(&head).to_string();
                    log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(head.clone());
                    let target = head.split_whitespace().nth(1).unwrap_or_default().to_string();
                    let Ok(mut upstream) = TcpStream::connect(target).await else { return };
                    if client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await.is_ok() {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                    }
                });
            }
        });
        (format!("http://{address}"), heads)
    }

    /// A client calling through the HTTP proxy at `proxy`, except to the hosts in `no_proxy`.
    fn client_via(proxy: &str, no_proxy: &str) -> Result<UpstreamClient, UpstreamError> {
        let proxy = EgressProxy { all: Some(Secret::new(proxy)), no: Some(no_proxy.to_string()), ..EgressProxy::default() };
        UpstreamClient::new(&proxy)
    }

    fn chat() -> ChatRequest {
        ChatRequest {
            model: "openai/gpt-4o-mini".to_string(),
            messages: vec![Message { role: Role::User, parts: vec![Part::Text("hi".to_string())] }],
            max_tokens: Some(16),
            ..ChatRequest::default()
        }
    }

    fn openai() -> &'static Provider {
        provider_by_id("openai").unwrap_or_else(|| panic!("openai is in the catalog"))
    }

    fn target<'a>(base_url: &'a str) -> Target<'a> {
        Target { provider: openai(), base_url, api_key: KEY, model: "gpt-4o-mini", default_max_tokens: 1024 }
    }

    #[tokio::test]
    async fn a_completion_carries_the_key_and_the_body_and_reads_the_reply() {
        let (base, seen) = provider().await;
        let client = client_via("http://127.0.0.1:9", "127.0.0.1").unwrap_or_else(|error| panic!("{error}"));
        let base_url = format!("{base}/v1");
        // Twice: the second call reuses the pooled connection and the parsed URL.
        for _ in 0..2 {
            let reply = client.complete(&target(&base_url), &chat()).await.unwrap_or_else(|error| panic!("{error}"));
            assert_eq!(reply.usage.input_tokens, 5);
            assert_eq!(reply.usage.output_tokens, 1);
        }
        let seen = seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].0, format!("Bearer {KEY}"));
        assert_eq!(seen[0].1["model"], "gpt-4o-mini");
        assert_eq!(seen[0].1["max_completion_tokens"], 16);
        assert_eq!(seen[0].1["messages"][0]["content"], "hi");
        client.validate_key(openai(), &base_url, KEY).await.unwrap_or_else(|error| panic!("{error}"));
    }

    #[tokio::test]
    async fn calls_go_through_the_proxy_tunnel_with_its_credentials() {
        let (base, seen) = provider().await;
        let (proxy, heads) = tunnelling_proxy().await;
        let with_credentials = proxy.replace("http://", "http://agent:s3cret@");
        let client = client_via(&with_credentials, "").unwrap_or_else(|error| panic!("{error}"));
        let base_url = format!("{base}/v1");
        client.complete(&target(&base_url), &chat()).await.unwrap_or_else(|error| panic!("{error}"));
        let heads = heads.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let authority = base.trim_start_matches("http://");
        assert_eq!(heads.len(), 1, "{heads:?}");
        assert!(heads[0].starts_with(&format!("CONNECT {authority} HTTP/1.1")), "{}", heads[0]);
        // Basic base64("agent:s3cret")
        assert!(heads[0].to_ascii_lowercase().contains("proxy-authorization: basic ywdlbnq6cznjcmv0"), "{}", heads[0]);
        assert!(!heads[0].contains(KEY), "the proxy never sees the provider key");
        assert_eq!(seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len(), 1);
    }

    #[tokio::test]
    async fn no_proxy_hosts_are_called_directly() {
        let (base, seen) = provider().await;
        let (proxy, heads) = tunnelling_proxy().await;
        let client = client_via(&proxy, "127.0.0.1").unwrap_or_else(|error| panic!("{error}"));
        client.complete(&target(&format!("{base}/v1")), &chat()).await.unwrap_or_else(|error| panic!("{error}"));
        assert!(heads.lock().unwrap_or_else(std::sync::PoisonError::into_inner).is_empty());
        assert_eq!(seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len(), 1);
    }

    #[tokio::test]
    async fn redirects_are_not_followed_and_failures_say_why() {
        let (base, seen) = provider().await;
        let client = client_via("http://127.0.0.1:9", "127.0.0.1").unwrap_or_else(|error| panic!("{error}"));
        let moved = format!("{base}/moved");
        let error = client.complete(&target(&moved), &chat()).await.err();
        assert!(matches!(error, Some(UpstreamError::Status { status: 307, .. })), "{error:?}");
        assert!(seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner).is_empty());

        // Nothing listens on a port just released: the error names the cause, never the key.
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|error| panic!("bind: {error}"));
        let address = closed.local_addr().unwrap_or_else(|error| panic!("address: {error}"));
        drop(closed);
        let refused = format!("http://{address}/v1");
        match client.complete(&target(&refused), &chat()).await {
            Err(UpstreamError::Transport(message)) => {
                assert!(message.to_lowercase().contains("refused"), "{message}");
                assert!(!message.contains(KEY));
            }
            other => panic!("expected a transport error, got {other:?}"),
        }
        assert!(matches!(client.complete(&target("not a url"), &chat()).await, Err(UpstreamError::Transport(_))));
    }
}
