//! What `pdwarden status` and `history` carry: the orchestrator fills
//! these, serves them as JSON, and the CLI reads them back typed (issue 33:
//! they were `Serialize`-only and read as raw JSON, with "?" wherever a
//! field was not where expected).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::gate::report::GateReport;
use crate::report::OperationReport;
pub use crate::watch::PairWatchView;

/// How this orchestrator is secured, shown by `status` (issue 8).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SecurityView {
    pub transport: TransportView,
    pub operator_auth: OperatorAuth,
    /// Set whenever anything runs without protection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// The orchestrator's transport, as `status` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransportView {
    MutualTls,
    InsecurePlaintext,
}

/// How operators are authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperatorAuth {
    Tokens,
    None,
}

/// `pdwarden status --json` (the wire's view: the CLI reads it back typed).
#[derive(Debug, Serialize, Deserialize)]
pub struct StatusView {
    pub agents: Vec<AgentStatus>,
    pub pairs: Vec<PairStatus>,
    /// What in the hosts' GPU reports needs a look, critical first.
    pub findings: Vec<crate::judge::findings::HostFinding>,
    /// The continuous watch of each watched pair (state, readiness, breaker).
    pub watch: Vec<PairWatchView>,
    /// Whether this orchestrator acts: `sole` (SQLite), `leader` (with its
    /// fencing token) or `follower` (with the leader's URL and why).
    pub leadership: Role,
    /// The journal this orchestrator reads and writes (`sqlite:PATH` or `etcd:URLS`).
    pub journal: String,
    /// Why the journal could not be read for this answer (the pairs'
    /// operations are then not shown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_unreadable: Option<String>,
    /// Transport and operator authentication (issue 8).
    pub security: SecurityView,
    /// The whole fleet in numbers (issue 36), whatever `agents` lists.
    #[serde(default)]
    pub fleet: FleetSummary,
    /// A follower's answer: the leader's view as it published it to the
    /// shared store, this old (issue 36).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published: Option<Published>,
}

/// How old the leader's published view a follower answered with is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    pub age_ms: i64,
}

/// Above this many hosts a whole-fleet `status` lists in full only the
/// hosts that need a look (issue 36: 10,000 hosts made 30 MB of JSON per
/// call); `--detail` or `--host` gives the rest.
pub const SUMMARY_ABOVE_HOSTS: usize = 64;
/// At most this many hosts in full in a summary (the rest counted).
pub const SUMMARY_MAX_HOSTS: usize = 100;
/// At most this many findings in any `status` (critical first; the rest counted).
pub const MAX_FINDINGS: usize = 500;

/// The fleet in numbers, and what a summarised `status` left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetSummary {
    pub hosts: u64,
    pub connected: u64,
    pub unknown: u64,
    pub disconnected: u64,
    pub units: u64,
    /// Units by phase (`generating`, `healthy`, `exited`, …).
    pub units_by_phase: std::collections::BTreeMap<String, u64>,
    pub gpus: u64,
    pub findings: u64,
    /// Hosts that need no look, not listed under `agents` (a summary).
    pub hosts_omitted: u64,
    /// Findings beyond `MAX_FINDINGS`, not listed.
    pub findings_omitted: u64,
}

impl AgentStatus {
    /// Whether a summary lists this host in full: its link is not live, or
    /// one of its units is neither generating nor healthy (or stopped on
    /// purpose).
    pub fn needs_a_look(&self) -> bool {
        self.state != AgentState::Connected
            || self
                .units
                .iter()
                .any(|u| !matches!(u.phase.as_str(), "generating" | "healthy" | "stopped"))
    }
}

/// Summarises `agents` (every host) and `findings` as a whole-fleet
/// `status` shows them: the counts always; with `summarise`, only the
/// hosts that need a look (or have a finding), at most
/// [`SUMMARY_MAX_HOSTS`], and at most [`MAX_FINDINGS`] findings. Pure.
pub fn summarise(
    agents: &mut Vec<AgentStatus>,
    findings: &mut Vec<crate::judge::findings::HostFinding>,
    summarise: bool,
) -> FleetSummary {
    let mut f = FleetSummary {
        hosts: agents.len() as u64,
        findings: findings.len() as u64,
        ..Default::default()
    };
    for a in agents.iter() {
        match a.state {
            AgentState::Connected => f.connected += 1,
            AgentState::Unknown => f.unknown += 1,
            AgentState::Disconnected => f.disconnected += 1,
        }
        f.units += a.units.len() as u64;
        for u in &a.units {
            *f.units_by_phase.entry(u.phase.clone()).or_default() += 1;
        }
        f.gpus += a.host_report.as_ref().map_or(0, |r| r.gpus.len() as u64);
    }
    if findings.len() > MAX_FINDINGS {
        f.findings_omitted = (findings.len() - MAX_FINDINGS) as u64;
        findings.truncate(MAX_FINDINGS);
    }
    if summarise && agents.len() > SUMMARY_ABOVE_HOSTS {
        let flagged: std::collections::BTreeSet<&str> = findings.iter().map(|x| x.host.as_str()).collect();
        let before = agents.len();
        let mut kept: Vec<AgentStatus> = std::mem::take(agents)
            .into_iter()
            .filter(|a| a.needs_a_look() || flagged.contains(a.host.as_str()))
            .collect();
        kept.truncate(SUMMARY_MAX_HOSTS);
        f.hosts_omitted = (before - kept.len()) as u64;
        *agents = kept;
    }
    f
}

#[derive(Debug, Serialize, Deserialize)]
pub struct PairStatus {
    pub name: String,
    pub running_operation: Option<String>,
    pub last_operation: Option<String>,
    pub last_verdict: Option<String>,
    /// The last operation ended but its conclusion is not written yet (the
    /// journal's disk refused it): retried, the pair free once it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_error: Option<PendingConclusion>,
}

/// What `status` shows about one agent (the wire's view: the CLI reads it
/// back typed).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentStatus {
    pub host: String,
    pub connected: bool,
    pub state: AgentState,
    /// Milliseconds since the agent last said anything.
    pub silent_ms: u64,
    pub agent_instance_id: String,
    pub agent_version: String,
    pub units: Vec<UnitStatus>,
    /// GPUs, their processes and the host's figures; absent until the agent
    /// has sent a snapshot.
    pub host_report: Option<Arc<crate::host::HostReport>>,
}

/// An agent's link, as `status` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentState {
    Connected,
    /// Attached but silent for the orchestrator's `AGENT_UNKNOWN_AFTER` (10 s): its facts may be stale.
    Unknown,
    Disconnected,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UnitStatus {
    pub name: String,
    pub role: String,
    pub phase: String,
    pub pid: Option<u32>,
    pub base_url: String,
}

/// This orchestrator's part, as `status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Role {
    /// The one orchestrator on its SQLite journal.
    Sole,
    /// Elected on etcd; `token` is the revision at which it took the lead.
    Leader { token: u64, since_unix_ms: i64 },
    /// Not leading: `leader_url` is the leader's advertised URL, when one is
    /// known; `why` says why this one does not lead.
    Follower {
        #[serde(skip_serializing_if = "Option::is_none")]
        leader_url: Option<String>,
        why: String,
    },
}

/// A conclusion the journal could not write yet, kept in memory and
/// retried (`Journal::flush_pending`) until it is written.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PendingConclusion {
    pub operation_id: String,
    pub pair: String,
    pub verdict: String,
    /// The write's error, the last time it was tried.
    pub error: String,
    pub since_unix_ms: i64,
    /// The report to write (kept in memory by the journal, not shown).
    #[serde(skip)]
    pub report: String,
}

/// A finished or running operation as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OperationRecord {
    pub operation_id: String,
    pub kind: String,
    pub pair: String,
    pub state: String,
    pub started_unix_ms: i64,
    pub ended_unix_ms: Option<i64>,
    pub verdict: Option<String>,
    /// The caller's idempotency key, when it gave one.
    pub request_id: Option<String>,
    /// The final report (the CLI's `--json` object), when concluded.
    pub report: Option<serde_json::Value>,
    /// For an automatic operation, the evidence that triggered it (the
    /// `trigger` entry the watch journals before the first command).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trigger: Option<serde_json::Value>,
    /// Who asked for it (`{name, role}`, the `actor` entry); absent for an
    /// automatic operation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor: Option<serde_json::Value>,
}

/// A concluded operation's report as `history` reads it back, typed (issue
/// 33: it was read as raw JSON by key).
#[derive(Debug, Clone, PartialEq)]
pub enum StoredReport {
    Gate(Box<GateReport>),
    /// A co-restart's, a verification's or a rolling restart's.
    Operation(Box<OperationReport>),
    /// A report the journal cut to its scalars and reasons (one over
    /// `MAX_REPORT_BYTES` even with its lists cut), or of a shape this
    /// version does not read: its reasons, which every report keeps.
    Cut {
        reasons: Vec<String>,
    },
}

impl StoredReport {
    /// The verdict's reasons, whatever the shape.
    pub fn reasons(&self) -> &[String] {
        match self {
            StoredReport::Gate(g) => &g.reasons,
            StoredReport::Operation(r) => &r.reasons,
            StoredReport::Cut { reasons } => reasons,
        }
    }
}

impl OperationRecord {
    /// The concluded report, read as its kind's record; `None` while the
    /// operation runs.
    pub fn stored_report(&self) -> Option<StoredReport> {
        let report = self.report.as_ref()?;
        let typed = if self.kind == "gate" {
            GateReport::deserialize(report).map(|g| StoredReport::Gate(Box::new(g)))
        } else {
            OperationReport::deserialize(report).map(|r| StoredReport::Operation(Box::new(r)))
        };
        Some(typed.unwrap_or_else(|_| {
            StoredReport::Cut {
                reasons: report["reasons"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|r| r.as_str().map(str::to_owned))
                    .collect(),
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: &str, report: serde_json::Value) -> OperationRecord {
        OperationRecord {
            operation_id: "op".into(),
            kind: kind.into(),
            pair: "demo".into(),
            state: "concluded".into(),
            started_unix_ms: 1,
            ended_unix_ms: Some(2),
            verdict: Some("healthy".into()),
            request_id: None,
            report: Some(report),
            trigger: None,
            actor: None,
        }
    }

    /// A co-restart's report reads back as one; a report the journal cut to
    /// its scalars and reasons (or a gate's that is not a gate report)
    /// still gives its reasons; a running operation has none.
    #[test]
    fn a_stored_report_reads_back_typed_and_a_cut_one_keeps_its_reasons() {
        let report = serde_json::json!({
            "operation_id": "op", "pair": "demo", "kind": "co_restart", "decode_start_policy": "after_prefill_ready",
            "verdict": "healthy", "reasons": ["probe 1 took 0.3 s"], "steps": [], "timeline": [], "probes": [],
            "attempts": [], "probe_latency": crate::judge::stats::summarize(&[]), "suite": [],
            "warnings": [], "engine_counters": [], "router_counters": [], "warm_budget_ms": 1,
            "cold_allowance": {"source": "configured", "ms": 1}, "fingerprint": "", "sub_operations": [],
            "total_ms": 7,
        });
        let read = record("co_restart", report.clone()).stored_report().unwrap();
        let StoredReport::Operation(r) = &read else {
            panic!("{read:?}")
        };
        assert_eq!(r.total_ms, 7);
        assert_eq!(read.reasons(), ["probe 1 took 0.3 s"]);

        let cut = serde_json::json!({"verdict": "failed", "total_ms": 9, "reasons": ["a", "this report was cut"]});
        for kind in ["co_restart", "gate"] {
            assert_eq!(
                record(kind, cut.clone()).stored_report(),
                Some(StoredReport::Cut {
                    reasons: vec!["a".into(), "this report was cut".into()]
                }),
                "{kind}"
            );
        }
        // An operation report is not a gate's.
        assert!(matches!(
            record("gate", report).stored_report(),
            Some(StoredReport::Cut { .. })
        ));
        let mut running = record("verify", serde_json::Value::Null);
        running.report = None;
        assert_eq!(running.stored_report(), None);
    }

    fn agent(i: usize, state: AgentState, phase: &str) -> AgentStatus {
        AgentStatus {
            host: format!("gpu-{i:05}"),
            connected: state == AgentState::Connected,
            state,
            silent_ms: 0,
            agent_instance_id: String::new(),
            agent_version: String::new(),
            units: vec![UnitStatus {
                name: "decode-0".into(),
                role: "decode".into(),
                phase: phase.into(),
                pid: Some(1),
                base_url: String::new(),
            }],
            host_report: None,
        }
    }

    /// Issue 36: a fleet of 10,000 hosts is its numbers and the hosts that
    /// need a look; a small fleet, `--host` or `--detail` is whole.
    #[test]
    fn a_large_fleet_is_summarised_to_the_hosts_that_need_a_look() {
        let fleet = || -> Vec<AgentStatus> {
            (0..10_000)
                .map(|i| match i {
                    7 => agent(i, AgentState::Disconnected, "generating"),
                    8 => agent(i, AgentState::Connected, "exited"),
                    _ => agent(i, AgentState::Connected, "generating"),
                })
                .collect()
        };
        let finding = |host: &str| crate::judge::findings::HostFinding {
            severity: crate::judge::findings::Severity::Warning,
            kind: "foreign_gpu_process".into(),
            host: host.into(),
            gpu: Some(0),
            unit: None,
            pid: Some(9),
            message: String::new(),
        };
        let mut agents = fleet();
        let mut findings = vec![finding("gpu-00042")];
        let f = summarise(&mut agents, &mut findings, true);
        let hosts: Vec<&str> = agents.iter().map(|a| a.host.as_str()).collect();
        assert_eq!(hosts, ["gpu-00007", "gpu-00008", "gpu-00042"]);
        assert_eq!(
            (f.hosts, f.connected, f.disconnected, f.units, f.hosts_omitted),
            (10_000, 9_999, 1, 10_000, 9_997)
        );
        assert_eq!(f.units_by_phase["exited"], 1);
        assert_eq!(f.units_by_phase["generating"], 9_999);
        // Detail asked for: every host.
        let mut agents = fleet();
        let f = summarise(&mut agents, &mut Vec::new(), false);
        assert_eq!((agents.len(), f.hosts_omitted), (10_000, 0));
        // A small fleet is whole.
        let mut agents: Vec<AgentStatus> = fleet().into_iter().take(SUMMARY_ABOVE_HOSTS).collect();
        summarise(&mut agents, &mut Vec::new(), true);
        assert_eq!(agents.len(), SUMMARY_ABOVE_HOSTS);
        // Findings are bounded, the rest counted.
        let mut findings: Vec<_> = (0..MAX_FINDINGS + 7).map(|i| finding(&format!("gpu-{i:05}"))).collect();
        let f = summarise(&mut fleet(), &mut findings, true);
        assert_eq!((findings.len(), f.findings, f.findings_omitted), (MAX_FINDINGS, 507, 7));
    }
}
