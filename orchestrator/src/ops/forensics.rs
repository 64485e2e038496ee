//! Evidence before the kill (issue 35): the capture a co-restart takes of a
//! pair judged wedged — by its automatic recovery, or an operator's restart
//! of a pair the watch calls wedged, suspect or held — before it stops any
//! unit, and keeps with the operation.
//!
//! Every host of the pair is asked at once (`CaptureEvidence`, one command
//! per host naming its units) and the whole capture is bounded by one
//! deadline (default 5 s, `[pair.watch] evidence_deadline_ms`): each agent
//! cuts its own work a little before it, and an agent that has not answered
//! by then is named as missing — the recovery goes on, never waits for the
//! evidence. The capture is read-only on the agents (py-spy
//! `--nonblocking`, /proc, GETs, the log file, the GPU reporter's last
//! reading). The records and the one-line reading per unit are the model's
//! (`pdwarden_model::forensics`, `judge::stacks`); the whole capture is
//! journaled as the operation's `evidence` entry, cut to its bound, and
//! older operations' captures are forgotten past the retention
//! ([`RETAIN_CAPTURES`] per pair, [`RETAIN_AGE_MS`]).

use std::collections::BTreeMap;
use std::time::Duration;

use pdwarden_model::forensics::{Capture, CaptureSummary, MAX_CAPTURE_BYTES, UnitCapture};
use pdwarden_model::judge::stacks;
use pdwarden_proto::v1::{CaptureEvidence, Command, command::Action};

use crate::config::{PairConfig, UnitRef};
use crate::ops::journal::Journal;
use crate::ops::port::{AgentPort, AgentReport};

/// The journal entry holding a capture.
pub const ENTRY: &str = "evidence";
/// The opening entry of an operator's co-restart of a pair the watch
/// judged wedged: `{"why": …}`. The co-restart captures when it finds it.
pub const OPENING: &str = "capture";
/// Log lines per unit.
pub const LOG_LINES: u32 = 100;
/// Captures kept per pair: older operations' `evidence` entries are
/// forgotten (their reports keep the summary).
pub const RETAIN_CAPTURES: usize = 20;
/// Captures older than this are forgotten too (30 days).
pub const RETAIN_AGE_MS: i64 = 30 * 24 * 3600 * 1000;

/// Takes the capture of every unit of `pair`, bounded by `deadline`. Never
/// fails: what could not be captured is named in it.
pub async fn capture(agents: &dyn AgentPort, pair: &PairConfig, why: String, deadline: Duration) -> Capture {
    let started = tokio::time::Instant::now();
    let deadline_ms = u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX);
    let roles: Vec<(&UnitRef, &str)> = [
        ("prefill", &pair.prefill),
        ("decode", &pair.decode),
        ("router", &pair.router),
    ]
    .into_iter()
    .flat_map(|(role, units)| units.iter().map(move |u| (u, role)))
    .collect();
    // Units their agents report not running (never started, or stopped on
    // command): nothing to capture, and not missing (issue 49). A unit
    // that exited on its own is asked for (its log tail says why).
    let (roles, stopped): (Vec<_>, Vec<_>) = roles.into_iter().partition(|(u, _)| {
        !(agents.is_connected(&u.host)
            && agents.unit(&u.host, &u.unit).is_some_and(|i| {
                pdwarden_proto::v1::Phase::try_from(i.phase) == Ok(pdwarden_proto::v1::Phase::Stopped)
            }))
    });
    let not_running: Vec<String> = stopped.iter().map(|(u, role)| format!("{role} {}", u.unit)).collect();
    if roles.is_empty() {
        return Capture {
            why,
            deadline_ms,
            not_running,
            ..Default::default()
        };
    }
    let mut by_host: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (u, _) in &roles {
        by_host.entry(u.host.as_str()).or_default().push(u.unit.as_str());
    }
    let asks = by_host.iter().map(|(host, units)| async move {
        let command = Command {
            command_id: uuid::Uuid::new_v4().to_string(),
            action: Some(Action::CaptureEvidence(CaptureEvidence {
                units: units.iter().map(|u| u.to_string()).collect(),
                deadline_ms,
                log_lines: LOG_LINES,
            })),
            ..Default::default()
        };
        let ask = agents.ask(host, units[0], command, deadline, |r| match r {
            AgentReport::Evidence(e) => Some(e),
            _ => None,
        });
        let answer = match tokio::time::timeout(deadline, ask).await {
            Ok(Ok(e)) => Ok(e),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "no answer from agent {host} within the {deadline_ms} ms deadline"
            )),
        };
        (*host, answer)
    });
    let answers = futures::future::join_all(asks).await;
    let mut capture = Capture {
        why,
        deadline_ms,
        not_running,
        ..Default::default()
    };
    let mut found: BTreeMap<(String, String), UnitCapture> = BTreeMap::new();
    for (host, answer) in answers {
        match answer {
            Ok(result) => {
                if !result.py_spy_missing.is_empty() {
                    capture.missing.push(format!("{host}: {}", result.py_spy_missing));
                }
                for mut e in result.units {
                    redact_by_shape(&mut e);
                    let role = roles
                        .iter()
                        .find(|(u, _)| u.host == host && u.unit == e.unit)
                        .map_or("", |(_, r)| r);
                    let u = UnitCapture::from_proto(host, role, e, &result.py_spy);
                    found.insert((host.to_string(), u.unit.clone()), u);
                }
            }
            Err(e) => capture.missing.push(format!("{host}: {e}")),
        }
    }
    for (u, role) in &roles {
        let unit = found.remove(&(u.host.clone(), u.unit.clone())).unwrap_or_else(|| {
            UnitCapture::not_captured(&u.host, &u.unit, role, "nothing captured (see the host's line)".into())
        });
        capture.units.push(unit);
    }
    capture.readings = capture.units.iter().map(stacks::read).collect();
    capture.partial = !capture.all_missing().is_empty();
    capture.took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    capture.bound(MAX_CAPTURE_BYTES);
    capture
}

/// Every secret of a listed shape in a unit's capture replaced, on arrival
/// (issue 48): an agent redacts before it answers, but an older one does
/// not, and a capture is journaled and readable for 30 days. Command lines
/// (the unit's, its children's, foreign GPU processes'), frames, documents,
/// the log tail and the notes.
fn redact_by_shape(e: &mut pdwarden_proto::v1::UnitEvidence) {
    use pdwarden_security::shapes::by_shape;
    let fix = |s: &mut String| {
        if let std::borrow::Cow::Owned(clean) = by_shape(s) {
            *s = clean;
        }
    };
    for p in &mut e.processes {
        fix(&mut p.command);
        fix(&mut p.py_spy_error);
        for t in &mut p.threads {
            t.frames.iter_mut().for_each(fix);
        }
    }
    for d in &mut e.documents {
        fix(&mut d.url);
        fix(&mut d.body);
        fix(&mut d.error);
    }
    fix(&mut e.log_tail);
    e.missing.iter_mut().for_each(fix);
    for g in &mut e.foreign_processes {
        fix(&mut g.command_line);
    }
}

/// Journals `capture` with operation `operation_id` and forgets the
/// pair's captures past the retention; returns the report's summary (with
/// a failed write named: the recovery goes on without its record).
pub fn keep(journal: &Journal, pair: &str, operation_id: &str, at_ms: u64, capture: &Capture) -> CaptureSummary {
    let mut summary = capture.summary();
    if capture.nothing_to_capture() {
        return summary;
    }
    if let Err(e) = journal.append(operation_id, at_ms, ENTRY, capture) {
        tracing::error!(operation = %operation_id, error = %e, "cannot journal the evidence captured before the restart");
        summary.missing.push(format!("the capture could not be journaled: {e}"));
        summary.partial = true;
        return summary;
    }
    if let Err(e) = journal.retain_captures(pair, ENTRY, RETAIN_CAPTURES, RETAIN_AGE_MS) {
        tracing::warn!(%pair, error = %e, "cannot forget old captures");
    }
    summary
}
