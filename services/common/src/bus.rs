//! The event bus seam: publish keyed messages to topics; consume them per consumer group with acks.
//!
//! `InProcessBus` is the embedded implementation. It keeps Kafka's delivery semantics that matter to
//! consumers, so delivery bugs show locally: every consumer group receives every message published after
//! it subscribed; consumers of one group share the work; a message handed out and dropped without an
//! ack is delivered again (at-least-once), ahead of newer messages. `kafka::KafkaBus` (cargo feature
//! `kafka`) keeps the same semantics across processes; `select_bus` picks one from `BR_KAFKA_BROKERS`.
//!
//! Publishers of protobuf events call `publish_event`: across processes the event travels encoded, while
//! in process the consumers receive the publisher's own value (`BusMessage::decode` hands it over
//! without encoding or decoding it).

#[cfg(feature = "kafka")]
pub mod kafka;

use std::any::Any;
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::Notify;

use crate::collections::HashMap;

/// Why the bus failed.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("event bus is closed")]
    Closed,
    #[error("event bus backend error: {0}")]
    Backend(String),
}

/// One message on a topic.
#[derive(Clone)]
pub struct BusMessage {
    pub topic: String,
    /// Ordering and partitioning key (a tenant id, usually).
    pub key: String,
    payload: Payload,
}

/// What a message carries: wire bytes, or in process the publisher's typed event.
#[derive(Clone)]
enum Payload {
    Bytes(Bytes),
    Event(Arc<dyn Event>),
}

/// A typed event a publisher hands the bus (every protobuf message is one).
pub trait Event: Any + Send + Sync {
    /// The event's wire form.
    fn encode_event(&self) -> Bytes;
    /// The event as `Any`, for a consumer that knows its type.
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

impl<M: prost::Message + 'static> Event for M {
    fn encode_event(&self) -> Bytes {
        Bytes::from(self.encode_to_vec())
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

impl BusMessage {
    /// A message carrying wire bytes.
    pub fn new(topic: impl Into<String>, key: impl Into<String>, payload: Bytes) -> Self {
        BusMessage { topic: topic.into(), key: key.into(), payload: Payload::Bytes(payload) }
    }

    /// A message carrying a typed event (in process only: it is encoded where it leaves the process).
    pub fn event(topic: impl Into<String>, key: impl Into<String>, event: Arc<dyn Event>) -> Self {
        BusMessage { topic: topic.into(), key: key.into(), payload: Payload::Event(event) }
    }

    /// The wire bytes (a typed event is encoded on demand).
    pub fn payload(&self) -> Bytes {
        match &self.payload {
            Payload::Bytes(bytes) => bytes.clone(),
            Payload::Event(event) => event.encode_event(),
        }
    }

    /// The message as `M`: the publisher's own value when it handed one of that type, else decoded
    /// from the bytes (a value of another type is encoded and decoded, as it would be across processes).
    pub fn decode<M: prost::Message + Default + 'static>(&self) -> Result<Arc<M>, prost::DecodeError> {
        match &self.payload {
            Payload::Bytes(bytes) => M::decode(bytes.clone()).map(Arc::new),
            Payload::Event(event) => match event.clone().into_any().downcast::<M>() {
                Ok(value) => Ok(value),
                Err(_) => M::decode(event.encode_event()).map(Arc::new),
            },
        }
    }
}

impl fmt::Debug for BusMessage {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let payload = match &self.payload {
            Payload::Bytes(bytes) => format!("{} bytes", bytes.len()),
            Payload::Event(_) => "a typed event".to_string(),
        };
        formatter.debug_struct("BusMessage").field("topic", &self.topic).field("key", &self.key).field("payload", &payload).finish()
    }
}

/// The event bus: cloned freely as `Arc<dyn EventBus>`.
#[async_trait]
pub trait EventBus: Send + Sync + 'static {
    /// Appends a message to a topic.
    async fn publish(&self, topic: &str, key: &str, payload: Bytes) -> Result<(), BusError>;
    /// Appends a typed event: encoded for a bus that crosses processes; the in-process bus hands the
    /// value itself to its consumers.
    async fn publish_event(&self, topic: &str, key: &str, event: Arc<dyn Event>) -> Result<(), BusError> {
        self.publish(topic, key, event.encode_event()).await
    }
    /// Joins consumer group `group` on `topic`.
    async fn subscribe(&self, topic: &str, group: &str) -> Result<Box<dyn Subscription>, BusError>;
}

/// A consumer's stream of deliveries.
#[async_trait]
pub trait Subscription: Send {
    /// Waits for the next delivery.
    async fn next(&mut self) -> Result<Delivery, BusError>;
}

/// Items of a batch a consumer works through before handing its thread back to the runtime.
const SHARE_EVERY: usize = 32;

/// Yields to the runtime at every `SHARE_EVERY`th item of a batch (`index` counts from 0): where the
/// process runs on one thread, the edge's requests wait while a consumer computes, so a batch of
/// hundreds of records must not hold the thread for milliseconds at a time.
pub async fn share_thread(index: usize) {
    if index > 0 && index.is_multiple_of(SHARE_EVERY) {
        tokio::task::yield_now().await;
    }
}

/// How long a background writer (the chain, the ledger, the anomaly feed, the interception log)
/// gathers deliveries after the first before handling them, unless configured (`BR_WRITE_LINGER_MS`).
/// Each batch's commit rewrites the pages it touched whatever its size, so this trades how soon a
/// record is queryable for CPU per request (the edge never waits on it).
pub const DEFAULT_WRITE_LINGER: std::time::Duration = std::time::Duration::from_millis(100);

/// Waits for one delivery, then gathers more for up to `linger` (or until `max`): what a consumer
/// writes in one transaction. Under load a batch fills at once; when traffic is light the linger
/// bounds how long the first delivery waits. Deliveries arriving during the linger do not wake the
/// consumer one by one: it takes what is waiting, sleeps out the linger, and takes what came. Both
/// buses' `next` are cancel-safe (a delivery is taken only when it is returned), so looking without
/// waiting loses nothing.
pub async fn next_batch(subscription: &mut dyn Subscription, max: usize, linger: std::time::Duration) -> Result<Vec<Delivery>, BusError> {
    let first = subscription.next().await?;
    let never = std::future::pending();
    tokio::pin!(never);
    Ok(gather(subscription, first, max, linger, never).await?.0)
}

/// `first` and what arrives within `linger` of it (up to `max`); true when `stop` completed first
/// (it ends the linger: what waits is taken at once). `stop` is not polled once it has completed.
async fn gather(
    subscription: &mut dyn Subscription,
    first: Delivery,
    max: usize,
    linger: std::time::Duration,
    stop: std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Result<(Vec<Delivery>, bool), BusError> {
    let mut deliveries = vec![first];
    let stopped = crate::batch::gather(&mut deliveries, max, linger, stop, waiting(subscription)).await?;
    Ok((deliveries, stopped))
}

/// Adds the deliveries already waiting to `deliveries`, without waiting (up to `max` in all).
fn take_waiting(subscription: &mut dyn Subscription, deliveries: &mut Vec<Delivery>, max: usize) -> Result<(), BusError> {
    crate::batch::take_waiting(deliveries, max, waiting(subscription))
}

/// One delivery already waiting on `subscription`, without waiting for one.
fn waiting(subscription: &mut dyn Subscription) -> impl FnMut() -> Result<Option<Delivery>, BusError> + '_ {
    use futures::FutureExt;
    move || subscription.next().now_or_never().transpose()
}

/// How a consumer batches its deliveries.
#[derive(Debug, Clone, Copy)]
pub struct Batching {
    /// The most deliveries a batch takes.
    pub max: usize,
    /// How long a batch waits for more after its first delivery.
    pub linger: std::time::Duration,
    /// The pause after a batch whose writes failed (its deliveries come back).
    pub retry_pause: std::time::Duration,
}

/// Runs a consumer until `shutdown`: batches as `next_batch` does and hands each batch to `handle`,
/// which says whether a write failed (the deliveries come back after `retry_pause`). `shutdown` ends
/// the wait for a batch's first delivery or its linger, never its writes; then what is already waiting
/// is handled without lingering, so a process that stops its producers first leaves nothing behind.
/// Errs when the bus fails.
pub async fn consume<Handling: Future<Output = bool>>(
    subscription: &mut dyn Subscription,
    batching: Batching,
    shutdown: impl Future<Output = ()>,
    mut handle: impl FnMut(Vec<Delivery>) -> Handling,
) -> Result<(), BusError> {
    tokio::pin!(shutdown);
    let mut stopping = false;
    while !stopping {
        let first = tokio::select! {
            () = &mut shutdown => break,
            first = subscription.next() => first?,
        };
        let (deliveries, stopped) = gather(subscription, first, batching.max, batching.linger, shutdown.as_mut()).await?;
        stopping = stopped;
        if handle(deliveries).await {
            tokio::time::sleep(batching.retry_pause).await;
        }
    }
    loop {
        let mut deliveries = Vec::new();
        take_waiting(subscription, &mut deliveries, batching.max)?;
        if deliveries.is_empty() {
            return Ok(());
        }
        if handle(deliveries).await {
            tracing::warn!("stopping with deliveries whose writes failed: they stay on the bus");
            return Ok(());
        }
    }
}

/// A delivered message: call `ack` once it is handled, or it will be delivered again.
pub struct Delivery {
    message: BusMessage,
    acknowledger: Option<Box<dyn Acknowledger>>,
}

/// What settles a delivery for its backend.
pub trait Acknowledger: Send {
    /// The message was handled.
    fn ack(self: Box<Self>, message: &BusMessage);
    /// The message was not handled; deliver it again.
    fn redeliver(self: Box<Self>, message: BusMessage);
}

impl Delivery {
    /// A delivery settled by `acknowledger`.
    pub fn new(message: BusMessage, acknowledger: Box<dyn Acknowledger>) -> Self {
        Delivery { message, acknowledger: Some(acknowledger) }
    }

    /// The message.
    pub fn message(&self) -> &BusMessage {
        &self.message
    }

    /// Marks the message handled.
    pub fn ack(mut self) {
        if let Some(acknowledger) = self.acknowledger.take() {
            acknowledger.ack(&self.message);
        }
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if let Some(acknowledger) = self.acknowledger.take() {
            acknowledger.redeliver(self.message.clone());
        }
    }
}

/// The bus a process uses: Kafka when brokers are configured (`BR_KAFKA_BROKERS`, comma-separated
/// `host:port`), in process otherwise. A build without the `kafka` feature refuses brokers rather than
/// silently keeping each process's events to itself.
pub fn select_bus(kafka_brokers: Option<&str>) -> Result<Arc<dyn EventBus>, BusError> {
    match kafka_brokers.map(str::trim).filter(|brokers| !brokers.is_empty()) {
        None => Ok(Arc::new(InProcessBus::new())),
        Some(brokers) => kafka_bus(brokers),
    }
}

/// The bus for per-process broadcast groups (cache invalidation): on Kafka, a new group starts at the
/// newest message instead of replaying history; in process, `shared` itself (the publishers' bus).
pub fn select_broadcast_bus(kafka_brokers: Option<&str>, shared: &Arc<dyn EventBus>) -> Result<Arc<dyn EventBus>, BusError> {
    match kafka_brokers.map(str::trim).filter(|brokers| !brokers.is_empty()) {
        None => Ok(shared.clone()),
        Some(brokers) => kafka_broadcast_bus(brokers),
    }
}

#[cfg(feature = "kafka")]
fn kafka_bus(brokers: &str) -> Result<Arc<dyn EventBus>, BusError> {
    Ok(Arc::new(kafka::KafkaBus::new(kafka::KafkaOptions::new(brokers))?))
}

#[cfg(feature = "kafka")]
fn kafka_broadcast_bus(brokers: &str) -> Result<Arc<dyn EventBus>, BusError> {
    let mut options = kafka::KafkaOptions::new(brokers);
    options.new_groups_start_at_earliest = false;
    Ok(Arc::new(kafka::KafkaBus::new(options)?))
}

#[cfg(not(feature = "kafka"))]
fn kafka_bus(_brokers: &str) -> Result<Arc<dyn EventBus>, BusError> {
    Err(BusError::Backend("BR_KAFKA_BROKERS is set but this build has no Kafka support (cargo feature `kafka`)".to_string()))
}

#[cfg(not(feature = "kafka"))]
fn kafka_broadcast_bus(brokers: &str) -> Result<Arc<dyn EventBus>, BusError> {
    kafka_bus(brokers)
}

/// Consumer groups of each topic.
type Topics = HashMap<String, HashMap<String, Arc<GroupQueue>>>;

/// The in-process bus used by `brainstorm up` and by tests.
#[derive(Clone, Default)]
pub struct InProcessBus {
    topics: Arc<Mutex<Topics>>,
}

#[derive(Default)]
struct GroupQueue {
    pending: Mutex<VecDeque<BusMessage>>,
    notify: Notify,
}

impl GroupQueue {
    fn pending(&self) -> MutexGuard<'_, VecDeque<BusMessage>> {
        // A poisoned queue still holds valid messages: keep delivering them.
        self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl InProcessBus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    fn topics(&self) -> MutexGuard<'_, Topics> {
        self.topics.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `message` for every consumer group of its topic (the last group takes the message
    /// itself, the others a copy).
    fn append(&self, message: BusMessage) {
        let topics = self.topics();
        let Some(groups) = topics.get(&message.topic) else { return };
        let last = groups.len().saturating_sub(1);
        let mut message = Some(message);
        for (index, group) in groups.values().enumerate() {
            let copy = if index == last { message.take() } else { message.clone() };
            let Some(copy) = copy else { break };
            group.pending().push_back(copy);
            group.notify.notify_one();
        }
    }
}

#[async_trait]
impl EventBus for InProcessBus {
    async fn publish(&self, topic: &str, key: &str, payload: Bytes) -> Result<(), BusError> {
        self.append(BusMessage::new(topic, key, payload));
        Ok(())
    }

    async fn publish_event(&self, topic: &str, key: &str, event: Arc<dyn Event>) -> Result<(), BusError> {
        self.append(BusMessage::event(topic, key, event));
        Ok(())
    }

    async fn subscribe(&self, topic: &str, group: &str) -> Result<Box<dyn Subscription>, BusError> {
        let queue = self.topics().entry(topic.to_string()).or_default().entry(group.to_string()).or_default().clone();
        Ok(Box::new(InProcessSubscription { queue }))
    }
}

struct InProcessSubscription {
    queue: Arc<GroupQueue>,
}

#[async_trait]
impl Subscription for InProcessSubscription {
    async fn next(&mut self) -> Result<Delivery, BusError> {
        loop {
            // Register interest before looking, so a publish between the look and the wait is not missed.
            let notified = self.queue.notify.notified();
            if let Some(message) = self.queue.pending().pop_front() {
                let acknowledger = InProcessAcknowledger { queue: self.queue.clone() };
                return Ok(Delivery::new(message, Box::new(acknowledger)));
            }
            notified.await;
        }
    }
}

struct InProcessAcknowledger {
    queue: Arc<GroupQueue>,
}

impl Acknowledger for InProcessAcknowledger {
    fn ack(self: Box<Self>, _message: &BusMessage) {}

    fn redeliver(self: Box<Self>, message: BusMessage) {
        self.queue.pending().push_front(message);
        self.queue.notify.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn next_payload(subscription: &mut Box<dyn Subscription>) -> Result<(String, Delivery), BusError> {
        let delivery = tokio::time::timeout(Duration::from_secs(2), subscription.next())
            .await
            .map_err(|_| BusError::Backend("timed out waiting for a delivery".to_string()))??;
        let text = String::from_utf8_lossy(&delivery.message().payload()).to_string();
        Ok((text, delivery))
    }

    #[test]
    fn no_brokers_selects_the_in_process_bus() {
        assert!(select_bus(None).is_ok());
        assert!(select_bus(Some("  ")).is_ok());
        if !cfg!(feature = "kafka") {
            assert!(select_bus(Some("127.0.0.1:9092")).is_err(), "a build without Kafka refuses brokers");
        }
    }

    #[tokio::test]
    async fn every_group_gets_every_message_in_order() -> Result<(), BusError> {
        let bus = InProcessBus::new();
        let mut audit = bus.subscribe("events", "audit").await?;
        let mut edge = bus.subscribe("events", "edge").await?;
        for index in 0..3 {
            bus.publish("events", "tenant-1", Bytes::from(format!("m{index}"))).await?;
        }
        for subscription in [&mut audit, &mut edge] {
            for index in 0..3 {
                let (text, delivery) = next_payload(subscription).await?;
                assert_eq!(text, format!("m{index}"));
                delivery.ack();
            }
        }
        Ok(())
    }

    #[tokio::test]
    async fn an_unacked_message_is_delivered_again_first() -> Result<(), BusError> {
        let bus = InProcessBus::new();
        let mut consumer = bus.subscribe("events", "group").await?;
        bus.publish("events", "k", Bytes::from_static(b"first")).await?;
        bus.publish("events", "k", Bytes::from_static(b"second")).await?;
        let (text, delivery) = next_payload(&mut consumer).await?;
        assert_eq!(text, "first");
        drop(delivery);
        let (text, delivery) = next_payload(&mut consumer).await?;
        assert_eq!(text, "first", "a dropped delivery comes back before newer messages");
        delivery.ack();
        let (text, delivery) = next_payload(&mut consumer).await?;
        assert_eq!(text, "second");
        delivery.ack();
        Ok(())
    }

    #[tokio::test]
    async fn consumers_of_one_group_share_the_work() -> Result<(), BusError> {
        let bus = InProcessBus::new();
        let mut first = bus.subscribe("events", "workers").await?;
        let mut second = bus.subscribe("events", "workers").await?;
        bus.publish("events", "k", Bytes::from_static(b"a")).await?;
        bus.publish("events", "k", Bytes::from_static(b"b")).await?;
        let (a, delivery_a) = next_payload(&mut first).await?;
        let (b, delivery_b) = next_payload(&mut second).await?;
        delivery_a.ack();
        delivery_b.ack();
        assert_eq!((a.as_str(), b.as_str()), ("a", "b"));
        assert!(tokio::time::timeout(Duration::from_millis(50), first.next()).await.is_err(), "nothing is delivered twice");
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_takes_what_waits_and_what_arrives_within_the_linger() -> Result<(), BusError> {
        let bus = Arc::new(InProcessBus::new());
        let mut consumer = bus.subscribe("events", "group").await?;
        for payload in ["a", "b", "c"] {
            bus.publish("events", "k", Bytes::from(payload)).await?;
        }
        // Three waiting, a cap of two: the batch is full at once, without lingering.
        let started = tokio::time::Instant::now();
        let full = next_batch(consumer.as_mut(), 2, Duration::from_millis(25)).await?;
        assert_eq!(full.len(), 2);
        assert_eq!(started.elapsed(), Duration::ZERO);
        // One waiting; one more arrives within the linger, one after it.
        let publisher = bus.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let _ = publisher.publish("events", "k", Bytes::from("d")).await;
            tokio::time::sleep(Duration::from_millis(30)).await;
            let _ = publisher.publish("events", "k", Bytes::from("e")).await;
        });
        let batch = next_batch(consumer.as_mut(), 10, Duration::from_millis(25)).await?;
        let payloads: Vec<_> = batch.iter().map(|delivery| delivery.message().payload()).collect();
        assert_eq!(payloads, [Bytes::from("c"), Bytes::from("d")]);
        assert_eq!(started.elapsed(), Duration::from_millis(25));
        let late = next_batch(consumer.as_mut(), 10, Duration::from_millis(25)).await?;
        assert_eq!(late.len(), 1);
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_cuts_the_linger_short_and_what_waits_is_handled_before_consume_returns() -> Result<(), BusError> {
        let bus = Arc::new(InProcessBus::new());
        let mut subscription = bus.subscribe("events", "group").await?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (seen, mut batches) = tokio::sync::mpsc::unbounded_channel::<Vec<Bytes>>();
        let batching = Batching { max: 2, linger: Duration::from_secs(3600), retry_pause: Duration::ZERO };
        let consumer = tokio::spawn(async move {
            let handle = move |deliveries: Vec<Delivery>| {
                let payloads = deliveries.iter().map(|delivery| delivery.message().payload()).collect();
                deliveries.into_iter().for_each(Delivery::ack);
                let _receiver_gone = seen.send(payloads);
                async { false }
            };
            consume(subscription.as_mut(), batching, async move { drop(stopped.await) }, handle).await
        });
        bus.publish("events", "k", Bytes::from("a")).await?;
        tokio::time::sleep(Duration::from_millis(10)).await;
        // The first batch lingers (an hour); more arrive, beyond one batch's cap; then the stop.
        for payload in ["b", "c", "d"] {
            bus.publish("events", "k", Bytes::from(payload)).await?;
        }
        let started = tokio::time::Instant::now();
        let _consumer_gone = stop.send(());
        consumer.await.map_err(|error| BusError::Backend(error.to_string()))??;
        assert!(started.elapsed() < Duration::from_secs(1), "the stop ended the linger");
        let mut handled = Vec::new();
        while let Ok(batch) = batches.try_recv() {
            handled.push(batch);
        }
        assert_eq!(handled, [vec![Bytes::from("a"), Bytes::from("b")], vec![Bytes::from("c"), Bytes::from("d")]]);
        Ok(())
    }

    #[tokio::test]
    async fn a_consumer_waiting_before_the_publish_is_woken() -> Result<(), BusError> {
        let bus = InProcessBus::new();
        let mut consumer = bus.subscribe("events", "group").await?;
        let publisher = bus.clone();
        let waiter = tokio::spawn(async move {
            next_payload(&mut consumer).await.map(|(text, delivery)| {
                delivery.ack();
                text
            })
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        publisher.publish("events", "k", Bytes::from_static(b"late")).await?;
        let text = waiter.await.map_err(|error| BusError::Backend(error.to_string()))??;
        assert_eq!(text, "late");
        Ok(())
    }

    #[tokio::test]
    async fn in_process_consumers_receive_the_published_event_itself() -> Result<(), Box<dyn std::error::Error>> {
        use brainstorm_proto::events::RoutingConfigChanged;
        use prost::Message;

        let bus = InProcessBus::new();
        let mut ledger = bus.subscribe("events", "ledger").await?;
        let mut anomaly = bus.subscribe("events", "anomaly").await?;
        let event =
            Arc::new(RoutingConfigChanged { tenant_id: "tenant-1".to_string(), occurred_at: "2026-11-25T10:00:00.000Z".to_string() });
        bus.publish_event("events", "tenant-1", event.clone()).await?;
        for subscription in [&mut ledger, &mut anomaly] {
            let delivery = tokio::time::timeout(Duration::from_secs(2), subscription.next()).await??;
            assert_eq!(delivery.message().key, "tenant-1");
            let received = delivery.message().decode::<RoutingConfigChanged>()?;
            assert!(Arc::ptr_eq(&received, &event), "the consumer gets the publisher's value, not a copy");
            // The wire form is there for whoever asks (a relay to another process).
            assert_eq!(RoutingConfigChanged::decode(delivery.message().payload())?, *event);
            delivery.ack();
        }
        Ok(())
    }

    #[tokio::test]
    async fn a_typed_event_redelivered_or_read_as_bytes_keeps_its_content() -> Result<(), Box<dyn std::error::Error>> {
        use brainstorm_proto::events::{IdentityEvent, RoutingConfigChanged};

        let bus = InProcessBus::new();
        let mut consumer = bus.subscribe("events", "group").await?;
        let event = Arc::new(RoutingConfigChanged { tenant_id: "tenant-2".to_string(), occurred_at: String::new() });
        bus.publish_event("events", "tenant-2", event.clone()).await?;
        let dropped = tokio::time::timeout(Duration::from_secs(2), consumer.next()).await??;
        drop(dropped);
        let again = tokio::time::timeout(Duration::from_secs(2), consumer.next()).await??;
        assert_eq!(*again.message().decode::<RoutingConfigChanged>()?, *event);
        // Read as another message type, it is decoded from its encoding, as it would be from Kafka:
        // field 1 of both is a string, so the tenant id comes through.
        let other = again.message().decode::<IdentityEvent>()?;
        assert_eq!(other.tenant_id, "tenant-2");
        again.ack();
        Ok(())
    }
}
