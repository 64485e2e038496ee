//! The processes a local stack starts: where their binaries are, and a
//! handle that stops its child by PID (SIGTERM, then SIGKILL after a grace)
//! however the stack ends — a returned drill, an error, a dropped future.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A workspace binary: next to the running executable (the `pdwarden` CLI,
/// the benchmark), or one level up from a test binary in `target/*/deps/`.
/// `PDWARDEN_BIN_DIR` overrides both.
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let dir = match std::env::var_os("PDWARDEN_BIN_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let exe = std::env::current_exe().context("cannot locate the running executable")?;
            let dir = exe.parent().context("the running executable has no parent directory")?;
            if dir.file_name().is_some_and(|n| n == "deps") {
                dir.parent().unwrap_or(dir).to_path_buf()
            } else {
                dir.to_path_buf()
            }
        }
    };
    let p = dir.join(name);
    if p.is_file() {
        Ok(p)
    } else {
        bail!(
            "{name} not found in {}; build the whole workspace first: cargo build --workspace --bins",
            dir.display()
        )
    }
}

/// sglang-router's `smg` launcher: `explicit`, else `.venv/bin/smg` of the
/// checkout the running executable was built in, else `PATH`.
pub fn find_router(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        if p.is_file() {
            return Ok(p.to_path_buf());
        }
        bail!("--router-bin {} does not exist", p.display());
    }
    let exe = std::env::current_exe()?;
    for dir in exe.ancestors().skip(1) {
        let candidate = dir.join(".venv/bin/smg");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join("smg");
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    bail!("sglang-router (smg) not found: run scripts/setup-router.sh, or pass --router-bin")
}

/// py-spy for the agent's evidence captures (issue 35): `.venv/bin/py-spy`
/// of the checkout the running executable was built in (scripts/
/// setup-router.sh installs it there), else none: the agent then looks on
/// its `PATH`, and without one says the captures have no Python stacks.
pub fn find_py_spy() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .skip(1)
        .map(|dir| dir.join(".venv/bin/py-spy"))
        .find(|candidate| candidate.is_file())
}

/// A child process the stack started; stopped by PID when dropped.
pub struct Owned {
    name: &'static str,
    child: Child,
}

impl Owned {
    /// SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        pdwarden_client::say_err!("demo: {} did not stop within {grace:?}; killing it", self.name);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, if the process has ended (reaped here).
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

/// Starts `program ARGS` with stdout and stderr in `dir/NAME.log`.
pub fn spawn_logged(name: &'static str, program: &Path, args: &[String], dir: &Path) -> anyhow::Result<Owned> {
    // Appended to: a daemon the stack restarts (the soak's kills) keeps
    // its earlier lines, and the soak counts them all.
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.log")))?;
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot start {}", program.display()))?;
    Ok(Owned { name, child })
}
