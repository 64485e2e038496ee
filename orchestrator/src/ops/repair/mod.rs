//! Restart only what is sick (issue 37): `pdwarden restart pd-pair NAME
//! --only-sick`, and the automatic recovery of an xPyD pair.
//!
//! Why: in an xPyD pool behind one router, one bad engine fails every path
//! through it, and the pool's other engines keep working. The whole
//! ordered co-restart stops all of them; operators in smg-project/smg#2382
//! instead restarted prefills one by one, by hand, for 10–15 minutes. The
//! path matrix (`ops::diagnose`, `judge::paths`) names the engines that
//! explain every failing path; this restarts those only, then what holds
//! state about them, and proves every path before calling the pair healthy:
//!
//! 1. every prefill → decode path probed; the failures localised;
//! 2. the named engines — and only they — restart as one child co-restart
//!    on `PAIR#repair`: out of the pair's router (not waiting for a sick
//!    engine's work), prefills before decodes, each gated on generation,
//!    their paths to every other engine probed before they go back;
//! 3. every path probed again, told which prefills restarted and which
//!    decodes paired with them before (restart epochs: such a decode holds
//!    the old bootstrap identity, INCIDENTS row 1); what still fails is
//!    named and restarted in the next round, at most `MAX_ROUNDS`;
//! 4. every path answers: the engines are put back into the router, and
//!    the whole pair is verified through it.
//!
//! When the matrix does not single anything out (every path fails, two
//! engines on a side too small to tell them apart, an engine failing again
//! after its own restart), the whole pair's ordered co-restart runs
//! instead, and the report says why. The state machine is `machine`; each
//! child is its own journaled operation, as a rolling restart's are.
//! An orchestrator killed mid-repair resumes it from its last journaled
//! state: the child in flight is resumed from the journal and the agents'
//! facts (`corestart::resume`: no engine started twice, none left stopped
//! or out of the router), then the repair goes on.

use pdwarden_proto::v1::{OperationStarted, OperationUpdate, operation_update};
use tokio::sync::mpsc;

use crate::config::{PairConfig, ServingRouterConfig};
use crate::ops::OperationContext;
use crate::ops::corestart::OperationKind;
use crate::ops::journal::JournalError;
use crate::ops::machine::Transition;
use crate::ops::recorder::Recorder;
use pdwarden_model::report::OperationReport;

pub mod machine;

use machine::{Child, Repair, RepairEffect, RepairEvent, Repairing, SoFar};

/// The journal's kind of a repair.
pub const KIND: &str = "repair";
/// The pair name a repair's children are journaled under (`PAIR#repair`).
pub const CHILD_SUFFIX: &str = "#repair";
/// How long a round waits for the router to list the engines it keeps as
/// healthy before it takes the named ones out.
pub const SERVING_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
const SERVING_POLL: std::time::Duration = std::time::Duration::from_millis(250);
/// The entry naming each child before it runs.
const CHILD_OPERATION: &str = "child_operation";

/// Why a pair cannot be repaired engine by engine (refused before anything
/// is journaled).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotRepairable {
    #[error("--only-sick: pair {pair} has no router to keep serving while its sick engines restart")]
    NoRouter { pair: String },
    #[error(
        "--only-sick: pair {pair} is behind a serving router ([pair.serving_router]); restarting single engines takes them out of the pair's own router only: restart it whole"
    )]
    BehindServingRouter { pair: String },
    #[error(
        "--only-sick: pair {pair} has one prefill and one decode: every path is the pair; restart it without --only-sick"
    )]
    OnePath { pair: String },
}

/// Whether `pair` can be repaired engine by engine.
pub fn check(pair: &PairConfig) -> Result<(), NotRepairable> {
    let name = pair.name.clone();
    if pair.router.is_empty() {
        return Err(NotRepairable::NoRouter { pair: name });
    }
    if pair.serving_router.is_some() {
        return Err(NotRepairable::BehindServingRouter { pair: name });
    }
    if pair.prefill.len() + pair.decode.len() <= 2 {
        return Err(NotRepairable::OnePath { pair: name });
    }
    Ok(())
}

/// The engines `units` ("host/unit") of `pair` as a pair of their own: no
/// router, the pair's first router as the serving router they leave and
/// rejoin — without waiting for their work (a sick engine's does not end).
pub fn sick_part(pair: &PairConfig, units: &[String]) -> PairConfig {
    let mut part = pair.clone();
    part.name = format!("{}{CHILD_SUFFIX}", pair.name);
    part.prefill.retain(|u| units.contains(&u.to_string()));
    part.decode.retain(|u| units.contains(&u.to_string()));
    part.router = Vec::new();
    // One side only: its paths are proven with a healthy engine of the
    // other side (the first the part does not hold).
    part.probe_partner = match (part.prefill.is_empty(), part.decode.is_empty()) {
        (true, false) => pair.prefill.first().cloned(),
        (false, true) => pair.decode.first().cloned(),
        _ => None,
    };
    let router = &pair.router[0];
    let mut sr = ServingRouterConfig::new(router.host.clone(), router.unit.clone());
    sr.drain_timeout_ms = 0;
    part.serving_router = Some(sr);
    part
}

/// A child as the repair journals it before it begins (must-write).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct ChildEntry {
    operation_id: String,
    child: Child,
    kind: String,
}

/// Takes over a repair an earlier orchestrator left running, from its
/// last journaled state (module docs). Nobody follows it live; its report
/// is journaled.
pub async fn resume(
    ctx: OperationContext,
    pair: PairConfig,
    op: pdwarden_model::status::OperationRecord,
) -> OperationReport {
    let (tx, _rx) = mpsc::unbounded_channel();
    let rec = Recorder::new(op.operation_id.clone(), ctx.journal.clone(), tx);
    let note = format!(
        "resumed after an orchestrator restart: the repair was in state {}",
        op.state
    );
    rec.journal("resumed", &serde_json::json!({ "note": note }));
    let recovery = !rec
        .journal
        .read::<serde_json::Value>(&op.operation_id, "trigger")
        .unwrap_or_default()
        .is_empty();
    let repairer = Repairer { ctx, pair, rec };
    let machine = Repairing {
        pair: &repairer.pair,
        recovery,
    };
    let last: Option<Repair> = repairer.rec.journal.last_state(&op.operation_id).ok().flatten();
    let start = match last {
        // Nothing past the opening: the diagnosis reads only.
        None => Repairing::start(),
        Some(state) => repairer.going_on_from(&machine, state).await,
    };
    let last = crate::ops::machine::run(&machine, &repairer.rec, start, |effect| repairer.carry(effect)).await;
    repairer.conclude(last, None, Some(note))
}

/// Concludes `failed` whatever of `pair`'s repair is still running on
/// `PAIR#repair` (its repair concluded without resuming it), saying `why`.
pub fn abandon(journal: &crate::ops::journal::Journal, pair: &PairConfig, why: &str) {
    crate::ops::child::abandon(journal, &format!("{}{CHILD_SUFFIX}", pair.name), why);
}

/// Runs a repair whose journal row exists (`kind` [`KIND`]) to its report.
/// `recovery`: an automatic recovery (a clean matrix does not clear it).
pub async fn run(
    ctx: OperationContext,
    pair: PairConfig,
    operation_id: String,
    recovery: bool,
    updates: mpsc::UnboundedSender<OperationUpdate>,
) -> OperationReport {
    let rec = Recorder::new(operation_id.clone(), ctx.journal.clone(), updates);
    rec.send(operation_update::Kind::Started(OperationStarted {
        operation_id,
        pair: pair.name.clone(),
        decode_start_policy: pair.decode_start_policy.as_str().into(),
    }));
    let repairer = Repairer { ctx, pair, rec };
    let evidence = repairer.capture_if_judged_wedged(recovery).await;
    let machine = Repairing {
        pair: &repairer.pair,
        recovery,
    };
    let last = crate::ops::machine::run(&machine, &repairer.rec, Repairing::start(), |effect| {
        repairer.carry(effect)
    })
    .await;
    repairer.conclude(last, evidence, None)
}

struct Repairer {
    ctx: OperationContext,
    pair: PairConfig,
    rec: Recorder,
}

impl Repairer {
    /// A recovery (its trigger journaled) or an operator's repair of a
    /// pair the watch judged wedged (the opening entry) keeps the whole
    /// pair's evidence first (issue 35), before anything stops.
    async fn capture_if_judged_wedged(&self, recovery: bool) -> Option<pdwarden_model::forensics::CaptureSummary> {
        use crate::ops::forensics;
        let deadline_ms = self.pair.watch.evidence_deadline_ms;
        if deadline_ms == 0 {
            return None;
        }
        let read = |kind: &str| -> Option<serde_json::Value> {
            self.rec
                .journal
                .read::<serde_json::Value>(&self.rec.operation_id, kind)
                .ok()?
                .into_iter()
                .next()
        };
        let why = if recovery {
            let trigger = read("trigger")?;
            let reasons: Vec<&str> = trigger["reasons"]
                .as_array()
                .map(|r| r.iter().filter_map(|x| x.as_str()).collect())
                .unwrap_or_default();
            format!("automatic recovery of a wedged pair: {}", reasons.join("; "))
        } else {
            read(forensics::OPENING)?["why"]
                .as_str()
                .unwrap_or("the watch judged the pair wedged")
                .to_string()
        };
        let deadline = std::time::Duration::from_millis(deadline_ms);
        let capture = forensics::capture(&*self.ctx.agents, &self.pair, why, deadline).await;
        Some(forensics::keep(
            &self.rec.journal,
            &self.pair.name,
            &self.rec.operation_id,
            self.rec.now_ms(),
            &capture,
        ))
    }

    /// Where a resumed repair goes on from its last journaled `state`: the
    /// effect that state asked for again, or — a child in flight — that
    /// child resumed (or its conclusion read back) and the step on it.
    async fn going_on_from(&self, machine: &Repairing<'_>, state: Repair) -> Transition<Repair, RepairEffect> {
        let child = match &state {
            Repair::Diagnosing { so_far, .. } => {
                let epochs = so_far.epochs.clone();
                return Transition::then(state, RepairEffect::Diagnose { epochs });
            }
            Repair::Rejoining { .. } => return Transition::then(state, RepairEffect::Rejoin),
            Repair::Concluded { .. } => return Transition::to(state),
            Repair::Restarting { round, units, .. } => Child::Restart {
                round: *round,
                units: units.clone(),
            },
            Repair::CoRestartingPair { .. } => Child::WholePair,
            Repair::VerifyingPair { .. } => Child::Verify,
        };
        let journal = &self.rec.journal;
        let entry = journal
            .read::<ChildEntry>(&self.rec.operation_id, CHILD_OPERATION)
            .unwrap_or_default()
            .into_iter()
            .last()
            .filter(|e| e.child == child);
        // Never begun (killed between its entry and its start): run it.
        let Some(entry) = entry else {
            return Transition::then(state, RepairEffect::RunChild(child));
        };
        let child_pair = format!("{}{CHILD_SUFFIX}", self.pair.name);
        let in_flight = journal
            .unfinished()
            .unwrap_or_default()
            .into_iter()
            .find(|o| o.operation_id == entry.operation_id);
        let report = match in_flight {
            Some(op) => {
                let task = crate::ops::corestart::resume(self.ctx.clone(), self.config_of(&child), op);
                match crate::ops::guarded(journal, &entry.operation_id, task).await {
                    Ok(r) => Some(r),
                    Err(panic) => std::panic::resume_unwind(Box::new(panic.0)),
                }
            }
            None => journal
                .history(&child_pair, 100)
                .ok()
                .and_then(|h| h.into_iter().find(|o| o.operation_id == entry.operation_id))
                .and_then(|o| o.report)
                .and_then(|r| serde_json::from_value::<OperationReport>(r).ok()),
        };
        match report {
            Some(report) => {
                use crate::ops::machine::Machine;
                machine.step(
                    state,
                    RepairEvent::ChildConcluded {
                        child,
                        report: Box::new(report),
                    },
                    self.rec.now_ms(),
                )
            }
            // Unreadable: run it again (restarting a generating engine is
            // safe; trusting an unknown one is not).
            None => Transition::then(state, RepairEffect::RunChild(child)),
        }
    }

    /// The pair a child runs on.
    fn config_of(&self, child: &Child) -> PairConfig {
        match child {
            Child::Restart { units, .. } => sick_part(&self.pair, units),
            Child::WholePair | Child::Verify => self.pair.clone(),
        }
    }

    async fn carry(&self, effect: RepairEffect) -> Option<RepairEvent> {
        match effect {
            RepairEffect::Diagnose { epochs } => {
                let step = self.rec.step_started("diagnose", &self.pair.name);
                // Every path's greedy answer held to the pair's reference
                // (issue 46: a repair proves output, not only answers).
                let reference = crate::ops::corestart::output::current_reference(&self.ctx.journal, &self.pair);
                let d =
                    crate::ops::diagnose::diagnose(&*self.ctx.agents, &self.pair, &epochs, reference.as_ref()).await;
                match d {
                    Ok(d) => {
                        self.rec.step_ended(step, d.summary());
                        Some(RepairEvent::Diagnosed(Box::new(d)))
                    }
                    Err(e) => {
                        self.rec.step_ended(step, format!("fail: {e}"));
                        Some(RepairEvent::NotDiagnosed(e.to_string()))
                    }
                }
            }
            RepairEffect::RunChild(child) => Some({
                if let Child::Restart { units, .. } = &child {
                    self.await_serving(units).await;
                }
                match self.child(&child).await {
                    Ok(report) => RepairEvent::ChildConcluded {
                        child,
                        report: Box::new(report),
                    },
                    Err(e) => RepairEvent::ChildNotBegun { error: e.to_string() },
                }
            }),
            RepairEffect::Rejoin => {
                let all: Vec<String> = self
                    .pair
                    .prefill
                    .iter()
                    .chain(&self.pair.decode)
                    .map(ToString::to_string)
                    .collect();
                let part = sick_part(&self.pair, &all);
                let sr = part.serving_router.clone().expect("sick_part sets it");
                let r = crate::ops::drain::rejoin(&*self.ctx.agents, &self.rec, &part, &sr, true).await;
                Some(RepairEvent::Rejoined {
                    put_back: r.put_back,
                    detail: r.detail,
                })
            }
            // Its write-ahead is the record.
            RepairEffect::Record(_) => None,
        }
    }

    /// Runs `child` on `PAIR#repair`, journaled (must-write) before it begins.
    /// Before a round takes `units` out of the router (issue 46, item 4):
    /// waits, at most [`SERVING_WAIT`], until the router lists as healthy
    /// `[pair] repair_keeps_serving` of the engines of each side the round
    /// keeps — engines restarted a moment ago (by an earlier round, by
    /// systemd) may not be back in the router's health yet, and taking the
    /// named ones out then leaves clients nothing (503). Said as a step;
    /// past the wait the round goes on (the named engines fail their
    /// requests anyway) and says so.
    async fn await_serving(&self, units: &[String]) {
        use crate::ops::drain::probes::{pair_workers, router_call};
        use pdwarden_proto::v1::RouterWorkersOp;
        let Some(router) = self.pair.router.first() else {
            return;
        };
        let Ok(workers) = pair_workers(&*self.ctx.agents, &self.pair) else {
            return;
        };
        let keep = self.pair.repair_keeps_serving;
        // The sides the round touches, and what each keeps.
        let touched: Vec<&str> = ["prefill", "decode"]
            .into_iter()
            .filter(|t| workers.iter().any(|w| w.worker_type == *t && units.contains(&w.unit)))
            .collect();
        let kept = |t: &str| -> Vec<&pdwarden_model::report::PairWorker> {
            workers
                .iter()
                .filter(|w| w.worker_type == t && !units.contains(&w.unit))
                .collect()
        };
        let step = self.rec.step_started("await_serving", &self.pair.name);
        let started = tokio::time::Instant::now();
        let mut short: String;
        loop {
            let listed = router_call(&*self.ctx.agents, router, RouterWorkersOp::List, &[]).await;
            match &listed {
                Ok(list) => {
                    let missing: Vec<String> = touched
                        .iter()
                        .filter_map(|t| {
                            let healthy: Vec<&str> = kept(t)
                                .into_iter()
                                .filter(|w| list.iter().any(|l| l.url == w.url && l.healthy))
                                .map(|w| w.unit.as_str())
                                .collect();
                            (healthy.len() < keep).then(|| {
                                format!(
                                    "{} of the {} kept serving healthy in the router ({})",
                                    healthy.len(),
                                    t,
                                    if healthy.is_empty() {
                                        "none".into()
                                    } else {
                                        healthy.join(", ")
                                    }
                                )
                            })
                        })
                        .collect();
                    if missing.is_empty() {
                        self.rec.step_ended(
                            step,
                            format!(
                                "the router serves with the engines kept ({} ms) before {} go out",
                                started.elapsed().as_millis(),
                                units.join(", ")
                            ),
                        );
                        return;
                    }
                    short = missing.join("; ");
                }
                // A router without a worker API pdwarden can read: nothing
                // to wait for.
                Err(e) => {
                    self.rec.step_ended(
                        step,
                        format!("the router's workers could not be listed ({e}): not waited"),
                    );
                    return;
                }
            }
            if started.elapsed() >= SERVING_WAIT {
                break;
            }
            tokio::time::sleep(SERVING_POLL).await;
        }
        self.rec.step_ended(
            step,
            format!(
                "fail: after {} s only {short}: {} go out of the router anyway (they fail their requests as they are)",
                SERVING_WAIT.as_secs(),
                units.join(", ")
            ),
        );
    }

    async fn child(&self, child: &Child) -> Result<OperationReport, JournalError> {
        let kind = match child {
            Child::Restart { .. } | Child::WholePair => OperationKind::CoRestart,
            Child::Verify => OperationKind::Verify {
                include_abort_storm: false,
            },
        };
        let config = self.config_of(child);
        let child_pair = format!("{}{CHILD_SUFFIX}", self.pair.name);
        crate::ops::child::run(
            &self.ctx,
            &self.rec,
            &child_pair,
            CHILD_OPERATION,
            |id| ChildEntry {
                operation_id: id.into(),
                child: child.clone(),
                kind: kind.as_str().into(),
            },
            kind,
            config,
        )
        .await
    }

    /// The repair's report, journaled and sent.
    fn conclude(
        &self,
        last: Repair,
        evidence: Option<pdwarden_model::forensics::CaptureSummary>,
        note: Option<String>,
    ) -> OperationReport {
        let mut so_far: SoFar = last.into_so_far();
        so_far.reasons.extend(note);
        if let Some(e) = self.rec.journal_failure()
            && so_far.verdict.is_healthy()
        {
            machine::stopped_by_the_journal(&mut so_far, &e);
        }
        crate::ops::child::conclude_parent(
            &self.rec,
            &self.pair,
            crate::ops::child::ParentConclusion {
                kind: KIND,
                verdict: so_far.verdict,
                reasons: so_far.reasons,
                children: so_far.children,
                evidence,
                diagnoses: so_far.diagnoses,
            },
        )
    }
}

/// The repair over the in-memory agent at paused time.
#[cfg(test)]
mod tests {
    use pdwarden_proto::v1::Role;

    use super::*;
    use crate::ops::fake_agent::rig::{journal, orchestrator};
    use crate::ops::fake_agent::{FakeAgent, UnitModel};
    use pdwarden_model::judge::verdict::VerdictKind;

    fn agent(np: usize, nd: usize) -> FakeAgent {
        let mut units: Vec<UnitModel> = (0..np)
            .map(|i| UnitModel::new(&format!("prefill-{i}"), Role::Prefill))
            .collect();
        units.extend((0..nd).map(|i| UnitModel::new(&format!("decode-{i}"), Role::Decode)));
        units.push(UnitModel::new("router-0", Role::Router));
        FakeAgent::new("h1", units).with_serving_router("router-0")
    }

    fn url(unit: &str) -> String {
        format!("http://fake/{unit}")
    }

    /// A NIXL pool of `np` prefills and `nd` decodes: what the matrix names
    /// restarts alone (an SGLang pool's closure is the whole pool:
    /// `machine`'s tests).
    fn nixl_pool(np: usize, nd: usize) -> PairConfig {
        let mut p = crate::ops::fake_agent::rig::xpyd_pair(np, nd, "");
        p.kv_transfer = crate::config::KvTransfer::Nixl;
        p
    }

    async fn repair(ctx: OperationContext, pair: PairConfig, recovery: bool) -> OperationReport {
        let id = uuid::Uuid::new_v4().to_string();
        ctx.journal.begin(&id, KIND, &pair.name, None).unwrap();
        let (tx, _rx) = mpsc::unbounded_channel();
        run(ctx, pair, id, recovery, tx).await
    }

    /// The units each start command of the run went to, in order.
    fn started(agent: &FakeAgent) -> Vec<String> {
        agent.starts()
    }

    /// Issue 37, Done when 1 (fake pool): 2P2D and 3P2D, one decode whose
    /// every path fails until it restarts: only it restarts; every path is
    /// probed again, the pool put back and verified through the router.
    #[tokio::test(start_paused = true)]
    async fn a_sick_decode_alone_is_restarted_and_every_path_proven() {
        for (np, nd) in [(2, 2), (3, 2)] {
            let dir = tempfile::tempdir().unwrap();
            let journal = journal(&dir);
            let agent = agent(np, nd);
            let ctx = orchestrator(&journal, &agent).await;
            let pair = nixl_pool(np, nd);
            for p in 0..np {
                agent.break_kv_path_until_restart(&url(&format!("prefill-{p}")), &url("decode-1"), "decode-1");
            }
            let r = repair(ctx, pair, false).await;
            assert_eq!(r.verdict, VerdictKind::Healthy, "{np}P{nd}D: {:#?}", r.reasons);
            assert_eq!(
                started(&agent),
                ["decode-1"],
                "{np}P{nd}D: only the sick decode restarts"
            );
            assert_eq!(r.diagnoses.len(), 2, "before and after");
            assert!(r.diagnoses[1].failures.is_empty(), "{:?}", r.diagnoses[1]);
            let purposes: Vec<&str> = r.sub_operations.iter().map(|c| c.purpose.as_str()).collect();
            assert_eq!(purposes, ["round 1: restart h1/decode-1", "verification"]);
            // The decode alone was proven over its paths with a prefill of
            // the pool, and went back into the router after it.
            assert_eq!(
                r.sub_operations[0].verdict, "healthy",
                "{:#?}",
                r.sub_operations[0].reasons
            );
            let text = pdwarden_model::report::render_summary(&r);
            assert!(text.contains("path matrix:"), "{text}");
        }
    }

    /// Issue 46, item 4: a round does not take a decode out of the router
    /// while the router lists no other decode healthy (a decode restarted a
    /// moment ago, not back in its health yet): it waits, bounded, said as
    /// a step; once the other is healthy, the round goes on at once.
    #[tokio::test(start_paused = true)]
    async fn a_round_waits_for_the_router_to_serve_with_what_it_keeps() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent(2, 2);
        let ctx = orchestrator(&journal, &agent).await;
        for p in 0..2 {
            agent.break_kv_path_until_restart(&url(&format!("prefill-{p}")), &url("decode-1"), "decode-1");
        }
        agent.set_router_worker_health(&url("decode-0"), false);
        let healer = agent.clone();
        let heal = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            healer.set_router_worker_health(&url("decode-0"), true);
        });
        let began = tokio::time::Instant::now();
        let r = repair(ctx, nixl_pool(2, 2), false).await;
        heal.await.unwrap();
        assert_eq!(r.verdict, VerdictKind::Healthy, "{:#?}", r.reasons);
        assert_eq!(started(&agent), ["decode-1"]);
        let wait = r
            .steps
            .iter()
            .find(|s| s.name == "await_serving")
            .expect("the wait, as a step");
        assert!(
            wait.outcome.starts_with("the router serves with the engines kept"),
            "{wait:?}"
        );
        assert!(began.elapsed() >= std::time::Duration::from_secs(5));

        // Never healthy: after the bound, the round goes on, said.
        let dir2 = tempfile::tempdir().unwrap();
        let journal2 = self::journal(&dir2);
        let agent = self::agent(2, 2);
        let ctx = orchestrator(&journal2, &agent).await;
        for p in 0..2 {
            agent.break_kv_path_until_restart(&url(&format!("prefill-{p}")), &url("decode-1"), "decode-1");
        }
        agent.set_router_worker_health(&url("decode-0"), false);
        let r = repair(ctx, nixl_pool(2, 2), false).await;
        let wait = r.steps.iter().find(|s| s.name == "await_serving").expect("the wait");
        assert!(
            wait.outcome
                .contains("only 0 of the decode kept serving healthy in the router (none)"),
            "{wait:?}"
        );
        assert_eq!(started(&agent), ["decode-1"]);
    }

    /// A prefill with stale transfer state fails its row; it restarts, and
    /// a decode that paired with it still holds its old identity (the fake
    /// keeps decode-0's cache across the restart, as a link keyed by address
    /// would): its path to it fails until it restarts. Round 2 names that
    /// decode (the epoch), not the prefill again; each restarts once.
    #[tokio::test(start_paused = true)]
    async fn a_stale_prefill_then_the_decodes_holding_its_old_identity() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent(3, 2);
        let ctx = orchestrator(&journal, &agent).await;
        let pair = nixl_pool(3, 2);
        for d in 0..2 {
            agent.break_kv_path_until_restart(&url("prefill-1"), &url(&format!("decode-{d}")), "prefill-1");
        }
        // Decode-0 keeps prefill-1's old identity across its restart.
        agent.stale_identity_after_restart("prefill-1", &["decode-0"]);
        let r = repair(ctx, pair, false).await;
        assert_eq!(r.verdict, VerdictKind::Healthy, "{:#?}", r.reasons);
        assert_eq!(started(&agent), ["prefill-1", "decode-0"]);
        assert_eq!(r.diagnoses.len(), 3);
        let pdwarden_model::judge::paths::Localisation::Engines { suspects } = &r.diagnoses[1].localisation else {
            panic!("{:?}", r.diagnoses[1]);
        };
        assert_eq!(suspects[0].unit, "h1/decode-0");
        assert!(suspects[0].why.contains("old bootstrap identity"), "{suspects:?}");
    }

    /// Every journal entry of the repair and its children so far.
    fn entries_so_far(journal: &crate::ops::journal::Journal, id: &str) -> usize {
        let children: Vec<ChildEntry> = journal.read(id, CHILD_OPERATION).unwrap();
        journal.entries(id).unwrap().len()
            + children
                .iter()
                .map(|c| journal.entries(&c.operation_id).map(|e| e.len()).unwrap_or(0))
                .sum::<usize>()
    }

    /// The orchestrator killed at every point of a repair (after each
    /// journal entry of the repair or of a child), a new one taking it
    /// over: the repair concludes healthy, the sick decode was started
    /// exactly once and nothing else, every engine is back in the router,
    /// nothing is left running.
    #[tokio::test(start_paused = true)]
    async fn killed_at_every_point_the_repair_restarts_the_sick_engine_once() {
        let mut killed_in = std::collections::BTreeSet::new();
        let engines = ["prefill-0", "prefill-1", "decode-0", "decode-1"];
        let whole = crate::ops::fake_agent::rig::kill_at_every_point(
            async || {
                let dir = tempfile::tempdir().unwrap();
                let journal = journal(&dir);
                let agent = agent(2, 2);
                for p in ["prefill-0", "prefill-1"] {
                    agent.break_kv_path_until_restart(&url(p), &url("decode-1"), "decode-1");
                }
                let id = uuid::Uuid::new_v4().to_string();
                journal.begin(&id, KIND, "p", None).unwrap();
                let ctx = orchestrator(&journal, &agent).await;
                (dir, journal, agent, id, ctx)
            },
            |(_, _, _, id, ctx)| {
                let (tx, _rx) = mpsc::unbounded_channel();
                run(ctx.clone(), nixl_pool(2, 2), id.clone(), false, tx)
            },
            |(_, journal, _, id, _)| entries_so_far(journal, id),
            async |k, (_dir, journal, agent, _, _)| {
                let unfinished = journal.unfinished().unwrap();
                let op = unfinished
                    .iter()
                    .find(|o| o.kind == KIND)
                    .expect("the repair is unfinished")
                    .clone();
                killed_in.insert(op.state.clone());
                let report = resume(orchestrator(&journal, &agent).await, nixl_pool(2, 2), op).await;
                let at = format!("killed after entry {k}");
                assert_eq!(report.verdict, VerdictKind::Healthy, "{at}: {:#?}", report.reasons);
                assert_eq!(agent.starts_of("decode-1"), 1, "{at}: {:?}", agent.executed());
                for u in ["prefill-0", "prefill-1", "decode-0", "router-0"] {
                    assert_eq!(agent.starts_of(u), 0, "{at}: {u} started");
                }
                let mut listed = agent.router_lists();
                listed.sort();
                let mut all = engines.map(url).to_vec();
                all.sort();
                assert_eq!(listed, all, "{at}");
                assert!(journal.unfinished().unwrap().is_empty(), "{at}");
                assert!(
                    report
                        .reasons
                        .iter()
                        .any(|r| r.starts_with("resumed after an orchestrator restart")),
                    "{at}: {:#?}",
                    report.reasons
                );
            },
        )
        .await;
        assert!(whole > 20, "{whole}");
        for s in ["diagnosing", "restarting", "rejoining", "verifying_pair"] {
            assert!(killed_in.contains(s), "never killed in {s}: {killed_in:?}");
        }
    }

    /// Two engines of a 2P2D pool fail at once (a whole side's worth), and
    /// a pool whose every path fails: not localised, the whole co-restart.
    #[tokio::test(start_paused = true)]
    async fn what_does_not_localise_is_restarted_whole() {
        for broken in [
            vec![
                ("prefill-0", "decode-0"),
                ("prefill-1", "decode-0"),
                ("prefill-1", "decode-1"),
            ],
            vec![
                ("prefill-0", "decode-0"),
                ("prefill-0", "decode-1"),
                ("prefill-1", "decode-0"),
                ("prefill-1", "decode-1"),
            ],
        ] {
            let dir = tempfile::tempdir().unwrap();
            let journal = journal(&dir);
            let agent = agent(2, 2);
            let ctx = orchestrator(&journal, &agent).await;
            for (p, d) in &broken {
                agent.break_kv_path_until_restart(&url(p), &url(d), d);
            }
            let r = repair(ctx, nixl_pool(2, 2), false).await;
            assert!(
                r.reasons
                    .iter()
                    .any(|x| x.contains("the whole pair's ordered co-restart instead")),
                "{:#?}",
                r.reasons
            );
            assert_eq!(r.sub_operations.len(), 1);
            assert_eq!(r.sub_operations[0].purpose, "the whole pair's co-restart");
            let mut s = started(&agent);
            s.sort();
            assert_eq!(s, ["decode-0", "decode-1", "prefill-0", "prefill-1", "router-0"]);
        }
    }
}
