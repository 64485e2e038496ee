//! pdwarden's ground floor: the records and views every layer shares, and
//! the pure judges over them. Nothing here does I/O or reads a clock (`now`
//! is handed in), so the orchestrator (which fills and journals these
//! records), the client and the CLI (which read them back typed and render
//! them) all import this crate, and the CLI does not link the daemon.
//!
//! Layers, downward only:
//! - views: [`report`] (an operation's report, the drain's and rejoin's
//!   records, a child operation), [`status`] and [`watch`] (what `status`
//!   carries);
//! - [`judge`]: the pure judgements (verdict, suite, wedge and breaker,
//!   findings, stats, the gate's statistics and live check): evidence in,
//!   decision out;
//! - inputs: [`fields`] (the bounds on request ids and names), [`host`]
//!   (each host's GPU and host report), [`forensics`] (what a wedged pair
//!   looked like before its kill: the capture and its summary).

pub mod fields;
pub mod forensics;
pub mod gate;
pub mod host;
pub mod judge;
pub mod render;
pub mod report;
pub mod status;
pub mod watch;
