//! The prefill→decode KV transfer path, over real loopback HTTP.
//!
//! In SGLang's PD mode the router sends each request to a prefill and a decode at
//! once, adding `bootstrap_host`, `bootstrap_port` and `bootstrap_room`; the decode
//! then pulls the request's KV cache from the prefill through the prefill's
//! bootstrap server. Each engine's own `/health_generate` uses a fake bootstrap and
//! never crosses this link, which is why a broken link goes unseen by health checks.
//! pd-sim makes the link real so that only an end-to-end generation can prove it:
//!
//! - A prefill serves a small HTTP API on `--bootstrap-port` ([`BootstrapServer`]):
//!   a handshake, and `GET /pd-sim/kv/{room}` which answers once the prefill has
//!   computed that room's KV.
//! - A decode handshakes with a prefill the first time it meets its bootstrap
//!   address and *caches the prefill's identity* ([`BootstrapClient`]). After a
//!   prefill restart behind the same address, the cached identity is stale and every
//!   transfer fails (SGLang issue 36029) until the decode itself restarts.
//! - The prefill remembers which decode instance it served at each decode address.
//!   A *new* decode instance at an address it already served (a decode restarted
//!   alone against a long-running prefill) gets a degraded bootstrap: its transfers
//!   never complete, so its generations hang (INCIDENTS row 1). Decodes at other
//!   addresses (1P:2D) are unaffected. Restarting the prefill, then the decode,
//!   clears both faults: a fresh prefill has no history and a fresh decode no cache.
//!
//! Each room's KV goes through SGLang's queues (`python/sglang/srt/disaggregation/`):
//! once the prefill has computed it, the room is in the prefill's *inflight queue*
//! (`prefill.py`, `disagg_prefill_inflight_queue`, counted in the [`Counters`] gauge
//! `prefill_inflight` and `sglang:num_prefill_inflight_queue_reqs`) until the decode
//! takes it (`KVPoll.Success`) or the transfer fails (`KVPoll.Failed`: the decode
//! reports a failure, meets a stale identity, or goes away mid-transfer). A room whose
//! decode never comes (a degraded bootstrap, `--kv-stall`, a hung decode) stays there.
//! A decode may ask the prefill to hold the KV for a while after it is ready
//! (`--kv-transfer-ms`, a slow link): the room stays inflight meanwhile.
//!
//! The KV a decode pulls carries the weights the prefill computed it with (the
//! prefill's `--weights` when it admitted the request): a decode on other weights
//! answers wrong ([`crate::greedy`]), as a real decode does when prefill and decode run
//! different checkpoints.
//!
//! One simplification: SGLang's prefill answers its HTTP request only when the
//! transfer ends (`process_disagg_prefill_inflight_queue` streams the finished
//! request on `KVPoll.Success`, or aborts it with a 500 "Prefill transfer failed" on
//! `KVPoll.Failed`, which sglang-router returns in place of the decode's error); pd-sim's
//! prefill answers as soon as its KV is ready, whatever becomes of the transfer.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::config::KvTransfer;
use tokio::time::Instant;

use crate::stats::{Counters, Stats};

/// SGLang's `FAKE_BOOTSTRAP_HOST`, used by its health check: never a real transfer.
pub const FAKE_BOOTSTRAP_HOST: &str = "2.2.2.2";

/// Rooms whose KV nobody fetched are forgotten after this long (real time).
const ROOM_TTL: Duration = Duration::from_secs(600);

#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("prefill bootstrap {addr} unreachable")]
    Unreachable {
        addr: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("prefill bootstrap {addr} has a new identity ({actual}); this decode cached {cached} and cannot transfer")]
    StaleIdentity {
        addr: String,
        cached: String,
        actual: String,
    },
    #[error("prefill bootstrap {addr} answered {status}")]
    Status { addr: String, status: u16 },
}

#[derive(Debug, Serialize, Deserialize)]
pub struct HandshakeRequest {
    pub decode_instance_id: String,
    pub decode_addr: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HandshakeResponse {
    pub prefill_instance_id: String,
    pub degraded: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct KvQuery {
    pub decode_instance_id: String,
    pub prefill_instance_id: String,
    /// Real µs the prefill holds the KV after it is ready before handing it over
    /// (the decode's `--kv-transfer-ms`, scaled by the decode).
    #[serde(default)]
    pub hold_us: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct KvStale {
    error: String,
    prefill_instance_id: String,
}

/// The prefill's record of decodes it has bootstrapped: the pure decision of who
/// gets a degraded bootstrap.
#[derive(Debug, Default)]
pub struct DecodeRegistry {
    /// decode address → the decode instance first served there.
    by_addr: HashMap<String, String>,
    /// Decode instances that were handed a degraded bootstrap.
    degraded: HashSet<String>,
}

impl DecodeRegistry {
    /// Registers a handshake; returns whether this decode's bootstrap is degraded.
    pub fn handshake(&mut self, decode_addr: &str, decode_id: &str) -> bool {
        if self.degraded.contains(decode_id) {
            return true;
        }
        match self.by_addr.get(decode_addr) {
            None => {
                self.by_addr.insert(decode_addr.to_string(), decode_id.to_string());
                false
            }
            Some(first) if first == decode_id => false,
            Some(_) => {
                self.degraded.insert(decode_id.to_string());
                true
            }
        }
    }

    pub fn is_degraded(&self, decode_id: &str) -> bool {
        self.degraded.contains(decode_id)
    }
}

/// Where a room's KV is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoomState {
    /// Not computed yet.
    Waiting,
    /// Computed; in the prefill's inflight queue until its decode takes it.
    Ready,
    /// Handed to the decode (`KVPoll.Success`).
    Taken,
    /// The transfer failed (`KVPoll.Failed`).
    Failed,
}

struct Room {
    state: watch::Sender<RoomState>,
    created: Instant,
    /// The weights the prefill computed this room's KV with (set when it is ready).
    weights: Option<String>,
}

/// Sets a room's state, keeping the `prefill_inflight` gauge equal to the number of
/// rooms in `Ready`.
fn set_state(c: &mut Counters, room: &Room, to: RoomState) {
    let from = *room.state.borrow();
    if from == to {
        return;
    }
    if from == RoomState::Ready {
        c.prefill_inflight = c.prefill_inflight.saturating_sub(1);
    }
    if to == RoomState::Ready {
        c.prefill_inflight += 1;
    }
    if to == RoomState::Failed {
        c.kv_rooms_failed += 1;
    }
    room.state.send_replace(to);
}

/// A prefill's bootstrap server state.
pub struct BootstrapServer {
    instance_id: String,
    registry: Mutex<DecodeRegistry>,
    rooms: Mutex<HashMap<u64, Room>>,
    stats: Arc<Stats>,
    /// What the link remembers about decodes (`--kv-transfer`).
    mode: KvTransfer,
    /// The `stale_transfer_state` fault: every KV pull fails.
    stale: std::sync::atomic::AtomicBool,
}

impl BootstrapServer {
    pub fn new(instance_id: String, stats: Arc<Stats>, mode: KvTransfer) -> Arc<BootstrapServer> {
        Arc::new(BootstrapServer {
            instance_id,
            registry: Mutex::new(DecodeRegistry::default()),
            rooms: Mutex::new(HashMap::new()),
            stats,
            mode,
            stale: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The `stale_transfer_state` fault, live (a restart clears it).
    pub fn set_stale(&self, stale: bool) {
        self.stale.store(stale, std::sync::atomic::Ordering::SeqCst);
    }

    /// Runs `f` on `room` (created `Waiting` if new) with the counters, after forgetting
    /// rooms older than [`ROOM_TTL`].
    fn with_room<R>(&self, room: u64, f: impl FnOnce(&mut Counters, &mut Room) -> R) -> R {
        let mut rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        self.stats.update(|c| {
            rooms.retain(|_, r| {
                let keep = now.duration_since(r.created) < ROOM_TTL;
                if !keep && *r.state.borrow() == RoomState::Ready {
                    c.prefill_inflight = c.prefill_inflight.saturating_sub(1);
                }
                keep
            });
            let r = rooms.entry(room).or_insert_with(|| Room {
                state: watch::channel(RoomState::Waiting).0,
                created: now,
                weights: None,
            });
            f(c, r)
        })
    }

    fn forget(&self, room: u64) {
        self.rooms.lock().unwrap_or_else(|e| e.into_inner()).remove(&room);
    }

    /// Called by the prefill when it has computed `room`'s KV with `weights`: the room
    /// enters the inflight queue, unless its transfer already failed.
    pub fn kv_ready(&self, room: u64, weights: &str) {
        self.with_room(room, |c, r| {
            if *r.state.borrow() == RoomState::Waiting {
                r.weights = Some(weights.to_string());
                set_state(c, r, RoomState::Ready);
            }
        });
    }

    /// Releases `room` from the inflight queue as failed (`KVPoll.Failed`). A room not
    /// computed yet is marked so that it never enters the queue.
    pub fn kv_failed(&self, room: u64) {
        self.with_room(room, |c, r| {
            if matches!(*r.state.borrow(), RoomState::Waiting | RoomState::Ready) {
                set_state(c, r, RoomState::Failed);
            }
        });
    }

    /// The state of `room`, if the prefill knows it.
    pub fn room_state(&self, room: u64) -> Option<RoomState> {
        let rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner());
        rooms.get(&room).map(|r| *r.state.borrow())
    }

    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/health", get(|| async { "OK" }))
            .route("/pd-sim/handshake", post(handshake))
            .route("/pd-sim/kv/{room}", get(kv))
            .route("/pd-sim/kv/{room}/failed", post(kv_failed))
            .with_state(self)
    }
}

async fn handshake(
    State(s): State<Arc<BootstrapServer>>,
    Json(req): Json<HandshakeRequest>,
) -> Json<HandshakeResponse> {
    // NIXL keeps no handshake state about decodes on the prefill's side.
    let degraded = s.mode == KvTransfer::Sglang
        && s.registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .handshake(&req.decode_addr, &req.decode_instance_id);
    if degraded {
        s.stats.update(|c| c.degraded_bootstraps += 1);
        tracing::warn!(
            decode = %req.decode_addr,
            decode_instance = %req.decode_instance_id,
            "bootstrap: a new decode instance at an address this prefill already served; its bootstrap is degraded"
        );
    } else {
        tracing::info!(decode = %req.decode_addr, decode_instance = %req.decode_instance_id, "bootstrap: decode registered");
    }
    Json(HandshakeResponse {
        prefill_instance_id: s.instance_id.clone(),
        degraded,
    })
}

/// The decode reports that `room`'s transfer failed (e.g. `--kv-fail-every`).
async fn kv_failed(State(s): State<Arc<BootstrapServer>>, Path(room): Path<u64>) -> StatusCode {
    s.kv_failed(room);
    StatusCode::OK
}

/// Releases a claimed room as failed if the decode's pull is dropped before it took
/// the KV (the decode went away mid-transfer).
struct Claim<'a> {
    server: &'a BootstrapServer,
    room: u64,
    armed: bool,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if self.armed && self.server.room_state(self.room) == Some(RoomState::Ready) {
            self.server.kv_failed(self.room);
        }
    }
}

async fn kv(State(s): State<Arc<BootstrapServer>>, Path(room): Path<u64>, Query(q): Query<KvQuery>) -> Response {
    if s.stale.load(std::sync::atomic::Ordering::SeqCst) {
        // Stale transfer state: the room's transfer fails (`KVPoll.Failed`).
        s.kv_failed(room);
        return (StatusCode::INTERNAL_SERVER_ERROR, "stale transfer state").into_response();
    }
    if q.prefill_instance_id != s.instance_id {
        // A decode with a stale identity: this room's transfer cannot happen.
        s.kv_failed(room);
        return (
            StatusCode::CONFLICT,
            Json(KvStale {
                error: "stale bootstrap identity".into(),
                prefill_instance_id: s.instance_id.clone(),
            }),
        )
            .into_response();
    }
    let degraded = s
        .registry
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_degraded(&q.decode_instance_id);
    if degraded {
        // The transfer never completes: the decode's generation hangs.
        std::future::pending::<()>().await;
    }
    let mut rx = s.with_room(room, |_, r| r.state.subscribe());
    let state = match rx.wait_for(|st| *st != RoomState::Waiting).await {
        Ok(st) => *st,
        Err(_) => return StatusCode::GONE.into_response(),
    };
    if state != RoomState::Ready {
        return StatusCode::GONE.into_response();
    }
    let mut claim = Claim {
        server: &s,
        room,
        armed: true,
    };
    if q.hold_us > 0 {
        // A slow link: the KV is on its way for this long; the room stays inflight.
        tokio::time::sleep(Duration::from_micros(q.hold_us)).await;
    }
    claim.armed = false;
    let taken = s.with_room(room, |c, r| {
        let ready = *r.state.borrow() == RoomState::Ready;
        if ready {
            set_state(c, r, RoomState::Taken);
            c.kv_served += 1;
        }
        ready.then(|| r.weights.clone())
    });
    let Some(weights) = taken else {
        return StatusCode::GONE.into_response();
    };
    s.forget(room);
    Json(KvAnswer {
        room,
        prefill_instance_id: s.instance_id.clone(),
        weights,
    })
    .into_response()
}

/// What a decode's KV pull receives (the KV itself is not simulated): the room, the
/// prefill's identity, and the weights the KV was computed with — what a real decode
/// would read wrong if they were not its own.
#[derive(Debug, Serialize, Deserialize)]
pub struct KvAnswer {
    pub room: u64,
    pub prefill_instance_id: String,
    #[serde(default)]
    pub weights: Option<String>,
}

/// A decode's side of the link: handshake once per prefill address, then pull KV.
pub struct BootstrapClient {
    http: reqwest::Client,
    instance_id: String,
    /// This decode's own address, set once it has bound its port.
    pub addr: OnceLock<String>,
    /// prefill bootstrap address → the identity learned at the first handshake.
    identities: Mutex<HashMap<String, HandshakeResponse>>,
    /// `--kv-transfer`: SGLang caches identities by address; NIXL meets a
    /// restarted prefill afresh (its engine id is new).
    mode: KvTransfer,
}

impl BootstrapClient {
    pub fn new(instance_id: String, mode: KvTransfer) -> BootstrapClient {
        BootstrapClient {
            // No pooled connections: a restarted prefill must be met on a new socket.
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .expect("reqwest client builds"),
            instance_id,
            addr: OnceLock::new(),
            identities: Mutex::new(HashMap::new()),
            mode,
        }
    }

    /// Handshakes with the prefill bootstrap at `host:port` unless its identity is
    /// cached (SGLang's decode bootstraps in its prealloc queue).
    pub async fn handshake(&self, host: &str, port: u16) -> Result<HandshakeResponse, TransferError> {
        self.identity(&format!("{host}:{port}")).await
    }

    async fn identity(&self, addr: &str) -> Result<HandshakeResponse, TransferError> {
        // NIXL: the identity travels with each request, so a cached one is
        // never stale; modelled as a handshake per transfer.
        if self.mode != KvTransfer::Nixl
            && let Some(id) = self.identities.lock().unwrap_or_else(|e| e.into_inner()).get(addr)
        {
            return Ok(id.clone());
        }
        let req = HandshakeRequest {
            decode_instance_id: self.instance_id.clone(),
            decode_addr: self.addr.get().cloned().unwrap_or_default(),
        };
        let unreachable = |source| TransferError::Unreachable {
            addr: addr.to_string(),
            source,
        };
        let resp = self
            .http
            .post(format!("http://{addr}/pd-sim/handshake"))
            .json(&req)
            .send()
            .await
            .map_err(unreachable)?;
        if !resp.status().is_success() {
            return Err(TransferError::Status {
                addr: addr.to_string(),
                status: resp.status().as_u16(),
            });
        }
        let id: HandshakeResponse = resp.json().await.map_err(unreachable)?;
        if id.degraded {
            tracing::warn!(prefill = addr, "bootstrap: handshake answered degraded");
        } else {
            tracing::info!(prefill = addr, prefill_instance = %id.prefill_instance_id, "bootstrap: handshake done, identity cached");
        }
        let mut ids = self.identities.lock().unwrap_or_else(|e| e.into_inner());
        if self.mode == KvTransfer::Nixl {
            ids.insert(addr.to_string(), id.clone());
            return Ok(id);
        }
        Ok(ids.entry(addr.to_string()).or_insert(id).clone())
    }

    /// Tells the prefill bootstrap at `host:port` that `room`'s transfer failed, so that
    /// the prefill releases it (both ends see `KVPoll.Failed`). Best effort.
    pub async fn report_failed(&self, host: &str, port: u16, room: u64) -> Result<(), TransferError> {
        let addr = format!("{host}:{port}");
        self.http
            .post(format!("http://{addr}/pd-sim/kv/{room}/failed"))
            .send()
            .await
            .map_err(|source| TransferError::Unreachable { addr, source })?;
        Ok(())
    }

    /// Pulls `room`'s KV from the prefill bootstrap at `host:port`. Waits as long as
    /// the prefill takes (forever on a degraded bootstrap), then `hold` more (a slow
    /// link, held by the prefill). Returns the weights the prefill computed it with.
    pub async fn fetch_kv(
        &self,
        host: &str,
        port: u16,
        room: u64,
        hold: Duration,
    ) -> Result<Option<String>, TransferError> {
        let addr = format!("{host}:{port}");
        let id = self.identity(&addr).await?;
        let resp = self
            .http
            .get(format!("http://{addr}/pd-sim/kv/{room}"))
            .query(&KvQuery {
                decode_instance_id: self.instance_id.clone(),
                prefill_instance_id: id.prefill_instance_id.clone(),
                hold_us: u64::try_from(hold.as_micros()).unwrap_or(u64::MAX),
            })
            .send()
            .await
            .map_err(|source| TransferError::Unreachable {
                addr: addr.clone(),
                source,
            })?;
        match resp.status() {
            s if s.is_success() => Ok(resp.json::<KvAnswer>().await.ok().and_then(|a| a.weights)),
            StatusCode::CONFLICT => {
                let actual = resp
                    .json::<KvStale>()
                    .await
                    .map(|b| b.prefill_instance_id)
                    .unwrap_or_else(|_| "?".into());
                Err(TransferError::StaleIdentity {
                    addr,
                    cached: id.prefill_instance_id,
                    actual,
                })
            }
            s => Err(TransferError::Status {
                addr,
                status: s.as_u16(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A decode restarted alone (new instance, same address) is degraded; the first
    // instance and decodes at other addresses are not; a fresh registry (a restarted
    // prefill) has no history.
    #[test]
    fn registry_degrades_only_a_lone_decode_restart() {
        let mut r = DecodeRegistry::default();
        assert!(!r.handshake("127.0.0.1:30001", "d1"));
        assert!(!r.handshake("127.0.0.1:30001", "d1"));
        assert!(!r.handshake("127.0.0.1:30002", "other"));
        assert!(r.handshake("127.0.0.1:30001", "d2"));
        assert!(r.is_degraded("d2") && !r.is_degraded("d1"));
        let mut fresh = DecodeRegistry::default();
        assert!(!fresh.handshake("127.0.0.1:30001", "d3"));
    }
}
