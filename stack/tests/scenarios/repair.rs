//! The watch repairs what is known broken (issue 31, item 2), through the
//! real sglang-router: a router that died, and a pair whose every request
//! fails its KV transfer (INCIDENTS row 1's symptom: a decode holding a
//! restarted prefill's stale bootstrap, as a co-restart stopped after the
//! prefill leaves it). Both used to stay `suspect` for ever with
//! `auto_recover = true`. One held stack for both.

use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::harness::{HeldDemo, exclusive, poll, sim_fault};

const LIMIT: Duration = Duration::from_secs(180);

#[test]
fn a_dead_router_and_a_pair_failing_every_request_are_repaired_by_the_watch() {
    let _one = exclusive();
    let held = HeldDemo::start(&[], LIMIT);
    assert!(
        held.report["verdict"].as_str().unwrap().starts_with("healthy"),
        "{:#}",
        held.report
    );
    poll("watch healthy after the restart", Duration::from_secs(60), || {
        (held.watch()["state"] == "healthy").then_some(())
    });

    // The router SIGKILLed: no engine sample shows it; its agent does.
    let router = held.unit_pid("router-0");
    kill(Pid::from_raw(router as i32), Signal::SIGKILL).expect("SIGKILL the router");
    let (_, first) = held.automatic_recovery(LIMIT);
    assert_eq!(first["trigger"]["automatic"], true, "{first:#}");
    assert_eq!(first["trigger"]["wedge"]["kind"], "exited", "{first:#}");
    assert!(
        first["trigger"]["reasons"][0]
            .as_str()
            .unwrap_or("")
            .starts_with("router router-0 is not running: exited"),
        "{first:#}"
    );
    assert!(
        first["verdict"].as_str().unwrap_or("").starts_with("healthy"),
        "{first:#}"
    );
    assert_ne!(held.unit_pid("router-0"), router, "a new router runs");

    // Every KV transfer fails from now on (the decode's live pd-sim fault;
    // a restarted process starts without it): the router retries and then
    // answers 500, every probe fails with an error.
    let decode = held.unit_url("decode-0");
    sim_fault(&decode, r#"{"kv_fail_every": 1}"#);
    let (_, second) = held.automatic_recovery_after(Some(&first["operation_id"]), LIMIT);
    assert_eq!(second["trigger"]["wedge"]["kind"], "failing", "{second:#}");
    let reason = second["trigger"]["reasons"][0].as_str().unwrap_or("");
    assert!(
        reason.contains("in a row failed") && reason.contains("the pair answers only errors"),
        "{second:#}"
    );
    assert!(
        second["verdict"].as_str().unwrap_or("").starts_with("healthy"),
        "{second:#}"
    );
    println!(
        "router SIGKILLed → {} recovery {}; every KV transfer failing → {} recovery {} (detection {} ms)",
        first["trigger"]["wedge"]["kind"],
        first["verdict"],
        second["trigger"]["wedge"]["kind"],
        second["verdict"],
        second["trigger"]["wedge"]["detection_ms"]
    );
}
