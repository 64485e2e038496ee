//! Verdicts from every layer's evidence (issue 30), through the real
//! sglang-router: each scenario hides a failure in one layer the verdict
//! used to ignore — an error event inside a stream that answered 200, errors
//! the router retried into a slower success, a labelled engine counter that
//! appears only at its first increment, a late first token the agent cut as
//! silence — with `pd-faultproxy` between the router and the decode where an
//! engine cannot be made to show it, and checks the verdict names it.

use std::time::Duration;

use serde_json::Value;

use crate::harness::{HeldDemo, demo, exclusive, reasons, sim_fault, step};

const LIMIT: Duration = Duration::from_secs(180);

fn run(args: &[&str]) -> (i32, Value) {
    let mut all = vec!["--json", "--no-auto-recover"];
    all.extend_from_slice(args);
    let out = demo(&all, LIMIT);
    let r = out.json();
    (out.code, r)
}

/// The decode answers HTTP 500 to its first three generations after the
/// restart; sglang-router retries them and the client sees a slower 200 —
/// which the probe series alone called `healthy_after_cold_start`. The
/// router's own counters (read before and after, absent = 0) say what it
/// hid: `failed`, naming the router, the counters and their numbers.
#[test]
fn router_retried_errors_after_a_restart_are_failed_not_a_cold_start() {
    let _one = exclusive();
    let (code, r) = run(&["--decode-proxy", "--http-500 3"]);
    assert_eq!(code, 2, "{r:#}");
    assert_eq!(r["verdict"], "failed", "{}", reasons(&r));
    assert!(
        r["probes"].as_array().unwrap().iter().all(|p| p["outcome"] == "ok"),
        "the client saw only successes: {:#}",
        r["probes"]
    );
    let text = reasons(&r);
    assert!(
        text.starts_with("router router-0: counted 3 backend errors (smg_worker_errors_total 0 → 3) and 3 retries (smg_worker_retries_total 0 → 3) from its decode workers"),
        "{text}"
    );
    assert!(text.contains("an error is never a cold start"), "{text}");
    let decode = r["router_counters"][0]["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["worker_type"] == "decode")
        .cloned()
        .unwrap_or_default();
    assert_eq!(decode["errors"], 3.0, "{:#}", r["router_counters"]);
}

/// The decode streams 20 tokens of the long generation, then an error event
/// (SGLang's create_streaming_error_response) and `[DONE]`; the router
/// passes it on with HTTP 200. The short non-streamed probes are untouched.
/// The long generation fails naming the event, and the suite stops there.
#[test]
fn a_stream_aborted_with_an_error_event_fails_the_pair() {
    let _one = exclusive();
    let (code, r) = run(&["--decode-proxy", "--error-event-after 20 --match stream"]);
    assert_eq!(code, 2, "{r:#}");
    assert_eq!(r["verdict"], "failed", "{}", reasons(&r));
    let long = step(&r, "long_generation");
    assert_eq!(long["status"], "fail", "{long:#}");
    assert_eq!(long["samples"][0]["tokens"], 20, "{long:#}");
    assert!(
        long["samples"][0]["stream_error"]
            .as_str()
            .unwrap_or("")
            .contains("Request aborted mid-generation"),
        "{long:#}"
    );
    let text = reasons(&r);
    assert!(
        text.contains("long generation: error after") && text.contains("error event in the stream after 20 tokens"),
        "{text}"
    );
    assert_eq!(
        r["suite"].as_array().unwrap().len(),
        1,
        "the suite stops at the failure"
    );
    assert!(
        text.contains("the suite stopped at its long generation step, which proved the pair failed"),
        "{text}"
    );
}

/// A pair that never failed before (SGLang's labelled PD failure counters
/// are absent until their first increment: pd-sim --lazy-failure-counters)
/// is verified while one KV transfer in three fails; the router retries
/// each into a success. `verify` used to build the before/after span only
/// for a counter that existed before, and called the pair healthy beside
/// its own `transfer_failed_total`. An absent counter is 0.
#[test]
fn a_first_ever_engine_failure_during_verify_is_failed() {
    let _one = exclusive();
    let lazy = "--lazy-failure-counters --cold-first-ms 0";
    let held = HeldDemo::start(
        &["--no-auto-recover", "--prefill-sim", lazy, "--decode-sim", lazy],
        LIMIT,
    );
    assert!(
        held.report["verdict"].as_str().unwrap().starts_with("healthy"),
        "{:#}",
        held.report
    );
    let decode = held.unit_url("decode-0");
    sim_fault(&decode, r#"{"kv_fail_every": 3}"#);
    let out = held.cli_within(&["verify", "demo", "--json"], LIMIT);
    let r = out.json();
    assert_eq!(out.code, 2, "{r:#}");
    assert_eq!(r["verdict"], "failed", "{}", reasons(&r));
    let text = reasons(&r);
    assert!(
        text.contains("decode decode-0: ")
            && text.contains(
                "KV transfers failed while pdwarden's requests ran (sglang:num_transfer_failed_reqs_total absent (0) → "
            ),
        "{text}"
    );
}

/// The long generation's first token arrives 1.5 s late (over its 0.2 s
/// budget), then every token streams normally. The agent used to apply the
/// token-gap limit before the first token too, cut the stream as silent and
/// the verdict was `wedged`; a complete answer that was only slow is
/// `over_budget`. (No cold start here, so the series is plainly healthy.)
#[test]
fn a_late_first_token_then_a_normal_stream_is_over_budget_not_wedged() {
    let _one = exclusive();
    let warm = "--cold-first-ms 0";
    let (code, r) = run(&[
        "--prefill-sim",
        warm,
        "--decode-sim",
        warm,
        "--decode-proxy",
        "--first-token-delay-ms 1500 --match stream",
    ]);
    assert_eq!(code, 2, "{r:#}");
    assert_eq!(r["verdict"], "over_budget", "{}", reasons(&r));
    let long = step(&r, "long_generation");
    assert_eq!(long["fails_as"], "over_budget", "{long:#}");
    assert_eq!(long["samples"][0]["outcome"], "ok", "{long:#}");
    assert_eq!(long["samples"][0]["tokens"], 256, "the whole answer arrived: {long:#}");
    assert!(
        reasons(&r).contains("long generation: first token after 1.5"),
        "{}",
        reasons(&r)
    );
}
