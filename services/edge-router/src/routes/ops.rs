//! `GET /v1/ops/status`: whether what serves the tenant works, as this edge sees it now: each
//! service behind the edge asked one cheap question about the tenant (reachable, how fast), the
//! tenant's providers (probe and circuits), its kill switch, and this edge process itself.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use brainstorm_common::ApiError;
use serde_json::{Value, json};

use crate::EdgeState;
use crate::auth::Caller;
use crate::circuits::CircuitState;
use crate::routes::budget::Answer;
use crate::sentinel::{Probe, ProbeStatus, providers_among};

/// How long a service may take to answer its probe before it counts as unreachable.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// A service slower than this to answer its probe is degraded.
const SLOW_PROBE: Duration = Duration::from_millis(500);

type Probing<'a> = Pin<Box<dyn Future<Output = Result<(), ApiError>> + Send + 'a>>;

/// A service's answer to its probe.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Reach {
    Ok(Duration),
    Failed,
    TimedOut,
}

/// What a service's probe says of it: `ok`, `degraded` (slow) or `down`.
fn service_status(reach: Reach) -> &'static str {
    match reach {
        Reach::Ok(took) if took <= SLOW_PROBE => "ok",
        Reach::Ok(_) => "degraded",
        Reach::Failed | Reach::TimedOut => "down",
    }
}

/// The whole: `down` when a service every request needs is down, `degraded` when anything else is
/// not `ok` (an optional service, a slow one, a provider, an open circuit, the kill switch on).
fn overall(required_down: bool, anything_wrong: bool) -> &'static str {
    if required_down {
        "down"
    } else if anything_wrong {
        "degraded"
    } else {
        "ok"
    }
}

/// Runs a probe for at most `timeout`: how it went, and the error's envelope when it failed.
async fn probe(probing: Probing<'_>, timeout: Duration) -> (Reach, Option<Value>) {
    let started = Instant::now();
    match tokio::time::timeout(timeout, probing).await {
        Ok(Ok(())) => (Reach::Ok(started.elapsed()), None),
        Ok(Err(error)) => (Reach::Failed, Some(error.body()["error"].clone())),
        Err(_) => (Reach::TimedOut, Some(json!({"message": format!("no answer within {} ms", timeout.as_millis())}))),
    }
}

/// `GET /v1/ops/status` (config.read): each service behind the edge probed with one read of the
/// tenant, the tenant's providers and circuits, its kill switch and this edge's uptime, summed up as
/// `ok`, `degraded` or `down`.
pub async fn status(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("config.read")?;
    let tenant = caller.tenant_id()?.to_string();
    use brainstorm_proto::{audit, budget, catalog, identity, mcp, observability, policy, prompts};
    fn probing<'a>(read: impl Future<Output = Result<(), ApiError>> + Send + 'a) -> Option<Probing<'a>> {
        Some(Box::pin(read))
    }
    let (tenant_id, edge) = (tenant.as_str(), &state);
    let switch = &std::sync::Mutex::new(None);
    // Each service's probe: its name, whether every request needs it, and one cheap read of the
    // tenant (None: this edge runs without the service).
    let probes: Vec<(&str, bool, Option<Probing<'_>>)> = vec![
        (
            "identity",
            true,
            probing(async move {
                edge.identity.get_tenant(identity::TenantRef { tenant_id: tenant_id.to_string() }).await.map(drop).map_err(ApiError::from)
            }),
        ),
        (
            "catalog",
            true,
            probing(async move {
                edge.catalog.get_aliases(catalog::TenantRef { tenant_id: tenant_id.to_string() }).await.map(drop).map_err(ApiError::from)
            }),
        ),
        (
            "budget-ledger",
            true,
            probing(async move {
                edge.budget.get_alert_config(budget::TenantRef { tenant_id: tenant_id.to_string() }).await.map(drop).map_err(ApiError::from)
            }),
        ),
        (
            "audit-lineage",
            true,
            probing(async move {
                let request = audit::DecisionsRequest { tenant_id: tenant_id.to_string(), limit: Some(1), since: None };
                edge.audit.list_decisions(request).await.map(drop).map_err(ApiError::from)
            }),
        ),
        (
            "policy-firewall",
            true,
            // Its probe reads the kill switch this view shows.
            probing(async move {
                let tenant = policy::TenantRef { tenant_id: tenant_id.to_string() };
                let status = edge.policy.get_kill_switch_status(tenant).await.map_err(ApiError::from)?;
                *switch.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(status);
                Ok(())
            }),
        ),
        (
            "mcp-gateway",
            false,
            state.mcp.as_ref().and_then(|client| {
                probing(async move {
                    client.get_governance(mcp::TenantRef { tenant_id: tenant_id.to_string() }).await.map(drop).map_err(ApiError::from)
                })
            }),
        ),
        (
            "prompts-eval",
            false,
            state.prompts.as_ref().and_then(|client| {
                probing(async move {
                    client.list_datasets(prompts::TenantRef { tenant_id: tenant_id.to_string() }).await.map(drop).map_err(ApiError::from)
                })
            }),
        ),
        (
            "observability-fanout",
            false,
            state.observability.as_ref().and_then(|client| {
                probing(async move {
                    client.get_config(observability::TenantRef { tenant_id: tenant_id.to_string() }).await.map(drop).map_err(ApiError::from)
                })
            }),
        ),
    ];
    let (names, runs): (Vec<_>, Vec<_>) = probes
        .into_iter()
        .map(|(name, required, probing)| ((name, required), async move { Some(probe(probing?, PROBE_TIMEOUT).await) }))
        .unzip();
    let reaches = futures::future::join_all(runs).await;
    let (mut required_down, mut wrong) = (false, false);
    let services: Vec<Value> = names
        .into_iter()
        .zip(reaches)
        .map(|((name, required), reach)| {
            let Some((reach, error)) = reach else {
                return json!({"name": name, "required": false, "status": "not_configured"});
            };
            let status = service_status(reach);
            required_down |= required && status == "down";
            wrong |= status != "ok";
            let latency_ms = match reach {
                Reach::Ok(took) => json!((took.as_secs_f64() * 1e6).round() / 1e3),
                _ => Value::Null,
            };
            json!({"name": name, "required": required, "status": status, "latency_ms": latency_ms, "error": error})
        })
        .collect();

    // The tenant's providers: the sentinel's probe and their models' circuits.
    let config = state.routing.get(&tenant).await.ok();
    let keyed = config.as_ref().map(|config| providers_among(&config.routing.providers)).unwrap_or_default();
    state.sentinel.watch(&keyed).await;
    let providers: Vec<Value> = keyed
        .iter()
        .map(|provider| {
            let probe = state.sentinel.last(provider.id);
            let open: Vec<String> = state
                .models
                .models()
                .iter()
                .filter(|model| model.provider == provider.id)
                .map(|model| model.id())
                .filter(|id| state.circuits.state(id).0 == CircuitState::Open)
                .collect();
            wrong |= !open.is_empty() || probe.as_ref().is_some_and(|probe| probe.status != ProbeStatus::Healthy);
            json!({"id": provider.id, "probe": Probe::view(probe.as_ref()), "open_circuits": open})
        })
        .collect();

    let switch = switch.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    let kill_switch = switch.map(|switch| {
        wrong |= switch.active;
        json!({"active": switch.active, "reason": switch.reason, "activatedAt": switch.activated_at, "scopes": switch.scopes.len()})
    });
    let uptime = state.started.elapsed();
    Ok(Json(json!({
        "status": overall(required_down, wrong),
        "checked_at": brainstorm_common::time::now_timestamp(),
        "edge": {
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_seconds": uptime.as_secs(),
            "draining": *state.stopping.borrow(),
        },
        "services": services,
        "providers": providers,
        "sandbox_only": keyed.is_empty(),
        "kill_switch": kill_switch,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_or_failed_probe_is_not_ok() {
        assert_eq!(service_status(Reach::Ok(Duration::from_millis(3))), "ok");
        assert_eq!(service_status(Reach::Ok(Duration::from_millis(900))), "degraded");
        assert_eq!(service_status(Reach::Failed), "down");
        assert_eq!(service_status(Reach::TimedOut), "down");
    }

    #[test]
    fn the_whole_is_down_only_when_a_required_service_is() {
        assert_eq!(overall(true, true), "down");
        assert_eq!(overall(false, true), "degraded");
        assert_eq!(overall(false, false), "ok");
    }

    #[tokio::test]
    async fn a_probe_that_hangs_times_out_and_one_that_errs_carries_its_error() {
        let hanging: Probing<'static> = Box::pin(std::future::pending());
        assert_eq!(probe(hanging, Duration::from_millis(10)).await.0, Reach::TimedOut);
        let failing: Probing<'static> = Box::pin(async { Err(ApiError::unavailable("store_unavailable", "the store is down")) });
        let (reach, error) = probe(failing, PROBE_TIMEOUT).await;
        assert_eq!((reach, error.expect("an error")["code"].as_str()), (Reach::Failed, Some("store_unavailable")));
    }
}
