//! Judgement of the post-restart verification suite (issue 4).
//!
//! One short probe series only catches a total failure. The suite exercises
//! each part of a PD pair that can break on its own — the decode's stream
//! (long generation), prefix reuse and a second prefill→decode transfer
//! (multi-turn), the scheduler under load (concurrency), and cancellation
//! mid-prefill (abort storm, INCIDENTS row 4) — and the verdict names the step
//! that failed, with its numbers. Each step is also compared with the pair's
//! last healthy verification, so a step within its absolute budget but far
//! worse than its own history is a warning.
//!
//! Pure: samples, budgets and the baseline in, a [`StepReport`] out.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::verdict::{Verdict, VerdictKind, secs};

/// The suite's steps, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SuiteStep {
    LongGeneration,
    MultiTurn,
    Concurrency,
    AbortStorm,
}

impl SuiteStep {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LongGeneration => "long_generation",
            Self::MultiTurn => "multi_turn",
            Self::Concurrency => "concurrency",
            Self::AbortStorm => "abort_storm",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Self::LongGeneration => "long generation",
            Self::MultiTurn => "multi-turn",
            Self::Concurrency => "concurrency",
            Self::AbortStorm => "abort storm",
        }
    }

    /// The figures compared with the pair's history (smaller is better).
    fn baseline_figures(self) -> &'static [&'static str] {
        match self {
            Self::LongGeneration => &["total_ms", "mean_token_gap_ms"],
            Self::MultiTurn => &["turn2_ttft_ms", "turn2_ms"],
            Self::Concurrency => &["slowest_ms"],
            Self::AbortStorm => &["final_probe_ms"],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    Pass,
    /// Within budget, but far worse than this pair's history (or a weak test).
    Warn,
    Fail,
}

/// One request's raw sample, as the agent measured it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestSample {
    pub index: u32,
    /// `ok`, `timeout` or `error`.
    pub outcome: String,
    pub latency_ms: u64,
    pub ttft_ms: u64,
    pub tokens: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub aborted: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub token_times_ms: Vec<u64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub request_id: String,
}

impl RequestSample {
    fn ok(&self) -> bool {
        self.outcome == "ok"
    }

    fn failure_kind(&self) -> VerdictKind {
        if self.outcome == "timeout" {
            VerdictKind::Wedged
        } else {
            VerdictKind::Failed
        }
    }

    fn describe_failure(&self) -> String {
        if self.error.is_empty() {
            format!("{} after {}", self.outcome, secs(self.latency_ms))
        } else {
            format!("{} after {} ({})", self.outcome, secs(self.latency_ms), self.error)
        }
    }
}

/// A judged step: status, the verdict kind a failure implies, figures, reasons
/// and the raw samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepReport {
    pub step: SuiteStep,
    pub status: StepStatus,
    /// The pair verdict a failure of this step implies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fails_as: Option<VerdictKind>,
    pub figures: BTreeMap<String, u64>,
    pub reasons: Vec<String>,
    pub samples: Vec<RequestSample>,
}

impl StepReport {
    fn new(step: SuiteStep, samples: Vec<RequestSample>) -> Self {
        Self {
            step,
            status: StepStatus::Pass,
            fails_as: None,
            figures: BTreeMap::new(),
            reasons: Vec::new(),
            samples,
        }
    }

    fn fail(&mut self, kind: VerdictKind, reason: String) {
        if self.status != StepStatus::Fail {
            self.fails_as = Some(kind);
        }
        self.status = StepStatus::Fail;
        self.reasons.push(format!("{}: {reason}", self.step.title()));
    }

    fn warn(&mut self, reason: String) {
        if self.status == StepStatus::Pass {
            self.status = StepStatus::Warn;
        }
        self.reasons.push(format!("{}: {reason}", self.step.title()));
    }

    /// One line of figures for the live display.
    pub fn summary(&self) -> String {
        self.figures
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Budgets of the long-generation step.
#[derive(Debug, Clone, Copy)]
pub struct LongGenerationBudget {
    pub max_token_gap_ms: u64,
}

/// Long generation: every gap between tokens (and the silence after the last
/// one, if the stream did not finish) against the budget.
pub fn judge_long_generation(samples: Vec<RequestSample>, budget: LongGenerationBudget) -> StepReport {
    let mut r = StepReport::new(SuiteStep::LongGeneration, samples);
    let Some(s) = r.samples.first().cloned() else {
        r.fail(VerdictKind::Failed, "no sample came back".into());
        return r;
    };
    let times = &s.token_times_ms;
    let (mut max_gap, mut after_token) = (0u64, 0usize);
    for (i, w) in times.windows(2).enumerate() {
        if w[1] - w[0] > max_gap {
            max_gap = w[1] - w[0];
            after_token = i + 1;
        }
    }
    if !s.ok() {
        // The silence that ended the stream counts: that is the freeze.
        let trailing = s.latency_ms.saturating_sub(times.last().copied().unwrap_or(0));
        if trailing > max_gap {
            max_gap = trailing;
            after_token = times.len();
        }
    }
    let mean_gap = if times.len() >= 2 {
        (times[times.len() - 1] - times[0]) / (times.len() as u64 - 1)
    } else {
        0
    };
    r.figures.insert("tokens".into(), u64::from(s.tokens));
    r.figures.insert("ttft_ms".into(), s.ttft_ms);
    r.figures.insert("max_token_gap_ms".into(), max_gap);
    r.figures.insert("mean_token_gap_ms".into(), mean_gap);
    r.figures.insert("total_ms".into(), s.latency_ms);
    if times.is_empty() && !s.ok() {
        r.fail(s.failure_kind(), format!("no token arrived: {}", s.describe_failure()));
    } else if max_gap > budget.max_token_gap_ms {
        let after = if after_token == 0 {
            "before the first token".to_string()
        } else {
            format!("after token {after_token}")
        };
        r.fail(
            VerdictKind::Wedged,
            format!(
                "stream silent for {} {after}; budget {}",
                secs(max_gap),
                secs(budget.max_token_gap_ms)
            ),
        );
    } else if !s.ok() {
        r.fail(s.failure_kind(), s.describe_failure());
    }
    r
}

/// Multi-turn: both turns answer; turn 2's first token within budget.
pub fn judge_multi_turn(samples: Vec<RequestSample>, ttft_budget_ms: u64) -> StepReport {
    let mut r = StepReport::new(SuiteStep::MultiTurn, samples);
    let (Some(t1), Some(t2)) = (r.samples.first().cloned(), r.samples.get(1).cloned()) else {
        r.fail(VerdictKind::Failed, "both turns' samples are needed".into());
        return r;
    };
    r.figures.insert("turn1_ms".into(), t1.latency_ms);
    r.figures.insert("turn2_ttft_ms".into(), t2.ttft_ms);
    r.figures.insert("turn2_ms".into(), t2.latency_ms);
    if !t1.ok() {
        r.fail(t1.failure_kind(), format!("turn 1 failed: {}", t1.describe_failure()));
    } else if !t2.ok() {
        r.fail(
            t2.failure_kind(),
            format!(
                "turn 2 (extending turn 1's conversation) failed: {}",
                t2.describe_failure()
            ),
        );
    } else if t2.ttft_ms > ttft_budget_ms {
        r.fail(
            VerdictKind::OverBudget,
            format!(
                "turn 2's first token after {}; budget {}",
                secs(t2.ttft_ms),
                secs(ttft_budget_ms)
            ),
        );
    }
    r
}

/// Concurrency: none lost, the slowest within budget.
pub fn judge_concurrency(samples: Vec<RequestSample>, slowest_budget_ms: u64) -> StepReport {
    let mut r = StepReport::new(SuiteStep::Concurrency, samples);
    let n = r.samples.len();
    let lost: Vec<&RequestSample> = r.samples.iter().filter(|s| !s.ok()).collect();
    let slowest = r
        .samples
        .iter()
        .filter(|s| s.ok())
        .map(|s| s.latency_ms)
        .max()
        .unwrap_or(0);
    let fastest = r
        .samples
        .iter()
        .filter(|s| s.ok())
        .map(|s| s.latency_ms)
        .min()
        .unwrap_or(0);
    let timeouts = lost.iter().filter(|s| s.outcome == "timeout").count();
    let first_lost = lost.first().map(|s| s.describe_failure());
    let lost_n = lost.len();
    r.figures.insert("requests".into(), n as u64);
    r.figures.insert("lost".into(), lost_n as u64);
    r.figures.insert("slowest_ms".into(), slowest);
    r.figures.insert("fastest_ms".into(), fastest);
    if n == 0 {
        r.fail(VerdictKind::Failed, "no sample came back".into());
    } else if lost_n > 0 {
        let kind = if timeouts > 0 {
            VerdictKind::Wedged
        } else {
            VerdictKind::Failed
        };
        r.fail(
            kind,
            format!(
                "{lost_n} of {n} simultaneous requests lost ({timeouts} timed out; first: {})",
                first_lost.unwrap_or_default()
            ),
        );
    } else if slowest > slowest_budget_ms {
        r.fail(
            VerdictKind::OverBudget,
            format!(
                "slowest of {n} simultaneous requests took {}; budget {}",
                secs(slowest),
                secs(slowest_budget_ms)
            ),
        );
    }
    r
}

/// Abort storm: after requests abandoned mid-prefill, a normal probe must answer.
pub fn judge_abort_storm(samples: Vec<RequestSample>) -> StepReport {
    let mut r = StepReport::new(SuiteStep::AbortStorm, samples);
    let Some(last) = r.samples.last().cloned() else {
        r.fail(VerdictKind::Failed, "no sample came back".into());
        return r;
    };
    let abandoned = r.samples.len().saturating_sub(1);
    let aborted = r.samples.iter().filter(|s| s.aborted).count();
    r.figures.insert("abandoned".into(), abandoned as u64);
    r.figures.insert("aborted_mid_request".into(), aborted as u64);
    r.figures.insert("final_probe_ms".into(), last.latency_ms);
    if !last.ok() {
        r.fail(
            last.failure_kind(),
            format!(
                "after {aborted} requests were abandoned mid-prefill, a normal probe got no answer ({}): an abandoned request holds the engine (INCIDENTS row 4)",
                last.describe_failure()
            ),
        );
    } else if aborted < abandoned {
        r.warn(format!(
            "only {aborted} of {abandoned} requests were still running when abandoned: raise prompt_tokens or lower abort_after_ms for a real test"
        ));
    }
    r
}

/// The pair's last healthy verification's figures for a step.
#[derive(Debug, Clone, PartialEq)]
pub struct Baseline {
    pub operation_id: String,
    pub figures: BTreeMap<String, u64>,
}

/// Warns when a passing step's figure is more than `ratio` times its
/// baseline and worse by more than `floor_ms` (noise on tiny figures is not
/// a regression).
pub fn compare_with_baseline(r: &mut StepReport, baseline: Option<&Baseline>, ratio: f64, floor_ms: u64) {
    let Some(b) = baseline else { return };
    if r.status == StepStatus::Fail {
        return;
    }
    for key in r.step.baseline_figures() {
        let (Some(&now), Some(&then)) = (r.figures.get(*key), b.figures.get(*key)) else {
            continue;
        };
        if then > 0 && now as f64 > ratio * then as f64 && now - then > floor_ms {
            r.warn(format!(
                "{key} {} is {:.1}× this pair's last healthy verification ({}, operation {}); within budget, but worse than its own history",
                secs(now),
                now as f64 / then as f64,
                secs(then),
                b.operation_id
            ));
        }
    }
}

/// The pair's verdict once the suite ran: the probe series' verdict if it was
/// not healthy, else the first failed step's, naming the step.
pub fn overall(series: Verdict, steps: &[StepReport]) -> Verdict {
    if !series.kind.is_healthy() {
        return series;
    }
    let failed: Vec<&StepReport> = steps.iter().filter(|s| s.status == StepStatus::Fail).collect();
    let Some(first) = failed.first() else {
        return series;
    };
    let mut reasons: Vec<String> = failed.iter().flat_map(|s| s.reasons.iter().cloned()).collect();
    reasons.push(format!(
        "short probe series passed ({}): only the suite's {} exposed it",
        series.kind,
        failed.iter().map(|s| s.step.title()).collect::<Vec<_>>().join(", ")
    ));
    Verdict {
        kind: first.fails_as.unwrap_or(VerdictKind::Failed),
        reasons,
    }
}

/// Warnings of passing steps, for the report.
pub fn warnings(steps: &[StepReport]) -> Vec<String> {
    steps
        .iter()
        .filter(|s| s.status == StepStatus::Warn)
        .flat_map(|s| s.reasons.iter().cloned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(times: &[u64], latency_ms: u64, outcome: &str) -> RequestSample {
        RequestSample {
            index: 0,
            outcome: outcome.into(),
            latency_ms,
            ttft_ms: times.first().copied().unwrap_or(0),
            tokens: times.len() as u32,
            error: String::new(),
            aborted: false,
            token_times_ms: times.to_vec(),
            request_id: String::new(),
        }
    }

    fn probe(latency_ms: u64, outcome: &str) -> RequestSample {
        stream(&[], latency_ms, outcome)
    }

    /// A decode that freezes mid-stream after token 12: the silence until the
    /// timeout is the evidence, named with its numbers (the example).
    #[test]
    fn mid_stream_freeze_fails_long_generation() {
        let times: Vec<u64> = (1..=12).map(|i| 100 + i * 20).collect();
        let r = judge_long_generation(
            vec![stream(&times, 340 + 31_200, "timeout")],
            LongGenerationBudget {
                max_token_gap_ms: 5_000,
            },
        );
        assert_eq!(r.status, StepStatus::Fail);
        assert_eq!(r.fails_as, Some(VerdictKind::Wedged));
        assert_eq!(
            r.reasons,
            vec!["long generation: stream silent for 31.2 s after token 12; budget 5.00 s"]
        );
    }

    #[test]
    fn steady_stream_passes() {
        let times: Vec<u64> = (0..256).map(|i| 150 + i * 12).collect();
        let r = judge_long_generation(
            vec![stream(&times, 3_200, "ok")],
            LongGenerationBudget {
                max_token_gap_ms: 1_000,
            },
        );
        assert_eq!(r.status, StepStatus::Pass, "{r:?}");
        assert_eq!(r.figures["tokens"], 256);
        assert_eq!(r.figures["mean_token_gap_ms"], 12);
    }

    #[test]
    fn a_gap_inside_the_stream_counts() {
        let r = judge_long_generation(
            vec![stream(&[10, 20, 9_000, 9_010], 9_020, "ok")],
            LongGenerationBudget {
                max_token_gap_ms: 5_000,
            },
        );
        assert_eq!(r.status, StepStatus::Fail);
        assert!(r.reasons[0].contains("stream silent for 8.98 s after token 2"), "{r:?}");
    }

    /// A broken second transfer: turn 1 answers, turn 2 does not.
    #[test]
    fn multi_turn_names_the_turn() {
        let r = judge_multi_turn(vec![probe(300, "ok"), probe(20_000, "timeout")], 5_000);
        assert_eq!(r.fails_as, Some(VerdictKind::Wedged));
        assert!(r.reasons[0].starts_with("multi-turn: turn 2 (extending turn 1's conversation) failed: timeout"));
        let mut t2 = stream(&[6_000, 6_010], 6_020, "ok");
        t2.index = 1;
        let r = judge_multi_turn(vec![probe(300, "ok"), t2], 5_000);
        assert_eq!(r.fails_as, Some(VerdictKind::OverBudget));
    }

    #[test]
    fn concurrency_counts_lost_requests() {
        let r = judge_concurrency(
            vec![
                probe(100, "ok"),
                probe(30_000, "timeout"),
                probe(120, "ok"),
                probe(5, "error"),
            ],
            10_000,
        );
        assert_eq!(r.fails_as, Some(VerdictKind::Wedged));
        assert!(r.reasons[0].starts_with("concurrency: 2 of 4 simultaneous requests lost (1 timed out"));
        let ok = judge_concurrency(vec![probe(100, "ok"), probe(900, "ok")], 1_000);
        assert_eq!(ok.status, StepStatus::Pass);
        assert_eq!(ok.figures["slowest_ms"], 900);
    }

    /// INCIDENTS row 4 in the gate: abandoned long prompts, then a probe that hangs.
    #[test]
    fn abort_storm_catches_a_leaked_slot() {
        let mut abandoned = probe(2_000, "timeout");
        abandoned.aborted = true;
        let r = judge_abort_storm(vec![abandoned.clone(), abandoned.clone(), probe(120_000, "timeout")]);
        assert_eq!(r.fails_as, Some(VerdictKind::Wedged));
        assert!(r.reasons[0].contains("after 2 requests were abandoned mid-prefill"));
        let r = judge_abort_storm(vec![abandoned, probe(300, "ok")]);
        assert_eq!(r.status, StepStatus::Pass);
    }

    /// A pair slowed 3× against its own history passes its budget but warns,
    /// with both numbers; a tiny absolute difference never warns.
    #[test]
    fn baseline_regression_warns() {
        let times: Vec<u64> = (0..256).map(|i| i * 3).collect();
        let mut r = judge_long_generation(
            vec![stream(&times, 3 * 460, "ok")],
            LongGenerationBudget {
                max_token_gap_ms: 1_000,
            },
        );
        let base = Baseline {
            operation_id: "op-7".into(),
            figures: BTreeMap::from([("total_ms".to_string(), 460), ("mean_token_gap_ms".to_string(), 1)]),
        };
        compare_with_baseline(&mut r, Some(&base), 2.0, 20);
        assert_eq!(r.status, StepStatus::Warn);
        assert_eq!(r.reasons.len(), 1, "the 1 ms → 3 ms gap is under the floor: {r:?}");
        assert!(
            r.reasons[0]
                .contains("total_ms 1.38 s is 3.0× this pair's last healthy verification (0.46 s, operation op-7)")
        );
        let v = overall(
            Verdict {
                kind: VerdictKind::Healthy,
                reasons: vec![],
            },
            std::slice::from_ref(&r),
        );
        assert_eq!(v.kind, VerdictKind::Healthy, "a warning is not a failure");
        assert_eq!(warnings(&[r]).len(), 1);
    }

    #[test]
    fn overall_names_the_failing_step() {
        let ok_series = Verdict {
            kind: VerdictKind::HealthyAfterColdStart,
            reasons: vec!["cold start".into()],
        };
        let failed = judge_concurrency(vec![probe(30_000, "timeout")], 10_000);
        let v = overall(ok_series.clone(), &[failed]);
        assert_eq!(v.kind, VerdictKind::Wedged);
        assert!(v.reasons[0].starts_with("concurrency:"));
        assert!(
            v.reasons
                .last()
                .unwrap()
                .contains("only the suite's concurrency exposed it")
        );
        let bad_series = Verdict {
            kind: VerdictKind::Wedged,
            reasons: vec!["x".into()],
        };
        assert_eq!(overall(bad_series.clone(), &[]), bad_series);
    }
}
