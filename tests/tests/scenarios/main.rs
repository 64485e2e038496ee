//! Cross-process scenarios: real processes on loopback, the real
//! sglang-router, pd-sim standing in for the GPU engines. One test binary
//! (ripgrep style); one module per area.

mod co_restart;
mod faults;
mod gate;
mod harness;
mod incidents;
mod partition;
mod suite;
mod verdicts;
mod watch;
mod wedges;
