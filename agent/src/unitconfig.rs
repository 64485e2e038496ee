//! Versions of a unit's launch config, for the change gate (issue 7).
//!
//! A gate never edits a unit in place: every change is a new version (the
//! current argv and environment with the gate's edits), and the versions
//! before it stay, so a rollback restores exactly the previous one (DESIGN.md
//! 8). Version 0 is the unit as written in the agent's TOML. A process keeps
//! the version it was spawned from until it is restarted; the supervisor
//! records which one, so an inspection can say what a live process was
//! started with.
//!
//! The versions are kept in `state_dir/config/<unit>.json`, so a restarted
//! agent does not silently start a unit from its TOML again while the gate's
//! version is the current one. A file whose version 0 no longer matches the
//! TOML (the operator edited the unit since) is ignored, with a warning.
//! They hold the gate's environment values (an `HF_TOKEN`), so the
//! directory is 0700 and each file 0600 whatever the umask; looser ones an
//! earlier version left are tightened when loaded or saved (issue 32).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::config::UnitConfig;

#[derive(Debug, Error, PartialEq)]
pub enum VersionError {
    #[error("unit {unit} has no config version {version} (versions 0..={latest})")]
    UnknownVersion { unit: String, version: u32, latest: u32 },
    #[error("unit {unit}: {reason}")]
    BadEdit { unit: String, reason: EditError },
}

/// Why an [`Edit`] cannot be applied ([`LaunchSpec::edited`]).
#[derive(Debug, Error, PartialEq)]
pub enum EditError {
    #[error("invalid environment variable {0:?}")]
    InvalidEnv(String),
    #[error("{0} is both set and unset")]
    SetAndUnset(String),
    #[error("argument {0:?} is not a flag (must start with '-')")]
    NotAFlag(String),
}

/// What a process is launched with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchSpec {
    pub argv: Vec<String>,
    /// Added to the agent's own environment.
    pub env: BTreeMap<String, String>,
    /// Removed from the environment the process inherits.
    pub unset_env: BTreeSet<String>,
}

/// The edits of one change.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Edit {
    pub set_env: BTreeMap<String, String>,
    pub unset_env: Vec<String>,
    /// `--flag` → value: the value after an existing `--flag` (or in
    /// `--flag=value`) is replaced, else `--flag value` is appended.
    pub set_args: BTreeMap<String, String>,
}

impl LaunchSpec {
    /// A short stable fingerprint of what is launched (argv, environment
    /// edits): the orchestrator compares cold starts only between restarts
    /// that launched the same thing (an upgrade changes the allowance's
    /// history). One-way and truncated, so secrets in the environment do not
    /// leave the host.
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let text = serde_json::to_string(self).unwrap_or_default();
        Sha256::digest(text.as_bytes())
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    pub fn from_config(c: &UnitConfig) -> Self {
        LaunchSpec {
            argv: c.argv.clone(),
            env: c.env.clone(),
            unset_env: BTreeSet::new(),
        }
    }

    /// This spec with `edit` applied. Pure.
    pub fn edited(&self, edit: &Edit) -> Result<Self, EditError> {
        let mut next = self.clone();
        for (k, v) in &edit.set_env {
            if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                return Err(EditError::InvalidEnv(k.clone()));
            }
            next.unset_env.remove(k);
            next.env.insert(k.clone(), v.clone());
        }
        for k in &edit.unset_env {
            if edit.set_env.contains_key(k) {
                return Err(EditError::SetAndUnset(k.clone()));
            }
            next.env.remove(k);
            next.unset_env.insert(k.clone());
        }
        for (flag, value) in &edit.set_args {
            if !flag.starts_with('-') {
                return Err(EditError::NotAFlag(flag.clone()));
            }
            let joined = format!("{flag}=");
            if let Some(i) = next.argv.iter().skip(1).position(|a| a == flag).map(|i| i + 1) {
                if i + 1 < next.argv.len() && !next.argv[i + 1].starts_with("--") {
                    next.argv[i + 1] = value.clone();
                } else {
                    next.argv.insert(i + 1, value.clone());
                }
            } else if let Some(a) = next.argv.iter_mut().skip(1).find(|a| a.starts_with(&joined)) {
                *a = format!("{flag}={value}");
            } else {
                next.argv.push(flag.clone());
                next.argv.push(value.clone());
            }
        }
        Ok(next)
    }
}

/// One recorded version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Version {
    pub version: u32,
    pub spec: LaunchSpec,
    /// The command that made it ("" for version 0).
    pub command_id: String,
}

/// A unit's versions and which is current.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Versions {
    pub unit: String,
    pub versions: Vec<Version>,
    pub current: u32,
}

impl Versions {
    pub fn new(config: &UnitConfig) -> Self {
        Versions {
            unit: config.name.clone(),
            versions: vec![Version {
                version: 0,
                spec: LaunchSpec::from_config(config),
                command_id: String::new(),
            }],
            current: 0,
        }
    }

    pub fn current_spec(&self) -> &LaunchSpec {
        &self.get(self.current).expect("current version exists").spec
    }

    fn get(&self, v: u32) -> Option<&Version> {
        self.versions.iter().find(|x| x.version == v)
    }

    fn latest(&self) -> u32 {
        self.versions.iter().map(|v| v.version).max().unwrap_or(0)
    }

    /// Records a new version (current + edit) and makes it current; returns
    /// (previous, new).
    pub fn apply(&mut self, edit: &Edit, command_id: &str) -> Result<(u32, u32), VersionError> {
        let spec = self
            .current_spec()
            .edited(edit)
            .map_err(|reason| VersionError::BadEdit {
                unit: self.unit.clone(),
                reason,
            })?;
        let previous = self.current;
        let version = self.latest() + 1;
        self.versions.push(Version {
            version,
            spec,
            command_id: command_id.into(),
        });
        self.current = version;
        Ok((previous, version))
    }

    /// Makes an existing version current again; returns (previous, restored).
    pub fn restore(&mut self, version: u32) -> Result<(u32, u32), VersionError> {
        if self.get(version).is_none() {
            return Err(VersionError::UnknownVersion {
                unit: self.unit.clone(),
                version,
                latest: self.latest(),
            });
        }
        let previous = self.current;
        self.current = version;
        Ok((previous, version))
    }

    /// `state_dir/config/<unit>.json`.
    pub fn path(state_dir: &Path, unit: &str) -> PathBuf {
        state_dir.join("config").join(format!("{unit}.json"))
    }

    /// The saved versions if they still belong to this TOML, else fresh ones.
    pub fn load(state_dir: &Path, config: &UnitConfig) -> Self {
        let fresh = Versions::new(config);
        let path = Self::path(state_dir, &config.name);
        if path.exists()
            && let Err(e) = path
                .parent()
                .map_or(Ok(()), |d| tighten(d, 0o700))
                .and_then(|()| tighten(&path, 0o600))
        {
            tracing::warn!(unit = %config.name, error = %e, "cannot make {} private to the agent", path.display());
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            return fresh;
        };
        match serde_json::from_str::<Versions>(&text) {
            Ok(saved) if saved.versions.first() == fresh.versions.first() && saved.get(saved.current).is_some() => {
                if saved.current != 0 {
                    tracing::info!(unit = %config.name, version = saved.current, "unit config version restored from {}", path.display());
                }
                saved
            }
            Ok(_) => {
                tracing::warn!(unit = %config.name, "ignoring {}: the unit's TOML changed since those versions were made", path.display());
                fresh
            }
            Err(e) => {
                tracing::warn!(unit = %config.name, error = %e, "ignoring unreadable {}", path.display());
                fresh
            }
        }
    }

    /// Writes the versions atomically (temp file, then rename), 0600 in a
    /// 0700 directory.
    pub fn save(&self, state_dir: &Path) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
        let path = Self::path(state_dir, &self.unit);
        if let Some(dir) = path.parent() {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
            tighten(dir, 0o700)?;
        }
        let tmp = path.with_extension("json.tmp");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        // A temp file left by an earlier version keeps its mode: set it.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.write_all(&serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?)?;
        drop(file);
        std::fs::rename(tmp, path)
    }
}

/// Removes any permission of `path` beyond `mode` (never adds one).
fn tighten(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let current = std::fs::metadata(path)?.permissions().mode() & 0o777;
    if current & !mode != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(current & mode))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit() -> UnitConfig {
        let toml = r#"
            name = "decode-0"
            role = "decode"
            argv = ["pd-sim", "--port", "1", "--tpot-ms", "12"]
            env = { A = "1" }
            base_url = "http://127.0.0.1:1"
        "#;
        toml::from_str(toml).unwrap()
    }

    fn edit(set_env: &[(&str, &str)], unset: &[&str], args: &[(&str, &str)]) -> Edit {
        Edit {
            set_env: set_env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            unset_env: unset.iter().map(|s| s.to_string()).collect(),
            set_args: args.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }

    /// A change is a new version; the old one is kept and can be restored
    /// exactly.
    #[test]
    fn apply_then_restore_keeps_every_version() {
        let mut v = Versions::new(&unit());
        let (prev, new) = v
            .apply(&edit(&[("KNOB", "512")], &["A"], &[("--tpot-ms", "9")]), "c1")
            .unwrap();
        assert_eq!((prev, new), (0, 1));
        let s = v.current_spec();
        assert_eq!(s.env.get("KNOB").map(String::as_str), Some("512"));
        assert!(!s.env.contains_key("A") && s.unset_env.contains("A"));
        assert_eq!(s.argv, ["pd-sim", "--port", "1", "--tpot-ms", "9"]);
        assert_eq!(v.restore(0).unwrap(), (1, 0));
        assert_eq!(v.current_spec(), &LaunchSpec::from_config(&unit()));
        assert_eq!(v.versions.len(), 2);
        assert!(matches!(
            v.restore(7),
            Err(VersionError::UnknownVersion { latest: 1, .. })
        ));
        // The next change numbers after every version made so far.
        assert_eq!(v.apply(&edit(&[("B", "2")], &[], &[]), "c2").unwrap(), (0, 2));
    }

    /// Flags are replaced where they are, in either spelling, or appended.
    #[test]
    fn set_args_replaces_or_appends() {
        let mut base = LaunchSpec::from_config(&unit());
        base.argv.push("--mode=a".into());
        let s = base
            .edited(&edit(&[], &[], &[("--mode", "b"), ("--new", "x"), ("--port", "2")]))
            .unwrap();
        assert_eq!(
            s.argv,
            ["pd-sim", "--port", "2", "--tpot-ms", "12", "--mode=b", "--new", "x"]
        );
        assert!(base.edited(&edit(&[], &[], &[("mode", "b")])).is_err());
        assert!(base.edited(&edit(&[("K", "1")], &["K"], &[])).is_err());
        assert!(base.edited(&edit(&[("K=V", "1")], &[], &[])).is_err());
    }

    /// Saved versions survive an agent restart, unless the TOML changed.
    #[test]
    fn persisted_versions_follow_the_toml() {
        let dir = tempfile::tempdir().unwrap();
        let mut v = Versions::new(&unit());
        v.apply(&edit(&[("KNOB", "1")], &[], &[]), "c1").unwrap();
        v.save(dir.path()).unwrap();
        assert_eq!(Versions::load(dir.path(), &unit()).current, 1);
        let mut changed = unit();
        changed.argv.push("--x".into());
        assert_eq!(Versions::load(dir.path(), &changed).current, 0);
    }

    /// Issue 32 (secrets): a unit's versions hold its environment (an
    /// `HF_TOKEN` set by a gate change): `state_dir/config` is 0700 and each
    /// file 0600, whatever the umask; an earlier version's looser ones are
    /// tightened when loaded or saved.
    #[test]
    fn saved_versions_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let dir = tempfile::tempdir().unwrap();
        let mut v = Versions::new(&unit());
        v.apply(&edit(&[("HF_TOKEN", "hf_secret")], &[], &[]), "c1").unwrap();
        v.save(dir.path()).unwrap();
        let file = Versions::path(dir.path(), "decode-0");
        let config_dir = file.parent().unwrap();
        assert_eq!(mode(config_dir), 0o700);
        assert_eq!(mode(&file), 0o600);

        let loose = |p: &Path, m| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
        loose(config_dir, 0o755);
        loose(&file, 0o644);
        assert_eq!(Versions::load(dir.path(), &unit()).current, 1);
        assert_eq!(mode(&file), 0o600, "tightened when loaded");
        loose(&file, 0o644);
        v.save(dir.path()).unwrap();
        assert_eq!(mode(config_dir), 0o700);
        assert_eq!(mode(&file), 0o600);
        // Only the versions themselves are left behind.
        let names: Vec<_> = std::fs::read_dir(config_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["decode-0.json"]);
    }
}
