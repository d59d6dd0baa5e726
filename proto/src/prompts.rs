//! The prompts-eval contract: prompt templates, versions, environments, A/B tests and evaluations.

#[allow(clippy::all, missing_docs)]
mod v1 {
    tonic::include_proto!("brainstorm.prompts.v1");
}

use v1::prompts_eval_service_client::PromptsEvalServiceClient;
use v1::prompts_eval_service_server::PromptsEvalServiceServer;
pub use v1::*;

crate::grpc::service_contract! {
    service PromptsEvalService;
    client PromptsEvalClient;
    generated_client PromptsEvalServiceClient;
    generated_server PromptsEvalServiceServer;
    generated_server_trait v1::prompts_eval_service_server::PromptsEvalService;
    methods {
        /// Creates a prompt at version 1.
        fn create_prompt(CreatePromptRequest) -> Prompt;
        /// The tenant's prompts (archived ones on request), each with its latest version.
        fn list_prompts(ListPromptsRequest) -> PromptList;
        /// One prompt with every version.
        fn get_prompt(PromptRef) -> Prompt;
        /// Adds a version.
        fn update_prompt(UpdatePromptRequest) -> Prompt;
        /// Archives a prompt.
        fn archive_prompt(PromptRef) -> Prompt;
        /// Makes a version serve an environment.
        fn promote_prompt(PromoteRequest) -> Prompt;
        /// Resolves a template with variables.
        fn render_prompt(RenderRequest) -> Rendered;
        /// Starts or stops an A/B test.
        fn set_ab_test(AbTestRequest) -> AbTest;
        /// The prompt's A/B test and its results.
        fn get_ab_test(PromptRef) -> AbTest;
        /// Renders an evaluation's cases.
        fn prepare_evaluation(PrepareEvaluationRequest) -> PreparedEvaluation;
        /// Scores an evaluation's answers, keeping the run when asked.
        fn record_evaluation(RecordEvaluationRequest) -> EvaluationRun;
        /// The newest evaluation runs, without cases.
        fn list_evaluations(PromptRef) -> EvaluationRunList;
        /// One run with its cases.
        fn get_evaluation(EvaluationRef) -> EvaluationRun;
        /// Creates an evaluation dataset.
        fn create_dataset(CreateDatasetRequest) -> Dataset;
        /// The tenant's datasets.
        fn list_datasets(TenantRef) -> DatasetList;
        /// One dataset.
        fn get_dataset(DatasetRef) -> Dataset;
        /// Renames or re-describes a dataset.
        fn update_dataset(UpdateDatasetRequest) -> Dataset;
        /// Deletes a dataset and its items.
        fn delete_dataset(DatasetRef) -> Dataset;
        /// Appends items.
        fn add_items(AddItemsRequest) -> ItemList;
        /// A dataset's items, in order.
        fn list_items(DatasetRef) -> ItemList;
        /// Deletes one item.
        fn delete_item(ItemRef) -> DatasetItem;
        /// Appends a memory fact, evicting to archival when the block is full.
        fn add_memory(AddMemoryRequest) -> AddMemoryResponse;
        /// Replaces, pins or unpins a memory fact.
        fn update_memory(UpdateMemoryRequest) -> MemoryEntry;
        /// Deletes a memory fact.
        fn delete_memory(MemoryEntryRef) -> MemoryEntry;
        /// Memory entries and block summaries.
        fn list_memory(MemoryQuery) -> MemoryView;
        /// The memory audit trail, newest first.
        fn memory_audit(MemoryAuditQuery) -> MemoryAuditList;
        /// Memory operation counts.
        fn memory_stats(MemoryStatsRequest) -> MemoryStats;
        /// Core memory entries that look personal or secret.
        fn memory_compliance(MemoryKey) -> ComplianceReport;
    }
}
