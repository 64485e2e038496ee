//! The change gate as data (issue 33): where a gate is, what it has
//! established so far, and one pure step from what carrying out an effect
//! answered to the next state and what it asks for. `gate/mod.rs` carries
//! the effects out (the agents, the child operations, the benchmark); the
//! runtime (`ops::machine`) journals each state, with its data, before any
//! of its effects (must-write).
//!
//! Why a machine: the gate's decisions — is the pair healthy enough to
//! change, is its baseline precise enough, did the pair come back with the
//! change, is the change live, is it better or worse, another look or a
//! verdict, is the pair back at its baseline after a rollback, does a moved
//! baseline excuse the knob — sat in a driver that also did the I/O, and its
//! evidence in a bag of `Option`s held together by `expect`. Here each state
//! carries what exists at that point (the baseline measurement from the
//! step that measured it on; the judged look with the rollback it caused),
//! and every decision is a transition a unit test walks.
//!
//! Two rules of the journal shape the transitions (DESIGN.md 17):
//!
//! - **A step ends with the journal checked.** Any write of the gate that
//!   failed — a state, a command's write-ahead, or evidence — stops the gate
//!   after the step it happened in: the journal no longer holds what the
//!   gate established, so nothing it measured may keep a change. A step
//!   therefore ends with [`GateEffect::CheckJournal`], which carries the
//!   state that follows; the gate moves on to it only if the journal is
//!   whole, and otherwise stops ([`GateState::Stopped`]) where it was. The
//!   rollback is one step: it undoes the change whatever the journal says,
//!   and is checked when it is over.
//! - **A stop is undone outside the machine.** A stopped gate restores what
//!   it changed whether or not the journal can record it, so that undo is
//!   carried out by the driver once the run has ended, not as states the
//!   journal would have to hold.

use serde::{Deserialize, Serialize};

use super::AgentStepError;
use crate::config::{PairConfig, UnitRef};
use crate::ops::corestart::OperationKind;
use crate::ops::journal::JournalError;
use crate::ops::machine::{Effect, Machine, Transition};
use pdwarden_model::gate::change::ChangeSpec;
use pdwarden_model::gate::config::OnInconclusive;
use pdwarden_model::gate::measure::{Measurement, first_error, metrics};
use pdwarden_model::gate::output::{ChildGolden, OutputComparison, compare_children};
use pdwarden_model::gate::report::{GateVerdict, MeasurementSummary, VersionRecord};
use pdwarden_model::judge::gate::{self as judge, BaselineCheck, JudgePolicy, JudgeReport, Judgement};
use pdwarden_model::judge::golden::GoldenRecord;
use pdwarden_model::judge::live::{self, Expected, LiveCheck, UnitView};
use pdwarden_model::judge::verdict::VerdictKind;
use pdwarden_model::report::ChildOperation;

/// The seed of the judge's bootstrap (fixed: same samples, same intervals).
pub const BOOTSTRAP_SEED: u64 = 0x5eed_9a7e;

/// The steps of a gate, in order: the labels its states are journaled
/// under (`history`'s state), which a gate taken over after a restart reads
/// back — from journals written before the states carried data too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum GateStep {
    /// Journaled, nothing done (the journal's first state of every operation).
    #[serde(rename = "started")]
    Started,
    /// Probes and suite, the processes' facts, and the benchmark, unchanged.
    #[serde(rename = "gate_baseline")]
    Baseline,
    /// New config versions recorded by the agents.
    #[serde(rename = "gate_applying")]
    Applying,
    /// Ordered co-restart onto the new versions.
    #[serde(rename = "gate_restarting")]
    Restarting,
    /// `/proc` of each restarted process against the change.
    #[serde(rename = "gate_verifying_live")]
    VerifyingLive,
    /// The benchmark again.
    #[serde(rename = "gate_measuring")]
    Measuring,
    /// Statistics: keep or roll back.
    #[serde(rename = "gate_judging")]
    Judging,
    /// Previous versions made current again.
    #[serde(rename = "gate_rolling_back")]
    RollingBack,
    /// Ordered co-restart onto the previous versions.
    #[serde(rename = "gate_rollback_restarting")]
    RollbackRestarting,
    /// `/proc` against the values recorded before the change.
    #[serde(rename = "gate_rollback_verifying_live")]
    RollbackVerifyingLive,
    /// The benchmark a third time, against the baseline.
    #[serde(rename = "gate_rollback_measuring")]
    RollbackMeasuring,
    #[serde(rename = "concluded")]
    Concluded,
}

impl GateStep {
    pub const ALL: [GateStep; 12] = [
        Self::Started,
        Self::Baseline,
        Self::Applying,
        Self::Restarting,
        Self::VerifyingLive,
        Self::Measuring,
        Self::Judging,
        Self::RollingBack,
        Self::RollbackRestarting,
        Self::RollbackVerifyingLive,
        Self::RollbackMeasuring,
        Self::Concluded,
    ];

    /// The step a journaled state names (`None`: unknown to this version).
    pub fn parse(state: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == state)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Started => "started",
            Self::Baseline => "gate_baseline",
            Self::Applying => "gate_applying",
            Self::Restarting => "gate_restarting",
            Self::VerifyingLive => "gate_verifying_live",
            Self::Measuring => "gate_measuring",
            Self::Judging => "gate_judging",
            Self::RollingBack => "gate_rolling_back",
            Self::RollbackRestarting => "gate_rollback_restarting",
            Self::RollbackVerifyingLive => "gate_rollback_verifying_live",
            Self::RollbackMeasuring => "gate_rollback_measuring",
            Self::Concluded => "concluded",
        }
    }

    /// The name of the step's record in the report ("rollback-measuring").
    pub fn record_name(self) -> String {
        self.as_str().trim_start_matches("gate_").replace('_', "-")
    }
}

/// What the gate has established so far: carried by every state, it is
/// the evidence of the report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SoFar {
    /// The lines a person acts on, in the order they were found.
    pub reasons: Vec<String>,
    /// Each changed unit's config versions (from the apply on; `restored`
    /// once the rollback made the previous one current again).
    pub versions: Vec<VersionRecord>,
    /// Each target's processes before the change (the baseline's
    /// inspection): what a rollback must bring back.
    pub before_views: Vec<UnitView>,
    /// `before_views` for the touched keys and flags, as the report shows them.
    pub before_live: Vec<LiveCheck>,
    /// The restarted processes against the change.
    pub live: Vec<LiveCheck>,
    /// The processes after the rollback against `before_views`.
    pub rollback_live: Vec<LiveCheck>,
    /// The child operations (verification, co-restarts), concluded.
    pub operations: Vec<ChildOperation>,
    /// One per look of the benchmark.
    pub measurements: Vec<MeasurementSummary>,
    /// The change against the baseline, at the look that decided.
    pub judgement: Option<JudgeReport>,
    /// The pair after the rollback against the baseline, at its last look.
    pub rollback_judgement: Option<JudgeReport>,
    /// The change against the pair after the rollback (A–B–A′), where that
    /// had moved from the first baseline.
    pub change_vs_rollback: Option<JudgeReport>,
    /// The greedy answer of the verification before the change (issue 34):
    /// what the answer with the change is held to.
    #[serde(default)]
    pub baseline_output: Option<ChildGolden>,
    /// The answer of the co-restart onto the change against it.
    #[serde(default)]
    pub output: Option<OutputComparison>,
}

/// Why a gate rolls back: the verdict it concludes with once the rollback
/// is verified, and what that verdict rests on (a moved baseline excuses
/// only a verdict that rested on it: [`when_the_baseline_moved`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "why", rename_all = "snake_case")]
pub enum Why {
    /// The benchmark after the change, judged against the first baseline
    /// (rejected, or inconclusive): `after` all its looks, `judgement` the
    /// look that decided.
    Judged {
        verdict: GateVerdict,
        #[serde(skip)]
        after: Measurement,
        judgement: JudgeReport,
    },
    /// Not the benchmark: the co-restart onto the change failed, or came
    /// back over the budgets the pair met before it; or `/proc` did not
    /// show the change.
    NotMeasured { verdict: GateVerdict },
    /// An orchestrator restarted mid-gate, after the change may have gone
    /// live: this one rolls it back.
    Interrupted,
}

impl Why {
    /// The verdict of a rollback verified and back at its baseline.
    pub fn verdict(&self) -> GateVerdict {
        match self {
            Why::Judged { verdict, .. } | Why::NotMeasured { verdict } => *verdict,
            Why::Interrupted => GateVerdict::InterruptedRolledBack,
        }
    }
}

/// Where a gate is; journaled on entry with its scalars (the label: its
/// [`GateStep`]); the evidence (`so_far`) and the measurements are journaled
/// as they arrive, not again in every state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state")]
pub enum GateState {
    /// Step 1, the pair as it is: verified healthy (a child verification,
    /// where `[pair.gate] verify`), its processes inspected, the benchmark
    /// measured — and measured again while too loose to decide anything, up
    /// to the budget. Nothing is changed if any of it fails.
    #[serde(rename = "gate_baseline")]
    Baseline {
        #[serde(skip)]
        so_far: SoFar,
        /// The looks of the benchmark measured so far.
        looks: u32,
        /// Those looks, as one measurement (none before the first).
        #[serde(skip)]
        measured: Option<Measurement>,
    },
    /// Step 2, new config versions recorded by the agents; a failure
    /// restores the units already changed.
    #[serde(rename = "gate_applying")]
    Applying {
        #[serde(skip)]
        so_far: SoFar,
        #[serde(skip)]
        baseline: Measurement,
    },
    /// Step 3, the ordered co-restart onto the new versions (a child).
    #[serde(rename = "gate_restarting")]
    Restarting {
        #[serde(skip)]
        so_far: SoFar,
        #[serde(skip)]
        baseline: Measurement,
    },
    /// Step 4, `/proc` of each restarted process against the change.
    #[serde(rename = "gate_verifying_live")]
    VerifyingLive {
        #[serde(skip)]
        so_far: SoFar,
        #[serde(skip)]
        baseline: Measurement,
        /// The co-restart came back generating but over its budgets: a
        /// rejection, not measured, once the change is shown live (else it
        /// is not the change that made the pair slow).
        over_budget_with_the_change: bool,
    },
    /// Step 5, look `look` of the benchmark after the change.
    #[serde(rename = "gate_measuring")]
    Measuring {
        #[serde(skip)]
        so_far: SoFar,
        #[serde(skip)]
        baseline: Measurement,
        look: u32,
        /// The looks before this one, as one measurement (none at the first).
        #[serde(skip)]
        after: Option<Measurement>,
    },
    /// Step 6, look `look` judged (`judgement`); what follows is decided
    /// with it and taken once the journal is checked.
    #[serde(rename = "gate_judging")]
    Judging {
        #[serde(skip)]
        so_far: SoFar,
        look: u32,
        judgement: JudgeReport,
    },
    /// Step 7, rolling back: the previous versions made current again.
    #[serde(rename = "gate_rolling_back")]
    RollingBack {
        #[serde(skip)]
        so_far: SoFar,
        why: Why,
        /// The first baseline (none: a gate taken over before it was measured).
        #[serde(skip)]
        baseline: Option<Measurement>,
    },
    /// The ordered co-restart onto the previous versions (a child).
    #[serde(rename = "gate_rollback_restarting")]
    RollbackRestarting {
        #[serde(skip)]
        so_far: SoFar,
        why: Why,
        #[serde(skip)]
        baseline: Option<Measurement>,
    },
    /// `/proc` against the values the processes held before the change.
    #[serde(rename = "gate_rollback_verifying_live")]
    RollbackVerifyingLive {
        #[serde(skip)]
        so_far: SoFar,
        why: Why,
        #[serde(skip)]
        baseline: Option<Measurement>,
    },
    /// Look `look` of the pair after the rollback, against its first
    /// baseline: is it shown back (equivalent), moved, or neither yet?
    #[serde(rename = "gate_rollback_measuring")]
    RollbackMeasuring {
        #[serde(skip)]
        so_far: SoFar,
        why: Why,
        #[serde(skip)]
        baseline: Measurement,
        look: u32,
        /// The looks before this one (none at the first).
        #[serde(skip)]
        again: Option<Measurement>,
    },
    /// Over, with its verdict.
    #[serde(rename = "concluded")]
    Concluded {
        verdict: GateVerdict,
        #[serde(skip)]
        so_far: SoFar,
    },
    /// The journal could not record a step (`failed`, the first write that
    /// failed) while the gate was `at` it: nothing more is carried out, and
    /// the driver undoes what the gate changed. Journaled under the label
    /// of the step it stopped in: a gate taken over from here is concluded
    /// as one interrupted there.
    #[serde(rename = "stopped")]
    Stopped {
        at: GateStep,
        failed: String,
        #[serde(skip)]
        so_far: SoFar,
    },
}

impl GateState {
    /// Which step this is (its label).
    pub fn step(&self) -> GateStep {
        match self {
            GateState::Baseline { .. } => GateStep::Baseline,
            GateState::Applying { .. } => GateStep::Applying,
            GateState::Restarting { .. } => GateStep::Restarting,
            GateState::VerifyingLive { .. } => GateStep::VerifyingLive,
            GateState::Measuring { .. } => GateStep::Measuring,
            GateState::Judging { .. } => GateStep::Judging,
            GateState::RollingBack { .. } => GateStep::RollingBack,
            GateState::RollbackRestarting { .. } => GateStep::RollbackRestarting,
            GateState::RollbackVerifyingLive { .. } => GateStep::RollbackVerifyingLive,
            GateState::RollbackMeasuring { .. } => GateStep::RollbackMeasuring,
            GateState::Concluded { .. } => GateStep::Concluded,
            GateState::Stopped { at, .. } => *at,
        }
    }

    pub fn so_far(&self) -> &SoFar {
        match self {
            GateState::Baseline { so_far, .. }
            | GateState::Applying { so_far, .. }
            | GateState::Restarting { so_far, .. }
            | GateState::VerifyingLive { so_far, .. }
            | GateState::Measuring { so_far, .. }
            | GateState::Judging { so_far, .. }
            | GateState::RollingBack { so_far, .. }
            | GateState::RollbackRestarting { so_far, .. }
            | GateState::RollbackVerifyingLive { so_far, .. }
            | GateState::RollbackMeasuring { so_far, .. }
            | GateState::Concluded { so_far, .. }
            | GateState::Stopped { so_far, .. } => so_far,
        }
    }

    pub fn into_so_far(self) -> SoFar {
        match self {
            GateState::Baseline { so_far, .. }
            | GateState::Applying { so_far, .. }
            | GateState::Restarting { so_far, .. }
            | GateState::VerifyingLive { so_far, .. }
            | GateState::Measuring { so_far, .. }
            | GateState::Judging { so_far, .. }
            | GateState::RollingBack { so_far, .. }
            | GateState::RollbackRestarting { so_far, .. }
            | GateState::RollbackVerifyingLive { so_far, .. }
            | GateState::RollbackMeasuring { so_far, .. }
            | GateState::Concluded { so_far, .. }
            | GateState::Stopped { so_far, .. } => so_far,
        }
    }

    /// Concluded or stopped: no answer moves it.
    pub fn is_final(&self) -> bool {
        matches!(self, GateState::Concluded { .. } | GateState::Stopped { .. })
    }

    /// Whether this state runs a child operation (verification, co-restart).
    fn runs_a_child(&self) -> bool {
        matches!(
            self,
            GateState::Baseline { .. } | GateState::Restarting { .. } | GateState::RollbackRestarting { .. }
        )
    }
}

/// The child operations a gate runs, on `PAIR#gate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildPurpose {
    /// The pair verified before the change (probes and suite).
    Baseline,
    /// The co-restart onto the change.
    Restart,
    /// The co-restart onto the previous versions.
    RollbackRestart,
}

impl ChildPurpose {
    /// As the gate's `child_operation` entries and report name it.
    pub fn as_str(self) -> &'static str {
        match self {
            ChildPurpose::Baseline => "baseline",
            ChildPurpose::Restart => "restart",
            ChildPurpose::RollbackRestart => "rollback_restart",
        }
    }

    pub fn kind(self) -> OperationKind {
        match self {
            ChildPurpose::Baseline => OperationKind::Verify {
                include_abort_storm: false,
            },
            ChildPurpose::Restart | ChildPurpose::RollbackRestart => OperationKind::CoRestart,
        }
    }
}

/// Evidence a step journals (not relied on by a resume: its write failing
/// stops the gate at the step's end, not before).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Evidence {
    Live(Vec<LiveCheck>),
    Judgement(JudgeReport),
    Output(OutputComparison),
}

/// What the gate asks for, carried out by `gate/mod.rs`.
#[derive(Debug, Clone, PartialEq)]
pub enum GateEffect {
    /// Opens the report's record of `step` (journaled and streamed).
    Begin(GateStep),
    /// Closes the record open, with what the step found.
    End(String),
    /// Journals evidence as an entry of `kind`.
    Record { kind: &'static str, evidence: Evidence },
    /// Runs a child operation to its conclusion (`ops::child::run` journals
    /// the entry naming it, must-write, before it begins).
    RunChild(ChildPurpose),
    /// Inspects every target's running processes.
    Inspect,
    /// Records the change as a new config version of every target (each
    /// command's write-ahead journaled, must-write, before it is sent).
    Apply,
    /// Makes each of `versions`' previous version current again (sent even
    /// where its record fails: it puts back a version the journal holds).
    Restore { versions: Vec<VersionRecord> },
    /// Inspects every target and checks it against `expected` (one per
    /// target, in order).
    VerifyLive { expected: Vec<Expected> },
    /// One look of the benchmark through the router, labelled `label`.
    Measure { label: String },
    /// The step is over: on to `then` if the journal holds every write of
    /// the gate so far.
    CheckJournal { then: Box<GateState> },
}

impl Effect for GateEffect {}

/// What carrying out a [`GateEffect`] answered.
#[derive(Debug)]
pub enum GateEvent {
    /// The child operation concluded: its record, its verdict, and what
    /// its report kept of its greedy answer (issue 34; none: it checked no
    /// output).
    ChildConcluded {
        child: ChildOperation,
        verdict: VerdictKind,
        golden: Option<Box<GoldenRecord>>,
    },
    /// The child could not begin: the journal could not record it (nothing
    /// was sent for it).
    ChildNotBegun { error: String },
    /// Every target's processes, or why they could not be read.
    Inspected(Result<Vec<UnitView>, AgentStepError>),
    /// The versions the agents recorded, and the failure that stopped the
    /// apply, if one did (the units after it were not changed).
    Applied {
        versions: Vec<VersionRecord>,
        failed: Option<AgentStepError>,
    },
    /// The versions, `restored` set where the agent made the previous one
    /// current again, and the units where it did not.
    Restored {
        versions: Vec<VersionRecord>,
        failed: Option<AgentStepError>,
    },
    /// Each target checked.
    LiveChecked(Vec<LiveCheck>),
    /// One look of the benchmark.
    Measured(Measurement),
    /// The journal checked at a step's end: `failed`, its first write that
    /// failed, if one did; `then`, the state the step decided on.
    JournalChecked {
        then: Box<GateState>,
        failed: Option<String>,
    },
}

/// `more` added to the looks measured before it, if any.
fn joined(before: Option<Measurement>, more: Measurement) -> Measurement {
    match before {
        Some(mut all) => {
            all.extend(more);
            all
        }
        None => more,
    }
}

/// What a rollback verdict rests on, once the pair measured after the
/// rollback is shown to have moved from its first baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectionBasis {
    /// The change measured against the first baseline alone: a moved
    /// baseline may explain it.
    FirstBaseline,
    /// The change measured worse than the first baseline and than the pair
    /// after the rollback ([`judge::WorseThanBoth`]).
    WorseThanBoth,
    /// Not the benchmark against the baseline: the co-restart's own
    /// budgets (met before the change and again by the rollback's
    /// co-restart), the process's `/proc`, its start, or its greedy answer.
    NotTheBaseline,
}

/// The verdict a gate concludes with when the rollback's measurement has
/// moved from the first baseline: BASELINE MOVED only where the verdict
/// rested on that baseline and nothing else shows the change to blame.
pub fn when_the_baseline_moved(verdict: GateVerdict, basis: RejectionBasis) -> GateVerdict {
    match (verdict, basis) {
        (_, RejectionBasis::WorseThanBoth) => verdict,
        (
            GateVerdict::RejectedRolledBack
            | GateVerdict::NotLiveRolledBack
            | GateVerdict::RestartFailedRolledBack
            | GateVerdict::OutputChangedRolledBack,
            RejectionBasis::NotTheBaseline,
        ) => verdict,
        _ => GateVerdict::BaselineMovedRolledBack,
    }
}

/// The gate of one change on one pair.
pub struct Gating<'a> {
    pub pair: &'a PairConfig,
    pub change: &'a ChangeSpec,
    /// The units changed, in order.
    pub targets: &'a [UnitRef],
    pub policy: JudgePolicy,
    /// Taken over after an orchestrator restart whose gate had sent no
    /// start of any unit: the processes still run the previous config, and
    /// the rollback needs no co-restart (a full reload of every engine).
    pub nothing_restarted: bool,
}

impl<'a> Gating<'a> {
    pub fn new(pair: &'a PairConfig, change: &'a ChangeSpec, targets: &'a [UnitRef]) -> Self {
        Gating {
            policy: JudgePolicy {
                tolerance_pct: pair.gate.tolerance_pct,
                alpha: pair.gate.alpha,
                bootstrap_resamples: pair.gate.bootstrap_resamples,
                seed: BOOTSTRAP_SEED,
                min_effect_ms: pair.gate.min_effect_ms,
                min_effect_max_pct: pair.gate.min_effect_max_pct,
                max_looks: pair.gate.max_looks(),
            },
            pair,
            change,
            targets,
            nothing_restarted: false,
        }
    }

    /// A gate from its first step.
    pub fn start(&self) -> Transition<GateState, GateEffect> {
        self.enter(GateState::Baseline {
            so_far: SoFar::default(),
            looks: 0,
            measured: None,
        })
    }

    /// `next`, with what it asks for on entry: its step's record opened,
    /// and its first effect.
    pub fn enter(&self, next: GateState) -> Transition<GateState, GateEffect> {
        let first = match &next {
            GateState::Baseline { .. } if self.pair.gate.verify => GateEffect::RunChild(ChildPurpose::Baseline),
            GateState::Baseline { .. } => GateEffect::Inspect,
            GateState::Applying { .. } => GateEffect::Apply,
            GateState::Restarting { .. } => GateEffect::RunChild(ChildPurpose::Restart),
            GateState::VerifyingLive { so_far, .. } => GateEffect::VerifyLive {
                expected: self.expected(so_far, false),
            },
            GateState::Measuring { look, .. } => GateEffect::Measure {
                label: format!("after#{look}"),
            },
            GateState::RollingBack { so_far, .. } => GateEffect::Restore {
                versions: so_far.versions.clone(),
            },
            GateState::RollbackRestarting { .. } => GateEffect::RunChild(ChildPurpose::RollbackRestart),
            GateState::RollbackVerifyingLive { so_far, .. } => GateEffect::VerifyLive {
                expected: self.expected(so_far, true),
            },
            GateState::RollbackMeasuring { look, .. } => GateEffect::Measure {
                label: format!("rollback#{look}"),
            },
            // Entered with its look judged; and the ends ask for nothing.
            GateState::Judging { .. } | GateState::Concluded { .. } | GateState::Stopped { .. } => {
                return Transition::to(next);
            }
        };
        Transition {
            effects: vec![GateEffect::Begin(next.step()), first],
            next,
        }
    }

    /// `effects`, then on into `next` without checking the journal (a step
    /// within the rollback, or a step's own next part).
    fn on_to(&self, mut effects: Vec<GateEffect>, next: GateState) -> Transition<GateState, GateEffect> {
        let t = self.enter(next);
        effects.extend(t.effects);
        Transition { next: t.next, effects }
    }

    /// What each target must show: the change (at its applied version), or
    /// after a rollback what its processes held before it (at the version
    /// made current again).
    pub fn expected(&self, so_far: &SoFar, rollback: bool) -> Vec<Expected> {
        let (keys, flags) = (self.change.env_keys(), self.change.flags());
        self.targets
            .iter()
            .enumerate()
            .map(|(i, u)| {
                let version = so_far.versions.iter().find(|v| v.unit == u.unit);
                if rollback {
                    let mut e = so_far
                        .before_views
                        .get(i)
                        .map_or_else(Expected::default, |b| live::expected_from(b, &keys, &flags, None));
                    e.config_version = version.map(|v| v.restored.unwrap_or(v.previous));
                    e
                } else {
                    self.change.expected(version.map_or(0, |v| v.applied))
                }
            })
            .collect()
    }

    /// "KNOB absent, --flag 12" as recorded before the change.
    pub fn before_summary(&self, so_far: &SoFar) -> String {
        let mut parts = Vec::new();
        if let Some(v) = so_far.before_views.first() {
            let e = live::expected_from(v, &self.change.env_keys(), &self.change.flags(), None);
            for (k, val) in &e.env {
                parts.push(match val {
                    Some(x) => format!("{k}={x:?}"),
                    None => format!("{k} absent"),
                });
            }
            for (f, val) in &e.args {
                parts.push(match val {
                    Some(x) => format!("{f} {x:?}"),
                    None => format!("{f} absent"),
                });
            }
        }
        parts.join(", ")
    }

    /// Step 1 on what it asked for.
    fn baseline(
        &self,
        current: GateState,
        mut so_far: SoFar,
        looks: u32,
        measured: Option<Measurement>,
        event: GateEvent,
    ) -> Transition<GateState, GateEffect> {
        let failed = |mut so_far: SoFar, outcome: String, reason: String| {
            so_far.reasons.push(reason);
            end_of_step(
                current.clone(),
                vec![GateEffect::End(outcome)],
                GateState::Concluded {
                    verdict: GateVerdict::Failed,
                    so_far,
                },
            )
        };
        match event {
            GateEvent::ChildConcluded { child, verdict, golden } => {
                so_far.operations.push(child.clone());
                so_far.baseline_output = Some(ChildGolden {
                    operation_id: child.operation_id.clone(),
                    golden: golden.map(|g| *g),
                });
                if !verdict.is_healthy() {
                    return failed(
                        so_far,
                        format!("pair not healthy: {}", verdict.as_str()),
                        format!(
                            "the pair is not healthy before the change ({}: {}); nothing was changed",
                            verdict.as_str(),
                            child.reasons.join("; ")
                        ),
                    );
                }
                Transition::then(
                    GateState::Baseline {
                        so_far,
                        looks,
                        measured,
                    },
                    GateEffect::Inspect,
                )
            }
            GateEvent::Inspected(Err(e)) => failed(
                so_far,
                format!("failed: {e}"),
                format!("cannot read the processes before the change: {e}; nothing was changed"),
            ),
            GateEvent::Inspected(Ok(views)) => {
                let (keys, flags) = (self.change.env_keys(), self.change.flags());
                so_far.before_live = views
                    .iter()
                    .map(|v| live::check(v, &live::expected_from(v, &keys, &flags, None)))
                    .collect();
                so_far.before_views = views;
                // An environment change where no variable can be seen is
                // refused before anything is measured: it could never be
                // confirmed live.
                if !keys.is_empty()
                    && let Some((unit, pid)) = so_far.before_views.iter().find_map(|v| {
                        v.processes
                            .first()
                            .filter(|p| p.environ_blank)
                            .map(|p| (v.unit.clone(), p.pid))
                    })
                {
                    return failed(
                        so_far,
                        format!("refused: {unit}'s environment cannot be read"),
                        format!(
                            "{unit}: /proc/{pid}/environ holds no variable (the process overwrote it, as sglang-router's setproctitle does), so an environment change there can never be confirmed live; name the engines with --units, or change its argv; nothing was changed"
                        ),
                    );
                }
                Transition::then(
                    GateState::Baseline {
                        so_far,
                        looks,
                        measured,
                    },
                    GateEffect::Measure {
                        label: "baseline".into(),
                    },
                )
            }
            GateEvent::Measured(more) => {
                so_far.measurements.push(MeasurementSummary::of(&more));
                let looks = looks + 1;
                let baseline = joined(measured, more);
                if baseline.failures() == 0 && looks < self.policy.max_looks {
                    let loose = judge::imprecise_baseline(&metrics(&baseline, &baseline), self.policy);
                    if !loose.is_empty() {
                        tracing::info!(loose = ?loose, "baseline too loose: measuring more");
                        return Transition::then(
                            GateState::Baseline {
                                so_far,
                                looks,
                                measured: Some(baseline),
                            },
                            GateEffect::Measure {
                                label: "baseline".into(),
                            },
                        );
                    }
                }
                if baseline.failures() > 0 {
                    return failed(
                        so_far,
                        format!("{} benchmark requests failed", baseline.failures()),
                        format!(
                            "{} baseline benchmark requests failed before any change: {}; nothing was changed",
                            baseline.failures(),
                            first_error(&baseline)
                        ),
                    );
                }
                let requests: usize = baseline.cells.iter().map(|c| c.requests.len()).sum();
                end_of_step(
                    current,
                    vec![GateEffect::End(format!("{requests} requests"))],
                    GateState::Applying { so_far, baseline },
                )
            }
            _ => Transition::to(current),
        }
    }

    /// The reason a change that alters the greedy answer is rolled back:
    /// the change, where it is live, and the judge's evidence line.
    fn output_changed(&self, output: &OutputComparison, live_in: &[String]) -> String {
        let (before, after, evidence) = match output {
            OutputComparison::Compared {
                before_operation,
                after_operation,
                check,
                ..
            } => (before_operation.as_str(), after_operation.as_str(), check.line()),
            OutputComparison::NotCompared { why } => ("?", "?", why.clone()),
        };
        format!(
            "OUTPUT CHANGED by the change ({}, live in {}): the greedy answer of the co-restart onto it (operation {after}) is not the one the pair gave before it (operation {before}): {evidence}. The change alters what the model computes, not only how fast: rolled back, not measured (a change meant to alter output is gated with `[pair.gate] allow_output_change = true`)",
            self.change.describe(),
            live_in.join(", "),
        )
    }

    /// Step 7's last part: the verdict once the pair after the rollback is
    /// shown back at its first baseline, moved from it, or neither after
    /// the budget — and, where it moved, whether the change is shown worse
    /// than the pair after the rollback too (A–B–A′).
    fn after_the_rollback(
        &self,
        so_far: &mut SoFar,
        why: &Why,
        check: BaselineCheck,
        report: &JudgeReport,
        look: u32,
        again: &Measurement,
    ) -> GateVerdict {
        let verdict = why.verdict();
        let units: Vec<String> = so_far
            .rollback_live
            .iter()
            .map(|c| {
                format!(
                    "{} pid {} (config version {})",
                    c.unit,
                    c.pid,
                    c.config_version.map_or("?".into(), |v| v.to_string())
                )
            })
            .collect();
        let units = units.join(", ");
        let before = self.before_summary(so_far);
        let tol = self.pair.gate.rollback_tolerance_pct;
        match check {
            BaselineCheck::Back => {
                so_far.reasons.push(format!(
                    "rollback verified: {units} run the previous config again ({before}), and every metric is shown within ±{tol} % of the first baseline",
                ));
                verdict
            }
            BaselineCheck::NotShown => {
                // The comparison whose interval strays furthest past ±margin.
                let loosest = report
                    .comparisons
                    .iter()
                    .max_by(|a, b| {
                        let out =
                            |c: &judge::Comparison| (c.ci_high_pct - c.margin_pct).max(-c.margin_pct - c.ci_low_pct);
                        out(a).total_cmp(&out(b))
                    })
                    .map(judge::describe)
                    .unwrap_or_default();
                so_far.reasons.push(format!(
                    "rolled back: {units} run the previous config again ({before}), but the pair is not shown back within ±{tol} % of its first baseline after {look} look(s): {loosest}",
                ));
                verdict
            }
            BaselineCheck::Moved => {
                let moved = report
                    .comparisons
                    .iter()
                    .filter(|c| matches!(c.finding, judge::Finding::Regression | judge::Finding::Better))
                    .max_by(|a, b| a.change_pct.abs().total_cmp(&b.change_pct.abs()))
                    .map(judge::describe)
                    .unwrap_or_else(|| report.reasons.first().cloned().unwrap_or_default());
                // A–B–A′: the change against the pair after the rollback.
                let both = match why {
                    Why::Judged { after, judgement, .. } => {
                        let vs_again =
                            judge::judge(&metrics(again, after), again.tally(), after.tally(), self.policy, 1);
                        let both = judge::WorseThanBoth::of(judgement, &vs_again);
                        so_far.change_vs_rollback = Some(vs_again);
                        Some(both)
                    }
                    Why::NotMeasured { .. } | Why::Interrupted => None,
                };
                let basis = match &both {
                    Some(b) if b.shown() => RejectionBasis::WorseThanBoth,
                    Some(_) => RejectionBasis::FirstBaseline,
                    None => RejectionBasis::NotTheBaseline,
                };
                let moved_line = format!(
                    "after the rollback ({units} run the previous config again, {before}), the pair measures beyond ±{tol} % of its first baseline: {moved}",
                );
                let concluded = when_the_baseline_moved(verdict, basis);
                if concluded == GateVerdict::BaselineMovedRolledBack {
                    so_far.reasons.insert(
                        0,
                        format!(
                            "BASELINE MOVED: {moved_line}. The measurements after the change cannot be charged to the knob; look at the host (load, thermal, neighbours) before trying again"
                        ),
                    );
                } else if basis == RejectionBasis::WorseThanBoth {
                    let shown = both
                        .as_ref()
                        .and_then(|b| {
                            b.comparisons
                                .iter()
                                .max_by(|x, y| x.change_pct.abs().total_cmp(&y.change_pct.abs()))
                        })
                        .map(|c| format!("against the pair after the rollback, {}", judge::describe(c)))
                        .unwrap_or_else(|| "more requests failed with it than before and after it".into());
                    so_far.reasons.push(format!(
                        "the baseline moved ({moved_line}), but the change is shown worse than the pair after the rollback too ({shown}): a drift from the first baseline to the second would put the change between them, not beyond both, so the knob is blamed"
                    ));
                } else {
                    so_far.reasons.push(format!(
                        "the benchmark moved ({moved_line}); the verdict stands, as it does not rest on that benchmark, but look at the host (load, thermal, neighbours) before trying again"
                    ));
                }
                concluded
            }
        }
    }
}

/// The step is over (`effects` close it): the gate stays in `current`
/// until the journal is checked, then moves on to `then`.
fn end_of_step(current: GateState, mut effects: Vec<GateEffect>, then: GateState) -> Transition<GateState, GateEffect> {
    effects.push(GateEffect::CheckJournal { then: Box::new(then) });
    Transition { next: current, effects }
}

fn rollback_failed(mut so_far: SoFar, reason: String) -> GateState {
    so_far.reasons.push(reason);
    GateState::Concluded {
        verdict: GateVerdict::RollbackFailed,
        so_far,
    }
}

impl Machine for Gating<'_> {
    type State = GateState;
    type Event = GateEvent;
    type Effect = GateEffect;

    fn label(state: &GateState) -> &'static str {
        state.step().as_str()
    }

    fn step(&self, state: GateState, event: GateEvent, _now_ms: u64) -> Transition<GateState, GateEffect> {
        use GateEffect::{End, Record};
        use GateEvent as Ev;
        use GateState as S;
        // Where a step ends, the gate stays here until the journal is checked.
        let current = state.clone();
        match (state, event) {
            // An answer to a gate that is over moves nothing.
            (state, _) if state.is_final() => Transition::to(state),
            (state, Ev::JournalChecked { then, failed }) => match failed {
                Some(failed) => Transition::to(S::Stopped {
                    at: state.step(),
                    failed,
                    so_far: then.into_so_far(),
                }),
                None => self.enter(*then),
            },
            (state, Ev::ChildNotBegun { error }) if state.runs_a_child() => Transition::to(S::Stopped {
                at: state.step(),
                failed: error,
                so_far: state.into_so_far(),
            }),
            (
                S::Baseline {
                    so_far,
                    looks,
                    measured,
                },
                event,
            ) => self.baseline(current, so_far, looks, measured, event),

            // Step 2.
            (S::Applying { mut so_far, baseline }, Ev::Applied { versions, failed }) => {
                so_far.versions = versions;
                match failed {
                    None => {
                        let applied: Vec<String> = so_far
                            .versions
                            .iter()
                            .map(|v| format!("{} v{}→v{}", v.unit, v.previous, v.applied))
                            .collect();
                        end_of_step(
                            current,
                            vec![End(applied.join(", "))],
                            S::Restarting { so_far, baseline },
                        )
                    }
                    // No process was restarted: restoring the units already
                    // changed is all there is to undo.
                    Some(e) => {
                        so_far.reasons.push(format!("applying the change failed: {e}"));
                        let versions = so_far.versions.clone();
                        Transition {
                            next: S::Applying { so_far, baseline },
                            effects: vec![End(format!("failed: {e}")), GateEffect::Restore { versions }],
                        }
                    }
                }
            }
            (S::Applying { mut so_far, .. }, Ev::Restored { versions, failed }) => {
                so_far.versions = versions;
                let then = match failed {
                    Some(r) => rollback_failed(so_far, format!("restoring the previous config versions failed: {r}")),
                    None => S::Concluded {
                        verdict: GateVerdict::Failed,
                        so_far,
                    },
                };
                end_of_step(current, Vec::new(), then)
            }

            // Step 3.
            (S::Restarting { mut so_far, baseline }, Ev::ChildConcluded { child, verdict, golden }) => {
                so_far.operations.push(child.clone());
                let came_back_slow = matches!(verdict, VerdictKind::OverBudget | VerdictKind::ColdStartRejected);
                let mut end = vec![End(verdict.as_str().into())];
                if verdict.is_healthy() || came_back_slow {
                    // The pair came back with the change: its greedy answer
                    // held to the one before it (issue 34); what it found
                    // decides once the change is shown live.
                    let after = ChildGolden {
                        operation_id: child.operation_id.clone(),
                        golden: golden.map(|g| *g),
                    };
                    let output = compare_children(
                        so_far.baseline_output.as_ref(),
                        &after,
                        self.pair.gate.allow_output_change,
                    );
                    end.insert(
                        0,
                        Record {
                            kind: "output_comparison",
                            evidence: Evidence::Output(output.clone()),
                        },
                    );
                    so_far.output = Some(output);
                }
                if verdict.is_healthy() {
                    return end_of_step(
                        current,
                        end,
                        S::VerifyingLive {
                            so_far,
                            baseline,
                            over_budget_with_the_change: false,
                        },
                    );
                }
                so_far.reasons.push(format!(
                    "the co-restart with the change ended {}{}: {}",
                    verdict.as_str(),
                    if came_back_slow {
                        " (the pair came back generating, slower than its budgets, which it met before the change)"
                    } else {
                        ""
                    },
                    child.reasons.join("; ")
                ));
                let then = if came_back_slow {
                    // Rejected once the change is shown live in the slow
                    // processes (else it is not the change that made them slow).
                    S::VerifyingLive {
                        so_far,
                        baseline,
                        over_budget_with_the_change: true,
                    }
                } else {
                    S::RollingBack {
                        so_far,
                        why: Why::NotMeasured {
                            verdict: GateVerdict::RestartFailedRolledBack,
                        },
                        baseline: Some(baseline),
                    }
                };
                end_of_step(current, end, then)
            }

            // Step 4.
            (
                S::VerifyingLive {
                    mut so_far,
                    baseline,
                    over_budget_with_the_change,
                },
                Ev::LiveChecked(checks),
            ) => {
                let not_live: Vec<String> = checks.iter().flat_map(|c| c.problems.clone()).collect();
                so_far.live = checks.clone();
                let record = Record {
                    kind: "live_check",
                    evidence: Evidence::Live(checks),
                };
                let rolling_back = |so_far, verdict| S::RollingBack {
                    so_far,
                    why: Why::NotMeasured { verdict },
                    baseline: Some(baseline.clone()),
                };
                if !not_live.is_empty() {
                    so_far.reasons.push(format!(
                        "the change is not live in the restarted processes: {}",
                        not_live.join("; ")
                    ));
                    if let Some(evidence) = so_far
                        .output
                        .as_ref()
                        .filter(|o| o.changed())
                        .and_then(|o| o.evidence())
                    {
                        so_far.reasons.push(format!(
                            "the greedy answer after the co-restart differs from the one before it too, but with the change not live that is not charged to the change: {evidence}"
                        ));
                    }
                    return end_of_step(
                        current,
                        vec![record, End(format!("not live: {}", not_live.join("; ")))],
                        rolling_back(so_far, GateVerdict::NotLiveRolledBack),
                    );
                }
                let pids: Vec<String> = so_far
                    .live
                    .iter()
                    .map(|c| format!("{} pid {}", c.unit, c.pid))
                    .collect();
                let effects = vec![record, End(format!("live in {}", pids.join(", ")))];
                // The change is live: an output change is the change's.
                let output = so_far.output.clone().filter(OutputComparison::changed);
                if let Some(o) = &output {
                    if o.rejects() {
                        so_far.reasons.insert(0, self.output_changed(o, &pids));
                        let then = rolling_back(so_far, GateVerdict::OutputChangedRolledBack);
                        return end_of_step(current, effects, then);
                    }
                    so_far.reasons.push(o.line());
                }
                let then = if over_budget_with_the_change {
                    rolling_back(so_far, GateVerdict::RejectedRolledBack)
                } else {
                    S::Measuring {
                        so_far,
                        baseline,
                        look: 1,
                        after: None,
                    }
                };
                end_of_step(current, effects, then)
            }

            // Steps 5–6, one look: measured and judged. Another look while
            // inconclusive and within the budget (the judge spends its error
            // over the planned looks, so stopping early is free); else the
            // verdict, and a rollback unless the change stays.
            (
                S::Measuring {
                    mut so_far,
                    baseline,
                    look,
                    after,
                },
                Ev::Measured(more),
            ) => {
                so_far.measurements.push(MeasurementSummary::of(&more));
                let measured = format!("look {look}: {} failed", more.failures());
                let after = joined(after, more);
                let report = judge::judge(
                    &metrics(&baseline, &after),
                    baseline.tally(),
                    after.tally(),
                    self.policy,
                    look,
                );
                let judging = S::Judging {
                    so_far: so_far.clone(),
                    look,
                    judgement: report.clone(),
                };
                let effects = vec![
                    End(measured),
                    GateEffect::Begin(GateStep::Judging),
                    Record {
                        kind: "judgement",
                        evidence: Evidence::Judgement(report.clone()),
                    },
                    End(format!("look {look}: {:?}", report.judgement)),
                ];
                let then = if report.judgement == Judgement::Inconclusive && look < self.policy.max_looks {
                    S::Measuring {
                        so_far,
                        baseline,
                        look: look + 1,
                        after: Some(after),
                    }
                } else {
                    let verdict = match report.judgement {
                        Judgement::Improved => GateVerdict::Accepted,
                        Judgement::NotWorse => GateVerdict::KeptNotWorse,
                        Judgement::Regressed => GateVerdict::RejectedRolledBack,
                        Judgement::Inconclusive => match self.pair.gate.on_inconclusive {
                            OnInconclusive::Rollback => GateVerdict::InconclusiveRolledBack,
                            OnInconclusive::Hold => GateVerdict::InconclusiveHeld,
                        },
                    };
                    // A short report: the largest finding of each kind; the
                    // rest are in `judgement`.
                    so_far.reasons.extend(report.summary());
                    so_far.judgement = Some(report.clone());
                    if verdict == GateVerdict::InconclusiveHeld {
                        so_far.reasons.push(format!(
                            "the change is still live (on_inconclusive = \"hold\"): keep it as it is, or gate it back to the previous values ({}) with `pdwarden gate {}`",
                            self.before_summary(&so_far),
                            self.pair.name,
                        ));
                    }
                    if verdict.kept() || verdict == GateVerdict::InconclusiveHeld {
                        S::Concluded { verdict, so_far }
                    } else {
                        S::RollingBack {
                            so_far,
                            why: Why::Judged {
                                verdict,
                                after,
                                judgement: report,
                            },
                            baseline: Some(baseline),
                        }
                    }
                };
                // Judging is entered as the look is judged (its record opens
                // above), and left once the journal is checked.
                end_of_step(judging, effects, then)
            }

            // Step 7, the rollback: the previous versions, the co-restart
            // onto them, the old values live, and the pair back at its
            // baseline. One step: the journal is checked when it is over.
            (
                S::RollingBack {
                    mut so_far,
                    why,
                    baseline,
                },
                Ev::Restored { versions, failed },
            ) => {
                so_far.versions = versions;
                if let Some(e) = failed {
                    let then = rollback_failed(so_far, format!("ROLLBACK FAILED: restoring the config versions: {e}"));
                    return end_of_step(current, vec![End(format!("failed: {e}"))], then);
                }
                let restored: Vec<String> = so_far
                    .versions
                    .iter()
                    .map(|v| format!("{} v{}", v.unit, v.restored.unwrap_or(v.previous)))
                    .collect();
                let mut effects = vec![End(restored.join(", "))];
                if self.nothing_restarted {
                    // Verified from /proc next, like any rollback.
                    effects.extend([
                        GateEffect::Begin(GateStep::RollbackRestarting),
                        End("not needed: no unit was restarted with the change (none of the gate's co-restarts had sent a start)".into()),
                    ]);
                    so_far.reasons.push(
                        "no unit had been restarted with the change, so the rollback restored the config versions without restarting the pair"
                            .into(),
                    );
                    return self.on_to(effects, S::RollbackVerifyingLive { so_far, why, baseline });
                }
                self.on_to(effects, S::RollbackRestarting { so_far, why, baseline })
            }
            (
                S::RollbackRestarting {
                    mut so_far,
                    why,
                    baseline,
                },
                Ev::ChildConcluded { child, verdict, .. },
            ) => {
                so_far.operations.push(child.clone());
                let end = vec![End(verdict.as_str().into())];
                if !verdict.is_healthy() {
                    let then = rollback_failed(
                        so_far,
                        format!(
                            "ROLLBACK FAILED: the co-restart onto the previous config ended {}: {}",
                            verdict.as_str(),
                            child.reasons.join("; ")
                        ),
                    );
                    return end_of_step(current, end, then);
                }
                self.on_to(end, S::RollbackVerifyingLive { so_far, why, baseline })
            }
            (
                S::RollbackVerifyingLive {
                    mut so_far,
                    why,
                    baseline,
                },
                Ev::LiveChecked(checks),
            ) => {
                let problems: Vec<String> = checks.iter().flat_map(|c| c.problems.clone()).collect();
                so_far.rollback_live = checks.clone();
                let record = Record {
                    kind: "rollback_live_check",
                    evidence: Evidence::Live(checks),
                };
                if !problems.is_empty() {
                    let then = rollback_failed(
                        so_far,
                        format!(
                            "ROLLBACK FAILED: the previous values are not live again: {}",
                            problems.join("; ")
                        ),
                    );
                    return end_of_step(
                        current,
                        vec![record, End(format!("old values not live: {}", problems.join("; ")))],
                        then,
                    );
                }
                let effects = vec![record, End("previous values live".into())];
                match baseline {
                    Some(baseline) => self.on_to(
                        effects,
                        S::RollbackMeasuring {
                            so_far,
                            why,
                            baseline,
                            look: 1,
                            again: None,
                        },
                    ),
                    // A gate taken over before its baseline was measured.
                    None => {
                        so_far.reasons.push(format!(
                            "rollback verified: the previous values are live again ({}); not benchmarked (the gate was interrupted before its baseline was measured)",
                            self.before_summary(&so_far)
                        ));
                        let verdict = why.verdict();
                        end_of_step(current, effects, S::Concluded { verdict, so_far })
                    }
                }
            }
            // The baseline measured again, after the rollback: is the pair
            // shown equivalent to its first baseline (every interval within
            // ±`rollback_tolerance_pct`), one look at a time up to the budget?
            (
                S::RollbackMeasuring {
                    mut so_far,
                    why,
                    baseline,
                    look,
                    again,
                },
                Ev::Measured(more),
            ) => {
                so_far.measurements.push(MeasurementSummary::of(&more));
                let again = joined(again, more);
                let policy = JudgePolicy {
                    tolerance_pct: self.pair.gate.rollback_tolerance_pct,
                    ..self.policy
                };
                let report = judge::judge(
                    &metrics(&baseline, &again),
                    baseline.tally(),
                    again.tally(),
                    policy,
                    look,
                );
                let check = BaselineCheck::of(&report);
                let mut effects = vec![
                    Record {
                        kind: "rollback_judgement",
                        evidence: Evidence::Judgement(report.clone()),
                    },
                    End(format!("look {look}: {}", check.as_str())),
                ];
                if check == BaselineCheck::NotShown && look < policy.max_looks {
                    return self.on_to(
                        effects,
                        S::RollbackMeasuring {
                            so_far,
                            why,
                            baseline,
                            look: look + 1,
                            again: Some(again),
                        },
                    );
                }
                let verdict = self.after_the_rollback(&mut so_far, &why, check, &report, look, &again);
                if let Some(vs_again) = &so_far.change_vs_rollback {
                    effects.push(Record {
                        kind: "change_vs_rollback_judgement",
                        evidence: Evidence::Judgement(vs_again.clone()),
                    });
                }
                so_far.rollback_judgement = Some(report);
                end_of_step(current, effects, S::Concluded { verdict, so_far })
            }

            // An answer this state did not ask for: nothing moves.
            (state, _) => Transition::to(state),
        }
    }

    fn stopped_by_the_journal(&self, state: GateState, error: &JournalError) -> GateState {
        match state {
            // The verdict stands: its conclusion, written next, is kept and
            // retried, and says so if it cannot be written.
            done @ (GateState::Concluded { .. } | GateState::Stopped { .. }) => done,
            state => GateState::Stopped {
                at: state.step(),
                failed: error.to_string(),
                so_far: state.into_so_far(),
            },
        }
    }
}

/// Every transition of the gate, walked on the fake rig's pair (one
/// prefill, one decode, one router; one benchmark cell, three looks at
/// most) with the change `KNOB=on` on both engines.
#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::ops::gate::change::targets;
    use pdwarden_model::gate::config::Cell;
    use pdwarden_model::gate::measure::{CellMeasurement, RequestFigures};
    use pdwarden_model::judge::golden::{Alternative, AnswerToken, GreedyAnswer, OutputCheck, OutputIdentity};
    use pdwarden_model::judge::live::ProcessView;

    struct Fixture {
        pair: PairConfig,
        change: ChangeSpec,
        targets: Vec<UnitRef>,
    }

    impl Fixture {
        fn gate(&self) -> Gating<'_> {
            Gating::new(&self.pair, &self.change, &self.targets)
        }
    }

    /// The rig's pair with `extra` lines under `[pair.gate]`.
    fn fixture(extra: &str) -> Fixture {
        let pair = crate::ops::fake_agent::rig::pair(
            "after-prefill-ready",
            &format!(
                "[pair.gate]\nprompt_tokens = [16]\noutput_tokens = [24]\nconcurrency = [1]\nbootstrap_resamples = 300\n{extra}"
            ),
        );
        let change = ChangeSpec {
            set_env: BTreeMap::from([("KNOB".to_string(), "on".to_string())]),
            ..Default::default()
        };
        let targets = targets(&pair, &change);
        Fixture { pair, change, targets }
    }

    /// One request per round, `ms` end to end each.
    fn measured(label: &str, ms: &[f64]) -> Measurement {
        let cell = Cell {
            prompt_tokens: 16,
            output_tokens: 24,
            concurrency: 1,
            rounds: ms.len() as u32,
        };
        let requests = ms
            .iter()
            .enumerate()
            .map(|(round, &ms)| RequestFigures {
                round: round as u32,
                ok: true,
                ttft_ms: ms / 4.0,
                e2e_ms: ms,
                itl_ms: Some(ms / 30.0),
                tokens: 24,
                error: String::new(),
            })
            .collect();
        Measurement {
            label: label.into(),
            cells: vec![CellMeasurement {
                cell,
                requests,
                throughput: ms.iter().map(|ms| 24_000.0 / ms).collect(),
            }],
            total_ms: 1,
            warmup: Default::default(),
        }
    }

    /// 16 requests within ±1 % of `ms`: precise.
    fn steady(label: &str, ms: f64) -> Measurement {
        let v: Vec<f64> = (0..16).map(|i| ms * (0.99 + 0.02 * f64::from(i % 5) / 4.0)).collect();
        measured(label, &v)
    }

    /// 4 requests from half to one and a half times `ms`: too few and too
    /// spread to show anything.
    fn noisy(label: &str, ms: f64) -> Measurement {
        measured(label, &[ms * 0.5, ms * 1.5, ms * 0.7, ms * 1.3])
    }

    fn child(purpose: ChildPurpose, verdict: VerdictKind) -> GateEvent {
        GateEvent::ChildConcluded {
            child: ChildOperation {
                purpose: purpose.as_str().into(),
                operation_id: format!("{}-op", purpose.as_str()),
                kind: purpose.kind().as_str().into(),
                verdict: verdict.as_str().into(),
                reasons: vec!["a reason".into()],
                total_ms: 7,
            },
            verdict,
            golden: None,
        }
    }

    /// Each word preferred by 3 nats over the next one.
    fn greedy(words: &[&str]) -> GreedyAnswer {
        GreedyAnswer {
            tokens: words
                .iter()
                .enumerate()
                .map(|(i, w)| AnswerToken {
                    token: (*w).into(),
                    logprob: -0.05,
                    top: vec![
                        Alternative {
                            token: (*w).into(),
                            logprob: -0.05,
                        },
                        Alternative {
                            token: words[(i + 1) % words.len()].into(),
                            logprob: -3.05,
                        },
                    ],
                })
                .collect(),
        }
    }

    const BEFORE: &[&str] = &[" the", " sky", " is", " blue"];
    const OTHER: &[&str] = &[" a", " sea", " so", " calm"];

    /// `child`, its report keeping the greedy answer `words` (none: an
    /// engine without logprobs).
    fn answering(purpose: ChildPurpose, verdict: VerdictKind, words: Option<&[&str]>) -> GateEvent {
        let GateEvent::ChildConcluded { child, verdict, .. } = child(purpose, verdict) else {
            unreachable!()
        };
        let golden = GoldenRecord {
            identity: OutputIdentity {
                model: "m".into(),
                fingerprint: purpose.as_str().into(),
            },
            check: match words {
                Some(w) => OutputCheck::NoReference { tokens: w.len() },
                None => OutputCheck::NoLogprobs,
            },
            reference: None,
            answer: words.map(greedy),
        };
        GateEvent::ChildConcluded {
            child,
            verdict,
            golden: Some(Box::new(golden)),
        }
    }

    /// What the gate had established by its co-restart, the baseline
    /// verification having answered `BEFORE`.
    fn with_baseline_answer() -> SoFar {
        SoFar {
            baseline_output: Some(ChildGolden {
                operation_id: "baseline-op".into(),
                golden: match answering(ChildPurpose::Baseline, VerdictKind::Healthy, Some(BEFORE)) {
                    GateEvent::ChildConcluded { golden, .. } => golden.map(|g| *g),
                    _ => unreachable!(),
                },
            }),
            ..established()
        }
    }

    fn restarting_after_baseline() -> GateState {
        GateState::Restarting {
            so_far: with_baseline_answer(),
            baseline: steady("baseline", 100.0),
        }
    }

    fn view(unit: &str, knob: Option<&str>, version: u32, environ_blank: bool) -> UnitView {
        UnitView {
            unit: unit.into(),
            config_version: Some(version),
            processes: vec![ProcessView {
                pid: 40,
                cmdline: vec!["engine".into()],
                env: BTreeMap::from([("KNOB".to_string(), knob.map(str::to_string))]),
                environ_blank,
            }],
        }
    }

    fn views() -> Vec<UnitView> {
        ["prefill-0", "decode-0"].map(|u| view(u, None, 1, false)).to_vec()
    }

    fn versions() -> Vec<VersionRecord> {
        ["prefill-0", "decode-0"]
            .map(|u| VersionRecord {
                unit: u.into(),
                host: "h1".into(),
                previous: 1,
                applied: 2,
                restored: None,
                argv: vec!["engine".into()],
                env: BTreeMap::new(),
            })
            .to_vec()
    }

    fn restored() -> Vec<VersionRecord> {
        versions()
            .into_iter()
            .map(|v| VersionRecord { restored: Some(3), ..v })
            .collect()
    }

    fn live(unit: &str, problem: Option<&str>) -> LiveCheck {
        LiveCheck {
            unit: unit.into(),
            ok: problem.is_none(),
            pid: 40,
            config_version: Some(2),
            observed: Vec::new(),
            problems: problem.map(str::to_string).into_iter().collect(),
        }
    }

    fn all_live() -> Vec<LiveCheck> {
        vec![live("prefill-0", None), live("decode-0", None)]
    }

    fn refused(unit: &str) -> AgentStepError {
        AgentStepError::Refused {
            unit: format!("h1/{unit}"),
            reason: "disk full".into(),
        }
    }

    /// What the gate had established by the time it measured its baseline.
    fn established() -> SoFar {
        SoFar {
            before_views: views(),
            versions: versions(),
            ..SoFar::default()
        }
    }

    /// The state a step that is over moves on to, once the journal is checked.
    fn then(t: &Transition<GateState, GateEffect>) -> &GateState {
        match t.effects.last() {
            Some(GateEffect::CheckJournal { then }) => then,
            other => panic!("the step does not end with the journal checked: {other:?}"),
        }
    }

    /// The journal checked whole at the end of the step `t` closes.
    fn checked(g: &Gating<'_>, t: Transition<GateState, GateEffect>) -> Transition<GateState, GateEffect> {
        let next = Box::new(then(&t).clone());
        g.step(
            t.next,
            GateEvent::JournalChecked {
                then: next,
                failed: None,
            },
            0,
        )
    }

    fn verdict_of(state: &GateState) -> GateVerdict {
        match state {
            GateState::Concluded { verdict, .. } => *verdict,
            other => panic!("not concluded: {other:?}"),
        }
    }

    /// A change shown not worse, walked from the first step to the verdict:
    /// each state entered opens its step's record and asks for its first
    /// effect; each step ends with the journal checked and only then moves on.
    #[test]
    fn a_change_shown_not_worse_walks_every_step_to_kept() {
        let f = fixture("");
        let g = f.gate();
        let t = g.start();
        assert_eq!(Gating::label(&t.next), "gate_baseline");
        assert_eq!(
            t.effects,
            [
                GateEffect::Begin(GateStep::Baseline),
                GateEffect::RunChild(ChildPurpose::Baseline)
            ]
        );
        // The pair verified healthy: its processes inspected next.
        let t = g.step(t.next, child(ChildPurpose::Baseline, VerdictKind::Healthy), 0);
        assert_eq!(t.effects, [GateEffect::Inspect]);
        assert_eq!(t.next.so_far().operations.len(), 1);
        // Inspected: the values before kept, the benchmark next.
        let t = g.step(t.next, GateEvent::Inspected(Ok(views())), 0);
        assert_eq!(
            t.effects,
            [GateEffect::Measure {
                label: "baseline".into()
            }]
        );
        assert_eq!(t.next.so_far().before_views, views());
        assert!(t.next.so_far().before_live.iter().all(|c| c.ok));
        // A precise baseline: the step is over, the change applied next.
        let t = g.step(t.next, GateEvent::Measured(steady("baseline", 100.0)), 0);
        assert_eq!(
            Gating::label(&t.next),
            "gate_baseline",
            "stays until the journal is checked"
        );
        assert_eq!(t.effects[0], GateEffect::End("16 requests".into()));
        assert!(matches!(then(&t), GateState::Applying { .. }));
        let t = checked(&g, t);
        assert_eq!(Gating::label(&t.next), "gate_applying");
        assert_eq!(t.effects, [GateEffect::Begin(GateStep::Applying), GateEffect::Apply]);
        // Applied: the co-restart onto the change.
        let t = g.step(
            t.next,
            GateEvent::Applied {
                versions: versions(),
                failed: None,
            },
            0,
        );
        assert_eq!(t.effects[0], GateEffect::End("prefill-0 v1→v2, decode-0 v1→v2".into()));
        let t = checked(&g, t);
        assert_eq!(Gating::label(&t.next), "gate_restarting");
        assert_eq!(t.next.so_far().versions, versions());
        assert_eq!(
            t.effects,
            [
                GateEffect::Begin(GateStep::Restarting),
                GateEffect::RunChild(ChildPurpose::Restart)
            ]
        );
        // Back healthy: the change checked live, at its applied version.
        let t = checked(
            &g,
            g.step(t.next, child(ChildPurpose::Restart, VerdictKind::Healthy), 0),
        );
        assert_eq!(Gating::label(&t.next), "gate_verifying_live");
        let GateEffect::VerifyLive { expected } = &t.effects[1] else {
            panic!("{:?}", t.effects)
        };
        assert_eq!(expected.len(), 2);
        assert!(
            expected
                .iter()
                .all(|e| e.config_version == Some(2) && e.env["KNOB"].as_deref() == Some("on"))
        );
        // Live: recorded, then the first look.
        let t = g.step(t.next, GateEvent::LiveChecked(all_live()), 0);
        assert!(matches!(&t.effects[0], GateEffect::Record { kind: "live_check", .. }));
        assert_eq!(
            t.effects[1],
            GateEffect::End("live in prefill-0 pid 40, decode-0 pid 40".into())
        );
        let t = checked(&g, t);
        assert_eq!(Gating::label(&t.next), "gate_measuring");
        assert_eq!(
            t.effects[1],
            GateEffect::Measure {
                label: "after#1".into()
            }
        );
        // Measured the same: judged not worse, kept.
        let t = g.step(t.next, GateEvent::Measured(steady("after#1", 100.0)), 0);
        assert_eq!(Gating::label(&t.next), "gate_judging");
        assert!(matches!(
            &t.effects[..],
            [
                GateEffect::End(_),
                GateEffect::Begin(GateStep::Judging),
                GateEffect::Record { kind: "judgement", .. },
                GateEffect::End(_),
                GateEffect::CheckJournal { .. }
            ]
        ));
        let t = checked(&g, t);
        assert_eq!(verdict_of(&t.next), GateVerdict::KeptNotWorse);
        assert!(t.effects.is_empty());
        let so_far = t.next.so_far();
        assert!(so_far.judgement.is_some());
        assert_eq!(so_far.measurements.len(), 2);
        assert!(!so_far.reasons.is_empty(), "the judge's summary");
    }

    /// Nothing is changed on a baseline that cannot be trusted: a pair not
    /// healthy, processes that cannot be read, an environment that can
    /// never be confirmed, failed benchmark requests. A loose baseline is
    /// measured again, up to the budget.
    #[test]
    fn a_baseline_that_cannot_be_trusted_changes_nothing() {
        let f = fixture("");
        let g = f.gate();
        let fresh = || GateState::Baseline {
            so_far: SoFar::default(),
            looks: 0,
            measured: None,
        };
        let failed = |t: &Transition<GateState, GateEffect>| {
            let done = then(t);
            assert_eq!(verdict_of(done), GateVerdict::Failed);
            assert_eq!(Gating::label(&t.next), "gate_baseline");
            done.so_far().reasons[0].clone()
        };
        let t = g.step(fresh(), child(ChildPurpose::Baseline, VerdictKind::Failed), 0);
        assert_eq!(t.effects[0], GateEffect::End("pair not healthy: failed".into()));
        assert_eq!(
            failed(&t),
            "the pair is not healthy before the change (failed: a reason); nothing was changed"
        );
        let t = g.step(fresh(), GateEvent::Inspected(Err(refused("prefill-0"))), 0);
        assert_eq!(
            failed(&t),
            "cannot read the processes before the change: h1/prefill-0: disk full; nothing was changed"
        );
        let blank = vec![view("prefill-0", None, 1, true), view("decode-0", None, 1, false)];
        let t = g.step(fresh(), GateEvent::Inspected(Ok(blank)), 0);
        assert!(failed(&t).starts_with("prefill-0: /proc/40/environ holds no variable"));
        let mut broken = steady("baseline", 100.0);
        broken.cells[0].requests[3].ok = false;
        broken.cells[0].requests[3].error = "reset".into();
        let t = g.step(fresh(), GateEvent::Measured(broken), 0);
        assert_eq!(
            failed(&t),
            "1 baseline benchmark requests failed before any change: reset; nothing was changed"
        );
        // Too loose: measured again while within the budget (3 looks)…
        let t = g.step(fresh(), GateEvent::Measured(noisy("baseline", 100.0)), 0);
        assert_eq!(
            t.effects,
            [GateEffect::Measure {
                label: "baseline".into()
            }]
        );
        let t = g.step(t.next, GateEvent::Measured(noisy("baseline", 100.0)), 0);
        let GateState::Baseline {
            looks: 2,
            measured: Some(m),
            ..
        } = &t.next
        else {
            panic!("{:?}", t.next)
        };
        assert_eq!(m.cells[0].requests.len(), 8, "the looks are one measurement");
        // …and with the budget spent, the change goes ahead on what it has.
        let t = g.step(t.next, GateEvent::Measured(noisy("baseline", 100.0)), 0);
        let GateState::Applying { baseline, so_far } = then(&t) else {
            panic!("{:?}", t.effects)
        };
        assert_eq!(baseline.cells[0].requests.len(), 12);
        assert_eq!(so_far.measurements.len(), 3);
    }

    /// An apply that fails restores the units it changed; nothing was
    /// restarted. A restore that fails too is a failed rollback.
    #[test]
    fn a_failed_apply_restores_what_it_changed() {
        let f = fixture("");
        let g = f.gate();
        let applying = GateState::Applying {
            so_far: SoFar::default(),
            baseline: steady("baseline", 100.0),
        };
        let t = g.step(
            applying,
            GateEvent::Applied {
                versions: versions()[..1].to_vec(),
                failed: Some(refused("decode-0")),
            },
            0,
        );
        assert_eq!(
            t.effects,
            [
                GateEffect::End("failed: h1/decode-0: disk full".into()),
                GateEffect::Restore {
                    versions: versions()[..1].to_vec()
                }
            ]
        );
        assert_eq!(Gating::label(&t.next), "gate_applying");
        assert_eq!(t.next.so_far().versions.len(), 1, "journaled with the version it made");
        let after_apply = t.next;
        let t = g.step(
            after_apply.clone(),
            GateEvent::Restored {
                versions: restored()[..1].to_vec(),
                failed: None,
            },
            0,
        );
        assert_eq!(verdict_of(then(&t)), GateVerdict::Failed);
        assert_eq!(
            then(&t).so_far().reasons,
            ["applying the change failed: h1/decode-0: disk full"]
        );
        assert_eq!(then(&t).so_far().versions[0].restored, Some(3));
        let t = g.step(
            after_apply,
            GateEvent::Restored {
                versions: versions()[..1].to_vec(),
                failed: Some(refused("prefill-0")),
            },
            0,
        );
        assert_eq!(verdict_of(then(&t)), GateVerdict::RollbackFailed);
        assert_eq!(
            then(&t).so_far().reasons[1],
            "restoring the previous config versions failed: h1/prefill-0: disk full"
        );
    }

    /// A pair that does not come back is rolled back; one that comes back
    /// over its budgets is rejected once the change is shown live in it; a
    /// change not live is rolled back — none of them measured.
    #[test]
    fn a_pair_that_does_not_come_back_right_is_rolled_back_for_what_it_showed() {
        let f = fixture("");
        let g = f.gate();
        let restarting = || GateState::Restarting {
            so_far: established(),
            baseline: steady("baseline", 100.0),
        };
        let t = g.step(restarting(), child(ChildPurpose::Restart, VerdictKind::Failed), 0);
        let GateState::RollingBack { why, baseline, so_far } = then(&t) else {
            panic!("{:?}", t.effects)
        };
        assert_eq!(
            *why,
            Why::NotMeasured {
                verdict: GateVerdict::RestartFailedRolledBack
            }
        );
        assert!(baseline.is_some());
        assert_eq!(
            so_far.reasons,
            ["the co-restart with the change ended failed: a reason"]
        );
        // Slow: on to the live check, marked.
        let t = g.step(restarting(), child(ChildPurpose::Restart, VerdictKind::OverBudget), 0);
        let slow = then(&t).clone();
        assert!(matches!(
            slow,
            GateState::VerifyingLive {
                over_budget_with_the_change: true,
                ..
            }
        ));
        assert!(slow.so_far().reasons[0].contains("came back generating, slower than its budgets"));
        let t = g.step(slow.clone(), GateEvent::LiveChecked(all_live()), 0);
        assert!(matches!(
            then(&t),
            GateState::RollingBack {
                why: Why::NotMeasured {
                    verdict: GateVerdict::RejectedRolledBack
                },
                ..
            }
        ));
        // Not live: rolled back, saying what /proc showed.
        let checks = vec![live("prefill-0", None), live("decode-0", Some("decode-0: KNOB absent"))];
        let t = g.step(slow, GateEvent::LiveChecked(checks), 0);
        assert_eq!(t.effects[1], GateEffect::End("not live: decode-0: KNOB absent".into()));
        let GateState::RollingBack { why, so_far, .. } = then(&t) else {
            panic!("{:?}", t.effects)
        };
        assert_eq!(
            *why,
            Why::NotMeasured {
                verdict: GateVerdict::NotLiveRolledBack
            }
        );
        assert_eq!(
            so_far.reasons[1],
            "the change is not live in the restarted processes: decode-0: KNOB absent"
        );
        assert_eq!(so_far.live.len(), 2);
    }

    /// Each look is judged: worse is a rejection, rolled back with what
    /// was judged; inconclusive is another look while the budget lasts,
    /// then rolled back — or held for a person (`on_inconclusive = "hold"`).
    #[test]
    fn each_look_is_judged_and_another_taken_while_inconclusive() {
        let f = fixture("");
        let g = f.gate();
        let measuring = |look| GateState::Measuring {
            so_far: established(),
            baseline: steady("baseline", 100.0),
            look,
            after: (look > 1).then(|| noisy("after#1", 100.0)),
        };
        let t = g.step(measuring(1), GateEvent::Measured(steady("after#1", 140.0)), 0);
        let GateState::Judging { judgement, .. } = &t.next else {
            panic!("{:?}", t.next)
        };
        assert_eq!(judgement.judgement, Judgement::Regressed);
        let GateState::RollingBack {
            why: Why::Judged { verdict, after, .. },
            so_far,
            ..
        } = then(&t)
        else {
            panic!("{:?}", t.effects)
        };
        assert_eq!(*verdict, GateVerdict::RejectedRolledBack);
        assert_eq!(after.label, "after#1");
        assert!(so_far.judgement.is_some());
        // Inconclusive at look 1 of 3: look 2, with look 1's requests kept.
        let t = checked(
            &g,
            g.step(measuring(1), GateEvent::Measured(noisy("after#1", 100.0)), 0),
        );
        let GateState::Measuring {
            look: 2,
            after: Some(a),
            so_far,
            ..
        } = &t.next
        else {
            panic!("{:?}", t.next)
        };
        assert_eq!(a.cells[0].requests.len(), 4);
        assert!(so_far.judgement.is_none(), "no verdict yet");
        assert_eq!(
            t.effects[1],
            GateEffect::Measure {
                label: "after#2".into()
            }
        );
        // Still inconclusive at the last look: rolled back…
        let t = g.step(measuring(3), GateEvent::Measured(noisy("after#3", 100.0)), 0);
        assert!(matches!(
            then(&t),
            GateState::RollingBack {
                why: Why::Judged {
                    verdict: GateVerdict::InconclusiveRolledBack,
                    ..
                },
                ..
            }
        ));
        // …or held, the change live, saying how to undo it.
        let f = fixture("on_inconclusive = \"hold\"\n");
        let g = f.gate();
        let t = g.step(measuring(3), GateEvent::Measured(noisy("after#3", 100.0)), 0);
        assert_eq!(verdict_of(then(&t)), GateVerdict::InconclusiveHeld);
        assert!(
            then(&t)
                .so_far()
                .reasons
                .last()
                .unwrap()
                .starts_with("the change is still live (on_inconclusive = \"hold\"): keep it as it is, or gate it back to the previous values (KNOB absent) with `pdwarden gate p`")
        );
    }

    /// The rollback: the previous versions, the co-restart onto them
    /// (none where no unit was restarted), the old values checked live at
    /// the restored version, the pair measured again. Any part failing is a
    /// failed rollback; a gate taken over before its baseline ends verified
    /// but not benchmarked.
    #[test]
    fn the_rollback_restores_restarts_verifies_and_measures() {
        let f = fixture("");
        let g = f.gate();
        let why = Why::NotMeasured {
            verdict: GateVerdict::NotLiveRolledBack,
        };
        let rolling_back = GateState::RollingBack {
            so_far: established(),
            why: why.clone(),
            baseline: Some(steady("baseline", 100.0)),
        };
        let t = g.enter(rolling_back.clone());
        assert_eq!(
            t.effects,
            [
                GateEffect::Begin(GateStep::RollingBack),
                GateEffect::Restore { versions: versions() }
            ]
        );
        let ok = GateEvent::Restored {
            versions: restored(),
            failed: None,
        };
        let t = g.step(rolling_back.clone(), ok, 0);
        assert_eq!(
            Gating::label(&t.next),
            "gate_rollback_restarting",
            "no journal check within the rollback"
        );
        assert_eq!(
            t.effects,
            [
                GateEffect::End("prefill-0 v3, decode-0 v3".into()),
                GateEffect::Begin(GateStep::RollbackRestarting),
                GateEffect::RunChild(ChildPurpose::RollbackRestart)
            ]
        );
        let restarting = t.next;
        let t = g.step(
            restarting.clone(),
            child(ChildPurpose::RollbackRestart, VerdictKind::Healthy),
            0,
        );
        assert_eq!(Gating::label(&t.next), "gate_rollback_verifying_live");
        let GateEffect::VerifyLive { expected } = &t.effects[2] else {
            panic!("{:?}", t.effects)
        };
        assert!(
            expected
                .iter()
                .all(|e| e.config_version == Some(3) && e.env["KNOB"].is_none()),
            "the values before, at the restored version: {expected:?}"
        );
        let verifying = t.next;
        let t = g.step(verifying.clone(), GateEvent::LiveChecked(all_live()), 0);
        assert_eq!(Gating::label(&t.next), "gate_rollback_measuring");
        assert!(matches!(
            &t.effects[..],
            [
                GateEffect::Record {
                    kind: "rollback_live_check",
                    ..
                },
                GateEffect::End(_),
                GateEffect::Begin(GateStep::RollbackMeasuring),
                GateEffect::Measure { .. }
            ]
        ));
        // Back at the baseline: the verdict the rollback was for.
        let t = g.step(t.next, GateEvent::Measured(steady("rollback#1", 100.0)), 0);
        assert_eq!(verdict_of(then(&t)), GateVerdict::NotLiveRolledBack);
        let so_far = then(&t).so_far();
        assert!(
            so_far.reasons[0].starts_with("rollback verified: prefill-0 pid 40 (config version 2), decode-0 pid 40 (config version 2) run the previous config again (KNOB absent), and every metric is shown within ±10 % of the first baseline"),
            "{:?}",
            so_far.reasons
        );
        assert!(so_far.rollback_judgement.is_some());
        // No unit restarted with the change: no co-restart, said.
        let untouched = Gating {
            nothing_restarted: true,
            ..f.gate()
        };
        let t = untouched.step(
            rolling_back.clone(),
            GateEvent::Restored {
                versions: restored(),
                failed: None,
            },
            0,
        );
        assert_eq!(Gating::label(&t.next), "gate_rollback_verifying_live");
        assert!(matches!(
            &t.effects[..],
            [
                GateEffect::End(_),
                GateEffect::Begin(GateStep::RollbackRestarting),
                GateEffect::End(not_needed),
                GateEffect::Begin(GateStep::RollbackVerifyingLive),
                GateEffect::VerifyLive { .. }
            ] if not_needed.starts_with("not needed")
        ));
        assert!(t.next.so_far().reasons[0].starts_with("no unit had been restarted with the change"));
        // Each part that fails: a failed rollback, said first of its lines.
        let t = g.step(
            rolling_back,
            GateEvent::Restored {
                versions: versions(),
                failed: Some(refused("decode-0")),
            },
            0,
        );
        assert_eq!(verdict_of(then(&t)), GateVerdict::RollbackFailed);
        assert_eq!(
            then(&t).so_far().reasons[0],
            "ROLLBACK FAILED: restoring the config versions: h1/decode-0: disk full"
        );
        let t = g.step(restarting, child(ChildPurpose::RollbackRestart, VerdictKind::Failed), 0);
        assert_eq!(verdict_of(then(&t)), GateVerdict::RollbackFailed);
        assert_eq!(
            then(&t).so_far().reasons[0],
            "ROLLBACK FAILED: the co-restart onto the previous config ended failed: a reason"
        );
        let stale = vec![live("prefill-0", Some("prefill-0: KNOB=on")), live("decode-0", None)];
        let t = g.step(verifying.clone(), GateEvent::LiveChecked(stale), 0);
        assert_eq!(verdict_of(then(&t)), GateVerdict::RollbackFailed);
        assert_eq!(
            then(&t).so_far().reasons[0],
            "ROLLBACK FAILED: the previous values are not live again: prefill-0: KNOB=on"
        );
        // Taken over before a baseline was measured: verified, not measured.
        let GateState::RollbackVerifyingLive { so_far, .. } = verifying else {
            unreachable!()
        };
        let interrupted = GateState::RollbackVerifyingLive {
            so_far,
            why: Why::Interrupted,
            baseline: None,
        };
        let t = g.step(interrupted, GateEvent::LiveChecked(all_live()), 0);
        assert_eq!(verdict_of(then(&t)), GateVerdict::InterruptedRolledBack);
        assert!(
            then(&t).so_far().reasons[0]
                .ends_with("not benchmarked (the gate was interrupted before its baseline was measured)")
        );
    }

    /// After the rollback: another look while neither back nor moved, then
    /// "not shown back"; a moved baseline excuses a rejection that rested on
    /// it alone (BASELINE MOVED), not one shown worse than the pair after
    /// the rollback too, nor one that never rested on the benchmark.
    #[test]
    fn after_the_rollback_a_moved_baseline_excuses_only_what_rested_on_it() {
        let f = fixture("");
        let g = f.gate();
        let baseline = steady("baseline", 100.0);
        let judged = |after_ms: f64| {
            let after = steady("after#1", after_ms);
            let judgement = judge::judge(
                &metrics(&baseline, &after),
                baseline.tally(),
                after.tally(),
                g.policy,
                1,
            );
            assert_eq!(judgement.judgement, Judgement::Regressed);
            Why::Judged {
                verdict: GateVerdict::RejectedRolledBack,
                after,
                judgement,
            }
        };
        let measuring = |why: Why, look| GateState::RollbackMeasuring {
            so_far: SoFar {
                rollback_live: all_live(),
                ..established()
            },
            why,
            baseline: baseline.clone(),
            look,
            again: (look > 1).then(|| noisy("rollback#1", 100.0)),
        };
        // Neither yet: another look.
        let t = g.step(
            measuring(judged(140.0), 1),
            GateEvent::Measured(noisy("rollback#1", 100.0)),
            0,
        );
        assert_eq!(Gating::label(&t.next), "gate_rollback_measuring");
        assert!(matches!(
            &t.effects[..],
            [
                GateEffect::Record {
                    kind: "rollback_judgement",
                    ..
                },
                GateEffect::End(_),
                GateEffect::Begin(GateStep::RollbackMeasuring),
                GateEffect::Measure { label }
            ] if label == "rollback#2"
        ));
        // Neither after the budget: the verdict stands, said.
        let t = g.step(
            measuring(judged(140.0), 3),
            GateEvent::Measured(noisy("rollback#3", 100.0)),
            0,
        );
        assert_eq!(verdict_of(then(&t)), GateVerdict::RejectedRolledBack);
        assert!(
            then(&t).so_far().reasons[0].contains("not shown back within ±10 % of its first baseline after 3 look(s)")
        );
        // Moved (+25 %), the change +140 %: worse than both, the knob blamed.
        let t = g.step(
            measuring(judged(240.0), 1),
            GateEvent::Measured(steady("rollback#1", 125.0)),
            0,
        );
        assert!(matches!(
            &t.effects[..],
            [
                GateEffect::Record { .. },
                GateEffect::End(_),
                GateEffect::Record {
                    kind: "change_vs_rollback_judgement",
                    ..
                },
                GateEffect::CheckJournal { .. }
            ]
        ));
        assert_eq!(verdict_of(then(&t)), GateVerdict::RejectedRolledBack);
        let so_far = then(&t).so_far();
        assert!(
            so_far.reasons[0].contains("so the knob is blamed"),
            "{:?}",
            so_far.reasons
        );
        assert!(so_far.change_vs_rollback.is_some());
        // Moved as far as the change itself: the knob is not blamed.
        let t = g.step(
            measuring(judged(140.0), 1),
            GateEvent::Measured(steady("rollback#1", 140.0)),
            0,
        );
        assert_eq!(verdict_of(then(&t)), GateVerdict::BaselineMovedRolledBack);
        assert!(then(&t).so_far().reasons[0].starts_with("BASELINE MOVED: after the rollback"));
        // Moved, the verdict not resting on the benchmark: it stands.
        let not_measured = Why::NotMeasured {
            verdict: GateVerdict::NotLiveRolledBack,
        };
        let t = g.step(
            measuring(not_measured, 1),
            GateEvent::Measured(steady("rollback#1", 140.0)),
            0,
        );
        assert_eq!(verdict_of(then(&t)), GateVerdict::NotLiveRolledBack);
        assert!(then(&t).so_far().reasons[0].starts_with("the benchmark moved"));
        assert!(then(&t).so_far().change_vs_rollback.is_none());
        // A gate taken over is held to its journaled baseline.
        let t = g.step(
            measuring(Why::Interrupted, 1),
            GateEvent::Measured(steady("rollback#1", 140.0)),
            0,
        );
        assert_eq!(verdict_of(then(&t)), GateVerdict::BaselineMovedRolledBack);
    }

    /// A journal found failed at a step's end stops the gate where it was,
    /// with what the step had established (the versions it made, to undo);
    /// a child the journal could not begin, and a state or write-ahead the
    /// runtime could not journal, stop it too — but not a verdict already
    /// reached. A gate that is over, or an answer a state did not ask for,
    /// moves nothing.
    #[test]
    fn the_journal_stops_the_gate_where_it_was() {
        let f = fixture("");
        let g = f.gate();
        let applying = GateState::Applying {
            so_far: SoFar::default(),
            baseline: steady("baseline", 100.0),
        };
        let t = g.step(
            applying.clone(),
            GateEvent::Applied {
                versions: versions(),
                failed: None,
            },
            0,
        );
        let next = Box::new(then(&t).clone());
        let t = g.step(
            t.next,
            GateEvent::JournalChecked {
                then: next,
                failed: Some("disk full".into()),
            },
            0,
        );
        assert!(t.effects.is_empty());
        let GateState::Stopped { at, failed, so_far } = &t.next else {
            panic!("{:?}", t.next)
        };
        assert_eq!((*at, failed.as_str()), (GateStep::Applying, "disk full"));
        assert_eq!(so_far.versions, versions(), "what to undo");
        assert_eq!(Gating::label(&t.next), "gate_applying", "journaled where it stopped");
        // A child not begun.
        let restarting = GateState::Restarting {
            so_far: established(),
            baseline: steady("baseline", 100.0),
        };
        let t = g.step(
            restarting.clone(),
            GateEvent::ChildNotBegun {
                error: "disk full".into(),
            },
            0,
        );
        assert!(matches!(
            &t.next,
            GateState::Stopped {
                at: GateStep::Restarting,
                ..
            }
        ));
        // The runtime's failed write.
        let err = JournalError::from(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            Some("full".into()),
        ));
        let GateState::Stopped { at, failed, so_far } = g.stopped_by_the_journal(restarting.clone(), &err) else {
            panic!("stopped")
        };
        assert_eq!(at, GateStep::Restarting);
        assert!(!failed.is_empty());
        assert_eq!(so_far.versions, versions());
        let kept = GateState::Concluded {
            verdict: GateVerdict::KeptNotWorse,
            so_far: SoFar::default(),
        };
        assert_eq!(g.stopped_by_the_journal(kept.clone(), &err), kept, "the verdict stands");
        // Over: nothing moves it.
        for event in [
            GateEvent::Measured(steady("x", 1.0)),
            GateEvent::ChildNotBegun { error: "x".into() },
            GateEvent::JournalChecked {
                then: Box::new(applying.clone()),
                failed: Some("x".into()),
            },
        ] {
            let t = g.step(kept.clone(), event, 0);
            assert_eq!((t.next, t.effects), (kept.clone(), vec![]));
        }
        // An answer this state did not ask for.
        let t = g.step(restarting.clone(), GateEvent::Measured(steady("x", 1.0)), 0);
        assert_eq!((t.next, t.effects), (restarting, vec![]));
        let t = g.step(applying.clone(), GateEvent::ChildNotBegun { error: "x".into() }, 0);
        assert_eq!(t.next, applying, "the applying state runs no child");
    }

    /// Issue 34: the baseline verification's greedy answer is kept (what
    /// the answer with the change is held to), whatever it found.
    #[test]
    fn the_baseline_verification_keeps_its_greedy_answer() {
        let f = fixture("");
        let g = f.gate();
        let fresh = GateState::Baseline {
            so_far: SoFar::default(),
            looks: 0,
            measured: None,
        };
        let t = g.step(
            fresh.clone(),
            answering(ChildPurpose::Baseline, VerdictKind::Healthy, Some(BEFORE)),
            0,
        );
        assert_eq!(t.effects, [GateEffect::Inspect]);
        let kept = t.next.so_far().baseline_output.as_ref().expect("kept");
        assert_eq!(kept.operation_id, "baseline-op");
        assert_eq!(
            kept.golden.as_ref().and_then(|g| g.answer.clone()),
            Some(greedy(BEFORE))
        );
        // A child that checked no output: kept as such, said later.
        let t = g.step(fresh, child(ChildPurpose::Baseline, VerdictKind::Healthy), 0);
        assert_eq!(
            t.next.so_far().baseline_output.as_ref().map(|b| b.golden.is_none()),
            Some(true)
        );
    }

    /// The co-restart onto the change answers otherwise than the baseline
    /// (token 0 clearly not preferred): compared and journaled at once, and
    /// once the change is shown live in the restarted processes, rolled back
    /// for it — not measured — the first reason naming the change and
    /// carrying the judge's evidence line.
    #[test]
    fn an_output_change_with_the_change_live_is_rolled_back_unmeasured() {
        let f = fixture("");
        let g = f.gate();
        let t = g.step(
            restarting_after_baseline(),
            answering(ChildPurpose::Restart, VerdictKind::Healthy, Some(OTHER)),
            0,
        );
        let [
            GateEffect::Record {
                kind: "output_comparison",
                evidence: Evidence::Output(output),
            },
            GateEffect::End(end),
            GateEffect::CheckJournal { .. },
        ] = &t.effects[..]
        else {
            panic!("{:?}", t.effects)
        };
        assert_eq!(end, "healthy");
        assert!(output.rejects(), "{output:?}");
        let OutputComparison::Compared {
            before_operation,
            after_operation,
            check: OutputCheck::Diverged { position: 0, .. },
            allowed: false,
        } = output
        else {
            panic!("{output:?}")
        };
        assert_eq!(
            (before_operation.as_str(), after_operation.as_str()),
            ("baseline-op", "restart-op")
        );
        let verifying = then(&t).clone();
        assert!(matches!(verifying, GateState::VerifyingLive { .. }));
        assert!(
            verifying.so_far().reasons.is_empty(),
            "nothing charged before the change is shown live"
        );
        let t = g.step(verifying, GateEvent::LiveChecked(all_live()), 0);
        let GateState::RollingBack { why, so_far, baseline } = then(&t) else {
            panic!("{:?}", t.effects)
        };
        assert_eq!(
            *why,
            Why::NotMeasured {
                verdict: GateVerdict::OutputChangedRolledBack
            }
        );
        assert!(baseline.is_some(), "the rollback is measured against it");
        let first = &so_far.reasons[0];
        assert!(
            first.starts_with(
                "OUTPUT CHANGED by the change (KNOB=on, live in prefill-0 pid 40, decode-0 pid 40): the greedy answer of the co-restart onto it (operation restart-op) is not the one the pair gave before it (operation baseline-op): WRONG OUTPUT"
            ) && first.contains(&output.evidence().unwrap())
                && first.contains("allow_output_change = true"),
            "{first}"
        );
        assert!(so_far.judgement.is_none());
    }

    /// `allow_output_change = true`: the output change is said, and the
    /// change is judged on the benchmark as any other.
    #[test]
    fn an_allowed_output_change_goes_on_to_the_benchmark() {
        let f = fixture("allow_output_change = true\n");
        let g = f.gate();
        let t = checked(
            &g,
            g.step(
                restarting_after_baseline(),
                answering(ChildPurpose::Restart, VerdictKind::Healthy, Some(OTHER)),
                0,
            ),
        );
        let output = t.next.so_far().output.clone().unwrap();
        assert!(output.changed() && !output.rejects(), "{output:?}");
        let t = g.step(t.next, GateEvent::LiveChecked(all_live()), 0);
        let GateState::Measuring { so_far, look: 1, .. } = then(&t) else {
            panic!("{:?}", t.effects)
        };
        assert_eq!(so_far.reasons.len(), 1, "{:?}", so_far.reasons);
        assert!(
            so_far.reasons[0].starts_with("output changed, allowed (allow_output_change = true)")
                && so_far.reasons[0].contains("WRONG OUTPUT"),
            "{:?}",
            so_far.reasons
        );
    }

    /// The same answer, a near-tie, or no answer to compare (an engine
    /// without logprobs, a child that checked no output, no baseline
    /// verification): recorded, no reason, measured as before.
    #[test]
    fn the_same_output_or_none_to_compare_changes_nothing() {
        let f = fixture("");
        let g = f.gate();
        let near_tie = {
            let mut a = greedy(BEFORE);
            a.tokens[1].top[1].logprob = -0.07;
            a
        };
        let restarting_near_tie = GateState::Restarting {
            so_far: SoFar {
                baseline_output: Some(ChildGolden {
                    operation_id: "baseline-op".into(),
                    golden: match answering(ChildPurpose::Baseline, VerdictKind::Healthy, Some(BEFORE)) {
                        GateEvent::ChildConcluded { golden, .. } => golden.map(|g| GoldenRecord {
                            answer: Some(near_tie.clone()),
                            ..*g
                        }),
                        _ => unreachable!(),
                    },
                }),
                ..established()
            },
            baseline: steady("baseline", 100.0),
        };
        let no_baseline = GateState::Restarting {
            so_far: established(),
            baseline: steady("baseline", 100.0),
        };
        for (at, restarting, event, outcome) in [
            (
                "same",
                restarting_after_baseline(),
                answering(ChildPurpose::Restart, VerdictKind::Healthy, Some(BEFORE)),
                "same",
            ),
            (
                "near-tie",
                restarting_near_tie,
                answering(
                    ChildPurpose::Restart,
                    VerdictKind::Healthy,
                    Some(&[" the", " is", " it"]),
                ),
                "near_tie",
            ),
            (
                "no logprobs",
                restarting_after_baseline(),
                answering(ChildPurpose::Restart, VerdictKind::Healthy, None),
                "not_compared",
            ),
            (
                "no output checked",
                restarting_after_baseline(),
                child(ChildPurpose::Restart, VerdictKind::Healthy),
                "not_compared",
            ),
            (
                "no baseline verification",
                no_baseline,
                answering(ChildPurpose::Restart, VerdictKind::Healthy, Some(OTHER)),
                "not_compared",
            ),
        ] {
            let t = checked(&g, g.step(restarting, event, 0));
            let output = t.next.so_far().output.clone().unwrap_or_else(|| panic!("{at}"));
            let json = serde_json::to_value(&output).unwrap();
            let got = json["check"]["outcome"].as_str().or(json["outcome"].as_str());
            assert_eq!(got, Some(outcome), "{at}: {json}");
            assert!(!output.changed(), "{at}");
            let t = g.step(t.next, GateEvent::LiveChecked(all_live()), 0);
            let GateState::Measuring { so_far, .. } = then(&t) else {
                panic!("{at}: {:?}", t.effects)
            };
            assert!(so_far.reasons.is_empty(), "{at}: {:?}", so_far.reasons);
        }
    }

    /// An answer that changed while the change is not live is not the
    /// change's: not live, rolled back, the output said as well.
    #[test]
    fn an_output_change_with_the_change_not_live_is_not_charged_to_it() {
        let f = fixture("");
        let g = f.gate();
        let t = g.step(
            restarting_after_baseline(),
            answering(ChildPurpose::Restart, VerdictKind::Healthy, Some(OTHER)),
            0,
        );
        let checks = vec![live("prefill-0", None), live("decode-0", Some("decode-0: KNOB absent"))];
        let t = g.step(then(&t).clone(), GateEvent::LiveChecked(checks), 0);
        let GateState::RollingBack { why, so_far, .. } = then(&t) else {
            panic!("{:?}", t.effects)
        };
        assert_eq!(
            *why,
            Why::NotMeasured {
                verdict: GateVerdict::NotLiveRolledBack
            }
        );
        assert!(
            so_far.reasons[0].starts_with("the change is not live"),
            "{:?}",
            so_far.reasons
        );
        assert!(
            so_far.reasons[1].contains("not charged to the change: WRONG OUTPUT"),
            "{:?}",
            so_far.reasons
        );
    }

    /// A pair that came back slow and answering otherwise: the output
    /// change is the verdict (it says more than the budgets), said first.
    #[test]
    fn an_output_change_on_a_pair_back_over_its_budgets_is_the_verdict() {
        let f = fixture("");
        let g = f.gate();
        let t = g.step(
            restarting_after_baseline(),
            answering(ChildPurpose::Restart, VerdictKind::OverBudget, Some(OTHER)),
            0,
        );
        assert!(matches!(
            &t.effects[0],
            GateEffect::Record {
                kind: "output_comparison",
                ..
            }
        ));
        let t = g.step(then(&t).clone(), GateEvent::LiveChecked(all_live()), 0);
        let GateState::RollingBack { why, so_far, .. } = then(&t) else {
            panic!("{:?}", t.effects)
        };
        assert_eq!(why.verdict(), GateVerdict::OutputChangedRolledBack);
        assert!(so_far.reasons[0].starts_with("OUTPUT CHANGED"), "{:?}", so_far.reasons);
        assert!(
            so_far.reasons[1].contains("came back generating"),
            "{:?}",
            so_far.reasons
        );
        // A co-restart that failed is not compared: nothing came back.
        let t = g.step(
            restarting_after_baseline(),
            answering(ChildPurpose::Restart, VerdictKind::Failed, Some(OTHER)),
            0,
        );
        assert!(then(&t).so_far().output.is_none());
        assert_eq!(why_of(then(&t)), GateVerdict::RestartFailedRolledBack);
    }

    fn why_of(state: &GateState) -> GateVerdict {
        match state {
            GateState::RollingBack { why, .. } => why.verdict(),
            other => panic!("not rolling back: {other:?}"),
        }
    }

    /// After the rollback, a moved baseline does not excuse an output
    /// change: it never rested on the benchmark.
    #[test]
    fn a_moved_baseline_does_not_excuse_an_output_change() {
        let f = fixture("");
        let g = f.gate();
        let measuring = GateState::RollbackMeasuring {
            so_far: SoFar {
                rollback_live: all_live(),
                ..established()
            },
            why: Why::NotMeasured {
                verdict: GateVerdict::OutputChangedRolledBack,
            },
            baseline: steady("baseline", 100.0),
            look: 1,
            again: None,
        };
        let t = g.step(measuring, GateEvent::Measured(steady("rollback#1", 140.0)), 0);
        assert_eq!(verdict_of(then(&t)), GateVerdict::OutputChangedRolledBack);
        assert!(then(&t).so_far().reasons[0].starts_with("the benchmark moved"));
    }

    /// Each state is journaled under its step's label, the one older
    /// journals hold (a stopped gate: the step it stopped in), and its data
    /// reads back as it was.
    #[test]
    fn states_are_journaled_under_the_steps_labels_and_read_back() {
        for step in GateStep::ALL {
            assert_eq!(serde_json::to_value(step).unwrap(), step.as_str());
            assert_eq!(GateStep::parse(step.as_str()), Some(step));
        }
        assert_eq!(GateStep::parse("gate_wondering"), None);
        assert_eq!(GateStep::RollbackVerifyingLive.record_name(), "rollback-verifying-live");
        let baseline = steady("baseline", 100.0);
        let why = Why::Interrupted;
        let so_far = established();
        let states = [
            GateState::Baseline {
                so_far: so_far.clone(),
                looks: 1,
                measured: Some(baseline.clone()),
            },
            GateState::Applying {
                so_far: so_far.clone(),
                baseline: baseline.clone(),
            },
            GateState::Restarting {
                so_far: so_far.clone(),
                baseline: baseline.clone(),
            },
            GateState::VerifyingLive {
                so_far: so_far.clone(),
                baseline: baseline.clone(),
                over_budget_with_the_change: true,
            },
            GateState::Measuring {
                so_far: so_far.clone(),
                baseline: baseline.clone(),
                look: 2,
                after: None,
            },
            GateState::Judging {
                so_far: so_far.clone(),
                look: 1,
                judgement: judge::judge(
                    &metrics(&baseline, &baseline),
                    baseline.tally(),
                    baseline.tally(),
                    fixture("").gate().policy,
                    1,
                ),
            },
            GateState::RollingBack {
                so_far: so_far.clone(),
                why: why.clone(),
                baseline: None,
            },
            GateState::RollbackRestarting {
                so_far: so_far.clone(),
                why: why.clone(),
                baseline: Some(baseline.clone()),
            },
            GateState::RollbackVerifyingLive {
                so_far: so_far.clone(),
                why: why.clone(),
                baseline: None,
            },
            GateState::RollbackMeasuring {
                so_far: so_far.clone(),
                why: Why::NotMeasured {
                    verdict: GateVerdict::RejectedRolledBack,
                },
                baseline: baseline.clone(),
                look: 1,
                again: None,
            },
            GateState::Concluded {
                verdict: GateVerdict::Accepted,
                so_far: so_far.clone(),
            },
        ];
        for s in states {
            let json = serde_json::to_value(&s).unwrap();
            assert_eq!(json["state"], Gating::label(&s));
            // The journaled form is the step and its scalars: the evidence
            // and the measurements are journaled as they arrive, not again
            // in every state (a state entry stays small; etcd caps a value).
            for heavy in ["so_far", "baseline", "measured", "after", "again"] {
                assert!(json.get(heavy).is_none(), "{heavy} in {json}");
            }
            let back = serde_json::from_value::<GateState>(json.clone()).unwrap();
            assert_eq!(serde_json::to_value(&back).unwrap(), json);
            assert_eq!(Gating::label(&back), Gating::label(&s));
        }
        let stopped = GateState::Stopped {
            at: GateStep::Measuring,
            failed: "disk full".into(),
            so_far,
        };
        assert_eq!(Gating::label(&stopped), "gate_measuring");
        let json = serde_json::to_value(&stopped).unwrap();
        assert_eq!(
            (json["state"].as_str(), json["at"].as_str()),
            (Some("stopped"), Some("gate_measuring"))
        );
        let back = serde_json::from_value::<GateState>(json).unwrap();
        assert!(
            matches!(back, GateState::Stopped { at: GateStep::Measuring, ref failed, .. } if failed == "disk full")
        );
    }
}
