//! The embedded journal store: one SQLite file, owned by exactly one
//! orchestrator (DESIGN.md 15): an exclusive lock on the journal file itself
//! — its inode, so every name of it (a symlink, another spelling of the
//! path, a hard link) is refused while it is held — and the holder's
//! description in `<journal's real path>.owner`.
//!
//! A partial unique index makes "one running operation per pair" a property
//! of the file, not of a process's memory, so it survives an orchestrator
//! restart; a state change and its `transition` entry are one transaction.
//! A path that does not exist is a new journal, made whole (its tables
//! written) before it takes its name; a file there that is not a pdwarden
//! journal (empty, without an `operations` table, not SQLite) is refused,
//! never taken for a new one (issue 32).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};

use super::{JournalError, JournalSize, OperationMeta, Store, StoredRow};
use pdwarden_model::status::OperationRecord;

/// Set at every open (`journal_mode` is kept by the file).
const PRAGMAS: &str = r#"
PRAGMA journal_mode = WAL;
PRAGMA synchronous = NORMAL;
"#;

const TABLES: &str = r#"
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
CREATE INDEX IF NOT EXISTS operations_by_pair ON operations(pair, started_unix_ms);
CREATE TABLE IF NOT EXISTS entries (
    op_id   TEXT NOT NULL REFERENCES operations(id),
    seq     INTEGER NOT NULL,
    at_ms   INTEGER NOT NULL,
    kind    TEXT NOT NULL,
    payload TEXT NOT NULL,
    PRIMARY KEY (op_id, seq)
);
"#;

/// `<journal>.owner`, beside the journal's real path (symlinks and `..`
/// resolved, where it exists): the holder's description.
pub(super) fn owner_file(journal: &Path) -> PathBuf {
    let journal = std::fs::canonicalize(journal).unwrap_or_else(|_| journal.to_path_buf());
    sibling(&journal, ".owner")
}

fn sibling(path: &Path, suffix: impl AsRef<std::ffi::OsStr>) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

/// A journal held as its one owner: the lock on the journal file, and the
/// owner file naming the holder, emptied when released.
struct Owner {
    _journal: std::fs::File,
    file: std::fs::File,
}

impl Drop for Owner {
    fn drop(&mut self) {
        // Still locked here: what is emptied is this holder's own line.
        let _ = self.file.set_len(0);
    }
}

pub struct SqliteStore {
    conn: Mutex<Connection>,
    /// The journal's lock, held for as long as this journal is open
    /// (`SqliteStore::own`); the lock goes with the process, however it
    /// ends. After `conn`: released once SQLite has closed the file.
    _owner: Option<Owner>,
}

impl SqliteStore {
    /// Opens the journal at `path`, not as its owner (tools and tests); a
    /// path that does not exist is made a new journal. A file there that
    /// is not a pdwarden journal is refused ([`JournalError::NotAJournal`]),
    /// left as it was.
    pub fn open(path: &Path) -> Result<Self, JournalError> {
        // The journal holds operation reports (a change's environment):
        // its directory, when made here, is 0700 and its files 0600,
        // whatever the umask (issue 32). SQLite's unix VFS creates `-wal`
        // and `-shm` with the database file's mode, so a new journal is
        // made 0600 (`create`) and an existing one tightened before
        // anything is written to it; a `-wal`/`-shm` an earlier version
        // left behind (or the check's read just made) is tightened too.
        // Where any of this fails, SQLite's own open says why (or the file
        // stays as it was). A file that is not a journal is left as it was.
        let name = path.as_os_str().as_encoded_bytes();
        let on_disk = name != b":memory:" && !name.starts_with(b"file:");
        if on_disk {
            Self::make(path)?;
        }
        let conn = Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        if on_disk {
            use std::os::unix::fs::PermissionsExt;
            Self::is_a_journal(&conn, path)?;
            // By name, never by a new descriptor: closing one would drop
            // this process's SQLite locks on the file.
            let private = std::fs::Permissions::from_mode(0o600);
            if let Err(e) = std::fs::set_permissions(path, private.clone()) {
                tracing::warn!(journal = %path.display(), error = %e, "cannot make the journal private (0600)");
            }
            for suffix in ["-wal", "-shm"] {
                let _ = std::fs::set_permissions(sibling(path, suffix), private.clone());
            }
        }
        conn.execute_batch(PRAGMAS)?;
        conn.execute_batch(TABLES)?;
        Ok(Self {
            conn: Mutex::new(conn),
            _owner: None,
        })
    }

    /// Makes a new journal at `path` where nothing is. A directory that does
    /// not exist is refused, not made: a mistyped `journal` path must not
    /// start a fresh, empty history somewhere else (the service manager
    /// makes the state directory, 0700: `StateDirectoryMode`).
    fn make(path: &Path) -> Result<(), JournalError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
            return Err(JournalError::Create {
                path: path.to_path_buf(),
                error: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("its directory {} does not exist", dir.display()),
                ),
            });
        }
        if path.exists() {
            return Ok(());
        }
        Self::create(path).map_err(|error| JournalError::Create {
            path: path.to_path_buf(),
            error,
        })
    }

    /// A new journal at `path`, whole or not at all: its tables are
    /// written to a file beside it (rollback journal, so all of it is in
    /// that one file), which then takes the name — never over a file that
    /// appeared there meanwhile. A crash on the way leaves at most that
    /// file (`<journal>.new-PID-N`), never an empty journal, which the
    /// next start would refuse.
    fn create(path: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = sibling(path, format!(".new-{}-{n}", std::process::id()));
        let clean = || {
            for suffix in ["", "-journal", "-wal", "-shm"] {
                let _ = std::fs::remove_file(sibling(&tmp, suffix));
            }
        };
        clean();
        let made = (|| {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            let conn = Connection::open(&tmp).map_err(std::io::Error::other)?;
            conn.execute_batch(TABLES).map_err(std::io::Error::other)?;
            conn.close().map_err(|(_, e)| std::io::Error::other(e))?;
            match std::fs::hard_link(&tmp, path) {
                Ok(()) => Ok(()),
                // Made meanwhile (by another process): checked as any other.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                // No hard links on this file system: a rename, which
                // replaces a file made in between (only just now).
                Err(_) if !path.exists() => std::fs::rename(&tmp, path),
                Err(_) => Ok(()),
            }
        })();
        clean();
        made
    }

    /// Refuses a file that is not a pdwarden journal, before anything is
    /// written to it.
    fn is_a_journal(conn: &Connection, path: &Path) -> Result<(), JournalError> {
        let not_a_journal = |what: &str| JournalError::NotAJournal {
            path: path.to_path_buf(),
            what: what.into(),
        };
        match conn.query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'operations'",
            [],
            |r| r.get::<_, i64>(0),
        ) {
            Ok(n) if n > 0 => Ok(()),
            Ok(_) if std::fs::metadata(path).is_ok_and(|m| m.len() == 0) => Err(not_a_journal("an empty file")),
            Ok(_) => Err(not_a_journal("a SQLite database without an `operations` table")),
            Err(rusqlite::Error::SqliteFailure(e, _)) if e.code == rusqlite::ErrorCode::NotADatabase => {
                Err(not_a_journal("not a SQLite database"))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Opens the journal as its one owner: an exclusive lock on the
    /// journal file itself, whatever name it is given, and the holder
    /// (`holder`: the pid, the listen address) written to
    /// `<journal's real path>.owner`. Refused, naming the holder, while
    /// another process (or another open in this one) holds it; a holder
    /// that died (even by SIGKILL) released it.
    pub fn own(path: &Path, holder: &str) -> Result<Self, JournalError> {
        use std::io::{Read, Seek, Write};
        // Made 0600 (and its directory 0700), like the journal (`open`).
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        Self::make(path)?;
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |error| JournalError::OwnerFile { path, error }
        };
        // The lock is the file's (its inode's), not a name's: a symlink, a
        // `..` or a hard link reaches the same lock. `flock` is apart from
        // SQLite's own (POSIX, byte-range) locks on the file.
        let journal = std::fs::File::open(path).map_err(io(path))?;
        match journal.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(JournalError::Owned {
                    path: path.to_path_buf(),
                    holder: holder_of(path, &journal),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(path)(e)),
        }
        // Nothing is written beside a file that is not a journal.
        let mut store = Self::open(path)?;
        let owner_path = owner_file(path);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&owner_path)
            .map_err(io(&owner_path))?;
        // Locked too: an earlier version's owner held this file's lock.
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
            Err(std::fs::TryLockError::Error(e)) => return Err(io(&owner_path)(e)),
        }
        // Ours now: an earlier version's looser owner file is tightened.
        let private = std::fs::Permissions::from_mode(0o600);
        file.set_permissions(private).map_err(io(&owner_path))?;
        file.set_len(0).map_err(io(&owner_path))?;
        file.rewind().map_err(io(&owner_path))?;
        file.write_all(holder.as_bytes()).map_err(io(&owner_path))?;
        file.flush().map_err(io(&owner_path))?;
        store._owner = Some(Owner {
            _journal: journal,
            file,
        });
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

/// Who holds `journal`'s lock (`file`: the journal, opened): the
/// description beside its real path, or — where the holder was given
/// another name of the file (a hard link) — the process the kernel names
/// (`/proc/locks`).
fn holder_of(journal: &Path, file: &std::fs::File) -> String {
    // The holder writes its description just after it takes the lock (and
    // has opened the journal): a refusal in between waits a moment for it
    // (bounded: a holder of an earlier version never writes it here).
    for _ in 0..50 {
        if let Ok(held) = std::fs::read_to_string(owner_file(journal))
            && !held.trim().is_empty()
        {
            return held.trim().to_string();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    match flock_holder(file) {
        Some(pid) => format!("pid {pid}"),
        None => "holder unknown".into(),
    }
}

/// The pid holding an exclusive `flock` on `file`'s inode, per `/proc/locks`
/// (`1: FLOCK  ADVISORY  WRITE PID MAJOR:MINOR:INODE 0 EOF`, major and minor
/// in hex; a waiter's line has `->` after the number). Read again when not
/// found: a read while other locks come and go can skip lines.
fn flock_holder(file: &std::fs::File) -> Option<u32> {
    (0..5).find_map(|_| flock_holder_once(file))
}

fn flock_holder_once(file: &std::fs::File) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata().ok()?;
    let dev = m.dev();
    let major = ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0000_0fff);
    let minor = ((dev >> 12) & 0xffff_ff00) | (dev & 0x0000_00ff);
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.get(1) != Some(&"FLOCK") || f.get(3) != Some(&"WRITE") {
            return None;
        }
        let mut id = f.get(5)?.split(':');
        let ours = u64::from_str_radix(id.next()?, 16).ok()? == major
            && u64::from_str_radix(id.next()?, 16).ok()? == minor
            && id.next()?.parse::<u64>().ok()? == m.ino();
        if ours { f[4].parse().ok() } else { None }
    })
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
        let conn = self.conn();
        // Only ever over a running operation: a conclusion is written once.
        if conn.execute(
            "UPDATE operations SET state = 'concluded', ended_unix_ms = ?2, verdict = ?3, report = ?4 WHERE id = ?1 AND ended_unix_ms IS NULL",
            params![operation_id, ended_unix_ms, verdict, report],
        )? > 0
        {
            return Ok(true);
        }
        if only_if_running {
            return Ok(false);
        }
        let written: Option<(Option<String>, Option<String>)> = conn
            .query_row(
                "SELECT verdict, report FROM operations WHERE id = ?1",
                params![operation_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        match written {
            None => Ok(false),
            // This very conclusion, written by an earlier try of it.
            Some((v, r)) if v.as_deref() == Some(verdict) && r.as_deref() == Some(report) => Ok(false),
            Some((v, _)) => Err(JournalError::AlreadyConcluded {
                operation_id: operation_id.to_string(),
                verdict: v.unwrap_or_else(|| "no verdict".into()),
            }),
        }
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

    fn forget(&self, operation_id: &str, kind: &str) -> Result<usize, JournalError> {
        Ok(self.conn().execute(
            "DELETE FROM entries WHERE op_id = ?1 AND kind = ?2",
            params![operation_id, kind],
        )?)
    }

    fn pairs(&self) -> Result<Vec<String>, JournalError> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT DISTINCT pair FROM operations ORDER BY pair")?;
        let pairs = stmt.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?;
        Ok(pairs)
    }

    fn rows_of(&self, pair: &str) -> Result<Vec<StoredRow>, JournalError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT id, started_unix_ms, ended_unix_ms IS NOT NULL, COALESCE(substr(report, -length(?2)) = ?2, 0) FROM operations WHERE pair = ?1 ORDER BY started_unix_ms DESC, rowid DESC",
        )?;
        let rows = stmt
            .query_map(params![pair, super::COMPACTED_MARK], |r| {
                Ok(StoredRow {
                    operation_id: r.get(0)?,
                    started_unix_ms: r.get(1)?,
                    concluded: r.get(2)?,
                    compacted: r.get(3)?,
                })
            })?
            .collect::<Result<_, _>>()?;
        Ok(rows)
    }

    fn compact(
        &self,
        operation_id: &str,
        summarise: &dyn Fn(Option<&str>) -> String,
        keep: &[&str],
    ) -> Result<bool, JournalError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let report: Option<Option<String>> = tx
            .query_row(
                "SELECT report FROM operations WHERE id = ?1 AND ended_unix_ms IS NOT NULL",
                params![operation_id],
                |r| r.get(0),
            )
            .optional()?;
        let Some(report) = report else {
            return Ok(false);
        };
        let summary = summarise(report.as_deref());
        let changed = tx.execute(
            "UPDATE operations SET report = ?2 WHERE id = ?1 AND ended_unix_ms IS NOT NULL",
            params![operation_id, summary],
        )?;
        if changed == 0 {
            return Ok(false);
        }
        let keep = serde_json::to_string(keep)?;
        tx.execute(
            "DELETE FROM entries WHERE op_id = ?1 AND kind NOT IN (SELECT value FROM json_each(?2))",
            params![operation_id, keep],
        )?;
        tx.commit()?;
        Ok(true)
    }

    fn remove(&self, operation_id: &str) -> Result<bool, JournalError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let ended: Option<Option<i64>> = tx
            .query_row(
                "SELECT ended_unix_ms FROM operations WHERE id = ?1",
                params![operation_id],
                |r| r.get(0),
            )
            .optional()?;
        if !matches!(ended, Some(Some(_))) {
            return Ok(false);
        }
        tx.execute("DELETE FROM entries WHERE op_id = ?1", params![operation_id])?;
        tx.execute("DELETE FROM operations WHERE id = ?1", params![operation_id])?;
        tx.commit()?;
        Ok(true)
    }

    fn size(&self) -> Result<JournalSize, JournalError> {
        let conn = self.conn();
        let count = |sql: &str| conn.query_row(sql, [], |r| r.get::<_, i64>(0));
        let pages = count("PRAGMA page_count")? - count("PRAGMA freelist_count")?;
        Ok(JournalSize {
            operations: count("SELECT count(*) FROM operations")? as u64,
            entries: count("SELECT count(*) FROM entries")? as u64,
            bytes: (pages * count("PRAGMA page_size")?) as u64,
        })
    }

    fn reclaim(&self) -> Result<(), JournalError> {
        let conn = self.conn();
        let count = |sql: &str| conn.query_row(sql, [], |r| r.get::<_, i64>(0));
        let file = count("PRAGMA page_count")? * count("PRAGMA page_size")?;
        let live = count(
            "SELECT (SELECT COALESCE(SUM(LENGTH(report)) + COUNT(*) * 100, 0) FROM operations) + (SELECT COALESCE(SUM(LENGTH(payload)) + COUNT(*) * 40, 0) FROM entries)",
        )?;
        if file > 2 * live.max(1 << 20) {
            // Rewrites the file: the journal's writes wait for it (about a
            // second per 100 MB here), once the file is mostly slack.
            conn.execute_batch("VACUUM")?;
        }
        Ok(())
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

    /// A new journal's files are 0600, whatever the umask; a directory
    /// that does not exist is refused, not made (a mistyped path).
    #[test]
    fn a_new_journal_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nowhere").join("journal.sqlite");
        let e = SqliteStore::own(&missing, "pid 1").err().expect("refused");
        assert!(e.to_string().contains("does not exist"), "{e}");
        assert!(!dir.path().join("nowhere").exists());
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
        let db = state.join("journal.sqlite");
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
