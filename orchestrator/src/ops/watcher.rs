//! The continuous watch of each pair, and its automatic recovery.
//!
//! One task per pair. It asks the agents of the pair's engines for a passive
//! watch (`WatchEngines`: metrics + health scrapes, no generation), folds the
//! `EngineSample`s into [`PairEvidence`], and lets the pure [`crate::judge::wedge`]
//! module judge them on every tick. It only does what the judgement asks:
//! an active probe through the pair's router when passive evidence is
//! missing or suspicious (never while traffic proves liveness, with a timeout
//! that covers the prefills queued ahead), and, for a confirmed wedge, the
//! same ordered co-restart an operator would run, journaled as an automatic
//! operation whose `trigger` entry holds the evidence. A [`Breaker`] bounds
//! the automatic recoveries; past it the pair is held for a human, loudly
//! (status, readiness endpoint and its metrics, an error log every tick).
//!
//! While any operation runs on the pair (an operator's or its own) the watch
//! stands aside and forgets its evidence: restarted engines start their
//! counters over. A healthy operation counts as proof of liveness; a healthy
//! operation run by a human releases a held pair.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pdwarden_proto::v1::{ChatProbe, Command, EngineSample, ProbeRequest, WatchEngines, WatchTarget, command};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use serde::Serialize;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};

use crate::config::{PairConfig, UnitRef, WatchConfig};
use crate::ops::corestart::{OperationContext, OperationKind, run_operation};
use crate::ops::journal::JournalError;
use crate::ops::port::AgentReport;
use pdwarden_engines::EngineKind;

use crate::judge::wedge::{
    Assessment, Breaker, BreakerDecision, Metrics, PairEvidence, PairState, PastOperation, ProbeDecision,
    ProbeObservation, Sample, UnitAssessment, UnitTrack, WatchPolicy, WatchProbe, judge, recoveries_still_counting,
};

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

/// What `status`, the readiness endpoint and its metrics show of one pair.
#[derive(Debug, Clone, Serialize)]
pub struct PairWatchView {
    pub pair: String,
    /// `healthy`, `unproven`, `suspect`, `wedged`, `down`, `recovering`,
    /// `operation_running`, `held` or `starting`.
    pub state: String,
    /// What the readiness endpoint answers: only a `healthy` pair is ready.
    pub ready: bool,
    pub reasons: Vec<String>,
    /// Set when the circuit breaker holds the pair for a human.
    pub held: Option<String>,
    pub auto_recover: bool,
    pub recoveries_in_window: u32,
    pub max_recoveries: u32,
    pub recovery_window_ms: u64,
    pub probes_sent: u64,
    pub probes_deferred: u64,
    pub last_probe: Option<serde_json::Value>,
    pub last_recovery: Option<RecoveryView>,
    pub units: Vec<WatchedUnit>,
}

#[derive(Debug, Clone, Serialize)]
pub struct WatchedUnit {
    pub host: String,
    #[serde(flatten)]
    pub assessment: UnitAssessment,
}

impl WatchedUnit {
    /// A unit is ready when it serves or idles (not stalled, wedged, down or unknown).
    pub fn ready(&self) -> bool {
        matches!(
            self.assessment.state,
            crate::judge::wedge::UnitState::Serving | crate::judge::wedge::UnitState::Idle
        )
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RecoveryView {
    pub operation_id: String,
    /// The evidence that triggered it.
    pub reasons: Vec<String>,
    /// CLOCK_MONOTONIC ms when the wedge was confirmed and when the recovery concluded.
    pub detected_mono_ms: f64,
    pub concluded_mono_ms: Option<f64>,
    pub verdict: Option<String>,
    /// The wedge's kind and the time from its onset to its confirmation.
    pub kind: Option<String>,
    pub detection_ms: Option<u64>,
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
                if let Some(m) = u.assessment.metrics {
                    out.entry(u.host.clone())
                        .or_default()
                        .insert(u.assessment.unit.clone(), m.queued.max(0.0).round() as u64);
                }
            }
        }
        out
    }

    fn put(&self, view: PairWatchView) {
        self.views
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(view.pair.clone(), view);
    }
}

/// The pure policy of a pair's watch, from its config.
pub fn policy(pair: &PairConfig) -> WatchPolicy {
    let w = &pair.watch;
    let ms = Duration::from_millis;
    // A probe's tokens as the engine counts them: words are a lower bound,
    // so twice the words, its output, and a chat template's overhead.
    let prompt_words = pair.probe.prompt.split_whitespace().count() as f64;
    WatchPolicy {
        stall_budget: ms(w.stall_budget_ms),
        max_prefill: ms(w.max_prefill_ms()),
        max_generation: ms(w.max_generation_ms()),
        max_prefill_chunk: ms(w.max_prefill_chunk_ms()),
        decode_step: Duration::from_secs_f64(1.0 / w.decode_tok_per_s),
        idle_gauge_refresh: w.idle_gauge_refresh_ms.map(ms),
        max_kv_transfer: ms(w.max_kv_transfer_ms),
        serial: !pair.suite.concurrency.engines_batch,
        engine: w.engine,
        probe_tokens: 2.0 * prompt_words + f64::from(pair.probe.max_tokens) + 64.0,
        idle_probe_interval: ms(w.idle_probe_interval_ms),
        min_probe_interval: ms(w.min_probe_interval_ms),
        probe_timeout: ms(pair.probe.cold_allowance_ms.min(pair.probe.probe_timeout_ms)),
        scrape_interval: ms(w.scrape_interval_ms),
        max_probe_timeout: ms(w.max_probe_timeout_ms),
        stale_after: ms(w.scrape_interval_ms * 3 + 2_000),
        gpu_idle_below: w.gpu_idle_below,
    }
}

/// The watch command on one host.
struct HostWatch {
    command_id: String,
    reports: Option<mpsc::UnboundedReceiver<AgentReport>>,
    active: bool,
    last_attempt: Option<Instant>,
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
    probes_tx: mpsc::UnboundedSender<(WatchProbe, Instant)>,
    probes_sent: u64,
    /// The preflight's last refusal of an automatic recovery (logged once).
    last_refusal: Option<Vec<String>>,
    probes_deferred: u64,
    probe_seq: u32,
    /// The router whose probe failed last: the next probe avoids it when it can.
    failed_router: Option<UnitRef>,
    /// The operation seen running on the pair at the last tick.
    running_op: Option<String>,
    own_ops: HashSet<String>,
    last_recovery: Option<RecoveryView>,
    last_probe_view: Option<serde_json::Value>,
    last_log: Option<(PairState, Vec<String>)>,
}

/// Starts the watch of every pair whose `watch.enabled` is set. The tasks end
/// when `shutdown` turns true.
pub fn spawn_all(
    ctx: &OperationContext,
    pairs: &[PairConfig],
    board: &WatchBoard,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    pairs
        .iter()
        .filter(|p| p.watch.enabled)
        .map(|p| tokio::spawn(run(ctx.clone(), p.clone(), board.clone(), shutdown.clone())))
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
        last_refusal: None,
        probes_deferred: 0,
        probe_seq: 0,
        failed_router: None,
        running_op: None,
        own_ops: HashSet::new(),
        last_recovery: None,
        last_probe_view: None,
        last_log: None,
    };
    w.seed_breaker_from_journal();
    let period = Duration::from_millis(w.cfg.scrape_interval_ms.min(500));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    w.publish("starting", false, vec!["watch starting".into()], Vec::new());
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            Some(s) = samples_rx.recv() => w.on_sample(s),
            Some((record, done_at)) = probes_rx.recv() => w.on_probe(record, done_at),
            _ = tick.tick() => {
                let stop = w.on_tick(&mut samples_rx, &mut shutdown).await;
                if stop {
                    break;
                }
            }
        }
    }
    for h in w.hosts.values() {
        w.ctx.agents.forget(&h.command_id);
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
        self.evidence.observe(
            &s.unit,
            Sample {
                at: Instant::now(),
                health_status: u16::try_from(s.health_status).unwrap_or(0),
                metrics,
                error: s.error,
            },
            self.policy.engine,
        );
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
            });
            if let Some(rx) = h.reports.as_mut() {
                while let Ok(r) = rx.try_recv() {
                    match r {
                        AgentReport::Disconnected => h.active = false,
                        AgentReport::Result(r) if !r.ok => {
                            tracing::warn!(pair = %self.pair.name, host, error = %r.error, "agent refused the watch");
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
    fn running_operation(&self) -> Option<(String, Option<String>)> {
        match self.ctx.journal.history(&self.pair.name, 1) {
            Ok(h) => h
                .into_iter()
                .find(|r| r.ended_unix_ms.is_none())
                .map(|r| (r.operation_id, None)),
            Err(e) => {
                tracing::warn!(pair = %self.pair.name, error = %e, "cannot read the journal");
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
        let a = judge(&self.evidence, &self.policy, now);
        if a.state != PairState::Wedged {
            self.maybe_probe(&a, now);
            self.publish_assessment(&a, now);
            return false;
        }
        let newly_wedged = self.last_log.as_ref().is_none_or(|(st, _)| *st != PairState::Wedged);
        self.log_change(&a);
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
            if self.last_refusal.as_ref() != Some(&refusal.reasons) {
                tracing::error!(pair = %self.pair.name, %refusal, "pair wedged, NOT recovering automatically");
                self.last_refusal = Some(refusal.reasons.clone());
            }
            let mut reasons = vec![format!("not recovering automatically: {refusal}")];
            reasons.extend(a.reasons.clone());
            self.publish("wedged", false, reasons, a.units.clone());
            return false;
        }
        self.last_refusal = None;
        match self.breaker.decide(now) {
            BreakerDecision::Hold { reason } => {
                tracing::error!(pair = %self.pair.name, reasons = ?a.reasons, "{reason}: pair wedged, NOT recovering automatically");
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
                tracing::info!(pair = %self.pair.name, "probe deferred: {why}");
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
                self.evidence.probe_sent(now, self.policy.probe_tokens);
                tracing::info!(pair = %self.pair.name, router = %router, timeout_ms = timeout.as_millis() as u64, work_ahead, "probe: {why}");
                let chat = ChatProbe {
                    model: self.pair.probe.model.clone(),
                    prompt: self.pair.probe.prompt.clone(),
                    max_tokens: self.pair.probe.max_tokens,
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
        let operation_id = match self.ctx.begin(
            OperationKind::CoRestart.as_str(),
            &self.pair.name,
            Some(&request_id),
            &[],
        ) {
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
        tracing::error!(pair = %self.pair.name, operation = %operation_id, nth, reasons = ?a.reasons, kind = a.wedge.as_ref().map(|w| w.kind.as_str()), detection_ms, "pair wedged: automatic co-restart");
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
        let op = run_operation(
            self.ctx.clone(),
            self.pair.clone(),
            operation_id.clone(),
            OperationKind::CoRestart,
            tx,
        );
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

    fn log_change(&mut self, a: &Assessment) {
        let key = (a.state, a.reasons.clone());
        if self.last_log.as_ref() != Some(&key) {
            match a.state {
                PairState::Wedged | PairState::Down => {
                    tracing::error!(pair = %self.pair.name, state = a.state.as_str(), reasons = ?a.reasons, "watch")
                }
                PairState::Suspect => {
                    tracing::warn!(pair = %self.pair.name, state = a.state.as_str(), reasons = ?a.reasons, "watch")
                }
                _ => tracing::info!(pair = %self.pair.name, state = a.state.as_str(), reasons = ?a.reasons, "watch"),
            }
            self.last_log = Some(key);
        }
    }

    fn publish_assessment(&mut self, a: &Assessment, now: Instant) {
        self.log_change(a);
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

    fn publish(&mut self, state: &str, ready: bool, reasons: Vec<String>, units: Vec<UnitAssessment>) {
        let hosts: BTreeMap<String, String> = self.engine_units().into_iter().map(|u| (u.unit, u.host)).collect();
        let now = Instant::now();
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
                .map(|a| WatchedUnit {
                    host: hosts.get(&a.unit).cloned().unwrap_or_default(),
                    assessment: a,
                })
                .collect(),
        });
    }
}

/// One probe through `router`, reported on `done`.
async fn probe(
    agents: Arc<dyn crate::ops::port::AgentPort>,
    router: UnitRef,
    chat: ChatProbe,
    timeout: Duration,
    work_ahead: u32,
    seq: u32,
    done: mpsc::UnboundedSender<(WatchProbe, Instant)>,
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
    let mut request_id = String::new();
    let answer = agents
        .ask(&router.host, &router.unit, cmd, timeout, |r| match r {
            AgentReport::Probe(r) => Some(r),
            _ => None,
        })
        .await;
    let outcome = match answer {
        Err(e) => ProbeObservation::Error { message: e.to_string() },
        Ok(r) => {
            request_id = r.request_id.clone();
            ProbeObservation::from_wire(&r)
        }
    };
    let record = WatchProbe {
        target: format!("router:{}", router.unit),
        sent_at,
        timeout,
        work_ahead,
        outcome,
        request_id,
    };
    let _ = done.send((record, Instant::now()));
}
