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
    /// The answer to a tool call.
    ToolResult {
        call_id: String,
        content: String,
        is_error: bool,
    },
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

    /// The text parts joined by newlines, borrowed when there is only one.
    pub fn text_borrowed(&self) -> std::borrow::Cow<'_, str> {
        let mut texts = self.parts.iter().filter_map(|part| match part {
            Part::Text(text) => Some(text.as_str()),
            Part::ToolResult { content, .. } => Some(content.as_str()),
            Part::Image { .. } | Part::ToolCall { .. } => None,
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
    pub parameters: Value,
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
    pub stop: Vec<String>,
    pub stream: bool,
    /// OpenAI `stream_options.include_usage`.
    pub stream_usage: bool,
    pub user: Option<String>,
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
                Part::ToolResult { content, .. } => content.chars().count(),
                // An image costs roughly a thousand tokens on the common providers.
                Part::Image { .. } => 4000,
            })
            .sum();
        let tools: usize = self.tools.iter().map(|tool| tool.name.len() + json_length(&tool.parameters)).sum();
        system + messages + tools
    }

    /// Whether any message carries an image.
    pub fn has_images(&self) -> bool {
        self.messages.iter().any(|message| message.parts.iter().any(|part| matches!(part, Part::Image { .. })))
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
    pub input_tokens: u64,
    pub output_tokens: u64,
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
    /// The reply ended.
    Finish(FinishReason),
    /// Token counts (may come before or after `Finish`).
    Usage(Usage),
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
    for part in &reply.parts {
        match part {
            Part::Text(text) => events.extend(word_deltas(text).into_iter().map(|piece| ChatEvent::TextDelta(piece.to_string()))),
            Part::ToolCall { id, name, arguments } => {
                events.push(ChatEvent::ToolCallStart { index: tool_index, id: id.clone(), name: name.clone() });
                events.push(ChatEvent::ToolCallDelta { index: tool_index, arguments: arguments.clone() });
                tool_index += 1;
            }
            Part::Image { .. } | Part::ToolResult { .. } => {}
        }
    }
    events.push(ChatEvent::Usage(reply.usage));
    events.push(ChatEvent::Finish(reply.finish));
    events
}

/// Rebuilds a reply from its streamed events (for tests and for stream accounting).
#[derive(Debug, Default)]
pub struct ReplyAssembler {
    text: String,
    tool_calls: Vec<(String, String, String)>,
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
            ChatEvent::Finish(reason) => self.finish = Some(*reason),
            ChatEvent::Usage(usage) => self.usage = *usage,
        }
    }

    /// The text so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The reply as assembled.
    pub fn into_reply(self, id: String, model: String) -> ChatReply {
        let mut parts = Vec::new();
        if !self.text.is_empty() {
            parts.push(Part::Text(self.text));
        }
        parts.extend(self.tool_calls.into_iter().map(|(id, name, arguments)| Part::ToolCall { id, name, arguments }));
        ChatReply { id, model, parts, finish: self.finish.unwrap_or(FinishReason::Stop), usage: self.usage }
    }
}

/// The length of `value` as compact JSON, counted without writing the text out (estimates run
/// several times per request).
fn json_length(value: &serde_json::Value) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    match serde_json::to_writer(&mut counter, value) {
        Ok(()) => counter.0,
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_length_is_the_compact_texts_length() {
        let value = serde_json::json!({"type": "object", "properties": {"query": {"type": "string", "enum": ["a\"b", "é"]}}});
        assert_eq!(json_length(&value), value.to_string().len());
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
            usage: Usage { input_tokens: 3, output_tokens: 7 },
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
