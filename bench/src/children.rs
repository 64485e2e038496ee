//! Processes the bench starts, and their clean-up by PID.
//!
//! Every child is owned by a [`Child`] that stops it (SIGTERM, then SIGKILL)
//! when dropped, so an error half-way through leaves nothing running. Engines
//! started by the in-process agent are its children, hence ours: whatever the
//! agent did not stop is found by parent PID and marker argument, and killed.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A child process stopped by PID on drop.
pub struct Child {
    inner: std::process::Child,
}

impl Child {
    /// Runs this binary with `args`; returns it and the first line it prints.
    pub fn spawn_self(args: &[&str], log: &Path) -> anyhow::Result<(Child, String)> {
        let exe = std::env::current_exe().context("cannot locate the bench binary")?;
        let mut inner = Command::new(exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .context("cannot start a child of the bench")?;
        let stdout = inner.stdout.take().context("child stdout")?;
        let child = Child { inner };
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        anyhow::ensure!(
            !line.is_empty(),
            "child {args:?} exited before it said where it listens"
        );
        Ok((child, line.trim().to_owned()))
    }

    pub fn pid(&self) -> u32 {
        self.inner.id()
    }

    /// SIGKILL at once (a crash), reaped.
    pub fn kill(&mut self) {
        let _ = self.inner.kill();
        let _ = self.inner.wait();
    }

    /// SIGTERM, then SIGKILL after `grace`; always reaps.
    pub fn stop(&mut self, grace: Duration) {
        if matches!(self.inner.try_wait(), Ok(Some(_))) {
            return;
        }
        let pid = Pid::from_raw(self.inner.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let until = Instant::now() + grace;
        while Instant::now() < until {
            if matches!(self.inner.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.inner.kill();
        let _ = self.inner.wait();
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(3));
    }
}

/// Kills (SIGKILL) every child of this process whose command line holds
/// `marker`: engines the in-process agent left behind.
pub fn kill_strays(marker: &str) {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else { return };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let ppid = stat
            .rfind(')')
            .and_then(|i| stat[i + 2..].split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(me) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).split('\0').any(|a| a == marker) {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
}
