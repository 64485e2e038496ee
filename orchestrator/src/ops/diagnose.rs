//! `pdwarden diagnose NAME` (issue 37, the path matrix): every prefill →
//! decode path of the pair probed once, directed (`ProbeRequest.pd_path`,
//! the PD probe the drain's KV-path check sends), and the matrix of
//! outcomes localised by the pure judge (`judge::paths`).
//!
//! Probes go through the pair's router's agent (it reaches every engine,
//! as the router does), or the prefill's own agent for a pair without a
//! router, at most [`CONCURRENCY`] at a time, each bounded by the pair's
//! probe timeout. Read-only apart from the probes' few tokens; nothing is
//! restarted here: `ops::repair` restarts what the matrix names.

use pdwarden_model::judge::paths::{Diagnosis, Epoch, Matrix, PathOutcome, localise};
use pdwarden_model::report::PairWorker;
use pdwarden_proto::v1::PdPath;

use crate::config::PairConfig;
use crate::ops::drain::probes::{ProbeError, pair_workers, pd_probe, url_host};
use crate::ops::port::{AgentPort, AskError};

/// Paths probed at once.
pub const CONCURRENCY: usize = 4;
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

/// Probes every path of `pair` and localises the failures. `epochs`: the
/// prefills restarted since the decodes last paired with them (a repair's
/// earlier rounds), to tell a decode holding an old identity from a bad
/// prefill.
pub async fn diagnose(agents: &dyn AgentPort, pair: &PairConfig, epochs: &[Epoch]) -> Result<Diagnosis, DiagnoseError> {
    let started = tokio::time::Instant::now();
    let workers = pair_workers(agents, pair)?;
    let prefills: Vec<&PairWorker> = workers.iter().filter(|w| w.worker_type == "prefill").collect();
    let decodes: Vec<&PairWorker> = workers.iter().filter(|w| w.worker_type == "decode").collect();
    let cells: Vec<(usize, usize)> = (0..prefills.len())
        .flat_map(|p| (0..decodes.len()).map(move |d| (p, d)))
        .collect();
    let mut outcomes = vec![vec![PathOutcome::Ok; decodes.len()]; prefills.len()];
    let mut failures = Vec::new();
    for chunk in cells.chunks(CONCURRENCY) {
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
            async move {
                let sent = tokio::time::Instant::now();
                let result = pd_probe(agents, &via, pair, path).await;
                (p, d, result, sent.elapsed())
            }
        });
        for (p, d, result, took) in futures::future::join_all(probes).await {
            let took_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
            outcomes[p][d] = outcome_of(&result, took_ms, pair.probe.warm_budget_ms);
            let path = format!("{} → {}", prefills[p].unit, decodes[d].unit);
            match (&result, outcomes[p][d]) {
                (Err(e), _) => failures.push(format!("{path}: {e}")),
                (Ok(()), PathOutcome::Slow) => failures.push(format!(
                    "{path}: slow: answered in {took_ms} ms, over the {} ms warm budget",
                    pair.probe.warm_budget_ms
                )),
                _ => {}
            }
        }
    }
    let matrix = Matrix {
        prefills: prefills.iter().map(|w| w.unit.clone()).collect(),
        decodes: decodes.iter().map(|w| w.unit.clone()).collect(),
        cells: outcomes,
    };
    let localisation = localise(&matrix, epochs);
    Ok(Diagnosis {
        pair: pair.name.clone(),
        matrix,
        failures,
        localisation,
        took_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::fake_agent::rig::orchestrator;
    use crate::ops::fake_agent::{FakeAgent, UnitModel};
    use pdwarden_model::judge::paths::Localisation;
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
            let d = diagnose(&*ctx.agents, &pair, &[]).await.unwrap();
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

    /// Every path healthy: healthy, nothing named.
    #[tokio::test(start_paused = true)]
    async fn a_healthy_pool_is_healthy() {
        let dir = tempfile::tempdir().unwrap();
        let journal = crate::ops::fake_agent::rig::journal(&dir);
        let agent = agent(2, 2);
        let ctx = orchestrator(&journal, &agent).await;
        let d = diagnose(&*ctx.agents, &xpyd_pair(2, 2), &[]).await.unwrap();
        assert_eq!(d.localisation, Localisation::Healthy);
        assert!(d.failures.is_empty());
    }
}
