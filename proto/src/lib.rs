//! Protobuf contracts of every Brainstorm service, with one trait, one client and gRPC adapters each.
//!
//! Callers hold a client (`IdentityClient`, ...) and never know whether the service runs in this process
//! (`local`) or behind a tonic channel (`grpc`). Errors keep their kind and reason across the hop.

pub mod audit;
pub mod budget;
pub mod catalog;
mod error;
pub mod events;
mod grpc;
pub mod identity;
pub mod mcp;
pub mod observability;
pub mod policy;
pub mod prompts;
pub mod trace;

pub use error::{ErrorKind, ServiceError, ServiceResult};
