//! pdwarden's orchestrator: it knows the PD pairs, runs ordered co-restarts
//! gated on real generation readiness, judges them, and journals everything.
//!
//! Layout — the design in three folders, over the ground floor:
//! - `pdwarden_model` (its own crate, which the client and the CLI import
//!   without linking this one): the records and views the layers share,
//!   and the pure judgements (verdict, suite, wedge and breaker, findings,
//!   stats, the gate's statistics and live check): evidence in, decision
//!   out, `now` handed in.
//! - [`ops`]: the operation runtime (co-restart, gate, watch and recovery,
//!   the journal, the report): journaled, resumable workflows.
//! - [`edge`]: where the orchestrator meets agents, operators and the clock
//!   (gRPC server, fleet, auth, TLS, certificates, readiness endpoint).
//! - [`config`]: the static TOML (pairs, budgets, timeouts), read by all three.
//!
//! The binaries `pdwarden-orchestrator` (the daemon) and `pdwarden` (the CLI)
//! are thin wrappers over this library.

pub mod config;
pub mod edge;
pub mod ops;
