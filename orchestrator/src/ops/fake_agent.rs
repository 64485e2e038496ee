//! An in-memory agent for the drivers' unit tests (issue 14): it attaches to
//! a [`Fleet`] as a real agent's stream would, answers the commands a
//! co-restart sends, and remembers every start it *executed*.
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
//! `Fleet` is an orchestrator restart, with the starts it had sent still
//! running here. Timing is tokio's, so tests run at paused time.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pdwarden_proto::v1::{
    AgentMessage, CommandResult, EngineSample, GateAgentResult, GateBenchmarkResult, GateRequestSample, Phase,
    ProbeOutcome, ProbeResult, ProcessEnvValue, ProcessFacts, ProcessInspection, Role, ScrapeResult, UnitConfigResult,
    UnitEvent, UnitInfo, agent_message::Kind, command::Action, gate_agent_result, gate_agent_step,
    orchestrator_message, unit_config_change,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::edge::fleet::Fleet;

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

#[derive(Default)]
struct State {
    fleet: Option<Fleet>,
    /// The current link's close signal and command loop.
    link: Option<(tokio::sync::oneshot::Sender<()>, JoinHandle<()>)>,
    units: BTreeMap<String, (UnitModel, UnitInfo)>,
    executed: Vec<Executed>,
    /// Replies by command id (`None` while the command still runs).
    replies: HashMap<String, Option<AgentMessage>>,
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
    benchmarks: u64,
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

    /// Connects to `fleet` (the first orchestrator, or the one that replaced
    /// a killed one): registers the units' current facts and serves its
    /// commands from then on. As a real agent's reconnect does, it first
    /// finishes with the old link: the commands that had reached it are
    /// taken (each at most once) before the new registration, so the facts
    /// registered already show any start the killed orchestrator got out.
    pub(crate) async fn attach(&self, fleet: &Fleet) {
        let old = self.lock().link.take();
        if let Some((close, task)) = old {
            let _ = close.send(());
            let _ = task.await;
        }
        let units: Vec<UnitInfo> = {
            let mut st = self.lock();
            st.fleet = Some(fleet.clone());
            st.units.values().map(|(_, i)| i.clone()).collect()
        };
        let mut rx = fleet.attach_in_process(&self.host, units);
        let (close_tx, mut close_rx) = tokio::sync::oneshot::channel::<()>();
        let agent = self.clone();
        let task = tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    biased;
                    _ = &mut close_rx => {
                        // The link is gone: what had arrived is still taken.
                        rx.close();
                        while let Some(Ok(msg)) = rx.recv().await {
                            agent.take(msg).await;
                        }
                        return;
                    }
                    msg = rx.recv() => msg,
                };
                match msg {
                    Some(Ok(msg)) => agent.take(msg).await,
                    _ => return,
                }
            }
        });
        self.lock().link = Some((close_tx, task));
    }

    async fn take(&self, msg: pdwarden_proto::v1::OrchestratorMessage) {
        if let Some(orchestrator_message::Kind::Command(c)) = msg.kind {
            // The link's latency: every command takes simulated time to
            // arrive, so each one is a point a test can kill at.
            tokio::time::sleep(LINK_LATENCY).await;
            self.handle(c.command_id, c.action);
        }
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

    /// With the knob on, a decode generates `factor` times slower.
    pub(crate) fn with_knob_slowdown(self, factor: f64) -> Self {
        self.lock().knob_slowdown = factor;
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

    /// How many times `unit` was started.
    pub(crate) fn starts_of(&self, unit: &str) -> usize {
        self.lock().executed.iter().filter(|e| e.unit == unit).count()
    }

    /// Sends `kind` to the attached orchestrator, keeping this side's facts.
    fn say(&self, kind: Kind) {
        let fleet = {
            let mut st = self.lock();
            if let Kind::UnitEvent(ev) = &kind
                && ev.attempt.is_none()
                && let Some((_, info)) = st.units.get_mut(&ev.unit)
            {
                info.phase = ev.phase;
                if ev.pid != 0 {
                    info.pid = ev.pid;
                }
                if !ev.command_id.is_empty() {
                    info.command_id = ev.command_id.clone();
                    info.command_in_progress =
                        !matches!(Phase::try_from(ev.phase), Ok(Phase::Generating | Phase::NotReady));
                }
            }
            st.fleet.clone()
        };
        if let Some(f) = fleet {
            f.agent_says(&self.host, AgentMessage { kind: Some(kind) });
        }
    }

    /// The reply to `id`, remembered for duplicates, and sent.
    fn reply(&self, id: &str, kind: Kind) {
        self.lock().replies.insert(
            id.to_string(),
            Some(AgentMessage {
                kind: Some(kind.clone()),
            }),
        );
        self.say(kind);
    }

    fn handle(&self, id: String, action: Option<Action>) {
        {
            let mut st = self.lock();
            match st.replies.get(&id) {
                Some(Some(reply)) => {
                    let kind = reply.kind.clone();
                    drop(st);
                    if let Some(k) = kind {
                        self.say(k);
                    }
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
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    agent.reply(
                        &id,
                        Kind::ProbeResult(ProbeResult {
                            command_id: id.clone(),
                            unit: p.unit,
                            seq: p.seq,
                            outcome: ProbeOutcome::Ok as i32,
                            latency_ms: 20,
                            tokens: p.chat.map_or(1, |c| c.max_tokens.max(1)),
                            request_id: format!("pdwarden-probe-{id}"),
                            ..Default::default()
                        }),
                    );
                });
            }
            Some(Action::Scrape(s)) => {
                let samples = s
                    .targets
                    .into_iter()
                    .map(|t| EngineSample {
                        command_id: id.clone(),
                        unit: t.unit,
                        metrics_ok: true,
                        health_status: 200,
                        transfer_failed_total: Some(0.0),
                        bootstrap_failed_total: Some(0.0),
                        engine_kind: "sglang".into(),
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
        let mut st = self.lock();
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
                        present: env.contains_key(k),
                        value: env.get(k).cloned().unwrap_or_default(),
                    })
                    .collect(),
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
        let slow = st.units.iter().any(|(name, (m, _))| {
            m.role == Role::Decode && {
                let c = &st.configs[name];
                c.versions[c.running as usize].get(KNOB).is_some_and(|v| v == "on")
            }
        });
        let factor = if slow { st.knob_slowdown } else { 1.0 };
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

    use super::{FakeAgent, UnitModel};
    use crate::config::{OrchestratorConfig, PairConfig};
    use crate::edge::fleet::Fleet;
    use crate::ops::corestart::OperationContext;
    use crate::ops::journal::Journal;

    pub(crate) const UNITS: [&str; 3] = ["prefill-0", "decode-0", "router-0"];

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

    /// A new orchestrator's view: a fresh fleet the agent (re-)attaches to,
    /// over the journal that survives.
    pub(crate) async fn orchestrator(journal: &Arc<Journal>, agent: &FakeAgent) -> OperationContext {
        let fleet = Fleet::new();
        agent.attach(&fleet).await;
        OperationContext {
            fleet,
            journal: journal.clone(),
        }
    }

    /// Runs `op` (operation `id`) and kills it at the first await after its
    /// `k`-th journal entry. False when it finished before that.
    pub(crate) async fn kill_after_entry<F>(journal: &Journal, id: &str, k: usize, op: F) -> bool
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let task = tokio::spawn(op);
        // Bounded: a whole run takes a few simulated seconds.
        for _ in 0..600_000 {
            if task.is_finished() || journal.entries(id).unwrap().len() >= k {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if task.is_finished() {
            return false;
        }
        task.abort();
        let _ = task.await;
        true
    }
}
