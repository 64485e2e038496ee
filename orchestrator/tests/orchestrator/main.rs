//! Integration tests of the orchestrator, built as one binary (one module per
//! area). Everything runs for real on loopback: the orchestrator and agents
//! in-process, the `pdwarden` CLI as a process. Tests wait on events with
//! deadlines, never on fixed sleeps, and stop every process they start by PID.

mod gpu_status;
mod security;
mod startup;
