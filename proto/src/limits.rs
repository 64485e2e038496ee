//! What every pdwarden config shares, whoever loads it (the orchestrator's,
//! the agent's): one bound on durations and one way to say a TOML error.
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
