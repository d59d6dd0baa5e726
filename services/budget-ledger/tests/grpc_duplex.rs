//! The budget-ledger contract over real tonic gRPC, on an in-memory duplex transport (no ports opened).

use brainstorm_budget_ledger::{BudgetLedgerOptions, BudgetLedgerServiceImpl};
use brainstorm_common::store::testing;
use brainstorm_common::time::now_timestamp;
use brainstorm_proto::ErrorKind;
use brainstorm_proto::budget::*;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const USD: i64 = 1_000_000_000;

async fn remote_ledger() -> Result<BudgetLedgerClient, Box<dyn std::error::Error>> {
    let database = testing::fresh_sqlite().await?;
    let local = BudgetLedgerClient::local(BudgetLedgerServiceImpl::new(database, BudgetLedgerOptions::default()));

    Ok(local.over_grpc_duplex().await?)
}

#[tokio::test]
async fn calls_and_errors_cross_the_grpc_hop_intact() -> TestResult {
    let ledger = remote_ledger().await?;
    let tenant_id = uuid::Uuid::new_v4().to_string();

    let settlement = Settlement {
        request_id: "req_over_the_wire".to_string(),
        tenant_id: tenant_id.clone(),
        plan: "standard".to_string(),
        model: "openai/gpt-4o-mini".to_string(),
        provider: "openai".to_string(),
        cost_nanos: 3 * USD / 2,
        outcome: "succeeded".to_string(),
        occurred_at: now_timestamp(),
        ..Settlement::default()
    };
    let event = BudgetEvent { kind: Some(budget_event::Kind::Settlement(settlement)) };
    assert!(ledger.record_event(event.clone()).await?.recorded);
    assert!(!ledger.record_event(event).await?.recorded, "idempotent across the hop");

    let limits = ledger
        .set_limits(SetLimitsRequest { tenant_id: tenant_id.clone(), daily_limit_nanos: Some(2 * USD), monthly_limit_nanos: None })
        .await?;
    assert_eq!((limits.daily_limit_nanos, limits.monthly_limit_nanos), (Some(2 * USD), None));
    let status =
        ledger.get_status(GetStatusRequest { tenant_id: tenant_id.clone(), plan: "standard".to_string(), ..Default::default() }).await?;
    let daily = status.daily.ok_or("no daily status")?;
    assert_eq!((daily.spent_nanos, daily.limit_nanos, daily.remaining_nanos), (3 * USD / 2, Some(2 * USD), Some(USD / 2)));
    assert_eq!(status.monthly.and_then(|monthly| monthly.limit_nanos), None, "an unset optional stays unset over the wire");

    let agent = ledger
        .put_agent_budget(PutAgentBudgetRequest {
            tenant_id: tenant_id.clone(),
            agent_id: "planner".to_string(),
            per_day_nanos: USD,
            exhaustion_action: "downgrade".to_string(),
        })
        .await?;
    assert_eq!(ledger.get_agent_budget(AgentRef { tenant_id: tenant_id.clone(), agent_id: "planner".to_string() }).await?, agent);
    let forecast = ledger.get_forecast(GetForecastRequest { tenant_id: tenant_id.clone(), plan: "standard".to_string() }).await?;
    assert_eq!(forecast.days_of_data, 1);
    let config = ledger.get_alert_config(TenantRef { tenant_id: tenant_id.clone() }).await?;
    assert_eq!(config.thresholds, vec![80, 90, 95]);
    let totals = ledger.get_current_totals(CurrentTotalsRequest::default()).await?;
    assert!(totals.totals.iter().any(|total| total.kind == "tenant_daily" && total.value == 3 * USD / 2));

    let missing =
        ledger.get_agent_budget(AgentRef { tenant_id: tenant_id.clone(), agent_id: "nobody".to_string() }).await.err().ok_or("found")?;
    assert_eq!((missing.kind, missing.reason.as_str()), (ErrorKind::NotFound, "agent_budget_not_found"));
    let invalid = ledger
        .put_alert_config(PutAlertConfigRequest { tenant_id, thresholds: vec![0], webhook_url: None, enabled: false })
        .await
        .err()
        .ok_or("threshold 0 accepted")?;
    assert_eq!((invalid.kind, invalid.reason.as_str()), (ErrorKind::InvalidArgument, "invalid_thresholds"));
    Ok(())
}

#[tokio::test]
async fn a_batch_of_events_is_recorded_once_across_the_hop() -> TestResult {
    let ledger = remote_ledger().await?;
    let tenant_id = uuid::Uuid::new_v4().to_string();
    let settlement = |request_id: &str, cost_nanos: i64| BudgetEvent {
        kind: Some(budget_event::Kind::Settlement(Settlement {
            request_id: request_id.to_string(),
            tenant_id: tenant_id.clone(),
            plan: "standard".to_string(),
            model: "openai/gpt-4o-mini".to_string(),
            provider: "openai".to_string(),
            cost_nanos,
            outcome: "succeeded".to_string(),
            occurred_at: now_timestamp(),
            ..Settlement::default()
        })),
    };
    assert!(ledger.record_event(settlement("req_batch_1", USD)).await?.recorded);
    // A redelivered settlement and two new ones: one flag each, in the batch's order.
    let batch = BudgetEventBatch {
        events: vec![settlement("req_batch_1", USD), settlement("req_batch_2", USD), settlement("req_batch_3", USD / 2)],
    };
    assert_eq!(ledger.record_events(batch).await?.recorded, vec![false, true, true]);
    let status =
        ledger.get_status(GetStatusRequest { tenant_id: tenant_id.clone(), plan: "standard".to_string(), ..Default::default() }).await?;
    assert_eq!(status.daily.map(|daily| daily.spent_nanos), Some(5 * USD / 2), "each settlement counted once");

    // One invalid event refuses the whole batch, naming it; nothing of it is recorded.
    let empty = BudgetEvent { kind: None };
    let error = ledger
        .record_events(BudgetEventBatch { events: vec![settlement("req_batch_4", USD), empty] })
        .await
        .err()
        .ok_or("must be refused")?;
    assert_eq!(error.kind, ErrorKind::InvalidArgument);
    assert!(error.message.contains("events[1]"), "{}", error.message);
    assert!(ledger.record_event(settlement("req_batch_4", USD)).await?.recorded, "the refused batch recorded nothing");
    Ok(())
}
