//! Ground truth: what the simulated engine did, as `/sim/stats` reports it.
//!
//! pd-sim is the world pdwarden is tested against (DESIGN.md §7), so its own counts
//! are what benchmarks and drills compare pdwarden's view with: how many requests
//! were probes, how much engine time probes used, how many sessions they minted,
//! and when each start-up phase really happened on the host's monotonic clock.
//!
//! Engine time (`busy_ms_*`) is in *simulated* ms and is charged when a request
//! starts computing, at the cost of its plan (a hang is charged nothing), so the
//! numbers do not depend on `--time-scale` or on scheduling jitter.

use std::sync::Mutex;

use serde::Serialize;

use crate::config::{Role, Settings};

/// Monotonic counters and gauges, updated by the HTTP layer.
///
/// The `/sim/stats` fields keep pd-sim's own, ground-truth meanings (`requests_total`
/// counts arrivals, `prompt_tokens_total` admissions). What `/metrics` exposes follows
/// SGLang instead, from the `finished_*` and `realtime_*` fields (see
/// [`crate::http`]'s `metrics`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Counters {
    /// Client generation requests (chat completions and /generate), probes included,
    /// counted when they arrive.
    pub requests_total: u64,
    /// Of those, probes (`X-Request-Id: pdwarden-probe-…` or `X-Pdwarden-Probe: 1`).
    pub probe_requests: u64,
    pub chat_requests: u64,
    pub generate_requests: u64,
    pub stream_requests: u64,
    /// Generations answered in full.
    pub completed: u64,
    /// Generations answered with an error (e.g. a failed KV transfer).
    pub failed: u64,
    /// Generations whose client went away before the answer was complete.
    pub disconnected: u64,
    /// Serial slots leaked by a disconnect before the first token.
    pub leaked_slots: u64,
    /// Engine time charged to every client generation, simulated ms.
    pub busy_ms_total: f64,
    /// Engine time charged to probes, simulated ms.
    pub busy_ms_probe: f64,
    /// Prompt tokens of the client generations admitted (counted at admission).
    pub prompt_tokens_total: u64,
    /// Output tokens of the generations answered in full (counted when they complete).
    pub generation_tokens_total: u64,
    /// Requests that finished in SGLang's sense — answered in full, failed, or aborted
    /// because the client went away (not a leaked one, which the scheduler still runs) —
    /// and their prompt and output tokens: what SGLang's
    /// `TokenizerMetricsCollector.observe_one_finished_request`
    /// (`python/sglang/srt/metrics/collector.py`) adds to `sglang:num_requests_total`,
    /// `sglang:prompt_tokens_total` and `sglang:generation_tokens_total`, and only then.
    pub finished_requests_total: u64,
    pub finished_prompt_tokens_total: u64,
    pub finished_generation_tokens_total: u64,
    /// `sglang:realtime_tokens_total` by mode: prompt tokens computed, prompt tokens
    /// taken from the prefix cache (both per prefill chunk) and output tokens (per
    /// decode step, reported at least once a simulated second), counted while the work
    /// runs.
    pub realtime_prefill_compute_tokens: u64,
    pub realtime_prefill_cache_tokens: u64,
    pub realtime_decode_tokens: u64,
    /// `/health` + `/health_generate` calls answered after start-up, and their outcomes.
    pub health_requests: u64,
    pub health_ok: u64,
    pub health_failed: u64,
    /// Of the health checks, those that found requests in the running batch and so ran
    /// no pass of their own: they waited for the scheduler's next batch result.
    pub health_waited_on_batch: u64,
    /// Decode: KV transfers completed / failed (stale identity, unreachable prefill,
    /// `--kv-fail-every`).
    pub kv_transfers_ok: u64,
    pub kv_transfers_failed: u64,
    /// Decode: of the failed transfers, those injected by `--kv-fail-every`.
    pub kv_failures_injected: u64,
    /// Decode: of the failed transfers, those that failed at the bootstrap handshake
    /// (the prefill's bootstrap unreachable or refusing): `sglang:num_bootstrap_failed_reqs_total`
    /// rather than `num_transfer_failed_reqs_total`.
    pub bootstrap_failed: u64,
    /// Decode: routed requests whose KV pull took `--kv-transfer-ms` extra.
    pub kv_transfers_delayed: u64,
    /// Decode: routed requests admitted under `--kv-stall`, whose KV never arrives.
    pub kv_stalled_requests: u64,
    /// Generations whose modelled durations carried the `--relapse-slowdown`.
    pub relapsed_requests: u64,
    /// Prefill: KV handed to decodes, and degraded bootstraps handed out.
    pub kv_served: u64,
    pub degraded_bootstraps: u64,
    /// Prefill: rooms released because their transfer failed (the decode reported a
    /// failure, met a stale identity, or went away mid-transfer).
    pub kv_rooms_failed: u64,
    /// Gauge, prefill: rooms whose KV is computed and not yet taken by their decode
    /// (SGLang's `disagg_prefill_inflight_queue`).
    pub prefill_inflight: u64,
    /// Greedy chat answers computed by the model ([`crate::greedy`]: temperature 0 or
    /// absent), and of those: corrupted from `--corrupt-from-position` by
    /// `--kv-corruption` or `--kv-reuse-under-load`, and answered from a prefill's KV
    /// computed with other weights than this decode's.
    pub greedy_answers: u64,
    pub corrupted_answers: u64,
    pub mixed_weights_answers: u64,
    /// Gauge: generations in the running batch (computing, or leaked/frozen/hung there).
    /// A decode part joins it only once its KV has arrived.
    pub running: u64,
    /// Gauge: generations waiting for the serial slot or a `--max-running` slot.
    pub queued: u64,
    /// Gauge, decode: routed generations waiting for their KV (SGLang's
    /// `DecodeTransferQueue`), not in the running batch.
    pub transfer_waiting: u64,
    /// Gauge, decode: routed generations in their bootstrap handshake (SGLang's
    /// `DecodePreallocQueue`).
    pub decode_prealloc: u64,
}

/// Thread-safe holder of [`Counters`].
#[derive(Debug, Default)]
pub struct Stats {
    inner: Mutex<Counters>,
}

impl Stats {
    /// Runs `f` on the counters.
    pub fn update<R>(&self, f: impl FnOnce(&mut Counters) -> R) -> R {
        let mut c = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut c)
    }

    pub fn snapshot(&self) -> Counters {
        self.update(|c| c.clone())
    }
}

/// The start-up phase an engine is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Started, port not bound yet (connections refused).
    Starting,
    /// Port open; `/v1/models` 200, health 503.
    Listening,
    /// Health runs its forward pass; generation served.
    Ready,
    /// Shutting down.
    Stopping,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Listening => "listening",
            Phase::Ready => "ready",
            Phase::Stopping => "stopping",
        }
    }
}

/// The body of `GET /sim/stats`.
#[derive(Clone, Debug, Serialize)]
pub struct StatsSnapshot {
    pub role: Role,
    pub model: String,
    /// Random per process start; changes on every restart.
    pub instance_id: String,
    pub pid: u32,
    pub phase: Phase,
    pub http_addr: Option<String>,
    pub bootstrap_addr: Option<String>,
    pub time_scale: f64,
    /// CLOCK_MONOTONIC ms when the engine started, bound its port, became ready.
    pub start_mono_ms: f64,
    pub listen_mono_ms: Option<f64>,
    pub ready_mono_ms: Option<f64>,
    /// Which start of the unit this process is, counted in `--start-count-file` (1 = first).
    pub start_number: Option<u64>,
    pub sessions_live: u64,
    pub sessions_minted: u64,
    #[serde(flatten)]
    pub counters: Counters,
    pub latency_script_remaining: Vec<crate::config::LatencyStep>,
    pub settings: Settings,
}
