//! Golden output (issue 34) through the real sglang-router, pd-sim standing
//! in for the engines: a pair that answers fast, HTTP 200, but with the
//! wrong tokens is never healthy — a decode on weights replaced on disk
//! under the same path (same argv, same config fingerprint), a decode
//! reading the transferred KV with a mismatched layout, one decode of an
//! xPyD pair that the router's one greedy request may never meet. The
//! operator pins a new reference when new weights are meant.

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
    // Fast and complete: the suite found nothing before the output check.
    assert!(
        wrong["suite"].as_array().is_some_and(|s| !s.is_empty()),
        "the suite ran and passed: {:#}",
        wrong["suite"]
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

    // New weights meant: the restart onto them fails on its output; the
    // operator pins this verification's answer as the reference; the next
    // restart on the new weights is held to it, healthy; `history` says
    // who recorded the reference.
    std::fs::write(&weights, "tiny-v2").unwrap();
    let out = held.cli_within(&["restart", "pd-pair", "demo", "--json"], LIMIT);
    assert_eq!(out.code, 2, "{}", reasons(&out.json()));
    let out = held.cli_within(&["verify", "demo", "--record-reference", "--json"], LIMIT);
    let pinned = out.json();
    assert_eq!(out.code, 0, "{}", reasons(&pinned));
    assert_eq!(check(&pinned), "pinned", "{:#}", pinned["golden"]);
    assert_eq!(
        pinned["golden"]["check"]["replaced"]["outcome"], "diverged",
        "{:#}",
        pinned["golden"]
    );
    assert_eq!(
        (
            &pinned["golden"]["reference"]["operation_id"],
            &pinned["golden"]["reference"]["pinned"]
        ),
        (&pinned["operation_id"], &Value::Bool(true)),
        "{:#}",
        pinned["golden"]
    );
    let out = held.cli_within(&["restart", "pd-pair", "demo", "--json"], LIMIT);
    let on_new = out.json();
    assert_eq!(out.code, 0, "{}", reasons(&on_new));
    assert_eq!(check(&on_new), "same", "{:#}", on_new["golden"]);
    assert_eq!(
        on_new["golden"]["check"]["reference_operation"], pinned["operation_id"],
        "held to the pinned reference"
    );
    let history = held.cli(&["history", "demo", "--limit", "3"]);
    assert!(
        history
            .stdout
            .contains("reference pinned by the operator (--record-reference)"),
        "{}",
        history.stdout
    );
}

/// Issue 34, item 3: an xPyD pair (here 2P3D) answers the greedy request along
/// every prefill → decode path (one request straight along each, as well
/// as the router's). KV corruption switched on in one decode only: `verify`
/// is failed naming each path into it (and it), whichever decode the
/// router's own request met; off: healthy again.
///
/// Issue 46, item 5: a 2P3D pair on two agents, one unit template per
/// host (`--two-hosts`: `local` runs `prefill-0`, `decode-0`, `decode-1`,
/// `remote` its own `prefill-0` and `decode-0`). The corrupting decode is `remote/decode-0`: every finding
/// names it with its host (a finding used to land on the other host's
/// `decode-0`, path answers carrying unit names only), and `--only-sick`
/// restarts it alone while a client sends through the router.
#[test]
fn every_path_of_an_xpyd_pair_agrees_or_the_wrong_one_is_named() {
    let _one = exclusive();
    let held = HeldDemo::start(
        &[
            "--prefills",
            "2",
            "--decodes",
            "3",
            "--two-hosts",
            "--kv-transfer",
            "nixl",
            "--no-auto-recover",
        ],
        LIMIT,
    );
    let first = &held.report;
    assert!(
        first["verdict"].as_str().unwrap().starts_with("healthy"),
        "{}",
        reasons(first)
    );
    let paths = |r: &Value| -> Vec<(String, String)> {
        r["golden_paths"]
            .as_array()
            .unwrap_or_else(|| panic!("no golden_paths: {r:#}"))
            .iter()
            .map(|p| {
                (
                    format!("{} → {}", p["prefill"].as_str().unwrap(), p["decode"].as_str().unwrap()),
                    p["check"]["outcome"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let all = paths(first);
    assert_eq!(all.len(), 6, "one greedy request per path (P×D): {all:?}");
    assert!(all.iter().all(|(_, o)| o == "same" || o == "near_tie"), "{all:?}");
    let verify = || {
        let out = held.cli_within(&["verify", "demo", "--json"], LIMIT);
        (out.code, out.json())
    };
    let (code, healthy) = verify();
    assert_eq!(code, 0, "{}", reasons(&healthy));

    let decode1 = held.unit_url("remote/decode-0");
    assert_ne!(decode1, held.unit_url("local/decode-0"), "two engines of one name");
    sim_fault(&decode1, r#"{"kv_corruption": true}"#);
    let (code, corrupt) = verify();
    assert_eq!(
        (code, corrupt["verdict"].as_str()),
        (2, Some("failed")),
        "{}",
        reasons(&corrupt)
    );
    let wrong: Vec<String> = paths(&corrupt)
        .into_iter()
        .filter(|(_, o)| o == "diverged")
        .map(|(p, _)| p)
        .collect();
    assert_eq!(
        wrong,
        [
            "local/prefill-0 → remote/decode-0",
            "remote/prefill-0 → remote/decode-0"
        ],
        "{}",
        reasons(&corrupt)
    );
    // Issue 37: the failed verification's path matrix folds the wrong
    // answers in and names decode-1.
    let m = &corrupt["diagnoses"][0];
    assert_eq!(m["localisation"]["suspects"][0]["unit"], "remote/decode-0", "{m:#}");
    assert_eq!(
        m["matrix"]["cells"],
        serde_json::json!([["ok", "ok", "wrong_output"], ["ok", "ok", "wrong_output"]]),
        "{m:#}"
    );
    let text = reasons(&corrupt);
    for path in &wrong {
        assert!(
            text.contains(&format!("WRONG OUTPUT: {path} answered")),
            "{path} not named: {text}"
        );
    }
    assert!(text.contains("every path into decode remote/decode-0"), "{text}");
    assert!(!text.contains("local/decode-0 answered"), "{text}");
    println!("2P3D on two hosts, kv_corruption in remote/decode-0: {text}");

    // `--only-sick`: the matrix holds each path's greedy answer to the
    // reference and names remote/decode-0; it alone restarts.
    let units = [
        "local/prefill-0",
        "remote/prefill-0",
        "local/decode-0",
        "remote/decode-0",
    ];
    let before: Vec<u32> = units.iter().map(|u| held.unit_pid(u)).collect();
    let client = crate::co_restart::Client::start(&held.unit_url("router-0"));
    let out = held.cli_within(
        &["restart", "pd-pair", "demo", "--only-sick", "--json"],
        Duration::from_secs(300),
    );
    let traffic = client.stop();
    let r = out.json();
    println!(
        "--only-sick on two hosts: {} in {} ms; clients meanwhile: {traffic}",
        r["verdict"], r["total_ms"]
    );
    assert_eq!(
        r["diagnoses"][0]["localisation"]["suspects"][0]["unit"], "remote/decode-0",
        "{r:#}"
    );
    let restarted: Vec<&str> = units
        .iter()
        .zip(&before)
        .filter(|(u, b)| held.unit_pid(u) != **b)
        .map(|(u, _)| *u)
        .collect();
    assert_eq!(restarted, ["remote/decode-0"], "{r:#}");
    assert!(r["verdict"].as_str().unwrap().starts_with("healthy"), "{r:#}");

    let (code, again) = verify();
    assert_eq!(code, 0, "{}", reasons(&again));
    assert!(paths(&again).iter().all(|(_, o)| o == "same" || o == "near_tie"));
}
