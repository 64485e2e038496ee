//! The wire contract of pdwarden, package `pdwarden.v1`.
//!
//! Agents dial out to the orchestrator and keep one bidirectional stream
//! (`AgentLink.Attach`): registration, unit phase events and probe results go
//! up; start/stop/restart/probe commands go down. The CLI talks to the
//! orchestrator through `Control`. Versioned in the package name so a v2 can be
//! served side by side.
#![allow(clippy::all)]

pub mod v1 {
    tonic::include_proto!("pdwarden.v1");
}

pub mod exposition;
pub mod limits;

/// The gRPC metadata key a follower's refusal carries the leader's URL in
/// (the orchestrator sets it; the client follows it).
pub const LEADER_METADATA: &str = "pdwarden-leader";
