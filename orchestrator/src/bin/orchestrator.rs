//! `pdwarden-orchestrator --config PATH`: parses flags, binds, and runs the
//! library's server until SIGTERM or Ctrl-C.
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use pdwarden_orchestrator::config::OrchestratorConfig;

#[derive(Parser)]
#[command(
    version,
    about = "pdwarden orchestrator: knows the PD pairs and runs their operations"
)]
struct Args {
    /// Orchestrator TOML config.
    #[arg(long)]
    config: PathBuf,
    /// `human` (default) or `json`: one JSON object per line (timestamp,
    /// level, target, message and fields) for a log shipper.
    #[arg(long, value_enum, env = "PDWARDEN_LOG_FORMAT", default_value = "human")]
    log_format: LogFormat,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

#[tokio::main]
async fn main() -> ExitCode {
    match orchestrator().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One readable line (with causes) that names the field, never a
            // backtrace: with RUST_BACKTRACE=1 set, anyhow's Debug form would
            // bury the cause under frames.
            eprintln!("pdwarden-orchestrator: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn orchestrator() -> anyhow::Result<()> {
    let args = Args::parse();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        // Log lines quote engines (stack readings, log tails, errors): every
        // control byte is shown escaped, so no colour either (issue 48).
        .with_writer(|| pdwarden_security::terminal::Escaping(std::io::stderr()));
    match args.log_format {
        LogFormat::Human => logs.with_ansi(false).init(),
        LogFormat::Json => logs.json().init(),
    }
    let config = OrchestratorConfig::load(&args.config)?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {} (field `listen`)", config.listen))?;
    let shutdown = async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("install SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {},
            _ = tokio::signal::ctrl_c() => {},
        }
        tracing::info!("shutting down");
    };
    pdwarden_orchestrator::edge::server::serve(listener, config, shutdown).await?;
    Ok(())
}
