//! pdwarden's local stack as a library: typed configs for an orchestrator
//! and an agent, the processes started from them, `pdwarden demo` and its
//! incident drills as functions.
//!
//! The `pdwarden-stack` binary (which `pdwarden demo` runs), the
//! benchmark's co-restart section and the cross-process scenario tests
//! all call it: the tests drive the stack in-process (and still reach the
//! orchestrator, the agent, the engines and the real sglang-router as the
//! real processes they are), instead of parsing a CLI's stdout.
//!
//! Layout:
//! - [`plan`]: the stack's configuration as typed values, written and read
//!   back through the loaders ([`plan::write_configs`]).
//! - [`process`]: where the binaries are; a child stopped by PID when dropped.
//! - [`stack`]: a running stack ([`stack::Stack`]).
//! - [`cli`]: the `pdwarden-stack` binary's `demo` and `soak` (which
//!   `pdwarden demo` and `pdwarden soak` run): signals, `--hold`, printing.
//! - [`demo`]: `pdwarden demo` ([`demo::start`], [`demo::Demo::stop`]).
//! - [`drill`]: `pdwarden demo --incident NAME`.
//! - [`rolling`]: `pdwarden demo --shared-router`: two pairs behind one
//!   serving router, one restarted under client traffic.
//! - [`soak`]: `pdwarden soak`: operations and random kills in a loop, the invariants checked.
//! - [`vllm`]: the stack on a real vLLM pair behind vllm-router (`--engine vllm`).
//! - [`ha`]: the stack with a highly available control plane: a real etcd
//!   cluster and three orchestrators (issue 19).

// The whole crate is an edge: it starts real processes and times them with
// the wall clock (clippy.toml bans that elsewhere).
#![allow(clippy::disallowed_methods)]

pub mod args;
pub mod cli;
pub mod demo;
pub mod drill;
pub mod ha;
pub mod plan;
pub mod process;
pub mod rolling;
pub mod soak;
pub mod stack;
pub mod vllm;

pub use demo::{Demo, DemoArgs, DemoOutcome};
pub use stack::Stack;
