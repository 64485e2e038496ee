//! The operations' Prometheus series (issue 18): how long operations and
//! their steps take, how they end, what the gate decided, what the watch
//! recovered on its own.
//!
//! Observed where every operation ends — its conclusion in the journal
//! ([`super::journal::Journal::observe_conclusions`]) — so a co-restart from
//! the CLI, a gate and each of its child co-restarts, an automatic recovery
//! and an operation concluded `failed` by its guard are all counted once,
//! the same way, from the report the journal keeps. Nothing here reads a
//! clock: durations are the report's own (`total_ms`, each step's
//! `started_ms`/`ended_ms`).
//!
//! Names and units follow Prometheus conventions (base units, `_seconds`,
//! `_total` on counters), checked by `promtool check metrics` in a test
//! (`edge::ready`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of an operation's duration.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// `co_restart`, `verify`, `gate`.
    pub kind: String,
    pub verdict: String,
}

/// Labels of a step's duration.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    pub kind: String,
    pub step: String,
}

/// Labels of a per-pair decision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PairVerdictLabels {
    pub pair: String,
    pub verdict: String,
}

fn duration_histogram() -> Histogram {
    // 0.1 s .. ~27 min: a scaled demo's step to a GPU model load.
    Histogram::new(exponential_buckets(0.1, 2.0, 15))
}

/// One concluded operation, as the journal has it.
#[derive(Debug, Clone)]
pub struct Concluded<'a> {
    pub kind: &'a str,
    pub pair: &'a str,
    /// Automatic recoveries carry a request id `auto-…`.
    pub request_id: Option<&'a str>,
    pub verdict: &'a str,
    pub report: &'a serde_json::Value,
}

/// The operations' series. Cloning shares them.
#[derive(Clone)]
pub struct OperationMetrics {
    operations: Family<OperationLabels, Histogram, fn() -> Histogram>,
    steps: Family<StepLabels, Histogram, fn() -> Histogram>,
    gate_decisions: Family<PairVerdictLabels, Counter>,
    recoveries: Family<PairVerdictLabels, Counter>,
    /// The journal's size after the last retention pass (issue 36).
    journal_bytes: Gauge,
    journal_operations: Gauge,
    journal_entries: Gauge,
    /// Operations retention compacted to summaries, and removed.
    retention_compacted: Counter,
    retention_removed: Counter,
    /// Each pair's latest verdict (of any kind of operation).
    last: Arc<Mutex<BTreeMap<String, String>>>,
}

impl Default for OperationMetrics {
    fn default() -> Self {
        OperationMetrics {
            operations: Family::new_with_constructor(duration_histogram),
            steps: Family::new_with_constructor(duration_histogram),
            gate_decisions: Family::default(),
            recoveries: Family::default(),
            journal_bytes: Gauge::default(),
            journal_operations: Gauge::default(),
            journal_entries: Gauge::default(),
            retention_compacted: Counter::default(),
            retention_removed: Counter::default(),
            last: Arc::default(),
        }
    }
}

/// Every verdict an operation may end with, for the state-set gauge of a
/// pair's last verdict (each is 0 or 1, so an alert can match one).
pub const VERDICTS: &[&str] = &[
    "healthy",
    "healthy_after_cold_start",
    "cold_start_rejected",
    "over_budget",
    "wedged",
    "failed",
];

impl OperationMetrics {
    /// Records one conclusion.
    pub fn concluded(&self, c: &Concluded<'_>) {
        let secs = |ms: u64| ms as f64 / 1000.0;
        let total_ms = c.report.get("total_ms").and_then(serde_json::Value::as_u64);
        if let Some(ms) = total_ms {
            self.operations
                .get_or_create(&OperationLabels {
                    kind: c.kind.to_string(),
                    verdict: c.verdict.to_string(),
                })
                .observe(secs(ms));
        }
        for step in c
            .report
            .get("steps")
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
        {
            let (Some(name), Some(start), Some(end)) = (
                step.get("name").and_then(serde_json::Value::as_str),
                step.get("started_ms").and_then(serde_json::Value::as_u64),
                step.get("ended_ms").and_then(serde_json::Value::as_u64),
            ) else {
                continue;
            };
            self.steps
                .get_or_create(&StepLabels {
                    kind: c.kind.to_string(),
                    step: name.to_string(),
                })
                .observe(secs(end.saturating_sub(start)));
        }
        let labels = PairVerdictLabels {
            pair: c.pair.to_string(),
            verdict: c.verdict.to_string(),
        };
        if c.kind == "gate" {
            self.gate_decisions.get_or_create(&labels).inc();
        } else if c.request_id.is_some_and(|r| r.starts_with("auto-")) {
            self.recoveries.get_or_create(&labels).inc();
        }
        // A gate's own verdicts are its decisions, not the pair's health;
        // its child operations run under `PAIR#gate`.
        if c.kind != "gate" && !c.pair.contains('#') {
            self.last
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(c.pair.to_string(), c.verdict.to_string());
        }
    }

    /// One retention pass: what it compacted and removed, and the
    /// journal's size after it (operations, entries, live bytes).
    pub fn retained(&self, compacted: u64, removed: u64, size: Option<(u64, u64, u64)>) {
        self.retention_compacted.inc_by(compacted);
        self.retention_removed.inc_by(removed);
        if let Some((operations, entries, bytes)) = size {
            let g = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            self.journal_operations.set(g(operations));
            self.journal_entries.set(g(entries));
            self.journal_bytes.set(g(bytes));
        }
    }

    /// Each pair's latest operation verdict.
    pub fn last_verdicts(&self) -> BTreeMap<String, String> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Registers the series in `registry` (the readiness endpoint's).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "pdwarden_operation_duration_seconds",
            "Time from an operation's start to its conclusion, by kind and verdict",
            self.operations.clone(),
        );
        registry.register(
            "pdwarden_operation_step_duration_seconds",
            "Time each step of an operation took, by operation kind and step",
            self.steps.clone(),
        );
        registry.register(
            "pdwarden_gate_decisions",
            "Change gates concluded, by pair and verdict",
            self.gate_decisions.clone(),
        );
        registry.register(
            "pdwarden_journal_bytes",
            "Live bytes the journal holds (SQLite used pages; etcd keys and values under its prefix), after the last retention pass",
            self.journal_bytes.clone(),
        );
        registry.register(
            "pdwarden_journal_operations",
            "Operations the journal holds, whole or summarised, after the last retention pass",
            self.journal_operations.clone(),
        );
        registry.register(
            "pdwarden_journal_entries",
            "Entries the journal holds, after the last retention pass",
            self.journal_entries.clone(),
        );
        registry.register(
            "pdwarden_journal_compacted",
            "Operations retention compacted to their summaries",
            self.retention_compacted.clone(),
        );
        registry.register(
            "pdwarden_journal_removed",
            "Operations retention removed (past the count or the age kept)",
            self.retention_removed.clone(),
        );
        registry.register(
            "pdwarden_automatic_recoveries",
            "Co-restarts the watch started on its own after confirming a wedge, by pair and verdict",
            self.recoveries.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(m: &OperationMetrics) -> String {
        let mut r = Registry::default();
        m.register(&mut r);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        out
    }

    /// Issue 36: a retention pass's outcome and the journal's size.
    #[test]
    fn retention_passes_feed_the_journal_series() {
        let m = OperationMetrics::default();
        m.retained(3, 2, Some((1000, 800, 4_096_000)));
        m.retained(1, 0, None);
        let t = text(&m);
        for line in [
            "pdwarden_journal_bytes 4096000",
            "pdwarden_journal_operations 1000",
            "pdwarden_journal_entries 800",
            "pdwarden_journal_compacted_total 4",
            "pdwarden_journal_removed_total 2",
        ] {
            assert!(t.contains(line), "{line} in\n{t}");
        }
    }

    /// A co-restart, an automatic recovery, a gate and a gate's child:
    /// each counted under its own series, the pair's last verdict its
    /// latest own operation's.
    #[test]
    fn conclusions_feed_durations_decisions_and_recoveries() {
        let m = OperationMetrics::default();
        let report = json!({
            "total_ms": 2500,
            "steps": [
                {"name": "restarting_prefill", "unit": "prefill-0", "started_ms": 0, "ended_ms": 1500, "outcome": "ok"},
                {"name": "restarting_decode", "unit": "decode-0", "started_ms": 1500, "outcome": "cut"},
            ],
        });
        let c = |kind, pair, request_id, verdict| Concluded {
            kind,
            pair,
            request_id,
            verdict,
            report: &report,
        };
        m.concluded(&c("co_restart", "demo", None, "healthy"));
        m.concluded(&c("co_restart", "demo", Some("auto-1"), "over_budget"));
        m.concluded(&c("gate", "demo", None, "rejected_rolled_back"));
        m.concluded(&c("co_restart", "demo#gate", None, "healthy"));
        let t = text(&m);
        for line in [
            "pdwarden_operation_duration_seconds_count{kind=\"co_restart\",verdict=\"healthy\"} 2",
            "pdwarden_operation_duration_seconds_sum{kind=\"gate\",verdict=\"rejected_rolled_back\"} 2.5",
            "pdwarden_operation_step_duration_seconds_sum{kind=\"co_restart\",step=\"restarting_prefill\"} 4.5",
            "pdwarden_gate_decisions_total{pair=\"demo\",verdict=\"rejected_rolled_back\"} 1",
            "pdwarden_automatic_recoveries_total{pair=\"demo\",verdict=\"over_budget\"} 1",
        ] {
            assert!(t.lines().any(|l| l == line), "missing {line}\n{t}");
        }
        assert!(
            !t.contains("restarting_decode"),
            "a step without an end is not a duration"
        );
        assert_eq!(
            m.last_verdicts(),
            BTreeMap::from([("demo".into(), "over_budget".into())])
        );
    }
}
