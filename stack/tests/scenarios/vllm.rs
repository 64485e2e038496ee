//! The real-engine tier (issue 15): a real vLLM CPU prefill and decode,
//! PD-disaggregated (ExampleConnector), behind the real vllm-router, with
//! the tiny random-weight Llama `scripts/setup-vllm.sh` builds. Needs that
//! set-up (`scripts/test.sh` runs it: ~3 minutes and 3 GB once); without it
//! these scenarios fail and say so — they never pass by skipping.

use std::time::{Duration, Instant};

use crate::harness::{HeldDemo, Stopped, assert_healthy, at, exclusive, must_at, poll, reasons, set_faults, step};

const LIMIT: Duration = Duration::from_secs(400);

/// The ordered co-restart on the real pair, each engine gated on a real
/// generation (a one-token completion sent straight to it: vLLM has no
/// generating GET, and its /health answers without one), the router only
/// after both, then the probes and the suite through vllm-router.
///
/// The same stack then holds two failures pd-sim's author did not write,
/// injected by `pd-faultproxy` between vllm-router and the real decode
/// (issue 30): a long generation aborted mid-stream with an error event,
/// and HTTP 500s from the decode. `verify` must call each `failed`, naming
/// what it saw.
#[test]
fn real_vllm_pair_restarts_in_order_gated_on_real_generation() {
    let _one = exclusive();
    let held = HeldDemo::start(&["--engine", "vllm", "--no-auto-recover", "--decode-proxy", ""], LIMIT);
    let r = held.report.clone();
    assert_healthy(&r);
    let prefill_gen = must_at(&r, "prefill-0", "generating");
    let decode_spawned = must_at(&r, "decode-0", "spawned");
    let decode_gen = must_at(&r, "decode-0", "generating");
    let router_spawned = must_at(&r, "router-0", "spawned");
    assert!(
        prefill_gen <= decode_spawned,
        "decode spawned before prefill generated: {r:#}"
    );
    assert!(
        decode_gen <= router_spawned,
        "router spawned before decode generated: {r:#}"
    );
    // The engines' port opens only when they are ready: refused → 200.
    assert_eq!(at(&r, "decode-0", "http_503"), None, "{:#}", r["timeline"]);
    for unit in ["prefill-0", "decode-0"] {
        let generating = r["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["unit"] == unit && t["phase"] == "generating")
            .unwrap();
        let detail = generating["detail"].as_str().unwrap();
        assert!(
            detail.contains("completion sent to the engine") && detail.contains("1 token"),
            "{unit}'s generation check did not generate: {detail}"
        );
    }
    for s in ["long_generation", "multi_turn", "concurrency"] {
        assert_eq!(step(&r, s)["status"], "pass", "{s}: {:#}", step(&r, s));
    }
    println!(
        "real vLLM pair: prefill generating at {:.1} s, decode at {:.1} s, router at {:.1} s, verdict {} in {:.1} s",
        prefill_gen as f64 / 1000.0,
        decode_gen as f64 / 1000.0,
        must_at(&r, "router-0", "generating") as f64 / 1000.0,
        r["verdict"],
        r["total_ms"].as_f64().unwrap_or(0.0) / 1000.0
    );
    let proxy = r["demo"]["decode_proxy"]
        .as_str()
        .expect("demo.decode_proxy")
        .to_string();

    // Golden output (issue 34) on the real engine: its greedy answer came
    // with logprobs through vllm-router and the KV path, and was recorded
    // as the reference; a verification is held to it (the same tokens, or
    // a near-tie the judge allows); one token altered in flight by the
    // proxy between the router and the decode (fast, HTTP 200) is wrong
    // output, named at its position.
    assert_eq!(r["golden"]["check"]["outcome"], "no_reference", "{:#}", r["golden"]);
    let reference = r["golden"]["reference"]["answer"]["tokens"]
        .as_array()
        .map_or(0, Vec::len);
    assert!(reference > 0, "no reference recorded: {:#}", r["golden"]);
    let out = held.cli_within(&["verify", "demo", "--json"], LIMIT);
    let v = out.json();
    assert_eq!(out.code, 0, "{}", reasons(&v));
    let outcome = v["golden"]["check"]["outcome"].as_str().unwrap_or("");
    assert!(matches!(outcome, "same" | "near_tie"), "{:#}", v["golden"]);
    set_faults(&proxy, r#"{"alter_token_at": 3}"#);
    let out = held.cli_within(&["verify", "demo", "--json"], LIMIT);
    let v = out.json();
    assert_eq!(out.code, 2, "{}", reasons(&v));
    assert_eq!(v["golden"]["check"]["outcome"], "diverged", "{:#}", v["golden"]);
    assert_eq!(v["golden"]["check"]["position"], 3, "{:#}", v["golden"]);
    println!(
        "real vLLM, golden output: {reference}-token reference recorded, verify {outcome}; one token altered in flight: {}",
        reasons(&v).lines().next().unwrap_or("")
    );
    set_faults(&proxy, "{}");

    // An error event 20 tokens into the streamed long generation; the short
    // non-streamed probes pass.
    set_faults(&proxy, r#"{"error_event_after": 20, "match": "stream"}"#);
    let out = held.cli_within(&["verify", "demo", "--json"], LIMIT);
    let v = out.json();
    assert_eq!(out.code, 2, "{v:#}");
    assert_eq!(v["verdict"], "failed", "{}", reasons(&v));
    assert!(
        reasons(&v).contains("long generation: error after")
            && reasons(&v).contains("error event in the stream after 20 tokens"),
        "{}",
        reasons(&v)
    );
    println!(
        "real vLLM, error event mid-stream: verify {} — {}",
        v["verdict"],
        reasons(&v).lines().next().unwrap_or("")
    );

    // The decode answers HTTP 500 to the next two generations.
    set_faults(&proxy, r#"{"http_500": 2}"#);
    let out = held.cli_within(&["verify", "demo", "--json"], LIMIT);
    let v = out.json();
    assert_eq!(out.code, 2, "{v:#}");
    assert_eq!(v["verdict"], "failed", "{}", reasons(&v));
    let text = reasons(&v);
    assert!(
        text.contains("router router-0: counted") || text.contains("http 500"),
        "neither the router's counters nor the client's error named: {text}"
    );
    println!(
        "real vLLM, two HTTP 500s from the decode: verify {} — {}",
        v["verdict"],
        text.lines().next().unwrap_or("")
    );
    set_faults(&proxy, "{}");

    // The path matrix on real vLLM engines (issue 37): the directed probe
    // meets a prefill with no bootstrap port as vLLM's PD proxy does (one
    // token with `do_remote_decode`, then the decode with the prefill's
    // `kv_transfer_params`); both real engines take it.
    let d = held.cli_within(&["diagnose", "demo", "--json"], LIMIT);
    let m = d.json();
    assert_eq!(d.code, 0, "{m:#}");
    assert_eq!(m["localisation"]["kind"], "healthy", "{m:#}");
    assert_eq!(m["matrix"]["cells"], serde_json::json!([["ok"]]), "{m:#}");
    println!("real vLLM, path matrix: 1 path ok in {} ms", m["took_ms"]);

    // Golden output on the real engines (issue 34): each engine reads its
    // own checkpoint copy (`<demo dir>/checkpoints/<unit>`). The decode's
    // replaced on disk under the same path — same argv, same config
    // fingerprint — leaves a prefill and a decode on different weights:
    // the next co-restart is `failed`, naming the output. Both replaced:
    // `failed` again (the reference is the old weights'). Restored: healthy.
    let checkpoints = std::path::Path::new(r["demo"]["dir"].as_str().expect("demo.dir")).join("checkpoints");
    let restart = |expect: i32| {
        let out = held.cli_within(&["restart", "pd-pair", "demo", "--json"], LIMIT);
        let v = out.json();
        assert_eq!(out.code, expect, "{}", reasons(&v));
        v
    };
    replace_weights(&checkpoints.join("decode-0"));
    let mixed = restart(2);
    assert_eq!(mixed["golden"]["check"]["outcome"], "diverged", "{:#}", mixed["golden"]);
    assert!(
        mixed["reasons"][0].as_str().unwrap().starts_with("WRONG OUTPUT"),
        "{}",
        reasons(&mixed)
    );
    replace_weights(&checkpoints.join("prefill-0"));
    let replaced = restart(2);
    assert_eq!(
        replaced["golden"]["check"]["outcome"], "diverged",
        "{:#}",
        replaced["golden"]
    );
    assert_eq!(replaced["fingerprint"], r["fingerprint"], "same argv, same fingerprint");
    let model = pdwarden_stack::vllm::VllmStack::find().expect("the vLLM stack").model;
    for unit in ["prefill-0", "decode-0"] {
        std::fs::copy(
            model.join("model.safetensors"),
            checkpoints.join(unit).join("model.safetensors"),
        )
        .unwrap();
    }
    // Issue 47: the restore restarts the pair while a client keeps sending
    // through the real vllm-router: healthy, and the report says whose
    // requests the window held (the client's counted apart from pdwarden's).
    let client = crate::co_restart::Client::start_for(&held.unit_url("router-0"), pdwarden_stack::vllm::MODEL);
    let restored = restart(0);
    let text = reasons(&restored);
    assert!(
        text.contains("router router-0 during pdwarden's verification: ") && text.contains(" others': clients'"),
        "{text}"
    );
    // Issue 47: production is never quiet. Four more restarts and five
    // verifications while the client keeps sending through vllm-router:
    // every one healthy (its retries and errors while the new router came
    // up are the client's, said and not counted), each report telling the
    // client's requests from pdwarden's.
    let mut verdicts = vec![restored["verdict"].as_str().unwrap_or("").to_string()];
    for i in 0..5 {
        let mut ops = vec![&["verify", "demo", "--json"][..]];
        if i < 4 {
            ops.insert(0, &["restart", "pd-pair", "demo", "--json"][..]);
        }
        for args in ops {
            let out = held.cli_within(args, LIMIT);
            let v = out.json();
            let text = reasons(&v);
            println!(
                "real vLLM under a client, {}: {} — {}",
                args[0],
                v["verdict"],
                text.lines().next().unwrap_or("")
            );
            assert_eq!(out.code, 0, "{text}");
            assert!(text.contains(" others': clients'"), "{text}");
            verdicts.push(v["verdict"].as_str().unwrap_or("").to_string());
        }
    }
    // The client's failures are the pair's downtime: a 1P1D co-restart
    // stops its only prefill and decode, and vllm-router answers 500 and
    // 503 until they are back (measured by hand: 17 × 200, 119 × 500 and
    // 264 × 503 while a restart had the pair down, 200 right after).
    let traffic = client.stop();
    println!(
        "real vLLM, a client through vllm-router during 5 restarts and 5 verifications: {traffic}; verdicts {verdicts:?}"
    );
    let outcome = restored["golden"]["check"]["outcome"].as_str().unwrap_or("");
    assert!(matches!(outcome, "same" | "near_tie"), "{:#}", restored["golden"]);
    println!(
        "real vLLM, weights replaced on disk: decode only → {} ({}); both → {}; restored → {} ({outcome})",
        mixed["verdict"],
        mixed["reasons"][0].as_str().unwrap_or(""),
        replaced["verdict"],
        restored["verdict"]
    );
}

/// Replaces the weights in checkpoint `dir` under the same path: another
/// checkpoint of the same architecture (the first layer's MLP output
/// negated, which moves every later hidden state and the KV of the layers
/// above it), written by the vLLM venv's own `safetensors`.
fn replace_weights(dir: &std::path::Path) {
    let stack = pdwarden_stack::vllm::VllmStack::find().expect("the vLLM stack");
    let out = std::process::Command::new(&stack.python)
        .args([
            "-c",
            "import sys\nfrom safetensors.torch import load_file, save_file\np = sys.argv[1]\nt = load_file(p)\nk = 'model.layers.0.mlp.down_proj.weight'\nt[k] = (-t[k]).contiguous()\nsave_file(t, p, metadata={'format': 'pt'})\n",
        ])
        .arg(dir.join("model.safetensors"))
        .output()
        .expect("the vLLM venv's python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// ms on CLOCK_MONOTONIC, the clock the orchestrator's triggers record on.
fn mono_ms() -> f64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("monotonic clock");
    ts.tv_sec() as f64 * 1000.0 + ts.tv_nsec() as f64 / 1e6
}

/// The child of `parent` whose name starts with `name` (`/proc/*/stat`).
fn child_named(parent: u32, name: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (comm, rest) = stat.split_once('(')?.1.rsplit_once(')')?;
        let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
        (ppid == parent && comm.starts_with(name)).then_some(pid)
    })
}

/// A real shallow-health wedge: the decode's engine core is stopped
/// (SIGSTOP) while its API server keeps answering /health 200 and
/// /metrics. The watch's probe through vllm-router times out with the
/// decode computing nothing, which confirms the wedge; the automatic
/// co-restart replaces the decode and the pair is healthy again. pd-sim's
/// counterpart (every generation on the decode hangs, health 200:
/// `wedges::generation_hang_behind_health_200_is_confirmed_and_recovered`)
/// runs first in the same test and must get the same conclusion.
///
/// Issue 31: with the watch at the README's defaults, the core is frozen at
/// once after the co-restart, and then the whole decode process at once
/// after the recovery; each automatic co-restart must begin within 30 s of
/// its freeze (the watch was blind for minutes right after a restart).
#[test]
fn a_real_engine_core_stopped_under_health_200_is_confirmed_and_recovered() {
    let _one = exclusive();
    let sim_kind = crate::wedges::case_outcome("generation_hangs_health_200");
    // The README's default watch (issue 31: blind for minutes right after
    // a restart), and the engine core frozen at once after the co-restart.
    let demo = HeldDemo::start(&["--engine", "vllm", "--watch-defaults"], LIMIT);
    assert_healthy(&demo.report);
    let api = demo.unit_pid("decode-0");
    let core = child_named(api, "VLLM::EngineCor").unwrap_or_else(|| panic!("no engine core under pid {api}"));
    let decode_url = demo.unit_url("decode-0");
    let frozen_at = mono_ms();
    let stopped = Stopped::new(core);
    // What the engine itself says meanwhile: health 200.
    let health = tokio::runtime::Runtime::new().unwrap().block_on(async {
        reqwest::Client::new()
            .get(format!("{decode_url}/health"))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    assert_eq!(health.ok(), Some(200), "the stopped engine core's /health");
    let (recovered, auto) = demo.automatic_recovery(Duration::from_secs(300));
    let rec = &recovered["last_recovery"];
    assert!(rec["verdict"].as_str().unwrap().starts_with("healthy"), "{recovered:#}");
    assert_eq!(auto["trigger"]["automatic"], true, "{auto:#}");
    // Idle, the watch's probe finds the engine silent behind health 200
    // (`silent_generation`); with a request in flight when the core stops
    // (a probe, or the suite's), the engine's gauges stay at "1 running"
    // while its token counters stop: a `stall` (CI, 2026-12-02). Both name
    // generation stopped with health 200; never a dead or refused decode.
    let wedge = &auto["trigger"]["wedge"];
    match wedge["kind"].as_str() {
        Some("silent_generation") => assert!(
            wedge["ruled_out"]
                .to_string()
                .contains("health 200 does not prove generation"),
            "{wedge:#}"
        ),
        Some("stall") => assert!(
            auto["trigger"]["reasons"].to_string().contains("health answers 200"),
            "{:#}",
            auto["trigger"]
        ),
        other => panic!("the stopped engine core concluded {other:?}: {:#}", auto["trigger"]),
    }
    assert_ne!(demo.unit_pid("decode-0"), api, "the decode was replaced");
    // Issue 35: before the kill, py-spy's stacks of the stopped engine
    // core (`--nonblocking`: py-spy's default mode cannot suspend a
    // stopped process) naming vLLM's engine-core loop, within 5 s.
    let e = demo.evidence(auto["operation_id"].as_str().unwrap_or_default());
    let took_ms = e["took_ms"].as_u64().expect("took_ms");
    assert!(took_ms <= 5_000, "the capture took {took_ms} ms: {e:#}");
    let decode = e["units"]
        .as_array()
        .and_then(|u| u.iter().find(|u| u["unit"] == "decode-0"))
        .unwrap_or_else(|| panic!("no decode-0 in the capture: {e:#}"));
    let engine_core = decode["processes"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["pid"] == core))
        .unwrap_or_else(|| panic!("the engine core {core} is not in the capture: {decode:#}"));
    assert_eq!(engine_core["method"], "py-spy", "{engine_core:#}");
    let frames = engine_core["threads"].to_string();
    assert!(
        frames.contains("run_busy_loop") || frames.contains("run_engine_core"),
        "py-spy's stacks of the engine core name its loop: {engine_core:#}"
    );
    let reading = e["readings"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["unit"] == "decode-0"))
        .map(|r| r["line"].as_str().unwrap_or("").to_string())
        .unwrap_or_default();
    assert!(reading.contains("stopped"), "{reading}");
    println!("real vLLM engine core stopped → evidence captured in {took_ms} ms before the kill: {reading}");
    // pd-sim's hang waits in both PD queues as well: it may be named a KV
    // transfer wedge; a wedge confirmed and recovered either way.
    assert!(
        matches!(sim_kind.as_deref(), Some("silent_generation" | "kv_transfer")),
        "pd-sim's counterpart concluded {sim_kind:?}, the real engine silent_generation"
    );
    let core_to_recovery = auto["trigger"]["detected_mono_ms"].as_f64().unwrap_or(f64::NAN) - frozen_at;
    assert!(
        core_to_recovery <= 30_000.0,
        "engine core frozen at once after a healthy co-restart: the automatic co-restart began {core_to_recovery:.0} ms after (> 30 s): {:#}",
        auto["trigger"]
    );
    println!(
        "real vLLM engine core stopped at once after a co-restart, README watch defaults → {} confirmed in {:.1} s, automatic co-restart {:.1} s after the freeze, recovered and verified in {:.1} s (pd-sim's counterpart: {})",
        wedge["kind"],
        wedge["detection_ms"].as_f64().unwrap_or(f64::NAN) / 1000.0,
        core_to_recovery / 1000.0,
        stopped.since.elapsed().as_secs_f64(),
        sim_kind.unwrap_or_default()
    );
    drop(stopped);

    // The whole decode process frozen at once after that (healthy)
    // recovery: neither /metrics nor health answer.
    let first = recovered["last_recovery"]["operation_id"].clone();
    let api = demo.unit_pid("decode-0");
    let frozen_at = mono_ms();
    let whole = Stopped::new(api);
    let (again, auto) = demo.automatic_recovery_after(Some(&first), Duration::from_secs(300));
    assert_eq!(auto["trigger"]["automatic"], true, "{auto:#}");
    let process_to_recovery = auto["trigger"]["detected_mono_ms"].as_f64().unwrap_or(f64::NAN) - frozen_at;
    assert!(
        process_to_recovery <= 30_000.0,
        "decode process frozen at once after a healthy co-restart: the automatic co-restart began {process_to_recovery:.0} ms after (> 30 s): {:#}",
        auto["trigger"]
    );
    assert!(
        again["last_recovery"]["verdict"]
            .as_str()
            .unwrap_or("")
            .starts_with("healthy"),
        "{again:#}"
    );
    println!(
        "real vLLM decode process stopped at once after a co-restart, README watch defaults → {} confirmed in {:.1} s, automatic co-restart {:.1} s after the freeze",
        auto["trigger"]["wedge"]["kind"],
        auto["trigger"]["wedge"]["detection_ms"].as_f64().unwrap_or(f64::NAN) / 1000.0,
        process_to_recovery / 1000.0
    );
    drop(whole);
}

/// Real user traffic through vllm-router is never probed or flagged (vLLM's
/// token counters, which rise per engine step, prove liveness); then the
/// whole decode is stopped (SIGSTOP of its API server, the unit's own
/// process: the port accepts, nothing answers, the PID lives) and the watch
/// recovers it as an `unresponsive` wedge instead of showing it `down` for
/// ever. The same fault on pd-sim runs first in the same test and must get
/// the same conclusion (`watch::a_stopped_decode_is_recovered_not_left_down`).
#[test]
fn a_real_decode_answering_nothing_is_recovered_like_pd_sims_and_real_traffic_is_never_flagged() {
    let _one = exclusive();
    let sim = {
        let demo = HeldDemo::start(&[], Duration::from_secs(180));
        assert_healthy(&demo.report);
        demo.stop_unit_and_await_recovery("decode-0", Duration::from_secs(150))
    };
    crate::watch::assert_stopped_decode_recovered(&sim);

    let demo = HeldDemo::start(&["--engine", "vllm"], LIMIT);
    assert_healthy(&demo.report);
    poll("watch healthy after the restart", Duration::from_secs(60), || {
        (demo.watch()["state"] == "healthy").then_some(())
    });
    let (requests, probes, states, traffic_s) = real_traffic(&demo, Duration::from_secs(40));
    assert_eq!(
        probes.0, probes.1,
        "the watch probed a pair whose real traffic proved it live"
    );
    assert!(
        states.iter().all(|s| s == "healthy"),
        "flagged under real traffic: {states:?}"
    );
    let real = demo.stop_unit_and_await_recovery("decode-0", Duration::from_secs(300));
    crate::watch::assert_stopped_decode_recovered(&real);
    assert_eq!(real.wedge_kind, sim.wedge_kind, "{real:#?}\n{sim:#?}");
    println!(
        "real traffic: {requests} requests in {traffic_s:.1} s through vllm-router, probes sent {} → {}, watch healthy at all {} readings",
        probes.0,
        probes.1,
        states.len()
    );
    println!(
        "stopped real decode → {} confirmed in {:.1} s, recovered and verified in {:.1} s (pd-sim: {} in {:.1} s, recovered in {:.1} s)",
        real.wedge_kind,
        real.detection_ms.unwrap_or(0) as f64 / 1000.0,
        real.recovered_s,
        sim.wedge_kind,
        sim.detection_ms.unwrap_or(0) as f64 / 1000.0,
        sim.recovered_s
    );
}

/// Sends chat completions through the router one after another for
/// `length` (at most 400), reading the watch every few: returns the
/// requests sent, the watch's `probes_sent` after the first three (the
/// watch has seen traffic by then) and at the end, its states, and the
/// seconds the traffic took. Every request must succeed.
fn real_traffic(demo: &HeldDemo, length: Duration) -> (usize, (u64, u64), Vec<String>, f64) {
    let router = demo.unit_url("router-0");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let started = Instant::now();
    let (mut first, mut states, mut sent) = (None, Vec::new(), 0);
    while sent < 400 && started.elapsed() < length {
        let body = serde_json::json!({
            "model": pdwarden_stack::vllm::MODEL,
            "messages": [{"role": "user", "content": format!("real user request number {sent}")}],
            "max_tokens": 16,
        });
        let r = rt.block_on(async {
            http.post(format!("{router}/v1/chat/completions"))
                .json(&body)
                .timeout(Duration::from_secs(60))
                .send()
                .await
        });
        assert!(
            r.as_ref().is_ok_and(|r| r.status().is_success()),
            "real request {sent} failed: {r:?}"
        );
        sent += 1;
        if sent == 3 {
            first = demo.watch()["probes_sent"].as_u64();
        }
        if sent % 5 == 0 {
            states.push(demo.watch()["state"].as_str().unwrap_or("").to_string());
        }
    }
    let last = demo.watch()["probes_sent"].as_u64();
    let probes = (
        first.expect("probes_sent after 3 requests"),
        last.expect("probes_sent at the end"),
    );
    (sent, probes, states, started.elapsed().as_secs_f64())
}

/// A real knob with a real effect: `--max-num-seqs 1` on the real decode
/// (one sequence at a time instead of a batch), measured by the gate under
/// its concurrency-4 cells against the pair's own baseline, judged worse,
/// rolled back, and both the change and the rollback checked live in the
/// real process's argv (`/proc`). pd-sim's counterpart (`--max-running 1`
/// on its decode, `gate::batching_cap_on_the_decode_is_rejected_and_rolled_back`)
/// runs first in the same test and must get the same verdict.
#[test]
fn a_real_knob_is_measured_rejected_and_rolled_back() {
    let _one = exclusive();
    let (sim_code, sim) = crate::gate::batching_cap_on_the_decode();
    crate::gate::assert_batching_cap_rejected(sim_code, &sim, "--max-running");
    let demo = HeldDemo::start(&["--engine", "vllm"], LIMIT);
    assert_healthy(&demo.report);
    let started = Instant::now();
    let out = demo.cli_within(
        &[
            "gate",
            "demo",
            "--set-arg",
            "--max-num-seqs=1",
            "--unit",
            "decode-0",
            "--json",
        ],
        Duration::from_secs(900),
    );
    let v = out.json();
    // A freshly restarted real vLLM decode measures slower than the warmed
    // pair of the first baseline (CI: e2e p50 at concurrency 1 +25 % after
    // the rollback); the knob's own regression (+414 % ttft p90) is shown
    // against both, so the knob is blamed all the same (issue 15).
    crate::gate::assert_batching_cap_rejected(out.code, &v, "max-num-seqs");
    println!(
        "real knob --max-num-seqs 1 on the real decode: gate rejected and rolled back in {:.0} s (pd-sim's --max-running 1: {})",
        started.elapsed().as_secs_f64(),
        sim["verdict"]
    );
    for r in v["reasons"].as_array().unwrap() {
        println!("  {}", r.as_str().unwrap_or(""));
    }
}
