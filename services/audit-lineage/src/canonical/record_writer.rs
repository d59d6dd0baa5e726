//! A record's canonical payload written straight into its buffer, member by member, in the order the
//! canonical encoding sorts them: the same text as encoding the record's canonical object (a test holds
//! the two together), without building that object first. The payload is made on every request, and
//! the object cost a list of members per nested object, the check of its order and its drop.

use brainstorm_proto::audit::{
    AgentContext, AuditRecord, CandidateDecision, DecisionPath, DecisionStep, GrantContext, PolicyContext, Principal, TraceContext,
};

use super::{CHAIN_SCHEMA_VERSION, capture_digest, write_string};

/// `record`'s canonical payload.
pub(super) fn record_payload(record: &AuditRecord) -> String {
    let mut out = Vec::with_capacity(2048);
    let digest = record.capture.as_ref().map(capture_digest);
    let mut members = Members::open(&mut out);
    // Keys in the order of their bytes, as the encoding sorts them; empty members are left out.
    if let Some(agent) = &record.agent {
        members.object("agent", |members| agent_members(members, agent));
    }
    members.optional_text("agent_id", record.agent_id.as_deref());
    members.optional_text("capture_digest", digest.as_deref());
    members.integer("chain_schema_version", CHAIN_SCHEMA_VERSION);
    members.optional_text("conversation_id", record.conversation_id.as_deref());
    members.integer("cost_nanos", record.cost_nanos);
    members.text("coverage", &record.coverage);
    if let Some(decision) = &record.decision {
        members.object("decision", |members| decision_members(members, decision));
    }
    members.text("endpoint", &record.endpoint);
    if let Some(grant) = &record.grant {
        members.object("grant", |members| grant_members(members, grant));
    }
    members.integer("input_tokens", record.input_tokens);
    members.optional_text("key_id", record.key_id.as_deref());
    members.integer("latency_ms", record.latency_ms);
    members.text("model_executed", &record.model_executed);
    members.text("model_requested", &record.model_requested);
    members.text("model_resolved", &record.model_resolved);
    members.text("occurred_at", &record.occurred_at);
    members.text("outcome", &record.outcome);
    members.integer("output_tokens", record.output_tokens);
    if let Some(policy) = &record.policy {
        members.object("policy", |members| policy_members(members, policy));
    }
    if let Some(principal) = &record.principal {
        members.object("principal", |members| principal_members(members, principal));
    }
    members.text("provider", &record.provider);
    members.text("reason_code", &record.reason_code);
    members.text("request_id", &record.request_id);
    members.text("strategy", &record.strategy);
    members.text("tenant_id", &record.tenant_id);
    if let Some(trace) = &record.trace {
        members.object("trace", |members| trace_members(members, trace));
    }
    members.close();
    // Only valid UTF-8 is ever written (texts whole or escaped, the rest ASCII).
    String::from_utf8(out).unwrap_or_else(|error| String::from_utf8_lossy(error.as_bytes()).into_owned())
}

fn agent_members(members: &mut Members<'_>, agent: &AgentContext) {
    members.text("identity_source", &agent.identity_source);
    members.optional_text("lifecycle_state", agent.lifecycle_state.as_deref());
    members.integer("mesh_hop_count", agent.mesh_hop_count);
    members.optional_text("mesh_source", agent.mesh_source.as_deref());
    members.optional_text("owner_id", agent.owner_id.as_deref());
    members.text("owner_source", &agent.owner_source);
    members.bool("registered", agent.registered);
}

fn decision_members(members: &mut Members<'_>, decision: &DecisionPath) {
    members.objects("candidates", &decision.candidates, candidate_members);
    members.integer("complexity_level", decision.complexity_level);
    members.integer("complexity_score", decision.complexity_score);
    members.text("reason", &decision.reason);
    members.integer("score_micros", decision.score_micros);
    members.text("selected_model", &decision.selected_model);
    members.text("selection_method", &decision.selection_method);
    members.objects("steps", &decision.steps, step_members);
}

fn candidate_members(members: &mut Members<'_>, candidate: &CandidateDecision) {
    members.integer("estimated_cost_nanos", candidate.estimated_cost_nanos.unwrap_or(0));
    members.text("model", &candidate.model);
    members.text("provider", &candidate.provider);
    members.text("reason", &candidate.reason);
    members.integer("score_micros", candidate.score_micros);
    members.text("status", &candidate.status);
}

fn step_members(members: &mut Members<'_>, step: &DecisionStep) {
    members.text("detail", &step.detail);
    members.integer("elapsed_micros", step.elapsed_micros);
    members.text("result", &step.result);
    members.text("stage", &step.stage);
}

fn grant_members(members: &mut Members<'_>, grant: &GrantContext) {
    members.optional_text("approval_id", grant.approval_id.as_deref());
    members.optional_text("grant_id", grant.grant_id.as_deref());
    members.optional_text("plan_id", grant.plan_id.as_deref());
}

fn policy_members(members: &mut Members<'_>, policy: &PolicyContext) {
    members.optional_text("deny_rule", policy.deny_rule.as_deref());
    members.texts("matched_rules", &policy.matched_rules);
    members.optional_text("verdict_id", policy.verdict_id.as_deref());
}

fn principal_members(members: &mut Members<'_>, principal: &Principal) {
    members.text("auth_method", &principal.auth_method);
    members.text("id", &principal.id);
    members.optional_text("owner_id", principal.owner_id.as_deref());
    members.optional_text("spiffe_id", principal.spiffe_id.as_deref());
}

fn trace_members(members: &mut Members<'_>, trace: &TraceContext) {
    members.bool("inbound_trusted", trace.inbound_trusted);
    members.text("origin", &trace.origin);
    members.optional_text("parent_span_id", trace.parent_span_id.as_deref());
    members.text("span_id", &trace.span_id);
    members.text("trace_id", &trace.trace_id);
}

/// The members of one object being written; keys are plain ASCII names, which escape nothing.
struct Members<'o> {
    out: &'o mut Vec<u8>,
    written: bool,
}

impl<'o> Members<'o> {
    fn open(out: &'o mut Vec<u8>) -> Self {
        out.push(b'{');
        Members { out, written: false }
    }

    fn close(self) {
        self.out.push(b'}');
    }

    fn key(&mut self, key: &str) {
        if self.written {
            self.out.push(b',');
        }
        self.out.push(b'"');
        self.out.extend_from_slice(key.as_bytes());
        self.out.extend_from_slice(b"\":");
        self.written = true;
    }

    fn text(&mut self, key: &str, text: &str) {
        if !text.is_empty() {
            self.key(key);
            write_string(text, self.out);
        }
    }

    fn optional_text(&mut self, key: &str, text: Option<&str>) {
        if let Some(text) = text {
            self.text(key, text);
        }
    }

    fn integer(&mut self, key: &str, value: i64) {
        if value != 0 {
            self.key(key);
            self.out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
        }
    }

    fn bool(&mut self, key: &str, value: bool) {
        if value {
            self.key(key);
            self.out.extend_from_slice(b"true");
        }
    }

    /// Member `key` holding the object `write` writes, left out when that object has no member.
    fn object(&mut self, key: &str, write: impl FnOnce(&mut Members<'_>)) {
        let (mark, written) = (self.out.len(), self.written);
        self.key(key);
        let mut inner = Members::open(self.out);
        write(&mut inner);
        if inner.written {
            inner.close();
        } else {
            self.out.truncate(mark);
            self.written = written;
        }
    }

    /// Member `key` holding one object per item (an item without members as `{}`), left out when there
    /// are none.
    fn objects<T>(&mut self, key: &str, items: &[T], write: impl Fn(&mut Members<'_>, &T)) {
        self.list(key, items, |out, item| {
            let mut inner = Members::open(out);
            write(&mut inner, item);
            inner.close();
        });
    }

    /// Member `key` holding a list of texts (an empty text kept as `""`), left out when there are none.
    fn texts(&mut self, key: &str, texts: &[String]) {
        self.list(key, texts, |out, text| write_string(text, out));
    }

    /// Member `key` holding a list, each item written by `write` (lists keep every item), left out when
    /// there are none.
    fn list<T>(&mut self, key: &str, items: &[T], write: impl Fn(&mut Vec<u8>, &T)) {
        if items.is_empty() {
            return;
        }
        self.key(key);
        self.out.push(b'[');
        for (index, item) in items.iter().enumerate() {
            if index > 0 {
                self.out.push(b',');
            }
            write(self.out, item);
        }
        self.out.push(b']');
    }
}
