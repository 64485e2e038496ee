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

use std::time::Duration;

use tokio::time::Instant;

use pdwarden_engines::{EngineKind, Signal};

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
}

impl EngineMetrics {
    fn slot(&mut self, signal: Signal) -> &mut Option<f64> {
        match signal {
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
        }
    }
}

/// Parses Prometheus text exposition format (comments, `name{labels} value
/// [timestamp]`). Lines that do not parse are skipped: one odd metric must
/// not blind the watch.
pub fn parse(text: &str) -> EngineMetrics {
    let mut m = EngineMetrics::default();
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
        let Some((engine, signal)) = pdwarden_engines::signal_of(name) else {
            continue;
        };
        m.engine.get_or_insert(engine);
        let slot = m.slot(signal);
        *slot = Some(slot.unwrap_or(0.0) + value);
    }
    m
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

/// One scrape's outcome.
#[derive(Debug, Clone)]
pub struct Scrape {
    pub metrics: Result<EngineMetrics, String>,
    pub latency: Duration,
}

/// GETs `url` (an engine's `/metrics`) within `timeout`.
pub async fn scrape(client: &reqwest::Client, url: &str, timeout: Duration) -> Scrape {
    let started = Instant::now();
    let exchange = async {
        let resp = client.get(url).send().await.map_err(|e| error_chain(&e))?;
        let status = resp.status();
        // SGLang's /metrics is a few tens of KiB; anything past this is broken.
        let text = crate::checks::read_body_limited(resp, 8 << 20).await?;
        if !status.is_success() {
            return Err(format!("http {}", status.as_u16()));
        }
        Ok(parse(&text))
    };
    let metrics = match tokio::time::timeout(timeout, exchange).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
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
}
