//! pd-sim: an SGLang-like prefill/decode engine simulator, the world pdwarden is
//! tested against.
//!
//! pdwarden exists because real engines fail in ways their health checks do not see
//! (`../shared/INCIDENTS.md`). pd-sim reproduces those ways on a laptop, on loopback,
//! scaled in time: start-up phases (refused → 503 → 200), SGLang's health handler,
//! a real prefill→decode KV transfer path, and the incidents' faults (latency
//! scripts, a leaking serial slot, minted sessions, stale and degraded bootstraps,
//! an environment knob). The real `sglang-router` routes through it as it would
//! through SGLang. It knows nothing about pdwarden's verdicts (DESIGN.md §7).
//!
//! Layout:
//! - [`config`]: flags → validated [`config::Config`]; live-changeable [`config::Settings`].
//! - [`engine`]: the pure timing model (plans, cold start, script, sessions).
//! - [`clock`]: simulated↔real time and the host's monotonic clock.
//! - [`http`]: SGLang's HTTP surface and pd-sim's `/sim/*` endpoints.
//! - [`bootstrap`]: the prefill→decode KV transfer link.
//! - [`stats`]: `/sim/stats`, the ground truth.
//! - [`server`]: phases, sockets, [`spawn`]/[`run`].

pub mod bootstrap;
pub mod clock;
pub mod config;
pub mod engine;
pub mod http;
pub mod server;
pub mod stats;

#[cfg(test)]
mod sim_tests;

pub use config::{Args, Config, Role};
pub use server::{Bound, SimError, SimHandle, run, spawn};
