//! Compiles the protobuf contracts with protox (pure Rust: no protoc to install).

use std::error::Error;

const PROTOS: &[&str] = &[
    "brainstorm/identity/v1/identity.proto",
    "brainstorm/events/v1/events.proto",
    "brainstorm/catalog/v1/catalog.proto",
    "brainstorm/budget/v1/budget.proto",
    "brainstorm/audit/v1/audit.proto",
    "brainstorm/policy/v1/policy.proto",
    "brainstorm/mcp/v1/mcp.proto",
    "brainstorm/prompts/v1/prompts.proto",
    "brainstorm/observability/v1/observability.proto",
];

const CAMEL_CASE: &str = "#[serde(rename_all = \"camelCase\")]";

fn main() -> Result<(), Box<dyn Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let file_descriptors = protox::compile(PROTOS, ["."])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Per-agent limits keep their agents in order, so their JSON and answers are stable.
        .btree_map(".brainstorm.budget.v1.AgentLimits.limits")
        .btree_map(".brainstorm.budget.v1.WriteAgentLimitsRequest.set")
        // The edge answers governance reads with these messages as they are.
        .type_attribute(".brainstorm.audit.v1", "#[derive(serde::Serialize)]")
        // Transport only: the edge's canonical payload travels with the record to the chain writer.
        .field_attribute(".brainstorm.audit.v1.AuditRecord.canonical_payload", "#[serde(skip)]")
        .type_attribute(".brainstorm.policy.v1", "#[derive(serde::Serialize)]")
        // The spec spells these security shapes in camelCase (`activatedAt`, `evaluatedCount`,
        // `matchedRule`, `stdDev`, `consumedByRequestId`, ...).
        .type_attribute(".brainstorm.policy.v1.KillSwitchHistoryEntry", CAMEL_CASE)
        .type_attribute(".brainstorm.policy.v1.ScopedSwitch", CAMEL_CASE)
        .type_attribute(".brainstorm.policy.v1.PolicyTestResult", CAMEL_CASE)
        .type_attribute(".brainstorm.policy.v1.DryRunPolicyResult", CAMEL_CASE)
        .type_attribute(".brainstorm.policy.v1.PolicySummary", CAMEL_CASE)
        .type_attribute(".brainstorm.policy.v1.AnomalySummary", CAMEL_CASE)
        .type_attribute(".brainstorm.policy.v1.AnomalyAlert", CAMEL_CASE)
        .type_attribute(".brainstorm.policy.v1.MetricStats", CAMEL_CASE)
        .type_attribute(".brainstorm.policy.v1.Approval", CAMEL_CASE)
        .compile_fds(file_descriptors)?;
    Ok(())
}
