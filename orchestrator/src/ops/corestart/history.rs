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
            let first = report.probes.first().filter(|p| p.outcome == "ok")?.latency_ms?;
            Some(ColdSample {
                operation_id: r.operation_id,
                first_answer_ms: first,
                fingerprint: report.fingerprint,
            })
        })
        .collect()
}
