//! The GPU and host reporter: samples the GPU source and the host, works out
//! who owns each GPU process, and streams `HostSnapshot`s and `GpuEvent`s.
//!
//! It samples every `gpu_sample_interval_ms` and sends a snapshot when
//! something material changed (the GPU set, a process, its owner, ECC
//! counts, throttling, a unit's pid, the source's availability) or
//! `gpu_snapshot_interval_ms` has passed since the last one; figures that
//! drift every second (utilisation, temperature, memory) ride on the
//! periodic snapshot. Events are sent as soon as the sample that found them.
//! The latest snapshot is also kept for the link (sent after every attach,
//! so the orchestrator re-reads the facts: DESIGN.md 2) and for `/metrics`.
//!
//! Building the snapshot ([`build_snapshot`]) and deciding whether it is
//! material ([`material_change`]) are pure; sampling blocks (NVML, /proc) and
//! runs on a blocking thread.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pdwarden_proto::v1::{
    GpuDevice, GpuEccCounts, GpuEvent, GpuProcess, GpuRemappedRows, HostSnapshot, HostStats, HostUnitUsage,
    agent_message::Kind,
};
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{info, warn};

use super::mapping::{Owner, ProcTable, UnitPids, owner_of, unit_usage};
use super::{GpuError, GpuEventReading, GpuReading, GpuSource, GpuSourceSpec};
use crate::host::{HostFigures, HostSampler};
use crate::outbox::Outbox;

/// How often to sample and how often to send a snapshot regardless of change.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReporterParams {
    pub sample_interval: Duration,
    pub snapshot_interval: Duration,
}

/// How many recent GPU events [`Latest`] keeps for the evidence captured
/// before a kill (issue 35).
pub const RECENT_GPU_EVENTS: usize = 256;

/// What the reporter last saw, shared with the link, `/metrics` and the
/// evidence capture.
#[derive(Debug, Clone, Default)]
pub struct Latest {
    pub snapshot: Option<HostSnapshot>,
    /// Events seen since the agent started, by (GPU index, kind).
    pub events_total: BTreeMap<(u32, String), u64>,
    /// The newest [`RECENT_GPU_EVENTS`] events, oldest first: an Xid that
    /// came before a wedge is evidence of why, though it was sent long ago.
    pub recent_events: VecDeque<GpuEvent>,
}

impl Latest {
    /// Counts `event` and keeps it among the recent ones (bounded).
    pub fn record_event(&mut self, event: &GpuEvent) {
        *self
            .events_total
            .entry((event.gpu_index, event.kind.clone()))
            .or_default() += 1;
        self.recent_events.push_back(event.clone());
        while self.recent_events.len() > RECENT_GPU_EVENTS {
            self.recent_events.pop_front();
        }
    }
}

pub(crate) type LatestTx = watch::Sender<Arc<Latest>>;

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Builds a snapshot from one sample. `units` are every configured unit
/// with its running pid (if any) and its latest pid.
pub fn build_snapshot(
    source_kind: &str,
    readings: Result<Vec<GpuReading>, GpuError>,
    figures: &HostFigures,
    procs: &ProcTable,
    units: &[UnitPids],
    taken_unix_ms: u64,
) -> HostSnapshot {
    let (mut gpus, gpu_unavailable) = match readings {
        Ok(r) => (r, String::new()),
        Err(e) => (Vec::new(), e.to_string()),
    };
    gpus.sort_by_key(|g| g.index);
    let gpus = gpus
        .into_iter()
        .map(|g| {
            let mut processes: Vec<GpuProcess> = g
                .processes
                .iter()
                .map(|p| {
                    let owner = owner_of(p.pid, units, procs);
                    let info = procs.get(&p.pid);
                    GpuProcess {
                        pid: p.pid,
                        used_memory_bytes: p.used_memory_bytes,
                        kind: p.kind.as_str().to_owned(),
                        unit: match &owner {
                            Owner::Unit(n) | Owner::DeadUnit(n) => n.clone(),
                            Owner::Foreign => String::new(),
                        },
                        foreign: owner == Owner::Foreign,
                        unit_dead: matches!(owner, Owner::DeadUnit(_)),
                        command_line: info.map_or_else(
                            || "(not visible to the agent: another PID namespace?)".to_owned(),
                            |i| i.command_line.clone(),
                        ),
                        user: info.map(|i| i.user.clone()).unwrap_or_default(),
                    }
                })
                .collect();
            processes.sort_by_key(|p| (p.pid, p.kind.clone()));
            GpuDevice {
                index: g.index,
                uuid: g.uuid,
                name: g.name,
                memory_used_bytes: g.memory_used_bytes,
                memory_total_bytes: g.memory_total_bytes,
                utilization_gpu_pct: g.utilization_gpu_pct,
                utilization_memory_pct: g.utilization_memory_pct,
                temperature_c: g.temperature_c,
                power_draw_mw: g.power_draw_mw,
                power_limit_mw: g.power_limit_mw,
                throttle_reasons: g.throttle_reasons,
                ecc: g.ecc.map(|e| GpuEccCounts {
                    volatile_corrected: e.volatile_corrected,
                    volatile_uncorrected: e.volatile_uncorrected,
                    aggregate_corrected: e.aggregate_corrected,
                    aggregate_uncorrected: e.aggregate_uncorrected,
                }),
                retired_pages: g.retired_pages,
                remapped_rows: g.remapped_rows.map(|r| GpuRemappedRows {
                    correctable: r.correctable,
                    uncorrectable: r.uncorrectable,
                    pending: r.pending,
                    failure: r.failure,
                }),
                processes,
                read_errors: g.read_errors,
            }
        })
        .collect();
    let usage = unit_usage(units, procs);
    let mut unit_rows: Vec<HostUnitUsage> = units
        .iter()
        .map(|u| {
            let x = usage.get(&u.name).cloned().unwrap_or_default();
            HostUnitUsage {
                unit: u.name.clone(),
                pid: u.pid.unwrap_or(0),
                rss_bytes: x.rss_bytes,
                cpu_pct: x.cpu_pct,
                processes: x.processes,
            }
        })
        .collect();
    unit_rows.sort_by(|a, b| a.unit.cmp(&b.unit));
    HostSnapshot {
        taken_unix_ms,
        gpu_source: source_kind.to_owned(),
        gpu_unavailable,
        gpus,
        host: Some(HostStats {
            cpu_pct: figures.cpu_pct,
            cpu_count: figures.cpu_count,
            memory_used_bytes: figures.memory_used_bytes,
            memory_total_bytes: figures.memory_total_bytes,
            load1: figures.load[0],
            load5: figures.load[1],
            load15: figures.load[2],
        }),
        units: unit_rows,
    }
}

/// Whether `next` differs from `prev` in something the orchestrator should
/// hear about now rather than at the next periodic snapshot.
pub fn material_change(prev: &HostSnapshot, next: &HostSnapshot) -> bool {
    fn shape(s: &HostSnapshot) -> impl PartialEq + '_ {
        let gpus: Vec<_> = s
            .gpus
            .iter()
            .map(|g| {
                let procs: Vec<_> = g
                    .processes
                    .iter()
                    .map(|p| (p.pid, p.kind.as_str(), p.unit.as_str(), p.foreign, p.unit_dead))
                    .collect();
                (
                    g.index,
                    g.uuid.as_str(),
                    g.ecc.as_ref(),
                    g.retired_pages,
                    g.remapped_rows.as_ref(),
                    &g.throttle_reasons,
                    procs,
                    &g.read_errors,
                )
            })
            .collect();
        let units: Vec<_> = s.units.iter().map(|u| (u.unit.as_str(), u.pid)).collect();
        (s.gpu_source.as_str(), s.gpu_unavailable.as_str(), gpus, units)
    }
    shape(prev) != shape(next)
}

fn to_event(e: GpuEventReading, at_unix_ms: u64) -> GpuEvent {
    GpuEvent {
        at_unix_ms,
        gpu_index: e.gpu_index,
        gpu_uuid: e.gpu_uuid,
        kind: e.kind.as_str().to_owned(),
        xid: e.xid,
        detail: e.detail,
    }
}

/// The state sampling needs between ticks; moved onto a blocking thread for
/// each sample and back.
struct Sampler {
    source: Box<dyn GpuSource>,
    host: HostSampler,
    /// Each unit's latest pid, kept after it exits (to recognise what a dead
    /// unit left behind).
    last_pids: HashMap<String, u32>,
}

impl Sampler {
    fn sample(&mut self, running: Vec<(String, u32)>) -> (HostSnapshot, Vec<GpuEvent>) {
        let units: Vec<UnitPids> = running
            .into_iter()
            .map(|(name, pid)| {
                let pid = (pid != 0).then_some(pid);
                if let Some(p) = pid {
                    self.last_pids.insert(name.clone(), p);
                }
                UnitPids {
                    last_pid: self.last_pids.get(&name).copied(),
                    name,
                    pid,
                }
            })
            .collect();
        let readings = self.source.sample();
        let (figures, procs) = self.host.sample();
        let now = now_unix_ms();
        let events = self
            .source
            .take_events()
            .into_iter()
            .map(|e| to_event(e, now))
            .collect();
        let snapshot = build_snapshot(self.source.kind(), readings, &figures, &procs, &units, now);
        (snapshot, events)
    }
}

/// Runs until the task is aborted. `units` returns every configured unit's
/// name and running pid (0 when not running).
pub(crate) async fn run(
    spec: GpuSourceSpec,
    params: ReporterParams,
    units: impl Fn() -> Vec<(String, u32)>,
    outbox: Outbox,
    latest: LatestTx,
) {
    // Opening NVML loads a library and talks to the driver: blocking.
    let opened = tokio::task::spawn_blocking(move || Sampler {
        source: super::open(&spec),
        host: HostSampler::new(),
        last_pids: HashMap::new(),
    })
    .await;
    let Ok(mut sampler) = opened else {
        warn!("the GPU and host reporter could not start");
        return;
    };
    let mut tick = tokio::time::interval(params.sample_interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last_sent: Option<(HostSnapshot, Instant)> = None;
    let mut said: Option<String> = None;
    loop {
        tick.tick().await;
        let running = units();
        let Ok((s, snapshot, events)) = tokio::task::spawn_blocking(move || {
            let (snapshot, events) = sampler.sample(running);
            (sampler, snapshot, events)
        })
        .await
        else {
            warn!("GPU and host sampling panicked; the reporter stops");
            return;
        };
        sampler = s;

        // Say once (and again only when it changes) why GPU reporting is off.
        if said.as_deref() != Some(snapshot.gpu_unavailable.as_str()) {
            if snapshot.gpu_unavailable.is_empty() {
                info!(source = %snapshot.gpu_source, gpus = snapshot.gpus.len(), "GPU reporting is on");
            } else if snapshot.gpu_source == "none" {
                info!(reason = %snapshot.gpu_unavailable, "GPU reporting is off");
            } else {
                warn!(source = %snapshot.gpu_source, reason = %snapshot.gpu_unavailable, "GPU reporting is not available");
            }
            said = Some(snapshot.gpu_unavailable.clone());
        }

        let now = Instant::now();
        let due = match &last_sent {
            None => true,
            Some((prev, at)) => material_change(prev, &snapshot) || now.duration_since(*at) >= params.snapshot_interval,
        };
        latest.send_modify(|l| {
            let l = Arc::make_mut(l);
            for e in &events {
                l.record_event(e);
            }
            l.snapshot = Some(snapshot.clone());
        });
        for e in events {
            warn!(gpu = e.gpu_index, kind = %e.kind, xid = e.xid, detail = %e.detail, "GPU event");
            outbox.send(Kind::GpuEvent(e));
        }
        if due {
            outbox.send(Kind::HostSnapshot(snapshot.clone()));
            last_sent = Some((snapshot, now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::mapping::ProcInfo;
    use super::super::{EccCounts, GpuProcessReading};
    use super::*;

    fn procs() -> ProcTable {
        let p = |ppid, pgid, cmd: &str| ProcInfo {
            ppid: Some(ppid),
            pgid: Some(pgid),
            command_line: cmd.into(),
            user: "alice".into(),
            rss_bytes: 1 << 20,
            cpu_pct: 50.0,
        };
        HashMap::from([
            (100, p(1, 100, "prefill")),
            (101, p(100, 100, "python -m sglang")),
            (300, p(1, 300, "python train.py")),
        ])
    }

    fn gpu(pids: &[u32]) -> GpuReading {
        GpuReading {
            index: 0,
            uuid: "GPU-0".into(),
            name: "Fake H100".into(),
            memory_used_bytes: 10,
            memory_total_bytes: 80,
            ecc: Some(EccCounts::default()),
            processes: pids
                .iter()
                .map(|&pid| GpuProcessReading {
                    pid,
                    used_memory_bytes: Some(5),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn units() -> Vec<UnitPids> {
        vec![UnitPids {
            name: "prefill-0".into(),
            pid: Some(100),
            last_pid: Some(100),
        }]
    }

    // Property: each GPU process carries its owner, foreign ones their command line and user;
    // unit footprints cover the unit's whole tree.
    #[test]
    fn snapshot_maps_owners() {
        let s = build_snapshot(
            "fake",
            Ok(vec![gpu(&[300, 101])]),
            &HostFigures::default(),
            &procs(),
            &units(),
            7,
        );
        let p = &s.gpus[0].processes;
        assert_eq!((p[0].pid, p[0].unit.as_str(), p[0].foreign), (101, "prefill-0", false));
        assert_eq!((p[1].pid, p[1].foreign), (300, true));
        assert_eq!(p[1].command_line, "python train.py");
        assert_eq!(p[1].user, "alice");
        assert_eq!(s.units[0].processes, 2);
        assert_eq!(s.units[0].rss_bytes, 2 << 20);
        assert_eq!(s.gpu_unavailable, "");
    }

    // Property: recorded events are counted and the newest
    // RECENT_GPU_EVENTS of them kept, oldest first.
    #[test]
    fn recent_events_are_bounded() {
        let mut l = Latest::default();
        for i in 0..(RECENT_GPU_EVENTS as u64 + 10) {
            l.record_event(&GpuEvent {
                at_unix_ms: i,
                kind: "xid".into(),
                xid: 79,
                ..Default::default()
            });
        }
        assert_eq!(l.recent_events.len(), RECENT_GPU_EVENTS);
        assert_eq!(l.recent_events.front().map(|e| e.at_unix_ms), Some(10));
        assert_eq!(
            l.recent_events.back().map(|e| e.at_unix_ms),
            Some(RECENT_GPU_EVENTS as u64 + 9)
        );
        assert_eq!(l.events_total[&(0, "xid".to_owned())], RECENT_GPU_EVENTS as u64 + 10);
    }

    // Property: an unavailable source gives a snapshot with the reason and host figures, no GPUs.
    #[test]
    fn unavailable_source_keeps_host_figures() {
        let s = build_snapshot(
            "nvml",
            Err(GpuError::Unavailable {
                reason: "libnvidia-ml.so not found".into(),
            }),
            &HostFigures {
                cpu_count: 2,
                ..Default::default()
            },
            &procs(),
            &units(),
            7,
        );
        assert!(s.gpus.is_empty());
        assert_eq!(s.gpu_unavailable, "libnvidia-ml.so not found");
        assert_eq!(s.host.unwrap().cpu_count, 2);
    }

    // Property: a new GPU process, an ECC count or availability is material; utilisation and
    // memory drift are not.
    #[test]
    fn what_is_material() {
        let snap = |g: GpuReading| build_snapshot("fake", Ok(vec![g]), &HostFigures::default(), &procs(), &units(), 1);
        let base = snap(gpu(&[101]));
        let mut drift = gpu(&[101]);
        drift.memory_used_bytes = 70;
        drift.utilization_gpu_pct = Some(99);
        drift.temperature_c = Some(80);
        assert!(!material_change(&base, &snap(drift)));
        assert!(material_change(&base, &snap(gpu(&[101, 300]))));
        let mut ecc = gpu(&[101]);
        ecc.ecc = Some(EccCounts {
            volatile_uncorrected: 1,
            ..Default::default()
        });
        assert!(material_change(&base, &snap(ecc)));
        let off = build_snapshot(
            "fake",
            Err(GpuError::ReadFailed { reason: "x".into() }),
            &HostFigures::default(),
            &procs(),
            &units(),
            1,
        );
        assert!(material_change(&base, &off));
    }
}
