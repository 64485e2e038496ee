//! Evidence before the kill (issue 35): what a wedged pair looked like just
//! before pdwarden stopped its units.
//!
//! An automatic recovery destroys the only evidence of why a pair wedged —
//! the stuck processes' stacks, the scheduler's queues, the GPU's error
//! state — and operators then restart, wait for the next occurrence and
//! argue (the seeds are full of it). SGLang's own watchdog dumps its
//! schedulers' stacks with py-spy before it kills them
//! (`python/sglang/srt/managers/scheduler.py`, `pyspy_dump_schedulers`);
//! pdwarden does it across the whole pair, every engine and the router,
//! before its co-restart stops anything.
//!
//! These are the records: [`Capture`] is journaled whole with the operation
//! (entry `evidence`, cut to [`MAX_CAPTURE_BYTES`]) and read back by
//! `pdwarden history NAME --evidence OP`; [`CaptureSummary`] rides on the
//! operation's report (what was captured, how long it took, what was not,
//! and one line per unit saying where its threads wait:
//! [`crate::judge::stacks`]). Built from the agents' answers
//! ([`UnitCapture::from_proto`]); no I/O.

use std::collections::BTreeMap;

use pdwarden_proto::v1::{EvidenceDocument, ProcessStacks, ThreadStack, UnitEvidence};
use serde::{Deserialize, Serialize};

use crate::host::{GpuEventView, GpuProcessView, GpuView, event_view, gpu_view, process_view};

/// The whole capture of one operation, at most this many bytes of JSON in
/// the journal: document bodies, then log tails, then frames are cut (and
/// the capture says so) until it fits.
pub const MAX_CAPTURE_BYTES: usize = 512 * 1024;
/// The capture's default deadline, every unit together.
pub const DEFAULT_DEADLINE_MS: u64 = 5_000;

/// Everything captured before an operation stopped a wedged pair.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Capture {
    /// Why the capture was taken ("automatic recovery: …", "the operator
    /// restarted a pair the watch judged wedged: …").
    pub why: String,
    pub deadline_ms: u64,
    /// From the first command sent to the last answer (or the deadline).
    pub took_ms: u64,
    /// Something was not captured (see `missing`, and each unit's).
    pub partial: bool,
    /// What is missing at the capture's level: an agent that did not
    /// answer by the deadline, a unit whose host is not connected.
    pub missing: Vec<String>,
    /// One line per unit: where its threads wait.
    pub readings: Vec<StackReading>,
    pub units: Vec<UnitCapture>,
    /// Parts were cut to keep the capture within [`MAX_CAPTURE_BYTES`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cut: Vec<String>,
    /// Units of the pair its agent reports not running (never started, or
    /// stopped on command): nothing of them to capture, and not missing
    /// (issue 49: the demo's first restart, of units never started, opened
    /// with nine "not captured" lines and PARTIAL).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_running: Vec<String>,
}

impl Capture {
    /// Whether no unit of the pair was running: nothing was asked for.
    pub fn nothing_to_capture(&self) -> bool {
        self.units.is_empty() && !self.not_running.is_empty()
    }
}

/// One unit's part of a capture.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UnitCapture {
    pub host: String,
    pub unit: String,
    /// "prefill", "decode" or "router".
    pub role: String,
    /// The unit's process; `None`: not running.
    pub pid: Option<u32>,
    pub started_unix_ms: Option<u64>,
    pub processes: Vec<ProcessCapture>,
    pub documents: Vec<DocumentCapture>,
    pub log_tail: String,
    pub gpu_source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_unavailable: Option<String>,
    pub gpus: Vec<GpuView>,
    pub gpu_events: Vec<GpuEventView>,
    pub foreign_processes: Vec<GpuProcessView>,
    /// The py-spy the agent used; `None`: none found (threads from /proc).
    pub py_spy: Option<String>,
    pub missing: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessCapture {
    pub pid: u32,
    pub ppid: u32,
    pub command: String,
    /// "py-spy" (Python frames) or "proc" (state and wait channel only).
    pub method: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub py_spy_error: String,
    pub took_ms: u64,
    pub threads: Vec<ThreadCapture>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadCapture {
    pub tid: u32,
    pub name: String,
    /// The /proc state letter (T: stopped by a signal, t: by a tracer).
    pub state: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub wchan: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub active: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub owns_gil: bool,
    /// Python frames, innermost first: "function (file:line)".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frames: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DocumentCapture {
    pub name: String,
    pub url: String,
    /// `None`: no answer.
    pub status: Option<u32>,
    pub body: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    pub took_ms: u64,
}

/// What the operation's report says of its capture (the whole capture is
/// in the journal).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CaptureSummary {
    pub why: String,
    pub took_ms: u64,
    pub deadline_ms: u64,
    pub partial: bool,
    /// Every `missing` of the capture and its units, "host/unit: …".
    pub missing: Vec<String>,
    pub readings: Vec<StackReading>,
    /// Captured units, and how many threads carried Python frames.
    pub units: usize,
    pub python_threads: usize,
    /// Units not running by their agents' report, nothing to capture of
    /// them ([`Capture::not_running`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_running: Vec<String>,
}

impl CaptureSummary {
    /// The one line `history` prints under an operation that kept a
    /// capture: that it exists, why, how much, and how to read it (its
    /// contents need the `forensics` or `operate` role: issue 48).
    pub fn one_line(&self, pair: &str, operation_id: &str) -> String {
        if self.units == 0 && !self.not_running.is_empty() {
            return self.nothing_line();
        }
        format!(
            "evidence: captured before the restart ({}; {} units, {} Python threads, {} ms{}): pdwarden history {pair} --evidence {operation_id}",
            self.why,
            self.units,
            self.python_threads,
            self.took_ms,
            if self.partial { ", PARTIAL" } else { "" }
        )
    }

    /// The report's lines: what was captured before the restart, each
    /// unit's reading, what is missing, where the whole capture is.
    pub fn lines(&self, pair: &str, operation_id: &str) -> Vec<String> {
        if self.units == 0 && !self.not_running.is_empty() {
            return vec![format!("\n{}", self.nothing_line())];
        }
        let mut out = vec![format!(
            "\nevidence before the restart ({}; captured in {} ms of {} ms{}):",
            self.why,
            self.took_ms,
            self.deadline_ms,
            if self.partial { ", PARTIAL" } else { "" }
        )];
        out.extend(self.readings.iter().map(|r| format!("  {}", r.line)));
        out.extend(self.missing.iter().map(|m| format!("  not captured: {m}")));
        out.extend(
            self.not_running
                .iter()
                .map(|u| format!("  nothing to capture: {u} is not running (its agent's report)")),
        );
        out.push(format!(
            "  the whole capture: pdwarden history {pair} --evidence {operation_id}"
        ));
        out
    }
}

impl CaptureSummary {
    /// The one line of a capture that asked for nothing: no unit ran.
    fn nothing_line(&self) -> String {
        format!(
            "evidence: nothing captured before the restart ({}): no unit of the pair was running ({}: never started, or stopped on command, by their agents' report)",
            self.why,
            self.not_running.join(", ")
        )
    }
}

impl UnitCapture {
    /// An agent's answer for one unit, with the unit's place in the pair.
    pub fn from_proto(host: &str, role: &str, e: UnitEvidence, py_spy: &str) -> Self {
        UnitCapture {
            host: host.into(),
            unit: e.unit,
            role: role.into(),
            pid: (e.pid != 0).then_some(e.pid),
            started_unix_ms: (e.started_unix_ms != 0).then_some(e.started_unix_ms),
            processes: e.processes.into_iter().map(process).collect(),
            documents: e.documents.into_iter().map(document).collect(),
            log_tail: e.log_tail,
            gpu_source: e.gpu_source,
            gpu_unavailable: (!e.gpu_unavailable.is_empty()).then_some(e.gpu_unavailable),
            gpus: e.gpus.into_iter().map(gpu_view).collect(),
            // The agent's own time is the one that matters here.
            gpu_events: e
                .gpu_events
                .into_iter()
                .map(|g| {
                    let at = g.at_unix_ms;
                    event_view(g, at)
                })
                .collect(),
            foreign_processes: e.foreign_processes.into_iter().map(process_view).collect(),
            py_spy: (!py_spy.is_empty()).then(|| py_spy.to_string()),
            missing: e.missing,
        }
    }

    /// A unit nothing was captured of, and why.
    pub fn not_captured(host: &str, unit: &str, role: &str, why: String) -> Self {
        UnitCapture {
            host: host.into(),
            unit: unit.into(),
            role: role.into(),
            missing: vec![why],
            ..Default::default()
        }
    }
}

fn process(p: ProcessStacks) -> ProcessCapture {
    ProcessCapture {
        pid: p.pid,
        ppid: p.ppid,
        command: p.command,
        method: p.method,
        py_spy_error: p.py_spy_error,
        took_ms: p.took_ms,
        threads: p.threads.into_iter().map(thread).collect(),
    }
}

fn thread(t: ThreadStack) -> ThreadCapture {
    ThreadCapture {
        tid: t.tid,
        name: t.name,
        state: t.state,
        wchan: t.wchan,
        active: t.active,
        owns_gil: t.owns_gil,
        frames: t.frames,
    }
}

fn document(d: EvidenceDocument) -> DocumentCapture {
    DocumentCapture {
        name: d.name,
        url: d.url,
        status: (d.status != 0).then_some(d.status),
        body: d.body,
        truncated: d.truncated,
        error: d.error,
        took_ms: d.took_ms,
    }
}

impl Capture {
    /// Every `missing`, the capture's and each unit's ("host/unit: …").
    pub fn all_missing(&self) -> Vec<String> {
        let mut all = self.missing.clone();
        for u in &self.units {
            all.extend(u.missing.iter().map(|m| format!("{}/{}: {m}", u.host, u.unit)));
        }
        all
    }

    pub fn summary(&self) -> CaptureSummary {
        CaptureSummary {
            why: self.why.clone(),
            took_ms: self.took_ms,
            deadline_ms: self.deadline_ms,
            partial: self.partial,
            missing: self.all_missing(),
            readings: self.readings.clone(),
            units: self.units.len(),
            not_running: self.not_running.clone(),
            python_threads: self
                .units
                .iter()
                .flat_map(|u| &u.processes)
                .flat_map(|p| &p.threads)
                .filter(|t| !t.frames.is_empty())
                .count(),
        }
    }

    /// Every part of the capture as `history --evidence` prints it: the
    /// readings, then per unit its threads (Python frames in full; threads
    /// with none, counted by state and wait channel), its documents (the
    /// first `body_lines` of each), its log tail, GPUs and GPU events.
    pub fn render(&self, body_lines: usize) -> Vec<String> {
        let mut out = vec![
            format!("why: {}", self.why),
            format!(
                "captured in {} ms (deadline {} ms){}",
                self.took_ms,
                self.deadline_ms,
                if self.partial { "; PARTIAL" } else { "" }
            ),
        ];
        out.extend(self.readings.iter().map(|r| format!("  {}", r.line)));
        out.extend(self.all_missing().iter().map(|m| format!("  not captured: {m}")));
        out.extend(self.cut.iter().map(|c| format!("  cut to fit the journal: {c}")));
        for u in &self.units {
            out.push(String::new());
            let pid = u.pid.map_or("not running".to_string(), |p| format!("pid {p}"));
            out.push(format!("== {}/{} ({}, {pid})", u.host, u.unit, u.role));
            for p in &u.processes {
                out.push(format!(
                    "  process {} (parent {}, {}, {} ms): {}",
                    p.pid, p.ppid, p.method, p.took_ms, p.command
                ));
                if !p.py_spy_error.is_empty() {
                    out.push(format!("    py-spy: {}", p.py_spy_error));
                }
                let mut plain: BTreeMap<String, usize> = BTreeMap::new();
                for t in &p.threads {
                    if t.frames.is_empty() {
                        let wchan = if t.wchan.is_empty() || t.wchan == "0" {
                            "-"
                        } else {
                            &t.wchan
                        };
                        *plain.entry(format!("state {} in {wchan}", t.state)).or_default() += 1;
                        continue;
                    }
                    let flags = match (t.active, t.owns_gil) {
                        (_, true) => ", holds the GIL",
                        (true, false) => ", active",
                        _ => "",
                    };
                    out.push(format!("    thread {} {:?} (state {}{flags}):", t.tid, t.name, t.state));
                    out.extend(t.frames.iter().map(|f| format!("      {f}")));
                }
                for (what, n) in plain {
                    out.push(format!("    {n} thread(s) {what}"));
                }
            }
            for d in &u.documents {
                let status = d.status.map_or("no answer".to_string(), |s| format!("HTTP {s}"));
                let err = if d.error.is_empty() {
                    String::new()
                } else {
                    format!(": {}", d.error)
                };
                let cut = if d.truncated { ", cut" } else { "" };
                out.push(format!(
                    "  {} {} → {status}, {} bytes{cut}, {} ms{err}",
                    d.name,
                    d.url,
                    d.body.len(),
                    d.took_ms
                ));
                let lines: Vec<&str> = d.body.lines().collect();
                out.extend(lines.iter().take(body_lines).map(|l| format!("    | {l}")));
                if lines.len() > body_lines {
                    out.push(format!(
                        "    | … {} more lines (--json for all)",
                        lines.len() - body_lines
                    ));
                }
            }
            if !u.log_tail.is_empty() {
                out.push("  log tail:".into());
                out.extend(u.log_tail.lines().map(|l| format!("    | {l}")));
            }
            match &u.gpu_unavailable {
                Some(why) => out.push(format!("  GPUs ({}): unavailable: {why}", u.gpu_source)),
                None => {
                    for g in &u.gpus {
                        out.push(format!(
                            "  GPU {} {} ({}): {} of {} MiB used, utilisation {}, ECC uncorrected {}, retired pages {}",
                            g.index,
                            g.uuid,
                            g.name,
                            g.memory_used_bytes >> 20,
                            g.memory_total_bytes >> 20,
                            g.utilization_gpu_pct.map_or("?".into(), |p| format!("{p}%")),
                            g.ecc.map_or("n/a".into(), |e| e.volatile_uncorrected.to_string()),
                            g.retired_pages.map_or("n/a".into(), |p| p.to_string()),
                        ));
                    }
                }
            }
            for e in &u.gpu_events {
                let what = match (e.xid, &e.meaning) {
                    (Some(x), Some(m)) => format!("Xid {x} ({m})"),
                    (Some(x), None) => format!("Xid {x}"),
                    _ => e.kind.clone(),
                };
                out.push(format!(
                    "  GPU event on GPU {} at {} ms: {what} {}",
                    e.gpu_index, e.at_unix_ms, e.detail
                ));
            }
            for p in &u.foreign_processes {
                out.push(format!(
                    "  foreign GPU process {} ({}): {}",
                    p.pid, p.user, p.command_line
                ));
            }
        }
        out
    }

    /// Cuts the capture until its JSON is at most `max` bytes: document
    /// bodies first (each to 4 KiB, then none), then log tails (to their
    /// last 20 lines, then none), then frames (each thread to its 12
    /// innermost). Each cut is named in `cut`. Pure.
    pub fn bound(&mut self, max: usize) {
        let size = |c: &Capture| serde_json::to_vec(c).map_or(usize::MAX, |v| v.len());
        if size(self) <= max {
            return;
        }
        type Cut = (&'static str, fn(&mut UnitCapture));
        let cuts: [Cut; 5] = [
            ("document bodies cut to 4 KiB", |u| {
                for d in &mut u.documents {
                    d.truncated |= cut_to(&mut d.body, 4096);
                }
            }),
            ("log tails cut to 20 lines", |u| {
                let lines: Vec<&str> = u.log_tail.lines().collect();
                if lines.len() > 20 {
                    u.log_tail = lines[lines.len() - 20..].join("\n");
                }
            }),
            ("frames cut to each thread's 12 innermost", |u| {
                for t in u.processes.iter_mut().flat_map(|p| &mut p.threads) {
                    t.frames.truncate(12);
                }
            }),
            ("document bodies dropped", |u| {
                for d in &mut u.documents {
                    d.truncated |= !d.body.is_empty();
                    d.body.clear();
                }
            }),
            ("log tails dropped", |u| u.log_tail.clear()),
        ];
        for (what, cut) in cuts {
            self.units.iter_mut().for_each(cut);
            self.cut.push(what.to_string());
            if size(self) <= max {
                return;
            }
        }
        // Still too big (thousands of threads): threads beyond 64 per process.
        for p in self.units.iter_mut().flat_map(|u| &mut u.processes) {
            p.threads.truncate(64);
        }
        self.cut.push("threads cut to 64 per process".into());
    }
}

/// Where a unit's threads wait, most telling first (the unit's reading is
/// its threads' first in this order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Wait {
    /// State T or t: SIGSTOP, or a debugger holding it.
    Stopped,
    /// A KV transfer between prefill and decode.
    KvTransfer,
    /// A collective (NCCL, torch.distributed) across ranks.
    Collective,
    /// Uninterruptible sleep in the kernel (state D): a driver call, I/O.
    Kernel,
    /// A forward pass (or sampling) of the model.
    Forward,
    /// Waiting for work: the engine is idle.
    Idle,
    /// Nothing recognised (frames or /proc only).
    Unknown,
    /// The unit was not running.
    NotRunning,
    /// Nothing was captured of it.
    NothingCaptured,
}

/// One unit's line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackReading {
    pub host: String,
    pub unit: String,
    pub wait: Wait,
    pub line: String,
}

/// Cuts `s` to at most `max` bytes at a character boundary; true if it cut.
fn cut_to(s: &mut String, max: usize) -> bool {
    if s.len() <= max {
        return false;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn big_unit(i: usize) -> UnitCapture {
        UnitCapture {
            host: "h".into(),
            unit: format!("u{i}"),
            documents: vec![DocumentCapture {
                name: "metrics".into(),
                body: "x".repeat(200_000),
                ..Default::default()
            }],
            log_tail: (0..2000).map(|n| format!("line {n}")).collect::<Vec<_>>().join("\n"),
            processes: vec![ProcessCapture {
                pid: 1,
                threads: (0..50)
                    .map(|t| ThreadCapture {
                        tid: t,
                        frames: (0..48).map(|f| format!("frame_{f} (file.py:{f})")).collect(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_capture_is_cut_to_its_bound_and_says_what_was_cut() {
        let mut c = Capture {
            units: (0..3).map(big_unit).collect(),
            ..Default::default()
        };
        c.bound(MAX_CAPTURE_BYTES);
        let size = serde_json::to_vec(&c).unwrap().len();
        assert!(size <= MAX_CAPTURE_BYTES, "{size} bytes");
        assert!(!c.cut.is_empty());
        assert!(c.units.iter().all(|u| u.documents[0].truncated));
        // What matters most survives: each thread's innermost frames.
        assert!(c.units[0].processes[0].threads.iter().all(|t| !t.frames.is_empty()));
    }

    #[test]
    fn a_small_capture_is_left_whole() {
        let mut c = Capture {
            units: vec![UnitCapture {
                unit: "u".into(),
                log_tail: "a\nb".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let before = c.clone();
        c.bound(MAX_CAPTURE_BYTES);
        assert_eq!(c, before);
    }

    #[test]
    fn cutting_never_splits_a_character() {
        let mut s = "é".repeat(10);
        assert!(cut_to(&mut s, 5));
        assert_eq!(s, "éé");
    }
}
