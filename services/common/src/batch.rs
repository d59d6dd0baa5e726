//! Gathering items into a batch with one wake-up per batch rather than one per item: the bus
//! consumers' deliveries (`bus::next_batch`, `bus::consume`) and the firewall's interceptions.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// Adds to `batch` what `take` has waiting (up to `max` in all) and, while the batch is short, waits
/// out `linger` (or until `stop` completes) and adds what came meanwhile: items arriving during the
/// linger do not wake the caller one by one. `take` hands over one waiting item without waiting (None
/// when there is none). True when `stop` completed (what waited was taken at once); an error from
/// `take` ends the gathering.
pub async fn gather<T, E>(
    batch: &mut Vec<T>,
    max: usize,
    linger: Duration,
    stop: Pin<&mut impl Future<Output = ()>>,
    mut take: impl FnMut() -> Result<Option<T>, E>,
) -> Result<bool, E> {
    let deadline = tokio::time::Instant::now() + linger;
    take_waiting(batch, max, &mut take)?;
    let mut stopped = false;
    if batch.len() < max {
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => {}
            () = stop => stopped = true,
        }
        take_waiting(batch, max, &mut take)?;
    }
    Ok(stopped)
}

/// Adds to `batch` what `take` has waiting, without waiting (up to `max` in all).
pub fn take_waiting<T, E>(batch: &mut Vec<T>, max: usize, mut take: impl FnMut() -> Result<Option<T>, E>) -> Result<(), E> {
    while batch.len() < max {
        match take()? {
            Some(item) => batch.push(item),
            None => break,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taking_stops_at_the_maximum_and_at_the_first_error() {
        let mut source = vec![Ok(Some(1)), Ok(Some(2)), Err("broken"), Ok(Some(3))].into_iter();
        let mut batch = Vec::new();
        assert_eq!(take_waiting(&mut batch, 1, || source.next().unwrap_or(Ok(None))), Ok(()));
        assert_eq!(batch, [1]);
        assert_eq!(take_waiting(&mut batch, 10, || source.next().unwrap_or(Ok(None))), Err("broken"));
        assert_eq!(batch, [1, 2]);
    }

    #[tokio::test]
    async fn a_stop_ends_the_linger() {
        let stop = std::future::ready(());
        tokio::pin!(stop);
        let mut batch = vec![1];
        let stopped = tokio::time::timeout(
            Duration::from_secs(5),
            gather(&mut batch, 10, Duration::from_secs(3600), stop, || Ok::<Option<i32>, ()>(None)),
        )
        .await;
        assert_eq!(stopped, Ok(Ok(true)));
        assert_eq!(batch, [1]);
    }
}
