//! Golden output (issue 34) through the real sglang-router, pd-sim standing
//! in for the engines: a pair that answers fast, HTTP 200, but with the
//! wrong tokens is never healthy — a decode on weights replaced on disk
//! under the same path (same argv, same config fingerprint), a decode
//! reading the transferred KV with a mismatched layout.

use std::time::Duration;

use serde_json::Value;

use crate::harness::{HeldDemo, exclusive, reasons, sim_fault};

const LIMIT: Duration = Duration::from_secs(180);

fn check(report: &Value) -> &str {
    report["golden"]["check"]["outcome"].as_str().unwrap_or("(none)")
}

/// The demo's restart records the reference; a verification is held to
/// it; the decode's weights file replaced → the next co-restart is
/// `failed` naming the output (first differing token, both continuations,
/// the margin); restored → healthy. KV corruption switched on in the
/// running decode → `verify` fails at the corrupted position; off → healthy.
#[test]
fn wrong_output_through_the_real_router_is_failed_naming_it() {
    let _one = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let weights = dir.path().join("decode-weights");
    std::fs::write(&weights, "tiny-v1").unwrap();
    let decode_sim = format!("--weights-file {}", weights.display());
    let held = HeldDemo::start(&["--no-auto-recover", "--decode-sim", &decode_sim], LIMIT);
    let first = &held.report;
    assert!(
        first["verdict"].as_str().unwrap().starts_with("healthy"),
        "{}",
        reasons(first)
    );
    assert_eq!(check(first), "no_reference", "{:#}", first["golden"]);
    assert_eq!(
        first["golden"]["reference"]["operation_id"], first["operation_id"],
        "the first healthy restart is the reference"
    );

    let verify = |expect_code: i32| {
        let out = held.cli_within(&["verify", "demo", "--json"], LIMIT);
        let r = out.json();
        assert_eq!(out.code, expect_code, "{}", reasons(&r));
        r
    };
    let same = verify(0);
    assert_eq!(check(&same), "same", "{:#}", same["golden"]);

    // The checkpoint re-synced on disk under the same path.
    std::fs::write(&weights, "tiny-v2").unwrap();
    let out = held.cli_within(&["restart", "pd-pair", "demo", "--json"], LIMIT);
    let wrong = out.json();
    assert_eq!(
        (out.code, wrong["verdict"].as_str()),
        (2, Some("failed")),
        "{}",
        reasons(&wrong)
    );
    assert_eq!(check(&wrong), "diverged", "{:#}", wrong["golden"]);
    let first_reason = wrong["reasons"][0].as_str().unwrap();
    assert!(
        first_reason.starts_with("WRONG OUTPUT") && first_reason.contains("at token 0"),
        "{}",
        reasons(&wrong)
    );
    assert!(
        wrong["suite"].as_array().is_none_or(Vec::is_empty),
        "no suite against wrong output"
    );

    std::fs::write(&weights, "tiny-v1").unwrap();
    let out = held.cli_within(&["restart", "pd-pair", "demo", "--json"], LIMIT);
    let restored = out.json();
    assert_eq!(out.code, 0, "{}", reasons(&restored));
    assert_eq!(check(&restored), "same", "{:#}", restored["golden"]);

    // Decode reading KV with a mismatched layout, live (no restart).
    let decode = held.unit_url("decode-0");
    sim_fault(&decode, r#"{"kv_corruption": true, "corrupt_from_position": 2}"#);
    let corrupt = verify(2);
    assert_eq!(corrupt["verdict"], "failed", "{}", reasons(&corrupt));
    assert_eq!(corrupt["golden"]["check"]["position"], 2, "{:#}", corrupt["golden"]);
    sim_fault(&decode, r#"{"kv_corruption": false}"#);
    let healthy = verify(0);
    assert_eq!(check(&healthy), "same", "{:#}", healthy["golden"]);
}
