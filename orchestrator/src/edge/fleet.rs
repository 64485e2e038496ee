//! The orchestrator's view of its agents: who is connected, what they say is
//! true on their hosts, and the delivery of commands and their reports.
//!
//! Agents dial in (DESIGN.md 1) and own the facts (DESIGN.md 2); this module
//! only records them. Reports that belong to a command are routed to whoever
//! sent it through a per-command channel rather than a broadcast, so a busy
//! operation never sees another operation's traffic and nothing is dropped
//! for lag. A disconnect is delivered to every command still waiting on that
//! agent, so no operation waits forever on a host that went away.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use pdwarden_model::status::{AgentState, AgentStatus, UnitStatus};
use pdwarden_proto::v1::{
    AgentMessage, Command, EngineSample, OrchestratorMessage, Phase, RegisterAck, UnitInfo,
    agent_link_server::AgentLink, agent_message, orchestrator_message,
};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

pub use crate::ops::port::{AGENT_SLACK, AgentReport, AskError, SendError, phase_name, role_name};

struct AgentSession {
    /// Distinguishes this connection from a later one of the same host.
    session: u64,
    instance_id: String,
    version: String,
    tx: Option<mpsc::Sender<Result<OrchestratorMessage, Status>>>,
    units: BTreeMap<String, UnitInfo>,
    /// When anything last arrived from it (heartbeats every few seconds).
    last_seen: tokio::time::Instant,
}

/// An attached agent silent for this long is shown as `unknown`: its facts
/// may be stale. It is never a reason to restart anything on its own.
pub const AGENT_UNKNOWN_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Default)]
struct FleetState {
    agents: BTreeMap<String, AgentSession>,
    waiters: HashMap<String, (String, mpsc::UnboundedSender<AgentReport>)>,
    /// Engine samples of a `WatchEngines` command, by its id (issue 5).
    sample_waiters: HashMap<String, (String, mpsc::UnboundedSender<EngineSample>)>,
    next_session: u64,
}

/// The registry of agents, shared by the gRPC services and the operations.
#[derive(Clone, Default)]
pub struct Fleet {
    state: Arc<Mutex<FleetState>>,
    orchestrator_instance_id: Arc<String>,
    /// The latest GPU and host report of each host.
    pub hosts: crate::edge::hoststate::HostStates,
    /// Whether this orchestrator commands agents, and its fencing token
    /// (stamped on every command here, the one place commands leave).
    pub leadership: crate::edge::leadership::Leadership,
}

impl Fleet {
    pub fn new() -> Self {
        Self {
            state: Arc::default(),
            orchestrator_instance_id: Arc::new(uuid::Uuid::new_v4().to_string()),
            hosts: crate::edge::hoststate::HostStates::default(),
            leadership: crate::edge::leadership::Leadership::sole(),
        }
    }

    /// A fleet that commands agents only while `leadership` says so.
    pub fn with_leadership(leadership: crate::edge::leadership::Leadership) -> Self {
        Self {
            leadership,
            ..Self::new()
        }
    }

    /// Ends every agent's stream (this orchestrator stopped leading): each
    /// agent re-attaches, and a follower points it at the new leader.
    pub fn release_agents(&self) {
        let mut st = self.lock();
        for a in st.agents.values_mut() {
            a.tx = None;
        }
        st.waiters.clear();
        st.sample_waiters.clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FleetState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends a command to the agent of `host` and returns the channel its
    /// reports arrive on. The unit must be one the agent registered.
    pub async fn send(
        &self,
        host: &str,
        unit: &str,
        mut command: Command,
    ) -> Result<mpsc::UnboundedReceiver<AgentReport>, SendError> {
        let (tx, rx) = mpsc::unbounded_channel();
        if !self.leadership.leads() {
            // A follower (or a leader that just lost its lease) sends nothing.
            return Err(SendError::AgentNotConnected { host: host.into() });
        }
        command.fencing_token = self.leadership.token();
        let agent_tx = {
            let mut st = self.lock();
            let agent = st
                .agents
                .get(host)
                .filter(|a| a.tx.is_some())
                .ok_or_else(|| SendError::AgentNotConnected { host: host.into() })?;
            if !agent.units.contains_key(unit) {
                return Err(SendError::UnknownUnit {
                    host: host.into(),
                    unit: unit.into(),
                });
            }
            let agent_tx = agent.tx.clone().expect("filtered on is_some");
            st.waiters
                .insert(command.command_id.clone(), (host.to_string(), tx.clone()));
            agent_tx
        };
        let id = command.command_id.clone();
        let msg = OrchestratorMessage {
            kind: Some(orchestrator_message::Kind::Command(command)),
        };
        if agent_tx.send(Ok(msg)).await.is_err() {
            self.lock().waiters.remove(&id);
            return Err(SendError::AgentNotConnected { host: host.into() });
        }
        Ok(rx)
    }

    /// Stops routing reports for a command (its operation no longer listens).
    pub fn forget(&self, command_id: &str) {
        let mut st = self.lock();
        st.waiters.remove(command_id);
        st.sample_waiters.remove(command_id);
    }

    /// Routes the `EngineSample`s of watch command `command_id` on `host` to
    /// `tx`; call before sending the command, [`Fleet::forget`] to stop.
    pub fn route_engine_samples(&self, host: &str, command_id: &str, tx: mpsc::UnboundedSender<EngineSample>) {
        self.lock()
            .sample_waiters
            .insert(command_id.to_string(), (host.to_string(), tx));
    }

    pub fn is_connected(&self, host: &str) -> bool {
        self.lock().agents.get(host).is_some_and(|a| a.tx.is_some())
    }

    pub fn unit(&self, host: &str, unit: &str) -> Option<UnitInfo> {
        self.lock().agents.get(host).and_then(|a| a.units.get(unit).cloned())
    }

    /// What `status` shows of each agent, or only of the agents of `hosts`
    /// when given. The fleet lock is held only to copy the sessions' small
    /// facts; the host reports are shared, not rebuilt.
    pub fn status(&self, hosts: Option<&BTreeSet<String>>) -> Vec<AgentStatus> {
        let mut agents: Vec<AgentStatus> = {
            let st = self.lock();
            // Asked-for hosts are looked up by key, so `status --host` costs
            // the same in a fleet of ten or ten thousand.
            let picked: Box<dyn Iterator<Item = (&String, &AgentSession)>> = match hosts {
                None => Box::new(st.agents.iter()),
                Some(set) => Box::new(set.iter().filter_map(|h| st.agents.get_key_value(h))),
            };
            picked
                .map(|(host, a)| AgentStatus {
                    host: host.clone(),
                    connected: a.tx.is_some(),
                    state: match (a.tx.is_some(), a.last_seen.elapsed() > AGENT_UNKNOWN_AFTER) {
                        (false, _) => AgentState::Disconnected,
                        (true, true) => AgentState::Unknown,
                        (true, false) => AgentState::Connected,
                    },
                    silent_ms: a.last_seen.elapsed().as_millis() as u64,
                    agent_instance_id: a.instance_id.clone(),
                    agent_version: a.version.clone(),
                    units: a
                        .units
                        .values()
                        .map(|u| UnitStatus {
                            name: u.name.clone(),
                            role: role_name(u.role).into(),
                            phase: phase_name(u.phase).into(),
                            pid: (u.pid != 0).then_some(u.pid),
                            base_url: u.base_url.clone(),
                        })
                        .collect(),
                    host_report: None,
                })
                .collect()
        };
        match hosts {
            Some(_) => agents
                .iter_mut()
                .for_each(|a| a.host_report = self.hosts.report(&a.host)),
            None => {
                let mut reports = self.hosts.all();
                agents.iter_mut().for_each(|a| a.host_report = reports.remove(&a.host));
            }
        }
        agents
    }

    /// Whether an agent of this host has ever attached (connected or not).
    pub fn knows_host(&self, host: &str) -> bool {
        self.lock().agents.contains_key(host)
    }

    fn deliver(&self, host: &str, command_id: &str, report: AgentReport) {
        if command_id.is_empty() {
            return;
        }
        let st = self.lock();
        if let Some((owner, tx)) = st.waiters.get(command_id)
            && owner == host
        {
            let _ = tx.send(report);
        }
    }

    /// Feeds one agent message as if `host`'s stream had carried it (the
    /// host is registered first when unknown). For the fuzz targets: every
    /// message the orchestrator accepts must be handled without a panic.
    #[doc(hidden)]
    pub fn ingest_for_fuzzing(&self, host: &str, msg: AgentMessage) {
        {
            let mut st = self.lock();
            st.next_session += 1;
            let session = st.next_session;
            st.agents.entry(host.to_string()).or_insert_with(|| AgentSession {
                session,
                instance_id: "fuzz".into(),
                version: "fuzz".into(),
                tx: None,
                units: BTreeMap::new(),
                last_seen: tokio::time::Instant::now(),
            });
        }
        self.on_message(host, msg);
        let _ = self.status(None);
    }

    fn on_message(&self, host: &str, msg: AgentMessage) {
        if let Some(a) = self.lock().agents.get_mut(host) {
            a.last_seen = tokio::time::Instant::now();
        }
        match msg.kind {
            Some(agent_message::Kind::UnitEvent(ev)) => {
                {
                    let mut st = self.lock();
                    if let Some(u) = st.agents.get_mut(host).and_then(|a| a.units.get_mut(&ev.unit)) {
                        u.phase = ev.phase;
                        // A crash is nobody's event: the instance still
                        // belongs to the start that spawned it.
                        if !ev.command_id.is_empty() {
                            u.command_id = ev.command_id.clone();
                            u.command_in_progress =
                                !matches!(Phase::try_from(ev.phase), Ok(Phase::Generating | Phase::NotReady));
                        }
                        match Phase::try_from(ev.phase) {
                            Ok(Phase::Exited) => u.exit_detail = ev.detail.clone(),
                            Ok(Phase::Spawned) => u.exit_detail.clear(),
                            _ => {}
                        }
                        u.pid = if matches!(Phase::try_from(ev.phase), Ok(Phase::Exited | Phase::Stopped)) {
                            0
                        } else if ev.pid != 0 {
                            ev.pid
                        } else {
                            u.pid
                        };
                        // The process's start, whoever started it (issue 46).
                        if u.pid == 0 {
                            u.process_started_unix_ms = 0;
                        } else if ev.process_started_unix_ms != 0 {
                            u.process_started_unix_ms = ev.process_started_unix_ms;
                        }
                    }
                }
                let id = ev.command_id.clone();
                self.deliver(host, &id, AgentReport::Unit(ev));
            }
            Some(agent_message::Kind::CommandResult(r)) => {
                let id = r.command_id.clone();
                self.deliver(host, &id, AgentReport::Result(r));
            }
            Some(agent_message::Kind::SuiteStepResult(r)) => {
                let id = r.command_id.clone();
                self.deliver(host, &id, AgentReport::Suite(r));
            }
            Some(agent_message::Kind::ProbeResult(r)) => {
                let id = r.command_id.clone();
                self.deliver(host, &id, AgentReport::Probe(r));
            }
            Some(agent_message::Kind::UnitConfigResult(r)) => {
                let id = r.command_id.clone();
                self.deliver(host, &id, AgentReport::UnitConfig(r));
            }
            Some(agent_message::Kind::GateResult(r)) => {
                let id = r.command_id.clone();
                self.deliver(host, &id, AgentReport::Gate(r));
            }
            Some(agent_message::Kind::ScrapeResult(r)) => {
                let id = r.command_id.clone();
                self.deliver(host, &id, AgentReport::Scrape(r));
            }
            Some(agent_message::Kind::RouterWorkersResult(r)) => {
                let id = r.command_id.clone();
                self.deliver(host, &id, AgentReport::RouterWorkers(r));
            }
            Some(agent_message::Kind::EvidenceResult(r)) => {
                let id = r.command_id.clone();
                self.deliver(host, &id, AgentReport::Evidence(r));
            }
            Some(agent_message::Kind::Register(reg)) => {
                // A re-registration on a live stream refreshes the facts.
                let mut st = self.lock();
                if let Some(a) = st.agents.get_mut(host) {
                    a.units = reg.units.into_iter().map(|u| (u.name.clone(), u)).collect();
                }
            }
            Some(agent_message::Kind::HostSnapshot(s)) => {
                self.hosts
                    .record_snapshot(host, s, crate::edge::hoststate::now_unix_ms());
            }
            Some(agent_message::Kind::GpuEvent(e)) => {
                self.hosts.record_event(host, e, crate::edge::hoststate::now_unix_ms());
            }
            Some(agent_message::Kind::EngineSample(sample)) => {
                let st = self.lock();
                if let Some((owner, tx)) = st.sample_waiters.get(&sample.command_id)
                    && owner == host
                {
                    let _ = tx.send(sample);
                }
            }
            Some(agent_message::Kind::Heartbeat(_)) | None => {}
        }
    }

    fn on_disconnect(&self, host: &str, session: u64) {
        let mut st = self.lock();
        let current = st.agents.get(host).is_some_and(|a| a.session == session);
        if !current {
            return;
        }
        if let Some(a) = st.agents.get_mut(host) {
            a.tx = None;
        }
        st.waiters.retain(|_, (owner, tx)| {
            if owner == host {
                let _ = tx.send(AgentReport::Disconnected);
                false
            } else {
                true
            }
        });
        tracing::warn!(host, "agent disconnected");
    }
}

/// The `AgentLink` gRPC service: one bidirectional stream per agent.
#[derive(Clone)]
pub struct AgentLinkService {
    pub fleet: Fleet,
    /// Whether an agent must prove its host with a certificate (issue 8).
    pub agent_auth: crate::edge::tls::AgentAuth,
}

#[tonic::async_trait]
impl AgentLink for AgentLinkService {
    type AttachStream = ReceiverStream<Result<OrchestratorMessage, Status>>;

    async fn attach(&self, request: Request<Streaming<AgentMessage>>) -> Result<Response<Self::AttachStream>, Status> {
        let peer = request
            .remote_addr()
            .map_or_else(|| "unknown".to_string(), |a| a.to_string());
        let certified = crate::edge::tls::check_agent(self.agent_auth, &request)
            .inspect_err(|e| tracing::warn!(%peer, reason = %e.message(), "agent refused"))?;
        let mut inbound = request.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("stream ended before Register"))?;
        let Some(agent_message::Kind::Register(reg)) = first.kind else {
            return Err(Status::invalid_argument(
                "the first message on AgentLink.Attach must be Register",
            ));
        };
        if reg.host.trim().is_empty() {
            return Err(Status::invalid_argument("Register.host must not be empty"));
        }
        crate::edge::tls::check_register(certified.as_deref(), &reg.host)
            .inspect_err(|e| tracing::warn!(%peer, reason = %e.message(), "agent refused"))?;
        let (tx, rx) = mpsc::channel(1024);
        if let pdwarden_model::status::Role::Follower { leader_url, why } = self.fleet.leadership.role() {
            // Not leading: tell the agent where the leader is and end the
            // stream (the agent attaches there; DESIGN.md 15). An agent that
            // just lost the leader this one would name is held until the
            // next leader is known (`Leadership::leader_for`).
            tracing::info!(host = %reg.host, leader = ?leader_url, lost = %reg.lost_leader_url, %why, "agent attached to a follower; pointing it at the leader");
            let (leadership, instance) = (
                self.fleet.leadership.clone(),
                self.fleet.orchestrator_instance_id.to_string(),
            );
            tokio::spawn(async move {
                let leader_url = leadership.leader_for(&reg.lost_leader_url).await;
                let ack = OrchestratorMessage {
                    kind: Some(orchestrator_message::Kind::RegisterAck(RegisterAck {
                        orchestrator_instance_id: instance,
                        follower: true,
                        leader_url,
                        fencing_token: 0,
                    })),
                };
                let _ = tx.send(Ok(ack)).await;
                // Keep the agent's side open until it has read the ack.
                drop(inbound);
            });
            return Ok(Response::new(ReceiverStream::new(rx)));
        }
        let host = reg.host.clone();
        let session = {
            let mut st = self.fleet.lock();
            if let Some(old) = st.agents.get(&host)
                && old.tx.is_some()
            {
                // Another live instance for the same host (the same
                // certificate, another state dir): two agents would each
                // replace the other's stream several times a second and
                // fight over the host's units (issue 16, finding 4). The
                // first keeps the host until it goes quiet.
                let heard = old.last_seen.elapsed();
                if old.instance_id != reg.agent_instance_id && heard < AGENT_UNKNOWN_AFTER {
                    let said = format!(
                        "host {host} already has a live agent (instance {}, heard {} ms ago); refusing a second instance ({}): one agent per host — stop one of them",
                        old.instance_id,
                        heard.as_millis(),
                        reg.agent_instance_id
                    );
                    tracing::warn!(host, %peer, live = %old.instance_id, refused = %reg.agent_instance_id, "second agent for one host refused");
                    return Err(Status::already_exists(said));
                }
                tracing::warn!(host, "agent re-attached; replacing its previous stream");
            }
            st.next_session += 1;
            let session = st.next_session;
            st.agents.insert(
                host.clone(),
                AgentSession {
                    session,
                    instance_id: reg.agent_instance_id.clone(),
                    version: reg.agent_version.clone(),
                    tx: Some(tx.clone()),
                    units: reg.units.into_iter().map(|u| (u.name.clone(), u)).collect(),
                    last_seen: tokio::time::Instant::now(),
                },
            );
            session
        };
        tracing::info!(host, instance = %reg.agent_instance_id, "agent attached");
        let ack = OrchestratorMessage {
            kind: Some(orchestrator_message::Kind::RegisterAck(RegisterAck {
                orchestrator_instance_id: self.fleet.orchestrator_instance_id.to_string(),
                follower: false,
                leader_url: String::new(),
                fencing_token: self.fleet.leadership.token(),
            })),
        };
        let _ = tx.send(Ok(ack)).await;
        let fleet = self.fleet.clone();
        tokio::spawn(async move {
            loop {
                match inbound.message().await {
                    Ok(Some(msg)) => fleet.on_message(&host, msg),
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(host, error = %e, "agent stream error");
                        break;
                    }
                }
            }
            fleet.on_disconnect(&host, session);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// The runtime's agent port over the agents' `AgentLink` streams.
impl crate::ops::port::AgentPort for Fleet {
    fn send<'a>(
        &'a self,
        host: &'a str,
        unit: &'a str,
        command: Command,
    ) -> crate::ops::port::PortFuture<'a, Result<crate::ops::port::Reports, SendError>> {
        Box::pin(Fleet::send(self, host, unit, command))
    }

    fn forget(&self, command_id: &str) {
        Fleet::forget(self, command_id);
    }

    fn unit(&self, host: &str, unit: &str) -> Option<UnitInfo> {
        Fleet::unit(self, host, unit)
    }

    fn is_connected(&self, host: &str) -> bool {
        Fleet::is_connected(self, host)
    }

    fn route_engine_samples(&self, host: &str, command_id: &str, tx: mpsc::UnboundedSender<EngineSample>) {
        Fleet::route_engine_samples(self, host, command_id, tx);
    }

    fn unit_gpu_utilization(&self, host: &str, unit: &str, now_unix_ms: u64, max_age_ms: u64) -> Option<f64> {
        self.hosts.unit_gpu_utilization(host, unit, now_unix_ms, max_age_ms)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use pdwarden_proto::v1::{CommandResult, ProbeResult};

    use super::*;

    /// An attached agent with one unit, its command stream handed to the test.
    fn attached(fleet: &Fleet, host: &str) -> (u64, mpsc::Receiver<Result<OrchestratorMessage, Status>>) {
        let (tx, rx) = mpsc::channel(16);
        let mut st = fleet.lock();
        st.next_session += 1;
        let session = st.next_session;
        st.agents.insert(
            host.into(),
            AgentSession {
                session,
                instance_id: "test".into(),
                version: "test".into(),
                tx: Some(tx),
                units: BTreeMap::from([(
                    "router-0".to_string(),
                    UnitInfo {
                        name: "router-0".into(),
                        ..Default::default()
                    },
                )]),
                last_seen: tokio::time::Instant::now(),
            },
        );
        (session, rx)
    }

    fn command(id: &str) -> Command {
        Command {
            fencing_token: 0,
            command_id: id.into(),
            action: None,
        }
    }

    /// The fleet as the runtime sees it.
    fn port(f: &Fleet) -> &dyn crate::ops::port::AgentPort {
        f
    }

    fn probe_of(r: AgentReport) -> Option<ProbeResult> {
        match r {
            AgentReport::Probe(p) => Some(p),
            _ => None,
        }
    }

    /// The answer `pick` wants is returned; progress before it is skipped;
    /// the route is forgotten afterwards.
    #[tokio::test(start_paused = true)]
    async fn ask_returns_the_picked_answer_and_forgets_the_route() {
        let fleet = Fleet::new();
        let (_, mut agent) = attached(&fleet, "h");
        let f = fleet.clone();
        let answer = tokio::spawn(async move {
            port(&f)
                .ask("h", "router-0", command("c1"), Duration::from_secs(5), probe_of)
                .await
        });
        let sent = agent.recv().await.unwrap().unwrap();
        assert!(matches!(sent.kind, Some(orchestrator_message::Kind::Command(c)) if c.command_id == "c1"));
        fleet.on_message(
            "h",
            AgentMessage {
                kind: Some(agent_message::Kind::CommandResult(CommandResult {
                    command_id: "c1".into(),
                    ok: true,
                    ..Default::default()
                })),
            },
        );
        fleet.on_message(
            "h",
            AgentMessage {
                kind: Some(agent_message::Kind::ProbeResult(ProbeResult {
                    command_id: "c1".into(),
                    tokens: 7,
                    ..Default::default()
                })),
            },
        );
        let r = answer.await.unwrap().unwrap();
        assert_eq!(r.tokens, 7);
        assert!(fleet.lock().waiters.is_empty(), "route forgotten");
    }

    /// DESIGN.md 15: every command leaves stamped with the leader's fencing
    /// token (whatever the operation put there); a follower — or a leader
    /// that stopped leading — sends nothing; stepping down ends the agents'
    /// streams so they find the new leader.
    #[tokio::test(start_paused = true)]
    async fn commands_carry_the_leaders_token_and_a_follower_sends_none() {
        use crate::edge::leadership::Leadership;
        use pdwarden_model::status::Role;
        let leadership = Leadership::candidate("http://a:1", Duration::from_secs(1));
        leadership.set(Role::Leader {
            token: 41,
            since_unix_ms: 0,
        });
        let fleet = Fleet::with_leadership(leadership.clone());
        let (_, mut agent) = attached(&fleet, "h");
        let mut c = command("c1");
        c.fencing_token = 7;
        fleet.send("h", "router-0", c).await.unwrap();
        match agent.recv().await.unwrap().unwrap().kind {
            Some(orchestrator_message::Kind::Command(c)) => assert_eq!(c.fencing_token, 41),
            other => panic!("expected a command, got {other:?}"),
        }
        leadership.set(Role::Follower {
            leader_url: Some("http://b:1".into()),
            why: "b leads".into(),
        });
        assert!(matches!(
            fleet.send("h", "router-0", command("c2")).await,
            Err(SendError::AgentNotConnected { .. })
        ));
        assert!(agent.try_recv().is_err(), "nothing sent by a follower");
        fleet.release_agents();
        assert!(!fleet.is_connected("h"));
        assert!(agent.recv().await.is_none(), "the agent's stream ended");
    }

    /// No answer: given up at the agent-side timeout plus the one slack.
    #[tokio::test(start_paused = true)]
    async fn ask_gives_up_at_timeout_plus_slack() {
        let fleet = Fleet::new();
        let (_, _agent) = attached(&fleet, "h");
        let started = tokio::time::Instant::now();
        let e = port(&fleet)
            .ask("h", "router-0", command("c2"), Duration::from_secs(5), probe_of)
            .await
            .unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_secs(5) + AGENT_SLACK);
        assert_eq!(e.to_string(), "no answer from agent h within 15000 ms");
        assert!(fleet.lock().waiters.is_empty());
    }

    /// The agent's link drops: disconnected, at once; an unknown unit is a
    /// send error.
    #[tokio::test(start_paused = true)]
    async fn ask_reports_a_disconnect_and_an_unknown_unit() {
        let fleet = Fleet::new();
        let (session, _agent) = attached(&fleet, "h");
        let f = fleet.clone();
        let answer = tokio::spawn(async move {
            port(&f)
                .ask("h", "router-0", command("c3"), Duration::from_secs(60), probe_of)
                .await
        });
        tokio::task::yield_now().await;
        while fleet.lock().waiters.is_empty() {
            tokio::task::yield_now().await;
        }
        fleet.on_disconnect("h", session);
        let e = answer.await.unwrap().unwrap_err();
        assert!(matches!(e, AskError::Disconnected { .. }), "{e}");
        let (_, _agent) = attached(&fleet, "h");
        let e = port(&fleet)
            .ask("h", "decode-9", command("c4"), Duration::from_secs(1), probe_of)
            .await
            .unwrap_err();
        assert!(matches!(e, AskError::Send(SendError::UnknownUnit { .. })), "{e}");
    }
}
