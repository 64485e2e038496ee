//! The co-restart's order as data (issue 14; INCIDENTS rows 1–2, DESIGN.md
//! 3): which step the operation is in, the starts each step has sent and
//! how far each has got, and one pure function from that and the units'
//! latest progress to the next state and the starts to send.
//!
//! The driver (`super`) does the I/O around it: it journals each state the
//! machine enters — with the command ids of the starts that state sends —
//! before it sends them, sends them (or re-attaches to a start the killed
//! orchestrator had sent), folds the agents' reports into each start's
//! progress and hands the machine the new picture. The machine never
//! starts a decode before every prefill generates (or, under `overlap`,
//! has spawned), never a router before every engine the operation started
//! generates, and stops the order at the first step whose units did not
//! all get there, once all of them are over: nothing after a unit that is
//! not generating is started.

use serde::{Deserialize, Serialize};

use super::CoRestartStep;
use crate::config::{DecodeStartPolicy, PairConfig, UnitRef};

/// A unit's part in the pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Prefill,
    Decode,
    Router,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Router => "router",
        }
    }
}

/// How far one start has got, as far as the order is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Progress {
    /// Sent; the new process is not known to be up yet.
    UnderWay,
    /// The new process was spawned and the agent acknowledged the start;
    /// it does not generate yet.
    Spawned,
    /// A generation check passed.
    Generating,
    /// Over without generating (exited, not ready by its deadline, refused,
    /// lost contact). `spawned`: its process had been spawned (and the
    /// start acknowledged) — under `overlap` decode may follow such a
    /// prefill, and the decode step then finds it failed.
    Failed { spawned: bool },
}

impl Progress {
    fn is_over(self) -> bool {
        matches!(self, Progress::Generating | Progress::Failed { .. })
    }

    fn spawned(self) -> bool {
        matches!(
            self,
            Progress::Spawned | Progress::Generating | Progress::Failed { spawned: true }
        )
    }
}

/// One start this operation sent (or adopted), as the machine keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitFacts {
    pub unit: UnitRef,
    pub role: Role,
    pub command_id: String,
    pub progress: Progress,
}

/// Where a co-restart is. Each variant carries the starts it is waiting
/// on; the state is journaled (serde) on entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum CoRestart {
    /// Prefill's starts sent; waiting until they generate (`overlap`: until
    /// they have spawned).
    StartingPrefill { prefill: Vec<UnitFacts> },
    /// Decode's starts sent; waiting until every engine this operation
    /// started generates (under `overlap`, prefill too).
    StartingDecode {
        prefill: Vec<UnitFacts>,
        decode: Vec<UnitFacts>,
    },
    /// The router's starts sent; waiting for a generation through each.
    StartingRouter {
        engines: Vec<UnitFacts>,
        router: Vec<UnitFacts>,
    },
    /// Every start generates; the probe series runs through the router.
    Probing { started: Vec<UnitFacts> },
    /// The order is over: after the probes, or stopped at the step whose
    /// units did not all generate (`stopped_at`, with the units that did not).
    Concluded {
        started: Vec<UnitFacts>,
        stopped_at: Option<Stopped>,
    },
}

/// Why the order stopped before the probes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stopped {
    /// The step whose units did not all get there.
    pub step: String,
    /// Those units ("host/unit").
    pub units: Vec<String>,
}

/// A start the driver is to send (its command id is in the state).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    pub unit: UnitRef,
    pub role: Role,
    pub command_id: String,
}

/// What the machine did with the latest picture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Still waiting on the same starts (their progress recorded).
    Stay(CoRestart),
    /// A new state: journal it, then send `starts`.
    Enter { next: CoRestart, starts: Vec<Start> },
}

impl CoRestart {
    /// The journal's label of the state (`history`, the resume point of an
    /// operation journaled before states were typed).
    pub fn step(&self) -> CoRestartStep {
        match self {
            CoRestart::StartingPrefill { .. } => CoRestartStep::RestartingPrefill,
            CoRestart::StartingDecode { .. } => CoRestartStep::RestartingDecode,
            CoRestart::StartingRouter { .. } => CoRestartStep::RestartingRouter,
            CoRestart::Probing { .. } => CoRestartStep::Probing,
            CoRestart::Concluded { .. } => CoRestartStep::Concluded,
        }
    }

    /// Every start of this state, in the order sent.
    pub fn units(&self) -> Vec<&UnitFacts> {
        match self {
            CoRestart::StartingPrefill { prefill } => prefill.iter().collect(),
            CoRestart::StartingDecode { prefill, decode } => prefill.iter().chain(decode).collect(),
            CoRestart::StartingRouter { engines, router } => engines.iter().chain(router).collect(),
            CoRestart::Probing { started } | CoRestart::Concluded { started, .. } => started.iter().collect(),
        }
    }

    fn units_mut(&mut self) -> Vec<&mut UnitFacts> {
        match self {
            CoRestart::StartingPrefill { prefill } => prefill.iter_mut().collect(),
            CoRestart::StartingDecode { prefill, decode } => prefill.iter_mut().chain(decode.iter_mut()).collect(),
            CoRestart::StartingRouter { engines, router } => engines.iter_mut().chain(router.iter_mut()).collect(),
            CoRestart::Probing { started } | CoRestart::Concluded { started, .. } => started.iter_mut().collect(),
        }
    }

    /// The first state of a co-restart that begins at `from` (a resume may
    /// begin past prefill or decode, whose units then generate by their
    /// agents' facts and are not this operation's starts). `ids` names the
    /// command of each start: a fresh id, or the one a killed orchestrator
    /// had sent for it (adopted, never sent as a new start).
    pub fn begin(pair: &PairConfig, from: CoRestartStep, ids: &mut impl FnMut(&UnitRef) -> String) -> Step {
        use CoRestartStep as S;
        match from {
            S::Started | S::Capturing | S::Draining | S::RestartingPrefill => {
                let prefill = starts(&pair.prefill, Role::Prefill, ids);
                enter(CoRestart::StartingPrefill { prefill }, Role::Prefill)
            }
            S::RestartingDecode => {
                let decode = starts(&pair.decode, Role::Decode, ids);
                enter(
                    CoRestart::StartingDecode {
                        prefill: Vec::new(),
                        decode,
                    },
                    Role::Decode,
                )
            }
            S::RestartingRouter => {
                let router = starts(&pair.router, Role::Router, ids);
                enter(
                    CoRestart::StartingRouter {
                        engines: Vec::new(),
                        router,
                    },
                    Role::Router,
                )
            }
            S::Probing | S::Verifying | S::Rejoining => Step::Enter {
                next: CoRestart::Probing { started: Vec::new() },
                starts: Vec::new(),
            },
            S::Concluded => Step::Enter {
                next: CoRestart::Concluded {
                    started: Vec::new(),
                    stopped_at: None,
                },
                starts: Vec::new(),
            },
        }
    }

    /// Records each start's latest progress (`progress` by command id) and
    /// decides: stay, or enter the next state with the starts it sends.
    /// Pure.
    pub fn advance(
        mut self,
        pair: &PairConfig,
        progress: impl Fn(&str) -> Progress,
        ids: &mut impl FnMut(&UnitRef) -> String,
    ) -> Step {
        for u in self.units_mut() {
            u.progress = progress(&u.command_id);
        }
        match self {
            CoRestart::StartingPrefill { prefill } => {
                let gate: fn(Progress) -> bool = match pair.decode_start_policy {
                    DecodeStartPolicy::AfterPrefillReady => |p| p == Progress::Generating,
                    DecodeStartPolicy::Overlap => Progress::spawned,
                };
                let settled = |p: Progress| p.is_over() || gate(p);
                if !prefill.iter().all(|u| settled(u.progress)) {
                    return Step::Stay(CoRestart::StartingPrefill { prefill });
                }
                if prefill.iter().all(|u| gate(u.progress)) {
                    let decode = starts(&pair.decode, Role::Decode, ids);
                    enter(CoRestart::StartingDecode { prefill, decode }, Role::Decode)
                } else {
                    stop("restarting_prefill", prefill, gate)
                }
            }
            CoRestart::StartingDecode { prefill, decode } => {
                let all: Vec<&UnitFacts> = prefill.iter().chain(&decode).collect();
                if !all.iter().all(|u| u.progress.is_over()) {
                    return Step::Stay(CoRestart::StartingDecode { prefill, decode });
                }
                let mut engines = prefill;
                engines.extend(decode);
                if engines.iter().all(|u| u.progress == Progress::Generating) {
                    let router = starts(&pair.router, Role::Router, ids);
                    enter(CoRestart::StartingRouter { engines, router }, Role::Router)
                } else {
                    stop("restarting_decode", engines, |p| p == Progress::Generating)
                }
            }
            CoRestart::StartingRouter { engines, router } => {
                if !router.iter().all(|u| u.progress.is_over()) {
                    return Step::Stay(CoRestart::StartingRouter { engines, router });
                }
                let generating = router.iter().all(|u| u.progress == Progress::Generating);
                let mut started = engines;
                started.extend(router);
                if generating {
                    Step::Enter {
                        next: CoRestart::Probing { started },
                        starts: Vec::new(),
                    }
                } else {
                    stop("restarting_router", started, |p| p == Progress::Generating)
                }
            }
            // The probe series is the driver's; it ends with `probed`.
            state @ (CoRestart::Probing { .. } | CoRestart::Concluded { .. }) => Step::Stay(state),
        }
    }

    /// The probe series has run: the order is over.
    pub fn probed(self) -> CoRestart {
        match self {
            CoRestart::Probing { started } => CoRestart::Concluded {
                started,
                stopped_at: None,
            },
            other => other,
        }
    }
}

fn starts(units: &[UnitRef], role: Role, ids: &mut impl FnMut(&UnitRef) -> String) -> Vec<UnitFacts> {
    units
        .iter()
        .map(|u| UnitFacts {
            unit: u.clone(),
            role,
            command_id: ids(u),
            progress: Progress::UnderWay,
        })
        .collect()
}

/// Enters `next`, sending the starts of `role` it carries.
fn enter(next: CoRestart, role: Role) -> Step {
    let starts = next
        .units()
        .into_iter()
        .filter(|u| u.role == role && u.progress == Progress::UnderWay)
        .map(|u| Start {
            unit: u.unit.clone(),
            role: u.role,
            command_id: u.command_id.clone(),
        })
        .collect();
    Step::Enter { next, starts }
}

/// The order stops at `step`: the units that did not get there are named.
fn stop(step: &str, started: Vec<UnitFacts>, got_there: impl Fn(Progress) -> bool) -> Step {
    let units = started
        .iter()
        .filter(|u| !got_there(u.progress))
        .map(|u| u.unit.to_string())
        .collect();
    Step::Enter {
        next: CoRestart::Concluded {
            started,
            stopped_at: Some(Stopped {
                step: step.into(),
                units,
            }),
        },
        starts: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn pair(policy: &str) -> PairConfig {
        crate::ops::fake_agent::rig::pair(policy, "")
    }

    /// Fresh ids "c1", "c2", … in the order asked.
    fn ids() -> impl FnMut(&UnitRef) -> String {
        let mut n = 0;
        move |_| {
            n += 1;
            format!("c{n}")
        }
    }

    fn entered(step: Step) -> (CoRestart, Vec<Start>) {
        match step {
            Step::Enter { next, starts } => (next, starts),
            Step::Stay(s) => panic!("stayed in {s:?}"),
        }
    }

    fn stayed(step: Step) -> CoRestart {
        match step {
            Step::Stay(s) => s,
            Step::Enter { next, .. } => panic!("entered {next:?}"),
        }
    }

    fn names(starts: &[Start]) -> Vec<&str> {
        starts.iter().map(|s| s.unit.unit.as_str()).collect()
    }

    /// after-prefill-ready: decode only once prefill generates, the router
    /// only once decode does; then the probes.
    #[test]
    fn the_order_waits_for_generation_at_each_step() {
        let pair = pair("after-prefill-ready");
        let mut ids = ids();
        let (s, starts) = entered(CoRestart::begin(&pair, CoRestartStep::Started, &mut ids));
        assert_eq!(names(&starts), ["prefill-0"]);
        let mut p: HashMap<&str, Progress> = HashMap::from([("c1", Progress::Spawned)]);
        let s = stayed(s.advance(&pair, |id| p[id], &mut ids));
        p.insert("c1", Progress::Generating);
        let (s, starts) = entered(s.advance(&pair, |id| p[id], &mut ids));
        assert_eq!(names(&starts), ["decode-0"]);
        assert_eq!(s.step(), CoRestartStep::RestartingDecode);
        p.insert("c2", Progress::Spawned);
        let s = stayed(s.advance(&pair, |id| p[id], &mut ids));
        p.insert("c2", Progress::Generating);
        let (s, starts) = entered(s.advance(&pair, |id| p[id], &mut ids));
        assert_eq!(names(&starts), ["router-0"]);
        p.insert("c3", Progress::Generating);
        let (s, starts) = entered(s.advance(&pair, |id| p[id], &mut ids));
        assert!(starts.is_empty());
        assert_eq!(s.step(), CoRestartStep::Probing);
        assert!(matches!(s.probed(), CoRestart::Concluded { stopped_at: None, .. }));
    }

    /// A decode that exits stops the order: the router is never started,
    /// and the state names the unit.
    #[test]
    fn a_decode_that_does_not_generate_stops_the_order_before_the_router() {
        let pair = pair("after-prefill-ready");
        let mut ids = ids();
        let (s, _) = entered(CoRestart::begin(&pair, CoRestartStep::RestartingDecode, &mut ids));
        let (s, starts) = entered(s.advance(&pair, |_| Progress::Failed { spawned: true }, &mut ids));
        assert!(starts.is_empty(), "nothing started after a failed decode");
        match s {
            CoRestart::Concluded {
                stopped_at: Some(stop), ..
            } => {
                assert_eq!(stop.step, "restarting_decode");
                assert_eq!(stop.units, ["h1/decode-0"]);
            }
            other => panic!("{other:?}"),
        }
    }

    /// overlap: decode follows a spawned prefill; the router still waits
    /// until both generate, and a prefill that then fails stops the order.
    #[test]
    fn overlap_starts_decode_at_spawn_but_the_router_waits_for_both() {
        let pair = pair("overlap");
        let mut ids = ids();
        let (s, _) = entered(CoRestart::begin(&pair, CoRestartStep::Started, &mut ids));
        let mut p: HashMap<&str, Progress> = HashMap::from([("c1", Progress::UnderWay)]);
        let s = stayed(s.advance(&pair, |id| p[id], &mut ids));
        p.insert("c1", Progress::Spawned);
        let (s, starts) = entered(s.advance(&pair, |id| p[id], &mut ids));
        assert_eq!(names(&starts), ["decode-0"]);
        p.insert("c2", Progress::Generating);
        let s = stayed(s.advance(&pair, |id| p[id], &mut ids));
        p.insert("c1", Progress::Failed { spawned: true });
        let (s, starts) = entered(s.advance(&pair, |id| p[id], &mut ids));
        assert!(starts.is_empty());
        assert!(
            matches!(&s, CoRestart::Concluded { stopped_at: Some(st), .. } if st.units == ["h1/prefill-0"]),
            "{s:?}"
        );
    }

    /// One prefill failing while another still loads: the order waits for
    /// the other to be over (its evidence), then stops.
    #[test]
    fn the_order_stops_only_once_every_unit_of_the_step_is_over() {
        let mut pair = pair("after-prefill-ready");
        pair.prefill.push(UnitRef::new("h1", "prefill-1"));
        let mut ids = ids();
        let (s, starts) = entered(CoRestart::begin(&pair, CoRestartStep::Started, &mut ids));
        assert_eq!(names(&starts), ["prefill-0", "prefill-1"]);
        let mut p: HashMap<&str, Progress> =
            HashMap::from([("c1", Progress::Failed { spawned: false }), ("c2", Progress::Spawned)]);
        let s = stayed(s.advance(&pair, |id| p[id], &mut ids));
        p.insert("c2", Progress::Generating);
        let (s, starts) = entered(s.advance(&pair, |id| p[id], &mut ids));
        assert!(starts.is_empty());
        assert_eq!(s.step(), CoRestartStep::Concluded);
    }

    /// The state survives the journal: what a resume reads back is what was
    /// entered, command ids included.
    #[test]
    fn a_state_round_trips_through_the_journal_encoding() {
        let pair = pair("after-prefill-ready");
        let (s, _) = entered(CoRestart::begin(&pair, CoRestartStep::Started, &mut ids()));
        let text = serde_json::to_string(&s).unwrap();
        assert!(text.contains("\"state\":\"starting_prefill\""), "{text}");
        assert_eq!(serde_json::from_str::<CoRestart>(&text).unwrap(), s);
    }

    /// An adopted start keeps its command id: the machine sends it again
    /// under that id (the agent answers without starting twice).
    #[test]
    fn adopted_starts_keep_their_command_ids() {
        let pair = pair("after-prefill-ready");
        let mut ids = |u: &UnitRef| {
            if u.unit == "decode-0" {
                "killed-orchestrators-start".to_string()
            } else {
                "fresh".to_string()
            }
        };
        let (_, starts) = entered(CoRestart::begin(&pair, CoRestartStep::RestartingDecode, &mut ids));
        assert_eq!(starts[0].command_id, "killed-orchestrators-start");
    }
}
