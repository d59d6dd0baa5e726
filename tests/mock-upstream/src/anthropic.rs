//! The Anthropic wire format: messages (plain and SSE events), the model list and the error body.

use axum::response::Response;
use bytes::{BufMut, BytesMut};
use http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::conversation::{Prompt, Provider, Reply, Step, Stop, StreamSteps, count_words};
use crate::openai;
use crate::respond::{self, Render};

pub(crate) const MODELS: [(&str, &str); 3] = [
    ("claude-sonnet-4-20250514", "Claude Sonnet 4"),
    ("claude-opus-4-20250514", "Claude Opus 4"),
    ("claude-3-5-haiku-20241022", "Claude Haiku 3.5"),
];
const MODELS_CREATED_AT: &str = "2025-05-22T00:00:00Z";

/// The key of `x-api-key`, or else of `Authorization: Bearer`.
pub(crate) fn api_key(headers: &HeaderMap) -> Option<&str> {
    headers.get("x-api-key").and_then(|value| value.to_str().ok()).or_else(|| openai::bearer(headers))
}

pub(crate) fn has_version(headers: &HeaderMap) -> bool {
    headers.contains_key("anthropic-version")
}

pub(crate) fn error(status: StatusCode, message: &str) -> Response {
    respond::json(status, &error_body(status, message))
}

pub(crate) fn error_body(status: StatusCode, message: &str) -> Value {
    let kind = match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    };
    json!({ "type": "error", "error": { "type": kind, "message": message } })
}

pub(crate) fn unauthorized(key_opt: Option<&str>) -> Response {
    let message = match key_opt {
        None => "x-api-key header is required",
        Some(_) => "invalid x-api-key",
    };
    error(StatusCode::UNAUTHORIZED, message)
}

pub(crate) fn missing_version() -> Response {
    error(StatusCode::BAD_REQUEST, "anthropic-version: header is required")
}

pub(crate) fn models() -> Response {
    let data: Vec<Value> = MODELS.iter().map(|(id, display_name)| model_body(id, display_name)).collect();
    let first_id = MODELS.first().map(|(id, _)| *id);
    let last_id = MODELS.last().map(|(id, _)| *id);
    respond::json(StatusCode::OK, &json!({ "data": data, "has_more": false, "first_id": first_id, "last_id": last_id }))
}

pub(crate) fn model(id: &str) -> Response {
    let display_name = MODELS.iter().find(|(known, _)| *known == id).map_or(id, |(_, display_name)| display_name);
    respond::json(StatusCode::OK, &model_body(id, display_name))
}

fn model_body(id: &str, display_name: &str) -> Value {
    json!({ "type": "model", "id": id, "display_name": display_name, "created_at": MODELS_CREATED_AT })
}

#[derive(Debug, Deserialize)]
pub(crate) struct MessagesRequest {
    model: String,
    max_tokens: Option<u64>,
    messages: Vec<Message>,
    system: Option<Content>,
    stream: Option<bool>,
    tools: Option<Vec<Tool>>,
    tool_choice: Option<ToolChoice>,
    thinking: Option<ThinkingConfig>,
}

#[derive(Debug, Deserialize)]
struct ThinkingConfig {
    #[serde(rename = "type")]
    kind: String,
    budget_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct Message {
    role: String,
    content: Content,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

#[derive(Debug, Deserialize)]
struct Block {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    /// The result of a `tool_result` block.
    content: Option<Content>,
    cache_control: Option<CacheControl>,
    /// A `thinking` block's text and signature.
    thinking: Option<String>,
    signature: Option<String>,
    /// A `document` block's source.
    source: Option<DocumentSource>,
}

/// Where a document is, as Anthropic takes it: a PDF in base64 or by URL, or plain text.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum DocumentSource {
    Base64 { media_type: String, data: String },
    Url { url: String },
    Text { media_type: String, data: String },
    Content { content: Content },
}

impl Block {
    /// As Anthropic checks a `document` block.
    fn check(&self, at: &str) -> Result<(), String> {
        if self.kind != "document" {
            return Ok(());
        }
        match &self.source {
            None => Err(format!("{at}.source: Field required")),
            Some(DocumentSource::Base64 { media_type, data }) if media_type != "application/pdf" || data.is_empty() => {
                Err(format!("{at}.source.base64.media_type: Input should be 'application/pdf'"))
            }
            Some(DocumentSource::Text { media_type, .. }) if media_type != "text/plain" => {
                Err(format!("{at}.source.text.media_type: Input should be 'text/plain'"))
            }
            Some(DocumentSource::Url { url }) if !url.starts_with("http") => Err(format!("{at}.source.url.url: invalid URL")),
            Some(_) => Ok(()),
        }
    }

    /// The words of a plain-text document.
    fn document_words(&self) -> u64 {
        match &self.source {
            Some(DocumentSource::Text { data, .. }) => count_words(data),
            Some(DocumentSource::Content { content }) => content.words(),
            _ => 0,
        }
    }
}

#[derive(Debug, Deserialize)]
struct CacheControl {
    #[serde(rename = "type")]
    kind: String,
    ttl: Option<String>,
}

/// The prompt prefix up to the last cache breakpoint: its digest, words, and whether kept an hour.
pub(crate) struct Breakpoint {
    pub digest: u64,
    words: u64,
    long: bool,
}

/// What the cache did for one request: the prefix's words were written, or read.
pub(crate) struct CacheUse {
    words: u64,
    read: bool,
    long: bool,
}

impl Breakpoint {
    /// The use of a prefix (Anthropic caches from 1,024 tokens): read when it was cached before.
    pub fn used(&self, cached_before: bool) -> Option<CacheUse> {
        (self.words >= crate::conversation::CACHE_MINIMUM).then_some(CacheUse { words: self.words, read: cached_before, long: self.long })
    }
}

#[derive(Debug, Deserialize)]
struct Tool {
    name: String,
}

#[derive(Debug, Deserialize)]
struct ToolChoice {
    #[serde(rename = "type")]
    kind: String,
}

impl Content {
    /// The text blocks' text, when there is any.
    fn text(&self) -> Option<String> {
        match self {
            Content::Text(text) => Some(text.clone()),
            Content::Blocks(blocks) => {
                let texts: Vec<&str> =
                    blocks.iter().filter(|block| block.kind == "text").filter_map(|block| block.text.as_deref()).collect();
                (!texts.is_empty()).then(|| texts.join("\n"))
            }
        }
    }

    /// Words of the text blocks and of the tool results' text.
    fn words(&self) -> u64 {
        match self {
            Content::Text(text) => count_words(text),
            Content::Blocks(blocks) => blocks
                .iter()
                .map(|block| {
                    block.text.as_deref().map_or(0, count_words) + block.content.as_ref().map_or(0, Content::words) + block.document_words()
                })
                .sum(),
        }
    }

    fn has_tool_result(&self) -> bool {
        match self {
            Content::Text(_) => false,
            Content::Blocks(blocks) => blocks.iter().any(|block| block.kind == "tool_result"),
        }
    }
}

impl MessagesRequest {
    fn thinking_enabled(&self) -> bool {
        self.thinking.as_ref().is_some_and(|thinking| thinking.kind == "enabled")
    }

    /// As Anthropic checks it with thinking on: the last assistant turn, when it calls a tool, starts
    /// with its thinking, every thinking block signed as the mock signed it.
    fn check_thinking_returned(&self) -> Result<(), String> {
        let Some((position, message)) = self.messages.iter().enumerate().rev().find(|(_, message)| message.role == "assistant") else {
            return Ok(());
        };
        let Content::Blocks(blocks) = &message.content else { return Ok(()) };
        if !blocks.iter().any(|block| block.kind == "tool_use") {
            return Ok(());
        }
        match blocks.first().map(|block| block.kind.as_str()) {
            Some("thinking" | "redacted_thinking") => {}
            found => {
                return Err(format!(
                    "messages.{position}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{}`. When `thinking` is enabled, a final `assistant` message must start with a thinking block",
                    found.unwrap_or("nothing")
                ));
            }
        }
        for block in blocks.iter().filter(|block| block.kind == "thinking") {
            let text = block.thinking.as_deref().unwrap_or_default();
            if block.signature.as_deref() != Some(crate::conversation::sign(text).as_str()) {
                return Err(format!("messages.{position}.content: invalid `signature` in `thinking` block"));
            }
        }
        Ok(())
    }

    /// The prefix through the last block marked `cache_control` (system blocks, then messages'), if any.
    pub fn breakpoint(&self) -> Option<Breakpoint> {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.model.hash(&mut hasher);
        let (mut words, mut found) = (0, None);
        let system = self.system.iter().map(|content| ("system", content));
        for (role, content) in system.chain(self.messages.iter().map(|message| (message.role.as_str(), &message.content))) {
            role.hash(&mut hasher);
            let blocks = match content {
                Content::Text(text) => {
                    text.hash(&mut hasher);
                    words += count_words(text);
                    continue;
                }
                Content::Blocks(blocks) => blocks,
            };
            for block in blocks {
                block.kind.hash(&mut hasher);
                block.text.hash(&mut hasher);
                words += block.text.as_deref().map_or(0, count_words) + block.content.as_ref().map_or(0, Content::words);
                if let Some(control) = block.cache_control.as_ref().filter(|control| control.kind == "ephemeral") {
                    found = Some(Breakpoint { digest: hasher.finish(), words, long: control.ttl.as_deref() == Some("1h") });
                }
            }
        }
        found
    }

    /// The prompt's tokens, as `count_tokens` answers them (it refuses the members it does not take,
    /// `max_tokens` among them), or why the body is refused.
    pub fn count(body: &[u8]) -> Result<u64, String> {
        const COUNTED: [&str; 6] = ["model", "messages", "system", "tools", "tool_choice", "thinking"];
        let members: serde_json::Map<String, Value> =
            serde_json::from_slice(body).map_err(|error| format!("invalid request body: {error}"))?;
        if let Some(extra) = members.keys().find(|name| !COUNTED.contains(&name.as_str())) {
            return Err(format!("{extra}: Extra inputs are not permitted"));
        }
        let request: MessagesRequest = serde_json::from_slice(body).map_err(|error| format!("invalid request body: {error}"))?;
        Ok(request.prompt().input_words)
    }

    /// The request, or why it is refused (a 400).
    pub fn parse(body: &[u8]) -> Result<MessagesRequest, String> {
        let request: MessagesRequest = serde_json::from_slice(body).map_err(|error| format!("invalid request body: {error}"))?;
        if request.max_tokens.is_none() {
            return Err("max_tokens: field required".to_string());
        }
        if request.messages.is_empty() {
            return Err("messages: at least one message is required".to_string());
        }
        for (position, message) in request.messages.iter().enumerate() {
            if let Content::Blocks(blocks) = &message.content {
                for (index, block) in blocks.iter().enumerate() {
                    block.check(&format!("messages.{position}.content.{index}"))?;
                }
            }
        }
        if let Some(thinking) = request.thinking.as_ref().filter(|thinking| thinking.kind == "enabled") {
            let budget = thinking.budget_tokens.unwrap_or(0);
            if budget < 1024 || request.max_tokens.is_some_and(|max_tokens| max_tokens <= budget) {
                return Err("thinking.budget_tokens: must be at least 1024 and less than max_tokens".to_string());
            }
            request.check_thinking_returned()?;
        }
        Ok(request)
    }

    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    pub fn prompt(&self) -> Prompt {
        let tools_allowed = self.tool_choice.as_ref().is_none_or(|choice| choice.kind != "none");
        Prompt {
            input_words: self.system.as_ref().map_or(0, Content::words)
                + self.messages.iter().map(|message| message.content.words()).sum::<u64>(),
            last_user_text: self
                .messages
                .iter()
                .rev()
                .filter(|message| message.role == "user")
                .find_map(|message| message.content.text())
                .unwrap_or_default(),
            ends_with_tool_result: self.messages.last().is_some_and(|message| message.content.has_tool_result()),
            tools: self.tools.iter().flatten().filter(|_| tools_allowed).map(|tool| tool.name.clone()).collect(),
            max_tokens: self.max_tokens,
            thinking: self.thinking_enabled(),
            ..Prompt::default()
        }
    }

    pub fn reply(&self, cache: Option<&CacheUse>) -> Reply {
        let prompt = match cache {
            Some(cache) if cache.read => Prompt { cached_words: cache.words, ..self.prompt() },
            Some(cache) => Prompt { written_words: cache.words, written_long: cache.long, ..self.prompt() },
            None => self.prompt(),
        };
        Reply::to(Provider::Anthropic, &prompt)
    }

    pub fn complete(&self, seq: u64, cache: Option<&CacheUse>) -> Response {
        let reply = self.reply(cache);
        let id = message_id(seq);
        let tool_id = tool_use_id(seq);
        let thinking =
            reply.thinking.as_ref().map(|thinking| ContentOut::Thinking { thinking: &thinking.text, signature: &thinking.signature });
        let content = match &reply.tool_call {
            Some(call) => ContentOut::ToolUse { id: &tool_id, name: &call.name, input: &call.input },
            None => ContentOut::Text { text: &reply.text },
        };
        let message = MessageOut {
            id: &id,
            kind: "message",
            role: "assistant",
            model: &self.model,
            content: thinking.into_iter().chain([content]).collect::<Vec<_>>(),
            stop_reason: Some(stop_reason(reply.stop)),
            stop_sequence: None,
            usage: UsageOut::of(&reply, reply.output_tokens),
        };
        respond::json(StatusCode::OK, &message)
    }

    pub fn stream(&self, seq: u64, cache: Option<&CacheUse>) -> (StreamSteps, EventRenderer) {
        (StreamSteps::new(self.reply(cache)), EventRenderer { id: message_id(seq), tool_id: tool_use_id(seq), model: self.model.clone() })
    }
}

fn message_id(seq: u64) -> String {
    format!("msg_mock_{seq}")
}

fn tool_use_id(seq: u64) -> String {
    format!("toolu_mock_{seq}")
}

fn stop_reason(stop: Stop) -> &'static str {
    match stop {
        Stop::Complete => "end_turn",
        Stop::Length => "max_tokens",
        Stop::ToolCall => "tool_use",
    }
}

#[derive(Serialize)]
struct MessageOut<'a, C> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: C,
    stop_reason: Option<&'static str>,
    stop_sequence: Option<()>,
    usage: UsageOut,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ContentOut<'a, I> {
    Text { text: &'a str },
    ToolUse { id: &'a str, name: &'a str, input: I },
    Thinking { thinking: &'a str, signature: &'a str },
}

#[derive(Serialize)]
struct UsageOut {
    /// The prompt's tokens neither read from nor written to the cache, as Anthropic counts.
    input_tokens: u64,
    output_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_creation_input_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_read_input_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_creation: Option<CacheCreationOut>,
}

#[derive(Serialize)]
struct CacheCreationOut {
    ephemeral_5m_input_tokens: u64,
    ephemeral_1h_input_tokens: u64,
}

impl UsageOut {
    fn of(reply: &Reply, output_tokens: u64) -> UsageOut {
        let cached = reply.cached_tokens > 0 || reply.written_tokens > 0;
        UsageOut {
            input_tokens: reply.input_tokens.saturating_sub(reply.cached_tokens + reply.written_tokens),
            output_tokens,
            cache_creation_input_tokens: cached.then_some(reply.written_tokens),
            cache_read_input_tokens: cached.then_some(reply.cached_tokens),
            cache_creation: cached.then(|| {
                let long = if reply.written_long { reply.written_tokens } else { 0 };
                CacheCreationOut { ephemeral_5m_input_tokens: reply.written_tokens - long, ephemeral_1h_input_tokens: long }
            }),
        }
    }
}

#[derive(Serialize)]
struct Empty {}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event<'a> {
    MessageStart { message: MessageOut<'a, [(); 0]> },
    ContentBlockStart { index: u32, content_block: ContentOut<'a, Empty> },
    ContentBlockDelta { index: u32, delta: DeltaOut<'a> },
    ContentBlockStop { index: u32 },
    MessageDelta { delta: MessageDeltaOut, usage: OutputUsage },
    MessageStop,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[expect(clippy::enum_variant_names, reason = "the names are Anthropic's delta types")]
enum DeltaOut<'a> {
    TextDelta { text: &'a str },
    InputJsonDelta { partial_json: &'a str },
    ThinkingDelta { thinking: &'a str },
    SignatureDelta { signature: &'a str },
}

#[derive(Serialize)]
struct MessageDeltaOut {
    stop_reason: &'static str,
    stop_sequence: Option<()>,
}

#[derive(Serialize)]
struct OutputUsage {
    output_tokens: u64,
}

/// Renders the six Anthropic stream events as `event: X\ndata: {...}\n\n`.
pub(crate) struct EventRenderer {
    id: String,
    tool_id: String,
    model: String,
}

fn write_event(out: &mut BytesMut, name: &str, event: &Event<'_>) {
    out.put_slice(b"event: ");
    out.put_slice(name.as_bytes());
    out.put_slice(b"\ndata: ");
    respond::write_json(out, event);
    out.put_slice(b"\n\n");
}

impl Render for EventRenderer {
    fn render(&mut self, step: &Step, reply: &Reply, out: &mut BytesMut) {
        // The answer's block follows the thinking block when there is one.
        let index = u32::from(reply.thinking.is_some());
        match step {
            Step::Open => {
                let message = MessageOut {
                    id: &self.id,
                    kind: "message",
                    role: "assistant",
                    model: &self.model,
                    content: [],
                    stop_reason: None,
                    stop_sequence: None,
                    usage: UsageOut::of(reply, 0),
                };
                write_event(out, "message_start", &Event::MessageStart { message });
                if let Some(thinking) = &reply.thinking {
                    let content_block = ContentOut::Thinking { thinking: "", signature: "" };
                    write_event(out, "content_block_start", &Event::ContentBlockStart { index: 0, content_block });
                    let delta = DeltaOut::ThinkingDelta { thinking: &thinking.text };
                    write_event(out, "content_block_delta", &Event::ContentBlockDelta { index: 0, delta });
                    let delta = DeltaOut::SignatureDelta { signature: &thinking.signature };
                    write_event(out, "content_block_delta", &Event::ContentBlockDelta { index: 0, delta });
                    write_event(out, "content_block_stop", &Event::ContentBlockStop { index: 0 });
                }
            }
            Step::BlockStart => {
                let content_block = match &reply.tool_call {
                    Some(call) => ContentOut::ToolUse { id: &self.tool_id, name: &call.name, input: Empty {} },
                    None => ContentOut::Text { text: "" },
                };
                write_event(out, "content_block_start", &Event::ContentBlockStart { index, content_block });
            }
            Step::Delta(range) => {
                let text = reply.streamed_text().get(range.clone()).unwrap_or_default();
                let delta =
                    if reply.tool_call.is_some() { DeltaOut::InputJsonDelta { partial_json: text } } else { DeltaOut::TextDelta { text } };
                write_event(out, "content_block_delta", &Event::ContentBlockDelta { index, delta });
            }
            Step::BlockStop => write_event(out, "content_block_stop", &Event::ContentBlockStop { index }),
            Step::Finish => {
                let event = Event::MessageDelta {
                    delta: MessageDeltaOut { stop_reason: stop_reason(reply.stop), stop_sequence: None },
                    usage: OutputUsage { output_tokens: reply.output_tokens },
                };
                write_event(out, "message_delta", &event);
            }
            Step::Close => write_event(out, "message_stop", &Event::MessageStop),
            Step::Usage => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(value: Value) -> MessagesRequest {
        MessagesRequest::parse(value.to_string().as_bytes()).unwrap()
    }

    async fn body_json(response: Response) -> Value {
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    /// (event name, data) of every event of the stream.
    fn events(request: &MessagesRequest) -> Vec<(String, Value)> {
        let (mut steps, mut renderer) = request.stream(2, None);
        let mut out = BytesMut::new();
        while let Some(step) = steps.next() {
            renderer.render(&step, steps.reply(), &mut out);
        }
        let text = String::from_utf8(out.to_vec()).unwrap();
        text.split_terminator("\n\n")
            .map(|frame| {
                let (event, data) = frame.split_once('\n').unwrap();
                let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                let name = event.strip_prefix("event: ").unwrap().to_string();
                assert_eq!(data["type"], name.as_str());
                (name, data)
            })
            .collect()
    }

    #[tokio::test]
    async fn a_message_counts_the_system_prompt_and_tool_results() {
        let messages = request(json!({
            "model": "claude-x", "max_tokens": 100,
            "system": [{"type": "text", "text": "be very brief"}],
            "messages": [
                {"role": "user", "content": "first question"},
                {"role": "assistant", "content": [{"type": "text", "text": "an answer"}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "two words"}, {"type": "text", "text": "last one"}]},
            ],
        }));
        let body = body_json(messages.complete(7, None)).await;
        assert_eq!(body["id"], "msg_mock_7");
        assert_eq!(body["type"], "message");
        assert_eq!(body["role"], "assistant");
        assert_eq!(body["model"], "claude-x");
        assert_eq!(body["content"], json!([{"type": "text", "text": "mock anthropic reply to: last one"}]));
        assert_eq!(body["stop_reason"], "end_turn");
        assert_eq!(body["stop_sequence"], Value::Null);
        assert_eq!(body["usage"], json!({"input_tokens": 11, "output_tokens": 6}));
    }

    #[tokio::test]
    async fn max_tokens_stops_the_message() {
        let messages = request(json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}));
        let body = body_json(messages.complete(0, None)).await;
        assert_eq!(body["content"][0]["text"], "mock");
        assert_eq!(body["stop_reason"], "max_tokens");
    }

    #[tokio::test]
    async fn a_tool_use_block_answers_when_asked() {
        let messages = request(json!({
            "model": "m", "max_tokens": 100,
            "tools": [{"name": "search", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "use a tool"}]}],
        }));
        let body = body_json(messages.complete(1, None)).await;
        assert_eq!(
            body["content"],
            json!([{"type": "tool_use", "id": "toolu_mock_1", "name": "search", "input": {"query": "use a tool"}}])
        );
        assert_eq!(body["stop_reason"], "tool_use");
        assert_eq!(body["usage"]["output_tokens"], 5);
        let after = request(json!({
            "model": "m", "max_tokens": 100,
            "tools": [{"name": "search", "input_schema": {"type": "object"}}],
            "messages": [
                {"role": "user", "content": "use a tool"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_mock_1", "name": "search", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_mock_1", "content": [{"type": "text", "text": "sunny"}]}]},
            ],
        }));
        let body = body_json(after.complete(2, None)).await;
        assert_eq!(body["content"][0]["text"], "mock anthropic reply to: use a tool");
    }

    #[test]
    fn a_stream_sends_the_six_events() {
        let messages = request(json!({"model": "m", "max_tokens": 100, "stream": true, "messages": [{"role": "user", "content": "hi"}]}));
        let events = events(&messages);
        let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names[..2], ["message_start", "content_block_start"]);
        assert_eq!(names[names.len() - 3..], ["content_block_stop", "message_delta", "message_stop"]);
        assert_eq!(events[0].1["message"]["id"], "msg_mock_2");
        assert_eq!(events[0].1["message"]["content"], json!([]));
        assert_eq!(events[0].1["message"]["usage"]["input_tokens"], 1);
        assert_eq!(events[1].1["content_block"], json!({"type": "text", "text": ""}));
        let text: Vec<&str> = events.iter().filter_map(|(_, data)| data["delta"]["text"].as_str()).collect();
        assert_eq!(text, ["mock", " anthropic", " reply", " to:", " hi"]);
        let message_delta = &events[events.len() - 2].1;
        assert_eq!(message_delta["delta"], json!({"stop_reason": "end_turn", "stop_sequence": null}));
        assert_eq!(message_delta["usage"], json!({"output_tokens": 5}));
    }

    #[test]
    fn a_tool_stream_sends_input_json_deltas() {
        let messages = request(json!({
            "model": "m", "max_tokens": 100, "stream": true,
            "tools": [{"name": "search"}],
            "messages": [{"role": "user", "content": "now use a tool please"}],
        }));
        let events = events(&messages);
        assert_eq!(events[1].1["content_block"], json!({"type": "tool_use", "id": "toolu_mock_2", "name": "search", "input": {}}));
        let fragments: Vec<&str> = events
            .iter()
            .filter(|(_, data)| data["delta"]["type"] == "input_json_delta")
            .map(|(_, data)| data["delta"]["partial_json"].as_str().unwrap())
            .collect();
        assert!(fragments.len() >= 2);
        let input: Value = serde_json::from_str(&fragments.concat()).unwrap();
        assert_eq!(input, json!({"query": "now use a tool please"}));
        assert_eq!(events[events.len() - 2].1["delta"]["stop_reason"], "tool_use");
    }

    #[test]
    fn bad_requests_are_refused() {
        assert!(
            MessagesRequest::parse(br#"{"model": "m", "messages": [{"role": "user", "content": "x"}]}"#).is_err(),
            "max_tokens is required"
        );
        assert!(MessagesRequest::parse(br#"{"model": "m", "max_tokens": 5, "messages": []}"#).is_err());
    }

    #[test]
    fn keys_and_errors_have_the_anthropic_shape() {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::AUTHORIZATION, "Bearer b".parse().unwrap());
        assert_eq!(api_key(&headers), Some("b"));
        headers.insert("x-api-key", "k".parse().unwrap());
        assert_eq!(api_key(&headers), Some("k"));
        let body = error_body(StatusCode::UNAUTHORIZED, "invalid x-api-key");
        assert_eq!(body, json!({"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}));
        assert_eq!(error_body(StatusCode::from_u16(529).unwrap(), "busy")["error"]["type"], "overloaded_error");
    }
}
