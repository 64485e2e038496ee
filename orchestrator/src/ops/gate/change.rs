//! The change a gate is asked for: what it sets, which units it applies to,
//! and whether it can be run at all — checked before anything is journaled,
//! so that a request that can never be run is refused in one line naming
//! the flag to fix.

use crate::config::{PairConfig, UnitRef};
use pdwarden_model::gate::change::ChangeSpec;

/// The units a change applies to: those named, else the pair's engines.
pub fn targets(pair: &PairConfig, change: &ChangeSpec) -> Vec<UnitRef> {
    let all: Vec<&UnitRef> = pair.prefill.iter().chain(&pair.decode).chain(&pair.router).collect();
    if change.units.is_empty() {
        pair.prefill.iter().chain(&pair.decode).cloned().collect()
    } else {
        all.into_iter()
            .filter(|u| change.units.contains(&u.unit))
            .cloned()
            .collect()
    }
}

/// Checks a request before anything is journaled: the units exist in the
/// pair and the change is not empty.
pub fn validate_request(pair: &PairConfig, change: &ChangeSpec) -> Result<(), InvalidChange> {
    if change.set_env.is_empty() && change.unset_env.is_empty() && change.set_args.is_empty() {
        return Err(InvalidChange::Empty);
    }
    for u in &change.units {
        if !pair
            .prefill
            .iter()
            .chain(&pair.decode)
            .chain(&pair.router)
            .any(|r| &r.unit == u)
        {
            return Err(InvalidChange::UnknownUnit {
                unit: u.clone(),
                pair: pair.name.clone(),
            });
        }
    }
    for k in change.set_env.keys().chain(&change.unset_env) {
        if k.is_empty() || k.contains('=') {
            return Err(InvalidChange::EnvName(k.clone()));
        }
    }
    for f in change.set_args.keys() {
        if !f.starts_with('-') {
            return Err(InvalidChange::Flag(f.clone()));
        }
    }
    Ok(())
}

/// A gate request that cannot be run; each names the flag to fix.
#[derive(Debug, thiserror::Error)]
pub enum InvalidChange {
    #[error("nothing to change: give --set-env, --unset-env or --set-arg")]
    Empty,
    #[error("unit {unit:?} is not part of pair {pair}")]
    UnknownUnit { unit: String, pair: String },
    #[error("invalid environment variable name {0:?}")]
    EnvName(String),
    #[error("--set-arg {0:?}: the flag must start with '-'")]
    Flag(String),
}
