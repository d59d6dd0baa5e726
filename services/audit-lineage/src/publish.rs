//! What the edge calls: hand a record to the bus (`audit.records`, keyed by tenant id) and get its
//! commitment for `X-BR-Audit-Hash` at once.
//!
//! `AuditPublisher` keeps the edge off the bus's latency and outages: `submit` only queues the record in
//! a bounded buffer; one background task publishes the buffer in order (so each tenant's records leave
//! this edge in the order they were submitted) and retries with backoff while the bus is unavailable.
//! When the buffer is full, `OverflowPolicy` decides: `FailClosed` (the default) refuses the record, so
//! the edge refuses the request rather than serve it without evidence; `FailOpen` drops the record,
//! counts it, and lets the request through. `stats()` feeds the edge's metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use brainstorm_common::bus::{BusError, EventBus};
use brainstorm_proto::audit::{AUDIT_RECORDS_TOPIC, AuditRecord};
use tokio::sync::mpsc;

use crate::canonical::{canonical_payload, commitment, payload_commitment};

/// Publishes `record` keyed by its tenant id and returns its commitment, the value of
/// `X-BR-Audit-Hash`. The record is chained later by the consumer; lineage and verify show the same
/// commitment once it is.
pub async fn publish_record(bus: &dyn EventBus, record: &AuditRecord) -> Result<String, BusError> {
    let commitment = commitment(record);
    publish(bus, &Arc::new(record.clone())).await?;
    Ok(commitment)
}

/// Publishes a record whose commitment is already known (the publisher computed it at `submit`); an
/// in-process consumer receives this very value.
async fn publish(bus: &dyn EventBus, record: &Arc<AuditRecord>) -> Result<(), BusError> {
    bus.publish_event(AUDIT_RECORDS_TOPIC, &record.tenant_id, record.clone()).await
}

/// What to do with a record when the buffer is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OverflowPolicy {
    /// Refuse the record: the edge answers 503 instead of serving without evidence.
    #[default]
    FailClosed,
    /// Drop the record (counted in `dropped`) and let the request through.
    FailOpen,
}

impl OverflowPolicy {
    /// Reads `fail_closed` or `fail_open` (for a setting such as `BR_AUDIT_OVERFLOW`).
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "fail_closed" => Some(OverflowPolicy::FailClosed),
            "fail_open" => Some(OverflowPolicy::FailOpen),
            _ => None,
        }
    }
}

/// How the publisher buffers and retries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublisherOptions {
    /// Records held while the bus is slow or down.
    pub capacity: usize,
    pub overflow: OverflowPolicy,
    /// First pause after a failed publish; doubles up to `max_backoff`.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for PublisherOptions {
    fn default() -> Self {
        PublisherOptions {
            capacity: 10_000,
            overflow: OverflowPolicy::FailClosed,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
        }
    }
}

/// Why `submit` did not take a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The buffer is full and the policy is `FailClosed`.
    #[error("the audit buffer is full ({capacity} records waiting for the event bus)")]
    BufferFull { capacity: usize },
    /// The publishing task has stopped (shutdown).
    #[error("the audit publisher has stopped")]
    Closed,
}

/// What `submit` did with a record it did not refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submitted {
    /// Queued for publishing; the commitment is `X-BR-Audit-Hash`.
    Queued { commitment: String },
    /// Dropped under `FailOpen` with the buffer full: no evidence will exist for this request.
    Dropped { commitment: String },
}

/// The publisher's counters, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PublisherStats {
    /// Records waiting in the buffer.
    pub buffered: u64,
    pub published: u64,
    /// Records dropped under `FailOpen`.
    pub dropped: u64,
    /// Records refused under `FailClosed`.
    pub refused: u64,
    /// Publish attempts that failed (each is retried).
    pub publish_failures: u64,
}

#[derive(Debug, Default)]
struct Counters {
    buffered: AtomicU64,
    published: AtomicU64,
    dropped: AtomicU64,
    refused: AtomicU64,
    publish_failures: AtomicU64,
}

/// A cheap clonable handle on the buffer; the background task ends when every handle is dropped and
/// the buffer is drained.
#[derive(Clone)]
pub struct AuditPublisher {
    sender: mpsc::Sender<AuditRecord>,
    counters: Arc<Counters>,
    options: Arc<PublisherOptions>,
}

impl std::fmt::Debug for AuditPublisher {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("AuditPublisher").field("stats", &self.stats()).finish_non_exhaustive()
    }
}

impl AuditPublisher {
    /// Starts the publishing task on `bus`.
    pub fn spawn(bus: Arc<dyn EventBus>, options: PublisherOptions) -> (Self, tokio::task::JoinHandle<()>) {
        let (sender, receiver) = mpsc::channel(options.capacity.max(1));
        let counters = Arc::new(Counters::default());
        let options = Arc::new(options);
        let task = tokio::spawn(drain(bus, receiver, counters.clone(), options.clone()));
        (AuditPublisher { sender, counters, options }, task)
    }

    /// Queues a record without waiting; see `OverflowPolicy` for a full buffer.
    pub fn submit(&self, mut record: AuditRecord) -> Result<Submitted, SubmitError> {
        // Encoded once here; the chain writer stores this very payload.
        record.canonical_payload = canonical_payload(&record);
        let commitment = payload_commitment(&record.canonical_payload);
        // Counted before it is sent: on a multi-threaded runtime the drain may publish it (and count
        // it out) before this thread would count it in.
        self.counters.buffered.fetch_add(1, Ordering::Relaxed);
        let sent = self.sender.try_send(record);
        if sent.is_err() {
            self.counters.buffered.fetch_sub(1, Ordering::Relaxed);
        }
        match sent {
            Ok(()) => Ok(Submitted::Queued { commitment }),
            Err(mpsc::error::TrySendError::Full(record)) => match self.options.overflow {
                OverflowPolicy::FailClosed => {
                    self.counters.refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(request_id = %record.request_id, "audit buffer full: refusing the request (fail closed)");
                    Err(SubmitError::BufferFull { capacity: self.options.capacity })
                }
                OverflowPolicy::FailOpen => {
                    self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(request_id = %record.request_id, tenant_id = %record.tenant_id, "audit buffer full: dropping the record (fail open)");
                    Ok(Submitted::Dropped { commitment })
                }
            },
            Err(mpsc::error::TrySendError::Closed(_)) => Err(SubmitError::Closed),
        }
    }

    /// Waits until every record submitted so far is on the bus (at shutdown, once no request submits
    /// any more; the caller bounds the wait).
    pub async fn flushed(&self) {
        while self.counters.buffered.load(Ordering::Relaxed) > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }

    /// The counters now.
    pub fn stats(&self) -> PublisherStats {
        PublisherStats {
            buffered: self.counters.buffered.load(Ordering::Relaxed),
            published: self.counters.published.load(Ordering::Relaxed),
            dropped: self.counters.dropped.load(Ordering::Relaxed),
            refused: self.counters.refused.load(Ordering::Relaxed),
            publish_failures: self.counters.publish_failures.load(Ordering::Relaxed),
        }
    }
}

async fn drain(bus: Arc<dyn EventBus>, mut receiver: mpsc::Receiver<AuditRecord>, counters: Arc<Counters>, options: Arc<PublisherOptions>) {
    while let Some(record) = receiver.recv().await {
        let record = Arc::new(record);
        let mut backoff = options.initial_backoff;
        // Retried until it goes: the next record must not overtake it.
        while let Err(error) = publish(bus.as_ref(), &record).await {
            counters.publish_failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%error, request_id = %record.request_id, backoff_ms = backoff.as_millis() as u64, "cannot publish an audit record; retrying");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(options.max_backoff);
        }
        counters.published.fetch_add(1, Ordering::Relaxed);
        counters.buffered.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use async_trait::async_trait;
    use brainstorm_common::bus::{InProcessBus, Subscription};
    use bytes::Bytes;

    use super::*;

    /// A bus that fails while `down` is set.
    struct FlakyBus {
        inner: InProcessBus,
        down: Arc<AtomicBool>,
    }

    #[async_trait]
    impl EventBus for FlakyBus {
        async fn publish(&self, topic: &str, key: &str, payload: Bytes) -> Result<(), BusError> {
            if self.down.load(Ordering::SeqCst) {
                return Err(BusError::Backend("broker unreachable".to_string()));
            }
            self.inner.publish(topic, key, payload).await
        }

        async fn subscribe(&self, topic: &str, group: &str) -> Result<Box<dyn Subscription>, BusError> {
            self.inner.subscribe(topic, group).await
        }
    }

    fn record(index: usize) -> AuditRecord {
        AuditRecord {
            request_id: format!("req_{index}"),
            tenant_id: "t".to_string(),
            occurred_at: "2026-11-22T10:00:00.000Z".to_string(),
            outcome: "allowed".to_string(),
            ..AuditRecord::default()
        }
    }

    fn options(capacity: usize, overflow: OverflowPolicy) -> PublisherOptions {
        PublisherOptions { capacity, overflow, initial_backoff: Duration::from_millis(5), max_backoff: Duration::from_millis(20) }
    }

    async fn received(subscription: &mut Box<dyn Subscription>) -> Result<String, Box<dyn std::error::Error>> {
        let delivery = tokio::time::timeout(Duration::from_secs(5), subscription.next()).await??;
        let record = delivery.message().decode::<AuditRecord>()?;
        delivery.ack();
        Ok(record.request_id.clone())
    }

    #[tokio::test]
    async fn the_payload_committed_to_travels_with_the_record() -> Result<(), Box<dyn std::error::Error>> {
        let bus = Arc::new(InProcessBus::new());
        let mut consumer = bus.subscribe(AUDIT_RECORDS_TOPIC, "audit-lineage").await?;
        let (publisher, _task) = AuditPublisher::spawn(bus, options(3, OverflowPolicy::FailClosed));
        let Submitted::Queued { commitment: answered } = publisher.submit(record(7))? else { return Err("not queued".into()) };
        let delivery = tokio::time::timeout(Duration::from_secs(5), consumer.next()).await??;
        let carried = delivery.message().decode::<AuditRecord>()?;
        assert_eq!(carried.canonical_payload, canonical_payload(&record(7)));
        assert_eq!(payload_commitment(&carried.canonical_payload), answered);
        assert_eq!(answered, commitment(&carried), "the payload does not include itself");
        Ok(())
    }

    #[tokio::test]
    async fn records_survive_an_outage_in_order_and_a_full_buffer_fails_closed() -> Result<(), Box<dyn std::error::Error>> {
        let inner = InProcessBus::new();
        let mut consumer = inner.subscribe(AUDIT_RECORDS_TOPIC, "audit-lineage").await?;
        let down = Arc::new(AtomicBool::new(true));
        let bus: Arc<dyn EventBus> = Arc::new(FlakyBus { inner, down: down.clone() });
        let (publisher, task) = AuditPublisher::spawn(bus, options(3, OverflowPolicy::FailClosed));

        let submitted = publisher.submit(record(0))?;
        assert_eq!(submitted, Submitted::Queued { commitment: commitment(&record(0)) });
        // The task holds record 0 (retrying); the buffer takes three more, then refuses.
        tokio::time::sleep(Duration::from_millis(30)).await;
        for index in 1..=3 {
            publisher.submit(record(index))?;
        }
        assert_eq!(publisher.submit(record(4)), Err(SubmitError::BufferFull { capacity: 3 }));
        let stats = publisher.stats();
        assert_eq!((stats.buffered, stats.refused, stats.published), (4, 1, 0));
        assert!(stats.publish_failures > 0);

        down.store(false, Ordering::SeqCst);
        for index in 0..=3 {
            assert_eq!(received(&mut consumer).await?, format!("req_{index}"), "submission order is publish order");
        }
        drop(publisher);
        tokio::time::timeout(Duration::from_secs(5), task).await??;
        Ok(())
    }

    #[tokio::test]
    async fn fail_open_drops_and_counts() -> Result<(), Box<dyn std::error::Error>> {
        let down = Arc::new(AtomicBool::new(true));
        let bus: Arc<dyn EventBus> = Arc::new(FlakyBus { inner: InProcessBus::new(), down });
        let (publisher, _task) = AuditPublisher::spawn(bus, options(1, OverflowPolicy::FailOpen));
        publisher.submit(record(0))?;
        tokio::time::sleep(Duration::from_millis(30)).await;
        publisher.submit(record(1))?;
        assert_eq!(publisher.submit(record(2))?, Submitted::Dropped { commitment: commitment(&record(2)) });
        assert_eq!(publisher.stats().dropped, 1);
        assert_eq!(OverflowPolicy::parse("fail_open"), Some(OverflowPolicy::FailOpen));
        assert_eq!(OverflowPolicy::parse("open"), None);
        Ok(())
    }
}
