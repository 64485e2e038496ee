//! Fixtures for the cross-process scenarios: the workspace's binaries, the
//! demo driven in-process through `pdwarden_stack` (it starts the
//! orchestrator, the agent, the pd-sim engines and the real sglang-router as
//! real processes, all on loopback), and the real `pdwarden` CLI run against
//! a held stack where a scenario tests what an operator types.
//!
//! Every process a scenario starts is stopped by PID: a demo stops its
//! stack when it ends or is dropped (a panicking scenario, a demo past its
//! deadline), and a CLI past its deadline is killed.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
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
/// --workspace --bins`, which the README's test command runs first.
pub fn bin(name: &str) -> PathBuf {
    pdwarden_stack::process::binary(name).unwrap_or_else(|e| panic!("{e:#}"))
}

/// The demo's flags, parsed exactly as `pdwarden demo` parses them.
fn demo_args(extra: &[&str]) -> pdwarden_stack::DemoArgs {
    pdwarden_stack::DemoArgs::from_flags(extra).unwrap_or_else(|e| panic!("demo flags {extra:?}: {e}"))
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Runs the demo with `args` (`pdwarden demo ARGS`) in-process to its
/// outcome and stops its stack: the exit code the CLI would give, and its
/// `--json` object as the last stdout line. Past `limit` the demo is
/// dropped (its processes stopped by PID) and the scenario fails.
pub fn demo(args: &[&str], limit: Duration) -> Output {
    let parsed = demo_args(args);
    let rt = runtime();
    let demo = rt
        .block_on(async { tokio::time::timeout(limit, pdwarden_stack::demo::start(&parsed, Default::default())).await })
        .unwrap_or_else(|_| panic!("demo {args:?} ran past {limit:?}"));
    let outcome = demo.outcome.clone();
    demo.stop(false, true);
    Output {
        code: i32::from(outcome.code),
        stdout: outcome.json.to_string(),
        stderr: outcome.error.unwrap_or_default(),
    }
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

/// A demo whose stack stays up after the restart (`pdwarden demo --hold`)
/// until this value is dropped.
pub struct HeldDemo {
    demo: Option<pdwarden_stack::Demo>,
    // Dropped after the demo: its stack is stopped inside the runtime.
    _rt: tokio::runtime::Runtime,
    pub report: Value,
    /// `--orchestrator URL` and the demo's credentials (`--ca`, `--token`;
    /// the demo runs mutual TLS and tokens unless told otherwise).
    pub connect_args: Vec<String>,
}

impl HeldDemo {
    pub fn start(extra: &[&str], limit: Duration) -> Self {
        let mut all = vec!["--json", "--hold"];
        all.extend_from_slice(extra);
        let parsed = demo_args(&all);
        let rt = runtime();
        let demo = rt
            .block_on(async {
                tokio::time::timeout(limit, pdwarden_stack::demo::start(&parsed, Default::default())).await
            })
            .unwrap_or_else(|_| panic!("demo produced no report within {limit:?}"));
        if let Some(e) = &demo.outcome.error {
            panic!("the demo could not run: {e}");
        }
        let report = demo.outcome.json.clone();
        let orchestrator = report["demo"]["orchestrator"]
            .as_str()
            .expect("demo.orchestrator")
            .to_string();
        let mut connect_args = vec!["--orchestrator".to_string(), orchestrator];
        if let (Some(ca), Some(token)) = (report["demo"]["ca"].as_str(), report["demo"]["token"].as_str()) {
            connect_args.extend(["--ca".into(), ca.into(), "--token".into(), token.into()]);
        }
        HeldDemo {
            demo: Some(demo),
            _rt: rt,
            report,
            connect_args,
        }
    }

    /// [`pdwarden_stack::Stack::restart_units_outside`] on the held stack.
    pub fn restart_units_outside(&mut self, units: &[&str]) {
        let stack = self.demo.as_mut().and_then(|d| d.stack.as_mut()).expect("a held stack");
        self._rt
            .block_on(stack.restart_units_outside(units))
            .unwrap_or_else(|e| panic!("restarting {units:?} outside pdwarden: {e:#}"));
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
        if let Some(demo) = self.demo.take() {
            demo.stop(false, true);
        }
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

/// Panics unless `report`'s verdict is healthy, its verdict and reasons
/// first: CI shows a failing test's output cut in the middle, and the
/// reasons are what says why.
pub fn assert_healthy(report: &Value) {
    let verdict = report["verdict"].as_str().unwrap_or("(no verdict)");
    assert!(
        verdict.starts_with("healthy"),
        "verdict {verdict}; reasons:\n{}\n\nthe report: {report:#}",
        report["reasons"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("\n"))
            .unwrap_or_default()
    );
}

impl HeldDemo {
    /// The base URL of one of the held stack's units (`NAME` on the first
    /// agent, or `HOST/NAME`), from `status`.
    pub fn unit_url(&self, unit: &str) -> String {
        let status = self.cli(&["status", "--json"]).json();
        unit_of(&status, unit)
            .and_then(|u| u["base_url"].as_str())
            .unwrap_or_else(|| panic!("no unit {unit} in {status:#}"))
            .to_string()
    }
}

/// `unit` in a `status`: `HOST/NAME` on that host's agent, a bare `NAME`
/// on the first agent.
fn unit_of<'a>(status: &'a Value, unit: &str) -> Option<&'a Value> {
    let agents = status["agents"].as_array()?;
    let (agent, name) = match unit.split_once('/') {
        Some((host, name)) => (agents.iter().find(|a| a["host"] == host)?, name),
        None => (agents.first()?, unit),
    };
    agent["units"].as_array()?.iter().find(|u| u["name"] == name)
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

/// Replaces the fault proxy's faults (`POST /_faultproxy/faults`).
pub fn set_faults(proxy: &str, body: &str) {
    let answered = tokio::runtime::Runtime::new().unwrap().block_on(async {
        reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .post(format!("{proxy}/_faultproxy/faults"))
            .header("content-type", "application/json")
            .body(body.to_string())
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

impl HeldDemo {
    /// `status --json` of the held stack.
    pub fn status(&self) -> Value {
        let out = self.cli(&["status", "--json"]);
        assert_eq!(out.code, 0, "{}", out.stderr);
        out.json()
    }

    /// The watch's view of the demo pair.
    pub fn watch(&self) -> Value {
        watch_of(&self.status())
    }

    /// Waits until the watch's automatic recovery of the pair has concluded
    /// and the watch says healthy again; returns the watch's view and the
    /// recovery as `history` journaled it (with its trigger).
    pub fn automatic_recovery(&self, limit: Duration) -> (Value, Value) {
        self.automatic_recovery_after(None, limit)
    }

    /// As [`HeldDemo::automatic_recovery`], for a recovery other than the
    /// operation `after` (the one before it).
    pub fn automatic_recovery_after(&self, after: Option<&Value>, limit: Duration) -> (Value, Value) {
        let recovered = poll("an automatic recovery concludes", limit, || {
            let w = self.watch();
            let id = &w["last_recovery"]["operation_id"];
            (Some(id) != after && w["last_recovery"]["verdict"].is_string() && w["state"] == "healthy").then_some(w)
        });
        let id = recovered["last_recovery"]["operation_id"].clone();
        let history = self.cli(&["history", "demo", "--json"]).json();
        let auto = history
            .as_array()
            .unwrap()
            .iter()
            .find(|op| op["operation_id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("the automatic operation is not in the history: {history:#}"));
        (recovered, auto)
    }
}

/// The watch's view of the demo pair in a `status --json`.
pub fn watch_of(status: &Value) -> Value {
    status["watch"]
        .as_array()
        .and_then(|w| w.iter().find(|p| p["pair"] == "demo"))
        .cloned()
        .unwrap_or(Value::Null)
}

impl HeldDemo {
    /// The evidence operation `operation_id` captured before it stopped the
    /// pair (issue 35), as `history demo --evidence OP --json` prints it.
    pub fn evidence(&self, operation_id: &str) -> Value {
        let out = self.cli(&["history", "demo", "--evidence", operation_id, "--json"]);
        assert_eq!(out.code, 0, "history --evidence {operation_id}: {}", out.stderr);
        out.json()
    }

    /// The pid of `unit` (`NAME`, or `HOST/NAME` with `--two-hosts`) as
    /// its agent reports it.
    pub fn unit_pid(&self, unit: &str) -> u32 {
        let status = self.status();
        unit_of(&status, unit)
            .and_then(|u| u["pid"].as_u64())
            .unwrap_or_else(|| panic!("no pid for {unit}: {status:#}")) as u32
    }

    /// Stops `unit`'s own process (SIGSTOP: its port still accepts, nothing
    /// answers, its PID lives), waits for the watch's automatic recovery and
    /// says what pdwarden concluded. The same fault on pd-sim and on the
    /// real vLLM decode must get the same conclusion (issue 15, point 4).
    pub fn stop_unit_and_await_recovery(&self, unit: &str, limit: Duration) -> StopOutcome {
        poll("watch healthy before the fault", Duration::from_secs(60), || {
            (self.watch()["state"] == "healthy").then_some(())
        });
        let pid = self.unit_pid(unit);
        let stopped = Stopped::new(pid);
        let (recovered, auto) = self.automatic_recovery(limit);
        let wedge = &auto["trigger"]["wedge"];
        let outcome = StopOutcome {
            automatic: auto["trigger"]["automatic"] == true,
            wedge_kind: wedge["kind"].as_str().unwrap_or("").to_string(),
            ruled_out: wedge["ruled_out"].to_string(),
            verdict: recovered["last_recovery"]["verdict"].as_str().unwrap_or("").to_string(),
            replaced: self.unit_pid(unit) != pid,
            detection_ms: wedge["detection_ms"].as_u64(),
            recovered_s: stopped.since.elapsed().as_secs_f64(),
            evidence: self.evidence(auto["operation_id"].as_str().unwrap_or_default()),
        };
        drop(stopped);
        outcome
    }
}

/// What pdwarden concluded about a unit stopped behind its back.
#[derive(Debug)]
pub struct StopOutcome {
    pub automatic: bool,
    pub wedge_kind: String,
    pub ruled_out: String,
    pub verdict: String,
    /// The agent reports another PID for the unit now.
    pub replaced: bool,
    pub detection_ms: Option<u64>,
    /// From the SIGSTOP to the verified recovery, in seconds.
    pub recovered_s: f64,
    /// What the recovery captured before it stopped anything (issue 35):
    /// `history demo --evidence OP --json`.
    pub evidence: Value,
}

/// A process stopped by SIGSTOP, resumed (SIGCONT) when dropped whatever
/// happens, so the stack can stop it (a recovery normally replaces it
/// first; a SIGCONT to a PID that exited is refused and ignored).
pub struct Stopped {
    pid: u32,
    pub since: Instant,
}

impl Stopped {
    pub fn new(pid: u32) -> Self {
        kill(Pid::from_raw(pid as i32), Signal::SIGSTOP).unwrap_or_else(|e| panic!("SIGSTOP {pid}: {e}"));
        Self {
            pid,
            since: Instant::now(),
        }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.pid as i32), Signal::SIGCONT);
    }
}
