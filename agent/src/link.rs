//! The agent's one connection to the orchestrator (DESIGN.md 1: agents dial
//! out): an `AgentLink.Attach` stream carrying registration, events, command
//! results and probe results up, and commands down.
//!
//! The link is the only part of the agent that knows about the network.
//! When the stream breaks it reconnects with exponential backoff
//! (100 ms → 5 s, jittered, reset once an orchestrator has taken the agent
//! as its leader on a new stream) and re-registers with the current facts.
//! Supervision never waits for the link.
//!
//! Several orchestrators (issue 19, DESIGN.md 15) elect one leader on etcd;
//! only the leader commands agents. The link therefore:
//! - dials the configured orchestrators in turn, starting with the last one
//!   that took the agent ([`Rotation`], a pure step function handed each
//!   attempt's [`Outcome`]), so losing one orchestrator never cuts the host off;
//! - leaves a follower (its `RegisterAck` says `follower`) and dials the
//!   leader it names at once, listed or not: waiting would only delay the
//!   leader's view of this host. A redirected dial may not redirect again
//!   before a backoff, so two followers with stale views naming each other
//!   during an election cannot make the agent spin. After losing a leader
//!   it says which (`Register.lost_leader_url`): a follower that would name
//!   that one (dead, its lease not lapsed yet) holds the stream until the
//!   next leader is elected, so the agent reaches it at once instead of
//!   bouncing on a growing backoff;
//! - fences ([`Fence`]): it keeps the highest fencing token it has seen and
//!   refuses a leader acking, or a command carrying, a lower one. A deposed
//!   leader that has not noticed its loss (a long GC pause, a partition from
//!   etcd) would otherwise keep restarting engines under the new leader's
//!   feet. The floor is persisted in `state_dir/fencing_token` before any
//!   command of the session is taken, so a restarted agent still refuses it.
//!   A refused command is answered with its usual failed reply, so that
//!   nobody waits on it, and is never shown to the dispatcher: a new leader
//!   resuming the operation sends the same command id and must get it
//!   executed, not the refusal replayed (DESIGN.md 14). Token 0 (a single
//!   orchestrator on SQLite) passes every check, as before fencing.
//!
//! Messages produced while disconnected are dropped, not replayed: the
//! `Register` sent on reconnect carries every unit's current phase and pid,
//! and replaying older events after it would make the orchestrator's view go
//! backwards. A message in flight when the stream breaks may be lost too, as
//! may one sent to a follower before its ack arrives.
//! Command results are safe to lose: the orchestrator resends the command
//! with the same id and gets the original reply (see `commands`). Buffering
//! events for replay is left for later.

use std::future::Future;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use pdwarden_proto::v1::{
    AgentMessage, Command, CommandResult, GateAgentResult, GateBenchmarkResult, GateRequestSample, Heartbeat,
    OrchestratorMessage, ProbeOutcome, ProbeResult, ProcessInspection, Register, RouterWorkersResult, ScrapeResult,
    SuiteRequestSample, SuiteStepResult, UnitConfigResult, agent_link_client::AgentLinkClient, agent_message::Kind,
    command::Action, gate_agent_result, gate_agent_step, orchestrator_message,
};
use thiserror::Error;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{ClientTlsConfig, Endpoint};
use tracing::{error, info, warn};

use crate::checks::error_chain;
use crate::commands::Dispatcher;

pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(3);
const ATTACH_TIMEOUT: Duration = Duration::from_secs(5);
/// The whole connection — TCP, TLS, the HTTP/2 handshake. The endpoint's
/// own `connect_timeout` bounds only the TCP part, and a frozen
/// orchestrator (SIGSTOPped, a paused VM, a wedged process) completes that
/// from its kernel's backlog and then never answers: without this bound an
/// agent that dialled it would wait there for ever and never reach the
/// leader (the HA scenario with a frozen leader found it).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(3);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(3);
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// The file in `state_dir` holding the highest fencing token seen.
pub(crate) const FENCING_TOKEN_FILE: &str = "fencing_token";

#[derive(Debug, Error)]
pub enum LinkError {
    #[error("invalid orchestrator URL {url:?}")]
    Url {
        url: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("orchestrator URL {url:?} must be {expected}")]
    Scheme { url: String, expected: &'static str },
    #[error("no orchestrator URL configured")]
    NoOrchestrator,
    #[error("cannot connect to the orchestrator")]
    Connect(#[source] tonic::transport::Error),
    #[error(
        "orchestrator did not complete the connection (TCP, TLS, HTTP/2) within {} ms: hung or overloaded",
        CONNECT_TIMEOUT.as_millis()
    )]
    ConnectTimeout,
    #[error("orchestrator refused the attach stream")]
    Attach(#[source] tonic::Status),
    #[error("orchestrator did not answer the attach within {} ms", ATTACH_TIMEOUT.as_millis())]
    AttachTimeout,
}

/// Reading or writing `state_dir/fencing_token`; every variant names the file.
#[derive(Debug, Error)]
pub enum FenceError {
    #[error("cannot read the fencing token file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the fencing token file {} holds {content:?}, not a fencing token (a decimal number): it keeps the \
         highest leader token this agent has seen; write that number back, or remove the file to start from 0",
        path.display()
    )]
    Corrupt { path: PathBuf, content: String },
    #[error("cannot write the fencing token file {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// An orchestrator's endpoint; `tls` is mutual TLS (`None` only under
/// `insecure_plaintext`). The scheme must match: a follower's `leader_url`
/// cannot talk the agent out of TLS.
pub(crate) fn endpoint(url: &str, tls: Option<ClientTlsConfig>) -> Result<Endpoint, LinkError> {
    let (ok, expected) = match tls {
        Some(_) => (url.starts_with("https://"), "an https:// URL (the agent uses TLS)"),
        None => (url.starts_with("http://"), "an http:// URL (the agent uses plain text)"),
    };
    if !ok {
        return Err(LinkError::Scheme {
            url: url.to_owned(),
            expected,
        });
    }
    let mut e = Endpoint::from_shared(url.to_owned()).map_err(|source| LinkError::Url {
        url: url.to_owned(),
        source,
    })?;
    if let Some(tls) = tls {
        e = e.tls_config(tls).map_err(|source| LinkError::Url {
            url: url.to_owned(),
            source,
        })?;
    }
    Ok(e.connect_timeout(Duration::from_secs(3))
        .tcp_nodelay(true)
        // A frozen orchestrator (SIGSTOPped, a paused VM) keeps its TCP
        // connections open: only an unanswered ping shows it. Every 3 s, 3 s
        // to answer: the agent leaves a frozen leader within 3-6 s, well
        // inside the new leader's wait for its agents (`resume_grace_ms`,
        // 15 s; at 10 s + 5 s the agent reached it after ~20 s, in the HA
        // scenario with a frozen leader). An HTTP/2 ping is a few bytes.
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true))
}

// ------------------------------------------------------------------ fencing

/// The fencing rule (DESIGN.md 15), pure: the highest fencing token seen
/// (the floor) only rises, and a token below it is a deposed leader's. One
/// rule for a leader's `RegisterAck` and for each `Command`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Fence {
    floor: u64,
}

/// A token at or above the floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admitted {
    /// Above the floor, which is now this token: persist it.
    Raised,
    /// Equal to the floor.
    Held,
}

/// A token below the floor: from a deposed leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Deposed {
    pub(crate) token: u64,
    pub(crate) floor: u64,
}

impl Fence {
    pub(crate) fn new(floor: u64) -> Self {
        Fence { floor }
    }

    /// Admits `token` (raising the floor to it) or says it is deposed
    /// (leaving the floor as it was).
    pub(crate) fn admit(&mut self, token: u64) -> Result<Admitted, Deposed> {
        if token < self.floor {
            Err(Deposed {
                token,
                floor: self.floor,
            })
        } else if token > self.floor {
            self.floor = token;
            Ok(Admitted::Raised)
        } else {
            Ok(Admitted::Held)
        }
    }
}

/// `state_dir/fencing_token`: the floor as a decimal number, replaced
/// whole (temporary file, then rename) so a crash leaves the old or the
/// new value, never half of one.
#[derive(Debug, Clone)]
pub(crate) struct FenceFile {
    path: PathBuf,
}

impl FenceFile {
    pub(crate) fn in_dir(state_dir: &Path) -> Self {
        FenceFile {
            path: state_dir.join(FENCING_TOKEN_FILE),
        }
    }

    /// The persisted floor; 0 when the file does not exist (no leader with
    /// a token seen yet, or a single orchestrator).
    pub(crate) fn load(&self) -> Result<u64, FenceError> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(source) => {
                return Err(FenceError::Read {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        let text = String::from_utf8_lossy(&bytes);
        text.trim().parse().map_err(|_| FenceError::Corrupt {
            path: self.path.clone(),
            content: text.chars().take(40).collect(),
        })
    }

    pub(crate) fn store(&self, floor: u64) -> Result<(), FenceError> {
        let write = |source| FenceError::Write {
            path: self.path.clone(),
            source,
        };
        let tmp = self.path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp).map_err(write)?;
        f.write_all(format!("{floor}\n").as_bytes()).map_err(write)?;
        f.sync_all().map_err(write)?;
        std::fs::rename(&tmp, &self.path).map_err(write)?;
        // The rename itself survives a power cut once the directory is synced.
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(write)?;
        }
        Ok(())
    }
}

/// The fence and its file: a raised floor is written before the link
/// takes the message that raised it.
struct Fencing {
    fence: Fence,
    file: FenceFile,
}

impl Fencing {
    fn admit(&mut self, token: u64) -> Result<(), Deposed> {
        if self.fence.admit(token)? == Admitted::Raised {
            match self.file.store(token) {
                Ok(()) => info!(fencing_token = token, "fencing token raised"),
                // The floor still holds in memory; only a restart could
                // forget it. Refusing every leader instead would leave the
                // host unmanaged over a full disk.
                Err(e) => error!(
                    fencing_token = token,
                    error = %error_chain(&e),
                    "cannot persist the fencing token; it holds until the agent restarts"
                ),
            }
        }
        Ok(())
    }
}

/// The reply a refused command gets: the failed form of the reply its
/// action normally gets (the orchestrator waits for that kind), carrying
/// why.
fn refusal(command: &Command, deposed: Deposed) -> Kind {
    let error = format!(
        "refused: command from a deposed leader (fencing token {}; this agent has seen {})",
        deposed.token, deposed.floor
    );
    let command_id = command.command_id.clone();
    match &command.action {
        Some(Action::Probe(p)) => Kind::ProbeResult(ProbeResult {
            command_id,
            unit: p.unit.clone(),
            seq: p.seq,
            outcome: ProbeOutcome::Error as i32,
            error,
            ..Default::default()
        }),
        Some(Action::SuiteStep(s)) => Kind::SuiteStepResult(SuiteStepResult {
            command_id,
            unit: s.unit.clone(),
            step: "refused".into(),
            samples: vec![SuiteRequestSample {
                outcome: ProbeOutcome::Error as i32,
                error,
                ..Default::default()
            }],
        }),
        Some(Action::Scrape(_)) => Kind::ScrapeResult(ScrapeResult {
            command_id,
            samples: Vec::new(),
            error,
        }),
        Some(Action::UnitConfig(c)) => Kind::UnitConfigResult(UnitConfigResult {
            command_id,
            unit: c.unit.clone(),
            ok: false,
            error,
            ..Default::default()
        }),
        Some(Action::Gate(g)) => Kind::GateResult(GateAgentResult {
            command_id,
            unit: g.unit.clone(),
            result: Some(match g.step {
                Some(gate_agent_step::Step::Benchmark(_)) => {
                    gate_agent_result::Result::Benchmark(GateBenchmarkResult {
                        samples: vec![GateRequestSample {
                            outcome: ProbeOutcome::Error as i32,
                            error,
                            ..Default::default()
                        }],
                        round_us: Vec::new(),
                    })
                }
                Some(gate_agent_step::Step::Inspect(_)) | None => {
                    gate_agent_result::Result::Process(ProcessInspection {
                        error,
                        ..Default::default()
                    })
                }
            }),
        }),
        Some(Action::RouterWorkers(r)) => Kind::RouterWorkersResult(RouterWorkersResult {
            command_id,
            unit: r.unit.clone(),
            ok: false,
            error,
            workers: Vec::new(),
        }),
        // A deposed leader's capture: each unit answered with the refusal.
        Some(Action::CaptureEvidence(c)) => Kind::EvidenceResult(pdwarden_proto::v1::EvidenceResult {
            command_id,
            units: c
                .units
                .iter()
                .map(|u| pdwarden_proto::v1::UnitEvidence {
                    unit: u.clone(),
                    missing: vec![error.clone()],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
        Some(
            Action::Start(_) | Action::Stop(_) | Action::Watch(_) | Action::Preflight(_) | Action::CutSuiteStep(_),
        )
        | None => Kind::CommandResult(CommandResult {
            command_id,
            ok: false,
            error,
            ms_since_command: 0,
        }),
    }
}

// ----------------------------------------------------------------- rotation

/// Which orchestrator the link dials next: a pure state machine, handed
/// each attempt's [`Outcome`] by [`Rotation::after`].
#[derive(Debug, Clone)]
pub(crate) struct Rotation {
    /// The configured orchestrators, in the order written; never empty.
    configured: Vec<String>,
    /// The configured orchestrator dialled when nothing is `ahead`: the
    /// one that last took the agent, or the one after the last that did not.
    cursor: usize,
    /// Dialled once before `configured[cursor]`.
    ahead: Option<Dial>,
}

/// One dial: where, and why there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dial {
    pub(crate) url: String,
    pub(crate) via: Via,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// `configured[i]`.
    List(usize),
    /// The leader a follower named.
    Redirect,
    /// A leader outside the list (reached by a redirect) that took the
    /// agent on the last stream.
    LastLeader,
}

/// How one attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// No stream: no connection, TLS refused, attach refused or timed out,
    /// an unusable redirect URL.
    Unreachable,
    /// The stream ended; `taken`: the orchestrator had acted as the leader
    /// on it (a leader's ack the fence admitted, or an admitted command).
    Lost { taken: bool },
    /// A follower, naming the leader (`""`: none known).
    Follower { leader_url: String },
    /// A leader whose fencing token is below the floor.
    Deposed,
}

/// What the link does before its next dial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Then {
    /// Dial at once: a follower named the leader.
    DialNow,
    /// Wait the next backoff delay; `reset` starts the backoff over first
    /// (an orchestrator took the agent, so the next trouble is new trouble).
    Backoff { reset: bool },
}

impl Rotation {
    pub(crate) fn new(configured: Vec<String>) -> Result<Self, LinkError> {
        if configured.is_empty() {
            return Err(LinkError::NoOrchestrator);
        }
        Ok(Rotation {
            configured,
            cursor: 0,
            ahead: None,
        })
    }

    /// The next orchestrator to dial.
    pub(crate) fn next(&mut self) -> Dial {
        self.ahead.take().unwrap_or_else(|| Dial {
            url: self.configured[self.cursor].clone(),
            via: Via::List(self.cursor),
        })
    }

    /// Takes how `dial` ended; says whether to dial again at once.
    pub(crate) fn after(&mut self, dial: &Dial, outcome: &Outcome) -> Then {
        match outcome {
            Outcome::Lost { taken: true } => {
                // Back to the one that worked: it is likely still the leader.
                match self.configured.iter().position(|u| same_url(u, &dial.url)) {
                    Some(i) => self.cursor = i,
                    None => {
                        self.ahead = Some(Dial {
                            url: dial.url.clone(),
                            via: Via::LastLeader,
                        });
                    }
                }
                Then::Backoff { reset: true }
            }
            Outcome::Follower { leader_url } => {
                self.pass(dial);
                if leader_url.is_empty() || dial.via == Via::Redirect || same_url(leader_url, &dial.url) {
                    Then::Backoff { reset: false }
                } else {
                    self.ahead = Some(Dial {
                        url: leader_url.clone(),
                        via: Via::Redirect,
                    });
                    Then::DialNow
                }
            }
            Outcome::Unreachable | Outcome::Lost { taken: false } | Outcome::Deposed => {
                self.pass(dial);
                Then::Backoff { reset: false }
            }
        }
    }

    /// Moves past a configured orchestrator that did not take the agent.
    fn pass(&mut self, dial: &Dial) {
        if let Via::List(i) = dial.via {
            self.cursor = (i + 1) % self.configured.len();
        }
    }
}

/// One orchestrator, however its URL ends.
fn same_url(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

// ------------------------------------------------------------------ the I/O

/// The link's own state across streams.
pub(crate) struct Link {
    rotation: Rotation,
    /// The leader whose stream broke last (issue 19): told to followers in
    /// `Register.lost_leader_url`, so one that would send the agent back to
    /// it (most likely dead, its lease not lapsed yet) holds the agent until
    /// the next leader is elected instead.
    lost_leader: Option<String>,
    /// For every dial, configured or named by a follower.
    tls: Option<ClientTlsConfig>,
    fencing: Fencing,
}

struct Session {
    tx: mpsc::Sender<AgentMessage>,
    inbound: tonic::Streaming<OrchestratorMessage>,
}

enum SessionEnd {
    Shutdown,
    Ended(Outcome),
}

async fn open_session(endpoint: &Endpoint, register: Register) -> Result<Session, LinkError> {
    let channel = tokio::time::timeout(CONNECT_TIMEOUT, endpoint.connect())
        .await
        .map_err(|_| LinkError::ConnectTimeout)?
        .map_err(LinkError::Connect)?;
    let mut client = AgentLinkClient::new(channel);
    let (tx, rx) = mpsc::channel(256);
    // Queued before the call: a server may wait for Register before it
    // answers the attach.
    let _ = tx
        .send(AgentMessage {
            kind: Some(Kind::Register(register)),
        })
        .await;
    let response = tokio::time::timeout(ATTACH_TIMEOUT, client.attach(ReceiverStream::new(rx)))
        .await
        .map_err(|_| LinkError::AttachTimeout)?
        .map_err(LinkError::Attach)?;
    Ok(Session {
        tx,
        inbound: response.into_inner(),
    })
}

impl Link {
    /// `orchestrators` as configured; `floor` and `file` from
    /// [`FenceFile::load`].
    pub(crate) fn new(
        orchestrators: Vec<String>,
        tls: Option<ClientTlsConfig>,
        floor: u64,
        file: FenceFile,
    ) -> Result<Self, LinkError> {
        Ok(Link {
            rotation: Rotation::new(orchestrators)?,
            lost_leader: None,
            tls,
            fencing: Fencing {
                fence: Fence::new(floor),
                file,
            },
        })
    }

    /// Keeps the link up until `shutdown` resolves. `after_attach` gives
    /// the messages sent right after `Register` on every new stream (the
    /// latest GPU and host snapshot).
    pub(crate) async fn run<F: Future<Output = ()>>(
        mut self,
        register: impl Fn() -> Register,
        after_attach: impl Fn() -> Vec<AgentMessage>,
        dispatcher: &Arc<Dispatcher>,
        outbox: &mut mpsc::UnboundedReceiver<AgentMessage>,
        mut shutdown: Pin<&mut F>,
    ) {
        let policy = ExponentialBuilder::default()
            .with_min_delay(MIN_BACKOFF)
            .with_max_delay(MAX_BACKOFF)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        let mut backoff = policy.build();
        loop {
            let mut dropped = 0usize;
            while outbox.try_recv().is_ok() {
                dropped += 1;
            }
            if dropped > 0 {
                warn!(
                    dropped,
                    "dropped messages produced while disconnected; Register carries the current facts"
                );
            }
            let dial = self.rotation.next();
            let mut reg = register();
            reg.lost_leader_url = self.lost_leader.clone().unwrap_or_default();
            let outcome = match self
                .attempt(&dial, reg, &after_attach, dispatcher, outbox, shutdown.as_mut())
                .await
            {
                SessionEnd::Shutdown => return,
                SessionEnd::Ended(outcome) => outcome,
            };
            if outcome == (Outcome::Lost { taken: true }) {
                self.lost_leader = Some(dial.url.clone());
            }
            let then = self.rotation.after(&dial, &outcome);
            if let Outcome::Follower { leader_url } = &outcome {
                log_follower(&dial, leader_url, then);
            }
            match then {
                Then::DialNow => continue,
                Then::Backoff { reset } => {
                    if reset {
                        backoff = policy.build();
                    }
                }
            }
            let delay = backoff.next().unwrap_or(MAX_BACKOFF);
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = shutdown.as_mut() => return,
            }
        }
    }

    async fn attempt<F: Future<Output = ()>>(
        &mut self,
        dial: &Dial,
        register: Register,
        after_attach: impl Fn() -> Vec<AgentMessage>,
        dispatcher: &Arc<Dispatcher>,
        outbox: &mut mpsc::UnboundedReceiver<AgentMessage>,
        mut shutdown: Pin<&mut F>,
    ) -> SessionEnd {
        let endpoint = match endpoint(&dial.url, self.tls.clone()) {
            Ok(e) => e,
            // Only a follower's leader_url can get here: configured URLs
            // are checked at start.
            Err(e) => {
                warn!(orchestrator = %dial.url, error = %error_chain(&e), "cannot dial the orchestrator named as leader");
                return SessionEnd::Ended(Outcome::Unreachable);
            }
        };
        let attempt = tokio::select! {
            r = open_session(&endpoint, register) => r,
            () = shutdown.as_mut() => return SessionEnd::Shutdown,
        };
        match attempt {
            Ok(session) => {
                info!(orchestrator = %dial.url, "attached to the orchestrator");
                for m in after_attach() {
                    let _ = session.tx.send(m).await;
                }
                run_session(session, &dial.url, &mut self.fencing, dispatcher, outbox, shutdown).await
            }
            Err(e) => {
                warn!(orchestrator = %dial.url, error = %error_chain(&e), "orchestrator link down");
                SessionEnd::Ended(Outcome::Unreachable)
            }
        }
    }
}

/// One line saying which orchestrator is a follower, whom it names as the
/// leader, and what the agent does about it.
fn log_follower(dial: &Dial, leader_url: &str, then: Then) {
    let url = &dial.url;
    if then == Then::DialNow {
        info!("orchestrator {url} is a follower; it names {leader_url} as the leader: attaching to it");
    } else if leader_url.is_empty() {
        warn!("orchestrator {url} is a follower and knows no leader yet; trying the next orchestrator");
    } else if dial.via == Via::Redirect {
        warn!(
            "orchestrator {url}, named as the leader by a follower, is a follower too and names {leader_url}: \
             not following a second redirect; back to the configured orchestrators"
        );
    } else {
        warn!("orchestrator {url} is a follower but names itself as the leader; trying the next orchestrator");
    }
}

async fn run_session<F: Future<Output = ()>>(
    mut session: Session,
    url: &str,
    fencing: &mut Fencing,
    dispatcher: &Arc<Dispatcher>,
    outbox: &mut mpsc::UnboundedReceiver<AgentMessage>,
    mut shutdown: Pin<&mut F>,
) -> SessionEnd {
    let mut taken = false;
    let mut heartbeat = tokio::time::interval_at(Instant::now() + HEARTBEAT_INTERVAL, HEARTBEAT_INTERVAL);
    loop {
        let up = tokio::select! {
            () = shutdown.as_mut() => return SessionEnd::Shutdown,
            msg = session.inbound.message() => match msg {
                Ok(Some(msg)) => match msg.kind {
                    Some(orchestrator_message::Kind::RegisterAck(ack)) => {
                        if ack.follower {
                            return SessionEnd::Ended(Outcome::Follower { leader_url: ack.leader_url });
                        }
                        if let Err(d) = fencing.admit(ack.fencing_token) {
                            error!(
                                "orchestrator {url} claims leadership with fencing token {}, but this agent has \
                                 seen {}: a deposed leader; not taking its commands (if every orchestrator says \
                                 this, their etcd was rebuilt and its revisions started again: remove {} and \
                                 restart the agent)",
                                d.token,
                                d.floor,
                                fencing.file.path.display()
                            );
                            return SessionEnd::Ended(Outcome::Deposed);
                        }
                        taken = true;
                        info!(
                            orchestrator = %url,
                            orchestrator_instance_id = %ack.orchestrator_instance_id,
                            fencing_token = ack.fencing_token,
                            "registered"
                        );
                        continue;
                    }
                    Some(orchestrator_message::Kind::Command(cmd)) => match fencing.admit(cmd.fencing_token) {
                        Ok(()) => {
                            taken = true;
                            dispatcher.handle(cmd, Instant::now());
                            continue;
                        }
                        Err(d) => {
                            warn!(
                                orchestrator = %url,
                                command_id = %cmd.command_id,
                                "refused: command from a deposed leader (fencing token {}; this agent has seen {})",
                                d.token, d.floor
                            );
                            AgentMessage { kind: Some(refusal(&cmd, d)) }
                        }
                    },
                    None => continue,
                },
                Ok(None) => {
                    warn!(orchestrator = %url, "orchestrator closed the attach stream");
                    return SessionEnd::Ended(Outcome::Lost { taken });
                }
                Err(status) => {
                    warn!(orchestrator = %url, error = %status, "attach stream failed");
                    return SessionEnd::Ended(Outcome::Lost { taken });
                }
            },
            out = outbox.recv() => match out {
                Some(msg) => msg,
                // The agent dropped every producer: it is shutting down.
                None => return SessionEnd::Shutdown,
            },
            _ = heartbeat.tick() => AgentMessage { kind: Some(Kind::Heartbeat(Heartbeat {})) },
        };
        if session.tx.send(up).await.is_err() {
            warn!(orchestrator = %url, "attach stream closed while sending");
            return SessionEnd::Ended(Outcome::Lost { taken });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pdwarden_proto::v1::{
        GateAgentStep, GateBenchmark, ProbeRequest, RouterWorkers, ScrapeEngines, StartUnit, StopUnit,
        SuiteStepRequest, UnitConfigChange,
    };

    // Property: a frozen orchestrator over TLS — its kernel completes the
    // TCP handshake from the listen backlog, the process never answers the
    // ClientHello (SIGSTOPped, a paused VM) — is given up on within the
    // connection's bound. The endpoint's connect_timeout covers only TCP:
    // the agent waited there for ever (the HA scenario with a frozen
    // leader found it). Paused time: the bound elapses at once.
    #[tokio::test(start_paused = true)]
    async fn a_frozen_orchestrator_is_given_up_within_the_connection_bound() {
        let frozen = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("https://{}", frozen.local_addr().unwrap());
        let e = endpoint(&url, Some(ClientTlsConfig::new())).unwrap();
        let r = tokio::time::timeout(Duration::from_secs(600), open_session(&e, Register::default()))
            .await
            .expect("the dial to a frozen orchestrator ended");
        assert!(matches!(r, Err(LinkError::ConnectTimeout)), "{:?}", r.err());
        drop(frozen);
    }

    // Property (DESIGN.md 15): the floor is the highest token admitted; a
    // lower token is refused and leaves it where it was; an equal one is
    // admitted without a write. The incident's numbers: seen 9, then 7.
    #[test]
    fn a_lower_token_is_a_deposed_leader() {
        let mut fence = Fence::new(0);
        assert_eq!(fence.admit(9), Ok(Admitted::Raised));
        assert_eq!(fence.admit(9), Ok(Admitted::Held));
        assert_eq!(fence.admit(7), Err(Deposed { token: 7, floor: 9 }));
        assert_eq!(fence, Fence::new(9), "a refusal leaves the floor");
        assert_eq!(fence.admit(10), Ok(Admitted::Raised));
        assert_eq!(fence.admit(9), Err(Deposed { token: 9, floor: 10 }));
    }

    // Property: a single orchestrator on SQLite (token 0 on every ack and
    // command) is never refused and never writes the file.
    #[test]
    fn token_zero_everywhere_passes_as_before_fencing() {
        let mut fence = Fence::default();
        for _ in 0..3 {
            assert_eq!(fence.admit(0), Ok(Admitted::Held));
        }
    }

    // Property: over any sequence the floor never falls, and every token
    // admitted is at least the floor it met.
    #[test]
    fn the_floor_only_rises() {
        let tokens = [0, 3, 3, 1, 8, 0, 12, 11, 12, 40, 2];
        let mut fence = Fence::default();
        let mut floor = 0;
        for t in tokens {
            let before = fence;
            match fence.admit(t) {
                Ok(_) => {
                    assert!(t >= floor);
                    floor = t;
                }
                Err(d) => {
                    assert_eq!((d.token, d.floor), (t, floor));
                    assert_eq!(fence, before);
                }
            }
            assert_eq!(fence, Fence::new(floor));
        }
        assert_eq!(floor, 40);
    }

    // Property: the file round-trips, is 0 when missing, is replaced whole
    // (no temporary left behind), and a corrupt or unreadable one is an
    // error naming the file.
    #[test]
    fn the_fencing_token_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = FenceFile::in_dir(dir.path());
        assert_eq!(file.load().unwrap(), 0, "missing: 0");
        file.store(9).unwrap();
        assert_eq!(file.load().unwrap(), 9);
        file.store(u64::MAX).unwrap();
        assert_eq!(file.load().unwrap(), u64::MAX);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, [FENCING_TOKEN_FILE]);

        let path = dir.path().join(FENCING_TOKEN_FILE);
        for corrupt in ["", "nine", "-1", "9 10", "\u{fffd}\u{0}"] {
            std::fs::write(&path, corrupt).unwrap();
            let e = file.load().unwrap_err();
            assert!(matches!(e, FenceError::Corrupt { .. }), "{corrupt:?}: {e:?}");
            assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        }
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        let e = file.load().unwrap_err();
        assert!(matches!(e, FenceError::Read { .. }), "{e:?}");
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
    }

    fn command(action: Option<Action>) -> Command {
        Command {
            command_id: "c7".into(),
            action,
            fencing_token: 7,
        }
    }

    const REFUSED: &str = "refused: command from a deposed leader (fencing token 7; this agent has seen 9)";
    const DEPOSED: Deposed = Deposed { token: 7, floor: 9 };

    // Property: a refused command is answered with the failed form of the
    // reply its action normally gets, under its id, saying why; the
    // orchestrator's wait for that reply kind ends.
    #[test]
    fn a_refusal_is_the_actions_own_failed_reply() {
        let start = Action::Start(StartUnit {
            unit: "prefill-0".into(),
            ..Default::default()
        });
        let stop = Action::Stop(StopUnit {
            unit: "prefill-0".into(),
            grace_ms: 0,
        });
        for action in [Some(start), Some(stop), None] {
            match refusal(&command(action), DEPOSED) {
                Kind::CommandResult(r) => {
                    assert_eq!((r.command_id.as_str(), r.ok, r.error.as_str()), ("c7", false, REFUSED));
                }
                other => panic!("{other:?}"),
            }
        }
        let probe = Action::Probe(ProbeRequest {
            unit: "router-0".into(),
            seq: 4,
            ..Default::default()
        });
        match refusal(&command(Some(probe)), DEPOSED) {
            Kind::ProbeResult(r) => {
                assert_eq!((r.command_id.as_str(), r.unit.as_str(), r.seq), ("c7", "router-0", 4));
                assert_eq!((r.outcome, r.error.as_str()), (ProbeOutcome::Error as i32, REFUSED));
            }
            other => panic!("{other:?}"),
        }
        let error_of = |action: Action| match refusal(&command(Some(action)), DEPOSED) {
            Kind::SuiteStepResult(r) => r.samples[0].error.clone(),
            Kind::ScrapeResult(r) => r.error,
            Kind::UnitConfigResult(r) if !r.ok => r.error,
            Kind::RouterWorkersResult(r) if !r.ok => r.error,
            Kind::GateResult(r) => match r.result {
                Some(gate_agent_result::Result::Benchmark(b)) => b.samples[0].error.clone(),
                Some(gate_agent_result::Result::Process(p)) => p.error,
                None => panic!("no gate result"),
            },
            other => panic!("{other:?}"),
        };
        let actions = [
            Action::SuiteStep(SuiteStepRequest::default()),
            Action::Scrape(ScrapeEngines::default()),
            Action::UnitConfig(UnitConfigChange::default()),
            Action::RouterWorkers(RouterWorkers::default()),
            Action::Gate(GateAgentStep::default()),
            Action::Gate(GateAgentStep {
                unit: "decode-0".into(),
                step: Some(gate_agent_step::Step::Benchmark(GateBenchmark::default())),
            }),
        ];
        for action in actions {
            assert_eq!(error_of(action), REFUSED);
        }
    }

    fn rotation(urls: &[&str]) -> Rotation {
        Rotation::new(urls.iter().map(|u| u.to_string()).collect()).unwrap()
    }

    const A: &str = "http://a:7070";
    const B: &str = "http://b:7070";
    const C: &str = "http://c:7070";
    const L: &str = "http://leader-outside-the-list:7070";

    fn lost(taken: bool) -> Outcome {
        Outcome::Lost { taken }
    }
    fn follower(leader: &str) -> Outcome {
        Outcome::Follower {
            leader_url: leader.into(),
        }
    }

    /// Runs `outcomes` through `r`, returning each dial's URL and what
    /// came after it.
    fn drive(r: &mut Rotation, outcomes: &[Outcome]) -> Vec<(String, Then)> {
        outcomes
            .iter()
            .map(|o| {
                let dial = r.next();
                let then = r.after(&dial, o);
                (dial.url, then)
            })
            .collect()
    }

    const BACKOFF: Then = Then::Backoff { reset: false };
    const RESET: Then = Then::Backoff { reset: true };

    // Property: one orchestrator is dialled again and again, as before
    // issue 19, and the backoff starts over only once it has taken the agent.
    #[test]
    fn one_orchestrator_is_redialled() {
        let mut r = rotation(&[A]);
        let steps = drive(
            &mut r,
            &[Outcome::Unreachable, lost(false), lost(true), Outcome::Deposed],
        );
        assert_eq!(
            steps,
            [
                (A.into(), BACKOFF),
                (A.into(), BACKOFF),
                (A.into(), RESET),
                (A.into(), BACKOFF)
            ]
        );
    }

    // Property: orchestrators that do not take the agent are passed in
    // turn, round the list; the one that took it is dialled first after
    // its stream breaks.
    #[test]
    fn the_list_is_tried_in_turn_from_the_last_that_worked() {
        let mut r = rotation(&[A, B, C]);
        let steps = drive(
            &mut r,
            &[
                Outcome::Unreachable,
                lost(true),
                lost(true),
                Outcome::Unreachable,
                Outcome::Deposed,
                lost(false),
            ],
        );
        let urls: Vec<_> = steps.iter().map(|(u, _)| u.as_str()).collect();
        assert_eq!(urls, [A, B, B, B, C, A]);
        assert_eq!(steps[1].1, RESET);
    }

    // Property: a follower naming the leader sends the agent there at once
    // (no backoff), listed or not; a follower that knows no leader passes
    // the agent to the next orchestrator after a backoff.
    #[test]
    fn a_follower_redirects_to_the_leader_at_once() {
        let mut r = rotation(&[A, B, C]);
        let steps = drive(&mut r, &[follower(C), lost(true)]);
        assert_eq!(steps, [(A.into(), Then::DialNow), (C.into(), RESET)]);
        assert_eq!(r.next().url, C, "the leader that worked is dialled first");

        let mut r = rotation(&[A, B]);
        let steps = drive(&mut r, &[follower(L), lost(true), Outcome::Unreachable, follower("")]);
        assert_eq!(
            steps,
            [
                (A.into(), Then::DialNow),
                (L.into(), RESET),
                (L.into(), BACKOFF),
                (B.into(), BACKOFF)
            ]
        );
        assert_eq!(r.next().url, A);
    }

    // Property: at most one redirect between backoffs: two followers that
    // name each other (stale views in an election) cannot make the agent
    // spin; a follower naming itself is not followed either.
    #[test]
    fn redirects_are_bounded() {
        let mut r = rotation(&[A, B, C]);
        let steps = drive(&mut r, &[follower(C), follower(A), follower(C), follower(A)]);
        assert_eq!(
            steps,
            [
                (A.into(), Then::DialNow),
                (C.into(), BACKOFF),
                (B.into(), Then::DialNow),
                (C.into(), BACKOFF),
            ]
        );
        let immediate = steps
            .windows(2)
            .filter(|w| w.iter().all(|(_, t)| *t == Then::DialNow))
            .count();
        assert_eq!(immediate, 0, "never two dials in a row without a backoff");

        let mut r = rotation(&[A, B]);
        assert_eq!(drive(&mut r, &[follower(&format!("{A}/"))]), [(A.into(), BACKOFF)]);
        assert_eq!(r.next().url, B);
    }

    // Property: a leader named by a follower that cannot be dialled (gone,
    // or a scheme the agent does not use) falls back to the list.
    #[test]
    fn an_unreachable_leader_falls_back_to_the_list() {
        let mut r = rotation(&[A, B]);
        let steps = drive(&mut r, &[follower(L), Outcome::Unreachable, lost(true)]);
        assert_eq!(
            steps,
            [(A.into(), Then::DialNow), (L.into(), BACKOFF), (B.into(), RESET)]
        );
        assert!(matches!(
            endpoint("http://b:7070", Some(ClientTlsConfig::new())),
            Err(LinkError::Scheme { .. })
        ));
        assert!(matches!(
            endpoint("https://b:7070", None),
            Err(LinkError::Scheme { .. })
        ));
        assert!(endpoint("http://b:7070", None).is_ok());
        assert!(matches!(Rotation::new(Vec::new()), Err(LinkError::NoOrchestrator)));
    }
}
