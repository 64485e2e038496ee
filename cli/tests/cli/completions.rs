//! Issue 18: `pdwarden completions SHELL` and `--help` with examples.

use std::process::Command;

fn pdwarden(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pdwarden"))
        .args(args)
        .output()
        .unwrap()
}

/// The bash script loads in a real bash and registers completion for
/// `pdwarden`, offering its subcommands; the other shells print a script;
/// an unknown shell is refused naming the argument and the shells.
#[test]
fn completions_load_in_bash_and_name_the_subcommands() {
    let out = pdwarden(&["completions", "bash"]);
    assert!(out.status.success());
    let script = String::from_utf8(out.stdout).unwrap();
    for sub in ["restart", "verify", "status", "history", "gate", "demo", "completions"] {
        assert!(script.contains(sub), "{sub} missing from the bash completions");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pdwarden.bash");
    std::fs::write(&path, &script).unwrap();
    let bash = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {:?} && complete -p pdwarden && COMP_WORDS=(pdwarden re); COMP_CWORD=1; _pdwarden pdwarden re pdwarden && printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            path
        ))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&bash.stdout);
    assert!(bash.status.success(), "{said}{}", String::from_utf8_lossy(&bash.stderr));
    assert!(
        said.contains("complete") && said.lines().any(|l| l == "restart"),
        "{said}"
    );
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let out = pdwarden(&["completions", shell]);
        assert!(out.status.success() && !out.stdout.is_empty(), "{shell}");
    }
    let bad = pdwarden(&["completions", "tcsh"]);
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("tcsh") && err.contains("<SHELL>") && err.contains("bash"),
        "{err}"
    );
}

#[test]
fn help_shows_examples_and_exit_codes() {
    let out = pdwarden(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(
        help.contains("Examples:") && help.contains("pdwarden restart pd-pair demo"),
        "{help}"
    );
    assert!(help.contains("Exit codes: 0"), "{help}");
}
