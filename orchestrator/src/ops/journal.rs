//! The durable journal of every operation (DESIGN.md 4).
//!
//! One SQLite file. An operation row is written before its first command is
//! sent, each state transition is appended before the commands of that state
//! go out, and every phase event and probe is appended as it arrives; the
//! final report is stored whole. A partial unique index makes "one running
//! operation per pair" a property of the file, not of a process's memory, so
//! it survives an orchestrator restart.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

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

/// A conclusion the journal could not write yet, kept in memory and
/// retried (`Journal::flush_pending`) until it is written.
#[derive(Debug, Clone, Serialize)]
pub struct PendingConclusion {
    pub operation_id: String,
    pub pair: String,
    pub verdict: String,
    /// The write's error, the last time it was tried.
    pub error: String,
    pub since_unix_ms: i64,
    #[serde(skip)]
    report: String,
}

/// A finished or running operation as stored.
#[derive(Debug, Clone, Serialize)]
pub struct OperationRecord {
    pub operation_id: String,
    pub kind: String,
    pub pair: String,
    pub state: String,
    pub started_unix_ms: i64,
    pub ended_unix_ms: Option<i64>,
    pub verdict: Option<String>,
    /// The caller's idempotency key, when it gave one.
    pub request_id: Option<String>,
    /// The final report (the CLI's `--json` object), when concluded.
    pub report: Option<serde_json::Value>,
    /// For an automatic operation, the evidence that triggered it (the
    /// `trigger` entry the watch journals before the first command).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trigger: Option<serde_json::Value>,
    /// Who asked for it (`{name, role}`, the `actor` entry); absent for an
    /// automatic operation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor: Option<serde_json::Value>,
}

pub struct Journal {
    conn: Mutex<Connection>,
    /// The owner file, locked for as long as this journal is open
    /// (`Journal::own`); the lock goes with the process, however it ends.
    _owner: Option<std::fs::File>,
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

    fn failpoint(&self) -> Result<(), rusqlite::Error> {
        let n = self.faults.seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if self.faults.fail_at.lock().unwrap().contains(&n) {
            return Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
                Some(format!("injected: journal write {n} failed (database or disk is full)")),
            ));
        }
        Ok(())
    }
}

#[cfg(not(test))]
impl Journal {
    #[inline]
    fn failpoint(&self) -> Result<(), rusqlite::Error> {
        Ok(())
    }
}

const SCHEMA: &str = r#"
PRAGMA journal_mode = WAL;
PRAGMA synchronous = NORMAL;
CREATE TABLE IF NOT EXISTS operations (
    id              TEXT PRIMARY KEY,
    kind            TEXT NOT NULL,
    pair            TEXT NOT NULL,
    request_id      TEXT UNIQUE,
    state           TEXT NOT NULL,
    started_unix_ms INTEGER NOT NULL,
    ended_unix_ms   INTEGER,
    verdict         TEXT,
    report          TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS one_running_operation_per_pair
    ON operations(pair) WHERE ended_unix_ms IS NULL;
CREATE TABLE IF NOT EXISTS entries (
    op_id   TEXT NOT NULL REFERENCES operations(id),
    seq     INTEGER NOT NULL,
    at_ms   INTEGER NOT NULL,
    kind    TEXT NOT NULL,
    payload TEXT NOT NULL,
    PRIMARY KEY (op_id, seq)
);
"#;

fn owner_file(journal: &Path) -> PathBuf {
    let mut name = journal.as_os_str().to_os_string();
    name.push(".owner");
    PathBuf::from(name)
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
    pub fn open(path: &Path) -> Result<Self, JournalError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        Ok(Self {
            conn: Mutex::new(conn),
            _owner: None,
            pending: Mutex::default(),
            observer: std::sync::OnceLock::new(),
            #[cfg(test)]
            faults: WriteFaults::default(),
        })
    }

    /// Opens the journal as its one owner: an exclusive lock on
    /// `<journal>.owner`, which says who holds it (`holder`: the pid, the
    /// listen address). Refused, naming the holder, while another process
    /// holds it; a holder that died (even by SIGKILL) released it.
    pub fn own(path: &Path, holder: &str) -> Result<Self, JournalError> {
        use std::io::{Read, Seek, Write};
        let owner_path = owner_file(path);
        let io = |error| JournalError::OwnerFile {
            path: owner_path.clone(),
            error,
        };
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&owner_path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut held = String::new();
                let _ = file.read_to_string(&mut held);
                return Err(JournalError::Owned {
                    path: path.to_path_buf(),
                    holder: match held.trim() {
                        "" => "holder unknown".into(),
                        h => h.to_string(),
                    },
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        file.write_all(holder.as_bytes()).map_err(io)?;
        file.flush().map_err(io)?;
        let mut journal = Self::open(path)?;
        journal._owner = Some(file);
        Ok(journal)
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves SQLite consistent (every write
        // is one statement), so a poisoned lock is safe to reuse.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
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
        let conn = self.conn();
        let res = conn.execute(
            "INSERT INTO operations (id, kind, pair, request_id, state, started_unix_ms) VALUES (?1, ?2, ?3, ?4, 'started', ?5)",
            params![operation_id, kind, pair, request_id, unix_ms()],
        );
        match res {
            Ok(_) => Ok(()),
            Err(rusqlite::Error::SqliteFailure(e, _)) if e.code == rusqlite::ErrorCode::ConstraintViolation => {
                if let Some(rid) = request_id {
                    let earlier = conn
                        .query_row(
                            "SELECT id, kind, pair, ended_unix_ms, verdict FROM operations WHERE request_id = ?1",
                            params![rid],
                            |r| {
                                let ended: Option<i64> = r.get(3)?;
                                let verdict: Option<String> = r.get(4)?;
                                Ok(JournalError::DuplicateRequest {
                                    request_id: rid.to_string(),
                                    operation_id: r.get(0)?,
                                    kind: r.get(1)?,
                                    pair: r.get(2)?,
                                    outcome: match ended {
                                        None => "still running".into(),
                                        Some(_) => format!("ended: {}", verdict.as_deref().unwrap_or("no verdict")),
                                    },
                                })
                            },
                        )
                        .optional()?;
                    if let Some(duplicate) = earlier {
                        return Err(duplicate);
                    }
                }
                let running: Option<String> = conn
                    .query_row(
                        "SELECT id FROM operations WHERE pair = ?1 AND ended_unix_ms IS NULL",
                        params![pair],
                        |r| r.get(0),
                    )
                    .optional()?;
                Err(JournalError::PairBusy {
                    pair: pair.to_string(),
                    operation_id: running.unwrap_or_else(|| format!("with request id {}", request_id.unwrap_or("?"))),
                })
            }
            Err(e) => Err(e.into()),
        }
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
        self.conn().execute(
            "INSERT INTO entries (op_id, seq, at_ms, kind, payload) VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM entries WHERE op_id = ?1), ?2, ?3, ?4)",
            params![operation_id, at_ms as i64, kind, payload],
        )?;
        Ok(())
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
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute(
            "UPDATE operations SET state = ?2 WHERE id = ?1",
            params![operation_id, state],
        )?;
        tx.execute(
            "INSERT INTO entries (op_id, seq, at_ms, kind, payload) VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM entries WHERE op_id = ?1), ?2, 'transition', ?3)",
            params![operation_id, at_ms as i64, serde_json::to_string(&payload)?],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// The typed state `operation_id` last entered ([`Journal::enter`]), if
    /// it journaled one. One that does not read as `T` is an error.
    pub fn last_state<T: serde::de::DeserializeOwned>(&self, operation_id: &str) -> Result<Option<T>, JournalError> {
        let conn = self.conn();
        let payload: Option<String> = conn
            .query_row(
                "SELECT payload FROM entries WHERE op_id = ?1 AND kind = 'transition' AND json_extract(payload, '$.data') IS NOT NULL ORDER BY seq DESC LIMIT 1",
                params![operation_id],
                |r| r.get(0),
            )
            .optional()?;
        match payload {
            None => Ok(None),
            Some(p) => {
                let mut v: serde_json::Value = serde_json::from_str(&p)?;
                Ok(Some(serde_json::from_value(v["data"].take())?))
            }
        }
    }

    /// Concludes an operation with its verdict and final report. A write
    /// that fails (a full disk) is kept and retried: the error is returned,
    /// and until the write succeeds `begin` on the pair says why the pair
    /// is not free, and `pending_conclusions` lists it.
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
        self.conclude_where(operation_id, verdict, report, true)
    }

    fn conclude_where(
        &self,
        operation_id: &str,
        verdict: &str,
        report: &impl Serialize,
        only_if_running: bool,
    ) -> Result<bool, JournalError> {
        let report = serde_json::to_string(report)?;
        match self.write_conclusion(operation_id, verdict, &report, only_if_running) {
            Ok(n) => {
                self.pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(operation_id);
                if n > 0 {
                    self.observe(operation_id, verdict, &report);
                }
                Ok(n > 0)
            }
            Err(e) => {
                let pair: Option<String> = self
                    .conn()
                    .query_row(
                        "SELECT pair FROM operations WHERE id = ?1 AND ended_unix_ms IS NULL",
                        params![operation_id],
                        |r| r.get(0),
                    )
                    .optional()
                    .ok()
                    .flatten();
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
                Err(e.into())
            }
        }
    }

    fn write_conclusion(
        &self,
        operation_id: &str,
        verdict: &str,
        report: &str,
        only_if_running: bool,
    ) -> Result<usize, rusqlite::Error> {
        let sql = if only_if_running {
            "UPDATE operations SET state = 'concluded', ended_unix_ms = ?2, verdict = ?3, report = ?4 WHERE id = ?1 AND ended_unix_ms IS NULL"
        } else {
            "UPDATE operations SET state = 'concluded', ended_unix_ms = ?2, verdict = ?3, report = ?4 WHERE id = ?1"
        };
        self.failpoint()?;
        self.conn()
            .execute(sql, params![operation_id, unix_ms(), verdict, report])
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
        self.conn()
            .query_row("SELECT count(*) FROM operations WHERE ended_unix_ms IS NULL", [], |r| {
                r.get::<_, i64>(0)
            })?;
        Ok(())
    }

    /// Tells `metrics` of every conclusion written from now on (once per
    /// journal; a second call is ignored).
    pub fn observe_conclusions(&self, metrics: crate::ops::telemetry::OperationMetrics) {
        let _ = self.observer.set(metrics);
    }

    fn observe(&self, operation_id: &str, verdict: &str, report: &str) {
        let Some(m) = self.observer.get() else { return };
        let row: Option<(String, String, Option<String>)> = self
            .conn()
            .query_row(
                "SELECT kind, pair, request_id FROM operations WHERE id = ?1",
                params![operation_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .ok()
            .flatten();
        let Some((kind, pair, request_id)) = row else { return };
        let report = serde_json::from_str(report).unwrap_or(serde_json::Value::Null);
        m.concluded(&crate::ops::telemetry::Concluded {
            kind: &kind,
            pair: &pair,
            request_id: request_id.as_deref(),
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
        self.query("WHERE ended_unix_ms IS NULL ORDER BY started_unix_ms, rowid", params![])
    }

    /// The pair's operations, newest first.
    pub fn history(&self, pair: &str, limit: u32) -> Result<Vec<OperationRecord>, JournalError> {
        self.query(
            "WHERE pair = ?1 ORDER BY started_unix_ms DESC, rowid DESC LIMIT ?2",
            params![pair, limit],
        )
    }

    /// Raw entries of an operation, in order: (at_ms, kind, payload).
    pub fn entries(&self, operation_id: &str) -> Result<Vec<(u64, String, serde_json::Value)>, JournalError> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT at_ms, kind, payload FROM entries WHERE op_id = ?1 ORDER BY seq")?;
        let rows = stmt.query_map(params![operation_id], |r| {
            Ok((
                r.get::<_, i64>(0)? as u64,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (at, kind, payload) = row?;
            out.push((at, kind, serde_json::from_str(&payload)?));
        }
        Ok(out)
    }

    /// Every entry of `kind` that `operation_id` journaled, in order, read as
    /// `T`. One that does not read is an error (a resume must not guess
    /// around a record it cannot read).
    pub fn read<T: serde::de::DeserializeOwned>(&self, operation_id: &str, kind: &str) -> Result<Vec<T>, JournalError> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT payload FROM entries WHERE op_id = ?1 AND kind = ?2 ORDER BY seq")?;
        let rows = stmt.query_map(params![operation_id, kind], |r| r.get::<_, String>(0))?;
        let mut out = Vec::new();
        for row in rows {
            out.push(serde_json::from_str(&row?)?);
        }
        Ok(out)
    }

    /// The commands `operation_id` journaled, in order. An entry that does
    /// not read as a [`CommandEntry`] is an error: a resume must not guess.
    pub fn commands(&self, operation_id: &str) -> Result<Vec<CommandEntry>, JournalError> {
        self.read(operation_id, COMMAND)
    }

    fn query(&self, tail: &str, p: impl rusqlite::Params) -> Result<Vec<OperationRecord>, JournalError> {
        let conn = self.conn();
        let sql = format!(
            "SELECT id, kind, pair, state, started_unix_ms, ended_unix_ms, verdict, report, (SELECT payload FROM entries WHERE op_id = operations.id AND kind = 'trigger' ORDER BY seq LIMIT 1), (SELECT payload FROM entries WHERE op_id = operations.id AND kind = 'actor' ORDER BY seq LIMIT 1), request_id FROM operations {tail}"
        );
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map(p, |r| {
            Ok((
                OperationRecord {
                    operation_id: r.get(0)?,
                    kind: r.get(1)?,
                    pair: r.get(2)?,
                    state: r.get(3)?,
                    started_unix_ms: r.get(4)?,
                    ended_unix_ms: r.get(5)?,
                    verdict: r.get(6)?,
                    request_id: r.get(10)?,
                    report: None,
                    trigger: None,
                    actor: None,
                },
                r.get::<_, Option<String>>(7)?,
                r.get::<_, Option<String>>(8)?,
                r.get::<_, Option<String>>(9)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (mut rec, report, trigger, actor) = row?;
            rec.report = report.map(|s| serde_json::from_str(&s)).transpose()?;
            rec.trigger = trigger.map(|s| serde_json::from_str(&s)).transpose()?;
            rec.actor = actor.map(|s| serde_json::from_str(&s)).transpose()?;
            out.push(rec);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The database full: no page beyond those it has (`None`: the default).
    fn fill_disk(j: &Journal, full: bool) {
        let conn = j.conn();
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
        let j = Journal::open(&dir.path().join("j.sqlite")).unwrap();
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
        assert_eq!(std::fs::read_to_string(owner_file(&path)).unwrap(), "pid 202");
    }

    /// One running operation per pair is enforced by the file itself, and
    /// concluding frees the pair.
    #[test]
    fn one_running_operation_per_pair() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(&dir.path().join("j.sqlite")).unwrap();
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
        j.conclude("op-1", "healthy", &serde_json::json!({"verdict": "healthy"}))
            .unwrap();
        match j.begin("op-6", "co_restart", "a", Some("r1")) {
            Err(e @ JournalError::DuplicateRequest { .. }) => assert!(e.to_string().contains("ended: healthy"), "{e}"),
            other => panic!("expected DuplicateRequest, got {other:?}"),
        }
        j.begin("op-4", "co_restart", "a", None).unwrap();
        let e = j.entries("op-1").unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].1, "transition");
        assert_eq!(e[1].2["phase"], "spawned");
        let h = j.history("a", 10).unwrap();
        assert_eq!(h.len(), 2);
        assert_eq!(
            h.iter().find(|r| r.operation_id == "op-1").unwrap().verdict.as_deref(),
            Some("healthy")
        );
        let unfinished: Vec<String> = j.unfinished().unwrap().into_iter().map(|r| r.operation_id).collect();
        assert_eq!(unfinished, vec!["op-3", "op-4"]);
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
}
