//! What a running engine shares between its handlers ([`Sim`]): its config,
//! clock, settings, scheduler state, slots, phase and counters. Below both
//! the HTTP handlers and the process lifecycle that serves them, so neither
//! imports the other to reach it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{Semaphore, watch};

use crate::bootstrap::{BootstrapClient, BootstrapServer};
use crate::clock::{Scale, SimClock, mono_ms};
use crate::config::{Config, FaultPatch, Role, Settings};
use crate::engine::EngineState;
use crate::stats::{Phase, Stats, StatsSnapshot};

/// The addresses an engine listens on, once it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    pub http: SocketAddr,
    /// A prefill's bootstrap endpoint.
    pub bootstrap: Option<SocketAddr>,
}

/// Everything a running engine shares between its handlers.
pub struct Sim {
    pub config: Config,
    pub instance_id: String,
    pub clock: SimClock,
    pub(crate) settings: Mutex<Settings>,
    pub(crate) engine: Mutex<EngineState>,
    /// The one slot `--serial` generations take turns on.
    pub(crate) slot: Arc<Semaphore>,
    /// The `--max-running` slots (None = unlimited).
    pub(crate) running_slots: Option<Arc<Semaphore>>,
    pub(crate) phase: watch::Sender<Phase>,
    pub(crate) bound: watch::Sender<Option<Bound>>,
    pub stats: Arc<Stats>,
    /// Real ns since `clock.origin` of the scheduler's latest output — a batch result
    /// (a prefill chunk, decode steps, the health pass) or a request finishing or
    /// aborted: what SGLang's health handler checks (`last_receive_tstamp`).
    pub(crate) last_output_ns: AtomicU64,
    pub(crate) bootstrap_server: Option<Arc<BootstrapServer>>,
    pub(crate) bootstrap_client: Option<BootstrapClient>,
    pub(crate) start_mono_ms: f64,
    pub(crate) listen_mono_ms: Mutex<Option<f64>>,
    pub(crate) ready_mono_ms: Mutex<Option<f64>>,
    /// This start's number in `--start-count-file`, once counted.
    pub(crate) start_number: OnceLock<u64>,
}

impl Sim {
    pub(crate) fn new(config: Config) -> Arc<Sim> {
        let start_mono_ms = mono_ms();
        let instance_id = uuid::Uuid::new_v4().simple().to_string();
        let stats = Arc::new(Stats::default());
        let (bootstrap_server, bootstrap_client) = match config.role {
            Role::Prefill => (
                Some(BootstrapServer::new(
                    instance_id.clone(),
                    stats.clone(),
                    config.kv_transfer,
                )),
                None,
            ),
            Role::Decode => (
                None,
                Some(BootstrapClient::new(instance_id.clone(), config.kv_transfer)),
            ),
        };
        Arc::new(Sim {
            clock: SimClock::new(Scale(config.time_scale)),
            settings: Mutex::new(config.settings.clone()),
            engine: Mutex::new(EngineState::new(config.latency_script.clone())),
            slot: Arc::new(Semaphore::new(1)),
            running_slots: (config.max_running > 0).then(|| Arc::new(Semaphore::new(config.max_running))),
            phase: watch::channel(Phase::Starting).0,
            bound: watch::channel(None).0,
            stats,
            last_output_ns: AtomicU64::new(0),
            bootstrap_server,
            bootstrap_client,
            start_mono_ms,
            listen_mono_ms: Mutex::new(None),
            ready_mono_ms: Mutex::new(None),
            start_number: OnceLock::new(),
            instance_id,
            config,
        })
    }

    pub fn scale(&self) -> Scale {
        self.clock.scale
    }

    pub fn settings(&self) -> Settings {
        self.settings.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn phase(&self) -> Phase {
        *self.phase.borrow()
    }

    /// Waits until the engine is ready (start-up done).
    pub(crate) async fn wait_ready(&self) {
        let mut rx = self.phase.subscribe();
        let _ = rx.wait_for(|p| *p >= Phase::Ready).await;
    }

    /// Whether this start's near-tie positions take their second candidate
    /// (`--near-tie-positions`): even starts as counted in `--start-count-file`; without
    /// a count, a coin drawn from this start's instance id.
    pub fn near_ties_flipped(&self) -> bool {
        match self.start_number.get() {
            Some(n) => n % 2 == 0,
            None => {
                self.instance_id
                    .bytes()
                    .fold(0u32, |a, b| a.wrapping_mul(31).wrapping_add(u32::from(b)))
                    % 2
                    == 1
            }
        }
    }

    /// Records a scheduler output now.
    pub(crate) fn mark_output(&self) {
        let ns = self.clock.origin.elapsed().as_nanos() as u64;
        self.last_output_ns.fetch_max(ns.max(1), Ordering::SeqCst);
    }

    /// Real ns since origin of the latest scheduler output (0 = none yet).
    pub(crate) fn last_output_ns(&self) -> u64 {
        self.last_output_ns.load(Ordering::SeqCst)
    }

    /// Applies a `/sim/fault` patch.
    pub(crate) fn apply_fault(&self, patch: &FaultPatch) -> Result<(), crate::config::ConfigError> {
        if self.config.role == Role::Prefill {
            if patch.kv_fail_every.is_some_and(|n| n > 0) {
                return Err(crate::config::ConfigError::DecodeOnly("--kv-fail-every"));
            }
            if patch.kv_transfer_ms.is_some_and(|ms| ms != 0.0) {
                return Err(crate::config::ConfigError::DecodeOnly("--kv-transfer-ms"));
            }
            if patch.kv_stall == Some(true) {
                return Err(crate::config::ConfigError::DecodeOnly("--kv-stall"));
            }
            if patch.kv_corruption == Some(true) {
                return Err(crate::config::ConfigError::DecodeOnly("--kv-corruption"));
            }
        } else if patch.stale_transfer_state == Some(true) {
            return Err(crate::config::ConfigError::PrefillOnly("stale_transfer_state"));
        }
        if let (Some(stale), Some(server)) = (patch.stale_transfer_state, &self.bootstrap_server) {
            server.set_stale(stale);
        }
        let knob_name = self.config.settings.knob_env.clone();
        let knob_start_value = self.config.knob_env_value.clone();
        let script = match &patch.latency_script {
            Some(p) => Some(p.parse()?),
            None => None,
        };
        {
            let mut s = self.settings.lock().unwrap_or_else(|e| e.into_inner());
            patch.apply(&mut s, |name| {
                if Some(name) == knob_name.as_deref() {
                    knob_start_value.clone()
                } else {
                    std::env::var(name).ok()
                }
            })?;
        }
        {
            let mut engine = self.engine.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(script) = script {
                engine.script = script;
            }
            if patch.kv_fail_every.is_some() {
                // The Nth routed request after the patch is the first to fail.
                engine.routed = 0;
            }
        }
        tracing::info!(?patch, "fault settings changed");
        Ok(())
    }

    pub fn stats_snapshot(&self) -> StatsSnapshot {
        let settings = self.settings();
        let now = self.clock.now_ms();
        let (sessions_live, sessions_minted, script) = {
            let e = self.engine.lock().unwrap_or_else(|e| e.into_inner());
            (
                e.sessions.live(now, settings.session_idle_timeout_ms),
                e.sessions.minted,
                e.script.iter().copied().collect(),
            )
        };
        let bound = *self.bound.borrow();
        StatsSnapshot {
            role: self.config.role,
            model: self.config.model.clone(),
            instance_id: self.instance_id.clone(),
            pid: std::process::id(),
            phase: self.phase(),
            http_addr: bound.map(|b| b.http.to_string()),
            bootstrap_addr: bound.and_then(|b| b.bootstrap).map(|a| a.to_string()),
            time_scale: self.config.time_scale,
            start_mono_ms: self.start_mono_ms,
            listen_mono_ms: *self.listen_mono_ms.lock().unwrap_or_else(|e| e.into_inner()),
            ready_mono_ms: *self.ready_mono_ms.lock().unwrap_or_else(|e| e.into_inner()),
            start_number: self.start_number.get().copied(),
            sessions_live,
            sessions_minted,
            counters: self.stats.snapshot(),
            latency_script_remaining: script,
            settings,
        }
    }

    pub(crate) fn log_phase(&self, phase: Phase, mono: f64) {
        let elapsed = mono - self.start_mono_ms;
        let bound = *self.bound.borrow();
        let addr = bound.map(|b| b.http.to_string()).unwrap_or_default();
        tracing::info!(
            role = %self.config.role,
            addr = %addr,
            mono_ms = format_args!("{mono:.1}"),
            since_start_ms = format_args!("{elapsed:.1}"),
            "phase {}",
            phase.as_str()
        );
        self.phase.send_replace(phase);
    }
}
