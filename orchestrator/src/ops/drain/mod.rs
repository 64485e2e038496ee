//! Drain before restart, rejoin after a healthy verdict (issue 18).
//!
//! A pair whose clients reach it through a router shared with other pairs
//! (`[pair.serving_router]`) is taken out of that router's rotation before
//! any of its units is stopped, and put back only once the co-restart's
//! verdict — reached through the pair's own router, which only the pair's
//! engines stand behind — is healthy. In between:
//!
//! 1. **Out of rotation.** The serving router's agent removes the pair's
//!    engines through the router's worker API (`agent/src/router_api.rs`),
//!    and the router is listed again until it no longer shows them: both
//!    sglang-router calls are queued (ROUTER-NOTES.md), so the 202 alone
//!    does not mean the router stopped choosing them.
//! 2. **A wait that means something.** Today's gateways wait a fixed
//!    `drain_settle_secs` (sgl-model-gateway). Here the engines' own gauges
//!    are read until every one of them shows no request running or queued
//!    and no KV transfer in its PD queues, twice in a row (a request the
//!    router chose just before the removal may still be on its way to the
//!    engine at the first reading), bounded by `drain_timeout_ms`. Past it
//!    the restart goes on and the report names what was still in flight.
//!    SGLang refreshes an idle engine's gauges only every 30 s
//!    (`pdwarden_engines`' profile), so on a real SGLang pair the last
//!    requests' gauges can read stale for that long: the default timeout
//!    (60 s) outlasts one stale reading; vLLM's gauges move every step.
//! 3. **Back only when healthy.** After a healthy verdict every engine of
//!    the pair is added back (one already listed is left as it is) and the
//!    router is listed until it shows each of them healthy, bounded by
//!    `rejoin_timeout_ms`. A pair that is not healthy stays out, and the
//!    report says so: a broken pair in rotation is what the drain avoided.
//!
//! An automatic recovery of a confirmed wedge takes the pair out without
//! waiting for its work: a wedged pair's requests do not finish. A drain
//! that cannot be done (the router's agent not connected, the API
//! refusing) stops a co-restart before anything is touched, except a
//! recovery, whose pair is broken already.
//!
//! Every step is idempotent — removing a worker the router does not list,
//! adding one it lists, are no-ops — so a resumed operation simply drains
//! again (nothing left to remove, nothing in flight on a restarting pair)
//! and rejoins after its own verdict.

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use pdwarden_proto::v1::RouterWorkersOp;

use crate::config::{PairConfig, ServingRouterConfig, UnitRef};
use crate::ops::machine::Machine;
use crate::ops::port::AgentPort;
use crate::ops::recorder::Recorder;
pub use pdwarden_model::report::{DrainRecord, PairWorker, RejoinRecord};

pub mod machine;
pub mod probes;

use machine::{Draining, Rejoin, Rejoining, RouterEffect, RouterEvent, RouterRefusal};
pub use probes::*;

/// Drains the pair out of its serving router (module docs). `wait`: wait
/// for the engines' work (false for the recovery of a wedge).
pub async fn drain(
    agents: &dyn AgentPort,
    rec: &Recorder,
    pair: &PairConfig,
    sr: &ServingRouterConfig,
    wait: bool,
) -> DrainRecord {
    let router = sr.unit_ref();
    let step = rec.step_started("drain", &router.to_string());
    let start = Draining::start(router.to_string(), wait);
    let workers = match pair_workers(agents, pair) {
        Ok(w) => w,
        Err(e) => {
            let mut out = start.next.into_record();
            out.error = Some(e.to_string());
            return end(rec, step, out);
        }
    };
    // What this operation took out before an orchestrator restart (a
    // resumed drain finds them out already).
    let earlier: Vec<PairWorker> = rec
        .journal
        .read::<Vec<PairWorker>>(&rec.operation_id, machine::DRAIN_REMOVING)
        .unwrap_or_default()
        .into_iter()
        .flatten()
        .collect();
    let draining = Draining {
        workers,
        earlier,
        wait,
        drain_timeout_ms: sr.drain_timeout_ms,
        poll_ms: sr.poll_ms,
    };
    let router = &router;
    let end_state = crate::ops::machine::run(&draining, rec, start, |effect| async move {
        router_effect(agents, router, pair, effect).await
    })
    .await;
    end(rec, step, end_state.into_record())
}

/// Carries out one effect of the drain or the rejoin through the router's
/// agent (or the engines' agents, for a scrape).
async fn router_effect(
    agents: &dyn AgentPort,
    router: &UnitRef,
    pair: &PairConfig,
    effect: RouterEffect,
) -> Option<RouterEvent> {
    let changed = |r: Result<Vec<_>, RouterApiError>| {
        RouterEvent::Changed(r.map(|_| ()).map_err(|e| RouterRefusal(e.to_string())))
    };
    Some(match effect {
        RouterEffect::List { retried: true } => {
            // A router that is restarting (or not up yet) is asked a few times.
            let list = || router_call(agents, router, RouterWorkersOp::List, &[]);
            RouterEvent::Listed(
                list.retry(
                    ExponentialBuilder::default()
                        .with_min_delay(Duration::from_millis(200))
                        .with_max_delay(Duration::from_secs(2))
                        .with_max_times(4),
                )
                .sleep(tokio::time::sleep)
                .await
                .map_err(|e| RouterRefusal(e.to_string())),
            )
        }
        RouterEffect::List { retried: false } => RouterEvent::Listed(
            router_call(agents, router, RouterWorkersOp::List, &[])
                .await
                .map_err(|e| RouterRefusal(e.to_string())),
        ),
        RouterEffect::Remove(w) if w.is_empty() => RouterEvent::Changed(Ok(())),
        RouterEffect::Remove(w) => changed(router_call(agents, router, RouterWorkersOp::Remove, &w).await),
        RouterEffect::Add(w) => changed(router_call(agents, router, RouterWorkersOp::Add, &w).await),
        RouterEffect::Scrape => RouterEvent::Scraped {
            busy: busy_engines(&scrape_pair(agents, pair, REQUEST_TIMEOUT_MS).await),
        },
        RouterEffect::ProbePaths(paths) => RouterEvent::Probed {
            broken: check_paths(agents, router, pair, &paths).await,
        },
        RouterEffect::Sleep { ms } => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            return None;
        }
    })
}

fn end(rec: &Recorder, step: usize, out: DrainRecord) -> DrainRecord {
    let outcome = match (&out.error, out.timed_out) {
        (Some(e), _) => format!("fail: {e}"),
        (None, true) => format!("warn: drain timed out ({})", out.in_flight_left.join("; ")),
        (None, false) => format!("pass: {} worker(s) out of rotation", out.removed.len()),
    };
    rec.step_ended(step, outcome);
    rec.journal("drain", &out);
    out
}

/// Puts the pair back into its serving router after a healthy verdict, or
/// says why it stays out (module docs).
pub async fn rejoin(
    agents: &dyn AgentPort,
    rec: &Recorder,
    pair: &PairConfig,
    sr: &ServingRouterConfig,
    healthy: bool,
) -> RejoinRecord {
    let router = sr.unit_ref();
    if !healthy {
        let r = RejoinRecord {
            put_back: false,
            healthy_at_ms: None,
            detail: format!(
                "left out of the serving router {router}: the pair is not healthy (its engines go back after a healthy restart)"
            ),
            paths_checked: Vec::new(),
        };
        rec.journal("rejoin", &r);
        return r;
    }
    let step = rec.step_started("rejoin", &router.to_string());
    let r = rejoin_healthy(agents, pair, sr, rec).await;
    rec.step_ended(
        step,
        if r.put_back {
            "pass: back in rotation".to_string()
        } else {
            format!("fail: {}", r.detail)
        },
    );
    rec.journal("rejoin", &r);
    r
}

async fn rejoin_healthy(
    agents: &dyn AgentPort,
    pair: &PairConfig,
    sr: &ServingRouterConfig,
    rec: &Recorder,
) -> RejoinRecord {
    let router = sr.unit_ref();
    let mut rejoining = Rejoining {
        router: router.to_string(),
        workers: Vec::new(),
        rejoin_timeout_ms: sr.rejoin_timeout_ms,
        poll_ms: sr.poll_ms,
    };
    rejoining.workers = match pair_workers(agents, pair) {
        Ok(w) => w,
        Err(e) => return rejoining.failed(&e.to_string(), Vec::new()),
    };
    let router = &router;
    match crate::ops::machine::run(&rejoining, rec, Rejoining::start(), |effect| async move {
        router_effect(agents, router, pair, effect).await
    })
    .await
    {
        Rejoin::Done { record } => record,
        // The machine ends only when done; a state left otherwise is said.
        other => rejoining.failed(
            &format!("the rejoin ended in state {}", Rejoining::label(&other)),
            Vec::new(),
        ),
    }
}

/// The drain inside a co-restart, over the fake agent at paused time: a
/// pair `p` (prefill-0, decode-0, its own router-0) and another pair's
/// engines behind one serving router, `shared-router`, on the same host.
#[cfg(test)]
mod driver_tests {
    use std::time::Duration;

    use pdwarden_proto::v1::{Phase, Role, RouterWorkersOp};
    use tokio::sync::mpsc;

    use crate::ops::corestart::{OperationContext, OperationKind, resume, run_operation};
    use crate::ops::fake_agent::rig::{
        UNITS, fail_from_every_write, fail_writes_from, healed_nothing_running, journal, kill_at_every_point,
        orchestrator,
    };
    use crate::ops::fake_agent::{FakeAgent, UnitModel};
    use crate::ops::journal::Journal;
    use pdwarden_model::report::OperationReport;

    const OURS: [&str; 2] = ["http://fake/prefill-0", "http://fake/decode-0"];
    const THEIRS: [&str; 2] = ["http://fake/other-prefill", "http://fake/other-decode"];

    fn pair(serving_router_unit: &str, drain_timeout_ms: u64) -> crate::config::PairConfig {
        crate::ops::fake_agent::rig::pair(
            "after-prefill-ready",
            &format!(
                "[pair.serving_router]\nhost = \"h1\"\nunit = \"{serving_router_unit}\"\ndrain_timeout_ms = {drain_timeout_ms}\n"
            ),
        )
    }

    fn agent() -> FakeAgent {
        FakeAgent::new(
            "h1",
            vec![
                UnitModel::new("prefill-0", Role::Prefill),
                UnitModel::new("decode-0", Role::Decode),
                UnitModel::new("router-0", Role::Router),
                UnitModel::new("other-prefill", Role::Prefill),
                UnitModel::new("other-decode", Role::Decode),
                UnitModel::new("shared-router", Role::Router),
            ],
        )
        .with_serving_router("shared-router")
    }

    fn begin(journal: &Journal, request_id: Option<&str>) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        journal.begin(&id, "co_restart", "p", request_id).unwrap();
        id
    }

    async fn co_restart(ctx: OperationContext, journal: &Journal, pair: crate::config::PairConfig) -> OperationReport {
        let id = begin(journal, None);
        let (tx, _rx) = mpsc::unbounded_channel();
        run_operation(ctx, pair, id, OperationKind::CoRestart, tx).await
    }

    /// While the operation runs, samples (every simulated ms) whether the
    /// serving router lists one of the pair's engines while a unit of the
    /// pair is not generating: the moments clients could reach a pair that
    /// is restarting. Returns those moments, described.
    fn watch_rotation(
        agent: &FakeAgent,
        op: &tokio::task::JoinHandle<OperationReport>,
    ) -> tokio::task::JoinHandle<Vec<String>> {
        let agent = agent.clone();
        let done = op.abort_handle();
        tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..600_000 {
                if done.is_finished() {
                    break;
                }
                let listed = agent.router_lists();
                let restarting: Vec<&str> = UNITS
                    .into_iter()
                    .filter(|u| agent.unit_phase(u) != Phase::Generating)
                    .collect();
                if !restarting.is_empty() && OURS.iter().any(|u| listed.iter().any(|l| l == u)) {
                    seen.push(format!("listed while {restarting:?} restart"));
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            seen
        })
    }

    /// Issue 18, point 1: out of rotation before anything stops, the wait
    /// ends when the engines' own gauges read idle (decode busy 3 s: the
    /// drain takes that long, not a fixed settle), the restart in order,
    /// back in rotation only after the healthy verdict; the other pair's
    /// engines are never touched.
    #[tokio::test(start_paused = true)]
    async fn a_shared_router_pair_leaves_rotation_drains_and_comes_back_after_a_healthy_verdict() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        let ctx = orchestrator(&journal, &agent).await;
        agent.busy_for("decode-0", 3_000);
        let pair = pair("shared-router", 60_000);
        let op = {
            let journal = journal.clone();
            tokio::spawn(async move { co_restart(ctx, &journal, pair).await })
        };
        let rotation = watch_rotation(&agent, &op);
        let report = op.await.unwrap();
        assert!(
            rotation.await.unwrap().is_empty(),
            "clients could reach the restarting pair"
        );
        assert!(report.verdict.is_healthy(), "{:?}", report.reasons);
        let d = report.drain.as_ref().expect("the report's drain section");
        assert_eq!(d.removed.iter().map(|w| w.url.as_str()).collect::<Vec<_>>(), OURS);
        let (out, drained) = (d.out_at_ms.unwrap(), d.drained_at_ms.unwrap());
        assert!(
            (3_000..6_000).contains(&(drained - out)),
            "the wait follows the engines' gauges: {out} → {drained}"
        );
        let first_spawn = report
            .timeline
            .iter()
            .filter(|t| t.phase == "spawned")
            .map(|t| t.at_ms)
            .min()
            .unwrap();
        assert!(first_spawn >= drained, "nothing restarted before the drain ended");
        assert!(d.rejoin.as_ref().is_some_and(|r| r.put_back), "{d:?}");
        let listed = agent.router_lists();
        for u in OURS.iter().chain(&THEIRS) {
            assert!(
                listed.iter().any(|l| l == u),
                "{u} is in rotation at the end: {listed:?}"
            );
        }
        for (op, urls, _) in agent.router_calls() {
            assert!(
                !THEIRS.iter().any(|t| urls.iter().any(|u| u == t)),
                "the other pair's engines were never named: {op} {urls:?}"
            );
        }
        for u in UNITS {
            assert_eq!(agent.starts_of(u), 1);
        }
        assert_eq!(
            agent.starts_of("shared-router"),
            0,
            "the serving router is never restarted"
        );
        assert!(
            report
                .reasons
                .iter()
                .any(|r| r.contains("taken out of the serving router h1/shared-router")),
            "{:?}",
            report.reasons
        );
    }

    /// A drain that runs out is reported with what was in flight, and the
    /// restart goes on.
    #[tokio::test(start_paused = true)]
    async fn a_drain_that_runs_out_is_reported_and_the_restart_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        let ctx = orchestrator(&journal, &agent).await;
        agent.busy_for("decode-0", 600_000);
        let report = co_restart(ctx, &journal, pair("shared-router", 2_000)).await;
        let d = report.drain.as_ref().unwrap();
        assert!(d.timed_out, "{d:?}");
        assert_eq!(d.in_flight_left, ["h1/decode-0: 1 in flight"]);
        assert!(report.verdict.is_healthy(), "{:?}", report.reasons);
        assert!(
            report
                .reasons
                .iter()
                .any(|r| r.contains("the drain timed out with work still in flight")),
            "{:?}",
            report.reasons
        );
    }

    /// Issue 32: the journal fails at every write of a co-restart behind a
    /// serving router (drain, restart, rejoin), and every write after it,
    /// then has room again. No engine is taken out of rotation and no unit
    /// started without its write-ahead entry; never healthy with a write
    /// failed before the conclusion, naming the journal; once the disk has
    /// room the operation concludes, every unit runs, and each engine of
    /// the pair is back in the serving router or the report says it is
    /// left out.
    #[tokio::test(start_paused = true)]
    async fn a_journal_that_fails_at_any_write_of_a_drained_co_restart_leaves_nothing_unrecorded() {
        fail_from_every_write(
            async |fail_from| {
                let dir = tempfile::tempdir().unwrap();
                let journal = journal(&dir);
                let agent = agent();
                let ctx = orchestrator(&journal, &agent).await;
                let id = begin(&journal, None);
                let before = fail_writes_from(&journal, fail_from);
                let (tx, _rx) = mpsc::unbounded_channel();
                let report = run_operation(
                    ctx,
                    pair("shared-router", 60_000),
                    id.clone(),
                    OperationKind::CoRestart,
                    tx,
                )
                .await;
                let writes = journal.writes_seen() - before;
                ((report, agent, journal, dir, id), writes)
            },
            |(clean, ..), _| {
                assert!(clean.verdict.is_healthy(), "{:?}", clean.reasons);
                assert!(
                    clean.drain.as_ref().is_some_and(|d| d.removed.len() == 2),
                    "{:?}",
                    clean.drain
                );
            },
            async |n, total, (report, agent, journal, _dir, id)| {
                let mut broken = Vec::new();
                let at = format!("writes failing from write {n} of {total}");
                let reasons = &report.reasons;
                broken.extend(
                    crate::ops::fake_agent::rig::done_unrecorded(&journal, std::slice::from_ref(&id), &agent)
                        .into_iter()
                        .map(|d| format!("{at}: {d}")),
                );
                let names_journal = reasons
                    .iter()
                    .any(|l| l.starts_with("stopped: the journal could not record a step"));
                if n + 1 < total && (report.verdict.is_healthy() || !names_journal) {
                    broken.push(format!(
                        "{at}: {} without naming the journal: {reasons:?}",
                        report.verdict.as_str()
                    ));
                }
                broken.extend(healed_nothing_running(&journal, &at).await);
                for u in UNITS {
                    if agent.unit_phase(u) != Phase::Generating {
                        broken.push(format!("{at}: {u} left {:?}", agent.unit_phase(u)));
                    }
                    if agent.starts_of(u) > 1 {
                        broken.push(format!("{at}: {u} started {} times", agent.starts_of(u)));
                    }
                }
                let listed = agent.router_lists();
                let out: Vec<&str> = OURS.into_iter().filter(|u| !listed.iter().any(|l| l == u)).collect();
                if !out.is_empty() && !reasons.iter().any(|r| r.contains("left out of the serving router")) {
                    broken.push(format!("{at}: {out:?} out of the serving router, unsaid: {reasons:?}"));
                }
                broken
            },
        )
        .await;
    }

    /// A pair that is not healthy after its restart stays out of rotation.
    #[tokio::test(start_paused = true)]
    async fn a_pair_that_is_not_healthy_stays_out_of_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        let ctx = orchestrator(&journal, &agent).await;
        let op = {
            let journal = journal.clone();
            tokio::spawn(async move { co_restart(ctx, &journal, pair("shared-router", 60_000)).await })
        };
        for _ in 0..600_000 {
            if agent.starts_of("router-0") == 1 && agent.unit_phase("router-0") == Phase::Generating {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        agent.crash("router-0", "killed by signal 9 (SIGKILL)");
        let report = op.await.unwrap();
        assert!(!report.verdict.is_healthy(), "{:?}", report.reasons);
        let listed = agent.router_lists();
        assert!(!OURS.iter().any(|u| listed.iter().any(|l| l == u)), "{listed:?}");
        assert!(THEIRS.iter().all(|u| listed.iter().any(|l| l == u)), "{listed:?}");
        assert!(
            report
                .reasons
                .iter()
                .any(|r| r.starts_with("left out of the serving router")),
            "{:?}",
            report.reasons
        );
        assert!(
            !agent
                .router_calls()
                .iter()
                .any(|(op, ..)| *op == RouterWorkersOp::Add as i32),
            "nothing is added back"
        );
    }

    /// A KV path the serving router would create between the pair and the
    /// other engines fails (twice): the pair is healthy alone but kept out,
    /// with the path named — clients never meet it.
    #[tokio::test(start_paused = true)]
    async fn a_pair_whose_kv_paths_to_the_other_engines_fail_is_kept_out() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        let ctx = orchestrator(&journal, &agent).await;
        agent.break_kv_path("http://fake/other-prefill", "http://fake/decode-0");
        let report = co_restart(ctx, &journal, pair("shared-router", 60_000)).await;
        assert!(!report.verdict.is_healthy(), "{:?}", report.reasons);
        let listed = agent.router_lists();
        assert!(
            !OURS.iter().any(|u| listed.iter().any(|l| l == u)),
            "kept out: {listed:?}"
        );
        assert!(THEIRS.iter().all(|u| listed.iter().any(|l| l == u)), "{listed:?}");
        let kept_out = report
            .reasons
            .iter()
            .find(|r| r.contains("KEPT OUT of the serving router"))
            .unwrap_or_else(|| panic!("{:?}", report.reasons));
        assert!(
            kept_out.contains("1 of the 2 KV paths")
                && kept_out.contains("http://fake/other-prefill → http://fake/decode-0"),
            "{kept_out}"
        );
    }

    /// A serving router that cannot be driven stops a co-restart before any
    /// unit is touched; a recovery of a wedge goes on (its pair is broken).
    #[tokio::test(start_paused = true)]
    async fn a_drain_that_cannot_be_done_touches_nothing_except_for_a_recovery() {
        for recovery in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let journal = journal(&dir);
            let agent = agent();
            let ctx = orchestrator(&journal, &agent).await;
            let id = if recovery {
                let id = begin(&journal, Some("auto-x"));
                journal
                    .append(&id, 0, "trigger", &serde_json::json!({ "automatic": true }))
                    .unwrap();
                id
            } else {
                begin(&journal, None)
            };
            let (tx, _rx) = mpsc::unbounded_channel();
            // "router-0"'s agent has no worker API for it: the fake's
            // serving router is "shared-router".
            let mut p = pair("shared-router", 60_000);
            p.serving_router.as_mut().unwrap().unit = "not-a-router".into();
            let report = run_operation(ctx, p, id, OperationKind::CoRestart, tx).await;
            if recovery {
                assert!(report.verdict.is_healthy(), "{:?}", report.reasons);
                assert_eq!(agent.starts_of("decode-0"), 1);
            } else {
                assert!(!report.verdict.is_healthy());
                assert!(agent.executed().is_empty(), "{:?}", agent.executed());
                assert!(report.reasons[0].starts_with("not restarted"), "{:?}", report.reasons);
                assert!(
                    report.reasons[1].starts_with("drain through the serving router h1/not-a-router"),
                    "{:?}",
                    report.reasons
                );
            }
            assert!(journal.unfinished().unwrap().is_empty());
        }
    }

    /// The recovery of a wedge takes the pair out without waiting for work
    /// that will not finish.
    #[tokio::test(start_paused = true)]
    async fn a_recovery_does_not_wait_for_a_wedged_pairs_work() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        let ctx = orchestrator(&journal, &agent).await;
        agent.busy_for("decode-0", 600_000);
        let id = begin(&journal, Some("auto-x"));
        journal
            .append(&id, 0, "trigger", &serde_json::json!({ "automatic": true }))
            .unwrap();
        let (tx, _rx) = mpsc::unbounded_channel();
        let report = run_operation(ctx, pair("shared-router", 60_000), id, OperationKind::CoRestart, tx).await;
        let d = report.drain.as_ref().unwrap();
        assert!(!d.waited && !d.timed_out && d.drained_at_ms.is_none(), "{d:?}");
        assert!(report.total_ms < 30_000, "no drain wait: {} ms", report.total_ms);
        assert!(report.verdict.is_healthy(), "{:?}", report.reasons);
    }

    /// The orchestrator killed at every journal entry of a drained
    /// co-restart: each unit started once, the pair back in rotation at the
    /// end, and never in rotation while one of its units restarts.
    #[tokio::test(start_paused = true)]
    async fn killed_at_every_point_a_drained_co_restart_starts_each_unit_once_and_rejoins() {
        let mut states = std::collections::BTreeSet::new();
        kill_at_every_point(
            async || {
                let dir = tempfile::tempdir().unwrap();
                let journal = journal(&dir);
                let agent = agent();
                let id = begin(&journal, None);
                let ctx = orchestrator(&journal, &agent).await;
                (dir, journal, agent, id, ctx)
            },
            |(_, _, _, id, ctx)| {
                let (tx, _rx) = mpsc::unbounded_channel();
                run_operation(
                    ctx.clone(),
                    pair("shared-router", 60_000),
                    id.clone(),
                    OperationKind::CoRestart,
                    tx,
                )
            },
            |(_, journal, _, id, _)| journal.entries(id).unwrap().len(),
            async |k, (_dir, journal, agent, _, _)| {
                let op = journal.unfinished().unwrap().pop().unwrap();
                let at = format!("killed after entry {k} in state {}", op.state);
                states.insert(op.state.clone());
                let resumed = tokio::spawn(resume(
                    orchestrator(&journal, &agent).await,
                    pair("shared-router", 60_000),
                    op,
                ));
                let rotation = watch_rotation(&agent, &resumed);
                let report = resumed.await.unwrap();
                assert!(report.verdict.is_healthy(), "{at}: {:?}", report.reasons);
                for u in UNITS {
                    assert_eq!(agent.starts_of(u), 1, "{at}: {:?}", agent.executed());
                }
                let listed = agent.router_lists();
                assert!(OURS.iter().all(|u| listed.iter().any(|l| l == u)), "{at}: {listed:?}");
                assert!(rotation.await.unwrap().is_empty(), "{at}: in rotation while restarting");
            },
        )
        .await;
        for s in ["draining", "restarting_prefill", "probing", "rejoining"] {
            assert!(states.contains(s), "never killed in {s}: {states:?}");
        }
    }
}
