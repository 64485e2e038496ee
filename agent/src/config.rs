//! The agent's static configuration: which host it is, where the orchestrator
//! is, and the units (engines and routers) it supervises.
//!
//! Topology is static TOML (DESIGN.md 8) and unknown fields are errors, so a
//! typo never silently becomes a default. Serde catches unknown fields and bad
//! types (its message quotes the offending line); [`AgentConfig::validate`]
//! then checks what types cannot say (unique names, absolute URL paths, …) and
//! names the field in every error.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use pdwarden_proto::v1 as pb;
use serde::Deserialize;
use thiserror::Error;

/// Grace period used when the agent stops its units on shutdown, unless
/// `shutdown_grace_ms` says otherwise.
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 10_000;
/// GPU and host sampling period unless `gpu_sample_interval_ms` says otherwise.
pub const DEFAULT_GPU_SAMPLE_INTERVAL_MS: u64 = 2_000;
/// Longest gap between two GPU and host snapshots unless
/// `gpu_snapshot_interval_ms` says otherwise.
pub const DEFAULT_GPU_SNAPSHOT_INTERVAL_MS: u64 = 15_000;

/// Errors reading or validating an agent config. Every variant names the file
/// or field at fault.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read agent config {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Syntax, type or unknown-field error; the message quotes the TOML line.
    #[error("agent config: {message}")]
    Parse { message: String },
    #[error("agent config: field `{field}`: {reason}")]
    Invalid { field: String, reason: String },
}

/// What happens to running units when the agent itself shuts down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnExit {
    /// Units keep serving; a pdwarden outage must not take serving down
    /// (DESIGN.md 9).
    #[default]
    LeaveRunning,
    /// SIGTERM every running unit's process group, SIGKILL after the grace.
    StopUnits,
}

/// The role a unit plays in a PD pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Prefill,
    Decode,
    Router,
}

impl Role {
    pub fn to_proto(self) -> pb::Role {
        match self {
            Role::Prefill => pb::Role::Prefill,
            Role::Decode => pb::Role::Decode,
            Role::Router => pb::Role::Router,
        }
    }
}

/// The whole agent config file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Host name reported in `Register`.
    pub host: String,
    /// The orchestrator's gRPC URL, e.g. `http://127.0.0.1:7070`.
    pub orchestrator: String,
    /// Logs go to `state_dir/logs/<unit>.log`.
    pub state_dir: PathBuf,
    #[serde(default)]
    pub on_exit: OnExit,
    /// Grace between SIGTERM and SIGKILL when `on_exit = "stop-units"`.
    #[serde(default = "default_shutdown_grace_ms")]
    pub shutdown_grace_ms: u64,
    #[serde(default, rename = "unit")]
    pub units: Vec<UnitConfig>,
    /// Where GPU readings come from: `auto` (NVML if it loads, else none),
    /// `nvml`, `none` or `fake:PATH` (a JSON file, for hosts without a GPU).
    #[serde(default = "default_gpu_source")]
    pub gpu_source: String,
    /// How often GPUs and the host are sampled; a material change (a process
    /// appears, an ECC count moves) is sent at the next sample.
    #[serde(default = "default_gpu_sample_interval_ms")]
    pub gpu_sample_interval_ms: u64,
    /// A full snapshot is sent at least this often, changed or not.
    #[serde(default = "default_gpu_snapshot_interval_ms")]
    pub gpu_snapshot_interval_ms: u64,
    /// Serve Prometheus `/metrics` (GPU and host figures) here, e.g.
    /// `127.0.0.1:9400`; off when absent.
    #[serde(default)]
    pub metrics_listen: Option<String>,
    /// Mutual TLS to the orchestrator: the pdwarden CA, and this agent's
    /// certificate (common name `agent:HOST`, from `pdwarden certs agent HOST`)
    /// and key. Required unless `insecure_plaintext`.
    #[serde(default)]
    pub tls: Option<crate::tls::TlsFiles>,
    /// Plain text, no certificate: local development only (warned at start).
    #[serde(default)]
    pub insecure_plaintext: bool,
    /// Unit environment variables whose values are never logged or reported
    /// (case-insensitive globs); default `*TOKEN*`, `*SECRET*`, `*KEY*`, ...
    #[serde(default = "crate::redact::default_patterns")]
    pub redact_env: Vec<String>,
}

/// One supervised process.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnitConfig {
    /// Unique on this host; also the log file's name.
    pub name: String,
    pub role: Role,
    /// Executed directly (never through a shell); `argv[0]` is looked up in
    /// `PATH` if it has no slash.
    pub argv: Vec<String>,
    /// Added to the agent's own environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Where the unit serves HTTP, e.g. `http://127.0.0.1:30001`.
    pub base_url: String,
    /// Polled during start-up. Use `/readiness` for sglang-router, whose
    /// `/health` is 200 even with no workers (ROUTER-NOTES.md).
    #[serde(default = "default_health_path")]
    pub health_path: String,
    /// GET-ed as the generation check when the start command carries no chat
    /// probe; SGLang's `/health_generate` runs a real forward pass.
    #[serde(default = "default_generation_path")]
    pub generation_path: String,
    #[serde(default)]
    pub bootstrap_port: Option<u16>,
    /// Start this unit when the agent starts.
    #[serde(default)]
    pub autostart: bool,
}

fn default_shutdown_grace_ms() -> u64 {
    DEFAULT_SHUTDOWN_GRACE_MS
}
fn default_gpu_source() -> String {
    "auto".to_owned()
}
fn default_gpu_sample_interval_ms() -> u64 {
    DEFAULT_GPU_SAMPLE_INTERVAL_MS
}
fn default_gpu_snapshot_interval_ms() -> u64 {
    DEFAULT_GPU_SNAPSHOT_INTERVAL_MS
}
fn default_health_path() -> String {
    "/health".to_owned()
}
fn default_generation_path() -> String {
    "/health_generate".to_owned()
}

impl AgentConfig {
    /// Parses and validates a config.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let config: AgentConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            message: e.to_string().trim_end().to_owned(),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Reads, parses and validates the config file at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml_str(&text)
    }

    /// The parsed `gpu_source` (`auto` if it does not parse: `validate` rejects that).
    pub fn gpu_source_spec(&self) -> crate::gpu::GpuSourceSpec {
        crate::gpu::GpuSourceSpec::parse(&self.gpu_source).unwrap_or_default()
    }

    /// The unit named `name`, if configured.
    pub fn unit(&self, name: &str) -> Option<&UnitConfig> {
        self.units.iter().find(|u| u.name == name)
    }

    /// Checks what serde cannot: run by `from_toml_str` and by `run` (for
    /// configs built in code).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.host.trim().is_empty() {
            return Err(invalid("host", "must not be empty"));
        }
        check_http_url("orchestrator", &self.orchestrator)?;
        if self.state_dir.as_os_str().is_empty() {
            return Err(invalid("state_dir", "must not be empty"));
        }
        crate::gpu::GpuSourceSpec::parse(&self.gpu_source).map_err(|reason| invalid("gpu_source", reason))?;
        if self.gpu_sample_interval_ms == 0 {
            return Err(invalid("gpu_sample_interval_ms", "must be at least 1"));
        }
        if self.gpu_snapshot_interval_ms < self.gpu_sample_interval_ms {
            return Err(invalid(
                "gpu_snapshot_interval_ms",
                format!(
                    "{} must be at least gpu_sample_interval_ms ({})",
                    self.gpu_snapshot_interval_ms, self.gpu_sample_interval_ms
                ),
            ));
        }
        if let Some(addr) = &self.metrics_listen
            && addr.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(invalid(
                "metrics_listen",
                format!("{addr:?} is not an address:port such as \"127.0.0.1:9400\""),
            ));
        }
        let mut names = HashSet::new();
        for (i, unit) in self.units.iter().enumerate() {
            unit.validate(i)?;
            if !names.insert(unit.name.as_str()) {
                return Err(invalid(
                    format!("unit[{i}].name"),
                    format!("duplicate unit name {:?}", unit.name),
                ));
            }
        }
        Ok(())
    }
}

impl UnitConfig {
    fn validate(&self, index: usize) -> Result<(), ConfigError> {
        let field = |f: &str| format!("unit[{index}].{f}");
        let name_ok = !self.name.is_empty()
            && self.name != "."
            && self.name != ".."
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !name_ok {
            return Err(invalid(
                field("name"),
                format!(
                    "{:?} must be non-empty and use only letters, digits, '-', '_' and '.' \
                     (it names the log file)",
                    self.name
                ),
            ));
        }
        match self.argv.first() {
            None => {
                return Err(invalid(
                    field("argv"),
                    format!("unit {:?}: must name a program", self.name),
                ));
            }
            Some(p) if p.is_empty() => {
                return Err(invalid(
                    field("argv"),
                    format!("unit {:?}: argv[0] is empty", self.name),
                ));
            }
            Some(_) => {}
        }
        for key in self.env.keys() {
            if key.is_empty() || key.contains('=') || key.contains('\0') {
                return Err(invalid(
                    field("env"),
                    format!("unit {:?}: invalid variable name {key:?}", self.name),
                ));
            }
        }
        if let Some(cwd) = &self.cwd
            && cwd.as_os_str().is_empty()
        {
            return Err(invalid(field("cwd"), "must not be empty when set"));
        }
        check_http_url(&field("base_url"), &self.base_url)?;
        for (f, path) in [
            ("health_path", &self.health_path),
            ("generation_path", &self.generation_path),
        ] {
            if !path.starts_with('/') {
                return Err(invalid(field(f), format!("{path:?} must start with '/'")));
            }
        }
        if self.bootstrap_port == Some(0) {
            return Err(invalid(field("bootstrap_port"), "must not be 0"));
        }
        Ok(())
    }
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

fn check_http_url(field: &str, value: &str) -> Result<(), ConfigError> {
    let url = reqwest::Url::parse(value).map_err(|e| invalid(field, format!("{value:?} is not a URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(invalid(
            field,
            format!("{value:?} must be an http:// or https:// URL with a host"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
        host = "local"
        orchestrator = "http://127.0.0.1:7070"
        state_dir = "/tmp/pdw"
        on_exit = "stop-units"
        [[unit]]
        name = "prefill-0"
        role = "prefill"
        argv = ["/abs/pd-sim", "--role", "prefill", "--port", "30001"]
        env = { KEY = "V" }
        cwd = "/tmp"
        base_url = "http://127.0.0.1:30001"
        bootstrap_port = 8998
        autostart = true
        [[unit]]
        name = "router"
        role = "router"
        argv = ["smg", "launch"]
        base_url = "http://127.0.0.1:30000"
        health_path = "/readiness"
    "#;

    // Property: every documented field parses, and omitted ones get their defaults.
    #[test]
    fn full_config_parses_with_defaults() {
        let c = AgentConfig::from_toml_str(FULL).unwrap();
        assert_eq!(c.host, "local");
        assert_eq!(c.on_exit, OnExit::StopUnits);
        assert_eq!(c.shutdown_grace_ms, DEFAULT_SHUTDOWN_GRACE_MS);
        assert_eq!(c.gpu_source_spec(), crate::gpu::GpuSourceSpec::Auto);
        assert_eq!(c.gpu_sample_interval_ms, DEFAULT_GPU_SAMPLE_INTERVAL_MS);
        assert_eq!(c.gpu_snapshot_interval_ms, DEFAULT_GPU_SNAPSHOT_INTERVAL_MS);
        assert_eq!(c.metrics_listen, None);
        let p = c.unit("prefill-0").unwrap();
        assert_eq!(p.role, Role::Prefill);
        assert_eq!(p.env.get("KEY").map(String::as_str), Some("V"));
        assert_eq!(p.health_path, "/health");
        assert_eq!(p.generation_path, "/health_generate");
        assert_eq!(p.bootstrap_port, Some(8998));
        assert!(p.autostart);
        let r = c.unit("router").unwrap();
        assert_eq!(r.health_path, "/readiness");
        assert!(!r.autostart);
        assert_eq!(r.cwd, None);
    }

    // Property: on_exit defaults to leaving units running.
    #[test]
    fn on_exit_defaults_to_leave_running() {
        let c = AgentConfig::from_toml_str("host='h'\norchestrator='http://x:1'\nstate_dir='/tmp'\n").unwrap();
        assert_eq!(c.on_exit, OnExit::LeaveRunning);
        assert!(c.units.is_empty());
    }

    fn err(text: &str) -> String {
        AgentConfig::from_toml_str(text).unwrap_err().to_string()
    }

    const HEAD: &str = "host='h'\norchestrator='http://x:1'\nstate_dir='/tmp'\n";
    const UNIT: &str = "[[unit]]\nname='u'\nrole='decode'\nargv=['sleep','1']\nbase_url='http://127.0.0.1:1'\n";

    // Property: every bad input is rejected with an error that names the field.
    #[test]
    fn bad_inputs_name_their_field() {
        let cases: Vec<(String, &str)> = vec![
            (format!("{HEAD}colour='red'\n"), "colour"),
            (format!("{HEAD}{UNIT}speed=3\n"), "speed"),
            (format!("{HEAD}{UNIT}bootstrap_port='x'\n"), "bootstrap_port"),
            (format!("{HEAD}{UNIT}bootstrap_port=0\n"), "bootstrap_port"),
            (format!("{HEAD}{UNIT}health_path='health'\n"), "health_path"),
            (format!("{HEAD}{UNIT}generation_path=''\n"), "generation_path"),
            (HEAD.replace("'h'", "' '"), "host"),
            (HEAD.replace("http://x:1", "x:1"), "orchestrator"),
            (HEAD.replace("http://x:1", "ftp://x"), "orchestrator"),
            (HEAD.replace("'/tmp'", "''"), "state_dir"),
            (HEAD.replace("state_dir='/tmp'\n", ""), "state_dir"),
            (format!("{HEAD}on_exit='explode'\n"), "on_exit"),
            (format!("{HEAD}{}", UNIT.replace("'decode'", "'encode'")), "role"),
            (format!("{HEAD}{}", UNIT.replace("['sleep','1']", "[]")), "argv"),
            (format!("{HEAD}{}", UNIT.replace("name='u'", "name='a/b'")), "name"),
            (
                format!("{HEAD}{}", UNIT.replace("http://127.0.0.1:1", "nope")),
                "base_url",
            ),
            (format!("{HEAD}{UNIT}{UNIT}"), "name"),
            (format!("{HEAD}{UNIT}env={{'A=B'='c'}}\n"), "env"),
            (format!("{HEAD}{UNIT}cwd=''\n"), "cwd"),
            (format!("{HEAD}gpu_source='cuda'\n"), "gpu_source"),
            (format!("{HEAD}gpu_source='fake:'\n"), "gpu_source"),
            (format!("{HEAD}gpu_source=3\n"), "gpu_source"),
            (format!("{HEAD}gpu_sample_interval_ms=0\n"), "gpu_sample_interval_ms"),
            (
                format!("{HEAD}gpu_sample_interval_ms=500\ngpu_snapshot_interval_ms=100\n"),
                "gpu_snapshot_interval_ms",
            ),
            (format!("{HEAD}metrics_listen='localhost'\n"), "metrics_listen"),
        ];
        for (text, field) in cases {
            let e = err(&text);
            assert!(e.contains(field), "error for {field}: {e}\n--- config:\n{text}");
        }
    }

    // Property: load() reports the path of a missing file.
    #[test]
    fn load_names_missing_file() {
        let e = AgentConfig::load("/nonexistent/pdwarden-agent.toml").unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }));
        assert!(e.to_string().contains("/nonexistent/pdwarden-agent.toml"));
    }
}
