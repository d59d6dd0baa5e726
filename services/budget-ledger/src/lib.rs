//! The budget ledger: the hot-path mechanism the edge calls per request (`BudgetGuard` over
//! `SpendCounters` and a `RateLimiter`, in process or in Redis) and the budget-ledger service (the
//! durable spend ledger, tenant limits, agent budgets, forecasts, alerts and usage) over its store.

pub mod alerts;
pub mod consumer;
pub mod counters;
pub mod forecast;
pub mod guard;
pub mod period;
pub mod plans;
pub mod rate_limit;
pub mod redis_backend;
mod service;
pub mod store;

pub use alerts::WebhookOptions;
pub use consumer::{CONSUMER_GROUP, Handled, SettlementConsumer, spawn_settlement_consumer};
pub use counters::{
    CounterError, Exhausted, InProcessCounters, Meter, ReservationId, Scope, ScopeKind, ScopeLevel, ScopeLimit, SpendCounters, Usage,
};
pub use guard::{
    ActualUsage, AgentBudgetLimit, AgentContext, BudgetContext, BudgetDenial, BudgetExceeded, BudgetGuard, Estimate, ExhaustionAction,
    KeyBudgetLimit, Outcome, RateLimited, RemainingView, Reservation,
};
pub use period::Period;
pub use plans::Plan;
pub use rate_limit::{InProcessRateLimiter, RateDecision, RateLimiter};
pub use redis_backend::{RedisCounters, RedisRateLimiter, connect_redis};
pub use service::{BudgetLedgerOptions, BudgetLedgerServiceImpl, Clock};
