//! The leader election on etcd (issue 19, DESIGN.md 15): a lease and one
//! key, the way etcd's own `concurrency.Election` does it, without a
//! home-made consensus.
//!
//! A candidate grants itself a lease and, in one transaction, creates
//! `P/leader` (its advertised URL) attached to the lease — only if no one
//! holds it. The revision of that transaction is its fencing token: the
//! journal fences every write on it (`ops::journal::etcd`), the fleet stamps
//! it on every command, the agents refuse anything lower. The others follow:
//! they read whom to point agents and operators at and watch the key; when
//! the leader's lease lapses (it died, or lost etcd) the key is deleted and
//! they campaign at once.
//!
//! The leader renews its lease every third of its TTL. It counts the lease
//! from when it *sent* the last renewal that etcd confirmed (etcd started
//! its own count later), and stops leading before that count ends; a
//! renewal etcd refuses (the lease expired) ends it at once. Losing the
//! leadership is final for the process: like kube-controller-manager
//! (`leaderelection lost` is fatal there), the orchestrator exits and its
//! service manager starts it again as a follower, so no task of the old term
//! survives to act. Running units are never touched by this.
//!
//! A leader shutting down (SIGTERM: an upgrade, a planned move) resigns
//! first: it stops sending and writing, lets its agents go, and revokes its
//! lease, so a follower leads at once instead of a lease later.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::time::Instant;

use crate::edge::leadership::Leadership;
use crate::ops::journal::etcd::Fence;
use pdwarden_model::status::Role;

pub struct Election {
    pub client: Client,
    pub leader_key: String,
    pub ttl_s: u64,
    pub fence: Arc<Fence>,
    pub leadership: Leadership,
}

/// How often a candidate retries etcd when it cannot reach it.
const RETRY: Duration = Duration::from_millis(500);

impl Election {
    fn url(&self) -> String {
        self.leadership.advertise_url.clone().unwrap_or_default()
    }

    fn follow(&self, leader_url: Option<String>, why: String) {
        let role = Role::Follower { leader_url, why };
        if self.leadership.role() != role {
            if let Role::Follower { leader_url, why } = &role {
                tracing::info!(leader = ?leader_url, %why, "following");
            }
            self.leadership.set(role);
        }
    }

    /// Campaigns until this orchestrator leads, then holds the lease;
    /// returns why the leadership was lost (the caller stops this process).
    pub async fn run(mut self) -> String {
        let lease = loop {
            if self.fence.is_lost() {
                // Resigned (shutting down) before it ever led.
                self.fence.mark_released();
                return self.fence.lost().await;
            }
            match self.campaign().await {
                Ok(Some(lease)) => break lease,
                Ok(None) => {}
                Err(e) => {
                    self.follow(
                        None,
                        format!(
                            "etcd is unreachable or has no quorum ({e}); no orchestrator can lead until it answers"
                        ),
                    );
                    tokio::time::sleep(RETRY).await;
                }
            }
        };
        let why = self.hold(lease).await;
        // The role goes with the fence (its first reason kept).
        self.fence.lose(why.clone());
        // Best effort: let a successor start at once instead of at the lease's end.
        let mut c = self.client.clone();
        let _ = tokio::time::timeout(Duration::from_millis(500), c.lease_revoke(lease)).await;
        self.fence.mark_released();
        why
    }

    /// One round: `Some(lease)` once this one leads; `None` after the
    /// leader it followed is gone (campaign again).
    async fn campaign(&mut self) -> Result<Option<i64>, etcd_client::Error> {
        let lease = self.client.lease_grant(self.ttl_s as i64, None).await?.id();
        let key = self.leader_key.clone();
        let txn = Txn::new()
            .when(vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then(vec![TxnOp::put(
                key.clone(),
                self.url(),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else(vec![TxnOp::get(key.clone(), None)]);
        let resp = match self.client.txn(txn).await {
            Ok(r) => r,
            Err(e) => {
                let _ = self.client.lease_revoke(lease).await;
                return Err(e);
            }
        };
        if resp.succeeded() {
            let token = resp.header().map(|h| h.revision()).unwrap_or(0) as u64;
            // The fence sets the role with the token (a lost fence leads no more).
            if self.fence.lead(token) {
                tracing::info!(token, url = %self.url(), "leading: this orchestrator holds the etcd leadership");
            }
            return Ok(Some(lease));
        }
        let _ = self.client.lease_revoke(lease).await;
        let holder = resp.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(g) => g
                .kvs()
                .first()
                .map(|kv| (String::from_utf8_lossy(kv.value()).into_owned(), kv.mod_revision())),
            _ => None,
        });
        let Some((leader, rev)) = holder else {
            return Ok(None);
        };
        self.follow(Some(leader.clone()), format!("{leader} holds the leadership"));
        // Watch from just after what was read: a deletion in between is seen.
        let mut stream = self
            .client
            .watch(key, Some(etcd_client::WatchOptions::new().with_start_revision(rev + 1)))
            .await?;
        loop {
            // Re-read now and then even if the watch says nothing (a stuck
            // stream must not keep a follower from campaigning).
            match tokio::time::timeout(Duration::from_secs(self.ttl_s), stream.message()).await {
                Err(_) => return Ok(None),
                Ok(Err(e)) => return Err(e),
                Ok(Ok(None)) => return Ok(None),
                Ok(Ok(Some(w))) => {
                    if w.canceled() || w.events().iter().any(|e| e.event_type() == EventType::Delete) {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Renews the lease until it cannot; returns why.
    async fn hold(&mut self, lease: i64) -> String {
        let ttl = Duration::from_secs(self.ttl_s);
        let every = ttl / 3;
        // Counted from the grant's request (conservative: etcd counts later).
        let mut valid_until = Instant::now() + ttl;
        let margin = Duration::from_millis(250).min(every);
        let mut keeper = None;
        loop {
            let sent = Instant::now();
            if keeper.is_none() {
                match tokio::time::timeout(every, self.client.lease_keep_alive(lease)).await {
                    Ok(Ok(k)) => keeper = Some(k),
                    Ok(Err(e)) => tracing::warn!(error = %e, "cannot open the lease renewal stream"),
                    Err(_) => tracing::warn!("opening the lease renewal stream timed out"),
                }
            }
            let renewed = match keeper.as_mut() {
                None => None,
                Some((k, stream)) => {
                    let round = async {
                        k.keep_alive().await?;
                        stream.message().await
                    };
                    match tokio::time::timeout(every, round).await {
                        Ok(Ok(Some(r))) => Some(r.ttl()),
                        Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
                            keeper = None;
                            None
                        }
                    }
                }
            };
            match renewed {
                Some(ttl_left) if ttl_left <= 0 => {
                    return format!("etcd says its leadership lease {lease:x} has expired");
                }
                Some(_) => {
                    // The lease lives; the key must too, as this leader
                    // created it (someone may have deleted it by hand: a
                    // follower would then lead beside this one).
                    let token = self.fence.token() as i64;
                    match tokio::time::timeout(every, self.client.get(self.leader_key.clone(), None)).await {
                        Ok(Ok(r)) => match r.kvs().first() {
                            Some(kv) if kv.create_revision() == token => valid_until = sent + ttl,
                            Some(kv) => {
                                return format!(
                                    "its leader key was taken over by {} (revision {})",
                                    String::from_utf8_lossy(kv.value()),
                                    kv.create_revision()
                                );
                            }
                            None => return "its leader key was deleted".into(),
                        },
                        _ => tracing::warn!("cannot read the leader key"),
                    }
                }
                None => {
                    tracing::warn!(
                        left_ms = valid_until.saturating_duration_since(Instant::now()).as_millis() as u64,
                        "cannot renew the leadership lease (etcd unreachable or without quorum)"
                    );
                }
            }
            if self.fence.is_lost() {
                return "its journal on etcd did not answer".into();
            }
            let next = (sent + every).min(valid_until - margin);
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                why = self.fence.lost() => return why,
            }
            if Instant::now() + margin >= valid_until {
                return format!(
                    "its leadership lease could not be renewed for {} s (etcd unreachable or without quorum)",
                    self.ttl_s
                );
            }
        }
    }
}
