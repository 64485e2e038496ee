//! In-process HTTP tests: real engines on `127.0.0.1`, real sockets, scaled time.
//!
//! Every engine here runs at `--time-scale 0.01` (SGLang's 20 s health timeout is
//! 200 ms, its 1 s health tick 10 ms). Tests wait for conditions by polling with a
//! deadline; the only fixed waits are client timeouts that *assert* something does
//! not happen within a bound.

use std::future::Future;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use clap::Parser;

use crate::config::{Args, Config, Role, parse_latency_script};
use crate::server::{Bound, SimHandle, spawn};

fn client() -> reqwest::Client {
    reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn start(cfg: Config) -> (SimHandle, Bound) {
    let mut h = spawn(cfg);
    let b = tokio::time::timeout(Duration::from_secs(10), h.bound())
        .await
        .expect("engine listens in time")
        .expect("engine binds");
    (h, b)
}

/// Restarts an engine behind the same addresses (as a process restart would).
async fn restart(h: SimHandle, b: Bound, mut cfg: Config) -> (SimHandle, Bound) {
    h.shutdown().await.unwrap();
    cfg.port = b.http.port();
    cfg.bootstrap_port = b.bootstrap.map(|a| a.port());
    start(cfg).await
}

/// Polls `f` every 5 ms until it is true or `within` has passed.
async fn wait_until<F, Fut>(within: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if f().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn status(c: &reqwest::Client, url: String) -> Option<u16> {
    c.get(url).send().await.ok().map(|r| r.status().as_u16())
}

/// The HTTP status of `POST /sim/fault` with `body` on the engine at `b`.
async fn fault_status(c: &reqwest::Client, b: Bound, body: Value) -> u16 {
    c.post(format!("http://{}/sim/fault", b.http))
        .json(&body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn stats(c: &reqwest::Client, b: Bound) -> Value {
    c.get(format!("http://{}/sim/stats", b.http))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn chat(prompt: &str, max_tokens: u64) -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens})
}

async fn post(
    c: &reqwest::Client,
    b: Bound,
    path: &str,
    body: &Value,
    timeout: Duration,
) -> Result<reqwest::Response, reqwest::Error> {
    c.post(format!("http://{}{path}", b.http))
        .timeout(timeout)
        .json(body)
        .send()
        .await
}

/// Sends `body` to the prefill and the decode at once, with the bootstrap fields the
/// router adds, and returns the decode's answer (what the router returns).
async fn routed(
    c: &reqwest::Client,
    p: Bound,
    d: Bound,
    room: u64,
    timeout: Duration,
) -> Result<reqwest::Response, reqwest::Error> {
    routed_to(
        c,
        p,
        d,
        "/v1/chat/completions",
        chat("hello from the router", 4),
        room,
        timeout,
    )
    .await
}

/// [`routed`] for any endpoint and body.
async fn routed_to(
    c: &reqwest::Client,
    p: Bound,
    d: Bound,
    path: &'static str,
    mut body: Value,
    room: u64,
    timeout: Duration,
) -> Result<reqwest::Response, reqwest::Error> {
    body["bootstrap_host"] = json!("127.0.0.1");
    body["bootstrap_port"] = json!(p.bootstrap.unwrap().port());
    body["bootstrap_room"] = json!(room);
    let pc = c.clone();
    let pbody = body.clone();
    tokio::spawn(async move { post(&pc, p, path, &pbody, timeout).await });
    post(c, d, path, &body, timeout).await
}

// Start-up phases: connection refused until listen-after; then /v1/models 200 at
// once while health answers 503; health 200 from ready-after. The monotonic stamps
// record when each happened.
#[tokio::test]
async fn start_up_phases_refused_503_200() {
    let port = free_port();
    let mut cfg = Config::for_test(Role::Decode);
    cfg.port = port;
    cfg.listen_after_ms = 20_000.0; // 200 ms real
    cfg.ready_after_ms = 60_000.0; // 600 ms real
    let c = client();
    let mut h = spawn(cfg);
    assert_eq!(status(&c, format!("http://127.0.0.1:{port}/v1/models")).await, None);
    assert!(h.try_bound().is_none());
    let b = h.bound().await.unwrap();
    assert_eq!(status(&c, format!("http://{}/v1/models", b.http)).await, Some(200));
    assert_eq!(status(&c, format!("http://{}/health", b.http)).await, Some(503));
    assert_eq!(
        status(&c, format!("http://{}/health_generate", b.http)).await,
        Some(503)
    );
    assert!(
        wait_until(Duration::from_secs(5), || async {
            status(&c, format!("http://{}/health", b.http)).await == Some(200)
        })
        .await
    );
    let s = stats(&c, b).await;
    let start = s["start_mono_ms"].as_f64().unwrap();
    let listen = s["listen_mono_ms"].as_f64().unwrap();
    let ready = s["ready_mono_ms"].as_f64().unwrap();
    assert!(listen - start >= 195.0, "listened {} ms after start", listen - start);
    assert!(ready - start >= 595.0, "ready {} ms after start", ready - start);
    h.shutdown().await.unwrap();
    assert_eq!(status(&c, format!("http://{}/v1/models", b.http)).await, None);
}

// Latency = ttft + prompt/speed + tokens × tpot, plus the cold penalty once; usage
// reports the requested tokens. Real elapsed time is checked only as a lower bound
// (a loaded machine is slower, never faster); the charged engine time is exact.
#[tokio::test]
async fn latency_model_over_http() {
    let mut cfg = Config::for_test(Role::Decode);
    cfg.settings.ttft_ms = 5_000.0;
    cfg.settings.tpot_ms = 100.0;
    cfg.settings.prefill_tok_per_s = 1_000.0;
    cfg.settings.cold_first_ms = 10_000.0;
    let (h, b) = start(cfg).await;
    let c = client();
    let prompt = "word ".repeat(2000);
    let long = Duration::from_secs(10);
    let t = Instant::now();
    let r: Value = post(&c, b, "/v1/chat/completions", &chat(&prompt, 10), long)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let cold = t.elapsed();
    assert_eq!(r["usage"]["completion_tokens"], 10);
    assert_eq!(r["usage"]["prompt_tokens"], 2000);
    assert!(cold >= Duration::from_millis(180), "cold took {cold:?}");
    let t = Instant::now();
    let body = json!({"text": prompt, "sampling_params": {"max_new_tokens": 10}});
    let r: Value = post(&c, b, "/generate", &body, long)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let warm = t.elapsed();
    assert_eq!(r["meta_info"]["completion_tokens"], 10);
    assert!(warm >= Duration::from_millis(80), "warm took {warm:?}");
    // The engine time charged is exactly the model's: cold 18 s, warm 8 s (simulated).
    assert_eq!(stats(&c, b).await["busy_ms_total"], 26_000.0);
    h.shutdown().await.unwrap();
}

// Streaming chat: one chunk per token, a finish chunk, usage when asked, [DONE].
#[tokio::test]
async fn chat_streams_tokens_then_done() {
    let (h, b) = start(Config::for_test(Role::Decode)).await;
    let c = client();
    let mut body = chat("hi", 5);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let text = post(&c, b, "/v1/chat/completions", &body, Duration::from_secs(5))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let events: Vec<&str> = text.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).collect();
    assert_eq!(events.last(), Some(&"[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let contents = chunks
        .iter()
        .filter(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
        })
        .count();
    assert_eq!(contents, 5);
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 5);
    h.shutdown().await.unwrap();
}

// A decode whose forward pass never finishes in time (huge ttft) answers /v1/models
// but its health check fails after SGLang's (scaled) 20 s timeout.
#[tokio::test]
async fn huge_ttft_never_healthy() {
    let mut cfg = Config::for_test(Role::Decode);
    cfg.settings.ttft_ms = 1e9;
    let (h, b) = start(cfg).await;
    let c = client();
    assert_eq!(status(&c, format!("http://{}/v1/models", b.http)).await, Some(200));
    let t = Instant::now();
    assert_eq!(
        status(&c, format!("http://{}/health_generate", b.http)).await,
        Some(503)
    );
    assert!(t.elapsed() >= Duration::from_millis(195));
    h.shutdown().await.unwrap();
}

// INCIDENTS row 2 (seed 003), through a pair: the decode's script replays its latencies,
// then hangs, while the decode's health stays 200 — a routed decode part spends its
// scripted time, and its hang, waiting for its KV, outside the running batch; after the
// script, normal behaviour. The same hang in a request served whole stays in the
// running batch and produces nothing: health waits for a batch result and answers 503.
#[tokio::test]
async fn latency_script_then_hang_with_health_200() {
    let (p, pb) = start(Config::for_test(Role::Prefill)).await;
    let mut cfg = Config::for_test(Role::Decode);
    cfg.latency_script = parse_latency_script("3000,hang").unwrap();
    let (h, b) = start(cfg).await;
    let c = client();
    let t = Instant::now();
    let r = routed(&c, pb, b, 1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(t.elapsed() >= Duration::from_millis(30));
    let hung = routed(&c, pb, b, 2, Duration::from_millis(300));
    let health = status(&c, format!("http://{}/health", b.http));
    let (hung, health) = tokio::join!(hung, health);
    assert!(hung.unwrap_err().is_timeout());
    assert_eq!(health, Some(200));
    let r = routed(&c, pb, b, 3, Duration::from_secs(5)).await;
    assert_eq!(r.unwrap().status(), 200);
    assert_eq!(stats(&c, b).await["latency_script_remaining"], json!([]));
    let patch = json!({"latency_script": "hang"});
    let r = c
        .post(format!("http://{}/sim/fault", b.http))
        .json(&patch)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let _whole = spawn_hung_generation(&c, b).await;
    assert_eq!(status(&c, format!("http://{}/health", b.http)).await, Some(503));
    h.shutdown().await.unwrap();
    p.shutdown().await.unwrap();
}

/// A serial engine with a slow prefill; `leak` sets --leak-slot-on-disconnect.
async fn abandoned_prefill(leak: bool) -> (SimHandle, Bound, Result<reqwest::Response, reqwest::Error>) {
    let mut cfg = Config::for_test(Role::Decode);
    cfg.settings.serial = true;
    cfg.settings.leak_slot_on_disconnect = leak;
    cfg.settings.prefill_tok_per_s = 100.0;
    let (h, b) = start(cfg).await;
    let c = client();
    // 5,000 tokens at 100 tok/s: 50 s of prefill (500 ms real); the client gives up at 100 ms.
    let big = chat(&"token ".repeat(5000), 4);
    let abandoned = post(&c, b, "/v1/chat/completions", &big, Duration::from_millis(100)).await;
    assert!(abandoned.unwrap_err().is_timeout());
    assert!(
        wait_until(Duration::from_secs(5), || async {
            stats(&c, b).await["disconnected"] == 1
        })
        .await,
        "the engine saw the client go away"
    );
    let next = post(
        &c,
        b,
        "/v1/chat/completions",
        &chat("18 tokens", 4),
        Duration::from_millis(1500),
    )
    .await;
    (h, b, next)
}

// INCIDENTS row 4: a client that disconnects mid-prefill leaks the serial slot; the
// next (tiny) request hangs while /v1/models and /metrics keep answering. The leaked
// request stays in the running batch and produces nothing, so SGLang's health, which
// then waits for a batch result, answers 503 after its timeout.
#[tokio::test]
async fn leaked_slot_blocks_next_request() {
    let (h, b, next) = abandoned_prefill(true).await;
    assert!(next.unwrap_err().is_timeout(), "the next request must hang");
    let c = client();
    for path in ["/v1/models", "/metrics"] {
        assert_eq!(
            status(&c, format!("http://{}{path}", b.http)).await,
            Some(200),
            "{path}"
        );
    }
    assert_eq!(status(&c, format!("http://{}/health", b.http)).await, Some(503));
    let s = stats(&c, b).await;
    assert_eq!(s["health_waited_on_batch"], 1);
    assert_eq!(s["leaked_slots"], 1);
    assert_eq!(s["completed"], 0);
    assert_eq!(s["running"], 1, "the leaked request still looks like it runs");
    h.shutdown().await.unwrap();
}

// Without --leak-slot-on-disconnect the same abandoned prefill frees the slot.
#[tokio::test]
async fn slot_released_without_leak_flag() {
    let (h, _b, next) = abandoned_prefill(false).await;
    assert_eq!(next.unwrap().status(), 200);
    h.shutdown().await.unwrap();
}

// Only a disconnect *before the first token* leaks: a streaming client that goes
// away after its first token releases the slot.
#[tokio::test]
async fn disconnect_after_first_token_does_not_leak() {
    let mut cfg = Config::for_test(Role::Decode);
    cfg.settings.serial = true;
    cfg.settings.leak_slot_on_disconnect = true;
    cfg.settings.tpot_ms = 1_000.0;
    let (h, b) = start(cfg).await;
    let c = client();
    let mut body = chat("hi", 100);
    body["stream"] = json!(true);
    let mut resp = post(&c, b, "/v1/chat/completions", &body, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(resp.chunk().await.unwrap().is_some(), "first token arrives");
    drop(resp);
    assert!(
        wait_until(Duration::from_secs(5), || async {
            stats(&c, b).await["disconnected"] == 1
        })
        .await,
        "the engine saw the stream go away"
    );
    let next = post(&c, b, "/v1/chat/completions", &chat("hi", 1), Duration::from_secs(5)).await;
    assert_eq!(next.unwrap().status(), 200);
    assert_eq!(stats(&c, b).await["leaked_slots"], 0);
    h.shutdown().await.unwrap();
}

// The transfer link: a routed request works; a prefill restarted alone leaves the
// decode with a stale identity (every transfer fails); restarting the decode too
// clears it; a decode then restarted alone against that prefill gets a degraded
// bootstrap (generation hangs, its own health stays 200); a fresh prefill, then a
// fresh decode, clears the degraded bootstrap.
#[tokio::test]
async fn bootstrap_stale_degraded_and_cleared_by_ordered_co_restart() {
    let c = client();
    let ok = Duration::from_secs(5);
    let pcfg = Config::for_test(Role::Prefill);
    let dcfg = Config::for_test(Role::Decode);
    let (p, pb) = start(pcfg.clone()).await;
    let (d, db) = start(dcfg.clone()).await;
    let r = routed(&c, pb, db, 1, ok).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["usage"]["completion_tokens"], 4);

    let (p, pb) = restart(p, pb, pcfg.clone()).await;
    let r = routed(&c, pb, db, 2, ok).await.unwrap();
    assert_eq!(r.status(), 500, "stale identity: transfer fails");
    // The same answer as an injected failure: SGLang's failed-transfer abort.
    let v: Value = r.json().await.unwrap();
    let m = v["message"].as_str().unwrap();
    assert_eq!(v["type"], "500");
    assert!(
        m.starts_with("Decode transfer failed for request rank=0")
            && m.contains("KVTransferError(bootstrap_room=2): KV transfer failed: prefill bootstrap"),
        "{m}"
    );
    assert_eq!(stats(&c, db).await["kv_transfers_failed"], 1);

    let (d, db) = restart(d, db, dcfg.clone()).await;
    assert_eq!(routed(&c, pb, db, 3, ok).await.unwrap().status(), 200);

    assert_eq!(
        stats(&c, pb).await["kv_rooms_failed"],
        1,
        "the stale transfer failed on the prefill too"
    );

    let (d, db) = restart(d, db, dcfg.clone()).await;
    let hung = routed(&c, pb, db, 4, Duration::from_millis(400)).await;
    assert!(hung.unwrap_err().is_timeout(), "degraded bootstrap: generation hangs");
    assert_eq!(status(&c, format!("http://{}/health", db.http)).await, Some(200));
    let ps = stats(&c, pb).await;
    assert_eq!(ps["degraded_bootstraps"], 1);
    assert_eq!(ps["prefill_inflight"], 1, "the degraded decode never takes room 4");

    let (p, pb) = restart(p, pb, pcfg).await;
    let (d, db) = restart(d, db, dcfg).await;
    assert_eq!(routed(&c, pb, db, 5, ok).await.unwrap().status(), 200);
    p.shutdown().await.unwrap();
    d.shutdown().await.unwrap();
}

// Issue 37: with vLLM's NixlConnector semantics (`--kv-transfer nixl`) a prefill
// restarted alone is met afresh (no stale identity) and a decode restarted alone gets
// no degraded bootstrap; a prefill's stale transfer state (a live fault) fails every
// transfer through it until it restarts, and only a prefill takes that fault.
#[tokio::test]
async fn nixl_engines_restart_alone_and_stale_transfer_state_fails_until_restart() {
    let c = client();
    let ok = Duration::from_secs(5);
    let mut pcfg = Config::for_test(Role::Prefill);
    pcfg.kv_transfer = crate::config::KvTransfer::Nixl;
    let mut dcfg = Config::for_test(Role::Decode);
    dcfg.kv_transfer = crate::config::KvTransfer::Nixl;
    let (p, pb) = start(pcfg.clone()).await;
    let (d, db) = start(dcfg.clone()).await;
    assert_eq!(routed(&c, pb, db, 1, ok).await.unwrap().status(), 200);
    let (p, pb) = restart(p, pb, pcfg.clone()).await;
    assert_eq!(
        routed(&c, pb, db, 2, ok).await.unwrap().status(),
        200,
        "no stale identity"
    );
    let (d, db) = restart(d, db, dcfg.clone()).await;
    assert_eq!(
        routed(&c, pb, db, 3, ok).await.unwrap().status(),
        200,
        "no degraded bootstrap"
    );
    assert_eq!(stats(&c, pb).await["degraded_bootstraps"], 0);

    let fault = |url: String, body: Value| {
        let c = c.clone();
        async move { c.post(url).json(&body).send().await.unwrap().status().as_u16() }
    };
    let stale = json!({"stale_transfer_state": true});
    assert_eq!(fault(format!("http://{}/sim/fault", db.http), stale.clone()).await, 400);
    assert_eq!(fault(format!("http://{}/sim/fault", pb.http), stale).await, 200);
    for room in 4..6 {
        assert_eq!(routed(&c, pb, db, room, ok).await.unwrap().status(), 500, "room {room}");
    }
    assert_eq!(status(&c, format!("http://{}/health", pb.http)).await, Some(200));
    let (p, pb) = restart(p, pb, pcfg).await;
    assert_eq!(
        routed(&c, pb, db, 6, ok).await.unwrap().status(),
        200,
        "cleared by its restart"
    );
    p.shutdown().await.unwrap();
    d.shutdown().await.unwrap();
}

// `--kv-transfer address`: a prefill restarted alone leaves the decode holding its old
// identity (every transfer fails until the decode restarts); a decode restarted alone
// gets no degraded bootstrap.
#[tokio::test]
async fn address_keyed_identities_go_stale_but_decodes_restart_alone() {
    let c = client();
    let ok = Duration::from_secs(5);
    let mut pcfg = Config::for_test(Role::Prefill);
    pcfg.kv_transfer = crate::config::KvTransfer::Address;
    let mut dcfg = Config::for_test(Role::Decode);
    dcfg.kv_transfer = crate::config::KvTransfer::Address;
    let (p, pb) = start(pcfg.clone()).await;
    let (d, db) = start(dcfg.clone()).await;
    assert_eq!(routed(&c, pb, db, 1, ok).await.unwrap().status(), 200);
    let (d, db) = restart(d, db, dcfg.clone()).await;
    assert_eq!(
        routed(&c, pb, db, 2, ok).await.unwrap().status(),
        200,
        "no degraded bootstrap"
    );
    let (p, pb) = restart(p, pb, pcfg).await;
    assert_eq!(routed(&c, pb, db, 3, ok).await.unwrap().status(), 500, "stale identity");
    let (d, db) = restart(d, db, dcfg).await;
    assert_eq!(
        routed(&c, pb, db, 4, ok).await.unwrap().status(),
        200,
        "the decode's restart clears it"
    );
    p.shutdown().await.unwrap();
    d.shutdown().await.unwrap();
}

// Probes are recognised by request id or header; sessions are minted per distinct
// prefix and engine time is attributed to probes.
#[tokio::test]
async fn probes_sessions_and_busy_time_are_counted() {
    let mut cfg = Config::for_test(Role::Decode);
    cfg.settings.session_prefix_tokens = 3;
    let (h, b) = start(cfg).await;
    let c = client();
    let url = format!("http://{}/v1/chat/completions", b.http);
    for i in 0..3 {
        c.post(&url)
            .header("X-Pdwarden-Probe", "1")
            .json(&chat(&format!("fresh prompt {i} each time"), 2))
            .send()
            .await
            .unwrap();
    }
    for i in 0..2 {
        c.post(&url)
            .header("X-Request-Id", format!("pdwarden-probe-{i}"))
            .json(&chat("one fixed prompt", 2))
            .send()
            .await
            .unwrap();
    }
    c.post(&url).json(&chat("user traffic here", 2)).send().await.unwrap();
    let s = stats(&c, b).await;
    assert_eq!(s["requests_total"], 6);
    assert_eq!(s["probe_requests"], 5);
    assert_eq!(s["sessions_minted"], 5);
    assert_eq!(s["sessions_live"], 5);
    let total = s["busy_ms_total"].as_f64().unwrap();
    let probe = s["busy_ms_probe"].as_f64().unwrap();
    assert!(probe > 0.0 && total > probe);
    h.shutdown().await.unwrap();
}

// /sim/fault changes faults live, by the flags' names, and rejects unknown names.
#[tokio::test]
async fn fault_endpoint_changes_behaviour_live() {
    let (h, b) = start(Config::for_test(Role::Decode)).await;
    let c = client();
    let url = format!("http://{}/sim/fault", b.http);
    let r = c
        .post(&url)
        .json(&json!({"latency_script": "hang"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let hung = post(&c, b, "/v1/chat/completions", &chat("p", 2), Duration::from_millis(200)).await;
    assert!(hung.unwrap_err().is_timeout());
    let r = c.post(&url).json(&json!({"no_such_fault": 1})).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let r = c.post(&url).json(&json!({"serial": true})).send().await.unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["settings"]["serial"], true);
    h.shutdown().await.unwrap();
}

/// Sends a generation that the engine's script makes hang, and waits until
/// the engine counts it running.
async fn spawn_hung_generation(
    c: &reqwest::Client,
    b: Bound,
) -> tokio::task::JoinHandle<Result<reqwest::Response, reqwest::Error>> {
    let hung = tokio::spawn({
        let c = c.clone();
        async move { post(&c, b, "/v1/chat/completions", &chat("p", 2), Duration::from_secs(30)).await }
    });
    assert!(wait_until(Duration::from_secs(5), || async { stats(c, b).await["running"] == 1 }).await);
    hung
}

// Shutdown does not wait for a hung generation: it drops the connection.
#[tokio::test]
async fn shutdown_drops_hung_requests() {
    let mut cfg = Config::for_test(Role::Decode);
    cfg.latency_script = parse_latency_script("hang").unwrap();
    let (h, b) = start(cfg).await;
    let c = client();
    let hung = spawn_hung_generation(&c, b).await;
    tokio::time::timeout(Duration::from_secs(2), h.shutdown())
        .await
        .expect("shutdown is prompt")
        .unwrap();
    let r = tokio::time::timeout(Duration::from_secs(2), hung)
        .await
        .unwrap()
        .unwrap();
    assert!(r.is_err(), "the client sees the connection drop");
}

// The change-gate knob: with NAME=V in the environment at start, every generation
// is F× slower; with another value, normal speed.
#[tokio::test]
async fn knob_in_environment_slows_generation() {
    let args = |_: ()| {
        Args::parse_from([
            "pd-sim",
            "--role",
            "decode",
            "--port",
            "0",
            "--time-scale",
            "0.01",
            "--ttft-ms",
            "5000",
            "--knob-env",
            "SGLANG_SM120_MMA_TARGET_CTAS",
            "--knob-value",
            "512",
            "--knob-slowdown",
            "3",
        ])
    };
    let c = client();
    let mut took = Vec::new();
    for value in ["256", "512"] {
        let cfg = Config::from_args(args(()), |_| Some(value.to_string())).unwrap();
        let (h, b) = start(cfg).await;
        let t = Instant::now();
        post(&c, b, "/v1/chat/completions", &chat("p", 1), Duration::from_secs(5))
            .await
            .unwrap();
        took.push(t.elapsed());
        assert_eq!(stats(&c, b).await["settings"]["knob_live"], value == "512");
        h.shutdown().await.unwrap();
    }
    assert!(
        took[0] >= Duration::from_millis(50) && took[1] >= Duration::from_millis(150),
        "{took:?}"
    );
}

// `--pause-after-tokens` / `--pause-ms` (issue 47): a stream delivers N tokens,
// is silent for the pause (a retracted request), then delivers the rest and
// finishes.
#[tokio::test]
async fn a_paused_stream_resumes_and_finishes() {
    let mut cfg = Config::for_test(Role::Decode);
    cfg.settings.pause_after_tokens = 3;
    cfg.settings.pause_ms = 600.0;
    let (h, b) = start(cfg).await;
    let c = client();
    let mut body = chat("hi", 6);
    body["stream"] = json!(true);
    let mut resp = post(&c, b, "/v1/chat/completions", &body, Duration::from_secs(5))
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let (mut text, mut longest_gap, mut last) = (String::new(), Duration::ZERO, started);
    while let Some(bytes) = tokio::time::timeout(Duration::from_secs(5), resp.chunk())
        .await
        .expect("the stream resumes")
        .unwrap()
    {
        longest_gap = longest_gap.max(last.elapsed());
        last = tokio::time::Instant::now();
        text.push_str(&String::from_utf8_lossy(&bytes));
    }
    assert!(text.contains("[DONE]"), "{text}");
    assert!(longest_gap >= Duration::from_millis(550), "{longest_gap:?}");
    h.shutdown().await.unwrap();
}

// `--freeze-after-tokens`: a stream delivers exactly N tokens, then stays open
// without another byte; a non-streamed request never answers; health stays 200.
#[tokio::test]
async fn freeze_after_tokens_stops_the_stream_mid_way() {
    let mut cfg = Config::for_test(Role::Decode);
    cfg.settings.freeze_after_tokens = 3;
    let (h, b) = start(cfg).await;
    let c = client();
    let mut body = chat("hi", 20);
    body["stream"] = json!(true);
    let mut resp = post(&c, b, "/v1/chat/completions", &body, Duration::from_secs(5))
        .await
        .unwrap();
    let mut text = String::new();
    // Read until the stream goes silent; a frozen stream never ends.
    loop {
        match tokio::time::timeout(Duration::from_millis(500), resp.chunk()).await {
            Ok(Ok(Some(bytes))) => text.push_str(&String::from_utf8_lossy(&bytes)),
            Ok(Ok(None)) => panic!("a frozen stream must not end: {text}"),
            Ok(Err(e)) => panic!("stream error: {e}"),
            // 500 ms real = 50 s simulated without a byte: frozen.
            Err(_) => break,
        }
    }
    let tokens = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
        })
        .count();
    assert_eq!(tokens, 3, "{text}");
    assert!(!text.contains("[DONE]"));
    let plain = post(
        &c,
        b,
        "/v1/chat/completions",
        &chat("hi", 20),
        Duration::from_millis(500),
    )
    .await;
    assert!(plain.unwrap_err().is_timeout());
    // The frozen stream stays in the running batch and produces nothing: health waits
    // for a batch result that never comes.
    assert_eq!(status(&c, format!("http://{}/health", b.http)).await, Some(503));
    // Under the freeze, short generations still answer; one producing tokens while
    // health waits answers it.
    let short = post(&c, b, "/v1/chat/completions", &chat("hi", 2), Duration::from_secs(5)).await;
    assert!(short.unwrap().status().is_success());
    let patch = json!({"tpot_ms": 5_000.0});
    let r = c
        .post(format!("http://{}/sim/fault", b.http))
        .json(&patch)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let three = chat("hi", 3);
    let slow = post(&c, b, "/v1/chat/completions", &three, Duration::from_secs(5));
    let health = status(&c, format!("http://{}/health", b.http));
    let (slow, health) = tokio::join!(slow, health);
    assert!(slow.unwrap().status().is_success());
    assert_eq!(health, Some(200));
    drop(resp);
    h.shutdown().await.unwrap();
}

/// Starts `max_running + 1` concurrent generations on a decode with
/// `--max-running max_running`: all but one run, one queues (counted as
/// queued), health (outside the queue) stays 200, and every one finishes.
async fn excess_generation_queues(max_running: usize) {
    let mut cfg = Config::for_test(Role::Decode);
    cfg.max_running = max_running;
    // ~1.2 s real each: the window in which all but one run and one queues is
    // as long as one generation, and must outlast the third request's
    // connection on a loaded 2-core machine (a 200 ms window was missed once).
    // 120 tokens of 1 s each: the running requests produce a batch result every
    // simulated second, which is what answers health while they run.
    cfg.settings.ttft_ms = 1_000.0;
    cfg.settings.tpot_ms = 1_000.0;
    let (h, b) = start(cfg).await;
    let c = client();
    let sends: Vec<_> = (0..=max_running)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(
                async move { post(&c, b, "/v1/chat/completions", &chat("hi", 120), Duration::from_secs(10)).await },
            )
        })
        .collect();
    assert!(
        wait_until(Duration::from_secs(5), || {
            let c = c.clone();
            async move {
                let s = stats(&c, b).await;
                s["running"] == max_running && s["queued"] == 1
            }
        })
        .await,
        "{max_running} run, one queues"
    );
    assert_eq!(status(&c, format!("http://{}/health", b.http)).await, Some(200));
    for s in sends {
        assert!(s.await.unwrap().unwrap().status().is_success());
    }
    h.shutdown().await.unwrap();
}

// `--max-running 2`: a third concurrent generation waits for a slot (it is
// counted as queued) and runs once one frees.
#[tokio::test]
async fn max_running_queues_the_excess() {
    excess_generation_queues(2).await;
}

// `--kv-fail-every 2`: routed requests 1 and 3 succeed, 2 and 4 fail their transfer and
// are answered as SGLang's decode answers one — HTTP 500, chat's OpenAI error with type
// "500", /generate's FastAPI `{"detail": …}` — while unrouted generations and health are
// untouched; /sim/stats and /metrics count the failures.
#[tokio::test]
async fn kv_fail_every_fails_the_nth_routed_request() {
    let c = client();
    let ok = Duration::from_secs(5);
    let (p, pb) = start(Config::for_test(Role::Prefill)).await;
    let mut dcfg = Config::for_test(Role::Decode);
    dcfg.settings.kv_fail_every = 2;
    let (d, db) = start(dcfg).await;
    let generate = json!({"text": "hello from the router", "sampling_params": {"max_new_tokens": 4}});
    assert_eq!(routed(&c, pb, db, 1, ok).await.unwrap().status(), 200);
    assert_eq!(
        post(&c, db, "/v1/chat/completions", &chat("alone", 2), ok)
            .await
            .unwrap()
            .status(),
        200
    );
    let r = routed(&c, pb, db, 2, ok).await.unwrap();
    assert_eq!(r.status(), 500);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "error");
    assert_eq!(v["type"], "500");
    assert_eq!(v["code"], 500);
    assert_eq!(v["param"], Value::Null);
    let m = v["message"].as_str().unwrap();
    assert!(
        m.starts_with("Decode transfer failed for request rank=0 decode_req.req.rid='")
            && m.contains(
                "decode_req.req.bootstrap_room=2 with exception KVTransferError(bootstrap_room=2): KV transfer failed"
            ),
        "{m}"
    );
    assert_eq!(
        routed_to(&c, pb, db, "/generate", generate.clone(), 3, ok)
            .await
            .unwrap()
            .status(),
        200
    );
    let r = routed_to(&c, pb, db, "/generate", generate, 4, ok).await.unwrap();
    assert_eq!(r.status(), 500);
    let v: Value = r.json().await.unwrap();
    assert!(v["detail"].as_str().unwrap().contains("bootstrap_room=4"), "{v}");
    assert_eq!(status(&c, format!("http://{}/health", db.http)).await, Some(200));
    let s = stats(&c, db).await;
    assert_eq!(
        (
            &s["kv_transfers_ok"],
            &s["kv_transfers_failed"],
            &s["kv_failures_injected"]
        ),
        (&json!(2), &json!(2), &json!(2))
    );
    let metrics = c
        .get(format!("http://{}/metrics", db.http))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("sglang:num_transfer_failed_reqs_total{model_name=\"pd-sim/sim-model\"} 2"),
        "{metrics}"
    );
    // A live patch restarts the count: the 3rd routed request after it fails.
    let r = c
        .post(format!("http://{}/sim/fault", db.http))
        .json(&json!({"kv_fail_every": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let after: Vec<u16> = {
        let mut v = Vec::new();
        for room in 5..8 {
            v.push(routed(&c, pb, db, room, ok).await.unwrap().status().as_u16());
        }
        v
    };
    assert_eq!(after, [200, 200, 500]);
    // Both ends see each failure: the prefill released the three failed rooms from its
    // inflight queue, as it released the taken ones.
    let ps = stats(&c, pb).await;
    assert_eq!(
        (&ps["kv_rooms_failed"], &ps["prefill_inflight"]),
        (&json!(3), &json!(0))
    );
    let pm = metrics_text(&c, pb).await;
    assert_eq!(metric(&pm, name(Signal::TransferFailed), ""), 3.0, "{pm}");
    // A prefill refuses the fault.
    assert_eq!(fault_status(&c, pb, json!({"kv_fail_every": 1})).await, 400);
    p.shutdown().await.unwrap();
    d.shutdown().await.unwrap();
}

// `--lazy-failure-counters`: like SGLang's labelled prometheus_client Counters
// (`python/sglang/srt/metrics/collector.py`, whose series is created by the first
// `.labels(...).inc()`), the PD failure counters are absent from /metrics — family and
// sample — until they first count a failure; the failed transfer then shows as 1 on the
// decode and on the prefill, and the bootstrap counter, never incremented, stays absent.
// Without the flag the same engine shows both at 0 from the start.
#[tokio::test]
async fn lazy_failure_counters_appear_at_their_first_increment() {
    let c = client();
    let ok = Duration::from_secs(5);
    let transfer = name(Signal::TransferFailed);
    let bootstrap = name(Signal::BootstrapFailed);
    let (plain, plain_b) = start(Config::for_test(Role::Decode)).await;
    let m = metrics_text(&c, plain_b).await;
    for counter in [transfer, bootstrap] {
        assert!(
            m.contains(&format!("{counter}{{model_name=\"pd-sim/sim-model\"}} 0\n")),
            "{m}"
        );
    }
    plain.shutdown().await.unwrap();

    let mut pcfg = Config::for_test(Role::Prefill);
    pcfg.lazy_failure_counters = true;
    let (p, pb) = start(pcfg).await;
    let mut dcfg = Config::for_test(Role::Decode);
    dcfg.lazy_failure_counters = true;
    dcfg.settings.kv_fail_every = 2;
    let (d, db) = start(dcfg).await;
    for b in [pb, db] {
        let m = metrics_text(&c, b).await;
        assert!(!m.contains(transfer) && !m.contains(bootstrap), "{m}");
    }
    assert_eq!(routed(&c, pb, db, 1, ok).await.unwrap().status(), 200);
    let m = metrics_text(&c, db).await;
    assert!(!m.contains(transfer) && !m.contains(bootstrap), "{m}");
    assert_eq!(routed(&c, pb, db, 2, ok).await.unwrap().status(), 500);
    let dm = metrics_text(&c, db).await;
    assert!(
        dm.contains(&format!(
            "# TYPE {transfer} counter\n{transfer}{{model_name=\"pd-sim/sim-model\"}} 1\n"
        )),
        "{dm}"
    );
    assert!(!dm.contains(bootstrap), "{dm}");
    // The prefill learns of the failed room from its decode.
    assert!(
        wait_until(ok, || async {
            metric(&metrics_text(&c, pb).await, transfer, "") == 1.0
        })
        .await,
        "{}",
        metrics_text(&c, pb).await
    );
    assert!(!metrics_text(&c, pb).await.contains(bootstrap));
    p.shutdown().await.unwrap();
    d.shutdown().await.unwrap();
}

// A relapse over HTTP: after 2 generations every one is charged F× the model, /sim/stats
// counts them, and health stays 200 (its pass is not slowed).
#[tokio::test]
async fn relapse_slows_later_generations_health_stays_200() {
    let mut cfg = Config::for_test(Role::Decode);
    cfg.settings.ttft_ms = 1_000.0;
    cfg.settings.tpot_ms = 100.0;
    cfg.settings.relapse_after = Some(2);
    cfg.settings.relapse_slowdown = 3.0;
    let (h, b) = start(cfg).await;
    let c = client();
    let mut charged = Vec::new();
    for _ in 0..4 {
        let before = stats(&c, b).await["busy_ms_total"].as_f64().unwrap();
        let r = post(&c, b, "/v1/chat/completions", &chat("p", 2), Duration::from_secs(5)).await;
        assert_eq!(r.unwrap().status(), 200);
        charged.push(stats(&c, b).await["busy_ms_total"].as_f64().unwrap() - before);
    }
    let warm = 1_000.0 + 0.05 + 200.0;
    for (got, want) in charged.iter().zip([warm, warm, 3.0 * warm, 3.0 * warm]) {
        assert!((got - want).abs() < 1e-6, "{charged:?}");
    }
    assert_eq!(stats(&c, b).await["relapsed_requests"], 2);
    assert_eq!(status(&c, format!("http://{}/health", b.http)).await, Some(200));
    h.shutdown().await.unwrap();
}

// Real restarts of one unit with a start counter: start k takes entry k of
// --cold-first-ms-by-start (the last repeats), a missing file counts as no start
// before, and the count survives in the file.
#[tokio::test]
async fn cold_first_ms_differs_by_start() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("starts");
    let args = Args::parse_from([
        "pd-sim",
        "--role",
        "decode",
        "--port",
        "0",
        "--time-scale",
        "0.01",
        "--ttft-ms",
        "100",
        "--tpot-ms",
        "0",
        "--prefill-tok-per-s",
        "0",
        "--cold-first-ms-by-start",
        "9000,2000,0",
        "--start-count-file",
        file.to_str().unwrap(),
    ]);
    let cfg = Config::from_args(args, |_| None).unwrap();
    let c = client();
    let (mut h, mut b) = start(cfg.clone()).await;
    let mut seen = Vec::new();
    for k in 1..=4u64 {
        if k > 1 {
            (h, b) = restart(h, b, cfg.clone()).await;
        }
        post(&c, b, "/v1/chat/completions", &chat("p", 1), Duration::from_secs(5))
            .await
            .unwrap();
        let s = stats(&c, b).await;
        assert_eq!(s["start_number"], k);
        seen.push((
            s["settings"]["cold_first_ms"].as_f64().unwrap(),
            s["busy_ms_total"].as_f64().unwrap(),
        ));
    }
    assert_eq!(seen, [(9000.0, 9100.0), (2000.0, 2100.0), (0.0, 100.0), (0.0, 100.0)]);
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), "4");
    h.shutdown().await.unwrap();
}

// A start-count file that holds no number stops the start with one line naming the flag.
#[tokio::test]
async fn bad_start_count_file_fails_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("starts");
    std::fs::write(&file, "three\n").unwrap();
    let mut cfg = Config::for_test(Role::Decode);
    cfg.cold_by_start = Some(crate::config::ColdByStart {
        cold_first_ms: vec![0.0],
        count_file: file.clone(),
    });
    let mut h = spawn(cfg);
    let e = h.bound().await.unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "--start-count-file {} holds \"three\", not a number of starts",
            file.display()
        )
    );
}

// `--latency-script hang,` on a pair's decode: the first routed generation after start
// hangs for good, waiting for its KV (in the transfer queue, not the running batch);
// the next ones, sent while it still hangs, follow the model; the decode's health stays
// 200.
#[tokio::test]
async fn hang_once_then_normal_generations() {
    let (p, pb) = start(Config::for_test(Role::Prefill)).await;
    let mut cfg = Config::for_test(Role::Decode);
    cfg.latency_script = parse_latency_script("hang,").unwrap();
    let (h, b) = start(cfg).await;
    let c = client();
    let hung = tokio::spawn({
        let c = c.clone();
        async move { routed(&c, pb, b, 1, Duration::from_secs(30)).await }
    });
    assert!(
        wait_until(Duration::from_secs(5), || async {
            stats(&c, b).await["transfer_waiting"] == 1
        })
        .await
    );
    for room in 2..4 {
        let r = routed(&c, pb, b, room, Duration::from_secs(5)).await;
        assert_eq!(r.unwrap().status(), 200);
    }
    assert_eq!(status(&c, format!("http://{}/health", b.http)).await, Some(200));
    let s = stats(&c, b).await;
    assert_eq!(
        (&s["completed"], &s["running"], &s["transfer_waiting"]),
        (&json!(2), &json!(0), &json!(1)),
        "the first still hangs, waiting for its KV"
    );
    assert!(!hung.is_finished());
    h.shutdown().await.unwrap();
    p.shutdown().await.unwrap();
}

// `--max-running 1`, a scheduler that stops batching: of two concurrent generations one
// runs and one queues behind it, health (outside the queue) stays 200, both finish.
#[tokio::test]
async fn max_running_one_stops_batching() {
    excess_generation_queues(1).await;
}

async fn metrics_text(c: &reqwest::Client, b: Bound) -> String {
    c.get(format!("http://{}/metrics", b.http))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of `name` in Prometheus `text`, summed over its samples whose labels
/// contain `label` ("" = all of them).
fn metric(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, labels) = series.split_once('{')?;
            (n == name && labels.contains(label)).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

fn name(signal: pdwarden_engines::Signal) -> &'static str {
    pdwarden_engines::SGLANG.metric(signal).unwrap().name
}

use pdwarden_engines::Signal;

// pd-sim exposes every signal of the SGLang profile under one of the profile's names
// for it (the first: a renamed gauge keeps its older name, as in the release pd-sim
// imitates), each PD queue gauge on the role that has it.
#[tokio::test]
async fn metrics_carry_every_name_of_the_sglang_profile() {
    let c = client();
    for role in [Role::Prefill, Role::Decode] {
        let (h, b) = start(Config::for_test(role)).await;
        let text = metrics_text(&c, b).await;
        for m in pdwarden_engines::SGLANG.metrics {
            let other_role = match role {
                Role::Prefill => matches!(m.signal, Signal::DecodePreallocQueue | Signal::DecodeTransferQueue),
                Role::Decode => matches!(m.signal, Signal::PrefillPreallocQueue | Signal::PrefillInflightQueue),
            };
            let emitted: Vec<&str> = pdwarden_engines::SGLANG
                .metrics
                .iter()
                .filter(|o| o.signal == m.signal && text.contains(&format!("# TYPE {} ", o.name)))
                .map(|o| o.name)
                .collect();
            let expected = if other_role { vec![] } else { vec![name(m.signal)] };
            assert_eq!(emitted, expected, "{role}: {:?}\n{text}", m.signal);
        }
        for mode in ["prefill_compute", "prefill_cache", "decode"] {
            assert!(
                text.contains(&format!(
                    "sglang:realtime_tokens_total{{model_name=\"pd-sim/sim-model\",mode=\"{mode}\"}} 0"
                )),
                "{text}"
            );
        }
        h.shutdown().await.unwrap();
    }
}

// SGLang's `observe_one_finished_request`: `num_requests_total`, `prompt_tokens_total`
// and `generation_tokens_total` on /metrics stay flat while a long request runs and
// rise when it finishes — answered, or aborted by its client. /sim/stats keeps
// pd-sim's own counts (requests at arrival, prompt tokens at admission).
#[tokio::test]
async fn sglang_counters_rise_only_when_a_request_finishes() {
    let mut cfg = Config::for_test(Role::Decode);
    cfg.settings.ttft_ms = 1_000.0;
    cfg.settings.tpot_ms = 1_000.0;
    cfg.settings.prefill_tok_per_s = 1_000.0;
    let (h, b) = start(cfg).await;
    let c = client();
    let prompt = "word ".repeat(2000);
    // 1 s + 2 s of prefill + 40 tokens of 1 s: 43 s simulated, 430 ms real.
    let body = chat(&prompt, 40);
    let send = tokio::spawn({
        let (c, body) = (c.clone(), body.clone());
        async move { post(&c, b, "/v1/chat/completions", &body, Duration::from_secs(10)).await }
    });
    let generating = wait_until(Duration::from_secs(5), || async {
        metric(
            &metrics_text(&c, b).await,
            name(Signal::RealtimeTokens),
            "mode=\"decode\"",
        ) >= 1.0
    })
    .await;
    assert!(generating);
    let during = metrics_text(&c, b).await;
    for s in [Signal::Requests, Signal::PromptTokens, Signal::GenerationTokens] {
        assert_eq!(metric(&during, name(s), ""), 0.0, "{}: {during}", name(s));
    }
    let s = stats(&c, b).await;
    assert_eq!(
        (&s["requests_total"], &s["prompt_tokens_total"]),
        (&json!(1), &json!(2000))
    );
    assert_eq!(send.await.unwrap().unwrap().status(), 200);
    let after = metrics_text(&c, b).await;
    assert_eq!(metric(&after, name(Signal::Requests), ""), 1.0);
    assert_eq!(metric(&after, name(Signal::PromptTokens), ""), 2000.0);
    assert_eq!(metric(&after, name(Signal::GenerationTokens), ""), 40.0);
    // A client that gives up mid-generation: the request is aborted, and counted then.
    let gone = post(&c, b, "/v1/chat/completions", &body, Duration::from_millis(150)).await;
    assert!(gone.unwrap_err().is_timeout());
    assert!(
        wait_until(Duration::from_secs(5), || async {
            stats(&c, b).await["disconnected"] == 1
        })
        .await
    );
    let aborted = metrics_text(&c, b).await;
    assert_eq!(metric(&aborted, name(Signal::Requests), ""), 2.0);
    assert_eq!(metric(&aborted, name(Signal::PromptTokens), ""), 4000.0);
    assert_eq!(metric(&aborted, name(Signal::AbortedRequests), ""), 1.0);
    h.shutdown().await.unwrap();
}

// `sglang:realtime_tokens_total` rises during work: by each chunk's tokens when the
// chunk's forward pass completes (20,000 tokens in chunks of 8,192: 8,192, 16,384,
// 20,000 and nothing in between), then by the decode steps while the generation runs,
// long before `generation_tokens_total` moves.
#[tokio::test]
async fn realtime_tokens_rise_per_prefill_chunk_and_during_decode() {
    let mut cfg = Config::for_test(Role::Decode);
    cfg.settings.prefill_tok_per_s = 200.0;
    cfg.settings.tpot_ms = 1_000.0;
    assert_eq!(cfg.chunked_prefill_size, Some(8192));
    let (h, b) = start(cfg).await;
    let c = client();
    // Chunks complete at ~41 s, ~82 s and 100 s simulated (410, 820, 1,000 ms real),
    // then 60 tokens of 1 s (600 ms real).
    let send = tokio::spawn({
        let c = c.clone();
        async move {
            let body = chat(&"tok ".repeat(20_000), 60);
            post(&c, b, "/v1/chat/completions", &body, Duration::from_secs(20)).await
        }
    });
    let rt = name(Signal::RealtimeTokens);
    let mut prefill_seen = std::collections::BTreeSet::new();
    let mut decode_mid_generation = false;
    while !send.is_finished() {
        let text = metrics_text(&c, b).await;
        prefill_seen.insert(metric(&text, rt, "mode=\"prefill_compute\"") as u64);
        let decode = metric(&text, rt, "mode=\"decode\"");
        if decode > 0.0 && decode < 60.0 && metric(&text, name(Signal::GenerationTokens), "") == 0.0 {
            decode_mid_generation = true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(send.await.unwrap().unwrap().status(), 200);
    assert!(
        prefill_seen.is_subset(&[0, 8192, 16_384, 20_000].into()),
        "only whole chunks: {prefill_seen:?}"
    );
    assert!(
        prefill_seen.contains(&8192) && prefill_seen.contains(&16_384),
        "{prefill_seen:?}"
    );
    assert!(decode_mid_generation, "decode tokens rose while the generation ran");
    let text = metrics_text(&c, b).await;
    assert_eq!(metric(&text, rt, "mode=\"prefill_compute\""), 20_000.0);
    assert_eq!(metric(&text, rt, "mode=\"decode\""), 60.0);
    let s = stats(&c, b).await;
    assert_eq!(s["realtime_decode_tokens"], 60);
    h.shutdown().await.unwrap();
}

// Tokens served from the prefix cache count as `mode="prefill_cache"`, the rest as
// `prefill_compute`.
#[tokio::test]
async fn realtime_tokens_split_prefix_cache_hits() {
    let mut cfg = Config::for_test(Role::Decode);
    cfg.settings.session_prefix_tokens = 100;
    let (h, b) = start(cfg).await;
    let c = client();
    let prompt = "same ".repeat(300);
    for _ in 0..2 {
        let r = post(&c, b, "/v1/chat/completions", &chat(&prompt, 1), Duration::from_secs(5)).await;
        assert_eq!(r.unwrap().status(), 200);
    }
    let text = metrics_text(&c, b).await;
    let rt = name(Signal::RealtimeTokens);
    assert_eq!(metric(&text, rt, "mode=\"prefill_compute\""), 500.0);
    assert_eq!(metric(&text, rt, "mode=\"prefill_cache\""), 100.0);
    h.shutdown().await.unwrap();
}

// sgl-project/sglang#22511: on a serial engine, a 50 s prefill in one forward pass
// (5,000 tokens at 100 tok/s, under the 8,192-token chunk) gives no batch result for
// longer than the health timeout: health, waiting on the busy scheduler, answers 503
// during an honest prefill, and 200 again once the engine is idle. With 1,000-token
// chunks (10 s each) every chunk answers it: 200 throughout.
#[tokio::test]
async fn health_503_during_a_prefill_pass_longer_than_its_timeout() {
    let c = client();
    for (chunk, during) in [(None, 503), (Some(1000), 200)] {
        let mut cfg = Config::for_test(Role::Decode);
        cfg.settings.serial = true;
        cfg.settings.prefill_tok_per_s = 100.0;
        if chunk.is_some() {
            cfg.chunked_prefill_size = chunk;
        }
        let (h, b) = start(cfg).await;
        let send = tokio::spawn({
            let c = c.clone();
            async move {
                let body = chat(&"token ".repeat(5000), 4);
                post(&c, b, "/v1/chat/completions", &body, Duration::from_secs(10)).await
            }
        });
        assert!(wait_until(Duration::from_secs(5), || async { stats(&c, b).await["running"] == 1 }).await);
        assert_eq!(
            status(&c, format!("http://{}/health", b.http)).await,
            Some(during),
            "chunk {chunk:?}"
        );
        assert!(!send.is_finished(), "the prefill still runs");
        assert_eq!(send.await.unwrap().unwrap().status(), 200);
        assert_eq!(status(&c, format!("http://{}/health", b.http)).await, Some(200));
        let s = stats(&c, b).await;
        assert_eq!(s["health_waited_on_batch"], 1);
        assert_eq!(s["health_failed"], u64::from(during == 503));
        h.shutdown().await.unwrap();
    }
}

// `--kv-transfer-ms`: a slow but working link. A routed request's KV arrives 30 s
// (simulated) after the prefill computed it: meanwhile the prefill holds the room in its
// inflight queue and the decode's request waits in its transfer queue, not running (its
// health stays 200); then it completes. A live patch back to 0 makes the next one fast.
#[tokio::test]
async fn kv_transfer_ms_delays_the_transfer_but_completes() {
    let c = client();
    let (p, pb) = start(Config::for_test(Role::Prefill)).await;
    let mut dcfg = Config::for_test(Role::Decode);
    dcfg.settings.kv_transfer_ms = 30_000.0;
    let (d, db) = start(dcfg).await;
    let t = Instant::now();
    let send = tokio::spawn({
        let c = c.clone();
        async move { routed(&c, pb, db, 1, Duration::from_secs(10)).await }
    });
    let in_transfer = wait_until(Duration::from_secs(5), || async {
        stats(&c, db).await["transfer_waiting"] == 1 && stats(&c, pb).await["prefill_inflight"] == 1
    })
    .await;
    assert!(in_transfer);
    let dm = metrics_text(&c, db).await;
    assert_eq!(metric(&dm, name(Signal::DecodeTransferQueue), ""), 1.0);
    assert_eq!(metric(&dm, name(Signal::RunningReqs), ""), 0.0);
    let pm = metrics_text(&c, pb).await;
    assert_eq!(metric(&pm, name(Signal::PrefillInflightQueue), ""), 1.0);
    assert_eq!(status(&c, format!("http://{}/health", db.http)).await, Some(200));
    let r = send.await.unwrap().unwrap();
    assert_eq!(r.status(), 200);
    assert!(t.elapsed() >= Duration::from_millis(300), "{:?}", t.elapsed());
    let (ds, ps) = (stats(&c, db).await, stats(&c, pb).await);
    assert_eq!(
        (&ds["kv_transfers_delayed"], &ds["kv_transfers_ok"]),
        (&json!(1), &json!(1))
    );
    assert_eq!((&ps["kv_served"], &ps["prefill_inflight"]), (&json!(1), &json!(0)));
    let patch = json!({"kv_transfer_ms": 0});
    let r = c
        .post(format!("http://{}/sim/fault", db.http))
        .json(&patch)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let t = Instant::now();
    assert_eq!(
        routed(&c, pb, db, 2, Duration::from_secs(5)).await.unwrap().status(),
        200
    );
    assert!(t.elapsed() < Duration::from_millis(300), "{:?}", t.elapsed());
    p.shutdown().await.unwrap();
    d.shutdown().await.unwrap();
}

// `--kv-stall` (set live): a routed request's KV never arrives. The decode's request
// waits in its transfer queue forever (not running) and the prefill's room stays in its
// inflight queue, both gauges up; the prefill still computes (its realtime prefill
// tokens advance); health stays 200 on both. Turning it off lets the next request
// through, while the stuck one stays stuck.
#[tokio::test]
async fn kv_stall_never_completes_and_keeps_both_queue_gauges_up() {
    let c = client();
    let (p, pb) = start(Config::for_test(Role::Prefill)).await;
    let (d, db) = start(Config::for_test(Role::Decode)).await;
    let fault = |body: Value| {
        let c = c.clone();
        async move {
            let r = c
                .post(format!("http://{}/sim/fault", db.http))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
    };
    fault(json!({"kv_stall": true})).await;
    let stuck = tokio::spawn({
        let c = c.clone();
        async move { routed(&c, pb, db, 1, Duration::from_secs(30)).await }
    });
    let stalled = wait_until(Duration::from_secs(5), || async {
        stats(&c, db).await["kv_stalled_requests"] == 1 && stats(&c, pb).await["prefill_inflight"] == 1
    })
    .await;
    assert!(stalled);
    // 300 ms real = 30 s simulated later, nothing has moved.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!stuck.is_finished());
    let dm = metrics_text(&c, db).await;
    assert_eq!(metric(&dm, name(Signal::DecodeTransferQueue), ""), 1.0, "{dm}");
    assert_eq!(metric(&dm, name(Signal::RunningReqs), ""), 0.0, "{dm}");
    assert_eq!(
        metric(&dm, name(Signal::RealtimeTokens), "mode=\"decode\""),
        0.0,
        "{dm}"
    );
    let pm = metrics_text(&c, pb).await;
    assert_eq!(metric(&pm, name(Signal::PrefillInflightQueue), ""), 1.0, "{pm}");
    assert!(
        metric(&pm, name(Signal::RealtimeTokens), "mode=\"prefill_compute\"") >= 4.0,
        "{pm}"
    );
    for e in [db, pb] {
        assert_eq!(status(&c, format!("http://{}/health", e.http)).await, Some(200));
    }
    fault(json!({"kv_stall": false})).await;
    assert_eq!(
        routed(&c, pb, db, 2, Duration::from_secs(5)).await.unwrap().status(),
        200
    );
    assert!(!stuck.is_finished(), "an already stuck request stays stuck");
    let (ds, ps) = (stats(&c, db).await, stats(&c, pb).await);
    assert_eq!(
        (&ds["transfer_waiting"], &ds["kv_stalled_requests"], &ds["completed"]),
        (&json!(1), &json!(1), &json!(1))
    );
    assert_eq!(ps["prefill_inflight"], 1, "room 1 is never taken");
    stuck.abort();
    // A prefill refuses the fault.
    assert_eq!(fault_status(&c, pb, json!({"kv_stall": true})).await, 400);
    p.shutdown().await.unwrap();
    d.shutdown().await.unwrap();
}

// `--sglang-version`: an older release exposes only what it had (each metric's `since`
// in the profile): 0.4.9 has the decode's transfer-queue gauge (0.4.6.post4) but neither
// `realtime_tokens_total` (0.5.7) nor the prefill's inflight gauge (0.5.1.post2), and its
// `/health` answers 200 without generating (before 0.4.10.post2) even with the health
// pass hung, while `/health_generate` still generates and fails.
#[tokio::test]
async fn an_older_release_exposes_only_what_it_had() {
    let c = client();
    for role in [Role::Prefill, Role::Decode] {
        let mut cfg = Config::for_test(role);
        cfg.sglang_version = "0.4.9".into();
        // As `Config::from_args` derives it for 0.4.9 (see its test).
        cfg.health_endpoint_generates = false;
        cfg.settings.fault_health_hang = true;
        let (h, b) = start(cfg).await;
        let text = metrics_text(&c, b).await;
        assert!(!text.contains(name(Signal::RealtimeTokens)), "{text}");
        assert!(!text.contains(name(Signal::PrefillInflightQueue)), "{text}");
        assert!(text.contains(name(Signal::RunningReqs)), "{text}");
        assert_eq!(
            text.contains(name(Signal::DecodeTransferQueue)),
            role == Role::Decode,
            "{text}"
        );
        let base = format!("http://{}", b.http);
        assert_eq!(status(&c, format!("{base}/health")).await, Some(200));
        assert_eq!(status(&c, format!("{base}/health_generate")).await, Some(503));
        h.shutdown().await.unwrap();
    }
}

// ---------------------------------------------------------------- golden output (issue 34)

/// pdwarden's golden request: greedy, a fixed seed, logprobs with two alternatives.
fn golden(max_tokens: u64) -> Value {
    json!({
        "model": "m",
        "messages": [{"role": "user", "content": "Name three rivers of Europe."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 42,
        "logprobs": true,
        "top_logprobs": 2,
    })
}

/// The answer's tokens, from `choices[0].logprobs.content`.
fn answer_tokens(v: &Value) -> Vec<String> {
    v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["token"].as_str().unwrap().to_string())
        .collect()
}

/// The top-2 margin (nats) of `v`'s token at `i`.
fn margin_at(v: &Value, i: usize) -> f64 {
    let top = &v["choices"][0]["logprobs"]["content"][i]["top_logprobs"];
    top[0]["logprob"].as_f64().unwrap() - top[1]["logprob"].as_f64().unwrap()
}

async fn chat_json(c: &reqwest::Client, b: Bound, body: &Value) -> Value {
    let r = post(c, b, "/v1/chat/completions", body, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

async fn routed_json(c: &reqwest::Client, p: Bound, d: Bound, room: u64, body: Value) -> Value {
    let r = routed_to(c, p, d, "/v1/chat/completions", body, room, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

// A greedy answer with logprobs is in OpenAI's shape (vLLM's ChatCompletionLogProbs,
// SGLang's ChoiceLogprobs): content is the tokens joined, usage counts them, each
// entry is {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]} with the
// chosen token first among min(top_logprobs, 5) alternatives. The same prompt and
// weights answer identically after a restart and on another engine.
#[tokio::test]
async fn greedy_answer_has_openai_logprobs_and_survives_a_restart() {
    let c = client();
    let cfg = Config::for_test(Role::Decode);
    let (h, b) = start(cfg.clone()).await;
    let v = chat_json(&c, b, &golden(8)).await;
    let choice = &v["choices"][0];
    let content = choice["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 8);
    assert_eq!(v["usage"]["completion_tokens"], 8);
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(
        choice["message"]["content"].as_str().unwrap(),
        answer_tokens(&v).concat()
    );
    for e in content {
        let keys: Vec<&str> = e.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 4, "{e}");
        for k in ["token", "logprob", "bytes", "top_logprobs"] {
            assert!(keys.contains(&k), "{e}");
        }
        let token = e["token"].as_str().unwrap();
        let bytes: Vec<u8> = serde_json::from_value(e["bytes"].clone()).unwrap();
        assert_eq!(bytes, token.as_bytes());
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(top[0]["token"], e["token"]);
        assert_eq!(top[0]["logprob"], e["logprob"]);
        assert!(top[1]["token"] != e["token"]);
        for t in top {
            assert_eq!(t.as_object().unwrap().len(), 3, "{t}");
            let b: Vec<u8> = serde_json::from_value(t["bytes"].clone()).unwrap();
            assert_eq!(b, t["token"].as_str().unwrap().as_bytes());
        }
    }
    for i in 0..8 {
        assert!(margin_at(&v, i) >= 1.0, "clear at {i}: {v}");
    }
    // top_logprobs is capped at 5; without logprobs, none; a sampled request gets the filler.
    let mut many = golden(3);
    many["top_logprobs"] = json!(9);
    let w = chat_json(&c, b, &many).await;
    assert_eq!(
        w["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        5
    );
    let mut none = golden(3);
    none.as_object_mut().unwrap().remove("logprobs");
    none.as_object_mut().unwrap().remove("top_logprobs");
    let w = chat_json(&c, b, &none).await;
    assert_eq!(w["choices"][0]["logprobs"], Value::Null);
    assert_eq!(
        w["choices"][0]["message"]["content"].as_str().unwrap(),
        answer_tokens(&v)[..3].concat()
    );
    let mut hot = golden(3);
    hot["temperature"] = json!(0.7);
    let w = chat_json(&c, b, &hot).await;
    assert_eq!(w["choices"][0]["logprobs"], Value::Null);
    assert_eq!(w["choices"][0]["message"]["content"], "The quick brown ");
    // A restart, and another engine: the same tokens and logprobs.
    let (h, b) = restart(h, b, cfg.clone()).await;
    let again = chat_json(&c, b, &golden(8)).await;
    assert_eq!(again["choices"][0]["logprobs"], v["choices"][0]["logprobs"]);
    assert_eq!(again["choices"][0]["message"], v["choices"][0]["message"]);
    let (other, ob) = start(Config::for_test(Role::Prefill)).await;
    let there = chat_json(&c, ob, &golden(8)).await;
    assert_eq!(there["choices"][0]["logprobs"], v["choices"][0]["logprobs"]);
    h.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

// A streamed greedy answer carries the same tokens, one logprobs entry per chunk.
#[tokio::test]
async fn streamed_greedy_answer_matches_the_whole_one() {
    let c = client();
    let (h, b) = start(Config::for_test(Role::Decode)).await;
    let whole = chat_json(&c, b, &golden(5)).await;
    let mut body = golden(5);
    body["stream"] = json!(true);
    let text = post(&c, b, "/v1/chat/completions", &body, Duration::from_secs(10))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut content = String::new();
    let mut entries = Vec::new();
    for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if line == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(line).unwrap();
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            content.push_str(t);
        }
        if let Some(e) = v["choices"][0]["logprobs"]["content"].as_array() {
            entries.extend(e.iter().cloned());
        }
    }
    assert_eq!(content, whole["choices"][0]["message"]["content"].as_str().unwrap());
    assert_eq!(Value::Array(entries), whole["choices"][0]["logprobs"]["content"]);
    h.shutdown().await.unwrap();
}

// Other weights answer otherwise from the first token, where the old reference was
// clearly preferred: set live (`{"weights": …}`), or loaded at start from
// `--weights-file` ("the weights on disk" replaced, then a restart).
#[tokio::test]
async fn other_weights_answer_otherwise_live_and_from_disk() {
    let c = client();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("weights");
    let mut cfg = Config::for_test(Role::Decode);
    cfg.weights_file = Some(file.clone());
    let (h, b) = start(cfg.clone()).await;
    let v1 = chat_json(&c, b, &golden(6)).await;
    assert_eq!(fault_status(&c, b, json!({"weights": "tiny-v2"})).await, 200);
    let v2 = chat_json(&c, b, &golden(6)).await;
    assert_ne!(answer_tokens(&v1)[0], answer_tokens(&v2)[0]);
    assert!(margin_at(&v1, 0) >= 1.0);
    assert_eq!(fault_status(&c, b, json!({"weights": " "})).await, 400);
    // The file on disk is read at the next start only.
    std::fs::write(&file, "tiny-v2\n").unwrap();
    let (h, b) = restart(h, b, cfg.clone()).await;
    let from_disk = chat_json(&c, b, &golden(6)).await;
    assert_eq!(from_disk["choices"][0]["logprobs"], v2["choices"][0]["logprobs"]);
    let s: Value = c
        .get(format!("http://{}/sim/fault", b.http))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(s["settings"]["weights"], "tiny-v2");
    h.shutdown().await.unwrap();
}

// A healthy PD pair answers as one engine on its weights does (the decode's answer is
// what the router returns); with the prefill on other weights, the pair answers
// neither engine's answer, wrong from the first token with a clear margin.
#[tokio::test]
async fn a_pd_pair_on_different_weights_answers_wrong() {
    let c = client();
    let (p, pb) = start(Config::for_test(Role::Prefill)).await;
    let (d, db) = start(Config::for_test(Role::Decode)).await;
    let single = chat_json(&c, db, &golden(6)).await;
    let pair = routed_json(&c, pb, db, 1, golden(6)).await;
    assert_eq!(pair["choices"][0]["logprobs"], single["choices"][0]["logprobs"]);
    assert_eq!(pair["usage"]["completion_tokens"], 6);
    assert_eq!(fault_status(&c, pb, json!({"weights": "tiny-v2"})).await, 200);
    let v2 = chat_json(&c, pb, &golden(6)).await;
    let mixed = routed_json(&c, pb, db, 2, golden(6)).await;
    let (m, s1, s2) = (answer_tokens(&mixed), answer_tokens(&single), answer_tokens(&v2));
    assert!(m[0] != s1[0] && m[0] != s2[0], "{m:?} {s1:?} {s2:?}");
    assert!(margin_at(&single, 0) >= 1.0 && margin_at(&v2, 0) >= 1.0);
    assert_eq!(stats(&c, db).await["mixed_weights_answers"], 1);
    // The same mismatch answers the same wrong answer every time.
    let again = routed_json(&c, pb, db, 3, golden(6)).await;
    assert_eq!(again["choices"][0]["logprobs"], mixed["choices"][0]["logprobs"]);
    p.shutdown().await.unwrap();
    d.shutdown().await.unwrap();
}

// `kv_corruption` (decode, live): a routed answer is the healthy one up to position K
// and wrong from K, where the healthy answer was clearly preferred; still HTTP 200,
// finish_reason as usual. Requests served whole are unaffected; a prefill refuses it.
#[tokio::test]
async fn kv_corruption_is_wrong_from_position_k() {
    let c = client();
    let (p, pb) = start(Config::for_test(Role::Prefill)).await;
    let (d, db) = start(Config::for_test(Role::Decode)).await;
    let healthy = routed_json(&c, pb, db, 1, golden(6)).await;
    assert_eq!(
        fault_status(&c, db, json!({"kv_corruption": true, "corrupt_from_position": 3})).await,
        200
    );
    let bad = routed_json(&c, pb, db, 2, golden(6)).await;
    assert_eq!(bad["choices"][0]["finish_reason"], "length");
    let (h, b) = (answer_tokens(&healthy), answer_tokens(&bad));
    assert_eq!(h[..3], b[..3]);
    for i in 3..6 {
        assert_ne!(h[i], b[i], "position {i}");
        assert!(margin_at(&healthy, i) >= 1.0);
    }
    let alone = chat_json(&c, db, &golden(6)).await;
    assert_eq!(answer_tokens(&alone), h);
    // The default K is 2.
    assert_eq!(Config::for_test(Role::Decode).settings.corrupt_from_position, 2);
    assert_eq!(fault_status(&c, pb, json!({"kv_corruption": true})).await, 400);
    assert_eq!(stats(&c, db).await["corrupted_answers"], 1);
    p.shutdown().await.unwrap();
    d.shutdown().await.unwrap();
}

// `kv_reuse_under_load`: alone, the answer is healthy; with two requests in the
// running batch at once (the default threshold), both are wrong from position 2.
#[tokio::test]
async fn kv_reuse_under_load_corrupts_only_concurrent_answers() {
    let c = client();
    let mut cfg = Config::for_test(Role::Decode);
    // Both requests are in the running batch well before their first token (200 ms).
    cfg.settings.ttft_ms = 20_000.0;
    cfg.settings.tpot_ms = 100.0;
    let (h, b) = start(cfg).await;
    let healthy = chat_json(&c, b, &golden(5)).await;
    assert_eq!(fault_status(&c, b, json!({"kv-reuse-under-load": true})).await, 200);
    let alone = chat_json(&c, b, &golden(5)).await;
    assert_eq!(answer_tokens(&alone), answer_tokens(&healthy));
    let g = golden(5);
    let (x, y) = tokio::join!(chat_json(&c, b, &g), chat_json(&c, b, &g));
    for v in [&x, &y] {
        let (t, ok) = (answer_tokens(v), answer_tokens(&healthy));
        assert_eq!(t[..2], ok[..2]);
        assert!((2..5).all(|i| t[i] != ok[i]), "{t:?} {ok:?}");
    }
    // A threshold above the load: healthy again.
    assert_eq!(fault_status(&c, b, json!({"kv_reuse_min_running": 3})).await, 200);
    let (x, _) = tokio::join!(chat_json(&c, b, &g), chat_json(&c, b, &g));
    assert_eq!(answer_tokens(&x), answer_tokens(&healthy));
    assert_eq!(fault_status(&c, b, json!({"kv_reuse_min_running": 0})).await, 400);
    h.shutdown().await.unwrap();
}

// `near_tie_positions`: there the top two are within 0.01 nats and the chosen token
// alternates with each start (counted in `--start-count-file`); elsewhere the answer
// is the same across starts.
#[tokio::test]
async fn near_tie_positions_flip_between_starts() {
    let c = client();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::for_test(Role::Decode);
    cfg.start_count_file = Some(dir.path().join("starts"));
    cfg.settings.near_tie_positions = vec![1];
    let (h, b) = start(cfg.clone()).await;
    let first = chat_json(&c, b, &golden(4)).await;
    let (h, b) = restart(h, b, cfg.clone()).await;
    let second = chat_json(&c, b, &golden(4)).await;
    let (h, b) = restart(h, b, cfg.clone()).await;
    let third = chat_json(&c, b, &golden(4)).await;
    assert_eq!(stats(&c, b).await["start_number"], 3);
    let (t1, t2) = (answer_tokens(&first), answer_tokens(&second));
    assert_eq!(t1[0], t2[0]);
    assert_ne!(t1[1], t2[1]);
    assert!(margin_at(&first, 1) < 0.05 && margin_at(&second, 1) < 0.05);
    assert!(margin_at(&first, 0) >= 1.0);
    // The reference's runner-up at the tie is the other start's token.
    assert_eq!(
        first["choices"][0]["logprobs"]["content"][1]["top_logprobs"][1]["token"],
        json!(t2[1])
    );
    assert_eq!(third["choices"][0]["logprobs"], first["choices"][0]["logprobs"]);
    // Set live, as a list or the flag's string.
    assert_eq!(fault_status(&c, b, json!({"near_tie_positions": "0, 2"})).await, 200);
    let live = chat_json(&c, b, &golden(4)).await;
    assert!(margin_at(&live, 0) < 0.05 && margin_at(&live, 2) < 0.05);
    assert_eq!(fault_status(&c, b, json!({"near_tie_positions": []})).await, 200);
    assert_eq!(fault_status(&c, b, json!({"near_tie_positions": "x"})).await, 400);
    h.shutdown().await.unwrap();
}
