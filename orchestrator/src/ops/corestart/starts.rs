//! The starts of the order: each unit's start sent (its write-ahead first,
//! DESIGN.md 17) or adopted after an orchestrator restart, followed through
//! its agent's reports (re-attached when the link breaks), and handed to
//! the order's machine (`machine`) as progress.

use super::*;

/// One unit's start within the operation, and what has been heard of it.
pub(super) struct UnitStart {
    pub(super) unit: UnitRef,
    pub(super) role: &'static str,
    pub(super) command_id: String,
    /// The start command went to the agent (or was adopted): false when it
    /// could not be journaled first, or the send failed.
    pub(super) sent: bool,
    /// When the start command was sent, in operation ms. Agent times are
    /// relative to receipt of the command (DESIGN.md 5); on one host the
    /// transit is negligible, across hosts it is the one-way delay.
    pub(super) sent_at_ms: u64,
    pub(super) step_idx: usize,
    pub(super) rx: Option<mpsc::UnboundedReceiver<AgentReport>>,
    pub(super) deadline: Instant,
    pub(super) state: StartState,
    /// The agent acknowledged the command (its `CommandResult`).
    pub(super) acked: bool,
    pub(super) furthest: Option<ReadinessPhase>,
    pub(super) last_detail: String,
    /// Every generation check of this start-up, in order (DESIGN.md 10).
    pub(super) generation_attempts: Vec<AttemptRecord>,
    /// What the agent said it spawned (its `spawned` event).
    pub(super) config_fingerprint: String,
    /// The start command itself, re-sent (same id: never executed twice)
    /// when its agent re-attaches after a broken link.
    pub(super) command: Command,
    /// How many times this start was followed again after its agent's
    /// link broke (bounded by [`MAX_REATTACH`]).
    pub(super) reattached: u32,
}

/// How long a step waits for its agent to re-attach after its link broke
/// before calling the contact lost (issue 16, finding 6): the agent's
/// reconnect backoff is at most 5 s; an orchestrator paused (SIGSTOP) for a
/// while finds every link broken when it resumes and the agents already
/// dialling in again. The resume of an interrupted operation gives them
/// `resume_grace_ms` (default 15 s); a running step gives the same.
pub const REATTACH_GRACE: Duration = Duration::from_secs(15);

/// A start whose link keeps breaking is given up after this many re-attachments.
pub const MAX_REATTACH: u32 = 5;

/// Where one unit's start stands, by its agent's reports: `Sent` and
/// `Spawned` are under way, every other state is over. (It replaced seven
/// booleans whose combinations nobody could name.)
#[derive(Debug, Clone, PartialEq)]
pub(super) enum StartState {
    /// Sent: the agent is stopping the old instance, or spawning (events
    /// before `spawned` belong to the old instance).
    Sent,
    /// The new process exists; its readiness is being watched.
    Spawned,
    /// A generation check passed.
    Generating(PassedCheck),
    /// Adopted after an orchestrator restart, already generating: its check
    /// happened before, unseen by this orchestrator.
    GeneratingBefore,
    /// The new process exited.
    Exited,
    /// The agent gave up on readiness at its deadline.
    NotReady,
    /// The agent's stream ended before the start was over.
    LostContact { after_spawn: bool },
    /// Not sent (agent unreachable), refused by the agent, or no word by
    /// the deadline.
    Failed { after_spawn: bool },
}

/// The generation check that made a unit `generating`.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PassedCheck {
    pub(super) latency_ms: u64,
    pub(super) tokens: u32,
    /// The version the engine reported ("" if none).
    pub(super) engine_version: String,
}

impl StartState {
    pub(super) fn is_over(&self) -> bool {
        !matches!(self, Self::Sent | Self::Spawned)
    }

    pub(super) fn generating(&self) -> bool {
        matches!(self, Self::Generating(_) | Self::GeneratingBefore)
    }

    /// The new process was spawned (whatever happened since).
    pub(super) fn spawned(&self) -> bool {
        match self {
            Self::Sent => false,
            Self::LostContact { after_spawn } | Self::Failed { after_spawn } => *after_spawn,
            _ => true,
        }
    }
}

impl UnitStart {
    pub(super) fn evidence(&self, now_ms: u64) -> UnitStartup {
        UnitStartup {
            unit: self.unit.unit.clone(),
            role: self.role.into(),
            furthest: self.furthest,
            exited: self.state == StartState::Exited,
            lost_contact: matches!(self.state, StartState::LostContact { .. }),
            last_detail: self.last_detail.clone(),
            waited_ms: now_ms.saturating_sub(self.sent_at_ms),
            // The router's failed generations are probes of the series instead.
            failed_checks: if self.role == "router" {
                Vec::new()
            } else {
                self.failed_checks()
            },
        }
    }

    /// Generation checks that timed out or failed before the unit generated.
    pub(super) fn failed_checks(&self) -> Vec<FailedCheck> {
        self.generation_attempts
            .iter()
            .filter(|a| a.outcome != "ok")
            .map(|a| FailedCheck {
                seq: a.seq,
                timed_out: a.outcome == "timeout",
                latency_ms: a.latency_ms,
                detail: a.detail.clone(),
            })
            .collect()
    }

    pub(super) fn outcome(&self) -> String {
        if self.state.generating() {
            "generating".into()
        } else if self.state == StartState::Exited {
            format!("exited: {}", self.last_detail)
        } else {
            format!("not ready: {}", self.last_detail)
        }
    }
}

impl CoRestart<'_> {
    /// The order, driven: the pure [`machine::CoRestart`] decides; here each
    /// state it enters is journaled (typed, with the command ids of the
    /// starts it sends) before those starts go out, the starts are sent (or
    /// adopted from a killed orchestrator by their ids), and each report
    /// from the agents is folded into its start's progress and handed back
    /// to the machine, until it concludes. The probe series runs in
    /// `Probing`; a step whose units did not all generate concludes with the
    /// evidence gathered so far, nothing after it started.
    pub(super) async fn drive(&mut self, from: CoRestartStep) -> Result<(), crate::ops::journal::JournalError> {
        // Starts a killed orchestrator had sent, by unit: their ids again.
        let adopted: BTreeMap<String, String> = self
            .adopt
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(u, a)| (u.clone(), a.command_id.clone()))
            .collect();
        let mut ids = |u: &UnitRef| {
            adopted
                .get(&u.to_string())
                .cloned()
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
        };
        let mut step = machine::CoRestart::begin(&self.pair, from, &mut ids);
        loop {
            let (mut state, starts) = match step {
                Step::Enter { next, starts } => (next, starts),
                Step::Stay(state) => (state, Vec::new()),
            };
            if let machine::CoRestart::Concluded { .. } = state {
                // Journaled with the verdict, after the suite.
                self.order = Some(state);
                return self.unjournaled.take().map_or(Ok(()), Err);
            }
            self.rec.enter(&state)?;
            for start in &starts {
                // A write-ahead that failed stops the order as a failed
                // start does: this one and the rest are over, not sent, and
                // the machine concludes once the starts already sent are.
                let s = match &self.unjournaled {
                    Some(e) => self.not_sent(
                        start,
                        format!("not started: an earlier start could not be journaled first ({e})"),
                    ),
                    None => {
                        let readiness = self.readiness(start.role);
                        match self.start_unit(start, readiness).await {
                            Ok(s) => s,
                            Err((s, e)) => {
                                self.unjournaled = Some(e);
                                s
                            }
                        }
                    }
                };
                self.starts.push(s);
            }
            if let machine::CoRestart::Probing { .. } = state {
                // The router layer's window begins with pdwarden's own
                // verification (issue 47): what a router restarted here
                // counted while it came up is its start-up's, said apart.
                if self.routers_at_verification.is_none() {
                    self.routers_at_verification = Some(self.scrape_routers().await);
                }
                self.probe().await;
                step = Step::Enter {
                    next: state.probed(),
                    starts: Vec::new(),
                };
                continue;
            }
            step = loop {
                match state.advance(&self.pair, |id| self.progress(id), &mut ids) {
                    Step::Stay(same) => {
                        state = same;
                        self.next_change().await;
                    }
                    moved => break moved,
                }
            };
        }
    }

    /// How far the start `command_id` has got, for the machine.
    pub(super) fn progress(&self, command_id: &str) -> Progress {
        let Some(s) = self.starts.iter().find(|s| s.command_id == command_id) else {
            return Progress::UnderWay;
        };
        let spawned = s.acked && s.state.spawned();
        if s.state.generating() {
            Progress::Generating
        } else if s.state.is_over() {
            Progress::Failed { spawned }
        } else if spawned {
            Progress::Spawned
        } else {
            Progress::UnderWay
        }
    }

    /// Waits for the next report on any start still under way (or its
    /// deadline), and applies it.
    pub(super) async fn next_change(&mut self) {
        let rec = self.rec;
        let agents = &*self.ctx.agents;
        let waiting: Vec<_> = self
            .starts
            .iter_mut()
            .filter(|s| !s.state.is_over())
            .map(|s| Box::pin(next_report(rec, agents, s)))
            .collect();
        if !waiting.is_empty() {
            futures::future::select_all(waiting).await;
        }
    }

    /// What a start of `role` waits for: the engines' own generation check
    /// within their ready deadline; the router's readiness is a
    /// probe-tagged generation through it — also probe 1 of the series (the
    /// first generation after the start, the one a cold start slows), so
    /// its timeout is the probe timeout.
    pub(super) fn readiness(&self, role: machine::Role) -> ReadinessSpec {
        let t = &self.pair.timeouts;
        match role {
            machine::Role::Prefill => self.engine_readiness(t.prefill_ready_ms),
            machine::Role::Decode => self.engine_readiness(t.decode_ready_ms),
            machine::Role::Router => ReadinessSpec {
                deadline_ms: t.router_ready_ms.saturating_add(self.pair.probe.probe_timeout_ms),
                poll_interval_ms: t.poll_interval_ms,
                check_timeout_ms: self.pair.probe.probe_timeout_ms,
                chat: Some(self.chat_probe()),
            },
        }
    }

    pub(super) fn engine_readiness(&self, deadline_ms: u64) -> ReadinessSpec {
        let t = &self.pair.timeouts;
        ReadinessSpec {
            deadline_ms,
            poll_interval_ms: t.poll_interval_ms,
            check_timeout_ms: t.check_timeout_ms,
            chat: None,
        }
    }

    /// Sends `start` (journaled first as a typed command), or re-attaches to
    /// it if the orchestrator that was killed had sent it. A write-ahead
    /// that fails is the error, with the start over and not sent: a start
    /// is never sent unrecorded (DESIGN.md 17).
    pub(super) async fn start_unit(
        &self,
        start: &machine::Start,
        readiness: ReadinessSpec,
    ) -> Result<UnitStart, (UnitStart, crate::ops::journal::JournalError)> {
        let unit = &start.unit;
        let role = start.role.as_str();
        let step_idx = self.rec.step_started(&format!("restart-{role}"), &unit.unit);
        let adopted = self
            .adopt
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&unit.to_string())
            .filter(|a| a.command_id == start.command_id);
        let command_id = start.command_id.clone();
        let deadline = crate::ops::port::far_deadline(
            Instant::now(),
            Duration::from_millis(readiness.deadline_ms.saturating_add(self.pair.timeouts.stop_grace_ms))
                .saturating_add(AGENT_SLACK),
        );
        let cmd = Command {
            fencing_token: 0,
            command_id: command_id.clone(),
            action: Some(command::Action::Start(StartUnit {
                unit: unit.unit.clone(),
                restart: true,
                stop_grace_ms: self.pair.timeouts.stop_grace_ms,
                readiness: Some(readiness),
            })),
        };
        let sent_at_ms = self.rec.now_ms();
        let mut s = UnitStart {
            unit: unit.clone(),
            role,
            command_id: command_id.clone(),
            sent: true,
            sent_at_ms,
            step_idx,
            rx: None,
            deadline,
            state: StartState::Sent,
            acked: false,
            furthest: None,
            last_detail: String::new(),
            generation_attempts: Vec::new(),
            config_fingerprint: String::new(),
            command: cmd.clone(),
            reattached: 0,
        };
        if adopted.is_none()
            && let Err(e) = self.rec.write_ahead(
                journal::COMMAND,
                &CommandEntry {
                    command_id: command_id.clone(),
                    action: CommandAction::Start,
                    unit: unit.to_string(),
                    restart: true,
                },
            )
        {
            s.sent = false;
            s.state = StartState::Failed { after_spawn: false };
            s.last_detail = format!("not started: the journal could not record its start command first ({e})");
            self.rec.step_ended(step_idx, format!("failed: {}", s.last_detail));
            return Err((s, e));
        }
        if let Some(a) = &adopted {
            self.rec.journal_entry(
                sent_at_ms,
                "adopted",
                &serde_json::json!({ "command_id": command_id, "unit": unit.to_string(), "phase": a.phase }),
            );
            // Already sent (and executed) by the orchestrator that was
            // killed: never started again. Where it ended is known from the
            // agent's facts; one still under way is re-attached by sending
            // the same command id, which the agent answers without executing
            // it twice, and whose later events come back to this operation.
            s.acked = true;
            // Followed first, then read where it is now: the resume's
            // snapshot may be old (a drain, earlier steps ran since), and an
            // event between reading and following would be lost, while the
            // facts are updated before any event is delivered.
            if let Ok(rx) = self.ctx.agents.send(&unit.host, &unit.unit, cmd.clone()).await {
                s.rx = Some(rx);
            }
            let (in_progress, phase) = match self
                .ctx
                .agents
                .unit(&unit.host, &unit.unit)
                .filter(|f| f.command_id == command_id)
            {
                Some(f) => (f.command_in_progress, phase_name(f.phase).to_string()),
                None => (a.in_progress, a.phase.clone()),
            };
            s.last_detail = format!(
                "{phase}: this operation's start (command {command_id}), sent before the orchestrator restarted, adopted — not started again"
            );
            s.state = match (in_progress, phase.as_str()) {
                (false, "generating") => {
                    s.furthest = Some(ReadinessPhase::Generating);
                    StartState::GeneratingBefore
                }
                (false, "exited") => StartState::Exited,
                (false, _) => StartState::NotReady,
                (true, "spawned" | "refused" | "http_503" | "healthy") => StartState::Spawned,
                (true, _) => StartState::Sent,
            };
            if s.state.is_over() {
                self.rec.step_ended(step_idx, s.outcome());
                return Ok(s);
            }
            if s.rx.is_some() {
                return Ok(s);
            }
        }
        match self.ctx.agents.send(&unit.host, &unit.unit, cmd).await {
            Ok(rx) => s.rx = Some(rx),
            Err(e) => {
                s.sent = false;
                s.state = StartState::Failed { after_spawn: false };
                s.last_detail = e.to_string();
                self.rec.step_ended(step_idx, format!("failed: {e}"));
            }
        }
        Ok(s)
    }

    /// `start`, over before it was sent (`detail` says why).
    pub(super) fn not_sent(&self, start: &machine::Start, detail: String) -> UnitStart {
        let step_idx = self
            .rec
            .step_started(&format!("restart-{}", start.role.as_str()), &start.unit.unit);
        self.rec.step_ended(step_idx, format!("failed: {detail}"));
        let now = self.rec.now_ms();
        UnitStart {
            unit: start.unit.clone(),
            role: start.role.as_str(),
            command_id: start.command_id.clone(),
            sent: false,
            sent_at_ms: now,
            step_idx,
            rx: None,
            deadline: Instant::now(),
            state: StartState::Failed { after_spawn: false },
            acked: false,
            furthest: None,
            last_detail: detail,
            generation_attempts: Vec::new(),
            config_fingerprint: String::new(),
            command: Command::default(),
            reattached: 0,
        }
    }
}

/// The link to a start's agent broke. Waits (at most [`REATTACH_GRACE`],
/// never past the start's deadline) for the agent to attach again, then
/// re-sends the same command id — the agent answers a known id without
/// executing it twice, the adoption a resumed operation uses — and follows
/// the start again; what it missed meanwhile is read from the agent's facts
/// (a start that ended while the link was down: where it ended). False when
/// the agent did not come back: the contact is lost.
pub(super) async fn reattach(rec: &Recorder, agents: &dyn AgentPort, s: &mut UnitStart) -> bool {
    if s.reattached >= MAX_REATTACH {
        return false;
    }
    let until = s.deadline.min(Instant::now() + REATTACH_GRACE);
    let host = s.unit.host.clone();
    while Instant::now() < until {
        if agents.is_connected(&host)
            && let Ok(rx) = agents.send(&host, &s.unit.unit, s.command.clone()).await
        {
            s.rx = Some(rx);
            s.reattached += 1;
            let facts = agents.unit(&host, &s.unit.unit);
            rec.journal_entry(
                rec.now_ms(),
                "reattached",
                &serde_json::json!({
                    "command_id": s.command_id,
                    "unit": s.unit.to_string(),
                    "phase": facts.as_ref().map(|f| phase_name(f.phase)),
                }),
            );
            if let Some(f) = facts.filter(|f| f.command_id == s.command_id && !f.command_in_progress) {
                s.state = match Phase::try_from(f.phase) {
                    Ok(Phase::Generating) => {
                        s.furthest = Some(ReadinessPhase::Generating);
                        StartState::GeneratingBefore
                    }
                    Ok(Phase::Exited) => StartState::Exited,
                    _ => StartState::NotReady,
                };
                s.last_detail = format!(
                    "{}: reached while agent {host}'s link was down (its facts, read when it re-attached)",
                    phase_name(f.phase)
                );
            }
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Receives and applies one report for a unit's start (or concludes it at
/// its deadline).
pub(super) async fn next_report(rec: &Recorder, agents: &dyn AgentPort, s: &mut UnitStart) {
    let Some(rx) = s.rx.as_mut() else {
        if !s.state.is_over() {
            s.state = StartState::Failed {
                after_spawn: s.state.spawned(),
            };
        }
        return;
    };
    let report = match tokio::time::timeout_at(s.deadline, rx.recv()).await {
        Ok(Some(AgentReport::Disconnected) | None) if reattach(rec, agents, s).await => return,
        Ok(Some(r)) => r,
        Ok(None) => AgentReport::Disconnected,
        Err(_) => {
            agents.forget(&s.command_id);
            s.state = StartState::Failed {
                after_spawn: s.state.spawned(),
            };
            s.last_detail = format!(
                "no word from the agent on {} by its deadline; last: {}",
                s.unit, s.last_detail
            );
            rec.step_ended(s.step_idx, s.outcome());
            return;
        }
    };
    apply_report(rec, s, report);
    if s.state.is_over() {
        agents.forget(&s.command_id);
        rec.step_ended(s.step_idx, s.outcome());
    }
}

pub(super) fn apply_report(rec: &Recorder, s: &mut UnitStart, report: AgentReport) {
    match report {
        AgentReport::Unit(ev) if ev.attempt.is_some() => {
            let a = ev.attempt.clone().unwrap_or_default();
            let at_ms = s.sent_at_ms + ev.ms_since_command;
            let generation = CheckKind::try_from(a.check) == Ok(CheckKind::Generation);
            let record = AttemptRecord {
                unit: s.unit.unit.clone(),
                role: s.role.into(),
                check: if generation { "generation" } else { "health" }.into(),
                outcome: match AttemptOutcome::try_from(a.outcome).unwrap_or(AttemptOutcome::Unspecified) {
                    AttemptOutcome::Ok => "ok",
                    AttemptOutcome::Timeout => "timeout",
                    AttemptOutcome::Refused => "refused",
                    _ => "error",
                }
                .into(),
                seq: a.seq,
                http_status: a.http_status,
                latency_ms: a.latency_ms,
                count: a.count.max(1),
                first_at_ms: s.sent_at_ms + a.first_ms_since_command.min(ev.ms_since_command),
                at_ms,
                detail: a.detail,
                request_id: a.request_id,
            };
            // Attempts reported while the old instance stopped are not this start's.
            if s.state.spawned() && generation {
                s.generation_attempts.push(record.clone());
            }
            rec.attempt(record);
        }
        AgentReport::Unit(ev) => {
            let phase = Phase::try_from(ev.phase).unwrap_or(Phase::Unspecified);
            let mut name = phase_name(ev.phase).to_string();
            if !s.state.spawned() && matches!(phase, Phase::Exited) {
                // The previous instance stopping, not the new one failing.
                name = "stopped".into();
            }
            rec.phase(TimelineRecord {
                unit: s.unit.unit.clone(),
                role: s.role.into(),
                phase: name,
                at_ms: s.sent_at_ms + ev.ms_since_command,
                detail: ev.detail.clone(),
            });
            if !ev.detail.is_empty() {
                s.last_detail = ev.detail.clone();
            }
            let reached = match phase {
                Phase::Spawned => {
                    s.state = StartState::Spawned;
                    s.config_fingerprint = ev.config_fingerprint.clone();
                    Some(ReadinessPhase::Spawned)
                }
                Phase::Refused => Some(ReadinessPhase::Refused),
                Phase::Http503 => Some(ReadinessPhase::Http503),
                Phase::Healthy => Some(ReadinessPhase::Healthy),
                Phase::Generating => {
                    s.state = StartState::Generating(PassedCheck {
                        latency_ms: ev.check_latency_ms,
                        tokens: ev.check_tokens,
                        engine_version: ev.engine_version.clone(),
                    });
                    Some(ReadinessPhase::Generating)
                }
                Phase::Exited if s.state.spawned() => {
                    s.state = StartState::Exited;
                    None
                }
                Phase::NotReady => {
                    s.state = StartState::NotReady;
                    None
                }
                _ => None,
            };
            if let Some(r) = reached {
                s.furthest = Some(s.furthest.map_or(r, |f| f.max(r)));
            }
        }
        AgentReport::Result(r) => {
            s.acked = true;
            if !r.ok {
                s.state = StartState::Failed {
                    after_spawn: s.state.spawned(),
                };
                s.last_detail = format!("start failed: {}", r.error);
            }
        }
        AgentReport::Probe(_)
        | AgentReport::Suite(_)
        | AgentReport::UnitConfig(_)
        | AgentReport::Gate(_)
        | AgentReport::RouterWorkers(_)
        | AgentReport::Evidence(_)
        | AgentReport::Scrape(_) => {}
        AgentReport::Disconnected => {
            s.state = StartState::LostContact {
                after_spawn: s.state.spawned(),
            };
            s.last_detail = format!("agent {} disconnected; last: {}", s.unit.host, s.last_detail);
        }
    }
}
