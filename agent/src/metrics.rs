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

use crate::checks::error_chain;

/// The numbers a wedge judgement needs, from one scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineMetrics {
    /// `sglang:num_running_reqs`
    pub running_reqs: Option<f64>,
    /// `sglang:num_queue_reqs`
    pub queued_reqs: Option<f64>,
    /// `sglang:gen_throughput` (tokens/s; a gauge engines may leave stale).
    pub gen_throughput: Option<f64>,
    /// `sglang:generation_tokens_total`
    pub generation_tokens_total: Option<f64>,
    /// `sglang:prompt_tokens_total`
    pub prompt_tokens_total: Option<f64>,
    /// `sglang:num_requests_total`
    pub requests_total: Option<f64>,
    /// `sglang:num_aborted_requests_total`
    pub aborted_requests_total: Option<f64>,
    /// `sglang:num_transfer_failed_reqs_total` (PD: KV transfers that failed).
    pub transfer_failed_total: Option<f64>,
    /// `sglang:num_bootstrap_failed_reqs_total` (PD: bootstraps that failed).
    pub bootstrap_failed_total: Option<f64>,
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
        let slot = match name {
            "sglang:num_running_reqs" => &mut m.running_reqs,
            "sglang:num_queue_reqs" => &mut m.queued_reqs,
            "sglang:gen_throughput" => &mut m.gen_throughput,
            "sglang:generation_tokens_total" => &mut m.generation_tokens_total,
            "sglang:prompt_tokens_total" => &mut m.prompt_tokens_total,
            "sglang:num_requests_total" => &mut m.requests_total,
            "sglang:num_aborted_requests_total" => &mut m.aborted_requests_total,
            "sglang:num_transfer_failed_reqs_total" => &mut m.transfer_failed_total,
            "sglang:num_bootstrap_failed_reqs_total" => &mut m.bootstrap_failed_total,
            _ => continue,
        };
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
}
