//! The `audit.records` consumer: chains each record once, acks after the commit.
//!
//! Undecodable or invalid records are acked and logged so they cannot block the tenant's partition; a
//! store failure is not acked, so the bus delivers the record again (after a pause) and the chain
//! never skips it. Redeliveries are harmless: a request id already chained is a duplicate.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use brainstorm_common::bus::{
    Batching, BusError, DEFAULT_WRITE_LINGER, Delivery, EventBus, Subscription, consume, next_batch, share_thread,
};
use brainstorm_proto::audit::{AUDIT_RECORDS_TOPIC, AuditRecord};

use crate::service::{AuditLineageServiceImpl, by_tenant, is_rejection, validate_record};
use crate::store::Appended;

/// The consumer group of audit-lineage on `audit.records`.
pub const CONSUMER_GROUP: &str = "audit-lineage";

/// Pause after a failed write before the redelivered record is tried again.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// Deliveries already waiting that `run` takes together: one transaction per tenant per batch.
const MAX_BATCH: usize = 1024;

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
    linger: Duration,
}

impl AuditConsumer {
    /// Joins the `audit-lineage` group on `audit.records`.
    pub async fn subscribe(bus: &Arc<dyn EventBus>, service: AuditLineageServiceImpl) -> Result<Self, BusError> {
        let subscription = bus.subscribe(AUDIT_RECORDS_TOPIC, CONSUMER_GROUP).await?;
        Ok(AuditConsumer { subscription, service, linger: DEFAULT_WRITE_LINGER })
    }

    /// How long a batch waits for more deliveries after its first (the chain lags by at most this).
    pub fn with_linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// Handles deliveries until `shutdown` completes (then what is already waiting) or the bus fails.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        let batching = Batching { max: MAX_BATCH, linger: self.linger, retry_pause: RETRY_PAUSE };
        let service = self.service.clone();
        let handled = consume(self.subscription.as_mut(), batching, shutdown, move |deliveries| {
            let service = service.clone();
            async move { handle_deliveries(&service, deliveries).await.contains(&Handled::Retried) }
        });
        if let Err(error) = handled.await {
            tracing::error!(%error, "audit record consumer stopped: the bus failed");
        }
    }

    /// Waits for one delivery and handles it.
    pub async fn handle_next(&mut self) -> Result<Handled, BusError> {
        let delivery = self.subscription.next().await?;
        Ok(handle(&self.service, delivery).await)
    }

    /// Waits for one delivery, gathers those arriving within the linger (up to `MAX_BATCH`), and chains
    /// each tenant's records in one transaction, in delivery order.
    pub async fn handle_batch(&mut self) -> Result<Vec<Handled>, BusError> {
        let deliveries = next_batch(self.subscription.as_mut(), MAX_BATCH, self.linger).await?;
        Ok(handle_deliveries(&self.service, deliveries).await)
    }
}

/// Chains each tenant's records of `deliveries` in one transaction, in delivery order.
async fn handle_deliveries(service: &AuditLineageServiceImpl, mut deliveries: Vec<Delivery>) -> Vec<Handled> {
    if deliveries.len() == 1
        && let Some(delivery) = deliveries.pop()
    {
        return vec![handle(service, delivery).await];
    }
    let mut handled = Vec::with_capacity(deliveries.len());
    let mut valid = Vec::with_capacity(deliveries.len());
    for (index, delivery) in deliveries.into_iter().enumerate() {
        share_thread(index).await;
        let record = match delivery.message().decode::<AuditRecord>() {
            Ok(record) => record,
            Err(error) => {
                tracing::error!(%error, key = %delivery.message().key, "dropping an undecodable audit record");
                delivery.ack();
                handled.push(Handled::Rejected);
                continue;
            }
        };
        if let Err(error) = validate_record(&record) {
            tracing::error!(%error, request_id = %record.request_id, tenant_id = %record.tenant_id, "dropping an invalid audit record");
            delivery.ack();
            handled.push(Handled::Rejected);
            continue;
        }
        valid.push((record, delivery));
    }
    for (tenant_id, batch) in by_tenant(valid, |(record, _)| &record.tenant_id) {
        let (records, deliveries): (Vec<Arc<AuditRecord>>, Vec<Delivery>) = batch.into_iter().unzip();
        match service.append_batch(&tenant_id, &records).await {
            Ok(appended) => {
                for (delivery, appended) in deliveries.into_iter().zip(appended) {
                    delivery.ack();
                    handled.push(match appended {
                        Appended::Chained { .. } => Handled::Chained,
                        Appended::Duplicate { .. } => Handled::Duplicate,
                    });
                }
            }
            Err(error) => {
                tracing::warn!(%error, tenant_id, records = records.len(), "could not chain a batch of audit records; they will be delivered again");
                // Dropped newest first, so the redelivered records come back in their order.
                for delivery in deliveries.into_iter().rev() {
                    drop(delivery);
                    handled.push(Handled::Retried);
                }
            }
        }
    }
    handled
}

async fn handle(service: &AuditLineageServiceImpl, delivery: Delivery) -> Handled {
    let record = match delivery.message().decode::<AuditRecord>() {
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

/// Subscribes and runs the consumer, gathering each batch for `linger`, on its own task of `runtime`
/// until `shutdown`.
pub async fn spawn_audit_consumer(
    runtime: &tokio::runtime::Handle,
    bus: &Arc<dyn EventBus>,
    service: AuditLineageServiceImpl,
    linger: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<tokio::task::JoinHandle<()>, BusError> {
    let consumer = AuditConsumer::subscribe(bus, service).await?.with_linger(linger);
    Ok(runtime.spawn(consumer.run(shutdown)))
}
