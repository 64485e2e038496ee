//! The gate's record types: how it ended, the versions it made, and the
//! report — the `--json` object of `pdwarden gate` and what the journal
//! keeps — with its rendering for people and for `pdwarden history`. They
//! sit below the machine and the driver, which both fill them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::change::ChangeSpec;
use super::measure::Measurement;
use super::output::OutputComparison;
use crate::judge::gate::{self as judge, JudgeReport};
use crate::judge::live::LiveCheck;
use crate::report::{ChildOperation, StepRecord};

/// How a gate ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateVerdict {
    /// Kept: every metric shown not worse beyond its margin, something
    /// shown better beyond it.
    Accepted,
    /// Kept: every metric shown not worse beyond its margin; not a win.
    KeptNotWorse,
    /// Shown worse beyond the benchmark's margin, or the co-restart onto
    /// the change came back over the pair's budgets with the change live:
    /// rolled back.
    RejectedRolledBack,
    /// Neither shown within the budget: rolled back (`on_inconclusive =
    /// "rollback"`, the default).
    InconclusiveRolledBack,
    /// Neither shown within the budget: the change is still live, for a
    /// person to decide (`on_inconclusive = "hold"`).
    InconclusiveHeld,
    /// Rolled back, previous values live, but the pair measures differently
    /// than at its first baseline: it drifted (or something the rollback
    /// does not restore changed), so the knob is not blamed. Look at the
    /// host.
    BaselineMovedRolledBack,
    /// The greedy answer with the change differs from the one before it
    /// beyond a near-tie (issue 34): the knob changes what the model
    /// computes, not only how fast; rolled back (unless `[pair.gate]
    /// allow_output_change = true`). Not measured.
    OutputChangedRolledBack,
    /// The restarted processes did not have the change: rolled back.
    NotLiveRolledBack,
    /// The co-restart onto the change failed: rolled back.
    RestartFailedRolledBack,
    /// A rollback was needed and did not fully succeed: look now.
    RollbackFailed,
    /// The orchestrator restarted mid-gate, after the change may have gone
    /// live: the restarted orchestrator rolled it back (verified live, and
    /// measured back at the journaled baseline where one was taken).
    InterruptedRolledBack,
    /// The journal could not record a step: the gate stopped there and
    /// rolled back what it had changed (config versions restored, previous
    /// values verified live in the processes). What is live otherwise is
    /// `RollbackFailed`.
    JournalFailedRolledBack,
    /// Nothing changed (baseline unhealthy, apply refused, ...).
    Failed,
}

impl GateVerdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::KeptNotWorse => "kept_not_worse",
            Self::RejectedRolledBack => "rejected_rolled_back",
            Self::InconclusiveRolledBack => "inconclusive_rolled_back",
            Self::InconclusiveHeld => "inconclusive_held",
            Self::BaselineMovedRolledBack => "baseline_moved_rolled_back",
            Self::OutputChangedRolledBack => "output_changed_rolled_back",
            Self::NotLiveRolledBack => "not_live_rolled_back",
            Self::RestartFailedRolledBack => "restart_failed_rolled_back",
            Self::RollbackFailed => "rollback_failed",
            Self::InterruptedRolledBack => "interrupted_rolled_back",
            Self::JournalFailedRolledBack => "journal_failed_rolled_back",
            Self::Failed => "failed",
        }
    }

    /// The change is in place, shown not to regress.
    pub fn kept(self) -> bool {
        matches!(self, Self::Accepted | Self::KeptNotWorse)
    }
}

/// One unit's config versions in this gate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VersionRecord {
    pub unit: String,
    pub host: String,
    pub previous: u32,
    pub applied: u32,
    /// The version made current again by the rollback.
    pub restored: Option<u32>,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
}

/// The gate's report: the `--json` object of `pdwarden gate`, and what the
/// journal keeps as the operation's report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateReport {
    pub operation_id: String,
    pub pair: String,
    pub kind: String,
    pub verdict: GateVerdict,
    /// The lines a person acts on, most important first.
    pub reasons: Vec<String>,
    pub change: ChangeSpec,
    pub steps: Vec<StepRecord>,
    pub versions: Vec<VersionRecord>,
    /// The processes before the change (for the touched keys and flags).
    pub before_live: Vec<LiveCheck>,
    pub live: Vec<LiveCheck>,
    pub rollback_live: Vec<LiveCheck>,
    pub operations: Vec<ChildOperation>,
    pub judgement: Option<JudgeReport>,
    /// The rollback's measurement against the baseline.
    pub rollback_judgement: Option<JudgeReport>,
    /// Where the rollback's measurement moved from the first baseline: the
    /// change against it (the A–B–A′ check, [`judge::WorseThanBoth`]).
    #[serde(default)]
    pub change_vs_rollback: Option<JudgeReport>,
    /// Per measurement: requests, failures.
    pub measurements: Vec<MeasurementSummary>,
    /// The greedy answer with the change against the one before it (issue
    /// 34); none where the pair did not come back with the change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<OutputComparison>,
    pub tolerance_pct: f64,
    pub total_ms: u64,
}

/// One look of the benchmark, as the report lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasurementSummary {
    pub label: String,
    pub requests: usize,
    pub failures: usize,
    pub total_ms: u64,
}

impl GateReport {
    /// For people: the verdict, what to do, and the numbers behind it.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let headline = match self.verdict {
            GateVerdict::Accepted => "ACCEPTED: the change is kept; shown not worse anywhere, and better",
            GateVerdict::KeptNotWorse => "KEPT: every metric shown not worse beyond its margin; not a measured win",
            GateVerdict::RejectedRolledBack => {
                "REJECTED: shown worse with the change (beyond the benchmark's margin, or over the pair's own budgets); rolled back"
            }
            GateVerdict::InconclusiveRolledBack => {
                "INCONCLUSIVE: not shown to be within the margin after the whole budget; rolled back"
            }
            GateVerdict::InconclusiveHeld => {
                "INCONCLUSIVE, HELD: not shown either way after the whole budget; the change is STILL LIVE for you to decide"
            }
            GateVerdict::BaselineMovedRolledBack => {
                "BASELINE MOVED: rolled back, but the pair measures differently than before the gate; the knob is not blamed — look at the host"
            }
            GateVerdict::OutputChangedRolledBack => {
                "REJECTED: the change alters the greedy answer (what the model computes, not only how fast); rolled back"
            }
            GateVerdict::NotLiveRolledBack => {
                "FAILED: the restarted processes did not get the change; rolled back, rollback verified"
            }
            GateVerdict::RestartFailedRolledBack => "FAILED: the pair did not come back with the change; rolled back",
            GateVerdict::RollbackFailed => "ROLLBACK FAILED: the pair is not as it was; look now",
            GateVerdict::InterruptedRolledBack => {
                "INTERRUPTED: the orchestrator restarted mid-gate; the change was rolled back, previous values verified live"
            }
            GateVerdict::JournalFailedRolledBack => {
                "STOPPED: the journal could not be written; the change was rolled back, previous values verified live"
            }
            GateVerdict::Failed => "FAILED: nothing was changed",
        };
        let _ = writeln!(s, "gate {} [{}]: {headline}", self.pair, self.change.describe());
        for r in &self.reasons {
            let _ = writeln!(s, "  - {r}");
        }
        // An output change is among the reasons; the same output, or none
        // to compare, is said here.
        if let Some(o) = &self.output
            && !o.changed()
        {
            let _ = writeln!(s, "  {}", o.line());
        }
        for v in &self.versions {
            let restored = v.restored.map(|r| format!(", restored {r}")).unwrap_or_default();
            let _ = writeln!(
                s,
                "  {}: config version {} → {}{restored}",
                v.unit, v.previous, v.applied
            );
        }
        for m in &self.measurements {
            let _ = writeln!(
                s,
                "  measurement {}: {} requests, {} failed, {:.1} s",
                m.label,
                m.requests,
                m.failures,
                m.total_ms as f64 / 1000.0
            );
        }
        let _ = writeln!(
            s,
            "  operation {} ({:.1} s); `pdwarden history {}` keeps every number",
            self.operation_id,
            self.total_ms as f64 / 1000.0,
            self.pair
        );
        s
    }
}

/// Extra lines `pdwarden history` prints under a gate: the change, the
/// versions and every comparison's numbers.
pub fn history_lines(r: &GateReport) -> Vec<String> {
    let mut out = vec![format!("change: {}", r.change.describe())];
    if let Some(o) = &r.output {
        out.push(o.line());
    }
    for v in &r.versions {
        let restored = v.restored.map(|x| format!(", restored {x}")).unwrap_or_default();
        out.push(format!(
            "{}: config version {} → {}{restored}",
            v.unit, v.previous, v.applied
        ));
    }
    for (label, j) in [
        ("after vs baseline", &r.judgement),
        ("rollback vs baseline", &r.rollback_judgement),
        ("after vs rollback", &r.change_vs_rollback),
    ] {
        if let Some(j) = j {
            out.push(format!("{label}: {:?}", j.judgement));
            for c in &j.comparisons {
                out.push(format!("  {}", judge::describe(c)));
            }
        }
    }
    out
}

impl MeasurementSummary {
    pub fn of(m: &Measurement) -> MeasurementSummary {
        MeasurementSummary {
            label: m.label.clone(),
            requests: m.tally().requests,
            failures: m.failures(),
            total_ms: m.total_ms,
        }
    }
}
