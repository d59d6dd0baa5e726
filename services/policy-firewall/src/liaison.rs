//! Liaison binding contracts: signed session ids, the plan envelope (version 2) and its HMAC-SHA256
//! signature, the prompt fingerprint, and the grant rules a completion committing a plan is judged by.
//! Everything here is pure; `liaison_store` keeps sessions, plans and events, and the service joins them.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use brainstorm_common::money::Usd;
use brainstorm_proto::policy::LiaisonPlan;
use brainstorm_providers::chat::{ChatRequest, DocumentSource, Part, Role, ToolChoice};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::glob::glob_matches;

type HmacSha256 = Hmac<Sha256>;

/// The plan envelope's version (`v`).
pub const ENVELOPE_VERSION: u32 = 2;
/// A plan's time to live when the request gives none, and the most it may ask for.
pub const DEFAULT_PLAN_TTL_SECONDS: i64 = 60;
pub const MAX_PLAN_TTL_SECONDS: i64 = 300;
/// The share above the estimate a plan's ceiling allows when the request gives none.
pub const DEFAULT_COST_SLACK: f64 = 0.10;
/// The most output tokens a plan may budget.
pub const MAX_PLAN_TOKENS: i64 = 128_000;
/// A session's lifetime when the request gives none, and the most it may ask for.
pub const DEFAULT_SESSION_TTL_SECONDS: i64 = 3_600;
pub const MAX_SESSION_TTL_SECONDS: i64 = 86_400;
/// The sandbox's model label: a tenant without provider keys mints plans for it.
pub const SANDBOX_LABEL: &str = "brainstorm/sandbox";
/// The grant that allows any model or any tool; it must stand alone.
pub const ANY: &str = "*";
/// The prefix of a signed session id.
const SESSION_PREFIX: &str = "lia_";

/// Why a completion may not commit its plan (`plan_scope_exceeded`'s `reason`), or why a plan no
/// longer matches the completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The executed model is not in the grant.
    ModelOutsideGrant,
    /// A tool the completion offers or forces matches no pattern of the grant.
    ToolOutsideGrant,
    /// The completion's worst-case cost exceeds the plan's ceiling.
    CeilingExceeded,
    /// A sandbox plan, and the tenant has added a provider key since.
    SandboxPlanVoid,
    /// The prompt (or the pinned variant) is not the one the plan was minted for.
    FingerprintMismatch,
}

impl Refusal {
    /// The reason as the API names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::ModelOutsideGrant => "model_outside_grant",
            Refusal::ToolOutsideGrant => "tool_outside_grant",
            Refusal::CeilingExceeded => "ceiling_exceeded",
            Refusal::SandboxPlanVoid => "sandbox_plan_void",
            Refusal::FingerprintMismatch => "plan_fingerprint_mismatch",
        }
    }
}

/// What a completion brings to the plan it commits.
#[derive(Debug, Clone, PartialEq)]
pub struct Commitment<'a> {
    /// The executed model's label, its variant suffix kept.
    pub model_label: &'a str,
    /// `prompt_digest` of the completion.
    pub prompt_digest: &'a str,
    pub tool_names: &'a [String],
    pub worst_case_nanos: i64,
    pub tenant_has_provider_keys: bool,
}

/// Judges a completion against a plan whose signature was verified: the first rule it breaks, with
/// a message naming what broke it.
pub fn judge(plan: &LiaisonPlan, commitment: &Commitment<'_>) -> Result<(), (Refusal, String)> {
    if plan.model == SANDBOX_LABEL && commitment.tenant_has_provider_keys {
        return Err((Refusal::SandboxPlanVoid, "the plan was minted for the sandbox and the tenant has a provider key now".to_string()));
    }
    if plan.model == SANDBOX_LABEL && commitment.model_label != SANDBOX_LABEL {
        return Err((
            Refusal::FingerprintMismatch,
            format!("a sandbox plan commits only `{SANDBOX_LABEL}` (or an omitted model), not `{}`", commitment.model_label),
        ));
    }
    // A plan minted for a variant pins it: the completion's variant enters the fingerprint.
    let variant = if variant_of(&plan.model).is_empty() { "" } else { variant_of(commitment.model_label) };
    if fingerprint(variant, commitment.prompt_digest) != plan.prompt_fingerprint {
        let message = if variant_of(&plan.model) != variant {
            format!("the plan pins the variant of `{}`; the completion asks for `{}`", plan.model, commitment.model_label)
        } else {
            "the completion's prompt is not the one the plan was minted for".to_string()
        };
        return Err((Refusal::FingerprintMismatch, message));
    }
    if !model_granted(&plan.allowed_models, commitment.model_label) {
        return Err((
            Refusal::ModelOutsideGrant,
            format!("`{}` is not among the plan's allowed models ({})", commitment.model_label, plan.allowed_models.join(", ")),
        ));
    }
    if let Some(tool) = commitment.tool_names.iter().find(|tool| !tool_granted(&plan.allowed_tools, tool)) {
        let granted = if plan.allowed_tools.is_empty() { "none".to_string() } else { plan.allowed_tools.join(", ") };
        return Err((Refusal::ToolOutsideGrant, format!("tool `{tool}` is not among the plan's allowed tools ({granted})")));
    }
    if commitment.worst_case_nanos > plan.ceiling_nanos {
        return Err((
            Refusal::CeilingExceeded,
            format!(
                "the completion may cost up to USD {}, above the plan's ceiling of USD {}",
                Usd::from_nanos(commitment.worst_case_nanos),
                Usd::from_nanos(plan.ceiling_nanos)
            ),
        ));
    }
    Ok(())
}

/// Exact-set matching: `*` alone grants any model; otherwise the label must be listed as it is
/// (a variant-suffixed label does not satisfy a grant of its base model).
pub fn model_granted(allowed: &[String], label: &str) -> bool {
    allowed.iter().any(|granted| granted == ANY || granted == label)
}

/// A tool is granted when it matches at least one pattern (`*` any run of characters); an empty
/// grant grants none.
pub fn tool_granted(allowed: &[String], tool: &str) -> bool {
    allowed.iter().any(|pattern| glob_matches(pattern, tool))
}

/// The variant suffix of a model label (`fast` of `openai/gpt-4o-mini:fast`), empty for none.
pub fn variant_of(label: &str) -> &str {
    match label.rsplit_once(':') {
        Some((_, suffix)) if matches!(suffix, "floor" | "fast" | "best" | "smart") => suffix,
        _ => "",
    }
}

/// The prompt fingerprint a plan signs: SHA-256 (hex) over the pinned variant label and the prompt's
/// digest.
pub fn fingerprint(variant: &str, prompt_digest: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"brainstorm/liaison/fingerprint/v2\0");
    hasher.update(variant.as_bytes());
    hasher.update(b"\0");
    hasher.update(prompt_digest.as_bytes());
    hex::encode(hasher.finalize())
}

/// SHA-256 (hex) of a request's prompt in the neutral model: the system prompt and every message's
/// role and parts, each length-prefixed, so the same conversation sent in the OpenAI or the Anthropic
/// format has the same digest and no two conversations share one by concatenation.
pub fn prompt_digest(chat: &ChatRequest) -> String {
    let mut writer = DigestWriter(Sha256::new());
    writer.field(b"system", chat.system.as_deref().unwrap_or_default());
    for message in &chat.messages {
        let role = match message.role {
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        };
        writer.field(b"role", role);
        for part in &message.parts {
            writer.part(part);
        }
    }
    hex::encode(writer.0.finalize())
}

struct DigestWriter(Sha256);

impl DigestWriter {
    fn field(&mut self, tag: &[u8], value: &str) {
        self.0.update(tag);
        self.0.update((value.len() as u64).to_be_bytes());
        self.0.update(value.as_bytes());
    }

    fn part(&mut self, part: &Part) {
        match part {
            Part::Text(text) => self.field(b"text", text),
            Part::Image { url } => self.field(b"image", url),
            Part::ToolCall { id, name, arguments } => {
                self.field(b"tool_call", id);
                self.field(b"name", name);
                self.field(b"arguments", arguments);
            }
            Part::ToolResult { call_id, content, is_error, media } => {
                self.field(b"tool_result", call_id);
                self.field(b"content", content);
                self.field(b"is_error", if *is_error { "1" } else { "0" });
                for part in media {
                    self.part(part);
                }
            }
            Part::Thinking { text, signature } => {
                self.field(b"thinking", text);
                self.field(b"signature", signature);
            }
            Part::RedactedThinking { data } => self.field(b"redacted_thinking", data),
            Part::Document { source, name } => {
                self.field(b"document", name.as_deref().unwrap_or_default());
                match source {
                    DocumentSource::Base64 { media_type, data } => {
                        self.field(b"media_type", media_type);
                        self.field(b"data", data);
                    }
                    DocumentSource::Url(url) => self.field(b"url", url),
                    DocumentSource::Text(text) => self.field(b"text", text),
                }
            }
        }
    }
}

/// Every tool name a request offers (`tools[]`, legacy `functions[]`, built-in tools, all read into
/// the neutral request's tools) or forces (`tool_choice`), in order, each once.
pub fn tool_names(chat: &ChatRequest) -> Vec<String> {
    let mut names: Vec<String> = Vec::with_capacity(chat.tools.len() + 1);
    let forced = match &chat.tool_choice {
        Some(ToolChoice::Named(name)) => Some(name),
        _ => None,
    };
    for name in chat.tools.iter().map(|tool| &tool.name).chain(forced) {
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    names
}

/// Signs and verifies session ids and plans under the liaison secret (derived from the master key).
#[derive(Clone)]
pub struct LiaisonKey([u8; 32]);

impl std::fmt::Debug for LiaisonKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("LiaisonKey(***)")
    }
}

/// The signed fields of a plan, in their signed order.
#[derive(Serialize)]
struct Envelope<'a> {
    v: u32,
    plan_id: &'a str,
    liaison_id: &'a str,
    tenant_id: &'a str,
    model: &'a str,
    ceiling_nanos: i64,
    estimated_nanos: i64,
    allowed_models: &'a [String],
    allowed_tools: &'a [String],
    prompt_fingerprint: &'a str,
    issued_at: i64,
    ttl_seconds: i64,
    max_tokens: i64,
}

impl LiaisonKey {
    /// A key over a 32-byte secret.
    pub fn new(secret: [u8; 32]) -> Self {
        LiaisonKey(secret)
    }

    fn mac(&self, domain: &[u8], parts: &[&[u8]]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(domain);
        for part in parts {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac
    }

    /// `lia_<session id>.<base64url HMAC>`: the id bound to its tenant.
    pub fn sign_session(&self, tenant_id: &str, session_id: &str) -> String {
        let tag = self.mac(b"liaison-session\0", &[tenant_id.as_bytes(), session_id.as_bytes()]).finalize().into_bytes();
        format!("{SESSION_PREFIX}{session_id}.{}", URL_SAFE_NO_PAD.encode(tag))
    }

    /// The session id of a signed id issued to this tenant, None for anything else.
    pub fn open_session(&self, tenant_id: &str, signed: &str) -> Option<String> {
        let (session_id, tag) = signed.strip_prefix(SESSION_PREFIX)?.split_once('.')?;
        if session_id.is_empty() || session_id.len() > 64 || !session_id.bytes().all(|byte| byte.is_ascii_hexdigit()) {
            return None;
        }
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        self.mac(b"liaison-session\0", &[tenant_id.as_bytes(), session_id.as_bytes()]).verify_slice(&tag).ok()?;
        Some(session_id.to_string())
    }

    /// The plan's signature: base64url HMAC-SHA256 over its envelope.
    pub fn sign_plan(&self, plan: &LiaisonPlan) -> String {
        URL_SAFE_NO_PAD.encode(self.mac(b"liaison-plan\0", &[&envelope_bytes(plan)]).finalize().into_bytes())
    }

    /// Whether the plan's signature is this key's over its envelope (compared in constant time).
    pub fn verify_plan(&self, plan: &LiaisonPlan) -> bool {
        let Ok(tag) = URL_SAFE_NO_PAD.decode(&plan.signature) else { return false };
        self.mac(b"liaison-plan\0", &[&envelope_bytes(plan)]).verify_slice(&tag).is_ok()
    }
}

/// The envelope's canonical bytes: its JSON with the members in their declared order.
pub fn envelope_bytes(plan: &LiaisonPlan) -> Vec<u8> {
    let envelope = Envelope {
        v: plan.v,
        plan_id: &plan.plan_id,
        liaison_id: &plan.liaison_id,
        tenant_id: &plan.tenant_id,
        model: &plan.model,
        ceiling_nanos: plan.ceiling_nanos,
        estimated_nanos: plan.estimated_nanos,
        allowed_models: &plan.allowed_models,
        allowed_tools: &plan.allowed_tools,
        prompt_fingerprint: &plan.prompt_fingerprint,
        issued_at: plan.issued_at,
        ttl_seconds: plan.ttl_seconds,
        max_tokens: plan.max_tokens,
    };
    serde_json::to_vec(&envelope).unwrap_or_default()
}

/// The envelope as stored, owned.
#[derive(Deserialize)]
struct StoredEnvelope {
    v: u32,
    plan_id: String,
    liaison_id: String,
    tenant_id: String,
    model: String,
    ceiling_nanos: i64,
    estimated_nanos: i64,
    allowed_models: Vec<String>,
    allowed_tools: Vec<String>,
    prompt_fingerprint: String,
    issued_at: i64,
    ttl_seconds: i64,
    max_tokens: i64,
}

/// A plan's signed fields read back from `envelope_bytes`' JSON (signature and state left empty).
pub fn plan_from_envelope(json: &str) -> Option<LiaisonPlan> {
    let envelope: StoredEnvelope = serde_json::from_str(json).ok()?;
    Some(LiaisonPlan {
        v: envelope.v,
        plan_id: envelope.plan_id,
        liaison_id: envelope.liaison_id,
        tenant_id: envelope.tenant_id,
        model: envelope.model,
        ceiling_nanos: envelope.ceiling_nanos,
        estimated_nanos: envelope.estimated_nanos,
        allowed_models: envelope.allowed_models,
        allowed_tools: envelope.allowed_tools,
        prompt_fingerprint: envelope.prompt_fingerprint,
        issued_at: envelope.issued_at,
        ttl_seconds: envelope.ttl_seconds,
        max_tokens: envelope.max_tokens,
        ..LiaisonPlan::default()
    })
}

/// SHA-256 (hex) over the committed requests' audit commitments in commit order: one digest that
/// names every piece of evidence a session produced.
pub fn trace_digest<'a>(commitments: impl IntoIterator<Item = &'a str>) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"brainstorm/liaison/trace-digest/v2\0");
    for commitment in commitments {
        hasher.update((commitment.len() as u64).to_be_bytes());
        hasher.update(commitment.as_bytes());
    }
    hex::encode(hasher.finalize())
}

#[cfg(test)]
mod tests {
    use brainstorm_providers::chat::{Message, Tool};

    use super::*;

    fn key() -> LiaisonKey {
        LiaisonKey::new([7; 32])
    }

    fn chat(text: &str) -> ChatRequest {
        ChatRequest {
            model: "openai/gpt-4o-mini".to_string(),
            system: Some("be brief".to_string()),
            messages: vec![Message { role: Role::User, parts: vec![Part::Text(text.to_string())] }],
            ..ChatRequest::default()
        }
    }

    fn plan(model: &str, allowed_models: &[&str], allowed_tools: &[&str]) -> LiaisonPlan {
        let digest = prompt_digest(&chat("hello"));
        let mut plan = LiaisonPlan {
            v: ENVELOPE_VERSION,
            plan_id: "p1".to_string(),
            liaison_id: key().sign_session("t1", "ab"),
            tenant_id: "t1".to_string(),
            model: model.to_string(),
            ceiling_nanos: 1_000,
            estimated_nanos: 900,
            allowed_models: allowed_models.iter().map(|model| model.to_string()).collect(),
            allowed_tools: allowed_tools.iter().map(|tool| tool.to_string()).collect(),
            prompt_fingerprint: fingerprint(variant_of(model), &digest),
            issued_at: 1_700_000_000,
            ttl_seconds: 60,
            max_tokens: 100,
            ..LiaisonPlan::default()
        };
        plan.signature = key().sign_plan(&plan);
        plan
    }

    fn commit<'a>(label: &'a str, digest: &'a str, tools: &'a [String], worst: i64) -> Commitment<'a> {
        Commitment { model_label: label, prompt_digest: digest, tool_names: tools, worst_case_nanos: worst, tenant_has_provider_keys: true }
    }

    #[test]
    fn session_ids_are_bound_to_their_tenant_and_unforgeable() {
        let signed = key().sign_session("t1", "0123abcd");
        assert_eq!(key().open_session("t1", &signed).as_deref(), Some("0123abcd"));
        assert_eq!(key().open_session("t2", &signed), None, "another tenant's id");
        assert_eq!(LiaisonKey::new([8; 32]).open_session("t1", &signed), None, "another key");
        let forged = signed.replace("0123abcd", "0123abce");
        assert_eq!(key().open_session("t1", &forged), None);
        for junk in ["", "lia_", "lia_.x", "lia_zz.AAAA", "0123abcd", "lia_0123abcd"] {
            assert_eq!(key().open_session("t1", junk), None, "{junk}");
        }
    }

    #[test]
    fn a_plan_signature_covers_every_envelope_field() {
        let signed = plan("openai/gpt-4o-mini", &["openai/gpt-4o-mini"], &[]);
        assert!(key().verify_plan(&signed));
        let tampered: [fn(&mut LiaisonPlan); 6] = [
            |plan| plan.ceiling_nanos += 1,
            |plan| plan.model = "openai/gpt-4o".to_string(),
            |plan| plan.allowed_models.push("*".to_string()),
            |plan| plan.allowed_tools.push("shell".to_string()),
            |plan| plan.ttl_seconds = 300,
            |plan| plan.prompt_fingerprint = "0".repeat(64),
        ];
        for tamper in tampered {
            let mut changed = signed.clone();
            tamper(&mut changed);
            assert!(!key().verify_plan(&changed));
        }
        assert!(!LiaisonKey::new([8; 32]).verify_plan(&signed));
        let mut stored = plan_from_envelope(std::str::from_utf8(&envelope_bytes(&signed)).unwrap_or_default()).unwrap_or_default();
        stored.signature = signed.signature.clone();
        assert!(key().verify_plan(&stored), "the stored envelope reads back to the signed fields");
    }

    #[test]
    fn the_prompt_digest_is_the_conversation_not_its_format_or_concatenation() {
        assert_eq!(prompt_digest(&chat("hello")), prompt_digest(&chat("hello")));
        assert_ne!(prompt_digest(&chat("hello")), prompt_digest(&chat("hellO")));
        let mut split = chat("hel");
        split.messages[0].parts.push(Part::Text("lo".to_string()));
        assert_ne!(prompt_digest(&split), prompt_digest(&chat("hello")), "part boundaries count");
        let mut other_model = chat("hello");
        other_model.model = "anthropic/claude".to_string();
        other_model.max_tokens = Some(5);
        assert_eq!(prompt_digest(&other_model), prompt_digest(&chat("hello")), "the model and options are not the prompt");
    }

    #[test]
    fn a_faithful_commit_passes_and_each_rule_refuses_its_breach() {
        let digest = prompt_digest(&chat("hello"));
        let none: Vec<String> = Vec::new();
        let minted = plan("openai/gpt-4o-mini", &["openai/gpt-4o-mini"], &[]);
        assert_eq!(judge(&minted, &commit("openai/gpt-4o-mini", &digest, &none, 1_000)), Ok(()));
        let refusal = |plan: &LiaisonPlan, commitment: Commitment<'_>| judge(plan, &commitment).err().map(|(refusal, _)| refusal);
        assert_eq!(refusal(&minted, commit("openai/gpt-4o", &digest, &none, 10)), Some(Refusal::ModelOutsideGrant));
        assert_eq!(refusal(&minted, commit("openai/gpt-4o-mini", &digest, &none, 1_001)), Some(Refusal::CeilingExceeded));
        let other = prompt_digest(&chat("goodbye"));
        assert_eq!(refusal(&minted, commit("openai/gpt-4o-mini", &other, &none, 10)), Some(Refusal::FingerprintMismatch));
        let tools = vec!["search_docs".to_string()];
        assert_eq!(refusal(&minted, commit("openai/gpt-4o-mini", &digest, &tools, 10)), Some(Refusal::ToolOutsideGrant), "[] grants none");
        let globbed = plan("openai/gpt-4o-mini", &["*"], &["search_*"]);
        assert_eq!(refusal(&globbed, commit("anthropic/claude-3-5-haiku", &digest, &tools, 10)), None);
        let shell = vec!["search_docs".to_string(), "shell".to_string()];
        assert_eq!(refusal(&globbed, commit("openai/gpt-4o-mini", &digest, &shell, 10)), Some(Refusal::ToolOutsideGrant));
        // A variant-suffixed label does not satisfy a grant of its base model.
        assert_eq!(refusal(&minted, commit("openai/gpt-4o-mini:fast", &digest, &none, 10)), Some(Refusal::ModelOutsideGrant));
    }

    #[test]
    fn a_variant_is_pinned_by_the_fingerprint() {
        let digest = prompt_digest(&chat("hello"));
        let none: Vec<String> = Vec::new();
        let pinned = plan("openai/gpt-4o-mini:fast", &["openai/gpt-4o-mini:fast"], &[]);
        assert_eq!(judge(&pinned, &commit("openai/gpt-4o-mini:fast", &digest, &none, 10)), Ok(()));
        let base = judge(&pinned, &commit("openai/gpt-4o-mini", &digest, &none, 10));
        assert_eq!(base.err().map(|(refusal, _)| refusal), Some(Refusal::FingerprintMismatch));
    }

    #[test]
    fn a_sandbox_plan_commits_only_the_sandbox_and_only_without_keys() {
        let digest = prompt_digest(&chat("hello"));
        let none: Vec<String> = Vec::new();
        let sandbox = plan(SANDBOX_LABEL, &[SANDBOX_LABEL], &[]);
        let mut commitment = commit(SANDBOX_LABEL, &digest, &none, 0);
        commitment.tenant_has_provider_keys = false;
        assert_eq!(judge(&sandbox, &commitment), Ok(()));
        commitment.model_label = "openai/gpt-4o-mini";
        assert_eq!(judge(&sandbox, &commitment).err().map(|(refusal, _)| refusal), Some(Refusal::FingerprintMismatch));
        commitment.model_label = SANDBOX_LABEL;
        commitment.tenant_has_provider_keys = true;
        assert_eq!(judge(&sandbox, &commitment).err().map(|(refusal, _)| refusal), Some(Refusal::SandboxPlanVoid));
    }

    #[test]
    fn tool_names_cover_offered_and_forced_tools_once() {
        let mut request = chat("hello");
        let tool =
            |name: &str| Tool { name: name.to_string(), description: None, parameters: brainstorm_providers::chat::Schema::empty_object() };
        request.tools = vec![tool("a"), tool("b"), tool("a")];
        request.tool_choice = Some(ToolChoice::Named("c".to_string()));
        assert_eq!(tool_names(&request), ["a", "b", "c"]);
    }

    #[test]
    fn the_trace_digest_depends_on_order_and_content() {
        let one = trace_digest(["aa", "bb"]);
        assert_eq!(one, trace_digest(["aa", "bb"]));
        assert_ne!(one, trace_digest(["bb", "aa"]));
        assert_ne!(one, trace_digest(["aab", "b"]));
    }
}
