//! The gate sees output changes (issue 34, item 4): the greedy answer after
//! the change held to the one before it.
//!
//! A knob meant to change speed can change what the model computes — a
//! quantisation, a kernel, another checkpoint named by a flag — and a
//! benchmark of latencies never sees it. Every co-restart and verification
//! already sends one greedy request (temperature 0, logprobs) and keeps its
//! answer (`OperationReport.golden`); the gate compares the answer of the
//! verification before the change (its baseline) with the answer of the
//! co-restart onto the change, by the judge's rule
//! ([`crate::judge::golden::compare`], the baseline's answer as the
//! reference): the same tokens, or a first difference at a near-tie of the
//! baseline's own distribution, is the same output; a token the baseline
//! clearly did not prefer is an output change. Pure: the machine decides
//! with it.

use serde::{Deserialize, Serialize};

use crate::judge::golden::{GoldenRecord, GreedyAnswer, OutputCheck, Reference, compare};

/// A child operation's greedy answer as the gate holds it: the operation
/// and what its report kept of its output check (none: the child checked
/// no output).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildGolden {
    pub operation_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub golden: Option<GoldenRecord>,
}

/// The greedy answer after the change against the one before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum OutputComparison {
    /// Both answers were there: `check` is the answer after the change
    /// judged with the answer before it as the reference (`Same`,
    /// `NearTie` or `Diverged`).
    Compared {
        /// The child whose answer is the reference (the verification
        /// before the change).
        before_operation: String,
        /// The child that answered with the change (its co-restart).
        after_operation: String,
        check: OutputCheck,
        /// Changed, and `[pair.gate] allow_output_change = true` let the
        /// gate go on to judge the change on its performance.
        #[serde(default)]
        allowed: bool,
    },
    /// An answer was missing (an engine or router without logprobs, a
    /// child that checked no output, no verification before the change):
    /// not compared, `why`; the gate goes on as it would without.
    NotCompared { why: String },
}

impl OutputComparison {
    /// The answer after the change differs beyond a near-tie.
    pub fn changed(&self) -> bool {
        matches!(
            self,
            OutputComparison::Compared {
                check: OutputCheck::Diverged { .. },
                ..
            }
        )
    }

    /// Changed and not allowed: the gate rolls the change back for it.
    pub fn rejects(&self) -> bool {
        self.changed() && !matches!(self, OutputComparison::Compared { allowed: true, .. })
    }

    /// The evidence line of the judge's finding (`OutputCheck::line`), if
    /// the answers were compared.
    pub fn evidence(&self) -> Option<String> {
        match self {
            OutputComparison::Compared { check, .. } => Some(check.line()),
            OutputComparison::NotCompared { .. } => None,
        }
    }

    /// The report's line for it.
    pub fn line(&self) -> String {
        match self {
            OutputComparison::Compared {
                before_operation,
                after_operation,
                check,
                allowed,
            } => {
                let what = format!(
                    "the greedy answer with the change (operation {after_operation}) against the one before it (operation {before_operation})"
                );
                if !self.changed() {
                    format!("output unchanged by the change: {what}: {}", check.line())
                } else if *allowed {
                    format!(
                        "output changed, allowed (allow_output_change = true): {what}: {}",
                        check.line()
                    )
                } else {
                    format!("OUTPUT CHANGED: {what}: {}", check.line())
                }
            }
            OutputComparison::NotCompared { why } => {
                format!("output not compared with the answer before the change: {why}")
            }
        }
    }
}

/// Why a child has no answer to compare, as a person reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NoAnswer(String);

/// The greedy answer `child` kept, or why there is none to compare
/// (`what`: the child, as a person reads it).
fn answer_of<'a>(what: &str, child: &'a ChildGolden) -> Result<(&'a GoldenRecord, &'a GreedyAnswer), NoAnswer> {
    let id = &child.operation_id;
    let Some(golden) = &child.golden else {
        return Err(NoAnswer(format!(
            "{what} (operation {id}) checked no output (no path to send the greedy request on)"
        )));
    };
    match &golden.answer {
        Some(answer) => Ok((golden, answer)),
        None => Err(NoAnswer(format!(
            "{what} (operation {id}) kept no greedy answer — {}",
            golden.check.line()
        ))),
    }
}

/// Compares the answer of the child `after` the change with the one of the
/// child `before` it (none: no verification ran before the change); a
/// difference beyond a near-tie is `allowed` where the pair's gate allows
/// output changes.
pub fn compare_children(before: Option<&ChildGolden>, after: &ChildGolden, allow: bool) -> OutputComparison {
    let Some(before) = before else {
        return OutputComparison::NotCompared {
            why: "no verification ran before the change ([pair.gate] verify = false), so there is no answer to hold the one after it to".into(),
        };
    };
    let pair = answer_of("the verification before the change", before)
        .and_then(|b| answer_of("the co-restart onto the change", after).map(|a| (b, a)));
    let ((before_golden, before_answer), (_, after_answer)) = match pair {
        Ok(p) => p,
        Err(NoAnswer(why)) => return OutputComparison::NotCompared { why },
    };
    let reference = Reference {
        identity: before_golden.identity.clone(),
        answer: before_answer.clone(),
        operation_id: before.operation_id.clone(),
        pinned: false,
    };
    let check = compare(&reference, after_answer);
    let allowed = allow && matches!(check, OutputCheck::Diverged { .. });
    OutputComparison::Compared {
        before_operation: before.operation_id.clone(),
        after_operation: after.operation_id.clone(),
        check,
        allowed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::golden::{Alternative, AnswerToken, OutputIdentity};

    /// Each token preferred by 3 nats over the next word.
    fn answer(words: &[&str]) -> GreedyAnswer {
        GreedyAnswer {
            tokens: words
                .iter()
                .enumerate()
                .map(|(i, w)| AnswerToken {
                    token: (*w).into(),
                    logprob: -0.05,
                    top: vec![
                        Alternative {
                            token: (*w).into(),
                            logprob: -0.05,
                        },
                        Alternative {
                            token: words[(i + 1) % words.len()].into(),
                            logprob: if i == 1 { -0.07 } else { -3.05 },
                        },
                    ],
                })
                .collect(),
        }
    }

    fn child(id: &str, fingerprint: &str, check: OutputCheck, answer: Option<GreedyAnswer>) -> ChildGolden {
        ChildGolden {
            operation_id: id.into(),
            golden: Some(GoldenRecord {
                identity: OutputIdentity {
                    model: "tiny".into(),
                    fingerprint: fingerprint.into(),
                },
                check,
                reference: None,
                answer,
            }),
        }
    }

    fn before() -> ChildGolden {
        let a = answer(&[" the", " sky", " is", " blue"]);
        child("verify-op", "f0", OutputCheck::NoReference { tokens: 4 }, Some(a))
    }

    fn after(words: &[&str]) -> ChildGolden {
        child(
            "restart-op",
            "f1",
            OutputCheck::NoReference { tokens: words.len() },
            Some(answer(words)),
        )
    }

    #[test]
    fn the_same_answer_is_no_change() {
        let c = compare_children(Some(&before()), &after(&[" the", " sky", " is", " blue"]), false);
        let OutputComparison::Compared {
            check: OutputCheck::Same {
                tokens: 4,
                ref reference_operation,
            },
            ..
        } = c
        else {
            panic!("{c:?}")
        };
        assert_eq!(reference_operation, "verify-op", "the baseline child is the reference");
        assert!(!c.changed() && !c.rejects());
        assert!(c.line().starts_with("output unchanged by the change"), "{}", c.line());
    }

    /// Position 1 is a near-tie in the baseline (" is" 0.02 nats below " sky").
    #[test]
    fn a_near_tie_is_no_change() {
        let c = compare_children(Some(&before()), &after(&[" the", " is", " it"]), false);
        assert!(
            matches!(
                c,
                OutputComparison::Compared {
                    check: OutputCheck::NearTie { position: 1, .. },
                    ..
                }
            ),
            "{c:?}"
        );
        assert!(!c.changed() && !c.rejects());
    }

    #[test]
    fn a_clearly_other_answer_is_a_change_rejected_unless_allowed() {
        let other = after(&[" a", " sea", " so", " calm"]);
        let c = compare_children(Some(&before()), &other, false);
        assert!(c.changed() && c.rejects(), "{c:?}");
        let line = c.line();
        assert!(line.starts_with("OUTPUT CHANGED: the greedy answer with the change (operation restart-op) against the one before it (operation verify-op): WRONG OUTPUT"), "{line}");
        assert!(line.contains("at token 0"), "{line}");
        assert_eq!(c.evidence().as_deref(), Some(&line["OUTPUT CHANGED: the greedy answer with the change (operation restart-op) against the one before it (operation verify-op): ".len()..]));
        let allowed = compare_children(Some(&before()), &other, true);
        assert!(allowed.changed() && !allowed.rejects());
        assert!(
            allowed
                .line()
                .starts_with("output changed, allowed (allow_output_change = true)")
        );
        // Allowed means nothing where nothing changed.
        let same = compare_children(Some(&before()), &after(&[" the", " sky", " is", " blue"]), true);
        assert!(matches!(same, OutputComparison::Compared { allowed: false, .. }));
    }

    /// No answer on either side: not compared, saying which and why.
    #[test]
    fn a_missing_answer_is_not_compared_and_said() {
        let same = after(&[" the"]);
        let c = compare_children(None, &same, false);
        assert!(matches!(&c, OutputComparison::NotCompared { why } if why.contains("verify = false")));
        let no_logprobs = child("verify-op", "f0", OutputCheck::NoLogprobs, None);
        let c = compare_children(Some(&no_logprobs), &same, false);
        let OutputComparison::NotCompared { why } = &c else {
            panic!("{c:?}")
        };
        assert!(
            why.starts_with("the verification before the change (operation verify-op) kept no greedy answer")
                && why.contains("no logprobs"),
            "{why}"
        );
        assert!(!c.changed() && !c.rejects() && c.evidence().is_none());
        let unchecked = ChildGolden {
            operation_id: "restart-op".into(),
            golden: None,
        };
        let c = compare_children(Some(&before()), &unchecked, false);
        assert!(
            c.line()
                .contains("the co-restart onto the change (operation restart-op) checked no output"),
            "{}",
            c.line()
        );
    }
}
