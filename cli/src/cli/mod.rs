//! Command-line interface of `rmm`.
//!
//! Output goes through [`outln!`] and [`errln!`], never `println!`: a closed pipe
//! (`rmm info | head -1`) ends the command quietly (see [`is_broken_pipe`]) instead of
//! panicking.

/// `println!` that returns the write's `io::Result` instead of panicking when standard
/// output is gone (a closed pipe).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// `print!` that returns the write's `io::Result` (see [`outln!`]).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// `eprintln!` that drops the line when standard error is gone, instead of panicking.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

pub(crate) use errln;

mod bench;
mod completions;
mod demo;
mod format;
mod info;
mod output;
mod replay;

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGXFSZ};
use signal_hook::iterator::Signals;

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
    /// prints ns/op with same-run speed-ups (aligned tables, markdown with --format markdown,
    /// or JSON with --json). Runs on the GPU, or with RMM_BACKEND=sim on the simulated device
    /// (unbacked unless RMM_SIM_MODE says otherwise), where the figures measure bookkeeping
    /// only. The caps
    /// shrink on a device under 24 GiB, so that the pool (3 × 4 GiB) takes at most half of it.
    Bench(bench::BenchArgs),
    /// Print the shell completion script for rmm (bash, zsh, fish, elvish, powershell).
    Completions(completions::CompletionsArgs),
    /// The main job: a Dask-shaped workload on every configured device (rmm.toml), with
    /// spilling under a limit and reinitialize between phases (pooled → plain allocations →
    /// pooled, data kept across); checks its own results and prints its tables (phases per
    /// device, reinitializes, spill tiers).
    Demo(demo::DemoArgs),
    /// Show the backend, every device with its memory, and the effective configuration.
    Info(info::InfoArgs),
    /// Replay a memory event log (RMM's CSV format) against a resource: time, peak bytes and
    /// whether it fit.
    Replay(replay::ReplayArgs),
}

/// Whether `e` (or an error it wraps) is a write to a closed pipe: the reader went away
/// (`rmm info | head -1`), so the command ends quietly.
pub fn is_broken_pipe(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// Signals that end `rmm` after it removed its spill files.
const ENDING: [i32; 3] = [SIGINT, SIGTERM, SIGHUP];

/// Makes every way out of `rmm` leave no spill file behind:
///
/// * SIGINT, SIGTERM and SIGHUP: a thread removes this process's spill files (new ones can no
///   longer be created), then exits with status 128 + the signal, as the shell reports a
///   process killed by it;
/// * SIGXFSZ (a write past `ulimit -f`): handled instead of fatal, so that the write fails
///   with EFBIG and the spill reports an error (and removes its file).
///
/// A handler that cannot be installed is logged; the command runs on without it.
pub fn handle_signals() {
    if let Err(e) = signal_hook::flag::register(SIGXFSZ, Arc::new(AtomicBool::new(false))) {
        tracing::warn!("cannot handle SIGXFSZ ({e}): a write past `ulimit -f` kills rmm");
    }
    let mut signals = match Signals::new(ENDING) {
        Ok(signals) => signals,
        Err(e) => {
            tracing::warn!(
                "cannot handle SIGINT/SIGTERM ({e}): interrupting rmm may leave spill files, \
                 which the next run in that directory removes"
            );
            return;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("rmm-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                let removed = rmm::allocator::spill::remove_files_for_exit();
                errln!(
                    "rmm: stopped by {}; removed {}",
                    signal_hook::low_level::signal_name(signal).unwrap_or("a signal"),
                    rmm_cli::plural::count(removed as u64, "spill file", "spill files")
                );
                std::process::exit(128 + signal);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the signal-handling thread ({e})");
    }
}

/// Installs the `tracing` subscriber that prints to standard error, in colour only when
/// standard error is a terminal (and `NO_COLOR` is unset): a log file or a pipe gets plain
/// text.
pub fn init_logging(cli: &Cli) {
    let filter = cli
        .log
        .clone()
        .or_else(|| std::env::var("RMM_LOG").ok())
        .unwrap_or_else(|| "warn".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new("warn")))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .try_init();
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    match cli.command {
        Command::Bench(args) => bench::run(args),
        Command::Completions(args) => completions::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Info(args) => info::run(args),
        Command::Replay(args) => replay::run(args),
    }
}
