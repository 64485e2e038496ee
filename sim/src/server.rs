//! One simulated engine process: its start-up phases, its sockets and its shutdown.
//!
//! [`spawn`] starts an engine as a task and hands back a [`SimHandle`]; [`run`] is
//! the same thing driven to completion by a shutdown future (what the binary uses).
//! Tests start engines in-process on `127.0.0.1:0` and learn the bound addresses
//! from the handle.
//!
//! Start-up follows SGLang's observable phases: nothing is bound until
//! `--listen-after-ms` (connections refused); then the HTTP port (and a prefill's
//! bootstrap port) open and `/v1/models` answers; at `--ready-after-ms` health starts
//! running its forward pass and generations are served. Each transition is logged
//! once to stderr and stamped on `CLOCK_MONOTONIC`.
//!
//! With `--start-count-file`, the very first thing a start does is count itself there
//! ([`count_start`]) and, with `--cold-first-ms-by-start`, take that start's cold
//! penalty, so that a test can restart the same unit several times, each start with its
//! own cold cost (and its own near-tie parity, `--near-tie-positions`). Then it reads
//! `--weights-file`, if any: the weights it computes with until the next start.
//!
//! Connections are served by our own accept loop rather than `axum::serve`, so that
//! a shutdown drops every connection at once — requests in flight included — the way
//! a killed engine process does. (A graceful shutdown would wait forever on a hung
//! generation, and lingering keep-alive connections would let a "restarted" in-process
//! engine keep answering as its previous instance.)

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::clock::mono_ms;
use crate::config::Config;
pub use crate::state::{Bound, Sim};
use crate::stats::Phase;

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot bind {what} on {addr}")]
    Bind {
        what: &'static str,
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the engine task failed")]
    Task(#[source] tokio::task::JoinError),
    #[error("the engine stopped before it listened")]
    StoppedEarly,
    #[error("--start-count-file {path}: cannot {what} it")]
    StartCountIo {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("--start-count-file {path} holds {content:?}, not a number of starts")]
    StartCountContent { path: String, content: String },
}

/// Counts one more start in `path` and returns this start's number (1-based): reads the
/// starts before (a missing or empty file is 0), writes back one more.
pub async fn count_start(path: &Path) -> Result<u64, SimError> {
    let shown = || path.display().to_string();
    let before = match tokio::fs::read_to_string(path).await {
        Ok(text) if text.trim().is_empty() => 0,
        Ok(text) => text.trim().parse::<u64>().map_err(|_| SimError::StartCountContent {
            path: shown(),
            content: text.trim().to_string(),
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(source) => {
            return Err(SimError::StartCountIo {
                what: "read",
                path: shown(),
                source,
            });
        }
    };
    let this = before + 1;
    tokio::fs::write(path, format!("{this}\n"))
        .await
        .map_err(|source| SimError::StartCountIo {
            what: "write",
            path: shown(),
            source,
        })?;
    Ok(this)
}

/// A running engine started with [`spawn`].
pub struct SimHandle {
    sim: Arc<Sim>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), SimError>>,
}

impl SimHandle {
    pub fn sim(&self) -> &Arc<Sim> {
        &self.sim
    }

    /// The bound addresses, if the engine listens yet.
    pub fn try_bound(&self) -> Option<Bound> {
        *self.sim.bound.borrow()
    }

    /// Waits until the engine listens; fails if it stopped first.
    pub async fn bound(&mut self) -> Result<Bound, SimError> {
        let mut rx = self.sim.bound.subscribe();
        tokio::select! {
            r = rx.wait_for(|b| b.is_some()) => match r {
                Ok(b) => Ok(b.expect("checked")),
                Err(_) => Err(SimError::StoppedEarly),
            },
            r = &mut self.task => match r {
                Ok(Ok(())) => Err(SimError::StoppedEarly),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(SimError::Task(e)),
            },
        }
    }

    /// Stops the engine, dropping every connection, and waits for it.
    pub async fn shutdown(self) -> Result<(), SimError> {
        self.cancel.cancel();
        match self.task.await {
            Ok(r) => r,
            Err(e) => Err(SimError::Task(e)),
        }
    }
}

/// Starts an engine task. Must be called within a tokio runtime.
pub fn spawn(config: Config) -> SimHandle {
    let sim = Sim::new(config);
    let cancel = CancellationToken::new();
    let task = tokio::spawn(lifecycle(sim.clone(), cancel.clone()));
    SimHandle { sim, cancel, task }
}

/// Runs an engine until `shutdown` completes.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), SimError> {
    let handle = spawn(config);
    let cancel = handle.cancel.clone();
    let mut task = handle.task;
    tokio::select! {
        r = &mut task => return r.map_err(SimError::Task)?,
        _ = shutdown => {}
    }
    cancel.cancel();
    task.await.map_err(SimError::Task)?
}

async fn bind(what: &'static str, host: &str, port: u16) -> Result<TcpListener, SimError> {
    TcpListener::bind((host, port)).await.map_err(|source| SimError::Bind {
        what,
        addr: format!("{host}:{port}"),
        source,
    })
}

async fn lifecycle(sim: Arc<Sim>, cancel: CancellationToken) -> Result<(), SimError> {
    let cfg = &sim.config;
    sim.log_phase(Phase::Starting, sim.start_mono_ms);
    let count_file = cfg
        .cold_by_start
        .as_ref()
        .map(|c| &c.count_file)
        .or(cfg.start_count_file.as_ref());
    if let Some(count_file) = count_file {
        let start = count_start(count_file).await?;
        let _ = sim.start_number.set(start);
        if let Some(by_start) = &cfg.cold_by_start {
            let cold_ms = by_start.for_start(start);
            sim.settings.lock().unwrap_or_else(|e| e.into_inner()).cold_first_ms = cold_ms;
            tracing::info!(start, cold_first_ms = cold_ms, file = %count_file.display(), "start counted");
        } else {
            tracing::info!(start, file = %count_file.display(), "start counted");
        }
    }
    if let Some(path) = &cfg.weights_file {
        // The weights on disk, loaded once per start.
        match tokio::fs::read_to_string(path).await {
            Ok(text) if !text.trim().is_empty() => {
                let weights = text.trim().to_string();
                tracing::info!(%weights, file = %path.display(), "weights loaded");
                sim.settings.lock().unwrap_or_else(|e| e.into_inner()).weights = weights;
            }
            Ok(_) => tracing::info!(file = %path.display(), "weights file empty: keeping --weights"),
            Err(e) => tracing::info!(file = %path.display(), error = %e, "weights file unreadable: keeping --weights"),
        }
    }
    let listen_at = sim.clock.at(cfg.listen_after_ms);
    tokio::select! {
        _ = tokio::time::sleep_until(listen_at) => {}
        _ = cancel.cancelled() => {
            sim.log_phase(Phase::Stopping, mono_ms());
            return Ok(());
        }
    }
    let http = bind("http", &cfg.host, cfg.port).await?;
    let boot = match cfg.bootstrap_port {
        Some(p) => Some(bind("bootstrap", &cfg.host, p).await?),
        None => None,
    };
    let bound = Bound {
        http: http.local_addr().map_err(|source| SimError::Bind {
            what: "http",
            addr: cfg.host.clone(),
            source,
        })?,
        bootstrap: boot.as_ref().and_then(|l| l.local_addr().ok()),
    };
    if let Some(c) = &sim.bootstrap_client {
        let _ = c.addr.set(bound.http.to_string());
    }
    let listen_mono = mono_ms();
    *sim.listen_mono_ms.lock().unwrap_or_else(|e| e.into_inner()) = Some(listen_mono);
    sim.bound.send_replace(Some(bound));
    sim.log_phase(Phase::Listening, listen_mono);

    let mut servers = JoinSet::new();
    servers.spawn(serve(http, crate::http::router(sim.clone()), cancel.clone()));
    if let (Some(l), Some(b)) = (boot, &sim.bootstrap_server) {
        servers.spawn(serve(l, b.clone().router(), cancel.clone()));
    }
    let ready_at = sim.clock.at(cfg.ready_after_ms.max(cfg.listen_after_ms));
    tokio::select! {
        _ = tokio::time::sleep_until(ready_at) => {
            let m = mono_ms();
            *sim.ready_mono_ms.lock().unwrap_or_else(|e| e.into_inner()) = Some(m);
            sim.log_phase(Phase::Ready, m);
            cancel.cancelled().await;
        }
        _ = cancel.cancelled() => {}
    }
    sim.log_phase(Phase::Stopping, mono_ms());
    while servers.join_next().await.is_some() {}
    Ok(())
}

/// Serves `router` on `listener` until `cancel`; then drops every connection.
async fn serve(listener: TcpListener, router: axum::Router, cancel: CancellationToken) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let svc = TowerToHyperService::new(router.clone());
                    let cancel = cancel.clone();
                    conns.spawn(async move {
                        let conn = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc);
                        tokio::select! {
                            _ = conn => {}
                            _ = cancel.cancelled() => {}
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    conns.shutdown().await;
}
