//! `GET /v1/config`: the tenant's whole configuration in one read. Each section is the answer of the
//! `GET` route that owns it, run with the caller's key (so permissions, shapes and secrecy are that
//! route's: provider keys stay masked), side by side with the calling key and what this gateway runs.

use std::future::Future;
use std::pin::Pin;

use axum::Json;
use axum::extract::State;
use serde_json::{Map, Value, json};

use crate::EdgeState;
use crate::auth::Caller;
use crate::routes::budget::Answer;
use crate::routes::{agent_limits, budget, guardian, identity, mcp, observability, providers};
use crate::self_view::PRIVACY_MODE;
use crate::views;

type Reader = fn(State<EdgeState>, Caller) -> Pin<Box<dyn Future<Output = Answer> + Send>>;

/// One section: its name, the permission its route needs (none: any key of the tenant), the route,
/// and its handler.
struct Section {
    name: &'static str,
    permission: Option<&'static str>,
    endpoint: &'static str,
    read: Reader,
}

/// Every section, in the order shown.
const SECTIONS: [Section; 14] = [
    Section {
        name: "account",
        permission: Some("config.read"),
        endpoint: "/v1/account",
        read: |s, c| Box::pin(identity::get_account(s, c)),
    },
    Section {
        name: "providers",
        permission: Some("config.read"),
        endpoint: "/v1/providers",
        read: |s, c| Box::pin(providers::list_keys(s, c)),
    },
    Section {
        name: "aliases",
        permission: Some("config.read"),
        endpoint: "/v1/aliases",
        read: |s, c| Box::pin(providers::get_aliases(s, c)),
    },
    Section {
        name: "presets",
        permission: Some("config.read"),
        endpoint: "/v1/presets",
        read: |s, c| Box::pin(providers::list_presets(s, c)),
    },
    Section { name: "budget", permission: Some("config.read"), endpoint: "/v1/budget/status", read: |s, c| Box::pin(budget::status(s, c)) },
    Section {
        name: "budget_alerts",
        permission: Some("config.read"),
        endpoint: "/v1/budget/alerts/config",
        read: |s, c| Box::pin(budget::get_alert_config(s, c)),
    },
    Section {
        name: "agent_limits",
        permission: Some(agent_limits::MANAGE),
        endpoint: "/v1/agent-limits",
        read: |s, c| Box::pin(agent_limits::get(s, c)),
    },
    Section { name: "kill_switch", permission: None, endpoint: "/v1/killswitch/status", read: |s, c| Box::pin(kill_switch(s, c)) },
    Section {
        name: "guardrails",
        permission: Some("security.read"),
        endpoint: "/v1/guardrails/config",
        read: |s, c| Box::pin(guardian::guardrails_config(s, c)),
    },
    Section {
        name: "security_policies",
        permission: Some("security.read"),
        endpoint: "/v1/security/policies",
        read: |s, c| Box::pin(guardian::get_policies(s, c)),
    },
    Section {
        name: "firewall",
        permission: Some("security.read"),
        endpoint: "/v1/firewall/config",
        read: |s, c| Box::pin(guardian::firewall_config(s, c)),
    },
    Section {
        name: "mcp_governance",
        permission: Some("security.read"),
        endpoint: "/v1/mcp/governance",
        read: |s, c| Box::pin(mcp::governance(s, c)),
    },
    Section {
        name: "observability",
        permission: Some("config.read"),
        endpoint: "/v1/observability/config",
        read: |s, c| Box::pin(observability::get_config(s, c)),
    },
    Section {
        name: "observability_destinations",
        permission: Some("config.read"),
        endpoint: "/v1/observability/destinations",
        read: |s, c| Box::pin(observability::list_destinations(s, c)),
    },
];

/// The kill switch as configuration: its state and scopes, without the status route's history.
async fn kill_switch(state: State<EdgeState>, caller: Caller) -> Answer {
    let Json(mut status) = guardian::status(state, caller).await?;
    if let Some(status) = status.as_object_mut() {
        status.remove("history");
    }
    Ok(Json(status))
}

/// The calling key as its own configuration (`/v1/api-keys`'s view of it, masked, and the
/// permissions it grants); never its secret.
fn calling_key(caller: &Caller) -> Value {
    let identity = &caller.identity;
    let mut view = identity
        .key
        .as_ref()
        .map_or_else(|| json!({"id": identity.key_id, "role": identity.role, "scopes": identity.scopes}), views::api_key);
    view["permissions"] = json!(identity.permissions);
    view
}

/// `GET /v1/config` (config.read): the sections the key may read, each as its route answers it;
/// `omitted` names those it may not (with the permission they need), `unavailable` those whose
/// service could not answer (with the error), so one failing service does not hide the rest.
pub async fn get(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("config.read")?;
    let tenant_id = caller.tenant_id()?.to_string();
    let readable: Vec<&Section> = SECTIONS
        .iter()
        .filter(|section| section.permission.is_none_or(|permission| caller.identity.permissions.contains(permission)))
        .collect();
    let answers = futures::future::join_all(readable.iter().map(|section| (section.read)(State(state.clone()), caller.clone()))).await;
    let mut document = Map::new();
    document.insert("tenant_id".into(), json!(tenant_id));
    document.insert(
        "gateway".into(),
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "privacy_mode": PRIVACY_MODE,
            "services": {
                "mcp_gateway": state.mcp.is_some(),
                "prompts_eval": state.prompts.is_some(),
                "observability_fanout": state.observability.is_some(),
            },
            "xdr_bidirectional": state.xdr_bidirectional,
            "tls": state.serves_tls,
            "forwarded_client_certificate_header": state.forwarded_certificate_header,
        }),
    );
    document.insert("api_key".into(), calling_key(&caller));
    let mut unavailable = Vec::new();
    for (section, answer) in readable.iter().zip(answers) {
        match answer {
            Ok(Json(value)) => {
                document.insert(section.name.into(), value);
            }
            Err(error) => {
                document.insert(section.name.into(), Value::Null);
                unavailable.push(json!({"section": section.name, "endpoint": section.endpoint, "status": error.status.as_u16(), "error": error.body()["error"]}));
            }
        }
    }
    let omitted: Vec<Value> = SECTIONS
        .iter()
        .filter(|section| !readable.iter().any(|readable| readable.name == section.name))
        .map(|section| json!({"section": section.name, "endpoint": section.endpoint, "permission": section.permission}))
        .collect();
    document.insert("omitted".into(), json!(omitted));
    document.insert("unavailable".into(), json!(unavailable));
    let endpoints: Map<String, Value> = SECTIONS.iter().map(|section| (section.name.to_string(), json!(section.endpoint))).collect();
    document.insert("endpoints".into(), Value::Object(endpoints));
    Ok(Json(Value::Object(document)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_are_named_once_and_each_names_its_route() {
        let mut names: Vec<&str> = SECTIONS.iter().map(|section| section.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SECTIONS.len());
        assert!(SECTIONS.iter().all(|section| section.endpoint.starts_with("/v1/")));
        assert!(!names.iter().any(|name| ["tenant_id", "gateway", "api_key", "omitted", "unavailable", "endpoints"].contains(name)));
    }
}
