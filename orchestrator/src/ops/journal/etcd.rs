//! The journal on etcd (issue 19): several orchestrators, one leader, one
//! shared record of every operation.
//!
//! Keys under the configured prefix `P`:
//! - `P/leader`: the leader's advertised URL, attached to its lease
//!   (`edge::election`); its create revision is the leader's fencing token;
//! - `P/ops/ID`: the operation's row (kind, pair, state, verdict, report);
//! - `P/running/PAIR` → ID while it runs, `P/requests/RID` → ID for ever:
//!   "one running operation per pair" and "a request runs once" are
//!   create-if-absent comparisons in the transaction that inserts the row;
//! - `P/entries/ID/SEQ`: one entry each, SEQ zero-padded so keys sort.
//!
//! **Every write is fenced**: a transaction whose first comparison is
//! "`P/leader` was created at my token". A deposed leader's write fails there
//! and is never applied, whatever it believes. A leader's journal call that
//! fails for any reason — the fence, or etcd unreachable or without quorum —
//! also *deposes* it at once ([`Fence::lose`]): it does not guess whether a
//! write it could not confirm took effect, and takes no step it could not
//! journal; the next leader reads what did take effect and goes on from there.
//!
//! The journal's interface is synchronous (SQLite is): each call runs on this
//! store's own small runtime and the caller blocks for it, bounded by
//! `etcd_timeout_ms` (`block_in_place` on a multi-threaded runtime, so the
//! orchestrator's other tasks go on).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::{JournalError, JournalSize, OperationMeta, OperationRecord, Store, StoredRow, unix_ms};
use crate::edge::leadership::Leadership;
use pdwarden_model::status::Role;

/// The leader's fencing token as this process holds it, and the signal that
/// it lost the leadership.
///
/// It also writes the [`Leadership`] everything else asks (`Fleet::send`
/// above all), in the same step as the token: a journal write refused by
/// the fence, or unconfirmed, must stop the very next command. If the role
/// were left to the election task to flip once it wakes, a leader paused
/// past its lease would, on waking, have its command's write-ahead entry
/// refused and still send the command — with its old token, to an agent
/// still linked to it that has never seen a newer one, which would carry it
/// out unrecorded.
pub struct Fence {
    /// The revision at which this orchestrator took the leadership; 0 while
    /// it does not lead (every write is refused).
    token: AtomicU64,
    /// Set once, with the reason, when the leadership is lost.
    lost: watch::Sender<Option<String>>,
    /// Set once the lease is given back (or could not be).
    released: watch::Sender<bool>,
    leadership: Leadership,
}

impl Fence {
    /// The fence of an orchestrator whose part `leadership` shows.
    pub fn new(leadership: Leadership) -> Self {
        Self {
            token: AtomicU64::new(0),
            lost: watch::Sender::new(None),
            released: watch::Sender::new(false),
            leadership,
        }
    }

    pub fn token(&self) -> u64 {
        self.token.load(Ordering::SeqCst)
    }

    /// This orchestrator leads from revision `token` on — unless the
    /// leadership was already given up (a resignation during the
    /// campaign); whether it leads.
    pub fn lead(&self, token: u64) -> bool {
        let mut led = false;
        // Under the `lost` lock, so a concurrent `lose` comes wholly
        // before or wholly after.
        self.lost.send_if_modified(|l| {
            if l.is_none() {
                self.token.store(token, Ordering::SeqCst);
                self.leadership.set(Role::Leader {
                    token,
                    since_unix_ms: unix_ms(),
                });
                led = true;
            }
            false
        });
        led
    }

    /// The leadership is gone: nothing more is written, and nothing more is
    /// sent (the role is a follower's from here on). Only the first reason
    /// is kept.
    pub fn lose(&self, why: impl Into<String>) {
        let why = why.into();
        self.lost.send_if_modified(|l| {
            self.token.store(0, Ordering::SeqCst);
            if l.is_none() {
                self.leadership.set(Role::Follower {
                    leader_url: None,
                    why: why.clone(),
                });
                *l = Some(why);
                true
            } else {
                false
            }
        });
    }

    /// Resolves with the reason once the leadership is lost.
    pub async fn lost(&self) -> String {
        let mut rx = self.lost.subscribe();
        loop {
            if let Some(why) = rx.borrow_and_update().clone() {
                return why;
            }
            if rx.changed().await.is_err() {
                return "the fence was dropped".into();
            }
        }
    }

    pub fn is_lost(&self) -> bool {
        self.lost.borrow().is_some()
    }

    /// The election gave its lease back (or tried): a successor can lead now.
    pub fn mark_released(&self) {
        self.released.send_replace(true);
    }

    /// Resolves once [`Fence::mark_released`] was called.
    pub async fn released(&self) {
        let mut rx = self.released.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }
}

/// An operation's row as stored in `P/ops/ID`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Row {
    id: String,
    kind: String,
    pair: String,
    #[serde(default)]
    request_id: Option<String>,
    state: String,
    started_unix_ms: i64,
    #[serde(default)]
    ended_unix_ms: Option<i64>,
    #[serde(default)]
    verdict: Option<String>,
    /// The report's JSON text.
    #[serde(default)]
    report: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    at_ms: u64,
    kind: String,
    payload: String,
}

pub struct EtcdStore {
    /// Taken out on drop and shut down in the background (dropping a runtime
    /// inside another one's task is not allowed).
    rt: Option<tokio::runtime::Runtime>,
    client: Client,
    prefix: String,
    timeout: Duration,
    pub fence: std::sync::Arc<Fence>,
    /// The next entry number of each operation this process wrote to.
    seqs: Mutex<HashMap<String, u64>>,
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

fn unavailable(e: impl std::fmt::Display) -> JournalError {
    JournalError::Unavailable { error: e.to_string() }
}

impl EtcdStore {
    /// A store on `endpoints` under `prefix`. Connecting does not wait for
    /// etcd to answer: an orchestrator starts (and says why it does not lead)
    /// while etcd has no quorum.
    pub fn connect(
        endpoints: &[String],
        prefix: &str,
        timeout: Duration,
        tls: Option<&pdwarden_security::tls::TlsFiles>,
        fence: std::sync::Arc<Fence>,
    ) -> Result<Self, JournalError> {
        let eps = endpoints.to_vec();
        let mut options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout)
            .with_keep_alive(Duration::from_secs(2), timeout)
            .with_keep_alive_while_idle(true);
        if let Some(files) = tls {
            let config = files
                .client_config()
                .map_err(|e| JournalError::EtcdTls { error: e.to_string() })?;
            options = options.with_tls(config);
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("etcd-journal")
            .enable_all()
            .build()
            .map_err(unavailable)?;
        let connected = block(rt.spawn(async move { Client::connect(eps, Some(options)).await }))
            .map_err(unavailable)
            .and_then(|r| r.map_err(unavailable));
        let client = match connected {
            Ok(c) => c,
            Err(e) => {
                // Not dropped here: this may run inside another runtime.
                rt.shutdown_background();
                return Err(e);
            }
        };
        Ok(Self {
            rt: Some(rt),
            client,
            prefix: prefix.to_string(),
            timeout,
            fence,
            seqs: Mutex::default(),
        })
    }

    /// The client, for the election (same connection, same endpoints).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    pub fn leader_key(&self) -> String {
        format!("{}/leader", self.prefix)
    }
    fn op_key(&self, id: &str) -> String {
        format!("{}/ops/{id}", self.prefix)
    }
    fn running_key(&self, pair: &str) -> String {
        format!("{}/running/{pair}", self.prefix)
    }
    fn request_key(&self, rid: &str) -> String {
        format!("{}/requests/{rid}", self.prefix)
    }
    fn entries_prefix(&self, id: &str) -> String {
        format!("{}/entries/{id}/", self.prefix)
    }

    /// Runs `f` with a client on the store's runtime, bounded by the timeout.
    fn run<T, F, Fut>(&self, f: F) -> Result<T, JournalError>
    where
        T: Send + 'static,
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>> + Send + 'static,
    {
        let rt = self.rt.as_ref().expect("runtime present until drop");
        let (fut, timeout) = (f(self.client.clone()), self.timeout);
        let handle = rt.spawn(async move { tokio::time::timeout(timeout, fut).await });
        let failed = match block(handle) {
            Ok(Ok(Ok(v))) => return Ok(v),
            Ok(Ok(Err(e))) => unavailable(e),
            Ok(Err(_)) => unavailable(format!("no answer within {} ms", timeout.as_millis())),
            Err(e) => unavailable(e),
        };
        // A leader that cannot read or write its journal cannot take a
        // step: it stops leading (a follower only reports the error).
        if self.fence.token() != 0 {
            self.fence.lose(format!("its journal on etcd did not answer: {failed}"));
        }
        Err(failed)
    }

    /// A fenced write: `compares` and `ops` run only while this
    /// orchestrator's leadership stands. Returns the transaction's answer
    /// (`succeeded` false: one of `compares` after the fence failed; the
    /// `or_else` reads say which). A fence that fails, or a write that could
    /// not be confirmed, deposes this orchestrator.
    fn write(&self, compares: Vec<Compare>, ops: Vec<TxnOp>, or_else: Vec<TxnOp>) -> Result<TxnOutcome, JournalError> {
        let token = self.fence.token();
        if token == 0 {
            return Err(JournalError::NotLeader {
                why: "it does not hold the leadership".into(),
            });
        }
        let leader = self.leader_key();
        // Outer: the fence; inner: the write's own comparisons.
        let inner = Txn::new().when(compares).and_then(ops).or_else(or_else);
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                leader.clone(),
                CompareOp::Equal,
                token as i64,
            )])
            .and_then(vec![TxnOp::txn(inner)])
            .or_else(vec![TxnOp::get(leader, None)]);
        match self.run(move |mut c| async move { c.txn(txn).await }) {
            Err(e) => Err(e),
            Ok(resp) if !resp.succeeded() => {
                let holder = resp.op_responses().into_iter().find_map(|r| match r {
                    TxnOpResponse::Get(g) => g.kvs().first().map(|kv| {
                        format!(
                            "{} leads since revision {}",
                            String::from_utf8_lossy(kv.value()),
                            kv.create_revision()
                        )
                    }),
                    _ => None,
                });
                let why = format!(
                    "its lease (revision {token}) is gone: {}",
                    holder.unwrap_or_else(|| "no orchestrator holds the leadership".into())
                );
                self.fence.lose(why.clone());
                Err(JournalError::NotLeader { why })
            }
            Ok(resp) => match resp.op_responses().into_iter().next() {
                Some(TxnOpResponse::Txn(inner)) => Ok(TxnOutcome {
                    succeeded: inner.succeeded(),
                    responses: inner.op_responses(),
                }),
                _ => Err(unavailable(
                    "etcd answered a fenced write without its inner transaction",
                )),
            },
        }
    }

    fn get_value(&self, key: String) -> Result<Option<(Vec<u8>, i64)>, JournalError> {
        let resp = self.run(move |mut c| async move { c.get(key, None).await })?;
        Ok(resp.kvs().first().map(|kv| (kv.value().to_vec(), kv.mod_revision())))
    }

    fn row(&self, id: &str) -> Result<Option<(Row, i64)>, JournalError> {
        match self.get_value(self.op_key(id))? {
            None => Ok(None),
            Some((v, rev)) => Ok(Some((serde_json::from_slice(&v)?, rev))),
        }
    }

    /// Every (key, value) under `prefix`, in key order.
    fn rows_by_prefix(&self, prefix: String) -> Result<Vec<KeyValuePair>, JournalError> {
        let resp = self.run(move |mut c| async move {
            c.get(
                prefix,
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Key, SortOrder::Ascend),
                ),
            )
            .await
        })?;
        Ok(resp
            .kvs()
            .iter()
            .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
            .collect())
    }

    /// The next entry number of `id` (read once from etcd, then counted:
    /// only the leader writes).
    fn next_seq(&self, id: &str) -> Result<u64, JournalError> {
        if let Some(n) = self.seqs.lock().unwrap_or_else(|p| p.into_inner()).get_mut(id) {
            *n += 1;
            return Ok(*n);
        }
        let prefix = self.entries_prefix(id);
        let resp = self.run(move |mut c| async move {
            c.get(
                prefix,
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Key, SortOrder::Descend)
                        .with_limit(1)
                        .with_keys_only(),
                ),
            )
            .await
        })?;
        let last = resp
            .kvs()
            .first()
            .and_then(|kv| {
                String::from_utf8_lossy(kv.key())
                    .rsplit('/')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or(0);
        let next = last + 1;
        self.seqs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string(), next);
        Ok(next)
    }

    fn entry_op(&self, id: &str, at_ms: u64, kind: &str, payload: &str) -> Result<(String, TxnOp), JournalError> {
        let key = format!("{}{:012}", self.entries_prefix(id), self.next_seq(id)?);
        let value = serde_json::to_vec(&Entry {
            at_ms,
            kind: kind.into(),
            payload: payload.into(),
        })?;
        Ok((key.clone(), TxnOp::put(key, value, None)))
    }

    /// Writes `row` where it was read at `rev`, with `extra` in the same
    /// transaction. Only the leader writes rows, so a moved row means
    /// another writer: refused.
    fn put_row(
        &self,
        row: &Row,
        rev: i64,
        extra: Vec<TxnOp>,
        extra_compares: Vec<Compare>,
    ) -> Result<(), JournalError> {
        let key = self.op_key(&row.id);
        let mut compares = vec![Compare::mod_revision(key.clone(), CompareOp::Equal, rev)];
        compares.extend(extra_compares);
        let mut ops = vec![TxnOp::put(key, serde_json::to_vec(row)?, None)];
        ops.extend(extra);
        let out = self.write(compares, ops, vec![])?;
        if !out.succeeded {
            // Drop the cached sequence: whoever moved it may have appended.
            self.seqs.lock().unwrap_or_else(|p| p.into_inner()).remove(&row.id);
            return Err(JournalError::NotLeader {
                why: format!("operation {} was changed by another writer", row.id),
            });
        }
        Ok(())
    }

    /// The pair's operation rows, newest first (every row is read: etcd
    /// keeps them by id; retention bounds how many there are).
    fn rows_of_pair(&self, pair: &str) -> Result<Vec<Row>, JournalError> {
        let mut rows: Vec<Row> = self
            .rows_by_prefix(format!("{}/ops/", self.prefix))?
            .into_iter()
            .map(|(_, v)| serde_json::from_slice::<Row>(&v))
            .collect::<Result<_, _>>()?;
        rows.retain(|r| r.pair == pair);
        rows.sort_by(|a, b| (b.started_unix_ms, &b.id).cmp(&(a.started_unix_ms, &a.id)));
        Ok(rows)
    }

    fn record(&self, row: Row) -> Result<OperationRecord, JournalError> {
        // One read of the operation's entries for both.
        let entries = self.entries(&row.id)?;
        let first_of = |kind: &str| -> Result<Option<serde_json::Value>, JournalError> {
            match entries.iter().find(|(_, k, _)| k == kind) {
                Some((_, _, payload)) => Ok(Some(serde_json::from_str(payload)?)),
                None => Ok(None),
            }
        };
        Ok(OperationRecord {
            trigger: first_of("trigger")?,
            actor: first_of("actor")?,
            report: row.report.as_deref().map(serde_json::from_str).transpose()?,
            operation_id: row.id,
            kind: row.kind,
            pair: row.pair,
            state: row.state,
            started_unix_ms: row.started_unix_ms,
            ended_unix_ms: row.ended_unix_ms,
            verdict: row.verdict,
            request_id: row.request_id,
        })
    }
}

type KeyValuePair = (Vec<u8>, Vec<u8>);

struct TxnOutcome {
    succeeded: bool,
    responses: Vec<TxnOpResponse>,
}

/// Waits for a task of the store's runtime from synchronous code.
fn block<T>(handle: tokio::task::JoinHandle<T>) -> Result<T, tokio::task::JoinError> {
    let wait = || futures::executor::block_on(handle);
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(wait),
        _ => wait(),
    }
}

impl Store for EtcdStore {
    fn insert(
        &self,
        operation_id: &str,
        kind: &str,
        pair: &str,
        request_id: Option<&str>,
        started_unix_ms: i64,
    ) -> Result<(), JournalError> {
        let row = Row {
            id: operation_id.into(),
            kind: kind.into(),
            pair: pair.into(),
            request_id: request_id.map(str::to_string),
            state: "started".into(),
            started_unix_ms,
            ended_unix_ms: None,
            verdict: None,
            report: None,
        };
        let (op_key, running) = (self.op_key(operation_id), self.running_key(pair));
        let mut compares = vec![
            Compare::create_revision(op_key.clone(), CompareOp::Equal, 0),
            Compare::create_revision(running.clone(), CompareOp::Equal, 0),
        ];
        let mut ops = vec![
            TxnOp::put(op_key, serde_json::to_vec(&row)?, None),
            TxnOp::put(running.clone(), operation_id, None),
        ];
        let mut reads = vec![TxnOp::get(running, None)];
        if let Some(rid) = request_id {
            let key = self.request_key(rid);
            compares.push(Compare::create_revision(key.clone(), CompareOp::Equal, 0));
            ops.push(TxnOp::put(key.clone(), operation_id, None));
            reads.push(TxnOp::get(key, None));
        }
        let out = self.write(compares, ops, reads)?;
        if out.succeeded {
            self.seqs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(operation_id.to_string(), 0);
            return Ok(());
        }
        let found: Vec<Option<String>> = out
            .responses
            .iter()
            .map(|r| match r {
                TxnOpResponse::Get(g) => g
                    .kvs()
                    .first()
                    .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
                _ => None,
            })
            .collect();
        if let (Some(rid), Some(Some(earlier))) = (request_id, found.get(1)) {
            let (kind, pair, outcome) = match self.row(earlier)? {
                Some((r, _)) => (
                    r.kind,
                    r.pair,
                    match r.ended_unix_ms {
                        None => "still running".to_string(),
                        Some(_) => format!("ended: {}", r.verdict.as_deref().unwrap_or("no verdict")),
                    },
                ),
                None => ("?".into(), "?".into(), "unknown".into()),
            };
            return Err(JournalError::DuplicateRequest {
                request_id: rid.to_string(),
                operation_id: earlier.clone(),
                kind,
                pair,
                outcome,
            });
        }
        Err(JournalError::PairBusy {
            pair: pair.to_string(),
            operation_id: found
                .first()
                .cloned()
                .flatten()
                .unwrap_or_else(|| format!("{operation_id} (already recorded)")),
        })
    }

    fn append(&self, operation_id: &str, at_ms: u64, kind: &str, payload: &str) -> Result<(), JournalError> {
        let (key, op) = self.entry_op(operation_id, at_ms, kind, payload)?;
        let out = self.write(
            vec![Compare::create_revision(key, CompareOp::Equal, 0)],
            vec![op],
            vec![],
        )?;
        if !out.succeeded {
            self.seqs.lock().unwrap_or_else(|p| p.into_inner()).remove(operation_id);
            return Err(JournalError::NotLeader {
                why: format!("an entry of operation {operation_id} was written by another writer"),
            });
        }
        Ok(())
    }

    fn enter(&self, operation_id: &str, at_ms: u64, state: &str, payload: &str) -> Result<(), JournalError> {
        let Some((mut row, rev)) = self.row(operation_id)? else {
            return Err(JournalError::NotLeader {
                why: format!("operation {operation_id} is not in the journal"),
            });
        };
        row.state = state.into();
        let (key, op) = self.entry_op(operation_id, at_ms, "transition", payload)?;
        self.put_row(
            &row,
            rev,
            vec![op],
            vec![Compare::create_revision(key, CompareOp::Equal, 0)],
        )
    }

    fn write_conclusion(
        &self,
        operation_id: &str,
        verdict: &str,
        report: &str,
        ended_unix_ms: i64,
        only_if_running: bool,
    ) -> Result<bool, JournalError> {
        let Some((mut row, rev)) = self.row(operation_id)? else {
            return Ok(false);
        };
        // A conclusion is written once (the row's revision is compared when
        // it is written, so one that lands in between is not overwritten
        // either: `put_row`).
        if row.ended_unix_ms.is_some() {
            if only_if_running || (row.verdict.as_deref() == Some(verdict) && row.report.as_deref() == Some(report)) {
                // Or this very conclusion, by an earlier try of it.
                return Ok(false);
            }
            return Err(JournalError::AlreadyConcluded {
                operation_id: operation_id.to_string(),
                verdict: row.verdict.unwrap_or_else(|| "no verdict".into()),
            });
        }
        let running = self.running_key(&row.pair);
        row.state = "concluded".into();
        row.ended_unix_ms = Some(ended_unix_ms);
        row.verdict = Some(verdict.into());
        row.report = Some(report.into());
        // Free the pair only if this operation holds it.
        let frees = match self.get_value(running.clone())? {
            Some((v, _)) if v == operation_id.as_bytes() => vec![TxnOp::delete(running, None)],
            _ => vec![],
        };
        self.put_row(&row, rev, frees, vec![])?;
        Ok(true)
    }

    fn meta(&self, operation_id: &str) -> Result<Option<OperationMeta>, JournalError> {
        Ok(self.row(operation_id)?.map(|(r, _)| OperationMeta {
            running: r.ended_unix_ms.is_none(),
            kind: r.kind,
            pair: r.pair,
            request_id: r.request_id,
        }))
    }

    fn ping(&self) -> Result<(), JournalError> {
        // The service manager's watchdog asks this. A follower's health does
        // not hang on etcd's: restarting it while etcd has no quorum would
        // change nothing (it comes back a follower, saying why). A leader's
        // does: a linearizable read, answered only with a quorum (and one
        // that fails deposes it).
        if self.fence.token() == 0 {
            return Ok(());
        }
        self.get_value(self.leader_key()).map(|_| ())
    }

    fn unfinished(&self) -> Result<Vec<OperationRecord>, JournalError> {
        let mut rows = Vec::new();
        for (_, id) in self.rows_by_prefix(format!("{}/running/", self.prefix))? {
            if let Some((r, _)) = self.row(&String::from_utf8_lossy(&id))? {
                rows.push(r);
            }
        }
        rows.sort_by(|a, b| (a.started_unix_ms, &a.id).cmp(&(b.started_unix_ms, &b.id)));
        rows.into_iter().map(|r| self.record(r)).collect()
    }

    fn history(&self, pair: &str, limit: u32) -> Result<Vec<OperationRecord>, JournalError> {
        let mut rows = self.rows_of_pair(pair)?;
        rows.truncate(limit as usize);
        rows.into_iter().map(|r| self.record(r)).collect()
    }

    fn pairs(&self) -> Result<Vec<String>, JournalError> {
        let mut pairs: Vec<String> = self
            .rows_by_prefix(format!("{}/ops/", self.prefix))?
            .into_iter()
            .map(|(_, v)| serde_json::from_slice::<Row>(&v).map(|r| r.pair))
            .collect::<Result<_, _>>()?;
        pairs.sort();
        pairs.dedup();
        Ok(pairs)
    }

    fn publish(&self, name: &str, text: &str) -> Result<(), JournalError> {
        let key = format!("{}/published/{name}", self.prefix);
        // Fenced like every write: only the leader publishes.
        let out = self.write(vec![], vec![TxnOp::put(key, text.as_bytes().to_vec(), None)], vec![])?;
        if !out.succeeded {
            return Err(JournalError::NotLeader {
                why: format!("{name} was being published by another writer"),
            });
        }
        Ok(())
    }

    fn published(&self, name: &str) -> Result<Option<String>, JournalError> {
        Ok(self
            .get_value(format!("{}/published/{name}", self.prefix))?
            .map(|(v, _)| String::from_utf8_lossy(&v).into_owned()))
    }

    fn rows_of(&self, pair: &str) -> Result<Vec<StoredRow>, JournalError> {
        Ok(self
            .rows_of_pair(pair)?
            .into_iter()
            .map(|r| StoredRow {
                operation_id: r.id,
                started_unix_ms: r.started_unix_ms,
                concluded: r.ended_unix_ms.is_some(),
                compacted: r.report.as_deref().is_some_and(super::is_compacted),
            })
            .collect())
    }

    fn compact(
        &self,
        operation_id: &str,
        summarise: &dyn Fn(Option<&str>) -> String,
        keep: &[&str],
    ) -> Result<bool, JournalError> {
        let Some((mut row, rev)) = self.row(operation_id)? else {
            return Ok(false);
        };
        if row.ended_unix_ms.is_none() {
            return Ok(false);
        }
        row.report = Some(summarise(row.report.as_deref()));
        let mut deletes = Vec::new();
        for (key, v) in self.rows_by_prefix(self.entries_prefix(operation_id))? {
            let e: Entry = serde_json::from_slice(&v)?;
            if !keep.contains(&e.kind.as_str()) {
                deletes.push(TxnOp::delete(key, None));
            }
        }
        // One fenced transaction: the row (at the revision read) and the
        // entries together.
        self.put_row(&row, rev, deletes, vec![])?;
        Ok(true)
    }

    fn remove(&self, operation_id: &str) -> Result<bool, JournalError> {
        let Some((row, rev)) = self.row(operation_id)? else {
            return Ok(false);
        };
        if row.ended_unix_ms.is_none() {
            return Ok(false);
        }
        let key = self.op_key(operation_id);
        let mut ops = vec![
            TxnOp::delete(key.clone(), None),
            TxnOp::delete(
                self.entries_prefix(operation_id),
                Some(etcd_client::DeleteOptions::new().with_prefix()),
            ),
        ];
        if let Some(rid) = &row.request_id {
            ops.push(TxnOp::delete(self.request_key(rid), None));
        }
        let out = self.write(vec![Compare::mod_revision(key, CompareOp::Equal, rev)], ops, vec![])?;
        if !out.succeeded {
            return Err(JournalError::NotLeader {
                why: format!("operation {operation_id} was changed by another writer"),
            });
        }
        self.seqs.lock().unwrap_or_else(|p| p.into_inner()).remove(operation_id);
        Ok(true)
    }

    fn size(&self) -> Result<JournalSize, JournalError> {
        let mut size = JournalSize::default();
        let ops = format!("{}/ops/", self.prefix);
        let entries = format!("{}/entries/", self.prefix);
        for (key, value) in self.rows_by_prefix(format!("{}/", self.prefix))? {
            size.bytes += (key.len() + value.len()) as u64;
            if key.starts_with(ops.as_bytes()) {
                size.operations += 1;
            } else if key.starts_with(entries.as_bytes()) {
                size.entries += 1;
            }
        }
        Ok(size)
    }

    fn forget(&self, operation_id: &str, kind: &str) -> Result<usize, JournalError> {
        let mut deletes = Vec::new();
        for (key, v) in self.rows_by_prefix(self.entries_prefix(operation_id))? {
            let e: Entry = serde_json::from_slice(&v)?;
            if e.kind == kind {
                deletes.push(TxnOp::delete(key, None));
            }
        }
        let n = deletes.len();
        if n > 0 {
            // Fenced like every write: a deposed leader deletes nothing.
            let out = self.write(vec![], deletes, vec![])?;
            if !out.succeeded {
                return Err(JournalError::NotLeader {
                    why: format!("entries of operation {operation_id} were being forgotten by another writer"),
                });
            }
        }
        Ok(n)
    }

    fn entries(&self, operation_id: &str) -> Result<Vec<(u64, String, String)>, JournalError> {
        self.rows_by_prefix(self.entries_prefix(operation_id))?
            .into_iter()
            .map(|(_, v)| {
                let e: Entry = serde_json::from_slice(&v)?;
                Ok((e.at_ms, e.kind, e.payload))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    //! Against a real etcd (one member on loopback, Debian's etcd-server:
    //! scripts/setup-etcd.sh), never a mock: the fence is etcd's own
    //! transaction semantics.
    use super::*;
    use crate::edge::election::Election;
    use crate::edge::leadership::Leadership;
    use crate::ops::journal::Journal;
    use pdwarden_model::status::Role;
    use std::sync::Arc;

    /// One etcd member in a temporary directory, SIGKILLed by PID on drop.
    struct LocalEtcd {
        child: std::process::Child,
        url: String,
        /// With TLS: what a client presents (a certificate of etcd's CA).
        client_tls: Option<pdwarden_security::tls::TlsFiles>,
        _dir: tempfile::TempDir,
    }

    impl LocalEtcd {
        async fn start() -> Self {
            Self::start_with(false).await
        }

        /// With `tls`: https only, client certificates required (etcd's
        /// `--client-cert-auth`), from a CA `pdwarden certs` made.
        async fn start_with(tls: bool) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let port = || crate::edge::ports::late_bind_port().unwrap();
            let (client, peer, metrics) = (port(), port(), port());
            let scheme = if tls { "https" } else { "http" };
            let url = format!("{scheme}://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let health = format!("http://127.0.0.1:{metrics}");
            let etcd = std::env::var("PDWARDEN_ETCD").unwrap_or_else(|_| "etcd".into());
            let mut cmd = std::process::Command::new(&etcd);
            cmd.args(["--name", "t", "--data-dir"])
                .arg(dir.path().join("data"))
                .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
                .args([
                    "--listen-peer-urls",
                    &peer_url,
                    "--initial-advertise-peer-urls",
                    &peer_url,
                ])
                .args(["--initial-cluster", &format!("t={peer_url}")])
                .args(["--listen-metrics-urls", &health])
                .args(["--heartbeat-interval", "100", "--election-timeout", "1000"])
                .args(["--logger", "zap", "--log-level", "error"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            let mut client_tls = None;
            if tls {
                let certs = pdwarden_security::certs::CertDir(dir.path().join("pki"));
                certs.init(&["127.0.0.1".into()]).unwrap();
                let server = certs.orchestrator();
                cmd.arg("--cert-file")
                    .arg(&server.cert)
                    .arg("--key-file")
                    .arg(&server.key)
                    .arg("--trusted-ca-file")
                    .arg(&server.ca)
                    .arg("--client-cert-auth");
                client_tls = Some(certs.issue_agent("orchestrator-a").unwrap());
            }
            let child = cmd
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {etcd} (scripts/setup-etcd.sh installs it): {e}"));
            let me = Self {
                child,
                url,
                client_tls,
                _dir: dir,
            };
            let http = reqwest::Client::new();
            for _ in 0..200 {
                if let Ok(r) = http.get(format!("{health}/health")).send().await
                    && r.text().await.unwrap_or_default().contains("\"true\"")
                {
                    return me;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("etcd at {} not healthy within 10 s", me.url);
        }
    }

    impl Drop for LocalEtcd {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// A journal on `etcd` and its election, campaigning in the background.
    fn orchestrator(
        etcd: &LocalEtcd,
        url: &str,
    ) -> (Arc<Journal>, Leadership, Arc<Fence>, tokio::task::JoinHandle<String>) {
        let leadership = Leadership::candidate(url, Duration::from_secs(6));
        let fence = Arc::new(Fence::new(leadership.clone()));
        let store = EtcdStore::connect(
            std::slice::from_ref(&etcd.url),
            "/t",
            Duration::from_millis(1_000),
            etcd.client_tls.as_ref(),
            fence.clone(),
        )
        .unwrap();
        let election = Election {
            client: store.client(),
            leader_key: store.leader_key(),
            ttl_s: 2,
            fence: fence.clone(),
            leadership: leadership.clone(),
        };
        let task = tokio::spawn(election.run());
        (Arc::new(Journal::new(Box::new(store))), leadership, fence, task)
    }

    async fn until(what: &str, mut f: impl FnMut() -> bool) {
        for _ in 0..200 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("not within 10 s: {what}");
    }

    /// The etcd journal keeps the SQLite journal's rules: one running
    /// operation per pair, a request id runs once, entries in order, the
    /// last typed state read back, history newest first, unfinished oldest
    /// first; and a follower reads it all.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_etcd_journal_keeps_the_journal_rules() {
        let etcd = LocalEtcd::start().await;
        let (j, leadership, _fence, _e) = orchestrator(&etcd, "http://a:1");
        until("a leads", || leadership.leads()).await;
        crate::ops::journal::contract::keeps_the_journal_rules(&j);
        crate::ops::journal::contract::keeps_only_the_newest_captures(&j);
        // Issue 36: a year on etcd (coarser than SQLite's: a co-restart
        // every 8 h of one pair, each write a fenced transaction).
        let (size, mut ms) = crate::ops::journal::contract::retention_keeps_a_year_within_bounds(&j, 1, 8, 7);
        ms.sort_by(f64::total_cmp);
        println!(
            "etcd, a year, 1 pair, a co-restart every 8 h, a pass a week: {size:?}; history (20) p50 {:.2} ms, p99 {:.2} ms",
            ms[ms.len() / 2],
            ms[ms.len() * 99 / 100]
        );
        assert!(leadership.leads(), "a refused conclusion does not depose");
        // A follower on the same etcd reads the same journal.
        let (follower, fl, _, _fe) = orchestrator(&etcd, "http://b:1");
        until(
            "b follows a",
            || matches!(fl.role(), Role::Follower { leader_url: Some(ref u), .. } if u == "http://a:1"),
        )
        .await;
        let h = follower.history("a", 10).unwrap();
        assert_eq!(h.len(), 2);
        assert_eq!(h[1].operation_id, "op-1");
        assert_eq!(h[1].verdict.as_deref(), Some("healthy"));
        assert_eq!(h[1].report.as_ref().unwrap()["verdict"], "healthy");
        // Issue 36: what the leader publishes, a follower reads; a follower
        // cannot publish.
        j.publish("status", "{\"fleet\":{\"hosts\":3}}").unwrap();
        let (text, age) = follower.published("status").unwrap().expect("published");
        assert_eq!((text.as_str(), age < 60_000), ("{\"fleet\":{\"hosts\":3}}", true));
        assert!(matches!(
            follower.publish("status", "{}"),
            Err(JournalError::NotLeader { .. })
        ));
        // ... and cannot write to it.
        assert!(matches!(
            follower.append("op-4", 1, "x", &1),
            Err(JournalError::NotLeader { .. })
        ));
    }

    /// DESIGN.md 15: a deposed leader's write is refused by etcd itself.
    /// A led (it took the key at some revision) and was paused past its
    /// lease: no election task of its own runs here, so it still believes
    /// it leads, as a frozen process does. B takes over with a higher token;
    /// A's next write fails on the fence, changes nothing, and deposes A —
    /// at once, not when A's election task next wakes: the write-ahead
    /// entry of a command refused, the command itself must not leave
    /// (`Fleet::send` asks `leads()`), or an agent still linked to A, which
    /// has never seen B's token, would carry it out unrecorded.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deposed_leaders_write_is_refused_by_the_fence() {
        let etcd = LocalEtcd::start().await;
        let al = Leadership::candidate("http://a:1", Duration::from_secs(6));
        let afence = Arc::new(Fence::new(al.clone()));
        let a = Journal::new(Box::new(
            EtcdStore::connect(
                std::slice::from_ref(&etcd.url),
                "/t",
                Duration::from_millis(1_000),
                None,
                afence.clone(),
            )
            .unwrap(),
        ));
        let mut c = etcd_client::Client::connect([etcd.url.clone()], None).await.unwrap();
        let took = c.put("/t/leader", "http://a:1", None).await.unwrap();
        let a_token = took.header().unwrap().revision() as u64;
        assert!(afence.lead(a_token));
        assert_eq!(al.token(), a_token, "the fence made A the leader");
        a.begin("op-1", "co_restart", "p", None).unwrap();
        // Its lease lapses while it is paused: the key goes.
        c.delete("/t/leader", None).await.unwrap();
        let (b, bl, bfence, _be) = orchestrator(&etcd, "http://b:1");
        until("b leads", || bl.leads()).await;
        assert!(bfence.token() > a_token, "{} > {a_token}", bfence.token());
        assert_eq!(afence.token(), a_token, "A still believes it leads");
        let before = b.entries("op-1").unwrap().len();
        let e = a.transition("op-1", 1, "restarting_prefill").unwrap_err();
        assert!(matches!(e, JournalError::NotLeader { .. }), "{e}");
        assert!(e.to_string().contains("http://b:1 leads"), "{e}");
        assert!(afence.is_lost());
        // No await since the refused write: nothing else ran in between.
        assert!(!al.leads(), "A commands nothing more: {:?}", al.role());
        assert!(!afence.lead(a_token), "a lost fence does not lead again");
        assert!(!al.leads());
        assert_eq!(b.entries("op-1").unwrap().len(), before, "nothing of A's was written");
        assert_eq!(b.unfinished().unwrap()[0].state, "started");
        // B, the leader, writes.
        b.transition("op-1", 2, "restarting_prefill").unwrap();
    }

    /// The leader key deleted by hand while the leader holds its lease (a
    /// follower would then lead beside it): the leader notices at its next
    /// renewal and stops, without writing anything first.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leader_whose_key_is_deleted_stops_leading() {
        let etcd = LocalEtcd::start().await;
        let (_a, al, afence, election) = orchestrator(&etcd, "http://a:1");
        until("a leads", || al.leads()).await;
        let mut c = etcd_client::Client::connect([etcd.url.clone()], None).await.unwrap();
        c.delete("/t/leader", None).await.unwrap();
        let why = tokio::time::timeout(Duration::from_secs(5), election)
            .await
            .expect("stops within a renewal")
            .unwrap();
        assert!(why.contains("leader key was") && !al.leads(), "{why}");
        assert!(afence.is_lost());
    }

    /// A leader that resigns (a planned shutdown) gives its lease back: the
    /// leader key is gone as soon as it says so — a follower need not wait
    /// for the lease to lapse — and it writes nothing more.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_resigning_leader_gives_its_lease_back_at_once() {
        let etcd = LocalEtcd::start().await;
        let (a, al, afence, election) = orchestrator(&etcd, "http://a:1");
        until("a leads", || al.leads()).await;
        a.begin("op-1", "co_restart", "p", None).unwrap();
        afence.lose("resigned: this orchestrator is shutting down");
        tokio::time::timeout(Duration::from_secs(2), afence.released())
            .await
            .expect("released");
        let mut c = etcd_client::Client::connect([etcd.url.clone()], None).await.unwrap();
        let held = c.get("/t/leader", None).await.unwrap();
        assert!(held.kvs().is_empty(), "the leader key went with the lease");
        assert!(matches!(
            a.transition("op-1", 1, "restarting_prefill"),
            Err(JournalError::NotLeader { .. })
        ));
        let why = election.await.unwrap();
        assert!(why.starts_with("resigned"), "{why}");
        let (_b, bl, _bf, _be) = orchestrator(&etcd, "http://b:1");
        until("b leads", || bl.leads()).await;
    }

    /// Mutual TLS to etcd (`leadership.etcd_tls`): with etcd's CA and a
    /// client certificate it accepts, the journal leads and writes; without
    /// the certificate etcd refuses the connection, and the orchestrator
    /// never leads — it says why.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_journal_speaks_mutual_tls_to_etcd() {
        let etcd = LocalEtcd::start_with(true).await;
        let (j, l, _f, _e) = orchestrator(&etcd, "http://a:1");
        until("a leads over TLS", || l.leads()).await;
        j.begin("op-1", "co_restart", "p", None).unwrap();
        j.transition("op-1", 1, "restarting_prefill").unwrap();
        assert_eq!(j.unfinished().unwrap()[0].state, "restarting_prefill");
        // The CA alone, no client certificate: refused by etcd.
        let files = etcd.client_tls.clone().unwrap();
        let no_cert = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_timeout(Duration::from_secs(1))
            .with_tls(
                etcd_client::TlsOptions::new()
                    .ca_certificate(etcd_client::Certificate::from_pem(std::fs::read(&files.ca).unwrap())),
            );
        let mut anonymous = etcd_client::Client::connect([etcd.url.clone()], Some(no_cert))
            .await
            .unwrap();
        assert!(
            anonymous.get("/t/leader", None).await.is_err(),
            "etcd wants a client certificate"
        );
        // A missing key file is a one-line error naming the field.
        let mut bad = files.clone();
        bad.key = "/nonexistent/key.pem".into();
        let e = EtcdStore::connect(
            std::slice::from_ref(&etcd.url),
            "/t",
            Duration::from_millis(500),
            Some(&bad),
            Arc::new(Fence::new(Leadership::candidate("http://a:1", Duration::from_secs(6)))),
        )
        .err()
        .expect("a missing key is refused");
        assert!(e.to_string().starts_with("field `leadership.etcd_tls`"), "{e}");
        assert!(e.to_string().contains("/nonexistent/key.pem"), "{e}");
    }

    /// etcd gone: a write fails within the timeout as "unavailable", and
    /// the leader is deposed (it does not guess whether the write landed).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_unreachable_fails_the_write_and_deposes() {
        let mut etcd = LocalEtcd::start().await;
        let (j, l, fence, election) = orchestrator(&etcd, "http://a:1");
        until("a leads", || l.leads()).await;
        j.begin("op-1", "co_restart", "p", None).unwrap();
        let _ = etcd.child.kill();
        let _ = etcd.child.wait();
        let e = j.transition("op-1", 1, "restarting_prefill").unwrap_err();
        assert!(matches!(e, JournalError::Unavailable { .. }), "{e}");
        assert!(e.to_string().contains("no step starts"), "{e}");
        assert!(fence.is_lost());
        let why = tokio::time::timeout(Duration::from_secs(10), election)
            .await
            .unwrap()
            .unwrap();
        assert!(why.contains("did not answer"), "{why}");
        assert!(!l.leads());
    }
}
