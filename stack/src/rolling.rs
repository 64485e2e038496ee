//! `pdwarden demo --shared-router`: one pair restarted under client traffic
//! while another keeps serving behind the same router (issue 18).
//!
//! The stack has two pd-sim pairs, `demo` and `demo-b`, each behind its own
//! sglang-router, and one more real sglang-router, `router-shared`, in front
//! of both: the one clients use, started with no worker. Each pair names it
//! as its `[pair.serving_router]`. The demo:
//!
//! 1. restarts both pairs at once; each joins the serving router once
//!    healthy (and once its KV paths to the engines already there answer);
//! 2. starts steady client traffic through the serving router (two
//!    clients, one request after another, each with its own request id);
//! 3. lets the traffic cross both pairs, then restarts `demo` under
//!    traffic: out of the serving router first, drained, restarted,
//!    verified through its own router and its KV paths, and back only if
//!    all of them hold;
//! 4. stops the traffic and says what the clients saw: every request, every
//!    failure, and how many client requests reached `demo`'s restarted
//!    engines while they were out of rotation (pd-sim's `/sim/stats`: its
//!    requests that are not probes).
//!
//! The outcome is the last restart's verdict; the demo also fails when a
//! client request failed or reached the pair while it was out.
//!
//! `pdwarden demo --prefills N --decodes N --rolling` ([`rolling_under_traffic`])
//! is the same under one pair: its router is the one clients use, and
//! `restart pd-pair demo --rolling` takes one P/D sub-pair out of it at a
//! time while the others serve.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pdwarden_client::{Asked, new_request_id};
use pdwarden_model::report::OperationReport;
use serde::Serialize;
use serde_json::{Value, json};

use crate::args::{DemoArgs, DemoOutcome};
use crate::plan::{MODEL, PAIR, PAIR_B};
use crate::stack::Stack;
use crate::stack::demo_json;

/// What the clients saw.
#[derive(Debug, Default, Clone, Serialize)]
pub struct TrafficSummary {
    pub requests: u64,
    pub ok: u64,
    pub failed: u64,
    /// The first failures, in words.
    pub errors: Vec<String>,
}

/// Steady client traffic through a router until stopped.
struct Traffic {
    summary: Arc<Mutex<TrafficSummary>>,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Traffic {
    fn start(router: &str, clients: usize) -> Traffic {
        let summary = Arc::new(Mutex::new(TrafficSummary::default()));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let http = reqwest::Client::new();
        let tasks = (0..clients)
            .map(|c| {
                let (summary, stopped, http) = (summary.clone(), stopped.clone(), http.clone());
                let url = format!("{}/v1/chat/completions", router.trim_end_matches('/'));
                tokio::spawn(async move {
                    for n in 0u64.. {
                        if *stopped.borrow() {
                            break;
                        }
                        let outcome = http
                            .post(&url)
                            .header("X-Request-Id", format!("client-{c}-{n}"))
                            .timeout(Duration::from_secs(30))
                            .json(&json!({
                                "model": MODEL,
                                "messages": [{"role": "user", "content": format!("client {c} request {n}: say hi")}],
                                "max_tokens": 8,
                            }))
                            .send()
                            .await;
                        let error = match outcome {
                            Ok(r) if r.status().is_success() => None,
                            Ok(r) => Some(format!(
                                "http {}: {}",
                                r.status().as_u16(),
                                r.text().await.unwrap_or_default()
                            )),
                            Err(e) => Some(format!("request failed: {e}")),
                        };
                        {
                            let mut s = summary.lock().unwrap_or_else(|p| p.into_inner());
                            s.requests += 1;
                            match error {
                                None => s.ok += 1,
                                Some(e) => {
                                    s.failed += 1;
                                    if s.errors.len() < 5 {
                                        s.errors.push(format!("client-{c}-{n}: {e}"));
                                    }
                                }
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                })
            })
            .collect();
        Traffic { summary, stop, tasks }
    }

    fn now(&self) -> TrafficSummary {
        self.summary.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits (bounded) until `n` more requests have been answered OK.
    async fn until_ok(&self, n: u64, limit: Duration) -> bool {
        let target = self.now().ok + n;
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.now().ok >= target {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    async fn stop(self) -> TrafficSummary {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        self.summary.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// One engine's pd-sim ground truth: its process (instance id) and the
/// client requests (not probes) it has received.
async fn client_requests(http: &reqwest::Client, engine: &str) -> Option<(String, u64)> {
    let v: Value = http
        .get(format!("{engine}/sim/stats"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    let total = v["requests_total"].as_u64()?;
    let probes = v["probe_requests"].as_u64()?;
    Some((v["instance_id"].as_str()?.to_string(), total.saturating_sub(probes)))
}

/// The client requests each engine of `pair` has received, by unit.
async fn pair_client_requests(stack: &Stack, pair: &str) -> Vec<(String, Option<(String, u64)>)> {
    let http = reqwest::Client::new();
    let mut out = Vec::new();
    for (p, unit, url) in &stack.plan.engines {
        if p == pair {
            out.push((unit.clone(), client_requests(&http, url).await));
        }
    }
    out
}

/// Restarts `pair`, printing its progress unless `quiet`; `on_line` sees
/// every progress line.
async fn restart(stack: &Stack, pair: &str, quiet: bool, on_line: impl FnMut(&str)) -> anyhow::Result<OperationReport> {
    restart_as(stack, pair, Asked::Restart { rolling: false }, quiet, on_line).await
}

async fn restart_as(
    stack: &Stack,
    pair: &str,
    asked: Asked,
    quiet: bool,
    mut on_line: impl FnMut(&str),
) -> anyhow::Result<OperationReport> {
    let report = stack
        .connection
        .follow_asked(pair, asked, new_request_id(), |line| {
            on_line(&line);
            if !quiet {
                pdwarden_client::say!("{line}");
            }
        })
        .await
        .map_err(|e| anyhow::anyhow!("restart {pair}: {e}"))?;
    if !quiet {
        pdwarden_client::say_part!("{}", pdwarden_model::report::render_summary(&report));
    }
    Ok(report)
}

pub async fn under_traffic(stack: &Stack, args: &DemoArgs) -> DemoOutcome {
    match run(stack, args).await {
        Ok(outcome) => outcome,
        Err(e) => DemoOutcome::could_not_run(format!("demo --shared-router: {e:#}")),
    }
}

async fn run(stack: &Stack, args: &DemoArgs) -> anyhow::Result<DemoOutcome> {
    let quiet = args.json;
    let say = |text: String| {
        if !quiet {
            pdwarden_client::say!("\n== {text}");
        }
    };
    let Some(serving) = stack.plan.serving_router_url.clone() else {
        anyhow::bail!("the stack has no serving router");
    };
    // The agent starts the serving router (autostart) when it starts.
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while http.get(format!("{serving}/workers")).send().await.is_err() {
        if Instant::now() > deadline {
            anyhow::bail!("the serving router {serving} did not come up within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Both pairs join at once: a pair left down would be started by its
    // own watch meanwhile (the watch recovers a pair that answers nothing).
    say(format!(
        "{PAIR} and {PAIR_B} start and join the serving router {serving} (empty so far)"
    ));
    let (b, join) = tokio::join!(restart(stack, PAIR_B, true, |_| {}), restart(stack, PAIR, true, |_| {}));
    let (b, join) = (b?, join?);
    for r in [&b, &join] {
        if !quiet {
            pdwarden_client::say!("{}: {}", r.pair, r.verdict.as_str());
        }
    }
    for r in [&b, &join] {
        if !r.verdict.is_healthy() {
            return Ok(DemoOutcome::for_report(
                r,
                json!({ "failed_at": format!("join {}", r.pair), "report": r }),
            ));
        }
    }
    say("steady client traffic through the serving router starts (two clients)".into());
    let traffic = Traffic::start(&serving, 2);
    if !traffic.until_ok(5, Duration::from_secs(20)).await {
        let t = traffic.stop().await;
        anyhow::bail!("client traffic through {serving} did not get going: {t:?}");
    }
    // Both pairs' engines serve, crossing (the router pairs any prefill
    // with any decode).
    traffic.until_ok(40, Duration::from_secs(30)).await;
    let b_before = pair_client_requests(stack, PAIR_B).await;
    say(format!("{PAIR} restarts under traffic; {PAIR_B} keeps serving"));
    // When the rejoin starts, what the restarted engines got from clients.
    let (line_tx, mut line_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let rejoin_check = async {
        while let Some(line) = line_rx.recv().await {
            if line.contains("step rejoin (") && line.ends_with("started") {
                return Some(pair_client_requests(stack, PAIR).await);
            }
        }
        None
    };
    // The sender lives in the restart's future: the check ends with it.
    let rolled = restart(stack, PAIR, quiet, move |line| {
        let _ = line_tx.send(line.to_string());
    });
    let (rolled, at_rejoin) = tokio::join!(rolled, rejoin_check);
    let rolled = rolled?;
    // A little more traffic after the verdict.
    traffic.until_ok(10, Duration::from_secs(10)).await;
    let summary = traffic.stop().await;
    let after = pair_client_requests(stack, PAIR).await;
    let b_after = pair_client_requests(stack, PAIR_B).await;
    let put_back = rolled
        .drain
        .as_ref()
        .and_then(|d| d.rejoin.as_ref())
        .is_some_and(|r| r.put_back);
    // Client requests on the restarted engines while out of rotation: at
    // the rejoin's start (the new processes), or now if it never rejoined.
    let while_out: u64 = match (&at_rejoin, put_back) {
        (Some(counts), _) => counts.iter().filter_map(|(_, c)| c.as_ref().map(|c| c.1)).sum(),
        (None, false) => after.iter().filter_map(|(_, c)| c.as_ref().map(|c| c.1)).sum(),
        (None, true) => 0,
    };
    let served_by_b: u64 = b_after
        .iter()
        .zip(&b_before)
        .filter_map(|((_, a), (_, b))| match (a, b) {
            (Some(a), Some(b)) if a.0 == b.0 => Some(a.1.saturating_sub(b.1)),
            _ => None,
        })
        .sum();
    if !quiet {
        pdwarden_client::say!(
            "\n== clients: {} requests, {} ok, {} failed{}; {served_by_b} served by {PAIR_B}'s engines during {PAIR}'s restart; {while_out} reached {PAIR}'s restarted engines while out of rotation; {PAIR} {}",
            summary.requests,
            summary.ok,
            summary.failed,
            if summary.errors.is_empty() {
                String::new()
            } else {
                format!(" ({})", summary.errors.join("; "))
            },
            if put_back {
                "is back in the serving router"
            } else {
                "stays out of the serving router"
            }
        );
    }
    let mut outcome = DemoOutcome::for_report(&rolled, serde_json::to_value(&rolled).unwrap_or_default());
    if summary.failed > 0 || while_out > 0 {
        outcome.code = 2;
    }
    outcome.json["traffic"] = json!({
        "requests": summary.requests,
        "ok": summary.ok,
        "failed": summary.failed,
        "errors": summary.errors,
        "served_by_other_pair_during_restart": served_by_b,
        "reached_restarted_pair_while_out": while_out,
        "put_back": put_back,
    });
    outcome.json["joins"] = json!({ PAIR_B: b.verdict.as_str(), PAIR: join.verdict.as_str() });
    outcome.json["demo"] = demo_json(stack);
    Ok(outcome)
}

pub async fn rolling_under_traffic(stack: &Stack, args: &DemoArgs) -> DemoOutcome {
    match roll(stack, args).await {
        Ok(outcome) => outcome,
        Err(e) => DemoOutcome::could_not_run(format!("demo --rolling: {e:#}")),
    }
}

/// Sub-pair `i`'s engines' client requests (new processes only: a count
/// from an instance that `before` already had is the old process's).
fn sub_pair_counts(
    counts: &[(String, Option<(String, u64)>)],
    before: &[(String, Option<(String, u64)>)],
    i: usize,
) -> u64 {
    let mine = [format!("prefill-{i}"), format!("decode-{i}")];
    counts
        .iter()
        .filter(|(unit, _)| mine.iter().any(|m| unit.ends_with(m.as_str())))
        .filter_map(|(unit, c)| {
            let (instance, n) = c.as_ref()?;
            let old = before
                .iter()
                .any(|(u, b)| u == unit && b.as_ref().is_some_and(|b| &b.0 == instance));
            (!old).then_some(*n)
        })
        .sum()
}

async fn roll(stack: &Stack, args: &DemoArgs) -> anyhow::Result<DemoOutcome> {
    let quiet = args.json;
    let say = |text: String| {
        if !quiet {
            pdwarden_client::say!("\n== {text}");
        }
    };
    let router = stack.plan.router_url.clone();
    let n = usize::from(args.prefills);
    say(format!(
        "{PAIR} ({n} prefills, {n} decodes) starts behind its router {router}"
    ));
    let start = restart(stack, PAIR, quiet, |_| {}).await?;
    if !start.verdict.is_healthy() {
        return Ok(DemoOutcome::for_report(
            &start,
            json!({ "failed_at": "start", "report": start }),
        ));
    }
    say("steady client traffic through the pair's router starts (two clients)".into());
    let traffic = Traffic::start(&router, 2);
    if !traffic.until_ok(5, Duration::from_secs(20)).await {
        let t = traffic.stop().await;
        anyhow::bail!("client traffic through {router} did not get going: {t:?}");
    }
    traffic.until_ok(20 * n as u64, Duration::from_secs(30)).await;
    let before = pair_client_requests(stack, PAIR).await;
    say(format!(
        "restart pd-pair {PAIR} --rolling under traffic: one sub-pair out of the router at a time"
    ));
    // At each sub-pair's rejoin, the client requests its new processes got
    // while out of rotation; `k` counts the rejoins (sub-pair k).
    let (line_tx, mut line_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let watch_rejoins = async {
        let mut at_rejoin: Vec<u64> = Vec::new();
        while let Some(line) = line_rx.recv().await {
            if line.contains("step rejoin (") && line.ends_with("started") {
                let now = pair_client_requests(stack, PAIR).await;
                let k = at_rejoin.len();
                at_rejoin.push(sub_pair_counts(&now, &before, k));
            }
        }
        at_rejoin
    };
    let rolled = restart_as(stack, PAIR, Asked::Restart { rolling: true }, quiet, move |line| {
        let _ = line_tx.send(line.to_string());
    });
    let (rolled, at_rejoin) = tokio::join!(rolled, watch_rejoins);
    let rolled = rolled?;
    traffic.until_ok(10, Duration::from_secs(10)).await;
    let summary = traffic.stop().await;
    let after = pair_client_requests(stack, PAIR).await;
    // A sub-pair put back: what its new processes got before its rejoin; one
    // kept out (or never rejoined): what they got until now — nothing, if
    // it stayed out of rotation as it should.
    let while_out: Vec<u64> = rolled
        .sub_operations
        .iter()
        .filter(|c| c.kind == "co_restart")
        .enumerate()
        .map(|(i, c)| match at_rejoin.get(i) {
            Some(n) if c.verdict.starts_with("healthy") => *n,
            _ => sub_pair_counts(&after, &before, i),
        })
        .collect();
    let reached: u64 = while_out.iter().sum();
    if !quiet {
        pdwarden_client::say!(
            "\n== clients: {} requests, {} ok, {} failed{}; {reached} reached a sub-pair's restarted engines while it was out of rotation; {}",
            summary.requests,
            summary.ok,
            summary.failed,
            if summary.errors.is_empty() {
                String::new()
            } else {
                format!(" ({})", summary.errors.join("; "))
            },
            rolled
                .sub_operations
                .iter()
                .map(|c| format!("{}: {}", c.purpose, c.verdict))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    let mut outcome = DemoOutcome::for_report(&rolled, serde_json::to_value(&rolled).unwrap_or_default());
    if summary.failed > 0 || reached > 0 {
        outcome.code = 2;
    }
    outcome.json["traffic"] = json!({
        "requests": summary.requests,
        "ok": summary.ok,
        "failed": summary.failed,
        "errors": summary.errors,
        "reached_sub_pair_while_out": while_out,
        "rejoins": at_rejoin.len(),
    });
    outcome.json["start"] = json!(start.verdict.as_str());
    outcome.json["demo"] = demo_json(stack);
    Ok(outcome)
}
