//! Readiness detection against a real HTTP server on loopback: the watch
//! driver with the real `HttpChecker`, the engine changing state as each
//! phase is observed, and every check reported as an attempt.

use std::sync::atomic::Ordering;
use std::time::Duration;

use pdwarden_agent::checks::{HttpChecker, http_client};
use pdwarden_agent::config::GenerationCheckSpec;
use pdwarden_agent::readiness::{Attempt, PhaseChange, ReadinessParams, ReadinessWatch, WatchEvent, watch};
use pdwarden_proto::v1::{AttemptOutcome, ChatProbe, CheckKind, Phase, ReadinessSpec};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::util::{EVENT_DEADLINE, EngineScript, FakeEngine, free_port, wait_until};

/// A running watch: its events, and the attempts read past so far.
struct Watching {
    rx: mpsc::UnboundedReceiver<WatchEvent>,
    attempts: Vec<Attempt>,
}

impl Watching {
    /// The next phase change, recording the attempts before it.
    async fn next(&mut self) -> PhaseChange {
        loop {
            let event = tokio::time::timeout(EVENT_DEADLINE, self.rx.recv())
                .await
                .expect("no phase change in time")
                .expect("watch ended");
            match event {
                WatchEvent::Phase(c) => return c,
                WatchEvent::Attempt(a) => self.attempts.push(a),
            }
        }
    }

    /// Records the events already sent; false if a phase change was among them.
    fn drain_attempts(&mut self) -> bool {
        while let Ok(event) = self.rx.try_recv() {
            match event {
                WatchEvent::Attempt(a) => self.attempts.push(a),
                WatchEvent::Phase(_) => return false,
            }
        }
        true
    }

    fn generation_attempts(&self) -> Vec<&Attempt> {
        self.attempts
            .iter()
            .filter(|a| a.check == CheckKind::Generation)
            .collect()
    }
}

/// Starts a watch on `port`, sending each event to the returned channel.
fn start_watch(port: u16, spec: ReadinessSpec) -> Watching {
    start_watch_with(port, spec, &GenerationCheckSpec::Get("/health_generate".into()))
}

/// As [`start_watch`], with the unit's generation check.
fn start_watch_with(port: u16, spec: ReadinessSpec, generation: &GenerationCheckSpec) -> Watching {
    let params = ReadinessParams::from_spec(Some(&spec));
    let checker = HttpChecker::new(
        http_client(),
        &format!("http://127.0.0.1:{port}"),
        "/health",
        generation,
        &params,
    );
    let (tx, rx) = mpsc::unbounded_channel();
    let w = ReadinessWatch::new(Instant::now(), params.deadline);
    tokio::spawn(async move {
        watch(&checker, w, params.poll_interval, |e| tx.send(e).is_ok()).await;
    });
    Watching {
        rx,
        attempts: Vec::new(),
    }
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
// they happen (the engine moves on only after the previous phase was seen);
// a failed generation check keeps the watch polling and is reported as an
// attempt with its HTTP status, numbered, never as a phase; the passing check
// is the last attempt before generating, and the watch ends there.
#[tokio::test]
async fn phases_are_detected_as_they_happen() {
    let port = free_port().await;
    let mut w = start_watch(port, fast(30_000));

    let e = w.next().await;
    assert_eq!(e.phase, Phase::Refused);
    assert_eq!(e.detail, "connection refused");

    let script = EngineScript::new(503, 503, 0);
    let _engine = FakeEngine::serve(port, script.clone()).await;
    let e = w.next().await;
    assert_eq!((e.phase, e.http_status), (Phase::Http503, 503));
    let refused = w.attempts.last().expect("the refused run, reported when 503 came");
    assert_eq!(
        (refused.check, refused.outcome, refused.detail.as_str()),
        (CheckKind::Health, AttemptOutcome::Refused, "connection refused")
    );
    assert!(refused.count >= 1);

    script.health_status.store(200, Ordering::SeqCst);
    let e = w.next().await;
    assert_eq!((e.phase, e.http_status), (Phase::Healthy, 200));

    // The generation check fails (503) a few times without a phase event …
    wait_until("three failed generation checks", || {
        script.generate_hits.load(Ordering::SeqCst) >= 3
    })
    .await;
    assert!(w.drain_attempts(), "a failed generation check is not a phase");
    // … then passes.
    script.generate_status.store(200, Ordering::SeqCst);
    let e = w.next().await;
    assert_eq!(e.phase, Phase::Generating);
    assert!(e.detail.contains("GET /health_generate 200"), "{}", e.detail);
    assert!(e.check_latency.is_some());
    let generation = w.generation_attempts();
    let (passed, failures) = generation.split_last().unwrap();
    assert!(failures.len() >= 3, "{failures:?}");
    for (i, a) in failures.iter().enumerate() {
        assert_eq!(
            (a.outcome, a.http_status, a.seq),
            (AttemptOutcome::Error, 503, i as u32 + 1)
        );
        assert_eq!(a.detail, "GET /health_generate answered 503");
        assert_eq!(a.request_id, "", "GET checks report no request id");
    }
    assert_eq!(
        (passed.outcome, passed.http_status, passed.seq),
        (AttemptOutcome::Ok, 200, failures.len() as u32 + 1)
    );
    assert_eq!(
        w.attempts.last(),
        Some(*passed),
        "the passing check precedes generating"
    );
    // The watch is over: the channel closes with no further event.
    let end = tokio::time::timeout(EVENT_DEADLINE, w.rx.recv()).await.unwrap();
    assert_eq!(end, None);
}

// Property: with a chat spec the generation check is a probe-tagged chat
// completion that must return ≥1 token; an empty completion is not readiness
// but a failed attempt; each attempt carries the request id the engine saw.
#[tokio::test]
async fn chat_generation_check_needs_tokens_and_is_tagged() {
    let script = EngineScript::new(200, 503, 0);
    let engine = FakeEngine::serve(0, script.clone()).await;
    let mut spec = fast(30_000);
    spec.chat = Some(ChatProbe {
        model: "m".into(),
        prompt: "Say ok.".into(),
        max_tokens: 4,
        greedy: false,
    });
    let mut w = start_watch(engine.addr.port(), spec);
    assert_eq!(w.next().await.phase, Phase::Healthy);
    wait_until("an empty chat completion", || !script.chats.lock().unwrap().is_empty()).await;
    script.chat_tokens.store(3, Ordering::SeqCst);
    let e = w.next().await;
    assert_eq!(e.phase, Phase::Generating);
    assert!(e.detail.contains("3 tokens"), "{}", e.detail);
    let generation = w.generation_attempts();
    let (passed, failures) = generation.split_last().unwrap();
    assert!(!failures.is_empty());
    for a in failures {
        assert_eq!((a.outcome, a.http_status, a.tokens), (AttemptOutcome::Error, 200, 0));
        assert!(
            a.detail.starts_with("chat completion failed (no completion tokens"),
            "{}",
            a.detail
        );
    }
    assert_eq!((passed.outcome, passed.tokens), (AttemptOutcome::Ok, 3));
    assert_eq!(
        script.generate_hits.load(Ordering::SeqCst),
        0,
        "no GET check with a chat spec"
    );
    let chats = script.chats.lock().unwrap();
    let seen: Vec<&str> = chats.iter().map(|(id, _, _)| id.as_str()).collect();
    let reported: Vec<&str> = generation.iter().map(|a| a.request_id.as_str()).collect();
    assert_eq!(reported, seen, "one attempt per chat, with its request id");
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

/// Issue 15: an engine with no generating GET (vLLM) is `generating` only
/// once a probe-tagged one-token completion sent straight to it returns a
/// token — never on its `/health` 200, and never by a GET.
#[tokio::test]
async fn completion_check_of_an_engine_without_a_generating_get() {
    let script = EngineScript::new(200, 200, 0);
    let engine = FakeEngine::serve(0, script.clone()).await;
    let mut w = start_watch_with(engine.addr.port(), fast(30_000), &GenerationCheckSpec::Completion);
    assert_eq!(w.next().await.phase, Phase::Healthy);
    wait_until("an empty completion", || !script.chats.lock().unwrap().is_empty()).await;
    assert!(w.drain_attempts(), "healthy, answering, no token: not generating");
    script.chat_tokens.store(1, Ordering::SeqCst);
    let e = w.next().await;
    assert_eq!(e.phase, Phase::Generating);
    assert!(
        e.detail.contains("1 token") && e.detail.contains("completion sent to the engine"),
        "{}",
        e.detail
    );
    let generation = w.generation_attempts();
    let (passed, failures) = generation.split_last().unwrap();
    assert!(!failures.is_empty());
    for a in failures {
        assert_eq!((a.outcome, a.tokens), (AttemptOutcome::Error, 0));
        assert!(a.detail.contains("no completion tokens"), "{}", a.detail);
    }
    assert_eq!((passed.outcome, passed.tokens), (AttemptOutcome::Ok, 1));
    assert_eq!(script.generate_hits.load(Ordering::SeqCst), 0, "never a GET check");
    for (request_id, probe, body) in script.chats.lock().unwrap().iter() {
        assert!(request_id.starts_with("pdwarden-probe-"), "{request_id}");
        assert_eq!(probe, "1");
        assert_eq!(body["model"], "tiny-llama", "the model the engine serves");
        assert_eq!(body["max_tokens"], 1);
        assert_eq!(body["ignore_eos"], true);
    }
}

// Property: a hung /health is http_503 ("timed out") and a timeout run, and a
// unit whose health is 200 but never generates ends not_ready at the deadline
// with a summary, after the attempts that show it.
#[tokio::test]
async fn hung_health_and_never_generating() {
    let script = EngineScript::new(200, 503, 0);
    script.health_delay_ms.store(5_000, Ordering::SeqCst);
    let engine = FakeEngine::serve(0, script.clone()).await;
    let mut spec = fast(1_500);
    spec.check_timeout_ms = 200; // health timeout = min(check timeout, 2 s)
    let t0 = Instant::now();
    let mut w = start_watch(engine.addr.port(), spec);
    let e = w.next().await;
    assert_eq!(e.phase, Phase::Http503);
    assert_eq!(e.detail, "health timed out after 200 ms");
    script.health_delay_ms.store(0, Ordering::SeqCst);
    assert_eq!(w.next().await.phase, Phase::Healthy);
    let hung = w.attempts.last().expect("the timed-out run, reported when 200 came");
    assert_eq!(
        (hung.check, hung.outcome, hung.latency),
        (CheckKind::Health, AttemptOutcome::Timeout, Duration::from_millis(200))
    );
    let e = w.next().await;
    assert_eq!(e.phase, Phase::NotReady);
    assert!(e.since_command >= Duration::from_millis(1_500));
    assert!(t0.elapsed() < Duration::from_millis(1_500) + EVENT_DEADLINE);
    assert!(e.detail.contains("health 200 but generation check"), "{}", e.detail);
    assert!(e.detail.contains("GET /health_generate answered 503"), "{}", e.detail);
    let failed = w.generation_attempts();
    assert!(!failed.is_empty());
    assert!(
        failed
            .iter()
            .all(|a| a.http_status == 503 || a.outcome == AttemptOutcome::Timeout),
        "{failed:?}"
    );
}
