//! The Gemini `generateContent` format, as Google answers it (clients never speak it to the gateway).

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use crate::chat::{
    ChatEvent, ChatReply, ChatRequest, DocumentSource, FinishReason, Part, Role, TokenLogprob, ToolChoice, TopLogprob, Usage,
};

/// JSON Schema keywords Gemini's function declarations refuse.
const UNSUPPORTED_SCHEMA_KEYS: [&str; 5] = ["additionalProperties", "$schema", "strict", "$defs", "definitions"];

fn sanitize_schema(schema: &Value) -> Value {
    match schema {
        Value::Object(object) => {
            let cleaned: Map<String, Value> = object
                .iter()
                .filter(|(key, _)| !UNSUPPORTED_SCHEMA_KEYS.contains(&key.as_str()))
                .map(|(key, value)| (key.clone(), sanitize_schema(value)))
                .collect();
            Value::Object(cleaned)
        }
        Value::Array(items) => Value::Array(items.iter().map(sanitize_schema).collect()),
        other => other.clone(),
    }
}

fn arguments_object(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(value @ Value::Object(_)) => value,
        _ => json!({}),
    }
}

/// The part of an image or a document.
fn media_part(part: &Part) -> Option<Value> {
    Some(match part {
        Part::Image { url } => match crate::chat::data_url(url) {
            Some((mime_type, data)) => json!({"inlineData": {"mimeType": mime_type, "data": data}}),
            None => json!({"fileData": {"fileUri": url}}),
        },
        Part::Document { source, .. } => match source {
            DocumentSource::Base64 { media_type, data } => json!({"inlineData": {"mimeType": media_type, "data": data}}),
            DocumentSource::Url(url) => json!({"fileData": {"mimeType": "application/pdf", "fileUri": url}}),
            DocumentSource::Text(text) => json!({"text": text}),
        },
        _ => return None,
    })
}

/// The body sent to Gemini.
pub fn build_request(request: &ChatRequest) -> Value {
    // Gemini answers tool calls by function name, not id: remember which id named which function.
    let mut names_by_call: HashMap<&str, &str> = HashMap::new();
    for message in &request.messages {
        for part in &message.parts {
            if let Part::ToolCall { id, name, .. } = part {
                names_by_call.insert(id.as_str(), name.as_str());
            }
        }
    }
    let mut contents: Vec<Value> = Vec::new();
    for message in &request.messages {
        let role = match message.role {
            Role::Assistant => "model",
            Role::User | Role::Tool => "user",
        };
        let mut parts: Vec<Value> = message
            .parts
            .iter()
            .filter_map(|part| match part {
                Part::Text(text) => Some(json!({"text": text})),
                Part::Image { .. } | Part::Document { .. } => media_part(part),
                Part::ToolCall { name, arguments, .. } => {
                    Some(json!({"functionCall": {"name": name, "args": arguments_object(arguments)}}))
                }
                Part::ToolResult { call_id, content, .. } => {
                    let name = names_by_call.get(call_id.as_str()).copied().unwrap_or(call_id.as_str());
                    Some(json!({"functionResponse": {"name": name, "response": {"content": content}}}))
                }
                // Anthropic's signed thinking means nothing to Gemini.
                Part::Thinking { .. } | Part::RedactedThinking { .. } => None,
            })
            .collect();
        // The images and files tool calls returned, after the function responses (which Gemini
        // takes together).
        for part in &message.parts {
            if let Part::ToolResult { media, .. } = part {
                parts.extend(media.iter().filter_map(media_part));
            }
        }
        if parts.is_empty() {
            continue;
        }
        match contents.last_mut() {
            Some(last) if last["role"] == role => {
                if let Some(existing) = last.get_mut("parts").and_then(Value::as_array_mut) {
                    existing.extend(parts);
                }
            }
            _ => contents.push(json!({"role": role, "parts": parts})),
        }
    }
    let mut body = Map::new();
    body.insert("contents".to_string(), json!(contents));
    if let Some(system) = &request.system {
        body.insert("systemInstruction".to_string(), json!({"parts": [{"text": system}]}));
    }
    if !request.tools.is_empty() {
        let declarations: Vec<Value> = request
            .tools
            .iter()
            .map(|tool| json!({"name": tool.name, "description": tool.description.clone().unwrap_or_default(), "parameters": sanitize_schema(&tool.parameters.to_value())}))
            .collect();
        body.insert("tools".to_string(), json!([{"functionDeclarations": declarations}]));
    }
    if let Some(choice) = &request.tool_choice {
        let config = match choice {
            ToolChoice::Auto => json!({"mode": "AUTO"}),
            ToolChoice::None => json!({"mode": "NONE"}),
            ToolChoice::Required => json!({"mode": "ANY"}),
            ToolChoice::Named(name) => json!({"mode": "ANY", "allowedFunctionNames": [name]}),
        };
        body.insert("toolConfig".to_string(), json!({"functionCallingConfig": config}));
    }
    let mut generation = Map::new();
    if let Some(max_tokens) = request.max_tokens {
        generation.insert("maxOutputTokens".to_string(), json!(max_tokens));
    }
    if let Some(temperature) = request.temperature {
        generation.insert("temperature".to_string(), json!(temperature));
    }
    if let Some(top_p) = request.top_p {
        generation.insert("topP".to_string(), json!(top_p));
    }
    if let Some(top_k) = request.top_k {
        generation.insert("topK".to_string(), json!(top_k));
    }
    if !request.stop.is_empty() {
        generation.insert("stopSequences".to_string(), json!(request.stop));
    }
    // OpenAI's options Gemini has members for (its logit bias and reasoning effort differ in kind).
    if let Some(seed) = request.openai.seed {
        // Gemini's seed is 32 bits: the low half keeps one seed to one sampling.
        generation.insert("seed".to_string(), json!(seed as i32));
    }
    if let Some(penalty) = request.openai.presence_penalty {
        generation.insert("presencePenalty".to_string(), json!(penalty));
    }
    if let Some(penalty) = request.openai.frequency_penalty {
        generation.insert("frequencyPenalty".to_string(), json!(penalty));
    }
    // OpenAI's structured outputs: JSON answers, shaped by the schema where one is given (cleaned of
    // the keywords Gemini rejects, as tools' schemas are); a `text` or unknown format asks nothing.
    if let Some(format) = request.response_format.as_ref().map(crate::chat::Schema::to_value) {
        let kind = format.get("type").and_then(Value::as_str);
        if matches!(kind, Some("json_object" | "json_schema")) {
            generation.insert("responseMimeType".to_string(), json!("application/json"));
        }
        if let (Some("json_schema"), Some(schema)) = (kind, format.pointer("/json_schema/schema")) {
            generation.insert("responseSchema".to_string(), sanitize_schema(schema));
        }
    }
    if let Some(thinking) = thinking_config(request) {
        generation.insert("thinkingConfig".to_string(), thinking);
    }
    // OpenAI's log probabilities: Gemini returns the chosen tokens' and, when asked, the likeliest.
    if request.openai.logprobs {
        generation.insert("responseLogprobs".to_string(), json!(true));
        if let Some(count) = request.openai.top_logprobs.filter(|count| *count > 0) {
            generation.insert("logprobs".to_string(), json!(count));
        }
    }
    if !generation.is_empty() {
        body.insert("generationConfig".to_string(), Value::Object(generation));
    }
    Value::Object(body)
}

/// Gemini's thinking configuration from what the client asked: an Anthropic client's `thinking`
/// (enabled: its budget, with the thoughts returned, as Anthropic returns them; disabled: none), or
/// an OpenAI client's `reasoning_effort` (the budgets Google's own OpenAI-compatible API maps them
/// to: none 0, low 1,024, medium 8,192, high 24,576; minimal as low). None leaves the model's
/// default (Gemini 2.5 thinks dynamically).
fn thinking_config(request: &ChatRequest) -> Option<Value> {
    if let Some(thinking) = request.thinking.as_ref().map(crate::chat::Schema::to_value) {
        match thinking.get("type").and_then(Value::as_str) {
            Some("enabled") => {
                let budget = thinking.get("budget_tokens").and_then(Value::as_u64)?;
                return Some(json!({"thinkingBudget": budget, "includeThoughts": true}));
            }
            Some("disabled") => return Some(json!({"thinkingBudget": 0})),
            _ => {}
        }
    }
    let budget = match request.openai.reasoning_effort.as_deref()? {
        "none" => 0,
        "minimal" | "low" => 1024,
        "medium" => 8192,
        "high" => 24576,
        _ => return None,
    };
    Some(json!({"thinkingBudget": budget}))
}

/// The tokens of a candidate's `logprobsResult` (`chosenCandidates`, with `topCandidates` at the
/// same positions), as OpenAI's entries have them (bytes: the token's UTF-8).
fn logprobs_of(result: &Value) -> Option<Vec<TokenLogprob>> {
    fn entry(candidate: &Value) -> Option<TopLogprob> {
        let token = candidate.get("token")?.as_str()?;
        Some(TopLogprob {
            token: token.to_string(),
            logprob: candidate.get("logProbability")?.as_f64()?,
            bytes: Some(token.as_bytes().to_vec()),
        })
    }
    let chosen = result.get("chosenCandidates")?.as_array()?;
    let top = result.get("topCandidates").and_then(Value::as_array);
    Some(
        chosen
            .iter()
            .enumerate()
            .filter_map(|(position, candidate)| {
                let TopLogprob { token, logprob, bytes } = entry(candidate)?;
                let top_logprobs = top
                    .and_then(|top| top.get(position))
                    .and_then(|at| at.get("candidates"))
                    .and_then(Value::as_array)
                    .map_or_else(Vec::new, |candidates| candidates.iter().filter_map(entry).collect());
                Some(TokenLogprob { token, logprob, bytes, top_logprobs })
            })
            .collect(),
    )
}

/// Whether a part is the model's thought (returned when `includeThoughts` was asked).
fn is_thought(part: &Value) -> bool {
    part.get("thought").and_then(Value::as_bool) == Some(true)
}

fn parse_finish(reason: &str, has_tool_calls: bool) -> FinishReason {
    match reason {
        "MAX_TOKENS" => FinishReason::Length,
        "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" | "IMAGE_SAFETY" => FinishReason::ContentFilter,
        _ if has_tool_calls => FinishReason::ToolCalls,
        _ => FinishReason::Stop,
    }
}

fn usage_of(body: &Value) -> Option<Usage> {
    let metadata = body.get("usageMetadata")?;
    let count = |field: &str| metadata.get(field).and_then(Value::as_u64).unwrap_or(0);
    let input_tokens = count("promptTokenCount");
    Some(Usage {
        // Implicitly or explicitly cached content, counted within the prompt's tokens.
        cache_read_tokens: count("cachedContentTokenCount").min(input_tokens),
        ..Usage::uncached(input_tokens, count("candidatesTokenCount") + count("thoughtsTokenCount"))
    })
}

/// Reads Gemini's `GenerateContentResponse`.
pub fn parse_reply(body: &Value, model: &str) -> Result<ChatReply, String> {
    let candidate = body.pointer("/candidates/0").ok_or("no candidates in the provider's reply")?;
    let mut parts = Vec::new();
    let mut calls = 0;
    for part in candidate.pointer("/content/parts").and_then(Value::as_array).into_iter().flatten() {
        if let Some(text) = part.get("text").and_then(Value::as_str) {
            // A thought summary: thinking without an Anthropic signature (Gemini's own thought
            // signatures mean nothing elsewhere).
            parts.push(if is_thought(part) {
                Part::Thinking { text: text.to_string(), signature: String::new() }
            } else {
                Part::Text(text.to_string())
            });
        } else if let Some(call) = part.get("functionCall") {
            calls += 1;
            parts.push(Part::ToolCall {
                id: call.get("id").and_then(Value::as_str).map_or_else(|| format!("call_{calls}"), str::to_string),
                name: call.get("name").and_then(Value::as_str).unwrap_or_default().to_string(),
                arguments: call.get("args").map_or_else(|| "{}".to_string(), Value::to_string),
            });
        }
    }
    Ok(ChatReply {
        id: body.get("responseId").and_then(Value::as_str).unwrap_or_default().to_string(),
        model: body.get("modelVersion").and_then(Value::as_str).unwrap_or(model).to_string(),
        finish: parse_finish(candidate.get("finishReason").and_then(Value::as_str).unwrap_or("STOP"), calls > 0),
        parts,
        usage: usage_of(body).unwrap_or_default(),
        logprobs: candidate.get("logprobsResult").and_then(logprobs_of),
    })
}

/// Turns Gemini's streamed `GenerateContentResponse` chunks into neutral events.
#[derive(Debug, Default)]
pub struct StreamReader {
    tool_calls: usize,
}

impl StreamReader {
    /// The events of one SSE `data:` payload.
    pub fn read(&mut self, data: &str) -> Result<Vec<ChatEvent>, String> {
        let chunk: Value = serde_json::from_str(data).map_err(|error| format!("undecodable stream chunk: {error}"))?;
        if let Some(error) = chunk.get("error") {
            return Err(format!("provider stream error: {error}"));
        }
        let mut events = Vec::new();
        if let Some(candidate) = chunk.pointer("/candidates/0") {
            if let Some(tokens) = candidate.get("logprobsResult").and_then(logprobs_of) {
                events.push(ChatEvent::Logprobs(tokens));
            }
            for part in candidate.pointer("/content/parts").and_then(Value::as_array).into_iter().flatten() {
                if let Some(text) = part.get("text").and_then(Value::as_str).filter(|text| !text.is_empty()) {
                    events.push(if is_thought(part) {
                        ChatEvent::ThinkingDelta(text.to_string())
                    } else {
                        ChatEvent::TextDelta(text.to_string())
                    });
                } else if let Some(call) = part.get("functionCall") {
                    let index = self.tool_calls;
                    self.tool_calls += 1;
                    let id = call.get("id").and_then(Value::as_str).map_or_else(|| format!("call_{}", index + 1), str::to_string);
                    events.push(ChatEvent::ToolCallStart {
                        index,
                        id,
                        name: call.get("name").and_then(Value::as_str).unwrap_or_default().to_string(),
                    });
                    events.push(ChatEvent::ToolCallDelta {
                        index,
                        arguments: call.get("args").map_or_else(|| "{}".to_string(), Value::to_string),
                    });
                }
            }
            if let Some(reason) = candidate.get("finishReason").and_then(Value::as_str) {
                events.push(ChatEvent::Finish(parse_finish(reason, self.tool_calls > 0)));
            }
        }
        if let Some(usage) = usage_of(&chunk) {
            events.push(ChatEvent::Usage(usage));
        }
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ReplyAssembler;

    #[test]
    fn requests_map_roles_tools_and_results() -> Result<(), crate::chat::InvalidRequest> {
        let request = crate::openai::parse_request(&json!({
            "model": "gemini-2.5-flash",
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "rainy"}
            ],
            "tools": [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "additionalProperties": false, "properties": {"city": {"type": "string"}}}}}],
            "max_tokens": 50
        }))?;
        let built = build_request(&request);
        assert_eq!(built["systemInstruction"], json!({"parts": [{"text": "sys"}]}));
        assert_eq!(
            built["contents"][1],
            json!({"role": "model", "parts": [{"functionCall": {"name": "weather", "args": {"city": "Oslo"}}}]})
        );
        assert_eq!(built["contents"][2]["parts"][0]["functionResponse"]["name"], "weather");
        assert!(built["tools"][0]["functionDeclarations"][0]["parameters"].get("additionalProperties").is_none());
        assert_eq!(built["generationConfig"]["maxOutputTokens"], 50);
        assert!(built["generationConfig"].get("responseMimeType").is_none());
        Ok(())
    }

    #[test]
    fn response_formats_ask_for_json_shaped_by_the_schema() -> Result<(), crate::chat::InvalidRequest> {
        let with = |format: Value| {
            crate::openai::parse_request(&json!({"model": "g", "messages": [{"role": "user", "content": "hi"}], "response_format": format}))
                .map(|request| build_request(&request)["generationConfig"].clone())
        };
        let schema = json!({"type": "object", "additionalProperties": false, "properties": {"n": {"type": "integer"}}});
        assert_eq!(
            with(json!({"type": "json_schema", "json_schema": {"name": "a", "strict": true, "schema": schema}}))?,
            json!({"responseMimeType": "application/json", "responseSchema": {"type": "object", "properties": {"n": {"type": "integer"}}}})
        );
        assert_eq!(with(json!({"type": "json_object"}))?, json!({"responseMimeType": "application/json"}));
        assert_eq!(with(json!({"type": "text"}))?, Value::Null, "nothing asked");
        Ok(())
    }

    #[test]
    fn openai_sampling_options_reach_the_generation_config() -> Result<(), crate::chat::InvalidRequest> {
        let request = crate::openai::parse_request(&json!({"model": "g", "messages": [{"role": "user", "content": "hi"}],
            "seed": 4_294_967_298_i64, "presence_penalty": 0.5, "frequency_penalty": -1, "logit_bias": {"7": 5}, "reasoning_effort": "low"}))?;
        assert_eq!(
            build_request(&request)["generationConfig"],
            json!({"seed": 2, "presencePenalty": 0.5, "frequencyPenalty": -1.0, "thinkingConfig": {"thinkingBudget": 1024}}),
            "a 64-bit seed keeps its low 32 bits; logit bias has no counterpart"
        );
        Ok(())
    }

    #[test]
    fn thinking_is_configured_from_either_client_and_its_thoughts_read() -> Result<(), String> {
        let effort = |effort: &str| -> Result<Value, String> {
            let request = crate::openai::parse_request(
                &json!({"model": "g", "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": effort}),
            )
            .map_err(|error| error.message)?;
            Ok(build_request(&request)["generationConfig"]["thinkingConfig"].clone())
        };
        assert_eq!(effort("none")?, json!({"thinkingBudget": 0}));
        assert_eq!(effort("medium")?, json!({"thinkingBudget": 8192}));
        assert_eq!(effort("high")?, json!({"thinkingBudget": 24576}));
        assert_eq!(effort("extreme")?, Value::Null, "an effort Gemini has no budget for leaves its default");
        let thinking = |config: Value| -> Result<Value, String> {
            let request = crate::anthropic::parse_request(
                &json!({"model": "g", "max_tokens": 4096, "thinking": config, "messages": [{"role": "user", "content": "hi"}]}),
            )
            .map_err(|error| error.message)?;
            Ok(build_request(&request)["generationConfig"]["thinkingConfig"].clone())
        };
        assert_eq!(thinking(json!({"type": "enabled", "budget_tokens": 2048}))?, json!({"thinkingBudget": 2048, "includeThoughts": true}));
        assert_eq!(thinking(json!({"type": "disabled"}))?, json!({"thinkingBudget": 0}));

        // Log probabilities, asked and read as OpenAI's entries.
        let request = crate::openai::parse_request(
            &json!({"model": "g", "messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 2}),
        )
        .map_err(|error| error.message)?;
        let generation = build_request(&request)["generationConfig"].clone();
        assert_eq!((&generation["responseLogprobs"], &generation["logprobs"]), (&json!(true), &json!(2)));
        let body = json!({"candidates": [{"content": {"parts": [{"text": "4"}]}, "finishReason": "STOP", "logprobsResult": {
            "chosenCandidates": [{"token": "4", "logProbability": -0.5}],
            "topCandidates": [{"candidates": [{"token": "4", "logProbability": -0.5}, {"token": "5", "logProbability": -2.0}]}]}}]});
        let four = |logprob: f64, token: &str| TopLogprob { token: token.to_string(), logprob, bytes: Some(token.as_bytes().to_vec()) };
        assert_eq!(
            parse_reply(&body, "g")?.logprobs,
            Some(vec![TokenLogprob {
                token: "4".to_string(),
                logprob: -0.5,
                bytes: Some(b"4".to_vec()),
                top_logprobs: vec![four(-0.5, "4"), four(-2.0, "5")]
            }])
        );

        // Thought summaries are thinking (no Anthropic signature), whole and streamed.
        let body = json!({"candidates": [{"content": {"parts": [{"text": "Let me add.", "thought": true}, {"text": "4"}]}, "finishReason": "STOP"}]});
        let reply = parse_reply(&body, "g")?;
        assert_eq!(
            reply.parts,
            vec![Part::Thinking { text: "Let me add.".to_string(), signature: String::new() }, Part::Text("4".to_string())]
        );
        assert_eq!(reply.text(), "4");
        let mut reader = StreamReader::default();
        let events =
            reader.read(&json!({"candidates": [{"content": {"parts": [{"text": "Hmm", "thought": true}, {"text": "4"}]}}]}).to_string())?;
        assert_eq!(events, vec![ChatEvent::ThinkingDelta("Hmm".to_string()), ChatEvent::TextDelta("4".to_string())]);
        Ok(())
    }

    #[test]
    fn replies_and_streams_are_read() -> Result<(), String> {
        let body = json!({
            "candidates": [{"content": {"role": "model", "parts": [{"text": "Hi"}, {"functionCall": {"name": "f", "args": {"a": 1}}}]}, "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 4, "totalTokenCount": 7},
            "modelVersion": "gemini-2.5-flash"
        });
        let reply = parse_reply(&body, "gemini-2.5-flash")?;
        assert_eq!(reply.finish, FinishReason::ToolCalls);
        assert_eq!(reply.usage, Usage::uncached(3, 4));
        let mut reader = StreamReader::default();
        let mut assembler = ReplyAssembler::default();
        for chunk in [
            json!({"candidates": [{"content": {"parts": [{"text": "Hel"}]}}]}),
            json!({"candidates": [{"content": {"parts": [{"text": "lo"}]}, "finishReason": "MAX_TOKENS"}], "usageMetadata": {"promptTokenCount": 2, "candidatesTokenCount": 2}}),
        ] {
            for event in reader.read(&chunk.to_string())? {
                assembler.push(&event);
            }
        }
        assert_eq!(assembler.text(), "Hello");
        assert_eq!(assembler.finish, Some(FinishReason::Length));
        assert_eq!(assembler.usage, Usage::uncached(2, 2));
        Ok(())
    }
}
