//! Co-restart overhead: `restart pd-pair` wall time against the critical path
//! of the units' own start-up.
//!
//! Runs the demo (`pdwarden_stack::demo`, what `pdwarden demo --json` runs: the whole local stack: orchestrator, agent,
//! two pd-sims shaped like seed 004's 60 s / 70 s restart at time scale 0.05,
//! and the real sglang-router) once per run and decode start policy, and
//! reads the restart's report. The critical path is taken from the report's
//! timeline: each unit's spawned → generating, in the order the policy
//! imposes (after-prefill-ready: prefill + decode + router; overlap: the
//! slower engine + router), plus the later probes' own latency. What is left
//! of `total_ms` is what pdwarden adds: stopping the old processes, command
//! round trips, step bookkeeping and journaling.
//!
//! The stack's binaries (`pdwarden-orchestrator`, `pdwarden-agent`,
//! `pd-sim`) must be built next to this one; the section says so and is
//! skipped otherwise.

use std::time::Duration;

use serde_json::Value;

use crate::stats::{fmt_ms, median};

/// What one restart's report says, in ms.
struct Run {
    policy: &'static str,
    total: f64,
    critical: f64,
    verdict: String,
}

fn span(report: &Value, role: &str) -> Option<(f64, f64)> {
    let timeline = report["timeline"].as_array()?;
    let at = |phase: &str| {
        timeline
            .iter()
            .filter(|e| e["role"] == role && e["phase"] == phase)
            .filter_map(|e| e["at_ms"].as_f64())
            .next_back()
    };
    Some((at("spawned")?, at("generating")?))
}

fn critical_path(report: &Value, policy: &str) -> Option<f64> {
    let (ps, pg) = span(report, "prefill")?;
    let (ds, dg) = span(report, "decode")?;
    let (rs, rg) = span(report, "router")?;
    let engines = if policy == "overlap" {
        (pg - ps).max(dg - ds)
    } else {
        (pg - ps) + (dg - ds)
    };
    // Probe 1 is the router's readiness generation, already inside rg - rs.
    let probes: f64 = report["probes"]
        .as_array()?
        .iter()
        .filter(|p| p["seq"].as_u64().unwrap_or(0) >= 2)
        .filter_map(|p| p["latency_ms"].as_f64())
        .sum();
    Some(engines + (rg - rs) + probes)
}

async fn one(policy: &'static str) -> anyhow::Result<Run> {
    let args = pdwarden_stack::DemoArgs::from_flags(&["--json", "--decode-start-policy", policy])?;
    // A demo past its time is dropped: its processes are stopped by PID.
    let demo = tokio::time::timeout(
        Duration::from_secs(180),
        pdwarden_stack::demo::start(&args, Default::default()),
    )
    .await?;
    let outcome = demo.outcome.clone();
    demo.stop(false, true);
    if let Some(e) = outcome.error {
        anyhow::bail!("{e}");
    }
    let report: Value = outcome.json;
    let critical = critical_path(&report, policy)
        .ok_or_else(|| anyhow::anyhow!("the {policy} report has no complete timeline: {report}"))?;
    Ok(Run {
        policy,
        total: report["total_ms"].as_f64().unwrap_or(f64::NAN),
        critical,
        verdict: report["verdict"].as_str().unwrap_or("?").to_owned(),
    })
}

pub async fn print(quick: bool) {
    println!();
    println!(
        "## 2. Co-restart overhead (`pdwarden demo`: seed-004-shaped engines, 60 s / 70 s at time scale 0.05, real sglang-router)"
    );
    println!();
    if let Err(e) = pdwarden_stack::process::binary("pdwarden-orchestrator") {
        println!("skipped: {e}");
        return;
    }
    let runs_per_policy = if quick { 1 } else { 3 };
    let mut runs = Vec::new();
    for _ in 0..runs_per_policy {
        for policy in ["after-prefill-ready", "overlap"] {
            match one(policy).await {
                Ok(r) => runs.push(r),
                Err(e) => println!("{policy}: run failed: {e:#}"),
            }
        }
    }
    println!(
        "| decode start policy | runs | wall time (median) | critical path (median) | overhead median / max | overhead ÷ critical path | target ≤ max(1 %, 300 ms) | verdicts |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut walls = Vec::new();
    for policy in ["after-prefill-ready", "overlap"] {
        let rs: Vec<&Run> = runs.iter().filter(|r| r.policy == policy).collect();
        if rs.is_empty() {
            continue;
        }
        let wall = median(&rs.iter().map(|r| r.total).collect::<Vec<_>>());
        let crit = median(&rs.iter().map(|r| r.critical).collect::<Vec<_>>());
        let over: Vec<f64> = rs.iter().map(|r| r.total - r.critical).collect();
        let max_over = over.iter().copied().fold(f64::MIN, f64::max);
        let allowed = (crit * 0.01).max(300.0);
        let verdicts: Vec<&str> = rs.iter().map(|r| r.verdict.as_str()).collect();
        walls.push((policy, wall, crit));
        println!(
            "| {policy} | {} | {} | {} | {} / {} | {:.1} % | {} (allowed {}) | {} |",
            rs.len(),
            fmt_ms(wall),
            fmt_ms(crit),
            fmt_ms(median(&over)),
            fmt_ms(max_over),
            100.0 * median(&over) / crit,
            if max_over <= allowed { "met" } else { "MISSED" },
            fmt_ms(allowed),
            verdicts.join(", "),
        );
    }
    if let (Some(a), Some(o)) = (
        walls.iter().find(|w| w.0 == "after-prefill-ready"),
        walls.iter().find(|w| w.0 == "overlap"),
    ) {
        println!();
        println!(
            "overlap's wall time is {:.1} % above its lower bound (slower engine + router + probes; target ≤ 5 %); after-prefill-ready costs {} ({:.0} %) more than overlap for its safety.",
            100.0 * (o.1 - o.2) / o.2,
            fmt_ms(a.1 - o.1),
            100.0 * (a.1 - o.1) / o.1,
        );
    }
}
