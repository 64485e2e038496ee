//! The passive watch of engines: one scrape of `/metrics` and health per
//! watched unit per interval, each reported up as an `EngineSample`. A
//! router unit is scraped on its own exporter port (`UnitConfig::metrics_url`)
//! and its sample carries its per-worker retries and errors
//! (`router_workers`, issue 30).
//!
//! The orchestrator asks for a watch (`WatchEngines`) and judges the samples
//! (DESIGN.md 3); the agent only gathers them, close to the engine, over
//! loopback (DESIGN.md 6). A watch costs the engine two cheap GETs per
//! interval and no generation: real traffic proves liveness through the
//! token counters, so active probes are only sent when this evidence is
//! missing or suspicious. A new `WatchEngines` replaces the previous watch
//! (the orchestrator resends it after every reconnect, with a new id).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pdwarden_proto::v1::{EngineSample, WatchEngines, agent_message::Kind};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use crate::metrics::scrape;
use crate::outbox::Outbox;

pub const DEFAULT_INTERVAL_MS: u64 = 1_000;
pub const DEFAULT_SCRAPE_TIMEOUT_MS: u64 = 2_000;

/// One watched unit, resolved against the agent's config.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub unit: String,
    pub metrics_url: String,
    pub health_url: String,
}

/// Owns the current watch task (at most one per agent).
#[derive(Default)]
pub(crate) struct Watch {
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().unwrap_or_else(|p| p.into_inner()).take() {
            t.abort();
        }
    }
}

impl Watch {
    /// Replaces the running watch with one over `targets` (none: stop).
    pub(crate) fn replace(
        &self,
        command_id: String,
        spec: &WatchEngines,
        targets: Vec<Target>,
        http: reqwest::Client,
        outbox: Outbox,
    ) {
        let interval = Duration::from_millis(if spec.interval_ms == 0 {
            DEFAULT_INTERVAL_MS
        } else {
            spec.interval_ms
        });
        let timeout = Duration::from_millis(if spec.scrape_timeout_ms == 0 {
            DEFAULT_SCRAPE_TIMEOUT_MS
        } else {
            spec.scrape_timeout_ms
        });
        let mut slot = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = slot.take() {
            old.abort();
        }
        if targets.is_empty() {
            return;
        }
        let command_id: Arc<str> = command_id.into();
        *slot = Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            let mut seq = 0u64;
            loop {
                tick.tick().await;
                seq += 1;
                let samples =
                    futures::future::join_all(targets.iter().map(|t| sample_one(&http, t, timeout, &command_id, seq)))
                        .await;
                for s in samples {
                    outbox.send(Kind::EngineSample(s));
                }
            }
        }));
    }
}

/// Scrapes metrics and health of one unit, concurrently.
pub(crate) async fn sample_one(
    http: &reqwest::Client,
    t: &Target,
    timeout: Duration,
    command_id: &str,
    seq: u64,
) -> EngineSample {
    let health = async {
        let started = Instant::now();
        let r = tokio::time::timeout(timeout, http.get(&t.health_url).send()).await;
        let status = match r {
            Ok(Ok(resp)) => i32::from(resp.status().as_u16()),
            _ => 0,
        };
        (status, started.elapsed())
    };
    let ((health_status, health_latency), scraped) = tokio::join!(health, scrape(http, &t.metrics_url, timeout));
    let mut s = EngineSample {
        command_id: command_id.to_string(),
        unit: t.unit.clone(),
        seq,
        health_status,
        health_latency_ms: u64::try_from(health_latency.as_millis()).unwrap_or(u64::MAX),
        scrape_latency_ms: u64::try_from(scraped.latency.as_millis()).unwrap_or(u64::MAX),
        ..Default::default()
    };
    match scraped.metrics {
        Ok(m) => {
            s.metrics_ok = true;
            s.running_reqs = m.running_reqs;
            s.queued_reqs = m.queued_reqs;
            s.gen_throughput = m.gen_throughput;
            s.generation_tokens_total = m.generation_tokens_total;
            s.prompt_tokens_total = m.prompt_tokens_total;
            s.requests_total = m.requests_total;
            s.aborted_requests_total = m.aborted_requests_total;
            s.transfer_failed_total = m.transfer_failed_total;
            s.bootstrap_failed_total = m.bootstrap_failed_total;
            s.realtime_tokens_total = m.realtime_tokens_total;
            s.prefill_prealloc_queue_reqs = m.prefill_prealloc_queue_reqs;
            s.prefill_inflight_queue_reqs = m.prefill_inflight_queue_reqs;
            s.decode_prealloc_queue_reqs = m.decode_prealloc_queue_reqs;
            s.decode_transfer_queue_reqs = m.decode_transfer_queue_reqs;
            s.engine_kind = m.engine.map(|e| e.as_str().to_string()).unwrap_or_default();
            s.router_workers = m.router_workers;
            s.router_requests_total = m.router_requests_total;
            s.router_failed_total = m.router_failed_total;
        }
        Err(e) => s.error = e.to_string(),
    }
    s
}
