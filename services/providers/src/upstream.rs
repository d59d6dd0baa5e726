//! Calling providers over HTTP: one pooled client, a request per wire format, streamed replies decoded
//! event by event as bytes arrive (nothing buffered beyond the current event; dropping the stream
//! closes the upstream connection, which cancels the call).

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::{Stream, StreamExt};
use serde_json::Value;

use crate::catalog::{AuthStyle, Provider, WireFormat};
use crate::chat::{ChatEvent, ChatReply, ChatRequest};
use crate::sse::{SseEvent, SseParser};
use crate::{anthropic, gemini, openai};

/// The Anthropic API version sent upstream.
const ANTHROPIC_VERSION: &str = "2023-06-01";
/// Longest wait for a non-streamed reply.
const REPLY_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest silence tolerated inside a stream.
const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(120);

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

/// The pooled HTTP client to every provider.
#[derive(Debug, Clone)]
pub struct UpstreamClient {
    http: reqwest::Client,
    /// Endpoint URLs parsed once, by their text: every call goes to one of a few.
    urls: Arc<RwLock<HashMap<String, reqwest::Url>>>,
}

impl UpstreamClient {
    /// A client with connection pooling and `TCP_NODELAY` that never follows redirects (a provider
    /// API answers in place; a redirect is passed on as the provider's error, and the key is never
    /// sent to a host it was not registered for).
    pub fn new() -> Result<Self, UpstreamError> {
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(256)
            .build()
            .map_err(|error| UpstreamError::Transport(error.to_string()))?;
        Ok(UpstreamClient { http, urls: Arc::default() })
    }

    /// `url` parsed, from memory when it was seen before.
    fn endpoint(&self, url: String) -> Result<reqwest::Url, UpstreamError> {
        let known = self.urls.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(&url).cloned();
        if let Some(parsed) = known {
            return Ok(parsed);
        }
        let parsed =
            reqwest::Url::parse(&url).map_err(|error| UpstreamError::Transport(format!("invalid provider URL `{url}`: {error}")))?;
        let mut urls = self.urls.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if urls.len() >= PARSED_URLS {
            urls.clear();
        }
        urls.insert(url, parsed.clone());
        Ok(parsed)
    }

    fn request(&self, target: &Target<'_>, chat: &ChatRequest) -> Result<reqwest::RequestBuilder, UpstreamError> {
        let base = target.base_url.trim_end_matches('/');
        let (url, body) = match target.provider.format {
            WireFormat::OpenAi => (format!("{base}/chat/completions"), openai::build_request(chat, target.model)),
            WireFormat::Anthropic => {
                (format!("{base}/v1/messages"), anthropic::build_request(chat, target.model, target.default_max_tokens))
            }
            WireFormat::Gemini => {
                let method = if chat.stream { "streamGenerateContent?alt=sse" } else { "generateContent" };
                (format!("{base}/v1beta/models/{}:{method}", target.model), gemini::build_request(chat))
            }
        };
        Ok(authorize(self.http.post(self.endpoint(url)?), target.provider, target.api_key).json(&body))
    }

    /// One complete reply.
    pub async fn complete(&self, target: &Target<'_>, chat: &ChatRequest) -> Result<ChatReply, UpstreamError> {
        let chat = with_stream(chat, false);
        let response =
            self.request(target, &chat)?.timeout(REPLY_TIMEOUT).send().await.map_err(|error| transport(&error, target.api_key))?;
        let response = checked(response, target.api_key).await?;
        let body: Value = response.json().await.map_err(|error| UpstreamError::Decode(scrub(&error.to_string(), target.api_key)))?;
        let reply = match target.provider.format {
            WireFormat::OpenAi => openai::parse_reply(&body),
            WireFormat::Anthropic => anthropic::parse_reply(&body),
            WireFormat::Gemini => gemini::parse_reply(&body, target.model),
        };
        reply.map_err(UpstreamError::Decode)
    }

    /// A streamed reply: resolves once the provider accepted the call (status checked), then yields
    /// events as they arrive.
    pub async fn stream(&self, target: &Target<'_>, chat: &ChatRequest) -> Result<EventStream, UpstreamError> {
        let chat = with_stream(chat, true);
        let response = self.request(target, &chat)?.send().await.map_err(|error| transport(&error, target.api_key))?;
        let response = checked(response, target.api_key).await?;
        let reader = match target.provider.format {
            WireFormat::OpenAi => FormatReader::OpenAi(openai::StreamReader),
            WireFormat::Anthropic => FormatReader::Anthropic(anthropic::StreamReader::default()),
            WireFormat::Gemini => FormatReader::Gemini(gemini::StreamReader::default()),
        };
        let state = StreamState {
            bytes: Box::pin(response.bytes_stream()),
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
        let request = match (provider.format, provider.id) {
            // Perplexity lists no models: the smallest possible completion proves the key.
            (WireFormat::OpenAi, "perplexity") => self
                .http
                .post(format!("{base}/chat/completions"))
                .json(&serde_json::json!({"model": "sonar", "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]})),
            (WireFormat::OpenAi, _) => self.http.get(format!("{base}/models")),
            (WireFormat::Anthropic, _) => self.http.get(format!("{base}/v1/models")),
            (WireFormat::Gemini, _) => self.http.get(format!("{base}/v1beta/models")),
        };
        let response = authorize(request, provider, api_key)
            .timeout(Duration::from_secs(20))
            .send()
            .await
            .map_err(|error| transport(&error, api_key))?;
        checked(response, api_key).await.map(|_| ())
    }
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

fn authorize(request: reqwest::RequestBuilder, provider: &Provider, api_key: &str) -> reqwest::RequestBuilder {
    let request = match provider.auth {
        AuthStyle::Bearer => request.bearer_auth(api_key),
        AuthStyle::XApiKey => request.header("x-api-key", api_key),
        AuthStyle::GoogApiKey => request.header("x-goog-api-key", api_key),
        AuthStyle::ApiKeyHeader => request.header("api-key", api_key),
        AuthStyle::None => request,
    };
    match provider.format {
        WireFormat::Anthropic => request.header("anthropic-version", ANTHROPIC_VERSION),
        WireFormat::OpenAi | WireFormat::Gemini => request,
    }
}

/// Turns a non-2xx answer into an error carrying the provider's own message (key scrubbed).
async fn checked(response: reqwest::Response, api_key: &str) -> Result<reqwest::Response, UpstreamError> {
    let status = response.status().as_u16();
    if (200..300).contains(&status) {
        return Ok(response);
    }
    let text = response.text().await.unwrap_or_default();
    let message = serde_json::from_str::<Value>(&text)
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

fn transport(error: &reqwest::Error, api_key: &str) -> UpstreamError {
    if error.is_timeout() { UpstreamError::Timeout } else { UpstreamError::Transport(scrub(&error.to_string(), api_key)) }
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

type ByteStream = Pin<Box<dyn Stream<Item = Result<bytes::Bytes, reqwest::Error>> + Send>>;

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
                return Some((Err(UpstreamError::Transport(error.to_string())), state));
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
    use super::*;

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
}
