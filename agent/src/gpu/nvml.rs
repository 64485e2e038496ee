//! The real GPU source: the NVIDIA driver through `nvml-wrapper`.
//!
//! `nvml-wrapper` loads `libnvidia-ml.so` at run time (no link-time
//! dependency), so the agent builds and runs on hosts without a driver:
//! [`NvmlSource::open`] then fails with a reason an operator understands, and
//! `gpu::open` turns that into a source that reports it.
//!
//! The library is found by the system's search (`ld.so`) unless the agent's
//! `nvml_library` names a file: a driver installed outside the search path
//! then still works, and a test points it at a file that does not exist to
//! take the no-driver path on any host, driver or not.
//!
//! Figures a GPU does not support (ECC on consumer cards, retired pages on
//! newer ones) are left out silently; any other failure to read one figure is
//! kept in the reading's `read_errors` and the rest of the reading stands.
//!
//! Critical events (Xid, single- and double-bit ECC) come from an NVML event
//! set that a dedicated thread waits on (with its own NVML handle, so no
//! borrow crosses threads); they reach the reporter at its next sample.
//! Remapped rows (A100 and newer, which retire no pages) have no safe
//! wrapper in `nvml-wrapper` 0.13; they are read as NVML field values
//! (`NVML_FI_DEV_REMAPPED_*`), which carry the same four figures.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, RetirementCause, TemperatureSensor};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_REMAPPED_COR, NVML_FI_DEV_REMAPPED_FAILURE, NVML_FI_DEV_REMAPPED_PENDING, NVML_FI_DEV_REMAPPED_UNC,
};
use tracing::warn;

use super::{
    EccCounts, GpuError, GpuEventKind, GpuEventReading, GpuProcessReading, GpuReading, GpuSource, ProcessKind,
    RemappedRows,
};

/// How long the event thread blocks in one wait; bounds how long it outlives
/// the source.
const EVENT_WAIT_MS: u32 = 1000;

/// The NVML-backed [`GpuSource`].
pub struct NvmlSource {
    nvml: Nvml,
    events: mpsc::Receiver<GpuEventReading>,
    stop: Arc<AtomicBool>,
}

/// Says why NVML cannot be used, in words for an operator.
pub fn explain(e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(inner) => format!("libnvidia-ml.so not found ({inner})"),
        NvmlError::FailedToLoadSymbol(s) => format!("libnvidia-ml.so is too old or broken: missing {s}"),
        NvmlError::DriverNotLoaded => "the NVIDIA driver is not loaded".to_owned(),
        NvmlError::NoPermission => "no permission to talk to the NVIDIA driver".to_owned(),
        NvmlError::LibraryNotFound => "libnvidia-ml.so not found".to_owned(),
        other => format!("NVML: {other}"),
    }
}

/// Says why NVML could not be opened from `library` (the system's
/// `libnvidia-ml.so` when `None`): a failure to load names the file asked for.
fn explain_open(e: &NvmlError, library: Option<&Path>) -> String {
    let Some(path) = library else {
        return explain(e);
    };
    let path = path.display();
    match e {
        NvmlError::LibloadingError(inner) => format!("cannot load the NVML library {path} ({inner})"),
        NvmlError::LibraryNotFound => format!("cannot load the NVML library {path}"),
        NvmlError::FailedToLoadSymbol(s) => format!("the NVML library {path} is too old or broken: missing {s}"),
        other => explain(other),
    }
}

/// Loads NVML from `library`, or from the system's search when `None`.
fn init(library: Option<&Path>) -> Result<Nvml, NvmlError> {
    match library {
        Some(path) => Nvml::builder().lib_path(path.as_os_str()).init(),
        None => Nvml::init(),
    }
}

impl NvmlSource {
    /// Loads NVML (from `library`, else the system's `libnvidia-ml.so`) and
    /// checks there is at least one GPU.
    pub fn open(library: Option<&Path>) -> Result<Self, GpuError> {
        let unavailable = |e: NvmlError| GpuError::Unavailable {
            reason: explain_open(&e, library),
        };
        let nvml = init(library).map_err(unavailable)?;
        let count = nvml.device_count().map_err(unavailable)?;
        if count == 0 {
            return Err(GpuError::Unavailable {
                reason: "no devices".to_owned(),
            });
        }
        let (tx, events) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let thread_library = library.map(Path::to_path_buf);
        let spawned = std::thread::Builder::new()
            .name("pdwarden-nvml-events".into())
            .spawn(move || watch_events(thread_library, tx, thread_stop));
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start the NVML event thread; Xid and ECC events will not be reported");
        }
        Ok(Self { nvml, events, stop })
    }
}

impl Drop for NvmlSource {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl GpuSource for NvmlSource {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    fn sample(&mut self) -> Result<Vec<GpuReading>, GpuError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| GpuError::ReadFailed { reason: explain(&e) })?;
        if count == 0 {
            return Err(GpuError::Unavailable {
                reason: "no devices".to_owned(),
            });
        }
        let mut gpus = Vec::with_capacity(count as usize);
        for index in 0..count {
            let mut r = GpuReading {
                index,
                ..GpuReading::default()
            };
            let device = match self.nvml.device_by_index(index) {
                Ok(d) => d,
                Err(e) => {
                    r.read_errors.push(format!("device: {}", explain(&e)));
                    gpus.push(r);
                    continue;
                }
            };
            let mut errors = Vec::new();
            // A macro, not a closure: the figures have different types.
            macro_rules! get {
                ($field:expr, $res:expr $(,)?) => {
                    keep($field, $res, &mut errors)
                };
            }
            r.uuid = get!("uuid", device.uuid()).unwrap_or_default();
            r.name = get!("name", device.name()).unwrap_or_default();
            if let Some(m) = get!("memory", device.memory_info()) {
                r.memory_used_bytes = m.used;
                r.memory_total_bytes = m.total;
            }
            if let Some(u) = get!("utilization", device.utilization_rates()) {
                r.utilization_gpu_pct = Some(u.gpu);
                r.utilization_memory_pct = Some(u.memory);
            }
            r.temperature_c = get!("temperature", device.temperature(TemperatureSensor::Gpu));
            r.power_draw_mw = get!("power_draw", device.power_usage());
            r.power_limit_mw = get!("power_limit", device.enforced_power_limit());
            if let Some(t) = get!("throttle_reasons", device.current_throttle_reasons()) {
                r.throttle_reasons = throttle_names(t);
            }
            let ecc_on = get!("ecc_mode", device.is_ecc_enabled()).is_some_and(|m| m.currently_enabled);
            if ecc_on {
                let mut count = |t, c| keep("ecc", device.total_ecc_errors(t, c), &mut errors).unwrap_or(0);
                r.ecc = Some(EccCounts {
                    volatile_corrected: count(MemoryError::Corrected, EccCounter::Volatile),
                    volatile_uncorrected: count(MemoryError::Uncorrected, EccCounter::Volatile),
                    aggregate_corrected: count(MemoryError::Corrected, EccCounter::Aggregate),
                    aggregate_uncorrected: count(MemoryError::Uncorrected, EccCounter::Aggregate),
                });
            }
            let single = get!(
                "retired_pages",
                device.retired_pages(RetirementCause::MultipleSingleBitEccErrors),
            );
            let double = get!(
                "retired_pages",
                device.retired_pages(RetirementCause::DoubleBitEccError)
            );
            if single.is_some() || double.is_some() {
                let n = single.map_or(0, |v| v.len()) + double.map_or(0, |v| v.len());
                r.retired_pages = Some(u32::try_from(n).unwrap_or(u32::MAX));
            }
            r.remapped_rows = get!(
                "remapped_rows",
                device
                    .field_values_for(&REMAPPED_ROWS_FIELDS.map(FieldId))
                    .and_then(remapped_rows),
            );
            for (kind, res) in [
                (ProcessKind::Compute, device.running_compute_processes()),
                (ProcessKind::Graphics, device.running_graphics_processes()),
            ] {
                let field = match kind {
                    ProcessKind::Compute => "compute_processes",
                    ProcessKind::Graphics => "graphics_processes",
                };
                for p in get!(field, res).unwrap_or_default() {
                    r.processes.push(process(kind, &p));
                }
            }
            r.read_errors = errors;
            gpus.push(r);
        }
        Ok(gpus)
    }

    fn take_events(&mut self) -> Vec<GpuEventReading> {
        self.events.try_iter().collect()
    }
}

/// Correctable, uncorrectable, pending, failure: the order [`remapped_rows`] reads.
const REMAPPED_ROWS_FIELDS: [u32; 4] = [
    NVML_FI_DEV_REMAPPED_COR,
    NVML_FI_DEV_REMAPPED_UNC,
    NVML_FI_DEV_REMAPPED_PENDING,
    NVML_FI_DEV_REMAPPED_FAILURE,
];

/// The four remapped-row field values as one figure; the first field that
/// fails (NotSupported on GPUs before the A100) fails it.
fn remapped_rows(
    samples: Vec<Result<nvml_wrapper::struct_wrappers::device::FieldValueSample, NvmlError>>,
) -> Result<RemappedRows, NvmlError> {
    // One sample per field asked for, in order (nvmlDeviceGetFieldValues fills the array it is given).
    let mut v = [0u64; 4];
    for (slot, sample) in v.iter_mut().zip(samples) {
        *slot = match sample?.value? {
            SampleValue::U32(x) => u64::from(x),
            SampleValue::U64(x) => x,
            SampleValue::I64(x) => u64::try_from(x).unwrap_or(0),
            SampleValue::F64(x) => x.max(0.0) as u64,
        };
    }
    let count = |x: u64| u32::try_from(x).unwrap_or(u32::MAX);
    Ok(RemappedRows {
        correctable: count(v[0]),
        uncorrectable: count(v[1]),
        pending: v[2] != 0,
        failure: v[3] != 0,
    })
}

/// Keeps a figure, dropping "not supported" silently and recording any other failure.
fn keep<T>(field: &str, res: Result<T, NvmlError>, errors: &mut Vec<String>) -> Option<T> {
    match res {
        Ok(v) => Some(v),
        Err(NvmlError::NotSupported) => None,
        Err(e) => {
            let line = format!("{field}: {}", explain(&e));
            if !errors.contains(&line) {
                errors.push(line);
            }
            None
        }
    }
}

fn process(kind: ProcessKind, p: &ProcessInfo) -> GpuProcessReading {
    GpuProcessReading {
        pid: p.pid,
        used_memory_bytes: match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => Some(b),
            UsedGpuMemory::Unavailable => None,
        },
        kind,
    }
}

/// Active throttle reasons as stable snake_case names (idle is not a problem
/// and is left out).
fn throttle_names(t: ThrottleReasons) -> Vec<String> {
    [
        (
            ThrottleReasons::APPLICATIONS_CLOCKS_SETTING,
            "applications_clocks_setting",
        ),
        (ThrottleReasons::SW_POWER_CAP, "sw_power_cap"),
        (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
        (ThrottleReasons::SYNC_BOOST, "sync_boost"),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
        (ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN, "hw_power_brake_slowdown"),
        (ThrottleReasons::DISPLAY_CLOCK_SETTING, "display_clock_setting"),
    ]
    .into_iter()
    .filter(|(flag, _)| t.contains(*flag))
    .map(|(_, name)| name.to_owned())
    .collect()
}

/// The event thread: registers every GPU for critical events and forwards
/// them until `stop` is set or the receiver is gone. It opens NVML from the
/// same `library` as the source.
fn watch_events(library: Option<PathBuf>, tx: mpsc::Sender<GpuEventReading>, stop: Arc<AtomicBool>) {
    let nvml = match init(library.as_deref()) {
        Ok(n) => n,
        Err(e) => {
            warn!(error = %explain(&e), "NVML event thread cannot start; Xid and ECC events will not be reported");
            return;
        }
    };
    let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::SINGLE_BIT_ECC_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
    let mut set = match nvml.create_event_set() {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %explain(&e), "cannot create an NVML event set; Xid and ECC events will not be reported");
            return;
        }
    };
    let mut uuids = Vec::new();
    for index in 0..nvml.device_count().unwrap_or(0) {
        let Ok(device) = nvml.device_by_index(index) else {
            continue;
        };
        uuids.push(device.uuid().unwrap_or_default());
        let types = device.supported_event_types().map_or(wanted, |s| s & wanted);
        if types.is_empty() {
            continue;
        }
        set = match device.register_events(types, set) {
            Ok(s) => s,
            Err(e) => {
                warn!(gpu = index, error = %e, "cannot register for GPU events; Xid and ECC events will not be reported");
                return;
            }
        };
    }
    while !stop.load(Ordering::Relaxed) {
        match set.wait(EVENT_WAIT_MS) {
            Ok(ev) => {
                let uuid = ev.device.uuid().unwrap_or_default();
                let gpu_index = ev
                    .device
                    .index()
                    .ok()
                    .or_else(|| uuids.iter().position(|u| *u == uuid).map(|i| i as u32))
                    .unwrap_or(0);
                let (kind, xid) = if ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                    let xid = match ev.event_data {
                        Some(XidError::Value(v)) => v,
                        _ => 0,
                    };
                    (GpuEventKind::Xid, xid)
                } else if ev.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
                    (GpuEventKind::EccDoubleBit, 0)
                } else if ev.event_type.contains(EventTypes::SINGLE_BIT_ECC_ERROR) {
                    (GpuEventKind::EccSingleBit, 0)
                } else {
                    (GpuEventKind::Other, 0)
                };
                let reading = GpuEventReading {
                    gpu_index,
                    gpu_uuid: uuid,
                    kind,
                    xid,
                    detail: format!("NVML event {:?}", ev.event_type),
                };
                if tx.send(reading).is_err() {
                    return;
                }
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                warn!(error = %explain(&e), "waiting for GPU events failed; retrying in 1 s");
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Property: where the NVML library cannot be loaded (here a configured
    // file that does not exist, so the path runs on any host, driver or
    // not), opening NVML fails with a reason that names that file, never a
    // panic.
    #[test]
    fn no_driver_is_explained() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("libnvidia-ml.so.1");
        let Err(e) = NvmlSource::open(Some(&missing)) else {
            panic!("NVML opened from a file that does not exist");
        };
        assert!(matches!(e, GpuError::Unavailable { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!("cannot load the NVML library {}", missing.display())),
            "{msg}"
        );
    }

    // Property: with no library configured the reasons stay the system
    // search's ("libnvidia-ml.so not found"), and a configured one names its file.
    #[test]
    fn open_failures_name_the_library_asked_for() {
        let e = NvmlError::LibraryNotFound;
        assert_eq!(explain_open(&e, None), "libnvidia-ml.so not found");
        assert_eq!(
            explain_open(&e, Some(Path::new("/opt/nv/libnvidia-ml.so.1"))),
            "cannot load the NVML library /opt/nv/libnvidia-ml.so.1"
        );
        let e = NvmlError::FailedToLoadSymbol("nvmlInit_v2".into());
        assert_eq!(
            explain_open(&e, Some(Path::new("/opt/nv/libnvidia-ml.so.1"))),
            "the NVML library /opt/nv/libnvidia-ml.so.1 is too old or broken: missing nvmlInit_v2"
        );
        assert_eq!(
            explain_open(&NvmlError::DriverNotLoaded, Some(Path::new("/x"))),
            "the NVIDIA driver is not loaded"
        );
    }

    // Property: on a host with an NVIDIA driver, NVML opens by the system's
    // search and reads every GPU it counts.
    #[test]
    #[ignore = "needs an NVIDIA GPU and driver"]
    fn a_real_gpu_is_read() {
        let mut source = NvmlSource::open(None).unwrap();
        let gpus = source.sample().unwrap();
        assert!(!gpus.is_empty());
        assert!(gpus.iter().all(|g| !g.uuid.is_empty()), "{gpus:?}");
    }

    // Property: idle is not reported as a throttle; real slowdowns are, by stable names.
    #[test]
    fn throttle_reasons_have_stable_names() {
        let t = ThrottleReasons::GPU_IDLE | ThrottleReasons::HW_SLOWDOWN | ThrottleReasons::SW_THERMAL_SLOWDOWN;
        assert_eq!(throttle_names(t), vec!["hw_slowdown", "sw_thermal_slowdown"]);
    }

    // Property: the four remapped-row field values become one figure, in
    // the order asked for; a field the GPU does not support fails the figure
    // (kept silent by `keep`), so a pre-A100 GPU reports none rather than zeros.
    #[test]
    fn remapped_rows_from_field_values() {
        use nvml_wrapper::struct_wrappers::device::FieldValueSample;
        let sample = |field: u32, value: Result<SampleValue, NvmlError>| {
            Ok(FieldValueSample {
                field: FieldId(field),
                timestamp: 0,
                latency: 0,
                value,
            })
        };
        let rows = remapped_rows(vec![
            sample(NVML_FI_DEV_REMAPPED_COR, Ok(SampleValue::U32(3))),
            sample(NVML_FI_DEV_REMAPPED_UNC, Ok(SampleValue::U64(1))),
            sample(NVML_FI_DEV_REMAPPED_PENDING, Ok(SampleValue::U32(1))),
            sample(NVML_FI_DEV_REMAPPED_FAILURE, Ok(SampleValue::U32(0))),
        ])
        .unwrap();
        assert_eq!(
            rows,
            RemappedRows {
                correctable: 3,
                uncorrectable: 1,
                pending: true,
                failure: false
            }
        );
        let unsupported = remapped_rows(vec![
            sample(NVML_FI_DEV_REMAPPED_COR, Err(NvmlError::NotSupported)),
            sample(NVML_FI_DEV_REMAPPED_UNC, Ok(SampleValue::U32(0))),
            sample(NVML_FI_DEV_REMAPPED_PENDING, Ok(SampleValue::U32(0))),
            sample(NVML_FI_DEV_REMAPPED_FAILURE, Ok(SampleValue::U32(0))),
        ]);
        assert!(matches!(unsupported, Err(NvmlError::NotSupported)), "{unsupported:?}");
        let mut errors = Vec::new();
        assert_eq!(keep("remapped_rows", unsupported, &mut errors), None);
        assert!(errors.is_empty());
    }
}
