//! Evidence before the kill (issue 35): what a unit judged wedged looks like
//! in the moment before the orchestrator stops it.
//!
//! An automatic recovery destroys the only evidence of why a pair wedged:
//! once the engines are killed, nobody can ask which thread waited on which
//! KV transfer, or whether a GPU had fallen off the bus. SGLang's own
//! watchdog dumps its stacks with py-spy before it kills the process; the
//! agent does the same for every unit the orchestrator names
//! (`CaptureEvidence`), and adds what only the agent can see together: each
//! thread's /proc state and kernel wait channel, the unit's metrics and
//! server info (a router's worker list), its log tail, and the GPUs' state
//! and recent events.
//!
//! The capture is read-only and bounded in time, because the kill waits for
//! it: every unit and every part runs in parallel and is cut at the
//! command's deadline less a margin for the answer's trip, so the answer
//! reaches the orchestrator in time. What is cut (a py-spy still running is
//! killed) is named in the unit's `missing`, never silently absent. py-spy
//! always runs with `--nonblocking`: measured with py-spy 0.4.3, its default
//! mode fails on a SIGSTOPped process ("Failed to suspend process") and
//! would pause a healthy engine, while `--nonblocking` reads both.
//!
//! The capture is bounded in size at the source (issue 48), because the
//! answer travels on the agent's one link: a Python engine of 7 processes ×
//! 41 threads with deep stacks once made a 5.6 MB py-spy dump and a 14 MB
//! answer, the orchestrator's gRPC decoder refused it (its limit is 4 MiB),
//! the link broke, the capture was lost and the co-restart waiting on it
//! failed with "agent local is not connected". So every part has its bound
//! (py-spy's output read, threads per process, frames per thread, bytes per
//! frame, per document, per log tail, per note) and the whole answer has
//! [`MAX_ANSWER_BYTES`], checked with prost's `encoded_len` and met by
//! cutting the least telling parts first ([`bound_answer`]). Every cut is
//! named in the unit's `missing`: a capture can be partial, never the
//! reason a recovery stops.
//!
//! Every text field of a unit's evidence leaves the host through one
//! function, [`seal_unit`]: redacted as the unit's log tail is (its secret
//! values, then secrets by shape: `pdwarden_security::shapes`), and only
//! then cut, so a cut never leaves half a secret.
//!
//! The deadline arithmetic, /proc `stat` parsing, the descendants walk, the
//! py-spy merge, document selection and GPU selection are pure functions;
//! the edges (/proc, the py-spy child, HTTP) are thin around them.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use pdwarden_engines::EngineKind;
use pdwarden_proto::v1::{
    CaptureEvidence, EvidenceDocument, EvidenceResult, GpuDevice, GpuEvent, GpuProcess, ProcessStacks, ThreadStack,
    UnitEvidence,
};
use serde::Deserialize;
use thiserror::Error;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::checks::error_chain;
use crate::config::UnitConfig;
use crate::gpu::reporter::Latest;
use crate::supervisor::Supervisor;

/// The whole capture's deadline when the command leaves it 0.
pub const DEFAULT_DEADLINE_MS: u64 = 5_000;
/// Kept from the deadline for the redaction, the answer's bound and its
/// trip to the orchestrator: this, or a tenth of the deadline if more
/// (issue 48's second red-team pass: on a loaded 2-core host a capture of
/// hostile dumps answered 1.4 s after a 5 s deadline, and the orchestrator
/// had stopped waiting: the whole capture was lost).
pub const ANSWER_MARGIN: Duration = Duration::from_millis(300);
/// The least time a capture gets, however short the deadline.
pub const MIN_CAPTURE: Duration = Duration::from_millis(200);
/// Log lines per unit when the command leaves it 0.
pub const DEFAULT_LOG_LINES: usize = 100;
/// Processes per unit: its own and its descendants, breadth-first.
pub const MAX_PROCESSES: usize = 16;
/// Threads per process.
pub const MAX_THREADS: usize = 256;
/// Python frames per thread, innermost first.
pub const MAX_FRAMES: usize = 48;
/// Characters of a process's command line.
pub const MAX_COMMAND_CHARS: usize = 300;
/// Bytes of a document's body.
pub const MAX_DOCUMENT_BYTES: usize = 64 << 10;
/// Bytes of one Python frame ("function (file:line)").
pub const MAX_FRAME_BYTES: usize = 400;
/// Bytes of a thread's name or wait channel.
pub const MAX_NAME_BYTES: usize = 128;
/// Bytes of a unit's log tail (its end is kept).
pub const MAX_LOG_TAIL_BYTES: usize = 32 << 10;
/// Bytes of one note: a `missing` entry, an error, a URL, a GPU detail.
pub const MAX_NOTE_BYTES: usize = 1024;
/// `missing` entries per unit (the rest are counted in one more).
pub const MAX_MISSING: usize = 64;
/// Bytes of one py-spy's output read (a real 7 × 41-thread engine's dump
/// was 5.6 MB); past it py-spy is killed and the threads read whole before
/// the cut are kept.
pub const MAX_PY_SPY_OUTPUT_BYTES: usize = 8 << 20;
/// Bytes of py-spy's stderr kept (the rest is read and dropped).
const MAX_PY_SPY_STDERR_BYTES: usize = 64 << 10;
/// The whole `EvidenceResult`, protobuf-encoded: a quarter of the 4 MiB a
/// gRPC peer decodes by default (tonic's `max_decoding_message_size`), so
/// the answer can never cost the agent its link.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;
/// Read past the cut and redacted with it, so a secret that straddles the
/// cut is hidden whole rather than leaving its first half.
const REDACTION_OVERLAP_BYTES: usize = 4 << 10;
/// `EvidenceResult.py_spy_missing` when no py-spy was found.
pub const PY_SPY_MISSING: &str =
    "py-spy not found (set py_spy in the agent config, or install it: pip install py-spy); threads from /proc only";

/// Why one part of the capture is missing; its text goes into
/// `UnitEvidence.missing` or the part's own error field.
#[derive(Debug, Error)]
pub enum EvidenceError {
    /// The part was cut at the capture's deadline.
    #[error("not done by the {deadline_ms} ms deadline")]
    Deadline { deadline_ms: u64 },
    #[error("cannot read {path}")]
    Proc {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not in the kernel's format")]
    ProcFormat { path: String },
    #[error("cannot run {program}")]
    PySpySpawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    /// py-spy ran and failed: its own first `Error:` line.
    #[error("{0}")]
    PySpyFailed(String),
    #[error("py-spy's output is not its JSON dump")]
    PySpyOutput(#[source] serde_json::Error),
    #[error("py-spy's output passed {max} bytes before its first whole thread")]
    PySpyTooBig { max: usize },
    #[error("GET {url}")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// A blocking read (/proc, the log) panicked.
    #[error("the read failed")]
    Blocking(#[source] tokio::task::JoinError),
}

// ------------------------------------------------------------ pure parts

/// The deadline a command means: 0 is [`DEFAULT_DEADLINE_MS`].
pub fn effective_deadline_ms(asked: u64) -> u64 {
    if asked == 0 { DEFAULT_DEADLINE_MS } else { asked }
}

/// How long the capture may run: the deadline less [`ANSWER_MARGIN`], at
/// least [`MIN_CAPTURE`].
pub fn capture_budget(deadline_ms: u64) -> Duration {
    let deadline = Duration::from_millis(deadline_ms);
    deadline
        .saturating_sub(ANSWER_MARGIN.max(deadline / 10))
        .max(MIN_CAPTURE)
}

/// The fields of `/proc/PID/stat` (or `/proc/PID/task/TID/stat`) the
/// capture uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// The command name (at most 15 bytes; may hold spaces and parentheses).
    pub comm: String,
    /// The state letter: R, S, D, T, t, Z, …
    pub state: String,
    pub ppid: u32,
    /// Field 22: when the process started, clock ticks after boot.
    pub start_ticks: u64,
    /// Fields 14–17: user and system time, its own and its reaped
    /// children's, in clock ticks.
    pub cpu_ticks: u64,
}

/// Parses a `stat` line. The command name sits in parentheses and may hold
/// both spaces and parentheses itself, so the fields are read after the
/// LAST `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_owned();
    let fields: Vec<&str> = text[close + 1..].split_whitespace().collect();
    // fields[0] is field 3 (state); field 22 is fields[19].
    Some(Stat {
        comm,
        state: (*fields.first()?).to_owned(),
        ppid: fields.get(1)?.parse().ok()?,
        start_ticks: fields.get(19)?.parse().ok()?,
        cpu_ticks: fields
            .get(11..15)?
            .iter()
            .map(|f| f.parse::<u64>().ok())
            .sum::<Option<u64>>()?,
    })
}

/// `btime` of `/proc/stat`: the boot, seconds since the Unix epoch.
pub fn parse_btime(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// A process start in ms since the Unix epoch, from its `stat` start time.
pub fn start_unix_ms(start_ticks: u64, ticks_per_second: u64, boot_unix_s: u64) -> u64 {
    let after_boot_ms = u128::from(start_ticks) * 1000 / u128::from(ticks_per_second.max(1));
    boot_unix_s
        .saturating_mul(1000)
        .saturating_add(u64::try_from(after_boot_ms).unwrap_or(u64::MAX))
}

/// When a process with `start_ticks` (its `stat` start time) started, in ms
/// since the Unix epoch; None when the clock or the boot time is unreadable.
fn started_unix_ms_of(start_ticks: u64) -> Option<u64> {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    let btime = parse_btime(&std::fs::read_to_string("/proc/stat").ok()?)?;
    Some(start_unix_ms(start_ticks, u64::try_from(ticks).ok()?, btime))
}

/// When process `pid` started, in ms since the Unix epoch (issue 46: a
/// unit's `process_started_unix_ms`, whoever started it); None when it is
/// gone or /proc is unreadable.
pub fn process_started_unix_ms(pid: u32) -> Option<u64> {
    let stat = read_stat(&format!("/proc/{pid}/stat")).ok()?;
    started_unix_ms_of(stat.start_ticks)
}

/// The CPU time, in seconds, each of `roots` and its descendants have used
/// (user and system, reaped children's included), from one pass over /proc
/// (issue 47: the verification's progress watch tells a compiling engine
/// from a stuck one). A root that is gone is left out. A child's time moves
/// into its parent's when it is reaped, so the sum only falls when a
/// process leaves the tree alive (re-parented) or the root is a new one.
pub fn tree_cpu_seconds(roots: &[u32]) -> BTreeMap<u32, f64> {
    let Some(ticks) = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|t| u64::try_from(t).ok())
        .filter(|t| *t > 0)
    else {
        return BTreeMap::new();
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return BTreeMap::new();
    };
    let stats: BTreeMap<u32, Stat> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, read_stat(&format!("/proc/{pid}/stat")).ok()?)))
        .collect();
    let table: Vec<(u32, u32)> = stats.iter().map(|(pid, s)| (*pid, s.ppid)).collect();
    roots
        .iter()
        .filter(|root| stats.contains_key(root))
        .map(|&root| {
            let (pids, _) = descendants(root, &table, usize::MAX);
            let total: u64 = pids.iter().filter_map(|p| stats.get(p)).map(|s| s.cpu_ticks).sum();
            (root, total as f64 / ticks as f64)
        })
        .collect()
}

/// `root` and its descendants in `table` (pid, ppid), breadth-first and by
/// pid among siblings, at most `max` of them; the second value is how many
/// more there were.
pub fn descendants(root: u32, table: &[(u32, u32)], max: usize) -> (Vec<u32>, usize) {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for &(pid, ppid) in table {
        if pid != root {
            children.entry(ppid).or_default().push(pid);
        }
    }
    for c in children.values_mut() {
        c.sort_unstable();
    }
    let mut seen = HashSet::from([root]);
    let mut queue = VecDeque::from([root]);
    let mut all = Vec::new();
    while let Some(pid) = queue.pop_front() {
        all.push(pid);
        for &c in children.get(&pid).map(Vec::as_slice).unwrap_or_default() {
            if seen.insert(c) {
                queue.push_back(c);
            }
        }
    }
    let more = all.len().saturating_sub(max);
    all.truncate(max);
    (all, more)
}

/// Bytes of a command line read before it is redacted and cut to
/// [`MAX_COMMAND_CHARS`]: enough past the cut that a secret straddling it
/// is seen whole by the redaction.
const RAW_COMMAND_BYTES: usize = MAX_COMMAND_CHARS * 4 + REDACTION_OVERLAP_BYTES;

/// A `/proc/PID/cmdline` as one line: NULs as spaces, its first
/// [`RAW_COMMAND_BYTES`] only. Not yet cut to [`MAX_COMMAND_CHARS`]:
/// [`seal_unit`] redacts it first, then cuts it.
pub fn command_line(raw: &[u8]) -> String {
    let raw = &raw[..raw.len().min(RAW_COMMAND_BYTES)];
    String::from_utf8_lossy(raw).replace('\0', " ").trim_end().to_owned()
}

/// One thread of py-spy's `dump --json`.
#[derive(Debug, Clone, Deserialize)]
pub struct PySpyThread {
    #[serde(default)]
    pub os_thread_id: Option<u64>,
    #[serde(default)]
    pub thread_name: Option<String>,
    #[serde(default)]
    pub active: bool,
    #[serde(default)]
    pub owns_gil: bool,
    /// Innermost first.
    #[serde(default)]
    pub frames: Vec<PySpyFrame>,
}

/// One Python frame of a [`PySpyThread`].
#[derive(Debug, Clone, Deserialize)]
pub struct PySpyFrame {
    pub name: String,
    #[serde(default)]
    pub filename: Option<String>,
    #[serde(default)]
    pub short_filename: Option<String>,
    #[serde(default)]
    pub line: i64,
}

impl PySpyFrame {
    /// "function (file:line)".
    fn text(&self) -> String {
        let file = self
            .short_filename
            .as_deref()
            .or(self.filename.as_deref())
            .unwrap_or("?");
        format!("{} ({file}:{})", self.name, self.line)
    }
}

/// What [`merge_py_spy`] merged, and what it cut.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Merged {
    /// Some frame came back.
    pub any_frames: bool,
    /// Threads whose stack was cut to its [`MAX_FRAMES`] innermost.
    pub deep_threads: usize,
    /// py-spy's threads left out: the thread list was full.
    pub dropped_threads: usize,
}

impl Merged {
    /// What was cut, as `missing` names it.
    pub fn cuts(&self, pid: u32) -> Vec<String> {
        let mut out = Vec::new();
        if self.deep_threads > 0 {
            out.push(format!(
                "frames of pid {pid}: {} threads cut to their {MAX_FRAMES} innermost",
                self.deep_threads
            ));
        }
        if self.dropped_threads > 0 {
            out.push(format!(
                "py-spy threads of pid {pid}: {} more not captured (at most {MAX_THREADS})",
                self.dropped_threads
            ));
        }
        out
    }
}

/// Merges py-spy's threads into the /proc ones by OS thread id: frames (at
/// most [`MAX_FRAMES`]), `active`, `owns_gil`, and py-spy's thread name
/// over `comm`. A thread /proc did not list is added while there is room.
pub fn merge_py_spy(threads: &mut Vec<ThreadStack>, dump: Vec<PySpyThread>) -> Merged {
    let mut merged = Merged::default();
    for t in dump {
        let frames: Vec<String> = t.frames.iter().take(MAX_FRAMES).map(PySpyFrame::text).collect();
        merged.any_frames |= !frames.is_empty();
        let tid = t.os_thread_id.and_then(|id| u32::try_from(id).ok());
        let at = match tid.and_then(|tid| threads.iter().position(|x| x.tid == tid)) {
            Some(i) => i,
            None if threads.len() < MAX_THREADS => {
                threads.push(ThreadStack {
                    tid: tid.unwrap_or(0),
                    ..Default::default()
                });
                threads.len() - 1
            }
            None => {
                merged.dropped_threads += 1;
                continue;
            }
        };
        if t.frames.len() > MAX_FRAMES {
            merged.deep_threads += 1;
        }
        let slot = &mut threads[at];
        slot.frames = frames;
        slot.active = t.active;
        slot.owns_gil = t.owns_gil;
        if let Some(name) = t.thread_name.filter(|n| !n.is_empty()) {
            slot.name = name;
        }
    }
    merged
}

/// py-spy's threads read from its output, cut or not.
#[derive(Debug, Default)]
pub struct PySpyDump {
    pub threads: Vec<PySpyThread>,
    /// The output went on past [`MAX_PY_SPY_OUTPUT_BYTES`]: `threads` are
    /// those read whole before the cut.
    pub cut: bool,
}

/// Collects a JSON array's elements as they are read, so those before an
/// error (an output cut mid-array) are kept.
struct Collect<'a>(&'a mut Vec<PySpyThread>);

impl<'de> serde::de::DeserializeSeed<'de> for Collect<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Collect<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("py-spy's array of threads")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(t) = seq.next_element::<PySpyThread>()? {
            self.0.push(t);
        }
        Ok(())
    }
}

/// py-spy's `dump --json` output; `cut`: it was cut at
/// [`MAX_PY_SPY_OUTPUT_BYTES`], and the threads read whole before the cut
/// are kept (an error only when there is none).
pub fn parse_py_spy(out: &[u8], cut: bool) -> Result<PySpyDump, EvidenceError> {
    use serde::de::DeserializeSeed as _;
    let mut threads = Vec::new();
    let read = Collect(&mut threads).deserialize(&mut serde_json::Deserializer::from_slice(out));
    match read {
        Ok(()) => Ok(PySpyDump { threads, cut: false }),
        Err(_) if cut && !threads.is_empty() => Ok(PySpyDump { threads, cut: true }),
        Err(_) if cut => Err(EvidenceError::PySpyTooBig {
            max: MAX_PY_SPY_OUTPUT_BYTES,
        }),
        Err(e) => Err(EvidenceError::PySpyOutput(e)),
    }
}

/// Why py-spy failed, in one line: its first `Error:` line, else its first
/// line, else `fallback` (the exit status).
pub fn py_spy_failure(stderr: &str, fallback: &str) -> String {
    let lines = || stderr.lines().map(str::trim).filter(|l| !l.is_empty());
    lines()
        .find(|l| l.starts_with("Error:"))
        .or_else(|| lines().next())
        .unwrap_or(fallback)
        .to_owned()
}

/// The documents read from a unit, by name, with their URLs: an engine's
/// metrics and what it says of itself, a router's metrics (on its own
/// exporter) and worker list.
pub fn document_urls(unit: &UnitConfig) -> Vec<(&'static str, String)> {
    let base = unit.base_url.trim_end_matches('/');
    let metrics = ("metrics", unit.metrics_url_for(""));
    if unit.is_router() {
        // Both routers serve their worker list here (see `router_api`).
        return vec![metrics, ("workers", format!("{base}/workers"))];
    }
    match unit.engine_kind() {
        EngineKind::Vllm => vec![
            metrics,
            ("version", format!("{base}/version")),
            ("models", format!("{base}/v1/models")),
        ],
        EngineKind::Sglang | EngineKind::SglangRouter | EngineKind::VllmRouter => {
            vec![metrics, ("server_info", format!("{base}/get_server_info"))]
        }
    }
}

/// A document's body as it leaves the host: redacted, then cut to
/// [`MAX_DOCUMENT_BYTES`] (on a character boundary). `more` says the body
/// went on past `bytes`. Returns the text and whether it was cut.
pub fn document_body(bytes: &[u8], more: bool, redact: impl FnOnce(&str) -> String) -> (String, bool) {
    let mut text = redact(&String::from_utf8_lossy(bytes));
    if text.len() <= MAX_DOCUMENT_BYTES && !more {
        return (text, false);
    }
    let mut cut = MAX_DOCUMENT_BYTES.min(text.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    (text, true)
}

/// What of the GPU reporter's latest reading concerns one unit.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuEvidence {
    /// The devices holding a process of the unit; every device when none does.
    pub gpus: Vec<GpuDevice>,
    /// Processes on those devices that no unit owns.
    pub foreign_processes: Vec<GpuProcess>,
    /// Events (all GPUs) since the unit's process started; all recent ones
    /// when it is not running.
    pub events: Vec<GpuEvent>,
    pub source: String,
    pub unavailable: String,
}

/// Selects from `latest` what concerns `unit`, whose process started at
/// `started_unix_ms` (None: not running).
pub fn gpu_evidence(latest: &Latest, unit: &str, started_unix_ms: Option<u64>) -> GpuEvidence {
    let events = latest
        .recent_events
        .iter()
        .filter(|e| started_unix_ms.is_none_or(|s| e.at_unix_ms >= s))
        .cloned()
        .collect();
    let Some(snapshot) = &latest.snapshot else {
        return GpuEvidence {
            events,
            unavailable: "no GPU sample taken yet".into(),
            ..Default::default()
        };
    };
    let holding: Vec<&GpuDevice> = snapshot
        .gpus
        .iter()
        .filter(|g| g.processes.iter().any(|p| p.unit == unit))
        .collect();
    let gpus: Vec<GpuDevice> = if holding.is_empty() {
        snapshot.gpus.clone()
    } else {
        holding.into_iter().cloned().collect()
    };
    GpuEvidence {
        foreign_processes: gpus
            .iter()
            .flat_map(|g| &g.processes)
            .filter(|p| p.foreign)
            .cloned()
            .collect(),
        gpus,
        events,
        source: snapshot.gpu_source.clone(),
        unavailable: snapshot.gpu_unavailable.clone(),
    }
}

/// The py-spy to use: the configured one, else `py-spy` on `path_var` (the
/// `PATH`); None when there is none.
pub fn find_py_spy(configured: Option<&Path>, path_var: Option<&OsStr>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(p) = configured {
        // Checked at load; if it went since, its run says so.
        return Some(p.to_path_buf());
    }
    std::env::split_paths(path_var?)
        .map(|dir| dir.join("py-spy"))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// Cuts `s` to at most `max` bytes, keeping its start (`keep_end`: its
/// end), at a character boundary; true if it cut.
fn cut_bytes(s: &mut String, max: usize, keep_end: bool) -> bool {
    if s.len() <= max {
        return false;
    }
    if keep_end {
        let mut start = s.len() - max;
        while !s.is_char_boundary(start) {
            start += 1;
        }
        s.drain(..start);
    } else {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    true
}

/// `s` redacted, then cut to `max` bytes; true if it was cut. What is
/// redacted is first cut to `max` and [`REDACTION_OVERLAP_BYTES`] past it
/// (a secret straddling the cut is seen whole, and the redaction's work is
/// bounded whatever a hostile engine sends).
fn seal(s: &mut String, max: usize, keep_end: bool, redact: &dyn Fn(&str) -> String) -> bool {
    if s.is_empty() {
        return false;
    }
    let precut = cut_bytes(s, max.saturating_add(REDACTION_OVERLAP_BYTES), keep_end);
    *s = redact(s);
    cut_bytes(s, max, keep_end) || precut
}

/// Every text field of a unit's evidence as it may leave the host:
/// redacted by `redact` (the unit's: its secret values, then secrets by
/// shape), THEN cut to its bound, so a cut never leaves half a secret. The
/// one function every field of a capture goes through (issue 48): the
/// unit's name, each process's command line and py-spy error, each
/// thread's name, wait channel and frames, each document's URL, body and
/// error, the log tail (its end kept), the GPUs' and GPU events' texts,
/// the foreign processes' command lines and users, and `missing`. What it
/// cut past the fixed bounds is added to `missing`.
pub fn seal_unit(ev: &mut UnitEvidence, redact: &dyn Fn(&str) -> String) {
    let note = |s: &mut String| {
        seal(s, MAX_NOTE_BYTES, false, redact);
    };
    let name = |s: &mut String| {
        seal(s, MAX_NAME_BYTES, false, redact);
    };
    let mut cut = Vec::new();
    name(&mut ev.unit);
    for p in &mut ev.processes {
        if seal(&mut p.command, RAW_COMMAND_BYTES, false, redact) || p.command.chars().count() > MAX_COMMAND_CHARS {
            p.command = p.command.chars().take(MAX_COMMAND_CHARS).collect();
        }
        note(&mut p.py_spy_error);
        note(&mut p.method);
        let mut long_frames = 0;
        for th in &mut p.threads {
            name(&mut th.name);
            name(&mut th.state);
            name(&mut th.wchan);
            for f in &mut th.frames {
                long_frames += usize::from(seal(f, MAX_FRAME_BYTES, false, redact));
            }
        }
        if long_frames > 0 {
            cut.push(format!(
                "frames of pid {}: {long_frames} cut to {MAX_FRAME_BYTES} bytes",
                p.pid
            ));
        }
    }
    for d in &mut ev.documents {
        name(&mut d.name);
        note(&mut d.url);
        note(&mut d.error);
        d.truncated |= seal(&mut d.body, MAX_DOCUMENT_BYTES, false, redact);
    }
    if seal(&mut ev.log_tail, MAX_LOG_TAIL_BYTES, true, redact) {
        cut.push(format!("log tail: cut to its last {MAX_LOG_TAIL_BYTES} bytes"));
    }
    for g in &mut ev.gpus {
        name(&mut g.uuid);
        name(&mut g.name);
        g.throttle_reasons.iter_mut().for_each(name);
        g.read_errors.iter_mut().for_each(note);
        for gp in &mut g.processes {
            note(&mut gp.command_line);
            name(&mut gp.user);
            name(&mut gp.kind);
            name(&mut gp.unit);
        }
    }
    for e in &mut ev.gpu_events {
        name(&mut e.gpu_uuid);
        name(&mut e.kind);
        note(&mut e.detail);
    }
    for gp in &mut ev.foreign_processes {
        note(&mut gp.command_line);
        name(&mut gp.user);
        name(&mut gp.kind);
        name(&mut gp.unit);
    }
    name(&mut ev.gpu_source);
    note(&mut ev.gpu_unavailable);
    ev.missing.iter_mut().for_each(note);
    ev.missing.extend(cut);
    if ev.missing.len() > MAX_MISSING {
        let more = ev.missing.len() - (MAX_MISSING - 1);
        ev.missing.truncate(MAX_MISSING - 1);
        ev.missing.push(format!("{more} more things not captured, not listed"));
    }
}

/// One cut of [`bound_answer`]: what it does, as `missing` names it.
type AnswerCut = (&'static str, fn(&mut UnitEvidence));

/// The cuts [`bound_answer`] makes, in order, until the answer fits: the
/// least telling first (documents and log tails are read again by people;
/// the innermost frames and each thread's state say where it waits).
const ANSWER_CUTS: [AnswerCut; 11] = [
    ("document bodies cut to 4 KiB", |u| {
        for d in &mut u.documents {
            d.truncated |= cut_bytes(&mut d.body, 4 << 10, false);
        }
    }),
    ("log tail cut to its last 4 KiB", |u| {
        cut_bytes(&mut u.log_tail, 4 << 10, true);
    }),
    ("frames cut to each thread's 12 innermost", |u| frames_to(u, 12)),
    ("document bodies dropped", |u| {
        for d in &mut u.documents {
            d.truncated |= !d.body.is_empty();
            d.body.clear();
        }
    }),
    ("log tail dropped", |u| u.log_tail.clear()),
    ("GPU events cut to the 16 latest", |u| {
        let more = u.gpu_events.len().saturating_sub(16);
        u.gpu_events.drain(..more);
    }),
    ("frames cut to each thread's 3 innermost", |u| frames_to(u, 3)),
    ("threads cut to 64 per process", |u| {
        u.processes.iter_mut().for_each(|p| p.threads.truncate(64));
    }),
    ("processes cut to the unit's 4 first", |u| u.processes.truncate(4)),
    ("threads cut to 8 per process", |u| {
        u.processes.iter_mut().for_each(|p| p.threads.truncate(8));
    }),
    ("processes, GPUs and documents dropped", |u| {
        u.processes.clear();
        u.gpus.clear();
        u.foreign_processes.clear();
        u.documents.clear();
        u.gpu_events.clear();
    }),
];

fn frames_to(u: &mut UnitEvidence, n: usize) {
    for t in u.processes.iter_mut().flat_map(|p| &mut p.threads) {
        t.frames.truncate(n);
    }
}

/// Cuts `r` until it encodes in at most `max` bytes ([`ANSWER_CUTS`], in
/// order, each to every unit), naming each cut in the `missing` of each
/// unit it changed. Units that still do not fit are dropped from the end,
/// and the first unit says how many. Pure.
pub fn bound_answer(r: &mut EvidenceResult, max: usize) {
    use prost::Message as _;
    for (what, cut) in ANSWER_CUTS {
        if r.encoded_len() <= max {
            return;
        }
        for u in &mut r.units {
            let before = u.encoded_len();
            cut(u);
            if u.encoded_len() != before {
                u.missing
                    .push(format!("cut to keep the agent's answer within {max} bytes: {what}"));
            }
        }
    }
    let mut dropped = 0;
    while r.encoded_len() > max && r.units.len() > 1 {
        r.units.pop();
        dropped += 1;
    }
    if dropped > 0 {
        r.units[0].missing.push(format!(
            "{dropped} more units not sent: the agent's answer is at most {max} bytes"
        ));
    }
    // A last unit alone too big: only its notes are left; the oldest go
    // first, so the note of the drop stays.
    while r.encoded_len() > max && r.units.first().is_some_and(|u| u.missing.len() > 1) {
        r.units[0].missing.remove(0);
    }
}

// ------------------------------------------------------------------ edges

/// What a capture reads from: the units, the HTTP client, the GPU
/// reporter's latest reading and the configured py-spy.
#[derive(Clone)]
pub(crate) struct Sources {
    pub supervisor: Arc<Supervisor>,
    pub http: reqwest::Client,
    pub gpu: watch::Receiver<Arc<Latest>>,
    /// The agent config's `py_spy`.
    pub py_spy: Option<PathBuf>,
}

/// One capture's shared settings.
struct Capture {
    sources: Sources,
    /// The py-spy this capture runs (configured, else on PATH); None: none.
    py_spy: Option<PathBuf>,
    /// The command's deadline (ms), as named in `missing`.
    deadline_ms: u64,
    /// When every part is cut.
    until: Instant,
    /// Log lines per unit.
    log_lines: usize,
    /// The GPU reporter's reading when the command arrived.
    latest: Arc<Latest>,
}

impl Capture {
    fn cut(&self) -> EvidenceError {
        EvidenceError::Deadline {
            deadline_ms: self.deadline_ms,
        }
    }
}

/// Captures the evidence `cmd` asks for, counting its deadline from
/// `received_at` (when the command arrived).
pub(crate) async fn capture(
    sources: Sources,
    command_id: String,
    cmd: CaptureEvidence,
    received_at: Instant,
) -> EvidenceResult {
    let started = Instant::now();
    let deadline_ms = effective_deadline_ms(cmd.deadline_ms);
    let py_spy = find_py_spy(sources.py_spy.as_deref(), std::env::var_os("PATH").as_deref());
    let latest = Arc::clone(&sources.gpu.borrow());
    let c = Capture {
        py_spy: py_spy.clone(),
        deadline_ms,
        until: received_at + capture_budget(deadline_ms),
        log_lines: match cmd.log_lines {
            0 => DEFAULT_LOG_LINES,
            n => usize::try_from(n).unwrap_or(usize::MAX),
        },
        latest,
        sources,
    };
    let units = futures::future::join_all(cmd.units.iter().map(|u| capture_unit(&c, u))).await;
    let mut result = EvidenceResult {
        command_id,
        units,
        took_ms: 0,
        py_spy: py_spy.as_deref().map(|p| p.display().to_string()).unwrap_or_default(),
        py_spy_missing: if py_spy.is_some() {
            String::new()
        } else {
            PY_SPY_MISSING.to_owned()
        },
    };
    bound_answer(&mut result, MAX_ANSWER_BYTES);
    result.took_ms = ms(started.elapsed());
    result
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

async fn capture_unit(c: &Capture, name: &str) -> UnitEvidence {
    let mut ev = UnitEvidence {
        unit: name.to_owned(),
        ..Default::default()
    };
    let Some(config) = c.sources.supervisor.unit_config(name) else {
        ev.missing.push(format!("unknown unit {name:?}"));
        // No unit's secrets to know; the shapes still apply.
        seal_unit(&mut ev, &|t| pdwarden_security::shapes::by_shape(t).into_owned());
        return ev;
    };
    let pid = c.sources.supervisor.running_process(name).map(|(pid, _)| pid);
    ev.pid = pid.unwrap_or(0);
    let documents = futures::future::join_all(
        document_urls(config)
            .into_iter()
            .map(|(doc, url)| fetch_document(c, name, doc, url)),
    );
    let ((processes, started, mut missing), documents, log_tail) =
        tokio::join!(processes(c, pid), documents, log_tail(c, name));
    for (doc, cut) in documents {
        missing.extend(cut);
        ev.documents.push(doc);
    }
    match log_tail {
        Ok(Some(tail)) => ev.log_tail = tail,
        Ok(None) => missing.push("log tail: the unit's log is missing or empty".into()),
        Err(e) => missing.push(format!("log tail: {}", error_chain(&e))),
    }
    let gpu = gpu_evidence(&c.latest, name, started);
    ev.processes = processes;
    ev.started_unix_ms = started.unwrap_or(0);
    ev.gpus = gpu.gpus;
    ev.gpu_events = gpu.events;
    ev.foreign_processes = gpu.foreign_processes;
    ev.gpu_source = gpu.source;
    ev.gpu_unavailable = gpu.unavailable;
    ev.missing = missing;
    // Redacted and bounded on a blocking thread, by a hard deadline: a
    // third of the answer's margin past the capture's. A unit not sealed
    // by then is left out whole (nothing unredacted leaves the host), and
    // the capture says so; the answer still goes out in time.
    let supervisor = Arc::clone(&c.sources.supervisor);
    let unit = name.to_owned();
    let sealing = tokio::task::spawn_blocking(move || {
        seal_unit(&mut ev, &|t| {
            supervisor.redact_for(&unit, t).unwrap_or_else(|| t.to_owned())
        });
        ev
    });
    match tokio::time::timeout_at(c.until + ANSWER_MARGIN / 3, sealing).await {
        Ok(Ok(ev)) => ev,
        _ => UnitEvidence {
            unit: name.to_owned(),
            pid: pid.unwrap_or(0),
            missing: vec![format!(
                "the whole capture of this unit: not redacted by the {} ms deadline, so left out (nothing unredacted leaves the host)",
                c.deadline_ms
            )],
            ..Default::default()
        },
    }
}

/// Runs a blocking read on a blocking thread, cut at the deadline (the
/// thread itself is left to finish: a read of a wedged process's /proc can
/// hang, and must not hang the capture).
async fn blocking<T: Send + 'static>(
    c: &Capture,
    read: impl FnOnce() -> Result<T, EvidenceError> + Send + 'static,
) -> Result<T, EvidenceError> {
    match tokio::time::timeout_at(c.until, tokio::task::spawn_blocking(read)).await {
        Err(_) => Err(c.cut()),
        Ok(Err(join)) => Err(EvidenceError::Blocking(join)),
        Ok(Ok(r)) => r,
    }
}

async fn log_tail(c: &Capture, name: &str) -> Result<Option<String>, EvidenceError> {
    let supervisor = Arc::clone(&c.sources.supervisor);
    let (name, lines) = (name.to_owned(), c.log_lines);
    blocking(c, move || Ok(supervisor.log_tail(&name, lines))).await
}

/// The unit's processes, its process's start (ms since the epoch), and what
/// is missing.
async fn processes(c: &Capture, pid: Option<u32>) -> (Vec<ProcessStacks>, Option<u64>, Vec<String>) {
    let Some(pid) = pid else {
        return (Vec::new(), None, vec!["processes: the unit is not running".into()]);
    };
    let tree = match blocking(c, move || read_tree(pid)).await {
        Ok(t) => t,
        Err(e) => {
            return (
                Vec::new(),
                None,
                vec![format!("processes of pid {pid}: {}", error_chain(&e))],
            );
        }
    };
    let mut missing = Vec::new();
    if tree.more > 0 {
        missing.push(format!(
            "processes: {} more descendants of pid {pid} not captured (at most {MAX_PROCESSES})",
            tree.more
        ));
    }
    let stacks = futures::future::join_all(tree.processes.iter().map(|&(p, ppid)| process(c, p, ppid))).await;
    let processes = stacks
        .into_iter()
        .map(|(stack, cut)| {
            missing.extend(cut);
            stack
        })
        .collect();
    (processes, tree.started_unix_ms, missing)
}

/// The unit's process tree as /proc has it now.
struct Tree {
    /// (pid, ppid), the unit's process first.
    processes: Vec<(u32, u32)>,
    /// Descendants past [`MAX_PROCESSES`].
    more: usize,
    started_unix_ms: Option<u64>,
}

fn read_stat(path: &str) -> Result<Stat, EvidenceError> {
    let text = std::fs::read_to_string(path).map_err(|source| EvidenceError::Proc {
        path: path.to_owned(),
        source,
    })?;
    parse_stat(&text).ok_or_else(|| EvidenceError::ProcFormat { path: path.to_owned() })
}

fn read_tree(root: u32) -> Result<Tree, EvidenceError> {
    let root_stat = read_stat(&format!("/proc/{root}/stat"))?;
    let entries = std::fs::read_dir("/proc").map_err(|source| EvidenceError::Proc {
        path: "/proc".into(),
        source,
    })?;
    let table: Vec<(u32, u32)> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, read_stat(&format!("/proc/{pid}/stat")).ok()?.ppid)))
        .collect();
    let (pids, more) = descendants(root, &table, MAX_PROCESSES);
    let ppid_of = |p: u32| {
        if p == root {
            root_stat.ppid
        } else {
            table.iter().find(|(pid, _)| *pid == p).map_or(0, |(_, pp)| *pp)
        }
    };
    let started_unix_ms = started_unix_ms_of(root_stat.start_ticks);
    Ok(Tree {
        processes: pids.iter().map(|&p| (p, ppid_of(p))).collect(),
        more,
        started_unix_ms,
    })
}

/// One process's threads as /proc has them.
struct Threads {
    threads: Vec<ThreadStack>,
    /// Threads past [`MAX_THREADS`].
    more: usize,
}

fn read_threads(pid: u32) -> Result<Threads, EvidenceError> {
    let task_dir = format!("/proc/{pid}/task");
    let mut tids: Vec<u32> = std::fs::read_dir(&task_dir)
        .map_err(|source| EvidenceError::Proc {
            path: task_dir.clone(),
            source,
        })?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    let more = tids.len().saturating_sub(MAX_THREADS);
    tids.truncate(MAX_THREADS);
    let threads = tids
        .into_iter()
        .filter_map(|tid| {
            // A thread that ended since the listing is simply not there.
            let stat = read_stat(&format!("{task_dir}/{tid}/stat")).ok()?;
            let wchan = std::fs::read_to_string(format!("{task_dir}/{tid}/wchan")).unwrap_or_default();
            Some(ThreadStack {
                tid,
                name: stat.comm,
                state: stat.state,
                wchan: wchan.trim().to_owned(),
                ..Default::default()
            })
        })
        .collect();
    Ok(Threads { threads, more })
}

/// A process's command line; `[comm]` when it has none (a kernel thread,
/// a zombie). Read apart from the threads: it takes the process's memory
/// lock, which a wedged process may hold, and must not cost the threads.
fn read_command(pid: u32) -> Result<String, EvidenceError> {
    let path = format!("/proc/{pid}/cmdline");
    let raw = std::fs::read(&path).map_err(|source| EvidenceError::Proc { path, source })?;
    match command_line(&raw) {
        c if c.is_empty() => Ok(format!("[{}]", read_stat(&format!("/proc/{pid}/stat"))?.comm)),
        c => Ok(c),
    }
}

/// Reads `from` to its end, keeping its first `max` bytes; with `stop`,
/// stops reading once past `max` instead (the writer is then killed).
/// Returns the bytes kept and whether there were more.
async fn read_capped(
    mut from: impl tokio::io::AsyncRead + Unpin,
    max: usize,
    stop: bool,
) -> std::io::Result<(Vec<u8>, bool)> {
    use tokio::io::AsyncReadExt as _;
    let mut kept = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    let mut more = false;
    loop {
        let n = from.read(&mut chunk).await?;
        if n == 0 {
            return Ok((kept, more));
        }
        let room = max - kept.len();
        kept.extend_from_slice(&chunk[..n.min(room)]);
        if n > room {
            more = true;
            if stop {
                return Ok((kept, more));
            }
        }
    }
}

/// Runs `py-spy dump --nonblocking --json` on `pid`, reading at most
/// [`MAX_PY_SPY_OUTPUT_BYTES`] of its output (past it, py-spy is killed);
/// the child is killed if the capture is cut first.
async fn run_py_spy(py_spy: &Path, pid: u32) -> Result<PySpyDump, EvidenceError> {
    let spawn_error = |source| EvidenceError::PySpySpawn {
        program: py_spy.display().to_string(),
        source,
    };
    let mut child = tokio::process::Command::new(py_spy)
        .args(["dump", "--pid", &pid.to_string(), "--nonblocking", "--json"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(spawn_error)?;
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        unreachable!("both are piped");
    };
    let (out, err) = tokio::join!(
        async {
            let read = read_capped(stdout, MAX_PY_SPY_OUTPUT_BYTES, true).await;
            if matches!(read, Ok((_, true))) {
                // Its stderr ends when it does.
                let _ = child.start_kill();
            }
            read
        },
        read_capped(stderr, MAX_PY_SPY_STDERR_BYTES, false)
    );
    let status = child.wait().await.map_err(spawn_error)?;
    let (out, cut) = out.map_err(spawn_error)?;
    if !cut && !status.success() {
        let stderr = err.map(|(e, _)| e).unwrap_or_default();
        return Err(EvidenceError::PySpyFailed(py_spy_failure(
            &String::from_utf8_lossy(&stderr),
            &format!("py-spy {status}"),
        )));
    }
    // Parsed on a blocking thread: a hostile dump's megabytes of JSON
    // must not hold the runtime past the capture's deadline.
    tokio::task::spawn_blocking(move || parse_py_spy(&out, cut))
        .await
        .unwrap_or_else(|e| Err(EvidenceError::PySpyFailed(format!("reading its dump failed: {e}"))))
}

/// One process: /proc threads and py-spy's stacks, read in parallel; what
/// is missing.
async fn process(c: &Capture, pid: u32, ppid: u32) -> (ProcessStacks, Vec<String>) {
    let started = Instant::now();
    let mut missing = Vec::new();
    let spy = async {
        match &c.py_spy {
            None => None,
            Some(p) => Some(match tokio::time::timeout_at(c.until, run_py_spy(p, pid)).await {
                Err(_) => Err(c.cut()),
                Ok(r) => r,
            }),
        }
    };
    let (threads, command, spy) = tokio::join!(
        blocking(c, move || read_threads(pid)),
        blocking(c, move || read_command(pid)),
        spy
    );
    let mut stack = ProcessStacks {
        pid,
        ppid,
        method: "proc".into(),
        ..Default::default()
    };
    match command {
        // Redacted (the unit's own secrets may sit in its argv, and
        // anyone's URL credentials), then cut, by `seal_unit`.
        Ok(command) => stack.command = command,
        Err(e) => missing.push(format!("command line of pid {pid}: {}", error_chain(&e))),
    }
    match threads {
        Ok(t) => {
            stack.threads = t.threads;
            if t.more > 0 {
                missing.push(format!(
                    "threads of pid {pid}: {} more not captured (at most {MAX_THREADS})",
                    t.more
                ));
            }
        }
        Err(e) => missing.push(format!("threads of pid {pid}: {}", error_chain(&e))),
    }
    match spy {
        None => {}
        Some(Ok(dump)) => {
            if dump.cut {
                missing.push(format!(
                    "py-spy of pid {pid}: its output passed {MAX_PY_SPY_OUTPUT_BYTES} bytes; \
                     the {} threads read whole before the cut are kept",
                    dump.threads.len()
                ));
            }
            let merged = merge_py_spy(&mut stack.threads, dump.threads);
            missing.extend(merged.cuts(pid));
            if merged.any_frames {
                stack.method = "py-spy".into();
            } else {
                stack.py_spy_error = "py-spy returned no Python frames".into();
            }
        }
        Some(Err(e)) => {
            stack.py_spy_error = error_chain(&e);
            if matches!(e, EvidenceError::Deadline { .. }) {
                missing.push(format!("py-spy of pid {pid}: {}", stack.py_spy_error));
            }
        }
    }
    stack.took_ms = ms(started.elapsed());
    (stack, missing)
}

/// GETs one document, cut at the deadline; the document, and what is
/// missing when it was cut.
async fn fetch_document(c: &Capture, unit: &str, name: &str, url: String) -> (EvidenceDocument, Option<String>) {
    let started = Instant::now();
    let get = async {
        let mut resp = c
            .sources
            .http
            .get(&url)
            .send()
            .await
            .map_err(|source| EvidenceError::Http {
                url: url.clone(),
                source,
            })?;
        let status = resp.status().as_u16();
        let limit = MAX_DOCUMENT_BYTES + REDACTION_OVERLAP_BYTES;
        let mut body = Vec::new();
        let mut more = false;
        while let Some(chunk) = resp.chunk().await.map_err(|source| EvidenceError::Http {
            url: url.clone(),
            source,
        })? {
            let room = limit - body.len();
            if chunk.len() > room {
                body.extend_from_slice(&chunk[..room]);
                more = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        Ok::<_, EvidenceError>((status, body, more))
    };
    let mut doc = EvidenceDocument {
        name: name.to_owned(),
        url: url.clone(),
        ..Default::default()
    };
    let mut cut = None;
    match tokio::time::timeout_at(c.until, get).await {
        Err(_) => {
            doc.error = c.cut().to_string();
            cut = Some(format!("{name}: {}", doc.error));
        }
        Ok(Err(e)) => doc.error = error_chain(&e),
        Ok(Ok((status, body, more))) => {
            let supervisor = &c.sources.supervisor;
            let (text, truncated) = document_body(&body, more, |t| {
                supervisor.redact_for(unit, t).unwrap_or_else(|| t.to_owned())
            });
            doc.status = u32::from(status);
            doc.body = text;
            doc.truncated = truncated;
            if !(200..300).contains(&status) {
                doc.error = format!("http {status}");
            }
        }
    }
    doc.error = c.sources.supervisor.redact_for(unit, &doc.error).unwrap_or(doc.error);
    doc.took_ms = ms(started.elapsed());
    (doc, cut)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pdwarden_proto::v1::HostSnapshot;

    // Property: 0 means the default deadline; the capture keeps the answer
    // margin, and never gets less than the minimum.
    #[test]
    fn budget_keeps_the_margin() {
        assert_eq!(effective_deadline_ms(0), 5_000);
        assert_eq!(effective_deadline_ms(1_000), 1_000);
        assert_eq!(capture_budget(5_000), Duration::from_millis(4_500));
        assert_eq!(capture_budget(1_000), Duration::from_millis(700));
        assert_eq!(capture_budget(400), MIN_CAPTURE);
        assert_eq!(capture_budget(1), MIN_CAPTURE);
    }

    // Property: the fields are read after the last ')', whatever the
    // command name holds (spaces, parentheses), and the start time is
    // field 22.
    #[test]
    fn stat_is_parsed_after_the_last_paren() {
        // Fields 5 to 24, each its number but field 22 (the start time).
        let tail = "5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 123456 23 24";
        let s = parse_stat(&format!("4242 (python3) S 100 {tail}")).unwrap();
        assert_eq!(
            (s.comm.as_str(), s.state.as_str(), s.ppid, s.start_ticks),
            ("python3", "S", 100, 123456)
        );
        // utime, stime, cutime, cstime: fields 14 to 17.
        assert_eq!(s.cpu_ticks, 14 + 15 + 16 + 17);
        let s = parse_stat(&format!("77 (a) b (T) c) T 9 {tail}")).unwrap();
        assert_eq!((s.comm.as_str(), s.state.as_str(), s.ppid), ("a) b (T) c", "T", 9));
        let s = parse_stat(&format!("78 (kv transfer)) D 1 {tail}")).unwrap();
        assert_eq!((s.comm.as_str(), s.state.as_str()), ("kv transfer)", "D"));
        assert_eq!(parse_stat("12 (x) S"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    /// A process tree's CPU time counts its children's, running or reaped:
    /// a shell whose child burned CPU and exited still shows it. A pid that
    /// is gone has no reading.
    #[test]
    fn a_trees_cpu_time_counts_its_children() {
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "sh -c 'i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done'; exec sleep 30",
            ])
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut cpu = 0.0;
        for _ in 0..200 {
            cpu = tree_cpu_seconds(&[pid]).get(&pid).copied().unwrap_or(0.0);
            if cpu >= 0.2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // The busy child has exited by now, or is still running: either way its time is there.
        assert!(cpu >= 0.2, "the tree's CPU time stayed at {cpu} s");
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(tree_cpu_seconds(&[pid]).get(&pid), None, "a reaped pid has no reading");
    }

    // Property: the start is boot plus ticks at the kernel's tick rate.
    #[test]
    fn start_time_is_boot_plus_ticks() {
        assert_eq!(
            parse_btime("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n"),
            Some(1_700_000_000)
        );
        assert_eq!(parse_btime("cpu 1\n"), None);
        assert_eq!(start_unix_ms(12_345, 100, 1_700_000_000), 1_700_000_123_450);
        assert_eq!(start_unix_ms(7, 0, 1), 1_000 + 7_000);
    }

    // Property: descendants come breadth-first (siblings by pid), other
    // trees are left out, and past the limit the rest is counted.
    #[test]
    fn descendants_are_breadth_first_and_bounded() {
        let table = [
            (1, 0),
            (10, 1),
            (12, 10),
            (11, 10),
            (13, 12),
            (20, 1),
            (21, 20),
            (14, 11),
        ];
        assert_eq!(descendants(10, &table, 16), (vec![10, 11, 12, 14, 13], 0));
        assert_eq!(descendants(10, &table, 3), (vec![10, 11, 12], 2));
        assert_eq!(descendants(99, &table, 16), (vec![99], 0));
        // A (corrupt) cycle ends.
        assert_eq!(descendants(5, &[(5, 6), (6, 5)], 16), (vec![5, 6], 0));
    }

    // Property: a command line reads as one line, its raw read bounded;
    // sealed, it is cut to its limit after its redaction, so a secret
    // that straddles the cut is hidden whole.
    #[test]
    fn command_lines_are_one_line_and_bounded() {
        assert_eq!(
            command_line(b"python3\0-m\0sglang.launch_server\0"),
            "python3 -m sglang.launch_server"
        );
        assert_eq!(command_line(&[b'x'; 1 << 20]).len(), RAW_COMMAND_BYTES);
        assert_eq!(command_line(b""), "");
        let mut raw = vec![b'x'; MAX_COMMAND_CHARS - 20];
        raw.extend_from_slice(b"\0--router\0http://user:Straddl3dPassw0rd@router:8080/\0");
        let mut ev = UnitEvidence {
            processes: vec![ProcessStacks {
                command: command_line(&raw),
                ..Default::default()
            }],
            ..Default::default()
        };
        seal_unit(&mut ev, &shapes);
        let command = &ev.processes[0].command;
        assert_eq!(command.chars().count(), MAX_COMMAND_CHARS);
        assert!(!command.contains("Straddl"), "{command}");
    }

    /// The redaction by shape alone (a unit with no secret values).
    fn shapes(t: &str) -> String {
        pdwarden_security::shapes::by_shape(t).into_owned()
    }

    /// A hostile engine's capture, far past every bound: 7 processes of 41
    /// threads, each with 48 frames of 600 bytes, a 1 MiB log tail, three
    /// 1 MiB documents: about 11 MB encoded.
    fn hostile_unit(name: &str) -> UnitEvidence {
        let frame = format!("deep_{} (engine.py:1)", "x".repeat(580));
        UnitEvidence {
            unit: name.into(),
            pid: 10,
            processes: (0..7)
                .map(|p| ProcessStacks {
                    pid: 10 + p,
                    method: "py-spy".into(),
                    threads: (0..41)
                        .map(|t| ThreadStack {
                            tid: 100 + t,
                            name: format!("worker-{t}"),
                            state: "S".into(),
                            frames: vec![frame.clone(); MAX_FRAMES],
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            documents: ["metrics", "server_info", "workers"]
                .map(|d| EvidenceDocument {
                    name: d.into(),
                    body: "m 1\n".repeat(1 << 18),
                    status: 200,
                    ..Default::default()
                })
                .into(),
            log_tail: "a log line | ".repeat(1 << 16),
            ..Default::default()
        }
    }

    // Property (issue 48: a 14 MB answer broke the agent's link): an answer
    // far past the wire's limit leaves the agent within its bound, each
    // part sealed to its own bound first; every cut is named in the unit's
    // `missing`; the innermost frame of every thread survives.
    #[test]
    fn an_answer_far_past_the_wire_limit_is_cut_to_its_bound_and_names_the_cuts() {
        use prost::Message as _;
        let mut units: Vec<UnitEvidence> = ["prefill-0", "decode-0"].map(hostile_unit).into();
        for u in &mut units {
            seal_unit(u, &shapes);
        }
        let mut r = EvidenceResult {
            units,
            ..Default::default()
        };
        assert!(r.encoded_len() > 4 << 20, "the test's answer is past the wire's limit");
        bound_answer(&mut r, MAX_ANSWER_BYTES);
        assert!(r.encoded_len() <= MAX_ANSWER_BYTES, "{} bytes", r.encoded_len());
        for u in &r.units {
            let said = |what: &str| u.missing.iter().any(|m| m.contains(what));
            assert!(said("frames of pid 10: 1968 cut to 400 bytes"), "{:#?}", u.missing);
            assert!(said("log tail: cut to its last"), "{:#?}", u.missing);
            assert!(
                said("within 1048576 bytes: document bodies cut to 4 KiB"),
                "{:#?}",
                u.missing
            );
            assert!(said("within 1048576 bytes: frames cut to"), "{:#?}", u.missing);
            assert!(u.documents.iter().all(|d| d.truncated), "{:#?}", u.documents);
            let threads = u.processes.iter().flat_map(|p| &p.threads);
            assert!(threads.clone().count() > 0);
            assert!(
                threads
                    .clone()
                    .all(|t| t.frames.first().is_some_and(|f| f.starts_with("deep_x")))
            );
        }
        // Bounded whatever the number of units: those that cannot fit go,
        // and the first says how many.
        let noisy = |i: usize| {
            let mut u = UnitEvidence {
                unit: format!("u{i}"),
                missing: vec!["m".repeat(5000); 100],
                ..Default::default()
            };
            seal_unit(&mut u, &shapes);
            u
        };
        let mut many = EvidenceResult {
            units: (0..100).map(noisy).collect(),
            ..Default::default()
        };
        bound_answer(&mut many, MAX_ANSWER_BYTES);
        assert!(many.encoded_len() <= MAX_ANSWER_BYTES, "{} bytes", many.encoded_len());
        let last = many.units[0].missing.last().unwrap();
        assert!(
            last.ends_with("more units not sent: the agent's answer is at most 1048576 bytes"),
            "{last}"
        );
        let small = EvidenceResult {
            units: vec![UnitEvidence {
                unit: "u".into(),
                log_tail: "ok".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut same = small.clone();
        bound_answer(&mut same, MAX_ANSWER_BYTES);
        assert_eq!(same, small, "a small answer is left whole");
    }

    // Property: py-spy's output cut mid-array keeps the threads read whole
    // before the cut; cut before any, or not JSON, it is an error.
    #[test]
    fn a_py_spy_output_cut_mid_array_keeps_its_whole_threads() {
        let cut = &DUMP.as_bytes()[..DUMP.find("\"MainThread\"").unwrap()];
        let dump = parse_py_spy(cut, true).unwrap();
        assert!(dump.cut);
        assert_eq!(dump.threads.len(), 1);
        assert_eq!(dump.threads[0].thread_name.as_deref(), Some("kv-transfer"));
        let whole = parse_py_spy(DUMP.as_bytes(), false).unwrap();
        assert_eq!((whole.threads.len(), whole.cut), (3, false));
        assert!(matches!(
            parse_py_spy(b"[{\"os_thr", true),
            Err(EvidenceError::PySpyTooBig { .. })
        ));
        assert!(matches!(
            parse_py_spy(b"Error", false),
            Err(EvidenceError::PySpyOutput(_))
        ));
    }

    /// Every listed shape with `s` as its secret part.
    fn shaped(shape: usize, s: &str) -> String {
        match shape {
            0 => format!("server_args=ServerArgs(model_path='/m', api_key='{s}', port=1)"),
            1 => format!("ServerArgs(hf_token='hf_{s}')"),
            2 => format!("{{\"api_key\": \"{s}\"}}"),
            3 => format!("Authorization: Bearer {s}"),
            4 => format!("postgres://app:{s}@db:5432/x"),
            5 => format!("--router http://user:{s}@router:8080/"),
            6 => format!("password: {s}"),
            7 => format!("client_secret={s}"),
            8 => format!("using sk-{s} now"),
            _ => format!("token \"hf_{s}\" read"),
        }
    }

    /// A unit's evidence with `text` in every text field.
    fn everywhere(text: &str) -> UnitEvidence {
        let s = || text.to_owned();
        let gpu_process = || GpuProcess {
            command_line: s(),
            user: s(),
            kind: s(),
            unit: s(),
            ..Default::default()
        };
        UnitEvidence {
            unit: s(),
            processes: vec![ProcessStacks {
                command: s(),
                method: s(),
                py_spy_error: s(),
                threads: vec![ThreadStack {
                    name: s(),
                    state: s(),
                    wchan: s(),
                    frames: vec![s(), s()],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            documents: vec![EvidenceDocument {
                name: s(),
                url: s(),
                body: s(),
                error: s(),
                ..Default::default()
            }],
            log_tail: s(),
            gpus: vec![GpuDevice {
                uuid: s(),
                name: s(),
                throttle_reasons: vec![s()],
                read_errors: vec![s()],
                processes: vec![gpu_process()],
                ..Default::default()
            }],
            gpu_events: vec![GpuEvent {
                gpu_uuid: s(),
                kind: s(),
                detail: s(),
                ..Default::default()
            }],
            foreign_processes: vec![gpu_process()],
            missing: vec![s()],
            gpu_source: s(),
            gpu_unavailable: s(),
            ..Default::default()
        }
    }

    proptest::proptest! {
        // Property (issue 48): no secret of any listed shape survives any
        // field of a sealed capture, whatever surrounds it, however long
        // the text (cut after its redaction).
        #[test]
        fn no_listed_secret_survives_any_capture_field(
            s in "[A-Za-z0-9]{16,32}",
            shape in 0usize..10,
            before in "[ -~]{0,40}",
            pad in 0usize..1200,
            after in proptest::sample::select(vec!["", " ", ", x=1", ")", "\n", " | next"]),
        ) {
            let text = format!("{before}{} {}{after}", "y".repeat(pad), shaped(shape, &s));
            let mut ev = everywhere(&text);
            seal_unit(&mut ev, &shapes);
            let all = format!("{ev:?}");
            proptest::prop_assert!(!all.contains(&s), "{text:?} -> {all}");
        }
    }

    /// py-spy 0.4.3's `dump --json` of a thread blocked in a KV transfer
    /// wait and the main thread joining it (abridged from a real run).
    const DUMP: &str = r#"[
      {"pid": 20985, "thread_id": 140167734163136, "thread_name": "kv-transfer", "os_thread_id": 21027,
       "active": false, "owns_gil": false, "frames": [
         {"name": "kv_transfer_wait", "filename": "/tmp/t.py", "module": null, "short_filename": "t.py",
          "line": 5, "locals": null, "is_entry": true, "is_shim_entry": false},
         {"name": "Thread.run", "filename": "/usr/lib/python3.11/threading.py", "module": null,
          "short_filename": "threading.py", "line": 982, "locals": null, "is_entry": false, "is_shim_entry": false}],
       "process_info": null},
      {"pid": 20985, "thread_id": 140167749110656, "thread_name": "MainThread", "os_thread_id": 20985,
       "active": true, "owns_gil": true, "frames": [
         {"name": "<module>", "filename": "/tmp/t.py", "module": null, "short_filename": null, "line": 9,
          "locals": null, "is_entry": true, "is_shim_entry": true}],
       "process_info": null},
      {"pid": 20985, "thread_id": 1, "thread_name": null, "os_thread_id": 30000, "active": false,
       "owns_gil": false, "frames": []}
    ]"#;

    fn proc_thread(tid: u32, name: &str) -> ThreadStack {
        ThreadStack {
            tid,
            name: name.into(),
            state: "S".into(),
            wchan: "futex_wait_queue".into(),
            ..Default::default()
        }
    }

    // Property: py-spy's stacks join the /proc threads by OS thread id,
    // innermost frame first; its thread name replaces comm; /proc's state
    // and wait channel stay; a thread /proc missed is added.
    #[test]
    fn py_spy_merges_into_proc_threads_by_os_thread_id() {
        let dump: Vec<PySpyThread> = serde_json::from_str(DUMP).unwrap();
        let mut threads = vec![proc_thread(20985, "python3"), proc_thread(21027, "python3")];
        assert!(merge_py_spy(&mut threads, dump).any_frames);
        assert_eq!(threads[1].name, "kv-transfer");
        assert_eq!(
            threads[1].frames,
            ["kv_transfer_wait (t.py:5)", "Thread.run (threading.py:982)"]
        );
        assert_eq!(
            (threads[1].state.as_str(), threads[1].wchan.as_str()),
            ("S", "futex_wait_queue")
        );
        assert_eq!(threads[0].name, "MainThread");
        assert_eq!(threads[0].frames, ["<module> (/tmp/t.py:9)"]);
        assert!(threads[0].active && threads[0].owns_gil);
        assert_eq!((threads[2].tid, threads[2].name.as_str()), (30000, ""));
        assert!(threads[2].frames.is_empty());
    }

    // Property: frames are bounded per thread; a full thread list takes no
    // more threads; a dump without frames says so.
    #[test]
    fn py_spy_merge_is_bounded() {
        let frame = serde_json::json!({"name": "f", "short_filename": "x.py", "line": 1});
        let deep = serde_json::json!([{"os_thread_id": 1, "frames": vec![frame; 100]}, {"os_thread_id": 99999}]);
        let dump: Vec<PySpyThread> = serde_json::from_value(deep).unwrap();
        let mut threads: Vec<ThreadStack> = (1..=MAX_THREADS as u32).map(|t| proc_thread(t, "w")).collect();
        let merged = merge_py_spy(&mut threads, dump);
        assert_eq!(
            merged,
            Merged {
                any_frames: true,
                deep_threads: 1,
                dropped_threads: 1
            }
        );
        assert_eq!(
            merged.cuts(7),
            [
                format!("frames of pid 7: 1 threads cut to their {MAX_FRAMES} innermost"),
                format!("py-spy threads of pid 7: 1 more not captured (at most {MAX_THREADS})")
            ]
        );
        assert_eq!(threads[0].frames.len(), MAX_FRAMES);
        assert_eq!(threads.len(), MAX_THREADS);
        let idle: Vec<PySpyThread> = serde_json::from_str(r#"[{"os_thread_id": 1, "frames": []}]"#).unwrap();
        assert!(!merge_py_spy(&mut vec![proc_thread(1, "w")], idle).any_frames);
    }

    // Property: a py-spy failure is its first "Error:" line (py-spy prints
    // a backtrace after it), else its first line, else the exit status.
    #[test]
    fn py_spy_failure_is_its_error_line() {
        let stderr = "\nError: Failed to find python version from target process\n\nStack backtrace:\n   0: anyhow\n";
        assert_eq!(
            py_spy_failure(stderr, "py-spy exit status: 1"),
            "Error: Failed to find python version from target process"
        );
        assert_eq!(py_spy_failure("permission denied\n", "x"), "permission denied");
        assert_eq!(py_spy_failure("", "py-spy exit status: 1"), "py-spy exit status: 1");
    }

    fn unit(toml: &str) -> UnitConfig {
        let c = crate::AgentConfig::from_toml_str(&format!(
            "host='h'\norchestrator='http://127.0.0.1:1'\nstate_dir='/tmp'\n[[unit]]\nname='u'\n{toml}"
        ))
        .unwrap();
        c.units[0].clone()
    }

    // Property: each kind of unit is asked for its own documents, at the
    // URLs the watch and the router API use.
    #[test]
    fn documents_follow_the_engine_kind() {
        let names = |u: &UnitConfig| document_urls(u);
        assert_eq!(
            names(&unit("role='prefill'\nargv=['x']\nbase_url='http://127.0.0.1:30000/'")),
            [
                ("metrics", "http://127.0.0.1:30000/metrics".to_owned()),
                ("server_info", "http://127.0.0.1:30000/get_server_info".to_owned())
            ]
        );
        assert_eq!(
            names(&unit(
                "role='decode'\nargv=['x']\nbase_url='http://127.0.0.1:8000'\nengine='vllm'"
            )),
            [
                ("metrics", "http://127.0.0.1:8000/metrics".to_owned()),
                ("version", "http://127.0.0.1:8000/version".to_owned()),
                ("models", "http://127.0.0.1:8000/v1/models".to_owned())
            ]
        );
        let router = unit("role='router'\nbase_url='http://127.0.0.1:8080'\nargv=['r', '--prometheus-port', '29001']");
        assert_eq!(
            names(&router),
            [
                ("metrics", "http://127.0.0.1:29001/metrics".to_owned()),
                ("workers", "http://127.0.0.1:8080/workers".to_owned())
            ]
        );
        let vllm_router = unit("role='router'\nargv=['x']\nbase_url='http://127.0.0.1:8080'\nengine='vllm-router'");
        assert_eq!(
            names(&vllm_router)[1],
            ("workers", "http://127.0.0.1:8080/workers".to_owned())
        );
    }

    // Property: a body is redacted before it is cut, so a secret that
    // straddles the cut does not leave its first half; the cut is on a
    // character boundary and said.
    #[test]
    fn bodies_are_redacted_then_cut() {
        let redact = |t: &str| t.replace("hf_secret123", "[redacted]");
        assert_eq!(
            document_body(b"a hf_secret123 b", false, redact),
            ("a [redacted] b".into(), false)
        );
        let mut long = vec![b'x'; MAX_DOCUMENT_BYTES - 4];
        long.extend_from_slice(b"hf_secret123 tail");
        let (text, truncated) = document_body(&long, false, redact);
        assert!(
            truncated && text.len() == MAX_DOCUMENT_BYTES && !text.contains("hf_"),
            "{}",
            &text[text.len() - 20..]
        );
        let mut wide = vec![b'x'; MAX_DOCUMENT_BYTES - 1];
        wide.extend_from_slice("é".as_bytes());
        let (text, truncated) = document_body(&wide, false, |t| t.to_owned());
        assert!(truncated && text.len() == MAX_DOCUMENT_BYTES - 1);
        assert!(
            document_body(b"short", true, |t| t.to_owned()).1,
            "more past the read is a cut"
        );
    }

    fn device(index: u32, processes: Vec<GpuProcess>) -> GpuDevice {
        GpuDevice {
            index,
            uuid: format!("GPU-{index}"),
            processes,
            ..Default::default()
        }
    }

    fn gpu_process(pid: u32, unit: &str) -> GpuProcess {
        GpuProcess {
            pid,
            unit: unit.into(),
            foreign: unit.is_empty(),
            ..Default::default()
        }
    }

    fn xid(at_unix_ms: u64, xid: u64) -> GpuEvent {
        GpuEvent {
            at_unix_ms,
            gpu_index: 1,
            kind: "xid".into(),
            xid,
            detail: "GPU has fallen off the bus".into(),
            ..Default::default()
        }
    }

    fn latest() -> Latest {
        Latest {
            snapshot: Some(HostSnapshot {
                gpu_source: "fake".into(),
                gpus: vec![
                    device(0, vec![gpu_process(10, "prefill-0"), gpu_process(99, "")]),
                    device(1, vec![gpu_process(20, "decode-0")]),
                    device(2, vec![gpu_process(98, "")]),
                ],
                ..Default::default()
            }),
            recent_events: [xid(1_000, 31), xid(2_000, 79)].into(),
            ..Default::default()
        }
    }

    // Property: a unit's GPUs are those holding its processes, with the
    // foreign processes on them; a unit on no GPU sees every GPU; events
    // are those since its process started, all of them when it is not
    // running, from every GPU.
    #[test]
    fn gpu_evidence_selects_the_units_devices_and_events() {
        let l = latest();
        let p = gpu_evidence(&l, "prefill-0", Some(1_500));
        assert_eq!(p.gpus.iter().map(|g| g.index).collect::<Vec<_>>(), [0]);
        assert_eq!(p.foreign_processes.iter().map(|x| x.pid).collect::<Vec<_>>(), [99]);
        assert_eq!(p.events.iter().map(|e| e.xid).collect::<Vec<_>>(), [79]);
        assert_eq!((p.source.as_str(), p.unavailable.as_str()), ("fake", ""));

        let r = gpu_evidence(&l, "router-0", Some(2_000));
        assert_eq!(r.gpus.len(), 3);
        assert_eq!(r.foreign_processes.iter().map(|x| x.pid).collect::<Vec<_>>(), [99, 98]);
        assert_eq!(r.events.iter().map(|e| e.xid).collect::<Vec<_>>(), [79]);

        let stopped = gpu_evidence(&l, "decode-0", None);
        assert_eq!(stopped.gpus.iter().map(|g| g.index).collect::<Vec<_>>(), [1]);
        assert_eq!(stopped.events.len(), 2);

        let none = gpu_evidence(&Latest::default(), "prefill-0", Some(1));
        assert!(none.gpus.is_empty() && !none.unavailable.is_empty());
    }

    // Property: the configured py-spy wins; else the first executable
    // `py-spy` on PATH; else none.
    #[test]
    fn py_spy_is_found_in_config_then_path() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let (plain, exe) = (dir.path().join("plain"), dir.path().join("exe"));
        std::fs::create_dir_all(&plain).unwrap();
        std::fs::create_dir_all(&exe).unwrap();
        std::fs::write(plain.join("py-spy"), "").unwrap();
        std::fs::write(exe.join("py-spy"), "").unwrap();
        std::fs::set_permissions(exe.join("py-spy"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = std::env::join_paths([&plain, &exe]).unwrap();
        assert_eq!(find_py_spy(None, Some(&path)), Some(exe.join("py-spy")));
        assert_eq!(
            find_py_spy(Some(Path::new("/opt/py-spy")), Some(&path)),
            Some("/opt/py-spy".into())
        );
        assert_eq!(find_py_spy(None, Some(plain.as_os_str())), None);
        assert_eq!(find_py_spy(None, None), None);
    }
}
