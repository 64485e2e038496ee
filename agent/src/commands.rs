//! Executes the orchestrator's commands, each command id at most once.
//!
//! The orchestrator journals a step before sending its command and may send
//! the same command again after a reconnect (DESIGN.md 4). The agent therefore
//! remembers recent command ids with their replies: a duplicate is answered
//! with the original reply (once the original finishes, if it is still
//! running) and never executed again.
//!
//! Handling never blocks the link: start/stop are queued on the unit's actor
//! at once (which keeps their order) and awaited in a task; probes and
//! evidence captures run concurrently in their own tasks.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pdwarden_proto::v1::{
    AgentMessage, Command, CommandResult, ProbeOutcome, ProbeRequest, ProbeResult, agent_message::Kind, command::Action,
};
use thiserror::Error;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::checks::{chat_probe, error_chain};
use crate::gpu::reporter::Latest;
use crate::outbox::Outbox;
use crate::readiness::{DEFAULT_CHECK_MAX_TOKENS, ReadinessParams};
use crate::supervisor::{CommandContext, DEFAULT_STOP_GRACE_MS, StopOutcome, Supervisor};

/// How many command ids (with their replies) are remembered.
pub const REMEMBERED_COMMANDS: usize = 4096;
/// Probe timeout when a `ProbeRequest` leaves it 0.
pub const DEFAULT_PROBE_TIMEOUT_MS: u64 = 30_000;

type Reply = watch::Receiver<Option<AgentMessage>>;

/// A watch or scrape target that is not a unit of this agent; the command is
/// refused (its result's `error` says which).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown unit {unit:?}")]
pub struct UnknownUnit {
    /// The unit the command named.
    pub unit: String,
}

/// Recent command ids, oldest first, with their (eventual) replies.
#[derive(Default)]
struct Recent {
    order: VecDeque<String>,
    replies: HashMap<String, Reply>,
}

pub(crate) struct Dispatcher {
    supervisor: Arc<Supervisor>,
    outbox: Outbox,
    http: reqwest::Client,
    recent: Mutex<Recent>,
    /// The passive engine watch (issue 5).
    watch: crate::watch::Watch,
    /// The GPU reporter's latest reading, for evidence captures (issue 35).
    gpu: watch::Receiver<Arc<Latest>>,
    /// The configured py-spy (`py_spy`); absent: `py-spy` on PATH.
    py_spy: Option<PathBuf>,
    /// The suite steps running, by their command id: what `CutSuiteStep`
    /// cancels (issue 47).
    suite_steps: Arc<Mutex<HashMap<String, CancellationToken>>>,
}

impl Dispatcher {
    pub(crate) fn new(
        supervisor: Arc<Supervisor>,
        outbox: Outbox,
        http: reqwest::Client,
        gpu: watch::Receiver<Arc<Latest>>,
        py_spy: Option<PathBuf>,
    ) -> Self {
        Dispatcher {
            supervisor,
            outbox,
            http,
            recent: Mutex::new(Recent::default()),
            watch: crate::watch::Watch::default(),
            gpu,
            py_spy,
            suite_steps: Arc::default(),
        }
    }

    /// Takes one command received at `received_at`; never waits.
    pub(crate) fn handle(self: &Arc<Self>, command: Command, received_at: Instant) {
        let id = command.command_id.clone();
        if id.is_empty() {
            self.outbox.send(Kind::CommandResult(CommandResult {
                command_id: id,
                ok: false,
                error: "command_id must not be empty".into(),
                ms_since_command: 0,
            }));
            return;
        }
        let reply_tx = {
            let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(reply) = recent.replies.get(&id) {
                info!(command_id = %id, "duplicate command: answering with the original reply");
                let mut reply = reply.clone();
                let outbox = self.outbox.clone();
                tokio::spawn(async move {
                    if let Ok(r) = reply.wait_for(Option::is_some).await
                        && let Some(msg) = r.clone()
                    {
                        outbox.send_message(msg);
                    }
                });
                return;
            }
            let (tx, rx) = watch::channel(None);
            recent.order.push_back(id.clone());
            recent.replies.insert(id.clone(), rx);
            while recent.order.len() > REMEMBERED_COMMANDS {
                if let Some(old) = recent.order.pop_front() {
                    recent.replies.remove(&old);
                }
            }
            tx
        };
        let ctx = CommandContext::new(id, received_at);
        let reply = self.execute(command.action, ctx);
        let outbox = self.outbox.clone();
        tokio::spawn(async move {
            let msg = AgentMessage {
                kind: Some(reply.await),
            };
            reply_tx.send_replace(Some(msg.clone()));
            outbox.send_message(msg);
        });
    }

    /// Queues the action now; the returned future yields the reply.
    fn execute(&self, action: Option<Action>, ctx: CommandContext) -> futures::future::BoxFuture<'static, Kind> {
        let grace = |ms: u64| Duration::from_millis(if ms == 0 { DEFAULT_STOP_GRACE_MS } else { ms });
        match action {
            Some(Action::Start(start)) => {
                info!(command_id = %ctx.id, unit = %start.unit, restart = start.restart, "start");
                let params = ReadinessParams::from_spec(start.readiness.as_ref());
                let done = self.supervisor.start(
                    &start.unit,
                    ctx.clone(),
                    start.restart,
                    grace(start.stop_grace_ms),
                    params,
                );
                Box::pin(async move { command_result(&ctx, done.await.map(drop)) })
            }
            Some(Action::Stop(stop)) => {
                info!(command_id = %ctx.id, unit = %stop.unit, "stop");
                let done = self.supervisor.stop(&stop.unit, ctx.clone(), grace(stop.grace_ms));
                Box::pin(async move {
                    let result = done.await.map(|outcome| {
                        if outcome == StopOutcome::NotRunning {
                            info!(command_id = %ctx.id, "stop: unit was not running");
                        }
                    });
                    command_result(&ctx, result)
                })
            }
            Some(Action::Probe(probe)) => {
                let base_url = self.supervisor.unit_config(&probe.unit).map(|u| u.base_url.clone());
                let http = self.http.clone();
                Box::pin(async move { Kind::ProbeResult(run_probe(&http, base_url, probe, &ctx).await) })
            }
            Some(Action::SuiteStep(step)) => {
                let base_url = self.supervisor.unit_config(&step.unit).map(|u| u.base_url.clone());
                let http = self.http.clone();
                let cut = CancellationToken::new();
                let steps = Arc::clone(&self.suite_steps);
                lock(&steps).insert(ctx.id.clone(), cut.clone());
                Box::pin(async move {
                    // Forgotten however the step ends (a cut that comes later
                    // finds nothing to cut, and says so).
                    let _running = RunningStep {
                        steps: &steps,
                        id: &ctx.id,
                    };
                    let Some(base_url) = base_url else {
                        return Kind::SuiteStepResult(pdwarden_proto::v1::SuiteStepResult {
                            command_id: ctx.id.clone(),
                            unit: step.unit.clone(),
                            step: "unknown_unit".into(),
                            samples: vec![pdwarden_proto::v1::SuiteRequestSample {
                                outcome: ProbeOutcome::Error as i32,
                                error: format!("unknown unit {:?}", step.unit),
                                ..Default::default()
                            }],
                        });
                    };
                    info!(command_id = %ctx.id, unit = %step.unit, "suite step");
                    Kind::SuiteStepResult(crate::suite::run_step(&http, &base_url, &ctx.id, step, &cut).await)
                })
            }
            Some(Action::CutSuiteStep(cut)) => {
                let token = lock(&self.suite_steps).get(&cut.command_id).cloned();
                info!(command_id = %ctx.id, step = %cut.command_id, reason = %cut.reason, running = token.is_some(), "cut suite step");
                let result = match token {
                    Some(token) => {
                        token.cancel();
                        Ok(())
                    }
                    None => Err(format!("no suite step {:?} is running here", cut.command_id)),
                };
                Box::pin(async move {
                    Kind::CommandResult(CommandResult {
                        command_id: ctx.id.clone(),
                        ok: result.is_ok(),
                        error: result.err().unwrap_or_default(),
                        ms_since_command: ctx_ms(&ctx),
                    })
                })
            }
            Some(Action::Watch(spec)) => {
                let result = self.start_watch(&ctx, &spec);
                Box::pin(async move { Kind::CommandResult(result) })
            }
            Some(Action::Scrape(spec)) => {
                let resolved = self.resolve_targets(&spec.targets);
                // The units' pids, for their process trees' CPU time.
                let pids: Vec<(String, u32)> = spec
                    .targets
                    .iter()
                    .filter_map(|t| Some((t.unit.clone(), self.supervisor.unit_pid(&t.unit)?)))
                    .collect();
                let http = self.http.clone();
                let timeout = Duration::from_millis(if spec.scrape_timeout_ms == 0 {
                    crate::watch::DEFAULT_SCRAPE_TIMEOUT_MS
                } else {
                    spec.scrape_timeout_ms
                });
                Box::pin(async move {
                    let id = ctx.id.clone();
                    let result = match resolved {
                        Err(error) => pdwarden_proto::v1::ScrapeResult {
                            command_id: id,
                            samples: Vec::new(),
                            error: format!("scrape: {error}"),
                        },
                        Ok(targets) => {
                            let roots: Vec<u32> = pids.iter().map(|(_, pid)| *pid).collect();
                            let (mut samples, cpu) = tokio::join!(
                                futures::future::join_all(
                                    targets
                                        .iter()
                                        .map(|t| crate::watch::sample_one(&http, t, timeout, &id, 1)),
                                ),
                                tokio::task::spawn_blocking(move || crate::evidence::tree_cpu_seconds(&roots)),
                            );
                            let cpu = cpu.unwrap_or_default();
                            for s in &mut samples {
                                s.process_cpu_seconds = pids
                                    .iter()
                                    .find(|(unit, _)| *unit == s.unit)
                                    .and_then(|(_, pid)| cpu.get(pid).copied());
                            }
                            pdwarden_proto::v1::ScrapeResult {
                                samples,
                                command_id: id,
                                error: String::new(),
                            }
                        }
                    };
                    Kind::ScrapeResult(result)
                })
            }
            Some(Action::UnitConfig(change)) => {
                let result = self.change_unit_config(&ctx, change);
                Box::pin(async move { Kind::UnitConfigResult(result) })
            }
            Some(Action::Preflight(p)) => {
                let mut problems = Vec::new();
                for unit in &p.units {
                    match self.supervisor.preflight(unit) {
                        Some(found) => problems.extend(found),
                        None => problems.push(format!("unknown unit {unit:?}")),
                    }
                }
                if !problems.is_empty() {
                    tracing::warn!(command_id = %ctx.id, ?problems, "preflight found problems");
                }
                let result = CommandResult {
                    command_id: ctx.id.clone(),
                    ok: problems.is_empty(),
                    error: problems.join("; "),
                    ms_since_command: ctx_ms(&ctx),
                };
                Box::pin(async move { Kind::CommandResult(result) })
            }
            Some(Action::Gate(step)) => {
                let base_url = self.supervisor.unit_config(&step.unit).map(|u| u.base_url.clone());
                let running = self.supervisor.running_process(&step.unit);
                let http = self.http.clone();
                Box::pin(async move {
                    Kind::GateResult(crate::gate::run_step(&http, base_url, running, &ctx.id, step).await)
                })
            }
            Some(Action::RouterWorkers(cmd)) => {
                let unit = self
                    .supervisor
                    .unit_config(&cmd.unit)
                    .map(|u| (u.engine_kind(), u.base_url.clone()));
                let http = self.http.clone();
                info!(command_id = %ctx.id, unit = %cmd.unit, op = cmd.op, "router workers");
                Box::pin(async move {
                    Kind::RouterWorkersResult(crate::router_api::answer(&http, unit, &ctx.id, cmd).await)
                })
            }
            Some(Action::CaptureEvidence(cmd)) => {
                info!(command_id = %ctx.id, units = ?cmd.units, deadline_ms = cmd.deadline_ms, "capture evidence");
                let sources = crate::evidence::Sources {
                    supervisor: Arc::clone(&self.supervisor),
                    http: self.http.clone(),
                    gpu: self.gpu.clone(),
                    py_spy: self.py_spy.clone(),
                };
                Box::pin(async move {
                    let result = crate::evidence::capture(sources, ctx.id.clone(), cmd, ctx.received_at).await;
                    info!(command_id = %ctx.id, took_ms = result.took_ms, "evidence captured");
                    Kind::EvidenceResult(result)
                })
            }
            None => Box::pin(async move {
                Kind::CommandResult(CommandResult {
                    command_id: ctx.id.clone(),
                    ok: false,
                    error: "command has no action".into(),
                    ms_since_command: ctx_ms(&ctx),
                })
            }),
        }
    }
}

/// A running suite step's entry in [`Dispatcher::suite_steps`], removed
/// when the step's future ends or is dropped.
struct RunningStep<'a> {
    steps: &'a Mutex<HashMap<String, CancellationToken>>,
    id: &'a str,
}

impl Drop for RunningStep<'_> {
    fn drop(&mut self) {
        lock(self.steps).remove(self.id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Dispatcher {
    /// Resolves watch/scrape targets against this agent's units.
    fn resolve_targets(
        &self,
        wanted: &[pdwarden_proto::v1::WatchTarget],
    ) -> Result<Vec<crate::watch::Target>, UnknownUnit> {
        wanted
            .iter()
            .map(|t| {
                let u = self
                    .supervisor
                    .unit_config(&t.unit)
                    .ok_or_else(|| UnknownUnit { unit: t.unit.clone() })?;
                let base = u.base_url.trim_end_matches('/');
                Ok(crate::watch::Target {
                    unit: t.unit.clone(),
                    // A router's exporter has a port of its own (issue 30).
                    metrics_url: u.metrics_url_for(&t.metrics_path),
                    health_url: format!("{base}{}", u.health_path()),
                })
            })
            .collect()
    }

    /// Replaces the engine watch; refused (and the old watch kept) if a
    /// target is not a unit of this agent.
    fn start_watch(&self, ctx: &CommandContext, spec: &pdwarden_proto::v1::WatchEngines) -> CommandResult {
        let targets = match self.resolve_targets(&spec.targets) {
            Ok(t) => t,
            Err(error) => {
                return CommandResult {
                    command_id: ctx.id.clone(),
                    ok: false,
                    error: format!("watch: {error}"),
                    ms_since_command: ctx_ms(ctx),
                };
            }
        };
        info!(command_id = %ctx.id, units = targets.len(), interval_ms = spec.interval_ms, "watch");
        self.watch
            .replace(ctx.id.clone(), spec, targets, self.http.clone(), self.outbox.clone());
        CommandResult {
            command_id: ctx.id.clone(),
            ok: true,
            error: String::new(),
            ms_since_command: ctx_ms(ctx),
        }
    }
}

impl Dispatcher {
    /// Records a new (or restored) config version of a unit (change gate).
    fn change_unit_config(
        &self,
        ctx: &CommandContext,
        change: pdwarden_proto::v1::UnitConfigChange,
    ) -> pdwarden_proto::v1::UnitConfigResult {
        use pdwarden_proto::v1::unit_config_change::Change;
        let mut result = pdwarden_proto::v1::UnitConfigResult {
            command_id: ctx.id.clone(),
            unit: change.unit.clone(),
            ..Default::default()
        };
        let id = ctx.id.clone();
        let outcome = match change.change {
            Some(Change::Apply(edit)) => {
                let edit = crate::unitconfig::Edit {
                    set_env: edit.set_env.into_iter().collect(),
                    unset_env: edit.unset_env,
                    set_args: edit.set_args.into_iter().collect(),
                };
                self.supervisor
                    .change_config(&change.unit, |v| v.apply(&edit, &id))
                    .map_err(|e| e.to_string())
            }
            Some(Change::RestoreVersion(version)) => self
                .supervisor
                .change_config(&change.unit, |v| v.restore(version))
                .map_err(|e| e.to_string()),
            None => Err("unit config change has no change".to_string()),
        };
        match outcome {
            Ok((previous, version, spec)) => {
                info!(command_id = %ctx.id, unit = %change.unit, previous, version, "unit config version");
                result.ok = true;
                result.previous_version = previous;
                result.version = version;
                result.argv = spec.argv;
                result.env = spec.env.into_iter().collect();
                result.unset_env = spec.unset_env.into_iter().collect();
            }
            Err(e) => result.error = e,
        }
        result
    }
}

fn ctx_ms(ctx: &CommandContext) -> u64 {
    u64::try_from(ctx.received_at.elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn command_result(ctx: &CommandContext, result: Result<(), crate::supervisor::SupervisorError>) -> Kind {
    let (ok, error) = match result {
        Ok(()) => (true, String::new()),
        Err(e) => (false, error_chain(&e)),
    };
    Kind::CommandResult(CommandResult {
        command_id: ctx.id.clone(),
        ok,
        error,
        ms_since_command: ctx_ms(ctx),
    })
}

async fn run_probe(
    http: &reqwest::Client,
    base_url: Option<String>,
    probe: ProbeRequest,
    ctx: &CommandContext,
) -> ProbeResult {
    let mut result = ProbeResult {
        command_id: ctx.id.clone(),
        unit: probe.unit.clone(),
        seq: probe.seq,
        outcome: ProbeOutcome::Error as i32,
        ..Default::default()
    };
    let Some(base_url) = base_url else {
        result.error = format!("unknown unit {:?}", probe.unit);
        return result;
    };
    let Some(mut chat) = probe.chat else {
        result.error = "probe request has no chat spec".into();
        return result;
    };
    if chat.max_tokens == 0 {
        chat.max_tokens = DEFAULT_CHECK_MAX_TOKENS;
    }
    let timeout = Duration::from_millis(if probe.timeout_ms == 0 {
        DEFAULT_PROBE_TIMEOUT_MS
    } else {
        probe.timeout_ms
    });
    let r = match &probe.pd_path {
        Some(path) => {
            let prefill = if path.prefill_url.is_empty() {
                base_url.as_str()
            } else {
                path.prefill_url.as_str()
            };
            let (r, side) = crate::checks::pd_path_probe_sided(http, prefill, path, &chat, timeout).await;
            result.unreachable = side.to_string();
            r
        }
        None => chat_probe(http, &base_url, &chat, timeout).await,
    };
    info!(
        command_id = %ctx.id, unit = %probe.unit, seq = probe.seq, outcome = ?r.outcome,
        latency_ms = r.latency.as_millis() as u64, tokens = r.tokens,
        answer_tokens = r.answer.len(), answer_logprobs_missing = r.answer_logprobs_missing, "probe"
    );
    result.outcome = r.outcome as i32;
    result.latency_ms = u64::try_from(r.latency.as_millis()).unwrap_or(u64::MAX);
    result.tokens = r.tokens;
    result.error = r.error;
    result.http_status = i32::from(r.http_status);
    result.request_id = r.request_id;
    result.tokens_asked = r.tokens_asked;
    result.finish_reason = r.finish_reason;
    result.answer = r.answer;
    result.answer_logprobs_missing = r.answer_logprobs_missing;
    result
}
