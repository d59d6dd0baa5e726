//! The fan-out's consumers of the bus: settlements and audit records become events for delivery.

use std::sync::Arc;
use std::time::Duration;

use brainstorm_common::bus::{Batching, BusError, EventBus, Subscription, consume};
use brainstorm_proto::audit::AUDIT_RECORDS_TOPIC;
use brainstorm_proto::budget::SETTLEMENTS_TOPIC;

use crate::dispatcher::Source;
use crate::service::ObservabilityFanoutServiceImpl;

const GROUP: &str = "observability-fanout";
const BATCH: usize = 1_024;

/// Subscribes to both topics and fans their messages out until `usage_stop` and `audit_stop`
/// (one stop signal for each consumer).
pub async fn spawn_fanout_consumers(
    runtime: &tokio::runtime::Handle,
    bus: &Arc<dyn EventBus>,
    service: ObservabilityFanoutServiceImpl,
    linger: Duration,
    usage_stop: impl Future<Output = ()> + Send + 'static,
    audit_stop: impl Future<Output = ()> + Send + 'static,
) -> Result<Vec<tokio::task::JoinHandle<()>>, BusError> {
    let settlements = bus.subscribe(SETTLEMENTS_TOPIC, GROUP).await?;
    let records = bus.subscribe(AUDIT_RECORDS_TOPIC, GROUP).await?;
    let usage = runtime.spawn(fan_out(settlements, linger, usage_stop, service.clone(), Source::Budget));
    let audit = runtime.spawn(fan_out(records, linger, audit_stop, service, Source::Audit));
    Ok(vec![usage, audit])
}

/// Consumes one topic: its messages of type `M` to delivery; acked once handed over.
async fn fan_out<M: prost::Message + Default + 'static>(
    mut subscription: Box<dyn Subscription>,
    linger: Duration,
    stop: impl Future<Output = ()>,
    service: ObservabilityFanoutServiceImpl,
    to_source: impl Fn(Arc<M>) -> Source,
) {
    let batching = Batching { max: BATCH, linger, retry_pause: Duration::ZERO };
    let to_source = &to_source;
    let consumed = consume(subscription.as_mut(), batching, stop, |deliveries| {
        let service = service.clone();
        async move {
            // On the in-process bus `decode` hands over the publisher's own value: no copy, and no
            // event is built until a tenant with destinations asks for one.
            let fanned: Vec<Source> =
                deliveries.iter().filter_map(|delivery| delivery.message().decode::<M>().ok()).map(to_source).collect();
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
    // What the last batches buffered goes now rather than being lost with the process.
    service.finish_deliveries().await;
}
