//! `BudgetGuard`: the one facade the edge calls per request, over the counters and the rate limiter.
//!
//! Per request, before the upstream call: `reserve(context, estimate)` checks the key's rate limit, then
//! reserves the estimate in every scope at once (plan caps, tenant day and month, key budget, agent
//! day). After the call: `Reservation::settle(actual)` with the actual cost, also when a stream ends
//! early or the client disconnects (settle what was consumed); `Reservation::release()` when the call
//! failed without cost. A reservation dropped unsettled is released. Settling publishes the settlement
//! on `budget.settlements` for the ledger.

use std::sync::Arc;
use std::time::Instant;

use brainstorm_common::bus::{EventBus, InProcessBus};
use brainstorm_common::error::{ApiError, Recovery};
use brainstorm_common::money::Usd;
use brainstorm_common::time::{format_timestamp, now_timestamp};
use brainstorm_proto::budget::{self, BudgetEvent, CurrentTotals, budget_event};
use brainstorm_proto::identity::ApiKey;
use chrono::{DateTime, Utc};
use http::StatusCode;
use serde_json::json;

use crate::counters::{
    CounterError, InProcessCounters, Meter, ReservationId, Scope, ScopeKind, ScopeLevel, ScopeLimit, SpendCounters, Usage,
};
use crate::period::{Period, seconds_until_next_day};
use crate::plans::Plan;
use crate::rate_limit::{InProcessRateLimiter, RateLimiter};
use crate::redis_backend::{RedisCounters, RedisRateLimiter, connect_redis};

/// Below this share of a limit remaining, responses carry `X-BR-Budget-Warning`.
const WARNING_REMAINING_PERCENT: i128 = 20;

/// What an agent's exhausted daily budget does to its next requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExhaustionAction {
    /// 402 `budget_exceeded`.
    Stop,
    /// The edge routes the request to a cheaper model (`BudgetDenial::Downgrade`).
    Downgrade,
}

impl ExhaustionAction {
    /// `stop` or `downgrade`.
    pub fn as_str(self) -> &'static str {
        match self {
            ExhaustionAction::Stop => "stop",
            ExhaustionAction::Downgrade => "downgrade",
        }
    }

    /// Reads `stop` or `downgrade`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "stop" => Some(ExhaustionAction::Stop),
            "downgrade" => Some(ExhaustionAction::Downgrade),
            _ => None,
        }
    }
}

/// An API key's own budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyBudgetLimit {
    pub limit: Usd,
    pub period: Period,
}

/// An agent's daily budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentBudgetLimit {
    pub per_day: Usd,
    pub exhaustion_action: ExhaustionAction,
}

/// The agent a request is attributed to (`X-BR-Agent-Id`, or `X-User-Id` / body `user`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentContext {
    pub agent_id: String,
    /// None: the agent's spend is counted, not limited.
    pub budget: Option<AgentBudgetLimit>,
    /// The agent's own requests-per-minute limit (`/v1/agent-limits`), whichever key sends them.
    pub rate_limit_rpm: Option<u32>,
}

/// Everything the guard needs to know about a request's budgets; the edge builds it from the principal
/// (identity) and the tenant limits and agent budget (budget-ledger, cached).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetContext {
    pub tenant_id: String,
    /// `sandbox` or `standard`; an unknown plan gets the sandbox caps.
    pub plan: String,
    pub tenant_daily_limit: Option<Usd>,
    pub tenant_monthly_limit: Option<Usd>,
    pub key_id: Option<String>,
    pub key_budget: Option<KeyBudgetLimit>,
    pub rate_limit_rpm: Option<u32>,
    pub agent: Option<AgentContext>,
    pub conversation_id: Option<String>,
}

impl BudgetContext {
    /// A tenant's context with no limits of its own beyond its plan.
    pub fn new(tenant_id: impl Into<String>, plan: impl Into<String>) -> Self {
        BudgetContext {
            tenant_id: tenant_id.into(),
            plan: plan.into(),
            tenant_daily_limit: None,
            tenant_monthly_limit: None,
            key_id: None,
            key_budget: None,
            rate_limit_rpm: None,
            agent: None,
            conversation_id: None,
        }
    }

    /// Takes the key id, budget (`budget_limit_nanos`, `budget_period`, monthly when unset) and
    /// `rate_limit_rpm` from identity's key record.
    pub fn with_api_key(mut self, key: &ApiKey) -> Self {
        self.key_id = Some(key.id.clone());
        self.key_budget = key.budget_limit_nanos.map(|nanos| KeyBudgetLimit {
            limit: Usd::from_nanos(nanos),
            period: key.budget_period.as_deref().and_then(Period::parse).unwrap_or(Period::Monthly),
        });
        self.rate_limit_rpm = key.rate_limit_rpm.filter(|rpm| *rpm > 0);
        self
    }

    /// Takes the tenant's own limits as budget-ledger returns them.
    pub fn with_tenant_limits(mut self, limits: &budget::TenantLimits) -> Self {
        self.tenant_daily_limit = limits.daily_limit_nanos.map(Usd::from_nanos);
        self.tenant_monthly_limit = limits.monthly_limit_nanos.map(Usd::from_nanos);
        self
    }

    /// Attributes the request to an agent, with its budget if one is configured.
    pub fn with_agent(mut self, agent_id: impl Into<String>, budget: Option<&budget::AgentBudget>) -> Self {
        let budget = budget.map(|budget| AgentBudgetLimit {
            per_day: Usd::from_nanos(budget.per_day_nanos),
            exhaustion_action: ExhaustionAction::parse(&budget.exhaustion_action).unwrap_or(ExhaustionAction::Stop),
        });
        self.agent = Some(AgentContext { agent_id: agent_id.into(), budget, rate_limit_rpm: None });
        self
    }

    /// Applies the agent's entry of `/v1/agent-limits` (after `with_agent`): `max_budget_nanos` caps
    /// its daily budget (the tighter applies; without a budget it becomes one that stops), and
    /// `max_requests_per_minute` limits its requests whichever key sends them.
    pub fn with_agent_limit(mut self, limit: &budget::AgentLimit) -> Self {
        if let Some(agent) = &mut self.agent {
            if let Some(cap) = limit.max_budget_nanos.map(Usd::from_nanos) {
                agent.budget = Some(match agent.budget {
                    Some(budget) => AgentBudgetLimit { per_day: budget.per_day.min(cap), ..budget },
                    None => AgentBudgetLimit { per_day: cap, exhaustion_action: ExhaustionAction::Stop },
                });
            }
            agent.rate_limit_rpm = limit.max_requests_per_minute.filter(|rpm| *rpm > 0);
        }
        self
    }

    /// Every scope the request counts in at `now`, in the order they are checked; the agent's limit
    /// is left out when `enforce_agent_limit` is false (a downgraded request).
    pub fn scopes(&self, now: DateTime<Utc>, enforce_agent_limit: bool) -> Vec<ScopeLimit> {
        let plan = Plan::resolve(&self.plan);
        // Each text once, shared by the scopes that name it.
        let tenant: Arc<str> = self.tenant_id.as_str().into();
        let day: Arc<str> = Period::Daily.key_at(now).into();
        let month: Arc<str> = Period::Monthly.key_at(now).into();
        let scope = |kind: ScopeKind, owner: Arc<str>| {
            let period_key = match kind.period() {
                Period::Daily => day.clone(),
                Period::Monthly => month.clone(),
            };
            Scope { kind, owner, period_key }
        };
        let mut scopes = Vec::with_capacity(6);
        if let Some(cap) = plan.daily_request_cap {
            scopes.push(ScopeLimit::count(scope(ScopeKind::PlanRequestsDaily, tenant.clone()), Some(cap)));
        }
        if let Some(cap) = plan.daily_token_cap {
            scopes.push(ScopeLimit::count(scope(ScopeKind::PlanTokensDaily, tenant.clone()), Some(cap)));
        }
        let daily_limit = plan.effective_daily_limit(self.tenant_daily_limit);
        scopes.push(ScopeLimit::spend(scope(ScopeKind::TenantDaily, tenant.clone()), daily_limit));
        scopes.push(ScopeLimit::spend(scope(ScopeKind::TenantMonthly, tenant.clone()), self.tenant_monthly_limit));
        if let (Some(key_id), Some(budget)) = (&self.key_id, self.key_budget) {
            scopes.push(ScopeLimit::spend(scope(ScopeKind::key_scope(budget.period), key_id.as_str().into()), Some(budget.limit)));
        }
        if let Some(agent) = &self.agent {
            let limit = agent.budget.filter(|_| enforce_agent_limit).map(|budget| budget.per_day);
            scopes.push(ScopeLimit::spend(scope(ScopeKind::AgentDaily, Scope::agent_owner(&tenant, &agent.agent_id).into()), limit));
        }
        scopes
    }
}

/// The edge's estimate of a request, before the upstream call. Estimates at or above the actual keep
/// spend under every limit; an estimate below the actual can overshoot by the difference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Estimate {
    /// `X-BR-Request-Id`: the settlement's unique key in the ledger.
    pub request_id: String,
    pub cost: Usd,
    /// Prompt tokens plus `max_tokens` (or the model's default completion size).
    pub tokens: i64,
}

/// How a settled request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed,
    /// The client went away mid-stream: settle what the upstream consumed.
    ClientDisconnected,
}

impl Outcome {
    /// Every outcome.
    pub const ALL: [Outcome; 3] = [Outcome::Succeeded, Outcome::Failed, Outcome::ClientDisconnected];

    /// `succeeded`, `failed` or `client_disconnected`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::ClientDisconnected => "client_disconnected",
        }
    }
}

/// What a request actually cost, after the upstream call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActualUsage {
    pub cost: Usd,
    pub input_tokens: i64,
    pub output_tokens: i64,
    /// The executed model, e.g. `openai/gpt-4o-mini` or `brainstorm/sandbox`.
    pub model: String,
    pub provider: String,
    pub outcome: Outcome,
    /// Upstream latency; None measures from the reservation.
    pub latency_ms: Option<u64>,
}

/// A money limit that refused a request: what the 402 headers carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetExceeded {
    pub scope: ScopeKind,
    pub limit: Usd,
    /// Spent in the scope's period, amounts in flight included.
    pub spent: Usd,
}

impl BudgetExceeded {
    /// `max(0, limit - spent)`.
    pub fn remaining(&self) -> Usd {
        Usd::from_nanos(self.limit.nanos().saturating_sub(self.spent.nanos()).max(0))
    }

    /// `X-Budget-Limit`, `X-Budget-Spent`, `X-Budget-Remaining` (dollars, six decimals).
    pub fn headers(&self) -> [(&'static str, String); 3] {
        [
            ("x-budget-limit", self.limit.format_fixed(6)),
            ("x-budget-spent", self.spent.format_fixed(6)),
            ("x-budget-remaining", self.remaining().format_fixed(6)),
        ]
    }
}

/// A rate or cap that refused a request: what the 429 carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimited {
    /// None for a requests-per-minute limit (the key's, or the agent's with `per_agent`); the plan's
    /// daily cap scope otherwise.
    pub cap_scope: Option<ScopeKind>,
    /// The agent's own limit (`/v1/agent-limits`) refused, not the key's.
    pub per_agent: bool,
    /// Requests a minute, or the daily cap.
    pub limit: i64,
    pub retry_after_ms: u64,
}

/// Why the guard refused a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetDenial {
    /// 402 `budget_exceeded`: a tenant, key or (stop) agent budget is exhausted.
    BudgetExceeded(BudgetExceeded),
    /// 429 `rate_limit_exceeded`: the key's rpm, or the plan's daily request or token cap (retry after
    /// the next UTC midnight).
    RateLimited(RateLimited),
    /// The agent's daily budget is exhausted and its action is `downgrade`: route to a cheaper model
    /// and call `reserve_downgraded` (answer 402 with `to_api_error` when no cheaper model exists).
    Downgrade(BudgetExceeded),
    /// The counters could not be reached: 503.
    Unavailable(String),
}

impl BudgetDenial {
    /// The spec's error envelope for this denial: 402 with the `X-Budget-*` headers and recovery
    /// `increase_budget`, 429 with `Retry-After` and `wait_ms`, or 503.
    pub fn to_api_error(&self) -> ApiError {
        match self {
            BudgetDenial::BudgetExceeded(exceeded) | BudgetDenial::Downgrade(exceeded) => budget_exceeded_error(exceeded),
            BudgetDenial::RateLimited(limited) => {
                let message = match limited.cap_scope {
                    None if limited.per_agent => format!("the agent's limit of {} requests per minute is exceeded", limited.limit),
                    None => format!("rate limit of {} requests per minute exceeded for this key", limited.limit),
                    Some(ScopeKind::PlanTokensDaily) => format!("the plan's daily cap of {} tokens is reached", limited.limit),
                    Some(_) => format!("the plan's daily cap of {} requests is reached", limited.limit),
                };
                ApiError::rate_limited(message, limited.retry_after_ms)
            }
            BudgetDenial::Unavailable(_) => ApiError::unavailable("budget_unavailable", "budget counters are unavailable; retry shortly"),
        }
    }
}

fn budget_exceeded_error(exceeded: &BudgetExceeded) -> ApiError {
    let scope = match exceeded.scope {
        ScopeKind::TenantDaily => "the tenant's daily budget",
        ScopeKind::TenantMonthly => "the tenant's monthly budget",
        ScopeKind::KeyDaily | ScopeKind::KeyMonthly => "this API key's budget",
        ScopeKind::AgentDaily => "the agent's daily budget",
        ScopeKind::PlanTokensDaily | ScopeKind::PlanRequestsDaily => "the plan's daily cap",
    };
    let message = format!(
        "{scope} is exhausted: USD {} spent of {} (scope {})",
        exceeded.spent.format_fixed(6),
        exceeded.limit.format_fixed(6),
        exceeded.scope
    );
    let mut error = ApiError::forbidden("budget_exceeded", message);
    error.status = StatusCode::PAYMENT_REQUIRED;
    error.error_type = "budget_exceeded";
    error.details.insert("scope".to_string(), json!(exceeded.scope.as_str()));
    error.recovery = Recovery {
        action: "increase_budget",
        endpoint: "/v1/agent-limits".to_string(),
        method: "PATCH",
        body_template: json!({"agent:<agent id>": {"maxBudgetUsd": "<new limit>"}}),
        message: "raise the budget (PUT /v1/budget/limits for tenant limits), or wait for the next period".to_string(),
        wait_ms: None,
        reason: None,
    };
    for (name, value) in exceeded.headers() {
        error.push_header(http::HeaderName::from_static(name), &value);
    }
    error
}

/// The levels behind the budget headers of a response.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RemainingView {
    pub levels: Vec<ScopeLevel>,
    /// From the key's rate limit check, when it has one.
    pub rate_limit_remaining: Option<u32>,
}

impl RemainingView {
    /// The tightest money scope: the one with the least remaining.
    pub fn tightest_budget(&self) -> Option<&ScopeLevel> {
        self.levels
            .iter()
            .filter(|level| level.scope.kind.meter() == Meter::Spend && level.limit.is_some())
            .min_by_key(|level| level.remaining().unwrap_or(i64::MAX))
    }

    /// `X-BR-Budget-Remaining`: the least remaining across money scopes with a limit.
    pub fn budget_remaining(&self) -> Option<Usd> {
        self.tightest_budget().and_then(ScopeLevel::remaining).map(Usd::from_nanos)
    }

    /// `X-BR-Tokens-Remaining`: what the plan's daily token cap leaves.
    pub fn tokens_remaining(&self) -> Option<i64> {
        self.levels.iter().find(|level| level.scope.kind == ScopeKind::PlanTokensDaily).and_then(ScopeLevel::remaining)
    }

    /// `X-BR-Budget-Warning`, when some money scope has less than 20% of its limit left:
    /// `<scope>: <n>% of the budget remains` for the scope with the smallest share left.
    pub fn warning(&self) -> Option<String> {
        let share_left = |level: &ScopeLevel| -> Option<i128> {
            let limit = i128::from(level.limit?);
            let remaining = i128::from(level.remaining()?);
            (limit > 0).then(|| remaining * 100 / limit)
        };
        let lowest = self
            .levels
            .iter()
            .filter(|level| level.scope.kind.meter() == Meter::Spend)
            .filter_map(|level| share_left(level).map(|percent| (percent, level)))
            .min_by_key(|(percent, _)| *percent)?;
        (lowest.0 < WARNING_REMAINING_PERCENT).then(|| format!("{}: {}% of the budget remains", lowest.1.scope.kind, lowest.0))
    }

    /// The success headers: `X-BR-Budget-Remaining`, `X-BR-Budget-Warning`, `X-BR-Tokens-Remaining`
    /// and `X-RateLimit-Remaining`, each only when it applies.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut headers = Vec::with_capacity(4);
        self.each_header(|name, value| headers.push((name, value.to_string())));
        headers
    }

    /// `headers`, each name and value handed to `put` as it is made (a value is written where it
    /// goes, without a `String` of its own).
    pub fn each_header(&self, mut put: impl FnMut(&'static str, &dyn std::fmt::Display)) {
        if let Some(remaining) = self.budget_remaining() {
            put("x-br-budget-remaining", &remaining.fixed(6));
        }
        if let Some(warning) = self.warning() {
            put("x-br-budget-warning", &warning);
        }
        if let Some(tokens) = self.tokens_remaining() {
            put("x-br-tokens-remaining", &tokens);
        }
        if let Some(remaining) = self.rate_limit_remaining {
            put("x-ratelimit-remaining", &remaining);
        }
        if let Some(remaining) = self.agent_budget_remaining() {
            put("x-br-agent-budget-remaining", &remaining.fixed(6));
        }
    }

    /// `X-BR-Agent-Budget-Remaining`: what the attributed agent's daily budget leaves, when it has one.
    pub fn agent_budget_remaining(&self) -> Option<Usd> {
        self.levels.iter().find(|level| level.scope.kind == ScopeKind::AgentDaily).and_then(ScopeLevel::remaining).map(Usd::from_nanos)
    }
}

/// The per-request budget facade; cheap to clone.
#[derive(Clone)]
pub struct BudgetGuard {
    counters: Arc<dyn SpendCounters>,
    limiter: Arc<dyn RateLimiter>,
    bus: Arc<dyn EventBus>,
}

impl BudgetGuard {
    /// A guard over any counters and limiter, publishing settlements on `bus`.
    pub fn new(counters: Arc<dyn SpendCounters>, limiter: Arc<dyn RateLimiter>, bus: Arc<dyn EventBus>) -> Self {
        BudgetGuard { counters, limiter, bus }
    }

    /// The embedded shape: counters and limiter in this process.
    pub fn in_process(bus: Arc<dyn EventBus>) -> Self {
        Self::new(Arc::new(InProcessCounters::new()), Arc::new(InProcessRateLimiter::new()), bus)
    }

    /// The distributed shape: counters and limiter in Redis at `url` (`BR_REDIS_URL`), keys under
    /// `prefix` (`br` in production), shared by every replica using the same server and prefix.
    pub async fn redis(url: &str, prefix: &str, bus: Arc<dyn EventBus>) -> Result<Self, CounterError> {
        let connection = connect_redis(url).await?;
        Ok(Self::new(Arc::new(RedisCounters::new(connection.clone(), prefix)), Arc::new(RedisRateLimiter::new(connection, prefix)), bus))
    }

    /// A guard for tests and tools that never publish: settlements go to a private in-process bus.
    pub fn unpublished(counters: Arc<dyn SpendCounters>, limiter: Arc<dyn RateLimiter>) -> Self {
        Self::new(counters, limiter, Arc::new(InProcessBus::new()))
    }

    /// The counters behind the guard.
    pub fn counters(&self) -> &Arc<dyn SpendCounters> {
        &self.counters
    }

    /// Checks the key's rate limit, then reserves `estimate` in every scope of `context`.
    pub async fn reserve(&self, context: &BudgetContext, estimate: &Estimate) -> Result<Reservation, BudgetDenial> {
        let rate_limit_remaining = self.check_rate(context).await?;
        self.reserve_scopes(context, estimate, true, rate_limit_remaining).await
    }

    /// After `BudgetDenial::Downgrade`: reserves the (cheaper) estimate with the agent's spend still
    /// counted but its limit lifted; every other limit applies. The rate limit was already counted.
    pub async fn reserve_downgraded(&self, context: &BudgetContext, estimate: &Estimate) -> Result<Reservation, BudgetDenial> {
        self.reserve_scopes(context, estimate, false, None).await
    }

    /// The current levels of the context's scopes, for requests that reserve nothing.
    pub async fn remaining(&self, context: &BudgetContext) -> Result<RemainingView, CounterError> {
        let levels = self.counters.levels(&context.scopes(Utc::now(), true)).await?;
        Ok(RemainingView { levels, rate_limit_remaining: None })
    }

    /// Seeds the counters of the current periods from the ledger's totals (`GetCurrentTotals`), so a
    /// restarted embedded gateway keeps today's spend; counters that already exist are left alone.
    /// Returns how many counters were set.
    pub async fn seed_from_totals(&self, totals: &CurrentTotals) -> Result<usize, CounterError> {
        let mut seeded = 0;
        for total in &totals.totals {
            let Some(kind) = ScopeKind::parse(&total.kind) else {
                tracing::warn!(kind = %total.kind, "skipping a ledger total of unknown kind");
                continue;
            };
            let scope = Scope { kind, owner: total.owner.as_str().into(), period_key: total.period_key.as_str().into() };
            if self.counters.seed(&scope, total.value).await? {
                seeded += 1;
            }
        }
        Ok(seeded)
    }

    async fn check_rate(&self, context: &BudgetContext) -> Result<Option<u32>, BudgetDenial> {
        if let Some(agent) = &context.agent
            && let Some(rpm) = agent.rate_limit_rpm
        {
            let decision = self.limiter.check(&agent_rate_key(&context.tenant_id, &agent.agent_id), rpm).await.map_err(unavailable)?;
            if !decision.allowed {
                let limited =
                    RateLimited { cap_scope: None, per_agent: true, limit: i64::from(rpm), retry_after_ms: decision.retry_after_ms };
                return Err(BudgetDenial::RateLimited(limited));
            }
        }
        let (Some(rpm), Some(key_id)) = (context.rate_limit_rpm, context.key_id.as_deref()) else {
            return Ok(None);
        };
        let decision = self.limiter.check(key_id, rpm).await.map_err(unavailable)?;
        if !decision.allowed {
            let limited = RateLimited { cap_scope: None, per_agent: false, limit: i64::from(rpm), retry_after_ms: decision.retry_after_ms };
            return Err(BudgetDenial::RateLimited(limited));
        }
        Ok(Some(decision.remaining))
    }

    /// Requests the agent's rate limit counts in the current minute (0 without one).
    pub async fn agent_requests_this_minute(&self, tenant_id: &str, agent_id: &str, rpm: u32) -> Result<u32, CounterError> {
        self.limiter.used(&agent_rate_key(tenant_id, agent_id), rpm).await
    }

    async fn reserve_scopes(
        &self,
        context: &BudgetContext,
        estimate: &Estimate,
        enforce_agent_limit: bool,
        rate_limit_remaining: Option<u32>,
    ) -> Result<Reservation, BudgetDenial> {
        let now = Utc::now();
        let scopes = context.scopes(now, enforce_agent_limit);
        let amount = Usage { cost: estimate.cost.max(Usd::ZERO), tokens: estimate.tokens.max(0), requests: 1 };
        match self.counters.reserve(&scopes, amount).await {
            Ok(reserved) => Ok(Reservation {
                inner: Some(ReservationInner {
                    counters: self.counters.clone(),
                    bus: self.bus.clone(),
                    reservation: reserved.reservation,
                    context: context.clone(),
                    request_id: estimate.request_id.clone(),
                    reserved_at: Instant::now(),
                }),
                view: RemainingView { levels: reserved.levels, rate_limit_remaining },
            }),
            Err(CounterError::Exhausted(exhausted)) => {
                let kind = exhausted.scope.kind;
                let denial = match kind.meter() {
                    Meter::Requests | Meter::Tokens => BudgetDenial::RateLimited(RateLimited {
                        per_agent: false,
                        cap_scope: Some(kind),
                        limit: exhausted.limit,
                        retry_after_ms: u64::try_from(seconds_until_next_day(now)).unwrap_or(0).saturating_mul(1000),
                    }),
                    Meter::Spend => {
                        let exceeded = BudgetExceeded {
                            scope: kind,
                            limit: Usd::from_nanos(exhausted.limit),
                            spent: Usd::from_nanos(exhausted.spent),
                        };
                        let agent_action = context.agent.as_ref().and_then(|agent| agent.budget).map(|budget| budget.exhaustion_action);
                        match (kind, agent_action) {
                            (ScopeKind::AgentDaily, Some(ExhaustionAction::Downgrade)) => BudgetDenial::Downgrade(exceeded),
                            _ => BudgetDenial::BudgetExceeded(exceeded),
                        }
                    }
                };
                if kind == ScopeKind::AgentDaily {
                    self.publish_agent_exhausted(context, &estimate.request_id, &denial).await;
                }
                Err(denial)
            }
            Err(error) => Err(unavailable(error)),
        }
    }

    async fn publish_agent_exhausted(&self, context: &BudgetContext, request_id: &str, denial: &BudgetDenial) {
        let Some(agent) = &context.agent else { return };
        let action = match denial {
            BudgetDenial::Downgrade(_) => ExhaustionAction::Downgrade,
            BudgetDenial::BudgetExceeded(_) | BudgetDenial::RateLimited(_) | BudgetDenial::Unavailable(_) => ExhaustionAction::Stop,
        };
        let event = budget_event::Kind::AgentBudgetExhausted(budget::AgentBudgetExhausted {
            event_id: uuid::Uuid::now_v7().to_string(),
            tenant_id: context.tenant_id.clone(),
            agent_id: agent.agent_id.clone(),
            action: action.as_str().to_string(),
            request_id: Some(request_id.to_string()),
            occurred_at: now_timestamp(),
        });
        publish(self.bus.as_ref(), &context.tenant_id, event).await;
    }
}

fn unavailable(error: CounterError) -> BudgetDenial {
    tracing::warn!(%error, "budget counters unavailable");
    BudgetDenial::Unavailable(error.to_string())
}

/// Publishes a budget event; a lost event costs the ledger one row, never the request, so failures
/// are logged.
async fn publish(bus: &dyn EventBus, tenant_id: &str, kind: budget_event::Kind) {
    let event = Arc::new(BudgetEvent { kind: Some(kind) });
    if let Err(error) = bus.publish_event(budget::SETTLEMENTS_TOPIC, tenant_id, event).await {
        tracing::warn!(%error, tenant_id, "could not publish a budget event");
    }
}

/// A request's reservation: settle it with the actual usage, or release it. Dropping it unsettled
/// releases it (in a spawned task).
pub struct Reservation {
    inner: Option<ReservationInner>,
    view: RemainingView,
}

struct ReservationInner {
    counters: Arc<dyn SpendCounters>,
    bus: Arc<dyn EventBus>,
    reservation: ReservationId,
    context: BudgetContext,
    request_id: String,
    reserved_at: Instant,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let id = self.inner.as_ref().map(|inner| inner.reservation.as_str());
        formatter.debug_struct("Reservation").field("id", &id).field("view", &self.view).finish()
    }
}

impl Reservation {
    /// The levels right after reserving the estimate: the budget headers of the response.
    pub fn remaining(&self) -> &RemainingView {
        &self.view
    }

    /// Replaces the estimate with the actual usage in every scope, publishes the settlement for the
    /// ledger (also when the counters failed) and returns the levels afterwards.
    pub async fn settle(mut self, actual: ActualUsage) -> Result<RemainingView, CounterError> {
        let Some(inner) = self.inner.take() else {
            return Ok(self.view.clone());
        };
        let usage = Usage { cost: actual.cost, tokens: actual.input_tokens.saturating_add(actual.output_tokens), requests: 1 };
        let ReservationInner { counters, bus, reservation, context, request_id, reserved_at } = inner;
        let settled = counters.settle(&reservation, usage).await;
        publish_settlement(bus.as_ref(), context, request_id, reserved_at, actual).await;
        let levels = settled?;
        Ok(RemainingView { levels, rate_limit_remaining: self.view.rate_limit_remaining })
    }

    /// Takes the estimate back, as [`Reservation::release`] does, and records the request as
    /// `failed` on `model` (nothing spent), so the ledger's usage, success rates and what routing
    /// learns count a provider's failures.
    pub async fn release_failed(mut self, model: String, provider: String, latency_ms: Option<u64>) -> Result<(), CounterError> {
        let Some(inner) = self.inner.take() else { return Ok(()) };
        let ReservationInner { counters, bus, reservation, context, request_id, reserved_at } = inner;
        let released = counters.release(&reservation).await;
        let actual =
            ActualUsage { cost: Usd::ZERO, input_tokens: 0, output_tokens: 0, model, provider, outcome: Outcome::Failed, latency_ms };
        publish_settlement(bus.as_ref(), context, request_id, reserved_at, actual).await;
        released
    }

    /// Settles in a spawned task, for paths that cannot await: a stream body's drop when the client
    /// disconnects mid-stream (settle what the upstream consumed, with `Outcome::ClientDisconnected`).
    pub fn settle_in_background(self, actual: ActualUsage) {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(error) = self.settle(actual).await {
                        tracing::warn!(%error, "could not settle a reservation in the background");
                    }
                });
            }
            // Without a runtime the drop below can only log; the estimate stays counted.
            Err(_) => drop(self),
        }
    }

    /// Takes the estimate back: the upstream call failed and cost nothing.
    pub async fn release(mut self) -> Result<(), CounterError> {
        match self.inner.take() {
            Some(inner) => inner.counters.release(&inner.reservation).await,
            None => Ok(()),
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(error) = inner.counters.release(&inner.reservation).await {
                        tracing::warn!(%error, request_id = %inner.request_id, "could not release a dropped reservation");
                    }
                });
            }
            Err(_) => {
                tracing::warn!(request_id = %inner.request_id, "reservation dropped outside a runtime: its estimate stays counted");
            }
        }
    }
}

/// Publishes a reservation's settlement for the ledger (once per reservation: it takes the context's text).
async fn publish_settlement(bus: &dyn EventBus, context: BudgetContext, request_id: String, reserved_at: Instant, actual: ActualUsage) {
    let latency_ms = actual.latency_ms.unwrap_or_else(|| u64::try_from(reserved_at.elapsed().as_millis()).unwrap_or(u64::MAX));
    let key = context.tenant_id.clone();
    let settlement = budget::Settlement {
        request_id,
        tenant_id: context.tenant_id,
        plan: context.plan,
        key_id: context.key_id,
        agent_id: context.agent.map(|agent| agent.agent_id),
        conversation_id: context.conversation_id,
        model: actual.model,
        provider: actual.provider,
        input_tokens: actual.input_tokens,
        output_tokens: actual.output_tokens,
        cost_nanos: actual.cost.nanos(),
        outcome: actual.outcome.as_str().to_string(),
        latency_ms,
        occurred_at: format_timestamp(Utc::now()),
    };
    publish(bus, &key, budget_event::Kind::Settlement(settlement)).await;
}

/// The rate limiter's key for an agent's own limit: tenant and agent, apart from API key ids (UUIDs).
fn agent_rate_key(tenant_id: &str, agent_id: &str) -> String {
    ["agent:", tenant_id, ":", agent_id].concat()
}
