//! Faults (issue 8): the orchestrator killed mid-operation, a unit that
//! crashes at start. Every pair ends in a known state, with the evidence.

use std::time::Duration;

use crate::harness::{demo, exclusive, step_names};

const LIMIT: Duration = Duration::from_secs(240);

/// The orchestrator is SIGKILLed during decode's step; a new one re-reads the
/// journal and its agent, resumes the operation where it was (prefill kept,
/// being generating by the agent's facts) and concludes it — healthy, and
/// saying that it resumed. No second operation is started.
#[test]
fn orchestrator_killed_mid_co_restart_resumes_from_the_journal() {
    let _one = exclusive();
    let out = demo(&["--json", "--incident", "orchestrator-crash"], LIMIT);
    let v = out.json();
    assert_eq!(out.code, 0, "{v:#}\n{}", out.stderr);
    assert!(v["verdict"].as_str().unwrap().starts_with("healthy"), "{v:#}");
    let reasons = v["reasons"].to_string();
    assert!(reasons.contains("resumed after an orchestrator restart"), "{reasons}");
    assert!(reasons.contains("state restarting_decode"), "{reasons}");
    assert_eq!(
        v["report"]["operation_id"], v["operation_id"],
        "the same operation was concluded"
    );
    // The resumed run restarted decode and router, not prefill (kept).
    let steps = step_names(&v["report"]);
    assert_eq!(steps[..3], ["restart-decode", "restart-router", "probe"], "{steps:?}");
    // Issue 14: the decode start the killed orchestrator had sent is
    // adopted, never sent again — one process per unit, by the agent's log.
    assert!(reasons.contains("adopted its own start of decode-0"), "{reasons}");
    one_start_per_unit(&v, "restarting-decode");
}

/// Each unit's process was spawned exactly once during the operation, by
/// the agent's own log (a second spawn is a second model load on a GPU).
fn one_start_per_unit(v: &serde_json::Value, at: &str) {
    let spawned = v["spawned"]
        .as_object()
        .unwrap_or_else(|| panic!("{at}: no spawn counts: {v:#}"));
    for unit in ["prefill-0", "decode-0", "router-0"] {
        assert_eq!(
            spawned.get(unit).and_then(|n| n.as_u64()),
            Some(1),
            "{at}: {unit}: {spawned:?}"
        );
    }
    assert_eq!(v["started_twice"].as_array().map(Vec::len), Some(0), "{at}: {v:#}");
}

/// The orchestrator SIGKILLed in each of the other steps of a co-restart
/// (decode's is the test above):
/// the restarted orchestrator concludes the same operation, resuming at the
/// step in progress (its units before it kept when their agents say they
/// generate) — never a second operation; healthy means every unit generates.
#[test]
fn orchestrator_killed_at_every_step_concludes_the_same_operation() {
    let _one = exclusive();
    for (at, state, first_step) in [
        ("restarting-prefill", "restarting_prefill", "restart-prefill"),
        ("restarting-router", "restarting_router", "restart-router"),
        // Resumed at the probes (the suite runs after them); `probing` itself
        // lasts ~40 ms here, too short to kill in reliably.
        ("verifying", "verifying", "probe"),
    ] {
        let out = demo(&["--json", "--incident", "orchestrator-crash", "--crash-at", at], LIMIT);
        let v = out.json();
        assert_eq!(out.code, 0, "{at}: {v:#}\n{}", out.stderr);
        assert!(v["verdict"].as_str().unwrap().starts_with("healthy"), "{at}: {v:#}");
        let reasons = v["reasons"].to_string();
        assert!(
            reasons.contains("resumed after an orchestrator restart") && reasons.contains(&format!("state {state}")),
            "{at}: {reasons}"
        );
        assert_eq!(
            v["report"]["operation_id"], v["operation_id"],
            "{at}: the same operation"
        );
        let steps = step_names(&v["report"]);
        assert!(
            steps.first().is_some_and(|s| s.starts_with(first_step)),
            "{at}: resumed at {first_step}: {steps:?}"
        );
        one_start_per_unit(&v, at);
    }
}

/// The orchestrator SIGKILLed while a change gate measures a change it made
/// live: the new orchestrator does not leave the change half-done. It takes
/// the gate over from the journal, rolls back to the recorded previous config
/// versions, co-restarts, verifies the old values live and measures the pair
/// back at its journaled baseline; pd-sim agrees the knob was live before the
/// crash and is off after.
#[test]
fn orchestrator_killed_mid_gate_rolls_the_change_back() {
    let _one = exclusive();
    let out = demo(&["--json", "--incident", "orchestrator-crash-mid-gate"], LIMIT);
    let v = out.json();
    assert_eq!(out.code, 0, "{v:#}\n{}", out.stderr);
    assert_eq!(v["verdict"], "interrupted_rolled_back", "{v:#}");
    let knob = |k: &str| -> Vec<bool> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|u| u["knob_live"].as_bool().unwrap())
            .collect()
    };
    assert_eq!(knob("knob_before_crash"), [true, true], "{v:#}");
    assert_eq!(knob("knob_after"), [false, false], "{v:#}");
    let reasons = v["reasons"].to_string();
    assert!(reasons.contains("in state gate_measuring"), "{reasons}");
    // The rollback is held to the baseline the gate measured before its
    // change (journaled by the killed orchestrator): shown equivalent to it,
    // or — on this busy 2-core host the ttft p90 at concurrency 4 of a
    // freshly restarted pair has measured +12 % [+1.5, +27] against a 15.6 %
    // margin — honestly "not shown back"; never "moved", never "verified"
    // without the numbers.
    assert!(
        reasons.contains("run the previous config again (PDW_KNOB absent)")
            && (reasons.contains("every metric is shown within ±10 % of the first baseline")
                || reasons.contains("not shown back within ±10 % of its first baseline")),
        "{reasons}"
    );
    assert!(!reasons.contains("BASELINE MOVED"), "{reasons}");
    let rollback = &v["report"]["rollback_judgement"];
    assert!(
        rollback["comparisons"]
            .as_array()
            .is_some_and(|c| !c.is_empty() && c.iter().all(|c| c["rounds_before"].as_u64() >= Some(8))),
        "measured against the journaled baseline: {rollback:#}"
    );
    let report = &v["report"];
    assert_eq!(report["operation_id"], v["operation_id"], "the same gate was concluded");
    // Measured once per look (up to the budget) after the rollback.
    let steps = step_names(report);
    assert_eq!(
        steps[..4],
        [
            "rolling-back",
            "rollback-restarting",
            "rollback-verifying-live",
            "rollback-measuring"
        ],
        "{report:#}"
    );
    assert!(steps[4..].iter().all(|s| *s == "rollback-measuring"), "{steps:?}");
    for ver in report["versions"].as_array().unwrap() {
        assert_eq!(ver["restored"], ver["previous"], "{report:#}");
    }
    assert!(
        report["rollback_live"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["ok"] == true),
        "{report:#}"
    );
}

/// A unit that exits at start is reported with its exit status and the tail
/// of its log, and the verdict is `failed` with that evidence.
#[test]
fn unit_crashing_at_start_fails_with_exit_status_and_log_tail() {
    let _one = exclusive();
    let out = demo(&["--json", "--prefill-sim", "--no-such-flag"], LIMIT);
    let v = out.json();
    assert_eq!(out.code, 2, "{v:#}");
    assert_eq!(v["verdict"], "failed", "{v:#}");
    let reasons = v["reasons"].to_string();
    assert!(reasons.contains("prefill prefill-0 exited"), "{reasons}");
    assert!(reasons.contains("exit status 2"), "{reasons}");
    assert!(
        reasons.contains("log tail:") && reasons.contains("no-such-flag"),
        "{reasons}"
    );
    assert!(
        crate::harness::at(&v, "decode-0", "spawned").is_none(),
        "nothing started after it"
    );
}
