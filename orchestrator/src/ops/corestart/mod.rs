//! The ordered co-restart of a PD pair: prefill, then decode, then router,
//! each gated on real generation readiness, then end-to-end probes.
//!
//! Why this order (INCIDENTS row 1): decode bootstraps its KV-transfer link to
//! prefill when it starts, and the router discovers both. A decode started
//! against a prefill that is not yet generating, or a prefill restarted under
//! a running decode, leaves the transfer path broken while every health check
//! says 200. So each step waits for `generating` — not for health 200 — before
//! the next one begins, and only a probe through the router, which crosses the
//! new prefill→decode link, counts as proof that the pair works.
//!
//! The workflow is an explicit state machine ([`CoRestartStep`]); each
//! transition is journaled before the commands of that step are sent, and
//! every phase event and probe is journaled as it arrives. A start whose
//! command cannot be journaled first is not sent: the order stops there,
//! fails naming the journal, and says which units it left restarted
//! (DESIGN.md 17). The verdict comes
//! from the pure [`crate::judge::verdict`] module; this module only gathers evidence.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use pdwarden_proto::v1::{
    AttemptOutcome, ChatProbe, CheckKind, Command, OperationStarted, OperationUpdate, PdPath, Phase, ProbeOutcome,
    ProbeRequest, ProbeSample, ReadinessSpec, StartUnit, SuiteAbortStorm, SuiteConcurrency, SuiteLongGeneration,
    SuiteMultiTurn, SuiteStepRequest, TimelineEntry, command, operation_update, suite_step_request,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::config::{DecodeStartPolicy, PairConfig, UnitRef};
use crate::judge::evidence::{
    EngineCounters, EngineCounts, NotRunning, RouterCounters, RouterWorkerCount, UnreachedProof, conclude,
};
use crate::judge::stats::summarize;
use crate::judge::suite::SampleOutcome;
use crate::judge::suite::{self, Baseline, BudgetInputs, RequestSample, StepReport, SuiteBudgets, SuiteStep};
use crate::judge::verdict::VerdictKind;
use crate::judge::verdict::{
    ColdSample, FailedCheck, ProbeObservation, ProbePolicy, ReadinessPhase, UnitStartup, cold_allowance,
};
use crate::ops::journal::{self, CommandAction, CommandEntry, Journal};
use crate::ops::port::{AGENT_SLACK, AgentPort, AgentReport, phase_name};
use crate::ops::report::{
    AttemptRecord, EngineCounterRecord, OperationReport, ProbeRecord, RouterCounterRecord, TimelineRecord,
};

pub mod machine;
pub mod stages;

use machine::{Progress, Step};
use stages::{Assessment, Stage, StageEffect, StageEvent, Stages};

/// What an operation does to a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperationKind {
    /// Ordered co-restart, then probes.
    CoRestart,
    /// Probes through the router only; nothing is restarted. The abort storm
    /// disturbs a pair in service, so it runs only when asked for.
    Verify { include_abort_storm: bool },
}

impl OperationKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CoRestart => "co_restart",
            Self::Verify { .. } => "verify",
        }
    }
}

/// The steps of a co-restart, in order: the operation's state labels, and
/// where a resume continues. (The stages and the order journal typed
/// states, `stages::Stage` and `machine::CoRestart`; these are their
/// labels.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum CoRestartStep {
    /// The operation exists in the journal; nothing has been sent.
    Started,
    /// Out of the shared serving router, waiting for the engines' work to
    /// drain (`[pair.serving_router]` only).
    Draining,
    /// Prefill restart sent; waiting for every prefill to generate. With the
    /// `overlap` policy decode is started here too, once prefill has spawned.
    RestartingPrefill,
    /// Decode restart sent (or already running under `overlap`); waiting for
    /// every decode to generate.
    RestartingDecode,
    /// Router restart sent; waiting for a generation through it.
    RestartingRouter,
    /// End-to-end probes through the router.
    Probing,
    /// The verification suite's steps through the router.
    Verifying,
    /// Back into the shared serving router after a healthy verdict.
    Rejoining,
    /// The verdict is recorded.
    Concluded,
}

impl CoRestartStep {
    const ALL: [CoRestartStep; 9] = [
        Self::Started,
        Self::Draining,
        Self::RestartingPrefill,
        Self::RestartingDecode,
        Self::RestartingRouter,
        Self::Probing,
        Self::Verifying,
        Self::Rejoining,
        Self::Concluded,
    ];

    /// The step a journaled state names (`None` for a state this version
    /// does not know: a resume then starts from the beginning).
    pub fn parse(state: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == state)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Started => "started",
            Self::Draining => "draining",
            Self::RestartingPrefill => "restarting_prefill",
            Self::RestartingDecode => "restarting_decode",
            Self::RestartingRouter => "restarting_router",
            Self::Probing => "probing",
            Self::Verifying => "verifying",
            Self::Rejoining => "rejoining",
            Self::Concluded => "concluded",
        }
    }
}

/// The operation's recorder, and the co-restart's own evidence on top of
/// it: the start-up timeline, the check attempts, the probes.
struct Recorder {
    base: crate::ops::recorder::Recorder,
    state: Mutex<RecordedEvidence>,
}

#[derive(Default)]
struct RecordedEvidence {
    timeline: Vec<TimelineRecord>,
    probes: Vec<ProbeRecord>,
    attempts: Vec<AttemptRecord>,
}

impl std::ops::Deref for Recorder {
    type Target = crate::ops::recorder::Recorder;

    fn deref(&self) -> &Self::Target {
        &self.base
    }
}

impl Recorder {
    fn lock(&self) -> std::sync::MutexGuard<'_, RecordedEvidence> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Journals the co-restart's typed state as it is entered.
    fn enter(&self, state: &machine::CoRestart) -> Result<(), crate::ops::journal::JournalError> {
        self.base.enter(state.step().as_str(), state)
    }

    fn phase(&self, rec: TimelineRecord) {
        self.journal_entry(rec.at_ms, "phase", &rec);
        self.send(operation_update::Kind::Phase(TimelineEntry {
            unit: rec.unit.clone(),
            role: rec.role.clone(),
            phase: rec.phase.clone(),
            at_ms: rec.at_ms,
            detail: rec.detail.clone(),
        }));
        self.lock().timeline.push(rec);
    }

    /// A readiness check attempt: journaled and kept for the report; a
    /// generation attempt is also a timeline entry (phase `check`).
    fn attempt(&self, rec: AttemptRecord) {
        self.journal_entry(rec.at_ms, "attempt", &rec);
        if rec.check == "generation" {
            self.phase(TimelineRecord {
                unit: rec.unit.clone(),
                role: rec.role.clone(),
                phase: "check".into(),
                at_ms: rec.at_ms,
                detail: rec.describe(),
            });
        }
        self.lock().attempts.push(rec);
    }

    fn probe(&self, rec: ProbeRecord) {
        self.journal_entry(self.now_ms(), "probe", &rec);
        self.send(operation_update::Kind::Probe(ProbeSample {
            target: rec.target.clone(),
            seq: rec.seq,
            latency_ms: rec.latency_ms,
            tokens: rec.tokens,
            outcome: rec.outcome.clone(),
            error: rec.error.clone(),
        }));
        self.lock().probes.push(rec);
    }
}

/// One unit's start within the operation, and what has been heard of it.
struct UnitStart {
    unit: UnitRef,
    role: &'static str,
    command_id: String,
    /// The start command went to the agent (or was adopted): false when it
    /// could not be journaled first, or the send failed.
    sent: bool,
    /// When the start command was sent, in operation ms. Agent times are
    /// relative to receipt of the command (DESIGN.md 5); on one host the
    /// transit is negligible, across hosts it is the one-way delay.
    sent_at_ms: u64,
    step_idx: usize,
    rx: Option<mpsc::UnboundedReceiver<AgentReport>>,
    deadline: Instant,
    state: StartState,
    /// The agent acknowledged the command (its `CommandResult`).
    acked: bool,
    furthest: Option<ReadinessPhase>,
    last_detail: String,
    /// Every generation check of this start-up, in order (DESIGN.md 10).
    generation_attempts: Vec<AttemptRecord>,
    /// What the agent said it spawned (its `spawned` event).
    config_fingerprint: String,
    /// The start command itself, re-sent (same id: never executed twice)
    /// when its agent re-attaches after a broken link.
    command: Command,
    /// How many times this start was followed again after its agent's
    /// link broke (bounded by [`MAX_REATTACH`]).
    reattached: u32,
}

/// How long a step waits for its agent to re-attach after its link broke
/// before calling the contact lost (issue 16, finding 6): the agent's
/// reconnect backoff is at most 5 s; an orchestrator paused (SIGSTOP) for a
/// while finds every link broken when it resumes and the agents already
/// dialling in again. The resume of an interrupted operation gives them
/// `resume_grace_ms` (default 15 s); a running step gives the same.
pub const REATTACH_GRACE: Duration = Duration::from_secs(15);

/// A start whose link keeps breaking is given up after this many re-attachments.
pub const MAX_REATTACH: u32 = 5;

/// Where one unit's start stands, by its agent's reports: `Sent` and
/// `Spawned` are under way, every other state is over. (It replaced seven
/// booleans whose combinations nobody could name.)
#[derive(Debug, Clone, PartialEq)]
enum StartState {
    /// Sent: the agent is stopping the old instance, or spawning (events
    /// before `spawned` belong to the old instance).
    Sent,
    /// The new process exists; its readiness is being watched.
    Spawned,
    /// A generation check passed.
    Generating(PassedCheck),
    /// Adopted after an orchestrator restart, already generating: its check
    /// happened before, unseen by this orchestrator.
    GeneratingBefore,
    /// The new process exited.
    Exited,
    /// The agent gave up on readiness at its deadline.
    NotReady,
    /// The agent's stream ended before the start was over.
    LostContact { after_spawn: bool },
    /// Not sent (agent unreachable), refused by the agent, or no word by
    /// the deadline.
    Failed { after_spawn: bool },
}

/// The generation check that made a unit `generating`.
#[derive(Debug, Clone, PartialEq)]
struct PassedCheck {
    latency_ms: u64,
    tokens: u32,
    /// The version the engine reported ("" if none).
    engine_version: String,
}

impl StartState {
    fn is_over(&self) -> bool {
        !matches!(self, Self::Sent | Self::Spawned)
    }

    fn generating(&self) -> bool {
        matches!(self, Self::Generating(_) | Self::GeneratingBefore)
    }

    /// The new process was spawned (whatever happened since).
    fn spawned(&self) -> bool {
        match self {
            Self::Sent => false,
            Self::LostContact { after_spawn } | Self::Failed { after_spawn } => *after_spawn,
            _ => true,
        }
    }
}

impl UnitStart {
    fn evidence(&self, now_ms: u64) -> UnitStartup {
        UnitStartup {
            unit: self.unit.unit.clone(),
            role: self.role.into(),
            furthest: self.furthest,
            exited: self.state == StartState::Exited,
            lost_contact: matches!(self.state, StartState::LostContact { .. }),
            last_detail: self.last_detail.clone(),
            waited_ms: now_ms.saturating_sub(self.sent_at_ms),
            // The router's failed generations are probes of the series instead.
            failed_checks: if self.role == "router" {
                Vec::new()
            } else {
                self.failed_checks()
            },
        }
    }

    /// Generation checks that timed out or failed before the unit generated.
    fn failed_checks(&self) -> Vec<FailedCheck> {
        self.generation_attempts
            .iter()
            .filter(|a| a.outcome != "ok")
            .map(|a| FailedCheck {
                seq: a.seq,
                timed_out: a.outcome == "timeout",
                latency_ms: a.latency_ms,
                detail: a.detail.clone(),
            })
            .collect()
    }

    fn outcome(&self) -> String {
        if self.state.generating() {
            "generating".into()
        } else if self.state == StartState::Exited {
            format!("exited: {}", self.last_detail)
        } else {
            format!("not ready: {}", self.last_detail)
        }
    }
}

pub use crate::ops::OperationContext;

/// Runs an operation (a co-restart or a verification) whose row already
/// exists in the journal, to its verdict. Progress goes to `updates`; the report is returned, journaled
/// and sent as the last update.
pub async fn run_operation(
    ctx: OperationContext,
    pair: PairConfig,
    operation_id: String,
    kind: OperationKind,
    updates: mpsc::UnboundedSender<OperationUpdate>,
) -> OperationReport {
    run_operation_from(ctx, pair, operation_id, kind, None, updates).await
}

/// Where an interrupted co-restart picks up after an orchestrator restart.
#[derive(Debug, Clone, PartialEq)]
pub struct Resume {
    /// The first step to run again.
    pub from: CoRestartStep,
    /// Units of the steps before `from`: generating, by the agents' facts.
    pub kept: Vec<UnitStartup>,
    /// Starts this operation had already sent that the agents are still on
    /// (their facts name the same command id), by unit ("host/unit"): the
    /// resumed steps adopt them instead of starting the unit again.
    pub adopt: BTreeMap<String, Adopted>,
    /// Said in the report's reasons.
    pub note: String,
}

/// A start of this operation, sent before the orchestrator restarted, that
/// the unit's agent is still on.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Adopted {
    pub command_id: String,
    /// The unit's phase by its agent's facts when the operation resumed.
    pub phase: String,
    /// Whether the start was still under way then (else it had ended, in
    /// `phase`).
    pub in_progress: bool,
}

/// The starts an interrupted operation had sent (its journaled `command`
/// entries, the last per unit) that each unit's agent is still on:
/// `facts` answers with the unit's (command id, phase, start in progress) by
/// its agent. A start whose command id the agent does not name was
/// superseded (or never arrived) and is not adopted. Pure.
pub fn adoptable_starts(
    commands: &[CommandEntry],
    facts: impl Fn(&str) -> Option<(String, Phase, bool)>,
) -> BTreeMap<String, Adopted> {
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    for c in commands.iter().filter(|c| c.action == CommandAction::Start) {
        last.insert(c.unit.clone(), c.command_id.clone());
    }
    last.into_iter()
        .filter_map(|(unit, id)| match facts(&unit) {
            Some((current, phase, in_progress)) if current == id => Some((
                unit,
                Adopted {
                    command_id: id,
                    phase: phase_name(phase as i32).to_string(),
                    in_progress,
                },
            )),
            _ => None,
        })
        .collect()
}

/// Decides where an interrupted co-restart resumes: at the step that was in
/// progress, provided every unit of the steps before it is generating by the
/// agents' current facts; otherwise from the beginning (restarting a unit
/// that is generating again is safe; trusting one that is not is not).
/// Pure: `phase_of` answers with the agent-reported phase of a unit.
pub fn resume_point(
    state: Option<CoRestartStep>,
    pair: &PairConfig,
    phase_of: impl Fn(&UnitRef) -> Option<Phase>,
) -> (CoRestartStep, Vec<UnitStartup>) {
    use CoRestartStep as S;
    let wanted = match state {
        Some(S::RestartingDecode) if pair.decode_start_policy == DecodeStartPolicy::AfterPrefillReady => {
            S::RestartingDecode
        }
        Some(S::RestartingRouter) => S::RestartingRouter,
        // Killed while rejoining: the verdict is reached again first.
        Some(S::Probing | S::Verifying | S::Rejoining) => S::Probing,
        _ => S::RestartingPrefill,
    };
    let mut before: Vec<(&'static str, &UnitRef)> = Vec::new();
    if wanted as u8 > CoRestartStep::RestartingPrefill as u8 {
        before.extend(pair.prefill.iter().map(|u| ("prefill", u)));
    }
    if wanted as u8 > CoRestartStep::RestartingDecode as u8 {
        before.extend(pair.decode.iter().map(|u| ("decode", u)));
    }
    if wanted as u8 > CoRestartStep::RestartingRouter as u8 {
        before.extend(pair.router.iter().map(|u| ("router", u)));
    }
    if before.iter().any(|(_, u)| phase_of(u) != Some(Phase::Generating)) {
        return (CoRestartStep::RestartingPrefill, Vec::new());
    }
    let kept = before
        .into_iter()
        .map(|(role, u)| UnitStartup {
            unit: u.unit.clone(),
            role: role.into(),
            furthest: Some(ReadinessPhase::Generating),
            exited: false,
            lost_contact: false,
            last_detail: "generating before the orchestrator restarted (agent's facts)".into(),
            waited_ms: 0,
            failed_checks: Vec::new(),
        })
        .collect();
    (wanted, kept)
}

/// The step a journaled typed state names: the order's own state
/// ([`machine::CoRestart`]) or a stage's ([`Stage`]); `None` for one this
/// version cannot read (a resume then starts over: restarting a
/// generating unit again is safe).
fn journaled_step(state: serde_json::Value) -> Option<CoRestartStep> {
    let step = if state.get("stage").is_some() {
        serde_json::from_value::<Stage>(state).map(|s| s.resume_step())
    } else {
        serde_json::from_value::<machine::CoRestart>(state).map(|s| s.step())
    };
    step.inspect_err(|e| tracing::warn!(error = %e, "the journaled co-restart state cannot be read; starting over"))
        .ok()
}

/// Takes over an interrupted co-restart or verification (DESIGN.md 4) once
/// its agents have re-attached: where it resumes is decided from the
/// journaled state and the agents' current facts ([`resume_point`]), and the
/// starts it had already sent that the agents are still on are adopted by
/// their command ids ([`adoptable_starts`]), never sent again. Nobody follows
/// a resumed operation live; its report is journaled and returned.
pub async fn resume(
    ctx: OperationContext,
    pair: PairConfig,
    op: crate::ops::journal::OperationRecord,
) -> OperationReport {
    let (kind, from, kept) = if op.kind == "verify" {
        (
            OperationKind::Verify {
                include_abort_storm: false,
            },
            CoRestartStep::Probing,
            Vec::new(),
        )
    } else {
        // The typed state it last entered; the label for an operation
        // journaled before states were typed. One that cannot be read
        // starts over (restarting a generating unit again is safe).
        let journaled = match ctx.journal.last_state::<serde_json::Value>(&op.operation_id) {
            Ok(Some(state)) => journaled_step(state),
            Ok(None) => CoRestartStep::parse(&op.state),
            Err(e) => {
                tracing::warn!(operation = %op.operation_id, error = %e, "the journaled co-restart state cannot be read; starting over");
                None
            }
        };
        let (from, kept) = resume_point(journaled, &pair, |u| {
            ctx.agents
                .unit(&u.host, &u.unit)
                .map(|i| Phase::try_from(i.phase).unwrap_or(Phase::Unspecified))
        });
        (OperationKind::CoRestart, from, kept)
    };
    let note = format!(
        "resumed after an orchestrator restart: the operation was in state {}; continued from {}{}",
        op.state,
        from.as_str(),
        if kept.is_empty() {
            String::new()
        } else {
            format!(
                " (kept {}, generating by their agents' facts)",
                kept.iter().map(|k| k.unit.as_str()).collect::<Vec<_>>().join(", ")
            )
        }
    );
    // Starts this operation had sent that the agents are still on: adopted
    // by their command ids, never sent as new starts (a second model load).
    let adopt = match (&kind, ctx.journal.commands(&op.operation_id)) {
        (OperationKind::CoRestart, Ok(commands)) => adoptable_starts(&commands, |unit| {
            let (host, name) = unit.split_once('/')?;
            let info = ctx.agents.unit(host, name)?;
            Some((
                info.command_id,
                Phase::try_from(info.phase).unwrap_or(Phase::Unspecified),
                info.command_in_progress,
            ))
        }),
        _ => Default::default(),
    };
    let note = if adopt.is_empty() {
        note
    } else {
        format!(
            "{note}; adopted its own start of {} (the same command, not started again)",
            adopt
                .iter()
                .map(|(u, a)| format!(
                    "{} ({}{})",
                    u.split_once('/').map_or(u.as_str(), |x| x.1),
                    a.phase,
                    if a.in_progress { ", under way" } else { "" }
                ))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    // Nobody is following this operation live; its report is journaled.
    let (tx, _rx) = mpsc::unbounded_channel();
    let resume = Resume {
        from,
        kept,
        adopt,
        note,
    };
    run_operation_from(ctx, pair, op.operation_id, kind, Some(resume), tx).await
}

/// Runs an operation, or the rest of an interrupted one (`resume`).
pub async fn run_operation_from(
    ctx: OperationContext,
    pair: PairConfig,
    operation_id: String,
    kind: OperationKind,
    resume: Option<Resume>,
    updates: mpsc::UnboundedSender<OperationUpdate>,
) -> OperationReport {
    let rec = Recorder {
        base: crate::ops::recorder::Recorder::new(operation_id.clone(), ctx.journal.clone(), updates),
        state: Mutex::default(),
    };
    rec.send(operation_update::Kind::Started(OperationStarted {
        operation_id: operation_id.clone(),
        pair: pair.name.clone(),
        decode_start_policy: pair.decode_start_policy.as_str().into(),
    }));
    let (from, kept, adopt, resume_note) = match resume {
        Some(r) => {
            rec.journal_entry(
                0,
                "resumed",
                &serde_json::json!({ "from": r.from.as_str(), "note": r.note, "adopt": r.adopt }),
            );
            (r.from, r.kept, r.adopt, Some(r.note))
        }
        None => (CoRestartStep::RestartingPrefill, Vec::new(), BTreeMap::new(), None),
    };
    let run = CoRestart {
        ctx,
        pair,
        rec: &rec,
        starts: Vec::new(),
        probes: Vec::new(),
        budgets: None,
        adopt: Mutex::new(adopt),
        order: None,
        unjournaled: None,
        fresh_engine_answers: Vec::new(),
        direct: None,
    };
    // The engines' PD failure counters before the requests: a unit this
    // operation starts counts from 0; a pair in service is scraped first.
    // So are the routers' retry and error counters (issue 30).
    let (counters_before, routers_before) = match kind {
        OperationKind::CoRestart => (None, None),
        OperationKind::Verify { .. } => (Some(run.scrape_engines().await), Some(run.scrape_routers().await)),
    };
    // A recovery (its trigger journaled) does not wait for a wedged pair's
    // work, and goes on if the drain cannot be done.
    let recovery = kind == OperationKind::CoRestart
        && !rec
            .journal
            .read::<serde_json::Value>(&operation_id, "trigger")
            .unwrap_or_default()
            .is_empty();
    let stages = Stages {
        kind,
        recovery,
        serving_router: run.pair.serving_router.is_some(),
        xpyd: run.pair.prefill.len() > 1 || run.pair.decode.len() > 1,
        abort_storm: match kind {
            OperationKind::CoRestart => run.pair.suite.abort_storm.after_restart,
            OperationKind::Verify { include_abort_storm } => include_abort_storm,
        },
    };
    // The stages' effects, carried out one at a time (the runtime awaits
    // each before the next: the lock is never contended).
    let shared = tokio::sync::Mutex::new(run);
    let (kept_ref, before) = (&kept, &counters_before);
    let end = crate::ops::machine::run(&stages, &rec, stages.start(from), |effect| {
        let shared = &shared;
        let routers_before = &routers_before;
        async move {
            let mut run = shared.lock().await;
            run.carry(effect, kind, kept_ref, before.as_ref(), routers_before.as_ref())
                .await
        }
    })
    .await;
    let mut run = shared.into_inner();
    let mut so_far = end.into_so_far();
    // Stopped by the journal: what the run did not get to is gathered
    // without sending anything.
    if !so_far.assessed {
        let a = run.assess(kind, &kept);
        so_far.assess(a);
    }
    if !so_far.counted {
        let not_running = run.not_running();
        so_far.count(not_running, rec.journal_failure());
    }
    if let (Some(d), Some(sr)) = (
        so_far
            .drain
            .as_mut()
            .filter(|d| d.error.is_none() && d.rejoin.is_none()),
        run.pair.serving_router.clone(),
    ) {
        // Out of the rotation when the journal stopped the run: said as
        // left out (nothing is sent for a pair that is not healthy).
        d.rejoin = Some(crate::ops::drain::rejoin(&*run.ctx.agents, &rec, &run.pair, &sr, false).await);
    }
    if let Some(d) = &so_far.drain {
        so_far.evidence.drain.lines = d.reasons();
    }
    so_far.evidence.notes.extend(resume_note);
    if so_far.evidence.journal_error.is_none() {
        so_far.evidence.journal_error = rec.journal_failure();
    }
    let fingerprint = match kind {
        OperationKind::CoRestart => run.fingerprint(),
        OperationKind::Verify { .. } => String::new(),
    };
    let mut evidence = std::mem::take(&mut so_far.evidence);
    let policy = match so_far.policy.take() {
        Some(p) => p,
        None => run.assess(kind, &kept).policy,
    };
    let engine_counters = std::mem::take(&mut so_far.engine_counters);
    let verdict = conclude(&evidence, &policy);
    let suite_steps = std::mem::take(&mut evidence.suite);
    let router_counters = std::mem::take(&mut evidence.routers);
    let evidence = std::mem::take(&mut *rec.lock());
    let mut report = OperationReport {
        operation_id: operation_id.clone(),
        pair: run.pair.name.clone(),
        kind: kind.as_str().into(),
        decode_start_policy: run.pair.decode_start_policy.as_str().into(),
        verdict: verdict.kind,
        reasons: verdict.reasons,
        steps: rec.steps(),
        timeline: evidence.timeline,
        probe_latency: summarize(
            &evidence
                .probes
                .iter()
                .filter_map(|p| p.latency_ms.filter(|_| p.outcome == "ok"))
                .collect::<Vec<_>>(),
        ),
        probes: evidence.probes,
        attempts: evidence.attempts,
        warnings: suite::warnings(&suite_steps),
        budgets: run.budgets.clone(),
        engine_counters,
        router_counters: router_counters
            .into_iter()
            .filter_map(|r| {
                Some(RouterCounterRecord {
                    unit: r.unit,
                    workers: r.after?,
                })
            })
            .collect(),
        suite: suite_steps,
        warm_budget_ms: policy.warm_budget_ms,
        cold_allowance: policy.cold_allowance,
        fingerprint,
        drain: so_far.drain.take(),
        sub_operations: Vec::new(),
        total_ms: rec.now_ms(),
    };
    if let Err(e) = rec.journal.conclude(&operation_id, report.verdict.as_str(), &report) {
        tracing::error!(operation = %operation_id, error = %e, "could not journal the verdict");
        // The verdict stands (it is kept and written once the journal can
        // be, `Journal::conclude`); whoever reads this report is told.
        report.reasons.push(e.unwritten_conclusion());
    }
    if let Ok(json) = serde_json::to_string(&report) {
        rec.send(operation_update::Kind::Report(pdwarden_proto::v1::JsonReply { json }));
    }
    report
}

/// Whether this operation restarted a unit, as far as its driver knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Restarted {
    /// Its new process was spawned (by this orchestrator, or by the one it
    /// resumed from).
    Yes,
    /// Its start was sent and no new process was reported: the old one may
    /// have been stopped.
    Unknown,
    /// No start was sent: the process from before the operation runs on.
    No,
}

/// What a co-restart that stopped part-way left live (issue 32; INCIDENTS
/// row 1): which units it restarted and which it did not, and — a prefill
/// restarted under a decode that was not — that the decode still holds the
/// old prefill's bootstrap, so every request fails its KV transfer until
/// the pair is co-restarted. `units`: (unit, role, restarted), in the
/// pair's order. Nothing when every unit or none was restarted. Pure.
fn what_is_live(units: &[(String, &str, Restarted)]) -> Vec<String> {
    let named = |which: Restarted, role: Option<&str>| -> Vec<&str> {
        units
            .iter()
            .filter(|(_, r, w)| *w == which && role.is_none_or(|role| role == *r))
            .map(|(u, _, _)| u.as_str())
            .collect()
    };
    let (yes, unknown, no) = (
        named(Restarted::Yes, None),
        named(Restarted::Unknown, None),
        named(Restarted::No, None),
    );
    if yes.is_empty() || yes.len() == units.len() {
        return Vec::new();
    }
    let mut lines = vec![format!(
        "restarted by this operation (new processes): {}",
        yes.join(", ")
    )];
    if !unknown.is_empty() {
        lines.push(format!(
            "started by this operation with no new process reported (the old one may be stopped): {}",
            unknown.join(", ")
        ));
    }
    if !no.is_empty() {
        lines.push(format!(
            "not restarted by this operation (the processes from before it run on): {}",
            no.join(", ")
        ));
    }
    let prefills = named(Restarted::Yes, Some("prefill"));
    if !prefills.is_empty() {
        let old = match prefills.as_slice() {
            [one] => format!("{one}'s old process"),
            many => format!("the old processes of {}", many.join(", ")),
        };
        for decode in named(Restarted::No, Some("decode")) {
            lines.push(format!(
                "{decode} still holds the bootstrap of {old}: every request through this pair will fail its KV transfer until the pair is co-restarted (INCIDENTS row 1)"
            ));
        }
    }
    lines
}

/// The engine layer's evidence: each engine's PD failure counters before
/// (`None`: restarted by this operation, so from nothing) and after. A
/// scrape that failed says nothing; a counter absent from one that answered
/// is 0 (SGLang's labelled counters appear at their first increment).
fn engine_evidence(
    pair: &PairConfig,
    before: Option<&BTreeMap<String, EngineCounterRecord>>,
    after: &BTreeMap<String, EngineCounterRecord>,
) -> Vec<EngineCounters> {
    let counts = |r: &EngineCounterRecord| {
        r.error.is_empty().then_some(EngineCounts {
            transfer_failed: r.transfer_failed_total,
            bootstrap_failed: r.bootstrap_failed_total,
        })
    };
    pair.prefill
        .iter()
        .chain(&pair.decode)
        .filter_map(|u| {
            let a = after.get(&u.unit)?;
            Some(EngineCounters {
                unit: a.unit.clone(),
                role: a.role.clone(),
                // Restarted here: it counts from 0.
                before: match before {
                    None => Some(EngineCounts {
                        transfer_failed: Some(0.0),
                        bootstrap_failed: Some(0.0),
                    }),
                    Some(b) => b.get(&u.unit).and_then(counts),
                },
                after: counts(a),
            })
        })
        .collect()
}

/// The router layer's evidence: each router's counters per worker before
/// (`None` in `before`: restarted by this operation, so from nothing) and
/// after; a router whose scrape failed on a side says nothing.
fn router_evidence(
    pair: &PairConfig,
    before: Option<&BTreeMap<String, RouterScrape>>,
    after: &BTreeMap<String, RouterScrape>,
) -> Vec<RouterCounters> {
    pair.router
        .iter()
        .map(|u| {
            let now = after.get(&u.unit);
            let (retries_metric, errors_metric) = router_metric_names(now.map_or("", |s| s.kind.as_str()));
            RouterCounters {
                unit: u.unit.clone(),
                retries_metric: retries_metric.into(),
                errors_metric: errors_metric.into(),
                before: match before {
                    None => Some(Vec::new()),
                    Some(b) => b.get(&u.unit).map(|s| s.workers.clone()),
                },
                after: now.map(|s| s.workers.clone()),
            }
        })
        .collect()
}

/// One scrape of a router: the kind its metric names showed, its workers.
#[derive(Debug, Clone, serde::Serialize)]
struct RouterScrape {
    kind: String,
    workers: Vec<RouterWorkerCount>,
}

/// The names a router gives its retry and error counters, for the reasons
/// (the router profiles in `pdwarden_engines`: sglang-router 0.3's smg_*,
/// vllm-router's per-side error counters).
fn router_metric_names(kind: &str) -> (&'static str, &'static str) {
    match kind {
        "vllm-router" => (
            "vllm_router_retries_total",
            "vllm_router_pd_{prefill,decode}_errors_total",
        ),
        _ => ("smg_worker_retries_total", "smg_worker_errors_total"),
    }
}

fn sample_from_wire(s: pdwarden_proto::v1::SuiteRequestSample) -> RequestSample {
    let outcome = match ProbeOutcome::try_from(s.outcome).unwrap_or(ProbeOutcome::Unspecified) {
        ProbeOutcome::Ok => SampleOutcome::Ok,
        ProbeOutcome::Timeout => SampleOutcome::Timeout,
        _ => SampleOutcome::Error,
    };
    RequestSample {
        index: s.index,
        outcome,
        latency_ms: s.latency_ms,
        ttft_ms: s.ttft_ms,
        tokens: s.tokens,
        error: s.error,
        aborted: s.aborted,
        token_times_ms: s.token_times_ms,
        request_id: s.request_id,
        tokens_asked: s.tokens_asked,
        finish_reason: s.finish_reason,
        stream_error: s.stream_error,
    }
}

/// The suite of the pair's last healthy operation that ran one: the
/// baseline each step is compared with.
fn last_healthy_suite(journal: &Journal, pair: &str) -> Option<(String, Vec<StepReport>)> {
    healthy_suites(journal, pair).into_iter().next()
}

/// The suites of the pair's healthy operations that ran one, newest first.
fn healthy_suites(journal: &Journal, pair: &str) -> Vec<(String, Vec<StepReport>)> {
    let Ok(history) = journal.history(pair, 50) else {
        return Vec::new();
    };
    history
        .into_iter()
        .filter_map(|r| {
            if !matches!(r.verdict.as_deref(), Some("healthy" | "healthy_after_cold_start")) {
                return None;
            }
            let steps: Vec<StepReport> = serde_json::from_value(r.report?.get("suite")?.clone()).ok()?;
            (!steps.is_empty()).then_some((r.operation_id, steps))
        })
        .collect()
}

/// The pair's accepted restarts (newest first): first answer through the
/// router and the fingerprint of what each started — the evidence the cold
/// allowance is measured from.
fn accepted_cold_samples(journal: &Journal, pair: &str) -> Vec<ColdSample> {
    let history = match journal.history(pair, 50) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(pair, error = %e, "cannot read history; using the configured cold allowance");
            return Vec::new();
        }
    };
    history
        .into_iter()
        .filter(|r| r.kind == OperationKind::CoRestart.as_str())
        .filter(|r| matches!(r.verdict.as_deref(), Some("healthy" | "healthy_after_cold_start")))
        .filter_map(|r| {
            let report: OperationReport = serde_json::from_value(r.report?).ok()?;
            let first = report.probes.first().filter(|p| p.outcome == "ok")?.latency_ms?;
            Some(ColdSample {
                operation_id: r.operation_id,
                first_answer_ms: first,
                fingerprint: report.fingerprint,
            })
        })
        .collect()
}

struct CoRestart<'a> {
    ctx: OperationContext,
    pair: PairConfig,
    rec: &'a Recorder,
    starts: Vec<UnitStart>,
    probes: Vec<ProbeObservation>,
    /// The suite's budgets, once derived.
    budgets: Option<SuiteBudgets>,
    /// Starts sent before an orchestrator restart, to re-attach to (taken
    /// by the unit's step).
    adopt: Mutex<BTreeMap<String, Adopted>>,
    /// Where the order ended (`drive`).
    order: Option<machine::CoRestart>,
    /// A start's write-ahead that could not be journaled: that start and
    /// every later one is not sent, and the operation fails naming it.
    unjournaled: Option<crate::ops::journal::JournalError>,
    /// Probes (1-based) that were, by the engines' counters, the first
    /// request the series sent a fresh engine of an xPyD pair.
    fresh_engine_answers: Vec<usize>,
    /// A pair with no router of its own (one P/D sub-pair of a rolling
    /// restart, `ops::rolling`): the KV path its probes take, straight from
    /// its prefill to its decode as a PD router sends them.
    direct: Option<PdPath>,
}

impl CoRestart<'_> {
    /// One fingerprint of everything this operation started (each unit's
    /// config version as its agent spawned it, and the version each engine
    /// reported); empty if an agent sent no config fingerprint.
    fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut parts: Vec<String> = self
            .starts
            .iter()
            .map(|s| {
                let version = match &s.state {
                    StartState::Generating(c) => c.engine_version.as_str(),
                    _ => "",
                };
                format!("{}={}@{}", s.unit, s.config_fingerprint, version)
            })
            .collect();
        if parts.is_empty() || self.starts.iter().any(|s| s.config_fingerprint.is_empty()) {
            return String::new();
        }
        parts.sort();
        let digest = Sha256::digest(parts.join("\n").as_bytes());
        digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
    }

    fn roles(&self) -> [(&'static str, &Vec<UnitRef>); 3] {
        [
            ("prefill", &self.pair.prefill),
            ("decode", &self.pair.decode),
            ("router", &self.pair.router),
        ]
    }

    /// The order, driven: the pure [`machine::CoRestart`] decides; here each
    /// state it enters is journaled (typed, with the command ids of the
    /// starts it sends) before those starts go out, the starts are sent (or
    /// adopted from a killed orchestrator by their ids), and each report
    /// from the agents is folded into its start's progress and handed back
    /// to the machine, until it concludes. The probe series runs in
    /// `Probing`; a step whose units did not all generate concludes with the
    /// evidence gathered so far, nothing after it started.
    async fn drive(&mut self, from: CoRestartStep) -> Result<(), crate::ops::journal::JournalError> {
        // Starts a killed orchestrator had sent, by unit: their ids again.
        let adopted: BTreeMap<String, String> = self
            .adopt
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(u, a)| (u.clone(), a.command_id.clone()))
            .collect();
        let mut ids = |u: &UnitRef| {
            adopted
                .get(&u.to_string())
                .cloned()
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
        };
        let mut step = machine::CoRestart::begin(&self.pair, from, &mut ids);
        loop {
            let (mut state, starts) = match step {
                Step::Enter { next, starts } => (next, starts),
                Step::Stay(state) => (state, Vec::new()),
            };
            if let machine::CoRestart::Concluded { .. } = state {
                // Journaled with the verdict, after the suite.
                self.order = Some(state);
                return self.unjournaled.take().map_or(Ok(()), Err);
            }
            self.rec.enter(&state)?;
            for start in &starts {
                // A write-ahead that failed stops the order as a failed
                // start does: this one and the rest are over, not sent, and
                // the machine concludes once the starts already sent are.
                let s = match &self.unjournaled {
                    Some(e) => self.not_sent(
                        start,
                        format!("not started: an earlier start could not be journaled first ({e})"),
                    ),
                    None => {
                        let readiness = self.readiness(start.role);
                        match self.start_unit(start, readiness).await {
                            Ok(s) => s,
                            Err((s, e)) => {
                                self.unjournaled = Some(e);
                                s
                            }
                        }
                    }
                };
                self.starts.push(s);
            }
            if let machine::CoRestart::Probing { .. } = state {
                self.probe().await;
                step = Step::Enter {
                    next: state.probed(),
                    starts: Vec::new(),
                };
                continue;
            }
            step = loop {
                match state.advance(&self.pair, |id| self.progress(id), &mut ids) {
                    Step::Stay(same) => {
                        state = same;
                        self.next_change().await;
                    }
                    moved => break moved,
                }
            };
        }
    }

    /// Carries out one effect of the stages (`stages::Stages`) and says
    /// what it found. `kept`: units a resume found generating; `before`:
    /// the counters a verification read before its requests.
    async fn carry(
        &mut self,
        effect: StageEffect,
        kind: OperationKind,
        kept: &[UnitStartup],
        before: Option<&BTreeMap<String, EngineCounterRecord>>,
        routers_before: Option<&BTreeMap<String, RouterScrape>>,
    ) -> Option<StageEvent> {
        let rec = self.rec;
        Some(match effect {
            StageEffect::Drain { wait } => {
                let record = match self.pair.serving_router.clone() {
                    Some(sr) => crate::ops::drain::drain(&*self.ctx.agents, rec, &self.pair, &sr, wait).await,
                    None => crate::ops::report::DrainRecord {
                        error: Some("the pair has no serving router".into()),
                        ..Default::default()
                    },
                };
                StageEvent::Drained(Box::new(record))
            }
            StageEffect::RunOrder { from } => StageEvent::OrderRan {
                journal_error: match kind {
                    OperationKind::CoRestart => self.drive(from).await.err().map(|e| e.to_string()),
                    OperationKind::Verify { .. } => {
                        self.verify().await;
                        None
                    }
                },
            },
            StageEffect::Assess => StageEvent::Assessed(Box::new(self.assess(kind, kept))),
            StageEffect::ProveUnreached => {
                let now = self.scrape_engines().await;
                StageEvent::Proven(self.prove_unreached(before, &now).await)
            }
            StageEffect::RunSuite { abort_storm } => {
                StageEvent::SuiteRan(self.verification_suite(abort_storm).await.map_err(|e| e.to_string()))
            }
            StageEffect::ReadCounters { scrape } => {
                // What a retrying router hid, from the router's own
                // counters and the engines' (a counter not yet exposed is 0).
                let (mut engines, mut routers, mut engine_counters) = (Vec::new(), Vec::new(), Vec::new());
                if scrape {
                    let after = self.scrape_engines().await;
                    rec.journal_entry(rec.now_ms(), "engine_counters", &after);
                    engines = engine_evidence(&self.pair, before, &after);
                    engine_counters = after.into_values().collect();
                    let routers_after = self.scrape_routers().await;
                    rec.journal_entry(rec.now_ms(), "router_counters", &routers_after);
                    routers = router_evidence(&self.pair, routers_before, &routers_after);
                }
                StageEvent::Counted {
                    engines,
                    routers,
                    engine_counters,
                    not_running: self.not_running(),
                    journal_failure: rec.journal_failure(),
                }
            }
            StageEffect::Rejoin { healthy } => {
                let record = match self.pair.serving_router.clone() {
                    Some(sr) => crate::ops::drain::rejoin(&*self.ctx.agents, rec, &self.pair, &sr, healthy).await,
                    None => crate::ops::report::RejoinRecord::default(),
                };
                StageEvent::Rejoined(Box::new(record))
            }
        })
    }

    /// The order's evidence, once it is over or stopped (reads only): the
    /// units' start-ups (those never started too), what is live if it
    /// stopped part-way, the probes, and the budgets they are judged by.
    fn assess(&mut self, kind: OperationKind, kept: &[UnitStartup]) -> Assessment {
        let now = self.rec.now_ms();
        let mut startups: Vec<UnitStartup> = kept.to_vec();
        startups.extend(self.starts.iter().map(|s| s.evidence(now)));
        // Units never started (gated behind one that failed) are evidence too.
        let roles = if kind == OperationKind::CoRestart {
            self.roles().to_vec()
        } else {
            Vec::new()
        };
        for &(role, units) in &roles {
            for u in units {
                if !self.starts.iter().any(|s| &s.unit == u) && !kept.iter().any(|k| k.unit == u.unit) {
                    startups.push(UnitStartup {
                        unit: u.unit.clone(),
                        role: role.into(),
                        furthest: None,
                        exited: false,
                        lost_contact: false,
                        last_detail: "not started".into(),
                        waited_ms: 0,
                        failed_checks: Vec::new(),
                    });
                }
            }
        }
        // What is live when the order stopped part-way: which units this
        // operation restarted and which it did not (issue 32; INCIDENTS row 1).
        let live: Vec<(String, &'static str, Restarted)> = roles
            .iter()
            .flat_map(|(role, units)| units.iter().map(move |u| (u, *role)))
            .map(|(u, role)| {
                let restarted = if kept.iter().any(|k| k.unit == u.unit) {
                    Restarted::Yes
                } else {
                    match self.starts.iter().find(|s| &s.unit == u) {
                        Some(s) if s.state.spawned() => Restarted::Yes,
                        Some(s) if s.sent => Restarted::Unknown,
                        _ => Restarted::No,
                    }
                };
                (u.unit.clone(), role, restarted)
            })
            .collect();
        // The allowance is measured from restarts that started the same
        // thing: the fingerprint of what this operation spawned.
        let fingerprint = match kind {
            OperationKind::CoRestart => self.fingerprint(),
            OperationKind::Verify { .. } => String::new(),
        };
        let policy = ProbePolicy {
            warm_budget_ms: self.pair.probe.warm_budget_ms,
            cold_allowance: cold_allowance(
                &accepted_cold_samples(&self.ctx.journal, &self.pair.name),
                &fingerprint,
                self.pair.probe.cold_allowance_margin,
                self.pair.probe.cold_allowance_ms,
                self.pair.probe.warm_budget_ms,
            ),
            cold_start_possible: kind == OperationKind::CoRestart,
            warm_probes: self.pair.probe.warm_probes,
            cold_answers: self.pair.prefill.len().max(self.pair.decode.len()).max(1) as u32,
            fresh_engine_answers: std::mem::take(&mut self.fresh_engine_answers),
        };
        Assessment {
            startups,
            probes: self.probes.clone(),
            live: what_is_live(&live),
            policy,
            journal_failure: self.rec.journal_failure(),
        }
    }

    /// The pair's units not running now, with how each ended by its agent
    /// (issue 16, finding 7: a router killed mid-probe left only the
    /// probes' connection errors in the reasons).
    fn not_running(&self) -> Vec<NotRunning> {
        let mut out = Vec::new();
        for u in self
            .pair
            .prefill
            .iter()
            .chain(&self.pair.decode)
            .chain(&self.pair.router)
        {
            if let Some(info) = self.ctx.agents.unit(&u.host, &u.unit)
                && info.phase == Phase::Exited as i32
            {
                // How it ended; its log's tail is in `status` and the unit's log.
                let how = match info.exit_detail.split("; log tail:").next().unwrap_or("") {
                    "" => "exited".to_string(),
                    d => format!("exited: {d}"),
                };
                out.push(NotRunning {
                    unit: u.unit.clone(),
                    how,
                });
            }
        }
        out
    }

    /// How far the start `command_id` has got, for the machine.
    fn progress(&self, command_id: &str) -> Progress {
        let Some(s) = self.starts.iter().find(|s| s.command_id == command_id) else {
            return Progress::UnderWay;
        };
        let spawned = s.acked && s.state.spawned();
        if s.state.generating() {
            Progress::Generating
        } else if s.state.is_over() {
            Progress::Failed { spawned }
        } else if spawned {
            Progress::Spawned
        } else {
            Progress::UnderWay
        }
    }

    /// Waits for the next report on any start still under way (or its
    /// deadline), and applies it.
    async fn next_change(&mut self) {
        let rec = self.rec;
        let agents = &*self.ctx.agents;
        let waiting: Vec<_> = self
            .starts
            .iter_mut()
            .filter(|s| !s.state.is_over())
            .map(|s| Box::pin(next_report(rec, agents, s)))
            .collect();
        if !waiting.is_empty() {
            futures::future::select_all(waiting).await;
        }
    }

    /// What a start of `role` waits for: the engines' own generation check
    /// within their ready deadline; the router's readiness is a
    /// probe-tagged generation through it — also probe 1 of the series (the
    /// first generation after the start, the one a cold start slows), so
    /// its timeout is the probe timeout.
    fn readiness(&self, role: machine::Role) -> ReadinessSpec {
        let t = &self.pair.timeouts;
        match role {
            machine::Role::Prefill => self.engine_readiness(t.prefill_ready_ms),
            machine::Role::Decode => self.engine_readiness(t.decode_ready_ms),
            machine::Role::Router => ReadinessSpec {
                deadline_ms: t.router_ready_ms.saturating_add(self.pair.probe.probe_timeout_ms),
                poll_interval_ms: t.poll_interval_ms,
                check_timeout_ms: self.pair.probe.probe_timeout_ms,
                chat: Some(self.chat_probe()),
            },
        }
    }

    fn engine_readiness(&self, deadline_ms: u64) -> ReadinessSpec {
        let t = &self.pair.timeouts;
        ReadinessSpec {
            deadline_ms,
            poll_interval_ms: t.poll_interval_ms,
            check_timeout_ms: t.check_timeout_ms,
            chat: None,
        }
    }

    /// The probe series through the first router: its readiness generation
    /// is probe 1 when this operation started it. A pair without a router
    /// (a rolling restart's sub-pair) is probed over its own KV path.
    async fn probe(&mut self) {
        let Some(router) = self.pair.router.first().cloned() else {
            return self.probe_direct().await;
        };
        match self.starts.iter().position(|s| s.unit == router) {
            Some(i) => self.probe_series(i).await,
            None => self.probe_series_via(&router, Vec::new()).await,
        }
    }

    /// The probe series of a pair without a router of its own: each probe
    /// is the request a PD router sends (the chat body with the prefill's
    /// bootstrap host and port, to the prefill and the decode at once: it
    /// crosses the new prefill → decode link), sent by the prefill's agent.
    /// The URLs are the agents' registered facts; an engine whose agent does
    /// not know its URL fails the series, saying so.
    async fn probe_direct(&mut self) {
        let (Some(prefill), Some(decode)) = (self.pair.prefill.first().cloned(), self.pair.decode.first().cloned())
        else {
            return;
        };
        let url = |u: &UnitRef| {
            self.ctx
                .agents
                .unit(&u.host, &u.unit)
                .map(|i| (i.base_url.trim_end_matches('/').to_string(), i.bootstrap_port))
                .filter(|(url, _)| !url.is_empty())
        };
        let (Some((prefill_url, bootstrap_port)), Some((decode_url, _))) = (url(&prefill), url(&decode)) else {
            self.probes.push(ProbeObservation::Error {
                message: format!("the URL of {prefill} or {decode} is unknown: its agent is not connected"),
            });
            return;
        };
        self.direct = Some(PdPath {
            decode_url,
            bootstrap_host: crate::ops::drain::url_host(&prefill_url).to_string(),
            bootstrap_port,
            prefill_url,
        });
        self.probe_series_via(&prefill, Vec::new()).await;
    }

    fn chat_probe(&self) -> ChatProbe {
        ChatProbe {
            model: self.pair.probe.model.clone(),
            prompt: self.pair.probe.prompt.clone(),
            max_tokens: self.pair.probe.max_tokens,
        }
    }

    /// Sends `start` (journaled first as a typed command), or re-attaches to
    /// it if the orchestrator that was killed had sent it. A write-ahead
    /// that fails is the error, with the start over and not sent: a start
    /// is never sent unrecorded (DESIGN.md 17).
    async fn start_unit(
        &self,
        start: &machine::Start,
        readiness: ReadinessSpec,
    ) -> Result<UnitStart, (UnitStart, crate::ops::journal::JournalError)> {
        let unit = &start.unit;
        let role = start.role.as_str();
        let step_idx = self.rec.step_started(&format!("restart-{role}"), &unit.unit);
        let adopted = self
            .adopt
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&unit.to_string())
            .filter(|a| a.command_id == start.command_id);
        let command_id = start.command_id.clone();
        let deadline = crate::ops::port::far_deadline(
            Instant::now(),
            Duration::from_millis(readiness.deadline_ms.saturating_add(self.pair.timeouts.stop_grace_ms))
                .saturating_add(AGENT_SLACK),
        );
        let cmd = Command {
            fencing_token: 0,
            command_id: command_id.clone(),
            action: Some(command::Action::Start(StartUnit {
                unit: unit.unit.clone(),
                restart: true,
                stop_grace_ms: self.pair.timeouts.stop_grace_ms,
                readiness: Some(readiness),
            })),
        };
        let sent_at_ms = self.rec.now_ms();
        let mut s = UnitStart {
            unit: unit.clone(),
            role,
            command_id: command_id.clone(),
            sent: true,
            sent_at_ms,
            step_idx,
            rx: None,
            deadline,
            state: StartState::Sent,
            acked: false,
            furthest: None,
            last_detail: String::new(),
            generation_attempts: Vec::new(),
            config_fingerprint: String::new(),
            command: cmd.clone(),
            reattached: 0,
        };
        if adopted.is_none()
            && let Err(e) = self.rec.write_ahead(
                journal::COMMAND,
                &CommandEntry {
                    command_id: command_id.clone(),
                    action: CommandAction::Start,
                    unit: unit.to_string(),
                    restart: true,
                },
            )
        {
            s.sent = false;
            s.state = StartState::Failed { after_spawn: false };
            s.last_detail = format!("not started: the journal could not record its start command first ({e})");
            self.rec.step_ended(step_idx, format!("failed: {}", s.last_detail));
            return Err((s, e));
        }
        if let Some(a) = &adopted {
            self.rec.journal_entry(
                sent_at_ms,
                "adopted",
                &serde_json::json!({ "command_id": command_id, "unit": unit.to_string(), "phase": a.phase }),
            );
            // Already sent (and executed) by the orchestrator that was
            // killed: never started again. Where it ended is known from the
            // agent's facts; one still under way is re-attached by sending
            // the same command id, which the agent answers without executing
            // it twice, and whose later events come back to this operation.
            s.acked = true;
            // Followed first, then read where it is now: the resume's
            // snapshot may be old (a drain, earlier steps ran since), and an
            // event between reading and following would be lost, while the
            // facts are updated before any event is delivered.
            if let Ok(rx) = self.ctx.agents.send(&unit.host, &unit.unit, cmd.clone()).await {
                s.rx = Some(rx);
            }
            let (in_progress, phase) = match self
                .ctx
                .agents
                .unit(&unit.host, &unit.unit)
                .filter(|f| f.command_id == command_id)
            {
                Some(f) => (f.command_in_progress, phase_name(f.phase).to_string()),
                None => (a.in_progress, a.phase.clone()),
            };
            s.last_detail = format!(
                "{phase}: this operation's start (command {command_id}), sent before the orchestrator restarted, adopted — not started again"
            );
            s.state = match (in_progress, phase.as_str()) {
                (false, "generating") => {
                    s.furthest = Some(ReadinessPhase::Generating);
                    StartState::GeneratingBefore
                }
                (false, "exited") => StartState::Exited,
                (false, _) => StartState::NotReady,
                (true, "spawned" | "refused" | "http_503" | "healthy") => StartState::Spawned,
                (true, _) => StartState::Sent,
            };
            if s.state.is_over() {
                self.rec.step_ended(step_idx, s.outcome());
                return Ok(s);
            }
            if s.rx.is_some() {
                return Ok(s);
            }
        }
        match self.ctx.agents.send(&unit.host, &unit.unit, cmd).await {
            Ok(rx) => s.rx = Some(rx),
            Err(e) => {
                s.sent = false;
                s.state = StartState::Failed { after_spawn: false };
                s.last_detail = e.to_string();
                self.rec.step_ended(step_idx, format!("failed: {e}"));
            }
        }
        Ok(s)
    }

    /// `start`, over before it was sent (`detail` says why).
    fn not_sent(&self, start: &machine::Start, detail: String) -> UnitStart {
        let step_idx = self
            .rec
            .step_started(&format!("restart-{}", start.role.as_str()), &start.unit.unit);
        self.rec.step_ended(step_idx, format!("failed: {detail}"));
        let now = self.rec.now_ms();
        UnitStart {
            unit: start.unit.clone(),
            role: start.role.as_str(),
            command_id: start.command_id.clone(),
            sent: false,
            sent_at_ms: now,
            step_idx,
            rx: None,
            deadline: Instant::now(),
            state: StartState::Failed { after_spawn: false },
            acked: false,
            furthest: None,
            last_detail: detail,
            generation_attempts: Vec::new(),
            config_fingerprint: String::new(),
            command: Command::default(),
            reattached: 0,
        }
    }

    /// Probe 1 is the router's readiness generation; later probes go through
    /// the first router until `warm_probes` consecutive probes are warm, a
    /// probe times out (a timeout ends the series: it is decisive, and a
    /// serial engine should not be handed more work behind a stuck request),
    /// or `max_probes` have run.
    async fn probe_series(&mut self, first_router: usize) {
        let router = &self.starts[first_router];
        let mut readiness: Vec<ProbeRecord> = router
            .generation_attempts
            .iter()
            .map(|a| ProbeRecord {
                target: format!("router:{}", router.unit.unit),
                seq: 0,
                latency_ms: Some(a.latency_ms),
                tokens: 0,
                outcome: a.outcome.clone(),
                error: if a.detail.is_empty() {
                    "readiness generation".into()
                } else {
                    format!("readiness generation: {}", a.detail)
                },
                request_id: a.request_id.clone(),
            })
            .collect();
        match (readiness.iter_mut().rev().find(|r| r.outcome == "ok"), &router.state) {
            (Some(last_ok), StartState::Generating(check)) => last_ok.tokens = check.tokens,
            (Some(_), _) => {}
            // An agent that reports no attempts: the passing check alone.
            (None, StartState::Generating(check)) => readiness.push(ProbeRecord {
                target: format!("router:{}", router.unit.unit),
                seq: 0,
                latency_ms: Some(check.latency_ms),
                tokens: check.tokens,
                outcome: "ok".into(),
                error: "readiness generation".into(),
                request_id: String::new(),
            }),
            // A start adopted after an orchestrator restart, already over
            // (`GeneratingBefore`): its check was never seen here (no
            // latency, no tokens), so it is not made up as probe 1; the
            // series starts with a real probe.
            (None, _) => {}
        }
        let unit = router.unit.clone();
        self.probe_series_via(&unit, readiness).await;
    }

    /// A verification: the probe series through the first router (over the
    /// pair's own KV path without one), nothing restarted.
    async fn verify(&mut self) {
        self.probe().await;
    }

    /// Probes through `router`. `readiness` is the router's readiness
    /// generation after a restart (latency, tokens), which counts as probe 1.
    async fn probe_series_via(&mut self, router: &UnitRef, readiness: Vec<ProbeRecord>) {
        let target = match &self.direct {
            Some(path) => format!("kv:{} -> {}", path.prefill_url, path.decode_url),
            None => format!("router:{}", router.unit),
        };
        let (host, unit) = (router.host.clone(), router.unit.clone());
        for mut r in readiness {
            r.seq = self.probes.len() as u32 + 1;
            let latency_ms = r.latency_ms.unwrap_or(0);
            self.probes.push(match r.outcome.as_str() {
                "ok" => ProbeObservation::Ok {
                    latency_ms,
                    tokens: r.tokens,
                },
                "timeout" => ProbeObservation::Timeout { after_ms: latency_ms },
                _ => ProbeObservation::Error {
                    message: r.error.clone(),
                },
            });
            self.rec.probe(r);
        }
        let step_idx = self.rec.step_started("probe", &unit);
        let p = self.pair.probe.clone();
        // xPyD: which engines each probe reached, by their own finished
        // counters, so that a fresh engine's first (cold) answer is told
        // from a relapse wherever in the series the router first picks it.
        let xpyd = self.pair.prefill.len() > 1 || self.pair.decode.len() > 1;
        let served = |c: &BTreeMap<String, EngineCounterRecord>| -> BTreeMap<String, f64> {
            c.iter()
                .filter_map(|(u, r)| r.requests_total.map(|n| (u.clone(), n)))
                .collect()
        };
        let mut last_counts = if xpyd {
            Some(served(&self.scrape_engines().await))
        } else {
            None
        };
        let mut reached: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        // A probe that met a fresh engine (by its counters) does not use up
        // the series: each engine is fresh once, so this adds at most one
        // probe per engine.
        let mut seq = self.probes.len() as u32;
        loop {
            seq += 1;
            if seq > p.max_probes.saturating_add(self.fresh_engine_answers.len() as u32) {
                break;
            }
            let warm_tail = self
                .probes
                .iter()
                .rev()
                .take_while(|o| matches!(o, ProbeObservation::Ok { latency_ms, .. } if *latency_ms <= p.warm_budget_ms))
                .count();
            if warm_tail >= p.warm_probes as usize
                || matches!(self.probes.last(), Some(ProbeObservation::Timeout { .. }))
            {
                break;
            }
            let (obs, record) = self.probe_once(&host, &unit, &target, seq).await;
            self.rec.probe(record);
            self.probes.push(obs);
            if let Some(before) = last_counts.as_mut() {
                let now = served(&self.scrape_engines().await);
                let first_time: Vec<&String> = now
                    .iter()
                    .filter(|(u, n)| before.get(*u).is_some_and(|b| *n > b) && !reached.contains(*u))
                    .map(|(u, _)| u)
                    .collect();
                if !first_time.is_empty() {
                    self.fresh_engine_answers.push(seq as usize);
                }
                reached.extend(first_time.into_iter().cloned());
                *before = now;
            }
        }
        self.rec.step_ended(step_idx, format!("{} probes", self.probes.len()));
    }

    /// Runs the enabled suite steps through the first router, in order, each
    /// judged on its own and against the pair's last healthy verification.
    /// One scrape of every engine of the pair (`ScrapeEngines` to each
    /// host), by unit. A unit whose agent did not answer is missing.
    async fn scrape_engines(&self) -> BTreeMap<String, EngineCounterRecord> {
        let samples = crate::ops::drain::scrape_pair(&*self.ctx.agents, &self.pair, 2_000).await;
        let role = |unit: &UnitRef| {
            if self.pair.prefill.contains(unit) {
                "prefill"
            } else {
                "decode"
            }
        };
        self.pair
            .prefill
            .iter()
            .chain(&self.pair.decode)
            .map(|u| {
                let sample = samples.get(&u.to_string()).and_then(Option::as_ref);
                let record = EngineCounterRecord {
                    unit: u.unit.clone(),
                    role: role(u).into(),
                    transfer_failed_total: sample.and_then(|s| s.transfer_failed_total),
                    bootstrap_failed_total: sample.and_then(|s| s.bootstrap_failed_total),
                    requests_total: sample.and_then(|s| s.requests_total),
                    error: match sample {
                        None => "no answer from the agent".into(),
                        Some(s) if !s.metrics_ok => s.error.clone(),
                        Some(_) => String::new(),
                    },
                };
                (u.unit.clone(), record)
            })
            .collect()
    }

    /// The engines of an xPyD pair the verification did not reach through
    /// the router (their finished-request counter did not move from
    /// `before`, 0 for a restarted one), each proven by a PD request sent
    /// straight to it and a partner of the other side (`ProbeRequest.pd_path`):
    /// the lines for the report, and whether one of them failed.
    async fn prove_unreached(
        &self,
        before: Option<&BTreeMap<String, EngineCounterRecord>>,
        after: &BTreeMap<String, EngineCounterRecord>,
    ) -> Vec<UnreachedProof> {
        let unreached = |u: &UnitRef| {
            after.get(&u.unit).and_then(|a| a.requests_total).is_some_and(|now| {
                let then = before
                    .and_then(|b| b.get(&u.unit))
                    .and_then(|b| b.requests_total)
                    .unwrap_or(0.0);
                now <= then
            })
        };
        let facts = |u: &UnitRef| self.ctx.agents.unit(&u.host, &u.unit);
        let mut proofs = Vec::new();
        let (Some(p0), Some(d0)) = (self.pair.prefill.first(), self.pair.decode.first()) else {
            return proofs;
        };
        let mut paths: Vec<(&UnitRef, &UnitRef)> = Vec::new();
        for d in self.pair.decode.iter().filter(|d| unreached(d)) {
            paths.push((p0, d));
        }
        // A decode's proof from prefill-0 proves prefill-0 too.
        let p0_proven = !paths.is_empty();
        for p in self
            .pair
            .prefill
            .iter()
            .filter(|p| unreached(p) && !(p0_proven && *p == p0))
        {
            paths.push((p, d0));
        }
        for (p, d) in paths {
            let (Some(pf), Some(df)) = (facts(p), facts(d)) else {
                continue;
            };
            let path = pdwarden_proto::v1::PdPath {
                decode_url: df.base_url.clone(),
                bootstrap_host: crate::ops::drain::url_host(&pf.base_url).to_string(),
                bootstrap_port: pf.bootstrap_port,
                prefill_url: String::new(),
            };
            let target = match (unreached(p), unreached(d)) {
                (true, true) => format!("{} (and {})", d.unit, p.unit),
                (_, true) => d.unit.clone(),
                _ => p.unit.clone(),
            };
            proofs.push(UnreachedProof {
                target,
                prefill: p.unit.clone(),
                decode: d.unit.clone(),
                error: crate::ops::drain::pd_probe(&*self.ctx.agents, p, &self.pair, path)
                    .await
                    .err()
                    .map(|e| e.to_string()),
            });
        }
        proofs
    }

    /// One scrape of every router of the pair (`ScrapeEngines` to its
    /// host, the router's own Prometheus port): its retry and error
    /// counters per worker, by unit. A router whose agent or metrics did
    /// not answer is missing.
    async fn scrape_routers(&self) -> BTreeMap<String, RouterScrape> {
        let samples = crate::ops::drain::scrape_units(&*self.ctx.agents, &self.pair.router, 2_000).await;
        self.pair
            .router
            .iter()
            .filter_map(|u| {
                let s = samples.get(&u.to_string())?.as_ref().filter(|s| s.metrics_ok)?;
                let workers = s
                    .router_workers
                    .iter()
                    .map(|w| RouterWorkerCount {
                        worker: w.worker.clone(),
                        worker_type: w.worker_type.clone(),
                        retries: w.retries_total,
                        errors: w.errors_total,
                    })
                    .collect();
                Some((
                    u.unit.clone(),
                    RouterScrape {
                        kind: s.engine_kind.clone(),
                        workers,
                    },
                ))
            })
            .collect()
    }

    /// The suite's budgets, from this operation's warm answers and the
    /// pair's last healthy verifications (the config's numbers override).
    fn suite_budgets(&self) -> SuiteBudgets {
        let cfg = &self.pair.suite;
        let warm = self.pair.probe.warm_budget_ms;
        let history_tpot_us = healthy_suites(&self.ctx.journal, &self.pair.name)
            .into_iter()
            .filter_map(|(op, steps)| {
                let lg = steps.iter().find(|s| s.step == SuiteStep::LongGeneration)?;
                Some((op, *lg.figures.get("tpot_us")?))
            })
            .filter(|(_, us)| *us > 0)
            .collect();
        let history_batching = healthy_suites(&self.ctx.journal, &self.pair.name)
            .into_iter()
            .filter_map(|(op, steps)| {
                let c = steps.iter().find(|s| s.step == SuiteStep::Concurrency)?;
                let (slowest, single) = (*c.figures.get("slowest_ms")?, *c.figures.get("single_request_ms")?);
                (single > 0).then(|| (op, slowest as f64 / single as f64))
            })
            .collect();
        suite::derive_budgets(&BudgetInputs {
            history_batching,
            warm_budget_ms: warm,
            probe_max_tokens: self.pair.probe.max_tokens,
            warm_answers_ms: self
                .probes
                .iter()
                .filter_map(|p| match p {
                    ProbeObservation::Ok { latency_ms, .. } if *latency_ms <= warm => Some(*latency_ms),
                    _ => None,
                })
                .collect(),
            history_tpot_us,
            ttft_override_ms: cfg.ttft_budget_ms,
            tpot_override_ms: cfg.tpot_budget_ms,
            gap_override_ms: cfg.long_generation.max_token_gap_ms,
            slowest_override_ms: cfg.concurrency.slowest_budget_ms,
            tpot_history_ratio: cfg.tpot_history_ratio,
            min_batching_gain: cfg.min_batching_gain,
            engines_batch: cfg.concurrency.engines_batch,
            floor_ms: cfg.baseline_floor_ms,
        })
    }

    /// Runs the enabled suite steps in order and stops at the first that
    /// proves a wedge or a failure (issue 30: nine more requests against a
    /// proven wedge only delay the verdict): the steps run, and those not.
    async fn verification_suite(
        &mut self,
        abort_storm: bool,
    ) -> Result<(Vec<StepReport>, Vec<SuiteStep>), crate::ops::journal::JournalError> {
        let cfg = self.pair.suite.clone();
        let mut plan: Vec<SuiteStep> = Vec::new();
        if cfg.long_generation.enabled {
            plan.push(SuiteStep::LongGeneration);
        }
        if cfg.multi_turn.enabled {
            plan.push(SuiteStep::MultiTurn);
        }
        if cfg.concurrency.enabled {
            plan.push(SuiteStep::Concurrency);
        }
        if abort_storm {
            plan.push(SuiteStep::AbortStorm);
        }
        // A pair without a router (a rolling restart's sub-pair): its suite
        // runs with the whole pair's verification, through the router.
        if plan.is_empty() || self.pair.router.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let baseline = last_healthy_suite(&self.ctx.journal, &self.pair.name);
        let budgets = self.suite_budgets();
        self.rec.journal_entry(self.rec.now_ms(), "suite_budgets", &budgets);
        self.budgets = Some(budgets.clone());
        let router = self.pair.router[0].clone();
        let chat = self.chat_probe();
        let mut steps: Vec<StepReport> = Vec::new();
        let mut plan = plan.into_iter();
        for step in plan.by_ref() {
            let (request, timeout_ms) = match step {
                SuiteStep::LongGeneration => (
                    suite_step_request::Step::LongGeneration(SuiteLongGeneration {
                        chat: Some(ChatProbe {
                            max_tokens: cfg.long_generation.max_tokens,
                            ..chat.clone()
                        }),
                        timeout_ms: cfg.long_generation.timeout_ms,
                        // Stop listening a little after the budget is blown:
                        // the evidence is in by then.
                        silence_timeout_ms: budgets.max_token_gap_ms.saturating_mul(2),
                    }),
                    cfg.long_generation.timeout_ms,
                ),
                SuiteStep::MultiTurn => (
                    suite_step_request::Step::MultiTurn(SuiteMultiTurn {
                        chat: Some(chat.clone()),
                        second_prompt: cfg.multi_turn.second_prompt.clone(),
                        timeout_ms: cfg.multi_turn.timeout_ms,
                    }),
                    2 * cfg.multi_turn.timeout_ms,
                ),
                SuiteStep::Concurrency => (
                    suite_step_request::Step::Concurrency(SuiteConcurrency {
                        chat: Some(chat.clone()),
                        requests: cfg.concurrency.requests,
                        timeout_ms: cfg.concurrency.timeout_ms,
                    }),
                    cfg.concurrency.timeout_ms,
                ),
                SuiteStep::AbortStorm => (
                    suite_step_request::Step::AbortStorm(SuiteAbortStorm {
                        chat: Some(chat.clone()),
                        requests: cfg.abort_storm.requests,
                        prompt_tokens: cfg.abort_storm.prompt_tokens,
                        abort_after_ms: cfg.abort_storm.abort_after_ms,
                        probe_timeout_ms: cfg.abort_storm.probe_timeout_ms,
                    }),
                    cfg.abort_storm.abort_after_ms + cfg.abort_storm.probe_timeout_ms,
                ),
            };
            let step_idx = self
                .rec
                .step_started(&format!("verify-{}", step.as_str()), &router.unit);
            let samples = self.suite_step(&router, request, timeout_ms).await;
            let mut report = match step {
                SuiteStep::LongGeneration => suite::judge_long_generation(samples, &budgets),
                SuiteStep::MultiTurn => suite::judge_multi_turn(samples, &budgets, cfg.multi_turn.ttft_budget_ms),
                SuiteStep::Concurrency => suite::judge_concurrency(samples, &budgets),
                SuiteStep::AbortStorm => suite::judge_abort_storm(samples, &budgets),
            };
            let base = baseline
                .as_ref()
                .and_then(|(op, steps)| steps.iter().find(|s| s.step == step).map(|s| (op, s)))
                .map(|(op, s)| Baseline {
                    operation_id: op.clone(),
                    figures: s.figures.clone(),
                });
            suite::compare_with_baseline(
                &mut report,
                base.as_ref(),
                cfg.baseline_warning_ratio,
                cfg.baseline_floor_ms,
            );
            self.rec.journal_entry(self.rec.now_ms(), "suite_step", &report);
            let status = match report.status {
                suite::StepStatus::Pass => "pass",
                suite::StepStatus::Warn => "warn",
                suite::StepStatus::Fail => "fail",
            };
            let detail = if report.reasons.is_empty() {
                report.summary()
            } else {
                report.reasons.join("; ")
            };
            self.rec.step_ended(step_idx, format!("{status}: {detail}"));
            let proven = matches!(report.fails_as, Some(VerdictKind::Wedged | VerdictKind::Failed));
            steps.push(report);
            if proven {
                break;
            }
        }
        Ok((steps, plan.collect()))
    }

    /// Sends one suite step to the router's agent and waits for its samples.
    async fn suite_step(
        &self,
        router: &UnitRef,
        step: suite_step_request::Step,
        timeout_ms: u64,
    ) -> Vec<RequestSample> {
        let command_id = uuid::Uuid::new_v4().to_string();
        let cmd = Command {
            fencing_token: 0,
            command_id: command_id.clone(),
            action: Some(command::Action::SuiteStep(SuiteStepRequest {
                unit: router.unit.clone(),
                step: Some(step),
            })),
        };
        let failed = |error: String| {
            vec![RequestSample {
                index: 0,
                outcome: SampleOutcome::Error,
                latency_ms: 0,
                ttft_ms: 0,
                tokens: 0,
                error,
                aborted: false,
                token_times_ms: Vec::new(),
                request_id: String::new(),
                tokens_asked: 0,
                finish_reason: String::new(),
                stream_error: String::new(),
            }]
        };
        let answer = self
            .ctx
            .agents
            .ask(
                &router.host,
                &router.unit,
                cmd,
                Duration::from_millis(timeout_ms),
                |r| match r {
                    AgentReport::Suite(r) => Some(r),
                    _ => None,
                },
            )
            .await;
        match answer {
            Ok(r) => r.samples.into_iter().map(sample_from_wire).collect(),
            Err(e) => failed(e.to_string()),
        }
    }

    async fn probe_once(&self, host: &str, unit: &str, target: &str, seq: u32) -> (ProbeObservation, ProbeRecord) {
        let timeout_ms = self.pair.probe.probe_timeout_ms;
        let command_id = uuid::Uuid::new_v4().to_string();
        let cmd = Command {
            fencing_token: 0,
            command_id: command_id.clone(),
            action: Some(command::Action::Probe(ProbeRequest {
                unit: unit.into(),
                chat: Some(self.chat_probe()),
                timeout_ms,
                seq,
                pd_path: self.direct.clone(),
            })),
        };
        let mut record = ProbeRecord {
            target: target.into(),
            seq,
            latency_ms: None,
            tokens: 0,
            outcome: "error".into(),
            error: String::new(),
            request_id: String::new(),
        };
        let result = self
            .ctx
            .agents
            .ask(host, unit, cmd, Duration::from_millis(timeout_ms), |r| match r {
                AgentReport::Probe(r) => Some(r),
                _ => None,
            })
            .await
            .map_err(|e| e.to_string());
        let obs = match result {
            Err(message) => {
                record.error = message.clone();
                ProbeObservation::Error { message }
            }
            Ok(r) => {
                record.request_id = r.request_id.clone();
                record.tokens = r.tokens;
                let obs = ProbeObservation::from_wire(&r);
                record.error = match &obs {
                    ProbeObservation::Error { message } if r.error.is_empty() => message.clone(),
                    _ => r.error.clone(),
                };
                record.outcome = obs.kind().into();
                record.latency_ms = Some(r.latency_ms);
                obs
            }
        };
        (obs, record)
    }
}

/// The link to a start's agent broke. Waits (at most [`REATTACH_GRACE`],
/// never past the start's deadline) for the agent to attach again, then
/// re-sends the same command id — the agent answers a known id without
/// executing it twice, the adoption a resumed operation uses — and follows
/// the start again; what it missed meanwhile is read from the agent's facts
/// (a start that ended while the link was down: where it ended). False when
/// the agent did not come back: the contact is lost.
async fn reattach(rec: &Recorder, agents: &dyn AgentPort, s: &mut UnitStart) -> bool {
    if s.reattached >= MAX_REATTACH {
        return false;
    }
    let until = s.deadline.min(Instant::now() + REATTACH_GRACE);
    let host = s.unit.host.clone();
    while Instant::now() < until {
        if agents.is_connected(&host)
            && let Ok(rx) = agents.send(&host, &s.unit.unit, s.command.clone()).await
        {
            s.rx = Some(rx);
            s.reattached += 1;
            let facts = agents.unit(&host, &s.unit.unit);
            rec.journal_entry(
                rec.now_ms(),
                "reattached",
                &serde_json::json!({
                    "command_id": s.command_id,
                    "unit": s.unit.to_string(),
                    "phase": facts.as_ref().map(|f| phase_name(f.phase)),
                }),
            );
            if let Some(f) = facts.filter(|f| f.command_id == s.command_id && !f.command_in_progress) {
                s.state = match Phase::try_from(f.phase) {
                    Ok(Phase::Generating) => {
                        s.furthest = Some(ReadinessPhase::Generating);
                        StartState::GeneratingBefore
                    }
                    Ok(Phase::Exited) => StartState::Exited,
                    _ => StartState::NotReady,
                };
                s.last_detail = format!(
                    "{}: reached while agent {host}'s link was down (its facts, read when it re-attached)",
                    phase_name(f.phase)
                );
            }
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Receives and applies one report for a unit's start (or concludes it at
/// its deadline).
async fn next_report(rec: &Recorder, agents: &dyn AgentPort, s: &mut UnitStart) {
    let Some(rx) = s.rx.as_mut() else {
        if !s.state.is_over() {
            s.state = StartState::Failed {
                after_spawn: s.state.spawned(),
            };
        }
        return;
    };
    let report = match tokio::time::timeout_at(s.deadline, rx.recv()).await {
        Ok(Some(AgentReport::Disconnected) | None) if reattach(rec, agents, s).await => return,
        Ok(Some(r)) => r,
        Ok(None) => AgentReport::Disconnected,
        Err(_) => {
            agents.forget(&s.command_id);
            s.state = StartState::Failed {
                after_spawn: s.state.spawned(),
            };
            s.last_detail = format!(
                "no word from the agent on {} by its deadline; last: {}",
                s.unit, s.last_detail
            );
            rec.step_ended(s.step_idx, s.outcome());
            return;
        }
    };
    apply_report(rec, s, report);
    if s.state.is_over() {
        agents.forget(&s.command_id);
        rec.step_ended(s.step_idx, s.outcome());
    }
}

fn apply_report(rec: &Recorder, s: &mut UnitStart, report: AgentReport) {
    match report {
        AgentReport::Unit(ev) if ev.attempt.is_some() => {
            let a = ev.attempt.clone().unwrap_or_default();
            let at_ms = s.sent_at_ms + ev.ms_since_command;
            let generation = CheckKind::try_from(a.check) == Ok(CheckKind::Generation);
            let record = AttemptRecord {
                unit: s.unit.unit.clone(),
                role: s.role.into(),
                check: if generation { "generation" } else { "health" }.into(),
                outcome: match AttemptOutcome::try_from(a.outcome).unwrap_or(AttemptOutcome::Unspecified) {
                    AttemptOutcome::Ok => "ok",
                    AttemptOutcome::Timeout => "timeout",
                    AttemptOutcome::Refused => "refused",
                    _ => "error",
                }
                .into(),
                seq: a.seq,
                http_status: a.http_status,
                latency_ms: a.latency_ms,
                count: a.count.max(1),
                first_at_ms: s.sent_at_ms + a.first_ms_since_command.min(ev.ms_since_command),
                at_ms,
                detail: a.detail,
                request_id: a.request_id,
            };
            // Attempts reported while the old instance stopped are not this start's.
            if s.state.spawned() && generation {
                s.generation_attempts.push(record.clone());
            }
            rec.attempt(record);
        }
        AgentReport::Unit(ev) => {
            let phase = Phase::try_from(ev.phase).unwrap_or(Phase::Unspecified);
            let mut name = phase_name(ev.phase).to_string();
            if !s.state.spawned() && matches!(phase, Phase::Exited) {
                // The previous instance stopping, not the new one failing.
                name = "stopped".into();
            }
            rec.phase(TimelineRecord {
                unit: s.unit.unit.clone(),
                role: s.role.into(),
                phase: name,
                at_ms: s.sent_at_ms + ev.ms_since_command,
                detail: ev.detail.clone(),
            });
            if !ev.detail.is_empty() {
                s.last_detail = ev.detail.clone();
            }
            let reached = match phase {
                Phase::Spawned => {
                    s.state = StartState::Spawned;
                    s.config_fingerprint = ev.config_fingerprint.clone();
                    Some(ReadinessPhase::Spawned)
                }
                Phase::Refused => Some(ReadinessPhase::Refused),
                Phase::Http503 => Some(ReadinessPhase::Http503),
                Phase::Healthy => Some(ReadinessPhase::Healthy),
                Phase::Generating => {
                    s.state = StartState::Generating(PassedCheck {
                        latency_ms: ev.check_latency_ms,
                        tokens: ev.check_tokens,
                        engine_version: ev.engine_version.clone(),
                    });
                    Some(ReadinessPhase::Generating)
                }
                Phase::Exited if s.state.spawned() => {
                    s.state = StartState::Exited;
                    None
                }
                Phase::NotReady => {
                    s.state = StartState::NotReady;
                    None
                }
                _ => None,
            };
            if let Some(r) = reached {
                s.furthest = Some(s.furthest.map_or(r, |f| f.max(r)));
            }
        }
        AgentReport::Result(r) => {
            s.acked = true;
            if !r.ok {
                s.state = StartState::Failed {
                    after_spawn: s.state.spawned(),
                };
                s.last_detail = format!("start failed: {}", r.error);
            }
        }
        AgentReport::Probe(_)
        | AgentReport::Suite(_)
        | AgentReport::UnitConfig(_)
        | AgentReport::Gate(_)
        | AgentReport::RouterWorkers(_)
        | AgentReport::Scrape(_) => {}
        AgentReport::Disconnected => {
            s.state = StartState::LostContact {
                after_spawn: s.state.spawned(),
            };
            s.last_detail = format!("agent {} disconnected; last: {}", s.unit.host, s.last_detail);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::OrchestratorConfig;

    fn pair(policy: &str) -> PairConfig {
        let text = format!(
            r#"
listen = "127.0.0.1:7070"
journal = "/tmp/j.sqlite"
[[pair]]
name = "p"
decode_start_policy = "{policy}"
prefill = [{{ host = "h", unit = "prefill-0" }}]
decode = [{{ host = "h", unit = "decode-0" }}]
router = [{{ host = "h", unit = "router-0" }}]
[pair.probe]
model = "m"
prompt = "hi"
warm_budget_ms = 1000
cold_allowance_ms = 30000
probe_timeout_ms = 120000
"#
        );
        OrchestratorConfig::from_toml_str(&text).unwrap().pairs.remove(0)
    }

    /// Issue 30: `verify` of a pair that never failed before — its labelled
    /// failure counter absent from a scrape that answered — must count the
    /// first failure (the span was built only for a counter that existed
    /// before). A failed scrape says nothing; a restarted engine counts from 0.
    #[test]
    fn an_absent_counter_is_zero_and_a_failed_scrape_says_nothing() {
        let p = pair("after-prefill-ready");
        let rec = |unit: &str, role: &str, transfer: Option<f64>, error: &str| EngineCounterRecord {
            unit: unit.into(),
            role: role.into(),
            transfer_failed_total: transfer,
            bootstrap_failed_total: None,
            requests_total: Some(5.0),
            error: error.into(),
        };
        let map = |rs: Vec<EngineCounterRecord>| -> BTreeMap<String, EngineCounterRecord> {
            rs.into_iter().map(|r| (r.unit.clone(), r)).collect()
        };
        let before = map(vec![
            rec("prefill-0", "prefill", None, ""),
            rec("decode-0", "decode", None, "connection refused"),
        ]);
        let after = map(vec![
            rec("prefill-0", "prefill", Some(1.0), ""),
            rec("decode-0", "decode", Some(1.0), ""),
        ]);
        let e = engine_evidence(&p, Some(&before), &after);
        assert_eq!(e[0].unit, "prefill-0");
        assert_eq!(
            e[0].before,
            Some(EngineCounts::default()),
            "absent, from a scrape that answered"
        );
        assert_eq!(e[0].after.and_then(|a| a.transfer_failed), Some(1.0));
        assert_eq!(e[1].before, None, "a failed scrape says nothing");
        let restarted = engine_evidence(&p, None, &after);
        assert_eq!(
            restarted[1].before.and_then(|b| b.transfer_failed),
            Some(0.0),
            "a restarted engine counts from 0"
        );
    }

    /// Issue 14: a resumed operation adopts the starts it had sent that the
    /// agent is still on (same command id), and only those: a start the
    /// agent has since replaced, or never received, is not adopted.
    /// Issue 32 (INCIDENTS row 1): a co-restart stopped after its prefill
    /// and before its decode says which units it restarted, which not, and
    /// that the decode still holds the old prefill's bootstrap; one that
    /// restarted every unit, or none, says nothing of it.
    #[test]
    fn a_half_restarted_pair_says_what_is_live() {
        let unit = |u: &str, role: &'static str, r: Restarted| (u.to_string(), role, r);
        let lines = what_is_live(&[
            unit("prefill-0", "prefill", Restarted::Yes),
            unit("decode-0", "decode", Restarted::No),
            unit("decode-1", "decode", Restarted::Unknown),
            unit("router-0", "router", Restarted::No),
        ]);
        assert_eq!(lines[0], "restarted by this operation (new processes): prefill-0");
        assert!(lines[1].ends_with(": decode-1"), "{lines:?}");
        assert!(lines[2].ends_with(": decode-0, router-0"), "{lines:?}");
        assert!(
            lines[3].starts_with("decode-0 still holds the bootstrap of prefill-0's old process"),
            "{lines:?}"
        );
        assert_eq!(lines.len(), 4, "{lines:?}");
        for all in [Restarted::Yes, Restarted::No] {
            let units = [unit("prefill-0", "prefill", all), unit("decode-0", "decode", all)];
            assert!(what_is_live(&units).is_empty());
        }
        let router_only = what_is_live(&[
            unit("prefill-0", "prefill", Restarted::Yes),
            unit("decode-0", "decode", Restarted::Yes),
            unit("router-0", "router", Restarted::No),
        ]);
        assert!(!router_only.iter().any(|l| l.contains("bootstrap")), "{router_only:?}");
    }

    #[test]
    fn adopts_only_the_starts_the_agent_is_still_on() {
        let cmd = |unit: &str, id: &str, action| CommandEntry {
            command_id: id.into(),
            action,
            unit: unit.into(),
            restart: true,
        };
        let entries = vec![
            cmd("h/prefill-0", "p1", CommandAction::Start),
            cmd("h/decode-0", "d0", CommandAction::Start),
            cmd("h/decode-0", "d1", CommandAction::Start),
            cmd("h/router-0", "r1", CommandAction::Start),
            cmd("h/router-0", "r2", CommandAction::Inspect),
        ];
        let a = adoptable_starts(&entries, |unit| match unit {
            "h/prefill-0" => Some(("p1".into(), Phase::Generating, false)),
            "h/decode-0" => Some(("d1".into(), Phase::Http503, true)),
            "h/router-0" => Some(("someone-else".into(), Phase::Generating, false)),
            _ => None,
        });
        assert_eq!(a.len(), 2, "{a:?}");
        assert_eq!(
            a["h/prefill-0"],
            Adopted {
                command_id: "p1".into(),
                phase: "generating".into(),
                in_progress: false
            }
        );
        assert_eq!(a["h/decode-0"].command_id, "d1", "the last start sent for the unit");
        assert!(a["h/decode-0"].in_progress);
        assert!(!a.contains_key("h/router-0"), "superseded by another command");
    }

    /// An orchestrator killed during decode's step resumes at decode when the
    /// agents say prefill is generating, keeping prefill as evidence.
    #[test]
    fn resumes_at_the_step_in_progress_when_earlier_units_generate() {
        let p = pair("after-prefill-ready");
        let (from, kept) = resume_point(CoRestartStep::parse("restarting_decode"), &p, |_| {
            Some(Phase::Generating)
        });
        assert_eq!(from, CoRestartStep::RestartingDecode);
        assert_eq!(kept.iter().map(|k| k.unit.as_str()).collect::<Vec<_>>(), ["prefill-0"]);
        let (from, kept) = resume_point(CoRestartStep::parse("probing"), &p, |_| Some(Phase::Generating));
        assert_eq!(from, CoRestartStep::Probing);
        assert_eq!(kept.len(), 3);
    }

    /// Property: a unit that is not generating is never trusted; the
    /// co-restart starts over from prefill.
    #[test]
    fn restarts_from_prefill_when_an_earlier_unit_is_not_generating() {
        let p = pair("after-prefill-ready");
        for state in ["restarting_decode", "restarting_router", "probing", "verifying"] {
            let (from, kept) = resume_point(CoRestartStep::parse(state), &p, |u| {
                (u.unit != "prefill-0")
                    .then_some(Phase::Generating)
                    .or(Some(Phase::Healthy))
            });
            assert_eq!(from, CoRestartStep::RestartingPrefill, "{state}");
            assert!(kept.is_empty());
        }
        // Unknown facts (agent lost the unit) count as not generating.
        let (from, _) = resume_point(CoRestartStep::parse("restarting_router"), &p, |_| None);
        assert_eq!(from, CoRestartStep::RestartingPrefill);
    }

    /// Under `overlap`, decode's step began before prefill generated, so an
    /// interrupted decode step starts over from prefill.
    #[test]
    fn overlap_decode_step_restarts_from_prefill() {
        let p = pair("overlap");
        let (from, _) = resume_point(CoRestartStep::parse("restarting_decode"), &p, |_| {
            Some(Phase::Generating)
        });
        assert_eq!(from, CoRestartStep::RestartingPrefill);
        let (from, _) = resume_point(CoRestartStep::parse("started"), &p, |_| Some(Phase::Generating));
        assert_eq!(from, CoRestartStep::RestartingPrefill);
    }
}

/// The co-restart driver over the in-memory agent ([`crate::ops::fake_agent`]),
/// at paused time: the whole operation in milliseconds, and an orchestrator
/// killed at every point it can be killed (each await after a journal
/// write), then resumed by a new orchestrator from the journal and the
/// agents' facts (issue 14).
#[cfg(test)]
mod driver_tests {
    use super::*;
    use crate::ops::fake_agent::rig::{UNITS, agent, journal, kill_at_every_point, orchestrator};

    fn pair(policy: &str) -> PairConfig {
        crate::ops::fake_agent::rig::pair(policy, "")
    }

    fn begin(journal: &Journal) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        journal.begin(&id, "co_restart", "p", None).unwrap();
        id
    }

    /// An automatic recovery as the watch begins one (`watcher.rs`,
    /// `recover`): its request id and its trigger journaled before any
    /// command. It runs, and resumes, as a co-restart.
    fn begin_recovery(journal: &Journal) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        journal
            .begin(&id, "co_restart", "p", Some(&format!("auto-{id}")))
            .unwrap();
        journal
            .append(
                &id,
                0,
                "trigger",
                &serde_json::json!({ "automatic": true, "state": "wedged" }),
            )
            .unwrap();
        id
    }

    /// A co-restart of the rig's pair on its own task.
    fn spawn_co_restart(ctx: OperationContext, journal: &Journal) -> tokio::task::JoinHandle<OperationReport> {
        let id = begin(journal);
        let (tx, _rx) = mpsc::unbounded_channel();
        tokio::spawn(run_operation(
            ctx,
            pair("after-prefill-ready"),
            id,
            OperationKind::CoRestart,
            tx,
        ))
    }

    /// Waits (simulated time, bounded) until this operation's start of
    /// `unit` has reached `phase` at the agent.
    async fn until_started_and(agent: &crate::ops::fake_agent::FakeAgent, unit: &str, phase: Phase) {
        for _ in 0..600_000 {
            if agent.starts_of(unit) == 1 && agent.unit_phase(unit) == phase {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("{unit} never reached {phase:?}");
    }

    /// Issue 16, finding 6: the link to the agent breaks while the decode
    /// starts (an orchestrator paused by SIGSTOP finds it so when it
    /// resumes) and the agent re-attaches 3 s later. The step gave up at
    /// once ("agent disconnected"); now it waits for the agent, follows the
    /// same start again (never a second start), and the pair is healthy.
    /// An agent that never comes back still ends the step, after the grace.
    #[tokio::test(start_paused = true)]
    async fn a_link_broken_mid_step_is_followed_again_when_the_agent_reattaches() {
        for comes_back in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let journal = journal(&dir);
            let agent = agent();
            let port = crate::ops::fake_agent::FakePort::default();
            agent.attach(&port).await;
            let ctx = OperationContext {
                agents: std::sync::Arc::new(port.clone()),
                journal: journal.clone(),
            };
            let op = spawn_co_restart(ctx, &journal);
            until_started_and(&agent, "decode-0", Phase::Spawned).await;
            port.break_link("h1");
            if comes_back {
                tokio::time::sleep(Duration::from_secs(3)).await;
                agent.attach(&port).await;
            }
            let report = op.await.unwrap();
            assert_eq!(agent.starts_of("decode-0"), 1, "{:?}", agent.executed());
            if comes_back {
                assert!(report.verdict.is_healthy(), "{:?}", report.reasons);
                assert_eq!(agent.starts_of("router-0"), 1);
            } else {
                assert!(!report.verdict.is_healthy(), "{:?}", report.reasons);
                assert!(
                    report.reasons.iter().any(|r| r.contains("disconnected")),
                    "{:?}",
                    report.reasons
                );
            }
        }
    }

    /// Issue 16, finding 7: a router killed (SIGKILL) once it generated,
    /// under the probe series. The probes' connection errors were the only
    /// reasons; the agent's report of how the router ended is evidence and
    /// comes first.
    #[tokio::test(start_paused = true)]
    async fn a_unit_killed_mid_probe_is_named_with_the_agents_report() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        let ctx = orchestrator(&journal, &agent).await;
        let op = spawn_co_restart(ctx, &journal);
        until_started_and(&agent, "router-0", Phase::Generating).await;
        agent.crash("router-0", "killed by signal 9 (SIGKILL)");
        let report = op.await.unwrap();
        assert!(!report.verdict.is_healthy(), "{:?}", report.reasons);
        assert_eq!(
            report.reasons[0], "router-0 is not running: exited: killed by signal 9 (SIGKILL) (its agent's report)",
            "{:?}",
            report.reasons
        );
        assert!(report.probes.iter().any(|p| p.outcome != "ok"), "{:?}", report.probes);
    }

    /// Issue 16, finding 1: a pair whose timeouts are past every clock (a
    /// config built as a value skips the load's bound) restarts healthy —
    /// the deadline saturates instead of panicking on an add overflow and
    /// leaving the operation running with its pair locked.
    #[tokio::test(start_paused = true)]
    async fn timeouts_past_every_clock_saturate_instead_of_panicking() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        let ctx = orchestrator(&journal, &agent).await;
        let mut pair = pair("after-prefill-ready");
        pair.timeouts.prefill_ready_ms = u64::MAX;
        pair.timeouts.router_ready_ms = u64::MAX;
        pair.timeouts.stop_grace_ms = u64::MAX;
        let id = begin(&journal);
        let (tx, _rx) = mpsc::unbounded_channel();
        let report = run_operation(ctx, pair, id, OperationKind::CoRestart, tx).await;
        assert!(report.verdict.is_healthy(), "{:?}", report.reasons);
        assert!(journal.unfinished().unwrap().is_empty());
        begin(&journal);
    }

    /// Uninterrupted: healthy, each unit started once, in order (decode only
    /// after prefill generates, the router only after decode does).
    #[tokio::test(start_paused = true)]
    async fn co_restart_over_the_fake_agent_is_healthy_and_ordered() {
        for policy in ["after-prefill-ready", "overlap"] {
            let dir = tempfile::tempdir().unwrap();
            let journal = journal(&dir);
            let agent = agent();
            let ctx = orchestrator(&journal, &agent).await;
            let id = begin(&journal);
            let (tx, _rx) = mpsc::unbounded_channel();
            let report = run_operation(ctx, pair(policy), id, OperationKind::CoRestart, tx).await;
            assert!(report.verdict.is_healthy(), "{policy}: {:?}", report.reasons);
            for u in UNITS {
                assert_eq!(agent.starts_of(u), 1, "{policy}: {:?}", agent.executed());
            }
            let at = |unit: &str, phase: &str| {
                report
                    .timeline
                    .iter()
                    .find(|t| t.unit == unit && t.phase == phase)
                    .map(|t| t.at_ms)
                    .unwrap_or_else(|| panic!("{policy}: no {phase} of {unit}: {:?}", report.timeline))
            };
            assert!(at("router-0", "spawned") >= at("decode-0", "generating"), "{policy}");
            if policy == "after-prefill-ready" {
                assert!(at("decode-0", "spawned") >= at("prefill-0", "generating"));
            } else {
                assert!(at("decode-0", "spawned") < at("prefill-0", "generating"));
            }
        }
    }

    /// Issue 14: the orchestrator killed at every point of a co-restart (the
    /// first await after each journal entry), a new one resuming it: the
    /// operation concludes healthy and every unit was started exactly once
    /// by the agent — a start under way is adopted by its command id, a done
    /// one is not sent again, an unsent one is sent once.
    #[tokio::test(start_paused = true)]
    async fn killed_at_every_point_the_co_restart_starts_each_unit_once() {
        for (policy, begin) in [
            ("after-prefill-ready", begin as fn(&Journal) -> String),
            ("overlap", begin),
            ("after-prefill-ready, automatic recovery", begin_recovery),
        ] {
            let automatic = policy.contains("recovery");
            let policy_name = policy;
            let policy = policy.split(',').next().unwrap();
            let mut states_killed_in = std::collections::BTreeSet::new();
            let entries_of_a_whole_run = kill_at_every_point(
                async || {
                    let dir = tempfile::tempdir().unwrap();
                    let journal = journal(&dir);
                    let agent = agent();
                    let id = begin(&journal);
                    let ctx = orchestrator(&journal, &agent).await;
                    (dir, journal, agent, id, ctx)
                },
                |(_, _, _, id, ctx)| {
                    let (tx, _rx) = mpsc::unbounded_channel();
                    run_operation(ctx.clone(), pair(policy), id.clone(), OperationKind::CoRestart, tx)
                },
                |(_, journal, _, id, _)| journal.entries(id).unwrap().len(),
                async |k, (_dir, journal, agent, id, _)| {
                    let op = journal
                        .unfinished()
                        .unwrap()
                        .pop()
                        .expect("the killed operation is unfinished");
                    states_killed_in.insert(op.state.clone());
                    let state = op.state.clone();
                    let report = resume(orchestrator(&journal, &agent).await, pair(policy), op).await;
                    let at = format!("{policy_name}, killed after entry {k} in state {state}");
                    if automatic {
                        let op = journal.history("p", 1).unwrap().pop().unwrap();
                        assert!(op.trigger.is_some(), "{at}: the recovery's trigger is kept");
                        assert_eq!(op.request_id.as_deref(), Some(format!("auto-{id}").as_str()), "{at}");
                    }
                    assert!(report.verdict.is_healthy(), "{at}: {:?}", report.reasons);
                    for u in UNITS {
                        assert_eq!(agent.starts_of(u), 1, "{at}: {u} started again: {:?}", agent.executed());
                    }
                    assert!(
                        report
                            .reasons
                            .iter()
                            .any(|r| r.starts_with("resumed after an orchestrator restart")),
                        "{at}: {:?}",
                        report.reasons
                    );
                },
            )
            .await;
            assert!(entries_of_a_whole_run > 10);
            for s in ["restarting_prefill", "restarting_router", "probing"] {
                assert!(
                    states_killed_in.contains(s),
                    "{policy}: never killed in {s}: {states_killed_in:?}"
                );
            }
        }
    }

    /// Resumed in `restarting_router` with every start (the router's too)
    /// already over by the agents' facts: nothing is started again, and the
    /// router's readiness check — which this orchestrator never saw — is not
    /// made up as probe 1 (it once was: 0 ms, 0 tokens, "ok").
    #[tokio::test(start_paused = true)]
    async fn an_adopted_finished_router_start_is_not_made_up_as_probe_one() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        let id = begin(&journal);
        for unit in UNITS {
            let command_id = uuid::Uuid::new_v4().to_string();
            journal
                .append(
                    &id,
                    0,
                    journal::COMMAND,
                    &CommandEntry {
                        command_id: command_id.clone(),
                        action: CommandAction::Start,
                        unit: format!("h1/{unit}"),
                        restart: true,
                    },
                )
                .unwrap();
            agent.started_before(unit, &command_id);
        }
        journal.transition(&id, 1, "restarting_router").unwrap();
        let op = journal.unfinished().unwrap().pop().unwrap();
        let report = resume(orchestrator(&journal, &agent).await, pair("after-prefill-ready"), op).await;
        assert!(report.verdict.is_healthy(), "{:?}", report.reasons);
        for u in UNITS {
            assert_eq!(agent.starts_of(u), 1, "{:?}", agent.executed());
        }
        assert!(!report.probes.is_empty());
        assert!(
            report
                .probes
                .iter()
                .all(|p| p.tokens > 0 && p.error != "readiness generation"),
            "{:?}",
            report.probes
        );
    }

    /// Issue 32, item 1 (DESIGN.md 17): a journal that fails at any write —
    /// from the N-th write of the operation on, a full disk staying full —
    /// is tested like a kill at every point. For every N up to the writes a
    /// healthy co-restart makes: every start the agent executed has its
    /// write-ahead command entry in the journal; no unit is started twice;
    /// the verdict is `failed`, naming the journal, whenever a write before
    /// the conclusion failed (only the conclusion's own write failing leaves
    /// the verdict as judged, and the report says the conclusion could not be
    /// journaled); and a prefill restarted under a decode that was not is
    /// said to break the pair's KV transfer (INCIDENTS row 1).
    #[tokio::test(start_paused = true)]
    async fn a_journal_that_fails_at_any_write_never_starts_a_unit_unrecorded() {
        struct Run {
            report: OperationReport,
            writes: usize,
            agent: crate::ops::fake_agent::FakeAgent,
            commands: Vec<CommandEntry>,
        }
        async fn run(policy: &str, fail_from: Option<usize>) -> Run {
            let dir = tempfile::tempdir().unwrap();
            let journal = journal(&dir);
            let agent = agent();
            let ctx = orchestrator(&journal, &agent).await;
            let id = begin(&journal);
            // The journal counts writes from its first (the begin): the
            // operation's own writes are those after.
            let before = journal.writes_seen();
            if let Some(n) = fail_from {
                journal.fail_writes(before + n + 1..=before + n + 100_000);
            }
            let (tx, _rx) = mpsc::unbounded_channel();
            let report = run_operation(ctx, pair(policy), id.clone(), OperationKind::CoRestart, tx).await;
            let writes = journal.writes_seen() - before;
            let commands = journal.commands(&id).unwrap();
            Run {
                report,
                writes,
                agent,
                commands,
            }
        }
        for policy in ["after-prefill-ready", "overlap"] {
            let healthy = run(policy, None).await;
            assert!(healthy.report.verdict.is_healthy(), "{:?}", healthy.report.reasons);
            let total = healthy.writes;
            assert!(total > 10, "{total} writes");
            let mut broken = Vec::new();
            for n in 0..total {
                let r = run(policy, Some(n)).await;
                let at = format!("{policy}, writes failing from write {n} of {total}");
                let reasons = &r.report.reasons;
                // (a) Nothing started unrecorded.
                for e in r.agent.executed() {
                    if !r.commands.iter().any(|c| c.command_id == e.command_id) {
                        broken.push(format!("{at}: {} started without its write-ahead entry", e.unit));
                    }
                }
                // (b) No unit started twice.
                for u in UNITS {
                    if r.agent.starts_of(u) > 1 {
                        broken.push(format!("{at}: {u} started {} times", r.agent.starts_of(u)));
                    }
                }
                // (c) A write failed before the conclusion: failed, naming
                // the journal. Only the conclusion failed: as judged, said.
                let names_journal = reasons
                    .iter()
                    .any(|l| l.starts_with("stopped: the journal could not record a step"));
                if n + 1 < total {
                    if r.report.verdict.is_healthy() || !names_journal {
                        broken.push(format!(
                            "{at}: {} without naming the journal: {reasons:?}",
                            r.report.verdict.as_str()
                        ));
                    }
                } else if !reasons.iter().any(|l| l.contains("could not record this conclusion")) {
                    broken.push(format!("{at}: the unjournaled conclusion is not said: {reasons:?}"));
                }
                // (d) A prefill restarted, a decode not: said, with what it does.
                if r.agent.starts_of("prefill-0") == 1
                    && r.agent.starts_of("decode-0") == 0
                    && !reasons
                        .iter()
                        .any(|l| l.starts_with("decode-0 still holds the bootstrap of prefill-0's old process"))
                {
                    broken.push(format!("{at}: the half-restarted pair is not said: {reasons:?}"));
                }
            }
            assert!(broken.is_empty(), "{broken:#?}");
        }
    }
}
