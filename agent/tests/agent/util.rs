//! Fixtures: a scriptable fake engine (HTTP) and a fake orchestrator (gRPC).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use pdwarden_proto::v1::agent_link_server::{AgentLink, AgentLinkServer};
use pdwarden_proto::v1::{AgentMessage, OrchestratorMessage};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};

/// How long any awaited event may take before a test fails.
pub const EVENT_DEADLINE: Duration = Duration::from_secs(15);

/// A loopback port that nothing listens on (bound, then released).
pub async fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

/// What the fake engine answers; tests change it as they go.
#[derive(Default)]
pub struct EngineScript {
    pub health_status: AtomicU16,
    /// Delay before answering /health, in ms.
    pub health_delay_ms: AtomicU64,
    pub generate_status: AtomicU16,
    /// completion_tokens of chat answers (0 = an empty completion).
    pub chat_tokens: AtomicU32,
    pub health_hits: AtomicU32,
    pub generate_hits: AtomicU32,
    /// (x-request-id, x-pdwarden-probe, body) of each chat request.
    pub chats: Mutex<Vec<(String, String, serde_json::Value)>>,
}

impl EngineScript {
    pub fn new(health: u16, generate: u16, tokens: u32) -> Arc<Self> {
        let s = EngineScript::default();
        s.health_status.store(health, Ordering::SeqCst);
        s.generate_status.store(generate, Ordering::SeqCst);
        s.chat_tokens.store(tokens, Ordering::SeqCst);
        Arc::new(s)
    }
}

/// An SGLang-shaped HTTP engine serving `EngineScript`'s answers.
pub struct FakeEngine {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
}

impl FakeEngine {
    /// Serves `script` on `port` (0: any free port).
    pub async fn serve(port: u16, script: Arc<EngineScript>) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new()
            .route("/health", get(health))
            .route("/health_generate", get(generate))
            .route("/v1/chat/completions", post(chat))
            // vLLM's surface (issue 15): no generating GET; the served
            // model, and completions.
            .route("/v1/models", get(models))
            .route("/v1/completions", post(completion))
            .with_state(script);
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        FakeEngine { addr, stop: Some(stop) }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for FakeEngine {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

fn code(s: &AtomicU16) -> StatusCode {
    StatusCode::from_u16(s.load(Ordering::SeqCst)).unwrap()
}

async fn health(State(s): State<Arc<EngineScript>>) -> StatusCode {
    s.health_hits.fetch_add(1, Ordering::SeqCst);
    let delay = s.health_delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    code(&s.health_status)
}

async fn generate(State(s): State<Arc<EngineScript>>) -> StatusCode {
    s.generate_hits.fetch_add(1, Ordering::SeqCst);
    code(&s.generate_status)
}

/// Records a generation request (its request id, probe tag and body) and
/// returns how many tokens the script says to answer with.
fn record(s: &EngineScript, headers: &HeaderMap, body: serde_json::Value) -> u32 {
    let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    s.chats
        .lock()
        .unwrap()
        .push((h("x-request-id"), h("x-pdwarden-probe"), body));
    s.chat_tokens.load(Ordering::SeqCst)
}

async fn models() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "object": "list", "data": [{ "id": "tiny-llama", "object": "model" }] }))
}

/// A completion: `chat_tokens` tokens of text (none: the engine answers
/// but generates nothing); recorded with the chats.
async fn completion(
    State(s): State<Arc<EngineScript>>,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> Json<serde_json::Value> {
    let tokens = record(&s, &headers, body);
    Json(serde_json::json!({
        "id": "x",
        "object": "text_completion",
        "choices": [{"index": 0, "text": "ok ".repeat(tokens as usize), "finish_reason": "length"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": 5 + tokens},
    }))
}

async fn chat(
    State(s): State<Arc<EngineScript>>,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> Json<serde_json::Value> {
    let tokens = record(&s, &headers, body);
    let content = "ok ".repeat(tokens as usize);
    Json(serde_json::json!({
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": 5 + tokens},
    }))
}

/// One agent's attach stream, as seen by the fake orchestrator.
pub struct Session {
    pub inbound: tonic::Streaming<AgentMessage>,
    /// Send commands; drop to end the stream from the orchestrator's side.
    pub commands: Option<mpsc::UnboundedSender<Result<OrchestratorMessage, tonic::Status>>>,
    /// Messages read ahead by `next_matching` but not yet consumed.
    pub backlog: VecDeque<AgentMessage>,
}

impl Session {
    pub fn send(&self, msg: OrchestratorMessage) {
        self.commands.as_ref().unwrap().send(Ok(msg)).unwrap();
    }

    /// The next message from the agent (backlog first), within the deadline.
    pub async fn next(&mut self) -> AgentMessage {
        if let Some(m) = self.backlog.pop_front() {
            return m;
        }
        tokio::time::timeout(EVENT_DEADLINE, self.inbound.message())
            .await
            .expect("no message from the agent in time")
            .expect("stream error")
            .expect("stream ended")
    }
}

/// A fake orchestrator: every attach becomes a `Session` handed to the test.
pub struct FakeOrchestrator {
    pub url: String,
    sessions: mpsc::UnboundedReceiver<Session>,
    stop: Option<oneshot::Sender<()>>,
}

struct LinkService {
    sessions: mpsc::UnboundedSender<Session>,
}

#[tonic::async_trait]
impl AgentLink for LinkService {
    type AttachStream = UnboundedReceiverStream<Result<OrchestratorMessage, tonic::Status>>;

    async fn attach(
        &self,
        request: tonic::Request<tonic::Streaming<AgentMessage>>,
    ) -> Result<tonic::Response<Self::AttachStream>, tonic::Status> {
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = self.sessions.send(Session {
            inbound: request.into_inner(),
            commands: Some(tx),
            backlog: VecDeque::new(),
        });
        Ok(tonic::Response::new(UnboundedReceiverStream::new(rx)))
    }
}

impl FakeOrchestrator {
    pub async fn start() -> Self {
        Self::start_on(0).await
    }

    /// Serves on `port` (0: any free port).
    pub async fn start_on(port: u16) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, sessions) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(AgentLinkServer::new(LinkService { sessions: tx }))
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        FakeOrchestrator {
            url,
            sessions,
            stop: Some(stop),
        }
    }

    /// The next agent attach, within the deadline.
    pub async fn accept(&mut self) -> Session {
        tokio::time::timeout(EVENT_DEADLINE, self.sessions.recv())
            .await
            .expect("the agent did not attach in time")
            .unwrap()
    }
}

impl Drop for FakeOrchestrator {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// Kills process groups by PID when dropped, so a failing test leaves
/// nothing behind.
#[derive(Default)]
pub struct PidGuard(pub Vec<u32>);

impl Drop for PidGuard {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if pid > 1 {
                let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
    }
}

/// True while a process (group) with this id exists.
pub fn alive(pid: u32) -> bool {
    killpg(Pid::from_raw(pid as i32), None::<Signal>).is_ok()
}

/// Polls `cond` until it holds, failing the test after the deadline.
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + EVENT_DEADLINE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An agent running in-process; `shutdown()` resolves its shutdown future.
pub struct Agent {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), pdwarden_agent::AgentError>>,
}

impl Agent {
    pub fn start(config: pdwarden_agent::AgentConfig) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(pdwarden_agent::run(config, async move {
            let _ = stopped.await;
        }));
        Agent { stop: Some(stop), task }
    }

    pub async fn shutdown(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(std::time::Duration::from_secs(30), &mut self.task)
            .await
            .expect("agent did not shut down")
            .unwrap()
            .unwrap();
    }
}
