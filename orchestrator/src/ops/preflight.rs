//! Before an operation touches any unit (issue 16, finding 5): a co-restart
//! that learns at its second step that the decode cannot start has already
//! restarted the prefill and leaves the decode and router stopped. So every
//! agent of the pair must be attached and know its units, and — for an
//! operation that restarts units — every agent is asked whether its units
//! could start now (`PreflightUnits`: the program present and executable,
//! the cwd present, no other process on a stopped unit's ports). Any
//! problem refuses the operation with every reason, nothing touched.

use std::collections::BTreeMap;
use std::time::Duration;

use pdwarden_proto::v1::{Command, PreflightUnits, command};

use crate::config::PairConfig;
use crate::ops::port::{AgentPort, AgentReport};

/// How long an agent has to answer the preflight.
pub const PREFLIGHT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why an operation was refused before it touched anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// An agent of the pair is not attached (the operation may work once it is).
    pub unreachable: bool,
    /// Each problem, naming its unit or agent.
    pub reasons: Vec<String>,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "preflight refused it, nothing was touched: {}",
            self.reasons.join("; ")
        )
    }
}

/// Checks the pair for an operation; `restarts` asks the agents about
/// their units too (a verification only needs them attached).
pub async fn check(agents: &dyn AgentPort, pair: &PairConfig, restarts: bool) -> Result<(), Refusal> {
    let mut by_host: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut reasons = Vec::new();
    let mut unreachable = false;
    for u in pair.prefill.iter().chain(&pair.decode).chain(&pair.router) {
        if !agents.is_connected(&u.host) {
            unreachable = true;
            reasons.push(format!("agent {} (unit {}) is not connected", u.host, u.unit));
        } else if agents.unit(&u.host, &u.unit).is_none() {
            reasons.push(format!(
                "agent {} does not supervise a unit named {}; check the agent's config",
                u.host, u.unit
            ));
        } else {
            by_host.entry(&u.host).or_default().push(&u.unit);
        }
    }
    if restarts {
        let asks = by_host.iter().map(|(host, units)| async move {
            let cmd = Command {
                fencing_token: 0,
                command_id: uuid::Uuid::new_v4().to_string(),
                action: Some(command::Action::Preflight(PreflightUnits {
                    units: units.iter().map(|u| u.to_string()).collect(),
                })),
            };
            let answer = agents
                .ask(host, units[0], cmd, PREFLIGHT_TIMEOUT, |r| match r {
                    AgentReport::Result(r) => Some(r),
                    _ => None,
                })
                .await;
            match answer {
                Ok(r) if r.ok => Vec::new(),
                // An agent older than the preflight knows no such action:
                // it cannot say, which is not a problem of the units.
                Ok(r) if r.error == "command has no action" => Vec::new(),
                Ok(r) => r.error.split("; ").map(str::to_string).collect(),
                Err(e) => vec![format!("agent {host} did not answer the preflight: {e}")],
            }
        });
        reasons.extend(futures::future::join_all(asks).await.into_iter().flatten());
    }
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(Refusal { unreachable, reasons })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::fake_agent::FakePort;
    use crate::ops::fake_agent::rig::{agent, pair};

    #[tokio::test(start_paused = true)]
    async fn every_problem_is_named_and_nothing_is_started() {
        let agent = agent();
        let port = FakePort::default();
        agent.attach(&port).await;
        let pair = pair("after-prefill-ready", "");
        check(&port, &pair, true).await.expect("a startable pair passes");
        agent.cannot_start("decode-0", "decode-0: argv[0] \"/nope\" does not exist");
        agent.cannot_start("router-0", "router-0: cwd /gone is not a directory");
        let r = check(&port, &pair, true).await.unwrap_err();
        assert!(!r.unreachable);
        assert_eq!(
            r.reasons,
            [
                "decode-0: argv[0] \"/nope\" does not exist",
                "router-0: cwd /gone is not a directory"
            ]
        );
        check(&port, &pair, false)
            .await
            .expect("a verification restarts nothing");
        assert!(agent.executed().is_empty());
        port.break_link("h1");
        let r = check(&port, &pair, false).await.unwrap_err();
        assert!(
            r.unreachable && r.reasons[0] == "agent h1 (unit prefill-0) is not connected",
            "{r:?}"
        );
    }
}
