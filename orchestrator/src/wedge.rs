//! Wedge judgement: passive engine samples and active probe results in,
//! a verdict with its numbers out. Pure: no I/O, no clock; `now` is handed in
//! (DESIGN.md 3), so INCIDENTS rows 4 and 5 are unit tests below.
//!
//! The rules, each reported with its numbers:
//! - **Stall**: an engine has requests running or queued while its token
//!   counters do not advance. On a serial engine a legitimate long prefill
//!   looks exactly like that, so unless the GPU is known to be idle the stall
//!   must outlast the worst prefill (`max_prefill`) plus the stall budget
//!   before it is a wedge; with the GPU near zero, the budget alone suffices.
//! - **Generation silent while health answers 200**: a probe whose timeout
//!   covered every prefill queued ahead of it timed out, and no engine has
//!   produced a token since it was sent.
//! - **Health gone bad**: health answered 200 earlier in this watch and has
//!   not for the stall budget while `/metrics` still answers (SGLang's health
//!   runs a generation that times out when the scheduler is stuck). With
//!   requests running or queued (and the GPU not known idle) the allowance is
//!   the stall budget plus the worst prefill: the same health answers 503 after
//!   20 s of a legitimate long prefill (sgl-project/sglang#22511).
//!
//! Active probes are asked for only when passive evidence is missing (stale
//! or absent samples) or suspicious (a stall past the budget but not yet past
//! the worst prefill), or when nothing has proved liveness for
//! `idle_probe_interval`; never while real traffic advances every engine's
//! token counters. Their timeout covers the worst prefill queued ahead of
//! them; a probe that cannot be given such a timeout is deferred, not sent
//! to be abandoned mid-prefill (INCIDENTS row 4).
//!
//! [`Breaker`] bounds automatic recoveries per pair per window.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

/// Budgets and rates of a pair's watch (from `[pair.watch]`).
#[derive(Debug, Clone, PartialEq)]
pub struct WatchPolicy {
    /// Work present without progress this long is suspicious; with the GPU
    /// known idle, a wedge.
    pub stall_budget: Duration,
    /// The longest legitimate prefill: `max_prompt_tokens / prefill_tok_per_s`.
    pub max_prefill: Duration,
    /// Without other proof of liveness, at most one probe per this interval.
    pub idle_probe_interval: Duration,
    /// The minimum gap between two probes, whatever the reason.
    pub min_probe_interval: Duration,
    /// A probe's own budget, before the prefills queued ahead are added.
    pub probe_timeout: Duration,
    /// A probe that would need longer is deferred instead of sent.
    pub max_probe_timeout: Duration,
    /// A sample older than this is missing evidence.
    pub stale_after: Duration,
    /// GPU utilisation (0..1) below which the GPU counts as idle.
    pub gpu_idle_below: f64,
}

/// The numbers of one scrape that judgement uses.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Metrics {
    pub running: f64,
    pub queued: f64,
    pub generation_tokens: Option<f64>,
    pub prompt_tokens: Option<f64>,
    pub gpu_util: Option<f64>,
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

/// What the watch knows of one engine, folded sample by sample.
#[derive(Debug, Clone)]
pub struct UnitTrack {
    pub unit: String,
    pub role: String,
    pub last: Option<Sample>,
    /// The first sample of this watch.
    pub first_at: Option<Instant>,
    /// When a token counter last advanced (never the first sample).
    pub last_progress: Option<Instant>,
    /// Since when requests have been running or queued without a break.
    pub work_since: Option<Instant>,
    /// Health answered 2xx at least once in this watch.
    pub health_seen_ok: bool,
    /// Since when health has not answered 2xx (after `health_seen_ok`).
    pub health_bad_since: Option<Instant>,
    /// Since when the metrics scrape has failed.
    pub scrape_bad_since: Option<Instant>,
    /// Counters of the last sample that had them.
    counters: Option<(f64, f64)>,
}

impl UnitTrack {
    pub fn new(unit: impl Into<String>, role: impl Into<String>) -> Self {
        UnitTrack {
            unit: unit.into(),
            role: role.into(),
            last: None,
            first_at: None,
            last_progress: None,
            work_since: None,
            health_seen_ok: false,
            health_bad_since: None,
            scrape_bad_since: None,
            counters: None,
        }
    }

    /// Folds one sample in.
    pub fn observe(&mut self, s: Sample) {
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
                let now = (m.generation_tokens.unwrap_or(0.0), m.prompt_tokens.unwrap_or(0.0));
                if let Some(prev) = self.counters {
                    if now.0 < prev.0 || now.1 < prev.1 {
                        // Counters went backwards: a new process. Start over.
                        self.work_since = None;
                        self.last_progress = None;
                    } else if now.0 > prev.0 || now.1 > prev.1 {
                        self.last_progress = Some(s.at);
                    }
                }
                self.counters = Some(now);
                if m.running + m.queued > 0.0 {
                    self.work_since.get_or_insert(s.at);
                } else {
                    self.work_since = None;
                }
            }
        }
        self.last = Some(s);
    }

    /// How long work has been present without progress.
    fn stalled_for(&self, now: Instant) -> Option<Duration> {
        let since = self.work_since?;
        let silent_since = self.last_progress.map_or(since, |p| p.max(since));
        Some(now.saturating_duration_since(silent_since))
    }
}

/// An active probe's outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ProbeOutcome {
    Ok { latency_ms: u64 },
    Timeout { after_ms: u64 },
    Error { message: String },
}

/// A finished probe.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeRecord {
    pub target: String,
    pub sent_at: Instant,
    pub timeout: Duration,
    /// Requests ahead of it (running + queued) its timeout had to cover.
    pub work_ahead: u32,
    pub outcome: ProbeOutcome,
    pub request_id: String,
}

/// Everything judged for one pair.
#[derive(Debug, Clone)]
pub struct PairEvidence {
    pub units: Vec<UnitTrack>,
    pub probe_in_flight: bool,
    pub last_probe_sent: Option<Instant>,
    pub last_probe: Option<ProbeRecord>,
    /// When the last probe's result arrived.
    pub last_probe_done: Option<Instant>,
    /// When liveness was last proven by a probe or a healthy operation, and how.
    pub last_proof: Option<(Instant, String)>,
}

impl PairEvidence {
    pub fn new(units: Vec<UnitTrack>) -> Self {
        PairEvidence {
            units,
            probe_in_flight: false,
            last_probe_sent: None,
            last_probe: None,
            last_probe_done: None,
            last_proof: None,
        }
    }

    pub fn observe(&mut self, unit: &str, sample: Sample) {
        if let Some(u) = self.units.iter_mut().find(|u| u.unit == unit) {
            u.observe(sample);
        }
    }

    pub fn probe_done(&mut self, record: ProbeRecord, done_at: Instant) {
        self.probe_in_flight = false;
        if matches!(record.outcome, ProbeOutcome::Ok { .. }) {
            self.last_proof = Some((done_at, format!("probe through {} answered", record.target)));
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
        self.last_probe = None;
        self.last_proof = proof;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UnitState {
    /// Requests progressing, or recent traffic.
    Serving,
    /// No work and no recent traffic: liveness unproven by this unit alone.
    Idle,
    /// Work present without progress past the stall budget.
    Stalled,
    Wedged,
    /// Neither metrics nor health answer.
    Down,
    /// No recent sample: passive evidence is missing.
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UnitAssessment {
    pub unit: String,
    pub role: String,
    pub state: UnitState,
    pub reasons: Vec<String>,
    pub metrics: Option<Metrics>,
    pub health_status: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PairState {
    /// Liveness proven recently (traffic or probe) and nothing suspicious.
    Healthy,
    /// Nothing suspicious, but nothing has proved liveness recently.
    Unproven,
    /// A stall past the budget, missing evidence, or a failed probe.
    Suspect,
    /// Confirmed: recovery is warranted.
    Wedged,
    /// A unit does not answer at all (not a wedge; not recovered here).
    Down,
}

impl PairState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Unproven => "unproven",
            Self::Suspect => "suspect",
            Self::Wedged => "wedged",
            Self::Down => "down",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum ProbeDecision {
    /// Not needed (traffic or a recent probe proves liveness), or not allowed yet.
    None,
    Send {
        timeout: Duration,
        work_ahead: u32,
        why: String,
    },
    /// Needed, but its timeout would have to exceed `max_probe_timeout`.
    Defer { why: String },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Assessment {
    pub state: PairState,
    pub reasons: Vec<String>,
    pub units: Vec<UnitAssessment>,
    pub probe: ProbeDecision,
}

fn s(d: Duration) -> String {
    let ms = d.as_millis() as u64;
    crate::verdict::secs(ms)
}

fn health_phrase(status: u16) -> String {
    if status == 0 {
        "health does not answer".into()
    } else {
        format!("health answers {status}")
    }
}

fn assess_unit(u: &UnitTrack, p: &WatchPolicy, now: Instant) -> UnitAssessment {
    let mut a = UnitAssessment {
        unit: u.unit.clone(),
        role: u.role.clone(),
        state: UnitState::Unknown,
        reasons: Vec::new(),
        metrics: u.last.as_ref().and_then(|s| s.metrics),
        health_status: u.last.as_ref().map_or(0, |s| s.health_status),
    };
    let Some(last) = &u.last else {
        a.reasons.push(format!("{}: no sample yet", u.unit));
        return a;
    };
    let age = now.saturating_duration_since(last.at);
    if age > p.stale_after {
        a.reasons.push(format!(
            "{}: no sample for {} (passive evidence missing)",
            u.unit,
            s(age)
        ));
        return a;
    }
    let Some(m) = last.metrics else {
        let bad_for = u
            .scrape_bad_since
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        if last.health_status == 0 && bad_for >= p.stall_budget {
            a.state = UnitState::Down;
            a.reasons.push(format!(
                "{}: neither /metrics nor health answer for {} ({})",
                u.unit,
                s(bad_for),
                last.error
            ));
        } else {
            a.reasons.push(format!(
                "{}: /metrics unreadable for {} ({}); {}",
                u.unit,
                s(bad_for),
                last.error,
                health_phrase(last.health_status)
            ));
        }
        return a;
    };
    // SGLang's /health runs a one-token generation through the scheduler and
    // answers 503 after 20 s without scheduler output; a long prefill gives
    // none until it ends (sgl-project/sglang#22511). So with work present on
    // a GPU not known idle, health may stay bad for as long as the worst
    // legitimate prefill before that alone is a wedge.
    let mut health_note = None;
    if let Some(bad) = u.health_bad_since {
        let bad_for = now.saturating_duration_since(bad);
        let gpu_idle = m.gpu_util.is_some_and(|g| g < p.gpu_idle_below);
        let busy = m.running + m.queued > 0.0 && !gpu_idle;
        let threshold = if busy {
            p.stall_budget + p.max_prefill
        } else {
            p.stall_budget
        };
        let last_status = if last.health_status == 0 {
            "no answer".to_string()
        } else {
            last.health_status.to_string()
        };
        if bad_for >= threshold {
            a.state = UnitState::Wedged;
            let allowance = if busy {
                format!(
                    " (past the stall budget {} + worst prefill {} allowed while work is present)",
                    s(p.stall_budget),
                    s(p.max_prefill)
                )
            } else {
                String::new()
            };
            a.reasons.push(format!(
                "{}: health answered 200 earlier but has not for {} (last: {}) while /metrics answers ({} running, {} queued){allowance}",
                u.unit,
                s(bad_for),
                last_status,
                m.running,
                m.queued
            ));
            return a;
        }
        if bad_for >= p.stall_budget {
            health_note = Some(format!(
                "{}: health has not answered 200 for {} (last: {}) with {} running, {} queued: an engine busy with a prefill answers health late; within the worst prefill {}",
                u.unit,
                s(bad_for),
                last_status,
                m.running,
                m.queued,
                s(p.max_prefill)
            ));
        }
    }
    if let Some(stalled) = u.stalled_for(now) {
        let gpu_idle = m.gpu_util.is_some_and(|g| g < p.gpu_idle_below);
        let threshold = if gpu_idle {
            p.stall_budget
        } else {
            p.stall_budget + p.max_prefill
        };
        let counters = format!(
            "generation_tokens_total stuck at {} and prompt_tokens_total at {}",
            m.generation_tokens.map_or("?".into(), |v| format!("{v}")),
            m.prompt_tokens.map_or("?".into(), |v| format!("{v}"))
        );
        let gpu = match m.gpu_util {
            Some(g) => format!("GPU utilisation {:.0} %", g * 100.0),
            None => "GPU utilisation unknown".into(),
        };
        let why_threshold = if gpu_idle {
            format!("stall budget {} with the GPU idle", s(p.stall_budget))
        } else {
            format!(
                "stall budget {} + worst prefill {}",
                s(p.stall_budget),
                s(p.max_prefill)
            )
        };
        let line = format!(
            "{}: {} running, {} queued, {} for {} ({}; {}); {}",
            u.unit,
            m.running,
            m.queued,
            counters,
            s(stalled),
            gpu,
            why_threshold,
            health_phrase(last.health_status)
        );
        if stalled >= threshold {
            a.state = UnitState::Wedged;
            a.reasons.push(format!("{line}: wedged"));
        } else if stalled >= p.stall_budget {
            a.state = UnitState::Stalled;
            a.reasons
                .push(format!("{line}: past the stall budget, within the worst prefill"));
        } else {
            a.state = UnitState::Serving;
        }
        if let Some(note) = health_note
            && a.state != UnitState::Wedged
        {
            a.state = UnitState::Stalled;
            a.reasons.push(note);
        }
        return a;
    }
    if let Some(note) = health_note {
        a.state = UnitState::Stalled;
        a.reasons.push(note);
        return a;
    }
    let recent = u
        .last_progress
        .is_some_and(|t| now.saturating_duration_since(t) < p.idle_probe_interval);
    a.state = if recent { UnitState::Serving } else { UnitState::Idle };
    a
}

/// Judges a pair at `now`.
pub fn judge(e: &PairEvidence, p: &WatchPolicy, now: Instant) -> Assessment {
    let units: Vec<UnitAssessment> = e.units.iter().map(|u| assess_unit(u, p, now)).collect();
    let any = |st: UnitState| units.iter().any(|u| u.state == st);
    let unit_reasons = |st: &[UnitState]| -> Vec<String> {
        units
            .iter()
            .filter(|u| st.contains(&u.state))
            .flat_map(|u| u.reasons.clone())
            .collect()
    };
    // The latest moment every engine had made progress: traffic's proof.
    let traffic_proof = e
        .units
        .iter()
        .map(|u| u.last_progress)
        .collect::<Option<Vec<_>>>()
        .and_then(|v| v.into_iter().min());
    let progress_since = |t: Instant| e.units.iter().any(|u| u.last_progress.is_some_and(|p| p > t));
    let proof_at = [traffic_proof, e.last_proof.as_ref().map(|p| p.0)]
        .into_iter()
        .flatten()
        .max();
    let proof_fresh = |within: Duration| proof_at.is_some_and(|t| now.saturating_duration_since(t) < within);

    let failed_probe = e
        .last_probe
        .as_ref()
        .filter(|r| !matches!(r.outcome, ProbeOutcome::Ok { .. }) && !progress_since(r.sent_at));
    let health_line = || {
        units
            .iter()
            .map(|u| format!("{} health {}", u.unit, u.health_status))
            .collect::<Vec<_>>()
            .join(", ")
    };

    let (state, reasons) = if any(UnitState::Wedged) {
        (PairState::Wedged, unit_reasons(&[UnitState::Wedged]))
    } else if let Some(
        r @ ProbeRecord {
            outcome: ProbeOutcome::Timeout { after_ms },
            ..
        },
    ) = failed_probe
        && units.iter().all(|u| (200..300).contains(&u.health_status))
    {
        (
            PairState::Wedged,
            vec![format!(
                "{} through {} timed out after {} (its timeout covered {} request(s) ahead at up to {} of prefill each); no engine produced a token since it was sent, while {}",
                probe_name(r),
                r.target,
                s(Duration::from_millis(*after_ms)),
                r.work_ahead,
                s(p.max_prefill),
                health_line()
            )],
        )
    } else if any(UnitState::Down) {
        (PairState::Down, unit_reasons(&[UnitState::Down]))
    } else if let Some(r) = failed_probe {
        let what = match &r.outcome {
            ProbeOutcome::Timeout { after_ms } => format!("timed out after {}", s(Duration::from_millis(*after_ms))),
            ProbeOutcome::Error { message } => format!("failed ({message})"),
            ProbeOutcome::Ok { .. } => unreachable!("filtered"),
        };
        (
            PairState::Suspect,
            vec![format!(
                "{} through {} {what}; no engine has produced a token since",
                probe_name(r),
                r.target
            )],
        )
    } else if any(UnitState::Stalled) || any(UnitState::Unknown) {
        (
            PairState::Suspect,
            unit_reasons(&[UnitState::Stalled, UnitState::Unknown]),
        )
    } else if proof_fresh(p.idle_probe_interval * 2) {
        let how = match (&e.last_proof, traffic_proof) {
            (Some((t, how)), tp) if tp.is_none_or(|tp| *t >= tp) => how.clone(),
            _ => "real traffic advances every engine's token counters".into(),
        };
        (
            PairState::Healthy,
            vec![format!(
                "{how} ({} ago)",
                s(now.saturating_duration_since(proof_at.unwrap_or(now)))
            )],
        )
    } else {
        (
            PairState::Unproven,
            vec![match proof_at {
                Some(t) => format!("liveness last proven {} ago", s(now.saturating_duration_since(t))),
                None => "liveness not proven yet in this watch".into(),
            }],
        )
    };

    let probe = decide_probe(e, p, now, state, &units, proof_fresh(p.idle_probe_interval));
    Assessment {
        state,
        reasons,
        units,
        probe,
    }
}

fn decide_probe(
    e: &PairEvidence,
    p: &WatchPolicy,
    now: Instant,
    state: PairState,
    units: &[UnitAssessment],
    proof_fresh: bool,
) -> ProbeDecision {
    if e.probe_in_flight || matches!(state, PairState::Wedged | PairState::Down) {
        return ProbeDecision::None;
    }
    let since_last = e.last_probe_sent.map(|t| now.saturating_duration_since(t));
    let why = match state {
        // Evidence missing or suspicious: probe, at the minimum gap, but
        // never again soon after a failed probe (that unit just failed).
        PairState::Suspect
            if e.last_probe
                .as_ref()
                .is_some_and(|r| !matches!(r.outcome, ProbeOutcome::Ok { .. })) =>
        {
            let since_done = e.last_probe_done.map(|t| now.saturating_duration_since(t));
            if since_done.is_some_and(|d| d < p.idle_probe_interval) {
                return ProbeDecision::None;
            }
            "the last probe failed and nothing has progressed since"
        }
        PairState::Suspect => {
            if since_last.is_some_and(|d| d < p.min_probe_interval) {
                return ProbeDecision::None;
            }
            "passive evidence is missing or suspicious"
        }
        PairState::Unproven | PairState::Healthy if !proof_fresh => {
            // Give real traffic a chance to prove liveness first.
            let watched_for = e
                .units
                .iter()
                .filter_map(|u| u.first_at)
                .min()
                .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
            if since_last.is_some_and(|d| d < p.idle_probe_interval) || watched_for < p.min_probe_interval {
                return ProbeDecision::None;
            }
            "nothing has proved liveness recently"
        }
        _ => return ProbeDecision::None,
    };
    // A probe must not be abandoned mid-prefill: its timeout covers every
    // request ahead of it on the busiest engine, each at the worst prefill.
    let work_ahead = units
        .iter()
        .filter_map(|u| u.metrics.map(|m| (m.running + m.queued).max(0.0).ceil() as u32))
        .max()
        .unwrap_or(0);
    let timeout = p.probe_timeout + p.max_prefill * work_ahead;
    if timeout > p.max_probe_timeout {
        return ProbeDecision::Defer {
            why: format!(
                "{why}, but {work_ahead} request(s) are ahead of a probe: covering them at up to {} of prefill each needs {} (> max {}); waiting instead of risking an abandoned prefill",
                s(p.max_prefill),
                s(timeout),
                s(p.max_probe_timeout)
            ),
        };
    }
    ProbeDecision::Send {
        timeout,
        work_ahead,
        why: why.into(),
    }
}

/// At most `max` automatic recoveries per pair per `window`; the next
/// confirmed wedge holds the pair for a human.
#[derive(Debug, Clone)]
pub struct Breaker {
    pub max: u32,
    pub window: Duration,
    recoveries: VecDeque<Instant>,
    held: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum BreakerDecision {
    /// Go ahead; this is the `nth` recovery in the window.
    Recover { nth: u32 },
    /// Held for a human; the reason says why.
    Hold { reason: String },
}

impl Breaker {
    pub fn new(max: u32, window: Duration) -> Self {
        Breaker {
            max,
            window,
            recoveries: VecDeque::new(),
            held: None,
        }
    }

    fn prune(&mut self, now: Instant) {
        while self
            .recoveries
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= self.window)
        {
            self.recoveries.pop_front();
        }
    }

    /// Recoveries counted in the window ending at `now`.
    pub fn in_window(&mut self, now: Instant) -> u32 {
        self.prune(now);
        self.recoveries.len() as u32
    }

    /// Called for a confirmed wedge: allows (and counts) a recovery, or holds.
    pub fn decide(&mut self, now: Instant) -> BreakerDecision {
        self.prune(now);
        if let Some(reason) = &self.held {
            return BreakerDecision::Hold { reason: reason.clone() };
        }
        if self.recoveries.len() as u32 >= self.max {
            let reason = format!(
                "held for a human: {} automatic recoveries within {} and the pair wedged again",
                self.recoveries.len(),
                s(self.window)
            );
            self.held = Some(reason.clone());
            return BreakerDecision::Hold { reason };
        }
        self.recoveries.push_back(now);
        BreakerDecision::Recover {
            nth: self.recoveries.len() as u32,
        }
    }

    pub fn held(&self) -> Option<&str> {
        self.held.as_deref()
    }

    /// Counts recoveries that happened before this breaker existed (a
    /// restarted orchestrator), `ages` before `now`; those older than the
    /// window are ignored. Without this, an orchestrator that restarts
    /// between recoveries would recover a wedging pair without bound.
    pub fn seed(&mut self, ages: &[Duration], now: Instant) {
        let mut at: Vec<Instant> = ages
            .iter()
            .filter(|a| **a < self.window)
            // A monotonic clock younger than the age (the host rebooted):
            // counted as recent, erring on the side of holding.
            .map(|a| now.checked_sub(*a).unwrap_or(now))
            .collect();
        at.sort();
        self.recoveries.extend(at);
    }

    /// A human took over (e.g. an operator's co-restart ended healthy).
    pub fn release(&mut self) {
        self.held = None;
        self.recoveries.clear();
    }
}

/// "probe pdwarden-probe-7", or just "probe" for one that never got a
/// request id (its agent was not connected, so it was not sent).
fn probe_name(r: &ProbeRecord) -> String {
    if r.request_id.is_empty() {
        "probe".into()
    } else {
        format!("probe {}", r.request_id)
    }
}

/// One earlier operation of a pair, as the breaker's seeding needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct PastOperation {
    pub started_unix_ms: u64,
    /// Started by the watch (request id `auto-…`).
    pub automatic: bool,
    /// A human's co-restart that ended healthy: it releases the breaker.
    pub human_healthy_restart: bool,
}

/// The ages of the automatic recoveries a new breaker must still count:
/// those within `window` of `now_unix_ms` and after the newest healthy
/// co-restart by a human (which released the breaker). `history` is newest
/// first, as the journal returns it.
pub fn recoveries_still_counting(history: &[PastOperation], now_unix_ms: u64, window: Duration) -> Vec<Duration> {
    history
        .iter()
        .take_while(|op| !op.human_healthy_restart)
        .filter(|op| op.automatic)
        .map(|op| Duration::from_millis(now_unix_ms.saturating_sub(op.started_unix_ms)))
        .filter(|age| *age < window)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Defaults of `[pair.watch]`, with seed 001's serial engine: prompts up
    /// to 50,000 tokens at 250 tok/s → a worst prefill of 200 s.
    fn policy() -> WatchPolicy {
        WatchPolicy {
            stall_budget: Duration::from_secs(8),
            max_prefill: Duration::from_secs(200),
            idle_probe_interval: Duration::from_secs(60),
            min_probe_interval: Duration::from_secs(5),
            probe_timeout: Duration::from_secs(120),
            max_probe_timeout: Duration::from_secs(600),
            stale_after: Duration::from_secs(5),
            gpu_idle_below: 0.05,
        }
    }

    fn sample(at: Instant, running: f64, queued: f64, generated: f64, prompt: f64, gpu: Option<f64>) -> Sample {
        Sample {
            at,
            health_status: 200,
            metrics: Some(Metrics {
                running,
                queued,
                generation_tokens: Some(generated),
                prompt_tokens: Some(prompt),
                gpu_util: gpu,
            }),
            error: String::new(),
        }
    }

    fn pair() -> PairEvidence {
        PairEvidence::new(vec![
            UnitTrack::new("prefill-0", "prefill"),
            UnitTrack::new("decode-0", "decode"),
        ])
    }

    /// Feeds one sample per second to both units from `from` for `secs` s;
    /// `f(t)` gives (prefill, decode) samples' fields. Returns every
    /// assessment, one per second.
    fn run(
        e: &mut PairEvidence,
        t0: Instant,
        secs: u64,
        f: impl Fn(u64) -> [(f64, f64, f64, f64, Option<f64>); 2],
    ) -> Vec<Assessment> {
        let p = policy();
        (0..=secs)
            .map(|t| {
                let now = t0 + Duration::from_secs(t);
                let [a, b] = f(t);
                e.observe("prefill-0", sample(now, a.0, a.1, a.2, a.3, a.4));
                e.observe("decode-0", sample(now, b.0, b.1, b.2, b.3, b.4));
                judge(e, &p, now)
            })
            .collect()
    }

    /// INCIDENTS row 4: the serial prefill leaked its slot on the abandoned
    /// 41,818-token prompt; the next 18-token request queues forever, health
    /// 200. Without GPU evidence it is a wedge once the stall outlasts the
    /// worst prefill (200 s) plus the budget (8 s) — not before, since a real
    /// 41,818-token prefill at 250 tok/s takes 167 s — and the reason names
    /// the numbers.
    #[test]
    fn row4_slot_leak_is_wedged_after_the_worst_prefill_not_before() {
        let t0 = Instant::now();
        let mut e = pair();
        let out = run(&mut e, t0, 220, |t| {
            // t = 0: the long prompt is admitted (prompt counter +41,818).
            let prompt = if t == 0 { 100.0 } else { 41_918.0 };
            [(1.0, 1.0, 50.0, prompt, None), (0.0, 0.0, 400.0, 18.0, None)]
        });
        // A legitimate 41,818-token prefill at 250 tok/s ends at 167 s: not flagged.
        assert!(out[..=167].iter().all(|a| a.state != PairState::Wedged));
        assert_eq!(out[100].state, PairState::Suspect, "{:?}", out[100].reasons);
        let first = out.iter().position(|a| a.state == PairState::Wedged).unwrap();
        assert_eq!(first, 209, "stall counted from the admission at 1 s");
        let r = out[first].reasons.join("\n");
        assert!(r.contains("prefill-0: 1 running, 1 queued"), "{r}");
        assert!(r.contains("prompt_tokens_total at 41918"), "{r}");
        assert!(r.contains("for 208.0 s"), "{r}");
        assert!(r.contains("worst prefill 200.0 s"), "{r}");
        assert!(r.contains("health answers 200"), "{r}");
    }

    /// Row 4 with GPU evidence: requests queued, counters still, GPU near
    /// zero — a wedge after the stall budget alone, within seconds.
    #[test]
    fn stalled_queue_with_idle_gpu_is_wedged_within_the_budget() {
        let t0 = Instant::now();
        let mut e = pair();
        let out = run(&mut e, t0, 30, |_| {
            [
                (1.0, 1.0, 50.0, 41_918.0, Some(0.0)),
                (0.0, 0.0, 400.0, 18.0, Some(0.0)),
            ]
        });
        let first = out.iter().position(|a| a.state == PairState::Wedged).unwrap();
        assert_eq!(first, 8);
        assert!(
            out[first].reasons[0].contains("GPU utilisation 0 %"),
            "{:?}",
            out[first].reasons
        );
        // A busy GPU is a long prefill, not a wedge (yet).
        let mut e = pair();
        let busy = run(&mut e, t0, 30, |_| {
            [
                (1.0, 1.0, 50.0, 41_918.0, Some(0.97)),
                (0.0, 0.0, 400.0, 18.0, Some(0.0)),
            ]
        });
        assert!(busy.iter().all(|a| a.state != PairState::Wedged));
    }

    /// Row 4's fix: with a 900 s client timeout, 39,623 tokens prefilled in
    /// 138.7 s, then answered; the watch never calls that a wedge, and once
    /// the counters advance the pair is healthy again.
    #[test]
    fn row4_long_but_legitimate_prefill_is_never_wedged() {
        let t0 = Instant::now();
        let mut e = pair();
        let out = run(&mut e, t0, 150, |t| {
            let done = t >= 139;
            [
                (
                    if done { 0.0 } else { 1.0 },
                    0.0,
                    if done { 51.0 } else { 50.0 } + if t >= 1 { 0.0 } else { -1.0 },
                    if t >= 1 { 39_723.0 } else { 100.0 },
                    None,
                ),
                (0.0, 0.0, if done { 420.0 } else { 400.0 }, 18.0, None),
            ]
        });
        assert!(out.iter().all(|a| a.state != PairState::Wedged));
        assert_eq!(out[150].state, PairState::Healthy, "{:?}", out[150].reasons);
    }

    /// Row 5: under steady real traffic (every engine's counters advance
    /// every second) the watch sends no probe in a simulated hour and never
    /// flags the pair, however busy it is.
    #[test]
    fn row5_busy_engine_under_traffic_is_never_probed_or_flagged() {
        let t0 = Instant::now();
        let mut e = pair();
        let out = run(&mut e, t0, 3_600, |t| {
            let t = t as f64;
            [(3.0, 5.0, t, 4_000.0 * t, None), (8.0, 2.0, 30.0 * t, 10.0 * t, None)]
        });
        let probes = out
            .iter()
            .filter(|a| matches!(a.probe, ProbeDecision::Send { .. }))
            .count();
        assert_eq!(probes, 0);
        assert!(out[1..].iter().all(|a| a.state == PairState::Healthy));
    }

    /// Row 5: idle for an hour, the probe rate is bounded by
    /// `idle_probe_interval` (60 s → at most 60 probes per hour, all with the
    /// pair's one prompt), and never two probes in flight.
    #[test]
    fn row5_idle_pair_is_probed_at_a_bounded_rate() {
        let p = policy();
        let t0 = Instant::now();
        let mut e = pair();
        let mut sent = 0;
        for t in 0..3_600u64 {
            let now = t0 + Duration::from_secs(t);
            e.observe("prefill-0", sample(now, 0.0, 0.0, 10.0, 10.0, None));
            e.observe("decode-0", sample(now, 0.0, 0.0, 10.0, 10.0, None));
            if let ProbeDecision::Send {
                timeout, work_ahead, ..
            } = judge(&e, &p, now).probe
            {
                assert_eq!((timeout, work_ahead), (p.probe_timeout, 0));
                sent += 1;
                e.last_probe_sent = Some(now);
                // Answered 200 ms later.
                e.probe_done(
                    ProbeRecord {
                        target: "router-0".into(),
                        sent_at: now,
                        timeout,
                        work_ahead,
                        outcome: ProbeOutcome::Ok { latency_ms: 200 },
                        request_id: "pdwarden-probe-x".into(),
                    },
                    now + Duration::from_millis(200),
                );
            }
        }
        assert!((59..=60).contains(&sent), "{sent}");
    }

    /// Row 4: a probe's timeout covers every request ahead of it at the
    /// worst prefill; if it cannot (over max_probe_timeout), it waits.
    #[test]
    fn probe_timeout_covers_the_queued_prefills_or_the_probe_waits() {
        let p = policy();
        let t0 = Instant::now();
        let mut e = pair();
        // 1 running + 1 queued, stalled past the budget: suspicious.
        for t in 0..=10u64 {
            let now = t0 + Duration::from_secs(t);
            e.observe("prefill-0", sample(now, 1.0, 1.0, 50.0, 41_918.0, None));
            e.observe("decode-0", sample(now, 0.0, 0.0, 400.0, 18.0, None));
        }
        let a = judge(&e, &p, t0 + Duration::from_secs(10));
        assert_eq!(a.state, PairState::Suspect);
        assert_eq!(
            a.probe,
            ProbeDecision::Send {
                timeout: Duration::from_secs(120 + 2 * 200),
                work_ahead: 2,
                why: "passive evidence is missing or suspicious".into()
            }
        );
        // Three requests ahead would need 720 s > 600 s: deferred.
        let now = t0 + Duration::from_secs(11);
        e.observe("prefill-0", sample(now, 1.0, 2.0, 50.0, 41_918.0, None));
        e.observe("decode-0", sample(now, 0.0, 0.0, 400.0, 18.0, None));
        match judge(&e, &p, now).probe {
            ProbeDecision::Defer { why } => assert!(why.contains("3 request(s)") && why.contains("720.0 s"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    /// Row 3 via a probe: generation hangs, health 200, nothing queued that
    /// the metrics show; the probe (timeout covering the queue) times out and
    /// no token came since: wedged, with the probe's numbers. A probe that
    /// failed is not re-sent soon after (no retry to the unit that just failed).
    #[test]
    fn probe_timeout_with_health_200_and_no_progress_is_wedged() {
        let p = policy();
        let t0 = Instant::now();
        let mut e = pair();
        e.observe("prefill-0", sample(t0, 0.0, 0.0, 5.0, 5.0, None));
        e.observe("decode-0", sample(t0, 0.0, 0.0, 5.0, 5.0, None));
        e.last_probe_sent = Some(t0);
        let done = t0 + Duration::from_secs(120);
        e.observe("prefill-0", sample(done, 0.0, 0.0, 5.0, 5.0, None));
        e.observe("decode-0", sample(done, 0.0, 0.0, 5.0, 5.0, None));
        e.probe_done(
            ProbeRecord {
                target: "router-0".into(),
                sent_at: t0,
                timeout: p.probe_timeout,
                work_ahead: 0,
                outcome: ProbeOutcome::Timeout { after_ms: 120_000 },
                request_id: "pdwarden-probe-1".into(),
            },
            done,
        );
        let a = judge(&e, &p, done);
        assert_eq!(a.state, PairState::Wedged);
        let r = &a.reasons[0];
        assert!(
            r.contains("timed out after 120.0 s") && r.contains("prefill-0 health 200"),
            "{r}"
        );
        // An erroring probe (e.g. the router's 503) is suspect, not wedged,
        // and the same router is not probed again before the idle interval.
        e.last_probe.as_mut().unwrap().outcome = ProbeOutcome::Error {
            message: "http 503".into(),
        };
        let a = judge(&e, &p, done);
        assert_eq!(a.state, PairState::Suspect);
        assert_eq!(a.probe, ProbeDecision::None);
    }

    /// An engine whose health turns bad for the budget while /metrics answers
    /// is wedged; one that never answered health yet (still loading) is not.
    #[test]
    fn health_gone_bad_is_wedged_but_loading_is_not() {
        let p = policy();
        let t0 = Instant::now();
        let mut loading = UnitTrack::new("decode-0", "decode");
        let mut gone = UnitTrack::new("decode-0", "decode");
        for t in 0..=20u64 {
            let now = t0 + Duration::from_secs(t);
            let mut s = sample(now, 0.0, 0.0, 5.0, 5.0, None);
            s.health_status = 503;
            loading.observe(s.clone());
            if t == 0 {
                s.health_status = 200;
            }
            gone.observe(s);
        }
        let now = t0 + Duration::from_secs(20);
        assert_ne!(assess_unit(&loading, &p, now).state, UnitState::Wedged);
        let a = assess_unit(&gone, &p, now);
        assert_eq!(a.state, UnitState::Wedged);
        assert!(
            a.reasons[0].contains("has not for 19.0 s (last: 503)"),
            "{:?}",
            a.reasons
        );
    }

    /// Issue 13's false wedge: a serial prefill busy with a 40 s prefill (1
    /// running, counters flat: SGLang counts tokens at finish) whose SGLang-like
    /// health answers 503 after 20 s is not wedged while the worst legitimate
    /// prefill has not passed; a health that stays bad past it is.
    #[test]
    fn health_503_during_a_long_prefill_is_not_a_wedge() {
        let p = policy();
        let t0 = Instant::now();
        let mut busy = UnitTrack::new("prefill-0", "prefill");
        for t in 0..=40u64 {
            let mut s = sample(t0 + Duration::from_secs(t), 1.0, 0.0, 5.0, 5.0, None);
            if t >= 20 {
                s.health_status = 503;
            }
            busy.observe(s);
        }
        let a = assess_unit(&busy, &p, t0 + Duration::from_secs(40));
        assert_ne!(a.state, UnitState::Wedged, "{:?}", a.reasons);
        assert!(
            a.reasons
                .iter()
                .any(|r| r.contains("health has not answered 200 for 20.0 s")),
            "{:?}",
            a.reasons
        );
        // Past stall budget + worst prefill (8 + 200 s) with health still bad: wedged.
        for t in 41..=230u64 {
            let mut s = sample(t0 + Duration::from_secs(t), 1.0, 0.0, 5.0, 5.0, None);
            s.health_status = 503;
            busy.observe(s);
        }
        let a = assess_unit(&busy, &p, t0 + Duration::from_secs(230));
        assert_eq!(a.state, UnitState::Wedged);
        assert!(
            a.reasons
                .iter()
                .any(|r| r.contains("health answered 200 earlier but has not for 210.0 s")),
            "{:?}",
            a.reasons
        );
    }

    /// A restarted orchestrator's breaker counts the recoveries the journal
    /// holds: within the window, after the last human's healthy restart.
    #[test]
    fn breaker_seeded_from_the_journal_survives_an_orchestrator_restart() {
        let op = |ago_s: u64, automatic: bool, human: bool| PastOperation {
            started_unix_ms: 10_000_000 - ago_s * 1000,
            automatic,
            human_healthy_restart: human,
        };
        // Newest first: two recent recoveries, a verify, one recovery before
        // a human's healthy restart (released), one older still.
        let history = [
            op(100, true, false),
            op(700, true, false),
            op(800, false, false),
            op(900, true, false),
            op(1_000, false, true),
            op(1_100, true, false),
        ];
        let ages = recoveries_still_counting(&history, 10_000_000, Duration::from_secs(3_600));
        assert_eq!(
            ages,
            [100, 700, 900].map(Duration::from_secs).to_vec(),
            "the released one does not count"
        );
        assert_eq!(
            recoveries_still_counting(&history, 10_000_000, Duration::from_secs(750)),
            [100, 700].map(Duration::from_secs).to_vec()
        );
        let mut b = Breaker::new(3, Duration::from_secs(3_600));
        let now = Instant::now() + Duration::from_secs(10_000);
        b.seed(&ages, now);
        assert_eq!(b.in_window(now), 3);
        assert!(
            matches!(b.decide(now), BreakerDecision::Hold { .. }),
            "a 4th within the hour is held"
        );
        // The oldest falls out of the window 2700 s later: one more allowed.
        let mut b = Breaker::new(3, Duration::from_secs(3_600));
        b.seed(&ages, now);
        assert_eq!(
            b.decide(now + Duration::from_secs(2_701)),
            BreakerDecision::Recover { nth: 3 }
        );
    }

    /// The breaker: N recoveries per window, then the pair is held until a
    /// human releases it; recoveries older than the window stop counting.
    #[test]
    fn breaker_holds_after_n_recoveries_in_the_window() {
        let mut b = Breaker::new(3, Duration::from_secs(3_600));
        let t0 = Instant::now();
        for n in 1..=3 {
            assert_eq!(
                b.decide(t0 + Duration::from_secs(600 * n as u64)),
                BreakerDecision::Recover { nth: n }
            );
        }
        match b.decide(t0 + Duration::from_secs(2_400)) {
            BreakerDecision::Hold { reason } => {
                assert!(reason.contains("3 automatic recoveries within 3600.0 s"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        // Held stays held, even once the window has passed, until released.
        assert!(matches!(
            b.decide(t0 + Duration::from_secs(9_000)),
            BreakerDecision::Hold { .. }
        ));
        b.release();
        assert_eq!(
            b.decide(t0 + Duration::from_secs(9_001)),
            BreakerDecision::Recover { nth: 1 }
        );
        // Without a hold, old recoveries fall out of the window.
        let mut b = Breaker::new(1, Duration::from_secs(60));
        assert_eq!(b.decide(t0), BreakerDecision::Recover { nth: 1 });
        assert_eq!(
            b.decide(t0 + Duration::from_secs(61)),
            BreakerDecision::Recover { nth: 1 }
        );
    }
}
