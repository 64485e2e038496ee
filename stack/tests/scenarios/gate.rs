//! The change gate (issue 7) on a real local stack: pd-sim's knob
//! (`--knob-env PDW_KNOB --knob-value on --knob-slowdown F`: with
//! PDW_KNOB=on in its environment at start, every generation is F× slower)
//! on both engines, flipped by `pdwarden gate demo --set-env PDW_KNOB=on`.
//! pd-sim's own `/sim/stats` (`settings.knob_live`) is the ground truth the
//! gate's `/proc` reading is checked against. The judge (issue 17) keeps a
//! change only when every metric is shown not worse beyond its margin; these
//! scenarios cover each of its decisions on the real stack. Issue 34: the
//! greedy answer of the co-restart onto the change is held to the one of the
//! verification before it — pd-sim's `--weights` (its answers are a function
//! of the weights and the prompt) set on the decode changes it; the knob does
//! not.

use std::time::Duration;

use serde_json::Value;

use crate::harness::{HeldDemo, Output, exclusive, reasons, set_faults, step_names};

const LIMIT: Duration = Duration::from_secs(180);

/// The knob, on engines whose decode is twice the demo's default time per
/// token: a benchmark request then takes ~40 ms, so a 15-20 % change is
/// 6-8 ms, well clear of the 1-2.5 ms drift between two runs on a busy
/// 2-core host (the demo's `min_effect_ms` is 3).
fn knob(slowdown: &str) -> String {
    format!("--tpot-ms 24 --knob-env PDW_KNOB --knob-value on --knob-slowdown {slowdown}")
}

/// A held demo whose engines both carry the knob (inactive at first).
fn stack(slowdown: &str, extra: &[&str]) -> HeldDemo {
    stack_with(&knob(slowdown), &knob(slowdown), extra)
}

fn stack_with(prefill_sim: &str, decode_sim: &str, extra: &[&str]) -> HeldDemo {
    let mut args = vec!["--prefill-sim", prefill_sim, "--decode-sim", decode_sim];
    args.extend_from_slice(extra);
    let demo = HeldDemo::start(&args, LIMIT);
    assert!(
        demo.report["verdict"].as_str().unwrap().starts_with("healthy"),
        "{:#}",
        demo.report
    );
    demo
}

fn gate(demo: &HeldDemo) -> (Output, Value) {
    let out = demo.cli_within(&["gate", "demo", "--set-env", "PDW_KNOB=on", "--json"], LIMIT);
    let v = out.json();
    eprintln!("gate report:\n{:#}", v["reasons"]);
    (out, v)
}

/// `settings.knob_live` of each engine, from pd-sim itself.
fn knob_live(demo: &HeldDemo) -> Vec<bool> {
    sim_settings(demo)
        .iter()
        .map(|s| s["knob_live"].as_bool().unwrap())
        .collect()
}

/// Each engine's pd-sim settings (`/sim/stats`), prefill first.
fn sim_settings(demo: &HeldDemo) -> Vec<Value> {
    let status = demo.cli(&["status", "--json"]).json();
    let urls: Vec<String> = status["agents"][0]["units"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["role"] != "router")
        .map(|u| u["base_url"].as_str().unwrap().to_string())
        .collect();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let c = reqwest::Client::new();
        let mut out = Vec::new();
        for u in urls {
            let v: Value = c
                .get(format!("{u}/sim/stats"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            out.push(v["settings"].clone());
        }
        out
    })
}

/// The rollback's measurement against the first baseline (issue 17: shown
/// equivalent, every interval within ±the rollback tolerance). On a quiet
/// host it is "rollback verified". On a busy 2-core CI host the noisiest
/// statistic (ttft p90 at concurrency 4: four streams, the router and both
/// engines on two CPUs) can keep an interval wider than the margin for the
/// whole budget — CI once measured the rollback −8.9 % [−34.1, −2.8] against
/// a 15.6 % margin: better, but not *shown* equivalent. The gate then says
/// so, honestly; that is accepted here only after the whole budget and with
/// nothing shown beyond the margin (which would be a moved baseline).
fn assert_rollback_measured(v: &Value) {
    let r = reasons(v);
    if r.contains("rollback verified") {
        return;
    }
    assert!(
        r.contains("not shown back within ±"),
        "neither verified nor honestly not shown: {v:#}"
    );
    let rj = &v["rollback_judgement"];
    assert_eq!(
        rj["look"], rj["max_looks"],
        "gave up before the end of the budget: {v:#}"
    );
    assert!(
        rj["comparisons"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["finding"] != "regression" && c["finding"] != "better"),
        "{v:#}"
    );
}

/// Issue 34: the knob changes speed, not output — the greedy answer with it
/// is the baseline's token for token, and the report says so without a
/// reason about the output.
fn assert_output_unchanged(v: &Value) {
    assert_eq!(v["output"]["outcome"], "compared", "{v:#}");
    assert_eq!(v["output"]["check"]["outcome"], "same", "{:#}", v["output"]);
    let r = reasons(v);
    assert!(!r.contains("OUTPUT CHANGED") && !r.contains("output changed"), "{r}");
}

/// A knob that slows generation by 20 % is rejected and rolled back; the
/// rollback is verified from /proc (the knob absent again, config version 0)
/// and by a measurement back at baseline; pd-sim agrees the knob is off.
/// The knob does not change the greedy answer: no output reason.
#[test]
fn slowing_knob_is_rejected_and_rolled_back() {
    let _one = exclusive();
    let demo = stack("1.2", &[]);
    let (out, v) = gate(&demo);
    assert_eq!(out.code, 2, "{v:#}");
    assert_eq!(v["verdict"], "rejected_rolled_back", "{v:#}");
    assert_eq!(v["judgement"]["judgement"], "regressed", "{v:#}");
    assert_output_unchanged(&v);
    let r = reasons(&v);
    assert!(r.contains("regression beyond the margin"), "{r}");
    assert_rollback_measured(&v);
    assert!(r.contains("PDW_KNOB absent"), "{r}");
    assert!(v["live"].as_array().unwrap().iter().all(|c| c["ok"] == true), "{v:#}");
    assert!(
        v["rollback_live"].as_array().unwrap().iter().all(|c| c["ok"] == true),
        "{v:#}"
    );
    for ver in v["versions"].as_array().unwrap() {
        assert_eq!(
            (
                ver["previous"].as_u64(),
                ver["applied"].as_u64(),
                ver["restored"].as_u64()
            ),
            (Some(0), Some(1), Some(0))
        );
    }
    assert_eq!(knob_live(&demo), [false, false]);
    let history = demo.cli(&["history", "demo", "--json"]).json();
    assert_eq!(history[0]["kind"], "gate");
    assert_eq!(history[0]["verdict"], "rejected_rolled_back");
    let text = demo.cli(&["history", "demo"]).stdout;
    assert!(text.contains("e2e p50") && text.contains("regression beyond"), "{text}");
}

/// A knob that speeds generation up by 15 % is accepted and stays live.
///
/// On a quiet host, always. On a busy 2-core CI host the noisiest statistic
/// (ttft p90 at concurrency 4, as in [`assert_rollback_measured`]) can keep
/// its interval wider than its margin for the whole budget: CI (2026-12-03)
/// measured 22.9 → 24.2 ms, +5.7 % [CI −17.5, +27.2] against a 13.1 %
/// margin after 3 of 3 looks, while the other 27 comparisons showed the
/// speed-up. The judge must not call that "not worse" — it is not shown —
/// so the gate rolls back, which is the product being right. That outcome
/// is accepted here only with its evidence: the whole budget spent, the
/// speed-up itself shown ("better beyond the margin"), nothing shown worse,
/// every inconclusive comparison a tail statistic (p90/p99: never a
/// centre), and the knob off again on both engines.
#[test]
fn speeding_knob_is_accepted() {
    let _one = exclusive();
    let demo = stack("0.85", &[]);
    let (out, v) = gate(&demo);
    assert!(reasons(&v).contains("better beyond the margin"), "{v:#}");
    let j = &v["judgement"];
    let findings = j["comparisons"].as_array().unwrap();
    assert!(findings.iter().all(|c| c["finding"] != "regression"), "{v:#}");
    if v["verdict"] == "accepted" {
        assert_eq!(out.code, 0, "{v:#}");
        assert!(v["rollback_live"].as_array().unwrap().is_empty());
        assert_eq!(knob_live(&demo), [true, true]);
        return;
    }
    assert_eq!(v["verdict"], "inconclusive_rolled_back", "{v:#}");
    assert_eq!(out.code, 2, "{v:#}");
    assert_eq!(j["judgement"], "inconclusive", "{v:#}");
    assert_eq!(j["look"], j["max_looks"], "gave up before the end of the budget: {v:#}");
    let open: Vec<&Value> = findings.iter().filter(|c| c["finding"] == "inconclusive").collect();
    assert!(!open.is_empty(), "{v:#}");
    assert!(
        open.iter().all(|c| c["statistic"] == "p90" || c["statistic"] == "p99"),
        "a centre statistic left open by a 15 % speed-up: {v:#}"
    );
    assert_rollback_measured(&v);
    assert_eq!(knob_live(&demo), [false, false]);
}

/// A launcher that strips the variable (`env -u PDW_KNOB pd-sim …`): the
/// agent's config says PDW_KNOB=on, the process never got it. The gate fails
/// at the verification step, from /proc, before measuring anything, and
/// rolls back.
#[test]
fn knob_the_process_never_received_fails_verification() {
    let _one = exclusive();
    let demo = stack("1.2", &["--engine-wrapper", "env -u PDW_KNOB"]);
    let (out, v) = gate(&demo);
    assert_eq!(out.code, 2, "{v:#}");
    assert_eq!(v["verdict"], "not_live_rolled_back", "{v:#}");
    let r = reasons(&v);
    assert!(r.contains("not live in the restarted processes"), "{r}");
    assert!(r.contains("has PDW_KNOB=absent in /proc/"), "{r}");
    assert!(v["judgement"].is_null(), "nothing measured after the change: {v:#}");
    let steps = step_names(&v);
    assert!(!steps.contains(&"measuring"), "{steps:?}");
    assert_eq!(knob_live(&demo), [false, false]);
}

/// A knob with no effect is never rejected (never blamed for a slowdown):
/// every metric shown within its margin and kept, "not a win" — or, where
/// the host's noise keeps some interval across the margin, inconclusive
/// after the *whole* budget and rolled back, saying so — or, where the host
/// itself drifted during the gate, the baseline measured again after the
/// rollback shows the drift and the gate says BASELINE MOVED instead of
/// blaming the knob (issue 17, point 4).
/// (CI once rejected this no-op: one slow concurrency round counted as four
/// independent samples and made a +26 % ttft p90 look certain; rounds are
/// now the sampling unit. A later CI run measured ttft p90 at concurrency 4
/// 18.3 ms → 25.5 ms after the change and 31.5 ms after the rollback, the
/// knob off: a host slowing down, which the gate named as such.)
///
/// Issue 47 item 5: production is never quiet, and a client's stream can
/// fail once while the gate measures. The first benchmark request after the
/// change (pd-faultproxy in front of the decode, aimed at the benchmark's
/// prompt once the knob is live) ends with an error event: one failure of
/// the after-measurement's requests against none before. The judge compared
/// raw counts (0 < 1: `Regressed`); as rates the test cannot show a rise,
/// the gate measures again and, not shown by its last look, says it and does
/// not count it. The no-op is still never rejected.
#[test]
fn change_inside_the_noise_is_never_rejected() {
    let _one = exclusive();
    let demo = stack("1.0", &["--decode-proxy", ""]);
    let proxy = demo.report["demo"]["decode_proxy"]
        .as_str()
        .expect("demo.decode_proxy")
        .to_string();
    let decode = demo.unit_url("decode-0");
    // Armed once the decode runs with the knob: the next benchmark request
    // is the after-measurement's (the verification around the change asks
    // with other prompts).
    let armed = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let client = reqwest::Client::new();
        let live = || {
            rt.block_on(async {
                let r = client.get(format!("{decode}/sim/stats")).send().await.ok()?;
                r.json::<Value>().await.ok()
            })
            .is_some_and(|v| v["settings"]["knob_live"] == true)
        };
        for _ in 0..3_000 {
            if live() {
                set_faults(
                    &proxy,
                    r#"{"error_event_after": 2, "times": 1, "match_body": "measure the pair"}"#,
                );
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    });
    let (out, v) = gate(&demo);
    assert!(armed.join().unwrap(), "the knob never went live: {v:#}");
    let j = &v["judgement"];
    println!(
        "a no-op with one transient failure after it: {} — failures {} of {} after, {} of {} before",
        v["verdict"], j["failures_after"], j["requests_after"], j["failures_before"], j["requests_before"]
    );
    assert_eq!(
        j["failures_after"], 1,
        "the transient landed in the after-measurement: {v:#}"
    );
    assert_eq!(j["failures_worse"], false, "{v:#}");
    assert!(
        reasons(&v).contains("not counted against the change (a transient)"),
        "{}",
        reasons(&v)
    );
    assert_output_unchanged(&v);
    let j = &v["judgement"];
    let comparisons = j["comparisons"].as_array().unwrap();
    let no_regression = || assert!(comparisons.iter().all(|c| c["finding"] != "regression"), "{v:#}");
    match v["verdict"].as_str().unwrap() {
        "kept_not_worse" => {
            assert_eq!(out.code, 0);
            assert!(reasons(&v).contains("kept, not a win"), "{v:#}");
            assert!(comparisons.iter().all(|c| c["finding"] == "not_worse"), "{v:#}");
            assert_eq!(knob_live(&demo), [true, true]);
        }
        "inconclusive_rolled_back" => {
            no_regression();
            assert_eq!(out.code, 2);
            assert_eq!(
                j["look"], j["max_looks"],
                "gave up only at the end of the budget: {v:#}"
            );
            let r = reasons(&v);
            assert!(r.contains("inconclusive"), "{r}");
            assert!(!r.contains("BASELINE MOVED"), "{r}");
            assert_eq!(knob_live(&demo), [false, false]);
        }
        "baseline_moved_rolled_back" => {
            // Only with the evidence: the pair without the knob measured
            // beyond the margin of its first baseline.
            assert_eq!(out.code, 2);
            let r = reasons(&v);
            assert!(r.starts_with("BASELINE MOVED"), "{r}");
            let rj = &v["rollback_judgement"];
            assert!(
                rj["failures_worse"] == true
                    || rj["comparisons"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|c| c["finding"] == "regression" || c["finding"] == "better"),
                "{v:#}"
            );
            assert_eq!(knob_live(&demo), [false, false]);
        }
        other => panic!("a no-op knob ended {other}: {v:#}"),
    }
}

/// A tail-only regression: with the knob, one decode in five is twice as
/// slow, the median untouched (mild enough for the co-restart's own verdict
/// to pass: a 3× tail on both engines already failed it). The old judge's
/// Mann–Whitney test hardly saw it; p90 has its own interval here, so the
/// change is never kept (shown worse, or still not shown within the margin
/// when the budget runs out: rolled back either way).
#[test]
fn tail_only_regression_is_never_kept() {
    let _one = exclusive();
    let tail = format!("{} --knob-tail-every 5", knob("2.0"));
    let demo = stack_with(&knob("1.0"), &tail, &[]);
    let (out, v) = gate(&demo);
    let verdict = v["verdict"].as_str().unwrap();
    assert!(
        ["rejected_rolled_back", "inconclusive_rolled_back"].contains(&verdict),
        "{v:#}"
    );
    assert_eq!(out.code, 2, "{v:#}");
    let comparisons = v["judgement"]["comparisons"].as_array().unwrap();
    assert!(
        comparisons
            .iter()
            .filter(|c| c["statistic"] == "p90" && c["metric"] == "e2e")
            .all(|c| c["finding"] != "not_worse"),
        "{v:#}"
    );
    assert_rollback_measured(&v);
    assert_eq!(knob_live(&demo), [false, false]);
}

/// The host drifts, not the knob: a no-op knob, but from the gate's
/// co-restart on every modelled duration is 1.4× (pd-sim's
/// `--host-load-file`, which the test writes once the decode engine has
/// started again). The change looks like a regression; the
/// baseline measured again after the rollback shows the same slowdown
/// without the knob, so the gate does not blame it:
/// `baseline_moved_rolled_back`, saying to look at the host.
#[test]
fn drift_between_baselines_is_not_blamed_on_the_knob() {
    let _one = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let load = dir.path().join("host-load");
    let starts = dir.path().join("decode-starts");
    let base = format!("{} --host-load-file {}", knob("1.0"), load.display());
    let decode = format!(
        "{base} --cold-first-ms-by-start 0 --start-count-file {}",
        starts.display()
    );
    let demo = stack_with(&base, &decode, &[]);
    // The gate's own co-restart starts the decode once more.
    let count = |p: &std::path::Path| -> u64 {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    };
    let before_gate = count(&starts);
    assert!(before_gate >= 1, "pd-sim counts its starts");
    let watcher = {
        let (starts, load) = (starts.clone(), load.clone());
        std::thread::spawn(move || {
            for _ in 0..6000 {
                if count(&starts) > before_gate {
                    std::fs::write(&load, "1.4").unwrap();
                    return true;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            false
        })
    };
    let (out, v) = gate(&demo);
    assert!(watcher.join().unwrap(), "the decode was never restarted: {v:#}");
    assert_eq!(v["verdict"], "baseline_moved_rolled_back", "{v:#}");
    assert_eq!(out.code, 2, "{v:#}");
    let r = reasons(&v);
    assert!(r.starts_with("BASELINE MOVED"), "{r}");
    assert!(r.contains("look at the host"), "{r}");
    assert_ne!(v["judgement"]["judgement"], "not_worse", "{v:#}");
    assert_eq!(knob_live(&demo), [false, false], "rolled back all the same");
}

/// The batching cap the real-engine tier gates on the real decode
/// (`--max-num-seqs 1`, `vllm::a_real_knob_is_measured_rejected_and_rolled_back`),
/// on pd-sim: `--max-running 1` (at most one generation at a time, the rest
/// queue) set on the decode alone with `--set-arg`.
#[test]
fn batching_cap_on_the_decode_is_rejected_and_rolled_back() {
    let _one = exclusive();
    let (code, v) = batching_cap_on_the_decode();
    assert_batching_cap_rejected(code, &v, "--max-running");
}

/// The pd-sim run of the batching-cap gate: its exit code and report. The
/// caller holds [`exclusive`].
pub fn batching_cap_on_the_decode() -> (i32, Value) {
    let demo = stack("1.0", &[]);
    let out = demo.cli_within(
        &[
            "gate",
            "demo",
            "--set-arg",
            "--max-running=1",
            "--unit",
            "decode-0",
            "--json",
        ],
        LIMIT,
    );
    let v = out.json();
    eprintln!("gate report:\n{:#}", v["reasons"]);
    (out.code, v)
}

/// What the gate must conclude about a batching cap on the decode, on
/// pd-sim and on the real vLLM decode alike: shown worse, rejected, rolled
/// back, the change and the rollback each checked live in the restarted
/// process's argv (`flag` present, then gone). Shown worse either by the
/// benchmark (a regression on some metric) or, earlier, by the co-restart
/// onto the change: the suite's concurrency check ("lost batching") puts
/// the pair over its budget — which one gets there first is the host's
/// timing (CI's 2-core host, 2026-12-02), the conclusion is the same.
pub fn assert_batching_cap_rejected(code: i32, v: &Value, flag: &str) {
    assert_eq!(v["verdict"], "rejected_rolled_back", "{v:#}");
    assert_eq!(code, 2, "{v:#}");
    let by_benchmark = v["judgement"]["comparisons"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["finding"] == "regression"));
    let by_suite = v["judgement"].is_null() && {
        let first = v["reasons"][0].as_str().unwrap_or("");
        first.contains("ended over_budget") && first.contains("lost batching")
    };
    assert!(by_benchmark || by_suite, "{v:#}");
    let live = v["live"].as_array().unwrap();
    assert!(!live.is_empty() && live.iter().all(|c| c["ok"] == true), "{v:#}");
    assert!(live.iter().any(|c| c["observed"].to_string().contains(flag)), "{v:#}");
    let rollback_live = v["rollback_live"].as_array().unwrap();
    assert!(
        !rollback_live.is_empty() && rollback_live.iter().all(|c| c["ok"] == true),
        "{v:#}"
    );
}

/// Issue 34 through the real sglang-router: the decode set onto other
/// weights (`--set-arg --weights=tiny-v2`, pd-sim's checkpoint identity) —
/// a "knob" that changes what the model computes. The co-restart onto it
/// comes back healthy (a new config fingerprint has no reference of its
/// own), but its greedy answer is held to the one of the verification
/// before the change: they differ from the first token, clearly — rejected
/// for the output, rolled back, not measured, the first reason naming the
/// change with the judge's evidence; the decode is back on its weights.
#[test]
fn a_change_of_the_greedy_answer_is_rejected_and_rolled_back() {
    let _one = exclusive();
    let demo = stack("1.0", &[]);
    let out = demo.cli_within(
        &[
            "gate",
            "demo",
            "--set-arg",
            "--weights=tiny-v2",
            "--unit",
            "decode-0",
            "--json",
        ],
        LIMIT,
    );
    let v = out.json();
    eprintln!("gate report:\n{:#}", v["reasons"]);
    assert_eq!(out.code, 2, "{v:#}");
    assert_eq!(v["verdict"], "output_changed_rolled_back", "{v:#}");
    let output = &v["output"];
    assert_eq!(output["outcome"], "compared", "{v:#}");
    assert_eq!(output["check"]["outcome"], "diverged", "{output:#}");
    assert_eq!(output["check"]["position"], 0, "{output:#}");
    assert_eq!(output["allowed"], false, "{output:#}");
    let ops = v["operations"].as_array().unwrap();
    let child = |purpose: &str| {
        ops.iter()
            .find(|o| o["purpose"] == purpose)
            .map(|o| o["operation_id"].clone())
            .unwrap_or_else(|| panic!("no {purpose} child: {v:#}"))
    };
    assert_eq!(output["before_operation"], child("baseline"), "{v:#}");
    assert_eq!(output["after_operation"], child("restart"), "{v:#}");
    assert_eq!(
        output["check"]["reference_operation"],
        child("baseline"),
        "the baseline verification's answer is the reference"
    );
    let first = v["reasons"][0].as_str().unwrap();
    assert!(
        first.starts_with("OUTPUT CHANGED by the change (--weights tiny-v2, live in decode-0 pid ")
            && first.contains("WRONG OUTPUT: the greedy answer differs from the reference")
            && first.contains("at token 0"),
        "{first}"
    );
    assert!(v["judgement"].is_null(), "not measured after the change: {v:#}");
    let steps = step_names(&v);
    assert!(!steps.contains(&"measuring"), "{steps:?}");
    let live = v["live"].as_array().unwrap();
    assert!(
        !live.is_empty() && live.iter().all(|c| c["ok"] == true),
        "the change shown live before it is blamed: {v:#}"
    );
    assert!(
        live.iter().any(|c| c["observed"].to_string().contains("--weights")),
        "{v:#}"
    );
    let rollback_live = v["rollback_live"].as_array().unwrap();
    assert!(
        !rollback_live.is_empty() && rollback_live.iter().all(|c| c["ok"] == true),
        "{v:#}"
    );
    assert_rollback_measured(&v);
    let weights: Vec<Value> = sim_settings(&demo).iter().map(|s| s["weights"].clone()).collect();
    assert_eq!(weights, ["tiny-v1", "tiny-v1"], "the decode back on its weights");
    let text = demo.cli(&["history", "demo"]).stdout;
    assert!(text.contains("OUTPUT CHANGED"), "{text}");
}
