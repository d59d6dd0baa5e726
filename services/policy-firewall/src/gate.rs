//! `KillSwitchGate`: the edge's in-memory kill-switch state per tenant, read without a round trip.
//!
//! Rules (spec: Kill switch): an entry is trusted for the TTL (500 ms), then refreshed from the
//! service by one request while the others keep deciding on the entry they have. Under steady traffic
//! no request waits for that read: once an entry is half its TTL old, the next request starts the
//! refresh in the background and decides on the entry it has, so the entry is renewed before it
//! expires (only a tenant idle for the TTL waits for a read); `policy.events`
//! snapshots replace entries at once (a version number keeps an older snapshot from overwriting a
//! newer one). When a refresh fails, the gate keeps the tenant switch it last saw, so a gate that has
//! seen the switch active keeps blocking and a fresh gate allows until it reads the state; scoped
//! switches fail open until a read succeeds again. A failed read is retried after the TTL, not on
//! every request.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use brainstorm_common::collections::HashMap;
use brainstorm_proto::ServiceResult;
use brainstorm_proto::policy::{KillSwitchSnapshot, PolicyEvent, PolicyFirewallClient, TenantRef, policy_event};
use tokio::time::Instant;

use crate::killswitch::{KillSwitchDecision, KillSwitchState, RequestFacts, decide, is_guarded_path};

/// The spec's cache TTL of kill-switch state.
pub const KILL_SWITCH_TTL: Duration = Duration::from_millis(500);

/// How long a refresh may take before the gate decides on what it has.
pub const DEFAULT_FETCH_TIMEOUT: Duration = Duration::from_secs(1);

/// Where the gate reads a tenant's kill-switch state.
#[async_trait]
pub trait KillSwitchSource: Send + Sync + 'static {
    async fn snapshot(&self, tenant_id: &str) -> ServiceResult<KillSwitchSnapshot>;
}

#[async_trait]
impl KillSwitchSource for PolicyFirewallClient {
    async fn snapshot(&self, tenant_id: &str) -> ServiceResult<KillSwitchSnapshot> {
        self.get_kill_switch_snapshot(TenantRef { tenant_id: tenant_id.to_string() }).await
    }
}

/// The gate's timing.
#[derive(Debug, Clone, Copy)]
pub struct GateOptions {
    pub ttl: Duration,
    pub fetch_timeout: Duration,
}

impl Default for GateOptions {
    fn default() -> Self {
        GateOptions { ttl: KILL_SWITCH_TTL, fetch_timeout: DEFAULT_FETCH_TIMEOUT }
    }
}

/// What the gate knows of one tenant.
#[derive(Debug, Clone)]
struct Entry {
    state: Arc<KillSwitchState>,
    version: i64,
    /// When the state was last read or refreshed by an event (or a read last failed).
    checked_at: Instant,
    /// False after a failed read, until a read or an event succeeds.
    readable: bool,
}

/// The state one request is decided on.
#[derive(Debug, Clone)]
pub struct GateView {
    pub state: Arc<KillSwitchState>,
    /// False while the store is unreadable: scoped switches are then not applied (fail open).
    pub scopes_enforced: bool,
}

impl GateView {
    /// The decision for a request.
    pub fn check(&self, request: &RequestFacts<'_>) -> KillSwitchDecision {
        if !is_guarded_path(request.path) {
            return KillSwitchDecision::Allow;
        }
        self.decide(request)
    }

    /// `check` for a request whose path is already known to be guarded.
    fn decide(&self, request: &RequestFacts<'_>) -> KillSwitchDecision {
        if self.scopes_enforced { decide(&self.state, request) } else { decide(&self.state.without_scopes(), request) }
    }
}

/// The edge's kill-switch cache.
pub struct KillSwitchGate {
    inner: Arc<GateInner>,
}

struct GateInner {
    source: Arc<dyn KillSwitchSource>,
    options: GateOptions,
    entries: RwLock<HashMap<String, Entry>>,
    refreshing: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl KillSwitchGate {
    /// A gate reading from `source` (the policy-firewall client, in the edge).
    pub fn new(source: Arc<dyn KillSwitchSource>, options: GateOptions) -> Self {
        KillSwitchGate {
            inner: Arc::new(GateInner {
                source,
                options,
                entries: RwLock::new(HashMap::default()),
                refreshing: Mutex::new(HashMap::default()),
            }),
        }
    }

    /// The kill-switch decision for one request of `tenant_id`.
    pub async fn check(&self, tenant_id: &str, request: &RequestFacts<'_>) -> KillSwitchDecision {
        // Exempt and non-`/v1` paths are allowed whatever the state: no need to read it.
        if !is_guarded_path(request.path) {
            return KillSwitchDecision::Allow;
        }
        self.view(tenant_id).await.decide(request)
    }

    /// The state to decide on: cached while fresh (refreshed ahead in the background once half its
    /// TTL old), otherwise refreshed (by one caller at a time).
    pub async fn view(&self, tenant_id: &str) -> GateView {
        let inner = &self.inner;
        let cached = inner.entry(tenant_id);
        if let Some(entry) = &cached {
            let age = entry.checked_at.elapsed();
            if age < inner.options.ttl {
                if age >= inner.options.ttl / 2
                    && let Ok(guard) = inner.refresh_lock(tenant_id).try_lock_owned()
                {
                    let (gate, tenant_id) = (inner.clone(), tenant_id.to_string());
                    tokio::spawn(async move {
                        let _guard = guard;
                        gate.refresh(&tenant_id).await;
                    });
                }
                return view_of(entry);
            }
        }
        let lock = inner.refresh_lock(tenant_id);
        let _guard = match (lock.try_lock(), &cached) {
            (Ok(guard), _) => guard,
            // Someone else is refreshing: decide on what we have rather than queue behind a slow read.
            (Err(_), Some(entry)) => return view_of(entry),
            // Nothing known yet: wait for the read in flight.
            (Err(_), None) => lock.lock().await,
        };
        if let Some(entry) = inner.entry(tenant_id)
            && entry.checked_at.elapsed() < inner.options.ttl
        {
            return view_of(&entry);
        }
        inner.refresh(tenant_id).await
    }

    /// Applies a snapshot from `policy.events` at once (ignored when older than what the gate holds).
    pub fn apply_snapshot(&self, snapshot: &KillSwitchSnapshot) {
        self.inner.store_snapshot(&snapshot.tenant_id, snapshot);
    }

    /// Applies a `policy.events` payload; true when it carried a kill-switch snapshot.
    pub fn apply_event(&self, event: &PolicyEvent) -> bool {
        match &event.kind {
            Some(policy_event::Kind::KillSwitch(snapshot)) => {
                self.apply_snapshot(snapshot);
                true
            }
            Some(policy_event::Kind::ConfigChanged(_)) | None => false,
        }
    }

    /// Forgets a tenant (its next request reads the state again).
    pub fn evict(&self, tenant_id: &str) {
        if let Ok(mut entries) = self.inner.entries.write() {
            entries.remove(tenant_id);
        }
    }
}

impl GateInner {
    /// Reads the tenant's state from the source (the caller holds the tenant's refresh lock).
    async fn refresh(&self, tenant_id: &str) -> GateView {
        let fetched = tokio::time::timeout(self.options.fetch_timeout, self.source.snapshot(tenant_id)).await;
        match fetched {
            Ok(Ok(snapshot)) => self.store_snapshot(tenant_id, &snapshot),
            Ok(Err(error)) => {
                tracing::warn!(%error, tenant_id, "kill-switch state unreadable: keeping the last known tenant state");
                self.mark_unreadable(tenant_id)
            }
            Err(_) => {
                tracing::warn!(tenant_id, "kill-switch read timed out: keeping the last known tenant state");
                self.mark_unreadable(tenant_id)
            }
        }
    }

    fn entry(&self, tenant_id: &str) -> Option<Entry> {
        self.entries.read().ok()?.get(tenant_id).cloned()
    }

    fn refresh_lock(&self, tenant_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.refreshing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match locks.get(tenant_id) {
            Some(lock) => lock.clone(),
            None => locks.entry(tenant_id.to_string()).or_default().clone(),
        }
    }

    fn store_snapshot(&self, tenant_id: &str, snapshot: &KillSwitchSnapshot) -> GateView {
        let Ok(mut entries) = self.entries.write() else {
            return GateView { state: Arc::new(KillSwitchState::from_snapshot(snapshot)), scopes_enforced: true };
        };
        let now = Instant::now();
        let entry = entries.entry(tenant_id.to_string()).or_insert_with(|| Entry {
            state: Arc::new(KillSwitchState::default()),
            version: i64::MIN,
            checked_at: now,
            readable: true,
        });
        if snapshot.version >= entry.version {
            entry.state = Arc::new(KillSwitchState::from_snapshot(snapshot));
            entry.version = snapshot.version;
        }
        entry.checked_at = now;
        entry.readable = true;
        view_of(entry)
    }

    fn mark_unreadable(&self, tenant_id: &str) -> GateView {
        let Ok(mut entries) = self.entries.write() else {
            return GateView { state: Arc::new(KillSwitchState::default()), scopes_enforced: false };
        };
        let now = Instant::now();
        // A gate that never read the state allows (an empty, inactive state) until a read succeeds.
        let entry = entries.entry(tenant_id.to_string()).or_insert_with(|| Entry {
            state: Arc::new(KillSwitchState::default()),
            version: i64::MIN,
            checked_at: now,
            readable: false,
        });
        entry.checked_at = now;
        entry.readable = false;
        view_of(entry)
    }
}

fn view_of(entry: &Entry) -> GateView {
    GateView { state: entry.state.clone(), scopes_enforced: entry.readable }
}
