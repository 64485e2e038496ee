//! The local stack's configuration, built as typed values — the
//! orchestrator's [`OrchestratorConfig`] and the agent's [`AgentConfig`] —
//! and written with their own serialisers, then read back through the same
//! `load` an operator's file goes through: a field the stack gets wrong is
//! the loader's error, never a TOML string that happens to parse.
//!
//! Start-up phases follow seed 004's restart (port refused ~60 s, 503 until
//! ~70 s) and a small genuine cold-start penalty, scaled by `--time-scale`;
//! budgets and timeouts are scaled by the same factor so the verdict does not
//! depend on the scale.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use pdwarden_agent::{AgentConfig, OnExit, Role, UnitConfig};
use pdwarden_client::Credentials;
use pdwarden_engines::EngineKind;
use pdwarden_orchestrator::config::{
    DecodeStartPolicy, OrchestratorConfig, PairConfig, ProbeConfig, ServingRouterConfig, SuiteConfig, TimeoutConfig,
    UnitRef, WatchConfig,
};
use pdwarden_orchestrator::edge::ports::late_bind_port;
use pdwarden_security::certs::CertDir;
use pdwarden_security::operators::{OperatorConfig, OperatorRole, hash_token, new_token};
use pdwarden_security::tls::TlsFiles;

use crate::args::{DemoArgs, DemoEngine, Incident};
use crate::process::{binary, find_router};
use crate::vllm::VllmStack;

pub const DEFAULT_TIME_SCALE: f64 = 0.05;

/// The least warm budget of a pd-sim pair, in real ms, whatever the time
/// scale: the part of every answer the scale does not shrink (see `plan`).
pub const WARM_BUDGET_FLOOR_MS: u64 = 200;

/// The one pair of the local stack, and the host its agent runs as.
pub const PAIR: &str = "demo";
/// The second pair of `--shared-router`, and the serving router's unit.
pub const PAIR_B: &str = "demo-b";
pub const SERVING_ROUTER: &str = "router-shared";
pub const HOST: &str = "local";
/// `--two-hosts`: the second agent's host.
pub const REMOTE: &str = "remote";
pub const MODEL: &str = "demo-model";

/// Simulated start-up of one engine, in simulated ms (seed 004's shape).
struct EngineTiming {
    listen_after_ms: u64,
    ready_after_ms: u64,
}

/// What the stack configured, for the drills that act on it.
#[derive(Debug, Clone)]
pub struct StackPlan {
    pub time_scale: f64,
    pub prefill_argv: Vec<String>,
    pub decode_argv: Vec<String>,
    pub router_url: String,
    /// The orchestrator's readiness endpoint (and its `/metrics`).
    pub readiness_url: String,
    /// The agent's Prometheus endpoint (`metrics_listen`).
    pub agent_metrics_url: String,
    /// `--shared-router`: the router clients use, in front of both pairs.
    pub serving_router_url: Option<String>,
    /// Each pair's engines: (pair, unit, base URL).
    pub engines: Vec<(String, String, String)>,
    /// `--decode-proxy`: the fault proxy in front of the decode.
    pub decode_proxy: Option<ProxyPlan>,
}

/// `pd-faultproxy` between the router and the decode (`--decode-proxy`).
#[derive(Debug, Clone)]
pub struct ProxyPlan {
    pub argv: Vec<String>,
    /// Where the router reaches the decode through it (and its control endpoint).
    pub url: String,
}

impl StackPlan {
    /// Simulated milliseconds as real ones, at this stack's time scale.
    pub fn scaled(&self, sim_ms: u64) -> Duration {
        Duration::from_millis(((sim_ms as f64 * self.time_scale).round() as u64).max(1))
    }
}

/// The stack's two configs, where they were written, and how to reach it.
pub struct Configs {
    pub orchestrator: OrchestratorConfig,
    pub agent: AgentConfig,
    pub orchestrator_path: PathBuf,
    pub agent_path: PathBuf,
    /// `https://127.0.0.1:PORT` (or `http://` in plain text).
    pub url: String,
    /// What this process presents (none in plain text).
    pub credentials: Option<Credentials>,
    pub plan: StackPlan,
    /// `--two-hosts`: the second agent's config and where it is.
    pub remote_agent: Option<(AgentConfig, PathBuf)>,
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

/// A flag's positive numeric value in an argv.
fn flag_value(argv: &[String], name: &str) -> Option<f64> {
    argv.iter()
        .position(|a| a == name)
        .and_then(|i| argv.get(i + 1))
        .and_then(|v| v.parse().ok())
        .filter(|v: &f64| *v > 0.0)
}

/// Builds both configs for `args`, writes them into `dir` and reads them
/// back through the loaders.
///
/// The order of the steps is the order of the refusals a user sees (the
/// flags first, then the binaries, then the engines' own flags) and of the
/// ports taken.
pub fn write_configs(args: &DemoArgs, dir: &Path) -> anyhow::Result<Configs> {
    let vllm = vllm_stack(args)?;
    let scale = time_scale(args, vllm.is_some())?;
    let policy = decode_start_policy(args)?;
    let xpyd = args.prefills > 1 || args.decodes > 1;
    check_stack_shape(args, xpyd)?;
    let sim = SimLauncher {
        wrapper: &args.engine_wrapper,
        pd_sim: binary("pd-sim")?,
        scale,
    };
    let smg = match vllm {
        None => find_router(args.router_bin.as_deref())?,
        Some(_) => PathBuf::new(),
    };
    let ports = Ports::take()?;
    let decode_proxy = decode_proxy(args, xpyd, ports.decode)?;
    // The decode as the router sees it.
    let router_decode = decode_proxy.as_ref().map(|p| p.url.clone());
    let extra = ExtraEngines::take(args)?;
    let mut prefill_argv = sim.argv(
        "prefill",
        ports.prefill,
        ports.bootstrap,
        &PREFILL_TIMING,
        &format!(
            "{} {}",
            args.incident.map_or("", Incident::prefill_sim),
            args.prefill_sim_args()
        ),
    )?;
    let mut decode_argv = sim.argv(
        "decode",
        ports.decode,
        0,
        &DECODE_TIMING,
        &format!(
            "{} {}",
            args.incident.map_or("", Incident::decode_sim),
            args.decode_sim_args()
        ),
    )?;
    let router_argv = pair_router_argv(args, &smg, &ports, &extra, router_decode.as_deref(), xpyd);
    let (scheme, tls, credentials) = security(args, dir)?;
    let url = format!("{scheme}://127.0.0.1:{}", ports.orchestrator);

    let mut agent = agent_config(args, dir, &url, ports.agent_metrics, tls.as_ref());
    agent.units = pair_units(
        args,
        &sim,
        &ports,
        &extra,
        [prefill_argv.clone(), decode_argv.clone(), router_argv],
    )?;
    let remote_agent = if args.two_hosts {
        Some(remote_agent(&mut agent, dir, &url, tls.as_ref())?)
    } else {
        None
    };
    let mut engines = vec![
        (PAIR.to_string(), "prefill-0".to_string(), loopback(ports.prefill)),
        (PAIR.to_string(), "decode-0".to_string(), loopback(ports.decode)),
    ];
    let mut serving_router_url = None;
    if args.shared_router {
        let shared = SharedRouter::take(args, &sim, &smg)?;
        agent.units.extend(shared.units);
        engines.extend(shared.engines);
        serving_router_url = Some(shared.url);
    }
    if let Some(v) = &vllm {
        let checkpoints = dir.join("checkpoints");
        v.checkpoint_copies(&checkpoints)
            .with_context(|| format!("copying the tiny model into {}", checkpoints.display()))?;
        agent.units = v
            .units(
                [ports.prefill, ports.decode, ports.router, ports.prometheus],
                &dir.join("kv"),
                router_decode.as_deref(),
                &checkpoints,
            )
            .to_vec();
        prefill_argv = agent.units[0].argv.clone();
        decode_argv = agent.units[1].argv.clone();
    }

    let mut orchestrator = orchestrator_config(args, dir, &ports, tls)?;
    orchestrator.pairs = demo_pairs(args, Scale(scale), policy, &prefill_argv, &decode_argv, vllm.is_some())?;

    let written = write_and_read_back(dir, &agent, &orchestrator)?;
    let remote_agent = match remote_agent {
        Some(remote) => {
            let path = dir.join("agent-remote.toml");
            std::fs::write(&path, remote.to_toml_string()?)?;
            Some((
                AgentConfig::load(&path).context("the stack's remote agent config")?,
                path,
            ))
        }
        None => None,
    };
    Ok(Configs {
        orchestrator: written.orchestrator,
        agent: written.agent,
        orchestrator_path: written.orchestrator_path,
        agent_path: written.agent_path,
        url,
        credentials,
        plan: StackPlan {
            time_scale: scale,
            prefill_argv,
            decode_argv,
            router_url: loopback(ports.router),
            readiness_url: loopback(ports.readiness),
            agent_metrics_url: loopback(ports.agent_metrics),
            serving_router_url,
            engines,
            decode_proxy,
        },
        remote_agent,
    })
}

/// `--two-hosts`: the second agent (host [`REMOTE`]) takes the second half
/// of each role from `agent` (of 2 prefills, `prefill-1`; of 3 decodes,
/// `decode-2`), named from 0 there: one unit template per host, so both
/// hosts run a `prefill-0` and a `decode-0`.
fn remote_agent(agent: &mut AgentConfig, dir: &Path, url: &str, tls: Option<&StackTls>) -> anyhow::Result<AgentConfig> {
    let mut remote = AgentConfig::new(REMOTE, url.to_string(), dir.join("agent-remote"));
    remote.on_exit = OnExit::StopUnits;
    remote.metrics_listen = Some(format!("127.0.0.1:{}", late_bind_port()?));
    remote.py_spy = agent.py_spy.clone();
    match tls.and_then(|t| t.remote_agent.clone()) {
        Some(t) => remote.tls = Some(t),
        None => remote.insecure_plaintext = true,
    }
    for role in ["prefill", "decode"] {
        let n = agent
            .units
            .iter()
            .filter(|u| u.name.starts_with(&format!("{role}-")))
            .count();
        for (k, i) in (n.div_ceil(2)..n).enumerate() {
            let there = format!("{role}-{i}");
            let at = agent
                .units
                .iter()
                .position(|u| u.name == there)
                .with_context(|| format!("--two-hosts: no {there} to move"))?;
            let mut unit = agent.units.remove(at);
            unit.name = format!("{role}-{k}");
            remote.units.push(unit);
        }
    }
    Ok(remote)
}

/// `http://127.0.0.1:PORT`: every process of the stack is on loopback.
fn loopback(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

/// With `--engine vllm`, the installed vLLM stack; pd-sim's own flags are
/// refused with it, since a real engine runs in real time, on its own
/// command line.
fn vllm_stack(args: &DemoArgs) -> anyhow::Result<Option<VllmStack>> {
    match args.engine {
        DemoEngine::PdSim => Ok(None),
        DemoEngine::Vllm => {
            for (given, flag) in [
                (args.time_scale.is_some(), "--time-scale"),
                (!args.prefill_sim.trim().is_empty(), "--prefill-sim"),
                (!args.decode_sim.trim().is_empty(), "--decode-sim"),
                (!args.engine_wrapper.trim().is_empty(), "--engine-wrapper"),
                (args.incident.is_some(), "--incident"),
                (args.engines_serial, "--engines-serial"),
                (args.prefills > 1, "--prefills"),
                (args.decodes > 1, "--decodes"),
                (args.shared_router, "--shared-router"),
                (args.rolling, "--rolling"),
                (args.router_policy.is_some(), "--router-policy"),
            ] {
                if given {
                    bail!("{flag} is pd-sim's: not with --engine vllm");
                }
            }
            Ok(Some(VllmStack::find()?))
        }
    }
}

/// The stack's time scale: 1 for a real engine, else `--time-scale` (by
/// default [`DEFAULT_TIME_SCALE`]), in (0, 1].
fn time_scale(args: &DemoArgs, real_engine: bool) -> anyhow::Result<f64> {
    let scale = if real_engine {
        1.0
    } else {
        args.time_scale.unwrap_or(DEFAULT_TIME_SCALE)
    };
    if !(scale > 0.0 && scale <= 1.0) {
        bail!("--time-scale must be in (0, 1], got {scale}");
    }
    Ok(scale)
}

/// `--decode-start-policy`, by its config name.
fn decode_start_policy(args: &DemoArgs) -> anyhow::Result<DecodeStartPolicy> {
    Ok(match args.decode_start_policy.as_str() {
        "after-prefill-ready" => DecodeStartPolicy::AfterPrefillReady,
        "overlap" => DecodeStartPolicy::Overlap,
        other => bail!("--decode-start-policy must be `after-prefill-ready` or `overlap`, got {other:?}"),
    })
}

/// The stack's shapes that do not combine: the incident drills run on a
/// 1P1D pair, `--shared-router` is two 1P1D pairs, and `--rolling` needs N
/// prefills and N decodes (N >= 2) of one pair whose link keeps no peer
/// state (`--kv-transfer nixl`, issue 37).
fn check_stack_shape(args: &DemoArgs, xpyd: bool) -> anyhow::Result<()> {
    if xpyd && args.incident.is_some() {
        bail!("--prefills/--decodes: the incident drills run on a 1P1D pair, not with --incident");
    }
    if args.shared_router && (xpyd || args.incident.is_some()) {
        bail!("--shared-router: two 1P1D pairs behind one router, not with --prefills/--decodes or --incident");
    }
    if args.rolling
        && (args.prefills < 2 || args.prefills != args.decodes || args.shared_router || args.incident.is_some())
    {
        bail!(
            "--rolling: an xPyD pair of N prefills and N decodes (N >= 2, e.g. --prefills 2 --decodes 2), not with --shared-router or --incident; got --prefills {} --decodes {}",
            args.prefills,
            args.decodes
        );
    }
    if args.two_hosts
        && (args.prefills < 2
            || args.decodes < 2
            || args.engine != crate::args::DemoEngine::PdSim
            || args.shared_router
            || args.rolling
            || args.decode_proxy.is_some())
    {
        bail!(
            "--two-hosts: a pd-sim pair of at least 2 prefills and 2 decodes (e.g. --prefills 2 --decodes 3), each role split between the hosts, not with --shared-router, --rolling, --decode-proxy or --engine vllm"
        );
    }
    if args.rolling && args.kv_transfer != crate::args::DemoKvTransfer::Nixl {
        bail!(
            "--rolling: the engines' KV link keeps state about their peers (--kv-transfer sglang or address: a restarted prefill leaves every decode its old identity), so no sub-pair can go back while the others serve; add --kv-transfer nixl"
        );
    }
    Ok(())
}

/// The loopback ports of the first prefill and decode, the pair's router
/// and the stack's own endpoints, taken in the order of the fields.
struct Ports {
    orchestrator: u16,
    prefill: u16,
    /// The first prefill's KV bootstrap port.
    bootstrap: u16,
    decode: u16,
    router: u16,
    /// The pair router's Prometheus port.
    prometheus: u16,
    /// The orchestrator's readiness endpoint.
    readiness: u16,
    agent_metrics: u16,
}

impl Ports {
    fn take() -> std::io::Result<Self> {
        // A struct expression evaluates its fields in the order written.
        Ok(Ports {
            orchestrator: late_bind_port()?,
            prefill: late_bind_port()?,
            bootstrap: late_bind_port()?,
            decode: late_bind_port()?,
            router: late_bind_port()?,
            prometheus: late_bind_port()?,
            readiness: late_bind_port()?,
            agent_metrics: late_bind_port()?,
        })
    }
}

/// `--decode-proxy`: `pd-faultproxy` on a port of its own in front of a
/// 1P1D pair's decode, with the given fault flags.
fn decode_proxy(args: &DemoArgs, xpyd: bool, decode: u16) -> anyhow::Result<Option<ProxyPlan>> {
    match &args.decode_proxy {
        None => Ok(None),
        Some(_) if xpyd || args.shared_router => {
            bail!(
                "--decode-proxy: one proxy in front of a 1P1D pair's decode, not with --prefills/--decodes or --shared-router"
            )
        }
        Some(flags) => {
            let port = late_bind_port()?;
            let mut argv = vec![
                binary("pd-faultproxy")?.display().to_string(),
                "--listen".to_string(),
                format!("127.0.0.1:{port}"),
                "--upstream".to_string(),
                format!("http://127.0.0.1:{decode}"),
            ];
            argv.extend(flags.split_whitespace().map(str::to_string));
            Ok(Some(ProxyPlan {
                argv,
                url: format!("http://127.0.0.1:{port}"),
            }))
        }
    }
}

/// The further engines of an xPyD pair, past `prefill-0` and `decode-0`.
struct ExtraEngines {
    /// `prefill-1`, ...: (port, bootstrap port).
    prefills: Vec<(u16, u16)>,
    /// `decode-1`, ...: port.
    decodes: Vec<u16>,
}

impl ExtraEngines {
    fn take(args: &DemoArgs) -> anyhow::Result<Self> {
        let prefills = (1..args.prefills)
            .map(|_| Ok((late_bind_port()?, late_bind_port()?)))
            .collect::<anyhow::Result<_>>()?;
        let decodes = (1..args.decodes).map(|_| late_bind_port()).collect::<Result<_, _>>()?;
        Ok(ExtraEngines { prefills, decodes })
    }
}

const PREFILL_TIMING: EngineTiming = EngineTiming {
    listen_after_ms: 60_000,
    ready_after_ms: 70_000,
};
const DECODE_TIMING: EngineTiming = EngineTiming {
    listen_after_ms: 62_000,
    ready_after_ms: 72_000,
};

/// How the stack launches a pd-sim engine.
struct SimLauncher<'a> {
    /// `--engine-wrapper`, put in front of every engine's argv.
    wrapper: &'a str,
    pd_sim: PathBuf,
    scale: f64,
}

impl SimLauncher<'_> {
    /// One engine's argv: the demo's flags for `role` on `port` (and its
    /// `bootstrap` port for a prefill), then the `extra` pd-sim flags, each
    /// replacing the demo's own; the ones that wire the stack are refused.
    fn argv(
        &self,
        role: &str,
        port: u16,
        bootstrap: u16,
        t: &EngineTiming,
        extra: &str,
    ) -> anyhow::Result<Vec<String>> {
        let mut flags: Vec<(String, Option<String>)> = vec![
            ("--role".into(), Some(role.into())),
            ("--host".into(), Some("127.0.0.1".into())),
            ("--port".into(), Some(port.to_string())),
            ("--model".into(), Some(MODEL.into())),
            ("--listen-after-ms".into(), Some(t.listen_after_ms.to_string())),
            ("--ready-after-ms".into(), Some(t.ready_after_ms.to_string())),
            ("--ttft-ms".into(), Some("120".into())),
            ("--tpot-ms".into(), Some("12".into())),
            ("--cold-first-ms".into(), Some("6000".into())),
            ("--time-scale".into(), Some(self.scale.to_string())),
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
        let mut v: Vec<String> = self.wrapper.split_whitespace().map(str::to_string).collect();
        v.push(self.pd_sim.display().to_string());
        for (f, val) in flags {
            v.push(f);
            v.extend(val);
        }
        Ok(v)
    }
}

/// An sglang-router (`smg launch`) in PD mode with these `workers`
/// (`--prefill URL BOOTSTRAP`, `--decode URL`), its `--policy` if given,
/// on loopback `port` with its Prometheus endpoint on `prometheus`.
fn router_launch(smg: &Path, workers: Vec<String>, policy: Option<&str>, port: u16, prometheus: u16) -> Vec<String> {
    let mut v: Vec<String> = vec![smg.display().to_string(), "launch".into(), "--pd-disaggregation".into()];
    v.extend(workers);
    if let Some(policy) = policy {
        v.extend(["--policy".into(), policy.to_string()]);
    }
    v.extend(
        [
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--prometheus-port",
            &prometheus.to_string(),
            "--log-level",
            "warn",
        ]
        .map(String::from),
    );
    v
}

/// The pair's router: every prefill and decode of the pair (the decode
/// through `router_decode`, the proxy, when there is one), and round robin
/// for an xPyD pair unless `--router-policy` says otherwise.
fn pair_router_argv(
    args: &DemoArgs,
    smg: &Path,
    ports: &Ports,
    extra: &ExtraEngines,
    router_decode: Option<&str>,
    xpyd: bool,
) -> Vec<String> {
    let mut workers = Vec::new();
    for (port, boot) in std::iter::once((ports.prefill, ports.bootstrap)).chain(extra.prefills.iter().copied()) {
        workers.extend(["--prefill".into(), loopback(port), boot.to_string()]);
    }
    workers.extend([
        "--decode".into(),
        router_decode.map_or_else(|| loopback(ports.decode), str::to_string),
    ]);
    for port in extra.decodes.iter().copied() {
        workers.extend(["--decode".into(), loopback(port)]);
    }
    // cache_aware (the router's default) sends an idle pair's similar
    // prompts to one worker: an xPyD pair's verification then reaches the
    // others only by the co-restart's own direct PD requests.
    let policy = match (&args.router_policy, xpyd) {
        (Some(policy), _) => Some(policy.as_str()),
        (None, true) => Some("round_robin"),
        (None, false) => None,
    };
    router_launch(smg, workers, policy, ports.router, ports.prometheus)
}

/// The agent: one host, its metrics endpoint, the fake GPU file if one is
/// given, and its certificate (or plain text). Its units are the caller's.
fn agent_config(args: &DemoArgs, dir: &Path, url: &str, agent_metrics: u16, tls: Option<&StackTls>) -> AgentConfig {
    let mut agent = AgentConfig::new(HOST, url.to_string(), dir.join("agent"));
    agent.on_exit = OnExit::StopUnits;
    agent.metrics_listen = Some(format!("127.0.0.1:{agent_metrics}"));
    agent.py_spy = args.py_spy.clone().or_else(crate::process::find_py_spy);
    if let Some(path) = &args.gpu_fake {
        agent.gpu_source = format!("fake:{}", path.display());
        agent.gpu_sample_interval_ms = 250;
        agent.gpu_snapshot_interval_ms = 2000;
    }
    match tls {
        Some(t) => agent.tls = Some(t.agent.clone()),
        None => agent.insecure_plaintext = true,
    }
    agent
}

/// The pair's units on the agent, in this order: `prefill-0` and
/// `decode-0` (with `first_argv`'s argvs), the further prefills and decodes
/// of an xPyD pair (with `--prefill-sim`/`--decode-sim` only, no incident),
/// then `router-0`.
fn pair_units(
    args: &DemoArgs,
    sim: &SimLauncher,
    ports: &Ports,
    extra: &ExtraEngines,
    first_argv: [Vec<String>; 3],
) -> anyhow::Result<Vec<UnitConfig>> {
    let [prefill_argv, decode_argv, router_argv] = first_argv;
    let mut units = vec![
        sim_unit(
            "prefill-0",
            Role::Prefill,
            prefill_argv,
            ports.prefill,
            Some(ports.bootstrap),
        ),
        sim_unit("decode-0", Role::Decode, decode_argv, ports.decode, None),
    ];
    for (i, (port, boot)) in extra.prefills.iter().enumerate() {
        let argv = sim.argv("prefill", *port, *boot, &PREFILL_TIMING, &args.prefill_sim_args())?;
        units.push(sim_unit(
            &format!("prefill-{}", i + 1),
            Role::Prefill,
            argv,
            *port,
            Some(*boot),
        ));
    }
    for (i, port) in extra.decodes.iter().enumerate() {
        let argv = sim.argv("decode", *port, 0, &DECODE_TIMING, &args.decode_sim_args())?;
        units.push(sim_unit(&format!("decode-{}", i + 1), Role::Decode, argv, *port, None));
    }
    units.push(sim_unit("router-0", Role::Router, router_argv, ports.router, None));
    Ok(units)
}

/// `--shared-router`: pair B (its engines behind its own router) and the
/// serving router in front of both pairs, started with no worker: each
/// pair joins it after a healthy restart.
struct SharedRouter {
    /// `b-prefill-0`, `b-decode-0`, `b-router-0` and the serving router.
    units: Vec<UnitConfig>,
    /// Pair B's engines: (pair, unit, base URL).
    engines: Vec<(String, String, String)>,
    /// The serving router's URL.
    url: String,
}

impl SharedRouter {
    fn take(args: &DemoArgs, sim: &SimLauncher, smg: &Path) -> anyhow::Result<Self> {
        let (bp, bb, bd, br, bprom, sr, sprom) = (
            late_bind_port()?,
            late_bind_port()?,
            late_bind_port()?,
            late_bind_port()?,
            late_bind_port()?,
            late_bind_port()?,
            late_bind_port()?,
        );
        let p = sim_unit(
            "b-prefill-0",
            Role::Prefill,
            sim.argv("prefill", bp, bb, &PREFILL_TIMING, &args.prefill_sim_args())?,
            bp,
            Some(bb),
        );
        let d = sim_unit(
            "b-decode-0",
            Role::Decode,
            sim.argv("decode", bd, 0, &DECODE_TIMING, &args.decode_sim_args())?,
            bd,
            None,
        );
        let workers = vec![
            "--prefill".into(),
            loopback(bp),
            bb.to_string(),
            "--decode".into(),
            loopback(bd),
        ];
        let r = sim_unit(
            "b-router-0",
            Role::Router,
            router_launch(smg, workers, Some("round_robin"), br, bprom),
            br,
            None,
        );
        let mut shared = sim_unit(
            SERVING_ROUTER,
            Role::Router,
            router_launch(smg, Vec::new(), Some("round_robin"), sr, sprom),
            sr,
            None,
        );
        // Up from the agent's start; with no worker its /readiness is 503.
        shared.autostart = true;
        shared.health_path = Some("/liveness".into());
        Ok(SharedRouter {
            units: vec![p, d, r, shared],
            engines: vec![
                (PAIR_B.into(), "b-prefill-0".into(), loopback(bp)),
                (PAIR_B.into(), "b-decode-0".into(), loopback(bd)),
            ],
            url: loopback(sr),
        })
    }
}

/// The orchestrator, without its pairs: its listen and readiness
/// addresses, the journal, a resume grace its agents can meet, and TLS
/// with the demo's operator (or plain text).
fn orchestrator_config(
    args: &DemoArgs,
    dir: &Path,
    ports: &Ports,
    tls: Option<StackTls>,
) -> anyhow::Result<OrchestratorConfig> {
    let mut orchestrator = OrchestratorConfig::new(
        format!("127.0.0.1:{}", ports.orchestrator).parse()?,
        args.journal.clone().unwrap_or_else(|| dir.join("journal.sqlite")),
    );
    orchestrator.readiness_listen = Some(format!("127.0.0.1:{}", ports.readiness).parse()?);
    // Agents re-attach within their reconnect backoff (at most 5 s).
    orchestrator.resume_grace_ms = 20_000;
    match tls {
        Some(t) => {
            orchestrator.tls = Some(t.orchestrator);
            orchestrator.operators = vec![t.operator];
        }
        None => orchestrator.insecure_plaintext = true,
    }
    Ok(orchestrator)
}

/// The stack's time scale, as budgets use it: simulated ms to real ones,
/// never 0.
#[derive(Debug, Clone, Copy)]
struct Scale(f64);

impl Scale {
    fn ms(self, sim_ms: u64) -> u64 {
        ((sim_ms as f64 * self.0).round() as u64).max(1)
    }
}

/// The orchestrator's pairs: the demo pair, its budgets scaled (or in real
/// time on vLLM), and with `--shared-router` pair B, a copy of it on its own
/// units, both drained out of the serving router when restarted.
fn demo_pairs(
    args: &DemoArgs,
    scale: Scale,
    policy: DecodeStartPolicy,
    prefill_argv: &[String],
    decode_argv: &[String],
    real_engine: bool,
) -> anyhow::Result<Vec<PairConfig>> {
    let probe_timeout = scale.ms(120_000);
    // `--two-hosts`: the second half of each role is the remote host's own
    // `prefill-0`, `decode-0`, … (`remote_agent`).
    let refs = |role: &str, n: u16| -> Vec<UnitRef> {
        let local = if args.two_hosts { n.div_ceil(2) } else { n };
        (0..n)
            .map(|i| match i.checked_sub(local) {
                Some(k) => UnitRef::new(REMOTE, format!("{role}-{k}")),
                None => UnitRef::new(HOST, format!("{role}-{i}")),
            })
            .collect()
    };
    let mut pair = PairConfig::new(
        PAIR,
        refs("prefill", args.prefills),
        refs("decode", args.decodes),
        vec![UnitRef::new(HOST, "router-0")],
        ProbeConfig::new(
            MODEL,
            "pdwarden readiness probe: reply with one word.",
            scale.ms(1_000),
            scale.ms(30_000),
            probe_timeout,
        ),
    );
    pair.decode_start_policy = policy;
    pair.kv_transfer = match args.kv_transfer {
        crate::args::DemoKvTransfer::Sglang => pdwarden_orchestrator::config::KvTransfer::Sglang,
        crate::args::DemoKvTransfer::Nixl => pdwarden_orchestrator::config::KvTransfer::Nixl,
        crate::args::DemoKvTransfer::Address => pdwarden_orchestrator::config::KvTransfer::Address,
    };
    demo_probe(&mut pair.probe, args);
    demo_suite(&mut pair.suite, args, scale, probe_timeout);
    demo_gate(&mut pair, probe_timeout);
    demo_watch(&mut pair.watch, args, scale, prefill_argv, decode_argv)?;
    demo_timeouts(&mut pair.timeouts, scale);
    if real_engine {
        real_time_budgets(&mut pair);
        if args.watch_defaults {
            // The README's watch as an operator leaves it: its defaults,
            // the engine kind and this demo's breaker and auto-recovery.
            let w = &mut pair.watch;
            *w = WatchConfig {
                enabled: w.enabled,
                auto_recover: w.auto_recover,
                max_recoveries: w.max_recoveries,
                engine: EngineKind::Vllm,
                ..Default::default()
            };
        }
    } else if args.watch_defaults {
        bail!(
            "--watch-defaults: the watch's defaults are in real time, for --engine vllm; pd-sim's demo scales them with --time-scale"
        );
    }
    if !args.shared_router {
        return Ok(vec![pair]);
    }
    let mut serving = ServingRouterConfig::new(HOST, SERVING_ROUTER);
    // pd-sim's gauges move with every request: the drain ends as soon
    // as the work does; the bound only matters for a stuck one.
    serving.drain_timeout_ms = scale.ms(60_000).max(10_000);
    serving.poll_ms = 100;
    pair.serving_router = Some(serving);
    let mut b = pair.clone();
    b.name = PAIR_B.into();
    b.prefill = vec![UnitRef::new(HOST, "b-prefill-0")];
    b.decode = vec![UnitRef::new(HOST, "b-decode-0")];
    b.router = vec![UnitRef::new(HOST, "b-router-0")];
    Ok(vec![pair, b])
}

/// The probe series: a warm budget with a floor the time scale does not
/// shrink, and room for one cold answer per fresh engine.
fn demo_probe(probe: &mut ProbeConfig, args: &DemoArgs) {
    // Each probe's fixed cost (the router's hops, HTTP, the agent, process
    // scheduling) does not shrink with the time scale: on a busy 2-core host
    // it alone took 60-70 ms (two pairs starting at once), and a loaded CI
    // host answered a router health check in 107 ms, over the scaled 50 ms
    // warm budget — a healthy pair judged `over_budget` for the host's
    // overhead, not the engines'. The warm budget keeps a floor for it, as an
    // operator's budget (seconds) sits far above their host's noise; pd-sim's
    // scaled cold start (~0.33 s) stays above the floor.
    probe.warm_budget_ms = probe.warm_budget_ms.max(WARM_BUDGET_FLOOR_MS);
    probe.max_tokens = 8;
    probe.warm_probes = 2;
    // Room for one cold answer per fresh engine of the larger side (xPyD).
    probe.max_probes = 4 + u32::from(args.prefills.max(args.decodes));
}

/// The verification suite, scaled; the engines batch unless they are
/// serial by design or leak their slot (the slot-leak drill).
fn demo_suite(suite: &mut SuiteConfig, args: &DemoArgs, scale: Scale, probe_timeout: u64) {
    suite.baseline_warning_ratio = 2.0;
    suite.baseline_floor_ms = scale.ms(400);
    suite.long_generation.max_tokens = 256;
    suite.long_generation.max_token_gap_ms = Some(scale.ms(2_000));
    suite.long_generation.timeout_ms = probe_timeout;
    // TTFT, TPOT, end-to-end and batching budgets are derived from the
    // pair's own warm figures (docs/verdicts.md); only the stream-silence
    // budget is absolute here, above what two shared CPUs can jitter.
    suite.multi_turn.timeout_ms = probe_timeout;
    suite.concurrency.requests = 8;
    suite.concurrency.timeout_ms = probe_timeout;
    suite.concurrency.engines_batch = !args.engines_serial && !matches!(args.incident, Some(Incident::SlotLeak));
    suite.abort_storm.after_restart = false;
    suite.abort_storm.requests = 3;
    suite.abort_storm.prompt_tokens = 20_000;
    // 20,000 prompt tokens take 1 s of prefill at pd-sim's default speed:
    // abandoned at half that, they are cancelled mid-prefill.
    suite.abort_storm.abort_after_ms = scale.ms(500);
    suite.abort_storm.probe_timeout_ms = probe_timeout;
}

/// The change gate's benchmark: a small grid, and a smallest effect above
/// what the demo's engines drift by with nothing changed.
fn demo_gate(pair: &mut PairConfig, probe_timeout: u64) {
    let gate = &mut pair.gate;
    gate.prompt_tokens = vec![16, 256];
    gate.output_tokens = vec![24];
    gate.concurrency = vec![1, 4];
    gate.requests_per_cell = 16;
    gate.request_timeout_ms = probe_timeout;
    gate.tolerance_pct = 5.0;
    gate.rollback_tolerance_pct = 10.0;
    // The demo's engines answer in ~10-30 ms (time scale 0.05): two runs
    // minutes apart on a busy 2-core host drift by 1-2.5 ms at p90 with
    // nothing changed.
    gate.min_effect_ms = 3.0;
}

/// The watch, planned for the engines' real speeds (their pd-sim flags) and
/// with the watch's defaults scaled; auto-recovery off where a drill breaks
/// the pair behind pdwarden's back.
fn demo_watch(
    watch: &mut WatchConfig,
    args: &DemoArgs,
    scale: Scale,
    prefill_argv: &[String],
    decode_argv: &[String],
) -> anyhow::Result<()> {
    // The watch plans for the prefill's real speed (its pd-sim flag, else
    // pd-sim's default) and seed 001's longest prompt...
    let prefill_tok_per_s = flag_value(prefill_argv, "--prefill-tok-per-s").unwrap_or(20_000.0);
    // ...and the decode's real speed (its --tpot-ms), and pd-sim's
    // --chunked-prefill-size (SGLang's 8192 on an 80 GB GPU).
    let decode_tok_per_s = match args.watch_decode_tok_per_s {
        Some(v) if v > 0.0 && v.is_finite() => v,
        Some(v) => bail!("--watch-decode-tok-per-s must be a finite number > 0, got {v}"),
        None => 1000.0 / flag_value(decode_argv, "--tpot-ms").unwrap_or(12.0),
    };
    let chunk = prefill_argv
        .iter()
        .position(|a| a == "--chunked-prefill-size")
        .and_then(|i| prefill_argv.get(i + 1))
        .and_then(|v| v.parse::<i64>().ok());
    // A drill that breaks the pair behind pdwarden's back shows what
    // `verify` concludes; the watch would otherwise race it and recover the
    // pair first (its own recovery has its own scenario).
    watch.auto_recover = !args.no_auto_recover
        && !matches!(
            args.incident,
            Some(Incident::DecodeAloneRestart | Incident::PrefillAloneRestart)
        );
    // The watch's defaults, scaled; the scrape and the stall budget keep
    // floors that two shared CPUs can honour.
    watch.scrape_interval_ms = scale.ms(1_000).max(250);
    watch.stall_budget_ms = scale.ms(8_000).max(2_000);
    watch.max_prompt_tokens = 50_000;
    watch.prefill_tok_per_s = prefill_tok_per_s / scale.0;
    watch.max_output_tokens = 4096;
    watch.decode_tok_per_s = decode_tok_per_s / scale.0;
    // pd-sim's --chunked-prefill-size 0 is chunking off: a chunk is the whole prompt.
    watch.prefill_chunk_tokens = match chunk {
        Some(c) if c <= 0 => None,
        Some(c) => Some(c as u64),
        None => Some(8192),
    };
    watch.max_kv_transfer_ms = scale.ms(10_000);
    // SGLang refreshes an idle engine's gauges every 30 s; pd-sim, scaled.
    watch.idle_gauge_refresh_ms = Some(scale.ms(30_000));
    watch.idle_probe_interval_ms = scale.ms(60_000);
    watch.min_probe_interval_ms = scale.ms(5_000);
    watch.max_probe_timeout_ms = scale.ms(600_000);
    watch.max_recoveries = args.max_recoveries;
    watch.recovery_window_ms = scale.ms(3_600_000);
    Ok(())
}

/// The restart's deadlines, scaled; the router is not simulated, and its
/// deadline and the generation check keep real-time floors.
fn demo_timeouts(t: &mut TimeoutConfig, scale: Scale) {
    t.prefill_ready_ms = scale.ms(600_000);
    t.decode_ready_ms = scale.ms(600_000);
    // The router itself is not simulated: it starts in about half a second
    // whatever the scale.
    t.router_ready_ms = scale.ms(120_000).max(15_000);
    t.stop_grace_ms = 5000;
    t.poll_interval_ms = 20;
    t.check_timeout_ms = scale.ms(30_000).max(1_000);
}

/// Both configs as written to `dir` and read back.
struct Written {
    agent: AgentConfig,
    orchestrator: OrchestratorConfig,
    agent_path: PathBuf,
    orchestrator_path: PathBuf,
}

/// Writes `agent.toml` and `orchestrator.toml` into `dir` with the configs'
/// own serialisers, then reads them back as the processes will: what they
/// run is what was checked.
fn write_and_read_back(dir: &Path, agent: &AgentConfig, orchestrator: &OrchestratorConfig) -> anyhow::Result<Written> {
    let agent_path = dir.join("agent.toml");
    let orchestrator_path = dir.join("orchestrator.toml");
    std::fs::write(&agent_path, agent.to_toml_string()?)?;
    std::fs::write(&orchestrator_path, orchestrator.to_toml_string()?)?;
    let agent = AgentConfig::load(&agent_path).context("the stack's agent config")?;
    let orchestrator = OrchestratorConfig::load(&orchestrator_path).context("the stack's orchestrator config")?;
    Ok(Written {
        agent,
        orchestrator,
        agent_path,
        orchestrator_path,
    })
}

/// A unit of the pd-sim stack on loopback `port`: pd-sim is an SGLang-like
/// engine behind the real sglang-router, and the kinds name their health
/// paths (`/readiness` for the router) and generation checks.
fn sim_unit(name: &str, role: Role, argv: Vec<String>, port: u16, bootstrap: Option<u16>) -> UnitConfig {
    let mut u = UnitConfig::new(name, role, argv, format!("http://127.0.0.1:{port}"));
    u.engine = Some(match role {
        Role::Router => EngineKind::SglangRouter,
        Role::Prefill | Role::Decode => EngineKind::Sglang,
    });
    u.bootstrap_port = bootstrap;
    u
}

/// The pair's budgets on the real vLLM pair (`--engine vllm`), in real
/// time: its tiny model answers 8 tokens through the router in 80-130 ms on
/// an idle 2-core host (scripts/setup-vllm.sh's run), an engine is ready in
/// ~30 s; the warm budget leaves room for a busy host, the ready deadlines
/// for a slow one.
fn real_time_budgets(pair: &mut PairConfig) {
    pair.probe.model = crate::vllm::MODEL.into();
    pair.probe.warm_budget_ms = 1_500;
    pair.probe.cold_allowance_ms = 10_000;
    pair.probe.probe_timeout_ms = 15_000;
    let t = &mut pair.timeouts;
    t.prefill_ready_ms = 240_000;
    t.decode_ready_ms = 240_000;
    t.router_ready_ms = 60_000;
    t.stop_grace_ms = 15_000;
    t.poll_interval_ms = 200;
    t.check_timeout_ms = 10_000;
    let suite = &mut pair.suite;
    suite.baseline_floor_ms = 400;
    suite.long_generation.max_tokens = 128;
    suite.long_generation.max_token_gap_ms = Some(2_000);
    suite.long_generation.timeout_ms = 60_000;
    suite.multi_turn.timeout_ms = 30_000;
    suite.concurrency.timeout_ms = 60_000;
    suite.concurrency.engines_batch = true;
    // --max-model-len 2048.
    suite.abort_storm.prompt_tokens = 1_500;
    suite.abort_storm.abort_after_ms = 200;
    suite.abort_storm.probe_timeout_ms = 30_000;
    pair.gate.request_timeout_ms = 30_000;
    let w = &mut pair.watch;
    w.engine = EngineKind::Vllm;
    w.scrape_interval_ms = 1_000;
    w.stall_budget_ms = 8_000;
    w.max_prompt_tokens = 2_048;
    w.prefill_tok_per_s = 2_000.0;
    w.max_output_tokens = 256;
    w.decode_tok_per_s = 20.0;
    // vLLM refreshes its gauges every engine step.
    w.prefill_chunk_tokens = None;
    w.idle_gauge_refresh_ms = None;
    w.max_kv_transfer_ms = 10_000;
    // An idle pair is probed every 20 s: the tiny model's probe costs a few
    // ms of a CPU, and a stopped engine core is found within a minute.
    w.idle_probe_interval_ms = 20_000;
    w.min_probe_interval_ms = 5_000;
    w.max_probe_timeout_ms = 600_000;
    w.recovery_window_ms = 3_600_000;
}

/// The TLS files and operator of a secure stack.
struct StackTls {
    agent: TlsFiles,
    /// `--two-hosts`: the remote agent's.
    remote_agent: Option<TlsFiles>,
    orchestrator: TlsFiles,
    operator: OperatorConfig,
}

/// The stack's security (issue 8): by default a CA, the orchestrator's and
/// the agent's certificates and an `operate` token, made in `dir/pki` and
/// used by this process's own requests; `--insecure-plaintext` says so
/// instead. Returns the URL scheme, the TLS parts, and the credentials this
/// process presents (none in plain text).
fn security(args: &DemoArgs, dir: &Path) -> anyhow::Result<(&'static str, Option<StackTls>, Option<Credentials>)> {
    if args.insecure_plaintext {
        return Ok(("http", None, None));
    }
    let certs = CertDir(dir.join("pki"));
    certs.init(&["localhost".into(), "127.0.0.1".into()])?;
    let agent = certs.issue_agent(HOST)?;
    let remote_agent = if args.two_hosts {
        Some(certs.issue_agent(REMOTE)?)
    } else {
        None
    };
    let token = new_token();
    std::fs::write(dir.join("pki/token"), &token)?;
    let tls = StackTls {
        agent,
        remote_agent,
        orchestrator: certs.orchestrator(),
        operator: OperatorConfig {
            name: "demo".into(),
            role: OperatorRole::Operate,
            token_sha256: hash_token(&token),
        },
    };
    let credentials = Credentials {
        ca: Some(certs.ca()),
        cert: None,
        key: None,
        token: Some(token),
    };
    Ok(("https", Some(tls), Some(credentials)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The demo's budgets meet the orchestrator's own rules in every pair
    /// shape and from a hundredth of real time to real time: a budget the
    /// stack scales wrong is refused here, not when a demo starts. (Below
    /// about 0.007 the scaled cold allowance falls under the warm budget's
    /// floor, and the loader refuses the config.)
    #[test]
    fn the_demo_pairs_load_in_every_shape_and_at_every_scale() {
        let shapes: [&[&str]; 5] = [
            &[],
            &["--prefills", "4", "--decodes", "4"],
            &["--shared-router"],
            &["--incident", "slot-leak"],
            &["--prefills", "2", "--decodes", "3", "--two-hosts"],
        ];
        for flags in shapes {
            let args = DemoArgs::from_flags(flags).unwrap();
            for scale in [0.01, DEFAULT_TIME_SCALE, 0.5, 1.0] {
                let sim = SimLauncher {
                    wrapper: "",
                    pd_sim: "pd-sim".into(),
                    scale,
                };
                let prefill = sim
                    .argv("prefill", 1, 2, &PREFILL_TIMING, &args.prefill_sim_args())
                    .unwrap();
                let decode = sim
                    .argv("decode", 3, 0, &DECODE_TIMING, &args.decode_sim_args())
                    .unwrap();
                let mut c = OrchestratorConfig::new("127.0.0.1:1".parse().unwrap(), "/tmp/journal.sqlite");
                c.insecure_plaintext = true;
                c.pairs = demo_pairs(
                    &args,
                    Scale(scale),
                    DecodeStartPolicy::default(),
                    &prefill,
                    &decode,
                    false,
                )
                .unwrap();
                let c = OrchestratorConfig::from_toml_str(&c.to_toml_string().unwrap())
                    .unwrap_or_else(|e| panic!("{flags:?} at {scale}: {e}"));
                assert_eq!(c.pairs.len(), if args.shared_router { 2 } else { 1 });
                if args.two_hosts {
                    let names: Vec<String> = c.pairs[0].decode.iter().map(ToString::to_string).collect();
                    assert_eq!(names, ["local/decode-0", "local/decode-1", "remote/decode-0"]);
                }
            }
        }
        // --two-hosts needs its shape, said naming the flag.
        let e = check_stack_shape(&DemoArgs::from_flags(&["--two-hosts"]).unwrap(), false).unwrap_err();
        assert!(e.to_string().starts_with("--two-hosts: "), "{e}");
    }

    /// `--prefill-sim`/`--decode-sim` flags replace the demo's own, behind
    /// the wrapper; the flags that wire the stack are refused, naming the
    /// option they came in.
    #[test]
    fn sim_flags_replace_the_demos_but_cannot_rewire_the_stack() {
        let sim = SimLauncher {
            wrapper: "env -u X",
            pd_sim: "/bin/pd-sim".into(),
            scale: 0.5,
        };
        let argv = sim
            .argv("decode", 7, 0, &DECODE_TIMING, "--tpot-ms 20 --serial")
            .unwrap();
        assert_eq!(argv[..4], ["env", "-u", "X", "/bin/pd-sim"]);
        assert_eq!(flag_value(&argv, "--tpot-ms"), Some(20.0));
        assert_eq!(argv.iter().filter(|a| *a == "--tpot-ms").count(), 1);
        assert_eq!(argv.last().map(String::as_str), Some("--serial"));
        assert!(!argv.iter().any(|a| a == "--bootstrap-port"));
        let e = sim.argv("prefill", 7, 8, &PREFILL_TIMING, "--port 9").unwrap_err();
        assert_eq!(e.to_string(), "--prefill-sim: --port is set by the demo itself");
    }
}
