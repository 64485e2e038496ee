//! SGLang's HTTP surface, as much of it as the router and pdwarden touch.
//!
//! Shapes follow SGLang's `python/sglang/srt/entrypoints/http_server.py` and its
//! OpenAI adapter: `/health` and `/health_generate` share one handler that runs a
//! one-token forward pass and answers 200 as soon as *any* scheduler output newer than
//! the request's start is seen (checked once a second, for up to 20 s); `/v1/models`
//! never touches the scheduler; `/generate` answers `{text, output_ids, meta_info}`.
//! sglang-router 0.3.2 registers a worker with `GET /health`, `/server_info` and
//! `/model_info`, then sends every request to a prefill and a decode at once with
//! `bootstrap_host/port/room` added to the body (see ROUTER-NOTES.md).
//!
//! pd-sim's own endpoints live under `/sim/`: `GET /sim/stats` (ground truth) and
//! `POST /sim/fault` (change faults live, same names as the flags).
//!
//! Two modelling decisions worth knowing: a generation that arrives before the
//! engine is ready waits for readiness (as a request queued during warm-up would);
//! and the health check's pass does not queue for the `--serial` slot, so a leaked
//! slot leaves health at 200 while every generation hangs (INCIDENTS row 4).
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

use crate::bootstrap::FAKE_BOOTSTRAP_HOST;
use crate::clock::far_after;
use crate::config::{FaultPatch, Role};
use crate::engine::{EngineState, Part, Plan, Shape, count_tokens};
use crate::server::Sim;
use crate::stats::{Counters, Phase};

/// The request-id prefix that marks a pdwarden probe.
pub const PROBE_ID_PREFIX: &str = "pdwarden-probe-";
/// SGLang's version we imitate, reported by `/server_info`.
const SGLANG_VERSION: &str = "0.5.3";
/// SGLang's health handler checks for scheduler output once a second.
const HEALTH_TICK_MS: f64 = 1000.0;

pub fn router(sim: Arc<Sim>) -> Router {
    Router::new()
        .route("/health", get(health))
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

/// SGLang's shared `/health` + `/health_generate` handler.
async fn health(State(sim): State<Arc<Sim>>) -> StatusCode {
    if sim.phase() != Phase::Ready {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    sim.stats.update(|c| c.health_requests += 1);
    let scale = sim.scale();
    let tic = Instant::now();
    let tic_ns = sim.clock.origin.elapsed().as_nanos() as u64;
    let deadline = far_after(tic, scale.real(sim.config.health_timeout_ms));
    // The one-token pass, with a fake bootstrap: it never crosses the PD link.
    let plan = EngineState::health_plan(&sim.settings());
    let pass_sim = sim.clone();
    let mut pass = pin!(async move {
        match plan {
            Plan::Hang => std::future::pending::<()>().await,
            Plan::Timed { ready_ms, .. } => {
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
        "chunked_prefill_size": 8192,
        "page_size": 1,
        "internal_states": [{
            "last_gen_throughput": gen_throughput(&c, s.tpot_ms),
            "memory_usage": {"weight": 0.0, "kvcache": 0.0, "token_capacity": 65536},
        }],
        "version": SGLANG_VERSION,
        "pd_sim": {"instance_id": sim.instance_id, "phase": sim.phase()},
    }))
}

fn gen_throughput(c: &Counters, tpot_ms: f64) -> f64 {
    if tpot_ms > 0.0 {
        c.running as f64 * 1000.0 / tpot_ms
    } else {
        0.0
    }
}

/// Prometheus text with SGLang's metric names (simulated seconds for latencies).
async fn metrics(State(sim): State<Arc<Sim>>) -> Response {
    let c = sim.stats.snapshot();
    let s = sim.settings();
    let labels = format!("model_name=\"{}\"", sim.config.model.replace('"', "'"));
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {value}\n"
        ));
    };
    metric(
        "sglang:num_running_reqs",
        "gauge",
        "The number of running requests.",
        c.running as f64,
    );
    metric(
        "sglang:num_queue_reqs",
        "gauge",
        "The number of requests in the waiting queue.",
        c.queued as f64,
    );
    if sim.config.role == Role::Decode {
        metric(
            "sglang:num_decode_transfer_queue_reqs",
            "gauge",
            "The number of requests in the decode transfer queue.",
            c.transfer_waiting as f64,
        );
        metric(
            "sglang:num_transfer_failed_reqs_total",
            "counter",
            "The number of transfer failed requests.",
            c.kv_transfers_failed as f64,
        );
    }
    metric(
        "sglang:gen_throughput",
        "gauge",
        "The generation throughput (token/s).",
        gen_throughput(&c, s.tpot_ms),
    );
    metric("sglang:num_used_tokens", "gauge", "The number of used tokens.", 0.0);
    metric("sglang:token_usage", "gauge", "The token usage.", 0.0);
    metric("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", 0.0);
    metric(
        "sglang:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        c.prompt_tokens_total as f64,
    );
    metric(
        "sglang:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        c.generation_tokens_total as f64,
    );
    metric(
        "sglang:num_requests_total",
        "counter",
        "Number of requests processed.",
        c.requests_total as f64,
    );
    metric(
        "sglang:num_aborted_requests_total",
        "counter",
        "Number of requests aborted.",
        c.disconnected as f64,
    );
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        out,
    )
        .into_response()
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
    permit: Option<OwnedSemaphorePermit>,
    running: Option<GaugeGuard>,
    first_token: bool,
    done: bool,
}

impl Drop for Inflight {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let leak = !self.first_token && self.permit.is_some() && self.sim.settings().leak_slot_on_disconnect;
        self.sim.stats.update(|c| {
            c.disconnected += 1;
            if leak {
                c.leaked_slots += 1;
            }
        });
        if leak {
            if let Some(p) = self.permit.take() {
                p.forget();
            }
            // The scheduler still thinks the request runs: num_running_reqs stays up.
            if let Some(g) = self.running.take() {
                std::mem::forget(g);
            }
            tracing::warn!(rid = %self.rid, "client disconnected before its first token: the serial slot is leaked");
        } else {
            tracing::info!(rid = %self.rid, "client disconnected");
        }
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
        permit: None,
        running: None,
        first_token: false,
        done: false,
    };
    sim.wait_ready().await;
    let settings = sim.settings();
    if settings.serial {
        let _queued = GaugeGuard::new(&sim, |c| &mut c.queued);
        let permit = sim.slot.clone().acquire_owned().await;
        inflight.permit = permit.ok();
    }
    // `--max-running`: held for the whole generation, released however it ends.
    let _running_slot = match &sim.running_slots {
        Some(slots) => {
            let _queued = GaugeGuard::new(&sim, |c| &mut c.queued);
            slots.clone().acquire_owned().await.ok()
        }
        None => None,
    };
    let part = match req.transfer {
        Transfer::None => Part::Whole,
        Transfer::Publish { .. } => Part::Prefill,
        Transfer::Pull { .. } => Part::Decode,
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
    inflight.running = Some(GaugeGuard::new(&sim, |c| &mut c.running));
    if admission.relapsed {
        sim.stats.update(|c| c.relapsed_requests += 1);
    }
    if admission.minted_session {
        tracing::debug!(rid = %req.rid, "session minted");
    }
    let start = Instant::now();
    let scale = sim.scale();
    let Plan::Timed {
        ready_ms,
        per_token_ms,
        tokens,
    } = admission.plan
    else {
        tracing::info!(rid = %req.rid, "scripted hang: this request never answers");
        let never = std::future::pending::<std::convert::Infallible>().await;
        match never {}
    };
    let ready_at = far_after(start, scale.real(ready_ms));
    match &req.transfer {
        Transfer::None => sleep_until(ready_at).await,
        Transfer::Publish { room } => {
            sleep_until(ready_at).await;
            if let Some(b) = &sim.bootstrap_server {
                b.kv_ready(*room);
            }
        }
        Transfer::Pull { host, port, room } => {
            let Some(client) = &sim.bootstrap_client else {
                unreachable!("a decode always has a bootstrap client");
            };
            let waiting = GaugeGuard::new(&sim, |c| &mut c.transfer_waiting);
            if admission.kv_fail {
                // `--kv-fail-every`: the transfer is lost; the decode notices when it
                // would have started on the request, and never pulls the room's KV.
                sleep_until(ready_at).await;
                drop(waiting);
                sim.stats.update(|c| c.kv_failures_injected += 1);
                inflight.done = true;
                let reason = format!(
                    "KV transfer failed: injected by --kv-fail-every {} (routed request {})",
                    settings.kv_fail_every,
                    admission.routed_seq.unwrap_or_default()
                );
                return kv_transfer_failed(&sim, &req, *room, &reason);
            }
            let (kv, ()) = tokio::join!(client.fetch_kv(host, *port, *room), sleep_until(ready_at));
            drop(waiting);
            if let Err(e) = kv {
                inflight.done = true;
                return kv_transfer_failed(&sim, &req, *room, &format!("KV transfer failed: {e}"));
            }
            sim.stats.update(|c| c.kv_transfers_ok += 1);
        }
    }
    let t0 = Instant::now();
    let per = scale.real(per_token_ms);
    sleep_until(t0 + per).await;
    inflight.first_token = true;
    sim.mark_output();
    let out = Output {
        req,
        prompt_tokens,
        cached_tokens: admission.cached_tokens,
        tokens,
        arrived,
        scale_factor: scale.0,
        id: format!("{}", uuid::Uuid::new_v4().simple()),
        created: unix_secs(),
    };
    let freeze_after = settings.freeze_after_tokens;
    if out.req.stream {
        return stream_response(sim, out, inflight, t0, per, freeze_after, _running_slot);
    }
    if freeze_after > 0 && tokens > freeze_after {
        // Frozen mid-generation: the first `freeze_after` tokens are produced,
        // then nothing, ever (the answer never arrives).
        sleep_until(t0 + per * (freeze_after as u32)).await;
        sim.mark_output();
        tracing::info!(rid = %out.req.rid, freeze_after, "generation frozen mid-stream");
        let never = std::future::pending::<std::convert::Infallible>().await;
        match never {}
    }
    sleep_until(t0 + per * (tokens as u32)).await;
    sim.mark_output();
    inflight.done = true;
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
}

impl Output {
    fn text(&self, n: u64) -> String {
        (0..n).map(token_text).collect()
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
                "logprobs": null,
                "finish_reason": "length",
                "matched_stop": null,
            }],
            "usage": self.usage(),
            "metadata": {"weight_version": "default"},
        })
    }

    fn chat_chunk(&self, delta: Value, finish: Option<&str>) -> String {
        let v = json!({
            "id": format!("chatcmpl-{}", self.id),
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.req.model,
            "choices": [{
                "index": 0,
                "delta": delta,
                "logprobs": null,
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
                    s.push_str(&self.chat_chunk(json!({"role": "assistant", "content": ""}), None));
                }
                s.push_str(&self.chat_chunk(json!({"content": token_text(i - 1)}), None));
                s
            }
            Kind::Generate => format!("data: {}\n\n", self.generate_json(i, i == self.tokens)),
        }
    }

    /// The SSE bytes after the last token, through `data: [DONE]`.
    fn tail_events(&self) -> String {
        let mut s = String::new();
        if self.req.kind == Kind::Chat {
            s.push_str(&self.chat_chunk(json!({}), Some("length")));
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

/// Streams tokens 1..=n on schedule (token 1 is due now), then the tail.
/// With `freeze_after` > 0 the stream stops after that many tokens and stays open
/// forever (a decode frozen mid-stream).
fn stream_response(
    sim: Arc<Sim>,
    out: Output,
    inflight: Inflight,
    t0: Instant,
    per: Duration,
    freeze_after: u64,
    running_slot: Option<tokio::sync::OwnedSemaphorePermit>,
) -> Response {
    struct St {
        sim: Arc<Sim>,
        out: Output,
        inflight: Inflight,
        next: u64,
        t0: Instant,
        per: Duration,
        freeze_after: u64,
        _running_slot: Option<tokio::sync::OwnedSemaphorePermit>,
    }
    let st = St {
        sim,
        out,
        inflight,
        next: 1,
        t0,
        per,
        freeze_after,
        _running_slot: running_slot,
    };
    let stream = futures::stream::unfold(Some(st), |st| async move {
        let mut st = st?;
        if st.freeze_after > 0 && st.next > st.freeze_after && st.next <= st.out.tokens {
            tracing::info!(rid = %st.out.req.rid, freeze_after = st.freeze_after, "stream frozen");
            let never = std::future::pending::<std::convert::Infallible>().await;
            match never {}
        }
        if st.next <= st.out.tokens {
            let i = st.next;
            if i > 1 {
                sleep_until(st.t0 + st.per * (i as u32)).await;
                st.sim.mark_output();
            }
            st.next += 1;
            let chunk = st.out.token_event(i);
            return Some((Ok::<Bytes, std::convert::Infallible>(Bytes::from(chunk)), Some(st)));
        }
        st.inflight.done = true;
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
