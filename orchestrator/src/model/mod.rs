//! The ground floor: records and views that several layers share (the
//! judges read them, the edge fills and serves them, the CLI renders them).
//! Data and their pure accessors only; nothing here imports another module
//! of the crate, so every layer can import it without running back up.
//!
//! - [`fields`]: the bounds on request ids and pair, host and unit names
//!   (the config, the CLI and the server share them).
//! - [`host`]: each host's GPU and host report, as `status` carries it.

pub mod fields;
pub mod host;
