//! Budgets: status, tenant limits, forecast, agent budgets, alerts, and the usage summary.

use crate::extract::{Path, Query};
use axum::Json;
use axum::extract::State;
use brainstorm_common::ApiError;
use brainstorm_common::money::Usd;
use brainstorm_proto::budget::*;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::EdgeState;
use crate::auth::Caller;
use crate::extract::JsonBody;

pub type Answer = Result<Json<Value>, ApiError>;

pub(crate) fn usd(nanos: i64) -> Value {
    Usd::from_nanos(nanos).to_json()
}

/// Nano-dollars as a JSON number of dollars, or null.
pub(crate) fn optional_usd(nanos: Option<i64>) -> Value {
    nanos.map_or(Value::Null, usd)
}

/// Reads a body field that must be a non-negative number of dollars, or null. `None` when absent.
fn dollars_field(body: &Map<String, Value>, field: &str) -> Result<Option<Option<i64>>, ApiError> {
    match body.get(field) {
        None => Ok(None),
        Some(Value::Null) => Ok(Some(None)),
        Some(Value::Number(number)) => {
            let amount =
                Usd::from_json_number(number).map_err(|error| ApiError::invalid_request("invalid_amount", format!("{field}: {error}")))?;
            if amount < Usd::ZERO {
                return Err(ApiError::invalid_request("invalid_amount", format!("{field} must not be negative")));
            }
            Ok(Some(Some(amount.nanos())))
        }
        Some(_) => Err(ApiError::invalid_request("invalid_amount", format!("{field} must be a number of USD or null"))),
    }
}

fn object(body: Value) -> Result<Map<String, Value>, ApiError> {
    match body {
        Value::Object(map) => Ok(map),
        _ => Err(ApiError::invalid_request("invalid_body", "the body must be a JSON object")),
    }
}

fn period(status: Option<&PeriodStatus>) -> Value {
    let Some(status) = status else { return Value::Null };
    json!({
        "spent_usd": usd(status.spent_nanos),
        "limit_usd": optional_usd(status.limit_nanos),
        "remaining_usd": optional_usd(status.remaining_nanos),
        "period_key": status.period_key,
    })
}

/// `GET /v1/budget/status` (config.read): the tenant's daily and monthly spend and the calling key's budget.
pub async fn status(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("config.read")?;
    let tenant_id = caller.tenant_id()?.to_string();
    let key = caller.identity.key.as_ref();
    let request = GetStatusRequest {
        tenant_id,
        plan: caller.identity.plan.clone(),
        key_id: key.map(|key| key.id.clone()),
        key_budget: key.and_then(|key| {
            key.budget_limit_nanos
                .map(|limit_nanos| KeyBudget { limit_nanos, period: key.budget_period.clone().unwrap_or_else(|| "monthly".to_string()) })
        }),
    };
    let status = state.budget.get_status(request).await?;
    let key_budget = status.key_budget.as_ref().map_or(Value::Null, |budget| {
        json!({
            "limit_usd": usd(budget.limit_nanos),
            "period": budget.period,
            "spent_usd": usd(budget.spent_nanos),
            "remaining_usd": usd(budget.remaining_nanos),
            "period_key": budget.period_key,
        })
    });
    Ok(Json(json!({
        "tenant_id": status.tenant_id,
        "key_id": status.key_id,
        "plan": status.plan,
        "tier": status.tier,
        "daily": period(status.daily.as_ref()),
        "monthly": period(status.monthly.as_ref()),
        "key_budget": key_budget,
    })))
}

/// `PUT /v1/budget/limits` (config.write): `{daily_limit_usd, monthly_limit_usd}`; null clears a limit,
/// an absent field keeps it.
pub async fn set_limits(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<Value>) -> Answer {
    caller.require("config.write")?;
    let tenant_id = caller.tenant_id()?.to_string();
    let body = object(body)?;
    if let Some(unknown) = body.keys().find(|key| *key != "daily_limit_usd" && *key != "monthly_limit_usd") {
        return Err(ApiError::invalid_request(
            "invalid_body",
            format!("unknown field `{unknown}`: expected daily_limit_usd, monthly_limit_usd"),
        ));
    }
    let daily = dollars_field(&body, "daily_limit_usd")?;
    let monthly = dollars_field(&body, "monthly_limit_usd")?;
    let current = state.budget.get_limits(TenantRef { tenant_id: tenant_id.clone() }).await?;
    let request = SetLimitsRequest {
        tenant_id: tenant_id.clone(),
        daily_limit_nanos: daily.unwrap_or(current.daily_limit_nanos),
        monthly_limit_nanos: monthly.unwrap_or(current.monthly_limit_nanos),
    };
    let limits = state.budget.set_limits(request).await?;
    state.budget_settings.evict(&tenant_id);
    Ok(Json(
        json!({"ok": true, "limits": {"dailyLimitUsd": optional_usd(limits.daily_limit_nanos), "monthlyLimitUsd": optional_usd(limits.monthly_limit_nanos)}}),
    ))
}

/// `GET /v1/budget/forecast` (config.read): from up to 30 days of daily spend.
pub async fn forecast(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("config.read")?;
    let forecast = state
        .budget
        .get_forecast(GetForecastRequest { tenant_id: caller.tenant_id()?.to_string(), plan: caller.identity.plan.clone() })
        .await?;
    let summary = forecast.forecast.unwrap_or_default();
    let limits = forecast.limits.unwrap_or_default();
    let daily: Vec<Value> = forecast.daily_spent.iter().map(|day| json!({"date": day.date, "spent_usd": usd(day.spent_nanos)})).collect();
    let anomalies: Vec<Value> = forecast
        .anomalies
        .iter()
        .map(|anomaly| json!({"date": anomaly.date, "spentUsd": usd(anomaly.spent_nanos), "expectedUsd": usd(anomaly.expected_nanos), "sigma": anomaly.sigma}))
        .collect();
    Ok(Json(json!({
        "forecast": {
            "avgDailySpendUsd": usd(summary.avg_daily_spend_nanos),
            "projectedPeriodSpendUsd": usd(summary.projected_period_spend_nanos),
            "depletionDate": summary.depletion_date,
            "daysRemaining": summary.days_remaining,
            "trend": summary.trend,
            "confidence": summary.confidence,
            "period": summary.period,
            "periodKey": summary.period_key,
        },
        "anomalies": anomalies,
        "daysOfData": forecast.days_of_data,
        "daily_spent_usd": daily,
        "limits": {"daily_usd": optional_usd(limits.daily_nanos), "monthly_usd": optional_usd(limits.monthly_nanos)},
        "generated_at": forecast.generated_at,
    })))
}

fn agent_config(budget: &AgentBudget) -> Value {
    json!({"perDayUsd": usd(budget.per_day_nanos), "exhaustionAction": budget.exhaustion_action})
}

/// `GET /v1/budget/agents` (config.read): every agent's budget and spend, and a leaderboard.
pub async fn agents(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("config.read")?;
    let view = state.budget.list_agents(ListAgentsRequest { tenant_id: caller.tenant_id()?.to_string() }).await?;
    let agents: Vec<Value> = view
        .agents
        .iter()
        .map(|agent| {
            let status = agent.status.unwrap_or_default();
            json!({
                "agentId": agent.agent_id,
                "config": agent.config.as_ref().map_or(Value::Null, agent_config),
                "status": {
                    "totalSpendUsd": usd(status.total_spend_nanos),
                    "spentTodayUsd": usd(status.spent_today_nanos),
                    "activeConversations": status.active_conversations,
                    "downgradeCount": status.downgrade_count,
                    "stopCount": status.stop_count,
                },
            })
        })
        .collect();
    let leaderboard: Vec<Value> = view
        .leaderboard
        .iter()
        .map(|entry| {
            json!({
                "agentId": entry.agent_id,
                "totalSpendUsd": usd(entry.total_spend_nanos),
                "totalRequests": entry.total_requests,
                "successRate": entry.success_rate,
                "avgCostPerRequest": usd(entry.avg_cost_per_request_nanos),
                "avgLatencyMs": entry.avg_latency_ms,
                "efficiencyScore": entry.efficiency_score,
            })
        })
        .collect();
    Ok(Json(json!({"agents": agents, "leaderboard": leaderboard})))
}

/// `PUT /v1/budget/agents/{agentId}` (config.write): `{perDayUsd, exhaustionAction: stop|downgrade}`.
pub async fn put_agent(
    State(state): State<EdgeState>,
    caller: Caller,
    Path(agent_id): Path<String>,
    JsonBody(body): JsonBody<Value>,
) -> Answer {
    caller.require("config.write")?;
    let tenant_id = caller.tenant_id()?.to_string();
    let body = object(body)?;
    let per_day =
        dollars_field(&body, "perDayUsd")?.flatten().ok_or_else(|| ApiError::invalid_request("missing_field", "perDayUsd is required"))?;
    let action = match body.get("exhaustionAction") {
        None | Some(Value::Null) => "stop".to_string(),
        Some(Value::String(action)) if action == "stop" || action == "downgrade" => action.clone(),
        Some(_) => return Err(ApiError::invalid_request("invalid_exhaustion_action", "exhaustionAction must be stop or downgrade")),
    };
    let budget = state
        .budget
        .put_agent_budget(PutAgentBudgetRequest {
            tenant_id: tenant_id.clone(),
            agent_id: agent_id.clone(),
            per_day_nanos: per_day,
            exhaustion_action: action,
        })
        .await?;
    state.budget_settings.evict(&tenant_id);
    Ok(Json(json!({"ok": true, "agentId": agent_id, "config": agent_config(&budget)})))
}

fn alert_config(config: &AlertConfig) -> Value {
    json!({"thresholds": config.thresholds, "webhookUrl": config.webhook_url, "enabled": config.enabled})
}

/// `GET /v1/budget/alerts/config` (config.read).
pub async fn get_alert_config(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("config.read")?;
    let config = state.budget.get_alert_config(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?;
    Ok(Json(alert_config(&config)))
}

/// `PUT /v1/budget/alerts/config` (config.write): absent fields keep their value.
pub async fn put_alert_config(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<Value>) -> Answer {
    caller.require("config.write")?;
    let tenant_id = caller.tenant_id()?.to_string();
    let body = object(body)?;
    let current = state.budget.get_alert_config(TenantRef { tenant_id: tenant_id.clone() }).await?;
    let thresholds = match body.get("thresholds") {
        None => current.thresholds,
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| item.as_u64().and_then(|value| u32::try_from(value).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| ApiError::invalid_request("invalid_thresholds", "thresholds must be integer percents"))?,
        Some(_) => return Err(ApiError::invalid_request("invalid_thresholds", "thresholds must be an array of integer percents")),
    };
    let webhook_url = match body.get("webhookUrl") {
        None => current.webhook_url,
        Some(Value::Null) => None,
        Some(Value::String(url)) => Some(url.clone()),
        Some(_) => return Err(ApiError::invalid_request("invalid_webhook_url", "webhookUrl must be a URL string or null")),
    };
    let enabled = match body.get("enabled") {
        None => current.enabled,
        Some(Value::Bool(enabled)) => *enabled,
        Some(_) => return Err(ApiError::invalid_request("invalid_enabled", "enabled must be a boolean")),
    };
    let config = state.budget.put_alert_config(PutAlertConfigRequest { tenant_id, thresholds, webhook_url, enabled }).await?;
    Ok(Json(alert_config(&config)))
}

#[derive(Deserialize)]
pub struct LimitQuery {
    limit: Option<u32>,
}

/// `GET /v1/budget/alerts/history?limit=` (config.read).
pub async fn alert_history(State(state): State<EdgeState>, caller: Caller, Query(query): Query<LimitQuery>) -> Answer {
    caller.require("config.read")?;
    let list = state
        .budget
        .list_alerts(ListAlertsRequest { tenant_id: caller.tenant_id()?.to_string(), limit: query.limit.unwrap_or(50) })
        .await?;
    let alerts: Vec<Value> = list
        .alerts
        .iter()
        .map(|alert| {
            json!({
                "id": alert.id,
                "scope": alert.scope,
                "ratioPercent": alert.ratio_percent,
                "threshold": alert.threshold,
                "projectedUsd": usd(alert.projected_nanos),
                "limitUsd": usd(alert.limit_nanos),
                "tenantId": alert.tenant_id,
                "timestamp": alert.timestamp,
                "periodKey": alert.period_key,
                "delivery": {"status": alert.delivery_status, "attempts": alert.delivery_attempts, "error": alert.delivery_error},
            })
        })
        .collect();
    Ok(Json(json!({"count": alerts.len(), "alerts": alerts})))
}

#[derive(Deserialize)]
pub struct UsageQuery {
    #[serde(rename = "groupBy")]
    group_by: Option<String>,
    since: Option<String>,
    until: Option<String>,
}

/// `GET /v1/usage/summary?groupBy=model|provider|key|agent|day&since=&until=` (config.read).
pub async fn usage_summary(State(state): State<EdgeState>, caller: Caller, Query(query): Query<UsageQuery>) -> Answer {
    caller.require("config.read")?;
    let request = UsageSummaryRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        group_by: query.group_by.unwrap_or_else(|| "model".to_string()),
        since: query.since,
        until: query.until,
    };
    let summary = state.budget.get_usage_summary(request).await?;
    let groups: Vec<Value> = summary
        .groups
        .iter()
        .map(|group| {
            json!({"key": group.key, "requests": group.requests, "input_tokens": group.input_tokens, "output_tokens": group.output_tokens, "cost_usd": usd(group.cost_nanos)})
        })
        .collect();
    Ok(Json(json!({
        "group_by": summary.group_by,
        "since": summary.since,
        "until": summary.until,
        "total_requests": summary.total_requests,
        "total_cost_usd": usd(summary.total_cost_nanos),
        "groups": groups,
    })))
}
