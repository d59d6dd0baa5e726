//! Shared plumbing of every Brainstorm service: the error envelope, configuration, store, event bus,
//! mail outbox, money, time and text helpers, request-path hash maps, and telemetry.

pub mod batch;
pub mod bus;
pub mod collections;
pub mod config;
pub mod error;
pub mod money;
pub mod net;
pub mod outbox;
pub mod store;
pub mod telemetry;
pub mod text;
pub mod time;

pub use error::{ApiError, Recovery};
