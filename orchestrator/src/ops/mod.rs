//! The operation runtime: journaled, resumable workflows that send commands
//! to agents and wait for their facts. Each step is journaled before its
//! commands go out; a new orchestrator resumes an interrupted operation from
//! the journal and the agents' facts, adopting the commands already sent by
//! their ids (DESIGN.md 4).
//!
//! - [`corestart`]: the ordered co-restart (and a verification), its resume.
//! - [`gate`]: the change gate (apply, co-restart, verify live, measure,
//!   keep or roll back), its resume.
//! - [`watcher`]: the continuous per-pair watch and automatic recovery.
//! - [`journal`]: the SQLite journal of operations.
//! - [`report`]: the operation report (`--json`) and its terminal rendering.
//! - `fake_agent` (tests only): an in-memory agent the drivers' unit tests
//!   run against at paused time.

pub mod corestart;
#[cfg(test)]
pub(crate) mod fake_agent;
pub mod gate;
pub mod journal;
pub mod report;
pub mod watcher;
