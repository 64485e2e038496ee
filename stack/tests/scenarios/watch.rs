//! The continuous watch (issue 5) on a real stack: a pair in service under
//! real traffic is never probed or flagged; then a client abandons a long
//! prompt mid-prefill on a serial prefill that leaks its slot (INCIDENTS
//! row 4), and pdwarden detects the wedge by itself, journals an automatic
//! co-restart with the evidence, and the pair ends healthy.
//!
//! Also: a stalled queue with an idle GPU (fake GPU file) is detected by the
//! stall budget alone; the circuit breaker holds a pair that keeps wedging;
//! the probes' cost over a simulated hour of traffic and of idle time; and an
//! honest burst whose KV transfers overlap is never recovered (issue 31).
//!
//! The demo's `[pair.watch]` settings (the defaults, scaled). The figures
//! (time to detect and to recover, the probes' share of engine time and the
//! sessions they mint) are printed, and asserted only against the issue's
//! targets: run with `--nocapture` to see them (docs/operating.md, wedge watch).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{HeldDemo, StopOutcome, exclusive, poll, sim_fault};

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
            "--engines-serial",
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
    let (recovered, auto) = demo.automatic_recovery(Duration::from_secs(120));
    let rec = &recovered["last_recovery"];
    assert!(rec["verdict"].as_str().unwrap().starts_with("healthy"), "{recovered:#}");
    assert_eq!(auto["kind"], "co_restart");
    assert_eq!(auto["trigger"]["automatic"], true, "{auto:#}");
    let reasons = auto["trigger"]["reasons"].to_string();
    // The leaked request holds the running batch and produces nothing: SGLang's
    // health, which runs through the scheduler, stops answering too.
    assert!(
        reasons.contains("prefill-0: 1 running") && reasons.contains("no progress for"),
        "{reasons}"
    );
    assert_eq!(auto["trigger"]["wedge"]["kind"], "stall", "{:#}", auto["trigger"]);

    // Figures (printed, not asserted).
    let detected = auto["trigger"]["detected_mono_ms"].as_f64().unwrap();
    let concluded = rec["concluded_mono_ms"].as_f64().unwrap();
    let restart_ms = auto["report"]["total_ms"].as_u64().unwrap_or(0);
    let share = |s: &Value| {
        let total = s["busy_ms_total"].as_f64().unwrap_or(0.0);
        let probe = s["busy_ms_probe"].as_f64().unwrap_or(0.0);
        (probe, total, if total > 0.0 { 100.0 * probe / total } else { 0.0 })
    };
    println!("watch figures (pd-sim time scale 0.05, the demo's scaled [pair.watch]):");
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

/// Issue 15: a decode that answers nothing at all while its PID lives
/// (SIGSTOP: what a real single-process vLLM engine showed) is no longer
/// shown `down` for ever. The watch probes the pair; the probe through the
/// router fails after the decode went silent; that is a wedge
/// (`unresponsive`), and the automatic co-restart replaces the stopped
/// process (the agent's SIGKILL after its grace reaches a stopped one too).
#[test]
fn a_stopped_decode_is_recovered_not_left_down() {
    let _one = exclusive();
    let demo = HeldDemo::start(&[], Duration::from_secs(180));
    assert!(
        demo.report["verdict"].as_str().unwrap().starts_with("healthy"),
        "{:#}",
        demo.report
    );
    let o = demo.stop_unit_and_await_recovery("decode-0", Duration::from_secs(150));
    assert_stopped_decode_recovered(&o);
    println!(
        "stopped decode → recovered and verified healthy in {:.1} s (watch at the demo's scaled [pair.watch])",
        o.recovered_s
    );
}

/// What pdwarden must conclude about a decode that answers nothing while
/// its PID lives, on pd-sim and on the real vLLM decode alike.
pub fn assert_stopped_decode_recovered(o: &StopOutcome) {
    assert!(o.verdict.starts_with("healthy"), "{o:#?}");
    assert!(o.automatic, "{o:#?}");
    assert_eq!(o.wedge_kind, "unresponsive", "{o:#?}");
    assert!(
        o.ruled_out.contains("decode-0 answered neither /metrics nor health"),
        "{o:#?}"
    );
    assert!(o.replaced, "the stopped decode was replaced: {o:#?}");
    // Issue 35: the evidence was captured before the kill; a stopped
    // process answers no GET, so those parts ran out at the deadline: the
    // capture is partial, says what is missing, took no longer than its
    // deadline, and the recovery went on all the same (healthy above).
    let e = &o.evidence;
    let deadline = e["deadline_ms"].as_u64().expect("deadline_ms");
    assert!(e["took_ms"].as_u64().expect("took_ms") <= deadline, "{e:#}");
    assert_eq!(e["partial"], true, "{e:#}");
    let decode = e["units"]
        .as_array()
        .and_then(|u| u.iter().find(|u| u["unit"] == "decode-0"))
        .unwrap_or_else(|| panic!("no decode-0 in the capture: {e:#}"));
    assert!(
        decode["missing"].to_string().contains("deadline"),
        "the stopped decode's GETs are named as cut at the deadline: {decode:#}"
    );
    assert!(
        decode["processes"][0]["threads"]
            .as_array()
            .is_some_and(|t| !t.is_empty() && t.iter().all(|t| t["state"] == "T")),
        "every thread of the stopped decode in state T: {:#}",
        decode["processes"][0]
    );
    // pd-sim is one process, all of it stopped; vLLM's API server is
    // stopped while its engine-core child runs on: "N of M threads".
    let reading = e["readings"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["unit"] == "decode-0"))
        .unwrap_or_else(|| panic!("no reading for decode-0: {:#}", e["readings"]));
    assert_eq!(reading["wait"], "stopped", "{reading:#}");
}

/// Replaces the fake GPU file atomically (write, then rename), as the agent asks.
fn write_gpus(path: &std::path::Path, gpus: Value) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, json!({ "gpus": gpus }).to_string()).expect("write the fake GPU file");
    std::fs::rename(&tmp, path).expect("replace the fake GPU file");
}

/// One GPU at `util` % utilisation holding `pid`.
fn gpu(index: u32, pid: u64, util: u32) -> Value {
    json!({
        "index": index, "uuid": format!("GPU-{index}"), "name": "fake H100",
        "memory_used_bytes": 60u64 << 30, "memory_total_bytes": 80u64 << 30,
        "utilization_gpu_pct": util, "processes": [{ "pid": pid, "used_memory_bytes": 60u64 << 30 }],
    })
}

/// Issue 5: a stalled queue with idle GPU is detected. The agent reads a
/// fake GPU file listing both engines at 0 % utilisation; the serial prefill
/// leaks its slot on an abandoned long prompt and a later request queues
/// behind it. The watch confirms the wedge after the stall budget alone
/// (not the budget + the worst prefill it needs without GPU evidence), with
/// the GPU utilisation in its reason, and `status` reports the idle GPU under
/// a queue as a finding. (`--no-auto-recover`: detection only.)
#[test]
fn stalled_queue_with_idle_gpu_is_detected() {
    let _one = exclusive();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gpus = dir.path().join("gpus.json");
    write_gpus(&gpus, json!([]));
    let demo = HeldDemo::start(
        &[
            "--engines-serial",
            "--prefill-sim",
            "--serial --leak-slot-on-disconnect --prefill-tok-per-s 250",
            "--gpu-fake",
            gpus.to_str().unwrap(),
            "--no-auto-recover",
        ],
        Duration::from_secs(180),
    );
    let st = status(&demo);
    let router = unit_url(&st, "router-0");
    let prefill = unit_url(&st, "prefill-0");
    write_gpus(
        &gpus,
        json!([
            gpu(0, demo.unit_pid("prefill-0").into(), 0),
            gpu(1, demo.unit_pid("decode-0").into(), 0)
        ]),
    );
    // The agent maps the GPU processes to the engines.
    poll(
        "the host report maps both GPUs to the engines",
        Duration::from_secs(30),
        || {
            let st = status(&demo);
            let gpus = st["agents"][0]["host_report"]["gpus"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let mapped = |unit: &str| gpus.iter().any(|g| g["processes"][0]["unit"] == unit);
            (mapped("prefill-0") && mapped("decode-0")).then_some(())
        },
    );
    poll("watch healthy", Duration::from_secs(30), || {
        (watch_of(&status(&demo))["state"] == "healthy").then_some(())
    });

    // A 41,818-token prompt (8.4 s of prefill at 250 tok/s simulated, scale
    // 0.05) abandoned after 1 s leaks the serial slot; the next request queues.
    let prompt = "tok ".repeat(41_818);
    let body = json!({"model": "demo-model", "messages": [{"role": "user", "content": prompt}], "max_tokens": 16});
    let admitted = Instant::now();
    let abandoned = rt.block_on(async {
        http.post(format!("{router}/v1/chat/completions"))
            .json(&body)
            .timeout(Duration::from_secs(1))
            .send()
            .await
    });
    assert!(
        abandoned.is_err_and(|e| e.is_timeout()),
        "the long prompt was not abandoned"
    );
    let queued_body =
        json!({"model": "demo-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8});
    let queued_url = format!("{router}/v1/chat/completions");
    let client = http.clone();
    let _queued = rt.spawn(async move {
        let _ = client
            .post(queued_url)
            .json(&queued_body)
            .timeout(Duration::from_secs(120))
            .send()
            .await;
    });
    poll(
        "pd-sim queues the next request behind the leaked slot",
        Duration::from_secs(10),
        || {
            let s = rt.block_on(sim_stats(&http, &prefill));
            (s["leaked_slots"].as_u64() >= Some(1) && s["queued"].as_u64() >= Some(1)).then_some(())
        },
    );

    let (w, findings) = poll(
        "the watch confirms the wedge with the idle GPU",
        Duration::from_secs(60),
        || {
            let st = status(&demo);
            let w = watch_of(&st);
            (w["state"] == "wedged").then(|| (w, st["findings"].clone()))
        },
    );
    let detected_s = admitted.elapsed().as_secs_f64();
    let reasons = w["reasons"].to_string();
    assert!(
        reasons.contains("prefill-0:")
            && reasons.contains("GPU utilisation 0 %")
            && reasons.contains("stall budget 2.00 s with the GPU idle"),
        "{w:#}"
    );
    // Without the GPU evidence it would take the budget + the worst prefill
    // (50,000 tokens at 250 tok/s simulated: 10 s) — 12 s after admission.
    assert!(
        detected_s < 12.0,
        "detected {detected_s:.1} s after admission: {reasons}"
    );
    let finding = poll(
        "status reports the idle GPU under a queue",
        Duration::from_secs(30),
        || {
            let st = status(&demo);
            let f = st["findings"]
                .as_array()?
                .iter()
                .find(|f| f["kind"] == "gpu_idle_with_queue")?
                .clone();
            Some(f)
        },
    );
    assert_eq!(
        finding["unit"], "prefill-0",
        "{finding:#} (first findings seen: {findings:#})"
    );
    assert!(
        finding["message"].as_str().unwrap().contains("0% utilisation"),
        "{finding:#}"
    );
    println!(
        "idle GPU + stalled queue: wedge confirmed {detected_s:.1} s after the long prompt's admission: {reasons}"
    );
}

/// Issue 5: the circuit breaker holds a pair that keeps wedging. Every decode
/// pd-sim answers its first 14 generations (enough for a co-restart's checks
/// and suite) and hangs on every later one, so each automatic recovery brings
/// the wedge back; with
/// `--max-recoveries 2` the third wedge is not recovered: `status` shows the
/// pair held and the readiness endpoint answers 503.
#[test]
fn circuit_breaker_holds_a_pair_that_keeps_wedging() {
    let _one = exclusive();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    // A co-restart's own checks and suite use about a dozen generations.
    let script = format!("--latency-script {}{}", "200,".repeat(14), ["hang"; 30].join(","));
    let demo = HeldDemo::start(
        &["--decode-sim", &script, "--max-recoveries", "2"],
        Duration::from_secs(180),
    );
    let readiness = demo.report["demo"]["readiness"]
        .as_str()
        .expect("demo.readiness")
        .to_string();
    let held = poll("the breaker holds the pair", Duration::from_secs(300), || {
        let w = watch_of(&status(&demo));
        (w["state"] == "held").then_some(w)
    });
    assert!(
        held["held"].as_str().unwrap_or("").contains("2 automatic recoveries"),
        "{held:#}"
    );
    assert_eq!(held["ready"], false);
    assert_eq!(held["recoveries_in_window"], 2, "{held:#}");
    let history = demo.cli(&["history", "demo", "--json"]).json();
    let automatic: Vec<&Value> = history
        .as_array()
        .unwrap()
        .iter()
        .filter(|op| op["trigger"]["automatic"] == true)
        .collect();
    assert_eq!(automatic.len(), 2, "{history:#}");
    let ready = rt.block_on(async {
        let r = http
            .get(format!("{readiness}/ready/pair/demo"))
            .send()
            .await
            .expect("readiness endpoint");
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    });
    assert_eq!(ready.0, 503, "{}", ready.1);
    // Still held a moment later: no third recovery starts.
    let again = poll("still held at the next tick", Duration::from_secs(10), || {
        let w = watch_of(&status(&demo));
        (w["state"] == "held" || w["state"] == "operation_running").then_some(w)
    });
    assert_eq!(again["state"], "held", "{again:#}");
    println!(
        "breaker: held after {} automatic recoveries: {}",
        automatic.len(),
        held["held"]
    );
}

/// Issue 5's probe-cost figures: the watch's probes over one simulated hour
/// of steady real traffic (a request every 10 s simulated) and one of idle
/// time, at time scale 0.01 (an hour is 36 s) with the demo's scaled
/// `[pair.watch]`, on engines with sessions (INCIDENTS row 5: a prompt not
/// sharing its leading 4,096 tokens with a live session mints one), read
/// from each engine's `/sim/stats`. Printed (`--nocapture`); asserted only
/// against the issue's targets: under 0.5 % of engine time, at most one
/// session minted by probes per unit per hour.
#[test]
fn probe_cost_over_a_simulated_hour_of_traffic_and_of_idle() {
    let _one = exclusive();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let scale = 0.01;
    let sessions = "--session-prefix-tokens 4096 --session-idle-timeout-ms 3600000";
    let demo = HeldDemo::start(
        &[
            "--time-scale",
            "0.01",
            "--prefill-sim",
            sessions,
            "--decode-sim",
            sessions,
        ],
        Duration::from_secs(180),
    );
    let st = status(&demo);
    let router = unit_url(&st, "router-0");
    let engines = [
        ("prefill-0", unit_url(&st, "prefill-0")),
        ("decode-0", unit_url(&st, "decode-0")),
    ];
    let stats = || -> Vec<Value> { engines.iter().map(|(_, u)| rt.block_on(sim_stats(&http, u))).collect() };
    poll("watch healthy", Duration::from_secs(30), || {
        (watch_of(&status(&demo))["state"] == "healthy").then_some(())
    });
    // Right after a restart the watch probes at the minimum gap until
    // something proves liveness (issue 31: pairs break most then); that
    // deliberate first probe is not the steady-state cost measured here.
    // (At this scale the minimum gap is 50 ms: 50, 100, 200, 400 ms, then
    // the 600 ms idle interval — five probes.)
    poll(
        "the watch's probes after the restart reached the idle interval",
        Duration::from_secs(30),
        || {
            let w = watch_of(&status(&demo));
            (w["probes_sent"].as_u64() >= Some(5) && w["last_probe"]["result"]["outcome"] == "ok").then_some(())
        },
    );
    let hour = Duration::from_secs_f64(3_600.0 * scale);
    let hour_ms = 3_600_000.0;

    // A simulated hour of steady real traffic.
    let t0 = stats();
    let start = Instant::now();
    let mut sent = 0u32;
    while start.elapsed() < hour {
        let body = json!({
            "model": "demo-model",
            "messages": [{"role": "user", "content": format!("real user {sent} asks a question")}],
            "max_tokens": 16,
        });
        let r = rt.block_on(async {
            http.post(format!("{router}/v1/chat/completions"))
                .json(&body)
                .timeout(Duration::from_secs(10))
                .send()
                .await
        });
        assert!(r.is_ok_and(|r| r.status().is_success()), "real request {sent} failed");
        sent += 1;
        // Pacing, not synchronisation: one request per 10 s simulated.
        let next = start + Duration::from_secs_f64(10.0 * scale) * sent;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let t1 = stats();
    // A simulated hour of idle time: the measurement window, not a wait for an event.
    std::thread::sleep(hour);
    let t2 = stats();

    let d = |a: &Value, b: &Value, k: &str| b[k].as_f64().unwrap_or(0.0) - a[k].as_f64().unwrap_or(0.0);
    println!(
        "probe cost over one simulated hour each (time scale {scale}, demo [pair.watch]: idle probe every 60 s simulated):"
    );
    for (i, (unit, _)) in engines.iter().enumerate() {
        let probes = d(&t0[i], &t1[i], "probe_requests");
        let busy = d(&t0[i], &t1[i], "busy_ms_total");
        let probe_busy = d(&t0[i], &t1[i], "busy_ms_probe");
        let share = if busy > 0.0 { 100.0 * probe_busy / busy } else { 0.0 };
        // Under traffic, sessions can be charged to probes only if a probe ran.
        let minted = d(&t0[i], &t1[i], "sessions_minted");
        let probe_minted = if probes > 0.0 { minted } else { 0.0 };
        println!(
            "  {unit}, steady traffic ({sent} real requests): {probes} probes, probe engine time {probe_busy:.0} of {busy:.0} busy ms ({share:.3} %), sessions minted by probes {probe_minted} (all: {minted})"
        );
        assert!(
            share < 0.5,
            "{unit}: probes took {share:.3} % of busy time under traffic"
        );
        assert!(
            probe_minted <= 1.0,
            "{unit}: probes minted {probe_minted} sessions under traffic"
        );

        let probes = d(&t1[i], &t2[i], "probe_requests");
        let real = d(&t1[i], &t2[i], "requests_total") - probes;
        let probe_busy = d(&t1[i], &t2[i], "busy_ms_probe");
        let share = 100.0 * probe_busy / hour_ms;
        let minted = d(&t1[i], &t2[i], "sessions_minted");
        println!(
            "  {unit}, idle: {probes} probes ({real} other requests), probe engine time {probe_busy:.0} ms = {share:.3} % of the hour, sessions minted by probes {minted}"
        );
        assert_eq!(real, 0.0, "{unit}: traffic during the idle hour");
        assert!(share < 0.5, "{unit}: probes took {share:.3} % of the idle hour");
        assert!(minted <= 1.0, "{unit}: probes minted {minted} sessions in an idle hour");
    }
}

/// Issue 31's honest KV burst, through the real sglang-router: sixteen long
/// requests at once (10,000-token prompts, 4,000-token answers) on a serial
/// prefill at 2,000 tok/s (5 s simulated each) whose KV then takes 7 s
/// simulated to reach the decode (the watch allows 10 s), both engines
/// imitating SGLang 0.5.3 (token counters rise only when a request finishes:
/// the profile's fallback). The transfers overlap, so the prefill's inflight
/// queue and the decode's KV-wait queue stay non-empty for ~80 s simulated —
/// past the demo's stall budget plus longest transfer — while the decode
/// finishes nothing; but a transfer lands every 5 s. With auto-recover on:
/// zero automatic co-restarts, the watch never says wedged, and every
/// request is answered 200 with all its tokens (the rule that read "queues
/// never empty" as one stuck transfer co-restarted the pair mid-burst and
/// lost them all).
#[test]
fn an_honest_burst_of_overlapping_kv_transfers_is_never_recovered() {
    const REQUESTS: usize = 16;
    const MAX_TOKENS: u64 = 4_000;
    // The demo's scaled [pair.watch] (stack/src/plan.rs): stall budget
    // max(8 s × 0.05, 2 s) + max_kv_transfer 10 s × 0.05.
    const KV_WINDOW: Duration = Duration::from_millis(2_500);
    let _one = exclusive();
    let demo = HeldDemo::start(
        &[
            "--engines-serial",
            "--prefill-sim",
            "--serial --sglang-version 0.5.3 --prefill-tok-per-s 2000",
            "--decode-sim",
            "--sglang-version 0.5.3 --tpot-ms 20",
        ],
        Duration::from_secs(180),
    );
    assert!(
        demo.report["verdict"].as_str().unwrap().starts_with("healthy"),
        "{:#}",
        demo.report
    );
    let w = poll("watch healthy after the restart", Duration::from_secs(30), || {
        let w = demo.watch();
        (w["state"] == "healthy").then_some(w)
    });
    assert_eq!(w["auto_recover"], true, "{w:#}");
    let (router, prefill, decode) = (
        demo.unit_url("router-0"),
        demo.unit_url("prefill-0"),
        demo.unit_url("decode-0"),
    );
    // The slow link, once the pair is healthy (the demo's own checks ran without it).
    sim_fault(&decode, r#"{"kv_transfer_ms": 7000}"#);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let prompt = "tok ".repeat(10_000);
    let started = Instant::now();
    let (answers, states, both_held) = rt.block_on(async {
        let burst = tokio::spawn(futures::future::join_all((0..REQUESTS).map(|i| {
            let body = json!({
                "model": "demo-model",
                "messages": [{"role": "user", "content": format!("honest long request {i}: {prompt}")}],
                "max_tokens": MAX_TOKENS,
            });
            let req = http
                .post(format!("{router}/v1/chat/completions"))
                .json(&body)
                .timeout(Duration::from_secs(60));
            async move {
                let r = req.send().await.map_err(|e| e.to_string())?;
                let status = r.status().as_u16();
                let v: Value = r.json().await.map_err(|e| e.to_string())?;
                Ok::<_, String>((status, v["usage"]["completion_tokens"].as_u64()))
            }
        })));
        // Meanwhile: both PD queues every 100 ms (pd-sim's ground truth), the
        // watch's state every 0.5 s.
        let (mut states, mut held_since, mut both_held) = (Vec::new(), None::<Instant>, Duration::ZERO);
        for tick in 1u64.. {
            if burst.is_finished() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            // An engine that does not answer (restarted by a recovery) holds nothing.
            let gauge = async |base: &str, key: &str| -> u64 {
                match http.get(format!("{base}/sim/stats")).send().await {
                    Ok(r) => r.json::<Value>().await.map_or(0, |v| v[key].as_u64().unwrap_or(0)),
                    Err(_) => 0,
                }
            };
            let held = gauge(&prefill, "prefill_inflight").await > 0 && gauge(&decode, "transfer_waiting").await > 0;
            if held {
                let since = *held_since.get_or_insert_with(Instant::now);
                both_held = both_held.max(since.elapsed());
            } else {
                held_since = None;
            }
            if tick % 5 == 0 {
                let w = tokio::task::block_in_place(|| demo.watch());
                states.push(w["state"].as_str().unwrap_or("").to_string());
            }
        }
        (burst.await.expect("the burst"), states, both_held)
    });
    let burst_s = started.elapsed().as_secs_f64();
    let history = demo.cli(&["history", "demo", "--json"]).json();
    let automatic: Vec<&Value> = history
        .as_array()
        .unwrap()
        .iter()
        .filter(|op| op["trigger"]["automatic"] == true)
        .collect();
    println!(
        "honest KV burst: {REQUESTS} requests answered in {burst_s:.1} s; both PD queues held for {:.1} s without a break (the KV rule's window: {:.1} s); watch states {states:?}",
        both_held.as_secs_f64(),
        KV_WINDOW.as_secs_f64()
    );
    assert!(
        both_held > KV_WINDOW,
        "the burst did not hold both queues past the rule's window ({both_held:?}): not the finding's shape"
    );
    assert!(automatic.is_empty(), "an honest burst was recovered: {automatic:#?}");
    assert!(!states.iter().any(|s| s == "wedged" || s == "recovering"), "{states:?}");
    for (i, a) in answers.iter().enumerate() {
        assert_eq!(a, &Ok((200, Some(MAX_TOKENS))), "request {i}: {answers:?}");
    }
    assert_eq!(demo.watch()["last_recovery"], Value::Null, "{:#}", demo.watch());
}
