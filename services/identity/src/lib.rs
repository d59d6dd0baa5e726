//! The identity service: tenants, users, API keys, RBAC, invitations and platform administration.
//!
//! `IdentityServiceImpl` implements the `IdentityService` contract of `brainstorm-proto` over a
//! `Database`; callers reach it through an `IdentityClient`, in process or over gRPC.

pub mod agent_cert;
pub mod agent_token;
mod agents;
mod bridge;
mod certificates;
mod oauth;
pub mod rbac;
mod secrets;
mod service;
mod store;

pub use agent_cert::AgentCertificateAuthority;
pub use agent_token::AgentTokenSigner;
pub use service::{IdentityOptions, IdentityServiceImpl};
