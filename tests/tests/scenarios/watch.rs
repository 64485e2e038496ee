//! The continuous watch (issue 5) on a real stack: a pair in service under
//! real traffic is never probed or flagged; then a client abandons a long
//! prompt mid-prefill on a serial prefill that leaks its slot (INCIDENTS
//! row 4), and pdwarden detects the wedge by itself, journals an automatic
//! co-restart with the evidence, and the pair ends healthy.
//!
//! Default `[pair.watch]` settings (the demo writes none). The figures (time
//! to detect and to recover from the leak, the probes' share of engine time)
//! are printed, not asserted: run with `--nocapture` to see them.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{HeldDemo, exclusive};

/// ms on CLOCK_MONOTONIC, the clock pd-sim and the orchestrator also record on.
fn mono_ms() -> f64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("monotonic clock");
    ts.tv_sec() as f64 * 1000.0 + ts.tv_nsec() as f64 / 1e6
}

fn status(demo: &HeldDemo) -> Value {
    let out = demo.cli(&["status", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    out.json()
}

fn watch_of(status: &Value) -> Value {
    status["watch"]
        .as_array()
        .and_then(|w| w.iter().find(|p| p["pair"] == "demo"))
        .cloned()
        .unwrap_or(Value::Null)
}

fn unit_url(status: &Value, unit: &str) -> String {
    status["agents"][0]["units"]
        .as_array()
        .and_then(|u| u.iter().find(|u| u["name"] == unit))
        .and_then(|u| u["base_url"].as_str())
        .unwrap_or_else(|| panic!("no base_url for {unit}: {status:#}"))
        .to_string()
}

/// Polls `f` every 100 ms until it returns `Some`, or panics at `limit`.
fn poll<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

async fn sim_stats(http: &reqwest::Client, base: &str) -> Value {
    http.get(format!("{base}/sim/stats"))
        .send()
        .await
        .expect("sim stats")
        .json()
        .await
        .expect("sim stats JSON")
}

#[test]
fn wedged_pair_in_service_is_detected_and_recovered_automatically() {
    let _one = exclusive();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    // Seed 001's serial prefill (250 tok/s simulated) that leaks its slot
    // when a client gives up mid-prefill.
    let demo = HeldDemo::start(
        &[
            "--prefill-sim",
            "--serial --leak-slot-on-disconnect --prefill-tok-per-s 250",
        ],
        Duration::from_secs(180),
    );
    assert!(
        demo.report["verdict"].as_str().unwrap().starts_with("healthy"),
        "{:#}",
        demo.report
    );
    let st = status(&demo);
    let (prefill, decode, router) = (
        unit_url(&st, "prefill-0"),
        unit_url(&st, "decode-0"),
        unit_url(&st, "router-0"),
    );
    // The healthy restart is the watch's first proof of liveness.
    poll("watch healthy after the restart", Duration::from_secs(30), || {
        (watch_of(&status(&demo))["state"] == "healthy").then_some(())
    });

    // Real traffic: the engines' token counters advance, so the watch sends
    // no probe and never flags the pair.
    let before: Vec<Value> =
        rt.block_on(async { vec![sim_stats(&http, &prefill).await, sim_stats(&http, &decode).await] });
    let traffic_started = Instant::now();
    let mut states = Vec::new();
    for i in 0..40 {
        let body = json!({
            "model": "demo-model",
            "messages": [{"role": "user", "content": format!("real user request number {i}")}],
            "max_tokens": 16,
        });
        let r = rt.block_on(async {
            http.post(format!("{router}/v1/chat/completions"))
                .json(&body)
                .send()
                .await
        });
        assert!(r.is_ok_and(|r| r.status().is_success()), "real request {i} failed");
        if i % 10 == 9 {
            states.push(watch_of(&status(&demo))["state"].as_str().unwrap_or("").to_string());
        }
    }
    let traffic_s = traffic_started.elapsed().as_secs_f64();
    let after: Vec<Value> =
        rt.block_on(async { vec![sim_stats(&http, &prefill).await, sim_stats(&http, &decode).await] });
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(
            a["probe_requests"], b["probe_requests"],
            "a probe was sent while traffic proved liveness"
        );
    }
    assert!(
        states.iter().all(|s| s == "healthy"),
        "flagged under traffic: {states:?}"
    );

    // The wedge: a 41,818-token prompt whose client gives up after 3 s
    // (60 s simulated), mid-prefill (167 s simulated at 250 tok/s).
    let prompt = "tok ".repeat(41_818);
    let body = json!({"model": "demo-model", "messages": [{"role": "user", "content": prompt}], "max_tokens": 16});
    let abandoned = rt.block_on(async {
        http.post(format!("{router}/v1/chat/completions"))
            .json(&body)
            .timeout(Duration::from_secs(3))
            .send()
            .await
    });
    let onset_mono = mono_ms();
    assert!(
        abandoned.is_err_and(|e| e.is_timeout()),
        "the long prompt was not abandoned"
    );
    let leaked = poll("pd-sim records the leaked slot", Duration::from_secs(10), || {
        let s = rt.block_on(sim_stats(&http, &prefill));
        (s["leaked_slots"].as_u64() >= Some(1)).then_some(s)
    });

    // pdwarden detects it, journals an automatic co-restart with the
    // evidence, and the pair ends healthy.
    let recovered = poll("an automatic recovery concludes", Duration::from_secs(120), || {
        let w = watch_of(&status(&demo));
        (w["last_recovery"]["verdict"].is_string() && w["state"] == "healthy").then_some(w)
    });
    let rec = &recovered["last_recovery"];
    assert!(rec["verdict"].as_str().unwrap().starts_with("healthy"), "{recovered:#}");
    let history = demo.cli(&["history", "demo", "--json"]).json();
    let auto = history
        .as_array()
        .unwrap()
        .iter()
        .find(|op| op["operation_id"] == rec["operation_id"])
        .unwrap_or_else(|| panic!("the automatic operation is not in the history: {history:#}"));
    assert_eq!(auto["kind"], "co_restart");
    assert_eq!(auto["trigger"]["automatic"], true, "{auto:#}");
    let reasons = auto["trigger"]["reasons"].to_string();
    assert!(
        reasons.contains("prefill-0: 1 running") && reasons.contains("health answers 200"),
        "{reasons}"
    );

    // Figures (printed, not asserted).
    let detected = auto["trigger"]["detected_mono_ms"].as_f64().unwrap();
    let concluded = rec["concluded_mono_ms"].as_f64().unwrap();
    let restart_ms = auto["report"]["total_ms"].as_u64().unwrap_or(0);
    let share = |s: &Value| {
        let total = s["busy_ms_total"].as_f64().unwrap_or(0.0);
        let probe = s["busy_ms_probe"].as_f64().unwrap_or(0.0);
        (probe, total, if total > 0.0 { 100.0 * probe / total } else { 0.0 })
    };
    println!("watch figures (pd-sim time scale 0.05, default [pair.watch]):");
    println!(
        "  leak (client gave up) → wedge confirmed: {:.1} s; → recovery verified: {:.1} s (the co-restart itself took {:.1} s)",
        (detected - onset_mono) / 1000.0,
        (concluded - onset_mono) / 1000.0,
        restart_ms as f64 / 1000.0
    );
    println!("  detection evidence: {reasons}");
    for (name, s) in [("prefill", &leaked), ("decode", &after[1])] {
        let (probe, total, pct) = share(s);
        println!(
            "  {name}: probes {} of {} requests, probe engine time {probe:.0} of {total:.0} simulated ms ({pct:.2} %), sessions minted {}",
            s["probe_requests"], s["requests_total"], s["sessions_minted"]
        );
    }
    println!(
        "  under {traffic_s:.1} s of real traffic: 0 probes (counters before/after equal), watch state {states:?}; probes sent by the watch in all: {}",
        recovered["probes_sent"]
    );
}
