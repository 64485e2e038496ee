//! `pdwarden demo`: the CLI's side of the local stack (`pdwarden-stack`):
//! signals, `--hold`, printing, the exit code.

use std::process::ExitCode;

use pdwarden_orchestrator::edge::client::{Credentials, print_json};
use pdwarden_stack::{DemoArgs, DemoOutcome, demo};
use tokio::signal::unix::{SignalKind, signal};

use crate::could_not_run;

/// `given`: the CLI's own credentials, used where the demo makes none
/// (`--insecure-plaintext`).
pub async fn run(args: DemoArgs, given: Credentials) -> ExitCode {
    let mut term = match signal(SignalKind::terminate()) {
        Ok(t) => t,
        Err(e) => return could_not_run(&format!("demo: cannot handle SIGTERM: {e}"), args.json),
    };
    // Ctrl-C or SIGTERM while it runs drops the demo: every process it
    // started is stopped by PID (`pdwarden_stack::process::Owned`).
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
            pdwarden_orchestrator::say!(
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
pub async fn soak(args: pdwarden_stack::soak::SoakArgs) -> ExitCode {
    let mut term = match signal(SignalKind::terminate()) {
        Ok(t) => t,
        Err(e) => return could_not_run(&format!("soak: cannot handle SIGTERM: {e}"), args.json),
    };
    let report = tokio::select! {
        r = pdwarden_stack::soak::run(&args) => r,
        _ = tokio::signal::ctrl_c() => return could_not_run("soak: interrupted", args.json),
        _ = term.recv() => return could_not_run("soak: interrupted", args.json),
    };
    match report {
        Err(e) => could_not_run(&format!("soak: {e:#}"), args.json),
        Ok(r) => {
            if args.json {
                print_json(&r);
            } else {
                pdwarden_orchestrator::say_part!("{}", r.render());
            }
            if r.violations.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            }
        }
    }
}
