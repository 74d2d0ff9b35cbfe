//! # bootsman-runtime
//!
//! What every Bootsman binary shares: structured logging ([`telemetry`]), one Prometheus registry
//! with reconcile metrics ([`metrics`]), the `/livez` `/readyz` `/metrics` server ([`server`]),
//! Lease-based leader election ([`leader`]), the condition arithmetic that keeps
//! `lastTransitionTime` stable ([`conditions`]), server-side-apply helpers ([`ssa`]) the
//! duration syntax of every flag ([`duration`]) and the one atomic file write ([`fs`]).
//! Depends on nothing of ours.

pub mod api_errors;
pub mod conditions;
pub mod duration;
mod error;
pub mod fs;
pub mod leader;
pub mod lifecycle;
pub mod metrics;
pub mod server;
pub mod ssa;
pub mod telemetry;

pub use error::Error;
