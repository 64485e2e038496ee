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

/// `promtool check metrics` (Debian's `prometheus` package, which
/// `scripts/setup-checks.sh` installs) on `text`: `Err` with what it
/// said when it finds a problem, or when it cannot be run. For the tests of
/// the crates that serve `/metrics`.
pub fn promtool_check(text: &str) -> Result<(), String> {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run promtool ({e}): run scripts/setup-checks.sh (Debian's prometheus package)"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| format!("promtool's stdin: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| format!("promtool: {e}"))?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() && said.trim().is_empty() {
        Ok(())
    } else {
        Err(format!(
            "promtool check metrics (exit {:?}): {}",
            out.status.code(),
            said.trim()
        ))
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
        assert!(e.contains("no help text"), "{e}");
        assert_eq!(promtool_check(&prometheus_text(om)), Ok(()));
    }
}
