//! `GET /v1/health/providers`: every catalog provider as this edge sees it: the sentinel's last probe
//! of its API, each model's circuit, and whether the tenant holds a key for it.

use axum::Json;
use axum::extract::State;
use brainstorm_common::ApiError;
use brainstorm_providers::catalog::PROVIDERS;
use serde_json::{Value, json};

use crate::EdgeState;
use crate::auth::Caller;
use crate::circuits::CircuitState;
use crate::sentinel::{Probe, ProbeStatus, providers_among};

/// A provider's health from its probe and its models' circuits: `down` when the probe found no API
/// or every model's circuit is open, `degraded` when the probe was slow or answered 5xx or some
/// circuit is open, `healthy` when probed and fine, `unknown` when never probed and nothing failed.
fn provider_health(probe: Option<ProbeStatus>, total_models: usize, circuits_open: usize) -> &'static str {
    match probe {
        Some(ProbeStatus::Down) => "down",
        _ if total_models > 0 && circuits_open == total_models => "down",
        Some(ProbeStatus::Degraded) => "degraded",
        _ if circuits_open > 0 => "degraded",
        Some(ProbeStatus::Healthy) => "healthy",
        None => "unknown",
    }
}

/// `GET /v1/health/providers` (router.read). The tenant's keyed providers are watched by the
/// sentinel from the first ask (probed then); the others show `not_probed` until some tenant asks.
pub async fn providers(State(state): State<EdgeState>, caller: Caller) -> Result<Json<Value>, ApiError> {
    caller.require("router.read")?;
    let config = state.routing.get(caller.tenant_id()?).await?;
    let keyed = providers_among(&config.routing.providers);
    state.sentinel.watch(&keyed).await;
    let (mut healthy, mut degraded, mut down) = (0, 0, 0);
    let mut providers = Vec::with_capacity(PROVIDERS.len());
    for provider in &PROVIDERS {
        let has_key = keyed.iter().any(|keyed| keyed.id == provider.id);
        let probe = state.sentinel.last(provider.id);
        let probe_status = probe.as_ref().map(|probe| probe.status);
        let mut models = Vec::new();
        let (mut circuits_open, mut routable) = (0, 0);
        for model in state.models.models().iter().filter(|model| model.provider == provider.id) {
            let id = model.id();
            let circuit = state.circuits.state(&id).0;
            if circuit == CircuitState::Open {
                circuits_open += 1;
            }
            let is_routable = has_key && circuit != CircuitState::Open;
            routable += usize::from(is_routable);
            models.push(json!({"id": id, "circuit": circuit.as_str(), "routable": is_routable}));
        }
        let health = provider_health(probe_status, models.len(), circuits_open);
        match health {
            "healthy" => healthy += 1,
            "degraded" => degraded += 1,
            "down" => down += 1,
            _ => {}
        }
        providers.push(json!({
            "id": provider.id,
            "sentinel": Probe::view(probe.as_ref()),
            "models": models,
            "aggregate": {
                "total_models": models.len(),
                "routable_models": routable,
                "circuit_open_count": circuits_open,
                "health": health,
            },
            "has_key": has_key,
        }));
    }
    Ok(Json(json!({
        "providers": providers,
        "summary": {"total_providers": PROVIDERS.len(), "healthy": healthy, "degraded": degraded, "down": down},
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provider_is_as_healthy_as_its_probe_and_circuits_say() {
        assert_eq!(provider_health(None, 3, 0), "unknown");
        assert_eq!(provider_health(Some(ProbeStatus::Healthy), 3, 0), "healthy");
        assert_eq!(provider_health(Some(ProbeStatus::Healthy), 3, 1), "degraded");
        assert_eq!(provider_health(None, 3, 3), "down");
        assert_eq!(provider_health(Some(ProbeStatus::Degraded), 3, 0), "degraded");
        assert_eq!(provider_health(Some(ProbeStatus::Down), 3, 0), "down");
        assert_eq!(provider_health(Some(ProbeStatus::Healthy), 0, 0), "healthy");
    }
}
