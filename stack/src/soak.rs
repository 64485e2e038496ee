//! The soak (issue 16): co-restarts, verifications and gates on the local
//! stack in a loop for a bounded time, with the orchestrator and the agent
//! SIGKILLed at random moments — mid-operation — and started again, and
//! after every operation the invariants checked:
//!
//! - every operation concludes (a killed orchestrator's is resumed by the
//!   next one) and leaves its pair free;
//! - no operation starts a unit twice (its timeline's `spawned` events);
//! - nothing is left stopped: every unit runs again afterwards;
//! - an operation no fault touched, on this healthy pair, is healthy (a
//!   restart or verification; a gate's no-op change is kept or, on a noisy
//!   host, honestly inconclusive — never rejected).
//!
//! It reports the operations run, the faults injected, every violation
//! (the target is none) and the memory (RSS) and open file descriptors of
//! each orchestrator and agent process at its first and last sample, to
//! show a leak within one process's life. The order of operations and
//! faults comes from `--seed`, so a failing soak can be run again.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::Context;
use pdwarden_client::{Connection, CouldNotRun, new_request_id, status_reason};
use pdwarden_orchestrator::ops::journal::{Journal, JournalError};
use pdwarden_proto::v1::{GatePairRequest, StatusRequest, operation_update};
use serde::Serialize;
use serde_json::Value;

use crate::args::DemoArgs;
use crate::plan::PAIR;
use crate::stack::Stack;

/// Why an operation could not be run, or the stack could not be looked at
/// after one. Not a verdict: the soak counts it as refused, as a fault's
/// consequence or as a violation (see [`SoakError::refused`]).
#[derive(Debug, thiserror::Error)]
pub enum SoakError {
    /// The CLI's client could not connect or follow the operation.
    #[error(transparent)]
    CouldNotRun(#[from] CouldNotRun),
    /// The orchestrator answered a call with an error status.
    #[error("{}", status_reason(.0))]
    Status(tonic::Status),
    /// The gate's update stream failed before its report.
    #[error("lost the gate's stream: {}", status_reason(.0))]
    StreamLost(tonic::Status),
    /// The gate's update stream ended before its report.
    #[error("the gate's stream ended without a report")]
    StreamEnded,
    /// A report or status that is not the JSON expected.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// The stack's journal could not be read.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The blocking read of the journal did not finish (it panicked).
    #[error(transparent)]
    Join(#[from] tokio::task::JoinError),
    /// Some of the pair's units have no process.
    #[error("units not all running: {stopped:?} of {reported} reported")]
    UnitsNotRunning { stopped: Vec<String>, reported: usize },
}

impl SoakError {
    /// The orchestrator turned the operation away (the pair busy, the agent
    /// not connected): no fault of the operation, counted apart.
    fn refused(&self) -> bool {
        let said = self.to_string();
        said.contains("busy") || said.contains("not connected")
    }
}

/// `pdwarden soak`'s flags.
#[derive(clap::Args, Debug, Clone)]
pub struct SoakArgs {
    /// How long to keep starting operations (the one under way then still
    /// finishes).
    #[arg(long, default_value_t = 600)]
    pub seconds: u64,
    /// Seeds the order of operations and faults (the same seed, the same
    /// plan).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Restart,
    Verify,
    Gate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    None,
    KillOrchestrator,
    KillAgent,
}

/// One process's figures over its life in the soak.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessFigures {
    pub process: &'static str,
    pub pid: u32,
    pub samples: u32,
    pub rss_kb_first: u64,
    pub rss_kb_last: u64,
    pub fds_first: u64,
    pub fds_last: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    pub seed: u64,
    pub seconds: f64,
    pub operations: BTreeMap<String, u64>,
    /// Concluded operations' verdicts (children of gates included).
    pub verdicts: BTreeMap<String, u64>,
    pub faults: BTreeMap<String, u64>,
    /// Operations the orchestrator refused (a pair busy with the watch's
    /// own recovery, an agent not yet back): not violations.
    pub refused: Vec<String>,
    pub violations: Vec<String>,
    pub processes: Vec<ProcessFigures>,
    /// One line per operation: what ran, the fault, the verdict and its
    /// first reason.
    pub log: Vec<String>,
    /// What the daemons logged over the soak (issue 36: bounded logs), per
    /// pair per hour (the soak's stack has one pair).
    pub log_volume: Vec<LogVolume>,
}

/// One daemon's log over the soak.
#[derive(Debug, Clone, Serialize)]
pub struct LogVolume {
    pub process: String,
    pub bytes: u64,
    pub lines: u64,
    /// Scaled to an hour of this soak, per pair.
    pub bytes_per_pair_hour: f64,
    pub lines_per_pair_hour: f64,
}

/// The daemons' log volume over `seconds`, from their log files in `dir`.
fn log_volume(dir: &std::path::Path, seconds: f64, pairs: u32) -> Vec<LogVolume> {
    let per_hour = 3600.0 / seconds.max(1.0) / f64::from(pairs.max(1));
    ["orchestrator", "agent"]
        .into_iter()
        .filter_map(|process| {
            // A daemon the soak restarted logs on in `NAME-restarted.log`.
            let text: Vec<u8> = [format!("{process}.log"), format!("{process}-restarted.log")]
                .iter()
                .filter_map(|f| std::fs::read(dir.join(f)).ok())
                .flatten()
                .collect();
            if text.is_empty() {
                return None;
            }
            let lines = text.iter().filter(|&&b| b == b'\n').count() as u64;
            let bytes = text.len() as u64;
            Some(LogVolume {
                process: process.into(),
                bytes,
                lines,
                bytes_per_pair_hour: bytes as f64 * per_hour,
                lines_per_pair_hour: lines as f64 * per_hour,
            })
        })
        .collect()
}

/// xorshift64*: a reproducible plan from the seed.
struct Plan(u64);

impl Plan {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The demo's stack, as the soak runs it.
fn stack_args() -> anyhow::Result<DemoArgs> {
    DemoArgs::from_flags(&[]).context("the soak's stack flags")
}

/// Runs the soak to its end and reports.
pub async fn run(args: &SoakArgs) -> anyhow::Result<SoakReport> {
    let started = Instant::now();
    let mut stack = Stack::start(&stack_args()?, Default::default()).await?;
    let mut plan = Plan(args.seed.max(1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut report = SoakReport {
        seed: args.seed,
        seconds: 0.0,
        operations: BTreeMap::new(),
        verdicts: BTreeMap::new(),
        faults: BTreeMap::new(),
        refused: Vec::new(),
        violations: Vec::new(),
        processes: Vec::new(),
        log: Vec::new(),
        log_volume: Vec::new(),
    };
    let mut figures: BTreeMap<u32, ProcessFigures> = BTreeMap::new();
    let mut seen_ops: BTreeSet<String> = BTreeSet::new();
    let mut gates = 0u64;
    // The first restart makes the pair the stack's own (as the demo's does).
    let mut first = true;
    let mut pair_healthy = false;
    while first || started.elapsed() < Duration::from_secs(args.seconds) {
        let op = if first {
            Op::Restart
        } else {
            match plan.below(10) {
                0..=4 => Op::Restart,
                5..=7 => Op::Verify,
                _ => Op::Gate,
            }
        };
        let fault = if first {
            Fault::None
        } else {
            match plan.below(10) {
                0..=4 => Fault::None,
                5..=7 => Fault::KillOrchestrator,
                _ => Fault::KillAgent,
            }
        };
        first = false;
        *report.operations.entry(format!("{op:?}").to_lowercase()).or_default() += 1;
        if op == Op::Gate {
            gates += 1;
        }
        let conn = stack.connection.clone();
        let task = tokio::spawn(one(conn, op, gates));
        let at_ms = 200 + plan.below(4_000);
        if fault != Fault::None {
            tokio::time::sleep(Duration::from_millis(at_ms)).await;
            *report.faults.entry(format!("{fault:?}")).or_default() += 1;
            match fault {
                Fault::KillOrchestrator => stack.crash_and_restart_orchestrator()?,
                _ => stack.crash_and_restart_agent()?,
            };
        }
        let outcome = tokio::time::timeout(Duration::from_secs(900), task)
            .await
            .map_err(|_| anyhow::anyhow!("a {op:?} did not end within 900 s"))??;
        match (&outcome, fault) {
            (Err(refused), _) if refused.refused() => {
                report.refused.push(format!("{op:?}: {refused}"));
            }
            // The stream of a killed orchestrator ends; its operation goes on.
            (Err(_), Fault::KillOrchestrator) => {}
            (Err(e), _) => report.violations.push(format!("{op:?} ({fault:?}) could not run: {e}")),
            // A restart no fault touched restores any pair pd-sim can make;
            // a verification or a gate is held to that only on a pair the
            // last operation left healthy (a faulted one may leave it
            // broken, and a verification then rightly says so).
            (Ok((verdict, reasons)), Fault::None)
                if !acceptable(op, verdict) && (op == Op::Restart || pair_healthy) =>
            {
                report.violations.push(format!(
                    "{op:?} with no fault on a healthy pair ended {verdict}: {}",
                    reasons.first().map(String::as_str).unwrap_or("")
                ))
            }
            (Ok(_), _) => {}
        }
        report.log.push(format!(
            "{:>6.1} s {op:?}{}: {}",
            started.elapsed().as_secs_f64(),
            match fault {
                Fault::None => String::new(),
                f => format!(" ({f:?} at {at_ms} ms)"),
            },
            match &outcome {
                Ok((v, r)) => format!("{v} — {}", r.first().map(String::as_str).unwrap_or("")),
                Err(e) => format!("not run: {e}"),
            }
        ));
        // Known healthy only after an untouched operation that found it so
        // (a gate's verdict speaks for the change, not for the pair's health).
        pair_healthy = fault == Fault::None
            && matches!(&outcome, Ok((v, _)) if acceptable(op, v))
            && (op != Op::Gate || pair_healthy);
        settle(&stack, &mut report, &mut seen_ops).await;
        for (name, pid) in [("orchestrator", stack.pids().0), ("agent", stack.pids().1)] {
            if let Some((rss, fds)) = process_figures(pid) {
                let f = figures.entry(pid).or_insert(ProcessFigures {
                    process: name,
                    pid,
                    samples: 0,
                    rss_kb_first: rss,
                    rss_kb_last: rss,
                    fds_first: fds,
                    fds_last: fds,
                });
                f.samples += 1;
                f.rss_kb_last = rss;
                f.fds_last = fds;
            }
        }
    }
    report.processes = figures.into_values().collect();
    // What the agents did, from their own records: every process a start
    // command spawned, whoever sent it and whichever agent ran it.
    for ((unit, command), n) in spawns_by_command(&stack.dir.path().join("agent").join("logs")) {
        if n > 1 {
            report.violations.push(format!(
                "start command {command} spawned {unit} {n} times (the unit's log)"
            ));
        }
    }
    report.seconds = started.elapsed().as_secs_f64();
    report.log_volume = log_volume(stack.dir.path(), report.seconds, 1);
    stack.stop(false);
    Ok(report)
}

/// A verdict an operation no fault touched may end with on a healthy pair.
fn acceptable(op: Op, verdict: &str) -> bool {
    match op {
        Op::Restart | Op::Verify => verdict.starts_with("healthy"),
        // A no-op change: kept, or not shown either way on a noisy host, or
        // the host seen drifting; never rejected.
        Op::Gate => matches!(
            verdict,
            "kept_not_worse" | "accepted" | "inconclusive_rolled_back" | "baseline_moved_rolled_back"
        ),
    }
}

/// Runs one operation to its verdict (or the reason it could not run).
async fn one(conn: Connection, op: Op, gate_n: u64) -> Result<(String, Vec<String>), SoakError> {
    match op {
        Op::Restart | Op::Verify => Ok(conn
            .follow(PAIR, (op == Op::Verify).then_some(false), new_request_id(), |_| {})
            .await
            .map(|r| (r.verdict.as_str().to_string(), r.reasons))?),
        Op::Gate => {
            let mut client = conn.connect().await?;
            let mut stream = client
                .gate_pair(GatePairRequest {
                    pair: PAIR.into(),
                    request_id: new_request_id(),
                    // A change with no effect on pd-sim: the gate still
                    // restarts both engines with it and checks it live.
                    set_env: [("PDW_SOAK_ROUND".to_string(), gate_n.to_string())].into(),
                    ..Default::default()
                })
                .await
                .map_err(SoakError::Status)?
                .into_inner();
            loop {
                match stream.message().await {
                    Ok(Some(u)) => {
                        if let Some(operation_update::Kind::Report(r)) = u.kind {
                            let v: Value = serde_json::from_str(&r.json)?;
                            let reasons = v["reasons"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .filter_map(|r| r.as_str().map(str::to_string))
                                .collect();
                            return Ok((v["verdict"].as_str().unwrap_or("?").to_string(), reasons));
                        }
                    }
                    Ok(None) => return Err(SoakError::StreamEnded),
                    Err(s) => return Err(SoakError::StreamLost(s)),
                }
            }
        }
    }
}

/// Waits until nothing runs on the pair (or its gate's children) and every
/// unit runs, then checks each operation concluded since the last look.
async fn settle(stack: &Stack, report: &mut SoakReport, seen: &mut BTreeSet<String>) {
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut last;
    let history = loop {
        match quiet(stack).await {
            Ok(Some(h)) => break Some(h),
            Ok(None) => last = "an operation still running".into(),
            Err(e) => last = e.to_string(),
        }
        if Instant::now() > deadline {
            report
                .violations
                .push(format!("not settled within 300 s after an operation: {last}"));
            break None;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for op in history.into_iter().flatten() {
        let id = op["operation_id"].as_str().unwrap_or("").to_string();
        if !seen.insert(id.clone()) {
            continue;
        }
        let verdict = op["verdict"].as_str().unwrap_or("none").to_string();
        *report.verdicts.entry(verdict).or_default() += 1;
        let mut spawned: BTreeMap<String, u32> = BTreeMap::new();
        for t in op["report"]["timeline"].as_array().into_iter().flatten() {
            if t["phase"] == "spawned" {
                *spawned
                    .entry(t["unit"].as_str().unwrap_or("?").to_string())
                    .or_default() += 1;
            }
        }
        for (unit, n) in spawned.into_iter().filter(|(_, n)| *n > 1) {
            report.violations.push(format!(
                "operation {id} ({}) started {unit} {n} times",
                op["kind"].as_str().unwrap_or("?")
            ));
        }
    }
}

/// The pair's and its gate children's history once nothing runs and every
/// unit has a process; `None` while something still runs. Read from the
/// stack's journal itself (a gate's children, `PAIR#gate`, are no pair the
/// orchestrator's `history` knows).
async fn quiet(stack: &Stack) -> Result<Option<Vec<Value>>, SoakError> {
    let path = stack.dir.path().join("journal.sqlite");
    let all = tokio::task::spawn_blocking(move || -> Result<Option<Vec<Value>>, SoakError> {
        let journal = Journal::open(&path)?;
        if !journal.unfinished()?.is_empty() {
            return Ok(None);
        }
        let mut all = Vec::new();
        for pair in [PAIR.to_string(), format!("{PAIR}#gate")] {
            for op in journal.history(&pair, 50)? {
                all.push(serde_json::to_value(op)?);
            }
        }
        Ok(Some(all))
    })
    .await??;
    let Some(all) = all else { return Ok(None) };
    let mut client = stack.connection.connect().await?;
    let status = client
        .status(StatusRequest::default())
        .await
        .map_err(SoakError::Status)?
        .into_inner()
        .json;
    let status: Value = serde_json::from_str(&status)?;
    let units = status["agents"][0]["units"].as_array().cloned().unwrap_or_default();
    let stopped: Vec<String> = units
        .iter()
        .filter(|u| u["pid"].as_u64().unwrap_or(0) == 0)
        .filter_map(|u| u["name"].as_str().map(str::to_owned))
        .collect();
    if units.len() != 3 || !stopped.is_empty() {
        return Err(SoakError::UnitsNotRunning {
            stopped,
            reported: units.len(),
        });
    }
    Ok(Some(all))
}

/// Each unit's spawns by the start command that made them, from the
/// agent's line at the head of every spawn in the unit's log (`--- pdwarden-agent:
/// starting unit NAME (command "ID", …`).
fn spawns_by_command(logs: &std::path::Path) -> BTreeMap<(String, String), u32> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(logs).into_iter().flatten().flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("--- pdwarden-agent: starting unit ") else {
                continue;
            };
            let Some((unit, rest)) = rest.split_once(" (command \"") else {
                continue;
            };
            let Some((command, _)) = rest.split_once('"') else {
                continue;
            };
            if !command.is_empty() {
                *out.entry((unit.to_string(), command.to_string())).or_default() += 1;
            }
        }
    }
    out
}

/// A process's resident memory (kB) and open file descriptors.
fn process_figures(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some((rss, fds))
}

impl SoakReport {
    /// The report for a person: what ran, what was injected, what broke.
    pub fn render(&self) -> String {
        let mut out = format!(
            "soak: {:.0} s, seed {}: operations {:?}, faults {:?}, verdicts {:?}\n",
            self.seconds, self.seed, self.operations, self.faults, self.verdicts
        );
        for p in &self.processes {
            out.push_str(&format!(
                "  {} pid {} ({} samples): RSS {} → {} kB, fds {} → {}\n",
                p.process, p.pid, p.samples, p.rss_kb_first, p.rss_kb_last, p.fds_first, p.fds_last
            ));
        }
        for v in &self.log_volume {
            out.push_str(&format!(
                "  {} log: {} lines, {} bytes = {:.0} lines, {:.1} KiB per pair per hour (faults injected throughout)\n",
                v.process,
                v.lines,
                v.bytes,
                v.lines_per_pair_hour,
                v.bytes_per_pair_hour / 1024.0
            ));
        }
        for l in &self.log {
            out.push_str(&format!("  {l}\n"));
        }
        for r in &self.refused {
            out.push_str(&format!("  refused (not a violation): {r}\n"));
        }
        if self.violations.is_empty() {
            out.push_str("  invariant violations: 0\n");
        } else {
            out.push_str(&format!("  INVARIANT VIOLATIONS: {}\n", self.violations.len()));
            for v in &self.violations {
                out.push_str(&format!("    {v}\n"));
            }
        }
        out
    }
}
