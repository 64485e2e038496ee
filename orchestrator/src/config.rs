//! The orchestrator's static configuration: which pairs exist, which agent
//! units make them up, and the budgets their restarts are judged against
//! (DESIGN.md 8). Unknown fields are errors, and every invalid value is
//! reported with the field it came from, because a typo in a budget at 3 a.m.
//! must not silently become a default.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config: {0}")]
    Parse(#[from] toml::de::Error),
    #[error("invalid config: field `{field}`: {problem}")]
    Invalid { field: String, problem: String },
}

fn invalid(field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        problem: problem.into(),
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OrchestratorConfig {
    /// gRPC listen address for agents and the CLI.
    pub listen: SocketAddr,
    /// The SQLite journal file.
    pub journal: PathBuf,
    #[serde(default, rename = "pair")]
    pub pairs: Vec<PairConfig>,
}

/// A unit, named by the host whose agent supervises it and its name there.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UnitRef {
    pub host: String,
    pub unit: String,
}

impl std::fmt::Display for UnitRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.host, self.unit)
    }
}

/// When decode's start begins relative to prefill's (issue 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DecodeStartPolicy {
    /// Decode is spawned only once prefill is generating.
    #[default]
    AfterPrefillReady,
    /// Decode is spawned as soon as prefill is spawned, so both load weights
    /// in parallel; the router still waits for both to generate.
    Overlap,
}

impl DecodeStartPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AfterPrefillReady => "after-prefill-ready",
            Self::Overlap => "overlap",
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PairConfig {
    pub name: String,
    #[serde(default)]
    pub decode_start_policy: DecodeStartPolicy,
    pub prefill: Vec<UnitRef>,
    pub decode: Vec<UnitRef>,
    pub router: Vec<UnitRef>,
    pub probe: ProbeConfig,
    #[serde(default)]
    pub timeouts: TimeoutConfig,
}

/// How the pair is probed and what its probes are judged against.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeConfig {
    pub model: String,
    /// The one fixed prompt every probe of this pair sends (INCIDENTS row 5:
    /// a fresh or alternating prompt costs the engine far more).
    pub prompt: String,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    /// An answered probe within this is warm.
    pub warm_budget_ms: u64,
    /// The slowest first probe accepted as cold start when this pair has no
    /// measured history.
    pub cold_allowance_ms: u64,
    /// Consecutive warm probes that end the series as healthy.
    #[serde(default = "default_warm_probes")]
    pub warm_probes: u32,
    /// The most probes a series sends (including the router's readiness check,
    /// which is probe 1).
    #[serde(default = "default_max_probes")]
    pub max_probes: u32,
    /// Timeout of one probe after the first.
    pub probe_timeout_ms: u64,
    /// The cold allowance measured from this pair's history is its slowest
    /// healthy first probe times this margin.
    #[serde(default = "default_cold_margin")]
    pub cold_allowance_margin: f64,
}

fn default_cold_margin() -> f64 {
    2.0
}

fn default_max_tokens() -> u32 {
    8
}
fn default_warm_probes() -> u32 {
    2
}
fn default_max_probes() -> u32 {
    5
}

/// Per-phase deadlines of a co-restart.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TimeoutConfig {
    pub prefill_ready_ms: u64,
    pub decode_ready_ms: u64,
    pub router_ready_ms: u64,
    /// SIGTERM-to-SIGKILL grace when stopping a unit.
    pub stop_grace_ms: u64,
    /// Readiness poll period on the agent while a unit starts.
    pub poll_interval_ms: u64,
    /// Timeout of one engine generation check (`/health_generate`).
    pub check_timeout_ms: u64,
}

impl Default for TimeoutConfig {
    fn default() -> Self {
        Self {
            prefill_ready_ms: 600_000,
            decode_ready_ms: 600_000,
            router_ready_ms: 120_000,
            stop_grace_ms: 30_000,
            poll_interval_ms: 20,
            check_timeout_ms: 30_000,
        }
    }
}

impl OrchestratorConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml_str(&text)
    }

    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let cfg: Self = toml::from_str(text)?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn pair(&self, name: &str) -> Option<&PairConfig> {
        self.pairs.iter().find(|p| p.name == name)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let mut names = HashSet::new();
        let mut owners: HashSet<&UnitRef> = HashSet::new();
        for (i, p) in self.pairs.iter().enumerate() {
            let at = |f: &str| format!("pair[{i}].{f}");
            if p.name.trim().is_empty() {
                return Err(invalid(at("name"), "must not be empty"));
            }
            if !names.insert(p.name.as_str()) {
                return Err(invalid(at("name"), format!("duplicate pair name {:?}", p.name)));
            }
            for (field, units) in [("prefill", &p.prefill), ("decode", &p.decode), ("router", &p.router)] {
                if units.is_empty() {
                    return Err(invalid(at(field), "needs at least one unit"));
                }
                for u in units {
                    if u.host.is_empty() || u.unit.is_empty() {
                        return Err(invalid(at(field), "host and unit must not be empty"));
                    }
                    if !owners.insert(u) {
                        return Err(invalid(
                            at(field),
                            format!("unit {u} belongs to more than one pair role"),
                        ));
                    }
                }
            }
            let pr = &p.probe;
            if pr.prompt.trim().is_empty() {
                return Err(invalid(at("probe.prompt"), "must not be empty"));
            }
            if pr.max_tokens == 0 {
                return Err(invalid(at("probe.max_tokens"), "must be at least 1"));
            }
            for (f, v) in [
                ("probe.warm_budget_ms", pr.warm_budget_ms),
                ("probe.cold_allowance_ms", pr.cold_allowance_ms),
                ("probe.probe_timeout_ms", pr.probe_timeout_ms),
                ("timeouts.prefill_ready_ms", p.timeouts.prefill_ready_ms),
                ("timeouts.decode_ready_ms", p.timeouts.decode_ready_ms),
                ("timeouts.router_ready_ms", p.timeouts.router_ready_ms),
                ("timeouts.poll_interval_ms", p.timeouts.poll_interval_ms),
                ("timeouts.check_timeout_ms", p.timeouts.check_timeout_ms),
            ] {
                if v == 0 {
                    return Err(invalid(at(f), "must be greater than 0"));
                }
            }
            if pr.cold_allowance_ms < pr.warm_budget_ms {
                return Err(invalid(
                    at("probe.cold_allowance_ms"),
                    format!(
                        "{} is below warm_budget_ms ({})",
                        pr.cold_allowance_ms, pr.warm_budget_ms
                    ),
                ));
            }
            if pr.probe_timeout_ms < pr.cold_allowance_ms {
                return Err(invalid(
                    at("probe.probe_timeout_ms"),
                    format!(
                        "{} is below cold_allowance_ms ({}): a probe must be able to observe a cold start it would accept",
                        pr.probe_timeout_ms, pr.cold_allowance_ms
                    ),
                ));
            }
            if !(pr.cold_allowance_margin >= 1.0 && pr.cold_allowance_margin.is_finite()) {
                return Err(invalid(
                    at("probe.cold_allowance_margin"),
                    "must be a finite number >= 1",
                ));
            }
            if pr.warm_probes == 0 || pr.max_probes < pr.warm_probes {
                return Err(invalid(
                    at("probe.max_probes"),
                    format!(
                        "must be at least warm_probes ({}) and warm_probes at least 1",
                        pr.warm_probes
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) const EXAMPLE: &str = r#"
listen = "127.0.0.1:7070"
journal = "/tmp/pdwarden.sqlite"
[[pair]]
name = "pair-a"
prefill = [{ host = "h1", unit = "prefill-0" }]
decode = [{ host = "h1", unit = "decode-0" }]
router = [{ host = "h1", unit = "router-0" }]
[pair.probe]
model = "m"
prompt = "Say hi"
warm_budget_ms = 1000
cold_allowance_ms = 30000
probe_timeout_ms = 120000
"#;

    #[test]
    fn example_parses_with_defaults() {
        let c = OrchestratorConfig::from_toml_str(EXAMPLE).unwrap();
        let p = c.pair("pair-a").unwrap();
        assert_eq!(p.decode_start_policy, DecodeStartPolicy::AfterPrefillReady);
        assert_eq!(p.probe.max_tokens, 8);
        assert_eq!(p.timeouts.poll_interval_ms, 20);
    }

    /// The shipped example must stay valid.
    #[test]
    fn deploy_local_example_is_valid() {
        let c = OrchestratorConfig::from_toml_str(include_str!("../../deploy/local/orchestrator.toml")).unwrap();
        assert_eq!(c.pairs[0].name, "local");
    }

    #[test]
    fn unknown_field_is_named() {
        let e = OrchestratorConfig::from_toml_str(
            &EXAMPLE
                .replace("max_tokens", "x")
                .replace("warm_budget_ms = 1000", "warm_budget_ms = 1000\nwarm_budjet = 3"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("warm_budjet"), "{e}");
    }

    #[test]
    fn bad_values_name_their_field() {
        let e =
            OrchestratorConfig::from_toml_str(&EXAMPLE.replace("probe_timeout_ms = 120000", "probe_timeout_ms = 5000"))
                .unwrap_err()
                .to_string();
        assert!(e.contains("pair[0].probe.probe_timeout_ms"), "{e}");
        let e = OrchestratorConfig::from_toml_str(
            &EXAMPLE.replace("decode = [{ host = \"h1\", unit = \"decode-0\" }]", "decode = []"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("pair[0].decode"), "{e}");
    }
}
