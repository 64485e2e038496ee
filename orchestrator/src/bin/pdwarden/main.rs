//! `pdwarden`: what an operator types at 3 a.m.
//!
//! Exit codes: 0 when the verdict is healthy (or healthy after a cold start),
//! 2 for any other verdict, 1 when the command could not run at all (the
//! orchestrator unreachable, an unknown pair, a busy pair, a refused request),
//! always with a one-line reason.

mod certs;
mod demo;
mod drill;
mod gate;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use pdwarden_orchestrator::edge::hoststate::{HostReport, now_unix_ms, render_findings, render_host_report};
use pdwarden_orchestrator::judge::findings::HostFinding;
use pdwarden_orchestrator::ops::report::{
    OperationReport, ProbeRecord, StepRecord, TimelineRecord, live_phase_line, live_probe_line, live_step_line,
    render_summary,
};
use pdwarden_proto::v1::{
    HistoryRequest, RestartPairRequest, RestartUnitRequest, StatusRequest, VerifyPairRequest,
    control_client::ControlClient, operation_update,
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

#[derive(Parser)]
#[command(version, about = "pdwarden: restart and verify prefill/decode pairs")]
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
    },
    /// A pair's operations, newest first.
    History {
        pair: String,
        #[arg(long, default_value_t = 20)]
        limit: u32,
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
    Demo(demo::DemoArgs),
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

/// `--request-id`: printable, no spaces, at most 128 characters.
pub fn request_id_arg(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 128 || !s.chars().all(|c| c.is_ascii_graphic()) {
        return Err("expected 1 to 128 printable ASCII characters without spaces".into());
    }
    Ok(s.to_string())
}

/// The given idempotency key, or a fresh one.
pub fn request_id_or_new(given: Option<String>) -> String {
    given.unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
}

/// A failure to run at all (exit 1), as opposed to a verdict.
#[derive(Debug)]
pub struct CouldNotRun(pub String);

/// How this process reaches the orchestrator: TLS files and the operator token.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub token: Option<String>,
}

static CREDENTIALS: std::sync::Mutex<Option<Credentials>> = std::sync::Mutex::new(None);

/// Sets the credentials every later `connect` uses (the flags, or the demo's own).
pub fn set_credentials(c: Credentials) {
    *CREDENTIALS.lock().unwrap_or_else(|p| p.into_inner()) = Some(c);
}

pub fn credentials() -> Credentials {
    CREDENTIALS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .unwrap_or_default()
}

/// Adds `authorization: Bearer TOKEN` to every request.
#[derive(Clone)]
pub struct Bearer(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

pub type Client = ControlClient<tonic::service::interceptor::InterceptedService<Channel, Bearer>>;

pub async fn connect(url: &str) -> Result<Client, CouldNotRun> {
    let creds = credentials();
    let mut endpoint = Channel::from_shared(url.to_string())
        .map_err(|e| CouldNotRun(format!("invalid --orchestrator URL {url:?}: {e}")))?
        .connect_timeout(Duration::from_secs(5));
    if url.starts_with("https://") {
        let ca = creds.ca.as_ref().ok_or_else(|| {
            CouldNotRun(format!(
                "{url} uses TLS: pass --ca (or set PDWARDEN_CA) with the pdwarden CA certificate"
            ))
        })?;
        let read = |p: &PathBuf| std::fs::read(p).map_err(|e| CouldNotRun(format!("cannot read {}: {e}", p.display())));
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
        if let (Some(cert), Some(key)) = (&creds.cert, &creds.key) {
            tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| CouldNotRun(format!("TLS setup for {url}: {e}")))?;
    }
    let bearer = match &creds.token {
        Some(t) => Some(
            format!("Bearer {}", t.trim())
                .parse()
                .map_err(|_| CouldNotRun("the token is not valid header text".into()))?,
        ),
        None => None,
    };
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| CouldNotRun(format!("orchestrator unreachable at {url}: {}", error_chain(&e))))?;
    Ok(ControlClient::with_interceptor(channel, Bearer(bearer)))
}

/// An error with its causes (a TLS failure is only named in a source).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

fn status_reason(s: &tonic::Status) -> String {
    if s.message().is_empty() {
        format!("{:?}", s.code())
    } else {
        s.message().to_string()
    }
}

/// Runs `restart pd-pair`, printing live progress and the summary (unless
/// `json`), and returns the final report; the caller prints `--json`.
pub async fn restart_pair(
    url: &str,
    pair: &str,
    json: bool,
    request_id: String,
) -> Result<OperationReport, CouldNotRun> {
    follow_operation(url, pair, json, None, request_id).await
}

/// Starts a co-restart (or, with `verify` = Some(include_abort_storm), a
/// verification) and follows its update stream to the report.
pub async fn follow_operation(
    url: &str,
    pair: &str,
    json: bool,
    verify: Option<bool>,
    request_id: String,
) -> Result<OperationReport, CouldNotRun> {
    let mut client = connect(url).await?;
    let started = if let Some(include_abort_storm) = verify {
        client
            .verify_pair(VerifyPairRequest {
                pair: pair.to_string(),
                request_id,
                include_abort_storm,
            })
            .await
    } else {
        client
            .restart_pair(RestartPairRequest {
                pair: pair.to_string(),
                request_id,
            })
            .await
    };
    let mut stream = started.map_err(|s| CouldNotRun(status_reason(&s)))?.into_inner();
    let mut out = std::io::stdout();
    loop {
        let update = match stream.message().await {
            Ok(Some(u)) => u,
            Ok(None) => {
                return Err(CouldNotRun(
                    "the orchestrator ended the operation stream without a report".into(),
                ));
            }
            Err(s) => {
                return Err(CouldNotRun(format!("lost the operation stream: {}", status_reason(&s))));
            }
        };
        let line = match update.kind {
            Some(operation_update::Kind::Started(s)) if verify.is_some() => Some(format!(
                "verify pd-pair {}: operation {} (probes through the router; nothing restarted)",
                s.pair, s.operation_id
            )),
            Some(operation_update::Kind::Started(s)) => Some(format!(
                "restart pd-pair {}: operation {} (decode start policy: {})",
                s.pair, s.operation_id, s.decode_start_policy
            )),
            Some(
                kind @ (operation_update::Kind::Step(_)
                | operation_update::Kind::Phase(_)
                | operation_update::Kind::Probe(_)),
            ) => progress_line(kind),
            Some(operation_update::Kind::Report(r)) => {
                let report: OperationReport = serde_json::from_str(&r.json)
                    .map_err(|e| CouldNotRun(format!("unreadable report from the orchestrator: {e}")))?;
                if !json {
                    print!("{}", render_summary(&report));
                }
                return Ok(report);
            }
            None => None,
        };
        if let (Some(line), false) = (line, json) {
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    }
}

/// The live line for a step, phase or probe update (None for the others),
/// shared by every command that follows an operation's stream.
pub fn progress_line(kind: operation_update::Kind) -> Option<String> {
    match kind {
        operation_update::Kind::Step(s) => Some(live_step_line(&StepRecord {
            name: s.name,
            unit: s.unit,
            started_ms: s.started_ms,
            ended_ms: s.ended_ms,
            outcome: s.outcome,
        })),
        operation_update::Kind::Phase(p) => Some(live_phase_line(&TimelineRecord {
            unit: p.unit,
            role: p.role,
            phase: p.phase,
            at_ms: p.at_ms,
            detail: p.detail,
        })),
        operation_update::Kind::Probe(p) => Some(live_probe_line(&ProbeRecord {
            target: p.target,
            seq: p.seq,
            latency_ms: p.latency_ms,
            tokens: p.tokens,
            outcome: p.outcome,
            error: p.error,
            request_id: String::new(),
        })),
        _ => None,
    }
}

/// `--json` output: one object on one line.
pub fn print_json(value: &impl serde::Serialize) {
    match serde_json::to_string(value) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("pdwarden: cannot encode JSON output: {e}"),
    }
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
        println!("{}", serde_json::json!({ "error": reason }));
    }
    eprintln!("pdwarden: {reason}");
    ExitCode::from(1)
}

async fn restart_unit(url: &str, name: &str, host: Option<String>, json: bool) -> ExitCode {
    let mut client = match connect(url).await {
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
                println!(
                    "{}",
                    serde_json::json!({ "refused": s.code() == tonic::Code::FailedPrecondition, "unit": name, "reason": reason })
                );
            }
            eprintln!("pdwarden: {reason}");
            ExitCode::from(1)
        }
    }
}

async fn status(url: &str, json: bool, hosts: Vec<String>) -> anyhow::Result<()> {
    if let Some(bad) = hosts.iter().find(|h| h.trim().is_empty()) {
        anyhow::bail!("--host: {bad:?} is not a host name");
    }
    let mut client = connect(url).await.map_err(|e| anyhow::anyhow!(e.0))?;
    let reply = client
        .status(StatusRequest { hosts })
        .await
        .map_err(|s| anyhow::anyhow!(status_reason(&s)))?;
    let v: serde_json::Value = serde_json::from_str(&reply.into_inner().json).context("unreadable status")?;
    if json {
        print_json(&v);
        return Ok(());
    }
    // Foreign processes and critical findings in red, on a terminal only.
    let color = std::io::IsTerminal::is_terminal(&std::io::stdout()) && std::env::var_os("NO_COLOR").is_none();
    if let Some(w) = v["security"]["warning"].as_str() {
        println!("WARNING: {w}");
    }
    for a in v["agents"].as_array().into_iter().flatten() {
        let conn = match a["state"].as_str() {
            Some("connected") => "connected".to_string(),
            Some("unknown") => format!(
                "UNKNOWN: silent for {:.0} s, facts may be stale",
                a["silent_ms"].as_f64().unwrap_or(0.0) / 1000.0
            ),
            _ => "DISCONNECTED".to_string(),
        };
        println!(
            "host {} ({conn}, agent {})",
            a["host"].as_str().unwrap_or("?"),
            a["agent_version"].as_str().unwrap_or("?")
        );
        for u in a["units"].as_array().into_iter().flatten() {
            println!(
                "  {:<14} {:<8} {:<11} pid {:<8} {}",
                u["name"].as_str().unwrap_or("?"),
                u["role"].as_str().unwrap_or("?"),
                u["phase"].as_str().unwrap_or("?"),
                u["pid"].as_u64().map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
                u["base_url"].as_str().unwrap_or("")
            );
        }
        if let Ok(report) = serde_json::from_value::<HostReport>(a["host_report"].clone()) {
            for line in render_host_report(&report, now_unix_ms(), color) {
                println!("{line}");
            }
        }
    }
    for p in v["pairs"].as_array().into_iter().flatten() {
        let running = p["running_operation"]
            .as_str()
            .map(|o| format!(", running operation {o}"))
            .unwrap_or_default();
        println!(
            "pair {}: last verdict {}{running}",
            p["name"].as_str().unwrap_or("?"),
            p["last_verdict"].as_str().unwrap_or("none")
        );
    }
    let findings: Vec<HostFinding> = serde_json::from_value(v["findings"].clone()).unwrap_or_default();
    for line in render_findings(&findings, color) {
        println!("{line}");
    }
    Ok(())
}

async fn history(url: &str, pair: &str, limit: u32, json: bool) -> anyhow::Result<()> {
    let mut client = connect(url).await.map_err(|e| anyhow::anyhow!(e.0))?;
    let reply = client
        .history(HistoryRequest {
            pair: pair.to_string(),
            limit,
        })
        .await
        .map_err(|s| anyhow::anyhow!(status_reason(&s)))?;
    let v: serde_json::Value = serde_json::from_str(&reply.into_inner().json).context("unreadable history")?;
    if json {
        print_json(&v);
        return Ok(());
    }
    for op in v.as_array().into_iter().flatten() {
        println!(
            "{}  {}  {}  {}  by {}",
            op["operation_id"].as_str().unwrap_or("?"),
            op["kind"].as_str().unwrap_or("?"),
            op["verdict"].as_str().unwrap_or("(running)"),
            op["state"].as_str().unwrap_or("?"),
            op["actor"]["name"]
                .as_str()
                .unwrap_or(if op["trigger"].is_null() { "?" } else { "the watch" }),
        );
        for r in op["report"]["reasons"].as_array().into_iter().flatten() {
            println!("    - {}", r.as_str().unwrap_or(""));
        }
        if op["kind"] == "gate" {
            pdwarden_orchestrator::ops::gate::history_lines(&op["report"])
                .iter()
                .for_each(|l| println!("    {l}"));
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let url = cli.orchestrator.clone();
    set_credentials(Credentials {
        ca: cli.ca.clone(),
        cert: cli.cert.clone(),
        key: cli.key.clone(),
        token: cli.token.clone(),
    });
    match cli.command {
        Cmd::Restart {
            what: RestartWhat::PdPair { name, json, request_id },
        } => match restart_pair(&url, &name, json, request_id_or_new(request_id)).await {
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
        } => restart_unit(&url, &name, host, json).await,
        Cmd::Verify {
            name,
            json,
            include_abort_storm,
            request_id,
        } => match follow_operation(
            &url,
            &name,
            json,
            Some(include_abort_storm),
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
        Cmd::Status { json, hosts } => match status(&url, json, hosts).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => could_not_run(&format!("{e:#}"), json),
        },
        Cmd::History { pair, limit, json } => match history(&url, &pair, limit, json).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => could_not_run(&format!("{e:#}"), json),
        },
        Cmd::Gate(args) => gate::run(&url, args).await,
        Cmd::Certs(args) => certs::run(args),
        Cmd::Demo(args) => demo::run(args).await,
    }
}
