//! Is the change live? Pure judgement of what the agent read from `/proc`.
//!
//! A config file that says `KNOB=512` proves nothing about the process: a
//! launcher may strip the variable (`env -u`), a wrapper shell may fork
//! instead of exec'ing, the unit may never have been restarted. So the gate
//! compares the kernel's view of the restarted process tree with what was
//! asked: every process of the unit must hold each set variable with its
//! value and none of the unset ones, the process must have been spawned from
//! the new config version, and each set flag must appear with its value on a
//! command line of the tree. After a rollback the same check runs against
//! the values recorded from the processes before the change.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What one process held (from the agent's `ProcessFacts`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessView {
    pub pid: u32,
    pub cmdline: Vec<String>,
    /// Requested variables: Some(value) when present.
    pub env: BTreeMap<String, Option<String>>,
    /// Its environment holds no variable at all (overwritten by the
    /// process: nothing can be confirmed in it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub environ_blank: bool,
}

/// A unit's live state as inspected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnitView {
    pub unit: String,
    /// The config version the running process was spawned from (None:
    /// unknown, e.g. adopted from an earlier agent).
    pub config_version: Option<u32>,
    pub processes: Vec<ProcessView>,
}

/// What must be live.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Expected {
    /// Variable → Some(value) (must be present with it) or None (must be absent).
    pub env: BTreeMap<String, Option<String>>,
    /// Flag → Some(value) (must appear with it) or None (must not appear).
    pub args: BTreeMap<String, Option<String>>,
    pub config_version: Option<u32>,
}

/// The check of one unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveCheck {
    pub unit: String,
    pub ok: bool,
    /// The root process inspected.
    pub pid: u32,
    pub config_version: Option<u32>,
    /// What was found, one line per fact ("pid 123: KNOB=512").
    pub observed: Vec<String>,
    /// Why not live (empty when ok).
    pub problems: Vec<String>,
}

/// The value given to `flag` on a command line (`--flag v` or `--flag=v`).
pub fn flag_value(cmdline: &[String], flag: &str) -> Option<String> {
    let joined = format!("{flag}=");
    cmdline.iter().enumerate().skip(1).find_map(|(i, a)| {
        if a == flag {
            Some(cmdline.get(i + 1).cloned().unwrap_or_default())
        } else {
            a.strip_prefix(&joined).map(str::to_string)
        }
    })
}

fn show(v: &Option<String>) -> String {
    match v {
        Some(v) => format!("{v:?}"),
        None => "absent".into(),
    }
}

/// Checks one unit's inspected process tree against `expected`.
pub fn check(view: &UnitView, expected: &Expected) -> LiveCheck {
    let mut problems = Vec::new();
    let mut observed = Vec::new();
    if view.processes.is_empty() {
        problems.push(format!("{}: no running process to inspect", view.unit));
    }
    if let Some(want) = expected.config_version
        && view.config_version != Some(want)
    {
        problems.push(format!(
            "{}: the running process was started from config version {}, not {want}",
            view.unit,
            view.config_version.map_or("unknown".into(), |v| v.to_string())
        ));
    }
    for p in &view.processes {
        for (key, want) in &expected.env {
            let got = p.env.get(key).cloned().flatten();
            observed.push(format!("pid {}: {key}={}", p.pid, show(&got)));
            if &got != want {
                problems.push(format!(
                    // NAME=VALUE on both sides: the form a redactor knows
                    // (a secret's value never shown, issue 16).
                    "{}: pid {} has {key}={} in /proc/{}/environ, expected {key}={}",
                    view.unit,
                    p.pid,
                    show(&got),
                    p.pid,
                    show(want)
                ));
            }
        }
    }
    for (flag, want) in &expected.args {
        let found: Vec<(u32, String)> = view
            .processes
            .iter()
            .filter_map(|p| flag_value(&p.cmdline, flag).map(|v| (p.pid, v)))
            .collect();
        for (pid, v) in &found {
            observed.push(format!("pid {pid}: {flag} {v}"));
        }
        let ok = match want {
            Some(w) => !found.is_empty() && found.iter().all(|(_, v)| v == w),
            None => found.is_empty(),
        };
        if !ok {
            let got = if found.is_empty() {
                "absent".to_string()
            } else {
                found
                    .iter()
                    .map(|(p, v)| format!("{v:?} (pid {p})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            problems.push(format!(
                "{}: {flag} {got} on the command line (/proc/PID/cmdline), expected {flag} {}",
                view.unit,
                show(want)
            ));
        }
    }
    LiveCheck {
        unit: view.unit.clone(),
        ok: problems.is_empty(),
        pid: view.processes.first().map_or(0, |p| p.pid),
        config_version: view.config_version,
        observed,
        problems,
    }
}

/// What the processes held before the change, for the keys and flags the
/// change touches: the rollback must bring exactly these back.
pub fn expected_from(view: &UnitView, keys: &[String], flags: &[String], config_version: Option<u32>) -> Expected {
    let root = view.processes.first();
    Expected {
        env: keys
            .iter()
            .map(|k| (k.clone(), root.and_then(|p| p.env.get(k).cloned().flatten())))
            .collect(),
        args: flags
            .iter()
            .map(|f| (f.clone(), root.and_then(|p| flag_value(&p.cmdline, f))))
            .collect(),
        config_version,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc_(pid: u32, cmd: &[&str], env: &[(&str, Option<&str>)]) -> ProcessView {
        ProcessView {
            environ_blank: false,
            pid,
            cmdline: cmd.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
                .collect(),
        }
    }

    fn want(env: &[(&str, Option<&str>)], args: &[(&str, Option<&str>)], version: u32) -> Expected {
        Expected {
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
                .collect(),
            args: args
                .iter()
                .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
                .collect(),
            config_version: Some(version),
        }
    }

    /// The knob in the environment and the flag on the command line: live.
    #[test]
    fn knob_present_is_live() {
        let v = UnitView {
            unit: "decode-0".into(),
            config_version: Some(1),
            processes: vec![proc_(10, &["pd-sim", "--tpot-ms", "9"], &[("KNOB", Some("512"))])],
        };
        let c = check(&v, &want(&[("KNOB", Some("512"))], &[("--tpot-ms", Some("9"))], 1));
        assert!(c.ok, "{c:?}");
        assert_eq!(c.observed, ["pid 10: KNOB=\"512\"", "pid 10: --tpot-ms 9"]);
    }

    /// Seed's question, answered from /proc: the config says KNOB=512 but an
    /// `env -u KNOB` launcher stripped it from the process.
    #[test]
    fn stripped_knob_is_not_live() {
        let v = UnitView {
            unit: "decode-0".into(),
            config_version: Some(1),
            processes: vec![proc_(10, &["pd-sim"], &[("KNOB", None)])],
        };
        let c = check(&v, &want(&[("KNOB", Some("512"))], &[], 1));
        assert!(!c.ok);
        assert!(
            c.problems[0].contains("pid 10 has KNOB=absent in /proc/10/environ, expected KNOB=\"512\""),
            "{c:?}"
        );
    }

    /// A wrapper that forks: the parent has the knob, the engine child not.
    #[test]
    fn every_process_of_the_tree_must_hold_it() {
        let v = UnitView {
            unit: "prefill-0".into(),
            config_version: Some(1),
            processes: vec![
                proc_(10, &["sh", "-c", "..."], &[("KNOB", Some("512"))]),
                proc_(11, &["pd-sim"], &[("KNOB", None)]),
            ],
        };
        let c = check(&v, &want(&[("KNOB", Some("512"))], &[], 1));
        assert!(
            !c.ok && c.problems.len() == 1 && c.problems[0].contains("pid 11"),
            "{c:?}"
        );
    }

    /// A process still running the old config version is not the change.
    #[test]
    fn old_version_is_not_live() {
        let v = UnitView {
            unit: "decode-0".into(),
            config_version: Some(0),
            processes: vec![proc_(10, &["pd-sim"], &[("KNOB", Some("512"))])],
        };
        let c = check(&v, &want(&[("KNOB", Some("512"))], &[], 1));
        assert!(c.problems[0].contains("config version 0, not 1"), "{c:?}");
    }

    /// The rollback's expectation is what the processes held before.
    #[test]
    fn rollback_expects_the_recorded_values() {
        let before = UnitView {
            unit: "decode-0".into(),
            config_version: Some(0),
            processes: vec![proc_(10, &["pd-sim", "--tpot-ms=12"], &[("KNOB", None)])],
        };
        let e = expected_from(&before, &["KNOB".into()], &["--tpot-ms".into()], Some(0));
        assert_eq!(e.env["KNOB"], None);
        assert_eq!(e.args["--tpot-ms"].as_deref(), Some("12"));
        assert!(check(&before, &e).ok);
        assert_eq!(flag_value(&["x".into(), "--a".into()], "--a").as_deref(), Some(""));
    }
}
