//! The durable journal of every operation (DESIGN.md 4).
//!
//! An operation is recorded before its first command is sent, each state
//! transition is appended before the commands of that state go out, and
//! every phase event and probe is appended as it arrives; the final report is
//! stored whole. "One running operation per pair" and "a request id runs at
//! most once" are properties of the store, not of a process's memory, so they
//! survive an orchestrator restart — and, on etcd, a change of leader.
//!
//! The journal is one front ([`Journal`]: conclusions kept and retried when
//! the store refuses them, the operations' metrics, test failpoints) over a
//! [`Store`] chosen by the config's `journal` field (DESIGN.md 15):
//! - [`sqlite`]: `sqlite:PATH` (or a bare path), the default — one file owned
//!   by exactly one orchestrator;
//! - `etcd` (cargo feature `etcd`): `etcd:ENDPOINTS` — several orchestrators,
//!   one leader, every write fenced by the leader's lease (issue 19).

#[cfg(feature = "etcd")]
pub mod etcd;
pub mod sqlite;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use pdwarden_model::status::{OperationRecord, PendingConclusion};

/// A command an operation sent to an agent, journaled (kind `command`)
/// *before* it is sent: what a resumed operation reads back to adopt the
/// commands already under way by their ids instead of sending them again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandEntry {
    pub command_id: String,
    pub action: CommandAction,
    /// `host/unit`.
    pub unit: String,
    /// A start that replaces the running instance.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restart: bool,
}

/// What a journaled command asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandAction {
    Start,
    /// A unit config change (a gate's apply or restore).
    UnitConfig,
    /// A gate's `/proc` inspection.
    Inspect,
    /// A gate's benchmark.
    Benchmark,
    #[serde(other)]
    Other,
}

/// The kind a [`CommandEntry`] is journaled under.
pub const COMMAND: &str = "command";

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The etcd journal could not be read or written: etcd is unreachable
    /// or has no quorum. Nothing that needed the write was done.
    #[error(
        "etcd journal unavailable ({error}): etcd is unreachable or has lost its quorum; no step starts until it answers, running units are left as they are"
    )]
    Unavailable { error: String },
    /// The TLS files for etcd (`leadership.etcd_tls`) could not be read.
    #[error("field `leadership.etcd_tls`: {error}")]
    EtcdTls { error: String },
    /// This orchestrator's etcd lease (its leadership) is gone: a write it
    /// asked for was refused by the fence, and it writes and sends nothing more.
    #[error(
        "this orchestrator no longer leads ({why}); it writes and sends nothing more: the new leader takes the operation over"
    )]
    NotLeader { why: String },
    #[error("a journal entry could not be encoded or read back: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("pair {pair} is busy: operation {operation_id} is running")]
    PairBusy { pair: String, operation_id: String },
    /// Every mutating request runs at most once: a request id seen before
    /// names the operation it already started.
    #[error(
        "request id {request_id:?} was already used: operation {operation_id} ({kind} of pair {pair}), {outcome}; nothing new was started (`pdwarden history {pair}`)"
    )]
    DuplicateRequest {
        request_id: String,
        operation_id: String,
        kind: String,
        pair: String,
        /// "still running" or "ended: VERDICT".
        outcome: String,
    },
    /// Exactly one orchestrator owns a journal (issue 16, finding 3: a
    /// second one took the first one's live operation for interrupted and
    /// overwrote its verdict).
    #[error(
        "journal {path} is owned by another orchestrator ({holder}); one orchestrator per journal: stop that one, or give this one its own journal"
    )]
    Owned { path: PathBuf, holder: String },
    #[error("cannot take ownership of journal {path}: {error}")]
    OwnerFile { path: PathBuf, error: std::io::Error },
    /// The journal's path names a file that is not a pdwarden journal
    /// (issue 32: an empty or foreign file silently became a new journal,
    /// its operations forgotten). Nothing was written to it.
    #[error(
        "journal {path} exists but is not a pdwarden journal ({what}); nothing was written to it: move it away (or point `journal` elsewhere) to start a new one"
    )]
    NotAJournal { path: PathBuf, what: String },
    /// A new journal could not be made at its path.
    #[error("cannot create journal {path}: {error}")]
    Create { path: PathBuf, error: std::io::Error },
    /// A conclusion is written once (issue 32: a second one overwrote the
    /// verdict that stands).
    #[error(
        "operation {operation_id} was already concluded ({verdict}); a conclusion is never overwritten: this one was not written"
    )]
    AlreadyConcluded { operation_id: String, verdict: String },
    /// The pair's last operation ended, but its conclusion could not be
    /// written (issue 16, finding 2: reported as "busy" until a restart).
    #[error(
        "journal error: operation {operation_id} of pair {pair} ended ({verdict}) but its conclusion could not be written ({error}); it is retried every few seconds and the pair is free once the journal can be written again: check the journal's disk"
    )]
    ConclusionPending {
        pair: String,
        operation_id: String,
        verdict: String,
        error: String,
    },
}

/// What a store knows of an operation without reading its entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationMeta {
    pub kind: String,
    pub pair: String,
    pub request_id: Option<String>,
    pub running: bool,
}

/// How long the journal keeps what (issue 36: a year of operations must
/// not grow it without bound). `[retention]` in orchestrator.toml.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionPolicy {
    /// Each pair's newest concluded operations kept whole (entries, full
    /// report): the cold-start history and the suite's baseline read the
    /// newest 50, the golden reference the newest 50, `history` 20.
    pub full_per_pair: u32,
    /// Each pair's operations kept at all (the older beyond `full_per_pair`
    /// as summaries).
    pub summaries_per_pair: u32,
    /// Operations older than this many days are removed, whatever the
    /// counts (at least 7: the breaker counts a week's recoveries).
    pub max_age_days: u32,
    /// How often the orchestrator that leads runs a pass (and once at start).
    pub interval_ms: u64,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        RetentionPolicy {
            full_per_pair: 100,
            summaries_per_pair: 1_000,
            max_age_days: 365,
            interval_ms: 3600 * 1000,
        }
    }
}

/// One operation as retention reads it (`Store::rows_of`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRow {
    pub operation_id: String,
    pub started_unix_ms: i64,
    pub concluded: bool,
    /// Its report is a summary already ([`COMPACTED_MARK`]).
    pub compacted: bool,
}

/// What one retention pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retained {
    pub compacted: u64,
    pub removed: u64,
}

/// Entries a compacted operation keeps: why it ran and who asked.
pub const KEPT_WHEN_COMPACTED: &[&str] = &["trigger", "actor"];

/// One operation of a pair as the retention plan sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kept {
    pub started_unix_ms: i64,
    pub concluded: bool,
    pub compacted: bool,
}

/// What retention does to one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retain {
    Compact,
    Remove,
}

/// The retention plan of one pair's operations, newest first: (index,
/// action) for each that changes. Pure. Running operations are skipped and
/// not counted.
pub fn plan(ops: &[Kept], policy: &RetentionPolicy, now_unix_ms: i64) -> Vec<(usize, Retain)> {
    let max_age = i64::from(policy.max_age_days) * 24 * 3600 * 1000;
    let mut out = Vec::new();
    let mut nth = 0u32;
    for (i, op) in ops.iter().enumerate() {
        if !op.concluded {
            continue;
        }
        nth += 1;
        let old = now_unix_ms.saturating_sub(op.started_unix_ms) > max_age;
        if old || nth > policy.summaries_per_pair {
            out.push((i, Retain::Remove));
        } else if nth > policy.full_per_pair && !op.compacted {
            out.push((i, Retain::Compact));
        }
    }
    out
}

/// How a summary's text ends: the stores find compacted operations by it
/// without reading their reports whole.
pub const COMPACTED_MARK: &str = r#""compacted":true}"#;

/// Whether a stored report is a summary (compacted by retention).
pub fn is_compacted(report: &str) -> bool {
    report.ends_with(COMPACTED_MARK)
}

/// A report's summary: its scalars and reasons, marked compacted (last:
/// `is_compacted` reads the text's end, not the whole report).
fn summary_of(report: Option<&str>) -> String {
    let report: Option<serde_json::Value> = report.and_then(|t| serde_json::from_str(t).ok());
    let mut kept = serde_json::Map::new();
    if let Some(obj) = report.as_ref().and_then(|r| r.as_object()) {
        for (k, v) in obj {
            if !(v.is_array() || v.is_object()) || k == "reasons" {
                kept.insert(k.clone(), v.clone());
            }
        }
    }
    kept.remove("compacted");
    let text = serde_json::Value::Object(kept).to_string();
    // serde_json's map is ordered by key: the marker is appended by hand.
    match text.strip_suffix('}') {
        Some(body) if body.len() > 1 => format!("{body},{COMPACTED_MARK}"),
        _ => format!("{{{COMPACTED_MARK}"),
    }
}

/// What the journal holds (`pdwarden_journal_*` gauges).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalSize {
    pub operations: u64,
    pub entries: u64,
    /// Bytes of live records: SQLite's used pages, etcd's keys and values
    /// under the journal's prefix.
    pub bytes: u64,
}

/// Where the journal's records live. Every method is one atomic change or
/// one consistent read; the front ([`Journal`]) adds what is common.
pub trait Store: Send + Sync {
    /// Records a new operation (state `started`); refuses with
    /// [`JournalError::PairBusy`] or [`JournalError::DuplicateRequest`].
    fn insert(
        &self,
        operation_id: &str,
        kind: &str,
        pair: &str,
        request_id: Option<&str>,
        started_unix_ms: i64,
    ) -> Result<(), JournalError>;
    /// Appends one entry, after every entry before it.
    fn append(&self, operation_id: &str, at_ms: u64, kind: &str, payload: &str) -> Result<(), JournalError>;
    /// Sets the operation's state and appends its `transition` entry, atomically.
    fn enter(&self, operation_id: &str, at_ms: u64, state: &str, payload: &str) -> Result<(), JournalError>;
    /// Writes the verdict and report of a running operation; says whether
    /// it wrote. A conclusion is written once, never over another: a
    /// concluded operation is left as it is — with `only_if_running`,
    /// `Ok(false)`; otherwise `Ok(false)` if it was concluded with this
    /// very verdict and report (an earlier try of this write, which
    /// reported an error after it was applied), else
    /// [`JournalError::AlreadyConcluded`]. An unknown operation: `Ok(false)`.
    fn write_conclusion(
        &self,
        operation_id: &str,
        verdict: &str,
        report: &str,
        ended_unix_ms: i64,
        only_if_running: bool,
    ) -> Result<bool, JournalError>;
    fn meta(&self, operation_id: &str) -> Result<Option<OperationMeta>, JournalError>;
    /// The store answers a read.
    fn ping(&self) -> Result<(), JournalError>;
    /// Operations not concluded, oldest first.
    fn unfinished(&self) -> Result<Vec<OperationRecord>, JournalError>;
    /// The pair's operations, newest first.
    fn history(&self, pair: &str, limit: u32) -> Result<Vec<OperationRecord>, JournalError>;
    /// Raw entries of an operation, in order: (at_ms, kind, payload JSON).
    fn entries(&self, operation_id: &str) -> Result<Vec<(u64, String, String)>, JournalError>;
    /// Deletes the operation's entries of `kind` (retention of bulky
    /// entries: evidence captures); returns how many.
    fn forget(&self, operation_id: &str, kind: &str) -> Result<usize, JournalError>;
    /// Every pair with an operation in the journal.
    fn pairs(&self) -> Result<Vec<String>, JournalError>;
    /// The pair's operations, newest first, as retention reads them: id,
    /// start, whether concluded and compacted (no report or entry read).
    fn rows_of(&self, pair: &str) -> Result<Vec<StoredRow>, JournalError>;
    /// Replaces a concluded operation's report by `summarise(report)` and
    /// deletes its entries but those of the `keep` kinds, atomically
    /// (retention: an old operation compacted to its summary). A running
    /// operation is left as it is (`Ok(false)`).
    fn compact(
        &self,
        operation_id: &str,
        summarise: &dyn Fn(Option<&str>) -> String,
        keep: &[&str],
    ) -> Result<bool, JournalError>;
    /// Deletes a concluded operation, its entries and its request id,
    /// atomically (retention). A running one is left (`Ok(false)`).
    fn remove(&self, operation_id: &str) -> Result<bool, JournalError>;
    /// What the journal holds now.
    fn size(&self) -> Result<JournalSize, JournalError>;
    /// Publishes `text` under `name` for the followers to answer reads
    /// with (issue 36: the leader's `status`); fenced on etcd. A SQLite
    /// journal has one orchestrator and no followers: nothing to do.
    fn publish(&self, _name: &str, _text: &str) -> Result<(), JournalError> {
        Ok(())
    }
    /// What the leader last published under `name`.
    fn published(&self, _name: &str) -> Result<Option<String>, JournalError> {
        Ok(None)
    }
    /// Gives back the room retention freed, where the store keeps it
    /// (SQLite: `VACUUM` once more than half the file is slack); etcd
    /// reclaims with its own compaction and defragmentation.
    fn reclaim(&self) -> Result<(), JournalError> {
        Ok(())
    }
    /// The SQLite store under the front (tests fill its disk).
    #[cfg(test)]
    fn as_sqlite(&self) -> Option<&sqlite::SqliteStore> {
        None
    }
}

/// The most a conclusion's report may hold, serialised (issue 32: a stream
/// past `max_tokens` made an 8 MB report, and `history` broke for every
/// operator). A report over it keeps its verdict, reasons and every scalar;
/// its long lists are cut to their first [`KEPT_PER_LIST`] entries, and it
/// says so.
pub const MAX_REPORT_BYTES: usize = 1 << 20;
/// Entries a list keeps in a report cut to size.
pub const KEPT_PER_LIST: usize = 64;

/// `report` as text, within [`MAX_REPORT_BYTES`].
fn bounded_report(mut report: serde_json::Value) -> Result<String, JournalError> {
    let text = serde_json::to_string(&report)?;
    if text.len() <= MAX_REPORT_BYTES {
        return Ok(text);
    }
    fn cut(v: &mut serde_json::Value) -> usize {
        match v {
            serde_json::Value::Array(items) => {
                let mut dropped = items.len().saturating_sub(KEPT_PER_LIST);
                items.truncate(KEPT_PER_LIST);
                for i in items.iter_mut() {
                    dropped += cut(i);
                }
                dropped
            }
            serde_json::Value::Object(map) => map.values_mut().map(cut).sum(),
            serde_json::Value::String(s) if s.len() > 4096 => {
                let mut end = 4096;
                while !s.is_char_boundary(end) {
                    end -= 1;
                }
                s.truncate(end);
                s.push('…');
                1
            }
            _ => 0,
        }
    }
    let note = |dropped: usize, was: usize| {
        format!(
            "this report was {was} bytes, over the journal's bound of {MAX_REPORT_BYTES}: {dropped} list entries and long texts were cut to keep it"
        )
    };
    let was = text.len();
    let reasons = report.get("reasons").cloned();
    let dropped = cut(&mut report);
    if let Some(obj) = report.as_object_mut() {
        // The reasons are the verdict's: kept whole where they fit.
        if let Some(r) = reasons.filter(|r| r.to_string().len() < MAX_REPORT_BYTES / 4) {
            obj.insert("reasons".into(), r);
        }
        let line = serde_json::Value::String(note(dropped, was));
        match obj.get_mut("reasons").and_then(|r| r.as_array_mut()) {
            Some(r) => r.push(line),
            None => {
                obj.insert("reasons".into(), serde_json::Value::Array(vec![line]));
            }
        }
    }
    let text = serde_json::to_string(&report)?;
    if text.len() <= MAX_REPORT_BYTES {
        return Ok(text);
    }
    // Still over (a very wide object): its scalars and reasons only.
    let mut kept = serde_json::Map::new();
    if let Some(obj) = report.as_object() {
        for (k, v) in obj {
            if !(v.is_array() || v.is_object()) || k == "reasons" {
                kept.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(serde_json::to_string(&serde_json::Value::Object(kept))?)
}

impl JournalError {
    /// The report's line for a conclusion that was not written: kept and
    /// retried, or refused because another conclusion stands (issue 32: a
    /// conclusion is never written over another).
    pub fn unwritten_conclusion(&self) -> String {
        match self {
            JournalError::AlreadyConcluded { verdict, .. } => format!(
                "this conclusion was not written: the operation was already concluded ({verdict}), and that conclusion stands"
            ),
            e => format!(
                "the journal could not record this conclusion ({e}): it is kept and retried, and the pair is not free until it is written"
            ),
        }
    }
}

pub struct Journal {
    store: Box<dyn Store>,
    /// Conclusions not written yet, by operation id.
    pending: Mutex<std::collections::BTreeMap<String, PendingConclusion>>,
    /// Told of every conclusion once it is written (the operations'
    /// Prometheus series).
    observer: std::sync::OnceLock<crate::ops::telemetry::OperationMetrics>,
    /// The fault-injection suite's failpoints (test builds only).
    #[cfg(test)]
    faults: WriteFaults,
}

/// Failpoints at every journal write (test builds only): each write is one
/// evaluation, counted; the writes a test names fail as a full disk does
/// (`SQLITE_FULL`). Per journal, so tests running side by side never see
/// each other's faults.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct WriteFaults {
    seen: std::sync::atomic::AtomicUsize,
    fail_at: Mutex<std::collections::BTreeSet<usize>>,
}

#[cfg(test)]
impl Journal {
    /// Fails the `at`-th writes from now on (1-based, counted from the first
    /// write this journal ever saw).
    pub(crate) fn fail_writes(&self, at: impl IntoIterator<Item = usize>) {
        self.faults.fail_at.lock().unwrap().extend(at);
    }

    /// No more injected failures (the disk has room again).
    pub(crate) fn heal(&self) {
        self.faults.fail_at.lock().unwrap().clear();
    }

    /// How many writes this journal was asked for.
    pub(crate) fn writes_seen(&self) -> usize {
        self.faults.seen.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn failpoint(&self) -> Result<(), JournalError> {
        let n = self.faults.seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if self.faults.fail_at.lock().unwrap().contains(&n) {
            return Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
                Some(format!("injected: journal write {n} failed (database or disk is full)")),
            )
            .into());
        }
        Ok(())
    }
}

#[cfg(not(test))]
impl Journal {
    #[inline]
    fn failpoint(&self) -> Result<(), JournalError> {
        Ok(())
    }
}

// The journal is an edge: it stamps records with wall-clock time.
#[allow(clippy::disallowed_methods)]
fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Journal {
    /// The journal over `store`.
    pub fn new(store: Box<dyn Store>) -> Self {
        Self {
            store,
            pending: Mutex::default(),
            observer: std::sync::OnceLock::new(),
            #[cfg(test)]
            faults: WriteFaults::default(),
        }
    }

    /// A SQLite journal, not owned (tools and tests).
    pub fn open(path: &Path) -> Result<Self, JournalError> {
        Ok(Self::new(Box::new(sqlite::SqliteStore::open(path)?)))
    }

    /// A SQLite journal as its one owner ([`sqlite::SqliteStore::own`]).
    pub fn own(path: &Path, holder: &str) -> Result<Self, JournalError> {
        Ok(Self::new(Box::new(sqlite::SqliteStore::own(path, holder)?)))
    }

    /// Records a new operation; refuses if the pair already has one running.
    pub fn begin(
        &self,
        operation_id: &str,
        kind: &str,
        pair: &str,
        request_id: Option<&str>,
    ) -> Result<(), JournalError> {
        self.flush_pending();
        if let Some(p) = self.pending_of(pair) {
            return Err(JournalError::ConclusionPending {
                pair: p.pair,
                operation_id: p.operation_id,
                verdict: p.verdict,
                error: p.error,
            });
        }
        self.failpoint()?;
        self.store.insert(operation_id, kind, pair, request_id, unix_ms())
    }

    /// Appends one entry (a transition, phase event, probe, ...).
    pub fn append(
        &self,
        operation_id: &str,
        at_ms: u64,
        kind: &str,
        payload: &impl Serialize,
    ) -> Result<(), JournalError> {
        let payload = serde_json::to_string(payload)?;
        self.failpoint()?;
        self.store.append(operation_id, at_ms, kind, &payload)
    }

    /// Records a state transition: the new state on the operation row and a
    /// `transition` entry, in one transaction, before the state's commands go out.
    pub fn transition(&self, operation_id: &str, at_ms: u64, state: &str) -> Result<(), JournalError> {
        self.enter(operation_id, at_ms, state, None::<&()>)
    }

    /// Moves an operation into `state` (its label, shown by `history`) and
    /// journals the workflow's typed state with it (`data`), in one
    /// transaction: a resume reads the state back with
    /// [`Journal::last_state`] instead of parsing the label.
    pub fn enter(
        &self,
        operation_id: &str,
        at_ms: u64,
        state: &str,
        data: Option<&impl Serialize>,
    ) -> Result<(), JournalError> {
        let payload = match data {
            Some(d) => serde_json::json!({ "state": state, "data": d }),
            None => serde_json::json!({ "state": state }),
        };
        self.failpoint()?;
        self.store
            .enter(operation_id, at_ms, state, &serde_json::to_string(&payload)?)
    }

    /// The typed state `operation_id` last entered ([`Journal::enter`]), if
    /// it journaled one. One that does not read as `T` is an error.
    pub fn last_state<T: serde::de::DeserializeOwned>(&self, operation_id: &str) -> Result<Option<T>, JournalError> {
        for (_, kind, payload) in self.store.entries(operation_id)?.into_iter().rev() {
            if kind != "transition" {
                continue;
            }
            let mut v: serde_json::Value = serde_json::from_str(&payload)?;
            match v.get_mut("data") {
                Some(data) if !data.is_null() => return Ok(Some(serde_json::from_value(data.take())?)),
                _ => continue,
            }
        }
        Ok(None)
    }

    /// Concludes an operation with its verdict and final report. A write
    /// that fails (a full disk) is kept and retried: the error is returned,
    /// and until the write succeeds `begin` on the pair says why the pair
    /// is not free, and `pending_conclusions` lists it. An operation
    /// already concluded keeps its conclusion, and this one is refused
    /// ([`JournalError::AlreadyConcluded`], logged).
    pub fn conclude(&self, operation_id: &str, verdict: &str, report: &impl Serialize) -> Result<(), JournalError> {
        self.conclude_where(operation_id, verdict, report, false).map(|_| ())
    }

    /// Concludes the operation only if it is still running (a task that
    /// ended without concluding it); says whether it did.
    pub fn conclude_if_running(
        &self,
        operation_id: &str,
        verdict: &str,
        report: &impl Serialize,
    ) -> Result<bool, JournalError> {
        if self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(operation_id)
        {
            // Already concluded, its write pending: that conclusion stands.
            return Ok(false);
        }
        if self.store.meta(operation_id)?.is_some_and(|m| !m.running) {
            // Concluded: nothing to write (a write that could only fail).
            return Ok(false);
        }
        self.conclude_where(operation_id, verdict, report, true)
    }

    fn conclude_where(
        &self,
        operation_id: &str,
        verdict: &str,
        report: &impl Serialize,
        only_if_running: bool,
    ) -> Result<bool, JournalError> {
        let report = bounded_report(serde_json::to_value(report)?)?;
        match self.write_conclusion(operation_id, verdict, &report, only_if_running) {
            Ok(wrote) => {
                self.pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(operation_id);
                if wrote {
                    self.observe(operation_id, verdict, &report);
                }
                Ok(wrote)
            }
            Err(e @ JournalError::AlreadyConcluded { .. }) => {
                // Someone else's conclusion stands; nothing to retry.
                tracing::warn!(operation = %operation_id, %verdict, error = %e, "conclusion not written");
                self.pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(operation_id);
                Err(e)
            }
            Err(e) => {
                let pair = self
                    .store
                    .meta(operation_id)
                    .ok()
                    .flatten()
                    .filter(|m| m.running)
                    .map(|m| m.pair);
                if let Some(pair) = pair {
                    tracing::error!(operation = %operation_id, %pair, error = %e, "cannot write an operation's conclusion; retrying");
                    self.pending.lock().unwrap_or_else(|p| p.into_inner()).insert(
                        operation_id.to_string(),
                        PendingConclusion {
                            operation_id: operation_id.to_string(),
                            pair,
                            verdict: verdict.to_string(),
                            error: e.to_string(),
                            since_unix_ms: unix_ms(),
                            report,
                        },
                    );
                }
                Err(e)
            }
        }
    }

    fn write_conclusion(
        &self,
        operation_id: &str,
        verdict: &str,
        report: &str,
        only_if_running: bool,
    ) -> Result<bool, JournalError> {
        self.failpoint()?;
        self.store
            .write_conclusion(operation_id, verdict, report, unix_ms(), only_if_running)
    }

    /// Writes the conclusions that could not be written before; returns
    /// how many are still pending.
    pub fn flush_pending(&self) -> usize {
        let pending: Vec<PendingConclusion> = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for p in pending {
            let outcome = self.write_conclusion(&p.operation_id, &p.verdict, &p.report, false);
            let mut map = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            match outcome {
                Ok(_) => {
                    tracing::warn!(operation = %p.operation_id, pair = %p.pair, "pending conclusion written; pair released");
                    map.remove(&p.operation_id);
                    drop(map);
                    self.observe(&p.operation_id, &p.verdict, &p.report);
                }
                Err(e @ JournalError::AlreadyConcluded { .. }) => {
                    // Concluded meanwhile by another writer: that
                    // conclusion stands, this one is dropped.
                    tracing::error!(operation = %p.operation_id, pair = %p.pair, verdict = %p.verdict, error = %e, "pending conclusion dropped; pair released");
                    map.remove(&p.operation_id);
                }
                Err(e) => {
                    if let Some(entry) = map.get_mut(&p.operation_id) {
                        entry.error = e.to_string();
                    }
                }
            }
        }
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The journal answers a read (for the service manager's watchdog: a
    /// connection stuck behind its lock, or a database that cannot be
    /// read, stops the pings).
    pub fn ping(&self) -> Result<(), JournalError> {
        self.store.ping()
    }

    /// Tells `metrics` of every conclusion written from now on (once per
    /// journal; a second call is ignored).
    pub fn observe_conclusions(&self, metrics: crate::ops::telemetry::OperationMetrics) {
        let _ = self.observer.set(metrics);
    }

    fn observe(&self, operation_id: &str, verdict: &str, report: &str) {
        let Some(m) = self.observer.get() else { return };
        let Some(meta) = self.store.meta(operation_id).ok().flatten() else {
            return;
        };
        let report = serde_json::from_str(report).unwrap_or(serde_json::Value::Null);
        m.concluded(&crate::ops::telemetry::Concluded {
            kind: &meta.kind,
            pair: &meta.pair,
            request_id: meta.request_id.as_deref(),
            verdict,
            report: &report,
        });
    }

    /// The conclusions not written yet (for `status`).
    pub fn pending_conclusions(&self) -> Vec<PendingConclusion> {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    fn pending_of(&self, pair: &str) -> Option<PendingConclusion> {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .find(|p| p.pair == pair)
            .cloned()
    }

    /// Operations that were running when the orchestrator last stopped.
    pub fn unfinished(&self) -> Result<Vec<OperationRecord>, JournalError> {
        self.store.unfinished()
    }

    /// An operation's kind, pair and whether it runs; `None`: unknown.
    pub fn meta(&self, operation_id: &str) -> Result<Option<OperationMeta>, JournalError> {
        self.store.meta(operation_id)
    }

    /// The pair's operations, newest first.
    pub fn history(&self, pair: &str, limit: u32) -> Result<Vec<OperationRecord>, JournalError> {
        self.store.history(pair, limit)
    }

    /// Raw entries of an operation, in order: (at_ms, kind, payload).
    pub fn entries(&self, operation_id: &str) -> Result<Vec<(u64, String, serde_json::Value)>, JournalError> {
        self.store
            .entries(operation_id)?
            .into_iter()
            .map(|(at, kind, payload)| Ok((at, kind, serde_json::from_str(&payload)?)))
            .collect()
    }

    /// Publishes `text` under `name`, stamped with the journal's wall
    /// clock, for the followers (issue 36).
    pub fn publish(&self, name: &str, text: &str) -> Result<(), JournalError> {
        let stamped = serde_json::json!({ "at_unix_ms": unix_ms(), "text": text });
        self.store.publish(name, &stamped.to_string())
    }

    /// What the leader last published under `name`, and how old it is (ms).
    pub fn published(&self, name: &str) -> Result<Option<(String, i64)>, JournalError> {
        let Some(stamped) = self.store.published(name)? else {
            return Ok(None);
        };
        let v: serde_json::Value = serde_json::from_str(&stamped)?;
        let at = v["at_unix_ms"].as_i64().unwrap_or(0);
        Ok(v["text"]
            .as_str()
            .map(|t| (t.to_string(), unix_ms().saturating_sub(at))))
    }

    /// What the journal holds now (the `pdwarden_journal_*` gauges).
    pub fn size(&self) -> Result<JournalSize, JournalError> {
        self.store.size()
    }

    /// [`retain`](Self::retain) at the journal's wall clock (an edge).
    pub fn retain_now(&self, policy: &RetentionPolicy) -> Result<Retained, JournalError> {
        self.retain(policy, unix_ms())
    }

    /// One pass of the retention policy over every pair (issue 36): each
    /// pair's newest `full_per_pair` concluded operations stay whole; older
    /// ones are compacted to their summaries (the report's scalars and
    /// reasons, `"compacted": true`; the `trigger` and `actor` entries
    /// stay, the breaker and `history` read them); beyond
    /// `summaries_per_pair`, or older than `max_age_ms`, they are removed.
    /// Running operations are never touched. Stops at the first write that
    /// fails (the next pass goes on from there).
    pub fn retain(&self, policy: &RetentionPolicy, now_unix_ms: i64) -> Result<Retained, JournalError> {
        let mut done = Retained::default();
        for pair in self.store.pairs()? {
            let rows = self.store.rows_of(&pair)?;
            let ops: Vec<Kept> = rows
                .iter()
                .map(|r| Kept {
                    started_unix_ms: r.started_unix_ms,
                    concluded: r.concluded,
                    compacted: r.compacted,
                })
                .collect();
            for (i, action) in plan(&ops, policy, now_unix_ms) {
                let r = &rows[i];
                self.failpoint()?;
                match action {
                    Retain::Compact => {
                        if self.store.compact(&r.operation_id, &summary_of, KEPT_WHEN_COMPACTED)? {
                            done.compacted += 1;
                        }
                    }
                    Retain::Remove => {
                        if self.store.remove(&r.operation_id)? {
                            done.removed += 1;
                        }
                    }
                }
            }
        }
        if done.compacted + done.removed > 0 {
            self.store.reclaim()?;
        }
        Ok(done)
    }

    /// Keeps the `kind` entries (evidence captures) of the pair's newest
    /// `keep` operations that have one and are at most `max_age_ms` old,
    /// and forgets the others' (their reports keep their summaries).
    /// Looks at the pair's newest 500 operations: retention runs at every
    /// capture, so nothing older holds one. Returns how many operations'
    /// entries were forgotten.
    pub fn retain_captures(&self, pair: &str, kind: &str, keep: usize, max_age_ms: i64) -> Result<usize, JournalError> {
        let now = unix_ms();
        let (mut kept, mut forgotten) = (0, 0);
        for op in self.store.history(pair, 500)? {
            if !self.store.entries(&op.operation_id)?.iter().any(|(_, k, _)| k == kind) {
                continue;
            }
            if kept < keep && now.saturating_sub(op.started_unix_ms) <= max_age_ms {
                kept += 1;
                continue;
            }
            self.failpoint()?;
            self.store.forget(&op.operation_id, kind)?;
            forgotten += 1;
        }
        Ok(forgotten)
    }

    /// Every entry of `kind` that `operation_id` journaled, in order, read as
    /// `T`. One that does not read is an error (a resume must not guess
    /// around a record it cannot read).
    pub fn read<T: serde::de::DeserializeOwned>(&self, operation_id: &str, kind: &str) -> Result<Vec<T>, JournalError> {
        self.store
            .entries(operation_id)?
            .into_iter()
            .filter(|(_, k, _)| k == kind)
            .map(|(_, _, payload)| Ok(serde_json::from_str(&payload)?))
            .collect()
    }

    /// The commands `operation_id` journaled, in order. An entry that does
    /// not read as a [`CommandEntry`] is an error: a resume must not guess.
    pub fn commands(&self, operation_id: &str) -> Result<Vec<CommandEntry>, JournalError> {
        self.read(operation_id, COMMAND)
    }
}

/// A report of a real co-restart's size and shape (probes, timeline,
/// suite samples), for [`simulate_year`].
pub fn year_report() -> serde_json::Value {
    serde_json::json!({
        "verdict": "healthy", "reasons": ["every unit generates"], "total_ms": 41_000,
        "kind": "co_restart", "pair": "x",
        "probes": (0..8).map(|i| serde_json::json!({"seq": i, "latency_ms": 120, "outcome": "ok", "tokens": 8})).collect::<Vec<_>>(),
        "timeline": (0..24).map(|i| serde_json::json!({"unit": "decode-0", "phase": "generating", "at_ms": i * 1000, "detail": "x".repeat(80)})).collect::<Vec<_>>(),
        "suite": (0..5).map(|i| serde_json::json!({"step": i, "samples": (0..16).map(|k| serde_json::json!({"ttft_ms": k, "tpot_us": 900, "outcome": "ok"})).collect::<Vec<_>>()})).collect::<Vec<_>>(),
    })
}

/// What [`simulate_year`] did.
#[derive(Debug, Clone, Default)]
pub struct YearRun {
    /// Operations written.
    pub written: u64,
    /// Each retention pass, ms.
    pub pass_ms: Vec<f64>,
}

/// A year of a fleet's operations written into `j` at simulated times
/// (issue 36): `pairs` pairs, a co-restart every `every_hours` hours, each
/// with its transitions, commands, attempts and probes, every fifth an
/// automatic recovery (its trigger), and a report of a real one's size;
/// the retention `policy` run every `pass_every_days` simulated days and
/// once at the end. The contract test and `pdwarden-bench --only
/// retention` run it.
pub fn simulate_year(
    j: &Journal,
    policy: &RetentionPolicy,
    pairs: u32,
    every_hours: i64,
    pass_every_days: i64,
) -> Result<YearRun, JournalError> {
    let hour = 3_600_000i64;
    let year_start = 1_750_000_000_000i64;
    let report = year_report();
    let mut run = YearRun::default();
    let mut last_pass = year_start;
    let mut t = year_start;
    let pass = |t: i64, run: &mut YearRun| -> Result<(), JournalError> {
        let started = tokio::time::Instant::now();
        j.retain(policy, t)?;
        run.pass_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        Ok(())
    };
    while t < year_start + 365 * 24 * hour {
        for p in 0..pairs {
            let id = format!("y{}", run.written);
            run.written += 1;
            j.store
                .insert(&id, "co_restart", &format!("pair-{p}"), Some(&format!("r-{id}")), t)?;
            if run.written.is_multiple_of(5) {
                j.append(&id, 0, "trigger", &serde_json::json!({"automatic": true}))?;
            }
            for (k, kind) in ["transition", "command", "attempt", "attempt", "probe", "transition"]
                .iter()
                .enumerate()
            {
                j.append(
                    &id,
                    k as u64,
                    kind,
                    &serde_json::json!({"unit": "decode-0", "detail": "y".repeat(120)}),
                )?;
            }
            j.conclude(&id, "healthy", &report)?;
        }
        t += every_hours * hour;
        if t - last_pass >= pass_every_days * 24 * hour {
            pass(t, &mut run)?;
            last_pass = t;
        }
    }
    pass(t, &mut run)?;
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The database full: no page beyond those it has (`None`: the default).
    fn fill_disk(j: &Journal, full: bool) {
        let conn = j.store.as_sqlite().expect("a SQLite journal").conn();
        let pages: u64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
        let limit = if full { pages } else { 1_073_741_823 };
        let _: u64 = conn
            .query_row(&format!("PRAGMA max_page_count = {limit}"), [], |r| r.get(0))
            .unwrap();
    }

    /// Issue 16, finding 2: with the journal's disk full the operation's
    /// conclusion could not be written and the pair stayed "busy" after
    /// space was freed, until the orchestrator restarted. Now the pair says
    /// "journal error" meanwhile, and is free at the first write after
    /// space returns, the conclusion written as it was.
    #[test]
    fn a_conclusion_the_disk_refused_is_retried_and_the_pair_released() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.sqlite");
        let j = Journal::open(&path).unwrap();
        j.begin("op-1", "co_restart", "a", None).unwrap();
        fill_disk(&j, true);
        let big = serde_json::json!({"verdict": "healthy", "reasons": ["x".repeat(200_000)]});
        let e = j.conclude("op-1", "healthy", &big).unwrap_err();
        assert!(e.to_string().contains("full"), "{e}");
        assert_eq!(j.pending_conclusions().len(), 1);
        match j.begin("op-2", "co_restart", "a", None) {
            Err(e @ JournalError::ConclusionPending { .. }) => {
                let said = e.to_string();
                assert!(
                    said.starts_with("journal error: operation op-1 of pair a ended (healthy)"),
                    "{said}"
                );
                assert!(!said.contains("busy"), "{said}");
            }
            other => panic!("expected ConclusionPending, got {other:?}"),
        }
        assert!(
            !j.conclude_if_running("op-1", "failed", &serde_json::json!({})).unwrap(),
            "the first conclusion stands"
        );
        fill_disk(&j, false);
        j.begin("op-2", "co_restart", "a", None).expect("free once the disk is");
        assert!(j.pending_conclusions().is_empty());
        let op1 = j
            .history("a", 5)
            .unwrap()
            .into_iter()
            .find(|o| o.operation_id == "op-1")
            .unwrap();
        assert_eq!(op1.verdict.as_deref(), Some("healthy"));
    }

    /// Issue 32: a runaway report (every token's timing of a stream past
    /// max_tokens: 8 MB) broke `history` for every operator. A report over
    /// the bound is cut to it, keeping its verdict and reasons and saying so.
    #[test]
    fn a_report_over_the_bound_is_cut_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(&dir.path().join("j.sqlite")).unwrap();
        j.begin("op-1", "co_restart", "a", None).unwrap();
        let times: Vec<u64> = (0..1_500_000).collect();
        let report = serde_json::json!({
            "verdict": "failed",
            "reasons": ["a runaway answer: 1500000 tokens for max_tokens 32"],
            "suite": [{"step": "long_generation", "samples": [{"token_times_ms": times}]}],
        });
        assert!(report.to_string().len() > 8 * MAX_REPORT_BYTES);
        j.conclude("op-1", "failed", &report).unwrap();
        let op = j.history("a", 5).unwrap().remove(0);
        let stored = serde_json::to_string(&op.report).unwrap();
        assert!(stored.len() <= MAX_REPORT_BYTES, "{} bytes", stored.len());
        let reasons = op.report.as_ref().unwrap()["reasons"].as_array().unwrap().clone();
        assert_eq!(reasons[0], "a runaway answer: 1500000 tokens for max_tokens 32");
        assert!(
            reasons
                .last()
                .unwrap()
                .as_str()
                .unwrap()
                .contains("over the journal's bound"),
            "{reasons:?}"
        );
        assert_eq!(op.verdict.as_deref(), Some("failed"));
    }

    /// Issue 16, finding 3: a second orchestrator on the same journal is
    /// refused, naming the first; once the first is gone the journal can be
    /// owned again.
    #[test]
    fn one_owner_per_journal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.sqlite");
        let first = Journal::own(&path, "pid 101, listening on 127.0.0.1:7070").unwrap();
        first.begin("op-1", "co_restart", "a", None).unwrap();
        let e = Journal::own(&path, "pid 202").err().expect("a second owner is refused");
        assert!(matches!(e, JournalError::Owned { .. }), "{e}");
        let said = e.to_string();
        assert!(
            said.contains("is owned by another orchestrator (pid 101, listening on 127.0.0.1:7070)"),
            "{said}"
        );
        assert!(!said.contains('\n'));
        assert_eq!(first.unfinished().unwrap().len(), 1, "the first's operation untouched");
        drop(first);
        let second = Journal::own(&path, "pid 202").expect("free once the first is gone");
        assert_eq!(second.unfinished().unwrap().len(), 1);
        assert_eq!(std::fs::read_to_string(sqlite::owner_file(&path)).unwrap(), "pid 202");
    }

    /// The journal's rules on the SQLite store (the contract suite; the
    /// etcd store runs the same one).
    #[test]
    fn one_running_operation_per_pair() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(&dir.path().join("j.sqlite")).unwrap();
        contract::keeps_the_journal_rules(&j);
        contract::keeps_only_the_newest_captures(&j);
    }

    /// Issue 36: a year on the SQLite journal ends within its bound.
    #[test]
    fn a_year_of_operations_stays_within_the_retention_bound() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(&dir.path().join("j.sqlite")).unwrap();
        let (size, mut ms) = contract::retention_keeps_a_year_within_bounds(&j, 2, 4, 1);
        ms.sort_by(f64::total_cmp);
        println!(
            "a year, 2 pairs, a co-restart every 4 h, a pass a day: {size:?}; history (20) p50 {:.2} ms, p99 {:.2} ms",
            ms[ms.len() / 2],
            ms[ms.len() * 99 / 100]
        );
    }

    /// The retention plan: the newest whole, then summaries, then removed;
    /// too old removed whatever the count; running ones never touched.
    #[test]
    fn the_retention_plan_compacts_then_removes() {
        const DAY: i64 = 24 * 3600 * 1000;
        let policy = RetentionPolicy {
            full_per_pair: 2,
            summaries_per_pair: 4,
            max_age_days: 1,
            interval_ms: 1,
        };
        let op = |started: i64, concluded: bool, compacted: bool| Kept {
            started_unix_ms: started + DAY - 1_000,
            concluded,
            compacted,
        };
        let ops = [
            op(999, false, false),
            op(998, true, false),
            op(997, true, false),
            op(996, true, false),
            op(995, true, true),
            op(994, true, false),
            op(10, true, true),
        ];
        assert_eq!(
            plan(&ops, &policy, DAY),
            vec![(3, Retain::Compact), (5, Retain::Remove), (6, Retain::Remove)]
        );
        // Too old: removed even among the newest.
        assert_eq!(plan(&ops[..2], &policy, 3 * DAY), vec![(1, Retain::Remove)]);
    }

    /// The journal survives reopening (it is a real file, not memory).
    /// The last typed state is read back as its type; a plain transition
    /// (a label only, as journaled before states were typed) has none, and
    /// a state that does not read as the type is an error, not a guess.
    #[test]
    fn the_last_typed_state_is_read_back() {
        #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        struct Waiting {
            on: Vec<String>,
        }
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(&dir.path().join("j.sqlite")).unwrap();
        j.begin("op", "co_restart", "p", None).unwrap();
        j.transition("op", 1, "restarting_prefill").unwrap();
        assert_eq!(j.last_state::<Waiting>("op").unwrap(), None);
        let first = Waiting { on: vec!["c1".into()] };
        j.enter("op", 2, "restarting_prefill", Some(&first)).unwrap();
        j.transition("op", 3, "verifying").unwrap();
        assert_eq!(j.last_state::<Waiting>("op").unwrap(), Some(first));
        assert_eq!(j.unfinished().unwrap()[0].state, "verifying");
        j.enter("op", 4, "restarting_decode", Some(&"not a Waiting")).unwrap();
        assert!(j.last_state::<Waiting>("op").is_err());
    }

    #[test]
    fn survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.sqlite");
        Journal::open(&path)
            .unwrap()
            .begin("op-1", "co_restart", "a", None)
            .unwrap();
        let j = Journal::open(&path).unwrap();
        assert_eq!(j.unfinished().unwrap()[0].operation_id, "op-1");
    }

    /// Issue 32, one owner for real: the owner lock was `<path as
    /// given>.owner`, so a second orchestrator given a symlink, another
    /// spelling or a hard link of a live journal started, "resumed" the
    /// first one's running operation and overwrote its conclusion. The lock
    /// is the journal file's own (its inode): every name of it is refused,
    /// naming the holder.
    #[test]
    fn one_owner_whatever_name_the_journal_is_given() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.sqlite");
        let first = Journal::own(&path, "pid 101, listening on 127.0.0.1:7070").unwrap();
        first.begin("op-1", "co_restart", "a", None).unwrap();
        let symlink = dir.path().join("link.sqlite");
        std::os::unix::fs::symlink(&path, &symlink).unwrap();
        std::fs::create_dir(dir.path().join("x")).unwrap();
        let dotted = dir.path().join("x").join("..").join("j.sqlite");
        let hardlink = dir.path().join("hard.sqlite");
        std::fs::hard_link(&path, &hardlink).unwrap();
        for (other, holder) in [
            (&symlink, "pid 101, listening on 127.0.0.1:7070".to_string()),
            (&dotted, "pid 101, listening on 127.0.0.1:7070".to_string()),
            // Another name of the same file: its holder is found by its lock.
            (&hardlink, format!("pid {}", std::process::id())),
        ] {
            let e = Journal::own(other, "pid 202")
                .err()
                .unwrap_or_else(|| panic!("{} is refused", other.display()));
            assert!(matches!(e, JournalError::Owned { .. }), "{e}");
            let said = e.to_string();
            assert!(
                said.contains(&format!("is owned by another orchestrator ({holder}")),
                "{}: {said}",
                other.display()
            );
            assert!(!said.contains('\n'));
        }
        assert_eq!(first.unfinished().unwrap().len(), 1, "the first's operation untouched");
        first.conclude("op-1", "healthy", &serde_json::json!({})).unwrap();
        drop(first);
        let second = Journal::own(&symlink, "pid 202").expect("free once the first is gone");
        assert_eq!(second.history("a", 5).unwrap()[0].verdict.as_deref(), Some("healthy"));
        drop(second);
        Journal::own(&hardlink, "pid 303").expect("by any name");
    }

    /// Issue 32: a conclusion overwrote one already written (a second
    /// owner's "interrupted" over the first one's verdict). A conclusion is
    /// written once: a second one is refused, saying which stands.
    #[test]
    fn a_conclusion_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(&dir.path().join("j.sqlite")).unwrap();
        j.begin("op-1", "co_restart", "a", None).unwrap();
        j.conclude("op-1", "healthy", &serde_json::json!({"verdict": "healthy"}))
            .unwrap();
        match j.conclude("op-1", "failed", &serde_json::json!({"verdict": "failed"})) {
            Err(e @ JournalError::AlreadyConcluded { .. }) => {
                let said = e.to_string();
                assert!(
                    said.contains("operation op-1 was already concluded (healthy)"),
                    "{said}"
                );
                assert!(!said.contains('\n'));
            }
            other => panic!("expected AlreadyConcluded, got {other:?}"),
        }
        assert!(j.pending_conclusions().is_empty(), "nothing to retry");
        assert!(!j.conclude_if_running("op-1", "failed", &serde_json::json!({})).unwrap());
        let op1 = &j.history("a", 5).unwrap()[0];
        assert_eq!(op1.verdict.as_deref(), Some("healthy"));
        assert_eq!(op1.report.as_ref().unwrap()["verdict"], "healthy");
        j.begin("op-2", "co_restart", "a", None).expect("the pair is free");
    }

    /// A pending conclusion (its write failed) whose operation was
    /// concluded meanwhile by another writer is dropped, not written over
    /// that conclusion, and the pair is free; one whose own write had in
    /// fact been applied is retried idempotently.
    #[test]
    fn a_pending_conclusion_never_overwrites_one_written() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(&dir.path().join("j.sqlite")).unwrap();
        // Another writer's conclusion landed first.
        j.begin("op-1", "co_restart", "a", None).unwrap();
        j.fail_writes([j.writes_seen() + 1]);
        j.conclude("op-1", "healthy", &serde_json::json!({"verdict": "healthy"}))
            .unwrap_err();
        assert_eq!(j.pending_conclusions().len(), 1);
        j.store
            .write_conclusion("op-1", "failed", "{\"verdict\":\"failed\"}", 1, true)
            .unwrap();
        assert_eq!(j.flush_pending(), 0, "dropped, not retried for ever");
        assert_eq!(j.history("a", 5).unwrap()[0].verdict.as_deref(), Some("failed"));
        j.begin("op-2", "co_restart", "a", None).expect("the pair is free");
        // Its own write had been applied (the error came after it): the
        // retry of the very same conclusion is no error.
        j.fail_writes([j.writes_seen() + 1]);
        let report = serde_json::json!({"verdict": "healthy"});
        j.conclude("op-2", "healthy", &report).unwrap_err();
        j.store
            .write_conclusion("op-2", "healthy", &serde_json::to_string(&report).unwrap(), 1, true)
            .unwrap();
        assert_eq!(j.flush_pending(), 0);
        assert_eq!(j.history("a", 5).unwrap()[0].verdict.as_deref(), Some("healthy"));
    }

    /// Issue 32: a file that is not a pdwarden journal (empty, no
    /// `operations` table, not SQLite at all) started a fresh journal
    /// without a word. It is refused, as owner or not, naming the path and
    /// how to start a new journal, and left as it was; a path that does not
    /// exist is a new journal.
    #[test]
    fn a_file_that_is_not_a_journal_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.sqlite");
        std::fs::write(&empty, b"").unwrap();
        let other = dir.path().join("other.sqlite");
        rusqlite::Connection::open(&other)
            .unwrap()
            .execute_batch("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1);")
            .unwrap();
        let bare = dir.path().join("bare.sqlite");
        rusqlite::Connection::open(&bare)
            .unwrap()
            .execute_batch("PRAGMA user_version = 7;")
            .unwrap();
        let text = dir.path().join("notes.txt");
        std::fs::write(
            &text,
            "not a database at all, but long enough to have a header and more",
        )
        .unwrap();
        for path in [&empty, &other, &bare, &text] {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
            let before = std::fs::read(path).unwrap();
            for (how, opened) in [
                ("open", Journal::open(path).err()),
                ("own", Journal::own(path, "pid 1").err()),
            ] {
                let e = opened.unwrap_or_else(|| panic!("{how} {} is refused", path.display()));
                assert!(matches!(e, JournalError::NotAJournal { .. }), "{e}");
                let said = e.to_string();
                assert!(
                    said.starts_with(&format!(
                        "journal {} exists but is not a pdwarden journal (",
                        path.display()
                    )),
                    "{said}"
                );
                assert!(said.contains("move it away"), "{said}");
                assert!(!said.contains('\n'));
            }
            assert_eq!(
                std::fs::read(path).unwrap(),
                before,
                "{} left as it was",
                path.display()
            );
            let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o644, "{}", path.display());
            assert!(!sqlite::owner_file(path).exists(), "nothing written beside it");
        }
        // A new journal, and nothing else beside it (its directory must
        // exist: a mistyped path is refused, not made).
        std::fs::create_dir(dir.path().join("state")).unwrap();
        let fresh = dir.path().join("state").join("j.sqlite");
        let j = Journal::own(&fresh, "pid 1").unwrap();
        j.begin("op-1", "co_restart", "a", None).unwrap();
        drop(j);
        let left: Vec<String> = std::fs::read_dir(fresh.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.ends_with(".owner"))
            .collect();
        assert_eq!(left, vec!["j.sqlite"]);
        assert_eq!(Journal::open(&fresh).unwrap().unfinished().unwrap().len(), 1);
        let fresh2 = dir.path().join("j2.sqlite");
        Journal::open(&fresh2)
            .unwrap()
            .begin("op-1", "co_restart", "a", None)
            .unwrap();
    }
}

/// The journal's rules, whatever its store: one suite, run on SQLite
/// (`tests::one_running_operation_per_pair`) and on etcd
/// (`etcd::tests::the_etcd_journal_keeps_the_journal_rules`) — issue 33:
/// it was written once per store and the copies drifted.
#[cfg(test)]
pub(crate) mod contract {
    use super::*;

    /// One running operation per pair; a request id runs at most once
    /// (named whether still running or ended); states and entries read
    /// back in order, the last typed state included; a conclusion is
    /// written once (the same one again is no error, another is refused)
    /// and frees the pair; history and the unfinished list say the same.
    pub(crate) fn keeps_the_journal_rules(j: &Journal) {
        j.begin("op-1", "co_restart", "a", Some("r1")).unwrap();
        match j.begin("op-2", "co_restart", "a", Some("r2")) {
            Err(JournalError::PairBusy { operation_id, .. }) => assert_eq!(operation_id, "op-1"),
            other => panic!("expected PairBusy, got {other:?}"),
        }
        j.begin("op-3", "co_restart", "b", None).unwrap();
        // The same request again (a retry after a lost reply) starts nothing
        // and names the operation it started, here or on another pair.
        match j.begin("op-4", "co_restart", "a", Some("r1")) {
            Err(e @ JournalError::DuplicateRequest { .. }) => {
                let text = e.to_string();
                assert!(
                    text.contains("operation op-1") && text.contains("still running"),
                    "{text}"
                );
            }
            other => panic!("expected DuplicateRequest, got {other:?}"),
        }
        match j.begin("op-5", "verify", "c", Some("r1")) {
            Err(JournalError::DuplicateRequest { operation_id, .. }) => assert_eq!(operation_id, "op-1"),
            other => panic!("expected DuplicateRequest, got {other:?}"),
        }
        j.transition("op-1", 5, "restarting_prefill").unwrap();
        j.append("op-1", 7, "phase", &serde_json::json!({"phase": "spawned"}))
            .unwrap();
        j.enter("op-1", 8, "restarting_decode", Some(&vec!["c1"])).unwrap();
        j.transition("op-1", 9, "verifying").unwrap();
        assert_eq!(
            j.last_state::<Vec<String>>("op-1").unwrap(),
            Some(vec!["c1".to_string()])
        );
        let unfinished: Vec<String> = j.unfinished().unwrap().into_iter().map(|r| r.operation_id).collect();
        assert_eq!(unfinished, vec!["op-1", "op-3"]);
        assert_eq!(j.unfinished().unwrap()[0].state, "verifying");
        j.conclude("op-1", "healthy", &serde_json::json!({"verdict": "healthy"}))
            .unwrap();
        assert!(!j.conclude_if_running("op-1", "failed", &serde_json::json!({})).unwrap());
        // A conclusion is never overwritten (issue 32); the same one again
        // (a retried write) is no error.
        match j.conclude("op-1", "failed", &serde_json::json!({"verdict": "failed"})) {
            Err(e @ JournalError::AlreadyConcluded { .. }) => assert!(
                e.to_string().contains("operation op-1 was already concluded (healthy)"),
                "{e}"
            ),
            other => panic!("expected AlreadyConcluded, got {other:?}"),
        }
        j.conclude("op-1", "healthy", &serde_json::json!({"verdict": "healthy"}))
            .unwrap();
        match j.begin("op-6", "co_restart", "a", Some("r1")) {
            Err(e @ JournalError::DuplicateRequest { .. }) => assert!(e.to_string().contains("ended: healthy"), "{e}"),
            other => panic!("expected DuplicateRequest, got {other:?}"),
        }
        j.begin("op-4", "co_restart", "a", None).unwrap();
        let e = j.entries("op-1").unwrap();
        assert_eq!(
            e.iter().map(|(at, k, _)| (*at, k.as_str())).collect::<Vec<_>>(),
            vec![(5, "transition"), (7, "phase"), (8, "transition"), (9, "transition")]
        );
        assert_eq!(e[1].2["phase"], "spawned");
        let h = j.history("a", 10).unwrap();
        assert_eq!(
            h.iter().map(|r| r.operation_id.as_str()).collect::<Vec<_>>(),
            vec!["op-4", "op-1"],
            "newest first"
        );
        assert_eq!(h[1].verdict.as_deref(), Some("healthy"));
        assert_eq!(h[1].report.as_ref().unwrap()["verdict"], "healthy");
        let unfinished: Vec<String> = j.unfinished().unwrap().into_iter().map(|r| r.operation_id).collect();
        assert_eq!(unfinished, vec!["op-3", "op-4"]);
    }

    /// Issue 35: evidence captures are kept for the pair's newest `keep`
    /// operations that took one; older ones are forgotten (their other
    /// entries and reports stay), on every store.
    pub(crate) fn keeps_only_the_newest_captures(j: &Journal) {
        for n in 0..5 {
            let id = format!("cap-{n}");
            // Newest first is by start time: a millisecond apart.
            j.store
                .insert(&id, "co_restart", "c", None, unix_ms() - 1_000 + n)
                .unwrap();
            j.append(&id, 0, "trigger", &n).unwrap();
            if n != 2 {
                j.append(&id, 1, "evidence", &serde_json::json!({ "n": n })).unwrap();
            }
            j.conclude(&id, "healthy", &serde_json::json!({ "verdict": "healthy" }))
                .unwrap();
        }
        assert_eq!(j.retain_captures("c", "evidence", 2, i64::MAX).unwrap(), 2);
        let kept: Vec<bool> = (0..5)
            .map(|n| {
                !j.read::<serde_json::Value>(&format!("cap-{n}"), "evidence")
                    .unwrap()
                    .is_empty()
            })
            .collect();
        assert_eq!(kept, vec![false, false, false, true, true]);
        // The rest of a forgotten capture's operation stays.
        assert_eq!(j.read::<u32>("cap-0", "trigger").unwrap(), vec![0]);
        // Nothing left to forget; an age bound of 0 forgets them all.
        assert_eq!(j.retain_captures("c", "evidence", 2, i64::MAX).unwrap(), 0);
        assert_eq!(j.retain_captures("c", "evidence", 2, -1).unwrap(), 2);
    }

    /// Issue 36: a year of simulated operations — `pairs` pairs, a
    /// co-restart every `every_hours` hours, each with its transitions,
    /// attempts and probes and a report of a real one's size — with the
    /// retention pass run once a simulated day, ends within the bound:
    /// per pair at most `summaries_per_pair` operations, the newest
    /// `full_per_pair` whole; the journal's live bytes within what that
    /// many whole and summary operations take. Returns the journal's size
    /// and `history PAIR` (20) latencies, ms, for the caller to report.
    pub(crate) fn retention_keeps_a_year_within_bounds(
        j: &Journal,
        pairs: u32,
        every_hours: i64,
        pass_every_days: i64,
    ) -> (JournalSize, Vec<f64>) {
        let policy = RetentionPolicy::default();
        let before = j.size().unwrap().operations;
        let run = simulate_year(j, &policy, pairs, every_hours, pass_every_days).unwrap();
        let n = run.written;
        let report = year_report();
        let full_bytes = serde_json::to_string(&report).unwrap().len() as u64 + 7 * 200;
        let mut latencies = Vec::new();
        for p in 0..pairs {
            let pair = format!("pair-{p}");
            let all = j.history(&pair, u32::MAX).unwrap();
            assert!(
                all.len() as u32 <= policy.summaries_per_pair,
                "{pair}: {} operations kept",
                all.len()
            );
            let whole = all
                .iter()
                .filter(|r| r.report.as_ref().is_some_and(|r| r["compacted"] != true))
                .count();
            assert!(whole as u32 <= policy.full_per_pair, "{pair}: {whole} whole");
            // The newest are the whole ones; a compacted one keeps its verdict,
            // reasons and trigger.
            assert!(
                all[..whole]
                    .iter()
                    .all(|r| r.report.as_ref().unwrap()["compacted"] != true)
            );
            let old = all.last().unwrap();
            assert_eq!(old.report.as_ref().unwrap()["reasons"][0], "every unit generates");
            assert_eq!(old.verdict.as_deref(), Some("healthy"));
            for _ in 0..20 {
                let started = tokio::time::Instant::now();
                assert_eq!(j.history(&pair, 20).unwrap().len(), 20);
                latencies.push(started.elapsed().as_secs_f64() * 1000.0);
            }
        }
        let size = j.size().unwrap();
        let per_pair = u64::from(policy.full_per_pair) * full_bytes + u64::from(policy.summaries_per_pair) * 600;
        // Records, indexes and page slack (SQLite is vacuumed past half).
        let bound = 3 * u64::from(pairs) * per_pair;
        assert!(
            size.bytes <= bound,
            "{size:?} over the bound {bound} bytes ({n} operations written)"
        );
        assert!(
            size.operations <= before + u64::from(pairs * policy.summaries_per_pair),
            "{size:?}"
        );
        (size, latencies)
    }
}
