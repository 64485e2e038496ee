//! Whether a unit could be started now (issue 16, finding 5).
//!
//! A co-restart that finds out at its second step that the decode's program
//! does not exist has already stopped and restarted the prefill, and leaves
//! the decode and the router stopped. So before an operation touches any
//! unit the orchestrator asks every agent of the pair for this check
//! (`PreflightUnits`), and refuses with its reasons; the agent also runs it
//! at load and logs what it finds, so a typo is seen at once, not at the
//! first restart.
//!
//! It checks what would make the start fail before the engine's own code
//! runs: the program (`argv[0]`, on the unit's `PATH` or the agent's, as
//! the spawn resolves it) present and executable, the working directory
//! present, its `user` on this host and one the agent can switch to, and —
//! for a unit not running now — its ports not already
//! accepting connections (another process holds them: the new one would
//! fail to bind, or worse, the probes would reach the other one).

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::UnitConfig;
use crate::unitconfig::LaunchSpec;

/// How long a port check waits for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(200);

/// Every problem that would stop `unit` from starting with `spec` now.
/// `running`: the unit's own process runs (its ports are its own).
pub fn problems(unit: &UnitConfig, spec: &LaunchSpec, running: bool) -> Vec<String> {
    let mut out = Vec::new();
    // Its `user` still on this host and one this agent can switch to
    // (issue 48): checked at load, but an account can go since.
    match unit.run_as() {
        Err(why) => out.push(format!("{}: {why}", unit.name)),
        Ok(Some(to)) => {
            if let Err(why) = crate::runas::Privilege::of_this_process().may_run_as(&to) {
                out.push(format!("{}: user: {why}", unit.name));
            }
        }
        Ok(None) => {}
    }
    if let Some(cwd) = &unit.cwd
        && !cwd.is_dir()
    {
        out.push(format!("{}: cwd {} is not a directory", unit.name, cwd.display()));
    }
    match spec.argv.first() {
        None => out.push(format!("{}: argv is empty", unit.name)),
        Some(program) => {
            let path_var = spec
                .env
                .get("PATH")
                .cloned()
                .or_else(|| (!spec.unset_env.contains("PATH")).then(|| std::env::var("PATH").unwrap_or_default()))
                .unwrap_or_default();
            if let Err(why) = resolve(program, &path_var, unit.cwd.as_deref()) {
                out.push(format!("{}: argv[0] {program:?} {why}", unit.name));
            }
        }
    }
    if !running {
        let mut ports: Vec<(String, Option<SocketAddr>)> = vec![(unit.base_url.clone(), url_addr(&unit.base_url))];
        if let (Some(port), Some(SocketAddr::V4(a))) = (unit.bootstrap_port, url_addr(&unit.base_url)) {
            ports.push((
                format!("bootstrap port {port}"),
                Some(SocketAddr::new((*a.ip()).into(), port)),
            ));
        }
        for (what, addr) in ports {
            if let Some(addr) = addr
                && TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).is_ok()
            {
                out.push(format!(
                    "{}: {what} ({addr}) already accepts connections while the unit is not running: another process holds it",
                    unit.name
                ));
            }
        }
    }
    out
}

/// Why a unit's program does not resolve to an executable ([`resolve`]).
#[derive(Debug, thiserror::Error)]
enum ResolveError {
    #[error("is not an executable file ({})", .0.display())]
    NotExecutable(PathBuf),
    #[error("does not exist")]
    Missing,
    #[error("is not on PATH")]
    NotOnPath,
}

/// The executable `program` resolves to, as the spawn would find it: a
/// path (relative to `cwd` when given) or a name looked up on `path_var`.
fn resolve(program: &str, path_var: &str, cwd: Option<&Path>) -> Result<PathBuf, ResolveError> {
    let candidates: Vec<PathBuf> = if program.contains('/') {
        let p = PathBuf::from(program);
        vec![match cwd {
            Some(c) if p.is_relative() => c.join(p),
            _ => p,
        }]
    } else {
        std::env::split_paths(path_var).map(|d| d.join(program)).collect()
    };
    let mut seen = None;
    for c in candidates {
        if let Ok(meta) = std::fs::metadata(&c) {
            if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
                return Ok(c);
            }
            seen.get_or_insert(c);
        }
    }
    Err(match (seen, program.contains('/')) {
        (Some(p), _) => ResolveError::NotExecutable(p),
        (None, true) => ResolveError::Missing,
        (None, false) => ResolveError::NotOnPath,
    })
}

/// `http://127.0.0.1:30000/...` → 127.0.0.1:30000.
fn url_addr(url: &str) -> Option<SocketAddr> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next()?;
    let with_port = if authority.contains(':') {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    with_port.to_socket_addrs().ok()?.next()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(argv: &[&str], base_url: &str) -> (UnitConfig, LaunchSpec) {
        let text = format!(
            "host='h'\norchestrator='http://x:1'\nstate_dir='/tmp'\n[[unit]]\nname='decode-0'\nrole='decode'\nargv={argv:?}\nbase_url='{base_url}'\n"
        );
        let c = crate::config::AgentConfig::from_toml_str(&text).unwrap();
        let u = c.units[0].clone();
        let spec = LaunchSpec {
            argv: u.argv.clone(),
            env: Default::default(),
            unset_env: Default::default(),
        };
        (u, spec)
    }

    #[test]
    fn a_missing_or_unexecutable_program_is_named() {
        let (u, s) = unit(&["/nope/python", "-m", "x"], "http://127.0.0.1:1");
        assert_eq!(
            problems(&u, &s, true),
            ["decode-0: argv[0] \"/nope/python\" does not exist"]
        );
        let (u, s) = unit(&["no-such-program-pdw"], "http://127.0.0.1:1");
        assert_eq!(
            problems(&u, &s, true),
            ["decode-0: argv[0] \"no-such-program-pdw\" is not on PATH"]
        );
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("engine");
        std::fs::write(&f, "#!/bin/sh\n").unwrap();
        let (u, s) = unit(&[f.to_str().unwrap()], "http://127.0.0.1:1");
        assert!(
            problems(&u, &s, true)[0].contains("is not an executable file"),
            "{:?}",
            problems(&u, &s, true)
        );
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(problems(&u, &s, true).is_empty());
        let (u, s) = unit(&["sleep", "1"], "http://127.0.0.1:1");
        assert!(problems(&u, &s, true).is_empty(), "found on PATH");
        let (mut u, s) = unit(&["sleep", "1"], "http://127.0.0.1:1");
        u.cwd = Some("/nope/dir".into());
        assert_eq!(problems(&u, &s, true), ["decode-0: cwd /nope/dir is not a directory"]);
        // Issue 48: a user the host no longer has.
        let (mut u, s) = unit(&["sleep", "1"], "http://127.0.0.1:1");
        u.user = Some("pdwarden-no-such-user".into());
        assert_eq!(
            problems(&u, &s, true),
            ["decode-0: user: no such user \"pdwarden-no-such-user\" on this host"]
        );
    }

    /// A port that already answers while the unit is stopped is held by
    /// someone else; the unit's own (running) port is not a problem.
    #[test]
    fn a_port_held_by_another_process_is_named() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", held.local_addr().unwrap());
        let (u, s) = unit(&["sleep", "1"], &url);
        let p = problems(&u, &s, false);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].contains("already accepts connections while the unit is not running"),
            "{p:?}"
        );
        assert!(problems(&u, &s, true).is_empty());
        drop(held);
        assert!(problems(&u, &s, false).is_empty());
    }
}
