//! `pdwarden demo --incident NAME`: replays one incident of INCIDENTS.md on
//! the local stack, so an operator can see what pdwarden sees and concludes
//! before it happens in production.
//!
//! pd-sim reproduces each mechanism (it never knows what verdict is
//! expected, DESIGN.md 7); this module only chooses its flags and, for the
//! incidents that happen to a pair already in service, acts on the stack
//! after the restart and verifies the pair again.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pdwarden_model::report::OperationReport;
use pdwarden_proto::v1::{RestartUnitRequest, StatusRequest};
use serde_json::{Value, json};

use pdwarden_client::{Connection, new_request_id};

pub use crate::args::{CrashAt, Incident};
use crate::process::Owned;
use crate::stack::Stack;

/// What a drill did after the restart, and the verification that concluded it.
pub struct FollowUp {
    steps: Vec<Value>,
    pub verify: OperationReport,
}

impl FollowUp {
    /// The drill's `--json` object: its conclusion at the top, with the
    /// restart, what was done to the stack, and the verification.
    pub fn to_json(&self, restart: &OperationReport) -> Value {
        json!({
            "verdict": self.verify.verdict,
            "reasons": self.verify.reasons,
            "restart": restart,
            "actions": self.steps,
            "verify": self.verify,
        })
    }
}

fn say(json: bool, line: &str) {
    if !json {
        pdwarden_client::say!("drill: {line}");
    }
}

/// Acts on the stack after the restart, for the incidents that happen to a
/// pair in service; `None` for those whose restart is the whole story.
pub async fn follow_up(
    incident: Incident,
    stack: &Stack,
    restart: &OperationReport,
    json: bool,
) -> anyhow::Result<Option<FollowUp>> {
    let url = &stack.connection;
    let mut steps = Vec::new();
    // Held until the verification is done; stopped by PID when dropped.
    let mut forced: Option<Owned> = None;
    match incident {
        Incident::DecodeAloneRestart | Incident::PrefillAloneRestart => {
            if !restart.verdict.is_healthy() {
                bail!("the co-restart before the drill was not healthy ({})", restart.verdict);
            }
            let (role, unit, argv) = if incident == Incident::DecodeAloneRestart {
                ("decode", "decode-0", &stack.plan.decode_argv)
            } else {
                ("prefill", "prefill-0", &stack.plan.prefill_argv)
            };
            let refusal = ask_unit_restart(url, unit).await?;
            say(json, &format!("pdwarden restart unit {unit} → {}", refusal["reason"]));
            steps.push(json!({ "action": format!("restart unit {unit}"), "refused": refusal["refused"], "reason": refusal["reason"] }));
            let (pid, owned) = force_unit_restart(stack, unit, argv).await?;
            say(
                json,
                &format!(
                    "forced a {role}-only restart behind pdwarden's back ({unit}): stopped pid {pid}, started pid {} on the same port",
                    owned.pid()
                ),
            );
            steps.push(json!({ "action": format!("forced {role}-only restart"), "unit": unit, "stopped_pid": pid, "started_pid": owned.pid() }));
            forced = Some(owned);
        }
        Incident::SlotLeak => {
            let abandoned = abandon_long_prompt(stack).await?;
            say(json, &abandoned);
            steps.push(json!({ "action": "client abandoned a long prompt mid-prefill", "detail": abandoned }));
        }
        Incident::ColdStartLie
        | Incident::ShallowHealth
        | Incident::GenuineColdStart
        | Incident::ProbeStorm
        | Incident::OrchestratorCrash
        | Incident::OrchestratorCrashMidGate
        | Incident::LeaderCrash => {
            return Ok(None);
        }
    }
    say(json, "verifying the pair through the router (pdwarden verify demo)");
    let verify = url
        .follow_printing("demo", json, Some(false), new_request_id())
        .await
        .map_err(|e| anyhow::anyhow!(e.0))?;
    drop(forced);
    Ok(Some(FollowUp { steps, verify }))
}

async fn ask_unit_restart(url: &Connection, unit: &str) -> anyhow::Result<Value> {
    let mut client = url.connect().await.map_err(|e| anyhow::anyhow!(e.0))?;
    match client
        .restart_unit(RestartUnitRequest {
            host: String::new(),
            unit: unit.into(),
            request_id: uuid::Uuid::new_v4().to_string(),
        })
        .await
    {
        Ok(_) => bail!("the orchestrator accepted a {unit}-only restart"),
        Err(s) => Ok(json!({
            "refused": s.code() == tonic::Code::FailedPrecondition,
            "reason": s.message(),
        })),
    }
}

/// Stops the agent's `unit` by PID and starts another one with the same
/// command line on the same port, as an operator's script would, then waits
/// until it passes its own `/health_generate`.
async fn force_unit_restart(stack: &Stack, unit: &str, argv: &[String]) -> anyhow::Result<(u32, Owned)> {
    let mut client = stack.connection.connect().await.map_err(|e| anyhow::anyhow!(e.0))?;
    let status: Value = serde_json::from_str(&client.status(StatusRequest::default()).await?.into_inner().json)?;
    let found = status["agents"][0]["units"]
        .as_array()
        .and_then(|u| u.iter().find(|u| u["name"] == unit))
        .with_context(|| format!("{unit} not in status"))?;
    let pid = found["pid"]
        .as_u64()
        .with_context(|| format!("{unit} has no pid in status"))? as u32;
    let base_url = found["base_url"].as_str().unwrap_or_default().to_string();
    let target = Pid::from_raw(pid as i32);
    kill(target, Signal::SIGTERM).with_context(|| format!("stop {unit}"))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while kill(target, None).is_ok() {
        if Instant::now() > deadline {
            bail!("{unit} (pid {pid}) did not exit within 10 s of SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let name = if unit.starts_with("decode") {
        "forced-decode"
    } else {
        "forced-prefill"
    };
    let owned = crate::process::spawn_logged(name, std::path::Path::new(&argv[0]), &argv[1..], stack.dir.path())?;
    let http = reqwest::Client::new();
    let ready = format!("{base_url}/health_generate");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ok = http
            .get(&ready)
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ok {
            break;
        }
        if Instant::now() > deadline {
            bail!("the forced {unit} did not pass /health_generate within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((pid, owned))
}

/// Seed 001: a 41,818-token prompt whose client gives up mid-prefill (its
/// timeout is shorter than the prefill at ~250 tok/s).
async fn abandon_long_prompt(stack: &Stack) -> anyhow::Result<String> {
    const PROMPT_TOKENS: usize = 41_818;
    let prompt = "tok ".repeat(PROMPT_TOKENS);
    let give_up_after = stack.plan.scaled(60_000);
    let body = json!({
        "model": "demo-model",
        "messages": [{ "role": "user", "content": prompt }],
        "max_tokens": 16,
    });
    let started = Instant::now();
    let res = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", stack.plan.router_url))
        .json(&body)
        .timeout(give_up_after)
        .send()
        .await;
    match res {
        Err(e) if e.is_timeout() => Ok(format!(
            "a client sent a {PROMPT_TOKENS}-token prompt through the router and gave up after {:.2} s, mid-prefill",
            started.elapsed().as_secs_f64()
        )),
        Err(e) => bail!("the long prompt failed before the client gave up: {e}"),
        Ok(r) => bail!(
            "the long prompt was answered ({}) before the client gave up; the drill needs a slower prefill",
            r.status()
        ),
    }
}

/// One probing strategy of the probe-storm drill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProbeStrategy {
    /// A fresh prompt every probe (seed 000's monitor).
    FreshPrompt,
    /// Two prompts, alternating (they evict each other's cached prefix).
    AlternatingPrompts,
    /// pdwarden: one fixed prompt, probe-tagged, sent by the agent's probe code.
    Pdwarden,
}

impl ProbeStrategy {
    fn name(self) -> &'static str {
        match self {
            Self::FreshPrompt => "naive: fresh prompt each probe",
            Self::AlternatingPrompts => "naive: two alternating prompts",
            Self::Pdwarden => "pdwarden: one fixed prompt",
        }
    }
}

/// Probe-storm figures (INCIDENTS row 5), simulated units.
const STORM_PROBES: u32 = 60;
const STORM_INTERVAL_SIM_MS: u64 = 60_000;
/// Probe prompts long enough that their prefill shows (seed 000's probes
/// carried a long system prompt).
const STORM_PROMPT_WORDS: usize = 1_500;

fn storm_prompt(tag: &str) -> String {
    format!("{tag} {}", "context ".repeat(STORM_PROMPT_WORDS))
}

/// Runs the probe-storm drill: three identical engines with sessions, one
/// strategy each, the same probe rate over the same simulated hour; returns
/// the `--json` object (and prints the table unless `json`). Every engine it
/// starts is stopped by PID before it returns.
pub async fn probe_storm(time_scale: f64, json: bool) -> anyhow::Result<Value> {
    let pd_sim = crate::process::binary("pd-sim")?;
    let dir = tempfile::Builder::new().prefix("pdwarden-probe-storm-").tempdir()?;
    let strategies = [
        ProbeStrategy::FreshPrompt,
        ProbeStrategy::AlternatingPrompts,
        ProbeStrategy::Pdwarden,
    ];
    let mut engines = Vec::new();
    for (i, _) in strategies.iter().enumerate() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let args: Vec<String> = [
            "--role",
            "decode",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--model",
            "demo-model",
            "--ttft-ms",
            "120",
            "--tpot-ms",
            "12",
            "--prefill-tok-per-s",
            "2000",
            "--session-prefix-tokens",
            "4096",
            "--session-idle-timeout-ms",
            "3600000",
            "--stall-per-session-ms",
            "500",
            "--time-scale",
            &time_scale.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let names = ["storm-engine-0", "storm-engine-1", "storm-engine-2"];
        let owned = crate::process::spawn_logged(names[i], &pd_sim, &args, dir.path())?;
        engines.push((owned, format!("http://127.0.0.1:{port}")));
    }
    let http = pdwarden_agent::checks::http_client();
    for (_, url) in &engines {
        wait_healthy(&http, url).await?;
    }
    let interval = Duration::from_secs_f64(STORM_INTERVAL_SIM_MS as f64 * time_scale / 1000.0);
    let timeout = Duration::from_secs(30);
    let fixed = pdwarden_proto::v1::ChatProbe {
        model: "demo-model".into(),
        prompt: storm_prompt("pdwarden readiness probe: reply with one word."),
        max_tokens: 1,
        greedy: false,
    };
    // The three strategies probe side by side on one schedule.
    let mut tick = tokio::time::interval(interval);
    for n in 0..STORM_PROBES {
        tick.tick().await;
        let sends = strategies.iter().zip(&engines).map(|(strategy, (_, url))| {
            let http = http.clone();
            let mut chat = fixed.clone();
            match strategy {
                ProbeStrategy::FreshPrompt => {
                    chat.prompt = storm_prompt(&format!("health check {}:", uuid::Uuid::new_v4()))
                }
                ProbeStrategy::AlternatingPrompts => {
                    chat.prompt = storm_prompt(if n % 2 == 0 {
                        "health check A:"
                    } else {
                        "health check B:"
                    })
                }
                ProbeStrategy::Pdwarden => {}
            }
            let url = url.clone();
            let strategy = *strategy;
            async move {
                if strategy == ProbeStrategy::Pdwarden {
                    pdwarden_agent::checks::chat_probe(&http, &url, &chat, timeout).await;
                    return;
                }
                // A naive monitor: untagged, so its probes hide among real traffic.
                let sent = http
                    .post(format!("{url}/v1/chat/completions"))
                    .json(&json!({
                        "model": chat.model,
                        "messages": [{ "role": "user", "content": chat.prompt }],
                        "max_tokens": chat.max_tokens,
                    }))
                    .timeout(timeout)
                    .send()
                    .await;
                if let Ok(answer) = sent {
                    let _ = answer.bytes().await;
                }
            }
        });
        // Engine cost is read from the engines' own stats below; wall-clock
        // latency at this time scale is mostly HTTP overhead, so it is not reported.
        futures::future::join_all(sends).await;
    }
    let mut rows = Vec::new();
    for (i, strategy) in strategies.iter().enumerate() {
        let stats: Value = http
            .get(format!("{}/sim/stats", engines[i].1))
            .send()
            .await?
            .json()
            .await?;
        rows.push(json!({
            "strategy": strategy.name(),
            "probes": STORM_PROBES,
            "sessions_minted": stats["sessions_minted"],
            "sessions_live": stats["sessions_live"],
            "busy_ms_total": stats["busy_ms_total"],
            "busy_ms_probe": stats["busy_ms_probe"],
            "probe_requests": stats["probe_requests"],
            "busy_ms_per_probe": stats["busy_ms_total"].as_f64().map(|b| b / f64::from(STORM_PROBES)),
        }));
    }
    for (mut owned, _) in engines {
        owned.stop(Duration::from_secs(5));
    }
    let busy = |i: usize| rows[i]["busy_ms_total"].as_f64().unwrap_or(f64::MAX);
    let minted = |i: usize| rows[i]["sessions_minted"].as_u64().unwrap_or(u64::MAX);
    let pdwarden_cheapest = minted(2) <= 1 && busy(2) < busy(0) && busy(2) < busy(1);
    let conclusion = format!(
        "over one simulated hour at 1 probe/min, pdwarden's fixed prompt minted {} session(s) and used {:.0} ms of engine time; a fresh prompt each minted {} and used {:.0} ms ({:.1}×); two alternating prompts minted {} and used {:.0} ms ({:.1}×)",
        minted(2),
        busy(2),
        minted(0),
        busy(0),
        busy(0) / busy(2).max(1.0),
        minted(1),
        busy(1),
        busy(1) / busy(2).max(1.0)
    );
    if !json {
        pdwarden_client::say!(
            "{:<34} {:>8} {:>10} {:>14} {:>12}",
            "strategy",
            "probes",
            "sessions",
            "engine ms",
            "ms/probe"
        );
        for r in &rows {
            pdwarden_client::say!(
                "{:<34} {:>8} {:>10} {:>14.0} {:>12.0}",
                r["strategy"].as_str().unwrap_or(""),
                STORM_PROBES,
                r["sessions_minted"].as_u64().unwrap_or(0),
                r["busy_ms_total"].as_f64().unwrap_or(0.0),
                r["busy_ms_per_probe"].as_f64().unwrap_or(0.0)
            );
        }
        pdwarden_client::say!("\n{conclusion}");
    }
    Ok(json!({
        "incident": "probe-storm",
        "simulated_hour": true,
        "time_scale": time_scale,
        "strategies": rows,
        "pdwarden_cheapest": pdwarden_cheapest,
        "conclusion": conclusion,
    }))
}

async fn wait_healthy(http: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ok = http
            .get(format!("{url}/health"))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ok {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("engine {url} not healthy within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `url` until the running co-restart of pair `demo` has journaled
/// state `at` (for decode's step: until the new decode is loading); its
/// operation id and decode-0's phase then. Shared by the orchestrator-crash
/// drill and the HA scenarios (which kill a leader there).
pub async fn reached(url: &Connection, at: CrashAt, limit: Duration) -> anyhow::Result<(String, String)> {
    let deadline = Instant::now() + limit;
    // One connection for the whole watch: a state like `probing` lasts tens
    // of milliseconds at this time scale, less than a TLS handshake per poll.
    let mut watcher = None;
    loop {
        if Instant::now() > deadline {
            bail!("the co-restart never reached state {}", at.state());
        }
        if watcher.is_none() {
            watcher = url.connect().await.ok();
        }
        if let Some(client) = watcher.as_mut()
            && let Ok(reply) = client
                .history(pdwarden_proto::v1::HistoryRequest {
                    pair: "demo".into(),
                    limit: 1,
                    ..Default::default()
                })
                .await
            && let Ok(status) = client.status(StatusRequest::default()).await
        {
            let history: Value = serde_json::from_str(&reply.into_inner().json)?;
            let status: Value = serde_json::from_str(&status.into_inner().json)?;
            let running = history
                .as_array()
                .and_then(|h| h.first())
                .filter(|r| r["ended_unix_ms"].is_null() && r["state"] == at.state())
                .and_then(|r| r["operation_id"].as_str())
                .map(str::to_string);
            let decode = status["agents"][0]["units"]
                .as_array()
                .and_then(|u| u.iter().find(|u| u["name"] == "decode-0"))
                .and_then(|u| u["phase"].as_str())
                .unwrap_or("")
                .to_string();
            // In decode's step, wait until the new decode is loading.
            let loading = matches!(decode.as_str(), "spawned" | "refused" | "http_503");
            if let Some(op) = running
                && (at != CrashAt::RestartingDecode || loading)
            {
                return Ok((op, decode));
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The orchestrator-crash drill: starts `restart pd-pair`, SIGKILLs the
/// orchestrator once the operation's journaled state is `at` (for decode's
/// step: once the new decode is loading), starts a new orchestrator on the
/// same journal, and waits for the operation to be concluded by it. Returns
/// the `--json` object: the operation's final report from the journal, with
/// what was done.
pub async fn orchestrator_crash(stack: &mut Stack, json: bool, at: CrashAt) -> anyhow::Result<Value> {
    let url = stack.connection.clone();
    // The agent's own log is the ground truth of what it spawned: where it
    // stands before the operation begins.
    let agent_log = stack.dir.path().join("agent.log");
    let log_before = std::fs::metadata(&agent_log).map_or(0, |m| m.len());
    // Follow the restart in the background; its stream breaks with the kill.
    let follower = {
        let url = url.clone();
        tokio::spawn(async move { url.follow_printing("demo", true, None, new_request_id()).await })
    };
    let (operation_id, decode_phase) = reached(&url, at, Duration::from_secs(120)).await?;
    let (old_pid, new_pid) = stack.crash_and_restart_orchestrator()?;
    say(
        json,
        &format!(
            "SIGKILLed the orchestrator (pid {old_pid}) during operation {operation_id} in state {}, decode-0 {decode_phase}; started a new one (pid {new_pid})",
            at.state()
        ),
    );
    follower.abort();
    // The new orchestrator re-reads the journal and its agents, then concludes.
    let record = wait_concluded(
        &url,
        &operation_id,
        "the operation concluded by the restarted orchestrator",
        Duration::from_secs(120),
    )
    .await?;
    let report = record["report"].clone();
    let spawned = spawns_since(&agent_log, log_before);
    let twice = spawned_more_than_once(&spawned);
    if !json {
        for r in report["reasons"].as_array().into_iter().flatten() {
            pdwarden_client::say!("drill: {}", r.as_str().unwrap_or(""));
        }
        pdwarden_client::say!(
            "drill: processes spawned during the operation (agent log): {}",
            spawned
                .iter()
                .map(|(u, n)| format!("{u} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        if !twice.is_empty() {
            pdwarden_client::say!(
                "drill: WARNING: a unit was started twice in one operation ({}): a second model load",
                twice.join(", ")
            );
        }
        pdwarden_client::say!("drill: operation {operation_id} concluded {}", report["verdict"]);
    }
    Ok(json!({
        "incident": "orchestrator-crash",
        "operation_id": operation_id,
        "verdict": report["verdict"],
        "reasons": report["reasons"],
        "spawned": spawned,
        "started_twice": twice,
        "actions": [
            { "action": "SIGKILL orchestrator", "pid": old_pid, "state": at.state(), "decode_phase": decode_phase },
            { "action": "started orchestrator", "pid": new_pid },
        ],
        "report": report,
    }))
}

/// Per unit, how many processes the agent spawned after byte `from` of its
/// log (its `unit event` lines with `phase=Spawned`).
pub fn spawns_since(log: &std::path::Path, from: u64) -> std::collections::BTreeMap<String, u64> {
    let text = std::fs::read(log).unwrap_or_default();
    let tail = String::from_utf8_lossy(text.get(from as usize..).unwrap_or_default());
    let mut out = std::collections::BTreeMap::new();
    for line in tail
        .lines()
        .filter(|l| l.contains("unit event") && l.contains("phase=Spawned"))
    {
        if let Some(unit) = line.split_whitespace().find_map(|w| w.strip_prefix("unit=")) {
            *out.entry(unit.to_string()).or_insert(0) += 1;
        }
    }
    out
}

/// "UNIT spawned N times" for each unit of `spawns_since` spawned more than
/// once: a second model load in one operation.
pub fn spawned_more_than_once(spawned: &std::collections::BTreeMap<String, u64>) -> Vec<String> {
    spawned
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(u, n)| format!("{u} spawned {n} times"))
        .collect()
}

/// Waits until operation `operation_id` of pair `demo` has ended; its record.
async fn wait_concluded(url: &Connection, operation_id: &str, what: &str, limit: Duration) -> anyhow::Result<Value> {
    wait_history(url, what, limit, |h| {
        h.as_array()?
            .iter()
            .find(|r| r["operation_id"] == operation_id && !r["ended_unix_ms"].is_null())
            .cloned()
    })
    .await
}

/// Polls `history demo` until `found` picks a record out of it.
async fn wait_history(
    url: &Connection,
    what: &str,
    limit: Duration,
    found: impl Fn(&Value) -> Option<Value>,
) -> anyhow::Result<Value> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(mut client) = url.connect().await
            && let Ok(reply) = client
                .history(pdwarden_proto::v1::HistoryRequest {
                    pair: "demo".into(),
                    limit: 5,
                    ..Default::default()
                })
                .await
        {
            let history: Value = serde_json::from_str(&reply.into_inner().json)?;
            if let Some(hit) = found(&history) {
                return Ok(hit);
            }
        }
        if Instant::now() > deadline {
            bail!("{what}: not seen within {} s", limit.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `settings.knob_live` of each engine, from pd-sim itself (the ground truth
/// the gate's /proc reading is checked against).
async fn knob_live(url: &Connection) -> anyhow::Result<Vec<Value>> {
    let mut client = url.connect().await.map_err(|e| anyhow::anyhow!(e.0))?;
    let status: Value = serde_json::from_str(&client.status(StatusRequest::default()).await?.into_inner().json)?;
    let http = reqwest::Client::new();
    let mut out = Vec::new();
    for u in status["agents"][0]["units"].as_array().into_iter().flatten() {
        if u["role"] == "router" {
            continue;
        }
        let stats: Value = http
            .get(format!("{}/sim/stats", u["base_url"].as_str().unwrap_or_default()))
            .send()
            .await?
            .json()
            .await?;
        out.push(json!({ "unit": u["name"], "knob_live": stats["settings"]["knob_live"], "pid": u["pid"] }));
    }
    Ok(out)
}

/// The mid-gate drill: `gate demo --set-env PDW_KNOB=on`; once the gate is
/// measuring (the change applied, the pair restarted onto it and verified
/// live), SIGKILL the orchestrator and start a new one on the same journal;
/// wait for it to conclude the gate. Returns the `--json` object with the
/// gate's final report and pd-sim's own word on whether the knob is live.
pub async fn orchestrator_crash_mid_gate(stack: &mut Stack, json: bool) -> anyhow::Result<Value> {
    let url = stack.connection.clone();
    // A pair in service first: the gate measures a healthy pair.
    let restart = url
        .follow_printing("demo", true, None, new_request_id())
        .await
        .map_err(|e| anyhow::anyhow!(e.0))?;
    if !restart.verdict.is_healthy() {
        bail!("the co-restart before the gate was not healthy ({})", restart.verdict);
    }
    say(json, &format!("pair up: {}; gating PDW_KNOB=on", restart.verdict));
    let gate = {
        let mut client = url.connect().await.map_err(|e| anyhow::anyhow!(e.0))?;
        let request = pdwarden_proto::v1::GatePairRequest {
            pair: "demo".into(),
            request_id: new_request_id(),
            set_env: [("PDW_KNOB".to_string(), "on".to_string())].into(),
            ..Default::default()
        };
        let mut stream = client.gate_pair(request).await?.into_inner();
        // Drained in the background; it breaks with the kill.
        tokio::spawn(async move { while let Ok(Some(_)) = stream.message().await {} })
    };
    let running = wait_history(&url, "the gate measuring its change", Duration::from_secs(180), |h| {
        h.as_array()?
            .iter()
            .find(|r| r["kind"] == "gate" && r["ended_unix_ms"].is_null() && r["state"] == "gate_measuring")
            .cloned()
    })
    .await?;
    let operation_id = running["operation_id"].as_str().unwrap_or_default().to_string();
    let live_before = knob_live(&url).await?;
    let (old_pid, new_pid) = stack.crash_and_restart_orchestrator()?;
    gate.abort();
    say(
        json,
        &format!(
            "SIGKILLed the orchestrator (pid {old_pid}) while gate {operation_id} measured its change (knob live: {}); started a new one (pid {new_pid})",
            live_before
                .iter()
                .map(|k| k["knob_live"].to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    let record = wait_concluded(
        &url,
        &operation_id,
        "the gate concluded by the new orchestrator",
        Duration::from_secs(180),
    )
    .await?;
    let live_after = knob_live(&url).await?;
    let report = record["report"].clone();
    if !json {
        for r in report["reasons"].as_array().into_iter().flatten() {
            pdwarden_client::say!("drill: {}", r.as_str().unwrap_or(""));
        }
        pdwarden_client::say!("drill: gate {operation_id} concluded {}", report["verdict"]);
    }
    Ok(json!({
        "incident": "orchestrator-crash-mid-gate",
        "operation_id": operation_id,
        "verdict": report["verdict"],
        "reasons": report["reasons"],
        "knob_before_crash": live_before,
        "knob_after": live_after,
        "actions": [
            { "action": "SIGKILL orchestrator", "pid": old_pid, "gate_state": "gate_measuring" },
            { "action": "started orchestrator", "pid": new_pid },
        ],
        "report": report,
    }))
}
