//! The single queue of messages going up to the orchestrator.
//!
//! Supervision, readiness watches and command handlers only ever push here;
//! they never wait for the network, so a slow or absent orchestrator cannot
//! stall a unit's stop or a phase observation. The link task drains it.

use pdwarden_proto::v1::{AgentMessage, agent_message::Kind};
use tokio::sync::mpsc;

#[derive(Debug, Clone)]
pub(crate) struct Outbox(mpsc::UnboundedSender<AgentMessage>);

impl Outbox {
    pub(crate) fn new() -> (Self, mpsc::UnboundedReceiver<AgentMessage>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Outbox(tx), rx)
    }

    /// Queues a message; silently dropped once the agent is shutting down.
    pub(crate) fn send(&self, kind: Kind) {
        let _ = self.0.send(AgentMessage { kind: Some(kind) });
    }

    pub(crate) fn send_message(&self, message: AgentMessage) {
        let _ = self.0.send(message);
    }
}
