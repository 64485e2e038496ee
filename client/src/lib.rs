//! The operator's side of the `Control` API: how to reach an orchestrator
//! (its URL, the CA, a client certificate, an operator token) and following
//! an operation's update stream to its report. The `pdwarden` CLI and its
//! local stack both use it, each with its own [`Connection`] value — there
//! is no process-wide credential (the demo once swapped a global one).

use std::path::PathBuf;
use std::time::Duration;

use pdwarden_proto::v1::{
    GatePairRequest, OperationStarted, RestartPairRequest, VerifyPairRequest, control_client::ControlClient,
    operation_update,
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use pdwarden_model::report::{
    OperationReport, ProbeRecord, StepRecord, TimelineRecord, live_phase_line, live_probe_line, live_step_line,
};

/// A failure to run at all (the CLI's exit 1), as opposed to a verdict.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CouldNotRun(pub String);

/// TLS files and the operator token this process presents.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub token: Option<String>,
}

/// Adds `authorization: Bearer TOKEN` to every request.
#[derive(Clone)]
pub struct Bearer(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

/// The largest reply the CLI reads (issue 32: a report of 8 MB made the
/// CLI lose the operation's stream and `history` fail for everyone; the
/// journal now bounds each report, and a history of them fits here).
pub const MAX_REPLY_BYTES: usize = 64 << 20;

/// How long connecting to an orchestrator may take, all of it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A connected `Control` client.
pub type Client = ControlClient<tonic::service::interceptor::InterceptedService<Channel, Bearer>>;

/// One orchestrator and how to reach it.
#[derive(Debug, Clone)]
pub struct Connection {
    pub url: String,
    pub credentials: Credentials,
}

impl Connection {
    pub fn new(url: impl Into<String>, credentials: Credentials) -> Self {
        Connection {
            url: url.into(),
            credentials,
        }
    }

    /// Connects (5 s for the whole connection: TCP, TLS, HTTP/2); an
    /// `https://` URL needs the CA.
    pub async fn connect(&self) -> Result<Client, CouldNotRun> {
        let (url, creds) = (&self.url, &self.credentials);
        let mut endpoint = Channel::from_shared(url.to_string())
            .map_err(|e| CouldNotRun(format!("invalid --orchestrator URL {url:?}: {e}")))?
            .connect_timeout(CONNECT_TIMEOUT);
        if url.starts_with("https://") {
            let ca = creds.ca.as_ref().ok_or_else(|| {
                CouldNotRun(format!(
                    "{url} uses TLS: pass --ca (or set PDWARDEN_CA) with the pdwarden CA certificate"
                ))
            })?;
            let read =
                |p: &PathBuf| std::fs::read(p).map_err(|e| CouldNotRun(format!("cannot read {}: {e}", p.display())));
            let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
            if let (Some(cert), Some(key)) = (&creds.cert, &creds.key) {
                tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| CouldNotRun(format!("TLS setup for {url}: {e}")))?;
        }
        let bearer = match &creds.token {
            Some(t) => Some(
                format!("Bearer {}", t.trim())
                    .parse()
                    .map_err(|_| CouldNotRun("the token is not valid header text".into()))?,
            ),
            None => None,
        };
        // The endpoint's connect_timeout bounds only TCP; a frozen
        // orchestrator (SIGSTOPped, a paused VM) completes that from its
        // kernel's backlog and never answers the TLS handshake.
        let channel = tokio::time::timeout(CONNECT_TIMEOUT, endpoint.connect())
            .await
            .map_err(|_| {
                CouldNotRun(format!(
                    "orchestrator at {url} did not complete the connection (TCP, TLS, HTTP/2) within {} s: hung or overloaded",
                    CONNECT_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|e| CouldNotRun(format!("orchestrator unreachable at {url}: {}", error_chain(&e))))?;
        // A history of many operations is many reports, each bounded by the
        // journal (`MAX_REPORT_BYTES`): more than tonic's 4 MiB default.
        Ok(ControlClient::with_interceptor(channel, Bearer(bearer)).max_decoding_message_size(MAX_REPLY_BYTES))
    }

    /// Starts a co-restart of `pair` (or, with `verify` =
    /// Some(include_abort_storm), a verification) and follows its update
    /// stream to the report, handing each progress line to `on_line`.
    pub async fn follow(
        &self,
        pair: &str,
        verify: Option<bool>,
        request_id: String,
        on_line: impl FnMut(String),
    ) -> Result<OperationReport, CouldNotRun> {
        let asked = Asked::restart_or_verify(verify);
        self.follow_asked(pair, asked, request_id, on_line).await
    }

    /// [`Connection::follow`] for any operation a CLI asks for.
    pub async fn follow_asked(
        &self,
        pair: &str,
        asked: Asked,
        request_id: String,
        mut on_line: impl FnMut(String),
    ) -> Result<OperationReport, CouldNotRun> {
        let request = match asked {
            Asked::Verify {
                include_abort_storm,
                record_reference,
            } => Request::Verify(VerifyPairRequest {
                pair: pair.to_string(),
                request_id,
                include_abort_storm,
                record_reference,
            }),
            Asked::Restart { rolling } => Request::Restart(RestartPairRequest {
                pair: pair.to_string(),
                request_id,
                rolling,
                only_sick: false,
            }),
            Asked::OnlySick => Request::Restart(RestartPairRequest {
                pair: pair.to_string(),
                request_id,
                rolling: false,
                only_sick: true,
            }),
        };
        let started = |s: &OperationStarted| match asked {
            Asked::Verify { .. } => format!(
                "verify pd-pair {}: operation {} (probes through the router; nothing restarted)",
                s.pair, s.operation_id
            ),
            Asked::Restart { rolling: true } => format!(
                "restart pd-pair {} --rolling: operation {} (one P/D sub-pair at a time, each out of the router while it restarts; decode start policy: {})",
                s.pair, s.operation_id, s.decode_start_policy
            ),
            Asked::OnlySick => format!(
                "restart pd-pair {} --only-sick: operation {} (every prefill → decode path probed; only the engines the failures point to restart, out of the router)",
                s.pair, s.operation_id
            ),
            Asked::Restart { rolling: false } => format!(
                "restart pd-pair {}: operation {} (decode start policy: {})",
                s.pair, s.operation_id, s.decode_start_policy
            ),
        };
        self.follow_request(request, &OPERATION_STREAM, started, &mut on_line)
            .await
    }

    /// Starts a change gate (`request`) and follows its update stream to
    /// the gate's report, handing each progress line to `on_line`.
    pub async fn follow_gate(
        &self,
        request: GatePairRequest,
        mut on_line: impl FnMut(String),
    ) -> Result<pdwarden_model::gate::report::GateReport, CouldNotRun> {
        let started = |s: &OperationStarted| format!("gate pd-pair {}: operation {}", s.pair, s.operation_id);
        self.follow_request(Request::Gate(request), &GATE_STREAM, started, &mut on_line)
            .await
    }

    /// The one follower of an operation's update stream (issue 33: the
    /// gate's was a copy): asks for `request`; a follower (several
    /// orchestrators on etcd) refuses, naming the leader, which is asked
    /// once more with the same request id, so the operation runs at most
    /// once whatever happened to the first ask; then each update becomes a
    /// line for `on_line` (`started` words the first) until the report,
    /// read as `R`.
    async fn follow_request<R: serde::de::DeserializeOwned>(
        &self,
        request: Request,
        words: &StreamWords,
        started: impl Fn(&OperationStarted) -> String,
        on_line: &mut impl FnMut(String),
    ) -> Result<R, CouldNotRun> {
        let mut at = self.clone();
        let mut stream = loop {
            let mut client = at.connect().await?;
            let asked = match request.clone() {
                Request::Restart(r) => client.restart_pair(r).await,
                Request::Verify(r) => client.verify_pair(r).await,
                Request::Gate(r) => client.gate_pair(r).await,
            };
            match asked {
                Ok(r) => break r.into_inner(),
                Err(s) => match leader_named(&s).filter(|l| at.url == self.url && *l != at.url) {
                    Some(leader) => {
                        on_line(format!("{} is a follower; asking the leader, {leader}", at.url));
                        at = Connection::new(leader, self.credentials.clone());
                    }
                    None => return Err(CouldNotRun(status_reason(&s))),
                },
            }
        };
        loop {
            let update = match stream.message().await {
                Ok(Some(u)) => u,
                Ok(None) => return Err(CouldNotRun(words.ended.into())),
                Err(s) => return Err(CouldNotRun(format!("{}: {}", words.lost, status_reason(&s)))),
            };
            let line = match update.kind {
                Some(operation_update::Kind::Started(s)) => Some(started(&s)),
                Some(
                    kind @ (operation_update::Kind::Step(_)
                    | operation_update::Kind::Phase(_)
                    | operation_update::Kind::Probe(_)),
                ) => progress_line(kind),
                Some(operation_update::Kind::Report(r)) => {
                    return serde_json::from_str(&r.json)
                        .map_err(|e| CouldNotRun(format!("{}: {e}", words.unreadable)));
                }
                None => None,
            };
            if let Some(line) = line {
                on_line(line);
            }
        }
    }
}

/// What a CLI asks the orchestrator to start.
#[derive(Debug, Clone)]
enum Request {
    Restart(RestartPairRequest),
    Verify(VerifyPairRequest),
    Gate(GatePairRequest),
}

/// How a stream's failures are worded.
struct StreamWords {
    ended: &'static str,
    lost: &'static str,
    unreadable: &'static str,
}

const OPERATION_STREAM: StreamWords = StreamWords {
    ended: "the orchestrator ended the operation stream without a report",
    lost: "lost the operation stream",
    unreadable: "unreadable report from the orchestrator",
};

const GATE_STREAM: StreamWords = StreamWords {
    ended: "the orchestrator ended the gate's stream without a report",
    lost: "lost the gate's stream",
    unreadable: "unreadable gate report from the orchestrator",
};

/// The leader a follower's refusal names (`UNAVAILABLE` with the
/// `pdwarden-leader` metadata), if it is one.
pub fn leader_named(s: &tonic::Status) -> Option<String> {
    (s.code() == tonic::Code::Unavailable)
        .then(|| s.metadata().get(pdwarden_proto::LEADER_METADATA))
        .flatten()
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim_end_matches('/').to_string())
}

/// An error with its causes (a TLS failure is only named in a source).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// A refusal's reason, for people.
pub fn status_reason(s: &tonic::Status) -> String {
    if s.message().is_empty() {
        format!("{:?}", s.code())
    } else {
        s.message().to_string()
    }
}

/// The live line for a step, phase or probe update (None for the others),
/// shared by every command that follows an operation's stream.
pub fn progress_line(kind: operation_update::Kind) -> Option<String> {
    match kind {
        operation_update::Kind::Step(s) => Some(live_step_line(&StepRecord {
            name: s.name,
            unit: s.unit,
            started_ms: s.started_ms,
            ended_ms: s.ended_ms,
            outcome: s.outcome,
        })),
        operation_update::Kind::Phase(p) => Some(live_phase_line(&TimelineRecord {
            unit: p.unit,
            role: p.role,
            phase: p.phase,
            at_ms: p.at_ms,
            detail: p.detail,
        })),
        operation_update::Kind::Probe(p) => Some(live_probe_line(&ProbeRecord {
            target: p.target,
            seq: p.seq,
            latency_ms: p.latency_ms,
            tokens: p.tokens,
            outcome: p.outcome,
            error: p.error,
            request_id: String::new(),
        })),
        _ => None,
    }
}

impl Connection {
    /// Starts a co-restart of `pair` (or, with `verify` =
    /// Some(include_abort_storm), a verification) and follows it to its
    /// report, printing progress lines and the summary on stdout unless
    /// `quiet` (the CLI's `--json`, which prints the report itself).
    pub async fn follow_printing(
        &self,
        pair: &str,
        quiet: bool,
        verify: Option<bool>,
        request_id: String,
    ) -> Result<OperationReport, CouldNotRun> {
        let asked = Asked::restart_or_verify(verify);
        self.follow_printing_asked(pair, quiet, asked, request_id).await
    }

    /// [`Connection::follow_printing`] for any operation a CLI asks for.
    pub async fn follow_printing_asked(
        &self,
        pair: &str,
        quiet: bool,
        asked: Asked,
        request_id: String,
    ) -> Result<OperationReport, CouldNotRun> {
        let report = self
            .follow_asked(pair, asked, request_id, |line| {
                if !quiet {
                    crate::say!("{line}");
                }
            })
            .await?;
        if !quiet {
            crate::say_part!("{}", pdwarden_model::report::render_summary(&report));
        }
        Ok(report)
    }
}

/// What an operator asks of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    /// A co-restart; `rolling`: one P/D sub-pair at a time.
    Restart { rolling: bool },
    /// Only the engines the path matrix names, and what depends on them
    /// (issue 37).
    OnlySick,
    /// Probes and the suite; nothing restarted. `record_reference`: its
    /// greedy answer pinned as the pair's reference if it is healthy.
    Verify {
        include_abort_storm: bool,
        record_reference: bool,
    },
}

impl Asked {
    /// `Some(include_abort_storm)`: a verification; `None`: a co-restart
    /// (neither rolling nor pinning a reference).
    pub fn restart_or_verify(verify: Option<bool>) -> Self {
        match verify {
            Some(include_abort_storm) => Asked::Verify {
                include_abort_storm,
                record_reference: false,
            },
            None => Asked::Restart { rolling: false },
        }
    }
}

/// A fresh idempotency key for an operation request.
pub fn new_request_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// `--json` output: one object on one line (see [`json_to`]).
pub fn print_json(value: &impl serde::Serialize) {
    if let Err(e) = json_to(&mut std::io::stdout().lock(), value)
        && e.kind() == std::io::ErrorKind::InvalidData
    {
        say_err!("pdwarden: cannot encode JSON output: {e}");
    }
}

/// `value` as one line of JSON on `out`, through [`say_to`]: serde_json
/// escapes the C0 controls in strings, and [`say_to`] the DEL and C1 ones
/// serde_json leaves raw, in JSON's own `\u00XX` form, so the line is the
/// same JSON and safe on a terminal. An encoding failure is `InvalidData`.
pub fn json_to(out: &mut impl std::io::Write, value: &impl serde::Serialize) -> std::io::Result<()> {
    let text = serde_json::to_string(value).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    say_to(out, format_args!("{text}"), true)
}

/// Writes to stdout. A reader that went away (`pdwarden status | head -1`)
/// is not an error: the rest is dropped and the command ends with the exit
/// code its outcome gives (issue 16, finding 10: `println!` panicked on the
/// broken pipe, exit 101, outside the documented codes). The CLI, the demo
/// and the drills print only through [`say!`], [`say_part!`] and
/// [`say_err!`], so everything they print passes [`say_to`].
pub fn say(text: std::fmt::Arguments<'_>, newline: bool) {
    let _ = say_to(&mut std::io::stdout().lock(), text, newline);
}

/// [`say()`] to stderr (one-line reasons).
pub fn say_stderr(text: std::fmt::Arguments<'_>, newline: bool) {
    let _ = say_to(&mut std::io::stderr().lock(), text, newline);
}

/// The one way the CLI's text reaches a terminal (issue 48, item 4): what
/// it prints comes in large part from engines, routers and their logs
/// (log tails, documents, stack frames, argv, reasons quoting an engine's
/// answer), and a raw control sequence there acted on the operator's
/// terminal — OSC 52 wrote the clipboard, OSC 0 retitled the window,
/// `ESC [2J` cleared the screen. Every renderer's text is written through
/// here, and here every control character but newline and tab is shown
/// escaped ([`pdwarden_model::render::terminal_safe`]); then flushed.
pub fn say_to(out: &mut impl std::io::Write, text: std::fmt::Arguments<'_>, newline: bool) -> std::io::Result<()> {
    let formatted;
    let text = match text.as_str() {
        Some(s) => s,
        None => {
            formatted = text.to_string();
            &formatted
        }
    };
    out.write_all(pdwarden_model::render::terminal_safe(text).as_bytes())?;
    if newline {
        out.write_all(b"\n")?;
    }
    out.flush()
}

/// `println!` that survives a closed stdout (see [`say()`]).
#[macro_export]
macro_rules! say {
    () => {
        $crate::say(format_args!(""), true)
    };
    ($($t:tt)*) => {
        $crate::say(format_args!($($t)*), true)
    };
}

/// `print!` that survives a closed stdout (see [`say()`]).
#[macro_export]
macro_rules! say_part {
    ($($t:tt)*) => {
        $crate::say(format_args!($($t)*), false)
    };
}

/// `eprintln!` through [`say_to`] (see [`say_stderr`]).
#[macro_export]
macro_rules! say_err {
    ($($t:tt)*) => {
        $crate::say_stderr(format_args!($($t)*), true)
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine's log line that acts on a terminal: OSC 52 (sets the
    /// clipboard), OSC 0 (retitles the window), `ESC [2J` (clears the
    /// screen), C1 controls (`U+009B` is CSI on its own), a carriage return
    /// and a DEL; a tab and the newline are text.
    pub(crate) const HOSTILE: &str =
        "a\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07b\x1b]0;owned\x07c\x1b[2Jd\u{9b}2Je\u{90}f\u{9f}\rg\x7fh\ti\nj";

    /// No character a terminal acts on: only newline and tab among the
    /// controls (C0, DEL, C1).
    pub(crate) fn inert(text: &str) -> bool {
        !text.chars().any(|c| c.is_control() && c != '\n' && c != '\t')
    }

    /// Issue 48, item 4: `history --evidence` wrote an engine log's raw
    /// control bytes to the operator's terminal. Text through `say_to` has
    /// each control escaped (newline and tab kept); JSON through `json_to`
    /// is the same JSON, with DEL and C1 escaped as JSON escapes them.
    #[test]
    fn control_bytes_reach_the_terminal_escaped() {
        let mut out = Vec::new();
        say_to(&mut out, format_args!("log | {HOSTILE}"), true).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(inert(&text), "{text:?}");
        assert_eq!(
            text,
            "log | a\\u001b]52;c;Y3VybCBldmlsIHwgc2g=\\u0007b\\u001b]0;owned\\u0007c\\u001b[2Jd\\u009b2Je\\u0090f\\u009f\\u000dg\\u007fh\ti\nj\n"
        );
        let value = serde_json::json!({ "log_tail": HOSTILE, "argv": [HOSTILE] });
        let mut out = Vec::new();
        json_to(&mut out, &value).unwrap();
        let json = String::from_utf8(out).unwrap();
        assert!(inert(json.trim_end_matches('\n')) && !json.contains('\t'), "{json:?}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&json).unwrap(), value);
        // pdwarden's own emphasis is kept (status in red on a terminal).
        let red = pdwarden_model::render::alert("foreign pid 9", true);
        let mut out = Vec::new();
        say_to(&mut out, format_args!("{red}"), false).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), red);
    }

    /// A frozen orchestrator over TLS (its kernel accepts from the backlog,
    /// the process never answers the ClientHello) is one line naming it
    /// after the bound, not a CLI that waits for ever. Paused time.
    #[tokio::test(start_paused = true)]
    async fn a_frozen_orchestrator_is_a_clear_error_not_a_hang() {
        let dir = tempfile::tempdir().unwrap();
        let certs = pdwarden_security::certs::CertDir(dir.path().to_path_buf());
        certs.init(&["127.0.0.1".into()]).unwrap();
        let frozen = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("https://{}", frozen.local_addr().unwrap());
        let c = Connection::new(
            url.clone(),
            Credentials {
                ca: Some(certs.ca()),
                ..Default::default()
            },
        );
        let e = tokio::time::timeout(Duration::from_secs(600), c.connect())
            .await
            .expect("the connection to a frozen orchestrator ended")
            .expect_err("a frozen orchestrator is an error");
        assert_eq!(
            e.0,
            format!(
                "orchestrator at {url} did not complete the connection (TCP, TLS, HTTP/2) within 5 s: hung or overloaded"
            )
        );
        drop(frozen);
    }
}
