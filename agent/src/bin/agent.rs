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
    #[arg(long, value_name = "PATH", required_unless_present = "gpu_report")]
    config: Option<PathBuf>,
    /// Print one reading of this GPU source (`nvml`, `auto`, `fake:PATH`) in
    /// the fake GPU file's format and exit: a real GPU's reading becomes a
    /// fixture the fake source can replay.
    #[arg(long, value_name = "SOURCE", conflicts_with = "config")]
    gpu_report: Option<String>,
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
        // Colour only on a terminal: logs under systemd or in files stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    if let Some(source) = &args.gpu_report {
        let spec =
            pdwarden_agent::gpu::GpuSourceSpec::parse(source).map_err(|e| anyhow::anyhow!("--gpu-report: {e}"))?;
        let json = tokio::task::spawn_blocking(move || pdwarden_agent::gpu::report_json(&spec))
            .await?
            .with_context(|| format!("--gpu-report {source}"))?;
        println!("{json}");
        return Ok(());
    }
    let path = args.config.context("--config is required")?;
    let config = AgentConfig::load(&path).with_context(|| format!("loading {}", path.display()))?;
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
