//! Graceful shutdown: SIGTERM or SIGINT asks every server to stop accepting and finish in-flight work.

use tokio::sync::watch;

/// Broadcasts the stop request to every server of the process.
#[derive(Clone)]
pub struct Shutdown {
    receiver: watch::Receiver<bool>,
}

impl Shutdown {
    /// Starts listening for SIGTERM and SIGINT.
    pub fn on_signals() -> Self {
        let (sender, receiver) = watch::channel(false);
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutdown requested: finishing in-flight requests");
            let _receivers_gone = sender.send(true);
        });
        Shutdown { receiver }
    }

    /// A stop requested by sending `true` on the returned sender, for what must end after something
    /// else has (the chain and ledger writers after the edge).
    pub fn requested_by_hand() -> (watch::Sender<bool>, Self) {
        let (sender, receiver) = watch::channel(false);
        (sender, Shutdown { receiver })
    }

    /// The stop request as a watch (`true` once requested), for long-lived responses that must end
    /// themselves so that a graceful stop is not held by them.
    pub fn watch(&self) -> watch::Receiver<bool> {
        self.receiver.clone()
    }

    /// Resolves once shutdown was requested.
    pub async fn requested(mut self) {
        let _closed = self.receiver.wait_for(|stop| *stop).await;
    }
}

#[cfg(unix)]
async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGTERM; only SIGINT stops the process");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() {
    let _ = tokio::signal::ctrl_c().await;
}
