//! The OpenAI wire format: chat completions (plain and SSE), the model list and the error body.

use axum::response::Response;
use bytes::{BufMut, BytesMut};
use http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::conversation::{Prompt, Provider, Reply, Step, Stop, StreamSteps, count_words};
use crate::respond::{self, Render};

/// `created` of every completion and model: a fixed instant keeps the output deterministic.
const CREATED: u64 = 1_767_225_600;
const SYSTEM_FINGERPRINT: &str = "fp_mock";
pub(crate) const MODELS: [&str; 4] = ["gpt-4o", "gpt-4o-mini", "gpt-4.1", "gpt-4.1-mini"];

/// The key of `Authorization: Bearer <key>`.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
}

pub(crate) fn error(status: StatusCode, message: &str) -> Response {
    respond::json(status, &error_body(status, message))
}

pub(crate) fn error_body(status: StatusCode, message: &str) -> Value {
    let (kind, code) = match status.as_u16() {
        401 => ("invalid_request_error", Some("invalid_api_key")),
        403 => ("invalid_request_error", Some("unsupported_country_region_territory")),
        404 => ("invalid_request_error", Some("model_not_found")),
        429 => ("requests", Some("rate_limit_exceeded")),
        400..=499 => ("invalid_request_error", None),
        _ => ("server_error", None),
    };
    json!({ "error": { "message": message, "type": kind, "param": null, "code": code } })
}

pub(crate) fn unauthorized(key_opt: Option<&str>) -> Response {
    let message = match key_opt {
        None => "you didn't provide an API key: send it in an Authorization header using Bearer auth",
        Some(_) => "incorrect API key provided",
    };
    error(StatusCode::UNAUTHORIZED, message)
}

pub(crate) fn models() -> Response {
    let data: Vec<Value> = MODELS.iter().map(|id| model_body(id)).collect();
    respond::json(StatusCode::OK, &json!({ "object": "list", "data": data }))
}

pub(crate) fn model(id: &str) -> Response {
    respond::json(StatusCode::OK, &model_body(id))
}

fn model_body(id: &str) -> Value {
    json!({ "id": id, "object": "model", "created": CREATED, "owned_by": "openai" })
}

/// `POST /v1/embeddings`: texts only here (OpenAI also takes token ids; the gateway sends none).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EmbeddingsRequest {
    model: String,
    input: EmbeddingInput,
    encoding_format: Option<String>,
    dimensions: Option<usize>,
    #[allow(dead_code)]
    user: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum EmbeddingInput {
    One(String),
    Many(Vec<String>),
}

impl EmbeddingsRequest {
    /// The request, or why it is refused (a 400).
    pub fn parse(body: &[u8]) -> Result<EmbeddingsRequest, String> {
        serde_json::from_slice(body).map_err(|error| format!("invalid request body: {error}"))
    }

    /// The vectors (floats, or base64 of little-endian floats as asked) and the inputs' words as tokens.
    pub fn answer(&self) -> Response {
        use base64::Engine;
        let inputs = match &self.input {
            EmbeddingInput::One(text) => std::slice::from_ref(text),
            EmbeddingInput::Many(texts) => texts.as_slice(),
        };
        let dimensions = self.dimensions.unwrap_or(crate::conversation::EMBEDDING_DIMENSIONS);
        let data: Vec<Value> = inputs
            .iter()
            .enumerate()
            .map(|(index, text)| {
                let vector = crate::conversation::embedding(text, dimensions);
                let embedding = if self.encoding_format.as_deref() == Some("base64") {
                    json!(
                        base64::engine::general_purpose::STANDARD
                            .encode(vector.iter().flat_map(|value| value.to_le_bytes()).collect::<Vec<u8>>())
                    )
                } else {
                    json!(vector)
                };
                json!({"object": "embedding", "index": index, "embedding": embedding})
            })
            .collect();
        let tokens: u64 = inputs.iter().map(|text| count_words(text)).sum();
        respond::json(
            StatusCode::OK,
            &json!({"object": "list", "data": data, "model": self.model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}),
        )
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct ChatRequest {
    model: String,
    messages: Vec<ChatMessage>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    tools: Option<Vec<ChatTool>>,
    tool_choice: Option<Value>,
    logprobs: Option<bool>,
    top_logprobs: Option<usize>,
}

#[derive(Debug, Deserialize)]
struct ChatMessage {
    role: String,
    content: Option<ChatContent>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ChatContent {
    Text(String),
    Parts(Vec<ChatPart>),
}

#[derive(Debug, Deserialize)]
struct ChatPart {
    #[serde(rename = "type")]
    kind: Option<String>,
    text: Option<String>,
    file: Option<FilePart>,
}

/// A `file` part's file: its bytes as a base64 `data:` URL with a name, or an uploaded file's id.
#[derive(Debug, Deserialize)]
struct FilePart {
    file_data: Option<String>,
    filename: Option<String>,
    file_id: Option<String>,
}

impl ChatPart {
    /// As OpenAI checks a `file` part.
    fn check(&self, at: &str) -> Result<(), String> {
        if self.kind.as_deref() != Some("file") {
            return Ok(());
        }
        let Some(file) = &self.file else { return Err(format!("Missing required parameter: '{at}.file'.")) };
        match (&file.file_data, &file.file_id) {
            (Some(data), _) if !(data.starts_with("data:") && data.contains(";base64,")) => {
                Err(format!("Invalid value for '{at}.file.file_data': expected a base64-encoded data URL."))
            }
            (Some(_), _) if file.filename.is_none() => Err(format!("Missing required parameter: '{at}.file.filename'.")),
            (None, None) => Err(format!("Missing required parameter: '{at}.file.file_data'.")),
            _ => Ok(()),
        }
    }
}

#[derive(Debug, Deserialize)]
struct ChatTool {
    function: Option<FunctionName>,
}

#[derive(Debug, Deserialize)]
struct FunctionName {
    name: String,
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

impl ChatContent {
    fn text(&self) -> Option<String> {
        match self {
            ChatContent::Text(text) => Some(text.clone()),
            ChatContent::Parts(parts) => {
                let texts: Vec<&str> = parts.iter().filter_map(|part| part.text.as_deref()).collect();
                (!texts.is_empty()).then(|| texts.join("\n"))
            }
        }
    }

    fn words(&self) -> u64 {
        match self {
            ChatContent::Text(text) => count_words(text),
            ChatContent::Parts(parts) => parts.iter().filter_map(|part| part.text.as_deref()).map(count_words).sum(),
        }
    }
}

impl ChatRequest {
    /// The request, or why it is refused (a 400).
    pub fn parse(body: &[u8]) -> Result<ChatRequest, String> {
        let request: ChatRequest = serde_json::from_slice(body).map_err(|error| format!("invalid request body: {error}"))?;
        if request.messages.is_empty() {
            return Err("'messages' must not be empty".to_string());
        }
        for (position, message) in request.messages.iter().enumerate() {
            if let Some(ChatContent::Parts(parts)) = &message.content {
                for (index, part) in parts.iter().enumerate() {
                    part.check(&format!("messages[{position}].content[{index}]"))?;
                }
            }
        }
        Ok(request)
    }

    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    pub fn prompt(&self) -> Prompt {
        let contents = || self.messages.iter().filter_map(|message| message.content.as_ref());
        let last_user_text = self
            .messages
            .iter()
            .rev()
            .filter(|message| message.role == "user")
            .find_map(|message| message.content.as_ref().and_then(ChatContent::text))
            .unwrap_or_default();
        let tools_allowed = self.tool_choice.as_ref().and_then(Value::as_str) != Some("none");
        Prompt {
            input_words: contents().map(ChatContent::words).sum(),
            last_user_text,
            ends_with_tool_result: self.messages.last().is_some_and(|message| message.role == "tool" || message.role == "function"),
            tools: self
                .tools
                .iter()
                .flatten()
                .filter_map(|tool| tool.function.as_ref())
                .filter(|_| tools_allowed)
                .map(|function| function.name.clone())
                .collect(),
            max_tokens: self.max_completion_tokens.or(self.max_tokens),
            // Automatic caching: the turns before the last, as if the conversation had been seen.
            cached_words: crate::conversation::cacheable(
                self.messages.iter().rev().skip(1).filter_map(|message| message.content.as_ref()).map(ChatContent::words).sum(),
            ),
            ..Prompt::default()
        }
    }

    pub fn reply(&self) -> Reply {
        Reply::to(Provider::OpenAi, &self.prompt())
    }

    pub fn complete(&self, seq: u64) -> Response {
        let reply = self.reply();
        let id = completion_id(seq);
        let call_id = call_id(seq);
        let tool_calls = reply.tool_call.as_ref().map(|call| {
            [ToolCallOut {
                index: None,
                id: Some(&call_id),
                kind: Some("function"),
                function: FunctionOut { name: Some(&call.name), arguments: &call.arguments },
            }]
        });
        let completion = Completion {
            id: &id,
            object: "chat.completion",
            created: CREATED,
            model: &self.model,
            choices: [Choice {
                index: 0,
                message: MessageOut {
                    role: "assistant",
                    content: if reply.tool_call.is_some() { None } else { Some(&reply.text) },
                    refusal: None,
                    tool_calls,
                },
                logprobs: self.logprobs_asked().filter(|_| reply.tool_call.is_none()).map(|top| {
                    let tokens: Vec<Value> = crate::conversation::WordSegments::new(&reply.text)
                        .enumerate()
                        .map(|(position, range)| crate::conversation::token_logprob(&reply.text[range], position, top))
                        .collect();
                    json!({"content": tokens, "refusal": null})
                }),
                finish_reason: finish_reason(reply.stop),
            }],
            usage: Usage::of(&reply),
            system_fingerprint: SYSTEM_FINGERPRINT,
        };
        respond::json(StatusCode::OK, &completion)
    }

    /// With `logprobs: true`: how many alternatives each token comes with.
    fn logprobs_asked(&self) -> Option<usize> {
        (self.logprobs == Some(true)).then(|| self.top_logprobs.unwrap_or(0))
    }

    pub fn stream(&self, seq: u64) -> (StreamSteps, ChunkRenderer) {
        let renderer = ChunkRenderer {
            id: completion_id(seq),
            call_id: call_id(seq),
            model: self.model.clone(),
            include_usage: self.stream_options.as_ref().and_then(|options| options.include_usage).unwrap_or(false),
            logprobs: self.logprobs_asked(),
            position: 0,
        };
        (StreamSteps::new(self.reply()), renderer)
    }
}

fn completion_id(seq: u64) -> String {
    format!("chatcmpl-mock-{seq}")
}

fn call_id(seq: u64) -> String {
    format!("call_mock_{seq}")
}

fn finish_reason(stop: Stop) -> &'static str {
    match stop {
        Stop::Complete => "stop",
        Stop::Length => "length",
        Stop::ToolCall => "tool_calls",
    }
}

#[derive(Serialize)]
struct Completion<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [Choice<'a>; 1],
    usage: Usage,
    system_fingerprint: &'static str,
}

#[derive(Serialize)]
struct Choice<'a> {
    index: u32,
    message: MessageOut<'a>,
    logprobs: Option<Value>,
    finish_reason: &'static str,
}

#[derive(Serialize)]
struct MessageOut<'a> {
    role: &'static str,
    content: Option<&'a str>,
    refusal: Option<()>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[ToolCallOut<'a>; 1]>,
}

#[derive(Serialize)]
struct ToolCallOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    function: FunctionOut<'a>,
}

#[derive(Serialize)]
struct FunctionOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    arguments: &'a str,
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Serialize)]
struct PromptDetails {
    cached_tokens: u64,
}

impl Usage {
    fn of(reply: &Reply) -> Usage {
        Usage {
            prompt_tokens: reply.input_tokens,
            completion_tokens: reply.output_tokens,
            total_tokens: reply.input_tokens + reply.output_tokens,
            prompt_tokens_details: (reply.cached_tokens > 0).then_some(PromptDetails { cached_tokens: reply.cached_tokens }),
        }
    }
}

#[derive(Serialize)]
struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    system_fingerprint: &'static str,
    choices: &'a [ChunkChoice<'a>],
    /// `null` on every chunk but the last when usage is asked for; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<Usage>>,
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    logprobs: Option<Value>,
    finish_reason: Option<&'static str>,
}

#[derive(Serialize, Default)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<Option<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[ToolCallOut<'a>; 1]>,
}

/// Renders `chat.completion.chunk` SSE frames, ending with `data: [DONE]`.
pub(crate) struct ChunkRenderer {
    id: String,
    call_id: String,
    model: String,
    include_usage: bool,
    /// With `logprobs: true`, the alternatives per token; the position of the next text delta.
    logprobs: Option<usize>,
    position: usize,
}

impl ChunkRenderer {
    fn frame(&self, out: &mut BytesMut, choices: &[ChunkChoice<'_>], usage: Option<Usage>) {
        let chunk = Chunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: CREATED,
            model: &self.model,
            system_fingerprint: SYSTEM_FINGERPRINT,
            choices,
            usage: self.include_usage.then_some(usage),
        };
        out.put_slice(b"data: ");
        respond::write_json(out, &chunk);
        out.put_slice(b"\n\n");
    }

    fn delta(&self, out: &mut BytesMut, delta: Delta<'_>, finish_reason: Option<&'static str>) {
        self.frame(out, &[ChunkChoice { index: 0, delta, logprobs: None, finish_reason }], None);
    }
}

impl Render for ChunkRenderer {
    fn render(&mut self, step: &Step, reply: &Reply, out: &mut BytesMut) {
        match step {
            Step::Open => {
                let delta = match &reply.tool_call {
                    Some(call) => Delta {
                        role: Some("assistant"),
                        content: Some(None),
                        tool_calls: Some([ToolCallOut {
                            index: Some(0),
                            id: Some(&self.call_id),
                            kind: Some("function"),
                            function: FunctionOut { name: Some(&call.name), arguments: "" },
                        }]),
                    },
                    None => Delta { role: Some("assistant"), content: Some(Some("")), tool_calls: None },
                };
                self.delta(out, delta, None);
            }
            Step::Delta(range) => {
                let text = reply.streamed_text().get(range.clone()).unwrap_or_default();
                let delta = if reply.tool_call.is_some() {
                    Delta {
                        tool_calls: Some([ToolCallOut {
                            index: Some(0),
                            id: None,
                            kind: None,
                            function: FunctionOut { name: None, arguments: text },
                        }]),
                        ..Delta::default()
                    }
                } else {
                    Delta { content: Some(Some(text)), ..Delta::default() }
                };
                if let (Some(top), None) = (self.logprobs, &reply.tool_call) {
                    let logprobs = json!({"content": [crate::conversation::token_logprob(text, self.position, top)], "refusal": null});
                    self.position += 1;
                    self.frame(out, &[ChunkChoice { index: 0, delta, logprobs: Some(logprobs), finish_reason: None }], None);
                    return;
                }
                self.delta(out, delta, None);
            }
            Step::Finish => self.delta(out, Delta::default(), Some(finish_reason(reply.stop))),
            Step::Usage if self.include_usage => self.frame(out, &[], Some(Usage::of(reply))),
            Step::Close => out.put_slice(b"data: [DONE]\n\n"),
            Step::BlockStart | Step::BlockStop | Step::Usage => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render_all(request: &ChatRequest) -> Vec<Value> {
        let (steps, mut renderer) = request.stream(3);
        let mut out = BytesMut::new();
        let mut steps = steps;
        while let Some(step) = steps.next() {
            renderer.render(&step, steps.reply(), &mut out);
        }
        let text = String::from_utf8(out.to_vec()).unwrap();
        assert!(text.ends_with("data: [DONE]\n\n"));
        text.split("\n\n")
            .filter(|frame| !frame.is_empty() && *frame != "data: [DONE]")
            .map(|frame| serde_json::from_str(frame.strip_prefix("data: ").unwrap()).unwrap())
            .collect()
    }

    async fn body_json(response: Response) -> Value {
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    fn request(value: Value) -> ChatRequest {
        ChatRequest::parse(value.to_string().as_bytes()).unwrap()
    }

    #[tokio::test]
    async fn a_completion_echoes_the_model_and_counts_words() {
        let chat = request(json!({
            "model": "gpt-x",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hello there"}]},
            ],
        }));
        let body = body_json(chat.complete(9)).await;
        assert_eq!(body["id"], "chatcmpl-mock-9");
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(body["model"], "gpt-x");
        assert_eq!(body["choices"][0]["message"]["content"], "mock openai reply to: hello there");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        assert_eq!(body["usage"], json!({"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}));
    }

    #[tokio::test]
    async fn max_completion_tokens_truncates() {
        let chat =
            request(json!({"model": "m", "max_completion_tokens": 2, "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}));
        let body = body_json(chat.complete(0)).await;
        assert_eq!(body["choices"][0]["message"]["content"], "mock openai");
        assert_eq!(body["choices"][0]["finish_reason"], "length");
        assert_eq!(body["usage"]["completion_tokens"], 2);
    }

    #[tokio::test]
    async fn a_tool_call_names_the_first_tool() {
        let chat = request(json!({
            "model": "m",
            "messages": [{"role": "user", "content": "please use a tool"}],
            "tools": [{"type": "function", "function": {"name": "lookup"}}, {"type": "function", "function": {"name": "other"}}],
        }));
        let body = body_json(chat.complete(4)).await;
        let message = &body["choices"][0]["message"];
        assert_eq!(message["content"], Value::Null);
        assert_eq!(message["tool_calls"][0]["id"], "call_mock_4");
        assert_eq!(message["tool_calls"][0]["type"], "function");
        assert_eq!(message["tool_calls"][0]["function"]["name"], "lookup");
        assert_eq!(message["tool_calls"][0]["function"]["arguments"], r#"{"query":"please use a tool"}"#);
        assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(body["usage"]["completion_tokens"], 5);

        let after_tool = request(json!({
            "model": "m",
            "messages": [{"role": "user", "content": "please use a tool"}, {"role": "tool", "tool_call_id": "call_mock_4", "content": "42"}],
            "tools": [{"type": "function", "function": {"name": "lookup"}}],
        }));
        assert_eq!(body_json(after_tool.complete(5)).await["choices"][0]["finish_reason"], "stop");
        let refused = request(json!({
            "model": "m", "tool_choice": "none",
            "messages": [{"role": "user", "content": "use a tool"}],
            "tools": [{"type": "function", "function": {"name": "lookup"}}],
        }));
        assert_eq!(body_json(refused.complete(6)).await["choices"][0]["finish_reason"], "stop");
    }

    #[test]
    fn a_stream_sends_one_word_per_chunk_and_usage_when_asked() {
        let chat = request(json!({
            "model": "m", "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "hi you"}],
        }));
        let chunks = render_all(&chat);
        assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
        let words: Vec<&str> = chunks.iter().filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str()).collect();
        assert_eq!(words, ["", "mock", " openai", " reply", " to:", " hi", " you"]);
        let finish = &chunks[chunks.len() - 2];
        assert_eq!(finish["choices"][0]["finish_reason"], "stop");
        assert_eq!(finish["usage"], Value::Null);
        let usage = chunks.last().unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"], json!({"prompt_tokens": 2, "completion_tokens": 6, "total_tokens": 8}));
        assert!(chunks.iter().all(|chunk| chunk["object"] == "chat.completion.chunk" && chunk["id"] == "chatcmpl-mock-3"));

        let without_usage = render_all(&request(json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]})));
        assert!(without_usage.iter().all(|chunk| chunk.get("usage").is_none()));
    }

    #[test]
    fn a_tool_call_stream_splits_the_arguments() {
        let chat = request(json!({
            "model": "m", "stream": true,
            "messages": [{"role": "user", "content": "use a tool for the weather"}],
            "tools": [{"type": "function", "function": {"name": "weather"}}],
        }));
        let chunks = render_all(&chat);
        let header = &chunks[0]["choices"][0]["delta"]["tool_calls"][0];
        assert_eq!(header["id"], "call_mock_3");
        assert_eq!(header["type"], "function");
        assert_eq!(header["function"]["name"], "weather");
        let fragments: Vec<&str> = chunks[1..]
            .iter()
            .filter_map(|chunk| chunk["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
            .collect();
        assert!(fragments.len() >= 2);
        assert_eq!(fragments.concat(), r#"{"query":"use a tool for the weather"}"#);
        assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
    }

    #[test]
    fn bad_requests_are_refused() {
        assert!(ChatRequest::parse(b"{").is_err());
        assert!(ChatRequest::parse(br#"{"model": "m", "messages": []}"#).is_err());
        assert!(ChatRequest::parse(br#"{"messages": [{"role": "user", "content": "x"}]}"#).is_err());
    }

    #[test]
    fn the_bearer_key_is_read() {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::AUTHORIZATION, "Bearer sk-1".parse().unwrap());
        assert_eq!(bearer(&headers), Some("sk-1"));
        headers.insert(http::header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&headers), None);
    }

    #[test]
    fn error_bodies_have_the_openai_shape() {
        let body = error_body(StatusCode::UNAUTHORIZED, "nope");
        assert_eq!(body["error"]["message"], "nope");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["code"], "invalid_api_key");
        assert_eq!(error_body(StatusCode::TOO_MANY_REQUESTS, "slow")["error"]["code"], "rate_limit_exceeded");
    }
}
