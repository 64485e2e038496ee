//! GPU state: what each GPU is doing and who is on it.
//!
//! The seeds lost days to things a GPU report shows at once: a second copy of
//! a model holding 39.8 GB, a training job sharing the accelerator, a failed
//! GPU (INCIDENTS.md, "Also from the same reports"). So the agent reads every
//! GPU and every process on it, and says which supervised unit owns each
//! process, or that nobody does.
//!
//! The edge is the [`GpuSource`] trait, with three sources chosen by the
//! agent's `gpu_source` (DESIGN.md: the fake is for what this machine lacks):
//! - `nvml` ([`nvml::NvmlSource`]): the NVIDIA driver, through `nvml-wrapper`;
//! - `fake:PATH` ([`fake::FakeSource`]): a JSON file in the shape of
//!   [`GpuReading`], re-read when it changes, with an `events` list;
//! - `none`: GPU reporting off.
//!
//! NVML's library is the system's `libnvidia-ml.so` unless the agent's
//! `nvml_library` names a file; the spec carries it, so the reporter and
//! `--gpu-report` open the same library.
//!
//! `auto` tries NVML and falls back to none, saying once why. Every source
//! returns the same [`GpuReading`]s, so mapping processes to units
//! ([`mapping`]), foreign processes and events are one code path, tested here
//! with the fake source. [`reporter`] turns readings into `HostSnapshot`s.

pub mod fake;
pub mod mapping;
pub mod nvml;
pub(crate) mod reporter;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Why a GPU source gave no reading. The message is what the operator sees
/// in `pdwarden status` ("libnvidia-ml.so not found", "no devices").
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GpuError {
    /// The source cannot work on this host (no library, no driver, no device).
    #[error("{reason}")]
    Unavailable { reason: String },
    /// The source works but this reading failed.
    #[error("{reason}")]
    ReadFailed { reason: String },
}

/// Which GPU source the config asks for (`gpu_source`), with the NVML
/// library to load (`nvml_library`) where NVML is tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSourceSpec {
    /// NVML if it loads, else none (saying why).
    Auto {
        /// The `libnvidia-ml.so` to load; `None`: the system's search.
        nvml_library: Option<PathBuf>,
    },
    /// NVML, or a source that says why it cannot be used.
    Nvml {
        /// The `libnvidia-ml.so` to load; `None`: the system's search.
        nvml_library: Option<PathBuf>,
    },
    None,
    Fake(PathBuf),
}

impl Default for GpuSourceSpec {
    fn default() -> Self {
        Self::Auto { nvml_library: None }
    }
}

impl GpuSourceSpec {
    /// Parses `auto`, `nvml`, `none` or `fake:PATH` (PATH absolute or
    /// relative, not empty); NVML from the system's search.
    pub fn parse(value: &str) -> Result<Self, BadGpuSource> {
        match value {
            "auto" => Ok(Self::Auto { nvml_library: None }),
            "nvml" => Ok(Self::Nvml { nvml_library: None }),
            "none" => Ok(Self::None),
            other => match other.strip_prefix("fake:") {
                Some("") => Err(BadGpuSource::FakeWithoutPath),
                Some(path) => Ok(Self::Fake(path.into())),
                None => Err(BadGpuSource::Unknown(other.to_owned())),
            },
        }
    }

    /// The same source, loading NVML from `library` (`None`: the system's
    /// search). A source that never tries NVML is left as it is.
    pub fn with_nvml_library(self, library: Option<PathBuf>) -> Self {
        match self {
            Self::Auto { .. } => Self::Auto { nvml_library: library },
            Self::Nvml { .. } => Self::Nvml { nvml_library: library },
            other => other,
        }
    }
}

/// A `gpu_source` that is none of the known ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadGpuSource {
    #[error("\"fake:\" needs a path: \"fake:/path/to/gpus.json\"")]
    FakeWithoutPath,
    #[error("{0:?} is not a GPU source: use \"auto\", \"nvml\", \"none\" or \"fake:PATH\"")]
    Unknown(String),
}

/// One GPU as a source reads it (also the fake file's per-GPU object).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuReading {
    pub index: u32,
    #[serde(default)]
    pub uuid: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub memory_used_bytes: u64,
    #[serde(default)]
    pub memory_total_bytes: u64,
    #[serde(default)]
    pub utilization_gpu_pct: Option<u32>,
    #[serde(default)]
    pub utilization_memory_pct: Option<u32>,
    #[serde(default)]
    pub temperature_c: Option<u32>,
    #[serde(default)]
    pub power_draw_mw: Option<u32>,
    #[serde(default)]
    pub power_limit_mw: Option<u32>,
    #[serde(default)]
    pub throttle_reasons: Vec<String>,
    #[serde(default)]
    pub ecc: Option<EccCounts>,
    #[serde(default)]
    pub retired_pages: Option<u32>,
    /// Row remapping (A100 and later, instead of page retirement).
    #[serde(default)]
    pub remapped_rows: Option<RemappedRows>,
    #[serde(default)]
    pub processes: Vec<GpuProcessReading>,
    /// Figures that could not be read ("field: reason").
    #[serde(default)]
    pub read_errors: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EccCounts {
    #[serde(default)]
    pub volatile_corrected: u64,
    #[serde(default)]
    pub volatile_uncorrected: u64,
    #[serde(default)]
    pub aggregate_corrected: u64,
    #[serde(default)]
    pub aggregate_uncorrected: u64,
}

/// A GPU's memory row remapping state, as NVML reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemappedRows {
    #[serde(default)]
    pub correctable: u32,
    #[serde(default)]
    pub uncorrectable: u32,
    /// A remapping waits for a GPU reset.
    #[serde(default)]
    pub pending: bool,
    /// A remapping failed.
    #[serde(default)]
    pub failure: bool,
}

/// Whether a process uses the GPU for compute or graphics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcessKind {
    #[default]
    Compute,
    Graphics,
}

impl ProcessKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessKind::Compute => "compute",
            ProcessKind::Graphics => "graphics",
        }
    }
}

/// A process on a GPU, as the driver lists it: only a pid and its memory.
/// Who it belongs to is worked out by [`mapping`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuProcessReading {
    pub pid: u32,
    #[serde(default)]
    pub used_memory_bytes: Option<u64>,
    #[serde(default)]
    pub kind: ProcessKind,
}

/// What kind of critical event a GPU raised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuEventKind {
    Xid,
    EccSingleBit,
    EccDoubleBit,
    Other,
}

impl GpuEventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            GpuEventKind::Xid => "xid",
            GpuEventKind::EccSingleBit => "ecc_single_bit",
            GpuEventKind::EccDoubleBit => "ecc_double_bit",
            GpuEventKind::Other => "other",
        }
    }
}

/// A critical GPU event (also the fake file's `events` entries).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuEventReading {
    pub gpu_index: u32,
    #[serde(default)]
    pub gpu_uuid: String,
    pub kind: GpuEventKind,
    /// The Xid number (kind `xid`).
    #[serde(default)]
    pub xid: u64,
    #[serde(default)]
    pub detail: String,
}

/// Where GPU readings come from. Calls block (NVML, file reads): the
/// reporter runs them on a blocking thread.
pub trait GpuSource: Send {
    /// `"nvml"`, `"fake"` or `"none"`, as reported in `HostSnapshot.gpu_source`.
    fn kind(&self) -> &'static str;
    /// Reads every GPU now. No GPU at all is an error ("no devices").
    fn sample(&mut self) -> Result<Vec<GpuReading>, GpuError>;
    /// Events raised since the previous call, oldest first.
    fn take_events(&mut self) -> Vec<GpuEventReading>;
}

/// A source that never reads anything, for `none` and for an `nvml` or
/// `auto` source whose driver is missing: every sample says why.
#[derive(Debug)]
pub struct UnavailableSource {
    kind: &'static str,
    reason: String,
}

impl UnavailableSource {
    pub fn new(kind: &'static str, reason: impl Into<String>) -> Self {
        Self {
            kind,
            reason: reason.into(),
        }
    }
}

impl GpuSource for UnavailableSource {
    fn kind(&self) -> &'static str {
        self.kind
    }
    fn sample(&mut self) -> Result<Vec<GpuReading>, GpuError> {
        Err(GpuError::Unavailable {
            reason: self.reason.clone(),
        })
    }
    fn take_events(&mut self) -> Vec<GpuEventReading> {
        Vec::new()
    }
}

/// Opens the source the config names. Never fails: a source that cannot work
/// here becomes an [`UnavailableSource`] that says why in every snapshot, so
/// the agent runs normally without a driver.
pub fn open(spec: &GpuSourceSpec) -> Box<dyn GpuSource> {
    match spec {
        GpuSourceSpec::None => Box::new(UnavailableSource::new(
            "none",
            "GPU reporting is off (gpu_source = \"none\")",
        )),
        GpuSourceSpec::Nvml { nvml_library } => match nvml::NvmlSource::open(nvml_library.as_deref()) {
            Ok(s) => Box::new(s),
            Err(e) => Box::new(UnavailableSource::new("nvml", e.to_string())),
        },
        GpuSourceSpec::Auto { nvml_library } => match nvml::NvmlSource::open(nvml_library.as_deref()) {
            Ok(s) => Box::new(s),
            Err(e) => Box::new(UnavailableSource::new(
                "none",
                format!("GPU reporting is off: NVML is not available ({e})"),
            )),
        },
        GpuSourceSpec::Fake(path) => Box::new(fake::FakeSource::new(path.clone())),
    }
}

/// One reading of `spec`'s GPUs in the fake GPU file's format
/// (`{"gpus": [...]}`), so a real GPU's reading can be committed as a fixture
/// and replayed through the fake source (`pdwarden-agent --gpu-report nvml`).
pub fn report_json(spec: &GpuSourceSpec) -> Result<String, GpuError> {
    let gpus = open(spec).sample()?;
    let json = serde_json::json!({ "gpus": gpus });
    Ok(serde_json::to_string_pretty(&json).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Property: a report is a valid fake GPU file: replaying it gives back the same readings.
    #[test]
    fn report_replays_through_the_fake_source() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpus.json");
        std::fs::write(
            &path,
            r#"{"gpus":[{"index":0,"uuid":"GPU-a","name":"H","memory_used_bytes":5,"utilization_gpu_pct":7,
                "ecc":{"volatile_uncorrected":1},"processes":[{"pid":42,"used_memory_bytes":5,"kind":"graphics"}]}]}"#,
        )
        .unwrap();
        let spec = GpuSourceSpec::Fake(path.clone());
        let first = open(&spec).sample().unwrap();
        let report = report_json(&spec).unwrap();
        std::fs::write(&path, report).unwrap();
        assert_eq!(open(&spec).sample().unwrap(), first);
    }

    // Property: every documented source parses; anything else is an error that says what is allowed.
    #[test]
    fn source_spec_parses() {
        assert_eq!(GpuSourceSpec::parse("auto"), Ok(GpuSourceSpec::default()));
        assert_eq!(
            GpuSourceSpec::parse("nvml"),
            Ok(GpuSourceSpec::Nvml { nvml_library: None })
        );
        assert_eq!(GpuSourceSpec::parse("none"), Ok(GpuSourceSpec::None));
        assert_eq!(
            GpuSourceSpec::parse("fake:/tmp/g.json"),
            Ok(GpuSourceSpec::Fake("/tmp/g.json".into()))
        );
        assert!(GpuSourceSpec::parse("fake:").unwrap_err().to_string().contains("path"));
        assert!(
            GpuSourceSpec::parse("NVML")
                .unwrap_err()
                .to_string()
                .contains("fake:PATH")
        );
    }

    // Property: `nvml_library` reaches the sources that try NVML and no
    // other; a library that cannot be loaded is the reason every sample
    // gives (`nvml`) or the reason GPU reporting is off (`auto`), naming the
    // file, on any host, driver or not.
    #[test]
    fn a_missing_nvml_library_is_the_reason_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("libnvidia-ml.so.1");
        let with = |spec: &str| {
            GpuSourceSpec::parse(spec)
                .unwrap()
                .with_nvml_library(Some(missing.clone()))
        };
        assert_eq!(with("fake:/g.json"), GpuSourceSpec::Fake("/g.json".into()));
        assert_eq!(with("none"), GpuSourceSpec::None);
        let named = format!("cannot load the NVML library {}", missing.display());

        let mut nvml = open(&with("nvml"));
        assert_eq!(nvml.kind(), "nvml");
        let e = nvml.sample().unwrap_err();
        assert!(matches!(e, GpuError::Unavailable { .. }), "{e:?}");
        assert!(e.to_string().starts_with(&named), "{e}");

        let mut auto = open(&with("auto"));
        assert_eq!(auto.kind(), "none");
        let e = auto.sample().unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("GPU reporting is off: NVML is not available ({named}")),
            "{e}"
        );
    }

    /// A shared library that loads but is not NVML: the C library this test
    /// process runs on (from /proc/self/maps).
    fn a_library_that_is_not_nvml() -> PathBuf {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| {
                std::path::Path::new(p)
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))
            })
            .map(PathBuf::from)
            .expect("the C library in /proc/self/maps")
    }

    // Property: the configured library is the one NVML is loaded from, on
    // any host, driver or not: a library that loads but is not NVML fails on
    // its first NVML symbol, which the system's search never would.
    #[test]
    fn the_configured_library_is_the_one_loaded() {
        let libc = a_library_that_is_not_nvml();
        let named = format!("the NVML library {} is too old or broken: missing", libc.display());
        for (spec, kind) in [("nvml", "nvml"), ("auto", "none")] {
            let spec = GpuSourceSpec::parse(spec)
                .unwrap()
                .with_nvml_library(Some(libc.clone()));
            let mut source = open(&spec);
            assert_eq!(source.kind(), kind);
            let e = source.sample().unwrap_err().to_string();
            assert!(e.contains(&named) && e.contains("nvmlInit_v2"), "{e}");
        }
    }

    // Property: `none` never reads and says it is off by config.
    #[test]
    fn none_source_says_why() {
        let mut s = open(&GpuSourceSpec::None);
        assert_eq!(s.kind(), "none");
        let e = s.sample().unwrap_err();
        assert!(e.to_string().contains("gpu_source = \"none\""), "{e}");
        assert!(s.take_events().is_empty());
    }
}
