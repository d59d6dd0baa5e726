//! The fan-out's consumers of the bus: settlements and audit records become events for delivery.

use std::sync::Arc;
use std::time::Duration;

use brainstorm_common::bus::{Batching, BusError, EventBus, Subscription, consume};
use brainstorm_proto::audit::{AUDIT_RECORDS_TOPIC, AuditRecord};
use brainstorm_proto::budget::{BudgetEvent, SETTLEMENTS_TOPIC};

use crate::events;
use crate::service::ObservabilityFanoutServiceImpl;

const GROUP: &str = "observability-fanout";
const BATCH: usize = 1_024;

/// Subscribes to both topics and fans their messages out until `usage_stop` and `audit_stop`
/// (one stop signal for each consumer).
pub async fn spawn_fanout_consumers(
    bus: &Arc<dyn EventBus>,
    service: ObservabilityFanoutServiceImpl,
    linger: Duration,
    usage_stop: impl Future<Output = ()> + Send + 'static,
    audit_stop: impl Future<Output = ()> + Send + 'static,
) -> Result<Vec<tokio::task::JoinHandle<()>>, BusError> {
    let settlements = bus.subscribe(SETTLEMENTS_TOPIC, GROUP).await?;
    let records = bus.subscribe(AUDIT_RECORDS_TOPIC, GROUP).await?;
    let usage =
        tokio::spawn(fan_out(settlements, linger, usage_stop, service.clone(), |event: &BudgetEvent| events::from_budget_event(event)));
    let audit = tokio::spawn(fan_out(records, linger, audit_stop, service, |record: &AuditRecord| Some(events::from_audit(record))));
    Ok(vec![usage, audit])
}

/// Consumes one topic: its messages of type `M`, as events, to delivery; acked once handed over.
async fn fan_out<M: prost::Message + Default + 'static>(
    mut subscription: Box<dyn Subscription>,
    linger: Duration,
    stop: impl Future<Output = ()>,
    service: ObservabilityFanoutServiceImpl,
    to_event: impl Fn(&M) -> Option<events::Event>,
) {
    let batching = Batching { max: BATCH, linger, retry_pause: Duration::ZERO };
    let to_event = &to_event;
    let consumed = consume(subscription.as_mut(), batching, stop, |deliveries| {
        let service = service.clone();
        async move {
            let fanned: Vec<events::Event> = deliveries
                .iter()
                .filter_map(|delivery| delivery.message().decode::<M>().ok())
                .filter_map(|message| to_event(&message))
                .collect();
            service.submit(fanned).await;
            for delivery in deliveries {
                delivery.ack();
            }
            false
        }
    })
    .await;
    if let Err(error) = consumed {
        tracing::error!(%error, "a fan-out consumer stopped");
    }
}
