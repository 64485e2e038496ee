//! Command-line flags, validated into the settings a simulated engine runs with.
//!
//! Raw flags ([`Args`], parsed by clap) are turned into a [`Config`] in one place so
//! that the rest of the crate never sees an unvalidated value. The config is split in
//! two: what is fixed for the life of the process (role, addresses, start-up phases,
//! time scale) and [`Settings`], the timing and fault knobs that `POST /sim/fault` may
//! change while the engine runs ([`FaultPatch`] is that request's body, using the
//! flags' own names).
//!
//! Every duration here is in *simulated* milliseconds; [`crate::clock::Scale`] turns
//! them into real time (`--time-scale 0.01` runs a 56 s start-up in 0.56 s).

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;

use clap::{Parser, ValueEnum};
use serde::{Deserialize, Serialize};

/// SGLang's default `--disaggregation-bootstrap-port`.
pub const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;
/// SGLang's `SGLANG_HEALTH_CHECK_TIMEOUT` default (seconds → ms).
pub const DEFAULT_HEALTH_TIMEOUT_MS: f64 = 20_000.0;

/// Which half of a prefill/decode pair this engine plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Prefill,
    Decode,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One entry of `--latency-script`: the total latency of one client generation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LatencyStep {
    /// Answer after this many simulated milliseconds.
    Ms(f64),
    /// Never answer.
    Hang,
}

impl FromStr for LatencyStep {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("hang") {
            return Ok(LatencyStep::Hang);
        }
        match t.parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 => Ok(LatencyStep::Ms(v)),
            _ => Err(ConfigError::LatencyScript(s.to_string())),
        }
    }
}

impl Serialize for LatencyStep {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            LatencyStep::Ms(v) => s.serialize_f64(*v),
            LatencyStep::Hang => s.serialize_str("hang"),
        }
    }
}

/// Parses `"17900,106400,hang"`; an empty string is an empty script.
pub fn parse_latency_script(list: &str) -> Result<VecDeque<LatencyStep>, ConfigError> {
    list.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(LatencyStep::from_str)
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--latency-script entry {0:?} is neither a non-negative number of ms nor `hang`")]
    LatencyScript(String),
    #[error("--{flag} must be a finite number >= {min}, got {value}")]
    OutOfRange { flag: &'static str, min: f64, value: f64 },
    #[error("--knob-env, --knob-value and --knob-slowdown go together (missing {0})")]
    KnobIncomplete(&'static str),
}

/// pd-sim's flags, as typed.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "pd-sim",
    about = "An SGLang-like prefill/decode engine simulator for testing pdwarden"
)]
pub struct Args {
    /// prefill or decode.
    #[arg(long, value_enum)]
    pub role: Role,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// HTTP port (0 picks a free one).
    #[arg(long)]
    pub port: u16,
    /// Prefill only: port of the KV bootstrap endpoint (SGLang's default 8998; 0 picks one).
    #[arg(long)]
    pub bootstrap_port: Option<u16>,
    /// Model name reported by /v1/models, /model_info and responses.
    #[arg(long, default_value = "pd-sim/sim-model")]
    pub model: String,
    /// The port stays closed (connection refused) until this long after start.
    #[arg(long, default_value_t = 0.0)]
    pub listen_after_ms: f64,
    /// /health and /health_generate answer 503 until this long after start.
    #[arg(long, default_value_t = 0.0)]
    pub ready_after_ms: f64,
    /// Fixed cost of a forward pass that starts a request (and of the health check's pass).
    #[arg(long, default_value_t = 40.0)]
    pub ttft_ms: f64,
    /// Cost of each generated token.
    #[arg(long, default_value_t = 8.0)]
    pub tpot_ms: f64,
    /// Prefill speed in prompt tokens per second (0 = prompt length costs nothing).
    #[arg(long, default_value_t = 20_000.0)]
    pub prefill_tok_per_s: f64,
    /// Extra latency of the first client generation after start (cold start).
    #[arg(long, default_value_t = 0.0)]
    pub cold_first_ms: f64,
    /// Multiplies every duration (0.01 = 100x faster than real time).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// SGLang's SGLANG_HEALTH_CHECK_TIMEOUT, in ms.
    #[arg(long, default_value_t = DEFAULT_HEALTH_TIMEOUT_MS)]
    pub health_timeout_ms: f64,

    /// Total latencies (ms, or `hang`) of successive client generations, e.g. `17900,106400,hang`.
    #[arg(long)]
    pub latency_script: Option<String>,
    /// Run one client generation at a time.
    #[arg(long)]
    pub serial: bool,
    /// With --serial: a client that disconnects before its first token leaks the slot forever.
    #[arg(long)]
    pub leak_slot_on_disconnect: bool,
    /// A prompt not sharing this many leading tokens with a live session mints a session (0 = off).
    #[arg(long, default_value_t = 0)]
    pub session_prefix_tokens: u64,
    /// A session with no request for this long expires.
    #[arg(long, default_value_t = 3_600_000.0)]
    pub session_idle_timeout_ms: f64,
    /// Every live session (other than the request's own) adds this stall to every request.
    #[arg(long, default_value_t = 0.0)]
    pub stall_per_session_ms: f64,
    /// Environment variable that, set to --knob-value at start, slows generation by --knob-slowdown.
    #[arg(long)]
    pub knob_env: Option<String>,
    #[arg(long)]
    pub knob_value: Option<String>,
    /// Factor applied to every generation's duration when the knob is live (<1 is a speed-up).
    #[arg(long)]
    pub knob_slowdown: Option<f64>,
    /// Make the health check's own forward pass never finish (health then fails after its timeout).
    #[arg(long)]
    pub fault_health_hang: bool,
    /// A client generation freezes (no more tokens, never finishes) after this many
    /// output tokens; 0 = off. Health's own one-token pass is unaffected.
    #[arg(long, default_value_t = 0)]
    pub freeze_after_tokens: u64,
    /// At most this many client generations run at once; the rest queue (0 = no limit;
    /// --serial is the same as 1).
    #[arg(long, default_value_t = 0)]
    pub max_running: usize,
}

/// The timing and fault settings `POST /sim/fault` can change live.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Settings {
    pub ttft_ms: f64,
    pub tpot_ms: f64,
    pub prefill_tok_per_s: f64,
    pub cold_first_ms: f64,
    pub serial: bool,
    pub leak_slot_on_disconnect: bool,
    pub session_prefix_tokens: u64,
    pub session_idle_timeout_ms: f64,
    pub stall_per_session_ms: f64,
    pub knob_env: Option<String>,
    pub knob_value: Option<String>,
    pub knob_slowdown: f64,
    /// Whether the knob's variable had the knob's value in this process's environment at start.
    pub knob_live: bool,
    pub fault_health_hang: bool,
    /// See `--freeze-after-tokens`.
    pub freeze_after_tokens: u64,
}

impl Settings {
    /// The factor every modelled duration is multiplied by (1 unless the knob is live).
    pub fn slowdown(&self) -> f64 {
        if self.knob_live { self.knob_slowdown } else { 1.0 }
    }
}

/// What is fixed for the life of one pd-sim process.
#[derive(Clone, Debug)]
pub struct Config {
    pub role: Role,
    pub host: String,
    pub port: u16,
    /// Prefill: the bootstrap port to bind (0 = any); decode: None.
    pub bootstrap_port: Option<u16>,
    pub model: String,
    pub listen_after_ms: f64,
    pub ready_after_ms: f64,
    pub time_scale: f64,
    pub health_timeout_ms: f64,
    pub latency_script: VecDeque<LatencyStep>,
    pub settings: Settings,
    /// The process environment's value of the knob variable at start (for live knob changes).
    pub knob_env_value: Option<String>,
    /// `--max-running` (0 = no limit).
    pub max_running: usize,
}

fn check(flag: &'static str, value: f64, min: f64) -> Result<f64, ConfigError> {
    if value.is_finite() && value >= min {
        Ok(value)
    } else {
        Err(ConfigError::OutOfRange { flag, min, value })
    }
}

impl Config {
    /// Validates `args`; `env` looks up environment variables (injected for tests).
    pub fn from_args(args: Args, env: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let knob_slowdown = match (&args.knob_env, &args.knob_value, args.knob_slowdown) {
            (None, None, None) => 1.0,
            (Some(_), Some(_), Some(f)) => check("knob-slowdown", f, f64::MIN_POSITIVE)?,
            (None, _, _) => return Err(ConfigError::KnobIncomplete("--knob-env")),
            (_, None, _) => return Err(ConfigError::KnobIncomplete("--knob-value")),
            (_, _, None) => return Err(ConfigError::KnobIncomplete("--knob-slowdown")),
        };
        let knob_env_value = args.knob_env.as_deref().and_then(&env);
        let knob_live = args.knob_value.is_some() && knob_env_value == args.knob_value;
        let settings = Settings {
            ttft_ms: check("ttft-ms", args.ttft_ms, 0.0)?,
            tpot_ms: check("tpot-ms", args.tpot_ms, 0.0)?,
            prefill_tok_per_s: check("prefill-tok-per-s", args.prefill_tok_per_s, 0.0)?,
            cold_first_ms: check("cold-first-ms", args.cold_first_ms, 0.0)?,
            serial: args.serial,
            leak_slot_on_disconnect: args.leak_slot_on_disconnect,
            session_prefix_tokens: args.session_prefix_tokens,
            session_idle_timeout_ms: check("session-idle-timeout-ms", args.session_idle_timeout_ms, 0.0)?,
            stall_per_session_ms: check("stall-per-session-ms", args.stall_per_session_ms, 0.0)?,
            knob_env: args.knob_env,
            knob_value: args.knob_value,
            knob_slowdown,
            knob_live,
            fault_health_hang: args.fault_health_hang,
            freeze_after_tokens: args.freeze_after_tokens,
        };
        let bootstrap_port = match args.role {
            Role::Prefill => Some(args.bootstrap_port.unwrap_or(DEFAULT_BOOTSTRAP_PORT)),
            Role::Decode => None,
        };
        Ok(Config {
            role: args.role,
            host: args.host,
            port: args.port,
            bootstrap_port,
            model: args.model,
            listen_after_ms: check("listen-after-ms", args.listen_after_ms, 0.0)?,
            ready_after_ms: check("ready-after-ms", args.ready_after_ms, 0.0)?,
            time_scale: check("time-scale", args.time_scale, f64::MIN_POSITIVE)?,
            health_timeout_ms: check("health-timeout-ms", args.health_timeout_ms, 0.0)?,
            latency_script: parse_latency_script(args.latency_script.as_deref().unwrap_or(""))?,
            settings,
            knob_env_value,
            max_running: args.max_running,
        })
    }

    /// A config for in-process tests: loopback, port 0, no delays, 1/100 time scale.
    pub fn for_test(role: Role) -> Config {
        let args = Args::parse_from([
            "pd-sim",
            "--role",
            role.as_str(),
            "--port",
            "0",
            "--bootstrap-port",
            "0",
            "--time-scale",
            "0.01",
        ]);
        Config::from_args(args, |_| None).expect("test config is valid")
    }
}

/// `--latency-script` in a `/sim/fault` body: the flag's string or a JSON list.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum ScriptPatch {
    List(Vec<ScriptEntry>),
    Text(String),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum ScriptEntry {
    Ms(f64),
    Word(String),
}

impl ScriptPatch {
    pub fn parse(&self) -> Result<VecDeque<LatencyStep>, ConfigError> {
        match self {
            ScriptPatch::Text(t) => parse_latency_script(t),
            ScriptPatch::List(items) => items
                .iter()
                .map(|e| match e {
                    ScriptEntry::Ms(v) => LatencyStep::from_str(&v.to_string()),
                    ScriptEntry::Word(w) => LatencyStep::from_str(w),
                })
                .collect(),
        }
    }
}

/// Body of `POST /sim/fault`: any subset of the flags, by the flags' names (snake_case;
/// the kebab-case spelling is accepted too). Unknown names are rejected.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultPatch {
    #[serde(alias = "latency-script")]
    pub latency_script: Option<ScriptPatch>,
    pub serial: Option<bool>,
    #[serde(alias = "leak-slot-on-disconnect")]
    pub leak_slot_on_disconnect: Option<bool>,
    #[serde(alias = "session-prefix-tokens")]
    pub session_prefix_tokens: Option<u64>,
    #[serde(alias = "session-idle-timeout-ms")]
    pub session_idle_timeout_ms: Option<f64>,
    #[serde(alias = "stall-per-session-ms")]
    pub stall_per_session_ms: Option<f64>,
    #[serde(alias = "knob-env")]
    pub knob_env: Option<String>,
    #[serde(alias = "knob-value")]
    pub knob_value: Option<String>,
    #[serde(alias = "knob-slowdown")]
    pub knob_slowdown: Option<f64>,
    #[serde(alias = "ttft-ms")]
    pub ttft_ms: Option<f64>,
    #[serde(alias = "tpot-ms")]
    pub tpot_ms: Option<f64>,
    #[serde(alias = "prefill-tok-per-s")]
    pub prefill_tok_per_s: Option<f64>,
    #[serde(alias = "cold-first-ms")]
    pub cold_first_ms: Option<f64>,
    #[serde(alias = "fault-health-hang")]
    pub fault_health_hang: Option<bool>,
    #[serde(alias = "freeze-after-tokens")]
    pub freeze_after_tokens: Option<u64>,
}

impl FaultPatch {
    /// Applies the patch to `s`. `env` looks the knob's variable up in the environment
    /// as it was at start (a knob is live only if the process started with it).
    pub fn apply(&self, s: &mut Settings, env: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        let mut n = s.clone();
        if let Some(v) = self.serial {
            n.serial = v;
        }
        if let Some(v) = self.freeze_after_tokens {
            n.freeze_after_tokens = v;
        }
        if let Some(v) = self.leak_slot_on_disconnect {
            n.leak_slot_on_disconnect = v;
        }
        if let Some(v) = self.session_prefix_tokens {
            n.session_prefix_tokens = v;
        }
        if let Some(v) = self.session_idle_timeout_ms {
            n.session_idle_timeout_ms = check("session-idle-timeout-ms", v, 0.0)?;
        }
        if let Some(v) = self.stall_per_session_ms {
            n.stall_per_session_ms = check("stall-per-session-ms", v, 0.0)?;
        }
        if let Some(v) = self.ttft_ms {
            n.ttft_ms = check("ttft-ms", v, 0.0)?;
        }
        if let Some(v) = self.tpot_ms {
            n.tpot_ms = check("tpot-ms", v, 0.0)?;
        }
        if let Some(v) = self.prefill_tok_per_s {
            n.prefill_tok_per_s = check("prefill-tok-per-s", v, 0.0)?;
        }
        if let Some(v) = self.cold_first_ms {
            n.cold_first_ms = check("cold-first-ms", v, 0.0)?;
        }
        if let Some(v) = self.fault_health_hang {
            n.fault_health_hang = v;
        }
        if let Some(v) = &self.knob_env {
            n.knob_env = Some(v.clone());
        }
        if let Some(v) = &self.knob_value {
            n.knob_value = Some(v.clone());
        }
        if let Some(v) = self.knob_slowdown {
            n.knob_slowdown = check("knob-slowdown", v, f64::MIN_POSITIVE)?;
        }
        n.knob_live = match (&n.knob_env, &n.knob_value) {
            (Some(name), Some(value)) => env(name).as_ref() == Some(value),
            _ => false,
        };
        *s = n;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut v = vec!["pd-sim", "--role", "decode", "--port", "1"];
        v.extend_from_slice(extra);
        Args::parse_from(v)
    }

    // The latency script accepts numbers and `hang`, and nothing else.
    #[test]
    fn latency_script_parses() {
        let s = parse_latency_script("17900, 106400,hang").unwrap();
        assert_eq!(
            Vec::from(s),
            vec![LatencyStep::Ms(17900.0), LatencyStep::Ms(106400.0), LatencyStep::Hang]
        );
        assert!(parse_latency_script("10,soon").is_err());
        assert!(parse_latency_script("").unwrap().is_empty());
    }

    // The knob is live only when the environment at start holds exactly the knob's value.
    #[test]
    fn knob_is_live_only_with_matching_env() {
        let a = args(&["--knob-env", "SGLANG_X", "--knob-value", "512", "--knob-slowdown", "2"]);
        let on = Config::from_args(a.clone(), |k| (k == "SGLANG_X").then(|| "512".into())).unwrap();
        assert!(on.settings.knob_live);
        assert_eq!(on.settings.slowdown(), 2.0);
        let off = Config::from_args(a, |_| Some("256".into())).unwrap();
        assert!(!off.settings.knob_live);
        assert_eq!(off.settings.slowdown(), 1.0);
        assert!(Config::from_args(args(&["--knob-env", "X"]), |_| None).is_err());
    }

    // A fault patch uses the flags' names, in either spelling, and rejects unknown ones.
    #[test]
    fn fault_patch_names() {
        let p: FaultPatch =
            serde_json::from_str(r#"{"latency_script":[100,"hang"],"serial":true,"leak-slot-on-disconnect":true}"#)
                .unwrap();
        let mut s = Config::for_test(Role::Decode).settings;
        p.apply(&mut s, |_| None).unwrap();
        assert!(s.serial && s.leak_slot_on_disconnect);
        assert_eq!(
            Vec::from(p.latency_script.unwrap().parse().unwrap()),
            vec![LatencyStep::Ms(100.0), LatencyStep::Hang]
        );
        assert!(serde_json::from_str::<FaultPatch>(r#"{"nonsense":1}"#).is_err());
    }
}
