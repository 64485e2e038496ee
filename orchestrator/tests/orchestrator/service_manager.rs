//! Issue 18: the orchestrator under systemd's `Type=notify` and
//! `WatchdogSec=` (deploy/systemd/pdwarden-orchestrator.service). The test
//! is the service manager: it binds the notify socket itself and starts the
//! real binary with `NOTIFY_SOCKET` and `WATCHDOG_USEC` set.

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

/// Kills the child by PID when the test ends, however it ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn ready_only_once_serving_and_the_watchdog_pinged_while_the_journal_answers() {
    let dir = tempfile::tempdir().unwrap();
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = dir.path().join("orchestrator.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:{port}\"\njournal = {:?}\ninsecure_plaintext = true\n",
            dir.path().join("journal.sqlite").display().to_string()
        ),
    )
    .unwrap();
    let _child = Child(
        Command::new(env!("CARGO_BIN_EXE_pdwarden-orchestrator"))
            .arg("--config")
            .arg(&cfg)
            .env("NOTIFY_SOCKET", &sock_path)
            .env("WATCHDOG_USEC", "400000")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .arg("--log-format")
            .arg("json")
            .spawn()
            .unwrap(),
    );
    let mut buf = [0u8; 512];
    let mut next = || {
        let n = sock.recv(&mut buf).expect("a notification within 20 s");
        String::from_utf8_lossy(&buf[..n]).to_string()
    };
    let first = next();
    assert!(first.starts_with("READY=1\n"), "{first:?}");
    // READY means serving: the gRPC listener accepts at once.
    std::net::TcpStream::connect(("127.0.0.1", port)).expect("READY=1 before the listener was bound");
    // Pinged at half of the 0.4 s interval.
    let start = Instant::now();
    let mut pings = 0;
    while pings < 3 {
        let m = next();
        assert_eq!(m, "WATCHDOG=1\n");
        pings += 1;
    }
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "3 pings took {:?}",
        start.elapsed()
    );
}

/// Issue 18: `--log-format json` writes one JSON object per line, the
/// message and its fields apart (what a log shipper indexes); a bad value
/// is refused naming the flag and the choices.
#[test]
fn json_logs_are_one_object_per_line_with_fields() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("orchestrator.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:0\"\njournal = {:?}\ninsecure_plaintext = true\n",
            dir.path().join("journal.sqlite").display().to_string()
        ),
    )
    .unwrap();
    let log = dir.path().join("stderr.log");
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_pdwarden-orchestrator"))
            .arg("--config")
            .arg(&cfg)
            .args(["--log-format", "json"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let listening = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| l.contains("orchestrator listening")) {
            break l.to_string();
        }
        assert!(Instant::now() < deadline, "no 'listening' line: {text}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let v: serde_json::Value = serde_json::from_str(&listening).expect("a JSON object per line");
    assert_eq!(v["level"], "INFO", "{v}");
    assert_eq!(v["fields"]["message"], "orchestrator listening", "{v}");
    assert!(
        v["fields"]["addr"].as_str().unwrap_or("").starts_with("127.0.0.1:"),
        "{v}"
    );
    assert!(v["timestamp"].is_string(), "{v}");
    let _ = child.0.kill();
    let _ = child.0.wait();
    for line in std::fs::read_to_string(&log).unwrap().lines() {
        serde_json::from_str::<serde_json::Value>(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    }
    let bad = Command::new(env!("CARGO_BIN_EXE_pdwarden-orchestrator"))
        .args(["--config", "x.toml", "--log-format", "xml"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("--log-format") && err.contains("json"), "{err}");
}
