//! `pdwarden demo`: a whole local stack and a real `restart pd-pair`, as a
//! library — the CLI, the benchmark and the scenario tests all call it.
//!
//! [`start`] brings up the stack ([`Stack::start`]), runs the same
//! `restart pd-pair` the CLI runs (or the chosen incident's drill) and
//! returns it running with its outcome; [`Demo::stop`] stops everything it
//! started by PID. The outcome is the CLI's exit code and its `--json`
//! object.

use std::time::Instant;

use pdwarden_client::{Credentials, new_request_id};
use serde_json::json;

use crate::args::Incident;
pub use crate::args::{DemoArgs, DemoEngine, DemoOutcome};
use crate::drill;
use crate::plan::PAIR;
use crate::stack::{Stack, demo_json};

/// A demo that has run: its stack still up (none for the probe-storm drill,
/// which starts its own engines), and its outcome.
pub struct Demo {
    pub stack: Option<Stack>,
    pub outcome: DemoOutcome,
    started: Instant,
}

impl Demo {
    /// Stops everything the demo started; with `keep`, leaves its directory
    /// (configs, logs, journal) and says where. `quiet`: the CLI's `--json`.
    pub fn stop(self, keep: bool, quiet: bool) {
        if let Some(stack) = self.stack {
            if let Some(kept) = stack.stop(keep) {
                pdwarden_client::say_err!("demo: kept {}", kept.display());
            }
            if !quiet {
                pdwarden_client::say!(
                    "demo: stack stopped; {:.1} s in all",
                    self.started.elapsed().as_secs_f64()
                );
            }
        }
    }
}

/// Starts the stack and runs the restart (or the incident's drill); the
/// stack stays up until [`Demo::stop`]. Progress goes to stdout unless
/// `args.json`. `given`: the caller's credentials, used where the demo
/// makes none (`--insecure-plaintext`). A demo that cannot run has
/// stopped whatever it had started.
pub async fn start(args: &DemoArgs, given: Credentials) -> Demo {
    let started = Instant::now();
    let demo = |stack, outcome| Demo {
        stack,
        outcome,
        started,
    };
    if args.incident == Some(Incident::ProbeStorm) {
        return demo(None, probe_storm(args).await);
    }
    if args.incident == Some(Incident::LeaderCrash) {
        return demo(None, leader_crash(args, given).await);
    }
    let mut stack = match Stack::start(args, given).await {
        Ok(s) => s,
        Err(e) => return demo(None, DemoOutcome::could_not_run(format!("demo: {e:#}"))),
    };
    if !args.json {
        pdwarden_client::say!(
            "demo stack in {} (orchestrator {}, logs there); restarting pd-pair `{PAIR}`",
            stack.dir.path().display(),
            stack.connection.url
        );
        if let Some(incident) = args.incident {
            pdwarden_client::say!("drill {}: {}", incident.name(), incident.description());
        }
        pdwarden_client::say!();
    }
    let outcome = match args.incident {
        Some(incident @ (Incident::OrchestratorCrash | Incident::OrchestratorCrashMidGate)) => {
            crash_drill(&mut stack, args, incident).await
        }
        _ if args.shared_router => crate::rolling::under_traffic(&stack, args).await,
        _ if args.rolling => crate::rolling::rolling_under_traffic(&stack, args).await,
        _ => restart(&stack, args).await,
    };
    if outcome.code == 1 {
        stack.stop(args.keep);
        return demo(None, outcome);
    }
    demo(Some(stack), outcome)
}

/// The leader-crash drill (issue 19): its own stack — a real etcd cluster,
/// three orchestrators — started, drilled at `--crash-at`, and stopped.
async fn leader_crash(args: &DemoArgs, given: Credentials) -> DemoOutcome {
    if !args.json {
        pdwarden_client::say!(
            "drill {}: {}\n",
            Incident::LeaderCrash.name(),
            Incident::LeaderCrash.description()
        );
    }
    let mut ha = match crate::ha::HaStack::start(args, given, 2).await {
        Ok(ha) => ha,
        Err(e) => {
            return DemoOutcome::could_not_run(format!(
                "demo: drill leader-crash: {e:#} (it needs etcd and an orchestrator built with the `etcd` feature: scripts/setup-etcd.sh, then cargo build --workspace --bins --features pdwarden-stack/etcd)"
            ));
        }
    };
    if !args.json {
        pdwarden_client::say!(
            "HA stack in {}: etcd {}, orchestrators {}",
            ha.dir.path().display(),
            ha.etcd.client_urls().join(" "),
            ha.orchestrators
                .iter()
                .map(|o| o.url.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    let asked = match ha.leader().await {
        Some((leader, _)) => (leader + 1) % ha.orchestrators.len(),
        None => 0,
    };
    let result = crate::ha::leader_crash(&mut ha, asked, args.crash_at, args.json).await;
    ha.stop(args.keep);
    match result {
        Ok(v) => DemoOutcome {
            code: if v["verdict"].as_str().is_some_and(|s| s.starts_with("healthy"))
                && v["started_twice"].as_array().is_some_and(|a| a.is_empty())
            {
                0
            } else {
                2
            },
            json: v,
            error: None,
        },
        Err(e) => DemoOutcome::could_not_run(format!("demo: drill leader-crash: {e:#}")),
    }
}

/// The probe-storm drill: no pair to restart; three engines, three
/// probing strategies.
async fn probe_storm(args: &DemoArgs) -> DemoOutcome {
    if !args.json {
        pdwarden_client::say!("drill probe-storm: {}\n", Incident::ProbeStorm.description());
    }
    // An hour in 3.6 s at the default storm scale.
    let scale = args.time_scale.unwrap_or(0.001);
    if !(scale > 0.0 && scale <= 1.0) {
        return DemoOutcome::could_not_run(format!("--time-scale must be in (0, 1], got {scale}"));
    }
    match drill::probe_storm(scale, args.json).await {
        Ok(v) => DemoOutcome {
            code: if v["pdwarden_cheapest"] == true { 0 } else { 2 },
            json: v,
            error: None,
        },
        Err(e) => DemoOutcome::could_not_run(format!("demo: drill probe-storm: {e:#}")),
    }
}

async fn crash_drill(stack: &mut Stack, args: &DemoArgs, incident: Incident) -> DemoOutcome {
    let result = if incident == Incident::OrchestratorCrash {
        drill::orchestrator_crash(stack, args.json, args.crash_at).await
    } else {
        drill::orchestrator_crash_mid_gate(stack, args.json).await
    };
    match result {
        Ok(v) => DemoOutcome {
            code: if v["verdict"]
                .as_str()
                .is_some_and(|k| k.starts_with("healthy") || k == "interrupted_rolled_back")
            {
                0
            } else {
                2
            },
            json: v,
            error: None,
        },
        Err(e) => DemoOutcome::could_not_run(format!("demo: drill {}: {e:#}", incident.name())),
    }
}

/// `restart pd-pair demo`, then the incident's follow-up if it has one (a
/// drill may act on the stack after the restart and verify again; its
/// conclusion is then the demo's).
async fn restart(stack: &Stack, args: &DemoArgs) -> DemoOutcome {
    let report = match stack
        .connection
        .follow_printing(PAIR, args.json, None, new_request_id())
        .await
    {
        Ok(r) => r,
        Err(e) => return DemoOutcome::could_not_run(format!("demo: {e}")),
    };
    let mut outcome = DemoOutcome::for_report(&report, serde_json::to_value(&report).unwrap_or_default());
    if let Some(incident) = args.incident {
        match drill::follow_up(incident, stack, &report, args.json).await {
            Ok(Some(follow)) => outcome = DemoOutcome::for_report(&follow.verify, follow.to_json(&report)),
            Ok(None) => {}
            Err(e) => return DemoOutcome::could_not_run(format!("demo: drill {}: {e:#}", incident.name())),
        }
        outcome.json["incident"] = json!(incident.name());
    }
    outcome.json["demo"] = demo_json(stack);
    outcome
}

/// How to reach a held demo, for the line the CLI prints.
pub fn hold_hint(stack: &Stack) -> String {
    format!(
        "pdwarden --orchestrator {}{} status",
        stack.connection.url,
        match &stack.connection.credentials.ca {
            Some(ca) => format!(
                " --ca {} --token $(cat {})",
                ca.display(),
                stack.dir.path().join("pki/token").display()
            ),
            None => String::new(),
        }
    )
}
