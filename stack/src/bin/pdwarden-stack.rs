//! `pdwarden-stack`: the local stack as a command. `pdwarden demo ARGS` and
//! `pdwarden soak ARGS` run it as `pdwarden-stack demo ARGS` / `soak ARGS`
//! (the CLI passes its `--ca`/`--cert`/`--key`/`--token` in the
//! environment); the commands themselves are [`pdwarden_stack::cli`].

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use pdwarden_stack::cli::{GivenCredentials, run_demo, run_soak};

#[derive(Parser)]
#[command(
    version,
    about = "pdwarden-stack: pdwarden's local stack (`pdwarden demo`, `pdwarden soak`)"
)]
struct Cli {
    #[command(flatten)]
    given: GivenCredentials,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a whole local stack (orchestrator, agent, two pd-sim engines, the
    /// real sglang-router) and run a real `restart pd-pair` against it.
    Demo(Box<pdwarden_stack::DemoArgs>),
    /// Co-restarts, verifications and gates on a local stack in a loop for
    /// a bounded time, the orchestrator and the agent killed at random, the
    /// invariants checked after each (exit 0 none violated, 2 any).
    Soak(pdwarden_stack::soak::SoakArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Demo(args) => run_demo(*args, cli.given.credentials()).await,
        Cmd::Soak(args) => run_soak(args).await,
    }
}
