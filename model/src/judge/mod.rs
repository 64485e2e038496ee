//! The pure judgements: evidence in, a decision out, `now` handed in and no
//! I/O. Everything pdwarden tells an operator ("healthy", "wedged", "keep
//! the change") is decided here, so it is unit-tested with the incidents'
//! numbers and cannot depend on which process or clock gathered the
//! evidence.
//!
//! - [`evidence`]: every layer's evidence of an operation (client, router,
//!   engines, agents) and the one `conclude` that makes it a verdict.
//! - [`verdict`]: the start-up and probe-series rules `conclude` applies.
//! - [`suite`]: the post-restart verification suite's steps.
//! - [`wedge`]: wedge detection from engine samples, and the recovery
//!   circuit breaker.
//! - [`findings`]: GPU and host findings (foreign processes, Xid/ECC, …).
//! - [`probe`]: what one end-to-end probe found, in one vocabulary;
//!   [`answer`]: what one answer says against itself (the client layer).
//! - [`paths`]: which engine of an xPyD pool is sick, from the matrix of
//!   every prefill → decode path (issue 37).
//! - [`stacks`]: what a wedged unit's captured stacks say, in one line
//!   (issue 35: evidence before the kill).
//! - [`stats`]: latency summaries that check for bimodality first.
//! - [`golden`]: golden output — a greedy answer against its reference
//!   (noise at a near-tie, wrong output where the reference was sure).
//! - [`gate`]: the change gate's statistics (cluster bootstrap, margins,
//!   sequential looks); [`live`]: whether a change is live in `/proc`.

pub mod answer;
pub mod evidence;
pub mod findings;
pub mod gate;
pub mod golden;
pub mod live;
pub mod paths;
pub mod probe;
pub mod stacks;
pub mod stats;
pub mod suite;
pub mod verdict;
pub mod wedge;
