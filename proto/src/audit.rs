//! The audit-lineage service contract: hash-chained audit records, chain verification and export,
//! explain, lineage, signed artifacts, the agents inventory and replays; and the `audit.records` bus
//! payload the edge publishes.

#[allow(clippy::all, missing_docs)]
mod v1 {
    tonic::include_proto!("brainstorm.audit.v1");
}

use v1::audit_lineage_service_client::AuditLineageServiceClient;
use v1::audit_lineage_service_server::AuditLineageServiceServer;
pub use v1::*;

/// Topic of `AuditRecord`s, keyed by tenant id (one tenant's records stay in one partition, in order).
pub const AUDIT_RECORDS_TOPIC: &str = "audit.records";

crate::grpc::service_contract! {
    service AuditLineageService;
    client AuditLineageClient;
    generated_client AuditLineageServiceClient;
    generated_server AuditLineageServiceServer;
    generated_server_trait v1::audit_lineage_service_server::AuditLineageService;
    methods {
        /// Chains one record idempotently (the consumer's path, for an edge without a shared bus).
        fn record_audit(AuditRecord) -> RecordAuditResponse;
        /// Chains records idempotently, each tenant's in the order given; refused whole when one is invalid.
        fn record_audit_batch(AuditRecordBatch) -> RecordAuditBatchResponse;
        /// Recomputes a tenant's chain: the first broken link and per-row provenance checks.
        fn verify_chain(VerifyChainRequest) -> ChainReport;
        /// One page of the chain as JSON lines.
        fn export_chain(ExportChainRequest) -> ChainExportPage;
        /// The decision trace of one request.
        fn explain(RequestRef) -> Explanation;
        /// The lineage answer for one request.
        fn get_lineage(RequestRef) -> Lineage;
        /// The causal episode of a trace, ordered by span parentage.
        fn get_episode(EpisodeRequest) -> Episode;
        /// The signed evidence artifact of one chained request.
        fn get_artifact(ArtifactRequest) -> SignedArtifact;
        /// The key that verifies a tenant's artifacts.
        fn get_verification_key(TenantRef) -> VerificationKey;
        /// Agents seen in a window, by class, with the shadow ratio.
        fn get_agent_inventory(InventoryRequest) -> AgentInventory;
        /// Recorded routing decisions, newest first.
        fn list_decisions(DecisionsRequest) -> DecisionList;
        /// Re-prices recorded requests under another strategy.
        fn simulate_replay(SimulateRequest) -> Simulation;
        /// Per recorded strategy aggregates with p95 latency.
        fn compare_strategies(CompareRequest) -> StrategyComparison;
        /// Removes a request's captured text; its digest stays chained.
        fn redact_capture(RequestRef) -> RedactCaptureResponse;
        /// Prunes a tenant's chain before a time, leaving a checkpoint.
        fn apply_retention(RetentionRequest) -> RetentionResult;
    }
}
