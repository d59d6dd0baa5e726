//! Payloads carried on the event bus, and the topics they travel on.

#[allow(clippy::all, missing_docs)]
mod v1 {
    tonic::include_proto!("brainstorm.events.v1");
}

pub use v1::*;

/// Topic of `IdentityEvent`s, keyed by tenant id.
pub const IDENTITY_EVENTS_TOPIC: &str = "identity.events";

/// Topic of `RoutingConfigChanged`, keyed by tenant id.
pub const CATALOG_EVENTS_TOPIC: &str = "catalog.events";
