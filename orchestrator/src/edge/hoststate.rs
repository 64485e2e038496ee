//! Each host's GPU and host state as its agent last reported it: the latest
//! `HostSnapshot` and the recent `GpuEvent`s, kept for `status` and for the
//! findings.
//!
//! The agent owns these facts (DESIGN.md 2); this module only keeps the
//! latest and turns them into the `status --json` shape ([`HostReport`]),
//! which the CLI also renders ([`render_host_report`]). A disconnected
//! agent's last report is kept (status says the agent is disconnected, and
//! `received_unix_ms` how old it is). Times are the orchestrator's wall clock
//! at receipt, for people; nothing here decides anything.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use pdwarden_proto::v1::{GpuEvent, HostSnapshot};

use crate::judge::findings::{HostFinding, HostInput, findings};
pub use crate::model::host::*;

/// Events kept per host (newest last).
pub const EVENTS_KEPT: usize = 32;

/// What a well-known Xid usually means (NVIDIA's Xid catalogue, abridged).
pub fn xid_meaning(xid: u64) -> Option<&'static str> {
    Some(match xid {
        13 => "graphics engine exception (often an application fault)",
        31 => "GPU memory page fault (often an application fault)",
        43 => "GPU stopped processing",
        45 => "preemptive cleanup after a previous error",
        48 => "double-bit ECC error",
        61 => "internal micro-controller breakpoint/warning",
        62 => "internal micro-controller halt",
        63 => "ECC page retirement or row remapping recorded",
        64 => "ECC page retirement or row remapping failed",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        119 => "GSP RPC timeout",
        120 => "GSP error",
        _ => return None,
    })
}

impl HostReport {
    fn from_snapshot(s: HostSnapshot, received_unix_ms: u64, events: Vec<GpuEventView>) -> Self {
        let gpus = s
            .gpus
            .into_iter()
            .map(|g| GpuView {
                index: g.index,
                uuid: g.uuid,
                name: g.name,
                memory_used_bytes: g.memory_used_bytes,
                memory_total_bytes: g.memory_total_bytes,
                utilization_gpu_pct: g.utilization_gpu_pct,
                utilization_memory_pct: g.utilization_memory_pct,
                temperature_c: g.temperature_c,
                power_draw_w: g.power_draw_mw.map(|mw| f64::from(mw) / 1000.0),
                power_limit_w: g.power_limit_mw.map(|mw| f64::from(mw) / 1000.0),
                throttle_reasons: g.throttle_reasons,
                ecc: g.ecc.map(|e| EccView {
                    volatile_corrected: e.volatile_corrected,
                    volatile_uncorrected: e.volatile_uncorrected,
                    aggregate_corrected: e.aggregate_corrected,
                    aggregate_uncorrected: e.aggregate_uncorrected,
                }),
                retired_pages: g.retired_pages,
                remapped_rows: g.remapped_rows.map(|r| RemappedRowsView {
                    correctable: r.correctable,
                    uncorrectable: r.uncorrectable,
                    pending: r.pending,
                    failure: r.failure,
                }),
                processes: g
                    .processes
                    .into_iter()
                    .map(|p| GpuProcessView {
                        pid: p.pid,
                        used_memory_bytes: p.used_memory_bytes,
                        kind: p.kind,
                        unit: (!p.unit.is_empty()).then_some(p.unit),
                        foreign: p.foreign,
                        unit_dead: p.unit_dead,
                        command_line: p.command_line,
                        user: p.user,
                    })
                    .collect(),
                read_errors: g.read_errors,
            })
            .collect();
        HostReport {
            received_unix_ms,
            taken_unix_ms: s.taken_unix_ms,
            gpu_source: s.gpu_source,
            gpu_unavailable: (!s.gpu_unavailable.is_empty()).then_some(s.gpu_unavailable),
            gpus,
            host: s.host.map(|h| HostFiguresView {
                cpu_pct: h.cpu_pct,
                cpu_count: h.cpu_count,
                memory_used_bytes: h.memory_used_bytes,
                memory_total_bytes: h.memory_total_bytes,
                load: [h.load1, h.load5, h.load15],
            }),
            units: s
                .units
                .into_iter()
                .map(|u| UnitUsageView {
                    unit: u.unit,
                    pid: (u.pid != 0).then_some(u.pid),
                    rss_bytes: u.rss_bytes,
                    cpu_pct: u.cpu_pct,
                    processes: u.processes,
                })
                .collect(),
            events,
        }
    }
}

fn event_view(e: GpuEvent, received_unix_ms: u64) -> GpuEventView {
    let xid = (e.kind == "xid").then_some(e.xid);
    GpuEventView {
        received_unix_ms,
        at_unix_ms: e.at_unix_ms,
        gpu_index: e.gpu_index,
        gpu_uuid: e.gpu_uuid,
        kind: e.kind,
        xid,
        meaning: xid.and_then(xid_meaning).map(str::to_owned),
        detail: e.detail,
    }
}

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

// ------------------------------------------------------------- rendering

const GIB: f64 = (1u64 << 30) as f64;

fn gib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / GIB)
}

/// `[#######.............]`: the used share of `total` in `width` cells.
pub fn memory_bar(used: u64, total: u64, width: usize) -> String {
    let filled = if total == 0 {
        0
    } else {
        ((used as f64 / total as f64) * width as f64)
            .round()
            .clamp(0.0, width as f64) as usize
    };
    format!("[{}{}]", "#".repeat(filled), ".".repeat(width - filled))
}

/// ANSI emphasis for what must not be missed (foreign processes, critical
/// findings); plain text when `color` is off.
pub fn alert(text: &str, color: bool) -> String {
    if color {
        format!("\x1b[1;31m{text}\x1b[0m")
    } else {
        text.to_owned()
    }
}

fn opt<T: std::fmt::Display>(v: Option<T>, suffix: &str) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v}{suffix}"))
}

fn ago(now_unix_ms: u64, then: u64) -> String {
    let s = now_unix_ms.saturating_sub(then) / 1000;
    if s < 120 {
        format!("{s} s ago")
    } else if s < 7200 {
        format!("{} min ago", s / 60)
    } else {
        format!("{} h ago", s / 3600)
    }
}

/// The lines `pdwarden status` prints under a host: GPUs with a memory bar,
/// utilisation, temperature and power, then each GPU process (foreign ones
/// marked and, with `color`, in red), then host and unit figures.
pub fn render_host_report(r: &HostReport, now_unix_ms: u64, color: bool) -> Vec<String> {
    let mut out = Vec::new();
    let age = if r.received_unix_ms > 0 {
        format!(", {}", ago(now_unix_ms, r.received_unix_ms))
    } else {
        String::new()
    };
    match &r.gpu_unavailable {
        Some(why) => out.push(format!("  gpus: none reported ({}: {why}){age}", r.gpu_source)),
        None => out.push(format!("  gpus ({}{age}):", r.gpu_source)),
    }
    for g in &r.gpus {
        let power = match (g.power_draw_w, g.power_limit_w) {
            (Some(d), Some(l)) => format!("  {d:.0}/{l:.0} W"),
            (Some(d), None) => format!("  {d:.0} W"),
            _ => String::new(),
        };
        out.push(format!(
            "    gpu{} {} {} {}/{} GiB  util {}  mem {}  {}{power}",
            g.index,
            if g.name.is_empty() { &g.uuid } else { &g.name },
            memory_bar(g.memory_used_bytes, g.memory_total_bytes, 20),
            gib(g.memory_used_bytes),
            gib(g.memory_total_bytes),
            opt(g.utilization_gpu_pct, "%"),
            opt(g.utilization_memory_pct, "%"),
            opt(g.temperature_c, "°C"),
        ));
        if !g.throttle_reasons.is_empty() {
            out.push(format!("      throttled: {}", g.throttle_reasons.join(", ")));
        }
        if let Some(e) = g.ecc
            && (e.volatile_uncorrected > 0 || e.aggregate_uncorrected > 0)
        {
            out.push(alert(
                &format!(
                    "      ECC uncorrected: {} since driver load, {} lifetime",
                    e.volatile_uncorrected, e.aggregate_uncorrected
                ),
                color,
            ));
        }
        if let Some(r) = g.remapped_rows
            && (r.pending || r.failure || r.uncorrectable > 0)
        {
            let state = match (r.failure, r.pending) {
                (true, _) => "; a remapping FAILED",
                (false, true) => "; a remapping is pending a GPU reset",
                _ => "",
            };
            out.push(alert(
                &format!(
                    "      rows remapped: {} after uncorrectable, {} after correctable errors{state}",
                    r.uncorrectable, r.correctable
                ),
                color,
            ));
        }
        for p in &g.processes {
            let mem = p.used_memory_bytes.map_or_else(|| "?".to_owned(), gib);
            let line = if p.foreign {
                alert(
                    &format!(
                        "      ! pid {:<7} FOREIGN   {mem:>6} GiB  {} ({})",
                        p.pid,
                        p.command_line,
                        if p.user.is_empty() { "?" } else { &p.user }
                    ),
                    color,
                )
            } else if p.unit_dead {
                alert(
                    &format!(
                        "      ! pid {:<7} {} (unit not running) {mem:>6} GiB  {}",
                        p.pid,
                        p.unit.as_deref().unwrap_or("?"),
                        p.command_line
                    ),
                    color,
                )
            } else {
                format!(
                    "        pid {:<7} {:<9} {mem:>6} GiB  {}",
                    p.pid,
                    p.unit.as_deref().unwrap_or("?"),
                    p.command_line
                )
            };
            out.push(line);
        }
    }
    if let Some(h) = &r.host {
        out.push(format!(
            "  host: cpu {:.0}% of {}  mem {}/{} GiB  load {:.2} {:.2} {:.2}",
            h.cpu_pct,
            h.cpu_count,
            gib(h.memory_used_bytes),
            gib(h.memory_total_bytes),
            h.load[0],
            h.load[1],
            h.load[2]
        ));
    }
    for u in r.units.iter().filter(|u| u.pid.is_some()) {
        out.push(format!(
            "    {:<14} rss {} GiB  cpu {:.0}%  {} processes",
            u.unit,
            gib(u.rss_bytes),
            u.cpu_pct,
            u.processes
        ));
    }
    out
}

/// The findings block of `pdwarden status` (nothing when there are none).
pub fn render_findings(findings: &[HostFinding], color: bool) -> Vec<String> {
    if findings.is_empty() {
        return Vec::new();
    }
    let mut out = vec![format!("findings ({}):", findings.len())];
    for f in findings {
        let line = match f.severity {
            crate::judge::findings::Severity::Critical => alert(&format!("  CRITICAL {}", f.message), color),
            crate::judge::findings::Severity::Warning => format!("  warning  {}", f.message),
        };
        out.push(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use pdwarden_proto::v1::{GpuDevice, GpuProcess, HostStats};

    use super::*;

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
