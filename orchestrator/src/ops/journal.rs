//! The durable journal of every operation (DESIGN.md 4).
//!
//! One SQLite file. An operation row is written before its first command is
//! sent, each state transition is appended before the commands of that state
//! go out, and every phase event and probe is appended as it arrives; the
//! final report is stored whole. A partial unique index makes "one running
//! operation per pair" a property of the file, not of a process's memory, so
//! it survives an orchestrator restart.

use std::path::Path;
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
        Ok(Self { conn: Mutex::new(conn) })
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
        self.conn().execute(
            "INSERT INTO entries (op_id, seq, at_ms, kind, payload) VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM entries WHERE op_id = ?1), ?2, ?3, ?4)",
            params![operation_id, at_ms as i64, kind, payload],
        )?;
        Ok(())
    }

    /// Records a state transition: the new state on the operation row and a
    /// `transition` entry, in one transaction, before the state's commands go out.
    pub fn transition(&self, operation_id: &str, at_ms: u64, state: &str) -> Result<(), JournalError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute(
            "UPDATE operations SET state = ?2 WHERE id = ?1",
            params![operation_id, state],
        )?;
        tx.execute(
            "INSERT INTO entries (op_id, seq, at_ms, kind, payload) VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM entries WHERE op_id = ?1), ?2, 'transition', ?3)",
            params![operation_id, at_ms as i64, serde_json::to_string(&serde_json::json!({ "state": state }))?],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Concludes an operation with its verdict and final report.
    pub fn conclude(&self, operation_id: &str, verdict: &str, report: &impl Serialize) -> Result<(), JournalError> {
        let report = serde_json::to_string(report)?;
        self.conn().execute(
            "UPDATE operations SET state = 'concluded', ended_unix_ms = ?2, verdict = ?3, report = ?4 WHERE id = ?1",
            params![operation_id, unix_ms(), verdict, report],
        )?;
        Ok(())
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
