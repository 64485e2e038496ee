//! The continuous watch's cost and speed on the demo stack: the probes'
//! share of engine time (idle, then under steady traffic), and a slot-leak
//! wedge's time to detect and to recover, with default `[pair.watch]`.
//!
//! Runs `pdwarden demo --json --hold` with seed 001's serial, slot-leaking
//! prefill (as the watch scenario does), reads each engine's `/sim/stats`
//! before and after each window, and reads the automatic recovery's trigger
//! (`detected_mono_ms`) from `history`. The demo stops everything it started
//! when it gets SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use pd_sim::clock::mono_ms;
use serde_json::{Value, json};

/// `pdwarden demo`'s default time scale.
const DEMO_TIME_SCALE: f64 = 0.05;

/// Seed 001's serial prefill (250 tok/s simulated) that leaks its slot when
/// a client gives up mid-prefill.
const SERIAL_LEAKING_PREFILL: &str = "--serial --leak-slot-on-disconnect --prefill-tok-per-s 250";

/// Engine-side figures of one window, prefill and decode together.
#[derive(Default)]
pub struct Window {
    pub seconds: f64,
    pub requests: f64,
    pub probe_requests: f64,
    pub busy_ms_total: f64,
    pub busy_ms_probe: f64,
    pub sessions_minted: f64,
}

impl Window {
    /// Probe engine time ÷ all engine time, %.
    pub fn share_pct(&self) -> f64 {
        if self.busy_ms_total > 0.0 {
            100.0 * self.busy_ms_probe / self.busy_ms_total
        } else {
            0.0
        }
    }

    /// Per engine and simulated hour: the demo scales the watch's intervals
    /// by its time scale as it does pd-sim's durations.
    pub fn per_unit_hour(&self, v: f64) -> f64 {
        v / 2.0 * 3600.0 / (self.seconds / DEMO_TIME_SCALE)
    }
}

pub struct WatchFigures {
    pub idle: Window,
    pub traffic: Window,
    pub traffic_rps: f64,
    pub probes_under_traffic: f64,
    /// Client gave up → wedge confirmed, and → recovery verified, s.
    pub detect_s: Option<f64>,
    pub recover_s: Option<f64>,
    pub restart_s: Option<f64>,
}

/// The held demo, stopped with SIGTERM (then SIGKILL) on drop.
struct Held {
    child: std::process::Child,
}

impl Drop for Held {
    fn drop(&mut self) {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        for _ in 0..1500 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `pdwarden` CLI aimed at the held demo (with its CA and token where
/// the demo gives them), so the bench speaks whatever the CLI speaks.
struct Cli {
    bin: std::path::PathBuf,
    base: Vec<String>,
}

impl Cli {
    fn new(bin: std::path::PathBuf, demo: &Value) -> anyhow::Result<Self> {
        let url = demo["orchestrator"].as_str().context("demo.orchestrator missing")?;
        let mut base = vec!["--orchestrator".to_owned(), url.to_owned()];
        for key in ["ca", "token"] {
            if let Some(v) = demo[key].as_str() {
                base.push(format!("--{key}"));
                base.push(v.to_owned());
            }
        }
        Ok(Cli { bin, base })
    }

    async fn json(&self, args: &[&str]) -> anyhow::Result<Value> {
        let out = tokio::process::Command::new(&self.bin)
            .args(&self.base)
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await?;
        serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "pdwarden {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).lines().next().unwrap_or("")
            )
        })
    }
}

async fn status(c: &mut Cli) -> anyhow::Result<Value> {
    c.json(&["status", "--json"]).await
}

fn watch_of(status: &Value) -> Value {
    status["watch"]
        .as_array()
        .and_then(|w| w.iter().find(|p| p["pair"] == "demo"))
        .cloned()
        .unwrap_or(Value::Null)
}

fn unit_url(status: &Value, unit: &str) -> anyhow::Result<String> {
    status["agents"][0]["units"]
        .as_array()
        .and_then(|u| u.iter().find(|u| u["name"] == unit))
        .and_then(|u| u["base_url"].as_str())
        .map(str::to_owned)
        .with_context(|| format!("no base_url for {unit}"))
}

async fn stats(http: &reqwest::Client, bases: &[String]) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for b in bases {
        out.push(http.get(format!("{b}/sim/stats")).send().await?.json().await?);
    }
    Ok(out)
}

fn delta(before: &[Value], after: &[Value], seconds: f64) -> Window {
    let sum = |key: &str| -> f64 {
        before
            .iter()
            .zip(after)
            .map(|(b, a)| a[key].as_f64().unwrap_or(0.0) - b[key].as_f64().unwrap_or(0.0))
            .sum()
    };
    Window {
        seconds,
        requests: sum("requests_total"),
        probe_requests: sum("probe_requests"),
        busy_ms_total: sum("busy_ms_total"),
        busy_ms_probe: sum("busy_ms_probe"),
        sessions_minted: sum("sessions_minted"),
    }
}

async fn poll<T>(limit: Duration, mut f: impl AsyncFnMut() -> anyhow::Result<Option<T>>) -> anyhow::Result<T> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = f().await? {
            return Ok(v);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("not within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Starts `pdwarden demo --json --hold` with `extra` flags and returns the
/// held stack and a CLI aimed at it.
async fn start_demo(extra: &[&str]) -> anyhow::Result<(Held, Cli)> {
    let pdwarden: std::path::PathBuf = std::env::current_exe()?
        .parent()
        .map(|d| d.join("pdwarden"))
        .filter(|p| p.is_file())
        .context("`pdwarden` is not built next to this binary (cargo build --release --bins)")?;
    let log = std::env::temp_dir().join(format!("pdwarden-bench-demo-{}.log", std::process::id()));
    let mut child = Command::new(&pdwarden)
        .args(["demo", "--json", "--hold"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("cannot start pdwarden demo")?;
    let stdout = child.stdout.take().context("demo stdout")?;
    let held = Held { child };
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let report = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.starts_with('{'));
        let _ = tx.send(report);
    });
    let tail = || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().rev().take(5).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
    };
    let line = tokio::time::timeout(Duration::from_secs(180), rx)
        .await
        .context("the demo gave no report within 180 s")??
        .with_context(|| format!("the demo exited without a report: {}", tail()))?;
    let _ = std::fs::remove_file(&log);
    let report: Value = serde_json::from_str(&line)?;
    if report["demo"].is_null() {
        bail!(
            "the demo's report has no `demo` object: {}",
            line.chars().take(300).collect::<String>()
        );
    }
    if !report["verdict"].as_str().unwrap_or("").starts_with("healthy") {
        bail!("the demo's restart was not healthy: {}", report["verdict"]);
    }
    let cli = Cli::new(pdwarden, &report["demo"])?;
    Ok((held, cli))
}

pub async fn run(window: Duration) -> anyhow::Result<WatchFigures> {
    let prefill = format!("--prefill-sim={SERIAL_LEAKING_PREFILL}");
    let (held, cli) = start_demo(&["--engines-serial", &prefill]).await?;
    let result = measure(cli, window).await;
    drop(held);
    result
}

/// One watch case's outcome (`pd_sim::watch_cases`).
pub struct CaseRow {
    pub case: &'static pd_sim::watch_cases::WatchCase,
    /// Automatic co-restarts the watch started during the case.
    pub recoveries: usize,
    /// The confirmed wedge's kind (from the journaled trigger).
    pub kind: Option<String>,
    /// From the case's start (faults applied, first request sent) to confirmation, s.
    pub from_start_s: Option<f64>,
    /// From the silence's onset as the judge saw it to confirmation, s.
    pub from_silence_s: Option<f64>,
    /// The automatic co-restart's verdict.
    pub verdict: Option<String>,
    /// Client requests that completed, of all.
    pub completed: usize,
    pub requests: usize,
}

/// Runs every watch case on its own demo stack: legitimate long work (the
/// watch must not recover it) and each wedge kind (it must confirm it).
pub async fn cases() -> Vec<anyhow::Result<CaseRow>> {
    let mut rows = Vec::new();
    for case in pd_sim::watch_cases::CASES {
        rows.push(run_case(case).await.with_context(|| case.name));
    }
    rows
}

async fn run_case(case: &'static pd_sim::watch_cases::WatchCase) -> anyhow::Result<CaseRow> {
    use pd_sim::watch_cases::{Expect, Urls};
    let (held, mut cli) = start_demo(case.demo_args).await?;
    poll(Duration::from_secs(30), async || {
        Ok((watch_of(&status(&mut cli).await?)["state"] == "healthy").then_some(()))
    })
    .await
    .context("the watch did not say healthy after the restart")?;
    let st = status(&mut cli).await?;
    let urls = Urls {
        router: unit_url(&st, "router-0")?,
        prefill: unit_url(&st, "prefill-0")?,
        decode: unit_url(&st, "decode-0")?,
    };
    let started = pd_sim::watch_cases::start(case, &urls, DEMO_TIME_SCALE, Duration::from_secs(90)).await?;
    let onset = started.onset_mono_ms;
    let requests = started.requests.len();
    let mut completed = 0;
    match case.expect {
        Expect::Legitimate => {
            completed = started.outcomes().await.iter().filter(|o| o.completed()).count();
            tokio::time::sleep(Duration::from_secs(4)).await;
        }
        Expect::Wedge(_) => {
            // Ends when a recovery concluded, or after 150 s without one.
            let _ = poll(Duration::from_secs(150), async || {
                let w = watch_of(&status(&mut cli).await?);
                Ok((w["last_recovery"]["verdict"].is_string() && w["state"] == "healthy").then_some(()))
            })
            .await;
        }
    }
    let history = cli.json(&["history", "demo", "--limit", "20", "--json"]).await?;
    let auto: Vec<Value> = history
        .as_array()
        .map(|h| {
            h.iter()
                .filter(|op| op["trigger"]["automatic"] == true)
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    let first = auto.last();
    let row = CaseRow {
        case,
        recoveries: auto.len(),
        kind: first.and_then(|op| op["trigger"]["wedge"]["kind"].as_str().map(str::to_owned)),
        from_start_s: first
            .and_then(|op| op["trigger"]["detected_mono_ms"].as_f64())
            .map(|d| (d - onset) / 1000.0),
        from_silence_s: first
            .and_then(|op| op["trigger"]["wedge"]["detection_ms"].as_f64())
            .map(|ms| ms / 1000.0),
        verdict: first.and_then(|op| op["verdict"].as_str().map(str::to_owned)),
        completed,
        requests,
    };
    drop(held);
    Ok(row)
}

async fn measure(mut control: Cli, window: Duration) -> anyhow::Result<WatchFigures> {
    let http = reqwest::Client::builder().no_proxy().build()?;
    let st = status(&mut control).await?;
    let engines = vec![unit_url(&st, "prefill-0")?, unit_url(&st, "decode-0")?];
    let router = unit_url(&st, "router-0")?;
    poll(Duration::from_secs(30), async || {
        Ok((watch_of(&status(&mut control).await?)["state"] == "healthy").then_some(()))
    })
    .await
    .context("the watch did not say healthy after the restart")?;

    // Idle: nothing but pdwarden touches the engines.
    let before = stats(&http, &engines).await?;
    let t = mono_ms();
    tokio::time::sleep(window).await;
    let idle = delta(&before, &stats(&http, &engines).await?, (mono_ms() - t) / 1000.0);

    // Steady traffic: sequential short chats through the router.
    let before = stats(&http, &engines).await?;
    let t = mono_ms();
    let mut sent = 0u32;
    while mono_ms() - t < window.as_secs_f64() * 1000.0 {
        let body = json!({
            "model": "demo-model",
            "messages": [{"role": "user", "content": format!("real user request number {sent}")}],
            "max_tokens": 16,
        });
        let ok = http
            .post(format!("{router}/v1/chat/completions"))
            .json(&body)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        anyhow::ensure!(ok, "real request {sent} failed");
        sent += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let seconds = (mono_ms() - t) / 1000.0;
    let traffic = delta(&before, &stats(&http, &engines).await?, seconds);

    // The wedge (INCIDENTS row 4): a 41,818-token prompt abandoned after
    // 3 s, mid-prefill, on the serial prefill that leaks its slot.
    let prompt = "tok ".repeat(41_818);
    let body = json!({"model": "demo-model", "messages": [{"role": "user", "content": prompt}], "max_tokens": 16});
    let _ = http
        .post(format!("{router}/v1/chat/completions"))
        .json(&body)
        .timeout(Duration::from_secs(3))
        .send()
        .await;
    let onset = mono_ms();
    let recovered = poll(Duration::from_secs(150), async || {
        let w = watch_of(&status(&mut control).await?);
        Ok((w["last_recovery"]["verdict"].is_string() && w["state"] == "healthy").then_some(w))
    })
    .await
    .context("no automatic recovery concluded")?;
    let rec = &recovered["last_recovery"];
    let history = control.json(&["history", "demo", "--limit", "10", "--json"]).await?;
    let auto = history
        .as_array()
        .and_then(|h| h.iter().find(|op| op["operation_id"] == rec["operation_id"]))
        .cloned()
        .unwrap_or(Value::Null);
    let detected = auto["trigger"]["detected_mono_ms"].as_f64();
    let concluded = rec["concluded_mono_ms"].as_f64();
    Ok(WatchFigures {
        probes_under_traffic: traffic.probe_requests,
        traffic_rps: f64::from(sent) / seconds,
        idle,
        traffic,
        detect_s: detected.map(|d| (d - onset) / 1000.0),
        recover_s: concluded.map(|c| (c - onset) / 1000.0),
        restart_s: auto["report"]["total_ms"].as_f64().map(|ms| ms / 1000.0),
    })
}
