//! The `pdwarden-stack` binary's commands: `demo` and `soak` with their
//! signals, `--hold`, printing and exit codes. `pdwarden demo ARGS` and
//! `pdwarden soak ARGS` run `pdwarden-stack demo ARGS` / `soak ARGS` (the
//! way git runs its external subcommands), so the CLI links neither the
//! stack nor the daemons.
//!
//! Exit codes, as the CLI's: 0 healthy (the soak: no invariant violated),
//! 2 any other verdict (any violated), 1 could not run, with a one-line
//! reason (and `{"error": ...}` on stdout under `--json`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use pdwarden_client::{Credentials, print_json};
use tokio::signal::unix::{SignalKind, signal};

use crate::demo::{self, DemoArgs, DemoOutcome};
use crate::soak::SoakArgs;

/// The credentials the caller gives, from the same flags and environment
/// variables as the `pdwarden` CLI's (which sets the variables from its
/// own flags when it runs `pdwarden-stack`). The demo uses them where it
/// makes none itself (`--insecure-plaintext`).
#[derive(Args, Debug, Clone, Default)]
pub struct GivenCredentials {
    /// The pdwarden CA certificate, to verify an https:// orchestrator.
    #[arg(long, global = true, env = "PDWARDEN_CA")]
    pub ca: Option<PathBuf>,
    /// A client certificate to present (optional for the operator API).
    #[arg(long, global = true, env = "PDWARDEN_CERT", requires = "key")]
    pub cert: Option<PathBuf>,
    /// The client certificate's key.
    #[arg(long, global = true, env = "PDWARDEN_KEY", requires = "cert")]
    pub key: Option<PathBuf>,
    /// Operator token (`pdwarden certs token NAME` mints one); prefer the
    /// environment variable, which does not show in `ps`.
    #[arg(long, global = true, env = "PDWARDEN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Accepted and unused, as `pdwarden demo --orchestrator URL` always
    /// was: the demo starts its own orchestrator.
    #[arg(long, global = true, hide = true)]
    pub orchestrator: Option<String>,
}

impl GivenCredentials {
    pub fn credentials(self) -> Credentials {
        Credentials {
            ca: self.ca,
            cert: self.cert,
            key: self.key,
            token: self.token,
        }
    }
}

/// One line on stderr (and `{"error": ...}` on stdout under `--json`);
/// exit 1.
pub fn could_not_run(reason: &str, json: bool) -> ExitCode {
    if json {
        pdwarden_client::say!("{}", serde_json::json!({ "error": reason }));
    }
    pdwarden_client::say_err!("pdwarden: {reason}");
    ExitCode::from(1)
}

/// `pdwarden demo`: the demo's outcome, held with `--hold` until SIGTERM
/// or Ctrl-C. `given`: the caller's credentials, used where the demo makes
/// none (`--insecure-plaintext`).
pub async fn run_demo(args: DemoArgs, given: Credentials) -> ExitCode {
    let mut term = match signal(SignalKind::terminate()) {
        Ok(t) => t,
        Err(e) => return could_not_run(&format!("demo: cannot handle SIGTERM: {e}"), args.json),
    };
    // Ctrl-C or SIGTERM while it runs drops the demo: every process it
    // started is stopped by PID (`crate::process::Owned`).
    let demo = tokio::select! {
        d = demo::start(&args, given) => d,
        _ = tokio::signal::ctrl_c() => return could_not_run("demo: interrupted", args.json),
        _ = term.recv() => return could_not_run("demo: interrupted", args.json),
    };
    let DemoOutcome { code, json, error } = demo.outcome.clone();
    if let Some(reason) = error {
        demo.stop(args.keep, args.json);
        return could_not_run(&reason, args.json);
    }
    if args.json {
        print_json(&json);
    }
    if args.hold
        && let Some(stack) = &demo.stack
    {
        if !args.json {
            pdwarden_client::say!(
                "\ndemo: holding the stack; try `{}`; Ctrl-C to stop",
                demo::hold_hint(stack)
            );
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = term.recv() => {},
        }
    }
    demo.stop(args.keep, args.json);
    ExitCode::from(code)
}

/// `pdwarden soak`: the soak's report, exit 0 with no invariant violated,
/// 2 with any, 1 if it could not run. Ctrl-C or SIGTERM stops it (its stack
/// stopped by PID).
pub async fn run_soak(args: SoakArgs) -> ExitCode {
    let mut term = match signal(SignalKind::terminate()) {
        Ok(t) => t,
        Err(e) => return could_not_run(&format!("soak: cannot handle SIGTERM: {e}"), args.json),
    };
    let report = tokio::select! {
        r = crate::soak::run(&args) => r,
        _ = tokio::signal::ctrl_c() => return could_not_run("soak: interrupted", args.json),
        _ = term.recv() => return could_not_run("soak: interrupted", args.json),
    };
    match report {
        Err(e) => could_not_run(&format!("soak: {e:#}"), args.json),
        Ok(r) => {
            if args.json {
                print_json(&r);
            } else {
                pdwarden_client::say_part!("{}", r.render());
            }
            if r.violations.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            }
        }
    }
}
