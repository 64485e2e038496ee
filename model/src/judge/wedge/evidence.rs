//! What the watch gathers for one pair, folded as it arrives: each engine's
//! samples ([`UnitTrack`]: when its counters last rose beyond the probes'
//! own tokens, since when work, KV in transit and bad health have lasted),
//! the watch's own probes (sent, in flight, answered) and the agents' facts
//! about every unit's process. Folding keeps only what the rules need, so
//! judging a pair never replays its history; nothing here decides anything.

use std::time::Duration;

use pdwarden_engines::{EngineKind, Moves, Signal};
use serde::Serialize;
use tokio::time::Instant;

use super::{ProbeObservation, WatchPolicy};

/// A finished probe's tokens show in an engine's counters by the next
/// scrape (SGLang counts them per prefill batch and decode step, and at
/// finish); its credit lapses after this many scrapes. Longer would let the
/// credit swallow real traffic's progress — and then the watch probes a pair
/// that traffic proves alive (found on the real stack: 12 % probe share).
const CREDIT_GRACE_SCRAPES: u32 = 2;

/// The numbers of one scrape that judgement uses (`None`: not exposed).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, serde::Deserialize)]
pub struct Metrics {
    pub running: f64,
    pub queued: f64,
    pub generation_tokens: Option<f64>,
    pub prompt_tokens: Option<f64>,
    pub realtime_tokens: Option<f64>,
    pub prefill_prealloc: Option<f64>,
    pub prefill_inflight: Option<f64>,
    pub decode_prealloc: Option<f64>,
    pub decode_transfer: Option<f64>,
    pub transfer_failed: Option<f64>,
    pub bootstrap_failed: Option<f64>,
    pub gpu_util: Option<f64>,
    /// The engine whose metric names the scrape found.
    pub engine: Option<EngineKind>,
}

impl Metrics {
    fn counter(&self, s: Signal) -> Option<f64> {
        match s {
            Signal::GenerationTokens => self.generation_tokens,
            Signal::PromptTokens => self.prompt_tokens,
            Signal::RealtimeTokens => self.realtime_tokens,
            _ => None,
        }
    }

    /// Requests the engine holds in any queue: running, waiting, or in a PD queue.
    pub fn in_flight(&self) -> f64 {
        self.running
            + self.queued
            + [
                self.prefill_prealloc,
                self.prefill_inflight,
                self.decode_prealloc,
                self.decode_transfer,
            ]
            .iter()
            .map(|v| v.unwrap_or(0.0).max(0.0))
            .sum::<f64>()
    }

    /// The engine's only work is KV in transit: a decode's requests waiting
    /// for KV, or a prefill's prefilled requests waiting for their decode to
    /// take it.
    pub(super) fn only_waiting_for_kv(&self) -> bool {
        self.running + self.queued <= 0.0
            && self.decode_transfer.unwrap_or(0.0)
                + self.decode_prealloc.unwrap_or(0.0)
                + self.prefill_inflight.unwrap_or(0.0)
                > 0.0
    }
}

/// One engine sample, stamped on arrival.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub at: Instant,
    /// Health path's HTTP status; 0 when it did not answer.
    pub health_status: u16,
    /// `None` when the metrics scrape failed.
    pub metrics: Option<Metrics>,
    pub error: String,
}

/// The token counters of one family (during work, or at finish), summed.
fn family(m: &Metrics, profile: &pdwarden_engines::Profile, moves: Moves) -> Option<f64> {
    let mut any = false;
    let mut sum = 0.0;
    for metric in profile.metrics.iter().filter(|x| x.moves == moves) {
        if let Some(v) = m.counter(metric.signal) {
            any = true;
            sum += v;
        }
    }
    any.then_some(sum)
}

/// What the watch knows of one engine, folded sample by sample.
#[derive(Debug, Clone)]
pub struct UnitTrack {
    pub unit: String,
    pub role: String,
    pub last: Option<Sample>,
    /// The first sample of this watch.
    pub first_at: Option<Instant>,
    /// When a counter last rose beyond the probes' credit (never the first sample).
    pub last_progress: Option<Instant>,
    /// When an at-finish counter last rose beyond the probes' credit (a
    /// request finished).
    pub last_finish_progress: Option<Instant>,
    /// When any counter last rose at all, the probes' own tokens included
    /// (an engine that computed its part of a probe is not silent).
    pub last_moved: Option<Instant>,
    /// Since when requests have been in flight without a break.
    pub work_since: Option<Instant>,
    /// Since when the prefill's inflight queue (KV being sent) has been non-empty.
    pub inflight_since: Option<Instant>,
    /// Since when the decode's KV-wait queues have been non-empty.
    pub kv_wait_since: Option<Instant>,
    /// When this engine's gauges last showed a KV transfer ending: its
    /// inflight queue (a prefill) or its KV-wait queues (a decode) shrank,
    /// or its running plus queued count rose while requests waited for KV
    /// (a decode's request joins its batch only once its KV has arrived).
    pub last_kv_landing: Option<Instant>,
    /// The last scrape's (inflight, KV-wait, running + queued) counts.
    kv_gauges: Option<(f64, f64, f64)>,
    /// Health answered 2xx at least once in this watch.
    pub health_seen_ok: bool,
    /// Since when health has not answered 2xx (after `health_seen_ok`).
    pub health_bad_since: Option<Instant>,
    /// Since when the metrics scrape has failed.
    pub scrape_bad_since: Option<Instant>,
    /// The last sample's counter families: (during work, at finish).
    counters: Option<(Option<f64>, Option<f64>)>,
    /// Tokens the watch's probes may still add to each family.
    credit: (f64, f64),
    /// The credit lapses after this (a probe's tokens show within a scrape
    /// of its answer); `None` while a probe is in flight.
    credit_expires: Option<Instant>,
    /// The last sample carried a counter that rises during work.
    pub has_work_signal: bool,
    /// The CPU time of the unit's process tree as its agent read it from
    /// /proc (`EngineSample.process_cpu_seconds`), stamped on arrival: the
    /// last [`CPU_READINGS`] of them, oldest first. Restarts with the process.
    cpu: std::collections::VecDeque<(Instant, f64)>,
}

/// CPU readings a track keeps: the suite's progress watch scrapes four
/// times per stall budget, so this spans several budgets.
const CPU_READINGS: usize = 32;

impl UnitTrack {
    pub fn new(unit: impl Into<String>, role: impl Into<String>) -> Self {
        UnitTrack {
            unit: unit.into(),
            role: role.into(),
            last: None,
            first_at: None,
            last_progress: None,
            last_moved: None,
            last_finish_progress: None,
            work_since: None,
            inflight_since: None,
            kv_wait_since: None,
            last_kv_landing: None,
            kv_gauges: None,
            health_seen_ok: false,
            health_bad_since: None,
            scrape_bad_since: None,
            counters: None,
            credit: (0.0, 0.0),
            credit_expires: None,
            has_work_signal: false,
            cpu: std::collections::VecDeque::new(),
        }
    }

    /// Folds in the CPU time (seconds) the unit's process tree had used at
    /// `at`, as its agent read it. A reading below the last one is a new
    /// process: the history starts over.
    pub fn observe_cpu(&mut self, at: Instant, seconds: f64) {
        if !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        if self.cpu.back().is_some_and(|&(_, last)| seconds < last) {
            self.cpu.clear();
        }
        self.cpu.push_back((at, seconds));
        while self.cpu.len() > CPU_READINGS {
            self.cpu.pop_front();
        }
    }

    /// The cores the unit's process tree used on average from `from` to its
    /// last CPU reading: measured from the last reading at or before `from`.
    /// `None` without a reading that old (no agent reading, a new process).
    pub fn cores_since(&self, from: Instant) -> Option<f64> {
        let &(t0, c0) = self.cpu.iter().rev().find(|(at, _)| *at <= from)?;
        let &(t1, c1) = self.cpu.back()?;
        let secs = t1.saturating_duration_since(t0).as_secs_f64();
        (secs > 0.0).then(|| (c1 - c0).max(0.0) / secs)
    }

    /// Whether the engine has a counter that rises during work: what its
    /// scrapes showed, or — before any scrape answered (a unit that froze
    /// right after a restart) — what its profile says, not "unknown, so the
    /// longest request" (issue 31: a 416 s silence floor for an engine that
    /// never answered).
    pub fn work_signal(&self, p: &WatchPolicy) -> bool {
        if self.counters.is_some() {
            return self.has_work_signal;
        }
        self.engine(p)
            .profile()
            .metrics
            .iter()
            .any(|m| m.moves == Moves::DuringWork && m.since.is_empty())
    }

    /// The engine kind of this unit: what its metrics show, else the pair's.
    pub fn engine(&self, p: &WatchPolicy) -> EngineKind {
        self.last
            .as_ref()
            .and_then(|s| s.metrics)
            .and_then(|m| m.engine)
            .unwrap_or(p.engine)
    }

    /// A probe was sent: it may add up to `tokens` to each counter family.
    pub fn credit_probe(&mut self, tokens: f64) {
        let cap = tokens * 4.0;
        self.credit = ((self.credit.0 + tokens).min(cap), (self.credit.1 + tokens).min(cap));
        self.credit_expires = None;
    }

    /// Folds one sample in; `engine` is the pair's engine kind.
    pub fn observe(&mut self, s: Sample, engine: EngineKind) {
        self.first_at.get_or_insert(s.at);
        let health_ok = (200..300).contains(&s.health_status);
        if health_ok {
            self.health_seen_ok = true;
            self.health_bad_since = None;
        } else if self.health_seen_ok && self.health_bad_since.is_none() {
            self.health_bad_since = Some(s.at);
        }
        match &s.metrics {
            None => {
                self.scrape_bad_since.get_or_insert(s.at);
            }
            Some(m) => {
                self.scrape_bad_since = None;
                if self.credit_expires.is_some_and(|t| s.at > t) {
                    self.credit = (0.0, 0.0);
                    self.credit_expires = None;
                }
                let profile = m.engine.unwrap_or(engine).profile();
                let now = (
                    family(m, profile, Moves::DuringWork),
                    family(m, profile, Moves::AtFinish),
                );
                self.has_work_signal = now.0.is_some();
                if let Some(prev) = self.counters {
                    let back = |a: Option<f64>, b: Option<f64>| matches!((a, b), (Some(a), Some(b)) if a < b);
                    if back(now.0, prev.0) || back(now.1, prev.1) {
                        // Counters went backwards: a new process. Start over.
                        self.work_since = None;
                        self.last_progress = None;
                        self.last_moved = None;
                        self.last_finish_progress = None;
                        self.inflight_since = None;
                        self.kv_wait_since = None;
                        self.last_kv_landing = None;
                        self.kv_gauges = None;
                        self.credit = (0.0, 0.0);
                    } else {
                        let delta = |a: Option<f64>, b: Option<f64>| match (a, b) {
                            (Some(a), Some(b)) => a - b,
                            _ => 0.0,
                        };
                        let (dw, df) = (delta(now.0, prev.0), delta(now.1, prev.1));
                        if dw > 0.0 || df > 0.0 {
                            self.last_moved = Some(s.at);
                        }
                        let beyond = |d: f64, credit: &mut f64| {
                            if d <= 0.0 {
                                return false;
                            }
                            if d <= *credit {
                                *credit -= d;
                                false
                            } else {
                                *credit = 0.0;
                                true
                            }
                        };
                        let work = beyond(dw, &mut self.credit.0);
                        let finish = beyond(df, &mut self.credit.1);
                        if finish {
                            self.last_finish_progress = Some(s.at);
                        }
                        if work || finish {
                            self.last_progress = Some(s.at);
                        }
                    }
                }
                self.counters = Some(now);
                let kv_wait = m.decode_transfer.unwrap_or(0.0) + m.decode_prealloc.unwrap_or(0.0);
                let gauges = (m.prefill_inflight.unwrap_or(0.0), kv_wait, m.running + m.queued);
                if let Some((inflight, waiting, batch)) = self.kv_gauges
                    && (gauges.0 < inflight || gauges.1 < waiting || (waiting > 0.0 && gauges.2 > batch))
                {
                    self.last_kv_landing = Some(s.at);
                }
                self.kv_gauges = Some(gauges);
                let since = |slot: &mut Option<Instant>, present: bool| {
                    if present {
                        slot.get_or_insert(s.at);
                    } else {
                        *slot = None;
                    }
                };
                since(&mut self.work_since, m.in_flight() > 0.0);
                since(&mut self.inflight_since, m.prefill_inflight.unwrap_or(0.0) > 0.0);
                since(&mut self.kv_wait_since, kv_wait > 0.0);
            }
        }
        self.last = Some(s);
    }

    /// Since when work has been present without progress.
    pub(super) fn silent_since(&self) -> Option<Instant> {
        let since = self.work_since?;
        Some(self.last_progress.map_or(since, |p| p.max(since)))
    }

    /// Whether a counter rose beyond the probes' credit after `t`.
    pub(super) fn progressed_after(&self, t: Instant) -> bool {
        self.last_progress.is_some_and(|p| p > t)
    }

    /// Whether any counter rose after `t`, the probes' own tokens included.
    pub(super) fn moved_after(&self, t: Instant) -> bool {
        self.last_moved.is_some_and(|p| p > t)
    }
}

/// A finished probe.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchProbe {
    pub target: String,
    pub sent_at: Instant,
    pub timeout: Duration,
    /// Requests ahead of it (running + queued) its timeout had to cover.
    pub work_ahead: u32,
    pub outcome: ProbeObservation,
    pub request_id: String,
}

/// Everything judged for one pair.
#[derive(Debug, Clone)]
pub struct PairEvidence {
    pub units: Vec<UnitTrack>,
    pub probe_in_flight: bool,
    pub last_probe_sent: Option<Instant>,
    pub last_probe: Option<WatchProbe>,
    /// When the last probe's result arrived.
    pub last_probe_done: Option<Instant>,
    /// When liveness was last proven by a probe or a healthy operation, and how.
    pub last_proof: Option<(Instant, String)>,
    /// When a probe last succeeded (a stall it survived is a partial wedge).
    pub last_probe_ok: Option<Instant>,
    /// The agent's scrape period (how soon a probe's tokens show).
    pub scrape_interval: Duration,
    /// The probe in flight, if one was sent with its target
    /// ([`PairEvidence::probe_sent_to`]): re-judged as samples arrive.
    pub in_flight: Option<InFlightProbe>,
    /// The pair answered warm since the engines last started over (a
    /// healthy operation's verification, or a probe that answered).
    pub proven_warm: bool,
    /// Probes sent since the watch last started over (an operation ended,
    /// or the watch started): right after a restart, when pairs break most,
    /// the watch probes at the minimum gap and doubles it towards the idle
    /// interval ([`PairEvidence::idle_interval`]).
    pub probes_since_reset: u32,
    /// The agents' facts about every unit of the pair, refreshed each tick.
    pub lives: Vec<AgentFact>,
    /// Probes that failed with an error (not a timeout) in a row, and when
    /// the first of them was sent.
    pub failed_in_row: u32,
    pub first_failure_sent: Option<Instant>,
}

/// What a unit's agent says of its process (DESIGN.md 2: facts from the
/// agent), for every unit of the pair, the router included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Life {
    /// Running, or starting, under its agent.
    Running,
    /// Not running: never started, or stopped on command.
    Stopped,
    /// Exited on its own; how, in the agent's words.
    Exited { detail: String },
    /// Its agent is not connected: nothing is known.
    Unknown,
}

/// One unit's [`Life`], as the watch last read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentFact {
    pub unit: String,
    pub role: String,
    pub life: Life,
}

/// A probe the watch sent and has no answer for yet.
#[derive(Debug, Clone, PartialEq)]
pub struct InFlightProbe {
    pub target: String,
    pub sent_at: Instant,
    /// The timeout it was sent with (what was known then).
    pub timeout: Duration,
    pub work_ahead: u32,
}

impl PairEvidence {
    pub fn new(units: Vec<UnitTrack>, scrape_interval: Duration) -> Self {
        PairEvidence {
            scrape_interval,
            units,
            probe_in_flight: false,
            last_probe_sent: None,
            last_probe: None,
            last_probe_done: None,
            last_proof: None,
            last_probe_ok: None,
            in_flight: None,
            proven_warm: false,
            probes_since_reset: 0,
            lives: Vec::new(),
            failed_in_row: 0,
            first_failure_sent: None,
        }
    }

    /// As [`PairEvidence::probe_sent`], remembering where the probe went
    /// and the timeout it was sent with, so that a probe sent while the
    /// work ahead was unknown is re-judged once the gauges show it.
    pub fn probe_sent_to(&mut self, now: Instant, tokens: f64, target: String, timeout: Duration, work_ahead: u32) {
        self.probe_sent(now, tokens);
        self.in_flight = Some(InFlightProbe {
            target,
            sent_at: now,
            timeout,
            work_ahead,
        });
    }

    /// The agents' facts about every unit of the pair (the watcher reads
    /// them each tick).
    pub fn set_lives(&mut self, lives: Vec<AgentFact>) {
        self.lives = lives;
    }

    /// The idle probe interval in effect: the minimum gap doubled for each
    /// probe since the watch started over, up to `idle_probe_interval`.
    pub fn idle_interval(&self, p: &WatchPolicy) -> Duration {
        // Real traffic has advanced every engine since the watch started
        // over: it proves liveness as it goes, no early probes needed.
        if !self.units.is_empty() && self.units.iter().all(|u| u.last_progress.is_some()) {
            return p.idle_probe_interval;
        }
        let doubled = p
            .min_probe_interval
            .saturating_mul(1u32 << self.probes_since_reset.min(16));
        doubled
            .min(p.idle_probe_interval)
            .max(p.min_probe_interval.min(p.idle_probe_interval))
    }

    /// A probe's own budget before the work ahead: the warm budget once the
    /// pair has answered warm, else the cold allowance.
    pub fn probe_budget(&self, p: &WatchPolicy) -> Duration {
        if self.proven_warm {
            // Never shorter than the stall budget: a probe that times out
            // sooner would outrun the rules that name what is stuck (the
            // stall, the KV transfer) with a bare "silent".
            p.warm_probe_timeout.max(p.stall_budget).min(p.probe_timeout)
        } else {
            p.probe_timeout
        }
    }

    pub fn observe(&mut self, unit: &str, sample: Sample, engine: EngineKind) {
        if let Some(u) = self.units.iter_mut().find(|u| u.unit == unit) {
            u.observe(sample, engine);
        }
    }

    /// A probe leaves: every engine is credited with the tokens it may add.
    pub fn probe_sent(&mut self, now: Instant, tokens: f64) {
        self.probe_in_flight = true;
        self.last_probe_sent = Some(now);
        self.probes_since_reset = self.probes_since_reset.saturating_add(1);
        for u in &mut self.units {
            u.credit_probe(tokens);
        }
    }

    /// A probe that never reached the pair, or whose answer never came
    /// back (its agent was not connected, or dropped the link): it says
    /// nothing of the pair, so it is neither a failure nor a proof
    /// (issue 48's second red-team pass: after an orchestrator restart,
    /// two "agent local is not connected" errors made a healthy pair
    /// `failing`, and the watch co-restarted it). The next probe goes at
    /// the usual gap.
    pub fn probe_lost(&mut self, done_at: Instant) {
        self.probe_in_flight = false;
        self.in_flight = None;
        for u in &mut self.units {
            if u.credit != (0.0, 0.0) {
                u.credit_expires = Some(done_at + self.scrape_interval * CREDIT_GRACE_SCRAPES);
            }
        }
    }

    pub fn probe_done(&mut self, record: WatchProbe, done_at: Instant) {
        self.probe_in_flight = false;
        self.in_flight = None;
        for u in &mut self.units {
            if u.credit != (0.0, 0.0) {
                u.credit_expires = Some(done_at + self.scrape_interval * CREDIT_GRACE_SCRAPES);
            }
        }
        match record.outcome {
            ProbeObservation::Ok { .. } => {
                self.last_proof = Some((done_at, format!("probe through {} answered", record.target)));
                self.last_probe_ok = Some(done_at);
                self.proven_warm = true;
                self.failed_in_row = 0;
                self.first_failure_sent = None;
            }
            ProbeObservation::Error { .. } => {
                self.failed_in_row = self.failed_in_row.saturating_add(1);
                self.first_failure_sent.get_or_insert(record.sent_at);
            }
            ProbeObservation::Timeout { .. } => {
                self.failed_in_row = 0;
                self.first_failure_sent = None;
            }
        }
        self.last_probe = Some(record);
        self.last_probe_done = Some(done_at);
    }

    /// Forgets everything but the proof (after a restart of the pair's units).
    pub fn reset(&mut self, proof: Option<(Instant, String)>) {
        for u in &mut self.units {
            *u = UnitTrack::new(u.unit.clone(), u.role.clone());
        }
        self.probe_in_flight = false;
        self.in_flight = None;
        self.last_probe = None;
        self.last_probe_ok = None;
        // A healthy operation's verification answered warm: fresh evidence
        // the watch starts from.
        self.proven_warm = proof.is_some();
        self.probes_since_reset = 0;
        self.failed_in_row = 0;
        self.first_failure_sent = None;
        self.last_proof = proof;
    }
}
