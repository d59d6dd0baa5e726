//! `POST /v1/embeddings`: the completion pipeline's admission, kill switch, budget and evidence
//! around one embeddings call (OpenAI's request and answer, served by OpenAI-format providers and
//! Gemini).

use std::time::Instant;

use axum::http::{HeaderMap, HeaderName};
use axum::response::Response;
use brainstorm_budget_ledger::Estimate;
use brainstorm_common::ApiError;
use brainstorm_common::money::Usd;
use brainstorm_policy_firewall::RequestFacts;
use brainstorm_providers::catalog::base_url;
use brainstorm_providers::chat::Usage;
use brainstorm_providers::embeddings::{self, EmbeddingRequest};
use brainstorm_providers::routing;
use brainstorm_providers::upstream::Target;
use serde_json::Value;

use super::{
    Attribution, AuditFacts, admitted, agent_of, budget_context, budget_headers, guard_input, guardian_switched_off, header_value, invalid,
    json_response, model_not_allowed, price_of, put, route_error, seal, succeeded, tokens,
};
use crate::EdgeState;
use crate::auth::{Caller, Refused};
use crate::extract::RequestId;
use crate::header_value::Millis;

const ENDPOINT: &str = "/v1/embeddings";

/// Serves one embeddings request from its first byte; every outcome is recorded as evidence, as a
/// completion's is.
pub async fn serve(
    state: &EdgeState,
    attempt: Result<Caller, Refused>,
    request_id: &RequestId,
    request_headers: &HeaderMap,
    body: Result<Value, ApiError>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let member = |name: &str| body.as_ref().ok().and_then(|body| body.get(name)).and_then(Value::as_str);
    let mut facts = AuditFacts { model_requested: member("model").unwrap_or_default().to_string(), ..AuditFacts::default() };
    let agent_id = agent_of(request_headers, member("user"));
    let (identity, result) = admitted(attempt, body, async |caller, body: Value| {
        embed(state, caller, request_id, request_headers, &body, agent_id.as_deref(), &mut facts).await
    })
    .await;
    facts.agent_id = agent_id;
    seal(state, Attribution::of(identity.as_deref()), request_id, request_headers, ENDPOINT, started, facts, result)
}

async fn embed(
    state: &EdgeState,
    caller: &Caller,
    request_id: &RequestId,
    request_headers: &HeaderMap,
    body: &Value,
    agent_id: Option<&str>,
    facts: &mut AuditFacts,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let request: EmbeddingRequest = embeddings::parse_request(body).map_err(invalid)?;
    let tenant_id = caller.tenant_id()?;
    let switch = RequestFacts { path: ENDPOINT, method: "POST", agent_id, tool_names: &[], model: Some(&request.model) };
    if let Some(error) = state.guardian.kill_switch(tenant_id, &switch).await.api_error() {
        return Err(error);
    }
    if let Some(agent_id) = agent_id {
        state.authenticator.admit_agent(tenant_id, agent_id).await?;
    }
    // Input guardrails on the texts, as on a prompt: they leave for a provider too.
    let guardian_off = guardian_switched_off(caller, request_headers);
    facts.guardian_status = if guardian_off { "off" } else { "on" };
    if !guardian_off && state.guardian.config(tenant_id).await?.guardrails.config().enabled {
        guard_input(state, tenant_id, &request.inputs.join("\n"), facts).await?;
    }
    let config = state.routing.get(tenant_id).await?;
    let estimated_tokens = request.estimated_tokens();
    let candidates = routing::resolve_embeddings(&request.model, &config.routing, &state.models, estimated_tokens).map_err(route_error)?;
    let candidate =
        candidates.into_iter().find(|candidate| caller.may_use_model(candidate.id())).ok_or_else(|| model_not_allowed(&request.model))?;
    let api_key = config
        .credential(candidate.provider.id)
        .ok_or_else(|| ApiError::model_unavailable(format!("no usable {} key for `{}`", candidate.provider.id, candidate.id())))?;
    facts.model_resolved = candidate.id().to_string();
    facts.model_executed = candidate.id().to_string();
    facts.provider = candidate.provider.id.to_string();
    facts.strategy = "explicit".to_string();
    facts.selection_method = "explicit".to_string();
    facts.reason = "embeddings: the model named".to_string();
    facts.candidates = vec![candidate.id().to_string()];

    let context = budget_context(state, caller, agent_id, request_headers, None).await?;
    let estimate = Estimate {
        request_id: request_id.0.clone(),
        cost: candidate.estimated_cost.unwrap_or(Usd::ZERO),
        tokens: tokens(Usage::uncached(estimated_tokens, 0)),
    };
    let reservation = state.guard.reserve(&context, &estimate).await.map_err(|denial| denial.to_api_error())?;
    let target = Target {
        provider: candidate.provider,
        base_url: base_url(candidate.provider, &state.base_urls),
        api_key,
        model: &candidate.model,
        default_max_tokens: 0,
    };
    let provider_started = Instant::now();
    let reply = match state.upstream.embed(&target, &request).await {
        Ok(reply) => reply,
        Err(error) => {
            tracing::warn!(provider = candidate.provider.id, model = %candidate.model, %error, "embeddings call failed");
            if let Err(error) = reservation.release().await {
                tracing::warn!(%error, "releasing a reservation failed");
            }
            return Err(ApiError::provider_error(error.status(), candidate.provider.id, format!("{}: {error}", candidate.id())));
        }
    };
    let provider_latency = provider_started.elapsed();
    // Gemini counts no tokens in its answer: the estimate stands for them.
    let input_tokens = reply.input_tokens.unwrap_or(estimated_tokens);
    let usage = Usage::uncached(input_tokens, 0);
    let cost = price_of(&candidate).map_or(Usd::ZERO, |price| price.cost(usage));
    facts.input_tokens = input_tokens;
    facts.cost = Some(cost);
    let mut headers = HeaderMap::with_capacity(16);
    match reservation.settle(succeeded(&candidate, cost, usage, provider_latency)).await {
        Ok(remaining) => budget_headers(&mut headers, &remaining),
        Err(error) => tracing::error!(%error, "settling an embeddings call failed; the reservation stays counted"),
    }
    set!(&mut headers, "x-br-routed-model", candidate.id());
    set!(&mut headers, "x-br-upstream-model", &candidate.model);
    set_value!(&mut headers, "x-model-router-endpoint", header_value::fixed(candidate.provider.id));
    if let Some(estimate) = candidate.estimated_cost {
        set_value!(&mut headers, "x-br-estimated-cost", header_value::shown(estimate.fixed(6)));
    }
    if price_of(&candidate).is_some() {
        set_value!(&mut headers, "x-br-actual-cost", header_value::shown(cost.fixed(6)));
    }
    set_value!(&mut headers, "x-br-provider-latency-ms", header_value::shown(Millis(provider_latency)));
    set_value!(&mut headers, "x-br-total-latency-ms", header_value::shown(Millis(started.elapsed())));
    Ok(json_response(headers, &embeddings::render_reply(reply, candidate.id(), input_tokens, request.base64)))
}
