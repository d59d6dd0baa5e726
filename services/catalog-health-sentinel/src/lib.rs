//! The catalog-health-sentinel service: the provider catalog's tenant side. It keeps each tenant's
//! provider keys (validated live, envelope-encrypted at rest, masked when shown), model aliases and
//! routing presets, and hands the edge a tenant's routing configuration.

mod service;
mod store;

pub use service::{CatalogOptions, CatalogServiceImpl};
