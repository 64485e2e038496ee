//! Integration tests of the orchestrator daemon, built as one binary (one
//! module per area). Tests with an agent and the CLI are the CLI package's
//! (`cli/tests/`); the whole local stack's are `pdwarden-stack`'s.

mod service_manager;
mod startup;
