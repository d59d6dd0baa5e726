//! The mcp-gateway service: a tenant's MCP servers (credentials sealed at rest, never returned),
//! their tools discovered live, tool calls proxied under the tenant's tool governance (deny, or
//! queue for a reviewer's approval), and the audit trail of every call.

pub mod client;
mod service;
mod store;

pub use service::{DEFAULT_POLICY, McpGatewayOptions, McpGatewayServiceImpl, TRANSPORTS};
