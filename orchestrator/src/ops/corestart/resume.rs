//! Taking over a co-restart an earlier orchestrator left running: where it
//! resumes (its journaled typed state and the agents' facts) and which of
//! its starts the agents are still on (adopted by command id, never sent
//! again).

use super::*;

/// Where an interrupted co-restart picks up after an orchestrator restart.
#[derive(Debug, Clone, PartialEq)]
pub struct Resume {
    /// The first step to run again.
    pub from: CoRestartStep,
    /// Units of the steps before `from`: generating, by the agents' facts.
    pub kept: Vec<UnitStartup>,
    /// Starts this operation had already sent that the agents are still on
    /// (their facts name the same command id), by unit ("host/unit"): the
    /// resumed steps adopt them instead of starting the unit again.
    pub adopt: BTreeMap<String, Adopted>,
    /// Said in the report's reasons.
    pub note: String,
}

/// A start of this operation, sent before the orchestrator restarted, that
/// the unit's agent is still on.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Adopted {
    pub command_id: String,
    /// The unit's phase by its agent's facts when the operation resumed.
    pub phase: String,
    /// Whether the start was still under way then (else it had ended, in
    /// `phase`).
    pub in_progress: bool,
}

/// The starts an interrupted operation had sent (its journaled `command`
/// entries, the last per unit) that each unit's agent is still on:
/// `facts` answers with the unit's (command id, phase, start in progress) by
/// its agent. A start whose command id the agent does not name was
/// superseded (or never arrived) and is not adopted. Pure.
pub fn adoptable_starts(
    commands: &[CommandEntry],
    facts: impl Fn(&str) -> Option<(String, Phase, bool)>,
) -> BTreeMap<String, Adopted> {
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    for c in commands.iter().filter(|c| c.action == CommandAction::Start) {
        last.insert(c.unit.clone(), c.command_id.clone());
    }
    last.into_iter()
        .filter_map(|(unit, id)| match facts(&unit) {
            Some((current, phase, in_progress)) if current == id => Some((
                unit,
                Adopted {
                    command_id: id,
                    phase: phase_name(phase as i32).to_string(),
                    in_progress,
                },
            )),
            _ => None,
        })
        .collect()
}

/// Decides where an interrupted co-restart resumes: at the step that was in
/// progress, provided every unit of the steps before it is generating by the
/// agents' current facts; otherwise from the beginning (restarting a unit
/// that is generating again is safe; trusting one that is not is not).
/// Pure: `phase_of` answers with the agent-reported phase of a unit.
pub fn resume_point(
    state: Option<CoRestartStep>,
    pair: &PairConfig,
    phase_of: impl Fn(&UnitRef) -> Option<Phase>,
) -> (CoRestartStep, Vec<UnitStartup>) {
    use CoRestartStep as S;
    let wanted = match state {
        Some(S::RestartingDecode) if pair.decode_start_policy == DecodeStartPolicy::AfterPrefillReady => {
            S::RestartingDecode
        }
        Some(S::RestartingRouter) => S::RestartingRouter,
        // Killed while rejoining: the verdict is reached again first.
        Some(S::Probing | S::Verifying | S::Rejoining) => S::Probing,
        _ => S::RestartingPrefill,
    };
    let mut before: Vec<(&'static str, &UnitRef)> = Vec::new();
    if wanted as u8 > CoRestartStep::RestartingPrefill as u8 {
        before.extend(pair.prefill.iter().map(|u| ("prefill", u)));
    }
    if wanted as u8 > CoRestartStep::RestartingDecode as u8 {
        before.extend(pair.decode.iter().map(|u| ("decode", u)));
    }
    if wanted as u8 > CoRestartStep::RestartingRouter as u8 {
        before.extend(pair.router.iter().map(|u| ("router", u)));
    }
    if before.iter().any(|(_, u)| phase_of(u) != Some(Phase::Generating)) {
        return (CoRestartStep::RestartingPrefill, Vec::new());
    }
    let kept = before
        .into_iter()
        .map(|(role, u)| UnitStartup {
            unit: u.unit.clone(),
            role: role.into(),
            furthest: Some(ReadinessPhase::Generating),
            exited: false,
            lost_contact: false,
            last_detail: "generating before the orchestrator restarted (agent's facts)".into(),
            waited_ms: 0,
            failed_checks: Vec::new(),
        })
        .collect();
    (wanted, kept)
}

/// The step a journaled typed state names: the order's own state
/// ([`machine::CoRestart`]) or a stage's ([`Stage`]); `None` for one this
/// version cannot read (a resume then starts over: restarting a
/// generating unit again is safe).
pub(super) fn journaled_step(state: serde_json::Value) -> Option<CoRestartStep> {
    let step = if state.get("stage").is_some() {
        serde_json::from_value::<Stage>(state).map(|s| s.resume_step())
    } else {
        serde_json::from_value::<machine::CoRestart>(state).map(|s| s.step())
    };
    step.inspect_err(|e| tracing::warn!(error = %e, "the journaled co-restart state cannot be read; starting over"))
        .ok()
}

/// Takes over an interrupted co-restart or verification (DESIGN.md 4) once
/// its agents have re-attached: where it resumes is decided from the
/// journaled state and the agents' current facts ([`resume_point`]), and the
/// starts it had already sent that the agents are still on are adopted by
/// their command ids ([`adoptable_starts`]), never sent again. Nobody follows
/// a resumed operation live; its report is journaled and returned.
pub async fn resume(
    ctx: OperationContext,
    pair: PairConfig,
    op: pdwarden_model::status::OperationRecord,
) -> OperationReport {
    let (kind, from, kept) = if op.kind == "verify" {
        (
            OperationKind::Verify {
                include_abort_storm: false,
            },
            CoRestartStep::Probing,
            Vec::new(),
        )
    } else {
        // The typed state it last entered; the label for an operation
        // journaled before states were typed. One that cannot be read
        // starts over (restarting a generating unit again is safe).
        let journaled = match ctx.journal.last_state::<serde_json::Value>(&op.operation_id) {
            Ok(Some(state)) => journaled_step(state),
            Ok(None) => CoRestartStep::parse(&op.state),
            Err(e) => {
                tracing::warn!(operation = %op.operation_id, error = %e, "the journaled co-restart state cannot be read; starting over");
                None
            }
        };
        let (from, kept) = resume_point(journaled, &pair, |u| {
            ctx.agents
                .unit(&u.host, &u.unit)
                .map(|i| Phase::try_from(i.phase).unwrap_or(Phase::Unspecified))
        });
        (OperationKind::CoRestart, from, kept)
    };
    let note = format!(
        "resumed after an orchestrator restart: the operation was in state {}; continued from {}{}",
        op.state,
        from.as_str(),
        if kept.is_empty() {
            String::new()
        } else {
            format!(
                " (kept {}, generating by their agents' facts)",
                kept.iter().map(|k| k.unit.as_str()).collect::<Vec<_>>().join(", ")
            )
        }
    );
    // Starts this operation had sent that the agents are still on: adopted
    // by their command ids, never sent as new starts (a second model load).
    let adopt = match (&kind, ctx.journal.commands(&op.operation_id)) {
        (OperationKind::CoRestart, Ok(commands)) => adoptable_starts(&commands, |unit| {
            let (host, name) = unit.split_once('/')?;
            let info = ctx.agents.unit(host, name)?;
            Some((
                info.command_id,
                Phase::try_from(info.phase).unwrap_or(Phase::Unspecified),
                info.command_in_progress,
            ))
        }),
        _ => Default::default(),
    };
    let note = if adopt.is_empty() {
        note
    } else {
        format!(
            "{note}; adopted its own start of {} (the same command, not started again)",
            adopt
                .iter()
                .map(|(u, a)| format!(
                    "{} ({}{})",
                    u.split_once('/').map_or(u.as_str(), |x| x.1),
                    a.phase,
                    if a.in_progress { ", under way" } else { "" }
                ))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    // Nobody is following this operation live; its report is journaled.
    let (tx, _rx) = mpsc::unbounded_channel();
    let resume = Resume {
        from,
        kept,
        adopt,
        note,
    };
    run_operation_from(ctx, pair, op.operation_id, kind, Some(resume), tx).await
}
