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
use pdwarden_engines::EngineKind;
use pdwarden_orchestrator::config::{DecodeStartPolicy, OrchestratorConfig, PairConfig, ProbeConfig, UnitRef};
use pdwarden_orchestrator::edge::auth::{OperatorConfig, OperatorRole, hash_token, new_token};
use pdwarden_orchestrator::edge::certs::CertDir;
use pdwarden_orchestrator::edge::client::Credentials;
use pdwarden_orchestrator::edge::ports::late_bind_port;
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
pub fn write_configs(args: &DemoArgs, dir: &Path) -> anyhow::Result<Configs> {
    // A real engine runs in real time, on its own command line.
    let vllm = match args.engine {
        DemoEngine::PdSim => None,
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
            Some(VllmStack::find()?)
        }
    };
    let scale = if vllm.is_some() {
        1.0
    } else {
        args.time_scale.unwrap_or(DEFAULT_TIME_SCALE)
    };
    if !(scale > 0.0 && scale <= 1.0) {
        bail!("--time-scale must be in (0, 1], got {scale}");
    }
    let policy = match args.decode_start_policy.as_str() {
        "after-prefill-ready" => DecodeStartPolicy::AfterPrefillReady,
        "overlap" => DecodeStartPolicy::Overlap,
        other => bail!("--decode-start-policy must be `after-prefill-ready` or `overlap`, got {other:?}"),
    };
    let scaled = |ms: u64| ((ms as f64 * scale).round() as u64).max(1);
    let xpyd = args.prefills > 1 || args.decodes > 1;
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
    let pd_sim = binary("pd-sim")?;
    let smg = match vllm {
        None => find_router(args.router_bin.as_deref())?,
        Some(_) => PathBuf::new(),
    };
    let (orch, prefill, bootstrap, decode, router, prom, readiness, agent_metrics) = (
        late_bind_port()?,
        late_bind_port()?,
        late_bind_port()?,
        late_bind_port()?,
        late_bind_port()?,
        late_bind_port()?,
        late_bind_port()?,
        late_bind_port()?,
    );
    // --decode-proxy: the router reaches the decode through pd-faultproxy.
    let decode_proxy = match &args.decode_proxy {
        None => None,
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
            Some(ProxyPlan {
                argv,
                url: format!("http://127.0.0.1:{port}"),
            })
        }
    };
    // The decode as the router sees it.
    let router_decode = decode_proxy.as_ref().map(|p| p.url.clone());
    // Further prefills (port, bootstrap port) and decodes of an xPyD pair.
    let more_prefills: Vec<(u16, u16)> = (1..args.prefills)
        .map(|_| Ok((late_bind_port()?, late_bind_port()?)))
        .collect::<anyhow::Result<_>>()?;
    let more_decodes: Vec<u16> = (1..args.decodes).map(|_| late_bind_port()).collect::<Result<_, _>>()?;
    let loopback = |port: u16| format!("http://127.0.0.1:{port}");

    let engine =
        |role: &str, port: u16, bootstrap: u16, t: &EngineTiming, extra: &str| -> anyhow::Result<Vec<String>> {
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
    const PREFILL_TIMING: EngineTiming = EngineTiming {
        listen_after_ms: 60_000,
        ready_after_ms: 70_000,
    };
    const DECODE_TIMING: EngineTiming = EngineTiming {
        listen_after_ms: 62_000,
        ready_after_ms: 72_000,
    };
    let mut prefill_argv = engine(
        "prefill",
        prefill,
        bootstrap,
        &PREFILL_TIMING,
        &format!(
            "{} {}",
            args.incident.map_or("", Incident::prefill_sim),
            args.prefill_sim
        ),
    )?;
    let mut decode_argv = engine(
        "decode",
        decode,
        0,
        &DECODE_TIMING,
        &format!("{} {}", args.incident.map_or("", Incident::decode_sim), args.decode_sim),
    )?;
    let mut router_argv: Vec<String> = vec![smg.display().to_string(), "launch".into(), "--pd-disaggregation".into()];
    for (port, boot) in std::iter::once((prefill, bootstrap)).chain(more_prefills.iter().copied()) {
        router_argv.extend(["--prefill".into(), loopback(port), boot.to_string()]);
    }
    router_argv.extend([
        "--decode".into(),
        router_decode.clone().unwrap_or_else(|| loopback(decode)),
    ]);
    for port in more_decodes.iter().copied() {
        router_argv.extend(["--decode".into(), loopback(port)]);
    }
    // cache_aware (the router's default) sends an idle pair's similar
    // prompts to one worker: an xPyD pair's verification then reaches the
    // others only by the co-restart's own direct PD requests.
    match (&args.router_policy, xpyd) {
        (Some(policy), _) => router_argv.extend(["--policy".into(), policy.clone()]),
        (None, true) => router_argv.extend(["--policy".into(), "round_robin".into()]),
        (None, false) => {}
    }
    router_argv.extend([
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        router.to_string(),
        "--prometheus-port".into(),
        prom.to_string(),
        "--log-level".into(),
        "warn".into(),
    ]);
    let (scheme, tls, credentials) = security(args, dir)?;
    let url = format!("{scheme}://127.0.0.1:{orch}");

    // The agent: one host, three units.
    let mut agent = AgentConfig::new(HOST, url.clone(), dir.join("agent"));
    agent.on_exit = OnExit::StopUnits;
    agent.metrics_listen = Some(format!("127.0.0.1:{agent_metrics}"));
    if let Some(path) = &args.gpu_fake {
        agent.gpu_source = format!("fake:{}", path.display());
        agent.gpu_sample_interval_ms = 250;
        agent.gpu_snapshot_interval_ms = 2000;
    }
    match &tls {
        Some(t) => agent.tls = Some(t.agent.clone()),
        None => agent.insecure_plaintext = true,
    }
    let router_unit = sim_unit("router-0", Role::Router, router_argv, router, None);
    agent.units = vec![
        sim_unit(
            "prefill-0",
            Role::Prefill,
            prefill_argv.clone(),
            prefill,
            Some(bootstrap),
        ),
        sim_unit("decode-0", Role::Decode, decode_argv.clone(), decode, None),
    ];
    for (i, (port, boot)) in more_prefills.iter().enumerate() {
        let argv = engine("prefill", *port, *boot, &PREFILL_TIMING, &args.prefill_sim)?;
        agent.units.push(sim_unit(
            &format!("prefill-{}", i + 1),
            Role::Prefill,
            argv,
            *port,
            Some(*boot),
        ));
    }
    for (i, port) in more_decodes.iter().enumerate() {
        let argv = engine("decode", *port, 0, &DECODE_TIMING, &args.decode_sim)?;
        agent
            .units
            .push(sim_unit(&format!("decode-{}", i + 1), Role::Decode, argv, *port, None));
    }
    agent.units.push(router_unit);
    // --shared-router: pair B (its engines behind its own router) and the
    // serving router in front of both pairs, started with no worker: each
    // pair joins it after a healthy restart.
    let mut engines = vec![
        (PAIR.to_string(), "prefill-0".to_string(), loopback(prefill)),
        (PAIR.to_string(), "decode-0".to_string(), loopback(decode)),
    ];
    let mut serving_router_url = None;
    if args.shared_router {
        let (bp, bb, bd, br, bprom, sr, sprom) = (
            late_bind_port()?,
            late_bind_port()?,
            late_bind_port()?,
            late_bind_port()?,
            late_bind_port()?,
            late_bind_port()?,
            late_bind_port()?,
        );
        let smg_launch = |workers: Vec<String>, port: u16, prom: u16| -> Vec<String> {
            let mut v: Vec<String> = vec![smg.display().to_string(), "launch".into(), "--pd-disaggregation".into()];
            v.extend(workers);
            v.extend(
                [
                    "--policy",
                    "round_robin",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    &port.to_string(),
                    "--prometheus-port",
                    &prom.to_string(),
                    "--log-level",
                    "warn",
                ]
                .map(String::from),
            );
            v
        };
        let p = sim_unit(
            "b-prefill-0",
            Role::Prefill,
            engine("prefill", bp, bb, &PREFILL_TIMING, &args.prefill_sim)?,
            bp,
            Some(bb),
        );
        let d = sim_unit(
            "b-decode-0",
            Role::Decode,
            engine("decode", bd, 0, &DECODE_TIMING, &args.decode_sim)?,
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
        let r = sim_unit("b-router-0", Role::Router, smg_launch(workers, br, bprom), br, None);
        let mut shared = sim_unit(
            SERVING_ROUTER,
            Role::Router,
            smg_launch(Vec::new(), sr, sprom),
            sr,
            None,
        );
        // Up from the agent's start; with no worker its /readiness is 503.
        shared.autostart = true;
        shared.health_path = Some("/liveness".into());
        agent.units.extend([p, d, r, shared]);
        engines.push((PAIR_B.into(), "b-prefill-0".into(), loopback(bp)));
        engines.push((PAIR_B.into(), "b-decode-0".into(), loopback(bd)));
        serving_router_url = Some(loopback(sr));
    }
    if let Some(v) = &vllm {
        agent.units = v
            .units(
                [prefill, decode, router, prom],
                &dir.join("kv"),
                router_decode.as_deref(),
            )
            .to_vec();
        prefill_argv = agent.units[0].argv.clone();
        decode_argv = agent.units[1].argv.clone();
    }

    // The orchestrator: one pair, its budgets scaled.
    let mut orchestrator = OrchestratorConfig::new(
        format!("127.0.0.1:{orch}").parse()?,
        args.journal.clone().unwrap_or_else(|| dir.join("journal.sqlite")),
    );
    orchestrator.readiness_listen = Some(format!("127.0.0.1:{readiness}").parse()?);
    // Agents re-attach within their reconnect backoff (at most 5 s).
    orchestrator.resume_grace_ms = 20_000;
    match tls {
        Some(t) => {
            orchestrator.tls = Some(t.orchestrator);
            orchestrator.operators = vec![t.operator];
        }
        None => orchestrator.insecure_plaintext = true,
    }
    let probe_timeout = scaled(120_000);
    let refs =
        |role: &str, n: u16| -> Vec<UnitRef> { (0..n).map(|i| UnitRef::new(HOST, format!("{role}-{i}"))).collect() };
    let mut pair = PairConfig::new(
        PAIR,
        refs("prefill", args.prefills),
        refs("decode", args.decodes),
        vec![UnitRef::new(HOST, "router-0")],
        ProbeConfig::new(
            MODEL,
            "pdwarden readiness probe: reply with one word.",
            scaled(1_000),
            scaled(30_000),
            probe_timeout,
        ),
    );
    pair.decode_start_policy = policy;
    // Each probe's fixed cost (the router's hops, HTTP, the agent, process
    // scheduling) does not shrink with the time scale: on a busy 2-core host
    // it alone took 60-70 ms (two pairs starting at once), and a loaded CI
    // host answered a router health check in 107 ms, over the scaled 50 ms
    // warm budget — a healthy pair judged `over_budget` for the host's
    // overhead, not the engines'. The warm budget keeps a floor for it, as an
    // operator's budget (seconds) sits far above their host's noise; pd-sim's
    // scaled cold start (~0.33 s) stays above the floor.
    pair.probe.warm_budget_ms = pair.probe.warm_budget_ms.max(WARM_BUDGET_FLOOR_MS);
    pair.probe.max_tokens = 8;
    pair.probe.warm_probes = 2;
    // Room for one cold answer per fresh engine of the larger side (xPyD).
    pair.probe.max_probes = 4 + u32::from(args.prefills.max(args.decodes));

    let suite = &mut pair.suite;
    suite.baseline_warning_ratio = 2.0;
    suite.baseline_floor_ms = scaled(400);
    suite.long_generation.max_tokens = 256;
    suite.long_generation.max_token_gap_ms = Some(scaled(2_000));
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
    suite.abort_storm.abort_after_ms = scaled(500);
    suite.abort_storm.probe_timeout_ms = probe_timeout;

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

    // The watch plans for the prefill's real speed (its pd-sim flag, else
    // pd-sim's default) and seed 001's longest prompt...
    let prefill_tok_per_s = flag_value(&prefill_argv, "--prefill-tok-per-s").unwrap_or(20_000.0);
    // ...and the decode's real speed (its --tpot-ms), and pd-sim's
    // --chunked-prefill-size (SGLang's 8192 on an 80 GB GPU).
    let decode_tok_per_s = match args.watch_decode_tok_per_s {
        Some(v) if v > 0.0 && v.is_finite() => v,
        Some(v) => bail!("--watch-decode-tok-per-s must be a finite number > 0, got {v}"),
        None => 1000.0 / flag_value(&decode_argv, "--tpot-ms").unwrap_or(12.0),
    };
    let chunk = prefill_argv
        .iter()
        .position(|a| a == "--chunked-prefill-size")
        .and_then(|i| prefill_argv.get(i + 1))
        .and_then(|v| v.parse::<i64>().ok());
    let watch = &mut pair.watch;
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
    watch.scrape_interval_ms = scaled(1_000).max(250);
    watch.stall_budget_ms = scaled(8_000).max(2_000);
    watch.max_prompt_tokens = 50_000;
    watch.prefill_tok_per_s = prefill_tok_per_s / scale;
    watch.max_output_tokens = 4096;
    watch.decode_tok_per_s = decode_tok_per_s / scale;
    // pd-sim's --chunked-prefill-size 0 is chunking off: a chunk is the whole prompt.
    watch.prefill_chunk_tokens = match chunk {
        Some(c) if c <= 0 => None,
        Some(c) => Some(c as u64),
        None => Some(8192),
    };
    watch.max_kv_transfer_ms = scaled(10_000);
    // SGLang refreshes an idle engine's gauges every 30 s; pd-sim, scaled.
    watch.idle_gauge_refresh_ms = Some(scaled(30_000));
    watch.idle_probe_interval_ms = scaled(60_000);
    watch.min_probe_interval_ms = scaled(5_000);
    watch.max_probe_timeout_ms = scaled(600_000);
    watch.max_recoveries = args.max_recoveries;
    watch.recovery_window_ms = scaled(3_600_000);

    let t = &mut pair.timeouts;
    t.prefill_ready_ms = scaled(600_000);
    t.decode_ready_ms = scaled(600_000);
    // The router itself is not simulated: it starts in about half a second
    // whatever the scale.
    t.router_ready_ms = scaled(120_000).max(15_000);
    t.stop_grace_ms = 5000;
    t.poll_interval_ms = 20;
    t.check_timeout_ms = scaled(30_000).max(1_000);
    if vllm.is_some() {
        real_time_budgets(&mut pair);
        if args.watch_defaults {
            // The README's watch as an operator leaves it: its defaults,
            // the engine kind and this demo's breaker and auto-recovery.
            let w = &mut pair.watch;
            *w = pdwarden_orchestrator::config::WatchConfig {
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
    if args.shared_router {
        let mut serving = pdwarden_orchestrator::config::ServingRouterConfig::new(HOST, SERVING_ROUTER);
        // pd-sim's gauges move with every request: the drain ends as soon
        // as the work does; the bound only matters for a stuck one.
        serving.drain_timeout_ms = scaled(60_000).max(10_000);
        serving.poll_ms = 100;
        pair.serving_router = Some(serving);
        let mut b = pair.clone();
        b.name = PAIR_B.into();
        b.prefill = vec![UnitRef::new(HOST, "b-prefill-0")];
        b.decode = vec![UnitRef::new(HOST, "b-decode-0")];
        b.router = vec![UnitRef::new(HOST, "b-router-0")];
        orchestrator.pairs = vec![pair, b];
    } else {
        orchestrator.pairs = vec![pair];
    }

    let agent_path = dir.join("agent.toml");
    let orchestrator_path = dir.join("orchestrator.toml");
    std::fs::write(&agent_path, agent.to_toml_string()?)?;
    std::fs::write(&orchestrator_path, orchestrator.to_toml_string()?)?;
    // Read back as the processes will: what they run is what was checked.
    let agent = AgentConfig::load(&agent_path).context("the stack's agent config")?;
    let orchestrator = OrchestratorConfig::load(&orchestrator_path).context("the stack's orchestrator config")?;
    Ok(Configs {
        orchestrator,
        agent,
        orchestrator_path,
        agent_path,
        url,
        credentials,
        plan: StackPlan {
            time_scale: scale,
            prefill_argv,
            decode_argv,
            router_url: loopback(router),
            readiness_url: loopback(readiness),
            agent_metrics_url: loopback(agent_metrics),
            serving_router_url,
            engines,
            decode_proxy,
        },
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
    let token = new_token();
    std::fs::write(dir.join("pki/token"), &token)?;
    let tls = StackTls {
        agent,
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
