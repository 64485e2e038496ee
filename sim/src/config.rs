//! Command-line flags, validated into the settings a simulated engine runs with.
//!
//! Raw flags ([`Args`], parsed by clap) are turned into a [`Config`] in one place so
//! that the rest of the crate never sees an unvalidated value. The config is split in
//! two: what is fixed for the life of the process (role, addresses, start-up phases,
//! time scale) and [`Settings`], the timing and fault knobs that `POST /sim/fault` may
//! change while the engine runs ([`FaultPatch`] is that request's body, using the
//! flags' own names). A few flags are start-only on purpose: `--max-running` sizes a
//! semaphore at start, `--cold-first-ms-by-start`/`--start-count-file` describe
//! *which start* this process is, which no live patch can change, and
//! `--chunked-prefill-size` is a server argument in SGLang too, and
//! `--lazy-failure-counters` chooses how `/metrics` is shaped, which SGLang fixes at start
//! (how `prometheus_client` exposes a labelled counter; see that flag), and
//! `--weights-file` is read once at start, as an engine loads its weights once.
//!
//! Every duration here is in *simulated* milliseconds; [`crate::clock::Scale`] turns
//! them into real time (`--time-scale 0.01` runs a 56 s start-up in 0.56 s).

use std::collections::VecDeque;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use clap::{Parser, ValueEnum};
use serde::{Deserialize, Serialize};

/// SGLang's default `--disaggregation-bootstrap-port`.
pub const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;
/// SGLang's `SGLANG_HEALTH_CHECK_TIMEOUT` default (seconds → ms).
pub const DEFAULT_HEALTH_TIMEOUT_MS: f64 = 20_000.0;

/// How the KV transfer link keeps state about its peers (issue 37: what must
/// restart with a restarted engine).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvTransfer {
    /// SGLang's bootstrap (`python/sglang/srt/disaggregation/`): a decode
    /// caches each prefill's identity by its bootstrap address (stale after
    /// that prefill restarts: SGLang issue 36029), and a prefill remembers
    /// the decode instances it served (a decode restarted alone gets a
    /// degraded bootstrap: INCIDENTS row 1).
    #[default]
    Sglang,
    /// vLLM's NixlConnector (`vllm/distributed/kv_transfer/kv_connector/v1/
    /// nixl_connector.py`): each request carries the prefill's
    /// `remote_engine_id` (new at every start) and the decode handshakes
    /// with an engine id it has not met (`_remote_agents` is keyed by it),
    /// so a restarted prefill is met afresh; the decode reads the KV, and
    /// the prefill keeps no handshake state about decodes.
    Nixl,
    /// A link that caches the prefill's identity by its address but keeps
    /// no decode state on the prefill: vLLM's MoRIIO connector
    /// (`vllm/distributed/kv_transfer/kv_connector/v1/moriio/moriio_connector.py`
    /// keys `_remote_agents` by `host:handshake_port`). A restarted prefill
    /// leaves every decode that met it holding its old identity until that
    /// decode restarts; a decode restarts alone.
    Address,
}

/// Which half of a prefill/decode pair this engine plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Prefill,
    Decode,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One entry of `--latency-script`: the total latency of one client generation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LatencyStep {
    /// Answer after this many simulated milliseconds.
    Ms(f64),
    /// Never answer.
    Hang,
}

impl FromStr for LatencyStep {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("hang") {
            return Ok(LatencyStep::Hang);
        }
        match t.parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 => Ok(LatencyStep::Ms(v)),
            _ => Err(ConfigError::LatencyScript(s.to_string())),
        }
    }
}

impl Serialize for LatencyStep {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            LatencyStep::Ms(v) => s.serialize_f64(*v),
            LatencyStep::Hang => s.serialize_str("hang"),
        }
    }
}

/// Parses `"17900,106400,hang"`; an empty string is an empty script.
pub fn parse_latency_script(list: &str) -> Result<VecDeque<LatencyStep>, ConfigError> {
    list.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(LatencyStep::from_str)
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--latency-script entry {0:?} is neither a non-negative number of ms nor `hang`")]
    LatencyScript(String),
    #[error("--sglang-version {0:?} is not a release number such as 0.5.9 or 0.4.6.post4")]
    SglangVersion(String),
    #[error("--{flag} must be a finite number >= {min}, got {value}")]
    OutOfRange { flag: &'static str, min: f64, value: f64 },
    #[error("--knob-env, --knob-value and --knob-slowdown go together (missing {0})")]
    KnobIncomplete(&'static str),
    #[error("--relapse-after and --relapse-slowdown go together (missing {0})")]
    RelapseIncomplete(&'static str),
    #[error("--cold-first-ms-by-start needs --start-count-file (missing {0})")]
    ColdByStartIncomplete(&'static str),
    #[error("--cold-first-ms-by-start entry {0:?} is not a non-negative number of ms")]
    ColdByStartEntry(String),
    #[error("--cold-first-ms-by-start needs at least one entry")]
    ColdByStartEmpty,
    #[error("{0} applies to a decode only (this engine is --role prefill)")]
    DecodeOnly(&'static str),
    #[error("{0} applies to a prefill only (this engine is --role decode)")]
    PrefillOnly(&'static str),
    #[error("--near-tie-positions entry {0:?} is not a token position (0, 1, 2, …)")]
    Position(String),
    #[error("--weights must name the weights (got an empty string)")]
    EmptyWeights,
}

/// `--cold-first-ms-by-start LIST` with `--start-count-file PATH`: the cold penalty
/// of this process depends on how many times the unit has started before.
#[derive(Clone, Debug, PartialEq)]
pub struct ColdByStart {
    /// Entry k-1 is the cold penalty of the k-th start; the last entry repeats.
    pub cold_first_ms: Vec<f64>,
    /// Where starts are counted (read, add one, write back at each start).
    pub count_file: PathBuf,
}

impl ColdByStart {
    /// The cold penalty of the `start`-th start (1-based; 0 is read as 1).
    pub fn for_start(&self, start: u64) -> f64 {
        let i = (start.max(1) - 1).min(self.cold_first_ms.len() as u64 - 1);
        self.cold_first_ms[i as usize]
    }
}

/// Parses `"90000,4000,0"`; empty entries are ignored, an empty list is an error.
pub fn parse_cold_by_start(list: &str) -> Result<Vec<f64>, ConfigError> {
    let v = list
        .split(',')
        .filter(|e| !e.trim().is_empty())
        .map(|e| match e.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
            _ => Err(ConfigError::ColdByStartEntry(e.to_string())),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if v.is_empty() {
        return Err(ConfigError::ColdByStartEmpty);
    }
    Ok(v)
}

/// pd-sim's flags, as typed.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "pd-sim",
    about = "An SGLang-like prefill/decode engine simulator for testing pdwarden"
)]
pub struct Args {
    /// prefill or decode.
    #[arg(long, value_enum)]
    pub role: Role,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// HTTP port (0 picks a free one).
    #[arg(long)]
    pub port: u16,
    /// Prefill only: port of the KV bootstrap endpoint (SGLang's default 8998; 0 picks one).
    #[arg(long)]
    pub bootstrap_port: Option<u16>,
    /// What the KV link remembers about peers: `sglang` (identities cached by
    /// address, decode instances remembered) or `nixl` (vLLM's NixlConnector:
    /// met afresh at every restart). See [`KvTransfer`].
    #[arg(long, value_enum, default_value = "sglang")]
    pub kv_transfer: KvTransfer,
    /// Model name reported by /v1/models, /model_info and responses.
    #[arg(long, default_value = "pd-sim/sim-model")]
    pub model: String,
    /// The port stays closed (connection refused) until this long after start.
    #[arg(long, default_value_t = 0.0)]
    pub listen_after_ms: f64,
    /// /health and /health_generate answer 503 until this long after start.
    #[arg(long, default_value_t = 0.0)]
    pub ready_after_ms: f64,
    /// Fixed cost of a forward pass that starts a request (and of the health check's pass).
    #[arg(long, default_value_t = 40.0)]
    pub ttft_ms: f64,
    /// Cost of each generated token.
    #[arg(long, default_value_t = 8.0)]
    pub tpot_ms: f64,
    /// Prefill speed in prompt tokens per second (0 = prompt length costs nothing).
    #[arg(long, default_value_t = 20_000.0)]
    pub prefill_tok_per_s: f64,
    /// Extra latency of the first client generation after start (cold start).
    #[arg(long, default_value_t = 0.0)]
    pub cold_first_ms: f64,
    /// Multiplies every duration (0.01 = 100x faster than real time).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// SGLang's SGLANG_HEALTH_CHECK_TIMEOUT, in ms.
    #[arg(long, default_value_t = DEFAULT_HEALTH_TIMEOUT_MS)]
    pub health_timeout_ms: f64,
    /// The SGLang release imitated: `/metrics` exposes only what that release
    /// exposes (each metric's `since` in `pdwarden_engines::SGLANG`: no
    /// `realtime_tokens_total` before 0.5.7, no PD inflight gauge before
    /// 0.5.1.post2), and before 0.4.10.post2 `/health` answers 200 without
    /// generating. Reported by `/server_info`.
    #[arg(long, default_value = "0.5.9")]
    pub sglang_version: String,
    /// SGLang's `SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0` (since v0.5.5.post3,
    /// sgl-project/sglang#13320): `/health` answers 200 at once without generating;
    /// `/health_generate` still generates. The environment variable itself is read too.
    #[arg(long)]
    pub no_health_endpoint_generation: bool,

    /// Total latencies (ms, or `hang`) of successive client generations, e.g. `17900,106400,hang`;
    /// after the script, the model. `hang,` is a generation that hangs once after start and
    /// then works: the first client generation never answers, later ones follow the model
    /// (INCIDENTS row 2, seed 003: a probe that never finished among ones that did). A
    /// routed decode part spends its scripted time, or its hang, waiting for its KV (not in
    /// the running batch: health stays 200); a request served whole spends it in the
    /// running batch (a hang there makes health 503).
    #[arg(long)]
    pub latency_script: Option<String>,
    /// Run one client generation at a time: a scheduler that stops batching. Throughput
    /// collapses to one request's worth (each waits for the ones before it) while health,
    /// which does not queue for the slot, stays 200 as long as the running request
    /// produces batch results (a prefill chunk over 20 s makes it 503). The real-engine
    /// analogue is SGLang's `--max-running-requests 1` (`python/sglang/srt/server_args.py`),
    /// which caps the running batch the scheduler builds.
    #[arg(long)]
    pub serial: bool,
    /// With --serial: a client that disconnects before its first token leaks the slot forever.
    /// The leaked request stays in the running batch and produces nothing, so health (which
    /// then waits for a batch result) answers 503 after its timeout.
    #[arg(long)]
    pub leak_slot_on_disconnect: bool,
    /// A prompt not sharing this many leading tokens with a live session mints a session (0 = off).
    #[arg(long, default_value_t = 0)]
    pub session_prefix_tokens: u64,
    /// A session with no request for this long expires.
    #[arg(long, default_value_t = 3_600_000.0)]
    pub session_idle_timeout_ms: f64,
    /// Every live session (other than the request's own) adds this stall to every request.
    #[arg(long, default_value_t = 0.0)]
    pub stall_per_session_ms: f64,
    /// Environment variable that, set to --knob-value at start, slows generation by --knob-slowdown.
    #[arg(long)]
    pub knob_env: Option<String>,
    #[arg(long)]
    pub knob_value: Option<String>,
    /// Factor applied to every generation's duration when the knob is live (<1 is a speed-up).
    #[arg(long)]
    pub knob_slowdown: Option<f64>,
    /// With the knob live, only every Nth client generation gets --knob-slowdown (a
    /// tail-only regression: `--knob-tail-every 5 --knob-slowdown 3` makes one request in
    /// five three times slower); 0 = every generation.
    #[arg(long, default_value_t = 0)]
    pub knob_tail_every: u64,
    /// A file holding one factor (e.g. `1.4`) by which every modelled duration is
    /// multiplied, read at each admission (missing or unreadable = 1). Models the host
    /// drifting (load, heat, a noisy neighbour) under every process on it, across restarts.
    #[arg(long)]
    pub host_load_file: Option<PathBuf>,
    /// Make the health check's own forward pass never finish (health then fails after its timeout).
    #[arg(long)]
    pub fault_health_hang: bool,
    /// A client generation freezes (no more tokens, never finishes) after this many
    /// output tokens; 0 = off. The frozen request stays in the running batch, so health
    /// answers 503 unless other requests produce output.
    #[arg(long, default_value_t = 0)]
    pub freeze_after_tokens: u64,
    /// A streamed client generation pauses after this many output tokens for
    /// --pause-ms, then resumes and finishes (0 = off): a request SGLang
    /// retracts when its KV pool runs out (`ScheduleBatch.retract_decode`,
    /// python/sglang/srt/managers/schedule_batch.py: the request goes back to
    /// the waiting queue and is prefilled again) or vLLM preempts for
    /// recompute (`Scheduler._preempt_request`, vllm/v1/core/sched/scheduler.py),
    /// while the engine goes on with its other requests.
    #[arg(long, default_value_t = 0)]
    pub pause_after_tokens: u64,
    /// See --pause-after-tokens: the pause, in wall-clock ms.
    #[arg(long, default_value_t = 0.0)]
    pub pause_ms: f64,
    /// At most this many client generations run at once; the rest queue (0 = no limit;
    /// --serial is the same as 1). `1` is the throughput collapse of a scheduler that stops
    /// batching (see --serial); start-only.
    #[arg(long, default_value_t = 0)]
    pub max_running: usize,
    /// After this many client generations since start, every later one is
    /// --relapse-slowdown times slower. Models a pair that is fast right after warm-up and
    /// then degrades: a decode whose KV cache pool fills retracts running requests and
    /// recomputes them (SGLang `Scheduler.update_running_batch` in
    /// `python/sglang/srt/managers/scheduler.py`: `check_decode_mem()` fails,
    /// `retract_decode()` puts requests back in the waiting queue, log "KV cache pool is
    /// full. Retract requests."). Health's own pass is unaffected, and running requests
    /// still produce a batch result every (slowed) step, so health stays 200.
    #[arg(long)]
    pub relapse_after: Option<u64>,
    /// Factor (>= 1) on every modelled duration of a relapsed generation, on top of the knob's.
    #[arg(long)]
    pub relapse_slowdown: Option<f64>,
    /// Decode only: every Nth routed request (one carrying `bootstrap_room`) fails its KV
    /// transfer and is answered as SGLang's decode answers a failed transfer (0 = off).
    /// Models transfers lost to a flaky link or a prefill that drops rooms: SGLang's
    /// `DecodeTransferQueue.pop_transferred` (`python/sglang/srt/disaggregation/decode.py`)
    /// sees `KVPoll.Failed` and calls `prepare_abort(..., status_code=500)`.
    #[arg(long, default_value_t = 0)]
    pub kv_fail_every: u64,
    /// Decode only: every KV pull of a routed request takes this many extra ms after the
    /// prefill has computed the KV: a slow but working link. The prefill holds the room
    /// (in its inflight queue) for that long before handing the KV over, and the decode's
    /// request waits in its transfer queue meanwhile (SGLang's `DecodeTransferQueue`,
    /// `python/sglang/srt/disaggregation/decode.py`, polls `KVPoll` until `Success`).
    #[arg(long, default_value_t = 0.0)]
    pub kv_transfer_ms: f64,
    /// Decode only: a degraded KV link (INCIDENTS row 1, seed 004). A routed request's KV
    /// never arrives: the decode's request waits in its transfer queue forever (counted in
    /// `sglang:num_decode_transfer_queue_reqs`, not running), the prefill's room stays in
    /// its inflight queue, and health stays 200 on both (health uses a fake bootstrap and
    /// never crosses the link). Turning it off live lets later requests through; requests
    /// already stuck stay stuck.
    #[arg(long)]
    pub kv_stall: bool,
    /// SGLang's `--chunked-prefill-size` (`python/sglang/srt/server_args.py`): a prompt is
    /// prefilled in forward passes of at most this many new tokens, and each chunk is a
    /// batch result of its own (it answers a waiting health check and advances
    /// `sglang:realtime_tokens_total`). 0 or -1 turns chunking off (SGLang's -1). SGLang's
    /// default depends on GPU memory (8192 on an H100/H200); start-only.
    #[arg(long, default_value_t = 8192, allow_negative_numbers = true)]
    pub chunked_prefill_size: i64,
    /// Cold penalty per start, comma-separated ms: entry k on this process's k-th start as
    /// counted in --start-count-file (the last entry repeats; overrides --cold-first-ms).
    /// Models a first-generation penalty that differs between restarts of the same unit:
    /// page cache cold vs warm, a new engine version's JIT/compile caches, CUDA graph
    /// capture after an upgrade.
    #[arg(long)]
    pub cold_first_ms_by_start: Option<String>,
    /// File in which pd-sim counts its own starts: read the number (a missing file is 0),
    /// add one, write it back at start. Required by --cold-first-ms-by-start; alone, it
    /// numbers the starts for `--near-tie-positions` (and `/sim/stats`' `start_number`).
    #[arg(long)]
    pub start_count_file: Option<PathBuf>,
    /// Expose `sglang:num_bootstrap_failed_reqs_total` and
    /// `sglang:num_transfer_failed_reqs_total` only from their first increment, as SGLang
    /// does (without the flag both are always there, 0 until a failure). SGLang declares
    /// them as labelled `prometheus_client` Counters (`SchedulerMetricsCollector.__init__`,
    /// `labelnames=labels.keys()`, in `python/sglang/srt/metrics/collector.py`) and creates
    /// their one series in `increment_bootstrap_failed_reqs` /
    /// `increment_transfer_failed_reqs` (`.labels(**self.labels).inc(1)`): a labelled
    /// counter has no child, hence no sample, before its first `.labels(…)`. SGLang serves
    /// `/metrics` through `prometheus_client`'s `MultiProcessCollector`
    /// (`add_prometheus_middleware` in `python/sglang/srt/utils/common.py`, `utils.py` in
    /// older releases), which only knows the series written to its files, so the family's
    /// `# HELP`/`# TYPE` lines are missing too. A scrape of an engine that never failed shows no such lines: absent means 0,
    /// not unknown. Start-only.
    #[arg(long)]
    pub lazy_failure_counters: bool,

    /// The weights identity this engine computes with (a checkpoint's name and
    /// version): a greedy chat completion's tokens are a function of the prompt and
    /// this (pd-sim's `greedy` module). In a routed pair the decode learns the prefill's over
    /// the KV link; a pair on different weights answers neither engine's answer.
    /// Live-changeable (`weights` in `/sim/fault`).
    #[arg(long, default_value = DEFAULT_WEIGHTS)]
    pub weights: String,
    /// A file holding the weights identity, read once at start (a missing or empty
    /// file leaves `--weights`): "the weights on disk", which a test replaces and then
    /// restarts the engine to load. Start-only.
    #[arg(long)]
    pub weights_file: Option<PathBuf>,
    /// Decode only: the decode reads every routed request's transferred KV with a
    /// mismatched layout, so a greedy answer is wrong from `--corrupt-from-position`
    /// on — fast, HTTP 200, finish_reason as usual (the KV-layout mismatch that
    /// "returns a 200 with wrong output"). Requests served whole are unaffected.
    #[arg(long)]
    pub kv_corruption: bool,
    /// KV pages reused too early under load: a greedy answer is wrong from
    /// `--corrupt-from-position` on when, at its first token (non-streamed: at its
    /// first or its last), the running batch holds at least `--kv-reuse-min-running`
    /// requests (itself included). Any engine, any request it generates for.
    #[arg(long)]
    pub kv_reuse_under_load: bool,
    /// The running batch size from which `--kv-reuse-under-load` corrupts (>= 1).
    #[arg(long, default_value_t = 2)]
    pub kv_reuse_min_running: u64,
    /// The first wrong token (0-based) of a corrupted answer (`--kv-corruption`,
    /// `--kv-reuse-under-load`); earlier tokens are the healthy answer's.
    #[arg(long, default_value_t = 2)]
    pub corrupt_from_position: u64,
    /// Comma-separated token positions (0-based) whose top two tokens are within 0.01
    /// nats in a greedy answer; the token chosen there alternates with each start of
    /// the engine (odd starts one, even starts the other, counted in
    /// `--start-count-file`; without one, a coin per start): numerical noise that a
    /// comparison must tolerate.
    #[arg(long, default_value = "")]
    pub near_tie_positions: String,
}

/// `--weights`' default.
pub const DEFAULT_WEIGHTS: &str = "tiny-v1";

/// Parses `"3, 7"` into positions; empty entries are ignored.
pub fn parse_positions(list: &str) -> Result<Vec<u64>, ConfigError> {
    let mut v = list
        .split(',')
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            e.trim()
                .parse::<u64>()
                .map_err(|_| ConfigError::Position(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

fn check_weights(w: &str) -> Result<String, ConfigError> {
    let t = w.trim();
    if t.is_empty() {
        return Err(ConfigError::EmptyWeights);
    }
    Ok(t.to_string())
}

/// The timing and fault settings `POST /sim/fault` can change live.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Settings {
    pub ttft_ms: f64,
    pub tpot_ms: f64,
    pub prefill_tok_per_s: f64,
    pub cold_first_ms: f64,
    pub serial: bool,
    pub leak_slot_on_disconnect: bool,
    pub session_prefix_tokens: u64,
    pub session_idle_timeout_ms: f64,
    pub stall_per_session_ms: f64,
    pub knob_env: Option<String>,
    pub knob_value: Option<String>,
    pub knob_slowdown: f64,
    /// See `--knob-tail-every` (0 = every generation).
    pub knob_tail_every: u64,
    /// Whether the knob's variable had the knob's value in this process's environment at start.
    pub knob_live: bool,
    /// See `--host-load-file`.
    pub host_load_file: Option<PathBuf>,
    pub fault_health_hang: bool,
    /// See `--freeze-after-tokens`.
    pub freeze_after_tokens: u64,
    /// See `--pause-after-tokens` and `--pause-ms`.
    pub pause_after_tokens: u64,
    pub pause_ms: f64,
    /// See `--relapse-after` (None = no relapse).
    pub relapse_after: Option<u64>,
    /// See `--relapse-slowdown` (1 when there is no relapse).
    pub relapse_slowdown: f64,
    /// See `--kv-fail-every` (0 = off).
    pub kv_fail_every: u64,
    /// See `--kv-transfer-ms` (0 = off).
    pub kv_transfer_ms: f64,
    /// See `--kv-stall`.
    pub kv_stall: bool,
    /// See `--weights` (or `--weights-file`, read at start).
    pub weights: String,
    /// See `--kv-corruption` (decode only).
    pub kv_corruption: bool,
    /// See `--kv-reuse-under-load`.
    pub kv_reuse_under_load: bool,
    /// See `--kv-reuse-min-running` (>= 1).
    pub kv_reuse_min_running: u64,
    /// See `--corrupt-from-position`.
    pub corrupt_from_position: u64,
    /// See `--near-tie-positions` (sorted, distinct).
    pub near_tie_positions: Vec<u64>,
}

impl Settings {
    /// The factor every modelled duration is multiplied by (1 unless the knob is live).
    pub fn slowdown(&self) -> f64 {
        if self.knob_live { self.knob_slowdown } else { 1.0 }
    }

    /// The knob's factor for the `generation`-th client generation (1-based): with
    /// `--knob-tail-every N`, only every Nth one is slowed.
    pub fn slowdown_of(&self, generation: u64) -> f64 {
        if self.knob_tail_every > 1 && !generation.is_multiple_of(self.knob_tail_every) {
            1.0
        } else {
            self.slowdown()
        }
    }

    /// The host's factor now (`--host-load-file`; 1 without one).
    pub fn host_load(&self) -> f64 {
        self.host_load_file
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|t| t.trim().parse::<f64>().ok())
            .filter(|f| f.is_finite() && *f > 0.0)
            .unwrap_or(1.0)
    }

    /// Whether the `generation`-th client generation since start (1-based) has relapsed:
    /// only those after the first `--relapse-after` do.
    pub fn relapsed(&self, generation: u64) -> bool {
        self.relapse_after.is_some_and(|n| generation > n)
    }
}

/// What is fixed for the life of one pd-sim process.
#[derive(Clone, Debug)]
pub struct Config {
    pub role: Role,
    /// `--kv-transfer`.
    pub kv_transfer: KvTransfer,
    pub host: String,
    pub port: u16,
    /// Prefill: the bootstrap port to bind (0 = any); decode: None.
    pub bootstrap_port: Option<u16>,
    pub model: String,
    pub listen_after_ms: f64,
    pub ready_after_ms: f64,
    pub time_scale: f64,
    pub health_timeout_ms: f64,
    /// `--sglang-version`.
    pub sglang_version: String,
    /// `/health` generates (false: `--no-health-endpoint-generation` or
    /// `SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION` false, or a release before 0.4.10.post2).
    pub health_endpoint_generates: bool,
    pub latency_script: VecDeque<LatencyStep>,
    pub settings: Settings,
    /// The process environment's value of the knob variable at start (for live knob changes).
    pub knob_env_value: Option<String>,
    /// `--max-running` (0 = no limit).
    pub max_running: usize,
    /// `--cold-first-ms-by-start` with `--start-count-file`; applied when the engine starts.
    pub cold_by_start: Option<ColdByStart>,
    /// `--chunked-prefill-size` (None = chunking off).
    pub chunked_prefill_size: Option<u64>,
    /// `--lazy-failure-counters`: the PD failure counters appear at their first increment.
    pub lazy_failure_counters: bool,
    /// `--start-count-file`, given alone or with `--cold-first-ms-by-start`: where this
    /// process counts its starts (near-tie parity, cold penalty by start).
    pub start_count_file: Option<PathBuf>,
    /// `--weights-file`: read once at start; overrides `--weights` when it holds a name.
    pub weights_file: Option<PathBuf>,
}

fn check_min_running(n: u64) -> Result<u64, ConfigError> {
    if n >= 1 {
        Ok(n)
    } else {
        Err(ConfigError::OutOfRange {
            flag: "kv-reuse-min-running",
            min: 1.0,
            value: 0.0,
        })
    }
}

fn check(flag: &'static str, value: f64, min: f64) -> Result<f64, ConfigError> {
    if value.is_finite() && value >= min {
        Ok(value)
    } else {
        Err(ConfigError::OutOfRange { flag, min, value })
    }
}

impl Config {
    /// Validates `args`; `env` looks up environment variables (injected for tests).
    pub fn from_args(args: Args, env: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let knob_slowdown = match (&args.knob_env, &args.knob_value, args.knob_slowdown) {
            (None, None, None) => 1.0,
            (Some(_), Some(_), Some(f)) => check("knob-slowdown", f, f64::MIN_POSITIVE)?,
            (None, _, _) => return Err(ConfigError::KnobIncomplete("--knob-env")),
            (_, None, _) => return Err(ConfigError::KnobIncomplete("--knob-value")),
            (_, _, None) => return Err(ConfigError::KnobIncomplete("--knob-slowdown")),
        };
        let (relapse_after, relapse_slowdown) = match (args.relapse_after, args.relapse_slowdown) {
            (None, None) => (None, 1.0),
            (Some(n), Some(f)) => (Some(n), check("relapse-slowdown", f, 1.0)?),
            (None, Some(_)) => return Err(ConfigError::RelapseIncomplete("--relapse-after")),
            (Some(_), None) => return Err(ConfigError::RelapseIncomplete("--relapse-slowdown")),
        };
        if args.role == Role::Prefill {
            if args.kv_fail_every > 0 {
                return Err(ConfigError::DecodeOnly("--kv-fail-every"));
            }
            if args.kv_transfer_ms != 0.0 {
                return Err(ConfigError::DecodeOnly("--kv-transfer-ms"));
            }
            if args.kv_stall {
                return Err(ConfigError::DecodeOnly("--kv-stall"));
            }
            if args.kv_corruption {
                return Err(ConfigError::DecodeOnly("--kv-corruption"));
            }
        }
        // `--start-count-file` alone counts starts (for near-tie parity); with
        // `--cold-first-ms-by-start` it also picks the start's cold penalty.
        let start_count_file = args.start_count_file.clone();
        let cold_by_start = match (args.cold_first_ms_by_start, args.start_count_file) {
            (None, _) => None,
            (Some(list), Some(count_file)) => Some(ColdByStart {
                cold_first_ms: parse_cold_by_start(&list)?,
                count_file,
            }),
            (Some(_), None) => return Err(ConfigError::ColdByStartIncomplete("--start-count-file")),
        };
        let knob_env_value = args.knob_env.as_deref().and_then(&env);
        // SGLang's EnvBool: "0", "false", "no", "off" (any case) are false.
        let env_says_no = env("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION")
            .is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "0" | "false" | "no" | "off"));
        let health_endpoint_generates = pdwarden_engines::sglang_health_generates(args.sglang_version.trim())
            && !(pdwarden_engines::release_at_least(args.sglang_version.trim(), "0.5.5.post3")
                && (args.no_health_endpoint_generation || env_says_no));
        let knob_live = args.knob_value.is_some() && knob_env_value == args.knob_value;
        let settings = Settings {
            ttft_ms: check("ttft-ms", args.ttft_ms, 0.0)?,
            tpot_ms: check("tpot-ms", args.tpot_ms, 0.0)?,
            prefill_tok_per_s: check("prefill-tok-per-s", args.prefill_tok_per_s, 0.0)?,
            cold_first_ms: check("cold-first-ms", args.cold_first_ms, 0.0)?,
            serial: args.serial,
            leak_slot_on_disconnect: args.leak_slot_on_disconnect,
            session_prefix_tokens: args.session_prefix_tokens,
            session_idle_timeout_ms: check("session-idle-timeout-ms", args.session_idle_timeout_ms, 0.0)?,
            stall_per_session_ms: check("stall-per-session-ms", args.stall_per_session_ms, 0.0)?,
            knob_env: args.knob_env,
            knob_value: args.knob_value,
            knob_slowdown,
            knob_tail_every: args.knob_tail_every,
            knob_live,
            host_load_file: args.host_load_file,
            fault_health_hang: args.fault_health_hang,
            freeze_after_tokens: args.freeze_after_tokens,
            pause_after_tokens: args.pause_after_tokens,
            pause_ms: args.pause_ms.max(0.0),
            relapse_after,
            relapse_slowdown,
            kv_fail_every: args.kv_fail_every,
            kv_transfer_ms: check("kv-transfer-ms", args.kv_transfer_ms, 0.0)?,
            kv_stall: args.kv_stall,
            weights: check_weights(&args.weights)?,
            kv_corruption: args.kv_corruption,
            kv_reuse_under_load: args.kv_reuse_under_load,
            kv_reuse_min_running: check_min_running(args.kv_reuse_min_running)?,
            corrupt_from_position: args.corrupt_from_position,
            near_tie_positions: parse_positions(&args.near_tie_positions)?,
        };
        let bootstrap_port = match args.role {
            Role::Prefill => Some(args.bootstrap_port.unwrap_or(DEFAULT_BOOTSTRAP_PORT)),
            Role::Decode => None,
        };
        Ok(Config {
            role: args.role,
            kv_transfer: args.kv_transfer,
            host: args.host,
            port: args.port,
            bootstrap_port,
            model: args.model,
            listen_after_ms: check("listen-after-ms", args.listen_after_ms, 0.0)?,
            ready_after_ms: check("ready-after-ms", args.ready_after_ms, 0.0)?,
            time_scale: check("time-scale", args.time_scale, f64::MIN_POSITIVE)?,
            health_timeout_ms: check("health-timeout-ms", args.health_timeout_ms, 0.0)?,
            sglang_version: {
                let v = args.sglang_version.trim();
                if v.is_empty()
                    || !v
                        .split('.')
                        .all(|p| p.strip_prefix("post").unwrap_or(p).parse::<u64>().is_ok())
                {
                    return Err(ConfigError::SglangVersion(args.sglang_version.clone()));
                }
                v.to_string()
            },
            health_endpoint_generates,
            latency_script: parse_latency_script(args.latency_script.as_deref().unwrap_or(""))?,
            settings,
            knob_env_value,
            max_running: args.max_running,
            cold_by_start,
            chunked_prefill_size: u64::try_from(args.chunked_prefill_size).ok().filter(|n| *n > 0),
            lazy_failure_counters: args.lazy_failure_counters,
            start_count_file,
            weights_file: args.weights_file,
        })
    }

    /// A config for in-process tests: loopback, port 0, no delays, 1/100 time scale.
    pub fn for_test(role: Role) -> Config {
        let args = Args::parse_from([
            "pd-sim",
            "--role",
            role.as_str(),
            "--port",
            "0",
            "--bootstrap-port",
            "0",
            "--time-scale",
            "0.01",
        ]);
        Config::from_args(args, |_| None).expect("test config is valid")
    }
}

/// `--latency-script` in a `/sim/fault` body: the flag's string or a JSON list.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum ScriptPatch {
    List(Vec<ScriptEntry>),
    Text(String),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum ScriptEntry {
    Ms(f64),
    Word(String),
}

impl ScriptPatch {
    pub fn parse(&self) -> Result<VecDeque<LatencyStep>, ConfigError> {
        match self {
            ScriptPatch::Text(t) => parse_latency_script(t),
            ScriptPatch::List(items) => items
                .iter()
                .map(|e| match e {
                    ScriptEntry::Ms(v) => LatencyStep::from_str(&v.to_string()),
                    ScriptEntry::Word(w) => LatencyStep::from_str(w),
                })
                .collect(),
        }
    }
}

/// `--near-tie-positions` in a `/sim/fault` body: a JSON list of positions or the
/// flag's string.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum PositionsPatch {
    List(Vec<u64>),
    Text(String),
}

impl PositionsPatch {
    pub fn parse(&self) -> Result<Vec<u64>, ConfigError> {
        match self {
            PositionsPatch::Text(t) => parse_positions(t),
            PositionsPatch::List(v) => {
                let mut v = v.clone();
                v.sort_unstable();
                v.dedup();
                Ok(v)
            }
        }
    }
}

/// Body of `POST /sim/fault`: any subset of the flags, by the flags' names (snake_case;
/// the kebab-case spelling is accepted too). Unknown names are rejected.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultPatch {
    #[serde(alias = "latency-script")]
    pub latency_script: Option<ScriptPatch>,
    pub serial: Option<bool>,
    #[serde(alias = "leak-slot-on-disconnect")]
    pub leak_slot_on_disconnect: Option<bool>,
    #[serde(alias = "session-prefix-tokens")]
    pub session_prefix_tokens: Option<u64>,
    #[serde(alias = "session-idle-timeout-ms")]
    pub session_idle_timeout_ms: Option<f64>,
    #[serde(alias = "stall-per-session-ms")]
    pub stall_per_session_ms: Option<f64>,
    #[serde(alias = "knob-env")]
    pub knob_env: Option<String>,
    #[serde(alias = "knob-value")]
    pub knob_value: Option<String>,
    #[serde(alias = "knob-slowdown")]
    pub knob_slowdown: Option<f64>,
    #[serde(alias = "ttft-ms")]
    pub ttft_ms: Option<f64>,
    #[serde(alias = "tpot-ms")]
    pub tpot_ms: Option<f64>,
    #[serde(alias = "prefill-tok-per-s")]
    pub prefill_tok_per_s: Option<f64>,
    #[serde(alias = "cold-first-ms")]
    pub cold_first_ms: Option<f64>,
    #[serde(alias = "fault-health-hang")]
    pub fault_health_hang: Option<bool>,
    #[serde(alias = "freeze-after-tokens")]
    pub freeze_after_tokens: Option<u64>,
    #[serde(alias = "pause-after-tokens")]
    pub pause_after_tokens: Option<u64>,
    #[serde(alias = "pause-ms")]
    pub pause_ms: Option<f64>,
    /// With `relapse_slowdown`, or alone to move an existing relapse's threshold.
    #[serde(alias = "relapse-after")]
    pub relapse_after: Option<u64>,
    /// With `relapse_after`, or alone to change an existing relapse (1 switches it off).
    #[serde(alias = "relapse-slowdown")]
    pub relapse_slowdown: Option<f64>,
    /// Decode only; setting it restarts the count (the Nth routed request *after the patch*
    /// fails).
    #[serde(alias = "kv-fail-every")]
    pub kv_fail_every: Option<u64>,
    /// Decode only (see `--kv-transfer-ms`); applies to requests admitted after the patch.
    #[serde(alias = "kv-transfer-ms")]
    pub kv_transfer_ms: Option<f64>,
    /// Decode only (see `--kv-stall`); applies to requests admitted after the patch.
    #[serde(alias = "kv-stall")]
    pub kv_stall: Option<bool>,
    /// See `--weights`: the engine now computes with these weights (requests admitted
    /// after the patch; a prefill's KV carries them to its decode).
    pub weights: Option<String>,
    /// Decode only (see `--kv-corruption`).
    #[serde(alias = "kv-corruption")]
    pub kv_corruption: Option<bool>,
    /// Prefill only, live only: the prefill's transfer state goes stale
    /// (smg-project/smg#2382: prefills kept stale transfer state after
    /// their decodes restarted, every pod Ready): its bootstrap fails every
    /// KV pull, as a room whose transfer failed (`KVPoll.Failed`), until the
    /// prefill restarts. Its own health and `/health_generate` stay 200.
    #[serde(alias = "stale-transfer-state")]
    pub stale_transfer_state: Option<bool>,
    /// See `--kv-reuse-under-load`.
    #[serde(alias = "kv-reuse-under-load")]
    pub kv_reuse_under_load: Option<bool>,
    /// See `--kv-reuse-min-running` (>= 1).
    #[serde(alias = "kv-reuse-min-running")]
    pub kv_reuse_min_running: Option<u64>,
    /// See `--corrupt-from-position`.
    #[serde(alias = "corrupt-from-position")]
    pub corrupt_from_position: Option<u64>,
    /// See `--near-tie-positions`: a list (`[3, 7]`) or the flag's string (`"3,7"`);
    /// an empty one clears them.
    #[serde(alias = "near-tie-positions")]
    pub near_tie_positions: Option<PositionsPatch>,
}

impl FaultPatch {
    /// Applies the patch to `s`. `env` looks the knob's variable up in the environment
    /// as it was at start (a knob is live only if the process started with it).
    pub fn apply(&self, s: &mut Settings, env: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        let mut n = s.clone();
        if let Some(v) = self.serial {
            n.serial = v;
        }
        if let Some(v) = self.freeze_after_tokens {
            n.freeze_after_tokens = v;
        }
        if let Some(v) = self.pause_after_tokens {
            n.pause_after_tokens = v;
        }
        if let Some(v) = self.pause_ms {
            n.pause_ms = v.max(0.0);
        }
        if let Some(v) = self.leak_slot_on_disconnect {
            n.leak_slot_on_disconnect = v;
        }
        if let Some(v) = self.session_prefix_tokens {
            n.session_prefix_tokens = v;
        }
        if let Some(v) = self.session_idle_timeout_ms {
            n.session_idle_timeout_ms = check("session-idle-timeout-ms", v, 0.0)?;
        }
        if let Some(v) = self.stall_per_session_ms {
            n.stall_per_session_ms = check("stall-per-session-ms", v, 0.0)?;
        }
        if let Some(v) = self.ttft_ms {
            n.ttft_ms = check("ttft-ms", v, 0.0)?;
        }
        if let Some(v) = self.tpot_ms {
            n.tpot_ms = check("tpot-ms", v, 0.0)?;
        }
        if let Some(v) = self.prefill_tok_per_s {
            n.prefill_tok_per_s = check("prefill-tok-per-s", v, 0.0)?;
        }
        if let Some(v) = self.cold_first_ms {
            n.cold_first_ms = check("cold-first-ms", v, 0.0)?;
        }
        if let Some(v) = self.fault_health_hang {
            n.fault_health_hang = v;
        }
        match (self.relapse_after, self.relapse_slowdown, n.relapse_after) {
            (None, None, _) => {}
            (Some(_), None, None) => return Err(ConfigError::RelapseIncomplete("--relapse-slowdown")),
            (None, Some(_), None) => return Err(ConfigError::RelapseIncomplete("--relapse-after")),
            (after, slowdown, _) => {
                if let Some(a) = after {
                    n.relapse_after = Some(a);
                }
                if let Some(f) = slowdown {
                    n.relapse_slowdown = check("relapse-slowdown", f, 1.0)?;
                }
            }
        }
        if let Some(v) = self.kv_fail_every {
            n.kv_fail_every = v;
        }
        if let Some(v) = self.kv_transfer_ms {
            n.kv_transfer_ms = check("kv-transfer-ms", v, 0.0)?;
        }
        if let Some(v) = self.kv_stall {
            n.kv_stall = v;
        }
        if let Some(v) = &self.weights {
            n.weights = check_weights(v)?;
        }
        if let Some(v) = self.kv_corruption {
            n.kv_corruption = v;
        }
        if let Some(v) = self.kv_reuse_under_load {
            n.kv_reuse_under_load = v;
        }
        if let Some(v) = self.kv_reuse_min_running {
            n.kv_reuse_min_running = check_min_running(v)?;
        }
        if let Some(v) = self.corrupt_from_position {
            n.corrupt_from_position = v;
        }
        if let Some(v) = &self.near_tie_positions {
            n.near_tie_positions = v.parse()?;
        }
        if let Some(v) = &self.knob_env {
            n.knob_env = Some(v.clone());
        }
        if let Some(v) = &self.knob_value {
            n.knob_value = Some(v.clone());
        }
        if let Some(v) = self.knob_slowdown {
            n.knob_slowdown = check("knob-slowdown", v, f64::MIN_POSITIVE)?;
        }
        n.knob_live = match (&n.knob_env, &n.knob_value) {
            (Some(name), Some(value)) => env(name).as_ref() == Some(value),
            _ => false,
        };
        *s = n;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut v = vec!["pd-sim", "--role", "decode", "--port", "1"];
        v.extend_from_slice(extra);
        Args::parse_from(v)
    }

    // The latency script accepts numbers and `hang`, and nothing else.
    #[test]
    fn latency_script_parses() {
        let s = parse_latency_script("17900, 106400,hang").unwrap();
        assert_eq!(
            Vec::from(s),
            vec![LatencyStep::Ms(17900.0), LatencyStep::Ms(106400.0), LatencyStep::Hang]
        );
        assert!(parse_latency_script("10,soon").is_err());
        assert!(parse_latency_script("").unwrap().is_empty());
    }

    // /health generates by default; the flag or SGLang's own environment variable
    // turns that off (a release that has the switch); an old release never generates.
    #[test]
    fn health_endpoint_generation_follows_release_flag_and_env() {
        let cfg = |extra: &[&str], env: Option<&str>| {
            let mut argv = vec!["pd-sim", "--role", "decode", "--port", "0"];
            argv.extend_from_slice(extra);
            let env = env.map(str::to_string);
            Config::from_args(Args::parse_from(argv), |k| {
                (k == "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION")
                    .then(|| env.clone())
                    .flatten()
            })
            .unwrap()
            .health_endpoint_generates
        };
        assert!(cfg(&[], None));
        assert!(!cfg(&["--no-health-endpoint-generation"], None));
        assert!(!cfg(&[], Some("False")));
        assert!(cfg(&[], Some("1")));
        // Before 0.4.10.post2 /health never generated; the switch exists since 0.5.5.post3.
        assert!(!cfg(&["--sglang-version", "0.4.9"], None));
        assert!(cfg(
            &["--sglang-version", "0.5.4", "--no-health-endpoint-generation"],
            None
        ));
        assert!(
            Config::from_args(
                Args::parse_from(["pd-sim", "--role", "decode", "--port", "0", "--sglang-version", "v0.5"]),
                |_| None
            )
            .is_err()
        );
    }

    // The knob is live only when the environment at start holds exactly the knob's value.
    #[test]
    fn knob_is_live_only_with_matching_env() {
        let a = args(&["--knob-env", "SGLANG_X", "--knob-value", "512", "--knob-slowdown", "2"]);
        let on = Config::from_args(a.clone(), |k| (k == "SGLANG_X").then(|| "512".into())).unwrap();
        assert!(on.settings.knob_live);
        assert_eq!(on.settings.slowdown(), 2.0);
        let off = Config::from_args(a, |_| Some("256".into())).unwrap();
        assert!(!off.settings.knob_live);
        assert_eq!(off.settings.slowdown(), 1.0);
        assert!(Config::from_args(args(&["--knob-env", "X"]), |_| None).is_err());
    }

    // A fault patch uses the flags' names, in either spelling, and rejects unknown ones.
    #[test]
    fn fault_patch_names() {
        let p: FaultPatch =
            serde_json::from_str(r#"{"latency_script":[100,"hang"],"serial":true,"leak-slot-on-disconnect":true}"#)
                .unwrap();
        let mut s = Config::for_test(Role::Decode).settings;
        p.apply(&mut s, |_| None).unwrap();
        assert!(s.serial && s.leak_slot_on_disconnect);
        assert_eq!(
            Vec::from(p.latency_script.unwrap().parse().unwrap()),
            vec![LatencyStep::Ms(100.0), LatencyStep::Hang]
        );
        assert!(serde_json::from_str::<FaultPatch>(r#"{"nonsense":1}"#).is_err());
    }
    /// The one-line message of a rejected flag set.
    fn error(extra: &[&str]) -> String {
        Config::from_args(args(extra), |_| None).unwrap_err().to_string()
    }

    // Relapse flags go together, and the error names the one that is missing;
    // a relapse cannot speed an engine up (F >= 1).
    #[test]
    fn relapse_flags_validate() {
        assert!(error(&["--relapse-after", "3"]).contains("missing --relapse-slowdown"));
        assert!(error(&["--relapse-slowdown", "4"]).contains("missing --relapse-after"));
        assert!(error(&["--relapse-after", "3", "--relapse-slowdown", "0.5"]).contains("--relapse-slowdown"));
        let c = Config::from_args(args(&["--relapse-after", "3", "--relapse-slowdown", "4"]), |_| None).unwrap();
        assert_eq!((c.settings.relapse_after, c.settings.relapse_slowdown), (Some(3), 4.0));
        let off = Config::for_test(Role::Decode).settings;
        assert_eq!((off.relapse_after, off.relapse_slowdown), (None, 1.0));
    }

    // Only generations after the first N relapse: N fine, N+1 onwards slowed.
    #[test]
    fn relapse_rule_counts_generations_since_start() {
        let mut s = Config::for_test(Role::Decode).settings;
        assert!(!s.relapsed(1_000));
        s.relapse_after = Some(3);
        assert_eq!(
            (1..=5).map(|k| s.relapsed(k)).collect::<Vec<_>>(),
            [false, false, false, true, true]
        );
        s.relapse_after = Some(0);
        assert!(s.relapsed(1), "--relapse-after 0 relapses from the first generation");
    }

    // A patch may set both relapse fields, or change one of an existing relapse, but not
    // start a relapse with only one of them.
    #[test]
    fn relapse_patch_needs_both_to_start() {
        let mut s = Config::for_test(Role::Decode).settings;
        let p = |j: &str| serde_json::from_str::<FaultPatch>(j).unwrap();
        let e = p(r#"{"relapse_after": 2}"#).apply(&mut s, |_| None).unwrap_err();
        assert!(e.to_string().contains("missing --relapse-slowdown"), "{e}");
        let e = p(r#"{"relapse-slowdown": 2}"#).apply(&mut s, |_| None).unwrap_err();
        assert!(e.to_string().contains("missing --relapse-after"), "{e}");
        assert_eq!(s.relapse_after, None, "a rejected patch changes nothing");
        p(r#"{"relapse_after": 2, "relapse_slowdown": 3}"#)
            .apply(&mut s, |_| None)
            .unwrap();
        p(r#"{"relapse_slowdown": 5}"#).apply(&mut s, |_| None).unwrap();
        assert_eq!((s.relapse_after, s.relapse_slowdown), (Some(2), 5.0));
        assert!(p(r#"{"relapse_slowdown": 0.9}"#).apply(&mut s, |_| None).is_err());
    }

    // --kv-fail-every is a decode's fault: a prefill refuses it (0, off, is fine anywhere).
    #[test]
    fn kv_fail_every_is_decode_only() {
        let prefill = |n: &str| Args::parse_from(["pd-sim", "--role", "prefill", "--port", "1", "--kv-fail-every", n]);
        let e = Config::from_args(prefill("3"), |_| None).unwrap_err().to_string();
        assert_eq!(
            e,
            "--kv-fail-every applies to a decode only (this engine is --role prefill)"
        );
        assert!(Config::from_args(prefill("0"), |_| None).is_ok());
        let d = Config::from_args(args(&["--kv-fail-every", "3"]), |_| None).unwrap();
        assert_eq!(d.settings.kv_fail_every, 3);
        let mut s = d.settings;
        serde_json::from_str::<FaultPatch>(r#"{"kv-fail-every": 0}"#)
            .unwrap()
            .apply(&mut s, |_| None)
            .unwrap();
        assert_eq!(s.kv_fail_every, 0);
    }

    // The two link faults are a decode's, like --kv-fail-every: a prefill refuses them
    // (off is fine anywhere), a decode takes them as flags and as live patches.
    #[test]
    fn kv_link_faults_are_decode_only() {
        let prefill = |extra: &[&str]| {
            let mut v = vec!["pd-sim", "--role", "prefill", "--port", "1"];
            v.extend_from_slice(extra);
            Config::from_args(Args::parse_from(v), |_| None)
        };
        assert_eq!(
            prefill(&["--kv-transfer-ms", "500"]).unwrap_err().to_string(),
            "--kv-transfer-ms applies to a decode only (this engine is --role prefill)"
        );
        assert_eq!(
            prefill(&["--kv-stall"]).unwrap_err().to_string(),
            "--kv-stall applies to a decode only (this engine is --role prefill)"
        );
        assert!(prefill(&["--kv-transfer-ms", "0"]).is_ok());
        assert!(error(&["--kv-transfer-ms=-1"]).contains("--kv-transfer-ms"));
        let d = Config::from_args(args(&["--kv-transfer-ms", "2500", "--kv-stall"]), |_| None).unwrap();
        assert_eq!((d.settings.kv_transfer_ms, d.settings.kv_stall), (2500.0, true));
        let mut s = d.settings;
        serde_json::from_str::<FaultPatch>(r#"{"kv-stall": false, "kv_transfer_ms": 0}"#)
            .unwrap()
            .apply(&mut s, |_| None)
            .unwrap();
        assert_eq!((s.kv_transfer_ms, s.kv_stall), (0.0, false));
    }

    // --chunked-prefill-size defaults to SGLang's 8192 (H100/H200); 0 or SGLang's -1 is off.
    #[test]
    fn chunked_prefill_size_flag() {
        let c = |extra: &[&str]| Config::from_args(args(extra), |_| None).unwrap().chunked_prefill_size;
        assert_eq!(c(&[]), Some(8192));
        assert_eq!(c(&["--chunked-prefill-size", "2048"]), Some(2048));
        assert_eq!(c(&["--chunked-prefill-size", "-1"]), None);
        assert_eq!(c(&["--chunked-prefill-size", "0"]), None);
    }

    // The k-th start gets entry k of the list; the last entry repeats for later starts.
    #[test]
    fn cold_penalty_by_start_number() {
        let c = ColdByStart {
            cold_first_ms: parse_cold_by_start("90000, 4000,0").unwrap(),
            count_file: PathBuf::from("/nonexistent"),
        };
        let by_start: Vec<f64> = (1..=5).map(|k| c.for_start(k)).collect();
        assert_eq!(by_start, [90_000.0, 4_000.0, 0.0, 0.0, 0.0]);
        let one = ColdByStart {
            cold_first_ms: vec![700.0],
            count_file: PathBuf::new(),
        };
        assert_eq!((one.for_start(1), one.for_start(9)), (700.0, 700.0));
    }

    // The start flags go together; the list takes non-negative ms and at least one entry.
    #[test]
    fn cold_by_start_flags_validate() {
        assert!(error(&["--cold-first-ms-by-start", "1,2"]).contains("missing --start-count-file"));
        // The count file alone counts starts (near-tie parity) and picks no penalty.
        let alone = Config::from_args(args(&["--start-count-file", "/tmp/x"]), |_| None).unwrap();
        assert_eq!(alone.cold_by_start, None);
        assert_eq!(alone.start_count_file, Some(PathBuf::from("/tmp/x")));
        let bad = ["--cold-first-ms-by-start", "100,-1", "--start-count-file", "/tmp/x"];
        assert_eq!(
            error(&bad),
            "--cold-first-ms-by-start entry \"-1\" is not a non-negative number of ms"
        );
        let empty = ["--cold-first-ms-by-start", ",", "--start-count-file", "/tmp/x"];
        assert_eq!(error(&empty), "--cold-first-ms-by-start needs at least one entry");
        let ok = ["--cold-first-ms-by-start", "100,5", "--start-count-file", "/tmp/x"];
        let c = Config::from_args(args(&ok), |_| None).unwrap();
        assert_eq!(
            c.cold_by_start,
            Some(ColdByStart {
                cold_first_ms: vec![100.0, 5.0],
                count_file: PathBuf::from("/tmp/x"),
            })
        );
    }

    // The output-model flags: defaults, parsing, and their live patch by either spelling;
    // --kv-corruption is a decode's, like the other KV faults.
    #[test]
    fn golden_output_flags_and_patch() {
        let d = Config::for_test(Role::Decode).settings;
        assert_eq!(d.weights, DEFAULT_WEIGHTS);
        assert_eq!(
            (
                d.kv_corruption,
                d.kv_reuse_under_load,
                d.kv_reuse_min_running,
                d.corrupt_from_position
            ),
            (false, false, 2, 2)
        );
        assert!(d.near_tie_positions.is_empty());
        let c = Config::from_args(
            args(&[
                "--weights",
                "llama-3-8b@rev2",
                "--kv-corruption",
                "--kv-reuse-under-load",
                "--kv-reuse-min-running",
                "4",
                "--corrupt-from-position",
                "0",
                "--near-tie-positions",
                "7, 3,3",
                "--weights-file",
                "/tmp/w",
            ]),
            |_| None,
        )
        .unwrap();
        let s = &c.settings;
        assert_eq!(s.weights, "llama-3-8b@rev2");
        assert!(s.kv_corruption && s.kv_reuse_under_load);
        assert_eq!((s.kv_reuse_min_running, s.corrupt_from_position), (4, 0));
        assert_eq!(s.near_tie_positions, [3, 7]);
        assert_eq!(c.weights_file, Some(PathBuf::from("/tmp/w")));
        assert!(error(&["--near-tie-positions", "1,x"]).contains("--near-tie-positions entry"));
        assert!(error(&["--weights", " "]).contains("--weights"));
        assert!(error(&["--kv-reuse-min-running", "0"]).contains("kv-reuse-min-running"));
        let prefill = Args::parse_from(["pd-sim", "--role", "prefill", "--port", "1", "--kv-corruption"]);
        assert_eq!(
            Config::from_args(prefill, |_| None).unwrap_err().to_string(),
            "--kv-corruption applies to a decode only (this engine is --role prefill)"
        );
        let mut s = d.clone();
        serde_json::from_str::<FaultPatch>(
            r#"{"weights": "tiny-v2", "kv-corruption": true, "kv_reuse_under_load": true,
                "kv-reuse-min-running": 3, "corrupt-from-position": 5, "near-tie-positions": [4, 1]}"#,
        )
        .unwrap()
        .apply(&mut s, |_| None)
        .unwrap();
        assert_eq!(s.weights, "tiny-v2");
        assert!(s.kv_corruption && s.kv_reuse_under_load);
        assert_eq!((s.kv_reuse_min_running, s.corrupt_from_position), (3, 5));
        assert_eq!(s.near_tie_positions, [1, 4]);
        let p = |j: &str| serde_json::from_str::<FaultPatch>(j).unwrap();
        p(r#"{"near_tie_positions": ""}"#).apply(&mut s, |_| None).unwrap();
        assert!(s.near_tie_positions.is_empty());
        assert!(p(r#"{"weights": ""}"#).apply(&mut s, |_| None).is_err());
        assert_eq!(s.weights, "tiny-v2", "a rejected patch changes nothing");
    }

    // `hang,` is one hang followed by the model: the trailing comma adds no entry.
    #[test]
    fn hang_once_script_parses() {
        assert_eq!(
            Vec::from(parse_latency_script("hang,").unwrap()),
            vec![LatencyStep::Hang]
        );
    }
}
