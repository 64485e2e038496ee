//! The output check (issue 34, DESIGN.md 18): once the probe series and
//! the suite found the pair healthy, one greedy request (temperature 0,
//! seed 0, the tokens' logprobs) through the same path — the first router, or the pair's own KV path — and its
//! tokens held to the reference of the same identity (model and what the
//! pair runs: the config fingerprint). The rule is the judge's
//! (`judge::golden`); here the request, the identity and the reference.
//!
//! Every report carries the reference it was held to (or, healthy with
//! none, the one it recorded), so the newest report of the pair that names
//! this identity holds its reference: no separate store, and a reference
//! is never older than the pair's last [`REFERENCE_LOOKBACK`] operations.
//!
//! An xPyD pair (more than one prefill or decode) answers along every
//! prefill → decode path, not only the one its router picked: the same
//! greedy request is also sent straight along each path (the prefill's
//! agent sends it, as the direct proofs do), one request per path (P×D,
//! one at a time: a batch could change the last bits), each answer held to
//! the reference, or with none to the other paths' (`compare_paths`). A
//! 1P1D pair sends the one request.
//!
//! The operator pins a reference with `verify NAME --record-reference`
//! (journaled as the operation's [`RECORD_REFERENCE`] entry): the answer
//! is held to nothing (it says what the reference it replaces found), the
//! paths are held to it, and it becomes the reference — pinned — only if
//! the verification is otherwise healthy.

use super::*;
use pdwarden_model::judge::golden::{
    Alternative, AnswerToken, GoldenRecord, GreedyAnswer, OutputCheck, OutputIdentity, PathAnswer, PathCheck,
    Reference, compare, compare_paths, path_name,
};
use pdwarden_model::status::OperationRecord;

/// Tokens the greedy request asks for: a few dozen, enough that a
/// corrupted KV path or other weights show (they differ within a few
/// tokens) at the cost of one short request.
pub(crate) const GREEDY_TOKENS: u32 = 32;

/// Operations of the pair searched, newest first, for a reference.
pub(super) const REFERENCE_LOOKBACK: u32 = 50;

/// The journal entry (an opening entry of a verification) by which the
/// operator pins its greedy answer as the pair's reference (`pdwarden
/// verify NAME --record-reference`). Journaled, not carried in the
/// operation's kind: a resumed verification still pins.
pub const RECORD_REFERENCE: &str = "record_reference";

/// Whether the operator asked operation `operation_id` to pin its answer.
pub(super) fn pin_requested(journal: &Journal, operation_id: &str) -> bool {
    journal
        .read::<serde_json::Value>(operation_id, RECORD_REFERENCE)
        .unwrap_or_default()
        .iter()
        .any(|v| v.as_bool() == Some(true))
}

/// The answer a greedy probe got, or the finding for one it did not get.
fn answer_of(
    obs: &ProbeObservation,
    record: &ProbeRecord,
    result: Option<pdwarden_proto::v1::ProbeResult>,
) -> Result<GreedyAnswer, OutputCheck> {
    match (obs, result) {
        (ProbeObservation::Ok { .. }, Some(r)) if r.answer_logprobs_missing || r.answer.is_empty() => {
            Err(OutputCheck::NoLogprobs)
        }
        (ProbeObservation::Ok { .. }, Some(r)) => Ok(answer_from_wire(&r)),
        // A timeout is a timeout (issue 47): judged by the timeout rules,
        // never wrong output.
        (ProbeObservation::Timeout { after_ms }, result) => Err(OutputCheck::TimedOut {
            after_ms: *after_ms,
            // No agent result: the orchestrator ended the wait, and the
            // record says why (the engines' stall proof).
            why: if result.is_none() {
                record.error.clone()
            } else {
                String::new()
            },
        }),
        (ProbeObservation::Error { message }, _) => Err(OutputCheck::Unanswered { error: message.clone() }),
        (ProbeObservation::Ok { .. }, None) => Err(OutputCheck::Unanswered {
            error: "the agent's report carried no result".into(),
        }),
    }
}

/// The greedy answer a probe result carries (`ProbeResult.answer`).
pub(crate) fn answer_from_wire(r: &pdwarden_proto::v1::ProbeResult) -> GreedyAnswer {
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

/// The deadline of a greedy request of `tokens` (issue 47): the pair's
/// first-token budget plus its tokens at the TPOT budget, from the suite's
/// budgets when derived; before them, the probe timeout scaled from the
/// probe's own tokens to these. Never under the probe timeout: it asks for
/// more than a probe, with logprobs.
pub(crate) fn greedy_deadline_ms(
    pair: &crate::config::PairConfig,
    budgets: Option<&pdwarden_model::judge::suite::SuiteBudgets>,
    tokens: u32,
) -> u64 {
    let probe = pair.probe.probe_timeout_ms;
    let scaled = match budgets {
        Some(b) => b
            .ttft_ms
            .saturating_add(b.tpot_us.saturating_mul(u64::from(tokens)) / 1_000)
            .saturating_add(b.warm_budget_ms),
        None => probe.saturating_mul(u64::from(tokens.max(1))) / u64::from(pair.probe.max_tokens.max(1)),
    };
    probe.max(scaled)
}

/// The reference the pair's answers are held to now: the model it serves,
/// the fingerprint of its newest co-restart (issue 46: a repair's matrix
/// holds every path's greedy answer to it).
pub(crate) fn current_reference(journal: &Journal, pair: &crate::config::PairConfig) -> Option<Reference> {
    let identity = OutputIdentity {
        model: pair.probe.model.clone(),
        fingerprint: running_fingerprint(journal, &pair.name),
    };
    reference_for(journal, &pair.name, &identity)
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

    fn greedy_probe(&self) -> ChatProbe {
        ChatProbe {
            greedy: true,
            max_tokens: GREEDY_TOKENS,
            ..self.chat_probe()
        }
    }

    /// Sends the greedy request along the probe series' path and judges
    /// its answer (`pin`: the operator pins it as the reference); in an
    /// xPyD pair, along every prefill → decode path too. `None` for a pair
    /// with no path to send it on.
    pub(super) async fn check_output(
        &mut self,
        kind: OperationKind,
        pin: bool,
    ) -> Option<(GoldenRecord, Vec<PathCheck>)> {
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
        let seq = self.probes.len() as u32 + 1;
        let (obs, record, result) = self
            .probe_once_with(&via.host, &via.unit, &target, seq, self.greedy_probe())
            .await;
        let reference = reference_for(&self.ctx.journal, &self.pair.name, &identity);
        let got = answer_of(&obs, &record, result);
        let check = match (&got, &reference) {
            (Err(finding), _) => finding.clone(),
            (Ok(got), reference) if pin => OutputCheck::Pinned {
                tokens: got.tokens.len(),
                replaced: reference.as_ref().map(|r| Box::new(compare(r, got))),
            },
            (Ok(got), Some(reference)) => compare(reference, got),
            (Ok(got), None) => OutputCheck::NoReference {
                tokens: got.tokens.len(),
            },
        };
        let answer = got.ok();
        // The paths are held to what the answer is: the pinned one, the
        // reference, or (none) each other's.
        let pinned = match (&answer, pin) {
            (Some(a), true) => Some(Reference {
                identity: identity.clone(),
                answer: a.clone(),
                operation_id: self.rec.operation_id.clone(),
                pinned: true,
            }),
            _ => None,
        };
        let held_to = match (&pinned, &reference) {
            (Some(p), _) => Some((p, true)),
            (None, Some(r)) => Some((r, false)),
            (None, None) => None,
        };
        let paths = if self.pair.prefill.len() > 1 || self.pair.decode.len() > 1 {
            let answers = self.answers_along_every_path(seq + 1).await;
            let paths = compare_paths(held_to, &answers);
            self.rec.journal_entry(self.rec.now_ms(), "output_paths", &paths);
            paths
        } else {
            Vec::new()
        };
        let record = GoldenRecord {
            identity,
            check,
            reference,
            answer,
        };
        self.rec.journal_entry(self.rec.now_ms(), "output_check", &record);
        Some((record, paths))
    }

    /// The greedy request sent straight along each prefill → decode path
    /// of the pair (every prefill with every decode), one at a time, by the
    /// prefill's agent over the agents' registered URLs and bootstrap
    /// ports (`ProbeRequest.pd_path`, as the direct proofs send it).
    async fn answers_along_every_path(&self, first_seq: u32) -> Vec<PathAnswer> {
        let facts = |u: &UnitRef| {
            self.ctx
                .agents
                .unit(&u.host, &u.unit)
                .map(|i| (i.base_url.trim_end_matches('/').to_string(), i.bootstrap_port))
                .filter(|(url, _)| !url.is_empty())
        };
        let mut out = Vec::new();
        let mut seq = first_seq;
        for p in &self.pair.prefill {
            for d in &self.pair.decode {
                let answer = match (facts(p), facts(d)) {
                    (Some((prefill_url, bootstrap_port)), Some((decode_url, _))) => {
                        let path = PdPath {
                            bootstrap_host: crate::ops::drain::url_host(&prefill_url).to_string(),
                            bootstrap_port,
                            decode_url,
                            prefill_url,
                        };
                        let target = format!("kv:{} -> {}", path.prefill_url, path.decode_url);
                        let (obs, record, result) = self
                            .probe_along(&p.host, &p.unit, &target, seq, self.greedy_probe(), Some(path))
                            .await;
                        seq += 1;
                        answer_of(&obs, &record, result)
                    }
                    _ => Err(OutputCheck::Unanswered {
                        error: format!(
                            "the URL of {} or {} is unknown: its agent is not connected",
                            p.unit, d.unit
                        ),
                    }),
                };
                // "host/unit": a unit of the same name on another host is
                // another engine (issue 46, item 5).
                out.push(PathAnswer {
                    prefill: p.to_string(),
                    decode: d.to_string(),
                    answer,
                });
            }
        }
        tracing::debug!(
            paths = ?out.iter().map(|a| path_name(&a.prefill, &a.decode)).collect::<Vec<_>>(),
            "greedy answers along every path"
        );
        out
    }
}

/// The record the report keeps: a healthy operation that found no
/// reference records its answer as the next operations' reference; one
/// the operator pinned records it pinned, whatever reference it replaces.
/// An operation that is not healthy records nothing.
pub(super) fn kept(mut golden: GoldenRecord, healthy: bool, operation_id: &str) -> GoldenRecord {
    let pinned = matches!(golden.check, OutputCheck::Pinned { .. });
    if healthy
        && (pinned || matches!(golden.check, OutputCheck::NoReference { .. }))
        && let Some(answer) = &golden.answer
    {
        golden.reference = Some(Reference {
            identity: golden.identity.clone(),
            answer: answer.clone(),
            operation_id: operation_id.to_string(),
            pinned,
        });
    }
    golden
}

/// The report's line for a verification the operator asked to pin its
/// answer (`kept` already applied): pinned, or why nothing was recorded.
pub(super) fn pin_line(golden: Option<&GoldenRecord>, operation_id: &str, healthy: bool) -> String {
    let recorded = golden
        .and_then(|g| g.reference.as_ref())
        .filter(|r| r.pinned && r.operation_id == operation_id);
    if let Some(r) = recorded {
        return format!(
            "reference pinned (--record-reference): this verification's greedy answer ({} tokens) is the pair's reference for model {} from now on",
            r.answer.tokens.len(),
            r.identity.model
        );
    }
    let stays = match golden.and_then(|g| g.reference.as_ref()) {
        Some(r) => format!("the reference stays operation {}'s", r.operation_id),
        None => "the pair's reference, if it has one, stays".to_string(),
    };
    let why = match golden {
        _ if !healthy => "the verification is not healthy",
        None => "the pair has no path to send the greedy request on",
        Some(_) => "this verification got no greedy answer with logprobs to record",
    };
    format!("--record-reference: nothing recorded: {why} ({stays})")
}
