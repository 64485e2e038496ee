//! Wedge judgement: passive engine samples and active probe results in,
//! a verdict with its numbers out. Pure: no I/O, no clock; `now` is handed in
//! (DESIGN.md 3), so INCIDENTS rows 4 and 5 and issue 13's false wedge are
//! unit tests below.
//!
//! An automatic recovery kills every request in flight on the pair, so a
//! wedge needs positive evidence that nothing progresses, from signals that
//! move during work (DESIGN.md 12). What moves when is the engine profile's
//! business (`pdwarden_engines`): SGLang counts `prompt_tokens_total` and
//! `generation_tokens_total` only when a request finishes, and
//! `realtime_tokens_total` per prefill chunk and decode log interval; vLLM
//! counts its token counters every engine step. "Progress" is any counter
//! rising beyond what the watch's own probes put there (a probe credits each
//! engine with its tokens, so a short probe that an engine still answers
//! cannot hide a stall of the real requests: the partial wedge).
//!
//! The rules, each reported with its numbers and with how it ruled out
//! legitimate work ([`WedgeEvidence::ruled_out`]):
//! - **Stall** (seed 001's slot leak): requests present (running, queued or
//!   in a PD queue) and no progress for the stall budget plus the longest
//!   legitimate silence of the signals the engine has: with a during-work
//!   counter, one prefill chunk (or the whole worst prefill) or one decode log
//!   interval at the slowest speeds; with only finish counters (SGLang before
//!   0.5.4), the longest legitimate request, prefill plus generation; with the
//!   GPU known idle, the budget alone. A decode's requests waiting for KV may
//!   also wait for the prefill's compute and the transfer. A stall that the
//!   watch's probes survived is reported as a partial wedge.
//! - **KV transfer stuck** (seed 004): a prefill holds prefilled requests in
//!   its inflight queue and the decode holds requests waiting for KV, both
//!   without a break, and no transfer has been seen to land for the stall
//!   budget plus the longest legitimate transfer: the prefill's inflight
//!   count never fell, the decode's KV-wait count never fell and its running
//!   plus queued count never rose (in PD a request joins the decode's batch
//!   only once its KV has arrived), and the decode has progressed with
//!   nothing since its wait began. Queues that merely stay non-empty are no
//!   evidence: overlapping honest transfers keep both non-empty through a
//!   burst, each landing showing as one of those moves (issue 31). A landing
//!   at either end restarts the window, so a decode stuck beside a healthy
//!   one on a shared prefill is left to the stall rule.
//! - **Generation silent while health answers 200** (seeds 002, 003): a
//!   probe whose timeout covered the work ahead of it timed out, and some
//!   engine has not progressed since it was sent. Discarded only when every
//!   engine progressed since (the pair served others: suspect, not wedged).
//! - **Health gone bad**: health answered 200 earlier in this watch, has not
//!   for the stall budget while `/metrics` answers, and nothing progressed
//!   since it failed. SGLang's health runs through the scheduler and answers
//!   503 during an honest prefill over 20 s (sgl-project/sglang#22511), so
//!   with work present the allowance grows by the worst prefill; vLLM's health
//!   fails only once the engine core is dead.
//!
//! Active probes are asked for only when passive evidence is missing (stale
//! or absent samples) or suspicious (past the budget, within the allowance),
//! or when nothing has proved liveness for `idle_probe_interval`; never while
//! real traffic advances every engine's counters. Their timeout covers the
//! work ahead of them — on a serial engine every request running or queued,
//! each up to the worst prefill plus the worst generation; on a batching one
//! the queued prefills, one running prefill and, when requests queue (the
//! batch is full), the waves of generations they wait for — so a probe is never
//! abandoned mid-prefill (INCIDENTS row 4); one that would need more than
//! `max_probe_timeout` is deferred.
//!
//! No blind window (issue 31): the verification that ends a healthy
//! operation is fresh evidence — the pair is warm, so a probe's own budget is
//! the warm budget, not the cold allowance; right after the watch starts over
//! (an operation ended) it probes at the minimum gap, doubling towards the
//! idle interval, because pairs break most right after a restart; an engine
//! that has not answered a scrape yet is given its profile's silence
//! allowance, not the longest request; and a probe still in flight is
//! re-judged as the gauges arrive: past the budget and the work now known
//! ahead of it, it counts as timed out, so an outstanding probe never blocks
//! the rules above.
//!
//! The agents' layer, and errors (issue 31): a unit of the pair its agent
//! reports stopped (never started, or stopped on command) is `down`, never
//! probed or recovered — the watch does not start what the operator has not;
//! one that **exited** on its own (the router included, which no engine
//! sample shows) is a wedge of kind `exited`; probes that fail with an error
//! twice in a row, at least the minimum gap apart, while not every engine
//! progresses (a pair whose every request fails its KV transfer, INCIDENTS
//! row 1) are `failing`. Both are recovered through the breaker.
//!
//! [`Breaker`] bounds automatic recoveries per pair per window.
//!
//! Layout: this module holds the verdict's types, the [`WatchPolicy`] it
//! is judged against, and [`judge`], which applies the pair-level rules in
//! order (the agents' facts, errors, a unit's wedge, the KV transfer, the
//! silent generation, the unresponsive unit, then down, suspect, healthy or
//! unproven), each one a named step.
//! - `evidence.rs`: what the watch gathers and folds, sample by sample
//!   ([`PairEvidence`], [`UnitTrack`], [`Metrics`], the probes, the
//!   agents' [`Life`] facts).
//! - `rules.rs`: the unit rules (missing evidence, stall, health gone bad)
//!   and the stuck KV transfer, with the phrases their reasons share.
//! - `probe.rs`: when to probe and with what timeout ([`ProbeDecision`]),
//!   and the re-judging of a probe still in flight.
//! - `breaker.rs`: the recovery [`Breaker`] and its seeding from the
//!   journal ([`recoveries_still_counting`]).

use std::time::Duration;

use pdwarden_engines::{EngineKind, PrefillProgress};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

mod breaker;
mod evidence;
mod probe;
mod rules;

pub use crate::judge::probe::ProbeObservation;
pub use breaker::{Breaker, BreakerDecision, PastOperation, recoveries_still_counting};
pub use evidence::{AgentFact, InFlightProbe, Life, Metrics, PairEvidence, Sample, UnitTrack, WatchProbe};
pub use probe::ProbeDecision;

use probe::{OVERDUE, decide_probe, overdue};
use rules::{assess_unit, kv_transfer_stuck};

/// Budgets and rates of a pair's watch (from `[pair.watch]`).
#[derive(Debug, Clone, PartialEq)]
pub struct WatchPolicy {
    /// Work present without progress this long is suspicious; with the GPU
    /// known idle, a wedge.
    pub stall_budget: Duration,
    /// The longest legitimate prefill: `max_prompt_tokens / prefill_tok_per_s`.
    pub max_prefill: Duration,
    /// The longest legitimate generation: `max_output_tokens / decode_tok_per_s`.
    pub max_generation: Duration,
    /// One prefill chunk (`prefill_chunk_tokens`) at the slowest speed; the
    /// worst prefill when chunking is unknown.
    pub max_prefill_chunk: Duration,
    /// One decode step at the slowest decode speed.
    pub decode_step: Duration,
    /// How stale an idle engine's gauges may be (SGLang refreshes them at
    /// most every 30 s while idle); `None`: the profile's figure.
    pub idle_gauge_refresh: Option<Duration>,
    /// The longest legitimate KV transfer once a request is prefilled.
    pub max_kv_transfer: Duration,
    /// The engines run one request at a time (`suite.concurrency.engines_batch = false`).
    pub serial: bool,
    /// The pair's engines, unless a scrape's metric names say otherwise.
    pub engine: EngineKind,
    /// Without other proof of liveness, at most one probe per this interval.
    pub idle_probe_interval: Duration,
    /// The minimum gap between two probes, whatever the reason.
    pub min_probe_interval: Duration,
    /// A probe's own budget: the most a legitimate first answer may take
    /// (the pair's cold allowance, capped by its probe timeout) — the watch
    /// asks whether the pair generates, not whether it is warm — before the
    /// work ahead of it and one legitimate silence are added.
    pub probe_timeout: Duration,
    /// The probe's own budget once the pair is proven warm in this watch (a
    /// healthy operation concluded, or a probe answered, since the engines
    /// last started over): the warm budget. A cold cost is paid once per
    /// process start (judge::verdict's physical model), so after that the
    /// cold allowance only blinds the watch (issue 31: a decode frozen right
    /// after a healthy restart went unconfirmed for minutes).
    pub warm_probe_timeout: Duration,
    /// The agent's scrape period: "nothing moved" needs a few scrapes to see.
    pub scrape_interval: Duration,
    /// A probe that would need longer is deferred instead of sent.
    pub max_probe_timeout: Duration,
    /// A sample older than this is missing evidence.
    pub stale_after: Duration,
    /// GPU utilisation (0..1) below which the GPU counts as idle.
    pub gpu_idle_below: f64,
    /// Tokens one probe may add to an engine's token counters (its prompt
    /// and output, generously counted).
    pub probe_tokens: f64,
}

impl WatchPolicy {
    /// The longest legitimate request: the worst prefill plus the worst generation.
    pub fn max_request(&self) -> Duration {
        self.max_prefill + self.max_generation
    }

    /// The longest an engine of this profile may legitimately show work
    /// present with its during-work counters flat: one prefill chunk where
    /// they rise per chunk (SGLang), the whole prefill where they rise only at
    /// its end (vLLM), and never less than the gauges' idle refresh (SGLang's
    /// gauges may still show a finished request for up to 30 s).
    ///
    /// The idle refresh counts only `after_finish`: when the engine's last
    /// progress was a request finishing, its gauges may still show that
    /// request for up to the refresh (SGLang logs an idle engine's stats every
    /// 30 s); a prefill chunk or a decode log refreshes them as it counts.
    pub fn work_gap(&self, profile: &pdwarden_engines::Profile, after_finish: bool) -> Duration {
        let prefill = match profile.prefill_progress {
            PrefillProgress::PerChunk => self.max_prefill_chunk,
            PrefillProgress::AtPrefillEnd => self.max_prefill,
        };
        let idle = match profile.idle_gauge_refresh_ms {
            Some(ms) if after_finish => self.idle_gauge_refresh.unwrap_or(Duration::from_millis(ms)),
            _ => Duration::ZERO,
        };
        prefill.max(idle).max(self.decode_step)
    }

    /// The longest an engine may legitimately make no progress at all with
    /// work present: its during-work gap, or, without a during-work counter,
    /// the longest legitimate request.
    ///
    /// Never less than three scrapes: counters are only seen once per scrape.
    pub fn silence_allowance(&self, profile: &pdwarden_engines::Profile, has_work_signal: bool) -> Duration {
        let legit = if has_work_signal {
            self.work_gap(profile, false)
        } else {
            self.max_request()
        };
        legit.max(self.scrape_interval * 3)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnitState {
    /// Requests progressing, or recent traffic.
    Serving,
    /// No work and no recent traffic: liveness unproven by this unit alone.
    Idle,
    /// Work present without progress past the stall budget.
    Stalled,
    Wedged,
    /// Not running, by its agent's report (never started, stopped on
    /// command, or exited): the only unit that is ever `down` (issue 49).
    Down,
    /// Answers neither /metrics nor health from the watch's first missed
    /// scrape, and its agent does not say it is not running: a process
    /// that runs and answers nothing (SIGSTOP, a GIL deadlock, a D-state
    /// hang) is probed at once and recovered once a probe sent after it
    /// went silent fails — never left `down` (issue 49).
    Unresponsive,
    /// No recent sample: passive evidence is missing.
    Unknown,
}

/// Which kind of wedge the evidence shows (the detection-time metric's label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WedgeKind {
    /// Requests present, nothing progresses (seed 001's leaked slot).
    Stall,
    /// Real requests stall while the watch's own short probes are answered.
    PartialStall,
    /// Prefilled requests never reach their decode (seed 004).
    KvTransfer,
    /// A probe covering the work ahead timed out while health said 200 (seeds 002, 003).
    SilentGeneration,
    /// Health through the scheduler failed for longer than any prefill, with no progress.
    HealthGoneBad,
    /// A unit answers nothing at all — neither `/metrics` nor health — and
    /// a probe sent after it went silent failed (issue 15: a stopped
    /// process whose PID lives; a real vLLM decode under SIGSTOP).
    Unresponsive,
    /// A unit of the pair — the router included, which no engine sample
    /// shows — exited on its own, by its agent's report (issue 31: a router
    /// SIGKILLed left the pair `suspect` for ever).
    Exited,
    /// Every probe fails with an error, twice in a row at least the minimum
    /// gap apart, and not every engine progressed since the first (issue 31:
    /// a co-restart stopped after the prefill — INCIDENTS row 1 — fails every
    /// request's KV transfer, and was left `suspect` for ever).
    Failing,
}

impl WedgeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stall => "stall",
            Self::PartialStall => "partial_stall",
            Self::KvTransfer => "kv_transfer",
            Self::SilentGeneration => "silent_generation",
            Self::HealthGoneBad => "health_gone_bad",
            Self::Unresponsive => "unresponsive",
            Self::Exited => "exited",
            Self::Failing => "failing",
        }
    }
}

/// Why a wedge is not legitimate work: what the journaled trigger carries.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WedgeEvidence {
    pub kind: WedgeKind,
    /// When the silence began (detection time is measured from here).
    #[serde(skip)]
    pub onset: Instant,
    /// How long the silence had lasted when the wedge was confirmed.
    pub silent_ms: u64,
    /// How the evidence rules out legitimate work, one line per argument.
    pub ruled_out: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UnitAssessment {
    pub unit: String,
    pub role: String,
    pub state: UnitState,
    pub reasons: Vec<String>,
    pub metrics: Option<Metrics>,
    pub health_status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wedge: Option<WedgeEvidence>,
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
    /// A unit is not running by its agent's report (never started, or
    /// stopped on command): reported, never probed or started by the watch.
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
pub struct Assessment {
    pub state: PairState,
    pub reasons: Vec<String>,
    pub units: Vec<UnitAssessment>,
    pub probe: ProbeDecision,
    /// Set when `state` is `Wedged`: the kind, the onset, and what ruled out honest work.
    pub wedge: Option<WedgeEvidence>,
}

/// A duration as reasons show it, in seconds.
fn s(d: Duration) -> String {
    let ms = d.as_millis() as u64;
    crate::judge::verdict::secs(ms)
}

/// A duration in whole milliseconds, as evidence records it.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// "probe pdwarden-probe-7", or just "probe" for one that never got a
/// request id (its agent was not connected, so it was not sent).
fn probe_name(r: &WatchProbe) -> String {
    if r.request_id.is_empty() {
        "probe".into()
    } else {
        format!("probe {}", r.request_id)
    }
}

/// Judges a pair at `now`: every unit by the unit rules, then the pair by
/// the pair-level rules in order — the agents' facts (a unit stopped on
/// purpose, one that exited), probes that answer only errors, a unit's
/// wedge, the stuck KV transfer, a silent generation, an unresponsive unit —
/// the first that holds deciding; short of a wedge, what is down or
/// suspicious, else whether liveness was proven lately. Then whether to
/// probe.
pub fn judge(e: &PairEvidence, p: &WatchPolicy, now: Instant) -> Assessment {
    let units: Vec<UnitAssessment> = e
        .units
        .iter()
        .map(|u| {
            let mut a = assess_unit(u, p, now, e.last_probe_ok);
            // `down` is the agent's fact, and only its (issue 49).
            if let Some(f) = e.lives.iter().find(|f| f.unit == u.unit)
                && matches!(f.life, Life::Stopped | Life::Exited { .. })
            {
                a.state = UnitState::Down;
                a.reasons = vec![format!("{}: not running (its agent's report)", u.unit)];
            }
            a
        })
        .collect();
    let j = Judging::new(e, p, now, &units);
    if let Some(stopped) = j.stopped_on_purpose() {
        return Assessment {
            state: stopped.state,
            reasons: stopped.reasons,
            units,
            probe: ProbeDecision::None,
            wedge: None,
        };
    }
    let ruling = j
        .exited()
        .or_else(|| j.failing())
        .or_else(|| j.unit_wedged())
        .or_else(|| j.kv_transfer())
        .or_else(|| j.silent_generation())
        .or_else(|| j.unresponsive())
        .or_else(|| j.unanswering())
        .or_else(|| j.probe_failed())
        .or_else(|| j.serves_others())
        .or_else(|| j.suspicious_units())
        .or_else(|| j.healthy())
        .unwrap_or_else(|| j.unproven());
    let proof_fresh = j.proof_fresh(e.idle_interval(p));
    let probe = decide_probe(e, p, now, ruling.state, &units, proof_fresh);
    Assessment {
        state: ruling.state,
        reasons: ruling.reasons,
        units,
        probe,
        wedge: ruling.wedge,
    }
}

/// One pair-level rule's finding: the pair's state, why, and the evidence
/// when it is wedged.
struct Ruling {
    state: PairState,
    reasons: Vec<String>,
    wedge: Option<WedgeEvidence>,
}

impl Ruling {
    fn new(state: PairState, reasons: Vec<String>) -> Self {
        Ruling {
            state,
            reasons,
            wedge: None,
        }
    }

    fn wedged(reasons: Vec<String>, evidence: WedgeEvidence) -> Self {
        Ruling {
            state: PairState::Wedged,
            reasons,
            wedge: Some(evidence),
        }
    }
}

/// What the pair-level rules read: the evidence, the policy, the moment,
/// the units as judged, and what proved liveness last.
struct Judging<'a> {
    e: &'a PairEvidence,
    p: &'a WatchPolicy,
    now: Instant,
    units: &'a [UnitAssessment],
    /// The latest moment every engine had made progress: traffic's proof.
    traffic_proof: Option<Instant>,
    /// The latest proof of liveness: traffic's, or a probe's or healthy
    /// operation's.
    proof_at: Option<Instant>,
    /// The probe the rules judge on: one still in flight past what its work
    /// ahead allows ([`probe::overdue`]), else the last one answered.
    probe_evidence: Option<WatchProbe>,
}

impl<'a> Judging<'a> {
    fn new(e: &'a PairEvidence, p: &'a WatchPolicy, now: Instant, units: &'a [UnitAssessment]) -> Self {
        let traffic_proof = e
            .units
            .iter()
            .map(|u| u.last_progress)
            .collect::<Option<Vec<_>>>()
            .and_then(|v| v.into_iter().min());
        let proof_at = [traffic_proof, e.last_proof.as_ref().map(|p| p.0)]
            .into_iter()
            .flatten()
            .max();
        let probe_evidence = overdue(e, p, now, units).or_else(|| e.last_probe.clone());
        Judging {
            e,
            p,
            now,
            units,
            traffic_proof,
            proof_at,
            probe_evidence,
        }
    }

    fn any(&self, st: UnitState) -> bool {
        self.units.iter().any(|u| u.state == st)
    }

    /// The reasons of the units in these states.
    fn unit_reasons(&self, st: &[UnitState]) -> Vec<String> {
        self.units
            .iter()
            .filter(|u| st.contains(&u.state))
            .flat_map(|u| u.reasons.clone())
            .collect()
    }

    /// Whether liveness was proven within `within` of now.
    fn proof_fresh(&self, within: Duration) -> bool {
        self.proof_at
            .is_some_and(|t| self.now.saturating_duration_since(t) < within)
    }

    /// A failed probe stands unless every engine progressed after it was sent.
    fn failed_probe(&self) -> Option<&WatchProbe> {
        self.probe_evidence.as_ref().filter(|r| {
            !matches!(r.outcome, ProbeObservation::Ok { .. })
                && !self.e.units.iter().all(|u| u.progressed_after(r.sent_at))
        })
    }

    /// The last probe failed lately, yet every engine progressed since it
    /// was sent: the pair serves others.
    fn served_others(&self) -> Option<&WatchProbe> {
        let (e, p, now) = (self.e, self.p, self.now);
        e.last_probe.as_ref().filter(|r| {
            !matches!(r.outcome, ProbeObservation::Ok { .. })
                && !e.units.is_empty()
                && e.units.iter().all(|u| u.progressed_after(r.sent_at))
                && e.last_probe_done
                    .is_some_and(|d| now.saturating_duration_since(d) < p.idle_probe_interval)
        })
    }

    /// An engine that computed nothing at all since a probe was sent, for
    /// longer than a legitimate prefill chunk (or request) that its stale
    /// gauges may not show yet.
    /// An engine whose only work is KV in transit is waiting, not silent,
    /// for the stall rule's KV allowance (budget + worst prefill + transfer):
    /// a transfer that never lands is the KV rule's to name.
    fn silent_since_sent(&self, u: &UnitTrack, r: &WatchProbe) -> bool {
        let (p, now) = (self.p, self.now);
        let mut allow = p.silence_allowance(u.engine(p).profile(), u.work_signal(p));
        if u.last
            .as_ref()
            .and_then(|s| s.metrics)
            .is_some_and(|m| m.only_waiting_for_kv())
        {
            allow = allow.max(p.stall_budget + p.max_prefill + p.max_kv_transfer);
        }
        !u.moved_after(r.sent_at) && now.saturating_duration_since(r.sent_at) >= allow
    }

    /// "prefill-0 health 200, decode-0 health 200".
    fn health_line(&self) -> String {
        self.units
            .iter()
            .map(|u| format!("{} health {}", u.unit, u.health_status))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The agents' layer first. A unit not running on purpose (never
    /// started, or stopped on command) is reported, never started by the
    /// watch: starting what the operator has not is the operator's call
    /// (`restart pd-pair`), and a freshly started orchestrator used to
    /// "recover" units nobody had started.
    fn stopped_on_purpose(&self) -> Option<Ruling> {
        let stopped: Vec<&AgentFact> = self.e.lives.iter().filter(|f| f.life == Life::Stopped).collect();
        if stopped.is_empty() {
            return None;
        }
        Some(Ruling::new(
            PairState::Down,
            stopped
                .iter()
                .map(|f| {
                    format!(
                        "{} {} is not running: never started, or stopped on purpose (its agent's report); the watch does not start what the operator has not — `restart pd-pair` starts the pair in order",
                        f.role, f.unit
                    )
                })
                .collect(),
        ))
    }

    /// A unit of the pair exited on its own, by its agent's report (the
    /// router included, which no engine sample shows): wedged, so that it is
    /// recovered through the breaker, not left suspect (issue 31).
    fn exited(&self) -> Option<Ruling> {
        let (e, now) = (self.e, self.now);
        let exited: Vec<(&AgentFact, &str)> = e
            .lives
            .iter()
            .filter_map(|f| match &f.life {
                Life::Exited { detail } => Some((f, detail.as_str())),
                _ => None,
            })
            .collect();
        if exited.is_empty() {
            return None;
        }
        let onset = e.last_proof.as_ref().map_or(now, |p| p.0);
        let evidence = WedgeEvidence {
            kind: WedgeKind::Exited,
            onset,
            silent_ms: ms(now.saturating_duration_since(onset)),
            ruled_out: exited
                .iter()
                .map(|(f, d)| {
                    format!(
                        "{} {} exited on its own ({d}), outside any operation: nothing of it runs to wait for",
                        f.role, f.unit
                    )
                })
                .collect(),
        };
        Some(Ruling::wedged(
            exited
                .iter()
                .map(|(f, d)| {
                    format!(
                        "{} {} is not running: exited ({d}; its agent's report); the pair cannot serve",
                        f.role, f.unit
                    )
                })
                .collect(),
            evidence,
        ))
    }

    /// Probes failing with errors, twice in a row at least the minimum gap
    /// apart, with not every engine progressing since the first: the pair
    /// answers only errors (INCIDENTS row 1: every KV transfer fails), and
    /// an error answer is not work in progress.
    fn failing(&self) -> Option<Ruling> {
        let (e, p, now) = (self.e, self.p, self.now);
        let (first, last) = e
            .first_failure_sent
            .filter(|first| {
                e.failed_in_row >= 2
                    && e.last_probe
                        .as_ref()
                        .is_some_and(|r| r.sent_at.saturating_duration_since(*first) >= p.min_probe_interval)
                    && !e.units.iter().all(|u| u.progressed_after(*first))
            })
            .zip(e.last_probe.as_ref())?;
        let what = match &last.outcome {
            ProbeObservation::Error { message } => message.clone(),
            other => other.kind().to_string(),
        };
        let evidence = WedgeEvidence {
            kind: WedgeKind::Failing,
            onset: first,
            silent_ms: ms(now.saturating_duration_since(first)),
            ruled_out: vec![
                format!(
                    "{} probes in a row failed with an error over {} (the last: {what}): an error answer is not work in progress",
                    e.failed_in_row,
                    s(last.sent_at.saturating_duration_since(first))
                ),
                "not every engine progressed since the first: no traffic is being served meanwhile".into(),
            ],
        };
        Some(Ruling::wedged(
            vec![format!(
                "{} probes through {} in a row failed over {} (the last: {what}), and not every engine has progressed since: the pair answers only errors",
                e.failed_in_row,
                last.target,
                s(last.sent_at.saturating_duration_since(first))
            )],
            evidence,
        ))
    }

    /// A unit the unit rules found wedged, the earliest onset first.
    fn unit_wedged(&self) -> Option<Ruling> {
        let w = self
            .units
            .iter()
            .filter(|u| u.state == UnitState::Wedged)
            // A prefill holding KV for a partner that answers nothing is a
            // consequence: the unresponsive rule names the cause.
            .filter(|u| {
                !(self.any(UnitState::Unresponsive)
                    && u.wedge.as_ref().is_some_and(|w| w.kind == WedgeKind::KvTransfer))
            })
            .filter_map(|u| u.wedge.clone())
            .min_by_key(|w| w.onset)?;
        Some(Ruling::wedged(self.unit_reasons(&[UnitState::Wedged]), w))
    }

    /// Seed 004: a KV transfer that never lands ([`kv_transfer_stuck`]).
    fn kv_transfer(&self) -> Option<Ruling> {
        let (reason, evidence) = kv_transfer_stuck(self.e, self.p, self.now)?;
        Some(Ruling::wedged(vec![reason], evidence))
    }

    /// Generation silent while health answers 200 (seeds 002, 003): a probe
    /// whose timeout covered the work ahead of it timed out, every health
    /// answers 2xx, and some engine computed nothing at all since it was
    /// sent — health 200 does not prove generation.
    fn silent_generation(&self) -> Option<Ruling> {
        let (e, p, now) = (self.e, self.p, self.now);
        let Some(
            r @ WatchProbe {
                outcome: ProbeObservation::Timeout { after_ms },
                ..
            },
        ) = self.failed_probe()
        else {
            return None;
        };
        if !self.units.iter().all(|u| (200..300).contains(&u.health_status))
            || !e.units.iter().any(|u| self.silent_since_sent(u, r))
        {
            return None;
        }
        let silent: Vec<&str> = e
            .units
            .iter()
            .filter(|u| self.silent_since_sent(u, r))
            .map(|u| u.unit.as_str())
            .collect();
        let covered = format!(
            "its timeout {} covered {} request(s) ahead at up to {} each{}",
            s(r.timeout),
            r.work_ahead,
            s(if p.serial { p.max_request() } else { p.max_prefill }),
            if p.serial {
                " (serial engines: each runs its whole prefill and generation first)"
            } else {
                ""
            }
        );
        let evidence = WedgeEvidence {
            kind: WedgeKind::SilentGeneration,
            onset: r.sent_at,
            silent_ms: ms(now.saturating_duration_since(r.sent_at)),
            ruled_out: vec![
                covered.clone(),
                format!(
                    "{} computed nothing at all since it was sent, not even the probe's own tokens",
                    silent.join(", ")
                ),
                "health 200 does not prove generation (INCIDENTS row 3)".into(),
            ],
        };
        Some(Ruling::wedged(
            vec![format!(
                "{} through {} timed out after {} ({covered}); {} produced nothing since it was sent, while {}",
                probe_name(r),
                r.target,
                s(Duration::from_millis(*after_ms)),
                silent.join(", "),
                self.health_line()
            )],
            evidence,
        ))
    }

    /// A unit that answers nothing at all (issue 15), with a probe through
    /// the router failing after it went silent: stuck, not working — the
    /// engines' HTTP servers answer /metrics while their schedulers compute.
    fn unresponsive(&self) -> Option<Ruling> {
        let (e, p, now) = (self.e, self.p, self.now);
        let r = self.failed_probe()?;
        let (track, assessed) = e
            .units
            .iter()
            .zip(self.units)
            .filter(|(t, a)| {
                // Sent after it went silent; or still unanswered, past its
                // allowance counted from when the silence began.
                a.state == UnitState::Unresponsive
                    && t.scrape_bad_since.is_some_and(|b| {
                        now.saturating_duration_since(b) >= p.stall_budget
                            && (b <= r.sent_at
                                || (r.request_id == OVERDUE && now.saturating_duration_since(b) >= r.timeout))
                    })
            })
            .min_by_key(|(t, _)| t.scrape_bad_since)?;
        // A down unit is not one that is busy: the engines' HTTP servers
        // answer /metrics while their schedulers compute (SGLang's
        // tokenizer manager, vLLM's API server: ENGINE-NOTES.md). One that
        // answers nothing for longer than the stall budget, with a probe
        // through the router failing after it went silent, is stuck, not
        // working — recovered (or held by the breaker), never left down.
        let onset = track.scrape_bad_since.unwrap_or(r.sent_at);
        let what = match &r.outcome {
            ProbeObservation::Timeout { after_ms } => {
                format!("timed out after {}", s(Duration::from_millis(*after_ms)))
            }
            ProbeObservation::Error { message } => format!("failed ({message})"),
            ProbeObservation::Ok { .. } => unreachable!("a failed probe"),
        };
        let evidence = WedgeEvidence {
            kind: WedgeKind::Unresponsive,
            onset,
            silent_ms: ms(now.saturating_duration_since(onset)),
            ruled_out: vec![
                format!(
                    "{} answered neither /metrics nor health for {}, longer than the stall budget {}: an engine's HTTP server answers /metrics while its scheduler works",
                    track.unit,
                    s(now.saturating_duration_since(onset)),
                    s(p.stall_budget)
                ),
                format!(
                    "{} through {} sent after it went silent {what}: the pair does not generate",
                    probe_name(r),
                    r.target
                ),
            ],
        };
        let mut reasons = assessed.reasons.clone();
        reasons.push(format!(
            "{} through {} sent after {} went silent {what}",
            probe_name(r),
            r.target,
            track.unit
        ));
        Some(Ruling::wedged(reasons, evidence))
    }

    /// A running unit answers neither /metrics nor health, with no failed
    /// probe sent after it went silent yet: suspect, and probed at once
    /// (issue 49: it used to be `down`, a state for units that do not run,
    /// and a decode frozen right after a restart stayed so for minutes).
    fn unanswering(&self) -> Option<Ruling> {
        self.any(UnitState::Unresponsive)
            .then(|| Ruling::new(PairState::Suspect, self.unit_reasons(&[UnitState::Unresponsive])))
    }

    /// A failed probe stands while not every engine has progressed since:
    /// suspect, short of the rules that would make it a wedge.
    fn probe_failed(&self) -> Option<Ruling> {
        let r = self.failed_probe()?;
        let what = match &r.outcome {
            ProbeObservation::Timeout { after_ms } => {
                format!("timed out after {}", s(Duration::from_millis(*after_ms)))
            }
            ProbeObservation::Error { message } => format!("failed ({message})"),
            ProbeObservation::Ok { .. } => unreachable!("filtered"),
        };
        Some(Ruling::new(
            PairState::Suspect,
            vec![format!(
                "{} through {} {what}; not every engine has progressed since",
                probe_name(r),
                r.target
            )],
        ))
    }

    /// A probe failed, yet every engine progressed since: the pair serves
    /// other requests — suspect only (a partial wedge is the stall rule's).
    fn serves_others(&self) -> Option<Ruling> {
        let r = self.served_others()?;
        Some(Ruling::new(
            PairState::Suspect,
            vec![format!(
                "{} through {} failed, yet every engine progressed since: the pair serves other requests (a partial wedge is judged by the stall rule)",
                probe_name(r),
                r.target
            )],
        ))
    }

    /// A unit stalled past the budget, or with its passive evidence
    /// missing: suspect.
    fn suspicious_units(&self) -> Option<Ruling> {
        (self.any(UnitState::Stalled) || self.any(UnitState::Unknown)).then(|| {
            Ruling::new(
                PairState::Suspect,
                self.unit_reasons(&[UnitState::Stalled, UnitState::Unknown]),
            )
        })
    }

    /// Nothing suspicious and liveness proven within twice the idle probe
    /// interval, by traffic or by a probe or healthy operation: healthy.
    fn healthy(&self) -> Option<Ruling> {
        let (e, now) = (self.e, self.now);
        if !self.proof_fresh(self.p.idle_probe_interval * 2) {
            return None;
        }
        let how = match (&e.last_proof, self.traffic_proof) {
            (Some((t, how)), tp) if tp.is_none_or(|tp| *t >= tp) => how.clone(),
            _ => "real traffic advances every engine's token counters".into(),
        };
        Some(Ruling::new(
            PairState::Healthy,
            vec![format!(
                "{how} ({} ago)",
                s(now.saturating_duration_since(self.proof_at.unwrap_or(now)))
            )],
        ))
    }

    /// Nothing suspicious, but nothing has proved liveness lately: unproven.
    fn unproven(&self) -> Ruling {
        Ruling::new(
            PairState::Unproven,
            vec![match self.proof_at {
                Some(t) => format!("liveness last proven {} ago", s(self.now.saturating_duration_since(t))),
                None => "liveness not proven yet in this watch".into(),
            }],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Defaults of `[pair.watch]`, with seed 001's serial engine: prompts up
    /// to 50,000 tokens at 250 tok/s → a worst prefill of 200 s (chunking
    /// unknown, so a chunk is the whole prefill); outputs up to 1,000 tokens
    /// at 10 tok/s → a worst generation of 100 s.
    pub(super) fn policy() -> WatchPolicy {
        WatchPolicy {
            stall_budget: Duration::from_secs(8),
            max_prefill: Duration::from_secs(200),
            max_generation: Duration::from_secs(100),
            max_prefill_chunk: Duration::from_secs(200),
            decode_step: Duration::from_millis(100),
            idle_gauge_refresh: None,
            max_kv_transfer: Duration::from_secs(10),
            serial: true,
            engine: EngineKind::Sglang,
            idle_probe_interval: Duration::from_secs(60),
            min_probe_interval: Duration::from_secs(5),
            probe_timeout: Duration::from_secs(120),
            warm_probe_timeout: Duration::from_secs(120),
            max_probe_timeout: Duration::from_secs(1_200),
            stale_after: Duration::from_secs(5),
            scrape_interval: Duration::from_secs(1),
            gpu_idle_below: 0.05,
            probe_tokens: 100.0,
        }
    }

    /// An SGLang sample: `realtime` is `realtime_tokens_total` (rises during
    /// work), `finished` the at-finish token counters' sum.
    pub(super) fn sample(
        at: Instant,
        running: f64,
        queued: f64,
        realtime: f64,
        finished: f64,
        gpu: Option<f64>,
    ) -> Sample {
        Sample {
            at,
            health_status: 200,
            metrics: Some(Metrics {
                running,
                queued,
                generation_tokens: Some(finished),
                prompt_tokens: Some(0.0),
                realtime_tokens: Some(realtime),
                gpu_util: gpu,
                ..Metrics::default()
            }),
            error: String::new(),
        }
    }

    pub(super) fn pair() -> PairEvidence {
        PairEvidence::new(
            vec![
                UnitTrack::new("prefill-0", "prefill"),
                UnitTrack::new("decode-0", "decode"),
            ],
            Duration::from_secs(1),
        )
    }

    pub(super) fn observe(e: &mut PairEvidence, unit: &str, s: Sample) {
        e.observe(unit, s, EngineKind::Sglang);
    }

    /// Feeds one sample per second to both units from `from` for `secs` s;
    /// `f(t)` gives (prefill, decode) samples. Returns every assessment, one
    /// per second.
    pub(super) fn run_with(
        e: &mut PairEvidence,
        p: &WatchPolicy,
        t0: Instant,
        secs: u64,
        f: impl Fn(u64, Instant) -> [Sample; 2],
    ) -> Vec<Assessment> {
        (0..=secs)
            .map(|t| {
                let now = t0 + Duration::from_secs(t);
                let [a, b] = f(t, now);
                observe(e, "prefill-0", a);
                observe(e, "decode-0", b);
                judge(e, p, now)
            })
            .collect()
    }

    /// `run_with` for plain samples: (running, queued, realtime, finished, gpu).
    fn run(
        e: &mut PairEvidence,
        t0: Instant,
        secs: u64,
        f: impl Fn(u64) -> [(f64, f64, f64, f64, Option<f64>); 2],
    ) -> Vec<Assessment> {
        run_with(e, &policy(), t0, secs, |t, now| {
            let [a, b] = f(t);
            [
                sample(now, a.0, a.1, a.2, a.3, a.4),
                sample(now, b.0, b.1, b.2, b.3, b.4),
            ]
        })
    }

    pub(super) fn first_wedged(out: &[Assessment]) -> Option<usize> {
        out.iter().position(|a| a.state == PairState::Wedged)
    }

    /// INCIDENTS row 4: the serial prefill leaked its slot on the abandoned
    /// 41,818-token prompt; the next 18-token request queues forever, health
    /// 200. Without GPU evidence it is a wedge once realtime_tokens_total has
    /// been flat for the budget (8 s) plus the longest legitimate flat spell
    /// (one chunk at the slowest speed: here the whole worst prefill, 200 s) —
    /// not before, since a real 41,818-token prefill at 250 tok/s takes 167 s —
    /// and the reason names the numbers.
    #[test]
    fn row4_slot_leak_is_wedged_after_the_worst_prefill_not_before() {
        let t0 = Instant::now();
        let mut e = pair();
        let out = run(&mut e, t0, 220, |t| {
            // t = 1: the last chunk the engine computed before the leak.
            let realtime = if t == 0 { 100.0 } else { 8_292.0 };
            [(1.0, 1.0, realtime, 50.0, None), (0.0, 0.0, 400.0, 18.0, None)]
        });
        assert!(out[..=167].iter().all(|a| a.state != PairState::Wedged));
        assert_eq!(out[100].state, PairState::Suspect, "{:?}", out[100].reasons);
        let first = first_wedged(&out).unwrap();
        assert_eq!(first, 209, "stall counted from the last progress at 1 s");
        let a = &out[first];
        let r = a.reasons.join("\n");
        assert!(r.contains("prefill-0: 1 running, 1 queued"), "{r}");
        assert!(r.contains("realtime_tokens_total 8292"), "{r}");
        assert!(r.contains("no progress for 208.0 s"), "{r}");
        assert!(
            r.contains("+ 200.0 s that sglang:realtime_tokens_total may legitimately stay flat"),
            "{r}"
        );
        assert!(r.contains("health answers 200"), "{r}");
        let w = a.wedge.as_ref().unwrap();
        assert_eq!((w.kind, w.silent_ms), (WedgeKind::Stall, 208_000));
        assert!(w.ruled_out[0].contains("rises during work"), "{:?}", w.ruled_out);
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
        let first = first_wedged(&out).unwrap();
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
    /// 138.7 s (one unchunked forward: realtime tokens rise once, at the
    /// end), then answered; never a wedge, and healthy once counters move.
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
                    if done { 39_723.0 } else { 100.0 },
                    if done { 39_724.0 } else { 100.0 },
                    None,
                ),
                (
                    0.0,
                    0.0,
                    if done { 420.0 } else { 400.0 },
                    if done { 420.0 } else { 400.0 },
                    None,
                ),
            ]
        });
        assert!(out.iter().all(|a| a.state != PairState::Wedged));
        assert_eq!(out[150].state, PairState::Healthy, "{:?}", out[150].reasons);
    }

    /// Issue 13, found: a generation at low tokens/s runs for minutes while
    /// SGLang's at-finish counters stay flat; realtime_tokens_total rises
    /// every decode step, so it is never a stall. (The old judge read only
    /// the at-finish counters and called it a wedge at 208 s.)
    #[test]
    fn long_generation_at_low_tokens_per_s_is_never_a_stall() {
        let t0 = Instant::now();
        let mut e = pair();
        let out = run(&mut e, t0, 600, |t| {
            let t = t as f64;
            // 8,000 output tokens at 5 tok/s: 1,600 s; nothing finishes in 600 s.
            [(0.0, 0.0, 500.0, 500.0, None), (1.0, 0.0, 500.0 + 5.0 * t, 18.0, None)]
        });
        assert!(
            out.iter()
                .all(|a| !matches!(a.state, PairState::Wedged | PairState::Suspect)),
            "{:?}",
            out.iter()
                .find(|a| a.state != PairState::Healthy && a.state != PairState::Unproven)
        );
    }

    /// The fallback (SGLang < 0.5.7: no counter rises during work): with
    /// work present and nothing finishing, only the longest legitimate
    /// request (prefill 200 s + generation 100 s) plus the budget makes a
    /// wedge.
    #[test]
    fn without_a_during_work_counter_the_longest_request_is_allowed() {
        let p = policy();
        let t0 = Instant::now();
        let mut e = pair();
        let old = |at: Instant, running: f64, finished: f64| {
            let mut s = sample(at, running, 0.0, 0.0, finished, None);
            s.metrics.as_mut().unwrap().realtime_tokens = None;
            s
        };
        let out = run_with(&mut e, &p, t0, 320, |_, now| [old(now, 1.0, 50.0), old(now, 0.0, 18.0)]);
        assert_eq!(first_wedged(&out), Some(308), "8 s + 200 s + 100 s");
        let r = out[308].reasons.join("\n");
        assert!(r.contains("exposes no counter that rises during work"), "{r}");
    }

    /// SGLang's gauges are refreshed at most every 30 s while idle: a request
    /// that finished may still show as running with nothing moving. Not a
    /// stall within the gauges' refresh, even with chunked prefill known.
    #[test]
    fn stale_gauge_after_a_finish_is_not_a_stall() {
        let mut p = policy();
        p.max_prefill_chunk = Duration::from_secs(2);
        let t0 = Instant::now();
        let mut e = pair();
        let out = run_with(&mut e, &p, t0, 36, |t, now| {
            // Finished at 1 s; the gauge says 1 running until the idle log at 31 s.
            let running = if t < 31 { 1.0 } else { 0.0 };
            let done = if t >= 1 { 60.0 } else { 10.0 };
            [
                sample(now, 0.0, 0.0, done, done, None),
                sample(now, running, 0.0, done, done, None),
            ]
        });
        assert!(
            first_wedged(&out).is_none(),
            "{:?}",
            out.iter().find(|a| a.state == PairState::Wedged)
        );
        // A real stall with chunking known, where nothing finished last, is
        // caught after budget + one chunk (2 s): the idle refresh is no excuse.
        let mut e = pair();
        let out = run_with(&mut e, &p, t0, 60, |_, now| {
            [
                sample(now, 1.0, 1.0, 10.0, 10.0, None),
                sample(now, 0.0, 0.0, 10.0, 10.0, None),
            ]
        });
        assert_eq!(first_wedged(&out), Some(10));
        // After a finish, a stall that outlasts the refresh is still caught.
        let mut e = pair();
        let out = run_with(&mut e, &p, t0, 60, |t, now| {
            let done = if t >= 1 { 60.0 } else { 10.0 };
            [
                sample(now, 0.0, 0.0, done, done, None),
                sample(now, 1.0, 0.0, done, done, None),
            ]
        });
        assert_eq!(first_wedged(&out), Some(39), "1 s + 8 s + 30 s");
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
            [
                (3.0, 5.0, 4_000.0 * t, 100.0 * t, None),
                (8.0, 2.0, 30.0 * t, 30.0 * t, None),
            ]
        });
        let probes = out
            .iter()
            .filter(|a| matches!(a.probe, ProbeDecision::Send { .. }))
            .count();
        assert_eq!(probes, 0);
        assert!(out[1..].iter().all(|a| a.state == PairState::Healthy));
    }

    fn ok_probe(sent_at: Instant, timeout: Duration, work_ahead: u32) -> WatchProbe {
        WatchProbe {
            target: "router-0".into(),
            sent_at,
            timeout,
            work_ahead,
            outcome: ProbeObservation::Ok {
                latency_ms: 200,
                tokens: 1,
            },
            request_id: "pdwarden-probe-x".into(),
        }
    }

    /// Row 5: idle for an hour, the probe rate is bounded by
    /// `idle_probe_interval` (60 s → at most 60 probes per hour, all with the
    /// pair's one prompt), never two probes in flight, and the probes' own
    /// tokens never count as traffic.
    #[test]
    fn row5_idle_pair_is_probed_at_a_bounded_rate() {
        let p = policy();
        let t0 = Instant::now();
        let mut e = pair();
        let mut sent = 0;
        let mut tokens = 10.0;
        for t in 0..3_600u64 {
            let now = t0 + Duration::from_secs(t);
            observe(&mut e, "prefill-0", sample(now, 0.0, 0.0, tokens, tokens, None));
            observe(&mut e, "decode-0", sample(now, 0.0, 0.0, tokens, tokens, None));
            let a = judge(&e, &p, now);
            assert!(a.reasons.iter().all(|r| !r.contains("real traffic")), "{:?}", a.reasons);
            if let ProbeDecision::Send {
                timeout, work_ahead, ..
            } = a.probe
            {
                // Idle engines: the floor of one legitimate silence (200 s chunk).
                assert_eq!((timeout, work_ahead), (p.probe_timeout + p.max_prefill_chunk, 0));
                sent += 1;
                e.probe_sent(now, p.probe_tokens);
                // Answered 200 ms later; its 40 tokens show in every counter.
                e.probe_done(ok_probe(now, timeout, work_ahead), now + Duration::from_millis(200));
                tokens += 40.0;
            }
        }
        // One a minute; the first few after the watch starts at the
        // minimum gap, doubling (issue 31: right after a start or a
        // restart, when pairs break most).
        assert!((59..=64).contains(&sent), "{sent}");
        assert!(
            e.units.iter().all(|u| u.last_progress.is_none()),
            "probe tokens are not progress"
        );
    }

    /// Found on the real stack: a probe's credit outlived its tokens and
    /// swallowed real traffic's progress, so traffic no longer proved the pair
    /// alive and the watch kept probing it. The credit lapses two scrapes
    /// after the probe's answer: traffic after that is progress again.
    #[test]
    fn a_probe_credit_lapses_and_traffic_proves_liveness_again() {
        let p = policy();
        let t0 = Instant::now();
        let mut e = pair();
        observe(&mut e, "prefill-0", sample(t0, 0.0, 0.0, 100.0, 100.0, None));
        observe(&mut e, "decode-0", sample(t0, 0.0, 0.0, 100.0, 100.0, None));
        e.probe_sent(t0, p.probe_tokens);
        e.probe_done(ok_probe(t0, p.probe_timeout, 0), t0 + Duration::from_millis(100));
        for t in 1..=4u64 {
            let now = t0 + Duration::from_secs(t);
            // Real traffic: 20 tokens a second on both engines.
            let v = 100.0 + 20.0 * t as f64;
            observe(&mut e, "prefill-0", sample(now, 0.0, 0.0, v, v, None));
            observe(&mut e, "decode-0", sample(now, 0.0, 0.0, v, v, None));
        }
        assert!(
            e.units
                .iter()
                .all(|u| u.last_progress == Some(t0 + Duration::from_secs(4)))
        );
        let a = judge(&e, &p, t0 + Duration::from_secs(4));
        assert_eq!(a.state, PairState::Healthy, "{:?}", a.reasons);
    }

    /// Issue 13's false wedge, end to end in the judge: an SGLang-like serial
    /// prefill at 300 tok/s told the truth (16,384 tokens max: worst prefill
    /// 55 s). A 12,000-token prompt: 40 s of honest prefill in one forward,
    /// health 503 from 20 s (no scheduler output), the decode waiting for KV.
    /// The pair is suspect, the probe's timeout covers the running request
    /// (worst prefill + generation), the probe queues behind the prefill and
    /// is answered once it ends — and nothing is ever wedged.
    #[test]
    fn issue13_serial_40s_prefill_is_never_a_wedge() {
        let mut p = policy();
        p.max_prefill = Duration::from_secs(55);
        p.max_prefill_chunk = Duration::from_secs(55);
        p.probe_timeout = Duration::from_secs(20);
        let t0 = Instant::now();
        let mut e = pair();
        // Healthy and idle before the request (health seen 200).
        for t in 0..3u64 {
            let now = t0 + Duration::from_secs(t);
            observe(&mut e, "prefill-0", sample(now, 0.0, 0.0, 100.0, 100.0, None));
            observe(&mut e, "decode-0", sample(now, 0.0, 0.0, 100.0, 100.0, None));
        }
        let start = t0 + Duration::from_secs(3);
        let mut probe: Option<(Instant, Duration, u32)> = None;
        let mut states = Vec::new();
        for t in 0..=80u64 {
            let now = start + Duration::from_secs(t);
            let prefilling = t < 40;
            let mut pf = sample(
                now,
                if prefilling { 1.0 } else { 0.0 },
                if probe.is_some() && prefilling { 1.0 } else { 0.0 },
                if prefilling { 100.0 } else { 12_100.0 },
                100.0,
                None,
            );
            if prefilling && t >= 20 {
                pf.health_status = 503;
            }
            let mut dc = sample(
                now,
                if prefilling { 0.0 } else { 1.0 },
                0.0,
                100.0 + 20.0 * t.saturating_sub(40) as f64,
                100.0,
                None,
            );
            dc.metrics.as_mut().unwrap().decode_transfer = Some(if prefilling { 1.0 } else { 0.0 });
            observe(&mut e, "prefill-0", pf);
            observe(&mut e, "decode-0", dc);
            let a = judge(&e, &p, now);
            assert_ne!(a.state, PairState::Wedged, "t = {t}: {:?}", a.reasons);
            states.push(a.state);
            if let ProbeDecision::Send {
                timeout, work_ahead, ..
            } = a.probe
            {
                assert!(!e.probe_in_flight, "one probe at a time");
                if prefilling {
                    assert!(work_ahead >= 1, "covers the running request");
                    assert!(timeout >= p.probe_timeout + p.max_request(), "{timeout:?}");
                }
                e.probe_sent(now, p.probe_tokens);
                probe = Some((now, timeout, work_ahead));
            }
            // A probe queued behind the prefill is answered when it ends.
            if let Some((sent, timeout, ahead)) = probe
                && e.probe_in_flight
                && !prefilling
            {
                e.probe_done(ok_probe(sent, timeout, ahead), now);
            }
        }
        assert!(states.contains(&PairState::Suspect), "{states:?}");
        assert!(probe.is_some(), "a suspicious pair is probed");
        assert_eq!(*states.last().unwrap(), PairState::Healthy);
    }

    /// Issue 13, found: any answered probe restarted the stall clock, so a
    /// partial wedge — real requests frozen, the watch's own short probe
    /// answered — was never confirmed. The probe's tokens are credited, not
    /// progress: the stall is confirmed, as a partial one.
    #[test]
    fn partial_wedge_that_probes_survive_is_confirmed() {
        let mut p = policy();
        p.max_prefill_chunk = Duration::from_secs(20);
        p.idle_gauge_refresh = Some(Duration::from_secs(5));
        let t0 = Instant::now();
        let mut e = pair();
        let mut extra = 0.0;
        let mut out = Vec::new();
        for t in 0..=60u64 {
            let now = t0 + Duration::from_secs(t);
            // Three real requests frozen on the decode; probes every 10 s
            // add their 40 tokens to both engines' counters.
            if t % 10 == 5 {
                e.probe_sent(now, p.probe_tokens);
                extra += 40.0;
                e.probe_done(ok_probe(now, p.probe_timeout, 3), now + Duration::from_millis(300));
            }
            observe(
                &mut e,
                "prefill-0",
                sample(now, 0.0, 0.0, 900.0 + extra, 900.0 + extra, None),
            );
            observe(
                &mut e,
                "decode-0",
                sample(now, 3.0, 0.0, 700.0 + extra, 700.0 + extra, None),
            );
            out.push(judge(&e, &p, now));
        }
        let first = first_wedged(&out).expect("confirmed");
        assert_eq!(first, 28, "8 s budget + 20 s chunk");
        let w = out[first].wedge.as_ref().unwrap();
        assert_eq!(w.kind, WedgeKind::PartialStall);
        assert!(
            w.ruled_out.iter().any(|r| r.contains("own short probe was answered")),
            "{:?}",
            w.ruled_out
        );
    }

    /// Issue 13, found: a timed-out probe was discarded as soon as any unit
    /// showed progress. The prefill keeps computing other requests while the
    /// decode produces nothing: the probe's timeout still stands as a wedge.
    /// Only when every engine progressed is it merely suspect.
    #[test]
    fn timed_out_probe_stands_while_one_engine_is_silent() {
        let p = policy();
        let t0 = Instant::now();
        let mut e = pair();
        observe(&mut e, "prefill-0", sample(t0, 0.0, 0.0, 5.0, 5.0, None));
        observe(&mut e, "decode-0", sample(t0, 0.0, 0.0, 5.0, 5.0, None));
        e.probe_sent(t0, p.probe_tokens);
        let timeout = p.probe_timeout + p.max_prefill_chunk;
        let done = t0 + timeout;
        observe(&mut e, "prefill-0", sample(done, 0.0, 0.0, 9_005.0, 5.0, None));
        observe(&mut e, "decode-0", sample(done, 0.0, 0.0, 5.0, 5.0, None));
        e.probe_done(
            WatchProbe {
                target: "router-0".into(),
                sent_at: t0,
                timeout,
                work_ahead: 0,
                outcome: ProbeObservation::Timeout { after_ms: ms(timeout) },
                request_id: "pdwarden-probe-1".into(),
            },
            done,
        );
        let a = judge(&e, &p, done);
        assert_eq!(a.state, PairState::Wedged, "{:?}", a.reasons);
        let r = &a.reasons[0];
        assert!(
            r.contains("timed out after 320.0 s") && r.contains("decode-0 produced nothing"),
            "{r}"
        );
        assert!(!r.contains("prefill-0 produced"), "{r}");
        assert_eq!(a.wedge.as_ref().unwrap().kind, WedgeKind::SilentGeneration);
        // Every engine progressed since: the pair serves others — suspect only.
        let later = done + Duration::from_secs(1);
        observe(&mut e, "decode-0", sample(later, 0.0, 0.0, 9_005.0, 5.0, None));
        observe(&mut e, "prefill-0", sample(later, 0.0, 0.0, 19_005.0, 5.0, None));
        let a = judge(&e, &p, later);
        assert_eq!(a.state, PairState::Suspect, "{:?}", a.reasons);
        // An erroring probe (e.g. the router's 503) is suspect, not wedged,
        // and the same router is not probed again before the idle interval.
        let mut e2 = pair();
        observe(&mut e2, "prefill-0", sample(done, 0.0, 0.0, 5.0, 5.0, None));
        observe(&mut e2, "decode-0", sample(done, 0.0, 0.0, 5.0, 5.0, None));
        e2.probe_done(
            WatchProbe {
                target: "router-0".into(),
                sent_at: t0,
                timeout,
                work_ahead: 0,
                outcome: ProbeObservation::Error {
                    message: "http 503".into(),
                },
                request_id: "pdwarden-probe-2".into(),
            },
            done,
        );
        let a = judge(&e2, &p, done);
        assert_eq!(a.state, PairState::Suspect);
        assert_eq!(a.probe, ProbeDecision::None);
    }

    /// The README's default watch on a vLLM pair (worst prefill 6.6 s, worst
    /// generation 410 s, cold allowance 60 s, warm budget 2 s).
    fn readme_vllm_policy() -> WatchPolicy {
        WatchPolicy {
            stall_budget: Duration::from_secs(8),
            max_prefill: Duration::from_millis(6_554),
            max_generation: Duration::from_secs(410),
            max_prefill_chunk: Duration::from_millis(6_554),
            decode_step: Duration::from_millis(100),
            idle_gauge_refresh: None,
            max_kv_transfer: Duration::from_secs(10),
            serial: false,
            engine: EngineKind::Vllm,
            idle_probe_interval: Duration::from_secs(60),
            min_probe_interval: Duration::from_secs(5),
            probe_timeout: Duration::from_secs(60),
            warm_probe_timeout: Duration::from_secs(2),
            max_probe_timeout: Duration::from_secs(600),
            stale_after: Duration::from_secs(5),
            scrape_interval: Duration::from_secs(1),
            gpu_idle_below: 0.05,
            probe_tokens: 100.0,
        }
    }

    /// An idle vLLM engine's sample, its token counters at `tokens`.
    fn vllm_idle(at: Instant, tokens: f64) -> Sample {
        Sample {
            at,
            health_status: 200,
            metrics: Some(Metrics {
                generation_tokens: Some(tokens),
                prompt_tokens: Some(tokens),
                engine: Some(EngineKind::Vllm),
                ..Metrics::default()
            }),
            error: String::new(),
        }
    }

    /// Plays the watch against a pair restarted healthy at `t0` whose decode
    /// is `decode(at)` from then on and whose probes are never answered
    /// until their timeout: one tick a second for `secs`; the seconds after
    /// `t0` at which the wedge was confirmed, and its assessment.
    fn frozen_after_restart(
        p: &WatchPolicy,
        secs: u64,
        decode: impl Fn(Instant) -> Sample,
    ) -> Option<(u64, Assessment)> {
        frozen_after_restart_at(p, secs, 0, |_, at| decode(at), &mut Vec::new())
    }

    /// [`frozen_after_restart`] with the decode's sample a function of the
    /// seconds since the restart too, and probes sent up to `ok_until`
    /// seconds after it answered in a second (the pair worked until then);
    /// every state judged goes to `states`.
    fn frozen_after_restart_at(
        p: &WatchPolicy,
        secs: u64,
        ok_until: u64,
        decode: impl Fn(u64, Instant) -> Sample,
        states: &mut Vec<PairState>,
    ) -> Option<(u64, Assessment)> {
        let t0 = Instant::now();
        let mut e = pair();
        e.reset(Some((t0, "operation op-1 concluded healthy".into())));
        let mut pending: Option<(Instant, Duration, u32)> = None;
        for t in 1..=secs {
            let now = t0 + Duration::from_secs(t);
            e.observe("prefill-0", vllm_idle(now, 40.0), EngineKind::Vllm);
            e.observe("decode-0", decode(t, now), EngineKind::Vllm);
            if let Some((sent, timeout, ahead)) = pending
                && sent <= t0 + Duration::from_secs(ok_until)
                && now >= sent + Duration::from_secs(1)
            {
                e.probe_done(ok_probe(sent, timeout, ahead), now);
                pending = None;
            }
            if let Some((sent, timeout, ahead)) = pending
                && now >= sent + timeout
            {
                e.probe_done(
                    WatchProbe {
                        target: "router:router-0".into(),
                        sent_at: sent,
                        timeout,
                        work_ahead: ahead,
                        outcome: ProbeObservation::Timeout { after_ms: ms(timeout) },
                        request_id: "pdwarden-probe-x".into(),
                    },
                    now,
                );
                pending = None;
            }
            let a = judge(&e, p, now);
            states.push(a.state);
            if a.state == PairState::Wedged {
                return Some((t, a));
            }
            if let ProbeDecision::Send {
                timeout, work_ahead, ..
            } = a.probe
            {
                e.probe_sent_to(now, p.probe_tokens, "router:router-0".into(), timeout, work_ahead);
                pending = Some((now, timeout, work_ahead));
            }
        }
        None
    }

    /// Issue 31, finding 1: a whole decode process frozen at once after a
    /// healthy co-restart (SIGSTOP: neither /metrics nor health answer).
    /// The watch's first probe went out before any sample with the worst
    /// case as its timeout (426 s) and nothing else could confirm the wedge
    /// while it was outstanding. Now the verification is fresh evidence (the
    /// pair is warm: the warm budget, not the cold allowance), the engine's
    /// profile gives its silence allowance before any scrape answered, and an
    /// outstanding probe is re-judged as the gauges arrive: confirmed
    /// `unresponsive` within 30 s.
    #[test]
    fn a_decode_frozen_at_once_after_a_restart_is_confirmed_within_30_s() {
        let p = readme_vllm_policy();
        let silent = |at: Instant| Sample {
            at,
            health_status: 0,
            metrics: None,
            error: "no answer within 2 s".into(),
        };
        let (t, a) = frozen_after_restart(&p, 240, silent).expect("confirmed within 240 s");
        assert!(t <= 30, "confirmed only after {t} s: {:?}", a.reasons);
        assert_eq!(
            a.wedge.as_ref().unwrap().kind,
            WedgeKind::Unresponsive,
            "{:?}",
            a.reasons
        );
    }

    /// Issue 49's matrix for the whole decode process (SIGSTOP: neither
    /// /metrics nor health answers) at the README's defaults: frozen at
    /// once, 10 s, 45 s and an hour after a healthy restart, it is never
    /// `down` (its agent says it runs) and is confirmed `unresponsive`
    /// within 30 s of the freeze, whatever the moment.
    #[test]
    fn a_frozen_decode_is_never_down_and_confirmed_within_30_s_at_any_moment() {
        // docs/deploying.md's example probe: a 120 s timeout, a 2 s warm budget.
        let deploying = WatchPolicy {
            probe_timeout: Duration::from_secs(120),
            ..readme_vllm_policy()
        };
        for (p, freeze) in [0, 10, 45, 3_600]
            .into_iter()
            .flat_map(|f| [(readme_vllm_policy(), f), (deploying.clone(), f)])
        {
            let mut states = Vec::new();
            let decode = |t: u64, at: Instant| {
                if t > freeze {
                    Sample {
                        at,
                        health_status: 0,
                        metrics: None,
                        error: "no answer within 2 s".into(),
                    }
                } else {
                    vllm_idle(at, 40.0)
                }
            };
            let (t, a) = frozen_after_restart_at(&p, freeze + 240, freeze, decode, &mut states)
                .unwrap_or_else(|| panic!("frozen at {freeze} s: never confirmed"));
            assert!(
                t - freeze <= 30,
                "frozen at {freeze} s: confirmed {} s after: {:?}",
                t - freeze,
                a.reasons
            );
            assert_eq!(
                a.wedge.as_ref().unwrap().kind,
                WedgeKind::Unresponsive,
                "{:?}",
                a.reasons
            );
            assert!(!states.contains(&PairState::Down), "frozen at {freeze} s: {states:?}");
        }
    }

    /// Issue 31, finding 1: only the decode's engine core frozen at once
    /// after a healthy co-restart: vLLM's API server still answers health
    /// 200 and /metrics, its counters flat, the pair idle — no passive
    /// signal at all. Right after a restart the watch probes at the minimum
    /// gap (doubling towards the idle interval), with the warm budget: the
    /// probe's timeout and the silent engine confirm it within 30 s, where
    /// the first probe used to wait for the idle interval (60 s).
    #[test]
    fn an_engine_core_frozen_at_once_after_a_restart_is_confirmed_within_30_s() {
        let p = readme_vllm_policy();
        let (t, a) = frozen_after_restart(&p, 240, |at| vllm_idle(at, 40.0)).expect("confirmed within 240 s");
        assert!(t <= 30, "confirmed only after {t} s: {:?}", a.reasons);
        assert_eq!(
            a.wedge.as_ref().unwrap().kind,
            WedgeKind::SilentGeneration,
            "{:?}",
            a.reasons
        );
    }

    fn fact(unit: &str, role: &str, life: Life) -> AgentFact {
        AgentFact {
            unit: unit.into(),
            role: role.into(),
            life,
        }
    }

    fn error_probe(sent_at: Instant, message: &str) -> WatchProbe {
        WatchProbe {
            target: "router:router-0".into(),
            sent_at,
            timeout: Duration::from_secs(10),
            work_ahead: 0,
            outcome: ProbeObservation::Error {
                message: message.into(),
            },
            request_id: "pdwarden-probe-e".into(),
        }
    }

    /// Issue 31, finding 2: the router SIGKILLed — no engine sample shows
    /// it, every probe fails with a refused connection, and the pair stayed
    /// `suspect` for ever. Its agent says it exited: the pair is wedged
    /// (`exited`), to be recovered through the breaker, naming the unit.
    #[test]
    fn a_router_that_exited_is_recovered_not_left_suspect() {
        let p = readme_vllm_policy();
        let t0 = Instant::now();
        let mut e = pair();
        e.reset(Some((t0, "operation op-1 concluded healthy".into())));
        e.observe("prefill-0", vllm_idle(t0, 40.0), EngineKind::Vllm);
        e.observe("decode-0", vllm_idle(t0, 40.0), EngineKind::Vllm);
        let mut lives = vec![
            fact("prefill-0", "prefill", Life::Running),
            fact("decode-0", "decode", Life::Running),
            fact("router-0", "router", Life::Running),
        ];
        e.set_lives(lives.clone());
        assert_ne!(judge(&e, &p, t0).state, PairState::Wedged);
        lives[2].life = Life::Exited {
            detail: "killed by signal 9 (SIGKILL)".into(),
        };
        e.set_lives(lives);
        let a = judge(&e, &p, t0 + Duration::from_secs(1));
        assert_eq!(a.state, PairState::Wedged, "{:?}", a.reasons);
        assert_eq!(a.wedge.as_ref().unwrap().kind, WedgeKind::Exited);
        assert_eq!(
            a.reasons,
            [
                "router router-0 is not running: exited (killed by signal 9 (SIGKILL); its agent's report); the pair cannot serve"
            ]
        );
    }

    /// Issue 31, finding 5: a freshly started orchestrator judged units
    /// nobody had started wedged and co-restarted them itself. A unit its
    /// agent reports stopped (never started, or stopped on purpose) is
    /// reported `down` with what to do; never probed, never recovered.
    #[test]
    fn a_unit_nobody_started_is_reported_not_recovered() {
        let p = readme_vllm_policy();
        let t0 = Instant::now();
        let mut e = pair();
        let silent = |at: Instant| Sample {
            at,
            health_status: 0,
            metrics: None,
            error: "connection refused".into(),
        };
        e.set_lives(vec![
            fact("prefill-0", "prefill", Life::Stopped),
            fact("decode-0", "decode", Life::Stopped),
            fact("router-0", "router", Life::Stopped),
        ]);
        for t in 0..=120 {
            let now = t0 + Duration::from_secs(t);
            e.observe("prefill-0", silent(now), EngineKind::Vllm);
            e.observe("decode-0", silent(now), EngineKind::Vllm);
            let a = judge(&e, &p, now);
            assert_eq!(a.state, PairState::Down, "{:?}", a.reasons);
            assert_eq!(a.probe, ProbeDecision::None);
            assert!(a.wedge.is_none());
            assert!(a.reasons[0].starts_with("prefill prefill-0 is not running: never started, or stopped on purpose"));
        }
    }

    /// Issue 31, finding 2: a co-restart stopped after the prefill (INCIDENTS
    /// row 1: the decode keeps the old bootstrap, every request fails KV
    /// transfer) left the pair `suspect` for ever. Two probes in a row
    /// failing with an error, the minimum gap apart, with no engine
    /// progressing: `failing`, recovered. One failed probe, or failures
    /// while every engine serves others, are not.
    #[test]
    fn a_pair_that_answers_only_errors_is_failing() {
        let p = readme_vllm_policy();
        let t0 = Instant::now();
        let fresh = || {
            let mut e = pair();
            e.reset(None);
            e.observe("prefill-0", vllm_idle(t0, 40.0), EngineKind::Vllm);
            e.observe("decode-0", vllm_idle(t0, 40.0), EngineKind::Vllm);
            e
        };
        let kv = "http 500: KV transfer failed";
        let mut e = fresh();
        e.probe_sent(t0, p.probe_tokens);
        e.probe_done(error_probe(t0, kv), t0 + Duration::from_millis(50));
        let a = judge(&e, &p, t0 + Duration::from_secs(1));
        assert_eq!(a.state, PairState::Suspect, "one failure: {:?}", a.reasons);
        let second = t0 + Duration::from_secs(6);
        e.observe("prefill-0", vllm_idle(second, 40.0), EngineKind::Vllm);
        e.observe("decode-0", vllm_idle(second, 40.0), EngineKind::Vllm);
        e.probe_sent(second, p.probe_tokens);
        e.probe_done(error_probe(second, kv), second + Duration::from_millis(50));
        let a = judge(&e, &p, second + Duration::from_secs(1));
        assert_eq!(a.state, PairState::Wedged, "{:?}", a.reasons);
        assert_eq!(a.wedge.as_ref().unwrap().kind, WedgeKind::Failing);
        assert!(
            a.reasons[0].starts_with(
                "2 probes through router:router-0 in a row failed over 6.00 s (the last: http 500: KV transfer failed)"
            ),
            "{:?}",
            a.reasons
        );

        // Every engine progressed since the first failure: the pair serves
        // others (a partial failure is judged by other rules).
        let mut e = fresh();
        e.probe_sent(t0, p.probe_tokens);
        e.probe_done(error_probe(t0, kv), t0 + Duration::from_millis(50));
        for (i, t) in [3u64, 5, 7].iter().enumerate() {
            let at = t0 + Duration::from_secs(*t);
            let tokens = 40.0 + 500.0 * (i as f64 + 1.0);
            e.observe("prefill-0", vllm_idle(at, tokens), EngineKind::Vllm);
            e.observe("decode-0", vllm_idle(at, tokens), EngineKind::Vllm);
        }
        e.probe_sent(second, p.probe_tokens);
        e.probe_done(error_probe(second, kv), second + Duration::from_millis(50));
        let a = judge(&e, &p, t0 + Duration::from_secs(8));
        assert_ne!(a.state, PairState::Wedged, "{:?}", a.reasons);
    }

    /// Issue 31: a probe sent while the work ahead was unknown (no sample
    /// yet: the worst case as its timeout) is re-judged once the gauges show
    /// nothing ahead of it: past its budget and one silence it counts as
    /// timed out, and a unit that answers nothing is confirmed on it without
    /// waiting for its 416 s; while within that allowance it is no evidence.
    #[test]
    fn an_outstanding_probe_is_rejudged_as_the_gauges_arrive() {
        let p = readme_vllm_policy();
        let t0 = Instant::now();
        let mut e = pair();
        e.probe_sent_to(
            t0,
            p.probe_tokens,
            "router:router-0".into(),
            Duration::from_secs(476),
            0,
        );
        let silent = |at: Instant| Sample {
            at,
            health_status: 0,
            metrics: None,
            error: "no answer within 2 s".into(),
        };
        let mut confirmed = None;
        for t in 1..=120 {
            let now = t0 + Duration::from_secs(t);
            e.observe("prefill-0", vllm_idle(now, 40.0), EngineKind::Vllm);
            e.observe("decode-0", silent(now), EngineKind::Vllm);
            let a = judge(&e, &p, now);
            if a.state == PairState::Wedged {
                confirmed = Some((t, a));
                break;
            }
        }
        let (t, a) = confirmed.expect("confirmed while the probe is outstanding");
        // Cold budget 60 s (nothing proved the pair warm) + 6.6 s of silence.
        assert!((66..=70).contains(&t), "confirmed at {t} s: {:?}", a.reasons);
        assert_eq!(a.wedge.as_ref().unwrap().kind, WedgeKind::Unresponsive);
        assert!(a.reasons.iter().any(|r| r.contains(OVERDUE)), "{:?}", a.reasons);
    }

    /// Issue 15: a decode that answers nothing at all while its PID lives
    /// (a real single-process vLLM under SIGSTOP) was shown `down` for
    /// ever and never recovered. Unresponsive (issue 49: never `down`, the
    /// agent's word for a unit that does not run), it is probed; a probe
    /// sent after it went silent that fails makes it a wedge
    /// (`unresponsive`), recovered through the breaker. A probe that
    /// succeeds, or one that failed before the unit went silent, is no such
    /// evidence: suspect, not recovered.
    #[test]
    fn a_unit_that_answers_nothing_is_a_wedge_once_a_probe_fails() {
        let p = policy();
        let t0 = Instant::now();
        let silent = |at: Instant| Sample {
            at,
            health_status: 0,
            metrics: None,
            error: "no answer within 5 s".into(),
        };
        let setup = || {
            let mut e = pair();
            observe(&mut e, "prefill-0", sample(t0, 0.0, 0.0, 5.0, 5.0, None));
            observe(&mut e, "decode-0", sample(t0, 0.0, 0.0, 5.0, 5.0, None));
            for t in 1..=10 {
                let at = t0 + Duration::from_secs(t);
                observe(&mut e, "prefill-0", sample(at, 0.0, 0.0, 5.0, 5.0, None));
                observe(&mut e, "decode-0", silent(at));
            }
            e
        };
        let at = t0 + Duration::from_secs(10);
        let mut e = setup();
        let a = judge(&e, &p, at);
        // Issue 49: suspect and unresponsive, never `down` (its agent has
        // not said it is not running).
        assert_eq!(a.state, PairState::Suspect, "{:?}", a.reasons);
        assert_eq!(a.units[1].state, UnitState::Unresponsive, "{:?}", a.units[1]);
        let ProbeDecision::Send { timeout, .. } = a.probe else {
            panic!("a unit that answers nothing is probed: {:?}", a.probe)
        };
        e.probe_sent(at, p.probe_tokens);
        let done = at + timeout;
        observe(&mut e, "prefill-0", sample(done, 0.0, 0.0, 5.0, 5.0, None));
        observe(&mut e, "decode-0", silent(done));
        e.probe_done(
            WatchProbe {
                target: "router-0".into(),
                sent_at: at,
                timeout,
                work_ahead: 0,
                outcome: ProbeObservation::Timeout { after_ms: ms(timeout) },
                request_id: "pdwarden-probe-1".into(),
            },
            done,
        );
        let a = judge(&e, &p, done);
        assert_eq!(a.state, PairState::Wedged, "{:?}", a.reasons);
        let w = a.wedge.as_ref().unwrap();
        assert_eq!(w.kind, WedgeKind::Unresponsive);
        assert!(
            w.ruled_out[0].contains("decode-0 answered neither /metrics nor health"),
            "{:?}",
            w.ruled_out
        );
        assert!(
            a.reasons.iter().any(|r| r.contains("sent after decode-0 went silent")),
            "{:?}",
            a.reasons
        );

        // The probe succeeded: the unit is unresponsive, the pair suspect,
        // not wedged.
        let mut e = setup();
        e.probe_sent(at, p.probe_tokens);
        e.probe_done(ok_probe(at, timeout, 0), at + Duration::from_secs(1));
        observe(&mut e, "decode-0", silent(at + Duration::from_secs(1)));
        let a = judge(&e, &p, at + Duration::from_secs(1));
        assert_eq!(a.state, PairState::Suspect, "{:?}", a.reasons);

        // A probe that failed before the unit went silent is not evidence
        // of it.
        let mut e = pair();
        observe(&mut e, "prefill-0", sample(t0, 0.0, 0.0, 5.0, 5.0, None));
        observe(&mut e, "decode-0", sample(t0, 0.0, 0.0, 5.0, 5.0, None));
        e.probe_sent(t0, p.probe_tokens);
        e.probe_done(
            WatchProbe {
                target: "router-0".into(),
                sent_at: t0,
                timeout,
                work_ahead: 0,
                outcome: ProbeObservation::Error {
                    message: "http 503".into(),
                },
                request_id: "pdwarden-probe-2".into(),
            },
            t0,
        );
        for t in 1..=10 {
            let at = t0 + Duration::from_secs(t);
            observe(&mut e, "prefill-0", sample(at, 0.0, 0.0, 5.0, 5.0, None));
            observe(&mut e, "decode-0", silent(at));
        }
        let a = judge(&e, &p, at);
        assert_eq!(a.state, PairState::Suspect, "{:?}", a.reasons);
    }

    /// Found on the real stack (a burst queued on a decode running 2 at a
    /// time): the probe queued behind the burst and timed out; the prefill
    /// had computed the probe's prefill (tokens credited to the probe, so not
    /// "progress") and nothing else. An engine that computed its part of the
    /// probe is not silent: no wedge, while the decode works through its queue.
    #[test]
    fn an_engine_that_computed_its_part_of_the_probe_is_not_silent() {
        let p = policy();
        let t0 = Instant::now();
        let mut e = pair();
        observe(&mut e, "prefill-0", sample(t0, 0.0, 0.0, 500.0, 500.0, None));
        observe(&mut e, "decode-0", sample(t0, 2.0, 14.0, 500.0, 500.0, None));
        e.probe_sent(t0, p.probe_tokens);
        let timeout = p.probe_timeout + p.max_prefill_chunk;
        for t in 1..=320u64 {
            let now = t0 + Duration::from_secs(t);
            // The probe's 30 prompt tokens on the prefill at 1 s; the decode
            // generates 24 tokens a second for the burst.
            let prefill = if t >= 1 { 530.0 } else { 500.0 };
            observe(&mut e, "prefill-0", sample(now, 0.0, 0.0, prefill, 500.0, None));
            observe(
                &mut e,
                "decode-0",
                sample(now, 2.0, 14.0, 500.0 + 24.0 * t as f64, 500.0, None),
            );
        }
        let done = t0 + timeout;
        e.probe_done(
            WatchProbe {
                target: "router-0".into(),
                sent_at: t0,
                timeout,
                work_ahead: 16,
                outcome: ProbeObservation::Timeout { after_ms: ms(timeout) },
                request_id: "pdwarden-probe-3".into(),
            },
            done,
        );
        let a = judge(&e, &p, done);
        assert_ne!(a.state, PairState::Wedged, "{:?}", a.reasons);
    }

    /// A probe that timed out sooner than one legitimate silence of the
    /// engine (a prefill chunk its stale gauges may not show) is not a wedge.
    #[test]
    fn a_probe_shorter_than_a_legitimate_silence_proves_nothing() {
        let p = policy();
        let t0 = Instant::now();
        let mut e = pair();
        observe(&mut e, "prefill-0", sample(t0, 0.0, 0.0, 5.0, 5.0, None));
        observe(&mut e, "decode-0", sample(t0, 0.0, 0.0, 5.0, 5.0, None));
        let done = t0 + Duration::from_secs(20);
        observe(&mut e, "prefill-0", sample(done, 0.0, 0.0, 5.0, 5.0, None));
        observe(&mut e, "decode-0", sample(done, 0.0, 0.0, 5.0, 5.0, None));
        e.probe_done(
            WatchProbe {
                target: "router-0".into(),
                sent_at: t0,
                timeout: Duration::from_secs(20),
                work_ahead: 0,
                outcome: ProbeObservation::Timeout { after_ms: 20_000 },
                request_id: "pdwarden-probe-1".into(),
            },
            done,
        );
        assert_eq!(judge(&e, &p, done).state, PairState::Suspect);
    }

    /// Found on the real stack: with fast engines (a 20 ms prefill chunk) a
    /// probe got a 70 ms timeout and, timing out between two scrapes, "nothing
    /// moved since it was sent" — a healthy pair under a long generation was
    /// recovered. Counters are seen once per scrape: a probe's timeout and a
    /// silence both span at least three scrapes.
    #[test]
    fn a_silence_shorter_than_three_scrapes_proves_nothing() {
        let mut p = policy();
        p.max_prefill_chunk = Duration::from_millis(20);
        p.probe_timeout = Duration::from_millis(50);
        p.scrape_interval = Duration::from_millis(250);
        p.stale_after = Duration::from_secs(3);
        let t0 = Instant::now();
        let mut e = pair();
        observe(&mut e, "prefill-0", sample(t0, 0.0, 0.0, 5.0, 5.0, None));
        observe(&mut e, "decode-0", sample(t0, 1.0, 0.0, 5.0, 5.0, None));
        for t in 1..=300u64 {
            let now = t0 + Duration::from_millis(t * 10);
            observe(&mut e, "prefill-0", sample(now, 0.0, 0.0, 5.0, 5.0, None));
            observe(&mut e, "decode-0", sample(now, 1.0, 0.0, 5.0 + t as f64, 5.0, None));
        }
        let now = t0 + Duration::from_secs(3);
        match judge(&e, &p, now).probe {
            ProbeDecision::None => {}
            ProbeDecision::Send { timeout, .. } => assert!(timeout >= Duration::from_millis(800), "{timeout:?}"),
            other => panic!("{other:?}"),
        }
        let sent = now;
        let done = now + Duration::from_millis(70);
        observe(&mut e, "prefill-0", sample(done, 0.0, 0.0, 5.0, 5.0, None));
        observe(&mut e, "decode-0", sample(done, 1.0, 0.0, 305.0, 5.0, None));
        e.probe_done(
            WatchProbe {
                target: "router-0".into(),
                sent_at: sent,
                timeout: Duration::from_millis(70),
                work_ahead: 1,
                outcome: ProbeObservation::Timeout { after_ms: 70 },
                request_id: "pdwarden-probe-4".into(),
            },
            done,
        );
        assert_ne!(judge(&e, &p, done).state, PairState::Wedged);
    }

    fn pd_sample(at: Instant, realtime: f64, finished: f64, inflight: f64, kv_wait: f64) -> Sample {
        let mut s = sample(at, 0.0, 0.0, realtime, finished, None);
        let m = s.metrics.as_mut().unwrap();
        m.prefill_inflight = Some(inflight);
        m.decode_transfer = Some(kv_wait);
        s
    }

    /// Seed 004: the prefill keeps computing (its realtime tokens rise), its
    /// inflight queue and the decode's transfer queue grow, nothing finishes,
    /// health 200 on both. Confirmed once both queues have held requests for
    /// the budget plus the longest transfer (8 + 10 s) — long before the
    /// decode's own stall allowance (worst prefill + transfer) — while a slow
    /// transfer that completes is never a wedge.
    #[test]
    fn degraded_kv_bootstrap_is_confirmed_and_a_slow_transfer_is_not() {
        let p = policy();
        let t0 = Instant::now();
        let mut e = pair();
        let out = run_with(&mut e, &p, t0, 40, |t, now| {
            let n = t as f64;
            [
                pd_sample(now, 100.0 + 500.0 * n, 100.0, n.min(1.0) * (1.0 + n / 2.0), 0.0),
                pd_sample(now, 50.0, 50.0, 0.0, n.min(1.0) * (1.0 + n / 2.0)),
            ]
        });
        let first = first_wedged(&out).expect("confirmed");
        assert_eq!(first, 19, "from the first request in both queues at 1 s: 1 + 8 + 10");
        let w = out[first].wedge.as_ref().unwrap();
        assert_eq!(w.kind, WedgeKind::KvTransfer);
        assert!(
            out[first].reasons[0].contains("sending KV for 18.0 s"),
            "{:?}",
            out[first].reasons
        );
        // A slow link: each request's KV takes 6 s, requests every 10 s.
        let mut e = pair();
        let out = run_with(&mut e, &p, t0, 200, |t, now| {
            let in_transfer = t % 10 < 6;
            let done = (t / 10) as f64;
            [
                pd_sample(
                    now,
                    100.0 + 1_000.0 * done,
                    10.0 * done,
                    f64::from(u8::from(in_transfer)),
                    0.0,
                ),
                pd_sample(
                    now,
                    50.0 + 30.0 * done,
                    30.0 * done,
                    0.0,
                    f64::from(u8::from(in_transfer)),
                ),
            ]
        });
        assert!(first_wedged(&out).is_none());
    }

    /// An SGLang sample from before 0.5.7 (no `realtime_tokens_total`: its
    /// token counters rise only when a request finishes) with its PD queues.
    fn old_pd_sample(at: Instant, running: f64, queued: f64, finished: f64, inflight: f64, kv_wait: f64) -> Sample {
        let mut s = sample(at, running, queued, 0.0, finished, None);
        let m = s.metrics.as_mut().unwrap();
        m.realtime_tokens = None;
        m.prefill_inflight = Some(inflight);
        m.decode_transfer = Some(kv_wait);
        s
    }

    /// Issue 31's burst on an SGLang before 0.5.7: ten requests at once on a
    /// serial prefill that computes each in 4 s; each KV then takes 9 s to
    /// reach the decode (within the 10 s allowed), which generates 2,000
    /// tokens at 20 tok/s for each (nothing finishes before 113 s). Request k
    /// is prefilled over [4k, 4k + 4), sends KV over [4k + 4, 4k + 13) and
    /// lands at 4k + 13 (the prefill's inflight queue and the decode's KV-wait
    /// queue fall, the decode's running count rises). From `stall_at` on
    /// nothing lands any more (the link stalls; the prefill keeps computing).
    fn kv_burst(t: u64, now: Instant, stall_at: Option<u64>) -> [Sample; 2] {
        let n = 10u64;
        let prefilled = (0..n).filter(|k| 4 * k + 4 <= t).count() as f64;
        let landed = (0..n)
            .filter(|k| 4 * k + 13 <= t && stall_at.is_none_or(|s| 4 * k + 13 < s))
            .count() as f64;
        let computing = if t < 4 * n { 1.0 } else { 0.0 };
        let waiting = n as f64 - prefilled - computing;
        [
            // pd-sim's prefill answers (and counts) a request once its KV is ready.
            old_pd_sample(now, computing, waiting, 12_000.0 * prefilled, prefilled - landed, 0.0),
            old_pd_sample(now, landed, 0.0, 0.0, 0.0, n as f64 - landed),
        ]
    }

    /// Issue 31's false wedge: overlapping honest transfers keep both PD
    /// queues non-empty from 4 s to 49 s, far past the budget plus the
    /// longest transfer (18 s), with the decode finishing nothing — but a
    /// transfer lands every 4 s (each one lowers the KV-wait count and the
    /// inflight count and raises the decode's running count), so no transfer
    /// is stuck: never a wedge (the rule that only asked "were the queues
    /// never empty?" confirmed one at 22 s and killed all ten requests).
    #[test]
    fn overlapping_honest_kv_transfers_in_a_burst_are_not_a_wedge() {
        let p = policy();
        let t0 = Instant::now();
        let mut e = pair();
        let out = run_with(&mut e, &p, t0, 60, |t, now| kv_burst(t, now, None));
        for (t, a) in out.iter().enumerate() {
            assert_ne!(a.state, PairState::Wedged, "at {t} s: {:?}", a.reasons);
        }
        // The shape is the finding's: both queues non-empty from 4 s to 49 s.
        for t in 4..49 {
            let [pf, dc] = kv_burst(t, t0, None).map(|s| s.metrics.unwrap());
            assert!(
                pf.prefill_inflight.unwrap() > 0.0 && dc.decode_transfer.unwrap() > 0.0,
                "{t}"
            );
        }
    }

    /// Seed 004 on an SGLang before 0.5.7, its decode busy generating two
    /// earlier requests (2 running, nothing finishing): the prefill's inflight
    /// queue and the decode's KV-wait queue only grow and the decode's running
    /// count never rises — nothing lands — so it is confirmed at 1 + 8 + 10 =
    /// 19 s, as on a current engine. And issue 31's burst whose link stalls
    /// after its second landing (17 s) is confirmed the budget plus the
    /// longest transfer after that last landing: at 35 s, not before.
    #[test]
    fn stuck_kv_transfer_with_nothing_landing_is_confirmed_from_the_last_landing() {
        let p = policy();
        let t0 = Instant::now();
        let mut e = pair();
        let out = run_with(&mut e, &p, t0, 40, |t, now| {
            let held = if t == 0 { 0.0 } else { 1.0 + (t / 2) as f64 };
            [
                old_pd_sample(now, 1.0, 0.0, 12_000.0 * t as f64, held, 0.0),
                old_pd_sample(now, 2.0, 0.0, 0.0, 0.0, held),
            ]
        });
        let first = first_wedged(&out).expect("confirmed");
        assert_eq!(first, 19, "from the first request in both queues at 1 s: 1 + 8 + 10");
        let w = out[first].wedge.as_ref().unwrap();
        assert_eq!(
            (w.kind, w.onset, w.silent_ms),
            (WedgeKind::KvTransfer, t0 + Duration::from_secs(1), 18_000)
        );
        let r = out[first].reasons.join("\n");
        assert!(r.contains("sending KV for 18.0 s"), "{r}");
        assert!(r.contains("no KV transfer has landed for 18.0 s"), "{r}");
        assert!(
            w.ruled_out.iter().any(|x| x.contains("never fell")),
            "{:?}",
            w.ruled_out
        );

        let mut e = pair();
        let out = run_with(&mut e, &p, t0, 60, |t, now| kv_burst(t, now, Some(20)));
        let first = first_wedged(&out).expect("confirmed");
        assert_eq!(first, 35, "the last landing at 17 s + 8 + 10");
        let w = out[first].wedge.as_ref().unwrap();
        assert_eq!((w.kind, w.onset), (WedgeKind::KvTransfer, t0 + Duration::from_secs(17)));
    }
}
