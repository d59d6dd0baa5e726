//! The fan-out's consumers of the bus: settlements and audit records become events for delivery.

use std::sync::Arc;
use std::time::Duration;

use brainstorm_common::bus::{Batching, BusError, EventBus, consume};
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
    let batching = Batching { max: BATCH, linger, retry_pause: Duration::ZERO };
    let mut settlements = bus.subscribe(SETTLEMENTS_TOPIC, GROUP).await?;
    let mut records = bus.subscribe(AUDIT_RECORDS_TOPIC, GROUP).await?;
    let (usage_service, audit_service) = (service.clone(), service);
    let usage = tokio::spawn(async move {
        let consumed = consume(settlements.as_mut(), batching, usage_stop, |deliveries| {
            let service = usage_service.clone();
            async move {
                let mut fanned = Vec::new();
                for delivery in &deliveries {
                    if let Ok(event) = delivery.message().decode::<BudgetEvent>() {
                        fanned.extend(events::from_budget_event(&event));
                    }
                }
                service.submit(fanned).await;
                for delivery in deliveries {
                    delivery.ack();
                }
                false
            }
        })
        .await;
        if let Err(error) = consumed {
            tracing::error!(%error, "the fan-out's settlement consumer stopped");
        }
    });
    let audit = tokio::spawn(async move {
        let consumed = consume(records.as_mut(), batching, audit_stop, |deliveries| {
            let service = audit_service.clone();
            async move {
                let mut fanned = Vec::new();
                for delivery in &deliveries {
                    if let Ok(record) = delivery.message().decode::<AuditRecord>() {
                        fanned.push(events::from_audit(&record));
                    }
                }
                service.submit(fanned).await;
                for delivery in deliveries {
                    delivery.ack();
                }
                false
            }
        })
        .await;
        if let Err(error) = consumed {
            tracing::error!(%error, "the fan-out's audit consumer stopped");
        }
    });
    Ok(vec![usage, audit])
}
