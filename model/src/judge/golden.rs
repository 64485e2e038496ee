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
//!   the reference's `top_logprobs` (or is not listed where every listed
//!   alternative was that close: a flat top cannot be told from noise) →
//!   numerical noise (batching, kernels,
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
    /// The greedy request got no answer (issue 47): through the router it
    /// waits while the pair's engines progress, up to a long generation's
    /// timeout, and ends when they are proven stuck; along a KV path, at
    /// its deadline (its tokens × the pair's TPOT budget plus the
    /// first-token budget). A timeout, judged by the timeout rules, never
    /// wrong output.
    TimedOut {
        after_ms: u64,
        /// Why it ended: the engines' stall proof ("no engine of the pair
        /// progressed for …"), or empty when its wait ran out.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        why: String,
    },
    /// The engine or router returned no logprobs: the tokens can be
    /// compared, but not whether a difference is noise (an engine without
    /// logprobs cannot be judged on its output: said so, not failed).
    NoLogprobs,
    /// The operator pins this answer as the pair's reference (`verify NAME
    /// --record-reference`): it is held to nothing (never wrong output);
    /// `replaced` is what the reference it replaces found of it (none: there
    /// was no reference of this identity). Recorded only if the operation
    /// is otherwise healthy.
    Pinned {
        tokens: usize,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replaced: Option<Box<OutputCheck>>,
    },
}

impl OutputCheck {
    /// Whether this finding makes the pair's verdict `failed`.
    pub fn is_wrong_output(&self) -> bool {
        matches!(self, OutputCheck::Diverged { .. } | OutputCheck::Unanswered { .. })
    }

    /// Whether the request timed out (issue 47): judged by the timeout
    /// rules (a stall after answering: `wedged`), never wrong output.
    pub fn timed_out(&self) -> bool {
        matches!(self, OutputCheck::TimedOut { .. })
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
            OutputCheck::TimedOut { after_ms, why } => format!(
                "output: the greedy reference request got no answer in {:.1} s ({}): a timeout — a stall, judged as a probe's timeout, not wrong output",
                *after_ms as f64 / 1000.0,
                if why.is_empty() { "its wait ran out" } else { why.as_str() }
            ),
            OutputCheck::NoLogprobs => "output: the answer carried no logprobs (an engine or router that does not return them): its tokens are not judged".to_string(),
            OutputCheck::Pinned { tokens, replaced } => {
                let against = match replaced.as_deref() {
                    None => "there was no reference for this model and config before it".to_string(),
                    Some(OutputCheck::Same {
                        reference_operation, ..
                    }) => format!(
                        "the reference it replaces (operation {reference_operation}) has the same tokens"
                    ),
                    Some(OutputCheck::NearTie {
                        position,
                        reference_operation,
                        ..
                    }) => format!(
                        "it differs from the reference it replaces (operation {reference_operation}) at token {position}, a near-tie only"
                    ),
                    Some(OutputCheck::Diverged {
                        position,
                        reference,
                        answer,
                        margin,
                        at_least,
                        reference_operation,
                    }) => format!(
                        "it differs from the reference it replaces (operation {reference_operation}) at token {position}, where {}: the old reference goes on {reference:?}, this answer {answer:?}",
                        margin_words(*margin, *at_least)
                    ),
                    Some(other) => other.line(),
                };
                format!(
                    "output: held to no reference: the operator pins this greedy answer ({tokens} tokens) as the pair's reference (--record-reference); {against}"
                )
            }
        }
    }
}

/// Why a first differing token is wrong output, in words.
fn margin_words(margin: Option<f64>, at_least: bool) -> String {
    match (margin, at_least) {
        (Some(m), false) => format!("the reference preferred its token by {m:.2} nats"),
        (Some(m), true) => {
            format!("the new token was not among the reference's alternatives: preferred by at least {m:.2} nats")
        }
        (None, _) => "one answer ended where the other went on".to_string(),
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

impl GoldenRecord {
    /// The line `pdwarden history` shows for an operation (`operation_id`)
    /// that recorded its greedy answer as the reference, or pinned it on
    /// the operator's word; `None` for one that recorded nothing.
    pub fn recorded_line(&self, operation_id: &str) -> Option<String> {
        let r = self.reference.as_ref().filter(|r| r.operation_id == operation_id)?;
        let what = format!(
            "{} tokens, model {}, config {}",
            r.answer.tokens.len(),
            r.identity.model,
            if r.identity.fingerprint.is_empty() {
                "(no fingerprint)"
            } else {
                r.identity.fingerprint.as_str()
            }
        );
        Some(if r.pinned {
            let replaced = match &self.check {
                OutputCheck::Pinned {
                    replaced: Some(old), ..
                } => match old.as_ref() {
                    OutputCheck::Same {
                        reference_operation, ..
                    }
                    | OutputCheck::NearTie {
                        reference_operation, ..
                    }
                    | OutputCheck::Diverged {
                        reference_operation, ..
                    } => format!(", replacing operation {reference_operation}'s"),
                    _ => String::new(),
                },
                _ => String::new(),
            };
            format!("reference pinned by the operator (--record-reference): its greedy answer ({what}){replaced}")
        } else {
            format!("reference recorded: its greedy answer ({what}), the first healthy one of this model and config")
        })
    }
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
            let bound = lowest.map(|l| r.logprob - l).filter(|m| m.is_finite());
            match bound {
                // Every listed alternative within a near-tie: the unlisted
                // token may be one too — it cannot be told from noise.
                Some(m) if m.abs() < NEAR_TIE_NATS => OutputCheck::NearTie {
                    position,
                    reference_token: r.token.clone(),
                    token: n.token.clone(),
                    margin: m,
                    reference_operation,
                },
                _ => diverged(bound, true),
            }
        }
    }
}

/// One prefill → decode path of an xPyD pair and the greedy answer sent
/// straight along it (issue 34, "every P→D path agrees"). `Err`: the
/// finding for a path that gave no answer to compare — its request failed
/// (`Unanswered`) or came without logprobs (`NoLogprobs`).
#[derive(Debug, Clone, PartialEq)]
pub struct PathAnswer {
    pub prefill: String,
    pub decode: String,
    pub answer: Result<GreedyAnswer, OutputCheck>,
}

/// What a path's answer was held to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "to", rename_all = "snake_case")]
pub enum HeldTo {
    /// The pair's reference (its operation is in the check).
    Reference,
    /// The answer the operator pins as the reference (`--record-reference`).
    Pinned,
    /// No reference yet: the answer a majority of the paths gave (these).
    Majority { paths: Vec<String> },
    /// No reference and no answer a majority of the paths gave: the answer
    /// of this other path, one it disagrees with.
    Path { path: String },
    /// Nothing: the path gave no answer to compare.
    Nothing,
}

/// One path's finding: its answer against what it was held to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathCheck {
    pub prefill: String,
    pub decode: String,
    pub held_to: HeldTo,
    pub check: OutputCheck,
}

/// A path as the findings name it.
pub fn path_name(prefill: &str, decode: &str) -> String {
    format!("{prefill} → {decode}")
}

impl PathCheck {
    pub fn name(&self) -> String {
        path_name(&self.prefill, &self.decode)
    }

    /// Wrong output along this path (or its request failed): the pair's
    /// verdict is `failed`.
    pub fn is_wrong_output(&self) -> bool {
        self.check.is_wrong_output()
    }

    /// What it was held to, in words.
    fn held(&self) -> String {
        match (&self.held_to, &self.check) {
            (
                HeldTo::Reference,
                OutputCheck::Same {
                    reference_operation, ..
                }
                | OutputCheck::NearTie {
                    reference_operation, ..
                }
                | OutputCheck::Diverged {
                    reference_operation, ..
                },
            ) => format!("the reference (operation {reference_operation})"),
            (HeldTo::Reference, _) => "the reference".into(),
            (HeldTo::Pinned, _) => "the answer pinned as the reference".into(),
            (HeldTo::Majority { paths }, _) => {
                format!("the answer most paths gave ({})", paths.join(", "))
            }
            (HeldTo::Path { path }, _) => {
                format!("{path}'s answer (no answer had a majority of the paths)")
            }
            (HeldTo::Nothing, _) => "nothing".into(),
        }
    }

    /// The report's line for it.
    pub fn line(&self) -> String {
        let name = self.name();
        let held = self.held();
        match &self.check {
            OutputCheck::Same { tokens, .. } => {
                format!("output: {name} answered the same {tokens} tokens as {held}")
            }
            OutputCheck::NearTie {
                position,
                reference_token,
                token,
                margin,
                ..
            } => format!(
                "output: {name} first differs from {held} at token {position} ({token:?} where it has {reference_token:?}), a near-tie ({margin:.3} nats apart, under {NEAR_TIE_NATS}): numerical noise, allowed"
            ),
            OutputCheck::Diverged {
                position,
                reference,
                answer,
                margin,
                at_least,
                ..
            } => format!(
                "WRONG OUTPUT: {name} answered {answer:?} from token {position}, where {held} goes on {reference:?} ({}) — the greedy request sent straight along this path, HTTP 200 and wrong",
                margin_words(*margin, *at_least)
            ),
            OutputCheck::Unanswered { error } => {
                format!("output: the greedy request sent straight along {name} failed: {error}")
            }
            OutputCheck::TimedOut { after_ms, why } => format!(
                "output: the greedy request sent straight along {name} got no answer in {:.1} s ({}): a timeout — a stall, not wrong output",
                *after_ms as f64 / 1000.0,
                if why.is_empty() {
                    "its wait ran out"
                } else {
                    why.as_str()
                }
            ),
            OutputCheck::NoLogprobs => {
                format!("output: {name} answered without logprobs: its tokens are not judged")
            }
            other => format!("output: {name}: {}", other.line()),
        }
    }
}

/// Whether a finding says two answers agree (the same tokens, or a first
/// difference at a near-tie).
fn agrees(check: &OutputCheck) -> bool {
    matches!(check, OutputCheck::Same { .. } | OutputCheck::NearTie { .. })
}

/// Holds every path's answer to `reference` (`pinned`: the answer the
/// operator pins) or, with none, to the answers of the other paths: the
/// answer a strict majority of the paths agree with (the same tokens, or a
/// near-tie in its distribution) is the reference; with no majority, each
/// path that disagrees with another is held to that other's answer, so
/// every disagreeing path is named. A path with no answer keeps its
/// finding (`HeldTo::Nothing`). In the order given. Pure.
pub fn compare_paths(reference: Option<(&Reference, bool)>, answers: &[PathAnswer]) -> Vec<PathCheck> {
    let name = |a: &PathAnswer| path_name(&a.prefill, &a.decode);
    let finding = |a: &PathAnswer, held_to: HeldTo, check: OutputCheck| PathCheck {
        prefill: a.prefill.clone(),
        decode: a.decode.clone(),
        held_to,
        check,
    };
    let answered: Vec<(&PathAnswer, &GreedyAnswer)> = answers
        .iter()
        .filter_map(|a| a.answer.as_ref().ok().map(|g| (a, g)))
        .collect();
    // A path's answer as the reference of the others.
    let identity = reference.map_or_else(
        || OutputIdentity {
            model: String::new(),
            fingerprint: String::new(),
        },
        |(r, _)| r.identity.clone(),
    );
    let as_reference = |a: &PathAnswer, g: &GreedyAnswer| Reference {
        identity: identity.clone(),
        answer: g.clone(),
        operation_id: name(a),
        pinned: false,
    };
    let held: Vec<(HeldTo, OutputCheck)> = match reference {
        Some((r, pinned)) => {
            let to = if pinned { HeldTo::Pinned } else { HeldTo::Reference };
            answered.iter().map(|(_, g)| (to.clone(), compare(r, g))).collect()
        }
        None => {
            let references: Vec<Reference> = answered.iter().map(|(a, g)| as_reference(a, g)).collect();
            // For each answer, the paths that agree with it (itself too).
            let agreeing: Vec<Vec<usize>> = references
                .iter()
                .map(|r| {
                    (0..answered.len())
                        .filter(|&j| agrees(&compare(r, answered[j].1)))
                        .collect()
                })
                .collect();
            let best = (0..answered.len()).fold(None, |best: Option<usize>, i| match best {
                Some(b) if agreeing[b].len() >= agreeing[i].len() => Some(b),
                _ => Some(i),
            });
            match best.filter(|&b| agreeing[b].len() * 2 > answered.len()) {
                Some(b) => {
                    let paths: Vec<String> = agreeing[b].iter().map(|&j| name(answered[j].0)).collect();
                    answered
                        .iter()
                        .map(|(_, g)| (HeldTo::Majority { paths: paths.clone() }, compare(&references[b], g)))
                        .collect()
                }
                None => (0..answered.len())
                    .map(|j| {
                        let g = answered[j].1;
                        let others = (0..answered.len()).filter(|&k| k != j);
                        let k = others
                            .clone()
                            .find(|&k| !agrees(&compare(&references[k], g)))
                            .or_else(|| others.clone().next())
                            .unwrap_or(j);
                        (
                            HeldTo::Path {
                                path: name(answered[k].0),
                            },
                            compare(&references[k], g),
                        )
                    })
                    .collect(),
            }
        }
    };
    let mut held = held.into_iter();
    answers
        .iter()
        .map(|a| match &a.answer {
            Ok(_) => {
                let (to, check) = held.next().expect("one finding per answer");
                finding(a, to, check)
            }
            Err(check) => finding(a, HeldTo::Nothing, check.clone()),
        })
        .collect()
}

/// The report's lines for the paths' findings: `wrong` (each path with
/// wrong output or a failed request, then each engine on whose every path
/// the output was wrong while another engine of its side answered right:
/// the suspect) and `fine` (one summary of the paths that agree, the
/// near-ties and the paths not judged). Pure.
pub fn path_lines(paths: &[PathCheck]) -> (Vec<String>, Vec<String>) {
    let mut wrong: Vec<String> = paths
        .iter()
        .filter(|p| p.is_wrong_output())
        .map(PathCheck::line)
        .collect();
    let diverged = |p: &PathCheck| matches!(p.check, OutputCheck::Diverged { .. });
    let right = |p: &PathCheck| agrees(&p.check);
    for (side, engine) in [("prefill", true), ("decode", false)] {
        let of = |p: &PathCheck| if engine { p.prefill.clone() } else { p.decode.clone() };
        let mut engines: Vec<String> = paths.iter().map(of).collect();
        engines.sort();
        engines.dedup();
        for e in &engines {
            let its: Vec<&PathCheck> = paths.iter().filter(|p| of(p) == *e).collect();
            let others_right = paths.iter().any(|p| of(p) != *e && right(p));
            if its.iter().all(|p| diverged(p)) && others_right {
                let names: Vec<String> = its.iter().map(|p| p.name()).collect();
                let (into, what) = if engine {
                    ("from", "its weights, or the KV it computes")
                } else {
                    ("into", "its weights, or how it reads the transferred KV")
                };
                wrong.push(format!(
                    "WRONG OUTPUT on every path {into} {side} {e} ({}) while the other {side}s' paths answer right: {e} computes other tokens ({what})",
                    names.join(", ")
                ));
            }
        }
    }
    let mut fine = Vec::new();
    let agreeing: Vec<&PathCheck> = paths.iter().filter(|p| right(p)).collect();
    if let Some(first) = agreeing.first() {
        let all = agreeing.len() == paths.len();
        let held = match &first.held_to {
            HeldTo::Majority { paths: most } if most.len() == paths.len() => {
                "each other (no reference yet)".to_string()
            }
            _ => first.held(),
        };
        fine.push(if all {
            format!(
                "output: every prefill → decode path ({} paths, one greedy request sent straight along each) answered as {held}",
                paths.len()
            )
        } else {
            format!(
                "output: {} of the {} prefill → decode paths answered as {held}: {}",
                agreeing.len(),
                paths.len(),
                agreeing.iter().map(|p| p.name()).collect::<Vec<_>>().join(", ")
            )
        });
    }
    fine.extend(
        paths
            .iter()
            .filter(|p| matches!(p.check, OutputCheck::NearTie { .. } | OutputCheck::NoLogprobs))
            .map(PathCheck::line),
    );
    (wrong, fine)
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

    /// A token the reference did not list, where even its lowest listed
    /// alternative was within a near-tie: it cannot be told from noise
    /// (a flat distribution), so it is not called wrong.
    #[test]
    fn an_unlisted_token_below_a_flat_top_is_not_called_wrong() {
        let r = reference(vec![tok("a", -1.60, &[("a", -1.60), ("b", -1.62), ("c", -1.65)])]);
        let check = compare(&r, &answer(&["d"]));
        assert!(matches!(check, OutputCheck::NearTie { position: 0, .. }), "{check:?}");
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
    fn good() -> GreedyAnswer {
        the_reference().answer
    }

    fn along(prefill: &str, decode: &str, answer: Result<GreedyAnswer, OutputCheck>) -> PathAnswer {
        PathAnswer {
            prefill: prefill.into(),
            decode: decode.into(),
            answer,
        }
    }

    /// Every (prefill, decode) of `prefills` × `decodes`, the paths into
    /// `bad_decode` answering `bad`, the others `good()`.
    fn xpyd(prefills: usize, decodes: usize, bad_decode: Option<usize>, bad: &GreedyAnswer) -> Vec<PathAnswer> {
        let mut out = Vec::new();
        for p in 0..prefills {
            for d in 0..decodes {
                let answer = if Some(d) == bad_decode { bad.clone() } else { good() };
                out.push(along(&format!("prefill-{p}"), &format!("decode-{d}"), Ok(answer)));
            }
        }
        out
    }

    fn wrong_paths(checks: &[PathCheck]) -> Vec<String> {
        checks
            .iter()
            .filter(|c| c.is_wrong_output())
            .map(PathCheck::name)
            .collect()
    }

    /// Issue 34, item 3: every path of a 2P2D pair gives the reference's
    /// tokens (held to the reference), or each other's (none yet): one
    /// summary line, nothing wrong.
    #[test]
    fn every_path_that_agrees_is_one_summary_line() {
        let r = the_reference();
        for reference in [Some((&r, false)), None] {
            let checks = compare_paths(reference, &xpyd(2, 2, None, &good()));
            assert_eq!(checks.len(), 4);
            assert!(
                checks
                    .iter()
                    .all(|c| matches!(c.check, OutputCheck::Same { tokens: 4, .. })),
                "{checks:?}"
            );
            let (wrong, fine) = path_lines(&checks);
            assert!(wrong.is_empty(), "{wrong:?}");
            assert_eq!(fine.len(), 1, "{fine:?}");
            assert!(
                fine[0].starts_with("output: every prefill → decode path (4 paths"),
                "{fine:?}"
            );
            match reference {
                Some(_) => assert!(fine[0].ends_with("as the reference (operation ref-op)"), "{fine:?}"),
                None => assert!(fine[0].ends_with("as each other (no reference yet)"), "{fine:?}"),
            }
        }
    }

    /// One decode computes other tokens (its KV read wrong, its weights
    /// replaced): each of its paths is wrong output naming its engines,
    /// and the decode is named the suspect — held to the reference, or
    /// (none) to the answer the majority of the paths gave.
    #[test]
    fn one_bad_decode_shows_on_each_of_its_paths() {
        let bad = answer(&["The", " sky", " was", " green"]);
        let r = the_reference();
        let checks = compare_paths(Some((&r, false)), &xpyd(2, 2, Some(1), &bad));
        assert_eq!(wrong_paths(&checks), ["prefill-0 → decode-1", "prefill-1 → decode-1"]);
        let (wrong, _) = path_lines(&checks);
        assert!(
            wrong[0].starts_with("WRONG OUTPUT: prefill-0 → decode-1 answered \" was green\" from token 2, where the reference (operation ref-op) goes on \" is blue\" (the reference preferred its token by 2.95 nats)"),
            "{wrong:?}"
        );
        assert_eq!(wrong.len(), 3, "{wrong:?}");
        assert!(
            wrong[2].starts_with(
                "WRONG OUTPUT on every path into decode decode-1 (prefill-0 → decode-1, prefill-1 → decode-1)"
            ),
            "{wrong:?}"
        );
        // No reference: 2P3D, the four paths into decode-0 and decode-2
        // are the majority.
        let checks = compare_paths(None, &xpyd(2, 3, Some(1), &bad));
        assert_eq!(wrong_paths(&checks), ["prefill-0 → decode-1", "prefill-1 → decode-1"]);
        let HeldTo::Majority { paths } = &checks[1].held_to else {
            panic!("{checks:?}")
        };
        assert_eq!(paths.len(), 4, "{paths:?}");
        assert!(!paths.iter().any(|p| p.ends_with("decode-1")), "{paths:?}");
        let (wrong, fine) = path_lines(&checks);
        assert!(
            wrong[0].contains("where the answer most paths gave (prefill-0 → decode-0, "),
            "{wrong:?}"
        );
        assert!(wrong.last().unwrap().contains("into decode decode-1"), "{wrong:?}");
        assert!(
            fine[0].starts_with("output: 4 of the 6 prefill → decode paths answered as"),
            "{fine:?}"
        );
    }

    /// A path whose first difference is a near-tie in what it is held to
    /// is noise: allowed and said.
    #[test]
    fn a_near_tie_on_a_path_is_noise() {
        let noisy = answer(&["The", " sea", " was", " calm"]);
        let r = the_reference();
        for reference in [Some((&r, false)), None] {
            let checks = compare_paths(reference, &xpyd(2, 2, Some(0), &noisy));
            assert!(wrong_paths(&checks).is_empty(), "{checks:?}");
            assert!(
                matches!(checks[0].check, OutputCheck::NearTie { position: 1, .. }),
                "{checks:?}"
            );
            let (wrong, fine) = path_lines(&checks);
            assert!(wrong.is_empty());
            assert!(
                fine[0].starts_with("output: every prefill → decode path (4 paths"),
                "{fine:?}"
            );
            assert!(
                fine.iter()
                    .any(|l| l.starts_with("output: prefill-0 → decode-0 first differs")
                        && l.contains("numerical noise, allowed")),
                "{fine:?}"
            );
        }
    }

    /// No reference and no answer a majority gave (1P2D, the two paths
    /// disagree): which is right cannot be told, so both are named, each
    /// held to the other's answer; no engine is called the suspect.
    #[test]
    fn no_majority_names_every_disagreeing_path() {
        let bad = answer(&["The", " sky", " was", " green"]);
        let checks = compare_paths(None, &xpyd(1, 2, Some(1), &bad));
        assert_eq!(wrong_paths(&checks), ["prefill-0 → decode-0", "prefill-0 → decode-1"]);
        assert_eq!(
            checks[0].held_to,
            HeldTo::Path {
                path: "prefill-0 → decode-1".into()
            }
        );
        assert_eq!(
            checks[1].held_to,
            HeldTo::Path {
                path: "prefill-0 → decode-0".into()
            }
        );
        let (wrong, fine) = path_lines(&checks);
        assert_eq!(wrong.len(), 2, "{wrong:?}");
        assert!(
            wrong[1].contains("(no answer had a majority of the paths)"),
            "{wrong:?}"
        );
        assert!(fine.is_empty(), "{fine:?}");
    }

    /// A path whose request failed fails the pair (named); one without
    /// logprobs is said and not judged; the pinned answer is what the
    /// paths are held to when the operator pins one.
    #[test]
    fn a_failed_path_fails_and_one_without_logprobs_is_not_judged() {
        let r = the_reference();
        let mut answers = xpyd(1, 3, None, &good());
        answers[1].answer = Err(OutputCheck::Unanswered {
            error: "http 500: KV transfer failed".into(),
        });
        answers[2].answer = Err(OutputCheck::NoLogprobs);
        let checks = compare_paths(Some((&r, true)), &answers);
        assert_eq!(checks[0].held_to, HeldTo::Pinned);
        assert_eq!(checks[1].held_to, HeldTo::Nothing);
        assert_eq!(wrong_paths(&checks), ["prefill-0 → decode-1"]);
        let (wrong, fine) = path_lines(&checks);
        assert_eq!(
            wrong,
            [
                "output: the greedy request sent straight along prefill-0 → decode-1 failed: http 500: KV transfer failed"
            ]
        );
        assert!(
            fine[0].starts_with("output: 1 of the 3 prefill → decode paths answered as the answer pinned"),
            "{fine:?}"
        );
        assert!(
            fine[1].contains("prefill-0 → decode-2 answered without logprobs"),
            "{fine:?}"
        );
    }

    /// Task B's report lines: a pinned answer is never wrong output and
    /// says what it replaced; `history` names an operation that recorded
    /// or pinned the reference, and no other.
    #[test]
    fn a_pinned_answer_is_never_wrong_and_history_names_what_was_recorded() {
        let replaced = compare(&the_reference(), &answer(&["The", " sky", " was", " green"]));
        let pinned = OutputCheck::Pinned {
            tokens: 4,
            replaced: Some(Box::new(replaced)),
        };
        assert!(!pinned.is_wrong_output());
        let line = pinned.line();
        assert!(
            line.contains("pins this greedy answer (4 tokens)")
                && line.contains("differs from the reference it replaces (operation ref-op) at token 2"),
            "{line}"
        );
        let mut record = GoldenRecord {
            identity: the_reference().identity,
            check: pinned,
            reference: Some(Reference {
                operation_id: "op-2".into(),
                pinned: true,
                ..reference(answer(&["The", " sky", " was", " green"]).tokens)
            }),
            answer: None,
        };
        let line = record.recorded_line("op-2").unwrap();
        assert!(
            line.starts_with("reference pinned by the operator (--record-reference)"),
            "{line}"
        );
        assert!(line.ends_with("replacing operation ref-op's"), "{line}");
        assert_eq!(record.recorded_line("op-3"), None, "held to it, not recorded by it");
        record.reference.as_mut().unwrap().pinned = false;
        record.check = OutputCheck::NoReference { tokens: 4 };
        assert!(record.recorded_line("op-2").unwrap().starts_with("reference recorded:"));
    }
}
