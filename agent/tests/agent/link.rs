//! The whole agent in-process against a fake orchestrator: registration,
//! start-up events and check attempts over gRPC, at-most-once commands,
//! probes, crash reports, reconnects and shutdown behaviour; with several
//! orchestrators (issue 19), following the leader a follower names and
//! refusing a deposed leader by its fencing token.

use std::path::Path;

use pdwarden_agent::AgentConfig;
use pdwarden_proto::v1::{
    AgentMessage, AttemptOutcome, ChatProbe, CheckAttempt, CheckKind, Command, CommandResult, OrchestratorMessage,
    Phase, ProbeOutcome, ProbeRequest, ProbeResult, ReadinessSpec, Register, RegisterAck, StartUnit, StopUnit,
    UnitEvent, agent_message::Kind, command::Action, orchestrator_message,
};

use crate::util::{
    Agent, EVENT_DEADLINE, EngineScript, FakeEngine, FakeOrchestrator, PidGuard, Session, alive, wait_until,
};

fn config(orchestrator: &str, state_dir: &Path, engine_url: &str, on_exit: &str) -> AgentConfig {
    config_toml(&format!("\"{orchestrator}\""), state_dir, engine_url, on_exit)
}

/// `orchestrator` is the field's TOML value: a string or a list.
fn config_toml(orchestrator: &str, state_dir: &Path, engine_url: &str, on_exit: &str) -> AgentConfig {
    AgentConfig::from_toml_str(&format!(
        r#"
        host = "test-host"
        orchestrator = {orchestrator}
        insecure_plaintext = true
        state_dir = {state_dir:?}
        on_exit = "{on_exit}"
        shutdown_grace_ms = 2000
        [[unit]]
        name = "prefill-0"
        role = "prefill"
        argv = ["sleep", "30"]
        base_url = "{engine_url}"
        bootstrap_port = 8998
        "#
    ))
    .unwrap()
}

fn command(id: &str, action: Action) -> OrchestratorMessage {
    OrchestratorMessage {
        kind: Some(orchestrator_message::Kind::Command(Command {
            fencing_token: 0,
            command_id: id.into(),
            action: Some(action),
        })),
    }
}

fn start(unit: &str) -> Action {
    Action::Start(StartUnit {
        unit: unit.into(),
        restart: true,
        stop_grace_ms: 2_000,
        readiness: Some(ReadinessSpec {
            deadline_ms: 20_000,
            poll_interval_ms: 20,
            check_timeout_ms: 2_000,
            chat: None,
        }),
    })
}

async fn register(s: &mut Session) -> Register {
    match s.next().await.kind {
        Some(Kind::Register(r)) => r,
        other => panic!("first message must be Register, got {other:?}"),
    }
}

/// Reads messages (skipping heartbeats) until `pick` returns Some; the
/// skipped ones are returned too, in order.
async fn until<T>(s: &mut Session, mut pick: impl FnMut(&AgentMessage) -> Option<T>) -> (T, Vec<AgentMessage>) {
    let mut seen = Vec::new();
    loop {
        let m = s.next().await;
        if matches!(m.kind, Some(Kind::Heartbeat(_))) {
            continue;
        }
        if let Some(t) = pick(&m) {
            return (t, seen);
        }
        seen.push(m);
    }
}

/// A phase change to `phase` (not an attempt event).
fn event(m: &AgentMessage, phase: Phase) -> Option<UnitEvent> {
    match &m.kind {
        Some(Kind::UnitEvent(e)) if e.attempt.is_none() && e.phase == phase as i32 => Some(e.clone()),
        _ => None,
    }
}

/// A check-attempt event (the event, and its attempt).
fn attempt(m: &AgentMessage) -> Option<(UnitEvent, CheckAttempt)> {
    match &m.kind {
        Some(Kind::UnitEvent(e)) => e.attempt.clone().map(|a| (e.clone(), a)),
        _ => None,
    }
}

fn result(m: &AgentMessage, id: &str) -> Option<CommandResult> {
    match &m.kind {
        Some(Kind::CommandResult(r)) if r.command_id == id => Some(r.clone()),
        _ => None,
    }
}

fn probe_result(m: &AgentMessage) -> Option<ProbeResult> {
    match &m.kind {
        Some(Kind::ProbeResult(r)) => Some(r.clone()),
        _ => None,
    }
}

/// The phase changes among `msgs` (attempt events left out).
fn phases(msgs: &[AgentMessage]) -> Vec<Phase> {
    msgs.iter()
        .filter_map(|m| match &m.kind {
            Some(Kind::UnitEvent(e)) if e.attempt.is_none() => Some(Phase::try_from(e.phase).unwrap()),
            _ => None,
        })
        .collect()
}

// Property: over the real gRPC stream the agent registers first, then a
// StartUnit yields SPAWNED (with pid) and an ok CommandResult, then the phases
// up to GENERATING with non-decreasing ms_since_command; a duplicate command
// id is answered with the original result and not executed again; StopUnit,
// probes and unknown units behave as specified.
#[tokio::test]
async fn start_duplicate_probe_stop_over_grpc() {
    let mut orch = FakeOrchestrator::start().await;
    let script = EngineScript::new(200, 200, 3);
    let engine = FakeEngine::serve(0, script.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(config(&orch.url, dir.path(), &engine.base_url(), "stop-units"));
    let mut pids = PidGuard::default();

    let mut s = orch.accept().await;
    let reg = register(&mut s).await;
    assert_eq!(reg.host, "test-host");
    assert_eq!(reg.agent_version, pdwarden_agent::AGENT_VERSION);
    assert!(!reg.agent_instance_id.is_empty());
    assert_eq!(reg.units.len(), 1);
    let u = &reg.units[0];
    assert_eq!(
        (u.name.as_str(), u.phase, u.pid),
        ("prefill-0", Phase::Stopped as i32, 0)
    );
    assert_eq!((u.bootstrap_port, u.base_url.clone()), (8998, engine.base_url()));

    s.send(command("c1", start("prefill-0")));
    let (generating, before) = until(&mut s, |m| event(m, Phase::Generating)).await;
    let spawned = before.iter().find_map(|m| event(m, Phase::Spawned)).expect("SPAWNED");
    pids.0.push(spawned.pid);
    assert!(spawned.pid > 0 && alive(spawned.pid));
    assert_eq!(spawned.command_id, "c1");
    assert_eq!(phases(&before), vec![Phase::Spawned, Phase::Healthy]);
    let first_result = before.iter().find_map(|m| result(m, "c1")).expect("CommandResult c1");
    assert!(first_result.ok, "{first_result:?}");
    assert_eq!(generating.command_id, "c1");
    assert_eq!(generating.pid, spawned.pid);
    let healthy = before.iter().find_map(|m| event(m, Phase::Healthy)).unwrap();
    assert!(spawned.ms_since_command <= healthy.ms_since_command);
    assert!(healthy.ms_since_command <= generating.ms_since_command);
    assert!(
        generating.detail.contains("/health_generate 200"),
        "{}",
        generating.detail
    );

    // The same command id again: the original answer, no second execution.
    s.send(command("c1", start("prefill-0")));
    let (dup, between) = until(&mut s, |m| result(m, "c1")).await;
    assert_eq!(dup, first_result);
    assert!(phases(&between).is_empty(), "re-executed: {between:?}");

    // A probe through the unit's base URL.
    s.send(command(
        "c2",
        Action::Probe(ProbeRequest {
            unit: "prefill-0".into(),
            chat: Some(ChatProbe {
                model: "m".into(),
                prompt: "Say ok.".into(),
                max_tokens: 8,
                greedy: false,
            }),
            timeout_ms: 5_000,
            seq: 7,
            pd_path: None,
        }),
    ));
    let (p, _) = until(&mut s, probe_result).await;
    assert_eq!((p.command_id.as_str(), p.unit.as_str(), p.seq), ("c2", "prefill-0", 7));
    assert_eq!(p.outcome, ProbeOutcome::Ok as i32, "{p:?}");
    assert_eq!((p.tokens, p.http_status), (3, 200));
    assert!(p.request_id.starts_with("pdwarden-probe-"));
    assert_eq!(script.chats.lock().unwrap()[0].0, p.request_id);

    // Unknown units are refused, naming the unit.
    s.send(command("c3", start("nope")));
    let (r, _) = until(&mut s, |m| result(m, "c3")).await;
    assert!(!r.ok);
    assert!(r.error.contains("\"nope\""), "{}", r.error);
    s.send(command(
        "c4",
        Action::Probe(ProbeRequest {
            unit: "nope".into(),
            ..Default::default()
        }),
    ));
    let (p, _) = until(&mut s, probe_result).await;
    assert_eq!(p.outcome, ProbeOutcome::Error as i32);
    assert!(p.error.contains("\"nope\""), "{}", p.error);

    // Stop: STOPPING, EXITED (signal 15), then the ok result.
    s.send(command(
        "c5",
        Action::Stop(StopUnit {
            unit: "prefill-0".into(),
            grace_ms: 2_000,
        }),
    ));
    let (r, before) = until(&mut s, |m| result(m, "c5")).await;
    assert!(r.ok, "{r:?}");
    assert_eq!(phases(&before), vec![Phase::Stopping, Phase::Exited]);
    let exited = before.iter().find_map(|m| event(m, Phase::Exited)).unwrap();
    assert_eq!((exited.command_id.as_str(), exited.pid), ("c5", spawned.pid));
    assert!(exited.detail.contains("signal 15"), "{}", exited.detail);
    assert!(!alive(spawned.pid));

    agent.shutdown().await;
    let log = std::fs::read_to_string(dir.path().join("logs/prefill-0.log")).unwrap();
    assert!(
        log.contains("starting unit prefill-0 (command \"c1\", config version 0)"),
        "{log}"
    );
}

// Property: every readiness check reaches the orchestrator's stream as a
// UnitEvent with `attempt` set, under the start's command id, carrying the
// unit's phase at the time (healthy) and the failed check's HTTP status and
// seq; the passing check is the event right before GENERATING, and the
// stream's stamps never decrease.
#[tokio::test]
async fn check_attempts_reach_the_orchestrator() {
    let mut orch = FakeOrchestrator::start().await;
    let script = EngineScript::new(200, 503, 0);
    let engine = FakeEngine::serve(0, script.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(config(&orch.url, dir.path(), &engine.base_url(), "stop-units"));
    let mut pids = PidGuard::default();
    let mut s = orch.accept().await;
    register(&mut s).await;

    s.send(command("c1", start("prefill-0")));
    let ((failed_event, failed), seen) = until(&mut s, |m| {
        attempt(m).filter(|(_, a)| a.check == CheckKind::Generation as i32)
    })
    .await;
    let spawned = seen.iter().find_map(|m| event(m, Phase::Spawned)).expect("SPAWNED");
    pids.0.push(spawned.pid);
    assert_eq!(
        (failed.outcome, failed.http_status, failed.seq, failed.count),
        (AttemptOutcome::Error as i32, 503, 1, 1)
    );
    assert_eq!(failed.detail, "GET /health_generate answered 503");
    assert_eq!(
        (failed_event.command_id.as_str(), failed_event.pid, failed_event.phase),
        ("c1", spawned.pid, Phase::Healthy as i32)
    );
    assert_eq!(failed_event.detail, failed.detail);
    assert_eq!(failed.first_ms_since_command, failed_event.ms_since_command);
    // The health run that led to the check came before it.
    let (_, health) = seen
        .iter()
        .filter_map(attempt)
        .find(|(_, a)| a.check == CheckKind::Health as i32)
        .expect("the healthy run before the generation check");
    assert_eq!((health.outcome, health.http_status), (AttemptOutcome::Ok as i32, 200));

    script.generate_status.store(200, std::sync::atomic::Ordering::SeqCst);
    let (generating, after) = until(&mut s, |m| event(m, Phase::Generating)).await;
    let (ok_event, ok) = after.iter().rev().find_map(attempt).expect("the passing attempt");
    assert_eq!(
        after.last().and_then(attempt).map(|(_, a)| a),
        Some(ok.clone()),
        "the passing check is reported right before GENERATING"
    );
    assert_eq!(
        (ok.check, ok.outcome),
        (CheckKind::Generation as i32, AttemptOutcome::Ok as i32)
    );
    assert!(ok.seq >= 2, "{ok:?}");
    assert_eq!(ok_event.phase, Phase::Healthy as i32, "an attempt changes no phase");
    assert_eq!(generating.command_id, "c1");

    let stamp = |m: &AgentMessage| match &m.kind {
        Some(Kind::UnitEvent(e)) if e.command_id == "c1" => Some(e.ms_since_command),
        _ => None,
    };
    let stamps: Vec<u64> = (seen.iter().filter_map(stamp))
        .chain([failed_event.ms_since_command])
        .chain(after.iter().filter_map(stamp))
        .chain([generating.ms_since_command])
        .collect();
    assert!(stamps.is_sorted(), "{stamps:?}");
    agent.shutdown().await;
}

// Property: an exit nobody asked for is reported at once with command id "";
// after a broken stream the agent reconnects and re-registers (same instance
// id) with the current facts; `stop-units` stops running units on shutdown.
#[tokio::test]
async fn crash_reconnect_and_stop_units_on_shutdown() {
    let mut orch = FakeOrchestrator::start().await;
    let engine = FakeEngine::serve(0, EngineScript::new(200, 200, 1)).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(config(&orch.url, dir.path(), &engine.base_url(), "stop-units"));
    let mut pids = PidGuard::default();

    let mut s = orch.accept().await;
    let first = register(&mut s).await;
    s.send(command("c1", start("prefill-0")));
    let (g, _) = until(&mut s, |m| event(m, Phase::Generating)).await;
    pids.0.push(g.pid);

    // Crash: killed from outside, after its start-up finished.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(g.pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let (crash, _) = until(&mut s, |m| event(m, Phase::Exited)).await;
    assert_eq!((crash.command_id.as_str(), crash.pid), ("", g.pid));
    assert_eq!(crash.exit_code, None);
    assert!(crash.detail.contains("signal 9"), "{}", crash.detail);

    // Start again, then break the stream from the orchestrator's side.
    s.send(command("c2", start("prefill-0")));
    let (g2, _) = until(&mut s, |m| event(m, Phase::Generating)).await;
    pids.0.push(g2.pid);
    s.commands = None;
    let mut s2 = orch.accept().await;
    let again = register(&mut s2).await;
    assert_eq!(again.agent_instance_id, first.agent_instance_id);
    let u = &again.units[0];
    assert_eq!((u.phase, u.pid), (Phase::Generating as i32, g2.pid));

    // The reconnected stream carries commands; a resent id is not re-run.
    s2.send(command("c2", start("prefill-0")));
    let (r, between) = until(&mut s2, |m| result(m, "c2")).await;
    assert!(r.ok);
    assert!(phases(&between).is_empty(), "{between:?}");

    agent.shutdown().await;
    wait_until("the unit to be stopped on shutdown", || !alive(g2.pid)).await;
}

// Property: with the default `leave-running`, units survive the agent.
#[tokio::test]
async fn leave_running_keeps_units() {
    let mut orch = FakeOrchestrator::start().await;
    let engine = FakeEngine::serve(0, EngineScript::new(200, 200, 1)).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(config(&orch.url, dir.path(), &engine.base_url(), "leave-running"));
    let mut pids = PidGuard::default();
    let mut s = orch.accept().await;
    register(&mut s).await;
    s.send(command("c1", start("prefill-0")));
    let (spawned, _) = until(&mut s, |m| event(m, Phase::Spawned)).await;
    pids.0.push(spawned.pid);
    agent.shutdown().await;
    assert!(alive(spawned.pid), "leave-running must not stop units");
    // PidGuard kills it.
}

// Property: an agent whose orchestrator is not up yet keeps retrying and
// registers once it appears (backoff, no give-up).
#[tokio::test]
async fn connects_once_the_orchestrator_appears() {
    let port = crate::util::free_port().await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let agent = Agent::start(config(&url, dir.path(), "http://127.0.0.1:1", "stop-units"));
    // The agent is running (it creates its log dir first) and its first
    // connection attempts are refused.
    wait_until("the agent to start", || dir.path().join("logs").exists()).await;
    let mut orch = crate::util::FakeOrchestrator::start_on(port).await;
    let mut s = orch.accept().await;
    assert_eq!(register(&mut s).await.host, "test-host");
    agent.shutdown().await;
}

// ------------------------------------------------- several orchestrators (issue 19)

/// An agent of an HA control plane: `orchestrator` is a list.
fn ha_config(orchestrators: &[&str], state_dir: &Path, engine_url: &str) -> AgentConfig {
    let c = config_toml(&format!("{orchestrators:?}"), state_dir, engine_url, "stop-units");
    assert_eq!(c.orchestrators(), orchestrators);
    c
}

fn ack(follower: bool, leader_url: &str, fencing_token: u64) -> OrchestratorMessage {
    OrchestratorMessage {
        kind: Some(orchestrator_message::Kind::RegisterAck(RegisterAck {
            orchestrator_instance_id: "fake".into(),
            follower,
            leader_url: leader_url.into(),
            fencing_token,
        })),
    }
}

fn leader(fencing_token: u64) -> OrchestratorMessage {
    ack(false, "", fencing_token)
}

fn fenced(id: &str, fencing_token: u64, action: Action) -> OrchestratorMessage {
    let mut m = command(id, action);
    if let Some(orchestrator_message::Kind::Command(c)) = &mut m.kind {
        c.fencing_token = fencing_token;
    }
    m
}

fn stop(unit: &str) -> Action {
    Action::Stop(StopUnit {
        unit: unit.into(),
        grace_ms: 2_000,
    })
}

/// Waits for the agent to leave this stream (one deadline for the whole
/// wait: heartbeats keep coming while it stays); returns what it sent first.
async fn left(s: &mut Session) -> Vec<AgentMessage> {
    let deadline = tokio::time::Instant::now() + EVENT_DEADLINE;
    let mut seen: Vec<AgentMessage> = s.backlog.drain(..).collect();
    loop {
        match tokio::time::timeout_at(deadline, s.inbound.message()).await {
            Err(_) => panic!("the agent did not leave the stream in time"),
            Ok(Ok(Some(m))) => seen.push(m),
            Ok(Ok(None) | Err(_)) => return seen,
        }
    }
}

fn fencing_token(state_dir: &Path) -> Option<String> {
    std::fs::read_to_string(state_dir.join("fencing_token")).ok()
}

// Property: a frozen orchestrator — its kernel completes the TCP handshake
// from the listen backlog, the process never answers (SIGSTOPped, a paused
// VM) — does not hold the agent: the connection is given up within its
// bound and the agent attaches to the next orchestrator. (In plain text the
// attach's own timeout already ended it; over TLS the handshake waited for
// ever — `link::tests::a_frozen_orchestrator_is_given_up_within_the_connection_bound`.)
#[tokio::test]
async fn a_frozen_orchestrator_does_not_hold_the_agent() {
    let frozen = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let frozen_url = format!("http://{}", frozen.local_addr().unwrap());
    let mut b = FakeOrchestrator::start().await;
    let dir = tempfile::tempdir().unwrap();
    let started = tokio::time::Instant::now();
    let agent = Agent::start(ha_config(&[&frozen_url, &b.url], dir.path(), "http://127.0.0.1:1"));
    let mut s = b.accept().await;
    assert_eq!(register(&mut s).await.host, "test-host");
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(4),
        "the frozen orchestrator was dialled first and given up on: {:?}",
        started.elapsed()
    );
    drop(frozen);
    agent.shutdown().await;
}

// Property: a follower's ack (follower = true, leader_url = B) makes the
// agent leave it and attach to B, even though B is not in its list; B,
// acking as the leader, commands the agent.
#[tokio::test]
async fn a_follower_sends_the_agent_to_the_leader() {
    let mut a = FakeOrchestrator::start().await;
    let mut b = FakeOrchestrator::start().await;
    let engine = FakeEngine::serve(0, EngineScript::new(200, 200, 1)).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(ha_config(&[&a.url], dir.path(), &engine.base_url()));
    let mut pids = PidGuard::default();

    let mut sa = a.accept().await;
    register(&mut sa).await;
    sa.send(ack(true, &b.url, 0));
    let mut sb = b.accept().await;
    assert_eq!(register(&mut sb).await.host, "test-host");
    left(&mut sa).await;

    sb.send(leader(3));
    sb.send(fenced("c1", 3, start("prefill-0")));
    let (g, before) = until(&mut sb, |m| event(m, Phase::Generating)).await;
    pids.0.push(g.pid);
    let r = before.iter().find_map(|m| result(m, "c1")).expect("CommandResult c1");
    assert!(r.ok, "{r:?}");
    assert!(alive(g.pid));
    assert_eq!(fencing_token(dir.path()).as_deref(), Some("3\n"));
    agent.shutdown().await;
}

// Property (DESIGN.md 15): with the leader's token 9 seen, a command
// carrying 7 (a deposed leader's late command) is answered with a refusal
// and not executed, and not remembered as that id's answer either: the same
// id under a current token is executed. A higher token raises the floor.
#[tokio::test]
async fn a_deposed_leaders_command_is_refused() {
    let mut a = FakeOrchestrator::start().await;
    let engine = FakeEngine::serve(0, EngineScript::new(200, 200, 1)).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(ha_config(&[&a.url], dir.path(), &engine.base_url()));
    let mut pids = PidGuard::default();
    let mut s = a.accept().await;
    register(&mut s).await;
    s.send(leader(9));
    s.send(fenced("c1", 9, start("prefill-0")));
    let (g, before) = until(&mut s, |m| event(m, Phase::Generating)).await;
    pids.0.push(g.pid);
    assert!(before.iter().find_map(|m| result(m, "c1")).is_some_and(|r| r.ok));

    s.send(fenced("c2", 7, stop("prefill-0")));
    let (r, between) = until(&mut s, |m| result(m, "c2")).await;
    assert!(!r.ok);
    assert_eq!(
        r.error,
        "refused: command from a deposed leader (fencing token 7; this agent has seen 9)"
    );
    assert!(phases(&between).is_empty(), "{between:?}");
    assert!(alive(g.pid), "the refused stop was executed");

    s.send(fenced("c2", 9, stop("prefill-0")));
    let (r, between) = until(&mut s, |m| result(m, "c2")).await;
    assert!(r.ok, "{r:?}");
    assert_eq!(phases(&between), vec![Phase::Stopping, Phase::Exited]);

    s.send(fenced("c3", 10, stop("prefill-0")));
    assert!(until(&mut s, |m| result(m, "c3")).await.0.ok);
    s.send(fenced("c4", 9, stop("prefill-0")));
    let (r, _) = until(&mut s, |m| result(m, "c4")).await;
    assert_eq!(
        (r.ok, r.error.as_str()),
        (
            false,
            "refused: command from a deposed leader (fencing token 9; this agent has seen 10)"
        )
    );
    assert_eq!(fencing_token(dir.path()).as_deref(), Some("10\n"));
    agent.shutdown().await;
}

// Property: the floor survives a restart (`state_dir/fencing_token`): an
// orchestrator that led with 9, acking 7 to the restarted agent, is
// refused and its commands are not taken; the agent goes on to the next
// configured orchestrator, which acks 10 and is taken.
#[tokio::test]
async fn a_restarted_agent_still_refuses_a_deposed_leader() {
    let mut a = FakeOrchestrator::start().await;
    let mut b = FakeOrchestrator::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(ha_config(&[&a.url], dir.path(), "http://127.0.0.1:1"));
    let mut s = a.accept().await;
    register(&mut s).await;
    s.send(leader(9));
    wait_until("the token to be persisted", || {
        fencing_token(dir.path()).as_deref() == Some("9\n")
    })
    .await;
    agent.shutdown().await;

    let agent = Agent::start(ha_config(&[&a.url, &b.url], dir.path(), "http://127.0.0.1:1"));
    let mut s = a.accept().await;
    register(&mut s).await;
    s.send(leader(7));
    s.send(fenced("c1", 7, stop("prefill-0")));
    let sent = left(&mut s).await;
    assert!(
        !sent.iter().any(|m| matches!(m.kind, Some(Kind::CommandResult(_)))),
        "{sent:?}"
    );

    let mut sb = b.accept().await;
    register(&mut sb).await;
    sb.send(leader(10));
    sb.send(fenced("c2", 10, stop("prefill-0")));
    let (r, _) = until(&mut sb, |m| result(m, "c2")).await;
    assert!(r.ok, "{r:?}");
    assert_eq!(fencing_token(dir.path()).as_deref(), Some("10\n"));
    agent.shutdown().await;
}

// Property: a fencing token file that does not hold a number stops the
// agent at start, naming the file, rather than forgetting the floor.
#[tokio::test]
async fn a_corrupt_fencing_token_file_stops_the_agent_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fencing_token");
    std::fs::write(&path, "nine\n").unwrap();
    let run = pdwarden_agent::run(
        ha_config(&["http://127.0.0.1:1"], dir.path(), "http://127.0.0.1:1"),
        std::future::pending(),
    );
    let e = tokio::time::timeout(EVENT_DEADLINE, run)
        .await
        .expect("the agent should stop at start")
        .unwrap_err();
    assert!(matches!(e, pdwarden_agent::AgentError::Fence(_)), "{e:?}");
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
}
