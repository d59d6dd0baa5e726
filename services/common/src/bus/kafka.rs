//! The Kafka event bus (rdkafka, bundled librdkafka), for the distributed shape (`BR_KAFKA_BROKERS`).
//!
//! - Publish: keyed by the message key (a tenant id, usually) with librdkafka's `murmur2_random`
//!   partitioner (the Java client's), so one key always lands in one partition and keeps its order.
//!   The producer is idempotent (`enable.idempotence`, acks from all in-sync replicas) unless turned off:
//!   a retried send never duplicates or reorders within a partition.
//! - Topics are created on first use (`partitions`, `replication_factor`); one that already exists is
//!   fine. When the admin request itself fails (no admin API, as on librdkafka's mock cluster, or no
//!   right to use it) the bus warns and leaves the topic to the broker's auto-creation.
//! - Subscribe: one Kafka consumer per subscription in the group, offsets stored and committed only by
//!   `ack` (auto-commit off). The committed position of a partition never passes a delivery that is
//!   still out or was dropped: it is the lowest offset handed out and not yet acked.
//! - A delivery dropped without `ack` is delivered again before newer messages of its partition: the
//!   consumer seeks back to it, and messages of that partition fetched before the seek are skipped until
//!   it comes round again. A crashed consumer's uncommitted messages go to the group's next consumer.
//!   Delivery is at least once: consumers must be idempotent (the audit chain and the budget ledger
//!   dedupe by request id).
//! - A group with no committed offset starts at the earliest retained message (configurable).
//! - Consumers of one group share the partitions: a topic every process must see (cache invalidation)
//!   needs a group per process, e.g. `edge-router-<instance id>`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rdkafka::ClientContext;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::util::Timeout;

use super::{Acknowledger, BusError, BusMessage, Delivery, EventBus, Subscription};

/// How the Kafka bus connects and creates topics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaOptions {
    /// `host:port[,host:port...]` (`BR_KAFKA_BROKERS`).
    pub brokers: String,
    /// Partitions of a topic the bus creates.
    pub partitions: i32,
    pub replication_factor: i32,
    /// Create topics on first use through the admin API.
    pub create_topics: bool,
    /// An idempotent producer (needs broker support for `InitProducerId`).
    pub idempotent_producer: bool,
    /// How long a publish may wait for the broker's acknowledgement.
    pub delivery_timeout: Duration,
    pub client_id: String,
    /// Where a group with no committed offset starts: the earliest retained message (true: nothing
    /// published before its first subscription is missed) or only new messages (false: for
    /// per-instance broadcast groups, such as cache invalidation, that need no history).
    pub new_groups_start_at_earliest: bool,
    /// Extra librdkafka properties for producers and consumers (security settings, tuning).
    pub extra: BTreeMap<String, String>,
}

impl KafkaOptions {
    /// Defaults for `brokers`: 6 partitions, replication 1, topics created, idempotent producer, new
    /// groups from the earliest message.
    pub fn new(brokers: impl Into<String>) -> Self {
        KafkaOptions {
            brokers: brokers.into(),
            partitions: 6,
            replication_factor: 1,
            create_topics: true,
            idempotent_producer: true,
            delivery_timeout: Duration::from_secs(30),
            client_id: "brainstorm".to_string(),
            new_groups_start_at_earliest: true,
            extra: BTreeMap::new(),
        }
    }

    fn base_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.brokers).set("client.id", &self.client_id);
        for (key, value) in &self.extra {
            config.set(key, value);
        }
        config
    }
}

fn backend(error: KafkaError) -> BusError {
    BusError::Backend(error.to_string())
}

/// The Kafka bus: cheap to share as `Arc<dyn EventBus>`.
pub struct KafkaBus {
    options: Arc<KafkaOptions>,
    producer: FutureProducer,
    admin: Option<AdminClient<DefaultClientContext>>,
    ready_topics: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for KafkaBus {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("KafkaBus").field("brokers", &self.options.brokers).finish_non_exhaustive()
    }
}

impl KafkaBus {
    /// A bus over the brokers in `options` (clients connect lazily; nothing is sent yet).
    pub fn new(options: KafkaOptions) -> Result<Self, BusError> {
        let mut producer_config = options.base_config();
        producer_config
            .set("partitioner", "murmur2_random")
            .set("message.timeout.ms", options.delivery_timeout.as_millis().to_string())
            .set("acks", "all")
            .set("enable.idempotence", if options.idempotent_producer { "true" } else { "false" });
        let producer: FutureProducer = producer_config.create().map_err(backend)?;
        let admin = if options.create_topics { Some(options.base_config().create().map_err(backend)?) } else { None };
        Ok(KafkaBus { options: Arc::new(options), producer, admin, ready_topics: Mutex::new(HashSet::new()) })
    }

    fn ready_topics(&self) -> MutexGuard<'_, HashSet<String>> {
        self.ready_topics.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Creates `topic` unless this bus already did (an existing topic is fine).
    async fn ensure_topic(&self, topic: &str) -> Result<(), BusError> {
        let Some(admin) = &self.admin else { return Ok(()) };
        if self.ready_topics().contains(topic) {
            return Ok(());
        }
        let new_topic = NewTopic::new(topic, self.options.partitions, TopicReplication::Fixed(self.options.replication_factor));
        let options = AdminOptions::new().operation_timeout(Some(Timeout::After(Duration::from_secs(10))));
        match admin.create_topics([&new_topic], &options).await {
            Ok(results) => {
                for result in results {
                    match result {
                        Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                        Err((name, code)) => return Err(BusError::Backend(format!("cannot create topic {name}: {code}"))),
                    }
                }
            }
            // No admin API (or no right to use it): the broker's auto-creation, if any, has the last word.
            Err(error) => tracing::warn!(%error, topic, "cannot create the topic through the admin API; relying on the broker"),
        }
        self.ready_topics().insert(topic.to_string());
        Ok(())
    }
}

#[async_trait]
impl EventBus for KafkaBus {
    async fn publish(&self, topic: &str, key: &str, payload: Bytes) -> Result<(), BusError> {
        self.ensure_topic(topic).await?;
        let record = FutureRecord::to(topic).key(key).payload(payload.as_ref());
        self.producer.send(record, Timeout::After(self.options.delivery_timeout)).await.map_err(|(error, _)| backend(error))?;
        Ok(())
    }

    async fn subscribe(&self, topic: &str, group: &str) -> Result<Box<dyn Subscription>, BusError> {
        self.ensure_topic(topic).await?;
        let partitions = Arc::new(Mutex::new(HashMap::new()));
        let mut config = self.options.base_config();
        config
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", if self.options.new_groups_start_at_earliest { "earliest" } else { "latest" })
            .set("enable.partition.eof", "false");
        let context = GroupContext { partitions: partitions.clone() };
        let consumer: StreamConsumer<GroupContext> = config.create_with_context(context).map_err(backend)?;
        consumer.subscribe(&[topic]).map_err(backend)?;
        Ok(Box::new(KafkaSubscription { shared: Arc::new(Shared { consumer, partitions }) }))
    }
}

/// Delivery bookkeeping of one assigned partition.
#[derive(Debug, Default)]
struct PartitionState {
    /// Bumped on every assignment change: acks from an earlier assignment are ignored.
    epoch: u64,
    /// Offsets handed out and neither acked nor dropped.
    outstanding: BTreeSet<i64>,
    /// The lowest dropped offset, to deliver again before anything newer of this partition.
    rewind_to: Option<i64>,
    /// The next offset after the highest acked one.
    acked_through: Option<i64>,
    /// The position last committed by this consumer.
    committed: Option<i64>,
}

impl PartitionState {
    /// Where the group may resume: nothing before it is out or dropped.
    fn commit_position(&self) -> Option<i64> {
        match (self.outstanding.first(), self.rewind_to) {
            (Some(outstanding), Some(rewind)) => Some((*outstanding).min(rewind)),
            (Some(outstanding), None) => Some(*outstanding),
            (None, Some(rewind)) => Some(rewind),
            (None, None) => self.acked_through,
        }
    }
}

type Partitions = Arc<Mutex<HashMap<(String, i32), PartitionState>>>;

fn lock(partitions: &Partitions) -> MutexGuard<'_, HashMap<(String, i32), PartitionState>> {
    partitions.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Resets the bookkeeping of partitions as the group assigns and revokes them.
struct GroupContext {
    partitions: Partitions,
}

impl ClientContext for GroupContext {}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let list = match rebalance {
            Rebalance::Assign(list) | Rebalance::Revoke(list) => *list,
            Rebalance::Error(error) => {
                tracing::warn!(%error, "kafka consumer group rebalance failed");
                return;
            }
        };
        let mut partitions = lock(&self.partitions);
        for element in list.elements() {
            let state = partitions.entry((element.topic().to_string(), element.partition())).or_default();
            // A new epoch: what was handed out before belongs to the previous assignment.
            *state = PartitionState { epoch: state.epoch + 1, ..PartitionState::default() };
        }
    }
}

struct Shared {
    consumer: StreamConsumer<GroupContext>,
    partitions: Partitions,
}

impl Shared {
    fn commit(&self, topic: &str, partition: i32, position: i64) {
        let mut list = TopicPartitionList::new();
        if let Err(error) = list.add_partition_offset(topic, partition, Offset::Offset(position)) {
            tracing::warn!(%error, topic, partition, "cannot build a kafka commit");
            return;
        }
        if let Err(error) = self.consumer.commit(&list, CommitMode::Async) {
            tracing::warn!(%error, topic, partition, position, "kafka commit failed; the messages will be delivered again");
        }
    }
}

struct KafkaSubscription {
    shared: Arc<Shared>,
}

#[async_trait]
impl Subscription for KafkaSubscription {
    async fn next(&mut self) -> Result<Delivery, BusError> {
        loop {
            let message = self.shared.consumer.recv().await.map_err(backend)?;
            let (topic, partition, offset) = (message.topic().to_string(), message.partition(), message.offset());
            let epoch = {
                let mut partitions = lock(&self.shared.partitions);
                let state = partitions.entry((topic.clone(), partition)).or_default();
                match state.rewind_to {
                    // Fetched before the seek back: it comes round again after the dropped one.
                    Some(rewind) if offset != rewind => continue,
                    Some(_) => state.rewind_to = None,
                    None => {}
                }
                state.outstanding.insert(offset);
                state.epoch
            };
            let bus_message = BusMessage::new(
                topic.clone(),
                message.key().map(|key| String::from_utf8_lossy(key).into_owned()).unwrap_or_default(),
                Bytes::copy_from_slice(message.payload().unwrap_or_default()),
            );
            let acknowledger = KafkaAcknowledger { shared: self.shared.clone(), topic, partition, offset, epoch };
            return Ok(Delivery::new(bus_message, Box::new(acknowledger)));
        }
    }
}

struct KafkaAcknowledger {
    shared: Arc<Shared>,
    topic: String,
    partition: i32,
    offset: i64,
    epoch: u64,
}

impl Acknowledger for KafkaAcknowledger {
    fn ack(self: Box<Self>, _message: &BusMessage) {
        let position = {
            let mut partitions = lock(&self.shared.partitions);
            let Some(state) = partitions.get_mut(&(self.topic.clone(), self.partition)) else { return };
            if state.epoch != self.epoch {
                return;
            }
            state.outstanding.remove(&self.offset);
            state.acked_through = Some(state.acked_through.unwrap_or(0).max(self.offset + 1));
            match state.commit_position() {
                Some(position) if state.committed.is_none_or(|committed| position > committed) => {
                    state.committed = Some(position);
                    position
                }
                _ => return,
            }
        };
        self.shared.commit(&self.topic, self.partition, position);
    }

    fn redeliver(self: Box<Self>, _message: BusMessage) {
        {
            let mut partitions = lock(&self.shared.partitions);
            let Some(state) = partitions.get_mut(&(self.topic.clone(), self.partition)) else { return };
            if state.epoch != self.epoch {
                return;
            }
            state.outstanding.remove(&self.offset);
            state.rewind_to = Some(state.rewind_to.map_or(self.offset, |rewind| rewind.min(self.offset)));
        }
        // A zero timeout makes the seek asynchronous: nothing blocks here.
        if let Err(error) =
            self.shared.consumer.seek(&self.topic, self.partition, Offset::Offset(self.offset), Timeout::After(Duration::ZERO))
        {
            tracing::warn!(%error, topic = %self.topic, partition = self.partition, "kafka seek back failed; the message returns after a restart");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Delivery scenarios run against librdkafka's mock cluster and a real broker in `tests/kafka_bus.rs`.

    #[test]
    fn the_commit_position_never_passes_an_outstanding_or_dropped_offset() {
        let mut state = PartitionState::default();
        state.outstanding.extend([5, 7]);
        state.acked_through = Some(7);
        assert_eq!(state.commit_position(), Some(5));
        state.outstanding.remove(&5);
        state.rewind_to = Some(6);
        assert_eq!(state.commit_position(), Some(6));
        state.outstanding.clear();
        assert_eq!(state.commit_position(), Some(6));
        state.rewind_to = None;
        assert_eq!(state.commit_position(), Some(7));
    }
}
