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
    /// With `--gpu-report`: the NVML library (`libnvidia-ml.so`) to load
    /// instead of the system's search, as the config's `nvml_library`
    /// (a relative path is taken from the current directory).
    // `conflicts_with` too: clap waives `requires` for an argument that
    // conflicts with one given (`--gpu-report` with `--config`).
    #[arg(long, value_name = "PATH", requires = "gpu_report", conflicts_with = "config")]
    nvml_library: Option<PathBuf>,
    /// `human` (default) or `json`: one JSON object per line (timestamp,
    /// level, target, message and fields) for a log shipper.
    #[arg(long, value_enum, env = "PDWARDEN_LOG_FORMAT", default_value = "human")]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

/// Runtime workers unless `TOKIO_WORKER_THREADS` says otherwise. An agent
/// supervises a handful of processes and keeps one stream open; tokio's
/// default of one worker per CPU would start 16 on a GPU test machine and
/// hundreds on an 8-GPU node. Measured on a 16-CPU H200 machine (bench section
/// 6): 16 workers → 2 took the idle agent from 11.1 to 9.9 MiB RSS and from
/// 0.47 % to 0.43 % of a core. NVML reads run on the blocking pool, not here.
const AGENT_WORKER_THREADS: usize = 2;

fn main() -> ExitCode {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        runtime.worker_threads(AGENT_WORKER_THREADS);
    }
    let result = match runtime.build() {
        Ok(rt) => rt.block_on(agent()),
        Err(e) => Err(anyhow::Error::new(e).context("starting the async runtime")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One readable line (with causes), no backtrace.
            eprintln!("pdwarden-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn agent() -> anyhow::Result<()> {
    let args = Args::parse();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        // Log lines quote engines (stack readings, log tails, errors): every
        // control byte is shown escaped, so no colour either (issue 48).
        .with_writer(|| pdwarden_security::terminal::Escaping(std::io::stderr()));
    match args.log_format {
        LogFormat::Human => logs.with_ansi(false).init(),
        LogFormat::Json => logs.json().init(),
    }
    if let Some(source) = &args.gpu_report {
        // Absolute, so a bare file name is that file here, not a name for
        // the system's library search.
        let library = args
            .nvml_library
            .as_deref()
            .map(std::path::absolute)
            .transpose()
            .context("--nvml-library")?;
        let spec = pdwarden_agent::gpu::GpuSourceSpec::parse(source)
            .map_err(|e| anyhow::anyhow!("--gpu-report: {e}"))?
            .with_nvml_library(library);
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
