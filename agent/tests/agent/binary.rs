//! The `pdwarden-agent` binary: config from a file, autostart, SIGTERM.

use std::process::Stdio;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pdwarden_proto::v1::{Phase, agent_message::Kind};

use crate::util::{EVENT_DEADLINE, FakeOrchestrator, PidGuard, alive, wait_until};

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

    let mut s = orch.accept().await;
    let Some(Kind::Register(reg)) = s.next().await.kind else {
        panic!("first message must be Register");
    };
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
