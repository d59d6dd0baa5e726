//! The edge's handlers, by area.

pub mod admin;
pub mod agent_certificates;
pub mod agent_limits;
pub mod agent_self;
pub mod agents;
pub mod bridge;
pub mod budget;
pub mod capabilities;
pub mod completions;
pub mod config;
pub mod datasets;
pub mod governance;
pub mod guardian;
pub mod identity;
pub mod insights;
pub mod leaderboard;
pub mod liaison;
pub mod mcp;
pub mod mcp_connect;
pub mod memory;
pub mod oauth;
pub mod observability;
pub mod ops;
pub mod prompts;
pub mod provider_health;
pub mod providers;
pub mod usage;

use axum::Json;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use serde_json::{Value, json};

/// The API's OpenAPI document, generated from the route table and the handlers' documentation by
/// `scripts/gen-openapi.py` (`make gen`; `make test` checks it is current).
const OPENAPI_DOCUMENT: &str = include_str!("../openapi.json");

/// `GET /health`: 200 once the process serves.
pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// `GET /openapi.json`: the API's OpenAPI 3.1 document (every route this edge serves, its method,
/// path parameters, permission and summary, and the error envelope).
pub async fn openapi() -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/json")], OPENAPI_DOCUMENT)
}
