//! Feeds the anomaly detector from `budget.settlements`, so no request pays for it: every settled
//! request gives `cost_usd` and `tokens` observations for its tenant, key and agent, and per-minute
//! windows give `request_rate` and `errors` when a minute closes (quiet minutes in between count as
//! zero, up to an hour of them).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use brainstorm_common::bus::{BusError, EventBus, Subscription};
use brainstorm_common::time::{format_timestamp, parse_timestamp};
use brainstorm_proto::budget::{BudgetEvent, SETTLEMENTS_TOPIC, Settlement, budget_event};
use brainstorm_proto::policy::{Observation, ObservationBatch, PolicyFirewallService};
use chrono::{DateTime, TimeZone, Utc};
use prost::Message;

use crate::service::PolicyFirewallServiceImpl;

/// The policy firewall's consumer group on `budget.settlements`.
pub const CONSUMER_GROUP: &str = "policy-firewall";

/// Quiet minutes reported as zero when a window closes after a gap.
const MAX_QUIET_MINUTES: i64 = 60;
const NANOS_PER_USD: f64 = 1_000_000_000.0;

/// Requests and errors of one entity in one minute.
#[derive(Debug, Clone, Copy)]
struct Window {
    minute: i64,
    requests: u64,
    errors: u64,
}

/// Turns settlements into observations (keeps the open per-minute windows).
#[derive(Debug, Default)]
pub struct AnomalyFeed {
    windows: HashMap<(String, String, String), Window>,
}

impl AnomalyFeed {
    /// The observations one settlement gives (its tenant's), per-request ones first.
    pub fn observe(&mut self, settlement: &Settlement) -> Vec<Observation> {
        let occurred = parse_timestamp(&settlement.occurred_at).unwrap_or_else(Utc::now);
        let timestamp = format_timestamp(occurred);
        let minute = occurred.timestamp().div_euclid(60);
        let failed = settlement.outcome == "failed";
        let mut entities = vec![("tenant", settlement.tenant_id.clone())];
        if let Some(key_id) = settlement.key_id.as_ref().filter(|key_id| !key_id.is_empty()) {
            entities.push(("key", key_id.clone()));
        }
        if let Some(agent_id) = settlement.agent_id.as_ref().filter(|agent_id| !agent_id.is_empty()) {
            entities.push(("agent", agent_id.clone()));
        }
        let mut observations = Vec::new();
        for (entity_type, entity_id) in entities {
            let observation = |metric: &str, value: f64, timestamp: &str| Observation {
                entity_type: entity_type.to_string(),
                entity_id: entity_id.clone(),
                metric: metric.to_string(),
                value,
                timestamp: timestamp.to_string(),
            };
            observations.push(observation("cost_usd", settlement.cost_nanos as f64 / NANOS_PER_USD, &timestamp));
            observations.push(observation("tokens", (settlement.input_tokens + settlement.output_tokens) as f64, &timestamp));
            let key = (settlement.tenant_id.clone(), entity_type.to_string(), entity_id.clone());
            let window = self.windows.entry(key).or_insert(Window { minute, requests: 0, errors: 0 });
            if minute > window.minute {
                let closed_at = minute_timestamp(window.minute);
                observations.push(observation("request_rate", window.requests as f64, &closed_at));
                observations.push(observation("errors", window.errors as f64, &closed_at));
                for quiet in (window.minute + 1..minute).take(MAX_QUIET_MINUTES as usize) {
                    let quiet_at = minute_timestamp(quiet);
                    observations.push(observation("request_rate", 0.0, &quiet_at));
                    observations.push(observation("errors", 0.0, &quiet_at));
                }
                *window = Window { minute, requests: 0, errors: 0 };
            }
            // A late settlement counts in the open window: close enough for a rate.
            window.requests += 1;
            window.errors += u64::from(failed);
        }
        observations
    }
}

fn minute_timestamp(minute: i64) -> String {
    let instant: DateTime<Utc> = Utc.timestamp_opt(minute * 60, 0).single().unwrap_or_else(Utc::now);
    format_timestamp(instant)
}

/// A subscribed consumer; `subscribe` before the edges start so no settlement is missed.
pub struct AnomalyConsumer {
    subscription: Box<dyn Subscription>,
    service: PolicyFirewallServiceImpl,
    feed: AnomalyFeed,
}

impl AnomalyConsumer {
    /// Joins the policy firewall's group on `budget.settlements`.
    pub async fn subscribe(bus: &Arc<dyn EventBus>, service: PolicyFirewallServiceImpl) -> Result<Self, BusError> {
        let subscription = bus.subscribe(SETTLEMENTS_TOPIC, CONSUMER_GROUP).await?;
        Ok(AnomalyConsumer { subscription, service, feed: AnomalyFeed::default() })
    }

    /// Handles deliveries until `shutdown` completes or the bus closes.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                handled = self.handle_next() => if let Err(error) = handled {
                    tracing::error!(%error, "anomaly consumer stopped: the bus failed");
                    break;
                },
            }
        }
    }

    /// Waits for one delivery and feeds it to the detector; returns how many alerts it raised. The
    /// detector lives in memory, so every delivery is acked (there is nothing to retry).
    pub async fn handle_next(&mut self) -> Result<usize, BusError> {
        let delivery = self.subscription.next().await?;
        let event = BudgetEvent::decode(delivery.message().payload.clone());
        delivery.ack();
        let settlement = match event {
            Ok(BudgetEvent { kind: Some(budget_event::Kind::Settlement(settlement)) }) => settlement,
            Ok(_) => return Ok(0),
            Err(error) => {
                tracing::warn!(%error, "skipping an undecodable budget event");
                return Ok(0);
            }
        };
        if settlement.tenant_id.is_empty() {
            return Ok(0);
        }
        let observations = self.feed.observe(&settlement);
        let batch = ObservationBatch { tenant_id: settlement.tenant_id.clone(), observations };
        match self.service.record_observations(batch).await {
            Ok(alerts) => Ok(alerts.alerts.len()),
            Err(error) => {
                tracing::warn!(%error, "could not feed the anomaly detector");
                Ok(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settlement(seconds: i64, cost_nanos: i64, outcome: &str) -> Settlement {
        Settlement {
            request_id: format!("req_{seconds}"),
            tenant_id: "t".to_string(),
            key_id: Some("key-1".to_string()),
            agent_id: None,
            input_tokens: 10,
            output_tokens: 30,
            cost_nanos,
            outcome: outcome.to_string(),
            occurred_at: format_timestamp(Utc.timestamp_opt(1_800_000_000 + seconds, 0).single().unwrap_or_else(Utc::now)),
            ..Settlement::default()
        }
    }

    fn metric_values(observations: &[Observation], entity_type: &str, metric: &str) -> Vec<f64> {
        observations
            .iter()
            .filter(|observation| observation.entity_type == entity_type && observation.metric == metric)
            .map(|observation| observation.value)
            .collect()
    }

    #[test]
    fn settlements_become_per_request_and_per_minute_observations() {
        let mut feed = AnomalyFeed::default();
        // 1_800_000_000 is 00:00 into a minute; three requests in the first minute, one failed.
        let first = feed.observe(&settlement(0, 2_500_000_000, "succeeded"));
        assert_eq!(metric_values(&first, "tenant", "cost_usd"), vec![2.5]);
        assert_eq!(metric_values(&first, "key", "tokens"), vec![40.0]);
        assert!(metric_values(&first, "tenant", "request_rate").is_empty(), "the minute is still open");
        feed.observe(&settlement(10, 1, "failed"));
        feed.observe(&settlement(20, 1, "succeeded"));
        // Three minutes later: the first minute closes with 3 requests and 1 error, two quiet minutes follow.
        let later = feed.observe(&settlement(200, 1, "succeeded"));
        assert_eq!(metric_values(&later, "tenant", "request_rate"), vec![3.0, 0.0, 0.0]);
        assert_eq!(metric_values(&later, "tenant", "errors"), vec![1.0, 0.0, 0.0]);
        assert_eq!(metric_values(&later, "key", "request_rate"), vec![3.0, 0.0, 0.0]);
        assert!(metric_values(&later, "agent", "cost_usd").is_empty(), "no agent on these requests");
    }

    #[test]
    fn a_long_gap_reports_at_most_an_hour_of_quiet_minutes() {
        let mut feed = AnomalyFeed::default();
        feed.observe(&settlement(0, 1, "succeeded"));
        let later = feed.observe(&settlement(60 * 60 * 24, 1, "succeeded"));
        assert_eq!(metric_values(&later, "tenant", "request_rate").len(), 1 + 60);
    }
}
