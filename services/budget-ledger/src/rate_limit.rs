//! Per-key rate limits (`rate_limit_rpm`) with GCRA, the generic cell rate algorithm.
//!
//! Each key keeps one number, its theoretical arrival time (TAT). With emission interval
//! `T = 60 s / rpm` and a window of 60 s: a request at `now` computes `tat' = max(tat, now) + T`; it is
//! allowed when `tat' - now <= 60 s` (then `tat` becomes `tat'`), otherwise refused with
//! `retry_after = tat' - now - 60 s`. A fresh key may therefore burst `rpm` requests, then gets one
//! every `T`: exactly `rpm` requests in any 60 s window at the steady state. `remaining` is
//! `floor((60 s - (tat' - now)) / T)`.

use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use brainstorm_common::collections::HashMap;

use crate::counters::CounterError;

/// The rate window, in microseconds.
pub(crate) const WINDOW_MICROS: i64 = 60_000_000;

/// The answer to one request's rate-limit check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateDecision {
    pub allowed: bool,
    /// Requests still allowed right now (the `X-RateLimit-Remaining` value).
    pub remaining: u32,
    /// When refused, how long until a request would be allowed; 0 when allowed.
    pub retry_after_ms: u64,
}

/// A rate limiter shared by every request of a gateway (and, in Redis, by every replica).
#[async_trait]
pub trait RateLimiter: Send + Sync + 'static {
    /// Counts one request of `key_id` against `rpm` requests a minute, unless refused.
    async fn check(&self, key_id: &str, rpm: u32) -> Result<RateDecision, CounterError>;
    /// How much of `rpm` the key's requests take up right now (`ceil((tat - now) / T)`), counting nothing.
    async fn used(&self, key_id: &str, rpm: u32) -> Result<u32, CounterError>;
}

/// `ceil((tat - now) / T)`: the requests a TAT holds at `now`, at most `rpm`.
pub(crate) fn gcra_used(stored_tat: Option<i64>, now: i64, rpm: u32) -> u32 {
    let ahead = stored_tat.map_or(0, |tat| (tat - now).max(0));
    let interval = emission_interval_micros(rpm);
    u32::try_from((ahead + interval - 1) / interval).unwrap_or(u32::MAX).min(rpm)
}

/// `T = 60 s / rpm` in microseconds, at least one.
pub(crate) fn emission_interval_micros(rpm: u32) -> i64 {
    (WINDOW_MICROS / i64::from(rpm.max(1))).max(1)
}

/// One GCRA step at `now` (microseconds): the decision and the new TAT to store when allowed.
pub(crate) fn gcra(stored_tat: Option<i64>, now: i64, rpm: u32) -> (RateDecision, Option<i64>) {
    let interval = emission_interval_micros(rpm);
    let new_tat = stored_tat.unwrap_or(now).max(now).saturating_add(interval);
    let ahead = new_tat - now;
    if ahead > WINDOW_MICROS {
        let retry_after_ms = u64::try_from((ahead - WINDOW_MICROS + 999) / 1000).unwrap_or(u64::MAX);
        return (RateDecision { allowed: false, remaining: 0, retry_after_ms }, None);
    }
    let remaining = u32::try_from((WINDOW_MICROS - ahead) / interval).unwrap_or(u32::MAX);
    (RateDecision { allowed: true, remaining, retry_after_ms: 0 }, Some(new_tat))
}

/// The embedded rate limiter: TATs in a map behind one mutex.
#[derive(Default)]
pub struct InProcessRateLimiter {
    tats: Mutex<HashMap<String, i64>>,
}

impl InProcessRateLimiter {
    /// A limiter with no history.
    pub fn new() -> Self {
        Self::default()
    }

    fn tats(&self) -> MutexGuard<'_, HashMap<String, i64>> {
        self.tats.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `check` at an explicit instant (microseconds since the epoch), for tests.
    pub fn check_at(&self, key_id: &str, rpm: u32, now_micros: i64) -> RateDecision {
        let mut tats = self.tats();
        // A TAT in the past carries no state: forget it so idle keys do not accumulate.
        if tats.len() > 10_000 {
            tats.retain(|_, tat| *tat > now_micros);
        }
        let (decision, new_tat) = gcra(tats.get(key_id).copied(), now_micros, rpm);
        if let Some(new_tat) = new_tat {
            tats.insert(key_id.to_string(), new_tat);
        }
        decision
    }
}

fn now_micros() -> i64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|elapsed| elapsed.as_micros()).unwrap_or(0);
    i64::try_from(now).unwrap_or(i64::MAX)
}

#[async_trait]
impl RateLimiter for InProcessRateLimiter {
    async fn check(&self, key_id: &str, rpm: u32) -> Result<RateDecision, CounterError> {
        Ok(self.check_at(key_id, rpm, now_micros()))
    }

    async fn used(&self, key_id: &str, rpm: u32) -> Result<u32, CounterError> {
        Ok(gcra_used(self.tats().get(key_id).copied(), now_micros(), rpm))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: i64 = 1_000_000;

    #[test]
    fn a_fresh_key_bursts_rpm_requests_then_one_per_interval() {
        let limiter = InProcessRateLimiter::new();
        let start = 1_000 * SECOND;
        for expected_remaining in (0..6).rev() {
            let decision = limiter.check_at("key", 6, start);
            assert_eq!(decision, RateDecision { allowed: true, remaining: expected_remaining, retry_after_ms: 0 });
        }
        let refused = limiter.check_at("key", 6, start);
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after_ms, 10_000, "one request every 10 s at 6 rpm");
        assert!(!limiter.check_at("key", 6, start + 9 * SECOND).allowed);
        assert!(limiter.check_at("key", 6, start + 10 * SECOND).allowed);
        // Another key is independent.
        assert!(limiter.check_at("other", 6, start).allowed);
    }

    #[test]
    fn used_counts_what_the_tat_holds_without_counting() {
        let limiter = InProcessRateLimiter::new();
        let start = 1_000 * SECOND;
        let used = |at: i64| gcra_used(limiter.tats().get("key").copied(), at, 6);
        assert_eq!(used(start), 0);
        for _ in 0..4 {
            limiter.check_at("key", 6, start);
        }
        assert_eq!(used(start), 4);
        assert_eq!(used(start), 4, "reading counts nothing");
        assert_eq!(used(start + 10 * SECOND), 3, "one interval later one request has drained");
        assert_eq!(used(start + 40 * SECOND), 0);
    }

    #[test]
    fn a_refused_request_does_not_consume_capacity() {
        let limiter = InProcessRateLimiter::new();
        let start = 5 * SECOND;
        assert!(limiter.check_at("key", 1, start).allowed);
        for offset in 1..5 {
            assert!(!limiter.check_at("key", 1, start + offset * SECOND).allowed);
        }
        assert!(limiter.check_at("key", 1, start + 60 * SECOND).allowed);
    }
}
