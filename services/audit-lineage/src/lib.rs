//! Audit and lineage: each tenant's tamper-evident hash chain of audit records (written only by the
//! `audit.records` consumer), its verification and export, explain, lineage episodes, signed evidence
//! artifacts, the agents inventory and routing replays.
//!
//! The edge links this crate for the hot-path pieces (`commitment`, `publish_record`,
//! `validate_record`, `AuditPublisher`); everything else goes through `AuditLineageClient`.

pub mod artifact;
pub mod canonical;
pub mod chain;
pub mod consumer;
pub mod export;
pub mod inventory;
pub mod lineage;
pub mod publish;
pub mod replay;
mod service;
pub mod store;

pub use artifact::{ALGORITHM, ArtifactError, ArtifactSigner, TenantKey, verify_artifact};
pub use canonical::{CHAIN_SCHEMA_VERSION, GENESIS_HASH, canonical_payload, chain_hash, commitment};
pub use chain::{BrokenLinkView, ChainPoint, ProvenanceEntry, Report};
pub use consumer::{AuditConsumer, CONSUMER_GROUP, Handled, spawn_audit_consumer};
pub use export::{ExportError, verify_export, verify_export_with};
pub use publish::{AuditPublisher, OverflowPolicy, PublisherOptions, PublisherStats, SubmitError, Submitted, publish_record};
pub use replay::price_table;
pub use service::{AuditLineageOptions, AuditLineageServiceImpl, Clock, validate_record};
