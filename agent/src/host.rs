//! The host's own figures (CPU, memory, load) and its process table, read
//! with `sysinfo`.
//!
//! The process table is what the GPU mapping walks (parent links, process
//! groups) and what each unit's RSS and CPU are summed from. `sysinfo` gives
//! parents, command lines, users, RSS and CPU; the process group, which it
//! does not expose, is read from `/proc/PID/stat`. CPU figures need two
//! readings, so the first sample after start reports 0.
//!
//! One [`HostSampler`] lives for the agent's lifetime (it keeps the previous
//! reading for CPU deltas); calls block, so the reporter runs them on a
//! blocking thread.

use sysinfo::{MemoryRefreshKind, ProcessRefreshKind, ProcessesToUpdate, System, UpdateKind, Users};

use crate::gpu::mapping::{ProcInfo, ProcTable};

/// The host's figures, as reported in `HostSnapshot.host`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostFigures {
    pub cpu_pct: f32,
    pub cpu_count: u32,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    pub load: [f64; 3],
}

/// Reads the host; keeps state between readings for CPU usage.
pub struct HostSampler {
    system: System,
    users: Users,
}

impl Default for HostSampler {
    fn default() -> Self {
        Self::new()
    }
}

impl HostSampler {
    pub fn new() -> Self {
        // sysinfo keeps every process's stat file open unless told not to: a
        // long-lived agent on a busy host must not hold thousands of fds.
        sysinfo::set_open_files_limit(0);
        Self {
            system: System::new(),
            users: Users::new_with_refreshed_list(),
        }
    }

    /// Reads host figures and the process table now.
    pub fn sample(&mut self) -> (HostFigures, ProcTable) {
        self.system.refresh_cpu_usage();
        self.system
            .refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram());
        self.system.refresh_processes_specifics(
            ProcessesToUpdate::All,
            true,
            ProcessRefreshKind::nothing()
                .without_tasks()
                .with_memory()
                .with_cpu()
                .with_cmd(UpdateKind::OnlyIfNotSet)
                .with_user(UpdateKind::OnlyIfNotSet),
        );
        let load = System::load_average();
        let figures = HostFigures {
            cpu_pct: self.system.global_cpu_usage(),
            cpu_count: u32::try_from(self.system.cpus().len()).unwrap_or(u32::MAX),
            memory_used_bytes: self.system.used_memory(),
            memory_total_bytes: self.system.total_memory(),
            load: [load.one, load.five, load.fifteen],
        };
        let mut refreshed_users = false;
        let mut table = ProcTable::with_capacity(self.system.processes().len());
        for (pid, p) in self.system.processes() {
            let pid = pid.as_u32();
            let user = match p.user_id() {
                None => String::new(),
                Some(uid) => {
                    if self.users.get_user_by_id(uid).is_none() && !refreshed_users {
                        self.users.refresh();
                        refreshed_users = true;
                    }
                    self.users
                        .get_user_by_id(uid)
                        .map_or_else(|| format!("uid {}", **uid), |u| u.name().to_owned())
                }
            };
            let command_line = p
                .cmd()
                .iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" ");
            table.insert(
                pid,
                ProcInfo {
                    ppid: p.parent().map(|pp| pp.as_u32()),
                    pgid: process_group(pid),
                    command_line: if command_line.is_empty() {
                        format!("[{}]", p.name().to_string_lossy())
                    } else {
                        command_line
                    },
                    user,
                    rss_bytes: p.memory(),
                    cpu_pct: p.cpu_usage(),
                },
            );
        }
        (figures, table)
    }
}

/// The process group of `pid` from `/proc/PID/stat` (field 5, after the
/// parenthesised command name, which may itself contain spaces and ')').
pub fn process_group(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_pgid(&stat)
}

fn parse_pgid(stat: &str) -> Option<u32> {
    let after = &stat[stat.rfind(')')? + 1..];
    // state ppid pgrp
    after.split_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Property: the process group is read after the command name, whatever it contains.
    #[test]
    fn pgid_parses_past_odd_command_names() {
        assert_eq!(parse_pgid("42 (a) b) c) S 1 77 77 0"), Some(77));
        assert_eq!(parse_pgid("42 (sleep) S 10 42 42"), Some(42));
        assert_eq!(parse_pgid("garbage"), None);
    }

    // Property: the sampler sees this very process, with its parent, group and user.
    #[test]
    fn sampler_sees_this_process() {
        let mut s = HostSampler::new();
        let (fig, table) = s.sample();
        assert!(fig.memory_total_bytes > 0 && fig.cpu_count > 0);
        let me = std::process::id();
        let info = table.get(&me).expect("own process in the table");
        assert_eq!(info.ppid, Some(nix::unistd::getppid().as_raw() as u32));
        assert_eq!(info.pgid, process_group(me));
        assert!(!info.user.is_empty());
        assert!(info.rss_bytes > 0);
    }
}
