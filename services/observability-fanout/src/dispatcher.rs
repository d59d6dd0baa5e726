//! Delivery: events go to the enabled destinations of their tenant that subscribed to their type
//! and whose filter rules admit them, gathered per destination until its batch is full or its
//! flush interval passed since the batch's first event, then sent in one request. Delivery is at
//! most once: a failed request is counted (`failed`), not retried; a destination whose buffer is
//! full drops what comes (`dropped`); what waits in buffers at a stop is lost.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use tokio::sync::{Semaphore, mpsc};

use crate::events::Event;
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
/// One request's limit.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends one request; Ok when the destination answered 2xx.
pub async fn send(http: &reqwest::Client, request: formats::HttpRequest) -> Result<(), String> {
    let method = reqwest::Method::from_bytes(request.method.as_bytes()).map_err(|error| error.to_string())?;
    let mut builder = http.request(method, &request.url).timeout(REQUEST_TIMEOUT).body(request.body);
    for (name, value) in &request.headers {
        builder = builder.header(name, value);
    }
    let response = builder.send().await.map_err(|error| format!("cannot reach the destination: {}", error.without_url()))?;
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    let body = response.text().await.unwrap_or_default();
    Err(format!("the destination answered HTTP {}: {}", status.as_u16(), body.chars().take(200).collect::<String>()))
}

/// Hands events to the delivery task.
#[derive(Clone)]
pub struct Dispatcher {
    sender: mpsc::Sender<Vec<Event>>,
}

impl Dispatcher {
    /// Starts the delivery task.
    pub fn spawn(store: FanoutStore, opener: Opener, http: reqwest::Client) -> Dispatcher {
        let (sender, receiver) = mpsc::channel(256);
        let worker = Worker { store, opener, http, buffers: HashMap::new(), in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)) };
        tokio::spawn(worker.run(receiver));
        Dispatcher { sender }
    }

    /// Queues events (waits while the delivery task is behind).
    pub async fn submit(&self, events: Vec<Event>) {
        if !events.is_empty() && self.sender.send(events).await.is_err() {
            tracing::warn!("the fan-out delivery task stopped; events are lost");
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
    http: reqwest::Client,
    buffers: HashMap<String, Buffer>,
    in_flight: Arc<Semaphore>,
}

impl Worker {
    async fn run(mut self, mut receiver: mpsc::Receiver<Vec<Event>>) {
        let mut tick = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                received = receiver.recv() => match received {
                    Some(events) => self.route(events).await,
                    None => break,
                },
                _ = tick.tick() => self.flush_due(),
            }
        }
    }

    /// Puts each event in the buffers of the destinations that take it.
    async fn route(&mut self, events: Vec<Event>) {
        let mut by_tenant: HashMap<String, Vec<Event>> = HashMap::new();
        for event in events {
            by_tenant.entry(event.tenant_id.clone()).or_default().push(event);
        }
        for (tenant_id, events) in by_tenant {
            let (enabled, destinations) = match (self.store.enabled(&tenant_id).await, self.store.list(&tenant_id, "").await) {
                (Ok(enabled), Ok(destinations)) => (enabled, destinations),
                (Err(error), _) | (_, Err(error)) => {
                    tracing::warn!(%error, tenant_id, "cannot read the tenant's destinations; its events are not fanned out");
                    continue;
                }
            };
            for stored in destinations {
                let destination = &stored.destination;
                // The tenant's switch governs observability destinations; XDR connectors have their own.
                if !destination.enabled || (destination.kind == "observability" && !enabled) {
                    continue;
                }
                let rules = FilterRules::parse(&destination.filter_rules_json).unwrap_or_default();
                let taken: Vec<Event> =
                    events.iter().filter(|event| subscribed(&destination.event_types, event) && rules.admits(event)).cloned().collect();
                if taken.is_empty() {
                    continue;
                }
                let config = match self.opener.config(&stored) {
                    Ok(config) => config,
                    Err(error) => {
                        tracing::error!(%error, destination = %destination.id, "cannot open a destination's secrets");
                        continue;
                    }
                };
                let id = destination.id.clone();
                let buffer = self.buffers.entry(id.clone()).or_insert_with(|| Buffer {
                    destination: stored.clone(),
                    config: config.clone(),
                    events: Vec::new(),
                    first_at: Instant::now(),
                    dropped: 0,
                });
                // The newest settings win (a destination changed since its buffer began).
                buffer.destination = stored.clone();
                buffer.config = config;
                if buffer.events.is_empty() {
                    buffer.first_at = Instant::now();
                }
                for event in taken {
                    if buffer.events.len() >= MAX_BUFFERED {
                        buffer.dropped += 1;
                    } else {
                        buffer.events.push(event);
                    }
                }
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
        let (store, http, in_flight) = (self.store.clone(), self.http.clone(), self.in_flight.clone());
        tokio::spawn(async move {
            let _permit = in_flight.acquire_owned().await;
            let now = chrono::Utc::now();
            let (mut sent, mut failed) = (0_u64, 0_u64);
            for batch in batches {
                let count = batch.len() as u64;
                let outcome = match formats::request(&destination.kind, &destination.r#type, &config, &batch, now) {
                    Ok(request) => send(&http, request).await,
                    Err(error) => Err(error),
                };
                match outcome {
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
    }
}
