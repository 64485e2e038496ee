//! The agent's half of the change gate (issue 7): reading what a live
//! process really got, and the gate's benchmark.
//!
//! *Inspection.* A config file says what a process should have been started
//! with; only the kernel says what it was. So the agent reads
//! `/proc/PID/environ` and `/proc/PID/cmdline` of the unit's process and of
//! every descendant (a wrapper that forks instead of exec'ing shows up as a
//! parent with the knob and a child without it). Only the variables asked
//! about are reported, never the whole environment.
//!
//! *Benchmark.* Rounds of concurrent streamed, probe-tagged chat completions
//! through the router, timed in microseconds on the agent's monotonic clock:
//! time to first token, first-to-last token, total, and each round's wall
//! time (for throughput). Raw samples only; the orchestrator judges them.

use std::time::Duration;

use pdwarden_proto::v1::{
    GateAgentResult, GateAgentStep, GateBenchmark, GateBenchmarkResult, GateRequestSample, ProbeOutcome,
    ProcessEnvValue, ProcessFacts, ProcessInspection, gate_agent_result, gate_agent_step,
};
use serde_json::json;
use tokio::time::Instant;

use crate::checks::{PROBE_HEADER, REQUEST_ID_HEADER, REQUEST_ID_PREFIX, error_chain};

/// Executes one gate step for `unit` (whose base URL and running process,
/// if any, the supervisor gave).
pub async fn run_step(
    http: &reqwest::Client,
    base_url: Option<String>,
    running: Option<(u32, Option<u32>)>,
    command_id: &str,
    step: GateAgentStep,
) -> GateAgentResult {
    let result = match step.step {
        Some(gate_agent_step::Step::Inspect(i)) => {
            let p = match (&base_url, running) {
                (None, _) => ProcessInspection {
                    error: format!("unknown unit {:?}", step.unit),
                    ..Default::default()
                },
                (Some(_), None) => ProcessInspection {
                    error: format!("unit {} is not running", step.unit),
                    ..Default::default()
                },
                (Some(_), Some((pid, version))) => inspection(pid, version, &i.env_keys),
            };
            gate_agent_result::Result::Process(p)
        }
        Some(gate_agent_step::Step::Benchmark(b)) => {
            let r = match &base_url {
                Some(url) => benchmark(http, url, &b).await,
                None => GateBenchmarkResult {
                    samples: vec![GateRequestSample {
                        outcome: ProbeOutcome::Error as i32,
                        error: format!("unknown unit {:?}", step.unit),
                        ..Default::default()
                    }],
                    round_us: Vec::new(),
                },
            };
            gate_agent_result::Result::Benchmark(r)
        }
        None => gate_agent_result::Result::Process(ProcessInspection {
            error: "gate step has no step".into(),
            ..Default::default()
        }),
    };
    GateAgentResult {
        command_id: command_id.to_string(),
        unit: step.unit,
        result: Some(result),
    }
}

/// Reads the process `pid` and its descendants from `/proc`.
pub fn inspect(pid: u32, env_keys: &[String]) -> Vec<ProcessFacts> {
    let mut out = vec![facts(pid, 0, env_keys)];
    let mut frontier = vec![pid];
    let table = process_table();
    while let Some(parent) = frontier.pop() {
        for &(child, ppid) in &table {
            if ppid == parent && !out.iter().any(|f| f.pid == child) {
                out.push(facts(child, ppid, env_keys));
                frontier.push(child);
            }
        }
    }
    if let Some(first) = out.first_mut() {
        first.ppid = parent_of(pid).unwrap_or(0);
    }
    out
}

/// (pid, ppid) of every process.
fn process_table() -> Vec<(u32, u32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, parent_of(pid)?)))
        .collect()
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; fields after ')' are plain.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

fn facts(pid: u32, ppid: u32, env_keys: &[String]) -> ProcessFacts {
    let mut f = ProcessFacts {
        pid,
        ppid,
        ..Default::default()
    };
    match std::fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(raw) => f.cmdline = split_nul(&raw),
        Err(e) => f.error = format!("/proc/{pid}/cmdline: {e}"),
    }
    match std::fs::read(format!("/proc/{pid}/environ")) {
        Ok(raw) => {
            let vars = split_nul(&raw);
            f.environ_blank = !vars.iter().any(|v| v.contains('='));
            f.env = env_keys
                .iter()
                .map(|k| {
                    let prefix = format!("{k}=");
                    match vars.iter().find_map(|v| v.strip_prefix(&prefix)) {
                        Some(value) => ProcessEnvValue {
                            key: k.clone(),
                            present: true,
                            value: value.to_string(),
                        },
                        None => ProcessEnvValue {
                            key: k.clone(),
                            present: false,
                            value: String::new(),
                        },
                    }
                })
                .collect();
        }
        Err(e) => {
            if f.error.is_empty() {
                f.error = format!("/proc/{pid}/environ: {e}");
            }
        }
    }
    f
}

fn split_nul(raw: &[u8]) -> Vec<String> {
    raw.split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// The inspection of a unit that runs as `pid`, spawned from `version`.
pub fn inspection(pid: u32, version: Option<u32>, env_keys: &[String]) -> ProcessInspection {
    ProcessInspection {
        error: String::new(),
        config_version: version.unwrap_or(u32::MAX),
        processes: inspect(pid, env_keys),
    }
}

/// A prompt of `tokens` words (pd-sim and the gate count a word as a token).
pub fn prompt_of(tokens: u32) -> String {
    let words = ["measure", "the", "pair", "before", "and", "after", "the", "change"];
    (0..tokens.max(1))
        .map(|i| words[i as usize % words.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs one benchmark cell against `base_url` (the router).
pub async fn benchmark(http: &reqwest::Client, base_url: &str, b: &GateBenchmark) -> GateBenchmarkResult {
    let prompt = prompt_of(b.prompt_tokens);
    let timeout = Duration::from_millis(b.timeout_ms.max(1));
    let mut result = GateBenchmarkResult::default();
    for round in 0..b.rounds.max(1) {
        let started = Instant::now();
        let requests = (0..b.concurrency.max(1)).map(|_| stream_one(http, base_url, b, &prompt, timeout, round));
        let samples = futures::future::join_all(requests).await;
        result.round_us.push(started.elapsed().as_micros() as u64);
        result.samples.extend(samples);
    }
    result
}

async fn stream_one(
    http: &reqwest::Client,
    base_url: &str,
    b: &GateBenchmark,
    prompt: &str,
    timeout: Duration,
    round: u32,
) -> GateRequestSample {
    let request_id = format!("{REQUEST_ID_PREFIX}{}", uuid::Uuid::new_v4());
    let mut sample = GateRequestSample {
        round,
        outcome: ProbeOutcome::Error as i32,
        request_id: request_id.clone(),
        ..Default::default()
    };
    let body = json!({
        "model": b.model,
        "messages": [{ "role": "user", "content": prompt }],
        "max_tokens": b.max_tokens,
        "stream": true,
        "temperature": 0,
    });
    let started = Instant::now();
    let deadline = started + timeout;
    let us = || started.elapsed().as_micros() as u64;
    let send = http
        .post(format!("{}/v1/chat/completions", base_url.trim_end_matches('/')))
        .header(REQUEST_ID_HEADER, &request_id)
        .header(PROBE_HEADER, "1")
        .json(&body)
        .send();
    let resp = match tokio::time::timeout_at(deadline, send).await {
        Err(_) => {
            sample.outcome = ProbeOutcome::Timeout as i32;
            sample.latency_us = us();
            sample.error = format!("no response within {} ms", timeout.as_millis());
            return sample;
        }
        Ok(Err(e)) => {
            sample.latency_us = us();
            sample.error = error_chain(&e);
            return sample;
        }
        Ok(Ok(r)) => r,
    };
    if !resp.status().is_success() {
        sample.latency_us = us();
        sample.error = format!("http {}", resp.status().as_u16());
        return sample;
    }
    // The suite's reader (one for both): the whole request's timeout, no
    // silence limit of its own.
    let (mut first, mut last) = (None, 0u64);
    let limits = crate::suite::StreamLimits {
        timeout,
        silence: timeout,
    };
    let read = crate::suite::read_stream(resp, started, limits, b.max_tokens, None, |now, _| {
        let at = u64::try_from(now.saturating_duration_since(started).as_micros()).unwrap_or(u64::MAX);
        sample.tokens += 1;
        first.get_or_insert(at);
        last = at;
    })
    .await;
    if read.timed_out {
        sample.outcome = ProbeOutcome::Timeout as i32;
    }
    sample.error = read.error;
    let (done, stream_error) = (read.done, read.stream_error);
    sample.latency_us = us();
    sample.ttft_us = first.unwrap_or(0);
    sample.decode_us = first.map_or(0, |f| last - f);
    if let Some(message) = stream_error {
        sample.error = format!("error event in the stream after {} tokens: {message}", sample.tokens);
    } else if done && sample.tokens > 0 {
        sample.outcome = ProbeOutcome::Ok as i32;
        sample.error.clear();
    } else if done {
        sample.error = "stream finished without a token".into();
    }
    sample
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child process is found, with the variables asked for (and only
    /// those), as the kernel holds them.
    #[tokio::test]
    async fn inspects_a_process_tree() {
        let mut child = tokio::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .env("GATE_TEST_KNOB", "512")
            .env_remove("GATE_TEST_ABSENT")
            .spawn()
            .unwrap();
        let pid = child.id().unwrap();
        // The shell forks `sleep`; wait for it to appear (an event, not a
        // sleep). `spawn` returns once the exec has closed the child's
        // close-on-exec pipe, which is before the kernel has set up its
        // argument and environment area: read in that window, a process's
        // cmdline and environ are empty (a CI run failed on it). So wait until
        // both processes have finished their exec, as the gate does by
        // inspecting only units that already generate.
        let deadline = Instant::now() + Duration::from_secs(5);
        let facts = loop {
            let f = inspect(pid, &["GATE_TEST_KNOB".into(), "GATE_TEST_ABSENT".into()]);
            let execed = |i: usize, name: &str| f.get(i).and_then(|p| p.cmdline.first()).is_some_and(|c| c == name);
            if (execed(0, "sh") && execed(1, "sleep")) || Instant::now() > deadline {
                break f;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        child.kill().await.unwrap();
        assert_eq!(facts[0].pid, pid);
        assert_eq!(facts[0].cmdline.first().map(String::as_str), Some("sh"), "{facts:?}");
        assert!(facts.len() >= 2, "{facts:?}");
        assert_eq!(facts[1].ppid, pid);
        for f in &facts {
            assert_eq!(f.env.len(), 2);
            assert!(f.env[0].present && f.env[0].value == "512", "{f:?}");
            assert!(!f.env[1].present);
        }
    }

    /// A one-shot HTTP server on loopback answering with `body` (then closing).
    async fn engine_answering(body: Vec<u8>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut req = vec![0u8; 8192];
            let _ = sock.read(&mut req).await;
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
            let _ = sock.write_all(head.as_bytes()).await;
            let _ = sock.write_all(&body).await;
        });
        url
    }

    fn one_request() -> GateBenchmark {
        GateBenchmark {
            model: "m".into(),
            prompt_tokens: 4,
            max_tokens: 3,
            concurrency: 1,
            rounds: 1,
            timeout_ms: 10_000,
        }
    }

    /// Tokens are counted from the stream's content chunks (role and empty
    /// chunks are not tokens); an event that never ends is abandoned at the
    /// suite's 1 MiB bound instead of growing the buffer.
    #[tokio::test]
    async fn benchmark_counts_streamed_tokens_and_bounds_an_endless_event() {
        let http = crate::checks::http_client();
        let chunk = |c: &str| format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{c}\"}}}}]}}\n\n");
        let body = format!(
            "data: {{\"choices\":[{{\"delta\":{{\"role\":\"assistant\"}}}}]}}\n\n{}{}{}data: [DONE]\n\n",
            chunk("a"),
            chunk(""),
            chunk("b")
        );
        let url = engine_answering(body.into_bytes()).await;
        let r = benchmark(&http, &url, &one_request()).await;
        let s = &r.samples[0];
        assert_eq!((s.outcome, s.tokens), (ProbeOutcome::Ok as i32, 2), "{s:?}");

        let mut endless = b"data: ".to_vec();
        endless.extend(std::iter::repeat_n(b'x', (2 << 20) + 1));
        let url = engine_answering(endless).await;
        let r = benchmark(&http, &url, &one_request()).await;
        let s = &r.samples[0];
        assert_ne!(s.outcome, ProbeOutcome::Ok as i32);
        assert!(s.error.contains("exceeded 1048576 bytes"), "{s:?}");
    }

    #[test]
    fn prompt_has_the_asked_word_count() {
        assert_eq!(prompt_of(37).split_whitespace().count(), 37);
        assert_eq!(prompt_of(0).split_whitespace().count(), 1);
    }
}
