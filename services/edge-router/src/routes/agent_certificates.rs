//! The agent client certificates identity issued, listed and revoked: by the tenant's operators
//! (`/v1/agent/certificates`) and by an agent for its own (`/v1/agent/auth/cert`). Issuing is the
//! certificate exchange (`agent_self::exchange_certificate`). Each issuance and revocation goes to
//! the tenant's observability destinations as an `audit` event (`activity`). Snake_case, as the
//! exchange.

use axum::Json;
use axum::extract::State;
use brainstorm_common::ApiError;
use brainstorm_proto::identity::{AgentCertificate, ListAgentCertificatesRequest, RevokeAgentCertificateRequest};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::{AgentCaller, Caller};
use crate::extract::{OptionalJsonBody, Path, Query};
use crate::{EdgeState, activity};

type Answer = Result<Json<Value>, ApiError>;

/// Who may list certificates (admin, operator, auditor), as agent profiles.
const READ: &str = "agent.profile.read";
/// Who may revoke them (admin, operator), as they move an agent's lifecycle.
const MANAGE: &str = "agent.lifecycle.manage";

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    agent_id: Option<String>,
    status: Option<String>,
    limit: Option<u32>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RevokeBody {
    reason: Option<String>,
}

/// A certificate as the routes show it, with its state (`active`, `expired` or `revoked`).
fn view(certificate: &AgentCertificate) -> Value {
    json!({
        "serial": certificate.serial,
        "agent_id": certificate.agent_id,
        "status": certificate.status,
        "fingerprint_sha256": certificate.fingerprint_sha256,
        "key_source": certificate.key_source,
        "not_before": certificate.not_before,
        "not_after": certificate.not_after,
        "issued_at": certificate.issued_at,
        "revoked_at": certificate.revoked_at,
        "revoked_reason": certificate.revoked_reason,
        "revoked_by": certificate.revoked_by,
    })
}

fn list_view(certificates: &[AgentCertificate]) -> Value {
    let views: Vec<Value> = certificates.iter().map(view).collect();
    json!({"total": views.len(), "certificates": views})
}

/// `GET /v1/agent/certificates?agent_id=&status=&limit=` (agent.profile.read): the certificates
/// issued to the tenant's agents, newest first (`agent_id`: one agent's, of its current profile;
/// `status`: `active`, `expired` or `revoked`; `limit` 1 to 1000, default 100). Records of
/// certificates expired more than 30 days are dropped at the agent's next issuance.
pub async fn list(State(state): State<EdgeState>, caller: Caller, Query(query): Query<ListQuery>) -> Answer {
    caller.require(READ)?;
    let request = ListAgentCertificatesRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        agent_id: query.agent_id,
        status: query.status,
        limit: query.limit,
    };
    let list = state.identity.list_agent_certificates(request).await?;
    Ok(Json(list_view(&list.certificates)))
}

/// `POST /v1/agent/certificates/{serial}/revoke` (agent.lifecycle.manage): revokes one agent
/// certificate (optional `{reason}`), refused from its next use (401 `agent_certificate_revoked`)
/// while the agent's JWT and its other certificates still work (suspend the agent to stop them
/// all). Revoking a revoked certificate returns it unchanged; 404 `certificate_not_found` for a
/// serial the tenant was not issued.
pub async fn revoke(
    State(state): State<EdgeState>,
    caller: Caller,
    Path(serial): Path<String>,
    OptionalJsonBody(body): OptionalJsonBody<RevokeBody>,
) -> Answer {
    caller.require(MANAGE)?;
    let request = RevokeAgentCertificateRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        serial,
        agent_id: None,
        reason: body.reason,
        revoked_by: activity::key_actor(&caller),
    };
    revoked(&state, request).await
}

/// `GET /v1/agent/auth/cert` (agent JWT or client certificate; allowed without an owner): the
/// agent's own certificates, newest first, as `GET /v1/agent/certificates` shows them.
pub async fn mine(State(state): State<EdgeState>, agent: AgentCaller, Query(query): Query<ListQuery>) -> Answer {
    if query.agent_id.as_deref().is_some_and(|agent_id| agent_id != agent.profile.agent_id) {
        return Err(ApiError::invalid_request("invalid_agent_id", "an agent lists its own certificates: leave agent_id out"));
    }
    let request = ListAgentCertificatesRequest {
        tenant_id: agent.tenant.id.clone(),
        agent_id: Some(agent.profile.agent_id.clone()),
        status: query.status,
        limit: query.limit,
    };
    let list = state.identity.list_agent_certificates(request).await?;
    Ok(Json(list_view(&list.certificates)))
}

/// `POST /v1/agent/auth/cert/{serial}/revoke` (agent JWT or client certificate; allowed without an
/// owner): an agent revokes one of its own certificates (optional `{reason}`): one it rotated away
/// from, or one whose key it lost; another agent's serial is 404 `certificate_not_found`.
pub async fn revoke_mine(
    State(state): State<EdgeState>,
    agent: AgentCaller,
    Path(serial): Path<String>,
    OptionalJsonBody(body): OptionalJsonBody<RevokeBody>,
) -> Answer {
    let request = RevokeAgentCertificateRequest {
        tenant_id: agent.tenant.id.clone(),
        serial,
        agent_id: Some(agent.profile.agent_id.clone()),
        reason: body.reason,
        revoked_by: activity::agent_actor(&agent),
    };
    revoked(&state, request).await
}

/// Revokes, announces a revocation this call made, and answers `{certificate}`.
async fn revoked(state: &EdgeState, request: RevokeAgentCertificateRequest) -> Answer {
    let actor = request.revoked_by.clone();
    let revoked = state.identity.revoke_agent_certificate(request).await?;
    let Some(certificate) = revoked.certificate else {
        tracing::error!("identity answered a revocation without its certificate");
        return Err(ApiError::internal());
    };
    if revoked.changed {
        let mut event = activity::activity(&certificate.tenant_id, "agent_certificate.revoked", actor, &certificate.serial, 3);
        event.occurred_at = certificate.revoked_at.clone().unwrap_or(event.occurred_at);
        event.reason = certificate.revoked_reason.clone().unwrap_or_default();
        event.data_json = certificate_data(&certificate.agent_id, &certificate.fingerprint_sha256, &certificate.not_after);
        activity::announce(state, event);
    }
    Ok(Json(json!({"certificate": view(&certificate)})))
}

/// What an activity event carries of a certificate besides its serial (the subject).
pub fn certificate_data(agent_id: &str, fingerprint_sha256: &str, not_after: &str) -> String {
    json!({"agent_id": agent_id, "fingerprint_sha256": fingerprint_sha256, "not_after": not_after}).to_string()
}
