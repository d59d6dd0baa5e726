//! Feeds the anomaly detector from `budget.settlements`, so no request pays for it: every settled
//! request gives `cost_usd` and `tokens` observations for its tenant, key and agent, and per-minute
//! windows give `request_rate` and `errors` when a minute closes (quiet minutes in between count as
//! zero, up to an hour of them). Deliveries are taken in batches, one detector call per tenant.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use brainstorm_common::bus::{BusError, EventBus, Subscription, next_batch, share_thread};
use brainstorm_common::time::{format_timestamp, parse_timestamp};
use brainstorm_proto::budget::{BudgetEvent, SETTLEMENTS_TOPIC, Settlement, budget_event};
use brainstorm_proto::policy::{Observation, ObservationBatch, PolicyFirewallService};
use chrono::{DateTime, TimeZone, Utc};

use crate::service::{MAX_OBSERVATIONS, PolicyFirewallServiceImpl};

/// The policy firewall's consumer group on `budget.settlements`.
pub const CONSUMER_GROUP: &str = "policy-firewall";

/// Quiet minutes reported as zero when a window closes after a gap.
const MAX_QUIET_MINUTES: i64 = 60;
/// The most observations one settlement gives: three entities, each two per-request values and,
/// when its minute closes, two per closed and quiet minute.
const MAX_PER_SETTLEMENT: usize = 3 * (2 + 2 * (1 + MAX_QUIET_MINUTES as usize));
/// Settlements fed to the detector per batch, and how long a batch waits for more (as the ledger's
/// consumer of the same topic does).
const MAX_BATCH: usize = 1024;
const LINGER: Duration = Duration::from_millis(25);
const NANOS_PER_USD: f64 = 1_000_000_000.0;

/// Requests and errors of one entity in one minute.
#[derive(Debug, Clone, Copy)]
struct Window {
    minute: i64,
    requests: u64,
    errors: u64,
}

impl Window {
    /// A window opened by its first request.
    fn opened(minute: i64, failed: bool) -> Self {
        Window { minute, requests: 1, errors: u64::from(failed) }
    }

    /// Counts one request; when its minute is past the window's, the window closes first and is
    /// returned (a late settlement counts in the open window: close enough for a rate).
    fn count(&mut self, minute: i64, failed: bool) -> Option<Window> {
        let closed = (minute > self.minute).then(|| std::mem::replace(self, Window { minute, requests: 0, errors: 0 }));
        self.requests += 1;
        self.errors += u64::from(failed);
        closed
    }
}

/// The entities a settlement is observed for, in the order of a tenant's window maps.
const ENTITY_TYPES: [&str; 3] = ["tenant", "key", "agent"];

/// Turns settlements into observations (keeps the open per-minute windows).
#[derive(Debug, Default)]
pub struct AnomalyFeed {
    /// Per tenant, one map of open windows per entity type (`ENTITY_TYPES` order), keyed by id.
    windows: HashMap<String, [HashMap<String, Window>; 3]>,
}

impl AnomalyFeed {
    /// The observations one settlement gives (its tenant's), per-request ones first.
    pub fn observe(&mut self, settlement: &Settlement) -> Vec<Observation> {
        let mut observations = Vec::new();
        self.observe_into(settlement, &mut observations);
        observations
    }

    /// Appends the observations one settlement gives to `observations`.
    fn observe_into<'a>(&mut self, settlement: &'a Settlement, observations: &mut Vec<Observation>) {
        let occurred = parse_timestamp(&settlement.occurred_at).unwrap_or_else(Utc::now);
        let timestamp = format_timestamp(occurred);
        let minute = occurred.timestamp().div_euclid(60);
        let failed = settlement.outcome == "failed";
        let cost_usd = settlement.cost_nanos as f64 / NANOS_PER_USD;
        let tokens = (settlement.input_tokens + settlement.output_tokens) as f64;
        let present = |id: &'a Option<String>| id.as_deref().filter(|id| !id.is_empty());
        let entity_ids = [Some(settlement.tenant_id.as_str()), present(&settlement.key_id), present(&settlement.agent_id)];
        let windows = self.windows.entry(settlement.tenant_id.clone()).or_default();
        for ((entity_type, entity_id), open) in ENTITY_TYPES.into_iter().zip(entity_ids).zip(windows.iter_mut()) {
            let Some(entity_id) = entity_id else { continue };
            let observation = |metric: &str, value: f64, timestamp: String| Observation {
                entity_type: entity_type.to_string(),
                entity_id: entity_id.to_string(),
                metric: metric.to_string(),
                value,
                timestamp,
            };
            observations.push(observation("cost_usd", cost_usd, timestamp.clone()));
            observations.push(observation("tokens", tokens, timestamp.clone()));
            let closed = match open.get_mut(entity_id) {
                Some(window) => window.count(minute, failed),
                None => {
                    open.insert(entity_id.to_string(), Window::opened(minute, failed));
                    None
                }
            };
            let Some(closed) = closed else { continue };
            let closed_at = minute_timestamp(closed.minute);
            observations.push(observation("request_rate", closed.requests as f64, closed_at.clone()));
            observations.push(observation("errors", closed.errors as f64, closed_at));
            for quiet in (closed.minute + 1..minute).take(MAX_QUIET_MINUTES as usize) {
                let quiet_at = minute_timestamp(quiet);
                observations.push(observation("request_rate", 0.0, quiet_at.clone()));
                observations.push(observation("errors", 0.0, quiet_at));
            }
        }
    }
}

fn minute_timestamp(minute: i64) -> String {
    let instant: DateTime<Utc> = Utc.timestamp_opt(minute * 60, 0).single().unwrap_or_else(Utc::now);
    format_timestamp(instant)
}

/// What one batch of deliveries did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Handled {
    /// Settlements fed to the detector.
    pub settlements: usize,
    /// Alerts they raised.
    pub alerts: usize,
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
                handled = self.handle_batch() => if let Err(error) = handled {
                    tracing::error!(%error, "anomaly consumer stopped: the bus failed");
                    break;
                },
            }
        }
    }

    /// Waits for one delivery, gathers those arriving within `LINGER` (up to `MAX_BATCH`) and feeds
    /// them to the detector, one call per tenant (in delivery order within a tenant). The detector
    /// lives in memory, so every delivery is acked (there is nothing to retry).
    pub async fn handle_batch(&mut self) -> Result<Handled, BusError> {
        let deliveries = next_batch(self.subscription.as_mut(), MAX_BATCH, LINGER).await?;
        let mut handled = Handled::default();
        let mut batches: Vec<ObservationBatch> = Vec::new();
        for (index, delivery) in deliveries.into_iter().enumerate() {
            share_thread(index).await;
            let event = delivery.message().decode::<BudgetEvent>();
            delivery.ack();
            let event = match event {
                Ok(event) => event,
                Err(error) => {
                    tracing::warn!(%error, "skipping an undecodable budget event");
                    continue;
                }
            };
            let Some(budget_event::Kind::Settlement(settlement)) = &event.kind else { continue };
            if settlement.tenant_id.is_empty() {
                continue;
            }
            handled.settlements += 1;
            let position = match batches.iter().position(|batch| batch.tenant_id == settlement.tenant_id) {
                Some(position) => position,
                None => {
                    batches.push(ObservationBatch { tenant_id: settlement.tenant_id.clone(), observations: Vec::new() });
                    batches.len() - 1
                }
            };
            let batch = &mut batches[position];
            self.feed.observe_into(settlement, &mut batch.observations);
            // A settlement gives at most 3 entities x (2 + 2 x 61) observations; the service takes
            // MAX_OBSERVATIONS per call, so a full batch goes now and the tenant starts another.
            if batch.observations.len() > MAX_OBSERVATIONS - MAX_PER_SETTLEMENT {
                let full = std::mem::take(&mut batch.observations);
                handled.alerts += record(&self.service, ObservationBatch { tenant_id: batch.tenant_id.clone(), observations: full }).await;
            }
        }
        for batch in batches {
            if !batch.observations.is_empty() {
                handled.alerts += record(&self.service, batch).await;
            }
        }
        Ok(handled)
    }
}

/// Feeds one tenant's observations to the detector; returns how many alerts they raised.
async fn record(service: &PolicyFirewallServiceImpl, batch: ObservationBatch) -> usize {
    match service.record_observations(batch).await {
        Ok(alerts) => alerts.alerts.len(),
        Err(error) => {
            tracing::warn!(%error, "could not feed the anomaly detector");
            0
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
