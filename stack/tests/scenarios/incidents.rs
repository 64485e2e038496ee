//! One scenario per row of INCIDENTS.md: `pdwarden demo --incident NAME`
//! replays the mechanism in pd-sim on a real stack (real router, real
//! processes, loopback) and pdwarden must reach the right verdict, with the
//! key evidence in its reasons.

use std::time::Duration;

use serde_json::Value;

use crate::harness::{Output, demo, exclusive, reasons};

const LIMIT: Duration = Duration::from_secs(180);

fn drill(name: &str) -> (Output, Value) {
    let out = demo(&["--json", "--incident", name], LIMIT);
    let v = out.json();
    assert_eq!(v["incident"], name, "{v:#}");
    (out, v)
}

/// Row 1: the decode-only restart is refused; forced behind pdwarden's back,
/// it leaves the pair wedged, and verification says so.
#[test]
fn decode_alone_restart_is_refused_and_when_forced_is_wedged() {
    let _one = exclusive();
    let (out, v) = drill("decode-alone-restart");
    assert_eq!(out.code, 2, "{v:#}");
    assert!(
        v["restart"]["verdict"].as_str().unwrap().starts_with("healthy"),
        "{v:#}"
    );
    let refusal = &v["actions"][0];
    assert_eq!(refusal["refused"], true, "{v:#}");
    assert!(refusal["reason"].as_str().unwrap().contains("decode-only restart"));
    assert_eq!(v["actions"][1]["action"], "forced decode-only restart");
    assert_eq!(v["verdict"], "wedged", "{v:#}");
    assert_eq!(v["verify"]["kind"], "verify");
    assert!(reasons(&v).contains("returned tokens"), "{}", reasons(&v));
}

/// Row 2: 17.9 s, 106.4 s, 10.5 s, then no answer (scaled) is not a cold start.
#[test]
fn cold_start_lie_is_rejected_with_the_numbers() {
    let _one = exclusive();
    let (out, v) = drill("cold-start-lie");
    assert_eq!(out.code, 2, "{v:#}");
    assert_eq!(v["verdict"], "cold_start_rejected", "{v:#}");
    let r = reasons(&v);
    assert!(r.contains("probe 2 took") && r.contains("slower than probe 1"), "{r}");
    assert!(
        r.contains("timed out") && r.contains("a timeout is never cold start"),
        "{r}"
    );
    assert!(r.contains("health 200"), "{r}");
    let probes = v["probes"].as_array().unwrap();
    let outcomes: Vec<&str> = probes.iter().map(|p| p["outcome"].as_str().unwrap()).collect();
    assert_eq!(outcomes, ["ok", "ok", "ok", "timeout"]);
    // The scripted latencies, at the demo's 0.05 time scale: 17.9 s → 895 ms, 106.4 s → 5,320 ms.
    let lat = |i: usize| probes[i]["latency_ms"].as_u64().unwrap();
    assert!(lat(0) >= 895 && lat(1) >= 5_320 && lat(2) < lat(1), "{probes:?}");
}

/// Row 3: health 200, generation hangs: wedged, never healthy.
#[test]
fn shallow_health_is_wedged() {
    let _one = exclusive();
    let (out, v) = drill("shallow-health");
    assert_eq!(out.code, 2, "{v:#}");
    assert_eq!(v["verdict"], "wedged", "{v:#}");
    let r = reasons(&v);
    assert!(
        r.contains("router-0: health answered 200 but its generation check never passed"),
        "{r}"
    );
}

/// Row 4: a client abandons a long prompt mid-prefill on a serial engine
/// that leaks its slot; the pair is wedged, and verification says so.
#[test]
fn slot_leak_is_wedged() {
    let _one = exclusive();
    let (out, v) = drill("slot-leak");
    assert_eq!(out.code, 2, "{v:#}");
    assert!(
        v["restart"]["verdict"].as_str().unwrap().starts_with("healthy"),
        "{v:#}"
    );
    assert!(v["actions"][0]["detail"].as_str().unwrap().contains("gave up"), "{v:#}");
    assert_eq!(v["verdict"], "wedged", "{v:#}");
}

/// A genuine cold start is accepted: slow first probe within the allowance,
/// then warm; exit 0.
#[test]
fn genuine_cold_start_is_accepted() {
    let _one = exclusive();
    let (out, v) = drill("genuine-cold-start");
    assert_eq!(out.code, 0, "{v:#}");
    assert_eq!(v["verdict"], "healthy_after_cold_start", "{v:#}");
    let probes = v["probes"].as_array().unwrap();
    let first = probes[0]["latency_ms"].as_u64().unwrap();
    let last = probes.last().unwrap()["latency_ms"].as_u64().unwrap();
    assert!(first > v["warm_budget_ms"].as_u64().unwrap() && last <= v["warm_budget_ms"].as_u64().unwrap());
}

/// A probe series that falls but never reaches the warm budget is not a cold
/// start (20 s, 12 s, 9 s, 7 s, 6 s simulated: 1 s down to 0.3 s against
/// the 0.2 s floor of the demo's warm budget).
#[test]
fn falling_without_reaching_the_budget_is_rejected() {
    let _one = exclusive();
    let out = demo(
        &[
            "--json",
            "--decode-sim",
            "--cold-first-ms 0 --latency-script 20000,12000,9000,7000,6000",
        ],
        LIMIT,
    );
    let v = out.json();
    assert_eq!(out.code, 2, "{v:#}");
    assert_eq!(v["verdict"], "cold_start_rejected", "{v:#}");
    assert!(reasons(&v).contains("no convergence: 5 probes"), "{}", reasons(&v));
}

/// Row 5: over the same simulated hour, naive probes mint a session each (or
/// evict each other's prefix) while pdwarden's fixed prompt mints one and
/// costs the engine far less; every pdwarden probe is counted as a probe.
#[test]
fn probe_storm_shows_naive_probes_cost_more() {
    let _one = exclusive();
    let out = demo(&["--json", "--incident", "probe-storm"], LIMIT);
    let v = out.json();
    assert_eq!(out.code, 0, "{v:#}");
    let rows = v["strategies"].as_array().unwrap();
    let minted = |i: usize| rows[i]["sessions_minted"].as_u64().unwrap();
    let busy = |i: usize| rows[i]["busy_ms_total"].as_f64().unwrap();
    assert_eq!(minted(0), 60, "a fresh prompt mints a session per probe: {v:#}");
    assert_eq!(minted(2), 1, "{v:#}");
    assert!(busy(0) > 3.0 * busy(2) && busy(1) > 3.0 * busy(2), "{v:#}");
    assert_eq!(rows[2]["probe_requests"], 60, "pdwarden's probes are tagged: {v:#}");
    assert_eq!(rows[0]["probe_requests"], 0, "naive probes are not tagged: {v:#}");
}
