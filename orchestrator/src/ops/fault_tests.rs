//! The fault-injection suite (issue 16): a co-restart over the fake agent,
//! at paused time, run once through every failpoint — each journal write
//! (`Journal::fail_writes`: the disk full at that write) and each command
//! send (`FakePort::fail_sends`: the link gone at that send) — one fault per
//! run, and every run held to the invariants:
//!
//! 1. the operation concludes (once the disk has room again: a conclusion
//!    it refused is written then) and its pair is released;
//! 2. no unit is started twice;
//! 3. nothing is left stopped: every unit runs at the end (a start the
//!    operation did not send never stopped its unit);
//! 4. a healthy verdict means the whole ordered restart happened.
//!
//! The failpoints are per journal and per port, so these runs never touch
//! another test's.

use std::sync::Arc;
use std::time::Duration;

use pdwarden_proto::v1::Phase;
use tokio::sync::mpsc;

use crate::ops::OperationContext;
use crate::ops::corestart::{OperationKind, run_operation};
use crate::ops::fake_agent::FakePort;
use crate::ops::fake_agent::rig::{UNITS, agent, journal, pair};

#[derive(Debug, Clone, Copy)]
enum Fault {
    None,
    Write(usize),
    Send(usize),
}

/// What one run came to.
struct Run {
    writes: usize,
    sends: usize,
    violations: Vec<String>,
    healthy: bool,
}

async fn run(fault: Fault) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let journal = journal(&dir);
    let agent = agent();
    let port = FakePort::default();
    agent.attach(&port).await;
    match fault {
        Fault::Write(k) => journal.fail_writes([k]),
        Fault::Send(k) => port.fail_sends([k]),
        Fault::None => {}
    }
    let ctx = OperationContext {
        agents: Arc::new(port.clone()),
        journal: journal.clone(),
    };
    let mut violations = Vec::new();
    let mut healthy = false;
    // The one way an operation starts (its begin is a journal write too).
    match ctx.begin("co_restart", "p", Some("r1"), &[]) {
        Err(_) => {}
        Ok(id) => {
            let (tx, _rx) = mpsc::unbounded_channel();
            let op = crate::ops::guarded(
                &journal,
                &id,
                run_operation(
                    ctx.clone(),
                    pair("after-prefill-ready", ""),
                    id.clone(),
                    OperationKind::CoRestart,
                    tx,
                ),
            );
            match tokio::time::timeout(Duration::from_secs(600), op).await {
                Err(_) => violations.push("the operation never ended".into()),
                Ok(Err(panic)) => violations.push(format!("the operation panicked: {panic}")),
                Ok(Ok(report)) => healthy = report.verdict.is_healthy(),
            }
        }
    }
    let (writes, sends) = (journal.writes_seen(), port.sends_seen());
    // The disk has room again: a refused conclusion is written.
    journal.heal();
    journal.flush_pending();
    // Work the agent was already doing ends.
    tokio::time::sleep(Duration::from_secs(30)).await;
    if let Ok(open) = journal.unfinished()
        && !open.is_empty()
    {
        violations.push(format!(
            "left running: {:?}",
            open.iter().map(|o| &o.state).collect::<Vec<_>>()
        ));
    }
    if let Err(e) = journal.begin("next", "co_restart", "p", None) {
        violations.push(format!("the pair is not released: {e}"));
    }
    for u in UNITS {
        let starts = agent.starts_of(u);
        if starts > 1 {
            violations.push(format!("{u} started {starts} times"));
        }
        if agent.unit_phase(u) != Phase::Generating {
            violations.push(format!("{u} left {:?}", agent.unit_phase(u)));
        }
        if healthy && starts != 1 {
            violations.push(format!("healthy, yet {u} was started {starts} times"));
        }
    }
    Run {
        writes,
        sends,
        violations,
        healthy,
    }
}

#[tokio::test(start_paused = true)]
async fn a_co_restart_through_every_failpoint_keeps_the_invariants() {
    let clean = run(Fault::None).await;
    assert!(clean.violations.is_empty() && clean.healthy, "{:?}", clean.violations);
    assert!(
        clean.writes > 10 && clean.sends >= 4,
        "{} writes, {} sends",
        clean.writes,
        clean.sends
    );
    let mut faults: Vec<Fault> = (1..=clean.writes).map(Fault::Write).collect();
    faults.extend((1..=clean.sends).map(Fault::Send));
    let mut broken = Vec::new();
    let mut unhealthy = 0;
    for f in &faults {
        let r = run(*f).await;
        if !r.healthy {
            unhealthy += 1;
        }
        if !r.violations.is_empty() {
            broken.push(format!("{f:?}: {:?}", r.violations));
        }
    }
    println!(
        "fault injection: {} runs ({} journal writes, {} command sends, one fault each), {unhealthy} not healthy, {} invariant violations",
        faults.len(),
        clean.writes,
        clean.sends,
        broken.len()
    );
    assert!(broken.is_empty(), "{broken:#?}");
}
