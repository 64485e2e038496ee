//! Fixtures for the cross-process scenarios: the workspace's binaries, and
//! `pdwarden demo` run as a real process (orchestrator, agent, pd-sim engines
//! and the real sglang-router, all on loopback).
//!
//! Every process a scenario starts is stopped by PID: the demo stops its own
//! stack on SIGTERM, and a demo that outlives its deadline is killed.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

/// Scenarios run one at a time: each starts a whole stack on free loopback
/// ports, and two stacks racing for ports (or for the 2 CPUs' timing) would
/// make the timing-based verdicts flaky.
static ONE_STACK_AT_A_TIME: Mutex<()> = Mutex::new(());

pub fn exclusive() -> MutexGuard<'static, ()> {
    ONE_STACK_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// A workspace binary. The scenario binaries are built by `cargo build
/// --workspace`, which the README's test command runs first.
pub fn bin(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_BIN_EXE_pd-sim"))
        .parent()
        .expect("target dir")
        .to_path_buf();
    let p = dir.join(name);
    assert!(
        p.is_file(),
        "{} is missing: build the workspace first (cargo build --workspace)",
        p.display()
    );
    p
}

pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// The last stdout line, parsed as the command's `--json` object.
    pub fn json(&self) -> Value {
        let line = self
            .stdout
            .lines()
            .rev()
            .find(|l| l.starts_with('{') || l.starts_with('['))
            .unwrap_or_else(|| {
                panic!(
                    "no JSON object on stdout.\nstdout:\n{}\nstderr:\n{}",
                    self.stdout, self.stderr
                )
            });
        serde_json::from_str(line).unwrap_or_else(|e| panic!("bad JSON ({e}): {line}"))
    }
}

fn stop_by_pid(child: &mut Child, grace: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Runs `pdwarden ARGS` to completion, killing it (by PID) after `limit`.
pub fn pdwarden(args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(bin("pdwarden"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pdwarden");
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap_or_default());
    let err_t = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let deadline = Instant::now() + limit;
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status.code().unwrap_or(-1);
        }
        if Instant::now() > deadline {
            // SIGTERM lets a demo stop the stack it started.
            stop_by_pid(&mut child, Duration::from_secs(20));
            let (o, e) = (out_t.join().unwrap(), err_t.join().unwrap());
            panic!("pdwarden {args:?} ran past {limit:?}\nstdout:\n{o}\nstderr:\n{e}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        code,
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
    }
}

/// `pdwarden demo --json --hold`: the stack stays up after the restart until
/// this value is dropped.
pub struct HeldDemo {
    child: Child,
    pub report: Value,
    /// `--orchestrator URL` and the demo's credentials (`--ca`, `--token`;
    /// the demo runs mutual TLS and tokens unless told otherwise).
    pub connect_args: Vec<String>,
}

impl HeldDemo {
    pub fn start(extra: &[&str], limit: Duration) -> Self {
        let mut child = Command::new(bin("pdwarden"))
            .args(["demo", "--json", "--hold"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn pdwarden demo");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + limit;
        let report = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.starts_with('{') => break serde_json::from_str::<Value>(&line).expect("demo JSON"),
                Ok(_) => continue,
                Err(e) => {
                    stop_by_pid(&mut child, Duration::from_secs(20));
                    panic!("demo produced no report within {limit:?}: {e}");
                }
            }
        };
        let orchestrator = report["demo"]["orchestrator"]
            .as_str()
            .expect("demo.orchestrator")
            .to_string();
        let mut connect_args = vec!["--orchestrator".to_string(), orchestrator];
        if let (Some(ca), Some(token)) = (report["demo"]["ca"].as_str(), report["demo"]["token"].as_str()) {
            connect_args.extend(["--ca".into(), ca.into(), "--token".into(), token.into()]);
        }
        HeldDemo {
            child,
            report,
            connect_args,
        }
    }

    /// `pdwarden --orchestrator URL ARGS` against the held stack.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.cli_within(args, Duration::from_secs(60))
    }

    /// As `cli`, with a time limit.
    pub fn cli_within(&self, args: &[&str], limit: Duration) -> Output {
        let mut all: Vec<&str> = self.connect_args.iter().map(String::as_str).collect();
        all.extend_from_slice(args);
        pdwarden(&all, limit)
    }
}

impl Drop for HeldDemo {
    fn drop(&mut self) {
        stop_by_pid(&mut self.child, Duration::from_secs(30));
    }
}

/// When `unit` reached `phase` in a report's timeline (ms since the operation began).
pub fn at(report: &Value, unit: &str, phase: &str) -> Option<u64> {
    report["timeline"]
        .as_array()?
        .iter()
        .find(|t| t["unit"] == unit && t["phase"] == phase)
        .and_then(|t| t["at_ms"].as_u64())
}

/// Like [`at`], but the phase must be there.
pub fn must_at(report: &Value, unit: &str, phase: &str) -> u64 {
    at(report, unit, phase).unwrap_or_else(|| panic!("{unit} never reached {phase}: {:#}", report["timeline"]))
}

/// The names of a report's steps, in order.
pub fn step_names(report: &Value) -> Vec<&str> {
    report["steps"]
        .as_array()
        .expect("report has steps")
        .iter()
        .map(|s| s["name"].as_str().expect("step has a name"))
        .collect()
}

/// A report's reasons, one per line, for assertions and their messages.
pub fn reasons(v: &Value) -> String {
    v["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

impl HeldDemo {
    /// The base URL of one of the held stack's units, from `status`.
    pub fn unit_url(&self, unit: &str) -> String {
        let status = self.cli(&["status", "--json"]).json();
        status["agents"][0]["units"]
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["name"] == unit)
            .and_then(|u| u["base_url"].as_str())
            .unwrap_or_else(|| panic!("no unit {unit} in {status:#}"))
            .to_string()
    }
}

/// Changes a running pd-sim's settings live (`POST /sim/fault`).
pub fn sim_fault(url: &str, body: &'static str) {
    let answered = tokio::runtime::Runtime::new().unwrap().block_on(async {
        reqwest::Client::new()
            .post(format!("{url}/sim/fault"))
            .body(body)
            .send()
            .await
            .map(|r| r.status())
    });
    assert!(answered.as_ref().is_ok_and(|s| s.is_success()), "{answered:?}");
}

/// One suite step of a report, by name.
pub fn step<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["suite"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["step"] == name))
        .unwrap_or_else(|| panic!("no suite step {name}: {:#}", report["suite"]))
}

/// Polls `f` every 100 ms until it returns `Some`, or panics at `limit`.
pub fn poll<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
