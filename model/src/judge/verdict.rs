//! Turns the evidence of a co-restart into a verdict.
//!
//! This is the judgement half of DESIGN.md 3: it never does I/O and never
//! reads a clock, so every incident in `INCIDENTS.md` is a unit test with the
//! incident's own numbers. It is handed every attempt (DESIGN.md 10): the
//! router's readiness generations that timed out or failed before the first
//! answer are probes of the series, and an engine's generation checks that
//! timed out or failed before it generated are part of its start-up.
//!
//! # Readiness
//! Readiness means generation. A unit that answered health 200 but whose
//! generation check never passed is `wedged`, not healthy (INCIDENTS row 3).
//!
//! # The physical model of a warm-up (INCIDENTS row 2)
//! A freshly started engine pays its cold cost — loading kernels, capturing
//! graphs, filling caches — on the *first* request it serves. Nothing about
//! that cost comes back on the second request. So, written once:
//!
//! 1. At most the first answer may be slow, and only up to the cold allowance.
//! 2. Every answer after it is within the warm budget at once: a second slow
//!    answer, one as slow as the first, a rise, or a slow answer after a warm
//!    one (a relapse) rejects the cold-start explanation.
//! 3. The series ends with at least `warm_probes` consecutive warm answers —
//!    never fewer, even when `max_probes` ran out.
//! 4. A timeout or an error anywhere — engine checks, router readiness, probes,
//!    the suite — is never cold start.
//! 5. When nothing claims a warm-up — no answer within the warm budget and no
//!    answer at least [`WARM_UP_FALL`] faster than the first — there is no
//!    cold-start story to reject: the pair is simply `over_budget`.
//!
//! The verdicts these rules lead to: `healthy` (first answer warm, every answer
//! warm), `healthy_after_cold_start` (rules 1–3 hold for a slow first answer),
//! `cold_start_rejected` (a slow or failed start whose story breaks a rule),
//! `over_budget` (answers, but slower than budget without a warm-up story, or
//! a relapse after a warm first answer), `wedged` (no answer, or a stall after
//! answering), `failed` (an error answer, a unit that did not start).
//! Every rejection names the numbers that broke its rule.
//!
//! # The cold allowance learned from history
//! [`cold_allowance`] takes the first-answer latencies of the pair's accepted
//! restarts with the same engine and config fingerprint, needs at least
//! [`MIN_COLD_HISTORY`] of them, uses the median (the slow mode's median if the
//! set is bimodal) times the margin, and never leaves the range [warm budget,
//! configured allowance]: one bad accepted restart cannot raise the bar, and a
//! changed engine starts again from what the operator configured.

use std::fmt;

use serde::{Deserialize, Serialize};

pub use crate::judge::stats::secs;
use crate::judge::stats::{LatencySummary, summarize};

/// The outcome of one restart, as an operator reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    /// Every unit generated, every probe within the warm budget.
    Healthy,
    /// The first probe was slow, and the evidence supports a cold start.
    HealthyAfterColdStart,
    /// A slow start was explained as cold start, and the evidence refutes it.
    ColdStartRejected,
    /// Generation works but slower than its budget, with no warm-up to explain it.
    OverBudget,
    /// Something listens and answers health, but generation does not happen.
    Wedged,
    /// A unit did not start, exited, could not be reached, or answered errors.
    Failed,
}

impl VerdictKind {
    /// Healthy verdicts let the pair go back into service (CLI exit 0).
    pub fn is_healthy(self) -> bool {
        matches!(self, Self::Healthy | Self::HealthyAfterColdStart)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::HealthyAfterColdStart => "healthy_after_cold_start",
            Self::ColdStartRejected => "cold_start_rejected",
            Self::OverBudget => "over_budget",
            Self::Wedged => "wedged",
            Self::Failed => "failed",
        }
    }
}

impl fmt::Display for VerdictKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A verdict and the evidence for it, in sentences that name the numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub kind: VerdictKind,
    pub reasons: Vec<String>,
}

/// The furthest start-up phase a unit reached during the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadinessPhase {
    Spawned,
    Refused,
    Http503,
    Healthy,
    Generating,
}

impl ReadinessPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Spawned => "spawned",
            Self::Refused => "refused",
            Self::Http503 => "http_503",
            Self::Healthy => "healthy",
            Self::Generating => "generating",
        }
    }
}

/// A generation check of an engine's start-up that did not pass.
#[derive(Debug, Clone, PartialEq)]
pub struct FailedCheck {
    /// 1-based attempt number within the start-up.
    pub seq: u32,
    /// True for a timeout, false for an error answer.
    pub timed_out: bool,
    pub latency_ms: u64,
    pub detail: String,
}

/// What one unit's start-up showed.
#[derive(Debug, Clone, PartialEq)]
pub struct UnitStartup {
    pub unit: String,
    pub role: String,
    /// `None` if the start command itself failed (nothing was spawned).
    pub furthest: Option<ReadinessPhase>,
    /// The process exited during the start-up (detail in `last_detail`).
    pub exited: bool,
    /// The agent's stream ended (partition, agent killed) before the unit
    /// was generating: what the unit is doing is unknown, not wedged.
    pub lost_contact: bool,
    /// The last thing the agent said about this unit ("generation check timed
    /// out after 5000 ms", "exit status 1", "agent disconnected", ...).
    pub last_detail: String,
    /// How long the operation waited for it, in ms.
    pub waited_ms: u64,
    /// Engine generation checks that timed out or failed (the router's are
    /// probes of the series instead).
    pub failed_checks: Vec<FailedCheck>,
}

pub use crate::judge::probe::ProbeObservation;

/// Accepted restarts needed before history may set the cold allowance.
pub const MIN_COLD_HISTORY: usize = 3;
/// The most recent accepted restarts the statistic looks at.
pub const COLD_HISTORY_WINDOW: usize = 20;
/// A later answer at most this fraction of the first one is a fall: the
/// series claims a warm-up even if it never reached the warm budget.
pub const WARM_UP_FALL: f64 = 0.75;

/// One accepted restart of the pair, as history offers it to the allowance.
#[derive(Debug, Clone, PartialEq)]
pub struct ColdSample {
    pub operation_id: String,
    /// Latency of the first answer through the router after that restart.
    pub first_answer_ms: u64,
    /// The engine and config fingerprint that restart ran with.
    pub fingerprint: String,
}

/// Where the cold allowance came from, so a rejection can cite it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum ColdAllowance {
    /// The pair's configured allowance; `why` says why history did not set it.
    Configured {
        ms: u64,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        why: String,
    },
    /// Measured on this pair: the median first answer of `samples` accepted
    /// restarts with the same fingerprint, times `margin`, kept within
    /// [warm budget, configured allowance].
    Measured {
        ms: u64,
        #[serde(default)]
        median_first_ms: u64,
        #[serde(default)]
        samples: usize,
        #[serde(default)]
        margin: f64,
        #[serde(default)]
        configured_ms: u64,
        /// Whether the first answers were bimodal (the slow mode was used).
        #[serde(default)]
        bimodal: bool,
        #[serde(default)]
        operation_ids: Vec<String>,
    },
}

impl ColdAllowance {
    pub fn ms(&self) -> u64 {
        match self {
            Self::Configured { ms, .. } | Self::Measured { ms, .. } => *ms,
        }
    }

    /// Where the number came from, in a sentence for the report.
    pub fn describe(&self) -> String {
        match self {
            Self::Configured { ms, why } if why.is_empty() => {
                format!("the configured cold-start allowance ({})", secs(*ms))
            }
            Self::Configured { ms, why } => {
                format!("the configured cold-start allowance ({}; {why})", secs(*ms))
            }
            Self::Measured {
                ms,
                median_first_ms,
                samples,
                margin,
                configured_ms,
                bimodal,
                ..
            } => format!(
                "this pair's measured cold start ({}{} median first answer of {samples} accepted restarts × {margin}; allowance {}, configured {})",
                if *bimodal { "slow-mode " } else { "" },
                secs(*median_first_ms),
                secs(*ms),
                secs(*configured_ms)
            ),
        }
    }
}

/// The budgets the probes are judged against.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbePolicy {
    pub warm_budget_ms: u64,
    pub cold_allowance: ColdAllowance,
    /// False when nothing was restarted (a verification of a pair in
    /// service): then a slow first probe is simply over budget.
    pub cold_start_possible: bool,
    /// Consecutive warm answers that end a series (never fewer are accepted).
    pub warm_probes: u32,
    /// How many first answers a cold start may slow: one per freshly
    /// started engine a probe series can meet one after another — the
    /// larger of the pair's prefill and decode counts (an xPyD pair behind a
    /// round-robin router sends probe 2 to a second engine that is as cold
    /// as the first was). 1 for a 1P1D pair.
    pub cold_answers: u32,
    /// Probes (1-based) that the engines' own request counters show were
    /// the first request a freshly started engine of an xPyD pair served in
    /// the series. A router that balances by cache affinity (sglang-router's
    /// default `cache_aware`) first picks a second engine at any point of
    /// the series: such a probe's slow answer is that engine's cold start,
    /// not a relapse — within the allowance (each engine is fresh once).
    pub fresh_engine_answers: Vec<usize>,
}

/// Judges a co-restart from its start-ups (in restart order) and its
/// end-to-end probes (in sequence order, probe 1 first).
pub fn judge(startups: &[UnitStartup], probes: &[ProbeObservation], policy: &ProbePolicy) -> Verdict {
    if let Some(v) = judge_startups(startups) {
        return v;
    }
    let mut v = judge_probes(probes, policy);
    // Rule 4 for the engines: a generation check that hung or failed before
    // the unit generated is never cold start, however well it answered later.
    let failed: Vec<String> = startups
        .iter()
        .flat_map(|u| {
            u.failed_checks.iter().map(move |c| {
                let what = if c.timed_out {
                    format!("timed out after {}", secs(c.latency_ms))
                } else {
                    format!("failed after {} ({})", secs(c.latency_ms), c.detail)
                };
                format!(
                    "{} {}: generation check {} {what} before its first answer: {} is never cold start",
                    u.role,
                    u.unit,
                    c.seq,
                    if c.timed_out { "a timeout" } else { "an error" }
                )
            })
        })
        .collect();
    if !failed.is_empty() {
        if matches!(
            v.kind,
            VerdictKind::Healthy | VerdictKind::HealthyAfterColdStart | VerdictKind::OverBudget
        ) {
            v.kind = VerdictKind::ColdStartRejected;
            v.reasons.clear();
        }
        v.reasons.splice(0..0, failed);
    }
    if !startups.is_empty()
        && matches!(
            v.kind,
            VerdictKind::Wedged | VerdictKind::ColdStartRejected | VerdictKind::OverBudget
        )
    {
        // The shallow-health gap (INCIDENTS row 3) is itself evidence.
        v.reasons.push(format!(
            "every unit answered health 200 and passed its own generation check ({}); neither exercises generation through the router",
            startups.iter().map(|u| u.unit.as_str()).collect::<Vec<_>>().join(", ")
        ));
    }
    v
}

/// The cold allowance for the next restart (see the module doc): history of
/// accepted restarts (newest first) with `fingerprint`, or the configured one.
pub fn cold_allowance(
    history: &[ColdSample],
    fingerprint: &str,
    margin: f64,
    configured_ms: u64,
    warm_budget_ms: u64,
) -> ColdAllowance {
    let same: Vec<&ColdSample> = history
        .iter()
        .filter(|s| s.fingerprint == fingerprint)
        .take(COLD_HISTORY_WINDOW)
        .collect();
    if same.len() < MIN_COLD_HISTORY {
        let why = match history.first() {
            Some(newest) if newest.fingerprint != fingerprint => format!(
                "the engine or its config changed since operation {} (fingerprint {} → {}): history starts again",
                newest.operation_id,
                short(&newest.fingerprint),
                short(fingerprint)
            ),
            _ => format!(
                "{} accepted restart{} with this engine and config, {MIN_COLD_HISTORY} needed to measure one",
                same.len(),
                if same.len() == 1 { "" } else { "s" }
            ),
        };
        return ColdAllowance::Configured { ms: configured_ms, why };
    }
    let firsts: Vec<u64> = same.iter().map(|s| s.first_answer_ms).collect();
    let summary = summarize(&firsts);
    let median = judged_ms(&summary);
    let margin = if margin.is_finite() && margin >= 1.0 {
        margin
    } else {
        1.0
    };
    let ms = ((median as f64 * margin).ceil() as u64)
        .min(configured_ms)
        .max(warm_budget_ms.min(configured_ms));
    ColdAllowance::Measured {
        ms,
        median_first_ms: median,
        samples: same.len(),
        margin,
        configured_ms,
        bimodal: matches!(summary, LatencySummary::Bimodal { .. }),
        operation_ids: same.iter().map(|s| s.operation_id.clone()).collect(),
    }
}

/// The figure a set of latencies is judged by: its median, or the slow
/// mode's median when the set is bimodal (a cache miss is what a user sees
/// on a miss; the fast mode's median would flatter it).
pub fn judged_ms(summary: &LatencySummary) -> u64 {
    match summary {
        LatencySummary::Empty => 0,
        LatencySummary::Unimodal { median_ms, .. } => *median_ms,
        LatencySummary::Bimodal { high, .. } => high.median_ms,
    }
}

fn short(fingerprint: &str) -> &str {
    if fingerprint.is_empty() {
        "none"
    } else {
        &fingerprint[..fingerprint.len().min(12)]
    }
}

/// A unit that never reached `generating` decides the verdict before any probe.
fn judge_startups(startups: &[UnitStartup]) -> Option<Verdict> {
    let stuck = startups
        .iter()
        .find(|u| u.furthest != Some(ReadinessPhase::Generating))?;
    let furthest = stuck.furthest.map_or("not spawned", ReadinessPhase::as_str);
    let detail = if stuck.last_detail.is_empty() {
        String::new()
    } else {
        format!(" ({})", stuck.last_detail)
    };
    let mut reasons = Vec::new();
    let kind = if stuck.lost_contact {
        reasons.push(format!(
            "{} {}: lost contact with its agent after {}, furthest phase {furthest}{detail}",
            stuck.role,
            stuck.unit,
            secs(stuck.waited_ms)
        ));
        reasons.push(
            "its state is unknown until the agent re-attaches (`pdwarden status`): not judged wedged, not healthy"
                .to_string(),
        );
        VerdictKind::Failed
    } else if !stuck.exited && stuck.furthest == Some(ReadinessPhase::Healthy) {
        reasons.push(format!(
            "{} {}: health answered 200 but its generation check never passed in {}{detail}",
            stuck.role,
            stuck.unit,
            secs(stuck.waited_ms)
        ));
        reasons.push("a health endpoint answering 200 does not prove generation works".to_string());
        VerdictKind::Wedged
    } else if !stuck.exited && stuck.furthest == Some(ReadinessPhase::Http503) {
        reasons.push(format!(
            "{} {}: listening but never healthy and never generating in {}{detail}",
            stuck.role,
            stuck.unit,
            secs(stuck.waited_ms)
        ));
        VerdictKind::Wedged
    } else {
        let what = if stuck.exited { "exited" } else { "never became ready" };
        reasons.push(format!(
            "{} {} {what}: furthest phase {furthest} after {}{detail}",
            stuck.role,
            stuck.unit,
            secs(stuck.waited_ms)
        ));
        VerdictKind::Failed
    };
    let later: Vec<&str> = startups
        .iter()
        .skip_while(|u| u.unit != stuck.unit)
        .skip(1)
        .map(|u| u.unit.as_str())
        .collect();
    if !later.is_empty() {
        reasons.push(format!(
            "not started, because their start is gated on it: {}",
            later.join(", ")
        ));
    }
    Some(Verdict { kind, reasons })
}

fn judge_probes(probes: &[ProbeObservation], policy: &ProbePolicy) -> Verdict {
    let warm = policy.warm_budget_ms;
    let Some(first) = probes.first() else {
        return Verdict {
            kind: VerdictKind::Failed,
            reasons: vec!["no end-to-end probe ran through the router".to_string()],
        };
    };
    if !probes.iter().any(|p| matches!(p, ProbeObservation::Ok { .. })) {
        let only_timeouts = probes.iter().all(|p| matches!(p, ProbeObservation::Timeout { .. }));
        let mut reasons = vec![format!("none of {} end-to-end probes returned tokens", probes.len())];
        reasons.extend(failure_reasons(probes, policy.cold_start_possible));
        return Verdict {
            kind: if only_timeouts {
                VerdictKind::Wedged
            } else {
                VerdictKind::Failed
            },
            reasons,
        };
    }
    let cold_claimed = policy.cold_start_possible && first.latency().is_none_or(|l| l > warm);
    // An error answer is something broken, not slow: it decides the kind
    // whatever else the series shows (rule 4), with every failure named.
    if probes.iter().any(|p| matches!(p, ProbeObservation::Error { .. })) {
        let mut reasons = failure_reasons(probes, cold_claimed);
        reasons.extend(slow_reasons(probes, warm));
        return Verdict {
            kind: VerdictKind::Failed,
            reasons,
        };
    }
    if cold_claimed {
        judge_cold_start(probes, policy)
    } else {
        judge_warm_series(probes, policy)
    }
}

/// No cold start is claimed (the first answer was warm, or nothing was
/// restarted): every answer must be warm, and a timeout after answering is
/// a stall.
fn judge_warm_series(probes: &[ProbeObservation], policy: &ProbePolicy) -> Verdict {
    let warm = policy.warm_budget_ms;
    let mut reasons = Vec::new();
    let mut kind = VerdictKind::Healthy;
    for (i, p) in probes.iter().enumerate() {
        let seq = i + 1;
        match p {
            ProbeObservation::Ok { latency_ms, .. } if *latency_ms > warm => {
                reasons.push(format!(
                    "probe {seq} took {}, over the {} warm budget",
                    secs(*latency_ms),
                    secs(warm)
                ));
                if kind == VerdictKind::Healthy {
                    kind = VerdictKind::OverBudget;
                }
            }
            ProbeObservation::Ok { .. } | ProbeObservation::Error { .. } => {}
            ProbeObservation::Timeout { after_ms } => {
                reasons.push(format!(
                    "probe {seq} timed out after {}: generation stalled after answering before",
                    secs(*after_ms)
                ));
                kind = VerdictKind::Wedged;
            }
        }
    }
    if kind == VerdictKind::Healthy
        && let Some(r) = convergence_failure(probes, policy)
    {
        reasons.push(r);
        kind = VerdictKind::OverBudget;
    }
    if kind == VerdictKind::Healthy {
        let max = probes.iter().filter_map(ProbeObservation::latency).max().unwrap_or(0);
        reasons.push(format!(
            "{} probes through the router, slowest {}, all within the {} warm budget",
            probes.len(),
            secs(max),
            secs(warm)
        ));
    }
    Verdict { kind, reasons }
}

/// Rule 3: the series must end with `warm_probes` consecutive warm answers.
fn convergence_failure(probes: &[ProbeObservation], policy: &ProbePolicy) -> Option<String> {
    let warm = policy.warm_budget_ms;
    let tail = probes
        .iter()
        .rev()
        .take_while(|p| p.latency().is_some_and(|l| l <= warm))
        .count();
    (tail < policy.warm_probes as usize).then(|| {
        format!(
            "not converged: the series ended with {tail} consecutive warm answer{} after {} probes; {} are needed",
            if tail == 1 { "" } else { "s" },
            probes.len(),
            policy.warm_probes
        )
    })
}

/// The first answer was slow (or the first attempt failed) after a restart:
/// test the cold-start hypothesis against rules 1–5.
fn judge_cold_start(probes: &[ProbeObservation], policy: &ProbePolicy) -> Verdict {
    let warm = policy.warm_budget_ms;
    let allowance = policy.cold_allowance.ms();
    let timeouts = failure_reasons(probes, true);
    let answers: Vec<(usize, u64)> = probes
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.latency().map(|l| (i + 1, l)))
        .collect();

    // Rule 5: with no timeout, and no answer warm or clearly falling, there is
    // no warm-up story to test: the pair is slow.
    if timeouts.is_empty() {
        let first = answers[0].1;
        let fell = answers
            .iter()
            .skip(1)
            .any(|&(_, l)| l <= warm || (l as f64) <= first as f64 * WARM_UP_FALL);
        if !fell {
            let mut reasons = vec![format!(
                "every one of {} answers was over the {} warm budget and none fell below {:.0}% of the first ({}): no warm-up to explain it",
                answers.len(),
                secs(warm),
                WARM_UP_FALL * 100.0,
                secs(first)
            )];
            reasons.extend(slow_reasons(probes, warm));
            return Verdict {
                kind: VerdictKind::OverBudget,
                reasons,
            };
        }
    }

    let mut reasons = Vec::new();
    // The first answers a cold start may slow (one per fresh engine).
    let cold = policy.cold_answers.max(1) as usize;
    // Rule 1: each of them within the allowance.
    for &(seq, l) in answers.iter().take_while(|(seq, _)| *seq <= cold) {
        if l > allowance {
            reasons.push(format!(
                "probe {seq} took {}, above {}",
                secs(l),
                policy.cold_allowance.describe()
            ));
        }
    }
    // Rule 4: timeouts.
    reasons.extend(timeouts);
    // Rule 2: every answer after the first is warm at once — but for the
    // first answer of an engine the series reached later (xPyD), by the
    // engines' counters: each engine is fresh once, so this excuses at most
    // one slow answer per engine, and each must be within the allowance.
    let mut reached: Option<usize> = None;
    let mut prev: Option<(usize, u64)> = None;
    let mut late: Vec<String> = Vec::new();
    for &(seq, l) in &answers {
        if seq > cold && l > warm && policy.fresh_engine_answers.contains(&seq) {
            late.push(format!("probe {seq} ({})", secs(l)));
            if l > allowance {
                reasons.push(format!(
                    "probe {seq} took {}, above {} (the first answer of an engine the series had not reached)",
                    secs(l),
                    policy.cold_allowance.describe()
                ));
            }
            prev = Some((seq, l));
            continue;
        }
        if seq > cold && l > warm {
            let why = match (reached, prev) {
                (Some(r), _) => format!(
                    "a relapse after probe {r} had reached the {} budget: warm-up does not come back",
                    secs(warm)
                ),
                (None, Some((pseq, pl))) if l > pl => format!(
                    "slower than probe {pseq} ({}): warm-up makes latency fall, not rise",
                    secs(pl)
                ),
                (None, Some((pseq, pl))) if pseq == cold && l.abs_diff(pl) * 10 <= pl => format!(
                    "as slow as probe 1 ({}): a cold start slows only the first answer",
                    secs(pl)
                ),
                (None, Some((pseq, pl))) if pseq == cold => format!(
                    "a second slow answer after probe 1 ({}): a cold start slows only the first answer",
                    secs(pl)
                ),
                (None, Some((pseq, pl))) => format!(
                    "still over budget after probe {pseq} ({}): a cold start slows only the first answer",
                    secs(pl)
                ),
                (None, None) => format!(
                    "over the {} budget, the first answer after a failed attempt: a cold start slows only the first answer",
                    secs(warm)
                ),
            };
            reasons.push(format!(
                "probe {seq} took {}, over the {} warm budget, {why}",
                secs(l),
                secs(warm)
            ));
        }
        if l <= warm && reached.is_none() {
            reached = Some(seq);
        }
        prev = Some((seq, l));
    }
    // Rule 3: convergence.
    if reached.is_none() {
        reasons.push(format!(
            "no convergence: {} probes, none within the {} budget",
            probes.len(),
            secs(warm)
        ));
    } else if let Some(r) = convergence_failure(probes, policy) {
        reasons.push(r);
    }

    if reasons.is_empty() {
        let first = answers[0].1;
        let k = reached.unwrap_or(1);
        let late = if late.is_empty() {
            String::new()
        } else {
            format!(
                "; {} {} the first answer of an engine the series reached only then (by its request counter): its cold start, not a relapse",
                late.join(", "),
                if late.len() == 1 { "was" } else { "were" }
            )
        };
        let cold_part = if cold == 1 {
            format!("probe 1 took {}", secs(first))
        } else {
            let slow: Vec<String> = answers
                .iter()
                .take_while(|(seq, _)| *seq <= cold)
                .map(|(seq, l)| format!("probe {seq} {}", secs(*l)))
                .collect();
            format!(
                "the first {cold} answers, one per fresh engine, took {}",
                slow.join(", ")
            )
        };
        Verdict {
            kind: VerdictKind::HealthyAfterColdStart,
            reasons: vec![if late.is_empty() {
                format!(
                    "{cold_part} (within {}); probe {k} and every later one within the {} warm budget ({} consecutive)",
                    policy.cold_allowance.describe(),
                    secs(warm),
                    probes.len() + 1 - k
                )
            } else {
                format!(
                    "{cold_part} (within {}); from probe {k} on within the {} warm budget{late}",
                    policy.cold_allowance.describe(),
                    secs(warm),
                )
            }],
        }
    } else {
        Verdict {
            kind: VerdictKind::ColdStartRejected,
            reasons,
        }
    }
}

fn slow_reasons(probes: &[ProbeObservation], warm: u64) -> Vec<String> {
    probes
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            p.latency()
                .filter(|l| *l > warm)
                .map(|l| format!("probe {} took {}, over the {} warm budget", i + 1, secs(l), secs(warm)))
        })
        .collect()
}

fn failure_reasons(probes: &[ProbeObservation], after_restart: bool) -> Vec<String> {
    let why = if after_restart {
        ": a timeout is never cold start"
    } else {
        ""
    };
    probes
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match p {
            ProbeObservation::Timeout { after_ms } => {
                Some(format!("probe {} timed out after {}{why}", i + 1, secs(*after_ms)))
            }
            ProbeObservation::Error { message } => Some(format!("probe {} failed: {message}", i + 1)),
            ProbeObservation::Ok { .. } => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ok(ms: u64) -> ProbeObservation {
        ProbeObservation::Ok {
            latency_ms: ms,
            tokens: 8,
        }
    }

    fn timeout(ms: u64) -> ProbeObservation {
        ProbeObservation::Timeout { after_ms: ms }
    }

    fn error(m: &str) -> ProbeObservation {
        ProbeObservation::Error { message: m.into() }
    }

    fn ready(unit: &str, role: &str) -> UnitStartup {
        UnitStartup {
            unit: unit.into(),
            role: role.into(),
            furthest: Some(ReadinessPhase::Generating),
            exited: false,
            lost_contact: false,
            last_detail: String::new(),
            waited_ms: 1_000,
            failed_checks: Vec::new(),
        }
    }

    fn pair_ready() -> Vec<UnitStartup> {
        vec![
            ready("prefill-0", "prefill"),
            ready("decode-0", "decode"),
            ready("router-0", "router"),
        ]
    }

    /// Seed 003's budget: 680–845 tok/s, so an 8-token answer is well under 1 s.
    fn policy() -> ProbePolicy {
        ProbePolicy {
            warm_budget_ms: 1_000,
            cold_allowance: ColdAllowance::Configured {
                ms: 30_000,
                why: String::new(),
            },
            cold_start_possible: true,
            warm_probes: 2,
            cold_answers: 1,
            fresh_engine_answers: Vec::new(),
        }
    }

    fn kind(probes: &[ProbeObservation]) -> VerdictKind {
        judge(&pair_ready(), probes, &policy()).kind
    }

    fn text(probes: &[ProbeObservation]) -> String {
        judge(&pair_ready(), probes, &policy()).reasons.join("\n")
    }

    /// INCIDENTS row 2, exactly: 17.9 s, 106.4 s, 10.5 s, then no answer.
    /// Never healthy; the rejection names the rising probe and the timeout.
    #[test]
    fn incident_row2_cold_start_story_is_rejected() {
        let probes = [ok(17_900), ok(106_400), ok(10_500), timeout(240_000)];
        let v = judge(&pair_ready(), &probes, &policy());
        assert_eq!(v.kind, VerdictKind::ColdStartRejected, "{v:?}");
        let text = v.reasons.join("\n");
        assert!(
            text.contains("probe 2 took 106.4 s, over the 1.00 s warm budget, slower than probe 1 (17.9 s): warm-up makes latency fall, not rise"),
            "{text}"
        );
        assert!(
            text.contains("probe 4 timed out after 240.0 s: a timeout is never cold start"),
            "{text}"
        );
        assert!(
            text.contains("no convergence: 4 probes, none within the 1.00 s budget"),
            "{text}"
        );
    }

    /// Row 2 against a measured cold start: 17.9 s is far above restarts
    /// that answered in 1.71 s (seed 000), even if every later probe were fast.
    #[test]
    fn first_probe_above_measured_cold_start_is_rejected() {
        let h: Vec<ColdSample> = (0..3)
            .map(|i| ColdSample {
                operation_id: format!("op-{i}"),
                first_answer_ms: 1_710,
                fingerprint: "f".into(),
            })
            .collect();
        let p = ProbePolicy {
            cold_allowance: cold_allowance(&h, "f", 2.0, 30_000, 1_000),
            ..policy()
        };
        let v = judge(&pair_ready(), &[ok(17_900), ok(400), ok(300)], &p);
        assert_eq!(v.kind, VerdictKind::ColdStartRejected);
        assert!(
            v.reasons[0].starts_with(
                "probe 1 took 17.9 s, above this pair's measured cold start (1.71 s median first answer of 3 accepted restarts × 2; allowance 3.42 s"
            ),
            "{v:?}"
        );
    }

    /// A genuine cold start: slow first probe within the allowance, then
    /// warm at once, for `warm_probes` answers.
    #[test]
    fn genuine_cold_start_is_accepted() {
        let v = judge(&pair_ready(), &[ok(1_710), ok(600), ok(450)], &policy());
        assert_eq!(v.kind, VerdictKind::HealthyAfterColdStart, "{v:?}");
        assert!(v.kind.is_healthy());
    }

    /// Rule 2 and 3: falling but never reaching the budget is not a cold start.
    #[test]
    fn falling_without_convergence_is_rejected() {
        let v = judge(
            &pair_ready(),
            &[ok(9_000), ok(5_000), ok(3_000), ok(2_000), ok(1_500)],
            &policy(),
        );
        assert_eq!(v.kind, VerdictKind::ColdStartRejected);
        assert!(
            v.reasons[0].starts_with("probe 2 took 5.00 s, over the 1.00 s warm budget, a second slow answer"),
            "{v:?}"
        );
        assert_eq!(
            v.reasons.last().unwrap(),
            "every unit answered health 200 and passed its own generation check (prefill-0, decode-0, router-0); neither exercises generation through the router"
        );
        assert!(text(&[ok(9_000), ok(5_000), ok(3_000), ok(2_000), ok(1_500)]).contains("no convergence: 5 probes"));
    }

    /// Jitter between warm probes after a genuine cold start is not a rise.
    /// The demo's budgets (pd-sim at time scale 0.05): a 50 ms warm budget,
    /// a 1.5 s cold allowance.
    fn demo_policy() -> ProbePolicy {
        ProbePolicy {
            warm_budget_ms: 50,
            cold_allowance: ColdAllowance::Configured {
                ms: 1_500,
                why: String::new(),
            },
            ..policy()
        }
    }

    #[test]
    fn warm_jitter_after_cold_start_is_accepted() {
        let v = judge(&pair_ready(), &[ok(319), ok(21), ok(22)], &demo_policy());
        assert_eq!(v.kind, VerdictKind::HealthyAfterColdStart, "{v:?}");
    }

    /// Issue 18 (xPyD): behind a round-robin router a 2P2D pair's probe 2
    /// reaches a second engine as cold as probe 1's; it was
    /// `cold_start_rejected` ("as slow as probe 1: a cold start slows only
    /// the first answer"). With `cold_answers` 2 the first two may be slow;
    /// a third slow one, or a 1P1D pair's second, is still rejected.
    #[test]
    fn each_fresh_engine_of_an_xpyd_pair_may_be_cold_once() {
        let p = |cold_answers| ProbePolicy {
            cold_answers,
            ..demo_policy()
        };
        let series = [ok(320), ok(318), ok(21), ok(22)];
        let v = judge(&pair_ready(), &series, &p(2));
        assert_eq!(v.kind, VerdictKind::HealthyAfterColdStart, "{v:?}");
        assert!(
            v.reasons[0].contains("the first 2 answers, one per fresh engine"),
            "{v:?}"
        );
        assert_eq!(
            judge(&pair_ready(), &series, &p(1)).kind,
            VerdictKind::ColdStartRejected
        );
        let third = judge(&pair_ready(), &[ok(320), ok(318), ok(300), ok(21), ok(22)], &p(2));
        assert_eq!(third.kind, VerdictKind::ColdStartRejected, "{third:?}");
        let over = judge(&pair_ready(), &[ok(320), ok(1_800), ok(21), ok(22)], &p(2));
        assert_eq!(over.kind, VerdictKind::ColdStartRejected, "{over:?}");
        assert!(over.reasons[0].contains("probe 2 took 1.80 s, above"), "{over:?}");
    }

    /// Issue 18 (xPyD behind `cache_aware`): the real sglang-router sent
    /// probes 1–3 of a 2P2D pair to one engine and probe 4 to the other,
    /// fresh one, whose first answer was as cold as probe 1's: the pair was
    /// `cold_start_rejected` ("a relapse after probe 3 had reached the
    /// budget"). A late slow answer is that engine's cold start only when
    /// the engines' counters say that probe first reached an engine (each
    /// engine is fresh once), and only within the allowance.
    #[test]
    fn a_fresh_engines_first_answer_late_in_the_series_is_its_cold_start_not_a_relapse() {
        let p = |fresh: Vec<usize>| ProbePolicy {
            cold_answers: 2,
            fresh_engine_answers: fresh,
            ..demo_policy()
        };
        let series = [ok(320), ok(21), ok(22), ok(318), ok(20), ok(21)];
        let v = judge(&pair_ready(), &series, &p(vec![4]));
        assert_eq!(v.kind, VerdictKind::HealthyAfterColdStart, "{v:?}");
        assert!(
            v.reasons[0].contains("probe 4 (0.32 s) was the first answer of an engine"),
            "{v:?}"
        );
        // Without the counters' word, the same series is a relapse.
        let relapse = judge(&pair_ready(), &series, &p(Vec::new()));
        assert_eq!(relapse.kind, VerdictKind::ColdStartRejected, "{relapse:?}");
        assert!(relapse.reasons[0].contains("a relapse after probe 2"), "{relapse:?}");
        // A slow answer the counters do not give to a fresh engine is still
        // a relapse, however many fresh engines came before it.
        let unexplained = judge(
            &pair_ready(),
            &[ok(320), ok(21), ok(22), ok(318), ok(20), ok(300), ok(21), ok(20)],
            &p(vec![4]),
        );
        assert_eq!(unexplained.kind, VerdictKind::ColdStartRejected, "{unexplained:?}");
        assert!(
            unexplained.reasons[0].starts_with("probe 6 took 0.30 s"),
            "{unexplained:?}"
        );
        // Nor one beyond the allowance.
        let over = judge(
            &pair_ready(),
            &[ok(320), ok(21), ok(22), ok(1_800), ok(20), ok(21)],
            &p(vec![4]),
        );
        assert_eq!(over.kind, VerdictKind::ColdStartRejected, "{over:?}");
        // Nor a series that does not come back warm after it.
        let after = judge(&pair_ready(), &[ok(320), ok(21), ok(22), ok(318), ok(300)], &p(vec![4]));
        assert_eq!(after.kind, VerdictKind::ColdStartRejected, "{after:?}");
    }

    /// Rule 4: a timeout is never cold start, even when the probes around it are fine.
    #[test]
    fn timeout_in_a_cold_series_rejects() {
        let v = judge(&pair_ready(), &[ok(5_000), timeout(20_000), ok(300)], &policy());
        assert_eq!(v.kind, VerdictKind::ColdStartRejected);
        assert!(v.reasons.iter().any(|r| r.contains("probe 2 timed out")));
    }

    /// The hidden hang: the router's first generation hung until its
    /// timeout, the retry answered fast. Recorded as probe 1, it rejects.
    #[test]
    fn a_hang_before_the_first_answer_rejects() {
        let v = judge(&pair_ready(), &[timeout(20_000), ok(300), ok(280)], &policy());
        assert_eq!(v.kind, VerdictKind::ColdStartRejected, "{v:?}");
        assert_eq!(
            v.reasons[0],
            "probe 1 timed out after 20.0 s: a timeout is never cold start"
        );
    }

    /// An engine's own generation check that hung before it generated is
    /// rule 4 too, even when every probe through the router is warm.
    #[test]
    fn an_engine_check_that_hung_before_generating_rejects() {
        let mut s = pair_ready();
        s[1].failed_checks.push(FailedCheck {
            seq: 1,
            timed_out: true,
            latency_ms: 5_000,
            detail: "timed out".into(),
        });
        let v = judge(&s, &[ok(300), ok(280)], &policy());
        assert_eq!(v.kind, VerdictKind::ColdStartRejected, "{v:?}");
        assert_eq!(
            v.reasons[0],
            "decode decode-0: generation check 1 timed out after 5.00 s before its first answer: a timeout is never cold start"
        );
        // A worse verdict stays, with the check named too.
        let v = judge(&s, &[timeout(20_000)], &policy());
        assert_eq!(v.kind, VerdictKind::Wedged);
        assert!(v.reasons[0].starts_with("decode decode-0: generation check 1"));
    }

    /// Rule 2: an equally slow second answer is not a warm-up.
    #[test]
    fn slow_then_equally_slow_then_warm_rejects() {
        let v = judge(&pair_ready(), &[ok(5_000), ok(5_000), ok(300), ok(300)], &policy());
        assert_eq!(v.kind, VerdictKind::ColdStartRejected);
        assert!(v.reasons[0].contains("as slow as probe 1 (5.00 s)"), "{v:?}");
    }

    /// Rule 2: a relapse after reaching warm rejects, naming the probe that was warm.
    #[test]
    fn relapse_after_warm_rejects() {
        let v = judge(
            &pair_ready(),
            &[ok(5_000), ok(300), ok(8_000), ok(300), ok(300)],
            &policy(),
        );
        assert_eq!(v.kind, VerdictKind::ColdStartRejected);
        assert!(
            v.reasons[0].contains("probe 3 took 8.00 s, over the 1.00 s warm budget, a relapse after probe 2"),
            "{v:?}"
        );
    }

    /// Rule 3: one warm answer at `max_probes` is not convergence when two are needed.
    #[test]
    fn one_warm_answer_is_not_convergence() {
        let v = judge(&pair_ready(), &[ok(5_000), ok(300)], &policy());
        assert_eq!(v.kind, VerdictKind::ColdStartRejected);
        assert_eq!(
            v.reasons[0],
            "not converged: the series ended with 1 consecutive warm answer after 2 probes; 2 are needed"
        );
    }

    /// Rule 5: uniformly ~6× over budget, no warm-up at all: `over_budget`,
    /// not a rejected cold-start claim nobody made.
    #[test]
    fn uniformly_slow_pair_is_over_budget() {
        let v = judge(&pair_ready(), &[ok(6_100), ok(5_900), ok(6_000)], &policy());
        assert_eq!(v.kind, VerdictKind::OverBudget, "{v:?}");
        assert!(
            v.reasons[0].starts_with("every one of 3 answers was over the 1.00 s warm budget and none fell below 75%"),
            "{v:?}"
        );
        assert!(!v.reasons.iter().any(|r| r.contains("warm-up makes")), "{v:?}");
    }

    /// An error answer (a failed KV transfer) is `failed`, whatever else.
    #[test]
    fn an_error_anywhere_is_failed() {
        for probes in [
            vec![ok(300), error("http 500: KV transfer failed"), ok(300)],
            vec![error("http 500: KV transfer failed"), ok(300), ok(300)],
            vec![ok(5_000), ok(300), error("http 500"), ok(300), ok(300)],
        ] {
            let v = judge(&pair_ready(), &probes, &policy());
            assert_eq!(v.kind, VerdictKind::Failed, "{probes:?}");
            assert!(v.reasons.iter().any(|r| r.contains("failed: http 500")), "{v:?}");
        }
    }

    /// INCIDENTS row 3: every unit healthy, every generation times out (4 and
    /// 32 tokens alike): wedged, not healthy.
    #[test]
    fn incident_row3_generation_hangs_behind_healthy_units_is_wedged() {
        let v = judge(
            &pair_ready(),
            &[timeout(120_000), timeout(120_000), timeout(120_000)],
            &policy(),
        );
        assert_eq!(v.kind, VerdictKind::Wedged);
        assert!(v.reasons[0].contains("none of 3 end-to-end probes returned tokens"));
    }

    /// A decode whose agent was cut off while it loaded (answering 503, as
    /// a wedged one would): its state is unknown, so the operation fails
    /// saying so; it is never called wedged on no evidence.
    #[test]
    fn lost_contact_mid_start_is_failed_not_wedged() {
        let mut s = pair_ready();
        s[1].furthest = Some(ReadinessPhase::Http503);
        s[1].lost_contact = true;
        s[1].last_detail = "agent host-b disconnected; last: http 503".into();
        s[1].waited_ms = 15_100;
        let v = judge(&s, &[], &policy());
        assert_eq!(v.kind, VerdictKind::Failed);
        assert_eq!(
            v.reasons[0],
            "decode decode-0: lost contact with its agent after 15.1 s, furthest phase http_503 (agent host-b disconnected; last: http 503)"
        );
        assert!(v.reasons[1].contains("unknown until the agent re-attaches"));
        assert!(v.reasons[2].contains("router-0"));
    }

    /// A decode whose health says 200 but whose generation check never passes
    /// never counts as ready, and the router is not started after it.
    #[test]
    fn healthy_but_not_generating_decode_is_wedged() {
        let mut s = pair_ready();
        s[1].furthest = Some(ReadinessPhase::Healthy);
        s[1].last_detail = "generation check timed out after 5000 ms".into();
        s[1].waited_ms = 80_000;
        let v = judge(&s, &[], &policy());
        assert_eq!(v.kind, VerdictKind::Wedged);
        assert!(
            v.reasons[0]
                .starts_with("decode decode-0: health answered 200 but its generation check never passed in 80.0 s")
        );
        assert!(v.reasons[2].contains("router-0"));
    }

    /// INCIDENTS row 1's timeline: port refused for 56 s, then 503; a unit
    /// that exits is failed.
    #[test]
    fn exited_unit_is_failed() {
        let mut s = pair_ready();
        s[0].furthest = Some(ReadinessPhase::Refused);
        s[0].exited = true;
        s[0].last_detail = "exit status 1".into();
        s[0].waited_ms = 56_000;
        let v = judge(&s, &[], &policy());
        assert_eq!(v.kind, VerdictKind::Failed);
        assert!(v.reasons[0].contains("prefill prefill-0 exited: furthest phase refused after 56.0 s (exit status 1)"));
    }

    #[test]
    fn warm_series_is_healthy_and_later_slowness_is_over_budget() {
        assert_eq!(kind(&[ok(300), ok(250)]), VerdictKind::Healthy);
        let v = judge(&pair_ready(), &[ok(300), ok(2_500), ok(300), ok(300)], &policy());
        assert_eq!(v.kind, VerdictKind::OverBudget);
        assert_eq!(v.reasons[0], "probe 2 took 2.50 s, over the 1.00 s warm budget");
    }

    /// Answering, then stalling: wedged (INCIDENTS row 4's shape).
    #[test]
    fn answer_then_timeout_is_wedged() {
        assert_eq!(kind(&[ok(300), timeout(240_000)]), VerdictKind::Wedged);
    }

    fn samples(firsts: &[u64], fingerprint: &str) -> Vec<ColdSample> {
        firsts
            .iter()
            .enumerate()
            .map(|(i, &ms)| ColdSample {
                operation_id: format!("op-{i}"),
                first_answer_ms: ms,
                fingerprint: fingerprint.into(),
            })
            .collect()
    }

    /// History needs three accepted restarts; fewer leave the configured
    /// allowance, saying why.
    #[test]
    fn allowance_needs_enough_history() {
        match cold_allowance(&samples(&[1_710, 900], "f"), "f", 2.0, 30_000, 1_000) {
            ColdAllowance::Configured { ms, why } => {
                assert_eq!(ms, 30_000);
                assert_eq!(
                    why,
                    "2 accepted restarts with this engine and config, 3 needed to measure one"
                );
            }
            other => panic!("{other:?}"),
        }
        let a = cold_allowance(&samples(&[1_710, 900, 1_800], "f"), "f", 2.0, 30_000, 1_000);
        assert_eq!(a.ms(), 3_420);
        // A history of warm first answers never pushes it below the warm budget.
        assert_eq!(
            cold_allowance(&samples(&[120, 100, 130], "f"), "f", 2.0, 30_000, 1_000).ms(),
            1_000
        );
    }

    /// One bad accepted restart does not raise the bar for the next ones
    /// (the median holds), and history never exceeds the configured allowance.
    #[test]
    fn history_cannot_be_poisoned() {
        let a = cold_allowance(&samples(&[1_700, 29_000, 1_800, 1_600], "f"), "f", 2.0, 30_000, 1_000);
        assert_eq!(a.ms(), 3_500, "{a:?}");
        let a = cold_allowance(&samples(&[20_000, 25_000, 29_000], "f"), "f", 2.0, 30_000, 1_000);
        assert_eq!(a.ms(), 30_000, "capped at the configured allowance: {a:?}");
        // Bimodal first answers (page cache hit/miss): judged by the slow mode.
        let a = cold_allowance(
            &samples(&[400, 420, 410, 5_000, 5_200, 5_100], "f"),
            "f",
            2.0,
            30_000,
            1_000,
        );
        assert!(matches!(a, ColdAllowance::Measured { bimodal: true, .. }), "{a:?}");
        assert_eq!(a.ms(), 10_200);
    }

    /// After an engine or config change the allowance starts again from the
    /// configured one: a 1.7 s history does not reject a 5 s cold start of
    /// the upgraded engine.
    #[test]
    fn a_changed_engine_starts_from_the_configured_allowance() {
        let h = samples(&[1_700, 1_700, 1_700], "old");
        let a = cold_allowance(&h, "new", 2.0, 30_000, 1_000);
        match &a {
            ColdAllowance::Configured { ms: 30_000, why } => {
                assert!(
                    why.starts_with("the engine or its config changed since operation op-0"),
                    "{why}"
                )
            }
            other => panic!("{other:?}"),
        }
        let p = ProbePolicy {
            cold_allowance: a,
            ..policy()
        };
        assert_eq!(
            judge(&pair_ready(), &[ok(5_000), ok(300), ok(300)], &p).kind,
            VerdictKind::HealthyAfterColdStart
        );
    }

    /// Without a restart there is no cold start to excuse a slow first probe.
    #[test]
    fn verification_has_no_cold_start() {
        let p = ProbePolicy {
            cold_start_possible: false,
            ..policy()
        };
        let v = judge(&[], &[ok(1_710), ok(600), ok(450)], &p);
        assert_eq!(v.kind, VerdictKind::OverBudget, "{v:?}");
        assert!(v.reasons[0].starts_with("probe 1 took 1.71 s, over the 1.00 s warm budget"));
    }

    /// Health 200 on every unit is reported as evidence when generation fails.
    #[test]
    fn shallow_health_is_named_as_evidence() {
        let v = judge(&pair_ready(), &[timeout(120_000)], &policy());
        assert!(
            v.reasons.last().unwrap().starts_with("every unit answered health 200"),
            "{v:?}"
        );
    }

    fn observation() -> impl Strategy<Value = ProbeObservation> {
        prop_oneof![
            6 => (1u64..200_000).prop_map(ok),
            1 => (1u64..200_000).prop_map(timeout),
            1 => Just(error("http 500")),
        ]
    }

    fn series() -> impl Strategy<Value = Vec<ProbeObservation>> {
        prop::collection::vec(observation(), 1..8)
    }

    proptest! {
        /// Property: no series containing a timeout or an error is ever healthy.
        #[test]
        fn prop_a_failure_is_never_healthy(mut probes in series(), at in 0usize..8, t in 1u64..200_000, err in any::<bool>()) {
            let at = at.min(probes.len());
            probes.insert(at, if err { error("x") } else { timeout(t) });
            let v = judge(&pair_ready(), &probes, &policy());
            prop_assert!(!v.kind.is_healthy(), "{:?} -> {:?}", probes, v);
        }

        /// Property: a series that never reaches the warm budget is never healthy.
        #[test]
        fn prop_never_warm_is_never_healthy(lat in prop::collection::vec(1_001u64..200_000, 1..8)) {
            let probes: Vec<_> = lat.into_iter().map(ok).collect();
            prop_assert!(!kind(&probes).is_healthy());
        }

        /// Property: a healthy verdict after a restart means at most the first
        /// answer was slow, it was within the allowance, and the series ends
        /// with `warm_probes` warm answers.
        #[test]
        fn prop_healthy_obeys_the_warm_up_model(probes in series()) {
            let v = judge(&pair_ready(), &probes, &policy());
            if v.kind.is_healthy() {
                let lat: Vec<u64> = probes.iter().map(|p| p.latency().expect("all answered")).collect();
                prop_assert!(lat[0] <= 30_000);
                prop_assert!(lat[1..].iter().all(|&l| l <= 1_000));
                prop_assert!(lat.len() >= 2 && lat[lat.len() - 2..].iter().all(|&l| l <= 1_000));
                prop_assert_eq!(v.kind == VerdictKind::Healthy, lat[0] <= 1_000);
            }
        }

        /// Property: a second answer slower than the warm budget never passes
        /// as cold start (a rise, an equal-slow one, a second slow one).
        #[test]
        fn prop_second_slow_answer_rejects(first in 1_001u64..30_000, second in 1_001u64..200_000, rest in prop::collection::vec(1u64..1_000, 0..5)) {
            let mut probes = vec![ok(first), ok(second)];
            probes.extend(rest.into_iter().map(ok));
            let k = kind(&probes);
            prop_assert!(matches!(k, VerdictKind::ColdStartRejected | VerdictKind::OverBudget), "{:?}", k);
        }

        /// Property: the history-measured allowance never exceeds the configured
        /// one, and never falls below the warm budget.
        #[test]
        fn prop_allowance_is_bounded(firsts in prop::collection::vec(1u64..1_000_000, 0..30), configured in 1_000u64..100_000) {
            let a = cold_allowance(&samples(&firsts, "f"), "f", 2.0, configured, 1_000);
            prop_assert!(a.ms() <= configured && a.ms() >= 1_000);
        }

        /// Property: no verdict kind is reached without at least one reason.
        #[test]
        fn prop_every_verdict_has_a_reason(probes in series(), possible in any::<bool>()) {
            let p = ProbePolicy { cold_start_possible: possible, ..policy() };
            prop_assert!(!judge(&pair_ready(), &probes, &p).reasons.is_empty());
        }
    }
}
