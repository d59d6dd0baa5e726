//! Delivery: events go to the enabled destinations of their tenant that subscribed to their type
//! and whose filter rules admit them, gathered per destination until its batch is full or its
//! flush interval passed since the batch's first event, then sent in one request. A request that
//! failed for a reason that may pass (no connection, a timeout, 408, 429, 5xx) is sent again after a
//! growing wait (`Retry-After` honoured up to `MAX_BACKOFF`), `ATTEMPTS` times in all; a batch that
//! never went is counted `failed`. A destination whose buffer is full drops what comes (`dropped`).
//! At a stop (`finish`) every buffer is sent at once and the deliveries under way are awaited.
//!
//! A tenant's destinations (their secrets opened, their rules compiled) are kept in memory for
//! `TENANT_TTL` and dropped at once when this service changes them, so a tenant without
//! destinations costs a map lookup per message and no event is built for it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use tokio::sync::{Semaphore, mpsc};

use brainstorm_proto::audit::AuditRecord;
use brainstorm_proto::budget::BudgetEvent;
use brainstorm_proto::observability::Destination;

use crate::egress::{Egress, SendError};
use crate::events::{self, Event};
use crate::filter::{FilterRules, subscribed};
use crate::formats;
use crate::service::Opener;
use crate::store::{FanoutStore, StoredDestination};

/// Most events a destination's buffer holds.
const MAX_BUFFERED: usize = 10_000;
/// Requests in flight at once.
const MAX_IN_FLIGHT: usize = 16;
/// How often buffers are checked for an elapsed flush interval.
const TICK: Duration = Duration::from_millis(100);
/// How long a tenant's destinations are trusted before they are read again (changes made through
/// another replica of this service apply at most this late).
const TENANT_TTL: Duration = Duration::from_secs(5);
/// Most tenants kept; past it the cache starts over.
const MAX_TENANTS: usize = 10_000;
/// Requests a batch gets: the first and the retries.
const ATTEMPTS: u32 = 4;
/// The wait before the first retry, doubled before each next one.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// The longest wait between two attempts, a destination's `Retry-After` included.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// What becomes an event, as it came off the bus (no event is built for a tenant without destinations).
pub enum Source {
    Budget(Arc<BudgetEvent>),
    Audit(Arc<AuditRecord>),
    Quality(brainstorm_proto::observability::QualityEvent),
    Activity(brainstorm_proto::observability::ActivityEvent),
}

impl Source {
    fn tenant_id(&self) -> Option<&str> {
        match self {
            Source::Budget(event) => match &event.kind {
                Some(brainstorm_proto::budget::budget_event::Kind::Settlement(settlement)) => Some(&settlement.tenant_id),
                _ => None,
            },
            Source::Audit(record) => Some(&record.tenant_id),
            Source::Quality(event) => Some(&event.tenant_id),
            Source::Activity(event) => Some(&event.tenant_id),
        }
    }

    fn event(self) -> Option<Event> {
        match self {
            Source::Budget(event) => events::from_budget_event(&event),
            Source::Audit(record) => Some(events::from_audit(&record)),
            Source::Quality(event) => Some(events::from_quality(&event)),
            Source::Activity(event) => Some(events::from_activity(&event)),
        }
    }
}

enum Command {
    Route(Vec<Source>),
    Forget(String),
    /// Send every buffer now and answer once every delivery under way ended.
    Finish(tokio::sync::oneshot::Sender<()>),
}

/// A destination ready to take events: its row, its opened config and its compiled rules.
struct Ready {
    stored: StoredDestination,
    config: Map<String, Value>,
    rules: FilterRules,
}

struct Tenant {
    fetched_at: Instant,
    destinations: Arc<Vec<Ready>>,
}

/// The wait before attempt `attempt` (1 for the first retry) after `error`.
fn backoff(attempt: u32, error: &SendError) -> Duration {
    let doubled = FIRST_BACKOFF.saturating_mul(1 << attempt.saturating_sub(1).min(16));
    error.retry_after.unwrap_or(doubled).min(MAX_BACKOFF)
}

/// Delivers one batch: built afresh for each attempt (a signature names its time), sent again while
/// the failure may pass, `ATTEMPTS` times at most.
async fn deliver(egress: &Egress, destination: &Destination, config: &Map<String, Value>, batch: &[Event]) -> Result<(), SendError> {
    let mut attempt = 0;
    loop {
        let request =
            formats::request(&destination.kind, &destination.r#type, config, batch, chrono::Utc::now()).map_err(SendError::permanent)?;
        match egress.send(request).await {
            Ok(()) => return Ok(()),
            Err(error) if error.transient && attempt + 1 < ATTEMPTS => {
                attempt += 1;
                let wait = backoff(attempt, &error);
                tracing::info!(destination = %destination.id, %error, attempt, wait_ms = wait.as_millis() as u64, "a fan-out delivery failed; retrying");
                tokio::time::sleep(wait).await;
            }
            Err(error) => return Err(error),
        }
    }
}

/// Hands events to the delivery task.
#[derive(Clone)]
pub struct Dispatcher {
    sender: mpsc::Sender<Command>,
}

impl Dispatcher {
    /// Starts the delivery task on `runtime`.
    pub fn spawn(runtime: &tokio::runtime::Handle, store: FanoutStore, opener: Opener, egress: Egress) -> Dispatcher {
        let (sender, receiver) = mpsc::channel(256);
        let worker = Worker {
            store,
            opener,
            egress,
            tenants: HashMap::new(),
            buffers: HashMap::new(),
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            deliveries: Vec::new(),
        };
        runtime.spawn(worker.run(receiver));
        Dispatcher { sender }
    }

    /// Queues what becomes events (waits while the delivery task is behind).
    pub async fn submit(&self, sources: Vec<Source>) {
        if !sources.is_empty() && self.sender.send(Command::Route(sources)).await.is_err() {
            tracing::warn!("the fan-out delivery task stopped; events are lost");
        }
    }

    /// Sends every buffered event now and waits for the deliveries under way (at a stop; the caller
    /// bounds the wait).
    pub async fn finish(&self) {
        let (done, finished) = tokio::sync::oneshot::channel();
        if self.sender.send(Command::Finish(done)).await.is_ok() {
            let _ = finished.await;
        }
    }

    /// Drops what is kept of a tenant's destinations (this service changed them).
    pub async fn forget(&self, tenant_id: &str) {
        if self.sender.send(Command::Forget(tenant_id.to_string())).await.is_err() {
            tracing::warn!("the fan-out delivery task stopped");
        }
    }
}

struct Buffer {
    destination: StoredDestination,
    config: Map<String, Value>,
    events: Vec<Event>,
    first_at: Instant,
    dropped: u64,
}

struct Worker {
    store: FanoutStore,
    opener: Opener,
    egress: Egress,
    tenants: HashMap<String, Tenant>,
    buffers: HashMap<String, Buffer>,
    in_flight: Arc<Semaphore>,
    /// Deliveries started and perhaps not ended (the ended ones are dropped at each tick).
    deliveries: Vec<tokio::task::JoinHandle<()>>,
}

impl Worker {
    async fn run(mut self, mut receiver: mpsc::Receiver<Command>) {
        let mut tick = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                received = receiver.recv() => match received {
                    Some(Command::Route(sources)) => self.route(sources).await,
                    Some(Command::Forget(tenant_id)) => {
                        self.tenants.remove(&tenant_id);
                    }
                    Some(Command::Finish(done)) => {
                        let ids: Vec<String> = self.buffers.keys().cloned().collect();
                        for id in ids {
                            self.flush(&id);
                        }
                        let deliveries = std::mem::take(&mut self.deliveries);
                        tokio::spawn(async move {
                            for delivery in deliveries {
                                let _ = delivery.await;
                            }
                            let _ = done.send(());
                        });
                    }
                    None => break,
                },
                _ = tick.tick() => {
                    self.deliveries.retain(|delivery| !delivery.is_finished());
                    self.flush_due();
                }
            }
        }
    }

    /// The tenant's enabled destinations, from memory while fresh.
    async fn destinations(&mut self, tenant_id: &str) -> Arc<Vec<Ready>> {
        if let Some(tenant) = self.tenants.get(tenant_id).filter(|tenant| tenant.fetched_at.elapsed() < TENANT_TTL) {
            return tenant.destinations.clone();
        }
        let destinations = Arc::new(self.load(tenant_id).await);
        if self.tenants.len() >= MAX_TENANTS {
            self.tenants.clear();
        }
        self.tenants.insert(tenant_id.to_string(), Tenant { fetched_at: Instant::now(), destinations: destinations.clone() });
        destinations
    }

    async fn load(&self, tenant_id: &str) -> Vec<Ready> {
        let (enabled, stored) = match (self.store.enabled(tenant_id).await, self.store.list(tenant_id, "").await) {
            (Ok(enabled), Ok(stored)) => (enabled, stored),
            (Err(error), _) | (_, Err(error)) => {
                tracing::warn!(%error, tenant_id, "cannot read the tenant's destinations; its events are not fanned out");
                return Vec::new();
            }
        };
        stored
            .into_iter()
            // The tenant's switch governs observability destinations; XDR connectors have their own.
            .filter(|stored| stored.destination.enabled && (stored.destination.kind != "observability" || enabled))
            .filter_map(|stored| match self.opener.config(&stored) {
                Ok(config) => {
                    let rules = FilterRules::parse(&stored.destination.filter_rules_json).unwrap_or_default();
                    Some(Ready { stored, config, rules })
                }
                Err(error) => {
                    tracing::error!(%error, destination = %stored.destination.id, "cannot open a destination's secrets");
                    None
                }
            })
            .collect()
    }

    /// Puts each event in the buffers of the destinations that take it.
    async fn route(&mut self, sources: Vec<Source>) {
        for source in sources {
            let Some(tenant_id) = source.tenant_id() else { continue };
            let destinations = self.destinations(tenant_id).await;
            if destinations.is_empty() {
                continue;
            }
            let Some(event) = source.event() else { continue };
            for ready in destinations.iter() {
                let destination = &ready.stored.destination;
                if !subscribed(&destination.event_types, &event) || !ready.rules.admits(&event) {
                    continue;
                }
                let id = destination.id.clone();
                let buffer = self.buffers.entry(id.clone()).or_insert_with(|| Buffer {
                    destination: ready.stored.clone(),
                    config: ready.config.clone(),
                    events: Vec::new(),
                    first_at: Instant::now(),
                    dropped: 0,
                });
                if buffer.events.is_empty() {
                    // The newest settings win (a destination changed since its last batch).
                    buffer.destination = ready.stored.clone();
                    buffer.config = ready.config.clone();
                    buffer.first_at = Instant::now();
                }
                if buffer.events.len() >= MAX_BUFFERED {
                    buffer.dropped += 1;
                    continue;
                }
                buffer.events.push(event.clone());
                if buffer.events.len() >= buffer.destination.destination.batch_max_size.max(1) as usize {
                    self.flush(&id);
                }
            }
        }
    }

    fn flush_due(&mut self) {
        let due: Vec<String> = self
            .buffers
            .iter()
            .filter(|(_, buffer)| {
                (!buffer.events.is_empty() || buffer.dropped > 0)
                    && buffer.first_at.elapsed() >= Duration::from_millis(u64::from(buffer.destination.destination.batch_flush_interval_ms))
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            self.flush(&id);
        }
    }

    /// Sends a destination's buffer (in batches of its size) on tasks of their own.
    fn flush(&mut self, id: &str) {
        let Some(buffer) = self.buffers.get_mut(id) else { return };
        let events = std::mem::take(&mut buffer.events);
        let dropped = std::mem::take(&mut buffer.dropped);
        let size = buffer.destination.destination.batch_max_size.max(1) as usize;
        let batches: Vec<Vec<Event>> = events.chunks(size).map(<[Event]>::to_vec).collect();
        let destination = buffer.destination.destination.clone();
        let config = buffer.config.clone();
        let (store, egress, in_flight) = (self.store.clone(), self.egress.clone(), self.in_flight.clone());
        let delivery = tokio::spawn(async move {
            let _permit = in_flight.acquire_owned().await;
            let (mut sent, mut failed) = (0_u64, 0_u64);
            for batch in batches {
                let count = batch.len() as u64;
                match deliver(&egress, &destination, &config, &batch).await {
                    Ok(()) => sent += count,
                    Err(error) => {
                        tracing::warn!(destination = %destination.id, %error, events = count, "a fan-out delivery failed");
                        failed += count;
                    }
                }
            }
            let stamp = brainstorm_common::time::now_timestamp();
            if let Err(error) = store.record(&destination.id, sent, failed, dropped, &stamp).await {
                tracing::warn!(%error, destination = %destination.id, "cannot count a fan-out delivery");
            }
        });
        self.deliveries.push(delivery);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_honours_retry_after_up_to_the_cap() {
        let failed = SendError { message: String::new(), transient: true, retry_after: None };
        assert_eq!(backoff(1, &failed), Duration::from_millis(500));
        assert_eq!(backoff(3, &failed), Duration::from_secs(2));
        assert_eq!(backoff(40, &failed), MAX_BACKOFF);
        let told = SendError { retry_after: Some(Duration::from_secs(7)), ..failed.clone() };
        assert_eq!(backoff(1, &told), Duration::from_secs(7));
        let too_long = SendError { retry_after: Some(Duration::from_secs(3600)), ..failed };
        assert_eq!(backoff(1, &too_long), MAX_BACKOFF);
    }
}
