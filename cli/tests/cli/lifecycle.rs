//! Issue 16, the orchestrator's own life: a SIGTERM with an agent attached
//! ends the server within its grace (finding 8), and a second orchestrator
//! on the same journal is refused, naming the first (finding 3). The real
//! server and the real agent run in-process on loopback.

use std::time::Duration;

use pdwarden_orchestrator::config::OrchestratorConfig;
use pdwarden_orchestrator::edge::server::{SHUTDOWN_GRACE, serve};
use pdwarden_proto::v1::{StatusRequest, control_client::ControlClient};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::time::Instant;

const DEADLINE: Duration = Duration::from_secs(20);

fn config(dir: &std::path::Path) -> OrchestratorConfig {
    OrchestratorConfig::from_toml_str(&format!(
        "listen = \"127.0.0.1:0\"\njournal = {:?}\ninsecure_plaintext = true\n",
        dir.join("journal.sqlite")
    ))
    .unwrap()
}

/// An orchestrator served in-process on a free loopback port.
struct Orchestrator {
    addr: std::net::SocketAddr,
    url: String,
    stop: oneshot::Sender<()>,
    served: tokio::task::JoinHandle<Result<(), pdwarden_orchestrator::edge::server::ServeError>>,
}

impl Orchestrator {
    /// Serves `config` and waits until it answers.
    async fn start(config: OrchestratorConfig) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(serve(listener, config, async move {
            let _ = stopped.await;
        }));
        let url = format!("http://{addr}");
        let deadline = Instant::now() + DEADLINE;
        // Answered, not merely connected: the kernel accepts a connection
        // into the listener's backlog before `serve` has even opened its
        // journal (a second orchestrator started then took the journal
        // first, and this test's "second is refused" hung one run in ten).
        loop {
            let answered = match ControlClient::connect(url.clone()).await {
                Ok(mut c) => c.status(StatusRequest::default()).await.is_ok(),
                Err(_) => false,
            };
            if answered {
                break;
            }
            assert!(Instant::now() < deadline, "the orchestrator never answered");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Orchestrator {
            addr,
            url,
            stop,
            served,
        }
    }

    /// Signals shutdown and waits (bounded) for `serve` to return cleanly.
    async fn shut_down(self) {
        self.stop.send(()).unwrap();
        tokio::time::timeout(DEADLINE, self.served)
            .await
            .expect("serve returns")
            .unwrap()
            .expect("serve ends cleanly");
    }
}

/// Waits until `status` lists an attached agent for `host`.
async fn agent_attached(url: &str, host: &str) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Ok(mut c) = ControlClient::connect(url.to_string()).await
            && let Ok(r) = c.status(StatusRequest::default()).await
        {
            let v: serde_json::Value = serde_json::from_str(&r.into_inner().json).unwrap();
            if v["agents"]
                .as_array()
                .is_some_and(|a| a.iter().any(|a| a["host"] == host && a["connected"] == true))
            {
                return;
            }
        }
        assert!(Instant::now() < deadline, "agent {host} never attached");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Finding 8: SIGTERM with an agent attached left the orchestrator alive a
/// minute later, its port bound (graceful shutdown waited for the agent's
/// stream, which never ends on its own). Now it returns within its grace
/// and the port can be bound again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_an_agent_attached_ends_within_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let Orchestrator {
        addr,
        url,
        stop,
        served: server,
    } = Orchestrator::start(config(dir.path())).await;
    let agent_config = pdwarden_agent::AgentConfig::from_toml_str(&format!(
        "host = \"h1\"\norchestrator = {url:?}\nstate_dir = {:?}\ninsecure_plaintext = true\n",
        dir.path().join("agent")
    ))
    .unwrap();
    let (agent_stop, agent_stopped) = oneshot::channel::<()>();
    let agent = tokio::spawn(pdwarden_agent::run(agent_config, async move {
        let _ = agent_stopped.await;
    }));
    agent_attached(&url, "h1").await;

    let signalled = Instant::now();
    stop.send(()).unwrap();
    let ended = tokio::time::timeout(SHUTDOWN_GRACE + Duration::from_secs(10), server).await;
    let took = signalled.elapsed();
    let _ = agent_stop.send(());
    let _ = tokio::time::timeout(DEADLINE, agent).await;
    ended
        .unwrap_or_else(|_| panic!("the orchestrator still runs {took:?} after its shutdown signal"))
        .unwrap()
        .expect("serve ends cleanly");
    assert!(took <= SHUTDOWN_GRACE + Duration::from_secs(5), "{took:?}");
    TcpListener::bind(addr).await.expect("the port is free again");
}

/// Finding 3: a second orchestrator on the same journal took the first
/// one's live operation for interrupted and overwrote its verdict. Now it
/// refuses to start, naming the first; the first goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_orchestrator_on_the_same_journal_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let first = Orchestrator::start(config(dir.path())).await;
    let first_addr = first.addr;

    let second = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let e = tokio::time::timeout(DEADLINE, serve(second, config(dir.path()), std::future::pending()))
        .await
        .expect("the second orchestrator ends at once")
        .expect_err("the second orchestrator is refused")
        .to_string();
    assert!(
        e.contains(&format!(
            "is owned by another orchestrator (pid {}, listening on {first_addr})",
            std::process::id()
        )),
        "{e}"
    );
    assert!(!e.contains('\n'), "{e}");
    let mut c = ControlClient::connect(first.url.clone())
        .await
        .expect("the first still serves");
    c.status(StatusRequest::default())
        .await
        .expect("the first still answers");
    first.shut_down().await;
}

/// Finding 10: `pdwarden status | true` panicked on the broken pipe (exit
/// 101, outside the documented exit codes). With its reader gone before it
/// writes a byte, it now ends 0, as the status it could not show was read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_went_away_is_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let orch = Orchestrator::start(config(dir.path())).await;
    let url = orch.url.clone();
    for args in [&["status"][..], &["status", "--json"], &["history", "nope"]] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = tokio::task::spawn_blocking({
            let url = url.clone();
            let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            move || {
                std::process::Command::new(env!("CARGO_BIN_EXE_pdwarden"))
                    .arg("--orchestrator")
                    .arg(&url)
                    .args(&args)
                    .stdout(writer)
                    .stderr(std::process::Stdio::piped())
                    .output()
                    .unwrap()
            }
        })
        .await
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(
            matches!(out.status.code(), Some(0..=2)),
            "{args:?} ended {:?}: {stderr}",
            out.status
        );
    }
    orch.shut_down().await;
}

/// Finding 5: a decode whose `argv[0]` does not exist. The restart stopped
/// and restarted the prefill, then failed at the decode, leaving decode and
/// router stopped. Now the preflight refuses it before anything is touched,
/// naming the program; the prefill keeps its process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_that_cannot_start_refuses_the_restart_before_anything_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    let config = OrchestratorConfig::from_toml_str(&format!(
        r#"listen = "127.0.0.1:0"
journal = {:?}
insecure_plaintext = true
[[pair]]
name = "p"
prefill = [{{ host = "h1", unit = "prefill-0" }}]
decode = [{{ host = "h1", unit = "decode-0" }}]
router = [{{ host = "h1", unit = "router-0" }}]
[pair.probe]
model = "m"
prompt = "hi"
warm_budget_ms = 1000
cold_allowance_ms = 3000
probe_timeout_ms = 5000
[pair.watch]
auto_recover = false
"#,
        dir.path().join("journal.sqlite")
    ))
    .unwrap();
    let orch = Orchestrator::start(config).await;
    let url = orch.url.clone();
    let unit = |name: &str, role: &str, argv: &str, port: u16| {
        format!(
            "[[unit]]\nname = '{name}'\nrole = '{role}'\nargv = {argv}\nbase_url = 'http://127.0.0.1:{port}'\nautostart = true\n"
        )
    };
    let agent_config = pdwarden_agent::AgentConfig::from_toml_str(&format!(
        "host = \"h1\"\norchestrator = {url:?}\nstate_dir = {:?}\ninsecure_plaintext = true\non_exit = \"stop-units\"\n{}{}{}",
        dir.path().join("agent"),
        unit("prefill-0", "prefill", "['sleep', '600']", 1),
        unit("decode-0", "decode", "['/nope/engine', '--serve']", 2),
        unit("router-0", "router", "['sleep', '600']", 3),
    ))
    .unwrap();
    let (agent_stop, agent_stopped) = oneshot::channel::<()>();
    let agent = tokio::spawn(pdwarden_agent::run(agent_config, async move {
        let _ = agent_stopped.await;
    }));
    agent_attached(&url, "h1").await;
    let prefill_pid = |v: &serde_json::Value| {
        v["agents"][0]["units"]
            .as_array()
            .and_then(|u| u.iter().find(|u| u["name"] == "prefill-0"))
            .and_then(|u| u["pid"].as_u64())
    };
    let status = || async {
        let mut c = ControlClient::connect(url.clone()).await.unwrap();
        let r = c.status(StatusRequest::default()).await.unwrap();
        serde_json::from_str::<serde_json::Value>(&r.into_inner().json).unwrap()
    };
    let deadline = Instant::now() + DEADLINE;
    let before = loop {
        if let Some(pid) = prefill_pid(&status().await) {
            break pid;
        }
        assert!(Instant::now() < deadline, "the prefill never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    let mut c = ControlClient::connect(url.clone()).await.unwrap();
    let refused = c
        .restart_pair(pdwarden_proto::v1::RestartPairRequest {
            pair: "p".into(),
            request_id: "r1".into(),
            rolling: false,
            only_sick: false,
        })
        .await
        .expect_err("the restart is refused");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    let said = refused.message();
    assert!(
        said.starts_with(
            "preflight refused it, nothing was touched: decode-0: argv[0] \"/nope/engine\" does not exist"
        ),
        "{said}"
    );
    assert_eq!(prefill_pid(&status().await), Some(before), "the prefill was touched");
    let mut c = ControlClient::connect(url.clone()).await.unwrap();
    let history = c
        .history(pdwarden_proto::v1::HistoryRequest {
            pair: "p".into(),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .json;
    assert_eq!(history.trim(), "[]", "nothing journaled: {history}");

    let _ = agent_stop.send(());
    tokio::time::timeout(DEADLINE, agent).await.unwrap().unwrap().unwrap();
    orch.shut_down().await;
}

/// Finding 4: two agents for one host (the same identity, two state dirs)
/// kicked each other off several times a second and `status` flipped
/// between their facts. The second live instance is refused; the first
/// keeps the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_for_one_host_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let orch = Orchestrator::start(config(dir.path())).await;
    let url = orch.url.clone();
    let agent = |state: &str| {
        let c = pdwarden_agent::AgentConfig::from_toml_str(&format!(
            "host = \"h1\"\norchestrator = {url:?}\nstate_dir = {:?}\ninsecure_plaintext = true\n",
            dir.path().join(state)
        ))
        .unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        (
            tx,
            tokio::spawn(pdwarden_agent::run(c, async move {
                let _ = rx.await;
            })),
        )
    };
    let instance = || async {
        let mut c = ControlClient::connect(url.clone()).await.unwrap();
        let r = c.status(StatusRequest::default()).await.unwrap();
        let v: serde_json::Value = serde_json::from_str(&r.into_inner().json).unwrap();
        v["agents"][0]["agent_instance_id"].as_str().unwrap_or("").to_string()
    };
    let (stop_first, first) = agent("first");
    agent_attached(&url, "h1").await;
    let first_instance = instance().await;
    let (stop_second, second) = agent("second");
    // Three seconds of the second one dialling in (its backoff starts
    // short): the host's facts never change hands.
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(instance().await, first_instance, "the host changed hands");
    }
    let _ = stop_second.send(());
    let _ = stop_first.send(());
    let _ = tokio::time::timeout(DEADLINE, second).await;
    let _ = tokio::time::timeout(DEADLINE, first).await;
    orch.shut_down().await;
}
