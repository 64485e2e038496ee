//! One runtime for the operations written as machines (issue 33; kube-rs's
//! `kube-runtime/src/watcher.rs` is the shape): a workflow is an enum whose
//! variants carry their data, advanced by a pure
//! `step(state, event, now) -> Transition { next, effects }`; this module
//! is the only place that journals and acts.
//!
//! Why one runtime: the journal's rules (DESIGN.md 17) were written once per
//! workflow and had drifted — a state transition whose failed write was
//! ignored (`let _ = rec.transition(..)`), a write-ahead swallowed in one
//! copy and propagated in the other. Here:
//!
//! - every state the machine enters is journaled (its serde tag as the
//!   operation's state label, its data with it: `Journal::enter`) before any
//!   of the effects that state asks for is carried out — **must-write**;
//! - an effect that changes the world names its write-ahead entry
//!   ([`Effect::write_ahead`]), journaled before it is carried out —
//!   **must-write**; a read (a list, a scrape, a wait) journals nothing;
//! - a write that fails is handed to the machine
//!   ([`Machine::stopped_by_the_journal`]), whose answer is the final state:
//!   nothing more is carried out, and the caller concludes from it.
//!
//! The effects of one transition are carried out in order. Carrying one out
//! may answer with an event; the machine's step on that event decides what
//! follows, and the effects still queued from the earlier transition are
//! dropped (a step that answers a failure need not undo a plan it never
//! saw). An effect that answers nothing lets the next one run. The run ends
//! when no effect is left.

use std::collections::VecDeque;
use std::future::Future;

use serde::Serialize;

use crate::ops::journal::JournalError;
use crate::ops::recorder::Recorder;

/// A state and the effects it asks for, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition<S, E> {
    pub next: S,
    pub effects: Vec<E>,
}

impl<S, E> Transition<S, E> {
    /// `next`, asking for nothing more: the end of the run (unless an
    /// effect still queued answers with an event).
    pub fn to(next: S) -> Self {
        Transition {
            next,
            effects: Vec::new(),
        }
    }

    /// `next`, asking for `effect`.
    pub fn then(next: S, effect: E) -> Self {
        Transition {
            next,
            effects: vec![effect],
        }
    }
}

/// Something a machine asks the runtime to carry out.
pub trait Effect {
    /// The entry journaled, must-write, before this effect is carried out
    /// (`None`: a read, or an effect that journals its own write-ahead).
    fn write_ahead(&self) -> Option<(&'static str, serde_json::Value)> {
        None
    }
}

/// A workflow as data.
pub trait Machine {
    /// Where the workflow is; journaled on entry.
    type State: Serialize + Clone + PartialEq;
    /// What carrying out an effect answered.
    type Event;
    type Effect: Effect;

    /// The operation's state label for `state` (`history`; the serde tag).
    fn label(state: &Self::State) -> &'static str;

    /// Where the states are journaled: `None` (a workflow that is the
    /// operation) as the operation's state (`Journal::enter`, which a
    /// resume reads back with `Journal::last_state`); `Some(kind)` (a
    /// workflow inside another's operation, e.g. the drain inside a
    /// co-restart) as an entry of that kind, leaving the operation's own
    /// state alone.
    const STATE_ENTRY: Option<&'static str> = None;

    /// The pure step: the next state and what it asks for.
    fn step(&self, state: Self::State, event: Self::Event, now_ms: u64) -> Transition<Self::State, Self::Effect>;

    /// The final state of a workflow whose journal could not record a step
    /// (`error`) while in `state`: nothing more is carried out.
    fn stopped_by_the_journal(&self, state: Self::State, error: &JournalError) -> Self::State;
}

/// Runs `machine` from `start` to the end: journals each state entered and
/// each effect's write-ahead (must-write), carries the effects out with
/// `carry`, steps on what they answer. Returns the final state.
pub async fn run<M, F, Fut>(
    machine: &M,
    rec: &Recorder,
    start: Transition<M::State, M::Effect>,
    mut carry: F,
) -> M::State
where
    M: Machine,
    F: FnMut(M::Effect) -> Fut,
    Fut: Future<Output = Option<M::Event>>,
{
    let mut state = start.next;
    if let Err(e) = enter::<M>(rec, &state) {
        return machine.stopped_by_the_journal(state, &e);
    }
    let mut queue: VecDeque<M::Effect> = start.effects.into();
    while let Some(effect) = queue.pop_front() {
        if let Some((kind, payload)) = effect.write_ahead()
            && let Err(e) = rec.write_ahead(kind, &payload)
        {
            return machine.stopped_by_the_journal(state, &e);
        }
        let Some(event) = carry(effect).await else {
            continue;
        };
        let t = machine.step(state.clone(), event, rec.now_ms());
        if t.next != state
            && let Err(e) = enter::<M>(rec, &t.next)
        {
            return machine.stopped_by_the_journal(t.next, &e);
        }
        state = t.next;
        queue = t.effects.into();
    }
    state
}

/// Journals `state` as `M` says (must-write).
fn enter<M: Machine>(rec: &Recorder, state: &M::State) -> Result<(), JournalError> {
    match M::STATE_ENTRY {
        None => rec.enter(M::label(state), state),
        Some(kind) => rec.write_ahead(kind, state),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde::Deserialize;
    use tokio::sync::mpsc;

    use super::*;
    use crate::ops::fake_agent::rig;
    use crate::ops::journal::Journal;

    /// A counter that asks to be told twice, then stops.
    struct Counter;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(tag = "state", rename_all = "snake_case")]
    enum Count {
        Counting { n: u32 },
        Done { n: u32, stopped: Option<String> },
    }

    #[derive(Debug, PartialEq)]
    enum Ask {
        Tell(u32),
        Note,
    }

    impl Effect for Ask {
        fn write_ahead(&self) -> Option<(&'static str, serde_json::Value)> {
            match self {
                Ask::Tell(n) => Some(("telling", serde_json::json!(n))),
                Ask::Note => None,
            }
        }
    }

    impl Machine for Counter {
        type State = Count;
        type Event = u32;
        type Effect = Ask;

        fn label(state: &Count) -> &'static str {
            match state {
                Count::Counting { .. } => "counting",
                Count::Done { .. } => "done",
            }
        }

        fn step(&self, state: Count, told: u32, _now: u64) -> Transition<Count, Ask> {
            match state {
                Count::Counting { n } if n + told >= 2 => Transition::to(Count::Done {
                    n: n + told,
                    stopped: None,
                }),
                Count::Counting { n } => Transition {
                    next: Count::Counting { n: n + told },
                    effects: vec![Ask::Tell(1), Ask::Note],
                },
                done => Transition::to(done),
            }
        }

        fn stopped_by_the_journal(&self, state: Count, error: &JournalError) -> Count {
            let n = match state {
                Count::Counting { n } | Count::Done { n, .. } => n,
            };
            Count::Done {
                n,
                stopped: Some(error.to_string()),
            }
        }
    }

    fn recorder(journal: &Arc<Journal>) -> Recorder {
        let id = "op".to_string();
        journal.begin(&id, "count", "p", None).unwrap();
        let (tx, _rx) = mpsc::unbounded_channel();
        Recorder::new(id, journal.clone(), tx)
    }

    fn start() -> Transition<Count, Ask> {
        Transition {
            next: Count::Counting { n: 0 },
            effects: vec![Ask::Note, Ask::Tell(1)],
        }
    }

    /// Every state is journaled with its data, every write-ahead before its
    /// effect; an effect answering nothing lets the next run; the queue of
    /// the earlier transition is dropped when a step answers.
    #[tokio::test]
    async fn journals_each_state_and_each_write_ahead_before_acting() {
        let dir = tempfile::tempdir().unwrap();
        let journal = rig::journal(&dir);
        let rec = recorder(&journal);
        let carried = std::sync::Mutex::new(Vec::new());
        let end = run(&Counter, &rec, start(), |a| {
            // The write-ahead of a Tell is in the journal before it is carried out.
            let written = journal.read::<u32>("op", "telling").unwrap().len();
            carried.lock().unwrap().push((format!("{a:?}"), written));
            async move {
                match a {
                    Ask::Tell(n) => Some(n),
                    Ask::Note => None,
                }
            }
        })
        .await;
        assert_eq!(end, Count::Done { n: 2, stopped: None });
        assert_eq!(
            *carried.lock().unwrap(),
            [
                ("Note".to_string(), 0),
                ("Tell(1)".to_string(), 1),
                ("Tell(1)".to_string(), 2)
            ],
            "the Note queued after the second Tell was dropped when the step ended the run"
        );
        assert_eq!(
            journal.last_state::<Count>("op").unwrap(),
            Some(Count::Done { n: 2, stopped: None })
        );
        assert_eq!(journal.history("p", 1).unwrap()[0].state, "done");
    }

    /// A state or write-ahead the journal cannot record stops the run there:
    /// the effect is not carried out, the machine's answer is the end.
    #[tokio::test]
    async fn a_failed_write_stops_the_run_before_the_effect() {
        // Writes: begin 1, state 2, telling 3, state 4, telling 5, state 6.
        for (fail_at, told_before) in [(2, 0), (3, 0), (4, 1), (5, 1), (6, 2)] {
            let dir = tempfile::tempdir().unwrap();
            let journal = rig::journal(&dir);
            let rec = recorder(&journal);
            journal.fail_writes(fail_at..fail_at + 10);
            let mut carried = 0;
            let end = run(&Counter, &rec, start(), |a| {
                if matches!(a, Ask::Tell(_)) {
                    carried += 1;
                }
                async move {
                    match a {
                        Ask::Tell(n) => Some(n),
                        Ask::Note => None,
                    }
                }
            })
            .await;
            let Count::Done { stopped: Some(why), .. } = &end else {
                panic!("write {fail_at}: {end:?}");
            };
            assert!(why.contains("journal"), "{why}");
            assert_eq!(carried, told_before, "write {fail_at}");
        }
    }
}
