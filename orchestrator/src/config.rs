//! The orchestrator's static configuration: which pairs exist, which agent
//! units make them up, and the budgets their restarts are judged against
//! (DESIGN.md 8). Unknown fields are errors, and every invalid value is
//! reported with the field it came from, because a typo in a budget at 3 a.m.
//! must not silently become a default.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

// Each message already carries its cause's text (the TOML error quotes the
// line), so no variant also exposes it as a `source`: an operator would see
// every message two or three times in the error's "Caused by" chain.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {error}")]
    Read { path: PathBuf, error: std::io::Error },
    /// One line: the TOML line, the field and the parser's message.
    #[error("invalid config: {0}")]
    Parse(String),
    #[error("{path}: {error}")]
    InFile { path: PathBuf, error: Box<ConfigError> },
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
    /// Where operations are journaled: `sqlite:PATH` (or a bare path; one
    /// orchestrator owns the file) or `etcd:URL,URL,...` (several
    /// orchestrators, one leader; needs `[leadership]` and a build with the
    /// `etcd` feature).
    pub journal: JournalSpec,
    /// With an etcd journal: how this orchestrator is reached and how long
    /// its leadership lease lasts (issue 19).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leadership: Option<LeadershipConfig>,
    #[serde(default, rename = "pair")]
    pub pairs: Vec<PairConfig>,
    /// Plain-HTTP readiness endpoint for load balancers and gateways
    /// (`GET /ready/pair/NAME`, `/ready/unit/HOST/UNIT`, `/ready`); off when absent.
    #[serde(default)]
    pub readiness_listen: Option<SocketAddr>,
    /// After an orchestrator restart, how long to wait for every agent of a
    /// pair with an interrupted operation to re-attach before resuming it
    /// (without them the operation is concluded `failed`, never guessed at).
    #[serde(default = "default_resume_grace_ms")]
    pub resume_grace_ms: u64,
    /// Mutual TLS for agents and the CLI (issue 8): the pdwarden CA (client
    /// certificates must chain to it) and this server's certificate and key.
    #[serde(default)]
    pub tls: Option<pdwarden_security::tls::TlsFiles>,
    /// No TLS, agents' hosts taken on trust, and — without `[[operator]]` —
    /// no tokens: local development only; logged and shown by `status`.
    #[serde(default)]
    pub insecure_plaintext: bool,
    /// How long the journal keeps operations (issue 36): the newest whole,
    /// older ones as summaries, then removed. `[retention]`.
    #[serde(default)]
    pub retention: crate::ops::journal::RetentionPolicy,
    /// Who may use the operator API, by token hash and role.
    #[serde(default, rename = "operator")]
    pub operators: Vec<pdwarden_security::operators::OperatorConfig>,
    /// Environment variable names whose values `status`, `history` and
    /// operation reports never show (case-insensitive globs).
    #[serde(default = "pdwarden_security::redact::default_patterns")]
    pub redact_env: Vec<String>,
}

/// The journal's store (DESIGN.md 15), written as one string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JournalSpec {
    /// `sqlite:PATH` or a bare path.
    Sqlite(PathBuf),
    /// `etcd:URL,URL,...`: the etcd cluster's client URLs.
    Etcd(Vec<String>),
}

/// Why a `journal` string names no store; each is one line, which the TOML
/// error then places on the `journal` line of the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalSpecError {
    /// `etcd:` with no endpoint, or an empty one between commas.
    #[error(
        "{text:?}: an etcd journal needs its endpoints, comma-separated: etcd:http://10.0.0.1:2379,http://10.0.0.2:2379"
    )]
    EtcdEndpointsMissing { text: String },
    #[error("etcd endpoint {url:?} must be an http:// or https:// URL (e.g. http://10.0.0.1:2379)")]
    EtcdEndpointNotHttp { url: String },
    #[error("etcd endpoint {url:?} is given twice")]
    EtcdEndpointTwice { url: String },
    /// `sqlite:` (or an empty string) with no path.
    #[error("needs a path: sqlite:/var/lib/pdwarden/journal.sqlite, or etcd:URL,... for several orchestrators")]
    SqlitePathMissing,
}

impl JournalSpec {
    /// Reads `sqlite:PATH`, `etcd:URL,...` or a bare path; the error says
    /// what is wrong in one line.
    pub fn parse(text: &str) -> Result<Self, JournalSpecError> {
        if let Some(list) = text.strip_prefix("etcd:") {
            let urls: Vec<String> = list.split(',').map(|u| u.trim().to_string()).collect();
            if urls.iter().any(String::is_empty) {
                return Err(JournalSpecError::EtcdEndpointsMissing { text: text.to_string() });
            }
            if let Some(u) = urls
                .iter()
                .find(|u| !(u.starts_with("http://") || u.starts_with("https://")))
            {
                return Err(JournalSpecError::EtcdEndpointNotHttp { url: u.clone() });
            }
            let mut seen = HashSet::new();
            if let Some(d) = urls.iter().find(|u| !seen.insert(u.as_str())) {
                return Err(JournalSpecError::EtcdEndpointTwice { url: d.clone() });
            }
            return Ok(Self::Etcd(urls));
        }
        let path = text.strip_prefix("sqlite:").unwrap_or(text);
        if path.trim().is_empty() {
            return Err(JournalSpecError::SqlitePathMissing);
        }
        Ok(Self::Sqlite(PathBuf::from(path)))
    }

    /// The SQLite file, for a SQLite journal.
    pub fn sqlite_path(&self) -> Option<&Path> {
        match self {
            Self::Sqlite(p) => Some(p),
            Self::Etcd(_) => None,
        }
    }
}

impl std::fmt::Display for JournalSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sqlite(p) => write!(f, "sqlite:{}", p.display()),
            Self::Etcd(urls) => write!(f, "etcd:{}", urls.join(",")),
        }
    }
}

impl From<PathBuf> for JournalSpec {
    fn from(p: PathBuf) -> Self {
        Self::Sqlite(p)
    }
}

impl Serialize for JournalSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for JournalSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// How an orchestrator on an etcd journal campaigns and is found (issue 19).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LeadershipConfig {
    /// The URL agents and the CLI reach this orchestrator at (it is what a
    /// follower tells them when this one leads), e.g. `https://orch-a:7070`.
    pub advertise_url: String,
    /// The leadership lease: a leader that cannot renew it within this many
    /// seconds stops leading, and another takes over after it lapses.
    #[serde(default = "default_lease_ttl_s")]
    pub lease_ttl_s: u64,
    /// The key prefix in etcd; orchestrators with the same prefix share
    /// one journal and one leadership.
    #[serde(default = "default_etcd_prefix")]
    pub prefix: String,
    /// A journal read or write that etcd has not answered in this long has
    /// failed (no quorum, or unreachable).
    #[serde(default = "default_etcd_timeout_ms")]
    pub etcd_timeout_ms: u64,
    /// Mutual TLS to etcd (its `--trusted-ca-file` CA, and a client
    /// certificate and key it accepts): required for `https://` endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_tls: Option<pdwarden_security::tls::TlsFiles>,
}

fn default_lease_ttl_s() -> u64 {
    5
}
fn default_etcd_prefix() -> String {
    "/pdwarden".into()
}
fn default_etcd_timeout_ms() -> u64 {
    2_000
}

impl LeadershipConfig {
    pub fn new(advertise_url: impl Into<String>) -> Self {
        Self {
            advertise_url: advertise_url.into(),
            lease_ttl_s: default_lease_ttl_s(),
            prefix: default_etcd_prefix(),
            etcd_timeout_ms: default_etcd_timeout_ms(),
            etcd_tls: None,
        }
    }
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
    /// The verification suite run after the probe series (issue 4).
    #[serde(default)]
    pub suite: SuiteConfig,
    /// The continuous wedge watch and automatic recovery (issue 5).
    #[serde(default)]
    pub watch: WatchConfig,
    /// The change gate's benchmark and tolerance (issue 7).
    #[serde(default)]
    pub gate: pdwarden_model::gate::config::GateConfig,
    /// The router the pair's clients use when it is not the pair's own
    /// (shared with other pairs): a co-restart takes the pair's engines out
    /// of it first, waits for their work to drain, verifies the pair through
    /// its own router and only then puts them back (issue 18).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving_router: Option<ServingRouterConfig>,
    /// What the engines' KV link remembers about their peers, which decides
    /// what must restart with a restarted engine (issue 37,
    /// `restart --only-sick`).
    #[serde(default)]
    pub kv_transfer: KvTransfer,
    /// Engines of each side (prefills, decodes) a repair (`restart
    /// --only-sick`, the watch's recovery of an xPyD pool) keeps serving in
    /// the router while it restarts others (issue 46, item 4): a round never
    /// takes more out; what it cannot restart and keep this many waits for
    /// the next round, or the whole ordered co-restart runs instead, said.
    #[serde(default = "default_repair_keeps_serving")]
    pub repair_keeps_serving: usize,
    /// Never configured: a part of an xPyD pool restarted alone (issue 37,
    /// `ops::repair`) that has no engine on one side is probed over its
    /// paths with this engine of the pool's other side.
    #[serde(skip)]
    pub probe_partner: Option<UnitRef>,
}

/// `[pair] kv_transfer`: how the engines' KV transfer link keeps state
/// about its peers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KvTransfer {
    /// SGLang's bootstrap server (the default): a decode caches each
    /// prefill's identity by address, a prefill remembers the decode
    /// instances it served (INCIDENTS row 1). Behind one router any
    /// engine's restart takes the whole pool with it.
    #[default]
    Sglang,
    /// vLLM's NixlConnector: a restarted prefill is met afresh (its engine
    /// id is new at every start) and the prefill keeps no state about
    /// decodes: an engine restarts alone.
    Nixl,
    /// A link that caches each prefill's identity by address and keeps no
    /// decode state (vLLM's MoRIIO connector): a decode restarts alone; a
    /// restarted prefill takes every decode of the pool with it (they hold
    /// its old identity).
    Address,
}

/// `[pair.serving_router]`: a router unit outside every pair (its agent
/// calls the router's worker API), and how long a drain may take.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServingRouterConfig {
    /// The agent host that runs the serving router.
    pub host: String,
    /// The router's unit on that host (an `sglang-router` or `vllm-router`).
    pub unit: String,
    /// How long the pair's in-flight requests and KV transfers may take to
    /// reach zero once it is out of rotation; past it the restart goes on,
    /// and the report says what was still in flight.
    #[serde(default = "ServingRouterConfig::default_drain_timeout_ms")]
    pub drain_timeout_ms: u64,
    /// How long the router may take to list the pair's engines healthy
    /// again after they are put back.
    #[serde(default = "ServingRouterConfig::default_rejoin_timeout_ms")]
    pub rejoin_timeout_ms: u64,
    /// Between two reads of the engines' gauges (and of the router's list).
    #[serde(default = "ServingRouterConfig::default_poll_ms")]
    pub poll_ms: u64,
}

impl ServingRouterConfig {
    pub fn new(host: impl Into<String>, unit: impl Into<String>) -> Self {
        ServingRouterConfig {
            host: host.into(),
            unit: unit.into(),
            drain_timeout_ms: Self::default_drain_timeout_ms(),
            rejoin_timeout_ms: Self::default_rejoin_timeout_ms(),
            poll_ms: Self::default_poll_ms(),
        }
    }

    /// SGLang refreshes an idle engine's gauges at most every 30 s
    /// (`pdwarden_engines`' profile): a drain must be able to outlast one
    /// stale reading.
    fn default_drain_timeout_ms() -> u64 {
        60_000
    }

    fn default_rejoin_timeout_ms() -> u64 {
        30_000
    }

    fn default_poll_ms() -> u64 {
        250
    }

    pub fn unit_ref(&self) -> UnitRef {
        UnitRef::new(self.host.clone(), self.unit.clone())
    }
}

/// The continuous watch of a pair: passive engine metrics first, active
/// probes only when those are missing or suspicious, automatic co-restart of
/// a confirmed wedge, bounded by a circuit breaker. Every field is optional.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct WatchConfig {
    /// Watch this pair at all.
    pub enabled: bool,
    /// Recover a confirmed wedge automatically (else only report it).
    pub auto_recover: bool,
    /// Period of the agent's metrics + health scrape of each engine.
    pub scrape_interval_ms: u64,
    /// Requests present without token progress this long is suspicious
    /// (a wedge once it also outlasts the worst prefill, or at once if the
    /// GPU is known idle).
    pub stall_budget_ms: u64,
    /// The longest prompt the pair accepts, in tokens; with
    /// `prefill_tok_per_s` it bounds the worst legitimate prefill.
    pub max_prompt_tokens: u64,
    /// The slowest prefill speed to plan for, tokens per second.
    pub prefill_tok_per_s: f64,
    /// The most output tokens a request may ask for; with `decode_tok_per_s`
    /// it bounds the longest legitimate generation.
    pub max_output_tokens: u64,
    /// The slowest decode speed of one request to plan for, tokens per second.
    pub decode_tok_per_s: f64,
    /// The longest legitimate KV transfer of one prefilled request to its decode.
    pub max_kv_transfer_ms: u64,
    /// The engines' `--chunked-prefill-size` (SGLang's `/get_server_info`
    /// shows it): a during-work counter then rises at least every chunk, so a
    /// stall is confirmed after one chunk at the slowest speed instead of the
    /// whole worst prefill. Unset: the worst prefill (chunking off).
    pub prefill_chunk_tokens: Option<u64>,
    /// What the pair's engines are (`sglang` or `vllm`): which metrics rise
    /// during work and what health means (`pdwarden_engines`). A scrape that
    /// shows the other kind's metric names wins.
    pub engine: pdwarden_engines::EngineKind,
    /// How stale an idle engine's gauges may be; unset: the engine profile's
    /// figure (SGLang: 30 s). Only a scaled simulation should set it.
    pub idle_gauge_refresh_ms: Option<u64>,
    /// Without traffic proving liveness, at most one probe per interval.
    pub idle_probe_interval_ms: u64,
    /// The minimum gap between any two probes.
    pub min_probe_interval_ms: u64,
    /// A probe that would need a longer timeout (to cover the prefills
    /// queued ahead of it) waits instead of being sent.
    pub max_probe_timeout_ms: u64,
    /// GPU utilisation (0..1) under which the GPU counts as idle.
    pub gpu_idle_below: f64,
    /// Circuit breaker: at most this many automatic recoveries per window...
    pub max_recoveries: u32,
    /// ...of this length; then the pair is held for a human.
    pub recovery_window_ms: u64,
    /// Before a pair judged wedged is stopped (its automatic recovery, or
    /// an operator's restart while the watch calls it wedged, suspect or
    /// held), its evidence is captured for at most this long, every unit
    /// together (issue 35); the restart goes on when it expires. 0: no
    /// capture.
    pub evidence_deadline_ms: u64,
    /// An xPyD pair behind its router recovers by restarting only the
    /// engines its path matrix names (issue 37, `restart --only-sick`),
    /// falling back to the whole ordered co-restart when the failures do
    /// not single anything out. false: always the whole co-restart.
    pub recover_only_sick: bool,
}

impl Default for WatchConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            auto_recover: true,
            scrape_interval_ms: 1_000,
            stall_budget_ms: 8_000,
            max_prompt_tokens: 32_768,
            prefill_tok_per_s: 5_000.0,
            max_output_tokens: 4_096,
            decode_tok_per_s: 10.0,
            max_kv_transfer_ms: 10_000,
            prefill_chunk_tokens: None,
            engine: pdwarden_engines::EngineKind::Sglang,
            idle_gauge_refresh_ms: None,
            idle_probe_interval_ms: 60_000,
            min_probe_interval_ms: 5_000,
            max_probe_timeout_ms: 600_000,
            gpu_idle_below: 0.05,
            max_recoveries: 3,
            recovery_window_ms: 3_600_000,
            evidence_deadline_ms: pdwarden_model::forensics::DEFAULT_DEADLINE_MS,
            recover_only_sick: true,
        }
    }
}

/// The range of every count of tokens the watch plans with (`max_prompt_tokens`,
/// `max_output_tokens`, `prefill_chunk_tokens`): ten times the longest context
/// any model offers today is still a typo, not a plan.
pub const WATCH_TOKENS: std::ops::RangeInclusive<u64> = 1..=100_000_000;

/// The range of the speeds the watch plans for (`prefill_tok_per_s`,
/// `decode_tok_per_s`), tokens per second: a decode step of 100 s at the
/// slowest, and no legitimate work shorter than a millisecond at the fastest.
pub const WATCH_TOK_PER_S: std::ops::RangeInclusive<f64> = 0.01..=1e9;

/// The range of `scrape_interval_ms`: a scrape a minute apart leaves the watch
/// blind for minutes (staleness is three scrapes); under 100 ms it is an
/// engine's load, not its watch.
pub const WATCH_SCRAPE_MS: std::ops::RangeInclusive<u64> = 100..=60_000;

/// The longest `evidence_deadline_ms`: a recovery waits for its capture.
pub const WATCH_EVIDENCE_MS: u64 = 60_000;

/// The range of `max_recoveries` per window: past a hundred it is no breaker.
pub const WATCH_MAX_RECOVERIES: std::ops::RangeInclusive<u32> = 1..=100;

impl WatchConfig {
    /// Every watch number in a range where nothing the watch computes from
    /// it can overflow or panic (issue 31, item 4): the durations (each
    /// `_ms` is also bounded to one week by the config's generic check), the
    /// token counts, the speeds, and the worst prefill and generation they
    /// make. The error is (field, problem), the field relative to `watch`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |f: &str, p: String| Err((f.to_string(), p));
        let week = pdwarden_proto::limits::MAX_DURATION_MS;
        for (f, v) in [
            ("stall_budget_ms", self.stall_budget_ms),
            ("idle_probe_interval_ms", self.idle_probe_interval_ms),
            ("min_probe_interval_ms", self.min_probe_interval_ms),
            ("max_probe_timeout_ms", self.max_probe_timeout_ms),
            ("recovery_window_ms", self.recovery_window_ms),
            ("max_kv_transfer_ms", self.max_kv_transfer_ms),
            ("idle_gauge_refresh_ms", self.idle_gauge_refresh_ms.unwrap_or(1)),
        ] {
            if v == 0 {
                return bad(f, "must be greater than 0".into());
            }
            if v > week {
                return bad(f, format!("{v} ms is over the bound of one week ({week} ms)"));
            }
        }
        if self.evidence_deadline_ms > WATCH_EVIDENCE_MS {
            return bad(
                "evidence_deadline_ms",
                format!(
                    "{} ms is over {WATCH_EVIDENCE_MS} ms: the restart of a wedged pair waits for it",
                    self.evidence_deadline_ms
                ),
            );
        }
        if !WATCH_SCRAPE_MS.contains(&self.scrape_interval_ms) {
            return bad(
                "scrape_interval_ms",
                format!(
                    "{} is outside {}..={} ms",
                    self.scrape_interval_ms,
                    WATCH_SCRAPE_MS.start(),
                    WATCH_SCRAPE_MS.end()
                ),
            );
        }
        for (f, v) in [
            ("max_prompt_tokens", self.max_prompt_tokens),
            ("max_output_tokens", self.max_output_tokens),
            ("prefill_chunk_tokens", self.prefill_chunk_tokens.unwrap_or(1)),
        ] {
            if !WATCH_TOKENS.contains(&v) {
                return bad(
                    f,
                    format!(
                        "{v} is outside {}..={} tokens",
                        WATCH_TOKENS.start(),
                        WATCH_TOKENS.end()
                    ),
                );
            }
        }
        for (f, v) in [
            ("prefill_tok_per_s", self.prefill_tok_per_s),
            ("decode_tok_per_s", self.decode_tok_per_s),
        ] {
            // NaN is in no range.
            if !WATCH_TOK_PER_S.contains(&v) {
                return bad(
                    f,
                    format!(
                        "{v:?} is outside {:?}..={:?} tokens per second",
                        WATCH_TOK_PER_S.start(),
                        WATCH_TOK_PER_S.end()
                    ),
                );
            }
        }
        // What the watch derives from them: each worst case within a week.
        for (f, tokens, rate, what, ms) in [
            (
                "prefill_tok_per_s",
                ("max_prompt_tokens", self.max_prompt_tokens),
                self.prefill_tok_per_s,
                "prefill",
                self.max_prefill_ms(),
            ),
            (
                "decode_tok_per_s",
                ("max_output_tokens", self.max_output_tokens),
                self.decode_tok_per_s,
                "generation",
                self.max_generation_ms(),
            ),
        ] {
            if ms > week {
                return bad(
                    f,
                    format!(
                        "{rate:?} makes the worst {what} ({} {} tokens) {ms} ms, over the bound of one week ({week} ms)",
                        tokens.0, tokens.1
                    ),
                );
            }
        }
        if !(0.0..=1.0).contains(&self.gpu_idle_below) {
            return bad("gpu_idle_below", "must be between 0 and 1".into());
        }
        if self.max_recoveries == 0 {
            return bad(
                "max_recoveries",
                "must be at least 1 (set auto_recover = false to never recover automatically)".into(),
            );
        }
        if !WATCH_MAX_RECOVERIES.contains(&self.max_recoveries) {
            return bad(
                "max_recoveries",
                format!(
                    "{} is outside {}..={} per window",
                    self.max_recoveries,
                    WATCH_MAX_RECOVERIES.start(),
                    WATCH_MAX_RECOVERIES.end()
                ),
            );
        }
        if self.min_probe_interval_ms > self.idle_probe_interval_ms {
            return bad(
                "min_probe_interval_ms",
                format!(
                    "{} exceeds idle_probe_interval_ms ({})",
                    self.min_probe_interval_ms, self.idle_probe_interval_ms
                ),
            );
        }
        if matches!(
            self.engine,
            pdwarden_engines::EngineKind::SglangRouter | pdwarden_engines::EngineKind::VllmRouter
        ) {
            return bad(
                "engine",
                "names the pair's engines: \"sglang\" or \"vllm\", not a router".into(),
            );
        }
        Ok(())
    }

    /// The worst legitimate prefill, in ms.
    pub fn max_prefill_ms(&self) -> u64 {
        (self.max_prompt_tokens as f64 * 1000.0 / self.prefill_tok_per_s).ceil() as u64
    }

    /// The worst legitimate generation, in ms.
    pub fn max_generation_ms(&self) -> u64 {
        (self.max_output_tokens as f64 * 1000.0 / self.decode_tok_per_s).ceil() as u64
    }

    /// One prefill chunk at the slowest speed (the worst prefill when
    /// `prefill_chunk_tokens` is unset), in ms.
    pub fn max_prefill_chunk_ms(&self) -> u64 {
        let chunk = self
            .prefill_chunk_tokens
            .map_or(self.max_prompt_tokens, |c| c.min(self.max_prompt_tokens));
        (chunk as f64 * 1000.0 / self.prefill_tok_per_s).ceil() as u64
    }
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

impl ProbeConfig {
    /// A probe with every optional field at its default.
    pub fn new(
        model: impl Into<String>,
        prompt: impl Into<String>,
        warm_budget_ms: u64,
        cold_allowance_ms: u64,
        probe_timeout_ms: u64,
    ) -> Self {
        ProbeConfig {
            model: model.into(),
            prompt: prompt.into(),
            max_tokens: default_max_tokens(),
            warm_budget_ms,
            cold_allowance_ms,
            warm_probes: default_warm_probes(),
            max_probes: default_max_probes(),
            probe_timeout_ms,
            cold_allowance_margin: default_cold_margin(),
        }
    }
}

impl PairConfig {
    /// A pair with its timeouts, suite, watch and gate at their defaults.
    pub fn new(
        name: impl Into<String>,
        prefill: Vec<UnitRef>,
        decode: Vec<UnitRef>,
        router: Vec<UnitRef>,
        probe: ProbeConfig,
    ) -> Self {
        PairConfig {
            name: name.into(),
            decode_start_policy: DecodeStartPolicy::default(),
            prefill,
            decode,
            router,
            probe,
            timeouts: TimeoutConfig::default(),
            suite: SuiteConfig::default(),
            watch: WatchConfig::default(),
            gate: pdwarden_model::gate::config::GateConfig::default(),
            serving_router: None,
            kv_transfer: KvTransfer::default(),
            repair_keeps_serving: default_repair_keeps_serving(),
            probe_partner: None,
        }
    }
}

impl UnitRef {
    pub fn new(host: impl Into<String>, unit: impl Into<String>) -> Self {
        UnitRef {
            host: host.into(),
            unit: unit.into(),
        }
    }
}

fn default_repair_keeps_serving() -> usize {
    1
}

fn default_cold_margin() -> f64 {
    2.0
}

/// What retention must keep (issue 36): the cold-start history, the
/// suite's baseline and the golden reference read a pair's newest 50
/// operations whole; the breaker counts up to a week of recoveries.
fn check_retention(r: &crate::ops::journal::RetentionPolicy) -> Result<(), ConfigError> {
    if r.full_per_pair < 50 {
        return Err(invalid(
            "retention.full_per_pair",
            format!(
                "{} is under 50: the cold-start history, the suite's baseline and the golden reference read each pair's newest 50 operations whole",
                r.full_per_pair
            ),
        ));
    }
    if r.summaries_per_pair < r.full_per_pair {
        return Err(invalid(
            "retention.summaries_per_pair",
            format!(
                "{} is under full_per_pair ({}): it counts every operation kept, whole or summarised",
                r.summaries_per_pair, r.full_per_pair
            ),
        ));
    }
    if r.max_age_days < 7 {
        return Err(invalid(
            "retention.max_age_days",
            format!(
                "{} is under 7: the recovery breaker counts up to a week of recoveries",
                r.max_age_days
            ),
        ));
    }
    if r.interval_ms < 60_000 {
        return Err(invalid(
            "retention.interval_ms",
            format!(
                "{} ms is under a minute: a pass reads every pair's operations",
                r.interval_ms
            ),
        ));
    }
    Ok(())
}

fn default_resume_grace_ms() -> u64 {
    15_000
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

/// The most tokens a probe may ask for (`probe.max_tokens`): a probe is a
/// short answer, and its budget a warm one.
pub const PROBE_MAX_TOKENS: u32 = 4_096;
/// The most warm probes that end a series (`probe.warm_probes`).
pub const PROBE_MAX_WARM_PROBES: u32 = 100;
/// The most probes one series sends (`probe.max_probes`): a series ends at
/// its warm answers, and each probe may take `probe_timeout_ms`.
pub const PROBE_MAX_PROBES: u32 = 1_000;
/// The largest ratio (`probe.cold_allowance_margin`, the suite's
/// `baseline_warning_ratio`, `tpot_history_ratio`, `min_batching_gain`).
pub const MAX_RATIO: f64 = 1_000.0;
/// The most requests of the suite's concurrency step and abort storm, each
/// sent at once.
pub const SUITE_MAX_REQUESTS: u32 = 1_024;
/// The most tokens of the suite's long generation.
pub const SUITE_MAX_TOKENS: u32 = 131_072;
/// The longest prompt of the abort storm, in tokens (words).
pub const SUITE_MAX_PROMPT_TOKENS: u32 = 1_000_000;

/// Every number of `probe` and `suite` within its bound (issue 32:
/// `suite.concurrency.requests = 1e6` and `max_probes = 1e9` loaded). The
/// error is (field, problem), the field relative to the pair.
fn probe_and_suite_bounds(pr: &ProbeConfig, su: &SuiteConfig) -> Result<(), (&'static str, String)> {
    for (f, v, max) in [
        ("probe.max_tokens", pr.max_tokens, PROBE_MAX_TOKENS),
        ("probe.warm_probes", pr.warm_probes, PROBE_MAX_WARM_PROBES),
        ("probe.max_probes", pr.max_probes, PROBE_MAX_PROBES),
        (
            "suite.concurrency.requests",
            su.concurrency.requests,
            SUITE_MAX_REQUESTS,
        ),
        (
            "suite.abort_storm.requests",
            su.abort_storm.requests,
            SUITE_MAX_REQUESTS,
        ),
        (
            "suite.long_generation.max_tokens",
            su.long_generation.max_tokens,
            SUITE_MAX_TOKENS,
        ),
        (
            "suite.abort_storm.prompt_tokens",
            su.abort_storm.prompt_tokens,
            SUITE_MAX_PROMPT_TOKENS,
        ),
    ] {
        if v > max {
            return Err((f, format!("{v} is over the bound of {max}")));
        }
    }
    for (f, v) in [
        ("probe.cold_allowance_margin", pr.cold_allowance_margin),
        ("suite.baseline_warning_ratio", su.baseline_warning_ratio),
        ("suite.tpot_history_ratio", su.tpot_history_ratio),
        ("suite.min_batching_gain", su.min_batching_gain),
    ] {
        // NaN and infinities are refused by the checks of their lower bound.
        if v > MAX_RATIO {
            return Err((f, format!("{v:?} is over the bound of {MAX_RATIO:?}")));
        }
    }
    Ok(())
}

/// The post-restart verification suite. Every step uses the pair's probe
/// model and fixed prompt; budgets are in ms.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SuiteConfig {
    pub long_generation: LongGenerationConfig,
    pub multi_turn: MultiTurnConfig,
    pub concurrency: ConcurrencyConfig,
    pub abort_storm: AbortStormConfig,
    /// A passing step whose figure is more than this multiple of the pair's
    /// last healthy verification is reported as a warning.
    pub baseline_warning_ratio: f64,
    /// ...and only when it is worse by more than this many ms. Also the
    /// smallest difference a derived budget counts as a failure.
    pub baseline_floor_ms: u64,
    /// Override of the first-token budget of every suite request (default:
    /// the probe's `warm_budget_ms` — a first token is never later than a
    /// whole warm answer).
    pub ttft_budget_ms: Option<u64>,
    /// Override of the time-per-output-token budget, ms (default: this many
    /// times the median TPOT of the pair's last healthy verifications, never
    /// looser than `warm_budget_ms / max_tokens`).
    pub tpot_budget_ms: Option<f64>,
    /// The TPOT budget from history is the historical median times this.
    pub tpot_history_ratio: f64,
    /// N simultaneous requests must finish within N / this × one warm
    /// request (plus the floor): an engine that batches serves them in about
    /// one request's time; one that lost batching takes N×.
    pub min_batching_gain: f64,
}

impl Default for SuiteConfig {
    fn default() -> Self {
        Self {
            long_generation: LongGenerationConfig::default(),
            multi_turn: MultiTurnConfig::default(),
            concurrency: ConcurrencyConfig::default(),
            abort_storm: AbortStormConfig::default(),
            baseline_warning_ratio: 2.0,
            baseline_floor_ms: 20,
            ttft_budget_ms: None,
            tpot_budget_ms: None,
            tpot_history_ratio: 3.0,
            min_batching_gain: 2.0,
        }
    }
}

/// A few hundred tokens, streamed; every gap between tokens is judged.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LongGenerationConfig {
    pub enabled: bool,
    pub max_tokens: u32,
    /// The longest silence allowed between two tokens (and after the last);
    /// default: the suite's TTFT budget (a pause mid-stream longer than a
    /// whole warm answer is a stall).
    pub max_token_gap_ms: Option<u64>,
    pub timeout_ms: u64,
}

impl Default for LongGenerationConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_tokens: 256,
            max_token_gap_ms: None,
            timeout_ms: 120_000,
        }
    }
}

/// A second turn extending the first turn's conversation.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MultiTurnConfig {
    pub enabled: bool,
    pub second_prompt: String,
    /// Override of turn 2's first-token budget (default: the suite's).
    pub ttft_budget_ms: Option<u64>,
    pub timeout_ms: u64,
}

impl Default for MultiTurnConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            second_prompt: "Now say the same thing in other words.".into(),
            ttft_budget_ms: None,
            timeout_ms: 60_000,
        }
    }
}

/// Simultaneous requests: none lost, the slowest within budget.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConcurrencyConfig {
    pub enabled: bool,
    pub requests: u32,
    /// An absolute bound on the slowest request, on top of the batching
    /// rule (default: none).
    pub slowest_budget_ms: Option<u64>,
    pub timeout_ms: u64,
    /// The engines batch simultaneous requests (SGLang and vLLM do). False
    /// for an engine that serves one request at a time by design (a
    /// llama.cpp-style server, seed 001): N requests are then expected to take
    /// about N× one, and only more than that fails.
    pub engines_batch: bool,
}

impl Default for ConcurrencyConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            requests: 8,
            slowest_budget_ms: None,
            engines_batch: true,
            timeout_ms: 120_000,
        }
    }
}

/// Long prompts abandoned mid-prefill, then a normal probe (INCIDENTS row 4).
/// Disruptive: opt-in after a restart; `verify --include-abort-storm` on demand.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AbortStormConfig {
    pub after_restart: bool,
    pub requests: u32,
    /// Prompt length, sized so its prefill outlasts `abort_after_ms`.
    pub prompt_tokens: u32,
    pub abort_after_ms: u64,
    pub probe_timeout_ms: u64,
}

impl Default for AbortStormConfig {
    fn default() -> Self {
        Self {
            after_restart: false,
            requests: 4,
            prompt_tokens: 8_000,
            abort_after_ms: 2_000,
            probe_timeout_ms: 120_000,
        }
    }
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
    /// A config with every optional field at the default an absent TOML key
    /// gives, for code that builds configs as values (the local stack).
    pub fn new(listen: SocketAddr, journal: impl Into<PathBuf>) -> Self {
        OrchestratorConfig {
            listen,
            journal: JournalSpec::Sqlite(journal.into()),
            leadership: None,
            pairs: Vec::new(),
            readiness_listen: None,
            resume_grace_ms: default_resume_grace_ms(),
            tls: None,
            insecure_plaintext: false,
            retention: Default::default(),
            operators: Vec::new(),
            redact_env: pdwarden_security::redact::default_patterns(),
        }
    }

    /// The config as the TOML an operator would write; `load` reads it
    /// back and validates it.
    pub fn to_toml_string(&self) -> Result<String, ConfigError> {
        toml::to_string(self).map_err(|e| invalid("(whole config)", format!("cannot be written as TOML: {e}")))
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        // Name the file too: an operator may have several.
        Self::from_toml_str(&text)
            .and_then(|c| c.transport().map(|_| c))
            .map_err(|e| ConfigError::InFile {
                path: path.to_path_buf(),
                error: Box::new(e),
            })
    }

    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let cfg: Self =
            toml::from_str(text).map_err(|e| ConfigError::Parse(pdwarden_proto::limits::toml_error_line(text, &e)))?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn pair(&self, name: &str) -> Option<&PairConfig> {
        self.pairs.iter().find(|p| p.name == name)
    }

    /// How the server talks: `[tls]` (then at least one `[[operator]]`) or
    /// the explicit `insecure_plaintext`. Checked by `load` and `serve`, so a
    /// config never falls back to plain text on its own.
    pub fn transport(&self) -> Result<pdwarden_security::tls::Transport, ConfigError> {
        use pdwarden_security::tls::{TlsError, Transport};
        let t = Transport::resolve(self.tls.as_ref(), self.insecure_plaintext).map_err(|e| match e {
            TlsError::Both => invalid("insecure_plaintext", "set together with [tls]; choose one"),
            _ => invalid(
                "tls",
                "missing: give [tls] ca, cert, key (see `pdwarden certs init`), or, for local development only, insecure_plaintext = true",
            ),
        })?;
        if matches!(t, Transport::Tls(_)) && self.operators.is_empty() {
            return Err(invalid(
                "operator",
                "with [tls] at least one [[operator]] (name, role, token_sha256) is needed: see `pdwarden certs token`",
            ));
        }
        Ok(t)
    }

    /// Every rule a loaded config must meet, section by section, in a fixed
    /// order: the first broken rule is the one reported, as one line naming
    /// its field.
    fn validate(&self) -> Result<(), ConfigError> {
        self.check_durations()?;
        pdwarden_security::operators::validate(&self.operators).map_err(|(f, problem)| invalid(f, problem))?;
        check_journal(&self.journal, self.leadership.as_ref())?;
        check_retention(&self.retention)?;
        let mut names = HashSet::new();
        let mut owners: HashSet<&UnitRef> = HashSet::new();
        for (i, p) in self.pairs.iter().enumerate() {
            check_pair(PairAt(i), p, &mut names, &mut owners)?;
        }
        self.check_serving_routers_outside_pairs(&owners)
    }

    /// Every duration, by its name (issue 16): none above a week.
    fn check_durations(&self) -> Result<(), ConfigError> {
        let tree = serde_json::to_value(self).map_err(|e| invalid("config", e.to_string()))?;
        if let Some((field, problem)) = pdwarden_proto::limits::duration_over_bound(&tree) {
            return Err(invalid(field, problem));
        }
        Ok(())
    }

    /// The serving router is the clients' router, outside every pair: a
    /// pair's own router is restarted with its pair (and would cut the
    /// traffic of every other pair behind it). `owners` holds every unit of
    /// every pair's roles.
    fn check_serving_routers_outside_pairs(&self, owners: &HashSet<&UnitRef>) -> Result<(), ConfigError> {
        for (i, p) in self.pairs.iter().enumerate() {
            if let Some(sr) = &p.serving_router
                && owners.contains(&sr.unit_ref())
            {
                return Err(invalid(
                    format!("pair[{i}].serving_router"),
                    format!(
                        "{} is a unit of a pair; the serving router is the one clients use, outside every pair (the pair is verified through its own router)",
                        sr.unit_ref()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The journal and `[leadership]` go together: an etcd journal needs a
/// leadership (and TLS to etcd exactly when its endpoints are `https://`),
/// a SQLite journal has one orchestrator and none.
fn check_journal(journal: &JournalSpec, leadership: Option<&LeadershipConfig>) -> Result<(), ConfigError> {
    match (journal, leadership) {
        (JournalSpec::Etcd(_), None) => Err(invalid(
            "leadership.advertise_url",
            "required with an etcd journal: the URL agents and the CLI reach this orchestrator at",
        )),
        (JournalSpec::Sqlite(_), Some(_)) => Err(invalid(
            "leadership",
            "only with an etcd journal (journal = \"etcd:URL,...\"); a SQLite journal has one orchestrator",
        )),
        (JournalSpec::Etcd(endpoints), Some(l)) => check_etcd_leadership(endpoints, l),
        (JournalSpec::Sqlite(_), None) => Ok(()),
    }
}

/// `[leadership]` on an etcd journal: TLS to etcd matching the endpoints'
/// one scheme, an `http(s)://` advertised URL, and a lease, prefix and etcd
/// timeout a leader can keep.
fn check_etcd_leadership(endpoints: &[String], l: &LeadershipConfig) -> Result<(), ConfigError> {
    let https = endpoints.iter().filter(|u| u.starts_with("https://")).count();
    match (https, &l.etcd_tls) {
        (0, Some(_)) => {
            return Err(invalid(
                "leadership.etcd_tls",
                "given, but the journal's etcd endpoints are http://: use https:// endpoints with TLS",
            ));
        }
        (n, None) if n > 0 => {
            return Err(invalid(
                "leadership.etcd_tls",
                "required for https:// etcd endpoints: ca (etcd's CA), cert and key (a client certificate etcd accepts)",
            ));
        }
        (n, _) if n > 0 && n < endpoints.len() => {
            return Err(invalid(
                "journal",
                "mixes http:// and https:// etcd endpoints: one cluster, one scheme",
            ));
        }
        _ => {}
    }
    if !(l.advertise_url.starts_with("http://") || l.advertise_url.starts_with("https://")) {
        return Err(invalid(
            "leadership.advertise_url",
            format!("{:?} must be an http:// or https:// URL", l.advertise_url),
        ));
    }
    if !(2..=60).contains(&l.lease_ttl_s) {
        return Err(invalid(
            "leadership.lease_ttl_s",
            format!("{} is outside 2..=60 seconds", l.lease_ttl_s),
        ));
    }
    if !l.prefix.starts_with('/') || l.prefix.len() < 2 || l.prefix.ends_with('/') {
        return Err(invalid(
            "leadership.prefix",
            format!("{:?} must start with / and not end with one, e.g. /pdwarden", l.prefix),
        ));
    }
    if l.etcd_timeout_ms < 100 || l.etcd_timeout_ms >= l.lease_ttl_s * 1000 {
        return Err(invalid(
            "leadership.etcd_timeout_ms",
            format!(
                "{} must be at least 100 and below the lease ({} s)",
                l.etcd_timeout_ms, l.lease_ttl_s
            ),
        ));
    }
    Ok(())
}

/// The `i`th `[[pair]]`, which names its fields in errors as `pair[i].FIELD`.
#[derive(Debug, Clone, Copy)]
struct PairAt(usize);

impl PairAt {
    fn field(self, f: &str) -> String {
        format!("pair[{}].{f}", self.0)
    }

    fn invalid(self, f: &str, problem: impl Into<String>) -> ConfigError {
        invalid(self.field(f), problem)
    }
}

/// One pair, section by section. `names` and `owners` gather the pair
/// names and role units seen so far: both must be unique across pairs.
fn check_pair<'a>(
    at: PairAt,
    p: &'a PairConfig,
    names: &mut HashSet<&'a str>,
    owners: &mut HashSet<&'a UnitRef>,
) -> Result<(), ConfigError> {
    check_pair_name(at, &p.name, names)?;
    check_pair_units(at, p, owners)?;
    check_probe_budgets(at, &p.probe, &p.timeouts)?;
    check_pair_watch(at, &p.watch, &p.probe)?;
    check_suite(at, &p.suite)?;
    p.gate
        .validate()
        .map_err(|(f, problem)| at.invalid(&format!("gate.{f}"), problem))?;
    check_probe_series(at, p)?;
    if p.repair_keeps_serving == 0 {
        return Err(at.invalid(
            "repair_keeps_serving",
            "must be at least 1: a repair that takes a whole side out of the router leaves its clients nothing (restart the pair whole instead)",
        ));
    }
    if let Some(sr) = &p.serving_router {
        check_serving_router(at, sr)?;
    }
    Ok(())
}

/// A pair's name: not empty, by the edge's rule (issue 32: `demo#gate` is
/// the journal's name of a gate's children, `../../etc` a path), and unique.
fn check_pair_name<'a>(at: PairAt, name: &'a str, names: &mut HashSet<&'a str>) -> Result<(), ConfigError> {
    if name.trim().is_empty() {
        return Err(at.invalid("name", "must not be empty"));
    }
    pdwarden_model::fields::check_name(name).map_err(|problem| at.invalid("name", problem.to_string()))?;
    if !names.insert(name) {
        return Err(at.invalid("name", format!("duplicate pair name {name:?}")));
    }
    Ok(())
}

/// Each role (prefill, decode, router) has at least one unit, each unit a
/// host and a name, and no unit serves two roles or two pairs.
fn check_pair_units<'a>(at: PairAt, p: &'a PairConfig, owners: &mut HashSet<&'a UnitRef>) -> Result<(), ConfigError> {
    for (field, units) in [("prefill", &p.prefill), ("decode", &p.decode), ("router", &p.router)] {
        if units.is_empty() {
            return Err(at.invalid(field, "needs at least one unit"));
        }
        for u in units {
            if u.host.is_empty() || u.unit.is_empty() {
                return Err(at.invalid(field, "host and unit must not be empty"));
            }
            if !owners.insert(u) {
                return Err(at.invalid(field, format!("unit {u} belongs to more than one pair role")));
            }
        }
    }
    Ok(())
}

/// The probe and the restart's deadlines: a prompt, no zero budget or
/// deadline, and warm budget ≤ cold allowance ≤ probe timeout (a probe must
/// be able to observe a cold start it would accept).
fn check_probe_budgets(at: PairAt, pr: &ProbeConfig, timeouts: &TimeoutConfig) -> Result<(), ConfigError> {
    if pr.prompt.trim().is_empty() {
        return Err(at.invalid("probe.prompt", "must not be empty"));
    }
    if pr.max_tokens == 0 {
        return Err(at.invalid("probe.max_tokens", "must be at least 1"));
    }
    for (f, v) in [
        ("probe.warm_budget_ms", pr.warm_budget_ms),
        ("probe.cold_allowance_ms", pr.cold_allowance_ms),
        ("probe.probe_timeout_ms", pr.probe_timeout_ms),
        ("timeouts.prefill_ready_ms", timeouts.prefill_ready_ms),
        ("timeouts.decode_ready_ms", timeouts.decode_ready_ms),
        ("timeouts.router_ready_ms", timeouts.router_ready_ms),
        ("timeouts.poll_interval_ms", timeouts.poll_interval_ms),
        ("timeouts.check_timeout_ms", timeouts.check_timeout_ms),
    ] {
        if v == 0 {
            return Err(at.invalid(f, "must be greater than 0"));
        }
    }
    if pr.cold_allowance_ms < pr.warm_budget_ms {
        return Err(at.invalid(
            "probe.cold_allowance_ms",
            format!(
                "{} is below warm_budget_ms ({})",
                pr.cold_allowance_ms, pr.warm_budget_ms
            ),
        ));
    }
    if pr.probe_timeout_ms < pr.cold_allowance_ms {
        return Err(at.invalid(
            "probe.probe_timeout_ms",
            format!(
                "{} is below cold_allowance_ms ({}): a probe must be able to observe a cold start it would accept",
                pr.probe_timeout_ms, pr.cold_allowance_ms
            ),
        ));
    }
    if !(pr.cold_allowance_margin >= 1.0 && pr.cold_allowance_margin.is_finite()) {
        return Err(at.invalid("probe.cold_allowance_margin", "must be a finite number >= 1"));
    }
    Ok(())
}

/// The watch's own bounds ([`WatchConfig::validate`]), and a probe timeout
/// it allows: else no probe could ever be sent.
fn check_pair_watch(at: PairAt, w: &WatchConfig, pr: &ProbeConfig) -> Result<(), ConfigError> {
    w.validate()
        .map_err(|(f, problem)| at.invalid(&format!("watch.{f}"), problem))?;
    if w.max_probe_timeout_ms < pr.probe_timeout_ms {
        return Err(at.invalid(
            "watch.max_probe_timeout_ms",
            format!(
                "{} is below probe.probe_timeout_ms ({}): no probe could ever be sent",
                w.max_probe_timeout_ms, pr.probe_timeout_ms
            ),
        ));
    }
    Ok(())
}

/// The verification suite: no zero count, budget or timeout, a second
/// prompt, and ratios that are finite and can be met. Its upper bounds are
/// checked with the probe's ([`check_probe_series`]).
fn check_suite(at: PairAt, su: &SuiteConfig) -> Result<(), ConfigError> {
    for (f, v) in [
        (
            "suite.long_generation.max_tokens",
            u64::from(su.long_generation.max_tokens),
        ),
        (
            "suite.long_generation.max_token_gap_ms",
            su.long_generation.max_token_gap_ms.unwrap_or(1),
        ),
        ("suite.long_generation.timeout_ms", su.long_generation.timeout_ms),
        (
            "suite.multi_turn.ttft_budget_ms",
            su.multi_turn.ttft_budget_ms.unwrap_or(1),
        ),
        ("suite.ttft_budget_ms", su.ttft_budget_ms.unwrap_or(1)),
        ("suite.multi_turn.timeout_ms", su.multi_turn.timeout_ms),
        ("suite.concurrency.requests", u64::from(su.concurrency.requests)),
        (
            "suite.concurrency.slowest_budget_ms",
            su.concurrency.slowest_budget_ms.unwrap_or(1),
        ),
        ("suite.concurrency.timeout_ms", su.concurrency.timeout_ms),
        ("suite.abort_storm.requests", u64::from(su.abort_storm.requests)),
        (
            "suite.abort_storm.prompt_tokens",
            u64::from(su.abort_storm.prompt_tokens),
        ),
        ("suite.abort_storm.abort_after_ms", su.abort_storm.abort_after_ms),
        ("suite.abort_storm.probe_timeout_ms", su.abort_storm.probe_timeout_ms),
    ] {
        if v == 0 {
            return Err(at.invalid(f, "must be greater than 0"));
        }
    }
    if su.multi_turn.second_prompt.trim().is_empty() {
        return Err(at.invalid("suite.multi_turn.second_prompt", "must not be empty"));
    }
    if let Some(t) = su.tpot_budget_ms
        && !(t.is_finite() && t > 0.0)
    {
        return Err(at.invalid("suite.tpot_budget_ms", "must be a finite number > 0"));
    }
    for (f, v) in [
        ("suite.tpot_history_ratio", su.tpot_history_ratio),
        ("suite.min_batching_gain", su.min_batching_gain),
    ] {
        if !(v.is_finite() && v >= 1.0) {
            return Err(at.invalid(f, "must be a finite number >= 1"));
        }
    }
    if !(su.baseline_warning_ratio > 1.0 && su.baseline_warning_ratio.is_finite()) {
        return Err(at.invalid("suite.baseline_warning_ratio", "must be a finite number > 1"));
    }
    Ok(())
}

/// A probe series that can end: at least one warm probe, every probe and
/// suite number within its bound ([`probe_and_suite_bounds`]), and room for
/// one cold answer per fresh engine a series can meet in turn (the larger of
/// the prefill and decode counts), then the warm ones.
fn check_probe_series(at: PairAt, p: &PairConfig) -> Result<(), ConfigError> {
    let pr = &p.probe;
    if pr.warm_probes == 0 {
        return Err(at.invalid("probe.warm_probes", "must be at least 1"));
    }
    probe_and_suite_bounds(pr, &p.suite).map_err(|(f, problem)| at.invalid(f, problem))?;
    let cold = p.prefill.len().max(p.decode.len()).max(1) as u32;
    if pr.max_probes < pr.warm_probes.saturating_add(cold) {
        return Err(at.invalid(
            "probe.max_probes",
            format!(
                "must be at least warm_probes + {cold} ({}): a series needs room for {cold} slow first answer{} (one per fresh {}) and {} warm ones",
                pr.warm_probes.saturating_add(cold),
                if cold == 1 { "" } else { "s" },
                if cold == 1 { "pair" } else { "engine of the larger side" },
                pr.warm_probes
            ),
        ));
    }
    Ok(())
}

/// `[pair.serving_router]`'s own fields: a unit, and no zero drain, rejoin
/// or poll time. (That it is outside every pair is checked once all pairs
/// are known.)
fn check_serving_router(at: PairAt, sr: &ServingRouterConfig) -> Result<(), ConfigError> {
    if sr.host.is_empty() || sr.unit.is_empty() {
        return Err(at.invalid("serving_router", "host and unit must not be empty"));
    }
    for (f, v) in [
        ("serving_router.drain_timeout_ms", sr.drain_timeout_ms),
        ("serving_router.rejoin_timeout_ms", sr.rejoin_timeout_ms),
        ("serving_router.poll_ms", sr.poll_ms),
    ] {
        if v == 0 {
            return Err(at.invalid(f, "must be greater than 0"));
        }
    }
    Ok(())
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

    /// Issue 19: the journal is `sqlite:PATH`, a bare path (as before) or
    /// `etcd:URL,...` with `[leadership]`; every mistake is one line naming
    /// the field.
    #[test]
    fn the_journal_is_sqlite_or_etcd_with_its_leadership() {
        let with = |journal: &str, extra: &str| {
            OrchestratorConfig::from_toml_str(&format!(
                "{}\n{extra}",
                EXAMPLE.replace("journal = \"/tmp/pdwarden.sqlite\"", &format!("journal = {journal:?}"))
            ))
        };
        let bare = with("/tmp/j.sqlite", "").unwrap();
        assert_eq!(bare.journal, JournalSpec::Sqlite("/tmp/j.sqlite".into()));
        assert_eq!(with("sqlite:/tmp/j.sqlite", "").unwrap().journal, bare.journal);
        let etcd = with(
            "etcd:http://a:2379,http://b:2379",
            "[leadership]\nadvertise_url = \"https://orch-a:7070\"",
        )
        .unwrap();
        assert_eq!(
            etcd.journal,
            JournalSpec::Etcd(vec!["http://a:2379".into(), "http://b:2379".into()])
        );
        let l = etcd.leadership.as_ref().unwrap();
        assert_eq!(
            (l.lease_ttl_s, l.prefix.as_str(), l.etcd_timeout_ms),
            (5, "/pdwarden", 2_000)
        );
        // Written and read back the same.
        let again = OrchestratorConfig::from_toml_str(&etcd.to_toml_string().unwrap()).unwrap();
        assert_eq!(again.journal, etcd.journal);
        assert_eq!(again.leadership, etcd.leadership);
        for (journal, extra, says) in [
            (
                "etcd:http://a:2379",
                "",
                "`leadership.advertise_url`: required with an etcd journal",
            ),
            ("etcd:", "", "an etcd journal needs its endpoints"),
            ("etcd:a:2379", "", "must be an http:// or https:// URL"),
            ("etcd:http://a:1,http://a:1", "", "is given twice"),
            ("sqlite:", "", "needs a path"),
            (
                "/tmp/j.sqlite",
                "[leadership]\nadvertise_url = \"https://o:1\"",
                "`leadership`: only with an etcd journal",
            ),
            (
                "etcd:http://a:1",
                "[leadership]\nadvertise_url = \"o:1\"",
                "`leadership.advertise_url`",
            ),
            (
                "etcd:http://a:1",
                "[leadership]\nadvertise_url = \"https://o:1\"\nlease_ttl_s = 1",
                "`leadership.lease_ttl_s`: 1 is outside 2..=60 seconds",
            ),
            (
                "etcd:http://a:1",
                "[leadership]\nadvertise_url = \"https://o:1\"\nprefix = \"pdwarden/\"",
                "`leadership.prefix`",
            ),
            (
                "etcd:http://a:1",
                "[leadership]\nadvertise_url = \"https://o:1\"\nlease_ttl_s = 2\netcd_timeout_ms = 2000",
                "`leadership.etcd_timeout_ms`",
            ),
            (
                "etcd:https://a:1",
                "[leadership]\nadvertise_url = \"https://o:1\"",
                "`leadership.etcd_tls`: required for https:// etcd endpoints",
            ),
            (
                "etcd:http://a:1",
                "[leadership]\nadvertise_url = \"https://o:1\"\n[leadership.etcd_tls]\nca = \"c\"\ncert = \"c\"\nkey = \"k\"",
                "`leadership.etcd_tls`: given, but the journal's etcd endpoints are http://",
            ),
            (
                "etcd:https://a:1,http://b:1",
                "[leadership]\nadvertise_url = \"https://o:1\"\n[leadership.etcd_tls]\nca = \"c\"\ncert = \"c\"\nkey = \"k\"",
                "`journal`: mixes http:// and https://",
            ),
        ] {
            let e = with(journal, extra).expect_err(journal).to_string();
            assert!(e.contains(says), "{journal} {extra}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }

    /// The journal's refusals are typed, and each keeps its one line word
    /// for word (it is what the TOML error quotes on the `journal` line).
    #[test]
    fn journal_spec_refusals_keep_their_words() {
        for (text, says) in [
            (
                "etcd:http://a:1,",
                "\"etcd:http://a:1,\": an etcd journal needs its endpoints, comma-separated: etcd:http://10.0.0.1:2379,http://10.0.0.2:2379",
            ),
            (
                "etcd:http://a:1,a:2,b:3",
                "etcd endpoint \"a:2\" must be an http:// or https:// URL (e.g. http://10.0.0.1:2379)",
            ),
            (
                "etcd:http://a:1, http://a:1",
                "etcd endpoint \"http://a:1\" is given twice",
            ),
            (
                "sqlite: ",
                "needs a path: sqlite:/var/lib/pdwarden/journal.sqlite, or etcd:URL,... for several orchestrators",
            ),
            (
                "",
                "needs a path: sqlite:/var/lib/pdwarden/journal.sqlite, or etcd:URL,... for several orchestrators",
            ),
        ] {
            assert_eq!(JournalSpec::parse(text).unwrap_err().to_string(), says, "{text:?}");
        }
        assert_eq!(
            JournalSpec::parse("etcd:http://a:1").unwrap(),
            JournalSpec::Etcd(vec!["http://a:1".into()])
        );
    }

    /// The shipped example must stay valid.
    #[test]
    fn deploy_local_example_is_valid() {
        let c = OrchestratorConfig::from_toml_str(include_str!("../../deploy/local/orchestrator.toml")).unwrap();
        assert_eq!(c.pairs[0].name, "local");
    }

    /// A config error read from a file names the file, the line and the field.
    #[test]
    fn file_errors_name_file_line_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("orchestrator.toml");
        std::fs::write(
            &path,
            EXAMPLE.replace("warm_budget_ms = 1000", "warm_budget_ms = \"fast\""),
        )
        .unwrap();
        let e = OrchestratorConfig::load(&path).unwrap_err().to_string();
        assert!(e.starts_with(&path.display().to_string()), "{e}");
        assert!(
            e.contains("line 12, field pair.probe.warm_budget_ms: invalid type"),
            "{e}"
        );
        assert!(!e.contains('\n'), "one line: {e}");
    }

    /// Issue 16, finding 1: `prefill_ready_ms = 18446744073709551615` loaded
    /// and the first restart panicked on an overflow, locking the pair.
    #[test]
    fn a_huge_duration_is_refused_at_load_naming_its_field() {
        let e = OrchestratorConfig::from_toml_str(&format!(
            "{EXAMPLE}[pair.timeouts]\nprefill_ready_ms = 18446744073709551615\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("invalid config: field `pair[0].timeouts.prefill_ready_ms`: 18446744073709551615 ms is over the bound of one week"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
        let e = OrchestratorConfig::from_toml_str(&format!("resume_grace_ms = 604800001\n{EXAMPLE}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`resume_grace_ms`: 604800001 ms is over the bound"), "{e}");
        let week = format!("{EXAMPLE}[pair.timeouts]\nprefill_ready_ms = 604800000\n");
        OrchestratorConfig::from_toml_str(&week).expect("a week is allowed");
    }

    /// Issue 36: retention that would drop what the cold-start history,
    /// the golden reference or the breaker read is refused in one line
    /// naming the field; the defaults load.
    #[test]
    fn retention_that_would_forget_what_is_read_is_refused() {
        let ok = OrchestratorConfig::from_toml_str(EXAMPLE).unwrap();
        assert_eq!(ok.retention, crate::ops::journal::RetentionPolicy::default());
        for (toml, field) in [
            ("full_per_pair = 10", "retention.full_per_pair"),
            ("summaries_per_pair = 60", "retention.summaries_per_pair"),
            ("max_age_days = 3", "retention.max_age_days"),
            ("interval_ms = 1000", "retention.interval_ms"),
        ] {
            let e = OrchestratorConfig::from_toml_str(&format!("{EXAMPLE}\n[retention]\n{toml}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("`{field}`")) && !e.contains('\n'), "{toml}: {e}");
        }
        let e = OrchestratorConfig::from_toml_str(&format!("{EXAMPLE}\n[retention]\nkeep = 3\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("keep"), "{e}");
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

    /// `[pair.gate]` is optional and its errors name the field.
    /// Issue 18 (xPyD): a series must have room for one cold answer per
    /// fresh engine of the larger side, then the warm ones.
    #[test]
    fn max_probes_leaves_room_for_each_fresh_engine() {
        let three = EXAMPLE.replace(
            r#"decode = [{ host = "h1", unit = "decode-0" }]"#,
            r#"decode = [{ host = "h1", unit = "decode-0" }, { host = "h1", unit = "decode-1" }, { host = "h1", unit = "decode-2" }]"#,
        );
        assert_ne!(three, EXAMPLE);
        let with = |max: u32| {
            three.replace(
                "[pair.probe]\n",
                &format!("[pair.probe]\nwarm_probes = 2\nmax_probes = {max}\n"),
            )
        };
        let e = OrchestratorConfig::from_toml_str(&with(4))
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("probe.max_probes") && e.contains("warm_probes + 3 (5)"),
            "{e}"
        );
        OrchestratorConfig::from_toml_str(&with(5)).unwrap();
    }

    /// Issue 32, finding 2: pair names such as `demo#gate` (the journal's
    /// name of a gate's children) and `../../etc` loaded, and so did
    /// `suite.concurrency.requests = 1e6` and `max_probes = 1e9`. Names
    /// follow the edge's rule and every number of the probe and the suite
    /// has a bound; each refusal is one line naming the field.
    #[test]
    fn pair_names_and_every_probe_and_suite_number_are_bounded() {
        let named = |name: &str| {
            OrchestratorConfig::from_toml_str(&EXAMPLE.replace("name = \"pair-a\"", &format!("name = {name:?}")))
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        named("pair_a.2-b").unwrap();
        for (name, says) in [
            ("demo#gate", "\"demo#gate\" has '#' at byte 4"),
            ("../../etc", "\"../../etc\" has '/' at byte 2"),
            ("..", "\"..\" is not a name"),
            ("a b", "\"a b\" has ' '"),
        ] {
            let e = named(name).unwrap_err();
            assert!(
                e.starts_with(&format!("invalid config: field `pair[0].name`: {says}")),
                "{e}"
            );
        }
        let e = named(&"p".repeat(129)).unwrap_err();
        assert!(e.contains("`pair[0].name`: 129 bytes"), "{e}");
        let with = |section: &str, key: &str, value: &str| {
            let text = format!("{EXAMPLE}[pair.{section}]\n{key} = {value}\n");
            OrchestratorConfig::from_toml_str(&text)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        // The probe's own table is EXAMPLE's: its keys are added to it.
        let probe = |key: &str, value: &str| {
            OrchestratorConfig::from_toml_str(
                &EXAMPLE.replace("[pair.probe]\n", &format!("[pair.probe]\n{key} = {value}\n")),
            )
            .map(|_| ())
            .map_err(|e| e.to_string())
        };
        for (key, bad, good) in [
            ("max_probes", "1000000000", "1000"),
            ("warm_probes", "1000000", "100\nmax_probes = 101"),
            ("max_tokens", "1000000000", "4096"),
            ("cold_allowance_margin", "1e300", "100.0"),
        ] {
            let e = probe(key, bad).unwrap_err();
            assert!(
                e.starts_with(&format!("invalid config: field `pair[0].probe.{key}`: ")) && !e.contains('\n'),
                "{key}: {e}"
            );
            probe(key, good).unwrap_or_else(|e| panic!("{key} = {good}: {e}"));
        }
        for (section, key, bad, good) in [
            ("suite.concurrency", "requests", "1000000", "1024"),
            ("suite.abort_storm", "requests", "1000000", "1024"),
            ("suite.abort_storm", "prompt_tokens", "4000000000", "1000000"),
            ("suite.long_generation", "max_tokens", "4000000000", "131072"),
            ("suite", "baseline_warning_ratio", "1e300", "1000.0"),
            ("suite", "tpot_history_ratio", "1e300", "1000.0"),
            ("suite", "min_batching_gain", "1e300", "1000.0"),
        ] {
            let e = with(section, key, bad).unwrap_err();
            assert!(
                e.starts_with(&format!("invalid config: field `pair[0].{section}.{key}`: ")) && !e.contains('\n'),
                "{section}.{key}: {e}"
            );
            with(section, key, good).unwrap_or_else(|e| panic!("{section}.{key} = {good}: {e}"));
        }
    }

    #[test]
    fn gate_errors_name_the_field() {
        let c = OrchestratorConfig::from_toml_str(EXAMPLE).unwrap();
        assert_eq!(c.pairs[0].gate.tolerance_pct, 10.0);
        let e = OrchestratorConfig::from_toml_str(&format!("{EXAMPLE}[pair.gate]\non_inconclusive = \"ask\"\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("on_inconclusive") && e.contains("rollback"), "{e}");
        let e = OrchestratorConfig::from_toml_str(&format!("{EXAMPLE}[pair.gate]\nmax_requests_per_cell = 8\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("pair[0].gate.max_requests_per_cell"), "{e}");
        let e = OrchestratorConfig::from_toml_str(&format!("{EXAMPLE}[pair.gate]\nconcurrency = [0]\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("pair[0].gate.concurrency"), "{e}");
        let e = OrchestratorConfig::from_toml_str(&format!("{EXAMPLE}[pair.gate]\ntolerance = 3.0\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("tolerance"), "{e}");
    }

    /// The watch section is optional, defaults are sensible, and bad values
    /// and unknown fields name their field.
    #[test]
    fn watch_defaults_and_errors_name_the_field() {
        let c = OrchestratorConfig::from_toml_str(EXAMPLE).unwrap();
        let w = &c.pairs[0].watch;
        assert!(w.enabled && w.auto_recover);
        assert_eq!((w.max_recoveries, w.max_prefill_ms()), (3, 6_554));
        assert_eq!(c.readiness_listen, None);
        let with = |section: &str| {
            OrchestratorConfig::from_toml_str(&format!("{EXAMPLE}[pair.watch]\n{section}\n"))
                .map(|_| ())
                .unwrap_err()
                .to_string()
        };
        assert!(with("stall_budget_ms = 0").contains("pair[0].watch.stall_budget_ms"));
        assert!(with("max_probe_timeout_ms = 1000").contains("pair[0].watch.max_probe_timeout_ms"));
        assert!(with("prefill_tok_per_s = -1.0").contains("pair[0].watch.prefill_tok_per_s"));
        assert!(with("stall_budjet_ms = 3").contains("stall_budjet_ms"));
        let c = OrchestratorConfig::from_toml_str(
            &EXAMPLE.replace("journal =", "readiness_listen = \"127.0.0.1:7071\"\njournal ="),
        )
        .unwrap();
        assert_eq!(c.readiness_listen.unwrap().port(), 7071);
    }

    /// Issue 31, item 4: `decode_tok_per_s = 1e-300` loaded and panicked the
    /// watch task (`cannot convert float seconds to Duration`). Every watch
    /// number out of its range is refused at load, in one line naming it.
    #[test]
    fn every_watch_number_is_bounded_at_load_naming_its_field() {
        let with = |section: &str| {
            OrchestratorConfig::from_toml_str(&format!("{EXAMPLE}[pair.watch]\n{section}\n"))
                .map(|_| ())
                .expect_err(section)
                .to_string()
        };
        for (section, field, says) in [
            (
                "decode_tok_per_s = 1e-300",
                "decode_tok_per_s",
                "1e-300 is outside 0.01..=1000000000.0",
            ),
            ("prefill_tok_per_s = 1e-300", "prefill_tok_per_s", "is outside"),
            ("decode_tok_per_s = 1e300", "decode_tok_per_s", "is outside"),
            ("prefill_tok_per_s = nan", "prefill_tok_per_s", "NaN is outside"),
            ("decode_tok_per_s = inf", "decode_tok_per_s", "inf is outside"),
            (
                "max_output_tokens = 100000000\ndecode_tok_per_s = 0.1",
                "decode_tok_per_s",
                "over the bound of one week",
            ),
            (
                "max_prompt_tokens = 100000000\nprefill_tok_per_s = 0.5",
                "prefill_tok_per_s",
                "the worst prefill (max_prompt_tokens 100000000 tokens)",
            ),
            (
                "max_prompt_tokens = 18446744073709551615",
                "max_prompt_tokens",
                "is outside 1..=100000000 tokens",
            ),
            ("max_output_tokens = 0", "max_output_tokens", "is outside"),
            ("prefill_chunk_tokens = 0", "prefill_chunk_tokens", "is outside"),
            (
                "prefill_chunk_tokens = 1000000000",
                "prefill_chunk_tokens",
                "is outside",
            ),
            (
                "scrape_interval_ms = 1",
                "scrape_interval_ms",
                "1 is outside 100..=60000 ms",
            ),
            ("scrape_interval_ms = 3600000", "scrape_interval_ms", "is outside"),
            (
                "idle_gauge_refresh_ms = 0",
                "idle_gauge_refresh_ms",
                "must be greater than 0",
            ),
            ("max_recoveries = 4294967295", "max_recoveries", "is outside 1..=100"),
            ("max_recoveries = 0", "max_recoveries", "at least 1"),
            ("gpu_idle_below = nan", "gpu_idle_below", "between 0 and 1"),
            ("gpu_idle_below = 1.5", "gpu_idle_below", "between 0 and 1"),
            ("min_probe_interval_ms = 0", "min_probe_interval_ms", "greater than 0"),
            (
                "recovery_window_ms = 18446744073709551615",
                "recovery_window_ms",
                "over the bound of one week",
            ),
            (
                "max_kv_transfer_ms = 604800001",
                "max_kv_transfer_ms",
                "over the bound of one week",
            ),
            ("idle_probe_interval_ms = 0", "idle_probe_interval_ms", "greater than 0"),
            ("engine = \"sglang-router\"", "engine", "not a router"),
        ] {
            let e = with(section);
            assert!(e.contains(&format!("`pair[0].watch.{field}`: ")), "{section}: {e}");
            assert!(e.contains(says), "{section}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
            assert!(e.len() < 300, "short: {e}");
        }
        // The bounds themselves load.
        OrchestratorConfig::from_toml_str(&format!(
            "{EXAMPLE}[pair.watch]\ndecode_tok_per_s = 0.01\nprefill_tok_per_s = 1e9\nscrape_interval_ms = 100\nmax_recoveries = 100\n"
        ))
        .unwrap();
    }

    /// The README's `[pair.watch]` block ("these are the defaults") loads,
    /// and is what an absent section gives.
    #[test]
    fn the_readmes_watch_defaults_load_and_are_the_defaults() {
        let readme = include_str!("../../README.md");
        let start = readme
            .find("\n[pair.watch]")
            .expect("the README documents [pair.watch]");
        let block = &readme[start..];
        let block = &block[..block.find("```").expect("the block ends")];
        let c = OrchestratorConfig::from_toml_str(&format!("{EXAMPLE}{block}")).unwrap();
        let json = |w: &WatchConfig| serde_json::to_value(w).unwrap();
        assert_eq!(json(&c.pairs[0].watch), json(&WatchConfig::default()));
        WatchConfig::default().validate().unwrap();
    }

    /// Issue 32 (secrets): two operators with one token hash were both
    /// accepted and the first match won (bob acted as alice). Refused at
    /// load: one line naming both operators and the field.
    #[test]
    fn a_token_hash_belongs_to_one_operator_only() {
        let hash = pdwarden_security::operators::hash_token("pdw_shared");
        let other = pdwarden_security::operators::hash_token("pdw_other");
        let operators = |second: &str| {
            format!(
                "insecure_plaintext = true\n{EXAMPLE}[[operator]]\nname = \"alice\"\nrole = \"operate\"\ntoken_sha256 = \"{hash}\"\n\
                 [[operator]]\nname = \"carol\"\nrole = \"read\"\ntoken_sha256 = \"{other}\"\n\
                 [[operator]]\nname = \"bob\"\nrole = \"read\"\ntoken_sha256 = \"{second}\"\n"
            )
        };
        let e = OrchestratorConfig::from_toml_str(&operators(&hash))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`operator[2].token_sha256`"), "{e}");
        assert!(e.contains("\"alice\"") && e.contains("\"bob\""), "{e}");
        assert!(!e.contains("carol") && !e.contains(&hash), "{e}");
        assert!(!e.contains('\n'), "one line: {e}");
        // Distinct hashes load.
        let distinct = pdwarden_security::operators::hash_token("pdw_bob");
        let c = OrchestratorConfig::from_toml_str(&operators(&distinct)).unwrap();
        assert_eq!(c.operators.len(), 3);
    }
}
