//! The two client formats (OpenAI chat completions, Anthropic messages) over one neutral request and
//! response, and the synthetic `brainstorm/sandbox` model that answers while a tenant has no provider key.

use brainstorm_common::ApiError;
use serde_json::{Value, json};

/// The synthetic model's id.
pub const SANDBOX_MODEL: &str = "brainstorm/sandbox";

/// Route strategies a request may ask for.
const STRATEGIES: [&str; 6] = ["price", "latency", "throughput", "priority", "quality", "cascade"];

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// One message, reduced to its text.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatMessage {
    pub role: Role,
    pub text: String,
}

/// A chat request in neither client's format.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub model: String,
    pub system: Option<String>,
    pub messages: Vec<ChatMessage>,
    pub max_tokens: Option<u32>,
    pub stream: bool,
    /// OpenAI `stream_options.include_usage`.
    pub stream_usage: bool,
    pub strategy: Option<String>,
}

/// Why a reply ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
}

/// A complete reply in neither client's format.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatReply {
    pub id: String,
    pub model: String,
    pub text: String,
    pub finish: FinishReason,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub created: i64,
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::invalid_request("invalid_request", message)
}

fn required_model(body: &Value) -> Result<String, ApiError> {
    match body.get("model") {
        None | Some(Value::Null) => Err(ApiError::invalid_request("missing_field", "model is required")),
        Some(Value::String(model)) if !model.trim().is_empty() => Ok(model.trim().to_string()),
        Some(_) => Err(invalid("model must be a non-empty string")),
    }
}

fn required_messages(body: &Value) -> Result<&Vec<Value>, ApiError> {
    match body.get("messages") {
        None | Some(Value::Null) => Err(ApiError::invalid_request("missing_field", "messages is required")),
        Some(Value::Array(messages)) if !messages.is_empty() => Ok(messages),
        Some(Value::Array(_)) => Err(invalid("messages must not be empty")),
        Some(_) => Err(invalid("messages must be an array")),
    }
}

fn optional_bool(body: &Value, field: &str) -> Result<bool, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(value)) => Ok(*value),
        Some(_) => Err(invalid(format!("{field} must be a boolean"))),
    }
}

fn optional_max_tokens(body: &Value, field: &str) -> Result<Option<u32>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_u64()
            .filter(|tokens| *tokens >= 1)
            .and_then(|tokens| u32::try_from(tokens).ok())
            .map(Some)
            .ok_or_else(|| invalid(format!("{field} must be a positive integer"))),
    }
}

fn check_temperature(body: &Value) -> Result<(), ApiError> {
    match body.get("temperature") {
        None | Some(Value::Null) => Ok(()),
        Some(value) if value.as_f64().is_some_and(|temperature| (0.0..=2.0).contains(&temperature)) => Ok(()),
        Some(_) => Err(invalid("temperature must be a number between 0 and 2")),
    }
}

fn route_strategy(body: &Value) -> Result<Option<String>, ApiError> {
    let Some(route) = body.get("route").filter(|route| !route.is_null()) else { return Ok(None) };
    if !route.is_object() {
        return Err(invalid("route must be an object"));
    }
    match route.get("strategy") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(strategy)) if STRATEGIES.contains(&strategy.as_str()) => Ok(Some(strategy.clone())),
        Some(_) => Err(ApiError::invalid_request("invalid_strategy", format!("route.strategy must be one of {}", STRATEGIES.join(", ")))),
    }
}

/// The text of message content: a string, or an array of parts whose text parts are joined.
fn content_text(content: Option<&Value>, position: usize) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                let kind = part
                    .get("type")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(format!("messages[{position}].content parts need a type")))?;
                let piece = match kind {
                    "text" => part.get("text").and_then(Value::as_str).unwrap_or_default().to_string(),
                    "tool_result" => content_text(part.get("content"), position)?,
                    "tool_use" => part.get("input").map(Value::to_string).unwrap_or_default(),
                    _ => String::new(),
                };
                if !piece.is_empty() {
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&piece);
                }
            }
            Ok(text)
        }
        Some(_) => Err(invalid(format!("messages[{position}].content must be a string or an array of parts"))),
    }
}

/// Reads an OpenAI chat completions body.
pub fn parse_openai(body: &Value) -> Result<ChatRequest, ApiError> {
    if !body.is_object() {
        return Err(invalid("the body must be a JSON object"));
    }
    let model = required_model(body)?;
    let raw_messages = required_messages(body)?;
    check_temperature(body)?;
    let mut system = Vec::new();
    let mut messages = Vec::new();
    for (position, message) in raw_messages.iter().enumerate() {
        let role = match message.get("role").and_then(Value::as_str) {
            Some("system" | "developer") => Role::System,
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            Some("tool" | "function") => Role::Tool,
            Some(other) => {
                return Err(invalid(format!("messages[{position}].role `{other}` is not one of system, developer, user, assistant, tool")));
            }
            None => return Err(invalid(format!("messages[{position}].role is required"))),
        };
        let text = content_text(message.get("content"), position)?;
        if role == Role::System {
            system.push(text);
        } else {
            messages.push(ChatMessage { role, text });
        }
    }
    let max_tokens = match optional_max_tokens(body, "max_completion_tokens")? {
        Some(tokens) => Some(tokens),
        None => optional_max_tokens(body, "max_tokens")?,
    };
    let stream_usage = body.pointer("/stream_options/include_usage").and_then(Value::as_bool).unwrap_or(false);
    Ok(ChatRequest {
        model,
        system: (!system.is_empty()).then(|| system.join("\n")),
        messages,
        max_tokens,
        stream: optional_bool(body, "stream")?,
        stream_usage,
        strategy: route_strategy(body)?,
    })
}

/// Reads an Anthropic messages body.
pub fn parse_anthropic(body: &Value) -> Result<ChatRequest, ApiError> {
    if !body.is_object() {
        return Err(invalid("the body must be a JSON object"));
    }
    let model = required_model(body)?;
    let max_tokens =
        optional_max_tokens(body, "max_tokens")?.ok_or_else(|| ApiError::invalid_request("missing_field", "max_tokens is required"))?;
    let raw_messages = required_messages(body)?;
    check_temperature(body)?;
    let mut messages = Vec::new();
    for (position, message) in raw_messages.iter().enumerate() {
        let role = match message.get("role").and_then(Value::as_str) {
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            Some(other) => return Err(invalid(format!("messages[{position}].role `{other}` is not one of user, assistant"))),
            None => return Err(invalid(format!("messages[{position}].role is required"))),
        };
        messages.push(ChatMessage { role, text: content_text(message.get("content"), position)? });
    }
    let system = match body.get("system") {
        None | Some(Value::Null) => None,
        Some(system @ (Value::String(_) | Value::Array(_))) => Some(content_text(Some(system), 0)?),
        Some(_) => return Err(invalid("system must be a string or an array of text blocks")),
    };
    Ok(ChatRequest {
        model,
        system,
        messages,
        max_tokens: Some(max_tokens),
        stream: optional_bool(body, "stream")?,
        stream_usage: true,
        strategy: route_strategy(body)?,
    })
}

/// Rough token count of a text (about four characters a token), at least one for non-empty text.
pub fn estimate_tokens(text: &str) -> u64 {
    let characters = text.chars().count() as u64;
    characters.div_ceil(4)
}

/// The sandbox model's reply: it says what it is, how to leave the sandbox, and reflects the prompt,
/// so a client can see its request went through the whole pipeline.
pub fn sandbox_reply(request: &ChatRequest, id: String) -> ChatReply {
    let last_user =
        request.messages.iter().rev().find(|message| message.role == Role::User).map(|message| message.text.as_str()).unwrap_or_default();
    let words = last_user.split_whitespace().count();
    let excerpt: String = last_user.chars().take(160).collect();
    let ellipsis = if last_user.chars().count() > 160 { "..." } else { "" };
    let full_text = format!(
        "Hello from the Brainstorm sandbox. This reply is simulated by {SANDBOX_MODEL} because no provider key is registered for this tenant; \
         register one with POST /v1/providers to reach {}. Your last message had {words} words: \"{excerpt}{ellipsis}\"",
        request.model
    );
    let (text, finish) = match request.max_tokens {
        Some(limit) if estimate_tokens(&full_text) > u64::from(limit) => (truncate_to_tokens(&full_text, limit), FinishReason::Length),
        _ => (full_text, FinishReason::Stop),
    };
    let prompt: u64 = request.system.iter().map(|system| estimate_tokens(system) + 3).sum::<u64>()
        + request.messages.iter().map(|message| estimate_tokens(&message.text) + 3).sum::<u64>();
    ChatReply {
        id,
        model: SANDBOX_MODEL.to_string(),
        output_tokens: estimate_tokens(&text),
        text,
        finish,
        input_tokens: prompt,
        created: chrono::Utc::now().timestamp(),
    }
}

fn truncate_to_tokens(text: &str, tokens: u32) -> String {
    let characters = usize::try_from(tokens).unwrap_or(usize::MAX).saturating_mul(4);
    text.chars().take(characters).collect()
}

/// Splits a reply into the deltas a stream carries (word by word, whitespace kept).
fn deltas(text: &str) -> Vec<&str> {
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

fn openai_finish(finish: FinishReason) -> &'static str {
    match finish {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

fn anthropic_stop(finish: FinishReason) -> &'static str {
    match finish {
        FinishReason::Stop => "end_turn",
        FinishReason::Length => "max_tokens",
    }
}

/// An OpenAI `chat.completion`.
pub fn openai_completion(reply: &ChatReply, cost_usd: &str, strategy: &str) -> Value {
    json!({
        "id": reply.id,
        "object": "chat.completion",
        "created": reply.created,
        "model": reply.model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": reply.text},
            "finish_reason": openai_finish(reply.finish),
            "logprobs": null,
        }],
        "usage": {
            "prompt_tokens": reply.input_tokens,
            "completion_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
            "cost_usd": cost_usd.parse::<f64>().map(Value::from).unwrap_or(Value::Null),
            "routing_strategy": strategy,
        },
    })
}

/// The SSE frames of an OpenAI stream, ending with `data: [DONE]`.
pub fn openai_stream(reply: &ChatReply, include_usage: bool) -> Vec<String> {
    let chunk = |delta: Value, finish: Value| {
        json!({
            "id": reply.id,
            "object": "chat.completion.chunk",
            "created": reply.created,
            "model": reply.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}],
        })
    };
    let mut frames = vec![chunk(json!({"role": "assistant", "content": ""}), Value::Null)];
    frames.extend(deltas(&reply.text).into_iter().map(|piece| chunk(json!({"content": piece}), Value::Null)));
    frames.push(chunk(json!({}), json!(openai_finish(reply.finish))));
    if include_usage {
        frames.push(json!({
            "id": reply.id,
            "object": "chat.completion.chunk",
            "created": reply.created,
            "model": reply.model,
            "choices": [],
            "usage": {"prompt_tokens": reply.input_tokens, "completion_tokens": reply.output_tokens, "total_tokens": reply.input_tokens + reply.output_tokens},
        }));
    }
    let mut lines: Vec<String> = frames.iter().map(|frame| format!("data: {frame}\n\n")).collect();
    lines.push("data: [DONE]\n\n".to_string());
    lines
}

/// An Anthropic `message`.
pub fn anthropic_message(reply: &ChatReply) -> Value {
    json!({
        "id": reply.id,
        "type": "message",
        "role": "assistant",
        "model": reply.model,
        "content": [{"type": "text", "text": reply.text}],
        "stop_reason": anthropic_stop(reply.finish),
        "stop_sequence": null,
        "usage": {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens},
    })
}

/// The SSE events of an Anthropic stream: the six event names, in order.
pub fn anthropic_stream(reply: &ChatReply) -> Vec<String> {
    let mut events = vec![
        (
            "message_start",
            json!({"type": "message_start", "message": {
                "id": reply.id, "type": "message", "role": "assistant", "model": reply.model, "content": [],
                "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": reply.input_tokens, "output_tokens": 0},
            }}),
        ),
        ("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
    ];
    for piece in deltas(&reply.text) {
        events.push((
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}),
        ));
    }
    events.push(("content_block_stop", json!({"type": "content_block_stop", "index": 0})));
    events.push(("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": anthropic_stop(reply.finish), "stop_sequence": null}, "usage": {"output_tokens": reply.output_tokens}})));
    events.push(("message_stop", json!({"type": "message_stop"})));
    events.into_iter().map(|(name, data)| format!("event: {name}\ndata: {data}\n\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code_of(result: Result<ChatRequest, ApiError>) -> Option<String> {
        result.err().and_then(|error| error.code.clone())
    }

    #[test]
    fn openai_bodies_are_validated() {
        assert_eq!(code_of(parse_openai(&json!({"messages": [{"role": "user", "content": "hi"}]}))).as_deref(), Some("missing_field"));
        assert_eq!(code_of(parse_openai(&json!({"model": "gpt-4o"}))).as_deref(), Some("missing_field"));
        assert!(parse_openai(&json!({"model": "gpt-4o", "messages": []})).is_err());
        assert!(parse_openai(&json!({"model": "gpt-4o", "messages": [{"role": "wizard", "content": "hi"}]})).is_err());
        assert!(parse_openai(&json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "temperature": 3})).is_err());
        let strategy =
            parse_openai(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "route": {"strategy": "cheapest"}}));
        assert_eq!(code_of(strategy).as_deref(), Some("invalid_strategy"));
    }

    #[test]
    fn openai_parts_and_system_messages_are_read() -> Result<(), ApiError> {
        let request = parse_openai(&json!({
            "model": "openai/gpt-4o",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "world"}]}
            ],
            "max_tokens": 5,
            "stream": true
        }))?;
        assert_eq!(request.system.as_deref(), Some("be brief"));
        assert_eq!(request.messages, vec![ChatMessage { role: Role::User, text: "hello\nworld".to_string() }]);
        assert_eq!((request.max_tokens, request.stream), (Some(5), true));
        Ok(())
    }

    #[test]
    fn anthropic_requires_max_tokens_and_known_roles() {
        let base = json!({"model": "claude", "messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(code_of(parse_anthropic(&base)).as_deref(), Some("missing_field"));
        assert!(parse_anthropic(&json!({"model": "claude", "max_tokens": 10, "messages": [{"role": "system", "content": "hi"}]})).is_err());
        let request = parse_anthropic(
            &json!({"model": "claude", "max_tokens": 10, "system": [{"type": "text", "text": "sys"}], "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
        );
        assert_eq!(request.ok().and_then(|request| request.system), Some("sys".to_string()));
    }

    #[test]
    fn the_sandbox_reflects_the_prompt_and_honours_max_tokens() -> Result<(), ApiError> {
        let request = parse_openai(&json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "count these four words"}]}))?;
        let reply = sandbox_reply(&request, "chatcmpl-1".to_string());
        assert!(reply.text.contains("4 words") && reply.text.contains("count these four words"));
        assert_eq!(reply.finish, FinishReason::Stop);
        assert_eq!(reply.output_tokens, estimate_tokens(&reply.text));
        let short = sandbox_reply(&ChatRequest { max_tokens: Some(3), ..request }, "chatcmpl-2".to_string());
        assert_eq!((short.finish, short.output_tokens), (FinishReason::Length, 3));
        Ok(())
    }

    #[test]
    fn streams_reassemble_to_the_reply() -> Result<(), ApiError> {
        let request = parse_openai(&json!({"model": "m", "messages": [{"role": "user", "content": "a b c"}]}))?;
        let reply = sandbox_reply(&request, "id".to_string());
        let frames = openai_stream(&reply, true);
        assert_eq!(frames.last().map(String::as_str), Some("data: [DONE]\n\n"));
        let mut text = String::new();
        for frame in &frames[..frames.len() - 1] {
            let chunk: Value =
                serde_json::from_str(frame.trim_start_matches("data: ").trim()).map_err(|error| invalid(error.to_string()))?;
            text.push_str(chunk.pointer("/choices/0/delta/content").and_then(Value::as_str).unwrap_or_default());
        }
        assert_eq!(text, reply.text);
        let events = anthropic_stream(&reply);
        let names: Vec<&str> =
            events.iter().filter_map(|event| event.lines().next()).map(|line| line.trim_start_matches("event: ")).collect();
        assert_eq!(names.first(), Some(&"message_start"));
        assert_eq!(names.last(), Some(&"message_stop"));
        for name in ["content_block_start", "content_block_delta", "content_block_stop", "message_delta"] {
            assert!(names.contains(&name), "{name}");
        }
        Ok(())
    }
}
