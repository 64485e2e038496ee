//! The change gate's records: its configuration and the CLI's change
//! arguments ([`config`]), the change asked for ([`change`]), the
//! benchmark's figures ([`measure`]), the greedy answer after the change
//! against the one before it ([`output`]) and the report a person reads
//! ([`report`]). The orchestrator's `ops::gate` runs the gate over them.

pub mod change;
pub mod config;
pub mod measure;
pub mod output;
pub mod report;
