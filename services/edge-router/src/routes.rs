//! The edge's handlers, by area.

pub mod admin;
pub mod agent_limits;
pub mod agent_self;
pub mod agents;
pub mod bridge;
pub mod budget;
pub mod completions;
pub mod datasets;
pub mod governance;
pub mod guardian;
pub mod identity;
pub mod leaderboard;
pub mod liaison;
pub mod mcp;
pub mod mcp_connect;
pub mod memory;
pub mod oauth;
pub mod observability;
pub mod prompts;
pub mod provider_health;
pub mod providers;

use axum::Json;
use serde_json::{Value, json};

/// `GET /health`: 200 once the process serves.
pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}
