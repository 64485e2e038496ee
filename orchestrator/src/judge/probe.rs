//! What one end-to-end probe found: the one vocabulary of the verdicts, the
//! watch and the reports (before, the co-restart's `ProbeObservation`, the
//! watch's `ProbeOutcome`, the wire's `ProbeOutcome` and the reports'
//! strings each said it their own way, and an agent's error was worded
//! differently depending on who had asked).

use pdwarden_proto::v1::{ProbeOutcome as WireOutcome, ProbeResult};
use serde::Serialize;

/// One end-to-end generation through a router, as judged.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ProbeObservation {
    /// Answered with `tokens` completion tokens in `latency_ms`.
    Ok { latency_ms: u64, tokens: u32 },
    /// No complete answer within the probe's timeout.
    Timeout { after_ms: u64 },
    /// Anything else: an HTTP error, a refused connection, no tokens, no
    /// answer from the agent.
    Error { message: String },
}

impl ProbeObservation {
    /// The agent's answer, read once for everyone.
    pub fn from_wire(r: &ProbeResult) -> Self {
        match WireOutcome::try_from(r.outcome).unwrap_or(WireOutcome::Unspecified) {
            WireOutcome::Ok => Self::Ok {
                latency_ms: r.latency_ms,
                tokens: r.tokens,
            },
            WireOutcome::Timeout => Self::Timeout { after_ms: r.latency_ms },
            _ => Self::Error {
                message: if r.http_status != 0 && !r.error.starts_with("http ") {
                    format!("http {}: {}", r.http_status, r.error)
                } else {
                    r.error.clone()
                },
            },
        }
    }

    pub fn is_ok(&self) -> bool {
        matches!(self, Self::Ok { .. })
    }

    /// The latency of an answered probe.
    pub fn latency(&self) -> Option<u64> {
        match self {
            Self::Ok { latency_ms, .. } => Some(*latency_ms),
            _ => None,
        }
    }

    /// As the reports spell it: `ok`, `timeout`, `error`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Ok { .. } => "ok",
            Self::Timeout { .. } => "timeout",
            Self::Error { .. } => "error",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The agent's HTTP error is named once, whether or not its text
    /// already starts with the status.
    #[test]
    fn wire_errors_read_the_same_for_everyone() {
        let r = |error: &str| ProbeResult {
            outcome: WireOutcome::Error as i32,
            http_status: 503,
            error: error.into(),
            ..Default::default()
        };
        let message = |o: ProbeObservation| match o {
            ProbeObservation::Error { message } => message,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            message(ProbeObservation::from_wire(&r("overloaded"))),
            "http 503: overloaded"
        );
        assert_eq!(message(ProbeObservation::from_wire(&r("http 503"))), "http 503");
        let ok = ProbeResult {
            outcome: WireOutcome::Ok as i32,
            latency_ms: 12,
            tokens: 8,
            ..Default::default()
        };
        assert_eq!(
            ProbeObservation::from_wire(&ok),
            ProbeObservation::Ok {
                latency_ms: 12,
                tokens: 8
            }
        );
    }
}
