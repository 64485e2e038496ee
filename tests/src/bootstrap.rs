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
use tokio::time::Instant;

use crate::stats::Stats;

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

struct Room {
    ready: watch::Sender<bool>,
    created: Instant,
}

/// A prefill's bootstrap server state.
pub struct BootstrapServer {
    instance_id: String,
    registry: Mutex<DecodeRegistry>,
    rooms: Mutex<HashMap<u64, Room>>,
    stats: Arc<Stats>,
}

impl BootstrapServer {
    pub fn new(instance_id: String, stats: Arc<Stats>) -> Arc<BootstrapServer> {
        Arc::new(BootstrapServer {
            instance_id,
            registry: Mutex::new(DecodeRegistry::default()),
            rooms: Mutex::new(HashMap::new()),
            stats,
        })
    }

    fn room(&self, room: u64) -> watch::Receiver<bool> {
        let mut rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        rooms.retain(|_, r| now.duration_since(r.created) < ROOM_TTL);
        rooms
            .entry(room)
            .or_insert_with(|| Room {
                ready: watch::channel(false).0,
                created: now,
            })
            .ready
            .subscribe()
    }

    /// Called by the prefill when it has computed `room`'s KV.
    pub fn kv_ready(&self, room: u64) {
        let _rx = self.room(room);
        let rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = rooms.get(&room) {
            r.ready.send_replace(true);
        }
    }

    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/health", get(|| async { "OK" }))
            .route("/pd-sim/handshake", post(handshake))
            .route("/pd-sim/kv/{room}", get(kv))
            .with_state(self)
    }
}

async fn handshake(
    State(s): State<Arc<BootstrapServer>>,
    Json(req): Json<HandshakeRequest>,
) -> Json<HandshakeResponse> {
    let degraded = s
        .registry
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

async fn kv(State(s): State<Arc<BootstrapServer>>, Path(room): Path<u64>, Query(q): Query<KvQuery>) -> Response {
    if q.prefill_instance_id != s.instance_id {
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
    let mut rx = s.room(room);
    if rx.wait_for(|ready| *ready).await.is_err() {
        return StatusCode::GONE.into_response();
    }
    s.rooms.lock().unwrap_or_else(|e| e.into_inner()).remove(&room);
    s.stats.update(|c| c.kv_served += 1);
    Json(serde_json::json!({ "room": room, "prefill_instance_id": s.instance_id })).into_response()
}

/// A decode's side of the link: handshake once per prefill address, then pull KV.
pub struct BootstrapClient {
    http: reqwest::Client,
    instance_id: String,
    /// This decode's own address, set once it has bound its port.
    pub addr: OnceLock<String>,
    /// prefill bootstrap address → the identity learned at the first handshake.
    identities: Mutex<HashMap<String, HandshakeResponse>>,
}

impl BootstrapClient {
    pub fn new(instance_id: String) -> BootstrapClient {
        BootstrapClient {
            // No pooled connections: a restarted prefill must be met on a new socket.
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .expect("reqwest client builds"),
            instance_id,
            addr: OnceLock::new(),
            identities: Mutex::new(HashMap::new()),
        }
    }

    async fn identity(&self, addr: &str) -> Result<HandshakeResponse, TransferError> {
        if let Some(id) = self.identities.lock().unwrap_or_else(|e| e.into_inner()).get(addr) {
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
        Ok(ids.entry(addr.to_string()).or_insert(id).clone())
    }

    /// Pulls `room`'s KV from the prefill bootstrap at `host:port`. Waits as long as
    /// the prefill takes (forever on a degraded bootstrap).
    pub async fn fetch_kv(&self, host: &str, port: u16, room: u64) -> Result<(), TransferError> {
        let addr = format!("{host}:{port}");
        let id = self.identity(&addr).await?;
        let resp = self
            .http
            .get(format!("http://{addr}/pd-sim/kv/{room}"))
            .query(&KvQuery {
                decode_instance_id: self.instance_id.clone(),
                prefill_instance_id: id.prefill_instance_id.clone(),
            })
            .send()
            .await
            .map_err(|source| TransferError::Unreachable {
                addr: addr.clone(),
                source,
            })?;
        match resp.status() {
            s if s.is_success() => Ok(()),
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
