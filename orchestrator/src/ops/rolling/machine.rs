//! The rolling restart as data (issue 33): which sub-pair is running as a
//! child, what the children concluded so far, and one pure step from a
//! child's conclusion to the next child or the roll's end. The runtime
//! (`ops::machine`) journals each state and the record of each child's
//! conclusion (must-write) and runs the children (`ops::child`).
//!
//! The rules the step keeps: sub-pairs run one at a time, in order; the
//! roll stops at the first that is not healthy and back in rotation (the
//! others keep serving, nothing more is touched); the whole pair is
//! verified through its router last; a child the journal could not begin,
//! or a record it could not write, stops the roll and is said first.

use serde::{Deserialize, Serialize};

use super::{ChildConcluded, describe, entry, verdict_of};
use crate::config::PairConfig;
use crate::ops::journal::JournalError;
use crate::ops::machine::{Effect, Machine, Transition};
use pdwarden_model::judge::verdict::VerdictKind;
use pdwarden_model::report::{ChildOperation, OperationReport};

/// What the roll has concluded so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SoFar {
    pub verdict: VerdictKind,
    pub reasons: Vec<String>,
    pub children: Vec<ChildOperation>,
}

impl Default for SoFar {
    fn default() -> Self {
        SoFar {
            verdict: VerdictKind::Healthy,
            reasons: Vec::new(),
            children: Vec::new(),
        }
    }
}

/// Where a roll is; journaled on entry (the serde tag is its state label).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Roll {
    /// Sub-pair `index` is out of rotation, restarting as a child co-restart.
    RollingSubPair { index: usize, so_far: SoFar },
    /// Every sub-pair is back; the whole pair is verified through its router.
    VerifyingPair { so_far: SoFar },
    /// Over: healthy, or stopped (the reasons say where and why).
    Concluded { so_far: SoFar },
}

impl Roll {
    /// The state that runs child `index` (the number of sub-pairs: the
    /// whole pair's verification).
    pub fn running(n: usize, index: usize, so_far: SoFar) -> Self {
        if index < n {
            Roll::RollingSubPair { index, so_far }
        } else {
            Roll::VerifyingPair { so_far }
        }
    }

    /// The child this state runs.
    fn index(&self, n: usize) -> Option<usize> {
        match self {
            Roll::RollingSubPair { index, .. } => Some(*index),
            Roll::VerifyingPair { .. } => Some(n),
            Roll::Concluded { .. } => None,
        }
    }

    pub fn into_so_far(self) -> SoFar {
        match self {
            Roll::RollingSubPair { so_far, .. } | Roll::VerifyingPair { so_far } | Roll::Concluded { so_far } => so_far,
        }
    }
}

/// What carrying out a [`RollEffect`] answered.
#[derive(Debug, Clone, PartialEq)]
pub enum RollEvent {
    /// Child `index` concluded with `report`.
    ChildConcluded { index: usize, report: Box<OperationReport> },
    /// Child `index` could not begin: the journal could not record it
    /// (nothing was sent for it).
    ChildNotBegun { index: usize, error: String },
}

/// What the roll asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum RollEffect {
    /// Run child `index` to its conclusion (`ops::child::run` journals the
    /// entry naming it, must-write, before it begins).
    RunChild { index: usize },
    /// Record a child's conclusion in the roll (a resumed roll reads it).
    Record(ChildConcluded),
}

impl Effect for RollEffect {
    fn write_ahead(&self) -> Option<(&'static str, serde_json::Value)> {
        match self {
            RollEffect::RunChild { .. } => None,
            RollEffect::Record(c) => Some((entry::CHILD_CONCLUDED, serde_json::to_value(c).ok()?)),
        }
    }
}

/// The roll of one pair.
pub struct Rolling<'a> {
    pub pair: &'a PairConfig,
}

impl Rolling<'_> {
    fn n(&self) -> usize {
        self.pair.prefill.len()
    }

    /// Files child `i`'s report into `so_far`: its conclusion as the roll
    /// records it, and whether the roll goes on after it.
    pub fn record(&self, so_far: &mut SoFar, i: usize, report: &OperationReport) -> (ChildConcluded, bool) {
        let n = self.n();
        let child = ChildOperation {
            purpose: if i < n {
                describe(self.pair, i)
            } else {
                "verification".into()
            },
            operation_id: report.operation_id.clone(),
            kind: report.kind.clone(),
            verdict: report.verdict.as_str().into(),
            reasons: report.reasons.clone(),
            total_ms: report.total_ms,
        };
        so_far.children.push(child.clone());
        let concluded = ChildConcluded { index: i, child };
        let healthy = report.verdict.is_healthy();
        if i == n {
            so_far.verdict = report.verdict;
            so_far.reasons.push(format!(
                "the whole pair through its router: {} (operation {})",
                report.verdict.as_str(),
                report.operation_id
            ));
            if !healthy {
                so_far
                    .reasons
                    .extend(report.reasons.iter().take(3).map(|r| format!("  {r}")));
            }
            return (concluded, healthy);
        }
        if healthy {
            so_far.reasons.push(format!(
                "{}: {}, back in rotation (operation {})",
                concluded.child.purpose,
                report.verdict.as_str(),
                report.operation_id
            ));
        } else {
            so_far.verdict = report.verdict;
            self.stopped_at(so_far, i, &concluded.child);
        }
        (concluded, healthy)
    }

    /// The roll stopped at sub-pair `i` (its child's conclusion `child`).
    pub fn stopped_at(&self, so_far: &mut SoFar, i: usize, child: &ChildOperation) {
        let n = self.n();
        so_far.verdict = verdict_of(child)
            .filter(|k| !k.is_healthy())
            .unwrap_or(VerdictKind::Failed);
        so_far.reasons.insert(
            0,
            format!(
                "the roll stopped at {}: {} (operation {}); {}",
                child.purpose,
                child.verdict,
                child.operation_id,
                if i + 1 < n {
                    format!("sub-pairs {}..{} were not restarted and kept serving", i + 2, n)
                } else {
                    "it was the last".into()
                }
            ),
        );
        so_far.reasons.extend(child.reasons.iter().map(|r| format!("  {r}")));
    }
}

/// Stopped by the journal: failed, said first.
pub fn stopped_by_the_journal(so_far: &mut SoFar, e: &str) {
    so_far.verdict = VerdictKind::Failed;
    so_far
        .reasons
        .insert(0, format!("stopped: the journal could not record a step ({e})"));
}

impl Machine for Rolling<'_> {
    type State = Roll;
    type Event = RollEvent;
    type Effect = RollEffect;

    fn label(state: &Roll) -> &'static str {
        match state {
            Roll::RollingSubPair { .. } => "rolling_sub_pair",
            Roll::VerifyingPair { .. } => "verifying_pair",
            Roll::Concluded { .. } => "concluded",
        }
    }

    fn step(&self, state: Roll, event: RollEvent, _now_ms: u64) -> Transition<Roll, RollEffect> {
        let n = self.n();
        let running = state.index(n);
        match event {
            RollEvent::ChildConcluded { index, report } if running == Some(index) => {
                let mut so_far = state.into_so_far();
                let (concluded, go_on) = self.record(&mut so_far, index, &report);
                if go_on && index < n {
                    Transition {
                        next: Roll::running(n, index + 1, so_far),
                        effects: vec![RollEffect::Record(concluded), RollEffect::RunChild { index: index + 1 }],
                    }
                } else {
                    Transition::then(Roll::Concluded { so_far }, RollEffect::Record(concluded))
                }
            }
            RollEvent::ChildNotBegun { index, error } if running == Some(index) => {
                let what = if index < n {
                    describe(self.pair, index)
                } else {
                    "the whole pair's verification".into()
                };
                let mut so_far = state.into_so_far();
                stopped_by_the_journal(&mut so_far, &format!("{what}: {error}"));
                Transition::to(Roll::Concluded { so_far })
            }
            // An answer for a child this state is not running: nothing moves.
            _ => Transition::to(state),
        }
    }

    fn stopped_by_the_journal(&self, state: Roll, error: &JournalError) -> Roll {
        let mut so_far = state.into_so_far();
        stopped_by_the_journal(&mut so_far, &error.to_string());
        Roll::Concluded { so_far }
    }
}

/// Every transition of the roll, walked on a 2P2D pair.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::rolling::tests::pair;

    fn report(id: &str, kind: &str, verdict: VerdictKind) -> OperationReport {
        let mut r: OperationReport = serde_json::from_value(serde_json::json!({
            "operation_id": id, "pair": "p#roll", "kind": kind, "decode_start_policy": "after_prefill_ready",
            "verdict": verdict.as_str(), "reasons": ["a reason"], "steps": [], "timeline": [], "probes": [],
            "attempts": [], "probe_latency": pdwarden_model::judge::stats::summarize(&[]), "suite": [],
            "warnings": [], "engine_counters": [], "router_counters": [], "warm_budget_ms": 1,
            "cold_allowance": {"source": "configured", "ms": 1}, "fingerprint": "", "sub_operations": [],
            "total_ms": 7,
        }))
        .unwrap_or_else(|e| panic!("a report: {e}"));
        r.verdict = verdict;
        r
    }

    fn concluded(index: usize, id: &str, verdict: VerdictKind) -> RollEvent {
        let kind = if index < 2 { "co_restart" } else { "verify" };
        RollEvent::ChildConcluded {
            index,
            report: Box::new(report(id, kind, verdict)),
        }
    }

    /// Healthy all the way: sub-pair 0 → sub-pair 1 → the whole pair →
    /// concluded healthy, each child's conclusion recorded before the next
    /// child runs.
    #[test]
    fn healthy_children_roll_on_to_the_whole_pair_and_conclude() {
        let pair = pair();
        let m = Rolling { pair: &pair };
        let s0 = Roll::running(2, 0, SoFar::default());
        assert_eq!(
            s0,
            Roll::RollingSubPair {
                index: 0,
                so_far: SoFar::default()
            }
        );
        let t = m.step(s0, concluded(0, "c0", VerdictKind::Healthy), 0);
        assert!(matches!(t.next, Roll::RollingSubPair { index: 1, .. }), "{:?}", t.next);
        assert!(
            matches!(&t.effects[..], [RollEffect::Record(c), RollEffect::RunChild { index: 1 }] if c.index == 0 && c.child.operation_id == "c0"),
            "{:?}",
            t.effects
        );
        let t = m.step(t.next, concluded(1, "c1", VerdictKind::HealthyAfterColdStart), 0);
        assert!(matches!(t.next, Roll::VerifyingPair { .. }), "{:?}", t.next);
        assert!(matches!(
            &t.effects[..],
            [RollEffect::Record(_), RollEffect::RunChild { index: 2 }]
        ));
        let t = m.step(t.next, concluded(2, "v", VerdictKind::Healthy), 0);
        let Roll::Concluded { so_far } = &t.next else {
            panic!("{:?}", t.next)
        };
        assert!(matches!(&t.effects[..], [RollEffect::Record(c)] if c.index == 2));
        assert_eq!(so_far.verdict, VerdictKind::Healthy);
        assert_eq!(so_far.children.len(), 3);
        assert!(so_far.reasons[0].contains("sub-pair 1 of 2 (prefill-0 + decode-0): healthy, back in rotation"));
        assert!(so_far.reasons[2].contains("the whole pair through its router: healthy (operation v)"));
        assert_eq!(Rolling::label(&t.next), "concluded");
        // The journaled state reads back as it was.
        let json = serde_json::to_value(&t.next).unwrap();
        assert_eq!(json["state"], "concluded");
        assert_eq!(serde_json::from_value::<Roll>(json).unwrap(), t.next);
    }

    /// A sub-pair that is not healthy stops the roll there: its verdict is
    /// the roll's, said first, with what kept serving.
    #[test]
    fn an_unhealthy_sub_pair_stops_the_roll() {
        let pair = pair();
        let m = Rolling { pair: &pair };
        let t = m.step(
            Roll::running(2, 0, SoFar::default()),
            concluded(0, "c0", VerdictKind::Failed),
            0,
        );
        let Roll::Concluded { so_far } = &t.next else {
            panic!("{:?}", t.next)
        };
        assert!(matches!(&t.effects[..], [RollEffect::Record(_)]), "no next child");
        assert_eq!(so_far.verdict, VerdictKind::Failed);
        assert!(
            so_far.reasons[0].starts_with("the roll stopped at sub-pair 1 of 2")
                && so_far.reasons[0].contains("sub-pairs 2..2 were not restarted and kept serving"),
            "{:?}",
            so_far.reasons
        );
        assert_eq!(so_far.reasons[1], "  a reason");
        // The last sub-pair: "it was the last".
        let t = m.step(
            Roll::running(2, 1, SoFar::default()),
            concluded(1, "c1", VerdictKind::Failed),
            0,
        );
        assert!(t.next.into_so_far().reasons[0].ends_with("it was the last"));
    }

    /// The whole pair's verification that is not healthy: its verdict, and
    /// its first reasons.
    #[test]
    fn an_unhealthy_whole_pair_concludes_with_its_verdict() {
        let pair = pair();
        let m = Rolling { pair: &pair };
        let t = m.step(
            Roll::running(2, 2, SoFar::default()),
            concluded(2, "v", VerdictKind::OverBudget),
            0,
        );
        let so_far = t.next.into_so_far();
        assert_eq!(so_far.verdict, VerdictKind::OverBudget);
        assert_eq!(
            so_far.reasons,
            [
                "the whole pair through its router: over_budget (operation v)",
                "  a reason"
            ]
        );
    }

    /// A child the journal could not begin, and a write of the roll's the
    /// journal could not make, stop it, said first; an answer for another
    /// child moves nothing; a concluded roll stays concluded.
    #[test]
    fn the_journal_stops_the_roll_and_stray_answers_move_nothing() {
        let pair = pair();
        let m = Rolling { pair: &pair };
        let t = m.step(
            Roll::running(2, 1, SoFar::default()),
            RollEvent::ChildNotBegun {
                index: 1,
                error: "disk full".into(),
            },
            0,
        );
        assert!(t.effects.is_empty());
        let so_far = t.next.into_so_far();
        assert_eq!(so_far.verdict, VerdictKind::Failed);
        assert_eq!(
            so_far.reasons[0],
            "stopped: the journal could not record a step (sub-pair 2 of 2 (prefill-1 + decode-1): disk full)"
        );
        let t = m.step(
            Roll::running(2, 2, SoFar::default()),
            RollEvent::ChildNotBegun {
                index: 2,
                error: "disk full".into(),
            },
            0,
        );
        assert!(t.next.into_so_far().reasons[0].contains("the whole pair's verification: disk full"));
        let stray = Roll::running(2, 1, SoFar::default());
        let t = m.step(stray.clone(), concluded(0, "c0", VerdictKind::Healthy), 0);
        assert_eq!((t.next, t.effects), (stray, vec![]));
        let done = Roll::Concluded {
            so_far: SoFar::default(),
        };
        let t = m.step(done.clone(), concluded(2, "v", VerdictKind::Healthy), 0);
        assert_eq!(t.next, done);
        let err = JournalError::from(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            Some("full".into()),
        ));
        let Roll::Concluded { so_far } = m.stopped_by_the_journal(Roll::running(2, 0, SoFar::default()), &err) else {
            panic!("concluded")
        };
        assert!(so_far.reasons[0].starts_with("stopped: the journal could not record a step ("));
        assert_eq!(so_far.verdict, VerdictKind::Failed);
    }
}
