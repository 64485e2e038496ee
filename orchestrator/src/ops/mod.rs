//! The operation runtime: journaled, resumable workflows that send commands
//! to agents and wait for their facts. Each step is journaled before its
//! commands go out; a new orchestrator resumes an interrupted operation from
//! the journal and the agents' facts, adopting the commands already sent by
//! their ids (DESIGN.md 4).
//!
//! - [`corestart`]: the ordered co-restart (and a verification), its resume.
//! - [`gate`]: the change gate (apply, co-restart, verify live, measure,
//!   keep or roll back), its resume.
//! - [`drain`]: a pair out of its shared serving router before a
//!   co-restart, back in after a healthy verdict.
//! - [`rolling`]: an xPyD pair restarted one P/D sub-pair at a time, each
//!   out of the pair's own router while it restarts.
//! - [`machine`]: the one runtime of the operations written as machines
//!   (a pure step per workflow; each state and write-ahead journaled,
//!   must-write, before the effect is carried out).
//! - [`diagnose`]: every prefill → decode path of a pair probed, the
//!   matrix localised to the sick engine (issue 37).
//! - [`forensics`]: evidence before the kill — what a pair judged wedged
//!   looked like, captured before its co-restart stops anything (issue 35).
//! - [`watcher`]: the continuous per-pair watch and automatic recovery.
//! - [`preflight`]: what is checked before an operation touches any unit.
//! - [`port`]: the agent port — the runtime's only way to reach agents
//!   (the fleet implements it over gRPC, the fake agent in memory).
//! - [`recorder`]: the one recorder — journal entries, live updates, steps.
//! - [`journal`]: the SQLite journal of operations.
//! - [`telemetry`]: the operations' Prometheus series, fed by the journal's
//!   conclusions.
//! - The operation report (`--json`) and its terminal rendering are records
//!   (`pdwarden_model::report`), which the CLI reads without this crate.
//! - `fake_agent` (tests only): an in-memory agent the drivers' unit tests
//!   run against at paused time.

pub mod child;
pub mod corestart;
pub mod diagnose;
pub mod drain;
#[cfg(test)]
pub(crate) mod fake_agent;
#[cfg(test)]
mod fault_tests;
pub mod forensics;
pub mod gate;
pub mod journal;
pub mod machine;
pub mod port;
pub mod preflight;
pub mod recorder;
pub mod repair;
pub mod rolling;
pub mod telemetry;
pub mod watcher;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use journal::{Journal, JournalError};
use port::AgentPort;

/// Everything a workflow needs from the orchestrator: the agents, through
/// the port, and the journal.
#[derive(Clone)]
pub struct OperationContext {
    pub agents: Arc<dyn AgentPort>,
    pub journal: Arc<Journal>,
}

impl OperationContext {
    /// The one way an operation starts — a co-restart or verification from
    /// the CLI, a gate and its child co-restarts, an automatic recovery: a
    /// fresh id and its journal row (one running operation per pair,
    /// idempotent by request id), then its `opening` entries (the change a
    /// gate makes, …) before anything is sent. If an opening entry cannot be
    /// journaled the operation is concluded `failed` at once: nothing runs
    /// on a record that is not there.
    pub fn begin(
        &self,
        kind: &str,
        pair: &str,
        request_id: Option<&str>,
        opening: &[(&str, serde_json::Value)],
    ) -> Result<String, JournalError> {
        let id = uuid::Uuid::new_v4().to_string();
        self.journal.begin(&id, kind, pair, request_id)?;
        for (entry, payload) in opening {
            if let Err(e) = self.journal.append(&id, 0, entry, payload) {
                let _ = self.journal.conclude(
                    &id,
                    "failed",
                    &serde_json::json!({ "verdict": "failed", "reasons": [format!("its {entry} could not be journaled: {e}")] }),
                );
                return Err(e);
            }
        }
        Ok(id)
    }
}

/// An operation's task panicked: the panic's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Panicked(pub String);

impl PartialEq<&str> for Panicked {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

/// Runs an operation's task so that it cannot end — by a panic, or by
/// returning without a conclusion — with its operation still running in the
/// journal, which would hold its pair "busy" for ever and be resumed (and
/// panic again) by the next orchestrator (issue 16). Whatever the task left
/// running is concluded `failed`, saying why; a panic is returned as its
/// message, for the caller to end its own work (a gate whose child panicked
/// is concluded by its own guard in turn).
pub async fn guarded<T>(journal: &Journal, operation_id: &str, task: impl Future<Output = T>) -> Result<T, Panicked> {
    let outcome = AssertUnwindSafe(task)
        .catch_unwind()
        .await
        .map_err(|p| Panicked(panic_message(&*p)));
    let why = match &outcome {
        Ok(_) => "its task ended without concluding it (an internal error)".to_string(),
        Err(msg) => format!("its task panicked: {msg} (an internal error)"),
    };
    let report = serde_json::json!({
        "verdict": "failed",
        "reasons": [format!("{why}; concluded failed so the pair is released: check the pair's units")],
    });
    match journal.conclude_if_running(operation_id, "failed", &report) {
        Ok(true) => tracing::error!(operation = %operation_id, %why, "operation concluded failed"),
        Ok(false) => {}
        Err(e) => tracing::error!(operation = %operation_id, %why, error = %e, "cannot conclude the operation"),
    }
    outcome
}

/// Spawns an operation's task under [`guarded`].
pub fn spawn_guarded<T: Send + 'static>(
    journal: Arc<Journal>,
    operation_id: String,
    task: impl Future<Output = T> + Send + 'static,
) -> tokio::task::JoinHandle<Result<T, Panicked>> {
    tokio::spawn(async move { guarded(&journal, &operation_id, task).await })
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .or_else(|| p.downcast_ref::<Panicked>().map(|p| p.0.clone()))
        .unwrap_or_else(|| "a panic without a message".into())
}

#[cfg(test)]
mod guard_tests {
    use super::*;

    fn journal() -> (tempfile::TempDir, Arc<Journal>) {
        let dir = tempfile::tempdir().unwrap();
        let j = Arc::new(Journal::open(&dir.path().join("j.sqlite")).unwrap());
        (dir, j)
    }

    /// Issue 16, finding 1: a task that panics mid-operation concludes it
    /// `failed` with the panic's message and releases its pair.
    #[tokio::test]
    async fn a_panicking_operation_is_concluded_and_its_pair_released() {
        let (_d, j) = journal();
        j.begin("op-1", "co_restart", "p", None).unwrap();
        let out = spawn_guarded(j.clone(), "op-1".into(), async {
            // What `prefill_ready_ms = 18446744073709551615` did to a deadline.
            let ready_ms: u64 = std::hint::black_box(u64::MAX);
            ready_ms.checked_add(30_000).expect("attempt to add with overflow")
        })
        .await
        .unwrap();
        assert_eq!(out.unwrap_err(), "attempt to add with overflow");
        assert!(j.unfinished().unwrap().is_empty(), "still running");
        let op = &j.history("p", 1).unwrap()[0];
        assert_eq!(op.verdict.as_deref(), Some("failed"));
        assert!(
            op.report
                .as_ref()
                .unwrap()
                .to_string()
                .contains("its task panicked: attempt to add with overflow"),
            "{op:?}"
        );
        j.begin("op-2", "co_restart", "p", None).expect("the pair is released");
    }

    /// A task that returns without concluding is concluded too; one that
    /// concluded keeps its verdict.
    #[tokio::test]
    async fn only_what_the_task_left_running_is_concluded() {
        let (_d, j) = journal();
        j.begin("a", "verify", "p", None).unwrap();
        spawn_guarded(j.clone(), "a".into(), async {}).await.unwrap().unwrap();
        let a = &j.history("p", 1).unwrap()[0];
        assert!(
            a.report
                .as_ref()
                .unwrap()
                .to_string()
                .contains("ended without concluding"),
            "{a:?}"
        );
        j.begin("b", "verify", "p", None).unwrap();
        let j2 = j.clone();
        spawn_guarded(j.clone(), "b".into(), async move {
            j2.conclude("b", "healthy", &serde_json::json!({"verdict": "healthy"}))
                .unwrap();
        })
        .await
        .unwrap()
        .unwrap();
        assert_eq!(j.history("p", 1).unwrap()[0].verdict.as_deref(), Some("healthy"));
    }
}
