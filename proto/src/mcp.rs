//! The mcp-gateway contract: MCP server registry, tool discovery, governed tool calls, approvals and audit.

#[allow(clippy::all, missing_docs)]
mod v1 {
    tonic::include_proto!("brainstorm.mcp.v1");
}

use v1::mcp_gateway_service_client::McpGatewayServiceClient;
use v1::mcp_gateway_service_server::McpGatewayServiceServer;
pub use v1::*;

crate::grpc::service_contract! {
    service McpGatewayService;
    client McpGatewayClient;
    generated_client McpGatewayServiceClient;
    generated_server McpGatewayServiceServer;
    generated_server_trait v1::mcp_gateway_service_server::McpGatewayService;
    methods {
        /// Registers a server, sealing its credential.
        fn register_server(RegisterServerRequest) -> McpServer;
        /// The tenant's servers.
        fn list_servers(TenantRef) -> McpServerList;
        /// One server, by id or name.
        fn get_server(ServerRef) -> McpServer;
        /// Changes a server's members; an absent credential keeps the stored one.
        fn update_server(UpdateServerRequest) -> McpServer;
        /// Removes a server and its tools.
        fn delete_server(ServerRef) -> McpServer;
        /// Lists the server's tools live and saves them.
        fn discover_tools(ServerRef) -> ToolList;
        /// Every saved tool of the tenant.
        fn list_tools(TenantRef) -> ToolList;
        /// Calls a tool under governance.
        fn call_tool(CallToolRequest) -> CallToolResponse;
        /// The newest audit entries.
        fn list_audit(AuditQuery) -> AuditList;
        /// The tenant's tool policies and pending approvals.
        fn get_governance(TenantRef) -> Governance;
        /// Creates or replaces one tool's policy.
        fn put_policy(PutPolicyRequest) -> Governance;
        /// Approvals, by status.
        fn list_approvals(ApprovalQuery) -> ApprovalList;
        /// Approves (and runs) or denies a pending approval.
        fn decide_approval(DecideApprovalRequest) -> Approval;
    }
}
