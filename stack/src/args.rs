//! What `pdwarden demo` is asked (its flags, the incidents and crash points
//! it replays) and what it answers (its outcome): the stack crate's ground
//! floor, which the plan, the stack, the drills and the demo all read, so
//! none of them imports another to reach them.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use pdwarden_model::report::OperationReport;
use serde_json::{Value, json};

/// The knob the mid-gate drill flips (no effect on speed: this drill is
/// about where the gate is when the orchestrator dies, not the verdict), on
/// engines at twice the demo's time per token, as the gate scenarios run
/// them: the resumed rollback is measured against the baseline, and at the
/// demo's default speed (~30 ms a request) one busy moment on a 2-core host
/// moves a p90 by 6 ms, 20 %.
pub(crate) const GATE_KNOB: &str = "--tpot-ms 24 --knob-env PDW_KNOB --knob-value on --knob-slowdown 1.0";

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
    /// The agent's py-spy for its evidence captures (issue 35); default:
    /// `.venv/bin/py-spy` of the checkout, else none (the agent then looks
    /// on its `PATH`). A stand-in that prints a hostile dump tests the
    /// agent's bounds on a whole stack (issue 48).
    #[arg(long)]
    pub py_spy: Option<PathBuf>,
    /// The agent reads its GPUs from this fake GPU file (`gpu_source =
    /// "fake:PATH"`, see docs/configuration.md, GPU), sampled every 250 ms; default: none.
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
    /// that cannot be written does (docs/operating.md, Faults).
    #[arg(long)]
    pub journal: Option<PathBuf>,
    /// What the pd-sim engines' KV link remembers about peers, and the
    /// pair's `kv_transfer` with it: `sglang` (identities by address,
    /// decode instances remembered: any restart takes the pool), `nixl`
    /// (vLLM's NixlConnector: engines restart alone) or `address`
    /// (identities by address only: a prefill takes the decodes). Issue 37.
    #[arg(long, value_enum, default_value = "sglang")]
    pub kv_transfer: DemoKvTransfer,
    /// The pair on two agents, hosts `local` and `remote`, one unit
    /// template per host (issue 46): `local` runs the first half of each
    /// role and `router-0`, `remote` the rest, named from 0 again — both
    /// run a `prefill-0` and a `decode-0`, other engines. Needs at least 2
    /// prefills and 2 decodes.
    #[arg(long)]
    pub two_hosts: bool,
}

/// `--kv-transfer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DemoKvTransfer {
    Sglang,
    Nixl,
    Address,
}

impl DemoArgs {
    fn kv_transfer_arg(&self) -> &'static str {
        match self.kv_transfer {
            DemoKvTransfer::Sglang => "",
            DemoKvTransfer::Nixl => " --kv-transfer nixl",
            DemoKvTransfer::Address => " --kv-transfer address",
        }
    }

    /// `extra` with what `--kv-transfer` adds, unless `extra` names the
    /// engines' link itself (the pair then declares one link and the
    /// engines have another: a misdeclared pool).
    fn with_kv_transfer(&self, extra: &str) -> String {
        if extra.contains("--kv-transfer") {
            extra.to_string()
        } else {
            format!("{extra}{}", self.kv_transfer_arg())
        }
    }

    /// `--prefill-sim`, with what `--kv-transfer` adds.
    pub fn prefill_sim_args(&self) -> String {
        self.with_kv_transfer(&self.prefill_sim)
    }

    /// `--decode-sim`, with what `--kv-transfer` adds.
    pub fn decode_sim_args(&self) -> String {
        self.with_kv_transfer(&self.decode_sim)
    }
}

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Incident {
    /// Row 1: a decode restarted alone against a long-running prefill.
    DecodeAloneRestart,
    /// A prefill restarted alone under a running decode (SGLang issue 36029):
    /// the decode's cached bootstrap identity is stale, every transfer fails.
    PrefillAloneRestart,
    /// Row 2: 17.9 s, 106.4 s, 10.5 s, then no answer, called "cold start".
    ColdStartLie,
    /// Row 3: health 200 while every generation hangs.
    ShallowHealth,
    /// Row 4: a serial engine leaks its slot when a client gives up mid-prefill.
    SlotLeak,
    /// A real, small cold start: slow first probe, then warm.
    GenuineColdStart,
    /// The orchestrator is SIGKILLed in the middle of a co-restart (during
    /// decode's step) and started again: the journal says where to resume.
    OrchestratorCrash,
    /// The orchestrator is SIGKILLed while a change gate measures a change
    /// it has made live, and started again: it must not leave the change
    /// half-done (it rolls it back and verifies the old values live).
    OrchestratorCrashMidGate,
    /// Row 5: naive probes (a fresh prompt each, two alternating prompts)
    /// against pdwarden's one fixed prompt, over one simulated hour.
    ProbeStorm,
    /// Three orchestrators on a real three-member etcd cluster (issue 19):
    /// the leader is SIGKILLed during a co-restart; a follower must take it
    /// over and conclude it, no unit started twice. Needs etcd and an
    /// orchestrator built with the `etcd` feature.
    LeaderCrash,
}

impl Incident {
    pub fn name(self) -> &'static str {
        match self {
            Self::DecodeAloneRestart => "decode-alone-restart",
            Self::PrefillAloneRestart => "prefill-alone-restart",
            Self::ColdStartLie => "cold-start-lie",
            Self::ShallowHealth => "shallow-health",
            Self::SlotLeak => "slot-leak",
            Self::GenuineColdStart => "genuine-cold-start",
            Self::OrchestratorCrash => "orchestrator-crash",
            Self::OrchestratorCrashMidGate => "orchestrator-crash-mid-gate",
            Self::ProbeStorm => "probe-storm",
            Self::LeaderCrash => "leader-crash",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Self::DecodeAloneRestart => {
                "ask for a decode-only restart (pdwarden refuses), then force one behind pdwarden's back and verify the pair (INCIDENTS row 1)"
            }
            Self::PrefillAloneRestart => {
                "ask for a prefill-only restart (pdwarden refuses), then force one behind pdwarden's back and verify the pair (the decode's cached bootstrap goes stale)"
            }
            Self::ColdStartLie => {
                "after the restart the decode answers in 17.9 s, 106.4 s, 10.5 s, then never (INCIDENTS row 2)"
            }
            Self::ShallowHealth => "health answers 200 while every generation hangs (INCIDENTS row 3)",
            Self::SlotLeak => {
                "a client gives up on a 41,818-token prompt mid-prefill on a serial prefill that leaks its slot; then verify the pair (INCIDENTS row 4)"
            }
            Self::GenuineColdStart => "a genuine cold start: one slow first generation, then warm",
            Self::OrchestratorCrash => {
                "the orchestrator is SIGKILLed during decode's step of a co-restart and started again; it must resume (or conclude) the operation from its journal"
            }
            Self::OrchestratorCrashMidGate => {
                "a change gate sets PDW_KNOB=on on both engines; the orchestrator is SIGKILLed while it measures the change and started again; it must roll the change back, not leave it half-done"
            }
            Self::ProbeStorm => {
                "one simulated hour of probes at 1/min against three engines with sessions: a fresh prompt each, two alternating prompts, and pdwarden's one fixed prompt (INCIDENTS row 5)"
            }
            Self::LeaderCrash => {
                "three orchestrators on a three-member etcd cluster; the restart is asked of a follower (sent to the leader), the leader is SIGKILLed mid co-restart; a follower must take the operation over and conclude it, each unit started once"
            }
        }
    }

    /// pd-sim flags for the prefill (before any --prefill-sim of the user).
    pub fn prefill_sim(self) -> &'static str {
        match self {
            // Seed 001: 200–330 tok/s prefill, one request at a time.
            Self::SlotLeak => "--serial --leak-slot-on-disconnect --prefill-tok-per-s 250",
            Self::OrchestratorCrashMidGate => GATE_KNOB,
            _ => "",
        }
    }

    /// pd-sim flags for the decode (before any --decode-sim of the user).
    pub fn decode_sim(self) -> &'static str {
        match self {
            Self::ColdStartLie => "--cold-first-ms 0 --latency-script 17900,106400,10500,hang",
            Self::ShallowHealth => "--latency-script hang,hang,hang,hang,hang,hang,hang,hang,hang,hang",
            Self::GenuineColdStart => "--cold-first-ms 6000",
            Self::OrchestratorCrashMidGate => GATE_KNOB,
            _ => "",
        }
    }
}

/// The co-restart step during which the orchestrator-crash drill kills the
/// orchestrator (the journal's state names). `probing` lasts ~40 ms at the
/// demo's time scale, too short to hit reliably; a kill in `verifying`
/// resumes at the probes too, and `resume_point`'s unit tests cover it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CrashAt {
    RestartingPrefill,
    RestartingDecode,
    RestartingRouter,
    Verifying,
}

impl CrashAt {
    pub fn state(self) -> &'static str {
        match self {
            Self::RestartingPrefill => "restarting_prefill",
            Self::RestartingDecode => "restarting_decode",
            Self::RestartingRouter => "restarting_router",
            Self::Verifying => "verifying",
        }
    }
}
