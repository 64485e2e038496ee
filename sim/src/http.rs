//! SGLang's HTTP surface, as much of it as the router and pdwarden touch.
//!
//! Shapes follow SGLang's `python/sglang/srt/entrypoints/http_server.py` and its
//! OpenAI adapter: `/health` and `/health_generate` share one handler that answers 200
//! as soon as *any* scheduler output newer than the request's start is seen (checked
//! once a second, for up to 20 s) — a one-token pass of its own when the scheduler is
//! idle, the scheduler's next batch result when it is busy ([`health`]); `/v1/models`
//! never touches the scheduler; `/generate` answers `{text, output_ids, meta_info}`.
//! sglang-router 0.3.2 registers a worker with `GET /health`, `/server_info` and
//! `/model_info`, then sends every request to a prefill and a decode at once with
//! `bootstrap_host/port/room` added to the body (see ROUTER-NOTES.md).
//!
//! pd-sim's own endpoints live under `/sim/`: `GET /sim/stats` (ground truth) and
//! `POST /sim/fault` (change faults live, same names as the flags).
//!
//! Modelling decisions worth knowing, each SGLang's (`python/sglang/srt/managers/scheduler.py`
//! unless named otherwise):
//! - A generation that arrives before the engine is ready waits for readiness (as a
//!   request queued during warm-up would).
//! - *The running batch.* A generation is in it (the `running` gauge,
//!   `sglang:num_running_reqs`) from the moment it starts computing until it ends,
//!   including while it hangs (`--latency-script hang` on a request served whole),
//!   is frozen (`--freeze-after-tokens`) or has leaked its slot: such a request stays
//!   "running" and produces nothing. A routed *decode* part joins it only once its KV
//!   has arrived; before, it waits in the decode's prealloc and transfer queues
//!   (`python/sglang/srt/disaggregation/decode.py`), and a scripted `hang` of a decode
//!   part, or `--kv-stall`, waits there forever ([`receive_kv`]). A prefill part leaves
//!   it when its KV is ready; the room then waits in the prefill's inflight queue until
//!   its decode takes it ([`crate::bootstrap`]). `--serial` and `--max-running` cap the
//!   running batch (`--max-running-requests`): a decode part queues for them after its
//!   KV has arrived.
//! - *Batch results.* Every prefill chunk and every decode step is one: it counts
//!   towards `sglang:realtime_tokens_total` and answers a health check waiting on the
//!   scheduler ([`Sim::mark_output`]). pd-sim marks decode steps at least once per
//!   simulated second of generation, streamed or not, and at each token when a token
//!   takes longer; a request finishing or aborted by its client is one too.
//! - *Health* ([`health`]) does not queue for the `--serial` slot, but when the running
//!   batch is not empty it runs no pass of its own and waits for the next batch result.
//!   A leaked slot (the leaked request runs and produces nothing) therefore makes health
//!   503 after 20 s, as does a frozen or hung request in the running batch with nothing
//!   else producing, or a single prefill chunk longer than 20 s during an honest prefill
//!   (sgl-project/sglang#22511); a decode whose routed requests wait for their KV answers
//!   200. `/v1/models` stays 200 throughout (INCIDENTS row 4).
//! - *Counters* ([`metrics`]): SGLang's token and request counters rise only when a
//!   request finishes; `realtime_tokens_total` rises during work.
//!
//! A failed KV transfer — a stale bootstrap after a prefill restarted alone, or one
//! injected by `--kv-fail-every` — is answered one way ([`kv_transfer_failed`]), as
//! SGLang's decode answers it: `DecodeTransferQueue.pop_transferred`
//! (`python/sglang/srt/disaggregation/decode.py`) aborts the request with
//! `prepare_abort(req, "Decode transfer failed for request rank=… decode_req.req.rid=…
//! decode_req.req.bootstrap_room=… with exception KVTransferError(bootstrap_room=…): …",
//! status_code=500)`; the tokenizer manager (`python/sglang/srt/managers/tokenizer_manager.py`)
//! raises that as `fastapi.HTTPException(500, detail=message)` for a non-streamed request;
//! the OpenAI layer (`entrypoints/openai/serving_base.py`, `handle_request`) turns it into
//! `{"object":"error","message":…,"type":"500","param":null,"code":500}` and `/generate`
//! (`entrypoints/http_server.py`, which catches only `ValueError`) leaves it to FastAPI:
//! `{"detail": …}`. Both are HTTP 500. A streamed request gets the same 500 before its
//! stream starts (SGLang would open the stream and end it with the abort: a
//! simplification).
//!
//! A request counts as a probe when its `X-Request-Id` begins `pdwarden-probe-` (the
//! only tag that survives the router) or it carries `X-Pdwarden-Probe: 1`.
//!
//! *What* a chat completion answers: decoded greedily (`temperature` 0 or absent), its
//! tokens are [`crate::greedy`]'s model of the prompt and the engine's `--weights`, and
//! with `logprobs: true` its `choices[0].logprobs` is OpenAI's (`top_logprobs` entries:
//! min(the request's, 5)); streamed, each chunk carries its token's entry. A routed
//! decode answers from the weights its KV was computed with (the prefill's, over the
//! link) and its own: the same as a single engine when they agree, wrong when they
//! differ. `--kv-corruption` (a routed decode) and `--kv-reuse-under-load` make it wrong
//! from `--corrupt-from-position`; `--near-tie-positions` flip with the start. A sampled
//! chat completion (`temperature` > 0) and `/generate` answer the fixed filler text
//! ("The quick brown fox …"), without logprobs.

use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, sleep_until, timeout_at};

use pdwarden_engines::{SGLANG, Signal};

use crate::bootstrap::FAKE_BOOTSTRAP_HOST;
use crate::clock::far_after;
use crate::config::{FaultPatch, Role, Settings};
use crate::engine::{Admission, EngineState, Part, Plan, Shape, count_tokens};
use crate::greedy::{self, GreedyToken};
use crate::state::Sim;
use crate::stats::{Counters, Phase};

/// The request-id prefix that marks a pdwarden probe.
pub const PROBE_ID_PREFIX: &str = "pdwarden-probe-";
// The SGLang release imitated is `--sglang-version`; its default, 0.5.9, is the first
// release with all of what pd-sim models — `sglang:realtime_tokens_total` (v0.5.7),
// counted per prefill chunk after its forward pass (#17836, v0.5.9) and per decode
// iteration, and health generation on `/health` by default (v0.5.5.post3); the PD
// gauges are older. An older release exposes less (`exposed`).
/// SGLang's health handler checks for scheduler output once a second.
const HEALTH_TICK_MS: f64 = 1000.0;

pub fn router(sim: Arc<Sim>) -> Router {
    Router::new()
        .route("/health", get(health_endpoint))
        .route("/health_generate", get(health))
        .route("/v1/models", get(models))
        .route("/server_info", get(server_info))
        .route("/get_server_info", get(server_info))
        .route("/model_info", get(model_info))
        .route("/get_model_info", get(model_info))
        .route("/metrics", get(metrics))
        .route("/v1/chat/completions", axum::routing::post(chat))
        .route("/generate", axum::routing::post(generate).put(generate))
        .route("/sim/stats", get(sim_stats))
        .route("/sim/fault", get(sim_fault_get).post(sim_fault))
        .fallback(unknown)
        .with_state(sim)
}

/// An error in SGLang's `ErrorResponse` shape.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    message: String,
    /// The `type` field; None = the status's reason phrase.
    err_type: Option<String>,
}

impl ApiError {
    fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            err_type: None,
        }
    }

    /// What SGLang's OpenAI layer makes of an `HTTPException`: `type` is the status code.
    fn http_exception(status: StatusCode, message: String) -> ApiError {
        ApiError {
            status,
            message,
            err_type: Some(status.as_u16().to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "object": "error",
            "message": self.message,
            "type": self
                .err_type
                .as_deref()
                .unwrap_or(self.status.canonical_reason().unwrap_or("Error")),
            "param": null,
            "code": self.status.as_u16(),
        });
        (self.status, Json(body)).into_response()
    }
}

// The OpenAI `created` field is calendar time: read at this HTTP edge.
#[allow(clippy::disallowed_methods)]
fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Logs what a caller expected that pd-sim does not serve (to spot a router's new calls).
async fn unknown(method: axum::http::Method, uri: axum::http::Uri) -> StatusCode {
    tracing::warn!(%method, %uri, "no such endpoint in pd-sim");
    StatusCode::NOT_FOUND
}

// ---------------------------------------------------------------- health

/// SGLang's shared `/health` + `/health_generate` handler (`health_generate` in
/// `python/sglang/srt/entrypoints/http_server.py`): 503 while starting; then a one-token
/// request to the scheduler, and every second `tokenizer_manager.last_receive_tstamp >
/// tic` → 200, 503 after `SGLANG_HEALTH_CHECK_TIMEOUT` (20 s). Any output of any request
/// counts ([`Sim::mark_output`]).
///
/// The scheduler runs the health request as a generation of its own only when it is
/// idle. Busy, it drops it and answers with its next batch result instead
/// (`Scheduler.process_input_requests` in `python/sglang/srt/managers/scheduler.py`:
/// `is_health_check_generate_req(recv_req) and not self.is_fully_idle(...)` → queue the
/// reply; `maybe_send_health_check_signal` sends a `HealthCheckOutput` after every
/// `process_batch_result`; `return_health_check_ct` in older releases). pd-sim's "busy"
/// is requests in the running batch or the waiting queue (the `running` and `queued`
/// gauges) when the check starts — `is_fully_idle(for_health_check=True)`; up to v0.5.9
/// the rule looked at the running batch and the chunked request only, which in pd-sim
/// is the same since nothing queues while nothing runs. The PD queues (a decode's
/// requests waiting for their KV, a prefill's rooms waiting to be taken) do not count,
/// as SGLang ignores them. Busy, no pass of its own runs: health is
/// 200 only if some batch result — a prefill chunk, a decode step, a request finishing
/// or aborted — comes within the timeout. So a single forward pass (a prefill chunk)
/// longer than 20 s, a leaked slot or a frozen request in the running batch, with
/// nothing else producing output, make health 503 (sgl-project/sglang#22511).
/// `/health`: before v0.4.10.post2 SGLang answered 200 unconditionally here
/// (`async def health(): return Response(status_code=200)`); since, it is
/// `health_generate` (sgl-project/sglang#8444), unless
/// `SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION` is false (v0.5.5.post3, #13320):
/// then 200 at once once the server is up.
async fn health_endpoint(state: State<Arc<Sim>>) -> StatusCode {
    if !state.0.config.health_endpoint_generates {
        if state.0.phase() != Phase::Ready
            && pdwarden_engines::release_at_least(
                &state.0.config.sglang_version,
                pdwarden_engines::SGLANG_HEALTH_STARTING_503_SINCE,
            )
        {
            return StatusCode::SERVICE_UNAVAILABLE;
        }
        return StatusCode::OK;
    }
    health(state).await
}

async fn health(State(sim): State<Arc<Sim>>) -> StatusCode {
    if sim.phase() != Phase::Ready {
        // Before v0.5.1 there was no Starting status: a health generation
        // that arrives early queues like any other request.
        if pdwarden_engines::release_at_least(
            &sim.config.sglang_version,
            pdwarden_engines::SGLANG_HEALTH_STARTING_503_SINCE,
        ) {
            return StatusCode::SERVICE_UNAVAILABLE;
        }
        sim.wait_ready().await;
    }
    let busy = sim.stats.update(|c| {
        c.health_requests += 1;
        let busy = c.running > 0 || c.queued > 0;
        if busy {
            c.health_waited_on_batch += 1;
        }
        busy
    });
    let scale = sim.scale();
    let tic = Instant::now();
    let tic_ns = sim.clock.origin.elapsed().as_nanos() as u64;
    let deadline = far_after(tic, scale.real(sim.config.health_timeout_ms));
    // Idle: the one-token pass, with a fake bootstrap (it never crosses the PD link).
    // Busy: no pass; only the scheduler's next batch result answers.
    let plan = (!busy).then(|| EngineState::health_plan(&sim.settings()));
    let pass_sim = sim.clone();
    let mut pass = pin!(async move {
        match plan {
            None | Some(Plan::Hang) => std::future::pending::<()>().await,
            Some(Plan::Timed { ready_ms, .. }) => {
                tokio::time::sleep(scale.real(ready_ms)).await;
                pass_sim.mark_output();
            }
        }
    });
    let step = scale.real(HEALTH_TICK_MS);
    let mut pass_done = false;
    while Instant::now() < deadline {
        let tick = far_after(Instant::now(), step);
        if !pass_done && timeout_at(tick, &mut pass).await.is_ok() {
            pass_done = true;
        }
        sleep_until(tick).await;
        if sim.last_output_ns() > tic_ns {
            sim.stats.update(|c| c.health_ok += 1);
            return StatusCode::OK;
        }
    }
    sim.stats.update(|c| c.health_failed += 1);
    tracing::warn!(
        busy,
        "health check failed: no scheduler output for {} ms",
        sim.config.health_timeout_ms
    );
    StatusCode::SERVICE_UNAVAILABLE
}

// ---------------------------------------------------------------- info

async fn models(State(sim): State<Arc<Sim>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": sim.config.model,
            "object": "model",
            "created": unix_secs(),
            "owned_by": "sglang",
            "root": sim.config.model,
            "max_model_len": 32768,
        }],
    }))
}

async fn model_info(State(sim): State<Arc<Sim>>) -> Json<Value> {
    Json(json!({
        "model_path": sim.config.model,
        "tokenizer_path": sim.config.model,
        "is_generation": true,
        "preferred_sampling_params": null,
        "weight_version": "default",
        "has_image_understanding": false,
        "has_audio_understanding": false,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
    }))
}

async fn server_info(State(sim): State<Arc<Sim>>) -> Json<Value> {
    let c = sim.stats.snapshot();
    let s = sim.settings();
    let bound = sim.stats_snapshot();
    let bootstrap_port = bound
        .bootstrap_addr
        .as_deref()
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse::<u16>().ok());
    Json(json!({
        "model_path": sim.config.model,
        "tokenizer_path": sim.config.model,
        "served_model_name": sim.config.model,
        "host": sim.config.host,
        "port": bound.http_addr.as_deref().and_then(|a| a.rsplit(':').next()).and_then(|p| p.parse::<u16>().ok()),
        "disaggregation_mode": sim.config.role.as_str(),
        "disaggregation_bootstrap_port": bootstrap_port,
        "disaggregation_transfer_backend": "pd-sim",
        "tp_size": 1,
        "dp_size": 1,
        "pp_size": 1,
        "max_running_requests": if s.serial { 1 } else { 256 },
        "max_total_num_tokens": 65536,
        "max_req_input_len": 32768,
        "chunked_prefill_size": sim.config.chunked_prefill_size.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX)),
        "page_size": 1,
        "internal_states": [{
            "last_gen_throughput": gen_throughput(&c, s.tpot_ms),
            "memory_usage": {"weight": 0.0, "kvcache": 0.0, "token_capacity": 65536},
        }],
        "version": sim.config.sglang_version,
        "pd_sim": {"instance_id": sim.instance_id, "phase": sim.phase(), "weights": s.weights},
    }))
}

fn gen_throughput(c: &Counters, tpot_ms: f64) -> f64 {
    if tpot_ms > 0.0 {
        c.running as f64 * 1000.0 / tpot_ms
    } else {
        0.0
    }
}

/// The Prometheus name SGLang gives `signal`, from [`SGLANG`] — the table pdwarden's
/// agent reads too, so the two cannot disagree on a name.
fn sglang_name(signal: Signal) -> &'static str {
    match SGLANG.metric(signal) {
        Some(m) => m.name,
        None => panic!("the SGLang profile names no metric for {signal:?}"),
    }
}

/// Prometheus text with SGLang's metric names (`python/sglang/srt/metrics/collector.py`,
/// served with `--enable-metrics`), each labelled `model_name`.
///
/// - `sglang:num_requests_total`, `sglang:prompt_tokens_total` and
///   `sglang:generation_tokens_total` rise only when a request finishes — answered,
///   failed or aborted — as `TokenizerMetricsCollector.observe_one_finished_request`
///   increments them: a long request moves none of them until its end. (`/sim/stats`'
///   `requests_total` and `prompt_tokens_total` keep pd-sim's meanings: arrivals and
///   admissions.)
/// - `sglang:realtime_tokens_total{mode="prefill_compute"|"prefill_cache"|"decode"}`
///   rises during work (`SchedulerMetricsCollector.increment_realtime_tokens`): by each
///   prefill chunk's tokens when the chunk's forward pass completes, and by the tokens of
///   each decode step (pd-sim reports them at least once a simulated second). A hung or
///   frozen request adds nothing.
/// - The PD gauges and counters (`python/sglang/srt/disaggregation/prefill.py`,
///   `decode.py`): a prefill's inflight queue (rooms computed, not yet taken by their
///   decode) and its bootstrap (prealloc) queue, always 0 here because pd-sim's prefill
///   does not wait for its decode's bootstrap before computing; a decode's prealloc
///   queue (requests in their bootstrap handshake) and transfer queue (waiting for their
///   KV); bootstrap and transfer failures on both. With `--lazy-failure-counters` the two
///   failure counters (families included) are absent until their first increment, as
///   SGLang's labelled counters are (`SchedulerMetricsCollector` in `collector.py`,
///   `increment_bootstrap_failed_reqs`/`increment_transfer_failed_reqs`); without it they
///   read 0 from the start.
/// - Gauges are current at every scrape; SGLang refreshes them only when it logs stats
///   (each prefill batch, every `--decode-log-interval` decode steps, every 30 s idle),
///   which pd-sim does not model.
async fn metrics(State(sim): State<Arc<Sim>>) -> Response {
    let c = sim.stats.snapshot();
    let s = sim.settings();
    let model = format!("model_name=\"{}\"", sim.config.model.replace('"', "'"));
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, samples: &[(&str, f64)]| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (extra, value) in samples {
            let labels = if extra.is_empty() {
                model.clone()
            } else {
                format!("{model},{extra}")
            };
            out.push_str(&format!("{name}{{{labels}}} {value}\n"));
        }
    };
    let n = |v: u64| v as f64;
    family(
        sglang_name(Signal::RunningReqs),
        "gauge",
        "The number of running requests.",
        &[("", n(c.running))],
    );
    family(
        sglang_name(Signal::QueuedReqs),
        "gauge",
        "The number of requests in the waiting queue.",
        &[("", n(c.queued))],
    );
    let (bootstrap_failed, transfer_failed) = match sim.config.role {
        Role::Prefill => {
            family(
                sglang_name(Signal::PrefillPreallocQueue),
                "gauge",
                "The number of requests in the prefill prealloc queue.",
                &[("", 0.0)],
            );
            family(
                sglang_name(Signal::PrefillInflightQueue),
                "gauge",
                "The number of requests in the prefill inflight queue.",
                &[("", n(c.prefill_inflight))],
            );
            (0, c.kv_rooms_failed)
        }
        Role::Decode => {
            family(
                sglang_name(Signal::DecodePreallocQueue),
                "gauge",
                "The number of requests in the decode prealloc queue.",
                &[("", n(c.decode_prealloc))],
            );
            family(
                sglang_name(Signal::DecodeTransferQueue),
                "gauge",
                "The number of requests in the decode transfer queue.",
                &[("", n(c.transfer_waiting))],
            );
            (
                c.bootstrap_failed,
                c.kv_transfers_failed.saturating_sub(c.bootstrap_failed),
            )
        }
    };
    // `--lazy-failure-counters`: a labelled prometheus_client counter has no series
    // before its first increment (see the flag).
    let lazy = sim.config.lazy_failure_counters;
    if !lazy || bootstrap_failed > 0 {
        family(
            sglang_name(Signal::BootstrapFailed),
            "counter",
            "The number of bootstrap failed requests.",
            &[("", n(bootstrap_failed))],
        );
    }
    if !lazy || transfer_failed > 0 {
        family(
            sglang_name(Signal::TransferFailed),
            "counter",
            "The number of transfer failed requests.",
            &[("", n(transfer_failed))],
        );
    }
    family(
        sglang_name(Signal::GenThroughput),
        "gauge",
        "The generation throughput (token/s).",
        &[("", gen_throughput(&c, s.tpot_ms))],
    );
    family(
        "sglang:num_used_tokens",
        "gauge",
        "The number of used tokens.",
        &[("", 0.0)],
    );
    family("sglang:token_usage", "gauge", "The token usage.", &[("", 0.0)]);
    family(
        "sglang:cache_hit_rate",
        "gauge",
        "The prefix cache hit rate.",
        &[("", 0.0)],
    );
    family(
        sglang_name(Signal::PromptTokens),
        "counter",
        "Number of prefill tokens processed.",
        &[("", n(c.finished_prompt_tokens_total))],
    );
    family(
        sglang_name(Signal::GenerationTokens),
        "counter",
        "Number of generation tokens processed.",
        &[("", n(c.finished_generation_tokens_total))],
    );
    family(
        sglang_name(Signal::Requests),
        "counter",
        "Number of requests processed.",
        &[("", n(c.finished_requests_total))],
    );
    family(
        sglang_name(Signal::AbortedRequests),
        "counter",
        "Number of requests aborted.",
        &[("", n(c.disconnected))],
    );
    family(
        sglang_name(Signal::RealtimeTokens),
        "counter",
        "Total number of tokens processed (updated on each log interval).",
        &[
            ("mode=\"prefill_compute\"", n(c.realtime_prefill_compute_tokens)),
            ("mode=\"prefill_cache\"", n(c.realtime_prefill_cache_tokens)),
            ("mode=\"decode\"", n(c.realtime_decode_tokens)),
        ],
    );
    let out = exposed(&out, &sim.config.sglang_version);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        out,
    )
        .into_response()
}

/// Drops the families the imitated release does not expose yet (the
/// profile's `since` of each name); names the profile does not list stay.
fn exposed(text: &str, version: &str) -> String {
    text.lines()
        .filter(|line| {
            let name = line
                .strip_prefix("# HELP ")
                .or_else(|| line.strip_prefix("# TYPE "))
                .unwrap_or(line)
                .split(['{', ' '])
                .next()
                .unwrap_or("");
            SGLANG
                .metrics
                .iter()
                .find(|m| m.name == name)
                .is_none_or(|m| m.exposed_by(version))
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

// ---------------------------------------------------------------- sim API

async fn sim_stats(State(sim): State<Arc<Sim>>) -> Response {
    Json(sim.stats_snapshot()).into_response()
}

async fn sim_fault_get(State(sim): State<Arc<Sim>>) -> Response {
    let snap = sim.stats_snapshot();
    Json(json!({
        "settings": snap.settings,
        "latency_script_remaining": snap.latency_script_remaining,
    }))
    .into_response()
}

async fn sim_fault(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    let patch: FaultPatch = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => return ApiError::bad_request(format!("bad fault body: {e}")).into_response(),
    };
    if let Err(e) = sim.apply_fault(&patch) {
        return ApiError::bad_request(e.to_string()).into_response();
    }
    sim_fault_get(State(sim)).await
}

// ---------------------------------------------------------------- generation

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Chat,
    Generate,
}

/// Where this engine's share of a routed request comes from or goes to.
#[derive(Clone, Debug, PartialEq)]
enum Transfer {
    /// Served alone.
    None,
    /// Prefill of a routed pair: publish the room's KV when computed.
    Publish { room: u64 },
    /// Decode of a routed pair: pull the room's KV from the prefill's bootstrap.
    Pull { host: String, port: u16, room: u64 },
}

/// A client generation request, parsed.
#[derive(Clone, Debug)]
struct GenRequest {
    kind: Kind,
    prompt: String,
    max_tokens: u64,
    stream: bool,
    include_usage: bool,
    model: String,
    rid: String,
    probe: bool,
    transfer: Transfer,
    /// A chat completion decoded greedily (`temperature` 0 or absent): its tokens are
    /// the model's ([`crate::greedy`]); otherwise the fixed filler text.
    greedy: bool,
    /// `logprobs: true`: Some(the `top_logprobs` entries to give, at most 5).
    logprobs: Option<usize>,
}

fn header_str<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

fn as_u64(v: &Value) -> Option<u64> {
    v.as_u64()
        .or_else(|| v.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
}

fn parse_request(
    kind: Kind,
    role: Role,
    default_model: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<GenRequest, ApiError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?;
    let greedy = kind == Kind::Chat && v.get("temperature").and_then(Value::as_f64).is_none_or(|t| t == 0.0);
    let logprobs = (kind == Kind::Chat && v.get("logprobs").and_then(Value::as_bool) == Some(true)).then(|| {
        v.get("top_logprobs")
            .and_then(as_u64)
            .map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX))
            .min(greedy::MAX_TOP_LOGPROBS)
    });
    let (prompt, max_tokens) = match kind {
        Kind::Chat => {
            let msgs = v
                .get("messages")
                .and_then(Value::as_array)
                .ok_or_else(|| ApiError::bad_request("`messages` is required"))?;
            let prompt = msgs
                .iter()
                .filter_map(|m| match m.get("content") {
                    Some(Value::String(s)) => Some(s.clone()),
                    Some(Value::Array(parts)) => Some(
                        parts
                            .iter()
                            .filter_map(|p| p.get("text").and_then(Value::as_str))
                            .collect::<Vec<_>>()
                            .join(" "),
                    ),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n");
            let max = v
                .get("max_completion_tokens")
                .and_then(as_u64)
                .or_else(|| v.get("max_tokens").and_then(as_u64))
                .unwrap_or(16);
            (prompt, max)
        }
        Kind::Generate => {
            let prompt = match (v.get("text"), v.get("input_ids")) {
                (Some(Value::String(s)), _) => s.clone(),
                (Some(Value::Array(a)), _) => a.first().and_then(Value::as_str).unwrap_or_default().to_string(),
                (_, Some(Value::Array(ids))) => ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(" "),
                _ => return Err(ApiError::bad_request("`text` or `input_ids` is required")),
            };
            let max = v
                .pointer("/sampling_params/max_new_tokens")
                .and_then(as_u64)
                .unwrap_or(128);
            (prompt, max)
        }
    };
    let rid = header_str(headers, "x-request-id")
        .map(str::to_string)
        .or_else(|| v.get("rid").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
    let probe = rid.starts_with(PROBE_ID_PREFIX) || header_str(headers, "x-pdwarden-probe").map(str::trim) == Some("1");
    let host = v.get("bootstrap_host").and_then(Value::as_str);
    let port = v
        .get("bootstrap_port")
        .and_then(as_u64)
        .and_then(|p| u16::try_from(p).ok());
    let room = v.get("bootstrap_room").and_then(as_u64);
    let transfer = match (role, host, port, room) {
        (_, Some(FAKE_BOOTSTRAP_HOST), _, _) => Transfer::None,
        (Role::Prefill, _, _, Some(room)) => Transfer::Publish { room },
        (Role::Decode, Some(host), Some(port), Some(room)) => Transfer::Pull {
            host: host.to_string(),
            port,
            room,
        },
        _ => Transfer::None,
    };
    Ok(GenRequest {
        kind,
        prompt,
        max_tokens: max_tokens.max(1),
        stream: v.get("stream").and_then(Value::as_bool).unwrap_or(false),
        include_usage: v
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        model: v
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or(default_model)
            .to_string(),
        rid,
        probe,
        transfer,
        greedy,
        logprobs,
    })
}

async fn chat(State(sim): State<Arc<Sim>>, headers: HeaderMap, body: Bytes) -> Response {
    match parse_request(Kind::Chat, sim.config.role, &sim.config.model, &headers, &body) {
        Ok(req) => serve_generation(sim, req).await,
        Err(e) => e.into_response(),
    }
}

async fn generate(State(sim): State<Arc<Sim>>, headers: HeaderMap, body: Bytes) -> Response {
    match parse_request(Kind::Generate, sim.config.role, &sim.config.model, &headers, &body) {
        Ok(req) => serve_generation(sim, req).await,
        Err(e) => e.into_response(),
    }
}

/// A gauge held up by one request while it lives.
struct GaugeGuard {
    sim: Arc<Sim>,
    field: fn(&mut Counters) -> &mut u64,
}

impl GaugeGuard {
    fn new(sim: &Arc<Sim>, field: fn(&mut Counters) -> &mut u64) -> GaugeGuard {
        sim.stats.update(|c| *field(c) += 1);
        GaugeGuard {
            sim: sim.clone(),
            field,
        }
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        let f = self.field;
        self.sim.stats.update(|c| *f(c) = f(c).saturating_sub(1));
    }
}

/// One client generation in flight. Dropped without `done` means the client went
/// away; before the first token, with `--leak-slot-on-disconnect`, the serial slot
/// goes with it and is never returned.
struct Inflight {
    sim: Arc<Sim>,
    rid: String,
    prompt_tokens: u64,
    permit: Option<OwnedSemaphorePermit>,
    running: Option<GaugeGuard>,
    /// Output tokens produced so far.
    tokens_done: u64,
    done: bool,
}

impl Inflight {
    /// The request finished — answered in full or with an error — and counts where
    /// SGLang's `TokenizerMetricsCollector.observe_one_finished_request`
    /// (`python/sglang/srt/metrics/collector.py`) counts it: `num_requests_total` and its
    /// prompt and output tokens, only now.
    fn finish(&mut self) {
        self.done = true;
        let (prompt, generated) = (self.prompt_tokens, self.tokens_done);
        self.sim.stats.update(|c| {
            c.finished_requests_total += 1;
            c.finished_prompt_tokens_total += prompt;
            c.finished_generation_tokens_total += generated;
        });
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let leak = self.tokens_done == 0 && self.permit.is_some() && self.sim.settings().leak_slot_on_disconnect;
        let (prompt, generated) = (self.prompt_tokens, self.tokens_done);
        self.sim.stats.update(|c| {
            c.disconnected += 1;
            if leak {
                c.leaked_slots += 1;
            } else {
                // SGLang aborts the request (`TokenizerManager.abort_request` →
                // `Scheduler.abort_request`) and it finishes as aborted: counted by
                // `observe_one_finished_request` with the tokens it had.
                c.finished_requests_total += 1;
                c.finished_prompt_tokens_total += prompt;
                c.finished_generation_tokens_total += generated;
            }
        });
        if leak {
            if let Some(p) = self.permit.take() {
                p.forget();
            }
            // The scheduler still thinks the request runs: num_running_reqs stays up,
            // and it never produces a batch result again.
            if let Some(g) = self.running.take() {
                std::mem::forget(g);
            }
            tracing::warn!(rid = %self.rid, "client disconnected before its first token: the serial slot is leaked");
        } else {
            // The abort reaches the tokenizer manager as an output.
            self.sim.mark_output();
            tracing::info!(rid = %self.rid, "client disconnected");
        }
    }
}

/// Queues for the `--serial` slot and a `--max-running` slot: SGLang's cap on the
/// running batch (`--max-running-requests`). The serial permit goes in `inflight` (it
/// can leak); the `--max-running` one is returned, held until the generation ends.
async fn take_slots(sim: &Arc<Sim>, settings: &Settings, inflight: &mut Inflight) -> Option<OwnedSemaphorePermit> {
    if settings.serial {
        let _queued = GaugeGuard::new(sim, |c| &mut c.queued);
        inflight.permit = sim.slot.clone().acquire_owned().await.ok();
    }
    match &sim.running_slots {
        Some(slots) => {
            let _queued = GaugeGuard::new(sim, |c| &mut c.queued);
            slots.clone().acquire_owned().await.ok()
        }
        None => None,
    }
}

/// Runs the prefill's chunks on schedule ([`Admission::prefill_chunks`]). Each chunk's
/// forward pass is a batch result: it adds its tokens to `sglang:realtime_tokens_total`
/// (`report_prefill_stats` in `python/sglang/srt/managers/scheduler_components/metrics_reporter.py`,
/// after every prefill batch) and answers a waiting health check
/// (`maybe_send_health_check_signal` after `process_batch_result`). The last chunk ends
/// exactly at the plan's `ready_ms`.
async fn run_prefill(sim: &Sim, admission: &Admission, start: Instant) {
    let scale = sim.scale();
    for chunk in admission.prefill_chunks(sim.config.chunked_prefill_size) {
        sleep_until(far_after(start, scale.real(chunk.done_ms))).await;
        sim.stats.update(|c| {
            c.realtime_prefill_compute_tokens += chunk.compute_tokens;
            c.realtime_prefill_cache_tokens += chunk.cache_tokens;
        });
        sim.mark_output();
    }
}

/// When token `k` (1-based) is due: `t0 + k × per`, in whole nanoseconds so that
/// [`tokens_by`] agrees with it exactly.
fn token_at(t0: Instant, per: Duration, k: u64) -> Instant {
    let ns = per.as_nanos().saturating_mul(u128::from(k));
    far_after(t0, Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX)))
}

/// How many tokens are due by `now` (all of them when tokens cost nothing).
fn tokens_by(t0: Instant, per: Duration, now: Instant) -> u64 {
    if per.is_zero() {
        return u64::MAX;
    }
    u64::try_from(now.saturating_duration_since(t0).as_nanos() / per.as_nanos()).unwrap_or(u64::MAX)
}

/// Produces tokens `inflight.tokens_done + 1 ..= upto` of a non-streamed generation on
/// schedule. Every decode step is a batch result in SGLang: it adds the batch's tokens
/// to `realtime_tokens_total{mode="decode"}` (`report_decode_stats` in
/// `metrics_reporter.py`, every iteration) and answers a waiting health check. pd-sim
/// does both whenever tokens were produced, at least once per simulated second (at
/// every token when a token takes longer), not at every token: scaled time can make
/// tokens sub-millisecond. `decode_steps` is false for a prefill part, whose one token
/// comes from its prefill pass.
async fn produce(sim: &Sim, inflight: &mut Inflight, t0: Instant, per: Duration, upto: u64, decode_steps: bool) {
    let second = sim.scale().real(1000.0);
    while inflight.tokens_done < upto {
        let done = inflight.tokens_done;
        let wake = far_after(Instant::now(), second)
            .max(token_at(t0, per, done + 1))
            .min(token_at(t0, per, upto));
        sleep_until(wake).await;
        let k = tokens_by(t0, per, Instant::now()).min(upto);
        if k > done {
            inflight.tokens_done = k;
            if decode_steps {
                sim.stats.update(|c| c.realtime_decode_tokens += k - done);
            }
            sim.mark_output();
        }
    }
}

/// The decode part of a routed request, up to the moment its KV has arrived. It waits
/// in SGLang's decode queues, not in the running batch (`python/sglang/srt/disaggregation/decode.py`):
/// `DecodePreallocQueue` while it bootstraps with the prefill (the handshake), then
/// `DecodeTransferQueue` until `KVPoll.Success`; the decode's own fixed costs overlap the
/// wait. So a decode whose requests wait on their KV has nothing running, runs health's
/// own pass and answers 200 (the pass uses a fake bootstrap and never crosses the link):
/// "health 200 while generation hangs" (seeds 002, 003). Here:
/// - a scripted `hang` waits in the transfer queue forever, and never pulls its KV (the
///   prefill's room stays inflight);
/// - `--kv-stall`: the same, for every routed request admitted while it is on;
/// - `--kv-fail-every`: the transfer fails when the decode would have started on the
///   request; both ends see `KVPoll.Failed` (`DecodeTransferQueue.pop_transferred`
///   aborts the request with a 500);
/// - a handshake that fails is a bootstrap failure, a pull that fails a transfer
///   failure, both answered with that 500;
/// - `--kv-transfer-ms`: the prefill holds the KV that long after it is ready.
///
/// `Err` is the answer to send.
#[allow(clippy::too_many_arguments)]
async fn receive_kv(
    sim: &Arc<Sim>,
    settings: &Settings,
    req: &GenRequest,
    admission: &Admission,
    start: Instant,
    (host, port, room): (&str, u16, u64),
    inflight: &mut Inflight,
) -> Result<Option<String>, Response> {
    let Some(client) = &sim.bootstrap_client else {
        unreachable!("a decode always has a bootstrap client");
    };
    let scale = sim.scale();
    let waiting = GaugeGuard::new(sim, |c| &mut c.transfer_waiting);
    let Plan::Timed { ready_ms, .. } = admission.plan else {
        tracing::info!(rid = %req.rid, room, "scripted hang: this request waits for its KV forever");
        let never = std::future::pending::<std::convert::Infallible>().await;
        match never {}
    };
    if settings.kv_stall {
        sim.stats.update(|c| c.kv_stalled_requests += 1);
        tracing::warn!(rid = %req.rid, room, "--kv-stall: this request's KV never arrives");
        let never = std::future::pending::<std::convert::Infallible>().await;
        match never {}
    }
    let ready_at = far_after(start, scale.real(ready_ms));
    if admission.kv_fail {
        // `--kv-fail-every`: the transfer is lost; the decode notices when it would have
        // started on the request, and never pulls the room's KV.
        sleep_until(ready_at).await;
        drop(waiting);
        sim.stats.update(|c| c.kv_failures_injected += 1);
        let report = client.report_failed(host, port, room);
        let _ = tokio::time::timeout(Duration::from_secs(1), report).await;
        inflight.finish();
        let reason = format!(
            "KV transfer failed: injected by --kv-fail-every {} (routed request {})",
            settings.kv_fail_every,
            admission.routed_seq.unwrap_or_default()
        );
        return Err(kv_transfer_failed(sim, req, room, &reason));
    }
    drop(waiting);
    let prealloc = GaugeGuard::new(sim, |c| &mut c.decode_prealloc);
    let handshake = client.handshake(host, port).await;
    drop(prealloc);
    if let Err(e) = handshake {
        sim.stats.update(|c| c.bootstrap_failed += 1);
        inflight.finish();
        return Err(kv_transfer_failed(sim, req, room, &format!("KV transfer failed: {e}")));
    }
    let waiting = GaugeGuard::new(sim, |c| &mut c.transfer_waiting);
    if settings.kv_transfer_ms > 0.0 {
        sim.stats.update(|c| c.kv_transfers_delayed += 1);
    }
    let hold = scale.real(settings.kv_transfer_ms);
    let (kv, ()) = tokio::join!(client.fetch_kv(host, port, room, hold), sleep_until(ready_at));
    drop(waiting);
    let prefill_weights = match kv {
        Ok(w) => w,
        Err(e) => {
            inflight.finish();
            return Err(kv_transfer_failed(sim, req, room, &format!("KV transfer failed: {e}")));
        }
    };
    sim.stats.update(|c| c.kv_transfers_ok += 1);
    Ok(prefill_weights)
}

/// What decides a greedy answer besides the prompt and the live settings.
struct GreedyCtx {
    part: Part,
    /// A routed decode: the weights its KV was computed with.
    prefill_weights: Option<String>,
    /// This start's near-tie parity ([`Sim::near_ties_flipped`]).
    flipped: bool,
    /// The most requests seen in the running batch (this one included) at the
    /// moments `--kv-reuse-under-load` looks: the first token, and the last of a
    /// non-streamed answer.
    load_peak: u64,
}

impl GreedyCtx {
    /// The model's answer ([`crate::greedy::answer`]) when `req` is decoded greedily.
    /// `--kv-corruption` corrupts a routed decode's answer (its KV came over the link);
    /// `--kv-reuse-under-load` any answer generated under load.
    fn answer(&self, sim: &Sim, s: &Settings, req: &GenRequest, tokens: u64) -> Option<Vec<GreedyToken>> {
        if !req.greedy {
            return None;
        }
        let corrupted = (s.kv_corruption && self.part == Part::Decode)
            || (s.kv_reuse_under_load && self.load_peak >= s.kv_reuse_min_running);
        let corrupt_from = corrupted.then_some(s.corrupt_from_position);
        let mixed = self.prefill_weights.as_deref().filter(|w| *w != s.weights);
        sim.stats.update(|c| {
            c.greedy_answers += 1;
            c.corrupted_answers += u64::from(corrupt_from.is_some_and(|k| k < tokens));
            c.mixed_weights_answers += u64::from(mixed.is_some());
        });
        if let Some(w) = mixed {
            tracing::warn!(rid = %req.rid, prefill_weights = w, weights = %s.weights, "KV computed with other weights: the answer is wrong");
        }
        Some(greedy::answer(&greedy::Answer {
            prompt: &req.prompt,
            weights: &s.weights,
            prefill_weights: mixed,
            near_tie_positions: &s.near_tie_positions,
            flipped: self.flipped,
            corrupt_from,
            tokens,
        }))
    }
}

async fn serve_generation(sim: Arc<Sim>, req: GenRequest) -> Response {
    let prompt_tokens = count_tokens(&req.prompt);
    sim.stats.update(|c| {
        c.requests_total += 1;
        c.probe_requests += u64::from(req.probe);
        match req.kind {
            Kind::Chat => c.chat_requests += 1,
            Kind::Generate => c.generate_requests += 1,
        }
        c.stream_requests += u64::from(req.stream);
    });
    let arrived = Instant::now();
    let mut inflight = Inflight {
        sim: sim.clone(),
        rid: req.rid.clone(),
        prompt_tokens,
        permit: None,
        running: None,
        tokens_done: 0,
        done: false,
    };
    sim.wait_ready().await;
    let settings = sim.settings();
    let part = match req.transfer {
        Transfer::None => Part::Whole,
        Transfer::Publish { .. } => Part::Prefill,
        Transfer::Pull { .. } => Part::Decode,
    };
    // A decode part queues for the running batch only once its KV has arrived.
    let mut running_slot = match part {
        Part::Decode => None,
        Part::Whole | Part::Prefill => take_slots(&sim, &settings, &mut inflight).await,
    };
    let admission = {
        let shape = Shape {
            prompt: &req.prompt,
            prompt_tokens,
            max_tokens: req.max_tokens,
            part,
        };
        let now = sim.clock.now_ms();
        let mut engine = sim.engine.lock().unwrap_or_else(|e| e.into_inner());
        engine.admit(&settings, &shape, now)
    };
    let cost = admission.plan.cost_ms();
    sim.stats.update(|c| {
        c.busy_ms_total += cost;
        if req.probe {
            c.busy_ms_probe += cost;
        }
        c.prompt_tokens_total += prompt_tokens;
    });
    if admission.relapsed {
        sim.stats.update(|c| c.relapsed_requests += 1);
    }
    if admission.minted_session {
        tracing::debug!(rid = %req.rid, "session minted");
    }
    let start = Instant::now();
    let scale = sim.scale();
    let mut prefill_weights = None;
    match &req.transfer {
        Transfer::Pull { host, port, room } => {
            match receive_kv(
                &sim,
                &settings,
                &req,
                &admission,
                start,
                (host, *port, *room),
                &mut inflight,
            )
            .await
            {
                Ok(w) => prefill_weights = w,
                Err(answer) => return answer,
            }
            running_slot = take_slots(&sim, &settings, &mut inflight).await;
            inflight.running = Some(GaugeGuard::new(&sim, |c| &mut c.running));
        }
        Transfer::None | Transfer::Publish { .. } => {
            inflight.running = Some(GaugeGuard::new(&sim, |c| &mut c.running));
            if admission.plan == Plan::Hang {
                // In the running batch, producing nothing, ever.
                tracing::info!(rid = %req.rid, "scripted hang: this request never answers");
                let never = std::future::pending::<std::convert::Infallible>().await;
                match never {}
            }
            run_prefill(&sim, &admission, start).await;
            if let (Transfer::Publish { room }, Some(b)) = (&req.transfer, &sim.bootstrap_server) {
                b.kv_ready(*room, &settings.weights);
            }
        }
    }
    let Plan::Timed {
        per_token_ms, tokens, ..
    } = admission.plan
    else {
        unreachable!("a hang never gets this far");
    };
    let decode_steps = part != Part::Prefill;
    let t0 = Instant::now();
    let per = scale.real(per_token_ms);
    sleep_until(token_at(t0, per, 1)).await;
    inflight.tokens_done = 1;
    if decode_steps {
        sim.stats.update(|c| c.realtime_decode_tokens += 1);
    }
    sim.mark_output();
    let greedy = GreedyCtx {
        part,
        prefill_weights,
        flipped: sim.near_ties_flipped(),
        load_peak: sim.stats.update(|c| c.running),
    };
    let mut out = Output {
        req,
        prompt_tokens,
        cached_tokens: admission.cached_tokens,
        tokens,
        arrived,
        scale_factor: scale.0,
        id: format!("{}", uuid::Uuid::new_v4().simple()),
        created: unix_secs(),
        answer: None,
    };
    let freeze_after = settings.freeze_after_tokens;
    if out.req.stream {
        out.answer = greedy.answer(&sim, &settings, &out.req, tokens);
        let timing = StreamTiming {
            t0,
            per,
            freeze_after,
            pause: (settings.pause_after_tokens > 0 && settings.pause_ms > 0.0).then(|| {
                (
                    settings.pause_after_tokens,
                    Duration::from_secs_f64(settings.pause_ms / 1000.0),
                )
            }),
            decode_steps,
        };
        return stream_response(sim, out, inflight, timing, running_slot);
    }
    let upto = if freeze_after > 0 && tokens > freeze_after {
        freeze_after
    } else {
        tokens
    };
    produce(&sim, &mut inflight, t0, per, upto, decode_steps).await;
    if upto < tokens {
        // Frozen mid-generation: the first `freeze_after` tokens are produced, then
        // nothing, ever (the answer never arrives); the request stays in the running
        // batch.
        tracing::info!(rid = %out.req.rid, freeze_after, "generation frozen mid-stream");
        let never = std::future::pending::<std::convert::Infallible>().await;
        match never {}
    }
    let greedy = GreedyCtx {
        load_peak: greedy.load_peak.max(sim.stats.update(|c| c.running)),
        ..greedy
    };
    out.answer = greedy.answer(&sim, &settings, &out.req, tokens);
    inflight.finish();
    drop(running_slot);
    sim.stats.update(|c| {
        c.completed += 1;
        c.generation_tokens_total += tokens;
    });
    let body = match out.req.kind {
        Kind::Chat => out.chat_json(),
        Kind::Generate => out.generate_json(tokens, true),
    };
    Json(body).into_response()
}

/// Answers a decode request whose KV transfer failed, as SGLang's decode does (module
/// doc): HTTP 500, chat `{"object":"error","message":…,"type":"500",…}`, `/generate`
/// `{"detail":…}`. `reason` is the transfer backend's failure reason (pd-sim's own text;
/// it starts "KV transfer failed" so scenarios can match either failure).
fn kv_transfer_failed(sim: &Sim, req: &GenRequest, room: u64, reason: &str) -> Response {
    sim.stats.update(|c| {
        c.kv_transfers_failed += 1;
        c.failed += 1;
    });
    let message = format!(
        "Decode transfer failed for request rank=0 decode_req.req.rid='{}' decode_req.req.bootstrap_room={room} \
         with exception KVTransferError(bootstrap_room={room}): {reason}",
        req.rid
    );
    tracing::warn!(rid = %req.rid, "{message}");
    let status = StatusCode::INTERNAL_SERVER_ERROR;
    match req.kind {
        Kind::Chat => ApiError::http_exception(status, message).into_response(),
        Kind::Generate => (status, Json(json!({ "detail": message }))).into_response(),
    }
}

const WORDS: [&str; 9] = ["The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog."];

fn token_text(i: u64) -> String {
    format!("{} ", WORDS[(i as usize) % WORDS.len()])
}

/// What a finished (or finishing) generation says, in either API's shape.
struct Output {
    req: GenRequest,
    prompt_tokens: u64,
    cached_tokens: u64,
    tokens: u64,
    arrived: Instant,
    scale_factor: f64,
    id: String,
    created: u64,
    /// The greedy answer (`tokens` of them), when the request is decoded greedily.
    answer: Option<Vec<GreedyToken>>,
}

impl Output {
    fn text(&self, n: u64) -> String {
        match &self.answer {
            Some(a) => greedy::text(&a[..(n as usize).min(a.len())]),
            None => (0..n).map(token_text).collect(),
        }
    }

    /// Token `i` (0-based) as a streamed delta carries it.
    fn token(&self, i: u64) -> String {
        match self.answer.as_ref().and_then(|a| a.get(i as usize)) {
            Some(t) => t.token.to_string(),
            None => token_text(i),
        }
    }

    /// `choices[0].logprobs` of the whole answer (null unless asked for and greedy).
    fn logprobs(&self) -> Value {
        match (&self.answer, self.req.logprobs) {
            (Some(a), Some(top_n)) => greedy::logprobs_json(a, top_n),
            _ => Value::Null,
        }
    }

    /// A stream chunk's `choices[0].logprobs` for token `i` (0-based).
    fn chunk_logprobs(&self, i: u64) -> Value {
        match (self.answer.as_ref().and_then(|a| a.get(i as usize)), self.req.logprobs) {
            (Some(t), Some(top_n)) => json!({ "content": [greedy::entry_json(t, top_n)] }),
            _ => Value::Null,
        }
    }

    fn usage(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.tokens,
            "total_tokens": self.prompt_tokens + self.tokens,
            "prompt_tokens_details": if self.cached_tokens > 0 {
                json!({"cached_tokens": self.cached_tokens})
            } else {
                Value::Null
            },
        })
    }

    /// Simulated seconds since the request arrived.
    fn e2e_latency(&self) -> f64 {
        self.arrived.elapsed().as_secs_f64() / self.scale_factor
    }

    fn chat_json(&self) -> Value {
        json!({
            "id": format!("chatcmpl-{}", self.id),
            "object": "chat.completion",
            "created": self.created,
            "model": self.req.model,
            "choices": [{
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": self.text(self.tokens),
                    "reasoning_content": null,
                    "tool_calls": null,
                },
                "logprobs": self.logprobs(),
                "finish_reason": "length",
                "matched_stop": null,
            }],
            "usage": self.usage(),
            "metadata": {"weight_version": "default"},
        })
    }

    fn chat_chunk(&self, delta: Value, logprobs: Value, finish: Option<&str>) -> String {
        let v = json!({
            "id": format!("chatcmpl-{}", self.id),
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.req.model,
            "choices": [{
                "index": 0,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": finish,
                "matched_stop": null,
            }],
            "usage": null,
        });
        format!("data: {v}\n\n")
    }

    fn generate_json(&self, n: u64, finished: bool) -> Value {
        let finish = if finished {
            json!({"type": "length", "length": self.tokens})
        } else {
            Value::Null
        };
        json!({
            "text": self.text(n),
            "output_ids": (0..n).map(|i| 1000 + (i % WORDS.len() as u64)).collect::<Vec<_>>(),
            "meta_info": {
                "id": self.req.rid,
                "finish_reason": finish,
                "prompt_tokens": self.prompt_tokens,
                "weight_version": "default",
                "completion_tokens": n,
                "cached_tokens": self.cached_tokens,
                "e2e_latency": self.e2e_latency(),
            },
        })
    }

    /// The SSE bytes for token `i` (1-based), including a chat stream's opening delta.
    fn token_event(&self, i: u64) -> String {
        match self.req.kind {
            Kind::Chat => {
                let mut s = String::new();
                if i == 1 {
                    s.push_str(&self.chat_chunk(json!({"role": "assistant", "content": ""}), Value::Null, None));
                }
                s.push_str(&self.chat_chunk(json!({"content": self.token(i - 1)}), self.chunk_logprobs(i - 1), None));
                s
            }
            Kind::Generate => format!("data: {}\n\n", self.generate_json(i, i == self.tokens)),
        }
    }

    /// The SSE bytes after the last token, through `data: [DONE]`.
    fn tail_events(&self) -> String {
        let mut s = String::new();
        if self.req.kind == Kind::Chat {
            s.push_str(&self.chat_chunk(json!({}), Value::Null, Some("length")));
            if self.req.include_usage {
                let v = json!({
                    "id": format!("chatcmpl-{}", self.id),
                    "object": "chat.completion.chunk",
                    "created": self.created,
                    "model": self.req.model,
                    "choices": [],
                    "usage": self.usage(),
                });
                s.push_str(&format!("data: {v}\n\n"));
            }
        }
        s.push_str("data: [DONE]\n\n");
        s
    }
}

/// When a stream's tokens are due, and what each one counts as.
struct StreamTiming {
    t0: Instant,
    per: Duration,
    /// `--freeze-after-tokens` (0 = off).
    freeze_after: u64,
    /// `--pause-after-tokens`, `--pause-ms`: once, after that many tokens.
    pause: Option<(u64, Duration)>,
    /// Tokens after the first are decode steps (false for a prefill part).
    decode_steps: bool,
}

/// Streams tokens 1..=n on schedule (token 1 is due now), then the tail. Each token
/// after the first is a decode step: a batch result that adds to
/// `realtime_tokens_total{mode="decode"}` and answers a waiting health check (see
/// [`produce`]). With `freeze_after` > 0 the stream stops after that many tokens and
/// stays open forever (a decode frozen mid-stream, still in the running batch).
fn stream_response(
    sim: Arc<Sim>,
    out: Output,
    inflight: Inflight,
    timing: StreamTiming,
    running_slot: Option<tokio::sync::OwnedSemaphorePermit>,
) -> Response {
    struct St {
        sim: Arc<Sim>,
        out: Output,
        inflight: Inflight,
        next: u64,
        timing: StreamTiming,
        _running_slot: Option<tokio::sync::OwnedSemaphorePermit>,
    }
    let st = St {
        sim,
        out,
        inflight,
        next: 1,
        timing,
        _running_slot: running_slot,
    };
    let stream = futures::stream::unfold(Some(st), |st| async move {
        let mut st = st?;
        let freeze_after = st.timing.freeze_after;
        if freeze_after > 0 && st.next > freeze_after && st.next <= st.out.tokens {
            tracing::info!(rid = %st.out.req.rid, freeze_after, "stream frozen");
            let never = std::future::pending::<std::convert::Infallible>().await;
            match never {}
        }
        if st.next <= st.out.tokens {
            let i = st.next;
            if let Some((after, pause)) = st.timing.pause
                && i == after + 1
            {
                // Retracted: its later tokens come `pause` later.
                tracing::info!(rid = %st.out.req.rid, after, pause_ms = pause.as_millis() as u64, "stream paused");
                st.timing.t0 += pause;
            }
            if i > 1 {
                sleep_until(token_at(st.timing.t0, st.timing.per, i)).await;
                st.inflight.tokens_done = i;
                if st.timing.decode_steps {
                    st.sim.stats.update(|c| c.realtime_decode_tokens += 1);
                }
                st.sim.mark_output();
            }
            st.next += 1;
            let chunk = st.out.token_event(i);
            return Some((Ok::<Bytes, std::convert::Infallible>(Bytes::from(chunk)), Some(st)));
        }
        st.inflight.finish();
        let tokens = st.out.tokens;
        st.sim.stats.update(|c| {
            c.completed += 1;
            c.generation_tokens_total += tokens;
        });
        let tail = st.out.tail_events();
        Some((Ok(Bytes::from(tail)), None))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}
