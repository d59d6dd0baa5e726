//! The Gemini wire format: generateContent, streamGenerateContent (SSE or a streamed JSON array), the
//! model list and the error body.

use axum::extract::Query;
use axum::response::Response;
use bytes::{BufMut, BytesMut};
use http::{HeaderMap, StatusCode, Uri};
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::conversation::{Prompt, Provider, Reply, Step, Stop, StreamSteps, count_words};
use crate::respond::{self, Render};

pub(crate) const MODELS: [(&str, &str); 3] =
    [("gemini-2.0-flash", "Gemini 2.0 Flash"), ("gemini-2.5-flash", "Gemini 2.5 Flash"), ("gemini-2.5-pro", "Gemini 2.5 Pro")];

#[derive(Debug, Default, Deserialize)]
pub(crate) struct GeminiQuery {
    pub key: Option<String>,
    pub alt: Option<String>,
}

impl GeminiQuery {
    pub fn of(uri: &Uri) -> GeminiQuery {
        Query::<GeminiQuery>::try_from_uri(uri).map(|Query(query)| query).unwrap_or_default()
    }
}

/// The key of `x-goog-api-key`, or else of the `key` query parameter.
pub(crate) fn api_key<'a>(headers: &'a HeaderMap, query: &'a GeminiQuery) -> Option<&'a str> {
    headers.get("x-goog-api-key").and_then(|value| value.to_str().ok()).or(query.key.as_deref())
}

pub(crate) fn error(status: StatusCode, message: &str) -> Response {
    respond::json(status, &error_body(status, message))
}

pub(crate) fn error_body(status: StatusCode, message: &str) -> Value {
    let grpc_status = match status.as_u16() {
        400 | 413 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        501 => "UNIMPLEMENTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        400..=499 => "FAILED_PRECONDITION",
        _ => "INTERNAL",
    };
    json!({ "error": { "code": status.as_u16(), "message": message, "status": grpc_status } })
}

pub(crate) fn unauthorized() -> Response {
    error(StatusCode::UNAUTHORIZED, "API key not valid. Please pass a valid API key.")
}

pub(crate) fn models() -> Response {
    let models: Vec<Value> = MODELS.iter().map(|(id, display_name)| model_body(id, display_name)).collect();
    respond::json(StatusCode::OK, &json!({ "models": models }))
}

pub(crate) fn model(id: &str) -> Response {
    let id = id.strip_prefix("models/").unwrap_or(id);
    let display_name = MODELS.iter().find(|(known, _)| *known == id).map_or(id, |(_, display_name)| display_name);
    respond::json(StatusCode::OK, &model_body(id, display_name))
}

fn model_body(id: &str, display_name: &str) -> Value {
    json!({
        "name": format!("models/{id}"),
        "version": "001",
        "displayName": display_name,
        "description": "a mock model",
        "inputTokenLimit": 1_048_576,
        "outputTokenLimit": 65_536,
        "supportedGenerationMethods": ["generateContent", "streamGenerateContent", "countTokens"],
    })
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GenerateRequest {
    contents: Vec<Content>,
    #[serde(alias = "system_instruction")]
    system_instruction: Option<Content>,
    tools: Option<Vec<Tool>>,
    #[serde(alias = "tool_config")]
    tool_config: Option<ToolConfig>,
    #[serde(alias = "generation_config")]
    generation_config: Option<GenerationConfig>,
}

#[derive(Debug, Deserialize)]
struct Content {
    role: Option<String>,
    #[serde(default)]
    parts: Vec<Part>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Part {
    text: Option<String>,
    #[serde(alias = "function_response")]
    function_response: Option<IgnoredAny>,
    // Read so a malformed one is refused as the real API refuses it; the mock reads no files.
    #[serde(alias = "inline_data")]
    #[allow(dead_code)]
    inline_data: Option<Blob>,
    #[serde(alias = "file_data")]
    #[allow(dead_code)]
    file_data: Option<FileData>,
}

/// Inline bytes: both members are required.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Blob {
    #[serde(alias = "mime_type")]
    #[allow(dead_code)]
    mime_type: String,
    #[allow(dead_code)]
    data: String,
}

/// A file by URI: both members are required.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FileData {
    #[serde(alias = "mime_type")]
    #[allow(dead_code)]
    mime_type: String,
    #[serde(alias = "file_uri")]
    #[allow(dead_code)]
    file_uri: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Tool {
    #[serde(alias = "function_declarations")]
    function_declarations: Option<Vec<FunctionDeclaration>>,
}

#[derive(Debug, Deserialize)]
struct FunctionDeclaration {
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ToolConfig {
    #[serde(alias = "function_calling_config")]
    function_calling_config: Option<FunctionCallingConfig>,
}

#[derive(Debug, Deserialize)]
struct FunctionCallingConfig {
    mode: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GenerationConfig {
    #[serde(alias = "max_output_tokens")]
    max_output_tokens: Option<u64>,
    #[serde(alias = "thinking_config")]
    thinking_config: Option<ThinkingConfig>,
    #[serde(alias = "response_logprobs")]
    response_logprobs: Option<bool>,
    logprobs: Option<usize>,
    // Accepted so a wrong type is refused as the real API does; it changes nothing.
    #[allow(dead_code)]
    temperature: Option<f64>,
}

/// How much the model may think, and whether its thoughts come back (as summaries).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ThinkingConfig {
    #[serde(alias = "thinking_budget")]
    thinking_budget: Option<i64>,
    #[serde(alias = "include_thoughts")]
    include_thoughts: Option<bool>,
}

impl Content {
    fn text(&self) -> Option<String> {
        let texts: Vec<&str> = self.parts.iter().filter_map(|part| part.text.as_deref()).collect();
        (!texts.is_empty()).then(|| texts.join("\n"))
    }

    fn words(&self) -> u64 {
        self.parts.iter().filter_map(|part| part.text.as_deref()).map(count_words).sum()
    }

    fn is_user(&self) -> bool {
        self.role.as_deref().is_none_or(|role| role == "user")
    }
}

/// `batchEmbedContents`: one embedding per request, in order; Gemini reports no token count.
#[derive(Debug, Deserialize)]
pub(crate) struct BatchEmbedRequest {
    requests: Vec<EmbedRequest>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct EmbedRequest {
    model: String,
    content: Content,
    output_dimensionality: Option<usize>,
}

impl BatchEmbedRequest {
    /// The request, or why it is refused (a 400): each request names the model of the URL.
    pub fn parse(body: &[u8], model: &str) -> Result<BatchEmbedRequest, String> {
        let batch: BatchEmbedRequest = serde_json::from_slice(body).map_err(|error| format!("invalid JSON payload: {error}"))?;
        if let Some(other) = batch.requests.iter().find(|request| request.model != format!("models/{model}")) {
            return Err(format!("* BatchEmbedContentsRequest.requests: model `{}` does not match the URL's `{model}`", other.model));
        }
        Ok(batch)
    }

    pub fn answer(&self) -> Response {
        let embeddings: Vec<Value> = self
            .requests
            .iter()
            .map(|request| {
                let text = request.content.text().unwrap_or_default();
                let dimensions = request.output_dimensionality.unwrap_or(crate::conversation::EMBEDDING_DIMENSIONS);
                json!({"values": crate::conversation::embedding(&text, dimensions)})
            })
            .collect();
        respond::json(StatusCode::OK, &json!({"embeddings": embeddings}))
    }
}

impl GenerateRequest {
    /// `countTokens`: the prompt's tokens of the `generateContentRequest` it wraps.
    pub fn count(body: &[u8]) -> Result<u64, String> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Count {
            generate_content_request: GenerateRequest,
        }
        let count: Count = serde_json::from_slice(body).map_err(|error| format!("invalid JSON payload: {error}"))?;
        Ok(count.generate_content_request.prompt().input_words)
    }

    /// The request, or why it is refused (a 400).
    pub fn parse(body: &[u8]) -> Result<GenerateRequest, String> {
        let request: GenerateRequest = serde_json::from_slice(body).map_err(|error| format!("invalid JSON payload: {error}"))?;
        if request.contents.is_empty() {
            return Err("* GenerateContentRequest.contents: contents is not specified".to_string());
        }
        Ok(request)
    }

    pub fn prompt(&self) -> Prompt {
        let tools_allowed = self
            .tool_config
            .as_ref()
            .and_then(|config| config.function_calling_config.as_ref())
            .and_then(|config| config.mode.as_deref())
            .is_none_or(|mode| !mode.eq_ignore_ascii_case("none"));
        Prompt {
            input_words: self.system_instruction.as_ref().map_or(0, Content::words) + self.contents.iter().map(Content::words).sum::<u64>(),
            last_user_text: self.contents.iter().rev().filter(|content| content.is_user()).find_map(Content::text).unwrap_or_default(),
            ends_with_tool_result: self
                .contents
                .last()
                .is_some_and(|content| content.parts.iter().any(|part| part.function_response.is_some())),
            tools: self
                .tools
                .iter()
                .flatten()
                .flat_map(|tool| tool.function_declarations.iter().flatten())
                .filter(|_| tools_allowed)
                .map(|function| function.name.clone())
                .collect(),
            max_tokens: self.generation_config.as_ref().and_then(|config| config.max_output_tokens),
            thinking: self
                .generation_config
                .as_ref()
                .and_then(|config| config.thinking_config.as_ref())
                .is_some_and(|thinking| thinking.include_thoughts == Some(true) && thinking.thinking_budget != Some(0)),
            // Implicit caching, as OpenAI's automatic one: the turns before the last.
            cached_words: crate::conversation::cacheable(self.contents.iter().rev().skip(1).map(Content::words).sum()),
            ..Prompt::default()
        }
    }

    pub fn reply(&self) -> Reply {
        Reply::to(Provider::Gemini, &self.prompt())
    }

    pub fn complete(&self, model: &str, seq: u64) -> Response {
        let reply = self.reply();
        let response_id = response_id(seq);
        let part = match &reply.tool_call {
            Some(call) => PartOut::FunctionCall { function_call: FunctionCallOut { name: &call.name, args: &call.input } },
            None => PartOut::Text { text: &reply.text },
        };
        let thought = reply.thinking.as_ref().map(|thinking| PartOut::Thought { text: &thinking.text, thought: true });
        let mut response = response(part, Some(&reply), model, &response_id);
        response.candidates[0].content.parts.splice(0..0, thought);
        let config = self.generation_config.as_ref();
        if config.and_then(|config| config.response_logprobs) == Some(true) && reply.tool_call.is_none() {
            response.candidates[0].logprobs_result =
                Some(logprobs_result(&reply.text, config.and_then(|config| config.logprobs).unwrap_or(0)));
        }
        respond::json(StatusCode::OK, &response)
    }

    pub fn stream(&self, model: &str, seq: u64, sse: bool) -> (StreamSteps, ChunkRenderer) {
        let renderer = ChunkRenderer { model: model.to_string(), response_id: response_id(seq), sse, first: true };
        (StreamSteps::new(self.reply()), renderer)
    }
}

/// Gemini's `logprobsResult` of an answer: the mock's log probabilities (`token_logprob`), one
/// token per word.
fn logprobs_result(text: &str, top: usize) -> Value {
    let gemini = |entry: &Value| json!({"token": entry["token"], "logProbability": entry["logprob"]});
    let entries: Vec<Value> = crate::conversation::WordSegments::new(text)
        .enumerate()
        .map(|(position, range)| crate::conversation::token_logprob(&text[range], position, top))
        .collect();
    json!({
        "chosenCandidates": entries.iter().map(gemini).collect::<Vec<_>>(),
        "topCandidates": entries.iter().map(|entry| json!({"candidates": entry["top_logprobs"].as_array().into_iter().flatten().map(gemini).collect::<Vec<_>>()})).collect::<Vec<_>>(),
    })
}

fn response_id(seq: u64) -> String {
    format!("mock-{seq}")
}

fn finish_reason(stop: Stop) -> &'static str {
    match stop {
        Stop::Complete | Stop::ToolCall => "STOP",
        Stop::Length => "MAX_TOKENS",
    }
}

/// A `GenerateContentResponse`; `finished` carries the finish reason and the usage.
fn response<'a>(part: PartOut<'a>, finished: Option<&Reply>, model: &'a str, response_id: &'a str) -> GenerateResponse<'a> {
    GenerateResponse {
        candidates: [Candidate {
            content: ContentOut { parts: vec![part], role: "model" },
            finish_reason: finished.map(|reply| finish_reason(reply.stop)),
            index: 0,
            logprobs_result: None,
        }],
        usage_metadata: finished.map(|reply| UsageMetadata {
            prompt_token_count: reply.input_tokens,
            candidates_token_count: reply.output_tokens,
            total_token_count: reply.input_tokens + reply.output_tokens,
            cached_content_token_count: (reply.cached_tokens > 0).then_some(reply.cached_tokens),
        }),
        model_version: model,
        response_id,
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GenerateResponse<'a> {
    candidates: [Candidate<'a>; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage_metadata: Option<UsageMetadata>,
    model_version: &'a str,
    response_id: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Candidate<'a> {
    content: ContentOut<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    finish_reason: Option<&'static str>,
    index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs_result: Option<Value>,
}

#[derive(Serialize)]
struct ContentOut<'a> {
    parts: Vec<PartOut<'a>>,
    role: &'static str,
}

#[derive(Serialize)]
#[serde(untagged)]
enum PartOut<'a> {
    /// A thought summary (with `includeThoughts`).
    Thought {
        text: &'a str,
        thought: bool,
    },
    Text {
        text: &'a str,
    },
    #[serde(rename_all = "camelCase")]
    FunctionCall {
        function_call: FunctionCallOut<'a>,
    },
}

#[derive(Serialize)]
struct FunctionCallOut<'a> {
    name: &'a str,
    args: &'a serde_json::Value,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct UsageMetadata {
    prompt_token_count: u64,
    candidates_token_count: u64,
    total_token_count: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    cached_content_token_count: Option<u64>,
}

/// Renders `GenerateContentResponse` chunks: SSE `data:` frames (`alt=sse`, CRLF-separated as Google
/// sends them), or the elements of a streamed JSON array. A tool call comes whole in the last chunk.
pub(crate) struct ChunkRenderer {
    model: String,
    response_id: String,
    sse: bool,
    first: bool,
}

fn write_chunk(out: &mut BytesMut, sse: bool, first: &mut bool, value: &GenerateResponse<'_>) {
    if sse {
        out.put_slice(b"data: ");
        respond::write_json(out, value);
        out.put_slice(b"\r\n\r\n");
    } else {
        out.put_slice(if *first { b"[" } else { b",\r\n" });
        respond::write_json(out, value);
    }
    *first = false;
}

impl Render for ChunkRenderer {
    fn render(&mut self, step: &Step, reply: &Reply, out: &mut BytesMut) {
        match step {
            Step::Delta(range) if reply.tool_call.is_none() => {
                let text = reply.streamed_text().get(range.clone()).unwrap_or_default();
                write_chunk(out, self.sse, &mut self.first, &response(PartOut::Text { text }, None, &self.model, &self.response_id));
            }
            Step::Finish => {
                let part = match &reply.tool_call {
                    Some(call) => PartOut::FunctionCall { function_call: FunctionCallOut { name: &call.name, args: &call.input } },
                    None => PartOut::Text { text: "" },
                };
                write_chunk(out, self.sse, &mut self.first, &response(part, Some(reply), &self.model, &self.response_id));
            }
            Step::Close if !self.sse => out.put_slice(if self.first { b"[]" } else { b"]" }),
            // The thoughts come first, whole.
            Step::Open if reply.thinking.is_some() => {
                let text = reply.thinking.as_ref().map_or("", |thinking| thinking.text.as_str());
                let part = PartOut::Thought { text, thought: true };
                write_chunk(out, self.sse, &mut self.first, &response(part, None, &self.model, &self.response_id));
            }
            Step::Open | Step::BlockStart | Step::Delta(_) | Step::BlockStop | Step::Usage | Step::Close => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(value: Value) -> GenerateRequest {
        GenerateRequest::parse(value.to_string().as_bytes()).unwrap()
    }

    async fn body_json(response: Response) -> Value {
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    fn rendered(request: &GenerateRequest, sse: bool) -> String {
        let (mut steps, mut renderer) = request.stream("gemini-x", 5, sse);
        let mut out = BytesMut::new();
        while let Some(step) = steps.next() {
            renderer.render(&step, steps.reply(), &mut out);
        }
        String::from_utf8(out.to_vec()).unwrap()
    }

    fn sse_chunks(text: &str) -> Vec<Value> {
        text.split_terminator("\r\n\r\n").map(|frame| serde_json::from_str(frame.strip_prefix("data: ").unwrap()).unwrap()).collect()
    }

    #[tokio::test]
    async fn generate_content_counts_and_replies() {
        let generate = request(json!({
            "systemInstruction": {"parts": [{"text": "be kind"}]},
            "contents": [
                {"role": "user", "parts": [{"text": "hello"}]},
                {"role": "model", "parts": [{"text": "hi there"}]},
                {"role": "user", "parts": [{"text": "how are you"}]},
            ],
            "generationConfig": {"temperature": 0.2},
        }));
        let body = body_json(generate.complete("gemini-x", 3)).await;
        assert_eq!(
            body["candidates"][0],
            json!({"content": {"parts": [{"text": "mock gemini reply to: how are you"}], "role": "model"}, "finishReason": "STOP", "index": 0})
        );
        assert_eq!(body["usageMetadata"], json!({"promptTokenCount": 8, "candidatesTokenCount": 7, "totalTokenCount": 15}));
        assert_eq!(body["modelVersion"], "gemini-x");
    }

    #[tokio::test]
    async fn max_output_tokens_truncates() {
        let generate = request(json!({"contents": [{"parts": [{"text": "hi"}]}], "generation_config": {"max_output_tokens": 2}}));
        let body = body_json(generate.complete("g", 0)).await;
        assert_eq!(body["candidates"][0]["content"]["parts"][0]["text"], "mock gemini");
        assert_eq!(body["candidates"][0]["finishReason"], "MAX_TOKENS");
    }

    #[tokio::test]
    async fn a_function_call_answers_when_asked() {
        let tools = json!([{"functionDeclarations": [{"name": "find", "parameters": {"type": "object"}}]}]);
        let generate = request(json!({"tools": tools, "contents": [{"role": "user", "parts": [{"text": "use a tool"}]}]}));
        let body = body_json(generate.complete("g", 0)).await;
        assert_eq!(body["candidates"][0]["content"]["parts"], json!([{"functionCall": {"name": "find", "args": {"query": "use a tool"}}}]));
        assert_eq!(body["candidates"][0]["finishReason"], "STOP");
        assert_eq!(body["usageMetadata"]["candidatesTokenCount"], 5);
        let after = request(json!({"tools": tools, "contents": [
            {"role": "user", "parts": [{"text": "use a tool"}]},
            {"role": "model", "parts": [{"functionCall": {"name": "find", "args": {"query": "use a tool"}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "find", "response": {"result": "ok"}}}]},
        ]}));
        let body = body_json(after.complete("g", 0)).await;
        assert_eq!(body["candidates"][0]["content"]["parts"][0]["text"], "mock gemini reply to: use a tool");
        let forbidden = request(json!({"tools": tools, "toolConfig": {"functionCallingConfig": {"mode": "NONE"}},
            "contents": [{"role": "user", "parts": [{"text": "use a tool"}]}]}));
        assert!(body_json(forbidden.complete("g", 0)).await["candidates"][0]["content"]["parts"][0]["text"].is_string());
    }

    #[test]
    fn a_sse_stream_sends_one_word_per_chunk() {
        let generate = request(json!({"contents": [{"role": "user", "parts": [{"text": "hey"}]}]}));
        let chunks = sse_chunks(&rendered(&generate, true));
        let words: Vec<&str> = chunks.iter().map(|chunk| chunk["candidates"][0]["content"]["parts"][0]["text"].as_str().unwrap()).collect();
        assert_eq!(words, ["mock", " gemini", " reply", " to:", " hey", ""]);
        let last = chunks.last().unwrap();
        assert_eq!(last["candidates"][0]["finishReason"], "STOP");
        assert_eq!(last["usageMetadata"]["totalTokenCount"], 6);
        assert!(chunks[..chunks.len() - 1].iter().all(|chunk| chunk.get("usageMetadata").is_none()));
    }

    #[test]
    fn a_json_array_stream_is_one_array() {
        let generate = request(json!({"contents": [{"role": "user", "parts": [{"text": "hey"}]}]}));
        let array: Value = serde_json::from_str(&rendered(&generate, false)).unwrap();
        assert_eq!(array.as_array().unwrap().len(), 6);
    }

    #[test]
    fn a_function_call_streams_whole() {
        let generate = request(json!({
            "tools": [{"function_declarations": [{"name": "find"}]}],
            "contents": [{"role": "user", "parts": [{"text": "use a tool"}]}],
        }));
        let chunks = sse_chunks(&rendered(&generate, true));
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0]["candidates"][0]["content"]["parts"][0]["functionCall"]["args"]["query"], "use a tool");
    }

    #[test]
    fn keys_queries_and_errors() {
        let query = GeminiQuery::of(&"/v1beta/models/g:streamGenerateContent?alt=sse&key=a%2Bb".parse().unwrap());
        assert_eq!((query.alt.as_deref(), query.key.as_deref()), (Some("sse"), Some("a+b")));
        let mut headers = HeaderMap::new();
        assert_eq!(api_key(&headers, &query), Some("a+b"));
        headers.insert("x-goog-api-key", "h".parse().unwrap());
        assert_eq!(api_key(&headers, &query), Some("h"));
        assert_eq!(error_body(StatusCode::UNAUTHORIZED, "m"), json!({"error": {"code": 401, "message": "m", "status": "UNAUTHENTICATED"}}));
        assert!(GenerateRequest::parse(br#"{"contents": []}"#).is_err());
    }
}
