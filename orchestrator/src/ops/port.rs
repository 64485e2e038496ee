//! The agent port: the only way the operation runtime reaches agents.
//!
//! A workflow sends a command to a unit and receives that command's reports;
//! it reads what the agents registered about their units and hosts. That is
//! all the co-restart, the gate and the watch need to know of the agents, so
//! the runtime is written against this trait and not against the gRPC
//! stream: [`crate::edge::fleet::Fleet`] implements it over the agents'
//! `AgentLink` streams, and the drivers' unit tests implement it with an
//! in-memory fake agent (`ops::fake_agent`) at paused tokio time.
//!
//! [`ask`](dyn AgentPort::ask) is the one "send and await": one deadline
//! policy (the agent-side timeout plus [`AGENT_SLACK`]), the command's route
//! always forgotten at the end.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use pdwarden_proto::v1::{Command, CommandResult, EngineSample, Phase, ProbeResult, Role, UnitEvent, UnitInfo};
use tokio::sync::mpsc;

/// How long past an agent-side timeout the orchestrator waits for the
/// agent's answer before giving up on it (the link, the agent's own
/// scheduling). One value for every command: it was written five times.
pub const AGENT_SLACK: Duration = Duration::from_secs(10);

/// Something an agent said about a command this side sent.
#[derive(Debug, Clone)]
pub enum AgentReport {
    Unit(UnitEvent),
    Result(CommandResult),
    Probe(ProbeResult),
    /// The samples of one verification-suite step.
    Suite(pdwarden_proto::v1::SuiteStepResult),
    /// One scrape of engines (`ScrapeEngines`).
    Scrape(pdwarden_proto::v1::ScrapeResult),
    /// A unit config change's answer (change gate).
    UnitConfig(pdwarden_proto::v1::UnitConfigResult),
    /// A change gate measurement (process inspection, benchmark cell).
    Gate(pdwarden_proto::v1::GateAgentResult),
    /// A router worker list's answer (drain before restart).
    RouterWorkers(pdwarden_proto::v1::RouterWorkersResult),
    /// What a wedged pair's units looked like (issue 35).
    Evidence(pdwarden_proto::v1::EvidenceResult),
    /// The agent's stream ended; no more reports will come for the command.
    Disconnected,
}

/// Why a command could not be sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("agent {host} is not connected")]
    AgentNotConnected { host: String },
    #[error("agent {host} has no unit named {unit}")]
    UnknownUnit { host: String, unit: String },
}

/// Why a command sent with [`ask`](dyn AgentPort::ask) got no answer.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    #[error(transparent)]
    Send(#[from] SendError),
    #[error("agent {host} disconnected")]
    Disconnected { host: String },
    #[error("no answer from agent {host} within {waited_ms} ms")]
    NoAnswer { host: String, waited_ms: u64 },
}

/// The reports of one command, in the order the agent sent them.
pub type Reports = mpsc::UnboundedReceiver<AgentReport>;

/// A boxed future (the trait is used as `dyn AgentPort`).
pub type PortFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the runtime can do with agents.
pub trait AgentPort: Send + Sync {
    /// Sends `command` to `unit`'s agent on `host` and returns the channel
    /// its reports arrive on (a disconnect arrives as
    /// [`AgentReport::Disconnected`], or as the channel closing). The unit
    /// must be one the agent registered.
    fn send<'a>(&'a self, host: &'a str, unit: &'a str, command: Command)
    -> PortFuture<'a, Result<Reports, SendError>>;

    /// Stops routing reports for a command (its operation no longer listens).
    fn forget(&self, command_id: &str);

    /// What `host`'s agent registered about `unit`: its phase, pid, and the
    /// start command its state belongs to (and whether that is under way).
    fn unit(&self, host: &str, unit: &str) -> Option<UnitInfo>;

    fn is_connected(&self, host: &str) -> bool;

    /// Routes the `EngineSample`s of watch command `command_id` on `host` to
    /// `tx`; call before sending the command, [`forget`](Self::forget) to stop.
    fn route_engine_samples(&self, host: &str, command_id: &str, tx: mpsc::UnboundedSender<EngineSample>);

    /// The busiest GPU holding one of `unit`'s processes in `host`'s latest
    /// report, if that report is at most `max_age_ms` old at `now_unix_ms`.
    fn unit_gpu_utilization(&self, host: &str, unit: &str, now_unix_ms: u64, max_age_ms: u64) -> Option<f64>;
}

impl<'p> dyn AgentPort + 'p {
    /// Sends `command` to `unit`'s agent and awaits the first report `pick`
    /// accepts (`Some`), skipping the others (progress events), until the
    /// agent-side `timeout` plus [`AGENT_SLACK`]. The one "send and await"
    /// of every workflow: one deadline policy, the command's route always
    /// forgotten at the end.
    pub async fn ask<T>(
        &self,
        host: &str,
        unit: &str,
        command: Command,
        timeout: Duration,
        mut pick: impl FnMut(AgentReport) -> Option<T>,
    ) -> Result<T, AskError> {
        let started = tokio::time::Instant::now();
        let deadline = far_deadline(started, timeout + AGENT_SLACK);
        let id = command.command_id.clone();
        let mut rx = self.send(host, unit, command).await?;
        // Forgotten however the wait ends: an answer, a timeout, or the
        // caller dropping it (a suite step cut, a greedy request whose
        // engines were proven stuck: issue 47).
        let _forget = ForgetOnDrop { port: self, id: &id };
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(AgentReport::Disconnected) | None) => break Err(AskError::Disconnected { host: host.into() }),
                Ok(Some(report)) => {
                    if let Some(t) = pick(report) {
                        break Ok(t);
                    }
                }
                Err(_) => {
                    break Err(AskError::NoAnswer {
                        host: host.into(),
                        waited_ms: started.elapsed().as_millis() as u64,
                    });
                }
            }
        }
    }
}

/// Forgets a command's route when dropped.
struct ForgetOnDrop<'a, 'p> {
    port: &'a (dyn AgentPort + 'p),
    id: &'a str,
}

impl Drop for ForgetOnDrop<'_, '_> {
    fn drop(&mut self) {
        self.port.forget(self.id);
    }
}

/// A unit's role as the agents name it.
pub fn role_name(role: i32) -> &'static str {
    match Role::try_from(role).unwrap_or(Role::Unspecified) {
        Role::Prefill => "prefill",
        Role::Decode => "decode",
        Role::Router => "router",
        Role::Unspecified => "unknown",
    }
}

/// A readiness phase as the agents name it.
pub fn phase_name(phase: i32) -> &'static str {
    match Phase::try_from(phase).unwrap_or(Phase::Unspecified) {
        Phase::Unspecified => "unknown",
        Phase::Stopped => "stopped",
        Phase::Spawned => "spawned",
        Phase::Refused => "refused",
        Phase::Http503 => "http_503",
        Phase::Healthy => "healthy",
        Phase::Generating => "generating",
        Phase::Exited => "exited",
        Phase::NotReady => "not_ready",
        Phase::Stopping => "stopping",
    }
}

/// `from + wait`, or a deadline a century away where that overflows the
/// clock (a duration past every bound is "no deadline", never a panic).
pub fn far_deadline(from: tokio::time::Instant, wait: Duration) -> tokio::time::Instant {
    from.checked_add(wait)
        .unwrap_or_else(|| from + Duration::from_secs(100 * 365 * 86_400))
}
