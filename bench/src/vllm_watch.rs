//! The real tier's time to detect (issue 31): the watch at the README's
//! defaults on a real vLLM pair, two faults injected at once after a healthy
//! co-restart, each timed from the freeze to the watch's confirmation, to
//! the automatic co-restart it starts, and to the recovery verified.
//!
//! What the scenario `vllm::a_real_engine_core_stopped_under_health_200_is_confirmed_and_recovered`
//! asserts, measured: `pdwarden demo --engine vllm --watch-defaults --json
//! --hold`; right after its co-restart report the decode's engine core
//! (`VLLM::EngineCore`, a child of the decode's API server) is stopped with
//! SIGSTOP — its `/health` stays 200 —, and once the watch's automatic
//! recovery has concluded, the whole (new) decode process is stopped. Each
//! freeze is stamped on CLOCK_MONOTONIC, the clock the orchestrator's
//! triggers record on (`trigger.detected_mono_ms`, `concluded_mono_ms`);
//! onset → confirmation is the watch's own `trigger.wedge.detection_ms`.
//!
//! Opt-in (`--only vllm-watch`): it needs the vLLM stack of
//! `scripts/setup-vllm.sh` (~3 GB of memory while it runs, minutes on 2
//! cores). Without it the section says NOT RUN and why, and measures nothing.
//! Every stopped process is continued (SIGCONT) and the demo stopped
//! (SIGTERM, by PID) before the section ends, errors included.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pd_sim::clock::mono_ms;
use serde_json::Value;

/// The demo's report (two real engine start-ups and the co-restart).
const REPORT_LIMIT: Duration = Duration::from_secs(400);
/// Each fault's automatic recovery, from the freeze.
const RECOVERY_LIMIT: Duration = Duration::from_secs(300);
/// Issue 31: an automatic co-restart within 30 s of the freeze.
pub const TARGET_S: f64 = 30.0;

/// Why the real tier cannot run here, or `None` when it can.
pub fn unavailable() -> Option<String> {
    let venv = match std::env::var_os("VLLM_VENV") {
        Some(v) => Some(PathBuf::from(v)),
        None => std::env::current_exe().ok().and_then(|exe| {
            exe.ancestors()
                .skip(1)
                .map(|d| d.join(".venv-vllm"))
                .find(|d| d.is_dir())
        }),
    };
    let Some(venv) = venv.filter(|v| v.is_dir()) else {
        let where_ = match std::env::var_os("VLLM_VENV") {
            Some(v) => format!("VLLM_VENV={} is not a directory", v.to_string_lossy()),
            None => "no .venv-vllm/ above this binary, VLLM_VENV unset".into(),
        };
        return Some(format!(
            "the vLLM stack is not installed ({where_}): run scripts/setup-vllm.sh"
        ));
    };
    let marker = venv.join(".unavailable");
    if marker.exists() {
        let reason = std::fs::read_to_string(&marker).unwrap_or_default();
        return Some(format!(
            "the vLLM tier is marked unavailable on this host ({}): {}",
            marker.display(),
            reason.trim()
        ));
    }
    pdwarden_stack::vllm::VllmStack::find().err().map(|e| format!("{e:#}"))
}

/// One fault and what the watch made of it.
pub struct Row {
    pub fault: &'static str,
    /// The confirmed wedge's kind (`trigger.wedge.kind`).
    pub kind: Option<String>,
    /// Onset of the silence → confirmation, as the watch judged it, s.
    pub detection_s: Option<f64>,
    /// Freeze → the automatic co-restart's trigger, s.
    pub to_corestart_s: Option<f64>,
    /// Freeze → the automatic co-restart concluded (verified), s.
    pub to_recovered_s: f64,
    /// The automatic co-restart's verdict.
    pub verdict: String,
    /// The decode's pid changed (the frozen process was replaced).
    pub replaced: bool,
    /// The journaled operation says `automatic`.
    pub automatic: bool,
}

pub struct Outcome {
    /// The demo's start and co-restart, s (its report's wall time).
    pub demo_s: Option<f64>,
    pub rows: Vec<Row>,
    /// What stopped the section early, if anything (rows measured before it stand).
    pub error: Option<String>,
}

pub async fn run() -> Outcome {
    let mut out = Outcome {
        demo_s: None,
        rows: Vec::new(),
        error: None,
    };
    let started = Instant::now();
    let (held, cli, _) = match start_demo(&["--watch-defaults"], "vllm-watch").await {
        Ok(v) => v,
        Err(e) => {
            out.error = Some(format!("{e:#}"));
            return out;
        }
    };
    out.demo_s = Some(started.elapsed().as_secs_f64());
    if let Err(e) = measure(&cli, &mut out.rows).await {
        out.error = Some(format!("{e:#}"));
    }
    held.stop();
    out
}

async fn measure(cli: &Cli, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    // 1. The decode's engine core, at once after the demo's co-restart.
    let st = cli.json(&["status", "--json"]).await?;
    let api = unit_pid(&st, "decode-0")?;
    let core = child_named(api, "VLLM::EngineCor")
        .with_context(|| format!("no VLLM::EngineCore child of the decode (pid {api})"))?;
    let before = watch_of(&st)["last_recovery"]["operation_id"].clone();
    let frozen = Frozen::stop(core)?;
    let row = recovery(
        cli,
        "engine core frozen (SIGSTOP of `VLLM::EngineCore`; `/health` 200)",
        &frozen,
        &before,
        api,
    )
    .await;
    drop(frozen);
    let row = row?;
    let first = row.1;
    rows.push(row.0);

    // 2. The whole (new) decode process, at once after that recovery.
    let st = cli.json(&["status", "--json"]).await?;
    let api = unit_pid(&st, "decode-0")?;
    let frozen = Frozen::stop(api)?;
    let row = recovery(
        cli,
        "whole decode process frozen (SIGSTOP of its pid)",
        &frozen,
        &first,
        api,
    )
    .await;
    drop(frozen);
    rows.push(row?.0);
    Ok(())
}

/// Waits for an automatic recovery other than `before` to conclude with the
/// watch healthy, and reads its trigger from the history; returns the row
/// and the recovery's operation id.
async fn recovery(
    cli: &Cli,
    fault: &'static str,
    frozen: &Frozen,
    before: &Value,
    decode_pid: u32,
) -> anyhow::Result<(Row, Value)> {
    let deadline = Instant::now() + RECOVERY_LIMIT;
    let (w, seen_ms) = loop {
        let w = watch_of(&cli.json(&["status", "--json"]).await?);
        let rec = &w["last_recovery"];
        if rec["operation_id"] != *before && rec["verdict"].is_string() && w["state"] == "healthy" {
            break (w, mono_ms());
        }
        if Instant::now() > deadline {
            bail!(
                "{fault}: no automatic recovery concluded within {RECOVERY_LIMIT:?} (watch: {})",
                w["state"]
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let rec = &w["last_recovery"];
    let id = rec["operation_id"].clone();
    let history = cli.json(&["history", "demo", "--json"]).await?;
    let op = history
        .as_array()
        .and_then(|h| h.iter().find(|op| op["operation_id"] == id))
        .cloned()
        .with_context(|| format!("{fault}: operation {id} is not in the history"))?;
    let trigger = &op["trigger"];
    let st = cli.json(&["status", "--json"]).await?;
    let concluded = rec["concluded_mono_ms"].as_f64().unwrap_or(seen_ms);
    Ok((
        Row {
            fault,
            kind: trigger["wedge"]["kind"].as_str().map(str::to_owned),
            detection_s: trigger["wedge"]["detection_ms"].as_f64().map(|ms| ms / 1000.0),
            to_corestart_s: trigger["detected_mono_ms"]
                .as_f64()
                .map(|d| (d - frozen.at_mono_ms) / 1000.0),
            to_recovered_s: (concluded - frozen.at_mono_ms) / 1000.0,
            verdict: rec["verdict"].as_str().unwrap_or("").to_owned(),
            replaced: unit_pid(&st, "decode-0").is_ok_and(|p| p != decode_pid),
            automatic: trigger["automatic"] == true,
        },
        id,
    ))
}

/// A process stopped with SIGSTOP, continued (SIGCONT) on drop if it is
/// still the same process (its pid and `comm`).
struct Frozen {
    pid: u32,
    comm: String,
    at_mono_ms: f64,
}

impl Frozen {
    fn stop(pid: u32) -> anyhow::Result<Self> {
        let comm = comm_of(pid).with_context(|| format!("pid {pid} is gone"))?;
        kill(Pid::from_raw(pid as i32), Signal::SIGSTOP).with_context(|| format!("SIGSTOP {pid}"))?;
        Ok(Frozen {
            pid,
            comm,
            at_mono_ms: mono_ms(),
        })
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if comm_of(self.pid).as_deref() == Some(self.comm.as_str()) {
            let _ = kill(Pid::from_raw(self.pid as i32), Signal::SIGCONT);
        }
    }
}

/// `/proc/PID/stat`: (comm, parent pid).
fn stat_of(pid: u32) -> Option<(String, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (comm, rest) = stat.split_once('(')?.1.rsplit_once(')')?;
    let ppid = rest.split_whitespace().nth(1)?.parse().ok()?;
    Some((comm.to_owned(), ppid))
}

fn comm_of(pid: u32) -> Option<String> {
    stat_of(pid).map(|(c, _)| c)
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The child of `parent` whose `comm` starts with `name`.
fn child_named(parent: u32, name: &str) -> Option<u32> {
    all_pids()
        .into_iter()
        .find(|&pid| stat_of(pid).is_some_and(|(comm, ppid)| ppid == parent && comm.starts_with(name)))
}

/// Every descendant of `root`, children before grandchildren.
pub(crate) fn descendants(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = all_pids()
        .into_iter()
        .filter_map(|p| stat_of(p).map(|(_, ppid)| (p, ppid)))
        .collect();
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let parent = out[i];
        out.extend(parents.iter().filter(|(_, pp)| *pp == parent).map(|(p, _)| *p));
        i += 1;
    }
    out.remove(0);
    out
}

fn watch_of(status: &Value) -> Value {
    status["watch"]
        .as_array()
        .and_then(|w| w.iter().find(|p| p["pair"] == "demo"))
        .cloned()
        .unwrap_or(Value::Null)
}

fn unit_pid(status: &Value, unit: &str) -> anyhow::Result<u32> {
    status["agents"][0]["units"]
        .as_array()
        .and_then(|u| u.iter().find(|u| u["name"] == unit))
        .and_then(|u| u["pid"].as_u64())
        .map(|p| p as u32)
        .with_context(|| format!("no pid for {unit} in status"))
}

/// The held demo: stopped with SIGTERM by PID (it stops the stack it
/// started), then — only if it has not exited after two minutes — SIGKILL
/// of it and of every process under it, by PID.
pub(crate) struct Held {
    child: std::process::Child,
    log: PathBuf,
    stopped: bool,
}

impl Held {
    pub(crate) fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let pid = self.child.id();
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        let until = Instant::now() + Duration::from_secs(120);
        while Instant::now() < until {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                let _ = std::fs::remove_file(&self.log);
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let under = descendants(pid);
        eprintln!(
            "bench: the demo (pid {pid}) did not stop within 120 s of SIGTERM; SIGKILL to it and {under:?} (its log: {})",
            self.log.display()
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
        for p in under {
            let _ = kill(Pid::from_raw(p as i32), Signal::SIGKILL);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// The `pdwarden` CLI aimed at the held demo, with its CA and token.
pub(crate) struct Cli {
    bin: PathBuf,
    base: Vec<String>,
}

impl Cli {
    /// Runs `pdwarden ARGS` (killed if it outlives `limit`) and reads its
    /// JSON answer, whatever its exit code (2: a report that is not healthy;
    /// 1: `{"error": …}`).
    pub(crate) async fn json_within(&self, args: &[&str], limit: Duration) -> anyhow::Result<Value> {
        let out = tokio::time::timeout(
            limit,
            tokio::process::Command::new(&self.bin)
                .args(&self.base)
                .args(args)
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .with_context(|| format!("pdwarden {args:?} did not answer within {limit:?}"))??;
        let text = String::from_utf8_lossy(&out.stdout);
        let json = serde_json::from_str(&text).or_else(|e| {
            // Anything printed before the object (there should be nothing).
            match text.find("\n{") {
                Some(at) => serde_json::from_str(&text[at + 1..]),
                None => Err(e),
            }
        });
        json.with_context(|| {
            format!(
                "pdwarden {args:?} (exit {:?}): {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).lines().next().unwrap_or("")
            )
        })
    }

    /// As [`Cli::json_within`], within 60 s.
    async fn json(&self, args: &[&str]) -> anyhow::Result<Value> {
        self.json_within(args, Duration::from_secs(60)).await
    }
}

/// Starts `pdwarden demo --engine vllm EXTRA --json --hold` and waits for
/// its co-restart report (verdict healthy); returns it with the CLI aimed
/// at it. `label` names the demo's log file.
pub(crate) async fn start_demo(extra: &[&str], label: &str) -> anyhow::Result<(Held, Cli, Value)> {
    let pdwarden: PathBuf = std::env::current_exe()?
        .parent()
        .map(|d| d.join("pdwarden"))
        .filter(|p| p.is_file())
        .context("`pdwarden` is not built next to this binary (cargo build --bins)")?;
    let log = std::env::temp_dir().join(format!("pdwarden-bench-{label}-{}.log", std::process::id()));
    let mut child = Command::new(&pdwarden)
        .args(["demo", "--engine", "vllm"])
        .args(extra)
        .args(["--json", "--hold"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("cannot start pdwarden demo")?;
    let stdout = child.stdout.take().context("demo stdout")?;
    let held = Held {
        child,
        log: log.clone(),
        stopped: false,
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
        let _ = tx.send(lines.find(|l| l.starts_with('{')));
        // Keep reading: the demo never writes to a closed pipe.
        lines.for_each(drop);
    });
    let tail = || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().rev().take(5).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
    };
    let line = tokio::time::timeout(REPORT_LIMIT, rx)
        .await
        .with_context(|| format!("the demo gave no report within {REPORT_LIMIT:?}: {}", tail()))??
        .with_context(|| format!("the demo exited without a report: {}", tail()))?;
    let report: Value = serde_json::from_str(&line)?;
    let demo = &report["demo"];
    if demo.is_null() {
        bail!(
            "the demo's report has no `demo` object: {}",
            line.chars().take(300).collect::<String>()
        );
    }
    if !report["verdict"].as_str().unwrap_or("").starts_with("healthy") {
        bail!(
            "the demo's co-restart was not healthy: {} ({})",
            report["verdict"],
            report["reasons"][0]
        );
    }
    let url = demo["orchestrator"].as_str().context("demo.orchestrator missing")?;
    let mut base = vec!["--orchestrator".to_owned(), url.to_owned()];
    for key in ["ca", "token"] {
        if let Some(v) = demo[key].as_str() {
            base.push(format!("--{key}"));
            base.push(v.to_owned());
        }
    }
    Ok((held, Cli { bin: pdwarden, base }, report))
}

/// The watch settings the demo ran: the README's `[pair.watch]` defaults
/// with `engine = "vllm"`.
pub fn settings() -> String {
    let w = pdwarden_orchestrator::config::WatchConfig::default();
    let s = |ms: u64| format!("{} s", ms as f64 / 1000.0);
    format!(
        "the README's `[pair.watch]` defaults with `engine = \"vllm\"` (`--watch-defaults`): scrape every {}, stall budget {}, worst prefill {} tokens at {} tok/s, KV transfer ≤ {}, probes every {} right after an operation doubling to {} idle",
        s(w.scrape_interval_ms),
        s(w.stall_budget_ms),
        w.max_prompt_tokens,
        w.prefill_tok_per_s,
        s(w.max_kv_transfer_ms),
        s(w.min_probe_interval_ms),
        s(w.idle_probe_interval_ms),
    )
}
