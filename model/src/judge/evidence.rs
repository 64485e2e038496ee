//! One conclusion from every layer's evidence (DESIGN.md 16, issue 30).
//!
//! A verdict used to be built in steps: the probe series judged, then the
//! co-restart driver overrode it to `failed` in six places (a unit not
//! running, an unproven xPyD engine, an engine counter that moved, a pair
//! that could not rejoin, a journal that failed, a drain refused), each rule
//! living only in the driver. And the layers nobody read hid failures: an
//! error event inside a stream that answered 200, errors a router retried
//! into a slower success, a labelled engine counter that appears only at its
//! first increment. Now the driver gathers everything into one [`Evidence`]
//! and [`conclude`] turns it into the verdict; nothing changes a verdict
//! after it. The driver may call `conclude` on the evidence gathered so far
//! to decide whether to go on (run the suite, put the pair back): the
//! verdict it reports is `conclude` of all of it.
//!
//! # The rules, written once
//! Layers, from the outside in: the **client** (every request pdwarden sent:
//! its HTTP status, tokens asked and received, `finish_reason`, error events
//! inside a stream, first-token time and gaps, timeouts), the **router** (its
//! own retry and error counters per worker, read before and after), the
//! **engines** (their PD failure counters; a counter not exposed is 0: SGLang
//! declares them as labelled counters, which appear at their first
//! increment) and the **agents** (whether each unit runs under its agent).
//!
//! 1. **An error at any layer is never healthy and never a cold start**: an
//!    error event in a stream, an answer cut short (`abort`, `error`, fewer
//!    tokens than asked without `stop` or `length`), a request the router
//!    retried or a backend error it counted, an engine failure counter that
//!    moved or appeared. The verdict is `failed` (a wedge stays `wedged`),
//!    and the reason names the layer and the numbers.
//! 2. **A complete answer that was only slow is never `wedged`**: a late
//!    first token or long pauses in a stream that then finished is
//!    `over_budget`; `wedged` needs a request that never finished.
//! 3. **A unit not running under its agent is never healthy**, however well
//!    the pair answered (someone else's process may hold its port).
//! 4. **The suite stops at the first step that proves a wedge or a
//!    failure**; the verdict names that step and the steps not run.
//! 5. A journal that could not record a step, a pair that could not be
//!    taken out of its serving router, a healthy pair that could not be put
//!    back: `failed`, saying which.
//! 6. **Wrong output is never healthy** (issue 34): a greedy answer that
//!    differs from its reference where the reference was sure
//!    ([`crate::judge::golden`]) is `failed` however fast it came (a wedge
//!    stays `wedged`); a near-tie is noise, said and allowed. In an xPyD
//!    pair every prefill → decode path answers too, each held to the
//!    reference (or, with none, to the answer most paths gave): a path
//!    that answers wrong, or whose request failed, is `failed` naming its
//!    engines ([`crate::judge::golden::compare_paths`]).
//! 7. Otherwise the start-up and probe rules of [`crate::judge::verdict`]
//!    and the suite's of [`crate::judge::suite`] decide.

use serde::{Deserialize, Serialize};

use crate::judge::golden::{OutputCheck, PathCheck, path_lines};
use crate::judge::suite::{self, StepReport, SuiteStep};
use crate::judge::verdict::{ProbeObservation, ProbePolicy, UnitStartup, Verdict, VerdictKind, judge};

/// Two PD failure counters of one engine at one scrape. `None` for a
/// counter the engine did not expose (it counts as 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineCounts {
    pub transfer_failed: Option<f64>,
    pub bootstrap_failed: Option<f64>,
}

/// The engine layer: one engine's counters before and after pdwarden's
/// requests. `before` is `Some(default)` for an engine this operation
/// started (it counts from nothing); `None` on either side when that
/// scrape failed, so nothing can be said.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineCounters {
    pub unit: String,
    pub role: String,
    pub before: Option<EngineCounts>,
    pub after: Option<EngineCounts>,
}

/// One worker as a router counted it at one scrape.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RouterWorkerCount {
    /// The worker's URL, or its type when the router labels only that.
    pub worker: String,
    pub worker_type: String,
    pub retries: f64,
    pub errors: f64,
}

/// The router layer: one router's counters before and after. A worker
/// absent on a side has counted nothing there (the counters appear at
/// their first increment). `before` is `Some(vec![])` for a router this
/// operation started; `None` on either side when that scrape failed.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterCounters {
    pub unit: String,
    /// The router's metric names for retries and errors, for the reasons.
    pub retries_metric: String,
    pub errors_metric: String,
    pub before: Option<Vec<RouterWorkerCount>>,
    pub after: Option<Vec<RouterWorkerCount>>,
    /// A router this operation started (issue 47): what it counted from its
    /// start until pdwarden's verification began — while it came up with
    /// engines it had not yet health-checked, clients' requests meeting it
    /// then. `before` is then this same scrape (the window is the
    /// verification's); said, never counted against the pair.
    pub starting: Option<Vec<RouterWorkerCount>>,
    /// pdwarden's own requests through it while it was starting (its
    /// readiness generation checks): when its traffic shows no other
    /// request then, what it counted while starting is pdwarden's and
    /// counts.
    pub starting_own: u32,
    /// Its traffic at the window's start and end (issue 47), when it
    /// exposes it: every generation request it took, clients' and
    /// pdwarden's alike, and those it failed to their client.
    pub traffic: Option<(RouterTraffic, RouterTraffic)>,
}

/// A router's own counts of the generation requests it took and of those
/// it failed to their client (`pdwarden_engines::router_traffic`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RouterTraffic {
    pub requests: f64,
    pub failed: f64,
}

/// An xPyD engine the router never sent a request to, and the PD request
/// pdwarden sent straight to it.
#[derive(Debug, Clone, PartialEq)]
pub struct UnreachedProof {
    /// What was proven ("decode-1", "decode-1 (and prefill-1)").
    pub target: String,
    pub prefill: String,
    pub decode: String,
    /// `None`: the direct request answered.
    pub error: Option<String>,
}

/// The agent layer: a unit of the pair its agent says is not running.
#[derive(Debug, Clone, PartialEq)]
pub struct NotRunning {
    pub unit: String,
    /// How it ended, in the agent's words ("exited: exit status 1").
    pub how: String,
}

/// Taking the pair out of its serving router and putting it back.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DrainEvidence {
    /// The pair could not be taken out, and nothing was touched.
    pub refused: bool,
    /// A pair that was to be put back (it concluded healthy) was not.
    pub not_put_back: bool,
    /// What the drain and rejoin did, for the report.
    pub lines: Vec<String>,
}

/// Everything one operation learned, from every layer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Evidence {
    /// The agents' start-up reports of the units restarted, in order
    /// (none for a verification), including units never started.
    pub startups: Vec<UnitStartup>,
    /// The probe series through the router (client layer).
    pub probes: Vec<ProbeObservation>,
    /// xPyD engines proven by a direct PD request.
    pub unreached: Vec<UnreachedProof>,
    /// The suite's steps, each judged from its raw samples, in order.
    pub suite: Vec<StepReport>,
    /// Steps not run because an earlier one proved a wedge or a failure.
    pub suite_not_run: Vec<SuiteStep>,
    pub engines: Vec<EngineCounters>,
    pub routers: Vec<RouterCounters>,
    pub not_running: Vec<NotRunning>,
    pub drain: DrainEvidence,
    /// The output layer: the greedy answer against its reference.
    pub output: Option<OutputCheck>,
    /// An xPyD pair's output along each prefill → decode path.
    pub paths: Vec<PathCheck>,
    /// The journal could not record a step: the operation stopped there.
    pub journal_error: Option<String>,
    /// Lines that change nothing (a resumed operation's note).
    pub notes: Vec<String>,
}

/// The verdict from all the evidence (the module doc's rules).
pub fn conclude(e: &Evidence, policy: &ProbePolicy) -> Verdict {
    if e.drain.refused {
        let mut reasons = vec![
            "not restarted: the pair could not be taken out of its serving router, and nothing was touched".into(),
        ];
        reasons.extend(e.drain.lines.iter().cloned());
        reasons.extend(e.notes.iter().cloned());
        if let Some(err) = &e.journal_error {
            reasons.insert(0, format!("stopped: the journal could not record a step ({err})"));
        }
        return Verdict {
            kind: VerdictKind::Failed,
            reasons,
        };
    }
    let mut v = judge(&e.startups, &e.probes, policy);
    // xPyD engines the router did not reach, proven directly.
    let mut proofs = Vec::new();
    for p in &e.unreached {
        match &p.error {
            None => proofs.push(format!(
                "{} was not reached through the router (its policy sent the verification elsewhere); a PD request straight from {} to {} reached it",
                p.target, p.prefill, p.decode
            )),
            Some(err) => {
                v.kind = worst_of_error(v.kind);
                proofs.insert(
                    0,
                    format!(
                        "{} is unproven: the router never sent it a request, and a PD request straight from {} to {} failed: {err}",
                        p.target, p.prefill, p.decode
                    ),
                );
            }
        }
    }
    v.reasons.extend(proofs);
    // The suite (it ran only after a healthy series).
    if !e.suite.is_empty() {
        v = suite::overall(v, &e.suite);
        if let Some(last) = e.suite.last().filter(|_| !e.suite_not_run.is_empty()) {
            v.reasons.push(format!(
                "the suite stopped at its {} step, which proved the pair {}: {} not run against it",
                last.step.title(),
                last.fails_as.unwrap_or(VerdictKind::Failed),
                e.suite_not_run.iter().map(|s| s.title()).collect::<Vec<_>>().join(", ")
            ));
        }
    }
    // The layers a client never sees: what the router and the engines counted.
    // The engines' own count first: it names the cause, the router's the symptom.
    let mut hidden = engine_failures(&e.engines);
    hidden.extend(router_failures(&e.routers));
    if !hidden.is_empty() {
        v.kind = worst_of_error(v.kind);
        v.reasons.splice(0..0, hidden);
    }
    v.reasons.extend(engine_notes(&e.engines));
    v.reasons.extend(router_notes(&e.routers));
    // Whose traffic the window held (issue 47): clients' failures beyond
    // the pair's own rate before are a finding; the rest is said.
    let own = pdwardens_requests(e);
    for r in &e.routers {
        match traffic_of(r, own) {
            Some((line, true)) => {
                v.kind = worst_of_error(v.kind);
                v.reasons.insert(0, line);
            }
            Some((line, false)) => v.reasons.push(line),
            None => {}
        }
    }
    // The agent layer.
    if !e.not_running.is_empty() {
        if v.kind.is_healthy() {
            v.kind = VerdictKind::Failed;
        }
        let lines: Vec<String> = e
            .not_running
            .iter()
            .filter(|n| {
                // Already told (a start-up that ended the same way).
                let detail = n.how.strip_prefix("exited: ").unwrap_or("");
                detail.is_empty() || !v.reasons.iter().any(|r| r.contains(detail))
            })
            .map(|n| format!("{} is not running: {} (its agent's report)", n.unit, n.how))
            .collect();
        v.reasons.splice(0..0, lines);
    }
    // The output layer: the right tokens, not only tokens in time — along
    // every prefill → decode path of an xPyD pair, too.
    let (wrong_paths, fine_paths) = path_lines(&e.paths);
    if !wrong_paths.is_empty() {
        v.kind = worst_of_error(v.kind);
        v.reasons.splice(0..0, wrong_paths);
    }
    v.reasons.extend(fine_paths);
    if let Some(check) = e.output.as_ref().filter(|c| !c.timed_out()) {
        if check.is_wrong_output() {
            v.kind = worst_of_error(v.kind);
            v.reasons.insert(0, check.line());
        } else {
            v.reasons.push(check.line());
        }
    }
    // A greedy request that timed out (issue 47): a stall after the pair
    // answered, as a probe's timeout after answering is — never wrong
    // output.
    let timed_out: Vec<String> = e
        .output
        .iter()
        .filter(|c| c.timed_out())
        .map(OutputCheck::line)
        .chain(e.paths.iter().filter(|p| p.check.timed_out()).map(PathCheck::line))
        .collect();
    if !timed_out.is_empty() {
        if matches!(
            v.kind,
            VerdictKind::Healthy | VerdictKind::HealthyAfterColdStart | VerdictKind::OverBudget
        ) {
            v.kind = VerdictKind::Wedged;
        }
        v.reasons.splice(0..0, timed_out);
    }
    if e.drain.not_put_back && v.kind.is_healthy() {
        v.kind = VerdictKind::Failed;
    }
    v.reasons.extend(e.drain.lines.iter().cloned());
    v.reasons.extend(e.notes.iter().cloned());
    if let Some(err) = &e.journal_error {
        v.kind = VerdictKind::Failed;
        v.reasons
            .insert(0, format!("stopped: the journal could not record a step ({err})"));
    }
    v
}

/// An error seen at some layer: a wedge stays a wedge, everything else is
/// `failed` — never healthy, never a cold start, never merely slow.
fn worst_of_error(kind: VerdictKind) -> VerdictKind {
    if kind == VerdictKind::Wedged {
        kind
    } else {
        VerdictKind::Failed
    }
}

/// Rule 1 for the router layer: every worker whose retries or errors rose.
/// sglang-router labels its counters by worker type only and counts a
/// failed PD request on both sides (observed on 0.3.2: a decode's 500 moves
/// the prefill's counters by as much): a prefill whose rise only mirrors the
/// decode's is said so, not blamed on its own.
fn router_failures(routers: &[RouterCounters]) -> Vec<String> {
    let mut out = Vec::new();
    let from_start: Vec<RouterWorkerCount> = Vec::new();
    for r in routers {
        let (Some(before), Some(after)) = (&r.before, &r.after) else {
            continue;
        };
        // Nobody but pdwarden sent while a restarted router came up: what it
        // counted then is pdwarden's, and counts (from its start).
        let before = if starting_is_pdwardens(r) { &from_start } else { before };
        // A counter below its value at the window's start belongs to a new
        // router process (issue 47): it counts from 0.
        let start_of = |w: &RouterWorkerCount| {
            let then = before
                .iter()
                .find(|b| b.worker == w.worker && b.worker_type == w.worker_type);
            let (retries0, errors0) = then.map_or((0.0, 0.0), |b| (b.retries, b.errors));
            (
                if w.retries < retries0 { 0.0 } else { retries0 },
                if w.errors < errors0 { 0.0 } else { errors0 },
            )
        };
        let rise = |w: &RouterWorkerCount| {
            let (retries0, errors0) = start_of(w);
            (w.retries - retries0, w.errors - errors0)
        };
        let typed_only = |w: &RouterWorkerCount| w.worker.is_empty() || w.worker == w.worker_type;
        let decode_rise = after
            .iter()
            .find(|w| w.worker_type == "decode" && typed_only(w))
            .map(rise);
        let mut mirrored = false;
        for w in after {
            if w.worker_type == "prefill" && typed_only(w) && decode_rise == Some(rise(w)) {
                mirrored = true;
                continue;
            }
            let (retries0, errors0) = start_of(w);
            let retried = w.retries - retries0;
            let errored = w.errors - errors0;
            if retried <= 0.0 && errored <= 0.0 {
                continue;
            }
            let who = match (w.worker.as_str(), w.worker_type.as_str()) {
                (w, "") => w.to_string(),
                ("", t) => format!("its {t} workers"),
                (w, t) if w == t => format!("its {t} workers"),
                (w, t) => format!("{t} {w}"),
            };
            let mut what = Vec::new();
            if errored > 0.0 {
                what.push(format!(
                    "{errored} backend error{} ({} {errors0} → {})",
                    if errored == 1.0 { "" } else { "s" },
                    r.errors_metric,
                    w.errors
                ));
            }
            if retried > 0.0 {
                what.push(format!(
                    "{retried} retr{} ({} {retries0} → {})",
                    if retried == 1.0 { "y" } else { "ies" },
                    r.retries_metric,
                    w.retries
                ));
            }
            out.push(format!(
                "router {}: counted {} from {who} while pdwarden's requests ran; a retry hides an error from the client, and an error is never a cold start",
                r.unit,
                what.join(" and ")
            ));
        }
        if mirrored && let Some(line) = out.last_mut() {
            line.push_str(
                " (its prefill workers' counters rose by as much: it counts a failed PD request on both sides)",
            );
        }
    }
    out
}

/// Whether what a restarted router counted while it came up is pdwarden's
/// own: its traffic then shows no request but pdwarden's readiness checks
/// (or it exposes no traffic: nothing shows a client, and the count is not
/// set aside on a guess).
fn starting_is_pdwardens(r: &RouterCounters) -> bool {
    r.starting.is_some()
        && match r.traffic {
            Some((at_verification, _)) => at_verification.requests <= f64::from(r.starting_own),
            None => true,
        }
}

/// What the router layer says without counting it (issue 47): a counter
/// that fell inside the window (a new router process: its counts are
/// counted from 0), and what a router this operation started counted before
/// pdwarden's verification began.
fn router_notes(routers: &[RouterCounters]) -> Vec<String> {
    let mut out = Vec::new();
    for r in routers {
        if let (Some(before), Some(after)) = (&r.before, &r.after) {
            let fell: Vec<String> = after
                .iter()
                .filter_map(|w| {
                    let b = before
                        .iter()
                        .find(|b| b.worker == w.worker && b.worker_type == w.worker_type)?;
                    (w.retries < b.retries || w.errors < b.errors).then(|| {
                        format!(
                            "{} {} → {}, {} {} → {}",
                            r.retries_metric, b.retries, w.retries, r.errors_metric, b.errors, w.errors
                        )
                    })
                })
                .collect();
            if !fell.is_empty() {
                out.push(format!(
                    "router {}: its counters fell during the verification ({}): a new router process; counted from 0",
                    r.unit,
                    fell.join("; ")
                ));
            }
        }
        if let Some(starting) = r.starting.as_ref().filter(|_| !starting_is_pdwardens(r)) {
            // sglang-router counts a failed PD request on both sides: the
            // decode side's count, else the largest.
            let side = |t: &str| {
                starting
                    .iter()
                    .filter(|w| w.worker_type == t)
                    .fold((0.0, 0.0), |a, w| (a.0 + w.retries, a.1 + w.errors))
            };
            let (retries, errors) = match side("decode") {
                (0.0, 0.0) => side("prefill"),
                d => d,
            };
            if retries > 0.0 || errors > 0.0 {
                out.push(format!(
                    "router {}: {retries} retries and {errors} backend errors while it was starting, before pdwarden's verification began, among {} requests of which {} were pdwarden's readiness checks (clients' requests meeting engines not yet in its rotation; not attributable to either): said, not counted — the verification's own requests are judged",
                    r.unit,
                    r.traffic.map_or(0.0, |t| t.0.requests),
                    r.starting_own
                ));
            }
        }
    }
    out
}

/// The requests pdwarden itself sent through the pair's router during the
/// verification: its probes, the suite's requests and the greedy request.
fn pdwardens_requests(e: &Evidence) -> f64 {
    let suite: usize = e.suite.iter().map(|s| s.samples.len()).sum();
    (e.probes.len() + suite + usize::from(e.output.is_some())) as f64
}

/// Exact one-sided test: are `failed` of `requests` more than a rate of
/// `p0` gives, at [`CLIENT_FAILURE_ALPHA`]?
fn beyond_rate(failed: f64, requests: f64, p0: f64) -> bool {
    use statrs::distribution::{Binomial, DiscreteCDF};
    let (k, n) = (failed.round() as u64, requests.round() as u64);
    if k == 0 || n == 0 || k > n {
        return false;
    }
    match Binomial::new(p0.clamp(1e-9, 1.0 - 1e-9), n) {
        // P(X >= k) = 1 - P(X <= k - 1).
        Ok(b) => 1.0 - b.cdf(k - 1) < CLIENT_FAILURE_ALPHA,
        Err(_) => false,
    }
}

/// Whether clients' failures beyond the pair's own rate fail the pair
/// (issue 47): not until the routers' error counters are shown to count
/// what clients saw (see `traffic_of`).
const ROSE_IS_A_FINDING: bool = false;

/// How unlikely the window's client failures must be at the pair's own
/// rate before the operation to count as a rise (one-sided, exact).
pub const CLIENT_FAILURE_ALPHA: f64 = 0.001;

/// One router's traffic in the window, in words, and whether its clients'
/// failures rose beyond the pair's own rate before (a finding). `own`:
/// pdwarden's requests through it. A router whose counters fell (a new
/// process) counts from 0.
fn traffic_of(r: &RouterCounters, own: f64) -> Option<(String, bool)> {
    let (from, to) = r.traffic?;
    let (requests0, failed0) = if to.requests < from.requests || to.failed < from.failed {
        (0.0, 0.0)
    } else {
        (from.requests, from.failed)
    };
    let requests = to.requests - requests0;
    let failed = to.failed - failed0;
    let others = (requests - own).max(0.0);
    let mut line = format!(
        "router {} during pdwarden's verification: {requests} generation requests ({} of them pdwarden's, {others} others': clients'), {failed} failed to their client",
        r.unit,
        own.min(requests)
    );
    if others == 0.0 {
        line.push_str("; no client traffic: every retry and error it counted is pdwarden's own");
        return Some((line, false));
    }
    // The pair's own rate before (smoothed: a router that never failed a
    // request still allows that one might).
    let p0 = (failed0 + 1.0) / (requests0 + 2.0);
    let rose = failed >= 2.0 && beyond_rate(failed, requests, p0);
    // Said, not yet a finding: whether the router's error counter counts
    // the failures its clients saw or also attempts it retried is not
    // established (sglang-router 0.3.2 counted 40 errors in a window where
    // the scenario's client saw 9 failures), and a wrong verdict is worse
    // than none. `ROSE_IS_A_FINDING` makes it one once it is.
    line.push_str(&format!(
        "; before: {failed0} of {requests0} failed — {}",
        if rose {
            "the clients' failures rose beyond the pair's own rate (exact test): said, not yet counted against the pair"
        } else {
            "within the pair's own rate"
        }
    ));
    Some((line, rose && ROSE_IS_A_FINDING))
}

/// What the engine layer says without counting it: a failure counter that
/// fell inside the window — the engine restarted (a new process) while
/// pdwarden's requests ran; its new process's failures are counted from 0.
fn engine_notes(engines: &[EngineCounters]) -> Vec<String> {
    engines
        .iter()
        .filter_map(|e| {
            let (before, after) = (e.before?, e.after?);
            let fell = |t: Option<f64>, n: Option<f64>| matches!((t, n), (Some(t), Some(n)) if n < t);
            (fell(before.transfer_failed, after.transfer_failed) || fell(before.bootstrap_failed, after.bootstrap_failed))
                .then(|| {
                    format!(
                        "{} {}: its failure counters fell while pdwarden's requests ran: a new process (restarted inside the window); its failures are counted from 0",
                        e.role, e.unit
                    )
                })
        })
        .collect()
}

/// Rule 1 for the engine layer: a failure counter that moved, or appeared
/// (absent before: 0). A counter below its value at the window's start
/// belongs to a new process (restarted inside the window, by systemd or its
/// agent): it counts from 0 (issue 47).
fn engine_failures(engines: &[EngineCounters]) -> Vec<String> {
    let mut out = Vec::new();
    for e in engines {
        let (Some(before), Some(after)) = (e.before, e.after) else {
            continue;
        };
        for (what, metric, then, now) in [
            (
                "KV transfers",
                "sglang:num_transfer_failed_reqs_total",
                before.transfer_failed,
                after.transfer_failed,
            ),
            (
                "KV bootstraps",
                "sglang:num_bootstrap_failed_reqs_total",
                before.bootstrap_failed,
                after.bootstrap_failed,
            ),
        ] {
            let fell = matches!((then, now), (Some(t), Some(n)) if n < t);
            let then_n = if fell { 0.0 } else { then.unwrap_or(0.0) };
            let Some(now) = now.filter(|now| *now > then_n) else {
                continue;
            };
            let was = match (then, fell) {
                (Some(n), true) => format!("{n}, then a new process from 0"),
                (Some(n), false) => format!("{n}"),
                (None, _) => "absent (0)".into(),
            };
            out.push(format!(
                "{} {}: {} {what} failed while pdwarden's requests ran ({metric} {was} → {now}); a router that retries hides them from the client",
                e.role,
                e.unit,
                now - then_n
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::judge::suite::{
        BudgetInputs, RequestSample, SampleOutcome, StepStatus, derive_budgets, judge_concurrency,
        judge_long_generation,
    };
    use crate::judge::verdict::{ColdAllowance, ReadinessPhase};

    fn policy(cold_start_possible: bool) -> ProbePolicy {
        ProbePolicy {
            warm_budget_ms: 1_000,
            cold_allowance: ColdAllowance::Configured {
                ms: 30_000,
                why: String::new(),
            },
            cold_start_possible,
            warm_probes: 3,
            cold_answers: 1,
            fresh_engine_answers: Vec::new(),
        }
    }

    fn startup(unit: &str, role: &str) -> UnitStartup {
        UnitStartup {
            unit: unit.into(),
            role: role.into(),
            furthest: Some(ReadinessPhase::Generating),
            exited: false,
            lost_contact: false,
            last_detail: String::new(),
            waited_ms: 1_000,
            failed_checks: Vec::new(),
        }
    }

    fn ok(latency_ms: u64) -> ProbeObservation {
        ProbeObservation::Ok { latency_ms, tokens: 8 }
    }

    fn budgets() -> crate::judge::suite::SuiteBudgets {
        derive_budgets(&BudgetInputs {
            warm_budget_ms: 1_000,
            probe_max_tokens: 8,
            warm_answers_ms: vec![100, 110, 120],
            history_tpot_us: Vec::new(),
            history_batching: Vec::new(),
            ttft_override_ms: None,
            tpot_override_ms: None,
            gap_override_ms: None,
            slowest_override_ms: None,
            tpot_history_ratio: 2.0,
            min_batching_gain: 2.0,
            engines_batch: true,
            floor_ms: 50,
        })
    }

    /// A streamed sample of `n` tokens, one every `gap` ms after `ttft`.
    fn streamed(ttft: u64, gap: u64, n: u32, asked: u32, finish: &str, outcome: SampleOutcome) -> RequestSample {
        let times: Vec<u64> = (0..u64::from(n)).map(|i| ttft + i * gap).collect();
        RequestSample {
            index: 0,
            outcome,
            latency_ms: times.last().copied().unwrap_or(ttft) + 1,
            ttft_ms: times.first().copied().unwrap_or(0),
            tokens: n,
            error: String::new(),
            aborted: false,
            token_times_ms: times,
            request_id: String::new(),
            tokens_asked: asked,
            finish_reason: finish.into(),
            stream_error: String::new(),
        }
    }

    /// A co-restarted 1P1D pair that answered every probe warm and passed
    /// its suite: healthy. The base every property breaks one layer of.
    fn healthy_evidence() -> Evidence {
        let b = budgets();
        Evidence {
            startups: vec![startup("prefill-0", "prefill"), startup("decode-0", "decode")],
            probes: vec![ok(120), ok(110), ok(115)],
            suite: vec![
                judge_long_generation(vec![streamed(100, 5, 64, 64, "length", SampleOutcome::Ok)], &b),
                judge_concurrency(
                    (0..4)
                        .map(|i| RequestSample {
                            index: i,
                            ..streamed(100, 1, 8, 8, "length", SampleOutcome::Ok)
                        })
                        .collect(),
                    &b,
                ),
            ],
            engines: vec![EngineCounters {
                unit: "decode-0".into(),
                role: "decode".into(),
                before: Some(EngineCounts::default()),
                after: Some(EngineCounts::default()),
            }],
            routers: vec![RouterCounters {
                starting: None,
                starting_own: 0,
                traffic: None,
                unit: "router".into(),
                retries_metric: "smg_worker_retries_total".into(),
                errors_metric: "smg_worker_errors_total".into(),
                before: Some(Vec::new()),
                after: Some(Vec::new()),
            }],
            ..Evidence::default()
        }
    }

    #[test]
    fn the_base_evidence_is_healthy() {
        let v = conclude(&healthy_evidence(), &policy(true));
        assert_eq!(v.kind, VerdictKind::Healthy, "{:?}", v.reasons);
    }

    fn decode_count(retries: f64) -> RouterWorkerCount {
        RouterWorkerCount {
            worker: "decode".into(),
            worker_type: "decode".into(),
            retries,
            errors: 0.0,
        }
    }

    /// Issue 47: a co-restart under client traffic: the restarted router
    /// retried requests while it came up (before pdwarden's verification
    /// began), clients' among them: not attributable, said, not counted; a
    /// retry inside the window still fails the pair. With nobody but
    /// pdwarden's readiness check sending then (issue 30's decode answering
    /// 500 to its first generations), or no traffic shown, they are
    /// pdwarden's own and count.
    #[test]
    fn what_a_restarted_router_counted_while_starting_counts_only_when_it_is_pdwardens() {
        let mut e = healthy_evidence();
        let traffic = |at: f64, end: f64| {
            Some((
                RouterTraffic {
                    requests: at,
                    failed: 0.0,
                },
                RouterTraffic {
                    requests: end,
                    failed: 0.0,
                },
            ))
        };
        e.routers[0].starting = Some(vec![decode_count(6.0)]);
        e.routers[0].starting_own = 1;
        e.routers[0].before = Some(vec![decode_count(6.0)]);
        e.routers[0].after = Some(vec![decode_count(6.0)]);
        e.routers[0].traffic = traffic(40.0, 70.0);
        let v = conclude(&e, &policy(true));
        assert_eq!(v.kind, VerdictKind::Healthy, "{:?}", v.reasons);
        assert!(
            v.reasons.iter().any(|r| r.starts_with(
                "router router: 6 retries and 0 backend errors while it was starting, before pdwarden's verification began, among 40 requests of which 1 were pdwarden's"
            )),
            "{:?}",
            v.reasons
        );
        e.routers[0].after = Some(vec![decode_count(7.0)]);
        let v = conclude(&e, &policy(true));
        assert_eq!(v.kind, VerdictKind::Failed, "{:?}", v.reasons);
        assert!(v.reasons[0].contains("counted 1 retry"), "{:?}", v.reasons);
        // Only pdwarden's readiness check while it came up: its own.
        e.routers[0].after = Some(vec![decode_count(6.0)]);
        e.routers[0].traffic = traffic(1.0, 9.0);
        let v = conclude(&e, &policy(true));
        assert_eq!(v.kind, VerdictKind::Failed, "{:?}", v.reasons);
        assert!(v.reasons[0].contains("counted 6 retries"), "{:?}", v.reasons);
        // No traffic shown: not set aside on a guess.
        e.routers[0].traffic = None;
        assert_eq!(conclude(&e, &policy(true)).kind, VerdictKind::Failed);
    }

    /// Issue 47: whose traffic the window held. Clients sending: their
    /// failures at the pair's own rate are said; beyond it, a finding. No
    /// client: every count is pdwarden's.
    #[test]
    fn the_windows_traffic_is_attributed_and_clients_failures_judged_against_the_pairs_rate() {
        let traffic = |from: (f64, f64), to: (f64, f64)| {
            Some((
                RouterTraffic {
                    requests: from.0,
                    failed: from.1,
                },
                RouterTraffic {
                    requests: to.0,
                    failed: to.1,
                },
            ))
        };
        let mut e = healthy_evidence();
        let own = pdwardens_requests(&e);
        assert_eq!(own, 3.0 + 5.0, "3 probes and the suite's 5 requests");
        // 300 requests in the window, 1 failed, at the pair's rate (2 of 1000).
        e.routers[0].traffic = traffic((1_000.0, 2.0), (1_300.0, 3.0));
        let v = conclude(&e, &policy(true));
        assert_eq!(v.kind, VerdictKind::Healthy, "{:?}", v.reasons);
        let line = v
            .reasons
            .iter()
            .find(|r| r.contains("during pdwarden's verification"))
            .unwrap();
        assert!(
            line.contains("300 generation requests (8 of them pdwarden's, 292 others': clients'), 1 failed"),
            "{line}"
        );
        assert!(line.contains("within the pair's own rate"), "{line}");
        // 30 of 300 failed, against 2 of 1000 before: a rise, said (not
        // yet counted: the counter's meaning is not established).
        e.routers[0].traffic = traffic((1_000.0, 2.0), (1_300.0, 32.0));
        let v = conclude(&e, &policy(true));
        assert_eq!(v.kind, VerdictKind::Healthy, "{:?}", v.reasons);
        assert!(
            v.reasons
                .iter()
                .any(|r| r.contains("rose beyond the pair's own rate (exact test): said")),
            "{:?}",
            v.reasons
        );
        assert!(beyond_rate(30.0, 300.0, 3.0 / 1_002.0));
        assert!(!beyond_rate(30.0, 300.0, 101.0 / 1_002.0));
        // The same failures where the pair always failed that often: said.
        e.routers[0].traffic = traffic((1_000.0, 100.0), (1_300.0, 130.0));
        assert_eq!(conclude(&e, &policy(true)).kind, VerdictKind::Healthy);
        // Nobody but pdwarden: said so.
        e.routers[0].traffic = traffic((0.0, 0.0), (8.0, 0.0));
        let v = conclude(&e, &policy(true));
        assert!(
            v.reasons.iter().any(|r| r.contains("no client traffic")),
            "{:?}",
            v.reasons
        );
        // A router restarted inside the window: from 0.
        e.routers[0].traffic = traffic((1_000.0, 2.0), (300.0, 0.0));
        let v = conclude(&e, &policy(true));
        assert!(
            v.reasons.iter().any(|r| r.contains("300 generation requests")),
            "{:?}",
            v.reasons
        );
    }

    /// Issue 47: a counter that falls inside the window belongs to a new
    /// process: counted from 0 (its failures are not hidden by a negative
    /// difference), and said.
    #[test]
    fn a_counter_that_falls_is_a_new_process_counted_from_0() {
        // The router: 10 retries before, its new process 2 since.
        let mut e = healthy_evidence();
        e.routers[0].before = Some(vec![decode_count(10.0)]);
        e.routers[0].after = Some(vec![decode_count(2.0)]);
        let v = conclude(&e, &policy(true));
        assert_eq!(v.kind, VerdictKind::Failed, "{:?}", v.reasons);
        assert!(v.reasons[0].contains("counted 2 retries"), "{:?}", v.reasons);
        assert!(
            v.reasons
                .iter()
                .any(|r| r.contains("its counters fell") && r.contains("a new router process")),
            "{:?}",
            v.reasons
        );
        // An engine: 5 transfer failures before, its new process 1 since.
        let mut e = healthy_evidence();
        e.engines[0].before = Some(EngineCounts {
            transfer_failed: Some(5.0),
            bootstrap_failed: Some(0.0),
        });
        e.engines[0].after = Some(EngineCounts {
            transfer_failed: Some(1.0),
            bootstrap_failed: Some(0.0),
        });
        let v = conclude(&e, &policy(true));
        assert_eq!(v.kind, VerdictKind::Failed, "{:?}", v.reasons);
        assert!(
            v.reasons[0].contains("1 KV transfers failed") && v.reasons[0].contains("5, then a new process from 0"),
            "{:?}",
            v.reasons
        );
        assert!(
            v.reasons
                .iter()
                .any(|r| r.contains("decode decode-0: its failure counters fell")),
            "{:?}",
            v.reasons
        );
        // Fell to 0 and stayed: said, nothing counted.
        e.engines[0].after = Some(EngineCounts {
            transfer_failed: Some(0.0),
            bootstrap_failed: Some(0.0),
        });
        let v = conclude(&e, &policy(true));
        assert_eq!(v.kind, VerdictKind::Healthy, "{:?}", v.reasons);
    }

    /// The finding: the decode answered 500 to the first
    /// generations after the restart, the router retried them, the client
    /// saw a slower 200 — which the series alone calls a cold start.
    #[test]
    fn router_retried_errors_after_a_restart_are_not_a_cold_start() {
        let mut e = healthy_evidence();
        e.probes = vec![ok(4_000), ok(120), ok(110), ok(115)];
        assert_eq!(
            conclude(&e, &policy(true)).kind,
            VerdictKind::HealthyAfterColdStart,
            "the client layer alone"
        );
        e.routers[0].after = Some(vec![RouterWorkerCount {
            worker: "http://127.0.0.1:30002".into(),
            worker_type: "decode".into(),
            retries: 3.0,
            errors: 3.0,
        }]);
        let v = conclude(&e, &policy(true));
        assert_eq!(v.kind, VerdictKind::Failed, "{:?}", v.reasons);
        assert!(
            v.reasons[0]
                .starts_with("router router: counted 3 backend errors (smg_worker_errors_total 0 → 3) and 3 retries"),
            "{:?}",
            v.reasons
        );
    }

    /// The finding: `verify` of a pair that never failed before
    /// ignored its first KV-transfer failure, because the labelled counter
    /// did not exist before it.
    #[test]
    fn a_counter_that_appears_is_a_failure() {
        let mut e = healthy_evidence();
        e.startups.clear();
        e.engines[0].after = Some(EngineCounts {
            transfer_failed: Some(1.0),
            bootstrap_failed: None,
        });
        let v = conclude(&e, &policy(false));
        assert_eq!(v.kind, VerdictKind::Failed);
        assert!(
            v.reasons[0].contains("sglang:num_transfer_failed_reqs_total absent (0) → 1"),
            "{:?}",
            v.reasons
        );
    }

    /// The finding: a stream that ended early with an error event
    /// and `[DONE]` passed the long-generation step.
    #[test]
    fn an_error_event_inside_a_stream_fails_the_pair() {
        let mut e = healthy_evidence();
        let mut s = streamed(100, 5, 3, 64, "", SampleOutcome::Ok);
        s.stream_error = "Request aborted".into();
        e.suite[0] = judge_long_generation(vec![s], &budgets());
        let v = conclude(&e, &policy(true));
        assert_eq!(v.kind, VerdictKind::Failed, "{:?}", v.reasons);
        assert!(
            v.reasons[0].contains("an error event inside the stream after 3 tokens"),
            "{:?}",
            v.reasons
        );
    }

    /// The finding: a late first token, then a normal stream, is
    /// over budget — not wedged.
    #[test]
    fn a_late_first_token_then_a_normal_stream_is_over_budget() {
        let mut e = healthy_evidence();
        e.suite[0] = judge_long_generation(
            vec![streamed(6_000, 5, 64, 64, "length", SampleOutcome::Ok)],
            &budgets(),
        );
        let v = conclude(&e, &policy(true));
        assert_eq!(v.kind, VerdictKind::OverBudget, "{:?}", v.reasons);
    }

    /// Failed KV transfers the router retried away fail the pair with the
    /// counter's numbers; a wedge stays a wedge.
    #[test]
    fn engine_counted_transfer_failures_fail_the_pair_and_a_wedge_stays_one() {
        let mut e = healthy_evidence();
        e.engines[0].before = Some(EngineCounts {
            transfer_failed: Some(0.0),
            bootstrap_failed: None,
        });
        e.engines[0].after = Some(EngineCounts {
            transfer_failed: Some(3.0),
            bootstrap_failed: None,
        });
        let v = conclude(&e, &policy(true));
        assert_eq!(v.kind, VerdictKind::Failed);
        assert_eq!(
            v.reasons[0],
            "decode decode-0: 3 KV transfers failed while pdwarden's requests ran (sglang:num_transfer_failed_reqs_total 0 → 3); a router that retries hides them from the client"
        );
        e.probes = vec![ProbeObservation::Timeout { after_ms: 30_000 }];
        assert_eq!(conclude(&e, &policy(true)).kind, VerdictKind::Wedged);
    }

    #[test]
    fn a_unit_not_running_is_never_healthy_and_a_journal_failure_is_failed() {
        let mut e = healthy_evidence();
        e.not_running.push(NotRunning {
            unit: "decode-0".into(),
            how: "exited: exit status 1".into(),
        });
        let v = conclude(&e, &policy(true));
        assert_eq!(v.kind, VerdictKind::Failed);
        assert_eq!(
            v.reasons[0],
            "decode-0 is not running: exited: exit status 1 (its agent's report)"
        );
        let mut e = healthy_evidence();
        e.journal_error = Some("disk full".into());
        let v = conclude(&e, &policy(true));
        assert_eq!(v.kind, VerdictKind::Failed);
        assert!(v.reasons[0].starts_with("stopped: the journal could not record a step (disk full)"));
    }

    #[test]
    fn a_suite_stopped_at_a_wedge_names_the_step_and_what_was_not_run() {
        let mut e = healthy_evidence();
        let mut frozen = streamed(100, 5, 12, 64, "", SampleOutcome::Timeout);
        frozen.latency_ms = 60_000;
        e.suite = vec![judge_long_generation(vec![frozen], &budgets())];
        e.suite_not_run = vec![SuiteStep::MultiTurn, SuiteStep::Concurrency];
        let v = conclude(&e, &policy(true));
        assert_eq!(v.kind, VerdictKind::Wedged, "{:?}", v.reasons);
        assert!(
            v.reasons.iter().any(|r| r
                == "the suite stopped at its long generation step, which proved the pair wedged: multi-turn, concurrency not run against it"),
            "{:?}",
            v.reasons
        );
    }

    /// One error somewhere in one layer: which layer, and its numbers.
    #[derive(Debug, Clone)]
    enum Fault {
        ErrorEvent {
            after: u32,
        },
        FinishAbort {
            tokens: u32,
        },
        Short {
            tokens: u32,
        },
        RouterRetry {
            retries: u8,
            errors: u8,
            before: Option<u8>,
        },
        EngineCounter {
            before: Option<u8>,
            rise: u8,
            bootstrap: bool,
        },
        Unproven,
        NotRunning,
        WrongOutput {
            position: usize,
        },
        WrongPath {
            position: usize,
        },
    }

    fn fault() -> impl Strategy<Value = Fault> {
        prop_oneof![
            (0u32..63).prop_map(|after| Fault::ErrorEvent { after }),
            (0u32..64).prop_map(|tokens| Fault::FinishAbort { tokens }),
            (0u32..63).prop_map(|tokens| Fault::Short { tokens }),
            (0u8..5, 0u8..5, proptest::option::of(0u8..5))
                .prop_filter("something moved", |(r, e, _)| r + e > 0)
                .prop_map(|(retries, errors, before)| Fault::RouterRetry {
                    retries,
                    errors,
                    before
                }),
            (proptest::option::of(0u8..5), 1u8..5, any::<bool>()).prop_map(|(before, rise, bootstrap)| {
                Fault::EngineCounter {
                    before,
                    rise,
                    bootstrap,
                }
            }),
            Just(Fault::Unproven),
            Just(Fault::NotRunning),
            (0usize..32).prop_map(|position| Fault::WrongOutput { position }),
            (0usize..32).prop_map(|position| Fault::WrongPath { position }),
        ]
    }

    /// Applies `f` to otherwise healthy evidence; returns the word the
    /// verdict's reasons must carry to name the layer.
    fn inject(e: &mut Evidence, f: &Fault) -> &'static str {
        let b = budgets();
        match *f {
            Fault::ErrorEvent { after } => {
                let mut s = streamed(100, 5, after, 64, "", SampleOutcome::Ok);
                s.stream_error = "aborted".into();
                e.suite[0] = judge_long_generation(vec![s], &b);
                "error event"
            }
            Fault::FinishAbort { tokens } => {
                e.suite[0] = judge_long_generation(vec![streamed(100, 5, tokens, 64, "abort", SampleOutcome::Ok)], &b);
                "abort"
            }
            Fault::Short { tokens } => {
                e.suite[0] = judge_long_generation(vec![streamed(100, 5, tokens, 64, "", SampleOutcome::Ok)], &b);
                "short answer"
            }
            Fault::RouterRetry {
                retries,
                errors,
                before,
            } => {
                let base = before.map_or(0.0, f64::from);
                e.routers[0].before = Some(match before {
                    Some(_) => vec![RouterWorkerCount {
                        worker: "http://d".into(),
                        worker_type: "decode".into(),
                        retries: base,
                        errors: base,
                    }],
                    None => Vec::new(),
                });
                e.routers[0].after = Some(vec![RouterWorkerCount {
                    worker: "http://d".into(),
                    worker_type: "decode".into(),
                    retries: base + f64::from(retries),
                    errors: base + f64::from(errors),
                }]);
                "router router"
            }
            Fault::EngineCounter {
                before,
                rise,
                bootstrap,
            } => {
                let then = before.map(f64::from);
                let now = Some(then.unwrap_or(0.0) + f64::from(rise));
                let (b0, a0) = if bootstrap {
                    (
                        EngineCounts {
                            bootstrap_failed: then,
                            ..Default::default()
                        },
                        EngineCounts {
                            bootstrap_failed: now,
                            ..Default::default()
                        },
                    )
                } else {
                    (
                        EngineCounts {
                            transfer_failed: then,
                            ..Default::default()
                        },
                        EngineCounts {
                            transfer_failed: now,
                            ..Default::default()
                        },
                    )
                };
                e.engines[0].before = Some(b0);
                e.engines[0].after = Some(a0);
                "decode decode-0"
            }
            Fault::Unproven => {
                e.unreached.push(UnreachedProof {
                    target: "decode-1".into(),
                    prefill: "prefill-0".into(),
                    decode: "decode-1".into(),
                    error: Some("http 500: KV transfer failed".into()),
                });
                "unproven"
            }
            Fault::NotRunning => {
                e.not_running.push(NotRunning {
                    unit: "prefill-0".into(),
                    how: "exited".into(),
                });
                "not running"
            }
            Fault::WrongOutput { position } => {
                e.output = Some(OutputCheck::Diverged {
                    position,
                    reference: " is blue".into(),
                    answer: " was green".into(),
                    margin: Some(2.9),
                    at_least: false,
                    reference_operation: "ref".into(),
                });
                "WRONG OUTPUT"
            }
            Fault::WrongPath { position } => {
                e.paths.push(PathCheck {
                    prefill: "prefill-1".into(),
                    decode: "decode-1".into(),
                    held_to: crate::judge::golden::HeldTo::Reference,
                    check: OutputCheck::Diverged {
                        position,
                        reference: " is blue".into(),
                        answer: " was green".into(),
                        margin: Some(2.9),
                        at_least: false,
                        reference_operation: "ref".into(),
                    },
                });
                "prefill-1 → decode-1"
            }
        }
    }

    proptest! {
        /// Rule 1 and 3: an error at any layer — whatever the probe series
        /// said (warm, or a slow first answer a cold start would explain) —
        /// is never healthy and never a cold start, and the verdict names
        /// the layer.
        #[test]
        fn an_error_at_any_layer_is_never_healthy_nor_a_cold_start(
            f in fault(),
            first_ms in 50u64..20_000,
            cold in any::<bool>(),
        ) {
            let mut e = healthy_evidence();
            e.probes[0] = ok(first_ms);
            e.probes.push(ok(100));
            let series = conclude(&e, &policy(cold)).kind;
            let layer = inject(&mut e, &f);
            let v = conclude(&e, &policy(cold));
            prop_assert!(!v.kind.is_healthy(), "{f:?}: {v:?}");
            prop_assert_ne!(v.kind, VerdictKind::HealthyAfterColdStart);
            // The suite runs only after a healthy series: a fault there is
            // named when the series let it run.
            let suite_fault = matches!(f, Fault::ErrorEvent { .. } | Fault::FinishAbort { .. } | Fault::Short { .. } | Fault::Unproven);
            if series.is_healthy() || !suite_fault {
                prop_assert!(v.reasons.iter().any(|r| r.contains(layer)), "{f:?} not named ({layer}): {:?}", v.reasons);
            }
        }

        /// Rule 2: a stream that finished (every token asked, `length`) is
        /// never wedged, however late its first token or long its pauses.
        #[test]
        fn a_complete_answer_that_was_only_slow_is_never_wedged(
            ttft in 1u64..60_000,
            gap in 1u64..5_000,
            n in 2u32..64,
            finish in prop_oneof![Just("length"), Just("stop")],
        ) {
            let mut e = healthy_evidence();
            let asked = if finish == "length" { n } else { 64 };
            e.suite[0] = judge_long_generation(vec![streamed(ttft, gap, n, asked, finish, SampleOutcome::Ok)], &budgets());
            let v = conclude(&e, &policy(true));
            prop_assert_ne!(v.kind, VerdictKind::Wedged, "{:?}", v.reasons);
            prop_assert!(matches!(v.kind, VerdictKind::Healthy | VerdictKind::OverBudget | VerdictKind::ColdStartRejected), "{:?}", v);
        }

        /// Both directions: evidence with no error and every request within
        /// budget stays healthy whatever the counters' starting values.
        #[test]
        fn unmoved_counters_at_any_level_change_nothing(
            level in 0u8..50,
            exposed in any::<bool>(),
        ) {
            let mut e = healthy_evidence();
            let n = exposed.then_some(f64::from(level));
            let counts = EngineCounts { transfer_failed: n, bootstrap_failed: n };
            e.engines[0].before = Some(counts);
            e.engines[0].after = Some(counts);
            let w = vec![RouterWorkerCount { worker: "http://d".into(), worker_type: "decode".into(), retries: f64::from(level), errors: f64::from(level) }];
            e.routers[0].before = Some(w.clone());
            e.routers[0].after = Some(w);
            let v = conclude(&e, &policy(true));
            prop_assert_eq!(v.kind, VerdictKind::Healthy, "{:?}", v.reasons);
        }
    }

    /// Rule 6, the other direction: the same answer, a near-tie (noise) or
    /// a first reference recorded keep a healthy pair healthy, and say so.
    #[test]
    fn output_that_is_right_or_noise_keeps_a_healthy_pair_healthy() {
        for check in [
            OutputCheck::Same {
                tokens: 16,
                reference_operation: "ref".into(),
            },
            OutputCheck::NearTie {
                position: 3,
                reference_token: " sky".into(),
                token: " sea".into(),
                margin: 0.02,
                reference_operation: "ref".into(),
            },
            OutputCheck::NoReference { tokens: 16 },
            OutputCheck::NoLogprobs,
        ] {
            let mut e = healthy_evidence();
            e.output = Some(check.clone());
            let v = conclude(&e, &policy(false));
            assert_eq!(v.kind, VerdictKind::Healthy, "{check:?}: {:?}", v.reasons);
            assert!(v.reasons.contains(&check.line()), "{:?}", v.reasons);
        }
    }

    /// Rule 6 along every path: a path of an xPyD pair that answers wrong
    /// fails a pair whose router answered right, naming the path's engines;
    /// paths that agree keep it healthy, in one line.
    #[test]
    fn a_wrong_path_fails_the_pair_naming_its_engines() {
        use crate::judge::golden::HeldTo;
        let path = |decode: &str, check: OutputCheck| PathCheck {
            prefill: "prefill-0".into(),
            decode: decode.into(),
            held_to: HeldTo::Reference,
            check,
        };
        let same = OutputCheck::Same {
            tokens: 32,
            reference_operation: "ref".into(),
        };
        let mut e = healthy_evidence();
        e.output = Some(same.clone());
        e.paths = vec![path("decode-0", same.clone()), path("decode-1", same.clone())];
        let v = conclude(&e, &policy(false));
        assert_eq!(v.kind, VerdictKind::Healthy, "{:?}", v.reasons);
        assert!(
            v.reasons
                .iter()
                .any(|r| r.starts_with("output: every prefill → decode path (2 paths")),
            "{:?}",
            v.reasons
        );
        e.paths[1].check = OutputCheck::Diverged {
            position: 2,
            reference: " is blue".into(),
            answer: " was green".into(),
            margin: Some(2.9),
            at_least: false,
            reference_operation: "ref".into(),
        };
        let v = conclude(&e, &policy(false));
        assert_eq!(v.kind, VerdictKind::Failed, "{:?}", v.reasons);
        assert!(
            v.reasons[0].starts_with("WRONG OUTPUT: prefill-0 → decode-1 answered \" was green\" from token 2"),
            "{:?}",
            v.reasons
        );
        e.probes = vec![ProbeObservation::Timeout { after_ms: 30_000 }];
        assert_eq!(
            conclude(&e, &policy(true)).kind,
            VerdictKind::Wedged,
            "a wedge stays one"
        );
    }

    #[test]
    fn a_passing_step_stays_passing() {
        let r = judge_long_generation(vec![streamed(100, 5, 64, 64, "length", SampleOutcome::Ok)], &budgets());
        assert_eq!(r.status, StepStatus::Pass, "{:?}", r.reasons);
    }
}
