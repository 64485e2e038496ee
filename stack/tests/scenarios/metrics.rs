//! Issue 18: what pdwarden shows where operators already look. The real
//! processes' `/metrics` — the orchestrator's readiness endpoint and the
//! agent's `metrics_listen` — pass `promtool check metrics`, carry the
//! demo's own restart and watch, and the Grafana dashboard in `deploy/`
//! asks only for series they declare.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{HeldDemo, exclusive, poll, watch_of};

/// GET `url`'s body.
fn scrape(url: &str) -> String {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let r = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .get(url)
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        assert_eq!(r.status().as_u16(), 200, "GET {url}");
        let ct = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        assert!(
            ct.starts_with("text/plain; version=0.0.4"),
            "GET {url}: content type {ct:?}"
        );
        r.text().await.unwrap()
    })
}

/// The series names a text exposition declares (`# TYPE`), with the sample
/// names a histogram's declaration stands for.
fn declared(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for rest in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let Some((name, kind)) = rest.split_once(' ') else {
            continue;
        };
        names.insert(name.to_string());
        if kind == "histogram" {
            for suffix in ["_bucket", "_count", "_sum"] {
                names.insert(format!("{name}{suffix}"));
            }
        }
    }
    names
}

/// Every `expr` in a Grafana dashboard JSON, panels and rows nested.
fn expressions(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr", Value::String(e)) => out.push(e.clone()),
                    _ => expressions(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| expressions(x, out)),
        _ => {}
    }
}

/// The `pdwarden_*` series an expression names.
fn series_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("pdwarden_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// Every sample line of a text exposition as (series, value): the series
/// as PromQL writes it (`name{labels}`, verbatim), the first of duplicates.
fn samples(texts: &[&str]) -> Vec<(String, f64)> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for line in texts.iter().flat_map(|t| t.lines()) {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("sample line {line:?}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|e| panic!("{line:?}: {e}")),
        };
        if seen.insert(series.to_string()) {
            out.push((series.to_string(), value));
        }
    }
    out
}

/// The dashboard expressions that return nothing over `series` held
/// steady for ten minutes, as Prometheus itself evaluates them: a
/// `promtool test rules` run per expression, wrapped so that it answers
/// `{} 1` when it has data and `{} 0` when it has none.
fn empty_expressions(series: &[(String, f64)], exprs: &[String]) -> Vec<String> {
    let quote = |s: &str| format!("'{}'", s.replace('\'', "''"));
    let number = |v: f64| match v {
        v if v.is_nan() => "NaN".to_string(),
        v if v == f64::INFINITY => "Inf".to_string(),
        v if v == f64::NEG_INFINITY => "-Inf".to_string(),
        v => format!("{v}"),
    };
    let mut input = String::new();
    for (s, v) in series {
        let values = vec![number(*v); 11].join(" ");
        input += &format!("      - series: {}\n        values: {}\n", quote(s), quote(&values));
    }
    let dir = tempfile::tempdir().unwrap();
    let mut empty = Vec::new();
    for (n, e) in exprs.iter().enumerate() {
        let wrapped = format!("(count({e}) > bool 0) or on() vector(0)");
        let y = format!(
            "rule_files: []\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n{input}    promql_expr_test:\n      - expr: {}\n        eval_time: 10m\n        exp_samples:\n          - labels: '{{}}'\n            value: 1\n",
            quote(&wrapped)
        );
        let file = dir.path().join(format!("expr-{n}.yml"));
        std::fs::write(&file, &y).unwrap();
        let out = std::process::Command::new("promtool")
            .args(["test", "rules"])
            .arg(&file)
            .output()
            .unwrap_or_else(|e| panic!("cannot run promtool ({e}): run scripts/setup-checks.sh"));
        if out.status.success() {
            continue;
        }
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // Only "it answered 0" is an empty panel; anything else (a parse
        // error) is this test's or the expression's fault, said as such.
        assert!(
            said.lines()
                .any(|l| l.trim_start().starts_with("got:") && l.contains("{} 0")),
            "promtool test rules on {e:?}:\n{said}"
        );
        empty.push(e.clone());
    }
    empty
}

#[test]
fn real_metrics_pass_promtool_and_the_dashboard_asks_only_for_them() {
    let _one = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let gpus = dir.path().join("gpus.json");
    // One GPU with every figure NVML gives, a foreign process, and an Xid.
    let file = json!({
        "gpus": [{
            "index": 0, "uuid": "GPU-0", "name": "fake H100",
            "memory_used_bytes": 60u64 << 30, "memory_total_bytes": 80u64 << 30,
            "utilization_gpu_pct": 40, "utilization_memory_pct": 10,
            "temperature_c": 51, "power_draw_mw": 350_000, "power_limit_mw": 700_000,
            "ecc": { "volatile_corrected": 1 }, "retired_pages": 0,
            "remapped_rows": { "correctable": 0 },
            "processes": [{ "pid": 1, "used_memory_bytes": 1u64 << 30 }],
        }],
        "events": [{ "gpu_index": 0, "kind": "xid", "xid": 79, "detail": "fallen off the bus" }],
    });
    std::fs::write(&gpus, file.to_string()).unwrap();
    let demo = HeldDemo::start(&["--gpu-fake", gpus.to_str().unwrap()], Duration::from_secs(180));
    assert!(
        demo.report["verdict"].as_str().unwrap().starts_with("healthy"),
        "{:#}",
        demo.report
    );
    let readiness = demo.report["demo"]["readiness"].as_str().unwrap().to_string();
    let agent = demo.report["demo"]["agent_metrics"].as_str().unwrap().to_string();
    poll("watch healthy", Duration::from_secs(30), || {
        (watch_of(&demo.status())["state"] == "healthy").then_some(())
    });
    let agent_text = poll("the agent's GPU series", Duration::from_secs(30), || {
        let t = scrape(&format!("{agent}/metrics"));
        (t.contains("pdwarden_gpu_events_total{") && t.contains("pdwarden_unit_rss_bytes{")).then_some(t)
    });
    let orch_text = scrape(&format!("{readiness}/metrics"));
    let check = pdwarden_proto::exposition::promtool_check;
    assert_eq!(check(&agent_text), Ok(()), "{agent_text}");
    assert_eq!(check(&orch_text), Ok(()), "{orch_text}");

    // The demo's own restart and the watch, as the orchestrator counts them.
    let verdict = demo.report["verdict"].as_str().unwrap();
    let restart = format!("pdwarden_operation_duration_seconds_count{{kind=\"co_restart\",verdict=\"{verdict}\"}} 1");
    for line in [
        restart.as_str(),
        r#"pdwarden_pair_watch_state{pair="demo",state="healthy"} 1"#,
        r#"pdwarden_pair_watch_state{pair="demo",state="held"} 0"#,
        r#"pdwarden_pair_ready{pair="demo"} 1.0"#,
    ] {
        assert!(orch_text.lines().any(|l| l == line), "missing {line}\n{orch_text}");
    }
    assert!(
        orch_text.contains(&format!(
            "pdwarden_pair_last_verdict{{pair=\"demo\",verdict=\"{verdict}\"}} 1"
        )),
        "{orch_text}"
    );
    assert!(
        orch_text.contains("pdwarden_operation_step_duration_seconds_count{kind=\"co_restart\",step="),
        "{orch_text}"
    );

    // The dashboard: well-formed, and every series it asks for declared.
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/grafana/pdwarden-dashboard.json");
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).expect("the dashboard is JSON");
    assert_eq!(dashboard["uid"], "pdwarden");
    let mut exprs = Vec::new();
    expressions(&dashboard["panels"], &mut exprs);
    assert!(exprs.len() >= 20, "{exprs:?}");
    // Series that exist once their event has happened (a wedge, an
    // automatic recovery, a gate), as the same orchestrator code writes them.
    let after_events = {
        use pdwarden_orchestrator::ops::telemetry::Concluded;
        use pdwarden_orchestrator::ops::watcher::{WatchBoard, WedgeLabels};
        let board = WatchBoard::default();
        board
            .detection
            .get_or_create(&WedgeLabels {
                pair: "demo".into(),
                kind: "stall".into(),
            })
            .observe(9.5);
        for (kind, request_id) in [("co_restart", Some("auto-1")), ("gate", None)] {
            board.operations.concluded(&Concluded {
                kind,
                pair: "demo",
                request_id,
                verdict: "healthy",
                report: &json!({ "total_ms": 1000 }),
            });
        }
        pdwarden_orchestrator::edge::ready::metrics(&board)
    };
    let known: BTreeSet<String> = [&agent_text, &orch_text, &after_events]
        .into_iter()
        .flat_map(|t| declared(t))
        .collect();
    let asked: BTreeSet<String> = exprs.iter().flat_map(|e| series_in(e)).collect();
    let unknown: Vec<&String> = asked.difference(&known).collect();
    assert!(
        unknown.is_empty(),
        "the dashboard asks for series nobody serves: {unknown:?}\nserved: {known:?}"
    );
    // Every panel has data over these series, as Prometheus evaluates it: an
    // expression can name only served series and still answer nothing (a
    // division whose sides' labels differ: the host load panel's
    // `load_average{window="1m"} / host_cpus` did, until `ignoring(window)`).
    let series = samples(&[&agent_text, &orch_text, &after_events]);
    let empty = empty_expressions(&series, &exprs);
    assert!(
        empty.is_empty(),
        "dashboard expressions with no data over the real daemons' series: {empty:#?}"
    );
    // And it shows what matters most: the watch, wedges, recoveries, operations, probes, GPUs.
    for must in [
        "pdwarden_pair_watch_state",
        "pdwarden_pair_held",
        "pdwarden_wedge_detection_seconds_bucket",
        "pdwarden_automatic_recoveries_total",
        "pdwarden_operation_duration_seconds_bucket",
        "pdwarden_watch_probes_total",
        "pdwarden_gate_decisions_total",
        "pdwarden_gpu_utilization_ratio",
    ] {
        assert!(asked.contains(must), "the dashboard does not show {must}");
    }
}
