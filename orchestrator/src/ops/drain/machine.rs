//! The drain and the rejoin as data (issue 33): where each stands, with
//! what it has found, and one pure step from what the router and the
//! engines answered to what is asked next. The runtime (`ops::machine`)
//! journals each state (as a `drain_state` / `rejoin_state` entry of the
//! co-restart they run inside: the operation's own state stays the
//! co-restart's) and the write-ahead of the removal (`drain_removing`,
//! must-write: a resumed drain reads back what it took out); `super`
//! carries the effects out through the agent port.
//!
//! The rules the steps keep (module docs of `super`): out of rotation only
//! once the router's list no longer shows the pair's engines (its calls are
//! queued); drained when every engine reads idle twice in a row, bounded by
//! `drain_timeout_ms`; back only after the KV paths to the other engines
//! behind the router are proven, and only once the router lists every
//! engine healthy, bounded by `rejoin_timeout_ms`.

use pdwarden_proto::v1::RouterWorker;
use serde::{Deserialize, Serialize};

use super::probes::{KvPath, cross_paths, same_url};
use crate::ops::journal::JournalError;
use crate::ops::machine::{Effect, Machine, Transition};
use pdwarden_model::report::{DrainRecord, PairWorker, RejoinRecord};

/// The journal entry a drain's removal is written ahead as.
pub const DRAIN_REMOVING: &str = "drain_removing";

/// What the drain and the rejoin ask for.
#[derive(Debug, Clone, PartialEq)]
pub enum RouterEffect {
    /// Read the serving router's worker list (`retried`: asked a few times
    /// with backoff, for a router that is restarting or not up yet).
    List { retried: bool },
    /// Take these engines out of its rotation (written ahead, must-write,
    /// even when empty: a resumed drain reads what was taken out).
    Remove(Vec<PairWorker>),
    /// Put the pair's engines back.
    Add(Vec<PairWorker>),
    /// Read the pair's engines' gauges once.
    Scrape,
    /// Probe each of these KV paths through the router's agent.
    ProbePaths(Vec<KvPath>),
    /// Wait `ms` (answers nothing: the next effect follows).
    Sleep { ms: u64 },
}

impl Effect for RouterEffect {
    fn write_ahead(&self) -> Option<(&'static str, serde_json::Value)> {
        match self {
            RouterEffect::Remove(w) => Some((DRAIN_REMOVING, serde_json::to_value(w).ok()?)),
            _ => None,
        }
    }
}

/// What the serving router or its agent answered instead of doing what was
/// asked (their words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RouterRefusal(pub String);

/// What carrying out a [`RouterEffect`] answered.
#[derive(Debug, Clone, PartialEq)]
pub enum RouterEvent {
    Listed(Result<Vec<RouterWorker>, RouterRefusal>),
    /// A removal or an addition went through (or the router refused it).
    Changed(Result<(), RouterRefusal>),
    /// One reading of the engines: what is still in flight, in words
    /// (empty: every engine idle).
    Scraped {
        busy: Vec<String>,
    },
    /// The paths that failed twice, described.
    Probed {
        broken: Vec<String>,
    },
}

/// Where a drain stands; journaled as a `drain_state` entry on change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Drain {
    /// Reading the serving router's worker list.
    Listing { record: DrainRecord },
    /// Taking the pair's listed engines out of rotation.
    Removing {
        removing: Vec<PairWorker>,
        record: DrainRecord,
    },
    /// The removal is queued: out once the list no longer shows them.
    LeavingRotation {
        removing: Vec<PairWorker>,
        deadline_ms: u64,
        record: DrainRecord,
    },
    /// Out; waiting until every engine reads idle twice in a row.
    Draining {
        idle_readings: u32,
        deadline_ms: u64,
        record: DrainRecord,
    },
    /// Over: `record.error` says what could not be done.
    Done { record: DrainRecord },
}

impl Drain {
    pub fn into_record(self) -> DrainRecord {
        match self {
            Drain::Listing { record }
            | Drain::Removing { record, .. }
            | Drain::LeavingRotation { record, .. }
            | Drain::Draining { record, .. }
            | Drain::Done { record } => record,
        }
    }
}

/// A drain of one pair out of its serving router.
pub struct Draining {
    /// The pair's engines as the router should list them.
    pub workers: Vec<PairWorker>,
    /// What this operation took out before an orchestrator restart.
    pub earlier: Vec<PairWorker>,
    /// Wait for the engines' work (not for the recovery of a wedge).
    pub wait: bool,
    pub drain_timeout_ms: u64,
    pub poll_ms: u64,
}

impl Draining {
    /// The drain's first state and what it asks for.
    pub fn start(router: String, wait: bool) -> Transition<Drain, RouterEffect> {
        Transition::then(
            Drain::Listing {
                record: DrainRecord {
                    router,
                    waited: wait,
                    ..Default::default()
                },
            },
            RouterEffect::List { retried: true },
        )
    }

    /// Out of rotation at `now_ms`: drained next, or done.
    fn out(&self, mut record: DrainRecord, now_ms: u64) -> Transition<Drain, RouterEffect> {
        record.out_at_ms = Some(now_ms);
        if self.wait {
            Transition::then(
                Drain::Draining {
                    idle_readings: 0,
                    deadline_ms: now_ms + self.drain_timeout_ms,
                    record,
                },
                RouterEffect::Scrape,
            )
        } else {
            Transition::to(Drain::Done { record })
        }
    }

    fn failed(mut record: DrainRecord, error: String) -> Transition<Drain, RouterEffect> {
        record.error = Some(error);
        Transition::to(Drain::Done { record })
    }

    fn poll(&self, state: Drain, then: RouterEffect) -> Transition<Drain, RouterEffect> {
        Transition {
            next: state,
            effects: vec![RouterEffect::Sleep { ms: self.poll_ms }, then],
        }
    }
}

impl Machine for Draining {
    type State = Drain;
    type Event = RouterEvent;
    type Effect = RouterEffect;
    const STATE_ENTRY: Option<&'static str> = Some("drain_state");

    fn label(state: &Drain) -> &'static str {
        match state {
            Drain::Listing { .. } => "listing",
            Drain::Removing { .. } => "removing",
            Drain::LeavingRotation { .. } => "leaving_rotation",
            Drain::Draining { .. } => "draining",
            Drain::Done { .. } => "done",
        }
    }

    fn step(&self, state: Drain, event: RouterEvent, now_ms: u64) -> Transition<Drain, RouterEffect> {
        match (state, event) {
            (Drain::Listing { record }, RouterEvent::Listed(Err(e))) => {
                Self::failed(record, format!("could not read its worker list: {e}"))
            }
            (Drain::Listing { mut record }, RouterEvent::Listed(Ok(listed))) => {
                let (removing, rest): (Vec<PairWorker>, Vec<PairWorker>) = self
                    .workers
                    .iter()
                    .cloned()
                    .partition(|w| listed.iter().any(|l| same_url(&l.url, &w.url)));
                let (out_before, not_listed): (Vec<PairWorker>, Vec<PairWorker>) = rest
                    .into_iter()
                    .partition(|w| self.earlier.iter().any(|e| same_url(&e.url, &w.url)));
                record.not_listed = not_listed.into_iter().map(|w| w.unit).collect();
                record.removed = removing.clone();
                record.removed.extend(out_before);
                Transition::then(
                    Drain::Removing {
                        removing: removing.clone(),
                        record,
                    },
                    RouterEffect::Remove(removing),
                )
            }
            (Drain::Removing { record, .. }, RouterEvent::Changed(Err(e))) => {
                Self::failed(record, format!("could not take the pair out of its rotation: {e}"))
            }
            (Drain::Removing { removing, record }, RouterEvent::Changed(Ok(()))) => {
                if removing.is_empty() {
                    self.out(record, now_ms)
                } else {
                    Transition::then(
                        Drain::LeavingRotation {
                            removing,
                            deadline_ms: now_ms + self.drain_timeout_ms,
                            record,
                        },
                        RouterEffect::List { retried: false },
                    )
                }
            }
            (
                Drain::LeavingRotation {
                    removing,
                    deadline_ms,
                    record,
                },
                RouterEvent::Listed(listed),
            ) => match listed {
                Ok(l) if !l.iter().any(|l| removing.iter().any(|w| same_url(&w.url, &l.url))) => {
                    self.out(record, now_ms)
                }
                _ if now_ms >= deadline_ms => Self::failed(
                    record,
                    format!(
                        "it still listed the pair's engines {} ms after their removal",
                        self.drain_timeout_ms
                    ),
                ),
                _ => self.poll(
                    Drain::LeavingRotation {
                        removing,
                        deadline_ms,
                        record,
                    },
                    RouterEffect::List { retried: false },
                ),
            },
            (
                Drain::Draining {
                    idle_readings,
                    deadline_ms,
                    mut record,
                },
                RouterEvent::Scraped { busy },
            ) => {
                let idle_readings = if busy.is_empty() { idle_readings + 1 } else { 0 };
                if idle_readings >= 2 {
                    record.drained_at_ms = Some(now_ms);
                    Transition::to(Drain::Done { record })
                } else if now_ms >= deadline_ms {
                    record.timed_out = true;
                    record.in_flight_left = busy;
                    Transition::to(Drain::Done { record })
                } else {
                    self.poll(
                        Drain::Draining {
                            idle_readings,
                            deadline_ms,
                            record,
                        },
                        RouterEffect::Scrape,
                    )
                }
            }
            // An answer this state did not ask for moves nothing.
            (state, _) => Transition::to(state),
        }
    }

    fn stopped_by_the_journal(&self, state: Drain, error: &JournalError) -> Drain {
        let taken_out = removing_of(&state);
        let removing_failed = matches!(state, Drain::Removing { .. });
        let mut record = state.into_record();
        record.error = Some(if removing_failed {
            // Its write-ahead failed: the removal was not sent.
            record.removed.clear();
            format!("the journal could not record what it takes out of rotation ({error}); nothing was taken out")
        } else if taken_out.is_empty() {
            format!("the journal could not record the drain's step ({error}); nothing was taken out")
        } else {
            format!(
                "the journal could not record the drain's step ({error}) after {} were taken out of rotation: left out of the serving router until a healthy restart puts them back",
                taken_out.iter().map(|w| w.unit.as_str()).collect::<Vec<_>>().join(", ")
            )
        });
        Drain::Done { record }
    }
}

/// What a drain in `state` has taken out of rotation.
fn removing_of(state: &Drain) -> Vec<PairWorker> {
    match state {
        Drain::LeavingRotation { removing, .. } => removing.clone(),
        Drain::Draining { record, .. } | Drain::Done { record } => record.removed.clone(),
        Drain::Listing { .. } | Drain::Removing { .. } => Vec::new(),
    }
}

/// Where a rejoin after a healthy verdict stands; journaled as a
/// `rejoin_state` entry on change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Rejoin {
    /// Reading which other engines the router lists.
    ReadingRotation,
    /// Proving the KV paths the router will make to them.
    ProvingPaths { paths_checked: Vec<String> },
    /// Putting the pair's engines back.
    Adding { paths_checked: Vec<String> },
    /// Added: back once the router lists every one of them healthy.
    AwaitingHealthy {
        deadline_ms: u64,
        paths_checked: Vec<String>,
    },
    /// Over.
    Done { record: RejoinRecord },
}

/// Putting a healthy pair back into its serving router.
pub struct Rejoining {
    /// The serving router ("host/unit"), for the record's words.
    pub router: String,
    pub workers: Vec<PairWorker>,
    pub rejoin_timeout_ms: u64,
    pub poll_ms: u64,
}

impl Rejoining {
    pub fn start() -> Transition<Rejoin, RouterEffect> {
        Transition::then(Rejoin::ReadingRotation, RouterEffect::List { retried: false })
    }

    /// Healthy but not back, saying why.
    pub fn failed(&self, detail: &str, paths_checked: Vec<String>) -> RejoinRecord {
        RejoinRecord {
            put_back: false,
            healthy_at_ms: None,
            detail: format!(
                "the pair is healthy but NOT back in the serving router {}: {detail}",
                self.router
            ),
            paths_checked,
        }
    }

    fn done(record: RejoinRecord) -> Transition<Rejoin, RouterEffect> {
        Transition::to(Rejoin::Done { record })
    }
}

impl Machine for Rejoining {
    type State = Rejoin;
    type Event = RouterEvent;
    type Effect = RouterEffect;
    const STATE_ENTRY: Option<&'static str> = Some("rejoin_state");

    fn label(state: &Rejoin) -> &'static str {
        match state {
            Rejoin::ReadingRotation => "reading_rotation",
            Rejoin::ProvingPaths { .. } => "proving_paths",
            Rejoin::Adding { .. } => "adding",
            Rejoin::AwaitingHealthy { .. } => "awaiting_healthy",
            Rejoin::Done { .. } => "done",
        }
    }

    fn step(&self, state: Rejoin, event: RouterEvent, now_ms: u64) -> Transition<Rejoin, RouterEffect> {
        match (state, event) {
            (Rejoin::ReadingRotation, RouterEvent::Listed(Err(e))) => {
                Self::done(self.failed(&format!("could not read its worker list: {e}"), Vec::new()))
            }
            (Rejoin::ReadingRotation, RouterEvent::Listed(Ok(listed))) => {
                // The KV paths the router will create between the pair and
                // the other engines it routes to, checked before any client
                // can take them.
                let others: Vec<RouterWorker> = listed
                    .into_iter()
                    .filter(|l| !self.workers.iter().any(|w| same_url(&w.url, &l.url)))
                    .collect();
                let paths = cross_paths(&self.workers, &others);
                Transition::then(
                    Rejoin::ProvingPaths {
                        paths_checked: paths.iter().map(KvPath::describe).collect(),
                    },
                    RouterEffect::ProbePaths(paths),
                )
            }
            (Rejoin::ProvingPaths { paths_checked }, RouterEvent::Probed { broken }) => {
                if broken.is_empty() {
                    return Transition::then(
                        Rejoin::Adding { paths_checked },
                        RouterEffect::Add(self.workers.clone()),
                    );
                }
                let detail = format!(
                    "the pair is healthy through its own router but KEPT OUT of the serving router {}: {} of the {} KV paths it would share with the other engines there {} ({}). Engines that keep a restarted prefill's old bootstrap identity (sgl-project/sglang#36029) or degrade a restarted decode's bootstrap behind a long-running prefill (INCIDENTS row 1) need every engine behind that router restarted together, prefills first",
                    self.router,
                    broken.len(),
                    paths_checked.len(),
                    if broken.len() == 1 { "fails" } else { "fail" },
                    broken.join("; ")
                );
                Self::done(RejoinRecord {
                    put_back: false,
                    healthy_at_ms: None,
                    detail,
                    paths_checked,
                })
            }
            (Rejoin::Adding { paths_checked }, RouterEvent::Changed(Err(e))) => {
                Self::done(self.failed(&format!("the router refused them: {e}"), paths_checked))
            }
            (Rejoin::Adding { paths_checked }, RouterEvent::Changed(Ok(()))) => Transition::then(
                Rejoin::AwaitingHealthy {
                    deadline_ms: now_ms + self.rejoin_timeout_ms,
                    paths_checked,
                },
                RouterEffect::List { retried: false },
            ),
            (
                Rejoin::AwaitingHealthy {
                    deadline_ms,
                    paths_checked,
                },
                RouterEvent::Listed(listed),
            ) => {
                let last = match listed {
                    Ok(listed) => {
                        let missing: Vec<&str> = self
                            .workers
                            .iter()
                            .filter(|w| !listed.iter().any(|l| same_url(&l.url, &w.url) && l.healthy))
                            .map(|w| w.unit.as_str())
                            .collect();
                        if missing.is_empty() {
                            return Self::done(RejoinRecord {
                                put_back: true,
                                healthy_at_ms: Some(now_ms),
                                paths_checked,
                                detail: format!("back in the serving router {} after the healthy verdict", self.router),
                            });
                        }
                        format!("not listed healthy: {}", missing.join(", "))
                    }
                    Err(e) => e.0,
                };
                if now_ms >= deadline_ms {
                    // (As before: a rejoin that runs out names no paths.)
                    return Self::done(
                        self.failed(&format!("after {} ms, {last}", self.rejoin_timeout_ms), Vec::new()),
                    );
                }
                Transition {
                    next: Rejoin::AwaitingHealthy {
                        deadline_ms,
                        paths_checked,
                    },
                    effects: vec![
                        RouterEffect::Sleep { ms: self.poll_ms },
                        RouterEffect::List { retried: false },
                    ],
                }
            }
            (state, _) => Transition::to(state),
        }
    }

    fn stopped_by_the_journal(&self, state: Rejoin, error: &JournalError) -> Rejoin {
        let (added, paths_checked) = match state {
            Rejoin::AwaitingHealthy { paths_checked, .. } => (true, paths_checked),
            Rejoin::ProvingPaths { paths_checked } | Rejoin::Adding { paths_checked } => (false, paths_checked),
            Rejoin::Done { record } => (record.put_back, record.paths_checked),
            Rejoin::ReadingRotation => (false, Vec::new()),
        };
        let detail = if added {
            format!("the journal could not record the rejoin's step ({error}) after its engines were added back")
        } else {
            format!(
                "the journal could not record the rejoin's step ({error}); its engines were not added back: left out of the serving router until a healthy restart puts them back"
            )
        };
        Rejoin::Done {
            record: self.failed(&detail, paths_checked),
        }
    }
}

/// Every transition of the drain and the rejoin, walked (pure: no journal,
/// no agent).
#[cfg(test)]
mod tests {
    use super::*;

    fn worker(unit: &str, kind: &str) -> PairWorker {
        PairWorker {
            unit: format!("h1/{unit}"),
            url: format!("http://fake/{unit}"),
            worker_type: kind.into(),
            bootstrap_port: if kind == "prefill" { 8998 } else { 0 },
        }
    }

    fn listed(unit: &str, kind: &str, healthy: bool) -> RouterWorker {
        RouterWorker {
            url: format!("http://fake/{unit}/"),
            worker_type: kind.into(),
            bootstrap_port: if kind == "prefill" { 8998 } else { 0 },
            healthy,
            ..Default::default()
        }
    }

    fn draining(wait: bool) -> Draining {
        Draining {
            workers: vec![worker("p0", "prefill"), worker("p1", "prefill"), worker("d0", "decode")],
            earlier: vec![worker("p1", "prefill")],
            wait,
            drain_timeout_ms: 1_000,
            poll_ms: 100,
        }
    }

    fn record() -> DrainRecord {
        DrainRecord {
            router: "h1/r".into(),
            waited: true,
            ..Default::default()
        }
    }

    fn full() -> JournalError {
        JournalError::from(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            Some("full".into()),
        ))
    }

    fn error_of(t: &Transition<Drain, RouterEffect>) -> String {
        match &t.next {
            Drain::Done { record } => record.error.clone().unwrap_or_default(),
            other => panic!("not done: {other:?}"),
        }
    }

    /// Listing: the listed engines are taken out (written ahead), one an
    /// earlier orchestrator took out counts as removed, one never listed is
    /// named; a list that cannot be read ends the drain.
    #[test]
    fn listing_takes_out_what_the_router_lists() {
        let m = draining(true);
        let start = Draining::start("h1/r".into(), true);
        assert_eq!(start.effects, [RouterEffect::List { retried: true }]);
        let t = m.step(
            start.next.clone(),
            RouterEvent::Listed(Err(RouterRefusal("down".into()))),
            5,
        );
        assert_eq!(error_of(&t), "could not read its worker list: down");
        let t = m.step(
            start.next,
            RouterEvent::Listed(Ok(vec![listed("p0", "prefill", true), listed("x", "decode", true)])),
            5,
        );
        let Drain::Removing { removing, record } = &t.next else {
            panic!("{:?}", t.next)
        };
        assert_eq!(removing, &[worker("p0", "prefill")]);
        assert_eq!(record.removed, [worker("p0", "prefill"), worker("p1", "prefill")]);
        assert_eq!(record.not_listed, ["h1/d0"]);
        assert_eq!(t.effects, [RouterEffect::Remove(vec![worker("p0", "prefill")])]);
        let (kind, payload) = t.effects[0].write_ahead().expect("the removal is written ahead");
        assert_eq!(kind, DRAIN_REMOVING);
        assert_eq!(payload[0]["url"], "http://fake/p0");
        assert_eq!(Draining::label(&t.next), "removing");
    }

    /// Removing: refused → done with the error; nothing to remove → out at
    /// once (drained next when waiting, done when not); removed → leaving
    /// rotation until the list no longer shows them.
    #[test]
    fn removing_goes_out_or_waits_for_the_list() {
        let m = draining(true);
        let removing = |w: Vec<PairWorker>| Drain::Removing {
            removing: w,
            record: record(),
        };
        let t = m.step(
            removing(vec![]),
            RouterEvent::Changed(Err(RouterRefusal("409".into()))),
            7,
        );
        assert_eq!(error_of(&t), "could not take the pair out of its rotation: 409");
        let t = m.step(removing(vec![]), RouterEvent::Changed(Ok(())), 7);
        assert!(
            matches!(&t.next, Drain::Draining { idle_readings: 0, deadline_ms: 1_007, record } if record.out_at_ms == Some(7)),
            "{:?}",
            t.next
        );
        assert_eq!(t.effects, [RouterEffect::Scrape]);
        let t = draining(false).step(removing(vec![]), RouterEvent::Changed(Ok(())), 7);
        assert!(matches!(&t.next, Drain::Done { record } if record.out_at_ms == Some(7) && record.error.is_none()));
        assert!(t.effects.is_empty());
        let t = m.step(removing(vec![worker("p0", "prefill")]), RouterEvent::Changed(Ok(())), 7);
        assert!(
            matches!(&t.next, Drain::LeavingRotation { deadline_ms: 1_007, .. }),
            "{:?}",
            t.next
        );
        assert_eq!(t.effects, [RouterEffect::List { retried: false }]);
    }

    /// Leaving rotation: out when the list no longer shows them; still
    /// listed (or unreadable) → poll again until the deadline, then done
    /// with the error.
    #[test]
    fn leaving_rotation_polls_the_list_until_the_deadline() {
        let m = draining(true);
        let state = Drain::LeavingRotation {
            removing: vec![worker("p0", "prefill")],
            deadline_ms: 1_000,
            record: record(),
        };
        let t = m.step(
            state.clone(),
            RouterEvent::Listed(Ok(vec![listed("x", "decode", true)])),
            300,
        );
        assert!(
            matches!(&t.next, Drain::Draining { deadline_ms: 1_300, .. }),
            "{:?}",
            t.next
        );
        let still = RouterEvent::Listed(Ok(vec![listed("p0", "prefill", true)]));
        let t = m.step(state.clone(), still.clone(), 300);
        assert_eq!(t.next, state);
        assert_eq!(
            t.effects,
            [RouterEffect::Sleep { ms: 100 }, RouterEffect::List { retried: false }]
        );
        let t = m.step(
            state.clone(),
            RouterEvent::Listed(Err(RouterRefusal("timeout".into()))),
            300,
        );
        assert_eq!(t.next, state);
        let t = m.step(state, still, 1_000);
        assert_eq!(
            error_of(&t),
            "it still listed the pair's engines 1000 ms after their removal"
        );
    }

    /// Draining: idle twice in a row → drained; a busy reading starts the
    /// count again; past the deadline → timed out, naming what is in flight.
    #[test]
    fn draining_needs_two_idle_readings_in_a_row() {
        let m = draining(true);
        let at = |idle_readings| Drain::Draining {
            idle_readings,
            deadline_ms: 1_000,
            record: record(),
        };
        let idle = || RouterEvent::Scraped { busy: vec![] };
        let busy = || RouterEvent::Scraped {
            busy: vec!["h1/d0: 1 in flight".into()],
        };
        let t = m.step(at(0), idle(), 100);
        assert_eq!(t.next, at(1));
        assert_eq!(t.effects, [RouterEffect::Sleep { ms: 100 }, RouterEffect::Scrape]);
        let t = m.step(at(1), busy(), 200);
        assert_eq!(t.next, at(0));
        let t = m.step(at(1), idle(), 300);
        assert!(matches!(&t.next, Drain::Done { record } if record.drained_at_ms == Some(300) && !record.timed_out));
        let t = m.step(at(0), busy(), 1_000);
        assert!(
            matches!(&t.next, Drain::Done { record } if record.timed_out && record.in_flight_left == ["h1/d0: 1 in flight"]),
            "{:?}",
            t.next
        );
        // An answer the state did not ask for moves nothing.
        let t = m.step(at(1), RouterEvent::Changed(Ok(())), 5);
        assert_eq!((t.next, t.effects), (at(1), vec![]));
    }

    /// The journal failing: before the removal is sent nothing is out;
    /// after, the engines taken out are named as left out.
    #[test]
    fn a_drain_stopped_by_the_journal_says_what_is_out() {
        let m = draining(true);
        let mut rec = record();
        rec.removed = vec![worker("p0", "prefill")];
        let Drain::Done { record: r } = m.stopped_by_the_journal(
            Drain::Removing {
                removing: vec![worker("p0", "prefill")],
                record: rec.clone(),
            },
            &full(),
        ) else {
            panic!("done")
        };
        assert!(r.removed.is_empty());
        let e = r.error.unwrap();
        assert!(
            e.starts_with("the journal could not record what it takes out of rotation (")
                && e.ends_with("nothing was taken out"),
            "{e}"
        );
        let Drain::Done { record: r } = m.stopped_by_the_journal(Drain::Listing { record: record() }, &full()) else {
            panic!("done")
        };
        assert!(r.error.unwrap().ends_with("; nothing was taken out"));
        let Drain::Done { record: r } = m.stopped_by_the_journal(
            Drain::LeavingRotation {
                removing: vec![worker("p0", "prefill")],
                deadline_ms: 1,
                record: rec,
            },
            &full(),
        ) else {
            panic!("done")
        };
        assert!(
            r.error
                .unwrap()
                .contains("after h1/p0 were taken out of rotation: left out of the serving router")
        );
    }

    fn rejoining() -> Rejoining {
        Rejoining {
            router: "h1/r".into(),
            workers: vec![worker("p0", "prefill"), worker("d0", "decode")],
            rejoin_timeout_ms: 1_000,
            poll_ms: 100,
        }
    }

    fn record_of(t: &Transition<Rejoin, RouterEffect>) -> RejoinRecord {
        match &t.next {
            Rejoin::Done { record } => record.clone(),
            other => panic!("not done: {other:?}"),
        }
    }

    /// The rejoin: the other engines' KV paths proven, then added, then
    /// back once every engine is listed healthy; each failure keeps the
    /// pair out, saying why.
    #[test]
    fn the_rejoin_proves_paths_adds_and_waits_for_healthy() {
        let m = rejoining();
        let start = Rejoining::start();
        assert_eq!(start.effects, [RouterEffect::List { retried: false }]);
        let t = m.step(
            start.next.clone(),
            RouterEvent::Listed(Err(RouterRefusal("down".into()))),
            1,
        );
        assert_eq!(
            record_of(&t).detail,
            "the pair is healthy but NOT back in the serving router h1/r: could not read its worker list: down"
        );
        let t = m.step(
            start.next,
            RouterEvent::Listed(Ok(vec![listed("p0", "prefill", true), listed("d9", "decode", true)])),
            1,
        );
        // Ours are not "others"; p0 → d9 is the one path the router would make.
        assert_eq!(
            t.next,
            Rejoin::ProvingPaths {
                paths_checked: vec!["http://fake/p0 → http://fake/d9/".into()]
            }
        );
        assert!(matches!(&t.effects[..], [RouterEffect::ProbePaths(p)] if p.len() == 1));
        let proving = t.next;
        let t = m.step(
            proving.clone(),
            RouterEvent::Probed {
                broken: vec!["p0 → d9: timeout".into()],
            },
            2,
        );
        let r = record_of(&t);
        assert!(!r.put_back && r.detail.contains("KEPT OUT of the serving router h1/r: 1 of the 1 KV paths it would share with the other engines there fails (p0 → d9: timeout)"), "{}", r.detail);
        let t = m.step(proving, RouterEvent::Probed { broken: vec![] }, 2);
        assert!(matches!(&t.next, Rejoin::Adding { .. }));
        assert_eq!(t.effects, [RouterEffect::Add(rejoining().workers)]);
        let adding = t.next;
        let t = m.step(
            adding.clone(),
            RouterEvent::Changed(Err(RouterRefusal("403".into()))),
            3,
        );
        assert!(record_of(&t).detail.ends_with("the router refused them: 403"));
        let t = m.step(adding, RouterEvent::Changed(Ok(())), 3);
        assert!(
            matches!(&t.next, Rejoin::AwaitingHealthy { deadline_ms: 1_003, .. }),
            "{:?}",
            t.next
        );
        let waiting = t.next;
        let half = RouterEvent::Listed(Ok(vec![listed("p0", "prefill", true), listed("d0", "decode", false)]));
        let t = m.step(waiting.clone(), half.clone(), 500);
        assert_eq!(t.next, waiting);
        assert_eq!(
            t.effects,
            [RouterEffect::Sleep { ms: 100 }, RouterEffect::List { retried: false }]
        );
        let t = m.step(waiting.clone(), half, 1_003);
        assert!(
            record_of(&t)
                .detail
                .ends_with("after 1000 ms, not listed healthy: h1/d0"),
            "{:?}",
            t.next
        );
        let t = m.step(
            waiting.clone(),
            RouterEvent::Listed(Err(RouterRefusal("gone".into()))),
            1_003,
        );
        assert!(record_of(&t).detail.ends_with("after 1000 ms, gone"));
        let t = m.step(
            waiting.clone(),
            RouterEvent::Listed(Ok(vec![listed("p0", "prefill", true), listed("d0", "decode", true)])),
            600,
        );
        let r = record_of(&t);
        assert!(r.put_back && r.healthy_at_ms == Some(600), "{r:?}");
        assert_eq!(r.paths_checked, ["http://fake/p0 → http://fake/d9/"]);
        assert_eq!(Rejoining::label(&t.next), "done");
        // Stray answers move nothing; the journal failing says whether the
        // engines were added back.
        let t = m.step(waiting.clone(), RouterEvent::Scraped { busy: vec![] }, 5);
        assert_eq!(t.next, waiting);
        let Rejoin::Done { record } = m.stopped_by_the_journal(waiting, &full()) else {
            panic!("done")
        };
        assert!(
            record.detail.contains("after its engines were added back"),
            "{}",
            record.detail
        );
        let Rejoin::Done { record } = m.stopped_by_the_journal(Rejoin::ReadingRotation, &full()) else {
            panic!("done")
        };
        assert!(
            record
                .detail
                .contains("its engines were not added back: left out of the serving router")
        );
    }
}
