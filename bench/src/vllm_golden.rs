//! The real tier's golden output (issue 34): false alarms over repeated
//! co-restarts of one real vLLM pair.
//!
//! After every co-restart pdwarden sends one greedy request (temperature 0,
//! logprobs) through the router and holds its tokens to the reference the
//! pair recorded (`model::judge::golden`; the report's `golden`). A false
//! alarm is a healthy real pair whose restart reports `diverged` or
//! `unanswered`. Measured: `pdwarden demo --engine vllm --json --hold` (its
//! own co-restart records the reference), then [`RESTARTS`] × `pdwarden
//! restart pd-pair demo --json` against it, every [`TRAFFIC_EVERY`]th while
//! a background client sends real chat completions through the router (two
//! concurrent streams, one sampled and one greedy, each bounded); each
//! restart's verdict, `golden.check.outcome`, first reason when not healthy
//! and duration are tallied.
//!
//! Opt-in (`--only vllm-golden`): it needs the vLLM stack of
//! `scripts/setup-vllm.sh` (`vllm_watch::unavailable`). Every process it
//! starts is stopped before the section ends, errors included: the demo by
//! SIGTERM to its PID (it stops the stack it started), then SIGKILL of it
//! and of every process under it if it has not exited; each CLI call is
//! killed if it outlives its limit; the client streams end before the
//! section does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::vllm_watch::Cli;

/// Co-restarts measured (the "≥ 20").
pub const RESTARTS: usize = 20;
/// Every this many-th restart runs under client traffic (3rd, 6th, …).
pub const TRAFFIC_EVERY: usize = 3;
/// The client's concurrent streams: name and temperature.
pub const STREAMS: [(&str, f64); 2] = [("sampled", 0.8), ("greedy", 0.0)];
/// Tokens each client request asks for.
pub const CLIENT_MAX_TOKENS: u32 = 16;
/// At most this many requests per stream per restart (the bound).
const STREAM_LIMIT: u32 = 400;
/// A client request's limit.
const REQUEST_LIMIT: Duration = Duration::from_secs(30);
/// The pause after a request the router refused or failed (it is
/// restarted with the pair), and between answered ones.
const FAILED_PAUSE: Duration = Duration::from_millis(250);
const ANSWERED_PAUSE: Duration = Duration::from_millis(50);
/// One `restart pd-pair` (real start-ups, probes, suite, output check).
const RESTART_LIMIT: Duration = Duration::from_secs(300);
/// The section stops after this many restarts in a row that gave no report.
const ERRORS_IN_A_ROW: usize = 3;

/// What the client streams sent during one restart.
#[derive(Debug, Clone, Copy, Default)]
pub struct Traffic {
    pub answered: u32,
    pub failed: u32,
}

/// One co-restart and what its report says.
pub struct Row {
    /// 1-based.
    pub n: usize,
    /// The client traffic sent while it ran, if any.
    pub traffic: Option<Traffic>,
    /// The report's verdict, or `error` when the CLI gave no report.
    pub verdict: String,
    /// `golden.check.outcome`, or `none` when the report has no `golden`.
    pub outcome: String,
    /// Where and by how much the greedy answer differed (`near_tie`,
    /// `diverged`), or why it failed (`unanswered`).
    pub golden_detail: Option<String>,
    /// `golden_paths` entries that found wrong output (an xPyD pair's).
    pub paths_wrong: usize,
    /// The first reason when not healthy (or the CLI's error).
    pub reason: Option<String>,
    /// The report's `total_ms`, s.
    pub total_s: Option<f64>,
    /// The CLI's wall time, s.
    pub wall_s: f64,
}

impl Row {
    pub fn healthy(&self) -> bool {
        self.verdict.starts_with("healthy")
    }

    /// A real pair with nothing wrong with it reported wrong output (or an
    /// unanswered greedy request).
    pub fn false_alarm(&self) -> bool {
        matches!(self.outcome.as_str(), "diverged" | "unanswered") || self.paths_wrong > 0
    }
}

pub struct Outcome {
    /// The demo's start and co-restart, s.
    pub demo_s: Option<f64>,
    /// The demo's own co-restart: its `golden.check.outcome` (the first
    /// verification of the identity: `no_reference`) and the reference's
    /// length in tokens.
    pub demo_outcome: Option<String>,
    pub reference_tokens: Option<usize>,
    pub rows: Vec<Row>,
    /// What stopped the section early, if anything (rows measured before it stand).
    pub error: Option<String>,
}

pub async fn run() -> Outcome {
    let mut out = Outcome {
        demo_s: None,
        demo_outcome: None,
        reference_tokens: None,
        rows: Vec::new(),
        error: None,
    };
    let started = Instant::now();
    let (held, cli, report) = match crate::vllm_watch::start_demo(&[], "vllm-golden").await {
        Ok(v) => v,
        Err(e) => {
            out.error = Some(format!("{e:#}"));
            return out;
        }
    };
    out.demo_s = Some(started.elapsed().as_secs_f64());
    out.demo_outcome = report["golden"]["check"]["outcome"].as_str().map(str::to_owned);
    out.reference_tokens = report["golden"]["reference"]["answer"]["tokens"]
        .as_array()
        .map(Vec::len);
    if let Err(e) = measure(&cli, &mut out.rows).await {
        out.error = Some(format!("{e:#}"));
    }
    held.stop();
    out
}

async fn measure(cli: &Cli, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let http = reqwest::Client::builder().no_proxy().build()?;
    let mut errors = 0;
    for n in 1..=RESTARTS {
        let traffic = if n % TRAFFIC_EVERY == 0 {
            let router = unit_url(
                &cli.json_within(&["status", "--json"], Duration::from_secs(60)).await?,
                "router-0",
            )?;
            eprintln!("vllm-golden: restart {n}/{RESTARTS} under client traffic…");
            let t = Client::start(&http, &router);
            // The streams are running before the restart begins.
            tokio::time::sleep(Duration::from_secs(2)).await;
            Some(t)
        } else {
            eprintln!("vllm-golden: restart {n}/{RESTARTS}…");
            None
        };
        let t0 = Instant::now();
        let answer = cli
            .json_within(&["restart", "pd-pair", "demo", "--json"], RESTART_LIMIT)
            .await;
        let wall_s = t0.elapsed().as_secs_f64();
        let traffic = match traffic {
            Some(t) => Some(t.stop().await),
            None => None,
        };
        let row = match answer {
            Ok(r) if r["verdict"].is_string() => {
                errors = 0;
                row_of(n, traffic, &r, wall_s)
            }
            Ok(r) => {
                errors += 1;
                error_row(
                    n,
                    traffic,
                    wall_s,
                    r["error"].as_str().unwrap_or("no verdict in the report"),
                )
            }
            Err(e) => {
                errors += 1;
                error_row(n, traffic, wall_s, &format!("{e:#}"))
            }
        };
        eprintln!(
            "vllm-golden: restart {n}: {} ({}) in {wall_s:.1} s",
            row.verdict, row.outcome
        );
        rows.push(row);
        if errors >= ERRORS_IN_A_ROW {
            bail!("{errors} restarts in a row gave no report");
        }
    }
    Ok(())
}

fn row_of(n: usize, traffic: Option<Traffic>, r: &Value, wall_s: f64) -> Row {
    let verdict = r["verdict"].as_str().unwrap_or("").to_owned();
    let check = &r["golden"]["check"];
    let outcome = check["outcome"].as_str().unwrap_or("none").to_owned();
    let golden_detail = match outcome.as_str() {
        "near_tie" => Some(format!(
            "token {}: {} where the reference has {}, {:.3} nats apart",
            check["position"],
            check["token"],
            check["reference_token"],
            check["margin"].as_f64().unwrap_or(f64::NAN)
        )),
        "diverged" => Some(format!(
            "token {}: {}; the reference goes on {}, this answer {}",
            check["position"],
            match check["margin"].as_f64() {
                Some(m) if check["at_least"] == true => format!("preferred by at least {m:.2} nats"),
                Some(m) => format!("preferred by {m:.2} nats"),
                None => "one answer ended where the other went on".to_owned(),
            },
            check["reference"],
            check["answer"]
        )),
        "unanswered" => check["error"].as_str().map(str::to_owned),
        _ => None,
    };
    let paths_wrong = r["golden_paths"].as_array().map_or(0, |p| {
        p.iter()
            .filter(|p| matches!(p["check"]["outcome"].as_str(), Some("diverged" | "unanswered")))
            .count()
    });
    let reason =
        (!verdict.starts_with("healthy")).then(|| r["reasons"][0].as_str().unwrap_or("(no reason given)").to_owned());
    Row {
        n,
        traffic,
        verdict,
        outcome,
        golden_detail,
        paths_wrong,
        reason,
        total_s: r["total_ms"].as_f64().map(|ms| ms / 1000.0),
        wall_s,
    }
}

fn error_row(n: usize, traffic: Option<Traffic>, wall_s: f64, error: &str) -> Row {
    Row {
        n,
        traffic,
        verdict: "error".into(),
        outcome: "none".into(),
        golden_detail: None,
        paths_wrong: 0,
        reason: Some(error.to_owned()),
        total_s: None,
        wall_s,
    }
}

/// The background client: [`STREAMS`] concurrent loops of chat completions
/// through the router, each at most [`STREAM_LIMIT`] requests, until stopped.
struct Client {
    stop: Arc<AtomicBool>,
    streams: Vec<tokio::task::JoinHandle<Traffic>>,
}

impl Client {
    fn start(http: &reqwest::Client, router: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let streams = STREAMS
            .iter()
            .map(|&(name, temperature)| {
                let (http, stop) = (http.clone(), stop.clone());
                let url = format!("{router}/v1/chat/completions");
                tokio::spawn(async move {
                    let mut t = Traffic::default();
                    while !stop.load(Ordering::Relaxed) && t.answered + t.failed < STREAM_LIMIT {
                        let body = serde_json::json!({
                            "model": pdwarden_stack::vllm::MODEL,
                            "messages": [{
                                "role": "user",
                                "content": format!("{name} client request {}: tell me about the sea", t.answered + t.failed),
                            }],
                            "max_tokens": CLIENT_MAX_TOKENS,
                            "temperature": temperature,
                        });
                        let ok = match http.post(&url).json(&body).timeout(REQUEST_LIMIT).send().await {
                            Ok(r) if r.status().is_success() => r.bytes().await.is_ok(),
                            _ => false,
                        };
                        if ok {
                            t.answered += 1;
                            tokio::time::sleep(ANSWERED_PAUSE).await;
                        } else {
                            t.failed += 1;
                            tokio::time::sleep(FAILED_PAUSE).await;
                        }
                    }
                    t
                })
            })
            .collect();
        Client { stop, streams }
    }

    /// Ends the streams (each within one request's limit) and sums them.
    async fn stop(mut self) -> Traffic {
        self.stop.store(true, Ordering::Relaxed);
        let mut sum = Traffic::default();
        for s in std::mem::take(&mut self.streams) {
            if let Ok(t) = s.await {
                sum.answered += t.answered;
                sum.failed += t.failed;
            }
        }
        sum
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for s in &self.streams {
            s.abort();
        }
    }
}

fn unit_url(status: &Value, unit: &str) -> anyhow::Result<String> {
    status["agents"][0]["units"]
        .as_array()
        .and_then(|u| u.iter().find(|u| u["name"] == unit))
        .and_then(|u| u["base_url"].as_str())
        .map(|u| u.trim_end_matches('/').to_owned())
        .with_context(|| format!("no base_url for {unit} in status"))
}

/// The restarts' durations (`total_ms`, s): mean, min and max.
pub fn durations(rows: &[&Row]) -> Option<(f64, f64, f64)> {
    let d: Vec<f64> = rows.iter().filter_map(|r| r.total_s).collect();
    if d.is_empty() {
        return None;
    }
    let mean = d.iter().sum::<f64>() / d.len() as f64;
    let min = d.iter().copied().fold(f64::INFINITY, f64::min);
    let max = d.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((mean, min, max))
}
