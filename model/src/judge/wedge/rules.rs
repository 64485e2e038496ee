//! The rules that name a wedge, each with its numbers and with how it ruled
//! out legitimate work. Per engine ([`assess_unit`]): missing evidence first,
//! then the stall rule, then the health rule; across the pair, the KV
//! transfer that never lands ([`kv_transfer_stuck`]). The pair-level rules
//! on probes and the agents' facts, and their order, are `judge`'s (the
//! parent module); the allowances come from [`WatchPolicy`] and the engine's
//! profile, so a rule never asks what the engine is, only what its signals
//! may legitimately do.

use std::time::Duration;

use pdwarden_engines::{EngineKind, Health, Moves, PrefillProgress, Profile};
use tokio::time::Instant;

use super::{
    Metrics, PairEvidence, Sample, UnitAssessment, UnitState, UnitTrack, WatchPolicy, WedgeEvidence, WedgeKind, ms, s,
};

/// "health answers 503", or "health does not answer".
fn health_phrase(status: u16) -> String {
    if status == 0 {
        "health does not answer".into()
    } else {
        format!("health answers {status}")
    }
}

/// A gauge or counter as a reason shows it: "?" when the engine does not expose it.
fn num(v: Option<f64>) -> String {
    v.map_or("?".into(), |v| format!("{v}"))
}

/// A unit rule's finding that ends the unit's assessment: its state, why,
/// and the evidence when it is a wedge.
struct Finding {
    state: UnitState,
    reason: String,
    wedge: Option<WedgeEvidence>,
}

impl Finding {
    fn new(state: UnitState, reason: String) -> Self {
        Finding {
            state,
            reason,
            wedge: None,
        }
    }

    fn wedged(reason: String, evidence: WedgeEvidence) -> Self {
        Finding {
            state: UnitState::Wedged,
            reason,
            wedge: Some(evidence),
        }
    }

    /// The assessment with this finding's state, its reason after those
    /// already given, and its evidence.
    fn conclude(self, mut a: UnitAssessment) -> UnitAssessment {
        a.state = self.state;
        a.reasons.push(self.reason);
        a.wedge = self.wedge;
        a
    }
}

/// One engine's fresh scrape as the stall and health rules read it, with
/// the phrases their reasons share.
struct Scrape<'a> {
    u: &'a UnitTrack,
    last: &'a Sample,
    m: Metrics,
    engine: EngineKind,
    profile: &'static Profile,
    /// GPU utilisation below `gpu_idle_below`: nothing is computing.
    gpu_idle: bool,
    /// "GPU utilisation 97 %", or "GPU utilisation unknown".
    gpu: String,
    /// "1 running, 1 queued", and the KV in transit if any.
    queues: String,
}

/// Judges one engine at `now`: missing evidence ends it first, then the
/// stall rule and the health rule, in that order; a unit that neither holds
/// is serving or idle. `last_probe_ok` tells a partial wedge (the watch's
/// own probe answered during the silence) from a whole one.
pub(super) fn assess_unit(
    u: &UnitTrack,
    p: &WatchPolicy,
    now: Instant,
    last_probe_ok: Option<Instant>,
) -> UnitAssessment {
    let mut a = UnitAssessment {
        unit: u.unit.clone(),
        role: u.role.clone(),
        state: UnitState::Unknown,
        reasons: Vec::new(),
        metrics: u.last.as_ref().and_then(|s| s.metrics),
        health_status: u.last.as_ref().map_or(0, |s| s.health_status),
        wedge: None,
    };
    let f = match fresh_scrape(u, p, now) {
        Ok(f) => f,
        Err(missing) => return missing.conclude(a),
    };
    let stall_state = match stall(&f, p, now, last_probe_ok) {
        Stall::Wedged(wedged) => return wedged.conclude(a),
        Stall::PastBudget(reason) => {
            a.reasons.push(reason);
            Some(UnitState::Stalled)
        }
        Stall::WithinBudget => Some(UnitState::Serving),
        Stall::NoWork => None,
    };
    if let Some(health) = health_gone_bad(&f, p, now, last_probe_ok) {
        return health.conclude(a);
    }
    a.state = stall_state.unwrap_or_else(|| serving_or_idle(u, p, now));
    a
}

/// Missing evidence ends a unit's assessment before any rule reads it: no
/// sample yet, one older than `stale_after`, or a failed scrape
/// ([`scrape_failed`]). Otherwise the fresh scrape the rules read.
fn fresh_scrape<'a>(u: &'a UnitTrack, p: &WatchPolicy, now: Instant) -> Result<Scrape<'a>, Finding> {
    let Some(last) = &u.last else {
        return Err(Finding::new(
            UnitState::Unknown,
            format!(
                "{}: no sample yet (the watch's scrapes; its agent says it runs, or is not connected)",
                u.unit
            ),
        ));
    };
    let age = now.saturating_duration_since(last.at);
    if age > p.stale_after {
        return Err(Finding::new(
            UnitState::Unknown,
            format!(
                "{}: no sample for {} (passive evidence missing: the watch's scrapes)",
                u.unit,
                s(age)
            ),
        ));
    }
    let Some(m) = last.metrics else {
        return Err(scrape_failed(u, last, now));
    };
    let engine = u.engine(p);
    let profile = engine.profile();
    let gpu_idle = m.gpu_util.is_some_and(|g| g < p.gpu_idle_below);
    let gpu = match m.gpu_util {
        Some(g) => format!("GPU utilisation {:.0} %", g * 100.0),
        None => "GPU utilisation unknown".into(),
    };
    let queues = format!(
        "{} running, {} queued{}",
        m.running,
        m.queued,
        match (m.prefill_inflight, m.decode_transfer) {
            (Some(i), _) if i > 0.0 => format!(", {i} sending KV"),
            (_, Some(t)) if t > 0.0 => format!(", {t} waiting for KV"),
            _ => String::new(),
        }
    );
    Ok(Scrape {
        u,
        last,
        m,
        engine,
        profile,
        gpu_idle,
        gpu,
        queues,
    })
}

/// A failed scrape: the unit is unresponsive from the first scrape that
/// neither /metrics nor health answered (issue 49: whether or not it was
/// ever scraped before); while health answers, its evidence is merely
/// missing. Whether it runs is its agent's to say ([`super::judge`]).
fn scrape_failed(u: &UnitTrack, last: &Sample, now: Instant) -> Finding {
    let bad_for = u
        .scrape_bad_since
        .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
    if last.health_status == 0 {
        Finding::new(
            UnitState::Unresponsive,
            format!(
                "{}: neither /metrics nor health answer for {} ({}; the watch's scrapes)",
                u.unit,
                s(bad_for),
                last.error
            ),
        )
    } else {
        Finding::new(
            UnitState::Unknown,
            format!(
                "{}: /metrics unreadable for {} ({}); {}",
                u.unit,
                s(bad_for),
                last.error,
                health_phrase(last.health_status)
            ),
        )
    }
}

/// What the stall rule found of a unit.
enum Stall {
    /// No work present: nothing to stall.
    NoWork,
    /// Work present, silent for less than the stall budget.
    WithinBudget,
    /// Silent past the budget but within the allowance: suspicious, and why.
    PastBudget(String),
    /// Silent past the budget and the allowance: a wedge.
    Wedged(Finding),
}

/// A unit's work without progress beyond the probes' credit.
struct Silence {
    since: Instant,
    lasted: Duration,
    /// The engine's only work is KV in transit.
    kv_only: bool,
}

/// How long a silence may last beyond the stall budget, why, and what a
/// wedge past it rules out.
struct Allowance {
    extra: Duration,
    why: String,
    ruled_out: String,
}

/// The stall rule (seed 001's slot leak): work present and no progress
/// beyond the probes' credit for the stall budget plus the longest silence
/// the engine's signals may legitimately show ([`stall_allowance`]).
fn stall(f: &Scrape, p: &WatchPolicy, now: Instant, last_probe_ok: Option<Instant>) -> Stall {
    let Scrape {
        u,
        last,
        m,
        queues,
        gpu,
        ..
    } = f;
    let Some(silent_since) = u.silent_since() else {
        return Stall::NoWork;
    };
    let silence = Silence {
        since: silent_since,
        lasted: now.saturating_duration_since(silent_since),
        kv_only: m.only_waiting_for_kv(),
    };
    let stalled = silence.lasted;
    let allowance = stall_allowance(f, p, &silence);
    let why_allowance = &allowance.why;
    let line = format!(
        "{}: {queues}, generation_tokens_total {} prompt_tokens_total {} realtime_tokens_total {}, no progress for {} ({gpu}; {why_allowance}); {}",
        u.unit,
        num(m.generation_tokens),
        num(m.prompt_tokens),
        num(m.realtime_tokens),
        s(stalled),
        health_phrase(last.health_status)
    );
    if stalled >= p.stall_budget + allowance.extra {
        return Stall::Wedged(stall_wedge(f, p, &silence, allowance.ruled_out, line, last_probe_ok));
    }
    if stalled >= p.stall_budget {
        Stall::PastBudget(format!("{line}: past the stall budget, within the allowance"))
    } else {
        Stall::WithinBudget
    }
}

/// The longest legitimate silence beyond the stall budget, by what the
/// engine shows: none with the GPU known idle, one during-work gap with a
/// counter that rises during work, the longest request without one.
fn stall_allowance(f: &Scrape, p: &WatchPolicy, silence: &Silence) -> Allowance {
    if f.gpu_idle {
        idle_gpu_allowance(f, p)
    } else if f.u.has_work_signal {
        during_work_allowance(f, p, silence)
    } else {
        finish_only_allowance(p, silence)
    }
}

/// With the GPU known idle nothing is computing: the stall budget alone.
fn idle_gpu_allowance(f: &Scrape, p: &WatchPolicy) -> Allowance {
    let gpu = &f.gpu;
    Allowance {
        extra: Duration::ZERO,
        why: format!("stall budget {} with the GPU idle", s(p.stall_budget)),
        ruled_out: format!("{gpu} < {:.0} %: nothing is computing", p.gpu_idle_below * 100.0),
    }
}

/// With a counter that rises during work: the longest it may stay flat (one
/// prefill chunk, the whole prefill where it counts only at the prefill's
/// end, or the gauges' idle refresh after a finish); an engine whose only
/// work is KV in transit may also wait for the prefill's compute and the
/// transfer.
fn during_work_allowance(f: &Scrape, p: &WatchPolicy, silence: &Silence) -> Allowance {
    let Scrape { u, profile, .. } = f;
    let Silence {
        lasted: stalled,
        kv_only,
        ..
    } = *silence;
    let after_finish = u.last_finish_progress.is_some() && u.last_finish_progress == u.last_progress;
    let gap = p.work_gap(profile, after_finish);
    let mut allow = gap;
    let mut why = format!(
        "stall budget {} + {} that {} may legitimately stay flat ({})",
        s(p.stall_budget),
        s(gap),
        during_work_names(profile),
        match (profile.prefill_progress, after_finish) {
            (PrefillProgress::PerChunk, false) => "one prefill chunk at the slowest speed",
            (PrefillProgress::PerChunk, true) =>
                "one prefill chunk at the slowest speed, or the gauges' idle refresh after a request finished",
            (PrefillProgress::AtPrefillEnd, _) => "the worst prefill: it counts nothing until the prefill ends",
        }
    );
    if kv_only {
        allow = allow.max(p.max_prefill + p.max_kv_transfer);
        why = format!(
            "stall budget {} + worst prefill {} + KV transfer {} (its only work is KV in transit, which may wait for the prefill's compute and the transfer)",
            s(p.stall_budget),
            s(p.max_prefill),
            s(p.max_kv_transfer)
        );
    }
    Allowance {
        extra: allow,
        why,
        ruled_out: format!(
            "{} rises during work and has not risen beyond the probes' own tokens for {} > {} it can legitimately stay flat",
            during_work_names(profile),
            s(stalled),
            s(allow)
        ),
    }
}

/// With only counters that rise when a request finishes (SGLang before
/// 0.5.4): the longest legitimate request, plus the longest transfer when
/// the only work is KV in transit.
fn finish_only_allowance(p: &WatchPolicy, silence: &Silence) -> Allowance {
    let Silence {
        lasted: stalled,
        kv_only,
        ..
    } = *silence;
    let mut allow = p.max_request();
    if kv_only {
        allow += p.max_kv_transfer;
    }
    Allowance {
        extra: allow,
        why: format!(
            "stall budget {} + the longest legitimate request {} (worst prefill {} + worst generation {}); this engine exposes no counter that rises during work",
            s(p.stall_budget),
            s(p.max_request()),
            s(p.max_prefill),
            s(p.max_generation)
        ),
        ruled_out: format!(
            "no request finished for {}, longer than any legitimate prefill plus generation",
            s(stalled)
        ),
    }
}

/// A stall past its allowance is a wedge: of the KV transfer when KV in
/// transit is the engine's only work; partial when the watch's own probe
/// was answered during it (the engine serves a probe but not its requests).
fn stall_wedge(
    f: &Scrape,
    p: &WatchPolicy,
    silence: &Silence,
    ruled_out: String,
    line: String,
    last_probe_ok: Option<Instant>,
) -> Finding {
    let queues = &f.queues;
    let Silence {
        since: silent_since,
        lasted: stalled,
        kv_only,
    } = *silence;
    let partial = last_probe_ok.is_some_and(|t| t > silent_since);
    let mut ruled = vec![ruled_out];
    if kv_only {
        ruled.push(format!(
            "its only work is KV in transit ({queues}) for longer than the worst prefill {} plus the longest transfer {}",
            s(p.max_prefill),
            s(p.max_kv_transfer)
        ));
    }
    if partial {
        ruled.push(format!(
            "the watch's own short probe was answered during the stall: the engine serves a probe but not its {queues}"
        ));
    }
    let evidence = WedgeEvidence {
        kind: if kv_only {
            WedgeKind::KvTransfer
        } else if partial {
            WedgeKind::PartialStall
        } else {
            WedgeKind::Stall
        },
        onset: silent_since,
        silent_ms: ms(stalled),
        ruled_out: ruled,
    };
    let reason = format!(
        "{line}: {}",
        if partial {
            "wedged (partial: probes pass, real requests stall)"
        } else {
            "wedged"
        }
    );
    Finding::wedged(reason, evidence)
}

/// Health that stopped answering 200 after it had in this watch.
struct BadHealth {
    since: Instant,
    lasted: Duration,
    /// Beyond the stall budget: the worst prefill while an engine whose
    /// health waits for its scheduler has work.
    allowance: Duration,
    /// "503", or "no answer".
    last_status: String,
}

/// The health rule: health answered 200 earlier in this watch, has not for
/// the stall budget while /metrics answers, and nothing progressed since it
/// failed — a wedge. SGLang's health runs through the scheduler and answers
/// 503 during an honest prefill over 20 s (sgl-project/sglang#22511), so
/// with work present the worst prefill is allowed too. Bad health short of
/// that leaves the unit stalled.
fn health_gone_bad(f: &Scrape, p: &WatchPolicy, now: Instant, last_probe_ok: Option<Instant>) -> Option<Finding> {
    let Scrape {
        u,
        last,
        m,
        profile,
        gpu_idle,
        ..
    } = f;
    let bad = u.health_bad_since?;
    let bad_for = now.saturating_duration_since(bad);
    let busy = m.in_flight() > 0.0 && !gpu_idle;
    let scheduler = profile.health_waits_for_scheduler();
    let allowance = match scheduler {
        Some(_) if busy => p.max_prefill,
        _ => Duration::ZERO,
    };
    let last_status = if last.health_status == 0 {
        "no answer".to_string()
    } else {
        last.health_status.to_string()
    };
    let health = BadHealth {
        since: bad,
        lasted: bad_for,
        allowance,
        last_status,
    };
    let progressed = u.progressed_after(bad);
    if bad_for >= p.stall_budget + allowance && !progressed {
        return Some(health_wedge(f, p, &health, last_probe_ok));
    }
    if bad_for >= p.stall_budget {
        return Some(health_stalled(f, p, &health, progressed));
    }
    None
}

/// Health gone bad past its allowance with nothing progressing: a wedge,
/// partial when the watch's own probe was answered meanwhile.
fn health_wedge(f: &Scrape, p: &WatchPolicy, health: &BadHealth, last_probe_ok: Option<Instant>) -> Finding {
    let Scrape { u, queues, .. } = f;
    let BadHealth {
        since: bad,
        lasted: bad_for,
        allowance,
        ref last_status,
    } = *health;
    let mut ruled = vec![
        health_meaning(f),
        format!("no counter rose in the {} since health failed", s(bad_for)),
    ];
    if allowance > Duration::ZERO {
        ruled.push(format!(
            "with {queues} a prefill may keep health failing for at most the worst prefill {}; that has passed",
            s(p.max_prefill)
        ));
    }
    // Probes answered while health failed: the engine serves a short
    // probe but not its real requests.
    let window = u.silent_since().map_or(bad, |t| t.min(bad));
    let partial = last_probe_ok.is_some_and(|t| t > window);
    if partial {
        ruled.push(format!(
            "the watch's own short probe was answered meanwhile: the engine serves a probe but not its {queues}"
        ));
    }
    let evidence = WedgeEvidence {
        kind: if partial {
            WedgeKind::PartialStall
        } else {
            WedgeKind::HealthGoneBad
        },
        onset: bad,
        silent_ms: ms(bad_for),
        ruled_out: ruled,
    };
    let reason = format!(
        "{}: health answered 200 earlier but has not for {} (last: {}) while /metrics answers ({queues}) and nothing progressed since (allowed: stall budget {}{})",
        u.unit,
        s(bad_for),
        last_status,
        s(p.stall_budget),
        if allowance > Duration::ZERO {
            format!(" + worst prefill {} while work is present", s(p.max_prefill))
        } else {
            String::new()
        }
    );
    Finding::wedged(reason, evidence)
}

/// What a failing health means for this engine's profile: SGLang's runs a
/// generation through the scheduler, vLLM's fails only once its engine core
/// has died.
fn health_meaning(f: &Scrape) -> String {
    let Scrape { engine, profile, .. } = f;
    match profile.health {
        Health::ThroughScheduler { timeout_ms, .. } => format!(
            "{} health runs a generation through the scheduler and fails after {} without scheduler output",
            engine.as_str(),
            s(Duration::from_millis(timeout_ms))
        ),
        Health::EngineAlive => format!("{} health fails only once the engine core has died", engine.as_str()),
        Health::RouterProcess => "a router's health".into(),
    }
}

/// Health bad past the stall budget, short of a wedge: the engine works
/// (its counters rose since) or a prefill may still hold its health.
fn health_stalled(f: &Scrape, p: &WatchPolicy, health: &BadHealth, progressed: bool) -> Finding {
    let Scrape { u, queues, .. } = f;
    let BadHealth {
        lasted: bad_for,
        ref last_status,
        ..
    } = *health;
    Finding::new(
        UnitState::Stalled,
        if progressed {
            format!(
                "{}: health has not answered 200 for {} (last: {last_status}) but counters rose since: the engine works",
                u.unit,
                s(bad_for)
            )
        } else {
            format!(
                "{}: health has not answered 200 for {} (last: {last_status}) with {queues}: an engine busy with a prefill answers health late; within the worst prefill {}",
                u.unit,
                s(bad_for),
                s(p.max_prefill)
            )
        },
    )
}

/// With no rule holding: serving when the unit progressed within the idle
/// probe interval, else idle (liveness unproven by this unit alone).
fn serving_or_idle(u: &UnitTrack, p: &WatchPolicy, now: Instant) -> UnitState {
    let recent = u
        .last_progress
        .is_some_and(|t| now.saturating_duration_since(t) < p.idle_probe_interval);
    if recent { UnitState::Serving } else { UnitState::Idle }
}

/// The engine's counters that rise during work, as a reason names them
/// ("sglang:realtime_tokens_total").
fn during_work_names(profile: &Profile) -> String {
    profile
        .metrics
        .iter()
        .filter(|m| m.moves == Moves::DuringWork)
        .map(|m| m.name)
        .collect::<Vec<_>>()
        .join(" + ")
}

/// Seed 004: a prefill's KV never reaches its decode. Both PD queues hold
/// requests without a break, no transfer has been seen to land at either end
/// for the budget plus the longest transfer, and the decode progressed with
/// nothing since its wait began. A transfer in the inflight queue when the
/// window opened would have landed within the longest transfer; overlapping
/// honest transfers keep both queues non-empty but land one after another
/// (issue 31).
pub(super) fn kv_transfer_stuck(e: &PairEvidence, p: &WatchPolicy, now: Instant) -> Option<(String, WedgeEvidence)> {
    let fresh: Vec<&UnitTrack> = e
        .units
        .iter()
        .filter(|u| {
            // A unit whose scrape fails (a frozen process) shows queues from
            // before: stale gauges are no evidence of a transfer (its silence
            // is the unresponsive rule's).
            u.last
                .as_ref()
                .is_some_and(|s| s.metrics.is_some() && now.saturating_duration_since(s.at) <= p.stale_after)
        })
        .collect();
    let limit = p.stall_budget + p.max_kv_transfer;
    let latest = |since: Instant, landing: Option<Instant>| landing.map_or(since, |l| l.max(since));
    // (prefill, its inflight since, decode, its KV wait since, onset): the
    // window opens at the later queue's start or the last landing.
    let (prefill, sending, decode, waiting, onset) = fresh
        .iter()
        .filter_map(|pf| pf.inflight_since.map(|t| (*pf, t)))
        .flat_map(|(pf, sending)| {
            fresh.iter().filter(move |dc| dc.unit != pf.unit).filter_map(move |dc| {
                let waiting = dc.kv_wait_since?;
                let onset = latest(latest(sending, pf.last_kv_landing), dc.last_kv_landing).max(waiting);
                (!dc.progressed_after(waiting)).then_some((pf, sending, *dc, waiting, onset))
            })
        })
        .filter(|c| now.saturating_duration_since(c.4) >= limit)
        .min_by_key(|c| c.4)?;
    let silent = now.saturating_duration_since(onset);
    let pm = prefill.last.as_ref().and_then(|s| s.metrics).unwrap_or_default();
    let dm = decode.last.as_ref().and_then(|s| s.metrics).unwrap_or_default();
    let reason = format!(
        "{} has held {} prefilled request(s) sending KV for {} and {} {} waiting for KV for {}, no KV transfer has landed for {} and {} has progressed with nothing since: a KV transfer takes at most {} (allowed: stall budget {} + {}); {}, {}",
        prefill.unit,
        num(pm.prefill_inflight),
        s(now.saturating_duration_since(sending)),
        decode.unit,
        num(dm.decode_transfer),
        s(now.saturating_duration_since(waiting)),
        s(silent),
        decode.unit,
        s(p.max_kv_transfer),
        s(p.stall_budget),
        s(p.max_kv_transfer),
        health_phrase(prefill.last.as_ref().map_or(0, |s| s.health_status)),
        health_phrase(decode.last.as_ref().map_or(0, |s| s.health_status)),
    );
    let evidence = WedgeEvidence {
        kind: WedgeKind::KvTransfer,
        onset,
        silent_ms: ms(silent),
        ruled_out: vec![
            "the prefill finished computing those requests (they are in its inflight queue): no prefill is still running for them"
                .to_string(),
            format!(
                "a legitimate transfer ends within {}; for {} both queues stayed non-empty and none landed: {}'s inflight count never fell, {}'s KV-wait count never fell and its running plus queued count never rose",
                s(p.max_kv_transfer),
                s(silent),
                prefill.unit,
                decode.unit
            ),
            format!("{} finished or generated nothing in that time", decode.unit),
        ],
    };
    Some((reason, evidence))
}

#[cfg(test)]
mod tests {
    use super::super::PairState;
    use super::super::tests::{first_wedged, pair, policy, run_with, sample};
    use super::*;

    /// An engine whose health turns bad for the budget while /metrics answers
    /// and nothing progresses is wedged; one that never answered health yet
    /// (still loading) is not; one whose counters rise while health fails
    /// (SGLang under a long chunked prefill) works.
    #[test]
    fn health_gone_bad_is_wedged_but_loading_and_working_are_not() {
        let p = policy();
        let t0 = Instant::now();
        let mut loading = UnitTrack::new("decode-0", "decode");
        let mut gone = UnitTrack::new("decode-0", "decode");
        let mut working = UnitTrack::new("decode-0", "decode");
        for t in 0..=20u64 {
            let now = t0 + Duration::from_secs(t);
            let mut s = sample(now, 0.0, 0.0, 5.0, 5.0, None);
            s.health_status = 503;
            loading.observe(s.clone(), EngineKind::Sglang);
            let mut w = sample(now, 0.0, 0.0, 5.0 + 100.0 * t as f64, 5.0, None);
            if t == 0 {
                s.health_status = 200;
            } else {
                w.health_status = 503;
            }
            gone.observe(s, EngineKind::Sglang);
            working.observe(w, EngineKind::Sglang);
        }
        let now = t0 + Duration::from_secs(20);
        assert_ne!(assess_unit(&loading, &p, now, None).state, UnitState::Wedged);
        assert_ne!(assess_unit(&working, &p, now, None).state, UnitState::Wedged);
        let a = assess_unit(&gone, &p, now, None);
        assert_eq!(a.state, UnitState::Wedged);
        assert!(
            a.reasons[0].contains("has not for 19.0 s (last: 503)"),
            "{:?}",
            a.reasons
        );
        assert_eq!(a.wedge.unwrap().kind, WedgeKind::HealthGoneBad);
    }

    /// Issue 13's first finding: a serial prefill busy with a 40 s prefill (1
    /// running, counters flat) whose SGLang health answers 503 after 20 s is
    /// not wedged while the worst legitimate prefill has not passed; a health
    /// that stays bad past it with nothing progressing is.
    #[test]
    fn health_503_during_a_long_prefill_is_not_a_wedge() {
        let mut p = policy();
        // Allow longer than the health rule: this test is about health alone.
        p.max_prefill_chunk = Duration::from_secs(900);
        let t0 = Instant::now();
        let mut busy = UnitTrack::new("prefill-0", "prefill");
        for t in 0..=40u64 {
            let mut s = sample(t0 + Duration::from_secs(t), 1.0, 0.0, 5.0, 5.0, None);
            if t >= 20 {
                s.health_status = 503;
            }
            busy.observe(s, EngineKind::Sglang);
        }
        let a = assess_unit(&busy, &p, t0 + Duration::from_secs(40), None);
        assert_ne!(a.state, UnitState::Wedged, "{:?}", a.reasons);
        assert!(
            a.reasons
                .iter()
                .any(|r| r.contains("health has not answered 200 for 20.0 s")),
            "{:?}",
            a.reasons
        );
        // Past stall budget + worst prefill (8 + 200 s) with health still bad: wedged.
        for t in 41..=230u64 {
            let mut s = sample(t0 + Duration::from_secs(t), 1.0, 0.0, 5.0, 5.0, None);
            s.health_status = 503;
            busy.observe(s, EngineKind::Sglang);
        }
        let a = assess_unit(&busy, &p, t0 + Duration::from_secs(230), None);
        assert_eq!(a.state, UnitState::Wedged);
        assert!(
            a.reasons
                .iter()
                .any(|r| r.contains("health answered 200 earlier but has not for 210.0 s")),
            "{:?}",
            a.reasons
        );
    }

    /// vLLM's profile: the prompt counter rises only when a prefill ends and
    /// health never waits for the scheduler. A 150 s prefill with nothing
    /// moving is allowed the whole worst prefill even with a chunk size
    /// configured (vLLM counts nothing per chunk); health 503 is the engine
    /// core dead, a wedge after the budget alone.
    #[test]
    fn vllm_long_prefill_is_allowed_and_dead_health_is_not() {
        let mut p = policy();
        p.engine = EngineKind::Vllm;
        p.max_prefill_chunk = Duration::from_secs(10);
        let t0 = Instant::now();
        let vllm = |at: Instant, running: f64, generated: f64, prompt: f64| Sample {
            at,
            health_status: 200,
            metrics: Some(Metrics {
                running,
                generation_tokens: Some(generated),
                prompt_tokens: Some(prompt),
                engine: Some(EngineKind::Vllm),
                ..Metrics::default()
            }),
            error: String::new(),
        };
        let mut e = pair();
        let out = run_with(&mut e, &p, t0, 200, |t, now| {
            let done = t >= 150;
            [
                vllm(
                    now,
                    if done { 0.0 } else { 1.0 },
                    5.0,
                    if done { 45_000.0 } else { 5.0 },
                ),
                vllm(
                    now,
                    if done { 1.0 } else { 0.0 },
                    5.0 + t.saturating_sub(150) as f64,
                    5.0,
                ),
            ]
        });
        assert!(
            first_wedged(&out).is_none(),
            "{:?}",
            out.iter().find(|a| a.state == PairState::Wedged)
        );
        let mut dead = UnitTrack::new("decode-0", "decode");
        for t in 0..=10u64 {
            let mut s = vllm(t0 + Duration::from_secs(t), 1.0, 5.0, 5.0);
            if t > 0 {
                s.health_status = 503;
            }
            dead.observe(s, EngineKind::Vllm);
        }
        let a = assess_unit(&dead, &p, t0 + Duration::from_secs(10), None);
        assert_eq!(a.state, UnitState::Wedged, "{:?}", a.reasons);
        assert!(a.wedge.unwrap().ruled_out[0].contains("vllm health fails only once the engine core has died"));
    }
}
