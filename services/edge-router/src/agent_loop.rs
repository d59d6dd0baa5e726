//! `mode: agentic`: the agent loop with the tenant's core memory. The memory's core facts are loaded
//! into the system prompt; a key that may write memory also offers the model three memory tools
//! (`brainstorm_memory_append`, `_replace`, `_delete`), whose calls the gateway runs itself and
//! answers back to the model, up to [`MAX_STEPS`] upstream calls in all, before the answer goes to
//! the client. Calls to the client's own tools end the loop and reach the client as usual.
//! `X-BR-Skip-Memory: true` skips reading and writing memory (the request is then proxied as sent).

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use brainstorm_common::ApiError;
use brainstorm_prompts_eval::memory::BLOCKS;
use brainstorm_proto::prompts::{AddMemoryRequest, MemoryEntry, MemoryEntryRef, MemoryKey, MemoryQuery, UpdateMemoryRequest};
use brainstorm_providers::chat::{ChatReply, ChatRequest, FinishReason, Message, Part, Role, Schema, Tool, Usage};
use serde_json::{Value, json};

use crate::EdgeState;
use crate::auth::Caller;
use crate::header_value;
use crate::routes::prompts::client;

/// The most upstream calls one agentic request makes (the last is offered no memory tools, so
/// the model answers).
pub const MAX_STEPS: u32 = 4;
/// The most memory calls run from one reply; further ones are answered with an error.
const MAX_CALLS_PER_STEP: usize = 8;

const APPEND: &str = "brainstorm_memory_append";
const REPLACE: &str = "brainstorm_memory_replace";
const DELETE: &str = "brainstorm_memory_delete";
/// The memory tools' names.
const MEMORY_TOOLS: [&str; 3] = [APPEND, REPLACE, DELETE];

/// How a completion is served (`mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Proxied as sent (`mode` omitted, null or `proxy`).
    Proxy,
    /// Through the agent loop (`mode: agentic`).
    Agentic,
}

impl Mode {
    /// The body's `mode` member; anything but `agentic` or `proxy` is 400 `invalid_mode`.
    pub fn of(member: Option<&Value>) -> Result<Mode, ApiError> {
        match member {
            None | Some(Value::Null) => Ok(Mode::Proxy),
            Some(Value::String(mode)) if mode == "proxy" => Ok(Mode::Proxy),
            Some(Value::String(mode)) if mode == "agentic" => Ok(Mode::Agentic),
            Some(other) => Err(ApiError::invalid_request("invalid_mode", format!("mode {other} is not `agentic` or `proxy`"))),
        }
    }
}

/// Whether the request asks to skip memory (`X-BR-Skip-Memory: true`).
fn skips_memory(headers: &HeaderMap) -> bool {
    headers
        .get(const { HeaderName::from_static("x-br-skip-memory") })
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.trim().eq_ignore_ascii_case("true"))
}

/// One agentic request's loop: whose memory, what it loaded, and what the loop did.
#[derive(Debug)]
pub struct AgentLoop {
    /// The memory the loop reads and writes; None when the request skips memory.
    memory: Option<LoadedMemory>,
    /// The client asked for a stream: the loop runs whole replies and the last is streamed.
    stream: bool,
    /// Upstream calls made so far.
    steps: u32,
    /// Memory calls that changed memory.
    writes: u32,
}

#[derive(Debug)]
struct LoadedMemory {
    key: MemoryKey,
    /// The key the writes are attributed to, and why (the request id).
    actor: String,
    reason: String,
    /// How many core facts were loaded.
    loaded: usize,
    /// The key may write memory: the model was offered the memory tools.
    writable: bool,
}

impl AgentLoop {
    /// Loads the tenant's core memory into the request's system prompt and, for a key with
    /// `memory.write`, offers the model the memory tools (400 `reserved_tool_name` when the request
    /// declares a tool of theirs). Reading memory needs `memory.read`. The loop runs whole replies: a
    /// streamed request is answered by streaming the final one.
    pub async fn prepare(
        state: &EdgeState,
        caller: &Caller,
        request_id: &str,
        headers: &HeaderMap,
        chat: &mut ChatRequest,
    ) -> Result<AgentLoop, ApiError> {
        let stream = std::mem::replace(&mut chat.stream, false);
        if skips_memory(headers) {
            return Ok(AgentLoop { memory: None, stream, steps: 0, writes: 0 });
        }
        caller.require("memory.read")?;
        let writable = caller.require("memory.write").is_ok();
        if writable && let Some(tool) = chat.tools.iter().find(|tool| MEMORY_TOOLS.contains(&tool.name.as_str())) {
            return Err(ApiError::invalid_request(
                "reserved_tool_name",
                format!("tool `{}` is the agent loop's own: rename the tool or send the request without mode agentic", tool.name),
            ));
        }
        let key = MemoryKey { tenant_id: caller.tenant_id()?.to_string(), memory_key: String::new() };
        let view =
            client(state)?.list_memory(MemoryQuery { key: Some(key.clone()), block: String::new(), include_archival: false }).await?;
        let prompt = memory_prompt(&view.entries, writable);
        chat.system = Some(match chat.system.take() {
            Some(system) if !system.trim().is_empty() => format!("{system}\n\n{prompt}"),
            _ => prompt,
        });
        if writable {
            chat.tools.extend(memory_tools());
        }
        let memory = LoadedMemory {
            key,
            actor: caller.identity.key_id.clone(),
            reason: format!("agent loop: {request_id}"),
            loaded: view.entries.len(),
            writable,
        };
        Ok(AgentLoop { memory: Some(memory), stream, steps: 0, writes: 0 })
    }

    /// How many upstream calls the loop may make: its reservation is this many times one call's.
    pub fn step_bound(&self) -> u32 {
        if self.memory.as_ref().is_some_and(|memory| memory.writable) { MAX_STEPS } else { 1 }
    }

    /// The client asked for a stream.
    pub fn streams(&self) -> bool {
        self.stream
    }

    /// Counts an upstream call.
    pub fn stepped(&mut self) {
        self.steps += 1;
    }

    /// Whether the loop goes on after `reply`: it calls memory tools and only them, and a step is left.
    pub fn continues(&self, reply: &ChatReply) -> bool {
        let writable = self.memory.as_ref().is_some_and(|memory| memory.writable);
        let mut calls = tool_calls(reply).peekable();
        writable && self.steps < MAX_STEPS && calls.peek().is_some() && calls.all(|(_, name, _)| is_memory_tool(name))
    }

    /// Runs `reply`'s memory calls and adds the exchange to the conversation: the reply as the
    /// assistant's turn, the calls' results after it. The last step is offered no memory tools.
    pub async fn answer_calls(&mut self, state: &EdgeState, chat: &mut ChatRequest, reply: &ChatReply) {
        let results = self.run_calls(state, reply).await;
        chat.messages.push(Message { role: Role::Assistant, parts: reply.parts.clone() });
        chat.messages.push(Message { role: Role::Tool, parts: results });
        if self.steps + 1 >= MAX_STEPS {
            chat.tools.retain(|tool| !is_memory_tool(&tool.name));
            if chat.tools.is_empty() {
                chat.tool_choice = None;
                chat.parallel_tool_calls = None;
            }
        }
    }

    /// Runs the final reply's memory calls (made beside calls to the client's tools, or past the
    /// last step) unless the guardian blocked the reply, and takes them out of it: the client sees
    /// only its own tools' calls.
    pub async fn finish(&mut self, state: &EdgeState, reply: &mut ChatReply) {
        if tool_calls(reply).all(|(_, name, _)| !is_memory_tool(name)) {
            return;
        }
        if reply.finish != FinishReason::ContentFilter {
            self.run_calls(state, reply).await;
        }
        reply.parts.retain(|part| !matches!(part, Part::ToolCall { name, .. } if is_memory_tool(name)));
        if reply.finish == FinishReason::ToolCalls && tool_calls(reply).next().is_none() {
            reply.finish = FinishReason::Stop;
        }
    }

    /// The memory calls' results, as tool-result parts in the calls' order.
    async fn run_calls(&mut self, state: &EdgeState, reply: &ChatReply) -> Vec<Part> {
        let mut results = Vec::new();
        for (index, (id, name, arguments)) in tool_calls(reply).filter(|(_, name, _)| is_memory_tool(name)).enumerate() {
            let outcome = if index >= MAX_CALLS_PER_STEP {
                Err(format!("at most {MAX_CALLS_PER_STEP} memory calls are run from one reply"))
            } else {
                self.run_call(state, name, arguments).await
            };
            if outcome.is_ok() {
                self.writes += 1;
            }
            let (content, is_error) = match outcome {
                Ok(answer) => (answer.to_string(), false),
                Err(message) => (json!({"error": message}).to_string(), true),
            };
            results.push(Part::ToolResult { call_id: id.to_string(), content, is_error, media: Vec::new() });
        }
        results
    }

    /// One memory call: its answer, or why it failed (told to the model, which may try again).
    async fn run_call(&self, state: &EdgeState, name: &str, arguments: &str) -> Result<Value, String> {
        let memory = self.memory.as_ref().filter(|memory| memory.writable).ok_or("this key may not write memory")?;
        let arguments: Value = serde_json::from_str(arguments).map_err(|error| format!("the arguments are not JSON: {error}"))?;
        let text = |member: &str| arguments.get(member).and_then(Value::as_str).map(str::to_string);
        let required = |member: &str| text(member).ok_or_else(|| format!("`{member}` (a string) is required"));
        let prompts = client(state).map_err(|error| error.message.clone())?;
        let key = Some(memory.key.clone());
        let (actor, reason) = (memory.actor.clone(), memory.reason.clone());
        match name {
            APPEND => {
                let request = AddMemoryRequest {
                    key,
                    fact: required("fact")?,
                    block: text("block").unwrap_or_default(),
                    pinned: false,
                    actor,
                    reason,
                };
                let added = prompts.add_memory(request).await.map_err(|error| error.message)?;
                let evicted: Vec<&str> = added.evicted.iter().map(|entry| entry.id.as_str()).collect();
                Ok(json!({"appended": added.entry.as_ref().map(entry_view), "evicted_to_archival": evicted}))
            }
            REPLACE => {
                let request = UpdateMemoryRequest { key, id: required("entry_id")?, fact: Some(required("fact")?), pinned: None, actor };
                let entry = prompts.update_memory(request).await.map_err(|error| error.message)?;
                Ok(json!({"replaced": entry_view(&entry)}))
            }
            _ => {
                let entry =
                    prompts.delete_memory(MemoryEntryRef { key, id: required("entry_id")?, actor }).await.map_err(|error| error.message)?;
                Ok(json!({"deleted": entry.id}))
            }
        }
    }

    /// What the loop did, for the answer's headers: `X-BR-Agent-Mode`, `X-BR-Agent-Steps`,
    /// `X-BR-Memory-Loaded` (core facts in the prompt; absent when memory was skipped) and
    /// `X-BR-Memory-Writes`.
    pub fn headers(&self, headers: &mut HeaderMap) {
        headers.insert(const { HeaderName::from_static("x-br-agent-mode") }, HeaderValue::from_static("agentic"));
        headers.insert(const { HeaderName::from_static("x-br-agent-steps") }, HeaderValue::from(self.steps));
        if let Some(memory) = &self.memory {
            headers.insert(const { HeaderName::from_static("x-br-memory-loaded") }, HeaderValue::from(memory.loaded));
            headers.insert(const { HeaderName::from_static("x-br-memory-writes") }, HeaderValue::from(self.writes));
        } else if let Some(skipped) = header_value::fixed("skipped") {
            headers.insert(const { HeaderName::from_static("x-br-memory") }, skipped);
        }
    }

    /// What the loop did, for the audit record's routing reason.
    pub fn summary(&self) -> String {
        match &self.memory {
            Some(memory) => {
                format!("agentic: {} steps, {} core facts loaded, {} memory writes", self.steps, memory.loaded, self.writes)
            }
            None => format!("agentic: {} steps, memory skipped", self.steps),
        }
    }
}

/// Adds a step's token counts to the loop's.
pub fn add_usage(total: &mut Usage, step: Usage) {
    total.input_tokens += step.input_tokens;
    total.output_tokens += step.output_tokens;
    total.cache_read_tokens += step.cache_read_tokens;
    total.cache_write_tokens += step.cache_write_tokens;
    total.cache_write_long_tokens += step.cache_write_long_tokens;
}

fn is_memory_tool(name: &str) -> bool {
    MEMORY_TOOLS.contains(&name)
}

/// A reply's tool calls: id, name, arguments.
fn tool_calls(reply: &ChatReply) -> impl Iterator<Item = (&str, &str, &str)> {
    reply.parts.iter().filter_map(|part| match part {
        Part::ToolCall { id, name, arguments } => Some((id.as_str(), name.as_str(), arguments.as_str())),
        _ => None,
    })
}

fn entry_view(entry: &MemoryEntry) -> Value {
    json!({"id": entry.id, "block": entry.block, "fact": entry.fact})
}

/// The system prompt's memory section: every core fact by block, with its id (which the replace and
/// delete tools take), and how to keep it when the model may.
fn memory_prompt(entries: &[MemoryEntry], writable: bool) -> String {
    let mut prompt = String::from(
        "You have a long-term core memory: facts kept across conversations, by block (human: the people you work with; \
         project: the work; system: how you should behave; general: the rest).\n<core_memory>\n",
    );
    for (block, _) in BLOCKS {
        prompt.push_str(&format!("<block name=\"{block}\">\n"));
        for entry in entries.iter().filter(|entry| entry.block == block) {
            prompt.push_str(&format!("[{}] {}\n", entry.id, entry.fact.replace('\n', " ")));
        }
        prompt.push_str("</block>\n");
    }
    prompt.push_str("</core_memory>\n");
    if writable {
        prompt.push_str(&format!(
            "Keep it current: call {APPEND} to remember a new durable fact, {REPLACE} to correct a fact by its id, {DELETE} to \
             forget one. Do not mention these tools or the ids to the user."
        ));
    } else {
        prompt.push_str("The memory is read-only here.");
    }
    prompt
}

/// The memory tools offered to the model.
fn memory_tools() -> Vec<Tool> {
    let tool = |name: &str, description: &str, parameters: Value| Tool {
        name: name.to_string(),
        description: Some(description.to_string()),
        parameters: Schema::from(parameters),
    };
    let fact = json!({"type": "string", "description": "One short, self-contained sentence."});
    let entry_id = json!({"type": "string", "description": "The fact's id, as core memory shows it in brackets."});
    vec![
        tool(
            APPEND,
            "Remember a new durable fact in core memory.",
            json!({"type": "object", "properties": {
                "block": {"type": "string", "enum": BLOCKS.map(|(block, _)| block)},
                "fact": fact,
            }, "required": ["fact"]}),
        ),
        tool(
            REPLACE,
            "Replace a core memory fact that is wrong or out of date.",
            json!({"type": "object", "properties": {"entry_id": entry_id, "fact": fact}, "required": ["entry_id", "fact"]}),
        ),
        tool(
            DELETE,
            "Forget a core memory fact.",
            json!({"type": "object", "properties": {"entry_id": entry_id}, "required": ["entry_id"]}),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(calls: &[(&str, &str)]) -> ChatReply {
        ChatReply {
            id: "r".into(),
            model: "m".into(),
            parts: calls
                .iter()
                .enumerate()
                .map(|(index, (name, arguments))| Part::ToolCall {
                    id: format!("call_{index}"),
                    name: name.to_string(),
                    arguments: arguments.to_string(),
                })
                .collect(),
            finish: FinishReason::ToolCalls,
            usage: Usage::default(),
            logprobs: None,
        }
    }

    fn agent(writable: bool, steps: u32) -> AgentLoop {
        let memory = LoadedMemory {
            key: MemoryKey { tenant_id: "t".into(), memory_key: String::new() },
            actor: "k".into(),
            reason: "r".into(),
            loaded: 0,
            writable,
        };
        AgentLoop { memory: Some(memory), stream: false, steps, writes: 0 }
    }

    #[test]
    fn mode_is_agentic_proxy_or_refused() {
        assert_eq!(Mode::of(None).ok(), Some(Mode::Proxy));
        assert_eq!(Mode::of(Some(&Value::Null)).ok(), Some(Mode::Proxy));
        assert_eq!(Mode::of(Some(&json!("proxy"))).ok(), Some(Mode::Proxy));
        assert_eq!(Mode::of(Some(&json!("agentic"))).ok(), Some(Mode::Agentic));
        for bad in [json!("Agentic"), json!(true), json!({"mode": "agentic"})] {
            let code = Mode::of(Some(&bad)).err().and_then(|error| error.code.clone());
            assert_eq!(code.as_deref(), Some("invalid_mode"), "{bad}");
        }
    }

    #[test]
    fn the_loop_goes_on_only_through_memory_calls_and_steps_left() {
        let memory_only = reply(&[(APPEND, "{}"), (DELETE, "{}")]);
        assert!(agent(true, 1).continues(&memory_only));
        assert!(!agent(true, MAX_STEPS).continues(&memory_only), "no step left");
        assert!(!agent(false, 1).continues(&memory_only), "a read-only key was offered no memory tools");
        assert!(!agent(true, 1).continues(&reply(&[(APPEND, "{}"), ("search", "{}")])), "the client's tool ends the loop");
        assert!(!agent(true, 1).continues(&reply(&[])), "an answer ends the loop");
    }

    #[test]
    fn the_prompt_lists_every_fact_by_block_with_its_id() {
        let entry = |id: &str, block: &str, fact: &str| MemoryEntry {
            id: id.into(),
            block: block.into(),
            fact: fact.into(),
            ..MemoryEntry::default()
        };
        let prompt = memory_prompt(&[entry("e1", "human", "Ada prefers tea"), entry("e2", "project", "Ships\nFridays")], true);
        assert!(prompt.contains("<block name=\"human\">\n[e1] Ada prefers tea\n</block>"), "{prompt}");
        assert!(prompt.contains("[e2] Ships Fridays\n"), "one line per fact: {prompt}");
        assert!(prompt.contains(APPEND) && prompt.contains(REPLACE) && prompt.contains(DELETE));
        assert!(memory_prompt(&[], false).ends_with("The memory is read-only here."));
    }

    #[test]
    fn the_memory_tools_have_object_schemas_with_their_required_members() {
        let tools = memory_tools();
        assert_eq!(tools.iter().map(|tool| tool.name.as_str()).collect::<Vec<_>>(), MEMORY_TOOLS);
        for tool in &tools {
            let schema = tool.parameters.to_value();
            assert_eq!(schema["type"], "object", "{}", tool.name);
            assert!(schema["required"].as_array().is_some_and(|required| !required.is_empty()), "{}", tool.name);
        }
    }

    #[test]
    fn step_usage_adds_up() {
        let mut total = Usage::uncached(10, 2);
        add_usage(&mut total, Usage { cache_read_tokens: 4, ..Usage::uncached(12, 3) });
        assert_eq!(total, Usage { cache_read_tokens: 4, ..Usage::uncached(22, 5) });
    }
}
