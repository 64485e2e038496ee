//! The co-restart's recorder: the one recorder (`ops::recorder`) and the
//! co-restart's own evidence on top of it — the start-up timeline, the
//! check attempts, the probes — journaled and streamed as they arrive.

use super::*;

/// The operation's recorder, and the co-restart's own evidence on top of
/// it: the start-up timeline, the check attempts, the probes.
pub(super) struct Recorder {
    pub(super) base: crate::ops::recorder::Recorder,
    pub(super) state: Mutex<RecordedEvidence>,
}

#[derive(Default)]
pub(super) struct RecordedEvidence {
    pub(super) timeline: Vec<TimelineRecord>,
    pub(super) probes: Vec<ProbeRecord>,
    pub(super) attempts: Vec<AttemptRecord>,
}

impl std::ops::Deref for Recorder {
    type Target = crate::ops::recorder::Recorder;

    fn deref(&self) -> &Self::Target {
        &self.base
    }
}

impl Recorder {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, RecordedEvidence> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Journals the co-restart's typed state as it is entered.
    pub(super) fn enter(&self, state: &machine::CoRestart) -> Result<(), crate::ops::journal::JournalError> {
        self.base.enter(state.step().as_str(), state)
    }

    pub(super) fn phase(&self, rec: TimelineRecord) {
        self.journal_entry(rec.at_ms, "phase", &rec);
        self.send(operation_update::Kind::Phase(TimelineEntry {
            unit: rec.unit.clone(),
            role: rec.role.clone(),
            phase: rec.phase.clone(),
            at_ms: rec.at_ms,
            detail: rec.detail.clone(),
        }));
        self.lock().timeline.push(rec);
    }

    /// A readiness check attempt: journaled and kept for the report; a
    /// generation attempt is also a timeline entry (phase `check`).
    pub(super) fn attempt(&self, rec: AttemptRecord) {
        self.journal_entry(rec.at_ms, "attempt", &rec);
        if rec.check == "generation" {
            self.phase(TimelineRecord {
                unit: rec.unit.clone(),
                role: rec.role.clone(),
                phase: "check".into(),
                at_ms: rec.at_ms,
                detail: rec.describe(),
            });
        }
        self.lock().attempts.push(rec);
    }

    pub(super) fn probe(&self, rec: ProbeRecord) {
        self.journal_entry(self.now_ms(), "probe", &rec);
        self.send(operation_update::Kind::Probe(ProbeSample {
            target: rec.target.clone(),
            seq: rec.seq,
            latency_ms: rec.latency_ms,
            tokens: rec.tokens,
            outcome: rec.outcome.clone(),
            error: rec.error.clone(),
        }));
        self.lock().probes.push(rec);
    }
}
