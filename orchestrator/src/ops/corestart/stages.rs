//! A co-restart (or a verification) from its first step to its verdict, as
//! data (issue 33): out of the serving router, the start order (its own
//! machine, `super::machine`), the order's evidence assessed, xPyD engines
//! the router did not reach proven, the suite, every layer's counters, back
//! into the serving router, concluded. One pure step decides, from the
//! evidence so far (`judge::evidence::conclude`), which comes next; the
//! runtime (`ops::machine`) journals each stage as the operation's state
//! before its effect is carried out (must-write: it replaced transitions
//! whose failed write was ignored), and `super` carries the effects out.
//!
//! What a stage's journaled data holds is what a resume needs — the stage,
//! and where the order began; the evidence is journaled as it arrives
//! (phases, attempts, probes, counters), not again in the state.
//!
//! A journal that fails stops the run at the stage it failed in (the
//! evidence says so); `super` then gathers what the run did not get to —
//! the order's start-ups, the units not running, a drained pair's "left
//! out" — without sending anything, and concludes.

use serde::{Deserialize, Serialize};

use super::{CoRestartStep, OperationKind};
use crate::ops::journal::JournalError;
use crate::ops::machine::{Effect, Machine, Transition};
use pdwarden_model::forensics::CaptureSummary;
use pdwarden_model::judge::evidence::{EngineCounters, Evidence, NotRunning, RouterCounters, UnreachedProof, conclude};
use pdwarden_model::judge::golden::{GoldenRecord, PathCheck};
use pdwarden_model::judge::suite::{StepReport, SuiteStep};
use pdwarden_model::judge::verdict::{ProbeObservation, ProbePolicy, UnitStartup};
use pdwarden_model::report::{DrainRecord, EngineCounterRecord, RejoinRecord};

/// What the operation has established so far (not journaled with the
/// stage: its parts are journaled as they arrive).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SoFar {
    pub evidence: Evidence,
    /// The probes' budgets, once the order's evidence is assessed.
    pub policy: Option<ProbePolicy>,
    /// The drain out of the serving router, and its rejoin.
    pub drain: Option<DrainRecord>,
    /// The write that stopped the order, if one did.
    pub order_error: Option<String>,
    /// The engines' counters after the requests, for the report.
    pub engine_counters: Vec<EngineCounterRecord>,
    /// The order's evidence was assessed (`Assessed`).
    pub assessed: bool,
    /// The units not running were read (`Counted`).
    pub counted: bool,
    /// The output check, for the report (its finding is in `evidence`).
    pub golden: Option<GoldenRecord>,
    /// What the pair looked like before it was stopped (issue 35).
    pub capture: Option<CaptureSummary>,
}

impl SoFar {
    /// Healthy on the evidence so far (false before the assessment).
    pub fn healthy(&self) -> bool {
        self.policy
            .as_ref()
            .is_some_and(|p| conclude(&self.evidence, p).kind.is_healthy())
    }

    /// Files the order's evidence in.
    pub fn assess(&mut self, a: Assessment) {
        self.evidence.startups = a.startups;
        self.evidence.probes = a.probes;
        self.evidence.notes = a.live;
        // The write that stopped the order, or else the first that failed:
        // a journal missing part of the operation cannot conclude healthy.
        self.evidence.journal_error = self.order_error.clone().or(a.journal_failure);
        self.policy = Some(a.policy);
        self.assessed = true;
    }

    /// Files the units not running in, and a failed write not yet said.
    pub fn count(&mut self, not_running: Vec<NotRunning>, journal_failure: Option<String>) {
        if self.evidence.journal_error.is_none() {
            self.evidence.journal_error = journal_failure;
        }
        self.evidence.not_running = not_running;
        self.counted = true;
    }
}

/// The order's evidence, gathered once it is over (or stopped).
#[derive(Debug, Clone, PartialEq)]
pub struct Assessment {
    pub startups: Vec<UnitStartup>,
    pub probes: Vec<ProbeObservation>,
    /// What is live when the order stopped part-way.
    pub live: Vec<String>,
    pub policy: ProbePolicy,
    /// The first journal write of the operation that failed, if one did.
    pub journal_failure: Option<String>,
}

/// Where the operation is; journaled as its state on entry (the serde tag
/// `stage` with its data; the state label is [`Stages::label`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "stage", rename_all = "snake_case")]
pub enum Stage {
    /// A pair judged wedged: its evidence captured before anything is
    /// stopped or drained (issue 35).
    Capturing {
        #[serde(skip)]
        so_far: Box<SoFar>,
    },
    /// Out of the shared serving router (`[pair.serving_router]` only).
    Draining {
        #[serde(skip)]
        so_far: Box<SoFar>,
    },
    /// The start order from `from` (a verification: its probe series).
    Ordering {
        from: CoRestartStep,
        #[serde(skip)]
        so_far: Box<SoFar>,
    },
    /// The order is over: its evidence gathered and judged.
    Assessing {
        #[serde(skip)]
        so_far: Box<SoFar>,
    },
    /// xPyD engines the probe series did not reach, proven directly.
    ProvingUnreached {
        #[serde(skip)]
        so_far: Box<SoFar>,
    },
    /// The verification suite through the router.
    Verifying {
        #[serde(skip)]
        so_far: Box<SoFar>,
    },
    /// The greedy answer held to its reference (issue 34), once the suite
    /// found the pair sound.
    CheckingOutput {
        #[serde(skip)]
        so_far: Box<SoFar>,
    },
    /// Every layer's counters after the requests, and the units not running.
    Counting {
        #[serde(skip)]
        so_far: Box<SoFar>,
    },
    /// Back into the serving router (`healthy`), or recorded as left out.
    Rejoining {
        healthy: bool,
        #[serde(skip)]
        so_far: Box<SoFar>,
    },
    /// Everything is in: the verdict follows.
    Concluded {
        #[serde(skip)]
        so_far: Box<SoFar>,
    },
}

impl Stage {
    pub fn so_far(&self) -> &SoFar {
        match self {
            Stage::Capturing { so_far }
            | Stage::Draining { so_far }
            | Stage::Ordering { so_far, .. }
            | Stage::Assessing { so_far }
            | Stage::ProvingUnreached { so_far }
            | Stage::CheckingOutput { so_far }
            | Stage::Verifying { so_far }
            | Stage::Counting { so_far }
            | Stage::Rejoining { so_far, .. }
            | Stage::Concluded { so_far } => so_far,
        }
    }

    pub fn into_so_far(self) -> SoFar {
        match self {
            Stage::Capturing { so_far }
            | Stage::Draining { so_far }
            | Stage::Ordering { so_far, .. }
            | Stage::Assessing { so_far }
            | Stage::ProvingUnreached { so_far }
            | Stage::CheckingOutput { so_far }
            | Stage::Verifying { so_far }
            | Stage::Counting { so_far }
            | Stage::Rejoining { so_far, .. }
            | Stage::Concluded { so_far } => *so_far,
        }
    }

    /// Where a resume continues from, by the step the stage was in: before
    /// the order, from its beginning; in it, where it began (the order's
    /// own journaled state, written after, is more precise); after it, the
    /// verdict is reached again from the probes.
    pub fn resume_step(&self) -> CoRestartStep {
        match self {
            Stage::Capturing { .. } | Stage::Draining { .. } => CoRestartStep::Started,
            Stage::Ordering { from, .. } => *from,
            Stage::Concluded { .. } => CoRestartStep::Concluded,
            _ => CoRestartStep::Probing,
        }
    }
}

/// What a stage asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageEffect {
    /// Capture the pair's evidence (read-only, bounded).
    Capture,
    /// Out of the serving router (`wait`: for the engines' work).
    Drain { wait: bool },
    /// The start order from `from` (a verification: its probe series).
    RunOrder { from: CoRestartStep },
    /// Gather the order's evidence (reads only).
    Assess,
    /// Prove the xPyD engines the probes did not reach.
    ProveUnreached,
    /// The greedy request, its answer held to the reference.
    CheckOutput,
    /// The suite (`abort_storm` included or not).
    RunSuite { abort_storm: bool },
    /// Read the counters (`scrape`: of every engine and router; else only
    /// which units are not running) and the journal's first failed write.
    ReadCounters { scrape: bool },
    /// Back into the serving router (`healthy`), or recorded as left out.
    Rejoin { healthy: bool },
}

// Each effect journals its own writes (the drain's removal, the starts'
// commands) or sends nothing that changes a unit.
impl Effect for StageEffect {}

/// A journal write that failed (its words): what stopped the suite.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct JournalFailed(pub String);

/// What carrying out a [`StageEffect`] answered.
#[derive(Debug, Clone, PartialEq)]
pub enum StageEvent {
    /// The capture is journaled; its summary for the report.
    Captured(Box<CaptureSummary>),
    Drained(Box<DrainRecord>),
    /// The order is over; the write that stopped it, if one did.
    OrderRan {
        journal_error: Option<String>,
    },
    Assessed(Box<Assessment>),
    Proven(Vec<UnreachedProof>),
    /// The output check's record (`None`: the pair has no path to send it),
    /// and an xPyD pair's findings along each prefill → decode path.
    OutputChecked(Option<Box<GoldenRecord>>, Vec<PathCheck>),
    /// The suite's steps and those not run, or the write that stopped it.
    SuiteRan(Result<(Vec<StepReport>, Vec<SuiteStep>), JournalFailed>),
    Counted {
        engines: Vec<EngineCounters>,
        routers: Vec<RouterCounters>,
        engine_counters: Vec<EngineCounterRecord>,
        not_running: Vec<NotRunning>,
        journal_failure: Option<String>,
    },
    Rejoined(Box<RejoinRecord>),
}

/// One co-restart or verification of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stages {
    pub kind: OperationKind,
    /// An automatic recovery (its trigger journaled): the drain does not
    /// wait for a wedged pair's work, and one that cannot be done does not
    /// stop it.
    pub recovery: bool,
    /// The pair is behind a shared serving router.
    pub serving_router: bool,
    /// More than one prefill or decode.
    pub xpyd: bool,
    /// The abort storm runs in the suite.
    pub abort_storm: bool,
    /// The pair was judged wedged (a recovery's trigger, or the watch's
    /// state when the operator asked): its evidence is captured first.
    pub capture: bool,
}

impl Stages {
    /// The first stage and what it asks for; `from`: where the order begins
    /// (a resume may begin past prefill).
    pub fn start(&self, from: CoRestartStep) -> Transition<Stage, StageEffect> {
        let so_far = Box::default();
        if self.capture && self.kind == OperationKind::CoRestart {
            return Transition::then(Stage::Capturing { so_far }, StageEffect::Capture);
        }
        self.first_change(from, so_far)
    }

    /// The first stage that changes anything: out of the serving router,
    /// or the start order.
    fn first_change(&self, from: CoRestartStep, so_far: Box<SoFar>) -> Transition<Stage, StageEffect> {
        match self.kind {
            OperationKind::CoRestart if self.serving_router => {
                Transition::then(Stage::Draining { so_far }, StageEffect::Drain { wait: !self.recovery })
            }
            _ => Transition::then(Stage::Ordering { from, so_far }, StageEffect::RunOrder { from }),
        }
    }

    /// After the suite (or in place of it): the counters.
    fn counting(&self, so_far: Box<SoFar>) -> Transition<Stage, StageEffect> {
        // What a retrying router hid: read once the requests were sent,
        // and only while the journal holds the operation.
        let scrape = so_far.evidence.journal_error.is_none() && !so_far.evidence.probes.is_empty();
        Transition::then(Stage::Counting { so_far }, StageEffect::ReadCounters { scrape })
    }
}

impl Machine for Stages {
    type State = Stage;
    type Event = StageEvent;
    type Effect = StageEffect;

    fn label(state: &Stage) -> &'static str {
        match state {
            Stage::Capturing { .. } => CoRestartStep::Capturing.as_str(),
            Stage::Draining { .. } => CoRestartStep::Draining.as_str(),
            Stage::Ordering { from, .. } => from.as_str(),
            Stage::Assessing { .. } | Stage::ProvingUnreached { .. } => CoRestartStep::Probing.as_str(),
            Stage::Verifying { .. } | Stage::CheckingOutput { .. } | Stage::Counting { .. } => {
                CoRestartStep::Verifying.as_str()
            }
            Stage::Rejoining { .. } => CoRestartStep::Rejoining.as_str(),
            Stage::Concluded { .. } => CoRestartStep::Concluded.as_str(),
        }
    }

    fn step(&self, state: Stage, event: StageEvent, _now_ms: u64) -> Transition<Stage, StageEffect> {
        match (state, event) {
            (Stage::Capturing { mut so_far }, StageEvent::Captured(summary)) => {
                so_far.capture = Some(*summary);
                self.first_change(CoRestartStep::RestartingPrefill, so_far)
            }
            (Stage::Draining { mut so_far }, StageEvent::Drained(d)) => {
                let refused = d.error.is_some() && !self.recovery;
                so_far.drain = Some(*d);
                if refused {
                    // Nothing is touched: the order's evidence says "not
                    // started" for every unit.
                    so_far.evidence.drain.refused = true;
                    Transition::then(Stage::Assessing { so_far }, StageEffect::Assess)
                } else {
                    let from = CoRestartStep::RestartingPrefill;
                    Transition::then(Stage::Ordering { from, so_far }, StageEffect::RunOrder { from })
                }
            }
            (Stage::Ordering { mut so_far, .. }, StageEvent::OrderRan { journal_error }) => {
                so_far.order_error = journal_error;
                Transition::then(Stage::Assessing { so_far }, StageEffect::Assess)
            }
            (Stage::Assessing { mut so_far }, StageEvent::Assessed(a)) => {
                so_far.assess(*a);
                if !so_far.healthy() {
                    self.counting(so_far)
                } else if self.xpyd {
                    // The router's policy may have sent the whole probe
                    // series to one engine of a side: each engine it did
                    // not reach is proven before the suite meets its cold
                    // first answer.
                    Transition::then(Stage::ProvingUnreached { so_far }, StageEffect::ProveUnreached)
                } else {
                    Transition::then(
                        Stage::Verifying { so_far },
                        StageEffect::RunSuite {
                            abort_storm: self.abort_storm,
                        },
                    )
                }
            }
            (Stage::ProvingUnreached { mut so_far }, StageEvent::Proven(proofs)) => {
                so_far.evidence.unreached = proofs;
                if so_far.healthy() {
                    Transition::then(
                        Stage::Verifying { so_far },
                        StageEffect::RunSuite {
                            abort_storm: self.abort_storm,
                        },
                    )
                } else {
                    self.counting(so_far)
                }
            }
            (Stage::Verifying { mut so_far }, StageEvent::SuiteRan(ran)) => {
                match ran {
                    Ok((steps, not_run)) => {
                        so_far.evidence.suite = steps;
                        so_far.evidence.suite_not_run = not_run;
                    }
                    Err(e) => so_far.evidence.journal_error = Some(e.0),
                }
                // The output is checked on a pair the suite found sound:
                // a pair that is wedged or failing is already judged (and
                // its faults, a stream frozen after N tokens, would show
                // as the greedy request's, not as what they are).
                if so_far.healthy() {
                    Transition::then(Stage::CheckingOutput { so_far }, StageEffect::CheckOutput)
                } else {
                    self.counting(so_far)
                }
            }
            (Stage::CheckingOutput { mut so_far }, StageEvent::OutputChecked(record, paths)) => {
                if let Some(record) = record {
                    so_far.evidence.output = Some(record.check.clone());
                    so_far.golden = Some(*record);
                }
                so_far.evidence.paths = paths;
                self.counting(so_far)
            }
            (
                Stage::Counting { mut so_far },
                StageEvent::Counted {
                    engines,
                    routers,
                    engine_counters,
                    not_running,
                    journal_failure,
                },
            ) => {
                so_far.evidence.engines = engines;
                so_far.evidence.routers = routers;
                so_far.engine_counters = engine_counters;
                so_far.count(not_running, journal_failure);
                // A drained pair goes back only if healthy; one that could
                // not be drained never left the rotation.
                if so_far.drain.as_ref().is_some_and(|d| d.error.is_none()) {
                    let healthy = so_far.healthy();
                    Transition::then(Stage::Rejoining { healthy, so_far }, StageEffect::Rejoin { healthy })
                } else {
                    Transition::to(Stage::Concluded { so_far })
                }
            }
            (Stage::Rejoining { healthy, mut so_far }, StageEvent::Rejoined(r)) => {
                so_far.evidence.drain.not_put_back = healthy && !r.put_back;
                if let Some(d) = so_far.drain.as_mut() {
                    d.rejoin = Some(*r);
                }
                Transition::to(Stage::Concluded { so_far })
            }
            // An answer this stage did not ask for moves nothing.
            (state, _) => Transition::to(state),
        }
    }

    /// The journal failed: the run stops here; the evidence says so.
    fn stopped_by_the_journal(&self, state: Stage, error: &JournalError) -> Stage {
        let mut so_far = Box::new(state.into_so_far());
        so_far.evidence.journal_error.get_or_insert_with(|| error.to_string());
        Stage::Concluded { so_far }
    }
}

/// Every transition of the stages, walked (pure: no journal, no agent).
#[cfg(test)]
mod tests {
    use super::*;
    use pdwarden_model::judge::golden::{OutputCheck, OutputIdentity};
    use pdwarden_model::judge::verdict::{ColdAllowance, ReadinessPhase};

    fn stages(kind: OperationKind) -> Stages {
        Stages {
            kind,
            recovery: false,
            serving_router: false,
            xpyd: false,
            abort_storm: false,
            capture: false,
        }
    }

    fn policy() -> ProbePolicy {
        ProbePolicy {
            warm_budget_ms: 1_000,
            cold_allowance: ColdAllowance::Configured {
                ms: 10_000,
                why: String::new(),
            },
            cold_start_possible: true,
            warm_probes: 2,
            cold_answers: 1,
            fresh_engine_answers: Vec::new(),
        }
    }

    fn probe() -> ProbeObservation {
        ProbeObservation::Ok {
            latency_ms: 50,
            tokens: 8,
        }
    }

    fn startup(unit: &str, generating: bool) -> UnitStartup {
        UnitStartup {
            unit: unit.into(),
            role: "prefill".into(),
            furthest: generating.then_some(ReadinessPhase::Generating),
            exited: false,
            lost_contact: false,
            last_detail: String::new(),
            waited_ms: 0,
            failed_checks: Vec::new(),
        }
    }

    fn assessed(healthy: bool) -> StageEvent {
        StageEvent::Assessed(Box::new(Assessment {
            startups: vec![startup("prefill-0", healthy)],
            probes: if healthy { vec![probe(), probe()] } else { vec![] },
            live: vec![],
            policy: policy(),
            journal_failure: None,
        }))
    }

    fn same() -> GoldenRecord {
        GoldenRecord {
            identity: OutputIdentity {
                model: "m".into(),
                fingerprint: "f".into(),
            },
            check: OutputCheck::Same {
                tokens: 32,
                reference_operation: "ref".into(),
            },
            reference: None,
            answer: None,
        }
    }

    fn output(record: GoldenRecord) -> StageEvent {
        StageEvent::OutputChecked(Some(Box::new(record)), vec![])
    }

    /// Issue 34: the greedy answer is checked after the suite found the
    /// pair sound; wrong output (or a greedy request that failed) is never
    /// healthy; a pair with no path to send it on goes on to the counters.
    #[test]
    fn wrong_output_after_the_suite_is_never_healthy() {
        let m = stages(OperationKind::CoRestart);
        let to_output = || {
            vec![
                StageEvent::OrderRan { journal_error: None },
                assessed(true),
                StageEvent::SuiteRan(Ok((vec![], vec![]))),
            ]
        };
        for wrong in [
            OutputCheck::Diverged {
                position: 2,
                reference: " is blue".into(),
                answer: " was green".into(),
                margin: Some(2.9),
                at_least: false,
                reference_operation: "ref".into(),
            },
            OutputCheck::Unanswered {
                error: "http 500".into(),
            },
        ] {
            let mut events = to_output();
            events.push(output(GoldenRecord {
                check: wrong.clone(),
                ..same()
            }));
            let (seen, end) = walk(&m, CoRestartStep::RestartingPrefill, events);
            assert_eq!(seen[3], ("verifying", vec![StageEffect::CheckOutput]));
            assert_eq!(seen[4], ("verifying", vec![StageEffect::ReadCounters { scrape: true }]));
            assert!(!end.so_far().healthy(), "{wrong:?}");
            assert_eq!(end.so_far().evidence.output.as_ref(), Some(&wrong));
        }
        for fine in [
            Some(Box::new(GoldenRecord {
                check: OutputCheck::NoReference { tokens: 32 },
                ..same()
            })),
            None,
        ] {
            let mut events = to_output();
            events.push(StageEvent::OutputChecked(fine, vec![]));
            let (seen, end) = walk(&m, CoRestartStep::RestartingPrefill, events);
            assert_eq!(seen[4].1, [StageEffect::ReadCounters { scrape: true }]);
            assert!(end.so_far().healthy());
        }
    }

    /// Issue 34, item 3: in an xPyD pair, one path that answers wrong is
    /// wrong output like the router's, however right the router's answer
    /// was.
    #[test]
    fn a_wrong_path_is_never_healthy() {
        use pdwarden_model::judge::golden::HeldTo;
        let mut m = stages(OperationKind::CoRestart);
        m.xpyd = true;
        let path = |decode: &str, check: OutputCheck| PathCheck {
            prefill: "prefill-0".into(),
            decode: decode.into(),
            held_to: HeldTo::Reference,
            check,
        };
        let events = |paths| {
            vec![
                StageEvent::OrderRan { journal_error: None },
                assessed(true),
                StageEvent::Proven(vec![]),
                StageEvent::SuiteRan(Ok((vec![], vec![]))),
                StageEvent::OutputChecked(Some(Box::new(same())), paths),
            ]
        };
        let (seen, end) = walk(
            &m,
            CoRestartStep::RestartingPrefill,
            events(vec![path("decode-0", same().check), path("decode-1", same().check)]),
        );
        assert_eq!(seen[4].1, [StageEffect::CheckOutput]);
        assert_eq!(seen[5].1, [StageEffect::ReadCounters { scrape: true }]);
        assert!(end.so_far().healthy());
        let wrong = OutputCheck::Diverged {
            position: 2,
            reference: " is blue".into(),
            answer: " was green".into(),
            margin: Some(2.9),
            at_least: false,
            reference_operation: "ref".into(),
        };
        let (seen, end) = walk(
            &m,
            CoRestartStep::RestartingPrefill,
            events(vec![path("decode-0", same().check), path("decode-1", wrong)]),
        );
        assert_eq!(seen[5].1, [StageEffect::ReadCounters { scrape: true }]);
        assert!(!end.so_far().healthy());
        assert_eq!(end.so_far().evidence.paths.len(), 2);
    }

    fn counted() -> StageEvent {
        StageEvent::Counted {
            engines: vec![],
            routers: vec![],
            engine_counters: vec![],
            not_running: vec![],
            journal_failure: None,
        }
    }

    /// Walks `events` from the start, checking the label of each stage
    /// entered and the effect it asks for.
    fn walk(
        m: &Stages,
        from: CoRestartStep,
        events: Vec<StageEvent>,
    ) -> (Vec<(&'static str, Vec<StageEffect>)>, Stage) {
        let t = m.start(from);
        let mut seen = vec![(Stages::label(&t.next), t.effects.clone())];
        let mut state = t.next;
        for e in events {
            let t = m.step(state, e, 0);
            seen.push((Stages::label(&t.next), t.effects.clone()));
            state = t.next;
        }
        (seen, state)
    }

    /// Issue 35: a pair judged wedged is captured first, then drained (if
    /// it is behind a serving router) or restarted; the capture's summary
    /// is kept for the report. A verification never captures.
    #[test]
    fn a_pair_judged_wedged_is_captured_before_anything_changes() {
        let mut m = stages(OperationKind::CoRestart);
        m.capture = true;
        let summary = CaptureSummary {
            why: "automatic recovery".into(),
            ..Default::default()
        };
        let (seen, end) = walk(
            &m,
            CoRestartStep::RestartingPrefill,
            vec![
                StageEvent::Captured(Box::new(summary.clone())),
                StageEvent::OrderRan { journal_error: None },
            ],
        );
        assert_eq!(seen[0], ("capturing", vec![StageEffect::Capture]));
        assert_eq!(
            seen[1],
            (
                "restarting_prefill",
                vec![StageEffect::RunOrder {
                    from: CoRestartStep::RestartingPrefill
                }]
            )
        );
        assert_eq!(end.so_far().capture, Some(summary.clone()));
        m.serving_router = true;
        m.recovery = true;
        let (seen, _) = walk(
            &m,
            CoRestartStep::RestartingPrefill,
            vec![StageEvent::Captured(Box::new(summary))],
        );
        assert_eq!(seen[1], ("draining", vec![StageEffect::Drain { wait: false }]));
        let mut v = stages(OperationKind::Verify {
            include_abort_storm: false,
        });
        v.capture = true;
        assert_ne!(Stages::label(&v.start(CoRestartStep::Probing).next), "capturing");
    }

    /// A healthy 1P1D co-restart: order, assess, suite, counters, concluded.
    #[test]
    fn a_healthy_co_restart_runs_the_suite_then_the_counters() {
        let mut m = stages(OperationKind::CoRestart);
        m.abort_storm = true;
        let (seen, end) = walk(
            &m,
            CoRestartStep::RestartingPrefill,
            vec![
                StageEvent::OrderRan { journal_error: None },
                assessed(true),
                StageEvent::SuiteRan(Ok((vec![], vec![]))),
                output(same()),
                counted(),
            ],
        );
        use StageEffect as E;
        assert_eq!(
            seen,
            [
                (
                    "restarting_prefill",
                    vec![E::RunOrder {
                        from: CoRestartStep::RestartingPrefill
                    }]
                ),
                ("probing", vec![E::Assess]),
                ("verifying", vec![E::RunSuite { abort_storm: true }]),
                ("verifying", vec![E::CheckOutput]),
                ("verifying", vec![E::ReadCounters { scrape: true }]),
                ("concluded", vec![]),
            ]
        );
        let so_far = end.so_far();
        assert!(so_far.healthy() && so_far.assessed && so_far.counted);
        assert_eq!(so_far.evidence.output, Some(same().check));
        assert_eq!(so_far.golden, Some(same()));
        // The journaled form is the stage and where the order began.
        let json = serde_json::to_value(Stage::Ordering {
            from: CoRestartStep::RestartingDecode,
            so_far: Box::default(),
        })
        .unwrap();
        assert_eq!(
            json,
            serde_json::json!({"stage": "ordering", "from": "restarting_decode"})
        );
        let back: Stage = serde_json::from_value(json).unwrap();
        assert_eq!(back.resume_step(), CoRestartStep::RestartingDecode);
    }

    /// An order that failed skips the suite; one with no probes reads no
    /// counters; a verification starts at its probe series.
    #[test]
    fn an_unhealthy_order_goes_straight_to_the_counters() {
        let m = stages(OperationKind::Verify {
            include_abort_storm: false,
        });
        let (seen, end) = walk(
            &m,
            CoRestartStep::Probing,
            vec![
                StageEvent::OrderRan {
                    journal_error: Some("disk full".into()),
                },
                assessed(true),
                counted(),
            ],
        );
        assert_eq!(seen[0].0, "probing");
        assert_eq!(
            seen[2],
            ("verifying", vec![StageEffect::ReadCounters { scrape: false }])
        );
        assert_eq!(end.so_far().evidence.journal_error.as_deref(), Some("disk full"));
        assert!(!end.so_far().healthy());
        let (seen, _) = walk(
            &stages(OperationKind::CoRestart),
            CoRestartStep::RestartingPrefill,
            vec![StageEvent::OrderRan { journal_error: None }, assessed(false)],
        );
        assert_eq!(
            seen[2],
            ("verifying", vec![StageEffect::ReadCounters { scrape: false }])
        );
    }

    /// xPyD: the unreached engines are proven before the suite; a proof
    /// that fails skips it.
    #[test]
    fn xpyd_proves_the_unreached_engines_before_the_suite() {
        let mut m = stages(OperationKind::CoRestart);
        m.xpyd = true;
        let order = || vec![StageEvent::OrderRan { journal_error: None }, assessed(true)];
        let (seen, _) = walk(&m, CoRestartStep::RestartingPrefill, order());
        assert_eq!(seen[2], ("probing", vec![StageEffect::ProveUnreached]));
        let mut events = order();
        events.push(StageEvent::Proven(vec![UnreachedProof {
            target: "decode-1".into(),
            prefill: "prefill-0".into(),
            decode: "decode-1".into(),
            error: None,
        }]));
        let (seen, _) = walk(&m, CoRestartStep::RestartingPrefill, events);
        assert_eq!(seen[3].1, [StageEffect::RunSuite { abort_storm: false }]);
        let mut events = order();
        events.push(StageEvent::Proven(vec![UnreachedProof {
            target: "decode-1".into(),
            prefill: "prefill-0".into(),
            decode: "decode-1".into(),
            error: Some("KV transfer failed".into()),
        }]));
        let (seen, end) = walk(&m, CoRestartStep::RestartingPrefill, events);
        assert_eq!(seen[3].1, [StageEffect::ReadCounters { scrape: true }]);
        assert!(!end.so_far().healthy());
        // The suite that could not be journaled: said as the journal.
        let t = m.step(
            Stage::Verifying { so_far: Box::default() },
            StageEvent::SuiteRan(Err(JournalFailed("disk full".into()))),
            0,
        );
        assert_eq!(t.next.so_far().evidence.journal_error.as_deref(), Some("disk full"));
    }

    /// Behind a serving router: drained first (a recovery does not wait),
    /// back in after the counters with the verdict so far; a drain that
    /// cannot be done stops a co-restart before anything is touched, and
    /// a recovery goes on without the rejoin.
    #[test]
    fn a_drained_pair_rejoins_after_the_counters_or_is_refused() {
        let mut m = stages(OperationKind::CoRestart);
        m.serving_router = true;
        let drained = |error: Option<&str>| {
            StageEvent::Drained(Box::new(DrainRecord {
                error: error.map(Into::into),
                ..Default::default()
            }))
        };
        let (seen, end) = walk(
            &m,
            CoRestartStep::RestartingPrefill,
            vec![
                drained(None),
                StageEvent::OrderRan { journal_error: None },
                assessed(true),
                StageEvent::SuiteRan(Ok((vec![], vec![]))),
                StageEvent::OutputChecked(None, vec![]),
                counted(),
                StageEvent::Rejoined(Box::new(RejoinRecord {
                    put_back: false,
                    ..Default::default()
                })),
            ],
        );
        assert_eq!(seen[0], ("draining", vec![StageEffect::Drain { wait: true }]));
        assert_eq!(seen[6], ("rejoining", vec![StageEffect::Rejoin { healthy: true }]));
        assert_eq!(seen[7].0, "concluded");
        let so_far = end.so_far();
        assert!(so_far.evidence.drain.not_put_back, "healthy but not put back");
        assert!(so_far.drain.as_ref().unwrap().rejoin.is_some());
        // Not healthy: recorded as left out.
        let (seen, _) = walk(
            &m,
            CoRestartStep::RestartingPrefill,
            vec![
                drained(None),
                StageEvent::OrderRan { journal_error: None },
                assessed(false),
                counted(),
            ],
        );
        assert_eq!(seen[4], ("rejoining", vec![StageEffect::Rejoin { healthy: false }]));
        // Refused: nothing touched, assessed as not started, no rejoin.
        let (seen, end) = walk(
            &m,
            CoRestartStep::RestartingPrefill,
            vec![drained(Some("router down")), assessed(false), counted()],
        );
        assert_eq!(seen[1], ("probing", vec![StageEffect::Assess]));
        assert_eq!(seen[3], ("concluded", vec![]));
        assert!(end.so_far().evidence.drain.refused);
        // A recovery: not waiting, and on through a drain that failed.
        m.recovery = true;
        let (seen, end) = walk(&m, CoRestartStep::RestartingPrefill, vec![drained(Some("router down"))]);
        assert_eq!(seen[0].1, [StageEffect::Drain { wait: false }]);
        assert_eq!(seen[1].0, "restarting_prefill");
        assert!(!end.so_far().evidence.drain.refused);
    }

    /// The journal failing stops the run where it is, said in the
    /// evidence; a stray answer moves nothing; each stage maps to where a
    /// resume continues.
    #[test]
    fn the_journal_stops_the_run_and_stray_answers_move_nothing() {
        let m = stages(OperationKind::CoRestart);
        let err = JournalError::from(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            Some("full".into()),
        ));
        let end = m.stopped_by_the_journal(Stage::Verifying { so_far: Box::default() }, &err);
        assert!(matches!(end, Stage::Concluded { .. }));
        assert!(end.so_far().evidence.journal_error.as_deref().unwrap().contains("full"));
        let s = Stage::Counting { so_far: Box::default() };
        let t = m.step(s.clone(), StageEvent::Proven(vec![]), 0);
        assert_eq!((t.next, t.effects), (s, vec![]));
        let so_far = Box::<SoFar>::default;
        for (stage, step) in [
            (Stage::Capturing { so_far: so_far() }, CoRestartStep::Started),
            (Stage::Draining { so_far: so_far() }, CoRestartStep::Started),
            (
                Stage::Ordering {
                    from: CoRestartStep::RestartingRouter,
                    so_far: so_far(),
                },
                CoRestartStep::RestartingRouter,
            ),
            (Stage::Assessing { so_far: so_far() }, CoRestartStep::Probing),
            (Stage::ProvingUnreached { so_far: so_far() }, CoRestartStep::Probing),
            (Stage::CheckingOutput { so_far: so_far() }, CoRestartStep::Probing),
            (Stage::Verifying { so_far: so_far() }, CoRestartStep::Probing),
            (Stage::Counting { so_far: so_far() }, CoRestartStep::Probing),
            (
                Stage::Rejoining {
                    healthy: true,
                    so_far: so_far(),
                },
                CoRestartStep::Probing,
            ),
            (Stage::Concluded { so_far: so_far() }, CoRestartStep::Concluded),
        ] {
            assert_eq!(stage.resume_step(), step, "{stage:?}");
        }
    }
}
