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

use std::collections::VecDeque;
use std::time::Duration;

use pdwarden_engines::{EngineKind, Health, Moves, PrefillProgress, Signal};
use serde::Serialize;
use tokio::time::Instant;

pub use crate::judge::probe::ProbeObservation;

/// A finished probe's tokens show in an engine's counters by the next
/// scrape (SGLang counts them per prefill batch and decode step, and at
/// finish); its credit lapses after this many scrapes. Longer would let the
/// credit swallow real traffic's progress — and then the watch probes a pair
/// that traffic proves alive (found on the real stack: 12 % probe share).
const CREDIT_GRACE_SCRAPES: u32 = 2;

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

/// The numbers of one scrape that judgement uses (`None`: not exposed).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
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
    fn only_waiting_for_kv(&self) -> bool {
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
}

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
        }
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
    fn silent_since(&self) -> Option<Instant> {
        let since = self.work_since?;
        Some(self.last_progress.map_or(since, |p| p.max(since)))
    }

    /// Whether a counter rose beyond the probes' credit after `t`.
    fn progressed_after(&self, t: Instant) -> bool {
        self.last_progress.is_some_and(|p| p > t)
    }

    /// Whether any counter rose after `t`, the probes' own tokens included.
    fn moved_after(&self, t: Instant) -> bool {
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

/// Which kind of wedge the evidence shows (the detection-time metric's label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
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
    /// Set when `state` is `Wedged`: the kind, the onset, and what ruled out honest work.
    pub wedge: Option<WedgeEvidence>,
}

fn s(d: Duration) -> String {
    let ms = d.as_millis() as u64;
    crate::judge::verdict::secs(ms)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn health_phrase(status: u16) -> String {
    if status == 0 {
        "health does not answer".into()
    } else {
        format!("health answers {status}")
    }
}

fn num(v: Option<f64>) -> String {
    v.map_or("?".into(), |v| format!("{v}"))
}

fn assess_unit(u: &UnitTrack, p: &WatchPolicy, now: Instant, last_probe_ok: Option<Instant>) -> UnitAssessment {
    let mut a = UnitAssessment {
        unit: u.unit.clone(),
        role: u.role.clone(),
        state: UnitState::Unknown,
        reasons: Vec::new(),
        metrics: u.last.as_ref().and_then(|s| s.metrics),
        health_status: u.last.as_ref().map_or(0, |s| s.health_status),
        wedge: None,
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
    let engine = u.engine(p);
    let profile = engine.profile();
    let gpu_idle = m.gpu_util.is_some_and(|g| g < p.gpu_idle_below);
    let gpu = match m.gpu_util {
        Some(g) => format!("GPU utilisation {:.0} %", g * 100.0),
        None => "GPU utilisation unknown".into(),
    };
    let queues = format!(
        "{} running, {} queued{}",
        m.running,
        m.queued,
        match (m.prefill_inflight, m.decode_transfer) {
            (Some(i), _) if i > 0.0 => format!(", {i} sending KV"),
            (_, Some(t)) if t > 0.0 => format!(", {t} waiting for KV"),
            _ => String::new(),
        }
    );

    // Stall: work present, no progress beyond the probes' credit.
    let mut stall_state = None;
    if let Some(silent_since) = u.silent_since() {
        let stalled = now.saturating_duration_since(silent_since);
        let kv_only = m.only_waiting_for_kv();
        let (allowance, why_allowance, ruled_out) = if gpu_idle {
            (
                Duration::ZERO,
                format!("stall budget {} with the GPU idle", s(p.stall_budget)),
                format!("{gpu} < {:.0} %: nothing is computing", p.gpu_idle_below * 100.0),
            )
        } else if u.has_work_signal {
            let after_finish = u.last_finish_progress.is_some() && u.last_finish_progress == u.last_progress;
            let gap = p.work_gap(profile, after_finish);
            let mut allow = gap;
            let mut why = format!(
                "stall budget {} + {} that {} may legitimately stay flat ({})",
                s(p.stall_budget),
                s(gap),
                during_work_names(profile),
                match (profile.prefill_progress, after_finish) {
                    (PrefillProgress::PerChunk, false) => "one prefill chunk at the slowest speed",
                    (PrefillProgress::PerChunk, true) =>
                        "one prefill chunk at the slowest speed, or the gauges' idle refresh after a request finished",
                    (PrefillProgress::AtPrefillEnd, _) => "the worst prefill: it counts nothing until the prefill ends",
                }
            );
            if kv_only {
                allow = allow.max(p.max_prefill + p.max_kv_transfer);
                why = format!(
                    "stall budget {} + worst prefill {} + KV transfer {} (its only work is KV in transit, which may wait for the prefill's compute and the transfer)",
                    s(p.stall_budget),
                    s(p.max_prefill),
                    s(p.max_kv_transfer)
                );
            }
            (
                allow,
                why,
                format!(
                    "{} rises during work and has not risen beyond the probes' own tokens for {} > {} it can legitimately stay flat",
                    during_work_names(profile),
                    s(stalled),
                    s(allow)
                ),
            )
        } else {
            let mut allow = p.max_request();
            if kv_only {
                allow += p.max_kv_transfer;
            }
            (
                allow,
                format!(
                    "stall budget {} + the longest legitimate request {} (worst prefill {} + worst generation {}); this engine exposes no counter that rises during work",
                    s(p.stall_budget),
                    s(p.max_request()),
                    s(p.max_prefill),
                    s(p.max_generation)
                ),
                format!(
                    "no request finished for {}, longer than any legitimate prefill plus generation",
                    s(stalled)
                ),
            )
        };
        let line = format!(
            "{}: {queues}, generation_tokens_total {} prompt_tokens_total {} realtime_tokens_total {}, no progress for {} ({gpu}; {why_allowance}); {}",
            u.unit,
            num(m.generation_tokens),
            num(m.prompt_tokens),
            num(m.realtime_tokens),
            s(stalled),
            health_phrase(last.health_status)
        );
        if stalled >= p.stall_budget + allowance {
            let partial = last_probe_ok.is_some_and(|t| t > silent_since);
            a.state = UnitState::Wedged;
            let mut ruled = vec![ruled_out];
            if kv_only {
                ruled.push(format!(
                    "its only work is KV in transit ({queues}) for longer than the worst prefill {} plus the longest transfer {}",
                    s(p.max_prefill),
                    s(p.max_kv_transfer)
                ));
            }
            if partial {
                ruled.push(format!(
                    "the watch's own short probe was answered during the stall: the engine serves a probe but not its {queues}"
                ));
            }
            a.wedge = Some(WedgeEvidence {
                kind: if kv_only {
                    WedgeKind::KvTransfer
                } else if partial {
                    WedgeKind::PartialStall
                } else {
                    WedgeKind::Stall
                },
                onset: silent_since,
                silent_ms: ms(stalled),
                ruled_out: ruled,
            });
            a.reasons.push(format!(
                "{line}: {}",
                if partial {
                    "wedged (partial: probes pass, real requests stall)"
                } else {
                    "wedged"
                }
            ));
            return a;
        }
        if stalled >= p.stall_budget {
            stall_state = Some(UnitState::Stalled);
            a.reasons
                .push(format!("{line}: past the stall budget, within the allowance"));
        } else {
            stall_state = Some(UnitState::Serving);
        }
    }

    // Health gone bad with /metrics answering, and nothing progressing since.
    if let Some(bad) = u.health_bad_since {
        let bad_for = now.saturating_duration_since(bad);
        let busy = m.in_flight() > 0.0 && !gpu_idle;
        let scheduler = profile.health_waits_for_scheduler();
        let allowance = match scheduler {
            Some(_) if busy => p.max_prefill,
            _ => Duration::ZERO,
        };
        let last_status = if last.health_status == 0 {
            "no answer".to_string()
        } else {
            last.health_status.to_string()
        };
        let progressed = u.progressed_after(bad);
        if bad_for >= p.stall_budget + allowance && !progressed {
            a.state = UnitState::Wedged;
            let meaning = match profile.health {
                Health::ThroughScheduler { timeout_ms, .. } => format!(
                    "{} health runs a generation through the scheduler and fails after {} without scheduler output",
                    engine.as_str(),
                    s(Duration::from_millis(timeout_ms))
                ),
                Health::EngineAlive => format!("{} health fails only once the engine core has died", engine.as_str()),
                Health::RouterProcess => "a router's health".into(),
            };
            let mut ruled = vec![
                meaning,
                format!("no counter rose in the {} since health failed", s(bad_for)),
            ];
            if allowance > Duration::ZERO {
                ruled.push(format!(
                    "with {queues} a prefill may keep health failing for at most the worst prefill {}; that has passed",
                    s(p.max_prefill)
                ));
            }
            // Probes answered while health failed: the engine serves a short
            // probe but not its real requests.
            let window = u.silent_since().map_or(bad, |t| t.min(bad));
            let partial = last_probe_ok.is_some_and(|t| t > window);
            if partial {
                ruled.push(format!(
                    "the watch's own short probe was answered meanwhile: the engine serves a probe but not its {queues}"
                ));
            }
            a.wedge = Some(WedgeEvidence {
                kind: if partial {
                    WedgeKind::PartialStall
                } else {
                    WedgeKind::HealthGoneBad
                },
                onset: bad,
                silent_ms: ms(bad_for),
                ruled_out: ruled,
            });
            a.reasons.push(format!(
                "{}: health answered 200 earlier but has not for {} (last: {}) while /metrics answers ({queues}) and nothing progressed since (allowed: stall budget {}{})",
                u.unit,
                s(bad_for),
                last_status,
                s(p.stall_budget),
                if allowance > Duration::ZERO {
                    format!(" + worst prefill {} while work is present", s(p.max_prefill))
                } else {
                    String::new()
                }
            ));
            return a;
        }
        if bad_for >= p.stall_budget {
            a.state = UnitState::Stalled;
            a.reasons.push(if progressed {
                format!(
                    "{}: health has not answered 200 for {} (last: {last_status}) but counters rose since: the engine works",
                    u.unit,
                    s(bad_for)
                )
            } else {
                format!(
                    "{}: health has not answered 200 for {} (last: {last_status}) with {queues}: an engine busy with a prefill answers health late; within the worst prefill {}",
                    u.unit,
                    s(bad_for),
                    s(p.max_prefill)
                )
            });
            return a;
        }
    }
    if let Some(st) = stall_state {
        a.state = st;
        return a;
    }
    let recent = u
        .last_progress
        .is_some_and(|t| now.saturating_duration_since(t) < p.idle_probe_interval);
    a.state = if recent { UnitState::Serving } else { UnitState::Idle };
    a
}

fn during_work_names(profile: &pdwarden_engines::Profile) -> String {
    profile
        .metrics
        .iter()
        .filter(|m| m.moves == Moves::DuringWork)
        .map(|m| m.name)
        .collect::<Vec<_>>()
        .join(" + ")
}

/// Seed 004: a prefill's KV never reaches its decode. Both PD queues hold
/// requests without a break, no transfer has been seen to land at either end
/// for the budget plus the longest transfer, and the decode progressed with
/// nothing since its wait began. A transfer in the inflight queue when the
/// window opened would have landed within the longest transfer; overlapping
/// honest transfers keep both queues non-empty but land one after another
/// (issue 31).
fn kv_transfer_stuck(e: &PairEvidence, p: &WatchPolicy, now: Instant) -> Option<(String, WedgeEvidence)> {
    let fresh: Vec<&UnitTrack> = e
        .units
        .iter()
        .filter(|u| {
            // A unit whose scrape fails (a frozen process) shows queues from
            // before: stale gauges are no evidence of a transfer (its silence
            // is the unresponsive rule's).
            u.last
                .as_ref()
                .is_some_and(|s| s.metrics.is_some() && now.saturating_duration_since(s.at) <= p.stale_after)
        })
        .collect();
    let limit = p.stall_budget + p.max_kv_transfer;
    let latest = |since: Instant, landing: Option<Instant>| landing.map_or(since, |l| l.max(since));
    // (prefill, its inflight since, decode, its KV wait since, onset): the
    // window opens at the later queue's start or the last landing.
    let (prefill, sending, decode, waiting, onset) = fresh
        .iter()
        .filter_map(|pf| pf.inflight_since.map(|t| (*pf, t)))
        .flat_map(|(pf, sending)| {
            fresh.iter().filter(move |dc| dc.unit != pf.unit).filter_map(move |dc| {
                let waiting = dc.kv_wait_since?;
                let onset = latest(latest(sending, pf.last_kv_landing), dc.last_kv_landing).max(waiting);
                (!dc.progressed_after(waiting)).then_some((pf, sending, *dc, waiting, onset))
            })
        })
        .filter(|c| now.saturating_duration_since(c.4) >= limit)
        .min_by_key(|c| c.4)?;
    let silent = now.saturating_duration_since(onset);
    let pm = prefill.last.as_ref().and_then(|s| s.metrics).unwrap_or_default();
    let dm = decode.last.as_ref().and_then(|s| s.metrics).unwrap_or_default();
    let reason = format!(
        "{} has held {} prefilled request(s) sending KV for {} and {} {} waiting for KV for {}, no KV transfer has landed for {} and {} has progressed with nothing since: a KV transfer takes at most {} (allowed: stall budget {} + {}); {}, {}",
        prefill.unit,
        num(pm.prefill_inflight),
        s(now.saturating_duration_since(sending)),
        decode.unit,
        num(dm.decode_transfer),
        s(now.saturating_duration_since(waiting)),
        s(silent),
        decode.unit,
        s(p.max_kv_transfer),
        s(p.stall_budget),
        s(p.max_kv_transfer),
        health_phrase(prefill.last.as_ref().map_or(0, |s| s.health_status)),
        health_phrase(decode.last.as_ref().map_or(0, |s| s.health_status)),
    );
    let evidence = WedgeEvidence {
        kind: WedgeKind::KvTransfer,
        onset,
        silent_ms: ms(silent),
        ruled_out: vec![
            "the prefill finished computing those requests (they are in its inflight queue): no prefill is still running for them"
                .to_string(),
            format!(
                "a legitimate transfer ends within {}; for {} both queues stayed non-empty and none landed: {}'s inflight count never fell, {}'s KV-wait count never fell and its running plus queued count never rose",
                s(p.max_kv_transfer),
                s(silent),
                prefill.unit,
                decode.unit
            ),
            format!("{} finished or generated nothing in that time", decode.unit),
        ],
    };
    Some((reason, evidence))
}

/// Judges a pair at `now`.
pub fn judge(e: &PairEvidence, p: &WatchPolicy, now: Instant) -> Assessment {
    let units: Vec<UnitAssessment> = e
        .units
        .iter()
        .map(|u| assess_unit(u, p, now, e.last_probe_ok))
        .collect();
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
    let proof_at = [traffic_proof, e.last_proof.as_ref().map(|p| p.0)]
        .into_iter()
        .flatten()
        .max();
    let proof_fresh = |within: Duration| proof_at.is_some_and(|t| now.saturating_duration_since(t) < within);

    // A probe still in flight is re-judged as samples arrive (issue 31: one
    // sent before the gauges were known carried the worst case, 426 s, and
    // blinded the watch): once it has waited longer than what the budget
    // and the work now known ahead of it allow, it counts as timed out, and
    // the rules below may confirm a wedge on it while its answer is awaited.
    let overdue = e.in_flight.as_ref().and_then(|f| {
        let (ahead, allowance) = probe_allowance(e, p, &units);
        let due = e.probe_budget(p) + allowance;
        let waited = now.saturating_duration_since(f.sent_at);
        (due < f.timeout && waited >= due).then(|| WatchProbe {
            target: f.target.clone(),
            sent_at: f.sent_at,
            timeout: due,
            work_ahead: ahead,
            outcome: ProbeObservation::Timeout { after_ms: ms(waited) },
            request_id: OVERDUE.into(),
        })
    });
    let probe_evidence = overdue.or_else(|| e.last_probe.clone());
    // A failed probe stands unless every engine progressed after it was sent.
    let failed_probe = probe_evidence.as_ref().filter(|r| {
        !matches!(r.outcome, ProbeObservation::Ok { .. }) && !e.units.iter().all(|u| u.progressed_after(r.sent_at))
    });
    let served_others = e.last_probe.as_ref().filter(|r| {
        !matches!(r.outcome, ProbeObservation::Ok { .. })
            && !e.units.is_empty()
            && e.units.iter().all(|u| u.progressed_after(r.sent_at))
            && e.last_probe_done
                .is_some_and(|d| now.saturating_duration_since(d) < p.idle_probe_interval)
    });
    // An engine that computed nothing at all since a probe was sent, for
    // longer than a legitimate prefill chunk (or request) that its stale
    // gauges may not show yet.
    // An engine whose only work is KV in transit is waiting, not silent,
    // for the stall rule's KV allowance (budget + worst prefill + transfer):
    // a transfer that never lands is the KV rule's to name.
    let silent_since_sent = |u: &UnitTrack, r: &WatchProbe| {
        let mut allow = p.silence_allowance(u.engine(p).profile(), u.work_signal(p));
        if u.last
            .as_ref()
            .and_then(|s| s.metrics)
            .is_some_and(|m| m.only_waiting_for_kv())
        {
            allow = allow.max(p.stall_budget + p.max_prefill + p.max_kv_transfer);
        }
        !u.moved_after(r.sent_at) && now.saturating_duration_since(r.sent_at) >= allow
    };
    let health_line = || {
        units
            .iter()
            .map(|u| format!("{} health {}", u.unit, u.health_status))
            .collect::<Vec<_>>()
            .join(", ")
    };

    // The agents' layer first. A unit not running on purpose (never
    // started, or stopped on command) is reported, never started by the
    // watch: starting what the operator has not is the operator's call
    // (`restart pd-pair`), and a freshly started orchestrator used to
    // "recover" units nobody had started.
    let stopped: Vec<&AgentFact> = e.lives.iter().filter(|f| f.life == Life::Stopped).collect();
    if !stopped.is_empty() {
        return Assessment {
            state: PairState::Down,
            reasons: stopped
                .iter()
                .map(|f| {
                    format!(
                        "{} {} is not running: never started, or stopped on purpose (its agent's report); the watch does not start what the operator has not — `restart pd-pair` starts the pair in order",
                        f.role, f.unit
                    )
                })
                .collect(),
            units,
            probe: ProbeDecision::None,
            wedge: None,
        };
    }
    let exited: Vec<(&AgentFact, &str)> = e
        .lives
        .iter()
        .filter_map(|f| match &f.life {
            Life::Exited { detail } => Some((f, detail.as_str())),
            _ => None,
        })
        .collect();
    // Probes failing with errors, twice in a row at least the minimum gap
    // apart, with not every engine progressing since the first.
    let failing = e
        .first_failure_sent
        .filter(|first| {
            e.failed_in_row >= 2
                && e.last_probe
                    .as_ref()
                    .is_some_and(|r| r.sent_at.saturating_duration_since(*first) >= p.min_probe_interval)
                && !e.units.iter().all(|u| u.progressed_after(*first))
        })
        .zip(e.last_probe.as_ref());

    let mut wedge = None;
    let (state, reasons) = if !exited.is_empty() {
        let onset = e.last_proof.as_ref().map_or(now, |p| p.0);
        wedge = Some(WedgeEvidence {
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
        });
        (
            PairState::Wedged,
            exited
                .iter()
                .map(|(f, d)| {
                    format!(
                        "{} {} is not running: exited ({d}; its agent's report); the pair cannot serve",
                        f.role, f.unit
                    )
                })
                .collect(),
        )
    } else if let Some((first, last)) = failing {
        let what = match &last.outcome {
            ProbeObservation::Error { message } => message.clone(),
            other => other.kind().to_string(),
        };
        wedge = Some(WedgeEvidence {
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
        });
        (
            PairState::Wedged,
            vec![format!(
                "{} probes through {} in a row failed over {} (the last: {what}), and not every engine has progressed since: the pair answers only errors",
                e.failed_in_row,
                last.target,
                s(last.sent_at.saturating_duration_since(first))
            )],
        )
    } else if let Some(w) = units
        .iter()
        .filter(|u| u.state == UnitState::Wedged)
        // A prefill holding KV for a partner that answers nothing is a
        // consequence: the unresponsive rule names the cause.
        .filter(|u| !(any(UnitState::Down) && u.wedge.as_ref().is_some_and(|w| w.kind == WedgeKind::KvTransfer)))
        .filter_map(|u| u.wedge.clone())
        .min_by_key(|w| w.onset)
    {
        wedge = Some(w);
        (PairState::Wedged, unit_reasons(&[UnitState::Wedged]))
    } else if let Some((reason, evidence)) = kv_transfer_stuck(e, p, now) {
        wedge = Some(evidence);
        (PairState::Wedged, vec![reason])
    } else if let Some(
        r @ WatchProbe {
            outcome: ProbeObservation::Timeout { after_ms },
            ..
        },
    ) = failed_probe
        && units.iter().all(|u| (200..300).contains(&u.health_status))
        && e.units.iter().any(|u| silent_since_sent(u, r))
    {
        let silent: Vec<&str> = e
            .units
            .iter()
            .filter(|u| silent_since_sent(u, r))
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
        wedge = Some(WedgeEvidence {
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
        });
        (
            PairState::Wedged,
            vec![format!(
                "{} through {} timed out after {} ({covered}); {} produced nothing since it was sent, while {}",
                probe_name(r),
                r.target,
                s(Duration::from_millis(*after_ms)),
                silent.join(", "),
                health_line()
            )],
        )
    } else if let Some(r) = failed_probe
        && let Some((track, assessed)) = e
            .units
            .iter()
            .zip(&units)
            .filter(|(t, a)| {
                // Sent after it went silent; or still unanswered, past its
                // allowance counted from when the silence began.
                a.state == UnitState::Down
                    && t.scrape_bad_since.is_some_and(|b| {
                        b <= r.sent_at || (r.request_id == OVERDUE && now.saturating_duration_since(b) >= r.timeout)
                    })
            })
            .min_by_key(|(t, _)| t.scrape_bad_since)
    {
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
        wedge = Some(WedgeEvidence {
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
        });
        let mut reasons = assessed.reasons.clone();
        reasons.push(format!(
            "{} through {} sent after {} went silent {what}",
            probe_name(r),
            r.target,
            track.unit
        ));
        (PairState::Wedged, reasons)
    } else if any(UnitState::Down) {
        (PairState::Down, unit_reasons(&[UnitState::Down]))
    } else if let Some(r) = failed_probe {
        let what = match &r.outcome {
            ProbeObservation::Timeout { after_ms } => {
                format!("timed out after {}", s(Duration::from_millis(*after_ms)))
            }
            ProbeObservation::Error { message } => format!("failed ({message})"),
            ProbeObservation::Ok { .. } => unreachable!("filtered"),
        };
        (
            PairState::Suspect,
            vec![format!(
                "{} through {} {what}; not every engine has progressed since",
                probe_name(r),
                r.target
            )],
        )
    } else if let Some(r) = served_others {
        (
            PairState::Suspect,
            vec![format!(
                "{} through {} failed, yet every engine progressed since: the pair serves other requests (a partial wedge is judged by the stall rule)",
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

    let probe = decide_probe(e, p, now, state, &units, proof_fresh(e.idle_interval(p)));
    Assessment {
        state,
        reasons,
        units,
        probe,
        wedge,
    }
}

/// The requests ahead of a probe on one engine, and the time they may
/// legitimately take: on a serial engine each runs its whole prefill and
/// generation first; on a batching one the queued ones are prefilled first,
/// at most one running prefill holds the batch, and queued requests wait
/// for running ones to finish.
fn work_ahead(m: &Metrics, p: &WatchPolicy) -> (u32, Duration) {
    let count = |v: f64| v.max(0.0).ceil() as u32;
    let running = count(m.running);
    let queued = count(m.queued + m.prefill_prealloc.unwrap_or(0.0) + m.decode_prealloc.unwrap_or(0.0));
    if p.serial {
        let n = running + queued;
        (n, p.max_request() * n)
    } else {
        // Requests queue on a batching engine only while its batch is full
        // (`--max-running-requests`, or KV memory): the probe then waits for
        // ceil((queued + 1) / running) waves of generations to end as well.
        let prefills = queued + u32::from(running > 0);
        let waves = if queued > 0 {
            (queued + 1).div_ceil(running.max(1))
        } else {
            0
        };
        (running + queued, p.max_prefill * prefills + p.max_generation * waves)
    }
}

/// What a probe sent now may wait for beyond its own budget: the work
/// ahead of it on the busiest engine (it must not be abandoned mid-prefill),
/// and at least one legitimate silence of the slowest engine — a prefill
/// chunk in progress that its stale gauges do not show yet — so that a probe
/// that times out is evidence, not bad luck. With the requests ahead.
fn probe_allowance(e: &PairEvidence, p: &WatchPolicy, units: &[UnitAssessment]) -> (u32, Duration) {
    let (work_ahead, ahead) = units
        .iter()
        .filter_map(|u| u.metrics.map(|m| work_ahead(&m, p)))
        .max_by_key(|(_, d)| *d)
        .unwrap_or((0, Duration::ZERO));
    let floor = e
        .units
        .iter()
        .map(|u| p.silence_allowance(u.engine(p).profile(), u.work_signal(p)))
        .max()
        .unwrap_or(Duration::ZERO);
    (work_ahead, ahead.max(floor))
}

/// How a probe still in flight past what its work ahead allows is named.
const OVERDUE: &str = "(still unanswered, past what the work now known ahead of it allows)";

fn decide_probe(
    e: &PairEvidence,
    p: &WatchPolicy,
    now: Instant,
    state: PairState,
    units: &[UnitAssessment],
    proof_fresh: bool,
) -> ProbeDecision {
    if e.probe_in_flight || state == PairState::Wedged {
        return ProbeDecision::None;
    }
    let since_last = e.last_probe_sent.map(|t| now.saturating_duration_since(t));
    let why = match state {
        // A unit answers nothing: does the pair still generate? Asked at
        // the minimum gap, and not again soon after a failed probe (its
        // failure is the evidence the wedge is judged on).
        PairState::Down => {
            let since_done = e.last_probe_done.map(|t| now.saturating_duration_since(t));
            let failed_last = e
                .last_probe
                .as_ref()
                .is_some_and(|r| !matches!(r.outcome, ProbeObservation::Ok { .. }));
            if since_last.is_some_and(|d| d < p.min_probe_interval)
                || (failed_last && since_done.is_some_and(|d| d < e.idle_interval(p)))
            {
                return ProbeDecision::None;
            }
            "a unit answers neither /metrics nor health"
        }
        // Evidence missing or suspicious: probe, at the minimum gap, but
        // never again soon after a failed probe (that unit just failed).
        PairState::Suspect
            if e.last_probe
                .as_ref()
                .is_some_and(|r| !matches!(r.outcome, ProbeObservation::Ok { .. })) =>
        {
            let since_done = e.last_probe_done.map(|t| now.saturating_duration_since(t));
            if since_done.is_some_and(|d| d < e.idle_interval(p).max(p.min_probe_interval)) {
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
            if since_last.is_some_and(|d| d < e.idle_interval(p)) || watched_for < p.min_probe_interval {
                return ProbeDecision::None;
            }
            "nothing has proved liveness recently"
        }
        _ => return ProbeDecision::None,
    };
    let (work_ahead, allowance) = probe_allowance(e, p, units);
    let timeout = e.probe_budget(p) + allowance;
    let each = if p.serial {
        format!(
            "up to {} each (worst prefill + worst generation: the engines are serial)",
            s(p.max_request())
        )
    } else {
        format!(
            "up to {} of prefill each, and the generations queued requests wait for",
            s(p.max_prefill)
        )
    };
    if timeout > p.max_probe_timeout {
        return ProbeDecision::Defer {
            why: format!(
                "{why}, but {work_ahead} request(s) are ahead of a probe: covering them at {each} needs {} (> max {}); waiting instead of risking an abandoned prefill",
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
fn probe_name(r: &WatchProbe) -> String {
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
    /// to 50,000 tokens at 250 tok/s → a worst prefill of 200 s (chunking
    /// unknown, so a chunk is the whole prefill); outputs up to 1,000 tokens
    /// at 10 tok/s → a worst generation of 100 s.
    fn policy() -> WatchPolicy {
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
    fn sample(at: Instant, running: f64, queued: f64, realtime: f64, finished: f64, gpu: Option<f64>) -> Sample {
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

    fn pair() -> PairEvidence {
        PairEvidence::new(
            vec![
                UnitTrack::new("prefill-0", "prefill"),
                UnitTrack::new("decode-0", "decode"),
            ],
            Duration::from_secs(1),
        )
    }

    fn observe(e: &mut PairEvidence, unit: &str, s: Sample) {
        e.observe(unit, s, EngineKind::Sglang);
    }

    /// Feeds one sample per second to both units from `from` for `secs` s;
    /// `f(t)` gives (prefill, decode) samples. Returns every assessment, one
    /// per second.
    fn run_with(
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

    fn first_wedged(out: &[Assessment]) -> Option<usize> {
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

    /// Row 4 and issue 13: a probe's timeout covers the work ahead of it. On
    /// a serial engine each request ahead runs its whole prefill and
    /// generation first (200 s + 100 s); if that needs more than
    /// max_probe_timeout the probe waits.
    #[test]
    fn probe_timeout_covers_the_work_ahead_or_the_probe_waits() {
        let p = policy();
        let t0 = Instant::now();
        let mut e = pair();
        // 1 running + 1 queued, stalled past the budget: suspicious.
        for t in 0..=10u64 {
            let now = t0 + Duration::from_secs(t);
            observe(&mut e, "prefill-0", sample(now, 1.0, 1.0, 50.0, 41_918.0, None));
            observe(&mut e, "decode-0", sample(now, 0.0, 0.0, 400.0, 18.0, None));
        }
        let a = judge(&e, &p, t0 + Duration::from_secs(10));
        assert_eq!(a.state, PairState::Suspect);
        assert_eq!(
            a.probe,
            ProbeDecision::Send {
                timeout: Duration::from_secs(120 + 2 * 300),
                work_ahead: 2,
                why: "passive evidence is missing or suspicious".into()
            }
        );
        // Three requests ahead would need 1,020 s > 1,200 s? No: 120 + 900 = 1,020 s fits;
        // four need 1,320 s > 1,200 s: deferred.
        let now = t0 + Duration::from_secs(11);
        observe(&mut e, "prefill-0", sample(now, 1.0, 3.0, 50.0, 41_918.0, None));
        observe(&mut e, "decode-0", sample(now, 0.0, 0.0, 400.0, 18.0, None));
        match judge(&e, &p, now).probe {
            ProbeDecision::Defer { why } => assert!(why.contains("4 request(s)") && why.contains("1320.0 s"), "{why}"),
            other => panic!("{other:?}"),
        }
        // A batching engine: queued prefills plus one running prefill, and
        // with requests queued (the batch is full: 1 running) the 4 waves
        // of generations they wait for.
        let mut b = policy();
        b.serial = false;
        b.max_probe_timeout = Duration::from_secs(2_000);
        let a = judge(&e, &b, now);
        match a.probe {
            ProbeDecision::Send {
                timeout, work_ahead, ..
            } => {
                assert_eq!((timeout, work_ahead), (Duration::from_secs(120 + 4 * 200 + 4 * 100), 4))
            }
            other => panic!("{other:?}"),
        }
        // Nothing queued on a batching engine: one running prefill only.
        observe(&mut e, "prefill-0", sample(now, 5.0, 0.0, 50.0, 41_918.0, None));
        match judge(&e, &b, now).probe {
            ProbeDecision::Send { timeout, .. } => assert_eq!(timeout, Duration::from_secs(120 + 200)),
            other => panic!("{other:?}"),
        }
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
        let t0 = Instant::now();
        let mut e = pair();
        e.reset(Some((t0, "operation op-1 concluded healthy".into())));
        let mut pending: Option<(Instant, Duration, u32)> = None;
        for t in 1..=secs {
            let now = t0 + Duration::from_secs(t);
            e.observe("prefill-0", vllm_idle(now, 40.0), EngineKind::Vllm);
            e.observe("decode-0", decode(now), EngineKind::Vllm);
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
    /// ever and never recovered. Down, it is probed; a probe sent after it
    /// went silent that fails makes it a wedge (`unresponsive`), recovered
    /// through the breaker. A probe that succeeds, or one that failed before
    /// the unit went silent, is no such evidence: down, not recovered.
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
        assert_eq!(a.state, PairState::Down, "{:?}", a.reasons);
        let ProbeDecision::Send { timeout, .. } = a.probe else {
            panic!("a down pair is probed: {:?}", a.probe)
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

        // The probe succeeded: the unit is down, the pair is not wedged.
        let mut e = setup();
        e.probe_sent(at, p.probe_tokens);
        e.probe_done(ok_probe(at, timeout, 0), at + Duration::from_secs(1));
        observe(&mut e, "decode-0", silent(at + Duration::from_secs(1)));
        let a = judge(&e, &p, at + Duration::from_secs(1));
        assert_eq!(a.state, PairState::Down, "{:?}", a.reasons);

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
        assert_eq!(a.state, PairState::Down, "{:?}", a.reasons);
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

    /// An engine whose health turns bad for the budget while /metrics answers
    /// and nothing progresses is wedged; one that never answered health yet
    /// (still loading) is not; one whose counters rise while health fails
    /// (SGLang under a long chunked prefill) works.
    #[test]
    fn health_gone_bad_is_wedged_but_loading_and_working_are_not() {
        let p = policy();
        let t0 = Instant::now();
        let mut loading = UnitTrack::new("decode-0", "decode");
        let mut gone = UnitTrack::new("decode-0", "decode");
        let mut working = UnitTrack::new("decode-0", "decode");
        for t in 0..=20u64 {
            let now = t0 + Duration::from_secs(t);
            let mut s = sample(now, 0.0, 0.0, 5.0, 5.0, None);
            s.health_status = 503;
            loading.observe(s.clone(), EngineKind::Sglang);
            let mut w = sample(now, 0.0, 0.0, 5.0 + 100.0 * t as f64, 5.0, None);
            if t == 0 {
                s.health_status = 200;
            } else {
                w.health_status = 503;
            }
            gone.observe(s, EngineKind::Sglang);
            working.observe(w, EngineKind::Sglang);
        }
        let now = t0 + Duration::from_secs(20);
        assert_ne!(assess_unit(&loading, &p, now, None).state, UnitState::Wedged);
        assert_ne!(assess_unit(&working, &p, now, None).state, UnitState::Wedged);
        let a = assess_unit(&gone, &p, now, None);
        assert_eq!(a.state, UnitState::Wedged);
        assert!(
            a.reasons[0].contains("has not for 19.0 s (last: 503)"),
            "{:?}",
            a.reasons
        );
        assert_eq!(a.wedge.unwrap().kind, WedgeKind::HealthGoneBad);
    }

    /// Issue 13's first finding: a serial prefill busy with a 40 s prefill (1
    /// running, counters flat) whose SGLang health answers 503 after 20 s is
    /// not wedged while the worst legitimate prefill has not passed; a health
    /// that stays bad past it with nothing progressing is.
    #[test]
    fn health_503_during_a_long_prefill_is_not_a_wedge() {
        let mut p = policy();
        // Allow longer than the health rule: this test is about health alone.
        p.max_prefill_chunk = Duration::from_secs(900);
        let t0 = Instant::now();
        let mut busy = UnitTrack::new("prefill-0", "prefill");
        for t in 0..=40u64 {
            let mut s = sample(t0 + Duration::from_secs(t), 1.0, 0.0, 5.0, 5.0, None);
            if t >= 20 {
                s.health_status = 503;
            }
            busy.observe(s, EngineKind::Sglang);
        }
        let a = assess_unit(&busy, &p, t0 + Duration::from_secs(40), None);
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
            busy.observe(s, EngineKind::Sglang);
        }
        let a = assess_unit(&busy, &p, t0 + Duration::from_secs(230), None);
        assert_eq!(a.state, UnitState::Wedged);
        assert!(
            a.reasons
                .iter()
                .any(|r| r.contains("health answered 200 earlier but has not for 210.0 s")),
            "{:?}",
            a.reasons
        );
    }

    /// vLLM's profile: the prompt counter rises only when a prefill ends and
    /// health never waits for the scheduler. A 150 s prefill with nothing
    /// moving is allowed the whole worst prefill even with a chunk size
    /// configured (vLLM counts nothing per chunk); health 503 is the engine
    /// core dead, a wedge after the budget alone.
    #[test]
    fn vllm_long_prefill_is_allowed_and_dead_health_is_not() {
        let mut p = policy();
        p.engine = EngineKind::Vllm;
        p.max_prefill_chunk = Duration::from_secs(10);
        let t0 = Instant::now();
        let vllm = |at: Instant, running: f64, generated: f64, prompt: f64| Sample {
            at,
            health_status: 200,
            metrics: Some(Metrics {
                running,
                generation_tokens: Some(generated),
                prompt_tokens: Some(prompt),
                engine: Some(EngineKind::Vllm),
                ..Metrics::default()
            }),
            error: String::new(),
        };
        let mut e = pair();
        let out = run_with(&mut e, &p, t0, 200, |t, now| {
            let done = t >= 150;
            [
                vllm(
                    now,
                    if done { 0.0 } else { 1.0 },
                    5.0,
                    if done { 45_000.0 } else { 5.0 },
                ),
                vllm(
                    now,
                    if done { 1.0 } else { 0.0 },
                    5.0 + t.saturating_sub(150) as f64,
                    5.0,
                ),
            ]
        });
        assert!(
            first_wedged(&out).is_none(),
            "{:?}",
            out.iter().find(|a| a.state == PairState::Wedged)
        );
        let mut dead = UnitTrack::new("decode-0", "decode");
        for t in 0..=10u64 {
            let mut s = vllm(t0 + Duration::from_secs(t), 1.0, 5.0, 5.0);
            if t > 0 {
                s.health_status = 503;
            }
            dead.observe(s, EngineKind::Vllm);
        }
        let a = assess_unit(&dead, &p, t0 + Duration::from_secs(10), None);
        assert_eq!(a.state, UnitState::Wedged, "{:?}", a.reasons);
        assert!(a.wedge.unwrap().ruled_out[0].contains("vllm health fails only once the engine core has died"));
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
