//! The Kafka bus's delivery guarantees, on librdkafka's mock cluster (always) and on a real broker
//! (when `BR_TEST_KAFKA_BROKERS` names one; `scripts/ensure-kafka.sh` starts tansu and prints it).
#![cfg(feature = "kafka")]

use std::collections::BTreeMap;
use std::time::Duration;

use brainstorm_common::bus::kafka::{KafkaBus, KafkaOptions};
use brainstorm_common::bus::{Delivery, EventBus, Subscription};
use bytes::Bytes;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Where the scenarios run.
struct Broker {
    mock: Option<MockCluster<'static, DefaultProducerContext>>,
    brokers: String,
}

impl Broker {
    fn mock() -> Result<Self, Box<dyn std::error::Error>> {
        let mock = MockCluster::new(1)?;
        Ok(Broker { brokers: mock.bootstrap_servers(), mock: Some(mock) })
    }

    fn real() -> Option<Self> {
        std::env::var("BR_TEST_KAFKA_BROKERS").ok().filter(|brokers| !brokers.is_empty()).map(|brokers| Broker { mock: None, brokers })
    }

    /// A fresh topic with `partitions` partitions, and a bus over it.
    fn topic_and_bus(&self, partitions: i32) -> Result<(String, KafkaBus), Box<dyn std::error::Error>> {
        let topic = format!("test-{}", uuid::Uuid::new_v4().simple());
        let mut options = KafkaOptions::new(&self.brokers);
        options.partitions = partitions;
        // A consumer that vanishes is noticed within seconds rather than the default 45 s.
        options.extra.insert("session.timeout.ms".to_string(), "6000".to_string());
        options.extra.insert("heartbeat.interval.ms".to_string(), "500".to_string());
        match &self.mock {
            // The mock cluster has no CreateTopics: make the topic on the mock itself.
            Some(mock) => {
                mock.create_topic(&topic, partitions, 1)?;
                options.create_topics = false;
            }
            // A real broker: the bus creates the topic on first use.
            None => options.create_topics = true,
        }
        Ok((topic, KafkaBus::new(options)?))
    }
}

fn group(name: &str) -> String {
    format!("{name}-{}", uuid::Uuid::new_v4().simple())
}

async fn next(subscription: &mut Box<dyn Subscription>) -> Result<(String, Delivery), Box<dyn std::error::Error>> {
    let delivery = tokio::time::timeout(Duration::from_secs(60), subscription.next()).await??;
    let text = String::from_utf8_lossy(&delivery.message().payload()).into_owned();
    Ok((text, delivery))
}

macro_rules! on_both_brokers {
    ($($test:ident),* $(,)?) => {
        mod mock_cluster {
            $(
                #[tokio::test]
                async fn $test() -> super::TestResult {
                    super::$test(super::Broker::mock()?).await
                }
            )*
        }
        mod real_broker {
            $(
                #[tokio::test]
                async fn $test() -> super::TestResult {
                    match super::Broker::real() {
                        Some(broker) => super::$test(broker).await,
                        // Without a broker address there is nothing to run against.
                        None => Ok(()),
                    }
                }
            )*
        }
    };
}

on_both_brokers!(
    every_group_gets_every_message_and_each_key_keeps_its_order,
    a_dropped_delivery_comes_back_before_newer_messages,
    a_crashed_consumer_loses_nothing_and_the_next_resumes_at_the_first_unacked,
);

async fn every_group_gets_every_message_and_each_key_keeps_its_order(broker: Broker) -> TestResult {
    let (topic, bus) = broker.topic_and_bus(3)?;
    let mut audit = bus.subscribe(&topic, &group("audit")).await?;
    let mut edge = bus.subscribe(&topic, &group("edge")).await?;
    for index in 0..24 {
        let tenant = format!("tenant-{}", index % 4);
        bus.publish(&topic, &tenant, Bytes::from(format!("{tenant}:{index}"))).await?;
    }
    for subscription in [&mut audit, &mut edge] {
        let mut seen: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for _ in 0..24 {
            let (text, delivery) = next(subscription).await?;
            let (key, index) = text.split_once(':').ok_or("malformed payload")?;
            assert_eq!(delivery.message().key, key, "the key travels with the message");
            seen.entry(key.to_string()).or_default().push(index.parse()?);
            delivery.ack();
        }
        assert_eq!(seen.len(), 4);
        for (key, indexes) in &seen {
            let mut sorted = indexes.clone();
            sorted.sort_unstable();
            assert_eq!(indexes, &sorted, "{key} kept its order across partitions");
            assert_eq!(indexes.len(), 6);
        }
    }
    Ok(())
}

async fn a_dropped_delivery_comes_back_before_newer_messages(broker: Broker) -> TestResult {
    let (topic, bus) = broker.topic_and_bus(1)?;
    let mut consumer = bus.subscribe(&topic, &group("group")).await?;
    for text in ["first", "second", "third"] {
        bus.publish(&topic, "k", Bytes::from(text)).await?;
    }
    let (text, delivery) = next(&mut consumer).await?;
    assert_eq!(text, "first");
    drop(delivery);
    let (text, delivery) = next(&mut consumer).await?;
    assert_eq!(text, "first", "a dropped delivery comes back before newer messages");
    delivery.ack();
    let (text, second) = next(&mut consumer).await?;
    assert_eq!(text, "second");
    let (text, third) = next(&mut consumer).await?;
    assert_eq!(text, "third");
    third.ack();
    drop(second);
    let (text, delivery) = next(&mut consumer).await?;
    assert_eq!(text, "second", "dropped after a later one was acked: still delivered again");
    delivery.ack();
    let (text, delivery) = next(&mut consumer).await?;
    assert_eq!(text, "third", "at least once: what followed the dropped one comes again too");
    delivery.ack();
    Ok(())
}

async fn a_crashed_consumer_loses_nothing_and_the_next_resumes_at_the_first_unacked(broker: Broker) -> TestResult {
    let (topic, bus) = broker.topic_and_bus(1)?;
    let workers = group("workers");
    for text in ["a", "b", "c", "d"] {
        bus.publish(&topic, "k", Bytes::from(text)).await?;
    }
    let mut crashed = bus.subscribe(&topic, &workers).await?;
    let (text, a) = next(&mut crashed).await?;
    assert_eq!(text, "a");
    a.ack();
    let (_, b) = next(&mut crashed).await?;
    let (_, c) = next(&mut crashed).await?;
    c.ack();
    // Give the asynchronous commits time to land, then the consumer dies with `b` never acked.
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(crashed);
    drop(b);

    let mut restarted = bus.subscribe(&topic, &workers).await?;
    let mut texts = Vec::new();
    for _ in 0..3 {
        let (text, delivery) = next(&mut restarted).await?;
        texts.push(text);
        delivery.ack();
    }
    assert_eq!(texts, ["b", "c", "d"], "nothing unacked is lost and nothing before it comes back");
    Ok(())
}
