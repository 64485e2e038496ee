//! An in-memory agent for the drivers' unit tests (issue 14): the runtime's
//! [`AgentPort`] implemented without gRPC ([`FakePort`], one orchestrator's
//! link to the fake agents), answering the commands a co-restart, a gate or
//! a recovery sends, and remembering every start it *executed*.
//!
//! It keeps the real agent's contract, each point from `agent/src/`:
//! - a command id is executed at most once; a duplicate is answered with the
//!   original reply once that exists, and never executed again
//!   (`commands.rs`, `Dispatcher::handle`);
//! - a start stops the running instance first, then spawns; its
//!   `CommandResult` comes once spawned, readiness progress follows as
//!   `UnitEvent`s tagged with the command id (`supervisor.rs`, `readiness.rs`);
//! - a restart of a unit whose start is still under way supersedes that
//!   start (the old one is abandoned: a second model load on a GPU host);
//! - on (re-)attach it registers its units with their facts: phase, pid, the
//!   start command the state belongs to and whether it is still under way
//!   (`UnitInfo.command_id` / `command_in_progress`).
//!
//! The agent outlives the orchestrator: [`FakeAgent::attach`] to a new
//! [`FakePort`] is an orchestrator restart, with the starts it had sent
//! still running here. Timing is tokio's, so tests run at paused time.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pdwarden_proto::v1::{
    Command, CommandResult, EngineSample, GateAgentResult, GateBenchmarkResult, GateRequestSample, Phase, ProbeOutcome,
    ProbeResult, ProcessEnvValue, ProcessFacts, ProcessInspection, Role, ScrapeResult, UnitConfigResult, UnitEvent,
    UnitInfo, agent_message::Kind, command::Action, gate_agent_result, gate_agent_step, unit_config_change,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::ops::port::{AgentPort, AgentReport, PortFuture, Reports, SendError};

/// Where the reports of each command go: one orchestrator's routes.
type Routes = Arc<Mutex<HashMap<String, mpsc::UnboundedSender<AgentReport>>>>;

/// One orchestrator's link to the fake agents: the [`AgentPort`] its
/// operations use. A fresh port is a fresh orchestrator; the agents
/// [`attach`](FakeAgent::attach) to it.
#[derive(Clone, Default)]
pub(crate) struct FakePort {
    routes: Routes,
    agents: Arc<Mutex<Vec<FakeAgent>>>,
    /// Failpoints at every command send: sends so far, and the ones that
    /// fail (the link gone at that moment).
    send_faults: Arc<Mutex<(usize, std::collections::BTreeSet<usize>)>>,
}

impl FakePort {
    fn agent(&self, host: &str) -> Option<FakeAgent> {
        self.agents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|a| a.host == host && a.attached_to(&self.routes))
            .cloned()
    }
}

impl FakePort {
    /// Fails the `at`-th command sends (1-based, from the first).
    pub(crate) fn fail_sends(&self, at: impl IntoIterator<Item = usize>) {
        self.send_faults.lock().unwrap().1.extend(at);
    }

    /// How many command sends were attempted.
    pub(crate) fn sends_seen(&self) -> usize {
        self.send_faults.lock().unwrap().0
    }

    /// The link to `host`'s agent breaks, as `Fleet::on_disconnect` sees
    /// it: every command awaiting an answer hears `Disconnected` and is
    /// forgotten, and the agent's facts are not read here, until it
    /// [`attach`](FakeAgent::attach)es again. What it says meanwhile is
    /// lost. (The rig's port has one host: every route is that host's.)
    pub(crate) fn break_link(&self, host: &str) {
        self.agents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|a| a.host != host);
        let routes = std::mem::take(&mut *self.routes.lock().unwrap_or_else(|p| p.into_inner()));
        for tx in routes.into_values() {
            let _ = tx.send(AgentReport::Disconnected);
        }
    }
}

impl AgentPort for FakePort {
    fn send<'a>(
        &'a self,
        host: &'a str,
        unit: &'a str,
        command: Command,
    ) -> PortFuture<'a, Result<Reports, SendError>> {
        Box::pin(async move {
            let failing = {
                let mut f = self.send_faults.lock().unwrap();
                f.0 += 1;
                f.1.contains(&f.0)
            };
            if failing {
                return Err(SendError::AgentNotConnected { host: host.into() });
            }
            let agent = self
                .agent(host)
                .ok_or_else(|| SendError::AgentNotConnected { host: host.into() })?;
            if !agent.lock().units.contains_key(unit) {
                return Err(SendError::UnknownUnit {
                    host: host.into(),
                    unit: unit.into(),
                });
            }
            let (tx, rx) = mpsc::unbounded_channel();
            self.routes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(command.command_id.clone(), tx);
            agent.deliver(command);
            Ok(rx)
        })
    }

    fn forget(&self, command_id: &str) {
        self.routes.lock().unwrap_or_else(|p| p.into_inner()).remove(command_id);
    }

    fn unit(&self, host: &str, unit: &str) -> Option<UnitInfo> {
        let agent = self.agent(host)?;
        agent.lock().units.get(unit).map(|(_, info)| info.clone())
    }

    fn is_connected(&self, host: &str) -> bool {
        self.agent(host).is_some()
    }

    /// The fake sends no engine samples (the watch's scrape is not modelled).
    fn route_engine_samples(&self, _host: &str, _command_id: &str, _tx: mpsc::UnboundedSender<EngineSample>) {}

    fn unit_gpu_utilization(&self, _host: &str, _unit: &str, _now_unix_ms: u64, _max_age_ms: u64) -> Option<f64> {
        None
    }
}

/// How one unit behaves when started.
#[derive(Debug, Clone)]
pub(crate) struct UnitModel {
    pub name: String,
    pub role: Role,
    /// Stopping the running instance.
    pub stop_ms: u64,
    /// From the start (after the stop) to the process being spawned.
    pub spawn_ms: u64,
    /// From spawned to health 200.
    pub healthy_ms: u64,
    /// From health 200 to the first generation check passing.
    pub generating_ms: u64,
    /// The passing generation check's latency.
    pub check_latency_ms: u64,
}

impl UnitModel {
    pub(crate) fn new(name: &str, role: Role) -> Self {
        UnitModel {
            name: name.into(),
            role,
            stop_ms: 20,
            spawn_ms: 30,
            healthy_ms: 200,
            generating_ms: 100,
            check_latency_ms: 40,
        }
    }
}

/// A start the agent executed (not a duplicate it only answered).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Executed {
    pub unit: String,
    pub command_id: String,
}

/// Secrets of the shapes issue 48's red team found in log tails, none of
/// them a value the agent was given.
pub(crate) const OLD_AGENT_SECRETS: &str = "server_args=ServerArgs(api_key='sk-live-0123456789abcdef', hf_token='hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345')\n\
{\"api_key\": \"json-secret-value-42\"}\n\
Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.bearer-secret\n\
db=postgres://pdw:PgPass99@db.internal:5432/x";

#[derive(Default)]
struct State {
    /// The routes of the orchestrator this agent is attached to.
    link: Option<Routes>,
    /// Commands on their way here (sent, not yet arrived).
    in_flight: Vec<JoinHandle<()>>,
    units: BTreeMap<String, (UnitModel, UnitInfo)>,
    executed: Vec<Executed>,
    /// Config changes applied (command id, unit), in order; restores are
    /// not listed.
    config_applies: Vec<(String, String)>,
    /// Units whose process overwrote its environment (sglang-router).
    blank_environ: std::collections::BTreeSet<String>,
    /// Replies by command id (`None` while the command still runs).
    replies: HashMap<String, Option<Kind>>,
    /// The start task under way, by unit.
    running: HashMap<String, JoinHandle<()>>,
    next_pid: u32,
    /// Each unit's config versions (its environment; version 0 is the
    /// configured one), the current one, and the one its running process
    /// was spawned from (`config.rs` of the agent: versions are kept, a
    /// restore makes an earlier one current again).
    configs: HashMap<String, Configs>,
    /// The change gate's knob: with `KNOB=on` in a decode's running
    /// environment every generation is this many times slower.
    knob_slowdown: f64,
    /// The host drifting: from the decode's Nth start on (by any
    /// operation), every request is this many times slower.
    drift: Option<(usize, f64)>,
    benchmarks: u64,
    /// What the preflight says would stop a unit from starting, by unit.
    start_problems: HashMap<String, String>,
    /// A serving router unit of this agent (its name) and the workers it
    /// lists (`agent/src/router_api.rs` over sglang-router's worker API;
    /// removals and additions show at the next list).
    router: Option<String>,
    router_workers: Vec<pdwarden_proto::v1::RouterWorker>,
    /// Every worker API call, in order: (op, urls), and the list calls' times.
    router_calls: Vec<(i32, Vec<String>, Instant)>,
    /// Engines with work in flight until then (their scrapes say 1 running).
    busy_until: HashMap<String, Instant>,
    /// KV paths (prefill url, decode url) whose transfers fail.
    broken_paths: Vec<(String, String)>,
    /// Greedy probes take this long to answer (a starved host), if set.
    greedy_ms: Option<u64>,
    /// The engines' during-work counter in scrapes (SGLang's realtime
    /// tokens): absent (None), rising by 10 a scrape (Some(true): engines
    /// that progress), or flat (Some(false): engines that stopped).
    progress: Option<bool>,
    /// The counter's last value.
    progress_tokens: f64,
    /// The engines' processes use this share of a CPU (their scrapes carry
    /// `process_cpu_seconds`), from when it was set; absent: no reading.
    cpu: Option<(f64, Instant)>,
    /// Decodes (by URL) that refuse a path probe's connection while the
    /// prefill accepts it (a dead decode process: issue 46).
    refused_decodes: Vec<String>,
    /// Decodes (by URL) whose path probes answer the first `.0` times and
    /// fail after (an intermittent decode); `.1` counts the probes.
    flaky_decodes: BTreeMap<String, (u32, u32)>,
    /// KV paths (prefill url, decode url) that fail until `unit` restarts
    /// (issue 37: a sick engine, healed by its own restart).
    broken_until: Vec<(String, String, String)>,
    /// A prefill (unit) whose restart leaves these decodes (units) holding
    /// its old identity: their path to it fails until each restarts
    /// (INCIDENTS row 1).
    stale_identity: HashMap<String, Vec<String>>,
    /// The weights the engines compute with: a greedy answer is a function
    /// of them (issue 34; "" is the default weights).
    weights: String,
    /// The change gate's knob that changes the output: with `KNOB=on` in a
    /// decode's running environment the greedy answer is these weights'.
    knob_weights: Option<String>,
    /// Decodes (by URL) that compute with other weights than the engines':
    /// a greedy probe over a KV path into one answers as those compute
    /// (issue 34, item 3). A probe through the router is not affected.
    decode_weights: HashMap<String, String>,
    /// How long a capture of evidence takes here (issue 35; 0: at once).
    capture_takes: Duration,
    /// Captures carry secrets as an agent older than issue 48's redaction
    /// by shape sent them.
    unredacted_captures: bool,
    /// Each capture asked for: its units, and how many starts had been
    /// executed when it was.
    captures: Vec<(Vec<String>, usize)>,
}

/// A greedy answer of `max_tokens` tokens as the engines compute it with
/// `weights`: each token clearly preferred (3 nats over the runner-up).
fn greedy_answer(weights: &str, max_tokens: u32) -> Vec<pdwarden_proto::v1::AnswerToken> {
    const WORDS: [&str; 8] = [" the", " sky", " is", " blue", " and", " the", " sea", " calm"];
    (0..max_tokens as usize)
        .map(|i| {
            let pick = (i + weights.len() * 3) % WORDS.len();
            let (token, other) = (WORDS[pick], WORDS[(pick + 1) % WORDS.len()]);
            pdwarden_proto::v1::AnswerToken {
                token: token.into(),
                logprob: -0.05,
                top: vec![
                    pdwarden_proto::v1::TokenAlternative {
                        token: token.into(),
                        logprob: -0.05,
                    },
                    pdwarden_proto::v1::TokenAlternative {
                        token: other.into(),
                        logprob: -3.05,
                    },
                ],
            }
        })
        .collect()
}

impl State {
    /// Whether a decode runs with `KNOB=on`.
    fn knob_on(&self) -> bool {
        self.units.iter().any(|(name, (m, _))| {
            m.role == Role::Decode && {
                let c = &self.configs[name];
                c.versions[c.running as usize].get(KNOB).is_some_and(|v| v == "on")
            }
        })
    }

    /// The weights a greedy answer is computed with now: the knob's while
    /// a decode runs with it (where the knob changes the output).
    fn answer_weights(&self) -> String {
        match &self.knob_weights {
            Some(w) if self.knob_on() => w.clone(),
            _ => self.weights.clone(),
        }
    }

    /// How many times slower than the model every request is now: the
    /// knob's slowdown while a decode runs with it, times the drift.
    fn slowdown(&self) -> f64 {
        let knob_on = self.knob_on();
        let decode_starts = self
            .executed
            .iter()
            .filter(|e| self.units.get(&e.unit).is_some_and(|(m, _)| m.role == Role::Decode))
            .count();
        let drift = match self.drift {
            Some((nth, f)) if decode_starts >= nth => f,
            _ => 1.0,
        };
        (if knob_on { self.knob_slowdown } else { 1.0 }) * drift
    }
}

#[derive(Clone, Default)]
struct Configs {
    versions: Vec<BTreeMap<String, String>>,
    current: u32,
    running: u32,
}

/// How long a command takes to reach the agent (tests poll every 1 ms).
pub(crate) const LINK_LATENCY: Duration = Duration::from_millis(2);

/// The knob a gate test flips (pd-sim's `--knob-env`).
pub(crate) const KNOB: &str = "PDW_KNOB";

/// One host's agent. Cloning shares it.
#[derive(Clone)]
pub(crate) struct FakeAgent {
    host: String,
    state: Arc<Mutex<State>>,
}

/// The fake's process start clock: each new pid started later than the last.
fn started_at(pid: u32) -> u64 {
    1_800_000_000_000 + u64::from(pid) * 1_000
}

impl FakeAgent {
    /// An agent on `host` whose units run (generating, started by nobody in
    /// particular) before any operation.
    pub(crate) fn new(host: &str, units: Vec<UnitModel>) -> Self {
        let mut st = State {
            next_pid: 1000,
            knob_slowdown: 1.0,
            ..Default::default()
        };
        for m in units {
            st.configs.insert(
                m.name.clone(),
                Configs {
                    versions: vec![BTreeMap::new()],
                    ..Default::default()
                },
            );
            st.next_pid += 1;
            let info = UnitInfo {
                name: m.name.clone(),
                role: m.role as i32,
                base_url: format!("http://fake/{}", m.name),
                phase: Phase::Generating as i32,
                pid: st.next_pid,
                process_started_unix_ms: started_at(st.next_pid),
                ..Default::default()
            };
            st.units.insert(m.name.clone(), (m, info));
        }
        FakeAgent {
            host: host.into(),
            state: Arc::new(Mutex::new(st)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Connects to `port` (the first orchestrator, or the one that replaced
    /// a killed one): from then on its units' facts are what `port` reads
    /// and its reports go to `port`'s routes. As a real agent's reconnect
    /// does, it first finishes with the old link: the commands already on
    /// their way arrive (each executed at most once) before the new link
    /// reads any fact, so the facts already show any start the killed
    /// orchestrator got out.
    pub(crate) async fn attach(&self, port: &FakePort) {
        loop {
            let in_flight = std::mem::take(&mut self.lock().in_flight);
            if in_flight.is_empty() {
                break;
            }
            for task in in_flight {
                let _ = task.await;
            }
        }
        self.lock().link = Some(port.routes.clone());
        port.agents.lock().unwrap_or_else(|p| p.into_inner()).push(self.clone());
    }

    fn attached_to(&self, routes: &Routes) -> bool {
        self.lock().link.as_ref().is_some_and(|l| Arc::ptr_eq(l, routes))
    }

    /// A command on its way: it takes [`LINK_LATENCY`] of simulated time to
    /// arrive, so each one is a point a test can kill the orchestrator at;
    /// once sent it arrives whatever happens to the sender.
    fn deliver(&self, command: Command) {
        let agent = self.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep(LINK_LATENCY).await;
            agent.handle(command.command_id, command.action);
        });
        let mut st = self.lock();
        st.in_flight.retain(|t| !t.is_finished());
        st.in_flight.push(task);
    }

    /// As if an earlier orchestrator's start `command_id` of `unit` had run
    /// here to the end (generating).
    pub(crate) fn started_before(&self, unit: &str, command_id: &str) {
        let mut st = self.lock();
        st.next_pid += 1;
        let pid = st.next_pid;
        st.executed.push(Executed {
            unit: unit.into(),
            command_id: command_id.into(),
        });
        st.replies.insert(command_id.into(), None);
        let (_, info) = st.units.get_mut(unit).expect("a unit of this agent");
        info.phase = Phase::Generating as i32;
        info.pid = pid;
        info.command_id = command_id.into();
        info.command_in_progress = false;
    }

    /// The preflight finds `problem` with `unit` (its program gone, say).
    pub(crate) fn cannot_start(&self, unit: &str, problem: &str) {
        self.lock().start_problems.insert(unit.into(), problem.into());
    }

    /// `unit` was never started (or was stopped on command): its phase
    /// is `Stopped`, no process (issue 49: the demo's first restart).
    pub(crate) fn never_started(&self, unit: &str) {
        self.say(Kind::UnitEvent(UnitEvent {
            unit: unit.into(),
            phase: Phase::Stopped as i32,
            ..Default::default()
        }));
        let mut st = self.lock();
        let (_, info) = st.units.get_mut(unit).expect("a unit of this agent");
        info.phase = Phase::Stopped as i32;
        info.pid = 0;
    }

    /// `unit`'s phase as this agent knows it.
    pub(crate) fn unit_phase(&self, unit: &str) -> Phase {
        Phase::try_from(self.lock().units[unit].1.phase).unwrap_or(Phase::Unspecified)
    }

    /// `unit`'s process dies on its own (a `kill -9` behind pdwarden's
    /// back): the spontaneous exit event goes out, and a probe through it
    /// (a router) fails with connection refused from then on.
    pub(crate) fn crash(&self, unit: &str, detail: &str) {
        let pid = self.lock().units[unit].1.pid;
        self.say(Kind::UnitEvent(UnitEvent {
            unit: unit.into(),
            phase: Phase::Exited as i32,
            pid,
            detail: detail.into(),
            ..Default::default()
        }));
        let mut st = self.lock();
        let (_, info) = st.units.get_mut(unit).expect("a unit of this agent");
        info.pid = 0;
        info.exit_detail = detail.into();
    }

    /// With the knob on, a decode generates `factor` times slower.
    /// Makes `unit` (of this agent) a serving router listing `workers`
    /// (urls of other units' `base_url`s, typed by their role).
    pub(crate) fn with_serving_router(self, unit: &str) -> Self {
        {
            let mut st = self.lock();
            st.router = Some(unit.into());
            let listed: Vec<_> = st
                .units
                .values()
                .filter(|(m, _)| m.role != Role::Router)
                .map(|(m, info)| pdwarden_proto::v1::RouterWorker {
                    url: info.base_url.clone(),
                    worker_type: if m.role == Role::Prefill { "prefill" } else { "decode" }.into(),
                    id: format!("id-{}", m.name),
                    healthy: true,
                    ..Default::default()
                })
                .collect();
            st.router_workers = listed;
        }
        self
    }

    /// The serving router lists the worker at `url` healthy or not (its
    /// own health checks' view).
    pub(crate) fn set_router_worker_health(&self, url: &str, healthy: bool) {
        for w in self.lock().router_workers.iter_mut().filter(|w| w.url == url) {
            w.healthy = healthy;
        }
    }

    /// Transfers from the prefill at `prefill_url` to the decode at
    /// `decode_url` fail (a stale bootstrap identity).
    /// The path fails until `unit` (either end) restarts.
    pub(crate) fn break_kv_path_until_restart(&self, prefill_url: &str, decode_url: &str, unit: &str) {
        self.lock()
            .broken_until
            .push((prefill_url.into(), decode_url.into(), unit.into()));
    }

    /// When `prefill` restarts, each of `decodes` keeps its old identity:
    /// its path to the prefill fails until that decode restarts.
    pub(crate) fn stale_identity_after_restart(&self, prefill: &str, decodes: &[&str]) {
        self.lock()
            .stale_identity
            .insert(prefill.into(), decodes.iter().map(|d| d.to_string()).collect());
    }

    /// Every unit started, in the order the starts came.
    pub(crate) fn starts(&self) -> Vec<String> {
        self.lock().executed.iter().map(|e| e.unit.clone()).collect()
    }

    /// Greedy probes answer after `ms` (issue 47: a starved host answering
    /// 32 tokens with logprobs slower than an 8-token probe).
    pub(crate) fn slow_greedy(&self, ms: u64) {
        self.lock().greedy_ms = Some(ms);
    }

    /// The engines' scrapes carry a during-work counter that rises
    /// (`true`) or stays flat (`false`) from now on (issue 47).
    pub(crate) fn engines_progress(&self, rising: bool) {
        self.lock().progress = Some(rising);
    }

    /// The engines' processes use `cores` of a CPU from now on (a JIT
    /// compile: 1.0; idle: a few hundredths); `None`: scrapes carry no CPU.
    pub(crate) fn engines_cpu(&self, cores: Option<f64>) {
        self.lock().cpu = cores.map(|c| (c, Instant::now()));
    }

    /// The decode at `decode_url` refuses every path probe's connection.
    pub(crate) fn refuse_decode(&self, decode_url: &str) {
        self.lock().refused_decodes.push(decode_url.into());
    }

    /// Path probes into the decode at `decode_url` answer `answered` times,
    /// then fail.
    pub(crate) fn flaky_decode(&self, decode_url: &str, answered: u32) {
        self.lock().flaky_decodes.insert(decode_url.into(), (answered, 0));
    }

    pub(crate) fn break_kv_path(&self, prefill_url: &str, decode_url: &str) {
        self.lock().broken_paths.push((prefill_url.into(), decode_url.into()));
    }

    /// The engines now compute with `weights` (a checkpoint replaced under
    /// the same path): their greedy answers change.
    pub(crate) fn set_weights(&self, weights: &str) {
        self.lock().weights = weights.into();
    }

    /// The decode at `decode_url` alone computes with `weights` (its KV
    /// read wrong, or its checkpoint replaced): a greedy probe this agent
    /// sends over a KV path into it answers as `weights` compute; one
    /// through the router still answers with the engines' weights (its
    /// policy picked another decode).
    pub(crate) fn set_decode_weights(&self, decode_url: &str, weights: &str) {
        self.lock().decode_weights.insert(decode_url.into(), weights.into());
    }

    /// Captures of evidence take `d` from now on (issue 35).
    pub(crate) fn capture_takes(&self, d: Duration) {
        self.lock().capture_takes = d;
    }

    /// Captures carry secrets of every leaked shape, unredacted, as an
    /// older agent sent them (issue 48).
    pub(crate) fn unredacted_captures(&self) {
        self.lock().unredacted_captures = true;
    }

    /// The captures asked for: (units, starts executed before it).
    pub(crate) fn captures(&self) -> Vec<(Vec<String>, usize)> {
        self.lock().captures.clone()
    }

    /// `unit` has work in flight for `for_ms` from now.
    pub(crate) fn busy_for(&self, unit: &str, for_ms: u64) {
        self.lock()
            .busy_until
            .insert(unit.into(), Instant::now() + Duration::from_millis(for_ms));
    }

    /// The worker API calls so far: (op, urls, when).
    pub(crate) fn router_calls(&self) -> Vec<(i32, Vec<String>, Instant)> {
        self.lock().router_calls.clone()
    }

    /// The urls the serving router lists now.
    pub(crate) fn router_lists(&self) -> Vec<String> {
        self.lock().router_workers.iter().map(|w| w.url.clone()).collect()
    }

    /// A call of the worker API (`agent/src/router_api.rs`'s contract).
    fn router_workers(
        &self,
        id: &str,
        r: pdwarden_proto::v1::RouterWorkers,
    ) -> pdwarden_proto::v1::RouterWorkersResult {
        use pdwarden_proto::v1::RouterWorkersOp as Op;
        let mut st = self.lock();
        let mut result = pdwarden_proto::v1::RouterWorkersResult {
            command_id: id.into(),
            unit: r.unit.clone(),
            ..Default::default()
        };
        if st.router.as_deref() != Some(r.unit.as_str()) {
            result.error = format!("{} has no worker API pdwarden can drive", r.unit);
            return result;
        }
        let urls: Vec<String> = r.workers.iter().map(|w| w.url.clone()).collect();
        st.router_calls.push((r.op, urls.clone(), Instant::now()));
        match Op::try_from(r.op).unwrap_or(Op::Unspecified) {
            Op::Remove => st.router_workers.retain(|w| !urls.contains(&w.url)),
            Op::Add => {
                for w in r.workers {
                    if !st.router_workers.iter().any(|l| l.url == w.url) {
                        st.router_workers.push(pdwarden_proto::v1::RouterWorker {
                            healthy: true,
                            id: format!("id-{}", w.url),
                            ..w
                        });
                    }
                }
            }
            Op::List | Op::Unspecified => {}
        }
        result.ok = true;
        result.workers = st.router_workers.clone();
        result
    }

    /// `unit`'s process shows no environment (sglang-router's
    /// setproctitle overwrites it).
    pub(crate) fn with_blank_environ(self, unit: &str) -> Self {
        self.lock().blank_environ.insert(unit.into());
        self
    }

    pub(crate) fn with_knob_slowdown(self, factor: f64) -> Self {
        self.lock().knob_slowdown = factor;
        self
    }

    /// With `KNOB=on` in a decode's running environment the engines'
    /// greedy answers are `weights`' (a knob that changes the output).
    pub(crate) fn with_knob_weights(self, weights: &str) -> Self {
        self.lock().knob_weights = Some(weights.into());
        self
    }

    /// From the decode's `nth` start on, every request `factor` times
    /// slower, knob or not (the host drifting, or an engine not yet as warm
    /// as the one first measured).
    pub(crate) fn with_drift_from_decode_start(self, nth: usize, factor: f64) -> Self {
        self.lock().drift = Some((nth, factor));
        self
    }

    /// The environment `unit`'s running process was spawned with.
    pub(crate) fn running_env(&self, unit: &str) -> BTreeMap<String, String> {
        let st = self.lock();
        let c = &st.configs[unit];
        c.versions[c.running as usize].clone()
    }

    /// The environment `unit` would start with now (its current version).
    pub(crate) fn current_env(&self, unit: &str) -> BTreeMap<String, String> {
        let st = self.lock();
        let c = &st.configs[unit];
        c.versions[c.current as usize].clone()
    }

    /// Every start executed, in order.
    pub(crate) fn executed(&self) -> Vec<Executed> {
        self.lock().executed.clone()
    }

    /// The config changes (`Apply`) this agent executed: (command id, unit).
    pub(crate) fn config_applies(&self) -> Vec<(String, String)> {
        self.lock().config_applies.clone()
    }

    /// How many times `unit` was started.
    pub(crate) fn starts_of(&self, unit: &str) -> usize {
        self.lock().executed.iter().filter(|e| e.unit == unit).count()
    }

    /// Sends `kind` to the attached orchestrator (to whoever awaits its
    /// command there), keeping this side's facts.
    fn say(&self, kind: Kind) {
        let link = {
            let mut st = self.lock();
            if let Kind::UnitEvent(ev) = &kind
                && ev.attempt.is_none()
                && let Some((_, info)) = st.units.get_mut(&ev.unit)
            {
                info.phase = ev.phase;
                if ev.pid != 0 {
                    info.pid = ev.pid;
                }
                if ev.process_started_unix_ms != 0 {
                    info.process_started_unix_ms = ev.process_started_unix_ms;
                }
                if !ev.command_id.is_empty() {
                    info.command_id = ev.command_id.clone();
                    info.command_in_progress =
                        !matches!(Phase::try_from(ev.phase), Ok(Phase::Generating | Phase::NotReady));
                }
            }
            st.link.clone()
        };
        let (id, report) = match kind {
            Kind::UnitEvent(e) => (e.command_id.clone(), AgentReport::Unit(e)),
            Kind::CommandResult(r) => (r.command_id.clone(), AgentReport::Result(r)),
            Kind::ProbeResult(r) => (r.command_id.clone(), AgentReport::Probe(r)),
            Kind::ScrapeResult(r) => (r.command_id.clone(), AgentReport::Scrape(r)),
            Kind::UnitConfigResult(r) => (r.command_id.clone(), AgentReport::UnitConfig(r)),
            Kind::GateResult(r) => (r.command_id.clone(), AgentReport::Gate(r)),
            Kind::RouterWorkersResult(r) => (r.command_id.clone(), AgentReport::RouterWorkers(r)),
            Kind::EvidenceResult(r) => (r.command_id.clone(), AgentReport::Evidence(r)),
            other => panic!("the fake agent does not say {other:?}"),
        };
        if let Some(routes) = link
            && let Some(tx) = routes.lock().unwrap_or_else(|p| p.into_inner()).get(&id)
        {
            let _ = tx.send(report);
        }
    }

    /// The reply to `id`, remembered for duplicates, and sent.
    fn reply(&self, id: &str, kind: Kind) {
        self.lock().replies.insert(id.to_string(), Some(kind.clone()));
        self.say(kind);
    }

    fn handle(&self, id: String, action: Option<Action>) {
        {
            let mut st = self.lock();
            match st.replies.get(&id) {
                Some(Some(reply)) => {
                    let kind = reply.clone();
                    drop(st);
                    self.say(kind);
                    return;
                }
                // Still running: its reply (and its events) will come.
                Some(None) => return,
                None => {
                    st.replies.insert(id.clone(), None);
                }
            }
        }
        match action {
            Some(Action::Start(s)) => self.start(id, s.unit),
            Some(Action::Probe(p)) => {
                let agent = self.clone();
                let (dead, refused, latency_ms, weights) = {
                    let mut st = self.lock();
                    let into = p
                        .pd_path
                        .as_ref()
                        .map(|path| path.decode_url.clone())
                        .unwrap_or_default();
                    let refused = st.refused_decodes.contains(&into);
                    let flaky = match st.flaky_decodes.get_mut(&into) {
                        Some((answered, seen)) => {
                            *seen += 1;
                            *seen > *answered
                        }
                        None => false,
                    };
                    let broken = p.pd_path.as_ref().is_some_and(|path| {
                        st.broken_paths
                            .iter()
                            .any(|(pf, d)| *pf == path.prefill_url && *d == path.decode_url)
                            || st
                                .broken_until
                                .iter()
                                .any(|(pf, d, _)| *pf == path.prefill_url && *d == path.decode_url)
                    });
                    let dead = broken
                        || refused
                        || flaky
                        || st
                            .units
                            .get(&p.unit)
                            .is_some_and(|(_, i)| i.phase == Phase::Exited as i32);
                    let weights = match p
                        .pd_path
                        .as_ref()
                        .and_then(|path| st.decode_weights.get(&path.decode_url))
                    {
                        Some(w) => w.clone(),
                        None => st.answer_weights(),
                    };
                    let latency = match (st.greedy_ms, p.chat.as_ref().is_some_and(|c| c.greedy)) {
                        (Some(ms), true) => ms,
                        _ => (20.0 * st.slowdown()) as u64,
                    };
                    (dead, refused, latency, weights)
                };
                tokio::spawn(async move {
                    // Past the request's own timeout the agent answers a
                    // timeout, as `checks::post_generation` does.
                    let failed = if p.timeout_ms > 0 && latency_ms > p.timeout_ms {
                        tokio::time::sleep(Duration::from_millis(p.timeout_ms)).await;
                        Some(ProbeResult {
                            outcome: ProbeOutcome::Timeout as i32,
                            latency_ms: p.timeout_ms,
                            error: format!("no tokens within {} ms", p.timeout_ms),
                            ..Default::default()
                        })
                    } else {
                        tokio::time::sleep(Duration::from_millis(latency_ms)).await;
                        dead.then(|| ProbeResult {
                            outcome: ProbeOutcome::Error as i32,
                            error: "connection refused".into(),
                            unreachable: if refused { "decode".into() } else { String::new() },
                            ..Default::default()
                        })
                    };
                    if let Some(r) = failed {
                        return agent.reply(
                            &id,
                            Kind::ProbeResult(ProbeResult {
                                command_id: id.clone(),
                                unit: p.unit,
                                seq: p.seq,
                                ..r
                            }),
                        );
                    }
                    agent.reply(
                        &id,
                        Kind::ProbeResult(ProbeResult {
                            command_id: id.clone(),
                            unit: p.unit,
                            seq: p.seq,
                            outcome: ProbeOutcome::Ok as i32,
                            latency_ms,
                            tokens: p.chat.as_ref().map_or(1, |c| c.max_tokens.max(1)),
                            request_id: format!("pdwarden-probe-{id}"),
                            answer: match &p.chat {
                                Some(c) if c.greedy => greedy_answer(&weights, c.max_tokens),
                                _ => Vec::new(),
                            },
                            ..Default::default()
                        }),
                    );
                });
            }
            Some(Action::CaptureEvidence(c)) => {
                // A wedged engine core as py-spy shows it after a SIGSTOP
                // (vllm/v1/engine/core.py), per unit.
                let (takes, units) = {
                    let mut st = self.lock();
                    let executed = st.executed.len();
                    st.captures.push((c.units.clone(), executed));
                    let units: Vec<pdwarden_proto::v1::UnitEvidence> = c
                        .units
                        .iter()
                        .map(|u| {
                            let pid = st.units.get(u).map_or(0, |(_, i)| i.pid);
                            pdwarden_proto::v1::UnitEvidence {
                                unit: u.clone(),
                                pid,
                                processes: vec![pdwarden_proto::v1::ProcessStacks {
                                    pid,
                                    command: if st.unredacted_captures {
                                        "python -m sglang.launch_server --kv-url http://kv:S3cretKvPass@10.0.0.2:9000"
                                            .into()
                                    } else {
                                        String::new()
                                    },
                                    method: "py-spy".into(),
                                    threads: vec![pdwarden_proto::v1::ThreadStack {
                                        tid: pid,
                                        name: "EngineCore_DP0".into(),
                                        state: "T".into(),
                                        frames: vec![
                                            "_process_input_queue (vllm/v1/engine/core.py:1588)".into(),
                                            "run_busy_loop (vllm/v1/engine/core.py:1551)".into(),
                                        ],
                                        ..Default::default()
                                    }],
                                    ..Default::default()
                                }],
                                log_tail: if st.unredacted_captures {
                                    format!("{u}: last words\n{OLD_AGENT_SECRETS}")
                                } else {
                                    format!("{u}: last words")
                                },
                                documents: if st.unredacted_captures {
                                    vec![pdwarden_proto::v1::EvidenceDocument {
                                        name: "server_info".into(),
                                        body: OLD_AGENT_SECRETS.into(),
                                        ..Default::default()
                                    }]
                                } else {
                                    Vec::new()
                                },
                                ..Default::default()
                            }
                        })
                        .collect();
                    (st.capture_takes, units)
                };
                let agent = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(takes).await;
                    agent.reply(
                        &id,
                        Kind::EvidenceResult(pdwarden_proto::v1::EvidenceResult {
                            command_id: id.clone(),
                            units,
                            took_ms: takes.as_millis() as u64,
                            py_spy: "/usr/bin/py-spy".into(),
                            ..Default::default()
                        }),
                    );
                });
            }
            Some(Action::RouterWorkers(r)) => {
                let result = self.router_workers(&id, r);
                self.reply(&id, Kind::RouterWorkersResult(result));
            }
            Some(Action::Scrape(s)) => {
                let now = Instant::now();
                let busy = self.lock().busy_until.clone();
                let realtime = {
                    let mut st = self.lock();
                    if st.progress == Some(true) {
                        st.progress_tokens += 10.0;
                    }
                    st.progress.map(|_| st.progress_tokens)
                };
                let cpu = self
                    .lock()
                    .cpu
                    .map(|(cores, since)| 100.0 + cores * now.saturating_duration_since(since).as_secs_f64());
                let samples = s
                    .targets
                    .into_iter()
                    .map(|t| EngineSample {
                        command_id: id.clone(),
                        running_reqs: Some(if busy.get(&t.unit).is_some_and(|until| now < *until) {
                            1.0
                        } else {
                            0.0
                        }),
                        queued_reqs: Some(0.0),
                        unit: t.unit,
                        metrics_ok: true,
                        health_status: 200,
                        transfer_failed_total: Some(0.0),
                        bootstrap_failed_total: Some(0.0),
                        engine_kind: "sglang".into(),
                        realtime_tokens_total: realtime,
                        process_cpu_seconds: cpu,
                        ..Default::default()
                    })
                    .collect();
                self.reply(
                    &id,
                    Kind::ScrapeResult(ScrapeResult {
                        command_id: id.clone(),
                        samples,
                        error: String::new(),
                    }),
                );
            }
            Some(Action::UnitConfig(c)) => {
                let result = self.unit_config(&id, c);
                self.reply(&id, Kind::UnitConfigResult(result));
            }
            Some(Action::Gate(g)) => match g.step {
                Some(gate_agent_step::Step::Inspect(i)) => {
                    let inspection = self.inspect(&g.unit, &i.env_keys);
                    self.reply(
                        &id,
                        Kind::GateResult(GateAgentResult {
                            command_id: id.clone(),
                            unit: g.unit,
                            result: Some(gate_agent_result::Result::Process(inspection)),
                        }),
                    );
                }
                Some(gate_agent_step::Step::Benchmark(b)) => {
                    let agent = self.clone();
                    tokio::spawn(async move {
                        let (result, took) = agent.benchmark(&b);
                        tokio::time::sleep(took).await;
                        agent.reply(
                            &id,
                            Kind::GateResult(GateAgentResult {
                                command_id: id.clone(),
                                unit: g.unit,
                                result: Some(gate_agent_result::Result::Benchmark(result)),
                            }),
                        );
                    });
                }
                None => {}
            },
            Some(Action::Preflight(p)) => {
                let problems: Vec<String> = {
                    let st = self.lock();
                    p.units
                        .iter()
                        .filter_map(|u| st.start_problems.get(u).cloned())
                        .collect()
                };
                self.reply(
                    &id,
                    Kind::CommandResult(CommandResult {
                        command_id: id.clone(),
                        ok: problems.is_empty(),
                        error: problems.join("; "),
                        ms_since_command: 0,
                    }),
                );
            }
            other => self.reply(
                &id,
                Kind::CommandResult(CommandResult {
                    command_id: id.clone(),
                    ok: false,
                    error: format!("fake agent: {other:?} is not modelled"),
                    ms_since_command: 0,
                }),
            ),
        }
    }

    fn unit_config(&self, id: &str, c: pdwarden_proto::v1::UnitConfigChange) -> UnitConfigResult {
        let mut guard = self.lock();
        let st = &mut *guard;
        let mut r = UnitConfigResult {
            command_id: id.into(),
            unit: c.unit.clone(),
            ..Default::default()
        };
        let Some(cfg) = st.configs.get_mut(&c.unit) else {
            r.error = format!("unknown unit {:?}", c.unit);
            return r;
        };
        r.previous_version = cfg.current;
        match c.change {
            Some(unit_config_change::Change::Apply(edit)) => {
                let mut env = cfg.versions[cfg.current as usize].clone();
                env.extend(edit.set_env);
                for k in edit.unset_env {
                    env.remove(&k);
                }
                cfg.versions.push(env);
                cfg.current = cfg.versions.len() as u32 - 1;
                st.config_applies.push((id.to_string(), c.unit.clone()));
            }
            Some(unit_config_change::Change::RestoreVersion(v)) if (v as usize) < cfg.versions.len() => cfg.current = v,
            other => {
                r.error = format!("fake agent: {other:?}");
                return r;
            }
        }
        r.ok = true;
        r.version = cfg.current;
        r.argv = vec!["fake-engine".into()];
        r.env = cfg.versions[cfg.current as usize].clone().into_iter().collect();
        r
    }

    fn inspect(&self, unit: &str, keys: &[String]) -> ProcessInspection {
        let st = self.lock();
        let (Some(cfg), Some((_, info))) = (st.configs.get(unit), st.units.get(unit)) else {
            return ProcessInspection {
                error: format!("unknown unit {unit:?}"),
                ..Default::default()
            };
        };
        let env = &cfg.versions[cfg.running as usize];
        let blank = st.blank_environ.contains(unit);
        ProcessInspection {
            error: String::new(),
            config_version: cfg.running,
            processes: vec![ProcessFacts {
                pid: info.pid,
                cmdline: vec!["fake-engine".into()],
                env: keys
                    .iter()
                    .map(|k| ProcessEnvValue {
                        key: k.clone(),
                        present: !blank && env.contains_key(k),
                        value: env.get(k).cloned().unwrap_or_default(),
                    })
                    .collect(),
                environ_blank: blank,
                ..Default::default()
            }],
        }
    }

    /// The benchmark through the router: every request 15 ms to the first
    /// token and 1 ms per further token, times the knob's slowdown when a
    /// decode runs with it, with ±3 % of deterministic jitter; and how long
    /// the rounds take.
    fn benchmark(&self, b: &pdwarden_proto::v1::GateBenchmark) -> (GateBenchmarkResult, Duration) {
        let mut st = self.lock();
        st.benchmarks += 1;
        let factor = st.slowdown();
        let mut seed = st.benchmarks.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut jitter = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            1.0 + ((seed % 601) as f64 - 300.0) / 10_000.0
        };
        let mut result = GateBenchmarkResult::default();
        let mut total_us = 0;
        for round in 0..b.rounds.max(1) {
            let mut longest = 0;
            for _ in 0..b.concurrency.max(1) {
                let ttft_us = (15_000.0 * factor * jitter()) as u64;
                let decode_us = (1_000.0 * f64::from(b.max_tokens.saturating_sub(1)) * factor * jitter()) as u64;
                longest = longest.max(ttft_us + decode_us);
                result.samples.push(GateRequestSample {
                    round,
                    outcome: ProbeOutcome::Ok as i32,
                    ttft_us,
                    latency_us: ttft_us + decode_us,
                    tokens: b.max_tokens,
                    decode_us,
                    ..Default::default()
                });
            }
            result.round_us.push(longest);
            total_us += longest;
        }
        (result, Duration::from_micros(total_us))
    }

    /// `unit` restarted by someone else (systemd, an operator): a new
    /// process, started now, with no command of pdwarden's; its decodes
    /// that [`Self::stale_identity_after_restart`] named keep its old
    /// identity. Said as the agent says a spontaneous spawn.
    pub(crate) fn restart_outside(&self, unit: &str) {
        let pid = {
            let mut st = self.lock();
            if let Some(decodes) = st.stale_identity.remove(unit) {
                for d in decodes {
                    let (pf, du) = (format!("http://fake/{unit}"), format!("http://fake/{d}"));
                    st.broken_until.push((pf, du, d));
                }
            }
            st.next_pid += 1;
            st.next_pid
        };
        for phase in [Phase::Spawned, Phase::Generating] {
            self.say(Kind::UnitEvent(UnitEvent {
                unit: unit.into(),
                phase: phase as i32,
                pid,
                process_started_unix_ms: started_at(pid),
                ..Default::default()
            }));
        }
    }

    fn start(&self, id: String, unit: String) {
        let mut st = self.lock();
        let Some((model, info)) = st.units.get(&unit).cloned() else {
            drop(st);
            self.reply(
                &id,
                Kind::CommandResult(CommandResult {
                    command_id: id.clone(),
                    ok: false,
                    error: format!("unknown unit {unit:?}"),
                    ms_since_command: 0,
                }),
            );
            return;
        };
        st.executed.push(Executed {
            unit: unit.clone(),
            command_id: id.clone(),
        });
        st.broken_until.retain(|(_, _, healer)| *healer != unit);
        if let Some(decodes) = st.stale_identity.remove(&unit) {
            for d in decodes {
                let (pf, du) = (format!("http://fake/{unit}"), format!("http://fake/{d}"));
                st.broken_until.push((pf, du, d));
            }
        }
        st.next_pid += 1;
        let pid = st.next_pid;
        // A start still under way is superseded: abandoned, started again.
        if let Some(old) = st.running.remove(&unit) {
            old.abort();
        }
        let agent = self.clone();
        let task_unit = unit.clone();
        let task = tokio::spawn(async move {
            let received = Instant::now();
            let unit = task_unit;
            let event = |phase: Phase, pid: u32, detail: &str| {
                Kind::UnitEvent(UnitEvent {
                    unit: unit.clone(),
                    phase: phase as i32,
                    command_id: id.clone(),
                    ms_since_command: received.elapsed().as_millis() as u64,
                    pid,
                    detail: detail.into(),
                    ..Default::default()
                })
            };
            if info.pid != 0 {
                agent.say(event(Phase::Stopping, info.pid, "stopping the running instance"));
                tokio::time::sleep(Duration::from_millis(model.stop_ms)).await;
                agent.say(event(Phase::Exited, 0, "stopped on command"));
            }
            tokio::time::sleep(Duration::from_millis(model.spawn_ms)).await;
            let version = {
                let mut st = agent.lock();
                let c = st.configs.get_mut(&unit).expect("a unit of this agent");
                c.running = c.current;
                c.running
            };
            let mut spawned = event(Phase::Spawned, pid, "");
            if let Kind::UnitEvent(ev) = &mut spawned {
                ev.config_fingerprint = format!("{unit}-v{version}");
                ev.process_started_unix_ms = started_at(pid);
            }
            agent.say(spawned);
            agent.reply(
                &id,
                Kind::CommandResult(CommandResult {
                    command_id: id.clone(),
                    ok: true,
                    error: String::new(),
                    ms_since_command: received.elapsed().as_millis() as u64,
                }),
            );
            tokio::time::sleep(Duration::from_millis(model.healthy_ms)).await;
            agent.say(event(Phase::Healthy, pid, "health 200"));
            tokio::time::sleep(Duration::from_millis(model.generating_ms)).await;
            let mut generating = event(Phase::Generating, pid, "generation check passed");
            if let Kind::UnitEvent(ev) = &mut generating {
                ev.check_latency_ms = model.check_latency_ms;
                ev.check_tokens = 1;
                ev.engine_version = "fake-1".into();
            }
            agent.say(generating);
            agent.lock().running.remove(&unit);
        });
        st.running.insert(unit, task);
    }
}

/// The drivers' test rig over this agent: one pair on one host, and an
/// orchestrator that can be killed and replaced.
pub(crate) mod rig {
    use std::future::Future;
    use std::sync::Arc;
    use std::time::Duration;

    use pdwarden_proto::v1::Role;

    use super::{FakeAgent, FakePort, UnitModel};
    use crate::config::{OrchestratorConfig, PairConfig};
    use crate::ops::corestart::OperationContext;
    use crate::ops::journal::Journal;

    pub(crate) const UNITS: [&str; 3] = ["prefill-0", "decode-0", "router-0"];

    /// An xPyD pair `p` on host `h1` (`prefill-N`, `decode-N`, `router-0`),
    /// its suite off, with `extra` TOML appended under it.
    pub(crate) fn xpyd_pair(prefills: usize, decodes: usize, extra: &str) -> PairConfig {
        let units = |role: &str, n: usize| {
            (0..n)
                .map(|i| format!(r#"{{ host = "h1", unit = "{role}-{i}" }}"#))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let text = format!(
            r#"
listen = "127.0.0.1:7070"
journal = "/unused"
[[pair]]
name = "p"
prefill = [{}]
decode = [{}]
router = [{{ host = "h1", unit = "router-0" }}]
[pair.probe]
model = "m"
prompt = "Say hi"
warm_budget_ms = 1000
cold_allowance_ms = 3000
probe_timeout_ms = 5000
max_probes = 8
[pair.suite.long_generation]
enabled = false
[pair.suite.multi_turn]
enabled = false
[pair.suite.concurrency]
enabled = false
{extra}"#,
            units("prefill", prefills),
            units("decode", decodes)
        );
        crate::config::OrchestratorConfig::from_toml_str(&text)
            .unwrap()
            .pairs
            .remove(0)
    }

    /// Pair `p` on host `h1` (decode start `policy`), its suite off, with
    /// `extra` TOML appended under it (a `[pair.gate]`, say).
    pub(crate) fn pair(policy: &str, extra: &str) -> PairConfig {
        let text = format!(
            r#"
listen = "127.0.0.1:7070"
journal = "/unused"
[[pair]]
name = "p"
decode_start_policy = "{policy}"
prefill = [{{ host = "h1", unit = "prefill-0" }}]
decode = [{{ host = "h1", unit = "decode-0" }}]
router = [{{ host = "h1", unit = "router-0" }}]
[pair.probe]
model = "m"
prompt = "Say hi"
warm_budget_ms = 1000
cold_allowance_ms = 3000
probe_timeout_ms = 5000
[pair.suite.long_generation]
enabled = false
[pair.suite.multi_turn]
enabled = false
[pair.suite.concurrency]
enabled = false
{extra}"#
        );
        OrchestratorConfig::from_toml_str(&text).unwrap().pairs.remove(0)
    }

    /// The agent of host `h1` with the pair's three units.
    pub(crate) fn agent() -> FakeAgent {
        FakeAgent::new(
            "h1",
            vec![
                UnitModel::new("prefill-0", Role::Prefill),
                UnitModel::new("decode-0", Role::Decode),
                UnitModel::new("router-0", Role::Router),
            ],
        )
    }

    pub(crate) fn journal(dir: &tempfile::TempDir) -> Arc<Journal> {
        Arc::new(Journal::open(&dir.path().join("journal.sqlite")).unwrap())
    }

    /// What `agent` did that no write-ahead entry of operations `ops`
    /// records (issue 32's fail-at-every-write tests): each start whose
    /// command no `command` entry names, and each worker the serving router
    /// was told to remove that no `drain_removing` entry names.
    pub(crate) fn done_unrecorded(journal: &Journal, ops: &[String], agent: &FakeAgent) -> Vec<String> {
        let commands: Vec<String> = ops
            .iter()
            .flat_map(|o| journal.commands(o).unwrap())
            .map(|c| c.command_id)
            .collect();
        let taken_out: Vec<String> = ops
            .iter()
            .flat_map(|o| {
                journal
                    .read::<Vec<pdwarden_model::report::PairWorker>>(o, "drain_removing")
                    .unwrap()
            })
            .flatten()
            .map(|w| w.url)
            .collect();
        let mut out: Vec<String> = agent
            .executed()
            .into_iter()
            .filter(|e| !commands.contains(&e.command_id))
            .map(|e| format!("{} started without its write-ahead entry", e.unit))
            .collect();
        for (op, urls, _) in agent.router_calls() {
            if op == pdwarden_proto::v1::RouterWorkersOp::Remove as i32 {
                out.extend(
                    urls.iter()
                        .filter(|u| !taken_out.contains(u))
                        .map(|u| format!("{u} taken out of rotation unrecorded")),
                );
            }
        }
        out
    }

    /// A new orchestrator's view: a fresh port the agent (re-)attaches to,
    /// over the journal that survives.
    pub(crate) async fn orchestrator(journal: &Arc<Journal>, agent: &FakeAgent) -> OperationContext {
        let port = FakePort::default();
        agent.attach(&port).await;
        OperationContext {
            agents: Arc::new(port),
            journal: journal.clone(),
        }
    }

    /// Makes every write of `journal` fail from the operation's own
    /// `fail_from`-th write on (0-based, counted from now; `None`: none
    /// fails). Returns the writes so far, to count the operation's own.
    pub(crate) fn fail_writes_from(journal: &Journal, fail_from: Option<usize>) -> usize {
        let before = journal.writes_seen();
        if let Some(n) = fail_from {
            journal.fail_writes(before + n + 1..=before + n + 100_000);
        }
        before
    }

    /// The one fail-from-every-write harness (issue 32's tests, written
    /// once per workflow before issue 33): `attempt(fail_from)` runs the
    /// workflow in a fresh world whose journal fails from its own
    /// `fail_from`-th write on ([`fail_writes_from`]) and returns the world
    /// and the operation's own writes. The clean run is handed to `clean`;
    /// then every write in turn is the first to fail, and `check` returns
    /// what that run broke. Asserts nothing was; returns the clean run's
    /// number of writes.
    pub(crate) async fn fail_from_every_write<W>(
        attempt: impl AsyncFn(Option<usize>) -> (W, usize),
        clean: impl FnOnce(&W, usize),
        mut check: impl AsyncFnMut(usize, usize, W) -> Vec<String>,
    ) -> usize {
        let (world, total) = attempt(None).await;
        clean(&world, total);
        drop(world);
        let mut broken = Vec::new();
        for n in 0..total {
            let (world, _) = attempt(Some(n)).await;
            broken.extend(check(n, total, world).await);
        }
        assert!(
            broken.is_empty(),
            "{} violations of {total} runs: {broken:#?}",
            broken.len()
        );
        total
    }

    /// After a run whose journal failed: the disk has room again, the
    /// pending conclusions are written, and a while later nothing of it
    /// may be left running. What was, as violations.
    pub(crate) async fn healed_nothing_running(journal: &Journal, at: &str) -> Vec<String> {
        journal.heal();
        journal.flush_pending();
        tokio::time::sleep(Duration::from_secs(30)).await;
        let open: Vec<String> = journal.unfinished().unwrap().into_iter().map(|o| o.pair).collect();
        if open.is_empty() {
            Vec::new()
        } else {
            vec![format!("{at}: left running once the disk had room: {open:?}")]
        }
    }

    /// The one kill-at-every-point harness (issue 33: the loop was written
    /// once per workflow). `fresh` makes a new world (a journal, an agent,
    /// the operation begun); `run` the workflow's future over it; `entries`
    /// counts the journal entries it has written so far (its children's
    /// too, where it has some). One whole run counts the points; then, for
    /// each point `k`, a fresh world whose workflow is killed at the first
    /// await after its `k`-th entry is handed to `check` (which takes it
    /// over and asserts). A run that finished before entry `k` is skipped.
    /// Returns the number of entries of a whole run.
    pub(crate) async fn kill_at_every_point<W, F>(
        fresh: impl AsyncFn() -> W,
        run: impl Fn(&W) -> F,
        entries: impl Fn(&W) -> usize,
        mut check: impl AsyncFnMut(usize, W),
    ) -> usize
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let whole = {
            let world = fresh().await;
            run(&world).await;
            entries(&world)
        };
        for k in 1..whole {
            let world = fresh().await;
            let task = tokio::spawn(run(&world));
            // Bounded: a whole run takes a few simulated seconds.
            for _ in 0..600_000 {
                if task.is_finished() || entries(&world) >= k {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            if task.is_finished() {
                continue;
            }
            task.abort();
            let _ = task.await;
            check(k, world).await;
        }
        whole
    }
}
