//! The neutral chat model every client format is read into and every provider format is written from.

use serde_json::Value;

/// Who said a message (system prompts travel separately, in `ChatRequest::system`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    User,
    Assistant,
    /// The result of a tool call, answered back to the model.
    Tool,
}

/// A piece of message content.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text(String),
    /// An image by URL or `data:` URL (passed through where the provider accepts it).
    Image {
        url: String,
    },
    /// The model asked for a tool; `arguments` is JSON text.
    ToolCall {
        id: String,
        name: String,
        arguments: String,
    },
    /// The answer to a tool call: its text, and the images and documents it returned (only `Image`
    /// and `Document` parts: a screenshot, a fetched PDF).
    ToolResult {
        call_id: String,
        content: String,
        is_error: bool,
        media: Vec<Part>,
    },
    /// The model's extended thinking (Anthropic), with the signature that lets it be sent back.
    Thinking {
        text: String,
        signature: String,
    },
    /// Thinking the provider withheld, as its encrypted data (sent back as it came).
    RedactedThinking {
        data: String,
    },
    /// A document for the model to read (a PDF, or plain text), with the name the client gave it.
    Document {
        source: DocumentSource,
        name: Option<String>,
    },
}

impl Part {
    /// A tool result of content parts: their text (plain-text documents included) as its content,
    /// its images and files as its media.
    pub fn tool_result(call_id: String, parts: Vec<Part>, is_error: bool) -> Part {
        let (media, text): (Vec<Part>, Vec<Part>) = parts.into_iter().partition(|part| match part {
            Part::Image { .. } => true,
            Part::Document { source, .. } => !matches!(source, DocumentSource::Text(_)),
            _ => false,
        });
        Part::ToolResult { call_id, content: Message { role: Role::User, parts: text }.text(), is_error, media }
    }
}

/// Where a document's content is.
#[derive(Debug, Clone, PartialEq)]
pub enum DocumentSource {
    /// A file's bytes in base64, with its media type (`application/pdf`).
    Base64 { media_type: String, data: String },
    /// A file the provider fetches itself (Anthropic and Gemini do; OpenAI's chat API does not).
    Url(String),
    /// Plain text.
    Text(String),
}

/// The media type and base64 data of an RFC 2397 `data:` URL with base64 data; None for any other text.
pub fn data_url(url: &str) -> Option<(&str, &str)> {
    url.strip_prefix("data:")?.split_once(";base64,")
}

impl DocumentSource {
    /// The source of a `data:` URL with base64 data (`data_url`); None for any other text.
    pub fn of_data_url(url: &str) -> Option<Self> {
        let (media_type, data) = data_url(url)?;
        Some(DocumentSource::Base64 { media_type: media_type.to_string(), data: data.to_string() })
    }
}

/// One message.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    pub parts: Vec<Part>,
}

impl Message {
    /// The concatenated text parts.
    pub fn text(&self) -> String {
        self.text_borrowed().into_owned()
    }

    /// The text parts, tool results and plain-text documents joined by newlines, borrowed when there
    /// is only one.
    pub fn text_borrowed(&self) -> std::borrow::Cow<'_, str> {
        let mut texts = self.parts.iter().filter_map(|part| match part {
            Part::Text(text) => Some(text.as_str()),
            Part::ToolResult { content, .. } => Some(content.as_str()),
            Part::Document { source: DocumentSource::Text(text), .. } => Some(text.as_str()),
            Part::Image { .. } | Part::ToolCall { .. } | Part::Thinking { .. } | Part::RedactedThinking { .. } | Part::Document { .. } => {
                None
            }
        });
        let Some(first) = texts.next() else { return std::borrow::Cow::Borrowed("") };
        match texts.next() {
            None => std::borrow::Cow::Borrowed(first),
            Some(second) => {
                let mut joined = format!("{first}\n{second}");
                for text in texts {
                    joined.push('\n');
                    joined.push_str(text);
                }
                std::borrow::Cow::Owned(joined)
            }
        }
    }
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// JSON Schema of the arguments.
    pub parameters: Schema,
}

/// A JSON value kept as JSON text (a tool's JSON Schema, a response format): read, measured and
/// forwarded without building a tree. An agent's request carries every tool's schema (often many
/// kilobytes); as a `Value` each was built member by member, walked to estimate tokens and written
/// out again for the provider. The text is the client's own where a typed reading took it
/// (whitespace included; JSON is indifferent to it), else the compact writing of the tree it was read
/// from. Two schemas are equal when their JSON is.
#[derive(Debug, Clone)]
pub struct Schema {
    text: Box<serde_json::value::RawValue>,
    /// The length of its compact text (measured once: estimates run several times per request).
    compact_len: usize,
}

impl Schema {
    /// `{"type": "object", "properties": {}}`: the schema of a tool given none.
    pub fn empty_object() -> Self {
        Self::from_text(r#"{"type":"object","properties":{}}"#).unwrap_or_else(|_| Self::null())
    }

    /// A schema from JSON text read as one JSON value, with what `scan` found in it.
    pub(crate) fn from_raw(text: Box<serde_json::value::RawValue>, scan: &SchemaScan) -> Self {
        Self { text, compact_len: scan.compact_len }
    }

    /// A schema from JSON text; errs when the text is not one JSON value.
    pub fn from_text(text: &str) -> serde_json::Result<Self> {
        serde_json::value::RawValue::from_string(text.to_string()).map(Self::scanned)
    }

    /// A schema from JSON text read as one JSON value, scanned here.
    fn scanned(text: Box<serde_json::value::RawValue>) -> Self {
        let scan = scan_schema(text.get());
        Self::from_raw(text, &scan)
    }

    fn null() -> Self {
        Self { text: serde_json::value::RawValue::NULL.to_owned(), compact_len: 4 }
    }

    /// Its JSON text.
    pub fn text(&self) -> &str {
        self.text.get()
    }

    /// The schema as a tree (for providers that rewrite schemas, and for comparisons).
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.text()).unwrap_or(Value::Null)
    }

    /// The length of its compact JSON text: the text without the whitespace between tokens.
    pub fn compact_len(&self) -> usize {
        self.compact_len
    }
}

/// What one pass over a schema's JSON text finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SchemaScan {
    /// Its length without the whitespace between tokens.
    pub compact_len: usize,
    /// How deep its arrays and objects nest (0 for a scalar).
    pub depth: usize,
    /// No number with an exponent or longer than 300 characters (a tree reading may find it out of
    /// range) and no `\u` escape in the surrogate range (a tree reading may find it unpaired): text
    /// serde_json has skipped without error is then text its tree reading takes.
    pub plain: bool,
}

/// Where the first `"` or `\` in `bytes` is, eight bytes at a time. A schema's strings are short
/// (its keys, `"type"`, `"string"`): memchr's vector search pays more to set up for each than it
/// saves there.
fn quote_or_backslash(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // A byte of `word` is zero: its high bit in the result. Exact for the lowest such byte (a
    // borrow can flag bytes only above a zero one), which is the one asked for.
    let zero_bytes = |word: u64| word.wrapping_sub(ONES) & !word & HIGHS;
    let mut chunks = bytes.chunks_exact(8);
    for (index, chunk) in chunks.by_ref().enumerate() {
        let mut word = [0; 8];
        word.copy_from_slice(chunk);
        let word = u64::from_le_bytes(word);
        let found = zero_bytes(word ^ (ONES * u64::from(b'"'))) | zero_bytes(word ^ (ONES * u64::from(b'\\')));
        if found != 0 {
            return Some(index * 8 + (found.trailing_zeros() / 8) as usize);
        }
    }
    let rest = chunks.remainder();
    rest.iter().position(|&byte| byte == b'"' || byte == b'\\').map(|offset| bytes.len() - rest.len() + offset)
}

/// One pass over well-formed JSON text.
pub(crate) fn scan_schema(text: &str) -> SchemaScan {
    let bytes = text.as_bytes();
    let (mut at, mut compact_len, mut depth, mut deepest, mut plain) = (0, 0, 0_usize, 0, true);
    while let Some(&byte) = bytes.get(at) {
        match byte {
            b'"' => {
                // A string, to its closing quote; an escape's backslash and the byte after it go
                // together.
                let start = at;
                at += 1;
                while let Some(offset) = quote_or_backslash(bytes.get(at..).unwrap_or_default()) {
                    at += offset;
                    if bytes[at] == b'"' {
                        break;
                    }
                    let surrogate = bytes.get(at + 1) == Some(&b'u')
                        && matches!(bytes.get(at + 2), Some(b'd' | b'D'))
                        && matches!(bytes.get(at + 3), Some(b'8'..=b'9' | b'a'..=b'f' | b'A'..=b'F'));
                    plain &= !surrogate;
                    at += 2;
                }
                at = (at + 1).min(bytes.len());
                compact_len += at - start;
            }
            b' ' | b'\t' | b'\n' | b'\r' => at += 1,
            b'-' | b'0'..=b'9' => {
                let start = at;
                while let Some(byte @ (b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')) = bytes.get(at) {
                    plain &= !matches!(byte, b'e' | b'E');
                    at += 1;
                }
                plain &= at - start <= 300;
                compact_len += at - start;
            }
            _ => {
                match byte {
                    b'[' | b'{' => {
                        depth += 1;
                        deepest = deepest.max(depth);
                    }
                    b']' | b'}' => depth = depth.saturating_sub(1),
                    _ => {}
                }
                compact_len += 1;
                at += 1;
            }
        }
    }
    SchemaScan { compact_len, depth: deepest, plain }
}

impl From<Value> for Schema {
    fn from(value: Value) -> Self {
        // Writing a tree cannot fail (its keys are strings); `null` stands in all the same.
        serde_json::value::to_raw_value(&value).map_or_else(|_| Self::null(), Self::scanned)
    }
}

impl PartialEq for Schema {
    fn eq(&self, other: &Self) -> bool {
        self.text() == other.text() || self.to_value() == other.to_value()
    }
}

impl serde::Serialize for Schema {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.text.serialize(serializer)
    }
}

/// How the model may use the tools.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Named(String),
}

/// A chat request in neither client's format.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatRequest {
    pub model: String,
    pub system: Option<String>,
    pub messages: Vec<Message>,
    pub tools: Vec<Tool>,
    pub tool_choice: Option<ToolChoice>,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Sampling from the k likeliest tokens only (Anthropic's `top_k`; Gemini's `topK`; OpenAI's
    /// format has no such member).
    pub top_k: Option<u32>,
    pub stop: Vec<String>,
    pub stream: bool,
    /// OpenAI `stream_options.include_usage`.
    pub stream_usage: bool,
    pub user: Option<String>,
    /// OpenAI `response_format` (`text`, `json_object`, `json_schema` with its schema) as the client
    /// sent it: forwarded to OpenAI-format providers, which alone have the member.
    pub response_format: Option<Schema>,
    /// Whether the model may call several tools in one turn (OpenAI `parallel_tool_calls`, Anthropic
    /// `tool_choice.disable_parallel_tool_use` negated); None leaves the provider's default.
    pub parallel_tool_calls: Option<bool>,
    /// OpenAI's options with no member in the other client format.
    pub openai: OpenAiOptions,
    /// Where the client asked the provider to cache the prompt up to (Anthropic's `cache_control`).
    pub cache_points: Vec<CachePoint>,
    /// Anthropic's `thinking` (extended thinking: enabled with a token budget, or disabled) as the
    /// client sent it: forwarded to Anthropic, which alone has the member.
    pub thinking: Option<Schema>,
}

/// A prompt cache breakpoint: the provider caches the prompt up to and including `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachePoint {
    pub at: CacheAt,
    /// As the client asked; None leaves the provider's default (five minutes at Anthropic).
    pub ttl: Option<CacheTtl>,
}

/// Where a prompt cache breakpoint sits in the neutral request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheAt {
    /// The end of the system prompt.
    System,
    /// The tool at this index (the tools come before the system prompt in Anthropic's prefix).
    Tool(usize),
    /// The part `part` of the message `message`.
    Part { message: usize, part: usize },
}

/// How long a provider keeps a cached prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheTtl {
    FiveMinutes,
    OneHour,
}

impl CacheTtl {
    /// As Anthropic writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheTtl::FiveMinutes => "5m",
            CacheTtl::OneHour => "1h",
        }
    }

    /// From Anthropic's spelling.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "5m" => Some(CacheTtl::FiveMinutes),
            "1h" => Some(CacheTtl::OneHour),
            _ => None,
        }
    }
}

/// OpenAI options as the client sent them: OpenAI-format providers get them all, Gemini the ones it
/// has a member for (seed and penalties), Anthropic none.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OpenAiOptions {
    pub seed: Option<i64>,
    /// -2..=2.
    pub frequency_penalty: Option<f64>,
    /// -2..=2.
    pub presence_penalty: Option<f64>,
    /// Token id and bias (-100..=100, written as sent), in token id order; empty when not sent.
    pub logit_bias: Vec<(u64, serde_json::Number)>,
    /// `minimal`, `low`, `medium`, `high`... as sent: the provider judges the value.
    pub reasoning_effort: Option<String>,
    /// Whether the answer's tokens come back with their log probabilities.
    pub logprobs: bool,
    /// How many of the likeliest tokens come with each (0..=20; only with `logprobs`).
    pub top_logprobs: Option<u8>,
}

impl ChatRequest {
    /// The text of the last user message.
    pub fn last_user_text(&self) -> String {
        self.messages.iter().rev().find(|message| message.role == Role::User).map(Message::text).unwrap_or_default()
    }

    /// Every text the model will read, for token estimates.
    pub fn prompt_characters(&self) -> usize {
        let system = self.system.as_deref().map_or(0, |system| system.chars().count());
        let messages: usize = self
            .messages
            .iter()
            .flat_map(|message| message.parts.iter())
            .map(|part| match part {
                Part::Text(text) => text.chars().count(),
                Part::ToolCall { name, arguments, .. } => name.len() + arguments.len(),
                Part::ToolResult { content, media, .. } => content.chars().count() + media.iter().map(media_characters).sum::<usize>(),
                Part::Thinking { text, .. } => text.chars().count(),
                Part::RedactedThinking { .. } => 0,
                Part::Image { .. } | Part::Document { .. } => media_characters(part),
            })
            .sum();
        let tools: usize = self.tools.iter().map(|tool| tool.name.len() + tool.parameters.compact_len()).sum();
        system + messages + tools
    }

    /// Whether any message (or tool result) carries an image.
    pub fn has_images(&self) -> bool {
        self.content().any(|part| matches!(part, Part::Image { .. }))
    }

    /// The documents the messages (and tool results) carry.
    pub fn documents(&self) -> impl Iterator<Item = &DocumentSource> {
        self.content().filter_map(|part| match part {
            Part::Document { source, .. } => Some(source),
            _ => None,
        })
    }

    /// Every part of the messages, the media inside tool results included.
    fn content(&self) -> impl Iterator<Item = &Part> {
        self.messages.iter().flat_map(|message| &message.parts).flat_map(|part| {
            let media = match part {
                Part::ToolResult { media, .. } => media.as_slice(),
                _ => &[],
            };
            std::iter::once(part).chain(media)
        })
    }
}

/// The characters an image or a document counts as in a token estimate.
fn media_characters(part: &Part) -> usize {
    match part {
        // An image costs roughly a thousand tokens on the common providers.
        Part::Image { .. } => 4000,
        Part::Document { source, .. } => match source {
            // A PDF page costs 1,500-3,000 tokens and about as many base64 characters in the file;
            // a fetched one is unknown until the provider counts it.
            DocumentSource::Base64 { data, .. } => data.len(),
            DocumentSource::Url(_) => 4000,
            DocumentSource::Text(text) => text.chars().count(),
        },
        _ => 0,
    }
}

/// Why a reply ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
    ContentFilter,
}

/// Token counts of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Every prompt token, those read from or written to the provider's prompt cache included.
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Of `input_tokens`, those read from the provider's prompt cache (priced below input).
    pub cache_read_tokens: u64,
    /// Of `input_tokens`, those written to the provider's prompt cache (Anthropic prices them above input).
    pub cache_write_tokens: u64,
    /// Of `cache_write_tokens`, those kept for an hour (priced above five-minute writes).
    pub cache_write_long_tokens: u64,
}

impl Usage {
    /// Counts without any prompt caching.
    pub const fn uncached(input_tokens: u64, output_tokens: u64) -> Self {
        Usage { input_tokens, output_tokens, cache_read_tokens: 0, cache_write_tokens: 0, cache_write_long_tokens: 0 }
    }

    /// The prompt tokens neither read from nor written to the cache.
    pub fn uncached_input_tokens(&self) -> u64 {
        self.input_tokens.saturating_sub(self.cache_read_tokens).saturating_sub(self.cache_write_tokens)
    }
}

/// A complete reply in neither client's format.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatReply {
    pub id: String,
    pub model: String,
    /// Text and tool-call parts, in order.
    pub parts: Vec<Part>,
    pub finish: FinishReason,
    pub usage: Usage,
    /// The answer's tokens with their log probabilities, when the client asked and the provider
    /// gave them.
    pub logprobs: Option<Vec<TokenLogprob>>,
}

/// A token of the answer with its log probability and the likeliest tokens in its place, as
/// OpenAI's `logprobs.content` entries have them (Gemini's `logprobsResult` is read into the same).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f64,
    /// The token's UTF-8 bytes (a token may be part of a character); None where the provider gave none.
    pub bytes: Option<Vec<u8>>,
    pub top_logprobs: Vec<TopLogprob>,
}

/// One of the likeliest tokens at a position.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f64,
    pub bytes: Option<Vec<u8>>,
}

impl ChatReply {
    /// The concatenated text.
    pub fn text(&self) -> String {
        self.parts
            .iter()
            .filter_map(|part| match part {
                Part::Text(text) => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    /// Everything a client may read of the reply's prose: its thinking, then its text (what output
    /// guardrails judge: thinking reaches Anthropic clients as it came).
    pub fn readable_text(&self) -> String {
        let text = self.text();
        readable(&self.parts, &text).unwrap_or(text)
    }
}

/// The thinking among `parts`, then `text`, newline-separated; None when there is no thinking.
fn readable(parts: &[Part], text: &str) -> Option<String> {
    let mut readable = String::new();
    for part in parts {
        if let Part::Thinking { text, .. } = part {
            readable.push_str(text);
            readable.push('\n');
        }
    }
    (!readable.is_empty()).then(|| readable + text)
}

/// One step of a streamed reply, in neither client's format.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatEvent {
    /// A piece of text.
    TextDelta(String),
    /// A tool call begins; `index` numbers the calls of this reply from 0.
    ToolCallStart { index: usize, id: String, name: String },
    /// More JSON text of a tool call's arguments.
    ToolCallDelta { index: usize, arguments: String },
    /// A piece of the model's thinking.
    ThinkingDelta(String),
    /// The signature closing the thinking so far.
    ThinkingSignature(String),
    /// A block of withheld thinking, whole.
    RedactedThinking(String),
    /// The reply ended.
    Finish(FinishReason),
    /// Token counts (may come before or after `Finish`).
    Usage(Usage),
    /// The log probabilities of the tokens in the next text delta (or of the text so far, when no
    /// delta follows).
    Logprobs(Vec<TokenLogprob>),
}

/// Splits a text into stream deltas, word by word, keeping the spaces.
pub fn word_deltas(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    for (index, character) in text.char_indices() {
        if character == ' ' && index > start {
            pieces.push(&text[start..index]);
            start = index;
        }
    }
    if start < text.len() {
        pieces.push(&text[start..]);
    }
    pieces
}

/// The events a complete reply would have streamed.
pub fn reply_events(reply: &ChatReply) -> Vec<ChatEvent> {
    let mut events = Vec::new();
    let mut tool_index = 0;
    // The whole answer's log probabilities, with its first frame.
    if let Some(tokens) = &reply.logprobs {
        events.push(ChatEvent::Logprobs(tokens.clone()));
    }
    for part in &reply.parts {
        match part {
            Part::Text(text) => events.extend(word_deltas(text).into_iter().map(|piece| ChatEvent::TextDelta(piece.to_string()))),
            Part::ToolCall { id, name, arguments } => {
                events.push(ChatEvent::ToolCallStart { index: tool_index, id: id.clone(), name: name.clone() });
                events.push(ChatEvent::ToolCallDelta { index: tool_index, arguments: arguments.clone() });
                tool_index += 1;
            }
            Part::Thinking { text, signature } => {
                events.push(ChatEvent::ThinkingDelta(text.clone()));
                events.push(ChatEvent::ThinkingSignature(signature.clone()));
            }
            Part::RedactedThinking { data } => events.push(ChatEvent::RedactedThinking(data.clone())),
            Part::Image { .. } | Part::ToolResult { .. } | Part::Document { .. } => {}
        }
    }
    events.push(ChatEvent::Usage(reply.usage));
    events.push(ChatEvent::Finish(reply.finish));
    events
}

/// Rebuilds a reply from its streamed events (for tests and for stream accounting).
#[derive(Debug, Default)]
pub struct ReplyAssembler {
    /// Thinking blocks, in order (they come before the answer).
    thinking: Vec<Part>,
    text: String,
    tool_calls: Vec<(String, String, String)>,
    logprobs: Option<Vec<TokenLogprob>>,
    pub finish: Option<FinishReason>,
    pub usage: Usage,
}

impl ReplyAssembler {
    /// Applies one event.
    pub fn push(&mut self, event: &ChatEvent) {
        match event {
            ChatEvent::TextDelta(text) => self.text.push_str(text),
            ChatEvent::ToolCallStart { index, id, name } => {
                while self.tool_calls.len() <= *index {
                    self.tool_calls.push(Default::default());
                }
                self.tool_calls[*index].0 = id.clone();
                self.tool_calls[*index].1 = name.clone();
            }
            ChatEvent::ToolCallDelta { index, arguments } => {
                while self.tool_calls.len() <= *index {
                    self.tool_calls.push(Default::default());
                }
                self.tool_calls[*index].2.push_str(arguments);
            }
            ChatEvent::ThinkingDelta(piece) => match self.thinking.last_mut() {
                // A new block begins after a signed one.
                Some(Part::Thinking { text, signature }) if signature.is_empty() => text.push_str(piece),
                _ => self.thinking.push(Part::Thinking { text: piece.clone(), signature: String::new() }),
            },
            ChatEvent::ThinkingSignature(piece) => match self.thinking.last_mut() {
                Some(Part::Thinking { signature, .. }) => signature.push_str(piece),
                _ => self.thinking.push(Part::Thinking { text: String::new(), signature: piece.clone() }),
            },
            ChatEvent::RedactedThinking(data) => self.thinking.push(Part::RedactedThinking { data: data.clone() }),
            ChatEvent::Finish(reason) => self.finish = Some(*reason),
            ChatEvent::Usage(usage) => self.usage = *usage,
            ChatEvent::Logprobs(tokens) => self.logprobs.get_or_insert_default().extend_from_slice(tokens),
        }
    }

    /// The text so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The thinking and the text so far (`ChatReply::readable_text`).
    pub fn readable_text(&self) -> std::borrow::Cow<'_, str> {
        readable(&self.thinking, &self.text).map_or(std::borrow::Cow::Borrowed(self.text.as_str()), std::borrow::Cow::Owned)
    }

    /// The reply as assembled.
    pub fn into_reply(self, id: String, model: String) -> ChatReply {
        let mut parts = self.thinking;
        if !self.text.is_empty() {
            parts.push(Part::Text(self.text));
        }
        parts.extend(self.tool_calls.into_iter().map(|(id, name, arguments)| Part::ToolCall { id, name, arguments }));
        ChatReply { id, model, parts, finish: self.finish.unwrap_or(FinishReason::Stop), usage: self.usage, logprobs: self.logprobs }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readable_text_holds_the_thinking_before_the_answer() {
        let reply = ChatReply {
            id: "r".to_string(),
            model: "m".to_string(),
            parts: vec![
                Part::Thinking { text: "mail bob@example.com".to_string(), signature: "s".to_string() },
                Part::RedactedThinking { data: "enc".to_string() },
                Part::Text("done".to_string()),
            ],
            finish: FinishReason::Stop,
            usage: Usage::default(),
            logprobs: None,
        };
        assert_eq!((reply.text(), reply.readable_text()), ("done".to_string(), "mail bob@example.com\ndone".to_string()));
        let mut assembler = ReplyAssembler::default();
        for event in reply_events(&reply) {
            assembler.push(&event);
        }
        assert_eq!(assembler.readable_text(), reply.readable_text());
    }

    #[test]
    fn a_schemas_compact_length_leaves_out_only_the_whitespace_between_tokens() {
        let value = serde_json::json!({"type": "object", "properties": {"query": {"type": "string", "enum": ["a\"b", "é", "x y\\", -1.5, 3, true, null]}}});
        let pretty = Schema::from_text(&serde_json::to_string_pretty(&value).unwrap()).unwrap();
        assert_eq!(pretty.compact_len(), value.to_string().len());
        assert_eq!(Schema::from(value.clone()).compact_len(), value.to_string().len());
        assert_eq!(Schema::from_text(" [ 1 , true ,null ] ").unwrap().compact_len(), "[1,true,null]".len());
        assert_eq!(Schema::empty_object().compact_len(), Schema::empty_object().text().len());
    }

    #[test]
    fn a_scan_finds_the_depth_and_what_a_tree_reading_could_refuse() {
        let scan = |text: &str| scan_schema(text);
        assert_eq!(scan("1"), SchemaScan { compact_len: 1, depth: 0, plain: true });
        let nested = scan(r#"{"a": [1, {"b": "[[[{"}], "c": "\\\"]"}"#);
        assert_eq!((nested.depth, nested.plain), (3, true));
        // Exponents, very long numbers and surrogate escapes are left to a full check.
        for (text, plain) in [
            ("[1.5, -2, 0.25]", true),
            ("[1e3]", false),
            ("[2E-1]", false),
            (r#"{"e": "e", "E": true, "f": false}"#, true),
            (r#"["\u00e9", "\uabcd"]"#, true),
            (r#"["\ud83d\ude00"]"#, false),
            (r#"["\uDC00"]"#, false),
            (r#"["\\ud800"]"#, true),
        ] {
            assert_eq!(scan(text).plain, plain, "{text}");
        }
        assert!(scan(&"1".repeat(300)).plain);
        assert!(!scan(&"1".repeat(301)).plain);
        // Text that is not well-formed is scanned without a panic.
        for broken in ["\"abc", "\"\\", "[\"\\u", "-", "{"] {
            let _ = scan(broken);
        }
    }

    #[test]
    fn the_quote_search_finds_the_first_quote_or_backslash() {
        // Every offset and neighbour the eight-byte words can put it in, beside bytes one above and
        // below the two sought (a borrow's false hit) and multi-byte UTF-8.
        let fillers: [&[u8]; 4] = [b"a", b"#", b"]", "\u{e9}".as_bytes()];
        for filler in fillers {
            for length in 0..40 {
                let base: Vec<u8> = filler.iter().copied().cycle().take(length).collect();
                assert_eq!(quote_or_backslash(&base), None);
                for at in 0..length {
                    for sought in [b'"', b'\\'] {
                        let mut text = base.clone();
                        text[at] = sought;
                        if let Some(next) = text.get_mut(at + 1) {
                            *next = b'!';
                        }
                        let expected = text.iter().position(|&byte| byte == b'"' || byte == b'\\');
                        assert_eq!(quote_or_backslash(&text), expected, "{text:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn schemas_are_equal_when_their_json_is() {
        let compact = Schema::from(serde_json::json!({"type": "object", "required": ["a"]}));
        let spaced = Schema::from_text("{ \"required\" : [\"a\"], \"type\": \"object\" }").unwrap();
        assert_eq!(compact, spaced);
        assert_ne!(compact, Schema::from(serde_json::json!({"type": "object"})));
        assert_eq!(Schema::empty_object().to_value(), serde_json::json!({"type": "object", "properties": {}}));
        // Written as its text, as a member of a body too.
        assert_eq!(serde_json::to_string(&spaced).unwrap(), spaced.text());
        assert_eq!(serde_json::to_value(&spaced).unwrap(), serde_json::json!({"type": "object", "required": ["a"]}));
        assert!(Schema::from_text("{").is_err());
    }

    #[test]
    fn replies_survive_a_round_trip_through_events() {
        let reply = ChatReply {
            id: "r".to_string(),
            model: "m".to_string(),
            parts: vec![
                Part::Text("hello there world".to_string()),
                Part::ToolCall { id: "call_1".to_string(), name: "search".to_string(), arguments: "{\"q\":1}".to_string() },
            ],
            finish: FinishReason::ToolCalls,
            usage: Usage::uncached(3, 7),
            logprobs: None,
        };
        let mut assembler = ReplyAssembler::default();
        for event in reply_events(&reply) {
            assembler.push(&event);
        }
        assert_eq!(assembler.into_reply("r".to_string(), "m".to_string()), reply);
        assert_eq!(word_deltas("a bc  d"), vec!["a", " bc", " ", " d"]);
    }
}

/// A request body that breaks a format's rules; `code` is the machine-readable reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidRequest {
    pub code: &'static str,
    pub message: String,
}

impl InvalidRequest {
    /// A generic validation failure.
    pub fn new(message: impl Into<String>) -> Self {
        InvalidRequest { code: "invalid_request", message: message.into() }
    }

    /// A required field is absent.
    pub fn missing(field: &str) -> Self {
        InvalidRequest { code: "missing_field", message: format!("{field} is required") }
    }

    /// Content the gateway cannot carry to a provider faithfully (refused rather than dropped).
    pub fn unsupported(message: impl Into<String>) -> Self {
        InvalidRequest { code: "unsupported_content", message: message.into() }
    }
}

/// Typed readings' helpers for members whose presence counts (with `#[serde(default)]`, an absent
/// member reads as false or None).
pub(crate) mod presence {
    use serde::de::IgnoredAny;
    use serde::{Deserialize, Deserializer};

    /// Whether the member is there, whatever its value (`null` included).
    pub fn flag<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
        IgnoredAny::deserialize(deserializer).map(|_| true)
    }

    /// The member's value when it is there, `null` included.
    pub fn value<'de, D: Deserializer<'de>, T: Deserialize<'de>>(deserializer: D) -> Result<Option<T>, D::Error> {
        T::deserialize(deserializer).map(Some)
    }
}

/// Reading JSON fields with typed errors.
pub(crate) mod fields {
    use serde_json::Value;

    use super::InvalidRequest;

    pub fn required_string(body: &Value, field: &str) -> Result<String, InvalidRequest> {
        match body.get(field) {
            None | Some(Value::Null) => Err(InvalidRequest::missing(field)),
            Some(Value::String(text)) if !text.trim().is_empty() => Ok(text.trim().to_string()),
            Some(_) => Err(InvalidRequest::new(format!("{field} must be a non-empty string"))),
        }
    }

    pub fn required_array<'a>(body: &'a Value, field: &str) -> Result<&'a Vec<Value>, InvalidRequest> {
        match body.get(field) {
            None | Some(Value::Null) => Err(InvalidRequest::missing(field)),
            Some(Value::Array(items)) if !items.is_empty() => Ok(items),
            Some(Value::Array(_)) => Err(InvalidRequest::new(format!("{field} must not be empty"))),
            Some(_) => Err(InvalidRequest::new(format!("{field} must be an array"))),
        }
    }

    pub fn optional_bool(body: &Value, field: &str) -> Result<bool, InvalidRequest> {
        match body.get(field) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(value)) => Ok(*value),
            Some(_) => Err(InvalidRequest::new(format!("{field} must be a boolean"))),
        }
    }

    pub fn optional_positive_u32(body: &Value, field: &str) -> Result<Option<u32>, InvalidRequest> {
        match body.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => value
                .as_u64()
                .filter(|number| *number >= 1)
                .and_then(|number| u32::try_from(number).ok())
                .map(Some)
                .ok_or_else(|| InvalidRequest::new(format!("{field} must be a positive integer"))),
        }
    }

    pub fn optional_number_in(body: &Value, field: &str, low: f64, high: f64) -> Result<Option<f64>, InvalidRequest> {
        match body.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => value
                .as_f64()
                .filter(|number| (low..=high).contains(number))
                .map(Some)
                .ok_or_else(|| InvalidRequest::new(format!("{field} must be a number between {low} and {high}"))),
        }
    }

    pub fn optional_flag(body: &Value, field: &str) -> Result<Option<bool>, InvalidRequest> {
        match body.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(value)) => Ok(Some(*value)),
            Some(_) => Err(InvalidRequest::new(format!("{field} must be a boolean"))),
        }
    }

    pub fn optional_i64(body: &Value, field: &str) -> Result<Option<i64>, InvalidRequest> {
        match body.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => value.as_i64().map(Some).ok_or_else(|| InvalidRequest::new(format!("{field} must be an integer"))),
        }
    }

    pub fn optional_string(body: &Value, field: &str) -> Result<Option<String>, InvalidRequest> {
        match body.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(_) => Err(InvalidRequest::new(format!("{field} must be a string"))),
        }
    }

    /// `stop`/`stop_sequences`: a string or an array of strings.
    pub fn stop_list(body: &Value, field: &str) -> Result<Vec<String>, InvalidRequest> {
        match body.get(field) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::String(text)) => Ok(vec![text.clone()]),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| item.as_str().map(str::to_string).ok_or_else(|| InvalidRequest::new(format!("{field} must hold strings"))))
                .collect(),
            Some(_) => Err(InvalidRequest::new(format!("{field} must be a string or an array of strings"))),
        }
    }
}
