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
//! The workflow is two machines on the one runtime (`ops::machine`): the
//! stages from the first step to the verdict ([`stages`]: drain, order,
//! assessment, unreached engines, suite, counters, rejoin) and, inside the
//! order, the start order itself ([`machine`]). Each state is journaled
//! before the commands of that state are sent, and every phase event and
//! probe is journaled as it arrives. A start whose
//! command cannot be journaled first is not sent: the order stops there,
//! fails naming the journal, and says which units it left restarted
//! (DESIGN.md 17). The verdict comes
//! from the pure [`pdwarden_model::judge::verdict`] module; this module only gathers evidence.
//!
//! Where the rest lives: each unit's start, sent or
//! adopted, followed through its agent's reports (`starts.rs`); the probe
//! series, the direct proofs and the counters (`probes.rs`); the suite
//! (`verification.rs`); what earlier operations say (`history.rs`); the
//! co-restart's recorder (`recorder.rs`); taking over an interrupted one
//! (`resume.rs`). This file: the operation's kinds and labels, and the
//! driver that carries the stages' effects out and concludes.

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
use crate::ops::journal::{self, CommandAction, CommandEntry, Journal};
use crate::ops::port::{AGENT_SLACK, AgentPort, AgentReport, phase_name};
use pdwarden_model::judge::evidence::{
    EngineCounters, EngineCounts, NotRunning, RouterCounters, RouterTraffic, RouterWorkerCount, UnreachedProof,
    conclude,
};
use pdwarden_model::judge::stats::summarize;
use pdwarden_model::judge::suite::SampleOutcome;
use pdwarden_model::judge::suite::{self, Baseline, BudgetInputs, RequestSample, StepReport, SuiteBudgets, SuiteStep};
use pdwarden_model::judge::verdict::VerdictKind;
use pdwarden_model::judge::verdict::{
    ColdSample, FailedCheck, ProbeObservation, ProbePolicy, ReadinessPhase, UnitStartup, cold_allowance,
};
use pdwarden_model::report::{
    AttemptRecord, EngineCounterRecord, OperationReport, ProbeRecord, RouterCounterRecord, TimelineRecord,
};

mod history;
pub mod machine;
pub(crate) mod output;
pub use output::RECORD_REFERENCE;
mod probes;
mod recorder;
mod resume;
pub mod stages;
mod starts;
mod verification;

use history::*;
use machine::{Progress, Step};
use probes::*;
use recorder::*;
pub use resume::{Adopted, Resume, adoptable_starts, resume, resume_point};
use stages::{Assessment, Stage, StageEffect, StageEvent, Stages};
use starts::*;

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
    /// A pair judged wedged: its evidence is captured before anything is
    /// stopped (issue 35). Read-only: a resume starts from the beginning.
    Capturing,
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
    const ALL: [CoRestartStep; 10] = [
        Self::Started,
        Self::Capturing,
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
            Self::Capturing => "capturing",
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
    let mut run = CoRestart {
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
        capture_why: None,
        routers_at_verification: None,
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
    // A pair judged wedged keeps its evidence before anything is stopped
    // (issue 35): a recovery's trigger, or the operator's restart of a pair
    // the watch judged wedged (its opening entry). Not again on a resume:
    // the capture was the first thing done, and is read-only.
    let capture_why = match (kind, resume_note.is_some()) {
        (OperationKind::CoRestart, false) if run.pair.watch.evidence_deadline_ms > 0 => {
            capture_reason(&rec.journal, &operation_id, recovery)
        }
        _ => None,
    };
    // A verification the operator asked to pin its greedy answer as the
    // reference (`verify NAME --record-reference`, journaled).
    let pin = matches!(kind, OperationKind::Verify { .. }) && output::pin_requested(&rec.journal, &operation_id);
    let stages = Stages {
        kind,
        recovery,
        serving_router: run.pair.serving_router.is_some(),
        xpyd: run.pair.prefill.len() > 1 || run.pair.decode.len() > 1,
        abort_storm: match kind {
            OperationKind::CoRestart => run.pair.suite.abort_storm.after_restart,
            OperationKind::Verify { include_abort_storm } => include_abort_storm,
        },
        capture: capture_why.is_some(),
    };
    run.capture_why = capture_why;
    // The stages' effects, carried out one at a time (the runtime awaits
    // each before the next: the lock is never contended).
    let shared = tokio::sync::Mutex::new(run);
    let (kept_ref, before) = (&kept, &counters_before);
    let end = crate::ops::machine::run(&stages, &rec, stages.start(from), |effect| {
        let shared = &shared;
        let routers_before = &routers_before;
        async move {
            let mut run = shared.lock().await;
            run.carry(effect, kind, pin, kept_ref, before.as_ref(), routers_before.as_ref())
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
    let mut verdict = conclude(&evidence, &policy);
    // A failed verification of an xPyD pair says which engine (issue 37):
    // every prefill → decode path probed, the failures localised.
    let mut diagnoses = Vec::new();
    if matches!(kind, OperationKind::Verify { .. })
        && !verdict.kind.is_healthy()
        && crate::ops::diagnose::worth_it(&run.pair)
        && let Ok(d) = crate::ops::diagnose::diagnose(&*run.ctx.agents, &run.pair, &[], None).await
    {
        // A path that answered, but not what the weights compute (issue 34).
        let checks: Vec<(String, String, bool)> = evidence
            .paths
            .iter()
            .map(|c| (c.prefill.clone(), c.decode.clone(), c.is_wrong_output()))
            .collect();
        let d = d.with_output_checks(&checks);
        rec.journal_entry(rec.now_ms(), crate::ops::diagnose::ENTRY, &d);
        verdict.reasons.push(d.summary());
        diagnoses.push(d);
    }
    let suite_steps = std::mem::take(&mut evidence.suite);
    let router_counters = std::mem::take(&mut evidence.routers);
    let golden_paths = std::mem::take(&mut evidence.paths);
    let golden = so_far
        .golden
        .take()
        .map(|g| output::kept(g, verdict.kind.is_healthy(), &operation_id));
    let mut reasons = verdict.reasons;
    if pin {
        reasons.push(output::pin_line(
            golden.as_ref(),
            &operation_id,
            verdict.kind.is_healthy(),
        ));
    }
    let evidence = std::mem::take(&mut *rec.lock());
    let mut report = OperationReport {
        operation_id: operation_id.clone(),
        pair: run.pair.name.clone(),
        kind: kind.as_str().into(),
        decode_start_policy: run.pair.decode_start_policy.as_str().into(),
        verdict: verdict.kind,
        reasons,
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
        golden,
        golden_paths,
        evidence: so_far.capture.take(),
        diagnoses,
        first_answer_not_cold: match kind {
            OperationKind::CoRestart => run.first_answer_not_cold(),
            OperationKind::Verify { .. } => None,
        },
        total_ms: rec.now_ms(),
    };
    if let Some(why) = report.first_answer_not_cold.clone() {
        report.reasons.push(why);
    }
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

/// Why a co-restart captures its pair's evidence first, if it does: an
/// automatic recovery (its trigger's reasons), or an operator's restart of
/// a pair the watch judged wedged (the opening entry the server journals).
fn capture_reason(journal: &crate::ops::journal::Journal, operation_id: &str, recovery: bool) -> Option<String> {
    if recovery {
        let trigger = journal
            .read::<serde_json::Value>(operation_id, "trigger")
            .ok()?
            .into_iter()
            .next()?;
        let reasons: Vec<&str> = trigger["reasons"]
            .as_array()
            .map(|r| r.iter().filter_map(|x| x.as_str()).collect())
            .unwrap_or_default();
        return Some(format!("automatic recovery of a wedged pair: {}", reasons.join("; ")));
    }
    let opening = journal
        .read::<serde_json::Value>(operation_id, crate::ops::forensics::OPENING)
        .ok()?
        .into_iter()
        .next()?;
    Some(
        opening["why"]
            .as_str()
            .unwrap_or("the watch judged the pair wedged")
            .to_string(),
    )
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
    /// Why the pair's evidence is captured first (issue 35), if it is.
    capture_why: Option<String>,
    /// The routers' counters when pdwarden's verification of a restarted
    /// pair began (issue 47): the window its router evidence counts from.
    routers_at_verification: Option<BTreeMap<String, RouterScrape>>,
}

impl CoRestart<'_> {
    /// Why this restart's first answer is no cold start (issue 47): a
    /// router it restarted took others' requests (clients') before
    /// pdwarden's verification began, so they, not pdwarden's probe, met
    /// the fresh engines first. `None`: nothing shows another request.
    fn first_answer_not_cold(&self) -> Option<String> {
        let at = self.routers_at_verification.as_ref()?;
        self.pair.router.iter().find_map(|u| {
            let requests = at.get(&u.unit)?.traffic?.requests;
            let own: u32 = self
                .starts
                .iter()
                .filter(|s| s.unit == *u)
                .map(|s| s.generation_attempts.iter().map(|a| a.count.max(1)).sum::<u32>())
                .sum();
            (requests > f64::from(own)).then(|| {
                format!(
                    "router {} took {requests} requests before pdwarden's verification began, {own} of them pdwarden's: others' requests met the fresh engines first, so the first answer is not a cold-start measurement (left out of the cold-start history)",
                    u.unit
                )
            })
        })
    }

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

    /// Carries out one effect of the stages (`stages::Stages`) and says
    /// what it found. `kept`: units a resume found generating; `before`:
    /// the counters a verification read before its requests.
    async fn carry(
        &mut self,
        effect: StageEffect,
        kind: OperationKind,
        pin: bool,
        kept: &[UnitStartup],
        before: Option<&BTreeMap<String, EngineCounterRecord>>,
        routers_before: Option<&BTreeMap<String, RouterScrape>>,
    ) -> Option<StageEvent> {
        let rec = self.rec;
        Some(match effect {
            StageEffect::Capture => {
                let deadline = Duration::from_millis(self.pair.watch.evidence_deadline_ms);
                let why = self
                    .capture_why
                    .clone()
                    .unwrap_or_else(|| "the pair was judged wedged".into());
                let capture = crate::ops::forensics::capture(&*self.ctx.agents, &self.pair, why, deadline).await;
                for line in &capture.readings {
                    tracing::warn!(pair = %self.pair.name, reading = %line.line, "before the restart");
                }
                let summary = crate::ops::forensics::keep(
                    &rec.journal,
                    &self.pair.name,
                    &rec.operation_id,
                    rec.now_ms(),
                    &capture,
                );
                StageEvent::Captured(Box::new(summary))
            }
            StageEffect::Drain { wait } => {
                let record = match self.pair.serving_router.clone() {
                    // `drain_timeout_ms = 0`: no wait (a repair's sick engines).
                    Some(sr) => {
                        let wait = wait && sr.drain_timeout_ms > 0;
                        crate::ops::drain::drain(&*self.ctx.agents, rec, &self.pair, &sr, wait).await
                    }
                    None => pdwarden_model::report::DrainRecord {
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
            StageEffect::CheckOutput => match self.check_output(kind, pin).await {
                Some((record, paths)) => StageEvent::OutputChecked(Some(Box::new(record)), paths),
                None => StageEvent::OutputChecked(None, Vec::new()),
            },
            StageEffect::RunSuite { abort_storm } => StageEvent::SuiteRan(
                self.verification_suite(abort_storm)
                    .await
                    .map_err(|e| stages::JournalFailed(e.to_string())),
            ),
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
                    // pdwarden's own requests through each router while it
                    // came up: its readiness generation checks.
                    let starting_own: BTreeMap<String, u32> = self
                        .starts
                        .iter()
                        .filter(|s| self.pair.router.contains(&s.unit))
                        .map(|s| {
                            (
                                s.unit.unit.clone(),
                                s.generation_attempts.iter().map(|a| a.count.max(1)).sum(),
                            )
                        })
                        .collect();
                    routers = router_evidence(
                        &self.pair,
                        routers_before,
                        self.routers_at_verification.as_ref(),
                        &starting_own,
                        &routers_after,
                    );
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
                    None => pdwarden_model::report::RejoinRecord::default(),
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

    /// Runs a co-restart begun as `id` to its report.
    async fn run_co_restart(ctx: &OperationContext, id: String) -> OperationReport {
        let (tx, _rx) = mpsc::unbounded_channel();
        run_operation(
            ctx.clone(),
            pair("after-prefill-ready"),
            id,
            OperationKind::CoRestart,
            tx,
        )
        .await
    }

    /// Issue 35: an automatic recovery captures every unit of the pair
    /// before it starts (stops) anything, journals the whole capture with
    /// the operation and says in its report where each unit waited.
    /// Issue 49: a pair none of whose units runs (the demo's first
    /// restart: never started) has nothing to capture: the capture asks no
    /// agent, is not PARTIAL, journals nothing, and says so in one line;
    /// the restart goes on.
    #[tokio::test(start_paused = true)]
    async fn a_pair_that_never_ran_has_nothing_to_capture() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        let ctx = orchestrator(&journal, &agent).await;
        for unit in UNITS {
            agent.never_started(unit);
        }
        // Until the orchestrator has the agent's word for every unit.
        for _ in 0..1_000 {
            let stopped = |u: &str| {
                ctx.agents
                    .unit("h1", u)
                    .is_some_and(|i| i.phase == pdwarden_proto::v1::Phase::Stopped as i32)
            };
            if UNITS.iter().all(|u| stopped(u)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let id = begin_recovery(&journal);
        let report = run_co_restart(&ctx, id.clone()).await;
        assert!(report.verdict.is_healthy(), "{:?}", report.reasons);
        assert!(agent.captures().is_empty(), "no agent is asked");
        let e = report.evidence.clone().expect("the report says what it captured");
        assert!(!e.partial && e.missing.is_empty(), "{e:?}");
        let kept: Vec<serde_json::Value> = journal.read(&id, "evidence").unwrap();
        assert!(kept.is_empty(), "nothing journaled: {kept:?}");
        let text = pdwarden_model::report::render_summary(&report);
        let lines: Vec<&str> = text.lines().filter(|l| l.contains("evidence")).collect();
        assert_eq!(lines.len(), 1, "{text}");
        assert!(
            lines[0].contains("nothing captured before the restart")
                && lines[0].contains("prefill prefill-0, decode decode-0, router router-0: never started"),
            "{text}"
        );
    }

    /// Issue 48: a capture from an agent older than redaction by shape
    /// carries secrets in its log tail, documents and argv; none reaches
    /// the journal, and what was around them stays.
    #[tokio::test(start_paused = true)]
    async fn an_older_agents_secrets_are_redacted_on_arrival() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        agent.unredacted_captures();
        let ctx = orchestrator(&journal, &agent).await;
        let id = begin_recovery(&journal);
        let report = run_co_restart(&ctx, id.clone()).await;
        assert!(report.verdict.is_healthy(), "{:?}", report.reasons);
        let kept: Vec<serde_json::Value> = journal.read(&id, "evidence").unwrap();
        let text = kept[0].to_string();
        for secret in [
            "sk-live-0123456789abcdef",
            "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345",
            "json-secret-value-42",
            "bearer-secret",
            "PgPass99",
            "S3cretKvPass",
        ] {
            assert!(!text.contains(secret), "{secret} reached the journal: {text}");
        }
        assert!(
            text.contains("decode-0: last words") && text.contains("db.internal:5432"),
            "{text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_recovery_keeps_the_evidence_before_it_stops_anything() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        let ctx = orchestrator(&journal, &agent).await;
        let id = begin_recovery(&journal);
        let report = run_co_restart(&ctx, id.clone()).await;
        assert!(report.verdict.is_healthy(), "{:?}", report.reasons);
        let captures = agent.captures();
        assert_eq!(captures.len(), 1, "one command for the pair's one host");
        assert_eq!(captures[0].0, UNITS.to_vec());
        assert_eq!(captures[0].1, 0, "captured before any start was executed");
        for unit in UNITS {
            assert_eq!(agent.starts_of(unit), 1, "{unit} was restarted after the capture");
        }
        let e = report
            .evidence
            .clone()
            .expect("the report carries the capture's summary");
        assert!(!e.partial, "{:?}", e.missing);
        assert_eq!(e.readings.len(), UNITS.len());
        assert!(
            e.readings
                .iter()
                .all(|r| r.line.contains("every thread stopped") && r.line.contains("_process_input_queue")),
            "{:?}",
            e.readings
        );
        let kept: Vec<pdwarden_model::forensics::Capture> = journal.read(&id, "evidence").unwrap();
        assert_eq!(kept.len(), 1);
        assert!(kept[0].why.starts_with("automatic recovery"), "{}", kept[0].why);
        assert_eq!(kept[0].units[1].log_tail, "decode-0: last words");
        let text = pdwarden_model::report::render_summary(&report);
        assert!(text.contains(&format!("pdwarden history p --evidence {id}")), "{text}");
        // The state machine journaled the stage before the restart's.
        let states: Vec<String> = journal
            .entries(&id)
            .unwrap()
            .into_iter()
            .filter(|(_, k, _)| k == "transition")
            .filter_map(|(_, _, p)| p["state"].as_str().map(str::to_string))
            .collect();
        assert_eq!(states.first().map(String::as_str), Some("capturing"), "{states:?}");
    }

    /// Issue 35: an agent that does not answer by the deadline leaves the
    /// capture partial, said, and the recovery goes on at the deadline.
    #[tokio::test(start_paused = true)]
    async fn a_capture_past_its_deadline_is_partial_and_the_recovery_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        agent.capture_takes(Duration::from_secs(60));
        let ctx = orchestrator(&journal, &agent).await;
        let id = begin_recovery(&journal);
        let report = run_co_restart(&ctx, id.clone()).await;
        assert!(report.verdict.is_healthy(), "{:?}", report.reasons);
        let e = report.evidence.expect("a partial capture is still reported");
        assert!(e.partial);
        assert_eq!(e.took_ms, 5_000, "bounded by the default deadline");
        assert!(
            e.missing
                .iter()
                .any(|m| m.contains("no answer from agent") && m.contains("5000 ms deadline")),
            "{:?}",
            e.missing
        );
        assert!(
            e.readings
                .iter()
                .all(|r| r.wait == pdwarden_model::forensics::Wait::NothingCaptured)
        );
        for unit in UNITS {
            assert_eq!(agent.starts_of(unit), 1, "{unit} restarted all the same");
        }
    }

    /// An operator's restart captures only when the watch judged the pair
    /// wedged (the server journals the opening entry then).
    #[tokio::test(start_paused = true)]
    async fn an_operator_restart_captures_only_a_pair_judged_wedged() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        let ctx = orchestrator(&journal, &agent).await;
        let report = run_co_restart(&ctx, begin(&journal)).await;
        assert!(report.evidence.is_none());
        assert!(agent.captures().is_empty());
        let id = begin(&journal);
        let why = "the operator restarted a pair the watch judged wedged: decode-0 silent";
        journal
            .append(
                &id,
                0,
                crate::ops::forensics::OPENING,
                &serde_json::json!({ "why": why }),
            )
            .unwrap();
        let report = run_co_restart(&ctx, id).await;
        assert_eq!(report.evidence.expect("captured").why, why);
        assert_eq!(agent.captures().len(), 1);
    }

    /// Issue 34: the first healthy co-restart records its greedy answer as
    /// the reference; the next is held to it (the same tokens: healthy);
    /// the engines' weights replaced under the same config (same argv, same
    /// fingerprint) answer fast, HTTP 200 and wrong: `failed`, naming the
    /// position, both continuations and the margin; restored: healthy.
    #[tokio::test(start_paused = true)]
    async fn wrong_output_after_a_restart_fails_the_pair_naming_it() {
        use pdwarden_model::judge::golden::OutputCheck;
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        let ctx = orchestrator(&journal, &agent).await;
        let run = || async { spawn_co_restart(ctx.clone(), &journal).await.unwrap() };
        let first = run().await;
        assert!(first.verdict.is_healthy(), "{:?}", first.reasons);
        let golden = first.golden.clone().expect("an output check");
        assert_eq!(golden.check, OutputCheck::NoReference { tokens: 32 });
        let reference = golden.reference.expect("recorded as the reference");
        assert_eq!(reference.operation_id, first.operation_id);
        assert_eq!(reference.answer.tokens.len(), 32);
        assert!(
            first.reasons.iter().any(|r| r.contains("kept as the reference")),
            "{:?}",
            first.reasons
        );

        let second = run().await;
        assert!(second.verdict.is_healthy(), "{:?}", second.reasons);
        assert_eq!(
            second.golden.as_ref().map(|g| &g.check),
            Some(&OutputCheck::Same {
                tokens: 32,
                reference_operation: first.operation_id.clone()
            })
        );

        agent.set_weights("w2");
        let wrong = run().await;
        assert_eq!(wrong.verdict, VerdictKind::Failed, "{:?}", wrong.reasons);
        assert!(
            wrong.reasons[0].starts_with("WRONG OUTPUT") && wrong.reasons[0].contains("at token 0"),
            "{:?}",
            wrong.reasons
        );
        let Some(OutputCheck::Diverged {
            position,
            margin,
            at_least,
            ref reference,
            ref answer,
            ..
        }) = wrong.golden.as_ref().map(|g| g.check.clone())
        else {
            panic!("{:?}", wrong.golden)
        };
        assert_eq!((position, at_least), (0, true));
        assert!((margin.unwrap() - 3.0).abs() < 1e-9, "{margin:?}");
        assert!(
            reference.starts_with(" the sky") && answer.starts_with(" sea calm"),
            "{reference:?} {answer:?}"
        );
        // Nothing was recorded from it.
        assert!(wrong.golden.as_ref().unwrap().reference.as_ref().unwrap().operation_id == first.operation_id);

        agent.set_weights("");
        let restored = run().await;
        assert!(restored.verdict.is_healthy(), "{:?}", restored.reasons);
        assert!(matches!(
            restored.golden.map(|g| g.check),
            Some(OutputCheck::Same { .. })
        ));
        // One greedy request: a 1P1D pair has no other path to check.
        assert!(restored.golden_paths.is_empty());
    }

    /// A 2P2D pair of the rig's host: prefill-0/1, decode-0/1, router-0.
    fn xpyd_pair() -> PairConfig {
        let text = r#"
listen = "127.0.0.1:7070"
journal = "/unused"
[[pair]]
name = "p"
prefill = [{ host = "h1", unit = "prefill-0" }, { host = "h1", unit = "prefill-1" }]
decode = [{ host = "h1", unit = "decode-0" }, { host = "h1", unit = "decode-1" }]
router = [{ host = "h1", unit = "router-0" }]
[pair.probe]
model = "m"
prompt = "Say hi"
warm_budget_ms = 1000
cold_allowance_ms = 3000
probe_timeout_ms = 5000
[pair.suite.long_generation]
enabled = false
[pair.suite.multi_turn]
enabled = false
[pair.suite.concurrency]
enabled = false
"#;
        crate::config::OrchestratorConfig::from_toml_str(text)
            .unwrap()
            .pairs
            .remove(0)
    }

    fn xpyd_agent() -> crate::ops::fake_agent::FakeAgent {
        use crate::ops::fake_agent::{FakeAgent, UnitModel};
        use pdwarden_proto::v1::Role;
        FakeAgent::new(
            "h1",
            vec![
                UnitModel::new("prefill-0", Role::Prefill),
                UnitModel::new("prefill-1", Role::Prefill),
                UnitModel::new("decode-0", Role::Decode),
                UnitModel::new("decode-1", Role::Decode),
                UnitModel::new("router-0", Role::Router),
            ],
        )
    }

    /// A verification of pair `p` as `pdwarden verify p` begins one;
    /// `pin`: with `--record-reference` (its opening entry).
    fn begin_verify(journal: &Journal, pin: bool) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        journal.begin(&id, "verify", "p", None).unwrap();
        if pin {
            journal
                .append(&id, 0, RECORD_REFERENCE, &serde_json::json!(true))
                .unwrap();
        }
        id
    }

    async fn run_kind(ctx: &OperationContext, pair: PairConfig, id: String, kind: OperationKind) -> OperationReport {
        let (tx, _rx) = mpsc::unbounded_channel();
        tokio::spawn(run_operation(ctx.clone(), pair, id, kind, tx))
            .await
            .unwrap()
    }

    const VERIFY: OperationKind = OperationKind::Verify {
        include_abort_storm: false,
    };

    /// Issue 47: a greedy request (32 tokens with logprobs) on a starved
    /// host, slower than the 8-token probe's timeout: its deadline is its
    /// own (scaled to its tokens), so it answers and the pair is healthy (it
    /// was `failed`, "wrong output"). One that never answers is a timeout,
    /// judged as a probe's timeout after answering (a stall: wedged), never
    /// wrong output.
    #[tokio::test(start_paused = true)]
    async fn a_starved_greedy_request_is_a_timeout_never_wrong_output() {
        let dir = tempfile::tempdir().unwrap();
        let journal = crate::ops::fake_agent::rig::journal(&dir);
        let agent = xpyd_agent();
        let ctx = crate::ops::fake_agent::rig::orchestrator(&journal, &agent).await;
        let first = run_kind(&ctx, xpyd_pair(), begin(&journal), OperationKind::CoRestart).await;
        assert!(first.verdict.is_healthy(), "{:?}", first.reasons);
        let pair = xpyd_pair();
        assert_eq!(
            output::greedy_deadline_ms(&pair, None, output::GREEDY_TOKENS),
            5_000 * 32 / u64::from(pair.probe.max_tokens),
            "the probe timeout scaled to 32 tokens"
        );
        agent.slow_greedy(8_000);
        let slow = run_kind(&ctx, xpyd_pair(), begin_verify(&journal, false), VERIFY).await;
        assert!(slow.verdict.is_healthy(), "{:?}", slow.reasons);
        agent.slow_greedy(3_600_000);
        let stuck = run_kind(&ctx, xpyd_pair(), begin_verify(&journal, false), VERIFY).await;
        assert_eq!(stuck.verdict, VerdictKind::Wedged, "{:?}", stuck.reasons);
        let text = stuck.reasons.join("\n");
        assert!(text.contains("a timeout"), "{text}");
        assert!(!text.contains("WRONG OUTPUT"), "{text}");
        // Slower than its own deadline, while the engines progress (their
        // realtime tokens rise): waited for, healthy — the real vLLM CPU
        // pair's first greedy request on a starved host took longer than
        // its 15 s deadline and a healthy pair was called stalled.
        agent.engines_progress(true);
        agent.slow_greedy(3 * output::greedy_deadline_ms(&pair, None, output::GREEDY_TOKENS));
        let slow = run_kind(&ctx, xpyd_pair(), begin_verify(&journal, false), VERIFY).await;
        assert!(slow.verdict.is_healthy(), "{:?}", slow.reasons);
        // The engines stopped: each of the five greedy requests (the
        // router's, then one along each of the four KV paths) is proven
        // stuck within one and a half stall budgets, not at the long
        // generation's timeout (120 s each).
        agent.engines_progress(false);
        agent.slow_greedy(3_600_000);
        let t0 = tokio::time::Instant::now();
        let stuck = run_kind(&ctx, xpyd_pair(), begin_verify(&journal, false), VERIFY).await;
        assert_eq!(stuck.verdict, VerdictKind::Wedged, "{:?}", stuck.reasons);
        let text = stuck.reasons.join("\n");
        assert!(text.contains("no engine of the pair progressed for"), "{text}");
        let budget = Duration::from_millis(pair.watch.stall_budget_ms);
        assert!(t0.elapsed() < 5 * (budget + budget / 2), "{:?}", t0.elapsed());
        assert!(text.contains("no CPU reading from its agent"), "{text}");
        // Found in CI: counters flat while the engines' processes keep a CPU
        // busy (the real vLLM CPU engine compiles a sampler kernel at its
        // first logprobs request, 10 s and more): working, waited for.
        agent.engines_cpu(Some(1.0));
        agent.slow_greedy(3 * output::greedy_deadline_ms(&pair, None, output::GREEDY_TOKENS));
        let compiling = run_kind(&ctx, xpyd_pair(), begin_verify(&journal, false), VERIFY).await;
        assert!(compiling.verdict.is_healthy(), "{:?}", compiling.reasons);
        // Counters flat and the processes idle: stuck, the proof names the CPU.
        agent.engines_cpu(Some(0.01));
        agent.slow_greedy(3_600_000);
        let stuck = run_kind(&ctx, xpyd_pair(), begin_verify(&journal, false), VERIFY).await;
        assert_eq!(stuck.verdict, VerdictKind::Wedged, "{:?}", stuck.reasons);
        let text = stuck.reasons.join("\n");
        assert!(text.contains("its processes used 0.01 of a CPU"), "{text}");
    }

    /// Issue 34, item 3: in a 2P2D pair the greedy request also goes
    /// straight along each of the four prefill → decode paths. All agree:
    /// healthy, said in one line, the router's answer recorded. decode-1
    /// then computes other tokens while the router's policy keeps sending
    /// the request elsewhere (its answer still the reference's): each path
    /// into decode-1 is wrong output naming its engines, decode-1 is named
    /// the suspect, `failed` after a suite that passed, nothing recorded —
    /// and a pin asked
    /// for by the operator does not bless it.
    #[tokio::test(start_paused = true)]
    async fn every_path_of_an_xpyd_pair_is_held_to_the_reference() {
        use pdwarden_model::judge::golden::{HeldTo, OutputCheck};
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = xpyd_agent();
        let ctx = orchestrator(&journal, &agent).await;
        let first = run_kind(&ctx, xpyd_pair(), begin(&journal), OperationKind::CoRestart).await;
        assert!(first.verdict.is_healthy(), "{:?}", first.reasons);
        assert_eq!(first.golden_paths.len(), 4, "one greedy request per path: P×D");
        assert!(
            first
                .golden_paths
                .iter()
                .all(|p| matches!(p.check, OutputCheck::Same { tokens: 32, .. })
                    && matches!(p.held_to, HeldTo::Majority { .. })),
            "{:?}",
            first.golden_paths
        );
        assert!(
            first.reasons.iter().any(|r| r
                .starts_with("output: every prefill → decode path (4 paths, one greedy request sent straight along each) answered as each other")),
            "{:?}",
            first.reasons
        );
        let reference = first.golden.as_ref().unwrap().reference.clone().expect("recorded");
        assert_eq!(reference.operation_id, first.operation_id);

        let healthy = run_kind(&ctx, xpyd_pair(), begin_verify(&journal, false), VERIFY).await;
        assert!(healthy.verdict.is_healthy(), "{:?}", healthy.reasons);
        assert!(healthy.golden_paths.iter().all(|p| p.held_to == HeldTo::Reference));

        agent.set_decode_weights("http://fake/decode-1", "w2");
        let wrong = run_kind(&ctx, xpyd_pair(), begin(&journal), OperationKind::CoRestart).await;
        assert_eq!(wrong.verdict, VerdictKind::Failed, "{:?}", wrong.reasons);
        assert!(
            matches!(wrong.golden.as_ref().map(|g| &g.check), Some(OutputCheck::Same { .. })),
            "the router's answer was right: {:?}",
            wrong.golden
        );
        let bad: Vec<String> = wrong
            .golden_paths
            .iter()
            .filter(|p| p.is_wrong_output())
            .map(|p| p.name())
            .collect();
        assert_eq!(bad, ["h1/prefill-0 → h1/decode-1", "h1/prefill-1 → h1/decode-1"]);
        assert!(
            wrong.reasons[0].starts_with("WRONG OUTPUT: h1/prefill-0 → h1/decode-1 answered \" sea calm")
                && wrong.reasons[0].contains(&format!(
                    "where the reference (operation {}) goes on \" the sky",
                    first.operation_id
                )),
            "{:?}",
            wrong.reasons
        );
        assert!(
            wrong.reasons[2].starts_with(
                "WRONG OUTPUT on every path into decode h1/decode-1 (h1/prefill-0 → h1/decode-1, h1/prefill-1 → h1/decode-1)"
            ),
            "{:?}",
            wrong.reasons
        );
        assert_eq!(
            wrong.golden.as_ref().unwrap().reference.as_ref().unwrap().operation_id,
            first.operation_id,
            "nothing recorded from a failed operation"
        );

        let pin = run_kind(&ctx, xpyd_pair(), begin_verify(&journal, true), VERIFY).await;
        assert_eq!(pin.verdict, VerdictKind::Failed, "{:?}", pin.reasons);
        assert!(
            pin.golden_paths
                .iter()
                .all(|p| p.held_to == HeldTo::Pinned && p.is_wrong_output() == (p.decode == "h1/decode-1")),
            "{:?}",
            pin.golden_paths
        );
        assert_eq!(
            pin.reasons.last().unwrap(),
            &format!(
                "--record-reference: nothing recorded: the verification is not healthy (the reference stays operation {}'s)",
                first.operation_id
            )
        );
        assert!(pin.golden.unwrap().reference.is_some_and(|r| !r.pinned));
    }

    /// Issue 34, task B: the operator pins a reference. The weights changed
    /// (a new checkpoint meant): a verification fails on it; `verify
    /// --record-reference` is held to nothing, says the difference it
    /// replaces, and records its answer pinned; the next co-restart on the
    /// new weights is held to it and healthy. A pin asked of a pair that is
    /// not healthy records nothing and says so.
    #[tokio::test(start_paused = true)]
    async fn the_operator_pins_the_reference_after_a_weights_change() {
        use pdwarden_model::judge::golden::OutputCheck;
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        let ctx = orchestrator(&journal, &agent).await;
        let first = run_kind(
            &ctx,
            pair("after-prefill-ready"),
            begin(&journal),
            OperationKind::CoRestart,
        )
        .await;
        assert!(first.verdict.is_healthy(), "{:?}", first.reasons);

        agent.set_weights("w2");
        let wrong = run_kind(&ctx, pair("after-prefill-ready"), begin_verify(&journal, false), VERIFY).await;
        assert_eq!(wrong.verdict, VerdictKind::Failed, "{:?}", wrong.reasons);

        let pin_id = begin_verify(&journal, true);
        let pinned = run_kind(&ctx, pair("after-prefill-ready"), pin_id.clone(), VERIFY).await;
        assert!(pinned.verdict.is_healthy(), "{:?}", pinned.reasons);
        let golden = pinned.golden.clone().unwrap();
        let OutputCheck::Pinned {
            tokens: 32,
            replaced: Some(replaced),
        } = &golden.check
        else {
            panic!("{golden:?}")
        };
        assert!(
            matches!(replaced.as_ref(), OutputCheck::Diverged { position: 0, reference_operation, .. } if *reference_operation == first.operation_id),
            "{replaced:?}"
        );
        let reference = golden.reference.clone().unwrap();
        assert!(reference.pinned && reference.operation_id == pin_id, "{reference:?}");
        assert!(
            pinned
                .reasons
                .iter()
                .any(|r| r.contains("differs from the reference it replaces")),
            "{:?}",
            pinned.reasons
        );
        assert!(
            pinned
                .reasons
                .last()
                .unwrap()
                .starts_with("reference pinned (--record-reference): this verification's greedy answer (32 tokens)"),
            "{:?}",
            pinned.reasons
        );
        assert!(
            golden
                .recorded_line(&pin_id)
                .unwrap()
                .starts_with("reference pinned by the operator")
        );

        let next = run_kind(
            &ctx,
            pair("after-prefill-ready"),
            begin(&journal),
            OperationKind::CoRestart,
        )
        .await;
        assert!(next.verdict.is_healthy(), "{:?}", next.reasons);
        assert_eq!(
            next.golden.map(|g| g.check),
            Some(OutputCheck::Same {
                tokens: 32,
                reference_operation: pin_id.clone()
            })
        );

        // Not healthy (the router gone): nothing recorded, said so; the
        // pinned reference stays.
        agent.crash("router-0", "killed");
        let refused = run_kind(&ctx, pair("after-prefill-ready"), begin_verify(&journal, true), VERIFY).await;
        assert!(!refused.verdict.is_healthy(), "{:?}", refused.reasons);
        assert!(
            refused
                .reasons
                .last()
                .unwrap()
                .starts_with("--record-reference: nothing recorded: the verification is not healthy"),
            "{:?}",
            refused.reasons
        );
        assert!(
            refused
                .golden
                .is_none_or(|g| g.reference.is_none_or(|r| r.operation_id == pin_id))
        );
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
        use crate::ops::fake_agent::rig::{fail_from_every_write, fail_writes_from};
        struct Run {
            report: OperationReport,
            agent: crate::ops::fake_agent::FakeAgent,
            commands: Vec<CommandEntry>,
        }
        for policy in ["after-prefill-ready", "overlap"] {
            fail_from_every_write(
                async |fail_from| {
                    let dir = tempfile::tempdir().unwrap();
                    let journal = journal(&dir);
                    let agent = agent();
                    let ctx = orchestrator(&journal, &agent).await;
                    let id = begin(&journal);
                    // The journal counts writes from its first (the begin):
                    // the operation's own writes are those after.
                    let before = fail_writes_from(&journal, fail_from);
                    let (tx, _rx) = mpsc::unbounded_channel();
                    let report = run_operation(ctx, pair(policy), id.clone(), OperationKind::CoRestart, tx).await;
                    let writes = journal.writes_seen() - before;
                    let commands = journal.commands(&id).unwrap();
                    (
                        Run {
                            report,
                            agent,
                            commands,
                        },
                        writes,
                    )
                },
                |healthy, total| {
                    assert!(healthy.report.verdict.is_healthy(), "{:?}", healthy.report.reasons);
                    assert!(total > 10, "{total} writes");
                },
                async |n, total, r| {
                    let mut broken = Vec::new();
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
                    broken
                },
            )
            .await;
        }
    }
}
