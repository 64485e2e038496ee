//! Prometheus text format (0.0.4) from `prometheus-client`'s OpenMetrics
//! text, for the agent's and the orchestrator's `/metrics`.
//!
//! `prometheus-client` writes only OpenMetrics: a counter family is declared
//! `# TYPE NAME counter` with its samples named `NAME_total`, and the text
//! ends in `# EOF`. A scraper that reads it as the classic text format —
//! `promtool check metrics`, and any client that does not negotiate
//! OpenMetrics — then sees `NAME_total` as an untyped series with no help,
//! and an empty counter `NAME`. Served as text 0.0.4 instead (what every
//! Prometheus-compatible scraper reads), the counter's declaration is named
//! like its samples and the `# EOF` goes; gauges and histograms are written
//! the same in both.

/// The content type of [`prometheus_text`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `openmetrics` (as `prometheus_client::encoding::text::encode` writes it)
/// in the classic text format.
pub fn prometheus_text(openmetrics: &str) -> String {
    // The counter families, from their TYPE lines.
    let counters: Vec<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            counters.contains(&name).then(|| format!("{prefix}{name}_total {tail}"))
        });
        match renamed {
            Some(l) => out.push_str(l.trim_end()),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Why [`promtool_check`] did not pass: promtool could not be run, or it
/// found problems in the text.
#[derive(Debug, thiserror::Error)]
pub enum PromtoolError {
    /// `promtool` is not installed (or cannot be started).
    #[error("cannot run promtool ({source}): run scripts/setup-checks.sh (Debian's prometheus package)")]
    CannotRun {
        #[source]
        source: std::io::Error,
    },
    /// The text could not be written to promtool.
    #[error("promtool's stdin: {source}")]
    Stdin {
        #[source]
        source: std::io::Error,
    },
    /// promtool's output or exit status could not be read.
    #[error("promtool: {source}")]
    Wait {
        #[source]
        source: std::io::Error,
    },
    /// promtool ran and found problems (or failed): what it said, trimmed.
    #[error("promtool check metrics (exit {exit:?}): {said}")]
    Problems { exit: Option<i32>, said: String },
}

/// Equal when the same kind of failure says the same thing (an
/// `io::Error` has no equality of its own), so the tests that serve
/// `/metrics` can write `assert_eq!(promtool_check(&text), Ok(()))`.
impl PartialEq for PromtoolError {
    fn eq(&self, other: &Self) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other) && self.to_string() == other.to_string()
    }
}

/// `promtool check metrics` (Debian's `prometheus` package, which
/// `scripts/setup-checks.sh` installs) on `text`: `Err` with what it
/// said when it finds a problem, or when it cannot be run. For the tests of
/// the crates that serve `/metrics`.
pub fn promtool_check(text: &str) -> Result<(), PromtoolError> {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| PromtoolError::CannotRun { source })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(text.as_bytes())
            .map_err(|source| PromtoolError::Stdin { source })?;
    }
    let out = child
        .wait_with_output()
        .map_err(|source| PromtoolError::Wait { source })?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() && said.trim().is_empty() {
        Ok(())
    } else {
        Err(PromtoolError::Problems {
            exit: out.status.code(),
            said: said.trim().to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A counter's declaration takes its samples' name; gauges, histograms
    /// and help texts are left as they are; `# EOF` goes.
    #[test]
    fn counters_are_declared_by_their_sample_name() {
        let om = "# HELP a_events Things that happened.\n# TYPE a_events counter\na_events_total{k=\"v\"} 2\n# HELP b_level A level.\n# TYPE b_level gauge\nb_level 1.0\n# HELP c_seconds Durations.\n# TYPE c_seconds histogram\nc_seconds_sum 0.5\nc_seconds_count 1\nc_seconds_bucket{le=\"+Inf\"} 1\n# EOF\n";
        assert_eq!(
            prometheus_text(om),
            "# HELP a_events_total Things that happened.\n# TYPE a_events_total counter\na_events_total{k=\"v\"} 2\n# HELP b_level A level.\n# TYPE b_level gauge\nb_level 1.0\n# HELP c_seconds Durations.\n# TYPE c_seconds histogram\nc_seconds_sum 0.5\nc_seconds_count 1\nc_seconds_bucket{le=\"+Inf\"} 1\n"
        );
    }

    /// The check itself can fail: a counter declared as OpenMetrics writes
    /// it is a problem to promtool, and so is a missing help text.
    #[test]
    fn promtool_finds_what_the_text_format_gets_wrong() {
        let om = "# HELP a_events Things that happened.\n# TYPE a_events counter\na_events_total 2\n# EOF\n";
        let e = promtool_check(om).unwrap_err();
        assert!(matches!(e, PromtoolError::Problems { .. }), "{e:?}");
        assert!(e.to_string().contains("no help text"), "{e}");
        assert_eq!(promtool_check(&prometheus_text(om)), Ok(()));
    }
}
