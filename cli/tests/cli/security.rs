//! Issue 8, security: mutual TLS between agents and the orchestrator, operator
//! tokens with distinct roles, the actor journaled, secrets redacted, and
//! plain text only when asked for. The real server (`server::serve`) and the
//! real agent (`pdwarden_agent::run`) run in-process on loopback with
//! certificates issued by `certs::CertDir` (what `pdwarden certs` uses); the
//! CLI runs as a process.

use std::path::Path;
use std::time::Duration;

use pdwarden_orchestrator::config::OrchestratorConfig;
use pdwarden_proto::v1::{
    AgentMessage, HistoryRequest, Register, RestartPairRequest, StatusRequest, agent_link_client::AgentLinkClient,
    agent_message, control_client::ControlClient,
};
use pdwarden_security::certs::CertDir;
use pdwarden_security::operators::{hash_token, new_token};
use pdwarden_security::tls::TlsFiles;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

const DEADLINE: Duration = Duration::from_secs(20);

struct Tokens {
    read: String,
    operate: String,
}

/// A running orchestrator; stopped when dropped.
struct Orchestrator {
    url: String,
    stop: Option<oneshot::Sender<()>>,
}

impl Drop for Orchestrator {
    fn drop(&mut self) {
        let _ = self.stop.take().map(|s| s.send(()));
    }
}

async fn start(config: &str) -> Orchestrator {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let config = OrchestratorConfig::from_toml_str(config).unwrap();
    let scheme = if config.insecure_plaintext { "http" } else { "https" };
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(pdwarden_orchestrator::edge::server::serve(
        listener,
        config,
        async move {
            let _ = stopped.await;
        },
    ));
    Orchestrator {
        url: format!("{scheme}://127.0.0.1:{port}"),
        stop: Some(stop),
    }
}

fn tls_section(f: &TlsFiles) -> String {
    format!("[tls]\nca = {:?}\ncert = {:?}\nkey = {:?}\n", f.ca, f.cert, f.key)
}

/// CA, server and two agent certificates; a secure orchestrator config with
/// a `read` and an `operate` operator and one pair on host gpu-1.
fn secure_setup(dir: &Path) -> (CertDir, Tokens, String) {
    let certs = CertDir(dir.join("pki"));
    certs.init(&["localhost".into(), "127.0.0.1".into()]).unwrap();
    certs.issue_agent("gpu-1").unwrap();
    certs.issue_agent("gpu-2").unwrap();
    let tokens = Tokens {
        read: new_token(),
        operate: new_token(),
    };
    let config = format!(
        r#"listen = "127.0.0.1:0"
journal = {journal:?}
[[pair]]
name = "p"
prefill = [{{ host = "gpu-1", unit = "prefill-0" }}]
decode = [{{ host = "gpu-1", unit = "decode-0" }}]
router = [{{ host = "gpu-1", unit = "router-0" }}]
[pair.probe]
model = "m"
prompt = "hi"
warm_budget_ms = 1000
cold_allowance_ms = 2000
probe_timeout_ms = 2000
[pair.watch]
enabled = false
[[operator]]
name = "rita"
role = "read"
token_sha256 = "{read}"
[[operator]]
name = "otto"
role = "operate"
token_sha256 = "{operate}"
{tls}"#,
        journal = dir.join("journal.sqlite"),
        read = hash_token(&tokens.read),
        operate = hash_token(&tokens.operate),
        tls = tls_section(&certs.orchestrator()),
    );
    (certs, tokens, config)
}

async fn channel(url: &str, ca: &Path, identity: Option<&TlsFiles>) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap()));
    if let Some(f) = identity {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(&f.cert).unwrap(),
            std::fs::read(&f.key).unwrap(),
        ));
    }
    Channel::from_shared(url.to_string())
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
}

/// Opens `AgentLink.Attach` and sends `Register{host}`; the server's answer.
async fn attach(channel: Channel, host: &str) -> Result<(), tonic::Status> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(AgentMessage {
        kind: Some(agent_message::Kind::Register(Register {
            host: host.into(),
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let mut inbound = AgentLinkClient::new(channel)
        .attach(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    // The ack proves the stream was accepted.
    inbound
        .message()
        .await?
        .map(|_| ())
        .ok_or_else(|| tonic::Status::aborted("no ack"))
}

fn with_token<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

async fn status(channel: Channel, token: &str) -> Result<serde_json::Value, tonic::Status> {
    let reply = ControlClient::new(channel)
        .status(with_token(StatusRequest::default(), token))
        .await?;
    Ok(serde_json::from_str(&reply.into_inner().json).unwrap())
}

// Property: over mutual TLS the agent whose certificate names its host
// attaches (the real agent, through `pdwarden_agent::run`); a stream without a
// client certificate, with another host's certificate, or with a certificate
// from another CA is refused, and a plain-text client gets nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_are_admitted_only_with_a_certificate_for_their_host() {
    let dir = tempfile::tempdir().unwrap();
    let (certs, tokens, config) = secure_setup(dir.path());
    let orch = start(&config).await;
    let ca = certs.ca();

    let agent_config = pdwarden_agent::AgentConfig::from_toml_str(&format!(
        "host = \"gpu-1\"\norchestrator = {:?}\nstate_dir = {:?}\ngpu_source = \"none\"\n{}",
        orch.url,
        dir.path().join("agent"),
        tls_section(&certs.agent("gpu-1"))
    ))
    .unwrap();
    let (stop_agent, agent_stopped) = oneshot::channel::<()>();
    let agent = tokio::spawn(pdwarden_agent::run(agent_config, async move {
        let _ = agent_stopped.await;
    }));
    let deadline = Instant::now() + DEADLINE;
    loop {
        let ch = channel(&orch.url, &ca, None).await.unwrap();
        let v = status(ch, &tokens.read).await.unwrap();
        if v["agents"][0]["host"] == "gpu-1" && v["agents"][0]["connected"] == true {
            assert_eq!(v["security"]["transport"], "mutual_tls");
            assert_eq!(v["security"]["operator_auth"], "tokens");
            assert!(v["security"]["warning"].is_null(), "{v:#}");
            break;
        }
        assert!(Instant::now() < deadline, "the agent never attached: {v:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop_agent.send(());
    agent.await.unwrap().unwrap();

    // gpu-2's certificate registering as gpu-1: refused, naming both.
    let ch = channel(&orch.url, &ca, Some(&certs.agent("gpu-2"))).await.unwrap();
    let e = attach(ch, "gpu-1").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("gpu-2") && e.message().contains("gpu-1"), "{e:?}");
    // ...and as itself: admitted.
    let ch = channel(&orch.url, &ca, Some(&certs.agent("gpu-2"))).await.unwrap();
    attach(ch, "gpu-2").await.unwrap();
    // No client certificate (what the CLI has): no agent stream.
    let ch = channel(&orch.url, &ca, None).await.unwrap();
    assert_eq!(
        attach(ch, "gpu-1").await.unwrap_err().code(),
        tonic::Code::Unauthenticated
    );
    // The orchestrator's own certificate is not an agent's.
    let ch = channel(&orch.url, &ca, Some(&certs.orchestrator())).await;
    if let Ok(ch) = ch {
        assert!(attach(ch, "gpu-1").await.is_err());
    }
    // A certificate from another CA: the handshake fails.
    let other = CertDir(dir.path().join("other-pki"));
    other.init(&["127.0.0.1".into()]).unwrap();
    let rogue = other.issue_agent("gpu-1").unwrap();
    let refused = match channel(&orch.url, &ca, Some(&rogue)).await {
        Err(_) => true,
        Ok(ch) => attach(ch, "gpu-1").await.is_err(),
    };
    assert!(refused, "a certificate from another CA was accepted");
    // Plain text against the TLS port.
    let plain = orch.url.replace("https://", "http://");
    let refused = match Channel::from_shared(plain).unwrap().connect().await {
        Err(_) => true,
        Ok(ch) => attach(ch, "gpu-1").await.is_err(),
    };
    assert!(refused, "a plain-text agent was accepted");
}

// Property: the operator API needs a token; `read` may see status and history
// but not restart; `operate` may; the operation is journaled with its actor;
// `history` never shows a secret environment value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_roles_are_distinct_and_actions_carry_their_actor() {
    let dir = tempfile::tempdir().unwrap();
    let (certs, tokens, config) = secure_setup(dir.path());
    // A concluded operation whose report holds a unit environment (as a gate's does).
    {
        let j = pdwarden_orchestrator::ops::journal::Journal::open(&dir.path().join("journal.sqlite")).unwrap();
        j.begin("op-gate", "gate", "p", None).unwrap();
        let report = serde_json::json!({
            "verdict": "kept",
            "reasons": ["set HF_TOKEN=hf_secret_value and KNOB=1"],
            "versions": [{"env": {"HF_TOKEN": "hf_secret_value", "KNOB": "1"}}],
        });
        j.conclude("op-gate", "kept", &report).unwrap();
    }
    let orch = start(&config).await;
    let ca = certs.ca();
    let ch = || channel(&orch.url, &ca, None);

    let e = ControlClient::new(ch().await.unwrap())
        .status(StatusRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    assert!(e.message().contains("PDWARDEN_TOKEN"), "{e:?}");
    assert_eq!(
        status(ch().await.unwrap(), "pdw_wrong").await.unwrap_err().code(),
        tonic::Code::Unauthenticated
    );
    status(ch().await.unwrap(), &tokens.read).await.unwrap();
    let restart = |token: String| async move {
        ControlClient::new(ch().await.unwrap())
            .restart_pair(with_token(
                RestartPairRequest {
                    pair: "p".into(),
                    request_id: String::new(),
                    rolling: false,
                    only_sick: false,
                },
                &token,
            ))
            .await
            .map(|_| ())
    };
    let e = restart(tokens.read.clone()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    assert!(e.message().contains("rita") && e.message().contains("operate"), "{e:?}");
    // Past authorization, the handler answers: the agent is not connected.
    let e = restart(tokens.operate.clone()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");

    let history = ControlClient::new(ch().await.unwrap())
        .history(with_token(
            HistoryRequest {
                pair: "p".into(),
                limit: 10,
                ..Default::default()
            },
            &tokens.read,
        ))
        .await
        .unwrap()
        .into_inner()
        .json;
    assert!(!history.contains("hf_secret_value"), "{history}");
    assert!(
        history.contains("KNOB=1") && history.contains("HF_TOKEN=[redacted]"),
        "{history}"
    );

    // A verify run by otto is journaled with otto as its actor (the pair's
    // agent is a stand-in that registers the units and nothing more).
    let agent = channel(&orch.url, &ca, Some(&certs.agent("gpu-1"))).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let units = ["prefill-0", "decode-0", "router-0"]
        .iter()
        .map(|u| pdwarden_proto::v1::UnitInfo {
            name: u.to_string(),
            ..Default::default()
        })
        .collect();
    tx.send(AgentMessage {
        kind: Some(agent_message::Kind::Register(Register {
            host: "gpu-1".into(),
            units,
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let _stream = AgentLinkClient::new(agent)
        .attach(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap();
    let cli = |token: &str, args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_pdwarden"))
            .args(["--orchestrator", &orch.url, "--ca"])
            .arg(&ca)
            .args(args)
            .env("PDWARDEN_TOKEN", token)
            .output()
            .unwrap()
    };
    let out = cli(&tokens.read, &["verify", "p", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("operate"), "{out:?}");
    // otto's verify starts (the stand-in agent never answers, so it stays
    // running; its first update is enough: the actor is journaled by then).
    let mut updates = ControlClient::new(ch().await.unwrap())
        .verify_pair(with_token(
            pdwarden_proto::v1::VerifyPairRequest {
                pair: "p".into(),
                ..Default::default()
            },
            &tokens.operate,
        ))
        .await
        .unwrap()
        .into_inner();
    let first = updates.message().await.unwrap().unwrap();
    assert!(matches!(
        first.kind,
        Some(pdwarden_proto::v1::operation_update::Kind::Started(_))
    ));
    let out = cli(&tokens.read, &["history", "p", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let verify = v.as_array().unwrap().iter().find(|o| o["kind"] == "verify").unwrap();
    assert_eq!(verify["actor"], serde_json::json!({"name": "otto", "role": "operate"}));
    let text = String::from_utf8(cli(&tokens.read, &["history", "p"]).stdout).unwrap();
    assert!(text.contains("by otto"), "{text}");
    assert!(!text.contains("hf_secret_value"), "{text}");
}

// Property: without [tls] the orchestrator refuses to start unless
// insecure_plaintext says so; with it, it warns in status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_text_only_when_asked_for_and_it_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let base = format!(
        "listen = \"127.0.0.1:0\"\njournal = {:?}\n",
        dir.path().join("j.sqlite")
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = OrchestratorConfig::from_toml_str(&base).unwrap();
    let e = pdwarden_orchestrator::edge::server::serve(listener, config, std::future::pending())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("`tls`") && e.contains("insecure_plaintext"), "{e}");
    let path = dir.path().join("orchestrator.toml");
    std::fs::write(&path, &base).unwrap();
    let e = OrchestratorConfig::load(&path).unwrap_err().to_string();
    assert!(e.contains("`tls`"), "{e}");

    // The agent likewise, and an https URL needs [tls].
    let agent = |extra: &str| {
        pdwarden_agent::AgentConfig::from_toml_str(&format!(
            "host = \"h\"\norchestrator = \"http://127.0.0.1:1\"\nstate_dir = {:?}\n{extra}",
            dir.path().join("agent")
        ))
        .unwrap()
    };
    let e = pdwarden_agent::run(agent(""), std::future::pending())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("`tls`") && e.contains("insecure_plaintext"), "{e}");

    let orch = start(&format!("{base}insecure_plaintext = true\n")).await;
    let deadline = Instant::now() + DEADLINE;
    let v = loop {
        match ControlClient::connect(orch.url.clone()).await {
            Ok(mut c) => break c.status(StatusRequest::default()).await.unwrap().into_inner().json,
            Err(e) => assert!(Instant::now() < deadline, "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let v: serde_json::Value = serde_json::from_str(&v).unwrap();
    assert_eq!(v["security"]["transport"], "insecure_plaintext");
    assert!(v["security"]["warning"].as_str().unwrap().contains("INSECURE"), "{v:#}");
}
