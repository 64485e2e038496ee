//! Supervision of the host's units as child processes.
//!
//! Each unit has one actor task that executes its start/stop operations in
//! the order the commands arrived, so a restart and a stop can never
//! interleave. Everything the agent knows about a unit (phase, pid, which
//! command its events belong to) sits in one small mutex-guarded state;
//! phase events, and the readiness watch's check attempts, are sent while that
//! lock is held, so the event stream of a unit is always in the order the
//! facts changed, and a readiness watch can never report a phase or an attempt
//! after the process it watched has exited.
//!
//! Processes are exec'd from argv (never a shell string) in their own process
//! group, with stdout and stderr appended to `state_dir/logs/<unit>.log`.
//! Stops signal the process group, by PID (SIGTERM, then SIGKILL after the
//! grace), never by name. A reaper task per process observes its exit; an
//! exit nobody asked for is reported with an empty command id.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use pdwarden_proto::v1::{Phase, UnitEvent, UnitInfo, agent_message::Kind};
use thiserror::Error;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::checks::HttpChecker;
use crate::config::{AgentConfig, UnitConfig};
use crate::outbox::Outbox;
use crate::readiness::{self, Attempt, PhaseChange, ReadinessParams, ReadinessWatch, WatchEvent};

/// systemd's notification variables, never passed on to a unit.
pub const SERVICE_MANAGER_ENV: [&str; 3] = ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"];

/// Grace before SIGKILL when a command leaves it 0.
pub const DEFAULT_STOP_GRACE_MS: u64 = 10_000;
/// How often the exit of an adopted (not our child) process is checked.
const ADOPTED_POLL: Duration = Duration::from_millis(100);
/// How long to wait for the exit after SIGKILL before calling the stop failed.
const KILL_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Error)]
pub enum SupervisorError {
    #[error("unknown unit {unit:?}")]
    UnknownUnit { unit: String },
    #[error("unit {unit:?} is already running (pid {pid}); send restart to replace it")]
    AlreadyRunning { unit: String, pid: u32 },
    #[error("cannot open log file {}", path.display())]
    OpenLog {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot spawn unit {unit:?} ({program})")]
    Spawn {
        unit: String,
        program: String,
        #[source]
        source: std::io::Error,
    },
    /// Its `user` or `group` cannot be resolved now, or the agent cannot
    /// switch to it (issue 48): never run as the agent's own user instead.
    #[error("cannot spawn unit {unit:?}: {reason}")]
    RunAs { unit: String, reason: String },
    #[error("cannot signal unit {unit:?} (process group {pid})")]
    Signal {
        unit: String,
        pid: u32,
        #[source]
        source: nix::Error,
    },
    #[error("unit {unit:?} (pid {pid}) still running {} ms after SIGKILL", KILL_WAIT.as_millis())]
    StopTimedOut { unit: String, pid: u32 },
    #[error("the agent is shutting down")]
    ShuttingDown,
}

/// Why a unit's config change ([`Supervisor::change_config`]) was refused.
#[derive(Debug, Error)]
pub enum ConfigChangeError {
    /// No such unit.
    #[error(transparent)]
    Unit(#[from] SupervisorError),
    /// The change itself is refused (a bad edit, an unknown version).
    #[error(transparent)]
    Version(#[from] crate::unitconfig::VersionError),
    /// The new versions could not be saved; nothing changed.
    #[error("cannot save config versions of {unit}: {source}")]
    Save {
        unit: String,
        #[source]
        source: std::io::Error,
    },
}

/// The command a unit's events belong to, and when the agent received it
/// (the zero of `ms_since_command`).
#[derive(Debug, Clone)]
pub struct CommandContext {
    pub id: String,
    pub received_at: Instant,
}

impl CommandContext {
    pub fn new(id: impl Into<String>, received_at: Instant) -> Self {
        CommandContext {
            id: id.into(),
            received_at,
        }
    }

    fn ms_at(&self, now: Instant) -> u64 {
        duration_ms(now.saturating_duration_since(self.received_at))
    }
}

/// The wall clock in unix ms (a pid file outlives the agent's monotonic
/// clock).
fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, duration_ms)
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// How a process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// "exit status 1", "killed by signal 9 (SIGKILL)".
    pub detail: String,
}

impl ExitInfo {
    fn from_wait(result: std::io::Result<ExitStatus>) -> Self {
        match result {
            Ok(status) => {
                let code = status.code();
                let signal = status.signal();
                let detail = match (code, signal) {
                    (Some(c), _) => format!("exit status {c}"),
                    (None, Some(s)) => match Signal::try_from(s) {
                        Ok(sig) => format!("killed by signal {s} ({})", sig.as_str()),
                        Err(_) => format!("killed by signal {s}"),
                    },
                    (None, None) => format!("exited ({status})"),
                };
                ExitInfo { code, signal, detail }
            }
            Err(e) => ExitInfo {
                code: None,
                signal: None,
                detail: format!("waiting for the process failed: {e}"),
            },
        }
    }
}

/// What a stop did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopOutcome {
    NotRunning,
    Stopped {
        /// Exited within the grace after SIGTERM (no SIGKILL needed).
        graceful: bool,
        exit: ExitInfo,
    },
}

/// Whose events a unit's phase changes are right now.
#[derive(Debug, Clone)]
enum Attribution {
    /// Nobody's: a crash now is reported with an empty command id.
    Spontaneous,
    /// A start command whose readiness watch is running.
    Starting(CommandContext),
    /// A stop (or the stop half of a restart) in progress.
    Stopping(CommandContext),
}

#[derive(Debug)]
struct Running {
    pid: u32,
    /// Which spawn this is (see `UnitState::runs`).
    run: u64,
    exited: watch::Receiver<Option<ExitInfo>>,
    /// When its process started (ms since the Unix epoch; 0: unreadable),
    /// read once from /proc (issue 46: `UnitInfo.process_started_unix_ms`).
    started_unix_ms: u64,
}

#[derive(Debug)]
struct UnitState {
    /// The last phase reported for this unit.
    phase: Phase,
    running: Option<Running>,
    /// Spawns so far; lets late reports from an old process be ignored.
    runs: u64,
    attribution: Attribution,
    /// The readiness watch of the current start, if one runs.
    watch: Option<AbortHandle>,
    /// The config version the running process was spawned from (None when
    /// adopted from a previous agent, or not running).
    spawned_version: Option<u32>,
    /// The start command that spawned the current (or last) instance; ""
    /// after a plain stop.
    start_command: String,
    /// When the agent that spawned the adopted instance received its start
    /// (unix ms, from the pid file): a followed start's phases count from
    /// there, not from the adoption.
    start_received_unix_ms: Option<u64>,
    /// How the last instance ended, while the phase is exited (reported in
    /// `UnitInfo.exit_detail` to an orchestrator that attaches later).
    exit_detail: String,
    /// The running instance was adopted from a previous agent and its pid
    /// file named the start that spawned it (`start_command`): a re-sent
    /// start of that id is followed, not executed again.
    adopted_start: bool,
}

/// One configured unit and its live state.
#[derive(Debug)]
pub struct Unit {
    config: UnitConfig,
    log_path: PathBuf,
    /// `state_dir/run/<unit>.pid` while a process runs.
    pid_path: PathBuf,
    outbox: Outbox,
    http: reqwest::Client,
    state: Mutex<UnitState>,
    /// The unit's launch config versions (change gate, issue 7).
    versions: Mutex<crate::unitconfig::Versions>,
    state_dir: PathBuf,
    /// Hides secrets in what the agent reports from the unit's own words
    /// (its log tail): `redact_env`.
    redactor: crate::redact::Redactor,
}

impl Unit {
    fn new(
        config: UnitConfig,
        state_dir: &Path,
        outbox: Outbox,
        http: reqwest::Client,
        redactor: crate::redact::Redactor,
    ) -> Self {
        Unit {
            redactor,
            log_path: state_dir.join("logs").join(format!("{}.log", config.name)),
            pid_path: state_dir.join("run").join(format!("{}.pid", config.name)),
            versions: Mutex::new(crate::unitconfig::Versions::load(state_dir, &config)),
            state_dir: state_dir.to_path_buf(),
            config,
            outbox,
            http,
            state: Mutex::new(UnitState {
                phase: Phase::Stopped,
                running: None,
                runs: 0,
                attribution: Attribution::Spontaneous,
                watch: None,
                spawned_version: None,
                start_command: String::new(),
                start_received_unix_ms: None,
                exit_detail: String::new(),
                adopted_start: false,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, UnitState> {
        // A panic while holding this lock leaves plain data behind; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn info(&self) -> UnitInfo {
        let st = self.lock();
        UnitInfo {
            name: self.config.name.clone(),
            role: self.config.role.to_proto() as i32,
            base_url: self.config.base_url.clone(),
            phase: st.phase as i32,
            pid: st.running.as_ref().map_or(0, |r| r.pid),
            bootstrap_port: self.config.bootstrap_port.map_or(0, u32::from),
            command_id: match &st.attribution {
                // An adopted instance's own watch: the start it belongs to
                // is the one its pid file named.
                Attribution::Starting(c) if c.id.is_empty() => st.start_command.clone(),
                Attribution::Starting(c) | Attribution::Stopping(c) => c.id.clone(),
                Attribution::Spontaneous => st.start_command.clone(),
            },
            command_in_progress: !matches!(st.attribution, Attribution::Spontaneous),
            exit_detail: if st.phase == Phase::Exited {
                st.exit_detail.clone()
            } else {
                String::new()
            },
            process_started_unix_ms: st.running.as_ref().map_or(0, |r| r.started_unix_ms),
        }
    }

    fn running_pid(&self) -> Option<u32> {
        self.lock().running.as_ref().map(|r| r.pid)
    }

    /// Builds one event; send it with the state lock held.
    fn event(&self, ctx: Option<&CommandContext>, now: Instant, pid: u32, phase: Phase) -> UnitEvent {
        UnitEvent {
            unit: self.config.name.clone(),
            phase: phase as i32,
            command_id: ctx.map(|c| c.id.clone()).unwrap_or_default(),
            ms_since_command: ctx.map_or(0, |c| c.ms_at(now)),
            pid,
            // Only where the process is new to the orchestrator: the spawn,
            // or the phase changes that may follow an adoption.
            // Read once, on the spawn (the fleet keeps it until the pid
            // changes), not on every check attempt.
            process_started_unix_ms: match phase {
                Phase::Spawned if pid != 0 => crate::evidence::process_started_unix_ms(pid).unwrap_or(0),
                _ => 0,
            },
            ..Default::default()
        }
    }

    fn send(&self, event: UnitEvent) {
        info!(
            unit = %event.unit,
            phase = ?Phase::try_from(event.phase).unwrap_or(Phase::Unspecified),
            attempt = event.attempt.is_some(),
            command_id = %event.command_id,
            ms = event.ms_since_command,
            detail = %event.detail,
            "unit event"
        );
        self.outbox.send(Kind::UnitEvent(event));
    }

    async fn start(
        self: &Arc<Self>,
        ctx: CommandContext,
        restart: bool,
        grace: Duration,
        params: ReadinessParams,
    ) -> Result<u32, SupervisorError> {
        // The running instance was spawned by this very command (a previous
        // agent, killed mid-start, recorded it with the pid): the start is
        // under way or done already. Never again: its readiness is followed
        // under the command's own parameters instead (issue 16: an agent
        // restarted mid-start ran the orchestrator's re-sent start a second
        // time — a second model load).
        if let Some(pid) = self.follow_own_start(&ctx, &params) {
            return Ok(pid);
        }
        if let Some(pid) = self.running_pid() {
            if !restart {
                return Err(SupervisorError::AlreadyRunning {
                    unit: self.config.name.clone(),
                    pid,
                });
            }
            self.stop(&ctx, grace).await?;
        }
        self.spawn(ctx, params)
    }

    fn versions(&self) -> MutexGuard<'_, crate::unitconfig::Versions> {
        self.versions.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn open_log(&self, ctx: &CommandContext, version: u32, argv: &[String]) -> Result<std::fs::File, SupervisorError> {
        let err = |source| SupervisorError::OpenLog {
            path: self.log_path.clone(),
            source,
        };
        if let Some(dir) = self.log_path.parent() {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(err)?;
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        writeln!(
            log,
            "--- pdwarden-agent: starting unit {} (command {:?}, config version {version}) at unix time {wall}: {:?}",
            self.config.name, ctx.id, argv
        )
        .map_err(err)?;
        Ok(log)
    }

    fn spawn(self: &Arc<Self>, ctx: CommandContext, params: ReadinessParams) -> Result<u32, SupervisorError> {
        let cfg = &self.config;
        let (version, spec) = {
            let v = self.versions();
            (v.current, v.current_spec().clone())
        };
        // Looked up again at each spawn: an account removed or changed
        // since load is refused here, never replaced by the agent's own.
        let run_as_err = |reason| SupervisorError::RunAs {
            unit: cfg.name.clone(),
            reason,
        };
        let run_as = cfg.run_as().map_err(run_as_err)?;
        if let Some(to) = &run_as {
            crate::runas::Privilege::of_this_process()
                .may_run_as(to)
                .map_err(run_as_err)?;
        }
        let log = self.open_log(&ctx, version, &spec.argv)?;
        let log_err = log.try_clone().map_err(|source| SupervisorError::OpenLog {
            path: self.log_path.clone(),
            source,
        })?;
        let mut cmd = tokio::process::Command::new(&spec.argv[0]);
        // The agent's service manager talks to the agent, not its engines
        // (a child that wrote READY=1 or pinged the watchdog would speak
        // for it, and under NotifyAccess=all be believed).
        for k in SERVICE_MANAGER_ENV {
            cmd.env_remove(k);
        }
        if let Some(to) = &run_as {
            // The account's own, unless the unit's env (set below) says
            // otherwise; the gid before the uid, and the supplementary
            // groups emptied (std does so when the uid is set).
            cmd.env("HOME", &to.home)
                .env("USER", &to.user)
                .env("LOGNAME", &to.user)
                .gid(to.gid)
                .uid(to.uid);
        }
        for k in &spec.unset_env {
            cmd.env_remove(k);
        }
        cmd.args(&spec.argv[1..])
            .envs(&spec.env)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            .process_group(0)
            .kill_on_drop(false);
        if let Some(cwd) = &cfg.cwd {
            cmd.current_dir(cwd);
        }
        let child = cmd.spawn().map_err(|source| SupervisorError::Spawn {
            unit: cfg.name.clone(),
            program: spec.argv[0].clone(),
            source,
        })?;
        let pid = child.id().unwrap_or_default();
        let (exit_tx, exit_rx) = watch::channel(None);
        let detail = if version == 0 {
            format!("pid {pid}")
        } else {
            format!("pid {pid} (config version {version})")
        };
        let ctx_id = ctx.id.clone();
        let ctx_received = ctx.received_at;
        let run = self.begin_run(ctx, pid, exit_rx, params, detail, spec.fingerprint());
        self.lock().spawned_version = Some(version);
        let received_unix_ms = unix_ms_now().saturating_sub(duration_ms(ctx_received.elapsed()));
        self.write_pid_file(pid, &ctx_id, version, received_unix_ms);
        tokio::spawn(reap(Arc::clone(self), run, child, exit_tx));
        Ok(pid)
    }

    /// Records a new running process, reports `spawned` and starts its
    /// readiness watch. Returns the run id.
    fn begin_run(
        self: &Arc<Self>,
        ctx: CommandContext,
        pid: u32,
        exited: watch::Receiver<Option<ExitInfo>>,
        params: ReadinessParams,
        detail: String,
        fingerprint: String,
    ) -> u64 {
        let now = Instant::now();
        let mut st = self.lock();
        st.runs += 1;
        st.adopted_start = false;
        let run = st.runs;
        let started_unix_ms = crate::evidence::process_started_unix_ms(pid).unwrap_or(0);
        st.running = Some(Running {
            pid,
            run,
            exited,
            started_unix_ms,
        });
        st.spawned_version = None;
        st.phase = Phase::Spawned;
        st.attribution = Attribution::Starting(ctx.clone());
        st.start_command = ctx.id.clone();
        let mut event = self.event(Some(&ctx), now, pid, Phase::Spawned);
        event.detail = detail;
        event.config_fingerprint = fingerprint;
        self.send(event);

        st.watch = Some(self.watch_readiness(run, &ctx, params));
        run
    }

    /// Starts the readiness watch of spawn `run` for start `ctx`.
    fn watch_readiness(self: &Arc<Self>, run: u64, ctx: &CommandContext, params: ReadinessParams) -> AbortHandle {
        let cfg = &self.config;
        let checker = HttpChecker::new(
            self.http.clone(),
            &cfg.base_url,
            cfg.health_path(),
            &cfg.generation_check(),
            &params,
        );
        let unit = Arc::clone(self);
        let w = ReadinessWatch::new(ctx.received_at, params.deadline);
        tokio::spawn(async move {
            readiness::watch(&checker, w, params.poll_interval, |event| {
                unit.on_watch_event(run, event)
            })
            .await;
        })
        .abort_handle()
    }

    /// If the running instance was spawned by start `ctx` (recorded in its
    /// pid file, read back on adoption), follows that start again: its
    /// readiness watched under `params` and its phases reported under
    /// `ctx`'s id. Returns the pid; `None` for any other instance.
    fn follow_own_start(self: &Arc<Self>, ctx: &CommandContext, params: &ReadinessParams) -> Option<u32> {
        let mut st = self.lock();
        let (pid, run) = st.running.as_ref().map(|r| (r.pid, r.run))?;
        if ctx.id.is_empty() || st.start_command != ctx.id || !st.adopted_start {
            return None;
        }
        if let Some(w) = st.watch.take() {
            w.abort();
        }
        st.adopted_start = false;
        // The start's zero is when the first agent received it (issue 32:
        // the timeline said the prefill generated 110 ms after a start
        // that took 3 s, counted from the adoption).
        let ctx = match st.start_received_unix_ms.take() {
            Some(received) => {
                let ago = Duration::from_millis(unix_ms_now().saturating_sub(received));
                CommandContext::new(
                    ctx.id.clone(),
                    Instant::now().checked_sub(ago).unwrap_or(ctx.received_at),
                )
            }
            None => ctx.clone(),
        };
        let ctx = &ctx;
        st.attribution = Attribution::Starting(ctx.clone());
        // No second `spawned`: nothing was spawned. The start's readiness
        // phases follow under its id, from where the process is now.
        info!(unit = %self.config.name, pid, command_id = %ctx.id, "start already executed by a previous agent: following it, not starting again");
        st.watch = Some(self.watch_readiness(run, ctx, params.clone()));
        Some(pid)
    }

    /// Remembers the running process in `state_dir/run/<unit>.pid` (pid,
    /// kernel start time and the start command that spawned it), so an
    /// agent restarted after `leave-running` (or killed) can adopt it and
    /// knows which start it belongs to. Best effort: without it the unit
    /// still runs, unadoptable.
    fn write_pid_file(&self, pid: u32, command_id: &str, version: u32, received_unix_ms: u64) {
        let Some(start) = process_start_time(pid) else {
            return;
        };
        let write = || -> std::io::Result<()> {
            if let Some(dir) = self.pid_path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(
                &self.pid_path,
                format!("{pid} {start} command={command_id} version={version} received_unix_ms={received_unix_ms}\n"),
            )
        };
        if let Err(e) = write() {
            warn!(unit = %self.config.name, path = %self.pid_path.display(), error = %e, "cannot write pid file");
        }
    }

    fn remove_pid_file(&self) {
        match std::fs::remove_file(&self.pid_path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => warn!(unit = %self.config.name, error = %e, "cannot remove pid file"),
        }
    }

    /// Takes over a process left running by a previous agent (its pid file
    /// names a live process with the same start time): reports it `spawned`
    /// (command id "") and watches its readiness, so the phase registered is
    /// observed rather than assumed. Its exit is detected by polling /proc,
    /// since it is not our child (the exit status is then unknown).
    fn adopt(self: &Arc<Self>) -> Option<u32> {
        let text = std::fs::read_to_string(&self.pid_path).ok()?;
        // `PID START command=ID version=V` (the start that spawned it and
        // the config version it was spawned from: a gate's live check of an
        // adopted process needs it).
        let field = |key: &str| {
            text.split_whitespace()
                .skip(2)
                .find_map(|f| f.strip_prefix(key).map(str::to_string))
        };
        let command_id = field("command=").unwrap_or_default();
        let version: Option<u32> = field("version=").and_then(|v| v.parse().ok());
        let received_unix_ms: Option<u64> = field("received_unix_ms=").and_then(|v| v.parse().ok());
        let mut fields = text.split_whitespace().take(2).map(str::parse::<u64>);
        let (Some(Ok(pid)), Some(Ok(start))) = (fields.next(), fields.next()) else {
            self.remove_pid_file();
            return None;
        };
        let pid = u32::try_from(pid).ok().filter(|&p| p > 1)?;
        if process_start_time(pid) != Some(start) {
            // The previous agent left it running and it is gone (or its PID
            // now names another process): it died while nobody watched.
            // Registered as exited, not as never started.
            warn!(unit = %self.config.name, pid, "the unit's process recorded by the previous agent is gone: it died while no agent was watching (exit status unknown)");
            self.remove_pid_file();
            self.lock().phase = Phase::Exited;
            return None;
        }
        let (exit_tx, exit_rx) = watch::channel(None);
        let ctx = CommandContext::new("", Instant::now());
        let detail = format!("pid {pid} (adopted from a previous agent)");
        // What an adopted process was launched with is not known for certain.
        let run = self.begin_run(ctx, pid, exit_rx, ReadinessParams::default(), detail, String::new());
        {
            let mut st = self.lock();
            st.adopted_start = !command_id.is_empty();
            st.start_command = command_id.clone();
            st.spawned_version = version;
            st.start_received_unix_ms = received_unix_ms;
        }
        info!(unit = %self.config.name, pid, start_command = %command_id, "adopted a running unit");
        tokio::spawn(watch_adopted(Arc::clone(self), run, pid, start, exit_tx));
        Some(pid)
    }

    /// Reports what the readiness watch of spawn `run` saw; false once that
    /// watch is no longer current (stopped, exited or replaced).
    fn on_watch_event(&self, run: u64, event: WatchEvent) -> bool {
        match event {
            WatchEvent::Phase(change) => self.on_phase_change(run, change),
            WatchEvent::Attempt(attempt) => self.on_attempt(run, &attempt),
        }
    }

    /// Reports one check attempt of spawn `run`'s watch as a `UnitEvent`
    /// with `attempt` set, stamped when the attempt ended. The unit's phase
    /// and attribution stay as they are: an attempt is evidence, not a
    /// transition. False once that watch is no longer current.
    fn on_attempt(&self, run: u64, attempt: &Attempt) -> bool {
        let st = self.lock();
        let Some(pid) = st.running.as_ref().filter(|r| r.run == run).map(|r| r.pid) else {
            return false;
        };
        let Attribution::Starting(ctx) = &st.attribution else {
            return false;
        };
        let mut event = self.event(Some(ctx), ctx.received_at + attempt.since_command, pid, st.phase);
        event.detail.clone_from(&attempt.detail);
        event.attempt = Some(attempt.to_proto());
        self.send(event);
        true
    }

    /// Reports a readiness transition of spawn `run`; false once that watch
    /// is no longer current (stopped, exited or replaced).
    fn on_phase_change(&self, run: u64, change: PhaseChange) -> bool {
        let mut st = self.lock();
        let Some(pid) = st.running.as_ref().filter(|r| r.run == run).map(|r| r.pid) else {
            return false;
        };
        let Attribution::Starting(ctx) = st.attribution.clone() else {
            return false;
        };
        st.phase = change.phase;
        let finished = matches!(change.phase, Phase::Generating | Phase::NotReady);
        if finished {
            st.attribution = Attribution::Spontaneous;
            st.watch = None;
        }
        let mut event = self.event(Some(&ctx), ctx.received_at + change.since_command, pid, change.phase);
        event.detail = change.detail;
        event.http_status = change.http_status;
        event.check_latency_ms = change.check_latency.map_or(0, duration_ms);
        event.check_tokens = change.check_tokens;
        event.engine_version = change.engine_version;
        self.send(event);
        !finished
    }

    /// A log line as it may leave the host: the unit's own secret values
    /// hidden whole, whatever they contain, wherever they appear (an engine
    /// that prints "using token hf_…" names no variable), then `NAME=VALUE`
    /// of secret names (issue 32: the other way round, a value holding a
    /// separator leaked its tail), then every secret by its shape (issue
    /// 48: SGLang's own `ServerArgs(api_key='…')`, a JSON `"api_key"`, a
    /// bearer header, URL credentials; `pdwarden_security::shapes`).
    fn redact_log(&self, text: &str) -> String {
        let env = self.config.env.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        let by_value = self.redactor.text_with_env(text, env);
        match pdwarden_security::shapes::by_shape(&by_value) {
            std::borrow::Cow::Borrowed(_) => by_value,
            std::borrow::Cow::Owned(s) => s,
        }
    }

    /// Called by the reaper when spawn `run` exits.
    fn on_exit(&self, run: u64, exit: &ExitInfo, now: Instant) {
        // Read before locking: an exit nobody asked for is reported with the
        // end of the unit's log, which usually says why (a crash loop's cause).
        let tail = log_tail(&self.log_path, LOG_TAIL_LINES).map(|t| self.redact_log(&t));
        let mut st = self.lock();
        let Some(pid) = st.running.as_ref().filter(|r| r.run == run).map(|r| r.pid) else {
            return;
        };
        let (ctx, requested) = match std::mem::replace(&mut st.attribution, Attribution::Spontaneous) {
            Attribution::Starting(c) => (Some(c), false),
            Attribution::Stopping(c) => (Some(c), true),
            Attribution::Spontaneous => (None, false),
        };
        if let Some(w) = st.watch.take() {
            w.abort();
        }
        st.running = None;
        st.phase = Phase::Exited;
        self.remove_pid_file();
        let mut event = self.event(ctx.as_ref(), now, pid, Phase::Exited);
        event.exit_code = exit.code;
        event.detail = match (&tail, requested) {
            (Some(t), false) => format!("{}; log tail: {t}", exit.detail),
            _ => exit.detail.clone(),
        };
        st.exit_detail = event.detail.clone();
        if ctx.is_none() {
            warn!(unit = %self.config.name, pid, detail = %exit.detail, "unit exited unexpectedly");
        }
        self.send(event);
    }

    async fn stop(&self, ctx: &CommandContext, grace: Duration) -> Result<StopOutcome, SupervisorError> {
        let (pid, mut exited) = {
            let mut st = self.lock();
            let Some(running) = &st.running else {
                return Ok(StopOutcome::NotRunning);
            };
            let (pid, exited) = (running.pid, running.exited.clone());
            st.attribution = Attribution::Stopping(ctx.clone());
            st.start_command.clear();
            if let Some(w) = st.watch.take() {
                w.abort();
            }
            st.phase = Phase::Stopping;
            let mut event = self.event(Some(ctx), Instant::now(), pid, Phase::Stopping);
            event.detail = format!("SIGTERM to process group {pid}, SIGKILL after {} ms", grace.as_millis());
            self.send(event);
            (pid, exited)
        };
        self.signal(pid, Signal::SIGTERM)?;
        let graceful = tokio::time::timeout(grace, exited.wait_for(Option::is_some))
            .await
            .is_ok();
        if !graceful {
            info!(unit = %self.config.name, pid, "grace expired; sending SIGKILL");
            self.signal(pid, Signal::SIGKILL)?;
            tokio::time::timeout(KILL_WAIT, exited.wait_for(Option::is_some))
                .await
                .map_err(|_| SupervisorError::StopTimedOut {
                    unit: self.config.name.clone(),
                    pid,
                })?
                .ok();
        }
        // Whatever the unit left behind in its group (engine worker
        // processes) goes too; the group is gone if nothing is left.
        let _ = self.signal(pid, Signal::SIGKILL);
        let exit = exited.borrow().clone().unwrap_or_else(|| ExitInfo {
            code: None,
            signal: None,
            detail: "exited".into(),
        });
        Ok(StopOutcome::Stopped { graceful, exit })
    }

    /// Signals the unit's process group; a group that is already gone is fine.
    fn signal(&self, pid: u32, signal: Signal) -> Result<(), SupervisorError> {
        let pgid = i32::try_from(pid).unwrap_or(0);
        if pgid <= 1 {
            // Never signal group 0 (our own) or 1.
            return Ok(());
        }
        match killpg(Pid::from_raw(pgid), signal) {
            Ok(()) | Err(nix::Error::ESRCH) => Ok(()),
            Err(source) => Err(SupervisorError::Signal {
                unit: self.config.name.clone(),
                pid,
                source,
            }),
        }
    }
}

/// Lines of a unit's log quoted when it exits unasked.
const LOG_TAIL_LINES: usize = 5;
/// How much of the log's end is read for them: enough to reach past a Rust
/// backtrace (RUST_BACKTRACE=1 prints ~2 lines per frame after the error).
const LOG_TAIL_BYTES: u64 = 32 * 1024;

/// The last `lines` non-empty lines of `path`, joined by " | " (None if the
/// log is missing or empty). Reads only the file's end, whatever its size.
fn log_tail(path: &std::path::Path, lines: usize) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    let from = len.saturating_sub(LOG_TAIL_BYTES);
    f.seek(SeekFrom::Start(from)).ok()?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).ok()?;
    // Read from the middle of a line, its start is not there: the line is
    // left out whole, as its redaction could not see a secret it began
    // before the read (issue 48: "…ss@db/app" of a URL's password).
    if from > 0 {
        let line_end = buf.iter().position(|&b| b == b'\n').map_or(buf.len(), |i| i + 1);
        buf.drain(..line_end);
    }
    tail_lines(&String::from_utf8_lossy(&buf), lines)
}

/// The last `lines` lines of `text` that say something about why a process
/// ended. Skipped: blank lines, the agent's own "--- pdwarden-agent: starting
/// unit …" markers, and backtrace frames — with RUST_BACKTRACE=1 a Rust
/// engine's last lines are all `N: symbol` / `at file:line`, and the error
/// itself comes before them.
fn tail_lines(text: &str, lines: usize) -> Option<String> {
    let mut last: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("--- pdwarden-agent") && !is_backtrace_line(l))
        .rev()
        .take(lines)
        .collect();
    last.reverse();
    (!last.is_empty()).then(|| last.join(" | "))
}

/// A line of a Rust backtrace (std's or anyhow's), already trimmed.
fn is_backtrace_line(line: &str) -> bool {
    let frame = line
        .split_once(": ")
        .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    frame
        || line.starts_with("at ")
        || line.eq_ignore_ascii_case("stack backtrace:")
        || line.starts_with("note: Some details are omitted")
        || line.starts_with("note: run with `RUST_BACKTRACE=")
}

/// Waits for spawn `run` to exit and reports it.
async fn reap(unit: Arc<Unit>, run: u64, mut child: tokio::process::Child, exited: watch::Sender<Option<ExitInfo>>) {
    let info = ExitInfo::from_wait(child.wait().await);
    unit.on_exit(run, &info, Instant::now());
    exited.send_replace(Some(info));
}

/// Polls a process that is not our child until it is gone, then reports
/// the exit of spawn `run`.
async fn watch_adopted(unit: Arc<Unit>, run: u64, pid: u32, start: u64, exited: watch::Sender<Option<ExitInfo>>) {
    let mut tick = tokio::time::interval(ADOPTED_POLL);
    loop {
        tick.tick().await;
        if process_start_time(pid) != Some(start) {
            break;
        }
    }
    let info = ExitInfo {
        code: None,
        signal: None,
        detail: "exited (adopted process: exit status unknown)".into(),
    };
    unit.on_exit(run, &info, Instant::now());
    exited.send_replace(Some(info));
}

/// The kernel start time of a live, non-zombie process (clock ticks since
/// boot, /proc/PID/stat field 22): with the pid it names one process, never
/// a later one that reused the pid.
fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    // fields[0] is field 3 (state); field 22 is fields[19].
    if matches!(fields.first(), Some(&"Z") | Some(&"X")) {
        return None;
    }
    fields.get(19)?.parse().ok()
}

enum UnitOp {
    Start {
        ctx: CommandContext,
        restart: bool,
        grace: Duration,
        params: ReadinessParams,
        done: oneshot::Sender<Result<u32, SupervisorError>>,
    },
    Stop {
        ctx: CommandContext,
        grace: Duration,
        done: oneshot::Sender<Result<StopOutcome, SupervisorError>>,
    },
}

/// Executes one unit's operations in arrival order.
async fn actor(unit: Arc<Unit>, mut ops: mpsc::UnboundedReceiver<UnitOp>) {
    while let Some(op) = ops.recv().await {
        match op {
            UnitOp::Start {
                ctx,
                restart,
                grace,
                params,
                done,
            } => {
                let _ = done.send(unit.start(ctx, restart, grace, params).await);
            }
            UnitOp::Stop { ctx, grace, done } => {
                let _ = done.send(unit.stop(&ctx, grace).await);
            }
        }
    }
}

struct UnitHandle {
    unit: Arc<Unit>,
    ops: mpsc::UnboundedSender<UnitOp>,
}

/// All of the host's units.
pub struct Supervisor {
    units: BTreeMap<String, UnitHandle>,
}

impl Supervisor {
    /// Sets up the configured units (none running) and their actors. Must be
    /// called within a tokio runtime.
    pub(crate) fn new(config: &AgentConfig, outbox: Outbox, http: reqwest::Client) -> Self {
        let units = config
            .units
            .iter()
            .map(|uc| {
                let unit = Arc::new(Unit::new(
                    uc.clone(),
                    &config.state_dir,
                    outbox.clone(),
                    http.clone(),
                    crate::redact::Redactor::new(&config.redact_env),
                ));
                let (ops, rx) = mpsc::unbounded_channel();
                tokio::spawn(actor(Arc::clone(&unit), rx));
                (uc.name.clone(), UnitHandle { unit, ops })
            })
            .collect();
        Supervisor { units }
    }

    fn handle(&self, name: &str) -> Result<&UnitHandle, SupervisorError> {
        self.units
            .get(name)
            .ok_or_else(|| SupervisorError::UnknownUnit { unit: name.to_owned() })
    }

    pub fn unit_config(&self, name: &str) -> Option<&UnitConfig> {
        self.units.get(name).map(|h| &h.unit.config)
    }

    /// The pid of `name`'s running process (one it started or adopted).
    pub fn unit_pid(&self, name: &str) -> Option<u32> {
        self.units.get(name).and_then(|h| h.unit.running_pid())
    }

    /// Applies a config change (a new version, or a restored one) to `name`
    /// and saves the versions; the running process is untouched until its
    /// next start. Returns (previous, current, current spec).
    pub fn change_config(
        &self,
        name: &str,
        change: impl FnOnce(&mut crate::unitconfig::Versions) -> Result<(u32, u32), crate::unitconfig::VersionError>,
    ) -> Result<(u32, u32, crate::unitconfig::LaunchSpec), ConfigChangeError> {
        let unit = &self.handle(name)?.unit;
        let mut v = unit.versions();
        let mut next = v.clone();
        let (previous, current) = change(&mut next)?;
        next.save(&unit.state_dir).map_err(|source| ConfigChangeError::Save {
            unit: name.to_owned(),
            source,
        })?;
        *v = next;
        Ok((previous, current, v.current_spec().clone()))
    }

    /// What would stop `name` from starting now with its current config
    /// ([`crate::preflight`]); `None` for a unit this agent does not have.
    pub fn preflight(&self, name: &str) -> Option<Vec<String>> {
        let unit = &self.units.get(name)?.unit;
        let spec = unit.versions().current_spec().clone();
        let running = unit.lock().running.is_some();
        Some(crate::preflight::problems(&unit.config, &spec, running))
    }

    /// The unit's running process and the config version it was spawned
    /// from (None when adopted), if it runs.
    pub fn running_process(&self, name: &str) -> Option<(u32, Option<u32>)> {
        let unit = &self.units.get(name)?.unit;
        let st = unit.lock();
        st.running.as_ref().map(|r| (r.pid, st.spawned_version))
    }

    /// The last `lines` lines of unit `name`'s log, redacted as its crash
    /// tail is (evidence before the kill, issue 35); None for a unit this
    /// agent does not have, or a log that is missing or empty. Reads a file:
    /// call it on a blocking thread.
    pub fn log_tail(&self, name: &str, lines: usize) -> Option<String> {
        let unit = &self.units.get(name)?.unit;
        log_tail(&unit.log_path, lines).map(|t| unit.redact_log(&t))
    }

    /// `text` from or about unit `name` as it may leave the host: redacted as
    /// the unit's log tail is. None for a unit this agent does not have.
    pub fn redact_for(&self, name: &str, text: &str) -> Option<String> {
        Some(self.units.get(name)?.unit.redact_log(text))
    }

    /// Current facts about every unit, for `Register`.
    pub fn unit_infos(&self) -> Vec<UnitInfo> {
        self.units.values().map(|h| h.unit.info()).collect()
    }

    /// Queues a start now (so starts and stops keep arrival order) and
    /// returns a future resolving to the pid once spawned. With `restart`, a
    /// running unit is stopped first; without, a running unit is an error.
    pub fn start(
        &self,
        name: &str,
        ctx: CommandContext,
        restart: bool,
        grace: Duration,
        params: ReadinessParams,
    ) -> impl Future<Output = Result<u32, SupervisorError>> + Send + use<> {
        let queued = self.handle(name).map(|h| {
            let (done, rx) = oneshot::channel();
            let _ = h.ops.send(UnitOp::Start {
                ctx,
                restart,
                grace,
                params,
                done,
            });
            rx
        });
        async move { queued?.await.unwrap_or(Err(SupervisorError::ShuttingDown)) }
    }

    /// Queues a stop now; resolves once the process has exited.
    pub fn stop(
        &self,
        name: &str,
        ctx: CommandContext,
        grace: Duration,
    ) -> impl Future<Output = Result<StopOutcome, SupervisorError>> + Send + use<> {
        let queued = self.handle(name).map(|h| {
            let (done, rx) = oneshot::channel();
            let _ = h.ops.send(UnitOp::Stop { ctx, grace, done });
            rx
        });
        async move { queued?.await.unwrap_or(Err(SupervisorError::ShuttingDown)) }
    }

    /// Adopts the units a previous agent left running (see `Unit::adopt`);
    /// returns their names and pids.
    pub fn adopt_all(&self) -> Vec<(String, u32)> {
        self.units
            .iter()
            .filter_map(|(name, h)| h.unit.adopt().map(|pid| (name.clone(), pid)))
            .collect()
    }

    /// Stops every running unit (concurrently), for `on_exit = "stop-units"`.
    pub async fn stop_all(&self, grace: Duration) {
        let now = Instant::now();
        let stops: Vec<_> = self
            .units
            .keys()
            .map(|name| {
                let name = name.clone();
                let stop = self.stop(&name, CommandContext::new("", now), grace);
                async move { (name, stop.await) }
            })
            .collect();
        for (name, result) in futures::future::join_all(stops).await {
            match result {
                Ok(StopOutcome::NotRunning) => {}
                Ok(StopOutcome::Stopped { exit, .. }) => {
                    info!(unit = %name, detail = %exit.detail, "stopped on agent shutdown")
                }
                Err(e) => {
                    warn!(unit = %name, error = %crate::checks::error_chain(&e), "stop on shutdown failed")
                }
            }
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        // Readiness watches report nothing once the agent is gone.
        for h in self.units.values() {
            if let Some(w) = h.unit.lock().watch.take() {
                w.abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pdwarden_proto::v1::AgentMessage;

    /// A supervisor over `units` (name, argv) with logs in a temp dir.
    struct Fixture {
        sup: Supervisor,
        events: mpsc::UnboundedReceiver<AgentMessage>,
        dir: tempfile::TempDir,
        pids: Vec<u32>,
    }

    impl Fixture {
        fn new(units: &[(&str, &[&str])]) -> Self {
            let mut extra = String::new();
            for (name, argv) in units {
                extra.push_str(&format!(
                    "[[unit]]\nname='{name}'\nrole='prefill'\nargv={argv:?}\n\
                     base_url='http://127.0.0.1:1'\n"
                ));
            }
            Self::from_units_toml(&extra)
        }

        fn from_units_toml(units: &str) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let text = format!(
                "host='t'\norchestrator='http://127.0.0.1:1'\nstate_dir={:?}\n{units}",
                dir.path()
            );
            let config = AgentConfig::from_toml_str(&text).unwrap();
            let (outbox, events) = Outbox::new();
            let sup = Supervisor::new(&config, outbox, crate::checks::http_client());
            Fixture {
                sup,
                events,
                dir,
                pids: Vec::new(),
            }
        }

        async fn start(&mut self, unit: &str, id: &str) -> u32 {
            let params = ReadinessParams {
                // Nothing listens on port 1: the watch reports refused, then
                // keeps quiet; these tests are about processes.
                poll_interval: Duration::from_millis(50),
                ..Default::default()
            };
            self.start_with(unit, id, params).await
        }

        async fn start_with(&mut self, unit: &str, id: &str, params: ReadinessParams) -> u32 {
            let pid = self
                .sup
                .start(
                    unit,
                    CommandContext::new(id, Instant::now()),
                    false,
                    Duration::from_secs(5),
                    params,
                )
                .await
                .unwrap();
            self.pids.push(pid);
            pid
        }

        /// The next phase change of `unit` to `phase`, skipping other events
        /// (attempts included); panics after 10 s.
        async fn wait_phase(&mut self, unit: &str, phase: Phase) -> UnitEvent {
            self.events_until(unit, phase).await.pop().unwrap()
        }

        /// The events of `unit` up to and including its phase change to
        /// `phase`; panics after 10 s.
        async fn events_until(&mut self, unit: &str, phase: Phase) -> Vec<UnitEvent> {
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut seen = Vec::new();
            loop {
                let msg = tokio::time::timeout_at(deadline, self.events.recv())
                    .await
                    .unwrap_or_else(|_| panic!("no {phase:?} event for {unit}"))
                    .unwrap();
                if let Some(Kind::UnitEvent(e)) = msg.kind
                    && e.unit == unit
                {
                    let done = e.attempt.is_none() && e.phase == phase as i32;
                    seen.push(e);
                    if done {
                        return seen;
                    }
                }
            }
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            for &pid in &self.pids {
                let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
    }

    // Property: a spawned unit is reported with its pid, and an exit nobody
    // asked for is reported with the exit code and an empty command id.
    #[tokio::test]
    async fn crash_is_reported_with_exit_code() {
        let mut f = Fixture::new(&[(
            "crashy",
            &["sh", "-c", "echo 'error: model path /m not found' >&2; exit 3"],
        )]);
        let pid = f.start("crashy", "c1").await;
        let spawned = f.wait_phase("crashy", Phase::Spawned).await;
        assert_eq!((spawned.pid, spawned.command_id.as_str()), (pid, "c1"));
        let exited = f.wait_phase("crashy", Phase::Exited).await;
        assert_eq!(exited.exit_code, Some(3));
        // A crash at start is reported with the end of its log: the cause.
        assert_eq!(exited.detail, "exit status 3; log tail: error: model path /m not found");
        assert_eq!(exited.pid, pid);
        // Exited during its readiness watch: attributed to the start command.
        assert_eq!(exited.command_id, "c1");
        assert!(f.sup.unit_infos()[0].pid == 0);
    }

    #[test]
    fn crash_log_tail_skips_rust_backtrace_frames() {
        let log = "--- pdwarden-agent: starting unit prefill\n\
                   loading weights\n\
                   Error: binding 127.0.0.1:30000\n\
                   \n\
                   Caused by:\n    Address already in use (os error 98)\n\n\
                   Stack backtrace:\n   0: anyhow::error::<impl anyhow::Error>::msg\n\
                   \x20            at /cargo/anyhow-1.0/src/error.rs:83:36\n\
                   \x20 12: main\n\
                   note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.\n";
        assert_eq!(
            tail_lines(log, 3).as_deref(),
            Some("Error: binding 127.0.0.1:30000 | Caused by: | Address already in use (os error 98)")
        );
        // Without a backtrace nothing changes, and a timestamped log line whose
        // first field is a number with a colon is not a frame.
        assert_eq!(
            tail_lines("a\n2026-11-29 12: x\nb\n", 5).as_deref(),
            Some("a | 2026-11-29 12: x | b")
        );
        assert_eq!(tail_lines("--- pdwarden-agent: starting unit x\n\n", 5), None);
    }

    // Issue 48's third pass: a secret on the line after its key, in the
    // log tail as the agent joins it (" | "), through the tail's redaction
    // by shape: hidden, its neighbours kept.
    #[test]
    fn a_secret_on_the_next_line_of_a_log_tail_is_hidden() {
        let log = "> Authorization: Bearer\nSPLITTOK_line2\napi_key=\n'SPLITKEY2_s2'\nserving on 30000\n";
        let tail = tail_lines(log, 10).unwrap();
        // As `Unit::redact_log` does: by value (no secrets configured), then by shape.
        let by_value = pdwarden_security::redact::Redactor::default().text_with_env(&tail, std::iter::empty());
        let out = pdwarden_security::shapes::by_shape(&by_value);
        assert!(!out.contains("SPLITTOK") && !out.contains("SPLITKEY2"), "{out}");
        assert!(out.contains("serving on 30000"), "{out}");
    }

    // Property: a crash's log tail leaves the host without the unit's
    // secrets, named or not; other values stay.
    #[tokio::test]
    async fn crash_log_tail_is_redacted() {
        let mut f = Fixture::from_units_toml(
            "[[unit]]\nname='leaky'\nrole='prefill'\nbase_url='http://127.0.0.1:1'\n\
             argv=['sh', '-c', 'echo \"HF_TOKEN=hf_secret123 MODEL=/m\"; echo \"auth with hf_secret123 failed\" >&2; exit 4']\n\
             env={ HF_TOKEN = 'hf_secret123' }\n",
        );
        f.start("leaky", "c1").await;
        let exited = f.wait_phase("leaky", Phase::Exited).await;
        assert_eq!(
            exited.detail,
            "exit status 4; log tail: HF_TOKEN=[redacted] MODEL=/m | auth with [redacted] failed"
        );
    }

    // Issue 32 (secrets): a secret whose value held a separator leaked its
    // tail (`MY_TOKEN=[redacted]],LEAKA`): the NAME=VALUE rule stopped at
    // the `]`, and the whole-value pass then no longer found the value. The
    // unit's own secret values go whole, longest first, whatever they hold;
    // a short one goes whole wherever its name introduces it.
    #[tokio::test]
    async fn log_redaction_hides_whole_values_with_separators() {
        let f = Fixture::from_units_toml(
            r#"[[unit]]
name = 'u'
role = 'prefill'
base_url = 'http://127.0.0.1:1'
argv = ['true']
[unit.env]
MY_TOKEN = 's3cr3t],LEAKA'
API_KEY = 'open sesame tail'
DB_PASSWORD = "p\"w'x\"yz"
HF_TOKEN = 'hf_abcdef'
HF_TOKEN_LONG = 'hf_abcdef_and_more'
SHORT_KEY = 'a,b'
TINY_TOKEN = 'abc'
MODEL = 'not secret, shown'
"#,
        );
        let unit = &f.sup.units["u"].unit;
        let cases = [
            ("MY_TOKEN=s3cr3t],LEAKA next", "MY_TOKEN=[redacted] next"),
            ("auth with s3cr3t],LEAKA failed", "auth with [redacted] failed"),
            ("API_KEY=open sesame tail; done", "API_KEY=[redacted]; done"),
            ("DB_PASSWORD=p\"w'x\"yz ok", "DB_PASSWORD=[redacted] ok"),
            ("DB_PASSWORD=\"p\"w'x\"yz\" ok", "DB_PASSWORD=\"[redacted]\" ok"),
            (
                "using hf_abcdef_and_more and hf_abcdef",
                "using [redacted] and [redacted]",
            ),
            ("SHORT_KEY=a,b, x a,b", "SHORT_KEY=[redacted], x a,b"),
            ("SHORT_KEY: a,b end", "SHORT_KEY: [redacted] end"),
            // Short values are not hunted as words; the NAME=VALUE rule
            // still applies, and other variables stay.
            ("abcd TINY_TOKEN=abc", "abcd TINY_TOKEN=[redacted]"),
            (
                "MODEL=not secret, shown OTHER_TOKEN=zz",
                "MODEL=not secret, shown OTHER_TOKEN=[redacted]",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(unit.redact_log(text), want, "{text}");
        }
    }

    /// `text` as unit `u` (no secret values configured) lets it leave the host.
    fn redacted(text: &str) -> String {
        let f = Fixture::new(&[("u", &["true"])]);
        f.sup.redact_for("u", text).unwrap()
    }

    // Issue 48 (red team): SGLang's own server_args line reached a capture
    // verbatim: lower-case keys in a Python repr name no variable.
    #[tokio::test]
    async fn sglangs_server_args_line_is_redacted() {
        assert_eq!(
            redacted(
                "server_args=ServerArgs(model_path='/m', api_key='k-31337-abcdef', hf_token='hf_AbCdEfGhIjKlMnOpQr', port=30000)"
            ),
            "server_args=ServerArgs(model_path='/m', api_key='[redacted]', hf_token='[redacted]', port=30000)"
        );
    }

    // Issue 48 (red team): a JSON "api_key" in a log tail.
    #[tokio::test]
    async fn a_json_api_key_is_redacted() {
        assert_eq!(
            redacted(r#"config {"model": "m", "api_key": "plain-v4lue-x"}"#),
            r#"config {"model": "m", "api_key": "[redacted]"}"#
        );
    }

    // Issue 48 (red team): an Authorization header's bearer token.
    #[tokio::test]
    async fn a_bearer_header_is_redacted() {
        assert_eq!(
            redacted("request headers: Authorization: Bearer abc.DEF_ghi-123 accept: */*"),
            "request headers: Authorization: Bearer [redacted] accept: */*"
        );
    }

    // Issue 48 (red team): a database URL's password in a log tail.
    #[tokio::test]
    async fn a_postgres_url_password_is_redacted() {
        assert_eq!(
            redacted("connecting to postgres://app:S3cretPass@db.internal:5432/meta"),
            "connecting to postgres://app:[redacted]@db.internal:5432/meta"
        );
    }

    // Issue 48 (red team): URL credentials in a command line (the unit's
    // and its children's go through the same redaction).
    #[tokio::test]
    async fn url_credentials_in_a_command_line_are_redacted() {
        assert_eq!(
            redacted(
                "python3 -m sglang_router.launch_router --prefill http://user:Pa55word@10.0.0.1:30000 --port 8080"
            ),
            "python3 -m sglang_router.launch_router --prefill http://user:[redacted]@10.0.0.1:30000 --port 8080"
        );
    }

    // Issue 48: a log read from the middle of a line leaves that line out:
    // its start (a URL's scheme and user) is not there for the redaction
    // to see, and its rest would be the password's tail.
    #[test]
    fn a_log_tail_read_mid_line_leaves_that_line_out() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("u.log");
        // The read starts inside the password.
        let password = "P".repeat(LOG_TAIL_BYTES as usize - 8);
        std::fs::write(&log, format!("postgres://app:{password}@db/x\nlast line\n")).unwrap();
        assert_eq!(log_tail(&log, 5).as_deref(), Some("last line"));
    }

    // Property: the readiness watch's check attempts reach the stream as
    // events with `attempt` set, under the start's command id and stamped when
    // they ended, carrying the unit's phase at the time and changing neither
    // it nor the attribution; the refused polls' run comes before not_ready.
    #[tokio::test]
    async fn attempts_are_reported_without_changing_the_phase() {
        use pdwarden_proto::v1::{AttemptOutcome, CheckKind};
        let mut f = Fixture::new(&[("s", &["sleep", "30"])]);
        let params = ReadinessParams {
            deadline: Duration::from_millis(300),
            poll_interval: Duration::from_millis(50),
            ..Default::default()
        };
        let pid = f.start_with("s", "c1", params).await;
        let events = f.events_until("s", Phase::NotReady).await;
        let phases: Vec<Phase> = events
            .iter()
            .filter(|e| e.attempt.is_none())
            .map(|e| Phase::try_from(e.phase).unwrap())
            .collect();
        assert_eq!(phases, vec![Phase::Spawned, Phase::Refused, Phase::NotReady]);
        let [.., run_event, not_ready] = events.as_slice() else {
            panic!("{events:?}")
        };
        let run = run_event.attempt.as_ref().expect("the refused run before not_ready");
        assert_eq!(
            (run.check, run.outcome),
            (CheckKind::Health as i32, AttemptOutcome::Refused as i32)
        );
        assert!(run.count >= 2, "polls every 50 ms for 300 ms: {run:?}");
        assert!(run.first_ms_since_command <= run_event.ms_since_command);
        assert!(run_event.ms_since_command <= not_ready.ms_since_command);
        assert_eq!(
            (run_event.command_id.as_str(), run_event.pid, run_event.phase),
            ("c1", pid, Phase::Refused as i32)
        );
        assert_eq!(run_event.detail, "connection refused");
        assert_eq!(not_ready.command_id, "c1");
        let info = &f.sup.unit_infos()[0];
        assert_eq!(info.phase, Phase::NotReady as i32);
        // The unit's facts still name the start that spawned it, ended
        // (issue 14: a resumed operation adopts its own start by this id).
        assert_eq!((info.command_id.as_str(), info.command_in_progress), ("c1", false));
    }

    // Property: a crash after the watch ended (here: unit runs, then is
    // killed from outside) carries command id "" and the signal.
    #[tokio::test]
    async fn external_kill_after_watch_is_spontaneous() {
        let mut f = Fixture::new(&[("s", &["sleep", "30"])]);
        let pid = f.start("s", "c1").await;
        f.wait_phase("s", Phase::Refused).await;
        let info = &f.sup.unit_infos()[0];
        assert_eq!(
            (info.command_id.as_str(), info.command_in_progress),
            ("c1", true),
            "under way"
        );
        // End the watch the way a finished start-up would.
        f.sup.units["s"].unit.lock().attribution = Attribution::Spontaneous;
        killpg(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
        let exited = f.wait_phase("s", Phase::Exited).await;
        assert_eq!(exited.command_id, "");
        assert_eq!(exited.ms_since_command, 0);
        assert_eq!(exited.exit_code, None);
        assert_eq!(exited.detail, "killed by signal 9 (SIGKILL)");
    }

    /// Issue 48, item 5: every engine ran as the agent's user, root. A
    /// unit with `user = "nobody"` runs as nobody: its uid and gid (real,
    /// effective, saved, file system), no supplementary group, no
    /// capability, nobody's HOME, USER and LOGNAME; the agent still stops
    /// it (CAP_KILL). Only a root agent with CAP_SETUID and CAP_SETGID
    /// switches users: any other refuses the config at load, which is what
    /// this test asserts where it does not run as such.
    #[tokio::test]
    async fn a_unit_with_a_user_runs_as_that_user_with_no_privilege() {
        let units = "[[unit]]\nname='e'\nrole='prefill'\n\
                     argv=['sh','-c','echo \"as $HOME $USER $LOGNAME\"; exec sleep 30']\n\
                     base_url='http://127.0.0.1:1'\nuser='nobody'\n";
        let nobody = crate::runas::resolve(Some("nobody"), None).unwrap().unwrap();
        let agent = crate::runas::Privilege::of_this_process();
        if agent.may_run_as(&nobody).is_err() {
            let config = AgentConfig::from_toml_str(&format!(
                "host='t'\norchestrator='http://127.0.0.1:1'\nstate_dir='/tmp'\n{units}"
            ))
            .unwrap();
            let e = config.check_unit_users().unwrap_err().to_string();
            assert!(
                e.starts_with("agent config: field `unit[0].user`: unit \"e\": the agent "),
                "a non-root agent refuses at load: {e}"
            );
            return;
        }
        let mut f = Fixture::from_units_toml(units);
        let pid = f.start("e", "c1").await;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let field = |key: &str| -> Vec<String> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .unwrap_or_else(|| panic!("no {key} in {status}"))
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(field("Uid:"), vec![nobody.uid.to_string(); 4], "{status}");
        assert_eq!(field("Gid:"), vec![nobody.gid.to_string(); 4], "{status}");
        assert_eq!(
            field("Groups:"),
            Vec::<String>::new(),
            "no supplementary group: {status}"
        );
        for caps in ["CapPrm:", "CapEff:", "CapAmb:"] {
            assert_eq!(field(caps), ["0000000000000000"], "{caps} {status}");
        }
        let want = format!("as {} nobody nobody", nobody.home.display());
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f.sup.log_tail("e", 5).unwrap_or_default().contains(&want) {
            assert!(
                Instant::now() < deadline,
                "{want:?} not in {:?}",
                f.sup.log_tail("e", 5)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let out = f
            .sup
            .stop("e", CommandContext::new("c2", Instant::now()), Duration::from_secs(5))
            .await
            .unwrap();
        assert!(matches!(out, StopOutcome::Stopped { graceful: true, .. }), "{out:?}");
    }

    /// A unit whose user is gone by the time it starts is refused, never
    /// run as the agent's own user.
    #[tokio::test]
    async fn a_unit_whose_user_is_gone_is_not_started() {
        let f = Fixture::from_units_toml(
            "[[unit]]\nname='e'\nrole='prefill'\nargv=['sleep','30']\n\
             base_url='http://127.0.0.1:1'\nuser='pdwarden-no-such-user'\n",
        );
        let e = f
            .sup
            .start(
                "e",
                CommandContext::new("c1", Instant::now()),
                false,
                Duration::from_secs(5),
                ReadinessParams::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot spawn unit \"e\": user: no such user \"pdwarden-no-such-user\" on this host"
        );
        assert_eq!(f.sup.unit_infos()[0].pid, 0);
    }

    // Property: stop sends SIGTERM to the group; a process that exits on it
    // is stopped gracefully, reported STOPPING then EXITED under the stop's id.
    #[tokio::test]
    async fn stop_is_graceful_for_cooperative_process() {
        let mut f = Fixture::new(&[("s", &["sleep", "30"])]);
        let pid = f.start("s", "c1").await;
        let out = f
            .sup
            .stop("s", CommandContext::new("c2", Instant::now()), Duration::from_secs(5))
            .await
            .unwrap();
        let StopOutcome::Stopped { graceful, exit } = out else {
            panic!("{out:?}")
        };
        assert!(graceful);
        assert_eq!(exit.signal, Some(15));
        let stopping = f.wait_phase("s", Phase::Stopping).await;
        assert_eq!((stopping.command_id.as_str(), stopping.pid), ("c2", pid));
        let exited = f.wait_phase("s", Phase::Exited).await;
        assert_eq!(exited.command_id, "c2");
        assert!(exited.detail.contains("signal 15"), "{}", exited.detail);
        // Stopping a stopped unit is a no-op.
        let again = f
            .sup
            .stop("s", CommandContext::new("c3", Instant::now()), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(again, StopOutcome::NotRunning);
    }

    // Property: a process that ignores SIGTERM is SIGKILLed after the grace,
    // and its whole process group (the sleep child too) goes with it.
    #[tokio::test]
    async fn stop_escalates_to_sigkill_after_grace() {
        let mut f = Fixture::new(&[("stubborn", &["sh", "-c", "trap '' TERM; echo ready; sleep 30"])]);
        let pid = f.start("stubborn", "c1").await;
        // Wait until the trap is installed (the shell printed "ready").
        let log = f.dir.path().join("logs/stubborn.log");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&log).unwrap_or_default().contains("\nready\n") {
            assert!(Instant::now() < deadline, "shell never started");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let t0 = Instant::now();
        let out = f
            .sup
            .stop("stubborn", CommandContext::new("c2", t0), Duration::from_millis(300))
            .await
            .unwrap();
        let elapsed = t0.elapsed();
        let StopOutcome::Stopped { graceful, exit } = out else {
            panic!("{out:?}")
        };
        assert!(!graceful);
        assert_eq!(exit.signal, Some(9));
        assert!(elapsed >= Duration::from_millis(300), "{elapsed:?}");
        let exited = f.wait_phase("stubborn", Phase::Exited).await;
        assert!(exited.ms_since_command >= 300);
        // The group empties (orphans are reaped by init, so poll briefly).
        let deadline = Instant::now() + Duration::from_secs(10);
        while killpg(Pid::from_raw(pid as i32), None::<Signal>) != Err(nix::Error::ESRCH) {
            assert!(Instant::now() < deadline, "process group {pid} still alive");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    // Property: stdout and stderr are appended to state_dir/logs/<unit>.log,
    // and env and cwd reach the process.
    #[tokio::test]
    async fn output_env_and_cwd() {
        let cwd = tempfile::tempdir().unwrap();
        let mut f = Fixture::from_units_toml(&format!(
            "[[unit]]\nname='talk'\nrole='decode'\n\
             argv=['sh','-c','echo out-$PDW_TEST; echo err >&2; pwd']\n\
             env={{PDW_TEST='yes'}}\ncwd={:?}\nbase_url='http://127.0.0.1:1'\n",
            cwd.path()
        ));
        f.start("talk", "c1").await;
        f.wait_phase("talk", Phase::Exited).await;
        f.start("talk", "c2").await;
        f.wait_phase("talk", Phase::Exited).await;
        let log = std::fs::read_to_string(f.dir.path().join("logs/talk.log")).unwrap();
        assert_eq!(log.matches("out-yes\n").count(), 2, "{log}");
        assert_eq!(log.matches("err\n").count(), 2, "{log}");
        assert!(log.contains(cwd.path().to_str().unwrap()), "{log}");
        assert!(
            log.contains("starting unit talk (command \"c2\", config version 0)"),
            "{log}"
        );
    }

    // Property: starting a running unit without restart is refused; with
    // restart it is stopped first (same command id) and respawned.
    #[tokio::test]
    async fn restart_stops_then_spawns() {
        let mut f = Fixture::new(&[("s", &["sleep", "30"])]);
        let pid1 = f.start("s", "c1").await;
        let err = f
            .sup
            .start(
                "s",
                CommandContext::new("c2", Instant::now()),
                false,
                Duration::from_secs(5),
                ReadinessParams::default(),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, SupervisorError::AlreadyRunning { .. }), "{err}");
        let pid2 = f
            .sup
            .start(
                "s",
                CommandContext::new("c3", Instant::now()),
                true,
                Duration::from_secs(5),
                ReadinessParams::default(),
            )
            .await
            .unwrap();
        f.pids.push(pid2);
        assert_ne!(pid1, pid2);
        let stopping = f.wait_phase("s", Phase::Stopping).await;
        assert_eq!((stopping.command_id.as_str(), stopping.pid), ("c3", pid1));
        let exited = f.wait_phase("s", Phase::Exited).await;
        assert_eq!((exited.command_id.as_str(), exited.pid), ("c3", pid1));
        let spawned = f.wait_phase("s", Phase::Spawned).await;
        assert_eq!((spawned.command_id.as_str(), spawned.pid), ("c3", pid2));
        assert_eq!(f.sup.unit_infos()[0].pid, pid2);
    }

    // Property: a pid file is written while a unit runs and removed at its
    // exit; a pid file naming a different process (start time differs) is
    // stale and not adopted.
    #[tokio::test]
    async fn pid_files_and_stale_adoption() {
        let mut f = Fixture::new(&[("s", &["sleep", "30"])]);
        let pid = f.start("s", "c1").await;
        let pid_file = f.dir.path().join("run/s.pid");
        let text = std::fs::read_to_string(&pid_file).unwrap();
        let start = process_start_time(pid).unwrap();
        assert!(
            text.starts_with(&format!("{pid} {start} command=c1 version=0 received_unix_ms=")),
            "{text}"
        );
        f.sup
            .stop("s", CommandContext::new("c2", Instant::now()), Duration::from_secs(5))
            .await
            .unwrap();
        assert!(!pid_file.exists());

        // Our own pid with a wrong start time: stale.
        std::fs::write(&pid_file, format!("{} 1\n", std::process::id())).unwrap();
        assert_eq!(f.sup.adopt_all(), vec![]);
        assert!(!pid_file.exists(), "stale pid file removed");
        assert_eq!(process_start_time(u32::MAX), None);
    }

    /// Issue 16 (found by the soak): an agent SIGKILLed mid-start and
    /// started again executed the orchestrator's re-sent start (same
    /// command id) a second time — a second model load, and the start's
    /// step failed on the first instance's "exit". The pid file now names
    /// the start; the new agent follows that start instead.
    #[tokio::test]
    async fn a_start_a_killed_agent_ran_is_followed_not_run_again() {
        let mut first = Fixture::new(&[("s", &["sleep", "30"])]);
        let pid = first.start("s", "c1").await;
        // The agent dies (its units live on: they are not killed with it),
        // and the next one starts a while later.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let config = AgentConfig::from_toml_str(&format!(
            "host='t'\norchestrator='http://127.0.0.1:1'\nstate_dir={:?}\n[[unit]]\nname='s'\nrole='prefill'\nargv=['sleep','30']\nbase_url='http://127.0.0.1:1'\n",
            first.dir.path()
        ))
        .unwrap();
        let (outbox, events) = Outbox::new();
        let mut again = Fixture {
            sup: Supervisor::new(&config, outbox, crate::checks::http_client()),
            events,
            dir: tempfile::tempdir().unwrap(),
            pids: Vec::new(),
        };
        assert_eq!(again.sup.adopt_all(), vec![("s".to_string(), pid)]);
        assert_eq!(again.sup.unit_infos()[0].command_id, "c1", "the start it belongs to");
        assert_eq!(
            again.sup.running_process("s"),
            Some((pid, Some(0))),
            "the config version it was spawned from (a gate's live check reads it)"
        );
        let params = ReadinessParams {
            poll_interval: Duration::from_millis(50),
            ..Default::default()
        };
        let restart = |sup: &Supervisor, id: &str| {
            sup.start(
                "s",
                CommandContext::new(id, Instant::now()),
                true,
                Duration::from_secs(5),
                params.clone(),
            )
        };
        assert_eq!(
            restart(&again.sup, "c1").await.unwrap(),
            pid,
            "followed, not started again"
        );
        // Its readiness goes on under the start's id (nothing listens on
        // port 1: refused), and nothing new was spawned.
        let followed = loop {
            let e = again.wait_phase("s", Phase::Refused).await;
            if e.command_id == "c1" {
                break e;
            }
        };
        assert_eq!(followed.pid, pid, "{followed:?}");
        // Issue 32: counted from the command the first agent received, not
        // from the adoption.
        assert!(followed.ms_since_command >= 400, "{followed:?}");
        assert!(process_start_time(pid).is_some(), "the instance lives");
        // Another start is a start.
        let fresh = restart(&again.sup, "c2").await.unwrap();
        again.pids.push(fresh);
        assert_ne!(fresh, pid);
        first.pids.push(pid);
    }

    // Property: unknown units and unspawnable programs are errors naming them.
    #[tokio::test]
    async fn errors_name_the_unit() {
        let f = Fixture::new(&[("ghost", &["/nonexistent/pdwarden-binary"])]);
        let err = f
            .sup
            .start(
                "nope",
                CommandContext::new("c", Instant::now()),
                false,
                Duration::ZERO,
                ReadinessParams::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "unknown unit \"nope\"");
        let err = f
            .sup
            .start(
                "ghost",
                CommandContext::new("c", Instant::now()),
                false,
                Duration::ZERO,
                ReadinessParams::default(),
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("ghost"), "{err}");
        assert!(err.to_string().contains("/nonexistent/pdwarden-binary"), "{err}");
    }
}
