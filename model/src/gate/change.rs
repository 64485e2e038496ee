//! The change a gate is asked for, as its request and its report carry it
//! (the orchestrator's `ops::gate::change` checks it against the pair).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::judge::live::Expected;

/// The change asked for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChangeSpec {
    pub set_env: BTreeMap<String, String>,
    pub unset_env: Vec<String>,
    pub set_args: BTreeMap<String, String>,
    /// The units changed (empty in a request: the pair's engines).
    pub units: Vec<String>,
}

impl ChangeSpec {
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self.set_env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        parts.extend(self.unset_env.iter().map(|k| format!("unset {k}")));
        parts.extend(self.set_args.iter().map(|(k, v)| format!("{k} {v}")));
        parts.join(", ")
    }

    /// The environment variables the change sets or unsets.
    pub fn env_keys(&self) -> Vec<String> {
        self.set_env.keys().chain(&self.unset_env).cloned().collect()
    }

    /// The flags the change sets.
    pub fn flags(&self) -> Vec<String> {
        self.set_args.keys().cloned().collect()
    }

    /// What a process started from config `version` with the change holds.
    pub fn expected(&self, version: u32) -> Expected {
        Expected {
            env: self
                .set_env
                .iter()
                .map(|(k, v)| (k.clone(), Some(v.clone())))
                .chain(self.unset_env.iter().map(|k| (k.clone(), None)))
                .collect(),
            args: self
                .set_args
                .iter()
                .map(|(k, v)| (k.clone(), Some(v.clone())))
                .collect(),
            config_version: Some(version),
        }
    }
}
