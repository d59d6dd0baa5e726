//! The shared state of a mock: the bounded request journal and the queue of injected failures.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode, Uri};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How many requests the journal keeps; older ones are forgotten, so a benchmark cannot grow it without bound.
pub const RECORD_CAPACITY: usize = 10_000;

/// One request as the mock received it, and how it was answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedRequest {
    /// Position of the request since the mock started (never reused, even after `clear`); it also appears in
    /// the ids of the reply (`chatcmpl-mock-7`, `msg_mock_7`, ...).
    pub seq: u64,
    pub method: String,
    pub path: String,
    /// The raw query string, without the `?`.
    pub query: Option<String>,
    /// Header names are lowercase; repeated headers are joined with `, `.
    pub headers: BTreeMap<String, String>,
    /// The body parsed as JSON; `null` when the body is empty or not JSON.
    pub body: Value,
    /// The raw body when it is not empty and not JSON.
    pub body_text: Option<String>,
    /// The status the mock answered.
    pub status: u16,
    /// Whether the answer was a stream (SSE, or Gemini's streamed JSON array).
    pub stream: bool,
    /// The whole answer was handed to the connection (always true for non-streaming answers).
    pub completed: bool,
    /// The client went away before the end of a stream.
    pub client_disconnected: bool,
}

/// Injected failures: the next `count` requests whose path contains `path_contains` (any path when absent)
/// answer `status` with `body`: JSON, or the text itself when `body` is a JSON string, or a provider-native
/// error body when absent. Every field has a default (`count` 1, `status` 500).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FailSpec {
    pub count: u32,
    pub status: u16,
    pub body: Option<Value>,
    pub path_contains: Option<String>,
}

impl Default for FailSpec {
    fn default() -> Self {
        FailSpec { count: 1, status: 500, body: None, path_contains: None }
    }
}

/// An injected failure about to be answered.
pub(crate) struct Failure {
    pub status: StatusCode,
    pub body: Option<Value>,
}

struct Entry {
    seq: u64,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
    status: StatusCode,
    stream: bool,
    completed: bool,
    client_disconnected: bool,
}

/// A request about to be recorded; the handler fills in how it was answered.
pub(crate) struct Incoming {
    pub seq: u64,
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// State shared by the handlers and the `MockUpstream` handle.
pub(crate) struct Shared {
    pub valid_keys: HashSet<String>,
    pub chunk_delay: Duration,
    pub reply_delay: Duration,
    next_seq: AtomicU64,
    // Ordered by seq.
    journal: Mutex<VecDeque<Entry>>,
    failures: Mutex<VecDeque<FailSpec>>,
    // Lets the hot path skip the failure lock when nothing is queued.
    pending_failures: AtomicUsize,
    // Prompt prefixes cached by an explicit breakpoint (Anthropic's `cache_control`), by digest.
    cached_prefixes: Mutex<HashSet<u64>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks cannot leave them inconsistent: keep serving.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub fn new(valid_keys: Vec<String>, chunk_delay: Duration, reply_delay: Duration) -> Shared {
        Shared {
            valid_keys: valid_keys.into_iter().collect(),
            chunk_delay,
            reply_delay,
            next_seq: AtomicU64::new(0),
            journal: Mutex::new(VecDeque::new()),
            failures: Mutex::new(VecDeque::new()),
            pending_failures: AtomicUsize::new(0),
            cached_prefixes: Mutex::new(HashSet::new()),
        }
    }

    /// Caches a prompt prefix (by its digest); whether it was cached already.
    pub fn cache_prefix(&self, digest: u64) -> bool {
        !lock(&self.cached_prefixes).insert(digest)
    }

    /// Whether `key` is accepted: any key (or none) when no valid keys are configured.
    pub fn key_accepted(&self, key_opt: Option<&str>) -> bool {
        if self.valid_keys.is_empty() {
            return true;
        }
        key_opt.is_some_and(|key| self.valid_keys.contains(key))
    }

    /// Assigns the next sequence number.
    pub fn next_seq(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    pub fn record(&self, incoming: Incoming, status: StatusCode, stream: bool) {
        let entry = Entry {
            seq: incoming.seq,
            method: incoming.method,
            uri: incoming.uri,
            headers: incoming.headers,
            body: incoming.body,
            status,
            stream,
            completed: !stream,
            client_disconnected: false,
        };
        let mut journal = lock(&self.journal);
        if journal.len() >= RECORD_CAPACITY {
            journal.pop_front();
        }
        // Concurrent handlers may record slightly out of order; keeping the journal ordered by seq lets a
        // stream's guard find its entry by binary search.
        let position = journal.partition_point(|existing| existing.seq < entry.seq);
        journal.insert(position, entry);
    }

    /// Marks how a recorded stream ended.
    pub fn finish_stream(&self, seq: u64, completed: bool) {
        let mut journal = lock(&self.journal);
        if let Ok(position) = journal.binary_search_by_key(&seq, |entry| entry.seq)
            && let Some(entry) = journal.get_mut(position)
        {
            entry.completed = completed;
            entry.client_disconnected = !completed;
        }
    }

    pub fn requests(&self) -> Vec<RecordedRequest> {
        let journal = lock(&self.journal);
        journal.iter().map(Entry::to_recorded).collect()
    }

    pub fn clear(&self) {
        lock(&self.journal).clear();
    }

    pub fn fail_next(&self, spec: FailSpec) {
        if spec.count == 0 {
            return;
        }
        let mut failures = lock(&self.failures);
        failures.push_back(spec);
        self.pending_failures.store(failures.len(), Ordering::Release);
    }

    pub fn clear_failures(&self) {
        let mut failures = lock(&self.failures);
        failures.clear();
        self.pending_failures.store(0, Ordering::Release);
    }

    /// Consumes one injected failure matching `path`, the oldest first.
    pub fn take_failure(&self, path: &str) -> Option<Failure> {
        if self.pending_failures.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut failures = lock(&self.failures);
        let position = failures.iter().position(|spec| spec.path_contains.as_deref().is_none_or(|fragment| path.contains(fragment)))?;
        let spec = failures.get_mut(position)?;
        spec.count = spec.count.saturating_sub(1);
        let status = StatusCode::from_u16(spec.status).unwrap_or_else(|_| {
            tracing::warn!(status = spec.status, "invalid injected status, answering 500");
            StatusCode::INTERNAL_SERVER_ERROR
        });
        let failure = Failure { status, body: spec.body.clone() };
        if spec.count == 0 {
            failures.remove(position);
            self.pending_failures.store(failures.len(), Ordering::Release);
        }
        Some(failure)
    }
}

impl Entry {
    fn to_recorded(&self) -> RecordedRequest {
        let mut headers: BTreeMap<String, String> = BTreeMap::new();
        for (name, value) in &self.headers {
            let value = String::from_utf8_lossy(value.as_bytes());
            headers
                .entry(name.as_str().to_string())
                .and_modify(|joined| {
                    joined.push_str(", ");
                    joined.push_str(&value);
                })
                .or_insert_with(|| value.into_owned());
        }
        let (body, body_text) = if self.body.is_empty() {
            (Value::Null, None)
        } else {
            match serde_json::from_slice::<Value>(&self.body) {
                Ok(value) => (value, None),
                Err(_) => (Value::Null, Some(String::from_utf8_lossy(&self.body).into_owned())),
            }
        };
        RecordedRequest {
            seq: self.seq,
            method: self.method.as_str().to_string(),
            path: self.uri.path().to_string(),
            query: self.uri.query().map(str::to_string),
            headers,
            body,
            body_text,
            status: self.status.as_u16(),
            stream: self.stream,
            completed: self.completed,
            client_disconnected: self.client_disconnected,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn incoming(shared: &Shared, path: &str) -> Incoming {
        Incoming {
            seq: shared.next_seq(),
            method: Method::POST,
            uri: path.parse().unwrap(),
            headers: HeaderMap::new(),
            body: Bytes::from_static(b"{\"a\":1}"),
        }
    }

    #[test]
    fn the_journal_keeps_the_most_recent_requests() {
        let shared = Shared::new(Vec::new(), Duration::ZERO, Duration::ZERO);
        for _ in 0..RECORD_CAPACITY + 5 {
            let request = incoming(&shared, "/v1/x?y=1");
            shared.record(request, StatusCode::OK, false);
        }
        let requests = shared.requests();
        assert_eq!(requests.len(), RECORD_CAPACITY);
        assert_eq!(requests[0].seq, 5);
        assert_eq!(requests[0].query.as_deref(), Some("y=1"));
        assert_eq!(requests[0].body["a"], 1);
        shared.clear();
        assert!(shared.requests().is_empty());
    }

    #[test]
    fn a_stream_entry_is_finished_by_seq() {
        let shared = Shared::new(Vec::new(), Duration::ZERO, Duration::ZERO);
        let first = incoming(&shared, "/a");
        let second = incoming(&shared, "/b");
        // Recorded out of order, as concurrent handlers may.
        shared.record(second, StatusCode::OK, true);
        shared.record(first, StatusCode::OK, true);
        shared.finish_stream(1, false);
        shared.finish_stream(0, true);
        let requests = shared.requests();
        assert_eq!((requests[0].seq, requests[0].completed, requests[0].client_disconnected), (0, true, false));
        assert_eq!((requests[1].seq, requests[1].completed, requests[1].client_disconnected), (1, false, true));
    }

    #[test]
    fn failures_are_consumed_in_order_and_by_path() {
        let shared = Shared::new(Vec::new(), Duration::ZERO, Duration::ZERO);
        shared.fail_next(FailSpec { count: 2, status: 429, body: None, path_contains: Some("messages".into()) });
        shared.fail_next(FailSpec { count: 1, status: 503, ..FailSpec::default() });
        assert_eq!(shared.take_failure("/v1/messages").map(|f| f.status.as_u16()), Some(429));
        assert_eq!(shared.take_failure("/v1/chat/completions").map(|f| f.status.as_u16()), Some(503));
        assert!(shared.take_failure("/v1/chat/completions").is_none());
        assert_eq!(shared.take_failure("/v1/messages").map(|f| f.status.as_u16()), Some(429));
        assert!(shared.take_failure("/v1/messages").is_none());
    }

    #[test]
    fn keys_are_checked_only_when_configured() {
        let open = Shared::new(Vec::new(), Duration::ZERO, Duration::ZERO);
        assert!(open.key_accepted(None));
        let closed = Shared::new(vec!["k1".into()], Duration::ZERO, Duration::ZERO);
        assert!(closed.key_accepted(Some("k1")));
        assert!(!closed.key_accepted(Some("k2")));
        assert!(!closed.key_accepted(None));
    }
}
