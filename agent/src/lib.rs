//! pdwarden's per-host agent.
//!
//! The agent is the orchestrator's eyes and hands on one host (DESIGN.md 2:
//! facts from the agent). It supervises the host's units (prefill and decode
//! engines, routers) as child processes, watches each start-up phase as it
//! happens (`spawned → refused → http_503 → healthy → generating`), runs
//! probe-tagged chat completions on request, and reports all of it over one
//! gRPC stream that it dials out to the orchestrator.
//!
//! Layout:
//! - [`config`]: the TOML config (host, orchestrators, units).
//! - [`readiness`]: the pure, clock-injected phase classifier and its poll driver.
//! - [`checks`]: the HTTP edge: health polls, generation checks, chat probes.
//! - `supervisor`: processes (spawn, stop, exit detection, logs), one actor per unit.
//! - `commands`: executes commands at most once per command id.
//! - `link`: the orchestrator stream, with reconnect/backoff and heartbeats;
//!   with several orchestrators, failover, following the leader a follower
//!   names, and fencing out deposed leaders (`state_dir/fencing_token`).
//! - [`gpu`]: GPU sources (NVML, fake file, none), process→unit mapping, and
//!   the reporter streaming `HostSnapshot`s and `GpuEvent`s; [`host`]: host
//!   figures and the process table (`sysinfo`); `exporter`: `/metrics`.
//! - [`metrics`]: scrapes and parses an engine's Prometheus `/metrics`.
//! - `watch`: the passive engine watch (`WatchEngines` → `EngineSample`s).
//! - [`tls`]: the `[tls]` files, mutual TLS to the orchestrator and the
//!   `agent:HOST` certificate identity; [`redact`]: secret env values hidden.
//! - [`unitconfig`]: versions of a unit's launch config (change gate);
//!   [`gate`]: live process inspection (`/proc`) and the gate's benchmark.
//! - `evidence`: what a unit judged wedged looks like before it is killed
//!   (py-spy and /proc stacks, metrics, log tail, GPUs; issue 35).
//!
//! [`run`] ties them together; the `pdwarden-agent` binary only parses its
//! flag, loads the config and wires SIGTERM/SIGINT to `shutdown`.
//!
//! Event timestamps (`UnitEvent.ms_since_command`, agent monotonic ms since
//! the agent received `command_id`):
//! - `spawned`: when the process was spawned (after the stop half of a restart);
//! - `refused`, `http_503`, `healthy`: when that health poll's outcome
//!   (answer, connect error or timeout) was observed;
//! - `generating`: when the generation check returned; `check_latency_ms` is
//!   its duration, so it started at `ms_since_command - check_latency_ms`;
//! - `not_ready`: when the readiness deadline fired;
//! - check attempts (`attempt` set; every generation check, health polls as
//!   runs of one outcome): when the check (the run's last poll) ended, with
//!   the unit's phase at that moment; they change no phase;
//! - `stopping`: when SIGTERM was sent; `exited`: when the exit was reaped.
//!   Both carry the stop's id, or the start's id for a restart;
//! - an `exited` during a start-up watch carries the start's id; any other
//!   exit nobody asked for carries `""` and 0. Units started by `autostart`
//!   or stopped on agent shutdown report `""` with ms since that action began.
//!
//! `CommandResult.ms_since_command` is when the action finished (spawned, or
//! exited after a stop).

pub mod checks;
mod commands;
pub mod config;
mod evidence;
/// The most bytes an evidence answer encodes to (issue 48).
pub use evidence::MAX_ANSWER_BYTES;
mod exporter;
pub mod gate;
pub mod gpu;
pub mod host;
mod link;
pub mod metrics;
mod outbox;
pub mod preflight;
pub mod readiness;
pub mod router_api;
pub mod runas;
pub use pdwarden_security::redact;
pub mod service;
mod service_manager;
pub mod suite;
mod supervisor;
pub use pdwarden_security::tls;
pub mod unitconfig;
mod watch;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pdwarden_proto::v1::Register;
use thiserror::Error;
use tokio::time::Instant;
use tracing::{info, warn};

pub use config::{AgentConfig, ConfigError, OnExit, Orchestrators, Role, UnitConfig};
pub use link::{FenceError, LinkError};
pub use supervisor::SupervisorError;

/// Reported in `Register.agent_version`.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Why the agent could not run.
#[derive(Debug, Error)]
pub enum AgentError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot create the state directory {}", path.display())]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error(transparent)]
    Fence(#[from] FenceError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("cannot listen for /metrics on {addr} (metrics_listen)")]
    MetricsListen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// Runs the agent until `shutdown` resolves.
///
/// Adopts units a previous agent left running (`state_dir/run/<unit>.pid`),
/// starts the `autostart` units that are not running, then keeps a stream to the orchestrator
/// (reconnecting forever while it is unreachable; with several, to their leader) and executes
/// its commands, except a deposed leader's (`state_dir/fencing_token`).
/// When `shutdown` resolves, units are stopped first if `on_exit =
/// "stop-units"` (SIGTERM, SIGKILL after `shutdown_grace_ms`), else left
/// running. Errors only for a bad config or an unusable state directory (or fencing token file).
pub async fn run(config: AgentConfig, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
    config.validate()?;
    config.check_unit_users()?;
    let log_dir = config.state_dir.join("logs");
    std::fs::create_dir_all(&log_dir).map_err(|source| AgentError::StateDir {
        path: log_dir.clone(),
        source,
    })?;
    let transport = tls::Transport::resolve(config.tls.as_ref(), config.insecure_plaintext)?;
    for url in config.orchestrators() {
        transport.check_url("orchestrator", url)?;
    }
    let client_tls = match &transport {
        tls::Transport::Tls(files) => Some(files.client_config()?),
        tls::Transport::InsecurePlaintext => {
            tracing::warn!("{}", tls::PLAINTEXT_WARNING);
            None
        }
    };
    // A configured URL that cannot make an endpoint is a start-up error,
    // not a retry loop.
    for url in config.orchestrators() {
        link::endpoint(url, client_tls.clone())?;
    }
    let fence_file = link::FenceFile::in_dir(&config.state_dir);
    let floor = fence_file.load()?;
    let orchestrator_link = link::Link::new(config.orchestrators().to_vec(), client_tls, floor, fence_file)?;
    let instance_id = uuid::Uuid::new_v4().to_string();
    info!(host = %config.host, agent_instance_id = %instance_id, units = config.units.len(), "agent starting");
    if let Some(warning) = service::check(config.on_exit).await {
        tracing::warn!("{warning}");
    }

    let http = checks::http_client();
    let (outbox, mut outbox_rx) = outbox::Outbox::new();
    let gpu_outbox = outbox.clone();
    let supervisor = Arc::new(supervisor::Supervisor::new(&config, outbox.clone(), http.clone()));
    // The GPU reporter's latest reading: for the link, `/metrics` and the
    // evidence captured before a kill (issue 35).
    let (latest_tx, latest_rx) = tokio::sync::watch::channel(Arc::new(gpu::reporter::Latest::default()));
    let dispatcher = Arc::new(commands::Dispatcher::new(
        Arc::clone(&supervisor),
        outbox,
        http,
        latest_rx.clone(),
        config.py_spy.clone(),
    ));

    for (unit, pid) in supervisor.adopt_all() {
        info!(unit = %unit, pid, "unit left running by a previous agent adopted");
    }
    // What would stop a unit from starting, said at load rather than at
    // the first restart (issue 16, finding 5).
    for unit in &config.units {
        for problem in supervisor.preflight(&unit.name).unwrap_or_default() {
            warn!(unit = %unit.name, %problem, "this unit cannot start as configured");
        }
    }
    let running: Vec<String> = supervisor
        .unit_infos()
        .into_iter()
        .filter(|u| u.pid != 0)
        .map(|u| u.name)
        .collect();
    for unit in config
        .units
        .iter()
        .filter(|u| u.autostart && !running.contains(&u.name))
    {
        // Autostart events carry command id "" and count from this moment.
        let start = supervisor.start(
            &unit.name,
            supervisor::CommandContext::new("", Instant::now()),
            false,
            Duration::from_millis(supervisor::DEFAULT_STOP_GRACE_MS),
            readiness::ReadinessParams::default(),
        );
        if let Err(e) = start.await {
            tracing::error!(unit = %unit.name, error = %checks::error_chain(&e), "autostart failed");
        }
    }

    // GPU and host reporting: never fails the agent (no driver = says why).
    let metrics_server = match &config.metrics_listen {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| AgentError::MetricsListen {
                    addr: addr.clone(),
                    source,
                })?;
            if let Ok(bound) = listener.local_addr() {
                info!(addr = %bound, "serving GPU and host metrics on /metrics");
            }
            Some(tokio::spawn(exporter::serve(listener, config.host.clone(), latest_rx.clone())).abort_handle())
        }
        None => None,
    };
    let reporter = {
        let supervisor = Arc::clone(&supervisor);
        tokio::spawn(gpu::reporter::run(
            config.gpu_source_spec(),
            gpu::reporter::ReporterParams {
                sample_interval: Duration::from_millis(config.gpu_sample_interval_ms),
                snapshot_interval: Duration::from_millis(config.gpu_snapshot_interval_ms),
            },
            move || supervisor.unit_infos().into_iter().map(|u| (u.name, u.pid)).collect(),
            gpu_outbox,
            latest_tx,
        ))
        .abort_handle()
    };
    // Sent after every Register, so a (re)attached orchestrator has the
    // GPU facts at once rather than at the next periodic snapshot.
    let after_attach = move || {
        latest_rx
            .borrow()
            .snapshot
            .clone()
            .map(|s| pdwarden_proto::v1::AgentMessage {
                kind: Some(pdwarden_proto::v1::agent_message::Kind::HostSnapshot(s)),
            })
            .into_iter()
            .collect()
    };

    let register = {
        let supervisor = Arc::clone(&supervisor);
        let host = config.host.clone();
        move || Register {
            host: host.clone(),
            agent_version: AGENT_VERSION.to_owned(),
            agent_instance_id: instance_id.clone(),
            units: supervisor.unit_infos(),
            // Set by the link for each attempt.
            lost_leader_url: String::new(),
        }
    };
    let shutdown = std::pin::pin!(shutdown);
    // Units adopted or started, the metrics endpoint bound: ready as a
    // supervisor, attached to an orchestrator or not (it may be down).
    let watchdog = service_manager::ready_and_watch(Arc::clone(&supervisor));
    orchestrator_link
        .run(register, after_attach, &dispatcher, &mut outbox_rx, shutdown)
        .await;
    reporter.abort();
    if let Some(w) = watchdog {
        w.abort();
    }
    if let Some(m) = metrics_server {
        m.abort();
    }

    info!(on_exit = ?config.on_exit, "agent shutting down");
    if config.on_exit == OnExit::StopUnits {
        supervisor
            .stop_all(Duration::from_millis(config.shutdown_grace_ms))
            .await;
    }
    Ok(())
}
