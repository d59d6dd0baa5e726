//! `GET /v1/models/leaderboard`: the catalog's chat models ranked from the tenant's own traffic of the
//! last seven days, each model's reward a Beta posterior of its success with the catalog's quality
//! as the prior, so an unused model ranks by its prior and a used one by what it did.

use std::collections::HashMap;

use crate::extract::Query;
use axum::Json;
use axum::extract::State;
use brainstorm_common::ApiError;
use brainstorm_proto::budget::{ModelStats, ModelStatsRequest};
use brainstorm_providers::catalog::Model;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::EdgeState;
use crate::auth::Caller;

/// How many observed requests the catalog's quality counts for in the prior.
const PRIOR_WEIGHT: f64 = 10.0;
/// Entries per page by default, and at most.
const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 500;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaderboardQuery {
    sort: Option<String>,
    provider: Option<String>,
    limit: Option<String>,
    offset: Option<String>,
}

/// One model's figures.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    id: String,
    provider: String,
    model_id: String,
    reward_score: f64,
    reward_variance: f64,
    validity: Option<f64>,
    quality: f64,
    latency_ms: Option<f64>,
    tokens_per_second: Option<f64>,
    success_rate: Option<f64>,
    error_rate: Option<f64>,
    input_per_million: f64,
    output_per_million: f64,
    capabilities: Vec<String>,
    sample_count: u64,
    days_active: u64,
    value_score: f64,
}

/// Rounded to six places, as the figures are shown.
pub(crate) fn round(value: f64) -> f64 {
    (value * 1e6).round() / 1e6
}

fn dollars(nanos: i64) -> f64 {
    nanos as f64 / 1e9
}

/// The Beta posterior's `(alpha, beta)` of the model's success: the catalog's quality as a prior
/// worth [`PRIOR_WEIGHT`] requests, then what `stats` observed.
fn posterior(model: &Model, stats: &ModelStats) -> (f64, f64) {
    let prior = model.quality.clamp(0.0, 1.0);
    let failures = stats.requests.saturating_sub(stats.succeeded);
    (prior * PRIOR_WEIGHT + stats.succeeded as f64, (1.0 - prior) * PRIOR_WEIGHT + failures as f64)
}

/// The model's learned reward (its posterior's mean), unrounded; its prior when `stats` is none.
pub(crate) fn reward(model: &Model, stats: Option<&ModelStats>) -> f64 {
    let (alpha, beta) = posterior(model, stats.unwrap_or(&ModelStats::default()));
    alpha / (alpha + beta).max(f64::MIN_POSITIVE)
}

/// What a model's settlements show, unrounded; each None where nothing measured it.
pub(crate) struct Observed {
    pub success_rate: Option<f64>,
    /// Mean provider latency of the successes.
    pub latency_ms: Option<f64>,
    /// Output tokens of the successes over their latency.
    pub tokens_per_second: Option<f64>,
}

/// The observed figures of `stats`.
pub(crate) fn observed(stats: &ModelStats) -> Observed {
    let succeeded = stats.succeeded > 0;
    Observed {
        success_rate: (stats.requests > 0).then(|| stats.succeeded as f64 / stats.requests as f64),
        latency_ms: succeeded.then(|| stats.total_latency_ms as f64 / stats.succeeded as f64),
        tokens_per_second: (succeeded && stats.total_latency_ms > 0)
            .then(|| stats.total_output_tokens as f64 * 1000.0 / stats.total_latency_ms as f64),
    }
}

/// The model's entry from the catalog and its observed figures (none when it was not used).
fn entry(model: &Model, stats: Option<&ModelStats>) -> Entry {
    let empty = ModelStats::default();
    let stats = stats.unwrap_or(&empty);
    let prior = model.quality.clamp(0.0, 1.0);
    let (alpha, beta) = posterior(model, stats);
    let total = (alpha + beta).max(f64::MIN_POSITIVE);
    let reward_score = alpha / total;
    let reward_variance = alpha * beta / (total * total * (total + 1.0));
    let observed = observed(stats);
    let succeeded = stats.succeeded > 0;
    let input_per_million = dollars(model.price.input_per_million.nanos());
    let output_per_million = dollars(model.price.output_per_million.nanos());
    Entry {
        id: model.id(),
        provider: model.provider.clone(),
        model_id: model.model.clone(),
        reward_score: round(reward_score),
        reward_variance: round(reward_variance),
        validity: succeeded.then(|| round(stats.answered as f64 / stats.succeeded as f64)),
        quality: prior,
        latency_ms: observed.latency_ms.map(round),
        tokens_per_second: observed.tokens_per_second.map(round),
        success_rate: observed.success_rate.map(round),
        error_rate: observed.success_rate.map(|rate| round(1.0 - rate)),
        input_per_million,
        output_per_million,
        capabilities: model.capabilities.clone(),
        sample_count: stats.requests,
        days_active: stats.days_active,
        // Reward per dollar of a million tokens each way, a dollar added so free models stay finite.
        value_score: round(reward_score / (1.0 + (input_per_million + output_per_million) / 2.0)),
    }
}

/// `None` sorts after any value in a descending order.
fn descending(a: Option<f64>, b: Option<f64>) -> std::cmp::Ordering {
    match (a, b) {
        (Some(a), Some(b)) => b.total_cmp(&a),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    }
}

/// Orders entries by `sort`; ties by reward, then id.
fn rank(entries: &mut [Entry], sort: &str) {
    entries.sort_by(|a, b| {
        let primary = match sort {
            "quality" => b.quality.total_cmp(&a.quality),
            "speed" => descending(a.tokens_per_second, b.tokens_per_second)
                .then_with(|| descending(a.latency_ms.map(|latency| -latency), b.latency_ms.map(|latency| -latency))),
            "value" => b.value_score.total_cmp(&a.value_score),
            "reliability" => descending(a.success_rate, b.success_rate).then_with(|| b.sample_count.cmp(&a.sample_count)),
            _ => std::cmp::Ordering::Equal,
        };
        primary.then_with(|| b.reward_score.total_cmp(&a.reward_score)).then_with(|| a.id.cmp(&b.id))
    });
}

fn view(entry: &Entry) -> Value {
    json!({
        "id": entry.id,
        "provider": entry.provider,
        "model_id": entry.model_id,
        "reward_score": entry.reward_score,
        "reward_variance": entry.reward_variance,
        "validity": entry.validity,
        "quality": entry.quality,
        "latency_ms": entry.latency_ms,
        "tokens_per_second": entry.tokens_per_second,
        "success_rate": entry.success_rate,
        "pricing": {"input": entry.input_per_million, "output": entry.output_per_million},
        "capabilities": entry.capabilities,
        "sample_count": entry.sample_count,
        "days_active": entry.days_active,
        "error_rate": entry.error_rate,
        "value_score": entry.value_score,
    })
}

fn count(name: &str, value: Option<&str>, default: usize) -> Result<usize, ApiError> {
    match value {
        None => Ok(default),
        Some(text) => text
            .parse()
            .map_err(|_| ApiError::invalid_request("invalid_parameter", format!("{name} must be a non-negative integer, not `{text}`"))),
    }
}

/// `GET /v1/models/leaderboard` (router.read): `sort` (`overall`, `quality`, `speed`, `value`,
/// `reliability`), `provider`, `limit` (100, at most 500), `offset`.
pub async fn leaderboard(
    State(state): State<EdgeState>,
    caller: Caller,
    Query(query): Query<LeaderboardQuery>,
) -> Result<Json<Value>, ApiError> {
    caller.require("router.read")?;
    let tenant_id = caller.tenant_id()?;
    let sort = query.sort.as_deref().unwrap_or("overall");
    if !["overall", "quality", "speed", "value", "reliability"].contains(&sort) {
        return Err(ApiError::invalid_request(
            "invalid_parameter",
            format!("sort `{sort}` is not one of overall, quality, speed, value, reliability"),
        ));
    }
    let limit = count("limit", query.limit.as_deref(), DEFAULT_LIMIT)?.min(MAX_LIMIT);
    let offset = count("offset", query.offset.as_deref(), 0)?;
    let stats = state.budget.get_model_stats(ModelStatsRequest { tenant_id: tenant_id.to_string(), since: None }).await?;
    let cached_at = brainstorm_common::time::now_timestamp();
    let by_model: HashMap<&str, &ModelStats> = stats.models.iter().map(|stats| (stats.model.as_str(), stats)).collect();
    let mut entries: Vec<Entry> = state
        .models
        .models()
        .iter()
        .filter(|model| model.can("chat"))
        .filter(|model| query.provider.as_deref().is_none_or(|provider| model.provider == provider))
        .map(|model| entry(model, by_model.get(model.id().as_str()).copied()))
        .collect();
    rank(&mut entries, sort);
    let model_count = entries.len();
    let data: Vec<Value> = entries.iter().skip(offset).take(limit).map(view).collect();
    Ok(Json(json!({
        "object": "list",
        "sort_by": sort,
        "model_count": model_count,
        "cached_at": cached_at,
        "window": {"days": 7, "since": stats.since},
        "data": data,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(requests: u64, succeeded: u64, latency_ms: i64, output_tokens: i64) -> ModelStats {
        ModelStats {
            model: String::new(),
            requests,
            succeeded,
            answered: succeeded,
            total_latency_ms: latency_ms,
            total_output_tokens: output_tokens,
            days_active: 1,
        }
    }

    fn model(quality: f64) -> Model {
        let mut model = brainstorm_providers::catalog::ModelCatalog::bundled().expect("the bundled catalog parses").models()[0].clone();
        model.quality = quality;
        model
    }

    #[test]
    fn an_unused_model_ranks_by_its_prior_and_use_moves_it() {
        let unused = entry(&model(0.8), None);
        assert_eq!((unused.reward_score, unused.sample_count, unused.success_rate), (0.8, 0, None));
        // Ten failures in ten drag it down; ten successes lift it.
        let failing = entry(&model(0.8), Some(&stats(10, 0, 0, 0)));
        let thriving = entry(&model(0.8), Some(&stats(10, 10, 5_000, 1_000)));
        assert_eq!((failing.reward_score, failing.error_rate), (0.4, Some(1.0)));
        assert_eq!((thriving.reward_score, thriving.success_rate), (0.9, Some(1.0)));
        assert!(thriving.reward_variance < unused.reward_variance, "more evidence, less doubt");
        assert_eq!((thriving.latency_ms, thriving.tokens_per_second), (Some(500.0), Some(200.0)));
    }

    #[test]
    fn sorts_put_unmeasured_models_last_where_they_have_no_figure() {
        let mut slow = entry(&model(0.9), Some(&stats(2, 2, 4_000, 100)));
        slow.id = "b/slow".into();
        let mut fast = entry(&model(0.5), Some(&stats(2, 2, 1_000, 100)));
        fast.id = "a/fast".into();
        let mut unused = entry(&model(0.99), None);
        unused.id = "c/unused".into();
        let mut entries = vec![slow.clone(), unused.clone(), fast.clone()];
        rank(&mut entries, "speed");
        assert_eq!(entries.iter().map(|entry| entry.id.as_str()).collect::<Vec<_>>(), ["a/fast", "b/slow", "c/unused"]);
        rank(&mut entries, "quality");
        assert_eq!(entries[0].id, "c/unused");
        rank(&mut entries, "overall");
        assert_eq!(entries[0].id, "c/unused", "the highest reward: 0.99 prior, nothing observed against it");
    }
}
