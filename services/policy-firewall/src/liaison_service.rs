//! The liaison half of the policy-firewall service: sessions opened and closed, plans signed and
//! stored, commits judged and claimed, settlements and the events a session's stream reads.

use brainstorm_common::store::Database;
use brainstorm_common::time::format_timestamp;
use brainstorm_proto::policy::{
    CommitPlanRequest, LiaisonEventList, LiaisonPlan, LiaisonRef, LiaisonSession, LiaisonSummary, ListLiaisonEventsRequest,
    MintPlanRequest, OpenLiaisonRequest, PlanCommit, PlanRef, SettlePlanRequest, SettlePlanResponse,
};
use brainstorm_proto::{ErrorKind, ServiceError, ServiceResult};
use serde_json::json;

use crate::liaison::{
    self, Commitment, DEFAULT_SESSION_TTL_SECONDS, ENVELOPE_VERSION, LiaisonKey, MAX_PLAN_TOKENS, MAX_PLAN_TTL_SECONDS,
    MAX_SESSION_TTL_SECONDS, Refusal,
};
use crate::liaison_store::{CLAIMED, COMMITTED, LiaisonStore, MINTED, PlanRow, SessionRow, Settlement};
use crate::service::Clock;

/// Events one `list_liaison_events` call returns when the request gives no limit, and at most.
const DEFAULT_EVENTS: u32 = 100;
const MAX_EVENTS: u32 = 500;
/// A session's label and agent id are at most this long; its metadata at most this many bytes.
const MAX_LABEL_CHARS: usize = 128;
const MAX_METADATA_BYTES: usize = 8 * 1024;

/// Sessions, plans and their events.
#[derive(Clone)]
pub(crate) struct LiaisonService {
    store: LiaisonStore,
    /// None without a master key: then every call answers 503 `liaison_unavailable`.
    key: Option<LiaisonKey>,
    clock: Clock,
}

fn store_failure(error: sqlx::Error) -> ServiceError {
    brainstorm_common::store::store_failure("policy-firewall", error)
}

/// Nano-dollars as an exact JSON number of dollars.
fn nanos_usd(nanos: i64) -> serde_json::Value {
    brainstorm_common::money::Usd::from_nanos(nanos).to_json()
}

impl LiaisonService {
    pub(crate) fn new(database: Database, key: Option<LiaisonKey>, clock: Clock) -> Self {
        LiaisonService { store: LiaisonStore::new(database), key, clock }
    }

    fn key(&self) -> ServiceResult<&LiaisonKey> {
        self.key.as_ref().ok_or_else(|| {
            ServiceError::unavailable("liaison_unavailable", "liaison contracts need the gateway's master key (BR_MASTER_KEY) to sign them")
        })
    }

    fn now_text(&self) -> String {
        format_timestamp((self.clock)())
    }

    fn now_epoch(&self) -> i64 {
        (self.clock)().timestamp()
    }

    /// The stored session a signed id names for this tenant.
    async fn session(&self, tenant_id: &str, signed: &str) -> ServiceResult<SessionRow> {
        let not_found = || ServiceError::not_found("liaison_not_found", "no liaison session has this id");
        let session_id = self.key()?.open_session(tenant_id, signed.trim()).ok_or_else(not_found)?;
        self.store.session(tenant_id, &session_id).await.map_err(store_failure)?.ok_or_else(not_found)
    }

    /// `open`, `closed`, or `expired` (open, past its lifetime).
    fn status(&self, session: &SessionRow) -> &'static str {
        match session.status.as_str() {
            "closed" => "closed",
            _ if session.expires_at.as_str() <= self.now_text().as_str() => "expired",
            _ => "open",
        }
    }

    /// A session as the contract shows it, its summary read from its plans.
    async fn view(&self, signed: &str, session: &SessionRow) -> ServiceResult<LiaisonSession> {
        let plans = self.store.plans(&session.tenant_id, &session.session_id).await.map_err(store_failure)?;
        Ok(LiaisonSession {
            liaison_id: signed.trim().to_string(),
            tenant_id: session.tenant_id.clone(),
            status: self.status(session).to_string(),
            key_id: session.key_id.clone(),
            agent_id: session.agent_id.clone(),
            label: session.label.clone(),
            opened_at: session.opened_at.clone(),
            expires_at: session.expires_at.clone(),
            closed_at: session.closed_at.clone().unwrap_or_default(),
            summary: Some(summary(&plans, self.now_epoch())),
            last_event_seq: session.event_seq,
            metadata_json: session.metadata_json.clone(),
        })
    }

    pub(crate) async fn open(&self, request: OpenLiaisonRequest) -> ServiceResult<LiaisonSession> {
        let key = self.key()?;
        let tenant_id = request.tenant_id.trim();
        if tenant_id.is_empty() {
            return Err(ServiceError::invalid("missing_field", "`tenant_id` is required"));
        }
        let ttl = if request.ttl_seconds == 0 { DEFAULT_SESSION_TTL_SECONDS } else { request.ttl_seconds };
        if !(1..=MAX_SESSION_TTL_SECONDS).contains(&ttl) {
            return Err(ServiceError::invalid("invalid_ttl", format!("ttl_seconds is from 1 to {MAX_SESSION_TTL_SECONDS}")));
        }
        if request.label.chars().count() > MAX_LABEL_CHARS || request.agent_id.chars().count() > MAX_LABEL_CHARS {
            return Err(ServiceError::invalid("field_too_long", format!("label and agent_id are at most {MAX_LABEL_CHARS} characters")));
        }
        let metadata_json = if request.metadata_json.is_empty() { "{}".to_string() } else { request.metadata_json };
        if metadata_json.len() > MAX_METADATA_BYTES {
            return Err(ServiceError::invalid("field_too_long", format!("metadata is at most {MAX_METADATA_BYTES} bytes of JSON")));
        }
        let now = (self.clock)();
        let session_id = brainstorm_common::text::simple_uuid(uuid::Uuid::new_v4());
        let signed = key.sign_session(tenant_id, &session_id);
        let session = SessionRow {
            tenant_id: tenant_id.to_string(),
            session_id,
            key_id: request.key_id,
            agent_id: request.agent_id,
            label: request.label,
            metadata_json,
            status: "open".to_string(),
            opened_at: format_timestamp(now),
            expires_at: format_timestamp(now + chrono::Duration::seconds(ttl)),
            closed_at: None,
            event_seq: 1,
        };
        let opened = json!({
            "liaison_id": signed,
            "label": session.label,
            "agent_id": session.agent_id,
            "opened_at": session.opened_at,
            "expires_at": session.expires_at,
        });
        self.store.insert_session(&session, opened.to_string()).await.map_err(store_failure)?;
        self.view(&signed, &session).await
    }

    pub(crate) async fn get(&self, request: LiaisonRef) -> ServiceResult<LiaisonSession> {
        let session = self.session(&request.tenant_id, &request.liaison_id).await?;
        self.view(&request.liaison_id, &session).await
    }

    /// The session must be open (not closed, not expired) for plans to be minted in it.
    fn require_open(&self, session: &SessionRow) -> ServiceResult<()> {
        match self.status(session) {
            "closed" => Err(ServiceError::conflict("liaison_closed", "the liaison session is closed: open a new one")),
            "expired" => Err(ServiceError::conflict("liaison_expired", "the liaison session's lifetime has passed: open a new one")),
            _ => Ok(()),
        }
    }

    pub(crate) async fn mint(&self, request: MintPlanRequest) -> ServiceResult<LiaisonPlan> {
        let key = self.key()?;
        let session = self.session(&request.tenant_id, &request.liaison_id).await?;
        self.require_open(&session)?;
        if !(1..=MAX_PLAN_TTL_SECONDS).contains(&request.ttl_seconds) {
            return Err(ServiceError::invalid("invalid_ttl", format!("ttl_seconds is from 1 to {MAX_PLAN_TTL_SECONDS}")));
        }
        if !(1..=MAX_PLAN_TOKENS).contains(&request.max_tokens) {
            return Err(ServiceError::invalid("invalid_max_tokens", format!("max_tokens is from 1 to {MAX_PLAN_TOKENS}")));
        }
        if request.model.is_empty() || request.prompt_digest.len() != 64 || request.allowed_models.is_empty() {
            return Err(ServiceError::invalid("invalid_plan", "a plan needs a model, a prompt digest and a model grant"));
        }
        if request.estimated_nanos < 0 || request.ceiling_nanos < request.estimated_nanos {
            return Err(ServiceError::invalid("invalid_plan", "a plan's ceiling is at least its estimate, which is not negative"));
        }
        let issued_at = self.now_epoch();
        let mut plan = LiaisonPlan {
            v: ENVELOPE_VERSION,
            plan_id: brainstorm_common::text::simple_uuid(uuid::Uuid::new_v4()),
            liaison_id: request.liaison_id.trim().to_string(),
            tenant_id: session.tenant_id.clone(),
            prompt_fingerprint: liaison::fingerprint(liaison::variant_of(&request.model), &request.prompt_digest),
            model: request.model,
            ceiling_nanos: request.ceiling_nanos,
            estimated_nanos: request.estimated_nanos,
            allowed_models: request.allowed_models,
            allowed_tools: request.allowed_tools,
            issued_at,
            ttl_seconds: request.ttl_seconds,
            max_tokens: request.max_tokens,
            signature: String::new(),
            state: MINTED.to_string(),
        };
        plan.signature = key.sign_plan(&plan);
        let minted = json!({
            "plan_id": plan.plan_id,
            "model": plan.model,
            "ceiling_usd": nanos_usd(plan.ceiling_nanos),
            "estimated_cost_usd": nanos_usd(plan.estimated_nanos),
            "allowed_models": plan.allowed_models,
            "allowed_tools": plan.allowed_tools,
            "issued_at": plan.issued_at,
            "ttl_seconds": plan.ttl_seconds,
        });
        let row = PlanRow { plan, session_id: session.session_id, expires_epoch: issued_at + request.ttl_seconds, ..PlanRow::default() };
        if !self.store.insert_plan(&row, &self.now_text(), minted.to_string()).await.map_err(store_failure)? {
            return Err(ServiceError::conflict("liaison_closed", "the liaison session closed or expired while the plan was minted"));
        }
        Ok(row.plan)
    }

    /// A plan a commit may be judged against: its session and signature verified, neither expired
    /// nor committed nor held by another completion.
    async fn committable(&self, request: &PlanRef) -> ServiceResult<(SessionRow, PlanRow)> {
        let key = self.key()?;
        let session = self.session(&request.tenant_id, &request.liaison_id).await.map_err(|error| match error.kind {
            ErrorKind::NotFound => {
                ServiceError::permission_denied("liaison_invalid", "X-BR-Liaison is not a liaison session id issued to this tenant")
            }
            _ => error,
        })?;
        let row = self
            .store
            .plan(&session.tenant_id, request.plan_id.trim())
            .await
            .map_err(store_failure)?
            .ok_or_else(|| ServiceError::not_found("plan_not_found", "no plan has this id"))?;
        if !key.verify_plan(&row.plan) || row.plan.tenant_id != session.tenant_id {
            return Err(ServiceError::permission_denied("plan_signature_invalid", "the plan's signature does not verify"));
        }
        if row.plan.liaison_id != request.liaison_id.trim() {
            return Err(ServiceError::permission_denied("liaison_mismatch", "the plan was minted in another liaison session"));
        }
        if session.status == "closed" {
            return Err(ServiceError::conflict("liaison_closed", "the plan's liaison session is closed"));
        }
        match row.plan.state.as_str() {
            COMMITTED => return Err(ServiceError::conflict("plan_already_committed", "the plan was committed already: mint a new one")),
            CLAIMED => return Err(ServiceError::conflict("plan_in_flight", "another completion is committing this plan")),
            _ => {}
        }
        if row.expires_epoch <= self.now_epoch() {
            return Err(ServiceError::permission_denied("plan_expired", "the plan's time to live has passed: mint a new one"));
        }
        Ok((session, row))
    }

    pub(crate) async fn get_plan(&self, request: PlanRef) -> ServiceResult<LiaisonPlan> {
        Ok(self.committable(&request).await?.1.plan)
    }

    pub(crate) async fn commit(&self, request: CommitPlanRequest) -> ServiceResult<PlanCommit> {
        let reference =
            PlanRef { tenant_id: request.tenant_id.clone(), liaison_id: request.liaison_id.clone(), plan_id: request.plan_id.clone() };
        let (session, row) = self.committable(&reference).await?;
        let commitment = Commitment {
            model_label: &request.model_label,
            prompt_digest: &request.prompt_digest,
            tool_names: &request.tool_names,
            worst_case_nanos: request.worst_case_nanos,
            tenant_has_provider_keys: request.tenant_has_provider_keys,
        };
        if let Err((refusal, message)) = liaison::judge(&row.plan, &commitment) {
            let denied = json!({
                "plan_id": row.plan.plan_id,
                "request_id": request.request_id,
                "model": request.model_label,
                "reason": refusal.as_str(),
                "message": message,
            });
            self.store
                .record_denial(&session.tenant_id, &session.session_id, &row.plan.plan_id, &self.now_text(), denied.to_string())
                .await
                .map_err(store_failure)?;
            if refusal == Refusal::FingerprintMismatch {
                return Err(ServiceError::invalid("plan_fingerprint_mismatch", message));
            }
            return Ok(PlanCommit { committed: false, denial_reason: refusal.as_str().to_string(), message, plan: Some(row.plan) });
        }
        if !self.store.claim(&session.tenant_id, &row.plan.plan_id, &request.request_id, self.now_epoch()).await.map_err(store_failure)? {
            // Lost a race (another completion claimed it, or it lapsed meanwhile): say which.
            self.committable(&reference).await?;
            return Err(ServiceError::conflict("plan_in_flight", "another completion is committing this plan"));
        }
        let mut plan = row.plan;
        plan.state = CLAIMED.to_string();
        Ok(PlanCommit { committed: true, denial_reason: String::new(), message: String::new(), plan: Some(plan) })
    }

    pub(crate) async fn settle(&self, request: SettlePlanRequest) -> ServiceResult<SettlePlanResponse> {
        let session = self.session(&request.tenant_id, &request.liaison_id).await?;
        let now = self.now_text();
        let events = if request.answered {
            vec![
                (
                    "routing.decision",
                    json!({
                        "plan_id": request.plan_id,
                        "request_id": request.request_id,
                        "model": request.model,
                        "provider": request.provider,
                        "strategy": request.strategy,
                        "selection_method": request.selection_method,
                        "fallback": false,
                        "cost_usd": nanos_usd(request.cost_nanos),
                        "input_tokens": request.input_tokens,
                        "output_tokens": request.output_tokens,
                        "latency_ms": request.latency_ms,
                    })
                    .to_string(),
                ),
                (
                    "trace.envelope",
                    json!({
                        "plan_id": request.plan_id,
                        "request_id": request.request_id,
                        "trace_id": request.trace_id,
                        "span_id": request.span_id,
                        "traceparent": format!("00-{}-{}-01", request.trace_id, request.span_id),
                        "audit_commitment": request.audit_commitment,
                        "evidence_receipt": format!("sha256:{}", request.audit_commitment),
                        "explain": format!("/v1/governance/explain/{}", request.request_id),
                    })
                    .to_string(),
                ),
            ]
        } else {
            let released = json!({"plan_id": request.plan_id, "request_id": request.request_id, "error_code": request.error_code});
            vec![("plan.released", released.to_string())]
        };
        let settlement = Settlement {
            request_id: &request.request_id,
            answered: request.answered,
            committed_at: &now,
            cost_nanos: request.cost_nanos,
            input_tokens: request.input_tokens,
            output_tokens: request.output_tokens,
            audit_commitment: &request.audit_commitment,
        };
        let state = self
            .store
            .settle(&session.tenant_id, &session.session_id, request.plan_id.trim(), &settlement, events)
            .await
            .map_err(store_failure)?
            .ok_or_else(|| ServiceError::conflict("plan_not_claimed", "this request holds no claim on the plan"))?;
        Ok(SettlePlanResponse { state: state.to_string() })
    }

    pub(crate) async fn events(&self, request: ListLiaisonEventsRequest) -> ServiceResult<LiaisonEventList> {
        let session = self.session(&request.tenant_id, &request.liaison_id).await?;
        let limit = if request.limit == 0 { DEFAULT_EVENTS } else { request.limit.min(MAX_EVENTS) };
        let events = self.store.events(&session.tenant_id, &session.session_id, request.after_seq, limit).await.map_err(store_failure)?;
        Ok(LiaisonEventList { events, status: self.status(&session).to_string() })
    }

    pub(crate) async fn close(&self, request: LiaisonRef) -> ServiceResult<LiaisonSession> {
        let session = self.session(&request.tenant_id, &request.liaison_id).await?;
        if session.status == "closed" {
            return Err(ServiceError::conflict("liaison_closed", "the liaison session is closed already"));
        }
        let now = self.now_text();
        let plans = self.store.plans(&session.tenant_id, &session.session_id).await.map_err(store_failure)?;
        let summary = summary(&plans, self.now_epoch());
        let closed = json!({
            "liaison_id": request.liaison_id.trim(),
            "closed_at": now,
            "cost_summary": summary_json(&summary),
            "trace_digest": summary.trace_digest,
        });
        if !self.store.close(&session.tenant_id, &session.session_id, &now, closed.to_string()).await.map_err(store_failure)? {
            return Err(ServiceError::conflict("liaison_closed", "the liaison session is closed already"));
        }
        let closed = self.store.session(&session.tenant_id, &session.session_id).await.map_err(store_failure)?.unwrap_or(session);
        self.view(&request.liaison_id, &closed).await
    }
}

/// What a session's plans came to at `now_epoch`.
fn summary(plans: &[PlanRow], now_epoch: i64) -> LiaisonSummary {
    let mut summary = LiaisonSummary { plans_minted: plans.len() as i64, ..LiaisonSummary::default() };
    let mut commitments = Vec::new();
    for row in plans {
        summary.denials += row.denials;
        match row.plan.state.as_str() {
            COMMITTED => {
                summary.plans_committed += 1;
                summary.committed_cost_nanos += row.cost_nanos;
                summary.committed_ceiling_nanos += row.plan.ceiling_nanos;
                summary.committed_estimated_nanos += row.plan.estimated_nanos;
                summary.input_tokens += row.input_tokens;
                summary.output_tokens += row.output_tokens;
                summary.request_ids.push(row.committed_request_id.clone().unwrap_or_default());
                commitments.push(row.audit_commitment.clone().unwrap_or_default());
            }
            _ if row.expires_epoch <= now_epoch => summary.plans_expired += 1,
            _ => summary.plans_open += 1,
        }
    }
    summary.trace_digest = liaison::trace_digest(commitments.iter().map(String::as_str));
    summary
}

/// The summary as the close event carries it (amounts in USD).
pub fn summary_json(summary: &LiaisonSummary) -> serde_json::Value {
    json!({
        "plans_minted": summary.plans_minted,
        "plans_committed": summary.plans_committed,
        "plans_open": summary.plans_open,
        "plans_expired": summary.plans_expired,
        "denials": summary.denials,
        "committed_cost_usd": nanos_usd(summary.committed_cost_nanos),
        "committed_ceiling_usd": nanos_usd(summary.committed_ceiling_nanos),
        "committed_estimated_cost_usd": nanos_usd(summary.committed_estimated_nanos),
        "input_tokens": summary.input_tokens,
        "output_tokens": summary.output_tokens,
        "request_ids": summary.request_ids,
    })
}
