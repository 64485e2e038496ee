//! `pdwarden`: what an operator types at 3 a.m.
//!
//! Exit codes: 0 when the verdict is healthy (or healthy after a cold start),
//! 2 for any other verdict, 1 when the command could not run at all (the
//! orchestrator unreachable, an unknown pair, a busy pair, a refused request),
//! always with a one-line reason.

mod certs;
mod gate;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
pub use pdwarden_client::{Connection, CouldNotRun, Credentials, new_request_id, print_json, status_reason};
use pdwarden_model::gate::report::history_lines;
use pdwarden_model::render::{render_findings, render_host_report};
use pdwarden_model::report::OperationReport;
use pdwarden_model::status::{AgentState, OperationRecord, Role, StatusView, StoredReport};
use pdwarden_model::watch::PairWatchView;
use pdwarden_proto::v1::{HistoryRequest, RestartUnitRequest, StatusRequest};

const EXAMPLES: &str = "\
Examples:
  pdwarden demo                                   a whole local stack and a real restart
  pdwarden restart pd-pair demo                   ordered co-restart, then a verdict
  pdwarden restart pd-pair demo --rolling         an xPyD pair, one P/D sub-pair at a time
  pdwarden restart pd-pair demo --only-sick       only the engines the path matrix names
  pdwarden verify demo --json                     probe the pair end to end, no restart
  pdwarden status                                 agents, units, each pair's watch state
  pdwarden history demo --limit 5                 the pair's last operations
  pdwarden diagnose demo                          probe every prefill → decode path, name the sick engine
  pdwarden gate demo --set-env KNOB=1             flip a knob, measure, keep or roll back
  pdwarden completions bash > /etc/bash_completion.d/pdwarden

Exit codes: 0 healthy (or kept), 2 any other verdict, 1 could not run (a one-line reason).
Connection: --orchestrator URL (PDWARDEN_ORCHESTRATOR), --ca, --cert/--key, PDWARDEN_TOKEN.";

#[derive(Parser)]
#[command(
    name = "pdwarden",
    version,
    about = "pdwarden: restart and verify prefill/decode pairs",
    after_help = EXAMPLES
)]
struct Cli {
    /// The orchestrator's gRPC address.
    #[arg(
        long,
        global = true,
        env = "PDWARDEN_ORCHESTRATOR",
        default_value = "http://127.0.0.1:7070"
    )]
    orchestrator: String,
    /// The pdwarden CA certificate, to verify an https:// orchestrator.
    #[arg(long, global = true, env = "PDWARDEN_CA")]
    ca: Option<PathBuf>,
    /// A client certificate to present (optional for the operator API).
    #[arg(long, global = true, env = "PDWARDEN_CERT", requires = "key")]
    cert: Option<PathBuf>,
    /// The client certificate's key.
    #[arg(long, global = true, env = "PDWARDEN_KEY", requires = "cert")]
    key: Option<PathBuf>,
    /// Operator token (`pdwarden certs token NAME` mints one); prefer the
    /// environment variable, which does not show in `ps`.
    #[arg(long, global = true, env = "PDWARDEN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Restart a PD pair in order, or (refused) a single engine.
    Restart {
        #[command(subcommand)]
        what: RestartWhat,
    },
    /// Probe a pair end to end through its router, without restarting it.
    Verify {
        name: String,
        #[arg(long)]
        json: bool,
        /// Also run the abort storm (cancels long prompts mid-prefill: disruptive in service).
        #[arg(long)]
        include_abort_storm: bool,
        /// Record this verification's greedy answer as the pair's reference,
        /// pinned, even when one exists (new weights meant) — only if the
        /// verification is otherwise healthy; a failing one records nothing.
        #[arg(long)]
        record_reference: bool,
        /// Idempotency key: a retry with a key already used starts nothing
        /// and names the operation it started (default: a fresh one).
        #[arg(long, value_name = "ID", value_parser = request_id_arg)]
        request_id: Option<String>,
    },
    /// Agents, units and pairs as the orchestrator knows them.
    Status {
        #[arg(long)]
        json: bool,
        /// Only this host's agent, GPUs and findings (repeatable); the
        /// quick answer on a large fleet.
        #[arg(long = "host", value_name = "HOST")]
        hosts: Vec<String>,
        /// Every host in full: without it a fleet of more than 64 hosts is
        /// summarised (the counts, and the hosts that need a look).
        #[arg(long)]
        detail: bool,
    },
    /// Probe every prefill → decode path of a pair once and name the
    /// engine(s) the failures point to; nothing is restarted (exit 0 all
    /// paths answer, 2 some fail, 1 could not run).
    Diagnose {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// A pair's operations, newest first.
    History {
        pair: String,
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// Print what operation OP captured before it stopped the pair
        /// (stacks, metrics, logs, GPUs) instead of the list.
        #[arg(long, value_name = "OP")]
        evidence: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Change a knob (environment, flags) on a pair, measure before and
    /// after, and keep it or roll it back (exit 0 kept, 2 rejected/failed).
    Gate(gate::GateArgs),
    /// Issue the CA, orchestrator and agent certificates, and operator tokens.
    Certs(certs::CertsArgs),
    /// Start a whole local stack (orchestrator, agent, two pd-sim engines, the
    /// real sglang-router) and run a real `restart pd-pair` against it.
    #[command(disable_help_flag = true)]
    Demo {
        /// Passed verbatim to `pdwarden-stack demo` (see `pdwarden demo --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Co-restarts, verifications and gates on a local stack in a loop for
    /// a bounded time, the orchestrator and the agent killed at random, the
    /// invariants checked after each (exit 0 none violated, 2 any).
    #[command(disable_help_flag = true)]
    Soak {
        /// Passed verbatim to `pdwarden-stack soak` (see `pdwarden soak --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Print a completion script for SHELL (bash, zsh, fish, elvish,
    /// powershell) on stdout.
    #[command(after_help = "Example: pdwarden completions zsh > ~/.zfunc/_pdwarden")]
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (pdwarden.1 and one per subcommand) into DIR;
    /// the Debian package ships them (scripts/package-deb.sh).
    #[command(hide = true)]
    Man { dir: std::path::PathBuf },
}

#[derive(Subcommand)]
enum RestartWhat {
    /// Ordered co-restart: prefill, then decode, then router, each gated on
    /// generation readiness; then end-to-end probes and a verdict.
    #[command(name = "pd-pair")]
    PdPair {
        name: String,
        #[arg(long)]
        json: bool,
        /// An xPyD pair (as many prefills as decodes, at least 2): restart
        /// one P/D sub-pair at a time — out of the pair's router, drained,
        /// restarted in order, probed over its own KV path and its paths to
        /// the other engines, back in — while the others serve; stops at the
        /// first sub-pair that is not healthy; then verifies the whole pair.
        #[arg(long, conflicts_with = "only_sick")]
        rolling: bool,
        /// An xPyD pair behind its router: probe every prefill → decode
        /// path, restart only the engines the failures point to (out of the
        /// router, in order, gated on generation), then what holds their old
        /// identity, prove every path, verify the pair; the whole ordered
        /// co-restart when the failures do not single anything out.
        #[arg(long)]
        only_sick: bool,
        /// Idempotency key: a retry with a key already used starts nothing
        /// and names the operation it started (default: a fresh one).
        #[arg(long, value_name = "ID", value_parser = request_id_arg)]
        request_id: Option<String>,
    },
    /// Restart one unit. Refused for a pair's engines: restart the pair.
    Unit {
        name: String,
        #[arg(long)]
        host: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

/// `--request-id`: printable, no spaces, at most 128 characters (the
/// orchestrator's rule, `model::fields`).
pub fn request_id_arg(s: &str) -> Result<String, String> {
    pdwarden_model::fields::check_request_id(s).map_err(|e| e.to_string())?;
    Ok(s.to_string())
}

/// A pair, unit or host name given as `what`, by the orchestrator's rule.
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    pdwarden_model::fields::check_name(name).map_err(|e| format!("{what}: {e}"))
}

/// What can be refused before anything is sent (issue 32): the names the
/// command gives and a `--ca` file with no PEM certificate (it would fail
/// every handshake with "UnknownIssuer"). One line naming the argument.
fn check_before_sending(cli: &Cli) -> Result<(), String> {
    let connects = match &cli.command {
        Cmd::Restart {
            what: RestartWhat::PdPair { name, .. },
        }
        | Cmd::Verify { name, .. }
        | Cmd::Diagnose { name, .. } => {
            check_name("pair", name)?;
            true
        }
        Cmd::History { pair, evidence, .. } => {
            check_name("pair", pair)?;
            if let Some(op) = evidence {
                pdwarden_model::fields::check_request_id(op).map_err(|e| format!("--evidence: {e}"))?;
            }
            true
        }
        Cmd::Restart {
            what: RestartWhat::Unit { name, host, .. },
        } => {
            check_name("unit", name)?;
            if let Some(h) = host {
                check_name("--host", h)?;
            }
            true
        }
        Cmd::Status { hosts, .. } => {
            hosts.iter().try_for_each(|h| check_name("--host", h))?;
            true
        }
        // `gate::run` checks its arguments itself, before connecting.
        Cmd::Gate(_) => true,
        Cmd::Certs(_) | Cmd::Demo { .. } | Cmd::Soak { .. } | Cmd::Completions { .. } | Cmd::Man { .. } => false,
    };
    if let (true, Some(ca)) = (connects, &cli.ca) {
        pdwarden_security::tls::check_ca_file("--ca", ca).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Whether the command answers in JSON (its refusals too).
fn wants_json(cmd: &Cmd) -> bool {
    match cmd {
        Cmd::Restart {
            what: RestartWhat::PdPair { json, .. } | RestartWhat::Unit { json, .. },
        }
        | Cmd::Verify { json, .. }
        | Cmd::Diagnose { json, .. }
        | Cmd::Status { json, .. }
        | Cmd::History { json, .. } => *json,
        Cmd::Gate(args) => args.json(),
        _ => false,
    }
}

/// The given idempotency key, or a fresh one.
pub fn request_id_or_new(given: Option<String>) -> String {
    given.unwrap_or_else(new_request_id)
}

fn exit_for(report: &OperationReport) -> ExitCode {
    if report.verdict.is_healthy() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}

fn could_not_run(reason: &str, json: bool) -> ExitCode {
    if json {
        pdwarden_client::say!("{}", serde_json::json!({ "error": reason }));
    }
    pdwarden_client::say_err!("pdwarden: {reason}");
    ExitCode::from(1)
}

/// The binary that runs `demo` and `soak`: the local stack, which this CLI
/// does not link.
const STACK_BIN: &str = "pdwarden-stack";

/// `pdwarden demo ARGS` and `pdwarden soak ARGS`, as git runs its external
/// subcommands: this process is replaced by `pdwarden-stack SUB ARGS` (the
/// binary next to this one, else on `PATH`), the arguments verbatim, the
/// global `--ca`/`--cert`/`--key`/`--token` given in its environment
/// (`PDWARDEN_CA` …, which it reads as this CLI does). Its argv\[0\] is
/// this one's, so its usage lines say `pdwarden demo`. Returns only when it
/// cannot be run: exit 1, one line.
fn run_stack(sub: &str, args: Vec<OsString>, given: &Credentials) -> ExitCode {
    use std::os::unix::process::CommandExt as _;
    let json = args.iter().any(|a| a == "--json");
    let exe = std::env::current_exe().ok();
    let next_to = exe
        .as_ref()
        .map(|e| e.with_file_name(STACK_BIN))
        .filter(|p| p.is_file());
    let on_path = || {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(STACK_BIN))
                .find(|p| p.is_file())
        })
    };
    let Some(bin) = next_to.or_else(on_path) else {
        let here = exe.map_or_else(|| "pdwarden".to_string(), |e| e.display().to_string());
        return could_not_run(
            &format!("{sub}: {STACK_BIN} not found next to {here} or on PATH (build it: cargo build --workspace)"),
            json,
        );
    };
    let mut cmd = std::process::Command::new(&bin);
    if let Some(arg0) = std::env::args_os().next() {
        cmd.arg0(arg0);
    }
    cmd.arg(sub).args(args);
    let paths = [
        ("PDWARDEN_CA", &given.ca),
        ("PDWARDEN_CERT", &given.cert),
        ("PDWARDEN_KEY", &given.key),
    ];
    for (var, path) in paths {
        if let Some(p) = path {
            cmd.env(var, p);
        }
    }
    if let Some(token) = &given.token {
        cmd.env("PDWARDEN_TOKEN", token);
    }
    let e = cmd.exec();
    could_not_run(&format!("{sub}: cannot run {}: {e}", bin.display()), json)
}

async fn restart_unit(conn: &Connection, name: &str, host: Option<String>, json: bool) -> ExitCode {
    let mut client = match conn.connect().await {
        Ok(c) => c,
        Err(CouldNotRun(r)) => return could_not_run(&r, json),
    };
    let res = client
        .restart_unit(RestartUnitRequest {
            host: host.unwrap_or_default(),
            unit: name.to_string(),
            request_id: uuid::Uuid::new_v4().to_string(),
        })
        .await;
    match res {
        Ok(_) => could_not_run("the orchestrator accepted a unit restart this CLI cannot follow", json),
        Err(s) => {
            let reason = status_reason(&s);
            if json {
                pdwarden_client::say!(
                    "{}",
                    serde_json::json!({ "refused": s.code() == tonic::Code::FailedPrecondition, "unit": name, "reason": reason })
                );
            }
            pdwarden_client::say_err!("pdwarden: {reason}");
            ExitCode::from(1)
        }
    }
}

/// This machine's wall clock in ms since the Unix epoch: how old a host's
/// report is, for people.
#[allow(clippy::disallowed_methods)]
fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

async fn status(conn: &Connection, json: bool, hosts: Vec<String>, detail: bool) -> anyhow::Result<()> {
    let mut client = conn.connect().await.map_err(|e| anyhow::anyhow!(e.0))?;
    let reply = client
        .status(StatusRequest { hosts, detail })
        .await
        .map_err(|s| anyhow::anyhow!(status_reason(&s)))?;
    let text = reply.into_inner().json;
    if json {
        let v: serde_json::Value = serde_json::from_str(&text).context("unreadable status")?;
        print_json(&v);
        return Ok(());
    }
    // The orchestrator's own view, read back typed (issue 33: it was read
    // as raw JSON, with "?" wherever a field was not where expected).
    let v: StatusView = serde_json::from_str(&text).context("unreadable status")?;
    // Foreign processes and critical findings in red, on a terminal only.
    let color = std::io::IsTerminal::is_terminal(&std::io::stdout()) && std::env::var_os("NO_COLOR").is_none();
    if let Some(w) = &v.security.warning {
        pdwarden_client::say!("WARNING: {w}");
    }
    if let Some(e) = &v.journal_unreadable {
        pdwarden_client::say!("JOURNAL UNREADABLE: {e}");
    }
    // Several orchestrators on etcd (issue 19): say which this one is.
    match &v.leadership {
        Role::Leader { token, .. } => {
            pdwarden_client::say!("orchestrator: LEADER (fencing token {token}) of journal {}", v.journal)
        }
        Role::Follower { leader_url, why } => pdwarden_client::say!(
            "orchestrator: FOLLOWER of journal {}: {why}{}",
            v.journal,
            match leader_url {
                Some(url) => format!("; operations and agents go to the leader, {url}"),
                None => String::new(),
            }
        ),
        Role::Sole => {}
    }
    if let Some(p) = &v.published {
        pdwarden_client::say!(
            "  (the leader's view of the fleet, as it published it {:.1} s ago)",
            p.age_ms as f64 / 1000.0
        );
    }
    let f = &v.fleet;
    let phases: Vec<String> = f.units_by_phase.iter().map(|(p, n)| format!("{n} {p}")).collect();
    pdwarden_client::say!(
        "fleet: {} hosts ({} connected, {} unknown, {} disconnected), {} units ({}), {} GPUs, {} findings",
        f.hosts,
        f.connected,
        f.unknown,
        f.disconnected,
        f.units,
        phases.join(", "),
        f.gpus,
        f.findings
    );
    if f.hosts_omitted > 0 {
        pdwarden_client::say!(
            "  {} hosts that need no look are not listed (status --host H, or --detail for every host)",
            f.hosts_omitted
        );
    }
    for a in &v.agents {
        let conn = match a.state {
            AgentState::Connected => "connected".to_string(),
            AgentState::Unknown => format!(
                "UNKNOWN: silent for {:.0} s, facts may be stale",
                a.silent_ms as f64 / 1000.0
            ),
            AgentState::Disconnected => "DISCONNECTED".to_string(),
        };
        pdwarden_client::say!("host {} ({conn}, agent {})", a.host, a.agent_version);
        for u in &a.units {
            pdwarden_client::say!(
                "  {:<14} {:<8} {:<11} pid {:<8} {}",
                u.name,
                u.role,
                u.phase,
                u.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
                u.base_url
            );
        }
        if let Some(report) = &a.host_report {
            for line in render_host_report(report, now_unix_ms(), color) {
                pdwarden_client::say!("{line}");
            }
        }
    }
    for p in &v.pairs {
        let running = p
            .running_operation
            .as_ref()
            .map(|o| format!(", running operation {o}"))
            .unwrap_or_default();
        pdwarden_client::say!(
            "pair {}: last verdict {}{running}",
            p.name,
            p.last_verdict.as_deref().unwrap_or("none")
        );
        if let Some(j) = &p.journal_error {
            pdwarden_client::say!(
                "  JOURNAL ERROR: operation {} ended ({}) but its conclusion is not written yet: {}; retried every few seconds, the pair is free once the journal's disk allows",
                j.operation_id,
                j.verdict,
                j.error
            );
        }
    }
    for line in render_watch(&v.watch) {
        pdwarden_client::say!("{line}");
    }
    for line in render_findings(&v.findings, color) {
        pdwarden_client::say!("{line}");
    }
    if v.fleet.findings_omitted > 0 {
        pdwarden_client::say!(
            "  … and {} more findings (status --host H for a host's)",
            v.fleet.findings_omitted
        );
    }
    Ok(())
}

/// Each watched pair's state and its evidence, for the human `status`:
/// the state (healthy / unproven / suspect / wedged / down / recovering /
/// held …), why, what the watch has spent on probes, the breaker's count,
/// and each unit that is not serving or idle with its reasons.
fn render_watch(watch: &[PairWatchView]) -> Vec<String> {
    let mut out = Vec::new();
    for p in watch {
        let shown = match p.state.as_str() {
            s @ ("wedged" | "down" | "held" | "suspect" | "watch_failed") => s.to_uppercase(),
            s => s.to_string(),
        };
        out.push(format!(
            "watch {}: {shown} (probes sent {}, deferred {}; automatic recoveries {}/{} in the window{})",
            p.pair,
            p.probes_sent,
            p.probes_deferred,
            p.recoveries_in_window,
            p.max_recoveries,
            if p.auto_recover { "" } else { ", auto-recover off" },
        ));
        if let Some(h) = &p.held {
            out.push(format!("  HELD for a human: {h}"));
        }
        for r in &p.reasons {
            out.push(format!("  - {r}"));
        }
        for u in p.units.iter().filter(|u| !u.ready()) {
            let st = serde_json::to_value(u.state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            out.push(format!(
                "  {}/{}: {st}{}",
                u.host,
                u.unit,
                if u.reasons.is_empty() {
                    String::new()
                } else {
                    format!(": {}", u.reasons.join("; "))
                }
            ));
        }
    }
    out
}

/// `diagnose NAME`: the path matrix and what it points to; true when
/// every path answered.
async fn diagnose(conn: &Connection, pair: &str, json: bool) -> anyhow::Result<bool> {
    let mut client = conn.connect().await.map_err(|e| anyhow::anyhow!(e.0))?;
    let reply = client
        .diagnose_pair(pdwarden_proto::v1::DiagnosePairRequest { pair: pair.to_string() })
        .await
        .map_err(|s| anyhow::anyhow!(status_reason(&s)))?;
    let text = reply.into_inner().json;
    let d: pdwarden_model::judge::paths::Diagnosis = serde_json::from_str(&text).context("unreadable diagnosis")?;
    if json {
        let v: serde_json::Value = serde_json::from_str(&text).context("unreadable diagnosis")?;
        print_json(&v);
    } else {
        for line in d.lines() {
            pdwarden_client::say!("{line}");
        }
    }
    Ok(d.localisation == pdwarden_model::judge::paths::Localisation::Healthy)
}

/// Lines of each captured document (metrics, server info) `history
/// --evidence` prints; `--json` carries them whole.
const EVIDENCE_BODY_LINES: usize = 15;

async fn history(
    conn: &Connection,
    pair: &str,
    limit: u32,
    evidence: Option<String>,
    json: bool,
) -> anyhow::Result<()> {
    let mut client = conn.connect().await.map_err(|e| anyhow::anyhow!(e.0))?;
    let reply = client
        .history(HistoryRequest {
            pair: pair.to_string(),
            limit,
            evidence: evidence.clone().unwrap_or_default(),
        })
        .await
        .map_err(|s| anyhow::anyhow!(status_reason(&s)))?;
    let text = reply.into_inner().json;
    if let Some(op) = evidence {
        if json {
            let v: serde_json::Value = serde_json::from_str(&text).context("unreadable evidence")?;
            print_json(&v);
            return Ok(());
        }
        let capture: pdwarden_model::forensics::Capture = serde_json::from_str(&text).context("unreadable evidence")?;
        for line in evidence_lines(pair, &op, &capture) {
            pdwarden_client::say!("{line}");
        }
        return Ok(());
    }
    if json {
        let v: serde_json::Value = serde_json::from_str(&text).context("unreadable history")?;
        print_json(&v);
        return Ok(());
    }
    let ops: Vec<OperationRecord> = serde_json::from_str(&text).context("unreadable history")?;
    for line in operation_lines(&ops) {
        pdwarden_client::say!("{line}");
    }
    Ok(())
}

/// `history PAIR --evidence OP` as text.
fn evidence_lines(pair: &str, op: &str, capture: &pdwarden_model::forensics::Capture) -> Vec<String> {
    let mut out = vec![format!(
        "evidence operation {op} of pair {pair} captured before it stopped anything:"
    )];
    out.extend(capture.render(EVIDENCE_BODY_LINES));
    out
}

/// `history PAIR` as text: each operation, who asked, its reasons, and
/// what it kept (a gate's measurements, path matrices, the reference, and
/// the one line of its evidence capture: issue 48, a reader sees that it
/// exists).
fn operation_lines(ops: &[OperationRecord]) -> Vec<String> {
    let mut out = Vec::new();
    for op in ops {
        let by = op
            .actor
            .as_ref()
            .and_then(|a| a["name"].as_str())
            .unwrap_or(if op.trigger.is_none() { "?" } else { "the watch" });
        out.push(format!(
            "{}  {}  {}  {}  by {by}",
            op.operation_id,
            op.kind,
            op.verdict.as_deref().unwrap_or("(running)"),
            op.state,
        ));
        let Some(report) = op.stored_report() else {
            continue;
        };
        out.extend(report.reasons().iter().map(|r| format!("    - {r}")));
        if let StoredReport::Gate(g) = &report {
            out.extend(history_lines(g).iter().map(|l| format!("    {l}")));
        }
        if let StoredReport::Operation(r) = &report {
            // Its path matrices (issue 37): the grid and what it pointed to.
            for d in &r.diagnoses {
                out.extend(d.lines().iter().map(|l| format!("    {l}")));
            }
            // The reference it recorded or the operator pinned (issue 34).
            if let Some(line) = r.golden.as_ref().and_then(|g| g.recorded_line(&r.operation_id)) {
                out.push(format!("    {line}"));
            }
            if let Some(e) = &r.evidence {
                out.push(format!("    {}", e.one_line(&op.pair, &op.operation_id)));
            }
        }
    }
    out
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(reason) = check_before_sending(&cli) {
        return could_not_run(&reason, wants_json(&cli.command));
    }
    let conn = Connection::new(
        cli.orchestrator.clone(),
        Credentials {
            ca: cli.ca.clone(),
            cert: cli.cert.clone(),
            key: cli.key.clone(),
            token: cli.token.clone(),
        },
    );
    match cli.command {
        Cmd::Restart {
            what:
                RestartWhat::PdPair {
                    name,
                    json,
                    rolling,
                    only_sick,
                    request_id,
                },
        } => match conn
            .follow_printing_asked(
                &name,
                json,
                if only_sick {
                    pdwarden_client::Asked::OnlySick
                } else {
                    pdwarden_client::Asked::Restart { rolling }
                },
                request_id_or_new(request_id),
            )
            .await
        {
            Ok(report) => {
                if json {
                    print_json(&report);
                }
                exit_for(&report)
            }
            Err(CouldNotRun(reason)) => could_not_run(&reason, json),
        },
        Cmd::Restart {
            what: RestartWhat::Unit { name, host, json },
        } => restart_unit(&conn, &name, host, json).await,
        Cmd::Verify {
            name,
            json,
            include_abort_storm,
            record_reference,
            request_id,
        } => match conn
            .follow_printing_asked(
                &name,
                json,
                pdwarden_client::Asked::Verify {
                    include_abort_storm,
                    record_reference,
                },
                request_id_or_new(request_id),
            )
            .await
        {
            Ok(report) => {
                if json {
                    print_json(&report);
                }
                exit_for(&report)
            }
            Err(CouldNotRun(reason)) => could_not_run(&reason, json),
        },
        Cmd::Status { json, hosts, detail } => match status(&conn, json, hosts, detail).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => could_not_run(&format!("{e:#}"), json),
        },
        Cmd::History {
            pair,
            limit,
            evidence,
            json,
        } => match history(&conn, &pair, limit, evidence, json).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => could_not_run(&format!("{e:#}"), json),
        },
        Cmd::Diagnose { name, json } => match diagnose(&conn, &name, json).await {
            Ok(healthy) => ExitCode::from(if healthy { 0 } else { 2 }),
            Err(e) => could_not_run(&format!("{e:#}"), json),
        },
        Cmd::Gate(args) => gate::run(&conn, args).await,
        Cmd::Certs(args) => certs::run(args),
        Cmd::Demo { args } => run_stack("demo", args, &conn.credentials),
        Cmd::Soak { args } => run_stack("soak", args, &conn.credentials),
        Cmd::Completions { shell } => {
            use clap::CommandFactory as _;
            clap_complete::generate(shell, &mut Cli::command(), "pdwarden", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Cmd::Man { dir } => {
            use clap::CommandFactory as _;
            match clap_mangen::generate_to(Cli::command(), &dir) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => could_not_run(
                    &format!("man: cannot write the pages into {}: {e}", dir.display()),
                    false,
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// OSC 52 (sets the clipboard), OSC 0 (retitles the window), `ESC [2J`
    /// (clears the screen) and C1 controls (`U+009B` is CSI by itself).
    const HOSTILE: &str = "\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07\x1b]0;owned\x07\x1b[2J\u{9b}2J\u{90}\u{9f}\r\x7f";

    /// What the terminal receives for `lines` (as the CLI prints them).
    fn printed(lines: &[String]) -> String {
        let mut out = Vec::new();
        for line in lines {
            pdwarden_client::say_to(&mut out, format_args!("{line}"), true).unwrap();
        }
        String::from_utf8(out).unwrap()
    }

    fn inert(text: &str) -> bool {
        !text.chars().any(|c| c.is_control() && c != '\n' && c != '\t')
    }

    /// Issue 48, item 4: `history --evidence` printed an engine log's raw
    /// control bytes. Every field an engine, router or log fills (log
    /// tail, documents, argv, thread names, frames, py-spy's error, what
    /// was missing, the readings) reaches the terminal escaped, and so do
    /// the history list's reasons and the watch's.
    #[test]
    fn engine_text_reaches_the_terminal_escaped() {
        use pdwarden_model::forensics::{Capture, DocumentCapture, ProcessCapture, ThreadCapture, UnitCapture};
        let h = |what: &str| format!("{what} {HOSTILE}");
        let capture = Capture {
            why: h("why"),
            missing: vec![h("missing")],
            units: vec![UnitCapture {
                unit: "decode-0".into(),
                log_tail: format!("{}\n{}", h("log 1"), h("log 2")),
                documents: vec![DocumentCapture {
                    name: "metrics".into(),
                    url: h("http://h/metrics"),
                    body: h("body"),
                    error: h("error"),
                    ..Default::default()
                }],
                processes: vec![ProcessCapture {
                    command: h("python -m sglang"),
                    py_spy_error: h("py-spy"),
                    threads: vec![ThreadCapture {
                        name: h("thread"),
                        frames: vec![h("frame")],
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = printed(&evidence_lines("demo", "op-1", &capture));
        assert!(inert(&text), "{text}");
        assert!(text.contains("log 1 \\u001b]52;c;"), "{text}");
        assert!(text.contains("\\u009b2J"), "{text}");
        let ops: Vec<OperationRecord> = serde_json::from_value(serde_json::json!([{
            "operation_id": "op-1", "kind": "co_restart", "pair": "demo", "state": "concluded",
            "started_unix_ms": 1, "ended_unix_ms": 2, "verdict": "failed", "request_id": null,
            "report": { "reasons": [h("decode-0 answered")] }, "actor": { "name": h("n"), "role": "operate" },
        }]))
        .unwrap();
        let text = printed(&operation_lines(&ops));
        assert!(inert(&text) && text.contains("decode-0 answered"), "{text}");
        let watch: Vec<PairWatchView> = serde_json::from_value(serde_json::json!([{
            "pair": "demo", "state": "wedged", "ready": false, "auto_recover": true,
            "probes_sent": 1, "probes_deferred": 0, "recoveries_in_window": 0, "max_recoveries": 3,
            "recovery_window_ms": 1, "held": h("held"), "reasons": [h("reason")],
            "last_probe": null, "last_recovery": null, "units": [],
        }]))
        .unwrap();
        let text = printed(&render_watch(&watch));
        assert!(inert(&text) && text.contains("reason"), "{text}");
    }

    /// Issue 48, item 4: nothing the CLI prints bypasses
    /// `pdwarden_client::say_to`, the one place control bytes are escaped
    /// (completions and man pages, which hold no engine text, excepted).
    #[test]
    fn the_cli_prints_only_through_the_escaping_sink() {
        for (file, source) in [
            ("main.rs", include_str!("main.rs")),
            ("gate.rs", include_str!("gate.rs")),
            ("certs.rs", include_str!("certs.rs")),
        ] {
            let code = source.split("#[cfg(test)]").next().unwrap_or_default();
            for banned in ["println!", "print!", "writeln!", "write!", "io::stderr", "io::Write"] {
                assert!(
                    !code.contains(banned),
                    "{file} writes with {banned}, not through say!/say_err!"
                );
            }
        }
    }

    /// Issue 48, item 3: a reader sees that an operation kept a capture,
    /// and its one line, in the history list (its contents need the
    /// `forensics` or `operate` role).
    #[test]
    fn the_history_list_says_a_capture_exists() {
        let summary = pdwarden_model::forensics::CaptureSummary {
            why: "automatic recovery: decode-0 wedged".into(),
            took_ms: 47,
            deadline_ms: 5000,
            partial: true,
            units: 3,
            python_threads: 2,
            ..Default::default()
        };
        let report = serde_json::json!({
            "operation_id": "op-1", "pair": "demo", "kind": "co_restart", "decode_start_policy": "after_prefill_ready",
            "verdict": "healthy", "reasons": [], "steps": [], "timeline": [], "probes": [],
            "attempts": [], "probe_latency": pdwarden_model::judge::stats::summarize(&[]), "suite": [],
            "warnings": [], "engine_counters": [], "router_counters": [], "warm_budget_ms": 1,
            "cold_allowance": {"source": "configured", "ms": 1}, "fingerprint": "", "sub_operations": [],
            "total_ms": 7, "evidence": summary,
        });
        let ops: Vec<OperationRecord> = serde_json::from_value(serde_json::json!([{
            "operation_id": "op-1", "kind": "co_restart", "pair": "demo", "state": "concluded",
            "started_unix_ms": 1, "ended_unix_ms": 2, "verdict": "healthy", "request_id": null,
            "report": report,
        }]))
        .unwrap();
        assert_eq!(
            operation_lines(&ops)[1],
            "    evidence: captured before the restart (automatic recovery: decode-0 wedged; 3 units, 2 Python threads, 47 ms, PARTIAL): pdwarden history demo --evidence op-1"
        );
    }

    /// Issue 18: the human `status` shows each pair's watch state and its
    /// evidence (it showed only the last verdict; the state was in `--json`).
    #[test]
    fn status_shows_the_watch_state_and_its_evidence() {
        let unit = |unit: &str, state: &str, reasons: &[&str]| {
            serde_json::json!({"host": "gpu-1", "unit": unit, "role": "decode", "state": state,
                "reasons": reasons, "metrics": null, "health_status": 200})
        };
        let watch: Vec<PairWatchView> = serde_json::from_value(serde_json::json!([{
            "pair": "demo", "state": "held", "ready": false, "auto_recover": true,
            "probes_sent": 7, "probes_deferred": 2, "recoveries_in_window": 3, "max_recoveries": 3,
            "recovery_window_ms": 3_600_000,
            "held": "3 automatic recoveries within 1 h: a person must look",
            "reasons": ["decode-0: 1 running, no progress for 9.5 s"],
            "last_probe": null, "last_recovery": null,
            "units": [
                unit("prefill-0", "idle", &[]),
                unit("decode-0", "wedged", &["no progress for 9.5 s", "health answers 200"]),
            ],
        }]))
        .unwrap();
        let lines = render_watch(&watch);
        assert_eq!(
            lines[0],
            "watch demo: HELD (probes sent 7, deferred 2; automatic recoveries 3/3 in the window)"
        );
        assert_eq!(
            lines[1],
            "  HELD for a human: 3 automatic recoveries within 1 h: a person must look"
        );
        assert_eq!(lines[2], "  - decode-0: 1 running, no progress for 9.5 s");
        assert_eq!(
            lines[3],
            "  gpu-1/decode-0: wedged: no progress for 9.5 s; health answers 200"
        );
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert!(render_watch(&[]).is_empty());
    }

    /// Issue 32: a pair, unit or host name out of bounds, and a `--ca` file
    /// with no PEM certificate in it ("UnknownIssuer" once connected), are
    /// refused before anything is sent, in one line naming the argument.
    #[test]
    fn names_and_the_ca_are_checked_before_anything_is_sent() {
        let dir = tempfile::tempdir().unwrap();
        let certs = pdwarden_security::certs::CertDir(dir.path().join("pki"));
        certs.init(&["localhost".into()]).unwrap();
        let passwd = dir.path().join("passwd");
        std::fs::write(&passwd, "root:x:0:0:root:/root:/bin/bash\n").unwrap();
        let ca = certs.ca().display().to_string();
        let passwd = passwd.display().to_string();
        let missing = dir.path().join("missing.pem").display().to_string();
        let check = |args: &[&str]| {
            let cli = Cli::try_parse_from(std::iter::once("pdwarden").chain(args.iter().copied())).unwrap();
            check_before_sending(&cli)
        };
        let names = "expected 1 to 128 letters, digits, '.', '_' and '-'";
        let big = "p".repeat(100 * 1024);
        for ok in [
            &["restart", "pd-pair", "demo"][..],
            &["verify", "demo"],
            &["history", "demo"],
            &["status", "--host", "gpu-1"],
            &["restart", "unit", "decode-0", "--host", "gpu-1"],
            &["--ca", &ca, "status"],
        ] {
            check(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        }
        for (args, says) in [
            (
                &["restart", "pd-pair", &big][..],
                format!("pair: 102400 bytes: {names}"),
            ),
            (
                &["verify", "demo#gate"],
                format!("pair: \"demo#gate\" has '#' at byte 4: {names}"),
            ),
            (
                &["history", "../../etc"],
                format!("pair: \"../../etc\" has '/' at byte 2: {names}"),
            ),
            (
                &["status", "--host", "a b"],
                format!("--host: \"a b\" has ' ' at byte 1: {names}"),
            ),
            (
                &["restart", "unit", "a/b"],
                format!("unit: \"a/b\" has '/' at byte 1: {names}"),
            ),
            (
                &["restart", "unit", "decode-0", "--host", ""],
                format!("--host: empty: {names}"),
            ),
            (
                &["--ca", &passwd, "status"],
                format!("--ca {passwd}: no PEM certificate in the file"),
            ),
            (
                &["--ca", &missing, "history", "demo"],
                format!("--ca {missing}: cannot read the file"),
            ),
        ] {
            let e = check(args).unwrap_err();
            assert!(
                e.starts_with(&says),
                "{:?}: {e:?} should start with {says:?}",
                &args[..args.len().min(3)]
            );
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
