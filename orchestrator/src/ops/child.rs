//! Running a child operation — a co-restart or verification that a gate
//! (`PAIR#gate`) or a rolling restart (`PAIR#roll`) runs as its own
//! journaled operation. One runner for both (issue 33: it was written twice
//! and had drifted: the gate swallowed a failed write-ahead, the roll
//! propagated it).
//!
//! The parent's entry naming the child is must-write and written before the
//! child exists (DESIGN.md 17): a parent taken over after a kill reads its
//! children from there, to conclude one left running and to know whether
//! any unit was restarted. The child's live progress (steps, phases,
//! probes) is forwarded to whoever follows the parent.

use pdwarden_proto::v1::{OperationUpdate, operation_update};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::config::PairConfig;
use crate::ops::corestart::{OperationContext, OperationKind, run_operation};
use crate::ops::journal::JournalError;
use crate::ops::recorder::Recorder;
use pdwarden_model::report::OperationReport;

/// Runs `kind` on `config` as a child of `parent` on pair `child_pair`:
/// journals `entry(id)` under `entry_kind` in the parent (must-write), then
/// begins the child and runs it to its conclusion. A child that panicked is
/// concluded by its guard, and the panic goes on to the parent's guard.
pub async fn run<E: Serialize>(
    ctx: &OperationContext,
    parent: &Recorder,
    child_pair: &str,
    entry_kind: &str,
    entry: impl FnOnce(&str) -> E,
    kind: OperationKind,
    config: PairConfig,
) -> Result<OperationReport, JournalError> {
    let id = uuid::Uuid::new_v4().to_string();
    parent.write_ahead(entry_kind, &entry(&id))?;
    ctx.journal.begin(&id, kind.as_str(), child_pair, None)?;
    let (tx, mut rx) = mpsc::unbounded_channel::<OperationUpdate>();
    let fwd = parent.follower();
    let forward = tokio::spawn(async move {
        while let Some(u) = rx.recv().await {
            if matches!(
                u.kind,
                Some(
                    operation_update::Kind::Step(_)
                        | operation_update::Kind::Phase(_)
                        | operation_update::Kind::Probe(_)
                )
            ) {
                let _ = fwd.send(u);
            }
        }
    });
    let child = run_operation(ctx.clone(), config, id.clone(), kind, tx);
    let report = match crate::ops::guarded(&ctx.journal, &id, child).await {
        Ok(r) => r,
        // The child is concluded; the parent's own guard concludes the parent.
        Err(panic) => std::panic::resume_unwind(Box::new(panic.0)),
    };
    let _ = forward.await;
    Ok(report)
}

/// Concludes `failed` every operation still running on `child_pair` (a
/// parent concluded without resuming its child), saying `why`.
pub fn abandon(journal: &crate::ops::journal::Journal, child_pair: &str, why: &str) {
    for op in journal
        .unfinished()
        .unwrap_or_default()
        .into_iter()
        .filter(|o| o.pair == child_pair)
    {
        let report = serde_json::json!({
            "operation_id": op.operation_id, "pair": op.pair, "kind": op.kind, "verdict": "failed",
            "reasons": [format!("{why} (state {}): check the pair's units", op.state)],
        });
        if let Err(e) = journal.conclude(&op.operation_id, "failed", &report) {
            tracing::error!(operation = %op.operation_id, error = %e, "could not conclude a child operation");
        }
    }
}

/// What a parent operation (a roll, a repair) concluded, in its own words.
pub struct ParentConclusion {
    pub kind: &'static str,
    pub verdict: pdwarden_model::judge::verdict::VerdictKind,
    pub reasons: Vec<String>,
    pub children: Vec<pdwarden_model::report::ChildOperation>,
    pub evidence: Option<pdwarden_model::forensics::CaptureSummary>,
    pub diagnoses: Vec<pdwarden_model::judge::paths::Diagnosis>,
}

/// A parent operation's report — its children, not probes of its own —
/// journaled as its conclusion and sent to whoever follows it. A
/// conclusion that cannot be written is said in the report.
pub fn conclude_parent(parent: &Recorder, pair: &PairConfig, c: ParentConclusion) -> OperationReport {
    let mut report = OperationReport {
        operation_id: parent.operation_id.clone(),
        pair: pair.name.clone(),
        kind: c.kind.into(),
        decode_start_policy: pair.decode_start_policy.as_str().into(),
        verdict: c.verdict,
        reasons: c.reasons,
        steps: parent.steps(),
        timeline: Vec::new(),
        probes: Vec::new(),
        attempts: Vec::new(),
        probe_latency: pdwarden_model::judge::stats::summarize(&[]),
        suite: Vec::new(),
        warnings: Vec::new(),
        budgets: None,
        engine_counters: Vec::new(),
        router_counters: Vec::new(),
        warm_budget_ms: pair.probe.warm_budget_ms,
        cold_allowance: pdwarden_model::judge::verdict::ColdAllowance::Configured {
            ms: pair.probe.cold_allowance_ms,
            why: String::new(),
        },
        fingerprint: String::new(),
        drain: None,
        sub_operations: c.children,
        golden: None,
        golden_paths: Vec::new(),
        evidence: c.evidence,
        diagnoses: c.diagnoses,
        first_answer_not_cold: None,
        total_ms: parent.now_ms(),
    };
    if let Err(e) = parent
        .journal
        .conclude(&report.operation_id, report.verdict.as_str(), &report)
    {
        tracing::error!(operation = %report.operation_id, kind = c.kind, error = %e, "could not journal the verdict");
        report.reasons.push(e.unwritten_conclusion());
    }
    if let Ok(json) = serde_json::to_string(&report) {
        parent.send(operation_update::Kind::Report(pdwarden_proto::v1::JsonReply { json }));
    }
    report
}
