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
