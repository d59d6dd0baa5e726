//! Hot-path counters: all-or-nothing reservations across budget scopes, in process or in Redis.
//!
//! A counter holds what a scope has spent in its period *including amounts in flight*: `reserve` adds
//! the estimate to every scope of the request at once, or to none when any scope would pass its limit;
//! `settle` replaces the estimate with the actual amount (which may be larger); `release` takes the
//! estimate back. A reservation is settled or released at most once; repeating either is a no-op.
//!
//! Admission rule, the same in both implementations: a scope with a limit admits `amount` when
//! `spent + amount <= limit` and `spent < limit` (an exactly used-up budget admits nothing, not even a
//! free request).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use brainstorm_common::money::Usd;
use chrono::{DateTime, Duration, Utc};

use crate::period::{Period, counter_ttl_seconds};

/// How long an unsettled reservation is remembered; after that, settling it is a no-op and its
/// estimate stays counted (the safe direction: a crashed edge can overcount, never overspend).
pub const RESERVATION_TTL_SECONDS: i64 = 48 * 3600;

/// What a counter counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Meter {
    /// Nano-dollars.
    Spend,
    Tokens,
    Requests,
}

/// The kinds of budget scope a request is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScopeKind {
    TenantDaily,
    TenantMonthly,
    KeyDaily,
    KeyMonthly,
    AgentDaily,
    /// The plan's daily token cap (sandbox: 100K tokens a day).
    PlanTokensDaily,
    /// The plan's daily request cap (sandbox: 100 requests a day).
    PlanRequestsDaily,
}

impl ScopeKind {
    /// Every kind, for parsing.
    pub const ALL: [ScopeKind; 7] = [
        ScopeKind::TenantDaily,
        ScopeKind::TenantMonthly,
        ScopeKind::KeyDaily,
        ScopeKind::KeyMonthly,
        ScopeKind::AgentDaily,
        ScopeKind::PlanTokensDaily,
        ScopeKind::PlanRequestsDaily,
    ];

    /// The stable name used in counter keys, denials and `CounterTotal.kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            ScopeKind::TenantDaily => "tenant_daily",
            ScopeKind::TenantMonthly => "tenant_monthly",
            ScopeKind::KeyDaily => "key_daily",
            ScopeKind::KeyMonthly => "key_monthly",
            ScopeKind::AgentDaily => "agent_daily",
            ScopeKind::PlanTokensDaily => "plan_tokens_daily",
            ScopeKind::PlanRequestsDaily => "plan_requests_daily",
        }
    }

    /// Reads a name written by `as_str`.
    pub fn parse(text: &str) -> Option<ScopeKind> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == text)
    }

    /// What the scope counts.
    pub fn meter(self) -> Meter {
        match self {
            ScopeKind::TenantDaily | ScopeKind::TenantMonthly | ScopeKind::KeyDaily | ScopeKind::KeyMonthly | ScopeKind::AgentDaily => {
                Meter::Spend
            }
            ScopeKind::PlanTokensDaily => Meter::Tokens,
            ScopeKind::PlanRequestsDaily => Meter::Requests,
        }
    }

    /// The period the scope resets with.
    pub fn period(self) -> Period {
        match self {
            ScopeKind::TenantMonthly | ScopeKind::KeyMonthly => Period::Monthly,
            ScopeKind::TenantDaily
            | ScopeKind::KeyDaily
            | ScopeKind::AgentDaily
            | ScopeKind::PlanTokensDaily
            | ScopeKind::PlanRequestsDaily => Period::Daily,
        }
    }

    /// The key scope of a key budget of `period`.
    pub fn key_scope(period: Period) -> ScopeKind {
        match period {
            Period::Daily => ScopeKind::KeyDaily,
            Period::Monthly => ScopeKind::KeyMonthly,
        }
    }
}

impl fmt::Display for ScopeKind {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// One counter: a kind of scope, its owner and its period. Cloned several times per request (the
/// reservation keeps its scopes, each level names its scope), so its texts are shared, not copied.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    pub kind: ScopeKind,
    /// Tenant id (tenant and plan scopes), key id (key scopes) or `<tenant id>/<agent id>` (agents).
    pub owner: Arc<str>,
    /// `2026-11-22` or `2026-11`, by the kind's period.
    pub period_key: Arc<str>,
}

impl Scope {
    /// The scope of `kind` owned by `owner`, in the period containing `now`.
    pub fn at(kind: ScopeKind, owner: impl Into<Arc<str>>, now: DateTime<Utc>) -> Self {
        Scope { kind, owner: owner.into(), period_key: kind.period().key_at(now).into() }
    }

    /// The owner of an agent's scopes: agent ids are unique within a tenant only.
    pub fn agent_owner(tenant_id: &str, agent_id: &str) -> String {
        format!("{tenant_id}/{agent_id}")
    }

    /// `<kind>:<owner>:<period key>`, unique per counter (owners never contain `:`-separated kinds).
    pub fn counter_key(&self) -> String {
        format!("{}:{}:{}", self.kind.as_str(), self.owner, self.period_key)
    }
}

/// A scope and its limit, in the unit of the scope's meter; `None` counts without limiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeLimit {
    pub scope: Scope,
    pub limit: Option<i64>,
}

impl ScopeLimit {
    /// A money scope.
    pub fn spend(scope: Scope, limit: Option<Usd>) -> Self {
        debug_assert_eq!(scope.kind.meter(), Meter::Spend);
        ScopeLimit { scope, limit: limit.map(Usd::nanos) }
    }

    /// A token or request scope.
    pub fn count(scope: Scope, limit: Option<i64>) -> Self {
        debug_assert_ne!(scope.kind.meter(), Meter::Spend);
        ScopeLimit { scope, limit }
    }
}

/// What one request reserves or settles, per meter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub cost: Usd,
    pub tokens: i64,
    pub requests: i64,
}

impl Usage {
    /// The amount of this usage a scope of `meter` counts.
    pub fn amount_for(&self, meter: Meter) -> i64 {
        match meter {
            Meter::Spend => self.cost.nanos(),
            Meter::Tokens => self.tokens,
            Meter::Requests => self.requests,
        }
    }
}

/// A scope's counter as it stands (spent includes amounts in flight).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeLevel {
    pub scope: Scope,
    pub limit: Option<i64>,
    pub spent: i64,
}

impl ScopeLevel {
    /// `max(0, limit - spent)`, or None without a limit.
    pub fn remaining(&self) -> Option<i64> {
        self.limit.map(|limit| limit.saturating_sub(self.spent).max(0))
    }
}

/// A reservation: its id, the scopes it was counted in and the amounts reserved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationId {
    id: String,
    scopes: Vec<ScopeLimit>,
    amount: Usage,
}

impl ReservationId {
    pub(crate) fn new(scopes: &[ScopeLimit], amount: Usage) -> Self {
        ReservationId { id: uuid::Uuid::now_v7().simple().to_string(), scopes: scopes.to_vec(), amount }
    }

    /// The opaque id.
    pub fn as_str(&self) -> &str {
        &self.id
    }

    /// The scopes the reservation is counted in.
    pub fn scopes(&self) -> &[ScopeLimit] {
        &self.scopes
    }

    /// What was reserved.
    pub fn amount(&self) -> Usage {
        self.amount
    }

    /// Per scope, what settling with `actual` adds to its counter (actual minus reserved).
    pub(crate) fn deltas(&self, actual: Usage) -> Vec<i64> {
        self.scopes
            .iter()
            .map(|scope| {
                let meter = scope.scope.kind.meter();
                actual.amount_for(meter).saturating_sub(self.amount.amount_for(meter))
            })
            .collect()
    }
}

/// A successful reservation and the levels of its scopes right after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserved {
    pub reservation: ReservationId,
    pub levels: Vec<ScopeLevel>,
}

/// The scope that refused a reservation: its limit and what it had spent (in flight included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exhausted {
    pub scope: Scope,
    pub limit: i64,
    pub spent: i64,
}

/// Why a counter operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CounterError {
    #[error("budget scope `{}` is exhausted: {} spent of {}", .0.scope.counter_key(), .0.spent, .0.limit)]
    Exhausted(Exhausted),
    #[error("invalid reservation: {0}")]
    Invalid(String),
    #[error("counter backend error: {0}")]
    Backend(String),
}

/// The hot-path counters, shared by every request of a gateway (and, in Redis, by every replica).
#[async_trait]
pub trait SpendCounters: Send + Sync + 'static {
    /// Adds `amount` to every scope atomically, or to none: `Exhausted` names the first scope (in the
    /// order given) whose limit it would pass.
    async fn reserve(&self, scopes: &[ScopeLimit], amount: Usage) -> Result<Reserved, CounterError>;
    /// Replaces the reserved amount with `actual` in every scope of the reservation; a no-op when the
    /// reservation was already settled or released. Returns the scopes' levels afterwards.
    async fn settle(&self, reservation: &ReservationId, actual: Usage) -> Result<Vec<ScopeLevel>, CounterError>;
    /// Takes the reserved amount back (the upstream call failed); a no-op when already settled.
    async fn release(&self, reservation: &ReservationId) -> Result<(), CounterError>;
    /// What a scope has spent in its period, amounts in flight included.
    async fn spent(&self, scope: &Scope) -> Result<i64, CounterError>;
    /// The levels of several scopes at once.
    async fn levels(&self, scopes: &[ScopeLimit]) -> Result<Vec<ScopeLevel>, CounterError>;
    /// Sets a scope's counter to `value` unless the counter already exists (rebuilding a restarted
    /// gateway's counters from the ledger); true when it was set.
    async fn seed(&self, scope: &Scope, value: i64) -> Result<bool, CounterError>;
}

/// Refuses a reservation that names one counter twice: each check must see every increment.
pub(crate) fn validate_scopes(scopes: &[ScopeLimit], amount: Usage) -> Result<(), CounterError> {
    // A request names a handful of scopes: comparing them pairwise beats hashing them.
    for (index, scope) in scopes.iter().enumerate() {
        if scopes[..index].iter().any(|earlier| earlier.scope == scope.scope) {
            return Err(CounterError::Invalid(format!("scope `{}` appears twice", scope.scope.counter_key())));
        }
        if amount.amount_for(scope.scope.kind.meter()) < 0 {
            return Err(CounterError::Invalid("a reservation cannot be negative".to_string()));
        }
    }
    Ok(())
}

/// Whether a scope at `spent` admits `amount` more under `limit` (see the module docs).
pub(crate) fn admits(spent: i64, amount: i64, limit: Option<i64>) -> bool {
    match limit {
        None => true,
        Some(limit) => spent < limit && spent.saturating_add(amount) <= limit,
    }
}

/// The embedded counters: one mutex over every counter makes each operation atomic.
pub struct InProcessCounters {
    state: Mutex<CounterState>,
}

#[derive(Default)]
struct CounterState {
    /// Keyed by the scope itself: a lookup on the request path formats nothing. Hashed with
    /// foldhash's seeded quality hasher: several lookups per request, on keys that include
    /// client-chosen agent ids, so fast and still randomly seeded per process (SipHash cost about
    /// 2% of a request's instructions).
    counters: HashMap<Scope, Counter, foldhash::quality::RandomState>,
    /// Unsettled reservations and when they are forgotten.
    reservations: HashMap<String, DateTime<Utc>, foldhash::quality::RandomState>,
    last_sweep: Option<DateTime<Utc>>,
}

struct Counter {
    value: i64,
    expires_at: DateTime<Utc>,
}

impl Default for InProcessCounters {
    fn default() -> Self {
        Self::new()
    }
}

impl InProcessCounters {
    /// Empty counters.
    pub fn new() -> Self {
        InProcessCounters { state: Mutex::new(CounterState::default()) }
    }

    fn state(&self) -> MutexGuard<'_, CounterState> {
        // Every update completes before the guard drops, so a poisoned state is still consistent.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl CounterState {
    fn value(&self, scope: &Scope, now: DateTime<Utc>) -> i64 {
        self.counters.get(scope).filter(|counter| counter.expires_at > now).map_or(0, |counter| counter.value)
    }

    fn add(&mut self, scope: &Scope, delta: i64, now: DateTime<Utc>) -> i64 {
        // A live counter's expiry is already set: the period key is parsed only for a new one.
        let fresh = || Counter { value: 0, expires_at: now + Duration::seconds(counter_ttl_seconds(&scope.period_key, now)) };
        let counter = match self.counters.get_mut(scope) {
            Some(counter) => counter,
            None => self.counters.entry(scope.clone()).or_insert_with(fresh),
        };
        if counter.expires_at <= now {
            *counter = fresh();
        }
        counter.value = counter.value.saturating_add(delta);
        counter.value
    }

    /// Forgets expired counters and reservations, at most once a minute.
    fn sweep(&mut self, now: DateTime<Utc>) {
        if self.last_sweep.is_some_and(|last| now - last < Duration::seconds(60)) {
            return;
        }
        self.last_sweep = Some(now);
        self.counters.retain(|_, counter| counter.expires_at > now);
        self.reservations.retain(|_, expires_at| *expires_at > now);
    }

    fn levels(&self, scopes: &[ScopeLimit], now: DateTime<Utc>) -> Vec<ScopeLevel> {
        scopes
            .iter()
            .map(|scope| ScopeLevel { scope: scope.scope.clone(), limit: scope.limit, spent: self.value(&scope.scope, now) })
            .collect()
    }
}

#[async_trait]
impl SpendCounters for InProcessCounters {
    async fn reserve(&self, scopes: &[ScopeLimit], amount: Usage) -> Result<Reserved, CounterError> {
        validate_scopes(scopes, amount)?;
        let now = Utc::now();
        let mut state = self.state();
        state.sweep(now);
        for scope in scopes {
            let spent = state.value(&scope.scope, now);
            if !admits(spent, amount.amount_for(scope.scope.kind.meter()), scope.limit) {
                let limit = scope.limit.unwrap_or(i64::MAX);
                return Err(CounterError::Exhausted(Exhausted { scope: scope.scope.clone(), limit, spent }));
            }
        }
        for scope in scopes {
            state.add(&scope.scope, amount.amount_for(scope.scope.kind.meter()), now);
        }
        let reservation = ReservationId::new(scopes, amount);
        state.reservations.insert(reservation.id.clone(), now + Duration::seconds(RESERVATION_TTL_SECONDS));
        let levels = state.levels(scopes, now);
        Ok(Reserved { reservation, levels })
    }

    async fn settle(&self, reservation: &ReservationId, actual: Usage) -> Result<Vec<ScopeLevel>, CounterError> {
        let now = Utc::now();
        let mut state = self.state();
        if state.reservations.remove(&reservation.id).is_some_and(|expires_at| expires_at > now) {
            for (scope, delta) in reservation.scopes.iter().zip(reservation.deltas(actual)) {
                state.add(&scope.scope, delta, now);
            }
        }
        Ok(state.levels(&reservation.scopes, now))
    }

    async fn release(&self, reservation: &ReservationId) -> Result<(), CounterError> {
        self.settle(reservation, Usage::default()).await.map(|_| ())
    }

    async fn spent(&self, scope: &Scope) -> Result<i64, CounterError> {
        Ok(self.state().value(scope, Utc::now()))
    }

    async fn levels(&self, scopes: &[ScopeLimit]) -> Result<Vec<ScopeLevel>, CounterError> {
        Ok(self.state().levels(scopes, Utc::now()))
    }

    async fn seed(&self, scope: &Scope, value: i64) -> Result<bool, CounterError> {
        let now = Utc::now();
        let mut state = self.state();
        if state.counters.get(scope).is_some_and(|counter| counter.expires_at > now) {
            return Ok(false);
        }
        state.counters.remove(scope);
        state.add(scope, value, now);
        Ok(true)
    }
}
