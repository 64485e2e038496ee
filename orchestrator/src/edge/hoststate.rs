//! Each host's GPU and host state as its agent last reported it: the latest
//! `HostSnapshot` and the recent `GpuEvent`s, kept for `status` and for the
//! findings.
//!
//! The agent owns these facts (DESIGN.md 2); this module only keeps the
//! latest and turns them into the `status --json` shape ([`HostReport`],
//! `pdwarden_model::host`), which the CLI renders (`pdwarden_model::render`). A disconnected
//! agent's last report is kept (status says the agent is disconnected, and
//! `received_unix_ms` how old it is). Times are the orchestrator's wall clock
//! at receipt, for people; nothing here decides anything.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use pdwarden_proto::v1::{GpuEvent, HostSnapshot};

use pdwarden_model::host::{GpuEventView, HostReport, event_view};
use pdwarden_model::judge::findings::{HostFinding, HostInput, findings};

/// Events kept per host (newest last).
pub const EVENTS_KEPT: usize = 32;

#[derive(Default)]
struct HostEntry {
    /// The report as `status` shows it, rebuilt when a snapshot or an event
    /// arrives (about once a second per host) so that reading it — every
    /// `status`, every watch tick — is a reference count, not a rebuild: at
    /// a thousand hosts, rebuilding on read was most of `status`'s time.
    report: Option<Arc<HostReport>>,
    events: VecDeque<GpuEventView>,
}

/// The latest GPU and host state of every host. Cheap to clone (shared).
#[derive(Clone, Default)]
pub struct HostStates {
    inner: Arc<Mutex<BTreeMap<String, HostEntry>>>,
}

/// The orchestrator's wall clock in ms since the Unix epoch (for people).
// The edge that owns wall-clock time for host reports (agents stamp theirs).
#[allow(clippy::disallowed_methods)]
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl HostStates {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, HostEntry>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn record_snapshot(&self, host: &str, snapshot: HostSnapshot, received_unix_ms: u64) {
        // Converted outside the lock; only the events are added under it.
        let mut report = HostReport::from_snapshot(snapshot, received_unix_ms, Vec::new());
        let mut st = self.lock();
        let entry = st.entry(host.to_owned()).or_default();
        report.events = entry.events.iter().cloned().collect();
        entry.report = Some(Arc::new(report));
    }

    pub fn record_event(&self, host: &str, event: GpuEvent, received_unix_ms: u64) {
        tracing::warn!(host, gpu = event.gpu_index, kind = %event.kind, xid = event.xid, detail = %event.detail, "GPU event");
        let mut st = self.lock();
        let entry = st.entry(host.to_owned()).or_default();
        entry.events.push_back(event_view(event, received_unix_ms));
        while entry.events.len() > EVENTS_KEPT {
            entry.events.pop_front();
        }
        let events: Vec<GpuEventView> = entry.events.iter().cloned().collect();
        match &mut entry.report {
            Some(report) => Arc::make_mut(report).events = events,
            None => {
                entry.report = Some(Arc::new(HostReport {
                    received_unix_ms: 0,
                    taken_unix_ms: 0,
                    gpu_source: String::new(),
                    gpu_unavailable: Some("no snapshot received yet".into()),
                    gpus: Vec::new(),
                    host: None,
                    units: Vec::new(),
                    events,
                }))
            }
        }
    }

    /// The host's report, if its agent has sent a snapshot or an event.
    pub fn report(&self, host: &str) -> Option<Arc<HostReport>> {
        self.lock().get(host).and_then(|e| e.report.clone())
    }

    /// `unit`'s GPU utilisation (0..1) from `host`'s latest snapshot, if
    /// that snapshot arrived within `max_age_ms` of `now_unix_ms` (see
    /// [`HostReport::unit_gpu_utilization`]).
    pub fn unit_gpu_utilization(&self, host: &str, unit: &str, now_unix_ms: u64, max_age_ms: u64) -> Option<f64> {
        let report = self.report(host)?;
        if report.received_unix_ms == 0 || now_unix_ms.saturating_sub(report.received_unix_ms) > max_age_ms {
            return None;
        }
        report.unit_gpu_utilization(unit)
    }

    /// Findings over every host's latest report; `queued` is each host's
    /// queued requests per unit, where the engines' metrics are known.
    pub fn findings(&self, queued: &BTreeMap<String, BTreeMap<String, u64>>, now_unix_ms: u64) -> Vec<HostFinding> {
        findings_over(&self.all(), queued, now_unix_ms)
    }

    /// Every host's report, by host (one lock, no copies of the reports).
    pub fn all(&self) -> BTreeMap<String, Arc<HostReport>> {
        self.lock()
            .iter()
            .filter_map(|(h, e)| e.report.clone().map(|r| (h.clone(), r)))
            .collect()
    }
}

/// Findings over the given hosts' reports; `queued` is each host's queued
/// requests per unit, where the engines' metrics are known.
pub fn findings_over(
    reports: &BTreeMap<String, Arc<HostReport>>,
    queued: &BTreeMap<String, BTreeMap<String, u64>>,
    now_unix_ms: u64,
) -> Vec<HostFinding> {
    let none = BTreeMap::new();
    let inputs: Vec<HostInput<'_>> = reports
        .iter()
        .map(|(host, report)| HostInput {
            host,
            report,
            queued: queued.get(host).unwrap_or(&none),
        })
        .collect();
    findings(&inputs, now_unix_ms)
}

#[cfg(test)]
mod tests {
    use pdwarden_proto::v1::{GpuDevice, GpuProcess, HostStats};

    use super::*;
    use pdwarden_model::render::{memory_bar, render_host_report};

    fn snapshot() -> HostSnapshot {
        HostSnapshot {
            taken_unix_ms: 1,
            gpu_source: "fake".into(),
            gpus: vec![GpuDevice {
                index: 0,
                uuid: "GPU-0".into(),
                name: "H100".into(),
                memory_used_bytes: 60 << 30,
                memory_total_bytes: 80 << 30,
                utilization_gpu_pct: Some(0),
                temperature_c: Some(41),
                power_draw_mw: Some(120_000),
                power_limit_mw: Some(700_000),
                processes: vec![
                    GpuProcess {
                        pid: 7,
                        used_memory_bytes: Some(40 << 30),
                        kind: "compute".into(),
                        unit: "prefill-0".into(),
                        command_line: "python -m sglang".into(),
                        user: "svc".into(),
                        ..Default::default()
                    },
                    GpuProcess {
                        pid: 9,
                        used_memory_bytes: Some(20 << 30),
                        kind: "compute".into(),
                        foreign: true,
                        command_line: "python train.py".into(),
                        user: "alice".into(),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }],
            host: Some(HostStats {
                cpu_count: 2,
                memory_total_bytes: 8 << 30,
                ..Default::default()
            }),
            units: vec![],
            ..Default::default()
        }
    }

    // Property: the report keeps the latest snapshot and a bounded list of events, with Xid meanings.
    #[test]
    fn keeps_latest_and_bounded_events() {
        let s = HostStates::default();
        assert!(s.report("h").is_none());
        s.record_snapshot("h", snapshot(), 5);
        for i in 0..(EVENTS_KEPT + 3) {
            s.record_event(
                "h",
                GpuEvent {
                    kind: "xid".into(),
                    xid: 79,
                    at_unix_ms: i as u64,
                    ..Default::default()
                },
                10,
            );
        }
        let r = s.report("h").unwrap();
        assert_eq!(r.received_unix_ms, 5);
        assert_eq!(r.gpus[0].processes[1].unit, None);
        assert_eq!(r.events.len(), EVENTS_KEPT);
        assert_eq!(r.events.last().unwrap().at_unix_ms, (EVENTS_KEPT + 2) as u64);
        assert_eq!(r.events[0].meaning.as_deref(), Some("GPU has fallen off the bus"));
        assert_eq!(r.gpus[0].power_draw_w, Some(120.0));
    }

    // Property: status shows a memory bar, utilisation and temperature, and marks foreign processes.
    #[test]
    fn renders_gpus_and_marks_foreign() {
        let s = HostStates::default();
        s.record_snapshot("h", snapshot(), 1_000);
        let lines = render_host_report(&s.report("h").unwrap(), 3_000, false);
        let text = lines.join("\n");
        assert!(
            text.contains("gpu0 H100 [###############.....] 60.0/80.0 GiB  util 0%"),
            "{text}"
        );
        assert!(text.contains("41°C  120/700 W"), "{text}");
        assert!(
            text.contains("! pid 9       FOREIGN     20.0 GiB  python train.py (alice)"),
            "{text}"
        );
        assert!(text.contains("pid 7       prefill-0   40.0 GiB"), "{text}");
        let colored = render_host_report(&s.report("h").unwrap(), 3_000, true).join("\n");
        assert!(colored.contains("\x1b[1;31m      ! pid 9"), "{colored}");
    }

    // Property: a unit's GPU utilisation is its busiest GPU's, only from live
    // processes of that unit, and only from a fresh enough snapshot.
    #[test]
    fn unit_gpu_utilization_from_its_processes() {
        let s = HostStates::default();
        let mut snap = snapshot();
        let mut second = snap.gpus[0].clone();
        second.index = 1;
        second.utilization_gpu_pct = Some(40);
        second.processes.truncate(1);
        snap.gpus.push(second);
        s.record_snapshot("h", snap.clone(), 1_000);
        assert_eq!(s.unit_gpu_utilization("h", "prefill-0", 2_000, 5_000), Some(0.4));
        assert_eq!(s.unit_gpu_utilization("h", "decode-0", 2_000, 5_000), None);
        assert_eq!(s.unit_gpu_utilization("h", "prefill-0", 9_000, 5_000), None, "stale");
        assert_eq!(s.unit_gpu_utilization("other", "prefill-0", 2_000, 5_000), None);
        for g in &mut snap.gpus {
            g.processes[0].unit_dead = true;
        }
        s.record_snapshot("h", snap, 1_000);
        assert_eq!(
            s.unit_gpu_utilization("h", "prefill-0", 2_000, 5_000),
            None,
            "dead unit"
        );
    }

    // Property: the bar is empty for zero total and full (never over) at or above total.
    #[test]
    fn memory_bar_bounds() {
        assert_eq!(memory_bar(5, 0, 4), "[....]");
        assert_eq!(memory_bar(9, 8, 4), "[####]");
        assert_eq!(memory_bar(4, 8, 4), "[##..]");
    }
}
