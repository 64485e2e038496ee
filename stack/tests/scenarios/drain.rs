//! Drain before restart behind a shared serving router (issue 18, point 1):
//! two pd-sim pairs, each behind its own real sglang-router, and one more
//! real sglang-router in front of both that the clients use
//! (`pdwarden demo --shared-router`, `pdwarden_stack::rolling`), and a
//! rolling restart of an xPyD pair under traffic through its own router
//! (`pdwarden demo --prefills 2 --decodes 2 --rolling`).

use std::time::Duration;

use crate::harness::{demo, exclusive, step_names};

/// Pair `demo` restarted under steady client traffic through the shared
/// router while `demo-b` keeps serving: no client request fails, none
/// reaches `demo`'s restarted engines while it is out of rotation, the
/// drain ends when the engines' own gauges read idle (not after a fixed
/// settle), and the pair goes back only if its own verification and every
/// KV path the router would create to the other pair's engines hold.
#[test]
fn a_pair_restarted_behind_a_shared_router_under_traffic_drops_no_client_request() {
    let _one = exclusive();
    let out = demo(&["--shared-router", "--json"], Duration::from_secs(300));
    let r = out.json();
    let t = &r["traffic"];
    assert!(t.is_object(), "no traffic summary: {r:#}\n{}", out.stderr);
    assert_eq!(
        r["joins"]["demo-b"].as_str().map(|v| v.starts_with("healthy")),
        Some(true),
        "{r:#}"
    );
    assert_eq!(
        r["joins"]["demo"].as_str().map(|v| v.starts_with("healthy")),
        Some(true),
        "{r:#}"
    );
    assert_eq!(t["failed"], 0, "client requests failed: {t:#}");
    assert!(t["requests"].as_u64().unwrap() >= 50, "{t:#}");
    assert_eq!(t["reached_restarted_pair_while_out"], 0, "{t:#}");
    assert!(
        t["served_by_other_pair_during_restart"].as_u64().unwrap() > 0,
        "demo-b served meanwhile: {t:#}"
    );
    let d = &r["drain"];
    assert_eq!(d["router"], "local/router-shared", "{d:#}");
    let removed: Vec<&str> = d["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["unit"].as_str().unwrap())
        .collect();
    assert_eq!(removed, ["local/prefill-0", "local/decode-0"], "{d:#}");
    assert_eq!(d["waited"], true);
    assert_eq!(d["timed_out"], false, "{d:#}");
    let (out_at, drained_at) = (d["out_at_ms"].as_u64().unwrap(), d["drained_at_ms"].as_u64().unwrap());
    assert!(out_at <= drained_at, "{d:#}");
    let steps = step_names(&r);
    assert_eq!(steps[0], "drain", "{steps:?}");
    assert_eq!(
        &steps[1..4],
        ["restart-prefill", "restart-decode", "restart-router"],
        "{steps:?}"
    );
    // Whether `demo` may go back depends on what its engines' partners
    // remember, and that on how the router paired them before the restart.
    // pd-sim's engines are the SGLang the seeds describe: a decode keeps a
    // restarted prefill's old bootstrap identity (every transfer from it
    // fails), and a long-running prefill degrades a restarted decode's
    // bootstrap (every transfer to it hangs). When the router had sent
    // demo-b's prefill to demo's decode (and demo's prefill to demo-b's
    // decode), both paths fail after demo's restart: checked before any
    // client meets them, and demo stays out — healthy through its own
    // router, named as kept out. When it had paired them only within each
    // pair (round robin in step over both lists), nothing is stale: both
    // paths answer and demo goes back. Either way every path was checked
    // first and no client request failed (asserted above).
    let rejoin = &d["rejoin"];
    let checked: Vec<&str> = rejoin["paths_checked"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(
        checked.len(),
        2,
        "demo-b's prefill → demo's decode, demo's prefill → demo-b's decode: {rejoin:#}"
    );
    assert!(
        r["probes"].as_array().unwrap().iter().all(|p| p["outcome"] == "ok"),
        "healthy through its own router: {:#}",
        r["probes"]
    );
    let outcome = if t["put_back"] == true {
        assert_eq!(rejoin["put_back"], true, "{rejoin:#}");
        assert!(r["verdict"].as_str().unwrap().starts_with("healthy"), "{r:#}");
        "put back, both KV paths answered".to_string()
    } else {
        assert_eq!(r["verdict"], "failed", "{r:#}");
        let kept_out = r["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str())
            .find(|l| l.contains("KEPT OUT of the serving router local/router-shared"))
            .unwrap_or_else(|| panic!("{:#}", r["reasons"]));
        assert!(kept_out.contains("of the 2 KV paths"), "{kept_out}");
        assert!(
            kept_out.contains("Decode transfer failed") || kept_out.contains("no answer within"),
            "a stale identity or a degraded bootstrap: {kept_out}"
        );
        kept_out.to_string()
    };
    println!(
        "{} client requests, {} failed; demo-b served {} during demo's restart; drain {} ms; {outcome}",
        t["requests"],
        t["failed"],
        t["served_by_other_pair_during_restart"],
        drained_at - out_at
    );
}

/// A rolling restart of a 2P2D pd-sim pair behind the real sglang-router
/// (its own router, the one the clients use) under steady client traffic
/// (issue 18, point 2): one P/D sub-pair out of the router at a time,
/// drained, restarted, proven over its own KV path and its cross paths to
/// the engines still serving, and put back only then. No client request
/// fails and none reaches a sub-pair's restarted engines while it is out.
#[test]
fn a_rolling_restart_under_traffic_drops_no_client_request() {
    let _one = exclusive();
    let out = demo(
        &[
            "--prefills",
            "2",
            "--decodes",
            "2",
            "--kv-transfer",
            "nixl",
            "--rolling",
            "--json",
        ],
        Duration::from_secs(300),
    );
    let r = out.json();
    let t = &r["traffic"];
    assert!(t.is_object(), "no traffic summary: {r:#}\n{}", out.stderr);
    assert_eq!(
        r["start"].as_str().map(|v| v.starts_with("healthy")),
        Some(true),
        "{r:#}"
    );
    assert_eq!(r["kind"], "rolling", "{r:#}");
    assert_eq!(t["failed"], 0, "client requests failed: {t:#}");
    assert!(t["requests"].as_u64().unwrap() >= 50, "{t:#}");
    let subs = r["sub_operations"].as_array().expect("sub-operations");
    let restarted: Vec<&serde_json::Value> = subs.iter().filter(|c| c["kind"] == "co_restart").collect();
    let while_out = t["reached_sub_pair_while_out"].as_array().unwrap();
    assert_eq!(while_out.len(), restarted.len(), "{t:#}");
    assert!(
        while_out.iter().all(|n| n == 0),
        "client requests reached a sub-pair while out: {t:#}"
    );
    // One at a time, in order: sub-pair 1 first.
    assert!(
        restarted[0]["purpose"]
            .as_str()
            .unwrap()
            .starts_with("sub-pair 1 of 2 (prefill-0 + decode-0)"),
        "{subs:#?}"
    );
    let reasons: Vec<&str> = r["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    // The engines' link keeps no peer state (`--kv-transfer nixl`): every
    // sub-pair goes back, and the whole pair is verified through its router.
    // (An SGLang pool is refused up front: `drain::a_roll_of_a_pool_that_keeps_peer_state_is_refused`.)
    assert!(r["verdict"].as_str().unwrap().starts_with("healthy"), "{reasons:#?}");
    assert_eq!(restarted.len(), 2, "{subs:#?}");
    assert!(
        restarted
            .iter()
            .all(|c| c["verdict"].as_str().unwrap().starts_with("healthy"))
    );
    assert_eq!(subs.last().unwrap()["kind"], "verify", "{subs:#?}");
    assert_eq!(t["rejoins"], 2, "{t:#}");
    println!(
        "{} client requests, {} failed; sub-pairs: {}",
        t["requests"],
        t["failed"],
        restarted
            .iter()
            .map(|c| format!("{} {}", c["purpose"].as_str().unwrap(), c["verdict"].as_str().unwrap()))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// Issue 37, item 4: a roll of a pool whose KV link keeps state about its
/// peers (pd-sim's default, SGLang's bootstrap) is refused before anything
/// starts, saying why: a restarted prefill leaves every decode its old
/// identity, so no sub-pair could go back while the others serve.
#[test]
fn a_roll_of_a_pool_that_keeps_peer_state_is_refused() {
    let out = demo(
        &["--prefills", "2", "--decodes", "2", "--rolling", "--json"],
        Duration::from_secs(60),
    );
    assert_ne!(out.code, 0, "{}", out.stdout);
    let text = format!("{}{}", out.stdout, out.stderr);
    assert!(
        text.contains("--rolling: the engines' KV link keeps state about their peers")
            && text.contains("--kv-transfer nixl"),
        "{text}"
    );
}
