//! Findings: what in a host's GPU report an operator must look at.
//!
//! Pure (DESIGN.md 3): host reports, each unit's queued requests and `now`
//! in, findings out; no I/O, no clock. The rules, from the seeds' lost days:
//! - a **foreign** process on a GPU (a second copy of a model holding
//!   39.8 GB, a training job sharing the accelerator);
//! - GPU memory still held after its **unit died** (a leftover of the unit's
//!   process group), or held by no visible process at all;
//! - **Xid and ECC events** in the last [`EVENT_WINDOW_MS`], and uncorrected
//!   ECC errors since the driver loaded;
//! - a GPU near **zero utilisation while its unit has queued requests**:
//!   evidence for the wedge detector (INCIDENTS rows 3 and 4). The queued
//!   counts come from the engines' metrics; where none are known the rule is
//!   silent.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::host::HostReport;

/// Events older than this (by the orchestrator's receipt time) are history,
/// not findings; `status --json` still lists them under the host.
pub const EVENT_WINDOW_MS: u64 = 24 * 3600 * 1000;
/// At or below this utilisation a GPU counts as idle.
pub const IDLE_UTILIZATION_PCT: u32 = 5;
/// GPU memory in use with no process listed, above which it is a finding
/// (below it is the driver's and context overhead).
pub const UNACCOUNTED_MEMORY_BYTES: u64 = 2 << 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Critical,
    Warning,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostFinding {
    pub severity: Severity,
    /// `foreign_gpu_process`, `dead_unit_gpu_memory`, `gpu_memory_without_process`,
    /// `gpu_event`, `ecc_uncorrected` or `gpu_idle_with_queue`.
    pub kind: String,
    pub host: String,
    pub gpu: Option<u32>,
    pub unit: Option<String>,
    pub pid: Option<u32>,
    pub message: String,
}

/// One host's inputs.
pub struct HostInput<'a> {
    pub host: &'a str,
    pub report: &'a HostReport,
    /// Queued requests per unit on this host, where the engines' metrics say.
    pub queued: &'a BTreeMap<String, u64>,
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Every finding, critical first, then by host and GPU.
pub fn findings(hosts: &[HostInput<'_>], now_unix_ms: u64) -> Vec<HostFinding> {
    let mut out = Vec::new();
    for h in hosts {
        let f = |severity, kind: &str, gpu, unit: Option<&str>, pid, message: String| HostFinding {
            severity,
            kind: kind.to_owned(),
            host: h.host.to_owned(),
            gpu,
            unit: unit.map(str::to_owned),
            pid,
            message,
        };
        for g in &h.report.gpus {
            let idx = Some(g.index);
            for p in &g.processes {
                let mem = p
                    .used_memory_bytes
                    .map_or_else(|| "an unknown amount of".to_owned(), gib);
                if p.foreign {
                    out.push(f(
                        Severity::Warning,
                        "foreign_gpu_process",
                        idx,
                        None,
                        Some(p.pid),
                        format!(
                            "{}: pid {} ({}, user {}) holds {mem} on gpu{} and no supervised unit owns it",
                            h.host,
                            p.pid,
                            p.command_line,
                            if p.user.is_empty() { "?" } else { &p.user },
                            g.index
                        ),
                    ));
                } else if p.unit_dead {
                    let unit = p.unit.as_deref().unwrap_or("?");
                    out.push(f(
                        Severity::Critical,
                        "dead_unit_gpu_memory",
                        idx,
                        Some(unit),
                        Some(p.pid),
                        format!(
                            "{}: unit {unit} is not running, but its process {} ({}) still holds {mem} on gpu{}",
                            h.host, p.pid, p.command_line, g.index
                        ),
                    ));
                }
            }
            if g.processes.is_empty() && g.memory_used_bytes >= UNACCOUNTED_MEMORY_BYTES {
                out.push(f(
                    Severity::Warning,
                    "gpu_memory_without_process",
                    idx,
                    None,
                    None,
                    format!(
                        "{}: gpu{} has {} in use but no process on it (a process died with its memory still \
                         held, or it runs where the agent cannot see it)",
                        h.host,
                        g.index,
                        gib(g.memory_used_bytes)
                    ),
                ));
            }
            if let Some(e) = g.ecc
                && e.volatile_uncorrected > 0
            {
                out.push(f(
                    Severity::Critical,
                    "ecc_uncorrected",
                    idx,
                    None,
                    None,
                    format!(
                        "{}: gpu{} has {} uncorrected ECC errors since the driver loaded",
                        h.host, g.index, e.volatile_uncorrected
                    ),
                ));
            }
            // NVIDIA's row-remapping guidance: a pending remap takes effect
            // at the next GPU reset (until then the bad row stays in use); a
            // failed remap means the GPU needs service.
            if let Some(r) = g.remapped_rows {
                if r.failure {
                    out.push(f(
                        Severity::Critical,
                        "row_remap_failed",
                        idx,
                        None,
                        None,
                        format!(
                            "{}: gpu{} failed to remap a memory row ({} remapped after uncorrectable errors): \
                             drain it and have it serviced",
                            h.host, g.index, r.uncorrectable
                        ),
                    ));
                } else if r.pending {
                    out.push(f(
                        Severity::Warning,
                        "row_remap_pending",
                        idx,
                        None,
                        None,
                        format!(
                            "{}: gpu{} has a memory row remapping pending ({} rows remapped after uncorrectable \
                             errors): it takes effect at the next GPU reset",
                            h.host, g.index, r.uncorrectable
                        ),
                    ));
                }
            }
            if let Some(util) = g.utilization_gpu_pct
                && util <= IDLE_UTILIZATION_PCT
            {
                let mut units: Vec<&str> = g.processes.iter().filter_map(|p| p.unit.as_deref()).collect();
                units.dedup();
                for unit in units {
                    if let Some(&q) = h.queued.get(unit)
                        && q > 0
                    {
                        out.push(f(
                            Severity::Warning,
                            "gpu_idle_with_queue",
                            idx,
                            Some(unit),
                            None,
                            format!(
                                "{}: gpu{} is at {util}% utilisation while {unit} has {q} queued requests \
                                 (evidence of a wedge)",
                                h.host, g.index
                            ),
                        ));
                    }
                }
            }
        }
        for e in &h.report.events {
            if now_unix_ms.saturating_sub(e.received_unix_ms) > EVENT_WINDOW_MS {
                continue;
            }
            let (severity, what) = match (e.kind.as_str(), e.xid) {
                ("xid", Some(x)) => (
                    Severity::Critical,
                    match &e.meaning {
                        Some(m) => format!("Xid {x} ({m})"),
                        None => format!("Xid {x}"),
                    },
                ),
                ("ecc_double_bit", _) => (Severity::Critical, "double-bit ECC error".to_owned()),
                ("ecc_single_bit", _) => (Severity::Warning, "single-bit ECC error".to_owned()),
                (k, _) => (Severity::Warning, format!("GPU event {k}")),
            };
            let ago_s = now_unix_ms.saturating_sub(e.received_unix_ms) / 1000;
            let detail = if e.detail.is_empty() {
                String::new()
            } else {
                format!(": {}", e.detail)
            };
            out.push(f(
                severity,
                "gpu_event",
                Some(e.gpu_index),
                None,
                None,
                format!("{}: gpu{} {what} {ago_s} s ago{detail}", h.host, e.gpu_index),
            ));
        }
    }
    out.sort_by(|a, b| (a.severity, &a.host, a.gpu).cmp(&(b.severity, &b.host, b.gpu)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{EccView, GpuEventView, GpuProcessView, GpuView};

    fn gpu(util: Option<u32>, used: u64, processes: Vec<GpuProcessView>) -> GpuView {
        GpuView {
            index: 0,
            uuid: "GPU-0".into(),
            name: "H100".into(),
            memory_used_bytes: used,
            memory_total_bytes: 80 << 30,
            utilization_gpu_pct: util,
            utilization_memory_pct: None,
            temperature_c: None,
            power_draw_w: None,
            power_limit_w: None,
            throttle_reasons: vec![],
            ecc: None,
            retired_pages: None,
            remapped_rows: None,
            processes,
            read_errors: vec![],
        }
    }

    fn process(pid: u32, unit: Option<&str>, foreign: bool, dead: bool, mem: u64) -> GpuProcessView {
        GpuProcessView {
            pid,
            used_memory_bytes: Some(mem),
            kind: "compute".into(),
            unit: unit.map(str::to_owned),
            foreign,
            unit_dead: dead,
            command_line: "python".into(),
            user: "alice".into(),
        }
    }

    fn report(gpus: Vec<GpuView>, events: Vec<GpuEventView>) -> HostReport {
        HostReport {
            received_unix_ms: 0,
            taken_unix_ms: 0,
            gpu_source: "fake".into(),
            gpu_unavailable: None,
            gpus,
            host: None,
            units: vec![],
            events,
        }
    }

    fn run(r: &HostReport, queued: &BTreeMap<String, u64>, now: u64) -> Vec<HostFinding> {
        findings(
            &[HostInput {
                host: "gpu-1",
                report: r,
                queued,
            }],
            now,
        )
    }

    fn kinds(f: &[HostFinding]) -> Vec<&str> {
        f.iter().map(|x| x.kind.as_str()).collect()
    }

    // Property: the seed's second model copy (39.8 GB, nobody supervises it) is a finding naming pid and user.
    #[test]
    fn foreign_process_is_a_finding() {
        let mem = 39_800_000_000;
        let r = report(
            vec![gpu(
                Some(90),
                mem + (40 << 30),
                vec![
                    process(1, Some("prefill-0"), false, false, 40 << 30),
                    process(2, None, true, false, mem),
                ],
            )],
            vec![],
        );
        let f = run(&r, &BTreeMap::new(), 0);
        assert_eq!(kinds(&f), ["foreign_gpu_process"]);
        assert_eq!(f[0].pid, Some(2));
        assert!(
            f[0].message.contains("37.1 GiB") && f[0].message.contains("alice"),
            "{}",
            f[0].message
        );
    }

    // Property: a pending row remap is a warning (reset the GPU), a failed
    // one critical (service it); rows remapped and done are no finding.
    #[test]
    fn row_remapping_findings() {
        use crate::host::RemappedRowsView;
        let with = |pending, failure| {
            let mut g = gpu(Some(50), 0, vec![]);
            g.remapped_rows = Some(RemappedRowsView {
                correctable: 0,
                uncorrectable: 2,
                pending,
                failure,
            });
            report(vec![g], vec![])
        };
        assert!(run(&with(false, false), &BTreeMap::new(), 0).is_empty());
        let f = run(&with(true, false), &BTreeMap::new(), 0);
        assert_eq!(kinds(&f), ["row_remap_pending"]);
        assert_eq!(f[0].severity, Severity::Warning);
        assert!(f[0].message.contains("next GPU reset"), "{}", f[0].message);
        let f = run(&with(true, true), &BTreeMap::new(), 0);
        assert_eq!(kinds(&f), ["row_remap_failed"]);
        assert_eq!(f[0].severity, Severity::Critical);
        assert!(f[0].message.contains("serviced"), "{}", f[0].message);
    }

    // Property: memory left by a dead unit is critical; memory with no process at all is a warning,
    // but small driver overhead is not.
    #[test]
    fn memory_held_after_death() {
        let r = report(
            vec![gpu(
                Some(0),
                30 << 30,
                vec![process(5, Some("decode-0"), false, true, 30 << 30)],
            )],
            vec![],
        );
        let f = run(&r, &BTreeMap::new(), 0);
        assert_eq!(kinds(&f), ["dead_unit_gpu_memory"]);
        assert_eq!(
            (f[0].severity, f[0].unit.as_deref()),
            (Severity::Critical, Some("decode-0"))
        );
        let orphan = report(vec![gpu(Some(0), 30 << 30, vec![])], vec![]);
        assert_eq!(
            kinds(&run(&orphan, &BTreeMap::new(), 0)),
            ["gpu_memory_without_process"]
        );
        let overhead = report(vec![gpu(Some(0), 500 << 20, vec![])], vec![]);
        assert!(run(&overhead, &BTreeMap::new(), 0).is_empty());
    }

    // Property: a recent Xid is critical and says what it means; an old one is history; uncorrected ECC is critical.
    #[test]
    fn events_and_ecc() {
        let ev = GpuEventView {
            received_unix_ms: 1_000,
            at_unix_ms: 1_000,
            gpu_index: 0,
            gpu_uuid: "GPU-0".into(),
            kind: "xid".into(),
            xid: Some(79),
            meaning: Some("GPU has fallen off the bus".into()),
            detail: String::new(),
        };
        let mut g = gpu(None, 0, vec![]);
        g.ecc = Some(EccView {
            volatile_corrected: 0,
            volatile_uncorrected: 2,
            aggregate_corrected: 0,
            aggregate_uncorrected: 2,
        });
        let r = report(vec![g], vec![ev]);
        let f = run(&r, &BTreeMap::new(), 4_000);
        assert_eq!(kinds(&f), ["ecc_uncorrected", "gpu_event"]);
        assert!(
            f[1].message.contains("Xid 79 (GPU has fallen off the bus) 3 s ago"),
            "{}",
            f[1].message
        );
        let later = run(&r, &BTreeMap::new(), 1_000 + EVENT_WINDOW_MS + 1);
        assert_eq!(kinds(&later), ["ecc_uncorrected"]);
    }

    // Property: an idle GPU is a finding only while its unit has queued requests; no metrics, no finding.
    #[test]
    fn idle_gpu_with_queue() {
        let r = report(
            vec![gpu(
                Some(1),
                40 << 30,
                vec![process(1, Some("decode-0"), false, false, 40 << 30)],
            )],
            vec![],
        );
        assert!(run(&r, &BTreeMap::new(), 0).is_empty());
        assert!(run(&r, &BTreeMap::from([("decode-0".to_owned(), 0)]), 0).is_empty());
        let f = run(&r, &BTreeMap::from([("decode-0".to_owned(), 3)]), 0);
        assert_eq!(kinds(&f), ["gpu_idle_with_queue"]);
        assert!(
            f[0].message.contains("1% utilisation while decode-0 has 3 queued"),
            "{}",
            f[0].message
        );
        let busy = report(
            vec![gpu(
                Some(80),
                40 << 30,
                vec![process(1, Some("decode-0"), false, false, 40 << 30)],
            )],
            vec![],
        );
        assert!(run(&busy, &BTreeMap::from([("decode-0".to_owned(), 3)]), 0).is_empty());
    }
}
