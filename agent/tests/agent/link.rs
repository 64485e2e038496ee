//! The whole agent in-process against a fake orchestrator: registration,
//! start-up events and check attempts over gRPC, at-most-once commands,
//! probes, crash reports, reconnects and shutdown behaviour.

use std::path::Path;

use pdwarden_agent::AgentConfig;
use pdwarden_proto::v1::{
    AgentMessage, AttemptOutcome, ChatProbe, CheckAttempt, CheckKind, Command, CommandResult, OrchestratorMessage,
    Phase, ProbeOutcome, ProbeRequest, ProbeResult, ReadinessSpec, Register, StartUnit, StopUnit, UnitEvent,
    agent_message::Kind, command::Action, orchestrator_message,
};

use crate::util::{Agent, EngineScript, FakeEngine, FakeOrchestrator, PidGuard, Session, alive, wait_until};

fn config(orchestrator: &str, state_dir: &Path, engine_url: &str, on_exit: &str) -> AgentConfig {
    AgentConfig::from_toml_str(&format!(
        r#"
        host = "test-host"
        orchestrator = "{orchestrator}"
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
