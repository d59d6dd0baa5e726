//! `/v1/insights/*`: what the tenant's own traffic says it should change. `cost`: each model's spend
//! in a window beside the cheapest model the tenant could route the same tokens to without giving up
//! tier, capabilities or observed quality; `reliability`: each model's success, latency and circuit
//! over a window, and the models that need a fallback.

use std::collections::HashMap;

use axum::Json;
use axum::extract::State;
use brainstorm_common::ApiError;
use brainstorm_common::money::Usd;
use brainstorm_proto::budget::{ModelStats, ModelStatsRequest, UsageGroup, UsageSummaryRequest};
use brainstorm_providers::catalog::{Model, Price};
use brainstorm_providers::chat::Usage;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::EdgeState;
use crate::auth::Caller;
use crate::circuits::CircuitState;
use crate::extract::Query;
use crate::routes::budget::usd;
use crate::routes::leaderboard;

/// How far below the used model's learned reward an alternative may be and still be offered.
const REWARD_TOLERANCE: f64 = 0.02;
/// Savings below this share of a model's spend are not worth a routing change.
const MIN_SAVINGS_SHARE: f64 = 0.05;
/// A model failing more than this share of its requests needs a fallback.
const ERROR_RATE_ALERT: f64 = 0.05;
/// Requests a model needs in the window before its error rate is judged.
const MIN_JUDGED_REQUESTS: u64 = 20;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowQuery {
    since: Option<String>,
    until: Option<String>,
}

/// A model the tenant could route to instead, with what the window's tokens would have cost there.
#[derive(Debug, Clone, PartialEq)]
struct Alternative {
    model: String,
    estimated: Usd,
    reward: f64,
    tier: u8,
}

/// What a window's tokens cost at `price`, every input token priced as uncached input: an upper
/// bound, so the savings shown are never more than the change would give.
fn estimate(price: &Price, input_tokens: i64, output_tokens: i64) -> Usd {
    let count = |tokens: i64| u64::try_from(tokens).unwrap_or(0);
    price.cost(Usage { input_tokens: count(input_tokens), output_tokens: count(output_tokens), ..Usage::default() })
}

/// The cheapest of `candidates` that can stand in for `used`: a chat model, not deprecated, of the
/// same tier or above, with every capability and at least the context of `used`, a learned reward
/// no more than [`REWARD_TOLERANCE`] below, and an estimate for the group's tokens below what they
/// cost by at least [`MIN_SAVINGS_SHARE`].
fn cheaper_alternative<'a>(
    used: &Model,
    used_reward: f64,
    group: &UsageGroup,
    candidates: impl Iterator<Item = (&'a Model, f64)>,
) -> Option<Alternative> {
    let spent = group.cost_nanos;
    let ceiling = spent - (spent as f64 * MIN_SAVINGS_SHARE).ceil() as i64;
    candidates
        .filter(|(model, _)| model.id() != used.id() && model.can("chat") && model.deprecated.is_none())
        .filter(|(model, _)| model.tier >= used.tier && model.context >= used.context)
        .filter(|(model, _)| used.capabilities.iter().all(|capability| model.can(capability)))
        .filter(|(_, reward)| *reward + REWARD_TOLERANCE >= used_reward)
        .map(|(model, reward)| Alternative {
            model: model.id(),
            estimated: estimate(&model.price, group.input_tokens, group.output_tokens),
            reward,
            tier: model.tier,
        })
        .filter(|alternative| alternative.estimated.nanos() < ceiling)
        .min_by(|a, b| a.estimated.cmp(&b.estimated).then_with(|| b.reward.total_cmp(&a.reward)).then_with(|| a.model.cmp(&b.model)))
}

/// A share from 0 to 1, rounded to four places.
fn share(part: i64, whole: i64) -> f64 {
    if whole <= 0 { 0.0 } else { (part as f64 / whole as f64 * 1e4).round() / 1e4 }
}

/// The catalog entry of a settlement's model key (`provider/model`).
fn catalog_model<'a>(state: &'a EdgeState, key: &str) -> Option<&'a Model> {
    let (provider, model) = key.split_once('/')?;
    state.models.find(provider, model)
}

/// `GET /v1/insights/cost?since=&until=` (config.read): the window defaults to the last 30 days.
pub async fn cost(State(state): State<EdgeState>, caller: Caller, Query(query): Query<WindowQuery>) -> Result<Json<Value>, ApiError> {
    caller.require("config.read")?;
    let tenant_id = caller.tenant_id()?.to_string();
    let summary = state
        .budget
        .get_usage_summary(UsageSummaryRequest {
            tenant_id: tenant_id.clone(),
            group_by: "model".to_string(),
            since: query.since,
            until: query.until,
        })
        .await?;
    let stats =
        state.budget.get_model_stats(ModelStatsRequest { tenant_id: tenant_id.clone(), since: Some(summary.since.clone()) }).await?;
    let by_model: HashMap<&str, &ModelStats> = stats.models.iter().map(|stats| (stats.model.as_str(), stats)).collect();
    let reward = |model: &Model| leaderboard::reward(model, by_model.get(model.id().as_str()).copied());
    let config = state.routing.get(&tenant_id).await?;
    // Where the tenant can route: models of its keyed providers whose circuit is not open.
    let routable: Vec<(&Model, f64)> = state
        .models
        .models()
        .iter()
        .filter(|model| config.routing.providers.contains(&model.provider))
        .filter(|model| state.circuits.state(&model.id()).0 != CircuitState::Open)
        .map(|model| (model, reward(model)))
        .collect();

    let mut potential = 0i64;
    let mut recommendations = Vec::new();
    let models: Vec<Value> = summary
        .groups
        .iter()
        .map(|group| {
            let mut view = json!({
                "model": group.key,
                "requests": group.requests,
                "input_tokens": group.input_tokens,
                "output_tokens": group.output_tokens,
                "cost_usd": usd(group.cost_nanos),
                "share_of_spend": share(group.cost_nanos, summary.total_cost_nanos),
                "cost_per_request_usd": usd(if group.requests == 0 { 0 } else { group.cost_nanos / group.requests as i64 }),
            });
            let Some(used) = catalog_model(&state, &group.key) else {
                view["alternative"] = Value::Null;
                view["note"] = json!("not in the catalog (the sandbox, or a provider's unlisted model): no price to compare");
                return view;
            };
            let used_reward = reward(used);
            view["reward_score"] = json!(leaderboard::round(used_reward));
            let alternative = cheaper_alternative(used, used_reward, group, routable.iter().copied());
            view["alternative"] = match &alternative {
                None => Value::Null,
                Some(alternative) => {
                    let savings = group.cost_nanos - alternative.estimated.nanos();
                    potential += savings;
                    recommendations.push((savings, json!({
                        "action": "route_to_cheaper_model",
                        "from": group.key,
                        "to": alternative.model,
                        "savings_usd": usd(savings),
                        "message": format!(
                            "{} carried {:.1}% of the window's spend; {} (tier {}, every capability of {}, learned reward {:.3}) would have cost {} USD less for the same tokens: point an alias or preset at it",
                            group.key, share(group.cost_nanos, summary.total_cost_nanos) * 100.0, alternative.model, alternative.tier, group.key,
                            alternative.reward, Usd::from_nanos(savings).fixed(6)
                        ),
                        "endpoint": "/v1/aliases",
                        "method": "PUT",
                    })));
                    json!({
                        "model": alternative.model,
                        "tier": alternative.tier,
                        "reward_score": leaderboard::round(alternative.reward),
                        "estimated_cost_usd": usd(alternative.estimated.nanos()),
                        "savings_usd": usd(savings),
                        "savings_share": share(savings, group.cost_nanos),
                    })
                }
            };
            view
        })
        .collect();
    recommendations.sort_by_key(|(savings, _)| std::cmp::Reverse(*savings));
    Ok(Json(json!({
        "window": {"since": summary.since, "until": summary.until},
        "total_requests": summary.total_requests,
        "total_cost_usd": usd(summary.total_cost_nanos),
        "potential_savings_usd": usd(potential),
        "potential_savings_share": share(potential, summary.total_cost_nanos),
        "models": models,
        "recommendations": recommendations.into_iter().map(|(_, recommendation)| recommendation).collect::<Vec<_>>(),
        "method": format!(
            "each model's tokens in the window priced, uncached, on the cheapest model the tenant holds a key for whose circuit is closed, of the same tier or above, with every capability and at least the context of the used one, and a learned reward no more than {REWARD_TOLERANCE} below; offered when it saves at least {}%",
            MIN_SAVINGS_SHARE * 100.0
        ),
    })))
}

/// One model's judged reliability in a window.
#[derive(Debug, PartialEq)]
enum Finding {
    /// Its circuit is open now: requests fail over or are refused.
    CircuitOpen,
    /// It failed more than [`ERROR_RATE_ALERT`] of at least [`MIN_JUDGED_REQUESTS`] requests.
    HighErrorRate,
}

fn findings(stats: &ModelStats, circuit: CircuitState) -> Vec<Finding> {
    let mut findings = Vec::new();
    if circuit == CircuitState::Open {
        findings.push(Finding::CircuitOpen);
    }
    let failed = stats.requests.saturating_sub(stats.succeeded);
    if stats.requests >= MIN_JUDGED_REQUESTS && failed as f64 > stats.requests as f64 * ERROR_RATE_ALERT {
        findings.push(Finding::HighErrorRate);
    }
    findings
}

/// `GET /v1/insights/reliability?since=` (config.read): each model the tenant used since `since`
/// (seven days by default), its success and latency, its circuit now, and what to do about it.
pub async fn reliability(
    State(state): State<EdgeState>,
    caller: Caller,
    Query(query): Query<WindowQuery>,
) -> Result<Json<Value>, ApiError> {
    caller.require("config.read")?;
    if query.until.is_some() {
        return Err(ApiError::invalid_request("invalid_query_parameter", "reliability takes `since` only: its window ends now"));
    }
    let tenant_id = caller.tenant_id()?.to_string();
    let stats = state.budget.get_model_stats(ModelStatsRequest { tenant_id, since: query.since }).await?;
    let mut recommendations = Vec::new();
    let models: Vec<Value> = stats
        .models
        .iter()
        .map(|model| {
            let (circuit, _) = state.circuits.state(&model.model);
            let failed = model.requests.saturating_sub(model.succeeded);
            let findings = findings(model, circuit);
            for finding in &findings {
                let (action, message) = match finding {
                    Finding::CircuitOpen => (
                        "add_fallback",
                        format!("{}'s circuit is open: requests naming it fail over or are refused; give its callers a preset with a fallback list", model.model),
                    ),
                    Finding::HighErrorRate => (
                        "add_fallback",
                        format!(
                            "{} failed {failed} of {} requests ({:.1}%): a preset with a fallback list would have answered them",
                            model.model,
                            model.requests,
                            failed as f64 * 100.0 / model.requests as f64
                        ),
                    ),
                };
                recommendations.push(json!({"action": action, "model": model.model, "message": message, "endpoint": "/v1/presets", "method": "POST"}));
            }
            let observed = leaderboard::observed(model);
            json!({
                "model": model.model,
                "requests": model.requests,
                "succeeded": model.succeeded,
                "failed": failed,
                "success_rate": observed.success_rate.map(leaderboard::round),
                "mean_latency_ms": observed.latency_ms.map(leaderboard::round),
                "tokens_per_second": observed.tokens_per_second.map(leaderboard::round),
                "days_active": model.days_active,
                "circuit": circuit.as_str(),
                "healthy": findings.is_empty(),
            })
        })
        .collect();
    Ok(Json(json!({
        "window": {"since": stats.since},
        "models": models,
        "recommendations": recommendations,
        "method": format!(
            "a model is flagged when its circuit is open now, or when it failed more than {}% of at least {MIN_JUDGED_REQUESTS} requests in the window",
            ERROR_RATE_ALERT * 100.0
        ),
    })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use brainstorm_providers::catalog::ModelCatalog;

    fn catalog() -> ModelCatalog {
        ModelCatalog::bundled().expect("the bundled catalog parses")
    }

    fn group(key: &str, input_tokens: i64, output_tokens: i64, cost_nanos: i64) -> UsageGroup {
        UsageGroup { key: key.to_string(), requests: 10, input_tokens, output_tokens, cost_nanos }
    }

    fn model(provider: &str, name: &str, input: i64, output: i64, tier: u8, capabilities: &[&str]) -> Model {
        let mut model = catalog().models()[0].clone();
        model.provider = provider.to_string();
        model.model = name.to_string();
        model.price = Price::uncached(Usd::from_nanos(input), Usd::from_nanos(output));
        model.tier = tier;
        model.capabilities = capabilities.iter().map(|capability| capability.to_string()).collect();
        model.deprecated = None;
        model.context = 128_000;
        model
    }

    const DOLLAR: i64 = 1_000_000_000;

    #[test]
    fn offers_the_cheapest_model_that_gives_up_nothing() {
        let used = model("a", "big", 10 * DOLLAR, 30 * DOLLAR, 3, &["chat", "tools"]);
        // One million tokens each way: 40 USD on the used model.
        let spent = group("a/big", 1_000_000, 1_000_000, 40 * DOLLAR);
        let cheap_but_small = model("b", "small", DOLLAR, DOLLAR, 1, &["chat", "tools"]);
        let cheap_without_tools = model("b", "notools", DOLLAR, DOLLAR, 3, &["chat"]);
        let cheap_but_worse = model("b", "worse", DOLLAR, DOLLAR, 3, &["chat", "tools"]);
        let fair = model("c", "fair", 5 * DOLLAR, 15 * DOLLAR, 3, &["chat", "tools", "vision"]);
        let fairer = model("c", "fairer", 4 * DOLLAR, 15 * DOLLAR, 3, &["chat", "tools"]);
        let candidates = [(&cheap_but_small, 0.9), (&cheap_without_tools, 0.9), (&cheap_but_worse, 0.7), (&fair, 0.85), (&fairer, 0.79)];
        let best = cheaper_alternative(&used, 0.8, &spent, candidates.iter().copied()).expect("one qualifies");
        // `fairer` is cheaper than `fair` and its reward (0.79) is within 0.02 of the used model's.
        assert_eq!((best.model.as_str(), best.estimated.nanos()), ("c/fairer", 19 * DOLLAR));
        // Asked for a reward the candidates cannot match, nothing is offered.
        assert_eq!(cheaper_alternative(&used, 0.9, &spent, candidates.iter().copied()), None);
    }

    #[test]
    fn never_offers_the_model_itself_a_deprecated_one_or_a_saving_below_five_percent() {
        let used = model("a", "big", 10 * DOLLAR, 30 * DOLLAR, 2, &["chat"]);
        let spent = group("a/big", 1_000_000, 1_000_000, 40 * DOLLAR);
        let same = used.clone();
        let mut deprecated = model("b", "old", DOLLAR, DOLLAR, 2, &["chat"]);
        deprecated.deprecated =
            Some(brainstorm_providers::catalog::Deprecation { date: "2026-01-01".into(), sunset: "2026-12-01".into(), replacement: None });
        // 38.5 USD against 40: a 3.75% saving.
        let marginal = model("c", "marginal", 9_500_000_000, 29 * DOLLAR, 2, &["chat"]);
        let mut short_context = model("d", "short", DOLLAR, DOLLAR, 2, &["chat"]);
        short_context.context = 8_000;
        let candidates = [(&same, 0.8), (&deprecated, 0.8), (&marginal, 0.8), (&short_context, 0.8)];
        assert_eq!(cheaper_alternative(&used, 0.8, &spent, candidates.iter().copied()), None);
    }

    #[test]
    fn estimates_price_every_input_token_uncached() {
        let price = Price::uncached(Usd::from_nanos(3 * DOLLAR), Usd::from_nanos(15 * DOLLAR));
        assert_eq!(estimate(&price, 2_000_000, 100_000).nanos(), 6 * DOLLAR + 1_500_000_000);
        assert_eq!(estimate(&price, -5, 0).nanos(), 0, "a negative sum (never stored) counts as none");
    }

    #[test]
    fn flags_open_circuits_and_error_rates_above_five_percent_of_enough_requests() {
        let stats = |requests, succeeded| ModelStats { model: "a/m".into(), requests, succeeded, ..ModelStats::default() };
        assert_eq!(findings(&stats(100, 95), CircuitState::Closed), vec![]);
        assert_eq!(findings(&stats(100, 94), CircuitState::Closed), vec![Finding::HighErrorRate]);
        assert_eq!(findings(&stats(10, 0), CircuitState::Closed), vec![], "too few requests to judge");
        assert_eq!(findings(&stats(0, 0), CircuitState::Open), vec![Finding::CircuitOpen]);
    }

    #[test]
    fn shares_are_bounded_and_rounded() {
        assert_eq!(share(1, 3), 0.3333);
        assert_eq!(share(5, 0), 0.0);
    }
}
