//! The Anthropic Messages format, both as clients send it and as Anthropic answers it.

use std::borrow::Cow;

use serde_json::{Value, json};

use crate::chat::fields::{optional_bool, optional_number_in, optional_positive_u32, required_array, required_string, stop_list};
use crate::chat::{
    CacheAt, CachePoint, CacheTtl, ChatEvent, ChatReply, ChatRequest, DocumentSource, FinishReason, InvalidRequest, Message, OpenAiOptions,
    Part, Role, Schema, Tool, ToolChoice, Usage,
};

/// Output budget sent when the caller gave none (Anthropic requires one).
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

mod typed_request;

/// Reads a client's messages body of the common shape straight from its bytes, without a JSON
/// tree; None for any other body (an invalid one included), which `parse_request` reads.
pub fn read_request(body: &[u8]) -> Option<ChatRequest> {
    typed_request::read(body)
}

/// Reads a client's messages body.
pub fn parse_request(body: &Value) -> Result<ChatRequest, InvalidRequest> {
    if !body.is_object() {
        return Err(InvalidRequest::new("the body must be a JSON object"));
    }
    let model = required_string(body, "model")?;
    let max_tokens = optional_positive_u32(body, "max_tokens")?.ok_or_else(|| InvalidRequest::missing("max_tokens"))?;
    let raw_messages = required_array(body, "messages")?;
    let mut messages = Vec::new();
    let mut cache_points = Vec::new();
    for (position, message) in raw_messages.iter().enumerate() {
        let role = match message.get("role").and_then(Value::as_str) {
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            Some(other) => return Err(InvalidRequest::new(format!("messages[{position}].role `{other}` is not one of user, assistant"))),
            None => return Err(InvalidRequest::new(format!("messages[{position}].role is required"))),
        };
        push_turn(&mut messages, &mut cache_points, role, blocks(message.get("content"), position)?);
    }
    let system = match body.get("system") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text.clone()),
        Some(Value::Array(_)) => Some(system_text(blocks(body.get("system"), 0)?, &mut cache_points)),
        Some(_) => return Err(InvalidRequest::new("system must be a string or an array of text blocks")),
    };
    let mut tools = Vec::new();
    for (index, tool) in body.get("tools").and_then(Value::as_array).into_iter().flatten().enumerate() {
        if let Some(ttl) = cache_control(tool, || format!("tools[{index}]"))? {
            cache_points.push(CachePoint { at: CacheAt::Tool(index), ttl });
        }
        let name = tool
            .get("name")
            .and_then(Value::as_str)
            .filter(|name| !name.is_empty())
            .ok_or_else(|| InvalidRequest::new("every tool needs a name"))?;
        tools.push(Tool {
            name: name.to_string(),
            description: tool.get("description").and_then(Value::as_str).map(str::to_string),
            parameters: tool.get("input_schema").cloned().map_or_else(Schema::empty_object, Schema::from),
        });
    }
    let tool_choice = match body.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(choice) => Some(match choice.get("type").and_then(Value::as_str) {
            Some("auto") => ToolChoice::Auto,
            Some("any") => ToolChoice::Required,
            Some("none") => ToolChoice::None,
            Some("tool") => ToolChoice::Named(choice.get("name").and_then(Value::as_str).unwrap_or_default().to_string()),
            _ => return Err(InvalidRequest::new("tool_choice.type must be one of auto, any, tool, none")),
        }),
    };
    let parallel_tool_calls = match body.pointer("/tool_choice/disable_parallel_tool_use") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(disable)) => Some(!disable),
        Some(_) => return Err(InvalidRequest::new("tool_choice.disable_parallel_tool_use must be a boolean")),
    };
    Ok(ChatRequest {
        model,
        system,
        messages,
        tools,
        tool_choice,
        max_tokens: Some(max_tokens),
        temperature: optional_number_in(body, "temperature", 0.0, 1.0)?,
        top_p: optional_number_in(body, "top_p", 0.0, 1.0)?,
        top_k: optional_positive_u32(body, "top_k")?,
        stop: stop_list(body, "stop_sequences")?,
        stream: optional_bool(body, "stream")?,
        stream_usage: true,
        user: body.pointer("/metadata/user_id").and_then(Value::as_str).map(str::to_string),
        response_format: None,
        parallel_tool_calls,
        openai: OpenAiOptions::default(),
        cache_points,
        thinking: body.get("thinking").filter(|thinking| !thinking.is_null()).cloned().map(Schema::from),
    })
}

/// A block's `cache_control`: None when absent or null, else the breakpoint's ttl (None for the
/// provider's default).
pub(crate) fn cache_control(block: &Value, place: impl Fn() -> String) -> Result<Option<Option<CacheTtl>>, InvalidRequest> {
    let refused =
        || InvalidRequest::new(format!("{}.cache_control must be {{\"type\": \"ephemeral\"}}, with an optional ttl of 5m or 1h", place()));
    match block.get("cache_control") {
        None | Some(Value::Null) => Ok(None),
        Some(control) if control.get("type").and_then(Value::as_str) == Some("ephemeral") => match control.get("ttl") {
            None | Some(Value::Null) => Ok(Some(None)),
            Some(ttl) => ttl.as_str().and_then(CacheTtl::parse).map(|ttl| Some(Some(ttl))).ok_or_else(refused),
        },
        Some(_) => Err(refused()),
    }
}

/// A content block read into a neutral part, with the cache breakpoint the client set on it.
pub(crate) struct Marked {
    pub part: Part,
    /// Some when the block carried `cache_control` (its ttl, None for the provider's default).
    pub cache: Option<Option<CacheTtl>>,
}

impl From<Part> for Marked {
    fn from(part: Part) -> Self {
        Marked { part, cache: None }
    }
}

/// Adds one client turn to the neutral conversation: its tool results first, as a turn of their own
/// (the neutral model gives them their own role), then the rest; a marked block becomes a cache
/// point at the place its part takes.
pub(crate) fn push_turn(messages: &mut Vec<Message>, cache_points: &mut Vec<CachePoint>, role: Role, blocks: Vec<Marked>) {
    let (results, others): (Vec<Marked>, Vec<Marked>) = blocks.into_iter().partition(|block| matches!(block.part, Part::ToolResult { .. }));
    let mut push = |role: Role, blocks: Vec<Marked>| {
        let message = messages.len();
        let mut parts = Vec::with_capacity(blocks.len());
        for (part, block) in blocks.into_iter().enumerate() {
            if let Some(ttl) = block.cache {
                cache_points.push(CachePoint { at: CacheAt::Part { message, part }, ttl });
            }
            parts.push(block.part);
        }
        messages.push(Message { role, parts });
    };
    if !results.is_empty() {
        push(Role::Tool, results);
    }
    if !others.is_empty() || role == Role::Assistant {
        push(role, others);
    }
}

/// The system prompt of its blocks; any breakpoint among them caches the whole system prompt (the
/// neutral request holds it as one text), with the last one's ttl.
pub(crate) fn system_text(blocks: Vec<Marked>, cache_points: &mut Vec<CachePoint>) -> String {
    if let Some(ttl) = blocks.iter().rev().find_map(|block| block.cache) {
        cache_points.push(CachePoint { at: CacheAt::System, ttl });
    }
    Message { role: Role::User, parts: blocks.into_iter().map(|block| block.part).collect() }.text()
}

/// Nested content (a tool result's): its parts, breakpoints inside it not kept.
fn unmarked(blocks: Vec<Marked>) -> Vec<Part> {
    blocks.into_iter().map(|block| block.part).collect()
}

fn blocks(content: Option<&Value>, position: usize) -> Result<Vec<Marked>, InvalidRequest> {
    match content {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(text)) => Ok(vec![Part::Text(text.clone()).into()]),
        Some(Value::Array(items)) => {
            let mut parts: Vec<Marked> = Vec::new();
            for item in items {
                let cache = cache_control(item, || format!("messages[{position}].content[]"))?;
                let before = parts.len();
                match item.get("type").and_then(Value::as_str) {
                    Some("text") => parts.push(Part::Text(item.get("text").and_then(Value::as_str).unwrap_or_default().to_string()).into()),
                    Some("image") => {
                        let source = item.get("source").unwrap_or(&Value::Null);
                        let url = match source.get("type").and_then(Value::as_str) {
                            Some("base64") => format!(
                                "data:{};base64,{}",
                                source.get("media_type").and_then(Value::as_str).unwrap_or("image/png"),
                                source.get("data").and_then(Value::as_str).unwrap_or_default()
                            ),
                            _ => source.get("url").and_then(Value::as_str).unwrap_or_default().to_string(),
                        };
                        parts.push(Part::Image { url }.into());
                    }
                    Some("tool_use") => parts.push(
                        Part::ToolCall {
                            id: item.get("id").and_then(Value::as_str).unwrap_or_default().to_string(),
                            name: item.get("name").and_then(Value::as_str).unwrap_or_default().to_string(),
                            arguments: item.get("input").map_or_else(|| "{}".to_string(), Value::to_string),
                        }
                        .into(),
                    ),
                    Some("thinking") => parts.push(
                        Part::Thinking {
                            text: item.get("thinking").and_then(Value::as_str).unwrap_or_default().to_string(),
                            signature: item.get("signature").and_then(Value::as_str).unwrap_or_default().to_string(),
                        }
                        .into(),
                    ),
                    Some("redacted_thinking") => parts.push(
                        Part::RedactedThinking { data: item.get("data").and_then(Value::as_str).unwrap_or_default().to_string() }.into(),
                    ),
                    Some("tool_result") => parts.push(
                        Part::tool_result(
                            item.get("tool_use_id").and_then(Value::as_str).unwrap_or_default().to_string(),
                            unmarked(blocks(item.get("content"), position)?),
                            item.get("is_error").and_then(Value::as_bool).unwrap_or(false),
                        )
                        .into(),
                    ),
                    Some("document") => parts.push(document(item, position)?.into()),
                    Some(kind) => {
                        return Err(InvalidRequest::unsupported(format!(
                            "messages[{position}].content: `{kind}` blocks are not supported (text, image, document, tool_use, tool_result, thinking and redacted_thinking are)"
                        )));
                    }
                    None => return Err(InvalidRequest::new(format!("messages[{position}].content blocks need a type"))),
                }
                // A breakpoint on a block the neutral model skips is dropped with it.
                if let Some(block) = parts.get_mut(before) {
                    block.cache = cache;
                }
            }
            Ok(parts)
        }
        Some(_) => Err(InvalidRequest::new(format!("messages[{position}].content must be a string or an array of blocks"))),
    }
}

/// A `document` block: a PDF in base64 or by URL, plain text, or text blocks (Anthropic's custom
/// content, joined). Its `title` names it; `context` and `citations` are not carried (replies carry
/// no citations back). A file id is refused: it names a file in one provider's storage.
fn document(item: &Value, position: usize) -> Result<Part, InvalidRequest> {
    let at = || format!("messages[{position}].content[].source");
    let source = item.get("source").filter(|source| source.is_object()).ok_or_else(|| InvalidRequest::missing(&at()))?;
    let text = |member: &str| {
        source
            .get(member)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| InvalidRequest::new(format!("{}.{member} must be a string", at())))
    };
    let source = match source.get("type").and_then(Value::as_str) {
        Some("base64") => DocumentSource::Base64 { media_type: text("media_type")?, data: text("data")? },
        Some("url") => DocumentSource::Url(text("url")?),
        Some("text") => DocumentSource::Text(text("data")?),
        Some("content") => match source.get("content") {
            Some(Value::String(content)) => DocumentSource::Text(content.clone()),
            Some(Value::Array(blocks)) => {
                let mut texts = Vec::with_capacity(blocks.len());
                for block in blocks {
                    match (block.get("type").and_then(Value::as_str), block.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(text)) => texts.push(text),
                        _ => return Err(InvalidRequest::unsupported(format!("{}.content: only text blocks are supported", at()))),
                    }
                }
                DocumentSource::Text(texts.join("\n"))
            }
            _ => return Err(InvalidRequest::new(format!("{}.content must be a string or an array of text blocks", at()))),
        },
        Some("file") => {
            return Err(InvalidRequest::unsupported(format!(
                "{}: a file id names a file in one provider's storage; send the document as base64 data, a URL or text",
                at()
            )));
        }
        _ => return Err(InvalidRequest::new(format!("{}.type must be one of base64, url, text, content", at()))),
    };
    Ok(Part::Document { source, name: item.get("title").and_then(Value::as_str).map(str::to_string) })
}

/// The `stop_reason` of a reply.
pub fn stop_reason(finish: FinishReason) -> &'static str {
    match finish {
        FinishReason::Stop => "end_turn",
        FinishReason::Length => "max_tokens",
        FinishReason::ToolCalls => "tool_use",
        FinishReason::ContentFilter => "refusal",
    }
}

fn parse_stop(reason: &str) -> FinishReason {
    match reason {
        "max_tokens" => FinishReason::Length,
        "tool_use" => FinishReason::ToolCalls,
        "refusal" => FinishReason::ContentFilter,
        _ => FinishReason::Stop,
    }
}

fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(value @ Value::Object(_)) => value,
        Ok(other) => json!({"value": other}),
        Err(_) if arguments.trim().is_empty() => json!({}),
        Err(_) => json!({"raw_arguments": arguments}),
    }
}

fn content_blocks(parts: &[Part]) -> Vec<outgoing::Block<'_>> {
    parts.iter().map(outgoing::Block::of).collect()
}

/// A `message` for the client.
pub fn render_reply(reply: &ChatReply) -> RenderedReply<'_> {
    RenderedReply {
        content: content_blocks(&reply.parts),
        id: &reply.id,
        model: &reply.model,
        role: "assistant",
        stop_reason: stop_reason(reply.finish),
        stop_sequence: None,
        kind: "message",
        usage: RenderedUsage::of(reply.usage),
    }
}

/// A `message` as the client receives it, serialized straight from the reply (no JSON tree in
/// between: this is on every answered request in this format).
#[derive(Debug, serde::Serialize)]
pub struct RenderedReply<'a> {
    content: Vec<outgoing::Block<'a>>,
    id: &'a str,
    model: &'a str,
    role: &'static str,
    stop_reason: &'static str,
    stop_sequence: Option<()>,
    #[serde(rename = "type")]
    kind: &'static str,
    usage: RenderedUsage,
}

/// Usage as Anthropic counts it: `input_tokens` leaves out the tokens read from or written to the
/// prompt cache, which have members of their own (sent, both, when the cache was used).
#[derive(Debug, serde::Serialize)]
struct RenderedUsage {
    input_tokens: u64,
    output_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_creation_input_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_read_input_tokens: Option<u64>,
    /// The writes by time kept, when there are any.
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_creation: Option<CacheCreation>,
}

#[derive(Debug, serde::Serialize)]
struct CacheCreation {
    ephemeral_5m_input_tokens: u64,
    ephemeral_1h_input_tokens: u64,
}

impl RenderedUsage {
    fn of(usage: Usage) -> Self {
        let cached = usage.cache_read_tokens > 0 || usage.cache_write_tokens > 0;
        RenderedUsage {
            input_tokens: usage.uncached_input_tokens(),
            output_tokens: usage.output_tokens,
            cache_creation_input_tokens: cached.then_some(usage.cache_write_tokens),
            cache_read_input_tokens: cached.then_some(usage.cache_read_tokens),
            cache_creation: cached.then_some(CacheCreation {
                ephemeral_5m_input_tokens: usage.cache_write_tokens.saturating_sub(usage.cache_write_long_tokens),
                ephemeral_1h_input_tokens: usage.cache_write_long_tokens,
            }),
        }
    }
}

/// Neutral usage from Anthropic's counts (its `input_tokens` leaves out the cache's).
fn usage_of(counts: CacheCounts, output_tokens: u64) -> Usage {
    Usage {
        input_tokens: counts.input.saturating_add(counts.cache_write).saturating_add(counts.cache_read),
        output_tokens,
        cache_read_tokens: counts.cache_read,
        cache_write_tokens: counts.cache_write,
        cache_write_long_tokens: counts.cache_write_long.min(counts.cache_write),
    }
}

/// Anthropic's prompt counts: uncached input, cache writes (of which one-hour ones), cache reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct CacheCounts {
    input: u64,
    cache_write_long: u64,
    cache_write: u64,
    cache_read: u64,
}

impl CacheCounts {
    /// The counts of a `usage` object; a member absent or not a whole number counts as `fallback`'s.
    fn of_value(usage: &Value, fallback: CacheCounts) -> Self {
        let count = |field: &str, fallback: u64| usage.get(field).and_then(Value::as_u64).unwrap_or(fallback);
        let long = usage.pointer("/cache_creation/ephemeral_1h_input_tokens").and_then(Value::as_u64);
        CacheCounts {
            input: count("input_tokens", fallback.input),
            cache_write_long: long.unwrap_or(fallback.cache_write_long),
            cache_write: count("cache_creation_input_tokens", fallback.cache_write),
            cache_read: count("cache_read_input_tokens", fallback.cache_read),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpenBlock {
    Text,
    Tool,
    Thinking,
    /// A thinking block its signature closed (more thinking opens another).
    SignedThinking,
    RedactedThinking,
}

/// Writes a neutral event stream as Anthropic SSE events.
#[derive(Debug)]
pub struct StreamWriter {
    id: String,
    model: String,
    input_tokens: u64,
    started: bool,
    block_index: usize,
    open: Option<OpenBlock>,
    finish: Option<FinishReason>,
    usage: Option<Usage>,
}

fn event(name: &str, data: Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// A `content_block_delta` event (one per token or argument fragment), serialized straight from its
/// parts: the same bytes as `event` writes from a `Value` (members in the byte order of their names).
fn block_delta(index: usize, kind: &'static str, field: &'static str, fragment: &str) -> String {
    #[derive(serde::Serialize)]
    struct Data<'a> {
        delta: DeltaData<'a>,
        index: usize,
        #[serde(rename = "type")]
        kind: &'static str,
    }
    /// The fragment under its field's name (`partial_json` or `text`); both sort before `type`.
    #[derive(serde::Serialize)]
    struct DeltaData<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        partial_json: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        text: Option<&'a str>,
        #[serde(rename = "type")]
        kind: &'static str,
    }
    let (partial_json, text) = if field == "partial_json" { (Some(fragment), None) } else { (None, Some(fragment)) };
    let data = Data { delta: DeltaData { partial_json, text, kind }, index, kind: "content_block_delta" };
    crate::sse::frame("event: content_block_delta\ndata: ", &data)
}

impl StreamWriter {
    /// A writer for one reply; `input_tokens` is the best count known at the start.
    pub fn new(id: String, model: String, input_tokens: u64) -> Self {
        StreamWriter { id, model, input_tokens, started: false, block_index: 0, open: None, finish: None, usage: None }
    }

    fn start(&mut self, frames: &mut Vec<String>) {
        if !self.started {
            self.started = true;
            frames.push(event(
                "message_start",
                json!({"type": "message_start", "message": {
                    "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                    "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
                }}),
            ));
        }
    }

    fn close_block(&mut self, frames: &mut Vec<String>) {
        if self.open.take().is_some() {
            frames.push(event("content_block_stop", json!({"type": "content_block_stop", "index": self.block_index})));
            self.block_index += 1;
        }
    }

    /// The opening event (`message_start`), once: a relay sends it as soon as the provider accepted
    /// the call, before the first token, as Anthropic does.
    pub fn begin(&mut self) -> Vec<String> {
        let mut frames = Vec::new();
        self.start(&mut frames);
        frames
    }

    /// The events for one neutral event (the closing ones wait for `end`).
    pub fn write(&mut self, chat_event: &ChatEvent) -> Vec<String> {
        let mut frames = Vec::new();
        self.start(&mut frames);
        match chat_event {
            ChatEvent::TextDelta(text) => {
                if self.open != Some(OpenBlock::Text) {
                    self.close_block(&mut frames);
                    self.open = Some(OpenBlock::Text);
                    frames.push(event(
                        "content_block_start",
                        json!({"type": "content_block_start", "index": self.block_index, "content_block": {"type": "text", "text": ""}}),
                    ));
                }
                frames.push(block_delta(self.block_index, "text_delta", "text", text));
            }
            ChatEvent::ToolCallStart { id, name, .. } => {
                self.close_block(&mut frames);
                self.open = Some(OpenBlock::Tool);
                frames.push(event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": self.block_index, "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
                ));
            }
            ChatEvent::ToolCallDelta { arguments, .. } => {
                if self.open == Some(OpenBlock::Tool) {
                    frames.push(block_delta(self.block_index, "input_json_delta", "partial_json", arguments));
                }
            }
            ChatEvent::ThinkingDelta(text) => {
                self.open_thinking(&mut frames, false);
                let delta = json!({"type": "thinking_delta", "thinking": text});
                frames
                    .push(event("content_block_delta", json!({"type": "content_block_delta", "index": self.block_index, "delta": delta})));
            }
            ChatEvent::ThinkingSignature(signature) => {
                self.open_thinking(&mut frames, true);
                let delta = json!({"type": "signature_delta", "signature": signature});
                frames
                    .push(event("content_block_delta", json!({"type": "content_block_delta", "index": self.block_index, "delta": delta})));
                self.open = Some(OpenBlock::SignedThinking);
            }
            ChatEvent::RedactedThinking(data) => {
                self.close_block(&mut frames);
                self.open = Some(OpenBlock::RedactedThinking);
                frames.push(event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": self.block_index, "content_block": {"type": "redacted_thinking", "data": data}}),
                ));
            }
            ChatEvent::Finish(reason) => self.finish = Some(*reason),
            ChatEvent::Usage(usage) => self.usage = Some(*usage),
            // The format has no log probabilities.
            ChatEvent::Logprobs(_) => {}
        }
        frames
    }

    /// Opens a thinking block unless one is open (a signed one stays open for its signature only).
    fn open_thinking(&mut self, frames: &mut Vec<String>, signing: bool) {
        let open = self.open == Some(OpenBlock::Thinking) || (signing && self.open == Some(OpenBlock::SignedThinking));
        if !open {
            self.close_block(frames);
            self.open = Some(OpenBlock::Thinking);
            frames.push(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": self.block_index, "content_block": {"type": "thinking", "thinking": ""}}),
            ));
        }
    }

    /// The closing events: the last block's stop, `message_delta` with the stop reason and usage, `message_stop`.
    pub fn end(&mut self) -> Vec<String> {
        let mut frames = Vec::new();
        self.start(&mut frames);
        self.close_block(&mut frames);
        let usage = self.usage.unwrap_or(Usage::uncached(self.input_tokens, 0));
        frames.push(event(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": stop_reason(self.finish.unwrap_or(FinishReason::Stop)), "stop_sequence": null},
                   "usage": RenderedUsage::of(usage)}),
        ));
        frames.push(event("message_stop", json!({"type": "message_stop"})));
        frames
    }
}

/// The body sent to Anthropic.
pub fn build_request<'a>(request: &'a ChatRequest, upstream_model: &'a str, default_max_tokens: u32) -> outgoing::Request<'a> {
    // Anthropic wants strictly alternating user and assistant turns: tool results become user turns,
    // and consecutive turns of one side merge.
    let mut messages: Vec<outgoing::Turn<'a>> = Vec::with_capacity(request.messages.len());
    for (index, message) in request.messages.iter().enumerate() {
        let role = match message.role {
            Role::User | Role::Tool => "user",
            Role::Assistant => "assistant",
        };
        let first = match messages.last_mut() {
            Some(turn) if turn.role == role => {
                turn.content.extend(message.parts.iter().map(outgoing::Block::of));
                turn.content.len() - message.parts.len()
            }
            _ => {
                messages.push(outgoing::Turn { role, content: content_blocks(&message.parts) });
                0
            }
        };
        // The client's breakpoints, on the blocks of this message's parts (which keep them when
        // tool results move to the front of their turn below).
        for point in &request.cache_points {
            if let CacheAt::Part { message, part } = point.at
                && message == index
                && let Some(block) = messages.last_mut().and_then(|turn| turn.content.get_mut(first + part))
            {
                block.cache(outgoing::CacheControl::of(point.ttl));
            }
        }
    }
    for turn in &mut messages {
        // Tool results must come first in their user turn.
        turn.content.sort_by_key(|block| !matches!(block, outgoing::Block::ToolResult { .. }));
    }
    outgoing::Request {
        max_tokens: request.max_tokens.unwrap_or(default_max_tokens),
        messages,
        model: upstream_model,
        stop_sequences: &request.stop,
        stream: request.stream,
        system: request.system.as_deref().map(|text| match cache_control_at(request, CacheAt::System) {
            None => outgoing::System::Text(text),
            Some(cache_control) => outgoing::System::Blocks([outgoing::SystemBlock { cache_control, text, kind: "text" }]),
        }),
        // OpenAI allows up to 2; Anthropic up to 1.
        temperature: request.temperature.map(|temperature| temperature.min(1.0)),
        thinking: request.thinking.as_ref(),
        tool_choice: tool_choice(request),
        tools: request
            .tools
            .iter()
            .enumerate()
            .map(|(index, tool)| outgoing::Tool {
                cache_control: cache_control_at(request, CacheAt::Tool(index)),
                description: tool.description.as_deref(),
                input_schema: &tool.parameters,
                name: &tool.name,
            })
            .collect(),
        top_k: request.top_k,
        top_p: request.top_p,
    }
}

/// The client's breakpoint at `at`, as Anthropic takes it.
fn cache_control_at(request: &ChatRequest, at: CacheAt) -> Option<outgoing::CacheControl> {
    request.cache_points.iter().find(|point| point.at == at).map(|point| outgoing::CacheControl::of(point.ttl))
}

/// The tool choice, carrying a refusal of parallel tool calls (Anthropic's default allows them) in
/// `disable_parallel_tool_use`, on the automatic choice when the client named none.
fn tool_choice(request: &ChatRequest) -> Option<outgoing::Choice<'_>> {
    let disable_parallel_tool_use = request.parallel_tool_calls == Some(false) && !request.tools.is_empty();
    Some(match request.tool_choice.as_ref() {
        None if disable_parallel_tool_use => outgoing::Choice::Auto { disable_parallel_tool_use },
        None => return None,
        Some(ToolChoice::Auto) => outgoing::Choice::Auto { disable_parallel_tool_use },
        Some(ToolChoice::None) => outgoing::Choice::None,
        Some(ToolChoice::Required) => outgoing::Choice::Any { disable_parallel_tool_use },
        Some(ToolChoice::Named(name)) => outgoing::Choice::Tool { name, disable_parallel_tool_use },
    })
}

/// A request body for Anthropic, serialized straight from the neutral request it borrows from (no
/// JSON tree, no copy of the conversation).
pub mod outgoing {
    use serde::Serialize;
    use serde_json::Value;

    use super::tool_input;
    use crate::chat::{DocumentSource, Part};

    #[derive(Debug, Serialize)]
    pub struct Request<'a> {
        pub max_tokens: u32,
        pub messages: Vec<Turn<'a>>,
        pub model: &'a str,
        #[serde(skip_serializing_if = "<[String]>::is_empty")]
        pub stop_sequences: &'a [String],
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        pub stream: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub system: Option<System<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub temperature: Option<f64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub thinking: Option<&'a crate::chat::Schema>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub tool_choice: Option<Choice<'a>>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        pub tools: Vec<Tool<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub top_k: Option<u32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub top_p: Option<f64>,
    }

    /// The system prompt: text, or one block when it carries a cache breakpoint.
    #[derive(Debug, Serialize)]
    #[serde(untagged)]
    pub enum System<'a> {
        Text(&'a str),
        Blocks([SystemBlock<'a>; 1]),
    }

    #[derive(Debug, Serialize)]
    pub struct SystemBlock<'a> {
        pub cache_control: CacheControl,
        pub text: &'a str,
        #[serde(rename = "type")]
        pub kind: &'static str,
    }

    /// A prompt cache breakpoint: `ephemeral`, with the ttl the client asked for.
    #[derive(Debug, Clone, Copy, Serialize)]
    pub struct CacheControl {
        #[serde(skip_serializing_if = "Option::is_none")]
        pub ttl: Option<&'static str>,
        #[serde(rename = "type")]
        pub kind: &'static str,
    }

    impl CacheControl {
        pub fn of(ttl: Option<crate::chat::CacheTtl>) -> Self {
            CacheControl { ttl: ttl.map(crate::chat::CacheTtl::as_str), kind: "ephemeral" }
        }
    }

    /// One side's turn.
    #[derive(Debug, Serialize)]
    pub struct Turn<'a> {
        pub content: Vec<Block<'a>>,
        pub role: &'static str,
    }

    /// A content block, in requests and in replies to clients.
    #[derive(Debug, Serialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    pub enum Block<'a> {
        Text {
            text: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            cache_control: Option<CacheControl>,
        },
        ToolUse {
            id: &'a str,
            input: Value,
            name: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            cache_control: Option<CacheControl>,
        },
        Image {
            source: ImageSource<'a>,
            #[serde(skip_serializing_if = "Option::is_none")]
            cache_control: Option<CacheControl>,
        },
        ToolResult {
            content: ResultContent<'a>,
            is_error: bool,
            tool_use_id: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            cache_control: Option<CacheControl>,
        },
        Thinking {
            signature: &'a str,
            thinking: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            cache_control: Option<CacheControl>,
        },
        RedactedThinking {
            data: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            cache_control: Option<CacheControl>,
        },
        Document {
            source: DocumentBlockSource<'a>,
            #[serde(skip_serializing_if = "Option::is_none")]
            title: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            cache_control: Option<CacheControl>,
        },
    }

    impl<'a> Block<'a> {
        /// The block of a neutral part (an image's `data:` URL becomes a base64 source).
        pub fn of(part: &'a Part) -> Self {
            match part {
                Part::Text(text) => Block::Text { text, cache_control: None },
                Part::ToolCall { id, name, arguments } => Block::ToolUse { id, input: tool_input(arguments), name, cache_control: None },
                Part::Image { url } => Block::Image {
                    source: match crate::chat::data_url(url) {
                        Some((media_type, data)) => ImageSource::Base64 { data, media_type },
                        None => ImageSource::Url { url },
                    },
                    cache_control: None,
                },
                Part::ToolResult { call_id, content, is_error, media } => Block::ToolResult {
                    content: if media.is_empty() {
                        ResultContent::Text(content)
                    } else {
                        let text = (!content.is_empty()).then(|| Block::Text { text: content, cache_control: None });
                        ResultContent::Blocks(text.into_iter().chain(media.iter().map(Block::of)).collect())
                    },
                    is_error: *is_error,
                    tool_use_id: call_id,
                    cache_control: None,
                },
                Part::Thinking { text, signature } => Block::Thinking { signature, thinking: text, cache_control: None },
                Part::RedactedThinking { data } => Block::RedactedThinking { data, cache_control: None },
                Part::Document { source, name } => Block::Document {
                    source: match source {
                        DocumentSource::Base64 { media_type, data } => DocumentBlockSource::Base64 { data, media_type },
                        DocumentSource::Url(url) => DocumentBlockSource::Url { url },
                        DocumentSource::Text(data) => DocumentBlockSource::Text { data, media_type: "text/plain" },
                    },
                    title: name.as_deref(),
                    cache_control: None,
                },
            }
        }

        /// Sets the block's cache breakpoint.
        pub fn cache(&mut self, control: CacheControl) {
            match self {
                Block::Text { cache_control, .. }
                | Block::ToolUse { cache_control, .. }
                | Block::Image { cache_control, .. }
                | Block::ToolResult { cache_control, .. }
                | Block::Thinking { cache_control, .. }
                | Block::RedactedThinking { cache_control, .. }
                | Block::Document { cache_control, .. } => *cache_control = Some(control),
            }
        }
    }

    #[derive(Debug, Serialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    pub enum ImageSource<'a> {
        Base64 { data: &'a str, media_type: &'a str },
        Url { url: &'a str },
    }

    /// A tool result's content: its text alone, or blocks when it returned images or files.
    #[derive(Debug, Serialize)]
    #[serde(untagged)]
    pub enum ResultContent<'a> {
        Text(&'a str),
        Blocks(Vec<Block<'a>>),
    }

    #[derive(Debug, Serialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    pub enum DocumentBlockSource<'a> {
        Base64 { data: &'a str, media_type: &'a str },
        Url { url: &'a str },
        Text { data: &'a str, media_type: &'static str },
    }

    #[derive(Debug, Serialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    pub enum Choice<'a> {
        Auto {
            #[serde(skip_serializing_if = "std::ops::Not::not")]
            disable_parallel_tool_use: bool,
        },
        None,
        Any {
            #[serde(skip_serializing_if = "std::ops::Not::not")]
            disable_parallel_tool_use: bool,
        },
        Tool {
            name: &'a str,
            #[serde(skip_serializing_if = "std::ops::Not::not")]
            disable_parallel_tool_use: bool,
        },
    }

    #[derive(Debug, Serialize)]
    pub struct Tool<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        pub cache_control: Option<CacheControl>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub description: Option<&'a str>,
        pub input_schema: &'a crate::chat::Schema,
        pub name: &'a str,
    }
}

/// A whole reply from its body: a reply of the expected shape is read into borrowed typed parts, any
/// other through its `Value` (`parse_reply`), which decides.
pub fn parse_reply_body(body: &[u8]) -> Result<ChatReply, String> {
    if let Ok(reply) = crate::typed::from_json::<incoming::Reply<'_>>(body) {
        return Ok(reply.into_reply());
    }
    serde_json::from_slice::<Value>(body).map_err(|error| error.to_string()).and_then(|body| parse_reply(&body))
}

/// Reads Anthropic's `message`.
pub fn parse_reply(body: &Value) -> Result<ChatReply, String> {
    let content = body.get("content").and_then(Value::as_array).ok_or("no content in the provider's reply")?;
    let mut parts = Vec::new();
    for block in content {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => parts.push(Part::Text(block.get("text").and_then(Value::as_str).unwrap_or_default().to_string())),
            Some("thinking") => parts.push(Part::Thinking {
                text: block.get("thinking").and_then(Value::as_str).unwrap_or_default().to_string(),
                signature: block.get("signature").and_then(Value::as_str).unwrap_or_default().to_string(),
            }),
            Some("redacted_thinking") => {
                parts.push(Part::RedactedThinking { data: block.get("data").and_then(Value::as_str).unwrap_or_default().to_string() })
            }
            Some("tool_use") => parts.push(Part::ToolCall {
                id: block.get("id").and_then(Value::as_str).unwrap_or_default().to_string(),
                name: block.get("name").and_then(Value::as_str).unwrap_or_default().to_string(),
                arguments: block.get("input").map_or_else(|| "{}".to_string(), Value::to_string),
            }),
            _ => {}
        }
    }
    let counts = CacheCounts::of_value(body.get("usage").unwrap_or(&Value::Null), CacheCounts::default());
    let output_tokens = body.pointer("/usage/output_tokens").and_then(Value::as_u64).unwrap_or(0);
    Ok(ChatReply {
        id: body.get("id").and_then(Value::as_str).unwrap_or_default().to_string(),
        model: body.get("model").and_then(Value::as_str).unwrap_or_default().to_string(),
        parts,
        finish: parse_stop(body.get("stop_reason").and_then(Value::as_str).unwrap_or("end_turn")),
        usage: usage_of(counts, output_tokens),
        logprobs: None,
    })
}

/// Turns Anthropic's SSE events into neutral events.
#[derive(Debug, Default)]
pub struct StreamReader {
    /// The prompt's counts from `message_start`.
    prompt: CacheCounts,
    /// Content block index of each tool call, in call order.
    tool_blocks: Vec<u64>,
}

impl StreamReader {
    /// The events of one SSE event (`data` is its JSON payload).
    pub fn read(&mut self, data: &str) -> Result<Vec<ChatEvent>, String> {
        // An event of the expected shape is read into borrowed typed parts; anything else (an error
        // event, a member of another type) goes through the `Value` reading, which decides.
        if let Ok(event) = serde_json::from_str::<incoming::Event<'_>>(data)
            && let Some(events) = self.read_typed(event)
        {
            return Ok(events);
        }
        let payload: Value = serde_json::from_str(data).map_err(|error| format!("undecodable stream event: {error}"))?;
        self.read_value(&payload)
    }

    /// The events of a typed event, as `read_value` reads the same event; None for an error event.
    fn read_typed(&mut self, event: incoming::Event<'_>) -> Option<Vec<ChatEvent>> {
        let mut events = Vec::new();
        match event.kind.as_deref() {
            Some("message_start") => {
                let usage = event.message.and_then(|message| message.usage).unwrap_or_default();
                self.prompt = usage.counts(CacheCounts::default());
            }
            Some("content_block_start") => {
                let block = event.content_block.unwrap_or_default();
                if block.kind.as_deref() == Some("tool_use") {
                    self.tool_blocks.push(event.index.unwrap_or(0));
                    events.push(ChatEvent::ToolCallStart {
                        index: self.tool_blocks.len() - 1,
                        id: block.id.map(Cow::into_owned).unwrap_or_default(),
                        name: block.name.map(Cow::into_owned).unwrap_or_default(),
                    });
                } else if block.kind.as_deref() == Some("thinking") {
                    if let Some(thinking) = block.thinking.filter(|thinking| !thinking.is_empty()) {
                        events.push(ChatEvent::ThinkingDelta(thinking.into_owned()));
                    }
                } else if block.kind.as_deref() == Some("redacted_thinking") {
                    events.push(ChatEvent::RedactedThinking(block.data.map(Cow::into_owned).unwrap_or_default()));
                } else if let Some(text) = block.text.filter(|text| !text.is_empty()) {
                    events.push(ChatEvent::TextDelta(text.into_owned()));
                }
            }
            Some("content_block_delta") => {
                let delta = event.delta.unwrap_or_default();
                match delta.kind.as_deref() {
                    Some("text_delta") => events.push(ChatEvent::TextDelta(delta.text.map(Cow::into_owned).unwrap_or_default())),
                    Some("thinking_delta") => {
                        events.push(ChatEvent::ThinkingDelta(delta.thinking.map(Cow::into_owned).unwrap_or_default()))
                    }
                    Some("signature_delta") => {
                        events.push(ChatEvent::ThinkingSignature(delta.signature.map(Cow::into_owned).unwrap_or_default()));
                    }
                    Some("input_json_delta") => {
                        let block_index = event.index.unwrap_or(0);
                        let index = self.tool_blocks.iter().position(|block| *block == block_index).unwrap_or(0);
                        if let Some(arguments) = delta.partial_json.filter(|arguments| !arguments.is_empty()) {
                            events.push(ChatEvent::ToolCallDelta { index, arguments: arguments.into_owned() });
                        }
                    }
                    _ => {}
                }
            }
            Some("message_delta") => {
                if let Some(reason) = event.delta.and_then(|delta| delta.stop_reason) {
                    events.push(ChatEvent::Finish(parse_stop(&reason)));
                }
                // A `usage` member counts even when null, as `read_value` counts it.
                if let Some(usage) = event.usage {
                    let usage = usage.unwrap_or_default();
                    events.push(ChatEvent::Usage(usage_of(usage.counts(self.prompt), usage.output_tokens.unwrap_or(0))));
                }
            }
            Some("error") => return None,
            _ => {}
        }
        Some(events)
    }

    /// The events of an SSE event read as a `Value` (any shape).
    fn read_value(&mut self, payload: &Value) -> Result<Vec<ChatEvent>, String> {
        let mut events = Vec::new();
        match payload.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                self.prompt = CacheCounts::of_value(payload.pointer("/message/usage").unwrap_or(&Value::Null), CacheCounts::default());
            }
            Some("content_block_start") => {
                let block = payload.get("content_block").unwrap_or(&Value::Null);
                if block.get("type").and_then(Value::as_str) == Some("tool_use") {
                    let block_index = payload.get("index").and_then(Value::as_u64).unwrap_or(0);
                    self.tool_blocks.push(block_index);
                    events.push(ChatEvent::ToolCallStart {
                        index: self.tool_blocks.len() - 1,
                        id: block.get("id").and_then(Value::as_str).unwrap_or_default().to_string(),
                        name: block.get("name").and_then(Value::as_str).unwrap_or_default().to_string(),
                    });
                } else if block.get("type").and_then(Value::as_str) == Some("thinking") {
                    if let Some(thinking) = block.get("thinking").and_then(Value::as_str).filter(|thinking| !thinking.is_empty()) {
                        events.push(ChatEvent::ThinkingDelta(thinking.to_string()));
                    }
                } else if block.get("type").and_then(Value::as_str) == Some("redacted_thinking") {
                    events.push(ChatEvent::RedactedThinking(block.get("data").and_then(Value::as_str).unwrap_or_default().to_string()));
                } else if let Some(text) = block.get("text").and_then(Value::as_str).filter(|text| !text.is_empty()) {
                    events.push(ChatEvent::TextDelta(text.to_string()));
                }
            }
            Some("content_block_delta") => {
                let delta = payload.get("delta").unwrap_or(&Value::Null);
                let text = |field: &str| delta.get(field).and_then(Value::as_str).unwrap_or_default().to_string();
                match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => events.push(ChatEvent::TextDelta(text("text"))),
                    Some("thinking_delta") => events.push(ChatEvent::ThinkingDelta(text("thinking"))),
                    Some("signature_delta") => events.push(ChatEvent::ThinkingSignature(text("signature"))),
                    Some("input_json_delta") => {
                        let block_index = payload.get("index").and_then(Value::as_u64).unwrap_or(0);
                        let index = self.tool_blocks.iter().position(|block| *block == block_index).unwrap_or(0);
                        let arguments = delta.get("partial_json").and_then(Value::as_str).unwrap_or_default();
                        if !arguments.is_empty() {
                            events.push(ChatEvent::ToolCallDelta { index, arguments: arguments.to_string() });
                        }
                    }
                    _ => {}
                }
            }
            Some("message_delta") => {
                if let Some(reason) = payload.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    events.push(ChatEvent::Finish(parse_stop(reason)));
                }
                if let Some(usage) = payload.get("usage") {
                    let output_tokens = usage.get("output_tokens").and_then(Value::as_u64).unwrap_or(0);
                    events.push(ChatEvent::Usage(usage_of(CacheCounts::of_value(usage, self.prompt), output_tokens)));
                }
            }
            Some("error") => return Err(format!("provider stream error: {}", payload.get("error").unwrap_or(&Value::Null))),
            _ => {}
        }
        Ok(events)
    }
}

/// An Anthropic stream event of the expected shape, borrowing its strings.
mod incoming {
    use std::borrow::Cow;

    use serde::Deserialize;

    #[derive(Deserialize)]
    pub(super) struct Event<'a> {
        #[serde(rename = "type", borrow, default)]
        pub kind: Option<Cow<'a, str>>,
        #[serde(default)]
        pub index: Option<u64>,
        #[serde(default)]
        pub message: Option<Message>,
        #[serde(borrow, default)]
        pub content_block: Option<Block<'a>>,
        #[serde(borrow, default)]
        pub delta: Option<Delta<'a>>,
        /// Present (even as null) or absent.
        #[serde(default, deserialize_with = "crate::chat::presence::value")]
        pub usage: Option<Option<Usage>>,
    }

    #[derive(Deserialize)]
    pub(super) struct Message {
        #[serde(default)]
        pub usage: Option<Usage>,
    }

    #[derive(Deserialize, Default)]
    pub(super) struct Block<'a> {
        #[serde(rename = "type", borrow, default)]
        pub kind: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        pub id: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        pub name: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        pub text: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        pub thinking: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        pub data: Option<Cow<'a, str>>,
    }

    #[derive(Deserialize, Default)]
    pub(super) struct Delta<'a> {
        #[serde(rename = "type", borrow, default)]
        pub kind: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        pub text: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        pub partial_json: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        pub thinking: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        pub signature: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        pub stop_reason: Option<Cow<'a, str>>,
    }

    #[derive(Deserialize, Default)]
    pub(super) struct Usage {
        #[serde(default)]
        pub input_tokens: Option<u64>,
        #[serde(default)]
        pub output_tokens: Option<u64>,
        #[serde(default)]
        pub cache_creation_input_tokens: Option<u64>,
        #[serde(default)]
        pub cache_read_input_tokens: Option<u64>,
        #[serde(default)]
        pub cache_creation: Option<CacheCreation>,
    }

    /// The cache writes by time kept.
    #[derive(Deserialize, Default)]
    pub(super) struct CacheCreation {
        #[serde(default)]
        pub ephemeral_1h_input_tokens: Option<u64>,
    }

    impl Usage {
        /// The prompt's counts, a member absent taking `fallback`'s.
        pub(super) fn counts(&self, fallback: super::CacheCounts) -> super::CacheCounts {
            super::CacheCounts {
                input: self.input_tokens.unwrap_or(fallback.input),
                cache_write_long: self
                    .cache_creation
                    .as_ref()
                    .and_then(|creation| creation.ephemeral_1h_input_tokens)
                    .unwrap_or(fallback.cache_write_long),
                cache_write: self.cache_creation_input_tokens.unwrap_or(fallback.cache_write),
                cache_read: self.cache_read_input_tokens.unwrap_or(fallback.cache_read),
            }
        }
    }

    /// A whole reply of the expected shape.
    #[derive(Deserialize)]
    pub(super) struct Reply<'a> {
        #[serde(borrow)]
        content: Vec<ReplyBlock<'a>>,
        #[serde(borrow, default)]
        id: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        model: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        stop_reason: Option<Cow<'a, str>>,
        #[serde(default)]
        usage: Option<Usage>,
    }

    #[derive(Deserialize)]
    struct ReplyBlock<'a> {
        #[serde(rename = "type", borrow, default)]
        kind: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        text: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        id: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        name: Option<Cow<'a, str>>,
        /// Present (even as null) or absent.
        #[serde(default, deserialize_with = "crate::chat::presence::value")]
        input: Option<serde_json::Value>,
        #[serde(borrow, default)]
        thinking: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        signature: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        data: Option<Cow<'a, str>>,
    }

    impl Reply<'_> {
        /// The reply `parse_reply` reads from the same body as a `Value`.
        pub(super) fn into_reply(self) -> crate::chat::ChatReply {
            use crate::chat::{ChatReply, Part};
            let owned = |text: Option<Cow<'_, str>>| text.map(Cow::into_owned).unwrap_or_default();
            let mut parts = Vec::new();
            for block in self.content {
                match block.kind.as_deref() {
                    Some("text") => parts.push(Part::Text(owned(block.text))),
                    Some("thinking") => parts.push(Part::Thinking { text: owned(block.thinking), signature: owned(block.signature) }),
                    Some("redacted_thinking") => parts.push(Part::RedactedThinking { data: owned(block.data) }),
                    Some("tool_use") => parts.push(Part::ToolCall {
                        id: owned(block.id),
                        name: owned(block.name),
                        arguments: block.input.map_or_else(|| "{}".to_string(), |input| input.to_string()),
                    }),
                    _ => {}
                }
            }
            let usage = self.usage.unwrap_or_default();
            ChatReply {
                id: owned(self.id),
                model: owned(self.model),
                parts,
                finish: super::parse_stop(self.stop_reason.as_deref().unwrap_or("end_turn")),
                usage: super::usage_of(usage.counts(super::CacheCounts::default()), usage.output_tokens.unwrap_or(0)),
                logprobs: None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{ReplyAssembler, reply_events};

    #[test]
    fn typed_replies_read_as_their_value_trees_do() -> Result<(), serde_json::Error> {
        let typed = [
            r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[{"type":"text","text":"h\u00e9llo"},{"type":"tool_use","id":"toolu_1","name":"lookup","input":{"z":1,"a":[true,null]}}],"stop_reason":"tool_use","usage":{"input_tokens":12,"output_tokens":7}}"#,
            r#"{"content":[{"type":"tool_use","name":"f","input":null},{"type":"tool_use","name":"g"},{"type":"thinking","thinking":"x"},{"text":"untyped"}],"stop_reason":null,"usage":null}"#,
            r#"{"content":[],"usage":{"input_tokens":3}}"#,
            r#"{"content":[],"usage":{"input_tokens":3,"cache_creation_input_tokens":2048,"cache_read_input_tokens":null,"output_tokens":1,"service_tier":"standard"}}"#,
            r#"{"content":[],"usage":{"input_tokens":3,"cache_creation_input_tokens":2048,"cache_creation":{"ephemeral_5m_input_tokens":48,"ephemeral_1h_input_tokens":2000}}}"#,
            r#"{"content":[{"type":"thinking","thinking":"let me see","signature":"c2ln"},{"type":"redacted_thinking","data":"ZW5j"},{"type":"text","text":"42"}],"stop_reason":"end_turn"}"#,
            r#"{"content":[{"type":"thinking"},{"type":"redacted_thinking"}]}"#,
        ];
        for body in typed {
            let reply: incoming::Reply<'_> = serde_json::from_str(body)?;
            assert_eq!(Ok(reply.into_reply()), parse_reply(&serde_json::from_str(body)?), "{body}");
        }
        // Bodies the typed reading does not take read as their `Value`s do.
        for body in [
            r#"{"content":null}"#,
            r#"{"id":"m"}"#,
            r#"{"content":["text"],"id":"m"}"#,
            r#"{"content":[{"type":"text","text":5}]}"#,
            r#"{"content":[],"usage":{"input_tokens":-1}}"#,
            r#"{"content":[],"usage":{"input_tokens":1,"cache_read_input_tokens":"9"}}"#,
            r#"{"content":[],"usage":{"input_tokens":1,"cache_creation":7}}"#,
        ] {
            assert!(serde_json::from_str::<incoming::Reply<'_>>(body).is_err(), "{body}");
            assert_eq!(parse_reply_body(body.as_bytes()), parse_reply(&serde_json::from_str(body)?), "{body}");
        }
        assert!(parse_reply_body(b"not json").is_err());
        Ok(())
    }

    #[test]
    fn block_deltas_read_byte_for_byte_as_the_value_built_ones() {
        let text = "h\u{e9}llo \"quoted\" \\ \n\t\u{1}";
        assert_eq!(
            block_delta(3, "text_delta", "text", text),
            event("content_block_delta", json!({"type": "content_block_delta", "index": 3, "delta": {"type": "text_delta", "text": text}}))
        );
        assert_eq!(
            block_delta(0, "input_json_delta", "partial_json", "{\"q\":"),
            event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{\"q\":"}})
            )
        );
    }

    #[test]
    fn typed_stream_events_read_as_their_value_trees_do() -> Result<(), serde_json::Error> {
        let stream = [
            r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude","usage":{"input_tokens":12,"output_tokens":1}}}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            r#"{"type":"ping"}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"h\u00e9llo \"x\""}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta"}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"lookup","input":{}}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"q\":"}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}"#,
            r#"{"type":"content_block_start","index":2,"content_block":{"type":"text","text":"more"}}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":7}}"#,
            r#"{"type":"message_start","message":{"usage":{"input_tokens":4,"cache_creation_input_tokens":0,"cache_read_input_tokens":1500,"output_tokens":1}}}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":9}}"#,
            r#"{"type":"message_delta","delta":{},"usage":{"input_tokens":5,"cache_creation_input_tokens":100,"output_tokens":9}}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":null},"usage":null}"#,
            r#"{"type":"content_block_start","index":3,"content_block":{"type":"thinking","thinking":""}}"#,
            r#"{"type":"content_block_start","index":3,"content_block":{"type":"thinking","thinking":"already"}}"#,
            r#"{"type":"content_block_delta","index":3,"delta":{"type":"thinking_delta","thinking":"step \"one\""}}"#,
            r#"{"type":"content_block_delta","index":3,"delta":{"type":"signature_delta","signature":"c2ln"}}"#,
            r#"{"type":"content_block_start","index":4,"content_block":{"type":"redacted_thinking","data":"ZW5j"}}"#,
            r#"{"type":"content_block_start","index":5,"content_block":{"type":"redacted_thinking"}}"#,
            r#"{"type":"message_delta","delta":{}}"#,
            r#"{"type":"message_stop"}"#,
            r#"{}"#,
        ];
        let (mut typed, mut by_value) = (StreamReader::default(), StreamReader::default());
        for data in stream {
            let event: incoming::Event<'_> = serde_json::from_str(data)?;
            assert_eq!(typed.read_typed(event), by_value.read_value(&serde_json::from_str(data)?).ok(), "{data}");
        }
        // Events the typed reading does not take read as their `Value`s do.
        for data in [
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            r#"{"type":7}"#,
            r#"{"type":"content_block_delta","index":-1,"delta":{"type":"text_delta","text":"a"}}"#,
            r#"{"type":"message_delta","usage":3}"#,
            r#"{"type":"message_start","message":{"usage":{"input_tokens":1.5}}}"#,
        ] {
            let (mut direct, mut by_value) = (StreamReader::default(), StreamReader::default());
            assert_eq!(direct.read(data), by_value.read_value(&serde_json::from_str(data)?), "{data}");
        }
        Ok(())
    }

    #[test]
    fn prompt_cache_counts_are_read_and_written_as_anthropic_counts_them() -> Result<(), String> {
        // Anthropic's `input_tokens` leaves the cache's out; the neutral count holds every prompt token.
        let reply = parse_reply_body(
            br#"{"content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":10,"cache_creation_input_tokens":200,"cache_read_input_tokens":3000,"output_tokens":5}}"#,
        )?;
        let usage = Usage { cache_read_tokens: 3000, cache_write_tokens: 200, ..Usage::uncached(3210, 5) };
        assert_eq!(reply.usage, usage);
        let rendered = serde_json::to_value(render_reply(&reply)).unwrap_or_default();
        assert_eq!(
            rendered["usage"],
            json!({"input_tokens": 10, "cache_creation_input_tokens": 200, "cache_read_input_tokens": 3000, "output_tokens": 5,
                   "cache_creation": {"ephemeral_5m_input_tokens": 200, "ephemeral_1h_input_tokens": 0}})
        );
        // A stream: the prompt's counts come with `message_start`, the output's with `message_delta`.
        let mut reader = StreamReader::default();
        reader.read(r#"{"type":"message_start","message":{"usage":{"input_tokens":10,"cache_creation_input_tokens":200,"cache_read_input_tokens":3000,"output_tokens":1}}}"#)?;
        assert_eq!(reader.read(r#"{"type":"message_delta","delta":{},"usage":{"output_tokens":5}}"#)?, vec![ChatEvent::Usage(usage)]);
        let mut writer = StreamWriter::new("msg_1".to_string(), "claude".to_string(), 3210);
        writer.write(&ChatEvent::Usage(usage));
        let end = writer.end().concat();
        assert!(
            end.contains(
                r#""usage":{"cache_creation":{"ephemeral_1h_input_tokens":0,"ephemeral_5m_input_tokens":200},"cache_creation_input_tokens":200,"cache_read_input_tokens":3000,"input_tokens":10,"output_tokens":5}"#
            ),
            "{end}"
        );
        // One-hour writes, as Anthropic breaks them down.
        let long = parse_reply_body(
            br#"{"content":[],"usage":{"input_tokens":1,"cache_creation_input_tokens":300,"cache_creation":{"ephemeral_5m_input_tokens":100,"ephemeral_1h_input_tokens":200},"output_tokens":2}}"#,
        )?;
        assert_eq!(long.usage, Usage { cache_write_tokens: 300, cache_write_long_tokens: 200, ..Usage::uncached(301, 2) });
        // Without caching, nothing more is written than before.
        let plain = serde_json::to_value(render_reply(&ChatReply { usage: Usage::uncached(7, 2), ..reply })).unwrap_or_default();
        assert_eq!(plain["usage"], json!({"input_tokens": 7, "output_tokens": 2}));
        Ok(())
    }

    #[test]
    fn documents_are_read_and_written_as_anthropic_blocks() -> Result<(), InvalidRequest> {
        let body = json!({"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}, "title": "report.pdf",
             "citations": {"enabled": true}, "context": "Q3"},
            {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}, "cache_control": {"type": "ephemeral"}},
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain notes"}},
            {"type": "document", "source": {"type": "content", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}},
            {"type": "text", "text": "summarize"}]}]});
        // The typed reading leaves documents to the tree reading.
        assert!(read_request(body.to_string().as_bytes()).is_none());
        let request = parse_request(&body)?;
        let document = |source: DocumentSource, name: Option<&str>| Part::Document { source, name: name.map(str::to_string) };
        assert_eq!(
            request.messages[0].parts,
            vec![
                document(
                    DocumentSource::Base64 { media_type: "application/pdf".to_string(), data: "JVBERi0=".to_string() },
                    Some("report.pdf")
                ),
                document(DocumentSource::Url("https://example.com/a.pdf".to_string()), None),
                document(DocumentSource::Text("plain notes".to_string()), None),
                document(DocumentSource::Text("one\ntwo".to_string()), None),
                Part::Text("summarize".to_string()),
            ]
        );
        assert_eq!(request.cache_points, vec![CachePoint { at: CacheAt::Part { message: 0, part: 1 }, ttl: None }]);
        // Plain-text documents are part of the text guardrails read.
        assert_eq!(request.messages[0].text(), "plain notes\none\ntwo\nsummarize");
        let built = serde_json::to_value(build_request(&request, "claude", 100)).unwrap_or_default();
        assert_eq!(
            built["messages"][0]["content"],
            json!([
                {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}, "title": "report.pdf"},
                {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}, "cache_control": {"type": "ephemeral"}},
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain notes"}},
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "one\ntwo"}},
                {"type": "text", "text": "summarize"},
            ])
        );
        // Refused, not dropped: a file id, a broken source, and kinds the gateway cannot carry.
        let code = |block: Value| {
            parse_request(&json!({"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": [block]}]}))
                .err()
                .map(|error| error.code)
        };
        assert_eq!(code(json!({"type": "document", "source": {"type": "file", "file_id": "file_1"}})), Some("unsupported_content"));
        assert_eq!(code(json!({"type": "document"})), Some("missing_field"));
        assert_eq!(code(json!({"type": "document", "source": {"type": "base64", "data": "JVBERi0="}})), Some("invalid_request"));
        assert_eq!(code(json!({"type": "document", "source": {"type": "pdf"}})), Some("invalid_request"));
        assert_eq!(
            code(json!({"type": "document", "source": {"type": "content", "content": [{"type": "image", "source": {}}]}})),
            Some("unsupported_content")
        );
        assert_eq!(code(json!({"type": "search_result", "source": "s", "title": "t", "content": []})), Some("unsupported_content"));
        Ok(())
    }

    /// A tool's screenshot or file stays with its result: in Anthropic's own blocks, after the tool
    /// messages for OpenAI (whose tool messages are text), after the function responses for Gemini.
    #[test]
    fn images_and_files_a_tool_returned_reach_every_format() -> Result<(), InvalidRequest> {
        let body = json!({"model": "c", "max_tokens": 5, "messages": [
            {"role": "user", "content": "open the page"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}},
                                              {"type": "tool_use", "id": "toolu_2", "name": "title", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                    {"type": "text", "text": "the page"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"}},
                    {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "its source"}}]},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "Home"}]}]});
        assert!(read_request(body.to_string().as_bytes()).is_none(), "images are the tree reading's");
        let request = parse_request(&body)?;
        let image = Part::Image { url: "data:image/png;base64,iVBORw0K".to_string() };
        assert_eq!(
            request.messages[2].parts,
            vec![
                Part::ToolResult {
                    call_id: "toolu_1".to_string(),
                    content: "the page\nits source".to_string(),
                    is_error: false,
                    media: vec![image]
                },
                Part::ToolResult { call_id: "toolu_2".to_string(), content: "Home".to_string(), is_error: false, media: vec![] },
            ]
        );
        assert!(request.has_images());
        let anthropic = serde_json::to_value(build_request(&request, "claude", 100)).unwrap_or_default();
        assert_eq!(
            anthropic["messages"][2]["content"],
            json!([
                {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": false, "content": [
                    {"type": "text", "text": "the page\nits source"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"}}]},
                {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": false, "content": "Home"},
            ])
        );
        let openai =
            serde_json::to_value(crate::openai::build_request(&request, "gpt", crate::openai::TokenLimit::MaxTokens)).unwrap_or_default();
        let messages = openai["messages"].as_array().cloned().unwrap_or_default();
        assert_eq!(
            messages.iter().map(|message| message["role"].clone()).collect::<Vec<_>>(),
            [json!("user"), json!("assistant"), json!("tool"), json!("tool"), json!("user")]
        );
        assert_eq!(messages[2]["content"], "the page\nits source");
        assert_eq!(
            messages[4]["content"],
            json!([{"type": "text", "text": "Images and files returned by the tool call with id:"}, {"type": "text", "text": "toolu_1"},
                   {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}}])
        );
        let gemini = crate::gemini::build_request(&request);
        let parts = &gemini["contents"][2]["parts"];
        assert_eq!((&parts[0]["functionResponse"]["name"], &parts[1]["functionResponse"]["name"]), (&json!("screenshot"), &json!("title")));
        assert_eq!(parts[2], json!({"inlineData": {"mimeType": "image/png", "data": "iVBORw0K"}}));
        Ok(())
    }

    #[test]
    fn client_bodies_are_validated() {
        let code = |body: Value| parse_request(&body).err().map(|error| error.code);
        assert_eq!(code(json!({"model": "claude", "messages": [{"role": "user", "content": "hi"}]})), Some("missing_field"));
        assert!(parse_request(&json!({"model": "c", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})).is_err());
        assert!(
            parse_request(&json!({"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "temperature": 1.5}))
                .is_err()
        );
        for top_k in [json!(0), json!(-1), json!(2.5), json!("5")] {
            let body = json!({"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "top_k": top_k});
            assert_eq!(parse_request(&body).err().map(|error| error.message), Some("top_k must be a positive integer".to_string()));
            assert!(read_request(body.to_string().as_bytes()).is_none(), "left to the tree reading");
        }
    }

    #[test]
    fn replies_render_as_messages() {
        let reply = ChatReply {
            id: "msg_1".to_string(),
            model: "anthropic/claude".to_string(),
            parts: vec![
                Part::Text("let me look".to_string()),
                Part::ToolCall { id: "toolu_9".to_string(), name: "f".to_string(), arguments: "{\"a\":1}".to_string() },
            ],
            finish: FinishReason::ToolCalls,
            usage: Usage::uncached(4, 6),
            logprobs: None,
        };
        assert_eq!(
            serde_json::to_value(render_reply(&reply)).unwrap_or_default(),
            json!({
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "anthropic/claude",
                "content": [{"type": "text", "text": "let me look"}, {"type": "tool_use", "id": "toolu_9", "name": "f", "input": {"a": 1}}],
                "stop_reason": "tool_use",
                "stop_sequence": null,
                "usage": {"input_tokens": 4, "output_tokens": 6},
            })
        );
    }

    #[test]
    fn upstream_requests_serialize_every_member_from_the_neutral_request() {
        let part = |text: &str| Part::Text(text.to_string());
        let request = ChatRequest {
            model: "anthropic/claude".to_string(),
            system: Some("be brief".to_string()),
            messages: vec![
                Message { role: Role::User, parts: vec![part("look"), Part::Image { url: "data:image/jpeg;base64,AAAA".to_string() }] },
                Message { role: Role::User, parts: vec![Part::Image { url: "https://example.com/cat.png".to_string() }] },
                Message {
                    role: Role::Assistant,
                    parts: vec![
                        part("calling"),
                        Part::ToolCall { id: "t1".to_string(), name: "f".to_string(), arguments: "{\"b\":1,\"a\":[2]}".to_string() },
                        Part::ToolCall { id: "t2".to_string(), name: "g".to_string(), arguments: "3".to_string() },
                        Part::ToolCall { id: "t3".to_string(), name: "h".to_string(), arguments: " ".to_string() },
                        Part::ToolCall { id: "t4".to_string(), name: "i".to_string(), arguments: "{oops".to_string() },
                    ],
                },
                Message { role: Role::User, parts: vec![part("and?")] },
                Message {
                    role: Role::Tool,
                    parts: vec![Part::ToolResult {
                        call_id: "t1".to_string(),
                        content: "no".to_string(),
                        is_error: true,
                        media: Vec::new(),
                    }],
                },
            ],
            tools: vec![
                Tool { name: "f".to_string(), description: Some("finds".to_string()), parameters: json!({"type": "object"}).into() },
                Tool { name: "g".to_string(), description: None, parameters: json!({"type": "object", "properties": {}}).into() },
            ],
            tool_choice: Some(ToolChoice::Named("f".to_string())),
            max_tokens: None,
            temperature: Some(1.5),
            top_p: Some(0.5),
            top_k: Some(40),
            stop: vec!["END".to_string()],
            stream: true,
            stream_usage: true,
            user: Some("ignored".to_string()),
            // Anthropic has no such members: not sent.
            response_format: Some(json!({"type": "json_object"}).into()),
            parallel_tool_calls: Some(true),
            openai: crate::chat::OpenAiOptions { seed: Some(1), presence_penalty: Some(1.0), ..Default::default() },
            cache_points: vec![
                CachePoint { at: CacheAt::System, ttl: None },
                CachePoint { at: CacheAt::Tool(1), ttl: Some(CacheTtl::FiveMinutes) },
                CachePoint { at: CacheAt::Part { message: 2, part: 1 }, ttl: None },
                // The tool result merges into the turn before it, and moves to its front.
                CachePoint { at: CacheAt::Part { message: 4, part: 0 }, ttl: Some(CacheTtl::OneHour) },
            ],
            thinking: Some(json!({"type": "enabled", "budget_tokens": 2048}).into()),
        };
        let built = serde_json::to_value(build_request(&request, "claude-x", 99)).unwrap_or_default();
        assert_eq!(
            built,
            json!({
                "model": "claude-x",
                "max_tokens": 99,
                "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
                "messages": [
                    {"role": "user", "content": [
                        {"type": "text", "text": "look"},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "AAAA"}},
                        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
                    ]},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "calling"},
                        {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": [2], "b": 1}, "cache_control": {"type": "ephemeral"}},
                        {"type": "tool_use", "id": "t2", "name": "g", "input": {"value": 3}},
                        {"type": "tool_use", "id": "t3", "name": "h", "input": {}},
                        {"type": "tool_use", "id": "t4", "name": "i", "input": {"raw_arguments": "{oops"}},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "no", "is_error": true,
                         "cache_control": {"type": "ephemeral", "ttl": "1h"}},
                        {"type": "text", "text": "and?"},
                    ]},
                ],
                "tools": [
                    {"name": "f", "description": "finds", "input_schema": {"type": "object"}},
                    {"name": "g", "input_schema": {"type": "object", "properties": {}}, "cache_control": {"type": "ephemeral", "ttl": "5m"}},
                ],
                "tool_choice": {"type": "tool", "name": "f"},
                "thinking": {"type": "enabled", "budget_tokens": 2048},
                "temperature": 1.0,
                "top_p": 0.5,
                "top_k": 40,
                "stop_sequences": ["END"],
                "stream": true,
            })
        );
        let minimal = ChatRequest { messages: vec![Message { role: Role::User, parts: vec![part("hi")] }], ..ChatRequest::default() };
        for (choice, expected) in [(ToolChoice::Auto, "auto"), (ToolChoice::None, "none"), (ToolChoice::Required, "any")] {
            let request = ChatRequest { tool_choice: Some(choice), ..minimal.clone() };
            let built = serde_json::to_value(build_request(&request, "m", 7)).unwrap_or_default();
            assert_eq!(built["tool_choice"], json!({"type": expected}));
        }
        let built = serde_json::to_value(build_request(&minimal, "m", 7)).unwrap_or_default();
        assert_eq!(
            built,
            json!({"model": "m", "max_tokens": 7, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
        );
        // Parallel tool calls refused: on the choice made, or on the automatic one; not without tools.
        let serial = ChatRequest { parallel_tool_calls: Some(false), tools: request.tools.clone(), ..minimal.clone() };
        for (choice, expected) in [
            (None, json!({"type": "auto", "disable_parallel_tool_use": true})),
            (Some(ToolChoice::Required), json!({"type": "any", "disable_parallel_tool_use": true})),
            (Some(ToolChoice::Named("f".to_string())), json!({"type": "tool", "name": "f", "disable_parallel_tool_use": true})),
            (Some(ToolChoice::None), json!({"type": "none"})),
        ] {
            let request = ChatRequest { tool_choice: choice, ..serial.clone() };
            let built = serde_json::to_value(build_request(&request, "m", 7)).unwrap_or_default();
            assert_eq!(built["tool_choice"], expected);
        }
        let toolless = ChatRequest { parallel_tool_calls: Some(false), ..minimal };
        assert_eq!(serde_json::to_value(build_request(&toolless, "m", 7)).unwrap_or_default().get("tool_choice"), None);
    }

    #[test]
    fn cache_breakpoints_are_read_where_their_parts_land_and_checked() -> Result<(), InvalidRequest> {
        let request = parse_request(&json!({"model": "m", "max_tokens": 5,
        "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        "tools": [{"name": "f"}, {"name": "g", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
            // A tool result and text in one turn: the result becomes its own neutral message first.
            {"role": "user", "content": [{"type": "text", "text": "and", "cache_control": {"type": "ephemeral"}},
                                         {"type": "tool_result", "tool_use_id": "t1", "content": "r", "cache_control": {"type": "ephemeral", "ttl": "5m"}}]}
        ]}))?;
        assert_eq!(
            request.cache_points,
            vec![
                CachePoint { at: CacheAt::Part { message: 2, part: 0 }, ttl: Some(CacheTtl::FiveMinutes) },
                CachePoint { at: CacheAt::Part { message: 3, part: 0 }, ttl: None },
                CachePoint { at: CacheAt::System, ttl: Some(CacheTtl::OneHour) },
                CachePoint { at: CacheAt::Tool(1), ttl: None },
            ]
        );
        assert!(matches!(request.messages[2].parts[0], Part::ToolResult { .. }) && request.messages[3].text() == "and");
        // Written back, each breakpoint sits on the block it came from.
        let built = serde_json::to_value(build_request(&request, "m", 5)).unwrap_or_default();
        assert_eq!(built["messages"][2]["content"][0]["cache_control"], json!({"type": "ephemeral", "ttl": "5m"}));
        assert_eq!(built["messages"][2]["content"][1]["cache_control"], json!({"type": "ephemeral"}));
        assert_eq!(built["system"][0]["cache_control"], json!({"type": "ephemeral", "ttl": "1h"}));
        assert_eq!((built["tools"][0].get("cache_control"), &built["tools"][1]["cache_control"]), (None, &json!({"type": "ephemeral"})));
        let refused = parse_request(&json!({"model": "m", "max_tokens": 5,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "q", "cache_control": {"type": "ephemeral", "ttl": "1d"}}]}]}));
        assert_eq!(
            refused.err().map(|error| error.message),
            Some(r#"messages[0].content[].cache_control must be {"type": "ephemeral"}, with an optional ttl of 5m or 1h"#.to_string())
        );
        Ok(())
    }

    #[test]
    fn parallel_tool_use_refusals_are_read() -> Result<(), InvalidRequest> {
        let body =
            |choice: Value| json!({"model": "m", "max_tokens": 5, "tool_choice": choice, "messages": [{"role": "user", "content": "x"}]});
        let read = |choice: Value| parse_request(&body(choice)).map(|request| request.parallel_tool_calls);
        assert_eq!(read(json!({"type": "auto", "disable_parallel_tool_use": true}))?, Some(false));
        assert_eq!(read(json!({"type": "any", "disable_parallel_tool_use": false}))?, Some(true));
        assert_eq!(read(json!({"type": "auto"}))?, None);
        assert_eq!(
            read(json!({"type": "auto", "disable_parallel_tool_use": 1})).err().map(|error| error.message),
            Some("tool_choice.disable_parallel_tool_use must be a boolean".to_string())
        );
        Ok(())
    }

    #[test]
    fn tool_conversations_alternate_turns_when_built() -> Result<(), InvalidRequest> {
        let request = crate::openai::parse_request(&json!({
            "model": "claude-haiku-4-5",
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "checking", "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "rainy"},
                {"role": "user", "content": "thanks"}
            ],
            "tools": [{"type": "function", "function": {"name": "weather", "description": "d", "parameters": {"type": "object"}}}],
            "temperature": 1.7
        }))?;
        let built = serde_json::to_value(build_request(&request, "claude-haiku-4-5", DEFAULT_MAX_TOKENS)).unwrap_or_default();
        assert_eq!(built["system"], "sys");
        assert_eq!(built["max_tokens"], DEFAULT_MAX_TOKENS);
        assert_eq!(built["temperature"], 1.0);
        let roles: Vec<&str> = built["messages"].as_array().into_iter().flatten().filter_map(|message| message["role"].as_str()).collect();
        assert_eq!(roles, vec!["user", "assistant", "user"]);
        assert_eq!(
            built["messages"][1]["content"][1],
            json!({"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}})
        );
        assert_eq!(built["messages"][2]["content"][0]["type"], "tool_result");
        assert_eq!(built["messages"][2]["content"][1], json!({"type": "text", "text": "thanks"}));
        assert_eq!(built["tools"][0]["input_schema"], json!({"type": "object"}));
        // Read back as a client body, the conversation is the same.
        let reread = parse_request(&built)?;
        assert_eq!(reread.messages.len(), 4);
        Ok(())
    }

    #[test]
    fn streams_translate_both_ways() -> Result<(), String> {
        let reply = ChatReply {
            id: "msg_1".to_string(),
            model: "m".to_string(),
            parts: vec![
                Part::Text("let me look".to_string()),
                Part::ToolCall { id: "toolu_9".to_string(), name: "f".to_string(), arguments: "{\"a\":1}".to_string() },
            ],
            finish: FinishReason::ToolCalls,
            usage: Usage::uncached(4, 6),
            logprobs: None,
        };
        let (frames, assembled) = stream_round_trip(&reply)?;
        let names: Vec<&str> =
            frames.iter().filter_map(|frame| frame.lines().next()).map(|line| line.trim_start_matches("event: ")).collect();
        assert_eq!(names.first(), Some(&"message_start"));
        assert_eq!(names.last(), Some(&"message_stop"));
        assert_eq!(names.iter().filter(|name| **name == "content_block_start").count(), 2);
        assert_eq!(assembled, reply);
        Ok(())
    }

    /// The reply written as an Anthropic client's stream, and that stream read back into a reply.
    fn stream_round_trip(reply: &ChatReply) -> Result<(Vec<String>, ChatReply), String> {
        let mut writer = StreamWriter::new(reply.id.clone(), reply.model.clone(), 4);
        let mut frames: Vec<String> = reply_events(reply).iter().flat_map(|event| writer.write(event)).collect();
        frames.extend(writer.end());
        let mut reader = StreamReader::default();
        let mut assembler = ReplyAssembler::default();
        for frame in &frames {
            let data = frame.lines().nth(1).unwrap_or_default().trim_start_matches("data: ");
            for event in reader.read(data)? {
                assembler.push(&event);
            }
        }
        Ok((frames, assembler.into_reply(reply.id.clone(), reply.model.clone())))
    }

    #[test]
    fn thinking_streams_as_anthropic_blocks_and_comes_back_whole() -> Result<(), String> {
        let reply = ChatReply {
            id: "msg_2".to_string(),
            model: "m".to_string(),
            parts: vec![
                Part::Thinking { text: "first thought".to_string(), signature: "c2lnMQ==".to_string() },
                Part::RedactedThinking { data: "ZW5j".to_string() },
                Part::Thinking { text: "second".to_string(), signature: "c2lnMg==".to_string() },
                Part::Text("answer".to_string()),
                Part::ToolCall { id: "toolu_1".to_string(), name: "f".to_string(), arguments: "{}".to_string() },
            ],
            finish: FinishReason::ToolCalls,
            usage: Usage::uncached(4, 6),
            logprobs: None,
        };
        let (frames, assembled) = stream_round_trip(&reply)?;
        let starts: Vec<Value> = frames
            .iter()
            .filter(|frame| frame.starts_with("event: content_block_start"))
            .filter_map(|frame| serde_json::from_str::<Value>(frame.lines().nth(1)?.trim_start_matches("data: ")).ok())
            .map(|event| event["content_block"]["type"].clone())
            .collect();
        assert_eq!(starts, [json!("thinking"), json!("redacted_thinking"), json!("thinking"), json!("text"), json!("tool_use")]);
        assert_eq!(assembled, reply);
        // Rendered whole for an Anthropic client; an OpenAI client sees the answer only.
        let rendered = serde_json::to_value(render_reply(&reply)).unwrap_or_default();
        assert_eq!(rendered["content"][0], json!({"type": "thinking", "thinking": "first thought", "signature": "c2lnMQ=="}));
        assert_eq!(rendered["content"][1], json!({"type": "redacted_thinking", "data": "ZW5j"}));
        let openai = serde_json::to_value(crate::openai::render_reply(&reply, 0, None)).unwrap_or_default();
        assert_eq!(openai["choices"][0]["message"]["content"], "answer");
        let mut openai_writer = crate::openai::StreamWriter::new("c".to_string(), "m".to_string(), 0, false);
        let frames: String = reply_events(&reply).iter().flat_map(|event| openai_writer.write(event)).collect();
        assert!(!frames.contains("thought") && !frames.contains("ZW5j"), "{frames}");
        Ok(())
    }
}
