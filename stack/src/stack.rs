//! A running local stack: an orchestrator and an agent (real processes, the
//! workspace's binaries) in a temporary directory, the agent supervising a
//! prefill and a decode `pd-sim` and the real `sglang-router` in PD mode.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::bail;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pdwarden_client::{Connection, CouldNotRun, Credentials};

use serde_json::{Value, json};

use crate::args::DemoArgs;
use crate::plan::{StackPlan, write_configs};
use crate::process::{Owned, binary, spawn_logged};

// Fields drop in order: a dropped stack (an interrupted demo) stops the
// agent, which stops its units, and the orchestrator before its directory
// goes.
pub struct Stack {
    agent: Owned,
    /// `--two-hosts`: the second agent (host `remote`).
    remote_agent: Option<Owned>,
    /// Engines restarted behind the agent's back and adopted by it
    /// ([`Stack::restart_units_outside`]); stopped after the agent, by pid.
    outside: Vec<Owned>,
    orchestrator: Owned,
    /// `--decode-proxy`: pd-faultproxy between the router and the decode.
    decode_proxy: Option<Owned>,
    pub dir: tempfile::TempDir,
    /// The stack's orchestrator and the credentials this process's own
    /// requests present.
    pub connection: Connection,
    pub plan: StackPlan,
    orchestrator_config: PathBuf,
    agent_config: PathBuf,
}

impl Stack {
    /// Writes the configs for `args`, starts the orchestrator and the agent
    /// and waits until the agent has registered its three units. `given`:
    /// the caller's own credentials, used where the stack makes none
    /// (`--insecure-plaintext`).
    pub async fn start(args: &DemoArgs, given: Credentials) -> anyhow::Result<Stack> {
        let dir = tempfile::Builder::new().prefix("pdwarden-demo-").tempdir()?;
        let configs = write_configs(args, dir.path())?;
        let orchestrator = spawn_logged(
            "orchestrator",
            &binary("pdwarden-orchestrator")?,
            &["--config".into(), configs.orchestrator_path.display().to_string()],
            dir.path(),
        )?;
        // Before the agent: the router finds its decode through it.
        let decode_proxy = match &configs.plan.decode_proxy {
            Some(p) => Some(spawn_logged(
                "decode-proxy",
                std::path::Path::new(&p.argv[0]),
                &p.argv[1..],
                dir.path(),
            )?),
            None => None,
        };
        let agent = spawn_logged(
            "agent",
            &binary("pdwarden-agent")?,
            &["--config".into(), configs.agent_path.display().to_string()],
            dir.path(),
        )?;
        let remote_agent = match &configs.remote_agent {
            Some((_, path)) => Some(spawn_logged(
                "agent-remote",
                &binary("pdwarden-agent")?,
                &["--config".into(), path.display().to_string()],
                dir.path(),
            )?),
            None => None,
        };
        let units = configs.agent.units.len() + configs.remote_agent.as_ref().map_or(0, |(a, _)| a.units.len());
        let stack = Stack {
            remote_agent,
            decode_proxy,
            dir,
            connection: Connection::new(configs.url, configs.credentials.unwrap_or(given)),
            agent,
            orchestrator,
            plan: configs.plan,
            orchestrator_config: configs.orchestrator_path,
            agent_config: configs.agent_path,
            outside: Vec::new(),
        };
        stack.wait_for_agent(units, Duration::from_secs(20)).await?;
        Ok(stack)
    }

    /// Polls `status` until the agents have registered their `units`, in all.
    async fn wait_for_agent(&self, units: usize, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        let mut last = String::from("orchestrator not reachable yet");
        while Instant::now() < deadline {
            match self.connection.connect().await {
                Ok(mut c) => match c.status(pdwarden_proto::v1::StatusRequest::default()).await {
                    Ok(r) => {
                        let v: serde_json::Value = serde_json::from_str(&r.into_inner().json)?;
                        let registered: usize = v["agents"]
                            .as_array()
                            .map(|a| {
                                a.iter()
                                    .filter(|a| a["connected"] == true)
                                    .filter_map(|a| a["units"].as_array().map(Vec::len))
                                    .sum()
                            })
                            .unwrap_or(0);
                        if registered == units {
                            return Ok(());
                        }
                        last = "agent not registered yet".into();
                    }
                    Err(s) => last = s.message().to_string(),
                },
                Err(CouldNotRun(r)) => last = r,
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("the local stack did not come up within {limit:?}: {last}")
    }

    /// SIGKILLs the orchestrator (no chance to clean up: its journal is left
    /// mid-operation) and starts a new one on the same config and journal.
    pub fn crash_and_restart_orchestrator(&mut self) -> anyhow::Result<(u32, u32)> {
        let old = self.orchestrator.pid();
        let _ = kill(Pid::from_raw(old as i32), Signal::SIGKILL);
        self.orchestrator.stop(Duration::from_secs(5));
        let fresh = spawn_logged(
            "orchestrator-restarted",
            &binary("pdwarden-orchestrator")?,
            &["--config".into(), self.orchestrator_config.display().to_string()],
            self.dir.path(),
        )?;
        let new = fresh.pid();
        // The old handle is already reaped; dropping it does nothing more.
        self.orchestrator = fresh;
        Ok((old, new))
    }

    /// SIGKILLs the agent (its units keep running: a killed agent stops
    /// nothing) and starts a new one on the same config and state dir,
    /// which adopts them from their pid files.
    pub fn crash_and_restart_agent(&mut self) -> anyhow::Result<(u32, u32)> {
        let old = self.agent.pid();
        let _ = kill(Pid::from_raw(old as i32), Signal::SIGKILL);
        self.agent.stop(Duration::from_secs(5));
        let fresh = spawn_logged(
            "agent-restarted",
            &binary("pdwarden-agent")?,
            &["--config".into(), self.agent_config.display().to_string()],
            self.dir.path(),
        )?;
        let new = fresh.pid();
        self.agent = fresh;
        Ok((old, new))
    }

    /// Restarts `units` as someone other than pdwarden would (systemd, an
    /// operator; issue 46): the agent SIGKILLed (its units keep running),
    /// each unit's process stopped and started again from its configured
    /// argv, in the order given, by this process, its pid file rewritten to
    /// name the new process, then the agent started again, which adopts
    /// them as it adopts any process it finds running. No command of
    /// pdwarden's started them: only the agents' facts (each process's
    /// start) tell.
    pub async fn restart_units_outside(&mut self, units: &[&str]) -> anyhow::Result<()> {
        let config = pdwarden_agent::AgentConfig::load(&self.agent_config)?;
        let old = self.agent.pid();
        let _ = kill(Pid::from_raw(old as i32), Signal::SIGKILL);
        self.agent.stop(Duration::from_secs(5));
        for name in units {
            let unit = config
                .units
                .iter()
                .find(|u| u.name == *name)
                .ok_or_else(|| anyhow::anyhow!("no unit {name} in the agent's config"))?;
            let pid_file = config.state_dir.join("run").join(format!("{name}.pid"));
            let text = std::fs::read_to_string(&pid_file)?;
            let pid: i32 = text.split_whitespace().next().unwrap_or_default().parse()?;
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            let gone = Instant::now();
            while alive(pid) && gone.elapsed() < Duration::from_secs(10) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            let fresh = spawn_logged(
                "restarted-outside",
                std::path::Path::new(&unit.argv[0]),
                &unit.argv[1..],
                self.dir.path(),
            )?;
            let start = proc_start_ticks(fresh.pid())
                .ok_or_else(|| anyhow::anyhow!("{name}'s new process {} has no /proc entry", fresh.pid()))?;
            std::fs::write(&pid_file, format!("{} {start} command= version=0\n", fresh.pid()))?;
            self.outside.push(fresh);
            // Apart in time, as restarts one after another are: each
            // process's start is its own.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.agent = spawn_logged(
            "agent-restarted",
            &binary("pdwarden-agent")?,
            &["--config".into(), self.agent_config.display().to_string()],
            self.dir.path(),
        )?;
        Ok(())
    }

    /// The pids of the orchestrator and the agent now.
    pub fn pids(&self) -> (u32, u32) {
        (self.orchestrator.pid(), self.agent.pid())
    }

    /// Stops the agent (it stops its units first: `on_exit = "stop-units"`)
    /// and the orchestrator, and removes the directory unless `keep`, in
    /// which case it returns where it is.
    pub fn stop(mut self, keep: bool) -> Option<PathBuf> {
        self.agent.stop(Duration::from_secs(15));
        if let Some(a) = self.remote_agent.as_mut() {
            a.stop(Duration::from_secs(15));
        }
        for o in &mut self.outside {
            o.stop(Duration::from_secs(5));
        }
        self.orchestrator.stop(Duration::from_secs(5));
        if let Some(p) = self.decode_proxy.as_mut() {
            p.stop(Duration::from_secs(5));
        }
        keep.then(|| self.dir.keep())
    }
}

/// How to reach the demo's stack (`demo` in its `--json`).
pub(crate) fn demo_json(stack: &Stack) -> Value {
    let creds = &stack.connection.credentials;
    json!({
        "orchestrator": stack.connection.url,
        "readiness": stack.plan.readiness_url,
        "agent_metrics": stack.plan.agent_metrics_url,
        "dir": stack.dir.path().display().to_string(),
        // For `pdwarden --ca CA --token TOKEN` against the held stack (a
        // throw-away token for this demo only).
        "ca": creds.ca.as_ref().map(|p| p.display().to_string()),
        "token": creds.token,
        "serving_router": stack.plan.serving_router_url,
        // --decode-proxy: its control endpoint is URL/_faultproxy/faults.
        "decode_proxy": stack.plan.decode_proxy.as_ref().map(|p| p.url.clone()),
    })
}

/// Whether `pid` is a live process (not gone, not a zombie nobody reaped).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit(')')
                .next()
                .and_then(|t| t.split_whitespace().next())
                .map(str::to_string)
        })
        .is_some_and(|state| state != "Z" && state != "X")
}

/// The kernel start time of `pid` (`/proc/PID/stat` field 22), as the
/// agent's pid files record it.
fn proc_start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].split_whitespace().nth(19)?.parse().ok()
}
