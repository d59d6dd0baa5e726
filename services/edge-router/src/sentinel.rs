//! The sentinel: an edge's probes of provider APIs. A provider is watched from the first time a
//! health view asks about it (probed then, at once) and probed again every `interval` while the
//! edge runs: an unauthenticated GET of its API base, whose answer, whatever its status below 500,
//! proves the API reachable and serving (`healthy`, `degraded` past `SLOW`); a 5xx is `degraded`;
//! no answer within `PROBE_TIMEOUT` is `down`. Probes carry no key, so they spend nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use brainstorm_providers::catalog::{PROVIDERS, Provider, base_url};

/// Longest wait for a probe's answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// An answer slower than this marks the provider degraded.
const SLOW: Duration = Duration::from_secs(2);

/// What the last probe of a provider found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeStatus {
    Healthy,
    Degraded,
    Down,
}

impl ProbeStatus {
    /// The status's name in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeStatus::Healthy => "healthy",
            ProbeStatus::Degraded => "degraded",
            ProbeStatus::Down => "down",
        }
    }
}

/// One probe's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub status: ProbeStatus,
    /// Time to the answer's head (to the failure when down).
    pub latency_ms: u64,
    /// RFC 3339, UTC.
    pub last_probe_at: String,
}

impl Probe {
    /// The probe as the API shows it; `not_probed` when there is none.
    pub fn view(probe: Option<&Probe>) -> serde_json::Value {
        match probe {
            Some(probe) => {
                serde_json::json!({"status": probe.status.as_str(), "latency_ms": probe.latency_ms, "last_probe_at": probe.last_probe_at})
            }
            None => serde_json::json!({"status": "not_probed", "latency_ms": null, "last_probe_at": null}),
        }
    }
}

/// The catalog's providers among `ids` (a tenant's keyed providers), in catalog order.
pub fn providers_among(ids: &[String]) -> Vec<&'static Provider> {
    PROVIDERS.iter().filter(|provider| ids.iter().any(|id| id == provider.id)).collect()
}

/// The probes of one edge.
pub struct Sentinel {
    http: reqwest::Client,
    base_urls: Arc<BTreeMap<String, String>>,
    probes: RwLock<HashMap<&'static str, (&'static Provider, Probe)>>,
}

impl Sentinel {
    /// A sentinel probing every `interval` on a task of its own, which ends when the sentinel is dropped.
    pub fn spawn(base_urls: Arc<BTreeMap<String, String>>, interval: Duration) -> Arc<Sentinel> {
        let http = reqwest::Client::builder().timeout(PROBE_TIMEOUT).tcp_nodelay(true).build().unwrap_or_default();
        let sentinel = Arc::new(Sentinel { http, base_urls, probes: RwLock::new(HashMap::new()) });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(probe_every(Arc::downgrade(&sentinel), interval));
        }
        sentinel
    }

    /// The last probe of `provider`, if it is watched.
    pub fn last(&self, provider: &str) -> Option<Probe> {
        self.probes.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(provider).map(|(_, probe)| probe.clone())
    }

    /// Watches `providers` from now on; those not watched yet are probed at once (together).
    pub async fn watch(&self, providers: &[&'static Provider]) {
        let new: Vec<&'static Provider> = {
            let probes = self.probes.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            providers.iter().copied().filter(|provider| !probes.contains_key(provider.id)).collect()
        };
        let probed = futures::future::join_all(new.into_iter().map(|provider| async move { (provider, self.probe(provider).await) })).await;
        self.record(probed);
    }

    fn record(&self, probed: Vec<(&'static Provider, Probe)>) {
        let mut probes = self.probes.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (provider, probe) in probed {
            probes.insert(provider.id, (provider, probe));
        }
    }

    async fn probe(&self, provider: &'static Provider) -> Probe {
        let url = base_url(provider, &self.base_urls);
        let started = Instant::now();
        let answer = self.http.get(url).send().await;
        let latency = started.elapsed();
        let status = match answer {
            Ok(response) if response.status().is_server_error() => ProbeStatus::Degraded,
            Ok(_) if latency > SLOW => ProbeStatus::Degraded,
            Ok(_) => ProbeStatus::Healthy,
            Err(error) => {
                tracing::debug!(provider = provider.id, error = %error.without_url(), "a provider probe failed");
                ProbeStatus::Down
            }
        };
        Probe {
            status,
            latency_ms: u64::try_from(latency.as_millis()).unwrap_or(u64::MAX),
            last_probe_at: brainstorm_common::time::now_timestamp(),
        }
    }
}

/// Probes every watched provider each `interval` until the sentinel is gone.
async fn probe_every(sentinel: Weak<Sentinel>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(sentinel) = sentinel.upgrade() else { return };
        let watched: Vec<&'static Provider> =
            sentinel.probes.read().unwrap_or_else(std::sync::PoisonError::into_inner).values().map(|(provider, _)| *provider).collect();
        if watched.is_empty() {
            continue;
        }
        let sentinel_ref = &sentinel;
        let probed =
            futures::future::join_all(watched.into_iter().map(|provider| async move { (provider, sentinel_ref.probe(provider).await) }))
                .await;
        sentinel.record(probed);
    }
}
