//! The output check (issue 34, DESIGN.md 18): after a healthy probe series,
//! one greedy request (temperature 0, seed 0, the tokens' logprobs) through
//! the same path — the first router, or the pair's own KV path — and its
//! tokens held to the reference of the same identity (model and what the
//! pair runs: the config fingerprint). The rule is the judge's
//! (`judge::golden`); here the request, the identity and the reference.
//!
//! Every report carries the reference it was held to (or, healthy with
//! none, the one it recorded), so the newest report of the pair that names
//! this identity holds its reference: no separate store, and a reference
//! is never older than the pair's last [`REFERENCE_LOOKBACK`] operations.

use super::*;
use pdwarden_model::judge::golden::{
    Alternative, AnswerToken, GoldenRecord, GreedyAnswer, OutputCheck, OutputIdentity, Reference, compare,
};
use pdwarden_model::status::OperationRecord;

/// Tokens the greedy request asks for: a few dozen, enough that a
/// corrupted KV path or other weights show (they differ within a few
/// tokens) at the cost of one short request.
pub(super) const GREEDY_TOKENS: u32 = 32;

/// Operations of the pair searched, newest first, for a reference.
pub(super) const REFERENCE_LOOKBACK: u32 = 50;

/// The greedy answer a probe result carries (`ProbeResult.answer`).
pub(super) fn answer_from_wire(r: &pdwarden_proto::v1::ProbeResult) -> GreedyAnswer {
    GreedyAnswer {
        tokens: r
            .answer
            .iter()
            .map(|t| AnswerToken {
                token: t.token.clone(),
                logprob: t.logprob,
                top: t
                    .top
                    .iter()
                    .map(|a| Alternative {
                        token: a.token.clone(),
                        logprob: a.logprob,
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// The pair's operations, newest first, as far as [`REFERENCE_LOOKBACK`].
fn recent(journal: &Journal, pair: &str) -> Vec<OperationRecord> {
    journal.history(pair, REFERENCE_LOOKBACK).unwrap_or_else(|e| {
        tracing::warn!(pair, error = %e, "cannot read history: no reference answer for the output check");
        Vec::new()
    })
}

/// The newest reference of `identity` among the pair's operations.
pub(super) fn reference_for(journal: &Journal, pair: &str, identity: &OutputIdentity) -> Option<Reference> {
    recent(journal, pair).into_iter().find_map(|op| {
        let golden: GoldenRecord = serde_json::from_value(op.report?.get("golden")?.clone()).ok()?;
        golden.reference.filter(|r| &r.identity == identity)
    })
}

/// What the pair runs now, for a verification (which starts nothing): the
/// fingerprint of its newest co-restart.
fn running_fingerprint(journal: &Journal, pair: &str) -> String {
    recent(journal, pair)
        .into_iter()
        .filter(|op| op.kind == OperationKind::CoRestart.as_str())
        .find_map(|op| Some(op.report?.get("fingerprint")?.as_str()?.to_string()))
        .unwrap_or_default()
}

impl CoRestart<'_> {
    /// The identity this operation's answer belongs to.
    fn output_identity(&self, kind: OperationKind, fingerprint: String) -> OutputIdentity {
        OutputIdentity {
            model: self.pair.probe.model.clone(),
            fingerprint: match kind {
                OperationKind::CoRestart => fingerprint,
                OperationKind::Verify { .. } => running_fingerprint(&self.ctx.journal, &self.pair.name),
            },
        }
    }

    /// Sends the greedy request along the probe series' path and judges
    /// its answer; `None` for a pair with no path to send it on.
    pub(super) async fn check_output(&mut self, kind: OperationKind) -> Option<GoldenRecord> {
        let via = match (&self.direct, self.pair.router.first()) {
            (Some(_), _) => self.pair.prefill.first().cloned(),
            (None, Some(router)) => Some(router.clone()),
            (None, None) => None,
        }?;
        let target = match &self.direct {
            Some(path) => format!("kv:{} -> {}", path.prefill_url, path.decode_url),
            None => format!("router:{}", via.unit),
        };
        let identity = self.output_identity(kind, self.fingerprint());
        let chat = ChatProbe {
            greedy: true,
            max_tokens: GREEDY_TOKENS,
            ..self.chat_probe()
        };
        let seq = self.probes.len() as u32 + 1;
        let (obs, _record, result) = self.probe_once_with(&via.host, &via.unit, &target, seq, chat).await;
        let mut answer = None;
        let mut reference = None;
        let check = match (&obs, result) {
            (ProbeObservation::Ok { .. }, Some(r)) if r.answer_logprobs_missing || r.answer.is_empty() => {
                OutputCheck::NoLogprobs
            }
            (ProbeObservation::Ok { .. }, Some(r)) => {
                let got = answer_from_wire(&r);
                reference = reference_for(&self.ctx.journal, &self.pair.name, &identity);
                let check = match &reference {
                    Some(reference) => compare(reference, &got),
                    None => OutputCheck::NoReference {
                        tokens: got.tokens.len(),
                    },
                };
                answer = Some(got);
                check
            }
            (ProbeObservation::Timeout { after_ms }, _) => OutputCheck::Unanswered {
                error: format!("no answer within {after_ms} ms"),
            },
            (ProbeObservation::Error { message }, _) => OutputCheck::Unanswered { error: message.clone() },
            (ProbeObservation::Ok { .. }, None) => OutputCheck::Unanswered {
                error: "the agent's report carried no result".into(),
            },
        };
        let record = GoldenRecord {
            identity,
            check,
            reference,
            answer,
        };
        self.rec.journal_entry(self.rec.now_ms(), "output_check", &record);
        Some(record)
    }
}

/// The record the report keeps: a healthy operation that found no
/// reference records its answer as the next operations' reference.
pub(super) fn kept(mut golden: GoldenRecord, healthy: bool, operation_id: &str) -> GoldenRecord {
    if healthy
        && matches!(golden.check, OutputCheck::NoReference { .. })
        && let Some(answer) = &golden.answer
    {
        golden.reference = Some(Reference {
            identity: golden.identity.clone(),
            answer: answer.clone(),
            operation_id: operation_id.to_string(),
            pinned: false,
        });
    }
    golden
}
