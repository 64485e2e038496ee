//! Agent footprint: the real `pdwarden-agent` binary, idle, supervising four
//! running pd-sims with GPU reporting (fake source, four GPUs; or NVML with
//! `--agent-gpu-source nvml`) and the engine watch (one metrics + health
//! scrape per unit per second) on.
//!
//! Its CPU and RSS are read from `/proc/PID` over a window in which nothing
//! is asked of it. The orchestrator side is the bench's own link server.

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use pdwarden_proto::v1::{
    Command as AgentCommand, OrchestratorMessage, Phase, WatchEngines, WatchTarget, agent_message, command,
    orchestrator_message,
};

use crate::lag::{LinkServer, agent_toml, start_command};
use crate::procstat::{CpuMeter, status_bytes};

pub struct Footprint {
    pub cores: f64,
    pub rss: u64,
    pub hwm: u64,
    pub window_s: f64,
}

/// Kills the agent (and, by PID, the units it started) when dropped.
struct AgentProcess {
    child: std::process::Child,
    units: Vec<u32>,
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        for _ in 0..250 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        for &pid in &self.units {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains("pd-sim-jitter") {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
    }
}

/// `nvml`: the agent reads the machine's real GPUs instead of four fake ones.
pub async fn run(window: Duration, nvml: bool) -> anyhow::Result<Footprint> {
    let exe = std::env::current_exe()?;
    let agent_bin = exe
        .parent()
        .map(|d| d.join("pdwarden-agent"))
        .filter(|p| p.is_file())
        .context("`pdwarden-agent` is not built next to this binary (cargo build --release --bins)")?;
    let dir = tempfile::tempdir()?;
    let gpus: Vec<serde_json::Value> = (0..4)
        .map(|i| {
            serde_json::json!({"index": i, "uuid": format!("GPU-{i}"), "name": "Fake H100",
                "memory_used_bytes": 60u64 << 30, "memory_total_bytes": 80u64 << 30,
                "utilization_gpu_pct": 90, "temperature_c": 60, "processes": []})
        })
        .collect();
    let gpu_file = dir.path().join("gpus.json");
    std::fs::write(&gpu_file, serde_json::json!({ "gpus": gpus }).to_string())?;
    let mut link = LinkServer::start().await?;
    let source = if nvml {
        "nvml".to_owned()
    } else {
        format!("fake:{}", gpu_file.display())
    };
    let (toml, _bases) = agent_toml(&link.url, &dir.path().join("state"), &source)?;
    let config = dir.path().join("agent.toml");
    std::fs::write(&config, toml)?;
    let child = Command::new(agent_bin)
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("agent.log"))?)
        .spawn()
        .context("cannot start pdwarden-agent")?;
    let mut agent = AgentProcess {
        child,
        units: Vec::new(),
    };
    let result = measure(&mut link, &mut agent, window).await.with_context(|| {
        let text = std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().rev().take(3).collect();
        format!("agent log: {}", lines.into_iter().rev().collect::<Vec<_>>().join(" | "))
    });
    drop(agent);
    link.shutdown().await;
    result
}

async fn measure(link: &mut LinkServer, agent: &mut AgentProcess, window: Duration) -> anyhow::Result<Footprint> {
    let (mut inbox, commands) = link.accept().await?;
    for i in 0..4 {
        commands
            .send(Ok(start_command(&format!("fp-{i}"), i)))
            .ok()
            .context("agent gone")?;
    }
    let mut generating = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while generating < 4 {
        let Ok(Some((_, msg))) = tokio::time::timeout_at(deadline, inbox.recv()).await else {
            anyhow::bail!("the agent's units did not all generate within 30 s");
        };
        if let Some(agent_message::Kind::UnitEvent(ev)) = msg.kind {
            match Phase::try_from(ev.phase) {
                Ok(Phase::Spawned) => agent.units.push(ev.pid),
                Ok(Phase::Generating) => generating += 1,
                _ => {}
            }
        }
    }
    let watch = AgentCommand {
        fencing_token: 0,
        command_id: "fp-watch".into(),
        action: Some(command::Action::Watch(WatchEngines {
            targets: (0..4)
                .map(|i| WatchTarget {
                    unit: format!("u{i}"),
                    metrics_path: String::new(),
                })
                .collect(),
            interval_ms: 1000,
            scrape_timeout_ms: 2000,
        })),
    };
    commands
        .send(Ok(OrchestratorMessage {
            kind: Some(orchestrator_message::Kind::Command(watch)),
        }))
        .ok()
        .context("agent gone")?;
    // Drain the agent's reports for the whole window, as an orchestrator would.
    let drain = tokio::spawn(async move { while inbox.recv().await.is_some() {} });
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pid = agent.child.id();
    let cpu = CpuMeter::start(pid);
    tokio::time::sleep(window).await;
    let fp = Footprint {
        cores: cpu.cores(),
        rss: status_bytes(pid, "VmRSS").unwrap_or(0),
        hwm: status_bytes(pid, "VmHWM").unwrap_or(0),
        window_s: window.as_secs_f64(),
    };
    drop(commands);
    drain.abort();
    Ok(fp)
}
