//! The agent's one connection to the orchestrator (DESIGN.md 1: agents dial
//! out): an `AgentLink.Attach` stream carrying registration, events, command
//! results and probe results up, and commands down.
//!
//! The link is the only part of the agent that knows about the network.
//! When the stream breaks it reconnects with exponential backoff
//! (100 ms → 5 s, jittered, reset once the orchestrator has spoken on a new
//! stream) and re-registers with the current facts. Supervision never waits
//! for the link.
//!
//! Messages produced while disconnected are dropped, not replayed: the
//! `Register` sent on reconnect carries every unit's current phase and pid,
//! and replaying older events after it would make the orchestrator's view go
//! backwards. A message in flight when the stream breaks may be lost too.
//! Command results are safe to lose: the orchestrator resends the command
//! with the same id and gets the original reply (see `commands`). Buffering
//! events for replay is left for later.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use pdwarden_proto::v1::{
    AgentMessage, Heartbeat, OrchestratorMessage, Register, agent_link_client::AgentLinkClient, agent_message::Kind,
    orchestrator_message,
};
use thiserror::Error;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;
use tracing::{info, warn};

use crate::commands::Dispatcher;

pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(3);
const ATTACH_TIMEOUT: Duration = Duration::from_secs(5);
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

#[derive(Debug, Error)]
pub enum LinkError {
    #[error("invalid orchestrator URL {url:?}")]
    Url {
        url: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("cannot connect to the orchestrator")]
    Connect(#[source] tonic::transport::Error),
    #[error("orchestrator refused the attach stream")]
    Attach(#[source] tonic::Status),
    #[error("orchestrator did not answer the attach within {} ms", ATTACH_TIMEOUT.as_millis())]
    AttachTimeout,
}

/// The orchestrator's endpoint; `tls` is mutual TLS (`None` only under
/// `insecure_plaintext`).
pub(crate) fn endpoint(url: &str, tls: Option<tonic::transport::ClientTlsConfig>) -> Result<Endpoint, LinkError> {
    let mut e = Endpoint::from_shared(url.to_owned()).map_err(|source| LinkError::Url {
        url: url.to_owned(),
        source,
    })?;
    if let Some(tls) = tls {
        e = e.tls_config(tls).map_err(|source| LinkError::Url {
            url: url.to_owned(),
            source,
        })?;
    }
    Ok(e.connect_timeout(Duration::from_secs(3))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true))
}

struct Session {
    tx: mpsc::Sender<AgentMessage>,
    inbound: tonic::Streaming<OrchestratorMessage>,
}

enum SessionEnd {
    Shutdown,
    /// The stream broke; `heard` says whether the orchestrator had sent
    /// anything on it (which resets the backoff).
    Lost {
        heard: bool,
    },
}

async fn open_session(endpoint: &Endpoint, register: Register) -> Result<Session, LinkError> {
    let channel = endpoint.connect().await.map_err(LinkError::Connect)?;
    let mut client = AgentLinkClient::new(channel);
    let (tx, rx) = mpsc::channel(256);
    // Queued before the call: a server may wait for Register before it
    // answers the attach.
    let _ = tx
        .send(AgentMessage {
            kind: Some(Kind::Register(register)),
        })
        .await;
    let response = tokio::time::timeout(ATTACH_TIMEOUT, client.attach(ReceiverStream::new(rx)))
        .await
        .map_err(|_| LinkError::AttachTimeout)?
        .map_err(LinkError::Attach)?;
    Ok(Session {
        tx,
        inbound: response.into_inner(),
    })
}

/// Keeps the link up until `shutdown` resolves. `after_attach` gives the
/// messages sent right after `Register` on every new stream (the latest GPU
/// and host snapshot).
pub(crate) async fn run<F: Future<Output = ()>>(
    endpoint: Endpoint,
    register: impl Fn() -> Register,
    after_attach: impl Fn() -> Vec<AgentMessage>,
    dispatcher: &Arc<Dispatcher>,
    outbox: &mut mpsc::UnboundedReceiver<AgentMessage>,
    mut shutdown: Pin<&mut F>,
) {
    let policy = ExponentialBuilder::default()
        .with_min_delay(MIN_BACKOFF)
        .with_max_delay(MAX_BACKOFF)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    let mut backoff = policy.build();
    loop {
        let mut dropped = 0usize;
        while outbox.try_recv().is_ok() {
            dropped += 1;
        }
        if dropped > 0 {
            warn!(
                dropped,
                "dropped messages produced while disconnected; Register carries the current facts"
            );
        }
        let attempt = tokio::select! {
            r = open_session(&endpoint, register()) => r,
            () = shutdown.as_mut() => return,
        };
        match attempt {
            Ok(session) => {
                info!(orchestrator = %endpoint.uri(), "attached to the orchestrator");
                for m in after_attach() {
                    let _ = session.tx.send(m).await;
                }
                match run_session(session, dispatcher, outbox, shutdown.as_mut()).await {
                    SessionEnd::Shutdown => return,
                    SessionEnd::Lost { heard } => {
                        if heard {
                            backoff = policy.build();
                        }
                    }
                }
            }
            Err(e) => warn!(error = %crate::checks::error_chain(&e), "orchestrator link down"),
        }
        let delay = backoff.next().unwrap_or(MAX_BACKOFF);
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.as_mut() => return,
        }
    }
}

async fn run_session<F: Future<Output = ()>>(
    mut session: Session,
    dispatcher: &Arc<Dispatcher>,
    outbox: &mut mpsc::UnboundedReceiver<AgentMessage>,
    mut shutdown: Pin<&mut F>,
) -> SessionEnd {
    let mut heard = false;
    let mut heartbeat = tokio::time::interval_at(Instant::now() + HEARTBEAT_INTERVAL, HEARTBEAT_INTERVAL);
    loop {
        let up = tokio::select! {
            () = shutdown.as_mut() => return SessionEnd::Shutdown,
            msg = session.inbound.message() => match msg {
                Ok(Some(msg)) => {
                    heard = true;
                    match msg.kind {
                        Some(orchestrator_message::Kind::Command(cmd)) => {
                            dispatcher.handle(cmd, Instant::now());
                        }
                        Some(orchestrator_message::Kind::RegisterAck(ack)) => {
                            info!(orchestrator_instance_id = %ack.orchestrator_instance_id, "registered");
                        }
                        None => {}
                    }
                    continue;
                }
                Ok(None) => {
                    warn!("orchestrator closed the attach stream");
                    return SessionEnd::Lost { heard };
                }
                Err(status) => {
                    warn!(error = %status, "attach stream failed");
                    return SessionEnd::Lost { heard };
                }
            },
            out = outbox.recv() => match out {
                Some(msg) => msg,
                // The agent dropped every producer: it is shutting down.
                None => return SessionEnd::Shutdown,
            },
            _ = heartbeat.tick() => AgentMessage { kind: Some(Kind::Heartbeat(Heartbeat {})) },
        };
        if session.tx.send(up).await.is_err() {
            warn!("attach stream closed while sending");
            return SessionEnd::Lost { heard };
        }
    }
}
