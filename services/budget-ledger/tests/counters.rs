//! The counters and the rate limiter, in process and on the real Redis (`BR_TEST_REDIS_URL`, default
//! `redis://127.0.0.1:6379`), each Redis test under its own random key prefix.

use std::sync::Arc;
use std::time::Duration;

use brainstorm_budget_ledger::{
    CounterError, InProcessCounters, InProcessRateLimiter, RateLimiter, RedisCounters, RedisRateLimiter, Scope, ScopeKind, ScopeLimit,
    SpendCounters, Usage, connect_redis,
};
use brainstorm_common::money::Usd;
use chrono::{Duration as ChronoDuration, Utc};
use rand::Rng;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const CENT: i64 = 10_000_000;

fn redis_url() -> String {
    std::env::var("BR_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string())
}

fn random_prefix() -> String {
    format!("br-test-{}", uuid::Uuid::new_v4().simple())
}

fn in_process() -> Vec<Arc<dyn SpendCounters>> {
    vec![Arc::new(InProcessCounters::new())]
}

/// Two instances on one prefix: two edge replicas sharing one budget.
async fn redis_replicas() -> Result<Vec<Arc<dyn SpendCounters>>, CounterError> {
    let prefix = random_prefix();
    let first = RedisCounters::new(connect_redis(&redis_url()).await?, prefix.clone());
    let second = RedisCounters::new(connect_redis(&redis_url()).await?, prefix);
    Ok(vec![Arc::new(first), Arc::new(second)])
}

fn usage(cost_nanos: i64) -> Usage {
    Usage { cost: Usd::from_nanos(cost_nanos), tokens: 0, requests: 1 }
}

fn tenant_scopes(tenant: &str, daily_limit: Option<i64>) -> Vec<ScopeLimit> {
    let now = Utc::now();
    vec![
        ScopeLimit::spend(Scope::at(ScopeKind::TenantDaily, tenant, now), daily_limit.map(Usd::from_nanos)),
        ScopeLimit::spend(Scope::at(ScopeKind::TenantMonthly, tenant, now), None),
    ]
}

macro_rules! on_both_backends {
    ($($test:ident),* $(,)?) => {
        mod in_process {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() -> super::TestResult {
                    super::$test(super::in_process()).await
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() -> super::TestResult {
                    super::$test(super::redis_replicas().await?).await
                }
            )*
        }
    };
}

on_both_backends!(
    reservations_are_all_or_nothing_across_scopes,
    settle_replaces_the_estimate_and_happens_once,
    an_exactly_used_up_budget_admits_nothing,
    periods_roll_over_by_their_keys,
    seeding_sets_only_missing_counters,
    token_and_request_caps_count_like_money,
    concurrent_reservations_never_overspend,
    underestimates_overshoot_by_at_most_the_excess_in_flight,
);

async fn reservations_are_all_or_nothing_across_scopes(counters: Vec<Arc<dyn SpendCounters>>) -> TestResult {
    let counters = &counters[0];
    let now = Utc::now();
    let tenant = Scope::at(ScopeKind::TenantDaily, "tenant-a", now);
    let key = Scope::at(ScopeKind::KeyMonthly, "key-a", now);
    let agent = Scope::at(ScopeKind::AgentDaily, Scope::agent_owner("tenant-a", "agent-1"), now);
    let scopes = vec![
        ScopeLimit::spend(tenant.clone(), Some(Usd::from_nanos(100 * CENT))),
        ScopeLimit::spend(key.clone(), Some(Usd::from_nanos(30 * CENT))),
        ScopeLimit::spend(agent.clone(), None),
    ];
    let first = counters.reserve(&scopes, usage(20 * CENT)).await?;
    assert_eq!(first.levels.iter().map(|level| level.spent).collect::<Vec<_>>(), vec![20 * CENT; 3]);
    assert_eq!(first.levels[1].remaining(), Some(10 * CENT));

    // The key would pass its limit: nothing is added anywhere.
    let refused = counters.reserve(&scopes, usage(15 * CENT)).await;
    let Err(CounterError::Exhausted(exhausted)) = refused else { return Err(format!("expected exhaustion, got {refused:?}").into()) };
    assert_eq!((exhausted.scope.clone(), exhausted.limit, exhausted.spent), (key.clone(), 30 * CENT, 20 * CENT));
    for scope in [&tenant, &key, &agent] {
        assert_eq!(counters.spent(scope).await?, 20 * CENT, "{}", scope.counter_key());
    }
    // A reservation naming one counter twice is refused outright.
    let doubled = vec![scopes[0].clone(), scopes[0].clone()];
    assert!(matches!(counters.reserve(&doubled, usage(CENT)).await, Err(CounterError::Invalid(_))));

    counters.release(&first.reservation).await?;
    for scope in [&tenant, &key, &agent] {
        assert_eq!(counters.spent(scope).await?, 0);
    }
    Ok(())
}

async fn settle_replaces_the_estimate_and_happens_once(counters: Vec<Arc<dyn SpendCounters>>) -> TestResult {
    let (first, second) = (&counters[0], counters.last().unwrap_or(&counters[0]));
    let scopes = tenant_scopes("tenant-settle", Some(100 * CENT));
    let reserved = first.reserve(&scopes, usage(10 * CENT)).await?;
    // The actual may exceed the estimate; settling through another replica works the same.
    let levels = second.settle(&reserved.reservation, usage(12 * CENT)).await?;
    assert_eq!(levels.iter().map(|level| level.spent).collect::<Vec<_>>(), vec![12 * CENT, 12 * CENT]);
    // Settling or releasing again changes nothing.
    first.settle(&reserved.reservation, usage(50 * CENT)).await?;
    first.release(&reserved.reservation).await?;
    assert_eq!(first.spent(&scopes[0].scope).await?, 12 * CENT);
    let levels = first.levels(&scopes).await?;
    assert_eq!(levels[0].remaining(), Some(88 * CENT));
    assert_eq!(levels[1].remaining(), None);
    Ok(())
}

async fn an_exactly_used_up_budget_admits_nothing(counters: Vec<Arc<dyn SpendCounters>>) -> TestResult {
    let counters = &counters[0];
    let scopes = tenant_scopes("tenant-exact", Some(10 * CENT));
    let reserved = counters.reserve(&scopes, usage(10 * CENT)).await?;
    assert_eq!(reserved.levels[0].remaining(), Some(0));
    assert!(matches!(counters.reserve(&scopes, usage(0)).await, Err(CounterError::Exhausted(_))), "not even a free request");
    counters.settle(&reserved.reservation, usage(9 * CENT)).await?;
    assert!(counters.reserve(&scopes, usage(CENT)).await.is_ok(), "the cent left is usable");
    assert!(matches!(counters.reserve(&scopes, usage(1)).await, Err(CounterError::Exhausted(_))));
    Ok(())
}

async fn periods_roll_over_by_their_keys(counters: Vec<Arc<dyn SpendCounters>>) -> TestResult {
    let counters = &counters[0];
    let now = Utc::now();
    let yesterday =
        ScopeLimit::spend(Scope::at(ScopeKind::TenantDaily, "tenant-roll", now - ChronoDuration::days(1)), Some(Usd::from_nanos(CENT)));
    let today = ScopeLimit::spend(Scope::at(ScopeKind::TenantDaily, "tenant-roll", now), Some(Usd::from_nanos(CENT)));
    assert_ne!(yesterday.scope.period_key, today.scope.period_key);
    counters.reserve(std::slice::from_ref(&yesterday), usage(CENT)).await?;
    assert!(counters.reserve(std::slice::from_ref(&yesterday), usage(1)).await.is_err());
    // Yesterday's spend does not count today.
    counters.reserve(std::slice::from_ref(&today), usage(CENT)).await?;
    assert_eq!(counters.spent(&today.scope).await?, CENT);
    Ok(())
}

async fn seeding_sets_only_missing_counters(counters: Vec<Arc<dyn SpendCounters>>) -> TestResult {
    let counters = &counters[0];
    let scopes = tenant_scopes("tenant-seed", Some(100 * CENT));
    assert!(counters.seed(&scopes[0].scope, 60 * CENT).await?);
    assert!(!counters.seed(&scopes[0].scope, 5 * CENT).await?, "an existing counter is kept");
    assert_eq!(counters.spent(&scopes[0].scope).await?, 60 * CENT);
    assert!(matches!(counters.reserve(&scopes, usage(41 * CENT)).await, Err(CounterError::Exhausted(_))));
    Ok(())
}

async fn token_and_request_caps_count_like_money(counters: Vec<Arc<dyn SpendCounters>>) -> TestResult {
    let counters = &counters[0];
    let now = Utc::now();
    let scopes = vec![
        ScopeLimit::count(Scope::at(ScopeKind::PlanRequestsDaily, "tenant-caps", now), Some(3)),
        ScopeLimit::count(Scope::at(ScopeKind::PlanTokensDaily, "tenant-caps", now), Some(1_000)),
    ];
    let estimate = Usage { cost: Usd::ZERO, tokens: 400, requests: 1 };
    let first = counters.reserve(&scopes, estimate).await?;
    counters.settle(&first.reservation, Usage { tokens: 100, ..estimate }).await?;
    let second = counters.reserve(&scopes, estimate).await?;
    assert_eq!(second.levels.iter().map(|level| level.spent).collect::<Vec<_>>(), vec![2, 500]);
    let Err(CounterError::Exhausted(tokens)) = counters.reserve(&scopes, Usage { tokens: 501, ..estimate }).await else {
        return Err("the token cap must refuse 501 more tokens".into());
    };
    assert_eq!(tokens.scope.kind, ScopeKind::PlanTokensDaily);
    counters.reserve(&scopes, Usage { tokens: 1, ..estimate }).await?;
    let Err(CounterError::Exhausted(requests)) = counters.reserve(&scopes, estimate).await else {
        return Err("the request cap must refuse a 4th".into());
    };
    assert_eq!((requests.scope.kind, requests.limit, requests.spent), (ScopeKind::PlanRequestsDaily, 3, 3));
    Ok(())
}

/// Hundreds of concurrent requests at a small budget, each reserving its estimate before the "upstream
/// call" and settling an actual at or below it: total settled spend never exceeds the limit, and every
/// scope of the all-or-nothing reservations ends at exactly the settled total.
async fn concurrent_reservations_never_overspend(counters: Vec<Arc<dyn SpendCounters>>) -> TestResult {
    let limit = 100 * CENT;
    let now = Utc::now();
    let scopes = vec![
        ScopeLimit::spend(Scope::at(ScopeKind::TenantDaily, "tenant-race", now), Some(Usd::from_nanos(limit))),
        ScopeLimit::spend(Scope::at(ScopeKind::TenantMonthly, "tenant-race", now), Some(Usd::from_nanos(10 * limit))),
        ScopeLimit::spend(Scope::at(ScopeKind::KeyDaily, "key-race", now), None),
        ScopeLimit::spend(Scope::at(ScopeKind::AgentDaily, Scope::agent_owner("tenant-race", "bot"), now), None),
    ];
    let outcomes = fire_requests(&counters, &scopes, 400, |estimate, rng| rng.random_range(estimate / 2..=estimate)).await?;
    let settled: i64 = outcomes.iter().map(|(_, actual)| actual).sum();
    assert!(settled <= limit, "settled {settled} nanos over a {limit} limit");
    assert!(outcomes.len() >= 20, "only {} requests admitted", outcomes.len());
    assert!(outcomes.len() < 400, "the budget must refuse some of the 400 requests");
    for scope in &scopes {
        assert_eq!(counters[0].spent(&scope.scope).await?, settled, "{}", scope.scope.counter_key());
    }
    Ok(())
}

/// With actuals up to twice the estimates, spend can pass the limit, but only by the excess of the
/// requests that were admitted (in flight) before the limit was reached.
async fn underestimates_overshoot_by_at_most_the_excess_in_flight(counters: Vec<Arc<dyn SpendCounters>>) -> TestResult {
    let limit = 100 * CENT;
    let scopes = tenant_scopes("tenant-under", Some(limit));
    let outcomes = fire_requests(&counters, &scopes, 300, |estimate, rng| rng.random_range(estimate..=2 * estimate)).await?;
    let settled: i64 = outcomes.iter().map(|(_, actual)| actual).sum();
    let excess: i64 = outcomes.iter().map(|(estimate, actual)| actual - estimate).sum();
    let estimated: i64 = outcomes.iter().map(|(estimate, _)| estimate).sum();
    assert!(estimated <= limit, "admitted estimates {estimated} must fit the limit");
    assert!(settled <= limit + excess, "settled {settled} over {limit} by more than the excess {excess}");
    assert_eq!(counters[0].spent(&scopes[0].scope).await?, settled);
    Ok(())
}

/// Fires `requests` concurrent reserve / wait / settle cycles (round-robin over the replicas) with
/// estimates of 1 to 5 cents; returns `(estimate, actual)` of the admitted ones.
async fn fire_requests(
    counters: &[Arc<dyn SpendCounters>],
    scopes: &[ScopeLimit],
    requests: usize,
    actual_of: fn(i64, &mut rand::rngs::ThreadRng) -> i64,
) -> Result<Vec<(i64, i64)>, CounterError> {
    let start = Arc::new(tokio::sync::Barrier::new(requests));
    let mut tasks = Vec::with_capacity(requests);
    for index in 0..requests {
        let counters = counters[index % counters.len()].clone();
        let scopes = scopes.to_vec();
        let start = start.clone();
        let (estimate, actual, pause) = {
            let mut rng = rand::rng();
            let estimate = rng.random_range(CENT..=5 * CENT);
            (estimate, actual_of(estimate, &mut rng), rng.random_range(0..5u64))
        };
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            match counters.reserve(&scopes, usage(estimate)).await {
                Ok(reserved) => {
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                    counters.settle(&reserved.reservation, usage(actual)).await?;
                    Ok(Some((estimate, actual)))
                }
                Err(CounterError::Exhausted(_)) => Ok(None),
                Err(error) => Err(error),
            }
        }));
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        let outcome = task.await.map_err(|error| CounterError::Backend(error.to_string()))??;
        outcomes.extend(outcome);
    }
    Ok(outcomes)
}

#[tokio::test]
async fn the_in_process_limiter_refuses_past_rpm() -> TestResult {
    let limiter = InProcessRateLimiter::new();
    for _ in 0..3 {
        assert!(limiter.check("key-1", 3).await?.allowed);
    }
    let refused = limiter.check("key-1", 3).await?;
    assert!(!refused.allowed);
    assert!(refused.retry_after_ms > 0 && refused.retry_after_ms <= 20_000, "{refused:?}");
    Ok(())
}

#[tokio::test]
async fn two_redis_limiters_share_one_limit() -> TestResult {
    let prefix = random_prefix();
    let first = RedisRateLimiter::new(connect_redis(&redis_url()).await?, prefix.clone());
    let second = RedisRateLimiter::new(connect_redis(&redis_url()).await?, prefix);
    let mut remaining = Vec::new();
    for index in 0..10 {
        let limiter = if index % 2 == 0 { &first } else { &second };
        let decision = limiter.check("key-shared", 10).await?;
        assert!(decision.allowed, "request {index} refused: {decision:?}");
        remaining.push(decision.remaining);
    }
    assert_eq!(remaining, (0..10).rev().collect::<Vec<u32>>());
    for limiter in [&first, &second] {
        let refused = limiter.check("key-shared", 10).await?;
        assert!(!refused.allowed);
        assert!(refused.retry_after_ms > 5_000 && refused.retry_after_ms <= 6_000, "one request every 6 s: {refused:?}");
    }
    assert!(first.check("key-other", 10).await?.allowed, "keys are independent");
    Ok(())
}

#[tokio::test]
async fn both_limiters_tell_what_a_key_uses_without_counting() -> TestResult {
    let prefix = random_prefix();
    let limiters: [Arc<dyn RateLimiter>; 2] =
        [Arc::new(InProcessRateLimiter::new()), Arc::new(RedisRateLimiter::new(connect_redis(&redis_url()).await?, prefix))];
    for limiter in limiters {
        assert_eq!(limiter.used("agent:t:planner", 30).await?, 0);
        for _ in 0..4 {
            limiter.check("agent:t:planner", 30).await?;
        }
        // 2 s per request at 30 rpm: the four just counted (three if an interval drained meanwhile).
        let used = limiter.used("agent:t:planner", 30).await?;
        assert!((3..=4).contains(&used), "{used}");
        assert_eq!(limiter.used("agent:t:planner", 30).await?, used, "reading counts nothing");
        assert_eq!(limiter.used("agent:t:other", 30).await?, 0);
    }
    Ok(())
}

#[tokio::test]
async fn scripts_survive_a_flushed_script_cache() -> TestResult {
    let connection = connect_redis(&redis_url()).await?;
    let counters = RedisCounters::new(connection.clone(), random_prefix());
    let scopes = tenant_scopes("tenant-flush", Some(10 * CENT));
    counters.reserve(&scopes, usage(CENT)).await?;
    // A restarted Redis has no scripts: EVALSHA answers NOSCRIPT and the call falls back to EVAL (other
    // tests running meanwhile see the same flush).
    let mut admin = connection;
    ::redis::cmd("SCRIPT").arg("FLUSH").query_async::<()>(&mut admin).await?;
    let reserved = counters.reserve(&scopes, usage(CENT)).await?;
    assert_eq!(reserved.levels[0].spent, 2 * CENT);
    ::redis::cmd("SCRIPT").arg("FLUSH").query_async::<()>(&mut admin).await?;
    counters.settle(&reserved.reservation, usage(3 * CENT)).await?;
    assert_eq!(counters.spent(&scopes[0].scope).await?, 4 * CENT);
    Ok(())
}

#[tokio::test]
async fn redis_counters_expire_with_their_period() -> TestResult {
    let prefix = random_prefix();
    let mut connection = connect_redis(&redis_url()).await?;
    let counters = RedisCounters::new(connection.clone(), prefix.clone());
    let scopes = tenant_scopes("tenant-ttl", None);
    counters.reserve(&scopes, usage(CENT)).await?;
    let key = format!("{prefix}:c:{}", scopes[0].scope.counter_key());
    let ttl: i64 = ::redis::cmd("TTL").arg(&key).query_async(&mut connection).await?;
    // Today's counter lives to the end of the day plus a grace day.
    assert!(ttl > 86_400 && ttl <= 2 * 86_400, "ttl {ttl}");
    let month_key = format!("{prefix}:c:{}", scopes[1].scope.counter_key());
    let month_ttl: i64 = ::redis::cmd("TTL").arg(&month_key).query_async(&mut connection).await?;
    assert!(month_ttl > 86_400 && month_ttl <= 32 * 86_400, "month ttl {month_ttl}");
    Ok(())
}

#[tokio::test]
async fn money_beyond_double_precision_stays_exact_in_redis() -> TestResult {
    let counters = RedisCounters::new(connect_redis(&redis_url()).await?, random_prefix());
    // 2^53 + 1 nano-dollars cannot be held by a double: the scripts never round through Lua numbers.
    let big = (1i64 << 53) + 1;
    let scopes = tenant_scopes("tenant-big", Some(big + 2));
    let reserved = counters.reserve(&scopes, usage(big)).await?;
    assert_eq!(reserved.levels[0].spent, big);
    assert!(counters.reserve(&scopes, usage(3)).await.is_err(), "big + 3 passes a limit of big + 2");
    assert!(counters.reserve(&scopes, usage(2)).await.is_ok(), "big + 2 fits exactly");
    counters.settle(&reserved.reservation, usage(big + 1)).await?;
    assert_eq!(counters.spent(&scopes[0].scope).await?, big + 3);
    Ok(())
}
