//! One budget-ledger suite (store, service, consumer, forecast and alerts), run against SQLite and
//! PostgreSQL alike. A tiny axum server on 127.0.0.1:0 stands for the alert webhook.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use brainstorm_budget_ledger::{
    BudgetContext, BudgetGuard, BudgetLedgerOptions, BudgetLedgerServiceImpl, Handled, Scope, ScopeKind, SettlementConsumer, WebhookOptions,
};
use brainstorm_common::bus::{EventBus, InProcessBus};
use brainstorm_common::store::Database;
use brainstorm_common::time::format_timestamp;
use brainstorm_proto::ErrorKind;
use brainstorm_proto::budget::*;
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use prost::Message;
use serde_json::Value;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const CENT: i64 = 10_000_000;
const USD: i64 = 100 * CENT;

struct Harness {
    service: BudgetLedgerServiceImpl,
    clock: Arc<Mutex<DateTime<Utc>>>,
}

impl Harness {
    fn new(database: Database) -> Self {
        // Late in a UTC day, so a day's projection is (almost) its spend.
        let start = brainstorm_common::time::parse_timestamp("2026-11-20T23:59:00Z").unwrap_or_else(Utc::now);
        let clock = Arc::new(Mutex::new(start));
        let reader = clock.clone();
        let options = BudgetLedgerOptions {
            webhook: WebhookOptions { attempts: 4, initial_backoff: Duration::from_millis(10), timeout: Duration::from_secs(2) },
            clock: Arc::new(move || *reader.lock().unwrap_or_else(std::sync::PoisonError::into_inner)),
            alert_interval: Duration::from_millis(50),
        };
        Harness { service: BudgetLedgerServiceImpl::new(database, options), clock }
    }

    fn now(&self) -> DateTime<Utc> {
        *self.clock.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn advance(&self, by: ChronoDuration) {
        let mut clock = self.clock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *clock += by;
    }

    async fn settle(&self, settlement: Settlement) -> Result<bool, brainstorm_proto::ServiceError> {
        self.service.record(&BudgetEvent { kind: Some(budget_event::Kind::Settlement(settlement)) }).await
    }
}

fn settlement(tenant_id: &str, cost_nanos: i64, occurred_at: DateTime<Utc>) -> Settlement {
    Settlement {
        request_id: format!("req_{}", uuid::Uuid::now_v7().simple()),
        tenant_id: tenant_id.to_string(),
        plan: "standard".to_string(),
        key_id: Some("key-1".to_string()),
        agent_id: None,
        conversation_id: None,
        model: "openai/gpt-4o-mini".to_string(),
        provider: "openai".to_string(),
        input_tokens: 10,
        output_tokens: 20,
        cost_nanos,
        outcome: "succeeded".to_string(),
        latency_ms: 100,
        occurred_at: format_timestamp(occurred_at),
    }
}

fn new_tenant() -> String {
    uuid::Uuid::new_v4().to_string()
}

use brainstorm_common::on_both_engines;

on_both_engines!(
    settlements_are_recorded_once_and_feed_the_status,
    limits_are_set_cleared_and_validated,
    agent_budgets_and_the_agents_view,
    agent_limits_are_replaced_merged_and_versioned,
    the_forecast_reads_thirty_days_of_the_ledger,
    alerts_fire_once_per_crossing_and_reset_next_period,
    webhooks_are_retried_and_failures_recorded,
    alert_configuration_defaults_and_validation,
    the_consumer_records_each_event_once_and_acks,
    usage_is_summarised_by_every_grouping,
    settled_requests_are_paged_newest_first_and_filtered,
    current_totals_seed_a_restarted_gateway,
    a_batch_of_settlements_counts_each_once_per_day,
);

async fn a_batch_of_settlements_counts_each_once_per_day(database: Database) -> TestResult {
    let harness = Harness::new(database);
    let (tenant, other) = (new_tenant(), new_tenant());
    let now = harness.now();
    let earlier = settlement(&tenant, 5 * CENT, now);
    assert!(harness.settle(earlier.clone()).await?);
    let first = settlement(&tenant, 30 * CENT, now);
    let second = settlement(&tenant, 20 * CENT, now);
    let days_ago = settlement(&tenant, 100 * CENT, now - ChronoDuration::days(3));
    let elsewhere = settlement(&other, 7 * CENT, now);
    // A redelivery inside the batch and one of a settlement recorded before it count nothing.
    let batch = [&first, &second, &first, &days_ago, &earlier, &elsewhere];
    let written = harness.service.record_settlements(&batch).await?;
    assert_eq!(written, vec![true, true, false, true, false, true]);
    let status = |tenant_id: &str| {
        harness.service.get_status(GetStatusRequest {
            tenant_id: tenant_id.to_string(),
            plan: "standard".to_string(),
            key_id: None,
            key_budget: None,
        })
    };
    let mine = status(&tenant).await?;
    assert_eq!(mine.daily.map(|daily| daily.spent_nanos), Some(55 * CENT), "today: earlier + first + second");
    assert_eq!(mine.monthly.map(|monthly| monthly.spent_nanos), Some(155 * CENT));
    assert_eq!(status(&other).await?.daily.map(|daily| daily.spent_nanos), Some(7 * CENT));
    // A batch that is all new (the common case, written without reading rows back) counts each.
    let (third, fourth) = (settlement(&tenant, 2 * CENT, now), settlement(&tenant, 3 * CENT, now));
    assert_eq!(harness.service.record_settlements(&[&third, &fourth]).await?, vec![true, true]);
    assert_eq!(status(&tenant).await?.daily.map(|daily| daily.spent_nanos), Some(60 * CENT));
    // ... and after a rolled-back first attempt, a batch mixing old and new counts only the new.
    let fifth = settlement(&tenant, 4 * CENT, now);
    assert_eq!(harness.service.record_settlements(&[&third, &fifth, &fourth]).await?, vec![false, true, false]);
    assert_eq!(status(&tenant).await?.daily.map(|daily| daily.spent_nanos), Some(64 * CENT));
    Ok(())
}

async fn settlements_are_recorded_once_and_feed_the_status(database: Database) -> TestResult {
    let harness = Harness::new(database);
    let tenant = new_tenant();
    let now = harness.now();
    let first = settlement(&tenant, 30 * CENT, now);
    assert!(harness.settle(first.clone()).await?);
    assert!(!harness.settle(first.clone()).await?, "a redelivered settlement is not counted twice");
    harness.settle(Settlement { key_id: Some("key-2".to_string()), ..settlement(&tenant, 20 * CENT, now) }).await?;
    // Earlier this month, another day: monthly only.
    harness.settle(settlement(&tenant, 100 * CENT, now - ChronoDuration::days(3))).await?;
    // Last month: in neither period.
    harness.settle(settlement(&tenant, 40 * CENT, now - ChronoDuration::days(25))).await?;
    // The month's edges, to the millisecond: its first instant counts, the one before does not.
    let edge = |text: &str| brainstorm_common::time::parse_timestamp(text).ok_or("bad instant");
    harness.settle(settlement(&tenant, 7 * CENT, edge("2026-11-01T00:00:00.000Z")?)).await?;
    harness.settle(settlement(&tenant, 11 * CENT, edge("2026-10-31T23:59:59.999Z")?)).await?;
    harness.settle(settlement(&new_tenant(), 999 * CENT, now)).await?;

    let status = harness
        .service
        .get_status(GetStatusRequest {
            tenant_id: tenant.clone(),
            plan: "sandbox".to_string(),
            key_id: Some("key-1".to_string()),
            key_budget: Some(KeyBudget { limit_nanos: USD, period: "monthly".to_string() }),
        })
        .await?;
    assert_eq!((status.plan.as_str(), status.tier.as_str()), ("sandbox", "community"));
    let daily = status.daily.ok_or("no daily")?;
    assert_eq!(
        (daily.spent_nanos, daily.limit_nanos, daily.remaining_nanos, daily.period_key.as_str()),
        (50 * CENT, Some(2 * USD), Some(150 * CENT), "2026-11-20")
    );
    let monthly = status.monthly.ok_or("no monthly")?;
    assert_eq!(
        (monthly.spent_nanos, monthly.limit_nanos, monthly.remaining_nanos, monthly.period_key.as_str()),
        (157 * CENT, None, None, "2026-11")
    );
    let key = status.key_budget.ok_or("no key budget")?;
    assert_eq!((key.spent_nanos, key.remaining_nanos, key.period.as_str(), key.period_key.as_str()), (137 * CENT, 0, "monthly", "2026-11"));

    let invalid = harness.settle(Settlement { cost_nanos: -1, ..settlement(&tenant, 0, now) }).await;
    assert_eq!(invalid.err().map(|error| error.kind), Some(ErrorKind::InvalidArgument));
    let bad_period = harness
        .service
        .get_status(GetStatusRequest {
            tenant_id: tenant,
            plan: "standard".to_string(),
            key_id: Some("key-1".to_string()),
            key_budget: Some(KeyBudget { limit_nanos: USD, period: "weekly".to_string() }),
        })
        .await;
    assert_eq!(bad_period.err().map(|error| error.reason), Some("invalid_budget_period".to_string()));
    Ok(())
}

async fn limits_are_set_cleared_and_validated(database: Database) -> TestResult {
    let harness = Harness::new(database);
    let tenant = new_tenant();
    let empty = harness.service.get_limits(TenantRef { tenant_id: tenant.clone() }).await?;
    assert_eq!((empty.daily_limit_nanos, empty.monthly_limit_nanos), (None, None));
    let set = harness
        .service
        .set_limits(SetLimitsRequest { tenant_id: tenant.clone(), daily_limit_nanos: Some(USD), monthly_limit_nanos: Some(20 * USD) })
        .await?;
    assert_eq!((set.daily_limit_nanos, set.monthly_limit_nanos), (Some(USD), Some(20 * USD)));
    let status = harness
        .service
        .get_status(GetStatusRequest { tenant_id: tenant.clone(), plan: "standard".to_string(), ..Default::default() })
        .await?;
    assert_eq!(status.daily.and_then(|daily| daily.limit_nanos), Some(USD), "the tenant's lower limit applies under the plan's");
    assert_eq!(status.monthly.and_then(|monthly| monthly.limit_nanos), Some(20 * USD));
    assert_eq!(status.key_budget, None);

    // Null clears.
    harness
        .service
        .set_limits(SetLimitsRequest { tenant_id: tenant.clone(), daily_limit_nanos: None, monthly_limit_nanos: Some(20 * USD) })
        .await?;
    let cleared = harness.service.get_limits(TenantRef { tenant_id: tenant.clone() }).await?;
    assert_eq!((cleared.daily_limit_nanos, cleared.monthly_limit_nanos), (None, Some(20 * USD)));
    let status = harness
        .service
        .get_status(GetStatusRequest { tenant_id: tenant.clone(), plan: "standard".to_string(), ..Default::default() })
        .await?;
    assert_eq!(status.daily.and_then(|daily| daily.limit_nanos), Some(5 * USD), "the plan's cap remains");

    let negative =
        harness.service.set_limits(SetLimitsRequest { tenant_id: tenant, daily_limit_nanos: Some(-1), monthly_limit_nanos: None }).await;
    assert_eq!(negative.err().map(|error| error.reason), Some("invalid_budget_limit".to_string()));
    let missing = harness.service.get_limits(TenantRef { tenant_id: " ".to_string() }).await;
    assert_eq!(missing.err().map(|error| error.kind), Some(ErrorKind::InvalidArgument));
    Ok(())
}

async fn agent_limits_are_replaced_merged_and_versioned(database: Database) -> TestResult {
    let harness = Harness::new(database);
    let tenant = new_tenant();
    let empty = harness.service.get_agent_limits(TenantRef { tenant_id: tenant.clone() }).await?;
    assert_eq!((empty.version, empty.limits.len(), empty.updated_at), (0, 0, None));
    let limit = |budget: Option<i64>, rpm: Option<u32>| AgentLimit { max_budget_nanos: budget, max_requests_per_minute: rpm };
    let write = |merge: bool, set: Vec<(&str, AgentLimit)>, removed: Vec<&str>| WriteAgentLimitsRequest {
        tenant_id: tenant.clone(),
        merge,
        set: set.into_iter().map(|(agent, limit)| (agent.to_string(), limit)).collect(),
        removed: removed.into_iter().map(str::to_string).collect(),
    };
    let first = harness
        .service
        .write_agent_limits(write(false, vec![("planner", limit(Some(USD), Some(60))), ("writer", limit(None, Some(5)))], vec![]))
        .await?;
    assert_eq!((first.version, first.limits.len()), (1, 2));
    let merged = harness.service.write_agent_limits(write(true, vec![("critic", limit(Some(2 * USD), None))], vec!["writer"])).await?;
    assert_eq!(merged.version, 2);
    assert_eq!(merged.limits.keys().map(String::as_str).collect::<Vec<_>>(), vec!["critic", "planner"]);
    assert_eq!(merged.limits.get("planner"), Some(&limit(Some(USD), Some(60))));
    let read = harness.service.get_agent_limits(TenantRef { tenant_id: tenant.clone() }).await?;
    assert_eq!(read, merged);
    // A replace drops what it does not name.
    let replaced = harness.service.write_agent_limits(write(false, vec![("solo", limit(None, Some(1)))], vec![])).await?;
    assert_eq!((replaced.version, replaced.limits.keys().cloned().collect::<Vec<_>>()), (3, vec!["solo".to_string()]));
    for (request, reason) in [
        (write(true, vec![("empty", limit(None, None))], vec![]), "invalid_agent_limit"),
        (write(true, vec![("fast", limit(None, Some(0)))], vec![]), "invalid_agent_limit"),
        (write(true, vec![("poor", limit(Some(-1), None))], vec![]), "invalid_budget_limit"),
        (write(true, vec![("bad/agent", limit(None, Some(1)))], vec![]), "invalid_agent_id"),
    ] {
        let refused = harness.service.write_agent_limits(request).await;
        assert_eq!(refused.err().map(|error| error.reason), Some(reason.to_string()));
    }
    assert_eq!(harness.service.get_agent_limits(TenantRef { tenant_id: tenant.clone() }).await?.version, 3, "refusals write nothing");
    // Concurrent merges: each lands (compare-and-set retries), none is lost.
    let merges = (0..8).map(|index| {
        let service = harness.service.clone();
        let request = WriteAgentLimitsRequest {
            tenant_id: tenant.clone(),
            merge: true,
            set: [(format!("agent-{index}"), limit(None, Some(10)))].into_iter().collect(),
            removed: Vec::new(),
        };
        async move { service.write_agent_limits(request).await }
    });
    for result in futures::future::join_all(merges).await {
        result?;
    }
    let after = harness.service.get_agent_limits(TenantRef { tenant_id: tenant.clone() }).await?;
    assert_eq!((after.version, after.limits.len()), (11, 9));
    Ok(())
}

async fn agent_budgets_and_the_agents_view(database: Database) -> TestResult {
    let harness = Harness::new(database);
    let tenant = new_tenant();
    let missing = harness.service.get_agent_budget(AgentRef { tenant_id: tenant.clone(), agent_id: "planner".to_string() }).await;
    assert_eq!(missing.err().map(|error| error.reason), Some("agent_budget_not_found".to_string()));
    let put = |agent_id: &str, per_day_nanos: i64, action: &str| PutAgentBudgetRequest {
        tenant_id: tenant.clone(),
        agent_id: agent_id.to_string(),
        per_day_nanos,
        exhaustion_action: action.to_string(),
    };
    let created = harness.service.put_agent_budget(put("planner", USD, "downgrade")).await?;
    harness.advance(ChronoDuration::seconds(1));
    let replaced = harness.service.put_agent_budget(put("planner", 2 * USD, "stop")).await?;
    assert_eq!((replaced.per_day_nanos, replaced.exhaustion_action.as_str()), (2 * USD, "stop"));
    assert_eq!(replaced.created_at, created.created_at);
    assert!(replaced.updated_at > created.updated_at);
    let fetched = harness.service.get_agent_budget(AgentRef { tenant_id: tenant.clone(), agent_id: "planner".to_string() }).await?;
    assert_eq!(fetched, replaced);
    for (request, reason) in [
        (put("planner", USD, "explode"), "invalid_exhaustion_action"),
        (put("bad/agent", USD, "stop"), "invalid_agent_id"),
        (put("planner", -5, "stop"), "invalid_budget_limit"),
    ] {
        let refused = harness.service.put_agent_budget(request).await;
        assert_eq!(refused.err().map(|error| error.reason), Some(reason.to_string()));
    }

    let now = harness.now();
    let agent_settlement = |agent: &str, cost: i64, outcome: &str, conversation: &str, at: DateTime<Utc>| Settlement {
        agent_id: Some(agent.to_string()),
        outcome: outcome.to_string(),
        conversation_id: Some(conversation.to_string()),
        latency_ms: 200,
        ..settlement(&tenant, cost, at)
    };
    harness.settle(agent_settlement("planner", 40 * CENT, "succeeded", "c1", now)).await?;
    harness.settle(agent_settlement("planner", 40 * CENT, "failed", "c2", now)).await?;
    harness.settle(agent_settlement("planner", 20 * CENT, "succeeded", "c1", now - ChronoDuration::days(2))).await?;
    harness.settle(agent_settlement("writer", 10 * CENT, "succeeded", "c9", now)).await?;
    for (event_id, action) in [("e1", "downgrade"), ("e2", "downgrade"), ("e3", "stop")] {
        let exhausted = AgentBudgetExhausted {
            event_id: event_id.to_string(),
            tenant_id: tenant.clone(),
            agent_id: "planner".to_string(),
            action: action.to_string(),
            request_id: None,
            occurred_at: format_timestamp(now),
        };
        let recorded =
            harness.service.record(&BudgetEvent { kind: Some(budget_event::Kind::AgentBudgetExhausted(exhausted.clone())) }).await?;
        assert!(recorded);
        assert!(!harness.service.record(&BudgetEvent { kind: Some(budget_event::Kind::AgentBudgetExhausted(exhausted)) }).await?);
    }

    let view = harness.service.list_agents(ListAgentsRequest { tenant_id: tenant.clone() }).await?;
    let ids: Vec<&str> = view.agents.iter().map(|agent| agent.agent_id.as_str()).collect();
    assert_eq!(ids, vec!["planner", "writer"]);
    let planner = &view.agents[0];
    assert_eq!(planner.config.as_ref().map(|config| config.per_day_nanos), Some(2 * USD));
    let status = planner.status.ok_or("no status")?;
    assert_eq!(
        (status.total_spend_nanos, status.spent_today_nanos, status.active_conversations, status.downgrade_count, status.stop_count),
        (100 * CENT, 80 * CENT, 2, 2, 1)
    );
    assert_eq!(view.agents[1].config, None);
    let leaders: Vec<(&str, u64, f64)> =
        view.leaderboard.iter().map(|entry| (entry.agent_id.as_str(), entry.total_requests, entry.efficiency_score)).collect();
    // writer: 1 success for USD 0.10 (10 a dollar); planner: 2 successes for USD 1 (2 a dollar).
    assert_eq!(leaders, vec![("writer", 1, 10.0), ("planner", 3, 2.0)]);
    let planner_entry = &view.leaderboard[1];
    assert_eq!(planner_entry.avg_cost_per_request_nanos, 100 * CENT / 3);
    assert!((planner_entry.success_rate - 0.6667).abs() < 1e-9);
    assert!((planner_entry.avg_latency_ms - 200.0).abs() < 1e-9);
    Ok(())
}

async fn the_forecast_reads_thirty_days_of_the_ledger(database: Database) -> TestResult {
    let harness = Harness::new(database);
    let tenant = new_tenant();
    let now = harness.now();
    // One dollar a day for the 10 days before today, nothing today (the clock is at 23:59).
    for days_ago in 1..=10 {
        harness.settle(settlement(&tenant, USD, now - ChronoDuration::days(days_ago))).await?;
    }
    // Outside the 30-day window: ignored by the forecast.
    harness.settle(settlement(&tenant, 50 * USD, now - ChronoDuration::days(40))).await?;
    harness
        .service
        .set_limits(SetLimitsRequest { tenant_id: tenant.clone(), daily_limit_nanos: None, monthly_limit_nanos: Some(30 * USD) })
        .await?;

    let forecast = harness.service.get_forecast(GetForecastRequest { tenant_id: tenant.clone(), plan: "standard".to_string() }).await?;
    assert_eq!(forecast.days_of_data, 11);
    assert_eq!(forecast.daily_spent.first().map(|day| day.date.as_str()), Some("2026-11-10"));
    assert_eq!(forecast.daily_spent.last().map(|day| (day.date.as_str(), day.spent_nanos)), Some(("2026-11-20", 0)));
    let summary = forecast.forecast.ok_or("no forecast")?;
    assert_eq!(summary.avg_daily_spend_nanos, USD);
    // Month to date: USD 10 (Nov 10 to 19); 10 days and 1 minute left at a dollar a day.
    let expected = 10 * USD + USD * (10 * 86_400 + 60) / 86_400;
    assert_eq!(summary.projected_period_spend_nanos, expected);
    assert_eq!((summary.trend.as_str(), summary.period.as_str(), summary.period_key.as_str()), ("stable", "monthly", "2026-11"));
    assert_eq!(summary.depletion_date, None, "USD 20 left lasts beyond November");
    assert!(summary.confidence > 0.5 && summary.confidence <= 1.0);
    assert!(forecast.anomalies.is_empty());
    let limits = forecast.limits.ok_or("no limits")?;
    assert_eq!((limits.daily_nanos, limits.monthly_nanos), (Some(5 * USD), Some(30 * USD)));

    harness
        .service
        .set_limits(SetLimitsRequest { tenant_id: tenant.clone(), daily_limit_nanos: None, monthly_limit_nanos: Some(15 * USD) })
        .await?;
    let tight = harness.service.get_forecast(GetForecastRequest { tenant_id: tenant, plan: "standard".to_string() }).await?;
    let summary = tight.forecast.ok_or("no forecast")?;
    // USD 5 left at a dollar a day from 23:59 on the 20th: the 25th.
    assert_eq!((summary.depletion_date.as_deref(), summary.days_remaining), (Some("2026-11-25"), Some(5)));
    Ok(())
}

async fn alerts_fire_once_per_crossing_and_reset_next_period(database: Database) -> TestResult {
    let harness = Harness::new(database);
    let tenant = new_tenant();
    let now = harness.now();
    // Standard: USD 5 a day. 82% spent at 23:59 projects to just over 82%.
    harness.settle(settlement(&tenant, 410 * CENT, now)).await?;
    let fired = harness.service.evaluate_alerts(&tenant, "standard").await?;
    assert_eq!(fired.iter().map(|alert| (alert.scope.as_str(), alert.threshold)).collect::<Vec<_>>(), vec![("daily", 80)]);
    let alert = &fired[0];
    assert_eq!((alert.period_key.as_str(), alert.limit_nanos, alert.delivery_status.as_str()), ("2026-11-20", 5 * USD, "not_sent"));
    assert!(alert.projected_nanos >= 410 * CENT && alert.ratio_percent >= 82.0 && alert.ratio_percent < 83.0, "{alert:?}");
    assert!(harness.service.evaluate_alerts(&tenant, "standard").await?.is_empty(), "a crossing fires once");

    harness.settle(settlement(&tenant, 70 * CENT, now)).await?;
    let fired = harness.service.evaluate_alerts(&tenant, "standard").await?;
    assert_eq!(fired.iter().map(|alert| alert.threshold).collect::<Vec<_>>(), vec![90, 95]);
    assert!(harness.service.evaluate_alerts(&tenant, "standard").await?.is_empty());

    // The next day is a new period: the same thresholds fire again once crossed.
    harness.advance(ChronoDuration::days(1));
    assert!(harness.service.evaluate_alerts(&tenant, "standard").await?.is_empty(), "nothing spent yet today");
    harness.settle(settlement(&tenant, 420 * CENT, harness.now())).await?;
    let fired = harness.service.evaluate_alerts(&tenant, "standard").await?;
    assert_eq!(fired.iter().map(|alert| (alert.threshold, alert.period_key.as_str())).collect::<Vec<_>>(), vec![(80, "2026-11-21")]);

    // A monthly limit brings its own scope.
    harness
        .service
        .set_limits(SetLimitsRequest { tenant_id: tenant.clone(), daily_limit_nanos: None, monthly_limit_nanos: Some(10 * USD) })
        .await?;
    let fired = harness.service.evaluate_alerts(&tenant, "standard").await?;
    assert!(fired.iter().all(|alert| alert.scope == "monthly" && alert.period_key == "2026-11"), "{fired:?}");
    assert_eq!(fired.iter().map(|alert| alert.threshold).collect::<Vec<_>>(), vec![80, 90, 95]);

    let history = harness.service.list_alerts(ListAlertsRequest { tenant_id: tenant.clone(), limit: 0 }).await?;
    assert_eq!(history.alerts.len(), 7);
    assert!(history.alerts.windows(2).all(|pair| pair[0].timestamp >= pair[1].timestamp), "newest first");
    let limited = harness.service.list_alerts(ListAlertsRequest { tenant_id: tenant, limit: 2 }).await?;
    assert_eq!(limited.alerts.len(), 2);
    Ok(())
}

/// A webhook receiver answering 500 to its first `failures` posts, then 200.
async fn webhook_receiver(failures: usize) -> Result<(String, Arc<Mutex<Vec<Value>>>), std::io::Error> {
    let received = Arc::new(Mutex::new(Vec::new()));
    let recorder = received.clone();
    let app = Router::new().route(
        "/hook",
        post(move |Json(body): Json<Value>| {
            let recorder = recorder.clone();
            async move {
                let mut received = recorder.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                received.push(body);
                if received.len() <= failures { StatusCode::INTERNAL_SERVER_ERROR } else { StatusCode::OK }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((format!("http://{address}/hook"), received))
}

async fn webhooks_are_retried_and_failures_recorded(database: Database) -> TestResult {
    let harness = Harness::new(database);
    let (url, received) = webhook_receiver(2).await?;
    let tenant = new_tenant();
    harness
        .service
        .put_alert_config(PutAlertConfigRequest { tenant_id: tenant.clone(), thresholds: vec![50], webhook_url: Some(url), enabled: true })
        .await?;
    harness.settle(settlement(&tenant, 3 * USD, harness.now())).await?;
    let fired = harness.service.evaluate_alerts(&tenant, "standard").await?;
    assert_eq!(fired.len(), 1);
    assert_eq!((fired[0].delivery_status.as_str(), fired[0].delivery_attempts, fired[0].delivery_error.as_deref()), ("delivered", 3, None));
    let posts = received.lock().map(|posts| posts.clone()).unwrap_or_default();
    assert_eq!(posts.len(), 3, "two failures, then delivered");
    assert_eq!(posts[2]["type"], "budget.alert");
    assert_eq!(posts[2]["alert"]["tenantId"], tenant.as_str());
    assert_eq!(posts[2]["alert"]["threshold"], 50);
    assert_eq!(posts[2]["alert"]["limitUsd"], serde_json::json!(5));

    // A receiver that always fails: every attempt is made, the failure is recorded, nothing blocks.
    let (failing_url, failing_posts) = webhook_receiver(usize::MAX).await?;
    let other = new_tenant();
    harness
        .service
        .put_alert_config(PutAlertConfigRequest {
            tenant_id: other.clone(),
            thresholds: vec![10],
            webhook_url: Some(failing_url),
            enabled: true,
        })
        .await?;
    harness.settle(settlement(&other, USD, harness.now())).await?;
    let fired = harness.service.evaluate_alerts(&other, "standard").await?;
    assert_eq!((fired[0].delivery_status.as_str(), fired[0].delivery_attempts), ("failed", 4));
    assert!(fired[0].delivery_error.as_deref().is_some_and(|error| error.contains("500")), "{:?}", fired[0].delivery_error);
    assert_eq!(failing_posts.lock().map(|posts| posts.len()).unwrap_or_default(), 4);
    let history = harness.service.list_alerts(ListAlertsRequest { tenant_id: other, limit: 10 }).await?;
    assert_eq!(
        history.alerts.iter().map(|alert| (alert.delivery_status.as_str(), alert.delivery_attempts)).collect::<Vec<_>>(),
        vec![("failed", 4)]
    );
    assert!(history.alerts[0].delivery_error.is_some());

    // Disabled: recorded, not posted.
    let quiet = new_tenant();
    let (quiet_url, quiet_posts) = webhook_receiver(0).await?;
    harness
        .service
        .put_alert_config(PutAlertConfigRequest {
            tenant_id: quiet.clone(),
            thresholds: vec![10],
            webhook_url: Some(quiet_url),
            enabled: false,
        })
        .await?;
    harness.settle(settlement(&quiet, USD, harness.now())).await?;
    let fired = harness.service.evaluate_alerts(&quiet, "standard").await?;
    assert_eq!(fired.iter().map(|alert| alert.delivery_status.as_str()).collect::<Vec<_>>(), vec!["not_sent"]);
    assert_eq!(quiet_posts.lock().map(|posts| posts.len()).unwrap_or_default(), 0);
    Ok(())
}

async fn alert_configuration_defaults_and_validation(database: Database) -> TestResult {
    let harness = Harness::new(database);
    let tenant = new_tenant();
    let defaults = harness.service.get_alert_config(TenantRef { tenant_id: tenant.clone() }).await?;
    assert_eq!((defaults.thresholds, defaults.webhook_url, defaults.enabled), (vec![80, 90, 95], None, false));
    let put = harness
        .service
        .put_alert_config(PutAlertConfigRequest {
            tenant_id: tenant.clone(),
            thresholds: vec![95, 50, 50],
            webhook_url: Some("https://hooks.example/budget".to_string()),
            enabled: true,
        })
        .await?;
    assert_eq!(put.thresholds, vec![50, 95]);
    let fetched = harness.service.get_alert_config(TenantRef { tenant_id: tenant.clone() }).await?;
    assert_eq!(
        (fetched.thresholds, fetched.webhook_url.as_deref(), fetched.enabled),
        (vec![50, 95], Some("https://hooks.example/budget"), true)
    );
    for (thresholds, url, reason) in [
        (vec![0], None, "invalid_thresholds"),
        (vec![1001], None, "invalid_thresholds"),
        (vec![80], Some("ftp://hooks.example"), "invalid_webhook_url"),
        (vec![80], Some("not a url"), "invalid_webhook_url"),
    ] {
        let refused = harness
            .service
            .put_alert_config(PutAlertConfigRequest {
                tenant_id: tenant.clone(),
                thresholds,
                webhook_url: url.map(str::to_string),
                enabled: true,
            })
            .await;
        assert_eq!(refused.err().map(|error| error.reason), Some(reason.to_string()));
    }
    Ok(())
}

async fn the_consumer_records_each_event_once_and_acks(database: Database) -> TestResult {
    let harness = Harness::new(database);
    let bus: Arc<dyn EventBus> = Arc::new(InProcessBus::new());
    let mut consumer = SettlementConsumer::subscribe(&bus, harness.service.clone()).await?;
    let tenant = new_tenant();
    let event = BudgetEvent { kind: Some(budget_event::Kind::Settlement(settlement(&tenant, 25 * CENT, harness.now()))) };
    bus.publish(SETTLEMENTS_TOPIC, &tenant, event.encode_to_vec().into()).await?;
    bus.publish(SETTLEMENTS_TOPIC, &tenant, event.encode_to_vec().into()).await?;
    bus.publish(SETTLEMENTS_TOPIC, &tenant, bytes::Bytes::from_static(b"\xff\xff not protobuf")).await?;
    let invalid = BudgetEvent { kind: None };
    bus.publish(SETTLEMENTS_TOPIC, &tenant, invalid.encode_to_vec().into()).await?;
    let mut outcomes = Vec::new();
    for _ in 0..4 {
        outcomes.push(tokio::time::timeout(Duration::from_secs(5), consumer.handle_next()).await??);
    }
    assert_eq!(outcomes, vec![Handled::Recorded, Handled::Duplicate, Handled::Rejected, Handled::Rejected]);
    // Everything was acked: nothing is delivered again.
    assert!(tokio::time::timeout(Duration::from_millis(100), consumer.handle_next()).await.is_err());
    let status = harness
        .service
        .get_status(GetStatusRequest { tenant_id: tenant.clone(), plan: "standard".to_string(), ..Default::default() })
        .await?;
    assert_eq!(status.daily.map(|daily| daily.spent_nanos), Some(25 * CENT));

    // End to end: a guard settles on the bus, the running consumer writes the ledger.
    let guard = BudgetGuard::in_process(bus.clone());
    let running = tokio::spawn(consumer.run(std::future::pending()));
    let context = BudgetContext::new(tenant.clone(), "standard");
    let estimate = brainstorm_budget_ledger::Estimate {
        request_id: "req_end_to_end".to_string(),
        cost: brainstorm_common::money::Usd::from_nanos(CENT),
        tokens: 10,
    };
    let reservation = guard.reserve(&context, &estimate).await.map_err(|denial| format!("{denial:?}"))?;
    reservation
        .settle(brainstorm_budget_ledger::ActualUsage {
            cost: brainstorm_common::money::Usd::from_nanos(CENT),
            input_tokens: 3,
            output_tokens: 4,
            model: "brainstorm/sandbox".to_string(),
            provider: "brainstorm".to_string(),
            outcome: brainstorm_budget_ledger::Outcome::ClientDisconnected,
            latency_ms: None,
        })
        .await?;
    let mut spent = 0;
    for _ in 0..200 {
        // The guard stamps settlements with the real clock, not the harness's: read across all time.
        let everything = UsageSummaryRequest {
            tenant_id: tenant.clone(),
            group_by: "day".to_string(),
            since: Some("2000-01-01T00:00:00Z".to_string()),
            until: Some("2100-01-01T00:00:00Z".to_string()),
        };
        spent = harness.service.get_usage_summary(everything).await?.total_cost_nanos;
        if spent == 26 * CENT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    running.abort();
    assert_eq!(spent, 26 * CENT, "the guard's settlement reached the ledger through the bus");
    Ok(())
}

async fn usage_is_summarised_by_every_grouping(database: Database) -> TestResult {
    let harness = Harness::new(database);
    let tenant = new_tenant();
    let now = harness.now();
    harness.settle(settlement(&tenant, 30 * CENT, now)).await?;
    harness
        .settle(Settlement {
            model: "anthropic/claude-haiku".to_string(),
            provider: "anthropic".to_string(),
            key_id: None,
            agent_id: Some("bot".to_string()),
            ..settlement(&tenant, 50 * CENT, now - ChronoDuration::days(1))
        })
        .await?;
    harness.settle(settlement(&tenant, 5 * CENT, now - ChronoDuration::days(1))).await?;
    let summary =
        |group_by: &str| UsageSummaryRequest { tenant_id: tenant.clone(), group_by: group_by.to_string(), since: None, until: None };

    let by_model = harness.service.get_usage_summary(summary("model")).await?;
    let groups: Vec<(&str, u64, i64)> =
        by_model.groups.iter().map(|group| (group.key.as_str(), group.requests, group.cost_nanos)).collect();
    assert_eq!(groups, vec![("anthropic/claude-haiku", 1, 50 * CENT), ("openai/gpt-4o-mini", 2, 35 * CENT)]);
    assert_eq!((by_model.total_requests, by_model.total_cost_nanos), (3, 85 * CENT));
    assert_eq!(by_model.groups[1].input_tokens, 20);
    let by_key = harness.service.get_usage_summary(summary("key")).await?;
    assert_eq!(by_key.groups.iter().map(|group| group.key.as_str()).collect::<Vec<_>>(), vec!["", "key-1"]);
    let by_agent = harness.service.get_usage_summary(summary("agent")).await?;
    assert_eq!(by_agent.groups.iter().map(|group| (group.key.as_str(), group.requests)).collect::<Vec<_>>(), vec![("bot", 1), ("", 2)]);
    let by_day = harness.service.get_usage_summary(summary("day")).await?;
    assert_eq!(
        by_day.groups.iter().map(|group| (group.key.as_str(), group.cost_nanos)).collect::<Vec<_>>(),
        vec![("2026-11-19", 55 * CENT), ("2026-11-20", 30 * CENT)]
    );
    let by_provider = harness.service.get_usage_summary(summary("provider")).await?;
    assert_eq!(by_provider.groups.len(), 2);
    let today_only = harness
        .service
        .get_usage_summary(UsageSummaryRequest { since: Some("2026-11-20T00:00:00Z".to_string()), ..summary("model") })
        .await?;
    assert_eq!(today_only.total_cost_nanos, 30 * CENT);
    let bad = harness.service.get_usage_summary(summary("colour")).await;
    assert_eq!(bad.err().map(|error| error.reason), Some("invalid_group_by".to_string()));
    let bad_time =
        harness.service.get_usage_summary(UsageSummaryRequest { since: Some("yesterday".to_string()), ..summary("model") }).await;
    assert_eq!(bad_time.err().map(|error| error.reason), Some("invalid_timestamp".to_string()));
    Ok(())
}

async fn settled_requests_are_paged_newest_first_and_filtered(database: Database) -> TestResult {
    let harness = Harness::new(database);
    let tenant = new_tenant();
    let now = harness.now();
    // Five settlements a minute apart, two of them at the same instant (the request id orders those),
    // one failed and one of an agent; and another tenant's, never shown.
    let mut written = Vec::new();
    for (minutes, outcome, agent) in
        [(5, "succeeded", None), (4, "failed", None), (3, "succeeded", Some("bot")), (3, "succeeded", None), (1, "succeeded", None)]
    {
        let row = Settlement {
            outcome: outcome.to_string(),
            agent_id: agent.map(str::to_string),
            ..settlement(&tenant, CENT, now - ChronoDuration::minutes(minutes))
        };
        written.push((row.occurred_at.clone(), row.request_id.clone()));
        harness.settle(row).await?;
    }
    harness.settle(settlement(&new_tenant(), CENT, now)).await?;
    written.sort();
    written.reverse();
    let expected: Vec<String> = written.into_iter().map(|(_, id)| id).collect();
    let query = |limit: u32, cursor: Option<String>| SettledRequestsQuery {
        tenant_id: tenant.clone(),
        limit,
        cursor,
        ..SettledRequestsQuery::default()
    };

    let everything = harness.service.list_settled_requests(query(0, None)).await?;
    assert_eq!(everything.requests.iter().map(|row| row.request_id.clone()).collect::<Vec<_>>(), expected);
    assert_eq!(everything.next_cursor, None, "a page short of the limit is the last");
    let first = &everything.requests[0];
    assert_eq!(
        (first.model.as_str(), first.key_id.as_deref(), first.input_tokens, first.cost_nanos, first.latency_ms),
        ("openai/gpt-4o-mini", Some("key-1"), 10, CENT, 100)
    );
    // Pages of two walk the same order without repeats or gaps, through the tie.
    let (mut walked, mut cursor) = (Vec::new(), None);
    loop {
        let page = harness.service.list_settled_requests(query(2, cursor.take())).await?;
        walked.extend(page.requests.iter().map(|row| row.request_id.clone()));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(walked, expected);
    // Filters.
    let failed = harness.service.list_settled_requests(SettledRequestsQuery { outcome: Some("failed".into()), ..query(0, None) }).await?;
    assert_eq!(failed.requests.len(), 1);
    let bot = harness.service.list_settled_requests(SettledRequestsQuery { agent_id: Some("bot".into()), ..query(0, None) }).await?;
    assert_eq!(bot.requests.iter().map(|row| row.agent_id.as_deref()).collect::<Vec<_>>(), vec![Some("bot")]);
    let window = SettledRequestsQuery { since: Some(format_timestamp(now - ChronoDuration::minutes(2))), ..query(0, None) };
    assert_eq!(harness.service.list_settled_requests(window).await?.requests.len(), 1);
    // Bad input.
    for (bad, reason) in [
        (SettledRequestsQuery { cursor: Some("not-a-cursor".into()), ..query(0, None) }, "invalid_cursor"),
        (SettledRequestsQuery { cursor: Some("2026-11-20T00:00:00Z,".into()), ..query(0, None) }, "invalid_cursor"),
        (SettledRequestsQuery { outcome: Some("won".into()), ..query(0, None) }, "invalid_outcome"),
        (SettledRequestsQuery { until: Some("tomorrow".into()), ..query(0, None) }, "invalid_timestamp"),
    ] {
        let refused = harness.service.list_settled_requests(bad).await;
        assert_eq!(refused.err().map(|error| error.reason), Some(reason.to_string()));
    }
    Ok(())
}

async fn current_totals_seed_a_restarted_gateway(database: Database) -> TestResult {
    let harness = Harness::new(database);
    let tenant = new_tenant();
    let now = harness.now();
    let agent_settlement = Settlement { agent_id: Some("bot".to_string()), ..settlement(&tenant, 40 * CENT, now) };
    harness.settle(agent_settlement).await?;
    harness.settle(settlement(&tenant, 10 * CENT, now - ChronoDuration::days(2))).await?;
    // Last month's spend is in no current total.
    harness.settle(settlement(&tenant, 7 * CENT, now - ChronoDuration::days(31))).await?;
    let totals = harness.service.get_current_totals(CurrentTotalsRequest::default()).await?;
    let find = |kind: &str, owner: &str| {
        totals.totals.iter().find(|total| total.kind == kind && total.owner == owner).map(|total| (total.period_key.clone(), total.value))
    };
    assert_eq!(find("tenant_daily", &tenant), Some(("2026-11-20".to_string(), 40 * CENT)));
    assert_eq!(find("tenant_monthly", &tenant), Some(("2026-11".to_string(), 50 * CENT)));
    assert_eq!(find("plan_requests_daily", &tenant), Some(("2026-11-20".to_string(), 1)));
    assert_eq!(find("plan_tokens_daily", &tenant), Some(("2026-11-20".to_string(), 30)));
    assert_eq!(find("key_daily", "key-1"), Some(("2026-11-20".to_string(), 40 * CENT)));
    assert_eq!(find("key_monthly", "key-1"), Some(("2026-11".to_string(), 50 * CENT)));
    assert_eq!(find("agent_daily", &Scope::agent_owner(&tenant, "bot")), Some(("2026-11-20".to_string(), 40 * CENT)));

    // A fresh in-process guard seeded from the totals counts what the ledger holds.
    let guard = BudgetGuard::in_process(Arc::new(InProcessBus::new()));
    let seeded = guard.seed_from_totals(&totals).await?;
    assert_eq!(seeded, totals.totals.len());
    let scope = Scope { kind: ScopeKind::TenantMonthly, owner: tenant.into(), period_key: "2026-11".into() };
    assert_eq!(guard.counters().spent(&scope).await?, 50 * CENT);
    Ok(())
}
