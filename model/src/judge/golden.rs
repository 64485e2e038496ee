//! Golden output (issue 34, DESIGN.md 18): a pair that answers fast but
//! wrong is never healthy.
//!
//! Every other check asks whether tokens come back in time. The field's
//! worst failures answer HTTP 200 with the wrong tokens: a KV-layout
//! mismatch between prefill and decode (llm-d's rollout guide: "returns a
//! 200 with wrong output"), decode reusing KV pages too early under load
//! (sgl-project/sglang#24527), a checkpoint re-synced on disk under the same
//! path, a prefill and a decode on different weights mid-upgrade. So after
//! every restart one fixed greedy request (temperature 0, a fixed seed, the
//! tokens' logprobs asked for) goes through the router and the KV path, and
//! its tokens are compared with a reference recorded at the first healthy
//! verification of the same identity (model, engine and config
//! fingerprint), or pinned by the operator.
//!
//! # The rule
//! Only the **first** differing token is judged: every token after it is
//! conditioned on a different prefix and says nothing more. At that
//! position the **reference's** own distribution decides:
//! - the new token was within [`NEAR_TIE_NATS`] of the reference's token in
//!   the reference's `top_logprobs` → numerical noise (batching, kernels,
//!   thread counts change the last bits of a logit): reported and allowed;
//! - the reference's token was clearly preferred (the new token further
//!   below it, or not among the reference's alternatives at all, which puts
//!   it below the lowest one listed) → **wrong output**: the verdict is
//!   `failed`, naming the position, both continuations and the margin.
//!
//! The new answer's own logprobs are not trusted for this: an engine that
//! computes wrong output computes wrong logprobs too. An answer that ends
//! where the reference goes on (or goes on where it ended) differs at that
//! position with no margin to read: wrong output, said so.

use serde::{Deserialize, Serialize};

/// How close (in nats) the reference's two top tokens must be for a
/// different first token to be noise. Greedy decoding of the same weights
/// flips only where the top two logits are within float error of each
/// other (fp16/bf16 logits carry ~3 decimal digits: 1e-3 relative on logits
/// of magnitude ~10 is ~0.01 nats); 0.1 leaves a margin over that while a
/// clearly preferred token (wrong weights, corrupted KV) is off by whole nats.
pub const NEAR_TIE_NATS: f64 = 0.1;

/// One alternative the engine listed for a position (`top_logprobs`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alternative {
    pub token: String,
    pub logprob: f64,
}

/// One token of a greedy answer: the chosen token, its logprob and the
/// engine's alternatives (the chosen one among them as engines list it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnswerToken {
    pub token: String,
    pub logprob: f64,
    #[serde(default)]
    pub top: Vec<Alternative>,
}

/// A greedy answer: its tokens in order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GreedyAnswer {
    pub tokens: Vec<AnswerToken>,
}

impl GreedyAnswer {
    /// The answer's text from token `from` on, at most `max_chars`
    /// characters (an ellipsis when cut).
    pub fn text_from(&self, from: usize, max_chars: usize) -> String {
        let all: String = self.tokens.iter().skip(from).map(|t| t.token.as_str()).collect();
        if all.chars().count() <= max_chars {
            return all;
        }
        let mut cut: String = all.chars().take(max_chars).collect();
        cut.push('…');
        cut
    }
}

/// What a reference answer belongs to: the same prompt answered greedily by
/// the same weights, engine and config gives the same tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputIdentity {
    pub model: String,
    /// The pair's config fingerprint (argv, environment, engine version as
    /// the agents report it): a change of any of these is a new identity.
    pub fingerprint: String,
}

/// A recorded reference answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reference {
    pub identity: OutputIdentity,
    pub answer: GreedyAnswer,
    /// The operation that recorded it.
    pub operation_id: String,
    /// Recorded on the operator's word (`verify NAME --record-reference`),
    /// not by a first healthy verification.
    #[serde(default)]
    pub pinned: bool,
}

/// What comparing a greedy answer with its reference found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum OutputCheck {
    /// Token for token the reference.
    Same { tokens: usize, reference_operation: String },
    /// The first differing token was a near-tie in the reference: noise.
    NearTie {
        position: usize,
        reference_token: String,
        token: String,
        /// The reference's logprob of its token minus its logprob of the
        /// new one (nats).
        margin: f64,
        reference_operation: String,
    },
    /// Wrong output: the reference's token was clearly preferred.
    Diverged {
        position: usize,
        /// The continuations from the first differing token (redacted as
        /// any output is before it leaves the orchestrator).
        reference: String,
        answer: String,
        /// `Some(m)`: the reference preferred its token by `m` nats;
        /// `at_least` when the new token was not among its alternatives
        /// (then `m` is to the lowest one listed). `None`: one answer ended
        /// where the other went on.
        margin: Option<f64>,
        #[serde(default)]
        at_least: bool,
        reference_operation: String,
    },
    /// No reference for this identity yet: this answer becomes the
    /// reference if the operation concludes healthy.
    NoReference { tokens: usize },
    /// The greedy request itself failed (an error at the client layer).
    Unanswered { error: String },
    /// The engine or router returned no logprobs: the tokens can be
    /// compared, but not whether a difference is noise (an engine without
    /// logprobs cannot be judged on its output: said so, not failed).
    NoLogprobs,
}

impl OutputCheck {
    /// Whether this finding makes the pair's verdict `failed`.
    pub fn is_wrong_output(&self) -> bool {
        matches!(self, OutputCheck::Diverged { .. } | OutputCheck::Unanswered { .. })
    }

    /// The report's line for it.
    pub fn line(&self) -> String {
        match self {
            OutputCheck::Same {
                tokens,
                reference_operation,
            } => format!(
                "output: the greedy answer matches the reference token for token ({tokens} tokens; recorded by operation {reference_operation})"
            ),
            OutputCheck::NearTie {
                position,
                reference_token,
                token,
                margin,
                reference_operation,
            } => format!(
                "output: the greedy answer first differs at token {position} ({token:?} where the reference has {reference_token:?}), a near-tie in the reference ({margin:.3} nats apart, under {NEAR_TIE_NATS}): numerical noise, allowed (reference of operation {reference_operation})"
            ),
            OutputCheck::Diverged {
                position,
                reference,
                answer,
                margin,
                at_least,
                reference_operation,
            } => {
                let why = match (margin, at_least) {
                    (Some(m), false) => format!("the reference preferred its token by {m:.2} nats"),
                    (Some(m), true) => format!(
                        "the new token was not among the reference's alternatives: preferred by at least {m:.2} nats"
                    ),
                    (None, _) => "one answer ended where the other went on".to_string(),
                };
                format!(
                    "WRONG OUTPUT: the greedy answer differs from the reference (operation {reference_operation}) at token {position}, where {why}: the reference goes on {reference:?}, this pair answered {answer:?} — fast and HTTP 200, but not what these weights compute"
                )
            }
            OutputCheck::NoReference { tokens } => format!(
                "output: no reference answer for this model and config yet: this greedy answer ({tokens} tokens) is kept as the reference when the pair is healthy"
            ),
            OutputCheck::Unanswered { error } => {
                format!("output: the greedy reference request through the pair failed: {error}")
            }
            OutputCheck::NoLogprobs => "output: the answer carried no logprobs (an engine or router that does not return them): its tokens are not judged".to_string(),
        }
    }
}

/// What an operation's report keeps of its output check: the finding and
/// the reference it was held to — or, for a healthy operation that found
/// none, the one it recorded (the next operation's reference).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GoldenRecord {
    /// What the answer belongs to (a reference is held to its own).
    pub identity: OutputIdentity,
    pub check: OutputCheck,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<Reference>,
    /// The answer this operation got (for a reference recorded from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<GreedyAnswer>,
}

/// Characters of each continuation a finding quotes.
pub const QUOTED_CHARS: usize = 80;

/// Compares `answer` with `reference` (the module doc's rule).
pub fn compare(reference: &Reference, answer: &GreedyAnswer) -> OutputCheck {
    let reference_operation = reference.operation_id.clone();
    let want = &reference.answer.tokens;
    let got = &answer.tokens;
    let Some(position) =
        (0..want.len().max(got.len())).find(|&i| want.get(i).map(|t| &t.token) != got.get(i).map(|t| &t.token))
    else {
        return OutputCheck::Same {
            tokens: got.len(),
            reference_operation,
        };
    };
    let quote = |a: &GreedyAnswer| a.text_from(position, QUOTED_CHARS);
    let diverged = |margin: Option<f64>, at_least: bool| OutputCheck::Diverged {
        position,
        reference: quote(&reference.answer),
        answer: quote(answer),
        margin,
        at_least,
        reference_operation: reference_operation.clone(),
    };
    let (Some(r), Some(n)) = (want.get(position), got.get(position)) else {
        return diverged(None, false);
    };
    match r.top.iter().find(|a| a.token == n.token) {
        Some(alt) => {
            let margin = r.logprob - alt.logprob;
            if margin.is_finite() && margin.abs() < NEAR_TIE_NATS {
                OutputCheck::NearTie {
                    position,
                    reference_token: r.token.clone(),
                    token: n.token.clone(),
                    margin,
                    reference_operation,
                }
            } else {
                diverged(margin.is_finite().then_some(margin), false)
            }
        }
        None => {
            let lowest = r
                .top
                .iter()
                .filter(|a| a.token != r.token)
                .map(|a| a.logprob)
                .filter(|l| l.is_finite())
                .fold(None, |m: Option<f64>, l| Some(m.map_or(l, |m| m.min(l))));
            diverged(lowest.map(|l| r.logprob - l).filter(|m| m.is_finite()), true)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(token: &str, logprob: f64, top: &[(&str, f64)]) -> AnswerToken {
        AnswerToken {
            token: token.into(),
            logprob,
            top: top
                .iter()
                .map(|(t, l)| Alternative {
                    token: (*t).into(),
                    logprob: *l,
                })
                .collect(),
        }
    }

    fn reference(tokens: Vec<AnswerToken>) -> Reference {
        Reference {
            identity: OutputIdentity {
                model: "tiny".into(),
                fingerprint: "f".into(),
            },
            answer: GreedyAnswer { tokens },
            operation_id: "ref-op".into(),
            pinned: false,
        }
    }

    fn answer(tokens: &[&str]) -> GreedyAnswer {
        GreedyAnswer {
            tokens: tokens.iter().map(|t| tok(t, -0.1, &[])).collect(),
        }
    }

    fn the_reference() -> Reference {
        reference(vec![
            tok("The", -0.01, &[("The", -0.01), ("A", -4.6)]),
            tok(" sky", -0.2, &[(" sky", -0.2), (" sea", -0.23)]),
            tok(" is", -0.05, &[(" is", -0.05), (" was", -3.0)]),
            tok(" blue", -0.3, &[(" blue", -0.3), (" grey", -2.3)]),
        ])
    }

    #[test]
    fn the_same_tokens_are_the_same_answer() {
        let check = compare(&the_reference(), &answer(&["The", " sky", " is", " blue"]));
        assert_eq!(
            check,
            OutputCheck::Same {
                tokens: 4,
                reference_operation: "ref-op".into()
            }
        );
        assert!(!check.is_wrong_output());
    }

    /// Noise: the first differing token was within 0.03 nats of the
    /// reference's in the reference's own distribution; what follows it
    /// differs too and is not judged.
    #[test]
    fn a_first_difference_at_a_near_tie_is_noise_and_allowed() {
        let check = compare(&the_reference(), &answer(&["The", " sea", " was", " calm"]));
        let OutputCheck::NearTie {
            position,
            margin,
            ref token,
            ..
        } = check
        else {
            panic!("{check:?}")
        };
        assert_eq!((position, token.as_str()), (1, " sea"));
        assert!((margin - 0.03).abs() < 1e-9, "{margin}");
        assert!(!check.is_wrong_output());
        assert!(check.line().contains("numerical noise, allowed"), "{}", check.line());
    }

    /// Wrong output: the reference preferred " is" over " was" by 2.95
    /// nats; the finding names the position, both continuations and the
    /// margin.
    #[test]
    fn a_clearly_preferred_reference_token_is_wrong_output() {
        let check = compare(&the_reference(), &answer(&["The", " sky", " was", " green"]));
        assert_eq!(
            check,
            OutputCheck::Diverged {
                position: 2,
                reference: " is blue".into(),
                answer: " was green".into(),
                margin: Some(2.95),
                at_least: false,
                reference_operation: "ref-op".into(),
            }
        );
        assert!(check.is_wrong_output());
        let line = check.line();
        assert!(
            line.starts_with("WRONG OUTPUT") && line.contains("token 2") && line.contains("2.95 nats"),
            "{line}"
        );
    }

    /// A token the reference did not even list is below its lowest
    /// alternative: wrong, with the margin as a lower bound.
    #[test]
    fn a_token_the_reference_never_listed_is_wrong_with_a_lower_bound() {
        let check = compare(&the_reference(), &answer(&["Zebra", " sky"]));
        let OutputCheck::Diverged {
            position,
            margin,
            at_least,
            ..
        } = check
        else {
            panic!("{check:?}")
        };
        assert_eq!(position, 0);
        assert!(at_least);
        assert!((margin.unwrap() - 4.59).abs() < 1e-9);
    }

    /// An answer cut short (or longer than the reference) differs where one
    /// ended: no margin to read, wrong output.
    #[test]
    fn an_answer_that_ends_where_the_reference_goes_on_is_wrong() {
        for got in [&["The", " sky"][..], &["The", " sky", " is", " blue", "."]] {
            let check = compare(&the_reference(), &answer(got));
            let OutputCheck::Diverged { position, margin, .. } = &check else {
                panic!("{check:?}")
            };
            assert_eq!((*position, *margin), (got.len().min(4), None));
            assert!(check.line().contains("one answer ended where the other went on"));
        }
    }

    /// A NaN or infinite logprob (vLLM may send -inf, or -9999.0 for a
    /// token it masked) never makes a near-tie.
    #[test]
    fn non_finite_logprobs_are_never_a_near_tie() {
        let r = reference(vec![tok("a", f64::NEG_INFINITY, &[("b", f64::NEG_INFINITY)])]);
        let check = compare(&r, &answer(&["b"]));
        assert!(check.is_wrong_output(), "{check:?}");
        let r = reference(vec![tok("a", f64::NAN, &[("b", -0.1)])]);
        assert!(compare(&r, &answer(&["b"])).is_wrong_output());
    }

    #[test]
    fn continuations_are_quoted_bounded() {
        let long: Vec<AnswerToken> = (0..200).map(|i| tok(&format!(" w{i}"), -0.1, &[])).collect();
        let text = GreedyAnswer { tokens: long }.text_from(1, QUOTED_CHARS);
        assert_eq!(text.chars().count(), QUOTED_CHARS + 1);
        assert!(text.ends_with('…'));
    }
}
