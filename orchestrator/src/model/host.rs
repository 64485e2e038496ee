//! Each host's GPU and host state as `status --json` carries it (under
//! `agents[].host_report`): the records the edge fills from an agent's
//! snapshot, the findings judge reads and the CLI renders. Data only, on
//! the ground floor: it imports no other module of the crate.

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
