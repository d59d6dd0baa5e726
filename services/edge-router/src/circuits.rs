//! Circuit breakers, one per model (`provider/model`), in this edge's memory: after
//! `failures_to_open` consecutive failures of the provider's own making (5xx, 408, timeouts, no
//! connection) the model's circuit opens and routing skips it for `open_for`; then one trial request
//! goes through (half open), whose success closes the circuit and whose failure opens it again.
//!
//! A model that never failed has no entry, so while nothing fails the request path pays one atomic
//! load; with entries, a read lock and a map lookup per candidate.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use brainstorm_providers::upstream::UpstreamError;

/// When circuits open and how long they stay open.
#[derive(Debug, Clone, Copy)]
pub struct CircuitOptions {
    /// Consecutive failures that open a circuit.
    pub failures_to_open: u32,
    /// How long an open circuit refuses before it lets a trial request through.
    pub open_for: Duration,
}

impl Default for CircuitOptions {
    fn default() -> Self {
        CircuitOptions { failures_to_open: 5, open_for: Duration::from_secs(30) }
    }
}

/// A circuit's state as shown (`GET /v1/health/providers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    Closed,
    Open,
    HalfOpen,
}

impl CircuitState {
    /// The state's name in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half_open",
        }
    }
}

/// What routing may do with a model now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Closed: send.
    Send,
    /// Half open: send as the one trial request.
    Trial,
    /// Open (or a trial is under way): skip; retry after this long.
    Skip(Duration),
}

/// Whether a failure says the provider is unwell (rather than the request or the caller's key).
pub fn counts_against_provider(error: &UpstreamError) -> bool {
    match error {
        UpstreamError::Status { status, .. } => *status >= 500 || *status == 408,
        UpstreamError::Transport(_) | UpstreamError::Timeout => true,
        // The provider answered, in a shape we could not read: not an outage.
        UpstreamError::Decode(_) => false,
    }
}

#[derive(Debug)]
struct Circuit {
    consecutive_failures: AtomicU32,
    /// Milliseconds since the breakers' epoch when it opened; 0 while closed.
    opened_at_ms: AtomicU64,
    /// When the half-open circuit's trial request went; 0 when none is under way. A trial that never
    /// reports (its client went away) stops counting after `open_for`.
    trial_started_ms: AtomicU64,
}

/// Every model's circuit in this edge.
#[derive(Debug)]
pub struct CircuitBreakers {
    options: CircuitOptions,
    epoch: Instant,
    circuits: RwLock<HashMap<String, Arc<Circuit>>>,
    /// Entries in `circuits`: 0 lets the request path skip the lock.
    entries: AtomicUsize,
}

/// Most models with a circuit; past it, closed circuits are forgotten.
const MAX_CIRCUITS: usize = 10_000;

impl CircuitBreakers {
    pub fn new(options: CircuitOptions) -> CircuitBreakers {
        CircuitBreakers {
            options: CircuitOptions { failures_to_open: options.failures_to_open.max(1), ..options },
            epoch: Instant::now(),
            circuits: RwLock::new(HashMap::new()),
            entries: AtomicUsize::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        // Never 0, which means closed.
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX).max(1)
    }

    fn circuit(&self, model: &str) -> Option<Arc<Circuit>> {
        if self.entries.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.circuits.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(model).cloned()
    }

    /// The state of `model`'s circuit and, when open, how long until a trial may go.
    pub fn state(&self, model: &str) -> (CircuitState, Option<Duration>) {
        let Some(circuit) = self.circuit(model) else { return (CircuitState::Closed, None) };
        let opened_at = circuit.opened_at_ms.load(Ordering::Acquire);
        if opened_at == 0 {
            return (CircuitState::Closed, None);
        }
        let open_ms = u64::try_from(self.options.open_for.as_millis()).unwrap_or(u64::MAX);
        let elapsed = self.now_ms().saturating_sub(opened_at);
        if elapsed < open_ms {
            (CircuitState::Open, Some(Duration::from_millis(open_ms - elapsed)))
        } else {
            (CircuitState::HalfOpen, None)
        }
    }

    /// Whether a request may go to `model` now (a half-open circuit lets one trial through at a time).
    pub fn admit(&self, model: &str) -> Admission {
        match self.state(model) {
            (CircuitState::Closed, _) => Admission::Send,
            (CircuitState::Open, wait) => Admission::Skip(wait.unwrap_or_default()),
            (CircuitState::HalfOpen, _) => {
                let Some(circuit) = self.circuit(model) else { return Admission::Send };
                let now = self.now_ms();
                let started = circuit.trial_started_ms.load(Ordering::Acquire);
                let open_ms = u64::try_from(self.options.open_for.as_millis()).unwrap_or(u64::MAX);
                if started != 0 && now.saturating_sub(started) < open_ms {
                    return Admission::Skip(Duration::from_millis(open_ms - now.saturating_sub(started)));
                }
                match circuit.trial_started_ms.compare_exchange(started, now, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => Admission::Trial,
                    Err(_) => Admission::Skip(Duration::from_secs(1)),
                }
            }
        }
    }

    /// A call to `model` succeeded: its circuit closes.
    pub fn succeeded(&self, model: &str) {
        if let Some(circuit) = self.circuit(model) {
            circuit.consecutive_failures.store(0, Ordering::Relaxed);
            circuit.opened_at_ms.store(0, Ordering::Release);
            circuit.trial_started_ms.store(0, Ordering::Release);
        }
    }

    /// A call to `model` failed with `error`; true when this failure opened its circuit.
    pub fn failed(&self, model: &str, error: &UpstreamError) -> bool {
        if !counts_against_provider(error) {
            // Not the provider's health: a trial that ended so proves nothing either way.
            if let Some(circuit) = self.circuit(model) {
                circuit.trial_started_ms.store(0, Ordering::Release);
            }
            return false;
        }
        let circuit = match self.circuit(model) {
            Some(circuit) => circuit,
            None => {
                let mut circuits = self.circuits.write().unwrap_or_else(std::sync::PoisonError::into_inner);
                if circuits.len() >= MAX_CIRCUITS {
                    circuits.retain(|_, circuit| circuit.opened_at_ms.load(Ordering::Relaxed) != 0);
                }
                let circuit = circuits
                    .entry(model.to_string())
                    .or_insert_with(|| {
                        Arc::new(Circuit {
                            consecutive_failures: AtomicU32::new(0),
                            opened_at_ms: AtomicU64::new(0),
                            trial_started_ms: AtomicU64::new(0),
                        })
                    })
                    .clone();
                self.entries.store(circuits.len(), Ordering::Relaxed);
                circuit
            }
        };
        let failures = circuit.consecutive_failures.fetch_add(1, Ordering::AcqRel).saturating_add(1);
        let was_open = circuit.opened_at_ms.load(Ordering::Acquire) != 0;
        let trial = circuit.trial_started_ms.swap(0, Ordering::AcqRel) != 0;
        // A failed trial opens the circuit again for a full period; so does the threshold.
        if trial || (!was_open && failures >= self.options.failures_to_open) {
            circuit.opened_at_ms.store(self.now_ms(), Ordering::Release);
            return !was_open;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outage() -> UpstreamError {
        UpstreamError::Status { status: 503, message: "down".into() }
    }

    #[test]
    fn opens_after_consecutive_provider_failures_and_closes_on_a_trial_success() {
        let breakers = CircuitBreakers::new(CircuitOptions { failures_to_open: 3, open_for: Duration::from_millis(40) });
        assert_eq!(breakers.admit("openai/gpt-4o"), Admission::Send);
        assert!(!breakers.failed("openai/gpt-4o", &outage()));
        breakers.succeeded("openai/gpt-4o");
        // A success between failures starts the count again.
        assert!(!breakers.failed("openai/gpt-4o", &outage()));
        assert!(!breakers.failed("openai/gpt-4o", &outage()));
        assert!(breakers.failed("openai/gpt-4o", &outage()), "the third in a row opens it");
        assert!(matches!(breakers.admit("openai/gpt-4o"), Admission::Skip(wait) if wait <= Duration::from_millis(40)));
        assert_eq!(breakers.admit("openai/gpt-4o-mini"), Admission::Send, "other models are not affected");
        assert_eq!(breakers.state("openai/gpt-4o").0, CircuitState::Open);

        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(breakers.state("openai/gpt-4o").0, CircuitState::HalfOpen);
        assert_eq!(breakers.admit("openai/gpt-4o"), Admission::Trial);
        assert!(matches!(breakers.admit("openai/gpt-4o"), Admission::Skip(_)), "one trial at a time");
        breakers.succeeded("openai/gpt-4o");
        assert_eq!(breakers.admit("openai/gpt-4o"), Admission::Send);
        assert_eq!(breakers.state("openai/gpt-4o").0, CircuitState::Closed);
    }

    #[test]
    fn a_failed_trial_opens_again_and_caller_errors_do_not_count() {
        let breakers = CircuitBreakers::new(CircuitOptions { failures_to_open: 1, open_for: Duration::from_millis(20) });
        for status in [400, 401, 404, 429] {
            assert!(!breakers.failed("anthropic/claude", &UpstreamError::Status { status, message: String::new() }));
        }
        assert_eq!(breakers.admit("anthropic/claude"), Admission::Send);
        assert!(breakers.failed("anthropic/claude", &UpstreamError::Timeout));
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(breakers.admit("anthropic/claude"), Admission::Trial);
        assert!(!breakers.failed("anthropic/claude", &outage()), "already open: not a new opening");
        assert_eq!(breakers.state("anthropic/claude").0, CircuitState::Open);
    }
}
