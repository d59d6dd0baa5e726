//! Kill-switch decisions, as a pure function of the tenant's switch state and a request's facts: which
//! paths a tenant-wide switch spares, how scoped switches match, and the MCP tools still callable.

use brainstorm_common::error::{ApiError, Recovery};
use brainstorm_proto::policy::{KillSwitchSnapshot, ScopedSwitch};
use http::{HeaderName, StatusCode};
use serde_json::{Value, json};

/// Path prefixes served while the tenant switch is active. A prefix without a trailing `/` also covers
/// its sub-paths (`/v1/api-keys/123`), but not a longer name (`/v1/modelsx`).
pub const EXEMPT_PREFIXES: [&str; 12] = [
    "/v1/budget/",
    "/v1/killswitch/",
    "/v1/security/",
    "/v1/governance/",
    "/v1/usage/",
    "/v1/insights/",
    "/v1/ops/",
    "/v1/mcp/connect",
    "/v1/models",
    "/v1/api-keys",
    "/v1/config",
    "/health",
];

/// The MCP tools `/v1/mcp/connect` still runs while the tenant switch is active: the governance tools.
pub const MCP_TOOLS_ALLOWED_DURING_ACTIVATION: [&str; 6] = [
    "br_activate_killswitch",
    "br_deactivate_killswitch",
    "br_get_killswitch_status",
    "br_get_budget_status",
    "br_get_budget_forecast",
    "br_agent_inventory",
];

/// The response header every kill-switch refusal carries.
pub const KILL_SWITCH_HEADER: &str = "x-br-kill-switch";

/// What a scoped switch applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScopeType {
    Agent,
    Tool,
    Provider,
}

impl ScopeType {
    /// `agent`, `tool` or `provider`.
    pub fn as_str(self) -> &'static str {
        match self {
            ScopeType::Agent => "agent",
            ScopeType::Tool => "tool",
            ScopeType::Provider => "provider",
        }
    }

    /// Reads `agent`, `tool` or `provider`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "agent" => Some(ScopeType::Agent),
            "tool" => Some(ScopeType::Tool),
            "provider" => Some(ScopeType::Provider),
            _ => None,
        }
    }
}

/// One active scoped switch, its id normalised for matching.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveScope {
    pub scope_type: ScopeType,
    /// Lowercase; provider ids are canonical (`gemini` reads as `google`).
    pub id: String,
    pub reason: String,
}

/// A tenant's kill-switch state as the decision needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KillSwitchState {
    pub tenant_active: bool,
    pub tenant_reason: Option<String>,
    pub scopes: Vec<ActiveScope>,
}

impl KillSwitchState {
    /// From the service's snapshot (inactive scopes and unknown scope types are ignored).
    pub fn from_snapshot(snapshot: &KillSwitchSnapshot) -> Self {
        KillSwitchState {
            tenant_active: snapshot.active,
            tenant_reason: snapshot.reason.clone(),
            scopes: snapshot.scopes.iter().filter(|scope| scope.active).filter_map(active_scope).collect(),
        }
    }

    /// The same state with its scoped switches left out (they fail open while unreadable).
    pub fn without_scopes(&self) -> Self {
        KillSwitchState { tenant_active: self.tenant_active, tenant_reason: self.tenant_reason.clone(), scopes: Vec::new() }
    }
}

fn active_scope(scope: &ScopedSwitch) -> Option<ActiveScope> {
    let scope_type = ScopeType::parse(&scope.r#type)?;
    let id = match scope_type {
        ScopeType::Provider => canonical_provider(&scope.id),
        ScopeType::Agent | ScopeType::Tool => scope.id.trim().to_ascii_lowercase(),
    };
    Some(ActiveScope { scope_type, id, reason: scope.reason.clone() })
}

/// What a request is, as far as kill switches care.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestFacts<'a> {
    /// The request path without its query string.
    pub path: &'a str,
    pub method: &'a str,
    /// `X-BR-Agent-Id`.
    pub agent_id: Option<&'a str>,
    /// Names from `tool_choice` and `tools[]` (POST bodies).
    pub tool_names: &'a [&'a str],
    /// The requested model (`provider/model`, a bare id, ...); call again with the routed
    /// `provider/model` once resolution picked one.
    pub model: Option<&'a str>,
}

/// Which switch refused a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockScope {
    Tenant,
    Agent(String),
    Tool(String),
    Provider(String),
}

impl BlockScope {
    /// `tenant`, `agent:<id>`, `tool:<id>` or `provider:<id>`.
    pub fn label(&self) -> String {
        match self {
            BlockScope::Tenant => "tenant".to_string(),
            BlockScope::Agent(id) => format!("agent:{id}"),
            BlockScope::Tool(id) => format!("tool:{id}"),
            BlockScope::Provider(id) => format!("provider:{id}"),
        }
    }
}

/// The kill-switch verdict on one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KillSwitchDecision {
    Allow,
    Blocked { scope: BlockScope, reason: String },
}

impl KillSwitchDecision {
    pub fn is_blocked(&self) -> bool {
        matches!(self, KillSwitchDecision::Blocked { .. })
    }

    /// The refusal to answer: 503 `kill_switch_active` with `X-BR-Kill-Switch: active` and recovery
    /// `check_status`; None when allowed.
    pub fn api_error(&self) -> Option<ApiError> {
        let KillSwitchDecision::Blocked { scope, reason } = self else { return None };
        let message = match scope {
            BlockScope::Tenant => format!("the tenant's kill switch is active: {reason}"),
            BlockScope::Agent(id) => format!("the kill switch for agent `{id}` is active: {reason}"),
            BlockScope::Tool(id) => format!("the kill switch for tool `{id}` is active: {reason}"),
            BlockScope::Provider(id) => format!("the kill switch for provider `{id}` is active: {reason}"),
        };
        let mut error = ApiError::unavailable("kill_switch_active", message);
        error.status = StatusCode::SERVICE_UNAVAILABLE;
        error.error_type = "kill_switch_active";
        error.details.insert("scope".to_string(), json!(scope.label()));
        error.recovery = Recovery {
            action: "check_status",
            endpoint: "/v1/killswitch/status".to_string(),
            method: "GET",
            body_template: Value::Null,
            message: "an operator stopped this traffic; check the kill switch status and deactivate it when safe".to_string(),
            wait_ms: None,
            reason: None,
        };
        error.push_header(HeaderName::from_static(KILL_SWITCH_HEADER), "active");
        if *scope != BlockScope::Tenant {
            error.push_header(HeaderName::from_static("x-br-kill-switch-scope"), &scope.label());
        }
        Some(error)
    }
}

/// Whether a path is served while the tenant switch is active. Paths with dot segments, empty segments
/// or percent-encoding are never exempt: they could dress a blocked route as an exempt one.
pub fn is_exempt_path(path: &str) -> bool {
    if has_disguising_segment(path) {
        return false;
    }
    // Prefixes differ by their fifth byte (after `/v1/`), and most paths match none: a byte compare
    // first spares the string compares (this runs twice per request).
    let fifth = path.as_bytes().get(4);
    EXEMPT_PREFIXES.iter().filter(|prefix| prefix.as_bytes().get(4) == fifth).any(|prefix| {
        if prefix.ends_with('/') {
            path.starts_with(prefix)
        } else {
            path == *prefix || path.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('/'))
        }
    })
}

/// Whether `path` contains `//`, `/./`, `/../`, ends in `/..` or has a `%`: one pass over its bytes
/// (this runs twice per request; five substring searches cost about twenty times as much).
fn has_disguising_segment(path: &str) -> bool {
    let bytes = path.as_bytes();
    bytes.iter().enumerate().any(|(at, byte)| match byte {
        b'%' => true,
        b'/' => {
            let rest = &bytes[at + 1..];
            rest.starts_with(b"/") || rest.starts_with(b"./") || rest.starts_with(b"../") || rest == b".."
        }
        _ => false,
    })
}

/// Whether switches apply to a path: every `/v1/*` path that is not exempt.
pub fn is_guarded_path(path: &str) -> bool {
    (path == "/v1" || path.starts_with("/v1/")) && !is_exempt_path(path)
}

/// Whether `/v1/mcp/connect` may run this tool while the tenant switch is active.
pub fn mcp_tool_allowed_during_activation(name: &str) -> bool {
    MCP_TOOLS_ALLOWED_DURING_ACTIVATION.contains(&name)
}

/// The decision: the tenant switch first (it wins), then scoped switches (agent, tool on POST,
/// provider), on guarded paths only.
pub fn check(state: &KillSwitchState, request: &RequestFacts<'_>) -> KillSwitchDecision {
    if !is_guarded_path(request.path) {
        return KillSwitchDecision::Allow;
    }
    decide(state, request)
}

/// `check` for a request whose path is already known to be guarded (the gate asks before it reads
/// the state; the path check is a scan of the path, twice per request otherwise).
pub(crate) fn decide(state: &KillSwitchState, request: &RequestFacts<'_>) -> KillSwitchDecision {
    if state.tenant_active {
        let reason = state.tenant_reason.clone().unwrap_or_else(|| "kill switch active".to_string());
        return KillSwitchDecision::Blocked { scope: BlockScope::Tenant, reason };
    }
    for scope in &state.scopes {
        let blocked = match scope.scope_type {
            ScopeType::Agent => request.agent_id.is_some_and(|agent_id| agent_id.trim().eq_ignore_ascii_case(&scope.id)),
            ScopeType::Tool => {
                request.method.eq_ignore_ascii_case("POST")
                    && request.tool_names.iter().any(|name| name.trim().eq_ignore_ascii_case(&scope.id))
            }
            ScopeType::Provider => request.model.is_some_and(|model| model_matches_provider(model, &scope.id)),
        };
        if blocked {
            let label = match scope.scope_type {
                ScopeType::Agent => BlockScope::Agent(scope.id.clone()),
                ScopeType::Tool => BlockScope::Tool(scope.id.clone()),
                ScopeType::Provider => BlockScope::Provider(scope.id.clone()),
            };
            let reason = if scope.reason.is_empty() { "kill switch active".to_string() } else { scope.reason.clone() };
            return KillSwitchDecision::Blocked { scope: label, reason };
        }
    }
    KillSwitchDecision::Allow
}

/// A provider id as the catalog spells it (`Gemini` and `google-gemini` read as `google`).
pub fn canonical_provider(id: &str) -> String {
    let id = id.trim().to_ascii_lowercase();
    match id.as_str() {
        "gemini" | "google-gemini" | "googleai" | "google-ai" => "google".to_string(),
        "x-ai" | "grok" => "xai".to_string(),
        "claude" => "anthropic".to_string(),
        _ => id,
    }
}

/// The provider a bare model id's family belongs to (`claude-*` is Anthropic's, `gpt-*` and `o1`..
/// OpenAI's, `gemini-*` Google's, ...); None for families several providers serve (`llama`).
pub fn provider_of_model_family(model: &str) -> Option<&'static str> {
    let model = model.trim().to_ascii_lowercase();
    let starts = |prefixes: &[&str]| prefixes.iter().any(|prefix| model.starts_with(prefix));
    if starts(&["claude"]) {
        Some("anthropic")
    } else if starts(&[
        "gpt-",
        "gpt4",
        "gpt3",
        "chatgpt",
        "text-embedding",
        "dall-e",
        "whisper",
        "tts-",
        "davinci",
        "babbage",
        "omni-moderation",
    ]) || is_openai_reasoning_model(&model)
    {
        Some("openai")
    } else if starts(&["gemini", "gemma", "palm", "text-bison", "chat-bison"]) {
        Some("google")
    } else if starts(&["mistral", "mixtral", "codestral", "ministral", "pixtral", "magistral", "devstral", "open-mistral", "open-mixtral"])
    {
        Some("mistral")
    } else if starts(&["grok"]) {
        Some("xai")
    } else if starts(&["deepseek"]) {
        Some("deepseek")
    } else if starts(&["command", "c4ai-", "embed-english", "embed-multilingual", "rerank-"]) {
        Some("cohere")
    } else if starts(&["sonar"]) {
        Some("perplexity")
    } else {
        None
    }
}

/// `o1`, `o3-mini`, `o4-mini-high`: an `o` followed by a digit.
fn is_openai_reasoning_model(model: &str) -> bool {
    let mut characters = model.chars();
    characters.next() == Some('o') && characters.next().is_some_and(|character| character.is_ascii_digit())
}

/// Whether a model name belongs to `provider` (canonical, lowercase): its `provider/` prefix (at any
/// level, as in `openrouter/anthropic/claude-3`) or its family. Variant suffixes (`:floor`) are ignored.
pub fn model_matches_provider(model: &str, provider: &str) -> bool {
    let model = model.trim();
    let model = model.split_once(':').map_or(model, |(base, _)| base);
    let segments: Vec<&str> = model.split('/').collect();
    if segments.len() > 1 && segments[..segments.len() - 1].iter().any(|segment| canonical_provider(segment) == provider) {
        return true;
    }
    segments.last().and_then(|bare| provider_of_model_family(bare)).is_some_and(|family| family == provider)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(scope_type: &str, id: &str) -> ScopedSwitch {
        ScopedSwitch {
            r#type: scope_type.to_string(),
            id: id.to_string(),
            reason: format!("{scope_type} incident"),
            activated_by: "key-1".to_string(),
            activated_at: "2026-01-01T00:00:00.000Z".to_string(),
            active: true,
            deactivated_at: None,
        }
    }

    fn state(active: bool, scopes: Vec<ScopedSwitch>) -> KillSwitchState {
        KillSwitchState::from_snapshot(&KillSwitchSnapshot {
            tenant_id: "t".to_string(),
            version: 1,
            active,
            reason: active.then(|| "incident 42".to_string()),
            activated_at: None,
            scopes,
        })
    }

    fn post<'a>(path: &'a str) -> RequestFacts<'a> {
        RequestFacts { path, method: "POST", ..RequestFacts::default() }
    }

    #[test]
    fn the_tenant_switch_blocks_every_guarded_v1_path_and_spares_the_exempt_ones() {
        let active = state(true, Vec::new());
        for path in ["/v1/chat/completions", "/v1/messages", "/v1/embeddings", "/v1/tasks/1", "/v1/memory", "/v1/aliases", "/v1/modelsx"] {
            let decision = check(&active, &post(path));
            assert_eq!(decision, KillSwitchDecision::Blocked { scope: BlockScope::Tenant, reason: "incident 42".to_string() }, "{path}");
        }
        for path in [
            "/v1/budget/status",
            "/v1/killswitch/deactivate",
            "/v1/security/status",
            "/v1/governance/policy/dry-run",
            "/v1/usage/summary",
            "/v1/insights/x",
            "/v1/ops/x",
            "/v1/mcp/connect",
            "/v1/models",
            "/v1/models/leaderboard",
            "/v1/api-keys",
            "/v1/api-keys/123",
            "/v1/config",
            "/health",
            "/auth/killswitch/status",
        ] {
            assert_eq!(check(&active, &post(path)), KillSwitchDecision::Allow, "{path}");
        }
        assert!(!is_exempt_path("/v1/budget/../chat/completions"));
        assert!(!is_exempt_path("/v1/budget/%2e%2e/chat/completions"));
        assert!(!is_exempt_path("/v1/mcp/servers"), "only the connect endpoint of MCP is exempt");
        assert_eq!(check(&state(false, Vec::new()), &post("/v1/chat/completions")), KillSwitchDecision::Allow);
    }

    #[test]
    fn disguised_paths_are_never_exempt() {
        for path in
            ["/v1/budget//x", "//v1/budget/x", "/v1/budget/./x", "/v1/budget/../x", "/v1/models/..", "/v1/models%2F", "/v1/budget/x//"]
        {
            assert!(!is_exempt_path(path), "{path}");
        }
        // What the old substring checks let through stays exempt: a trailing `/.`, `..` inside a name.
        for path in ["/v1/models/.", "/v1/models/a..b", "/v1/budget/", "/v1/models/", "/health"] {
            assert!(is_exempt_path(path), "{path}");
        }
    }

    #[test]
    fn the_tenant_switch_wins_over_scopes() {
        let both = state(true, vec![scope("agent", "planner")]);
        let request = RequestFacts { agent_id: Some("planner"), ..post("/v1/chat/completions") };
        assert!(matches!(check(&both, &request), KillSwitchDecision::Blocked { scope: BlockScope::Tenant, .. }));
    }

    #[test]
    fn agent_scopes_match_the_agent_header() {
        let scoped = state(false, vec![scope("agent", "planner")]);
        let planner = RequestFacts { agent_id: Some("planner"), ..post("/v1/chat/completions") };
        let other = RequestFacts { agent_id: Some("writer"), ..post("/v1/chat/completions") };
        assert_eq!(
            check(&scoped, &planner),
            KillSwitchDecision::Blocked { scope: BlockScope::Agent("planner".to_string()), reason: "agent incident".to_string() }
        );
        assert_eq!(check(&scoped, &other), KillSwitchDecision::Allow);
        assert_eq!(check(&scoped, &post("/v1/chat/completions")), KillSwitchDecision::Allow);
        let exempt = RequestFacts { agent_id: Some("planner"), ..post("/v1/budget/status") };
        assert_eq!(check(&scoped, &exempt), KillSwitchDecision::Allow);
    }

    #[test]
    fn tool_scopes_match_tool_names_on_post_only() {
        let scoped = state(false, vec![scope("tool", "shell_exec")]);
        let names = ["search", "Shell_Exec"];
        let with_tool = RequestFacts { tool_names: &names, ..post("/v1/chat/completions") };
        assert!(matches!(check(&scoped, &with_tool), KillSwitchDecision::Blocked { scope: BlockScope::Tool(_), .. }));
        let get = RequestFacts { method: "GET", ..with_tool };
        assert_eq!(check(&scoped, &get), KillSwitchDecision::Allow);
        let other_names = ["search"];
        let without = RequestFacts { tool_names: &other_names, ..post("/v1/chat/completions") };
        assert_eq!(check(&scoped, &without), KillSwitchDecision::Allow);
    }

    #[test]
    fn provider_scopes_match_prefixes_and_model_families() {
        let anthropic = state(false, vec![scope("provider", "anthropic")]);
        for model in ["anthropic/claude-3-5-sonnet", "claude-3-haiku", "claude-sonnet-4:floor", "openrouter/anthropic/claude-3"] {
            let request = RequestFacts { model: Some(model), ..post("/v1/chat/completions") };
            assert!(check(&anthropic, &request).is_blocked(), "{model}");
        }
        for model in ["openai/gpt-4o", "gpt-4o-mini", "auto", "llama-3.1-70b", "groq/llama-3.1-8b"] {
            let request = RequestFacts { model: Some(model), ..post("/v1/chat/completions") };
            assert_eq!(check(&anthropic, &request), KillSwitchDecision::Allow, "{model}");
        }
        let openai = state(false, vec![scope("provider", "openai")]);
        for model in ["gpt-4o", "o1", "o3-mini", "openai/o4-mini", "chatgpt-4o-latest"] {
            assert!(model_matches_provider(model, "openai"), "{model}");
        }
        assert!(!model_matches_provider("olmo-7b", "openai"));
        let request = RequestFacts { model: Some("claude-3-haiku"), ..post("/v1/chat/completions") };
        assert_eq!(check(&openai, &request), KillSwitchDecision::Allow);
        let google = state(false, vec![scope("provider", "Gemini")]);
        let request = RequestFacts { model: Some("gemini-2.0-flash"), ..post("/v1/chat/completions") };
        assert!(check(&google, &request).is_blocked(), "a `gemini` scope is Google's");
    }

    #[test]
    fn a_scope_without_a_reason_still_says_why() {
        let mut silent = scope("agent", "planner");
        silent.reason = String::new();
        let request = RequestFacts { agent_id: Some("planner"), ..post("/v1/chat/completions") };
        assert_eq!(
            check(&state(false, vec![silent]), &request),
            KillSwitchDecision::Blocked { scope: BlockScope::Agent("planner".to_string()), reason: "kill switch active".to_string() }
        );
    }

    #[test]
    fn inactive_scopes_are_ignored() {
        let mut off = scope("agent", "planner");
        off.active = false;
        let request = RequestFacts { agent_id: Some("planner"), ..post("/v1/chat/completions") };
        assert_eq!(check(&state(false, vec![off]), &request), KillSwitchDecision::Allow);
    }

    #[test]
    fn only_the_governance_mcp_tools_run_during_activation() {
        for tool in MCP_TOOLS_ALLOWED_DURING_ACTIVATION {
            assert!(mcp_tool_allowed_during_activation(tool));
        }
        assert!(!mcp_tool_allowed_during_activation("br_create_prompt"));
        assert!(!mcp_tool_allowed_during_activation("BR_ACTIVATE_KILLSWITCH"));
    }

    #[test]
    fn a_refusal_is_a_503_with_the_kill_switch_header_and_check_status() {
        let decision = KillSwitchDecision::Blocked { scope: BlockScope::Tool("shell".to_string()), reason: "rce".to_string() };
        let error = decision.api_error();
        let Some(error) = error else { unreachable!("blocked decisions have an error") };
        assert_eq!(error.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(error.error_type, "kill_switch_active");
        assert_eq!(error.recovery.action, "check_status");
        assert_eq!(error.recovery.endpoint, "/v1/killswitch/status");
        assert!(error.headers.iter().any(|(name, value)| name.as_str() == KILL_SWITCH_HEADER && value == "active"));
        assert!(KillSwitchDecision::Allow.api_error().is_none());
    }
}
