//! When the watch probes a pair, and with what timeout. Active probes are
//! asked for only when passive evidence is missing or suspicious, or when
//! nothing has proved liveness lately — never while real traffic advances
//! every engine — and their timeout covers the work ahead of them, so a
//! probe is never abandoned mid-prefill (INCIDENTS row 4): one that would
//! need more than `max_probe_timeout` is deferred. A probe still in flight is
//! re-judged with the same allowance as the gauges arrive ([`overdue`]).

use std::time::Duration;

use tokio::time::Instant;

use super::{
    Metrics, PairEvidence, PairState, ProbeObservation, UnitAssessment, UnitState, WatchPolicy, WatchProbe, ms, s,
};

/// What the watch does about probing a pair now.
#[derive(Debug, Clone, PartialEq)]
pub enum ProbeDecision {
    /// Not needed (traffic or a recent probe proves liveness), or not allowed yet.
    None,
    Send {
        timeout: Duration,
        work_ahead: u32,
        why: String,
    },
    /// Needed, but its timeout would have to exceed `max_probe_timeout`.
    Defer { why: String },
}

/// The requests ahead of a probe on one engine, and the time they may
/// legitimately take: on a serial engine each runs its whole prefill and
/// generation first; on a batching one the queued ones are prefilled first,
/// at most one running prefill holds the batch, and queued requests wait
/// for running ones to finish.
fn work_ahead(m: &Metrics, p: &WatchPolicy) -> (u32, Duration) {
    let count = |v: f64| v.max(0.0).ceil() as u32;
    let running = count(m.running);
    let queued = count(m.queued + m.prefill_prealloc.unwrap_or(0.0) + m.decode_prealloc.unwrap_or(0.0));
    if p.serial {
        let n = running + queued;
        (n, p.max_request() * n)
    } else {
        // Requests queue on a batching engine only while its batch is full
        // (`--max-running-requests`, or KV memory): the probe then waits for
        // ceil((queued + 1) / running) waves of generations to end as well.
        let prefills = queued + u32::from(running > 0);
        let waves = if queued > 0 {
            (queued + 1).div_ceil(running.max(1))
        } else {
            0
        };
        (running + queued, p.max_prefill * prefills + p.max_generation * waves)
    }
}

/// What a probe sent now may wait for beyond its own budget: the work
/// ahead of it on the busiest engine (it must not be abandoned mid-prefill),
/// and at least one legitimate silence of the slowest engine — a prefill
/// chunk in progress that its stale gauges do not show yet — so that a probe
/// that times out is evidence, not bad luck. With the requests ahead.
fn probe_allowance(e: &PairEvidence, p: &WatchPolicy, units: &[UnitAssessment]) -> (u32, Duration) {
    let (work_ahead, ahead) = units
        .iter()
        .filter_map(|u| u.metrics.map(|m| work_ahead(&m, p)))
        .max_by_key(|(_, d)| *d)
        .unwrap_or((0, Duration::ZERO));
    let floor = e
        .units
        .iter()
        .map(|u| p.silence_allowance(u.engine(p).profile(), u.work_signal(p)))
        .max()
        .unwrap_or(Duration::ZERO);
    (work_ahead, ahead.max(floor))
}

/// How a probe still in flight past what its work ahead allows is named.
pub(super) const OVERDUE: &str = "(still unanswered, past what the work now known ahead of it allows)";

/// A probe still in flight is re-judged as samples arrive (issue 31: one
/// sent before the gauges were known carried the worst case, 426 s, and
/// blinded the watch): once it has waited longer than what the budget
/// and the work now known ahead of it allow, it counts as timed out, and
/// the rules may confirm a wedge on it while its answer is awaited.
pub(super) fn overdue(e: &PairEvidence, p: &WatchPolicy, now: Instant, units: &[UnitAssessment]) -> Option<WatchProbe> {
    e.in_flight.as_ref().and_then(|f| {
        let (ahead, allowance) = probe_allowance(e, p, units);
        let due = e.probe_budget(p) + allowance;
        let waited = now.saturating_duration_since(f.sent_at);
        (due < f.timeout && waited >= due).then(|| WatchProbe {
            target: f.target.clone(),
            sent_at: f.sent_at,
            timeout: due,
            work_ahead: ahead,
            outcome: ProbeObservation::Timeout { after_ms: ms(waited) },
            request_id: OVERDUE.into(),
        })
    })
}

/// Whether to probe the pair now, and with what timeout: never while a
/// probe is in flight or once the pair is wedged; for a down unit or
/// suspicious evidence at the minimum gap (not again soon after a failed
/// probe, whose failure is the evidence); when nothing has proved liveness
/// lately, at the idle interval, real traffic given its chance first. The
/// timeout is the probe's own budget plus what the work ahead of it may
/// take ([`probe_allowance`]); past `max_probe_timeout` it is deferred
/// rather than risk an abandoned prefill.
pub(super) fn decide_probe(
    e: &PairEvidence,
    p: &WatchPolicy,
    now: Instant,
    state: PairState,
    units: &[UnitAssessment],
    proof_fresh: bool,
) -> ProbeDecision {
    if e.probe_in_flight || state == PairState::Wedged {
        return ProbeDecision::None;
    }
    let since_last = e.last_probe_sent.map(|t| now.saturating_duration_since(t));
    let unanswering = units.iter().any(|u| u.state == UnitState::Unresponsive);
    let why = match state {
        // A unit answers nothing: does the pair still generate? Asked at
        // the minimum gap, and not again soon after a failed probe (its
        // failure is the evidence the wedge is judged on).
        PairState::Suspect if unanswering => {
            let since_done = e.last_probe_done.map(|t| now.saturating_duration_since(t));
            let failed_last = e
                .last_probe
                .as_ref()
                .is_some_and(|r| !matches!(r.outcome, ProbeObservation::Ok { .. }));
            if since_last.is_some_and(|d| d < p.min_probe_interval)
                || (failed_last && since_done.is_some_and(|d| d < e.idle_interval(p)))
            {
                return ProbeDecision::None;
            }
            "a unit answers neither /metrics nor health"
        }
        // Evidence missing or suspicious: probe, at the minimum gap, but
        // never again soon after a failed probe (that unit just failed).
        PairState::Suspect
            if e.last_probe
                .as_ref()
                .is_some_and(|r| !matches!(r.outcome, ProbeObservation::Ok { .. })) =>
        {
            let since_done = e.last_probe_done.map(|t| now.saturating_duration_since(t));
            if since_done.is_some_and(|d| d < e.idle_interval(p).max(p.min_probe_interval)) {
                return ProbeDecision::None;
            }
            "the last probe failed and nothing has progressed since"
        }
        PairState::Suspect => {
            if since_last.is_some_and(|d| d < p.min_probe_interval) {
                return ProbeDecision::None;
            }
            "passive evidence is missing or suspicious"
        }
        PairState::Unproven | PairState::Healthy if !proof_fresh => {
            // Give real traffic a chance to prove liveness first.
            let watched_for = e
                .units
                .iter()
                .filter_map(|u| u.first_at)
                .min()
                .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
            if since_last.is_some_and(|d| d < e.idle_interval(p)) || watched_for < p.min_probe_interval {
                return ProbeDecision::None;
            }
            "nothing has proved liveness recently"
        }
        _ => return ProbeDecision::None,
    };
    let (work_ahead, allowance) = probe_allowance(e, p, units);
    let timeout = e.probe_budget(p) + allowance;
    let each = if p.serial {
        format!(
            "up to {} each (worst prefill + worst generation: the engines are serial)",
            s(p.max_request())
        )
    } else {
        format!(
            "up to {} of prefill each, and the generations queued requests wait for",
            s(p.max_prefill)
        )
    };
    if timeout > p.max_probe_timeout {
        return ProbeDecision::Defer {
            why: format!(
                "{why}, but {work_ahead} request(s) are ahead of a probe: covering them at {each} needs {} (> max {}); waiting instead of risking an abandoned prefill",
                s(timeout),
                s(p.max_probe_timeout)
            ),
        };
    }
    ProbeDecision::Send {
        timeout,
        work_ahead,
        why: why.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{observe, pair, policy, sample};
    use super::super::{PairState, judge};
    use super::*;

    /// Row 4 and issue 13: a probe's timeout covers the work ahead of it. On
    /// a serial engine each request ahead runs its whole prefill and
    /// generation first (200 s + 100 s); if that needs more than
    /// max_probe_timeout the probe waits.
    #[test]
    fn probe_timeout_covers_the_work_ahead_or_the_probe_waits() {
        let p = policy();
        let t0 = Instant::now();
        let mut e = pair();
        // 1 running + 1 queued, stalled past the budget: suspicious.
        for t in 0..=10u64 {
            let now = t0 + Duration::from_secs(t);
            observe(&mut e, "prefill-0", sample(now, 1.0, 1.0, 50.0, 41_918.0, None));
            observe(&mut e, "decode-0", sample(now, 0.0, 0.0, 400.0, 18.0, None));
        }
        let a = judge(&e, &p, t0 + Duration::from_secs(10));
        assert_eq!(a.state, PairState::Suspect);
        assert_eq!(
            a.probe,
            ProbeDecision::Send {
                timeout: Duration::from_secs(120 + 2 * 300),
                work_ahead: 2,
                why: "passive evidence is missing or suspicious".into()
            }
        );
        // Three requests ahead would need 1,020 s > 1,200 s? No: 120 + 900 = 1,020 s fits;
        // four need 1,320 s > 1,200 s: deferred.
        let now = t0 + Duration::from_secs(11);
        observe(&mut e, "prefill-0", sample(now, 1.0, 3.0, 50.0, 41_918.0, None));
        observe(&mut e, "decode-0", sample(now, 0.0, 0.0, 400.0, 18.0, None));
        match judge(&e, &p, now).probe {
            ProbeDecision::Defer { why } => assert!(why.contains("4 request(s)") && why.contains("1320.0 s"), "{why}"),
            other => panic!("{other:?}"),
        }
        // A batching engine: queued prefills plus one running prefill, and
        // with requests queued (the batch is full: 1 running) the 4 waves
        // of generations they wait for.
        let mut b = policy();
        b.serial = false;
        b.max_probe_timeout = Duration::from_secs(2_000);
        let a = judge(&e, &b, now);
        match a.probe {
            ProbeDecision::Send {
                timeout, work_ahead, ..
            } => {
                assert_eq!((timeout, work_ahead), (Duration::from_secs(120 + 4 * 200 + 4 * 100), 4))
            }
            other => panic!("{other:?}"),
        }
        // Nothing queued on a batching engine: one running prefill only.
        observe(&mut e, "prefill-0", sample(now, 5.0, 0.0, 50.0, 41_918.0, None));
        match judge(&e, &b, now).probe {
            ProbeDecision::Send { timeout, .. } => assert_eq!(timeout, Duration::from_secs(120 + 200)),
            other => panic!("{other:?}"),
        }
    }
}
