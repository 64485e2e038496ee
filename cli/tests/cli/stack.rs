//! `pdwarden demo` and `pdwarden soak` run `pdwarden-stack` (the local
//! stack, which the CLI does not link), as git runs its external
//! subcommands: the arguments verbatim, the global credentials in its
//! environment, its own help as `pdwarden demo --help`, and one line when
//! it is missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn pdwarden() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pdwarden"))
}

/// `pdwarden-stack`, built next to the `pdwarden` under test: a package's
/// tests build only its own binaries, and the CLI does not depend on the
/// stack. Built once per test binary.
fn built_stack() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = pdwarden().parent().unwrap();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build.args(["build", "--quiet", "-p", "pdwarden-stack", "--bin", "pdwarden-stack"]);
        if dir.file_name().is_some_and(|n| n == "release") {
            build.arg("--release");
        }
        let status = build.status().expect("cannot run cargo");
        assert!(status.success(), "cargo build -p pdwarden-stack: {status}");
        let stack = dir.join("pdwarden-stack");
        assert!(
            stack.is_file(),
            "{} was not built next to {}",
            stack.display(),
            pdwarden().display()
        );
        stack
    })
}

/// `pdwarden ARGS` with none of the caller's `PDWARDEN_*` credentials.
fn run(exe: &Path, args: &[&str], path: Option<&str>) -> Output {
    let mut cmd = Command::new(exe);
    cmd.args(args);
    for var in ["PDWARDEN_CA", "PDWARDEN_CERT", "PDWARDEN_KEY", "PDWARDEN_TOKEN"] {
        cmd.env_remove(var);
    }
    if let Some(p) = path {
        cmd.env("PATH", p);
    }
    cmd.output().unwrap()
}

/// Copies `from` into `dir` as `name`, executable, by `install` (a child
/// process), so no process this test binary forks meanwhile inherits a
/// write handle on it (ETXTBSY when it is then executed).
fn install(from: &Path, dir: &Path, name: &str) -> PathBuf {
    let to = dir.join(name);
    let status = Command::new("install")
        .args(["-m", "755"])
        .arg(from)
        .arg(&to)
        .status()
        .unwrap();
    assert!(status.success(), "install {}", from.display());
    to
}

/// `pdwarden demo --help` is `pdwarden-stack demo`'s help (its own flags,
/// its usage line naming `pdwarden demo`), as is `soak --help`; a flag the
/// demo does not know is refused by the demo's parser; `pdwarden --help`
/// still names both with their one-line descriptions.
#[test]
fn demo_and_soak_help_come_through_the_pass_through() {
    built_stack();
    let out = run(pdwarden(), &["demo", "--help"], None);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}{}", String::from_utf8_lossy(&out.stderr));
    for says in [
        "Usage: pdwarden demo [OPTIONS]",
        "--hold",
        "--incident",
        "--insecure-plaintext",
        "--token",
    ] {
        assert!(help.contains(says), "{says} missing:\n{help}");
    }
    let out = run(pdwarden(), &["soak", "--help"], None);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    assert!(
        help.contains("Usage: pdwarden soak") && help.contains("--seconds"),
        "{help}"
    );

    let out = run(pdwarden(), &["demo", "--no-such-flag"], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--no-such-flag") && err.contains("pdwarden demo"), "{err}");

    let out = run(pdwarden(), &["--help"], None);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("Start a whole local stack") && help.contains("Co-restarts, verifications and gates"),
        "{help}"
    );
}

/// The process is replaced by `pdwarden-stack SUB ARGS` (same PID), the
/// arguments verbatim (flags, flag-like values, spaces), the global
/// `--ca`/`--cert`/`--key`/`--token` in `PDWARDEN_*`, and nothing set that
/// was not given.
#[test]
fn arguments_go_verbatim_and_credentials_in_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script.txt");
    std::fs::write(
        &script,
        "#!/bin/sh\n\
         echo \"pid=$$\"\n\
         for a in \"$@\"; do echo \"arg=$a\"; done\n\
         echo \"ca=${PDWARDEN_CA-unset} cert=${PDWARDEN_CERT-unset} key=${PDWARDEN_KEY-unset} token=${PDWARDEN_TOKEN-unset}\"\n\
         exit 7\n",
    )
    .unwrap();
    let exe = install(pdwarden(), dir.path(), "pdwarden");
    install(&script, dir.path(), "pdwarden-stack");

    let args = [
        "--ca",
        "/pki/ca.pem",
        "--token",
        "s3cret",
        "demo",
        "--json",
        "--prefill-sim",
        "--ttft-ms 900",
        "-x",
        "--",
        "--hold",
    ];
    let child = Command::new(&exe)
        .args(args)
        .env("PATH", "")
        .env_remove("PDWARDEN_CERT")
        .env_remove("PDWARDEN_KEY")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(7), "{said}");
    let expected = format!(
        "pid={pid}\narg=demo\narg=--json\narg=--prefill-sim\narg=--ttft-ms 900\narg=-x\narg=--\narg=--hold\n\
         ca=/pki/ca.pem cert=unset key=unset token=s3cret\n"
    );
    assert_eq!(said, expected);

    let out = Command::new(&exe)
        .args([
            "--cert",
            "/pki/me.pem",
            "--key",
            "/pki/me.key",
            "soak",
            "--seconds",
            "5",
        ])
        .env("PATH", "")
        .env_remove("PDWARDEN_CA")
        .env_remove("PDWARDEN_TOKEN")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.ends_with("arg=soak\narg=--seconds\narg=5\nca=unset cert=/pki/me.pem key=/pki/me.key token=unset\n"),
        "{said}"
    );
}

/// With no `pdwarden-stack` next to `pdwarden` nor on `PATH`: exit 1, one
/// line saying where it looked and how to build it (and `{"error": ...}`
/// under `--json`).
#[test]
fn a_missing_pdwarden_stack_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let exe = install(pdwarden(), &dir, "pdwarden");
    let empty = dir.join("empty");
    std::fs::create_dir(&empty).unwrap();

    let out = run(&exe, &["demo", "--hold"], Some(empty.to_str().unwrap()));
    let reason = format!(
        "demo: pdwarden-stack not found next to {} or on PATH (build it: cargo build --workspace)",
        exe.display()
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stderr), format!("pdwarden: {reason}\n"));
    assert!(out.stdout.is_empty());

    let out = run(&exe, &["soak", "--json"], Some(""));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("pdwarden: soak: pdwarden-stack not found next to "),
        "{err}"
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        json["error"]
            .as_str()
            .unwrap()
            .starts_with("soak: pdwarden-stack not found"),
        "{json}"
    );
}
