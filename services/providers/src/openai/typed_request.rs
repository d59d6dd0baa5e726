//! A client's chat completions body of the common shape, read straight into the neutral request
//! without a JSON tree. Any other shape (an invalid body included) is left to `parse_request`'s
//! reading of the tree, which keeps every rule and every error message: this reading only takes a
//! body when it reads it exactly as that one would (a differential test holds them together).

use std::borrow::Cow;

use serde::Deserialize;

use crate::chat::{ChatRequest, Message, OpenAiOptions, Part, Role, Schema, Tool, ToolChoice};
use crate::typed::{Checked, Object, from_json, positive_u32, within};

/// The neutral request of a body of the common shape; None for any other body.
pub fn read(body: &[u8]) -> Option<ChatRequest> {
    from_json::<Object<Body<'_>>>(body).ok()?.0.into_request()
}

/// The members `parse_request` reads, in the types the common shape has them, and the usual ones it
/// ignores (checked, not kept). Any other member leaves the body to the tree reading, as do the
/// members only it handles (declared as presence flags).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[expect(dead_code, reason = "the ignored options are checked, never read")]
struct Body<'a> {
    #[serde(borrow)]
    model: Cow<'a, str>,
    #[serde(borrow)]
    messages: Vec<Object<InMessage<'a>>>,
    #[serde(borrow, default)]
    tools: Option<Vec<Object<InTool<'a>>>>,
    #[serde(borrow, default)]
    tool_choice: Option<Cow<'a, str>>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<Object<StreamOptions>>,
    #[serde(borrow, default)]
    user: Option<Cow<'a, str>>,
    #[serde(default, deserialize_with = "crate::chat::presence::flag")]
    functions: bool,
    #[serde(default, deserialize_with = "crate::chat::presence::flag")]
    function_call: bool,
    #[serde(default, deserialize_with = "crate::chat::presence::flag")]
    stop: bool,
    // The gateway's own members, read from the tree by the pipeline.
    #[serde(default, deserialize_with = "crate::chat::presence::flag")]
    route: bool,
    #[serde(default, deserialize_with = "crate::chat::presence::flag")]
    x_firewall_mode: bool,
    #[serde(default, deserialize_with = "crate::chat::presence::flag")]
    conversation_id: bool,
    /// Only 1 is taken (the tree reading refuses more).
    #[serde(default)]
    n: Option<u64>,
    #[serde(default)]
    seed: Option<i64>,
    #[serde(default)]
    presence_penalty: Option<f64>,
    #[serde(default)]
    frequency_penalty: Option<f64>,
    /// Token ids as keys are the tree reading's to judge.
    #[serde(default, deserialize_with = "crate::chat::presence::flag")]
    logit_bias: bool,
    /// Some whenever the member is there, `null` included (read as absent, as the tree reading does).
    #[serde(default, deserialize_with = "crate::typed::schema")]
    response_format: Option<Schema>,
    #[serde(default)]
    parallel_tool_calls: Option<bool>,
    #[serde(borrow, default)]
    reasoning_effort: Option<Cow<'a, str>>,
    #[serde(default)]
    logprobs: Option<bool>,
    /// 0..=20 and only with `logprobs` (else left to the tree reading, which refuses it).
    #[serde(default)]
    top_logprobs: Option<u8>,
    // Options the tree reading ignores.
    #[serde(default)]
    metadata: Option<Checked>,
    #[serde(default)]
    store: Option<Checked>,
    #[serde(default)]
    service_tier: Option<Checked>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InMessage<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    /// Text content (an array of parts is left to the tree reading).
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<Object<InToolCall<'a>>>>,
    #[serde(borrow, default)]
    tool_call_id: Option<Cow<'a, str>>,
    #[serde(default, deserialize_with = "crate::chat::presence::flag")]
    function_call: bool,
    /// Checked, not read: the tree reading takes it only for a tool result without its call id,
    /// which is left to it.
    #[serde(default, rename = "name")]
    _name: Option<Checked>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InToolCall<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    function: Option<Object<InFunctionCall<'a>>>,
    #[serde(default, rename = "type")]
    _kind: Option<Checked>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InFunctionCall<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    /// JSON text (arguments given as an object are left to the tree reading).
    #[serde(borrow, default)]
    arguments: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InTool<'a> {
    #[serde(borrow, default)]
    function: Option<Object<InToolFunction<'a>>>,
    #[serde(default, rename = "type")]
    _kind: Option<Checked>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InToolFunction<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    description: Option<Cow<'a, str>>,
    /// Some whenever the member is there, `null` included (the tree reading keeps a `null`).
    #[serde(default, deserialize_with = "crate::typed::schema")]
    parameters: Option<Schema>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

fn text_parts(content: Option<Cow<'_, str>>) -> Vec<Part> {
    content.map(|text| vec![Part::Text(text.into_owned())]).unwrap_or_default()
}

impl Body<'_> {
    /// The request as `parse_request` reads it, or None where that reading could differ or fail.
    fn into_request(self) -> Option<ChatRequest> {
        if self.functions
            || self.function_call
            || self.stop
            || self.route
            || self.x_firewall_mode
            || self.conversation_id
            || self.logit_bias
        {
            return None;
        }
        // The tree reading trims the model; the pipeline records it as sent, so only a model that
        // trimming leaves alone is read here.
        if self.model.is_empty() || self.model.trim().len() != self.model.len() || self.messages.is_empty() {
            return None;
        }
        let mut system = Vec::new();
        let mut messages = Vec::with_capacity(self.messages.len());
        for Object(message) in self.messages {
            if message.function_call {
                return None;
            }
            match message.role.as_ref() {
                "system" | "developer" => system.push(message.content.map(Cow::into_owned).unwrap_or_default()),
                "user" => messages.push(Message { role: Role::User, parts: text_parts(message.content) }),
                "assistant" => {
                    let mut parts = text_parts(message.content);
                    for Object(call) in message.tool_calls.into_iter().flatten() {
                        let Object(function) = call.function?;
                        parts.push(Part::ToolCall {
                            id: call.id.map(Cow::into_owned).unwrap_or_default(),
                            name: function.name?.into_owned(),
                            arguments: function.arguments.map_or_else(|| "{}".to_string(), Cow::into_owned),
                        });
                    }
                    messages.push(Message { role: Role::Assistant, parts });
                }
                "tool" | "function" => {
                    // The tree reading takes `name` when `tool_call_id` is absent, but not when it
                    // is null; both read as None here, so neither is taken.
                    let call_id = message.tool_call_id?.into_owned();
                    let content = message.content.map(Cow::into_owned).unwrap_or_default();
                    messages.push(Message {
                        role: Role::Tool,
                        parts: vec![Part::ToolResult { call_id, content, is_error: false, media: Vec::new() }],
                    });
                }
                _ => return None,
            }
        }
        let mut tools = Vec::new();
        for Object(tool) in self.tools.into_iter().flatten() {
            let Object(function) = tool.function?;
            let name = function.name.filter(|name| !name.is_empty())?.into_owned();
            tools.push(Tool {
                name,
                description: function.description.map(Cow::into_owned),
                parameters: function.parameters.unwrap_or_else(Schema::empty_object),
            });
        }
        let tool_choice = match self.tool_choice.as_deref() {
            None => None,
            Some("auto") => Some(ToolChoice::Auto),
            Some("none") => Some(ToolChoice::None),
            Some("required") => Some(ToolChoice::Required),
            Some(_) => return None,
        };
        if self.n.is_some_and(|n| n != 1) {
            return None;
        }
        let max_tokens = match self.max_completion_tokens {
            Some(tokens) => Some(positive_u32(tokens)?),
            None => match self.max_tokens {
                Some(tokens) => Some(positive_u32(tokens)?),
                None => None,
            },
        };
        Some(ChatRequest {
            model: self.model.into_owned(),
            system: (!system.is_empty()).then(|| system.join("\n")),
            messages,
            tools,
            tool_choice,
            max_tokens,
            temperature: within(self.temperature, 0.0, 2.0)?,
            top_p: within(self.top_p, 0.0, 1.0)?,
            top_k: None,
            stop: Vec::new(),
            stream: self.stream.unwrap_or(false),
            stream_usage: self.stream_options.and_then(|Object(options)| options.include_usage).unwrap_or(false),
            user: self.user.map(Cow::into_owned),
            response_format: self.response_format.filter(|format| format.text() != "null"),
            parallel_tool_calls: self.parallel_tool_calls,
            openai: OpenAiOptions {
                seed: self.seed,
                frequency_penalty: within(self.frequency_penalty, -2.0, 2.0)?,
                presence_penalty: within(self.presence_penalty, -2.0, 2.0)?,
                logit_bias: Vec::new(),
                reasoning_effort: self.reasoning_effort.map(Cow::into_owned),
                logprobs: self.logprobs.unwrap_or(false),
                top_logprobs: match self.top_logprobs {
                    Some(count) if count > 20 || self.logprobs != Some(true) => return None,
                    count => count,
                },
            },
            cache_points: Vec::new(),
            thinking: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::read;
    use crate::openai::parse_request;
    use crate::typed::differential;

    /// Bodies the typed reading takes, and must read as the tree reading does.
    fn common() -> Vec<Value> {
        vec![
            json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}),
            json!({"model": "openai/gpt-4o-mini", "max_tokens": 16, "temperature": 0.2, "top_p": 1, "stream": true,
                   "stream_options": {"include_usage": true}, "user": "agent-7", "presence_penalty": 0.5, "n": 1,
                   "messages": [{"role": "system", "content": "be brief"}, {"role": "developer", "content": null},
                                {"role": "user", "content": "say \"hello\"\n\u{e9}", "name": "alice"}]}),
            json!({"model": "m", "max_completion_tokens": 7, "max_tokens": 0, "tool_choice": "auto",
                   "tools": [{"type": "function", "function": {"name": "lookup", "description": "finds",
                              "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}},
                             {"type": "function", "function": {"name": "bare"}},
                             {"type": "function", "function": {"name": "nulls", "description": null, "parameters": null}}],
                   "messages": [{"role": "user", "content": "use a tool"},
                                {"role": "assistant", "content": null, "tool_calls": [
                                    {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\":1}"}},
                                    {"function": {"name": "", "arguments": null}}]},
                                {"role": "tool", "tool_call_id": "call_1", "content": "found"},
                                {"role": "function", "tool_call_id": "call_2", "name": "lookup", "content": null},
                                {"role": "assistant", "content": "", "tool_calls": null}]}),
            json!({"model": "m", "tool_choice": null, "max_tokens": null, "stream_options": null, "user": null,
                   "temperature": 2, "response_format": null, "messages": [{"role": "user"}]}),
            json!({"model": "m", "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "strict": true,
                   "schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}},
                   "messages": [{"role": "user", "content": "count"}]}),
            json!({"model": "m", "response_format": {"type": "json_object"}, "messages": [{"role": "user", "content": "json"}]}),
            json!({"model": "m", "seed": -42, "frequency_penalty": -2, "presence_penalty": 1.5, "parallel_tool_calls": false,
                   "reasoning_effort": "minimal", "logprobs": true, "top_logprobs": 3, "store": false, "service_tier": "auto",
                   "messages": [{"role": "user", "content": "options"}]}),
            json!({"model": "m", "n": null, "seed": null, "frequency_penalty": null, "presence_penalty": null,
                   "parallel_tool_calls": null, "reasoning_effort": null, "messages": [{"role": "user", "content": "nulls"}]}),
        ]
    }

    /// Bodies of other shapes (and invalid ones), which the tree reading must be left to, or which
    /// read the same either way.
    fn other() -> Vec<Value> {
        vec![
            json!([]),
            json!(["gpt-4o-mini", [{"role": "user", "content": "hi"}]]),
            json!({"model": "m", "messages": [["user", "hi"]]}),
            json!({"model": " m ", "messages": [{"role": "user", "content": "hi"}]}),
            json!({"model": "", "messages": [{"role": "user", "content": "hi"}]}),
            json!({"model": null, "messages": [{"role": "user", "content": "hi"}]}),
            json!({"messages": [{"role": "user", "content": "hi"}]}),
            json!({"model": "m", "messages": []}),
            json!({"model": "m", "messages": {}}),
            json!({"model": "m", "messages": [{"content": "hi"}]}),
            json!({"model": "m", "messages": [{"role": "robot", "content": "hi"}]}),
            json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
            json!({"model": "m", "messages": [{"role": "user", "content": 5}]}),
            json!({"model": "m", "messages": [{"role": "tool", "name": "lookup", "content": "x"}]}),
            json!({"model": "m", "messages": [{"role": "tool", "tool_call_id": null, "name": "lookup", "content": "x"}]}),
            json!({"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"id": 3, "function": {"name": "f"}}]}]}),
            json!({"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"id": "c"}]}]}),
            json!({"model": "m", "messages": [{"role": "assistant", "tool_calls": [[]]}]}),
            json!({"model": "m", "messages": [{"role": "assistant", "tool_calls": {"id": "c"}}]}),
            json!({"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}]}),
            json!({"model": "m", "messages": [{"role": "assistant", "function_call": {"name": "f"}}]}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "functions": [{"name": "f"}]}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "function_call": "auto"}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "function", "function": {"name": "f"}}}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tool_choice": "sometimes"}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"function": null}]}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"function": {"name": ""}}]}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"function": {"name": "f", "description": 1}}]}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": {"function": {"name": "f"}}}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stop": ["\n"]}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "route": {"strategy": "cheapest"}}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "x_firewall_mode": "monitor"}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "conversation_id": "c-1"}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1.5}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4_294_967_296_u64}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -1, "max_tokens": 5}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 2.5}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_p": "1"}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream_options": [true]}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream_options": {"include_usage": "yes"}}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "user": 7}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 0}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 1.0}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": 1.5}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": u64::MAX}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "presence_penalty": 2.5}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "frequency_penalty": "0"}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "logit_bias": {"50256": -100}}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "logit_bias": null}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "logit_bias": {"x": 1}}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "parallel_tool_calls": "no"}),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": 1}),
        ]
    }

    #[test]
    fn common_bodies_read_typed_as_their_trees_do() -> Result<(), serde_json::Error> {
        differential::common_bodies_read_alike(read, parse_request, common())
    }

    #[test]
    fn other_bodies_are_left_to_the_tree_or_read_alike() -> Result<(), serde_json::Error> {
        differential::other_bodies_left_or_read_alike(read, parse_request, other())?;
        // Text the tree reading rejects or reads with the last of repeated members.
        for text in [&b""[..], b"  ", b"{", b"{}", b"null", br#"{"model": "m", "model": "n", "messages": [{"role": "user"}]}"#] {
            if let Some(typed) = read(text) {
                let tree: Value = serde_json::from_slice(text)?;
                assert_eq!(Ok(typed), parse_request(&tree));
            }
        }
        Ok(())
    }

    #[test]
    fn members_the_tree_reading_would_reject_are_never_skipped_unchecked() -> Result<(), serde_json::Error> {
        let body = |extra: &[u8]| [&br#"{"model": "m", "messages": [{"role": "user", "content": "hi"}], "#[..], extra, b"}"].concat();
        // Ignored options are still checked: invalid UTF-8, a lone surrogate, a number out of range.
        for extra in [
            &b"\"seed\": 1, \"metadata\": {\"a\": [1, \"x\"]}"[..],
            b"\"n\": 1e999",
            b"\"metadata\": \"\\ud800\"",
            b"\"metadata\": \"\xff\"",
        ] {
            let typed = read(&body(extra));
            let tree = serde_json::from_slice::<Value>(&body(extra));
            assert_eq!(typed.is_some(), tree.is_ok(), "{}", String::from_utf8_lossy(extra));
            if let (Some(typed), Ok(tree)) = (typed, tree) {
                assert_eq!(Ok(typed), parse_request(&tree));
            }
        }
        // A tool's schema is kept as sent, never built into a tree, and still checked the same way;
        // one nested deeper than the typed reading takes is left to the tree.
        let tool =
            |schema: &[u8]| [&br#""tools": [{"type": "function", "function": {"name": "f", "parameters": "#[..], schema, b"}}]"].concat();
        let deep = [&b"{\"a\": "[..], &b"[".repeat(70), b"1", &b"]".repeat(70), b"}"].concat();
        for schema in [
            &b"{ \"type\" : \"object\",\n  \"properties\": {\"q\": {\"type\": \"string\", \"maxLength\": 1.5e2}} }"[..],
            b"{\"maximum\": 1e999}",
            b"{\"title\": \"\\ud800\"}",
            b"{\"title\": \"caf\xff\"}",
            b"null",
            &deep,
        ] {
            let text = body(&tool(schema));
            let typed = read(&text);
            let tree = serde_json::from_slice::<Value>(&text);
            if let (Some(typed), Ok(tree)) = (&typed, &tree) {
                assert_eq!(Ok(typed.clone()), parse_request(tree));
                assert_eq!(typed.tools[0].parameters.text().as_bytes(), schema, "kept as sent");
            }
            assert_eq!(typed.is_some(), tree.is_ok() && schema != &deep[..], "{}", String::from_utf8_lossy(schema));
        }
        // A member not declared, or inside a message or a tool, leaves the body to the tree.
        assert_eq!(read(&body(b"\"unheard_of\": 1")), None);
        assert_eq!(read(br#"{"model": "m", "messages": [{"role": "user", "content": "hi", "x": 1}]}"#), None);
        assert!(read(br#"{"model": "m", "messages": [{"role": "user", "content": "hi", "name": "al"}], "tools": [{"type": "function", "function": {"name": "f"}}]}"#).is_some());
        Ok(())
    }

    #[test]
    fn arrays_never_stand_in_for_objects() {
        assert_eq!(read(br#"["m", [{"role": "user", "content": "hi"}]]"#), None);
        assert_eq!(read(br#"{"model": "m", "messages": [["user", "hi"]]}"#), None);
        assert_eq!(read(br#"{"model": "m", "messages": [{"role": "user"}], "stream_options": [true]}"#), None);
    }
}
