//! Readiness detection against a real HTTP server on loopback: the watch
//! driver with the real `HttpChecker`, the engine changing state as each
//! phase is observed.

use std::sync::atomic::Ordering;
use std::time::Duration;

use pdwarden_agent::checks::{HttpChecker, http_client};
use pdwarden_agent::readiness::{PhaseChange, ReadinessParams, ReadinessWatch, watch};
use pdwarden_proto::v1::{ChatProbe, Phase, ReadinessSpec};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::util::{EVENT_DEADLINE, EngineScript, FakeEngine, free_port, wait_until};

/// Starts a watch on `port`, sending each phase change to the returned channel.
fn start_watch(port: u16, spec: ReadinessSpec) -> mpsc::UnboundedReceiver<PhaseChange> {
    let params = ReadinessParams::from_spec(Some(&spec));
    let checker = HttpChecker::new(
        http_client(),
        &format!("http://127.0.0.1:{port}"),
        "/health",
        "/health_generate",
        &params,
    );
    let (tx, rx) = mpsc::unbounded_channel();
    let w = ReadinessWatch::new(Instant::now(), params.deadline);
    tokio::spawn(async move {
        watch(&checker, w, params.poll_interval, |c| tx.send(c).is_ok()).await;
    });
    rx
}

async fn next(rx: &mut mpsc::UnboundedReceiver<PhaseChange>) -> PhaseChange {
    tokio::time::timeout(EVENT_DEADLINE, rx.recv())
        .await
        .expect("no phase change in time")
        .expect("watch ended")
}

fn fast(deadline_ms: u64) -> ReadinessSpec {
    ReadinessSpec {
        deadline_ms,
        poll_interval_ms: 20,
        check_timeout_ms: 1_000,
        chat: None,
    }
}

// Property: refused → http_503 → healthy → generating are each detected as
// they happen (the engine moves on only after the previous phase was seen),
// a failed generation check keeps the watch polling, and the watch ends at
// generating.
#[tokio::test]
async fn phases_are_detected_as_they_happen() {
    let port = free_port().await;
    let mut rx = start_watch(port, fast(30_000));

    let e = next(&mut rx).await;
    assert_eq!(e.phase, Phase::Refused);
    assert_eq!(e.detail, "connection refused");

    let script = EngineScript::new(503, 503, 0);
    let _engine = FakeEngine::serve(port, script.clone()).await;
    let e = next(&mut rx).await;
    assert_eq!((e.phase, e.http_status), (Phase::Http503, 503));

    script.health_status.store(200, Ordering::SeqCst);
    let e = next(&mut rx).await;
    assert_eq!((e.phase, e.http_status), (Phase::Healthy, 200));

    // The generation check fails (503) a few times without an event …
    wait_until("three failed generation checks", || {
        script.generate_hits.load(Ordering::SeqCst) >= 3
    })
    .await;
    assert!(rx.try_recv().is_err(), "a failed generation check is not a phase");
    // … then passes.
    script.generate_status.store(200, Ordering::SeqCst);
    let e = next(&mut rx).await;
    assert_eq!(e.phase, Phase::Generating);
    assert!(e.detail.contains("GET /health_generate 200"), "{}", e.detail);
    assert!(e.check_latency.is_some());
    // The watch is over: the channel closes with no further event.
    let end = tokio::time::timeout(EVENT_DEADLINE, rx.recv()).await.unwrap();
    assert_eq!(end, None);
}

// Property: with a chat spec the generation check is a probe-tagged chat
// completion that must return ≥1 token; an empty completion is not readiness.
#[tokio::test]
async fn chat_generation_check_needs_tokens_and_is_tagged() {
    let script = EngineScript::new(200, 503, 0);
    let engine = FakeEngine::serve(0, script.clone()).await;
    let mut spec = fast(30_000);
    spec.chat = Some(ChatProbe {
        model: "m".into(),
        prompt: "Say ok.".into(),
        max_tokens: 4,
    });
    let mut rx = start_watch(engine.addr.port(), spec);
    assert_eq!(next(&mut rx).await.phase, Phase::Healthy);
    wait_until("an empty chat completion", || !script.chats.lock().unwrap().is_empty()).await;
    script.chat_tokens.store(3, Ordering::SeqCst);
    let e = next(&mut rx).await;
    assert_eq!(e.phase, Phase::Generating);
    assert!(e.detail.contains("3 tokens"), "{}", e.detail);
    assert_eq!(
        script.generate_hits.load(Ordering::SeqCst),
        0,
        "no GET check with a chat spec"
    );
    let chats = script.chats.lock().unwrap();
    for (request_id, probe, body) in chats.iter() {
        assert!(request_id.starts_with("pdwarden-probe-"), "{request_id}");
        assert_eq!(probe, "1");
        assert_eq!(body["messages"][0]["content"], "Say ok.");
        assert_eq!(body["messages"][0]["role"], "user");
        assert_eq!(body["max_tokens"], 4);
        assert_eq!(body["stream"], false);
        assert_eq!(body["temperature"], 0);
        assert_eq!(body["model"], "m");
    }
}

// Property: a hung /health is http_503 ("timed out"), and a unit whose health
// is 200 but never generates ends not_ready at the deadline with a summary.
#[tokio::test]
async fn hung_health_and_never_generating() {
    let script = EngineScript::new(200, 503, 0);
    script.health_delay_ms.store(5_000, Ordering::SeqCst);
    let engine = FakeEngine::serve(0, script.clone()).await;
    let mut spec = fast(1_500);
    spec.check_timeout_ms = 200; // health timeout = min(check timeout, 2 s)
    let t0 = Instant::now();
    let mut rx = start_watch(engine.addr.port(), spec);
    let e = next(&mut rx).await;
    assert_eq!(e.phase, Phase::Http503);
    assert_eq!(e.detail, "health timed out after 200 ms");
    script.health_delay_ms.store(0, Ordering::SeqCst);
    assert_eq!(next(&mut rx).await.phase, Phase::Healthy);
    let e = next(&mut rx).await;
    assert_eq!(e.phase, Phase::NotReady);
    assert!(e.since_command >= Duration::from_millis(1_500));
    assert!(t0.elapsed() < Duration::from_millis(1_500) + EVENT_DEADLINE);
    assert!(e.detail.contains("health 200 but generation check"), "{}", e.detail);
    assert!(e.detail.contains("GET /health_generate answered 503"), "{}", e.detail);
}
