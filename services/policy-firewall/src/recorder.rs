//! `InterceptionRecorder`: the edge's firewall interceptions, stored in the background a batch at a
//! time (one write per batch instead of one per intercepted request).
//!
//! `record` never waits: it queues the interception in a bounded buffer. One task gathers what arrives
//! within its linger (up to `MAX_BATCH`) and sends it in one `record_interceptions` call. With the buffer
//! full (the service unreachable for long), new interceptions are dropped and counted: the request's
//! audit record, chained separately, still says what the firewall did.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use brainstorm_common::batch;
use brainstorm_proto::policy::{Interception, InterceptionBatch, PolicyFirewallClient};
use tokio::sync::{Notify, mpsc};

/// Interceptions waiting to be stored, at most.
const CAPACITY: usize = 10_000;
/// The most a batch carries.
const MAX_BATCH: usize = 256;

/// A cheap handle on the recorder's buffer; its task ends when every handle is dropped.
#[derive(Debug, Clone)]
pub struct InterceptionRecorder {
    sender: mpsc::Sender<Interception>,
    dropped: Arc<AtomicU64>,
    /// Interceptions queued and not yet sent to the store.
    waiting: Arc<AtomicU64>,
    /// Ends the linger of the batch being gathered (`flushed`).
    flush: Arc<Notify>,
}

impl InterceptionRecorder {
    /// Starts the recording task (on the current tokio runtime); a batch waits `linger` for more
    /// after its first interception.
    pub fn spawn(client: PolicyFirewallClient, linger: Duration) -> Self {
        let (sender, receiver) = mpsc::channel(CAPACITY);
        let (waiting, flush) = (Arc::new(AtomicU64::new(0)), Arc::new(Notify::new()));
        tokio::spawn(store_batches(client, receiver, linger, waiting.clone(), flush.clone()));
        InterceptionRecorder { sender, dropped: Arc::new(AtomicU64::new(0)), waiting, flush }
    }

    /// Queues an interception without waiting.
    pub fn record(&self, interception: Interception) {
        // Counted before it is sent: the task may store it before this thread counts it otherwise.
        self.waiting.fetch_add(1, Ordering::Relaxed);
        if self.sender.try_send(interception).is_err() {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::warn!(dropped, "interception buffer full: dropping a firewall interception");
        }
    }

    /// Sends what is queued at once (the batch being gathered stops lingering) and waits until it is
    /// stored or refused: at shutdown, once no request records any more (the caller bounds the wait).
    pub async fn flushed(&self) {
        while self.waiting.load(Ordering::Relaxed) > 0 {
            self.flush.notify_one();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

async fn store_batches(
    client: PolicyFirewallClient,
    mut receiver: mpsc::Receiver<Interception>,
    linger: Duration,
    waiting: Arc<AtomicU64>,
    flush: Arc<Notify>,
) {
    while let Some(first) = receiver.recv().await {
        let mut interceptions = vec![first];
        gather(&mut receiver, &mut interceptions, linger, &flush).await;
        let count = interceptions.len();
        if let Err(error) = client.record_interceptions(InterceptionBatch { interceptions }).await {
            tracing::warn!(%error, count, "could not record a batch of firewall interceptions");
        }
        waiting.fetch_sub(count as u64, Ordering::Relaxed);
    }
}

/// Adds to `interceptions` what arrives within `linger` of the first (up to `MAX_BATCH`), or until
/// `flush` is notified: one wake-up per batch (`batch::gather`).
async fn gather(receiver: &mut mpsc::Receiver<Interception>, interceptions: &mut Vec<Interception>, linger: Duration, flush: &Notify) {
    let flushed = flush.notified();
    tokio::pin!(flushed);
    let Ok(_flushed) = batch::gather(interceptions, MAX_BATCH, linger, flushed, || Ok::<_, Infallible>(receiver.try_recv().ok())).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interception(request_id: &str) -> Interception {
        Interception { request_id: Some(request_id.to_string()), ..Interception::default() }
    }

    #[tokio::test]
    async fn a_batch_takes_what_arrives_within_the_linger() {
        let (sender, mut receiver) = mpsc::channel(16);
        let flush = Notify::new();
        sender.send(interception("req_1")).await.unwrap();
        let late = sender.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            late.send(interception("req_2")).await.unwrap();
        });
        let mut batch = Vec::new();
        gather(&mut receiver, &mut batch, Duration::from_millis(300), &flush).await;
        let ids: Vec<_> = batch.iter().filter_map(|interception| interception.request_id.as_deref()).collect();
        assert_eq!(ids, ["req_1", "req_2"]);
    }

    #[tokio::test]
    async fn a_flush_ends_the_linger_and_takes_what_waits() {
        let (sender, mut receiver) = mpsc::channel(16);
        let flush = Notify::new();
        for id in ["req_1", "req_2"] {
            sender.send(interception(id)).await.unwrap();
        }
        // A flush asked before the batch lingers is kept (a permit) and ends the linger at once.
        flush.notify_one();
        let mut batch = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), gather(&mut receiver, &mut batch, Duration::from_secs(3600), &flush))
            .await
            .expect("the flush ends an hour's linger");
        assert_eq!(batch.len(), 2);
    }

    #[tokio::test]
    async fn a_batch_stops_at_its_maximum() {
        let (sender, mut receiver) = mpsc::channel(MAX_BATCH + 10);
        for index in 0..MAX_BATCH + 10 {
            sender.send(interception(&format!("req_{index}"))).await.unwrap();
        }
        let mut batch = Vec::new();
        // A full batch does not linger: an hour's linger would time this out.
        tokio::time::timeout(Duration::from_secs(5), gather(&mut receiver, &mut batch, Duration::from_secs(3600), &Notify::new()))
            .await
            .expect("a full batch goes at once");
        assert_eq!(batch.len(), MAX_BATCH);
        assert_eq!(receiver.len(), 10);
    }
}
