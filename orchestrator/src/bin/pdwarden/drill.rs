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
use clap::ValueEnum;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pdwarden_orchestrator::report::OperationReport;
use pdwarden_proto::v1::{RestartUnitRequest, StatusRequest};
use serde_json::{Value, json};

use crate::demo::{Owned, Stack};
use crate::{connect, follow_operation};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Incident {
    /// Row 1: a decode restarted alone against a long-running prefill.
    DecodeAloneRestart,
    /// Row 2: 17.9 s, 106.4 s, 10.5 s, then no answer, called "cold start".
    ColdStartLie,
    /// Row 3: health 200 while every generation hangs.
    ShallowHealth,
    /// Row 4: a serial engine leaks its slot when a client gives up mid-prefill.
    SlotLeak,
    /// A real, small cold start: slow first probe, then warm.
    GenuineColdStart,
}

impl Incident {
    pub fn name(self) -> &'static str {
        match self {
            Self::DecodeAloneRestart => "decode-alone-restart",
            Self::ColdStartLie => "cold-start-lie",
            Self::ShallowHealth => "shallow-health",
            Self::SlotLeak => "slot-leak",
            Self::GenuineColdStart => "genuine-cold-start",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Self::DecodeAloneRestart => {
                "ask for a decode-only restart (pdwarden refuses), then force one behind pdwarden's back and verify the pair (INCIDENTS row 1)"
            }
            Self::ColdStartLie => {
                "after the restart the decode answers in 17.9 s, 106.4 s, 10.5 s, then never (INCIDENTS row 2)"
            }
            Self::ShallowHealth => "health answers 200 while every generation hangs (INCIDENTS row 3)",
            Self::SlotLeak => {
                "a client gives up on a 41,818-token prompt mid-prefill on a serial prefill that leaks its slot; then verify the pair (INCIDENTS row 4)"
            }
            Self::GenuineColdStart => "a genuine cold start: one slow first generation, then warm",
        }
    }

    /// pd-sim flags for the prefill (before any --prefill-sim of the user).
    pub fn prefill_sim(self) -> &'static str {
        match self {
            // Seed 001: 200–330 tok/s prefill, one request at a time.
            Self::SlotLeak => "--serial --leak-slot-on-disconnect --prefill-tok-per-s 250",
            _ => "",
        }
    }

    /// pd-sim flags for the decode (before any --decode-sim of the user).
    pub fn decode_sim(self) -> &'static str {
        match self {
            Self::ColdStartLie => "--cold-first-ms 0 --latency-script 17900,106400,10500,hang",
            Self::ShallowHealth => "--latency-script hang,hang,hang,hang,hang,hang,hang,hang,hang,hang",
            Self::GenuineColdStart => "--cold-first-ms 6000",
            _ => "",
        }
    }
}

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
        println!("drill: {line}");
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
    let url = &stack.orchestrator_url;
    let mut steps = Vec::new();
    // Held until the verification is done; stopped by PID when dropped.
    let mut forced: Option<Owned> = None;
    match incident {
        Incident::DecodeAloneRestart => {
            if !restart.verdict.is_healthy() {
                bail!("the co-restart before the drill was not healthy ({})", restart.verdict);
            }
            let refusal = ask_decode_only_restart(url).await?;
            say(json, &format!("pdwarden restart unit decode-0 → {}", refusal["reason"]));
            steps.push(json!({ "action": "restart unit decode-0", "refused": refusal["refused"], "reason": refusal["reason"] }));
            let (pid, owned) = force_decode_restart(stack).await?;
            say(
                json,
                &format!(
                    "forced a decode-only restart behind pdwarden's back: stopped pid {pid}, started pid {} on the same port",
                    owned.pid()
                ),
            );
            steps.push(
                json!({ "action": "forced decode-only restart", "stopped_pid": pid, "started_pid": owned.pid() }),
            );
            forced = Some(owned);
        }
        Incident::SlotLeak => {
            let abandoned = abandon_long_prompt(stack).await?;
            say(json, &abandoned);
            steps.push(json!({ "action": "client abandoned a long prompt mid-prefill", "detail": abandoned }));
        }
        Incident::ColdStartLie | Incident::ShallowHealth | Incident::GenuineColdStart => return Ok(None),
    }
    say(json, "verifying the pair through the router (pdwarden verify demo)");
    let verify = follow_operation(url, "demo", json, true)
        .await
        .map_err(|e| anyhow::anyhow!(e.0))?;
    drop(forced);
    Ok(Some(FollowUp { steps, verify }))
}

async fn ask_decode_only_restart(url: &str) -> anyhow::Result<Value> {
    let mut client = connect(url).await.map_err(|e| anyhow::anyhow!(e.0))?;
    match client
        .restart_unit(RestartUnitRequest {
            host: String::new(),
            unit: "decode-0".into(),
            request_id: uuid::Uuid::new_v4().to_string(),
        })
        .await
    {
        Ok(_) => bail!("the orchestrator accepted a decode-only restart"),
        Err(s) => Ok(json!({
            "refused": s.code() == tonic::Code::FailedPrecondition,
            "reason": s.message(),
        })),
    }
}

/// Stops the agent's decode by PID and starts another one with the same
/// command line on the same port, as an operator's script would.
async fn force_decode_restart(stack: &Stack) -> anyhow::Result<(u32, Owned)> {
    let mut client = connect(&stack.orchestrator_url)
        .await
        .map_err(|e| anyhow::anyhow!(e.0))?;
    let status: Value = serde_json::from_str(&client.status(StatusRequest {}).await?.into_inner().json)?;
    let pid = status["agents"][0]["units"]
        .as_array()
        .and_then(|u| u.iter().find(|u| u["name"] == "decode-0"))
        .and_then(|u| u["pid"].as_u64())
        .context("decode-0 has no pid in status")? as u32;
    let target = Pid::from_raw(pid as i32);
    kill(target, Signal::SIGTERM).context("stop decode-0")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while kill(target, None).is_ok() {
        if Instant::now() > deadline {
            bail!("decode-0 (pid {pid}) did not exit within 10 s of SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let argv = &stack.plan.decode_argv;
    let owned = crate::demo::spawn_logged(
        "forced-decode",
        std::path::Path::new(&argv[0]),
        &argv[1..],
        stack.dir.path(),
    )?;
    let http = reqwest::Client::new();
    let ready = format!("{}/health_generate", stack.plan.decode_url);
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
            bail!("the forced decode did not pass /health_generate within 60 s");
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
