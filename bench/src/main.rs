//! `pdwarden-bench`: pdwarden's performance table (issue 9), measured in one
//! run and printed with the target beside each figure.
//!
//! Not part of `cargo test`: it takes minutes, and its figures are timings on
//! a shared machine. Every process it starts is stopped by PID before it
//! exits, and all traffic stays on loopback.
//!
//! Layout:
//! - [`lag`]: readiness detection lag against pd-sim's own monotonic record,
//!   beside fixed-interval pollers.
//! - [`scale`]: one orchestrator process, many simulated agents over the real
//!   protocol; CPU, RSS, event and `Status` latency.
//! - [`corestart`]: `restart pd-pair` wall time against the engines' critical path.
//! - [`watch`]: the continuous watch's probe cost and a wedge's time to detect and recover.
//! - [`vllm_watch`]: the same on a real vLLM pair at the README's watch defaults
//!   (opt-in: `--only vllm-watch`; it needs `scripts/setup-vllm.sh`'s stack).
//! - [`vllm_golden`]: the golden output's false alarms over 20 co-restarts of a
//!   real vLLM pair, some under client traffic (opt-in: `--only vllm-golden`).
//! - [`footprint`]: an idle agent's CPU and RSS.
//! - [`judge`]: the change gate's error rates, a Monte Carlo harness over the pure judge.
//! - [`stats`], [`procstat`], [`children`]: distributions, `/proc`, child processes.
//!
//! The binary also re-executes itself as a pd-sim (`pd-sim-jitter`) and as
//! the orchestrator (`orchestrator-child`), so one `cargo run` builds all it needs.

// The benchmark is an edge: it measures wall-clock time (clippy.toml).
#![allow(clippy::disallowed_methods)]

mod children;
mod corestart;
mod footprint;
mod judge;
mod lag;
mod procstat;
mod retention;
mod scale;
mod stats;
mod vllm_golden;
mod vllm_watch;
mod watch;

use std::time::Duration;

use clap::{Parser, Subcommand};

use stats::{fmt_ms, median, p99};

#[derive(Parser)]
#[command(about = "pdwarden's performance table (issue 9)")]
struct Cli {
    /// Small numbers (a smoke test): 12 starts, 100 and 500 agents.
    #[arg(long)]
    quick: bool,
    /// Sections to run, comma-separated: lag, scale, corestart, watch, agent, judge;
    /// and vllm-watch, vllm-golden (the real vLLM tier), retention (a year of a 50-pair
    /// journal): only when named, never by default or --quick.
    #[arg(long, default_value = "lag,scale,corestart,watch,agent,judge", value_delimiter = ',')]
    only: Vec<String>,
    /// The agent footprint's GPU source: `fake` (four fake GPUs, the default),
    /// or `nvml` on a machine with NVIDIA GPUs (the driver's own cost included).
    #[arg(long, default_value = "fake", value_parser = ["fake", "nvml"])]
    agent_gpu_source: String,
    /// Seed for the pollers' random phases and the sampled agents.
    #[arg(long, default_value_t = 9)]
    seed: u64,
    #[command(subcommand)]
    child: Option<ChildCmd>,
}

#[derive(Subcommand)]
enum ChildCmd {
    /// (internal) A pd-sim with a random start-up, for the lag section.
    #[command(hide = true)]
    PdSimJitter {
        #[arg(long)]
        port: u16,
    },
    /// (internal) The orchestrator's `serve` on a free loopback port; prints it.
    #[command(hide = true)]
    OrchestratorChild {
        #[arg(long)]
        dir: std::path::PathBuf,
        /// Listen on this loopback port (0: any free one).
        #[arg(long, default_value_t = 0)]
        port: u16,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match cli.child {
        Some(ChildCmd::PdSimJitter { port }) => rt.block_on(pd_sim_child(port)),
        Some(ChildCmd::OrchestratorChild { dir, port }) => rt.block_on(orchestrator_child(dir, port)),
        None => rt.block_on(table(&cli)),
    }
}

async fn until_sigterm() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

async fn pd_sim_child(port: u16) -> anyhow::Result<()> {
    use clap::Parser as _;
    let args = pd_sim::Args::try_parse_from(lag::pd_sim_args(port))?;
    let config = pd_sim::Config::from_args(args, |k| std::env::var(k).ok())?;
    pd_sim::run(config, until_sigterm()).await?;
    Ok(())
}

async fn orchestrator_child(dir: std::path::PathBuf, port: u16) -> anyhow::Result<()> {
    // Logged like the daemon, to its stderr (a file the parent chose).
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::io::stderr)
        .init();
    let toml = format!(
        "listen = \"127.0.0.1:0\"\njournal = {:?}\n",
        dir.join("journal.sqlite").display().to_string()
    );
    let toml = lag::with_plaintext(toml, |t| {
        pdwarden_orchestrator::config::OrchestratorConfig::from_toml_str(t).is_ok()
    });
    let config = pdwarden_orchestrator::config::OrchestratorConfig::from_toml_str(&toml)?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("{}", listener.local_addr()?);
    pdwarden_orchestrator::edge::server::serve(listener, config, until_sigterm()).await?;
    Ok(())
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

async fn table(cli: &Cli) -> anyhow::Result<()> {
    let want = |s: &str| cli.only.iter().any(|o| o == s);
    let started = std::time::Instant::now();
    println!(
        "pdwarden-bench{} on {} ({} CPUs)",
        if cli.quick { " --quick" } else { "" },
        machine(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );

    if want("lag") {
        let rounds = if cli.quick { 3 } else { 15 };
        eprintln!("lag: {} starts…", rounds * 4);
        let r = lag::run(rounds, cli.seed).await?;
        println!();
        println!(
            "## 1. Readiness detection lag ({} starts, {} failed; pd-sim's CLOCK_MONOTONIC record → pdwarden's event at the orchestrator side)",
            r.starts, r.failed
        );
        println!();
        println!(
            "| transition | pdwarden (20 ms poll) median / p99 | 8 s loop median / p99 | 10 s (k8s) median / p99 | 60 s (router) median / p99 | 8 s ÷ pdwarden (medians) |"
        );
        println!("|---|---|---|---|---|---|");
        for row in &r.rows {
            let pw = median(&row.pdwarden);
            let mut line = format!("| {} | {} / {} |", row.phase, fmt_ms(pw), fmt_ms(p99(&row.pdwarden)));
            for (_, lags) in &row.pollers {
                line.push_str(&format!(" {} / {} |", fmt_ms(median(lags)), fmt_ms(p99(lags))));
            }
            let ratio = median(&row.pollers[0].1) / pw;
            line.push_str(&format!(" {ratio:.0}× |"));
            println!("{line}");
        }
        let m = r.overall_median();
        let eight: Vec<f64> = r.rows.iter().flat_map(|x| x.pollers[0].1.iter().copied()).collect();
        let ratio = median(&eight) / m;
        println!();
        println!(
            "Target: median ≤ 50 ms → {} ({}, p99 {}); ≥ 100× faster than the 8 s loop → {} ({ratio:.0}×). Generation check's own duration: median {}.",
            verdict(m <= 50.0),
            fmt_ms(m),
            fmt_ms(r.overall_p99()),
            verdict(ratio >= 100.0),
            fmt_ms(median(&r.check_ms)),
        );
    }

    if want("retention") {
        let (pairs, every) = if cli.quick { (5, 6) } else { (50, 1) };
        eprintln!("retention: a year of {pairs} pairs, a co-restart every {every} h…");
        let y = retention::run(pairs, every)?;
        println!();
        println!(
            "## Retention: a year of {} pairs, a co-restart every {} h ({} operations written, {:.0} s), SQLite",
            y.pairs, y.every_hours, y.written, y.took_s
        );
        println!(
            "policy: newest {} whole per pair, {} kept in all, {} days",
            y.policy.full_per_pair, y.policy.summaries_per_pair, y.policy.max_age_days
        );
        println!(
            "journal at the end: {} operations, {} entries, {} live ({} per pair)",
            y.size.operations,
            y.size.entries,
            mb(y.size.bytes),
            mb(y.size.bytes / u64::from(y.pairs))
        );
        println!(
            "retention pass (daily): median {}, p99 {}, max {}",
            fmt_ms(median(&y.pass_ms)),
            fmt_ms(p99(&y.pass_ms)),
            fmt_ms(y.pass_ms.iter().copied().fold(0.0, f64::max))
        );
        println!(
            "history PAIR (20): median {}, p99 {}",
            fmt_ms(median(&y.history_ms)),
            fmt_ms(p99(&y.history_ms))
        );
    }

    if want("scale") {
        let sizes: &[(usize, u64, usize)] = if cli.quick {
            &[(100, 5, 10), (500, 5, 10)]
        } else {
            &[(1000, 20, 40), (5000, 20, 40), (10_000, 20, 40)]
        };
        let mut points = Vec::new();
        for &(n, secs, samples) in sizes {
            eprintln!("scale: {n} agents…");
            points.push(scale::run(n, Duration::from_secs(secs), samples, cli.seed).await?);
        }
        println!();
        println!(
            "## 5. Scale (one orchestrator process; simulated agents × 4 units, 4 unit events + 1 GPU snapshot per agent per second, real AgentLink sessions)"
        );
        println!();
        println!(
            "| agents | msgs/s | orchestrator CPU (target ≤ 1 core) | RSS / peak (target ≤ 1 GiB) | event → state p50 / p99 (target p99 ≤ 100 ms) | whole-fleet Status (a summary above 64 hosts) p50 / p99 (target ≤ 200 ms) | one-host Status p50 / p99 | Status size | attach all | re-attach after an orchestrator restart (target ≤ 30 s) | generator CPU |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        for p in &points {
            println!(
                "| {} | {:.0} | {:.2} cores ({}) | {} / {} ({}) | {} / {}{} ({}) | {} / {} ({}) | {} / {} | {:.3} MB | {:.1} s | {} ({}) | {:.2} cores |",
                p.agents,
                p.msgs_per_s,
                p.cores,
                verdict(p.cores <= 1.0),
                mb(p.rss),
                mb(p.hwm),
                verdict(p.hwm <= 1 << 30),
                fmt_ms(median(&p.event_ms)),
                fmt_ms(p99(&p.event_ms)),
                if p.event_lost > 0 {
                    format!(", {} lost", p.event_lost)
                } else {
                    String::new()
                },
                verdict(p99(&p.event_ms) <= 100.0 && p.event_lost == 0),
                fmt_ms(median(&p.status_ms)),
                fmt_ms(p99(&p.status_ms)),
                verdict(p99(&p.status_ms) <= 200.0),
                fmt_ms(median(&p.host_status_ms)),
                fmt_ms(p99(&p.host_status_ms)),
                p.status_bytes as f64 / 1e6,
                p.attach_s,
                p.reattach_s.map_or("not within 120 s".into(), |s| format!("{s:.1} s")),
                verdict(p.reattach_s.is_some_and(|s| s <= 30.0)),
                p.generator_cores,
            );
        }
    }

    if want("judge") {
        let trials = if cli.quick { 10 } else { 400 };
        eprintln!("judge: {trials} simulated gates per scenario…");
        let t = std::time::Instant::now();
        let rows = judge::run(trials, cli.seed);
        println!();
        println!(
            "## 7. Change gate: the judge's error rates ({trials} simulated gates per scenario at `[pair.gate]` defaults: 4 cells, 16 requests a look, up to 48, tolerance 10 %, alpha 0.05; per-request CV 25 % unless the row says otherwise, per-round 10 % at concurrency 4; {:.0} s)",
            t.elapsed().as_secs_f64()
        );
        println!();
        judge::print(&rows);
    }

    if want("corestart") {
        eprintln!("corestart: restart pd-pair, both decode start policies…");
        corestart::print(cli.quick).await;
    }
    if want("watch") {
        let window = Duration::from_secs(if cli.quick { 10 } else { 60 });
        eprintln!(
            "watch: demo stack, idle and traffic windows of {} s, then a wedge…",
            window.as_secs()
        );
        println!();
        println!(
            "## 3–4. Watch: probe cost and wedge time (`pdwarden demo --hold`, serial slot-leaking prefill, default `[pair.watch]`)"
        );
        println!();
        match watch::run(window).await {
            Ok(w) => {
                println!(
                    "| window | real s | engine requests | probes | probe share of engine busy time | probes per engine-hour (simulated) | sessions minted per engine-hour (simulated) |"
                );
                println!("|---|---|---|---|---|---|---|");
                for (name, x) in [("idle", &w.idle), ("steady traffic", &w.traffic)] {
                    println!(
                        "| {name} | {:.0} | {:.0} | {:.0} | {:.2} % ({:.0} of {:.0} simulated ms) | {:.0} | {:.0} |",
                        x.seconds,
                        x.requests,
                        x.probe_requests,
                        x.share_pct(),
                        x.busy_ms_probe,
                        x.busy_ms_total,
                        x.per_unit_hour(x.probe_requests),
                        x.per_unit_hour(x.sessions_minted),
                    );
                }
                let s = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| format!("{v:.1} s"));
                println!();
                println!(
                    "Traffic: {:.1} req/s through the router, {:.0} probes sent meanwhile. Wedge (41,818-token prompt abandoned mid-prefill, slot leaked): client gave up → wedge confirmed {}, → automatic co-restart verified healthy {} (the co-restart itself {}); pd-sim time scale 0.05.",
                    w.traffic_rps,
                    w.probes_under_traffic,
                    s(w.detect_s),
                    s(w.recover_s),
                    s(w.restart_s),
                );
            }
            Err(e) => println!("skipped: {e:#}"),
        }
        eprintln!(
            "watch: {} cases of legitimate long work and of each wedge kind, one demo stack each…",
            pd_sim::watch_cases::CASES.len()
        );
        println!();
        println!(
            "## 4b. Watch: time to detect each wedge kind, and false positives on legitimate long work (`pd_sim::watch_cases`, pd-sim in the SGLang profile, time scale 0.05, the demo's scaled `[pair.watch]`: stall budget 2 s, worst prefill = 50,000 tokens at the prefill's speed)"
        );
        println!();
        println!(
            "| case | expected | automatic co-restarts | confirmed as | from case start | from silence onset | recovery | client requests completed |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        let mut false_positives = 0;
        let mut legit_cases = 0;
        for row in watch::cases().await {
            match row {
                Ok(r) => {
                    let s = |v: Option<f64>| v.map_or("—".to_owned(), |v| format!("{v:.1} s"));
                    let expected = match r.case.expect {
                        pd_sim::watch_cases::Expect::Legitimate => {
                            legit_cases += 1;
                            false_positives += r.recoveries;
                            "legitimate".to_owned()
                        }
                        pd_sim::watch_cases::Expect::Wedge(k) => format!("wedge: {}", k.join(" or ")),
                    };
                    println!(
                        "| {} | {expected} | {} | {} | {} | {} | {} | {} of {} |",
                        r.case.name,
                        r.recoveries,
                        r.kind.as_deref().unwrap_or("—"),
                        s(r.from_start_s),
                        s(r.from_silence_s),
                        r.verdict.as_deref().unwrap_or("—"),
                        r.completed,
                        r.requests,
                    );
                }
                Err(e) => println!("| skipped | | | | | | {e:#} | |"),
            }
        }
        println!();
        println!(
            "**False positives: {false_positives} automatic co-restart(s) over {legit_cases} legitimate long-work cases** (target 0). Target for every wedge kind: confirmed within the stall budget + the worst legitimate prefill from the silence's onset."
        );
    }

    if want("vllm-watch") {
        println!();
        println!(
            "## 4c. Watch on a real vLLM pair: time to detect each fault (issue 31; `pdwarden demo --engine vllm --watch-defaults --hold`, each fault injected at once after a healthy co-restart)"
        );
        println!();
        match vllm_watch::unavailable() {
            Some(reason) => println!("NOT RUN: {reason}"),
            None => {
                eprintln!("vllm-watch: real vLLM demo, engine core frozen, then the whole decode (minutes)…");
                let o = vllm_watch::run().await;
                println!("Watch settings: {}.", vllm_watch::settings());
                if let Some(s) = o.demo_s {
                    println!("The demo's start and co-restart took {s:.0} s.");
                }
                if !o.rows.is_empty() {
                    println!();
                    println!(
                        "| fault | wedge confirmed as | onset → confirmation | freeze → automatic co-restart (target ≤ {:.0} s) | freeze → recovered and verified | recovery |",
                        vllm_watch::TARGET_S
                    );
                    println!("|---|---|---|---|---|---|");
                }
                let s = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| format!("{v:.1} s"));
                for r in &o.rows {
                    println!(
                        "| {} | {} | {} | {} **{}** | {:.1} s | {}{}{} |",
                        r.fault,
                        r.kind.as_deref().unwrap_or("n/a"),
                        s(r.detection_s),
                        s(r.to_corestart_s),
                        verdict(r.to_corestart_s.is_some_and(|t| t <= vllm_watch::TARGET_S)),
                        r.to_recovered_s,
                        r.verdict,
                        if r.automatic { "" } else { ", NOT journaled automatic" },
                        if r.replaced {
                            ", decode replaced"
                        } else {
                            ", decode NOT replaced"
                        },
                    );
                }
                if let Some(e) = &o.error {
                    println!();
                    println!("Stopped early ({} of 2 faults measured): {e}", o.rows.len());
                }
            }
        }
    }

    if want("vllm-golden") {
        println!();
        println!(
            "## 4d. Golden output on a real vLLM pair: false alarms over {} co-restarts (issue 34; `pdwarden demo --engine vllm --hold`, then `restart pd-pair demo` × {}, every {}rd under client traffic)",
            vllm_golden::RESTARTS,
            vllm_golden::RESTARTS,
            vllm_golden::TRAFFIC_EVERY
        );
        println!();
        match vllm_watch::unavailable() {
            Some(reason) => println!("NOT RUN: {reason}"),
            None => {
                eprintln!(
                    "vllm-golden: real vLLM demo, then {} co-restarts (~10-15 min)…",
                    vllm_golden::RESTARTS
                );
                let o = vllm_golden::run().await;
                print_vllm_golden(&o);
            }
        }
    }

    if want("agent") {
        let window = Duration::from_secs(if cli.quick { 5 } else { 30 });
        eprintln!("agent: idle footprint over {} s…", window.as_secs());
        println!();
        let gpus = if cli.agent_gpu_source == "nvml" {
            "NVML on this machine's GPUs"
        } else {
            "fake GPU source with 4 GPUs"
        };
        println!("## 6. Agent footprint (pdwarden-agent, idle: 4 running pd-sims, {gpus}, engine watch at 1 s)");
        println!();
        match footprint::run(window, cli.agent_gpu_source == "nvml").await {
            Ok(f) => println!(
                "RSS {} (peak {}; target ≤ 20 MB → {}), CPU {:.2} % of one core over {:.0} s (target ≤ 0.5 % → {}).",
                mb(f.rss),
                mb(f.hwm),
                verdict(f.rss <= 20 << 20),
                f.cores * 100.0,
                f.window_s,
                verdict(f.cores <= 0.005),
            ),
            Err(e) => println!("skipped: {e:#}"),
        }
    }
    println!();
    println!("(table took {:.0} s)", started.elapsed().as_secs_f64());
    Ok(())
}

/// Section 4d's table and lines.
fn print_vllm_golden(o: &vllm_golden::Outcome) {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    println!(
        "Hardware: {} ({cpus} CPUs); the tiny model on vLLM's CPU backend.",
        machine()
    );
    if let Some(s) = o.demo_s {
        println!(
            "The demo's start and co-restart took {s:.0} s; its output check: `{}`, reference {} tokens.",
            o.demo_outcome.as_deref().unwrap_or("none"),
            o.reference_tokens.map_or("n/a".to_owned(), |n| n.to_string()),
        );
    }
    let streams: Vec<String> = vllm_golden::STREAMS
        .iter()
        .map(|(name, t)| format!("{name} (temperature {t})"))
        .collect();
    println!(
        "Client traffic: {} concurrent streams of chat completions through the router ({}), {} tokens each, for the whole restart.",
        streams.len(),
        streams.join(", "),
        vllm_golden::CLIENT_MAX_TOKENS
    );
    let rows = &o.rows;
    if !rows.is_empty() {
        let count = |f: &dyn Fn(&vllm_golden::Row) -> bool| rows.iter().filter(|r| f(r)).count();
        let mut others: Vec<(String, usize)> = Vec::new();
        for r in rows.iter().filter(|r| !r.healthy() && !r.false_alarm()) {
            match others.iter_mut().find(|(v, _)| *v == r.verdict) {
                Some((_, n)) => *n += 1,
                None => others.push((r.verdict.clone(), 1)),
            }
        }
        let others = if others.is_empty() {
            "0".to_owned()
        } else {
            others
                .iter()
                .map(|(v, n)| format!("{n} `{v}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let alarms = count(&|r| r.false_alarm());
        println!();
        println!(
            "| restarts | with client traffic | healthy | `same` | `near_tie` | false alarms (`diverged` / `unanswered`; target 0) | other verdicts |"
        );
        println!("|---|---|---|---|---|---|---|");
        println!(
            "| {} | {} | {} | {} | {} | {alarms} **{}** | {others} |",
            rows.len(),
            count(&|r| r.traffic.is_some()),
            count(&|r| r.healthy()),
            count(&|r| r.outcome == "same"),
            count(&|r| r.outcome == "near_tie"),
            verdict(alarms == 0),
        );
        println!();
        for r in rows {
            let under = if r.traffic.is_some() { ", under traffic" } else { "" };
            if !r.healthy() || r.false_alarm() {
                println!(
                    "- restart {}{under}: `{}`, output `{}`{}: {}",
                    r.n,
                    r.verdict,
                    r.outcome,
                    r.golden_detail.as_ref().map_or(String::new(), |d| format!(" ({d})")),
                    r.reason.as_deref().unwrap_or("")
                );
            } else if r.outcome == "near_tie" {
                println!(
                    "- restart {}{under}: `{}`, output `near_tie` ({})",
                    r.n,
                    r.verdict,
                    r.golden_detail.as_deref().unwrap_or("")
                );
            }
        }
        let (answered, failed) = rows
            .iter()
            .filter_map(|r| r.traffic)
            .fold((0, 0), |(a, f), t| (a + t.answered, f + t.failed));
        println!(
            "Client requests during the traffic restarts: {answered} answered, {failed} failed (the router is restarted with the pair: refused while it is down)."
        );
        let all: Vec<&vllm_golden::Row> = rows.iter().collect();
        let quiet: Vec<&vllm_golden::Row> = rows.iter().filter(|r| r.traffic.is_none()).collect();
        let busy: Vec<&vllm_golden::Row> = rows.iter().filter(|r| r.traffic.is_some()).collect();
        let d = |rows: &[&vllm_golden::Row]| {
            vllm_golden::durations(rows).map_or("n/a".to_owned(), |(mean, min, max)| {
                format!("{mean:.1} s ({min:.1}–{max:.1} s, {} restarts)", rows.len())
            })
        };
        println!(
            "Co-restart duration (the report's `total_ms`: start-ups, probes, suite and the output check): mean {}; without traffic {}, under traffic {}; the CLI's wall time, mean {:.1} s.",
            d(&all),
            d(&quiet),
            d(&busy),
            rows.iter().map(|r| r.wall_s).sum::<f64>() / rows.len() as f64
        );
    }
    if let Some(e) = &o.error {
        println!();
        println!(
            "Stopped early ({} of {} restarts measured): {e}",
            rows.len(),
            vllm_golden::RESTARTS
        );
    }
}

/// "CPU model, N GiB RAM" from /proc, for the README.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mem = procstat::meminfo_total().map(|b| format!(", {:.0} GiB RAM", b as f64 / (1u64 << 30) as f64));
    format!("{cpu}{}", mem.unwrap_or_default())
}
