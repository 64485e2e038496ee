//! The repair as data (issue 37): diagnose, restart only what the matrix
//! names, diagnose again with the restart epochs, and so on for at most
//! [`MAX_ROUNDS`] rounds; the whole pair back in its router and verified
//! through it last. The runtime (`ops::machine`) journals each state and
//! each record (must-write); the driver (`super`) probes and runs the
//! children.
//!
//! The rules the step keeps:
//! - a matrix that names engines restarts those engines only, as one child
//!   co-restart out of the pair's router (prefills before decodes, each
//!   gated on generation, their paths to every other engine probed);
//! - a prefill restarted in a round leaves every decode that paired with
//!   it holding its old identity (INCIDENTS row 1): the next diagnosis is
//!   told (an [`Epoch`]), so a decode whose only failing path is to that
//!   prefill is named, not the prefill again;
//! - an engine named again after its own restart, a matrix that does not
//!   localise, or rounds run out: the whole ordered co-restart (the
//!   fallback), said first;
//! - every path answers again: the engines left out of the router are put
//!   back, and the whole pair is verified through it.

use serde::{Deserialize, Serialize};

use crate::config::{KvTransfer, PairConfig};
use crate::ops::journal::JournalError;
use crate::ops::machine::{Effect, Machine, Transition};
use pdwarden_model::judge::paths::{Diagnosis, Epoch, Localisation, PathOutcome};
use pdwarden_model::judge::verdict::VerdictKind;
use pdwarden_model::report::{ChildOperation, OperationReport};

/// Rounds of diagnose → restart before the whole co-restart.
pub const MAX_ROUNDS: usize = 2;

/// What the repair has concluded so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SoFar {
    pub verdict: VerdictKind,
    pub reasons: Vec<String>,
    pub children: Vec<ChildOperation>,
    pub diagnoses: Vec<Diagnosis>,
    /// Every engine restarted by a targeted round ("host/unit").
    pub restarted: Vec<String>,
    /// Prefills restarted, and the decodes that paired with them before.
    pub epochs: Vec<Epoch>,
    /// Rounds granted past [`MAX_ROUNDS`]: a round that restarted only part
    /// of what was named, to keep engines serving, grants the next.
    #[serde(default)]
    pub deferred: usize,
}

impl Default for SoFar {
    fn default() -> Self {
        SoFar {
            verdict: VerdictKind::Healthy,
            reasons: Vec::new(),
            children: Vec::new(),
            diagnoses: Vec::new(),
            restarted: Vec::new(),
            epochs: Vec::new(),
            deferred: 0,
        }
    }
}

/// Where a repair is; journaled on entry (the serde tag is its state label).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Repair {
    /// Every path probed (round 0: before anything is restarted).
    Diagnosing { round: usize, so_far: SoFar },
    /// The engines the matrix named restart, as one child co-restart out
    /// of the router.
    Restarting {
        round: usize,
        units: Vec<String>,
        so_far: SoFar,
    },
    /// The fallback: the whole pair's ordered co-restart, as a child.
    CoRestartingPair { so_far: SoFar },
    /// Every path answers: the engines go back into the router.
    Rejoining { so_far: SoFar },
    /// The whole pair verified through its router, as a child.
    VerifyingPair { so_far: SoFar },
    /// Over.
    Concluded { so_far: SoFar },
}

impl Repair {
    pub fn into_so_far(self) -> SoFar {
        match self {
            Repair::Diagnosing { so_far, .. }
            | Repair::Restarting { so_far, .. }
            | Repair::CoRestartingPair { so_far }
            | Repair::Rejoining { so_far }
            | Repair::VerifyingPair { so_far }
            | Repair::Concluded { so_far } => so_far,
        }
    }
}

/// What a child of the repair is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "child", rename_all = "snake_case")]
pub enum Child {
    /// Round `round`'s restart of `units` only.
    Restart { round: usize, units: Vec<String> },
    /// The whole pair's ordered co-restart (the fallback).
    WholePair,
    /// The whole pair's verification through its router.
    Verify,
}

impl Child {
    pub fn purpose(&self) -> String {
        match self {
            Child::Restart { round, units } => format!("round {}: restart {}", round + 1, units.join(", ")),
            Child::WholePair => "the whole pair's co-restart".into(),
            Child::Verify => "verification".into(),
        }
    }
}

/// What carrying out a [`RepairEffect`] answered.
#[derive(Debug, Clone, PartialEq)]
pub enum RepairEvent {
    Diagnosed(Box<Diagnosis>),
    /// The matrix could not be made (an engine's URL unknown: its agent is
    /// not connected).
    NotDiagnosed(String),
    ChildConcluded {
        child: Child,
        report: Box<OperationReport>,
    },
    /// The journal could not record the child (nothing was sent for it).
    ChildNotBegun {
        error: String,
    },
    /// The engines are back in the router (`put_back`), or why not.
    Rejoined {
        put_back: bool,
        detail: String,
    },
}

/// What the repair asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum RepairEffect {
    /// Probe every path, localising with these epochs.
    Diagnose { epochs: Vec<Epoch> },
    /// Run a child to its conclusion (`ops::child::run` journals the entry
    /// naming it, must-write, before it begins).
    RunChild(Child),
    /// Put every engine of the pair back into its router.
    Rejoin,
    /// Record a diagnosis in the repair (must-write).
    Record(Box<Diagnosis>),
}

/// The journal entry of each diagnosis.
pub const DIAGNOSIS: &str = crate::ops::diagnose::ENTRY;

impl Effect for RepairEffect {
    fn write_ahead(&self) -> Option<(&'static str, serde_json::Value)> {
        match self {
            RepairEffect::Record(d) => Some((DIAGNOSIS, serde_json::to_value(d).ok()?)),
            _ => None,
        }
    }
}

/// The repair of one pair.
pub struct Repairing<'a> {
    pub pair: &'a PairConfig,
    /// An automatic recovery of a confirmed wedge: a matrix whose every
    /// path answers does not clear the pair (the wedge is elsewhere), so it
    /// falls back to the whole co-restart instead of restarting nothing.
    pub recovery: bool,
}

impl Repairing<'_> {
    /// The repair's first transition: the diagnosis before anything stops.
    pub fn start() -> Transition<Repair, RepairEffect> {
        Transition::then(
            Repair::Diagnosing {
                round: 0,
                so_far: SoFar::default(),
            },
            RepairEffect::Diagnose { epochs: Vec::new() },
        )
    }

    fn fallback(mut so_far: SoFar, why: String) -> Transition<Repair, RepairEffect> {
        so_far
            .reasons
            .push(format!("{why}: the whole pair's ordered co-restart instead"));
        Transition::then(
            Repair::CoRestartingPair { so_far },
            RepairEffect::RunChild(Child::WholePair),
        )
    }

    fn conclude(mut so_far: SoFar, verdict: VerdictKind, reason: String) -> Transition<Repair, RepairEffect> {
        so_far.verdict = verdict;
        so_far.reasons.push(reason);
        Transition::to(Repair::Concluded { so_far })
    }

    fn record(so_far: &mut SoFar, child: &Child, report: &OperationReport) {
        so_far.children.push(ChildOperation {
            purpose: child.purpose(),
            operation_id: report.operation_id.clone(),
            kind: report.kind.clone(),
            verdict: report.verdict.as_str().into(),
            reasons: report.reasons.clone(),
            total_ms: report.total_ms,
        });
    }

    fn diagnosed(&self, round: usize, mut so_far: SoFar, d: Diagnosis) -> Transition<Repair, RepairEffect> {
        let record = RepairEffect::Record(Box::new(d.clone()));
        so_far.reasons.push(format!("round {}: {}", round + 1, d.summary()));
        let localisation = d.localisation.clone();
        so_far.diagnoses.push(d);
        let mut t = match localisation {
            Localisation::Healthy if round == 0 && self.recovery => Self::fallback(
                so_far,
                "the watch confirmed a wedge, yet every path answers: no engine is singled out".into(),
            ),
            // Every path answered (and, with a reference, answered right):
            // still not healthy until the pair is verified through its
            // router as a co-restart verifies it (issue 46, item 2).
            Localisation::Healthy if round == 0 => {
                let slow = d_slow(&so_far);
                so_far.reasons.push(format!(
                    "every prefill → decode path answers{slow}: nothing restarted; the pair is verified through its router before it is called healthy"
                ));
                Transition::then(Repair::VerifyingPair { so_far }, RepairEffect::RunChild(Child::Verify))
            }
            Localisation::Healthy => Transition::then(Repair::Rejoining { so_far }, RepairEffect::Rejoin),
            Localisation::NotLocalised { why } => Self::fallback(so_far, format!("not localised ({why})")),
            Localisation::Engines { suspects } => {
                let named: Vec<String> = suspects.into_iter().map(|s| s.unit).collect();
                self.restart_named(round, so_far, named)
            }
        };
        t.effects.insert(0, record);
        t
    }

    /// Round `round` restarts `named` and what holds state about them —
    /// keeping `[pair] repair_keeps_serving` engines of each side in the
    /// router (issue 46, item 4) — or falls back to the whole co-restart.
    fn restart_named(&self, round: usize, so_far: SoFar, named: Vec<String>) -> Transition<Repair, RepairEffect> {
        let units = self.closure(&named);
        let everything = self.pair.prefill.len() + self.pair.decode.len();
        if units.len() == everything {
            return Self::fallback(
                so_far,
                format!(
                    "{} named, but in an SGLang PD pool a decode restarted without the prefills that served it keeps a degraded bootstrap, and a decode keeps a restarted prefill's old identity (INCIDENTS row 1): restarting it takes every engine it paired with, and they with theirs, which here is the whole pool",
                    named.join(", ")
                ),
            );
        }
        if let Some(again) = units.iter().find(|u| so_far.restarted.contains(u)) {
            let why = format!("{again} fails again after its own restart");
            return Self::fallback(so_far, why);
        }
        if round >= MAX_ROUNDS + so_far.deferred {
            let rounds = MAX_ROUNDS + so_far.deferred;
            return Self::fallback(so_far, format!("paths still fail after {rounds} targeted rounds"));
        }
        let plan = self.capacity_plan(&units);
        let Some((now, later, serving)) = plan else {
            return Self::fallback(
                so_far,
                format!(
                    "restarting {} would leave fewer than {} engine(s) of a side serving in the router ([pair] repair_keeps_serving)",
                    units.join(", "),
                    self.pair.repair_keeps_serving
                ),
            );
        };
        let mut so_far = so_far;
        let mut plan_line = format!(
            "round {}: restarts {}; keeps serving {}",
            round + 1,
            now.join(", "),
            serving.join(", ")
        );
        if !later.is_empty() {
            so_far.deferred += 1;
            plan_line.push_str(&format!(
                "; {} wait for the next round (each side keeps {} serving)",
                later.join(", "),
                self.pair.repair_keeps_serving
            ));
        }
        so_far.reasons.push(plan_line);
        let child = Child::Restart {
            round,
            units: now.clone(),
        };
        Transition::then(
            Repair::Restarting {
                round,
                units: now,
                so_far,
            },
            RepairEffect::RunChild(child),
        )
    }

    /// `units` split into what restarts now and what waits, so that each
    /// side keeps `repair_keeps_serving` engines serving; with what serves
    /// meanwhile. `None`: a side would keep none of its engines restartable
    /// (it has no more than the minimum).
    fn capacity_plan(&self, units: &[String]) -> Option<(Vec<String>, Vec<String>, Vec<String>)> {
        let keep = self.pair.repair_keeps_serving;
        let (mut now, mut later) = (Vec::new(), Vec::new());
        for side in [&self.pair.prefill, &self.pair.decode] {
            let side: Vec<String> = side.iter().map(ToString::to_string).collect();
            let named: Vec<&String> = side.iter().filter(|u| units.contains(u)).collect();
            if named.is_empty() {
                continue;
            }
            let room = side.len().saturating_sub(keep);
            if room == 0 {
                return None;
            }
            for (i, u) in named.into_iter().enumerate() {
                if i < room {
                    now.push(u.clone())
                } else {
                    later.push(u.clone())
                }
            }
        }
        let serving = self
            .pair
            .prefill
            .iter()
            .chain(&self.pair.decode)
            .map(ToString::to_string)
            .filter(|u| !now.contains(u))
            .collect();
        Some((now, later, serving))
    }

    /// What must restart with `named` (what holds state about a restarted
    /// engine restarts after it), by `[pair] kv_transfer`. SGLang's
    /// bootstrap (the default, pd-sim's default model, INCIDENTS row 1): a
    /// prefill remembers the decode instances it served, so a decode
    /// restarted alone gets a degraded bootstrap from every prefill of the
    /// pool — they restart too — and each decode caches the prefills'
    /// identities, so a restarted prefill takes every decode of the pool
    /// with it. Behind one router every prefill is paired with every decode,
    /// so any engine's closure is the whole pool. An address-keyed link
    /// (vLLM's MoRIIO): a prefill takes every decode with it (they hold its
    /// old identity: known, not found out from failures), a decode restarts
    /// alone. vLLM's NixlConnector: the named engines only. A peer left
    /// stale anyway the next round's matrix names, told by the epochs.
    pub fn closure(&self, named: &[String]) -> Vec<String> {
        let prefills: Vec<String> = self.pair.prefill.iter().map(ToString::to_string).collect();
        let decodes: Vec<String> = self.pair.decode.iter().map(ToString::to_string).collect();
        let mut set: Vec<String> = named.to_vec();
        let a_prefill = set.iter().any(|u| prefills.contains(u));
        let a_decode = set.iter().any(|u| decodes.contains(u));
        match self.pair.kv_transfer {
            KvTransfer::Sglang if a_prefill || a_decode => {
                set = prefills.iter().chain(&decodes).cloned().collect();
            }
            // Every decode holds a restarted prefill's old identity.
            KvTransfer::Address if a_prefill => set.extend(decodes.iter().cloned()),
            _ => {}
        }
        // In the pair's order: prefills, then decodes.
        prefills
            .into_iter()
            .chain(decodes)
            .filter(|u| set.contains(u))
            .collect()
    }

    /// The epochs a round's restart of `units` leaves: each restarted
    /// prefill, with every decode of the pair that was not restarted with it.
    fn epochs_of(&self, units: &[String]) -> Vec<Epoch> {
        let decodes_before: Vec<String> = self
            .pair
            .decode
            .iter()
            .map(ToString::to_string)
            .filter(|d| !units.contains(d))
            .collect();
        self.pair
            .prefill
            .iter()
            .map(ToString::to_string)
            .filter(|p| units.contains(p))
            .map(|prefill| Epoch {
                prefill,
                decodes_before: decodes_before.clone(),
            })
            .collect()
    }
}

/// ", some slow (…)" when the last diagnosis had slow paths: said, and
/// left to the verification's latency judgement.
fn d_slow(so_far: &SoFar) -> String {
    let Some(d) = so_far.diagnoses.last() else {
        return String::new();
    };
    let slow = d
        .matrix
        .cells
        .iter()
        .flatten()
        .filter(|c| **c == PathOutcome::Slow)
        .count();
    if slow == 0 {
        String::new()
    } else {
        format!(" ({slow} of them slower than the warm budget)")
    }
}

/// Stopped by the journal: failed, said first.
pub fn stopped_by_the_journal(so_far: &mut SoFar, e: &str) {
    so_far.verdict = VerdictKind::Failed;
    so_far
        .reasons
        .insert(0, format!("stopped: the journal could not record a step ({e})"));
}

impl Machine for Repairing<'_> {
    type State = Repair;
    type Event = RepairEvent;
    type Effect = RepairEffect;

    fn label(state: &Repair) -> &'static str {
        match state {
            Repair::Diagnosing { .. } => "diagnosing",
            Repair::Restarting { .. } => "restarting",
            Repair::CoRestartingPair { .. } => "co_restarting_pair",
            Repair::Rejoining { .. } => "rejoining",
            Repair::VerifyingPair { .. } => "verifying_pair",
            Repair::Concluded { .. } => "concluded",
        }
    }

    fn step(&self, state: Repair, event: RepairEvent, _now_ms: u64) -> Transition<Repair, RepairEffect> {
        match (state, event) {
            (Repair::Diagnosing { round, so_far }, RepairEvent::Diagnosed(d)) => self.diagnosed(round, so_far, *d),
            (Repair::Diagnosing { so_far, .. }, RepairEvent::NotDiagnosed(e)) => Self::conclude(
                so_far,
                VerdictKind::Failed,
                format!("the paths could not be probed ({e}); nothing more was restarted"),
            ),
            (
                Repair::Restarting {
                    round,
                    units,
                    mut so_far,
                },
                RepairEvent::ChildConcluded { child, report },
            ) => {
                Self::record(&mut so_far, &child, &report);
                so_far.reasons.push(format!(
                    "round {}: restarted {} only: {} (operation {})",
                    round + 1,
                    units.join(", "),
                    report.verdict.as_str(),
                    report.operation_id
                ));
                // A decode restarted now paired afresh: no earlier epoch
                // holds it (its own restart is the proof; issue 46).
                for e in &mut so_far.epochs {
                    e.decodes_before.retain(|d| !units.contains(d));
                }
                so_far.epochs.retain(|e| !e.decodes_before.is_empty());
                let epochs = self.epochs_of(&units);
                so_far.epochs.extend(epochs);
                so_far.restarted.extend(units);
                // Whatever the child concluded, the paths say what is left.
                let epochs = so_far.epochs.clone();
                Transition::then(
                    Repair::Diagnosing {
                        round: round + 1,
                        so_far,
                    },
                    RepairEffect::Diagnose { epochs },
                )
            }
            (Repair::CoRestartingPair { mut so_far }, RepairEvent::ChildConcluded { child, report }) => {
                Self::record(&mut so_far, &child, &report);
                let verdict = report.verdict;
                let mut t = Self::conclude(
                    so_far,
                    verdict,
                    format!(
                        "the whole pair's co-restart: {} (operation {})",
                        verdict.as_str(),
                        report.operation_id
                    ),
                );
                if let Repair::Concluded { so_far } = &mut t.next
                    && !verdict.is_healthy()
                {
                    so_far
                        .reasons
                        .extend(report.reasons.iter().take(3).map(|r| format!("  {r}")));
                }
                t
            }
            (Repair::Rejoining { mut so_far }, RepairEvent::Rejoined { put_back: true, detail }) => {
                so_far
                    .reasons
                    .push(format!("every engine back in the router: {detail}"));
                Transition::then(Repair::VerifyingPair { so_far }, RepairEffect::RunChild(Child::Verify))
            }
            (
                Repair::Rejoining { so_far },
                RepairEvent::Rejoined {
                    put_back: false,
                    detail,
                },
            ) => Self::conclude(
                so_far,
                VerdictKind::Failed,
                format!("every path answers, but the engines are not back in the router: {detail}"),
            ),
            (Repair::VerifyingPair { mut so_far }, RepairEvent::ChildConcluded { child, report }) => {
                Self::record(&mut so_far, &child, &report);
                let verdict = report.verdict;
                // A failed verification whose matrix (with every path's
                // output held to the reference) names engines: they are the
                // next round's, not the end (issue 46: a decode corrupting
                // its KV answers every probe, but wrong).
                let named = report.diagnoses.last().and_then(|d| match &d.localisation {
                    Localisation::Engines { suspects } => Some((d.clone(), suspects.clone())),
                    _ => None,
                });
                if !verdict.is_healthy()
                    && let Some((d, suspects)) = named
                {
                    let round = so_far.diagnoses.len();
                    so_far.reasons.push(format!(
                        "the whole pair through its router: {} (operation {}); its {}",
                        verdict.as_str(),
                        report.operation_id,
                        d.summary()
                    ));
                    so_far.diagnoses.push(d);
                    let named = suspects.into_iter().map(|s| s.unit).collect();
                    return self.restart_named(round, so_far, named);
                }
                Self::conclude(
                    so_far,
                    verdict,
                    format!(
                        "the whole pair through its router: {} (operation {})",
                        verdict.as_str(),
                        report.operation_id
                    ),
                )
            }
            (state, RepairEvent::ChildNotBegun { error }) => {
                let mut so_far = state.into_so_far();
                stopped_by_the_journal(&mut so_far, &error);
                Transition::to(Repair::Concluded { so_far })
            }
            // An event the state does not wait for: the state stands.
            (state, _) => Transition::to(state),
        }
    }

    fn stopped_by_the_journal(&self, state: Repair, error: &JournalError) -> Repair {
        let mut so_far = state.into_so_far();
        stopped_by_the_journal(&mut so_far, &error.to_string());
        Repair::Concluded { so_far }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use PathOutcome::{Error as E, Ok as O};
    use pdwarden_model::judge::paths::{Matrix, localise};

    /// An operator's repair (`--only-sick`) of `pair`.
    fn operator(pair: &PairConfig) -> Repairing<'_> {
        Repairing { pair, recovery: false }
    }

    /// A NIXL pool: the named engines restart alone.
    fn pair() -> PairConfig {
        let mut p = crate::ops::fake_agent::rig::xpyd_pair(2, 2, "");
        p.kv_transfer = crate::config::KvTransfer::Nixl;
        p
    }

    /// An SGLang pool (the default kv_transfer): any named engine's closure is
    /// the whole pool (INCIDENTS row 1): the whole co-restart at once, said.
    #[test]
    fn in_an_sglang_pool_a_named_engine_takes_the_whole_pool_with_it() {
        let sglang = crate::ops::fake_agent::rig::xpyd_pair(2, 2, "");
        let m = operator(&sglang);
        assert_eq!(m.closure(&["h1/decode-1".into()]).len(), 4);
        let t = m.step(
            Repairing::start().next,
            RepairEvent::Diagnosed(Box::new(diagnosis(vec![vec![O, E], vec![O, E]], &[]))),
            0,
        );
        assert_eq!(t.effects[1], RepairEffect::RunChild(Child::WholePair));
        let Repair::CoRestartingPair { so_far } = &t.next else {
            panic!("{t:?}")
        };
        assert!(
            so_far.reasons.last().unwrap().contains("INCIDENTS row 1"),
            "{:?}",
            so_far.reasons
        );
        // An address-keyed link: a prefill takes the decodes, a decode is alone.
        let mut address = pair();
        address.kv_transfer = KvTransfer::Address;
        let m = operator(&address);
        assert_eq!(
            m.closure(&["h1/prefill-1".into()]),
            ["h1/prefill-1", "h1/decode-0", "h1/decode-1"]
        );
        assert_eq!(m.closure(&["h1/decode-0".into()]), ["h1/decode-0"]);
        // NIXL: the named decode alone.
        let nixl = pair();
        let m = operator(&nixl);
        assert_eq!(m.closure(&["h1/decode-1".into()]), ["h1/decode-1"]);
    }

    fn diagnosis(cells: Vec<Vec<PathOutcome>>, epochs: &[Epoch]) -> Diagnosis {
        let matrix = Matrix {
            prefills: vec!["h1/prefill-0".into(), "h1/prefill-1".into()],
            decodes: vec!["h1/decode-0".into(), "h1/decode-1".into()],
            cells,
            tries: Vec::new(),
        };
        Diagnosis {
            pair: "p".into(),
            localisation: localise(&matrix, epochs, &[]),
            matrix,
            failures: Vec::new(),
            took_ms: 1,
            epochs: epochs.to_vec(),
            blames: Vec::new(),
        }
    }

    fn report(verdict: VerdictKind) -> Box<OperationReport> {
        let mut r: OperationReport = serde_json::from_value(serde_json::json!({
            "operation_id": "child", "pair": "p#repair", "kind": "co_restart", "decode_start_policy": "overlap",
            "verdict": "healthy", "reasons": [], "steps": [], "timeline": [], "probes": [],
            "probe_latency": pdwarden_model::judge::stats::summarize(&[]),
            "warm_budget_ms": 1, "total_ms": 1,
            "cold_allowance": pdwarden_model::judge::verdict::ColdAllowance::Configured { ms: 1, why: String::new() }
        }))
        .unwrap();
        r.verdict = verdict;
        Box::new(r)
    }

    /// A decode failing its column: only it restarts; the next matrix is
    /// clean: back in the router, then the whole pair verified.
    #[test]
    fn a_named_decode_restarts_alone_then_the_pair_is_rejoined_and_verified() {
        let pair = pair();
        let m = operator(&pair);
        let t = Repairing::start();
        let t = m.step(
            t.next,
            RepairEvent::Diagnosed(Box::new(diagnosis(vec![vec![O, E], vec![O, E]], &[]))),
            0,
        );
        assert!(matches!(t.effects[0], RepairEffect::Record(_)));
        assert_eq!(
            t.effects[1],
            RepairEffect::RunChild(Child::Restart {
                round: 0,
                units: vec!["h1/decode-1".into()]
            })
        );
        let child = Child::Restart {
            round: 0,
            units: vec!["h1/decode-1".into()],
        };
        let t = m.step(
            t.next,
            RepairEvent::ChildConcluded {
                child,
                report: report(VerdictKind::Healthy),
            },
            0,
        );
        // A decode restarted: no epoch (no prefill restarted).
        assert_eq!(t.effects, vec![RepairEffect::Diagnose { epochs: Vec::new() }]);
        let t = m.step(
            t.next,
            RepairEvent::Diagnosed(Box::new(diagnosis(vec![vec![O, O], vec![O, O]], &[]))),
            0,
        );
        assert_eq!(t.effects[1], RepairEffect::Rejoin);
        let t = m.step(
            t.next,
            RepairEvent::Rejoined {
                put_back: true,
                detail: String::new(),
            },
            0,
        );
        assert_eq!(t.effects, vec![RepairEffect::RunChild(Child::Verify)]);
        let t = m.step(
            t.next,
            RepairEvent::ChildConcluded {
                child: Child::Verify,
                report: report(VerdictKind::Healthy),
            },
            0,
        );
        let Repair::Concluded { so_far } = t.next else {
            panic!("{t:?}")
        };
        assert_eq!(so_far.verdict, VerdictKind::Healthy);
        assert_eq!(so_far.restarted, ["h1/decode-1"]);
        assert_eq!(so_far.diagnoses.len(), 2);
        assert_eq!(so_far.children.len(), 2);
    }

    /// A restarted prefill leaves an epoch: the decode that then fails only
    /// with it is named in round 2 (not the prefill again).
    #[test]
    fn a_restarted_prefill_leaves_an_epoch_that_names_the_stale_decode_next() {
        let pair = pair();
        let m = operator(&pair);
        let t = m.step(
            Repairing::start().next,
            RepairEvent::Diagnosed(Box::new(diagnosis(vec![vec![E, E], vec![O, O]], &[]))),
            0,
        );
        let RepairEffect::RunChild(child) = t.effects[1].clone() else {
            panic!("{t:?}")
        };
        assert_eq!(
            child,
            Child::Restart {
                round: 0,
                units: vec!["h1/prefill-0".into()]
            }
        );
        let t = m.step(
            t.next,
            RepairEvent::ChildConcluded {
                child,
                report: report(VerdictKind::Failed),
            },
            0,
        );
        let RepairEffect::Diagnose { epochs } = &t.effects[0] else {
            panic!("{t:?}")
        };
        assert_eq!(epochs.len(), 1);
        assert_eq!(epochs[0].prefill, "h1/prefill-0");
        assert_eq!(epochs[0].decodes_before, ["h1/decode-0", "h1/decode-1"]);
        let d = diagnosis(vec![vec![E, O], vec![O, O]], epochs);
        let t = m.step(t.next, RepairEvent::Diagnosed(Box::new(d)), 0);
        assert_eq!(
            t.effects[1],
            RepairEffect::RunChild(Child::Restart {
                round: 1,
                units: vec!["h1/decode-0".into()]
            })
        );
    }

    /// Issue 46, item 3: the epoch never outweighs a child's own proof: a
    /// decode restarted in a round paired afresh, so the epoch of a prefill
    /// restarted before no longer holds it.
    #[test]
    fn a_decode_restarted_in_a_round_leaves_the_earlier_epoch() {
        let pair = pair();
        let m = operator(&pair);
        let mut so_far = SoFar::default();
        so_far.epochs.push(Epoch {
            prefill: "h1/prefill-0".into(),
            decodes_before: vec!["h1/decode-0".into(), "h1/decode-1".into()],
        });
        let units = vec!["h1/decode-0".to_string()];
        let t = m.step(
            Repair::Restarting {
                round: 1,
                units: units.clone(),
                so_far,
            },
            RepairEvent::ChildConcluded {
                child: Child::Restart { round: 1, units },
                report: report(VerdictKind::Healthy),
            },
            0,
        );
        let RepairEffect::Diagnose { epochs } = &t.effects[0] else {
            panic!("{t:?}")
        };
        assert_eq!(epochs.len(), 1);
        assert_eq!(epochs[0].decodes_before, ["h1/decode-1"]);
    }

    /// Not localised, an engine named again after its own restart, rounds
    /// run out: the whole co-restart, said.
    #[test]
    fn what_does_not_localise_falls_back_to_the_whole_co_restart() {
        let pair = pair();
        let m = operator(&pair);
        let t = m.step(
            Repairing::start().next,
            RepairEvent::Diagnosed(Box::new(diagnosis(vec![vec![E, E], vec![E, E]], &[]))),
            0,
        );
        assert_eq!(t.effects[1], RepairEffect::RunChild(Child::WholePair));
        let Repair::CoRestartingPair { so_far } = &t.next else {
            panic!("{t:?}")
        };
        assert!(
            so_far.reasons.last().unwrap().contains("NOT LOCALISED")
                || so_far.reasons.last().unwrap().contains("not localised")
        );

        let mut so_far = SoFar::default();
        so_far.restarted.push("h1/decode-1".into());
        let t = m.step(
            Repair::Diagnosing { round: 1, so_far },
            RepairEvent::Diagnosed(Box::new(diagnosis(vec![vec![O, E], vec![O, E]], &[]))),
            0,
        );
        assert_eq!(t.effects[1], RepairEffect::RunChild(Child::WholePair));
        let t2 = m.step(
            t.next,
            RepairEvent::ChildConcluded {
                child: Child::WholePair,
                report: report(VerdictKind::Healthy),
            },
            0,
        );
        let Repair::Concluded { so_far } = t2.next else {
            panic!()
        };
        assert!(
            so_far
                .reasons
                .iter()
                .any(|r| r.contains("fails again after its own restart")),
            "{:?}",
            so_far.reasons
        );
        assert_eq!(so_far.verdict, VerdictKind::Healthy);

        let t = m.step(
            Repair::Diagnosing {
                round: MAX_ROUNDS,
                so_far: SoFar::default(),
            },
            RepairEvent::Diagnosed(Box::new(diagnosis(vec![vec![O, E], vec![O, E]], &[]))),
            0,
        );
        assert_eq!(t.effects[1], RepairEffect::RunChild(Child::WholePair));
    }

    /// Issue 46, finding 3: every path answering at the start no longer
    /// ends the repair `healthy` with nothing verified: the pair is verified
    /// through its router first; only its verdict concludes.
    #[test]
    fn a_healthy_matrix_restarts_nothing_but_is_verified_through_the_router() {
        let pair = pair();
        let m = operator(&pair);
        let t = m.step(
            Repairing::start().next,
            RepairEvent::Diagnosed(Box::new(diagnosis(vec![vec![O, O], vec![O, PathOutcome::Slow]], &[]))),
            0,
        );
        assert_eq!(t.effects[1], RepairEffect::RunChild(Child::Verify));
        let Repair::VerifyingPair { so_far } = &t.next else {
            panic!("{t:?}")
        };
        assert!(
            so_far
                .reasons
                .last()
                .unwrap()
                .contains("1 of them slower than the warm budget"),
            "{:?}",
            so_far.reasons
        );
        // Slow through the router too: not healthy.
        let t2 = m.step(
            t.next.clone(),
            RepairEvent::ChildConcluded {
                child: Child::Verify,
                report: report(VerdictKind::OverBudget),
            },
            0,
        );
        let Repair::Concluded { so_far } = t2.next else {
            panic!()
        };
        assert_eq!(so_far.verdict, VerdictKind::OverBudget);
        assert!(so_far.restarted.is_empty());
        // Healthy through the router: healthy.
        let t3 = m.step(
            t.next,
            RepairEvent::ChildConcluded {
                child: Child::Verify,
                report: report(VerdictKind::Healthy),
            },
            0,
        );
        let Repair::Concluded { so_far } = t3.next else {
            panic!()
        };
        assert_eq!(so_far.verdict, VerdictKind::Healthy);
        // A recovery of a confirmed wedge does not stop at a clean matrix.
        let m = Repairing {
            pair: &pair,
            recovery: true,
        };
        let t = m.step(
            Repairing::start().next,
            RepairEvent::Diagnosed(Box::new(diagnosis(vec![vec![O, O], vec![O, O]], &[]))),
            0,
        );
        assert_eq!(t.effects[1], RepairEffect::RunChild(Child::WholePair));
    }

    /// A decode corrupting its KV answers every probe (no reference to hold
    /// the matrix's answers to): the verification fails, its matrix with
    /// the output folded in names decode-1, and that is the next round.
    #[test]
    fn a_failed_verification_naming_an_engine_restarts_it() {
        let pair = pair();
        let m = operator(&pair);
        let t = m.step(
            Repairing::start().next,
            RepairEvent::Diagnosed(Box::new(diagnosis(vec![vec![O, O], vec![O, O]], &[]))),
            0,
        );
        let mut failed = report(VerdictKind::Failed);
        failed.diagnoses = vec![diagnosis(
            vec![vec![O, PathOutcome::WrongOutput], vec![O, PathOutcome::WrongOutput]],
            &[],
        )];
        let t = m.step(
            t.next,
            RepairEvent::ChildConcluded {
                child: Child::Verify,
                report: failed,
            },
            0,
        );
        assert_eq!(
            t.effects,
            vec![RepairEffect::RunChild(Child::Restart {
                round: 1,
                units: vec!["h1/decode-1".into()]
            })]
        );
    }

    /// Issue 46, item 4: a round never takes every decode (or prefill) out
    /// of the router: what it cannot restart and keep the minimum serving
    /// waits for the next round; a side with no room: the whole co-restart.
    #[test]
    fn a_round_keeps_the_minimum_of_each_side_serving() {
        let pair = pair();
        let m = operator(&pair);
        let (now, later, serving) = m.capacity_plan(&["h1/decode-0".into(), "h1/decode-1".into()]).unwrap();
        assert_eq!(now, ["h1/decode-0"]);
        assert_eq!(later, ["h1/decode-1"]);
        assert_eq!(serving, ["h1/prefill-0", "h1/prefill-1", "h1/decode-1"]);
        let t = m.restart_named(0, SoFar::default(), vec!["h1/decode-0".into(), "h1/decode-1".into()]);
        assert_eq!(
            t.effects,
            vec![RepairEffect::RunChild(Child::Restart {
                round: 0,
                units: vec!["h1/decode-0".into()]
            })]
        );
        let Repair::Restarting { so_far, .. } = &t.next else {
            panic!()
        };
        assert!(
            so_far.reasons[0].contains("keeps serving h1/prefill-0, h1/prefill-1, h1/decode-1"),
            "{:?}",
            so_far.reasons
        );
        assert!(so_far.reasons[0].contains("h1/decode-1 wait for the next round"));
        // Two decodes, both to keep serving: none can go.
        let mut strict = pair.clone();
        strict.repair_keeps_serving = 2;
        let m = operator(&strict);
        let t = m.restart_named(0, SoFar::default(), vec!["h1/decode-0".into()]);
        assert_eq!(t.effects, vec![RepairEffect::RunChild(Child::WholePair)]);
        let Repair::CoRestartingPair { so_far } = &t.next else {
            panic!()
        };
        assert!(
            so_far.reasons[0].contains("repair_keeps_serving"),
            "{:?}",
            so_far.reasons
        );
    }
}
