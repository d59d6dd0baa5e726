//! The background writers' own thread: a single-threaded runtime for the chain and ledger consumers of
//! `up`, so the operating system shares the CPU between them and the requests. On the requests' runtime
//! each of a consumer's statements waited behind every runnable request task for its next turn, so
//! under full load the consumers fell seconds behind and the bus held what waited in memory.

use anyhow::Context;
use tokio::sync::oneshot;

/// A thread running a single-threaded runtime until it is dropped.
pub struct WriterThread {
    runtime: tokio::runtime::Handle,
    /// Dropping it ends the thread's runtime (its tasks are cancelled: stop them first).
    _stop: oneshot::Sender<()>,
}

impl WriterThread {
    /// Starts the thread (named `brainstorm-writer`).
    pub fn start() -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the writers' runtime")?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("brainstorm-writer".to_string())
            .spawn(move || {
                // Sent or dropped: either way the process is done with its writers.
                let _stop_or_drop = runtime.block_on(stopped);
            })
            .context("cannot start the writers' thread")?;
        Ok(WriterThread { runtime: handle, _stop: stop })
    }

    /// The thread's runtime, to spawn the writers on.
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_runs_on_the_writers_thread() -> anyhow::Result<()> {
        let writers = WriterThread::start()?;
        let name = writers.runtime().spawn(async { std::thread::current().name().map(str::to_string) }).await?;
        assert_eq!(name.as_deref(), Some("brainstorm-writer"));
        Ok(())
    }
}
