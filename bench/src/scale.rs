//! Scale: one orchestrator process carrying many agents.
//!
//! The orchestrator is the library's real `serve`, in a child process (this
//! binary re-executed as `orchestrator-child`) so that its CPU and RSS can be
//! read from `/proc/PID` apart from the load generator's. The load generator
//! is this process: one real `AgentLink.Attach` session per simulated agent,
//! each on its own HTTP/2 connection, speaking the agent protocol (Register
//! with 4 units, then every second one `UnitEvent` per unit and a
//! `HostSnapshot` with a GPU and its processes). The orchestrator cannot tell
//! them from real agents.
//!
//! End-to-end event latency: a sampled agent sends a `UnitEvent` with a
//! marker PID; `Status` for that one host (`status --host`) is then called
//! until the marker shows; the latency is from the send to the reply of the
//! first call that shows it (so it includes one small call: an upper bound).
//! Meanwhile a dashboard calls the whole fleet's `Status` every 250 ms; its
//! latency is the `Status` figure, and the events are measured under it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use pd_sim::clock::mono_ms;
use pdwarden_proto::v1::agent_link_client::AgentLinkClient;
use pdwarden_proto::v1::control_client::ControlClient;
use pdwarden_proto::v1::{
    AgentMessage, GpuDevice, GpuProcess, HostSnapshot, HostStats, HostUnitUsage, Phase, Register, Role, StatusRequest,
    UnitEvent, UnitInfo, agent_message,
};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;

use crate::children::Child;
use crate::procstat::{CpuMeter, status_bytes};
use crate::stats::Rng;

const UNITS: u32 = 4;
/// Marker PIDs are above any PID the generator reports otherwise.
const MARKER_BASE: u32 = 50_000_000;

pub struct ScalePoint {
    pub agents: usize,
    /// Seconds until every agent was attached and acknowledged.
    pub attach_s: f64,
    pub cores: f64,
    pub rss: u64,
    pub hwm: u64,
    /// Send → visible in Status, ms (includes one Status call).
    pub event_ms: Vec<f64>,
    /// Markers not visible within 10 s.
    pub event_lost: usize,
    pub status_ms: Vec<f64>,
    /// One host's `Status` (`status --host`), ms.
    pub host_status_ms: Vec<f64>,
    pub status_bytes: usize,
    /// Messages the generator sent per second during the window.
    pub msgs_per_s: f64,
    /// The load generator's own CPU (this process), cores.
    pub generator_cores: f64,
    /// After the orchestrator was killed and started again: seconds until
    /// every agent was attached again (`None`: not within 120 s).
    pub reattach_s: Option<f64>,
}

/// A request to one simulated agent: report this PID for unit 0 from now
/// on, and say when the event was sent.
type Marker = (u32, oneshot::Sender<f64>);

fn unit_event(unit: u32, tick: u64, pid: u32) -> AgentMessage {
    let phase = if tick.is_multiple_of(2) {
        Phase::Healthy
    } else {
        Phase::Generating
    };
    AgentMessage {
        kind: Some(agent_message::Kind::UnitEvent(UnitEvent {
            unit: format!("u{unit}"),
            phase: phase as i32,
            pid,
            detail: "bench".into(),
            http_status: 200,
            ..UnitEvent::default()
        })),
    }
}

fn snapshot(pids: &[u32], tick: u64) -> AgentMessage {
    let gpus = (0..UNITS)
        .map(|g| GpuDevice {
            index: g,
            uuid: format!("GPU-{g}"),
            name: "Fake H100".into(),
            memory_used_bytes: 60 << 30,
            memory_total_bytes: 80 << 30,
            utilization_gpu_pct: Some((tick % 100) as u32),
            temperature_c: Some(60),
            processes: vec![GpuProcess {
                pid: pids[g as usize],
                used_memory_bytes: Some(60 << 30),
                kind: "compute".into(),
                unit: format!("u{g}"),
                command_line: "python -m sglang.launch_server".into(),
                user: "serve".into(),
                ..GpuProcess::default()
            }],
            ..GpuDevice::default()
        })
        .collect();
    AgentMessage {
        kind: Some(agent_message::Kind::HostSnapshot(HostSnapshot {
            taken_unix_ms: 0,
            gpu_source: "fake".into(),
            gpu_unavailable: String::new(),
            gpus,
            host: Some(HostStats {
                cpu_pct: 12.5,
                cpu_count: 64,
                memory_used_bytes: 100 << 30,
                memory_total_bytes: 512 << 30,
                load1: 1.0,
                load5: 1.0,
                load15: 1.0,
            }),
            units: (0..UNITS)
                .map(|u| HostUnitUsage {
                    unit: format!("u{u}"),
                    pid: pids[u as usize],
                    rss_bytes: 8 << 30,
                    cpu_pct: 100.0,
                    processes: 3,
                })
                .collect(),
        })),
    }
}

struct Shared {
    sent: AtomicU64,
    acked: AtomicU64,
    connect: Semaphore,
}

/// How a simulated agent's session ended.
enum Ended {
    /// The bench is over.
    Stopped,
    /// The stream broke (the orchestrator went away): reconnect.
    Broken,
}

/// One simulated agent: attach, report every second until `stop`; when
/// the stream breaks, attach again after the real agent's backoff (backon,
/// exponential 100 ms → 5 s with jitter, as `agent/src/link.rs`), so an
/// orchestrator restart meets the herd the real fleet would send.
async fn agent(
    i: usize,
    n: usize,
    url: String,
    shared: Arc<Shared>,
    mut markers: mpsc::UnboundedReceiver<Marker>,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    use backon::BackoffBuilder as _;
    let policy = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(5))
        .with_jitter()
        .without_max_times();
    let mut backoff = policy.build();
    let mut pids: Vec<u32> = (0..UNITS).map(|u| 1000 + u).collect();
    loop {
        match session(i, n, &url, &shared, &mut pids, &mut markers, &mut stop).await {
            Ok(Ended::Stopped) => return Ok(()),
            Ok(Ended::Broken) => backoff = policy.build(),
            Err(_) => {}
        }
        let delay = backoff.next().unwrap_or(Duration::from_secs(5));
        tokio::select! {
            _ = stop.changed() => return Ok(()),
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// One attached session of a simulated agent.
async fn session(
    i: usize,
    n: usize,
    url: &str,
    shared: &Shared,
    pids: &mut [u32],
    markers: &mut mpsc::UnboundedReceiver<Marker>,
    stop: &mut watch::Receiver<bool>,
) -> anyhow::Result<Ended> {
    let host = format!("bench-{i:05}");
    let (tx, rx) = mpsc::channel::<AgentMessage>(64);
    let register = AgentMessage {
        kind: Some(agent_message::Kind::Register(Register {
            host: host.clone(),
            agent_version: "bench".into(),
            agent_instance_id: format!("bench-instance-{i}"),
            units: (0..UNITS)
                .map(|u| UnitInfo {
                    name: format!("u{u}"),
                    role: if u % 2 == 0 { Role::Prefill } else { Role::Decode } as i32,
                    base_url: format!("http://10.0.{}.{}:{}", i / 250, i % 250, 30000 + u),
                    phase: Phase::Generating as i32,
                    pid: pids[u as usize],
                    bootstrap_port: 0,
                    command_id: String::new(),
                    command_in_progress: false,
                    exit_detail: String::new(),
                    process_started_unix_ms: 0,
                })
                .collect(),
            lost_leader_url: String::new(),
        })),
    };
    tx.send(register).await?;
    let mut inbound = {
        let _permit = shared.connect.acquire().await?;
        let channel = tonic::transport::Endpoint::from_shared(url.to_string())?
            .connect()
            .await?;
        AgentLinkClient::new(channel)
            .attach(ReceiverStream::new(rx))
            .await?
            .into_inner()
    };
    // The RegisterAck.
    inbound.message().await?.context("no RegisterAck")?;
    shared.acked.fetch_add(1, Ordering::Relaxed);
    // Drain commands (none expected) so the stream stays healthy; its end
    // is the orchestrator's.
    let (broken_tx, mut broken) = oneshot::channel::<()>();
    tokio::spawn(async move {
        while let Ok(Some(_)) = inbound.message().await {}
        let _ = broken_tx.send(());
    });
    // Spread the agents' ticks over the second.
    let offset = Duration::from_micros((i as u64 * 1_000_000) / n.max(1) as u64);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + offset, Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n_tick = 0u64;
    loop {
        tokio::select! {
            _ = stop.changed() => return Ok(Ended::Stopped),
            _ = &mut broken => return Ok(Ended::Broken),
            Some((pid, reply)) = markers.recv() => {
                pids[0] = pid;
                let at = mono_ms();
                if tx.send(unit_event(0, n_tick, pid)).await.is_err() {
                    return Ok(Ended::Broken);
                }
                shared.sent.fetch_add(1, Ordering::Relaxed);
                let _ = reply.send(at);
            }
            _ = tick.tick() => {
                n_tick += 1;
                for u in 0..UNITS {
                    if tx.send(unit_event(u, n_tick, pids[u as usize])).await.is_err() {
                        return Ok(Ended::Broken);
                    }
                }
                if tx.send(snapshot(pids, n_tick)).await.is_err() {
                    return Ok(Ended::Broken);
                }
                shared.sent.fetch_add(u64::from(UNITS) + 1, Ordering::Relaxed);
            }
        }
    }
}

/// Runs one size: `n` agents for `window` of steady reporting, sampling the
/// event latency `samples` times.
pub async fn run(n: usize, window: Duration, samples: usize, seed: u64) -> anyhow::Result<ScalePoint> {
    let dir = tempfile::tempdir()?;
    let dir_s = dir.path().display().to_string();
    let (mut orch, addr) = Child::spawn_self(
        &["orchestrator-child", "--dir", &dir_s],
        &dir.path().join("orchestrator.log"),
    )?;
    let port = addr.rsplit(':').next().unwrap_or_default().to_string();
    let url = format!("http://{addr}");
    let pid = orch.pid();
    let shared = Arc::new(Shared {
        sent: AtomicU64::new(0),
        acked: AtomicU64::new(0),
        connect: Semaphore::new(64),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut marker_txs = Vec::with_capacity(n);
    let mut tasks = tokio::task::JoinSet::new();
    let t_attach = mono_ms();
    for i in 0..n {
        let (mtx, mrx) = mpsc::unbounded_channel();
        marker_txs.push(mtx);
        tasks.spawn(agent(i, n, url.clone(), shared.clone(), mrx, stop_rx.clone()));
    }
    let deadline = mono_ms() + 180_000.0;
    while (shared.acked.load(Ordering::Relaxed) as usize) < n {
        if mono_ms() > deadline || tasks.try_join_next().is_some_and(|r| !matches!(r, Ok(Ok(())))) {
            let _ = stop_tx.send(true);
            anyhow::bail!(
                "{} of {n} agents attached; an agent failed or 180 s passed",
                shared.acked.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let attach_s = (mono_ms() - t_attach) / 1000.0;
    // Let the 1 Hz ticks settle before measuring.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut control = ControlClient::new(tonic::transport::Endpoint::from_shared(url.clone())?.connect().await?)
        .max_decoding_message_size(256 << 20);
    let cpu = CpuMeter::start(pid);
    let gen_cpu = CpuMeter::start(std::process::id());
    let sent0 = shared.sent.load(Ordering::Relaxed);
    let t0 = mono_ms();
    let mut rng = Rng::new(seed);
    let mut event_ms = Vec::new();
    let mut host_status_ms = Vec::new();
    let mut lost = 0;
    // Meanwhile, a dashboard polls the whole fleet's `Status` four times a
    // second: its latency is the `Status` figure, and the event path must
    // not wait behind it.
    let (status_stop_tx, mut status_stop) = watch::channel(false);
    // Its own connection, as a dashboard would have: on a shared HTTP/2
    // connection a one-host reply queues behind the fleet's megabytes.
    let mut fleet_control = ControlClient::new(tonic::transport::Endpoint::from_shared(url.clone())?.connect().await?)
        .max_decoding_message_size(256 << 20);
    let dashboard = tokio::spawn(async move {
        let mut status_ms = Vec::new();
        let mut bytes = 0;
        let mut every = tokio::time::interval(Duration::from_millis(250));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = status_stop.changed() => break,
                _ = every.tick() => {
                    let a = mono_ms();
                    let reply = fleet_control.status(StatusRequest::default()).await?.into_inner();
                    status_ms.push(mono_ms() - a);
                    bytes = reply.json.len();
                }
            }
        }
        anyhow::Ok((status_ms, bytes))
    });
    let gap = window.as_secs_f64() * 1000.0 / samples.max(1) as f64;
    for k in 0..samples {
        let next = t0 + gap * (k + 1) as f64;
        let j = ((rng.unit() * n as f64) as usize).min(n - 1);
        let marker = MARKER_BASE + k as u32;
        let (rtx, rrx) = oneshot::channel();
        marker_txs[j].send((marker, rtx)).ok().context("agent task ended")?;
        let sent_at = rrx.await.context("agent task ended")?;
        let needle = format!("\"pid\":{marker}");
        // The orchestrator's state for that host, asked for alone (the
        // `status --host` an operator would run): the latency is the
        // event's, plus one small call.
        let one_host = StatusRequest {
            hosts: vec![format!("bench-{j:05}")],
            ..Default::default()
        };
        loop {
            let a = mono_ms();
            let reply = control.status(one_host.clone()).await?.into_inner();
            let b = mono_ms();
            host_status_ms.push(b - a);
            if reply.json.contains(&needle) {
                event_ms.push(b - sent_at);
                break;
            }
            if b - sent_at > 10_000.0 {
                lost += 1;
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let now = mono_ms();
        if next > now {
            tokio::time::sleep(Duration::from_secs_f64((next - now) / 1000.0)).await;
        }
    }
    let _ = status_stop_tx.send(true);
    let (status_ms, status_bytes_seen) = dashboard.await??;
    let elapsed_s = (mono_ms() - t0) / 1000.0;
    let point = ScalePoint {
        agents: n,
        attach_s,
        cores: cpu.cores(),
        rss: status_bytes(pid, "VmRSS").unwrap_or(0),
        hwm: status_bytes(pid, "VmHWM").unwrap_or(0),
        event_ms,
        event_lost: lost,
        status_ms,
        host_status_ms,
        status_bytes: status_bytes_seen,
        msgs_per_s: (shared.sent.load(Ordering::Relaxed) - sent0) as f64 / elapsed_s,
        generator_cores: gen_cpu.cores(),
        reattach_s: None,
    };
    drop(control);
    // The orchestrator killed (SIGKILL) and started again on the same
    // address and journal: how long until every agent is attached again.
    let acked = shared.acked.load(Ordering::Relaxed);
    orch.kill();
    let t_restart = mono_ms();
    let (mut orch, _) = Child::spawn_self(
        &["orchestrator-child", "--dir", &dir_s, "--port", &port],
        &dir.path().join("orchestrator-restarted.log"),
    )?;
    let reattach_s = loop {
        if shared.acked.load(Ordering::Relaxed) as usize >= acked as usize + n {
            break Some((mono_ms() - t_restart) / 1000.0);
        }
        if mono_ms() - t_restart > 120_000.0 {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let point = ScalePoint { reattach_s, ..point };
    let _ = stop_tx.send(true);
    while tokio::time::timeout(Duration::from_secs(10), tasks.join_next())
        .await
        .ok()
        .flatten()
        .is_some()
    {}
    orch.stop(Duration::from_secs(5));
    Ok(point)
}
