//! GPU state from an agent's fake GPU file to `pdwarden status`: the real
//! orchestrator (`server::serve`) and the real agent (`pdwarden_agent::run`)
//! in-process on loopback, then the Control `Status` RPC and the CLI binary.

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::time::Duration;

use pdwarden_orchestrator::config::OrchestratorConfig;
use pdwarden_proto::v1::{StatusRequest, control_client::ControlClient};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::time::Instant;

const DEADLINE: Duration = Duration::from_secs(20);

/// Replaces the fake GPU file atomically, as the source expects.
fn write_gpus(path: &Path, json: &serde_json::Value) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, json.to_string()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Kills and reaps a child by PID when dropped, so a failing test leaves nothing behind.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn status_json(url: &str) -> serde_json::Value {
    let mut client = ControlClient::connect(url.to_owned()).await.unwrap();
    let reply = client.status(StatusRequest::default()).await.unwrap().into_inner();
    serde_json::from_str(&reply.json).unwrap()
}

/// Polls `Status` until `cond` holds on its JSON, failing after the deadline.
async fn status_until(url: &str, what: &str, cond: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let v = status_json(url).await;
        if cond(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; last status: {v:#}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn run_cli(url: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pdwarden"))
        .arg("--orchestrator")
        .arg(url)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pdwarden {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

// Property: an Xid event and a foreign process in an agent's fake GPU file
// reach `pdwarden status --json` (host report and findings) and the human
// `status`, which shows the GPU's memory bar and marks the foreign process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xid_event_and_foreign_process_reach_status() {
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let config = OrchestratorConfig::from_toml_str(&format!(
        "listen = \"127.0.0.1:0\"\njournal = {:?}\ninsecure_plaintext = true\n",
        dir.path().join("journal.sqlite")
    ))
    .unwrap();
    let (stop_orch, orch_stopped) = oneshot::channel::<()>();
    let orch = tokio::spawn(pdwarden_orchestrator::edge::server::serve(
        listener,
        config,
        async move {
            let _ = orch_stopped.await;
        },
    ));

    let foreign = Reaped(
        std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap(),
    );
    let gpus = dir.path().join("gpus.json");
    write_gpus(
        &gpus,
        &serde_json::json!({"gpus": [{
            "index": 0, "uuid": "GPU-0", "name": "Fake H100", "memory_used_bytes": 40u64 << 30,
            "memory_total_bytes": 80u64 << 30, "utilization_gpu_pct": 0, "temperature_c": 38,
            "processes": [{"pid": foreign.0.id(), "used_memory_bytes": 40u64 << 30}],
        }]}),
    );
    let agent_config = pdwarden_agent::AgentConfig::from_toml_str(&format!(
        r#"
        host = "gpu-1"
        orchestrator = "{url}"
        insecure_plaintext = true
        state_dir = {:?}
        gpu_source = "fake:{}"
        gpu_sample_interval_ms = 50
        gpu_snapshot_interval_ms = 60000
        "#,
        dir.path().join("agent"),
        gpus.display()
    ))
    .unwrap();
    let (stop_agent, agent_stopped) = oneshot::channel::<()>();
    let agent = tokio::spawn(pdwarden_agent::run(agent_config, async move {
        let _ = agent_stopped.await;
    }));

    let v = status_until(&url, "the foreign process in status", |v| {
        v["findings"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x["kind"] == "foreign_gpu_process"))
    })
    .await;
    let report = &v["agents"][0]["host_report"];
    assert_eq!(report["gpu_source"], "fake");
    assert_eq!(report["gpus"][0]["processes"][0]["foreign"], true);
    assert_eq!(report["gpus"][0]["processes"][0]["command_line"], "sleep 30");

    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&gpus).unwrap()).unwrap();
    json["events"] = serde_json::json!([{"gpu_index": 0, "gpu_uuid": "GPU-0", "kind": "xid", "xid": 79}]);
    write_gpus(&gpus, &json);
    let v = status_until(&url, "the Xid event in status", |v| {
        v["agents"][0]["host_report"]["events"]
            .as_array()
            .is_some_and(|e| !e.is_empty())
    })
    .await;
    let ev = &v["agents"][0]["host_report"]["events"][0];
    assert_eq!((ev["kind"].as_str(), ev["xid"].as_u64()), (Some("xid"), Some(79)));
    assert_eq!(ev["meaning"], "GPU has fallen off the bus");
    let critical = &v["findings"][0];
    assert_eq!(
        (critical["severity"].as_str(), critical["kind"].as_str()),
        (Some("critical"), Some("gpu_event"))
    );
    assert!(critical["message"].as_str().unwrap().contains("Xid 79"), "{critical}");

    // The CLI, as an operator runs it: --json carries the same, the text marks it.
    let cli_json: serde_json::Value = serde_json::from_str(&run_cli(&url, &["status", "--json"])).unwrap();
    assert_eq!(cli_json["agents"][0]["host_report"]["events"][0]["xid"], 79);
    let text = run_cli(&url, &["status"]);
    assert!(
        text.contains("gpu0 Fake H100 [##########..........] 40.0/80.0 GiB  util 0%"),
        "{text}"
    );
    assert!(text.contains(&format!("! pid {:<7} FOREIGN", foreign.0.id())), "{text}");
    assert!(
        text.contains("CRITICAL gpu-1: gpu0 Xid 79 (GPU has fallen off the bus)"),
        "{text}"
    );

    // One host: the same facts for gpu-1; a host nobody attached from is an
    // error naming it, not an empty answer.
    let one: serde_json::Value =
        serde_json::from_str(&run_cli(&url, &["status", "--host", "gpu-1", "--json"])).unwrap();
    assert_eq!(one["agents"].as_array().unwrap().len(), 1);
    assert_eq!(one["agents"][0]["host_report"]["events"][0]["xid"], 79);
    assert!(
        one["findings"].as_array().unwrap().iter().all(|f| f["host"] == "gpu-1"),
        "{one:#}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pdwarden"))
        .args(["--orchestrator", &url, "status", "--host", "gpu-9"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("hosts") && err.contains("\"gpu-9\""),
        "{err}"
    );

    let _ = stop_agent.send(());
    tokio::time::timeout(DEADLINE, agent).await.unwrap().unwrap().unwrap();
    let _ = stop_orch.send(());
    tokio::time::timeout(DEADLINE, orch).await.unwrap().unwrap().unwrap();
    drop(foreign);
}
