//! What one end-to-end probe found: the one vocabulary of the verdicts, the
//! watch and the reports (before, the co-restart's `ProbeObservation`, the
//! watch's `ProbeOutcome`, the wire's `ProbeOutcome` and the reports'
//! strings each said it their own way, and an agent's error was worded
//! differently depending on who had asked).

use pdwarden_proto::v1::{ProbeOutcome as WireOutcome, ProbeResult};
use serde::Serialize;

use crate::judge::answer::answer_error;
use crate::judge::stats::secs;

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
            // The client layer (issue 30): an answer that says it was cut
            // short — `abort`, `error`, fewer tokens than asked without
            // `stop` or `length` — is an error, not an answer.
            WireOutcome::Ok => match answer_error(r.tokens, r.tokens_asked, &r.finish_reason, "") {
                Some(e) => Self::Error {
                    message: format!("answered in {} but {e}", secs(r.latency_ms)),
                },
                None => Self::Ok {
                    latency_ms: r.latency_ms,
                    tokens: r.tokens,
                },
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

    /// Issue 30: a 200 answer cut short (`abort`, or fewer tokens than
    /// asked with no finish reason) is an error; a complete one is not.
    #[test]
    fn an_answer_cut_short_is_an_error_not_an_answer() {
        let r = |tokens: u32, finish: &str| ProbeResult {
            outcome: WireOutcome::Ok as i32,
            http_status: 200,
            latency_ms: 40,
            tokens,
            tokens_asked: 8,
            finish_reason: finish.into(),
            ..Default::default()
        };
        assert!(ProbeObservation::from_wire(&r(8, "length")).is_ok());
        assert!(ProbeObservation::from_wire(&r(3, "stop")).is_ok());
        for (tokens, finish) in [(3, ""), (3, "abort"), (8, "error"), (1, "abort")] {
            match ProbeObservation::from_wire(&r(tokens, finish)) {
                ProbeObservation::Error { message } => assert!(message.contains("answered in"), "{message}"),
                other => panic!("{tokens} {finish:?}: {other:?}"),
            }
        }
    }

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
