//! Each host's GPU and host state as `status --json` carries it (under
//! `agents[].host_report`): the records the edge fills from an agent's
//! snapshot, the findings judge reads and the CLI renders. Data only, on
//! the ground floor: it imports no other module of the crate (the wire's
//! snapshot in, the view out: [`HostReport::from_snapshot`]).

use pdwarden_proto::v1::{GpuDevice, GpuEvent, GpuProcess, HostSnapshot};
use serde::{Deserialize, Serialize};

/// One host's GPUs, processes and figures, as `status --json` carries them
/// under `agents[].host_report`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostReport {
    /// When the orchestrator received the snapshot (its wall clock).
    pub received_unix_ms: u64,
    /// When the agent took it (the agent's wall clock).
    pub taken_unix_ms: u64,
    /// `nvml`, `fake` or `none`.
    pub gpu_source: String,
    /// Why GPU reporting is off or failing; absent when it works.
    pub gpu_unavailable: Option<String>,
    pub gpus: Vec<GpuView>,
    pub host: Option<HostFiguresView>,
    pub units: Vec<UnitUsageView>,
    /// Recent critical GPU events, oldest first.
    pub events: Vec<GpuEventView>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuView {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    pub utilization_gpu_pct: Option<u32>,
    pub utilization_memory_pct: Option<u32>,
    pub temperature_c: Option<u32>,
    pub power_draw_w: Option<f64>,
    pub power_limit_w: Option<f64>,
    pub throttle_reasons: Vec<String>,
    pub ecc: Option<EccView>,
    pub retired_pages: Option<u32>,
    /// Row remapping (A100 and later); absent where unsupported.
    pub remapped_rows: Option<RemappedRowsView>,
    pub processes: Vec<GpuProcessView>,
    pub read_errors: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EccView {
    pub volatile_corrected: u64,
    pub volatile_uncorrected: u64,
    pub aggregate_corrected: u64,
    pub aggregate_uncorrected: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemappedRowsView {
    pub correctable: u32,
    pub uncorrectable: u32,
    /// A remapping waits for a GPU reset.
    pub pending: bool,
    /// A remapping failed: the GPU needs service.
    pub failure: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuProcessView {
    pub pid: u32,
    pub used_memory_bytes: Option<u64>,
    /// `compute` or `graphics`.
    pub kind: String,
    /// The owning unit; absent for a foreign process.
    pub unit: Option<String>,
    /// No supervised unit owns it.
    pub foreign: bool,
    /// Its unit is no longer running, yet it still holds GPU memory.
    pub unit_dead: bool,
    pub command_line: String,
    pub user: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostFiguresView {
    pub cpu_pct: f32,
    pub cpu_count: u32,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    pub load: [f64; 3],
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnitUsageView {
    pub unit: String,
    pub pid: Option<u32>,
    pub rss_bytes: u64,
    pub cpu_pct: f32,
    pub processes: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuEventView {
    /// When the orchestrator received it (its wall clock).
    pub received_unix_ms: u64,
    /// When the agent saw it (the agent's wall clock).
    pub at_unix_ms: u64,
    pub gpu_index: u32,
    pub gpu_uuid: String,
    /// `xid`, `ecc_single_bit`, `ecc_double_bit` or `other`.
    pub kind: String,
    pub xid: Option<u64>,
    /// What the Xid usually means, where it is a well-known one.
    pub meaning: Option<String>,
    pub detail: String,
}

impl HostReport {
    /// `unit`'s GPU utilisation (0..1): the busiest GPU holding one of its
    /// live processes, as this report says. `None` when no GPU of the report
    /// holds a process of the unit, or none of those reports utilisation.
    pub fn unit_gpu_utilization(&self, unit: &str) -> Option<f64> {
        self.gpus
            .iter()
            .filter(|g| {
                g.processes
                    .iter()
                    .any(|p| p.unit.as_deref() == Some(unit) && !p.unit_dead)
            })
            .filter_map(|g| g.utilization_gpu_pct)
            .max()
            .map(|pct| f64::from(pct) / 100.0)
    }
}

impl HostReport {
    pub fn from_snapshot(s: HostSnapshot, received_unix_ms: u64, events: Vec<GpuEventView>) -> Self {
        let gpus = s.gpus.into_iter().map(gpu_view).collect();
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

/// One GPU of a snapshot, as reports and captures show it.
pub fn gpu_view(g: GpuDevice) -> GpuView {
    GpuView {
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
        processes: g.processes.into_iter().map(process_view).collect(),
        read_errors: g.read_errors,
    }
}

/// One GPU process of a snapshot.
pub fn process_view(p: GpuProcess) -> GpuProcessView {
    GpuProcessView {
        pid: p.pid,
        used_memory_bytes: p.used_memory_bytes,
        kind: p.kind,
        unit: (!p.unit.is_empty()).then_some(p.unit),
        foreign: p.foreign,
        unit_dead: p.unit_dead,
        command_line: p.command_line,
        user: p.user,
    }
}

pub fn event_view(e: GpuEvent, received_unix_ms: u64) -> GpuEventView {
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
