//! `pd-faultproxy`: an HTTP/SSE proxy that injects failures between a router and ANY
//! engine.
//!
//! pd-sim fails only in the ways its authors thought of. pdwarden's judges must also be
//! tested against real engines (a vLLM pair behind vllm-router, or SGLang behind
//! sglang-router's `smg`), which do not fail on demand. This proxy sits in front of one
//! engine — `router → pd-faultproxy → engine` — forwards everything unchanged, and
//! corrupts the answers to generation requests in the ways a sick engine does. The judges
//! see the real router's retries, the real engine's counters and real timing, plus the
//! fault.
//!
//! What passes through unchanged: every request that is not a generation (`GET /health`,
//! `/health_generate`, `/metrics`, `/server_info`, `/get_server_info`, `/model_info`,
//! `/v1/models`, `/workers`, …) with its method, path and query, headers (`X-Request-Id`
//! included) and body; its answer's status, headers and body, streamed chunk by chunk.
//! Generation requests (`POST /v1/chat/completions`, `/v1/completions`, `/generate`) are
//! forwarded unchanged too — the bootstrap fields sglang-router adds and vllm-router's own
//! fields reach the engine as sent — and only their answers are altered.
//!
//! The faults ([`Faults`]; flags and the JSON of `POST /_faultproxy/faults` share names):
//! 1. `error_event_after N`: a stream aborted mid-generation. After N content events the
//!    proxy sends one error event, then `data: [DONE]`, and ends the stream (HTTP 200
//!    throughout). The event is byte for byte what SGLang sends when generation raises
//!    inside a stream: `OpenAIServingChat._generate_chat_stream`
//!    (`python/sglang/srt/entrypoints/openai/serving_chat.py`, `except ValueError as e:`
//!    and `OpenAIServingCompletion._generate_completion_stream` in `serving_completions.py`,
//!    `except Exception`) yield `data: {self.create_streaming_error_response(str(e))}` then
//!    `data: [DONE]`; `OpenAIServingBase.create_streaming_error_response`
//!    (`serving_base.py`) is `json.dumps({"error": ErrorResponse(object="error",
//!    message=…, type="BadRequestError", param=None, code=400).model_dump()})`, i.e.
//!    `{"error": {"object": "error", "message": "…", "type": "BadRequestError", "param":
//!    null, "code": 400}}` (Python's separators). `/generate` streams
//!    (`generate_request.stream_results` in `python/sglang/srt/entrypoints/http_server.py`)
//!    send `{"error":{"message":"…"}}` (orjson, compact) instead. A non-streamed answer is
//!    rewritten as a request aborted mid-generation: 200, content cut to its first N
//!    whitespace-separated words, `finish_reason` `"abort"` and the completion token count
//!    set to the words kept. This is SGLang's answer to a request aborted while it ran
//!    without an HTTP status (`/abort_request`, or the scheduler's `FINISH_ABORT` with
//!    `status_code=None`, `python/sglang/srt/managers/schedule_batch.py`): the tokenizer
//!    manager returns the partial output and `_build_chat_response` reports
//!    `finish_reason: "abort"`. (Words stand in for tokens: the proxy has no tokenizer.
//!    Newer releases also end a *streamed* scheduler abort that way — a finish chunk with
//!    `finish_reason: "abort"` — rather than with the error event.)
//! 2. `short_stream_after N`: a stream cut short. After N content events, `data: [DONE]`
//!    and the end: no finish_reason chunk, no usage, no error. Non-streamed: content cut to
//!    N words, `finish_reason` null, usage adjusted — an answer that never says it ended.
//!    No engine means to do this; it is what a broken connector or a buggy engine would
//!    leave a client with, and a judge must not read it as complete.
//! 3. `http_500 K`: the next K faulted generation requests are answered HTTP 500 by the
//!    proxy itself, without reaching the engine, with the body of SGLang's OpenAI layer
//!    for an exception in a handler (`OpenAIServingBase.handle_request`, `except Exception`
//!    → `create_error_response(message=f"Internal server error: {e}",
//!    err_type="InternalServerError", status_code=500)`):
//!    `{"object":"error","message":"Internal server error: …","type":"InternalServerError",
//!    "param":null,"code":500}`; `/generate` gets FastAPI's `{"detail":"…"}` (an
//!    `HTTPException(500)`, as pd-sim answers a failed KV transfer there). The router
//!    retries such answers: the client sees a slower 200, and only the router's own
//!    counters show the failure (ROUTER-NOTES.md).
//! 4. `first_token_delay_ms D`: the first content event of a stream (or a whole
//!    non-streamed answer) is held D ms, then everything passes normally: a slow first
//!    token (a cold engine, a long queue) with nothing else wrong.
//! 5. `stall_after N`: after N content events nothing more is sent; the connection stays
//!    open until the client goes away (at most [`STALL_BOUND`], after which the stream
//!    ends, or a non-streamed request is answered 504). A non-streamed answer is held the
//!    same way. A generation frozen mid-stream that still holds its connection — the
//!    wedge that a health endpoint does not see (INCIDENTS).
//! 6. `alter_tokens`: the text of every content delta (`choices[0].delta.content`,
//!    `choices[0].text`, a `/generate` event's `text`; non-streamed
//!    `choices[0].message.content`, `choices[0].text`, `text`) is replaced by a different
//!    string of the same number of characters (letters rotated by 13, digits by 5),
//!    everything else kept: an engine that answers fast and well-formed, and wrong (a
//!    replaced weight file, a broken kernel).
//! 7. `alter_token_at N`: one token of a chat completion's answer — token N, 0-based — is
//!    replaced by a different one, everything else kept: the one wrong token a golden
//!    output check must catch. With `choices[0].logprobs.content` (the request asked for
//!    logprobs), entry N's `token` and `bytes` become the new token's (and so does the old
//!    token among that entry's `top_logprobs`; the logprob values stay), and the same
//!    characters of `choices[0].message.content` change; without logprobs, the N-th
//!    whitespace-separated word of the content. Streamed: the N-th content event, its
//!    delta's text and its `logprobs.content[0]` alike. The new token is the old one
//!    through [`alter_text`]. `/v1/completions` and `/generate` answers pass unaltered
//!    by this fault. An answer shorter than N+1 tokens is not altered (nor counted); with
//!    `alter_tokens` set too, every text is altered already and this fault does nothing.
//!
//! Each fault set applies to the next `times` matching generation requests (absent =
//! every one); `match: "probe"` limits it to requests whose `X-Request-Id` begins
//! `pdwarden-probe-` (the one probe tag that survives the router), `"stream"` to
//! streamed requests (`"stream": true`: the suite's long generation, not the short
//! non-streamed probes), `"all"` (the default) takes every generation request. `http_500`'s K is counted on top: of the faulted
//! requests, the first K are answered 500 and the rest get the other faults. A fault that
//! ends a stream fires once its N content events have passed (N = 0: before any of the
//! upstream's events); when several are set, the smallest N wins (error event, then short
//! stream, then stall on a tie). Error answers from the engine (status not 2xx) pass
//! unchanged.
//!
//! A content event is an SSE event whose JSON has a non-empty string at
//! `choices[0].delta.content` or `choices[0].text` — or, for SGLang's `/generate`
//! (no `choices`, a `meta_info`), at `text`. Role, usage and finish chunks, `[DONE]` and
//! anything unparsable pass through byte for byte. Events are reassembled across chunks
//! (split at `\n\n` or `\r\n\r\n`), each bounded to [`MAX_EVENT_BYTES`]: a longer one is
//! passed on unparsed. An altered event is re-serialised as one `data:` line.
//!
//! Control, on the proxy's own port: `GET /_faultproxy/faults` answers the current set,
//! what is left of `times` and `http_500`, and the counters (generation requests seen,
//! matched and faulted, faults injected per kind); `POST /_faultproxy/faults` with a JSON
//! [`Faults`] replaces the set (an empty object clears it) and restarts `times` and
//! `http_500`; the counters run on.
//!
//! An upstream that refuses the connection is answered 502 with a one-line reason.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use futures::{Stream, StreamExt};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::http::PROBE_ID_PREFIX;

/// The proxy's own control endpoint.
pub const CONTROL_PATH: &str = "/_faultproxy/faults";
/// The longest SSE event the proxy reassembles; a longer one passes on unparsed.
pub const MAX_EVENT_BYTES: usize = 1 << 20;
/// The longest non-streamed answer the proxy rewrites.
pub const MAX_JSON_ANSWER_BYTES: usize = 16 << 20;
/// The longest request body the proxy forwards.
pub const MAX_REQUEST_BYTES: usize = 64 << 20;
/// How long a stall holds a connection at most.
pub const STALL_BOUND: Duration = Duration::from_secs(600);
/// The longest `first_token_delay_ms` accepted.
pub const MAX_DELAY_MS: u64 = 600_000;

/// Which generation requests a fault set applies to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum MatchRule {
    /// Every generation request.
    #[default]
    All,
    /// Only those whose `X-Request-Id` begins `pdwarden-probe-`.
    Probe,
    /// Only streamed ones (`"stream": true` in the body): a long streamed
    /// generation is hit while the short non-streamed probes pass.
    Stream,
}

/// The faults to inject: the flags, and the body of `POST /_faultproxy/faults` (same
/// names, snake_case; kebab-case accepted). Unknown names are rejected.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// After N content events: SGLang's stream error event, `[DONE]`, end.
    #[serde(alias = "error-event-after")]
    pub error_event_after: Option<u64>,
    /// After N content events: `[DONE]` and end, no finish_reason.
    #[serde(alias = "short-stream-after")]
    pub short_stream_after: Option<u64>,
    /// The next K faulted requests are answered 500 without being forwarded.
    #[serde(alias = "http-500")]
    pub http_500: Option<u64>,
    /// Every Nth faulted request is answered 500 without being forwarded, for
    /// as long as the set stands: a fraction 1/N of the traffic (issue 47:
    /// clients keep sending, so a count of K would be spent on theirs).
    #[serde(alias = "http-500-every")]
    pub http_500_every: Option<u64>,
    /// Hold the first content event (or a whole non-streamed answer) this long.
    #[serde(alias = "first-token-delay-ms")]
    pub first_token_delay_ms: Option<u64>,
    /// After N content events: nothing more, connection held open.
    #[serde(alias = "stall-after")]
    pub stall_after: Option<u64>,
    /// Replace every content text with a different one of the same length.
    #[serde(alias = "alter-tokens")]
    pub alter_tokens: bool,
    /// Replace token N (0-based) of a chat completion's answer, in its content and its
    /// logprobs entry.
    #[serde(alias = "alter-token-at")]
    pub alter_token_at: Option<u64>,
    /// How many matching generation requests the set applies to (None = every one).
    pub times: Option<u64>,
    /// Which generation requests match.
    #[serde(rename = "match")]
    pub match_rule: MatchRule,
    /// Only requests whose body contains this text match as well (a
    /// scenario aims at one kind of request by its prompt: the gate's
    /// benchmark, say, and not the verification around it).
    #[serde(alias = "match-body")]
    pub match_body: Option<String>,
}

impl Faults {
    /// Whether any fault is set.
    pub fn any(&self) -> bool {
        self.error_event_after.is_some()
            || self.short_stream_after.is_some()
            || self.http_500.is_some()
            || self.http_500_every.is_some()
            || self.first_token_delay_ms.is_some()
            || self.stall_after.is_some()
            || self.alter_tokens
            || self.alter_token_at.is_some()
    }

    /// Checks the values a flag parser cannot.
    pub fn validate(&self) -> Result<(), FaultError> {
        if self.times == Some(0) {
            return Err(FaultError::Invalid {
                flag: "--times",
                why: "must be at least 1 (leave it out for every matching request)".into(),
            });
        }
        if self.match_body.as_deref() == Some("") {
            return Err(FaultError::Invalid {
                flag: "--match-body",
                why: "must not be empty (leave it out to match any body)".into(),
            });
        }
        if self.http_500_every == Some(0) {
            return Err(FaultError::Invalid {
                flag: "--http-500-every",
                why: "must be at least 1 (leave it out for none)".into(),
            });
        }
        if self.http_500 == Some(0) {
            return Err(FaultError::Invalid {
                flag: "--http-500",
                why: "must be at least 1 (leave it out for none)".into(),
            });
        }
        if let Some(d) = self.first_token_delay_ms
            && d > MAX_DELAY_MS
        {
            return Err(FaultError::Invalid {
                flag: "--first-token-delay-ms",
                why: format!("must be at most {MAX_DELAY_MS} ms, got {d}"),
            });
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    #[error("{flag} {why}")]
    Invalid { flag: &'static str, why: String },
    #[error("--listen {0:?} is not an IP:PORT address such as 127.0.0.1:8080")]
    Listen(String),
    #[error("--upstream {given:?} {why}")]
    Upstream { given: String, why: String },
    #[error("cannot bind --listen {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot build the upstream HTTP client: {0}")]
    Client(String),
}

/// pd-faultproxy's flags, as typed.
#[derive(clap::Parser, Debug, Clone)]
#[command(
    name = "pd-faultproxy",
    about = "A fault-injecting HTTP/SSE proxy between a router and an LLM engine (pd-sim, SGLang, vLLM)"
)]
pub struct Args {
    /// Address to listen on, IP:PORT (port 0 picks a free one; the bound address is
    /// printed on stdout as `pd-faultproxy listening on IP:PORT`).
    #[arg(long)]
    pub listen: String,
    /// The engine, http://HOST:PORT (no path).
    #[arg(long)]
    pub upstream: String,
    /// In a stream, after N content events send SGLang's error event, `data: [DONE]`,
    /// and end; a non-streamed answer becomes an abort (finish_reason "abort", content cut
    /// to N words).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub error_event_after: Option<u64>,
    /// In a stream, after N content events send `data: [DONE]` and end (no finish_reason);
    /// a non-streamed answer is cut to N words with finish_reason null.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub short_stream_after: Option<u64>,
    /// Answer the next K faulted generation requests HTTP 500 (SGLang's
    /// InternalServerError body) without forwarding them; later ones pass.
    #[arg(long = "http-500", value_name = "K", allow_negative_numbers = true)]
    pub http_500: Option<u64>,
    /// Answer every Nth faulted generation request with HTTP 500 (a fraction 1/N).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub http_500_every: Option<u64>,
    /// Hold the first content event of a stream (or a whole non-streamed answer) D ms.
    #[arg(long, value_name = "D", allow_negative_numbers = true)]
    pub first_token_delay_ms: Option<u64>,
    /// After N content events send nothing more and hold the connection open until the
    /// client goes away (at most 10 minutes); a non-streamed answer is held the same way.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub stall_after: Option<u64>,
    /// Replace the text of every content delta with a different string of the same length.
    #[arg(long)]
    pub alter_tokens: bool,
    /// Replace token N (0-based) of a chat completion's answer with a different one (its
    /// text in the content, its `logprobs.content` entry).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub alter_token_at: Option<u64>,
    /// Apply the faults to the next N matching generation requests only (default: all).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub times: Option<u64>,
    /// Which generation requests the faults apply to: `all`, or `probe` (X-Request-Id
    /// beginning `pdwarden-probe-`).
    #[arg(long = "match", value_enum, default_value_t = MatchRule::All)]
    pub match_rule: MatchRule,
    /// Only requests whose body contains this text match as well.
    #[arg(long, value_name = "TEXT")]
    pub match_body: Option<String>,
}

/// Validated flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyConfig {
    pub listen: SocketAddr,
    /// `http://HOST:PORT`, no trailing slash.
    pub upstream: String,
    pub faults: Faults,
}

impl Args {
    /// Checks every flag; the error names the one at fault.
    pub fn validate(self) -> Result<ProxyConfig, FaultError> {
        let listen = self
            .listen
            .trim()
            .parse::<SocketAddr>()
            .map_err(|_| FaultError::Listen(self.listen.clone()))?;
        let upstream = parse_upstream(&self.upstream)?;
        let faults = Faults {
            error_event_after: self.error_event_after,
            short_stream_after: self.short_stream_after,
            http_500: self.http_500,
            http_500_every: self.http_500_every,
            first_token_delay_ms: self.first_token_delay_ms,
            stall_after: self.stall_after,
            alter_tokens: self.alter_tokens,
            alter_token_at: self.alter_token_at,
            times: self.times,
            match_rule: self.match_rule,
            match_body: self.match_body,
        };
        faults.validate()?;
        Ok(ProxyConfig {
            listen,
            upstream,
            faults,
        })
    }
}

/// `http://HOST:PORT[/]` → `http://HOST:PORT`.
pub fn parse_upstream(given: &str) -> Result<String, FaultError> {
    let bad = |why: &str| FaultError::Upstream {
        given: given.to_string(),
        why: why.to_string(),
    };
    let url = reqwest::Url::parse(given.trim()).map_err(|e| bad(&format!("is not a URL ({e})")))?;
    if url.scheme() != "http" {
        return Err(bad("must be an http:// URL (https is not supported)"));
    }
    let host = url.host_str().ok_or_else(|| bad("has no host"))?;
    if !(url.path().is_empty() || url.path() == "/") || url.query().is_some() || url.fragment().is_some() {
        return Err(bad("must be http://HOST:PORT with no path or query"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad("must not carry credentials"));
    }
    let port = url.port_or_known_default().unwrap_or(80);
    Ok(format!("http://{host}:{port}"))
}

/// The first non-empty lines of a clap error, as one line (its usage and hint dropped).
pub fn one_line_clap_error(e: &clap::Error) -> String {
    let text = e.to_string();
    let mut parts = Vec::new();
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with("Usage:") || l.starts_with("For more information") {
            break;
        }
        if !l.is_empty() {
            parts.push(l.strip_prefix("error: ").unwrap_or(l).to_string());
        }
    }
    parts.join(" ")
}

// ---------------------------------------------------------------- state

/// Counts of faults injected, by kind (each named as its fault).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Injected {
    pub error_event_after: u64,
    pub short_stream_after: u64,
    pub http_500: u64,
    pub first_token_delay_ms: u64,
    pub stall_after: u64,
    pub alter_tokens: u64,
    #[serde(default)]
    pub alter_token_at: u64,
}

/// What `GET /_faultproxy/faults` reports besides the set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Generation requests seen (faulted or not).
    pub generation_requests: u64,
    /// Of those, the ones the set's `match` selected while a fault was set.
    pub matched_requests: u64,
    /// Of those, the ones the faults were applied to (within `times`).
    pub faulted_requests: u64,
    /// Requests that were not generations (forwarded unchanged).
    pub other_requests: u64,
    /// Faults that took effect, by kind (a fault whose N was never reached is not counted).
    pub injected: Injected,
}

/// What is left of the set's budgets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Remaining {
    /// Faulted requests left (None = no limit).
    pub times: Option<u64>,
    /// 500 answers left.
    pub http_500: u64,
}

/// The body of `GET`/`POST /_faultproxy/faults`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlState {
    pub faults: Faults,
    pub remaining: Remaining,
    pub counters: Counters,
}

/// Which generation API a request uses (it shapes the error answers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    Chat,
    Completions,
    Generate,
}

fn generation_api(method: &Method, path: &str) -> Option<Api> {
    if method != Method::POST {
        return None;
    }
    match path {
        "/v1/chat/completions" => Some(Api::Chat),
        "/v1/completions" => Some(Api::Completions),
        "/generate" => Some(Api::Generate),
        _ => None,
    }
}

/// The faults one request gets.
#[derive(Clone, Debug)]
struct Plan {
    api: Api,
    http_500: bool,
    error_event_after: Option<u64>,
    short_stream_after: Option<u64>,
    stall_after: Option<u64>,
    first_token_delay: Option<Duration>,
    alter: bool,
    /// `alter_token_at` (chat completions only).
    alter_token_at: Option<u64>,
}

/// How a faulted stream ends early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Error,
    Short,
    Stall,
}

impl Plan {
    /// Nothing to do to the answer (its 500 budget spent, nothing else set).
    fn is_inert(&self) -> bool {
        self.error_event_after.is_none()
            && self.short_stream_after.is_none()
            && self.stall_after.is_none()
            && self.first_token_delay.is_none()
            && !self.alter
            && self.alter_token_at.is_none()
    }

    /// The end that fires once `n` content events have passed.
    fn end_at(&self, n: u64) -> Option<End> {
        if self.error_event_after == Some(n) {
            Some(End::Error)
        } else if self.short_stream_after == Some(n) {
            Some(End::Short)
        } else if self.stall_after == Some(n) {
            Some(End::Stall)
        } else {
            None
        }
    }

    /// For a non-streamed answer: how it is cut (abort or short) and at how many words.
    fn cut(&self) -> Option<(End, u64)> {
        match (self.error_event_after, self.short_stream_after) {
            (Some(e), Some(s)) if s < e => Some((End::Short, s)),
            (Some(e), _) => Some((End::Error, e)),
            (None, Some(s)) => Some((End::Short, s)),
            (None, None) => None,
        }
    }
}

struct ProxyState {
    faults: Faults,
    remaining: Remaining,
    counters: Counters,
    /// Faulted requests since the set was replaced (`http_500_every`).
    faulted_in_set: u64,
}

struct Proxy {
    upstream: String,
    client: reqwest::Client,
    state: Mutex<ProxyState>,
}

impl Proxy {
    fn lock(&self) -> std::sync::MutexGuard<'_, ProxyState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn snapshot(&self) -> ControlState {
        let s = self.lock();
        ControlState {
            faults: s.faults.clone(),
            remaining: s.remaining.clone(),
            counters: s.counters.clone(),
        }
    }

    fn replace(&self, faults: Faults) {
        let mut s = self.lock();
        s.remaining = Remaining {
            times: faults.times,
            http_500: faults.http_500.unwrap_or(0),
        };
        s.faulted_in_set = 0;
        s.faults = faults;
    }

    fn count(&self, f: impl FnOnce(&mut Injected)) {
        f(&mut self.lock().counters.injected);
    }

    /// Counts a generation request and decides its faults.
    fn admit(&self, api: Api, headers: &HeaderMap, body: &[u8]) -> Option<Plan> {
        let probe = headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|id| id.starts_with(PROBE_ID_PREFIX));
        let streamed = || {
            serde_json::from_slice::<Value>(body)
                .ok()
                .and_then(|v| v.get("stream").and_then(Value::as_bool))
                .unwrap_or(false)
        };
        let mut s = self.lock();
        s.counters.generation_requests += 1;
        let matched = match s.faults.match_rule {
            MatchRule::All => true,
            MatchRule::Probe => probe,
            MatchRule::Stream => streamed(),
        } && s
            .faults
            .match_body
            .as_deref()
            .is_none_or(|text| body.windows(text.len().max(1)).any(|w| w == text.as_bytes()));
        if !s.faults.any() || !matched {
            return None;
        }
        s.counters.matched_requests += 1;
        match s.remaining.times {
            Some(0) => return None,
            Some(n) => s.remaining.times = Some(n - 1),
            None => {}
        }
        s.counters.faulted_requests += 1;
        s.faulted_in_set += 1;
        let every = s
            .faults
            .http_500_every
            .is_some_and(|n| s.faulted_in_set.is_multiple_of(n.max(1)));
        let http_500 = s.remaining.http_500 > 0 || every;
        if s.remaining.http_500 > 0 {
            s.remaining.http_500 -= 1;
        }
        if http_500 {
            s.counters.injected.http_500 += 1;
        }
        let f = &s.faults;
        Some(Plan {
            api,
            http_500,
            error_event_after: f.error_event_after,
            short_stream_after: f.short_stream_after,
            stall_after: f.stall_after,
            first_token_delay: f.first_token_delay_ms.map(Duration::from_millis),
            alter: f.alter_tokens,
            alter_token_at: f.alter_token_at.filter(|_| api == Api::Chat),
        })
    }
}

// ---------------------------------------------------------------- serving

/// Proxies `listener`'s connections to `upstream` (`http://HOST:PORT`) with `faults`
/// until `shutdown` completes; then drops every connection at once (a stalled one
/// included).
pub async fn serve(
    listener: TcpListener,
    upstream: String,
    faults: Faults,
    shutdown: impl Future<Output = ()>,
) -> Result<(), FaultError> {
    let upstream = parse_upstream(&upstream)?;
    faults.validate()?;
    let client = reqwest::Client::builder()
        .no_proxy()
        // A redirect is the engine's answer, for the client to see.
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| FaultError::Client(e.to_string()))?;
    let proxy = Arc::new(Proxy {
        upstream,
        client,
        state: Mutex::new(ProxyState {
            faults: Faults::default(),
            remaining: Remaining::default(),
            counters: Counters::default(),
            faulted_in_set: 0,
        }),
    });
    proxy.replace(faults);
    let router = Router::new().fallback(handle).with_state(proxy);
    let cancel = CancellationToken::new();
    let accept = accept_loop(listener, router, cancel.clone());
    tokio::pin!(accept);
    tokio::select! {
        _ = &mut accept => {}
        _ = shutdown => {
            cancel.cancel();
            accept.await;
        }
    }
    Ok(())
}

/// Serves `router` on `listener` until `cancel`; then drops every connection.
async fn accept_loop(listener: TcpListener, router: Router, cancel: CancellationToken) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let svc = TowerToHyperService::new(router.clone());
                    let cancel = cancel.clone();
                    conns.spawn(async move {
                        let conn = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc);
                        tokio::select! {
                            _ = conn => {}
                            _ = cancel.cancelled() => {}
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    conns.shutdown().await;
}

/// A one-line plain-text answer.
fn one_line(status: StatusCode, text: String) -> Response {
    let mut body = text.replace(['\n', '\r'], " ");
    body.push('\n');
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}

const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

/// Removes the headers that belong to one hop, not to the message.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(header::TRANSFER_ENCODING);
}

async fn handle(State(proxy): State<Arc<Proxy>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    if parts.uri.path() == CONTROL_PATH {
        return control(&proxy, &parts.method, body).await;
    }
    let api = generation_api(&parts.method, parts.uri.path());
    let body = match axum::body::to_bytes(body, MAX_REQUEST_BYTES).await {
        Ok(b) => b,
        Err(e) => {
            return one_line(
                StatusCode::BAD_REQUEST,
                format!("pd-faultproxy: cannot read the request body (at most {MAX_REQUEST_BYTES} bytes): {e}"),
            );
        }
    };
    let plan = match api {
        Some(api) => proxy.admit(api, &parts.headers, &body),
        None => {
            proxy.lock().counters.other_requests += 1;
            None
        }
    };
    if let Some(plan) = &plan
        && plan.http_500
    {
        tracing::info!(path = %parts.uri.path(), "injected HTTP 500");
        return http_500(plan.api);
    }
    let path_and_query = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let url = format!("{}{}", proxy.upstream, path_and_query);
    let mut headers = parts.headers.clone();
    strip_hop_by_hop(&mut headers);
    headers.remove(header::HOST);
    let had_length = headers.remove(header::CONTENT_LENGTH).is_some();
    let mut request = proxy.client.request(parts.method.clone(), &url).headers(headers);
    if !body.is_empty() || had_length {
        request = request.body(body);
    }
    let answer = match request.send().await {
        Ok(a) => a,
        Err(e) => return bad_gateway(&proxy.upstream, &e),
    };
    match plan {
        Some(plan) if answer.status().is_success() && !plan.is_inert() => faulted(proxy, plan, answer).await,
        _ => passthrough(answer),
    }
}

fn bad_gateway(upstream: &str, e: &reqwest::Error) -> Response {
    let mut cause = String::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        cause = s.to_string();
        source = s.source();
    }
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not be connected to"
    } else {
        "failed"
    };
    let reason = if cause.is_empty() {
        format!("pd-faultproxy: upstream {upstream} {what}: {e}")
    } else {
        format!("pd-faultproxy: upstream {upstream} {what}: {cause}")
    };
    tracing::warn!("{reason}");
    one_line(StatusCode::BAD_GATEWAY, reason)
}

/// The upstream's status and headers, for an answer built from them.
fn head_of(answer: &reqwest::Response) -> (StatusCode, HeaderMap) {
    let mut headers = answer.headers().clone();
    strip_hop_by_hop(&mut headers);
    (answer.status(), headers)
}

fn respond(status: StatusCode, headers: HeaderMap, body: Body) -> Response {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    *r.headers_mut() = headers;
    r
}

/// The upstream's answer as it comes, chunk by chunk.
fn passthrough(answer: reqwest::Response) -> Response {
    let (status, headers) = head_of(&answer);
    respond(status, headers, Body::from_stream(answer.bytes_stream()))
}

#[derive(Serialize)]
struct OpenAiError<'a> {
    object: &'a str,
    message: &'a str,
    #[serde(rename = "type")]
    err_type: &'a str,
    param: Option<&'a str>,
    code: u16,
}

/// SGLang's answer to an exception in a handler (module doc, fault 3).
fn http_500(api: Api) -> Response {
    let message = "Internal server error: injected by pd-faultproxy (--http-500)";
    let body = match api {
        Api::Chat | Api::Completions => serde_json::to_string(&OpenAiError {
            object: "error",
            message,
            err_type: "InternalServerError",
            param: None,
            code: 500,
        }),
        Api::Generate => serde_json::to_string(&serde_json::json!({ "detail": message })),
    }
    .unwrap_or_default();
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// The SSE bytes SGLang sends when a stream aborts (module doc, fault 1), through `[DONE]`.
fn error_event(api: Api, message: &str) -> String {
    // serde_json's string escaping, as json.dumps/orjson would write this ASCII message.
    let msg = serde_json::to_string(message).unwrap_or_else(|_| "\"aborted\"".into());
    let event = match api {
        Api::Chat | Api::Completions => format!(
            "{{\"error\": {{\"object\": \"error\", \"message\": {msg}, \"type\": \"BadRequestError\", \"param\": null, \"code\": 400}}}}"
        ),
        Api::Generate => format!("{{\"error\":{{\"message\":{msg}}}}}"),
    };
    format!("data: {event}\n\ndata: [DONE]\n\n")
}

fn abort_message(n: u64) -> String {
    format!("Request aborted mid-generation by pd-faultproxy after {n} content events (--error-event-after {n})")
}

async fn faulted(proxy: Arc<Proxy>, plan: Plan, answer: reqwest::Response) -> Response {
    let (status, mut headers) = head_of(&answer);
    let sse = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.trim_start().to_ascii_lowercase().starts_with("text/event-stream"));
    if sse {
        headers.remove(header::CONTENT_LENGTH);
        let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(16);
        tokio::spawn(pump(proxy, plan, answer.bytes_stream(), tx));
        let body = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
        return respond(status, headers, Body::from_stream(body));
    }
    whole_answer(proxy, plan, status, headers, answer).await
}

/// A non-streamed answer: held, stalled or rewritten.
async fn whole_answer(
    proxy: Arc<Proxy>,
    plan: Plan,
    status: StatusCode,
    mut headers: HeaderMap,
    answer: reqwest::Response,
) -> Response {
    if let Some(d) = plan.first_token_delay {
        tokio::time::sleep(d).await;
        proxy.count(|i| i.first_token_delay_ms += 1);
    }
    if plan.stall_after.is_some() {
        proxy.count(|i| i.stall_after += 1);
        tracing::info!("stalling a non-streamed answer");
        tokio::time::sleep(STALL_BOUND).await;
        return one_line(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "pd-faultproxy: a stalled answer released after {} s (--stall-after)",
                STALL_BOUND.as_secs()
            ),
        );
    }
    let cut = plan.cut();
    if cut.is_none() && !plan.alter && plan.alter_token_at.is_none() {
        return respond(status, headers, Body::from_stream(answer.bytes_stream()));
    }
    let bytes = match read_bounded(answer, MAX_JSON_ANSWER_BYTES).await {
        Ok(b) => b,
        Err(why) => return one_line(StatusCode::BAD_GATEWAY, format!("pd-faultproxy: {why}")),
    };
    let Ok(mut v) = serde_json::from_slice::<Value>(&bytes) else {
        return respond(status, headers, Body::from(bytes));
    };
    if let Some((end, n)) = cut
        && cut_answer(&mut v, end, n)
    {
        proxy.count(|i| match end {
            End::Short => i.short_stream_after += 1,
            _ => i.error_event_after += 1,
        });
    }
    if plan.alter && alter_answer(&mut v) {
        proxy.count(|i| i.alter_tokens += 1);
    }
    if let Some(n) = plan.alter_token_at.filter(|_| !plan.alter)
        && alter_one_token(&mut v, n)
    {
        tracing::info!(position = n, "altered one token of an answer");
        proxy.count(|i| i.alter_token_at += 1);
    }
    headers.remove(header::CONTENT_LENGTH);
    let body = serde_json::to_vec(&v).unwrap_or_else(|_| bytes.to_vec());
    respond(status, headers, Body::from(body))
}

/// Why an upstream answer to rewrite could not be read ([`read_bounded`]).
#[derive(Debug, thiserror::Error)]
enum ReadAnswerError {
    #[error("reading the upstream answer failed: {0}")]
    Read(#[source] reqwest::Error),
    #[error("the upstream answer is over {limit} bytes; not rewritten")]
    TooLarge { limit: usize },
}

async fn read_bounded(answer: reqwest::Response, limit: usize) -> Result<Bytes, ReadAnswerError> {
    let mut out = Vec::new();
    let mut stream = answer.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(ReadAnswerError::Read)?;
        if out.len() + chunk.len() > limit {
            return Err(ReadAnswerError::TooLarge { limit });
        }
        out.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(out))
}

/// Where a non-streamed answer keeps its text.
fn answer_text(v: &mut Value) -> Option<&mut Value> {
    if v.get("choices").is_some() {
        let choice = v.get_mut("choices")?.get_mut(0)?;
        if choice.get("message").is_some() {
            return choice.get_mut("message")?.get_mut("content");
        }
        return choice.get_mut("text");
    }
    v.get_mut("text")
}

/// The first `n` whitespace-separated words of `s` (their separators kept) and how many
/// words that is.
fn first_words(s: &str, n: u64) -> (String, u64) {
    let mut kept = 0;
    let mut end = 0;
    let mut in_word = false;
    for (i, c) in s.char_indices() {
        if c.is_whitespace() {
            if in_word {
                in_word = false;
                end = i;
                if kept == n {
                    break;
                }
            }
        } else if !in_word {
            if kept == n {
                break;
            }
            in_word = true;
            kept += 1;
        }
    }
    if in_word {
        end = s.len();
    }
    (s[..end].to_string(), kept)
}

/// Cuts a non-streamed answer to `n` words, as an abort (`End::Error`) or a short answer.
/// False if the answer has no text where one was expected.
fn cut_answer(v: &mut Value, end: End, n: u64) -> bool {
    let chat = v.pointer("/choices/0/message").is_some();
    let Some(slot) = answer_text(v) else {
        return false;
    };
    let text = slot.as_str().unwrap_or("").to_string();
    // An answer that never reached N words was never cut: the fault is "after N".
    if text.split_whitespace().count() as u64 <= n {
        return false;
    }
    let (kept, words) = first_words(&text, n);
    *slot = if kept.is_empty() && chat {
        Value::Null
    } else {
        Value::String(kept)
    };
    let abort = end == End::Error;
    if v.get("choices").is_some() {
        if let Some(choice) = v.pointer_mut("/choices/0").and_then(Value::as_object_mut) {
            let reason = if abort { Value::from("abort") } else { Value::Null };
            choice.insert("finish_reason".into(), reason);
            if choice.contains_key("matched_stop") {
                choice.insert("matched_stop".into(), Value::Null);
            }
        }
        if let Some(usage) = v.get_mut("usage").and_then(Value::as_object_mut) {
            let prompt = usage.get("prompt_tokens").and_then(Value::as_u64).unwrap_or(0);
            usage.insert("completion_tokens".into(), words.into());
            usage.insert("total_tokens".into(), (prompt + words).into());
        }
    } else if let Some(meta) = v.get_mut("meta_info").and_then(Value::as_object_mut) {
        let reason = if abort {
            serde_json::json!({"type": "abort", "message": abort_message(n), "status_code": null, "err_type": null})
        } else {
            Value::Null
        };
        meta.insert("finish_reason".into(), reason);
        meta.insert("completion_tokens".into(), words.into());
        if let Some(ids) = v.get_mut("output_ids").and_then(Value::as_array_mut) {
            ids.truncate(usize::try_from(words).unwrap_or(usize::MAX));
        }
    }
    true
}

/// Alters a non-streamed answer's text; false if it has none to alter.
fn alter_answer(v: &mut Value) -> bool {
    match answer_text(v) {
        Some(Value::String(s)) if !s.is_empty() => {
            *s = alter_text(s);
            true
        }
        _ => false,
    }
}

/// Gives a `logprobs.content` entry (or a `top_logprobs` one) the token `new` in place
/// of `old`: its `token`, its `bytes`, and `old` among its `top_logprobs`.
fn alter_entry(e: &mut Value, old: &str, new: &str) {
    let Some(obj) = e.as_object_mut() else {
        return;
    };
    obj.insert("token".into(), Value::from(new));
    if obj.contains_key("bytes") {
        obj.insert("bytes".into(), Value::from(new.as_bytes().to_vec()));
    }
    if let Some(top) = obj.get_mut("top_logprobs").and_then(Value::as_array_mut) {
        for t in top
            .iter_mut()
            .filter(|t| t.get("token").and_then(Value::as_str) == Some(old))
        {
            alter_entry(t, old, new);
        }
    }
}

/// The byte range of the `n`-th (0-based) whitespace-separated word of `s`.
fn word_range(s: &str, n: usize) -> Option<std::ops::Range<usize>> {
    let mut words = 0;
    let mut start = None;
    for (i, c) in s.char_indices() {
        match (c.is_whitespace(), start) {
            (false, None) => start = Some(i),
            (true, Some(b)) => {
                if words == n {
                    return Some(b..i);
                }
                words += 1;
                start = None;
            }
            _ => {}
        }
    }
    start.filter(|_| words == n).map(|b| b..s.len())
}

/// `alter_token_at`: alters token `n` of a non-streamed chat answer (the module doc);
/// false if it has no such token.
fn alter_one_token(v: &mut Value, n: u64) -> bool {
    let n = usize::try_from(n).unwrap_or(usize::MAX);
    if let Some(entries) = v
        .pointer_mut("/choices/0/logprobs/content")
        .and_then(Value::as_array_mut)
    {
        let tokens: Vec<String> = entries
            .iter()
            .map(|e| e.get("token").and_then(Value::as_str).unwrap_or("").to_string())
            .collect();
        let Some(old) = tokens.get(n).filter(|t| !t.is_empty()) else {
            return false;
        };
        let new = alter_text(old);
        alter_entry(&mut entries[n], old, &new);
        let at: usize = tokens[..n].iter().map(String::len).sum();
        if let Some(Value::String(text)) = answer_text(v)
            && text.get(at..at + old.len()) == Some(old.as_str())
        {
            text.replace_range(at..at + old.len(), &new);
        }
        return true;
    }
    match answer_text(v) {
        Some(Value::String(text)) => match word_range(text, n) {
            Some(r) => {
                let new = alter_text(&text[r.clone()]);
                text.replace_range(r, &new);
                true
            }
            None => false,
        },
        _ => false,
    }
}

/// `alter_token_at` on the chosen content event of a chat stream: its first
/// `logprobs.content` entry and the same characters of its delta text (its whole text
/// without logprobs).
fn alter_event_token(v: &mut Value) {
    let old = v
        .pointer("/choices/0/logprobs/content/0/token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .map(str::to_string);
    match old {
        Some(old) => {
            let new = alter_text(&old);
            if let Some(e) = v.pointer_mut("/choices/0/logprobs/content/0") {
                alter_entry(e, &old, &new);
            }
            if let Some(Value::String(text)) = event_text(v) {
                if text.starts_with(old.as_str()) {
                    text.replace_range(..old.len(), &new);
                } else {
                    *text = alter_text(text);
                }
            }
        }
        None => {
            if let Some(Value::String(text)) = event_text(v) {
                *text = alter_text(text);
            }
        }
    }
}

/// A different string of the same number of characters: letters rotated by 13, digits
/// by 5; a text with neither has its first character replaced.
pub fn alter_text(s: &str) -> String {
    let rotated: String = s
        .chars()
        .map(|c| match c {
            'a'..='z' => char::from((c as u8 - b'a' + 13) % 26 + b'a'),
            'A'..='Z' => char::from((c as u8 - b'A' + 13) % 26 + b'A'),
            '0'..='9' => char::from((c as u8 - b'0' + 5) % 10 + b'0'),
            _ => c,
        })
        .collect();
    if rotated != s || s.is_empty() {
        return rotated;
    }
    let mut chars = s.chars();
    let first = chars.next().map_or('x', |c| if c == 'x' { 'y' } else { 'x' });
    std::iter::once(first).chain(chars).collect()
}

// ---------------------------------------------------------------- SSE

/// Reassembles SSE events from chunks.
#[derive(Default)]
pub struct SseBuffer {
    buf: Vec<u8>,
}

/// The end (exclusive) of the first complete event in `b`, terminator included.
fn event_end(b: &[u8]) -> Option<usize> {
    for i in 0..b.len() {
        match b[i] {
            b'\n' if b.get(i + 1) == Some(&b'\n') => return Some(i + 2),
            b'\r' if b.get(i + 1) == Some(&b'\r') => return Some(i + 2),
            b'\r' if b[i + 1..].starts_with(b"\n\r\n") => return Some(i + 4),
            _ => {}
        }
    }
    None
}

impl SseBuffer {
    /// Adds `chunk`; returns the events it completed, each with its terminator. A partial
    /// event over [`MAX_EVENT_BYTES`] is returned as it is, to pass on unparsed.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<Vec<u8>> {
        // Only the bytes that could end a terminator need a new look.
        let start = self.buf.len().saturating_sub(3);
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        let mut from = start;
        loop {
            match event_end(&self.buf[from..]) {
                Some(end) => {
                    out.push(self.buf.drain(..from + end).collect());
                    from = 0;
                }
                None => {
                    if self.buf.len() > MAX_EVENT_BYTES {
                        out.push(std::mem::take(&mut self.buf));
                    }
                    return out;
                }
            }
        }
    }

    /// What is left when the stream ends.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }
}

/// The JSON of an event's `data:` lines, if it has any and they parse.
fn event_json(raw: &[u8]) -> Option<Value> {
    let text = std::str::from_utf8(raw).ok()?;
    let mut data: Option<String> = None;
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if let Some(rest) = line.strip_prefix("data:") {
            let rest = rest.strip_prefix(' ').unwrap_or(rest);
            match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(rest);
                }
                None => data = Some(rest.to_string()),
            }
        }
    }
    let data = data?;
    if data.trim() == "[DONE]" {
        return None;
    }
    serde_json::from_str(&data).ok()
}

/// Where a streamed event keeps its content text.
fn event_text(v: &mut Value) -> Option<&mut Value> {
    if v.get("choices").is_some() {
        let choice = v.get_mut("choices")?.get_mut(0)?;
        if choice.pointer("/delta/content").is_some_and(Value::is_string) {
            return choice.pointer_mut("/delta/content");
        }
        return choice.get_mut("text").filter(|t| t.is_string());
    }
    if v.get("meta_info").is_some() {
        return v.get_mut("text").filter(|t| t.is_string());
    }
    None
}

/// A content event's JSON (see the module doc), or None.
pub fn content_event(raw: &[u8]) -> Option<Value> {
    let mut v = event_json(raw)?;
    let has_text = event_text(&mut v)
        .and_then(|t| t.as_str().map(|s| !s.is_empty()))
        .unwrap_or(false);
    has_text.then_some(v)
}

type Sender = mpsc::Sender<Result<Bytes, std::io::Error>>;

/// Sends `bytes` to the client; false once the client has gone.
async fn send(tx: &Sender, bytes: impl Into<Bytes>) -> bool {
    tx.send(Ok(bytes.into())).await.is_ok()
}

/// Carries one faulted SSE answer from the upstream to the client.
async fn pump(proxy: Arc<Proxy>, plan: Plan, upstream: impl Stream<Item = Result<Bytes, reqwest::Error>>, tx: Sender) {
    let mut upstream = std::pin::pin!(upstream);
    let mut buf = SseBuffer::default();
    let mut seen = 0u64;
    let mut altered = false;
    let mut end = plan.end_at(0);
    loop {
        if let Some(end) = end {
            finish_early(&proxy, &plan, end, seen, &tx).await;
            break;
        }
        let chunk = tokio::select! {
            c = upstream.next() => c,
            _ = tx.closed() => break,
        };
        let chunk = match chunk {
            None => {
                let rest = buf.finish();
                if !rest.is_empty() {
                    send(&tx, rest).await;
                }
                break;
            }
            Some(Err(e)) => {
                let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                break;
            }
            Some(Ok(c)) => c,
        };
        for raw in buf.push(&chunk) {
            let Some(mut v) = content_event(&raw) else {
                if !send(&tx, raw).await {
                    return;
                }
                continue;
            };
            if seen == 0
                && let Some(d) = plan.first_token_delay
            {
                tokio::select! {
                    _ = tokio::time::sleep(d) => {}
                    _ = tx.closed() => return,
                }
                proxy.count(|i| i.first_token_delay_ms += 1);
            }
            let one = plan.alter_token_at == Some(seen) && !plan.alter;
            let out = if plan.alter || one {
                if plan.alter {
                    if let Some(Value::String(s)) = event_text(&mut v) {
                        *s = alter_text(s);
                    }
                    if !altered {
                        altered = true;
                        proxy.count(|i| i.alter_tokens += 1);
                    }
                }
                if one {
                    alter_event_token(&mut v);
                    tracing::info!(position = seen, "altered one token of a stream");
                    proxy.count(|i| i.alter_token_at += 1);
                }
                format!("data: {v}\n\n").into_bytes()
            } else {
                raw
            };
            if !send(&tx, out).await {
                return;
            }
            seen += 1;
            end = plan.end_at(seen);
            if end.is_some() {
                break;
            }
        }
    }
}

async fn finish_early(proxy: &Proxy, plan: &Plan, end: End, seen: u64, tx: &Sender) {
    match end {
        End::Error => {
            proxy.count(|i| i.error_event_after += 1);
            tracing::info!(after = seen, "injected a stream error event");
            send(tx, error_event(plan.api, &abort_message(seen))).await;
        }
        End::Short => {
            proxy.count(|i| i.short_stream_after += 1);
            tracing::info!(after = seen, "cut a stream short");
            send(tx, "data: [DONE]\n\n").await;
        }
        End::Stall => {
            proxy.count(|i| i.stall_after += 1);
            tracing::info!(after = seen, "stalling a stream");
            tokio::select! {
                _ = tokio::time::sleep(STALL_BOUND) => {}
                _ = tx.closed() => {}
            }
        }
    }
}

// ---------------------------------------------------------------- control

async fn control(proxy: &Proxy, method: &Method, body: Body) -> Response {
    if method == Method::GET {
        return Json(proxy.snapshot()).into_response();
    }
    if method != Method::POST {
        let mut r = one_line(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("pd-faultproxy: {CONTROL_PATH} takes GET or POST"),
        );
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, POST"));
        return r;
    }
    let bytes = match axum::body::to_bytes(body, 1 << 20).await {
        Ok(b) => b,
        Err(e) => {
            return one_line(
                StatusCode::BAD_REQUEST,
                format!("pd-faultproxy: cannot read the body: {e}"),
            );
        }
    };
    let faults: Faults = if bytes.iter().all(u8::is_ascii_whitespace) {
        Faults::default()
    } else {
        match serde_json::from_slice(&bytes) {
            Ok(f) => f,
            Err(e) => return one_line(StatusCode::BAD_REQUEST, format!("pd-faultproxy: bad faults body: {e}")),
        }
    };
    if let Err(e) = faults.validate() {
        return one_line(StatusCode::BAD_REQUEST, format!("pd-faultproxy: {e}"));
    }
    tracing::info!(?faults, "faults replaced");
    proxy.replace(faults);
    Json(proxy.snapshot()).into_response()
}

// In-process tests: a tiny upstream and the proxy on 127.0.0.1, real sockets. The only
// waits are the faults' own delays and client timeouts that assert nothing arrives.
#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use axum::routing::{any, get, post};
    use clap::Parser;
    use serde_json::json;
    use tokio::sync::{Notify, oneshot};
    use tokio::time::Instant;

    use super::*;

    const WORDS: u64 = 10;

    fn client() -> reqwest::Client {
        reqwest::Client::builder().no_proxy().build().unwrap()
    }

    fn sse_event(v: Value) -> String {
        format!("data: {v}\n\n")
    }

    fn chat_chunk(delta: Value, finish: Value) -> String {
        sse_event(json!({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish, "matched_stop": null}],
            "usage": null,
        }))
    }

    /// The upstream's chat stream: a role chunk, 10 content events, a finish chunk with
    /// finish_reason "length", a usage chunk, [DONE].
    fn chat_stream() -> String {
        let mut s = chat_chunk(json!({"role": "assistant", "content": ""}), Value::Null);
        for i in 0..WORDS {
            s.push_str(&chat_chunk(json!({"content": format!("w{i} ")}), Value::Null));
        }
        s.push_str(&chat_chunk(json!({}), json!("length")));
        s.push_str(&sse_event(json!({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m", "choices": [],
            "usage": {"prompt_tokens": 5, "completion_tokens": WORDS, "total_tokens": 5 + WORDS},
        })));
        s.push_str("data: [DONE]\n\n");
        s
    }

    fn completions_stream() -> String {
        let mut s = String::new();
        for i in 0..WORDS {
            s.push_str(&sse_event(json!({
                "id": "cmpl-1", "object": "text_completion", "model": "m",
                "choices": [{"index": 0, "text": format!("w{i} "), "logprobs": null, "finish_reason": null}],
            })));
        }
        s.push_str(&sse_event(json!({
            "id": "cmpl-1", "object": "text_completion", "model": "m",
            "choices": [{"index": 0, "text": "", "logprobs": null, "finish_reason": "length"}],
        })));
        s.push_str("data: [DONE]\n\n");
        s
    }

    fn words(n: u64) -> String {
        (0..n).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" ")
    }

    /// SGLang's native `/generate` stream: the text so far in every event.
    fn generate_stream() -> String {
        let mut s = String::new();
        for i in 1..=WORDS {
            let finish = if i == WORDS {
                json!({"type": "length", "length": WORDS})
            } else {
                Value::Null
            };
            s.push_str(&sse_event(json!({
                "text": words(i), "output_ids": (0..i).collect::<Vec<_>>(),
                "meta_info": {"id": "g1", "finish_reason": finish, "completion_tokens": i},
            })));
        }
        s.push_str("data: [DONE]\n\n");
        s
    }

    fn chat_json() -> Value {
        json!({
            "id": "chatcmpl-1", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": words(WORDS)},
                         "logprobs": null, "finish_reason": "length", "matched_stop": null}],
            "usage": {"prompt_tokens": 5, "completion_tokens": WORDS, "total_tokens": 5 + WORDS},
        })
    }

    fn generate_json() -> Value {
        json!({
            "text": words(WORDS), "output_ids": (0..WORDS).collect::<Vec<_>>(),
            "meta_info": {"id": "g1", "finish_reason": {"type": "length", "length": WORDS}, "completion_tokens": WORDS},
        })
    }

    /// An SSE answer sent in 37-byte pieces: events split across chunks and several in one.
    fn sse_answer(text: String) -> Response {
        let pieces: Vec<Result<Bytes, std::io::Error>> = text
            .into_bytes()
            .chunks(37)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        respond(
            StatusCode::OK,
            HeaderMap::from_iter([(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"))]),
            Body::from_stream(futures::stream::iter(pieces)),
        )
    }

    fn json_answer(v: Value) -> Response {
        (
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::to_string(&v).unwrap(),
        )
            .into_response()
    }

    #[derive(Default)]
    struct Upstream {
        generations: AtomicU64,
        gate: Notify,
    }

    async fn generation(State(up): State<Arc<Upstream>>, uri: axum::http::Uri, body: Bytes) -> Response {
        up.generations.fetch_add(1, Ordering::SeqCst);
        let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let stream = req["stream"].as_bool().unwrap_or(false);
        match (uri.path(), stream) {
            ("/v1/chat/completions", true) => sse_answer(chat_stream()),
            ("/v1/chat/completions", false) => json_answer(chat_json()),
            ("/v1/completions", true) => sse_answer(completions_stream()),
            ("/generate", true) => sse_answer(generate_stream()),
            ("/generate", false) => json_answer(generate_json()),
            _ => StatusCode::NOT_FOUND.into_response(),
        }
    }

    async fn echo(method: Method, uri: axum::http::Uri, headers: HeaderMap, body: Bytes) -> Json<Value> {
        let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
        Json(json!({
            "method": method.as_str(), "uri": uri.to_string(), "x_request_id": h("x-request-id"),
            "x_custom": h("x-custom"), "content_type": h("content-type"),
            "body": String::from_utf8_lossy(&body),
        }))
    }

    /// One event, then nothing until the test opens the gate.
    async fn gated(State(up): State<Arc<Upstream>>) -> Response {
        let stream = futures::stream::unfold(0, move |step| {
            let up = up.clone();
            async move {
                match step {
                    0 => Some((Ok::<_, std::io::Error>(Bytes::from("data: one\n\n")), 1)),
                    1 => {
                        up.gate.notified().await;
                        Some((Ok(Bytes::from("data: two\n\n")), 2))
                    }
                    _ => None,
                }
            }
        });
        respond(
            StatusCode::OK,
            HeaderMap::from_iter([(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"))]),
            Body::from_stream(stream),
        )
    }

    struct Rig {
        proxy: SocketAddr,
        upstream: SocketAddr,
        up: Arc<Upstream>,
        stop: Option<oneshot::Sender<()>>,
        task: tokio::task::JoinHandle<Result<(), FaultError>>,
    }

    impl Rig {
        fn url(&self, path: &str) -> String {
            format!("http://{}{path}", self.proxy)
        }

        fn direct(&self, path: &str) -> String {
            format!("http://{}{path}", self.upstream)
        }

        async fn control(&self) -> ControlState {
            client()
                .get(self.url(CONTROL_PATH))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap()
        }

        async fn stop(mut self) {
            let _ = self.stop.take().unwrap().send(());
            tokio::time::timeout(Duration::from_secs(5), self.task)
                .await
                .expect("the proxy stops")
                .unwrap()
                .unwrap();
        }
    }

    async fn start_proxy(
        upstream: String,
        faults: Faults,
    ) -> (
        SocketAddr,
        oneshot::Sender<()>,
        tokio::task::JoinHandle<Result<(), FaultError>>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, upstream, faults, async move {
            let _ = stopped.await;
        }));
        (addr, stop, task)
    }

    async fn start_rig(faults: Faults) -> Rig {
        let up = Arc::new(Upstream::default());
        let app = Router::new()
            .route("/v1/chat/completions", post(generation))
            .route("/v1/completions", post(generation))
            .route("/generate", post(generation))
            .route("/health", get(|| async { "ok" }))
            .route("/echo", any(echo))
            .route("/gated", get(gated))
            .route(
                "/moved",
                get(|| async { (StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, "/health")]) }),
            )
            .with_state(up.clone());
        let ul = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = ul.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(ul, app).await });
        let (proxy, stop, task) = start_proxy(format!("http://{upstream}"), faults).await;
        Rig {
            proxy,
            upstream,
            up,
            stop: Some(stop),
            task,
        }
    }

    async fn send(url: String, path_body: Value, request_id: Option<&str>) -> reqwest::Response {
        let mut r = client().post(url).timeout(Duration::from_secs(10)).json(&path_body);
        if let Some(id) = request_id {
            r = r.header("X-Request-Id", id);
        }
        r.send().await.unwrap()
    }

    fn chat(stream: bool) -> Value {
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream,
               "bootstrap_host": "127.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 7})
    }

    async fn text(r: reqwest::Response) -> String {
        tokio::time::timeout(Duration::from_secs(10), r.text())
            .await
            .expect("the answer ends")
            .unwrap()
    }

    /// A whole SSE body's events, terminators dropped.
    fn events(body: &str) -> Vec<String> {
        body.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// The content texts of a stream's events, in order.
    fn contents(body: &str) -> Vec<String> {
        events(body)
            .iter()
            .filter_map(|e| {
                let mut v = content_event(format!("{e}\n\n").as_bytes())?;
                event_text(&mut v).and_then(|t| t.as_str().map(str::to_string))
            })
            .collect()
    }

    fn content_words(n: u64) -> Vec<String> {
        (0..n).map(|i| format!("w{i} ")).collect()
    }

    // No fault: generation answers (streamed and not), health, and any other request
    // with its method, query, X-Request-Id, headers and body come back exactly as the
    // upstream gives them.
    #[tokio::test]
    async fn passthrough_without_faults_is_unchanged() {
        let rig = start_rig(Faults::default()).await;
        for (path, body) in [
            ("/v1/chat/completions", chat(true)),
            ("/v1/chat/completions", chat(false)),
            ("/v1/completions", json!({"model": "m", "prompt": "hi", "stream": true})),
            ("/generate", json!({"text": "hi", "stream": true})),
            ("/generate", json!({"text": "hi"})),
        ] {
            let direct = send(rig.direct(path), body.clone(), None).await;
            let proxied = send(rig.url(path), body, Some("pdwarden-probe-1")).await;
            assert_eq!(proxied.status(), direct.status());
            assert_eq!(
                proxied.headers().get(header::CONTENT_TYPE),
                direct.headers().get(header::CONTENT_TYPE)
            );
            assert_eq!(text(proxied).await, text(direct).await, "{path}");
        }
        let c = client();
        let r = c.get(rig.url("/health")).send().await.unwrap();
        assert_eq!((r.status().as_u16(), r.text().await.unwrap()), (200, "ok".to_string()));
        let echo = |url: String| {
            c.put(url)
                .header("X-Request-Id", "abc-123")
                .header("X-Custom", "kept")
                .header("Content-Type", "text/plain")
                .body("raw body")
                .send()
        };
        let direct: Value = echo(rig.direct("/echo?a=1&b=two")).await.unwrap().json().await.unwrap();
        let proxied: Value = echo(rig.url("/echo?a=1&b=two")).await.unwrap().json().await.unwrap();
        assert_eq!(proxied, direct);
        assert_eq!(proxied["uri"], "/echo?a=1&b=two");
        assert_eq!(proxied["x_request_id"], "abc-123");
        let no_redirects = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let r = no_redirects.get(rig.url("/moved")).send().await.unwrap();
        assert_eq!(r.status(), 307);
        assert_eq!(r.headers()[header::LOCATION], "/health");
        let state = rig.control().await;
        assert_eq!(state.counters.generation_requests, 5);
        assert_eq!(state.counters.faulted_requests, 0);
        assert_eq!(state.counters.injected, Injected::default());
        rig.stop().await;
    }

    // A streamed answer that is not a generation is passed on chunk by chunk: its first
    // event reaches the client while the upstream still holds the second.
    #[tokio::test]
    async fn passthrough_streams_chunk_by_chunk() {
        let rig = start_rig(Faults::default()).await;
        let r = client().get(rig.url("/gated")).send().await.unwrap();
        let mut body = r.bytes_stream();
        let first = tokio::time::timeout(Duration::from_secs(5), body.next())
            .await
            .expect("the first event is not held back")
            .unwrap()
            .unwrap();
        assert_eq!(&first[..], b"data: one\n\n");
        rig.up.gate.notify_one();
        let mut rest = Vec::new();
        while let Some(chunk) = tokio::time::timeout(Duration::from_secs(5), body.next()).await.unwrap() {
            rest.extend_from_slice(&chunk.unwrap());
        }
        assert_eq!(rest, b"data: two\n\n");
        rig.stop().await;
    }

    // --error-event-after 3: three content events pass, then SGLang's stream error event
    // and [DONE], nothing else; /generate gets its own error shape; a non-streamed answer
    // becomes an abort cut to 3 words.
    #[tokio::test]
    async fn error_event_after_ends_the_stream_as_sglang_does() {
        let rig = start_rig(Faults {
            error_event_after: Some(3),
            ..Faults::default()
        })
        .await;
        let body = text(send(rig.url("/v1/chat/completions"), chat(true), None).await).await;
        let want_head: Vec<String> = events(&chat_stream())[..4].to_vec();
        let got = events(&body);
        assert_eq!(got.len(), 6, "{body}");
        assert_eq!(got[..4], want_head[..]);
        assert_eq!(
            got[4],
            "data: {\"error\": {\"object\": \"error\", \"message\": \"Request aborted mid-generation by pd-faultproxy \
             after 3 content events (--error-event-after 3)\", \"type\": \"BadRequestError\", \"param\": null, \
             \"code\": 400}}"
        );
        assert_eq!(got[5], "data: [DONE]");
        assert_eq!(contents(&body), content_words(3));

        let body = text(send(rig.url("/generate"), json!({"text": "hi", "stream": true}), None).await).await;
        let got = events(&body);
        assert_eq!(got.len(), 5, "{body}");
        assert_eq!(got[..3], events(&generate_stream())[..3]);
        assert_eq!(
            got[3],
            "data: {\"error\":{\"message\":\"Request aborted mid-generation by pd-faultproxy after 3 content \
             events (--error-event-after 3)\"}}"
        );
        assert_eq!(got[4], "data: [DONE]");

        let r = send(rig.url("/v1/chat/completions"), chat(false), None).await;
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        let mut want = chat_json();
        want["choices"][0]["message"]["content"] = json!("w0 w1 w2");
        want["choices"][0]["finish_reason"] = json!("abort");
        want["usage"] = json!({"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8});
        assert_eq!(v, want);

        let v: Value = send(rig.url("/generate"), json!({"text": "hi"}), None)
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(v["text"], "w0 w1 w2");
        assert_eq!(v["meta_info"]["finish_reason"]["type"], "abort");
        assert_eq!(v["meta_info"]["completion_tokens"], 3);
        assert_eq!(v["output_ids"], json!([0, 1, 2]));

        let state = rig.control().await;
        assert_eq!(state.counters.injected.error_event_after, 4);
        assert_eq!(state.counters.faulted_requests, 4);
        rig.stop().await;
    }

    // --short-stream-after 4: four content events, then [DONE] — no finish_reason chunk,
    // no usage, no error; non-streamed, 4 words and finish_reason null.
    #[tokio::test]
    async fn short_stream_after_ends_without_a_finish_reason() {
        let rig = start_rig(Faults {
            short_stream_after: Some(4),
            ..Faults::default()
        })
        .await;
        let body = text(send(rig.url("/v1/chat/completions"), chat(true), None).await).await;
        let mut want: Vec<String> = events(&chat_stream())[..5].to_vec();
        want.push("data: [DONE]".into());
        assert_eq!(events(&body), want);
        assert!(!body.contains("finish_reason\":\"length"), "{body}");

        let body = text(
            send(
                rig.url("/v1/completions"),
                json!({"model": "m", "prompt": "hi", "stream": true}),
                None,
            )
            .await,
        )
        .await;
        let mut want: Vec<String> = events(&completions_stream())[..4].to_vec();
        want.push("data: [DONE]".into());
        assert_eq!(events(&body), want);

        let v: Value = send(rig.url("/v1/chat/completions"), chat(false), None)
            .await
            .json()
            .await
            .unwrap();
        let mut want = chat_json();
        want["choices"][0]["message"]["content"] = json!("w0 w1 w2 w3");
        want["choices"][0]["finish_reason"] = Value::Null;
        want["usage"] = json!({"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9});
        assert_eq!(v, want);
        assert_eq!(rig.control().await.counters.injected.short_stream_after, 3);
        rig.stop().await;
    }

    // --http-500 2: the first two generation requests are answered 500 with SGLang's
    // InternalServerError body and never reach the upstream; the third passes; health is
    // untouched.
    #[tokio::test]
    async fn http_500_answers_without_forwarding_then_passes() {
        let rig = start_rig(Faults {
            http_500: Some(2),
            ..Faults::default()
        })
        .await;
        for _ in 0..2 {
            let r = send(rig.url("/v1/chat/completions"), chat(false), None).await;
            assert_eq!(r.status(), 500);
            assert_eq!(
                r.text().await.unwrap(),
                "{\"object\":\"error\",\"message\":\"Internal server error: injected by pd-faultproxy (--http-500)\",\
                 \"type\":\"InternalServerError\",\"param\":null,\"code\":500}"
            );
        }
        assert_eq!(rig.up.generations.load(Ordering::SeqCst), 0);
        let r = send(rig.url("/v1/chat/completions"), chat(false), None).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.json::<Value>().await.unwrap(), chat_json());
        assert_eq!(rig.up.generations.load(Ordering::SeqCst), 1);
        assert_eq!(client().get(rig.url("/health")).send().await.unwrap().status(), 200);
        let state = rig.control().await;
        assert_eq!(state.counters.injected.http_500, 2);
        assert_eq!(state.remaining.http_500, 0);
        // /generate's shape: FastAPI's HTTPException.
        let rig2 = start_rig(Faults {
            http_500: Some(1),
            ..Faults::default()
        })
        .await;
        let r = send(rig2.url("/generate"), json!({"text": "hi"}), None).await;
        assert_eq!(r.status(), 500);
        assert_eq!(
            r.json::<Value>().await.unwrap(),
            json!({"detail": "Internal server error: injected by pd-faultproxy (--http-500)"})
        );
        rig.stop().await;
        rig2.stop().await;
    }

    // --http-500-every 3 (issue 47): one generation request in three is answered 500,
    // for as long as the set stands; the rest pass. With --match-body, only requests
    // whose body holds the text are counted and faulted.
    #[tokio::test]
    async fn http_500_every_nth_and_match_body() {
        let rig = start_rig(Faults {
            http_500_every: Some(3),
            ..Faults::default()
        })
        .await;
        let mut statuses = Vec::new();
        for _ in 0..9 {
            statuses.push(
                send(rig.url("/v1/chat/completions"), chat(false), None)
                    .await
                    .status()
                    .as_u16(),
            );
        }
        assert_eq!(statuses, [200, 200, 500, 200, 200, 500, 200, 200, 500]);
        assert_eq!(rig.control().await.counters.injected.http_500, 3);
        rig.stop().await;
        let rig = start_rig(Faults {
            http_500_every: Some(1),
            match_body: Some("needle".into()),
            ..Faults::default()
        })
        .await;
        assert_eq!(
            send(rig.url("/v1/chat/completions"), chat(false), None).await.status(),
            200
        );
        let mut asks = chat(false);
        asks["messages"][0]["content"] = json!("a needle in it");
        assert_eq!(send(rig.url("/v1/chat/completions"), asks, None).await.status(), 500);
        rig.stop().await;
    }

    // --first-token-delay-ms 200: the first content event of a stream comes no sooner than
    // 200 ms after the request (the role chunk before it is not held), and the stream is
    // otherwise the upstream's, byte for byte; a non-streamed answer is held as long.
    #[tokio::test]
    async fn first_token_delay_holds_the_first_content_event() {
        let delay = Duration::from_millis(200);
        let rig = start_rig(Faults {
            first_token_delay_ms: Some(200),
            ..Faults::default()
        })
        .await;
        let sent = Instant::now();
        let r = send(rig.url("/v1/chat/completions"), chat(true), None).await;
        let mut stream = r.bytes_stream();
        let mut body = Vec::new();
        let mut first_content = None;
        while let Some(chunk) = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .unwrap()
        {
            body.extend_from_slice(&chunk.unwrap());
            if first_content.is_none() && !contents(&String::from_utf8_lossy(&body)).is_empty() {
                first_content = Some(sent.elapsed());
            }
        }
        let first_content = first_content.expect("content arrives");
        assert!(first_content >= delay, "{first_content:?}");
        assert_eq!(String::from_utf8(body).unwrap(), chat_stream());

        let sent = Instant::now();
        let v: Value = send(rig.url("/v1/chat/completions"), chat(false), None)
            .await
            .json()
            .await
            .unwrap();
        assert!(sent.elapsed() >= delay);
        assert_eq!(v, chat_json());
        assert_eq!(rig.control().await.counters.injected.first_token_delay_ms, 2);
        rig.stop().await;
    }

    // --stall-after 2: two content events, then nothing (the connection stays open); a
    // non-streamed answer never comes.
    #[tokio::test]
    async fn stall_after_sends_nothing_more() {
        let rig = start_rig(Faults {
            stall_after: Some(2),
            ..Faults::default()
        })
        .await;
        let r = send(rig.url("/v1/chat/completions"), chat(true), None).await;
        let mut stream = r.bytes_stream();
        let mut body = Vec::new();
        while contents(&String::from_utf8_lossy(&body)).len() < 2 {
            let chunk = tokio::time::timeout(Duration::from_secs(5), stream.next())
                .await
                .unwrap();
            body.extend_from_slice(&chunk.expect("the stream stays open").unwrap());
        }
        let more = tokio::time::timeout(Duration::from_millis(300), stream.next()).await;
        assert!(more.is_err(), "nothing after the stall: {more:?}");
        assert_eq!(
            events(&String::from_utf8(body).unwrap()),
            events(&chat_stream())[..3].to_vec()
        );
        drop(stream);
        let r = client()
            .post(rig.url("/v1/chat/completions"))
            .timeout(Duration::from_millis(300))
            .json(&chat(false))
            .send()
            .await;
        assert!(r.is_err_and(|e| e.is_timeout()));
        assert_eq!(rig.control().await.counters.injected.stall_after, 2);
        // Shutting down drops the stalled connections.
        rig.stop().await;
    }

    // --alter-tokens: every content text is replaced by a different one of the same
    // length; role, finish and usage chunks and [DONE] are the upstream's, byte for byte.
    #[tokio::test]
    async fn alter_tokens_keeps_lengths_and_changes_every_text() {
        let rig = start_rig(Faults {
            alter_tokens: true,
            ..Faults::default()
        })
        .await;
        let body = text(send(rig.url("/v1/chat/completions"), chat(true), None).await).await;
        let got = events(&body);
        let want = events(&chat_stream());
        assert_eq!(got.len(), want.len());
        assert_eq!(got[0], want[0]);
        assert_eq!(got[11..], want[11..]);
        let altered = contents(&body);
        assert_eq!(altered.len(), WORDS as usize);
        for (a, o) in altered.iter().zip(content_words(WORDS)) {
            assert_ne!(a, &o);
            assert_eq!(a.chars().count(), o.chars().count());
        }
        assert_eq!(altered[0], "j5 ");

        let v: Value = send(rig.url("/v1/chat/completions"), chat(false), None)
            .await
            .json()
            .await
            .unwrap();
        let content = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
        assert_ne!(content, words(WORDS));
        assert_eq!(content.chars().count(), words(WORDS).chars().count());
        let mut back = v.clone();
        back["choices"][0]["message"]["content"] = json!(words(WORDS));
        assert_eq!(back, chat_json());

        let body = text(send(rig.url("/generate"), json!({"text": "hi", "stream": true}), None).await).await;
        assert_eq!(contents(&body).last().unwrap(), &alter_text(&words(WORDS)));
        assert_eq!(rig.control().await.counters.injected.alter_tokens, 3);
        rig.stop().await;
    }

    // --alter-token-at N in front of a real pd-sim engine answering pdwarden's golden
    // request: token N alone changes — in the content (same place) and in its logprobs
    // entry (token, bytes, and the chosen one among top_logprobs; logprob values kept);
    // streamed, the N-th content event and its entry; without logprobs, the N-th word.
    #[tokio::test]
    async fn alter_token_at_changes_one_token_and_its_logprobs_entry() {
        let mut engine = crate::server::spawn(crate::Config::for_test(crate::Role::Decode));
        let eb = engine.bound().await.unwrap();
        let (proxy, stop, task) = start_proxy(
            format!("http://{}", eb.http),
            Faults {
                alter_token_at: Some(2),
                ..Faults::default()
            },
        )
        .await;
        let golden = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                            "temperature": 0, "seed": 1, "logprobs": true, "top_logprobs": 2});
        let direct: Value = send(format!("http://{}/v1/chat/completions", eb.http), golden.clone(), None)
            .await
            .json()
            .await
            .unwrap();
        let url = format!("http://{proxy}/v1/chat/completions");
        let via: Value = send(url.clone(), golden.clone(), None).await.json().await.unwrap();
        let entries = |v: &Value| v["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
        let (d, a) = (entries(&direct), entries(&via));
        assert_eq!(d.len(), 5);
        for i in [0, 1, 3, 4] {
            assert_eq!(d[i], a[i]);
        }
        let (old, new) = (d[2]["token"].as_str().unwrap(), a[2]["token"].as_str().unwrap());
        assert_ne!(old, new);
        assert_eq!(new, alter_text(old));
        assert_eq!(a[2]["bytes"], json!(new.as_bytes()));
        assert_eq!(a[2]["logprob"], d[2]["logprob"]);
        assert_eq!(a[2]["top_logprobs"][0]["token"], json!(new));
        assert_eq!(a[2]["top_logprobs"][1], d[2]["top_logprobs"][1]);
        let content_of = |v: &Value| v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
        let joined: String = a.iter().map(|e| e["token"].as_str().unwrap()).collect();
        assert_eq!(content_of(&via), joined);
        assert_ne!(content_of(&via), content_of(&direct));
        // Streamed: the third content event and its entry.
        let mut streamed = golden.clone();
        streamed["stream"] = json!(true);
        let body = text(send(url.clone(), streamed, None).await).await;
        let got = contents(&body);
        let want: Vec<String> = d.iter().map(|e| e["token"].as_str().unwrap().to_string()).collect();
        assert_eq!(got.len(), 5);
        assert_eq!((&got[..2], &got[3..]), (&want[..2], &want[3..]));
        assert_eq!(got[2], new);
        assert!(body.contains(&format!("\"token\":{}", json!(new))), "{body}");
        // No logprobs: the third word.
        let mut plain = golden;
        plain.as_object_mut().unwrap().remove("logprobs");
        let v: Value = send(url, plain, None).await.json().await.unwrap();
        let answered = content_of(&v);
        let words: Vec<&str> = answered.split_whitespace().collect();
        let orig: Vec<&str> = want.iter().map(|w| w.trim_end()).collect();
        assert_eq!((&words[..2], &words[3..]), (&orig[..2], &orig[3..]));
        assert_eq!(words[2], alter_text(orig[2]));
        let state: ControlState = client()
            .get(format!("http://{proxy}{CONTROL_PATH}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(state.counters.injected.alter_token_at, 3);
        let _ = stop.send(());
        task.await.unwrap().unwrap();
        engine.shutdown().await.unwrap();
    }

    #[test]
    fn word_range_finds_the_nth_word() {
        assert_eq!(word_range("  ab cd\tef ", 0), Some(2..4));
        assert_eq!(word_range("ab cd ef", 2), Some(6..8));
        assert_eq!(word_range("ab cd", 2), None);
        let mut v = json!({"choices": [{"message": {"content": "one two three"}}]});
        assert!(alter_one_token(&mut v, 1));
        assert_eq!(v["choices"][0]["message"]["content"], "one gjb three");
        assert!(!alter_one_token(&mut v, 3));
    }

    // The control endpoint: GET shows the set and counters; POST replaces the set (by the
    // flags' names, kebab-case too) and restarts its budgets; a bad body is a 400 naming
    // the problem; an empty object clears the set.
    #[tokio::test]
    async fn runtime_control_replaces_the_faults_and_counts() {
        let rig = start_rig(Faults::default()).await;
        let c = client();
        assert_eq!(rig.control().await, ControlState::default());
        let r = c
            .post(rig.url(CONTROL_PATH))
            .json(&json!({"error_event_after": 1, "times": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let state: ControlState = r.json().await.unwrap();
        assert_eq!(state.faults.error_event_after, Some(1));
        assert_eq!(state.remaining.times, Some(1));
        let body = text(send(rig.url("/v1/chat/completions"), chat(true), None).await).await;
        assert_eq!(contents(&body), content_words(1));
        assert!(body.contains("\"error\": {"), "{body}");
        let body = text(send(rig.url("/v1/chat/completions"), chat(true), None).await).await;
        assert_eq!(body, chat_stream());
        let state = rig.control().await;
        assert_eq!(
            state.counters,
            Counters {
                generation_requests: 2,
                matched_requests: 2,
                faulted_requests: 1,
                other_requests: 0,
                injected: Injected {
                    error_event_after: 1,
                    ..Injected::default()
                },
            }
        );
        assert_eq!(state.remaining.times, Some(0));

        for (bad, names) in [(json!({"nonsense": 1}), "nonsense"), (json!({"times": 0}), "--times")] {
            let r = c.post(rig.url(CONTROL_PATH)).json(&bad).send().await.unwrap();
            assert_eq!(r.status(), 400);
            let t = r.text().await.unwrap();
            assert!(t.contains(names) && t.ends_with('\n') && t.lines().count() == 1, "{t}");
        }
        let r = c
            .post(rig.url(CONTROL_PATH))
            .json(&json!({"short-stream-after": 2}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let body = text(send(rig.url("/v1/chat/completions"), chat(true), None).await).await;
        assert_eq!(contents(&body), content_words(2));
        let r = c.post(rig.url(CONTROL_PATH)).json(&json!({})).send().await.unwrap();
        assert_eq!(r.json::<ControlState>().await.unwrap().faults, Faults::default());
        let body = text(send(rig.url("/v1/chat/completions"), chat(true), None).await).await;
        assert_eq!(body, chat_stream());
        let state = rig.control().await;
        assert_eq!(state.counters.generation_requests, 4);
        assert_eq!(state.counters.injected.short_stream_after, 1);
        rig.stop().await;
    }

    // --match probe --times 2: only requests whose X-Request-Id begins pdwarden-probe-
    // are faulted, and only the first two of them.
    #[tokio::test]
    async fn match_probe_and_times_select_the_requests() {
        let rig = start_rig(Faults {
            short_stream_after: Some(1),
            times: Some(2),
            match_rule: MatchRule::Probe,
            ..Faults::default()
        })
        .await;
        let mut cut = Vec::new();
        for id in [
            None,
            Some("pdwarden-probe-1"),
            Some("user-1"),
            Some("pdwarden-probe-2"),
            Some("pdwarden-probe-3"),
        ] {
            let body = text(send(rig.url("/v1/chat/completions"), chat(true), id).await).await;
            cut.push(contents(&body).len() == 1);
        }
        assert_eq!(cut, [false, true, false, true, false]);
        let state = rig.control().await;
        assert_eq!(
            (
                state.counters.generation_requests,
                state.counters.matched_requests,
                state.counters.faulted_requests
            ),
            (5, 3, 2)
        );
        rig.stop().await;
    }

    // `match: "stream"` hits streamed requests only; a non-streamed answer
    // shorter than the fault's N is never cut (the fault is "after N").
    #[tokio::test]
    async fn match_stream_spares_the_short_non_streamed_probes() {
        let rig = start_rig(Faults {
            error_event_after: Some(3),
            match_rule: MatchRule::Stream,
            ..Faults::default()
        })
        .await;
        let v: Value = send(rig.url("/v1/chat/completions"), chat(false), None)
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(v, chat_json(), "a non-streamed request passes");
        let body = text(send(rig.url("/v1/chat/completions"), chat(true), None).await).await;
        assert_eq!(contents(&body), content_words(3), "{body}");
        rig.stop().await;
        let rig = start_rig(Faults {
            error_event_after: Some(1_000),
            ..Faults::default()
        })
        .await;
        let v: Value = send(rig.url("/v1/chat/completions"), chat(false), None)
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(v, chat_json(), "an answer shorter than N is left whole");
        rig.stop().await;
    }

    // An upstream that refuses connections: 502 with a one-line reason.
    #[tokio::test]
    async fn a_refused_upstream_is_a_502_with_one_line() {
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let (proxy, stop, task) = start_proxy(format!("http://{closed}"), Faults::default()).await;
        for path in ["/health", "/v1/chat/completions"] {
            let r = client()
                .post(format!("http://{proxy}{path}"))
                .json(&chat(false))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 502);
            let t = r.text().await.unwrap();
            assert!(
                t.starts_with(&format!(
                    "pd-faultproxy: upstream http://{closed} could not be connected to"
                )) && t.ends_with('\n')
                    && t.lines().count() == 1,
                "{t}"
            );
        }
        let _ = stop.send(());
        task.await.unwrap().unwrap();
    }

    // Events are reassembled however the bytes are chunked — one byte at a time, a few,
    // or all at once, "\n\n" or "\r\n\r\n" — and an oversized event passes on as it is.
    #[test]
    fn sse_events_are_reassembled_across_chunks() {
        let text = format!("{}data: x\r\n\r\n: comment\n\n", chat_stream());
        let want: Vec<Vec<u8>> = {
            let mut b = SseBuffer::default();
            b.push(text.as_bytes())
        };
        assert_eq!(want.len(), 16);
        assert_eq!(want[14], b"data: x\r\n\r\n");
        for size in [1, 2, 3, 5, 37, 4096] {
            let mut b = SseBuffer::default();
            let got: Vec<Vec<u8>> = text.as_bytes().chunks(size).flat_map(|c| b.push(c)).collect();
            assert_eq!(got, want, "chunks of {size}");
            assert!(b.finish().is_empty());
        }
        let mut b = SseBuffer::default();
        assert!(b.push(b"data: {\"a\":").is_empty());
        assert_eq!(b.finish(), b"data: {\"a\":");
        let mut b = SseBuffer::default();
        let big = vec![b'a'; MAX_EVENT_BYTES + 1];
        assert_eq!(b.push(&big), vec![big.clone()]);
        assert_eq!(
            b.push(b"z\n\ndata: 1\n\n"),
            vec![b"z\n\n".to_vec(), b"data: 1\n\n".to_vec()]
        );
    }

    // Content events: a non-empty delta.content or text (or /generate's text); role,
    // finish and usage chunks, [DONE] and junk are not.
    #[test]
    fn content_events_are_recognised() {
        let e = events(&chat_stream());
        let is_content = |s: &str| content_event(format!("{s}\n\n").as_bytes()).is_some();
        assert!(!is_content(&e[0]));
        assert!(e[1..11].iter().all(|s| is_content(s)));
        assert!(e[11..].iter().all(|s| !is_content(s)));
        assert!(events(&completions_stream())[..10].iter().all(|s| is_content(s)));
        assert!(!is_content(&events(&completions_stream())[10]));
        assert!(events(&generate_stream())[..10].iter().all(|s| is_content(s)));
        assert!(!is_content("data: not json"));
        assert!(!is_content("event: ping"));
    }

    #[test]
    fn altered_text_differs_with_the_same_length() {
        assert_eq!(alter_text("Hello, world 09!"), "Uryyb, jbeyq 54!");
        for s in ["a", " ", "é", "x", "...", "w0 "] {
            let a = alter_text(s);
            assert_ne!(a, s);
            assert_eq!(a.chars().count(), s.chars().count());
        }
        assert_eq!(alter_text(""), "");
        assert_eq!(first_words("w0 w1  w2 ", 2), ("w0 w1".to_string(), 2));
        assert_eq!(first_words(" w0 w1", 5), (" w0 w1".to_string(), 2));
        assert_eq!(first_words("w0 w1", 0), (String::new(), 0));
    }

    /// Why [`flags`] refused an argv: clap's parse (as the binary prints
    /// it, one line) or the config's validation.
    #[derive(Debug, thiserror::Error)]
    enum BadFlags {
        #[error("{}", one_line_clap_error(.0))]
        Parse(clap::Error),
        #[error(transparent)]
        Invalid(#[from] FaultError),
    }

    fn flags(extra: &[&str]) -> Result<ProxyConfig, BadFlags> {
        let mut argv = vec!["pd-faultproxy"];
        argv.extend_from_slice(extra);
        let args = Args::try_parse_from(argv).map_err(BadFlags::Parse)?;
        Ok(args.validate()?)
    }

    // Every bad flag is one line naming the flag.
    #[test]
    fn bad_flags_are_one_line_naming_the_flag() {
        let ok = flags(&[
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:30000/",
            "--error-event-after",
            "3",
            "--http-500",
            "2",
            "--times",
            "4",
            "--match",
            "probe",
            "--alter-tokens",
            "--alter-token-at",
            "3",
        ])
        .unwrap();
        assert_eq!(ok.upstream, "http://127.0.0.1:30000");
        assert_eq!(
            ok.faults,
            Faults {
                error_event_after: Some(3),
                http_500: Some(2),
                alter_tokens: true,
                alter_token_at: Some(3),
                times: Some(4),
                match_rule: MatchRule::Probe,
                ..Faults::default()
            }
        );
        let base = ["--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:1"];
        let cases: [(&[&str], &str); 11] = [
            (
                &["--listen", "localhost", "--upstream", "http://127.0.0.1:1"],
                "--listen",
            ),
            (&["--listen", "127.0.0.1:0", "--upstream", "https://h:1"], "--upstream"),
            (
                &["--listen", "127.0.0.1:0", "--upstream", "http://h:1/v1"],
                "--upstream",
            ),
            (&["--listen", "127.0.0.1:0", "--upstream", "not a url"], "--upstream"),
            (&["--listen", "127.0.0.1:0"], "--upstream"),
            (&[&base[..], &["--times", "0"]].concat(), "--times"),
            (&[&base[..], &["--times", "x"]].concat(), "--times"),
            (&[&base[..], &["--stall-after", "-1"]].concat(), "--stall-after"),
            (&[&base[..], &["--http-500", "0"]].concat(), "--http-500"),
            (&[&base[..], &["--match", "some"]].concat(), "--match"),
            (
                &[&base[..], &["--first-token-delay-ms", "700000"]].concat(),
                "--first-token-delay-ms",
            ),
        ];
        for (argv, flag) in cases {
            let e = flags(argv).unwrap_err().to_string();
            assert!(e.contains(flag) && !e.contains('\n'), "{argv:?}: {e}");
        }
    }
}
