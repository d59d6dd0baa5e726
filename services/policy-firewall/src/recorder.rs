//! `InterceptionRecorder`: the edge's firewall interceptions, stored in the background a batch at a
//! time (one write per batch instead of one per intercepted request).
//!
//! `record` never waits: it queues the interception in a bounded buffer. One task gathers what arrives
//! within its linger (up to `MAX_BATCH`) and sends it in one `record_interceptions` call. With the buffer
//! full (the service unreachable for long), new interceptions are dropped and counted: the request's
//! audit record, chained separately, still says what the firewall did.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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
        let deadline = tokio::time::Instant::now() + linger;
        while interceptions.len() < MAX_BATCH {
            tokio::select! {
                received = tokio::time::timeout_at(deadline, receiver.recv()) => match received {
                    Ok(Some(interception)) => interceptions.push(interception),
                    Ok(None) | Err(_) => break,
                },
                () = flush.notified() => {
                    while interceptions.len() < MAX_BATCH && let Ok(interception) = receiver.try_recv() {
                        interceptions.push(interception);
                    }
                    break;
                }
            }
        }
        let count = interceptions.len();
        if let Err(error) = client.record_interceptions(InterceptionBatch { interceptions }).await {
            tracing::warn!(%error, count, "could not record a batch of firewall interceptions");
        }
        waiting.fetch_sub(count as u64, Ordering::Relaxed);
    }
}
