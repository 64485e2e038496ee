//! The PD-probe toolbox the drain, the rejoin and the co-restart share:
//! the pair's engines as a router lists them, one scrape of their gauges,
//! the KV paths a PD router creates between engines and one probe over
//! such a path, and the serving router's worker API through its agent.
//! (It lived in the drain's file, which the co-restart then borrowed from;
//! issue 33 split it out.)

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::join_all;
use pdwarden_proto::v1::{
    ChatProbe, Command, EngineSample, PdPath, ProbeOutcome, ProbeRequest, RouterWorker, RouterWorkers, RouterWorkersOp,
    RouterWorkersResult, ScrapeEngines, WatchTarget, command,
};

use crate::config::{PairConfig, UnitRef};
use crate::ops::port::{AgentPort, AgentReport, AskError};
use pdwarden_model::report::PairWorker;

/// Timeout of one request the agent makes to the router, or of one scrape.
pub(crate) const REQUEST_TIMEOUT_MS: u64 = 5_000;

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
pub fn pair_workers(agents: &dyn AgentPort, pair: &PairConfig) -> Result<Vec<PairWorker>, UnknownUrls> {
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
        Err(UnknownUrls(unknown))
    }
}

/// Engines whose agents are not connected: the serving router cannot be
/// told their URLs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the URL of {} is unknown: its agent is not connected", .0.join(", "))]
pub struct UnknownUrls(pub Vec<String>);

pub(crate) fn same_url(a: &str, b: &str) -> bool {
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
    pub(crate) fn describe(&self) -> String {
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
pub(crate) async fn check_paths(
    agents: &dyn AgentPort,
    router: &UnitRef,
    pair: &PairConfig,
    paths: &[KvPath],
) -> Vec<String> {
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
    /// The probe failed, and one side of the path ("prefill" or "decode")
    /// did not accept its connection while the other did (issue 46).
    #[error("{error}")]
    Unreachable { side: String, error: String },
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
    let chat = ChatProbe {
        model: pair.probe.model.clone(),
        prompt: pair.probe.prompt.clone(),
        max_tokens: pair.probe.max_tokens,
        greedy: false,
    };
    pd_probe_with(agents, via, pair, path, chat).await.map(|_| ())
}

/// [`pd_probe`] with the request `chat` (a greedy one, whose answer is
/// held to the reference: issue 46), answering the agent's result.
pub async fn pd_probe_with(
    agents: &dyn AgentPort,
    via: &UnitRef,
    pair: &PairConfig,
    path: PdPath,
    chat: ChatProbe,
) -> Result<pdwarden_proto::v1::ProbeResult, ProbeError> {
    // A greedy request asks for more than a probe, with logprobs: its
    // deadline is its own (issue 47).
    let timeout_ms = if chat.greedy {
        crate::ops::corestart::output::greedy_deadline_ms(pair, None, chat.max_tokens)
    } else {
        pair.probe.probe_timeout_ms
    };
    let cmd = Command {
        fencing_token: 0,
        command_id: uuid::Uuid::new_v4().to_string(),
        action: Some(command::Action::Probe(ProbeRequest {
            unit: via.unit.clone(),
            chat: Some(chat),
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
        Ok(answer)
    } else if answer.error.is_empty() {
        Err(ProbeError::NoAnswer)
    } else if !answer.unreachable.is_empty() {
        Err(ProbeError::Unreachable {
            side: answer.unreachable,
            error: answer.error,
        })
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
pub(crate) async fn router_call(
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
