//! The observability-fanout service: a tenant's observability destinations and XDR/SIEM connectors
//! (secrets sealed at rest, never returned), the usage, audit, guardrail and error events its
//! requests produce (from the bus, or relayed by edges), filtered, batched and delivered in each
//! destination's format (OCSF 1.3.0 for XDR), with delivery counters.

mod consumer;
mod dispatcher;
mod egress;
pub mod events;
pub mod filter;
pub mod formats;
mod service;
mod store;

pub use consumer::spawn_fanout_consumers;
pub use service::ObservabilityFanoutServiceImpl;
