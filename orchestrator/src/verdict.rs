//! Turns the evidence of a co-restart into a verdict.
//!
//! This is the judgement half of DESIGN.md 3: it never does I/O and never
//! reads a clock, so every incident in `INCIDENTS.md` is a unit test with the
//! incident's own numbers. The rules it enforces:
//!
//! - Readiness means generation. A unit that answered health 200 but whose
//!   generation check never passed is `wedged`, not healthy (INCIDENTS row 3).
//! - "Cold start" is a hypothesis with a test (INCIDENTS row 2): only the first
//!   probe may be slow, and only up to the cold allowance; later probes must
//!   not get slower; they must reach the warm budget within the probe series;
//!   a timeout is never cold start.

use std::fmt;

use serde::{Deserialize, Serialize};

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
    /// Generation works but a later probe is over the warm budget.
    OverBudget,
    /// Something listens and answers health, but generation does not happen.
    Wedged,
    /// A unit did not start, exited, or could not be reached.
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
}

/// One end-to-end probe through the router.
#[derive(Debug, Clone, PartialEq)]
pub enum ProbeObservation {
    Ok { latency_ms: u64, tokens: u32 },
    Timeout { after_ms: u64 },
    Error { message: String },
}

/// Where the cold allowance came from, so a rejection can cite it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum ColdAllowance {
    /// No history: the pair's configured allowance.
    Configured { ms: u64 },
    /// Measured on this pair: the slowest first probe of earlier healthy
    /// restarts, times the configured margin.
    Measured {
        ms: u64,
        first_probe_ms: u64,
        operation_id: String,
    },
}

impl ColdAllowance {
    pub fn ms(&self) -> u64 {
        match self {
            Self::Configured { ms } | Self::Measured { ms, .. } => *ms,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Configured { ms } => {
                format!("the configured cold-start allowance ({})", secs(*ms))
            }
            Self::Measured {
                ms,
                first_probe_ms,
                operation_id,
            } => format!(
                "this pair's measured cold start ({} in operation {operation_id}; allowance {})",
                secs(*first_probe_ms),
                secs(*ms)
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
}

/// Formats milliseconds the way the incident reports quote them ("17.9 s").
pub fn secs(ms: u64) -> String {
    if ms < 10_000 {
        format!("{:.2} s", ms as f64 / 1000.0)
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

/// Judges a co-restart from its start-ups (in restart order) and its
/// end-to-end probes (in sequence order, probe 1 first).
pub fn judge(startups: &[UnitStartup], probes: &[ProbeObservation], policy: &ProbePolicy) -> Verdict {
    if let Some(v) = judge_startups(startups) {
        return v;
    }
    let mut v = judge_probes(probes, policy);
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

/// Derives the cold allowance from evidence when there is some: the slowest
/// first probe of this pair's earlier healthy restarts (`history`: operation
/// id and first-probe latency), times `margin`, never below the warm budget.
/// Only without history does the configured allowance apply.
pub fn cold_allowance(
    history: &[(String, u64)],
    margin: f64,
    configured_ms: u64,
    warm_budget_ms: u64,
) -> ColdAllowance {
    match history.iter().max_by_key(|(_, ms)| *ms) {
        None => ColdAllowance::Configured { ms: configured_ms },
        Some((op, first)) => ColdAllowance::Measured {
            ms: ((*first as f64 * margin).ceil() as u64).max(warm_budget_ms),
            first_probe_ms: *first,
            operation_id: op.clone(),
        },
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
    match first {
        ProbeObservation::Ok { latency_ms, .. } if *latency_ms <= warm => judge_warm_series(probes, warm),
        _ if !policy.cold_start_possible => judge_warm_series(probes, warm),
        _ => judge_cold_start(probes, policy),
    }
}

/// The first probe was within the warm budget: every later one must be too.
fn judge_warm_series(probes: &[ProbeObservation], warm: u64) -> Verdict {
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
            ProbeObservation::Ok { .. } => {}
            ProbeObservation::Timeout { after_ms } => {
                reasons.push(format!(
                    "probe {seq} timed out after {}: generation stalled after answering before",
                    secs(*after_ms)
                ));
                kind = VerdictKind::Wedged;
            }
            ProbeObservation::Error { message } => {
                reasons.push(format!("probe {seq} failed: {message}"));
                if kind != VerdictKind::Wedged {
                    kind = VerdictKind::Failed;
                }
            }
        }
    }
    if kind == VerdictKind::Healthy {
        let max = probes.iter().filter_map(ok_latency).max().unwrap_or(0);
        reasons.push(format!(
            "{} probes through the router, slowest {}, all within the {} warm budget",
            probes.len(),
            secs(max),
            secs(warm)
        ));
    }
    Verdict { kind, reasons }
}

/// The first probe was slow or failed: test the cold-start hypothesis.
fn judge_cold_start(probes: &[ProbeObservation], policy: &ProbePolicy) -> Verdict {
    let warm = policy.warm_budget_ms;
    let allowance = policy.cold_allowance.ms();
    let mut reasons = Vec::new();

    if let ProbeObservation::Ok { latency_ms, .. } = probes[0]
        && latency_ms > allowance
    {
        reasons.push(format!(
            "probe 1 took {}, above {}",
            secs(latency_ms),
            policy.cold_allowance.describe()
        ));
    }
    // Warm-up makes latency fall: each probe must be no slower than the one
    // before it (compared between consecutive answered probes). Jitter among
    // probes that are already within the warm budget is not a rise.
    for i in 1..probes.len() {
        if let (Some(prev), Some(cur)) = (ok_latency(&probes[i - 1]), ok_latency(&probes[i]))
            && cur > prev
            && cur > warm
        {
            reasons.push(format!(
                "probe {} took {}, slower than probe {} ({}): warm-up makes latency fall, not rise",
                i + 1,
                secs(cur),
                i,
                secs(prev)
            ));
        }
    }
    reasons.extend(failure_reasons(probes, true));
    // Convergence: some probe reaches the warm budget, and none after it leaves it.
    match probes.iter().position(|p| ok_latency(p).is_some_and(|l| l <= warm)) {
        None => reasons.push(format!(
            "no convergence: {} probes, none within the {} budget",
            probes.len(),
            secs(warm)
        )),
        Some(k) => {
            for (j, p) in probes.iter().enumerate().skip(k + 1) {
                if let Some(l) = ok_latency(p)
                    && l > warm
                {
                    reasons.push(format!(
                        "probe {} took {} after probe {} had reached the {} budget",
                        j + 1,
                        secs(l),
                        k + 1,
                        secs(warm)
                    ));
                }
            }
        }
    }

    if reasons.is_empty() {
        let first = ok_latency(&probes[0]).unwrap_or(0);
        let k = probes
            .iter()
            .position(|p| ok_latency(p).is_some_and(|l| l <= warm))
            .unwrap_or(0);
        Verdict {
            kind: VerdictKind::HealthyAfterColdStart,
            reasons: vec![format!(
                "probe 1 took {} (within {}); latency fell to {} by probe {}, within the {} warm budget",
                secs(first),
                policy.cold_allowance.describe(),
                secs(ok_latency(&probes[k]).unwrap_or(0)),
                k + 1,
                secs(warm)
            )],
        }
    } else {
        Verdict {
            kind: VerdictKind::ColdStartRejected,
            reasons,
        }
    }
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

fn ok_latency(p: &ProbeObservation) -> Option<u64> {
    match p {
        ProbeObservation::Ok { latency_ms, .. } => Some(*latency_ms),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(ms: u64) -> ProbeObservation {
        ProbeObservation::Ok {
            latency_ms: ms,
            tokens: 8,
        }
    }

    fn timeout(ms: u64) -> ProbeObservation {
        ProbeObservation::Timeout { after_ms: ms }
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
            cold_allowance: ColdAllowance::Configured { ms: 30_000 },
            cold_start_possible: true,
        }
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
            text.contains("probe 2 took 106.4 s, slower than probe 1 (17.9 s): warm-up makes latency fall, not rise"),
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

    /// Row 2 against this pair's measured cold start: 17.9 s is far above a
    /// controlled restart that answered in 1.71 s (seed 000), even if every
    /// later probe were fast.
    #[test]
    fn first_probe_above_measured_cold_start_is_rejected() {
        let p = ProbePolicy {
            warm_budget_ms: 1_000,
            cold_allowance: ColdAllowance::Measured {
                ms: 3_420,
                first_probe_ms: 1_710,
                operation_id: "op-1".into(),
            },
            cold_start_possible: true,
        };
        let v = judge(&pair_ready(), &[ok(17_900), ok(400), ok(300)], &p);
        assert_eq!(v.kind, VerdictKind::ColdStartRejected);
        assert!(
            v.reasons[0]
                .starts_with("probe 1 took 17.9 s, above this pair's measured cold start (1.71 s in operation op-1")
        );
    }

    /// A genuine cold start: slow first probe within the allowance, then
    /// falling to the warm budget.
    #[test]
    fn genuine_cold_start_is_accepted() {
        let v = judge(&pair_ready(), &[ok(1_710), ok(600), ok(450)], &policy());
        assert_eq!(v.kind, VerdictKind::HealthyAfterColdStart, "{v:?}");
        assert!(v.kind.is_healthy());
    }

    /// Falling but never reaching the budget is not a cold start.
    #[test]
    fn falling_without_convergence_is_rejected() {
        let v = judge(
            &pair_ready(),
            &[ok(9_000), ok(5_000), ok(3_000), ok(2_000), ok(1_500)],
            &policy(),
        );
        assert_eq!(v.kind, VerdictKind::ColdStartRejected);
        assert_eq!(v.reasons[0], "no convergence: 5 probes, none within the 1.00 s budget");
        assert_eq!(v.reasons.len(), 2, "{v:?}");
    }

    /// Jitter between warm probes after a genuine cold start is not a rise.
    #[test]
    fn warm_jitter_after_cold_start_is_accepted() {
        let v = judge(
            &pair_ready(),
            &[ok(319), ok(21), ok(22)],
            &ProbePolicy {
                warm_budget_ms: 50,
                cold_allowance: ColdAllowance::Configured { ms: 1_500 },
                cold_start_possible: true,
            },
        );
        assert_eq!(v.kind, VerdictKind::HealthyAfterColdStart, "{v:?}");
    }

    /// A timeout is never cold start, even when the probes around it are fine.
    #[test]
    fn timeout_in_a_cold_series_rejects() {
        let v = judge(&pair_ready(), &[ok(5_000), timeout(20_000), ok(300)], &policy());
        assert_eq!(v.kind, VerdictKind::ColdStartRejected);
        assert!(v.reasons.iter().any(|r| r.contains("probe 2 timed out")));
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
        assert_eq!(
            judge(&pair_ready(), &[ok(300), ok(250)], &policy()).kind,
            VerdictKind::Healthy
        );
        let v = judge(&pair_ready(), &[ok(300), ok(2_500)], &policy());
        assert_eq!(v.kind, VerdictKind::OverBudget);
        assert_eq!(v.reasons[0], "probe 2 took 2.50 s, over the 1.00 s warm budget");
    }

    /// Answering, then stalling: wedged (INCIDENTS row 4's shape).
    #[test]
    fn answer_then_timeout_is_wedged() {
        let v = judge(&pair_ready(), &[ok(300), timeout(240_000)], &policy());
        assert_eq!(v.kind, VerdictKind::Wedged);
    }

    /// A controlled restart that answered fast is evidence: the allowance
    /// comes from it, not from the config.
    #[test]
    fn allowance_comes_from_history_when_there_is_some() {
        assert_eq!(
            cold_allowance(&[], 2.0, 30_000, 1_000),
            ColdAllowance::Configured { ms: 30_000 }
        );
        let h = vec![("op-a".to_string(), 1_710), ("op-b".to_string(), 900)];
        assert_eq!(
            cold_allowance(&h, 2.0, 30_000, 1_000),
            ColdAllowance::Measured {
                ms: 3_420,
                first_probe_ms: 1_710,
                operation_id: "op-a".into()
            }
        );
        // A history of warm first probes never pushes the allowance below the warm budget.
        let h = vec![("op-c".to_string(), 120)];
        assert_eq!(cold_allowance(&h, 2.0, 30_000, 1_000).ms(), 1_000);
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

    /// Property: no series containing a timeout is ever judged healthy.
    #[test]
    fn no_series_with_a_timeout_is_healthy() {
        let lat = [100u64, 900, 1_500, 17_900, 40_000];
        for a in lat {
            for b in lat {
                for pos in 0..3 {
                    let mut probes = vec![ok(a), ok(b)];
                    probes.insert(pos, timeout(60_000));
                    let v = judge(&pair_ready(), &probes, &policy());
                    assert!(!v.kind.is_healthy(), "{probes:?} -> {v:?}");
                }
            }
        }
    }

    /// Property: a probe slower than the one before it never passes as cold start.
    #[test]
    fn rising_latency_never_passes_as_cold_start() {
        for first in [1_500u64, 5_000, 17_900] {
            for rise in [1u64, 500, 88_500] {
                let probes = [ok(first), ok(first + rise), ok(200)];
                let v = judge(&pair_ready(), &probes, &policy());
                assert_eq!(v.kind, VerdictKind::ColdStartRejected, "{probes:?}");
            }
        }
    }
}
