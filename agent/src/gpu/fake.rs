//! The fake GPU source: a JSON file describing GPUs, their processes and
//! events, re-read whenever it changes.
//!
//! It exists because this machine (and CI) has no GPU: it feeds exactly the
//! readings NVML would, so the mapping of processes to units, foreign
//! processes and events are tested through the same code. The file is
//! `{"gpus": [GpuReading…], "events": [GpuEventReading…]}`; `events` is
//! append-only from the source's point of view: each entry is reported once,
//! and a file whose list got shorter starts counting again from its end.
//! Writers should replace the file atomically (write, then rename).

use std::path::PathBuf;
use std::time::SystemTime;

use serde::Deserialize;

use super::{GpuError, GpuEventReading, GpuReading, GpuSource};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FakeFile {
    #[serde(default)]
    gpus: Vec<GpuReading>,
    #[serde(default)]
    events: Vec<GpuEventReading>,
}

/// What identifies one version of the file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Version {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

/// The `fake:PATH` [`GpuSource`].
#[derive(Debug)]
pub struct FakeSource {
    path: PathBuf,
    version: Option<Version>,
    /// The last good parse, or why the last read failed.
    current: Result<Vec<GpuReading>, GpuError>,
    /// How many of the file's events have been reported.
    events_seen: usize,
    pending: Vec<GpuEventReading>,
}

impl FakeSource {
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            version: None,
            current: Err(GpuError::Unavailable {
                reason: "not read yet".into(),
            }),
            events_seen: 0,
            pending: Vec::new(),
        }
    }

    fn fail(&self, what: impl std::fmt::Display) -> GpuError {
        GpuError::ReadFailed {
            reason: format!("fake GPU file {}: {what}", self.path.display()),
        }
    }

    /// Re-reads the file if its metadata changed.
    fn refresh(&mut self) {
        use std::os::unix::fs::MetadataExt as _;
        let meta = match std::fs::metadata(&self.path) {
            Ok(m) => m,
            Err(e) => {
                self.version = None;
                self.current = Err(self.fail(e));
                return;
            }
        };
        let version = Version {
            modified: meta.modified().ok(),
            len: meta.len(),
            inode: meta.ino(),
        };
        if self.version == Some(version) {
            return;
        }
        self.version = Some(version);
        let parsed = std::fs::read_to_string(&self.path)
            .map_err(|e| self.fail(e))
            .and_then(|text| serde_json::from_str::<FakeFile>(&text).map_err(|e| self.fail(e)));
        match parsed {
            Ok(file) => {
                if file.events.len() < self.events_seen {
                    self.events_seen = file.events.len();
                }
                self.pending.extend(file.events[self.events_seen..].iter().cloned());
                self.events_seen = file.events.len();
                self.current = if file.gpus.is_empty() {
                    Err(GpuError::Unavailable {
                        reason: "no devices".into(),
                    })
                } else {
                    Ok(file.gpus)
                };
            }
            Err(e) => self.current = Err(e),
        }
    }
}

impl GpuSource for FakeSource {
    fn kind(&self) -> &'static str {
        "fake"
    }

    fn sample(&mut self) -> Result<Vec<GpuReading>, GpuError> {
        self.refresh();
        self.current.clone()
    }

    fn take_events(&mut self) -> Vec<GpuEventReading> {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::super::GpuEventKind;
    use super::*;

    fn write(path: &std::path::Path, json: &str) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, json).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    // Property: the file is re-read when it changes, and each event is reported exactly once.
    #[test]
    fn rereads_on_change_and_reports_each_event_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpus.json");
        let mut s = FakeSource::new(path.clone());
        let e = s.sample().unwrap_err().to_string();
        assert!(e.contains("gpus.json"), "{e}");

        write(
            &path,
            r#"{"gpus":[{"index":0,"uuid":"GPU-a","memory_used_bytes":5,"processes":[{"pid":42,"used_memory_bytes":5}]}]}"#,
        );
        let g = s.sample().unwrap();
        assert_eq!(g[0].processes[0].pid, 42);
        assert!(s.take_events().is_empty());

        write(
            &path,
            r#"{"gpus":[{"index":0,"uuid":"GPU-a"}],"events":[{"gpu_index":0,"kind":"xid","xid":79,"detail":"fell off the bus"}]}"#,
        );
        assert!(s.sample().unwrap()[0].processes.is_empty());
        let ev = s.take_events();
        assert_eq!(ev.len(), 1);
        assert_eq!((ev[0].kind, ev[0].xid), (GpuEventKind::Xid, 79));
        s.sample().unwrap();
        assert!(s.take_events().is_empty(), "an event is reported once");
    }

    // Property: a broken file is an error naming the file; no GPUs reads as "no devices".
    #[test]
    fn bad_and_empty_files_say_why() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpus.json");
        write(&path, r#"{"gpus":[{"index":0,"colour":"red"}]}"#);
        let mut s = FakeSource::new(path.clone());
        let e = s.sample().unwrap_err().to_string();
        assert!(e.contains("gpus.json") && e.contains("colour"), "{e}");
        write(&path, r#"{"gpus":[]}"#);
        assert_eq!(s.sample().unwrap_err().to_string(), "no devices");
    }
}
