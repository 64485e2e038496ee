//! What both ends of pdwarden's links must agree on, in one small crate so
//! the orchestrator does not build the agent (and with it NVML and sysinfo)
//! to get it (issue 14), and the CLI does not link the orchestrator daemon
//! to get the operator side:
//!
//! - [`tls`]: the `[tls]` file triple, the client side of mutual TLS, the
//!   rule that ties an agent's certificate to its host, and the check that a
//!   CA file holds a certificate.
//! - [`redact`]: secrets in unit environments are never shown.
//! - [`certs`]: the CA and certificates `pdwarden certs` issues; here because
//!   both the CLI and the orchestrator's tests issue them, and the CLI must
//!   not link the daemon.
//! - [`operators`]: the `[[operator]]` config, roles and tokens; here because
//!   the CLI mints them and the orchestrator checks them, and the CLI must not
//!   link the daemon.

pub mod certs;
pub mod operators;
pub mod redact;
pub mod shapes;
pub mod terminal;
pub mod tls;
