//! The edges: where the orchestrator meets the network, the clock and the
//! operators. Nothing here decides anything; it carries facts in and
//! commands out.
//!
//! - [`server`]: the gRPC `Control` service and `serve(listener, config, shutdown)`.
//! - [`fleet`]: the connected agents, their facts, command delivery
//!   (`AgentLink`), and the one "send and await" every workflow uses.
//! - [`hoststate`]: each host's latest GPU and host report.
//! - [`auth`]: operator tokens and roles; [`tls`]: server-side mutual TLS and
//!   the agent certificate identity. (The CA and certificates `pdwarden
//!   certs` issues, and the operator config, are `pdwarden_security`'s.)
//! - [`ready`]: the plain-HTTP readiness endpoint for gateways (and `/metrics`).
//! - [`service_manager`]: systemd readiness and watchdog (`sd-notify`).
//! - [`ports`]: choosing loopback ports for a local stack.
//! - [`leadership`]: whether this orchestrator acts (sole, leader, follower)
//!   and its fencing token; `election` (feature `etcd`): the lease-based
//!   election on etcd that sets it (issue 19).

pub mod auth;
#[cfg(feature = "etcd")]
pub mod election;
pub mod fleet;
pub mod hoststate;
pub mod leadership;
pub mod ports;
pub mod ready;
pub mod server;
pub mod service_manager;
pub mod tls;
