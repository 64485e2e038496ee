//! The ground floor: records and views that several layers share (the
//! judges read them, the edge fills and serves them, the CLI renders them).
//! Data and their pure accessors only; nothing here imports another module
//! of the crate, so every layer can import it without running back up.

pub mod host;
