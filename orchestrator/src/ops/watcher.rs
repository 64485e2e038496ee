//! The continuous watch of each pair, and its automatic recovery.
//!
//! One task per pair. It asks the agents of the pair's engines for a passive
//! watch (`WatchEngines`: metrics + health scrapes, no generation), folds the
//! `EngineSample`s into [`PairEvidence`], and lets the pure [`pdwarden_model::judge::wedge`]
//! module judge them on every tick. It only does what the judgement asks:
//! an active probe through the pair's router when passive evidence is
//! missing or suspicious (never while traffic proves liveness, with a timeout
//! that covers the prefills queued ahead), and, for a confirmed wedge, the
//! same ordered co-restart an operator would run, journaled as an automatic
//! operation whose `trigger` entry holds the evidence. A [`Breaker`] bounds
//! the automatic recoveries; past it the pair is held for a human, loudly
//! (status, readiness endpoint and its metrics, an error log every minute).
//!
//! It logs what changed, not every tick ([`LogGate`]): a state change once
//! with its reasons; a pair held, down or wedged and not recovering again
//! at most once a minute; the per-tick detail (the same state with new
//! numbers, the probes it sends or defers) at DEBUG.
//!
//! The watch supervises itself ([`supervise`]): a panic in a pair's watch
//! is caught, logged once, shown as the state `watch_failed` (not ready) and
//! counted in `pdwarden_watch_restarts_total`, and the watch restarts after
//! a backoff (1 s doubling to 30 s).
//!
//! While any operation runs on the pair (an operator's or its own) the watch
//! stands aside and forgets its evidence: restarted engines start their
//! counters over. A healthy operation counts as proof of liveness; a healthy
//! operation run by a human releases a held pair.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use futures::FutureExt;

use pdwarden_proto::v1::{ChatProbe, Command, EngineSample, ProbeRequest, WatchEngines, WatchTarget, command};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::Level;

use crate::config::{PairConfig, UnitRef, WatchConfig};
use crate::ops::corestart::{OperationContext, OperationKind, run_operation};
use crate::ops::journal::JournalError;
use crate::ops::port::AgentReport;
use pdwarden_engines::EngineKind;

use pdwarden_model::judge::wedge::{
    AgentFact, Assessment, Breaker, BreakerDecision, Life, Metrics, PairEvidence, PairState, PastOperation,
    ProbeDecision, ProbeObservation, Sample, UnitAssessment, UnitTrack, WatchPolicy, WatchProbe, judge,
    recoveries_still_counting,
};
use pdwarden_model::watch::{PairWatchView, RecoveryView, WatchedUnit};

/// A host report older than this says nothing about a unit's GPU now (the
/// agent sends a full snapshot at least every 15 s by default, and every
/// change at once).
const GPU_REPORT_MAX_AGE_MS: u64 = 60_000;

/// Milliseconds on the host's `CLOCK_MONOTONIC`, shared with every process on
/// the host (DESIGN.md 5): pd-sim's own records are directly comparable.
pub fn mono_ms() -> f64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(ts) => ts.tv_sec() as f64 * 1000.0 + ts.tv_nsec() as f64 / 1e6,
        Err(_) => f64::NAN,
    }
}

/// Labels of the wedge detection-time histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WedgeLabels {
    pub pair: String,
    pub kind: String,
}

fn detection_histogram() -> Histogram {
    // 0.25 s .. 1024 s: a scaled demo's seconds to production's minutes.
    Histogram::new(exponential_buckets(0.25, 2.0, 13))
}

/// The latest view of every watched pair, shared with `status` and the
/// readiness endpoint, and the detection time of every confirmed wedge.
#[derive(Clone)]
pub struct WatchBoard {
    views: Arc<Mutex<BTreeMap<String, PairWatchView>>>,
    /// Seconds from a wedge's onset (the silence began) to its confirmation.
    pub detection: Family<WedgeLabels, Histogram, fn() -> Histogram>,
    /// Seconds each of the watch's own probes took, by pair and outcome.
    pub probe_latency: Family<ProbeLabels, Histogram, fn() -> Histogram>,
    /// Every operation's conclusion (the journal tells it).
    pub operations: crate::ops::telemetry::OperationMetrics,
    /// Whether this orchestrator leads (its `/metrics` says so, for an
    /// alert on "no orchestrator leads").
    pub leadership: crate::edge::leadership::Leadership,
    /// Times each pair's watch panicked and was restarted ([`supervise`]).
    pub restarts: Family<WatchPairLabels, Counter>,
}

/// Labels of the watch's own per-pair counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchPairLabels {
    pub pair: String,
}

impl WatchBoard {
    /// A board whose `/metrics` says whether `leadership` leads.
    pub fn with_leadership(leadership: crate::edge::leadership::Leadership) -> Self {
        WatchBoard {
            leadership,
            ..Self::default()
        }
    }
}

impl Default for WatchBoard {
    fn default() -> Self {
        WatchBoard {
            views: Arc::default(),
            detection: Family::new_with_constructor(detection_histogram),
            probe_latency: Family::new_with_constructor(probe_histogram),
            operations: Default::default(),
            leadership: Default::default(),
            restarts: Family::default(),
        }
    }
}

/// Every state a pair's watch view may be in (`PairWatchView::state`).
pub const WATCH_STATES: &[&str] = &[
    "healthy",
    "unproven",
    "suspect",
    "wedged",
    "down",
    "recovering",
    "operation_running",
    "held",
    "starting",
    "watch_failed",
];

/// Labels of the watch's probe-latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    pub pair: String,
    /// `ok`, `timeout` or `error`.
    pub outcome: String,
}

fn probe_histogram() -> Histogram {
    // 10 ms .. ~82 s: a warm answer to a probe timing out on a long queue.
    Histogram::new(exponential_buckets(0.01, 2.0, 14))
}

impl WatchBoard {
    pub fn get(&self, pair: &str) -> Option<PairWatchView> {
        self.views.lock().unwrap_or_else(|p| p.into_inner()).get(pair).cloned()
    }

    pub fn all(&self) -> Vec<PairWatchView> {
        self.views
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Each host's queued requests per unit, from the latest samples (for the
    /// `gpu_idle_with_queue` finding).
    pub fn queued_by_host(&self) -> BTreeMap<String, BTreeMap<String, u64>> {
        let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        for view in self.views.lock().unwrap_or_else(|p| p.into_inner()).values() {
            for u in &view.units {
                if let Some(m) = u.metrics {
                    out.entry(u.host.clone())
                        .or_default()
                        .insert(u.unit.clone(), m.queued.max(0.0).round() as u64);
                }
            }
        }
        out
    }

    /// A follower's board (issue 36): the leader's views, as it published
    /// them, replace whatever the board held; none (stale or unreadable):
    /// no pair is known ready here.
    pub fn mirror(&self, views: Vec<PairWatchView>) {
        let mut held = self.views.lock().unwrap_or_else(|p| p.into_inner());
        held.clear();
        held.extend(views.into_iter().map(|v| (v.pair.clone(), v)));
    }

    fn put(&self, view: PairWatchView) {
        self.views
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(view.pair.clone(), view);
    }

    /// `pair`'s watch panicked: it shows `watch_failed` (not ready) with
    /// `reason`, keeping the counts of the view before it; its units are
    /// unknown until the watch is back.
    fn watch_failed(&self, pair: &PairConfig, reason: String) {
        let before = self.get(&pair.name);
        let keep = |f: fn(&PairWatchView) -> u64| before.as_ref().map_or(0, f);
        self.put(PairWatchView {
            pair: pair.name.clone(),
            state: "watch_failed".into(),
            ready: false,
            reasons: vec![reason],
            held: before.as_ref().and_then(|v| v.held.clone()),
            auto_recover: pair.watch.auto_recover,
            recoveries_in_window: before.as_ref().map_or(0, |v| v.recoveries_in_window),
            max_recoveries: pair.watch.max_recoveries,
            recovery_window_ms: pair.watch.recovery_window_ms,
            probes_sent: keep(|v| v.probes_sent),
            probes_deferred: keep(|v| v.probes_deferred),
            last_probe: before.as_ref().and_then(|v| v.last_probe.clone()),
            last_recovery: before.and_then(|v| v.last_recovery),
            units: Vec::new(),
        });
    }
}

/// `tracing`'s macros take their level as a constant: one arm per level.
macro_rules! log_at {
    ($level:expr, $($rest:tt)+) => {{
        let level: Level = $level;
        if level == Level::ERROR {
            tracing::error!($($rest)+)
        } else if level == Level::WARN {
            tracing::warn!($($rest)+)
        } else if level == Level::INFO {
            tracing::info!($($rest)+)
        } else {
            tracing::debug!($($rest)+)
        }
    }};
}

/// When a line of the watch is worth a person's attention (issue 31, item 5).
///
/// The watch judges every tick and its reasons carry times ("4.50 s ago"):
/// logged whenever they changed, one healthy pair wrote two lines a second
/// and a down one two errors a second, which journald rate-limits away
/// together with what matters. A line is logged at its level when what it
/// says changed (its key: a state, a refusal, an error, never the
/// numbers), and again at most once every [`LogGate::REPEAT`] while it
/// stays worth repeating; otherwise at DEBUG, where the per-tick detail
/// stays available. Pure: handed `now`.
#[derive(Debug, Default)]
pub struct LogGate {
    /// The key last logged at its level, and when.
    last: Option<(String, Instant)>,
}

impl LogGate {
    /// A line worth repeating is repeated at most this often.
    pub const REPEAT: Duration = Duration::from_secs(60);

    /// The level to log a line about `key` at `now`: `level` when `key`
    /// is not the last one logged, or when `repeat` and [`Self::REPEAT`]
    /// has passed since it was last logged at its level; DEBUG otherwise.
    pub fn level(&mut self, key: &str, level: Level, repeat: bool, now: Instant) -> Level {
        let due = match &self.last {
            Some((last, at)) if last == key => repeat && now.saturating_duration_since(*at) >= Self::REPEAT,
            _ => true,
        };
        if due {
            self.last = Some((key.to_string(), now));
            level
        } else {
            Level::DEBUG
        }
    }

    /// The level of a line announcing the pair's watch `state`: a change
    /// at its level (ERROR for `wedged`, `down`, `held` and
    /// `watch_failed`, which are repeated every minute while they last;
    /// WARN for `suspect`; INFO for the rest), DEBUG for the same state again.
    pub fn state(&mut self, state: &str, now: Instant) -> Level {
        let (level, repeat) = match state {
            "wedged" | "down" | "held" | "watch_failed" => (Level::ERROR, true),
            "suspect" => (Level::WARN, false),
            _ => (Level::INFO, false),
        };
        self.level(state, level, repeat, now)
    }

    /// Forgets the last line: the next one is a change.
    pub fn clear(&mut self) {
        self.last = None;
    }
}

/// The first wait before a panicked watch restarts; it doubles per panic...
const RESTART_MIN: Duration = Duration::from_secs(1);
/// ...up to this...
const RESTART_MAX: Duration = Duration::from_secs(30);
/// ...and starts over from [`RESTART_MIN`] after a watch ran this long.
const RESTART_RESET: Duration = Duration::from_secs(60);

/// The waits before each restart of a watch that keeps panicking.
fn restart_delays() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(RESTART_MIN)
        .with_max_delay(RESTART_MAX)
        .with_factor(2.0)
        .without_max_times()
        .build()
}

/// A panic's message, as `std` prints it.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Runs `pair`'s watch (each `watch()` call starts one) until it ends
/// (shutdown) or `shutdown` turns true. A watch that panics dies alone:
/// the panic is caught, logged once at ERROR with its message, the pair
/// shown as `watch_failed` (not ready) on `board` and counted in
/// `pdwarden_watch_restarts_total{pair}`, and a new watch starts after
/// [`restart_delays`] (1 s doubling to 30 s; from 1 s again once a watch
/// ran a minute). Without it a panic left the pair with no watch at all:
/// no watch line in `status`, `/ready` answering `{"pairs":[]}`.
pub async fn supervise<F, Fut>(
    pair: PairConfig,
    board: WatchBoard,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    mut watch: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut delays = restart_delays();
    let mut restarts: u64 = 0;
    loop {
        let started = Instant::now();
        let Err(panic) = AssertUnwindSafe(watch()).catch_unwind().await else {
            return;
        };
        if *shutdown.borrow() {
            return;
        }
        if started.elapsed() >= RESTART_RESET {
            delays = restart_delays();
        }
        let delay = delays.next().unwrap_or(RESTART_MAX);
        restarts += 1;
        let message = panic_message(&*panic);
        tracing::error!(pair = %pair.name, panic = %message, restarts, restart_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX), "the pair's watch panicked; restarting it");
        board
            .restarts
            .get_or_create(&WatchPairLabels {
                pair: pair.name.clone(),
            })
            .inc();
        board.watch_failed(
            &pair,
            format!(
                "the watch panicked ({message}); restart {restarts} in {:.1} s",
                delay.as_secs_f64()
            ),
        );
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// A duration of the policy: at most a week (the config's bound on every
/// duration), so no sum or product the judge makes of a few can overflow.
fn bounded_ms(ms: u64) -> Duration {
    Duration::from_millis(ms.min(pdwarden_proto::limits::MAX_DURATION_MS))
}

/// `secs` as a bounded duration: negative is zero, NaN or above the bound
/// is the bound.
fn bounded_secs(secs: f64) -> Duration {
    let max = bounded_ms(u64::MAX);
    if secs <= 0.0 {
        Duration::ZERO
    } else {
        Duration::try_from_secs_f64(secs).map_or(max, |d| d.min(max))
    }
}

/// One agent's engine sample as the wedge judges fold it, stamped `at`
/// (the watch's and the verification suite's progress watch: issue 47).
pub(crate) fn wedge_sample(s: EngineSample, gpu_util: Option<f64>, at: Instant) -> Sample {
    let engine = EngineKind::from_name(&s.engine_kind);
    let metrics = s.metrics_ok.then(|| Metrics {
        running: s.running_reqs.unwrap_or(0.0),
        queued: s.queued_reqs.unwrap_or(0.0),
        generation_tokens: s.generation_tokens_total,
        prompt_tokens: s.prompt_tokens_total,
        realtime_tokens: s.realtime_tokens_total,
        prefill_prealloc: s.prefill_prealloc_queue_reqs,
        prefill_inflight: s.prefill_inflight_queue_reqs,
        decode_prealloc: s.decode_prealloc_queue_reqs,
        decode_transfer: s.decode_transfer_queue_reqs,
        transfer_failed: s.transfer_failed_total,
        bootstrap_failed: s.bootstrap_failed_total,
        gpu_util,
        engine,
    });
    Sample {
        at,
        health_status: u16::try_from(s.health_status).unwrap_or(0),
        metrics,
        error: s.error,
    }
}

/// The pure policy of a pair's watch, from its config. It cannot panic,
/// whatever the config: the config's validation bounds every number
/// (`WatchConfig::validate`), and every conversion here saturates at the
/// same bounds in case a config was built without it.
pub fn policy(pair: &PairConfig) -> WatchPolicy {
    let w = &pair.watch;
    let ms = bounded_ms;
    // A probe's tokens as the engine counts them: words are a lower bound,
    // so twice the words, its output, and a chat template's overhead.
    let prompt_words = pair.probe.prompt.split_whitespace().count() as f64;
    WatchPolicy {
        stall_budget: ms(w.stall_budget_ms),
        max_prefill: ms(w.max_prefill_ms()),
        max_generation: ms(w.max_generation_ms()),
        max_prefill_chunk: ms(w.max_prefill_chunk_ms()),
        decode_step: bounded_secs(1.0 / w.decode_tok_per_s),
        idle_gauge_refresh: w.idle_gauge_refresh_ms.map(ms),
        max_kv_transfer: ms(w.max_kv_transfer_ms),
        serial: !pair.suite.concurrency.engines_batch,
        engine: w.engine,
        probe_tokens: 2.0 * prompt_words + f64::from(pair.probe.max_tokens) + 64.0,
        idle_probe_interval: ms(w.idle_probe_interval_ms),
        min_probe_interval: ms(w.min_probe_interval_ms),
        probe_timeout: ms(pair.probe.cold_allowance_ms.min(pair.probe.probe_timeout_ms)),
        warm_probe_timeout: ms(pair.probe.warm_budget_ms.min(pair.probe.probe_timeout_ms)),
        scrape_interval: ms(w.scrape_interval_ms),
        max_probe_timeout: ms(w.max_probe_timeout_ms),
        stale_after: ms(w.scrape_interval_ms.saturating_mul(3).saturating_add(2_000)),
        gpu_idle_below: w.gpu_idle_below,
    }
}

/// The watch command on one host.
struct HostWatch {
    command_id: String,
    reports: Option<mpsc::UnboundedReceiver<AgentReport>>,
    active: bool,
    last_attempt: Option<Instant>,
    /// The agent's refusals of the watch (retried every second).
    log: LogGate,
}

struct PairWatcher {
    ctx: OperationContext,
    pair: PairConfig,
    cfg: WatchConfig,
    policy: WatchPolicy,
    board: WatchBoard,
    evidence: PairEvidence,
    breaker: Breaker,
    hosts: BTreeMap<String, HostWatch>,
    samples_tx: mpsc::UnboundedSender<EngineSample>,
    probes_tx: mpsc::UnboundedSender<ProbeEnd>,
    probes_sent: u64,
    /// The preflight's refusals of an automatic recovery (each logged once).
    refusal_log: LogGate,
    /// The journal's read errors (the journal is read every tick).
    journal_log: LogGate,
    probes_deferred: u64,
    probe_seq: u32,
    /// The router whose probe failed last: the next probe avoids it when it can.
    failed_router: Option<UnitRef>,
    /// The operation seen running on the pair at the last tick.
    running_op: Option<String>,
    own_ops: HashSet<String>,
    last_recovery: Option<RecoveryView>,
    last_probe_view: Option<serde_json::Value>,
    /// The judge's state at the last tick it judged (none while an
    /// operation ran): a wedge's first tick is its detection.
    last_state: Option<PairState>,
    /// The published state's lines.
    log: LogGate,
}

impl Drop for PairWatcher {
    /// Whatever ends the watch (shutdown, or a panic [`supervise`] caught),
    /// its hosts' sample routes go with it.
    fn drop(&mut self) {
        for h in self.hosts.values() {
            self.ctx.agents.forget(&h.command_id);
        }
    }
}

/// Starts the watch of every pair whose `watch.enabled` is set, each
/// [`supervise`]d (a panic restarts it). The tasks end when `shutdown`
/// turns true.
pub fn spawn_all(
    ctx: &OperationContext,
    pairs: &[PairConfig],
    board: &WatchBoard,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    pairs
        .iter()
        .filter(|p| p.watch.enabled)
        .map(|p| {
            let (ctx, pair, board, shutdown) = (ctx.clone(), p.clone(), board.clone(), shutdown.clone());
            let watch = {
                let (pair, board, shutdown) = (pair.clone(), board.clone(), shutdown.clone());
                move || run(ctx.clone(), pair.clone(), board.clone(), shutdown.clone())
            };
            tokio::spawn(supervise(pair, board, shutdown, watch))
        })
        .collect()
}

/// Watches one pair until `shutdown` turns true.
pub async fn run(
    ctx: OperationContext,
    pair: PairConfig,
    board: WatchBoard,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let (samples_tx, mut samples_rx) = mpsc::unbounded_channel();
    let (probes_tx, mut probes_rx) = mpsc::unbounded_channel();
    let units = pair
        .prefill
        .iter()
        .map(|u| UnitTrack::new(u.unit.clone(), "prefill"))
        .chain(pair.decode.iter().map(|u| UnitTrack::new(u.unit.clone(), "decode")))
        .collect();
    let cfg = pair.watch.clone();
    let mut w = PairWatcher {
        evidence: PairEvidence::new(units, Duration::from_millis(cfg.scrape_interval_ms)),
        policy: policy(&pair),
        breaker: Breaker::new(cfg.max_recoveries, Duration::from_millis(cfg.recovery_window_ms)),
        cfg,
        ctx,
        pair,
        board,
        hosts: BTreeMap::new(),
        samples_tx,
        probes_tx,
        probes_sent: 0,
        refusal_log: LogGate::default(),
        journal_log: LogGate::default(),
        probes_deferred: 0,
        probe_seq: 0,
        failed_router: None,
        running_op: None,
        own_ops: HashSet::new(),
        last_recovery: None,
        last_probe_view: None,
        last_state: None,
        log: LogGate::default(),
    };
    w.seed_breaker_from_journal();
    // Never zero: `interval` panics on it.
    let period = Duration::from_millis(w.cfg.scrape_interval_ms.clamp(1, 500));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    w.publish("starting", false, vec!["watch starting".into()], Vec::new());
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            Some(s) = samples_rx.recv() => w.on_sample(s),
            Some(end) = probes_rx.recv() => match end {
                ProbeEnd::Answered(record, done_at) => w.on_probe(record, done_at),
                ProbeEnd::Lost { why, at } => w.on_probe_lost(&why, at),
            },
            _ = tick.tick() => {
                let stop = w.on_tick(&mut samples_rx, &mut shutdown).await;
                if stop {
                    break;
                }
            }
        }
    }
}

impl PairWatcher {
    /// The breaker survives an orchestrator restart: the journal's automatic
    /// recoveries of this pair still in the window count again.
    fn seed_breaker_from_journal(&mut self) {
        let history = match self.ctx.journal.history(&self.pair.name, 1000) {
            Ok(h) => h,
            Err(e) => {
                tracing::error!(pair = %self.pair.name, error = %e, "cannot read the journal to seed the recovery breaker");
                return;
            }
        };
        let past: Vec<PastOperation> = history
            .iter()
            .map(|r| PastOperation {
                started_unix_ms: u64::try_from(r.started_unix_ms).unwrap_or(0),
                automatic: r.request_id.as_deref().is_some_and(|id| id.starts_with("auto-")),
                human_healthy_restart: r.kind == OperationKind::CoRestart.as_str()
                    && !r.request_id.as_deref().is_some_and(|id| id.starts_with("auto-"))
                    && matches!(r.verdict.as_deref(), Some("healthy" | "healthy_after_cold_start")),
            })
            .collect();
        let ages = recoveries_still_counting(
            &past,
            crate::edge::hoststate::now_unix_ms(),
            Duration::from_millis(self.cfg.recovery_window_ms),
        );
        if !ages.is_empty() {
            tracing::warn!(pair = %self.pair.name, recoveries = ages.len(), max = self.cfg.max_recoveries, "automatic recoveries from before this start still count against the breaker");
            self.breaker.seed(&ages, Instant::now());
        }
    }

    /// What each unit's agent says of it, every unit of the pair (the
    /// router too: no engine sample shows it).
    fn agent_facts(&self) -> Vec<AgentFact> {
        let roles = [
            ("prefill", &self.pair.prefill),
            ("decode", &self.pair.decode),
            ("router", &self.pair.router),
        ];
        roles
            .into_iter()
            .flat_map(|(role, units)| units.iter().map(move |u| (role, u)))
            .map(|(role, u)| {
                let life = match self.ctx.agents.unit(&u.host, &u.unit) {
                    _ if !self.ctx.agents.is_connected(&u.host) => Life::Unknown,
                    None => Life::Unknown,
                    Some(info) => match pdwarden_proto::v1::Phase::try_from(info.phase) {
                        Ok(pdwarden_proto::v1::Phase::Stopped) => Life::Stopped,
                        Ok(pdwarden_proto::v1::Phase::Exited) => Life::Exited {
                            detail: match info.exit_detail.split("; log tail:").next().unwrap_or("") {
                                "" => "exited".to_string(),
                                d => d.to_string(),
                            },
                        },
                        Ok(pdwarden_proto::v1::Phase::Unspecified) | Err(_) => Life::Unknown,
                        Ok(_) => Life::Running,
                    },
                };
                AgentFact {
                    unit: u.unit.clone(),
                    role: role.into(),
                    life,
                }
            })
            .collect()
    }

    fn engine_units(&self) -> Vec<UnitRef> {
        self.pair.prefill.iter().chain(&self.pair.decode).cloned().collect()
    }

    fn on_sample(&mut self, s: EngineSample) {
        if self.running_op.is_some() {
            return;
        }
        // The engine's own figure if the agent sent one, else the busiest GPU
        // holding one of the unit's processes in its host's latest report.
        let gpu_util = s.gpu_utilization.or_else(|| {
            let host = self.engine_units().into_iter().find(|u| u.unit == s.unit)?.host;
            self.ctx.agents.unit_gpu_utilization(
                &host,
                &s.unit,
                crate::edge::hoststate::now_unix_ms(),
                GPU_REPORT_MAX_AGE_MS,
            )
        });
        let (unit, engine) = (s.unit.clone(), self.policy.engine);
        self.evidence
            .observe(&unit, wedge_sample(s, gpu_util, Instant::now()), engine);
    }

    /// A probe its agent never ran or never answered: nothing of the pair
    /// (see [`PairEvidence::probe_lost`]); said in the log, shown as the
    /// last probe, and the next one goes at the usual gap.
    fn on_probe_lost(&mut self, why: &str, at: Instant) {
        tracing::info!(pair = %self.pair.name, %why, "watch probe lost: it says nothing of the pair");
        self.last_probe_view = Some(json!({ "lost": why }));
        self.evidence.probe_lost(at);
    }

    fn on_probe(&mut self, record: WatchProbe, done_at: Instant) {
        let outcome = match record.outcome {
            ProbeObservation::Ok { .. } => "ok",
            ProbeObservation::Timeout { .. } => "timeout",
            ProbeObservation::Error { .. } => "error",
        };
        self.board
            .probe_latency
            .get_or_create(&ProbeLabels {
                pair: self.pair.name.clone(),
                outcome: outcome.into(),
            })
            .observe(done_at.saturating_duration_since(record.sent_at).as_secs_f64());
        self.last_probe_view = Some(json!({
            "target": record.target,
            "request_id": record.request_id,
            "timeout_ms": record.timeout.as_millis() as u64,
            "work_ahead": record.work_ahead,
            "result": record.outcome,
        }));
        if self.running_op.is_some() {
            return;
        }
        self.failed_router = match record.outcome {
            ProbeObservation::Ok { .. } => None,
            _ => self
                .pair
                .router
                .iter()
                .find(|r| record.target == format!("router:{}", r.unit))
                .cloned(),
        };
        self.evidence.probe_done(record, done_at);
    }

    /// (Re)sends the watch command to every host that lacks an active one.
    async fn ensure_watches(&mut self) {
        let mut by_host: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for u in self.engine_units() {
            by_host.entry(u.host.clone()).or_default().push(u.unit.clone());
        }
        for (host, units) in by_host {
            let h = self.hosts.entry(host.clone()).or_insert_with(|| HostWatch {
                command_id: String::new(),
                reports: None,
                active: false,
                last_attempt: None,
                log: LogGate::default(),
            });
            if let Some(rx) = h.reports.as_mut() {
                while let Ok(r) = rx.try_recv() {
                    match r {
                        AgentReport::Disconnected => h.active = false,
                        AgentReport::Result(r) if !r.ok => {
                            let level = h.log.level(&r.error, Level::WARN, true, Instant::now());
                            log_at!(level, pair = %self.pair.name, host, error = %r.error, "agent refused the watch");
                            h.active = false;
                        }
                        _ => {}
                    }
                }
            }
            let retry_due = h.last_attempt.is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
            if h.active || !retry_due || !self.ctx.agents.is_connected(&host) {
                continue;
            }
            h.last_attempt = Some(Instant::now());
            if !h.command_id.is_empty() {
                self.ctx.agents.forget(&h.command_id);
            }
            let id = format!("watch-{}", uuid::Uuid::new_v4());
            let cmd = Command {
                fencing_token: 0,
                command_id: id.clone(),
                action: Some(command::Action::Watch(WatchEngines {
                    targets: units
                        .iter()
                        .map(|u| WatchTarget {
                            unit: u.clone(),
                            metrics_path: String::new(),
                        })
                        .collect(),
                    interval_ms: self.cfg.scrape_interval_ms,
                    scrape_timeout_ms: self.cfg.scrape_interval_ms.clamp(500, 2_000),
                })),
            };
            self.ctx
                .agents
                .route_engine_samples(&host, &id, self.samples_tx.clone());
            match self.ctx.agents.send(&host, &units[0], cmd).await {
                Ok(rx) => {
                    h.command_id = id;
                    h.reports = Some(rx);
                    h.active = true;
                }
                Err(e) => {
                    self.ctx.agents.forget(&id);
                    tracing::debug!(pair = %self.pair.name, host, error = %e, "watch not sent");
                }
            }
        }
    }

    /// The operation running on the pair, if any (from the journal, so an
    /// operator's restart through any orchestrator path is seen).
    fn running_operation(&mut self) -> Option<(String, Option<String>)> {
        match self.ctx.journal.history(&self.pair.name, 1) {
            Ok(h) => {
                self.journal_log.clear();
                h.into_iter()
                    .find(|r| r.ended_unix_ms.is_none())
                    .map(|r| (r.operation_id, None))
            }
            Err(e) => {
                // Read every tick: once a minute while it fails.
                let level = self.journal_log.level("journal", Level::WARN, true, Instant::now());
                log_at!(level, pair = %self.pair.name, error = %e, "cannot read the journal");
                None
            }
        }
    }

    fn concluded_verdict(&self, operation_id: &str) -> Option<String> {
        self.ctx
            .journal
            .history(&self.pair.name, 20)
            .ok()?
            .into_iter()
            .find(|r| r.operation_id == operation_id)?
            .verdict
    }

    /// One step of the watch. Returns true when shutdown was asked during a recovery.
    async fn on_tick(
        &mut self,
        samples_rx: &mut mpsc::UnboundedReceiver<EngineSample>,
        shutdown: &mut tokio::sync::watch::Receiver<bool>,
    ) -> bool {
        let now = Instant::now();
        match (self.running_operation(), self.running_op.take()) {
            (Some((id, _)), _) => {
                self.evidence.reset(None);
                self.last_state = None;
                self.publish(
                    "operation_running",
                    false,
                    vec![format!("operation {id} is running on the pair; the watch stands aside")],
                    Vec::new(),
                );
                self.running_op = Some(id);
                return false;
            }
            (None, Some(finished)) => {
                let verdict = self.concluded_verdict(&finished);
                let healthy = matches!(verdict.as_deref(), Some("healthy" | "healthy_after_cold_start"));
                self.evidence.reset(healthy.then(|| {
                    (
                        now,
                        format!("operation {finished} concluded {}", verdict.unwrap_or_default()),
                    )
                }));
                if healthy && !self.own_ops.contains(&finished) && self.breaker.held().is_some() {
                    tracing::warn!(pair = %self.pair.name, operation = %finished, "a human's healthy co-restart releases the held pair");
                    self.breaker.release();
                }
            }
            (None, None) => {}
        }
        self.ensure_watches().await;
        let lives = self.agent_facts();
        self.evidence.set_lives(lives);
        let a = judge(&self.evidence, &self.policy, now);
        let newly_wedged = a.state == PairState::Wedged && self.last_state != Some(PairState::Wedged);
        self.last_state = Some(a.state);
        if a.state != PairState::Wedged {
            self.maybe_probe(&a, now);
            self.publish_assessment(&a, now);
            return false;
        }
        if !self.cfg.auto_recover {
            if newly_wedged {
                self.observe_detection(&a, now);
            }
            self.publish_assessment(&a, now);
            return false;
        }
        // Never a recovery that could only stop half-way (issue 16,
        // finding 5): a unit that cannot start now is named, and the pair
        // left as it is.
        if let Err(refusal) = crate::ops::preflight::check(&*self.ctx.agents, &self.pair, true).await {
            // Each refusal once; the `wedged` line that follows repeats
            // every minute with it among its reasons.
            let level = self
                .refusal_log
                .level(&refusal.reasons.join("; "), Level::ERROR, false, now);
            log_at!(level, pair = %self.pair.name, %refusal, "pair wedged, NOT recovering automatically");
            let mut reasons = vec![format!("not recovering automatically: {refusal}")];
            reasons.extend(a.reasons.clone());
            self.publish("wedged", false, reasons, a.units.clone());
            return false;
        }
        self.refusal_log.clear();
        match self.breaker.decide(now) {
            BreakerDecision::Hold { reason } => {
                // Logged by `publish`: on change, then once a minute.
                let mut reasons = vec![reason.clone()];
                reasons.extend(a.reasons.clone());
                self.publish("held", false, reasons, a.units.clone());
                false
            }
            BreakerDecision::Recover { nth } => self.recover(&a, nth, samples_rx, shutdown).await,
        }
    }

    fn maybe_probe(&mut self, a: &Assessment, now: Instant) {
        match &a.probe {
            ProbeDecision::None => {}
            ProbeDecision::Defer { why } => {
                self.probes_deferred += 1;
                tracing::debug!(pair = %self.pair.name, "probe deferred: {why}");
            }
            ProbeDecision::Send {
                timeout,
                work_ahead,
                why,
            } => {
                // Never back to the router that just failed, when there is another.
                let router = self
                    .pair
                    .router
                    .iter()
                    .find(|r| Some(*r) != self.failed_router.as_ref())
                    .unwrap_or(&self.pair.router[0])
                    .clone();
                self.probe_seq += 1;
                self.probes_sent += 1;
                self.evidence.probe_sent_to(
                    now,
                    self.policy.probe_tokens,
                    format!("router:{}", router.unit),
                    *timeout,
                    *work_ahead,
                );
                tracing::debug!(pair = %self.pair.name, router = %router, timeout_ms = timeout.as_millis() as u64, work_ahead, "probe: {why}");
                let chat = ChatProbe {
                    model: self.pair.probe.model.clone(),
                    prompt: self.pair.probe.prompt.clone(),
                    max_tokens: self.pair.probe.max_tokens,
                    greedy: false,
                };
                tokio::spawn(probe(
                    self.ctx.agents.clone(),
                    router,
                    chat,
                    *timeout,
                    *work_ahead,
                    self.probe_seq,
                    self.probes_tx.clone(),
                ));
            }
        }
    }

    /// Journals the trigger, runs the ordered co-restart, records the outcome.
    async fn recover(
        &mut self,
        a: &Assessment,
        nth: u32,
        samples_rx: &mut mpsc::UnboundedReceiver<EngineSample>,
        shutdown: &mut tokio::sync::watch::Receiver<bool>,
    ) -> bool {
        let detected_mono_ms = mono_ms();
        // Its request id names it automatic (and is unique to it).
        let request_id = format!("auto-{}", uuid::Uuid::new_v4());
        // An xPyD pool restarts only what its path matrix names (issue 37).
        let only_sick = self.cfg.recover_only_sick && crate::ops::repair::check(&self.pair).is_ok();
        let kind = if only_sick {
            crate::ops::repair::KIND
        } else {
            OperationKind::CoRestart.as_str()
        };
        let operation_id = match self.ctx.begin(kind, &self.pair.name, Some(&request_id), &[]) {
            Ok(id) => id,
            Err(JournalError::PairBusy { .. }) => return false,
            Err(e) => {
                tracing::error!(pair = %self.pair.name, error = %e, "cannot journal an automatic recovery");
                return false;
            }
        };
        let detection_ms = self.observe_detection(a, Instant::now());
        let trigger = json!({
            "automatic": true,
            "state": a.state,
            "reasons": a.reasons,
            // What rules out honest work (DESIGN.md 12): the kind, how long the
            // silence lasted, and each argument.
            "wedge": a.wedge.as_ref().map(|w| json!({
                "kind": w.kind,
                "silent_ms": w.silent_ms,
                "detection_ms": detection_ms,
                "ruled_out": w.ruled_out,
            })),
            "units": a.units,
            "last_probe": self.last_probe_view,
            "detected_mono_ms": detected_mono_ms,
            "breaker": { "nth": nth, "max": self.cfg.max_recoveries, "window_ms": self.cfg.recovery_window_ms },
        });
        if let Err(e) = self.ctx.journal.append(&operation_id, 0, "trigger", &trigger) {
            tracing::error!(pair = %self.pair.name, error = %e, "cannot journal the trigger; not recovering");
            let _ = self.ctx.journal.conclude(
                &operation_id,
                "failed",
                &json!({"verdict": "failed", "reasons": ["the trigger could not be journaled"]}),
            );
            return false;
        }
        tracing::error!(pair = %self.pair.name, operation = %operation_id, nth, reasons = ?a.reasons, kind = a.wedge.as_ref().map(|w| w.kind.as_str()), op_kind = kind, detection_ms, "pair wedged: automatic co-restart");
        self.own_ops.insert(operation_id.clone());
        self.running_op = Some(operation_id.clone());
        self.last_recovery = Some(RecoveryView {
            operation_id: operation_id.clone(),
            reasons: a.reasons.clone(),
            detected_mono_ms,
            concluded_mono_ms: None,
            verdict: None,
            kind: a.wedge.as_ref().map(|w| w.kind.as_str().to_string()),
            detection_ms,
        });
        self.publish("recovering", false, a.reasons.clone(), a.units.clone());
        let (tx, _rx) = mpsc::unbounded_channel();
        let op = async {
            if only_sick {
                crate::ops::repair::run(self.ctx.clone(), self.pair.clone(), operation_id.clone(), true, tx).await
            } else {
                run_operation(
                    self.ctx.clone(),
                    self.pair.clone(),
                    operation_id.clone(),
                    OperationKind::CoRestart,
                    tx,
                )
                .await
            }
        };
        let journal = self.ctx.journal.clone();
        let report = tokio::select! {
            r = crate::ops::guarded(&journal, &operation_id, op) => r,
            _ = shutdown.changed() => return true,
        };
        // A recovery whose task panicked is concluded `failed` by its guard;
        // the watch goes on (the breaker counted it).
        let report = match report {
            Ok(r) => r,
            Err(panic) => {
                tracing::error!(pair = %self.pair.name, operation = %operation_id, %panic, "automatic recovery panicked; concluded failed");
                if let Some(r) = self.last_recovery.as_mut() {
                    r.concluded_mono_ms = Some(mono_ms());
                    r.verdict = Some("failed".into());
                }
                while samples_rx.try_recv().is_ok() {}
                return false;
            }
        };
        let concluded_mono_ms = mono_ms();
        let _ = self.ctx.journal.append(
            &operation_id,
            report.total_ms,
            "recovery",
            &json!({ "verdict": report.verdict, "concluded_mono_ms": concluded_mono_ms }),
        );
        tracing::warn!(pair = %self.pair.name, operation = %operation_id, verdict = %report.verdict, total_ms = report.total_ms, "automatic recovery concluded");
        if let Some(r) = self.last_recovery.as_mut() {
            r.concluded_mono_ms = Some(concluded_mono_ms);
            r.verdict = Some(report.verdict.as_str().to_string());
        }
        // Samples from before and during the restart describe other processes.
        while samples_rx.try_recv().is_ok() {}
        false
    }

    /// Records a confirmed wedge's time to detect (onset → `now`) in the
    /// `pdwarden_wedge_detection_seconds` histogram; returns it in ms.
    fn observe_detection(&self, a: &Assessment, now: Instant) -> Option<u64> {
        let w = a.wedge.as_ref()?;
        let d = now.saturating_duration_since(w.onset);
        self.board
            .detection
            .get_or_create(&WedgeLabels {
                pair: self.pair.name.clone(),
                kind: w.kind.as_str().to_string(),
            })
            .observe(d.as_secs_f64());
        Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    fn publish_assessment(&mut self, a: &Assessment, now: Instant) {
        let _ = now;
        if let Some(reason) = self.breaker.held() {
            // Held pairs stay loud even when they look fine for a moment.
            let mut reasons = vec![reason.to_string()];
            reasons.extend(a.reasons.clone());
            self.publish("held", false, reasons, a.units.clone());
            return;
        }
        self.publish(
            a.state.as_str(),
            a.state == PairState::Healthy,
            a.reasons.clone(),
            a.units.clone(),
        );
    }

    /// Shows the pair's watch `state` on the board, and logs it through
    /// the [`LogGate`]: a change at its level, the same state at DEBUG
    /// (held, down and wedged again every minute).
    fn publish(&mut self, state: &str, ready: bool, reasons: Vec<String>, units: Vec<UnitAssessment>) {
        let hosts: BTreeMap<String, String> = self.engine_units().into_iter().map(|u| (u.unit, u.host)).collect();
        let now = Instant::now();
        let level = self.log.state(state, now);
        log_at!(level, pair = %self.pair.name, state, reasons = ?reasons, "watch");
        self.board.put(PairWatchView {
            pair: self.pair.name.clone(),
            state: state.into(),
            ready,
            reasons,
            held: self.breaker.held().map(str::to_string),
            auto_recover: self.cfg.auto_recover,
            recoveries_in_window: self.breaker.in_window(now),
            max_recoveries: self.cfg.max_recoveries,
            recovery_window_ms: self.cfg.recovery_window_ms,
            probes_sent: self.probes_sent,
            probes_deferred: self.probes_deferred,
            last_probe: self.last_probe_view.clone(),
            last_recovery: self.last_recovery.clone(),
            units: units
                .into_iter()
                .map(|a| WatchedUnit::of(hosts.get(&a.unit).cloned().unwrap_or_default(), a))
                .collect(),
        });
    }
}

/// How a watch probe ended: answered by the agent (its outcome is the
/// pair's), or lost on the way (it says nothing of the pair).
enum ProbeEnd {
    Answered(WatchProbe, Instant),
    Lost { why: String, at: Instant },
}

/// The agent's own probe result arrives within the probe's timeout; the
/// orchestrator waits this much longer for it before it calls the probe
/// lost (the agent, not the pair, did not answer).
const PROBE_ANSWER_GRACE: Duration = Duration::from_secs(2);

/// One probe through `router`, reported on `done`.
async fn probe(
    agents: Arc<dyn crate::ops::port::AgentPort>,
    router: UnitRef,
    chat: ChatProbe,
    timeout: Duration,
    work_ahead: u32,
    seq: u32,
    done: mpsc::UnboundedSender<ProbeEnd>,
) {
    let sent_at = Instant::now();
    let cmd = Command {
        fencing_token: 0,
        command_id: uuid::Uuid::new_v4().to_string(),
        action: Some(command::Action::Probe(ProbeRequest {
            unit: router.unit.clone(),
            chat: Some(chat),
            timeout_ms: timeout.as_millis() as u64,
            seq,
            pd_path: None,
        })),
    };
    let answer = agents
        .ask(
            &router.host,
            &router.unit,
            cmd,
            timeout + PROBE_ANSWER_GRACE,
            |r| match r {
                AgentReport::Probe(r) => Some(r),
                _ => None,
            },
        )
        .await;
    let (outcome, request_id) = match answer {
        // Not sent, or no answer from the agent: the agent's link, not the
        // pair's (the agent reports its own timeouts and errors).
        Err(e) => {
            let _ = done.send(ProbeEnd::Lost {
                why: format!("probe through {}: {e}", router.unit),
                at: Instant::now(),
            });
            return;
        }
        Ok(r) => (ProbeObservation::from_wire(&r), r.request_id.clone()),
    };
    let record = WatchProbe {
        target: format!("router:{}", router.unit),
        sent_at,
        timeout,
        work_ahead,
        outcome,
        request_id,
    };
    let _ = done.send(ProbeEnd::Answered(record, Instant::now()));
}

#[cfg(test)]
mod supervision_tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tokio::time::Instant;
    use tracing::Level;

    use super::{LogGate, WatchBoard, policy, restart_delays, run, supervise};
    use crate::ops::fake_agent::rig;
    use pdwarden_model::judge::wedge::{PairEvidence, UnitTrack, judge};

    /// The levels a gate gives `state` on every tick (500 ms) for `ticks` ticks.
    fn loud_lines(gate: &mut LogGate, state: &str, from: Instant, ticks: u32) -> Vec<(Duration, Level)> {
        (0..ticks)
            .map(|i| from + Duration::from_millis(500) * i)
            .map(|at| (at - from, gate.state(state, at)))
            .filter(|(_, level)| *level != Level::DEBUG)
            .collect()
    }

    const HOUR_OF_TICKS: u32 = 2 * 3_600;

    /// Issue 48's second red-team pass: after an orchestrator restart, two
    /// probes that never reached an agent ("agent local is not connected")
    /// made a healthy pair `failing`, and the watch co-restarted it. A probe
    /// its agent never ran is lost: it says nothing of the pair.
    #[tokio::test(start_paused = true)]
    async fn a_probe_its_agent_never_ran_is_lost_not_a_failure() {
        let port: Arc<dyn crate::ops::port::AgentPort> = Arc::new(crate::ops::fake_agent::FakePort::default());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let router = crate::config::UnitRef {
            host: "local".into(),
            unit: "router-0".into(),
        };
        super::probe(port, router, Default::default(), Duration::from_secs(5), 0, 1, tx).await;
        match rx.recv().await.expect("the probe ends") {
            super::ProbeEnd::Lost { why, .. } => {
                assert_eq!(why, "probe through router-0: agent local is not connected")
            }
            super::ProbeEnd::Answered(r, _) => panic!("counted as the pair's: {r:?}"),
        }
        // Lost twice, where two errors in a row are `failing`: no finding.
        let p = pdwarden_model::judge::wedge::WatchPolicy {
            min_probe_interval: Duration::from_secs(1),
            ..policy(&rig::xpyd_pair(1, 1, ""))
        };
        let t0 = Instant::now();
        let mut e = PairEvidence::new(
            vec![
                UnitTrack::new("prefill-0", "prefill"),
                UnitTrack::new("decode-0", "decode"),
            ],
            Duration::from_secs(1),
        );
        for i in 0..2u64 {
            let at = t0 + Duration::from_secs(5 * i);
            e.probe_sent_to(at, 10.0, "router:router-0".into(), Duration::from_secs(5), 0);
            e.probe_lost(at);
        }
        assert_eq!(e.failed_in_row, 0);
        assert!(!e.probe_in_flight);
        let a = judge(&e, &p, t0 + Duration::from_secs(11));
        assert_ne!(
            a.state,
            pdwarden_model::judge::wedge::PairState::Wedged,
            "{:?}",
            a.reasons
        );
    }

    /// Issue 31, item 5: a healthy idle pair judged every tick for an
    /// hour is one INFO line (it logged two lines a second).
    #[tokio::test(start_paused = true)]
    async fn a_healthy_pair_logs_once_an_hour_not_every_tick() {
        let mut gate = LogGate::default();
        let lines = loud_lines(&mut gate, "healthy", Instant::now(), HOUR_OF_TICKS);
        assert_eq!(lines, vec![(Duration::ZERO, Level::INFO)]);
        // A suspect pair is not repeated either: its change was the news.
        let lines = loud_lines(&mut gate, "suspect", Instant::now(), HOUR_OF_TICKS);
        assert_eq!(lines, vec![(Duration::ZERO, Level::WARN)]);
    }

    /// A down or held pair (and a wedge not recovered) stays loud, at
    /// most once a minute: ≤ 61 ERROR lines an hour, not 7,200.
    #[tokio::test(start_paused = true)]
    async fn a_down_or_held_pair_is_repeated_at_most_once_a_minute() {
        for state in ["down", "held", "wedged", "watch_failed"] {
            let mut gate = LogGate::default();
            let lines = loud_lines(&mut gate, state, Instant::now(), HOUR_OF_TICKS);
            assert!((60..=61).contains(&lines.len()), "{state}: {lines:?}");
            assert!(lines.iter().all(|(_, l)| *l == Level::ERROR), "{state}");
            assert!(
                lines.windows(2).all(|w| w[1].0 - w[0].0 >= LogGate::REPEAT),
                "{state}: {lines:?}"
            );
        }
    }

    /// Every change of state is a line at the state's level, whatever came
    /// before; the same state again is DEBUG.
    #[tokio::test(start_paused = true)]
    async fn every_state_change_is_a_line_at_its_level() {
        let mut gate = LogGate::default();
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let seen: Vec<(&str, Level)> = [
            "starting",
            "unproven",
            "unproven",
            "healthy",
            "suspect",
            "down",
            "down",
            "wedged",
            "recovering",
            "operation_running",
            "healthy",
            "held",
            "healthy",
        ]
        .into_iter()
        .enumerate()
        .map(|(i, s)| (s, gate.state(s, ms(500 * i as u64))))
        .collect();
        use Level as L;
        assert_eq!(
            seen,
            vec![
                ("starting", L::INFO),
                ("unproven", L::INFO),
                ("unproven", L::DEBUG),
                ("healthy", L::INFO),
                ("suspect", L::WARN),
                ("down", L::ERROR),
                ("down", L::DEBUG),
                ("wedged", L::ERROR),
                ("recovering", L::INFO),
                ("operation_running", L::INFO),
                ("healthy", L::INFO),
                ("held", L::ERROR),
                ("healthy", L::INFO),
            ]
        );
        // Any line by its key: a refusal once, a new one again; cleared, again.
        let mut gate = LogGate::default();
        assert_eq!(gate.level("a", L::ERROR, false, ms(0)), L::ERROR);
        assert_eq!(gate.level("a", L::ERROR, false, ms(3_600_000)), L::DEBUG);
        assert_eq!(gate.level("b", L::ERROR, false, ms(3_600_001)), L::ERROR);
        gate.clear();
        assert_eq!(gate.level("b", L::ERROR, false, ms(3_600_002)), L::ERROR);
    }

    /// Issue 31, item 4, second line of defence: a config that bypassed
    /// validation (`decode_tok_per_s = 1e-300` panicked the watch in
    /// `Duration::from_secs_f64`) gives a policy of bounded durations that
    /// the judge uses without panicking.
    #[tokio::test(start_paused = true)]
    async fn the_policy_of_any_config_is_bounded_and_never_panics() {
        let week = Duration::from_millis(pdwarden_proto::limits::MAX_DURATION_MS);
        for rate in [1e-300, 0.0, -1.0, f64::NAN, f64::INFINITY, 1e300] {
            let mut pair = rig::pair("after-prefill-ready", "");
            let w = &mut pair.watch;
            (w.decode_tok_per_s, w.prefill_tok_per_s) = (rate, rate);
            (w.max_prompt_tokens, w.max_output_tokens) = (u64::MAX, u64::MAX);
            w.prefill_chunk_tokens = Some(u64::MAX);
            for ms in [
                &mut w.stall_budget_ms,
                &mut w.scrape_interval_ms,
                &mut w.max_kv_transfer_ms,
                &mut w.idle_probe_interval_ms,
                &mut w.min_probe_interval_ms,
                &mut w.max_probe_timeout_ms,
                &mut w.recovery_window_ms,
            ] {
                *ms = u64::MAX;
            }
            w.idle_gauge_refresh_ms = Some(u64::MAX);
            let p = policy(&pair);
            for d in [
                p.stall_budget,
                p.max_prefill,
                p.max_generation,
                p.max_prefill_chunk,
                p.decode_step,
                p.max_kv_transfer,
                p.idle_probe_interval,
                p.min_probe_interval,
                p.scrape_interval,
                p.max_probe_timeout,
                p.stale_after,
                p.idle_gauge_refresh.unwrap(),
            ] {
                assert!(d <= week, "{rate}: {d:?}");
            }
            let units = vec![
                UnitTrack::new("prefill-0", "prefill"),
                UnitTrack::new("decode-0", "decode"),
            ];
            let evidence = PairEvidence::new(units, p.scrape_interval);
            let now = Instant::now();
            for later in [Duration::ZERO, Duration::from_secs(3_600), week] {
                let _ = judge(&evidence, &p, now + later);
            }
        }
    }

    /// The waits between restarts of a watch that keeps panicking: 1 s
    /// doubling, at most 30 s.
    #[test]
    fn restarts_back_off_from_one_second_to_thirty() {
        let secs: Vec<u64> = restart_delays().take(8).map(|d| d.as_secs()).collect();
        assert_eq!(secs, vec![1, 2, 4, 8, 16, 30, 30, 30]);
    }

    /// Issue 31, item 4: a panic in a pair's watch killed its task quietly
    /// (no watch line in `status`, `/ready` answering `{"pairs":[]}`). Now
    /// the pair shows `watch_failed` (not ready) with the panic's message in
    /// `status`, `/ready` and the state set, `pdwarden_watch_restarts_total`
    /// counts it, and the watch restarts after 1 s, then 2 s; the real
    /// watch then runs until shutdown. The panics come from the test's own
    /// watch factory, which production cannot reach.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_panicking_watch_is_reported_and_restarted() {
        let dir = tempfile::tempdir().unwrap();
        let journal = rig::journal(&dir);
        let agent = rig::agent();
        let ctx = rig::orchestrator(&journal, &agent).await;
        let pair = rig::pair("after-prefill-ready", "");
        let board = WatchBoard::default();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let starts: Arc<Mutex<Vec<Instant>>> = Arc::default();
        // The first two watches panic 100 ms in; the third is the real one.
        let watch = {
            let (pair, board, stop_rx, starts) = (pair.clone(), board.clone(), stop_rx.clone(), starts.clone());
            move || {
                let (ctx, pair, board, stop_rx) = (ctx.clone(), pair.clone(), board.clone(), stop_rx.clone());
                let nth = {
                    let mut s = starts.lock().unwrap();
                    s.push(Instant::now());
                    s.len()
                };
                async move {
                    if nth <= 2 {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        panic!("test hook: watch {nth} breaks");
                    }
                    run(ctx, pair, board, stop_rx).await
                }
            }
        };
        let task = tokio::spawn(supervise(pair.clone(), board.clone(), stop_rx, watch));
        let restarts_line = |n: u32| format!(r#"pdwarden_watch_restarts_total{{pair="p"}} {n}"#);

        tokio::time::sleep(Duration::from_millis(150)).await;
        let view = board.get("p").expect("a failed watch stays on the board (status)");
        assert_eq!((view.state.as_str(), view.ready), ("watch_failed", false));
        assert!(
            view.reasons[0].contains("test hook: watch 1 breaks") && view.reasons[0].contains("restart 1 in 1.0 s"),
            "{:?}",
            view.reasons
        );
        let (status, _, body) = crate::edge::ready::route("/ready", &board);
        assert_eq!(status, 503, "{body}");
        assert!(body.contains(r#""state":"watch_failed""#), "{body}");
        let (status, _, _) = crate::edge::ready::route("/ready/pair/p", &board);
        assert_eq!(status, 503);
        let metrics = crate::edge::ready::metrics(&board);
        for line in [
            restarts_line(1),
            r#"pdwarden_pair_watch_state{pair="p",state="watch_failed"} 1"#.to_string(),
            r#"pdwarden_pair_ready{pair="p"} 0.0"#.to_string(),
        ] {
            assert!(metrics.lines().any(|l| l == line), "missing {line}\n{metrics}");
        }

        // Restarted after 1 s, it panics again: 2 s this time.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        let view = board.get("p").unwrap();
        assert_eq!(view.state, "watch_failed");
        assert!(view.reasons[0].contains("restart 2 in 2.0 s"), "{:?}", view.reasons);

        // The third watch is the real one, and it stays.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let starts = starts.lock().unwrap().clone();
        assert_eq!(starts.len(), 3, "{starts:?}");
        assert_eq!(starts[1] - starts[0], Duration::from_millis(1_100));
        assert_eq!(starts[2] - starts[1], Duration::from_millis(2_100));
        let view = board.get("p").unwrap();
        assert_ne!(view.state, "watch_failed", "{view:?}");
        let metrics = crate::edge::ready::metrics(&board);
        assert!(metrics.lines().any(|l| l == restarts_line(2)), "{metrics}");

        stop_tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the supervisor ends at shutdown")
            .unwrap();
    }
}
