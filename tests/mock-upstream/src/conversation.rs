//! The provider-neutral core: what a request asks, the deterministic reply, and the order of stream steps.

use std::ops::Range;

/// Which API a request speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Provider {
    OpenAi,
    Anthropic,
    Gemini,
}

impl Provider {
    pub fn name(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
            Provider::Gemini => "gemini",
        }
    }
}

/// What the mock reads from a request, whatever its format.
#[derive(Debug, Default)]
pub(crate) struct Prompt {
    /// Whitespace-separated words across the system prompt and every message text.
    pub input_words: u64,
    /// The text of the last user message that has text.
    pub last_user_text: String,
    /// The conversation ends with a tool result (the mock then answers in text, so tool loops end).
    pub ends_with_tool_result: bool,
    /// The declared tools' names, in order (none when the request forbids tool calls).
    pub tools: Vec<String>,
    pub max_tokens: Option<u64>,
    /// Of `input_words`, those the provider serves from its prompt cache (see each format's rule).
    pub cached_words: u64,
    /// Of `input_words`, those it writes to its prompt cache (Anthropic's breakpoints), and whether
    /// for an hour.
    pub written_words: u64,
    pub written_long: bool,
    /// Extended thinking was asked for (Anthropic): the reply thinks first.
    pub thinking: bool,
}

/// The mock's signature of a thinking text: what it checks when the thinking comes back.
pub(crate) fn sign(thinking: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    thinking.hash(&mut hasher);
    format!("sig-{:016x}", hasher.finish())
}

/// A signed thinking block.
#[derive(Debug)]
pub(crate) struct Thinking {
    pub text: String,
    pub signature: String,
}

/// OpenAI caches a prompt's prefix automatically once it reaches this many tokens, in steps of 128.
pub(crate) const CACHE_MINIMUM: u64 = 1024;

/// What an automatic prompt cache serves of a prefix of `words`: nothing under the minimum, then
/// whole steps of 128.
pub(crate) fn cacheable(words: u64) -> u64 {
    if words < CACHE_MINIMUM { 0 } else { words / 128 * 128 }
}

/// The number of whitespace-separated words in a text.
pub(crate) fn count_words(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

/// The mock's embedding of a text: `dimensions` numbers in -1..1, the same for the same text (each an
/// FNV-1a hash of the text and its position), different for different texts.
pub(crate) fn embedding(text: &str, dimensions: usize) -> Vec<f32> {
    (0..dimensions)
        .map(|position| {
            let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
            for byte in text.bytes().chain((position as u32).to_le_bytes()) {
                hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
            }
            ((hash >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// The mock's log probability of the token at `position` of its answer, as OpenAI writes an entry:
/// each token is the likeliest at its place (-0.01 times its position plus one), and `top`
/// alternatives follow it (the token itself, then `alt1`, `alt2`... each 1 less likely).
pub(crate) fn token_logprob(token: &str, position: usize, top: usize) -> serde_json::Value {
    let logprob = -0.01 * (position as f64 + 1.0);
    let entry = |token: &str, logprob: f64| serde_json::json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()});
    let alternatives: Vec<serde_json::Value> =
        (0..top).map(|rank| if rank == 0 { entry(token, logprob) } else { entry(&format!("alt{rank}"), logprob - rank as f64) }).collect();
    let mut chosen = entry(token, logprob);
    chosen["top_logprobs"] = serde_json::Value::Array(alternatives);
    chosen
}

/// How many numbers an embedding has unless the request asks for fewer.
pub(crate) const EMBEDDING_DIMENSIONS: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    Complete,
    Length,
    ToolCall,
}

#[derive(Debug)]
pub(crate) struct ToolCall {
    pub name: String,
    /// The arguments: `{"query": <the last user text>}`, or those a scripted call gave.
    pub input: serde_json::Value,
    /// `input` as compact JSON.
    pub arguments: String,
}

impl ToolCall {
    fn new(name: &str, input: serde_json::Value) -> ToolCall {
        ToolCall { name: name.to_string(), arguments: input.to_string(), input }
    }
}

/// A scripted call in `text`: `use the tool NAME with {JSON object}` (the object runs to the text's
/// end), for a tool the request declares. Tests drive a tool loop with it (the gateway's own agent
/// loop among them), as a real model reads a tool's schema and fills its arguments.
fn scripted_call<'a>(text: &str, tools: &'a [String]) -> Option<(&'a str, serde_json::Value)> {
    let (_, rest) = text.split_once("use the tool ")?;
    let (name, arguments) = rest.split_once(" with ")?;
    let tool = tools.iter().find(|tool| *tool == name.trim())?;
    let input: serde_json::Value = serde_json::from_str(arguments.trim()).ok()?;
    input.is_object().then_some((tool.as_str(), input))
}

#[derive(Debug)]
pub(crate) struct Reply {
    /// The text answer (empty for a tool call).
    pub text: String,
    pub tool_call: Option<ToolCall>,
    pub stop: Stop,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Of `input_tokens`, those served from the prompt cache.
    pub cached_tokens: u64,
    /// Of `input_tokens`, those written to the prompt cache, and whether for an hour.
    pub written_tokens: u64,
    pub written_long: bool,
    /// What the model thought first, when asked to.
    pub thinking: Option<Thinking>,
}

/// Output tokens reported for a tool call.
const TOOL_CALL_TOKENS: u64 = 5;

impl Reply {
    pub fn to(provider: Provider, prompt: &Prompt) -> Reply {
        let mut reply = Reply::answer(provider, prompt);
        if prompt.thinking {
            let text = format!("mock thinking about: {}", prompt.last_user_text);
            reply.thinking = Some(Thinking { signature: sign(&text), text });
        }
        reply
    }

    fn answer(provider: Provider, prompt: &Prompt) -> Reply {
        let call = if prompt.ends_with_tool_result {
            None
        } else if let Some((tool, input)) = scripted_call(&prompt.last_user_text, &prompt.tools) {
            Some(ToolCall::new(tool, input))
        } else {
            prompt
                .tools
                .first()
                .filter(|_| asks_for_a_tool(&prompt.last_user_text))
                .map(|tool| ToolCall::new(tool, serde_json::json!({"query": prompt.last_user_text})))
        };
        if let Some(call) = call {
            return Reply {
                text: String::new(),
                tool_call: Some(call),
                stop: Stop::ToolCall,
                input_tokens: prompt.input_words,
                output_tokens: TOOL_CALL_TOKENS,
                cached_tokens: prompt.cached_words,
                written_tokens: prompt.written_words,
                written_long: prompt.written_long,
                thinking: None,
            };
        }
        let mut text = format!("mock {} reply to: {}", provider.name(), prompt.last_user_text);
        let mut words = count_words(&text);
        let mut stop = Stop::Complete;
        if let Some(max_tokens) = prompt.max_tokens
            && max_tokens < words
        {
            let end = WordSegments::new(&text).nth(usize::try_from(max_tokens).unwrap_or(usize::MAX)).map_or(text.len(), |s| s.start);
            text.truncate(end);
            // The next segment starts with the separating whitespace: the truncated text ends on a word.
            words = max_tokens;
            stop = Stop::Length;
        }
        Reply {
            text,
            tool_call: None,
            stop,
            input_tokens: prompt.input_words,
            output_tokens: words,
            cached_tokens: prompt.cached_words,
            written_tokens: prompt.written_words,
            written_long: prompt.written_long,
            thinking: None,
        }
    }

    /// The text streamed in deltas: the reply, or the tool call's arguments.
    pub fn streamed_text(&self) -> &str {
        match &self.tool_call {
            Some(call) => &call.arguments,
            None => &self.text,
        }
    }
}

/// Whether the text contains the words `use a tool` (any case, punctuation ignored).
fn asks_for_a_tool(text: &str) -> bool {
    let mut previous: [&str; 2] = ["", ""];
    for word in text.split_whitespace() {
        let word = word.trim_matches(|c: char| !c.is_alphanumeric());
        if previous[0].eq_ignore_ascii_case("use") && previous[1].eq_ignore_ascii_case("a") && word.eq_ignore_ascii_case("tool") {
            return true;
        }
        previous = [previous[1], word];
    }
    false
}

/// Splits a text into one segment per word, each with the whitespace before it (trailing whitespace goes
/// with the last word), so the segments concatenate back to the text.
pub(crate) struct WordSegments<'a> {
    text: &'a str,
    cursor: usize,
}

impl<'a> WordSegments<'a> {
    pub fn new(text: &'a str) -> WordSegments<'a> {
        WordSegments { text, cursor: 0 }
    }
}

impl Iterator for WordSegments<'_> {
    type Item = Range<usize>;

    fn next(&mut self) -> Option<Range<usize>> {
        let rest = self.text.get(self.cursor..)?;
        if rest.is_empty() {
            return None;
        }
        let word_start = rest.find(|c: char| !c.is_whitespace()).unwrap_or(rest.len());
        let word_end = rest[word_start..].find(char::is_whitespace).map_or(rest.len(), |end| word_start + end);
        let end = if rest[word_end..].trim_start().is_empty() { rest.len() } else { word_end };
        let segment = self.cursor..self.cursor + end;
        self.cursor += end;
        Some(segment)
    }
}

/// Splits tool-call arguments into at least two fragments of at most 16 bytes, on character boundaries.
pub(crate) struct Fragments<'a> {
    text: &'a str,
    cursor: usize,
    size: usize,
}

impl<'a> Fragments<'a> {
    pub fn new(text: &'a str) -> Fragments<'a> {
        Fragments { text, cursor: 0, size: (text.len() / 2).clamp(1, 16) }
    }
}

impl Iterator for Fragments<'_> {
    type Item = Range<usize>;

    fn next(&mut self) -> Option<Range<usize>> {
        if self.cursor >= self.text.len() {
            return None;
        }
        let mut end = (self.cursor + self.size).min(self.text.len());
        while !self.text.is_char_boundary(end) {
            end += 1;
        }
        let fragment = self.cursor..end;
        self.cursor = end;
        Some(fragment)
    }
}

/// One step of a streamed answer; each format renders the steps it has (or skips them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Before any content: OpenAI's role chunk, Anthropic's `message_start`.
    Open,
    /// The content block starts: Anthropic's `content_block_start`, OpenAI's tool-call header.
    BlockStart,
    /// A slice of `Reply::streamed_text`: one word of text, or a fragment of tool arguments.
    Delta(Range<usize>),
    BlockStop,
    /// The stop reason (and, for Anthropic and Gemini, the usage).
    Finish,
    /// OpenAI's usage chunk.
    Usage,
    /// OpenAI's `[DONE]`, Anthropic's `message_stop`.
    Close,
}

enum Phase {
    Open,
    BlockStart,
    Words { cursor: usize },
    Fragments { cursor: usize },
    BlockStop,
    Finish,
    Usage,
    Close,
    Done,
}

/// The steps of a streamed answer, produced one at a time; owns the reply the steps refer to.
pub(crate) struct StreamSteps {
    reply: Reply,
    phase: Phase,
}

impl StreamSteps {
    pub fn new(reply: Reply) -> StreamSteps {
        StreamSteps { reply, phase: Phase::Open }
    }

    pub fn reply(&self) -> &Reply {
        &self.reply
    }
}

impl Iterator for StreamSteps {
    type Item = Step;

    fn next(&mut self) -> Option<Step> {
        loop {
            let text = self.reply.streamed_text();
            let (step, next_phase) = match &mut self.phase {
                Phase::Open => (Some(Step::Open), Phase::BlockStart),
                Phase::BlockStart => {
                    let deltas = if self.reply.tool_call.is_some() { Phase::Fragments { cursor: 0 } } else { Phase::Words { cursor: 0 } };
                    (Some(Step::BlockStart), deltas)
                }
                Phase::Words { cursor } => {
                    let mut segments = WordSegments { text, cursor: *cursor };
                    match segments.next() {
                        Some(range) => {
                            *cursor = segments.cursor;
                            return Some(Step::Delta(range));
                        }
                        None => (None, Phase::BlockStop),
                    }
                }
                Phase::Fragments { cursor } => {
                    let mut fragments = Fragments { cursor: *cursor, ..Fragments::new(text) };
                    match fragments.next() {
                        Some(range) => {
                            *cursor = fragments.cursor;
                            return Some(Step::Delta(range));
                        }
                        None => (None, Phase::BlockStop),
                    }
                }
                Phase::BlockStop => (Some(Step::BlockStop), Phase::Finish),
                Phase::Finish => (Some(Step::Finish), Phase::Usage),
                Phase::Usage => (Some(Step::Usage), Phase::Close),
                Phase::Close => (Some(Step::Close), Phase::Done),
                Phase::Done => return None,
            };
            self.phase = next_phase;
            if step.is_some() {
                return step;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(text: &str) -> Prompt {
        Prompt { input_words: 7, last_user_text: text.to_string(), ..Prompt::default() }
    }

    #[test]
    fn the_reply_reflects_the_last_user_text() {
        let reply = Reply::to(Provider::Gemini, &prompt("hello  there"));
        assert_eq!(reply.text, "mock gemini reply to: hello  there");
        assert_eq!((reply.input_tokens, reply.output_tokens, reply.stop), (7, 6, Stop::Complete));
    }

    #[test]
    fn max_tokens_truncates_on_a_word() {
        let reply = Reply::to(Provider::OpenAi, &Prompt { max_tokens: Some(3), ..prompt("hello there") });
        assert_eq!((reply.text.as_str(), reply.output_tokens, reply.stop), ("mock openai reply", 3, Stop::Length));
        let exact = Reply::to(Provider::OpenAi, &Prompt { max_tokens: Some(6), ..prompt("hello there") });
        assert_eq!(exact.stop, Stop::Complete);
        let zero = Reply::to(Provider::OpenAi, &Prompt { max_tokens: Some(0), ..prompt("hello") });
        assert_eq!((zero.text.as_str(), zero.output_tokens), ("", 0));
    }

    #[test]
    fn a_tool_is_called_when_asked_and_declared() {
        let asking = Prompt { tools: vec!["search".into()], ..prompt("Please USE a tool, now") };
        let reply = Reply::to(Provider::Anthropic, &asking);
        let call = reply.tool_call.as_ref().unwrap();
        assert_eq!(call.name, "search");
        assert_eq!(call.arguments, r#"{"query":"Please USE a tool, now"}"#);
        assert_eq!((reply.stop, reply.output_tokens), (Stop::ToolCall, 5));
        assert!(Reply::to(Provider::Anthropic, &prompt("use a tool")).tool_call.is_none(), "no tool declared");
        let after_result = Prompt { ends_with_tool_result: true, ..asking };
        assert!(Reply::to(Provider::Anthropic, &after_result).tool_call.is_none(), "the tool already answered");
        assert!(!asks_for_a_tool("reuse a toolbox"));
    }

    #[test]
    fn a_scripted_call_names_its_tool_and_arguments() {
        let tools = vec!["search".to_string(), "remember".to_string()];
        let asking = Prompt { tools: tools.clone(), ..prompt(r#"please use the tool remember with {"fact": "tea", "n": 2}"#) };
        let call = Reply::to(Provider::OpenAi, &asking).tool_call.unwrap();
        assert_eq!((call.name.as_str(), call.arguments.as_str()), ("remember", r#"{"fact":"tea","n":2}"#));
        assert_eq!(scripted_call("use the tool forget with {}", &tools), None, "an undeclared tool");
        assert_eq!(scripted_call("use the tool remember with [1]", &tools), None, "arguments are an object");
        assert_eq!(scripted_call("use the tool remember with {", &tools), None, "arguments are JSON");
        let answered = Prompt { ends_with_tool_result: true, ..asking };
        assert!(Reply::to(Provider::OpenAi, &answered).tool_call.is_none(), "the tool already answered");
    }

    #[test]
    fn word_segments_keep_the_spaces() {
        let text = "  one two\n three  ";
        let segments: Vec<&str> = WordSegments::new(text).map(|range| &text[range]).collect();
        assert_eq!(segments, ["  one", " two", "\n three  "]);
        assert_eq!(WordSegments::new("").count(), 0);
        assert_eq!(WordSegments::new("   ").map(|range| range.len()).collect::<Vec<_>>(), [3]);
    }

    #[test]
    fn fragments_are_at_least_two_and_respect_characters() {
        let text = r#"{"query":"é"}"#;
        let fragments: Vec<&str> = Fragments::new(text).map(|range| &text[range]).collect();
        assert!(fragments.len() >= 2);
        assert_eq!(fragments.concat(), text);
        let long = "x".repeat(100);
        assert!(Fragments::new(&long).all(|range| range.len() <= 16));
    }

    #[test]
    fn stream_steps_follow_the_reply() {
        let steps: Vec<Step> = StreamSteps::new(Reply::to(Provider::OpenAi, &prompt("hi"))).collect();
        assert_eq!(steps.first(), Some(&Step::Open));
        assert_eq!(steps.iter().filter(|step| matches!(step, Step::Delta(_))).count(), 5);
        assert_eq!(&steps[steps.len() - 4..], [Step::BlockStop, Step::Finish, Step::Usage, Step::Close]);
        let asking = Prompt { tools: vec!["search".into()], ..prompt("use a tool") };
        let mut tool_steps = StreamSteps::new(Reply::to(Provider::OpenAi, &asking));
        let deltas: Vec<String> = tool_steps
            .by_ref()
            .filter_map(|step| match step {
                Step::Delta(range) => Some(range),
                _ => None,
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|range| tool_steps.reply().streamed_text()[range].to_string())
            .collect();
        assert!(deltas.len() >= 2);
        assert_eq!(deltas.concat(), r#"{"query":"use a tool"}"#);
    }
}
