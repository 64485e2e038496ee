//! Is the agent running where stopping it would stop the engines?
//!
//! Units are the agent's children, so under systemd they live in the agent
//! service's cgroup, and systemd's default `KillMode=control-group` signals
//! every process of that cgroup when the service stops or restarts: an agent
//! upgrade would take every engine on the host down, the outage the agent
//! exists to prevent. `deploy/systemd/pdwarden-agent.service` ships
//! `KillMode=process`; this module notices a unit file that does not and
//! says so at start (it cannot change it). The decision is pure
//! ([`kill_mode_warning`]); reading `/proc/self/cgroup` and asking
//! `systemctl show` (argv, no shell) are at the edge ([`check`]).

use std::time::Duration;

use crate::config::OnExit;

/// The systemd service this process runs in, from `/proc/self/cgroup`
/// ("0::/system.slice/pdwarden-agent.service" → "pdwarden-agent.service").
pub fn service_from_cgroup(cgroup: &str) -> Option<String> {
    cgroup.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        path.rsplit('/')
            .find(|seg| seg.ends_with(".service"))
            .map(str::to_owned)
    })
}

/// The start-up warning, if this placement would take the units down with
/// the agent. `kill_mode` is systemd's `KillMode` of `service` (None when it
/// could not be read).
pub fn kill_mode_warning(service: Option<&str>, kill_mode: Option<&str>, on_exit: OnExit) -> Option<String> {
    let service = service?;
    if on_exit == OnExit::StopUnits {
        // The operator asked for units to stop with the agent anyway.
        return None;
    }
    match kill_mode {
        Some("process") | Some("none") => None,
        Some(mode) => Some(format!(
            "running as systemd service {service} with KillMode={mode}: stopping or restarting the agent will kill every unit it started (they share its cgroup). Set KillMode=process (see deploy/systemd/pdwarden-agent.service)"
        )),
        None => Some(format!(
            "running as systemd service {service}, and its KillMode could not be read: unless it is KillMode=process, stopping or restarting the agent kills every unit it started (see deploy/systemd/pdwarden-agent.service)"
        )),
    }
}

/// Reads where this process runs and returns the warning, if any. Quick
/// and best-effort: outside systemd (no `INVOCATION_ID`) it reads nothing.
pub async fn check(on_exit: OnExit) -> Option<String> {
    std::env::var_os("INVOCATION_ID")?;
    let cgroup = tokio::fs::read_to_string("/proc/self/cgroup").await.ok()?;
    let service = service_from_cgroup(&cgroup)?;
    let show = tokio::process::Command::new("systemctl")
        .args(["show", "--property=KillMode", "--value", &service])
        .kill_on_drop(true)
        .output();
    let kill_mode = match tokio::time::timeout(Duration::from_secs(5), show).await {
        Ok(Ok(out)) if out.status.success() => Some(String::from_utf8_lossy(&out.stdout).trim().to_owned()),
        _ => None,
    };
    kill_mode_warning(Some(&service), kill_mode.as_deref().filter(|m| !m.is_empty()), on_exit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_service_in_cgroup_v2_and_v1() {
        assert_eq!(
            service_from_cgroup("0::/system.slice/pdwarden-agent.service\n").as_deref(),
            Some("pdwarden-agent.service")
        );
        assert_eq!(
            service_from_cgroup("12:pids:/system.slice/pdw.service\n1:name=systemd:/system.slice/pdw.service\n")
                .as_deref(),
            Some("pdw.service")
        );
        assert_eq!(
            service_from_cgroup("0::/user.slice/user-0.slice/session-3.scope\n"),
            None
        );
    }

    /// The shipped unit's setting is quiet; systemd's default warns with the
    /// fix; an unreadable mode warns too; stop-units or no systemd, nothing.
    #[test]
    fn warns_only_where_the_agent_would_take_its_units_down() {
        let svc = Some("pdwarden-agent.service");
        assert_eq!(kill_mode_warning(svc, Some("process"), OnExit::LeaveRunning), None);
        let w = kill_mode_warning(svc, Some("control-group"), OnExit::LeaveRunning).unwrap();
        assert!(
            w.contains("KillMode=control-group") && w.contains("Set KillMode=process"),
            "{w}"
        );
        assert!(
            kill_mode_warning(svc, None, OnExit::LeaveRunning)
                .unwrap()
                .contains("could not be read")
        );
        assert_eq!(kill_mode_warning(svc, Some("mixed"), OnExit::StopUnits), None);
        assert_eq!(
            kill_mode_warning(None, Some("control-group"), OnExit::LeaveRunning),
            None
        );
    }

    /// The unit file we ship is the safe one (and gives the engines the
    /// limits they need): a check on the file operators copy.
    #[test]
    fn shipped_unit_file_keeps_units_alive() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/systemd/pdwarden-agent.service");
        let text = std::fs::read_to_string(path).unwrap();
        let settings: Vec<(&str, &str)> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.starts_with('#') && !l.starts_with('['))
            .filter_map(|l| l.split_once('='))
            .collect();
        let get = |k: &str| settings.iter().rev().find(|(key, _)| *key == k).map(|(_, v)| *v);
        assert_eq!(get("KillMode"), Some("process"));
        assert_eq!(get("TasksMax"), Some("infinity"));
        assert_eq!(get("LimitMEMLOCK"), Some("infinity"));
        assert!(get("ExecStart").is_some_and(|e| e.contains("pdwarden-agent --config")));
        assert_eq!(get("MemoryMax"), None, "a memory cap would cap the engines");
    }
}
