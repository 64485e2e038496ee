//! Drain before restart, rejoin after a healthy verdict (issue 18).
//!
//! A pair whose clients reach it through a router shared with other pairs
//! (`[pair.serving_router]`) is taken out of that router's rotation before
//! any of its units is stopped, and put back only once the co-restart's
//! verdict — reached through the pair's own router, which only the pair's
//! engines stand behind — is healthy. In between:
//!
//! 1. **Out of rotation.** The serving router's agent removes the pair's
//!    engines through the router's worker API (`agent/src/router_api.rs`),
//!    and the router is listed again until it no longer shows them: both
//!    sglang-router calls are queued (ROUTER-NOTES.md), so the 202 alone
//!    does not mean the router stopped choosing them.
//! 2. **A wait that means something.** Today's gateways wait a fixed
//!    `drain_settle_secs` (sgl-model-gateway). Here the engines' own gauges
//!    are read until every one of them shows no request running or queued
//!    and no KV transfer in its PD queues, twice in a row (a request the
//!    router chose just before the removal may still be on its way to the
//!    engine at the first reading), bounded by `drain_timeout_ms`. Past it
//!    the restart goes on and the report names what was still in flight.
//!    SGLang refreshes an idle engine's gauges only every 30 s
//!    (`pdwarden_engines`' profile), so on a real SGLang pair the last
//!    requests' gauges can read stale for that long: the default timeout
//!    (60 s) outlasts one stale reading; vLLM's gauges move every step.
//! 3. **Back only when healthy.** After a healthy verdict every engine of
//!    the pair is added back (one already listed is left as it is) and the
//!    router is listed until it shows each of them healthy, bounded by
//!    `rejoin_timeout_ms`. A pair that is not healthy stays out, and the
//!    report says so: a broken pair in rotation is what the drain avoided.
//!
//! An automatic recovery of a confirmed wedge takes the pair out without
//! waiting for its work: a wedged pair's requests do not finish. A drain
//! that cannot be done (the router's agent not connected, the API
//! refusing) stops a co-restart before anything is touched, except a
//! recovery, whose pair is broken already.
//!
//! Every step is idempotent — removing a worker the router does not list,
//! adding one it lists, are no-ops — so a resumed operation simply drains
//! again (nothing left to remove, nothing in flight on a restarting pair)
//! and rejoins after its own verdict.

use std::collections::BTreeMap;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use futures::future::join_all;
use pdwarden_proto::v1::{
    ChatProbe, Command, EngineSample, PdPath, ProbeOutcome, ProbeRequest, RouterWorker, RouterWorkers, RouterWorkersOp,
    RouterWorkersResult, ScrapeEngines, WatchTarget, command,
};

use crate::config::{PairConfig, ServingRouterConfig, UnitRef};
use crate::ops::port::{AgentPort, AgentReport, AskError};
use crate::ops::recorder::Recorder;
pub use crate::ops::report::{DrainRecord, PairWorker, RejoinRecord};

/// Timeout of one request the agent makes to the router, or of one scrape.
const REQUEST_TIMEOUT_MS: u64 = 5_000;

/// Requests and KV transfers one engine's sample shows in flight (`None`:
/// the sample cannot tell). An engine whose port refuses has nothing in
/// flight; one that answers without its metrics cannot be trusted to be idle.
pub fn in_flight(sample: &EngineSample) -> Option<f64> {
    if !sample.metrics_ok {
        let down = sample.health_status == 0 && sample.error.contains("refused");
        return down.then_some(0.0);
    }
    Some(
        [
            sample.running_reqs,
            sample.queued_reqs,
            sample.prefill_prealloc_queue_reqs,
            sample.prefill_inflight_queue_reqs,
            sample.decode_prealloc_queue_reqs,
            sample.decode_transfer_queue_reqs,
        ]
        .into_iter()
        .flatten()
        .sum(),
    )
}

/// What is still in flight on the engines of one reading, in words (empty:
/// every engine idle). Pure.
pub fn busy_engines(samples: &BTreeMap<String, Option<EngineSample>>) -> Vec<String> {
    samples
        .iter()
        .filter_map(|(unit, s)| match s.as_ref().map(|s| (s, in_flight(s))) {
            None => Some(format!("{unit}: no answer from its agent")),
            Some((s, None)) => Some(format!("{unit}: metrics unreadable ({})", s.error)),
            Some((_, Some(n))) if n > 0.0 => Some(format!("{unit}: {n} in flight")),
            Some(_) => None,
        })
        .collect()
}

/// The pair's engines as the serving router should list them, from their
/// agents' registered facts. An engine whose agent is not connected is
/// named in the error.
pub fn pair_workers(agents: &dyn AgentPort, pair: &PairConfig) -> Result<Vec<PairWorker>, String> {
    let mut out = Vec::new();
    let mut unknown = Vec::new();
    for (worker_type, units) in [("prefill", &pair.prefill), ("decode", &pair.decode)] {
        for u in units {
            match agents.unit(&u.host, &u.unit) {
                Some(info) if !info.base_url.is_empty() => out.push(PairWorker {
                    unit: u.to_string(),
                    url: info.base_url.trim_end_matches('/').to_string(),
                    worker_type: worker_type.into(),
                    bootstrap_port: if worker_type == "prefill" {
                        info.bootstrap_port
                    } else {
                        0
                    },
                }),
                _ => unknown.push(u.to_string()),
            }
        }
    }
    if unknown.is_empty() {
        Ok(out)
    } else {
        Err(format!(
            "the URL of {} is unknown: its agent is not connected",
            unknown.join(", ")
        ))
    }
}

fn same_url(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// One scrape of every engine of the pair (`ScrapeEngines` to each host),
/// by "host/unit"; `None` where the agent did not answer.
pub async fn scrape_pair(
    agents: &dyn AgentPort,
    pair: &PairConfig,
    timeout_ms: u64,
) -> BTreeMap<String, Option<EngineSample>> {
    let engines: Vec<UnitRef> = pair.prefill.iter().chain(&pair.decode).cloned().collect();
    scrape_units(agents, &engines, timeout_ms).await
}

/// One scrape of each of `units` (engines, or routers: the agent reads a
/// router's own Prometheus port), one command per host, keyed `host/unit`.
pub async fn scrape_units(
    agents: &dyn AgentPort,
    units: &[UnitRef],
    timeout_ms: u64,
) -> BTreeMap<String, Option<EngineSample>> {
    let mut by_host: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for u in units {
        by_host.entry(u.host.clone()).or_default().push(u.unit.clone());
    }
    let scrapes = by_host.into_iter().map(|(host, units)| async move {
        let cmd = Command {
            fencing_token: 0,
            command_id: uuid::Uuid::new_v4().to_string(),
            action: Some(command::Action::Scrape(ScrapeEngines {
                targets: units
                    .iter()
                    .map(|unit| WatchTarget {
                        unit: unit.clone(),
                        metrics_path: String::new(),
                    })
                    .collect(),
                scrape_timeout_ms: timeout_ms,
            })),
        };
        let first = units.first().cloned().unwrap_or_default();
        let got = agents
            .ask(&host, &first, cmd, Duration::from_millis(timeout_ms), |r| match r {
                AgentReport::Scrape(r) => Some(r.samples),
                // A refusal (an agent that does not know the command) ends it too.
                AgentReport::Result(_) => Some(Vec::new()),
                _ => None,
            })
            .await
            .unwrap_or_default();
        units
            .into_iter()
            .map(|unit| {
                let sample = got.iter().find(|s| s.unit == unit).cloned();
                (format!("{host}/{unit}"), sample)
            })
            .collect::<Vec<_>>()
    });
    join_all(scrapes).await.into_iter().flatten().collect()
}

/// One prefill → decode path through the KV transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvPath {
    pub prefill_url: String,
    pub bootstrap_port: u32,
    pub decode_url: String,
}

impl KvPath {
    fn describe(&self) -> String {
        format!("{} → {}", self.prefill_url, self.decode_url)
    }
}

/// The paths a PD router creates between the pair's engines and the
/// `others` it lists: it pairs any prefill with any decode, so every other
/// prefill will send KV to each of the pair's decodes, and each of the
/// pair's prefills to every other decode. Pure.
pub fn cross_paths(ours: &[PairWorker], others: &[RouterWorker]) -> Vec<KvPath> {
    let mut out = Vec::new();
    let decode = |t: &str| t == "decode";
    let prefill = |t: &str| t == "prefill";
    for p in others.iter().filter(|o| prefill(&o.worker_type)) {
        for d in ours.iter().filter(|w| decode(&w.worker_type)) {
            out.push(KvPath {
                prefill_url: p.url.clone(),
                bootstrap_port: p.bootstrap_port,
                decode_url: d.url.clone(),
            });
        }
    }
    for p in ours.iter().filter(|w| prefill(&w.worker_type)) {
        for d in others.iter().filter(|o| decode(&o.worker_type)) {
            out.push(KvPath {
                prefill_url: p.url.clone(),
                bootstrap_port: p.bootstrap_port,
                decode_url: d.url.clone(),
            });
        }
    }
    out
}

/// The host of a URL (`http://10.0.0.5:30000/x` → `10.0.0.5`): what a PD
/// router gives a decode as the prefill's `bootstrap_host`.
pub fn url_host(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |x| x.1);
    let authority = rest.split('/').next().unwrap_or(rest);
    match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => authority.rsplit_once(':').map_or(authority, |x| x.0),
    }
}

/// Probes each path through the serving router's agent (it reaches every
/// engine the router does); a path that fails is asked once more (an engine
/// that drops a stale bootstrap identity on a failed transfer, as
/// sgl-project/sglang#36029 makes SGLang do, is right the second time).
/// The paths that failed twice, described.
async fn check_paths(agents: &dyn AgentPort, router: &UnitRef, pair: &PairConfig, paths: &[KvPath]) -> Vec<String> {
    let mut broken = Vec::new();
    for path in paths {
        let mut last = String::new();
        let mut ok = false;
        for _ in 0..2 {
            match path_probe(agents, router, pair, path).await {
                Ok(()) => {
                    ok = true;
                    break;
                }
                Err(e) => last = e.to_string(),
            }
        }
        if !ok {
            broken.push(format!("{}: {last}", path.describe()));
        }
    }
    broken
}

async fn path_probe(
    agents: &dyn AgentPort,
    router: &UnitRef,
    pair: &PairConfig,
    path: &KvPath,
) -> Result<(), ProbeError> {
    pd_probe(
        agents,
        router,
        pair,
        PdPath {
            decode_url: path.decode_url.clone(),
            bootstrap_host: url_host(&path.prefill_url).to_string(),
            bootstrap_port: path.bootstrap_port,
            prefill_url: path.prefill_url.clone(),
        },
    )
    .await
}

/// Why a probe over a prefill → decode path failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The agent of the probing unit did not answer.
    #[error(transparent)]
    Ask(#[from] AskError),
    /// The probe failed and the agent said nothing more.
    #[error("no answer")]
    NoAnswer,
    /// The probe failed: the agent's error.
    #[error("{0}")]
    Failed(String),
}

/// One probe over a prefill → decode path (`ProbeRequest.pd_path`), sent
/// by the agent of `via` (the prefill itself when `path.prefill_url` is
/// empty), with the pair's probe prompt and timeout.
pub async fn pd_probe(
    agents: &dyn AgentPort,
    via: &UnitRef,
    pair: &PairConfig,
    path: PdPath,
) -> Result<(), ProbeError> {
    let timeout_ms = pair.probe.probe_timeout_ms;
    let cmd = Command {
        fencing_token: 0,
        command_id: uuid::Uuid::new_v4().to_string(),
        action: Some(command::Action::Probe(ProbeRequest {
            unit: via.unit.clone(),
            chat: Some(ChatProbe {
                model: pair.probe.model.clone(),
                prompt: pair.probe.prompt.clone(),
                max_tokens: pair.probe.max_tokens,
            }),
            timeout_ms,
            seq: 0,
            pd_path: Some(path),
        })),
    };
    let answer = agents
        .ask(
            &via.host,
            &via.unit,
            cmd,
            Duration::from_millis(timeout_ms),
            |r| match r {
                AgentReport::Probe(p) => Some(p),
                _ => None,
            },
        )
        .await?;
    if answer.outcome == ProbeOutcome::Ok as i32 {
        Ok(())
    } else if answer.error.is_empty() {
        Err(ProbeError::NoAnswer)
    } else {
        Err(ProbeError::Failed(answer.error))
    }
}

/// Why a call to the serving router's worker API failed.
#[derive(Debug, thiserror::Error)]
pub enum RouterApiError {
    #[error(transparent)]
    Ask(#[from] AskError),
    #[error("{0}")]
    Refused(String),
}

/// One call of the serving router's worker API, through its agent.
async fn router_call(
    agents: &dyn AgentPort,
    router: &UnitRef,
    op: RouterWorkersOp,
    workers: &[PairWorker],
) -> Result<Vec<RouterWorker>, RouterApiError> {
    let cmd = Command {
        fencing_token: 0,
        command_id: uuid::Uuid::new_v4().to_string(),
        action: Some(command::Action::RouterWorkers(RouterWorkers {
            unit: router.unit.clone(),
            op: op as i32,
            workers: workers
                .iter()
                .map(|w| RouterWorker {
                    url: w.url.clone(),
                    worker_type: w.worker_type.clone(),
                    bootstrap_port: w.bootstrap_port,
                    ..Default::default()
                })
                .collect(),
            request_timeout_ms: REQUEST_TIMEOUT_MS,
        })),
    };
    // Each worker is one request to the router, and the list two more.
    let timeout = Duration::from_millis(REQUEST_TIMEOUT_MS.saturating_mul(workers.len() as u64 + 2));
    let answer: RouterWorkersResult = agents
        .ask(&router.host, &router.unit, cmd, timeout, |r| match r {
            AgentReport::RouterWorkers(r) => Some(r),
            AgentReport::Result(r) => Some(RouterWorkersResult {
                ok: false,
                error: if r.error.is_empty() { "refused".into() } else { r.error },
                ..Default::default()
            }),
            _ => None,
        })
        .await?;
    if answer.ok {
        Ok(answer.workers)
    } else {
        Err(RouterApiError::Refused(answer.error))
    }
}

/// Drains the pair out of its serving router (module docs). `wait`: wait
/// for the engines' work (false for the recovery of a wedge).
pub async fn drain(
    agents: &dyn AgentPort,
    rec: &Recorder,
    pair: &PairConfig,
    sr: &ServingRouterConfig,
    wait: bool,
) -> DrainRecord {
    let router = sr.unit_ref();
    let mut out = DrainRecord {
        router: router.to_string(),
        waited: wait,
        ..Default::default()
    };
    let step = rec.step_started("drain", &router.to_string());
    let workers = match pair_workers(agents, pair) {
        Ok(w) => w,
        Err(e) => {
            out.error = Some(e);
            return end(rec, step, out);
        }
    };
    // A router that is restarting (or not up yet) is asked a few times.
    let list = || router_call(agents, &router, RouterWorkersOp::List, &[]);
    let listed = match list
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(200))
                .with_max_delay(Duration::from_secs(2))
                .with_max_times(4),
        )
        .sleep(tokio::time::sleep)
        .await
    {
        Ok(l) => l,
        Err(e) => {
            out.error = Some(format!("could not read its worker list: {e}"));
            return end(rec, step, out);
        }
    };
    // What this operation took out before an orchestrator restart (a
    // resumed drain finds them out already).
    let earlier: Vec<PairWorker> = rec
        .journal
        .read::<Vec<PairWorker>>(&rec.operation_id, "drain_removing")
        .unwrap_or_default()
        .into_iter()
        .flatten()
        .collect();
    let (removing, rest): (Vec<PairWorker>, Vec<PairWorker>) = workers
        .into_iter()
        .partition(|w| listed.iter().any(|l| same_url(&l.url, &w.url)));
    let (out_before, not_listed): (Vec<PairWorker>, Vec<PairWorker>) = rest
        .into_iter()
        .partition(|w| earlier.iter().any(|e| same_url(&e.url, &w.url)));
    out.not_listed = not_listed.into_iter().map(|w| w.unit).collect();
    // Must-write, before the removal goes out: what this operation takes
    // out, which a resumed drain reads back (DESIGN.md 17).
    if let Err(e) = rec.write_ahead("drain_removing", &removing) {
        out.error = Some(format!(
            "the journal could not record what it takes out of rotation ({e}); nothing was taken out"
        ));
        return end(rec, step, out);
    }
    out.removed = removing.clone();
    out.removed.extend(out_before);
    if !removing.is_empty() {
        if let Err(e) = router_call(agents, &router, RouterWorkersOp::Remove, &removing).await {
            out.error = Some(format!("could not take the pair out of its rotation: {e}"));
            return end(rec, step, out);
        }
        // Removals are queued: out only once the list no longer shows them.
        let deadline = tokio::time::Instant::now() + Duration::from_millis(sr.drain_timeout_ms);
        loop {
            match router_call(agents, &router, RouterWorkersOp::List, &[]).await {
                Ok(l) if !l.iter().any(|l| removing.iter().any(|w| same_url(&w.url, &l.url))) => break,
                Ok(_) | Err(_) if tokio::time::Instant::now() >= deadline => {
                    out.error = Some(format!(
                        "it still listed the pair's engines {} ms after their removal",
                        sr.drain_timeout_ms
                    ));
                    return end(rec, step, out);
                }
                _ => tokio::time::sleep(Duration::from_millis(sr.poll_ms)).await,
            }
        }
    }
    out.out_at_ms = Some(rec.now_ms());
    if wait {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(sr.drain_timeout_ms);
        let mut idle_readings = 0;
        loop {
            let busy = busy_engines(&scrape_pair(agents, pair, REQUEST_TIMEOUT_MS).await);
            idle_readings = if busy.is_empty() { idle_readings + 1 } else { 0 };
            if idle_readings >= 2 {
                out.drained_at_ms = Some(rec.now_ms());
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                out.timed_out = true;
                out.in_flight_left = busy;
                break;
            }
            tokio::time::sleep(Duration::from_millis(sr.poll_ms)).await;
        }
    }
    end(rec, step, out)
}

fn end(rec: &Recorder, step: usize, out: DrainRecord) -> DrainRecord {
    let outcome = match (&out.error, out.timed_out) {
        (Some(e), _) => format!("fail: {e}"),
        (None, true) => format!("warn: drain timed out ({})", out.in_flight_left.join("; ")),
        (None, false) => format!("pass: {} worker(s) out of rotation", out.removed.len()),
    };
    rec.step_ended(step, outcome);
    rec.journal("drain", &out);
    out
}

/// Puts the pair back into its serving router after a healthy verdict, or
/// says why it stays out (module docs).
pub async fn rejoin(
    agents: &dyn AgentPort,
    rec: &Recorder,
    pair: &PairConfig,
    sr: &ServingRouterConfig,
    healthy: bool,
) -> RejoinRecord {
    let router = sr.unit_ref();
    if !healthy {
        let r = RejoinRecord {
            put_back: false,
            healthy_at_ms: None,
            detail: format!(
                "left out of the serving router {router}: the pair is not healthy (its engines go back after a healthy restart)"
            ),
            paths_checked: Vec::new(),
        };
        rec.journal("rejoin", &r);
        return r;
    }
    let step = rec.step_started("rejoin", &router.to_string());
    let r = rejoin_healthy(agents, pair, sr, rec).await;
    rec.step_ended(
        step,
        if r.put_back {
            "pass: back in rotation".to_string()
        } else {
            format!("fail: {}", r.detail)
        },
    );
    rec.journal("rejoin", &r);
    r
}

async fn rejoin_healthy(
    agents: &dyn AgentPort,
    pair: &PairConfig,
    sr: &ServingRouterConfig,
    rec: &Recorder,
) -> RejoinRecord {
    let router = sr.unit_ref();
    let failed = |detail: String| RejoinRecord {
        put_back: false,
        healthy_at_ms: None,
        detail: format!("the pair is healthy but NOT back in the serving router {router}: {detail}"),
        paths_checked: Vec::new(),
    };
    let workers = match pair_workers(agents, pair) {
        Ok(w) => w,
        Err(e) => return failed(e),
    };
    // The KV paths the router will create between the pair and the other
    // engines it routes to, checked before any client can take them.
    let others = match router_call(agents, &router, RouterWorkersOp::List, &[]).await {
        Ok(listed) => listed
            .into_iter()
            .filter(|l| !workers.iter().any(|w| same_url(&w.url, &l.url)))
            .collect::<Vec<_>>(),
        Err(e) => return failed(format!("could not read its worker list: {e}")),
    };
    let paths = cross_paths(&workers, &others);
    let broken = check_paths(agents, &router, pair, &paths).await;
    let paths_checked: Vec<String> = paths.iter().map(KvPath::describe).collect();
    if !broken.is_empty() {
        return RejoinRecord {
            put_back: false,
            healthy_at_ms: None,
            paths_checked,
            detail: format!(
                "the pair is healthy through its own router but KEPT OUT of the serving router {router}: {} of the {} KV paths it would share with the other engines there {} ({}). Engines that keep a restarted prefill's old bootstrap identity (sgl-project/sglang#36029) or degrade a restarted decode's bootstrap behind a long-running prefill (INCIDENTS row 1) need every engine behind that router restarted together, prefills first",
                broken.len(),
                paths.len(),
                if broken.len() == 1 { "fails" } else { "fail" },
                broken.join("; ")
            ),
        };
    }
    if let Err(e) = router_call(agents, &router, RouterWorkersOp::Add, &workers).await {
        return failed(format!("the router refused them: {e}"));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_millis(sr.rejoin_timeout_ms);
    let mut last: String;
    loop {
        match router_call(agents, &router, RouterWorkersOp::List, &[]).await {
            Ok(listed) => {
                let missing: Vec<&str> = workers
                    .iter()
                    .filter(|w| !listed.iter().any(|l| same_url(&l.url, &w.url) && l.healthy))
                    .map(|w| w.unit.as_str())
                    .collect();
                if missing.is_empty() {
                    return RejoinRecord {
                        put_back: true,
                        healthy_at_ms: Some(rec.now_ms()),
                        paths_checked,
                        detail: format!("back in the serving router {router} after the healthy verdict"),
                    };
                }
                last = format!("not listed healthy: {}", missing.join(", "));
            }
            Err(e) => last = e.to_string(),
        }
        if tokio::time::Instant::now() >= deadline {
            return failed(format!("after {} ms, {last}", sr.rejoin_timeout_ms));
        }
        tokio::time::sleep(Duration::from_millis(sr.poll_ms)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(running: f64, queued: f64) -> EngineSample {
        EngineSample {
            metrics_ok: true,
            health_status: 200,
            running_reqs: Some(running),
            queued_reqs: Some(queued),
            ..Default::default()
        }
    }

    #[test]
    fn every_queue_counts_as_in_flight_and_a_refused_port_as_idle() {
        assert_eq!(in_flight(&sample(0.0, 0.0)), Some(0.0));
        assert_eq!(in_flight(&sample(1.0, 2.0)), Some(3.0));
        let mut kv = sample(0.0, 0.0);
        kv.decode_transfer_queue_reqs = Some(1.0);
        assert_eq!(in_flight(&kv), Some(1.0), "a KV transfer in the decode's queue is work");
        let refused = EngineSample {
            metrics_ok: false,
            error: "connection refused".into(),
            ..Default::default()
        };
        assert_eq!(in_flight(&refused), Some(0.0));
        let timeout = EngineSample {
            metrics_ok: false,
            health_status: 200,
            error: "timed out".into(),
            ..Default::default()
        };
        assert_eq!(in_flight(&timeout), None, "an engine that cannot be read is not idle");
    }

    #[test]
    fn a_pd_router_pairs_every_prefill_with_every_decode() {
        let ours = [
            PairWorker {
                unit: "h/p".into(),
                url: "http://a:1".into(),
                worker_type: "prefill".into(),
                bootstrap_port: 8998,
            },
            PairWorker {
                unit: "h/d".into(),
                url: "http://a:2".into(),
                worker_type: "decode".into(),
                bootstrap_port: 0,
            },
        ];
        let others = [
            RouterWorker {
                url: "http://b:1".into(),
                worker_type: "prefill".into(),
                bootstrap_port: 9000,
                ..Default::default()
            },
            RouterWorker {
                url: "http://b:2".into(),
                worker_type: "decode".into(),
                ..Default::default()
            },
        ];
        let paths: Vec<String> = cross_paths(&ours, &others).iter().map(KvPath::describe).collect();
        assert_eq!(paths, ["http://b:1 → http://a:2", "http://a:1 → http://b:2"]);
        assert_eq!(cross_paths(&ours, &others)[0].bootstrap_port, 9000);
        assert!(
            cross_paths(&ours, &[]).is_empty(),
            "alone behind the router: no cross path"
        );
    }

    #[test]
    fn the_bootstrap_host_is_the_prefill_urls_host() {
        assert_eq!(url_host("http://127.0.0.1:30001"), "127.0.0.1");
        assert_eq!(url_host("http://prefill-0.svc:30001/"), "prefill-0.svc");
        assert_eq!(url_host("http://[fd00::1]:30001"), "fd00::1");
        assert_eq!(url_host("http://host"), "host");
    }

    #[test]
    fn busy_engines_names_each_and_why() {
        let readings = BTreeMap::from([
            ("h/decode-0".to_string(), Some(sample(2.0, 0.0))),
            ("h/prefill-0".to_string(), Some(sample(0.0, 0.0))),
            ("h/prefill-1".to_string(), None),
        ]);
        assert_eq!(
            busy_engines(&readings),
            ["h/decode-0: 2 in flight", "h/prefill-1: no answer from its agent"]
        );
    }
}

/// The drain inside a co-restart, over the fake agent at paused time: a
/// pair `p` (prefill-0, decode-0, its own router-0) and another pair's
/// engines behind one serving router, `shared-router`, on the same host.
#[cfg(test)]
mod driver_tests {
    use std::time::Duration;

    use pdwarden_proto::v1::{Phase, Role, RouterWorkersOp};
    use tokio::sync::mpsc;

    use crate::ops::corestart::{OperationContext, OperationKind, resume, run_operation};
    use crate::ops::fake_agent::rig::{UNITS, journal, kill_after_entry, orchestrator};
    use crate::ops::fake_agent::{FakeAgent, UnitModel};
    use crate::ops::journal::Journal;
    use crate::ops::report::OperationReport;

    const OURS: [&str; 2] = ["http://fake/prefill-0", "http://fake/decode-0"];
    const THEIRS: [&str; 2] = ["http://fake/other-prefill", "http://fake/other-decode"];

    fn pair(serving_router_unit: &str, drain_timeout_ms: u64) -> crate::config::PairConfig {
        crate::ops::fake_agent::rig::pair(
            "after-prefill-ready",
            &format!(
                "[pair.serving_router]\nhost = \"h1\"\nunit = \"{serving_router_unit}\"\ndrain_timeout_ms = {drain_timeout_ms}\n"
            ),
        )
    }

    fn agent() -> FakeAgent {
        FakeAgent::new(
            "h1",
            vec![
                UnitModel::new("prefill-0", Role::Prefill),
                UnitModel::new("decode-0", Role::Decode),
                UnitModel::new("router-0", Role::Router),
                UnitModel::new("other-prefill", Role::Prefill),
                UnitModel::new("other-decode", Role::Decode),
                UnitModel::new("shared-router", Role::Router),
            ],
        )
        .with_serving_router("shared-router")
    }

    fn begin(journal: &Journal, request_id: Option<&str>) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        journal.begin(&id, "co_restart", "p", request_id).unwrap();
        id
    }

    async fn co_restart(ctx: OperationContext, journal: &Journal, pair: crate::config::PairConfig) -> OperationReport {
        let id = begin(journal, None);
        let (tx, _rx) = mpsc::unbounded_channel();
        run_operation(ctx, pair, id, OperationKind::CoRestart, tx).await
    }

    /// While the operation runs, samples (every simulated ms) whether the
    /// serving router lists one of the pair's engines while a unit of the
    /// pair is not generating: the moments clients could reach a pair that
    /// is restarting. Returns those moments, described.
    fn watch_rotation(
        agent: &FakeAgent,
        op: &tokio::task::JoinHandle<OperationReport>,
    ) -> tokio::task::JoinHandle<Vec<String>> {
        let agent = agent.clone();
        let done = op.abort_handle();
        tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..600_000 {
                if done.is_finished() {
                    break;
                }
                let listed = agent.router_lists();
                let restarting: Vec<&str> = UNITS
                    .into_iter()
                    .filter(|u| agent.unit_phase(u) != Phase::Generating)
                    .collect();
                if !restarting.is_empty() && OURS.iter().any(|u| listed.iter().any(|l| l == u)) {
                    seen.push(format!("listed while {restarting:?} restart"));
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            seen
        })
    }

    /// Issue 18, point 1: out of rotation before anything stops, the wait
    /// ends when the engines' own gauges read idle (decode busy 3 s: the
    /// drain takes that long, not a fixed settle), the restart in order,
    /// back in rotation only after the healthy verdict; the other pair's
    /// engines are never touched.
    #[tokio::test(start_paused = true)]
    async fn a_shared_router_pair_leaves_rotation_drains_and_comes_back_after_a_healthy_verdict() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        let ctx = orchestrator(&journal, &agent).await;
        agent.busy_for("decode-0", 3_000);
        let pair = pair("shared-router", 60_000);
        let op = {
            let journal = journal.clone();
            tokio::spawn(async move { co_restart(ctx, &journal, pair).await })
        };
        let rotation = watch_rotation(&agent, &op);
        let report = op.await.unwrap();
        assert!(
            rotation.await.unwrap().is_empty(),
            "clients could reach the restarting pair"
        );
        assert!(report.verdict.is_healthy(), "{:?}", report.reasons);
        let d = report.drain.as_ref().expect("the report's drain section");
        assert_eq!(d.removed.iter().map(|w| w.url.as_str()).collect::<Vec<_>>(), OURS);
        let (out, drained) = (d.out_at_ms.unwrap(), d.drained_at_ms.unwrap());
        assert!(
            (3_000..6_000).contains(&(drained - out)),
            "the wait follows the engines' gauges: {out} → {drained}"
        );
        let first_spawn = report
            .timeline
            .iter()
            .filter(|t| t.phase == "spawned")
            .map(|t| t.at_ms)
            .min()
            .unwrap();
        assert!(first_spawn >= drained, "nothing restarted before the drain ended");
        assert!(d.rejoin.as_ref().is_some_and(|r| r.put_back), "{d:?}");
        let listed = agent.router_lists();
        for u in OURS.iter().chain(&THEIRS) {
            assert!(
                listed.iter().any(|l| l == u),
                "{u} is in rotation at the end: {listed:?}"
            );
        }
        for (op, urls, _) in agent.router_calls() {
            assert!(
                !THEIRS.iter().any(|t| urls.iter().any(|u| u == t)),
                "the other pair's engines were never named: {op} {urls:?}"
            );
        }
        for u in UNITS {
            assert_eq!(agent.starts_of(u), 1);
        }
        assert_eq!(
            agent.starts_of("shared-router"),
            0,
            "the serving router is never restarted"
        );
        assert!(
            report
                .reasons
                .iter()
                .any(|r| r.contains("taken out of the serving router h1/shared-router")),
            "{:?}",
            report.reasons
        );
    }

    /// A drain that runs out is reported with what was in flight, and the
    /// restart goes on.
    #[tokio::test(start_paused = true)]
    async fn a_drain_that_runs_out_is_reported_and_the_restart_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        let ctx = orchestrator(&journal, &agent).await;
        agent.busy_for("decode-0", 600_000);
        let report = co_restart(ctx, &journal, pair("shared-router", 2_000)).await;
        let d = report.drain.as_ref().unwrap();
        assert!(d.timed_out, "{d:?}");
        assert_eq!(d.in_flight_left, ["h1/decode-0: 1 in flight"]);
        assert!(report.verdict.is_healthy(), "{:?}", report.reasons);
        assert!(
            report
                .reasons
                .iter()
                .any(|r| r.contains("the drain timed out with work still in flight")),
            "{:?}",
            report.reasons
        );
    }

    /// Issue 32: the journal fails at every write of a co-restart behind a
    /// serving router (drain, restart, rejoin), and every write after it,
    /// then has room again. No engine is taken out of rotation and no unit
    /// started without its write-ahead entry; never healthy with a write
    /// failed before the conclusion, naming the journal; once the disk has
    /// room the operation concludes, every unit runs, and each engine of
    /// the pair is back in the serving router or the report says it is
    /// left out.
    #[tokio::test(start_paused = true)]
    async fn a_journal_that_fails_at_any_write_of_a_drained_co_restart_leaves_nothing_unrecorded() {
        async fn one(
            fail_from: Option<usize>,
        ) -> (
            OperationReport,
            usize,
            FakeAgent,
            std::sync::Arc<Journal>,
            tempfile::TempDir,
            String,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let journal = journal(&dir);
            let agent = agent();
            let ctx = orchestrator(&journal, &agent).await;
            let id = begin(&journal, None);
            let before = journal.writes_seen();
            if let Some(n) = fail_from {
                journal.fail_writes(before + n + 1..=before + n + 100_000);
            }
            let (tx, _rx) = mpsc::unbounded_channel();
            let report = run_operation(
                ctx,
                pair("shared-router", 60_000),
                id.clone(),
                OperationKind::CoRestart,
                tx,
            )
            .await;
            let writes = journal.writes_seen() - before;
            (report, writes, agent, journal, dir, id)
        }
        let (clean, total, ..) = one(None).await;
        assert!(clean.verdict.is_healthy(), "{:?}", clean.reasons);
        assert!(
            clean.drain.as_ref().is_some_and(|d| d.removed.len() == 2),
            "{:?}",
            clean.drain
        );
        let mut broken = Vec::new();
        for n in 0..total {
            let (report, _, agent, journal, _dir, id) = one(Some(n)).await;
            let at = format!("writes failing from write {n} of {total}");
            let reasons = &report.reasons;
            broken.extend(
                crate::ops::fake_agent::rig::done_unrecorded(&journal, std::slice::from_ref(&id), &agent)
                    .into_iter()
                    .map(|d| format!("{at}: {d}")),
            );
            let names_journal = reasons
                .iter()
                .any(|l| l.starts_with("stopped: the journal could not record a step"));
            if n + 1 < total && (report.verdict.is_healthy() || !names_journal) {
                broken.push(format!(
                    "{at}: {} without naming the journal: {reasons:?}",
                    report.verdict.as_str()
                ));
            }
            journal.heal();
            journal.flush_pending();
            tokio::time::sleep(Duration::from_secs(30)).await;
            if !journal.unfinished().unwrap().is_empty() {
                broken.push(format!("{at}: left running once the disk had room"));
            }
            for u in UNITS {
                if agent.unit_phase(u) != Phase::Generating {
                    broken.push(format!("{at}: {u} left {:?}", agent.unit_phase(u)));
                }
                if agent.starts_of(u) > 1 {
                    broken.push(format!("{at}: {u} started {} times", agent.starts_of(u)));
                }
            }
            let listed = agent.router_lists();
            let out: Vec<&str> = OURS.into_iter().filter(|u| !listed.iter().any(|l| l == u)).collect();
            if !out.is_empty() && !reasons.iter().any(|r| r.contains("left out of the serving router")) {
                broken.push(format!("{at}: {out:?} out of the serving router, unsaid: {reasons:?}"));
            }
        }
        assert!(
            broken.is_empty(),
            "{} violations of {total} runs: {broken:#?}",
            broken.len()
        );
    }

    /// A pair that is not healthy after its restart stays out of rotation.
    #[tokio::test(start_paused = true)]
    async fn a_pair_that_is_not_healthy_stays_out_of_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        let ctx = orchestrator(&journal, &agent).await;
        let op = {
            let journal = journal.clone();
            tokio::spawn(async move { co_restart(ctx, &journal, pair("shared-router", 60_000)).await })
        };
        for _ in 0..600_000 {
            if agent.starts_of("router-0") == 1 && agent.unit_phase("router-0") == Phase::Generating {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        agent.crash("router-0", "killed by signal 9 (SIGKILL)");
        let report = op.await.unwrap();
        assert!(!report.verdict.is_healthy(), "{:?}", report.reasons);
        let listed = agent.router_lists();
        assert!(!OURS.iter().any(|u| listed.iter().any(|l| l == u)), "{listed:?}");
        assert!(THEIRS.iter().all(|u| listed.iter().any(|l| l == u)), "{listed:?}");
        assert!(
            report
                .reasons
                .iter()
                .any(|r| r.starts_with("left out of the serving router")),
            "{:?}",
            report.reasons
        );
        assert!(
            !agent
                .router_calls()
                .iter()
                .any(|(op, ..)| *op == RouterWorkersOp::Add as i32),
            "nothing is added back"
        );
    }

    /// A KV path the serving router would create between the pair and the
    /// other engines fails (twice): the pair is healthy alone but kept out,
    /// with the path named — clients never meet it.
    #[tokio::test(start_paused = true)]
    async fn a_pair_whose_kv_paths_to_the_other_engines_fail_is_kept_out() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        let ctx = orchestrator(&journal, &agent).await;
        agent.break_kv_path("http://fake/other-prefill", "http://fake/decode-0");
        let report = co_restart(ctx, &journal, pair("shared-router", 60_000)).await;
        assert!(!report.verdict.is_healthy(), "{:?}", report.reasons);
        let listed = agent.router_lists();
        assert!(
            !OURS.iter().any(|u| listed.iter().any(|l| l == u)),
            "kept out: {listed:?}"
        );
        assert!(THEIRS.iter().all(|u| listed.iter().any(|l| l == u)), "{listed:?}");
        let kept_out = report
            .reasons
            .iter()
            .find(|r| r.contains("KEPT OUT of the serving router"))
            .unwrap_or_else(|| panic!("{:?}", report.reasons));
        assert!(
            kept_out.contains("1 of the 2 KV paths")
                && kept_out.contains("http://fake/other-prefill → http://fake/decode-0"),
            "{kept_out}"
        );
    }

    /// A serving router that cannot be driven stops a co-restart before any
    /// unit is touched; a recovery of a wedge goes on (its pair is broken).
    #[tokio::test(start_paused = true)]
    async fn a_drain_that_cannot_be_done_touches_nothing_except_for_a_recovery() {
        for recovery in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let journal = journal(&dir);
            let agent = agent();
            let ctx = orchestrator(&journal, &agent).await;
            let id = if recovery {
                let id = begin(&journal, Some("auto-x"));
                journal
                    .append(&id, 0, "trigger", &serde_json::json!({ "automatic": true }))
                    .unwrap();
                id
            } else {
                begin(&journal, None)
            };
            let (tx, _rx) = mpsc::unbounded_channel();
            // "router-0"'s agent has no worker API for it: the fake's
            // serving router is "shared-router".
            let mut p = pair("shared-router", 60_000);
            p.serving_router.as_mut().unwrap().unit = "not-a-router".into();
            let report = run_operation(ctx, p, id, OperationKind::CoRestart, tx).await;
            if recovery {
                assert!(report.verdict.is_healthy(), "{:?}", report.reasons);
                assert_eq!(agent.starts_of("decode-0"), 1);
            } else {
                assert!(!report.verdict.is_healthy());
                assert!(agent.executed().is_empty(), "{:?}", agent.executed());
                assert!(report.reasons[0].starts_with("not restarted"), "{:?}", report.reasons);
                assert!(
                    report.reasons[1].starts_with("drain through the serving router h1/not-a-router"),
                    "{:?}",
                    report.reasons
                );
            }
            assert!(journal.unfinished().unwrap().is_empty());
        }
    }

    /// The recovery of a wedge takes the pair out without waiting for work
    /// that will not finish.
    #[tokio::test(start_paused = true)]
    async fn a_recovery_does_not_wait_for_a_wedged_pairs_work() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal(&dir);
        let agent = agent();
        let ctx = orchestrator(&journal, &agent).await;
        agent.busy_for("decode-0", 600_000);
        let id = begin(&journal, Some("auto-x"));
        journal
            .append(&id, 0, "trigger", &serde_json::json!({ "automatic": true }))
            .unwrap();
        let (tx, _rx) = mpsc::unbounded_channel();
        let report = run_operation(ctx, pair("shared-router", 60_000), id, OperationKind::CoRestart, tx).await;
        let d = report.drain.as_ref().unwrap();
        assert!(!d.waited && !d.timed_out && d.drained_at_ms.is_none(), "{d:?}");
        assert!(report.total_ms < 30_000, "no drain wait: {} ms", report.total_ms);
        assert!(report.verdict.is_healthy(), "{:?}", report.reasons);
    }

    /// The orchestrator killed at every journal entry of a drained
    /// co-restart: each unit started once, the pair back in rotation at the
    /// end, and never in rotation while one of its units restarts.
    #[tokio::test(start_paused = true)]
    async fn killed_at_every_point_a_drained_co_restart_starts_each_unit_once_and_rejoins() {
        let entries_of_a_whole_run = {
            let dir = tempfile::tempdir().unwrap();
            let journal = journal(&dir);
            let agent = agent();
            let id = begin(&journal, None);
            let (tx, _rx) = mpsc::unbounded_channel();
            run_operation(
                orchestrator(&journal, &agent).await,
                pair("shared-router", 60_000),
                id.clone(),
                OperationKind::CoRestart,
                tx,
            )
            .await;
            journal.entries(&id).unwrap().len()
        };
        let mut states = std::collections::BTreeSet::new();
        for k in 1..entries_of_a_whole_run {
            let dir = tempfile::tempdir().unwrap();
            let journal = journal(&dir);
            let agent = agent();
            let id = begin(&journal, None);
            let (tx, _rx) = mpsc::unbounded_channel();
            let first = run_operation(
                orchestrator(&journal, &agent).await,
                pair("shared-router", 60_000),
                id.clone(),
                OperationKind::CoRestart,
                tx,
            );
            if !kill_after_entry(&journal, &id, k, first).await {
                continue;
            }
            let op = journal.unfinished().unwrap().pop().unwrap();
            let at = format!("killed after entry {k} in state {}", op.state);
            states.insert(op.state.clone());
            let resumed = tokio::spawn(resume(
                orchestrator(&journal, &agent).await,
                pair("shared-router", 60_000),
                op,
            ));
            let rotation = watch_rotation(&agent, &resumed);
            let report = resumed.await.unwrap();
            assert!(report.verdict.is_healthy(), "{at}: {:?}", report.reasons);
            for u in UNITS {
                assert_eq!(agent.starts_of(u), 1, "{at}: {:?}", agent.executed());
            }
            let listed = agent.router_lists();
            assert!(OURS.iter().all(|u| listed.iter().any(|l| l == u)), "{at}: {listed:?}");
            assert!(rotation.await.unwrap().is_empty(), "{at}: in rotation while restarting");
        }
        for s in ["draining", "restarting_prefill", "probing", "rejoining"] {
            assert!(states.contains(s), "never killed in {s}: {states:?}");
        }
    }
}
