//! The one recorder of every workflow: what an operation journals, what it
//! streams live to whoever follows it, and its steps, each with the time
//! since the operation began. The co-restart adds its start-up evidence
//! (timeline, check attempts, probes) on top; the gate, its measurements.

use std::sync::{Arc, Mutex};

use pdwarden_proto::v1::{OperationUpdate, StepUpdate, operation_update};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::ops::journal::{Journal, JournalError};
use pdwarden_model::report::StepRecord;

pub struct Recorder {
    pub operation_id: String,
    start: Instant,
    pub journal: Arc<Journal>,
    updates: mpsc::UnboundedSender<OperationUpdate>,
    steps: Mutex<Vec<StepRecord>>,
    /// The first journal write of this operation that failed, of any kind.
    failed_write: Mutex<Option<String>>,
}

impl Recorder {
    pub fn new(operation_id: String, journal: Arc<Journal>, updates: mpsc::UnboundedSender<OperationUpdate>) -> Self {
        Recorder {
            operation_id,
            start: Instant::now(),
            journal,
            updates,
            steps: Mutex::default(),
            failed_write: Mutex::default(),
        }
    }

    /// Milliseconds since the operation began (in this orchestrator).
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// One live update; the follower may have gone away, and the operation
    /// carries on regardless.
    pub fn send(&self, kind: operation_update::Kind) {
        let _ = self.updates.send(OperationUpdate { kind: Some(kind) });
    }

    /// Where this operation's live updates go (a child operation's are
    /// forwarded there).
    pub fn follower(&self) -> mpsc::UnboundedSender<OperationUpdate> {
        self.updates.clone()
    }

    /// Appends an entry at `at_ms`. Evidence, not a step: a failed append
    /// is logged and remembered ([`Recorder::journal_failure`]) and the
    /// operation goes on. Never for an entry that a later step or a resumed
    /// orchestrator relies on: that is [`Recorder::write_ahead`].
    pub fn journal_entry(&self, at_ms: u64, kind: &str, payload: &impl Serialize) {
        if let Err(e) = self.noted(self.journal.append(&self.operation_id, at_ms, kind, payload)) {
            tracing::error!(operation = %self.operation_id, error = %e, "journal append failed");
        }
    }

    /// Appends an entry now (evidence, as [`Recorder::journal_entry`]).
    pub fn journal(&self, kind: &str, payload: &impl Serialize) {
        self.journal_entry(self.now_ms(), kind, payload);
    }

    /// Appends, now, an entry that a later step or a resumed orchestrator
    /// relies on — the write-ahead of a command, before it is sent. Must
    /// write: on an error the caller does not act (the command is not sent)
    /// and stops the operation (DESIGN.md 17).
    pub fn write_ahead(&self, kind: &str, payload: &impl Serialize) -> Result<(), JournalError> {
        self.noted(self.journal.append(&self.operation_id, self.now_ms(), kind, payload))
    }

    /// Moves the operation to `state` (a label only).
    pub fn transition(&self, state: &str) -> Result<(), JournalError> {
        self.noted(self.journal.transition(&self.operation_id, self.now_ms(), state))
    }

    /// Moves the operation to `state` with the workflow's typed state.
    pub fn enter(&self, state: &str, data: &impl Serialize) -> Result<(), JournalError> {
        self.noted(self.journal.enter(&self.operation_id, self.now_ms(), state, Some(data)))
    }

    /// The first journal write of this operation that failed (any entry,
    /// evidence included), if one did: the journal no longer holds the
    /// whole operation, so it cannot conclude healthy.
    pub fn journal_failure(&self) -> Option<String> {
        self.failed_write.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Remembers the first failed write, and hands the result on.
    fn noted(&self, r: Result<(), JournalError>) -> Result<(), JournalError> {
        if let Err(e) = &r {
            self.failed_write
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert_with(|| e.to_string());
        }
        r
    }

    fn lock_steps(&self) -> std::sync::MutexGuard<'_, Vec<StepRecord>> {
        self.steps.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a step (journaled and streamed); returns its index.
    pub fn step_started(&self, name: &str, unit: &str) -> usize {
        let rec = StepRecord {
            name: name.into(),
            unit: unit.into(),
            started_ms: self.now_ms(),
            ended_ms: None,
            outcome: "running".into(),
        };
        self.journal_entry(rec.started_ms, "step", &rec);
        self.send(operation_update::Kind::Step(step_update(&rec)));
        let mut steps = self.lock_steps();
        steps.push(rec);
        steps.len() - 1
    }

    /// Closes step `idx` with its outcome (journaled and streamed).
    pub fn step_ended(&self, idx: usize, outcome: impl Into<String>) {
        let now = self.now_ms();
        let rec = {
            let mut steps = self.lock_steps();
            let s = &mut steps[idx];
            s.ended_ms = Some(now);
            s.outcome = outcome.into();
            s.clone()
        };
        self.journal_entry(now, "step", &rec);
        self.send(operation_update::Kind::Step(step_update(&rec)));
    }

    /// Every step so far, in order.
    pub fn steps(&self) -> Vec<StepRecord> {
        self.lock_steps().clone()
    }
}

fn step_update(s: &StepRecord) -> StepUpdate {
    StepUpdate {
        name: s.name.clone(),
        unit: s.unit.clone(),
        started_ms: s.started_ms,
        ended_ms: s.ended_ms,
        outcome: s.outcome.clone(),
    }
}
