//! The canonical encoding of audit payloads, and the hashes built on it (commitment, chain hash).
//!
//! Canonical JSON, fully determined by the value:
//! - objects: members sorted by the UTF-8 bytes of their keys, `{"a":1,"b":"x"}`, no whitespace anywhere;
//! - members whose value is empty are omitted: `""`, `0`, `false`, `[]`, `{}` and unset optional fields
//!   (so a field added later, left unset, leaves older payloads and their hashes unchanged);
//! - list elements are kept as they are, in order;
//! - integers in plain decimal (`-12`, `0`); there are no floats (money is integer nano-dollars, scores
//!   are integer millionths);
//! - strings in double quotes, escaping `"` and `\` with a backslash, U+0008/0009/000A/000C/000D as `\b
//!   \t \n \f \r`, every other character below U+0020 as `\u00xx` (lowercase hex); everything else is
//!   written as its UTF-8 bytes (the string rules of RFC 8785).
//!
//! The payload of a record is its canonical object (field names as in `audit.proto`) with `capture`
//! replaced by `capture_digest` and `chain_schema_version: 2` added. Then:
//! - `commitment = hex(SHA-256(payload))`: what the edge returns in `X-BR-Audit-Hash` at once;
//! - `hash = hex(SHA-256(payload || prev_hash))`, where `prev_hash` is the previous row's `hash` as 64
//!   lowercase hex ASCII characters (64 `0`s before the first row).

use std::borrow::Cow;

use brainstorm_proto::audit::{
    AgentContext, AuditRecord, CandidateDecision, Capture, DecisionPath, DecisionStep, GrantContext, PolicyContext, Principal, TraceContext,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

mod record_writer;

/// The chain schema version every payload carries.
pub const CHAIN_SCHEMA_VERSION: i64 = 2;

/// The `prev_hash` of a chain's first row.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// A value that has exactly one canonical text. Text borrows from what it encodes where it can: a
/// record's payload is built on every request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Canonical<'a> {
    Integer(i64),
    Text(Cow<'a, str>),
    Bool(bool),
    List(Vec<Canonical<'a>>),
    /// Members sorted by the bytes of their keys, each key once (as [`ObjectBuilder`] leaves them):
    /// a sorted list costs less to build, walk and drop than a tree, and compares the same.
    Object(Vec<(Cow<'a, str>, Canonical<'a>)>),
}

/// Why a payload is not a canonical audit payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CanonicalError {
    #[error("payload is not JSON: {0}")]
    NotJson(String),
    #[error("payload holds a value canonical JSON cannot: {0}")]
    Unrepresentable(String),
    #[error("payload field `{0}` has the wrong type")]
    WrongType(String),
}

impl<'a> Canonical<'a> {
    /// Whether the value is omitted as an object member.
    fn is_empty(&self) -> bool {
        match self {
            Canonical::Integer(value) => *value == 0,
            Canonical::Text(text) => text.is_empty(),
            Canonical::Bool(value) => !value,
            Canonical::List(items) => items.is_empty(),
            Canonical::Object(members) => members.is_empty(),
        }
    }

    /// The canonical bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        // A request's record is one to two kilobytes: one allocation, rarely a second.
        let mut out = Vec::with_capacity(2048);
        self.write(&mut out);
        out
    }

    /// The canonical text.
    pub fn to_text(&self) -> String {
        // Only valid UTF-8 is ever written (string contents are copied whole, the rest is ASCII), so
        // the bytes become the text without a copy; the lossy branch is never taken.
        String::from_utf8(self.to_bytes()).unwrap_or_else(|error| String::from_utf8_lossy(error.as_bytes()).into_owned())
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Canonical::Integer(value) => out.extend_from_slice(itoa::Buffer::new().format(*value).as_bytes()),
            Canonical::Text(text) => write_string(text, out),
            Canonical::Bool(value) => out.extend_from_slice(if *value { b"true" } else { b"false" }),
            Canonical::List(items) => {
                out.push(b'[');
                for (index, item) in items.iter().enumerate() {
                    if index > 0 {
                        out.push(b',');
                    }
                    item.write(out);
                }
                out.push(b']');
            }
            Canonical::Object(members) => {
                out.push(b'{');
                for (index, (key, value)) in members.iter().enumerate() {
                    if index > 0 {
                        out.push(b',');
                    }
                    write_string(key, out);
                    out.push(b':');
                    value.write(out);
                }
                out.push(b'}');
            }
        }
    }

    /// Reads parsed JSON, rejecting what canonical JSON cannot hold (floats, null, integers beyond i64)
    /// and dropping empty members, as the encoder does.
    pub fn from_json(value: &'a Value) -> Result<Canonical<'a>, CanonicalError> {
        match value {
            Value::Null => Err(CanonicalError::Unrepresentable("null".to_string())),
            Value::Bool(flag) => Ok(Canonical::Bool(*flag)),
            Value::Number(number) => {
                number.as_i64().map(Canonical::Integer).ok_or_else(|| CanonicalError::Unrepresentable(number.to_string()))
            }
            Value::String(text) => Ok(Canonical::Text(Cow::Borrowed(text))),
            Value::Array(items) => items.iter().map(Canonical::from_json).collect::<Result<_, _>>().map(Canonical::List),
            Value::Object(members) => {
                let mut object = ObjectBuilder::new();
                for (key, member) in members {
                    object = object.value(key.as_str(), Canonical::from_json(member)?);
                }
                Ok(object.build())
            }
        }
    }
}

fn write_string(text: &str, out: &mut Vec<u8>) {
    out.reserve(text.len() + 2);
    out.push(b'"');
    // Every character that needs escaping is ASCII, so runs of other bytes (UTF-8 included) are
    // copied as they are.
    let bytes = text.as_bytes();
    // Most strings escape nothing: a scan without an early exit (which the compiler vectorises)
    // tells, and the string is copied whole.
    let needs_escaping = bytes.iter().fold(false, |found, &byte| found | (byte < 0x20) | (byte == b'"') | (byte == b'\\'));
    if !needs_escaping {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    let mut run_start = 0;
    for (index, &byte) in bytes.iter().enumerate() {
        let escaped: &[u8] = match byte {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x09 => b"\\t",
            0x0a => b"\\n",
            0x0c => b"\\f",
            0x0d => b"\\r",
            control if control < 0x20 => {
                out.extend_from_slice(&bytes[run_start..index]);
                out.extend_from_slice(format!("\\u{control:04x}").as_bytes());
                run_start = index + 1;
                continue;
            }
            _ => continue,
        };
        out.extend_from_slice(&bytes[run_start..index]);
        out.extend_from_slice(escaped);
        run_start = index + 1;
    }
    out.extend_from_slice(&bytes[run_start..]);
    out.push(b'"');
}

/// Builds a canonical object, dropping empty members; a key added twice keeps its last value.
#[derive(Debug, Default)]
pub struct ObjectBuilder<'a> {
    members: Vec<(Cow<'a, str>, Canonical<'a>)>,
}

impl<'a> ObjectBuilder<'a> {
    /// An empty object.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty object with room for `members` members (the record's object has about thirty: it
    /// would otherwise grow five times).
    pub fn with_capacity(members: usize) -> Self {
        ObjectBuilder { members: Vec::with_capacity(members) }
    }

    /// Adds a member unless its value is empty.
    pub fn value(mut self, key: impl Into<Cow<'a, str>>, value: Canonical<'a>) -> Self {
        if !value.is_empty() {
            self.members.push((key.into(), value));
        }
        self
    }

    pub fn text(self, key: impl Into<Cow<'a, str>>, text: impl Into<Cow<'a, str>>) -> Self {
        self.value(key, Canonical::Text(text.into()))
    }

    pub fn optional_text(self, key: impl Into<Cow<'a, str>>, text: Option<impl Into<Cow<'a, str>>>) -> Self {
        match text {
            Some(text) => self.text(key, text),
            None => self,
        }
    }

    pub fn integer(self, key: impl Into<Cow<'a, str>>, value: i64) -> Self {
        self.value(key, Canonical::Integer(value))
    }

    pub fn optional_integer(self, key: impl Into<Cow<'a, str>>, value: Option<i64>) -> Self {
        match value {
            Some(value) => self.integer(key, value),
            None => self,
        }
    }

    pub fn bool(self, key: impl Into<Cow<'a, str>>, value: bool) -> Self {
        self.value(key, Canonical::Bool(value))
    }

    pub fn texts(self, key: impl Into<Cow<'a, str>>, texts: &'a [String]) -> Self {
        self.value(key, Canonical::List(texts.iter().map(|text| Canonical::Text(Cow::Borrowed(text))).collect()))
    }

    /// The object.
    pub fn build(mut self) -> Canonical<'a> {
        // Builders below add members in key order, so the check usually spares the sort. Stable: of
        // members with one key, the last added ends last, and is the one kept.
        if !self.members.is_sorted_by(|(left, _), (right, _)| left.as_bytes() <= right.as_bytes()) {
            self.members.sort_by(|(left, _), (right, _)| left.as_bytes().cmp(right.as_bytes()));
        }
        // Of each run of equal keys the last is kept, compacted in place (no second list).
        let mut kept = 0;
        for index in 0..self.members.len() {
            if kept > 0 && self.members[kept - 1].0 == self.members[index].0 {
                self.members.swap(kept - 1, index);
            } else {
                self.members.swap(kept, index);
                kept += 1;
            }
        }
        self.members.truncate(kept);
        Canonical::Object(self.members)
    }
}

/// Lowercase hex SHA-256 of some bytes.
pub fn sha256_hex(parts: &[&[u8]]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    digest_hex(&hasher.finalize())
}

/// Lowercase hex of a digest, written from a table (`hex::encode` goes through a char iterator: about
/// ten times the instructions, three times per request).
fn digest_hex(digest: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(digest.len() * 2);
    for byte in digest {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    text
}

/// The digest a captured prompt and completion are chained by.
pub fn capture_digest(capture: &Capture) -> String {
    let object = ObjectBuilder::new().text("prompt", &capture.prompt).text("completion", &capture.completion).build();
    sha256_hex(&[&object.to_bytes()])
}

/// The record's canonical payload: the text that is hashed and stored.
pub fn canonical_payload(record: &AuditRecord) -> String {
    record_writer::record_payload(record)
}

/// The commitment to a record: `hex(SHA-256(canonical payload))`, known before the record is chained
/// (the edge's `X-BR-Audit-Hash`); the chained row stores it, so verification can match it later.
pub fn commitment(record: &AuditRecord) -> String {
    payload_commitment(&canonical_payload(record))
}

/// The commitment of an already encoded payload.
pub fn payload_commitment(payload: &str) -> String {
    sha256_hex(&[payload.as_bytes()])
}

/// A row's chain hash: `hex(SHA-256(payload || prev_hash))`.
pub fn chain_hash(payload: &str, prev_hash: &str) -> String {
    sha256_hex(&[payload.as_bytes(), prev_hash.as_bytes()])
}

/// A payload's commitment and its row's chain hash, with one pass over the payload (the hash state
/// after the payload is the commitment's, continued with `prev_hash`).
pub fn commitment_and_chain_hash(payload: &str, prev_hash: &str) -> (String, String) {
    let mut hasher = Sha256::new();
    hasher.update(payload.as_bytes());
    let commitment = digest_hex(&hasher.clone().finalize());
    hasher.update(prev_hash.as_bytes());
    (commitment, digest_hex(&hasher.finalize()))
}

/// The tree the payload writer must match (`record_writer`), for its tests.
#[cfg(test)]
fn record_object(record: &AuditRecord) -> Canonical<'_> {
    let capture_digest = record.capture.as_ref().map(capture_digest).unwrap_or_default();
    // Members in key order (see `ObjectBuilder::build`).
    ObjectBuilder::with_capacity(32)
        .value("agent", record.agent.as_ref().map(agent_object).unwrap_or_else(empty))
        .optional_text("agent_id", record.agent_id.as_ref())
        .text("capture_digest", capture_digest)
        .integer("chain_schema_version", CHAIN_SCHEMA_VERSION)
        .optional_text("conversation_id", record.conversation_id.as_ref())
        .integer("cost_nanos", record.cost_nanos)
        .text("coverage", &record.coverage)
        .value("decision", record.decision.as_ref().map(decision_object).unwrap_or_else(empty))
        .text("endpoint", &record.endpoint)
        .value("grant", record.grant.as_ref().map(grant_object).unwrap_or_else(empty))
        .integer("input_tokens", record.input_tokens)
        .optional_text("key_id", record.key_id.as_ref())
        .integer("latency_ms", record.latency_ms)
        .text("model_executed", &record.model_executed)
        .text("model_requested", &record.model_requested)
        .text("model_resolved", &record.model_resolved)
        .text("occurred_at", &record.occurred_at)
        .text("outcome", &record.outcome)
        .integer("output_tokens", record.output_tokens)
        .value("policy", record.policy.as_ref().map(policy_object).unwrap_or_else(empty))
        .value("principal", record.principal.as_ref().map(principal_object).unwrap_or_else(empty))
        .text("provider", &record.provider)
        .text("reason_code", &record.reason_code)
        .text("request_id", &record.request_id)
        .text("strategy", &record.strategy)
        .text("tenant_id", &record.tenant_id)
        .value("trace", record.trace.as_ref().map(trace_object).unwrap_or_else(empty))
        .build()
}

#[cfg(test)]
fn empty<'a>() -> Canonical<'a> {
    Canonical::Object(Vec::new())
}

#[cfg(test)]
fn principal_object(principal: &Principal) -> Canonical<'_> {
    ObjectBuilder::new()
        .text("auth_method", &principal.auth_method)
        .text("id", &principal.id)
        .optional_text("owner_id", principal.owner_id.as_ref())
        .optional_text("spiffe_id", principal.spiffe_id.as_ref())
        .build()
}

#[cfg(test)]
fn trace_object(trace: &TraceContext) -> Canonical<'_> {
    ObjectBuilder::new()
        .bool("inbound_trusted", trace.inbound_trusted)
        .text("origin", &trace.origin)
        .optional_text("parent_span_id", trace.parent_span_id.as_ref())
        .text("span_id", &trace.span_id)
        .text("trace_id", &trace.trace_id)
        .build()
}

#[cfg(test)]
fn policy_object(policy: &PolicyContext) -> Canonical<'_> {
    ObjectBuilder::new()
        .texts("matched_rules", &policy.matched_rules)
        .optional_text("deny_rule", policy.deny_rule.as_ref())
        .optional_text("verdict_id", policy.verdict_id.as_ref())
        .build()
}

#[cfg(test)]
fn agent_object(agent: &AgentContext) -> Canonical<'_> {
    ObjectBuilder::new()
        .bool("registered", agent.registered)
        .optional_text("owner_id", agent.owner_id.as_ref())
        .text("owner_source", &agent.owner_source)
        .text("identity_source", &agent.identity_source)
        .optional_text("mesh_source", agent.mesh_source.as_ref())
        .integer("mesh_hop_count", agent.mesh_hop_count)
        .optional_text("lifecycle_state", agent.lifecycle_state.as_ref())
        .build()
}

#[cfg(test)]
fn grant_object(grant: &GrantContext) -> Canonical<'_> {
    ObjectBuilder::new()
        .optional_text("grant_id", grant.grant_id.as_ref())
        .optional_text("plan_id", grant.plan_id.as_ref())
        .optional_text("approval_id", grant.approval_id.as_ref())
        .build()
}

#[cfg(test)]
fn decision_object(decision: &DecisionPath) -> Canonical<'_> {
    let candidates = decision
        .candidates
        .iter()
        .map(|candidate| {
            ObjectBuilder::new()
                .optional_integer("estimated_cost_nanos", candidate.estimated_cost_nanos)
                .text("model", &candidate.model)
                .text("provider", &candidate.provider)
                .text("reason", &candidate.reason)
                .integer("score_micros", candidate.score_micros)
                .text("status", &candidate.status)
                .build()
        })
        .collect();
    let steps = decision
        .steps
        .iter()
        .map(|step| {
            ObjectBuilder::new()
                .text("stage", &step.stage)
                .text("result", &step.result)
                .text("detail", &step.detail)
                .integer("elapsed_micros", step.elapsed_micros)
                .build()
        })
        .collect();
    ObjectBuilder::new()
        .value("candidates", Canonical::List(candidates))
        .integer("complexity_level", decision.complexity_level)
        .integer("complexity_score", decision.complexity_score)
        .text("reason", &decision.reason)
        .integer("score_micros", decision.score_micros)
        .text("selected_model", &decision.selected_model)
        .text("selection_method", &decision.selection_method)
        .value("steps", Canonical::List(steps))
        .build()
}

/// A record decoded from its stored payload, with the capture digest it was chained with.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedPayload {
    /// The record (its `capture` is never set: the payload holds only the digest).
    pub record: AuditRecord,
    pub capture_digest: Option<String>,
    pub chain_schema_version: i64,
}

/// Decodes a stored payload, and checks that it is exactly the canonical encoding of what it holds.
pub fn decode_payload(payload: &str) -> Result<DecodedPayload, CanonicalError> {
    let value: Value = serde_json::from_str(payload).map_err(|error| CanonicalError::NotJson(error.to_string()))?;
    if Canonical::from_json(&value)?.to_text() != payload {
        return Err(CanonicalError::Unrepresentable("the payload is not in canonical form".to_string()));
    }
    let root = Fields::of(&value, "payload")?;
    let principal = root.object("principal")?.map(|fields| -> Result<Principal, CanonicalError> {
        Ok(Principal {
            id: fields.text("id")?,
            auth_method: fields.text("auth_method")?,
            spiffe_id: fields.optional_text("spiffe_id")?,
            owner_id: fields.optional_text("owner_id")?,
        })
    });
    let trace = root.object("trace")?.map(|fields| -> Result<TraceContext, CanonicalError> {
        Ok(TraceContext {
            trace_id: fields.text("trace_id")?,
            span_id: fields.text("span_id")?,
            parent_span_id: fields.optional_text("parent_span_id")?,
            origin: fields.text("origin")?,
            inbound_trusted: fields.bool("inbound_trusted")?,
        })
    });
    let policy = root.object("policy")?.map(|fields| -> Result<PolicyContext, CanonicalError> {
        Ok(PolicyContext {
            matched_rules: fields.texts("matched_rules")?,
            deny_rule: fields.optional_text("deny_rule")?,
            verdict_id: fields.optional_text("verdict_id")?,
        })
    });
    let agent = root.object("agent")?.map(|fields| -> Result<AgentContext, CanonicalError> {
        Ok(AgentContext {
            registered: fields.bool("registered")?,
            owner_id: fields.optional_text("owner_id")?,
            owner_source: fields.text("owner_source")?,
            identity_source: fields.text("identity_source")?,
            mesh_source: fields.optional_text("mesh_source")?,
            mesh_hop_count: fields.integer("mesh_hop_count")?,
            lifecycle_state: fields.optional_text("lifecycle_state")?,
        })
    });
    let grant = root.object("grant")?.map(|fields| -> Result<GrantContext, CanonicalError> {
        Ok(GrantContext {
            grant_id: fields.optional_text("grant_id")?,
            plan_id: fields.optional_text("plan_id")?,
            approval_id: fields.optional_text("approval_id")?,
        })
    });
    let decision = root.object("decision")?.map(decode_decision);
    let record = AuditRecord {
        request_id: root.text("request_id")?,
        tenant_id: root.text("tenant_id")?,
        occurred_at: root.text("occurred_at")?,
        endpoint: root.text("endpoint")?,
        key_id: root.optional_text("key_id")?,
        agent_id: root.optional_text("agent_id")?,
        principal: principal.transpose()?,
        model_requested: root.text("model_requested")?,
        model_resolved: root.text("model_resolved")?,
        model_executed: root.text("model_executed")?,
        provider: root.text("provider")?,
        strategy: root.text("strategy")?,
        input_tokens: root.integer("input_tokens")?,
        output_tokens: root.integer("output_tokens")?,
        cost_nanos: root.integer("cost_nanos")?,
        outcome: root.text("outcome")?,
        reason_code: root.text("reason_code")?,
        latency_ms: root.integer("latency_ms")?,
        trace: trace.transpose()?,
        policy: policy.transpose()?,
        agent: agent.transpose()?,
        grant: grant.transpose()?,
        decision: decision.transpose()?,
        capture: None,
        coverage: root.text("coverage")?,
        conversation_id: root.optional_text("conversation_id")?,
        // The payload is what was decoded; it does not carry itself.
        canonical_payload: String::new(),
    };
    Ok(DecodedPayload {
        record,
        capture_digest: root.optional_text("capture_digest")?,
        chain_schema_version: root.integer("chain_schema_version")?,
    })
}

fn decode_decision(fields: Fields<'_>) -> Result<DecisionPath, CanonicalError> {
    let candidates = fields
        .objects("candidates")?
        .into_iter()
        .map(|candidate| {
            Ok(CandidateDecision {
                model: candidate.text("model")?,
                provider: candidate.text("provider")?,
                estimated_cost_nanos: candidate.optional_integer("estimated_cost_nanos")?,
                score_micros: candidate.integer("score_micros")?,
                status: candidate.text("status")?,
                reason: candidate.text("reason")?,
            })
        })
        .collect::<Result<_, CanonicalError>>()?;
    let steps = fields
        .objects("steps")?
        .into_iter()
        .map(|step| {
            Ok(DecisionStep {
                stage: step.text("stage")?,
                result: step.text("result")?,
                detail: step.text("detail")?,
                elapsed_micros: step.integer("elapsed_micros")?,
            })
        })
        .collect::<Result<_, CanonicalError>>()?;
    Ok(DecisionPath {
        selected_model: fields.text("selected_model")?,
        score_micros: fields.integer("score_micros")?,
        selection_method: fields.text("selection_method")?,
        reason: fields.text("reason")?,
        complexity_level: fields.integer("complexity_level")?,
        complexity_score: fields.integer("complexity_score")?,
        candidates,
        steps,
    })
}

/// Typed access to a JSON object's members, absent members reading as empty values.
#[derive(Clone, Copy)]
struct Fields<'a> {
    members: &'a serde_json::Map<String, Value>,
}

impl<'a> Fields<'a> {
    fn of(value: &'a Value, name: &str) -> Result<Self, CanonicalError> {
        value.as_object().map(|members| Fields { members }).ok_or_else(|| CanonicalError::WrongType(name.to_string()))
    }

    fn wrong(key: &str) -> CanonicalError {
        CanonicalError::WrongType(key.to_string())
    }

    fn optional_text(&self, key: &str) -> Result<Option<String>, CanonicalError> {
        match self.members.get(key) {
            None => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(_) => Err(Self::wrong(key)),
        }
    }

    fn text(&self, key: &str) -> Result<String, CanonicalError> {
        Ok(self.optional_text(key)?.unwrap_or_default())
    }

    fn optional_integer(&self, key: &str) -> Result<Option<i64>, CanonicalError> {
        match self.members.get(key) {
            None => Ok(None),
            Some(value) => value.as_i64().map(Some).ok_or_else(|| Self::wrong(key)),
        }
    }

    fn integer(&self, key: &str) -> Result<i64, CanonicalError> {
        Ok(self.optional_integer(key)?.unwrap_or_default())
    }

    fn bool(&self, key: &str) -> Result<bool, CanonicalError> {
        match self.members.get(key) {
            None => Ok(false),
            Some(value) => value.as_bool().ok_or_else(|| Self::wrong(key)),
        }
    }

    fn texts(&self, key: &str) -> Result<Vec<String>, CanonicalError> {
        match self.members.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => {
                items.iter().map(|item| item.as_str().map(str::to_string).ok_or_else(|| Self::wrong(key))).collect()
            }
            Some(_) => Err(Self::wrong(key)),
        }
    }

    fn object(&self, key: &str) -> Result<Option<Fields<'a>>, CanonicalError> {
        self.members.get(key).map(|value| Fields::of(value, key)).transpose()
    }

    fn objects(&self, key: &str) -> Result<Vec<Fields<'a>>, CanonicalError> {
        match self.members.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items.iter().map(|item| Fields::of(item, key)).collect(),
            Some(_) => Err(Self::wrong(key)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> AuditRecord {
        AuditRecord {
            request_id: "req_1".to_string(),
            tenant_id: "t1".to_string(),
            occurred_at: "2026-11-22T10:00:00.000Z".to_string(),
            endpoint: "/v1/chat/completions".to_string(),
            key_id: Some("k1".to_string()),
            principal: Some(Principal { id: "k1".to_string(), auth_method: "api_key".to_string(), ..Principal::default() }),
            model_requested: "auto".to_string(),
            model_executed: "openai/gpt-4o-mini".to_string(),
            input_tokens: 12,
            cost_nanos: 1_500,
            outcome: "allowed".to_string(),
            latency_ms: 0,
            ..AuditRecord::default()
        }
    }

    #[test]
    fn the_encoding_is_sorted_compact_and_drops_empty_members() {
        let expected = concat!(
            r#"{"chain_schema_version":2,"cost_nanos":1500,"endpoint":"/v1/chat/completions","input_tokens":12,"key_id":"k1","#,
            r#""model_executed":"openai/gpt-4o-mini","model_requested":"auto","occurred_at":"2026-11-22T10:00:00.000Z","#,
            r#""outcome":"allowed","principal":{"auth_method":"api_key","id":"k1"},"request_id":"req_1","tenant_id":"t1"}"#
        );
        assert_eq!(canonical_payload(&sample()), expected);
        // Pinned independently (Python's hashlib over the text above): changing the encoding breaks every chain.
        assert_eq!(commitment(&sample()), "cfe8f6fbf37676545af0567938edc6a2be60ff16d35a7109cbd33d958792a487");
    }

    /// Every member set, with the values that are dropped (empty texts, zeros, false), kept inside
    /// lists (empty texts, members-less objects) or escaped, and nested objects left empty.
    fn every_member() -> AuditRecord {
        let text = |value: &str| value.to_string();
        AuditRecord {
            agent: Some(AgentContext {
                registered: true,
                owner_id: Some(text("u\"1")),
                owner_source: text("agent_profile"),
                identity_source: text("header"),
                mesh_source: Some(text("")),
                mesh_hop_count: -2,
                lifecycle_state: Some(text("active")),
            }),
            agent_id: Some(text("agent-\u{1}7")),
            capture: Some(Capture { prompt: text("hi\n"), completion: text("") }),
            conversation_id: Some(text("c é")),
            cost_nanos: i64::MAX,
            coverage: text("captured"),
            decision: Some(DecisionPath {
                selected_model: text("openai/gpt-4o"),
                score_micros: 7,
                selection_method: text("alias"),
                reason: text("tab\there"),
                complexity_level: 0,
                complexity_score: i64::MIN,
                candidates: vec![
                    CandidateDecision {
                        model: text("openai/gpt-4o"),
                        provider: text("openai"),
                        estimated_cost_nanos: Some(0),
                        score_micros: 3,
                        status: text("selected"),
                        reason: text(""),
                    },
                    CandidateDecision::default(),
                    CandidateDecision { estimated_cost_nanos: Some(-5), ..CandidateDecision::default() },
                ],
                steps: vec![DecisionStep { stage: text("route"), result: text("ok"), detail: text("\u{7f}"), elapsed_micros: 12 }],
            }),
            endpoint: text("/v1/messages"),
            grant: Some(GrantContext { grant_id: Some(text("g")), plan_id: None, approval_id: Some(text("a")) }),
            input_tokens: 1,
            key_id: Some(text("")),
            latency_ms: 3,
            model_executed: text("m"),
            model_requested: text("auto"),
            model_resolved: text("r"),
            occurred_at: text("2026-11-26T21:00:00.000Z"),
            outcome: text("denied"),
            output_tokens: 2,
            policy: Some(PolicyContext {
                matched_rules: vec![text("b"), text(""), text("a")],
                deny_rule: Some(text("d")),
                verdict_id: None,
            }),
            principal: Some(Principal { id: text("k"), auth_method: text("api_key"), spiffe_id: Some(text("spiffe://x")), owner_id: None }),
            provider: text("anthropic"),
            reason_code: text("tool_firewall_blocked"),
            request_id: text("req_\u{2028}"),
            strategy: text("price"),
            tenant_id: text("t"),
            trace: Some(TraceContext {
                trace_id: text("0af7651916cd43dd8448eb211c80319c"),
                span_id: text("b7ad6b7169203331"),
                parent_span_id: None,
                origin: text("generated"),
                inbound_trusted: false,
            }),
            canonical_payload: text("ignored"),
        }
    }

    #[test]
    fn the_payload_writer_writes_what_the_canonical_object_encodes_to() {
        let empty_nested = AuditRecord {
            agent: Some(AgentContext::default()),
            decision: Some(DecisionPath::default()),
            grant: Some(GrantContext::default()),
            policy: Some(PolicyContext::default()),
            principal: Some(Principal::default()),
            trace: Some(TraceContext::default()),
            ..sample()
        };
        let only_nested = AuditRecord { agent: every_member().agent, trace: every_member().trace, ..AuditRecord::default() };
        for record in [sample(), every_member(), empty_nested, only_nested, AuditRecord::default()] {
            let payload = canonical_payload(&record);
            assert_eq!(payload, record_object(&record).to_text());
            let value: Value = serde_json::from_str(&payload).unwrap_or_default();
            assert_eq!(Canonical::from_json(&value).map(|canonical| canonical.to_text()), Ok(payload.clone()), "canonical: {payload}");
        }
    }

    #[test]
    fn strings_escape_exactly_the_rfc_8785_set() {
        let text = Canonical::Text("q\"b\\\u{08}\t\n\u{0c}\r\u{01}\u{1f} é\u{7f}\u{2028}".into()).to_text();
        assert_eq!(text, "\"q\\\"b\\\\\\b\\t\\n\\f\\r\\u0001\\u001f é\u{7f}\u{2028}\"");
    }

    #[test]
    fn negative_integers_and_nested_lists_are_plain() {
        let value = ObjectBuilder::new()
            .integer("b", -7)
            .value("a", Canonical::List(vec![Canonical::Integer(0), Canonical::Text(Cow::Borrowed("")), empty()]))
            .build();
        assert_eq!(value.to_text(), r#"{"a":[0,"",{}],"b":-7}"#);
        // A key added twice keeps its last value; keys sort by their bytes ("Z" < "a" < "é").
        let twice = ObjectBuilder::new().integer("é", 1).integer("a", 1).integer("Z", i64::MIN).integer("a", 2).build();
        assert_eq!(twice.to_text(), r#"{"Z":-9223372036854775808,"a":2,"é":1}"#);
        let runs = ObjectBuilder::with_capacity(2)
            .integer("b", 1)
            .integer("a", 1)
            .integer("b", 2)
            .integer("a", 2)
            .integer("a", 3)
            .integer("c", 1)
            .build();
        assert_eq!(runs.to_text(), r#"{"a":3,"b":2,"c":1}"#);
    }

    #[test]
    fn a_payload_decodes_to_the_record_it_encodes() -> Result<(), CanonicalError> {
        let mut record = sample();
        record.trace = Some(TraceContext {
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".to_string(),
            span_id: "00f067aa0ba902b7".to_string(),
            parent_span_id: Some("a3ce929d0e0e4736".to_string()),
            origin: "inbound".to_string(),
            inbound_trusted: true,
        });
        record.policy = Some(PolicyContext {
            matched_rules: vec!["r1".to_string(), "r2".to_string()],
            deny_rule: Some("r2".to_string()),
            verdict_id: None,
        });
        record.agent = Some(AgentContext {
            registered: true,
            owner_id: Some("u1".to_string()),
            owner_source: "agent_profile".to_string(),
            identity_source: "agent_jwt".to_string(),
            mesh_source: Some("planner".to_string()),
            mesh_hop_count: 2,
            lifecycle_state: Some("active".to_string()),
        });
        record.grant = Some(GrantContext { grant_id: Some("g".to_string()), plan_id: None, approval_id: Some("a".to_string()) });
        record.decision = Some(DecisionPath {
            selected_model: "openai/gpt-4o-mini".to_string(),
            score_micros: 812_345,
            selection_method: "capability-matched".to_string(),
            reason: "cheapest".to_string(),
            complexity_level: 1,
            complexity_score: 3,
            candidates: vec![CandidateDecision {
                model: "openai/gpt-4o".to_string(),
                provider: "openai".to_string(),
                estimated_cost_nanos: Some(2_000),
                score_micros: -5,
                status: "not_tried".to_string(),
                reason: "pricier".to_string(),
            }],
            steps: vec![DecisionStep {
                stage: "routing".to_string(),
                result: "pass".to_string(),
                detail: "auto".to_string(),
                elapsed_micros: 40,
            }],
        });
        record.capture = Some(Capture { prompt: "hi".to_string(), completion: "hello".to_string() });
        let payload = canonical_payload(&record);
        let decoded = decode_payload(&payload)?;
        assert_eq!(
            decoded.capture_digest.as_deref(),
            Some(capture_digest(&Capture { prompt: "hi".into(), completion: "hello".into() }).as_str())
        );
        let mut expected = record.clone();
        expected.capture = None;
        assert_eq!(decoded.record, expected);
        assert_eq!(decoded.chain_schema_version, CHAIN_SCHEMA_VERSION);
        assert!(payload.contains(r#""score_micros":-5"#));
        Ok(())
    }

    #[test]
    fn non_canonical_payloads_are_refused() {
        for payload in [
            r#"{"request_id":"r", "tenant_id":"t"}"#,
            r#"{"tenant_id":"t","request_id":"r"}"#,
            r#"{"cost_nanos":1.5}"#,
            r#"{"cost_nanos":0,"request_id":"r"}"#,
            r#"{"request_id":null}"#,
            "not json",
        ] {
            assert!(decode_payload(payload).is_err(), "{payload} should be refused");
        }
        assert!(decode_payload(r#"{"request_id":"r","tenant_id":"t"}"#).is_ok());
    }

    #[test]
    fn the_chain_hash_covers_payload_and_previous_hash() {
        let payload = canonical_payload(&sample());
        let first = chain_hash(&payload, GENESIS_HASH);
        assert_eq!(first, sha256_hex(&[payload.as_bytes(), GENESIS_HASH.as_bytes()]));
        assert_ne!(first, chain_hash(&payload, &first));
        assert_ne!(first, payload_commitment(&payload));
        assert_eq!(commitment_and_chain_hash(&payload, GENESIS_HASH), (payload_commitment(&payload), first));
    }

    #[test]
    fn digests_are_written_as_lowercase_hex() {
        let digest: Vec<u8> = (0..=255u8).collect();
        assert_eq!(digest_hex(&digest), hex::encode(&digest));
        // The well-known SHA-256 of the empty input.
        assert_eq!(sha256_hex(&[]), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }
}
