//! Command-line interface of `rmm`.

mod bench;
mod demo;
mod info;
mod replay;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// rmm-rs: a memory runtime for multi-GPU worker processes.
#[derive(Debug, Parser)]
#[command(name = "rmm", version, about)]
pub struct Cli {
    /// Log filter (tracing `EnvFilter` syntax); `RMM_LOG` is read when this is absent.
    #[arg(long, global = true)]
    pub log: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure allocate/free cost per operation: cuMemAlloc, cuMemAllocAsync, pool, binning.
    ///
    /// Runs the workload shapes churn, random, small, mt8 and mt16 through each resource and
    /// prints ns/op with same-run speed-ups (markdown tables), or JSON with --json. Runs on the
    /// GPU if there is one (RMM_BACKEND), else on the simulated device (unbacked unless
    /// RMM_SIM_MODE says otherwise), where the figures measure bookkeeping only. The caps
    /// shrink on a device under 24 GiB, so that the pool (3 × 4 GiB) takes at most half of it.
    Bench(bench::BenchArgs),
    /// The main job: a Dask-shaped workload on every configured device (rmm.toml), with
    /// spilling under a limit and reinitialize between phases (pooled → plain allocations →
    /// pooled, data kept across); checks its own results and prints a table per device.
    Demo(demo::DemoArgs),
    /// Show the backend, every device with its memory, and the effective configuration.
    Info,
    /// Replay a memory event log (RMM's CSV format) against a resource: time, peak bytes and
    /// whether it fit.
    Replay(replay::ReplayArgs),
}

/// Installs the `tracing` subscriber that prints to standard error.
pub fn init_logging(cli: &Cli) {
    let filter = cli
        .log
        .clone()
        .or_else(|| std::env::var("RMM_LOG").ok())
        .unwrap_or_else(|| "warn".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new("warn")))
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    match cli.command {
        Command::Bench(args) => bench::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Info => info::run(),
        Command::Replay(args) => replay::run(args),
    }
}
