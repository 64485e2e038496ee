//! pd-sim: an SGLang-like prefill/decode engine simulator, the world pdwarden is
//! tested against.
//!
//! pdwarden exists because real engines fail in ways their health checks do not see
//! (`../shared/INCIDENTS.md`). pd-sim reproduces those ways on a laptop, on loopback,
//! scaled in time: start-up phases (refused → 503 → 200), SGLang's health handler,
//! a real prefill→decode KV transfer path, and the incidents' faults (latency
//! scripts, a leaking serial slot, minted sessions, stale, degraded, slow and stalled
//! KV links, an environment knob). It follows the SGLang engine profile of
//! `pdwarden-engines` (`SGLANG`): its metric names, which counters move during work
//! and which only when a request finishes, and health through the scheduler. The real `sglang-router` routes through it as it would
//! through SGLang. It knows nothing about pdwarden's verdicts (DESIGN.md §7).
//!
//! Surface (details in [`http`]):
//! - SGLang: `GET /health`, `/health_generate` (503 until ready, then a one-token
//!   pass when the running batch is empty, the next batch result when it is not; 503 if
//!   no scheduler output within the scaled 20 s), `/v1/models`,
//!   `/server_info`, `/get_server_info`, `/model_info`, `/get_model_info`, `/metrics`;
//!   `POST /v1/chat/completions` (JSON or SSE), `POST /generate`.
//! - pd-sim: `GET /sim/stats` ([`stats::StatsSnapshot`]: counts, `busy_ms_*` in
//!   simulated ms, `sessions_*`, and `start_mono_ms`/`listen_mono_ms`/`ready_mono_ms`
//!   on CLOCK_MONOTONIC); `GET|POST /sim/fault` ([`config::FaultPatch`]: any of the
//!   fault/timing flags by name, e.g. `{"latency_script": "17900,hang", "serial": true}`;
//!   answers `{"settings": …, "latency_script_remaining": […]}`).
//! - A prefill's bootstrap port: the KV link ([`bootstrap`]).
//!
//! Layout:
//! - [`config`]: flags → validated [`config::Config`]; live-changeable [`config::Settings`].
//! - [`engine`]: the pure timing model (plans, cold start, script, sessions).
//! - [`greedy`]: the pure output model: greedy chat answers with logprobs, a function
//!   of the prompt and the `--weights`, and the ways they go wrong (a corrupted KV
//!   read, KV reuse under load, a pair on different weights, near-ties).
//! - [`clock`]: simulated↔real time and the host's monotonic clock.
//! - [`http`]: SGLang's HTTP surface and pd-sim's `/sim/*` endpoints.
//! - [`bootstrap`]: the prefill→decode KV transfer link.
//! - [`stats`]: `/sim/stats`, the ground truth.
//! - [`server`]: phases, sockets, [`spawn`]/[`run`].
//! - [`faultproxy`]: `pd-faultproxy`, a proxy that injects failures in front of any
//!   engine (pd-sim, SGLang, vLLM), for the faults no simulator author had in mind.

pub mod bootstrap;
pub mod clock;
pub mod config;
pub mod engine;
pub mod faultproxy;
pub mod greedy;
pub mod http;
pub mod server;
pub mod state;
pub mod stats;
pub mod watch_cases;

#[cfg(test)]
mod sim_tests;

pub use config::{Args, Config, Role};
pub use server::{Bound, SimError, SimHandle, run, spawn};
