//! The prompts-eval service: a tenant's prompt templates with integer versions, the version each
//! environment serves (promoted dev, then staging, then prod), A/B tests between two versions, and
//! evaluation runs of a version against test cases (scored exactly, by containment, structurally,
//! or by a judging model the edge calls), evaluation datasets, and agent memory (facts in sized
//! blocks, evicted to archival when full, audited, checked for personal data).

pub mod memory;
pub mod scoring;
mod service;
mod store;
pub mod template;

pub use service::{MAX_CASES, MAX_ITEMS_PER_BATCH, PromptsEvalServiceImpl};
