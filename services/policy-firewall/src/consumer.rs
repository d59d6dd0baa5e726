//! Feeds the anomaly detector from `budget.settlements`, so no request pays for it: every settled
//! request gives `cost_usd` and `tokens` observations for its tenant, key and agent, and per-minute
//! windows give `request_rate` and `errors` when a minute closes (quiet minutes in between count as
//! zero, up to an hour of them). Deliveries are taken in batches and each settlement goes straight to
//! its tenant's detector, its series looked up by borrowed keys.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use brainstorm_common::bus::{BusError, DEFAULT_WRITE_LINGER, EventBus, Subscription, next_batch, share_thread};
use brainstorm_common::collections::HashMap;
use brainstorm_common::time::{format_timestamp, parse_timestamp};
use brainstorm_proto::budget::{BudgetEvent, SETTLEMENTS_TOPIC, Settlement, budget_event};
use brainstorm_proto::policy::Observation;
use chrono::{DateTime, TimeZone, Utc};

use crate::anomaly::SeriesRef;
use crate::service::PolicyFirewallServiceImpl;

/// The policy firewall's consumer group on `budget.settlements`.
pub const CONSUMER_GROUP: &str = "policy-firewall";

/// Quiet minutes reported as zero when a window closes after a gap.
const MAX_QUIET_MINUTES: i64 = 60;
/// Settlements fed to the detector per batch.
const MAX_BATCH: usize = 1024;
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
        self.observe_with(settlement, &mut |observation| {
            observations.push(Observation {
                entity_type: observation.key.entity_type.to_string(),
                entity_id: observation.key.entity_id.to_string(),
                metric: observation.key.metric.to_string(),
                value: observation.value,
                timestamp: observation.timestamp.to_string(),
            });
        });
        observations
    }

    /// Hands each observation one settlement gives to `emit`, borrowed: keys from the settlement,
    /// timestamps in normal form.
    fn observe_with<'a>(&mut self, settlement: &'a Settlement, emit: &mut dyn FnMut(FeedObservation<'_>)) {
        let occurred = parse_timestamp(&settlement.occurred_at).unwrap_or_else(Utc::now);
        let timestamp = format_timestamp(occurred);
        let minute = occurred.timestamp().div_euclid(60);
        let failed = settlement.outcome == "failed";
        let cost_usd = settlement.cost_nanos as f64 / NANOS_PER_USD;
        let tokens = (settlement.input_tokens + settlement.output_tokens) as f64;
        let present = |id: &'a Option<String>| id.as_deref().filter(|id| !id.is_empty());
        let entity_ids = [Some(settlement.tenant_id.as_str()), present(&settlement.key_id), present(&settlement.agent_id)];
        let windows = match self.windows.get_mut(&settlement.tenant_id) {
            Some(windows) => windows,
            None => self.windows.entry(settlement.tenant_id.clone()).or_default(),
        };
        for ((entity_type, entity_id), open) in ENTITY_TYPES.into_iter().zip(entity_ids).zip(windows.iter_mut()) {
            let Some(entity_id) = entity_id else { continue };
            let mut observe = |metric: &str, value: f64, timestamp: &str| {
                emit(FeedObservation { key: SeriesRef { entity_type, entity_id, metric }, value, timestamp });
            };
            observe("cost_usd", cost_usd, &timestamp);
            observe("tokens", tokens, &timestamp);
            let closed = match open.get_mut(entity_id) {
                Some(window) => window.count(minute, failed),
                None => {
                    open.insert(entity_id.to_string(), Window::opened(minute, failed));
                    None
                }
            };
            let Some(closed) = closed else { continue };
            let closed_at = minute_timestamp(closed.minute);
            observe("request_rate", closed.requests as f64, &closed_at);
            observe("errors", closed.errors as f64, &closed_at);
            for quiet in (closed.minute + 1..minute).take(MAX_QUIET_MINUTES as usize) {
                let quiet_at = minute_timestamp(quiet);
                observe("request_rate", 0.0, &quiet_at);
                observe("errors", 0.0, &quiet_at);
            }
        }
    }
}

/// One observation as the feed hands it over.
struct FeedObservation<'a> {
    key: SeriesRef<'a>,
    value: f64,
    timestamp: &'a str,
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
    linger: Duration,
}

impl AnomalyConsumer {
    /// Joins the policy firewall's group on `budget.settlements`.
    pub async fn subscribe(bus: &Arc<dyn EventBus>, service: PolicyFirewallServiceImpl) -> Result<Self, BusError> {
        let subscription = bus.subscribe(SETTLEMENTS_TOPIC, CONSUMER_GROUP).await?;
        Ok(AnomalyConsumer { subscription, service, feed: AnomalyFeed::default(), linger: DEFAULT_WRITE_LINGER })
    }

    /// How long a batch waits for more deliveries after its first (as the ledger's consumer of the
    /// same topic does; anomalies are seen at most this late).
    pub fn with_linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
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

    /// Waits for one delivery, gathers those arriving within the linger (up to `MAX_BATCH`) and feeds
    /// them to the detector in delivery order, one lock of the detectors per settlement. The detector
    /// lives in memory, so every delivery is acked (there is nothing to retry).
    pub async fn handle_batch(&mut self) -> Result<Handled, BusError> {
        let deliveries = next_batch(self.subscription.as_mut(), MAX_BATCH, self.linger).await?;
        let mut handled = Handled::default();
        let AnomalyConsumer { service, feed, .. } = self;
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
            // Straight to the tenant's detector, keys borrowed: no owned observation per series.
            handled.alerts += service.observe_in_process(&settlement.tenant_id, |detector| {
                let mut alerts = Vec::new();
                feed.observe_with(settlement, &mut |observation| {
                    alerts.extend(detector.observe_ref(observation.key, observation.value, observation.timestamp));
                });
                alerts
            });
        }
        Ok(handled)
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
