//! A completion committing a liaison plan (`X-BR-Plan-Id` with `X-BR-Liaison`): the plan fetched and
//! its signature verified by the policy firewall, the model resolved without fallback to the one label
//! the grant is checked against, the prompt's digest, tools and worst-case cost judged, the plan
//! claimed, and settled once the completion is answered (committed) or failed (released).

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use brainstorm_common::ApiError;
use brainstorm_common::money::Usd;
use brainstorm_policy_firewall::liaison;
use brainstorm_proto::ServiceError;
use brainstorm_proto::policy::{CommitPlanRequest, LiaisonPlan, PlanRef, PolicyFirewallClient, SettlePlanRequest};
use brainstorm_providers::chat::ChatRequest;
use brainstorm_providers::routing::{Resolution, TenantRouting};
use sha2::{Digest, Sha256};

use crate::EdgeState;
use crate::auth::Caller;

/// The model a body committing a plan stands for when it names none: the plan's signed model.
pub const OMITTED_MODEL: &str = "@plan";

/// The two headers that commit a plan.
pub struct PlanHeaders {
    pub plan_id: String,
    pub liaison_id: String,
}

/// The plan headers of a request: both, neither, or 400 `plan_headers_incomplete`.
pub fn plan_headers(headers: &HeaderMap) -> Result<Option<PlanHeaders>, ApiError> {
    let header = |name: &HeaderName| {
        headers.get(name).map(|value| value.to_str().map(str::trim).unwrap_or_default()).filter(|value| !value.is_empty())
    };
    match (header(&const { HeaderName::from_static("x-br-plan-id") }), header(&const { HeaderName::from_static("x-br-liaison") })) {
        (None, None) => Ok(None),
        (Some(plan_id), Some(liaison_id)) => Ok(Some(PlanHeaders { plan_id: plan_id.to_string(), liaison_id: liaison_id.to_string() })),
        _ => {
            Err(ApiError::invalid_request("plan_headers_incomplete", "committing a liaison plan takes both X-BR-Plan-Id and X-BR-Liaison"))
        }
    }
}

/// Whether a request carries either plan header (its body may then omit `model`).
pub fn names_a_plan(headers: &HeaderMap) -> bool {
    headers.contains_key(&const { HeaderName::from_static("x-br-plan-id") })
}

/// The id of a plan's grant (`X-BR-Grant-Id`, the plan's `grant_id`, the evidence's
/// `grant_context.grant_id`): `grant_` and 24 hex digits of the SHA-256 of what it allows, the
/// signed `allowed_models` and `allowed_tools` in the order signed. Plans minted with the same
/// scope share it, so evidence can be grouped by what was granted.
pub fn grant_id(plan: &LiaisonPlan) -> String {
    let mut digest = Sha256::new();
    for (part, entries) in [("models", &plan.allowed_models), ("tools", &plan.allowed_tools)] {
        digest.update(part.as_bytes());
        for entry in entries {
            // Length-prefixed: no two lists of entries hash alike.
            digest.update((entry.len() as u64).to_be_bytes());
            digest.update(entry.as_bytes());
        }
        digest.update([0xff]);
    }
    let mut id = hex::encode(digest.finalize());
    id.truncate(24);
    format!("grant_{id}")
}

/// A service refusal of a plan, its recovery made `renegotiate`.
fn refused(error: ServiceError, liaison_id: &str) -> ApiError {
    let renegotiable = error.reason.starts_with("plan_") || error.reason.starts_with("liaison_");
    let api_error = ApiError::from(error);
    if renegotiable { api_error.renegotiate(liaison_id, None) } else { api_error }
}

/// The plan the headers name, its signature verified, committable now.
pub async fn fetch(state: &EdgeState, tenant_id: &str, headers: &PlanHeaders) -> Result<LiaisonPlan, ApiError> {
    let reference = PlanRef { tenant_id: tenant_id.to_string(), liaison_id: headers.liaison_id.clone(), plan_id: headers.plan_id.clone() };
    state.policy.get_plan(reference).await.map_err(|error| refused(error, &headers.liaison_id))
}

/// The one model label a completion under a plan executes: the sandbox's, or the single candidate's
/// `provider/model` with the variant suffix the request (or its alias) named. More than one candidate
/// is 400 `plan_model_ambiguous` (fallback is off under a plan).
pub fn executed_label(resolution: &Resolution, requested: &str, routing: &TenantRouting) -> Result<String, ApiError> {
    let route = match resolution {
        // A tenant without keys is answered by the sandbox whatever it names; the label is what it
        // named, so a sandbox plan commits only the sandbox (or an omitted model, the plan's own).
        Resolution::Sandbox => return Ok(requested.to_string()),
        Resolution::Route(route) => route,
    };
    let [candidate] = route.candidates.as_slice() else {
        let ids: Vec<&str> = route.candidates.iter().map(|candidate| candidate.id()).collect();
        return Err(ApiError::invalid_request(
            "plan_model_ambiguous",
            format!("`{requested}` resolves to {} models under this plan ({}): name one `provider/model`", ids.len(), ids.join(", ")),
        ));
    };
    let named = routing.aliases.get(requested).map_or(requested, String::as_str);
    let variant = liaison::variant_of(named);
    Ok(if variant.is_empty() { candidate.id().to_string() } else { format!("{}:{variant}", candidate.id()) })
}

/// 400 `plan_model_unresolved`: the completion's model resolves to nothing runnable.
pub fn unresolved(requested: &str, why: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_request("plan_model_unresolved", format!("`{requested}` does not resolve to a runnable model under this plan: {why}"))
}

/// What the completion brings to its plan, judged and claimed by the policy firewall.
pub struct Commit<'a> {
    pub headers: &'a PlanHeaders,
    pub plan: &'a LiaisonPlan,
    pub label: String,
    pub chat: &'a ChatRequest,
    pub worst_case: Usd,
    pub tenant_has_provider_keys: bool,
}

/// Judges and claims the plan; a scope denial is 403 `plan_scope_exceeded` with its reason.
pub async fn commit(state: &EdgeState, caller: &Caller, request_id: &str, commit: Commit<'_>) -> Result<PlanSettler, ApiError> {
    let tool_names = liaison::tool_names(commit.chat);
    if tool_names.iter().any(|name| name.trim().is_empty()) {
        return Err(ApiError::invalid_request(
            "plan_tool_unextractable",
            "a tool of the request has no name the grant could be checked against",
        ));
    }
    let tenant_id = caller.tenant_id()?;
    let request = CommitPlanRequest {
        tenant_id: tenant_id.to_string(),
        liaison_id: commit.headers.liaison_id.clone(),
        plan_id: commit.headers.plan_id.clone(),
        request_id: request_id.to_string(),
        model_label: commit.label.clone(),
        prompt_digest: liaison::prompt_digest(commit.chat),
        tool_names,
        worst_case_nanos: commit.worst_case.nanos(),
        tenant_has_provider_keys: commit.tenant_has_provider_keys,
    };
    let verdict = state.policy.commit_plan(request).await.map_err(|error| refused(error, &commit.headers.liaison_id))?;
    if !verdict.committed {
        return Err(ApiError::plan_scope_exceeded(&verdict.denial_reason, verdict.message, &commit.headers.liaison_id));
    }
    Ok(PlanSettler {
        policy: state.policy.clone(),
        request: SettlePlanRequest {
            tenant_id: tenant_id.to_string(),
            liaison_id: commit.headers.liaison_id.clone(),
            plan_id: commit.plan.plan_id.clone(),
            request_id: request_id.to_string(),
            model: commit.label,
            ..SettlePlanRequest::default()
        },
    })
}

/// A claimed plan, waiting for its completion's outcome.
pub struct PlanSettler {
    policy: PolicyFirewallClient,
    request: SettlePlanRequest,
}

/// How a completion under a plan ended.
#[derive(Default)]
pub struct PlanOutcome<'a> {
    /// The provider answered (something was spent): the plan is committed; else it is released.
    pub answered: bool,
    pub provider: &'a str,
    pub strategy: &'a str,
    pub selection_method: &'a str,
    pub cost: Option<Usd>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub latency_ms: i64,
    pub audit_commitment: &'a str,
    /// The request's `traceparent` as answered (`00-<trace>-<span>-01`).
    pub traceparent: &'a str,
    pub error_code: &'a str,
}

impl PlanSettler {
    /// Settles the plan with the completion's outcome (a failure to record it is logged: the answer
    /// stands, and the claim lapses with the plan).
    pub async fn settle(self, outcome: PlanOutcome<'_>) {
        let mut request = self.request;
        let mut trace = outcome.traceparent.split('-').skip(1);
        request.trace_id = trace.next().unwrap_or_default().to_string();
        request.span_id = trace.next().unwrap_or_default().to_string();
        request.answered = outcome.answered;
        request.provider = outcome.provider.to_string();
        request.strategy = outcome.strategy.to_string();
        request.selection_method = outcome.selection_method.to_string();
        request.cost_nanos = outcome.cost.map_or(0, Usd::nanos);
        request.input_tokens = i64::try_from(outcome.input_tokens).unwrap_or(i64::MAX);
        request.output_tokens = i64::try_from(outcome.output_tokens).unwrap_or(i64::MAX);
        request.latency_ms = outcome.latency_ms;
        request.audit_commitment = outcome.audit_commitment.to_string();
        request.error_code = outcome.error_code.to_string();
        let plan_id = request.plan_id.clone();
        if let Err(error) = self.policy.settle_plan(request).await {
            tracing::error!(%error, plan_id, "settling a liaison plan failed");
        }
    }
}

/// The value of `name` among `headers`, as text.
pub fn header_text<'a>(headers: &'a [(HeaderName, HeaderValue)], name: &str) -> &'a str {
    headers.iter().find(|(header, _)| header.as_str() == name).and_then(|(_, value)| value.to_str().ok()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(models: &[&str], tools: &[&str]) -> LiaisonPlan {
        LiaisonPlan {
            plan_id: "plan_1".to_string(),
            allowed_models: models.iter().map(|model| model.to_string()).collect(),
            allowed_tools: tools.iter().map(|tool| tool.to_string()).collect(),
            ..LiaisonPlan::default()
        }
    }

    #[test]
    fn a_grant_id_names_what_the_plan_allows() {
        let id = grant_id(&plan(&["openai/gpt-4o-mini"], &["search_*"]));
        assert!(id.starts_with("grant_") && id.len() == 30, "{id}");
        // Another plan with the same scope: the same grant.
        assert_eq!(id, grant_id(&LiaisonPlan { plan_id: "plan_2".to_string(), ..plan(&["openai/gpt-4o-mini"], &["search_*"]) }));
        // A model moved to the tools, two entries joined, a tool added: each another grant.
        assert_ne!(id, grant_id(&plan(&[], &["openai/gpt-4o-mini", "search_*"])));
        assert_ne!(grant_id(&plan(&["a", "b"], &[])), grant_id(&plan(&["ab"], &[])));
        assert_ne!(id, grant_id(&plan(&["openai/gpt-4o-mini"], &["search_*", "fetch"])));
    }
}
