//! `pdwarden demo`: a whole local stack and a real `restart pd-pair`.
//!
//! It starts, on free loopback ports in a temporary directory, an
//! orchestrator and an agent (both real processes, the binaries next to this
//! one), and lets the agent supervise a prefill and a decode `pd-sim` and the
//! real `sglang-router` in PD mode. The restart it runs is the same code path
//! as `pdwarden restart pd-pair`. Everything it started is stopped by PID
//! before it exits, and its exit code is the restart's.
//!
//! Start-up phases follow seed 004's restart (port refused ~60 s, 503 until
//! ~70 s) and a small genuine cold-start penalty, scaled by `--time-scale`;
//! budgets and timeouts are scaled by the same factor so the verdict does not
//! depend on the scale.

// The local stack and its drills are an edge: they time real processes
// with the wall clock (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use pdwarden_orchestrator::edge::ports::late_bind_port;

use crate::drill::{self, Incident};
use crate::{CouldNotRun, could_not_run, exit_for, print_json, restart_pair};

#[derive(Args)]
pub struct DemoArgs {
    /// Print the restart's report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Multiplies every simulated duration and every budget (0 < F ≤ 1);
    /// default 0.05 (0.001 for the probe-storm drill's simulated hour).
    #[arg(long)]
    time_scale: Option<f64>,
    /// `after-prefill-ready` or `overlap`.
    #[arg(long, default_value = "after-prefill-ready")]
    decode_start_policy: String,
    /// sglang-router's `smg` launcher (default: .venv/bin/smg of this checkout, then PATH).
    #[arg(long, env = "PDWARDEN_SMG")]
    router_bin: Option<PathBuf>,
    /// Keep the temporary directory (configs, logs, journal) for inspection.
    #[arg(long)]
    keep: bool,
    /// After the restart, keep the stack running until SIGTERM or Ctrl-C, so
    /// `pdwarden --orchestrator URL status|history|restart ...` can be tried
    /// against it (the URL is printed, and is `demo.orchestrator` in --json).
    #[arg(long)]
    hold: bool,
    /// Extra pd-sim flags for the prefill, e.g. "--ttft-ms 900"; a flag given
    /// here replaces the demo's default for it. Split on whitespace.
    #[arg(long, allow_hyphen_values = true, default_value = "")]
    prefill_sim: String,
    /// Replay one incident of INCIDENTS.md on the local stack and print what
    /// pdwarden saw and concluded.
    #[arg(long, value_enum)]
    incident: Option<Incident>,
    /// With `--incident orchestrator-crash`: the co-restart step during
    /// which the orchestrator is killed.
    #[arg(long, value_enum, default_value = "restarting-decode", requires = "incident")]
    crash_at: drill::CrashAt,
    /// Run the stack without TLS or tokens (local development's
    /// `insecure_plaintext`); by default the demo issues a CA, certificates
    /// and an operator token in its directory and runs the secure path.
    #[arg(long)]
    insecure_plaintext: bool,
    /// Extra pd-sim flags for the decode (as --prefill-sim).
    #[arg(long, allow_hyphen_values = true, default_value = "")]
    decode_sim: String,
    /// A launcher put in front of both engines' argv, e.g. "env -u KNOB"
    /// (a wrapper that strips a variable: what the change gate must catch).
    /// Split on whitespace.
    #[arg(long, allow_hyphen_values = true, default_value = "")]
    engine_wrapper: String,
    /// The agent reads its GPUs from this fake GPU file (`gpu_source =
    /// "fake:PATH"`, see README "GPU"), sampled every 250 ms; default: none.
    #[arg(long)]
    gpu_fake: Option<PathBuf>,
    /// The watch's circuit breaker: automatic recoveries allowed per hour
    /// (simulated) before the pair is held for a human.
    #[arg(long, default_value_t = 3)]
    max_recoveries: u32,
    /// The watch reports a wedge but does not recover it.
    #[arg(long)]
    no_auto_recover: bool,
    /// The engines run one request at a time by design (pd-sim `--serial`):
    /// the concurrency step expects N requests to take N× one, not batching
    /// (`suite.concurrency.engines_batch = false`). The slot-leak drill sets it.
    #[arg(long)]
    engines_serial: bool,
    /// The slowest decode the watch plans for, in simulated tokens/s per
    /// request (default: the decode's `--tpot-ms`). Tell the watch the
    /// truth when a fault slows the decode live.
    #[arg(long)]
    watch_decode_tok_per_s: Option<f64>,
}

const DEFAULT_TIME_SCALE: f64 = 0.05;

/// Simulated start-up of one engine, in simulated ms (seed 004's shape).
struct EngineTiming {
    listen_after_ms: u64,
    ready_after_ms: u64,
}

pub fn sibling_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot locate the pdwarden binary")?;
    let dir = exe.parent().context("pdwarden binary has no parent directory")?;
    let p = dir.join(name);
    if p.is_file() {
        Ok(p)
    } else {
        bail!(
            "{name} not found next to pdwarden ({}); build the whole workspace first: cargo build --workspace",
            dir.display()
        )
    }
}

fn find_router(explicit: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        if p.is_file() {
            return Ok(p);
        }
        bail!("--router-bin {} does not exist", p.display());
    }
    let exe = std::env::current_exe()?;
    for dir in exe.ancestors().skip(1) {
        let candidate = dir.join(".venv/bin/smg");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join("smg");
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    bail!("sglang-router (smg) not found: run scripts/setup-router.sh, or pass --router-bin")
}

/// A child process this demo started; stopped by PID when dropped.
pub struct Owned {
    name: &'static str,
    child: Child,
}

impl Owned {
    /// SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("demo: {} did not stop within {grace:?}; killing it", self.name);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Owned {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

pub fn spawn_logged(name: &'static str, program: &Path, args: &[String], dir: &Path) -> anyhow::Result<Owned> {
    let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot start {}", program.display()))?;
    Ok(Owned { name, child })
}

/// Splits "--flag value --switch" into (flag, value) pairs; a token that
/// does not start with `--` is the previous flag's value.
fn parse_sim_flags(extra: &str) -> anyhow::Result<Vec<(String, Option<String>)>> {
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    for tok in extra.split_whitespace() {
        if tok.starts_with("--") {
            out.push((tok.to_string(), None));
        } else {
            match out.last_mut() {
                Some((_, v @ None)) => *v = Some(tok.to_string()),
                _ => bail!("unexpected value {tok:?}: each value must follow a --flag"),
            }
        }
    }
    Ok(out)
}

fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

fn toml_list(items: &[String]) -> String {
    let inner: Vec<String> = items.iter().map(|s| toml_str(s)).collect();
    format!("[{}]", inner.join(", "))
}

pub struct Stack {
    pub dir: tempfile::TempDir,
    /// The stack's orchestrator and the credentials the demo's own
    /// requests present.
    pub connection: crate::Connection,
    agent: Owned,
    orchestrator: Owned,
    pub plan: StackPlan,
    orchestrator_config: PathBuf,
}

impl Stack {
    /// SIGKILLs the orchestrator (no chance to clean up: its journal is left
    /// mid-operation) and starts a new one on the same config and journal.
    pub fn crash_and_restart_orchestrator(&mut self) -> anyhow::Result<(u32, u32)> {
        let old = self.orchestrator.pid();
        let _ = kill(Pid::from_raw(old as i32), Signal::SIGKILL);
        self.orchestrator.stop(Duration::from_secs(5));
        let fresh = spawn_logged(
            "orchestrator-restarted",
            &sibling_binary("pdwarden-orchestrator")?,
            &["--config".into(), self.orchestrator_config.display().to_string()],
            self.dir.path(),
        )?;
        let new = fresh.pid();
        // The old handle is already reaped; dropping it does nothing more.
        self.orchestrator = fresh;
        Ok((old, new))
    }
}

/// What the demo configured, for the drills that act on the stack.
pub struct StackPlan {
    pub time_scale: f64,
    pub prefill_argv: Vec<String>,
    pub decode_argv: Vec<String>,
    pub router_url: String,
    /// The orchestrator's readiness endpoint.
    pub readiness_url: String,
}

impl StackPlan {
    /// Simulated milliseconds as real ones, at this stack's time scale.
    pub fn scaled(&self, sim_ms: u64) -> Duration {
        Duration::from_millis(((sim_ms as f64 * self.time_scale).round() as u64).max(1))
    }
}

type Configs = (String, Option<crate::Credentials>, PathBuf, PathBuf, StackPlan);

fn write_configs(args: &DemoArgs, dir: &Path) -> anyhow::Result<Configs> {
    let scale = args.time_scale.unwrap_or(DEFAULT_TIME_SCALE);
    if !(scale > 0.0 && scale <= 1.0) {
        bail!("--time-scale must be in (0, 1], got {scale}");
    }
    if !matches!(args.decode_start_policy.as_str(), "after-prefill-ready" | "overlap") {
        bail!(
            "--decode-start-policy must be `after-prefill-ready` or `overlap`, got {:?}",
            args.decode_start_policy
        );
    }
    let scaled = |ms: u64| ((ms as f64 * scale).round() as u64).max(1);
    let pd_sim = sibling_binary("pd-sim")?;
    let smg = find_router(args.router_bin.clone())?;
    let (orch, prefill, bootstrap, decode, router, prom) = (
        late_bind_port()?,
        late_bind_port()?,
        late_bind_port()?,
        late_bind_port()?,
        late_bind_port()?,
        late_bind_port()?,
    );

    let engine = |role: &str, port: u16, t: &EngineTiming, extra: &str| -> anyhow::Result<Vec<String>> {
        let mut flags: Vec<(String, Option<String>)> = vec![
            ("--role".into(), Some(role.into())),
            ("--host".into(), Some("127.0.0.1".into())),
            ("--port".into(), Some(port.to_string())),
            ("--model".into(), Some("demo-model".into())),
            ("--listen-after-ms".into(), Some(t.listen_after_ms.to_string())),
            ("--ready-after-ms".into(), Some(t.ready_after_ms.to_string())),
            ("--ttft-ms".into(), Some("120".into())),
            ("--tpot-ms".into(), Some("12".into())),
            ("--cold-first-ms".into(), Some("6000".into())),
            ("--time-scale".into(), Some(scale.to_string())),
        ];
        if role == "prefill" {
            flags.push(("--bootstrap-port".into(), Some(bootstrap.to_string())));
        }
        for (flag, value) in parse_sim_flags(extra).with_context(|| format!("--{role}-sim"))? {
            if matches!(
                flag.as_str(),
                "--role" | "--host" | "--port" | "--bootstrap-port" | "--time-scale"
            ) {
                bail!("--{role}-sim: {flag} is set by the demo itself");
            }
            flags.retain(|(f, _)| *f != flag);
            flags.push((flag, value));
        }
        let mut v: Vec<String> = args.engine_wrapper.split_whitespace().map(str::to_string).collect();
        v.push(pd_sim.display().to_string());
        for (f, val) in flags {
            v.push(f);
            v.extend(val);
        }
        Ok(v)
    };
    let prefill_argv = engine(
        "prefill",
        prefill,
        &EngineTiming {
            listen_after_ms: 60_000,
            ready_after_ms: 70_000,
        },
        &format!(
            "{} {}",
            args.incident.map_or("", Incident::prefill_sim),
            args.prefill_sim
        ),
    )?;
    let decode_argv = engine(
        "decode",
        decode,
        &EngineTiming {
            listen_after_ms: 62_000,
            ready_after_ms: 72_000,
        },
        &format!("{} {}", args.incident.map_or("", Incident::decode_sim), args.decode_sim),
    )?;
    let router_argv: Vec<String> = vec![
        smg.display().to_string(),
        "launch".into(),
        "--pd-disaggregation".into(),
        "--prefill".into(),
        format!("http://127.0.0.1:{prefill}"),
        bootstrap.to_string(),
        "--decode".into(),
        format!("http://127.0.0.1:{decode}"),
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        router.to_string(),
        "--prometheus-port".into(),
        prom.to_string(),
        "--log-level".into(),
        "warn".into(),
    ];
    let gpu = match &args.gpu_fake {
        Some(path) => format!(
            "gpu_source = {}\ngpu_sample_interval_ms = 250\ngpu_snapshot_interval_ms = 2000",
            toml_str(&format!("fake:{}", path.display()))
        ),
        None => String::new(),
    };
    // The watch plans for the prefill's real speed (its pd-sim flag, else
    // pd-sim's default) and seed 001's longest prompt.
    let flag = |argv: &[String], name: &str| -> Option<f64> {
        argv.iter()
            .position(|a| a == name)
            .and_then(|i| argv.get(i + 1))
            .and_then(|v| v.parse().ok())
            .filter(|v: &f64| *v > 0.0)
    };
    let prefill_tok_per_s = flag(&prefill_argv, "--prefill-tok-per-s").unwrap_or(20_000.0);
    // ...and the decode's real speed (its --tpot-ms), and pd-sim's
    // --chunked-prefill-size (SGLang's 8192 on an 80 GB GPU).
    let decode_tok_per_s = match args.watch_decode_tok_per_s {
        Some(v) if v > 0.0 && v.is_finite() => v,
        Some(v) => bail!("--watch-decode-tok-per-s must be a finite number > 0, got {v}"),
        None => 1000.0 / flag(&decode_argv, "--tpot-ms").unwrap_or(12.0),
    };
    // pd-sim's --chunked-prefill-size 0 is chunking off: the whole prompt in one forward.
    let chunk_flag = prefill_argv
        .iter()
        .position(|a| a == "--chunked-prefill-size")
        .and_then(|i| prefill_argv.get(i + 1))
        .and_then(|v| v.parse::<i64>().ok());
    let prefill_chunk = match chunk_flag {
        Some(c) if c <= 0 => "# chunked prefill off: a chunk is the whole prompt".to_string(),
        Some(c) => format!("prefill_chunk_tokens = {c}"),
        None => "prefill_chunk_tokens = 8192".to_string(),
    };
    let (scheme, agent_security, orchestrator_security, credentials) = security(args, dir)?;
    let agent_toml = format!(
        r#"host = "local"
orchestrator = "{scheme}://127.0.0.1:{orch}"
state_dir = {state}
on_exit = "stop-units"
{gpu}
{agent_security}

[[unit]]
name = "prefill-0"
role = "prefill"
argv = {prefill_argv}
base_url = "http://127.0.0.1:{prefill}"
bootstrap_port = {bootstrap}

[[unit]]
name = "decode-0"
role = "decode"
argv = {decode_argv}
base_url = "http://127.0.0.1:{decode}"

[[unit]]
name = "router-0"
role = "router"
argv = {router_argv}
base_url = "http://127.0.0.1:{router}"
health_path = "/readiness"
"#,
        state = toml_str(&dir.join("agent").display().to_string()),
        prefill_argv = toml_list(&prefill_argv),
        decode_argv = toml_list(&decode_argv),
        router_argv = toml_list(&router_argv),
    );
    let readiness = late_bind_port()?;
    let orchestrator_toml = format!(
        r#"listen = "127.0.0.1:{orch}"
journal = {journal}
readiness_listen = "127.0.0.1:{readiness}"

# Agents re-attach within their reconnect backoff (at most 5 s).
resume_grace_ms = 20000

[[pair]]
name = "demo"
decode_start_policy = "{policy}"
prefill = [{{ host = "local", unit = "prefill-0" }}]
decode = [{{ host = "local", unit = "decode-0" }}]
router = [{{ host = "local", unit = "router-0" }}]

[pair.probe]
model = "demo-model"
prompt = "pdwarden readiness probe: reply with one word."
max_tokens = 8
warm_budget_ms = {warm}
cold_allowance_ms = {cold}
probe_timeout_ms = {probe_timeout}
warm_probes = 2
max_probes = 5

[pair.suite]
baseline_warning_ratio = 2.0
baseline_floor_ms = {floor}

[pair.suite.long_generation]
max_tokens = 256
max_token_gap_ms = {gap}
timeout_ms = {probe_timeout}

# TTFT, TPOT, end-to-end and batching budgets are derived from the pair's
# own warm figures (README "Verdicts"); only the stream-silence budget is
# absolute here, above what two shared CPUs can jitter.
[pair.suite.multi_turn]
timeout_ms = {probe_timeout}

[pair.suite.concurrency]
requests = 8
timeout_ms = {probe_timeout}
engines_batch = {engines_batch}

[pair.suite.abort_storm]
after_restart = false
requests = 3
prompt_tokens = 20000
abort_after_ms = {abort_after}
probe_timeout_ms = {probe_timeout}

[pair.gate]
prompt_tokens = [16, 256]
output_tokens = [24]
concurrency = [1, 4]
requests_per_cell = 16
request_timeout_ms = {probe_timeout}
tolerance_pct = 5.0
rollback_tolerance_pct = 10.0
# The demo's engines answer in ~10-30 ms (time scale 0.05): two runs minutes
# apart on a busy 2-core host drift by 1-2.5 ms at p90 with nothing changed.
min_effect_ms = 3.0

[pair.watch]
auto_recover = {auto_recover}
scrape_interval_ms = {scrape}
stall_budget_ms = {stall}
max_prompt_tokens = 50000
prefill_tok_per_s = {watch_tok_per_s}
max_output_tokens = 4096
decode_tok_per_s = {watch_decode_tok_per_s}
{prefill_chunk}
max_kv_transfer_ms = {max_kv_transfer}
# SGLang refreshes an idle engine's gauges every 30 s; pd-sim, scaled.
idle_gauge_refresh_ms = {idle_gauge_refresh}
idle_probe_interval_ms = {idle_probe}
min_probe_interval_ms = {min_probe}
max_probe_timeout_ms = {max_probe_timeout}
max_recoveries = {max_recoveries}
recovery_window_ms = {recovery_window}

[pair.timeouts]
prefill_ready_ms = {ready}
decode_ready_ms = {ready}
router_ready_ms = {router_ready}
stop_grace_ms = 5000
poll_interval_ms = 20
check_timeout_ms = {check}

{orchestrator_security}
"#,
        journal = toml_str(&dir.join("journal.sqlite").display().to_string()),
        policy = args.decode_start_policy,
        warm = scaled(1_000),
        cold = scaled(30_000),
        probe_timeout = scaled(120_000),
        ready = scaled(600_000),
        // The router itself is not simulated: it starts in about half a
        // second whatever the scale.
        router_ready = scaled(120_000).max(15_000),
        check = scaled(30_000).max(1_000),
        floor = scaled(400),
        gap = scaled(2_000),
        // 20,000 prompt tokens take 1 s of prefill at pd-sim's default speed:
        // abandoned at half that, they are cancelled mid-prefill.
        abort_after = scaled(500),
        // The watch's defaults, scaled; the scrape and the stall budget keep
        // floors that two shared CPUs can honour.
        // A drill that breaks the pair behind pdwarden's back shows what
        // `verify` concludes; the watch would otherwise race it and recover
        // the pair first (its own recovery has its own scenario).
        engines_batch = !args.engines_serial && !matches!(args.incident, Some(Incident::SlotLeak)),
        auto_recover = !args.no_auto_recover
            && !matches!(
                args.incident,
                Some(Incident::DecodeAloneRestart | Incident::PrefillAloneRestart)
            ),
        scrape = scaled(1_000).max(250),
        stall = scaled(8_000).max(2_000),
        watch_tok_per_s = prefill_tok_per_s / scale,
        watch_decode_tok_per_s = decode_tok_per_s / scale,
        max_kv_transfer = scaled(10_000),
        idle_gauge_refresh = scaled(30_000),
        idle_probe = scaled(60_000),
        min_probe = scaled(5_000),
        max_probe_timeout = scaled(600_000),
        max_recoveries = args.max_recoveries,
        recovery_window = scaled(3_600_000),
    );
    let agent_path = dir.join("agent.toml");
    let orch_path = dir.join("orchestrator.toml");
    std::fs::write(&agent_path, agent_toml)?;
    std::fs::write(&orch_path, orchestrator_toml)?;
    let plan = StackPlan {
        time_scale: scale,
        prefill_argv,
        decode_argv,
        router_url: format!("http://127.0.0.1:{router}"),
        readiness_url: format!("http://127.0.0.1:{readiness}"),
    };
    Ok((
        format!("{scheme}://127.0.0.1:{orch}"),
        credentials,
        orch_path,
        agent_path,
        plan,
    ))
}

/// The demo's security (issue 8): by default a CA, the orchestrator's and the
/// agent's certificates and an `operate` token, made in `dir/pki` and used by
/// this process's own requests; `--insecure-plaintext` says so instead.
/// Returns the URL scheme, the agent's and orchestrator's config sections,
/// and the credentials the demo's own requests present (none in plain text).
type Security = (&'static str, String, String, Option<crate::Credentials>);

fn security(args: &DemoArgs, dir: &Path) -> anyhow::Result<Security> {
    if args.insecure_plaintext {
        return Ok((
            "http",
            "insecure_plaintext = true".into(),
            "insecure_plaintext = true".into(),
            None,
        ));
    }
    let certs = pdwarden_orchestrator::edge::certs::CertDir(dir.join("pki"));
    certs.init(&["localhost".into(), "127.0.0.1".into()])?;
    let agent = certs.issue_agent("local")?;
    let token = pdwarden_orchestrator::edge::auth::new_token();
    let token_file = dir.join("pki/token");
    std::fs::write(&token_file, &token)?;
    let section = |f: &pdwarden_security::tls::TlsFiles| {
        format!(
            "[tls]\nca = {}\ncert = {}\nkey = {}\n",
            toml_str(&f.ca.display().to_string()),
            toml_str(&f.cert.display().to_string()),
            toml_str(&f.key.display().to_string())
        )
    };
    let orchestrator = format!(
        "{}\n[[operator]]\nname = \"demo\"\nrole = \"operate\"\ntoken_sha256 = \"{}\"\n",
        section(&certs.orchestrator()),
        pdwarden_orchestrator::edge::auth::hash_token(&token)
    );
    let credentials = crate::Credentials {
        ca: Some(certs.ca()),
        cert: None,
        key: None,
        token: Some(token),
    };
    Ok(("https", section(&agent), orchestrator, Some(credentials)))
}

async fn start_stack(args: &DemoArgs, given: crate::Credentials) -> anyhow::Result<Stack> {
    let dir = tempfile::Builder::new().prefix("pdwarden-demo-").tempdir()?;
    let (url, credentials, orch_cfg, agent_cfg, plan) = write_configs(args, dir.path())?;
    let orchestrator = spawn_logged(
        "orchestrator",
        &sibling_binary("pdwarden-orchestrator")?,
        &["--config".into(), orch_cfg.display().to_string()],
        dir.path(),
    )?;
    let agent = spawn_logged(
        "agent",
        &sibling_binary("pdwarden-agent")?,
        &["--config".into(), agent_cfg.display().to_string()],
        dir.path(),
    )?;
    let stack = Stack {
        dir,
        connection: crate::Connection::new(url, credentials.unwrap_or(given)),
        agent,
        orchestrator,
        plan,
        orchestrator_config: orch_cfg,
    };
    wait_for_agent(&stack.connection, Duration::from_secs(20)).await?;
    Ok(stack)
}

/// Polls `status` until the agent has registered its three units.
async fn wait_for_agent(conn: &crate::Connection, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    let mut last = String::from("orchestrator not reachable yet");
    while Instant::now() < deadline {
        match conn.connect().await {
            Ok(mut c) => match c.status(pdwarden_proto::v1::StatusRequest::default()).await {
                Ok(r) => {
                    let v: serde_json::Value = serde_json::from_str(&r.into_inner().json)?;
                    let units = v["agents"]
                        .as_array()
                        .and_then(|a| a.iter().find(|a| a["connected"] == true))
                        .and_then(|a| a["units"].as_array().map(|u| u.len()))
                        .unwrap_or(0);
                    if units == 3 {
                        return Ok(());
                    }
                    last = "agent not registered yet".into();
                }
                Err(s) => last = s.message().to_string(),
            },
            Err(CouldNotRun(r)) => last = r,
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("the local stack did not come up within {limit:?}: {last}")
}

/// `given`: the CLI's own credentials, used where the demo makes none
/// (`--insecure-plaintext`).
pub async fn run(args: DemoArgs, given: crate::Credentials) -> ExitCode {
    let started = Instant::now();
    if args.incident == Some(Incident::ProbeStorm) {
        // No pair to restart: three engines, three probing strategies.
        if !args.json {
            println!("drill probe-storm: {}\n", Incident::ProbeStorm.description());
        }
        // An hour in 3.6 s at the default storm scale.
        let scale = args.time_scale.unwrap_or(0.001);
        if !(scale > 0.0 && scale <= 1.0) {
            return could_not_run(&format!("--time-scale must be in (0, 1], got {scale}"), args.json);
        }
        return match drill::probe_storm(scale, args.json).await {
            Ok(v) => {
                if args.json {
                    print_json(&v);
                }
                if v["pdwarden_cheapest"] == true {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(2)
                }
            }
            Err(e) => could_not_run(&format!("demo: drill probe-storm: {e:#}"), args.json),
        };
    }
    let mut stack = match start_stack(&args, given).await {
        Ok(s) => s,
        Err(e) => return could_not_run(&format!("demo: {e:#}"), args.json),
    };
    if !args.json {
        println!(
            "demo stack in {} (orchestrator {}, logs there); restarting pd-pair `demo`",
            stack.dir.path().display(),
            stack.connection.url
        );
        if let Some(incident) = args.incident {
            println!("drill {}: {}", incident.name(), incident.description());
        }
        println!();
    }
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(e) => return could_not_run(&format!("demo: cannot handle SIGTERM: {e}"), args.json),
    };
    if let Some(incident @ (Incident::OrchestratorCrash | Incident::OrchestratorCrashMidGate)) = args.incident {
        let result = tokio::select! {
            r = async {
                if incident == Incident::OrchestratorCrash {
                    drill::orchestrator_crash(&mut stack, args.json, args.crash_at).await
                } else {
                    drill::orchestrator_crash_mid_gate(&mut stack, args.json).await
                }
            } => Some(r),
            _ = tokio::signal::ctrl_c() => None,
            _ = term.recv() => None,
        };
        stack.agent.stop(Duration::from_secs(15));
        stack.orchestrator.stop(Duration::from_secs(5));
        if args.keep {
            let kept = stack.dir.keep();
            eprintln!("demo: kept {}", kept.display());
        }
        return match result {
            Some(Ok(v)) => {
                if args.json {
                    print_json(&v);
                }
                if v["verdict"]
                    .as_str()
                    .is_some_and(|k| k.starts_with("healthy") || k == "interrupted_rolled_back")
                {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(2)
                }
            }
            Some(Err(e)) => could_not_run(&format!("demo: drill {}: {e:#}", incident.name()), args.json),
            None => could_not_run("demo: interrupted", args.json),
        };
    }
    let outcome = tokio::select! {
        r = restart_pair(&stack.connection, "demo", args.json, crate::request_id_or_new(None)) => Some(r),
        _ = tokio::signal::ctrl_c() => None,
        _ = term.recv() => None,
    };
    // A drill may act on the stack after the restart and verify again; its
    // conclusion is then the demo's.
    let mut verdict_report = match &outcome {
        Some(Ok(report)) => Some(report.clone()),
        _ => None,
    };
    let mut json_out = outcome
        .as_ref()
        .and_then(|o| o.as_ref().ok())
        .map(|r| serde_json::to_value(r).unwrap_or_default());
    if let (Some(incident), Some(Ok(report))) = (args.incident, &outcome) {
        match drill::follow_up(incident, &stack, report, args.json).await {
            Ok(Some(follow)) => {
                verdict_report = Some(follow.verify.clone());
                json_out = Some(follow.to_json(report));
            }
            Ok(None) => {}
            Err(e) => {
                stack.agent.stop(Duration::from_secs(15));
                stack.orchestrator.stop(Duration::from_secs(5));
                return could_not_run(&format!("demo: drill {}: {e:#}", incident.name()), args.json);
            }
        }
        if let Some(v) = json_out.as_mut() {
            v["incident"] = serde_json::json!(incident.name());
        }
    }
    if let (Some(mut v), true) = (json_out, args.json) {
        let creds = stack.connection.credentials.clone();
        v["demo"] = serde_json::json!({
            "orchestrator": stack.connection.url,
            "readiness": stack.plan.readiness_url,
            "dir": stack.dir.path().display().to_string(),
            // For `pdwarden --ca CA --token TOKEN` against the held stack
            // (a throw-away token for this demo only).
            "ca": creds.ca.map(|p| p.display().to_string()),
            "token": creds.token,
        });
        print_json(&v);
    }
    if args.hold && matches!(outcome, Some(Ok(_))) {
        if !args.json {
            println!(
                "\ndemo: holding the stack; try `pdwarden --orchestrator {}{} status`; Ctrl-C to stop",
                stack.connection.url,
                match &stack.connection.credentials.ca {
                    Some(ca) => format!(
                        " --ca {} --token $(cat {})",
                        ca.display(),
                        stack.dir.path().join("pki/token").display()
                    ),
                    None => String::new(),
                }
            );
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = term.recv() => {},
        }
    }
    // The agent stops its units (on_exit = "stop-units") before it exits.
    stack.agent.stop(Duration::from_secs(15));
    stack.orchestrator.stop(Duration::from_secs(5));
    if args.keep {
        let kept = stack.dir.keep();
        eprintln!("demo: kept {}", kept.display());
    }
    if !args.json {
        println!("demo: stack stopped; {:.1} s in all", started.elapsed().as_secs_f64());
    }
    match outcome {
        Some(Ok(report)) => exit_for(verdict_report.as_ref().unwrap_or(&report)),
        Some(Err(CouldNotRun(r))) => could_not_run(&format!("demo: {r}"), args.json),
        None => could_not_run("demo: interrupted", args.json),
    }
}
