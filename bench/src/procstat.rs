//! A process's CPU time and memory from `/proc`, read from outside it.
//!
//! The orchestrator under load runs as its own process so that its CPU and
//! RSS are its own, not the load generator's.

use std::time::Instant;

/// Cumulative CPU seconds (user + system) of `pid`, from `/proc/PID/stat`.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; fields resume after its ')'.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')' the state is field 3, so utime (14) and stime (15) are at 11, 12.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    let tck = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    Some((utime + stime) / tck)
}

/// A `/proc/PID/status` figure in bytes ("VmRSS", "VmHWM").
pub fn status_bytes(pid: u32, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text
        .lines()
        .find(|l| l.starts_with(key) && l[key.len()..].starts_with(':'))?;
    let kb: u64 = line[key.len() + 1..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// CPU use of a process between two readings, in cores.
pub struct CpuMeter {
    pid: u32,
    start_cpu: f64,
    start: Instant,
}

impl CpuMeter {
    pub fn start(pid: u32) -> Self {
        CpuMeter {
            pid,
            start_cpu: cpu_seconds(pid).unwrap_or(f64::NAN),
            start: Instant::now(),
        }
    }

    /// Cores used since `start` (1.0 = one core fully busy).
    pub fn cores(&self) -> f64 {
        let cpu = cpu_seconds(self.pid).unwrap_or(f64::NAN);
        (cpu - self.start_cpu) / self.start.elapsed().as_secs_f64()
    }
}

/// The host's total memory in bytes (`/proc/meminfo`).
pub fn meminfo_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line["MemTotal:".len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}
