//! `rmm demo`: the main job. Runs a Dask-shaped workload through the runtime on every
//! configured device, with spilling and reinitialize between phases, checks its own results,
//! and prints its tables (or JSON); optionally a timeline picture (SVG or PNG) and a PyTorch
//! memory snapshot.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use parking_lot::Mutex;
use rmm::config::ConfigLoader;
use rmm_cli::demo::{DemoOptions, DemoSize, Progress};
use rmm_cli::timeline::PlotFormat;

use super::format::OutputArgs;
use super::output::OutputFile;

/// How much work (`--size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Size {
    /// 32 MiB of results per device: a smoke run in seconds.
    Tiny,
    /// 256 MiB of results per device; seconds without a GPU.
    Small,
    /// 2 GiB of results per device.
    Medium,
    /// 24 GiB of results per device: for real GPUs (about 30 GB of host memory per device
    /// holds the spilled data).
    Large,
}

/// Arguments of `rmm demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// How much work: results per device, and the spill limit (half of that) the demo sets.
    #[arg(long, value_enum, default_value_t = Size::Small)]
    pub size: Size,
    /// Draw memory over time per device (bytes in use on the device, spilled to pinned host
    /// memory and to disk, reserved), with the phases, reinitializes, spills and unspills: a
    /// PNG file when FILE ends in .png, else SVG.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Write the allocator's events as a PyTorch memory snapshot (a pickle), to open in
    /// PyTorch's memory_viz (https://pytorch.org/memory_viz) or `torch.cuda._memory_viz`.
    #[arg(long, value_name = "FILE.pickle")]
    pub torch_snapshot: Option<PathBuf>,
    /// --json (sizes in bytes, durations in seconds), --quiet (no progress, no report: the
    /// exit status says whether every check passed), --format.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// A progress bar per phase on a terminal; one line per phase otherwise.
struct Bars {
    terminal: bool,
    bar: Mutex<Option<ProgressBar>>,
}

impl Progress for Bars {
    fn phase(&self, name: &str, total: u64, unit: &str) {
        if self.terminal {
            if let Some(previous) = self.bar.lock().take() {
                previous.finish_and_clear();
            }
            let bar = ProgressBar::new(total);
            if let Ok(style) = ProgressStyle::with_template(
                "{msg:>14} [{bar:40}] {pos}/{len} {prefix} {elapsed_precise}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_message(name.to_string());
            bar.set_prefix(unit.to_string());
            *self.bar.lock() = Some(bar);
        } else {
            errln!("{name}: {total} {unit}");
        }
    }

    fn step(&self) {
        if let Some(b) = &*self.bar.lock() {
            b.inc(1);
        }
    }

    fn finish(&self, summary: &str) {
        if let Some(b) = self.bar.lock().take() {
            b.finish_and_clear();
        }
        errln!("{summary}");
    }

    fn note(&self, text: &str) {
        if let Some(b) = &*self.bar.lock() {
            b.suspend(|| errln!("rmm demo: {text}"));
        } else {
            errln!("rmm demo: {text}");
        }
    }
}

/// Runs `rmm demo`.
pub fn run(args: DemoArgs) -> Result<(), Box<dyn std::error::Error>> {
    // Output paths first: a bad one fails now, not after the whole run.
    let plot_format = args
        .plot
        .as_deref()
        .map(|p| PlotFormat::from_path("--plot", p))
        .transpose()?;
    let plot = OutputFile::open_optional("--plot", args.plot.as_deref())?;
    let snapshot = OutputFile::open_optional("--torch-snapshot", args.torch_snapshot.as_deref())?;
    let out = args.output;
    let progress: Arc<dyn Progress> = if !out.progress() {
        Arc::new(rmm_cli::demo::NoProgress)
    } else {
        Arc::new(Bars {
            terminal: std::io::stderr().is_terminal(),
            bar: Mutex::new(None),
        })
    };
    let report = rmm_cli::demo::run(DemoOptions {
        size: match args.size {
            Size::Tiny => DemoSize::Tiny,
            Size::Small => DemoSize::Small,
            Size::Medium => DemoSize::Medium,
            Size::Large => DemoSize::Large,
        },
        loader: ConfigLoader::new(),
        progress,
        sample_every: Duration::from_millis(10),
        record_events: args.torch_snapshot.is_some(),
    })?;
    if out.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else if out.text() {
        outln!("{}", report.render(out.table_format()))?;
    }
    if let (Some(file), Some(format)) = (plot, plot_format) {
        let path = file.path().to_path_buf();
        file.write(&rmm_cli::timeline::render(&report.timeline, format)?)?;
        if out.progress() {
            errln!("timeline: {}", path.display());
        }
    }
    if let Some(file) = snapshot {
        let path = file.path().to_path_buf();
        file.write(&rmm_cli::timeline::torch_snapshot_bytes(&report.timeline)?)?;
        if out.progress() {
            errln!("PyTorch memory snapshot: {}", path.display());
        }
    }
    Ok(())
}
