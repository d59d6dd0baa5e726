//! `POST /v1/chat/completions`, `POST /v1/messages`, `POST /v1/messages/count_tokens`,
//! `POST /v1/embeddings`, `GET /v1/models` and `GET /v1/catalog/runnable`.

use crate::extract::Query;
use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use brainstorm_budget_ledger::Meter;
use brainstorm_common::ApiError;
use brainstorm_common::money::Usd;
use brainstorm_providers::anthropic;
use brainstorm_providers::catalog::{Model, base_url};
use brainstorm_providers::routing::{self, Resolution, RouteOptions, SANDBOX_MODEL};
use brainstorm_providers::upstream::Target;
use serde_json::{Value, json};

use crate::EdgeState;
use crate::auth::{Caller, CallerAttempt};
use crate::circuits::CircuitState;
use crate::extract::{JsonBytes, RequestId, completion_json, json, query_flag};
use crate::pipeline::{self, ClientFormat, Submission};
use crate::sentinel::ProbeStatus;

/// When the bundled catalog was published (the `created` of its models).
const CATALOG_CREATED: i64 = 1_761_955_200;

/// `POST /v1/chat/completions` (router.write).
pub async fn chat_completions(
    State(state): State<EdgeState>,
    CallerAttempt(attempt): CallerAttempt,
    Extension(request_id): Extension<RequestId>,
    headers: HeaderMap,
    body: Result<JsonBytes, ApiError>,
) -> Result<Response, ApiError> {
    let body = body.and_then(|JsonBytes(bytes)| Submission::read(&bytes, &headers, ClientFormat::OpenAi));
    // Boxed: the pipeline's future is large, and each layer around the handler moves its
    // future; boxed, they move a pointer.
    Box::pin(pipeline::serve(&state, attempt, &request_id, &headers, body, ClientFormat::OpenAi)).await
}

/// `POST /v1/messages` (router.write).
pub async fn messages(
    State(state): State<EdgeState>,
    CallerAttempt(attempt): CallerAttempt,
    Extension(request_id): Extension<RequestId>,
    headers: HeaderMap,
    body: Result<JsonBytes, ApiError>,
) -> Result<Response, ApiError> {
    let body = body.and_then(|JsonBytes(bytes)| Submission::read(&bytes, &headers, ClientFormat::Anthropic));
    // Boxed, as above.
    Box::pin(pipeline::serve(&state, attempt, &request_id, &headers, body, ClientFormat::Anthropic)).await
}

/// `POST /v1/messages/count_tokens` (router.write: it calls the provider with the tenant's key): the
/// input tokens of a messages body (`max_tokens` not needed) on the model it resolves to, as
/// Anthropic answers it. Anthropic and Gemini models are counted by their provider (free at both;
/// nothing is generated, spent or recorded); OpenAI-format models, which have no such endpoint, and
/// the sandbox by the gateway's estimate. `X-BR-Token-Count` says which.
pub async fn count_tokens(State(state): State<EdgeState>, caller: Caller, body: Result<JsonBytes, ApiError>) -> Result<Response, ApiError> {
    caller.require("router.write")?;
    let JsonBytes(bytes) = body?;
    // Counted as `/v1/messages` would read it: a prompt may hold a NUL (nothing here is stored).
    let mut tree: Value = completion_json(&bytes)?;
    if let Some(members) = tree.as_object_mut() {
        members.entry("max_tokens").or_insert(json!(1));
    }
    let chat = anthropic::parse_request(&tree).map_err(pipeline::invalid)?;
    let config = state.routing.get(caller.tenant_id()?).await?;
    let estimate = |entry: Option<&Model>| routing::estimate_usage(&chat, entry).input_tokens;
    let (model, counted, source) = match routing::resolve(&chat.model, &config.routing, &state.models, &chat, &RouteOptions::default())
        .map_err(pipeline::route_error)?
    {
        Resolution::Sandbox => {
            if !caller.may_use_model(&chat.model) {
                return Err(pipeline::model_not_allowed(&chat.model));
            }
            (SANDBOX_MODEL.to_string(), estimate(None), "estimate")
        }
        Resolution::Route(route) => {
            let candidate = route
                .candidates
                .iter()
                .find(|candidate| caller.may_use_model(candidate.id()) && config.credential(candidate.provider.id).is_some())
                .ok_or_else(|| pipeline::model_not_allowed(&chat.model))?;
            let target = Target {
                provider: candidate.provider,
                base_url: base_url(candidate.provider, &state.base_urls),
                api_key: config.credential(candidate.provider.id).unwrap_or_default(),
                model: &candidate.model,
                default_max_tokens: anthropic::DEFAULT_MAX_TOKENS,
            };
            match state.upstream.count_tokens(&target, &chat).await {
                Ok(Some(counted)) => (candidate.id().to_string(), counted, "provider"),
                Ok(None) => (candidate.id().to_string(), estimate(candidate.entry.as_ref()), "estimate"),
                Err(error) => {
                    let message = format!("{}: {error}", candidate.id());
                    return Err(ApiError::provider_error(error.status(), candidate.provider.id, message));
                }
            }
        }
    };
    let mut response = Json(json!({"input_tokens": counted})).into_response();
    let headers = response.headers_mut();
    headers.insert(HeaderName::from_static("x-br-token-count"), HeaderValue::from_static(source));
    if let Ok(model) = HeaderValue::try_from(model) {
        headers.insert(HeaderName::from_static("x-br-routed-model"), model);
    }
    Ok(response)
}

/// `POST /v1/embeddings` (router.write).
pub async fn embeddings(
    State(state): State<EdgeState>,
    CallerAttempt(attempt): CallerAttempt,
    Extension(request_id): Extension<RequestId>,
    headers: HeaderMap,
    body: Result<JsonBytes, ApiError>,
) -> Result<Response, ApiError> {
    let body = body.and_then(|JsonBytes(bytes)| json::<Value>(&bytes));
    Box::pin(pipeline::embeddings::serve(&state, attempt, &request_id, &headers, body)).await
}

/// `CATALOG_CREATED` in RFC 3339, as Anthropic's model objects date themselves.
const CATALOG_CREATED_AT: &str = "2025-11-01T00:00:00Z";

/// A model as both SDKs read one: OpenAI's `{id, object, created, owned_by}` and Anthropic's
/// `{type, id, display_name, created_at}` (neither minds the other's members).
fn model_entry(id: &str, owned_by: &str) -> Value {
    json!({
        "id": id,
        "object": "model",
        "created": CATALOG_CREATED,
        "owned_by": owned_by,
        "type": "model",
        "display_name": id,
        "created_at": CATALOG_CREATED_AT,
    })
}

/// `GET /v1/models` query.
#[derive(Debug, Default, serde::Deserialize)]
pub struct ModelsQuery {
    #[serde(default, rename = "includeUnhealthy")]
    include_unhealthy: Option<String>,
}

/// `GET /v1/models` (router.read): the models this key can run: the catalog's models of the tenant's
/// providers, or the sandbox model while it has none; models whose circuit is open are left out
/// unless `?includeUnhealthy=true`.
pub async fn list_models(
    State(state): State<EdgeState>,
    caller: Caller,
    Query(query): Query<ModelsQuery>,
) -> Result<Json<Value>, ApiError> {
    caller.require("router.read")?;
    let include_unhealthy = query_flag("includeUnhealthy", query.include_unhealthy.as_deref())?;
    let config = state.routing.get(caller.tenant_id()?).await?;
    let data: Vec<Value> = if config.routing.providers.is_empty() {
        vec![model_entry(SANDBOX_MODEL, "brainstorm")].into_iter().filter(|_| caller.may_use_model(SANDBOX_MODEL)).collect()
    } else {
        state
            .models
            .models()
            .iter()
            .filter(|model| runs(&config.routing.providers, &caller, model))
            .filter(|model| include_unhealthy || state.circuits.state(&model.id()).0 != CircuitState::Open)
            .map(|model| model_entry(&model.id(), &model.provider))
            .collect()
    };
    // Anthropic's list members beside OpenAI's: the whole list is one page.
    let (first_id, last_id) = (data.first().map(|model| model["id"].clone()), data.last().map(|model| model["id"].clone()));
    Ok(Json(json!({"object": "list", "data": data, "has_more": false, "first_id": first_id, "last_id": last_id})))
}

/// `GET /v1/models/{model}` (router.read; the OpenAI SDK's `models.retrieve`): one model this key
/// can run, named `provider/model` or by its bare id (the first of the tenant's providers serving
/// it), as `/v1/models` lists it, with the catalog's facts (`x_model_router`: pricing, capabilities,
/// context window, circuit, deprecation). An open circuit does not hide it; a model the tenant has
/// no key for or the key may not use is 404 `model_not_found`.
pub async fn retrieve_model(
    State(state): State<EdgeState>,
    caller: Caller,
    Path(requested): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require("router.read")?;
    let config = state.routing.get(caller.tenant_id()?).await?;
    let not_found = || ApiError::model_not_found(format!("model `{requested}` is not one this key can run: GET /v1/models lists them"));
    if config.routing.providers.is_empty() {
        if requested == SANDBOX_MODEL && caller.may_use_model(SANDBOX_MODEL) {
            return Ok(Json(model_entry(SANDBOX_MODEL, "brainstorm")));
        }
        return Err(not_found());
    }
    let served = |model: &&Model| runs(&config.routing.providers, &caller, model);
    let model = match requested.split_once('/') {
        Some((provider, model)) => state.models.find(&provider.to_ascii_lowercase(), model).filter(served),
        None => config.routing.providers.iter().find_map(|provider| state.models.find(provider, &requested).filter(served)),
    };
    let model = model.ok_or_else(not_found)?;
    let mut entry = model_entry(&model.id(), &model.provider);
    let mut facts = runnable_entry(model)["x_model_router"].take();
    facts["circuit"] = json!(state.circuits.state(&model.id()).0.as_str());
    if let Some(deprecation) = &model.deprecated {
        facts["deprecation"] = json!({"date": deprecation.date, "sunset": deprecation.sunset, "replacement": deprecation.replacement});
    }
    entry["x_model_router"] = facts;
    Ok(Json(entry))
}

/// Whether the caller's key can run `model`: the tenant has a key for its provider and the key's
/// allowlist lets it.
fn runs(providers: &[String], caller: &Caller, model: &Model) -> bool {
    providers.contains(&model.provider) && caller.may_use_model(&model.id())
}

fn runnable_entry(model: &Model) -> Value {
    json!({
        "id": model.id(),
        "object": "model",
        "owned_by": model.provider,
        "x_model_router": {
            "pricing": {"input": model.price.input_per_million.to_json(), "output": model.price.output_per_million.to_json()},
            "capabilities": model.capabilities,
            "endpoints": [{"provider": model.provider, "model": model.model}],
            "context_window": model.context,
            "deprecated": model.deprecated.is_some(),
        },
    })
}

/// The cost of the smallest request a model can serve (one token in, one out), rounded up, in nanos.
fn smallest_request_nanos(model: &Model) -> i64 {
    let per_million = model.price.input_per_million.nanos().saturating_add(model.price.output_per_million.nanos());
    per_million.saturating_add(999_999) / 1_000_000
}

/// Whether the caller's budgets leave room for a model: every plan cap (requests, tokens a day) has
/// some left, and every money scope with a limit (tenant, key, plan) at least the model's smallest
/// request, so a free model stays runnable on a spent budget.
struct BudgetRoom {
    capped: bool,
    money_left: Option<i64>,
}

impl BudgetRoom {
    async fn of(state: &EdgeState, caller: &Caller) -> Result<Self, ApiError> {
        let context = pipeline::budget_context(state, caller, None, &HeaderMap::new(), None).await?;
        let remaining = state.guard.remaining(&context).await.map_err(crate::routes::agent_self::counters_unavailable)?;
        Ok(BudgetRoom {
            capped: remaining.levels.iter().any(|level| level.scope.kind.meter() != Meter::Spend && level.remaining() == Some(0)),
            money_left: remaining.budget_remaining().map(Usd::nanos),
        })
    }

    fn exhausted_for(&self, model: &Model) -> bool {
        self.capped || self.money_left.is_some_and(|left| left < smallest_request_nanos(model))
    }
}

/// `GET /v1/catalog/runnable` (router.read): what can run now, and why the rest cannot: no key for
/// its provider, its circuit open, its provider found down by the sentinel's last probe, or the
/// caller's budgets spent (`BudgetRoom`: the guard's counters, as a completion would meet them).
pub async fn runnable(State(state): State<EdgeState>, caller: Caller) -> Result<Json<Value>, ApiError> {
    caller.require("router.read")?;
    let config = state.routing.get(caller.tenant_id()?).await?;
    let room = BudgetRoom::of(&state, &caller).await?;
    let mut data = Vec::new();
    let (mut no_provider_key, mut circuit_open, mut sentinel_down, mut budget_exhausted) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for model in state.models.models() {
        let id = model.id();
        if !caller.may_use_model(&id) {
            continue;
        }
        if !config.routing.providers.contains(&model.provider) {
            no_provider_key.push(id);
        } else if state.circuits.state(&id).0 == CircuitState::Open {
            circuit_open.push(id);
        } else if state.sentinel.last(&model.provider).is_some_and(|probe| probe.status == ProbeStatus::Down) {
            sentinel_down.push(id);
        } else if room.exhausted_for(model) {
            budget_exhausted.push(id);
        } else {
            data.push(runnable_entry(model));
        }
    }
    let total_filtered = no_provider_key.len() + circuit_open.len() + sentinel_down.len() + budget_exhausted.len();
    Ok(Json(json!({
        "object": "list",
        "total_available": data.len(),
        "total_filtered": total_filtered,
        "data": data,
        "filtered_out": {"circuit_open": circuit_open, "no_provider_key": no_provider_key, "sentinel_down": sentinel_down, "budget_exhausted": budget_exhausted},
    })))
}
