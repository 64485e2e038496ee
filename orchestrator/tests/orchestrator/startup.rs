//! The orchestrator binary's start-up failures, as an operator sees them.

use std::process::Command;

// Property: a bad config stops the orchestrator with exit status 1 and an
// error that names the field; no backtrace, even with RUST_BACKTRACE=1 set
// (anyhow's Debug form would print frames after the cause).
#[test]
fn bad_config_names_the_field_without_a_backtrace() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("orchestrator.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:0\"\njournal = {:?}\ninsecure_plaintext = true\nresume_grace_ms = \"soon\"\n",
            dir.path().join("journal.sqlite").display().to_string()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pdwarden-orchestrator"))
        .arg("--config")
        .arg(&cfg)
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("pdwarden-orchestrator: "), "{err}");
    assert!(
        err.contains("resume_grace_ms") && err.contains("orchestrator.toml"),
        "{err}"
    );
    assert!(!err.to_lowercase().contains("backtrace"), "{err}");
    // Nothing was created for a config that was refused.
    assert!(!dir.path().join("journal.sqlite").exists());
}

/// Issue 16, finding 10: the orchestrator logged "listening" before failing
/// on its journal directory (or TLS files). Everything is loaded first: a
/// journal it cannot open is the error, and "listening" never appears.
#[test]
fn nothing_says_listening_before_everything_is_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("orchestrator.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:0\"\njournal = {:?}\ninsecure_plaintext = true\n",
            dir.path()
                .join("no-such-dir")
                .join("journal.sqlite")
                .display()
                .to_string()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pdwarden-orchestrator"))
        .arg("--config")
        .arg(&cfg)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("journal"), "{err}");
    assert!(!err.contains("listening"), "{err}");
}
