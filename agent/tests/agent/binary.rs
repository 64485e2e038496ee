//! The `pdwarden-agent` binary: config from a file, autostart, SIGTERM.

use std::process::Stdio;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pdwarden_proto::v1::{Phase, agent_message::Kind};

use crate::util::{EVENT_DEADLINE, FakeOrchestrator, PidGuard, Session, alive, wait_until};

// Property: the binary loads its config, autostarts units, registers them
// with their pid, and on SIGTERM stops them (on_exit = "stop-units") and
// exits 0.
#[tokio::test]
async fn sigterm_stops_autostarted_units() {
    let mut orch = FakeOrchestrator::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            r#"
            host = "bin-host"
            orchestrator = "{}"
            insecure_plaintext = true
            state_dir = {:?}
            on_exit = "stop-units"
            shutdown_grace_ms = 2000
            [[unit]]
            name = "sleeper"
            role = "decode"
            argv = ["sleep", "30"]
            base_url = "http://127.0.0.1:1"
            autostart = true
            "#,
            orch.url,
            dir.path()
        ),
    )
    .unwrap();
    let mut agent = tokio::process::Command::new(env!("CARGO_BIN_EXE_pdwarden-agent"))
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut pids = PidGuard::default();

    let (_s, reg) = registered(&mut orch).await;
    assert_eq!(reg.host, "bin-host");
    let unit = &reg.units[0];
    pids.0.push(unit.pid);
    assert!(unit.pid > 0, "autostarted unit registered without a pid: {unit:?}");
    assert_ne!(unit.phase, Phase::Stopped as i32);
    assert!(alive(unit.pid));

    kill(Pid::from_raw(agent.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(EVENT_DEADLINE, agent.wait())
        .await
        .expect("agent did not exit after SIGTERM")
        .unwrap();
    assert!(status.success(), "{status}");
    wait_until("the autostarted unit to be stopped", || !alive(unit.pid)).await;
}

fn write_config(dir: &std::path::Path, orchestrator: &str, on_exit: &str) -> std::path::PathBuf {
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            r#"
            host = "bin-host"
            orchestrator = "{orchestrator}"
            insecure_plaintext = true
            state_dir = {:?}
            on_exit = "{on_exit}"
            shutdown_grace_ms = 2000
            [[unit]]
            name = "sleeper"
            role = "decode"
            argv = ["sleep", "30"]
            base_url = "http://127.0.0.1:1"
            autostart = true
            "#,
            dir
        ),
    )
    .unwrap();
    config
}

fn spawn_agent(config: &std::path::Path) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_pdwarden-agent"))
        .arg("--config")
        .arg(config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// The next agent session and its Register (which must come first).
async fn registered(orch: &mut FakeOrchestrator) -> (Session, pdwarden_proto::v1::Register) {
    let mut s = orch.accept().await;
    let Some(Kind::Register(reg)) = s.next().await.kind else {
        panic!("first message must be Register");
    };
    (s, reg)
}

async fn sigterm_and_wait(agent: &mut tokio::process::Child) {
    kill(Pid::from_raw(agent.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(EVENT_DEADLINE, agent.wait())
        .await
        .expect("agent did not exit after SIGTERM")
        .unwrap();
    assert!(status.success(), "{status}");
}

// Property: a unit left running (`leave-running`) is adopted by the next
// agent on the same state_dir: registered with its pid, not spawned twice
// by autostart, and stoppable by command.
#[tokio::test]
async fn restarted_agent_adopts_units_left_running() {
    let mut orch = FakeOrchestrator::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &orch.url, "leave-running");
    let mut pids = PidGuard::default();

    let mut first = spawn_agent(&config);
    let (_s, reg) = registered(&mut orch).await;
    let pid = reg.units[0].pid;
    pids.0.push(pid);
    assert!(pid > 0);
    sigterm_and_wait(&mut first).await;
    assert!(alive(pid), "leave-running must not stop the unit");

    let mut second = spawn_agent(&config);
    let (mut s, reg) = registered(&mut orch).await;
    assert_ne!(reg.units[0].phase, Phase::Stopped as i32);
    assert_eq!(reg.units[0].pid, pid, "adopted, not spawned again");

    s.send(pdwarden_proto::v1::OrchestratorMessage {
        kind: Some(pdwarden_proto::v1::orchestrator_message::Kind::Command(
            pdwarden_proto::v1::Command {
                fencing_token: 0,
                command_id: "stop-1".into(),
                action: Some(pdwarden_proto::v1::command::Action::Stop(
                    pdwarden_proto::v1::StopUnit {
                        unit: "sleeper".into(),
                        grace_ms: 2_000,
                    },
                )),
            },
        )),
    });
    let mut exited = None;
    loop {
        match s.next().await.kind {
            Some(Kind::UnitEvent(e)) if e.phase == Phase::Exited as i32 => exited = Some(e),
            Some(Kind::CommandResult(r)) if r.command_id == "stop-1" => {
                assert!(r.ok, "{r:?}");
                break;
            }
            _ => {}
        }
    }
    let exited = exited.expect("EXITED before the stop's result");
    assert_eq!((exited.command_id.as_str(), exited.pid), ("stop-1", pid));
    assert!(!dir.path().join("run/sleeper.pid").exists());
    sigterm_and_wait(&mut second).await;
}

// Property: an agent SIGKILLed (no chance to clean up) leaves its units
// running; the next agent re-adopts them by recorded PID and start time; a
// unit that died while no agent ran is registered as exited, not adopted
// and not silently restarted.
#[tokio::test]
async fn sigkilled_agent_units_survive_and_a_unit_dead_meanwhile_is_reported_exited() {
    let mut orch = FakeOrchestrator::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &orch.url, "leave-running");
    let mut pids = PidGuard::default();

    let mut first = spawn_agent(&config);
    let (_s, reg) = registered(&mut orch).await;
    let pid = reg.units[0].pid;
    pids.0.push(pid);
    first.kill().await.unwrap();
    assert!(alive(pid), "a SIGKILLed agent's unit keeps running");

    let mut second = spawn_agent(&config);
    let (_s, reg) = registered(&mut orch).await;
    assert_eq!(reg.units[0].pid, pid, "re-adopted by PID and start time");
    second.kill().await.unwrap();
    assert!(alive(pid));

    // The unit dies while no agent runs; the next agent must not start it
    // on its own (autostart off, as for a pair member).
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
    for _ in 0..100 {
        if !alive(pid) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("autostart = true", "autostart = false");
    std::fs::write(&config, text).unwrap();
    let mut third = spawn_agent(&config);
    let (_s, reg) = registered(&mut orch).await;
    assert_eq!(
        (reg.units[0].phase, reg.units[0].pid),
        (Phase::Exited as i32, 0),
        "died while no agent watched: exited, no process"
    );
    sigterm_and_wait(&mut third).await;
}
