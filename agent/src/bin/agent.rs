//! `pdwarden-agent --config PATH`: loads the config and runs the agent until
//! SIGTERM or SIGINT.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use pdwarden_agent::AgentConfig;
use tokio::signal::unix::{SignalKind, signal};

/// pdwarden's per-host agent: supervises engines and routers, detects their
/// start-up phases, runs probes, and reports to the orchestrator.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Path to the agent's TOML config.
    #[arg(long, value_name = "PATH")]
    config: PathBuf,
}

#[tokio::main]
async fn main() -> ExitCode {
    match agent().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One readable line (with causes), no backtrace.
            eprintln!("pdwarden-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn agent() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let config = AgentConfig::load(&args.config).with_context(|| format!("loading {}", args.config.display()))?;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    };
    pdwarden_agent::run(config, shutdown).await?;
    Ok(())
}
