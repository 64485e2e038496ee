//! The CLI against a real orchestrator and agent: both in-process on
//! loopback, the `pdwarden` CLI as a process, as an operator runs it. Tests
//! wait on events with deadlines, never on fixed sleeps, and stop every
//! process they start by PID. One binary, one module per area.

mod completions;
mod gpu_status;
mod lifecycle;
mod security;
mod stack;
