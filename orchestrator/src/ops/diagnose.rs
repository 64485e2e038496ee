//! `pdwarden diagnose NAME` (issue 37, the path matrix): every prefill →
//! decode path of the pair probed, directed (`ProbeRequest.pd_path`,
//! the PD probe the drain's KV-path check sends), and the matrix of
//! outcomes localised by the pure judge (`judge::paths`).
//!
//! Probes go through the pair's router's agent (it reaches every engine,
//! as the router does), or the prefill's own agent for a pair without a
//! router, at most [`CONCURRENCY`] at a time, each bounded by the pair's
//! probe timeout. A failing or ambiguous path is probed again (at most
//! [`REPROBES`] times) before anything is named, and a probe whose
//! connection one side of the path refused names that side (issue 46).
//! Given the pair's reference, every probe is the greedy request and its
//! answer is held to it. Read-only apart from the probes' few tokens; nothing is
//! restarted here: `ops::repair` restarts what the matrix names.

use pdwarden_model::judge::paths::{Attribution, Diagnosis, Epoch, Localisation, Matrix, PathOutcome, Tries, localise};
use pdwarden_model::report::PairWorker;
use pdwarden_proto::v1::PdPath;

use crate::config::PairConfig;
use pdwarden_model::judge::golden::{Reference, compare};
use pdwarden_proto::v1::ChatProbe;

use crate::ops::corestart::output::{GREEDY_TOKENS, answer_from_wire};
use crate::ops::drain::probes::{ProbeError, pair_workers, pd_probe_with, url_host};
use crate::ops::port::{AgentPort, AskError};

/// Paths probed at once.
pub const CONCURRENCY: usize = 4;
/// Probes each failing or ambiguous path gets after the first, before
/// anything is named (issue 46): an intermittent engine shows on more of
/// its paths, and the failing path is probed again too.
pub const REPROBES: u32 = 2;
/// The journal entry holding a diagnosis made inside an operation.
pub const ENTRY: &str = "diagnosis";

/// Whether `pair` has paths to tell apart: an xPyD pool (more than one
/// prefill or decode) behind a router of its own, not a child (`PAIR#…`).
pub fn worth_it(pair: &PairConfig) -> bool {
    !pair.router.is_empty() && pair.prefill.len() + pair.decode.len() > 2 && !pair.name.contains('#')
}

/// Why a diagnosis could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DiagnoseError {
    #[error(transparent)]
    Urls(#[from] crate::ops::drain::probes::UnknownUrls),
}

/// One path's outcome: its probe's error (a timeout apart), or an answer
/// slower than the pair's warm budget (slow: said, not a failure).
pub fn outcome_of(result: &Result<(), ProbeError>, took_ms: u64, warm_budget_ms: u64) -> PathOutcome {
    match result {
        Ok(()) if took_ms > warm_budget_ms => PathOutcome::Slow,
        Ok(()) => PathOutcome::Ok,
        Err(ProbeError::Ask(AskError::NoAnswer { .. })) => PathOutcome::Timeout,
        Err(ProbeError::Failed(m)) if m.contains("timed out") || m.contains("timeout") => PathOutcome::Timeout,
        Err(_) => PathOutcome::Error,
    }
}

/// The worse of two outcomes of one path (a failure outweighs an answer,
/// a slow answer a fast one).
fn worse(a: PathOutcome, b: PathOutcome) -> PathOutcome {
    let rank = |o: PathOutcome| match o {
        PathOutcome::Ok => 0,
        PathOutcome::Slow => 1,
        _ => 2,
    };
    if rank(b) > rank(a) { b } else { a }
}

/// Probes every path of `pair` and localises the failures. `epochs`: the
/// prefills whose current process started after decodes paired with
/// them, to tell a decode holding an old identity from a bad prefill.
/// Failing and ambiguous paths are probed again, at most [`REPROBES`]
/// times each, before anything is named.
///
/// `reference`: the answer the pair's greedy output is held to; with one,
/// every probe is the greedy request and a path whose answer is not the
/// reference's is `wrong_output` (issue 46: a repair proves output too).
pub async fn diagnose(
    agents: &dyn AgentPort,
    pair: &PairConfig,
    epochs: &[Epoch],
    reference: Option<&Reference>,
) -> Result<Diagnosis, DiagnoseError> {
    let started = tokio::time::Instant::now();
    let epochs = &merged(epochs, epochs_from_facts(agents, pair));
    let workers = pair_workers(agents, pair)?;
    let prefills: Vec<&PairWorker> = workers.iter().filter(|w| w.worker_type == "prefill").collect();
    let decodes: Vec<&PairWorker> = workers.iter().filter(|w| w.worker_type == "decode").collect();
    let (np, nd) = (prefills.len(), decodes.len());
    let mut matrix = Matrix {
        prefills: prefills.iter().map(|w| w.unit.clone()).collect(),
        decodes: decodes.iter().map(|w| w.unit.clone()).collect(),
        cells: vec![vec![PathOutcome::Ok; nd]; np],
        tries: vec![vec![Tries::default(); nd]; np],
    };
    let mut failures = Vec::new();
    let mut blames: Vec<Attribution> = Vec::new();
    let mut todo: Vec<(usize, usize)> = (0..np).flat_map(|p| (0..nd).map(move |d| (p, d))).collect();
    for round in 0..=REPROBES {
        for chunk in todo.chunks(CONCURRENCY) {
            let probes = chunk.iter().map(|&(p, d)| {
                let (prefill, decode) = (prefills[p], decodes[d]);
                // Through the router's agent; a pair without one: the prefill's.
                let via = pair.router.first().cloned().unwrap_or_else(|| pair.prefill[p].clone());
                let path = PdPath {
                    decode_url: decode.url.clone(),
                    bootstrap_host: url_host(&prefill.url).to_string(),
                    bootstrap_port: prefill.bootstrap_port,
                    prefill_url: prefill.url.clone(),
                };
                let chat = ChatProbe {
                    model: pair.probe.model.clone(),
                    prompt: pair.probe.prompt.clone(),
                    max_tokens: if reference.is_some() {
                        GREEDY_TOKENS
                    } else {
                        pair.probe.max_tokens
                    },
                    greedy: reference.is_some(),
                };
                async move {
                    let sent = tokio::time::Instant::now();
                    let result = pd_probe_with(agents, &via, pair, path, chat).await;
                    (p, d, result, sent.elapsed())
                }
            });
            for (p, d, answer, took) in futures::future::join_all(probes).await {
                let took_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
                let wrong = match (&answer, reference) {
                    (Ok(r), Some(reference)) => held_to(reference, r),
                    _ => None,
                };
                let result = answer.map(|_| ());
                let outcome = match &wrong {
                    Some(_) => PathOutcome::WrongOutput,
                    None => outcome_of(&result, took_ms, pair.probe.warm_budget_ms),
                };
                matrix.cells[p][d] = worse(matrix.cells[p][d], outcome);
                matrix.tries[p][d].sent += 1;
                let path = format!("{} → {}", prefills[p].unit, decodes[d].unit);
                let again = if round > 0 { " (probed again)" } else { "" };
                match (&result, outcome) {
                    (Err(e), _) => {
                        matrix.tries[p][d].failed += 1;
                        failures.push(format!("{path}: {e}{again}"));
                    }
                    (Ok(()), PathOutcome::WrongOutput) => {
                        matrix.tries[p][d].failed += 1;
                        failures.push(format!(
                            "{path}: wrong output: {}{again}",
                            wrong.as_deref().unwrap_or_default()
                        ));
                    }
                    (Ok(()), PathOutcome::Slow) => failures.push(format!(
                        "{path}: slow: answered in {took_ms} ms, over the {} ms warm budget{again}",
                        pair.probe.warm_budget_ms
                    )),
                    _ => {}
                }
                if let Err(ProbeError::Unreachable { side, .. }) = &result {
                    let (engine, other) = match side.as_str() {
                        "prefill" => (&prefills[p].unit, &decodes[d].unit),
                        _ => (&decodes[d].unit, &prefills[p].unit),
                    };
                    if !blames.iter().any(|b| b.engine == *engine) {
                        blames.push(Attribution {
                            engine: engine.clone(),
                            why: format!("the probe's connection to it was refused while {other} accepted its own"),
                        });
                    }
                }
            }
        }
        // Separated already, or nothing failing: done. Otherwise every
        // path of the engines on a failing path is probed again.
        let l = localise(&matrix, epochs, &blames);
        if !matches!(l, Localisation::NotLocalised { .. }) || round == REPROBES {
            break;
        }
        let failing: Vec<(usize, usize)> = todo_all(np, nd).filter(|&(p, d)| matrix.cells[p][d].failed()).collect();
        if failing.len() == np * nd {
            break;
        }
        todo = todo_all(np, nd)
            .filter(|&(p, d)| failing.iter().any(|&(fp, fd)| fp == p || fd == d))
            .collect();
        // In the other order each round: a fault that fails every Nth
        // transfer would otherwise meet the same paths every time.
        if round % 2 == 0 {
            todo.reverse();
        }
    }
    let localisation = localise(&matrix, epochs, &blames);
    Ok(Diagnosis {
        pair: pair.name.clone(),
        matrix,
        failures,
        localisation,
        took_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        epochs: epochs.clone(),
        blames,
    })
}

/// The restart epochs the agents' facts show (issue 46, item 3): for each
/// prefill, the decodes whose current process started before the
/// prefill's current one — they paired with its previous process, whoever
/// restarted it (pdwarden, systemd, its agent, an operator). An engine
/// whose start is unknown (0: not running, or an agent that does not say)
/// is in no epoch.
pub fn epochs_from_facts(agents: &dyn AgentPort, pair: &PairConfig) -> Vec<Epoch> {
    let started = |u: &crate::config::UnitRef| agents.unit(&u.host, &u.unit).map_or(0, |i| i.process_started_unix_ms);
    pair.prefill
        .iter()
        .filter_map(|p| {
            let since = started(p);
            if since == 0 {
                return None;
            }
            let decodes_before: Vec<String> = pair
                .decode
                .iter()
                .filter(|d| (1..since).contains(&started(d)))
                .map(ToString::to_string)
                .collect();
            (!decodes_before.is_empty()).then(|| Epoch {
                prefill: p.to_string(),
                decodes_before,
            })
        })
        .collect()
}

/// `a` and `b` as one list, a prefill's decodes together.
fn merged(a: &[Epoch], b: Vec<Epoch>) -> Vec<Epoch> {
    let mut out = a.to_vec();
    for e in b {
        match out.iter_mut().find(|o| o.prefill == e.prefill) {
            Some(o) => {
                for d in e.decodes_before {
                    if !o.decodes_before.contains(&d) {
                        o.decodes_before.push(d);
                    }
                }
            }
            None => out.push(e),
        }
    }
    out
}

/// Why a path's greedy answer is not the reference's, if it is not.
fn held_to(reference: &Reference, r: &pdwarden_proto::v1::ProbeResult) -> Option<String> {
    if r.answer_logprobs_missing || r.answer.is_empty() {
        return Some("the answer carried no tokens with logprobs to hold to the reference".into());
    }
    let check = compare(reference, &answer_from_wire(r));
    check.is_wrong_output().then(|| check.line())
}

fn todo_all(np: usize, nd: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..np).flat_map(move |p| (0..nd).map(move |d| (p, d)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::fake_agent::rig::orchestrator;
    use crate::ops::fake_agent::{FakeAgent, UnitModel};
    use pdwarden_proto::v1::Role;

    fn xpyd_pair(prefills: usize, decodes: usize) -> PairConfig {
        crate::ops::fake_agent::rig::xpyd_pair(prefills, decodes, "")
    }

    fn agent(prefills: usize, decodes: usize) -> FakeAgent {
        let mut units: Vec<UnitModel> = (0..prefills)
            .map(|i| UnitModel::new(&format!("prefill-{i}"), Role::Prefill))
            .collect();
        units.extend((0..decodes).map(|i| UnitModel::new(&format!("decode-{i}"), Role::Decode)));
        units.push(UnitModel::new("router-0", Role::Router));
        FakeAgent::new("h1", units)
    }

    /// Issue 37: a 2P2D and a 3P2D pool with one decode whose every KV
    /// path fails: the matrix shows its column failing and names it.
    #[tokio::test(start_paused = true)]
    async fn a_decode_failing_every_path_is_named_from_the_matrix() {
        for (np, nd) in [(2, 2), (3, 2)] {
            let dir = tempfile::tempdir().unwrap();
            let journal = crate::ops::fake_agent::rig::journal(&dir);
            let agent = agent(np, nd);
            let ctx = orchestrator(&journal, &agent).await;
            let pair = xpyd_pair(np, nd);
            let workers = pair_workers(&*ctx.agents, &pair).unwrap();
            let url = |unit: &str| workers.iter().find(|w| w.unit.ends_with(unit)).unwrap().url.clone();
            for p in 0..np {
                agent.break_kv_path(&url(&format!("prefill-{p}")), &url("decode-1"));
            }
            let d = diagnose(&*ctx.agents, &pair, &[], None).await.unwrap();
            assert_eq!(d.matrix.cells.len(), np);
            assert!(
                d.matrix
                    .cells
                    .iter()
                    .all(|row| row[0] == PathOutcome::Ok && row[1].failed()),
                "{d:#?}"
            );
            let Localisation::Engines { suspects } = &d.localisation else {
                panic!("{np}P{nd}D not localised: {d:#?}");
            };
            assert_eq!(suspects.len(), 1, "{suspects:?}");
            assert_eq!(suspects[0].unit, "h1/decode-1");
            assert_eq!(d.failures.len(), np);
        }
    }

    /// An answer over the warm budget is slow (said, not a failure); a
    /// timeout and an error are told apart.
    #[test]
    fn a_path_answering_past_the_warm_budget_is_slow_not_failed() {
        assert_eq!(outcome_of(&Ok(()), 1_001, 1_000), PathOutcome::Slow);
        assert!(!PathOutcome::Slow.failed());
        assert_eq!(outcome_of(&Ok(()), 1_000, 1_000), PathOutcome::Ok);
        assert_eq!(
            outcome_of(&Err(ProbeError::Failed("request timed out".into())), 5, 1_000),
            PathOutcome::Timeout
        );
        assert_eq!(
            outcome_of(&Err(ProbeError::Failed("http 500".into())), 5, 1_000),
            PathOutcome::Error
        );
    }

    /// Issue 46, finding 1: 1P3D, decode-1 dead (its connection refused,
    /// the prefill's accepted): one failing cell, which the matrix alone
    /// cannot split; the probe's own evidence names the decode, never the
    /// prefill. A path failing with nothing to tell its ends apart: not
    /// localised, after being probed again.
    #[tokio::test(start_paused = true)]
    async fn in_1pnd_a_dead_decode_is_named_by_the_refused_connection_not_the_prefill() {
        let dir = tempfile::tempdir().unwrap();
        let journal = crate::ops::fake_agent::rig::journal(&dir);
        let agent = agent(1, 3);
        let ctx = orchestrator(&journal, &agent).await;
        let pair = xpyd_pair(1, 3);
        let workers = pair_workers(&*ctx.agents, &pair).unwrap();
        let url = |unit: &str| workers.iter().find(|w| w.unit.ends_with(unit)).unwrap().url.clone();
        agent.refuse_decode(&url("decode-1"));
        let d = diagnose(&*ctx.agents, &pair, &[], None).await.unwrap();
        let Localisation::Engines { suspects } = &d.localisation else {
            panic!("not localised: {d:#?}");
        };
        assert_eq!(suspects.len(), 1, "{suspects:?}");
        assert_eq!(suspects[0].unit, "h1/decode-1");
        assert!(suspects[0].why.contains("refused"), "{suspects:?}");
        assert_eq!(d.blames.len(), 1);

        // The same path broken with nothing naming a side: probed again
        // (each path of the prefill and of the decode), then not localised.
        let agent = self::agent(1, 3);
        let ctx = orchestrator(&journal, &agent).await;
        let workers = pair_workers(&*ctx.agents, &pair).unwrap();
        let url = |unit: &str| workers.iter().find(|w| w.unit.ends_with(unit)).unwrap().url.clone();
        agent.break_kv_path(&url("prefill-0"), &url("decode-1"));
        let d = diagnose(&*ctx.agents, &pair, &[], None).await.unwrap();
        assert!(matches!(d.localisation, Localisation::NotLocalised { .. }), "{d:#?}");
        assert_eq!(
            d.matrix.tries[0][1],
            Tries {
                sent: 1 + REPROBES,
                failed: 1 + REPROBES
            }
        );
        assert_eq!(d.matrix.tries[0][0].sent, 1 + REPROBES, "{d:#?}");
        let text = d.lines().join("\n");
        assert!(text.contains("nothing tells the prefill from the decode"), "{text}");
    }

    /// Issue 46, finding 2: 2P3D, decode-1 intermittent (its second probe
    /// on fails): one failing cell at first, which named its prefill; probed
    /// again, its column fails: decode-1, and only it.
    #[tokio::test(start_paused = true)]
    async fn an_intermittent_decode_is_named_once_probed_again() {
        let dir = tempfile::tempdir().unwrap();
        let journal = crate::ops::fake_agent::rig::journal(&dir);
        let agent = agent(2, 3);
        let ctx = orchestrator(&journal, &agent).await;
        let pair = xpyd_pair(2, 3);
        let workers = pair_workers(&*ctx.agents, &pair).unwrap();
        let url = |unit: &str| workers.iter().find(|w| w.unit.ends_with(unit)).unwrap().url.clone();
        agent.flaky_decode(&url("decode-1"), 1);
        let d = diagnose(&*ctx.agents, &pair, &[], None).await.unwrap();
        let Localisation::Engines { suspects } = &d.localisation else {
            panic!("not localised: {d:#?}");
        };
        assert_eq!(
            suspects.iter().map(|s| s.unit.as_str()).collect::<Vec<_>>(),
            ["h1/decode-1"],
            "{d:#?}"
        );
        assert!(d.matrix.tries[0][1].sent > 1, "{d:#?}");
    }

    /// Issue 46, item 3: a prefill restarted outside pdwarden (systemd)
    /// leaves the decode that paired with its old process stale: the agents'
    /// process starts say so, and the decode is named, not the prefill.
    #[tokio::test(start_paused = true)]
    async fn a_prefill_restarted_outside_pdwarden_names_its_stale_decode_from_facts() {
        let dir = tempfile::tempdir().unwrap();
        let journal = crate::ops::fake_agent::rig::journal(&dir);
        let agent = agent(1, 3);
        let ctx = orchestrator(&journal, &agent).await;
        let pair = xpyd_pair(1, 3);
        assert!(epochs_from_facts(&*ctx.agents, &pair).is_empty(), "started in order");
        agent.stale_identity_after_restart("prefill-0", &["decode-2"]);
        agent.restart_outside("prefill-0");
        let epochs = epochs_from_facts(&*ctx.agents, &pair);
        assert_eq!(epochs.len(), 1);
        assert_eq!(epochs[0].decodes_before, ["h1/decode-0", "h1/decode-1", "h1/decode-2"]);
        let d = diagnose(&*ctx.agents, &pair, &[], None).await.unwrap();
        let Localisation::Engines { suspects } = &d.localisation else {
            panic!("not localised: {d:#?}");
        };
        assert_eq!(
            suspects.iter().map(|s| s.unit.as_str()).collect::<Vec<_>>(),
            ["h1/decode-2"],
            "{d:#?}"
        );
        assert!(suspects[0].why.contains("old bootstrap identity"), "{suspects:?}");
    }

    /// Every path healthy: healthy, nothing named.
    #[tokio::test(start_paused = true)]
    async fn a_healthy_pool_is_healthy() {
        let dir = tempfile::tempdir().unwrap();
        let journal = crate::ops::fake_agent::rig::journal(&dir);
        let agent = agent(2, 2);
        let ctx = orchestrator(&journal, &agent).await;
        let d = diagnose(&*ctx.agents, &xpyd_pair(2, 2), &[], None).await.unwrap();
        assert_eq!(d.localisation, Localisation::Healthy);
        assert!(d.failures.is_empty());
    }
}
