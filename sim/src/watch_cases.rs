//! The wedge watch's cases, as data, for the scenario tests and the
//! benchmark alike: legitimate long work that must never be recovered
//! (DESIGN.md 12), and each wedge kind that must be confirmed and recovered.
//!
//! A case is the demo's flags (pd-sim behaviour at start, and what the watch
//! is told about the engines), live faults applied once the pair is healthy
//! (`POST /sim/fault`), and client requests sent through the real router.
//! [`start`] applies the faults and sends the requests; the caller watches
//! `pdwarden status` for the outcome. pd-sim never knows which outcome is
//! expected: the cases only use its public flags and fault API.

use std::time::Duration;

use tokio::time::Instant;

use serde_json::json;
use tokio::task::JoinHandle;

use crate::clock::mono_ms;

/// What the watch must conclude.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Honest work: zero automatic co-restarts, every client request completes.
    Legitimate,
    /// A wedge, confirmed and recovered, as one of these kinds
    /// (`pdwarden_wedge_detection_seconds{kind}`): where the evidence supports
    /// two rules, whichever completes first names it.
    Wedge(&'static [&'static str]),
}

/// Client requests of one shape, sent at once.
#[derive(Clone, Copy, Debug)]
pub struct Requests {
    pub count: u32,
    pub prompt_tokens: u64,
    pub max_tokens: u64,
    /// The client gives up after this many simulated ms (None: it waits).
    pub give_up_after_sim_ms: Option<f64>,
}

#[derive(Clone, Copy, Debug)]
pub struct WatchCase {
    pub name: &'static str,
    /// One line: what happens, and what the watch was told.
    pub what: &'static str,
    pub expect: Expect,
    pub demo_args: &'static [&'static str],
    /// Applied once the pair is healthy: (unit role, JSON body of `/sim/fault`).
    pub faults: &'static [(&'static str, &'static str)],
    /// Sent one batch after another, each after the previous batch was sent
    /// (not finished).
    pub requests: &'static [Requests],
}

/// Seed 001's serial prefill at 300 tok/s simulated, which leaks its slot
/// when a client gives up mid-prefill, with chunked prefill off (one forward
/// per prefill: SGLang's health answers 503 during any prefill over 20 s).
const SERIAL_LEAKING_300: &str = "--serial --leak-slot-on-disconnect --prefill-tok-per-s 300 --chunked-prefill-size 0";

/// The same prefill with SGLang's default chunking (8,192 tokens per forward).
const SERIAL_LEAKING_300_CHUNKED: &str = "--serial --leak-slot-on-disconnect --prefill-tok-per-s 300";

/// Every later generation on the engine hangs (a live `--latency-script`).
const HANG_EVERY_GENERATION: &str =
    r#"{"latency_script": "hang,hang,hang,hang,hang,hang,hang,hang,hang,hang,hang,hang,hang,hang,hang,hang"}"#;

pub const CASES: &[WatchCase] = &[
    WatchCase {
        name: "long_prefill_on_serial_engine",
        what: "a 40,000-token prompt on a serial, slot-leaking SGLang-like prefill at 300 tok/s without chunking \
               (133 s of honest prefill, health 503 after 20 s; the watch is told 300 tok/s and 50,000 tokens max)",
        expect: Expect::Legitimate,
        demo_args: &["--engines-serial", "--prefill-sim", SERIAL_LEAKING_300],
        faults: &[],
        requests: &[Requests {
            count: 1,
            prompt_tokens: 40_000,
            max_tokens: 16,
            give_up_after_sim_ms: None,
        }],
    },
    WatchCase {
        name: "long_generation_at_low_tokens_per_s",
        what: "1,500 output tokens at 5 tok/s (300 s of generation; nothing finishes meanwhile; the watch is told 5 tok/s)",
        expect: Expect::Legitimate,
        demo_args: &["--watch-decode-tok-per-s", "5"],
        faults: &[("decode", r#"{"tpot_ms": 200}"#)],
        requests: &[Requests {
            count: 2,
            prompt_tokens: 16,
            max_tokens: 1_500,
            give_up_after_sim_ms: None,
        }],
    },
    WatchCase {
        name: "decode_waiting_on_slow_kv_transfer",
        what: "three 20,000-token prompts at 300 tok/s whose KV then takes 8 s to arrive (the watch allows 10 s): \
               the decode waits for KV through the prefill's compute and the transfer",
        expect: Expect::Legitimate,
        demo_args: &["--prefill-sim", "--prefill-tok-per-s 300"],
        faults: &[("decode", r#"{"kv_transfer_ms": 8000}"#)],
        requests: &[Requests {
            count: 3,
            prompt_tokens: 20_000,
            max_tokens: 32,
            give_up_after_sim_ms: None,
        }],
    },
    WatchCase {
        name: "burst_fills_the_queue",
        what: "32 requests of 512 tokens at once on a decode that runs 2 at a time (~100 s of queue draining)",
        expect: Expect::Legitimate,
        demo_args: &["--decode-sim", "--max-running 2"],
        faults: &[],
        requests: &[Requests {
            count: 32,
            prompt_tokens: 64,
            max_tokens: 512,
            give_up_after_sim_ms: None,
        }],
    },
    WatchCase {
        name: "slot_leak",
        what: "seed 001: a client gives up on a 41,818-token prompt mid-prefill on a serial prefill (300 tok/s, \
               SGLang's default 8,192-token chunks) that leaks its slot; the next request queues for ever",
        expect: Expect::Wedge(&["stall"]),
        demo_args: &["--engines-serial", "--prefill-sim", SERIAL_LEAKING_300_CHUNKED],
        faults: &[],
        requests: &[
            Requests {
                count: 1,
                prompt_tokens: 41_818,
                max_tokens: 16,
                give_up_after_sim_ms: Some(60_000.0),
            },
            Requests {
                count: 1,
                prompt_tokens: 18,
                max_tokens: 16,
                give_up_after_sim_ms: Some(600_000.0),
            },
        ],
    },
    WatchCase {
        name: "generation_hangs_health_200",
        what: "seeds 002/003 on a current SGLang (0.5.9): every generation on the decode hangs waiting for its KV, \
               health 200 on both, no client traffic: the watch's idle probe hangs, and waits in both PD queues",
        expect: Expect::Wedge(&["silent_generation", "kv_transfer"]),
        demo_args: &[],
        faults: &[("decode", HANG_EVERY_GENERATION)],
        requests: &[],
    },
    WatchCase {
        name: "generation_hangs_old_engine",
        what: "seeds 002/003 on SGLang 0.4.9 (no realtime tokens, no prefill inflight gauge, /health 200 without \
               generating): every generation on the decode hangs, no client traffic; only a probe can tell",
        expect: Expect::Wedge(&["silent_generation"]),
        demo_args: &[
            "--prefill-sim",
            "--sglang-version 0.4.9",
            "--decode-sim",
            "--sglang-version 0.4.9",
        ],
        faults: &[("decode", HANG_EVERY_GENERATION)],
        requests: &[],
    },
    WatchCase {
        name: "degraded_kv_bootstrap",
        what: "seed 004: KV never reaches the decode; the prefill keeps computing, both PD queues grow, nothing \
               finishes, health 200 on both",
        expect: Expect::Wedge(&["kv_transfer"]),
        demo_args: &[],
        faults: &[("decode", r#"{"kv_stall": true}"#)],
        requests: &[Requests {
            count: 4,
            prompt_tokens: 64,
            max_tokens: 32,
            give_up_after_sim_ms: Some(600_000.0),
        }],
    },
    WatchCase {
        name: "partial_wedge",
        what: "real requests freeze after 32 tokens while the watch's own 8-token probe is still answered \
               (prefill at 2,000 tok/s without chunking: the watch allows a 1.25 s flat spell, time for a probe)",
        expect: Expect::Wedge(&["partial_stall"]),
        demo_args: &["--prefill-sim", "--prefill-tok-per-s 2000 --chunked-prefill-size 0"],
        faults: &[("decode", r#"{"freeze_after_tokens": 32}"#)],
        requests: &[Requests {
            count: 3,
            prompt_tokens: 64,
            max_tokens: 256,
            give_up_after_sim_ms: Some(600_000.0),
        }],
    },
];

pub fn case(name: &str) -> &'static WatchCase {
    CASES
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no watch case {name:?}"))
}

/// Where the case's requests and faults go.
pub struct Urls {
    pub router: String,
    pub prefill: String,
    pub decode: String,
}

/// One client request's end.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// HTTP status and seconds from send.
    Answered { status: u16, secs: f64 },
    /// The client gave up (its own timeout), or the connection failed.
    Failed { error: String, secs: f64 },
}

impl Outcome {
    pub fn completed(&self) -> bool {
        matches!(self, Outcome::Answered { status, .. } if (200..300).contains(status))
    }
}

/// A case under way.
pub struct Started {
    /// CLOCK_MONOTONIC ms when its faults were applied and its first request sent.
    pub onset_mono_ms: f64,
    pub requests: Vec<JoinHandle<Outcome>>,
}

impl Started {
    /// Waits for every request (each bounded by its own timeout or `limit`).
    pub async fn outcomes(self) -> Vec<Outcome> {
        let mut out = Vec::new();
        for h in self.requests {
            out.push(h.await.unwrap_or_else(|e| Outcome::Failed {
                error: format!("task: {e}"),
                secs: 0.0,
            }));
        }
        out
    }
}

/// Applies `case`'s faults, then sends its requests. A request that waits
/// is still bounded by `limit` (tests never wait for ever).
pub async fn start(case: &WatchCase, urls: &Urls, time_scale: f64, limit: Duration) -> anyhow::Result<Started> {
    let http = reqwest::Client::builder().no_proxy().build()?;
    let onset_mono_ms = mono_ms();
    for (role, body) in case.faults {
        let base = match *role {
            "prefill" => &urls.prefill,
            "decode" => &urls.decode,
            other => anyhow::bail!("case {}: no unit role {other:?}", case.name),
        };
        let r = http.post(format!("{base}/sim/fault")).body(*body).send().await?;
        anyhow::ensure!(
            r.status().is_success(),
            "case {}: /sim/fault {body} on {role} answered {}: {}",
            case.name,
            r.status(),
            r.text().await.unwrap_or_default()
        );
    }
    let mut requests = Vec::new();
    for (batch, r) in case.requests.iter().enumerate() {
        for i in 0..r.count {
            let body = json!({
                "model": "demo-model",
                "messages": [{"role": "user", "content": format!("case {} batch {batch} request {i} {}", case.name, "tok ".repeat(r.prompt_tokens as usize))}],
                "max_tokens": r.max_tokens,
            });
            let timeout = r
                .give_up_after_sim_ms
                .map_or(limit, |ms| Duration::from_secs_f64(ms * time_scale / 1000.0).min(limit));
            let http = http.clone();
            let url = format!("{}/v1/chat/completions", urls.router);
            requests.push(tokio::spawn(async move {
                let sent = Instant::now();
                match http.post(url).json(&body).timeout(timeout).send().await {
                    Ok(resp) => {
                        let status = resp.status().as_u16();
                        let _ = resp.bytes().await;
                        Outcome::Answered {
                            status,
                            secs: sent.elapsed().as_secs_f64(),
                        }
                    }
                    Err(e) => Outcome::Failed {
                        error: if e.is_timeout() {
                            "client gave up".into()
                        } else {
                            e.to_string()
                        },
                        secs: sent.elapsed().as_secs_f64(),
                    },
                }
            }));
        }
        // Let the batch reach the engines before the next one.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(Started {
        onset_mono_ms,
        requests,
    })
}
