//! The walking skeleton: `restart pd-pair` end to end (issue 2, INCIDENTS rows 1–3).

use std::time::Duration;

use serde_json::Value;

use crate::harness::{HeldDemo, at, demo, exclusive, must_at, pdwarden, poll, set_faults, sim_fault, step_names};

const LIMIT: Duration = Duration::from_secs(120);

/// The ordered co-restart: prefill generates before decode is spawned, decode
/// generates before the router is spawned, every unit walks its start-up
/// phases in order, and probes through the real router end healthy.
#[test]
fn ordered_co_restart_is_gated_on_generation() {
    let _one = exclusive();
    let out = demo(&["--json"], LIMIT);
    let r = out.json();
    assert_eq!(
        out.code, 0,
        "verdict {} reasons {:#}\n{}",
        r["verdict"], r["reasons"], out.stderr
    );
    assert!(
        matches!(r["verdict"].as_str(), Some("healthy" | "healthy_after_cold_start")),
        "{r:#}"
    );
    assert_eq!(r["decode_start_policy"], "after-prefill-ready");
    for unit in ["prefill-0", "decode-0"] {
        let phases = ["spawned", "refused", "http_503", "healthy", "generating"].map(|p| must_at(&r, unit, p));
        assert!(
            phases.windows(2).all(|w| w[0] <= w[1]),
            "{unit} phases out of order: {phases:?}"
        );
    }
    assert!(must_at(&r, "prefill-0", "generating") <= must_at(&r, "decode-0", "spawned"));
    assert!(must_at(&r, "decode-0", "generating") <= must_at(&r, "router-0", "spawned"));
    assert!(must_at(&r, "router-0", "spawned") <= must_at(&r, "router-0", "generating"));
    // Probes went through the real router and returned tokens.
    let probes = r["probes"].as_array().unwrap();
    assert!(probes.len() >= 2, "{probes:?}");
    for p in probes {
        assert_eq!(p["target"], "router:router-0");
        assert_eq!(p["outcome"], "ok", "{p}");
        assert!(p["tokens"].as_u64().unwrap() >= 1, "{p}");
    }
    let steps = step_names(&r);
    assert_eq!(
        steps[..4],
        ["restart-prefill", "restart-decode", "restart-router", "probe"]
    );
    assert!(steps[4..].iter().all(|s| s.starts_with("verify-")), "{steps:?}");
    // History has the operation, with the same verdict.
    assert!(r["operation_id"].as_str().is_some_and(|s| !s.is_empty()));
}

/// `overlap`: decode loads while prefill does, but the router still starts
/// only once both generate.
#[test]
fn overlap_policy_overlaps_engine_loads_but_still_gates_the_router() {
    let _one = exclusive();
    let out = demo(&["--json", "--decode-start-policy", "overlap"], LIMIT);
    let r = out.json();
    assert_eq!(out.code, 0, "{r:#}");
    assert_eq!(r["decode_start_policy"], "overlap");
    assert!(must_at(&r, "decode-0", "spawned") < must_at(&r, "prefill-0", "generating"));
    let both = must_at(&r, "prefill-0", "generating").max(must_at(&r, "decode-0", "generating"));
    assert!(both <= must_at(&r, "router-0", "spawned"));
}

/// A decode-only restart is refused with the reason, and nothing restarts:
/// the decode keeps its PID. History and status see the pair's operation.
/// Then (issue 47) the pair restarted and verified five times each while
/// three clients send through its router: all healthy; with a fault the
/// router hides, every verification fails naming it.
#[test]
fn decode_only_restart_is_refused() {
    let _one = exclusive();
    // pd-faultproxy between the router and the decode, no faults yet (the
    // HTTP 500 fraction below).
    let demo = HeldDemo::start(&["--decode-proxy", ""], LIMIT);
    assert!(matches!(
        demo.report["verdict"].as_str(),
        Some("healthy" | "healthy_after_cold_start")
    ));
    let pid_of = |status: &serde_json::Value, unit: &str| {
        status["agents"][0]["units"]
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["name"] == unit)
            .and_then(|u| u["pid"].as_u64())
    };
    let before = demo.cli(&["status", "--json"]).json();
    let decode_pid = pid_of(&before, "decode-0").expect("decode running");

    let out = demo.cli(&["restart", "unit", "decode-0", "--json"]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    let refusal = out.json();
    assert_eq!(refusal["refused"], true);
    let reason = refusal["reason"].as_str().unwrap();
    assert!(reason.contains("decode-only restart"), "{reason}");
    assert!(reason.contains("pdwarden restart pd-pair demo"), "{reason}");

    let after = demo.cli(&["status", "--json"]).json();
    assert_eq!(
        pid_of(&after, "decode-0"),
        Some(decode_pid),
        "the decode was restarted anyway"
    );
    assert_eq!(after["pairs"][0]["last_verdict"], demo.report["verdict"]);

    let history = demo.cli(&["history", "demo", "--json"]).json();
    assert_eq!(history[0]["operation_id"], demo.report["operation_id"]);

    // An unknown pair cannot run: exit 1 with the reason.
    let out = demo.cli(&["restart", "pd-pair", "nope", "--json"]);
    assert_eq!(out.code, 1);
    assert!(out.json()["error"].as_str().unwrap().contains("unknown pair"));

    // Issue 47: production is never quiet. Three clients keep sending
    // through the router while the pair is restarted and verified, five
    // times each: every verdict healthy (each restart used to be `failed`
    // for the retries its new router counted for clients' requests while
    // it came up: said now, and the window is pdwarden's verification).
    let router = demo.unit_url("router-0");
    let clients: Vec<Client> = (0..3).map(|_| Client::start(&router)).collect();
    let mut verdicts = Vec::new();
    for _ in 0..5 {
        for what in [
            &["restart", "pd-pair", "demo", "--json"][..],
            &["verify", "demo", "--json"][..],
        ] {
            let out = demo.cli_within(what, Duration::from_secs(120));
            let r = out.json();
            println!(
                "under traffic, {}: {} — {}",
                what[0],
                r["verdict"],
                crate::harness::reasons(&r)
                    .lines()
                    .take(2)
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
            // The clients' traffic is in the report, told from pdwarden's.
            let text = crate::harness::reasons(&r);
            assert!(
                text.contains("router router-0 during pdwarden's verification: ")
                    && text.contains(" others': clients'"),
                "{text}"
            );
            verdicts.push((what[0], r["verdict"].as_str().unwrap_or("").to_string(), out.code));
        }
    }
    assert!(
        verdicts
            .iter()
            .all(|(_, v, code)| v.starts_with("healthy") && *code == 0),
        "{verdicts:?}"
    );
    // A real fault the router hides, under the same traffic: the decode
    // fails every fifth KV transfer (the router retries it; clients see a
    // slower 200): every verification fails, naming it.
    sim_fault(&demo.unit_url("decode-0"), r#"{"kv_fail_every": 5}"#);
    for _ in 0..3 {
        let out = demo.cli_within(&["verify", "demo", "--json"], Duration::from_secs(120));
        let r = out.json();
        let text = crate::harness::reasons(&r);
        println!(
            "under traffic, a decode failing 1 in 5 transfers: {} — {}",
            r["verdict"],
            text.lines().next().unwrap_or("")
        );
        assert_eq!((out.code, r["verdict"].as_str()), (2, Some("failed")), "{text}");
        assert!(
            text.contains("decode decode-0") && text.contains("KV transfers failed"),
            "the fault not named: {text}"
        );
    }
    sim_fault(&demo.unit_url("decode-0"), r#"{"kv_fail_every": 0}"#);
    // Issue 47 item 4, slow vs stuck: the decode retracts a long stream
    // for 5 s mid-way (SGLang's retract_decode when its KV pool runs out)
    // while it goes on with the clients' requests. Its silence is over the
    // gap budget and then it finishes: slow, not stuck — `over_budget`,
    // never `wedged` (the stream used to be cut at twice the gap budget).
    sim_fault(
        &demo.unit_url("decode-0"),
        r#"{"pause_after_tokens": 40, "pause_ms": 5000}"#,
    );
    let out = demo.cli_within(&["verify", "demo", "--json"], Duration::from_secs(120));
    let r = out.json();
    let text = crate::harness::reasons(&r);
    println!("under traffic, a stream retracted for 5 s: {} — {text}", r["verdict"]);
    assert_eq!(r["verdict"], "over_budget", "{text}");
    assert!(
        text.contains("a pause of") && text.contains("after token 40") && text.contains("slow, not stuck"),
        "{text}"
    );
    sim_fault(&demo.unit_url("decode-0"), r#"{"pause_after_tokens": 0}"#);
    // And HTTP 500 on one generation request in five at the decode, under
    // the same clients: the router retries each into a success (its
    // clients see 200s), and only its own counters show it. Every
    // verification is `failed`, naming the router's retries.
    let proxy = demo.report["demo"]["decode_proxy"].as_str().expect("demo.decode_proxy");
    set_faults(proxy, r#"{"http_500_every": 5}"#);
    for _ in 0..3 {
        let out = demo.cli_within(&["verify", "demo", "--json"], Duration::from_secs(120));
        let r = out.json();
        let text = crate::harness::reasons(&r);
        println!(
            "under traffic, the decode answering 1 in 5 with HTTP 500: {} — {}",
            r["verdict"],
            text.lines().next().unwrap_or("")
        );
        assert_eq!((out.code, r["verdict"].as_str()), (2, Some("failed")), "{text}");
        assert!(
            text.contains("router router-0: counted") && text.contains("from its decode workers"),
            "the fault not named: {text}"
        );
    }
    set_faults(proxy, "{}");
    for c in clients {
        println!("a client meanwhile: {}", c.stop());
    }
}

/// INCIDENTS row 3: a decode that listens and answers `/v1/models` but never
/// generates never reaches `generating`; the router is never started after
/// it, and the verdict is failed or wedged with that evidence, never healthy.
#[test]
fn decode_that_never_generates_is_never_healthy() {
    let _one = exclusive();
    let out = demo(
        &["--json", "--time-scale", "0.01", "--decode-sim", "--ttft-ms 100000000"],
        LIMIT,
    );
    let r = out.json();
    assert_eq!(out.code, 2, "{r:#}");
    assert!(matches!(r["verdict"].as_str(), Some("wedged" | "failed")), "{r:#}");
    must_at(&r, "decode-0", "http_503");
    assert_eq!(at(&r, "decode-0", "generating"), None);
    assert_eq!(
        at(&r, "router-0", "spawned"),
        None,
        "router started behind a decode that never generated"
    );
    let reasons = r["reasons"].to_string();
    assert!(reasons.contains("decode-0"), "{reasons}");
    assert!(r["probes"].as_array().unwrap().is_empty());
}

/// Two restarts of the same pair: one runs, the other is refused at once,
/// naming the running operation; the first still ends with a verdict.
#[test]
fn concurrent_restart_of_the_same_pair_is_refused() {
    let _one = exclusive();
    let demo = HeldDemo::start(&[], LIMIT);
    let mut args = demo.connect_args.clone();
    args.extend(["restart", "pd-pair", "demo", "--json", "--request-id", "change-4711"].map(String::from));
    let first = std::thread::spawn(move || pdwarden(&args.iter().map(String::as_str).collect::<Vec<_>>(), LIMIT));
    // Wait until the first operation is running, then ask again.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let running = loop {
        let status = demo.cli(&["status", "--json"]).json();
        if let Some(op) = status["pairs"][0]["running_operation"].as_str() {
            break op.to_string();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the first restart never showed as running"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let second = demo.cli(&["restart", "pd-pair", "demo", "--json"]);
    assert_eq!(second.code, 1, "{}", second.stdout);
    let error = second.json()["error"].as_str().unwrap().to_string();
    assert!(error.contains("busy") && error.contains(&running), "{error}");
    let first = first.join().unwrap();
    let report = first.json();
    assert_eq!(report["operation_id"], running.as_str());
    assert!(
        matches!(first.code, 0 | 2),
        "the first restart ran to a verdict: {report:#}"
    );
    // A retry of the first request (say, after its reply was lost) starts
    // nothing, on this pair or as a verification, and names what it started.
    for retry in [
        &["restart", "pd-pair", "demo", "--json", "--request-id", "change-4711"][..],
        &["verify", "demo", "--json", "--request-id", "change-4711"][..],
    ] {
        let again = demo.cli(retry);
        assert_eq!(again.code, 1, "{}", again.stdout);
        let error = again.json()["error"].as_str().unwrap().to_string();
        assert!(
            error.contains("already used") && error.contains(&running) && error.contains("ended: "),
            "{error}"
        );
    }
    let history = demo.cli(&["history", "demo", "--json"]).json();
    let ops: Vec<&str> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["operation_id"].as_str().unwrap())
        .collect();
    assert_eq!(ops.iter().filter(|o| **o == running).count(), 1, "{history:#}");
    let first_record = history
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["operation_id"] == running.as_str());
    assert_eq!(first_record.unwrap()["request_id"], "change-4711", "{history:#}");
    let bad = demo.cli(&["restart", "pd-pair", "demo", "--request-id", "has space"]);
    assert_eq!(bad.code, 2, "clap usage error: {}", bad.stderr);
    assert!(bad.stderr.contains("--request-id"), "{}", bad.stderr);
}

/// `/sim/stats`' `requests_total` of each named unit (client generations,
/// probes included, counted on arrival).
fn arrivals(demo: &HeldDemo, units: &[&str]) -> Vec<u64> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    units
        .iter()
        .map(|u| {
            let url = format!("{}/sim/stats", demo.unit_url(u));
            rt.block_on(async {
                let v: serde_json::Value = http
                    .get(&url)
                    .timeout(Duration::from_secs(5))
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("GET {url}: {e}"))
                    .json()
                    .await
                    .unwrap();
                v["requests_total"].as_u64().unwrap_or_else(|| panic!("{url}: {v}"))
            })
        })
        .collect()
}

/// Issue 18, point 2: a 2P2D pair behind the real sglang-router. The
/// co-restart restarts every prefill, each gated on its own generation
/// check, before any decode is spawned; every decode generates before the
/// router is spawned; the verdict is healthy. A verification then reaches
/// each decode (and each prefill) at least once through the router.
#[test]
fn an_xpyd_pair_restarts_every_prefill_then_every_decode_and_reaches_each() {
    let _one = exclusive();
    // No automatic recovery: the repair below is the operator's, and the
    // watch would race it for the pair once decode-1 fails its transfers.
    let demo = HeldDemo::start(
        &["--prefills", "2", "--decodes", "2", "--no-auto-recover"],
        Duration::from_secs(180),
    );
    let r = &demo.report;
    assert!(r["verdict"].as_str().unwrap().starts_with("healthy"), "{r:#}");
    let prefills = ["prefill-0", "prefill-1"];
    let decodes = ["decode-0", "decode-1"];
    for unit in prefills.iter().chain(&decodes) {
        let phases = ["spawned", "healthy", "generating"].map(|p| must_at(r, unit, p));
        assert!(phases.windows(2).all(|w| w[0] <= w[1]), "{unit}: {phases:?}");
    }
    let last_prefill = prefills.iter().map(|u| must_at(r, u, "generating")).max().unwrap();
    let first_decode = decodes.iter().map(|u| must_at(r, u, "spawned")).min().unwrap();
    assert!(
        last_prefill <= first_decode,
        "a decode spawned before every prefill generated"
    );
    let last_decode = decodes.iter().map(|u| must_at(r, u, "generating")).max().unwrap();
    assert!(last_decode <= must_at(r, "router-0", "spawned"));
    let steps = step_names(r);
    // One step per unit, every prefill's before any decode's.
    let at = |name: &str| -> Vec<usize> {
        steps
            .iter()
            .enumerate()
            .filter(|(_, s)| **s == name)
            .map(|(i, _)| i)
            .collect()
    };
    let (p, d) = (at("restart-prefill"), at("restart-decode"));
    assert_eq!((p.len(), d.len()), (2, 2), "{steps:?}");
    assert!(p.iter().max() < d.iter().min(), "{steps:?}");

    let units: Vec<&str> = prefills.iter().chain(&decodes).copied().collect();
    let before = arrivals(&demo, &units);
    let out = demo.cli_within(&["verify", "demo", "--json"], Duration::from_secs(120));
    let v = out.json();
    assert_eq!(out.code, 0, "{v:#}");
    let after = arrivals(&demo, &units);
    for ((u, b), a) in units.iter().zip(&before).zip(&after) {
        assert!(a > b, "{u} received none of the verification's requests ({b} → {a})");
    }
    // Issue 37: every prefill → decode path probed, directed: all answer;
    // then decode-1 fails every KV transfer (pd-sim's `kv_fail_every: 1`)
    // and the matrix names it, and only it.
    let d = demo.cli_within(&["diagnose", "demo", "--json"], Duration::from_secs(120));
    let healthy = d.json();
    assert_eq!(d.code, 0, "{healthy:#}");
    assert_eq!(healthy["localisation"]["kind"], "healthy", "{healthy:#}");
    sim_fault(&demo.unit_url("decode-1"), r#"{"kv_fail_every": 1}"#);
    let d = demo.cli_within(&["diagnose", "demo", "--json"], Duration::from_secs(120));
    let sick = d.json();
    assert_eq!(d.code, 2, "{sick:#}");
    assert_eq!(sick["localisation"]["kind"], "engines", "{sick:#}");
    let named: Vec<&str> = sick["localisation"]["suspects"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["unit"].as_str())
        .collect();
    assert_eq!(named, ["local/decode-1"], "{sick:#}");
    let text = demo.cli_within(&["diagnose", "demo"], Duration::from_secs(120));
    println!("{}", text.stdout);

    // Issue 37, item 3: `restart --only-sick` on pd-sim's SGLang engines.
    // decode-1 is named, but restarting it alone against long-running
    // prefills leaves it a degraded bootstrap (INCIDENTS row 1; pd-sim's
    // `bootstrap.rs`), and restarting the prefills leaves every decode
    // their old identity: what depends on decode-1 is the whole pool, so
    // the repair says so and runs the whole ordered co-restart at once —
    // no round that would wedge decode-1. A client keeps sending through
    // the router meanwhile (counted); the pair is verified after.
    let (repair, restarted, traffic) = only_sick(&demo, &units, "decode-1 failing every transfer (sglang)");
    let human = crate::harness::reasons(&repair);
    assert_eq!(repair["kind"], "repair", "{repair:#}");
    let diagnoses = repair["diagnoses"].as_array().expect("diagnoses");
    assert_eq!(
        diagnoses[0]["localisation"]["suspects"][0]["unit"], "local/decode-1",
        "{repair:#}"
    );
    assert!(human.contains("INCIDENTS row 1"), "{human}");
    let subs = repair["sub_operations"].as_array().unwrap();
    assert_eq!(subs.len(), 1, "no targeted round first: {human}");
    assert_eq!(subs[0]["purpose"], "the whole pair's co-restart", "{human}");
    assert_eq!(restarted, units, "every engine, in the co-restart's order");
    assert!(traffic.sent > 0, "{traffic}");
    let v = demo.cli_within(&["verify", "demo", "--json"], Duration::from_secs(120));
    assert_eq!(v.code, 0, "the pair after the repair: {:#}", v.json());
    println!(
        "2P2D co-restart: {} in {:.1} s; verification requests per unit {:?}",
        r["verdict"],
        r["total_ms"].as_f64().unwrap_or(0.0) / 1000.0,
        units
            .iter()
            .zip(before.iter().zip(&after))
            .map(|(u, (b, a))| format!("{u} +{}", a - b))
            .collect::<Vec<_>>()
    );
}

/// Issue 18, point 2: behind the real router's default policy
/// (`cache_aware`), an idle 2P2D pair's verification goes to one engine of
/// each side. The co-restart sees from the engines' own request counters
/// which it never reached and proves each with a PD request straight to it
/// (and a partner of the other side) before calling the pair healthy.
#[test]
fn an_xpyd_pair_behind_cache_aware_proves_each_engine_the_router_did_not_reach() {
    let _one = exclusive();
    let demo = HeldDemo::start(
        &["--prefills", "2", "--decodes", "2", "--router-policy", "cache_aware"],
        Duration::from_secs(180),
    );
    let r = &demo.report;
    assert!(r["verdict"].as_str().unwrap().starts_with("healthy"), "{r:#}");
    let reasons: Vec<&str> = r["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    // Which engines the router left out of the probe series is its choice;
    // each one it left out is named and proven, and every engine has
    // served requests by the end.
    let proven: Vec<&&str> = reasons
        .iter()
        .filter(|l| l.contains("was not reached through the router"))
        .collect();
    for l in &proven {
        assert!(l.contains("a PD request straight from"), "{l}");
    }
    let counters = r["engine_counters"].as_array().unwrap();
    assert_eq!(counters.len(), 4, "{counters:#?}");
    for c in counters {
        let unit = c["unit"].as_str().unwrap();
        assert!(
            c["requests_total"].as_f64().unwrap_or(0.0) > 0.0,
            "{unit} served nothing: {reasons:#?} {counters:#?}"
        );
    }
    println!("{} {proven:#?}", r["verdict"]);
}

/// Issue 37 and 46, Done when: a 2P3D pd-sim pool with vLLM's
/// NixlConnector semantics (`--kv-transfer nixl`: an engine restarts
/// alone) behind the real sglang-router, a client sending through the
/// router all along. Each case named right, only it restarted (the others'
/// pids unchanged), every path re-proven, the pair verified through the
/// router:
/// - a decode failing every KV transfer;
/// - a decode corrupting the KV it receives: every path answers, but
///   wrong; `--only-sick` holds each path's greedy answer to the reference
///   (it used to conclude `healthy`, nothing restarted, in under a second);
/// - an intermittent decode (every second transfer fails): never anything
///   but that decode is named; named once probed again, or not localised;
/// - a prefill with stale transfer state;
/// - two engines at once (a prefill and a decode): their failing paths
///   share no engine: not localised, the whole ordered co-restart, said.
///
/// One stack for all.
#[test]
fn a_2p3d_nixl_pool_restarts_only_the_sick_engine_and_what_does_not_localise_whole() {
    let _one = exclusive();
    let demo = held_nixl_pool("2", "3", &[]);
    let units = ["prefill-0", "prefill-1", "decode-0", "decode-1", "decode-2"];
    let repair = |what: &str| only_sick(&demo, &units, what);
    let named = |r: &Value| -> Vec<String> {
        r["diagnoses"][0]["localisation"]["suspects"]
            .as_array()
            .map(|s| s.iter().filter_map(|x| x["unit"].as_str().map(String::from)).collect())
            .unwrap_or_default()
    };
    let proven = |r: &Value| {
        let d = r["diagnoses"].as_array().unwrap();
        assert!(d.len() >= 2, "{r:#}");
        assert_eq!(
            d.last().unwrap()["localisation"]["kind"],
            "healthy",
            "every path re-proven: {r:#}"
        );
        assert!(r["verdict"].as_str().unwrap().starts_with("healthy"), "{r:#}");
        let subs = r["sub_operations"].as_array().unwrap();
        assert_eq!(subs.last().unwrap()["kind"], "verify", "{r:#}");
    };

    // A decode failing every KV transfer. A verification fails, and its
    // report carries the path matrix naming the decode.
    sim_fault(&demo.unit_url("decode-1"), r#"{"kv_fail_every": 1}"#);
    let v = demo.cli_within(&["verify", "demo", "--json"], Duration::from_secs(120));
    let vr = v.json();
    assert_eq!(v.code, 2, "{vr:#}");
    assert_eq!(named(&vr), ["local/decode-1"], "{vr:#}");
    assert!(
        crate::harness::reasons(&vr).contains("path matrix: 2 of 6 paths fail; they point to local/decode-1"),
        "{}",
        crate::harness::reasons(&vr)
    );
    let (r, restarted, traffic) = repair("decode-1 failing every transfer");
    assert_eq!(named(&r), ["local/decode-1"], "{r:#}");
    assert_eq!(restarted, ["decode-1"], "only the sick decode");
    proven(&r);
    assert!(traffic.sent > 0, "{traffic}");
    // The plan said what kept serving.
    assert!(
        crate::harness::reasons(&r).contains(
            "round 1: restarts local/decode-1; keeps serving local/prefill-0, local/prefill-1, local/decode-0, local/decode-2"
        ),
        "{}",
        crate::harness::reasons(&r)
    );
    // `history` shows the matrices and what they pointed to.
    let h = demo.cli(&["history", "demo"]).stdout;
    assert!(
        h.contains("local/decode-0  local/decode-1") && h.contains("the failures point to 1 engine(s):"),
        "{h}"
    );

    // A decode corrupting the KV it receives: every path answers, two of
    // them wrong. Held to the reference, the matrix names it.
    sim_fault(&demo.unit_url("decode-2"), r#"{"kv_corruption": true}"#);
    let (r, restarted, traffic) = repair("decode-2 corrupting its KV");
    assert_eq!(named(&r), ["local/decode-2"], "{r:#}");
    assert_eq!(
        r["diagnoses"][0]["matrix"]["cells"],
        serde_json::json!([["ok", "ok", "wrong_output"], ["ok", "ok", "wrong_output"]]),
        "{r:#}"
    );
    assert_eq!(restarted, ["decode-2"], "only the corrupting decode");
    proven(&r);
    println!("clients while decode-2 was repaired: {traffic}");

    // An intermittent decode: every second transfer into decode-0 fails,
    // the client's included. Whatever the probes met, nothing but decode-0
    // is ever named; the pool ends verified.
    sim_fault(&demo.unit_url("decode-0"), r#"{"kv_fail_every": 2}"#);
    let (r, restarted, traffic) = repair("decode-0 failing every second transfer");
    let first = &r["diagnoses"][0]["localisation"];
    match first["kind"].as_str() {
        Some("engines") => {
            assert_eq!(named(&r), ["local/decode-0"], "{r:#}");
            assert_eq!(restarted, ["decode-0"], "{r:#}");
        }
        Some("not_localised") => assert_eq!(restarted, units, "the whole pool, in order: {r:#}"),
        // Every probe happened to answer: verified through the router.
        _ => assert_eq!(first["kind"], "healthy", "{r:#}"),
    }
    println!("intermittent decode-0: {first}; restarted {restarted:?}; clients {traffic}");
    match restarted.as_slice() {
        ["decode-0"] => assert!(r["verdict"].as_str().unwrap().starts_with("healthy"), "{r:#}"),
        // The whole co-restart's verdict under client traffic is not
        // asserted: it is still `failed` for the clients' router retries
        // (issue 47, open).
        [_, ..] => {}
        [] => sim_fault(&demo.unit_url("decode-0"), r#"{"kv_fail_every": 0}"#),
    }

    // A prefill with stale transfer state (smg-project/smg#2382).
    sim_fault(&demo.unit_url("prefill-1"), r#"{"stale_transfer_state": true}"#);
    let (r, restarted, _) = repair("prefill-1 with stale transfer state");
    assert_eq!(named(&r), ["local/prefill-1"], "{r:#}");
    assert_eq!(restarted, ["prefill-1"], "only the sick prefill");
    proven(&r);

    // Every path answers, but slowly (both prefills' first token at ~0.4 s,
    // over the 0.2 s warm budget): `--only-sick` restarts nothing and is
    // not healthy — the verification through the router judges the
    // latency (it used to conclude `healthy`, nothing restarted).
    for p in ["prefill-0", "prefill-1"] {
        sim_fault(&demo.unit_url(p), r#"{"ttft_ms": 8000}"#);
    }
    let (r, restarted, _) = repair("every path slow");
    assert_eq!(r["diagnoses"][0]["localisation"]["kind"], "healthy", "{r:#}");
    assert!(
        r["diagnoses"][0]["matrix"]["cells"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|row| row.as_array().unwrap())
            .any(|c| c == "slow"),
        "{r:#}"
    );
    assert!(restarted.is_empty(), "{restarted:?}");
    assert!(!r["verdict"].as_str().unwrap().starts_with("healthy"), "{r:#}");
    assert_eq!(r["sub_operations"][0]["kind"], "verify", "{r:#}");

    // Every path answers, but wrong (both prefills compute with other
    // weights, which their KV carries to every decode): every path fails
    // its output check: not localised, never `healthy, nothing restarted`.
    for p in ["prefill-0", "prefill-1"] {
        sim_fault(&demo.unit_url(p), r#"{"ttft_ms": 0, "weights": "swapped"}"#);
    }
    let (r, restarted, _) = repair("every path wrong");
    assert_eq!(r["diagnoses"][0]["localisation"]["kind"], "not_localised", "{r:#}");
    assert_eq!(
        r["diagnoses"][0]["matrix"]["cells"],
        serde_json::json!([
            ["wrong_output", "wrong_output", "wrong_output"],
            ["wrong_output", "wrong_output", "wrong_output"]
        ]),
        "{r:#}"
    );
    assert_eq!(restarted, units, "the whole pool, in order");

    // Two at once: a prefill's row and a decode's column share no engine:
    // nothing is singled out.
    sim_fault(&demo.unit_url("prefill-0"), r#"{"stale_transfer_state": true}"#);
    sim_fault(&demo.unit_url("decode-0"), r#"{"kv_fail_every": 1}"#);
    let (r, restarted, _) = repair("prefill-0 and decode-0 at once");
    assert_eq!(r["diagnoses"][0]["localisation"]["kind"], "not_localised", "{r:#}");
    let human = crate::harness::reasons(&r);
    assert!(human.contains("share no engine"), "{human}");
    assert!(human.contains("the whole pair's ordered co-restart instead"), "{human}");
    assert_eq!(restarted, units, "the whole pool, in order");
    let v = demo.cli_within(&["diagnose", "demo", "--json"], Duration::from_secs(120));
    assert_eq!(v.code, 0, "every path after the whole co-restart: {:#}", v.json());
}

/// Issue 46, 1PnD (the most common xPyD shape): one prefill, three
/// decodes behind the real sglang-router, a client sending through it.
/// A dead decode (SIGKILLed) fails its only path: the matrix alone cannot
/// tell it from the prefill (the old smallest cover named the prefill by a
/// tie), but the probe's connection to it was refused while the prefill
/// accepted its own: the decode is named, restarted alone, the pool
/// verified. A decode failing every transfer fails its only path too, with
/// nothing to tell its ends apart: not localised (said), the whole ordered
/// co-restart.
#[test]
fn a_1p3d_pool_names_a_dead_decode_by_proof_and_never_the_prefill_by_a_tie() {
    let _one = exclusive();
    let demo = held_nixl_pool("1", "3", &[]);
    let units = ["prefill-0", "decode-0", "decode-1", "decode-2"];
    let before = pids(&demo, &units);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(before[2] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("SIGKILL decode-1");
    poll("decode-1 reported exited", Duration::from_secs(30), || {
        let status = demo.status();
        let unit = status["agents"][0]["units"]
            .as_array()
            .and_then(|u| u.iter().find(|u| u["name"] == "decode-1").cloned())?;
        (unit["pid"].as_u64().unwrap_or(0) == 0).then_some(())
    });
    let (r, restarted, traffic) = only_sick_from(&demo, &units, before, "1P3D, decode-1 dead");
    let first = &r["diagnoses"][0];
    assert_eq!(first["localisation"]["suspects"][0]["unit"], "local/decode-1", "{r:#}");
    assert_eq!(first["localisation"]["suspects"].as_array().unwrap().len(), 1, "{r:#}");
    assert!(
        first["localisation"]["suspects"][0]["why"]
            .as_str()
            .unwrap()
            .contains("refused"),
        "{r:#}"
    );
    assert_eq!(restarted, ["decode-1"], "only the dead decode");
    assert!(r["verdict"].as_str().unwrap().starts_with("healthy"), "{r:#}");
    assert!(traffic.sent > 0, "{traffic}");

    // Every transfer into decode-2 fails: one failing path, both its ends
    // answering: not localised, never the prefill.
    sim_fault(&demo.unit_url("decode-2"), r#"{"kv_fail_every": 1}"#);
    let v = demo.cli_within(&["diagnose", "demo", "--json"], Duration::from_secs(120));
    let d = v.json();
    assert_eq!(d["localisation"]["kind"], "not_localised", "{d:#}");
    assert!(
        d["localisation"]["why"]
            .as_str()
            .unwrap()
            .contains("local/decode-2 has no other path"),
        "{d:#}"
    );
    assert_eq!(d["matrix"]["tries"][0][2]["sent"], 3, "probed again: {d:#}");
    let (r, restarted, _) = only_sick(&demo, &units, "1P3D, decode-2 failing every transfer");
    assert_eq!(restarted, units, "the whole pool, in order: {r:#}");
    // Its verdict is not asserted: a whole co-restart while clients send is
    // still `failed` for the clients' router retries (issue 47, open).
    let v = demo.cli_within(&["diagnose", "demo", "--json"], Duration::from_secs(120));
    assert_eq!(v.code, 0, "every path after the whole co-restart: {:#}", v.json());
}

/// Issue 37: a 2P2D pool whose link caches each prefill's identity by its
/// address (`--kv-transfer address`, vLLM's MoRIIO connector): a prefill
/// with stale transfer state is named; restarting it leaves every decode
/// holding its old identity, so the repair restarts it and then both
/// decodes — known from the link, not found out from failures — and leaves
/// the other prefill running; every path re-proven, the pair verified.
#[test]
fn an_address_keyed_pool_restarts_a_prefill_with_the_decodes_holding_its_identity() {
    let _one = exclusive();
    let demo = HeldDemo::start(
        &[
            "--prefills",
            "2",
            "--decodes",
            "2",
            "--kv-transfer",
            "address",
            "--no-auto-recover",
        ],
        Duration::from_secs(180),
    );
    assert!(
        demo.report["verdict"].as_str().unwrap().starts_with("healthy"),
        "{:#}",
        demo.report
    );
    let units = ["prefill-0", "prefill-1", "decode-0", "decode-1"];
    sim_fault(&demo.unit_url("prefill-0"), r#"{"stale_transfer_state": true}"#);
    let (r, restarted, traffic) = only_sick(&demo, &units, "prefill-0 with stale transfer state");
    assert_eq!(
        r["diagnoses"][0]["localisation"]["suspects"][0]["unit"], "local/prefill-0",
        "{r:#}"
    );
    assert_eq!(
        restarted,
        ["prefill-0", "decode-0", "decode-1"],
        "prefill-1 keeps running"
    );
    // The link's closure is prefill-0 and both decodes, but a round keeps
    // a decode serving (issue 46, item 4): decode-1 waits for round 2.
    let subs = r["sub_operations"].as_array().unwrap();
    assert_eq!(
        subs[0]["purpose"], "round 1: restart local/prefill-0, local/decode-0",
        "{r:#}"
    );
    assert_eq!(subs[1]["purpose"], "round 2: restart local/decode-1", "{r:#}");
    assert_eq!(
        r["diagnoses"].as_array().unwrap().last().unwrap()["localisation"]["kind"],
        "healthy",
        "{r:#}"
    );
    assert!(r["verdict"].as_str().unwrap().starts_with("healthy"), "{r:#}");
    assert!(traffic.sent > 0, "{traffic}");
}

/// Issue 37, item 3: the watch's automatic recovery of an xPyD pool runs
/// the repair (`recover_only_sick`, through the breaker). A 3P2D NIXL pool;
/// decode-1's KV transfers stall (`kv_stall`), so the requests the router
/// sends it never finish while the others do: the watch confirms a wedge,
/// and the recovery probes every path, names decode-1, restarts it alone,
/// proves every path and verifies the pair.
#[test]
fn the_watch_recovers_an_xpyd_pool_by_restarting_only_the_sick_engine() {
    let _one = exclusive();
    let demo = HeldDemo::start(
        &["--prefills", "3", "--decodes", "2", "--kv-transfer", "nixl"],
        Duration::from_secs(180),
    );
    assert!(
        demo.report["verdict"].as_str().unwrap().starts_with("healthy"),
        "{:#}",
        demo.report
    );
    let units = ["prefill-0", "prefill-1", "prefill-2", "decode-0", "decode-1"];
    let before = pids(&demo, &units);
    sim_fault(&demo.unit_url("decode-1"), r#"{"kv_stall": true}"#);
    let client = Client::start(&demo.unit_url("router-0"));
    let (watch, op) = demo.automatic_recovery(Duration::from_secs(240));
    let traffic = client.stop();
    let restarted = changed(&demo, &units, &before);
    let r = &op["report"];
    println!(
        "automatic recovery ({}): {} in {} ms, restarted {restarted:?}; client meanwhile: {traffic}\ntrigger: {}\n{}",
        op["kind"],
        r["verdict"],
        r["total_ms"],
        op["trigger"],
        crate::harness::reasons(r)
    );
    assert_eq!(op["kind"], "repair", "{op:#}");
    assert_eq!(
        r["diagnoses"][0]["localisation"]["suspects"][0]["unit"], "local/decode-1",
        "{r:#}"
    );
    assert_eq!(restarted, ["decode-1"], "only the sick decode");
    assert!(r["verdict"].as_str().unwrap().starts_with("healthy"), "{r:#}");
    assert_eq!(watch["state"], "healthy", "{watch:#}");
}

/// Issue 37, restart epochs through the real sglang-router: a 2P3D pool
/// declared `nixl` (engines restart alone) whose engines in fact cache each
/// prefill's identity by address (pd-sim `--kv-transfer address`). A prefill
/// with stale transfer state is named and restarted alone; the next matrix
/// shows every decode failing with it, and the epoch (prefill-0 restarted
/// after they had met it) names them as holding its old identity — not the
/// prefill again; they restart, two then one (issue 46: a round keeps a
/// decode serving); every path answers; the pair is verified.
#[test]
fn a_decode_holding_a_restarted_prefills_old_identity_is_named_by_the_epoch() {
    let _one = exclusive();
    let mut demo = held_nixl_pool(
        "2",
        "3",
        &[
            "--prefill-sim",
            "--kv-transfer address",
            "--decode-sim",
            "--kv-transfer address",
        ],
    );
    let units = ["prefill-0", "prefill-1", "decode-0", "decode-1", "decode-2"];
    sim_fault(&demo.unit_url("prefill-0"), r#"{"stale_transfer_state": true}"#);
    let (r, restarted, traffic) = only_sick(&demo, &units, "misdeclared link, prefill-0 stale");
    let named = |i: usize| -> Vec<String> {
        r["diagnoses"][i]["localisation"]["suspects"]
            .as_array()
            .map(|s| s.iter().filter_map(|x| x["unit"].as_str().map(String::from)).collect())
            .unwrap_or_default()
    };
    assert_eq!(named(0), ["local/prefill-0"], "{r:#}");
    // Every decode fails with it and all paired with its previous process:
    // named, and restarted a few at a time (issue 46, item 4: a round never
    // takes every decode out of the router).
    assert_eq!(
        named(1),
        ["local/decode-0", "local/decode-1", "local/decode-2"],
        "{r:#}"
    );
    assert!(
        r["diagnoses"][1]["localisation"]["suspects"][0]["why"]
            .as_str()
            .unwrap()
            .contains("old bootstrap identity"),
        "{r:#}"
    );
    assert_eq!(
        restarted,
        ["prefill-0", "decode-0", "decode-1", "decode-2"],
        "prefill-1 keeps running"
    );
    let purposes: Vec<&str> = r["sub_operations"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["purpose"].as_str())
        .collect();
    assert_eq!(
        purposes,
        [
            "round 1: restart local/prefill-0",
            "round 2: restart local/decode-0, local/decode-1",
            "round 3: restart local/decode-2",
            "verification"
        ],
        "{r:#}"
    );
    assert_eq!(
        r["diagnoses"].as_array().unwrap().last().unwrap()["localisation"]["kind"],
        "healthy",
        "{r:#}"
    );
    assert!(r["verdict"].as_str().unwrap().starts_with("healthy"), "{r:#}");
    assert!(traffic.sent > 0, "{traffic}");

    // Issue 46, item 3: prefill-0 restarted outside pdwarden (as systemd
    // would: its agent adopts the new process), then decode-0 and
    // decode-1: decode-2 alone still holds prefill-0's old identity. Its one
    // failing path cannot be split by the matrix; the agents' process
    // starts can (it started before prefill-0's current process): decode-2
    // is named, not prefill-0, and restarts alone.
    let outside = ["prefill-0", "decode-0", "decode-1"];
    let old: Vec<u32> = outside.iter().map(|u| demo.unit_pid(u)).collect();
    demo.restart_units_outside(&outside);
    // The new agent's facts: each a new process, generating.
    poll(
        "the restarted engines adopted and generating",
        Duration::from_secs(60),
        || {
            let status = demo.status();
            let agent = &status["agents"][0];
            let units = agent["units"].as_array()?.clone();
            let ready = agent["connected"] == true
                && outside.iter().zip(&old).all(|(n, pid)| {
                    units.iter().any(|u| {
                        u["name"] == *n
                            && u["phase"] == "generating"
                            && u["pid"].as_u64().is_some_and(|p| p != u64::from(*pid))
                    })
                });
            ready.then_some(())
        },
    );
    let (r, restarted, traffic) = only_sick(
        &demo,
        &units,
        "prefill-0, decode-0, decode-1 restarted outside pdwarden",
    );
    let first = &r["diagnoses"][0];
    assert_eq!(
        first["localisation"]["suspects"]
            .as_array()
            .map(|s| s.iter().filter_map(|x| x["unit"].as_str()).collect::<Vec<_>>()),
        Some(vec!["local/decode-2"]),
        "{r:#}"
    );
    assert!(
        first["localisation"]["suspects"][0]["why"]
            .as_str()
            .unwrap()
            .contains("before that prefill's current process started"),
        "{r:#}"
    );
    assert_eq!(first["epochs"][0]["prefill"], "local/prefill-0", "{r:#}");
    assert_eq!(restarted, ["decode-2"], "only the stale decode");
    let waited: Vec<&Value> = r["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["name"] == "await_serving")
        .collect();
    println!("the round's wait for the router to serve with what it keeps: {waited:?}");
    assert_eq!(waited.len(), 1, "{r:#}");
    // After three engines restarted behind its back, sglang-router failed
    // some of the clients' requests (503) while pdwarden's all answered
    // (cause not established: see the issue 46 note); the verification
    // says so in its traffic line.
    let verdict = r["verdict"].as_str().unwrap();
    assert!(verdict.starts_with("healthy"), "{r:#}");
    println!("clients meanwhile: {traffic}; verdict {verdict}");
}

/// A held pd-sim pool of `prefills`P`decodes`D declared `nixl` (an engine
/// restarts alone), the watch's recovery off, with `extra` demo flags;
/// healthy after its first co-restart.
fn held_nixl_pool(prefills: &str, decodes: &str, extra: &[&str]) -> HeldDemo {
    let mut args = vec![
        "--prefills",
        prefills,
        "--decodes",
        decodes,
        "--kv-transfer",
        "nixl",
        "--no-auto-recover",
    ];
    args.extend_from_slice(extra);
    let demo = HeldDemo::start(&args, Duration::from_secs(180));
    assert!(
        demo.report["verdict"].as_str().unwrap().starts_with("healthy"),
        "{:#}",
        demo.report
    );
    demo
}

/// The processes of `units` as the agent reports them.
fn pids(demo: &HeldDemo, units: &[&'static str]) -> Vec<u32> {
    units.iter().map(|u| demo.unit_pid(u)).collect()
}

/// The units of `units` whose process is no longer the one in `before`.
fn changed(demo: &HeldDemo, units: &[&'static str], before: &[u32]) -> Vec<&'static str> {
    units
        .iter()
        .zip(before)
        .filter(|(u, b)| demo.unit_pid(u) != **b)
        .map(|(u, _)| *u)
        .collect()
}

/// `restart pd-pair demo --only-sick` on a held stack while a client sends
/// through its router (issue 37): the report, the engines of `units` it
/// restarted, and the client's traffic; printed under `what`.
fn only_sick(demo: &HeldDemo, units: &[&'static str], what: &str) -> (Value, Vec<&'static str>, Traffic) {
    only_sick_from(demo, units, pids(demo, units), what)
}

/// [`only_sick`] with the pids `before` it (a unit killed has none now).
fn only_sick_from(
    demo: &HeldDemo,
    units: &[&'static str],
    before: Vec<u32>,
    what: &str,
) -> (Value, Vec<&'static str>, Traffic) {
    let client = Client::start(&demo.unit_url("router-0"));
    let out = demo.cli_within(
        &["restart", "pd-pair", "demo", "--only-sick", "--json"],
        Duration::from_secs(300),
    );
    let traffic = client.stop();
    let r = out.json();
    let restarted = changed(demo, units, &before);
    println!(
        "{what}: restart --only-sick {} in {} ms, restarted {restarted:?}; client meanwhile: {traffic}\n{}",
        r["verdict"],
        r["total_ms"],
        crate::harness::reasons(&r)
    );
    (r, restarted, traffic)
}

/// A client sending chat requests through a router from its own thread
/// until stopped, counting what answered and what failed (issue 37: client
/// traffic during a repair is counted, not assumed).
pub(crate) struct Client {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Traffic>,
}

#[derive(Debug)]
pub(crate) struct Traffic {
    sent: u64,
    failed: u64,
    first_errors: Vec<String>,
}

impl std::fmt::Display for Traffic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} requests, {} failed {:?}",
            self.sent, self.failed, self.first_errors
        )
    }
}

impl Client {
    pub(crate) fn start(router: &str) -> Self {
        Self::start_for(router, "demo-model")
    }

    /// A client asking for `model` (the real vLLM pair serves another).
    pub(crate) fn start_for(router: &str, model: &str) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, router, model) = (stop.clone(), router.to_string(), model.to_string());
        let thread = std::thread::spawn(move || {
            let rt = crate::harness::runtime();
            let http = reqwest::Client::new();
            let mut t = Traffic {
                sent: 0,
                failed: 0,
                first_errors: Vec::new(),
            };
            // Bounded: at most 10,000 requests, 10 s each.
            while !flag.load(std::sync::atomic::Ordering::Relaxed) && t.sent < 10_000 {
                let body = serde_json::json!({
                    "model": model,
                    "messages": [{"role": "user", "content": format!("client request {}", t.sent)}],
                    "max_tokens": 8,
                });
                let r = rt.block_on(async {
                    http.post(format!("{router}/v1/chat/completions"))
                        .json(&body)
                        .timeout(Duration::from_secs(10))
                        .send()
                        .await
                });
                t.sent += 1;
                let err = match r {
                    Ok(r) if r.status().is_success() => None,
                    Ok(r) => Some(format!("HTTP {}", r.status())),
                    Err(e) => Some(e.to_string()),
                };
                if let Some(e) = err {
                    t.failed += 1;
                    if t.first_errors.len() < 3 {
                        t.first_errors.push(e);
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            t
        });
        Client { stop, thread }
    }

    pub(crate) fn stop(self) -> Traffic {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().expect("the client thread")
    }
}
