//! Integration tests of the agent, built as one binary (one module per area).
//!
//! Everything runs for real on loopback: child processes, an in-test HTTP
//! engine (`util::FakeEngine`) and an in-test orchestrator
//! (`util::FakeOrchestrator`). Tests wait on events with deadlines, never on
//! fixed sleeps, and kill every process they start by PID.

mod binary;
mod evidence;
mod gpu;
mod link;
mod readiness_http;
mod service_manager;
mod util;
