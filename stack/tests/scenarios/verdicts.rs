//! Restart verdicts that no sequence of engine answers can fool (issue 12),
//! through the real sglang-router: each scenario makes pd-sim answer one way
//! and checks the verdict says what happened, with its numbers.

use std::time::Duration;

use serde_json::Value;

use crate::harness::{HeldDemo, demo, exclusive, reasons, sim_fault, step};

const LIMIT: Duration = Duration::from_secs(180);

fn demo_with_decode(decode_sim: &str) -> (i32, Value) {
    let out = demo(&["--json", "--no-auto-recover", "--decode-sim", decode_sim], LIMIT);
    let r = out.json();
    (out.code, r)
}

/// The first generation through the router after the restart hangs until its
/// timeout; the retry answers fast. The hang is probe 1 of the series (it used
/// to be retried silently and the pair called healthy): a timeout is never
/// cold start.
#[test]
fn a_hang_before_the_first_answer_is_never_healthy() {
    let _one = exclusive();
    let (code, r) = demo_with_decode("--latency-script hang");
    assert_eq!(code, 2, "{r:#}");
    assert_eq!(r["verdict"], "cold_start_rejected", "{r:#}");
    let first = &r["probes"][0];
    assert_eq!(first["outcome"], "timeout", "{r:#}");
    assert!(
        first["error"].as_str().unwrap().starts_with("readiness generation"),
        "{first}"
    );
    assert_eq!(r["probes"][1]["outcome"], "ok", "the retry answered: {r:#}");
    assert!(
        reasons(&r).contains("probe 1 timed out after") && reasons(&r).contains("a timeout is never cold start"),
        "{}",
        reasons(&r)
    );
    // The attempt is in the report's evidence, not only in the probes.
    let attempts = r["attempts"].as_array().unwrap();
    assert!(
        attempts
            .iter()
            .any(|a| a["unit"] == "router-0" && a["check"] == "generation" && a["outcome"] == "timeout"),
        "{attempts:#?}"
    );
}

/// Slow first answer, two warm ones (the series stops), then every later
/// request 10× slower: the suite's budgets come from the pair's warm figures,
/// so the relapse is caught and the cold-start story rejected. The decode's
/// fixed cost (600 simulated ms, 30 ms real) makes a relapsed short answer
/// ~0.35 s, clear of the demo's 0.2 s warm-budget floor, while the relapsed
/// long generation (~1.8 s) stays inside its timeout.
#[test]
fn a_relapse_after_warm_up_rejects_the_cold_start() {
    let _one = exclusive();
    let (code, r) = demo_with_decode("--ttft-ms 600 --relapse-after 3 --relapse-slowdown 10");
    assert_eq!(code, 2, "{r:#}");
    assert_eq!(r["verdict"], "cold_start_rejected", "{}", reasons(&r));
    assert!(
        r["probes"].as_array().unwrap().iter().all(|p| p["outcome"] == "ok"),
        "the short series passed: {r:#}"
    );
    let text = reasons(&r);
    assert!(text.contains("a relapse:"), "{text}");
    assert!(
        text.contains("long generation: first token after")
            || text.contains("multi-turn: turn 1 (the probe's own request) took"),
        "{text}"
    );
}

/// A decode that emits tokens 5× slower than its last healthy verification,
/// while the short probes stay within the warm budget: the suite's TPOT
/// budget (from the pair's history) fails it as over budget.
#[test]
fn a_slow_decode_fails_on_time_per_output_token() {
    let _one = exclusive();
    let demo = HeldDemo::start(&["--no-auto-recover"], LIMIT);
    assert!(
        demo.report["verdict"].as_str().unwrap().starts_with("healthy"),
        "{:#}",
        demo.report
    );
    let tpot_us = step(&demo.report, "long_generation")["figures"]["tpot_us"]
        .as_u64()
        .unwrap();
    assert!(tpot_us > 0, "{:#}", demo.report);
    sim_fault(&demo.unit_url("decode-0"), r#"{"tpot_ms": 60}"#);
    let out = demo.cli(&["verify", "demo", "--json"]);
    let r = out.json();
    assert_eq!(out.code, 2, "{r:#}");
    assert_eq!(r["verdict"], "over_budget", "{}", reasons(&r));
    assert!(
        r["probes"].as_array().unwrap().iter().all(|p| p["outcome"] == "ok"),
        "probes answered: {r:#}"
    );
    let text = reasons(&r);
    assert!(text.contains("long generation: a token every"), "{text}");
    assert!(text.contains("the median TPOT"), "budget from history: {text}");
    assert_eq!(
        r["budgets"]["tpot_us"].as_u64().unwrap(),
        tpot_us * 3,
        "{:#}",
        r["budgets"]
    );
}

/// A scheduler that stopped batching: 8 simultaneous requests take about 8×
/// one. Each answers, none is lost; the concurrency step calls it lost
/// batching, and the pair is over budget. (On the prefill: a routed decode
/// part joins the running batch only once its KV arrives, so a decode's fixed
/// cost overlaps the prefill's and only its decode steps queue.)
#[test]
fn lost_batching_is_over_budget() {
    let _one = exclusive();
    let out = demo(
        &[
            "--json",
            "--no-auto-recover",
            "--prefill-sim",
            "--max-running 1 --ttft-ms 400",
        ],
        LIMIT,
    );
    let (code, r) = (out.code, out.json());
    assert_eq!(code, 2, "{r:#}");
    assert_eq!(r["verdict"], "over_budget", "{}", reasons(&r));
    let c = step(&r, "concurrency");
    assert_eq!(c["status"], "fail", "{c:#}");
    assert_eq!(c["figures"]["lost"], 0);
    assert!(
        reasons(&r).contains("concurrency: lost batching: 8 simultaneous requests took"),
        "{}",
        reasons(&r)
    );
}

/// Every answer ~2× over the warm budget (0.4 s against 0.2 s) and no warm-up at all: there was no
/// cold-start claim to reject, so the verdict is `over_budget`.
#[test]
fn a_uniformly_slow_pair_is_over_budget() {
    let _one = exclusive();
    let (code, r) = demo_with_decode("--ttft-ms 8000 --cold-first-ms 0");
    assert_eq!(code, 2, "{r:#}");
    assert_eq!(r["verdict"], "over_budget", "{}", reasons(&r));
    let text = reasons(&r);
    assert!(
        text.starts_with("every one of 5 answers was over the 0.20 s warm budget"),
        "{text}"
    );
    assert!(!text.contains("warm-up makes latency fall"), "{text}");
}

/// One KV transfer in three fails on the decode (HTTP 500, as SGLang's decode
/// answers a failed transfer). The real router retries the failed request, so
/// no error reaches the client — only the retry's delay. The decode's own
/// failure counter, read after the probes and the suite, says what happened:
/// `failed`, naming the counter.
#[test]
fn intermittent_kv_transfer_failures_fail_the_pair() {
    let _one = exclusive();
    let (code, r) = demo_with_decode("--kv-fail-every 3");
    assert_eq!(code, 2, "{r:#}");
    assert_eq!(r["verdict"], "failed", "{}", reasons(&r));
    let text = reasons(&r);
    assert!(
        text.contains("decode decode-0: ")
            && text.contains(
                "KV transfers failed while pdwarden's requests ran (sglang:num_transfer_failed_reqs_total 0 → "
            ),
        "{text}"
    );
    let decode = r["engine_counters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["unit"] == "decode-0")
        .expect("decode counters");
    assert!(decode["transfer_failed_total"].as_f64().unwrap() >= 1.0, "{decode}");
}

/// A bad restart that was accepted (its 1.2 s first answer is within the
/// configured 1.5 s allowance) does not raise the bar: the next restart's
/// 2.0 s cold start is judged against the configured allowance (one accepted
/// restart is not history enough), not against 2 × 1.2 s.
#[test]
fn a_poisoned_history_does_not_raise_the_allowance() {
    let _one = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let count = dir.path().join("decode-starts");
    let sim = format!(
        "--cold-first-ms-by-start 24000,40000 --start-count-file {}",
        count.display()
    );
    let demo = HeldDemo::start(&["--no-auto-recover", "--decode-sim", &sim], LIMIT);
    assert_eq!(demo.report["verdict"], "healthy_after_cold_start", "{:#}", demo.report);
    let out = demo.cli_within(&["restart", "pd-pair", "demo", "--json"], LIMIT);
    let r = out.json();
    assert_eq!(out.code, 2, "{r:#}");
    assert_eq!(r["verdict"], "cold_start_rejected", "{}", reasons(&r));
    assert_eq!(r["cold_allowance"]["source"], "configured", "{:#}", r["cold_allowance"]);
    assert!(
        reasons(&r).contains("probe 1 took")
            && reasons(&r).contains("above the configured cold-start allowance (1.50 s"),
        "{}",
        reasons(&r)
    );
}
