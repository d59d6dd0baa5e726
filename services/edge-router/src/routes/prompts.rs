//! `/v1/prompts/*`: prompt templates, versions, environments, A/B tests and evaluations. The
//! prompts-eval service keeps them; the edge authenticates, renders the REST shapes, and runs an
//! evaluation's model calls through its own completion pipeline (so they are budgeted, guarded and
//! audited like any completion of the caller's key).
//!
//! Permissions (the spec names none): reading prompts, rendering them (`/test`) and reading results
//! need `router.read`; writing them, promoting, A/B tests and evaluations `router.write` (the keys
//! that may run models, so developers manage their own prompts).

use crate::extract::{Path, Query};
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use brainstorm_common::ApiError;
use brainstorm_prompts_eval::scoring;
use brainstorm_proto::prompts::*;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::EdgeState;
use crate::auth::Caller;
use crate::extract::{JsonBody, OptionalJsonBody, RequestId};
use crate::pipeline::{self, ClientFormat, CompletionBody, Submission};
use crate::views::json_text;

type Answer = Result<Json<Value>, ApiError>;

use brainstorm_prompts_eval::MAX_CASES;

/// Millionths in a whole.
const FULL: f64 = 1_000_000.0;

/// The prompts-eval client, or 503 when this edge was started without one.
pub(crate) fn client(state: &EdgeState) -> Result<&PromptsEvalClient, ApiError> {
    state.prompts.as_ref().ok_or_else(|| {
        ApiError::unavailable(
            "prompts_eval_unavailable",
            "this gateway runs without the prompts-eval service: set BR_PROMPTS_EVAL_URL on the edge",
        )
    })
}

fn score(micros: u32) -> Value {
    json!(f64::from(micros) / FULL)
}

fn version_view(version: &PromptVersion, prompt: &Prompt) -> Value {
    let environments: Vec<&str> = [("dev", prompt.dev_version), ("staging", prompt.staging_version), ("prod", prompt.prod_version)]
        .into_iter()
        .filter(|(_, serving)| *serving == version.version)
        .map(|(environment, _)| environment)
        .collect();
    json!({
        "version": version.version,
        "template": version.template,
        "variables": json_text(&version.variables_json),
        "change_note": version.change_note,
        "created_at": version.created_at,
        "environments": environments,
    })
}

fn prompt_view(prompt: &Prompt, with_versions: bool) -> Value {
    let serving = |version: u32| if version == 0 { Value::Null } else { json!(version) };
    let latest = prompt.versions.iter().find(|version| version.version == prompt.latest_version);
    let mut view = json!({
        "id": prompt.id,
        "version": prompt.latest_version,
        "template": latest.map(|version| version.template.as_str()),
        "variables": latest.map(|version| json_text(&version.variables_json)),
        "change_note": latest.map(|version| version.change_note.as_str()),
        "environments": {"dev": serving(prompt.dev_version), "staging": serving(prompt.staging_version), "prod": serving(prompt.prod_version)},
        "archived": prompt.archived,
        "created_at": prompt.created_at,
        "updated_at": prompt.updated_at,
    });
    if with_versions {
        view["versions"] = prompt.versions.iter().map(|version| version_view(version, prompt)).collect();
    }
    view
}

fn prompt_ref(caller: &Caller, prompt_id: String) -> Result<PromptRef, ApiError> {
    Ok(PromptRef { tenant_id: caller.tenant_id()?.to_string(), prompt_id })
}

/// `variables` as JSON text: an object, or absent.
fn variables_text(value: Option<Value>) -> Result<Option<String>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(value @ Value::Object(_)) => Ok(Some(value.to_string())),
        Some(_) => Err(ApiError::invalid_request("invalid_prompt", "variables must be an object of default values")),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateBody {
    id: Option<String>,
    template: Option<String>,
    variables: Option<Value>,
    environment: Option<String>,
    change_note: Option<String>,
}

/// `POST /v1/prompts` (router.write): `{id, template, variables?, environment?, change_note?}`; 201
/// with version 1 serving `environment` (dev by default).
pub async fn create(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<CreateBody>) -> Result<Response, ApiError> {
    caller.require("router.write")?;
    let missing = |name: &str| ApiError::invalid_request("missing_field", format!("{name} is required"));
    let request = CreatePromptRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        id: body.id.ok_or_else(|| missing("id"))?,
        template: body.template.ok_or_else(|| missing("template"))?,
        variables_json: variables_text(body.variables)?.unwrap_or_default(),
        environment: body.environment.unwrap_or_default(),
        change_note: body.change_note.unwrap_or_default(),
    };
    let prompt = client(&state)?.create_prompt(request).await?;
    Ok((StatusCode::CREATED, Json(prompt_view(&prompt, true))).into_response())
}

#[derive(Deserialize)]
pub struct ListQuery {
    include_archived: Option<bool>,
}

/// `GET /v1/prompts?include_archived=true` (router.read): each prompt with its latest version.
pub async fn list(State(state): State<EdgeState>, caller: Caller, Query(query): Query<ListQuery>) -> Answer {
    caller.require("router.read")?;
    let request =
        ListPromptsRequest { tenant_id: caller.tenant_id()?.to_string(), include_archived: query.include_archived.unwrap_or(false) };
    let prompts = client(&state)?.list_prompts(request).await?.prompts;
    let views: Vec<Value> = prompts.iter().map(|prompt| prompt_view(prompt, false)).collect();
    Ok(Json(json!({"prompts": views, "count": views.len()})))
}

/// `GET /v1/prompts/{id}` (router.read): with its version history, newest first.
pub async fn get(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>) -> Answer {
    caller.require("router.read")?;
    Ok(Json(prompt_view(&client(&state)?.get_prompt(prompt_ref(&caller, id)?).await?, true)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateBody {
    template: Option<String>,
    variables: Option<Value>,
    change_note: Option<String>,
}

/// `PUT /v1/prompts/{id}` (router.write): `{template?, variables?, change_note?}` → a new version
/// (what is absent is carried over from the latest).
pub async fn update(
    State(state): State<EdgeState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<UpdateBody>,
) -> Answer {
    caller.require("router.write")?;
    let request = UpdatePromptRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        prompt_id: id,
        template: body.template,
        variables_json: variables_text(body.variables)?,
        change_note: body.change_note.unwrap_or_default(),
    };
    Ok(Json(prompt_view(&client(&state)?.update_prompt(request).await?, true)))
}

/// `DELETE /v1/prompts/{id}` (router.write): archives it (kept, readable, out of lists, not
/// renderable by environment or A/B test changes; a running A/B test stops).
pub async fn archive(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>) -> Answer {
    caller.require("router.write")?;
    let prompt = client(&state)?.archive_prompt(prompt_ref(&caller, id)?).await?;
    Ok(Json(json!({"id": prompt.id, "archived": prompt.archived})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromoteBody {
    version: Option<u32>,
    target_environment: Option<String>,
}

/// `POST /v1/prompts/{id}/promote` (router.write): `{version, target_environment}`; a version
/// reaches staging from dev and prod from staging (409 `promotion_out_of_order` otherwise).
pub async fn promote(
    State(state): State<EdgeState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<PromoteBody>,
) -> Answer {
    caller.require("router.write")?;
    let missing = |name: &str| ApiError::invalid_request("missing_field", format!("{name} is required"));
    let request = PromoteRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        prompt_id: id,
        version: body.version.filter(|version| *version > 0).ok_or_else(|| missing("version (a positive integer)"))?,
        target_environment: body.target_environment.ok_or_else(|| missing("target_environment"))?,
    };
    Ok(Json(prompt_view(&client(&state)?.promote_prompt(request).await?, true)))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TestBody {
    variables: Option<Value>,
    version: Option<u32>,
    environment: Option<String>,
    memory_key: Option<String>,
}

/// `POST /v1/prompts/{id}/test` (router.read): `{variables, version?, environment?, memory_key?}` →
/// `{resolved_text, template_id, version, is_ab_test, missing_variables}`; without a version or
/// environment a running A/B test picks the version (and counts the exposure), else the latest.
/// `{{memory.<block>}}` placeholders nothing else fills read the block's facts from agent memory
/// (`memory_key`'s, the tenant's by default).
pub async fn test(
    State(state): State<EdgeState>,
    caller: Caller,
    Path(id): Path<String>,
    OptionalJsonBody(body): OptionalJsonBody<TestBody>,
) -> Answer {
    caller.require("router.read")?;
    let request = RenderRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        prompt_id: id,
        variables_json: variables_text(body.variables)?.unwrap_or_default(),
        version: body.version.unwrap_or(0),
        environment: body.environment.unwrap_or_default(),
        memory_key: body.memory_key.unwrap_or_default(),
    };
    let rendered = client(&state)?.render_prompt(request).await?;
    Ok(Json(json!({
        "resolved_text": rendered.resolved_text,
        "template_id": rendered.template_id,
        "version": rendered.version,
        "is_ab_test": rendered.is_ab_test,
        "missing_variables": rendered.missing_variables,
    })))
}

fn ab_view(test: &AbTest) -> Value {
    if !test.exists {
        return json!({"prompt_id": test.prompt_id, "active": false, "message": "this prompt has had no A/B test: POST {action: start, version_a, version_b, split_ratio}"});
    }
    let variant = |variant: Option<&AbVariant>| {
        variant.map(|variant| {
            json!({
                "version": variant.version,
                "exposures": variant.exposures,
                "evaluation_runs": variant.evaluation_runs,
                "avg_score": variant.avg_score_micros.map(score),
            })
        })
    };
    json!({
        "prompt_id": test.prompt_id,
        "active": test.active,
        "split_ratio": score(test.split_ratio_micros),
        "version_a": variant(test.a.as_ref()),
        "version_b": variant(test.b.as_ref()),
        "started_at": test.started_at,
        "stopped_at": (!test.stopped_at.is_empty()).then_some(&test.stopped_at),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AbBody {
    action: Option<String>,
    version_a: Option<u32>,
    version_b: Option<u32>,
    split_ratio: Option<f64>,
}

/// `POST /v1/prompts/{id}/ab` (router.write): `{action: start, version_a, version_b, split_ratio}`
/// (the share of renders given version_a, between 0 and 1) or `{action: stop}`.
pub async fn set_ab(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>, JsonBody(body): JsonBody<AbBody>) -> Answer {
    caller.require("router.write")?;
    let action = body.action.ok_or_else(|| ApiError::invalid_request("missing_field", "action is required: start or stop"))?;
    let ratio = body.split_ratio.unwrap_or(0.5);
    if !(ratio > 0.0 && ratio < 1.0) {
        return Err(ApiError::invalid_request("invalid_ab_test", "split_ratio must be between 0 and 1, exclusive"));
    }
    let needed = |value: Option<u32>, name: &str| {
        if action == "start" {
            value.ok_or_else(|| ApiError::invalid_request("missing_field", format!("{name} is required to start a test")))
        } else {
            Ok(value.unwrap_or(0))
        }
    };
    let request = AbTestRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        prompt_id: id,
        version_a: needed(body.version_a, "version_a")?,
        version_b: needed(body.version_b, "version_b")?,
        split_ratio_micros: (ratio * FULL).round() as u32,
        action,
    };
    Ok(Json(ab_view(&client(&state)?.set_ab_test(request).await?)))
}

/// `GET /v1/prompts/{id}/ab` (router.read): the test, each variant's exposures and the mean score of
/// its stored evaluation runs.
pub async fn get_ab(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>) -> Answer {
    caller.require("router.read")?;
    Ok(Json(ab_view(&client(&state)?.get_ab_test(prompt_ref(&caller, id)?).await?)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvaluateBody {
    test_cases: Option<Vec<Value>>,
    version: Option<u32>,
    model: Option<String>,
    scorer: Option<String>,
    store: Option<bool>,
    judge_model: Option<String>,
    dataset_id: Option<String>,
    memory_key: Option<String>,
}

fn cases(test_cases: Vec<Value>) -> Result<Vec<EvaluationCase>, ApiError> {
    if test_cases.is_empty() || test_cases.len() > MAX_CASES {
        return Err(ApiError::invalid_request("invalid_test_cases", format!("test_cases must hold 1 to {MAX_CASES} cases")));
    }
    test_cases
        .into_iter()
        .enumerate()
        .map(|(index, case)| {
            let invalid = |message: &str| ApiError::invalid_request("invalid_test_cases", format!("test_cases[{index}]: {message}"));
            let Value::Object(mut case) = case else { return Err(invalid("a case is {input, expected_output}")) };
            let input = match case.remove("input") {
                Some(input @ Value::Object(_)) => input,
                _ => return Err(invalid("input (an object of variables) is required")),
            };
            let expected = match case.remove("expected_output") {
                None | Some(Value::Null) => None,
                Some(Value::String(expected)) => Some(expected),
                Some(_) => return Err(invalid("expected_output must be a string")),
            };
            if let Some(unknown) = case.keys().next() {
                return Err(invalid(&format!("unknown member `{unknown}`")));
            }
            Ok(EvaluationCase {
                input_json: input.to_string(),
                has_expected: expected.is_some(),
                expected_output: expected.unwrap_or_default(),
            })
        })
        .collect()
}

/// One completion through the edge's own pipeline, as the caller: the reply's text, or why not.
pub(crate) async fn complete_text(state: &EdgeState, caller: &Caller, model: &str, prompt: &str) -> Result<String, String> {
    let body = json!({"model": model, "messages": [{"role": "user", "content": prompt}]}).to_string();
    let parsed = CompletionBody::parse(body.as_bytes(), ClientFormat::OpenAi, false).map(Submission::from);
    let request_id = RequestId(brainstorm_common::text::prefixed_uuid("req_", uuid::Uuid::now_v7()));
    let response =
        match Box::pin(pipeline::serve(state, Ok(caller.clone()), &request_id, &HeaderMap::new(), parsed, ClientFormat::OpenAi)).await {
            Ok(response) => response,
            Err(error) => return Err(error.message.clone()),
        };
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 16 * 1024 * 1024).await.map_err(|error| error.to_string())?;
    let reply: Value = serde_json::from_slice(&bytes).map_err(|_| format!("the model's answer ({status}) was not JSON"))?;
    if !status.is_success() {
        let message = reply["error"]["message"].as_str().unwrap_or("the completion failed");
        return Err(format!("{status}: {message}"));
    }
    Ok(reply["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_string())
}

fn run_view(run: &EvaluationRun, with_results: bool) -> Value {
    let mut view = json!({
        "run_id": run.run_id,
        "prompt_id": run.prompt_id,
        "version": run.version,
        "scorer": run.scorer,
        "model": (!run.model.is_empty()).then_some(&run.model),
        "created_at": run.created_at,
        "test_case_count": run.test_case_count,
        "pass_count": run.pass_count,
        "fail_count": run.fail_count,
        "avg_score": score(run.avg_score_micros),
        "stored": run.stored,
    });
    if with_results {
        view["results"] = run
            .results
            .iter()
            .map(|result| {
                let mut case = json!({
                    "input": json_text(&result.input_json),
                    "rendered": result.rendered,
                    "expected": result.expected,
                    "actual": result.actual,
                    "score": score(result.score_micros),
                    "pass": result.pass,
                    "scorer": result.scorer,
                });
                if !result.error.is_empty() {
                    case["error"] = json!(result.error);
                }
                case
            })
            .collect();
    }
    view
}

/// `POST /v1/prompts/{id}/evaluate` (router.write): `{test_cases[{input, expected_output}] (at
/// most 50), version?, model?, scorer?, store? (true), judge_model?}`. Without a model the rendered
/// prompt is the answer; with one each case is a completion through the gateway (budgeted, guarded
/// and audited as the caller's); `llm_judge` asks `judge_model` (the model by default) to score it.
pub async fn evaluate(
    State(state): State<EdgeState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<EvaluateBody>,
) -> Answer {
    caller.require("router.write")?;
    let tenant_id = caller.tenant_id()?.to_string();
    let prompts = client(&state)?;
    let cases = match (body.test_cases, body.dataset_id) {
        (Some(test_cases), None) => cases(test_cases)?,
        // A dataset's items, in order, as the cases (an item without an expected output has none).
        (None, Some(dataset_id)) => {
            let items = prompts.list_items(DatasetRef { tenant_id: tenant_id.clone(), dataset_id }).await?.items;
            let cases_of_items = items
                .iter()
                .map(|item| {
                    let mut case = json!({"input": json_text(&item.input_json)});
                    if !item.expected_output.is_empty() {
                        case["expected_output"] = json!(item.expected_output);
                    }
                    case
                })
                .collect();
            cases(cases_of_items)?
        }
        _ => return Err(ApiError::invalid_request("missing_field", "give test_cases or dataset_id (one of them)")),
    };
    let model = body.model.filter(|model| !model.trim().is_empty());
    let prepared = prompts
        .prepare_evaluation(PrepareEvaluationRequest {
            tenant_id: tenant_id.clone(),
            prompt_id: id.clone(),
            version: body.version.unwrap_or(0),
            cases: cases.clone(),
            scorer: body.scorer.unwrap_or_default(),
            has_model: model.is_some(),
            memory_key: body.memory_key.unwrap_or_default(),
        })
        .await?;
    let judge = body.judge_model.filter(|judge| !judge.trim().is_empty()).or_else(|| model.clone());
    let mut answers = Vec::with_capacity(cases.len());
    for (case, rendered) in cases.iter().zip(&prepared.rendered) {
        let answer = match &model {
            None => Ok(rendered.clone()),
            Some(model) => complete_text(&state, &caller, model, rendered).await,
        };
        let mut answer = match answer {
            Ok(actual) => CaseAnswer { actual, ..CaseAnswer::default() },
            Err(error) => CaseAnswer { error, ..CaseAnswer::default() },
        };
        if let (true, Some(judge), true) = (prepared.scorer == "llm_judge", &judge, answer.error.is_empty()) {
            let expected = case.has_expected.then_some(case.expected_output.as_str());
            let question = scoring::judge_prompt(rendered, expected, &answer.actual);
            match complete_text(&state, &caller, judge, &question).await {
                Ok(verdict) => match scoring::judge_score(&verdict) {
                    Some(score) => answer.judge_score_micros = Some(score),
                    None => answer.error = format!("the judge answered no score: {}", verdict.chars().take(200).collect::<String>()),
                },
                Err(error) => answer.error = format!("the judge failed: {error}"),
            }
        }
        answers.push(answer);
    }
    let request = RecordEvaluationRequest {
        tenant_id,
        prompt_id: id,
        version: prepared.version,
        scorer: prepared.scorer,
        model: model.unwrap_or_default(),
        store: body.store.unwrap_or(true),
        cases,
        rendered: prepared.rendered,
        answers,
    };
    let run = prompts.record_evaluation(request).await?;
    announce_quality(&state, &caller, &run);
    Ok(Json(run_view(&run, true)))
}

/// Hands the run's outcome to the fan-out as a `quality` event (when the edge has it), off the answer.
fn announce_quality(state: &EdgeState, caller: &Caller, run: &EvaluationRun) {
    let (Some(observability), Ok(tenant_id)) = (state.observability.clone(), caller.tenant_id()) else { return };
    let event = brainstorm_proto::observability::QualityEvent {
        tenant_id: tenant_id.to_string(),
        run_id: run.run_id.clone(),
        prompt_id: run.prompt_id.clone(),
        version: run.version,
        scorer: run.scorer.clone(),
        model: run.model.clone(),
        test_case_count: run.test_case_count,
        pass_count: run.pass_count,
        fail_count: run.fail_count,
        avg_score: f64::from(run.avg_score_micros) / 1_000_000.0,
        occurred_at: run.created_at.clone(),
        key_id: caller.identity.key_id.clone(),
    };
    tokio::spawn(async move {
        let events = brainstorm_proto::observability::FanoutEvents { quality_events: vec![event], ..Default::default() };
        if let Err(error) = observability.record_events(events).await {
            tracing::warn!(%error, "an evaluation's quality event could not be handed to the fan-out");
        }
    });
}

/// `GET /v1/prompts/{id}/evaluate/results` (router.read): the newest 20 runs, without cases.
pub async fn results(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>) -> Answer {
    caller.require("router.read")?;
    let runs = client(&state)?.list_evaluations(prompt_ref(&caller, id)?).await?.runs;
    let views: Vec<Value> = runs.iter().map(|run| run_view(run, false)).collect();
    Ok(Json(json!({"runs": views, "count": views.len()})))
}

#[derive(Deserialize)]
pub struct ExportQuery {
    format: Option<String>,
}

impl ExportQuery {
    /// Whether the export is CSV (else JSON, the default); another format is a 400.
    pub(crate) fn csv(&self) -> Result<bool, ApiError> {
        match self.format.as_deref() {
            None | Some("json") => Ok(false),
            Some("csv") => Ok(true),
            Some(_) => Err(ApiError::invalid_request("invalid_format", "format is json or csv")),
        }
    }
}

/// A CSV download: `text/csv`, saved as `filename`.
pub(crate) fn csv_response(csv: String, filename: &str) -> Response {
    let mut response = csv.into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/csv; charset=utf-8"));
    if let Ok(disposition) = HeaderValue::from_str(&format!("attachment; filename=\"{filename}\"")) {
        response.headers_mut().insert(header::CONTENT_DISPOSITION, disposition);
    }
    response
}

/// A CSV field: quoted when it holds a comma, quote or line break (quotes doubled); a field that
/// a spreadsheet would read as a formula is prefixed with `'`.
pub(crate) fn csv_field(text: &str) -> String {
    let text = if text.starts_with(['=', '+', '-', '@']) { format!("'{text}") } else { text.to_string() };
    if text.contains([',', '"', '\n', '\r']) { format!("\"{}\"", text.replace('"', "\"\"")) } else { text }
}

/// `GET /v1/prompts/{id}/evaluate/results/{run_id}/export?format=json|csv` (router.read): the run
/// with its cases; CSV columns `input_vars, expected, actual, score, pass, scorer`.
pub async fn export(
    State(state): State<EdgeState>,
    caller: Caller,
    Path((id, run_id)): Path<(String, String)>,
    Query(query): Query<ExportQuery>,
) -> Result<Response, ApiError> {
    caller.require("router.read")?;
    let csv_wanted = query.csv()?;
    let run = client(&state)?.get_evaluation(EvaluationRef { tenant_id: caller.tenant_id()?.to_string(), prompt_id: id, run_id }).await?;
    if !csv_wanted {
        return Ok(Json(run_view(&run, true)).into_response());
    }
    let mut csv = String::from("input_vars,expected,actual,score,pass,scorer\r\n");
    for result in &run.results {
        let row = [
            csv_field(&result.input_json),
            csv_field(&result.expected),
            csv_field(&result.actual),
            score(result.score_micros).to_string(),
            result.pass.to_string(),
            csv_field(&result.scorer),
        ];
        csv.push_str(&row.join(","));
        csv.push_str("\r\n");
    }
    Ok(csv_response(csv, &format!("evaluation-{}.csv", run.run_id)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_are_quoted_and_defused() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\"\nnow"), "\"say \"\"hi\"\"\nnow\"");
        assert_eq!(csv_field("=SUM(A1)"), "'=SUM(A1)");
    }

    #[test]
    fn cases_are_read_strictly() {
        let read = cases(vec![json!({"input": {"city": "Paris"}, "expected_output": "France"}), json!({"input": {}})]);
        let read = read.unwrap_or_default();
        assert_eq!(read.len(), 2);
        assert!(read[0].has_expected && !read[1].has_expected);
        assert!(cases(vec![json!({"input": "x"})]).is_err());
        assert!(cases(vec![json!({"input": {}, "expected": "typo"})]).is_err());
        assert!(cases(Vec::new()).is_err());
        assert!(cases(vec![json!({"input": {}}); 51]).is_err());
    }
}
