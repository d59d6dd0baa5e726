//! `BudgetGuard`, the edge's per-request facade: denials as the spec answers them, headers, plans,
//! agent downgrades, settlements on the bus, and two Redis-backed replicas sharing one budget.

use std::sync::Arc;
use std::time::Duration;

use brainstorm_budget_ledger::{
    ActualUsage, BudgetContext, BudgetDenial, BudgetGuard, Estimate, Outcome, Reservation, Scope, ScopeKind, ScopeLimit,
};
use brainstorm_common::bus::{EventBus, InProcessBus, Subscription};
use brainstorm_common::money::Usd;
use brainstorm_proto::budget::{self, BudgetEvent, CounterTotal, CurrentTotals, budget_event};
use brainstorm_proto::identity::ApiKey;
use chrono::Utc;
use http::StatusCode;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const CENT: i64 = 10_000_000;

fn dollars(nanos: i64) -> Usd {
    Usd::from_nanos(nanos)
}

fn estimate(cost_nanos: i64, tokens: i64) -> Estimate {
    Estimate { request_id: format!("req_{}", uuid::Uuid::now_v7().simple()), cost: dollars(cost_nanos), tokens }
}

fn actual(cost_nanos: i64) -> ActualUsage {
    ActualUsage {
        cost: dollars(cost_nanos),
        input_tokens: 12,
        output_tokens: 30,
        model: "openai/gpt-4o-mini".to_string(),
        provider: "openai".to_string(),
        outcome: Outcome::Succeeded,
        latency_ms: Some(250),
    }
}

fn guard_with_bus() -> (BudgetGuard, InProcessBus) {
    let bus = InProcessBus::new();
    (BudgetGuard::in_process(Arc::new(bus.clone())), bus)
}

fn standard_tenant() -> BudgetContext {
    BudgetContext::new(uuid::Uuid::new_v4().to_string(), "standard")
}

async fn reserve_ok(guard: &BudgetGuard, context: &BudgetContext, cost_nanos: i64) -> Result<Reservation, String> {
    guard.reserve(context, &estimate(cost_nanos, 100)).await.map_err(|denial| format!("unexpected denial {denial:?}"))
}

async fn next_event(subscription: &mut Box<dyn Subscription>) -> Result<BudgetEvent, Box<dyn std::error::Error + Send + Sync>> {
    let delivery = tokio::time::timeout(Duration::from_secs(2), subscription.next()).await??;
    let event = delivery.message().decode::<BudgetEvent>()?;
    delivery.ack();
    Ok(std::sync::Arc::unwrap_or_clone(event))
}

fn header<'a>(headers: &'a [(&'static str, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(header, _)| *header == name).map(|(_, value)| value.as_str())
}

#[tokio::test]
async fn an_exhausted_tenant_budget_answers_402_with_the_budget_headers() -> TestResult {
    let (guard, _bus) = guard_with_bus();
    let mut context = standard_tenant();
    context.tenant_daily_limit = Some(dollars(10 * CENT));
    let first = reserve_ok(&guard, &context, 6 * CENT).await?;
    let denial = guard.reserve(&context, &estimate(6 * CENT, 100)).await.err().ok_or("second reservation admitted")?;
    let BudgetDenial::BudgetExceeded(exceeded) = &denial else { return Err(format!("expected 402, got {denial:?}").into()) };
    assert_eq!((exceeded.scope, exceeded.limit, exceeded.spent), (ScopeKind::TenantDaily, dollars(10 * CENT), dollars(6 * CENT)));

    let error = denial.to_api_error();
    assert_eq!(error.status, StatusCode::PAYMENT_REQUIRED);
    let body = error.body();
    assert_eq!((body["error"]["type"].as_str(), body["error"]["code"].as_str()), (Some("budget_exceeded"), Some("budget_exceeded")));
    assert_eq!(body["error"]["scope"], "tenant_daily");
    assert_eq!(
        (body["recovery"]["action"].as_str(), body["recovery"]["endpoint"].as_str()),
        (Some("increase_budget"), Some("/v1/agent-limits"))
    );
    let headers: Vec<(String, String)> =
        error.headers.iter().map(|(name, value)| (name.to_string(), value.to_str().unwrap_or_default().to_string())).collect();
    for (name, value) in [("x-budget-limit", "0.100000"), ("x-budget-spent", "0.060000"), ("x-budget-remaining", "0.040000")] {
        assert!(headers.contains(&(name.to_string(), value.to_string())), "{name}: {value} missing from {headers:?}");
    }
    // Releasing the first reservation frees the budget again.
    first.release().await?;
    reserve_ok(&guard, &context, 6 * CENT).await?;
    Ok(())
}

#[tokio::test]
async fn the_plan_cap_bounds_a_higher_tenant_limit() -> TestResult {
    let (guard, _bus) = guard_with_bus();
    let mut context = standard_tenant();
    context.tenant_daily_limit = Some(dollars(100 * 100 * CENT));
    let reservation = reserve_ok(&guard, &context, 450 * CENT).await?;
    assert_eq!(reservation.remaining().budget_remaining(), Some(dollars(50 * CENT)), "standard caps a day at USD 5");
    let denial = guard.reserve(&context, &estimate(51 * CENT, 0)).await.err().ok_or("admitted past the plan cap")?;
    assert!(matches!(denial, BudgetDenial::BudgetExceeded(exceeded) if exceeded.limit == dollars(500 * CENT)));
    Ok(())
}

#[tokio::test]
async fn the_key_rate_limit_answers_429_with_retry_after() -> TestResult {
    let (guard, _bus) = guard_with_bus();
    let key = ApiKey { id: "key-rpm".to_string(), rate_limit_rpm: Some(2), ..ApiKey::default() };
    let context = standard_tenant().with_api_key(&key);
    let first = reserve_ok(&guard, &context, 0).await?;
    assert_eq!(header(&first.remaining().headers(), "x-ratelimit-remaining"), Some("1"));
    let second = reserve_ok(&guard, &context, 0).await?;
    assert_eq!(second.remaining().rate_limit_remaining, Some(0));
    let denial = guard.reserve(&context, &estimate(0, 0)).await.err().ok_or("third request admitted at 2 rpm")?;
    let BudgetDenial::RateLimited(limited) = &denial else { return Err(format!("expected 429, got {denial:?}").into()) };
    assert_eq!((limited.cap_scope, limited.limit), (None, 2));
    assert!(limited.retry_after_ms > 29_000 && limited.retry_after_ms <= 30_000);
    let error = denial.to_api_error();
    assert_eq!(error.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(error.body()["error"]["code"], "rate_limit_exceeded");
    assert_eq!(error.body()["recovery"]["wait_ms"], limited.retry_after_ms);
    assert!(error.headers.iter().any(|(name, value)| name == "retry-after" && value == "30"));
    Ok(())
}

#[tokio::test]
async fn the_sandbox_plan_caps_requests_and_tokens_per_day() -> TestResult {
    let (guard, _bus) = guard_with_bus();
    let context = BudgetContext::new(uuid::Uuid::new_v4().to_string(), "sandbox");
    let mut held = Vec::new();
    for index in 0..100 {
        let reservation = guard.reserve(&context, &estimate(0, 10)).await.map_err(|denial| format!("request {index}: {denial:?}"))?;
        held.push(reservation);
    }
    assert_eq!(header(&held[99].remaining().headers(), "x-br-tokens-remaining"), Some("99000"));
    let denial = guard.reserve(&context, &estimate(0, 10)).await.err().ok_or("101st request admitted")?;
    let BudgetDenial::RateLimited(limited) = denial else { return Err(format!("expected the request cap, got {denial:?}").into()) };
    assert_eq!((limited.cap_scope, limited.limit), (Some(ScopeKind::PlanRequestsDaily), 100));
    assert!(limited.retry_after_ms > 0 && limited.retry_after_ms <= 86_400_000, "retry at the next UTC midnight");

    let tokens = BudgetContext::new(uuid::Uuid::new_v4().to_string(), "sandbox");
    let big = reserve_ok_tokens(&guard, &tokens, 60_000).await?;
    let denial = guard.reserve(&tokens, &estimate(0, 60_000)).await.err().ok_or("past the token cap")?;
    assert!(matches!(denial, BudgetDenial::RateLimited(limited) if limited.cap_scope == Some(ScopeKind::PlanTokensDaily)));
    // Settling fewer tokens than estimated gives the rest back.
    let mut usage = actual(0);
    usage.input_tokens = 5_000;
    usage.output_tokens = 5_000;
    let view = big.settle(usage).await?;
    assert_eq!(view.tokens_remaining(), Some(90_000));
    reserve_ok_tokens(&guard, &tokens, 60_000).await?;
    Ok(())
}

async fn reserve_ok_tokens(guard: &BudgetGuard, context: &BudgetContext, tokens: i64) -> Result<Reservation, String> {
    guard.reserve(context, &estimate(0, tokens)).await.map_err(|denial| format!("unexpected denial {denial:?}"))
}

#[tokio::test]
async fn an_agent_with_downgrade_is_downgraded_and_one_with_stop_is_stopped() -> TestResult {
    let (guard, bus) = guard_with_bus();
    let mut events = bus.subscribe(budget::SETTLEMENTS_TOPIC, "test").await?;
    let tenant = standard_tenant();
    let downgrading = budget::AgentBudget {
        agent_id: "planner".to_string(),
        per_day_nanos: 5 * CENT,
        exhaustion_action: "downgrade".to_string(),
        ..budget::AgentBudget::default()
    };
    let context = tenant.clone().with_agent("planner", Some(&downgrading));
    reserve_ok(&guard, &context, 4 * CENT).await?.settle(actual(4 * CENT)).await?;
    let denial = guard.reserve(&context, &estimate(2 * CENT, 100)).await.err().ok_or("agent budget ignored")?;
    let BudgetDenial::Downgrade(exceeded) = denial else { return Err(format!("expected a downgrade, got {denial:?}").into()) };
    assert_eq!((exceeded.scope, exceeded.spent, exceeded.limit), (ScopeKind::AgentDaily, dollars(4 * CENT), dollars(5 * CENT)));
    // The cheaper model's request still counts against the agent, but is not refused by it.
    let downgraded = guard.reserve_downgraded(&context, &estimate(2 * CENT, 100)).await.map_err(|denial| format!("{denial:?}"))?;
    downgraded.settle(actual(2 * CENT)).await?;
    let agent_scope = Scope::at(ScopeKind::AgentDaily, Scope::agent_owner(&tenant.tenant_id, "planner"), Utc::now());
    assert_eq!(guard.counters().spent(&agent_scope).await?, 6 * CENT);

    let stopping = budget::AgentBudget { exhaustion_action: "stop".to_string(), ..downgrading };
    let context = tenant.clone().with_agent("planner", Some(&stopping));
    let denial = guard.reserve(&context, &estimate(CENT, 100)).await.err().ok_or("stop agent admitted")?;
    assert!(matches!(denial, BudgetDenial::BudgetExceeded(exceeded) if exceeded.scope == ScopeKind::AgentDaily));
    assert_eq!(denial.to_api_error().status, StatusCode::PAYMENT_REQUIRED);

    // The ledger hears of both exhaustions and both settlements, in order.
    let mut actions = Vec::new();
    for _ in 0..4 {
        match next_event(&mut events).await?.kind {
            Some(budget_event::Kind::AgentBudgetExhausted(exhausted)) => actions.push(exhausted.action),
            Some(budget_event::Kind::Settlement(settlement)) => actions.push(format!("settled {}", settlement.cost_nanos)),
            None => actions.push("empty".to_string()),
        }
    }
    assert_eq!(
        actions,
        vec![format!("settled {}", 4 * CENT), "downgrade".to_string(), format!("settled {}", 2 * CENT), "stop".to_string()]
    );
    Ok(())
}

#[tokio::test]
async fn settling_publishes_the_settlement_and_reports_the_remaining_budget() -> TestResult {
    let (guard, bus) = guard_with_bus();
    let mut events = bus.subscribe(budget::SETTLEMENTS_TOPIC, "ledger").await?;
    let key = ApiKey {
        id: "key-budget".to_string(),
        budget_limit_nanos: Some(100 * CENT),
        budget_period: Some("daily".to_string()),
        ..ApiKey::default()
    };
    let mut context = standard_tenant().with_api_key(&key).with_agent("writer", None);
    context.conversation_id = Some("conv-1".to_string());
    let request = estimate(90 * CENT, 500);
    let reservation = guard.reserve(&context, &request).await.map_err(|denial| format!("{denial:?}"))?;
    let headers = reservation.remaining().headers();
    assert_eq!(header(&headers, "x-br-budget-remaining"), Some("0.100000"), "the key budget is the tightest: {headers:?}");
    assert_eq!(header(&headers, "x-br-budget-warning"), Some("key_daily: 10% of the budget remains"));
    assert_eq!(header(&headers, "x-br-tokens-remaining"), None, "standard has no token cap");

    let view = reservation.settle(actual(30 * CENT)).await?;
    assert_eq!(view.budget_remaining(), Some(dollars(70 * CENT)));
    assert_eq!(view.warning(), None);

    let Some(budget_event::Kind::Settlement(settlement)) = next_event(&mut events).await?.kind else {
        return Err("expected a settlement".into());
    };
    assert_eq!(settlement.request_id, request.request_id);
    assert_eq!(
        (settlement.tenant_id.as_str(), settlement.plan.as_str(), settlement.key_id.as_deref(), settlement.agent_id.as_deref()),
        (context.tenant_id.as_str(), "standard", Some("key-budget"), Some("writer"))
    );
    assert_eq!((settlement.cost_nanos, settlement.input_tokens, settlement.output_tokens), (30 * CENT, 12, 30));
    assert_eq!(
        (settlement.outcome.as_str(), settlement.latency_ms, settlement.conversation_id.as_deref()),
        ("succeeded", 250, Some("conv-1"))
    );
    assert_eq!(settlement.model, "openai/gpt-4o-mini");
    Ok(())
}

#[tokio::test]
async fn a_dropped_reservation_is_released() -> TestResult {
    let (guard, _bus) = guard_with_bus();
    let mut context = standard_tenant();
    context.tenant_daily_limit = Some(dollars(10 * CENT));
    let reservation = reserve_ok(&guard, &context, 10 * CENT).await?;
    assert!(guard.reserve(&context, &estimate(CENT, 0)).await.is_err());
    drop(reservation);
    let scope = Scope::at(ScopeKind::TenantDaily, context.tenant_id.as_str(), Utc::now());
    for _ in 0..100 {
        if guard.counters().spent(&scope).await? == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(guard.counters().spent(&scope).await?, 0);
    reserve_ok(&guard, &context, 10 * CENT).await?.release().await?;
    Ok(())
}

#[tokio::test]
async fn a_restarted_gateway_is_seeded_with_the_ledger_totals() -> TestResult {
    let (guard, _bus) = guard_with_bus();
    let mut context = standard_tenant();
    context.tenant_daily_limit = Some(dollars(100 * CENT));
    let now = Utc::now();
    let totals = CurrentTotals {
        totals: vec![
            CounterTotal {
                kind: "tenant_daily".to_string(),
                owner: context.tenant_id.clone(),
                period_key: ScopeKind::TenantDaily.period().key_at(now),
                value: 95 * CENT,
            },
            CounterTotal { kind: "nonsense".to_string(), owner: "x".to_string(), period_key: "2026-01-01".to_string(), value: 1 },
        ],
    };
    assert_eq!(guard.seed_from_totals(&totals).await?, 1);
    assert!(guard.reserve(&context, &estimate(6 * CENT, 0)).await.is_err(), "today's spend survived the restart");
    let view = guard.remaining(&context).await?;
    assert_eq!(view.budget_remaining(), Some(dollars(5 * CENT)));
    assert!(view.warning().is_some_and(|warning| warning.starts_with("tenant_daily")));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_redis_backed_edges_share_one_budget_and_one_rate_limit() -> TestResult {
    let url = std::env::var("BR_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string());
    let prefix = format!("br-test-{}", uuid::Uuid::new_v4().simple());
    let bus: Arc<dyn EventBus> = Arc::new(InProcessBus::new());
    let first = BudgetGuard::redis(&url, &prefix, bus.clone()).await?;
    let second = BudgetGuard::redis(&url, &prefix, bus).await?;
    let key = ApiKey { id: "key-shared".to_string(), rate_limit_rpm: Some(1_000), ..ApiKey::default() };
    let mut context = standard_tenant().with_api_key(&key);
    context.tenant_daily_limit = Some(dollars(10 * CENT));
    reserve_ok(&first, &context, 4 * CENT).await?.settle(actual(4 * CENT)).await?;
    let held = reserve_ok(&second, &context, 5 * CENT).await?;
    assert_eq!(held.remaining().budget_remaining(), Some(dollars(CENT)));
    assert!(first.reserve(&context, &estimate(2 * CENT, 0)).await.is_err(), "the other edge's reservation counts");
    held.settle(actual(3 * CENT)).await?;
    reserve_ok(&first, &context, 2 * CENT).await?.release().await?;

    let limited = ApiKey { id: "key-rpm-shared".to_string(), rate_limit_rpm: Some(3), ..ApiKey::default() };
    let context = standard_tenant().with_api_key(&limited);
    for guard in [&first, &second, &first] {
        reserve_ok(guard, &context, 0).await?.release().await?;
    }
    let denial = second.reserve(&context, &estimate(0, 0)).await.err().ok_or("the shared rate limit was not applied")?;
    assert!(matches!(denial, BudgetDenial::RateLimited(limited) if limited.cap_scope.is_none()));
    Ok(())
}

#[test]
fn contexts_build_the_scopes_in_check_order() {
    let now = Utc::now();
    let key = ApiKey { id: "k".to_string(), budget_limit_nanos: Some(CENT), budget_period: None, ..ApiKey::default() };
    let limits = budget::TenantLimits {
        tenant_id: "t".to_string(),
        daily_limit_nanos: Some(CENT),
        monthly_limit_nanos: Some(2 * CENT),
        updated_at: None,
    };
    let context = BudgetContext::new("t", "sandbox").with_api_key(&key).with_tenant_limits(&limits).with_agent("a", None);
    let scopes: Vec<(ScopeKind, Option<i64>)> =
        context.scopes(now, true).into_iter().map(|ScopeLimit { scope, limit }| (scope.kind, limit)).collect();
    assert_eq!(
        scopes,
        vec![
            (ScopeKind::PlanRequestsDaily, Some(100)),
            (ScopeKind::PlanTokensDaily, Some(100_000)),
            (ScopeKind::TenantDaily, Some(CENT)),
            (ScopeKind::TenantMonthly, Some(2 * CENT)),
            (ScopeKind::KeyMonthly, Some(CENT)),
            (ScopeKind::AgentDaily, None),
        ]
    );
}

#[tokio::test]
async fn a_disconnected_stream_settles_in_the_background() -> TestResult {
    let (guard, bus) = guard_with_bus();
    let mut events = bus.subscribe(budget::SETTLEMENTS_TOPIC, "ledger").await?;
    let context = standard_tenant();
    let reservation = reserve_ok(&guard, &context, 50 * CENT).await?;
    // What a stream body's drop does when the client goes away after consuming part of the answer.
    reservation.settle_in_background(ActualUsage { outcome: Outcome::ClientDisconnected, ..actual(7 * CENT) });
    let Some(budget_event::Kind::Settlement(settlement)) = next_event(&mut events).await?.kind else {
        return Err("expected a settlement".into());
    };
    assert_eq!((settlement.cost_nanos, settlement.outcome.as_str()), (7 * CENT, "client_disconnected"));
    let scope = Scope::at(ScopeKind::TenantDaily, context.tenant_id.as_str(), Utc::now());
    assert_eq!(guard.counters().spent(&scope).await?, 7 * CENT, "the actual replaced the estimate, it was not released");
    Ok(())
}
