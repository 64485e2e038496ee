//! GPU and host reporting, end to end through the agent with the fake GPU
//! source and real processes: the mapping of GPU processes to units through
//! descendants, foreign processes, a dead unit's leftovers, Xid events, a
//! real H200's NVML reading replayed, the no-driver path and `/metrics`.

use std::os::unix::process::CommandExt as _;
use std::path::Path;

use pdwarden_agent::AgentConfig;
use pdwarden_proto::v1::{
    AgentMessage, Command, GpuEvent, GpuProcess, HostSnapshot, OrchestratorMessage, StopUnit, agent_message::Kind,
    command::Action, orchestrator_message,
};

use crate::util::{Agent, FakeOrchestrator, PidGuard, Session, free_port, wait_until};

fn config(orchestrator: &str, state_dir: &Path, extra: &str, units: &str) -> AgentConfig {
    AgentConfig::from_toml_str(&format!(
        r#"
        host = "gpu-host"
        orchestrator = "{orchestrator}"
        insecure_plaintext = true
        state_dir = {state_dir:?}
        on_exit = "stop-units"
        shutdown_grace_ms = 2000
        gpu_sample_interval_ms = 50
        gpu_snapshot_interval_ms = 60000
        {extra}
        {units}
        "#
    ))
    .unwrap()
}

/// Replaces the fake GPU file atomically, as the source expects.
fn write_gpus(path: &Path, json: &serde_json::Value) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, json.to_string()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Reads messages until `pick` returns Some.
async fn until<T>(s: &mut Session, mut pick: impl FnMut(&AgentMessage) -> Option<T>) -> T {
    loop {
        let m = s.next().await;
        if let Some(t) = pick(&m) {
            return t;
        }
    }
}

/// The next snapshot that satisfies `cond`.
async fn snapshot_where(s: &mut Session, cond: impl Fn(&HostSnapshot) -> bool) -> HostSnapshot {
    until(s, |m| match &m.kind {
        Some(Kind::HostSnapshot(h)) if cond(h) => Some(h.clone()),
        _ => None,
    })
    .await
}

fn process(s: &HostSnapshot, pid: u32) -> Option<&GpuProcess> {
    s.gpus.iter().flat_map(|g| &g.processes).find(|p| p.pid == pid)
}

/// The children of `pid`, from /proc (field 4 of /proc/N/stat is the parent).
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        let Some(close) = stat.rfind(')') else { continue };
        let ppid = stat[close + 1..]
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(child);
        }
    }
    out
}

const SHELL_UNIT: &str = r#"
        [[unit]]
        name = "shell-0"
        role = "prefill"
        argv = ["sh", "-c", "sleep 30 & wait"]
        base_url = "http://127.0.0.1:9"
        autostart = true
"#;

/// An agent with the fake GPU source (the file starting as `initial`)
/// supervising `SHELL_UNIT`, beside a `sleep` nobody supervises: the stage of
/// the mapping tests.
struct WithForeign {
    _orch: FakeOrchestrator,
    _dir: tempfile::TempDir,
    gpus: std::path::PathBuf,
    guard: PidGuard,
    foreign: std::process::Child,
    agent: Agent,
    s: Session,
    unit_pid: u32,
}

impl WithForeign {
    async fn start(initial: &serde_json::Value) -> Self {
        let mut orch = FakeOrchestrator::start().await;
        let dir = tempfile::tempdir().unwrap();
        let gpus = dir.path().join("gpus.json");
        write_gpus(&gpus, initial);
        let mut guard = PidGuard::default();
        let foreign = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        guard.0.push(foreign.id());
        let extra = format!("gpu_source = \"fake:{}\"", gpus.display());
        let agent = Agent::start(config(&orch.url, dir.path(), &extra, SHELL_UNIT));
        let mut s = orch.accept().await;
        let unit_pid = until(&mut s, |m| match &m.kind {
            Some(Kind::Register(r)) => Some(r.units[0].pid),
            _ => None,
        })
        .await;
        assert_ne!(unit_pid, 0, "autostarted unit has a pid");
        guard.0.push(unit_pid);
        Self {
            _orch: orch,
            _dir: dir,
            gpus,
            guard,
            foreign,
            agent,
            s,
            unit_pid,
        }
    }

    /// Stops the agent, then every process the test started.
    async fn finish(mut self) {
        self.agent.shutdown().await;
        let _ = self.foreign.kill();
        let _ = self.foreign.wait();
        drop(self.guard);
    }
}

// Property: a GPU process that is a grandchild of a unit's process belongs to
// that unit; a process nobody supervises is foreign, with its command line and
// user; once the unit's own process dies, what it left on the GPU is reported
// as held by a dead unit; an Xid event in the fake file is streamed once; a
// pending row remap is sent at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_processes_map_to_units_foreign_dead_and_events() {
    let mut rig = WithForeign::start(
        &serde_json::json!({"gpus": [{"index": 0, "uuid": "GPU-0", "memory_total_bytes": 80u64 << 30}]}),
    )
    .await;
    let (gpus, unit_pid, foreign_pid) = (rig.gpus.clone(), rig.unit_pid, rig.foreign.id());
    let s = &mut rig.s;
    let mut grandchild = 0;
    wait_until("the unit's shell to fork its sleep", || {
        grandchild = children_of(unit_pid).first().copied().unwrap_or(0);
        grandchild != 0
    })
    .await;

    write_gpus(
        &gpus,
        &serde_json::json!({"gpus": [{
            "index": 0, "uuid": "GPU-0", "name": "Fake H100", "memory_used_bytes": 52u64 << 30,
            "memory_total_bytes": 80u64 << 30, "utilization_gpu_pct": 3,
            "processes": [
                {"pid": grandchild, "used_memory_bytes": 40u64 << 30},
                {"pid": foreign_pid, "used_memory_bytes": 12u64 << 30},
            ],
        }]}),
    );
    let snap = snapshot_where(s, |h| h.gpus.first().is_some_and(|g| g.processes.len() == 2)).await;
    assert_eq!(snap.gpu_source, "fake");
    assert_eq!(snap.gpu_unavailable, "");
    let mine = process(&snap, grandchild).unwrap();
    assert_eq!(
        (mine.unit.as_str(), mine.foreign, mine.unit_dead),
        ("shell-0", false, false)
    );
    assert_eq!(mine.used_memory_bytes, Some(40 << 30));
    let theirs = process(&snap, foreign_pid).unwrap();
    assert!(theirs.foreign && theirs.unit.is_empty(), "{theirs:?}");
    assert_eq!(theirs.command_line, "sleep 30");
    assert!(
        !theirs.user.is_empty() && theirs.user == mine.user,
        "{theirs:?} / {mine:?}"
    );
    let usage = snap.units.iter().find(|u| u.unit == "shell-0").unwrap();
    assert_eq!(usage.pid, unit_pid);
    assert!(usage.processes >= 2 && usage.rss_bytes > 0, "{usage:?}");
    assert!(snap.host.as_ref().unwrap().memory_total_bytes > 0);

    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&gpus).unwrap()).unwrap();
    json["events"] = serde_json::json!([{"gpu_index": 0, "gpu_uuid": "GPU-0", "kind": "xid", "xid": 79, "detail": "GPU has fallen off the bus"}]);
    write_gpus(&gpus, &json);
    let ev: GpuEvent = until(s, |m| match &m.kind {
        Some(Kind::GpuEvent(e)) => Some(e.clone()),
        _ => None,
    })
    .await;
    assert_eq!((ev.kind.as_str(), ev.xid, ev.gpu_uuid.as_str()), ("xid", 79, "GPU-0"));

    // A row remapping that turns pending is news: sent at once, not at the
    // next periodic snapshot (60 s here).
    json.as_object_mut().unwrap().remove("events");
    json["gpus"][0]["remapped_rows"] = serde_json::json!({"uncorrectable": 1, "pending": true});
    write_gpus(&gpus, &json);
    let snap = snapshot_where(s, |h| h.gpus.first().is_some_and(|g| g.remapped_rows.is_some())).await;
    let r = snap.gpus[0].remapped_rows.as_ref().unwrap();
    assert_eq!(
        (r.correctable, r.uncorrectable, r.pending, r.failure),
        (0, 1, true, false)
    );

    // Kill only the unit's own process: its sleep is re-parented but keeps
    // the unit's process group, and still holds (fake) GPU memory.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(unit_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let snap = snapshot_where(s, |h| process(h, grandchild).is_some_and(|p| p.unit_dead)).await;
    let left = process(&snap, grandchild).unwrap();
    assert_eq!((left.unit.as_str(), left.foreign), ("shell-0", false));
    assert_eq!(snap.units.iter().find(|u| u.unit == "shell-0").unwrap().pid, 0);

    rig.finish().await;
}

// Property: a reading NVML gave on a real H200 (`pdwarden-agent --gpu-report
// nvml` while two processes held memory; tests/fixtures/h200-nvml-busy.json,
// remapped rows included: all zero there, as `nvidia-smi -q -d ROW_REMAPPER`
// said) replays through the fake source figure for figure, and with its two PIDs
// replaced by a unit's process and an unsupervised one here, the mapping comes
// out as it did on that machine: one process owned by the unit, one foreign.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h200_nvml_reading_replays_through_the_fake_source() {
    let fixture: serde_json::Value = serde_json::from_str(include_str!("../fixtures/h200-nvml-busy.json")).unwrap();
    let mut rig = WithForeign::start(&serde_json::json!({"gpus": []})).await;
    let (unit_pid, foreign_pid) = (rig.unit_pid, rig.foreign.id());

    let mut reading = fixture.clone();
    // On the H200 the first process was the unsupervised one, the second the unit's.
    reading["gpus"][0]["processes"][0]["pid"] = foreign_pid.into();
    reading["gpus"][0]["processes"][1]["pid"] = unit_pid.into();
    write_gpus(&rig.gpus, &reading);
    let snap = snapshot_where(&mut rig.s, |h| h.gpus.first().is_some_and(|g| g.processes.len() == 2)).await;
    let g = &snap.gpus[0];
    let want = &fixture["gpus"][0];
    assert_eq!(g.name, "NVIDIA H200");
    assert_eq!(g.uuid, want["uuid"].as_str().unwrap());
    assert_eq!(g.memory_total_bytes, want["memory_total_bytes"].as_u64().unwrap());
    assert_eq!(g.memory_used_bytes, want["memory_used_bytes"].as_u64().unwrap());
    assert_eq!(
        (
            g.power_draw_mw,
            g.power_limit_mw,
            g.temperature_c,
            g.utilization_gpu_pct
        ),
        (Some(139_705), Some(700_000), Some(42), Some(4))
    );
    let ecc = g.ecc.as_ref().expect("the H200 reported ECC counts");
    assert_eq!(ecc.volatile_uncorrected + ecc.aggregate_uncorrected, 0);
    assert_eq!(g.retired_pages, None, "Hopper retires no pages");
    let rows = g
        .remapped_rows
        .as_ref()
        .expect("Hopper remaps rows: the H200 reported them");
    assert_eq!(
        (rows.correctable, rows.uncorrectable, rows.pending, rows.failure),
        (0, 0, false, false)
    );
    assert!(g.read_errors.is_empty(), "{:?}", g.read_errors);
    let mine = process(&snap, unit_pid).unwrap();
    assert_eq!((mine.unit.as_str(), mine.foreign), ("shell-0", false));
    assert_eq!(mine.used_memory_bytes, Some(2_923_429_888));
    let theirs = process(&snap, foreign_pid).unwrap();
    assert!(theirs.foreign && theirs.unit.is_empty(), "{theirs:?}");
    assert_eq!(theirs.used_memory_bytes, Some(2_386_558_976));
    rig.finish().await;
}

/// A `libnvidia-ml.so` that is not there, under `dir`: NVML cannot load, so
/// the no-driver path runs on every host, driver or not.
fn missing_nvml_library(dir: &Path) -> std::path::PathBuf {
    dir.join("no-driver").join("libnvidia-ml.so.1")
}

/// What the agent says when NVML cannot be loaded from `library`.
fn cannot_load(library: &Path) -> String {
    format!("cannot load the NVML library {}", library.display())
}

// Property: with `gpu_source = "nvml"` where the NVIDIA driver cannot be
// loaded, the agent says why GPU reporting is unavailable (naming the
// library), keeps reporting host figures and serving /metrics, and still
// executes commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_driver_reports_why_and_keeps_running() {
    let mut orch = FakeOrchestrator::start().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().await;
    let library = missing_nvml_library(dir.path());
    let extra = format!("gpu_source = \"nvml\"\nnvml_library = {library:?}\nmetrics_listen = \"127.0.0.1:{port}\"");
    let unit = "[[unit]]\nname = \"idle-0\"\nrole = \"decode\"\nargv = [\"sleep\", \"30\"]\nbase_url = \"http://127.0.0.1:9\"\n";
    let agent = Agent::start(config(&orch.url, dir.path(), &extra, unit));
    let mut s = orch.accept().await;
    let snap = snapshot_where(&mut s, |_| true).await;
    assert_eq!(snap.gpu_source, "nvml");
    assert!(snap.gpus.is_empty());
    assert!(
        snap.gpu_unavailable.starts_with(&cannot_load(&library)),
        "reason: {}",
        snap.gpu_unavailable
    );
    assert!(snap.host.as_ref().unwrap().cpu_count > 0);

    let body = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        body.contains("pdwarden_gpu_reporting_available{host=\"gpu-host\",source=\"nvml\"} 0"),
        "{body}"
    );
    assert!(
        body.contains("pdwarden_host_memory_total_bytes{host=\"gpu-host\"}"),
        "{body}"
    );

    s.send(OrchestratorMessage {
        kind: Some(orchestrator_message::Kind::Command(Command {
            fencing_token: 0,
            command_id: "stop-1".into(),
            action: Some(Action::Stop(StopUnit {
                unit: "idle-0".into(),
                grace_ms: 1000,
            })),
        })),
    });
    let r = until(&mut s, |m| match &m.kind {
        Some(Kind::CommandResult(r)) if r.command_id == "stop-1" => Some(r.clone()),
        _ => None,
    })
    .await;
    assert!(r.ok, "{r:?}");
    agent.shutdown().await;
}

// Property: `auto` without a driver falls back to no GPU reporting and says
// why, naming the library it could not load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_without_driver_is_none_with_reason() {
    let mut orch = FakeOrchestrator::start().await;
    let dir = tempfile::tempdir().unwrap();
    let library = missing_nvml_library(dir.path());
    let extra = format!("gpu_source = \"auto\"\nnvml_library = {library:?}");
    let agent = Agent::start(config(&orch.url, dir.path(), &extra, ""));
    let mut s = orch.accept().await;
    let snap = snapshot_where(&mut s, |_| true).await;
    assert_eq!(snap.gpu_source, "none");
    let want = format!("GPU reporting is off: NVML is not available ({}", cannot_load(&library));
    assert!(snap.gpu_unavailable.starts_with(&want), "{}", snap.gpu_unavailable);
    agent.shutdown().await;
}

// Property: `pdwarden-agent --gpu-report` prints a reading a fake source can
// replay, and where the driver cannot be loaded `--gpu-report nvml` fails
// with the reason, naming the library (`--nvml-library`).
#[test]
fn gpu_report_flag() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpus.json");
    std::fs::write(
        &path,
        r#"{"gpus":[{"index":0,"uuid":"GPU-0","processes":[{"pid":7}]}]}"#,
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pdwarden-agent"))
        .arg("--gpu-report")
        .arg(format!("fake:{}", path.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["gpus"][0]["processes"][0]["pid"], 7);
    let library = missing_nvml_library(dir.path());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pdwarden-agent"))
        .args(["--gpu-report", "nvml", "--nvml-library"])
        .arg(&library)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--gpu-report nvml") && err.contains(&cannot_load(&library)),
        "{err}"
    );

    // `--nvml-library` is the library loaded, driver or not: one that loads
    // but is not NVML (the C library) lacks NVML's first symbol.
    let libc = std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))
        })
        .map(str::to_owned)
        .expect("the C library in /proc/self/maps");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pdwarden-agent"))
        .args(["--gpu-report", "nvml", "--nvml-library", &libc])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("the NVML library {libc} is too old or broken: missing")),
        "{err}"
    );

    // The flag goes with `--gpu-report` only: an agent run by `--config`
    // takes the config's `nvml_library`, never a flag it would ignore.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pdwarden-agent"))
        .args(["--config", "/nonexistent/agent.toml", "--nvml-library", &libc])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("'--config <PATH>' cannot be used with '--nvml-library <PATH>'"),
        "{err}"
    );
}
