//! The `audit.records` consumer: chains each record once, acks after the commit.
//!
//! Undecodable or invalid records are acked and logged so they cannot block the tenant's partition; a
//! store failure is not acked, so the bus delivers the record again (after a pause) and the chain
//! never skips it. Redeliveries are harmless: a request id already chained is a duplicate.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use brainstorm_common::bus::{BusError, Delivery, EventBus, Subscription};
use brainstorm_proto::audit::{AUDIT_RECORDS_TOPIC, AuditRecord};
use prost::Message;

use crate::service::{AuditLineageServiceImpl, is_rejection};
use crate::store::Appended;

/// The consumer group of audit-lineage on `audit.records`.
pub const CONSUMER_GROUP: &str = "audit-lineage";

/// Pause after a failed write before the redelivered record is tried again.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// What became of one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// Appended to the tenant's chain and acked.
    Chained,
    /// Already chained (a redelivery): acked.
    Duplicate,
    /// Undecodable or invalid: acked and logged.
    Rejected,
    /// The store failed: not acked, so it is delivered again.
    Retried,
}

/// A subscribed consumer; `subscribe` before the edges publish so nothing is missed on the in-process bus.
pub struct AuditConsumer {
    subscription: Box<dyn Subscription>,
    service: AuditLineageServiceImpl,
}

impl AuditConsumer {
    /// Joins the `audit-lineage` group on `audit.records`.
    pub async fn subscribe(bus: &Arc<dyn EventBus>, service: AuditLineageServiceImpl) -> Result<Self, BusError> {
        let subscription = bus.subscribe(AUDIT_RECORDS_TOPIC, CONSUMER_GROUP).await?;
        Ok(AuditConsumer { subscription, service })
    }

    /// Handles deliveries until `shutdown` completes or the bus fails.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                handled = self.handle_next() => match handled {
                    Ok(Handled::Retried) => tokio::time::sleep(RETRY_PAUSE).await,
                    Ok(Handled::Chained | Handled::Duplicate | Handled::Rejected) => {}
                    Err(error) => {
                        tracing::error!(%error, "audit record consumer stopped: the bus failed");
                        break;
                    }
                },
            }
        }
    }

    /// Waits for one delivery and handles it.
    pub async fn handle_next(&mut self) -> Result<Handled, BusError> {
        let delivery = self.subscription.next().await?;
        Ok(handle(&self.service, delivery).await)
    }
}

async fn handle(service: &AuditLineageServiceImpl, delivery: Delivery) -> Handled {
    let record = match AuditRecord::decode(delivery.message().payload.clone()) {
        Ok(record) => record,
        Err(error) => {
            tracing::error!(%error, key = %delivery.message().key, "dropping an undecodable audit record");
            delivery.ack();
            return Handled::Rejected;
        }
    };
    match service.append(&record).await {
        Ok((Appended::Chained { .. }, _)) => {
            delivery.ack();
            Handled::Chained
        }
        Ok((Appended::Duplicate { .. }, _)) => {
            delivery.ack();
            Handled::Duplicate
        }
        Err(error) if is_rejection(&error) => {
            tracing::error!(%error, request_id = %record.request_id, tenant_id = %record.tenant_id, "dropping an invalid audit record");
            delivery.ack();
            Handled::Rejected
        }
        Err(error) => {
            tracing::warn!(%error, request_id = %record.request_id, "could not chain an audit record; it will be delivered again");
            drop(delivery);
            Handled::Retried
        }
    }
}

/// Subscribes and runs the consumer on its own task until `shutdown`.
pub async fn spawn_audit_consumer(
    bus: &Arc<dyn EventBus>,
    service: AuditLineageServiceImpl,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<tokio::task::JoinHandle<()>, BusError> {
    let consumer = AuditConsumer::subscribe(bus, service).await?;
    Ok(tokio::spawn(consumer.run(shutdown)))
}
