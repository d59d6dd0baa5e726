//! A client's messages body of the common shape, read straight into the neutral request without a
//! JSON tree: text content as a string or as blocks (text, tool use, tool results with text or
//! block content), system text or blocks, tools, a tool choice, the usual limits. Any other shape
//! (images, `stop_sequences`, the gateway's own members, an invalid body) is left to
//! `parse_request`'s reading of the tree, which keeps every rule and every error message.

use std::borrow::Cow;
use std::fmt;

use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::anthropic::{Marked, push_turn, system_text};
use crate::chat::{CacheAt, CachePoint, CacheTtl, ChatRequest, OpenAiOptions, Part, Role, Schema, Tool, ToolChoice};
use crate::typed::{Checked, Object, from_json, positive_u32, within};

/// The neutral request of a body of the common shape; None for any other body.
pub fn read(body: &[u8]) -> Option<ChatRequest> {
    from_json::<Object<Body<'_>>>(body).ok()?.0.into_request()
}

/// The members `parse_request` reads, and the usual ones it ignores (checked, not kept). Any other
/// member leaves the body to the tree reading, as do the members only it handles (presence flags).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[expect(dead_code, reason = "the ignored options are checked, never read")]
struct Body<'a> {
    #[serde(borrow)]
    model: Cow<'a, str>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(borrow)]
    messages: Vec<Object<InMessage<'a>>>,
    #[serde(borrow, default)]
    system: Option<TextOrBlocks<'a>>,
    #[serde(borrow, default)]
    tools: Option<Vec<Object<InTool<'a>>>>,
    #[serde(borrow, default)]
    tool_choice: Option<Object<InChoice<'a>>>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(borrow, default)]
    metadata: Option<Object<Metadata<'a>>>,
    #[serde(default, deserialize_with = "crate::chat::presence::flag")]
    stop_sequences: bool,
    // The gateway's own members, read from the tree by the pipeline (`user` names the agent there).
    #[serde(default, deserialize_with = "crate::chat::presence::flag")]
    user: bool,
    #[serde(default, deserialize_with = "crate::chat::presence::flag")]
    route: bool,
    #[serde(default, deserialize_with = "crate::chat::presence::flag")]
    x_firewall_mode: bool,
    #[serde(default, deserialize_with = "crate::chat::presence::flag")]
    conversation_id: bool,
    /// Positive only (the tree reading refuses 0).
    #[serde(default)]
    top_k: Option<u32>,
    // Options the tree reading ignores.
    /// Some whenever the member is there, `null` included (read as absent, as the tree reading does).
    #[serde(default, deserialize_with = "crate::typed::schema")]
    thinking: Option<Schema>,
    #[serde(default)]
    service_tier: Option<Checked>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InMessage<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(borrow, default)]
    content: Option<TextOrBlocks<'a>>,
}

/// Content as Anthropic takes it: a string, or an array of blocks.
enum TextOrBlocks<'a> {
    Text(Cow<'a, str>),
    Blocks(Vec<Object<Block<'a>>>),
}

impl<'de: 'a, 'a> Deserialize<'de> for TextOrBlocks<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Content;
        impl<'de> Visitor<'de> for Content {
            type Value = TextOrBlocks<'de>;
            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a string or an array of blocks")
            }
            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Self::Value, E> {
                Ok(TextOrBlocks::Text(Cow::Borrowed(text)))
            }
            fn visit_str<E>(self, text: &str) -> Result<Self::Value, E> {
                Ok(TextOrBlocks::Text(Cow::Owned(text.to_string())))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Self::Value, A::Error> {
                let mut blocks = Vec::with_capacity(items.size_hint().unwrap_or(1));
                while let Some(block) = items.next_element()? {
                    blocks.push(block);
                }
                Ok(TextOrBlocks::Blocks(blocks))
            }
        }
        deserializer.deserialize_any(Content)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Block<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    /// Some whenever the member is there, `null` included (the tree reading writes it out).
    #[serde(default, deserialize_with = "crate::chat::presence::value")]
    input: Option<Value>,
    #[serde(borrow, default)]
    tool_use_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<TextOrBlocks<'a>>,
    #[serde(default)]
    is_error: Option<bool>,
    #[serde(borrow, default)]
    cache_control: Option<Object<InCache<'a>>>,
    #[serde(default, rename = "citations")]
    _citations: Option<Checked>,
    #[serde(borrow, default)]
    thinking: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    signature: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    data: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InTool<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    description: Option<Cow<'a, str>>,
    /// Some whenever the member is there, `null` included (the tree reading keeps a `null`).
    #[serde(default, deserialize_with = "crate::typed::schema")]
    input_schema: Option<Schema>,
    #[serde(default, rename = "type")]
    _kind: Option<Checked>,
    #[serde(borrow, default)]
    cache_control: Option<Object<InCache<'a>>>,
}

/// `cache_control` as the tree reading takes it: `ephemeral`, with an optional ttl.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InCache<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    ttl: Option<Cow<'a, str>>,
}

/// A block's breakpoint as `anthropic::cache_control` reads it: Some(None) for no breakpoint; None
/// where that reading refuses it.
fn breakpoint(cache: Option<Object<InCache<'_>>>) -> Option<Option<Option<CacheTtl>>> {
    match cache {
        None => Some(None),
        Some(Object(cache)) if cache.kind == "ephemeral" => match cache.ttl {
            None => Some(Some(None)),
            Some(ttl) => CacheTtl::parse(&ttl).map(|ttl| Some(Some(ttl))),
        },
        Some(_) => None,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InChoice<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(default)]
    disable_parallel_tool_use: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Metadata<'a> {
    #[serde(borrow, default)]
    user_id: Option<Cow<'a, str>>,
}

/// The parts of some content, as the tree reading's `blocks` makes them; None where it could differ.
fn content_parts(content: Option<TextOrBlocks<'_>>) -> Option<Vec<Marked>> {
    let blocks = match content {
        None => return Some(Vec::new()),
        Some(TextOrBlocks::Text(text)) => return Some(vec![Part::Text(text.into_owned()).into()]),
        Some(TextOrBlocks::Blocks(blocks)) => blocks,
    };
    let mut parts = Vec::with_capacity(blocks.len());
    for Object(block) in blocks {
        let cache = breakpoint(block.cache_control)?;
        let part = match block.kind.as_ref() {
            "text" => Part::Text(block.text.map(Cow::into_owned).unwrap_or_default()),
            "tool_use" => Part::ToolCall {
                id: block.id.map(Cow::into_owned).unwrap_or_default(),
                name: block.name.map(Cow::into_owned).unwrap_or_default(),
                arguments: block.input.map_or_else(|| "{}".to_string(), |input| input.to_string()),
            },
            "thinking" => Part::Thinking {
                text: block.thinking.map(Cow::into_owned).unwrap_or_default(),
                signature: block.signature.map(Cow::into_owned).unwrap_or_default(),
            },
            "redacted_thinking" => Part::RedactedThinking { data: block.data.map(Cow::into_owned).unwrap_or_default() },
            "tool_result" => {
                // Breakpoints inside a tool result's content are not kept (as the tree reading).
                let nested = content_parts(block.content)?.into_iter().map(|block| block.part).collect();
                Part::tool_result(block.tool_use_id.map(Cow::into_owned).unwrap_or_default(), nested, block.is_error.unwrap_or(false))
            }
            // Images and documents (a source to rebuild) are left to the tree reading, as are other
            // kinds (which it refuses).
            _ => return None,
        };
        parts.push(Marked { part, cache });
    }
    Some(parts)
}

impl Body<'_> {
    /// The request as `parse_request` reads it, or None where that reading could differ or fail.
    fn into_request(self) -> Option<ChatRequest> {
        if self.stop_sequences || self.user || self.route || self.x_firewall_mode || self.conversation_id {
            return None;
        }
        // The tree reading trims the model; the pipeline records it as sent, so only a model that
        // trimming leaves alone is read here.
        if self.model.is_empty() || self.model.trim().len() != self.model.len() || self.messages.is_empty() {
            return None;
        }
        let max_tokens = positive_u32(self.max_tokens?)?;
        let mut messages = Vec::with_capacity(self.messages.len());
        let mut cache_points = Vec::new();
        for Object(message) in self.messages {
            let role = match message.role.as_ref() {
                "user" => Role::User,
                "assistant" => Role::Assistant,
                _ => return None,
            };
            push_turn(&mut messages, &mut cache_points, role, content_parts(message.content)?);
        }
        let system = match self.system {
            None => None,
            Some(TextOrBlocks::Text(text)) => Some(text.into_owned()),
            Some(blocks) => Some(system_text(content_parts(Some(blocks))?, &mut cache_points)),
        };
        let mut tools = Vec::new();
        for (index, Object(tool)) in self.tools.into_iter().flatten().enumerate() {
            if let Some(ttl) = breakpoint(tool.cache_control)? {
                cache_points.push(CachePoint { at: CacheAt::Tool(index), ttl });
            }
            tools.push(Tool {
                name: tool.name.filter(|name| !name.is_empty())?.into_owned(),
                description: tool.description.map(Cow::into_owned),
                parameters: tool.input_schema.unwrap_or_else(Schema::empty_object),
            });
        }
        let mut parallel_tool_calls = None;
        let tool_choice = match self.tool_choice {
            None => None,
            Some(Object(choice)) => {
                parallel_tool_calls = choice.disable_parallel_tool_use.map(|disable| !disable);
                Some(match choice.kind?.as_ref() {
                    "auto" => ToolChoice::Auto,
                    "any" => ToolChoice::Required,
                    "none" => ToolChoice::None,
                    "tool" => ToolChoice::Named(choice.name.map(Cow::into_owned).unwrap_or_default()),
                    _ => return None,
                })
            }
        };
        Some(ChatRequest {
            model: self.model.into_owned(),
            system,
            messages,
            tools,
            tool_choice,
            max_tokens: Some(max_tokens),
            temperature: within(self.temperature, 0.0, 1.0)?,
            top_p: within(self.top_p, 0.0, 1.0)?,
            top_k: match self.top_k {
                Some(0) => return None,
                top_k => top_k,
            },
            stop: Vec::new(),
            stream: self.stream.unwrap_or(false),
            stream_usage: true,
            user: self.metadata.and_then(|Object(metadata)| metadata.user_id).map(Cow::into_owned),
            response_format: None,
            parallel_tool_calls,
            openai: OpenAiOptions::default(),
            cache_points,
            thinking: self.thinking.filter(|thinking| thinking.text() != "null"),
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::read;
    use crate::anthropic::parse_request;
    use crate::typed::differential;

    /// Bodies the typed reading takes, and must read as the tree reading does.
    fn common() -> Vec<Value> {
        vec![
            json!({"model": "claude-haiku-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}),
            json!({"model": "anthropic/claude", "max_tokens": 1024, "stream": true, "temperature": 1, "top_p": 0.5, "top_k": 5,
                   "metadata": {"user_id": "agent-7"}, "thinking": {"type": "enabled", "budget_tokens": 1024},
                   "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "and kind"}],
                   "messages": [{"role": "user", "content": [{"type": "text", "text": "say \"hello\"\n\u{e9}", "cache_control": {"type": "ephemeral"}}]},
                                {"role": "assistant", "content": "hello"}]}),
            json!({"model": "m", "max_tokens": 7, "tool_choice": {"type": "auto", "disable_parallel_tool_use": true}, "system": "sys",
                   "tools": [{"name": "lookup", "description": "finds", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}},
                             {"name": "bare"}, {"name": "nulls", "description": null, "input_schema": null, "cache_control": {"type": "ephemeral"}}],
                   "messages": [{"role": "user", "content": "use a tool"},
                                {"role": "assistant", "content": [{"type": "text", "text": "looking"},
                                                                  {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"q": "x", "a": [1]}},
                                                                  {"type": "tool_use", "id": "t2", "name": "lookup", "input": null},
                                                                  {"type": "tool_use"}]},
                                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "found"},
                                                             {"type": "tool_result", "tool_use_id": "t2", "is_error": true,
                                                              "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                                                             {"type": "tool_result", "content": null},
                                                             {"type": "text", "text": "thanks"}]},
                                {"role": "assistant", "content": null},
                                {"role": "assistant", "content": [{"type": "thinking", "text": "hm"}]}]}),
            json!({"model": "m", "max_tokens": 3, "tool_choice": {"type": "tool", "name": "f"}, "metadata": null, "temperature": null,
                   "messages": [{"role": "user", "content": ""}]}),
            json!({"model": "m", "max_tokens": 3, "tool_choice": {"type": "any"}, "messages": [{"role": "user", "content": []}]}),
            json!({"model": "m", "max_tokens": 3, "tool_choice": {"type": "any", "disable_parallel_tool_use": false},
                   "messages": [{"role": "user", "content": "x"}]}),
            json!({"model": "m", "max_tokens": 3, "tool_choice": {"type": "none", "disable_parallel_tool_use": null},
                   "messages": [{"role": "user", "content": "x"}]}),
            // Extended thinking: the configuration as sent, signed and redacted thinking kept.
            json!({"model": "m", "max_tokens": 4096, "thinking": {"type": "enabled", "budget_tokens": 2048},
                   "messages": [{"role": "user", "content": "think"},
                                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm \"so\"", "signature": "sig=="},
                                                                  {"type": "redacted_thinking", "data": "enc"},
                                                                  {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r"}]}]}),
            json!({"model": "m", "max_tokens": 9, "thinking": null, "messages": [{"role": "user", "content": "x"}]}),
            // Prompt cache breakpoints wherever Anthropic takes them (and null as none).
            json!({"model": "m", "max_tokens": 9,
                   "system": [{"type": "text", "text": "one", "cache_control": {"type": "ephemeral", "ttl": "1h"}}, {"type": "text", "text": "two"}],
                   "tools": [{"name": "a", "cache_control": null}, {"name": "b", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}],
                   "messages": [{"role": "user", "content": [{"type": "text", "text": "q", "cache_control": {"type": "ephemeral", "ttl": "5m"}}]},
                                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "b", "input": {}, "cache_control": {"type": "ephemeral"}}]},
                                {"role": "user", "content": [{"type": "text", "text": "also"},
                                                             {"type": "tool_result", "tool_use_id": "t1", "cache_control": {"type": "ephemeral", "ttl": null},
                                                              "content": [{"type": "text", "text": "r", "cache_control": {"type": "ephemeral"}}]},
                                                             {"type": "thinking", "text": "x", "cache_control": {"type": "ephemeral"}}]}]}),
        ]
    }

    /// Bodies of other shapes (and invalid ones), which the tree reading must be left to, or which
    /// read the same either way.
    fn other() -> Vec<Value> {
        let hi = json!([{"role": "user", "content": "hi"}]);
        let with = |member: &str, value: Value| {
            let mut body = json!({"model": "m", "max_tokens": 5, "messages": hi.clone()});
            body[member] = value;
            body
        };
        vec![
            json!([]),
            json!({"model": "m", "messages": hi.clone()}),
            json!({"model": " m ", "max_tokens": 5, "messages": hi.clone()}),
            json!({"model": "m", "max_tokens": 5, "messages": []}),
            with("max_tokens", json!(0)),
            with("max_tokens", json!(null)),
            with("max_tokens", json!(2.5)),
            with("messages", json!([{"role": "system", "content": "x"}])),
            with("messages", json!([{"role": "user", "content": 5}])),
            with("messages", json!([{"role": "user", "content": ["hi"]}])),
            with("messages", json!([{"role": "user", "content": [{"text": "no type"}]}])),
            with("messages", json!([{"role": "user", "content": [{"type": "text", "text": 5}]}])),
            with("messages", json!([{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x"}}]}])),
            with("messages", json!([{"role": "user", "content": [{"type": "tool_result", "content": 5}]}])),
            with("messages", json!([{"role": "user", "content": [{"type": "tool_result", "is_error": "yes"}]}])),
            with("messages", json!([{"role": "assistant", "content": [{"type": "tool_use", "id": 1}]}])),
            with("messages", json!([{"role": "user", "content": "hi", "name": "al"}])),
            with("system", json!(5)),
            with("system", json!([{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}])),
            with("tools", json!([{"description": "no name"}])),
            with("tools", json!([{"name": ""}])),
            with("tools", json!([{"name": "f", "description": 1}])),
            with("tools", json!({"name": "f"})),
            with("tools", json!([{"type": "web_search_20250305", "name": "web_search", "max_uses": 5}])),
            with("tool_choice", json!("auto")),
            with("tool_choice", json!({"name": "f"})),
            with("tool_choice", json!({"type": "sometimes"})),
            with("tool_choice", json!({"type": "auto", "disable_parallel_tool_use": "yes"})),
            with(
                "messages",
                json!([{"role": "user", "content": [{"type": "text", "text": "q", "cache_control": {"type": "persistent"}}]}]),
            ),
            with(
                "messages",
                json!([{"role": "user", "content": [{"type": "text", "text": "q", "cache_control": {"type": "ephemeral", "ttl": "2h"}}]}]),
            ),
            with("messages", json!([{"role": "user", "content": [{"type": "text", "text": "q", "cache_control": "ephemeral"}]}])),
            with(
                "messages",
                json!([{"role": "user", "content": [{"type": "text", "text": "q", "cache_control": {"type": "ephemeral", "scope": "x"}}]}]),
            ),
            with("tools", json!([{"name": "f", "cache_control": {"type": "ephemeral", "ttl": 60}}])),
            with("system", json!([{"type": "text", "text": "s", "cache_control": {}}])),
            with("messages", json!([{"role": "assistant", "content": [{"type": "thinking", "thinking": 5, "signature": "s"}]}])),
            with("messages", json!([{"role": "assistant", "content": [{"type": "redacted_thinking", "data": ["x"]}]}])),
            with("temperature", json!(1.5)),
            with("top_p", json!("1")),
            with("stream", json!("yes")),
            with("stop_sequences", json!(["\n"])),
            with("metadata", json!("agent")),
            with("metadata", json!({"user_id": 7})),
            with("user", json!("agent-7")),
            with("route", json!({"strategy": "cheapest"})),
            with("x_firewall_mode", json!("monitor")),
            with("conversation_id", json!("c-1")),
            with("unheard_of", json!(1)),
        ]
    }

    #[test]
    fn common_bodies_read_typed_as_their_trees_do() -> Result<(), serde_json::Error> {
        differential::common_bodies_read_alike(read, parse_request, common())
    }

    #[test]
    fn other_bodies_are_left_to_the_tree_or_read_alike() -> Result<(), serde_json::Error> {
        differential::other_bodies_left_or_read_alike(read, parse_request, other())?;
        // Members the tree reading would reject are never skipped unchecked.
        let body = |extra: &[u8]| {
            [&br#"{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "#[..], extra, b"}"].concat()
        };
        for extra in [&b"\"top_k\": 1e999"[..], b"\"thinking\": \"\\ud800\"", b"\"service_tier\": \"\xff\""] {
            assert!(serde_json::from_slice::<Value>(&body(extra)).is_err());
            assert_eq!(read(&body(extra)), None);
        }
        // A tool's input schema is kept as sent and checked as the tree reading checks it.
        let tool = |schema: &[u8]| [&br#""tools": [{"name": "f", "input_schema": "#[..], schema, b"}]"].concat();
        for schema in [
            &b"{ \"type\": \"object\",\n  \"properties\": {\"n\": {\"type\": \"number\", \"maximum\": 2.5E3, \"title\": \"\\u00e9\\ud83d\\ude00\"}} }"[..],
            b"{\"maximum\": 1e999}",
            b"{\"title\": \"\\udc00\"}",
        ] {
            let text = body(&tool(schema));
            let tree = serde_json::from_slice::<Value>(&text);
            let typed = read(&text);
            assert_eq!(typed.is_some(), tree.is_ok(), "{}", String::from_utf8_lossy(schema));
            if let (Some(typed), Ok(tree)) = (typed, tree) {
                assert_eq!(typed.tools[0].parameters.text().as_bytes(), schema, "kept as sent");
                assert_eq!(Ok(typed), parse_request(&tree));
            }
        }
        Ok(())
    }

    #[test]
    fn arrays_never_stand_in_for_objects() {
        assert_eq!(read(br#"["m", 5, [{"role": "user", "content": "hi"}]]"#), None);
        assert_eq!(read(br#"{"model": "m", "max_tokens": 5, "messages": [["user", "hi"]]}"#), None);
        assert_eq!(read(br#"{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [["text", "hi"]]}]}"#), None);
    }
}
