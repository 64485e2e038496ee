//! What every pdwarden config shares, whoever loads it (the orchestrator's,
//! the agent's): one bound on durations and one way to say a TOML error;
//! and the bounds of a probe's answer on the wire (issue 34).
//!
//! A duration is a `u64` of milliseconds; `18446744073709551615` parses, and
//! the first deadline computed from it overflows (issue 16: a panic that left
//! its pair locked for ever). No pdwarden duration means anything beyond a
//! week, so every `_ms` field of a config, found by name in its serialised
//! form (a field added later is covered without a list to keep), is refused
//! above [`MAX_DURATION_MS`] with the field's path. Sums of a few bounded
//! durations then fit every clock and integer they are added to.
#![warn(clippy::all)]

/// The longest duration a config may give: one week.
pub const MAX_DURATION_MS: u64 = 7 * 24 * 3_600 * 1_000;

// Issue 34: the bounds of a greedy probe's answer (`ProbeResult.answer`).
// A `ProbeResult` travels up the agent's stream, where tonic refuses a
// message over its default 4 MiB decoding limit — and the refusal ends the
// stream, so an engine's answer must never make one. The answer is at most
// `max_tokens` entries (a probe's is at most 4 096) of at most 1 +
// `MAX_TOKEN_ALTERNATIVES` tokens of `MAX_ANSWER_TOKEN_BYTES` each: up to
// ~6.7 MB were it not also cut at `MAX_ANSWER_ENCODED_BYTES`. A real
// answer's tokens are a few bytes each (4 096 of 5 bytes, with two
// alternatives each, encode to ~220 KiB), so only a broken engine reaches
// the cut.

/// The longest token (or alternative) an answer keeps, in bytes; a longer
/// one is cut on a char boundary.
pub const MAX_ANSWER_TOKEN_BYTES: usize = 256;
/// The most alternatives (`top_logprobs`) kept per answer token.
pub const MAX_TOKEN_ALTERNATIVES: usize = 5;
/// The most an answer takes encoded (its `AnswerToken`s together); the
/// first token that would go past it ends the answer, so an answer can be
/// shorter than its `tokens`.
pub const MAX_ANSWER_ENCODED_BYTES: usize = 1 << 20;

/// The bytes `token` adds to a `ProbeResult` as one entry of its `answer`
/// (key, length and message), to count against [`MAX_ANSWER_ENCODED_BYTES`].
pub fn answer_entry_len(token: &crate::v1::AnswerToken) -> usize {
    use prost::Message;
    let len = token.encoded_len();
    1 + prost::length_delimiter_len(len) + len
}

/// The first field named `…_ms` in `config` (a config serialised with
/// `serde_json`, which keeps every `u64` exact) whose value is over
/// [`MAX_DURATION_MS`] or not a finite number ≥ 0: its path (`pair[0].timeouts.prefill_ready_ms`)
/// and the problem, in words.
pub fn duration_over_bound(config: &serde_json::Value) -> Option<(String, String)> {
    fn walk(v: &serde_json::Value, path: &str) -> Option<(String, String)> {
        match v {
            serde_json::Value::Object(m) => m.iter().find_map(|(k, v)| {
                let at = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                if k.ends_with("_ms")
                    && let Some(problem) = problem(v)
                {
                    return Some((at, problem));
                }
                walk(v, &at)
            }),
            serde_json::Value::Array(a) => a.iter().enumerate().find_map(|(i, v)| walk(v, &format!("{path}[{i}]"))),
            _ => None,
        }
    }
    fn problem(v: &serde_json::Value) -> Option<String> {
        let over = || {
            Some(format!(
                "{v} ms is over the bound of one week ({MAX_DURATION_MS} ms): no pdwarden duration means more"
            ))
        };
        match v {
            serde_json::Value::Number(n) => match (n.as_u64(), n.as_f64()) {
                (Some(ms), _) if ms > MAX_DURATION_MS => over(),
                (Some(_), _) => None,
                (None, Some(ms)) if !(ms.is_finite() && ms >= 0.0) => {
                    Some(format!("{v} is not a duration: a finite number of ms ≥ 0 is needed"))
                }
                (None, Some(ms)) if ms > MAX_DURATION_MS as f64 => over(),
                _ => None,
            },
            _ => None,
        }
    }
    walk(config, "")
}

/// A TOML error in one line: `line 12, field pair.probe.warm_budget_ms:
/// invalid type: string "fast", expected u64` — the line, the field (its
/// table's header and its key) and the parser's message, instead of the
/// parser's multi-line snippet with the field only on its last line.
pub fn toml_error_line(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim().replace('\n', " ");
    let Some(span) = e.span() else {
        return message;
    };
    let start = span.start.min(text.len());
    let before = &text[..start];
    let line_no = before.matches('\n').count() + 1;
    let line = text.lines().nth(line_no - 1).unwrap_or("");
    let key = line
        .split_once('=')
        .map(|(k, _)| k.trim().trim_matches('"').to_string())
        .filter(|k| !k.is_empty() && !k.starts_with('['));
    let table = before
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .map(|h| h.trim_matches(|c| c == '[' || c == ']').trim().to_string());
    let field = match (table, key) {
        (Some(t), Some(k)) => Some(format!("{t}.{k}")),
        (None, Some(k)) => Some(k),
        (Some(t), None) if line.trim_start().starts_with('[') => Some(t),
        _ => None,
    };
    match field {
        Some(f) => format!("line {line_no}, field {f}: {message}"),
        None => format!("line {line_no}: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The entry length is what the answer field really adds on the wire.
    #[test]
    fn an_answer_entry_is_counted_as_encoded() {
        use crate::v1::{AnswerToken, ProbeResult, TokenAlternative};
        use prost::Message;
        let t = AnswerToken {
            token: "é".repeat(128),
            logprob: -0.25,
            top: vec![TokenAlternative {
                token: "x".into(),
                logprob: f64::NAN,
            }],
        };
        let empty = ProbeResult::default().encoded_len();
        let one = ProbeResult {
            answer: vec![t.clone()],
            ..Default::default()
        };
        assert_eq!(one.encoded_len() - empty, answer_entry_len(&t));
        assert_eq!(answer_entry_len(&AnswerToken::default()), 2);
    }

    #[test]
    fn a_huge_duration_is_named_by_its_path() {
        let v = serde_json::json!({"listen": "x", "pair": [{"name": "p", "timeouts": {"prefill_ready_ms": u64::MAX, "poll_interval_ms": 50}}]});
        let (path, problem) = duration_over_bound(&v).unwrap();
        assert_eq!(path, "pair[0].timeouts.prefill_ready_ms");
        assert!(
            problem.starts_with("18446744073709551615 ms is over the bound of one week"),
            "{problem}"
        );
        let ok = serde_json::json!({"a_ms": MAX_DURATION_MS, "b": {"c_ms": 1.5, "d_ms": null}, "e": u64::MAX});
        assert_eq!(duration_over_bound(&ok), None, "only _ms fields, up to the bound");
        let neg = serde_json::json!({"x": {"tpot_ms": -1.0}});
        assert_eq!(duration_over_bound(&neg).unwrap().0, "x.tpot_ms");
    }

    #[test]
    fn a_toml_error_is_one_line_with_its_field() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Probe {
            warm_budget_ms: u64,
        }
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Pair {
            probe: Probe,
        }
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Top {
            pair: Vec<Pair>,
        }
        let text = "# c\n[[pair]]\n\n[pair.probe]\nwarm_budget_ms = \"fast\"\n";
        let e = toml::from_str::<Top>(text).unwrap_err();
        let line = toml_error_line(text, &e);
        assert!(!line.contains('\n'), "{line}");
        assert!(
            line.starts_with("line 5, field pair.probe.warm_budget_ms: invalid type: string \"fast\""),
            "{line}"
        );
    }
}
