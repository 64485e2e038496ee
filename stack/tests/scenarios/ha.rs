//! Issue 19: several orchestrators on a real etcd cluster (three members on
//! loopback, Debian's etcd-server), one leading. Real orchestrator, agent,
//! pd-sim and sglang-router processes; the leader is SIGKILLed mid
//! co-restart, frozen mid co-restart past its lease (SIGSTOP) and woken
//! after another leads, etcd loses its quorum mid co-restart.
//!
//! Built only with `--features pdwarden-stack/etcd` (scripts/test.sh does,
//! after scripts/setup-etcd.sh installs etcd and protoc).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use pdwarden_stack::drill::{CrashAt, spawns_since};
use pdwarden_stack::ha::HaStack;
use serde_json::Value;

use crate::harness::{exclusive, runtime};

/// The lease of the scenarios' orchestrators: the shortest etcd allows with
/// a 1 s election timeout.
const LEASE_TTL_S: u64 = 2;

async fn start() -> HaStack {
    let args = pdwarden_stack::DemoArgs::from_flags(&["--json"]).expect("demo flags");
    tokio::time::timeout(
        Duration::from_secs(120),
        HaStack::start(&args, Default::default(), LEASE_TTL_S),
    )
    .await
    .expect("the HA stack started within 120 s")
    .unwrap_or_else(|e| panic!("the HA stack: {e:#}"))
}

/// Asks orchestrator `ask` for `restart pd-pair demo` as the CLI does
/// (followed in the background: its stream breaks with the kill; a
/// follower's refusal is followed to the leader it names) and waits until
/// the operation's journaled state on `leader` is `at` (for decode's step,
/// until the new decode is loading); the operation id.
async fn co_restart_until(ha: &HaStack, ask: usize, leader: usize, at: CrashAt) -> String {
    let conn = ha.orchestrators[ask].connection.clone();
    tokio::spawn(async move {
        let _ = conn
            .follow("demo", None, pdwarden_client::new_request_id(), |_| {})
            .await;
    });
    pdwarden_stack::drill::reached(&ha.orchestrators[leader].connection, at, Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"))
        .0
}

/// `restart pd-pair demo` sent to orchestrator `i`, which must refuse it.
async fn restart_refused(ha: &HaStack, i: usize) -> tonic::Status {
    let mut c = ha.orchestrators[i].connection.connect().await.unwrap();
    c.restart_pair(pdwarden_proto::v1::RestartPairRequest {
        pair: "demo".into(),
        request_id: pdwarden_client::new_request_id(),
        rolling: false,
        only_sick: false,
    })
    .await
    .expect_err("the restart is refused")
}

fn agent_log_len(ha: &HaStack) -> u64 {
    std::fs::metadata(ha.dir.path().join("agent.log")).map_or(0, |m| m.len())
}

/// Waits (30 s from `since`) until orchestrator `i`, deposed, exits:
/// non-zero, its log saying why and that running units were not touched.
async fn exits_saying_why(ha: &mut HaStack, i: usize, since: Instant, what: &str) -> std::process::ExitStatus {
    let status = loop {
        if let Some(s) = ha.orchestrator_exited(i) {
            break s;
        }
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "{what} kept running:\n{}",
            ha.orchestrator_log(i)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!status.success(), "{what}: a deposed leader exits non-zero: {status}");
    let log = ha.orchestrator_log(i);
    assert!(
        log.contains("lost the leadership") && log.contains("running units were not touched"),
        "{what} says why it stopped: {}",
        log.lines().rev().take(5).collect::<Vec<_>>().join("\n")
    );
    status
}

/// Each of the pair's units spawned exactly once in `spawned`.
fn assert_each_unit_started_once(spawned: &BTreeMap<String, u64>, what: &str) {
    let expected: BTreeMap<String, u64> = ["prefill-0", "decode-0", "router-0"]
        .iter()
        .map(|u| (u.to_string(), 1))
        .collect();
    assert_eq!(spawned, &expected, "{what}: each unit started exactly once");
}

fn median_and_worst(xs: &mut [Duration]) -> (Duration, Duration) {
    xs.sort();
    (xs[xs.len() / 2], xs[xs.len() - 1])
}

/// The leader SIGKILLed at each co-restart step: a follower takes the
/// leadership after the lease, the agent follows it, the operation is
/// taken over from the shared journal and concluded healthy, and no unit is
/// started twice. The new leader's fencing token is higher and the agent
/// has persisted it (a command from the dead term would be refused). A
/// mutating call to a follower is refused naming the leader.
#[test]
fn a_leader_killed_at_each_co_restart_step_is_replaced_and_the_operation_concluded_once() {
    let _one = exclusive();
    let rt = runtime();
    rt.block_on(async {
        let mut ha = start().await;
        let units = 3;
        let mut failovers = Vec::new();
        let mut moving = Vec::new();
        for at in [
            CrashAt::RestartingPrefill,
            CrashAt::RestartingDecode,
            CrashAt::RestartingRouter,
            CrashAt::Verifying,
        ] {
            let (leader, token) = ha
                .wait_leader_with_agent(units, Duration::from_secs(60))
                .await
                .unwrap_or_else(|e| panic!("{e:#}"));
            // A follower refuses a restart, naming the leader.
            let follower = (0..3).find(|i| *i != leader).unwrap();
            let refused = restart_refused(&ha, follower).await;
            assert_eq!(refused.code(), tonic::Code::Unavailable);
            assert!(
                refused.message().contains(&ha.orchestrators[leader].url),
                "the refusal names the leader: {}",
                refused.message()
            );
            // Asked of the follower, which sends the CLI to the leader; the
            // leader SIGKILLed in `at` (the drill `pdwarden demo --incident
            // leader-crash` runs).
            let v = pdwarden_stack::ha::leader_crash(&mut ha, follower, at, true)
                .await
                .unwrap_or_else(|e| panic!("killed in {}: {e:#}", at.state()));
            let (op, record) = (v["operation_id"].as_str().unwrap().to_string(), v["record"].clone());
            let new = v["new_leader"]["orchestrator"].as_u64().unwrap() as usize;
            let new_token = v["new_leader"]["fencing_token"].as_u64().unwrap();
            let serving = Duration::from_millis(v["leader_serving_ms"].as_u64().unwrap());
            let moved = Duration::from_millis(v["operation_moving_ms"].as_u64().unwrap());
            assert_eq!(v["killed"]["orchestrator"], leader);
            assert_ne!(new, leader);
            assert!(new_token > token, "the new term's token {new_token} is above the old {token}");
            assert!(
                record["verdict"].as_str().unwrap_or("").starts_with("healthy"),
                "killed in {}: {:#}",
                at.state(),
                record
            );
            let reasons = record["report"]["reasons"].to_string();
            assert!(
                reasons.contains("resumed after an orchestrator restart") && reasons.contains(&format!("state {}", at.state())),
                "taken over from the journal in {}: {reasons}",
                at.state()
            );
            assert_each_unit_started_once(
                &serde_json::from_value(v["spawned"].clone()).unwrap(),
                &format!("killed in {}", at.state()),
            );
            // A follower serves the same history from the shared journal.
            let other = (0..3)
                .find(|i| *i != new && *i != leader)
                .expect("a third orchestrator");
            // (the killed one was started again by the drill, as its
            // service manager would; it may not serve yet)
            let mut oc = ha.orchestrators[other].connection.connect().await.unwrap();
            let h: Value = serde_json::from_str(
                &oc.history(pdwarden_proto::v1::HistoryRequest {
                    pair: "demo".into(),
                    limit: 1,
                    ..Default::default()
                })
                .await
                .expect("a follower serves history")
                .into_inner()
                .json,
            )
            .unwrap();
            assert_eq!(h[0]["operation_id"], op, "follower {other}'s history");
            assert_eq!(h[0]["verdict"], record["verdict"]);
            assert_eq!(
                ha.agent_fencing_floor(),
                Some(new_token),
                "the agent persisted the new leader's token"
            );
            eprintln!(
                "ha: killed in {}: orchestrator {new} leads (token {new_token}) {} ms after the kill, the operation moving {} ms after; verdict {}",
                at.state(),
                serving.as_millis(),
                moved.as_millis(),
                record["verdict"]
            );
            failovers.push(serving);
            moving.push(moved);
        }
        // A planned stop of the leader (SIGTERM: an upgrade): it resigns,
        // exits cleanly, and a follower leads without waiting for its lease.
        let (leader, token) = ha.wait_leader_with_agent(units, Duration::from_secs(60)).await.unwrap();
        let stopped_at = Instant::now();
        let status = ha
            .terminate_orchestrator(leader, Duration::from_secs(15))
            .expect("the leader stops on SIGTERM");
        assert!(status.success(), "a planned stop exits 0: {status}");
        assert!(
            ha.orchestrator_log(leader).contains("resigned the leadership"),
            "it resigned"
        );
        let (new, new_token) = ha.wait_leader_with_agent(units, Duration::from_secs(60)).await.unwrap();
        assert!(new != leader && new_token > token);
        eprintln!(
            "ha: leader {leader} SIGTERMed: it resigned and exited; orchestrator {new} leads with the agent {} ms after the signal",
            stopped_at.elapsed().as_millis()
        );
        let (m, w) = median_and_worst(&mut failovers);
        let (mm, mw) = median_and_worst(&mut moving);
        eprintln!(
            "ha: failover over {} kills (lease {LEASE_TTL_S} s): new leader serving median {} ms, worst {} ms; operation moving again median {} ms, worst {} ms",
            failovers.len(),
            m.as_millis(),
            w.as_millis(),
            mm.as_millis(),
            mw.as_millis()
        );
        ha.stop(false);
    });
}

/// etcd loses its quorum mid co-restart (two of three members SIGKILLed
/// while the new decode loads): the leader stops leading and exits with a
/// clear error, no unit is started or stopped meanwhile, the followers say
/// why none leads and refuse a new restart. Quorum back: an orchestrator
/// leads, takes the operation over and concludes it, each unit started once.
/// A partitioned old leader: frozen mid co-restart (SIGSTOP — a paused VM,
/// a long stall, a host cut off without a reset: its sockets stay open, its
/// lease runs out, it still believes it leads). A follower leads after the
/// lease; the agent, its link to the frozen leader dead by HTTP/2
/// keepalive, attaches to the new leader and takes its higher token; the
/// new leader takes the operation over and concludes it. Then the old
/// leader wakes, in the middle of what it was doing: it must not act —
/// its journal writes are refused by etcd's fence, which makes it a
/// follower before it can send a command (`Fence::lose`), and any command
/// of its term would meet an agent that has seen a higher token — so it
/// exits saying why, and no unit is started twice.
#[test]
fn a_frozen_old_leader_wakes_fenced_out_and_the_operation_is_concluded_once() {
    let _one = exclusive();
    let rt = runtime();
    rt.block_on(async {
        let mut ha = start().await;
        let (leader, token) = ha.wait_leader_with_agent(3, Duration::from_secs(60)).await.unwrap();
        let from = agent_log_len(&ha);
        let op = co_restart_until(&ha, leader, leader, CrashAt::RestartingDecode).await;
        ha.pause_orchestrator(leader).expect("the leader runs");
        let paused_at = Instant::now();
        let (new, new_token) = ha
            .wait_leader_with_agent(3, Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        let serving = paused_at.elapsed();
        assert_ne!(new, leader);
        assert!(new_token > token, "the new term's token {new_token} is above the old {token}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while ha.agent_fencing_floor() != Some(new_token) {
            assert!(
                Instant::now() < deadline,
                "the agent never persisted the new token {new_token}: {:?}",
                ha.agent_fencing_floor()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let record = pdwarden_stack::ha::concluded(&ha, &op, Duration::from_secs(120))
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        let concluded_after = paused_at.elapsed();
        assert!(
            record["verdict"].as_str().unwrap_or("").starts_with("healthy"),
            "{:#}",
            record["report"]["reasons"]
        );
        let before_wake = spawns_since(&ha.dir.path().join("agent.log"), from);
        // The old leader wakes.
        ha.resume_orchestrator(leader);
        let woke = Instant::now();
        let status = exits_saying_why(&mut ha, leader, woke, "the woken old leader").await;
        // Nothing it did reached a unit: the spawns are what they were, one each.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let after = spawns_since(&ha.dir.path().join("agent.log"), from);
        assert_eq!(before_wake, after, "nothing started after the old leader woke");
        assert_each_unit_started_once(&after, "a frozen leader woken");
        assert_eq!(ha.agent_fencing_floor(), Some(new_token));
        let (still, _) = ha.leader().await.expect("a leader");
        assert_eq!(still, new, "the new leader still leads");
        eprintln!(
            "ha: leader {leader} frozen in restarting_decode: orchestrator {new} leads with the agent {} ms after, the operation concluded {} after {} ms; woken, the old leader exited in {} ms ({status})",
            serving.as_millis(),
            record["verdict"],
            concluded_after.as_millis(),
            woke.elapsed().as_millis()
        );
        ha.stop(false);
    });
}

#[test]
fn quorum_lost_mid_co_restart_stops_safely_and_recovers() {
    let _one = exclusive();
    let rt = runtime();
    rt.block_on(async {
        let mut ha = start().await;
        let (leader, _) = ha.wait_leader_with_agent(3, Duration::from_secs(60)).await.unwrap();
        // Issue 36: a follower answers `status` with the leader's fleet, as
        // the leader published it to etcd, under its own role.
        let reader = (0..3).find(|i| *i != leader).unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let s = ha.status(reader).await;
            if let Some(s) = &s
                && s["published"]["age_ms"].is_number()
                && s["fleet"]["hosts"] == 1
                && s["agents"][0]["units"].as_array().is_some_and(|u| !u.is_empty())
            {
                assert_eq!(s["leadership"]["role"], "follower", "{:#}", s["leadership"]);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the follower never answered with the leader's fleet: {s:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let from = agent_log_len(&ha);
        let op = co_restart_until(&ha, leader, leader, CrashAt::RestartingDecode).await;
        ha.etcd.kill(1);
        ha.etcd.kill(2);
        let lost_at = Instant::now();
        // The leader stops: it exits, saying why.
        exits_saying_why(&mut ha, leader, lost_at, "the leader without a quorum").await;
        // The followers say why none leads, and refuse a restart.
        let follower = (0..3).find(|i| *i != leader).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = ha.status(follower).await;
            if let Some(s) = &s
                && s["leadership"]["role"] == "follower"
                && s["leadership"]["why"].as_str().unwrap_or("").contains("quorum")
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the follower never said etcd lost its quorum: {:?}\n{}",
                s.map(|s| s["leadership"].clone()),
                ha.orchestrator_log(follower)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let refused = restart_refused(&ha, follower).await;
        assert!(
            refused.message().contains("no orchestrator leads"),
            "{}",
            refused.message()
        );
        // Nothing was started or stopped while no one led.
        let during = spawns_since(&ha.dir.path().join("agent.log"), from);
        assert!(
            during.values().all(|n| *n <= 1) && !during.contains_key("router-0"),
            "only what was started before the quorum went: {during:?}"
        );
        tokio::time::sleep(Duration::from_secs(LEASE_TTL_S + 1)).await;
        let still = spawns_since(&ha.dir.path().join("agent.log"), from);
        assert_eq!(during, still, "no step started while etcd had no quorum");
        // Quorum back: an orchestrator leads and concludes the operation.
        ha.etcd.restart(1).unwrap();
        ha.etcd.restart(2).unwrap();
        ha.etcd.wait_healthy(Duration::from_secs(30)).await.unwrap();
        let back = Instant::now();
        let (new, _) = ha
            .wait_leader_with_agent(3, Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        assert_ne!(new, leader, "the exited leader was not restarted");
        let record = pdwarden_stack::ha::concluded(&ha, &op, Duration::from_secs(120))
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        assert!(
            record["verdict"].as_str().unwrap_or("").starts_with("healthy"),
            "{:#}",
            record["report"]["reasons"]
        );
        assert_each_unit_started_once(
            &spawns_since(&ha.dir.path().join("agent.log"), from),
            "quorum lost and back",
        );
        eprintln!(
            "ha: quorum back -> orchestrator {new} leads with the agent {} ms later; operation concluded {}",
            back.elapsed().as_millis(),
            record["verdict"]
        );
        ha.stop(false);
    });
}
