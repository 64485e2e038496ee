//! pdwarden's orchestrator: it knows the PD pairs, runs ordered co-restarts
//! gated on real generation readiness, judges them, and journals everything.
//!
//! Layout:
//! - [`config`]: the static TOML (pairs, budgets, timeouts).
//! - [`fleet`]: connected agents, their facts, command delivery (`AgentLink`).
//! - [`hoststate`]: each host's latest GPU and host report and GPU events;
//!   [`findings`]: pure judgement of them (foreign processes, dead units'
//!   memory, Xid/ECC, idle GPU with a queue).
//! - [`corestart`]: the co-restart state machine (evidence gathering).
//! - [`verdict`]: pure judgement of that evidence, unit-tested with the
//!   incidents' numbers.
//! - [`suite`]: pure judgement of the post-restart verification suite.
//! - [`stats`]: latency summaries that check for bimodality first.
//! - [`journal`]: the SQLite journal of operations.
//! - [`report`]: the operation report (`--json`) and its terminal rendering.
//! - [`tls`]: server-side mutual TLS and the agent certificate identity;
//!   [`auth`]: operator tokens and roles at the gRPC edge; [`certs`]: the CA,
//!   server and agent certificates `pdwarden certs` issues.
//! - [`server`]: the gRPC edge and `serve(listener, config, shutdown)`.
//! - [`wedge`]: pure wedge judgement and the recovery circuit breaker.
//! - [`watcher`]: the continuous per-pair watch and automatic recovery.
//! - [`ready`]: the plain-HTTP readiness endpoint for gateways.
//! - [`gate`]: the change gate (knob flip → measured keep or rollback), with
//!   its pure statistics ([`gate::judge`]) and live-process check ([`gate::live`]).
//!
//! The binaries `pdwarden-orchestrator` (the daemon) and `pdwarden` (the CLI)
//! are thin wrappers over this library.

pub mod auth;
pub mod certs;
pub mod config;
pub mod corestart;
#[cfg(test)]
pub(crate) mod fake_agent;
pub mod findings;
pub mod fleet;
pub mod gate;
pub mod hoststate;
pub mod journal;
pub mod ports;
pub mod ready;
pub mod report;
pub mod server;
pub mod stats;
pub mod suite;
pub mod tls;
pub mod verdict;
pub mod watcher;
pub mod wedge;
