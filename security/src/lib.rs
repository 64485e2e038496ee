//! What both ends of pdwarden's links must agree on, in one small crate so
//! the orchestrator does not build the agent (and with it NVML and sysinfo)
//! to get it (issue 14):
//!
//! - [`tls`]: the `[tls]` file triple, the client side of mutual TLS, and the
//!   rule that ties an agent's certificate to its host.
//! - [`redact`]: secrets in unit environments are never shown.

pub mod redact;
pub mod tls;
