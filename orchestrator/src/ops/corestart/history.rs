//! What earlier operations of the pair say: the last healthy suites (the
//! suite's baseline) and the accepted cold starts (the measured cold
//! allowance).

use super::*;

/// The suite of the pair's last healthy operation that ran one: the
/// baseline each step is compared with.
pub(super) fn last_healthy_suite(journal: &Journal, pair: &str) -> Option<(String, Vec<StepReport>)> {
    healthy_suites(journal, pair).into_iter().next()
}

/// The suites of the pair's healthy operations that ran one, newest first.
pub(super) fn healthy_suites(journal: &Journal, pair: &str) -> Vec<(String, Vec<StepReport>)> {
    let Ok(history) = journal.history(pair, 50) else {
        return Vec::new();
    };
    history
        .into_iter()
        .filter_map(|r| {
            if !matches!(r.verdict.as_deref(), Some("healthy" | "healthy_after_cold_start")) {
                return None;
            }
            let steps: Vec<StepReport> = serde_json::from_value(r.report?.get("suite")?.clone()).ok()?;
            (!steps.is_empty()).then_some((r.operation_id, steps))
        })
        .collect()
}

/// The pair's accepted restarts (newest first): first answer through the
/// router and the fingerprint of what each started — the evidence the cold
/// allowance is measured from.
pub(super) fn accepted_cold_samples(journal: &Journal, pair: &str) -> Vec<ColdSample> {
    let history = match journal.history(pair, 50) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(pair, error = %e, "cannot read history; using the configured cold allowance");
            return Vec::new();
        }
    };
    history
        .into_iter()
        .filter(|r| r.kind == OperationKind::CoRestart.as_str())
        .filter(|r| matches!(r.verdict.as_deref(), Some("healthy" | "healthy_after_cold_start")))
        .filter_map(|r| {
            let report: OperationReport = serde_json::from_value(r.report?).ok()?;
            // Clients met the fresh engines first: no cold-start measure.
            if report.first_answer_not_cold.is_some() {
                return None;
            }
            let first = report.probes.first().filter(|p| p.outcome == "ok")?.latency_ms?;
            Some(ColdSample {
                operation_id: r.operation_id,
                first_answer_ms: first,
                fingerprint: report.fingerprint,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 47: a restart whose fresh engines met clients' requests before
    /// pdwarden's first probe has no cold-start measure: its fast first
    /// answer is left out of the history (five such restarts under traffic
    /// once measured the pair's cold start at 0.02 s and rejected the next
    /// genuine one).
    #[test]
    fn a_restart_whose_engines_met_clients_first_is_no_cold_sample() {
        let dir = tempfile::tempdir().unwrap();
        let journal = crate::ops::fake_agent::rig::journal(&dir);
        for (i, not_cold) in [None, Some("clients first".to_string())].into_iter().enumerate() {
            let id = format!("op-{i}");
            journal
                .begin(&id, OperationKind::CoRestart.as_str(), "p", None)
                .unwrap();
            let mut report: OperationReport = serde_json::from_value(serde_json::json!({
                "operation_id": id, "pair": "p", "kind": "co_restart", "decode_start_policy": "overlap",
                "verdict": "healthy", "reasons": [], "steps": [], "timeline": [],
                "probes": [{"target": "router:router-0", "seq": 1, "latency_ms": 320 - 300 * i as u64, "tokens": 8, "outcome": "ok", "error": "", "request_id": ""}],
                "probe_latency": pdwarden_model::judge::stats::summarize(&[]),
                "warm_budget_ms": 1, "total_ms": 1,
                "cold_allowance": pdwarden_model::judge::verdict::ColdAllowance::Configured { ms: 1, why: String::new() }
            }))
            .unwrap();
            report.first_answer_not_cold = not_cold;
            journal.conclude(&id, "healthy", &report).unwrap();
        }
        let samples = accepted_cold_samples(&journal, "p");
        assert_eq!(samples.len(), 1, "{samples:?}");
        assert_eq!(samples[0].first_answer_ms, 320);
    }
}
