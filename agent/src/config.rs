//! The agent's static configuration: which host it is, where the orchestrators
//! are, and the units (engines and routers) it supervises.
//!
//! Topology is static TOML (DESIGN.md 8) and unknown fields are errors, so a
//! typo never silently becomes a default. Serde catches unknown fields and bad
//! types (its message quotes the offending line); [`AgentConfig::validate`]
//! then checks what types cannot say (unique names, absolute URL paths, …) and
//! names the field in every error.
//!
//! `orchestrator` is one URL or a list of them: a control plane of several
//! orchestrators elects one leader on etcd (issue 19, DESIGN.md 15), and an
//! agent that knew only one of them would be cut off whenever that one is
//! down. The one-URL form stays, so every existing config keeps working.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use pdwarden_engines::{EngineKind, GenerationCheck};
use pdwarden_proto::v1 as pb;
use serde::{Deserialize, Serialize};
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
    /// Syntax, type or unknown-field error, in one line naming the TOML line and field.
    #[error("agent config: {message}")]
    Parse { message: String },
    #[error("agent config: field `{field}`: {reason}")]
    Invalid { field: String, reason: String },
}

/// A router's `--prometheus-port` whose value is not a port (1 to 65535).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("--prometheus-port {value:?} is not a port")]
pub struct NotAPort {
    /// The value as written in the argv.
    pub value: String,
}

/// What happens to running units when the agent itself shuts down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
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
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Host name reported in `Register`.
    pub host: String,
    /// The orchestrator's gRPC URL, e.g. `http://127.0.0.1:7070`, or a
    /// list of them for a control plane of several orchestrators (issue
    /// 19): `["http://a:7070", "http://b:7070", "http://c:7070"]`.
    pub orchestrator: Orchestrators,
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
    /// The NVML library (`libnvidia-ml.so`) that `nvml` and `auto` load, an
    /// absolute path, for a driver outside the system's library search;
    /// absent: the system's search. A file that is missing or cannot be
    /// loaded is no config error: GPU reporting says why, as for a missing
    /// driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvml_library: Option<PathBuf>,
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
    /// The py-spy binary that dumps a wedged unit's Python stacks before it
    /// is killed (issue 35: evidence before the kill); absent: `py-spy` on
    /// `PATH`. Without one, the evidence has each thread's /proc state and
    /// kernel wait channel only. Set: it must be an existing file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub py_spy: Option<PathBuf>,
}

/// Where the orchestrators are: the `orchestrator` field, written as one URL
/// or as a non-empty list of URLs (the agent dials them in turn and follows
/// their leader; see `link`). A one-URL list and a plain URL are the same
/// config and both serialize as a plain URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orchestrators(Vec<String>);

impl Orchestrators {
    /// The URLs in the order written.
    pub fn urls(&self) -> &[String] {
        &self.0
    }
}

impl From<String> for Orchestrators {
    fn from(url: String) -> Self {
        Orchestrators(vec![url])
    }
}

impl From<&str> for Orchestrators {
    fn from(url: &str) -> Self {
        Orchestrators(vec![url.to_owned()])
    }
}

impl From<Vec<String>> for Orchestrators {
    fn from(urls: Vec<String>) -> Self {
        Orchestrators(urls)
    }
}

impl Serialize for Orchestrators {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0.as_slice() {
            [one] => serializer.serialize_str(one),
            many => many.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for Orchestrators {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // By hand rather than `#[serde(untagged)]`, whose error ("did not
        // match any variant") would not say what the field takes.
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Orchestrators;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an orchestrator URL or a list of orchestrator URLs")
            }
            fn visit_str<E: serde::de::Error>(self, url: &str) -> Result<Orchestrators, E> {
                Ok(Orchestrators::from(url))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Orchestrators, A::Error> {
                let mut urls = Vec::new();
                while let Some(url) = seq.next_element::<String>()? {
                    urls.push(url);
                }
                Ok(Orchestrators(urls))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// One supervised process.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
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
    /// What kind of server it is (`sglang`, `vllm`, `sglang-router`,
    /// `vllm-router`): its health path and its generation check follow
    /// from it (`pdwarden_engines`). Absent: an SGLang-style engine, or a
    /// router by its role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineKind>,
    /// Polled during start-up; default: the engine kind's (`/readiness`
    /// for sglang-router, whose `/health` is 200 even with no workers —
    /// ROUTER-NOTES.md), else `/health`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_path: Option<String>,
    /// GET-ed as the generation check of an engine whose GET endpoint
    /// generates (SGLang's `/health_generate` runs a real forward pass);
    /// default: the engine kind's check. Not for `engine = "vllm"`, which
    /// has no generating GET: its check is a completion sent to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation_path: Option<String>,
    #[serde(default)]
    pub bootstrap_port: Option<u16>,
    /// Start this unit when the agent starts.
    #[serde(default)]
    pub autostart: bool,
    /// Where its Prometheus metrics are scraped, a full http(s) URL such as
    /// `http://127.0.0.1:29000/metrics`. Default: for a router (role
    /// `router`, or engine `sglang-router` / `vllm-router`), whose exporter
    /// listens on a port of its own, `http://<host of base_url>:<P>/metrics`
    /// with P the value of `--prometheus-port` in its argv, else 29000
    /// (both routers' default; `--prometheus-host`, when it names one
    /// address, replaces the host); for an engine, `base_url` plus the
    /// metrics path the orchestrator asks for (`/metrics`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_url: Option<String>,
    /// The account it runs as, a name or a uid of the host's user database
    /// (issue 48: an engine that runs someone's code, `trust_remote_code`,
    /// must not run it as root). Absent: the agent's own user. Resolved
    /// when the agent loads its config and at every spawn; the child gets
    /// the account's uid, `group`'s gid (else the account's primary group),
    /// no supplementary groups and no capabilities, and the account's
    /// `HOME`, `USER` and `LOGNAME` unless `env` sets them. Only a root
    /// agent switches users: a non-root one refuses the config (see
    /// [`crate::runas`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The unit's group, a name or a gid; needs `user`. Absent: the user's
    /// primary group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
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
/// How a unit's start-up watch proves it generates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GenerationCheckSpec {
    /// GET this path (2xx passes): the engine generates to answer it.
    Get(String),
    /// A probe-tagged completion with `max_tokens` 1 sent straight to the
    /// engine (engines without a generating GET: vLLM).
    Completion,
    /// A chat completion through the router (the orchestrator sends it).
    ThroughRouter,
}

impl AgentConfig {
    /// A config with every optional field at the default an absent TOML key
    /// gives, for code that builds configs as values (the local stack).
    pub fn new(host: impl Into<String>, orchestrator: impl Into<String>, state_dir: impl Into<PathBuf>) -> Self {
        AgentConfig {
            host: host.into(),
            orchestrator: Orchestrators::from(orchestrator.into()),
            state_dir: state_dir.into(),
            on_exit: OnExit::default(),
            shutdown_grace_ms: default_shutdown_grace_ms(),
            units: Vec::new(),
            gpu_source: default_gpu_source(),
            nvml_library: None,
            gpu_sample_interval_ms: default_gpu_sample_interval_ms(),
            gpu_snapshot_interval_ms: default_gpu_snapshot_interval_ms(),
            metrics_listen: None,
            tls: None,
            insecure_plaintext: false,
            redact_env: crate::redact::default_patterns(),
            py_spy: None,
        }
    }

    /// The config as the TOML an operator would write (`load` reads it back).
    pub fn to_toml_string(&self) -> Result<String, ConfigError> {
        toml::to_string(self).map_err(|e| ConfigError::Parse { message: e.to_string() })
    }

    /// Parses and validates a config.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let config: AgentConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            message: pdwarden_proto::limits::toml_error_line(text, &e),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Reads, parses and validates the config file at `path`, and checks
    /// that this agent can run each unit as its `user`
    /// ([`AgentConfig::check_unit_users`]).
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let config = Self::from_toml_str(&text)?;
        config.check_unit_users()?;
        Ok(config)
    }

    /// Every unit's `user` and `group` exist on this host and this agent
    /// process can start the unit as them (run by `load` and by `run`;
    /// not by `from_toml_str`, which reads a config written for another
    /// host as well). One line naming the field at fault.
    pub fn check_unit_users(&self) -> Result<(), ConfigError> {
        self.check_unit_users_as(&crate::runas::Privilege::of_this_process())
    }

    /// [`AgentConfig::check_unit_users`] for an agent of privilege `agent`.
    pub fn check_unit_users_as(&self, agent: &crate::runas::Privilege) -> Result<(), ConfigError> {
        for (i, unit) in self.units.iter().enumerate() {
            if let Some(run_as) = unit.run_as_at(i)? {
                agent
                    .may_run_as(&run_as)
                    .map_err(|why| invalid(format!("unit[{i}].user"), format!("unit {:?}: {why}", unit.name)))?;
            }
        }
        Ok(())
    }

    /// The parsed `gpu_source` (`auto` if it does not parse: `validate`
    /// rejects that), loading NVML from `nvml_library` when set.
    pub fn gpu_source_spec(&self) -> crate::gpu::GpuSourceSpec {
        crate::gpu::GpuSourceSpec::parse(&self.gpu_source)
            .unwrap_or_default()
            .with_nvml_library(self.nvml_library.clone())
    }

    /// The orchestrators' URLs, in the order written (one for a single
    /// orchestrator).
    pub fn orchestrators(&self) -> &[String] {
        self.orchestrator.urls()
    }

    /// The unit named `name`, if configured.
    pub fn unit(&self, name: &str) -> Option<&UnitConfig> {
        self.units.iter().find(|u| u.name == name)
    }

    /// Checks what serde cannot: run by `from_toml_str` and by `run` (for
    /// configs built in code).
    pub fn validate(&self) -> Result<(), ConfigError> {
        // Every duration, by its name (issue 16): none above a week.
        let tree = serde_json::to_value(self).map_err(|e| invalid("config", e.to_string()))?;
        if let Some((field, problem)) = pdwarden_proto::limits::duration_over_bound(&tree) {
            return Err(invalid(field, problem));
        }
        if self.host.trim().is_empty() {
            return Err(invalid("host", "must not be empty"));
        }
        check_orchestrators(self.orchestrators())?;
        if self.state_dir.as_os_str().is_empty() {
            return Err(invalid("state_dir", "must not be empty"));
        }
        crate::gpu::GpuSourceSpec::parse(&self.gpu_source)
            .map_err(|reason| invalid("gpu_source", reason.to_string()))?;
        if let Some(library) = &self.nvml_library {
            // Relative would depend on the agent's working directory; a NUL
            // cannot reach dlopen. Whether the file is there is checked when
            // NVML is opened, and reported like a missing driver.
            if !library.is_absolute() {
                return Err(invalid(
                    "nvml_library",
                    format!("{library:?} must be an absolute path to libnvidia-ml.so"),
                ));
            }
            if library.as_os_str().as_encoded_bytes().contains(&0) {
                return Err(invalid("nvml_library", "contains a NUL byte"));
            }
        }
        if let Some(py_spy) = &self.py_spy
            && !py_spy.is_file()
        {
            // Said at load, not when a wedged unit's stacks are wanted.
            return Err(invalid(
                "py_spy",
                format!("{py_spy:?} is not an existing file (the py-spy binary; absent: py-spy on PATH)"),
            ));
        }
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
    /// A unit with every optional field at its default.
    pub fn new(name: impl Into<String>, role: Role, argv: Vec<String>, base_url: impl Into<String>) -> Self {
        UnitConfig {
            name: name.into(),
            role,
            argv,
            env: BTreeMap::new(),
            cwd: None,
            base_url: base_url.into(),
            engine: None,
            health_path: None,
            generation_path: None,
            bootstrap_port: None,
            autostart: false,
            metrics_url: None,
            user: None,
            group: None,
        }
    }

    /// Whether it is a router (by its role or its engine kind).
    pub fn is_router(&self) -> bool {
        self.role == Role::Router || matches!(self.engine_kind(), EngineKind::SglangRouter | EngineKind::VllmRouter)
    }

    /// The value of `flag` in its argv (`--flag V` or `--flag=V`; the last
    /// one wins, as the routers' argument parsers take it).
    fn arg_value(&self, flag: &str) -> Option<&str> {
        let mut found = None;
        let mut args = self.argv.iter().skip(1);
        while let Some(a) = args.next() {
            if a == flag {
                found = args.next().map(String::as_str);
            } else if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
                found = Some(v);
            }
        }
        found
    }

    /// The port of a router's Prometheus exporter: `--prometheus-port` in
    /// its argv, else [`pdwarden_engines::ROUTER_PROMETHEUS_PORT`]. An
    /// error names a value that is not a port.
    pub fn prometheus_port(&self) -> Result<u16, NotAPort> {
        match self.arg_value("--prometheus-port") {
            None => Ok(pdwarden_engines::ROUTER_PROMETHEUS_PORT),
            Some(v) => v
                .trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| NotAPort { value: v.to_owned() }),
        }
    }

    /// Where the watch scrapes this unit's metrics: `metrics_url` if set;
    /// for a router its own exporter (see `metrics_url`); for an engine
    /// `base_url` + `metrics_path` ("" means `/metrics`).
    pub fn metrics_url_for(&self, metrics_path: &str) -> String {
        if let Some(url) = &self.metrics_url {
            return url.clone();
        }
        if self.is_router() {
            let host = self
                .arg_value("--prometheus-host")
                .map(str::trim)
                .filter(|h| !h.is_empty() && !matches!(*h, "0.0.0.0" | "::" | "[::]"))
                .map(|h| match h.parse::<std::net::Ipv6Addr>() {
                    Ok(v6) => format!("[{v6}]"),
                    Err(_) => h.to_owned(),
                })
                .or_else(|| {
                    reqwest::Url::parse(&self.base_url)
                        .ok()
                        .and_then(|u| u.host_str().map(str::to_owned))
                })
                .unwrap_or_else(|| "127.0.0.1".to_owned());
            let port = self
                .prometheus_port()
                .unwrap_or(pdwarden_engines::ROUTER_PROMETHEUS_PORT);
            return format!("http://{host}:{port}/metrics");
        }
        let path = if metrics_path.is_empty() {
            "/metrics"
        } else {
            metrics_path
        };
        format!("{}{path}", self.base_url.trim_end_matches('/'))
    }

    /// The account it runs as, looked up now (`None`: the agent's own).
    /// The error names the unit and the field (`user` or `group`).
    pub fn run_as(&self) -> Result<Option<crate::runas::RunAs>, String> {
        crate::runas::resolve(self.user.as_deref(), self.group.as_deref())
            .map_err(|(field, why)| format!("{}: {why}", field.as_str()))
    }

    fn run_as_at(&self, index: usize) -> Result<Option<crate::runas::RunAs>, ConfigError> {
        crate::runas::resolve(self.user.as_deref(), self.group.as_deref()).map_err(|(field, why)| {
            invalid(
                format!("unit[{index}].{}", field.as_str()),
                format!("unit {:?}: {why}", self.name),
            )
        })
    }

    /// The kind of server, explicit or implied by the role.
    pub fn engine_kind(&self) -> EngineKind {
        self.engine.unwrap_or(match self.role {
            Role::Router => EngineKind::SglangRouter,
            Role::Prefill | Role::Decode => EngineKind::Sglang,
        })
    }

    /// The path polled for health during start-up.
    pub fn health_path(&self) -> &str {
        self.health_path
            .as_deref()
            .unwrap_or(if self.engine.is_some() || self.role != Role::Router {
                self.engine_kind().profile().health_path
            } else {
                // A router of unnamed kind keeps the plain default.
                "/health"
            })
    }

    /// How the start-up watch proves this unit generates.
    pub fn generation_check(&self) -> GenerationCheckSpec {
        if let Some(p) = &self.generation_path {
            return GenerationCheckSpec::Get(p.clone());
        }
        match self.engine_kind().profile().generation_check {
            GenerationCheck::Get { path } => GenerationCheckSpec::Get(path.to_owned()),
            GenerationCheck::Completion => GenerationCheckSpec::Completion,
            GenerationCheck::ThroughRouter => GenerationCheckSpec::ThroughRouter,
        }
    }

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
        // A NUL cannot reach a process (argv and the environment are C
        // strings): the spawn would fail, or cut the value, long after load.
        if let Some(i) = self.argv.iter().position(|a| a.contains('\0')) {
            return Err(invalid(
                field("argv"),
                format!("unit {:?}: argv[{i}] contains a NUL byte", self.name),
            ));
        }
        for (key, value) in &self.env {
            if key.is_empty() || key.contains('=') || key.contains('\0') {
                return Err(invalid(
                    field("env"),
                    format!("unit {:?}: invalid variable name {key:?}", self.name),
                ));
            }
            if value.contains('\0') {
                return Err(invalid(
                    field("env"),
                    format!("unit {:?}: the value of {key:?} contains a NUL byte", self.name),
                ));
            }
        }
        if let Some(cwd) = &self.cwd {
            if cwd.as_os_str().is_empty() {
                return Err(invalid(field("cwd"), "must not be empty when set"));
            }
            if cwd.as_os_str().as_encoded_bytes().contains(&0) {
                return Err(invalid(
                    field("cwd"),
                    format!("unit {:?}: contains a NUL byte", self.name),
                ));
            }
        }
        for (f, value) in [("user", &self.user), ("group", &self.group)] {
            if let Some(value) = value
                && (value.trim().is_empty() || value.contains('\0') || value.contains(char::is_whitespace))
            {
                return Err(invalid(
                    field(f),
                    format!("unit {:?}: {value:?} is not a user or group name or number", self.name),
                ));
            }
        }
        if self.group.is_some() && self.user.is_none() {
            return Err(invalid(
                field("group"),
                format!(
                    "unit {:?}: group needs user (a group alone would keep the agent's own user)",
                    self.name
                ),
            ));
        }
        check_http_url(&field("base_url"), &self.base_url)?;
        for (f, path) in [
            ("health_path", &self.health_path),
            ("generation_path", &self.generation_path),
        ] {
            if let Some(path) = path
                && !path.starts_with('/')
            {
                return Err(invalid(field(f), format!("{path:?} must start with '/'")));
            }
        }
        let kind = self.engine_kind();
        let router_kind = matches!(kind, EngineKind::SglangRouter | EngineKind::VllmRouter);
        if router_kind != (self.role == Role::Router) {
            return Err(invalid(
                field("engine"),
                format!(
                    "unit {:?}: engine {:?} cannot have role {:?}",
                    self.name,
                    kind.as_str(),
                    format!("{:?}", self.role).to_lowercase()
                ),
            ));
        }
        if let Some(path) = &self.generation_path {
            if kind == EngineKind::Vllm {
                return Err(invalid(
                    field("generation_path"),
                    format!(
                        "unit {:?}: a vLLM engine has no generating GET endpoint (its {} answers 200 while the \
                         engine core is stopped); leave generation_path out: its check is a completion sent \
                         straight to the engine",
                        self.name,
                        kind.profile().health_path
                    ),
                ));
            }
            if path == self.health_path() {
                return Err(invalid(
                    field("generation_path"),
                    format!(
                        "unit {:?}: {path:?} is also its health_path: a health endpoint is not a generation \
                         check (INCIDENTS row 3); for an engine without a generating GET set engine = \"vllm\"",
                        self.name
                    ),
                ));
            }
        }
        if self.bootstrap_port == Some(0) {
            return Err(invalid(field("bootstrap_port"), "must not be 0"));
        }
        match &self.metrics_url {
            Some(url) => check_http_url(&field("metrics_url"), url)?,
            None if self.is_router() => {
                self.prometheus_port().map_err(|reason| {
                    invalid(
                        field("argv"),
                        format!(
                            "unit {:?}: {reason}; its metrics are scraped on that port (or set metrics_url)",
                            self.name
                        ),
                    )
                })?;
            }
            None => {}
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

/// One URL is the field itself; in a list each is named by its index, and
/// two spellings of one URL are a duplicate (the agent would dial one
/// orchestrator twice per round and take it for two).
fn check_orchestrators(urls: &[String]) -> Result<(), ConfigError> {
    match urls {
        [] => Err(invalid(
            "orchestrator",
            "the list is empty: name at least one orchestrator URL",
        )),
        [one] => check_http_url("orchestrator", one),
        many => {
            let mut seen: Vec<reqwest::Url> = Vec::with_capacity(many.len());
            for (i, url) in many.iter().enumerate() {
                let field = format!("orchestrator[{i}]");
                check_http_url(&field, url)?;
                let parsed = reqwest::Url::parse(url).map_err(|e| invalid(&field, e.to_string()))?;
                if let Some(first) = seen.iter().position(|u| *u == parsed) {
                    return Err(invalid(
                        field,
                        format!("{url:?} is a duplicate of orchestrator[{first}]"),
                    ));
                }
                seen.push(parsed);
            }
            Ok(())
        }
    }
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
        assert_eq!(c.gpu_source_spec(), crate::gpu::GpuSourceSpec::default());
        assert_eq!(c.gpu_sample_interval_ms, DEFAULT_GPU_SAMPLE_INTERVAL_MS);
        assert_eq!(c.gpu_snapshot_interval_ms, DEFAULT_GPU_SNAPSHOT_INTERVAL_MS);
        assert_eq!(c.metrics_listen, None);
        assert_eq!(c.nvml_library, None);
        assert_eq!(c.py_spy, None);
        let p = c.unit("prefill-0").unwrap();
        assert_eq!(p.role, Role::Prefill);
        assert_eq!(p.env.get("KEY").map(String::as_str), Some("V"));
        assert_eq!(p.health_path(), "/health");
        assert_eq!(
            p.generation_check(),
            GenerationCheckSpec::Get("/health_generate".into())
        );
        assert_eq!(p.bootstrap_port, Some(8998));
        assert!(p.autostart);
        let r = c.unit("router").unwrap();
        assert_eq!(r.health_path(), "/readiness");
        assert_eq!(r.generation_check(), GenerationCheckSpec::ThroughRouter);
        assert!(!r.autostart);
        assert_eq!(r.cwd, None);
    }

    /// Issue 15: the engine kind names the health path and a generation
    /// check that really generates. A vLLM engine (no generating GET) gets
    /// a completion, never its `/health`; a GET check that is the health
    /// endpoint is refused.
    #[test]
    fn the_engine_kind_picks_a_generation_check_that_generates() {
        let unit = |extra: &str| {
            let c = AgentConfig::from_toml_str(&format!("{HEAD}{UNIT}{extra}")).unwrap();
            c.units[0].clone()
        };
        let v = unit("engine='vllm'\n");
        assert_eq!(v.health_path(), "/health");
        assert_eq!(v.generation_check(), GenerationCheckSpec::Completion);
        let s = unit("engine='sglang'\n");
        assert_eq!(
            s.generation_check(),
            GenerationCheckSpec::Get("/health_generate".into())
        );
        let e = err(&format!("{HEAD}{UNIT}engine='vllm'\ngeneration_path='/health'\n"));
        assert!(e.contains("no generating GET"), "{e}");
        let e = err(&format!("{HEAD}{UNIT}generation_path='/health'\n"));
        assert!(e.contains("not a generation check"), "{e}");
        let r = AgentConfig::from_toml_str(&format!(
            "{HEAD}[[unit]]\nname='r'\nrole='router'\nargv=['x']\nbase_url='http://127.0.0.1:1'\nengine='vllm-router'\n"
        ))
        .unwrap();
        assert_eq!(r.units[0].health_path(), "/health");
        assert_eq!(r.units[0].generation_check(), GenerationCheckSpec::ThroughRouter);
    }

    // Property: a `py_spy` that is an existing file loads and round-trips;
    // an absent one is not written (issue 35).
    #[test]
    fn py_spy_names_an_existing_file() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let c = AgentConfig::from_toml_str(&format!("{HEAD}py_spy={:?}\n", file.path())).unwrap();
        assert_eq!(c.py_spy.as_deref(), Some(file.path()));
        assert_eq!(AgentConfig::from_toml_str(&c.to_toml_string().unwrap()).unwrap(), c);
        assert!(
            !AgentConfig::from_toml_str(HEAD)
                .unwrap()
                .to_toml_string()
                .unwrap()
                .contains("py_spy")
        );
    }

    // Property: `nvml_library` reaches the GPU source that tries NVML; a
    // file that is not there is no config error (GPU reporting says why at
    // run time, as for a missing driver); it round-trips, and an absent one
    // is not written.
    #[test]
    fn nvml_library_is_passed_to_nvml() {
        let c = AgentConfig::from_toml_str(&format!(
            "{HEAD}gpu_source='nvml'\nnvml_library='/nonexistent/libnvidia-ml.so.1'\n"
        ))
        .unwrap();
        assert_eq!(
            c.gpu_source_spec(),
            crate::gpu::GpuSourceSpec::Nvml {
                nvml_library: Some("/nonexistent/libnvidia-ml.so.1".into())
            }
        );
        assert_eq!(AgentConfig::from_toml_str(&c.to_toml_string().unwrap()).unwrap(), c);
        let auto = AgentConfig::from_toml_str(&format!("{HEAD}nvml_library='/opt/nv/libnvidia-ml.so'\n")).unwrap();
        assert_eq!(
            auto.gpu_source_spec(),
            crate::gpu::GpuSourceSpec::Auto {
                nvml_library: Some("/opt/nv/libnvidia-ml.so".into())
            }
        );
        assert!(
            !AgentConfig::from_toml_str(HEAD)
                .unwrap()
                .to_toml_string()
                .unwrap()
                .contains("nvml_library")
        );
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
    const ROUTER: &str = "[[unit]]\nname='r'\nrole='router'\nargv=['smg','launch','--prometheus-port','9100']\n\
                          base_url='http://10.1.2.3:30000/'\n";

    /// Property (issue 30): a router's metrics are scraped on its own
    /// exporter port — `--prometheus-port` in its argv (both spellings, the
    /// last one winning), else 29000 — at its base URL's host, or where
    /// `--prometheus-host` names one address; an engine's at its base URL
    /// plus the path asked; `metrics_url` overrides both and round-trips.
    #[test]
    fn metrics_url_defaults_to_the_routers_exporter_port() {
        let unit = |text: &str| AgentConfig::from_toml_str(&format!("{HEAD}{text}")).unwrap().units[0].clone();
        let r = unit(ROUTER);
        assert!(r.is_router());
        assert_eq!(r.metrics_url_for(""), "http://10.1.2.3:9100/metrics");
        assert_eq!(r.metrics_url_for("/other"), "http://10.1.2.3:9100/metrics");
        let r = unit(&ROUTER.replace("'--prometheus-port','9100'", "'--prometheus-port=9200'"));
        assert_eq!(r.metrics_url_for(""), "http://10.1.2.3:9200/metrics");
        let r = unit(&ROUTER.replace("'9100'", "'9100','--prometheus-port','9300'"));
        assert_eq!(r.metrics_url_for(""), "http://10.1.2.3:9300/metrics");
        let r = unit(&ROUTER.replace("'--prometheus-port','9100'", "'--port','30000'"));
        assert_eq!(r.metrics_url_for(""), "http://10.1.2.3:29000/metrics");
        let r = unit(&ROUTER.replace("'9100'", "'9100','--prometheus-host','127.0.0.1'"));
        assert_eq!(r.metrics_url_for(""), "http://127.0.0.1:9100/metrics");
        let r = unit(&ROUTER.replace("'9100'", "'9100','--prometheus-host','0.0.0.0'"));
        assert_eq!(r.metrics_url_for(""), "http://10.1.2.3:9100/metrics");
        let r = unit(&ROUTER.replace("http://10.1.2.3:30000/", "http://[::1]:30000"));
        assert_eq!(r.metrics_url_for(""), "http://[::1]:9100/metrics");
        // A router named by its engine kind, with vllm-router's flag.
        let v = unit(
            "[[unit]]\nname='v'\nrole='router'\nengine='vllm-router'\nargv=['vllm-router','--prometheus-port','29500']\n\
             base_url='http://127.0.0.1:8000'\n",
        );
        assert_eq!(v.metrics_url_for(""), "http://127.0.0.1:29500/metrics");
        let e = unit(UNIT);
        assert!(!e.is_router());
        assert_eq!(e.metrics_url_for(""), "http://127.0.0.1:1/metrics");
        assert_eq!(e.metrics_url_for("/m2"), "http://127.0.0.1:1/m2");
        let set =
            AgentConfig::from_toml_str(&format!("{HEAD}{ROUTER}metrics_url='https://prom.example:9443/x'\n")).unwrap();
        assert_eq!(set.units[0].metrics_url_for(""), "https://prom.example:9443/x");
        assert_eq!(AgentConfig::from_toml_str(&set.to_toml_string().unwrap()).unwrap(), set);
        assert!(
            !AgentConfig::from_toml_str(FULL)
                .unwrap()
                .to_toml_string()
                .unwrap()
                .contains("metrics_url")
        );
    }

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
            (
                format!("{HEAD}nvml_library='libnvidia-ml.so.1'\n"),
                "field `nvml_library`: \"libnvidia-ml.so.1\" must be an absolute path",
            ),
            (format!("{HEAD}nvml_library=''\n"), "field `nvml_library`"),
            (
                format!("{HEAD}nvml_library=\"/lib/nv\\u0000.so\"\n"),
                "field `nvml_library`: contains a NUL byte",
            ),
            (format!("{HEAD}nvml_library=3\n"), "nvml_library"),
            (
                format!("{HEAD}py_spy='/nonexistent/py-spy'\n"),
                "field `py_spy`: \"/nonexistent/py-spy\" is not an existing file",
            ),
            (format!("{HEAD}py_spy='/tmp'\n"), "field `py_spy`"),
            (format!("{HEAD}py_spy=3\n"), "py_spy"),
            (format!("{HEAD}{UNIT}engine='tgi'\n"), "engine"),
            (format!("{HEAD}{UNIT}engine='vllm-router'\n"), "engine"),
            (
                format!("{HEAD}{UNIT}engine='vllm'\ngeneration_path='/health_generate'\n"),
                "generation_path",
            ),
            (format!("{HEAD}{UNIT}generation_path='/health'\n"), "generation_path"),
            (format!("{HEAD}{UNIT}metrics_url='nope'\n"), "unit[0].metrics_url"),
            (
                format!("{HEAD}{UNIT}metrics_url='ftp://h/metrics'\n"),
                "unit[0].metrics_url",
            ),
            (format!("{HEAD}{UNIT}metrics_url=3\n"), "metrics_url"),
            (
                format!("{HEAD}{}", ROUTER.replace("'9100'", "'ninety'")),
                "unit[0].argv`: unit \"r\": --prometheus-port \"ninety\" is not a port",
            ),
            // Issue 16: durations past a week, named by their path.
            (
                format!("shutdown_grace_ms=18446744073709551615\n{HEAD}"),
                "`shutdown_grace_ms`: 18446744073709551615 ms is over the bound",
            ),
            (
                format!("gpu_sample_interval_ms=604800001\n{HEAD}"),
                "`gpu_sample_interval_ms`: 604800001 ms is over the bound",
            ),
            // One line naming the line and the field.
            (
                format!("{HEAD}{UNIT}bootstrap_port='x'\n"),
                "line 9, field unit.bootstrap_port: invalid type",
            ),
        ];
        for (text, field) in cases {
            let e = err(&text);
            assert!(e.contains(field), "error for {field}: {e}\n--- config:\n{text}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }

    /// Issue 32, finding 2: a NUL byte in a unit's argv or in its
    /// environment loaded, and the spawn failed later (or the value was cut
    /// at the NUL). Refused at load, in one line naming the unit and field.
    #[test]
    fn a_nul_in_argv_or_env_is_refused_naming_the_unit_and_field() {
        for (text, says) in [
            (
                UNIT.replace("['sleep','1']", "['sleep',\"1\\u0000\"]"),
                "field `unit[0].argv`: unit \"u\": argv[1] contains a NUL byte",
            ),
            (
                UNIT.replace("['sleep','1']", "[\"sl\\u0000eep\"]"),
                "field `unit[0].argv`: unit \"u\": argv[0] contains a NUL byte",
            ),
            (
                format!("{UNIT}env={{\"A\\u0000\"='c'}}\n"),
                "field `unit[0].env`: unit \"u\": invalid variable name \"A\\0\"",
            ),
            (
                format!("{UNIT}env={{A=\"c\\u0000d\"}}\n"),
                "field `unit[0].env`: unit \"u\": the value of \"A\" contains a NUL byte",
            ),
            (
                format!("{UNIT}cwd=\"/tmp\\u0000x\"\n"),
                "field `unit[0].cwd`: unit \"u\": contains a NUL byte",
            ),
        ] {
            let e = err(&format!("{HEAD}{text}"));
            assert!(e.contains(says), "want {says:?} in: {e}");
            assert!(!e.contains('\n') && !e.contains('\0'), "one line: {e:?}");
        }
    }

    // Property (issue 19): `orchestrator` takes a list of URLs as well as
    // one; the list keeps its order, one URL and a one-URL list are the same
    // config, and both forms round-trip through the TOML the stack writes.
    #[test]
    fn orchestrator_is_one_url_or_a_list() {
        let c = AgentConfig::from_toml_str(
            "host='h'\norchestrator=['http://a:7070', 'http://b:7070', 'https://c:7070']\nstate_dir='/tmp'\n",
        )
        .unwrap();
        assert_eq!(c.orchestrators(), ["http://a:7070", "http://b:7070", "https://c:7070"]);
        assert_eq!(AgentConfig::from_toml_str(&c.to_toml_string().unwrap()).unwrap(), c);

        let one = AgentConfig::from_toml_str(HEAD).unwrap();
        assert_eq!(one.orchestrators(), ["http://x:1"]);
        let listed = AgentConfig::from_toml_str(&HEAD.replace("'http://x:1'", "['http://x:1']")).unwrap();
        assert_eq!(listed, one);
        assert!(
            one.to_toml_string().unwrap().contains("orchestrator = \"http://x:1\""),
            "one URL is written as a plain URL"
        );
        assert_eq!(
            AgentConfig::new("h", "http://x:1", "/tmp").orchestrators(),
            ["http://x:1"]
        );
    }

    // Property (issue 19): a bad list is one line naming the field, and the
    // index of the bad URL: a malformed URL, an empty list, a duplicate
    // (also when spelled differently), a list of something else.
    #[test]
    fn a_bad_orchestrator_list_names_the_field_and_index() {
        let with = |list: &str| err(&HEAD.replace("'http://x:1'", list));
        let cases = [
            (
                with("['http://a:1', 'http://b:1', 'nope']"),
                "field `orchestrator[2]`: \"nope\" is not a URL",
            ),
            (
                with("['http://a:1', 'ftp://b']"),
                "field `orchestrator[1]`: \"ftp://b\" must be an http://",
            ),
            (with("[]"), "field `orchestrator`: the list is empty"),
            (
                with("['http://a:1', 'http://b:1', 'http://A:1/']"),
                "field `orchestrator[2]`: \"http://A:1/\" is a duplicate of orchestrator[0]",
            ),
            (with("3"), "expected an orchestrator URL or a list of orchestrator URLs"),
            (with("['http://a:1', 3]"), "orchestrator"),
        ];
        for (e, want) in cases {
            assert!(e.contains(want), "want {want:?} in: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }

    /// Issue 48, item 5: a unit has no `user` and every engine ran as the
    /// agent's user, root. `user` and `group` parse, round-trip and are
    /// left out when absent; written wrong they are refused by
    /// `from_toml_str` naming the field; a name the host lacks is refused
    /// by `load` (and `check_unit_users`), in one line naming the field,
    /// while `from_toml_str` still reads a config written for another host.
    #[test]
    fn a_units_user_and_group_are_checked_at_load() {
        let c = AgentConfig::from_toml_str(&format!("{HEAD}{UNIT}user='nobody'\ngroup='0'\n")).unwrap();
        assert_eq!(c.units[0].user.as_deref(), Some("nobody"));
        assert_eq!(c.units[0].group.as_deref(), Some("0"));
        assert_eq!(AgentConfig::from_toml_str(&c.to_toml_string().unwrap()).unwrap(), c);
        let plain = AgentConfig::from_toml_str(&format!("{HEAD}{UNIT}")).unwrap();
        assert_eq!(
            (plain.units[0].user.as_deref(), plain.units[0].run_as()),
            (None, Ok(None))
        );
        let written = plain.to_toml_string().unwrap();
        assert!(!written.contains("user") && !written.contains("group"), "{written}");
        let root = crate::runas::Privilege {
            uid: 0,
            gid: 0,
            setid_capable: true,
        };
        assert!(c.check_unit_users_as(&root).is_ok());

        for (text, says) in [
            (
                format!("{UNIT}user=''\n"),
                "field `unit[0].user`: unit \"u\": \"\" is not a user",
            ),
            (format!("{UNIT}user='a b'\n"), "field `unit[0].user`"),
            (format!("{UNIT}user=3\n"), "field unit.user: invalid type"),
            (
                format!("{UNIT}group='video'\n"),
                "field `unit[0].group`: unit \"u\": group needs user",
            ),
            (format!("{UNIT}user='nobody'\ngroup=' '\n"), "field `unit[0].group`"),
        ] {
            let e = err(&format!("{HEAD}{text}"));
            assert!(e.contains(says), "want {says:?} in: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }

        let dir = tempfile::tempdir().unwrap();
        for (text, says) in [
            (
                format!("{UNIT}user='pdwarden-no-such-user'\n"),
                "agent config: field `unit[0].user`: unit \"u\": no such user \"pdwarden-no-such-user\" on this host",
            ),
            (
                format!("{UNIT}user='nobody'\ngroup='pdwarden-no-such-group'\n"),
                "agent config: field `unit[0].group`: unit \"u\": no such group \"pdwarden-no-such-group\" on this host",
            ),
        ] {
            let text = format!("{HEAD}{text}");
            AgentConfig::from_toml_str(&text).expect("parsing alone does not look users up");
            let path = dir.path().join("agent.toml");
            std::fs::write(&path, &text).unwrap();
            assert_eq!(AgentConfig::load(&path).unwrap_err().to_string(), says);
            assert_eq!(
                AgentConfig::from_toml_str(&text)
                    .unwrap()
                    .check_unit_users_as(&root)
                    .unwrap_err()
                    .to_string(),
                says
            );
        }

        // An agent that is not root refuses a unit of another user.
        let unprivileged = crate::runas::Privilege {
            uid: 1000,
            gid: 1000,
            setid_capable: false,
        };
        let e = c.check_unit_users_as(&unprivileged).unwrap_err().to_string();
        assert!(
            e.starts_with("agent config: field `unit[0].user`: unit \"u\": the agent runs as uid 1000, not root"),
            "{e}"
        );
    }

    // Property: load() reports the path of a missing file.
    #[test]
    fn load_names_missing_file() {
        let e = AgentConfig::load("/nonexistent/pdwarden-agent.toml").unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }));
        assert!(e.to_string().contains("/nonexistent/pdwarden-agent.toml"));
    }
}
