//! Issue 18: the agent under systemd's `Type=notify` and `WatchdogSec=`
//! (deploy/systemd/pdwarden-agent.service). The test is the service
//! manager: it binds the notify socket and starts the real binary with
//! `NOTIFY_SOCKET` and `WATCHDOG_USEC`; its autostarted unit must not
//! inherit them (an engine must not speak for the agent).

use std::os::unix::net::UnixDatagram;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::util::FakeOrchestrator;

#[tokio::test]
async fn ready_after_autostart_watchdog_pinged_and_units_never_see_the_socket() {
    let orch = FakeOrchestrator::start().await;
    let dir = tempfile::tempdir().unwrap();
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let env_file = dir.path().join("unit-env.txt");
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            r#"
            host = "sd-host"
            orchestrator = "{}"
            insecure_plaintext = true
            state_dir = {:?}
            on_exit = "stop-units"
            shutdown_grace_ms = 2000
            [[unit]]
            name = "sleeper"
            role = "decode"
            argv = ["/bin/sh", "-c", "env > {}; exec sleep 30"]
            base_url = "http://127.0.0.1:1"
            autostart = true
            "#,
            orch.url,
            dir.path(),
            env_file.display()
        ),
    )
    .unwrap();
    let agent = tokio::process::Command::new(env!("CARGO_BIN_EXE_pdwarden-agent"))
        .arg("--config")
        .arg(&config)
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "400000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let agent_pid = Pid::from_raw(agent.id().unwrap() as i32);
    let received = tokio::task::spawn_blocking(move || {
        let mut buf = [0u8; 512];
        let mut all = Vec::new();
        // Bounded: each wait is at most the socket's 20 s read timeout.
        for _ in 0..50 {
            if all.iter().filter(|m: &&String| m.as_str() == "WATCHDOG=1\n").count() >= 3 {
                break;
            }
            let n = sock.recv(&mut buf).expect("a notification within 20 s");
            all.push(String::from_utf8_lossy(&buf[..n]).to_string());
        }
        all
    })
    .await
    .unwrap();
    let messages = &received;
    assert!(
        messages.iter().filter(|m| m.as_str() == "WATCHDOG=1\n").count() >= 3,
        "{messages:?}"
    );
    assert!(messages[0].starts_with("READY=1\n"), "{messages:?}");
    // The unit was autostarted before READY; its environment has no trace
    // of the service manager.
    let env = std::fs::read_to_string(&env_file).expect("the autostarted unit ran before READY");
    for var in ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"] {
        assert!(
            !env.lines().any(|l| l.starts_with(&format!("{var}="))),
            "{var} in {env}"
        );
    }
    // SIGTERM: the agent stops its unit (on_exit = "stop-units") and exits.
    kill(agent_pid, Signal::SIGTERM).unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), agent.wait_with_output())
        .await
        .expect("the agent exits after SIGTERM")
        .unwrap();
    assert!(out.status.success(), "{:?}", out.status);
}
