//! The `budget.settlements` consumer: writes each budget event to the ledger once, acks after the
//! commit, then schedules the tenant's alert evaluation (never on the request path).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use brainstorm_common::bus::{
    Batching, BusError, DEFAULT_WRITE_LINGER, Delivery, EventBus, Subscription, consume, next_batch, share_thread,
};
use brainstorm_proto::ErrorKind;
use brainstorm_proto::budget::{BudgetEvent, SETTLEMENTS_TOPIC, Settlement, budget_event};

use crate::service::BudgetLedgerServiceImpl;

/// The consumer group of the ledger on `budget.settlements`.
pub const CONSUMER_GROUP: &str = "budget-ledger";

/// Pause after a failed write before the redelivered message is tried again.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// Deliveries already waiting that `run` records together, in one transaction.
const MAX_BATCH: usize = 1024;

/// What became of one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// Written to the ledger and acked.
    Recorded,
    /// Already in the ledger (a redelivery): acked.
    Duplicate,
    /// Undecodable or invalid: acked and logged, so it cannot block the topic.
    Rejected,
    /// The store failed: not acked, so the bus delivers it again.
    Retried,
}

/// A subscribed consumer; `subscribe` before the producers start so no event is missed.
pub struct SettlementConsumer {
    subscription: Box<dyn Subscription>,
    service: BudgetLedgerServiceImpl,
    linger: Duration,
}

impl SettlementConsumer {
    /// Joins the ledger's consumer group on `budget.settlements`.
    pub async fn subscribe(bus: &Arc<dyn EventBus>, service: BudgetLedgerServiceImpl) -> Result<Self, BusError> {
        let subscription = bus.subscribe(SETTLEMENTS_TOPIC, CONSUMER_GROUP).await?;
        Ok(SettlementConsumer { subscription, service, linger: DEFAULT_WRITE_LINGER })
    }

    /// How long a batch waits for more deliveries after its first (the ledger lags by at most this).
    pub fn with_linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// Handles deliveries until `shutdown` completes (then what is already waiting) or the bus closes.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        let batching = Batching { max: MAX_BATCH, linger: self.linger, retry_pause: RETRY_PAUSE };
        let service = self.service.clone();
        let handled = consume(self.subscription.as_mut(), batching, shutdown, move |deliveries| {
            let service = service.clone();
            async move { handle_deliveries(&service, deliveries).await.contains(&Handled::Retried) }
        });
        if let Err(error) = handled.await {
            tracing::error!(%error, "budget settlement consumer stopped: the bus failed");
        }
    }

    /// Waits for one delivery and handles it.
    pub async fn handle_next(&mut self) -> Result<Handled, BusError> {
        let delivery = self.subscription.next().await?;
        Ok(handle(&self.service, delivery).await)
    }

    /// Waits for one delivery, gathers those arriving within the linger (up to `MAX_BATCH`), and writes
    /// their settlements in one transaction; other events are handled one by one.
    pub async fn handle_batch(&mut self) -> Result<Vec<Handled>, BusError> {
        let deliveries = next_batch(self.subscription.as_mut(), MAX_BATCH, self.linger).await?;
        Ok(handle_deliveries(&self.service, deliveries).await)
    }
}

/// Writes the settlements of `deliveries` in one transaction; other events one by one.
async fn handle_deliveries(service: &BudgetLedgerServiceImpl, deliveries: Vec<Delivery>) -> Vec<Handled> {
    let mut handled = Vec::with_capacity(deliveries.len());
    let mut settlements = Vec::new();
    for (index, delivery) in deliveries.into_iter().enumerate() {
        share_thread(index).await;
        match delivery.message().decode::<BudgetEvent>() {
            Ok(event) if settlement_of(&event).is_some() => settlements.push((event, delivery)),
            _ => handled.push(handle(service, delivery).await),
        }
    }
    if settlements.len() <= 1 {
        for (_, delivery) in settlements {
            handled.push(handle(service, delivery).await);
        }
        return handled;
    }
    let batch: Vec<&Settlement> = settlements.iter().filter_map(|(event, _)| settlement_of(event)).collect();
    match service.record_settlements(&batch).await {
        Ok(written) => {
            // Alerts once per tenant per batch (and coalesced with an evaluation already running).
            service.schedule_alerts_after(batch.iter().copied().zip(written.iter().copied()));
            for ((_, delivery), written) in settlements.into_iter().zip(written) {
                delivery.ack();
                handled.push(if written { Handled::Recorded } else { Handled::Duplicate });
            }
        }
        // One bad settlement must not hold the others back: decide them one by one.
        Err(error) if error.kind == ErrorKind::InvalidArgument => {
            for (_, delivery) in settlements {
                handled.push(handle(service, delivery).await);
            }
        }
        Err(error) => {
            tracing::warn!(%error, settlements = settlements.len(), "could not record a batch of settlements; they will be delivered again");
            for (_, delivery) in settlements.into_iter().rev() {
                drop(delivery);
                handled.push(Handled::Retried);
            }
        }
    }
    handled
}

/// The settlement an event carries, if it is one.
fn settlement_of(event: &BudgetEvent) -> Option<&Settlement> {
    match &event.kind {
        Some(budget_event::Kind::Settlement(settlement)) => Some(settlement),
        _ => None,
    }
}

async fn handle(service: &BudgetLedgerServiceImpl, delivery: Delivery) -> Handled {
    let event = match delivery.message().decode::<BudgetEvent>() {
        Ok(event) => event,
        Err(error) => {
            tracing::error!(%error, key = %delivery.message().key, "dropping an undecodable budget event");
            delivery.ack();
            return Handled::Rejected;
        }
    };
    match service.record(&event).await {
        Ok(recorded) => {
            delivery.ack();
            if let (true, Some(budget_event::Kind::Settlement(settlement))) = (recorded, &event.kind) {
                service.schedule_alert_evaluation(&settlement.tenant_id, &settlement.plan);
            }
            if recorded { Handled::Recorded } else { Handled::Duplicate }
        }
        Err(error) if error.kind == ErrorKind::InvalidArgument => {
            tracing::error!(%error, "dropping an invalid budget event");
            delivery.ack();
            Handled::Rejected
        }
        Err(error) => {
            tracing::warn!(%error, "could not record a budget event; it will be delivered again");
            drop(delivery);
            Handled::Retried
        }
    }
}

/// Subscribes and runs the consumer, gathering each batch for `linger`, on its own task of `runtime`
/// until `shutdown`.
pub async fn spawn_settlement_consumer(
    runtime: &tokio::runtime::Handle,
    bus: &Arc<dyn EventBus>,
    service: BudgetLedgerServiceImpl,
    linger: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<tokio::task::JoinHandle<()>, BusError> {
    let consumer = SettlementConsumer::subscribe(bus, service).await?.with_linger(linger);
    Ok(runtime.spawn(consumer.run(shutdown)))
}
