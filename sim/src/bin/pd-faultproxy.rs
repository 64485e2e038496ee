//! `pd-faultproxy`: parse flags, validate them, bind, print the listening line on stdout,
//! proxy until SIGTERM/SIGINT (see [`pd_sim::faultproxy`]). A bad flag is one line on
//! stderr naming it, and exit status 2.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};

use pd_sim::faultproxy::{Args, FaultError, one_line_clap_error, serve};

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("pd-faultproxy: {message}");
    ExitCode::from(2)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) =>
        {
            e.exit()
        }
        Err(e) => return fail(one_line_clap_error(&e)),
    };
    let config = match args.validate() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(l) => l,
        Err(source) => {
            return fail(FaultError::Bind {
                addr: config.listen.to_string(),
                source,
            });
        }
    };
    let bound = match listener.local_addr() {
        Ok(a) => a,
        Err(source) => {
            return fail(FaultError::Bind {
                addr: config.listen.to_string(),
                source,
            });
        }
    };
    let (mut term, mut int) = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(t), Ok(i)) => (t, i),
        (Err(e), _) | (_, Err(e)) => return fail(format!("cannot install signal handlers: {e}")),
    };
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "pd-faultproxy listening on {bound}");
        let _ = out.flush();
    }
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    match serve(listener, config.upstream, config.faults, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}
