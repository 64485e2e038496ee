//! Cross-process scenarios: real processes on loopback, the real
//! sglang-router, pd-sim standing in for the GPU engines. One test binary
//! (ripgrep style); one module per area.

// Black-box tests of real processes: they time them with the wall clock
// (clippy.toml bans it elsewhere).
#![allow(clippy::disallowed_methods)]

mod co_restart;
mod deploy;
mod drain;
mod faults;
mod gate;
#[cfg(feature = "etcd")]
mod ha;
mod harness;
mod incidents;
mod journal_full;
mod layers;
mod metrics;
mod output;
mod package;
mod partition;
mod repair;
mod soak;
mod suite;
mod verdicts;
mod vllm;
mod watch;
mod wedges;
