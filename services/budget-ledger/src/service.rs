//! The budget-ledger service: the `BudgetLedgerService` contract over the ledger's store, recording of
//! budget events, and alert evaluation (off the request path).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use brainstorm_common::collections::HashMap;
use brainstorm_common::money::Usd;
use brainstorm_common::store::Database;
use brainstorm_common::time::{format_timestamp, normalise_timestamp};
use brainstorm_proto::budget::*;
use brainstorm_proto::{ServiceError, ServiceResult};
use chrono::{DateTime, Duration, NaiveDate, Utc};

use crate::alerts::{DEFAULT_THRESHOLDS, DELIVERY_NOT_SENT, DELIVERY_PENDING, PeriodProjection, WebhookOptions, deliver, webhook_payload};
use crate::forecast::{ForecastInput, HISTORY_DAYS, forecast};
use crate::guard::{ExhaustionAction, Outcome};
use crate::period::Period;
use crate::plans::Plan;
use crate::store::{BudgetStore, SettlementFilters, UsageGrouping};

/// Settled requests per page by default, and at most.
const DEFAULT_SETTLED_PAGE: u32 = 100;
const MAX_SETTLED_PAGE: u32 = 1_000;

/// A settled-requests cursor (`<occurred_at>,<request_id>`) as the instant and id it names.
fn parse_cursor(cursor: &str) -> Option<(String, String)> {
    let (occurred_at, request_id) = cursor.split_once(',')?;
    let occurred_at = normalise_timestamp(occurred_at).filter(|normalised| normalised == occurred_at)?;
    (!request_id.is_empty()).then(|| (occurred_at, request_id.to_string()))
}

/// The largest limit accepted: USD 1 billion (well inside i64 nano-dollars).
const MAX_LIMIT_NANOS: i64 = 1_000_000_000 * 1_000_000_000;
const DEFAULT_ALERT_LIST: u32 = 50;
const MAX_ALERT_LIST: u32 = 500;
const MAX_THRESHOLDS: usize = 10;
const MAX_THRESHOLD_PERCENT: u32 = 1000;
const MAX_AGENT_ID_CHARS: usize = 128;
/// Agents one tenant may give limits to (`/v1/agent-limits`), and the highest per-agent rate.
const MAX_AGENT_LIMITS: usize = 10_000;
const MAX_AGENT_RPM: u32 = 1_000_000;
/// Compare-and-set rounds a limits write makes before answering 409.
const AGENT_LIMIT_WRITE_ATTEMPTS: usize = 16;

/// The service's notion of now; tests move it.
pub type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// What the service needs besides its store.
#[derive(Clone)]
pub struct BudgetLedgerOptions {
    pub webhook: WebhookOptions,
    pub clock: Clock,
    /// A tenant's alerts are evaluated at most once per interval while settlements keep arriving
    /// (an evaluation reads the period's spend, so evaluating per request would scale with traffic).
    pub alert_interval: std::time::Duration,
}

impl Default for BudgetLedgerOptions {
    fn default() -> Self {
        BudgetLedgerOptions {
            webhook: WebhookOptions::default(),
            clock: Arc::new(Utc::now),
            alert_interval: std::time::Duration::from_secs(1),
        }
    }
}

/// The budget-ledger service.
#[derive(Clone)]
pub struct BudgetLedgerServiceImpl {
    store: BudgetStore,
    options: Arc<BudgetLedgerOptions>,
    http: reqwest::Client,
    /// Tenants with an alert evaluation running, and the plan to evaluate again with when more
    /// settlements arrived meanwhile: evaluations coalesce per tenant instead of piling up.
    evaluations: Arc<Mutex<HashMap<String, Option<String>>>>,
}

impl BudgetLedgerServiceImpl {
    /// A usage read's `[since, until)` in the stored form: the last 30 days up to now by default;
    /// 400 `invalid_timestamp` for a bound that is not an RFC 3339 instant.
    fn usage_window(&self, since: Option<&str>, until: Option<&str>) -> ServiceResult<(String, String)> {
        let now = self.now();
        let instant = |field: &str, value: Option<&str>, default: DateTime<Utc>| -> ServiceResult<String> {
            match value {
                None => Ok(format_timestamp(default)),
                Some(text) => normalise_timestamp(text)
                    .ok_or_else(|| ServiceError::invalid("invalid_timestamp", format!("{field} is not an RFC 3339 instant"))),
            }
        };
        Ok((instant("since", since, now - Duration::days(HISTORY_DAYS))?, instant("until", until, now + Duration::milliseconds(1))?))
    }

    /// The service over a migrated database.
    pub fn new(database: Database, options: BudgetLedgerOptions) -> Self {
        BudgetLedgerServiceImpl {
            store: BudgetStore::new(database),
            options: Arc::new(options),
            http: reqwest::Client::new(),
            evaluations: Arc::new(Mutex::new(HashMap::default())),
        }
    }

    fn now(&self) -> DateTime<Utc> {
        (self.options.clock)()
    }

    fn evaluations(&self) -> MutexGuard<'_, HashMap<String, Option<String>>> {
        self.evaluations.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Writes a budget event to the ledger once; false when it was already recorded (a redelivery).
    pub async fn record(&self, event: &BudgetEvent) -> ServiceResult<bool> {
        let recorded_at = format_timestamp(self.now());
        match &event.kind {
            Some(budget_event::Kind::Settlement(settlement)) => {
                validate_settlement(settlement)?;
                self.store.insert_settlement(settlement, &recorded_at).await.map_err(store_failure)
            }
            Some(budget_event::Kind::AgentBudgetExhausted(exhausted)) => {
                if exhausted.event_id.is_empty() || exhausted.tenant_id.is_empty() || exhausted.agent_id.is_empty() {
                    return Err(ServiceError::invalid("invalid_event", "an agent exhaustion needs event_id, tenant_id and agent_id"));
                }
                self.store.insert_agent_exhaustion(exhausted).await.map_err(store_failure)
            }
            None => Err(ServiceError::invalid("invalid_event", "the budget event carries nothing")),
        }
    }

    /// Records several settlements in one transaction; true for each one new. Every settlement must
    /// be valid (the consumer checks them one by one first).
    pub async fn record_settlements(&self, settlements: &[&Settlement]) -> ServiceResult<Vec<bool>> {
        for settlement in settlements {
            validate_settlement(settlement)?;
        }
        let recorded_at = format_timestamp(self.now());
        self.store.insert_settlements(settlements, &recorded_at).await.map_err(store_failure)
    }

    /// Schedules the alert evaluation of each tenant with a new settlement among `written`
    /// (settlement, whether it was new), once per tenant.
    pub fn schedule_alerts_after<'a>(&self, written: impl IntoIterator<Item = (&'a Settlement, bool)>) {
        let mut tenants: Vec<(&str, &str)> = Vec::new();
        for (settlement, new) in written {
            if new && !tenants.iter().any(|(tenant_id, _)| *tenant_id == settlement.tenant_id) {
                tenants.push((&settlement.tenant_id, &settlement.plan));
            }
        }
        for (tenant_id, plan) in tenants {
            self.schedule_alert_evaluation(tenant_id, plan);
        }
    }

    /// Evaluates the tenant's alerts in the background, coalescing with an evaluation already running
    /// for the tenant. Never blocks the caller.
    pub fn schedule_alert_evaluation(&self, tenant_id: &str, plan: &str) {
        {
            let mut evaluations = self.evaluations();
            if let Some(rerun) = evaluations.get_mut(tenant_id) {
                *rerun = Some(plan.to_string());
                return;
            }
            evaluations.insert(tenant_id.to_string(), None);
        }
        let service = self.clone();
        let tenant_id = tenant_id.to_string();
        let mut plan = plan.to_string();
        tokio::spawn(async move {
            loop {
                let started = tokio::time::Instant::now();
                if let Err(error) = service.evaluate_alerts(&tenant_id, &plan).await {
                    tracing::warn!(%error, tenant_id, "budget alert evaluation failed");
                }
                // Settlements arriving until the interval ends coalesce into one evaluation then:
                // the tenant's entry stays while this task waits, so they do not start another.
                tokio::time::sleep_until(started + service.options.alert_interval).await;
                let rerun = {
                    let mut evaluations = service.evaluations();
                    let rerun = evaluations.get_mut(&tenant_id).and_then(Option::take);
                    if rerun.is_none() {
                        evaluations.remove(&tenant_id);
                    }
                    rerun
                };
                let Some(next_plan) = rerun else { break };
                plan = next_plan;
            }
        });
    }

    /// Fires the alerts whose thresholds the tenant's projections now cross (once per threshold and
    /// period), records them, and posts them to the webhook when enabled. Returns the alerts fired.
    pub async fn evaluate_alerts(&self, tenant_id: &str, plan: &str) -> ServiceResult<Vec<AlertRecord>> {
        let now = self.now();
        let config = self.alert_config_or_default(tenant_id).await?;
        if config.thresholds.is_empty() {
            return Ok(Vec::new());
        }
        // Without a daily or monthly limit nothing can cross a threshold: skip reading the history.
        let limits = self.limits_or_empty(tenant_id).await?;
        let daily_limit = Plan::resolve(plan).effective_daily_limit(limits.daily_limit_nanos.map(Usd::from_nanos));
        if daily_limit.is_none() && limits.monthly_limit_nanos.is_none() {
            return Ok(Vec::new());
        }
        let (input, _) = self.forecast_input(tenant_id, plan, now).await?;
        let result = forecast(&input);
        let mut projections = Vec::with_capacity(2);
        if let Some(limit) = input.daily_limit_nanos {
            projections.push(PeriodProjection {
                scope: "daily",
                period_key: Period::Daily.key_at(now),
                projected_nanos: result.projected_day_nanos,
                limit_nanos: limit,
            });
        }
        if let Some(limit) = input.monthly_limit_nanos {
            projections.push(PeriodProjection {
                scope: "monthly",
                period_key: Period::Monthly.key_at(now),
                projected_nanos: result.projected_month_nanos,
                limit_nanos: limit,
            });
        }
        let webhook_url = config.webhook_url.clone().filter(|_| config.enabled);
        let mut fired = Vec::new();
        for projection in &projections {
            let basis_points = projection.ratio_basis_points();
            for threshold in projection.crossed(&config.thresholds) {
                let alert = AlertRecord {
                    id: uuid::Uuid::now_v7().to_string(),
                    tenant_id: tenant_id.to_string(),
                    scope: projection.scope.to_string(),
                    period_key: projection.period_key.clone(),
                    threshold,
                    ratio_percent: basis_points as f64 / 100.0,
                    projected_nanos: projection.projected_nanos,
                    limit_nanos: projection.limit_nanos,
                    timestamp: format_timestamp(now),
                    delivery_status: if webhook_url.is_some() { DELIVERY_PENDING } else { DELIVERY_NOT_SENT }.to_string(),
                    delivery_attempts: 0,
                    delivery_error: None,
                };
                if self.store.record_crossing(&alert, basis_points).await.map_err(store_failure)? {
                    tracing::info!(tenant_id, scope = projection.scope, threshold, "budget alert fired");
                    fired.push(alert);
                }
            }
        }
        if let Some(url) = webhook_url {
            for alert in &mut fired {
                let outcome = deliver(&self.http, &url, &webhook_payload(alert), &self.options.webhook).await;
                self.store
                    .update_alert_delivery(&alert.id, outcome.status, outcome.attempts, outcome.error.as_deref())
                    .await
                    .map_err(store_failure)?;
                alert.delivery_status = outcome.status.to_string();
                alert.delivery_attempts = outcome.attempts;
                alert.delivery_error = outcome.error;
            }
        }
        Ok(fired)
    }

    async fn alert_config_or_default(&self, tenant_id: &str) -> ServiceResult<AlertConfig> {
        let stored = self.store.alert_config(tenant_id).await.map_err(store_failure)?;
        Ok(stored.unwrap_or_else(|| AlertConfig {
            tenant_id: tenant_id.to_string(),
            thresholds: DEFAULT_THRESHOLDS.to_vec(),
            webhook_url: None,
            enabled: false,
            updated_at: None,
        }))
    }

    async fn limits_or_empty(&self, tenant_id: &str) -> ServiceResult<TenantLimits> {
        let stored = self.store.tenant_limits(tenant_id).await.map_err(store_failure)?;
        Ok(stored.unwrap_or_else(|| TenantLimits { tenant_id: tenant_id.to_string(), ..TenantLimits::default() }))
    }

    /// The forecast's input and the tenant's own limits.
    async fn forecast_input(&self, tenant_id: &str, plan: &str, now: DateTime<Utc>) -> ServiceResult<(ForecastInput, TenantLimits)> {
        let limits = self.limits_or_empty(tenant_id).await?;
        let today = now.date_naive();
        let first_day = today - Duration::days(HISTORY_DAYS - 1);
        let rows = self
            .store
            .daily_spend(tenant_id, &crate::period::day_key(first_day), &crate::period::day_key(today))
            .await
            .map_err(store_failure)?;
        let daily = rows
            .into_iter()
            .filter_map(|(day, spent)| NaiveDate::parse_from_str(&day, "%Y-%m-%d").ok().map(|date| (date, spent)))
            .collect();
        let month_to_date =
            self.store.tenant_spend(tenant_id, Period::Monthly, &Period::Monthly.key_at(now)).await.map_err(store_failure)?;
        let daily_limit = Plan::resolve(plan).effective_daily_limit(limits.daily_limit_nanos.map(Usd::from_nanos)).map(Usd::nanos);
        let input = ForecastInput {
            now,
            daily,
            month_to_date_nanos: month_to_date,
            daily_limit_nanos: daily_limit,
            monthly_limit_nanos: limits.monthly_limit_nanos,
        };
        Ok((input, limits))
    }
}

#[async_trait]
impl BudgetLedgerService for BudgetLedgerServiceImpl {
    async fn get_status(&self, request: GetStatusRequest) -> ServiceResult<BudgetStatus> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let now = self.now();
        let plan = Plan::resolve(&request.plan);
        let limits = self.limits_or_empty(tenant_id).await?;
        let day_key = Period::Daily.key_at(now);
        let month_key = Period::Monthly.key_at(now);
        let spent_today = self.store.tenant_spend(tenant_id, Period::Daily, &day_key).await.map_err(store_failure)?;
        let spent_month = self.store.tenant_spend(tenant_id, Period::Monthly, &month_key).await.map_err(store_failure)?;
        let daily_limit = plan.effective_daily_limit(limits.daily_limit_nanos.map(Usd::from_nanos)).map(Usd::nanos);
        let key_budget = match (&request.key_id, &request.key_budget) {
            (Some(key_id), Some(budget)) => {
                let period = Period::parse(&budget.period).ok_or_else(|| {
                    ServiceError::invalid("invalid_budget_period", format!("budget period `{}` is not daily or monthly", budget.period))
                })?;
                let spent = self.store.key_spend(tenant_id, key_id, period, now).await.map_err(store_failure)?;
                Some(KeyBudgetStatus {
                    limit_nanos: budget.limit_nanos,
                    period: period.as_str().to_string(),
                    spent_nanos: spent,
                    remaining_nanos: remaining(budget.limit_nanos, spent),
                    period_key: period.key_at(now),
                })
            }
            _ => None,
        };
        Ok(BudgetStatus {
            tenant_id: tenant_id.to_string(),
            key_id: request.key_id.clone(),
            daily: Some(period_status(spent_today, daily_limit, day_key)),
            monthly: Some(period_status(spent_month, limits.monthly_limit_nanos, month_key)),
            key_budget,
            plan: plan.name.to_string(),
            tier: plan.tier.to_string(),
        })
    }

    async fn get_limits(&self, request: TenantRef) -> ServiceResult<TenantLimits> {
        self.limits_or_empty(required("tenant_id", &request.tenant_id)?).await
    }

    async fn set_limits(&self, request: SetLimitsRequest) -> ServiceResult<TenantLimits> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        for (field, value) in [("daily_limit_usd", request.daily_limit_nanos), ("monthly_limit_usd", request.monthly_limit_nanos)] {
            validate_limit(field, value)?;
        }
        let now = format_timestamp(self.now());
        let limits = TenantLimits {
            tenant_id: tenant_id.to_string(),
            daily_limit_nanos: request.daily_limit_nanos,
            monthly_limit_nanos: request.monthly_limit_nanos,
            updated_at: Some(now.clone()),
        };
        self.store.set_tenant_limits(&limits, &now).await.map_err(store_failure)?;
        Ok(limits)
    }

    async fn get_agent_budget(&self, request: AgentRef) -> ServiceResult<AgentBudget> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        self.store
            .agent_budget(tenant_id, &request.agent_id)
            .await
            .map_err(store_failure)?
            .ok_or_else(|| ServiceError::not_found("agent_budget_not_found", format!("agent `{}` has no budget", request.agent_id)))
    }

    async fn put_agent_budget(&self, request: PutAgentBudgetRequest) -> ServiceResult<AgentBudget> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        validate_agent_id(&request.agent_id)?;
        validate_limit("perDayUsd", Some(request.per_day_nanos))?;
        let action = ExhaustionAction::parse(&request.exhaustion_action)
            .ok_or_else(|| ServiceError::invalid("invalid_exhaustion_action", "exhaustionAction must be `stop` or `downgrade`"))?;
        let now = format_timestamp(self.now());
        let existing = self.store.agent_budget(tenant_id, &request.agent_id).await.map_err(store_failure)?;
        let budget = AgentBudget {
            tenant_id: tenant_id.to_string(),
            agent_id: request.agent_id.clone(),
            per_day_nanos: request.per_day_nanos,
            exhaustion_action: action.as_str().to_string(),
            created_at: existing.map_or_else(|| now.clone(), |existing| existing.created_at),
            updated_at: now,
        };
        self.store.put_agent_budget(&budget).await.map_err(store_failure)?;
        Ok(budget)
    }

    async fn get_agent_limits(&self, request: TenantRef) -> ServiceResult<AgentLimits> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        self.agent_limits(tenant_id).await
    }

    async fn write_agent_limits(&self, request: WriteAgentLimitsRequest) -> ServiceResult<AgentLimits> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        for (agent_id, limit) in &request.set {
            validate_agent_id(agent_id)?;
            validate_agent_limit(agent_id, limit)?;
        }
        // Compare-and-set on the version: a concurrent write makes this one read and apply again.
        for _ in 0..AGENT_LIMIT_WRITE_ATTEMPTS {
            let current = self.agent_limits(tenant_id).await?;
            let mut limits = if request.merge { current.limits } else { BTreeMap::new() };
            if request.merge {
                for agent_id in &request.removed {
                    limits.remove(agent_id);
                }
            }
            limits.extend(request.set.iter().map(|(agent_id, limit)| (agent_id.clone(), *limit)));
            if limits.len() > MAX_AGENT_LIMITS {
                return Err(ServiceError::invalid("too_many_agent_limits", format!("at most {MAX_AGENT_LIMITS} agents may have limits")));
            }
            let stored: BTreeMap<&String, StoredAgentLimit> =
                limits.iter().map(|(agent_id, limit)| (agent_id, StoredAgentLimit::from(limit))).collect();
            let text =
                serde_json::to_string(&stored).map_err(|error| ServiceError::internal(format!("cannot write agent limits: {error}")))?;
            let now = format_timestamp(self.now());
            if self.store.write_agent_limits(tenant_id, &text, current.version, &now).await.map_err(store_failure)? {
                tracing::info!(tenant_id, version = current.version + 1, agents = limits.len(), "agent limits written");
                return Ok(AgentLimits { tenant_id: tenant_id.to_string(), limits, version: current.version + 1, updated_at: Some(now) });
            }
        }
        Err(ServiceError::conflict("concurrent_change", "the agent limits kept changing meanwhile; read them and try again"))
    }

    async fn list_agents(&self, request: ListAgentsRequest) -> ServiceResult<AgentsView> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let now = self.now();
        let today = now.date_naive();
        let first_day = crate::period::day_key(today - Duration::days(HISTORY_DAYS - 1));
        let budgets = self.store.agent_budgets(tenant_id).await.map_err(store_failure)?;
        let stats = self.store.agent_stats(tenant_id, &first_day, &crate::period::day_key(today)).await.map_err(store_failure)?;
        let since = format_timestamp(now - Duration::days(HISTORY_DAYS));
        let exhaustions = self.store.agent_exhaustion_counts(tenant_id, &since).await.map_err(store_failure)?;

        let mut agents: BTreeMap<String, AgentEntry> = BTreeMap::new();
        for budget in budgets {
            let agent_id = budget.agent_id.clone();
            agent_entry(&mut agents, &agent_id).config = Some(budget);
        }
        for stat in &stats {
            let status = agent_status(&mut agents, &stat.agent_id);
            status.total_spend_nanos = stat.total_spend_nanos;
            status.spent_today_nanos = stat.spent_today_nanos;
            status.active_conversations = u64::try_from(stat.active_conversations).unwrap_or(0);
        }
        for (agent_id, action, count) in exhaustions {
            let status = agent_status(&mut agents, &agent_id);
            let count = u64::try_from(count).unwrap_or(0);
            match ExhaustionAction::parse(&action) {
                Some(ExhaustionAction::Downgrade) => status.downgrade_count += count,
                Some(ExhaustionAction::Stop) | None => status.stop_count += count,
            }
        }
        let mut leaderboard: Vec<LeaderboardEntry> = stats.iter().map(leaderboard_entry).collect();
        leaderboard.sort_by(|a, b| b.efficiency_score.total_cmp(&a.efficiency_score).then_with(|| a.agent_id.cmp(&b.agent_id)));
        Ok(AgentsView { agents: agents.into_values().collect(), leaderboard })
    }

    async fn get_forecast(&self, request: GetForecastRequest) -> ServiceResult<Forecast> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let now = self.now();
        let (input, _) = self.forecast_input(tenant_id, &request.plan, now).await?;
        let result = forecast(&input);
        Ok(Forecast {
            tenant_id: tenant_id.to_string(),
            forecast: Some(ForecastSummary {
                avg_daily_spend_nanos: result.avg_daily_nanos,
                projected_period_spend_nanos: result.projected_month_nanos,
                depletion_date: result.depletion.map(|(date, _)| crate::period::day_key(date)),
                days_remaining: result.depletion.map(|(_, days)| days),
                trend: result.trend.as_str().to_string(),
                confidence: result.confidence,
                period: Period::Monthly.as_str().to_string(),
                period_key: Period::Monthly.key_at(now),
            }),
            anomalies: result
                .anomalies
                .iter()
                .map(|anomaly| Anomaly {
                    date: crate::period::day_key(anomaly.date),
                    spent_nanos: anomaly.spent_nanos,
                    expected_nanos: anomaly.expected_nanos,
                    sigma: anomaly.sigma,
                })
                .collect(),
            days_of_data: u32::try_from(result.series.len()).unwrap_or(u32::MAX),
            daily_spent: result
                .series
                .iter()
                .map(|(date, spent)| DailySpend { date: crate::period::day_key(*date), spent_nanos: *spent })
                .collect(),
            limits: Some(ForecastLimits { daily_nanos: input.daily_limit_nanos, monthly_nanos: input.monthly_limit_nanos }),
            generated_at: format_timestamp(now),
        })
    }

    async fn get_alert_config(&self, request: TenantRef) -> ServiceResult<AlertConfig> {
        self.alert_config_or_default(required("tenant_id", &request.tenant_id)?).await
    }

    async fn put_alert_config(&self, request: PutAlertConfigRequest) -> ServiceResult<AlertConfig> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let mut thresholds = request.thresholds.clone();
        if thresholds.len() > MAX_THRESHOLDS || thresholds.iter().any(|threshold| !(1..=MAX_THRESHOLD_PERCENT).contains(threshold)) {
            return Err(ServiceError::invalid(
                "invalid_thresholds",
                format!("thresholds are at most {MAX_THRESHOLDS} integer percents from 1 to {MAX_THRESHOLD_PERCENT}"),
            ));
        }
        thresholds.sort_unstable();
        thresholds.dedup();
        let webhook_url = request.webhook_url.as_deref().map(str::trim).filter(|url| !url.is_empty()).map(str::to_string);
        if let Some(url) = &webhook_url {
            let parsed =
                reqwest::Url::parse(url).map_err(|error| ServiceError::invalid("invalid_webhook_url", format!("webhookUrl: {error}")))?;
            if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
                return Err(ServiceError::invalid("invalid_webhook_url", "webhookUrl must be an http or https URL"));
            }
        }
        if request.enabled && webhook_url.is_none() {
            tracing::info!(tenant_id, "budget alerts enabled without a webhook: they are recorded, not posted");
        }
        let now = format_timestamp(self.now());
        let config = AlertConfig {
            tenant_id: tenant_id.to_string(),
            thresholds,
            webhook_url,
            enabled: request.enabled,
            updated_at: Some(now.clone()),
        };
        self.store.put_alert_config(&config, &now).await.map_err(store_failure)?;
        Ok(config)
    }

    async fn list_alerts(&self, request: ListAlertsRequest) -> ServiceResult<AlertList> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let limit = if request.limit == 0 { DEFAULT_ALERT_LIST } else { request.limit.min(MAX_ALERT_LIST) };
        let alerts = self.store.alerts(tenant_id, limit).await.map_err(store_failure)?;
        Ok(AlertList { alerts })
    }

    async fn get_usage_summary(&self, request: UsageSummaryRequest) -> ServiceResult<UsageSummary> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let grouping = UsageGrouping::parse(&request.group_by)
            .ok_or_else(|| ServiceError::invalid("invalid_group_by", "groupBy must be one of model, provider, key, agent, day"))?;
        let (since, until) = self.usage_window(request.since.as_deref(), request.until.as_deref())?;
        let groups = self.store.usage_summary(tenant_id, grouping, &since, &until).await.map_err(store_failure)?;
        let total_requests = groups.iter().map(|group| group.requests).sum();
        let total_cost_nanos = groups.iter().fold(0i64, |total, group| total.saturating_add(group.cost_nanos));
        Ok(UsageSummary { group_by: request.group_by.clone(), groups, total_requests, total_cost_nanos, since, until })
    }

    async fn list_settled_requests(&self, request: SettledRequestsQuery) -> ServiceResult<SettledRequestPage> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let (since, until) = self.usage_window(request.since.as_deref(), request.until.as_deref())?;
        let limit = if request.limit == 0 { DEFAULT_SETTLED_PAGE } else { request.limit.min(MAX_SETTLED_PAGE) };
        let after = match request.cursor.as_deref() {
            None => None,
            Some(cursor) => Some(parse_cursor(cursor).ok_or_else(|| {
                ServiceError::invalid("invalid_cursor", "cursor is not a `next_cursor` this endpoint gave: start again without it")
            })?),
        };
        if let Some(outcome) = request.outcome.as_deref()
            && !Outcome::ALL.iter().any(|known| known.as_str() == outcome)
        {
            return Err(ServiceError::invalid("invalid_outcome", "outcome must be one of succeeded, failed, client_disconnected"));
        }
        let filters =
            SettlementFilters { model: request.model, key_id: request.key_id, agent_id: request.agent_id, outcome: request.outcome };
        let requests = self
            .store
            .settled_requests(tenant_id, &since, &until, &filters, after.as_ref().map(|(at, id)| (at.as_str(), id.as_str())), limit)
            .await
            .map_err(store_failure)?;
        // A full page may have a next one; the cursor names its last row.
        let next_cursor = (requests.len() == limit as usize)
            .then(|| requests.last().map(|last| format!("{},{}", last.occurred_at, last.request_id)))
            .flatten();
        Ok(SettledRequestPage { requests, next_cursor, since, until })
    }

    async fn get_model_stats(&self, request: ModelStatsRequest) -> ServiceResult<ModelStatsList> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let since = match request.since.as_deref() {
            None => format_timestamp(self.now() - Duration::days(7)),
            Some(text) => {
                normalise_timestamp(text).ok_or_else(|| ServiceError::invalid("invalid_timestamp", "since is not an RFC 3339 instant"))?
            }
        };
        let models = self.store.model_stats(tenant_id, &since).await.map_err(store_failure)?;
        Ok(ModelStatsList { models, since })
    }

    async fn get_current_totals(&self, request: CurrentTotalsRequest) -> ServiceResult<CurrentTotals> {
        let now = self.now();
        let day_key = request.day_key.unwrap_or_else(|| Period::Daily.key_at(now));
        let month_key = request.month_key.unwrap_or_else(|| Period::Monthly.key_at(now));
        let totals = self.store.current_totals(&day_key, &month_key).await.map_err(store_failure)?;
        Ok(CurrentTotals { totals })
    }

    async fn record_event(&self, request: BudgetEvent) -> ServiceResult<RecordEventResponse> {
        let recorded = self.record(&request).await?;
        if let (true, Some(budget_event::Kind::Settlement(settlement))) = (recorded, &request.kind) {
            self.schedule_alert_evaluation(&settlement.tenant_id, &settlement.plan);
        }
        Ok(RecordEventResponse { recorded })
    }

    async fn record_events(&self, request: BudgetEventBatch) -> ServiceResult<RecordEventsResponse> {
        let mut settlements = Vec::new();
        for (index, event) in request.events.iter().enumerate() {
            let checked = match &event.kind {
                Some(budget_event::Kind::Settlement(settlement)) => {
                    settlements.push((index, settlement));
                    validate_settlement(settlement)
                }
                Some(budget_event::Kind::AgentBudgetExhausted(_)) => Ok(()),
                None => Err(ServiceError::invalid("invalid_event", "the budget event carries nothing")),
            };
            checked.map_err(|error| ServiceError::invalid(error.reason, format!("events[{index}]: {}", error.message)))?;
        }
        let mut recorded = vec![false; request.events.len()];
        let batch: Vec<&Settlement> = settlements.iter().map(|(_, settlement)| *settlement).collect();
        let written = self.record_settlements(&batch).await?;
        for ((index, _), written) in settlements.iter().zip(&written) {
            recorded[*index] = *written;
        }
        for (index, event) in request.events.iter().enumerate() {
            if let Some(budget_event::Kind::AgentBudgetExhausted(_)) = &event.kind {
                recorded[index] = self.record(event).await?;
            }
        }
        self.schedule_alerts_after(batch.into_iter().zip(written));
        Ok(RecordEventsResponse { recorded })
    }
}

fn agent_entry<'a>(agents: &'a mut BTreeMap<String, AgentEntry>, agent_id: &str) -> &'a mut AgentEntry {
    agents.entry(agent_id.to_string()).or_insert_with(|| AgentEntry {
        agent_id: agent_id.to_string(),
        config: None,
        status: Some(AgentStatus::default()),
    })
}

fn agent_status<'a>(agents: &'a mut BTreeMap<String, AgentEntry>, agent_id: &str) -> &'a mut AgentStatus {
    agent_entry(agents, agent_id).status.get_or_insert_with(AgentStatus::default)
}

fn leaderboard_entry(stats: &crate::store::AgentStats) -> LeaderboardEntry {
    let requests = stats.requests.max(0);
    // Statistics for display; the money figures stay integer nano-dollars.
    let success_rate = if requests > 0 { stats.succeeded as f64 / requests as f64 } else { 0.0 };
    let avg_latency_ms = if requests > 0 { stats.total_latency_ms as f64 / requests as f64 } else { 0.0 };
    let efficiency_score = if stats.total_spend_nanos > 0 {
        stats.succeeded as f64 * 1_000_000_000.0 / stats.total_spend_nanos as f64
    } else {
        stats.succeeded as f64
    };
    LeaderboardEntry {
        agent_id: stats.agent_id.clone(),
        total_spend_nanos: stats.total_spend_nanos,
        total_requests: u64::try_from(requests).unwrap_or(0),
        success_rate: (success_rate * 10_000.0).round() / 10_000.0,
        avg_cost_per_request_nanos: if requests > 0 { stats.total_spend_nanos / requests } else { 0 },
        avg_latency_ms: (avg_latency_ms * 10.0).round() / 10.0,
        efficiency_score: (efficiency_score * 100.0).round() / 100.0,
    }
}

fn period_status(spent: i64, limit: Option<i64>, period_key: String) -> PeriodStatus {
    PeriodStatus { spent_nanos: spent, limit_nanos: limit, remaining_nanos: limit.map(|limit| remaining(limit, spent)), period_key }
}

fn remaining(limit: i64, spent: i64) -> i64 {
    limit.saturating_sub(spent).max(0)
}

fn required<'a>(field: &str, value: &'a str) -> ServiceResult<&'a str> {
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return Err(ServiceError::invalid("missing_field", format!("{field} is required")));
    }
    Ok(trimmed)
}

fn validate_limit(field: &str, value: Option<i64>) -> ServiceResult<()> {
    match value {
        Some(nanos) if !(0..=MAX_LIMIT_NANOS).contains(&nanos) => Err(ServiceError::invalid(
            "invalid_budget_limit",
            format!("{field} must be between 0 and {} dollars", Usd::from_nanos(MAX_LIMIT_NANOS)),
        )),
        _ => Ok(()),
    }
}

/// One agent's limits as stored in `budget_agent_limits.limits`.
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredAgentLimit {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_budget_nanos: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_requests_per_minute: Option<u32>,
}

impl From<&AgentLimit> for StoredAgentLimit {
    fn from(limit: &AgentLimit) -> Self {
        StoredAgentLimit { max_budget_nanos: limit.max_budget_nanos, max_requests_per_minute: limit.max_requests_per_minute }
    }
}

impl From<StoredAgentLimit> for AgentLimit {
    fn from(limit: StoredAgentLimit) -> Self {
        AgentLimit { max_budget_nanos: limit.max_budget_nanos, max_requests_per_minute: limit.max_requests_per_minute }
    }
}

impl BudgetLedgerServiceImpl {
    async fn agent_limits(&self, tenant_id: &str) -> ServiceResult<AgentLimits> {
        let Some((text, version, updated_at)) = self.store.agent_limits(tenant_id).await.map_err(store_failure)? else {
            return Ok(AgentLimits { tenant_id: tenant_id.to_string(), limits: BTreeMap::new(), version: 0, updated_at: None });
        };
        let stored: BTreeMap<String, StoredAgentLimit> = serde_json::from_str(&text)
            .map_err(|error| ServiceError::internal(format!("stored agent limits do not read back: {error}")))?;
        let limits = stored.into_iter().map(|(agent_id, limit)| (agent_id, AgentLimit::from(limit))).collect();
        Ok(AgentLimits { tenant_id: tenant_id.to_string(), limits, version, updated_at: Some(updated_at) })
    }
}

fn validate_agent_limit(agent_id: &str, limit: &AgentLimit) -> ServiceResult<()> {
    if limit.max_budget_nanos.is_none() && limit.max_requests_per_minute.is_none() {
        return Err(ServiceError::invalid(
            "invalid_agent_limit",
            format!("agent `{agent_id}`: set maxBudgetUsd, maxRequestsPerMinute or both (null deletes the entry)"),
        ));
    }
    validate_limit("maxBudgetUsd", limit.max_budget_nanos)?;
    match limit.max_requests_per_minute {
        Some(rpm) if !(1..=MAX_AGENT_RPM).contains(&rpm) => Err(ServiceError::invalid(
            "invalid_agent_limit",
            format!("agent `{agent_id}`: maxRequestsPerMinute must be 1 to {MAX_AGENT_RPM}"),
        )),
        _ => Ok(()),
    }
}

fn validate_agent_id(agent_id: &str) -> ServiceResult<()> {
    let valid = !agent_id.is_empty()
        && agent_id.chars().count() <= MAX_AGENT_ID_CHARS
        && agent_id.chars().all(|character| !character.is_whitespace() && !character.is_control() && character != '/' && character != ':');
    if valid {
        Ok(())
    } else {
        Err(ServiceError::invalid(
            "invalid_agent_id",
            format!("agent id must be 1 to {MAX_AGENT_ID_CHARS} characters without spaces, `/` or `:`"),
        ))
    }
}

fn validate_settlement(settlement: &Settlement) -> ServiceResult<()> {
    if settlement.request_id.is_empty() || settlement.tenant_id.is_empty() {
        return Err(ServiceError::invalid("invalid_settlement", "a settlement needs request_id and tenant_id"));
    }
    if settlement.cost_nanos < 0 || settlement.input_tokens < 0 || settlement.output_tokens < 0 {
        return Err(ServiceError::invalid("invalid_settlement", "a settlement's cost and tokens cannot be negative"));
    }
    Ok(())
}

fn store_failure(error: sqlx::Error) -> ServiceError {
    match error {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => {
            tracing::warn!(%error, "budget ledger store unavailable");
            ServiceError::unavailable("database_unavailable", "the budget ledger store is unavailable; retry shortly")
        }
        other => {
            tracing::error!(error = %other, "budget ledger store error");
            ServiceError::internal("budget ledger store error")
        }
    }
}
