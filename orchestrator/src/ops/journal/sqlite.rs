//! The embedded journal store: one SQLite file, owned by exactly one
//! orchestrator (an exclusive lock on `<journal>.owner`, DESIGN.md 15).
//!
//! A partial unique index makes "one running operation per pair" a property
//! of the file, not of a process's memory, so it survives an orchestrator
//! restart; a state change and its `transition` entry are one transaction.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};

use super::{JournalError, OperationMeta, OperationRecord, Store};

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

pub(super) fn owner_file(journal: &Path) -> PathBuf {
    let mut name = journal.as_os_str().to_os_string();
    name.push(".owner");
    PathBuf::from(name)
}

pub struct SqliteStore {
    conn: Mutex<Connection>,
    /// The owner file, locked for as long as this journal is open
    /// (`SqliteStore::own`); the lock goes with the process, however it ends.
    _owner: Option<std::fs::File>,
}

impl SqliteStore {
    pub fn open(path: &Path) -> Result<Self, JournalError> {
        // The journal holds operation reports (a change's environment):
        // its directory, when made here, is 0700 and its files 0600,
        // whatever the umask (issue 32). SQLite's unix VFS creates `-wal`
        // and `-shm` with the database file's mode, so the file is made
        // (or tightened) before SQLite opens it; a `-wal`/`-shm` an
        // earlier version left behind is tightened too. Where any of this
        // fails, SQLite's own open says why (or the file stays as it was).
        let name = path.as_os_str().as_encoded_bytes();
        if name != b":memory:" && !name.starts_with(b"file:") {
            use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
                let _ = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir);
            }
            let private = std::fs::Permissions::from_mode(0o600);
            if let Ok(file) = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(path)
                && let Err(e) = file.set_permissions(private.clone())
            {
                tracing::warn!(journal = %path.display(), error = %e, "cannot make the journal private (0600)");
            }
            for suffix in ["-wal", "-shm"] {
                let mut name = path.as_os_str().to_os_string();
                name.push(suffix);
                let _ = std::fs::set_permissions(PathBuf::from(name), private.clone());
            }
        }
        let conn = Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        Ok(Self {
            conn: Mutex::new(conn),
            _owner: None,
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
        // Made 0600 (and its directory 0700), like the journal (`open`).
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(io)?;
        }
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
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
        // Ours now: an earlier version's looser owner file is tightened.
        let private = std::fs::Permissions::from_mode(0o600);
        file.set_permissions(private).map_err(io)?;
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        file.write_all(holder.as_bytes()).map_err(io)?;
        file.flush().map_err(io)?;
        let mut store = Self::open(path)?;
        store._owner = Some(file);
        Ok(store)
    }

    pub(super) fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves SQLite consistent (every write
        // is one statement), so a poisoned lock is safe to reuse.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
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

impl Store for SqliteStore {
    fn insert(
        &self,
        operation_id: &str,
        kind: &str,
        pair: &str,
        request_id: Option<&str>,
        started_unix_ms: i64,
    ) -> Result<(), JournalError> {
        let conn = self.conn();
        let res = conn.execute(
            "INSERT INTO operations (id, kind, pair, request_id, state, started_unix_ms) VALUES (?1, ?2, ?3, ?4, 'started', ?5)",
            params![operation_id, kind, pair, request_id, started_unix_ms],
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

    fn append(&self, operation_id: &str, at_ms: u64, kind: &str, payload: &str) -> Result<(), JournalError> {
        self.conn().execute(
            "INSERT INTO entries (op_id, seq, at_ms, kind, payload) VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM entries WHERE op_id = ?1), ?2, ?3, ?4)",
            params![operation_id, at_ms as i64, kind, payload],
        )?;
        Ok(())
    }

    fn enter(&self, operation_id: &str, at_ms: u64, state: &str, payload: &str) -> Result<(), JournalError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute(
            "UPDATE operations SET state = ?2 WHERE id = ?1",
            params![operation_id, state],
        )?;
        tx.execute(
            "INSERT INTO entries (op_id, seq, at_ms, kind, payload) VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM entries WHERE op_id = ?1), ?2, 'transition', ?3)",
            params![operation_id, at_ms as i64, payload],
        )?;
        tx.commit()?;
        Ok(())
    }

    fn write_conclusion(
        &self,
        operation_id: &str,
        verdict: &str,
        report: &str,
        ended_unix_ms: i64,
        only_if_running: bool,
    ) -> Result<bool, JournalError> {
        let sql = if only_if_running {
            "UPDATE operations SET state = 'concluded', ended_unix_ms = ?2, verdict = ?3, report = ?4 WHERE id = ?1 AND ended_unix_ms IS NULL"
        } else {
            "UPDATE operations SET state = 'concluded', ended_unix_ms = ?2, verdict = ?3, report = ?4 WHERE id = ?1"
        };
        Ok(self
            .conn()
            .execute(sql, params![operation_id, ended_unix_ms, verdict, report])?
            > 0)
    }

    fn meta(&self, operation_id: &str) -> Result<Option<OperationMeta>, JournalError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT kind, pair, request_id, ended_unix_ms IS NULL FROM operations WHERE id = ?1",
                params![operation_id],
                |r| {
                    Ok(OperationMeta {
                        kind: r.get(0)?,
                        pair: r.get(1)?,
                        request_id: r.get(2)?,
                        running: r.get(3)?,
                    })
                },
            )
            .optional()?)
    }

    fn ping(&self) -> Result<(), JournalError> {
        self.conn()
            .query_row("SELECT count(*) FROM operations WHERE ended_unix_ms IS NULL", [], |r| {
                r.get::<_, i64>(0)
            })?;
        Ok(())
    }

    fn unfinished(&self) -> Result<Vec<OperationRecord>, JournalError> {
        self.query("WHERE ended_unix_ms IS NULL ORDER BY started_unix_ms, rowid", params![])
    }

    fn history(&self, pair: &str, limit: u32) -> Result<Vec<OperationRecord>, JournalError> {
        self.query(
            "WHERE pair = ?1 ORDER BY started_unix_ms DESC, rowid DESC LIMIT ?2",
            params![pair, limit],
        )
    }

    fn entries(&self, operation_id: &str) -> Result<Vec<(u64, String, String)>, JournalError> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT at_ms, kind, payload FROM entries WHERE op_id = ?1 ORDER BY seq")?;
        let rows = stmt.query_map(params![operation_id], |r| {
            Ok((
                r.get::<_, i64>(0)? as u64,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
            ))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    #[cfg(test)]
    fn as_sqlite(&self) -> Option<&SqliteStore> {
        Some(self)
    }
}

/// Issue 32 (secrets): the journal holds operation reports (a change's
/// environment, an actor's name): it and its `-wal`, `-shm` and `.owner`
/// files are the service user's alone.
#[cfg(test)]
mod secrets_tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .permissions()
            .mode()
            & 0o777
    }

    fn sibling(db: &Path, suffix: &str) -> PathBuf {
        let mut name = db.as_os_str().to_os_string();
        name.push(suffix);
        PathBuf::from(name)
    }

    /// A new journal, in a directory that does not exist yet: the
    /// directory is made 0700, the files 0600, whatever the umask.
    #[test]
    fn a_new_journal_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state").join("journal.sqlite");
        let store = SqliteStore::own(&db, "pid 1").unwrap();
        store.insert("op-1", "restart", "pair-a", None, 1).unwrap();
        let report = "{\"env\":{\"HF_TOKEN\":\"x\"}}";
        store.append("op-1", 2, "trigger", report).unwrap();
        assert_eq!(mode(db.parent().unwrap()), 0o700);
        for p in [db.clone(), sibling(&db, "-wal"), sibling(&db, "-shm"), owner_file(&db)] {
            assert_eq!(mode(&p), 0o600, "{}", p.display());
        }
    }

    /// A journal an earlier version left world-readable is tightened when
    /// opened (the directory, which may be shared, is left as it is).
    #[test]
    fn an_existing_journal_is_tightened() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("journal.sqlite");
        drop(SqliteStore::own(&db, "pid 1").unwrap());
        // Closing removed the -wal and -shm files; an earlier version's
        // crash would have left them.
        for suffix in ["-wal", "-shm"] {
            std::fs::write(sibling(&db, suffix), b"").unwrap();
        }
        for p in [db.clone(), sibling(&db, "-wal"), sibling(&db, "-shm"), owner_file(&db)] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let store = SqliteStore::own(&db, "pid 2").unwrap();
        store.insert("op-1", "restart", "pair-a", None, 1).unwrap();
        for p in [db.clone(), sibling(&db, "-wal"), sibling(&db, "-shm"), owner_file(&db)] {
            assert_eq!(mode(&p), 0o600, "{}", p.display());
        }
        assert_eq!(mode(dir.path()), 0o755);
    }
}
