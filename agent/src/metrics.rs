//! Scraping an engine's Prometheus `/metrics` and reading the few numbers
//! that say whether it is making progress.
//!
//! Passive evidence comes first (issue 5): an engine that serves real traffic
//! proves its liveness through its own counters, at no cost to it. SGLang
//! exposes `sglang:num_running_reqs`, `sglang:num_queue_reqs`,
//! `sglang:gen_throughput` and the token counters; this module turns the text
//! format into an [`EngineMetrics`] value. Values are summed over label sets
//! (one engine may report per model or per rank), and a metric the engine does
//! not expose stays `None`: absent evidence is not a zero. The parser is pure
//! and unit-tested; [`scrape`] is the HTTP edge.
//!
//! A router's `/metrics` (on its own Prometheus port) carries what it hid
//! from its client (issue 30, DESIGN.md 16): the retries and backend errors
//! of each worker. Those counters are kept per worker, keyed by the label
//! the router names it with (`pdwarden_engines::WorkerLabels`), summed over
//! every other label; a router exposes them only from their first
//! increment, so there an absent counter is 0.

use std::time::Duration;

use tokio::time::Instant;

use pdwarden_engines::{EngineKind, Signal};
use pdwarden_proto::v1::RouterWorkerCounters;

use crate::checks::error_chain;

/// The numbers a wedge judgement needs, from one scrape. Which engine
/// metric fills which field is the engine profiles' business
/// (`pdwarden_engines`): SGLang's and vLLM's names are both read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineMetrics {
    /// The engine whose metric names were seen (the first one, if both).
    pub engine: Option<EngineKind>,
    /// `sglang:num_running_reqs`, `vllm:num_requests_running`
    pub running_reqs: Option<f64>,
    /// `sglang:num_queue_reqs`, `vllm:num_requests_waiting`
    pub queued_reqs: Option<f64>,
    /// `sglang:gen_throughput` (tokens/s; a gauge engines may leave stale).
    pub gen_throughput: Option<f64>,
    /// `sglang:generation_tokens_total` (at finish), `vllm:generation_tokens_total` (per step)
    pub generation_tokens_total: Option<f64>,
    /// `sglang:prompt_tokens_total` (at finish), `vllm:prompt_tokens_total` (per step)
    pub prompt_tokens_total: Option<f64>,
    /// `sglang:num_requests_total`, `vllm:request_success_total`
    pub requests_total: Option<f64>,
    /// `sglang:num_aborted_requests_total`
    pub aborted_requests_total: Option<f64>,
    /// `sglang:realtime_tokens_total`, every mode (rises during work).
    pub realtime_tokens_total: Option<f64>,
    /// `sglang:num_prefill_prealloc_queue_reqs`
    pub prefill_prealloc_queue_reqs: Option<f64>,
    /// `sglang:num_prefill_inflight_queue_reqs`
    pub prefill_inflight_queue_reqs: Option<f64>,
    /// `sglang:num_decode_prealloc_queue_reqs`
    pub decode_prealloc_queue_reqs: Option<f64>,
    /// `sglang:num_decode_transfer_queue_reqs`
    pub decode_transfer_queue_reqs: Option<f64>,
    /// `sglang:num_transfer_failed_reqs_total` (PD: KV transfers that failed).
    pub transfer_failed_total: Option<f64>,
    /// `sglang:num_bootstrap_failed_reqs_total` (PD: bootstraps that failed).
    pub bootstrap_failed_total: Option<f64>,
    /// A router's retries and worker errors, one entry per worker it names
    /// (by URL, else by type; `""` for a counter of the router as a whole),
    /// in order of (worker, worker_type). Empty for an engine, and for a
    /// router that has counted nothing yet.
    pub router_workers: Vec<RouterWorkerCounters>,
    /// A router's generation requests taken, and those it answered with an
    /// error (issue 47; `pdwarden_engines::router_traffic`).
    pub router_requests_total: Option<f64>,
    pub router_failed_total: Option<f64>,
}

impl EngineMetrics {
    /// The engine field `signal` fills (`None`: a router's per-worker
    /// counter, kept in `router_workers`).
    fn slot(&mut self, signal: Signal) -> Option<&mut Option<f64>> {
        Some(match signal {
            Signal::RunningReqs => &mut self.running_reqs,
            Signal::QueuedReqs => &mut self.queued_reqs,
            Signal::GenThroughput => &mut self.gen_throughput,
            Signal::GenerationTokens => &mut self.generation_tokens_total,
            Signal::PromptTokens => &mut self.prompt_tokens_total,
            Signal::Requests => &mut self.requests_total,
            Signal::AbortedRequests => &mut self.aborted_requests_total,
            Signal::RealtimeTokens => &mut self.realtime_tokens_total,
            Signal::PrefillPreallocQueue => &mut self.prefill_prealloc_queue_reqs,
            Signal::PrefillInflightQueue => &mut self.prefill_inflight_queue_reqs,
            Signal::DecodePreallocQueue => &mut self.decode_prealloc_queue_reqs,
            Signal::DecodeTransferQueue => &mut self.decode_transfer_queue_reqs,
            Signal::TransferFailed => &mut self.transfer_failed_total,
            Signal::BootstrapFailed => &mut self.bootstrap_failed_total,
            Signal::RouterRetries | Signal::RouterErrors => return None,
        })
    }
}

/// The most workers one router scrape keeps apart; counts of any further
/// ones are summed under [`OTHER_WORKERS`] (a real router has a handful;
/// a broken exporter must not make the sample unbounded).
pub const MAX_ROUTER_WORKERS: usize = 256;
/// Where the counts of workers past [`MAX_ROUTER_WORKERS`] go.
pub const OTHER_WORKERS: &str = "(other workers)";

/// A router's counters during a parse, by (worker, worker type): (retries, errors).
type RouterCounts = std::collections::BTreeMap<(String, String), (f64, f64)>;

/// Adds `value` of router counter `metric` to the worker its labels name
/// (its URL, else its type, else "" for the router as a whole).
fn add_router(counts: &mut RouterCounts, metric: &pdwarden_engines::Metric, labels: &[(String, String)], value: f64) {
    let Some(names) = metric.worker_labels else { return };
    let label = |name: &str| {
        if name.is_empty() {
            return "";
        }
        labels.iter().find(|(k, _)| k == name).map_or("", |(_, v)| v.as_str())
    };
    let url = label(names.worker);
    let worker_type = match label(names.worker_type) {
        "" => names.implied_type,
        t => t,
    };
    let worker = if url.is_empty() { worker_type } else { url };
    let mut key = (worker.to_owned(), worker_type.to_owned());
    if !counts.contains_key(&key) && counts.len() >= MAX_ROUTER_WORKERS {
        key = (OTHER_WORKERS.to_owned(), String::new());
    }
    let entry = counts.entry(key).or_default();
    match metric.signal {
        Signal::RouterRetries => entry.0 += value,
        _ => entry.1 += value,
    }
}

/// Parses Prometheus text exposition format (comments, `name{labels} value
/// [timestamp]`). Lines that do not parse are skipped: one odd metric must
/// not blind the watch.
pub fn parse(text: &str) -> EngineMetrics {
    let mut m = EngineMetrics::default();
    let mut router = RouterCounts::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, rest)) = split_name(line) else { continue };
        let Some(value) = rest.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        if !value.is_finite() {
            continue;
        }
        if name.starts_with("smg_router_request") || name.starts_with("vllm_router_") {
            let traffic = pdwarden_engines::router_traffic(name, &labels_of(line, name.len()));
            let slot = match traffic {
                Some(pdwarden_engines::RouterTraffic::Request) => Some(&mut m.router_requests_total),
                Some(pdwarden_engines::RouterTraffic::Failed) => Some(&mut m.router_failed_total),
                None => None,
            };
            if let Some(slot) = slot {
                *slot = Some(slot.unwrap_or(0.0) + value);
                continue;
            }
        }
        if let Some((kind, metric)) = pdwarden_engines::router_metric_of(name) {
            m.engine.get_or_insert(kind);
            add_router(&mut router, metric, &labels_of(line, name.len()), value);
            continue;
        }
        let Some((engine, signal)) = pdwarden_engines::signal_of(name) else {
            continue;
        };
        m.engine.get_or_insert(engine);
        if let Some(slot) = m.slot(signal) {
            *slot = Some(slot.unwrap_or(0.0) + value);
        }
    }
    m.router_workers = router
        .into_iter()
        .map(
            |((worker, worker_type), (retries_total, errors_total))| RouterWorkerCounters {
                worker,
                worker_type,
                retries_total,
                errors_total,
            },
        )
        .collect();
    m
}

/// The label pairs of a sample line whose name ends at byte `at`
/// (`name{a="x",b="y"} 1`); none when the line has no label set. Escapes
/// (`\\`, `\"`, `\n`) are undone; a malformed set yields what parsed before
/// the fault. Never panics.
fn labels_of(line: &str, at: usize) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Some(rest) = line.get(at..).and_then(|r| r.strip_prefix('{')) else {
        return out;
    };
    let mut chars = rest.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace() || *c == ',').is_some() {}
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && *c != '}') {
            key.push(c);
        }
        if chars.next() != Some('=') {
            return out;
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('"') {
            return out;
        }
        let mut value = String::new();
        loop {
            match chars.next() {
                None => return out,
                Some('"') => break,
                Some('\\') => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(c) => value.push(c),
                    None => return out,
                },
                Some(c) => value.push(c),
            }
        }
        out.push((key.trim().to_owned(), value));
    }
}

/// Splits a sample line into its metric name and what follows the labels.
fn split_name(line: &str) -> Option<(&str, &str)> {
    match line.find(['{', ' ', '\t']) {
        Some(i) if line.as_bytes()[i] == b'{' => {
            // Label values may contain '}' inside quotes; find the closing brace outside quotes.
            let bytes = line.as_bytes();
            let (mut j, mut quoted, mut escaped) = (i + 1, false, false);
            while j < bytes.len() {
                let c = bytes[j];
                if escaped {
                    escaped = false;
                } else if c == b'\\' {
                    escaped = true;
                } else if c == b'"' {
                    quoted = !quoted;
                } else if c == b'}' && !quoted {
                    return Some((&line[..i], &line[j + 1..]));
                }
                j += 1;
            }
            None
        }
        Some(i) => Some((&line[..i], &line[i..])),
        None => None,
    }
}

/// Why a scrape of an engine's `/metrics` gave no metrics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScrapeError {
    /// The request failed: the HTTP client's error, with its causes.
    #[error("{0}")]
    Request(String),
    /// The answer's body could not be read.
    #[error(transparent)]
    Body(#[from] crate::checks::BodyError),
    /// The engine answered with this non-success HTTP status.
    #[error("http {0}")]
    Status(u16),
    /// No answer within the timeout (ms).
    #[error("no answer within {0} ms")]
    TimedOut(u128),
}

/// One scrape's outcome.
#[derive(Debug, Clone)]
pub struct Scrape {
    pub metrics: Result<EngineMetrics, ScrapeError>,
    pub latency: Duration,
}

/// GETs `url` (an engine's `/metrics`) within `timeout`.
pub async fn scrape(client: &reqwest::Client, url: &str, timeout: Duration) -> Scrape {
    let started = Instant::now();
    let exchange = async {
        let resp = client
            .get(url)
            .send()
            .await
            .map_err(|e| ScrapeError::Request(error_chain(&e)))?;
        let status = resp.status();
        // SGLang's /metrics is a few tens of KiB; anything past this is broken.
        let text = crate::checks::read_body_limited(resp, 8 << 20).await?;
        if !status.is_success() {
            return Err(ScrapeError::Status(status.as_u16()));
        }
        Ok(parse(&text))
    };
    let metrics = match tokio::time::timeout(timeout, exchange).await {
        Ok(r) => r,
        Err(_) => Err(ScrapeError::TimedOut(timeout.as_millis())),
    };
    Scrape {
        metrics,
        latency: started.elapsed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Property: SGLang's names are read, summed over label sets, and a
    /// metric that is not exposed stays `None` (absent evidence is not zero).
    #[test]
    fn reads_sglang_names_and_sums_label_sets() {
        let text = r#"
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 1
sglang:num_running_reqs{model_name="m",tp_rank="1"} 2
sglang:num_queue_reqs{model_name="a \"}\" b"} 4.0
sglang:generation_tokens_total{model_name="m"} 1.2345e4 1700000000
sglang:prompt_tokens_total 41818
sglang:unrelated{x="y"} 9
garbage line
"#;
        let m = parse(text);
        assert_eq!(m.running_reqs, Some(3.0));
        assert_eq!(m.queued_reqs, Some(4.0));
        assert_eq!(m.generation_tokens_total, Some(12_345.0));
        assert_eq!(m.prompt_tokens_total, Some(41_818.0));
        assert_eq!(m.gen_throughput, None);
        assert_eq!(m.aborted_requests_total, None);
    }

    /// Property: vLLM's names fill the same fields, SGLang's realtime
    /// counter is summed over its modes, and the engine is recognised.
    #[test]
    fn reads_vllm_names_and_sglang_realtime_modes() {
        let vllm = parse(
            "vllm:num_requests_running{model_name=\"m\"} 2\nvllm:num_requests_waiting{model_name=\"m\"} 5\n\
             vllm:generation_tokens_total{model_name=\"m\"} 77\nvllm:prompt_tokens_total{model_name=\"m\"} 900\n",
        );
        assert_eq!(vllm.engine, Some(EngineKind::Vllm));
        assert_eq!((vllm.running_reqs, vllm.queued_reqs), (Some(2.0), Some(5.0)));
        assert_eq!(vllm.generation_tokens_total, Some(77.0));
        assert_eq!(vllm.realtime_tokens_total, None);
        let sglang = parse(
            "sglang:realtime_tokens_total{mode=\"prefill_compute\"} 8192\n\
             sglang:realtime_tokens_total{mode=\"prefill_cache\"} 8\n\
             sglang:realtime_tokens_total{mode=\"decode\"} 40\n\
             sglang:num_decode_transfer_queue_reqs 3\nsglang:num_prefill_inflight_queue_reqs 1\n",
        );
        assert_eq!(sglang.engine, Some(EngineKind::Sglang));
        assert_eq!(sglang.realtime_tokens_total, Some(8240.0));
        assert_eq!(sglang.decode_transfer_queue_reqs, Some(3.0));
        assert_eq!(sglang.prefill_inflight_queue_reqs, Some(1.0));
    }

    /// Expositions captured from the real sglang-router 0.3.2 (`smg launch
    /// --pd-disaggregation … --prometheus-port M`, `curl :M/metrics`) in
    /// front of two stand-in workers, after one chat completion: both
    /// answering 200; the decode answering 500 once, then 200 (the client
    /// saw 200); the decode always answering 500 (the client saw 500 after
    /// five attempts).
    const SMG_OK: &str = include_str!("../tests/fixtures/sglang-router-0.3.2-metrics-ok.txt");
    const SMG_500_ONCE: &str = include_str!("../tests/fixtures/sglang-router-0.3.2-metrics-decode-500-once.txt");
    const SMG_500_ALWAYS: &str = include_str!("../tests/fixtures/sglang-router-0.3.2-metrics-decode-500-always.txt");

    fn counters(worker: &str, worker_type: &str, retries: f64, errors: f64) -> RouterWorkerCounters {
        RouterWorkerCounters {
            worker: worker.into(),
            worker_type: worker_type.into(),
            retries_total: retries,
            errors_total: errors,
        }
    }

    /// Property (issue 30): the real router's retries and backend errors
    /// are read per worker type, summed over endpoint and error type; a
    /// router that has counted nothing exposes no counter, and none is
    /// invented; no engine field is filled from a router's names.
    #[test]
    fn reads_the_real_sglang_router_counters_per_worker_type() {
        let ok = parse(SMG_OK);
        assert_eq!(ok.router_workers, vec![]);
        assert_eq!(ok.running_reqs, None);
        let once = parse(SMG_500_ONCE);
        assert_eq!(once.engine, Some(EngineKind::SglangRouter));
        assert_eq!(
            once.router_workers,
            vec![
                counters("decode", "decode", 1.0, 1.0),
                counters("prefill", "prefill", 1.0, 1.0)
            ]
        );
        assert_eq!(once.generation_tokens_total, None);
        let always = parse(SMG_500_ALWAYS);
        assert_eq!(
            always.router_workers,
            vec![
                counters("decode", "decode", 4.0, 5.0),
                counters("prefill", "prefill", 4.0, 5.0)
            ]
        );
    }

    /// Issue 47: a router's own count of the generation requests it routed
    /// and of those it failed (sglang-router 0.3.2 as scraped; vllm-router
    /// by route, its health route not counted).
    #[test]
    fn a_routers_traffic_is_read_beside_its_retries() {
        let smg = parse(
            "smg_router_requests_total{router_type=\"http\",backend_type=\"pd\",connection_mode=\"http\",model=\"m\",endpoint=\"chat\",streaming=\"false\"} 20\n\
             smg_router_requests_total{router_type=\"http\",backend_type=\"pd\",connection_mode=\"http\",model=\"m\",endpoint=\"chat\",streaming=\"true\"} 3\n\
             smg_router_request_errors_total{router_type=\"http\",backend_type=\"pd\",model=\"m\",endpoint=\"chat\",error_type=\"backend_error\"} 2\n\
             smg_http_requests_total{method=\"GET\",path=\"/readiness\"} 6\n\
             smg_http_responses_total{status_code=\"503\",error_code=\"\"} 4\n",
        );
        assert_eq!(smg.router_requests_total, Some(23.0));
        assert_eq!(smg.router_failed_total, Some(2.0));
        let vllm = parse(
            "vllm_router_pd_requests_total{route=\"/v1/chat/completions\"} 18\n\
             vllm_router_requests_total{route=\"/v1/completions\"} 7\n\
             vllm_router_requests_total{route=\"/health\"} 100\n\
             vllm_router_request_errors_total{route=\"/v1/completions\",error_type=\"upstream\"} 1\n",
        );
        assert_eq!(vllm.router_requests_total, Some(25.0));
        assert_eq!(vllm.router_failed_total, Some(1.0));
        assert_eq!(parse("sglang:num_running_reqs 1\n").router_requests_total, None);
    }

    /// Property: errors are summed over every label but the worker's
    /// (several error types, connection modes); vllm-router's counters are
    /// keyed by the worker URL with the type their name implies, its
    /// retries (labelled by route only) by the router as a whole; label
    /// values with escapes, commas and braces are read whole.
    #[test]
    fn router_counters_key_by_worker_and_sum_other_labels() {
        let smg = parse(
            "smg_worker_errors_total{worker_type=\"decode\",connection_mode=\"http\",error_type=\"backend_error\"} 2\n\
             smg_worker_errors_total{worker_type=\"decode\",connection_mode=\"http\",error_type=\"timeout\"} 3\n\
             smg_worker_retries_total{worker_type=\"decode\",endpoint=\"generate\"} 1\n\
             smg_worker_retries_total{worker_type=\"decode\",endpoint=\"chat\"} 2\n",
        );
        assert_eq!(smg.router_workers, vec![counters("decode", "decode", 3.0, 5.0)]);
        let vllm = parse(
            "# TYPE vllm_router_pd_decode_errors_total counter\n\
             vllm_router_pd_decode_errors_total{worker=\"http://10.0.0.2:8200\"} 2\n\
             vllm_router_pd_stream_errors_total{worker=\"http://10.0.0.2:8200\"} 1\n\
             vllm_router_pd_prefill_errors_total{worker=\"http://10.0.0.1:8100\"} 4\n\
             vllm_router_retries_total{route=\"/v1/chat/completions\"} 6\n\
             vllm_router_processed_requests_total{worker=\"http://10.0.0.2:8200\"} 40\n",
        );
        assert_eq!(vllm.engine, Some(EngineKind::VllmRouter));
        assert_eq!(
            vllm.router_workers,
            vec![
                counters("", "", 6.0, 0.0),
                counters("http://10.0.0.1:8100", "prefill", 0.0, 4.0),
                counters("http://10.0.0.2:8200", "decode", 0.0, 3.0)
            ]
        );
        let odd = parse(
            "vllm_router_pd_decode_errors_total{ worker = \"http://a/\\\"x\\\",}{\" , other=\"1\"} 1\n\
             vllm_router_pd_decode_errors_total{worker=\"unterminated} 1\n\
             vllm_router_pd_decode_errors_total{worker=\"http://b\"} NaN\n",
        );
        assert_eq!(
            odd.router_workers,
            vec![counters("http://a/\"x\",}{", "decode", 0.0, 1.0)]
        );
    }

    /// Property: a scrape keeps at most MAX_ROUTER_WORKERS workers apart;
    /// the counts of the rest are summed, not dropped.
    #[test]
    fn router_workers_are_bounded_without_dropping_counts() {
        let text: String = (0..MAX_ROUTER_WORKERS + 10)
            .map(|i| format!("vllm_router_pd_decode_errors_total{{worker=\"http://w{i:04}\"}} 1\n"))
            .collect();
        let m = parse(&text);
        assert_eq!(m.router_workers.len(), MAX_ROUTER_WORKERS + 1);
        let other = m.router_workers.iter().find(|w| w.worker == OTHER_WORKERS).unwrap();
        assert_eq!(other.errors_total, 10.0);
        let total: f64 = m.router_workers.iter().map(|w| w.errors_total).sum();
        assert_eq!(total, (MAX_ROUTER_WORKERS + 10) as f64);
    }

    /// Property: the label reader never panics and undoes escapes.
    #[test]
    fn labels_are_read_without_panics() {
        assert_eq!(
            labels_of("m{a=\"1\",b=\"x\\ny\\\\\"} 1", 1),
            vec![("a".into(), "1".into()), ("b".into(), "x\ny\\".into())]
        );
        for line in [
            "m",
            "m{",
            "m{a",
            "m{a=",
            "m{a=\"",
            "m{a=\"\\",
            "m{=\"\"}",
            "m{é=\"ü\"} 1",
            "{}",
        ] {
            let _ = labels_of(line, 1);
            let _ = labels_of(line, 99);
        }
        assert_eq!(labels_of("m{é=\"ü\"} 1", 1), vec![("é".into(), "ü".into())]);
    }
}
