//! The budget-ledger service contract: spend ledger, tenant limits, agent budgets, forecasts, alerts and
//! usage; and the `budget.settlements` bus payload the edge publishes.

#[allow(clippy::all, missing_docs)]
mod v1 {
    tonic::include_proto!("brainstorm.budget.v1");
}

use v1::budget_ledger_service_client::BudgetLedgerServiceClient;
use v1::budget_ledger_service_server::BudgetLedgerServiceServer;
pub use v1::*;

/// Topic of `BudgetEvent`s (settlements and agent-budget exhaustions), keyed by tenant id.
pub const SETTLEMENTS_TOPIC: &str = "budget.settlements";

crate::grpc::service_contract! {
    service BudgetLedgerService;
    client BudgetLedgerClient;
    generated_client BudgetLedgerServiceClient;
    generated_server BudgetLedgerServiceServer;
    generated_server_trait v1::budget_ledger_service_server::BudgetLedgerService;
    methods {
        /// Spend and remaining budget of the current UTC day and month, and of the caller's key budget.
        fn get_status(GetStatusRequest) -> BudgetStatus;
        /// A tenant's own daily and monthly limits.
        fn get_limits(TenantRef) -> TenantLimits;
        /// Replaces a tenant's limits; an unset field clears that limit.
        fn set_limits(SetLimitsRequest) -> TenantLimits;
        /// One agent's budget; not found when none is configured.
        fn get_agent_budget(AgentRef) -> AgentBudget;
        /// Creates or replaces one agent's budget.
        fn put_agent_budget(PutAgentBudgetRequest) -> AgentBudget;
        /// A tenant's per-agent limits (version 0, none, when never written).
        fn get_agent_limits(TenantRef) -> AgentLimits;
        /// Replaces or merges a tenant's per-agent limits; the version moves by one per write.
        fn write_agent_limits(WriteAgentLimitsRequest) -> AgentLimits;
        /// Every agent with a budget or spend: configuration, status and the leaderboard.
        fn list_agents(ListAgentsRequest) -> AgentsView;
        /// Forecast from up to 30 days of daily spend.
        fn get_forecast(GetForecastRequest) -> Forecast;
        /// The tenant's alert configuration (defaults when never configured).
        fn get_alert_config(TenantRef) -> AlertConfig;
        /// Replaces the tenant's alert configuration.
        fn put_alert_config(PutAlertConfigRequest) -> AlertConfig;
        /// Fired alerts, newest first.
        fn list_alerts(ListAlertsRequest) -> AlertList;
        /// Spend, requests and tokens grouped by model, provider, key, agent or day.
        fn get_usage_summary(UsageSummaryRequest) -> UsageSummary;
        /// One page of a tenant's settled requests, newest first.
        fn list_settled_requests(SettledRequestsQuery) -> SettledRequestPage;
        /// Per-model outcomes, latency and throughput of a tenant's settlements.
        fn get_model_stats(ModelStatsRequest) -> ModelStatsList;
        /// Current-period totals of every counter, to seed a restarted gateway's counters.
        fn get_current_totals(CurrentTotalsRequest) -> CurrentTotals;
        /// Records one budget event idempotently (the consumer's path, for edges without a shared bus).
        fn record_event(BudgetEvent) -> RecordEventResponse;
        /// Records budget events idempotently, settlements in one transaction; refused whole when one is invalid.
        fn record_events(BudgetEventBatch) -> RecordEventsResponse;
    }
}
