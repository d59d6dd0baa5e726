//! The gateway's capabilities: every operation the edge serves, by a capability id (its OpenAPI
//! operation id), listed at `GET /v1/capabilities` and each described at
//! `GET /v1/capabilities/{id}/describe`, so an agent finds what it may call and how. Read from the
//! same generated document `/openapi.json` serves, parsed once.

use std::sync::LazyLock;

use crate::extract::Path;
use axum::Json;
use brainstorm_common::ApiError;
use serde_json::{Map, Value, json};

use crate::auth::Caller;

type Answer = Result<Json<Value>, ApiError>;

/// One operation of the document.
struct Capability {
    id: String,
    method: String,
    path: String,
    operation: Map<String, Value>,
}

impl Capability {
    /// The permission the operation needs (`x-permission`: one, or several joined by ` and `/` or `), if any.
    fn permission(&self) -> Option<&str> {
        self.operation.get("x-permission").and_then(Value::as_str)
    }

    fn text(&self, name: &str) -> Value {
        self.operation.get(name).cloned().unwrap_or(Value::Null)
    }

    /// Whether the caller's key holds what the operation needs (every permission of an `and`, one of an `or`).
    fn granted(&self, caller: &Caller) -> bool {
        let holds = |permission: &str| caller.require(permission.trim()).is_ok();
        match self.permission() {
            None => true,
            Some(needed) if needed.contains(" or ") => needed.split(" or ").any(holds),
            Some(needed) => needed.split(" and ").all(holds),
        }
    }

    fn summary(&self, caller: &Caller) -> Value {
        json!({
            "id": self.id,
            "object": "capability",
            "method": self.method,
            "path": self.path,
            "summary": self.text("summary"),
            "permission": self.permission(),
            "granted": self.granted(caller),
            "describe": format!("/v1/capabilities/{}/describe", self.id),
        })
    }
}

static CAPABILITIES: LazyLock<Vec<Capability>> = LazyLock::new(|| parse(super::OPENAPI_DOCUMENT));

/// Every operation of an OpenAPI document, in the document's order.
fn parse(document: &str) -> Vec<Capability> {
    let document: Value = serde_json::from_str(document).unwrap_or(Value::Null);
    let Some(paths) = document.get("paths").and_then(Value::as_object) else { return Vec::new() };
    let mut capabilities = Vec::new();
    for (path, item) in paths {
        let Some(item) = item.as_object() else { continue };
        for (method, operation) in item {
            let Some(operation) = operation.as_object() else { continue };
            let Some(id) = operation.get("operationId").and_then(Value::as_str) else { continue };
            capabilities.push(Capability {
                id: id.to_string(),
                method: method.to_uppercase(),
                path: path.clone(),
                operation: operation.clone(),
            });
        }
    }
    capabilities
}

/// `GET /v1/capabilities` (router.read): every capability with its method, path, summary, the
/// permission it needs and whether the caller's key holds it.
pub async fn list(caller: Caller) -> Answer {
    caller.require("router.read")?;
    let data: Vec<Value> = CAPABILITIES.iter().map(|capability| capability.summary(&caller)).collect();
    Ok(Json(json!({"object": "list", "total": data.len(), "data": data})))
}

/// `GET /v1/capabilities/{id}/describe` (router.read): one capability in full: its summary,
/// description, path parameters, request body and responses as the OpenAPI document gives them.
pub async fn describe(caller: Caller, Path(id): Path<String>) -> Answer {
    caller.require("router.read")?;
    let Some(capability) = CAPABILITIES.iter().find(|capability| capability.id == id) else {
        let mut error = ApiError::not_found("capability_not_found", format!("no capability `{id}`"));
        error.recovery.endpoint = "/v1/capabilities".to_string();
        error.recovery.message = "list the capabilities with GET /v1/capabilities".to_string();
        error.recovery.method = "GET";
        return Err(error);
    };
    let mut described = capability.summary(&caller);
    for member in ["description", "tags", "parameters", "requestBody", "responses"] {
        if let Some(value) = capability.operation.get(member) {
            described[member] = value.clone();
        }
    }
    Ok(Json(described))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_of_the_served_document_is_a_capability_with_a_unique_id() {
        let capabilities = parse(super::super::OPENAPI_DOCUMENT);
        assert!(capabilities.len() > 150, "{}", capabilities.len());
        let mut ids: Vec<&str> = capabilities.iter().map(|capability| capability.id.as_str()).collect();
        ids.sort_unstable();
        let total = ids.len();
        ids.dedup();
        assert_eq!(ids.len(), total, "capability ids are unique");
        let graduate = capabilities.iter().find(|capability| capability.path == "/v1/account/graduate");
        assert!(graduate.is_some_and(|capability| capability.method == "POST" && capability.permission() == Some("config.write")));
    }
}
