//! The record of an operation as people and scripts read it: the `--json`
//! object of `restart pd-pair`, and its rendering for a terminal.
//!
//! Defined once here and carried over gRPC as JSON, so the CLI, the journal
//! and `history` cannot drift apart.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::judge::stats::LatencySummary;
use crate::judge::suite::{StepReport, StepStatus};
use crate::judge::verdict::{ColdAllowance, VerdictKind, secs};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StepRecord {
    pub name: String,
    pub unit: String,
    pub started_ms: u64,
    pub ended_ms: Option<u64>,
    pub outcome: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TimelineRecord {
    pub unit: String,
    pub role: String,
    pub phase: String,
    /// Milliseconds since the operation began.
    pub at_ms: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProbeRecord {
    pub target: String,
    pub seq: u32,
    pub latency_ms: Option<u64>,
    pub tokens: u32,
    /// `ok`, `timeout` or `error`.
    pub outcome: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    /// The probe's X-Request-Id, so it can be found in engine logs.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub request_id: String,
}

/// One readiness check attempt as the agent reported it (DESIGN.md 10):
/// every generation check, and health polls as runs of the same outcome.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AttemptRecord {
    pub unit: String,
    pub role: String,
    /// `health` or `generation`.
    pub check: String,
    /// `ok`, `timeout`, `error` or `refused`.
    pub outcome: String,
    /// 1-based generation attempt within the start-up (0 for health runs).
    #[serde(default)]
    pub seq: u32,
    #[serde(default)]
    pub http_status: i32,
    pub latency_ms: u64,
    /// Polls in a health run (1 for a generation attempt).
    pub count: u32,
    /// When the first attempt of the run ended, ms since the operation began.
    pub first_at_ms: u64,
    /// When the (last) attempt ended, ms since the operation began.
    pub at_ms: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub request_id: String,
}

impl AttemptRecord {
    /// "generation check 1: timeout after 20.0 s (…)" / "health: http 503 ×212 over 4.20 s".
    pub fn describe(&self) -> String {
        let detail = if self.detail.is_empty() || self.outcome == "ok" {
            String::new()
        } else {
            format!(" ({})", self.detail)
        };
        if self.check == "generation" {
            format!(
                "generation check {}: {} after {}{detail}",
                self.seq,
                self.outcome,
                secs(self.latency_ms)
            )
        } else {
            format!(
                "health: {} ×{} over {}{detail}",
                self.outcome,
                self.count,
                secs(self.at_ms.saturating_sub(self.first_at_ms))
            )
        }
    }
}

/// An engine's PD failure counters as scraped after the operation's requests.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EngineCounterRecord {
    pub unit: String,
    pub role: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer_failed_total: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_failed_total: Option<f64>,
    /// Requests the engine finished (SGLang's `sglang:num_requests_total`):
    /// whether the verification reached it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_total: Option<f64>,
    /// Why the scrape said nothing, if it did not.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// A router's own counters of what it hid from its client, per worker, as
/// read after the operation's requests (issue 30).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouterCounterRecord {
    pub unit: String,
    pub workers: Vec<crate::judge::evidence::RouterWorkerCount>,
}

/// The final report of a co-restart.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OperationReport {
    pub operation_id: String,
    pub pair: String,
    pub kind: String,
    pub decode_start_policy: String,
    pub verdict: VerdictKind,
    pub reasons: Vec<String>,
    pub steps: Vec<StepRecord>,
    pub timeline: Vec<TimelineRecord>,
    pub probes: Vec<ProbeRecord>,
    /// Every readiness check attempt of the start-ups, in the order reported.
    #[serde(default)]
    pub attempts: Vec<AttemptRecord>,
    /// The answered probes' latencies, as modes when bimodal.
    pub probe_latency: LatencySummary,
    /// The verification suite's steps, with their raw samples.
    #[serde(default)]
    pub suite: Vec<StepReport>,
    /// Steps within budget but far worse than the pair's history.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// What the suite's requests were held to, and where each number came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budgets: Option<crate::judge::suite::SuiteBudgets>,
    /// The engines' PD failure counters after the requests.
    #[serde(default)]
    pub engine_counters: Vec<EngineCounterRecord>,
    /// The routers' retry and error counters per worker (issue 30).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub router_counters: Vec<RouterCounterRecord>,
    pub warm_budget_ms: u64,
    pub cold_allowance: ColdAllowance,
    /// What the restart started (its units' config fingerprints, hashed):
    /// cold starts are compared only between equal fingerprints.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fingerprint: String,
    /// Out of the shared serving router and back (`[pair.serving_router]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainRecord>,
    /// A rolling restart's children (`ops::rolling`): each sub-pair's
    /// co-restart and the whole pair's verification, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sub_operations: Vec<ChildOperation>,
    /// The greedy answer against its reference (issue 34), and the
    /// reference this operation was held to or recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub golden: Option<crate::judge::golden::GoldenRecord>,
    /// An xPyD pair's greedy answer along each prefill → decode path, each
    /// held to the reference or (none) to the other paths' (issue 34,
    /// "every P→D path agrees"). Empty for a 1P1D pair.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub golden_paths: Vec<crate::judge::golden::PathCheck>,
    /// What the pair looked like before this operation stopped it, when
    /// it was judged wedged (issue 35); the whole capture is the journal's
    /// `evidence` entry (`pdwarden history NAME --evidence OP`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<crate::forensics::CaptureSummary>,
    /// An xPyD pair's path matrix (issue 37): every prefill → decode path
    /// probed, and which engines the failures point to. A failed
    /// verification or co-restart carries one; a repair (`restart --only-sick`)
    /// one per round, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub diagnoses: Vec<crate::judge::paths::Diagnosis>,
    /// A co-restart whose fresh engines met others' requests (clients')
    /// before pdwarden's first probe (issue 47): why its first answer does
    /// not measure a cold start, and is left out of the pair's cold-start
    /// history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_answer_not_cold: Option<String>,
    pub total_ms: u64,
}

/// One line of live progress, as `restart pd-pair` prints it.
pub fn live_step_line(s: &StepRecord) -> String {
    let mark = if s.outcome.starts_with("pass") {
        "✓ "
    } else if s.outcome.starts_with("fail") {
        "✗ "
    } else if s.outcome.starts_with("warn") {
        "! "
    } else {
        ""
    };
    match s.ended_ms {
        None => format!("[{:>8}] step {} ({}) started", secs(s.started_ms), s.name, s.unit),
        Some(end) => format!(
            "[{:>8}] {mark}step {} ({}) {} after {}",
            secs(end),
            s.name,
            s.unit,
            s.outcome,
            secs(end.saturating_sub(s.started_ms))
        ),
    }
}

pub fn live_phase_line(t: &TimelineRecord) -> String {
    let detail = if t.detail.is_empty() {
        String::new()
    } else {
        format!("  ({})", t.detail)
    };
    format!(
        "[{:>8}]   {:<8} {:<12} {}{detail}",
        secs(t.at_ms),
        t.role,
        t.unit,
        t.phase
    )
}

pub fn live_probe_line(p: &ProbeRecord) -> String {
    let lat = p.latency_ms.map(secs).unwrap_or_else(|| "-".into());
    let err = if p.error.is_empty() {
        String::new()
    } else {
        format!("  ({})", p.error)
    };
    format!(
        "           probe {} via {}: {} {} ({} tokens){err}",
        p.seq, p.target, p.outcome, lat, p.tokens
    )
}

/// Summarises each unit's start-up as the incident reports describe one:
/// "refused 0.00–1.12 s, 503 at 1.12 s, 200 at 1.44 s, generating at 1.45 s".
pub fn timeline_summary(timeline: &[TimelineRecord]) -> Vec<String> {
    let mut order: Vec<&str> = Vec::new();
    let mut by_unit: BTreeMap<&str, Vec<&TimelineRecord>> = BTreeMap::new();
    for t in timeline {
        if !by_unit.contains_key(t.unit.as_str()) {
            order.push(&t.unit);
        }
        by_unit.entry(&t.unit).or_default().push(t);
    }
    order
        .into_iter()
        .map(|unit| {
            let events = &by_unit[unit];
            let role = &events[0].role;
            let mut parts = Vec::new();
            for (i, e) in events.iter().enumerate() {
                if e.phase == "check" {
                    parts.push(format!("{} at {}", e.detail, secs(e.at_ms)));
                    continue;
                }
                let label = match e.phase.as_str() {
                    "http_503" => "503",
                    "healthy" => "200",
                    p => p,
                };
                if e.phase == "refused" {
                    let end = events.get(i + 1).map(|n| n.at_ms).unwrap_or(e.at_ms);
                    parts.push(format!(
                        "refused {}–{}",
                        secs(e.at_ms).trim_end_matches(" s"),
                        secs(end)
                    ));
                } else {
                    parts.push(format!("{label} at {}", secs(e.at_ms)));
                }
            }
            format!("{role} {unit}: {}", parts.join(", "))
        })
        .collect()
}

/// The closing summary printed after the live lines.
pub fn render_summary(r: &OperationReport) -> String {
    let mut out = String::new();
    if let Some(e) = &r.evidence {
        for line in e.lines(&r.pair, &r.operation_id) {
            let _ = writeln!(out, "{line}");
        }
    }
    for d in &r.diagnoses {
        let _ = writeln!(out, "\npath matrix:");
        for line in d.lines() {
            let _ = writeln!(out, "  {line}");
        }
    }
    if !r.sub_operations.is_empty() {
        let _ = writeln!(
            out,
            "\nsub-operations ({}):",
            if r.kind == "rolling" {
                "rolling restart"
            } else {
                "in order"
            }
        );
        for c in &r.sub_operations {
            let _ = writeln!(
                out,
                "  {:<40} {:<26} {} after {}",
                c.purpose,
                c.verdict,
                c.operation_id,
                secs(c.total_ms)
            );
        }
    }
    if !r.timeline.is_empty() {
        let _ = writeln!(out, "\ntimeline (decode start policy: {}):", r.decode_start_policy);
        for line in timeline_summary(&r.timeline) {
            let _ = writeln!(out, "  {line}");
        }
    }
    let failed_attempts: Vec<&AttemptRecord> = r
        .attempts
        .iter()
        .filter(|a| a.check == "generation" && a.outcome != "ok")
        .collect();
    if !failed_attempts.is_empty() {
        let _ = writeln!(out, "generation checks that did not pass:");
        for a in failed_attempts {
            let _ = writeln!(out, "  {} {} at {}: {}", a.role, a.unit, secs(a.at_ms), a.describe());
        }
    }
    if !r.probes.is_empty() {
        let _ = writeln!(
            out,
            "probes through the router (warm budget {}, cold allowance: {}):",
            secs(r.warm_budget_ms),
            r.cold_allowance.describe()
        );
        for p in &r.probes {
            let _ = writeln!(
                out,
                "{}",
                live_probe_line(p).trim_start().replacen("probe", "  probe", 1)
            );
        }
    }
    if !r.suite.is_empty() {
        let _ = writeln!(out, "verification suite through the router:");
        if let Some(b) = &r.budgets {
            let _ = writeln!(
                out,
                "  budgets: ttft {} ({}), tpot {} ({}), one warm request {}",
                secs(b.ttft_ms),
                b.ttft_source,
                crate::judge::suite::ms_us(b.tpot_us),
                b.tpot_source,
                secs(b.single_request_ms)
            );
        }
        for step in &r.suite {
            let mark = match step.status {
                StepStatus::Pass => "✓",
                StepStatus::Warn => "!",
                StepStatus::Fail => "✗",
            };
            let _ = writeln!(out, "  {mark} {:<16} {}", step.step.title(), step.summary());
        }
    }
    for w in &r.warnings {
        let _ = writeln!(out, "  warning: {w}");
    }
    let mark = if r.verdict.is_healthy() { "OK" } else { "!!" };
    let _ = writeln!(
        out,
        "\n{mark} verdict: {}  (pair {}, operation {}, {})",
        r.verdict,
        r.pair,
        r.operation_id,
        secs(r.total_ms)
    );
    for reason in &r.reasons {
        let _ = writeln!(out, "   - {reason}");
    }
    out
}

/// One engine of the pair as the serving router knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairWorker {
    /// "host/unit".
    pub unit: String,
    pub url: String,
    /// "prefill" or "decode".
    pub worker_type: String,
    /// A prefill's KV bootstrap port (0: none).
    pub bootstrap_port: u32,
}

/// What the drain and the rejoin did: the report's `drain` section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DrainRecord {
    /// The serving router ("host/unit").
    pub router: String,
    /// The pair's engines the router listed, taken out of its rotation.
    #[serde(default)]
    pub removed: Vec<PairWorker>,
    /// The pair's engines the router did not list (not in rotation before).
    #[serde(default)]
    pub not_listed: Vec<String>,
    /// When the router's list no longer showed the pair (operation ms).
    pub out_at_ms: Option<u64>,
    /// When every engine read idle twice in a row (operation ms).
    pub drained_at_ms: Option<u64>,
    /// Whether the drain waited for the engines' work at all (not for the
    /// recovery of a wedge).
    pub waited: bool,
    /// The wait ran out: the engines still in flight then, in words.
    #[serde(default)]
    pub timed_out: bool,
    #[serde(default)]
    pub in_flight_left: Vec<String>,
    /// Why the pair could not be drained (nothing was restarted then,
    /// except for a recovery).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejoin: Option<RejoinRecord>,
}

/// Whether the pair went back into the serving router.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RejoinRecord {
    /// Put back (the verdict was healthy).
    pub put_back: bool,
    /// When the router listed every engine of the pair healthy (operation ms).
    pub healthy_at_ms: Option<u64>,
    /// In words, for the report's reasons.
    pub detail: String,
    /// The KV paths to the other engines behind the router, checked before
    /// the pair went back ("prefill url → decode url").
    #[serde(default)]
    pub paths_checked: Vec<String>,
}

impl DrainRecord {
    /// The report's reason lines for the drain (and the rejoin, once done).
    pub fn reasons(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(e) = &self.error {
            out.push(format!("drain through the serving router {}: {e}", self.router));
            return out;
        }
        let units = |w: &[PairWorker]| {
            w.iter()
                .map(|w| w.unit.split_once('/').map_or(w.unit.as_str(), |x| x.1).to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        if self.removed.is_empty() {
            out.push(format!(
                "the serving router {} listed none of the pair's engines at their agents' URLs: nothing was taken out of its rotation",
                self.router
            ));
        } else {
            let wait = match (self.waited, self.timed_out, self.drained_at_ms, self.out_at_ms) {
                (false, ..) => " without waiting for its work (a wedged pair's requests do not finish)".to_string(),
                (true, true, ..) => format!(
                    "; the drain timed out with work still in flight ({}): the restart went on",
                    self.in_flight_left.join("; ")
                ),
                (true, false, Some(d), Some(o)) => {
                    format!("; its engines read idle {} ms later", d.saturating_sub(o))
                }
                _ => String::new(),
            };
            out.push(format!(
                "taken out of the serving router {} ({}) before the restart{wait}",
                self.router,
                units(&self.removed)
            ));
        }
        if let Some(r) = &self.rejoin {
            out.push(r.detail.clone());
        }
        out
    }
}

/// A co-restart or verification run by a gate or a rolling restart (its
/// child operations, on `PAIR#gate` / `PAIR#roll`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildOperation {
    /// "baseline", "restart", "rollback_restart".
    pub purpose: String,
    pub operation_id: String,
    pub kind: String,
    pub verdict: String,
    pub reasons: Vec<String>,
    pub total_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(unit: &str, phase: &str, at_ms: u64) -> TimelineRecord {
        TimelineRecord {
            unit: unit.into(),
            role: "prefill".into(),
            phase: phase.into(),
            at_ms,
            detail: String::new(),
        }
    }

    /// The summary reads like seed 004's restart log, with INCIDENTS row 1's numbers.
    #[test]
    fn summary_reads_like_the_incident_timeline() {
        let tl = vec![
            t("prefill-0", "spawned", 0),
            t("prefill-0", "refused", 10),
            t("prefill-0", "http_503", 56_000),
            t("prefill-0", "healthy", 72_000),
            t("prefill-0", "generating", 72_400),
        ];
        assert_eq!(
            timeline_summary(&tl),
            vec![
                "prefill prefill-0: spawned at 0.00 s, refused 0.01–56.0 s, 503 at 56.0 s, 200 at 72.0 s, generating at 72.4 s"
            ]
        );
    }
}
