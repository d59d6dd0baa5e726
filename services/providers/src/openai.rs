//! The OpenAI chat completions format, both as clients send it and as providers of the OpenAI family
//! answer it.

use std::borrow::Cow;

use serde_json::Value;

use crate::anthropic::{Marked, cache_control};
use crate::chat::fields::{
    optional_bool, optional_flag, optional_i64, optional_number_in, optional_positive_u32, optional_string, required_array,
    required_string, stop_list,
};
use crate::chat::{
    CacheAt, CachePoint, CacheTtl, ChatEvent, ChatReply, ChatRequest, DocumentSource, FinishReason, InvalidRequest, Message, OpenAiOptions,
    Part, Role, Schema, TokenLogprob, Tool, ToolChoice, TopLogprob, Usage,
};

mod typed_request;

/// Reads a client's chat completions body of the common shape straight from its bytes, without a
/// JSON tree; None for any other body (an invalid one included), which `parse_request` reads.
pub fn read_request(body: &[u8]) -> Option<ChatRequest> {
    typed_request::read(body)
}

/// Reads a client's chat completions body.
pub fn parse_request(body: &Value) -> Result<ChatRequest, InvalidRequest> {
    if !body.is_object() {
        return Err(InvalidRequest::new("the body must be a JSON object"));
    }
    let model = required_string(body, "model")?;
    let raw_messages = required_array(body, "messages")?;
    let mut system = Vec::new();
    let mut messages = Vec::new();
    // Anthropic's `cache_control` on content parts and tools (as LiteLLM takes it from OpenAI clients),
    // for requests routed to Anthropic.
    let mut cache_points = Vec::new();
    let mut system_cache = None;
    for (position, message) in raw_messages.iter().enumerate() {
        let role = message
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| InvalidRequest::new(format!("messages[{position}].role is required")))?;
        match role {
            "system" | "developer" => {
                let (text, cache) = content_text(message.get("content"), position)?;
                system_cache = cache.or(system_cache);
                system.push(text);
            }
            "user" => {
                let parts = placed(&mut cache_points, messages.len(), content_parts(message.get("content"), position)?);
                messages.push(Message { role: Role::User, parts });
            }
            "assistant" => {
                let mut parts = placed(&mut cache_points, messages.len(), content_parts(message.get("content"), position)?);
                for call in message.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
                    let function = call.get("function").unwrap_or(&Value::Null);
                    let name = function
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or_else(|| InvalidRequest::new(format!("messages[{position}].tool_calls[].function.name is required")))?;
                    parts.push(Part::ToolCall {
                        id: call.get("id").and_then(Value::as_str).unwrap_or_default().to_string(),
                        name: name.to_string(),
                        arguments: arguments_text(function.get("arguments")),
                    });
                }
                if let Some(function) = message.get("function_call").filter(|call| call.is_object()) {
                    let name = function.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
                    parts.push(Part::ToolCall { id: name.clone(), name, arguments: arguments_text(function.get("arguments")) });
                }
                messages.push(Message { role: Role::Assistant, parts });
            }
            "tool" | "function" => {
                let call_id =
                    message.get("tool_call_id").or_else(|| message.get("name")).and_then(Value::as_str).unwrap_or_default().to_string();
                let (content, cache) = content_text(message.get("content"), position)?;
                if let Some(ttl) = cache {
                    cache_points.push(CachePoint { at: CacheAt::Part { message: messages.len(), part: 0 }, ttl });
                }
                messages.push(Message {
                    role: Role::Tool,
                    parts: vec![Part::ToolResult { call_id, content, is_error: false, media: Vec::new() }],
                });
            }
            other => {
                return Err(InvalidRequest::new(format!(
                    "messages[{position}].role `{other}` is not one of system, developer, user, assistant, tool"
                )));
            }
        }
    }
    if let Some(ttl) = system_cache.filter(|_| !system.is_empty()) {
        cache_points.push(CachePoint { at: CacheAt::System, ttl });
    }
    let mut tools = Vec::new();
    for (index, tool) in body.get("tools").and_then(Value::as_array).into_iter().flatten().enumerate() {
        if let Some(ttl) = cache_control(tool, || format!("tools[{index}]"))? {
            cache_points.push(CachePoint { at: CacheAt::Tool(index), ttl });
        }
        let function = tool.get("function").ok_or_else(|| InvalidRequest::new("tools[] entries need a function"))?;
        tools.push(tool_of(function)?);
    }
    for function in body.get("functions").and_then(Value::as_array).into_iter().flatten() {
        tools.push(tool_of(function)?);
    }
    let tool_choice = match body.get("tool_choice").or_else(|| body.get("function_call")) {
        None | Some(Value::Null) => None,
        Some(Value::String(choice)) => Some(match choice.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => return Err(InvalidRequest::new(format!("tool_choice `{other}` is not one of auto, none, required"))),
        }),
        Some(choice) => {
            let name = choice.pointer("/function/name").or_else(|| choice.get("name")).and_then(Value::as_str);
            Some(ToolChoice::Named(name.ok_or_else(|| InvalidRequest::new("tool_choice must name a function"))?.to_string()))
        }
    };
    one_answer(body)?;
    let max_tokens = match optional_positive_u32(body, "max_completion_tokens")? {
        Some(tokens) => Some(tokens),
        None => optional_positive_u32(body, "max_tokens")?,
    };
    Ok(ChatRequest {
        model,
        system: (!system.is_empty()).then(|| system.join("\n")),
        messages,
        tools,
        tool_choice,
        max_tokens,
        temperature: optional_number_in(body, "temperature", 0.0, 2.0)?,
        top_p: optional_number_in(body, "top_p", 0.0, 1.0)?,
        top_k: None,
        stop: stop_list(body, "stop")?,
        stream: optional_bool(body, "stream")?,
        stream_usage: body.pointer("/stream_options/include_usage").and_then(Value::as_bool).unwrap_or(false),
        user: optional_string(body, "user")?,
        response_format: body.get("response_format").filter(|format| !format.is_null()).cloned().map(Schema::from),
        parallel_tool_calls: optional_flag(body, "parallel_tool_calls")?,
        openai: OpenAiOptions {
            seed: optional_i64(body, "seed")?,
            frequency_penalty: optional_number_in(body, "frequency_penalty", -2.0, 2.0)?,
            presence_penalty: optional_number_in(body, "presence_penalty", -2.0, 2.0)?,
            logit_bias: logit_bias(body)?,
            reasoning_effort: optional_string(body, "reasoning_effort")?,
            logprobs: optional_bool(body, "logprobs")?,
            top_logprobs: top_logprobs(body)?,
        },
        cache_points,
        thinking: None,
    })
}

/// `n`: the gateway routes, prices, guards and records one answer per request, so a request for
/// several is refused rather than answered with one.
fn one_answer(body: &Value) -> Result<(), InvalidRequest> {
    match body.get("n") {
        None | Some(Value::Null) => Ok(()),
        Some(n) => match n.as_u64() {
            Some(1) => Ok(()),
            Some(2..) => Err(InvalidRequest::new("n greater than 1 is not supported: send one request per answer")),
            _ => Err(InvalidRequest::new("n must be a positive integer")),
        },
    }
}

/// `top_logprobs`: 0..=20, and only with `logprobs` (OpenAI refuses it alone).
fn top_logprobs(body: &Value) -> Result<Option<u8>, InvalidRequest> {
    let count = match body.get("top_logprobs") {
        None | Some(Value::Null) => return Ok(None),
        Some(value) => value
            .as_u64()
            .filter(|count| *count <= 20)
            .and_then(|count| u8::try_from(count).ok())
            .ok_or_else(|| InvalidRequest::new("top_logprobs must be an integer from 0 to 20"))?,
    };
    if body.get("logprobs").and_then(Value::as_bool) != Some(true) {
        return Err(InvalidRequest::new("top_logprobs needs logprobs set to true"));
    }
    Ok(Some(count))
}

/// `logit_bias`: token ids (decimal, as JSON keys) to biases in -100..=100, in token id order.
fn logit_bias(body: &Value) -> Result<Vec<(u64, serde_json::Number)>, InvalidRequest> {
    let entries = match body.get("logit_bias") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(entries)) => entries,
        Some(_) => return Err(InvalidRequest::new("logit_bias must be an object of token ids to numbers")),
    };
    let mut bias = entries
        .iter()
        .map(|(token, value)| {
            let id = token.parse::<u64>().ok().filter(|_| token.bytes().all(|byte| byte.is_ascii_digit()));
            match (id, value.as_number().filter(|bias| bias.as_f64().is_some_and(|bias| (-100.0..=100.0).contains(&bias)))) {
                (Some(id), Some(bias)) => Ok((id, bias.clone())),
                _ => Err(InvalidRequest::new(format!("logit_bias maps token ids to numbers between -100 and 100; `{token}` does not"))),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    bias.sort_by_key(|(id, _)| *id);
    bias.dedup_by_key(|(id, _)| *id);
    Ok(bias)
}

fn tool_of(function: &Value) -> Result<Tool, InvalidRequest> {
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .filter(|name| !name.is_empty())
        .ok_or_else(|| InvalidRequest::new("every tool needs a function name"))?;
    Ok(Tool {
        name: name.to_string(),
        description: function.get("description").and_then(Value::as_str).map(str::to_string),
        parameters: function.get("parameters").cloned().map_or_else(Schema::empty_object, Schema::from),
    })
}

fn arguments_text(arguments: Option<&Value>) -> String {
    match arguments {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    }
}

/// The content's text, and the last breakpoint among its parts (the text is one part).
fn content_text(content: Option<&Value>, position: usize) -> Result<(String, Option<Option<CacheTtl>>), InvalidRequest> {
    let parts = content_parts(content, position)?;
    let cache = parts.iter().rev().find_map(|part| part.cache);
    Ok((Message { role: Role::User, parts: parts.into_iter().map(|part| part.part).collect() }.text(), cache))
}

/// The parts of the message about to be `message`, each breakpoint placed as a cache point.
fn placed(cache_points: &mut Vec<CachePoint>, message: usize, parts: Vec<Marked>) -> Vec<Part> {
    for (part, marked) in parts.iter().enumerate() {
        if let Some(ttl) = marked.cache {
            cache_points.push(CachePoint { at: CacheAt::Part { message, part }, ttl });
        }
    }
    parts.into_iter().map(|part| part.part).collect()
}

fn content_parts(content: Option<&Value>, position: usize) -> Result<Vec<Marked>, InvalidRequest> {
    match content {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(text)) => Ok(vec![Part::Text(text.clone()).into()]),
        Some(Value::Array(items)) => {
            let mut parts = Vec::new();
            for item in items {
                let part = match item.get("type").and_then(Value::as_str) {
                    Some("text") => Part::Text(item.get("text").and_then(Value::as_str).unwrap_or_default().to_string()),
                    Some("image_url") => {
                        let url =
                            item.pointer("/image_url/url").or_else(|| item.get("image_url")).and_then(Value::as_str).unwrap_or_default();
                        Part::Image { url: url.to_string() }
                    }
                    Some("file") => file_part(item, position)?,
                    // What an assistant declined to do, as it said it.
                    Some("refusal") => Part::Text(item.get("refusal").and_then(Value::as_str).unwrap_or_default().to_string()),
                    Some(kind) => {
                        return Err(InvalidRequest::unsupported(format!(
                            "messages[{position}].content: `{kind}` parts are not supported (text, image_url, file and refusal are)"
                        )));
                    }
                    None => return Err(InvalidRequest::new(format!("messages[{position}].content parts need a type"))),
                };
                parts.push(Marked { part, cache: cache_control(item, || format!("messages[{position}].content[]"))? });
            }
            Ok(parts)
        }
        Some(_) => Err(InvalidRequest::new(format!("messages[{position}].content must be a string or an array of parts"))),
    }
}

/// A `file` part: the file's bytes as a base64 `data:` URL in `file_data`, named by `filename`. A
/// `file_id` is refused: it names a file in one provider's storage.
fn file_part(item: &Value, position: usize) -> Result<Part, InvalidRequest> {
    let at = format!("messages[{position}].content[].file");
    let file = item.get("file").filter(|file| file.is_object()).ok_or_else(|| InvalidRequest::missing(&at))?;
    let name = match file.get("filename") {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) => Some(name.clone()),
        Some(_) => return Err(InvalidRequest::new(format!("{at}.filename must be a string"))),
    };
    match file.get("file_data") {
        Some(Value::String(data)) => {
            let source = DocumentSource::of_data_url(data).ok_or_else(|| {
                InvalidRequest::new(format!("{at}.file_data must be a base64 data: URL (data:application/pdf;base64,...)"))
            })?;
            Ok(Part::Document { source, name })
        }
        Some(_) => Err(InvalidRequest::new(format!("{at}.file_data must be a string"))),
        None if file.get("file_id").is_some() => Err(InvalidRequest::unsupported(format!(
            "{at}.file_id names a file in one provider's storage; send the file's bytes as file_data"
        ))),
        None => Err(InvalidRequest::missing(&format!("{at}.file_data"))),
    }
}

/// The `finish_reason` of a reply.
pub fn finish_reason(finish: FinishReason) -> &'static str {
    match finish {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::ToolCalls => "tool_calls",
        FinishReason::ContentFilter => "content_filter",
    }
}

fn parse_finish(reason: &str) -> FinishReason {
    match reason {
        "length" => FinishReason::Length,
        "tool_calls" | "function_call" => FinishReason::ToolCalls,
        "content_filter" => FinishReason::ContentFilter,
        _ => FinishReason::Stop,
    }
}

/// A `chat.completion` as the client receives it, serialized straight from the reply (no JSON tree
/// in between: this is on every answered request).
#[derive(Debug, serde::Serialize)]
pub struct RenderedReply<'a> {
    id: &'a str,
    object: &'static str,
    created: i64,
    model: &'a str,
    choices: [RenderedChoice<'a>; 1],
    usage: RenderedUsage<'a>,
}

#[derive(Debug, serde::Serialize)]
struct RenderedChoice<'a> {
    index: u32,
    message: RenderedMessage<'a>,
    finish_reason: &'static str,
    logprobs: Option<chunk::Logprobs<'a>>,
}

#[derive(Debug, serde::Serialize)]
struct RenderedMessage<'a> {
    role: &'static str,
    content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<RenderedToolCall<'a>>,
}

/// A function call as OpenAI writes it, in replies and in the history of requests.
#[derive(Debug, serde::Serialize)]
pub struct RenderedToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: RenderedFunction<'a>,
}

impl<'a> RenderedToolCall<'a> {
    /// A function call with its arguments as JSON text.
    fn function(id: &'a str, name: &'a str, arguments: &'a str) -> Self {
        RenderedToolCall { id, kind: "function", function: RenderedFunction { name, arguments } }
    }
}

#[derive(Debug, serde::Serialize)]
struct RenderedFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Debug, serde::Serialize)]
struct RenderedUsage<'a> {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_tokens_details: Option<chunk::PromptDetails>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cost_usd: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    routing_strategy: Option<&'a str>,
}

/// What the gateway adds to a reply's `usage`: the request's cost in dollars (null when the model has
/// no price) and the routing strategy that chose the model.
#[derive(Debug, Clone, Copy)]
pub struct UsageExtra<'a> {
    pub cost_usd: &'a Value,
    pub routing_strategy: &'a str,
}

/// A `chat.completion` for the client; `usage_extra` adds the gateway's members to its `usage`.
pub fn render_reply<'a>(reply: &'a ChatReply, created: i64, usage_extra: Option<UsageExtra<'a>>) -> RenderedReply<'a> {
    let text = reply.text();
    let tool_calls: Vec<RenderedToolCall<'_>> = reply
        .parts
        .iter()
        .filter_map(|part| match part {
            Part::ToolCall { id, name, arguments } => Some(RenderedToolCall::function(id, name, arguments)),
            _ => None,
        })
        .collect();
    let content = if text.is_empty() && !tool_calls.is_empty() { None } else { Some(text) };
    RenderedReply {
        id: &reply.id,
        object: "chat.completion",
        created,
        model: &reply.model,
        choices: [RenderedChoice {
            index: 0,
            message: RenderedMessage { role: "assistant", content, tool_calls },
            finish_reason: finish_reason(reply.finish),
            logprobs: reply.logprobs.as_deref().map(chunk::Logprobs::of),
        }],
        usage: RenderedUsage {
            prompt_tokens: reply.usage.input_tokens,
            completion_tokens: reply.usage.output_tokens,
            total_tokens: reply.usage.input_tokens + reply.usage.output_tokens,
            prompt_tokens_details: chunk::PromptDetails::of(reply.usage),
            cost_usd: usage_extra.map(|extra| extra.cost_usd),
            routing_strategy: usage_extra.map(|extra| extra.routing_strategy),
        },
    }
}

/// Writes a neutral event stream as OpenAI `chat.completion.chunk` SSE frames.
#[derive(Debug)]
pub struct StreamWriter {
    id: String,
    model: String,
    created: i64,
    include_usage: bool,
    started: bool,
    finish: Option<FinishReason>,
    usage: Option<Usage>,
    /// Log probabilities waiting for the text delta they belong to.
    logprobs: Option<Vec<crate::chat::TokenLogprob>>,
    /// What follows the content in each of this reply's text frames (the delta's end, the choice's
    /// other members and the chunk's id, model and time: the same in every frame), written once.
    /// Empty if the chunk did not serialize as `TEXT_FRAME_HEAD` expects: text frames then take
    /// the general path.
    text_tail: String,
}

/// How each text frame begins: `chunk::Chunk`'s members in their serialized order, up to the content.
const TEXT_FRAME_HEAD: &str = "data: {\"choices\":[{\"delta\":{\"content\":";

impl StreamWriter {
    /// A writer for one reply.
    pub fn new(id: String, model: String, created: i64, include_usage: bool) -> Self {
        let mut writer = StreamWriter {
            id,
            model,
            created,
            include_usage,
            started: false,
            finish: None,
            usage: None,
            logprobs: None,
            text_tail: String::new(),
        };
        // The tail is cut from a real frame with empty content, so it is what serde writes.
        let empty = writer.chunk(chunk::Delta { content: Some(""), ..chunk::Delta::default() }, None);
        if let Some(tail) = empty.strip_prefix(TEXT_FRAME_HEAD).and_then(|rest| rest.strip_prefix("\"\"")) {
            writer.text_tail = tail.to_string();
        }
        writer
    }

    /// A text delta's frame: the head, the content as a JSON string and the reply's tail, without
    /// serializing the rest of the chunk again (a reply streams one of these per token or so).
    fn text_frame(&self, text: &str) -> String {
        if self.text_tail.is_empty() {
            return self.chunk(chunk::Delta { content: Some(text), ..chunk::Delta::default() }, None);
        }
        crate::sse::frame_between(TEXT_FRAME_HEAD, &text, &self.text_tail)
    }

    /// One `data:` frame, serialized straight from borrowed parts (no `Value` tree per chunk).
    fn frame(&self, choices: &[chunk::Choice<'_>], usage: Option<chunk::Usage>) -> String {
        let chunk =
            chunk::Chunk { choices, created: self.created, id: &self.id, model: &self.model, object: "chat.completion.chunk", usage };
        crate::sse::frame("data: ", &chunk)
    }

    fn chunk(&self, delta: chunk::Delta<'_>, finish_reason: Option<&'static str>) -> String {
        self.frame(&[chunk::Choice { delta, finish_reason, index: 0, logprobs: None }], None)
    }

    /// A frame of `delta` carrying the waiting log probabilities (the general path: a client that
    /// asked for them is rare enough).
    fn chunk_with_logprobs(&mut self, delta: chunk::Delta<'_>, tokens: &[crate::chat::TokenLogprob]) -> String {
        self.frame(&[chunk::Choice { delta, finish_reason: None, index: 0, logprobs: Some(chunk::Logprobs::of(tokens)) }], None)
    }

    /// The opening frame (the assistant's role), once: a relay sends it as soon as the provider
    /// accepted the call, before the first token, as OpenAI does.
    pub fn begin(&mut self) -> Vec<String> {
        let mut frames = Vec::new();
        if !self.started {
            self.started = true;
            frames.push(self.chunk(chunk::Delta { content: Some(""), role: Some("assistant"), ..chunk::Delta::default() }, None));
        }
        frames
    }

    /// The frames for one event (the finish and usage frames wait for `end`).
    pub fn write(&mut self, event: &ChatEvent) -> Vec<String> {
        let mut frames = self.begin();
        match event {
            ChatEvent::TextDelta(text) => match self.logprobs.take() {
                Some(tokens) => {
                    frames.push(self.chunk_with_logprobs(chunk::Delta { content: Some(text), ..chunk::Delta::default() }, &tokens))
                }
                None => frames.push(self.text_frame(text)),
            },
            ChatEvent::Logprobs(tokens) => self.logprobs.get_or_insert_default().extend_from_slice(tokens),
            ChatEvent::ToolCallStart { index, id, name } => {
                let call = chunk::ToolCall {
                    function: chunk::Function { arguments: "", name: Some(name.as_str()) },
                    id: Some(id.as_str()),
                    index: *index,
                    kind: Some("function"),
                };
                frames.push(self.chunk(chunk::Delta { tool_calls: Some([call]), ..chunk::Delta::default() }, None));
            }
            ChatEvent::ToolCallDelta { index, arguments } => {
                let call = chunk::ToolCall { function: chunk::Function { arguments, name: None }, id: None, index: *index, kind: None };
                frames.push(self.chunk(chunk::Delta { tool_calls: Some([call]), ..chunk::Delta::default() }, None));
            }
            // The format has no thinking: a client sees the answer only.
            ChatEvent::ThinkingDelta(_) | ChatEvent::ThinkingSignature(_) | ChatEvent::RedactedThinking(_) => {}
            ChatEvent::Finish(reason) => self.finish = Some(*reason),
            ChatEvent::Usage(usage) => self.usage = Some(*usage),
        }
        frames
    }

    /// The closing frames: the finish chunk, the usage chunk when asked for, and `[DONE]`.
    pub fn end(&mut self) -> Vec<String> {
        let mut frames = self.begin();
        if let Some(tokens) = self.logprobs.take() {
            frames.push(self.chunk_with_logprobs(chunk::Delta::default(), &tokens));
        }
        frames.push(self.chunk(chunk::Delta::default(), Some(finish_reason(self.finish.unwrap_or(FinishReason::Stop)))));
        if self.include_usage {
            let usage = self.usage.unwrap_or_default();
            let usage = chunk::Usage {
                completion_tokens: usage.output_tokens,
                prompt_tokens: usage.input_tokens,
                prompt_tokens_details: chunk::PromptDetails::of(usage),
                total_tokens: usage.input_tokens + usage.output_tokens,
            };
            frames.push(self.frame(&[], Some(usage)));
        }
        frames.push("data: [DONE]\n\n".to_string());
        frames
    }
}

/// A `chat.completion.chunk` as the client receives it. Members are declared in the byte order of
/// their names, the order the earlier `Value`-built chunks had (serde_json's maps sort their keys), so
/// a frame reads the same byte for byte.
mod chunk {
    use serde::Serialize;

    #[derive(Serialize)]
    pub(super) struct Chunk<'a> {
        pub choices: &'a [Choice<'a>],
        pub created: i64,
        pub id: &'a str,
        pub model: &'a str,
        pub object: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub usage: Option<Usage>,
    }

    #[derive(Serialize)]
    pub(super) struct Choice<'a> {
        pub delta: Delta<'a>,
        pub finish_reason: Option<&'static str>,
        pub index: u32,
        /// `null` unless the client asked for log probabilities.
        pub logprobs: Option<Logprobs<'a>>,
    }

    /// `logprobs` as OpenAI writes it: the tokens' entries as `content` (refusals have none here).
    #[derive(Debug, Serialize)]
    pub(super) struct Logprobs<'a> {
        pub content: &'a [crate::chat::TokenLogprob],
        pub refusal: Option<()>,
    }

    impl<'a> Logprobs<'a> {
        pub(super) fn of(content: &'a [crate::chat::TokenLogprob]) -> Self {
            Logprobs { content, refusal: None }
        }
    }

    #[derive(Serialize, Default)]
    pub(super) struct Delta<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        pub content: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub role: Option<&'static str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub tool_calls: Option<[ToolCall<'a>; 1]>,
    }

    #[derive(Serialize)]
    pub(super) struct ToolCall<'a> {
        pub function: Function<'a>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub id: Option<&'a str>,
        pub index: usize,
        #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
        pub kind: Option<&'static str>,
    }

    #[derive(Serialize)]
    pub(super) struct Function<'a> {
        pub arguments: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub name: Option<&'a str>,
    }

    #[derive(Serialize)]
    pub(super) struct Usage {
        pub completion_tokens: u64,
        pub prompt_tokens: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub prompt_tokens_details: Option<PromptDetails>,
        pub total_tokens: u64,
    }

    /// The prompt tokens read from the provider's cache (OpenAI counts them within `prompt_tokens`).
    #[derive(Debug, Serialize)]
    pub(super) struct PromptDetails {
        pub cached_tokens: u64,
    }

    impl PromptDetails {
        /// Sent only when some were read.
        pub(super) fn of(usage: crate::chat::Usage) -> Option<Self> {
            (usage.cache_read_tokens > 0).then_some(PromptDetails { cached_tokens: usage.cache_read_tokens })
        }
    }
}

/// Which member carries the answer's token limit in a provider's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenLimit {
    /// `max_tokens`: what every OpenAI-compatible server reads.
    MaxTokens,
    /// `max_completion_tokens`: OpenAI's own (its reasoning models refuse `max_tokens`).
    MaxCompletionTokens,
}

/// The name a nameless file goes by (OpenAI refuses file data without one).
fn default_filename(media_type: &str) -> &'static str {
    match media_type {
        "application/pdf" => "document.pdf",
        "text/plain" => "document.txt",
        _ => "document",
    }
}

/// What introduces the images and files a tool call returned, followed by the call's id.
const MEDIA_INTRODUCTION: &str = "Images and files returned by the tool call with id:";

/// The content part of a user message's part (None for parts a user message does not carry).
fn content_part(part: &Part) -> Option<outgoing::ContentPart<'_>> {
    use outgoing::{ContentPart, FileData, ImageUrl};
    match part {
        Part::Text(text) => Some(ContentPart::Text { text }),
        Part::Image { url } => Some(ContentPart::ImageUrl { image_url: ImageUrl { url } }),
        Part::Document { source, name } => match source {
            DocumentSource::Base64 { media_type, data } => Some(ContentPart::File {
                file: FileData {
                    filename: name.as_deref().unwrap_or(default_filename(media_type)),
                    file_data: format!("data:{media_type};base64,{data}"),
                },
            }),
            DocumentSource::Text(text) => Some(ContentPart::Text { text }),
            // Routing sends no document by URL here (`routing::can_read`).
            DocumentSource::Url(_) => None,
        },
        _ => None,
    }
}

/// The body sent to an OpenAI-family provider.
pub fn build_request<'a>(request: &'a ChatRequest, upstream_model: &'a str, limit: TokenLimit) -> outgoing::Request<'a> {
    use outgoing::{Choice, ContentPart, FunctionName, Message as Out, Tool as OutTool, ToolFunction, UserContent};
    let mut messages = Vec::with_capacity(request.messages.len() + 1);
    if let Some(system) = &request.system {
        messages.push(Out::System { content: system });
    }
    for message in &request.messages {
        match message.role {
            Role::User => {
                let content = if message.parts.iter().all(|part| matches!(part, Part::Text(_))) {
                    UserContent::Text(message.text_borrowed())
                } else {
                    UserContent::Parts(message.parts.iter().filter_map(content_part).collect())
                };
                messages.push(Out::User { content });
            }
            Role::Assistant => {
                let text = message.text_borrowed();
                let tool_calls: Vec<RenderedToolCall<'_>> = message
                    .parts
                    .iter()
                    .filter_map(|part| match part {
                        Part::ToolCall { id, name, arguments } => Some(RenderedToolCall::function(id, name, arguments)),
                        _ => None,
                    })
                    .collect();
                let content = if text.is_empty() && !tool_calls.is_empty() { None } else { Some(text) };
                messages.push(Out::Assistant { content, tool_calls });
            }
            Role::Tool => {
                // OpenAI's tool messages are text: the images and files tool calls returned follow
                // them in a user message, each call's introduced by its id.
                let mut media = Vec::new();
                for part in &message.parts {
                    if let Part::ToolResult { call_id, content, media: returned, .. } = part {
                        messages.push(Out::Tool { tool_call_id: call_id, content });
                        if !returned.is_empty() {
                            media.push(ContentPart::Text { text: MEDIA_INTRODUCTION });
                            media.push(ContentPart::Text { text: call_id });
                            media.extend(returned.iter().filter_map(content_part));
                        }
                    }
                }
                if !media.is_empty() {
                    messages.push(Out::User { content: UserContent::Parts(media) });
                }
            }
        }
    }
    outgoing::Request {
        model: upstream_model,
        messages,
        tools: request
            .tools
            .iter()
            .map(|tool| OutTool {
                kind: "function",
                function: ToolFunction { name: &tool.name, description: tool.description.as_deref(), parameters: &tool.parameters },
            })
            .collect(),
        tool_choice: request.tool_choice.as_ref().map(|choice| match choice {
            ToolChoice::Auto => Choice::Mode("auto"),
            ToolChoice::None => Choice::Mode("none"),
            ToolChoice::Required => Choice::Mode("required"),
            ToolChoice::Named(name) => Choice::Named { kind: "function", function: FunctionName { name } },
        }),
        parallel_tool_calls: request.parallel_tool_calls.filter(|_| !request.tools.is_empty()),
        max_tokens: request.max_tokens.filter(|_| limit == TokenLimit::MaxTokens),
        max_completion_tokens: request.max_tokens.filter(|_| limit == TokenLimit::MaxCompletionTokens),
        temperature: request.temperature,
        top_p: request.top_p,
        stop: &request.stop,
        user: request.user.as_deref(),
        stream: request.stream,
        // Always ask for usage: the gateway prices every stream.
        stream_options: request.stream.then_some(outgoing::StreamOptions { include_usage: true }),
        response_format: request.response_format.as_ref(),
        seed: request.openai.seed,
        frequency_penalty: request.openai.frequency_penalty,
        presence_penalty: request.openai.presence_penalty,
        logit_bias: outgoing::LogitBias(&request.openai.logit_bias),
        reasoning_effort: request.openai.reasoning_effort.as_deref(),
        logprobs: request.openai.logprobs,
        top_logprobs: request.openai.top_logprobs,
    }
}

/// A chat completions request as it goes to a provider, serialized straight from the neutral request
/// (no JSON tree in between: this is on every routed request).
pub mod outgoing {
    use std::borrow::Cow;

    use serde::Serialize;

    #[derive(Debug, Serialize)]
    pub struct Request<'a> {
        pub model: &'a str,
        pub messages: Vec<Message<'a>>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        pub tools: Vec<Tool<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub tool_choice: Option<Choice<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub parallel_tool_calls: Option<bool>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub max_tokens: Option<u32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub max_completion_tokens: Option<u32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub temperature: Option<f64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub top_p: Option<f64>,
        #[serde(skip_serializing_if = "<[String]>::is_empty")]
        pub stop: &'a [String],
        #[serde(skip_serializing_if = "Option::is_none")]
        pub user: Option<&'a str>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        pub stream: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub stream_options: Option<StreamOptions>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub response_format: Option<&'a crate::chat::Schema>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub seed: Option<i64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub frequency_penalty: Option<f64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub presence_penalty: Option<f64>,
        #[serde(skip_serializing_if = "LogitBias::is_empty")]
        pub logit_bias: LogitBias<'a>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub reasoning_effort: Option<&'a str>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        pub logprobs: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub top_logprobs: Option<u8>,
    }

    /// `logit_bias` as OpenAI takes it: an object from token ids (as keys) to biases.
    #[derive(Debug)]
    pub struct LogitBias<'a>(pub &'a [(u64, serde_json::Number)]);

    impl LogitBias<'_> {
        fn is_empty(&self) -> bool {
            self.0.is_empty()
        }
    }

    impl Serialize for LogitBias<'_> {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut map = serializer.serialize_map(Some(self.0.len()))?;
            for (token, bias) in self.0 {
                // serde_json writes an integer map key as a quoted string.
                map.serialize_entry(token, bias)?;
            }
            map.end()
        }
    }

    #[derive(Debug, Serialize)]
    pub struct StreamOptions {
        pub include_usage: bool,
    }

    #[derive(Debug, Serialize)]
    #[serde(tag = "role", rename_all = "lowercase")]
    pub enum Message<'a> {
        System {
            content: &'a str,
        },
        User {
            content: UserContent<'a>,
        },
        Assistant {
            content: Option<Cow<'a, str>>,
            #[serde(skip_serializing_if = "Vec::is_empty")]
            tool_calls: Vec<super::RenderedToolCall<'a>>,
        },
        Tool {
            tool_call_id: &'a str,
            content: &'a str,
        },
    }

    #[derive(Debug, Serialize)]
    #[serde(untagged)]
    pub enum UserContent<'a> {
        Text(Cow<'a, str>),
        Parts(Vec<ContentPart<'a>>),
    }

    #[derive(Debug, Serialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    pub enum ContentPart<'a> {
        Text { text: &'a str },
        ImageUrl { image_url: ImageUrl<'a> },
        File { file: FileData<'a> },
    }

    /// A file's bytes as a `data:` URL (OpenAI wants a name with them).
    #[derive(Debug, Serialize)]
    pub struct FileData<'a> {
        pub filename: &'a str,
        pub file_data: String,
    }

    #[derive(Debug, Serialize)]
    pub struct ImageUrl<'a> {
        pub url: &'a str,
    }

    #[derive(Debug, Serialize)]
    pub struct Tool<'a> {
        #[serde(rename = "type")]
        pub kind: &'static str,
        pub function: ToolFunction<'a>,
    }

    #[derive(Debug, Serialize)]
    pub struct ToolFunction<'a> {
        pub name: &'a str,
        pub description: Option<&'a str>,
        pub parameters: &'a crate::chat::Schema,
    }

    #[derive(Debug, Serialize)]
    #[serde(untagged)]
    pub enum Choice<'a> {
        Mode(&'static str),
        Named {
            #[serde(rename = "type")]
            kind: &'static str,
            function: FunctionName<'a>,
        },
    }

    #[derive(Debug, Serialize)]
    pub struct FunctionName<'a> {
        pub name: &'a str,
    }
}

/// Reads a provider's `chat.completion` from its body: straight into the reply, without a JSON tree
/// (this is on every answered request). Fields of an unexpected type read as absent, as they would
/// from a tree: a text that is not a string is no text, a count that is not a whole number is 0.
pub fn parse_reply(body: &[u8]) -> Result<ChatReply, String> {
    let wire: wire::Reply<'_> = crate::typed::from_json(body).map_err(|error| error.to_string())?;
    let choice = wire.choices.unwrap_or_default().into_iter().next().ok_or("no choices in the provider's reply")?;
    let message = choice.message.ok_or("no message in the provider's reply")?;
    let mut parts = Vec::new();
    if let Some(text) = message.content.filter(|text| !text.is_empty()) {
        parts.push(Part::Text(text.into_owned()));
    }
    for call in message.tool_calls.unwrap_or_default() {
        let function = call.function.unwrap_or_default();
        parts.push(Part::ToolCall {
            id: call.id.map(Cow::into_owned).unwrap_or_default(),
            name: function.name.map(Cow::into_owned).unwrap_or_default(),
            arguments: arguments_text(function.arguments.as_ref()),
        });
    }
    let usage = wire.usage.unwrap_or_default();
    Ok(ChatReply {
        id: wire.id.map(Cow::into_owned).unwrap_or_default(),
        model: wire.model.map(Cow::into_owned).unwrap_or_default(),
        parts,
        finish: parse_finish(choice.finish_reason.as_deref().unwrap_or("stop")),
        usage: usage_with_cache(usage.prompt_tokens, usage.completion_tokens, usage.prompt_tokens_details),
        logprobs: choice.logprobs.as_ref().and_then(logprobs_of),
    })
}

/// The tokens of OpenAI's `logprobs` (`{content: [{token, logprob, bytes, top_logprobs}]}`); entries
/// without a token or a number are skipped, and no `content` array is no log probabilities.
pub fn logprobs_of(logprobs: &Value) -> Option<Vec<TokenLogprob>> {
    fn bytes(entry: &Value) -> Option<Vec<u8>> {
        entry.get("bytes")?.as_array()?.iter().map(|byte| byte.as_u64().and_then(|byte| u8::try_from(byte).ok())).collect()
    }
    fn top(entry: &Value) -> Option<TopLogprob> {
        Some(TopLogprob { token: entry.get("token")?.as_str()?.to_string(), logprob: entry.get("logprob")?.as_f64()?, bytes: bytes(entry) })
    }
    let content = logprobs.get("content")?.as_array()?;
    Some(
        content
            .iter()
            .filter_map(|entry| {
                let TopLogprob { token, logprob, bytes } = top(entry)?;
                let top_logprobs = entry
                    .get("top_logprobs")
                    .and_then(Value::as_array)
                    .map_or_else(Vec::new, |alternatives| alternatives.iter().filter_map(top).collect());
                Some(TokenLogprob { token, logprob, bytes, top_logprobs })
            })
            .collect(),
    )
}

/// Neutral usage from OpenAI's counts: the cached tokens are some of the prompt's.
fn usage_with_cache(prompt_tokens: u64, completion_tokens: u64, cached_tokens: u64) -> Usage {
    Usage { cache_read_tokens: cached_tokens.min(prompt_tokens), ..Usage::uncached(prompt_tokens, completion_tokens) }
}

/// The parts of a provider's `chat.completion` the gateway reads, borrowed from the body where no
/// escape forces a copy; every other member is skipped unread.
mod wire {
    use std::borrow::Cow;
    use std::fmt;

    use serde::Deserialize;
    use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
    use serde_json::Value;

    #[derive(Deserialize)]
    pub struct Reply<'a> {
        #[serde(default, borrow, deserialize_with = "text")]
        pub id: Option<Cow<'a, str>>,
        #[serde(default, borrow, deserialize_with = "text")]
        pub model: Option<Cow<'a, str>>,
        #[serde(default, borrow)]
        pub choices: Option<Vec<Choice<'a>>>,
        #[serde(default)]
        pub usage: Option<Usage>,
    }

    #[derive(Deserialize)]
    pub struct Choice<'a> {
        #[serde(default, borrow)]
        pub message: Option<Message<'a>>,
        #[serde(default, borrow, deserialize_with = "text")]
        pub finish_reason: Option<Cow<'a, str>>,
        /// Only there when the client asked for them: read as a tree then.
        #[serde(default)]
        pub logprobs: Option<Value>,
    }

    #[derive(Deserialize)]
    pub struct Message<'a> {
        #[serde(default, borrow, deserialize_with = "text")]
        pub content: Option<Cow<'a, str>>,
        #[serde(default, borrow)]
        pub tool_calls: Option<Vec<ToolCall<'a>>>,
    }

    #[derive(Deserialize)]
    pub struct ToolCall<'a> {
        #[serde(default, borrow, deserialize_with = "text")]
        pub id: Option<Cow<'a, str>>,
        #[serde(default, borrow)]
        pub function: Option<Function<'a>>,
    }

    #[derive(Deserialize, Default)]
    pub struct Function<'a> {
        #[serde(default, borrow, deserialize_with = "text")]
        pub name: Option<Cow<'a, str>>,
        /// JSON text as OpenAI sends it, or (from some compatible providers) the object itself.
        #[serde(default)]
        pub arguments: Option<Value>,
    }

    #[derive(Deserialize, Default)]
    pub struct Usage {
        #[serde(default, deserialize_with = "count")]
        pub prompt_tokens: u64,
        #[serde(default, deserialize_with = "count")]
        pub completion_tokens: u64,
        /// Its `cached_tokens`; 0 when it is not an object with a whole number there.
        #[serde(default, deserialize_with = "cached_tokens")]
        pub prompt_tokens_details: u64,
    }

    #[derive(Deserialize)]
    struct PromptDetails {
        #[serde(default, deserialize_with = "count")]
        cached_tokens: u64,
    }

    fn cached_tokens<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
        Ok(deserializer.deserialize_any(Lenient::<PromptDetails>::default())?.map_or(0, |details| details.cached_tokens))
    }

    /// A string, borrowed when it has no escapes; any other value reads as absent.
    fn text<'de: 'a, 'a, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Cow<'a, str>>, D::Error> {
        deserializer.deserialize_any(Lenient::<Cow<'a, str>>::default())
    }

    /// A whole non-negative number; any other value reads as 0.
    fn count<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
        Ok(deserializer.deserialize_any(Lenient::<u64>::default())?.unwrap_or(0))
    }

    /// Takes the value of type `T` when it is one, skips anything else.
    struct Lenient<T>(std::marker::PhantomData<T>);

    impl<T> Default for Lenient<T> {
        fn default() -> Self {
            Lenient(std::marker::PhantomData)
        }
    }

    /// What a lenient visitor keeps: borrowed or owned text, whole numbers, or objects.
    trait Kept<'de>: Sized {
        fn borrowed(_text: &'de str) -> Option<Self> {
            None
        }
        fn text(_text: &str) -> Option<Self> {
            None
        }
        fn unsigned(_number: u64) -> Option<Self> {
            None
        }
        fn object<A: MapAccess<'de>>(mut members: A) -> Result<Option<Self>, A::Error> {
            while members.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(None)
        }
    }

    impl<'de: 'a, 'a> Kept<'de> for Cow<'a, str> {
        fn borrowed(text: &'de str) -> Option<Self> {
            Some(Cow::Borrowed(text))
        }
        fn text(text: &str) -> Option<Self> {
            Some(Cow::Owned(text.to_string()))
        }
    }

    impl Kept<'_> for u64 {
        fn unsigned(number: u64) -> Option<Self> {
            Some(number)
        }
    }

    impl<'de> Kept<'de> for PromptDetails {
        fn object<A: MapAccess<'de>>(members: A) -> Result<Option<Self>, A::Error> {
            PromptDetails::deserialize(de::value::MapAccessDeserializer::new(members)).map(Some)
        }
    }

    impl<'de, T: Kept<'de>> Visitor<'de> for Lenient<T> {
        type Value = Option<T>;

        fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
            formatter.write_str("any JSON value")
        }
        fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<Self::Value, E> {
            Ok(T::borrowed(text))
        }
        fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
            Ok(T::text(text))
        }
        fn visit_u64<E: de::Error>(self, number: u64) -> Result<Self::Value, E> {
            Ok(T::unsigned(number))
        }
        fn visit_i64<E: de::Error>(self, number: i64) -> Result<Self::Value, E> {
            Ok(u64::try_from(number).ok().and_then(T::unsigned))
        }
        fn visit_f64<E: de::Error>(self, _number: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_bool<E: de::Error>(self, _value: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Self::Value, A::Error> {
            while items.next_element::<IgnoredAny>()?.is_some() {}
            Ok(None)
        }
        fn visit_map<A: MapAccess<'de>>(self, members: A) -> Result<Self::Value, A::Error> {
            T::object(members)
        }
    }
}

fn usage_of(usage: Option<&Value>) -> Usage {
    let count = |pointer: &str| usage.and_then(|usage| usage.pointer(pointer)).and_then(Value::as_u64).unwrap_or(0);
    usage_with_cache(count("/prompt_tokens"), count("/completion_tokens"), count("/prompt_tokens_details/cached_tokens"))
}

/// Turns a provider's SSE `data:` payloads into neutral events.
#[derive(Debug, Default)]
pub struct StreamReader;

impl StreamReader {
    /// The events of one `data:` payload (`[DONE]` yields none).
    pub fn read(&mut self, data: &str) -> Result<Vec<ChatEvent>, String> {
        if data.trim() == "[DONE]" {
            return Ok(Vec::new());
        }
        // A chunk of the expected shape is read into borrowed typed parts; anything else (an error,
        // a member of another type) goes through the `Value` reading below, which decides.
        if let Ok(chunk) = serde_json::from_str::<incoming::Chunk<'_>>(data)
            && !chunk.error
        {
            return Ok(chunk.events());
        }
        let chunk: Value = serde_json::from_str(data).map_err(|error| format!("undecodable stream chunk: {error}"))?;
        read_value(&chunk)
    }
}

/// The events of a stream chunk read as a `Value` (any shape).
fn read_value(chunk: &Value) -> Result<Vec<ChatEvent>, String> {
    if let Some(error) = chunk.get("error") {
        return Err(format!("provider stream error: {error}"));
    }
    let mut events = Vec::new();
    if let Some(choice) = chunk.pointer("/choices/0") {
        let delta = choice.get("delta").unwrap_or(&Value::Null);
        if let Some(tokens) = choice.get("logprobs").and_then(logprobs_of) {
            events.push(ChatEvent::Logprobs(tokens));
        }
        if let Some(text) = delta.get("content").and_then(Value::as_str).filter(|text| !text.is_empty()) {
            events.push(ChatEvent::TextDelta(text.to_string()));
        }
        for call in delta.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
            let index = call.get("index").and_then(Value::as_u64).and_then(|index| usize::try_from(index).ok()).unwrap_or(0);
            let name = call.pointer("/function/name").and_then(Value::as_str);
            if let Some(name) = name.filter(|name| !name.is_empty()) {
                let id = call.get("id").and_then(Value::as_str).unwrap_or_default().to_string();
                events.push(ChatEvent::ToolCallStart { index, id, name: name.to_string() });
            }
            if let Some(arguments) = call.pointer("/function/arguments").and_then(Value::as_str).filter(|arguments| !arguments.is_empty()) {
                events.push(ChatEvent::ToolCallDelta { index, arguments: arguments.to_string() });
            }
        }
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            events.push(ChatEvent::Finish(parse_finish(reason)));
        }
    }
    if chunk.get("usage").is_some_and(Value::is_object) {
        events.push(ChatEvent::Usage(usage_of(chunk.get("usage"))));
    }
    Ok(events)
}

/// A provider's stream chunk of the expected shape, borrowing its strings: the events read from it
/// are the ones `StreamReader::read` reads from the same chunk as a `Value`.
mod incoming {
    use std::borrow::Cow;

    use serde::Deserialize;

    use crate::chat::ChatEvent;

    #[derive(Deserialize)]
    pub(super) struct Chunk<'a> {
        #[serde(borrow, default)]
        choices: Option<Vec<Choice<'a>>>,
        /// Whether the chunk has an `error` member, whatever its value (`null` included).
        #[serde(default, deserialize_with = "crate::chat::presence::flag")]
        pub error: bool,
        #[serde(default)]
        usage: Option<ChunkUsage>,
    }

    #[derive(Deserialize)]
    struct Choice<'a> {
        #[serde(borrow, default)]
        delta: Option<Delta<'a>>,
        #[serde(borrow, default)]
        finish_reason: Option<Cow<'a, str>>,
        /// Only there when the client asked for them: read as a tree then.
        #[serde(default)]
        logprobs: Option<serde_json::Value>,
    }

    #[derive(Deserialize)]
    struct Delta<'a> {
        #[serde(borrow, default)]
        content: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        tool_calls: Option<Vec<ToolCall<'a>>>,
    }

    #[derive(Deserialize)]
    struct ToolCall<'a> {
        #[serde(default)]
        index: Option<u64>,
        #[serde(borrow, default)]
        id: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        function: Option<Function<'a>>,
    }

    #[derive(Deserialize)]
    struct Function<'a> {
        #[serde(borrow, default)]
        name: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        arguments: Option<Cow<'a, str>>,
    }

    #[derive(Deserialize)]
    struct ChunkUsage {
        #[serde(default)]
        prompt_tokens: Option<u64>,
        #[serde(default)]
        completion_tokens: Option<u64>,
        #[serde(default)]
        prompt_tokens_details: Option<ChunkPromptDetails>,
    }

    #[derive(Deserialize)]
    struct ChunkPromptDetails {
        #[serde(default)]
        cached_tokens: Option<u64>,
    }

    impl Chunk<'_> {
        pub(super) fn events(self) -> Vec<ChatEvent> {
            let mut events = Vec::new();
            if let Some(choice) = self.choices.and_then(|choices| choices.into_iter().next()) {
                if let Some(tokens) = choice.logprobs.as_ref().and_then(super::logprobs_of) {
                    events.push(ChatEvent::Logprobs(tokens));
                }
                let delta = choice.delta.unwrap_or(Delta { content: None, tool_calls: None });
                if let Some(text) = delta.content.filter(|text| !text.is_empty()) {
                    events.push(ChatEvent::TextDelta(text.into_owned()));
                }
                for call in delta.tool_calls.into_iter().flatten() {
                    let index = call.index.and_then(|index| usize::try_from(index).ok()).unwrap_or(0);
                    let function = call.function.unwrap_or(Function { name: None, arguments: None });
                    if let Some(name) = function.name.filter(|name| !name.is_empty()) {
                        let id = call.id.map(Cow::into_owned).unwrap_or_default();
                        events.push(ChatEvent::ToolCallStart { index, id, name: name.into_owned() });
                    }
                    if let Some(arguments) = function.arguments.filter(|arguments| !arguments.is_empty()) {
                        events.push(ChatEvent::ToolCallDelta { index, arguments: arguments.into_owned() });
                    }
                }
                if let Some(reason) = choice.finish_reason {
                    events.push(ChatEvent::Finish(super::parse_finish(&reason)));
                }
            }
            if let Some(usage) = self.usage {
                events.push(ChatEvent::Usage(super::usage_with_cache(
                    usage.prompt_tokens.unwrap_or(0),
                    usage.completion_tokens.unwrap_or(0),
                    usage.prompt_tokens_details.and_then(|details| details.cached_tokens).unwrap_or(0),
                )));
            }
            events
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::chat::{ReplyAssembler, reply_events};

    /// A chunk as the writer built it before it serialized typed parts: a `Value` tree.
    fn value_chunk(delta: Value, finish: Value) -> String {
        let chunk = json!({
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "openai/gpt-4o-mini",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}],
        });
        format!("data: {chunk}\n\n")
    }

    #[test]
    fn typed_stream_chunks_read_as_their_value_trees_do() -> Result<(), serde_json::Error> {
        let chunks = [
            r#"{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
            r#"{"choices":[{"delta":{"content":"h\u00e9llo \"x\""},"finish_reason":null}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"id":"call_1","type":"function","function":{"name":"lookup","arguments":""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"q\":1}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"function":{"name":"","arguments":"x"}}]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}],"usage":null}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":2000,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":1536,"audio_tokens":0}}}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":10,"prompt_tokens_details":null}}"#,
            r#"{"choices":[{"delta":null,"finish_reason":"length"}],"usage":{"prompt_tokens":3}}"#,
            r#"{"choices":null}"#,
            r#"{}"#,
        ];
        for data in chunks {
            let typed: incoming::Chunk<'_> = serde_json::from_str(data)?;
            assert!(!typed.error, "{data}");
            assert_eq!(Ok(typed.events()), read_value(&serde_json::from_str(data)?), "{data}");
        }
        // Chunks the typed reading does not take read as their `Value`s do: an error member (even
        // null), members of other types, a negative index.
        for data in [
            r#"{"error":{"message":"overloaded"}}"#,
            r#"{"error":null,"choices":[]}"#,
            r#"{"choices":[{"delta":{"content":7}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":-1,"function":{"name":"f"}}]}}]}"#,
            r#"{"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":1.5}}"#,
            r#"{"choices":[{"delta":{"content":"a"}},{"delta":"b"}]}"#,
        ] {
            let typed = serde_json::from_str::<incoming::Chunk<'_>>(data);
            assert!(typed.map_or(true, |chunk| chunk.error), "{data}");
            assert_eq!(StreamReader.read(data), read_value(&serde_json::from_str(data)?), "{data}");
        }
        assert_eq!(StreamReader.read(r#"{"error":null}"#), Err("provider stream error: null".to_string()));
        assert_eq!(StreamReader.read(r#"{"choices":[{"delta":{"content":7}}]}"#), Ok(Vec::new()));
        Ok(())
    }

    #[test]
    fn stream_frames_read_byte_for_byte_as_the_value_built_ones() {
        let mut writer = StreamWriter::new("chatcmpl-1".to_string(), "openai/gpt-4o-mini".to_string(), 1_700_000_000, true);
        let text = "h\u{e9}llo \"quoted\" \\ \n\t\u{1}";
        let events = [
            ChatEvent::TextDelta(text.to_string()),
            ChatEvent::ToolCallStart { index: 1, id: "call_1".to_string(), name: "lookup".to_string() },
            ChatEvent::ToolCallDelta { index: 1, arguments: "{\"q\":\"TCK-42\"}".to_string() },
            ChatEvent::Finish(FinishReason::ToolCalls),
            ChatEvent::Usage(Usage::uncached(10, 5)),
        ];
        let mut frames: Vec<String> = events.iter().flat_map(|event| writer.write(event)).collect();
        frames.extend(writer.end());
        let usage = json!({
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "openai/gpt-4o-mini",
            "choices": [],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        });
        let expected = vec![
            value_chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            value_chunk(json!({"content": text}), Value::Null),
            value_chunk(
                json!({"tool_calls": [{"index": 1, "id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": ""}}]}),
                Value::Null,
            ),
            value_chunk(json!({"tool_calls": [{"index": 1, "function": {"arguments": "{\"q\":\"TCK-42\"}"}}]}), Value::Null),
            value_chunk(json!({}), json!("tool_calls")),
            format!("data: {usage}\n\n"),
            "data: [DONE]\n\n".to_string(),
        ];
        assert_eq!(frames, expected);
    }

    #[test]
    fn text_frames_are_the_chunks_serde_writes() {
        for (id, model) in [("chatcmpl-1", "openai/gpt-4o-mini"), ("chatcmpl-\"quoted\"\\", "m\u{e9}\n/\u{1f600}")] {
            let writer = StreamWriter::new(id.to_string(), model.to_string(), -3, false);
            // The tail was cut from a real frame: text frames take the short path.
            assert!(!writer.text_tail.is_empty());
            for text in ["", "hello", "h\u{e9}llo \"quoted\" \\ \n\t\u{1}\u{7f}", "\u{2028}\u{1f600}</script>"] {
                let general = writer.chunk(chunk::Delta { content: Some(text), ..chunk::Delta::default() }, None);
                assert_eq!(writer.text_frame(text), general, "{text:?}");
            }
        }
    }

    /// Log probabilities: read from a provider's reply and stream chunks (typed and tree readings
    /// alike), written back to the client whole or on the text delta they belong to.
    #[test]
    fn log_probabilities_are_read_and_written_back() -> Result<(), String> {
        let entry = json!({"token": " hi", "logprob": -0.25, "bytes": [32, 104, 105],
                           "top_logprobs": [{"token": " hi", "logprob": -0.25, "bytes": [32, 104, 105]}, {"token": " yo", "logprob": -1.5, "bytes": null}]});
        let tokens = vec![TokenLogprob {
            token: " hi".to_string(),
            logprob: -0.25,
            bytes: Some(vec![32, 104, 105]),
            top_logprobs: vec![
                TopLogprob { token: " hi".to_string(), logprob: -0.25, bytes: Some(vec![32, 104, 105]) },
                TopLogprob { token: " yo".to_string(), logprob: -1.5, bytes: None },
            ],
        }];
        let body = json!({"choices": [{"message": {"role": "assistant", "content": " hi"}, "finish_reason": "stop",
                                       "logprobs": {"content": [entry], "refusal": null}}]});
        let reply = parse_reply(body.to_string().as_bytes())?;
        assert_eq!(reply.logprobs.as_ref(), Some(&tokens));
        assert_eq!(parse_reply(br#"{"choices": [{"message": {"content": "x"}, "logprobs": null}]}"#)?.logprobs, None);
        let rendered = serde_json::to_value(render_reply(&reply, 0, None)).unwrap_or_default();
        assert_eq!(rendered["choices"][0]["logprobs"], json!({"content": [entry], "refusal": null}));

        // A chunk's log probabilities come before its text, in both readings, and go out with it.
        let chunk =
            json!({"choices": [{"index": 0, "delta": {"content": " hi"}, "logprobs": {"content": [entry]}, "finish_reason": null}]});
        let expected = vec![ChatEvent::Logprobs(tokens.clone()), ChatEvent::TextDelta(" hi".to_string())];
        assert_eq!(StreamReader.read(&chunk.to_string())?, expected);
        assert_eq!(read_value(&chunk)?, expected);
        let mut writer = StreamWriter::new("c".to_string(), "m".to_string(), 0, false);
        let frames: String = expected.iter().flat_map(|event| writer.write(event)).collect();
        let text_frame = frames.split("\n\n").find(|frame| frame.contains("\" hi\"")).unwrap_or_default();
        let text_chunk: Value = serde_json::from_str(text_frame.trim_start_matches("data: ")).map_err(|error| error.to_string())?;
        assert_eq!(text_chunk["choices"][0]["logprobs"], json!({"content": [entry], "refusal": null}));
        // Without any, frames carry `logprobs: null` as before.
        let plain = writer.write(&ChatEvent::TextDelta("!".to_string())).concat();
        assert!(plain.contains(r#""logprobs":null"#), "{plain}");
        Ok(())
    }

    #[test]
    fn files_are_read_as_documents_and_written_for_every_format() -> Result<(), InvalidRequest> {
        let request = parse_request(&json!({"model": "m", "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "summarize"},
                {"type": "file", "file": {"filename": "report.pdf", "file_data": "data:application/pdf;base64,JVBERi0="}},
                {"type": "file", "file": {"file_data": "data:application/pdf;base64,AAAA"}}]},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot read that"}]}]}))?;
        let pdf = |data: &str| DocumentSource::Base64 { media_type: "application/pdf".to_string(), data: data.to_string() };
        assert_eq!(
            request.messages[0].parts,
            vec![
                Part::Text("summarize".to_string()),
                Part::Document { source: pdf("JVBERi0="), name: Some("report.pdf".to_string()) },
                Part::Document { source: pdf("AAAA"), name: None },
            ]
        );
        assert_eq!(request.messages[1].parts, vec![Part::Text("I cannot read that".to_string())]);
        let built = serde_json::to_value(build_request(&request, "gpt", TokenLimit::MaxTokens)).unwrap_or_default();
        assert_eq!(
            built["messages"][0]["content"],
            json!([
                {"type": "text", "text": "summarize"},
                {"type": "file", "file": {"filename": "report.pdf", "file_data": "data:application/pdf;base64,JVBERi0="}},
                {"type": "file", "file": {"filename": "document.pdf", "file_data": "data:application/pdf;base64,AAAA"}},
            ])
        );
        let gemini = crate::gemini::build_request(&request);
        assert_eq!(gemini["contents"][0]["parts"][1], json!({"inlineData": {"mimeType": "application/pdf", "data": "JVBERi0="}}));
        // Plain text goes as text where the format has no text documents; URLs where it fetches them.
        let mut more = request.clone();
        more.messages[0].parts = vec![
            Part::Document { source: DocumentSource::Text("notes".to_string()), name: None },
            Part::Document { source: DocumentSource::Url("https://example.com/a.pdf".to_string()), name: None },
        ];
        let built = serde_json::to_value(build_request(&more, "gpt", TokenLimit::MaxTokens)).unwrap_or_default();
        assert_eq!(built["messages"][0]["content"], json!([{"type": "text", "text": "notes"}]));
        assert_eq!(
            crate::gemini::build_request(&more)["contents"][0]["parts"],
            json!([{"text": "notes"}, {"fileData": {"mimeType": "application/pdf", "fileUri": "https://example.com/a.pdf"}}])
        );
        // Refused, not dropped.
        let code = |part: Value| {
            parse_request(&json!({"model": "m", "messages": [{"role": "user", "content": [part]}]})).err().map(|error| error.code)
        };
        assert_eq!(code(json!({"type": "file", "file": {"file_id": "file-abc"}})), Some("unsupported_content"));
        assert_eq!(code(json!({"type": "file", "file": {"file_data": "JVBERi0="}})), Some("invalid_request"));
        assert_eq!(code(json!({"type": "file", "file": {"filename": "a.pdf"}})), Some("missing_field"));
        assert_eq!(code(json!({"type": "file"})), Some("missing_field"));
        assert_eq!(code(json!({"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}})), Some("unsupported_content"));
        Ok(())
    }

    #[test]
    fn client_bodies_are_validated() {
        let code = |body: Value| parse_request(&body).err().map(|error| error.code);
        assert_eq!(code(json!({"messages": [{"role": "user", "content": "hi"}]})), Some("missing_field"));
        assert_eq!(code(json!({"model": "m"})), Some("missing_field"));
        assert!(parse_request(&json!({"model": "m", "messages": []})).is_err());
        assert!(parse_request(&json!({"model": "m", "messages": [{"role": "wizard", "content": "x"}]})).is_err());
        assert!(parse_request(&json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 3})).is_err());
        assert!(parse_request(&json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0})).is_err());
    }

    #[test]
    fn tool_conversations_survive_parse_and_build() -> Result<(), InvalidRequest> {
        let body = json!({
            "model": "gpt-4o",
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": [{"type": "text", "text": "weather?"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "rainy"}
            ],
            "tools": [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "weather"}},
            "stream": true
        });
        let request = parse_request(&body)?;
        assert_eq!(request.tool_choice, Some(ToolChoice::Named("weather".to_string())));
        let built = serde_json::to_value(build_request(&request, "gpt-4o", TokenLimit::MaxTokens)).unwrap_or_default();
        assert_eq!(built["messages"][0], json!({"role": "system", "content": "sys"}));
        assert_eq!(built["messages"][2]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Oslo\"}");
        assert_eq!(built["messages"][3], json!({"role": "tool", "tool_call_id": "call_1", "content": "rainy"}));
        assert_eq!(built["stream_options"], json!({"include_usage": true}));
        assert_eq!(parse_request(&built)?.messages, request.messages);
        Ok(())
    }

    #[test]
    fn upstream_requests_serialize_exactly() {
        let request = ChatRequest {
            model: "openai/gpt-4o-mini".to_string(),
            system: Some("be brief".to_string()),
            messages: vec![
                Message { role: Role::User, parts: vec![Part::Text("one".to_string()), Part::Text("two".to_string())] },
                Message { role: Role::Assistant, parts: vec![Part::Text("sure".to_string())] },
                Message { role: Role::User, parts: vec![Part::Text("again".to_string())] },
            ],
            tools: vec![Tool { name: "f".to_string(), description: None, parameters: json!({"type": "object"}).into() }],
            tool_choice: Some(ToolChoice::Required),
            max_tokens: Some(16),
            temperature: Some(0.5),
            stop: vec!["END".to_string()],
            user: Some("u-1".to_string()),
            response_format: Some(
                crate::chat::Schema::from_text(r#"{"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}}"#)
                    .unwrap(),
            ),
            parallel_tool_calls: Some(false),
            openai: OpenAiOptions {
                seed: Some(-7),
                frequency_penalty: Some(0.5),
                presence_penalty: Some(-1.5),
                logit_bias: vec![(50256, (-100).into()), (100_000, serde_json::Number::from_f64(2.5).unwrap())],
                reasoning_effort: Some("low".to_string()),
                logprobs: true,
                top_logprobs: Some(2),
            },
            ..ChatRequest::default()
        };
        let built = serde_json::to_value(build_request(&request, "gpt-4o-mini", TokenLimit::MaxTokens)).unwrap_or_default();
        assert_eq!(
            built,
            json!({
                "model": "gpt-4o-mini",
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "one\ntwo"},
                    {"role": "assistant", "content": "sure"},
                    {"role": "user", "content": "again"}
                ],
                "tools": [{"type": "function", "function": {"name": "f", "description": null, "parameters": {"type": "object"}}}],
                "tool_choice": "required",
                "parallel_tool_calls": false,
                "max_tokens": 16,
                "temperature": 0.5,
                "stop": ["END"],
                "user": "u-1",
                "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}},
                "seed": -7,
                "frequency_penalty": 0.5,
                "presence_penalty": -1.5,
                "logit_bias": {"50256": -100, "100000": 2.5},
                "reasoning_effort": "low",
                "logprobs": true,
                "top_logprobs": 2
            })
        );
        // OpenAI's own API takes the limit under its current name.
        let built = serde_json::to_value(build_request(&request, "gpt-4o-mini", TokenLimit::MaxCompletionTokens)).unwrap_or_default();
        assert_eq!((built.get("max_tokens"), &built["max_completion_tokens"]), (None, &json!(16)));
        let minimal = ChatRequest {
            tools: Vec::new(),
            tool_choice: None,
            stop: Vec::new(),
            user: None,
            temperature: None,
            response_format: None,
            openai: OpenAiOptions::default(),
            ..request
        };
        // `parallel_tool_calls` goes only with tools (OpenAI refuses it alone).
        let built = serde_json::to_value(build_request(&minimal, "m", TokenLimit::MaxTokens)).unwrap_or_default();
        let keys: Vec<&String> = built.as_object().map(|object| object.keys().collect()).unwrap_or_default();
        assert_eq!(keys, ["max_tokens", "messages", "model"], "nothing unset is sent");
    }

    #[test]
    fn anthropic_breakpoints_in_openai_bodies_reach_anthropic() -> Result<(), InvalidRequest> {
        let ephemeral = json!({"type": "ephemeral"});
        let request = parse_request(&json!({"model": "anthropic/claude-haiku-4-5",
        "tools": [{"type": "function", "function": {"name": "f"}, "cache_control": ephemeral}],
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "rules", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b", "cache_control": ephemeral}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "done", "cache_control": ephemeral}]}
        ]}))?;
        assert_eq!(
            request.cache_points,
            vec![
                CachePoint { at: CacheAt::Part { message: 0, part: 1 }, ttl: None },
                CachePoint { at: CacheAt::Part { message: 2, part: 0 }, ttl: None },
                CachePoint { at: CacheAt::System, ttl: Some(CacheTtl::OneHour) },
                CachePoint { at: CacheAt::Tool(0), ttl: None },
            ]
        );
        let built = serde_json::to_value(crate::anthropic::build_request(&request, "claude-haiku-4-5", 64)).unwrap_or_default();
        assert_eq!(built["system"][0]["cache_control"], json!({"type": "ephemeral", "ttl": "1h"}));
        assert_eq!(built["messages"][0]["content"][1]["cache_control"], ephemeral);
        assert_eq!(built["messages"][2]["content"][0]["cache_control"], ephemeral, "{built}");
        assert_eq!(built["tools"][0]["cache_control"], ephemeral);
        // OpenAI's own body has no such member.
        let openai = serde_json::to_value(build_request(&request, "gpt-4o", TokenLimit::MaxTokens)).unwrap_or_default();
        assert!(!openai.to_string().contains("cache_control"), "{openai}");
        let refused = parse_request(
            &json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a", "cache_control": true}]}]}),
        );
        assert!(refused.is_err_and(|error| error.message.contains("cache_control")));
        Ok(())
    }

    #[test]
    fn openai_options_are_read_and_checked() -> Result<(), InvalidRequest> {
        let body = |options: Value| {
            let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
            if let (Some(body), Some(options)) = (body.as_object_mut(), options.as_object()) {
                body.extend(options.clone());
            }
            body
        };
        let request = parse_request(&body(json!({"n": 1, "seed": 42, "frequency_penalty": -2, "presence_penalty": 1.5,
            "logit_bias": {"9": 1, "10": -100, "1": 100}, "parallel_tool_calls": false, "reasoning_effort": "high",
            "logprobs": true, "top_logprobs": 3})))?;
        assert_eq!(
            request.openai,
            OpenAiOptions {
                seed: Some(42),
                frequency_penalty: Some(-2.0),
                presence_penalty: Some(1.5),
                logit_bias: vec![(1, 100.into()), (9, 1.into()), (10, (-100).into())],
                reasoning_effort: Some("high".to_string()),
                logprobs: true,
                top_logprobs: Some(3),
            }
        );
        assert_eq!(request.parallel_tool_calls, Some(false));
        let nulls = json!({"n": null, "seed": null, "frequency_penalty": null, "logit_bias": null, "parallel_tool_calls": null,
            "reasoning_effort": null});
        let request = parse_request(&body(nulls))?;
        assert_eq!((request.openai, request.parallel_tool_calls), (OpenAiOptions::default(), None));
        for (options, message) in [
            (json!({"n": 2}), "n greater than 1 is not supported: send one request per answer"),
            (json!({"n": 0}), "n must be a positive integer"),
            (json!({"n": "2"}), "n must be a positive integer"),
            (json!({"seed": 1.5}), "seed must be an integer"),
            (json!({"seed": u64::MAX}), "seed must be an integer"),
            (json!({"presence_penalty": 2.5}), "presence_penalty must be a number between -2 and 2"),
            (json!({"frequency_penalty": "high"}), "frequency_penalty must be a number between -2 and 2"),
            (json!({"logit_bias": [1]}), "logit_bias must be an object of token ids to numbers"),
            (json!({"logit_bias": {"hello": 1}}), "logit_bias maps token ids to numbers between -100 and 100; `hello` does not"),
            (json!({"logit_bias": {"+5": 1}}), "logit_bias maps token ids to numbers between -100 and 100; `+5` does not"),
            (json!({"logit_bias": {"5": 101}}), "logit_bias maps token ids to numbers between -100 and 100; `5` does not"),
            (json!({"parallel_tool_calls": "no"}), "parallel_tool_calls must be a boolean"),
            (json!({"reasoning_effort": 3}), "reasoning_effort must be a string"),
            (json!({"logprobs": "yes"}), "logprobs must be a boolean"),
            (json!({"logprobs": true, "top_logprobs": 21}), "top_logprobs must be an integer from 0 to 20"),
            (json!({"top_logprobs": 2}), "top_logprobs needs logprobs set to true"),
            (json!({"logprobs": false, "top_logprobs": 2}), "top_logprobs needs logprobs set to true"),
        ] {
            assert_eq!(parse_request(&body(options.clone())).err().map(|error| error.message), Some(message.to_string()), "{options}");
        }
        Ok(())
    }

    #[test]
    fn streams_translate_both_ways() -> Result<(), String> {
        let reply = ChatReply {
            id: "chatcmpl-1".to_string(),
            model: "m".to_string(),
            parts: vec![
                Part::Text("hi there".to_string()),
                Part::ToolCall { id: "call_9".to_string(), name: "f".to_string(), arguments: "{\"a\":1}".to_string() },
            ],
            finish: FinishReason::ToolCalls,
            usage: Usage::uncached(4, 6),
            logprobs: None,
        };
        let mut writer = StreamWriter::new(reply.id.clone(), reply.model.clone(), 0, true);
        let mut frames: Vec<String> = reply_events(&reply).iter().flat_map(|event| writer.write(event)).collect();
        frames.extend(writer.end());
        assert_eq!(frames.last().map(String::as_str), Some("data: [DONE]\n\n"));
        let mut reader = StreamReader;
        let mut assembler = ReplyAssembler::default();
        for frame in &frames {
            for event in reader.read(frame.trim_start_matches("data: ").trim())? {
                assembler.push(&event);
            }
        }
        assert_eq!(assembler.into_reply(reply.id.clone(), reply.model.clone()), reply);
        Ok(())
    }

    #[test]
    fn replies_render_with_tool_calls_and_extras() {
        let reply = ChatReply {
            id: "x".to_string(),
            model: "openai/gpt-4o".to_string(),
            parts: vec![Part::ToolCall { id: "call_1".to_string(), name: "f".to_string(), arguments: "{}".to_string() }],
            finish: FinishReason::ToolCalls,
            usage: Usage::uncached(1, 2),
            logprobs: None,
        };
        let cost = json!(0.5);
        let rendered = serde_json::to_value(render_reply(&reply, 7, Some(UsageExtra { cost_usd: &cost, routing_strategy: "price" })))
            .unwrap_or_default();
        assert_eq!(rendered["object"], "chat.completion");
        assert_eq!(rendered["choices"][0]["message"]["role"], "assistant");
        assert_eq!(rendered["choices"][0]["message"]["content"], Value::Null);
        assert_eq!(rendered["choices"][0]["message"]["tool_calls"][0]["type"], "function");
        assert_eq!(rendered["choices"][0]["logprobs"], Value::Null);
        assert_eq!(rendered["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(rendered["usage"]["total_tokens"], 3);
        assert_eq!(rendered["usage"]["cost_usd"], 0.5);
        assert_eq!(rendered["usage"]["routing_strategy"], "price");
        let body = serde_json::to_vec(&rendered).unwrap_or_default();
        assert_eq!(parse_reply(&body).map(|parsed| parsed.parts), Ok(reply.parts));
    }

    #[test]
    fn provider_replies_are_read_leniently_without_a_tree() {
        let body = br#"{"id":"chatcmpl-9","object":"chat.completion","model":"gpt-4o-mini","system_fingerprint":null,
            "choices":[{"index":0,"logprobs":null,"finish_reason":"tool_calls","message":{"role":"assistant","content":"line\nbreak \u00e9",
              "refusal":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"lookup","arguments":"{\"q\":1}"}},
                {"id":"call_2","type":"function","function":{"name":"other","arguments":{"q":2}}}]}},
              {"index":1,"message":{"role":"assistant","content":"second choice is ignored"}}],
            "usage":{"prompt_tokens":12,"completion_tokens":3.5,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":0}}}"#;
        let reply = parse_reply(body).unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(reply.id, "chatcmpl-9");
        assert_eq!(reply.model, "gpt-4o-mini");
        assert_eq!(reply.finish, FinishReason::ToolCalls);
        assert_eq!(reply.usage, Usage::uncached(12, 0), "a count that is not a whole number reads as 0");
        assert_eq!(
            reply.parts,
            vec![
                Part::Text("line\nbreak \u{e9}".to_string()),
                Part::ToolCall { id: "call_1".to_string(), name: "lookup".to_string(), arguments: r#"{"q":1}"#.to_string() },
                Part::ToolCall { id: "call_2".to_string(), name: "other".to_string(), arguments: r#"{"q":2}"#.to_string() },
            ]
        );
        // Values of an unexpected type read as absent; a missing usage is zero.
        let odd = br#"{"id":7,"model":["m"],"choices":[{"message":{"content":{"type":"text"},"tool_calls":null},"finish_reason":null}]}"#;
        let reply = parse_reply(odd).unwrap_or_else(|error| panic!("{error}"));
        assert_eq!((reply.id.as_str(), reply.model.as_str(), reply.parts.len()), ("", "", 0));
        assert_eq!((reply.finish, reply.usage), (FinishReason::Stop, Usage::default()));
        assert_eq!(parse_reply(br#"{"choices":[]}"#).err().as_deref(), Some("no choices in the provider's reply"));
        assert_eq!(parse_reply(br#"{"choices":[{}]}"#).err().as_deref(), Some("no message in the provider's reply"));
        assert!(parse_reply(b"not json").is_err());
    }

    #[test]
    fn cached_prompt_tokens_are_read_and_written_within_the_prompt_tokens() -> Result<(), String> {
        let reply = |details: &str| {
            let body = format!(
                r#"{{"choices":[{{"message":{{"content":"hi"}}}}],"usage":{{"prompt_tokens":2000,"completion_tokens":5,"prompt_tokens_details":{details}}}}}"#
            );
            parse_reply(body.as_bytes()).map(|reply| reply.usage)
        };
        let cached = Usage { cache_read_tokens: 1536, ..Usage::uncached(2000, 5) };
        assert_eq!(reply(r#"{"cached_tokens":1536,"audio_tokens":0}"#)?, cached);
        // Details of an unexpected shape read as none; more cached than sent is capped.
        for odd in ["null", "5", "[1536]", r#"{"cached_tokens":"1536"}"#, r#"{"cached_tokens":-1}"#] {
            assert_eq!(reply(odd)?, Usage::uncached(2000, 5), "{odd}");
        }
        assert_eq!(reply(r#"{"cached_tokens":9999}"#)?.cache_read_tokens, 2000);
        // A client sees them as OpenAI shows them, in replies and in a stream's usage chunk.
        let answer = ChatReply {
            id: "x".to_string(),
            model: "m".to_string(),
            parts: vec![],
            finish: FinishReason::Stop,
            usage: cached,
            logprobs: None,
        };
        let rendered = serde_json::to_value(render_reply(&answer, 0, None)).unwrap_or_default();
        assert_eq!(
            rendered["usage"],
            json!({"prompt_tokens": 2000, "completion_tokens": 5, "total_tokens": 2005, "prompt_tokens_details": {"cached_tokens": 1536}})
        );
        let mut writer = StreamWriter::new("x".to_string(), "m".to_string(), 0, true);
        writer.write(&ChatEvent::Usage(cached));
        let frames = writer.end().concat();
        assert!(
            frames.contains(
                r#""usage":{"completion_tokens":5,"prompt_tokens":2000,"prompt_tokens_details":{"cached_tokens":1536},"total_tokens":2005}"#
            ),
            "{frames}"
        );
        assert_eq!(
            StreamReader.read(
                r#"{"choices":[],"usage":{"prompt_tokens":2000,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":1536}}}"#
            )?,
            vec![ChatEvent::Usage(cached)]
        );
        let plain = serde_json::to_value(render_reply(&ChatReply { usage: Usage::uncached(1, 2), ..answer }, 0, None)).unwrap_or_default();
        assert_eq!(plain["usage"].get("prompt_tokens_details"), None);
        Ok(())
    }

    #[test]
    fn text_replies_render_content_and_no_tool_calls() {
        let reply = ChatReply {
            id: "x".to_string(),
            model: "openai/gpt-4o".to_string(),
            parts: vec![Part::Text("hello".to_string())],
            finish: FinishReason::Stop,
            usage: Usage::uncached(1, 2),
            logprobs: None,
        };
        let rendered = serde_json::to_value(render_reply(&reply, 7, None)).unwrap_or_default();
        assert_eq!(rendered["choices"][0]["message"], json!({"role": "assistant", "content": "hello"}));
        assert_eq!(rendered["usage"], json!({"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}));
        assert_eq!(rendered["created"], 7);
    }
}
