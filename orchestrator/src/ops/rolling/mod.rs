//! A rolling restart of an xPyD pair (issue 18): one P/D sub-pair at a time,
//! while the pair's router routes to the others.
//!
//! Why this shape: a pair with several prefills and decodes behind its own
//! router can keep serving while a part of it restarts — but only if that
//! part is out of the router's rotation first, drained by the engines' own
//! gauges, and back only once it is proven, including over the paths the
//! router will make between it and the rest (a PD router pairs any prefill
//! with any decode, and a restarted engine can break the KV link of an
//! engine it did not restart with: INCIDENTS row 1). Every piece of that
//! already exists for a pair behind a shared router (`ops::drain`), so a
//! sub-pair (prefill i, decode i) is an ordinary co-restart of a derived
//! pair — its two engines, no router of its own, and the pair's own router
//! as its serving router: out of rotation, drained, restarted in order,
//! probed over its own KV path (the request a PD router sends, straight to
//! both engines: `corestart`'s direct probes), its cross paths to the other
//! engines probed, and only then back. The roll stops at the first sub-pair
//! that is not healthy or not put back: the others keep serving and nothing
//! more is touched. Last, the whole pair is verified through its router
//! (probes and suite).
//!
//! Each sub-pair runs as its own journaled operation on `PAIR#roll` (as a
//! gate's children run on `PAIR#gate`); the roll journals which sub-pair
//! each child is before it runs, and each child's conclusion. An
//! orchestrator killed mid-roll resumes the child in flight from the journal
//! and the agents' facts (`corestart::resume`: no unit started twice, none
//! left stopped), then goes on with the next sub-pair.

use pdwarden_proto::v1::{OperationStarted, OperationUpdate, operation_update};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::config::{KvTransfer, PairConfig, ServingRouterConfig};
use crate::ops::OperationContext;
use crate::ops::corestart::OperationKind;
use crate::ops::journal::JournalError;
use crate::ops::machine::{Machine, Transition};
use crate::ops::recorder::Recorder;
use pdwarden_model::judge::verdict::VerdictKind;
use pdwarden_model::report::ChildOperation;
use pdwarden_model::report::OperationReport;
use pdwarden_model::status::OperationRecord;

pub mod machine;

use machine::{Roll, RollEffect, RollEvent, Rolling, SoFar};

/// The journal's kind of a rolling restart.
pub const KIND: &str = "rolling";
/// The pair name a roll's children are journaled under (`PAIR#roll`).
pub const CHILD_SUFFIX: &str = "#roll";

/// The journal entries a resumed roll reads back.
mod entry {
    /// A child about to run: [`super::ChildEntry`].
    pub const CHILD_OPERATION: &str = "child_operation";
    /// A child's conclusion: [`super::ChildConcluded`].
    pub const CHILD_CONCLUDED: &str = "child_concluded";
}

/// Which sub-pair a child operation is (`index` = the number of sub-pairs
/// for the closing verification of the whole pair).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildEntry {
    pub index: usize,
    pub operation_id: String,
    pub kind: String,
}

/// A child's conclusion, as the roll journals it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildConcluded {
    pub index: usize,
    pub child: ChildOperation,
}

/// Whether `pair` can be rolled: refused in one line naming what is wrong,
/// before anything is journaled.
pub fn check(pair: &PairConfig) -> Result<(), NotRollable> {
    let (p, d) = (pair.prefill.len(), pair.decode.len());
    let name = pair.name.clone();
    if pair.router.is_empty() {
        return Err(NotRollable::NoRouter { pair: name });
    }
    if pair.serving_router.is_some() {
        return Err(NotRollable::BehindServingRouter { pair: name });
    }
    if p != d {
        return Err(NotRollable::Unbalanced {
            pair: name,
            prefills: p,
            decodes: d,
        });
    }
    if p < 2 {
        return Err(NotRollable::OneSubPair { pair: name });
    }
    // What the KV link remembers decides it before anything restarts
    // (issue 37, restart epochs): a restarted prefill leaves every decode
    // that met it its old identity, and (SGLang) a decode restarted without
    // the prefills that served it keeps a degraded bootstrap — no sub-pair
    // could go back while the others serve (it used to be found out from
    // the failing paths at the first sub-pair's rejoin, which kept it out).
    match pair.kv_transfer {
        KvTransfer::Nixl => Ok(()),
        KvTransfer::Sglang => Err(NotRollable::PeerState {
            pair: name,
            kv_transfer: "sglang",
            why: "a restarted prefill leaves every decode its old identity, and a decode restarted without the prefills that served it keeps a degraded bootstrap (INCIDENTS row 1)",
        }),
        KvTransfer::Address => Err(NotRollable::PeerState {
            pair: name,
            kv_transfer: "address",
            why: "a restarted prefill leaves every decode its old identity",
        }),
    }
}

/// Why a pair cannot be restarted `--rolling` (refused before anything
/// is journaled).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotRollable {
    #[error("--rolling: pair {pair} has no router to route to its other sub-pairs")]
    NoRouter { pair: String },
    #[error(
        "--rolling: pair {pair} is behind a serving router ([pair.serving_router]); a rolling restart takes sub-pairs out of the pair's own router only: restart it whole"
    )]
    BehindServingRouter { pair: String },
    #[error(
        "--rolling: pair {pair} has {prefills} prefill(s) and {decodes} decode(s); a rolling restart restarts prefill i with decode i, so it needs as many of each"
    )]
    Unbalanced {
        pair: String,
        prefills: usize,
        decodes: usize,
    },
    #[error(
        "--rolling: pair {pair} has one prefill and one decode: there is no other sub-pair to serve while it restarts; restart it without --rolling"
    )]
    OneSubPair { pair: String },
    #[error(
        "--rolling: pair {pair} has a KV link that keeps state about its peers (kv_transfer = \"{kv_transfer}\"): {why}, so no sub-pair can go back while the others serve; restart it whole (restart pd-pair {pair}), or --only-sick for what is sick"
    )]
    PeerState {
        pair: String,
        kv_transfer: &'static str,
        why: &'static str,
    },
}

/// Sub-pair `i` of `pair` as a pair of its own: prefill i and decode i, no
/// router, and the pair's first router as the serving router it is taken
/// out of and put back into (the pair's drain timeouts, else the defaults).
pub fn sub_pair(pair: &PairConfig, i: usize) -> PairConfig {
    let mut sub = pair.clone();
    sub.name = format!("{}{CHILD_SUFFIX}", pair.name);
    sub.prefill = vec![pair.prefill[i].clone()];
    sub.decode = vec![pair.decode[i].clone()];
    sub.router = Vec::new();
    let router = &pair.router[0];
    sub.serving_router = Some(ServingRouterConfig::new(router.host.clone(), router.unit.clone()));
    sub
}

/// A journaled child's verdict, typed.
fn verdict_of(child: &ChildOperation) -> Option<VerdictKind> {
    serde_json::from_value(serde_json::Value::String(child.verdict.clone())).ok()
}

fn describe(pair: &PairConfig, i: usize) -> String {
    format!(
        "sub-pair {} of {} ({} + {})",
        i + 1,
        pair.prefill.len(),
        pair.prefill[i].unit,
        pair.decode[i].unit
    )
}

/// Runs a rolling restart whose journal row exists (`kind` [`KIND`]) to its
/// report; progress (the children's steps, phases and probes) goes to
/// `updates`.
pub async fn run(
    ctx: OperationContext,
    pair: PairConfig,
    operation_id: String,
    updates: mpsc::UnboundedSender<OperationUpdate>,
) -> OperationReport {
    let roller = Roller::new(ctx, pair, operation_id, updates);
    roller.capture_if_judged_wedged().await;
    let so_far = roller.drive(roller.from(0, SoFar::default())).await;
    roller.conclude(so_far, None)
}

/// Takes over a roll an earlier orchestrator left running: the children it
/// had concluded stand; the one in flight is resumed (a co-restart from the
/// journal and the agents' facts, adopting its starts) or, if it never got
/// as far as its first entry, concluded as not started and run again; then
/// the roll goes on. Nobody follows it live; its report is journaled.
pub async fn resume(ctx: OperationContext, pair: PairConfig, op: OperationRecord) -> OperationReport {
    let (tx, _rx) = mpsc::unbounded_channel();
    let roller = Roller::new(ctx, pair, op.operation_id.clone(), tx);
    let note = format!(
        "resumed after an orchestrator restart: the roll was in state {}",
        op.state
    );
    roller.rec.journal("resumed", &serde_json::json!({ "note": note }));
    let read = (|| -> Result<(Vec<ChildEntry>, Vec<ChildConcluded>), JournalError> {
        Ok((
            roller.rec.journal.read(&op.operation_id, entry::CHILD_OPERATION)?,
            roller.rec.journal.read(&op.operation_id, entry::CHILD_CONCLUDED)?,
        ))
    })();
    let mut so_far = SoFar::default();
    let (children, concluded) = match read {
        Ok(r) => r,
        Err(e) => {
            so_far.verdict = VerdictKind::Failed;
            so_far
                .reasons
                .push(format!("its journal could not be read ({e}); check the pair's units"));
            return roller.conclude(so_far, Some(note));
        }
    };
    so_far.children = concluded.iter().map(|c| c.child.clone()).collect();
    // A child begun but killed before the roll named it: nothing was sent
    // for it (its entry comes before its first command).
    let child_pair = format!("{}{CHILD_SUFFIX}", roller.pair.name);
    let unfinished = roller.rec.journal.unfinished().unwrap_or_default();
    for orphan in unfinished
        .iter()
        .filter(|o| o.pair == child_pair && !children.iter().any(|c| c.operation_id == o.operation_id))
    {
        let report = serde_json::json!({
            "operation_id": orphan.operation_id, "pair": orphan.pair, "kind": orphan.kind, "verdict": "failed",
            "reasons": ["begun by a rolling restart killed before it named it; nothing was sent for it"],
        });
        let _ = roller.rec.journal.conclude(&orphan.operation_id, "failed", &report);
    }
    let machine = Rolling { pair: &roller.pair };
    if let Some(stopped) = concluded
        .iter()
        .find(|c| !verdict_of(&c.child).is_some_and(VerdictKind::is_healthy))
    {
        machine.stopped_at(&mut so_far, stopped.index, &stopped.child);
        return roller.conclude(so_far, Some(note));
    }
    let n = roller.pair.prefill.len();
    let start = match children.last() {
        None => roller.from(0, so_far),
        Some(last) if concluded.iter().any(|c| c.child.operation_id == last.operation_id) => {
            roller.from(last.index + 1, so_far)
        }
        Some(last) => {
            let in_flight = unfinished.into_iter().find(|o| o.operation_id == last.operation_id);
            let report = match in_flight {
                Some(child) => {
                    let child_config = if last.index < n {
                        sub_pair(&roller.pair, last.index)
                    } else {
                        roller.pair.clone()
                    };
                    let task = crate::ops::corestart::resume(roller.ctx.clone(), child_config, child);
                    match crate::ops::guarded(&roller.ctx.journal, &last.operation_id, task).await {
                        Ok(r) => Some(r),
                        Err(panic) => std::panic::resume_unwind(Box::new(panic.0)),
                    }
                }
                // Concluded before the roll journaled it: its report.
                None => roller
                    .rec
                    .journal
                    .history(&child_pair, 100)
                    .ok()
                    .and_then(|h| h.into_iter().find(|o| o.operation_id == last.operation_id))
                    .and_then(|o| o.report)
                    .and_then(|r| serde_json::from_value::<OperationReport>(r).ok()),
            };
            match report {
                // The child in flight concluded: the step on its report.
                Some(report) => machine.step(
                    Roll::running(n, last.index, so_far),
                    RollEvent::ChildConcluded {
                        index: last.index,
                        report: Box::new(report),
                    },
                    roller.rec.now_ms(),
                ),
                // Unreadable: that sub-pair is run again (restarting a
                // generating unit is safe; trusting an unknown one is not).
                None => roller.from(last.index, so_far),
            }
        }
    };
    let so_far = roller.drive(start).await;
    roller.conclude(so_far, Some(note))
}

/// Concludes `failed` whatever of `pair`'s roll is still running on
/// `PAIR#roll` (its roll concluded without resuming it), saying `why`.
pub fn abandon(journal: &crate::ops::journal::Journal, pair: &PairConfig, why: &str) {
    crate::ops::child::abandon(journal, &format!("{}{CHILD_SUFFIX}", pair.name), why);
}

/// A roll under way: what carries out its machine's effects.
struct Roller {
    ctx: OperationContext,
    pair: PairConfig,
    rec: Recorder,
    /// What the pair looked like before the roll stopped anything, when
    /// the watch judged it wedged (issue 35).
    evidence: std::sync::Mutex<Option<pdwarden_model::forensics::CaptureSummary>>,
}

impl Roller {
    fn new(
        ctx: OperationContext,
        pair: PairConfig,
        operation_id: String,
        updates: mpsc::UnboundedSender<OperationUpdate>,
    ) -> Self {
        let rec = Recorder::new(operation_id.clone(), ctx.journal.clone(), updates);
        rec.send(operation_update::Kind::Started(OperationStarted {
            operation_id,
            pair: pair.name.clone(),
            decode_start_policy: pair.decode_start_policy.as_str().into(),
        }));
        Roller {
            ctx,
            pair,
            rec,
            evidence: std::sync::Mutex::new(None),
        }
    }

    /// An operator's roll of a pair the watch judged wedged (the server's
    /// opening entry) captures the whole pair first, as a co-restart does
    /// (issue 35): read-only, bounded, before the first sub-pair stops.
    async fn capture_if_judged_wedged(&self) {
        use crate::ops::forensics;
        let deadline_ms = self.pair.watch.evidence_deadline_ms;
        let opening: Vec<serde_json::Value> = self
            .rec
            .journal
            .read(&self.rec.operation_id, forensics::OPENING)
            .unwrap_or_default();
        let Some(why) = opening.first().filter(|_| deadline_ms > 0) else {
            return;
        };
        let why = why["why"]
            .as_str()
            .unwrap_or("the watch judged the pair wedged")
            .to_string();
        let deadline = std::time::Duration::from_millis(deadline_ms);
        let capture = forensics::capture(&*self.ctx.agents, &self.pair, why, deadline).await;
        let summary = forensics::keep(
            &self.rec.journal,
            &self.pair.name,
            &self.rec.operation_id,
            self.rec.now_ms(),
            &capture,
        );
        *self.evidence.lock().unwrap_or_else(|p| p.into_inner()) = Some(summary);
    }

    /// The roll from child `first` on.
    fn from(&self, first: usize, so_far: SoFar) -> Transition<Roll, RollEffect> {
        Transition::then(
            Roll::running(self.pair.prefill.len(), first, so_far),
            RollEffect::RunChild { index: first },
        )
    }

    /// Runs the roll's machine from `start` to its end.
    async fn drive(&self, start: Transition<Roll, RollEffect>) -> SoFar {
        let machine = Rolling { pair: &self.pair };
        crate::ops::machine::run(&machine, &self.rec, start, |effect| async move {
            match effect {
                RollEffect::RunChild { index } => Some(match self.child(index).await {
                    Ok(report) => RollEvent::ChildConcluded {
                        index,
                        report: Box::new(report),
                    },
                    Err(e) => RollEvent::ChildNotBegun {
                        index,
                        error: e.to_string(),
                    },
                }),
                // Its write-ahead is the record.
                RollEffect::Record(_) => None,
            }
        })
        .await
        .into_so_far()
    }

    /// Runs child `index` (sub-pair `index`, or the whole pair's
    /// verification) on `PAIR#roll`, forwarding its live progress;
    /// journaled as child `index` before it runs.
    async fn child(&self, index: usize) -> Result<OperationReport, JournalError> {
        let (kind, config) = if index < self.pair.prefill.len() {
            (OperationKind::CoRestart, sub_pair(&self.pair, index))
        } else {
            (
                OperationKind::Verify {
                    include_abort_storm: false,
                },
                self.pair.clone(),
            )
        };
        let child_pair = format!("{}{CHILD_SUFFIX}", self.pair.name);
        crate::ops::child::run(
            &self.ctx,
            &self.rec,
            &child_pair,
            entry::CHILD_OPERATION,
            |id| ChildEntry {
                index,
                operation_id: id.into(),
                kind: kind.as_str().into(),
            },
            kind,
            config,
        )
        .await
    }

    /// The roll's report, journaled and sent.
    fn conclude(&self, mut so_far: SoFar, note: Option<String>) -> OperationReport {
        if let Some(note) = note {
            so_far.reasons.push(note);
        }
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
                evidence: self.evidence.lock().unwrap_or_else(|p| p.into_inner()).take(),
                diagnoses: Vec::new(),
            },
        )
    }
}

/// The roll over the in-memory agent at paused time: a 2P2D pair whose
/// router has the worker API (the fake models sglang-router's contract).
#[cfg(test)]
pub(crate) mod tests {

    use pdwarden_proto::v1::{Role, RouterWorkersOp};

    use super::*;
    use crate::ops::fake_agent::rig::{journal, orchestrator};
    use crate::ops::fake_agent::{FakeAgent, UnitModel};
    use crate::ops::journal::Journal;

    const ENGINES: [&str; 4] = ["prefill-0", "prefill-1", "decode-0", "decode-1"];

    /// A 2P2D pool whose link keeps no peer state (NIXL): rollable.
    pub(crate) fn pair() -> PairConfig {
        let mut p = crate::ops::fake_agent::rig::xpyd_pair(2, 2, "");
        p.kv_transfer = KvTransfer::Nixl;
        p
    }

    /// Host h1: the four engines and router-0, which lists all of them.
    fn agent() -> FakeAgent {
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
        .with_serving_router("router-0")
    }

    fn begin(journal: &Journal) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        journal.begin(&id, KIND, "p", None).unwrap();
        id
    }

    fn url(unit: &str) -> String {
        format!("http://fake/{unit}")
    }

    /// The worker API's removes and adds, in order, as unit sets.
    fn membership_calls(agent: &FakeAgent) -> Vec<(&'static str, Vec<String>)> {
        agent
            .router_calls()
            .into_iter()
            .filter_map(|(op, urls, _)| {
                let op = match RouterWorkersOp::try_from(op).ok()? {
                    RouterWorkersOp::Remove => "remove",
                    RouterWorkersOp::Add => "add",
                    _ => return None,
                };
                let mut units: Vec<String> = urls
                    .iter()
                    .map(|u| u.trim_start_matches("http://fake/").to_string())
                    .collect();
                units.sort();
                Some((op, units))
            })
            .collect()
    }

    fn sorted(mut v: Vec<String>) -> Vec<String> {
        v.sort();
        v
    }

    /// Issue 32: the journal fails at every write of a roll, and every
    /// write after it (a disk that fills), then has room again. No unit is
    /// started and no worker taken out of the router without its
    /// write-ahead entry, none is started twice, the roll is never healthy
    /// with a write failed before its conclusion and says so first, and
    /// once the disk has room every operation concludes (no `p#roll` child
    /// left holding the pair) with every engine running and listed by the
    /// router or said to be left out.
    #[tokio::test(start_paused = true)]
    async fn a_journal_that_fails_at_any_write_of_a_roll_leaves_nothing_unrecorded() {
        use crate::ops::fake_agent::rig::{fail_from_every_write, fail_writes_from};
        fail_from_every_write(
            async |fail_from| {
                let dir = tempfile::tempdir().unwrap();
                let journal = journal(&dir);
                let agent = agent();
                let ctx = orchestrator(&journal, &agent).await;
                let id = begin(&journal);
                let before = fail_writes_from(&journal, fail_from);
                let (tx, _rx) = mpsc::unbounded_channel();
                let report = run(ctx, pair(), id, tx).await;
                let writes = journal.writes_seen() - before;
                ((report, agent, journal, dir), writes)
            },
            |(clean, ..), total| {
                assert!(clean.verdict.is_healthy(), "{:?}", clean.reasons);
                assert!(total > 30, "{total} writes");
            },
            async |n, total, (report, agent, journal, _dir)| {
                let mut broken = Vec::new();
                let at = format!("writes failing from write {n} of {total}");
                let reasons = &report.reasons;
                let ops: Vec<String> = journal
                    .history("p#roll", 100)
                    .unwrap()
                    .into_iter()
                    .map(|o| o.operation_id)
                    .collect();
                broken.extend(
                    crate::ops::fake_agent::rig::done_unrecorded(&journal, &ops, &agent)
                        .into_iter()
                        .map(|d| format!("{at}: {d}")),
                );
                for u in ENGINES {
                    if agent.starts_of(u) > 1 {
                        broken.push(format!("{at}: {u} started {} times", agent.starts_of(u)));
                    }
                }
                // The roll's or the child's it stopped at.
                let names_journal = reasons.iter().any(|l| {
                    l.trim_start()
                        .starts_with("stopped: the journal could not record a step")
                });
                if n + 1 < total && (report.verdict.is_healthy() || !names_journal) {
                    broken.push(format!(
                        "{at}: {} without naming the journal: {reasons:?}",
                        report.verdict.as_str()
                    ));
                }
                broken.extend(crate::ops::fake_agent::rig::healed_nothing_running(&journal, &at).await);
                for u in ENGINES {
                    if agent.unit_phase(u) != pdwarden_proto::v1::Phase::Generating {
                        broken.push(format!("{at}: {u} left {:?}", agent.unit_phase(u)));
                    }
                    let listed = agent.router_lists().contains(&url(u));
                    if !listed
                        && !reasons.iter().any(|r| {
                            r.contains("left out of the serving router")
                                || r.contains("out of rotation")
                                || r.contains("not put back")
                        })
                    {
                        broken.push(format!("{at}: {u} out of the router, unsaid: {reasons:?}"));
                    }
                }
                broken
            },
        )
        .await;
    }

    /// One sub-pair at a time: out of the router, restarted (prefill, then
    /// decode), back in, and only then the next; the router itself is never
    /// restarted and lists every engine at the end; the whole pair is
    /// verified last.
    #[tokio::test(start_paused = true)]
    async fn a_rolling_restart_takes_one_sub_pair_out_at_a_time_and_puts_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        let ctx = orchestrator(&journal, &agent).await;
        let id = begin(&journal);
        let (tx, _rx) = mpsc::unbounded_channel();
        let report = run(ctx, pair(), id, tx).await;
        assert!(report.verdict.is_healthy(), "{:#?}", report.reasons);
        let starts: Vec<String> = agent.executed().into_iter().map(|e| e.unit).collect();
        assert_eq!(starts, ["prefill-0", "decode-0", "prefill-1", "decode-1"], "{starts:?}");
        assert_eq!(agent.starts_of("router-0"), 0);
        assert_eq!(
            membership_calls(&agent),
            [
                ("remove", vec!["decode-0".to_string(), "prefill-0".to_string()]),
                ("add", vec!["decode-0".to_string(), "prefill-0".to_string()]),
                ("remove", vec!["decode-1".to_string(), "prefill-1".to_string()]),
                ("add", vec!["decode-1".to_string(), "prefill-1".to_string()]),
            ]
        );
        assert_eq!(
            sorted(agent.router_lists()),
            sorted(ENGINES.iter().map(|u| url(u)).collect())
        );
        let purposes: Vec<(&str, &str)> = report
            .sub_operations
            .iter()
            .map(|c| (c.purpose.as_str(), c.kind.as_str()))
            .collect();
        assert_eq!(
            purposes,
            [
                ("sub-pair 1 of 2 (prefill-0 + decode-0)", "co_restart"),
                ("sub-pair 2 of 2 (prefill-1 + decode-1)", "co_restart"),
                ("verification", "verify")
            ]
        );
        // Each sub-pair was probed over its own KV path, not the router.
        let child = journal.history("p#roll", 10).unwrap();
        let first = child
            .iter()
            .find(|o| o.operation_id == report.sub_operations[0].operation_id)
            .unwrap();
        let probes = first.report.as_ref().unwrap()["probes"].as_array().unwrap().clone();
        assert!(!probes.is_empty());
        assert!(
            probes
                .iter()
                .all(|p| p["target"] == "kv:http://fake/prefill-0 -> http://fake/decode-0"),
            "{probes:#?}"
        );
        assert!(journal.unfinished().unwrap().is_empty());
        assert_eq!(journal.history("p", 1).unwrap()[0].verdict.as_deref(), Some("healthy"));
    }

    /// Issue 35: an operator's roll of a pair the watch judged wedged (the
    /// server's opening entry) captures the whole pair before the first
    /// sub-pair is stopped; its children do not capture again; a roll of a
    /// pair not judged wedged captures nothing.
    #[tokio::test(start_paused = true)]
    async fn a_roll_of_a_pair_judged_wedged_captures_it_first() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        let ctx = orchestrator(&journal, &agent).await;
        let (tx, _rx) = mpsc::unbounded_channel();
        let report = run(ctx.clone(), pair(), begin(&journal), tx.clone()).await;
        assert!(report.evidence.is_none() && agent.captures().is_empty());
        let id = begin(&journal);
        let why = "the operator restarted a pair the watch judged suspect: decode-1 silent";
        journal
            .append(
                &id,
                0,
                crate::ops::forensics::OPENING,
                &serde_json::json!({ "why": why }),
            )
            .unwrap();
        let starts_before = agent.executed().len();
        let report = run(ctx, pair(), id.clone(), tx).await;
        assert!(report.verdict.is_healthy(), "{:#?}", report.reasons);
        assert_eq!(report.evidence.expect("captured").why, why);
        let captures = agent.captures();
        assert_eq!(captures.len(), 1, "the children do not capture again");
        assert_eq!(captures[0].1, starts_before, "before the roll's first start");
        assert_eq!(captures[0].0.len(), ENGINES.len() + 1, "every engine and the router");
        assert_eq!(journal.read::<serde_json::Value>(&id, "evidence").unwrap().len(), 1);
    }

    /// A restarted sub-pair healthy on its own path but whose path from the
    /// other sub-pair's prefill fails (a stale bootstrap identity) is kept
    /// out, and the roll stops there: the other sub-pair is not touched and
    /// keeps serving alone.
    #[tokio::test(start_paused = true)]
    async fn a_sub_pair_whose_cross_path_fails_is_kept_out_and_the_roll_stops() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        agent.break_kv_path(&url("prefill-1"), &url("decode-0"));
        let ctx = orchestrator(&journal, &agent).await;
        let id = begin(&journal);
        let (tx, _rx) = mpsc::unbounded_channel();
        let report = run(ctx, pair(), id, tx).await;
        assert_eq!(report.verdict, VerdictKind::Failed, "{:#?}", report.reasons);
        assert!(
            report.reasons[0]
                .starts_with("the roll stopped at sub-pair 1 of 2 (prefill-0 + decode-0): failed (operation ")
                && report.reasons[0].ends_with("sub-pairs 2..2 were not restarted and kept serving"),
            "{:#?}",
            report.reasons
        );
        assert!(
            report
                .reasons
                .iter()
                .any(|r| r.contains("http://fake/prefill-1 → http://fake/decode-0")),
            "{:#?}",
            report.reasons
        );
        assert_eq!(agent.starts_of("prefill-1"), 0);
        assert_eq!(agent.starts_of("decode-1"), 0);
        assert_eq!(sorted(agent.router_lists()), [url("decode-1"), url("prefill-1")]);
        assert_eq!(report.sub_operations.len(), 1, "no verification after a stop");
        assert!(journal.unfinished().unwrap().is_empty());
    }

    /// Refused in one line naming the reason, before anything is journaled.
    #[test]
    fn pairs_that_cannot_be_rolled_are_refused_in_one_line() {
        assert_eq!(check(&pair()), Ok(()));
        for (p, says) in [
            (
                crate::ops::fake_agent::rig::xpyd_pair(1, 1, ""),
                "has one prefill and one decode",
            ),
            (
                crate::ops::fake_agent::rig::xpyd_pair(2, 3, ""),
                "has 2 prefill(s) and 3 decode(s)",
            ),
            (
                crate::ops::fake_agent::rig::xpyd_pair(
                    2,
                    2,
                    "[pair.serving_router]\nhost = \"h1\"\nunit = \"router-9\"\n",
                ),
                "is behind a serving router",
            ),
            (
                crate::ops::fake_agent::rig::xpyd_pair(2, 2, ""),
                "keeps state about its peers (kv_transfer = \"sglang\")",
            ),
            (
                {
                    let mut a = pair();
                    a.kv_transfer = KvTransfer::Address;
                    a
                },
                "a restarted prefill leaves every decode its old identity",
            ),
        ] {
            let e = check(&p).unwrap_err().to_string();
            assert!(
                e.starts_with("--rolling: pair p ") && e.contains(says) && !e.contains('\n'),
                "{e}"
            );
        }
    }

    /// Every journal entry of the roll and its children so far.
    fn entries_so_far(journal: &Journal, id: &str) -> usize {
        let children: Vec<ChildEntry> = journal.read(id, entry::CHILD_OPERATION).unwrap();
        journal.entries(id).unwrap().len()
            + children
                .iter()
                .map(|c| journal.entries(&c.operation_id).unwrap().len())
                .sum::<usize>()
    }

    /// The orchestrator killed at every point of a roll (the first await
    /// after each journal entry of the roll or of a child), a new one
    /// taking it over: the roll concludes healthy, every engine was started
    /// exactly once, the router lists every engine, nothing is left running.
    #[tokio::test(start_paused = true)]
    async fn killed_at_every_point_the_roll_starts_each_engine_once() {
        let mut killed_in = std::collections::BTreeSet::new();
        let whole = crate::ops::fake_agent::rig::kill_at_every_point(
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
                run(ctx.clone(), pair(), id.clone(), tx)
            },
            |(_, journal, _, id, _)| entries_so_far(journal, id),
            async |k, (_dir, journal, agent, _, _)| {
                let unfinished = journal.unfinished().unwrap();
                let op = unfinished
                    .iter()
                    .find(|o| o.kind == KIND)
                    .expect("the roll is unfinished")
                    .clone();
                if let Some(child) = unfinished.iter().find(|o| o.pair == "p#roll") {
                    killed_in.insert(format!("{} {}", child.kind, child.state));
                }
                let report = resume(orchestrator(&journal, &agent).await, pair(), op).await;
                let at = format!("killed after entry {k}");
                assert!(report.verdict.is_healthy(), "{at}: {:#?}", report.reasons);
                for u in ENGINES {
                    assert_eq!(agent.starts_of(u), 1, "{at}: {u} started again: {:?}", agent.executed());
                }
                assert_eq!(agent.starts_of("router-0"), 0, "{at}");
                assert_eq!(
                    sorted(agent.router_lists()),
                    sorted(ENGINES.iter().map(|u| url(u)).collect()),
                    "{at}"
                );
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
        assert!(whole > 30, "{whole}");
        for s in [
            "co_restart restarting_prefill",
            "co_restart draining",
            "co_restart rejoining",
            "verify probing",
        ] {
            assert!(killed_in.contains(s), "never killed in {s}: {killed_in:?}");
        }
    }
}
