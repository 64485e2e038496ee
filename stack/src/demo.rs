//! `pdwarden demo`: a whole local stack and a real `restart pd-pair`, as a
//! library — the CLI, the benchmark and the scenario tests all call it.
//!
//! [`start`] brings up the stack ([`Stack::start`]), runs the same
//! `restart pd-pair` the CLI runs (or the chosen incident's drill) and
//! returns it running with its outcome; [`Demo::stop`] stops everything it
//! started by PID. The outcome is the CLI's exit code and its `--json`
//! object.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use pdwarden_orchestrator::edge::client::{Credentials, new_request_id};
use pdwarden_orchestrator::ops::report::OperationReport;
use serde_json::{Value, json};

use crate::drill::{self, CrashAt, Incident};
use crate::plan::PAIR;
use crate::stack::Stack;

/// What the demo's engines are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DemoEngine {
    /// pd-sim, SGLang-like, behind the real sglang-router (time-scaled).
    PdSim,
    /// A real vLLM CPU prefill and decode behind the real vllm-router, in
    /// real time (`scripts/setup-vllm.sh` installs them).
    Vllm,
}

#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// The engines: pd-sim (default) or a real vLLM pair.
    #[arg(long, value_enum, default_value = "pd-sim")]
    pub engine: DemoEngine,
    /// Print the restart's report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Multiplies every simulated duration and every budget (0 < F ≤ 1);
    /// default 0.05 (0.001 for the probe-storm drill's simulated hour).
    #[arg(long)]
    pub time_scale: Option<f64>,
    /// `after-prefill-ready` or `overlap`.
    #[arg(long, default_value = "after-prefill-ready")]
    pub decode_start_policy: String,
    /// sglang-router's `smg` launcher (default: .venv/bin/smg of this checkout, then PATH).
    #[arg(long, env = "PDWARDEN_SMG")]
    pub router_bin: Option<PathBuf>,
    /// Keep the temporary directory (configs, logs, journal) for inspection.
    #[arg(long)]
    pub keep: bool,
    /// After the restart, keep the stack running until SIGTERM or Ctrl-C, so
    /// `pdwarden --orchestrator URL status|history|restart ...` can be tried
    /// against it (the URL is printed, and is `demo.orchestrator` in --json).
    #[arg(long)]
    pub hold: bool,
    /// Extra pd-sim flags for the prefill, e.g. "--ttft-ms 900"; a flag given
    /// here replaces the demo's default for it. Split on whitespace.
    #[arg(long, allow_hyphen_values = true, default_value = "")]
    pub prefill_sim: String,
    /// Replay one incident of INCIDENTS.md on the local stack and print what
    /// pdwarden saw and concluded.
    #[arg(long, value_enum)]
    pub incident: Option<Incident>,
    /// With `--incident orchestrator-crash`: the co-restart step during
    /// which the orchestrator is killed.
    #[arg(long, value_enum, default_value = "restarting-decode", requires = "incident")]
    pub crash_at: CrashAt,
    /// Run the stack without TLS or tokens (local development's
    /// `insecure_plaintext`); by default the demo issues a CA, certificates
    /// and an operator token in its directory and runs the secure path.
    #[arg(long)]
    pub insecure_plaintext: bool,
    /// Extra pd-sim flags for the decode (as --prefill-sim).
    #[arg(long, allow_hyphen_values = true, default_value = "")]
    pub decode_sim: String,
    /// Put `pd-faultproxy` between the router and the decode, with these
    /// fault flags (e.g. "--http-500 3", "--error-event-after 20 --match
    /// stream"; "" for none: faults can then be set while the stack runs,
    /// `POST /_faultproxy/faults` at `demo.decode_proxy` in --json). The
    /// router is given the proxy as its decode; the agent and pdwarden keep
    /// the decode's own URL. With pd-sim or `--engine vllm`.
    #[arg(long, allow_hyphen_values = true)]
    pub decode_proxy: Option<String>,
    /// With `--engine vllm`: the pair's watch at the README's defaults
    /// (`[pair.watch]` with only `engine = "vllm"`), not the demo's
    /// faster real-time settings.
    #[arg(long)]
    pub watch_defaults: bool,
    /// A launcher put in front of both engines' argv, e.g. "env -u KNOB"
    /// (a wrapper that strips a variable: what the change gate must catch).
    /// Split on whitespace.
    #[arg(long, allow_hyphen_values = true, default_value = "")]
    pub engine_wrapper: String,
    /// The agent reads its GPUs from this fake GPU file (`gpu_source =
    /// "fake:PATH"`, see README "GPU"), sampled every 250 ms; default: none.
    #[arg(long)]
    pub gpu_fake: Option<PathBuf>,
    /// The watch's circuit breaker: automatic recoveries allowed per hour
    /// (simulated) before the pair is held for a human.
    #[arg(long, default_value_t = 3)]
    pub max_recoveries: u32,
    /// The watch reports a wedge but does not recover it.
    #[arg(long)]
    pub no_auto_recover: bool,
    /// The engines run one request at a time by design (pd-sim `--serial`):
    /// the concurrency step expects N requests to take N× one, not batching
    /// (`suite.concurrency.engines_batch = false`). The slot-leak drill sets it.
    #[arg(long)]
    pub engines_serial: bool,
    /// The slowest decode the watch plans for, in simulated tokens/s per
    /// request (default: the decode's `--tpot-ms`). Tell the watch the
    /// truth when a fault slows the decode live.
    #[arg(long)]
    pub watch_decode_tok_per_s: Option<f64>,
    /// Prefills in the pair (xPyD): more than one are further pd-sim
    /// engines behind the same router (`prefill-1`, …), all restarted
    /// before any decode.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=4))]
    pub prefills: u16,
    /// Decodes in the pair (xPyD): `decode-1`, … behind the same router,
    /// which routes round robin so that the verification reaches each.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=4))]
    pub decodes: u16,
    /// Two pairs (`demo` and `demo-b`, pd-sim each behind its own router)
    /// and one serving router in front of both that clients use
    /// (`router-shared`, the real sglang-router): both pairs join it, then
    /// `demo` is restarted under steady client traffic — drained out of the
    /// serving router, restarted, verified through its own router and its
    /// KV paths to the other pair, and put back only if they all hold.
    #[arg(long)]
    pub shared_router: bool,
    /// With `--prefills N --decodes N` (N ≥ 2): the pair starts, steady
    /// client traffic through its router begins, and `restart pd-pair demo
    /// --rolling` runs under it — one P/D sub-pair out of the router at a
    /// time, drained, restarted, proven over its own and its cross KV paths,
    /// and back only then; the demo says what the clients saw.
    #[arg(long)]
    pub rolling: bool,
    /// The pair's sglang-router policy (`--policy`); default: `round_robin`
    /// for an xPyD pair, else the router's own (`cache_aware`).
    #[arg(long)]
    pub router_policy: Option<String>,
    /// The orchestrator's journal file (default: `journal.sqlite` in the
    /// demo's directory), e.g. on a small filesystem to see what a journal
    /// that cannot be written does (README "Faults").
    #[arg(long)]
    pub journal: Option<PathBuf>,
}

/// What a demo concluded: the CLI's exit code and its `--json` object.
#[derive(Debug, Clone)]
pub struct DemoOutcome {
    /// 0 healthy (or a crash drill rolled back), 2 a verdict that is not,
    /// 1 could not run.
    pub code: u8,
    pub json: Value,
    /// Why it could not run (code 1).
    pub error: Option<String>,
}

impl DemoOutcome {
    pub fn could_not_run(reason: impl Into<String>) -> Self {
        let reason = reason.into();
        DemoOutcome {
            code: 1,
            json: json!({ "error": reason }),
            error: Some(reason),
        }
    }

    pub(crate) fn for_report(report: &OperationReport, json: Value) -> Self {
        DemoOutcome {
            code: if report.verdict.is_healthy() { 0 } else { 2 },
            json,
            error: None,
        }
    }
}

/// A demo that has run: its stack still up (none for the probe-storm drill,
/// which starts its own engines), and its outcome.
pub struct Demo {
    pub stack: Option<Stack>,
    pub outcome: DemoOutcome,
    started: Instant,
}

impl Demo {
    /// Stops everything the demo started; with `keep`, leaves its directory
    /// (configs, logs, journal) and says where. `quiet`: the CLI's `--json`.
    pub fn stop(self, keep: bool, quiet: bool) {
        if let Some(stack) = self.stack {
            if let Some(kept) = stack.stop(keep) {
                eprintln!("demo: kept {}", kept.display());
            }
            if !quiet {
                pdwarden_orchestrator::say!(
                    "demo: stack stopped; {:.1} s in all",
                    self.started.elapsed().as_secs_f64()
                );
            }
        }
    }
}

/// Starts the stack and runs the restart (or the incident's drill); the
/// stack stays up until [`Demo::stop`]. Progress goes to stdout unless
/// `args.json`. `given`: the caller's credentials, used where the demo
/// makes none (`--insecure-plaintext`). A demo that cannot run has
/// stopped whatever it had started.
impl DemoArgs {
    /// The demo's flags as `pdwarden demo FLAGS` parses them (the tests',
    /// the benchmark's and the soak's stacks).
    pub fn from_flags(flags: &[&str]) -> Result<DemoArgs, clap::Error> {
        #[derive(clap::Parser)]
        struct DemoCli {
            #[command(flatten)]
            args: DemoArgs,
        }
        let argv = std::iter::once("demo").chain(flags.iter().copied());
        <DemoCli as clap::Parser>::try_parse_from(argv).map(|c| c.args)
    }
}

pub async fn start(args: &DemoArgs, given: Credentials) -> Demo {
    let started = Instant::now();
    let demo = |stack, outcome| Demo {
        stack,
        outcome,
        started,
    };
    if args.incident == Some(Incident::ProbeStorm) {
        return demo(None, probe_storm(args).await);
    }
    if args.incident == Some(Incident::LeaderCrash) {
        return demo(None, leader_crash(args, given).await);
    }
    let mut stack = match Stack::start(args, given).await {
        Ok(s) => s,
        Err(e) => return demo(None, DemoOutcome::could_not_run(format!("demo: {e:#}"))),
    };
    if !args.json {
        pdwarden_orchestrator::say!(
            "demo stack in {} (orchestrator {}, logs there); restarting pd-pair `{PAIR}`",
            stack.dir.path().display(),
            stack.connection.url
        );
        if let Some(incident) = args.incident {
            pdwarden_orchestrator::say!("drill {}: {}", incident.name(), incident.description());
        }
        pdwarden_orchestrator::say!();
    }
    let outcome = match args.incident {
        Some(incident @ (Incident::OrchestratorCrash | Incident::OrchestratorCrashMidGate)) => {
            crash_drill(&mut stack, args, incident).await
        }
        _ if args.shared_router => crate::rolling::under_traffic(&stack, args).await,
        _ if args.rolling => crate::rolling::rolling_under_traffic(&stack, args).await,
        _ => restart(&stack, args).await,
    };
    if outcome.code == 1 {
        stack.stop(args.keep);
        return demo(None, outcome);
    }
    demo(Some(stack), outcome)
}

/// The leader-crash drill (issue 19): its own stack — a real etcd cluster,
/// three orchestrators — started, drilled at `--crash-at`, and stopped.
async fn leader_crash(args: &DemoArgs, given: Credentials) -> DemoOutcome {
    if !args.json {
        pdwarden_orchestrator::say!(
            "drill {}: {}\n",
            Incident::LeaderCrash.name(),
            Incident::LeaderCrash.description()
        );
    }
    let mut ha = match crate::ha::HaStack::start(args, given, 2).await {
        Ok(ha) => ha,
        Err(e) => {
            return DemoOutcome::could_not_run(format!(
                "demo: drill leader-crash: {e:#} (it needs etcd and an orchestrator built with the `etcd` feature: scripts/setup-etcd.sh, then cargo build --workspace --bins --features pdwarden-stack/etcd)"
            ));
        }
    };
    if !args.json {
        pdwarden_orchestrator::say!(
            "HA stack in {}: etcd {}, orchestrators {}",
            ha.dir.path().display(),
            ha.etcd.client_urls().join(" "),
            ha.orchestrators
                .iter()
                .map(|o| o.url.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    let asked = match ha.leader().await {
        Some((leader, _)) => (leader + 1) % ha.orchestrators.len(),
        None => 0,
    };
    let result = crate::ha::leader_crash(&mut ha, asked, args.crash_at, args.json).await;
    ha.stop(args.keep);
    match result {
        Ok(v) => DemoOutcome {
            code: if v["verdict"].as_str().is_some_and(|s| s.starts_with("healthy"))
                && v["started_twice"].as_array().is_some_and(|a| a.is_empty())
            {
                0
            } else {
                2
            },
            json: v,
            error: None,
        },
        Err(e) => DemoOutcome::could_not_run(format!("demo: drill leader-crash: {e:#}")),
    }
}

/// The probe-storm drill: no pair to restart; three engines, three
/// probing strategies.
async fn probe_storm(args: &DemoArgs) -> DemoOutcome {
    if !args.json {
        pdwarden_orchestrator::say!("drill probe-storm: {}\n", Incident::ProbeStorm.description());
    }
    // An hour in 3.6 s at the default storm scale.
    let scale = args.time_scale.unwrap_or(0.001);
    if !(scale > 0.0 && scale <= 1.0) {
        return DemoOutcome::could_not_run(format!("--time-scale must be in (0, 1], got {scale}"));
    }
    match drill::probe_storm(scale, args.json).await {
        Ok(v) => DemoOutcome {
            code: if v["pdwarden_cheapest"] == true { 0 } else { 2 },
            json: v,
            error: None,
        },
        Err(e) => DemoOutcome::could_not_run(format!("demo: drill probe-storm: {e:#}")),
    }
}

async fn crash_drill(stack: &mut Stack, args: &DemoArgs, incident: Incident) -> DemoOutcome {
    let result = if incident == Incident::OrchestratorCrash {
        drill::orchestrator_crash(stack, args.json, args.crash_at).await
    } else {
        drill::orchestrator_crash_mid_gate(stack, args.json).await
    };
    match result {
        Ok(v) => DemoOutcome {
            code: if v["verdict"]
                .as_str()
                .is_some_and(|k| k.starts_with("healthy") || k == "interrupted_rolled_back")
            {
                0
            } else {
                2
            },
            json: v,
            error: None,
        },
        Err(e) => DemoOutcome::could_not_run(format!("demo: drill {}: {e:#}", incident.name())),
    }
}

/// `restart pd-pair demo`, then the incident's follow-up if it has one (a
/// drill may act on the stack after the restart and verify again; its
/// conclusion is then the demo's).
async fn restart(stack: &Stack, args: &DemoArgs) -> DemoOutcome {
    let report = match stack
        .connection
        .follow_printing(PAIR, args.json, None, new_request_id())
        .await
    {
        Ok(r) => r,
        Err(e) => return DemoOutcome::could_not_run(format!("demo: {e}")),
    };
    let mut outcome = DemoOutcome::for_report(&report, serde_json::to_value(&report).unwrap_or_default());
    if let Some(incident) = args.incident {
        match drill::follow_up(incident, stack, &report, args.json).await {
            Ok(Some(follow)) => outcome = DemoOutcome::for_report(&follow.verify, follow.to_json(&report)),
            Ok(None) => {}
            Err(e) => return DemoOutcome::could_not_run(format!("demo: drill {}: {e:#}", incident.name())),
        }
        outcome.json["incident"] = json!(incident.name());
    }
    outcome.json["demo"] = demo_json(stack);
    outcome
}

/// How to reach the demo's stack (`demo` in its `--json`).
pub(crate) fn demo_json(stack: &Stack) -> Value {
    let creds = &stack.connection.credentials;
    json!({
        "orchestrator": stack.connection.url,
        "readiness": stack.plan.readiness_url,
        "agent_metrics": stack.plan.agent_metrics_url,
        "dir": stack.dir.path().display().to_string(),
        // For `pdwarden --ca CA --token TOKEN` against the held stack (a
        // throw-away token for this demo only).
        "ca": creds.ca.as_ref().map(|p| p.display().to_string()),
        "token": creds.token,
        "serving_router": stack.plan.serving_router_url,
        // --decode-proxy: its control endpoint is URL/_faultproxy/faults.
        "decode_proxy": stack.plan.decode_proxy.as_ref().map(|p| p.url.clone()),
    })
}

/// How to reach a held demo, for the line the CLI prints.
pub fn hold_hint(stack: &Stack) -> String {
    format!(
        "pdwarden --orchestrator {}{} status",
        stack.connection.url,
        match &stack.connection.credentials.ca {
            Some(ca) => format!(
                " --ca {} --token $(cat {})",
                ca.display(),
                stack.dir.path().join("pki/token").display()
            ),
            None => String::new(),
        }
    )
}
