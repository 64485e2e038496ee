//! Readiness detection lag: pd-sim's own record of each start-up transition
//! against the moment pdwarden's record of it reaches the orchestrator side.
//!
//! The real agent runs in-process and supervises four real `pd-sim`
//! processes (this binary re-executed, with random start-up timings). The
//! orchestrator side is a minimal `AgentLink` server in this process that
//! stamps every message on arrival with `CLOCK_MONOTONIC`, the clock pd-sim
//! records its transitions on (DESIGN.md 5), so the lag covers the agent's
//! polling, the health handler, the gRPC hop and nothing else. The same start
//! timelines then feed fixed-interval pollers (8 s, 10 s, 60 s) with a random
//! phase each, computed analytically.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, bail};
use pd_sim::clock::mono_ms;
use pdwarden_proto::v1::agent_link_server::{AgentLink, AgentLinkServer};
use pdwarden_proto::v1::{
    AgentMessage, Command, OrchestratorMessage, Phase, ReadinessSpec, StartUnit, agent_message, command,
    orchestrator_message,
};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};

use crate::stats::{Rng, median, p99, poller_lag};

/// Units the agent supervises; started together each round.
const UNITS: usize = 4;
/// The agent's readiness poll period (its default).
const POLL_MS: u64 = 20;

/// One observed start of one unit.
#[derive(Debug, Clone, Default)]
pub struct Start {
    /// Host monotonic ms when the start command was sent.
    pub sent: f64,
    /// pd-sim's record: port open (refused → 503) and ready (503 → 200).
    pub sim_listen: f64,
    pub sim_ready: f64,
    /// Arrival at the orchestrator side of the agent's events.
    pub got_503: f64,
    pub got_healthy: f64,
    pub got_generating: f64,
    /// Duration of the generation check that produced `generating`.
    pub check_ms: f64,
    /// The agent reported `spawned`: an `exited` after it is a failed start
    /// (before it, it is the stop half of the restart).
    pub spawned: bool,
}

/// One row of the lag table: a transition and its lags, in ms.
pub struct LagRow {
    pub phase: &'static str,
    pub pdwarden: Vec<f64>,
    /// (period in s, lags) for each simulated poller.
    pub pollers: Vec<(u64, Vec<f64>)>,
}

pub struct LagResult {
    pub starts: usize,
    pub failed: usize,
    pub rows: Vec<LagRow>,
    pub check_ms: Vec<f64>,
}

/// Every agent message, stamped on arrival.
type Stamped = (f64, AgentMessage);

/// One attached agent: its stamped messages, and the command sender.
pub type Session = (
    mpsc::UnboundedReceiver<Stamped>,
    mpsc::UnboundedSender<Result<OrchestratorMessage, tonic::Status>>,
);

struct Link {
    sessions: mpsc::UnboundedSender<Session>,
}

#[tonic::async_trait]
impl AgentLink for Link {
    type AttachStream = UnboundedReceiverStream<Result<OrchestratorMessage, tonic::Status>>;

    async fn attach(
        &self,
        request: tonic::Request<tonic::Streaming<AgentMessage>>,
    ) -> Result<tonic::Response<Self::AttachStream>, tonic::Status> {
        let mut inbound = request.into_inner();
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let (msg_tx, msg_rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                if msg_tx.send((mono_ms(), m)).is_err() {
                    break;
                }
            }
        });
        let _ = self.sessions.send((msg_rx, cmd_tx));
        Ok(tonic::Response::new(UnboundedReceiverStream::new(cmd_rx)))
    }
}

/// The orchestrator side of the link: agents attach here and every message
/// they send is stamped on arrival.
pub struct LinkServer {
    pub url: String,
    pub sessions: mpsc::UnboundedReceiver<Session>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl LinkServer {
    pub async fn start() -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let (sess_tx, sessions) = mpsc::unbounded_channel();
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(AgentLinkServer::new(Link { sessions: sess_tx }))
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stop_rx.await;
                }),
        );
        Ok(LinkServer {
            url,
            sessions,
            stop,
            task,
        })
    }

    /// The next agent to attach, within 20 s.
    pub async fn accept(&mut self) -> anyhow::Result<Session> {
        tokio::time::timeout(Duration::from_secs(20), self.sessions.recv())
            .await
            .context("the agent did not attach within 20 s")?
            .context("link server stopped")
    }

    pub async fn shutdown(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

/// An agent config supervising `UNITS` pd-sims (this binary as
/// `pd-sim-jitter`) on free ports; returns it and the units' base URLs.
pub fn agent_toml(url: &str, state_dir: &std::path::Path, gpu_source: &str) -> anyhow::Result<(String, Vec<String>)> {
    let exe = std::env::current_exe().context("cannot locate the bench binary")?;
    let mut units = String::new();
    let mut bases = Vec::new();
    for i in 0..UNITS {
        let port = pdwarden_orchestrator::edge::ports::late_bind_port()?;
        let base = format!("http://127.0.0.1:{port}");
        units.push_str(&format!(
            "[[unit]]\nname = \"u{i}\"\nrole = \"prefill\"\nargv = [{exe:?}, \"pd-sim-jitter\", \"--port\", \"{port}\"]\nbase_url = \"{base}\"\n\n",
            exe = exe.display().to_string()
        ));
        bases.push(base);
    }
    let toml = format!(
        "host = \"bench\"\norchestrator = \"{url}\"\nstate_dir = {state:?}\non_exit = \"stop-units\"\nshutdown_grace_ms = 2000\ngpu_source = {gpu_source:?}\n\n{units}",
        state = state_dir.display().to_string()
    );
    Ok((
        with_plaintext(toml, |t| pdwarden_agent::AgentConfig::from_toml_str(t).is_ok()),
        bases,
    ))
}

/// Adds `insecure_plaintext = true` (everything here is loopback) where the
/// config format has that field, and leaves the config as it is where not.
pub fn with_plaintext(toml: String, parses: impl Fn(&str) -> bool) -> String {
    let plain = format!("insecure_plaintext = true\n{toml}");
    if parses(&plain) { plain } else { toml }
}

/// A restart of unit `u{i}` watched to `generating` with the default poll.
pub fn start_command(id: &str, i: usize) -> OrchestratorMessage {
    let cmd = Command {
        fencing_token: 0,
        command_id: id.to_owned(),
        action: Some(command::Action::Start(StartUnit {
            unit: format!("u{i}"),
            restart: true,
            stop_grace_ms: 2000,
            readiness: Some(ReadinessSpec {
                deadline_ms: 30_000,
                poll_interval_ms: POLL_MS,
                check_timeout_ms: 10_000,
                chat: None,
            }),
        })),
    };
    OrchestratorMessage {
        kind: Some(orchestrator_message::Kind::Command(cmd)),
    }
}

/// Runs `rounds` rounds of four simultaneous restarts.
pub async fn run(rounds: usize, seed: u64) -> anyhow::Result<LagResult> {
    let dir = tempfile::tempdir()?;
    let mut link = LinkServer::start().await?;
    let (toml, bases) = agent_toml(&link.url, dir.path(), "none")?;
    let config = pdwarden_agent::AgentConfig::from_toml_str(&toml)?;
    let (agent_stop_tx, agent_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let agent = tokio::spawn(pdwarden_agent::run(config, async {
        let _ = agent_stop_rx.await;
    }));

    let result = match link.accept().await {
        Ok(session) => drive(session, &bases, rounds, seed).await,
        Err(e) => Err(e),
    };

    let _ = agent_stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), agent).await;
    link.shutdown().await;
    crate::children::kill_strays("pd-sim-jitter");
    result
}

async fn drive(session: Session, bases: &[String], rounds: usize, seed: u64) -> anyhow::Result<LagResult> {
    let (mut inbox, commands) = session;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let mut starts = Vec::new();
    let mut failed = 0;
    for round in 0..rounds {
        let mut open: HashMap<String, (usize, Start)> = HashMap::new();
        for (i, _) in bases.iter().enumerate() {
            let id = format!("lag-{round}-{i}");
            let sent = mono_ms();
            commands
                .send(Ok(start_command(&id, i)))
                .ok()
                .context("agent stream closed")?;
            open.insert(
                id,
                (
                    i,
                    Start {
                        sent,
                        ..Start::default()
                    },
                ),
            );
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
        let mut done = Vec::new();
        while !open.is_empty() {
            let Ok(Some((at, msg))) = tokio::time::timeout_at(deadline, inbox.recv()).await else {
                bail!("round {round}: starts did not finish within 40 s");
            };
            if std::env::var_os("PDWARDEN_BENCH_DEBUG").is_some() {
                eprintln!("{at:.1} {msg:?}");
            }
            let Some(agent_message::Kind::UnitEvent(ev)) = msg.kind else {
                continue;
            };
            // Check attempts repeat the unit's current phase; only phase changes time the lag.
            if ev.attempt.is_some() {
                continue;
            }
            let Some((_, s)) = open.get_mut(&ev.command_id) else {
                continue;
            };
            match Phase::try_from(ev.phase) {
                Ok(Phase::Spawned) => s.spawned = true,
                Ok(Phase::Exited) if !s.spawned => {}
                Ok(Phase::Http503) => s.got_503 = at,
                Ok(Phase::Healthy) => s.got_healthy = at,
                Ok(Phase::Generating) => {
                    s.got_generating = at;
                    s.check_ms = ev.check_latency_ms as f64;
                    let (i, s) = open.remove(&ev.command_id).expect("present");
                    done.push((i, s));
                }
                Ok(Phase::NotReady | Phase::Exited) => {
                    open.remove(&ev.command_id);
                    failed += 1;
                }
                _ => {}
            }
        }
        for (i, mut s) in done {
            let stats: serde_json::Value = http.get(format!("{}/sim/stats", bases[i])).send().await?.json().await?;
            s.sim_listen = stats["listen_mono_ms"].as_f64().unwrap_or(f64::NAN);
            s.sim_ready = stats["ready_mono_ms"].as_f64().unwrap_or(f64::NAN);
            if s.got_503 == 0.0 || s.got_healthy == 0.0 {
                failed += 1;
            } else {
                starts.push(s);
            }
        }
    }
    Ok(summarise(&starts, failed, seed))
}

fn summarise(starts: &[Start], failed: usize, seed: u64) -> LagResult {
    let mut rng = Rng::new(seed);
    let periods = [8u64, 10, 60];
    // One random phase per start and poller, shared by that start's
    // transitions: a poller that sees 200 runs its generation check on the
    // same tick (its check is taken as instantaneous, in its favour).
    let phases: Vec<Vec<f64>> = starts
        .iter()
        .map(|_| periods.iter().map(|_| rng.unit()).collect())
        .collect();
    let row = |phase, got: fn(&Start) -> f64, truth: fn(&Start) -> f64| {
        let pdwarden = starts.iter().map(|s| got(s) - truth(s)).collect();
        let pollers = periods
            .iter()
            .enumerate()
            .map(|(k, &p)| {
                let lags = starts
                    .iter()
                    .zip(&phases)
                    .map(|(s, ph)| poller_lag(s.sent, truth(s), p as f64 * 1000.0, ph[k]))
                    .collect();
                (p, lags)
            })
            .collect();
        LagRow {
            phase,
            pdwarden,
            pollers,
        }
    };
    let rows = vec![
        row("refused → 503", |s| s.got_503, |s| s.sim_listen),
        row("503 → 200", |s| s.got_healthy, |s| s.sim_ready),
        row("200 → generating", |s| s.got_generating, |s| s.sim_ready),
    ];
    LagResult {
        starts: starts.len(),
        failed,
        rows,
        check_ms: starts.iter().map(|s| s.check_ms).collect(),
    }
}

impl LagResult {
    /// Median of pdwarden's lag over all three transitions together.
    pub fn overall_median(&self) -> f64 {
        let all: Vec<f64> = self.rows.iter().flat_map(|r| r.pdwarden.iter().copied()).collect();
        median(&all)
    }

    pub fn overall_p99(&self) -> f64 {
        let all: Vec<f64> = self.rows.iter().flat_map(|r| r.pdwarden.iter().copied()).collect();
        p99(&all)
    }
}

/// `pd-sim-jitter`: one pd-sim with a random start-up (port closed for
/// 200–500 ms, then 503 for 200–600 ms more), at time scale 0.02 so that
/// SGLang's 1 s health-handler tick is 20 ms.
pub fn pd_sim_args(port: u16) -> Vec<String> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mut rng = Rng::new(u64::from(nanos) ^ (u64::from(std::process::id()) << 32));
    let scale = 0.02;
    let listen = 200.0 + rng.unit() * 300.0;
    let ready = listen + 200.0 + rng.unit() * 400.0;
    vec![
        "pd-sim".into(),
        "--role".into(),
        "prefill".into(),
        "--port".into(),
        port.to_string(),
        "--bootstrap-port".into(),
        "0".into(),
        "--time-scale".into(),
        scale.to_string(),
        "--listen-after-ms".into(),
        format!("{:.0}", listen / scale),
        "--ready-after-ms".into(),
        format!("{:.0}", ready / scale),
    ]
}
