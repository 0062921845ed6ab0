//! `rmm bench`: the allocator benchmark of `cargo bench --bench allocators` (`rmm_cli::bench`) on
//! the current backend, as aligned tables, markdown or JSON.

use clap::Args;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use rmm::allocator::Device;
use rmm::allocator::backend::{self, Backend, BackendKind, SimBackend, SimConfig, SimMemoryMode};
use rmm_cli::bench::{AllocatorBenchOptions, Resource, Scale, Shape, run_allocators_with};
use rmm_cli::units::bytes;

use super::format::OutputArgs;

/// Arguments of `rmm bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// How many operations: tiny (1 %: a smoke test of seconds, even without a GPU), small
    /// (10 %) or full (a million steps per single-thread trace, as `cargo bench --bench
    /// allocators` runs).
    #[arg(
        long,
        value_name = "SCALE",
        default_value = "small",
        value_parser = PossibleValuesParser::new(["tiny", "small", "full"])
            .try_map(|s| s.parse::<Scale>()),
    )]
    pub scale: Scale,
    /// --json (ns/op per resource and shape, the same-run speed-ups, the failures, the device
    /// and the options), --quiet, --format.
    #[command(flatten)]
    pub output: OutputArgs,
    /// Device ordinal to run on.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub device: u32,
    /// Resources to measure (table rows), comma-separated: cuda (cuMemAlloc per request), async
    /// (cuMemAllocAsync), pool (our PoolMemoryResource), binning (bins in front of the pool).
    /// Default: all.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        value_parser = PossibleValuesParser::new(["cuda", "async", "pool", "binning"])
            .try_map(|s| s.parse::<Resource>()),
    )]
    pub resources: Vec<Resource>,
    /// Workload shapes to run (table columns), comma-separated: churn (1 MiB allocate/free),
    /// random (256 B – 16 MiB under a cap), small (8 B – 64 KiB), mt8 and mt16 (random on 8 or
    /// 16 threads, each on its own stream), mt8-shared and mt16-shared (the same threads on one
    /// shared stream). Default: all.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        value_parser = PossibleValuesParser::new([
            "churn",
            "random",
            "small",
            "mt8",
            "mt16",
            "mt8-shared",
            "mt16-shared",
        ])
            .try_map(|s| s.parse::<Shape>()),
    )]
    pub shapes: Vec<Shape>,
    /// Timed passes per measurement, after one warm-up pass; the best is reported.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub rounds: u32,
}

/// The backend to measure: the process-wide one (`RMM_BACKEND`), except that a simulated
/// device is made unbacked (addresses only) unless `RMM_SIM_MODE` asks otherwise, so that the
/// figures are the resources' bookkeeping rather than the host's `calloc`.
fn bench_backend() -> Result<&'static dyn Backend, Box<dyn std::error::Error>> {
    let b = backend::global()?;
    if b.kind() != BackendKind::Sim || std::env::var_os("RMM_SIM_MODE").is_some() {
        return Ok(b);
    }
    Ok(SimBackend::leak(SimConfig {
        mode: SimMemoryMode::Unbacked,
        ..SimConfig::from_env()?
    })?)
}

/// Runs `rmm bench`.
pub fn run(args: BenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    let b = bench_backend()?;
    let props = Device::on(b, args.device)?.properties()?;
    let mut options = AllocatorBenchOptions {
        scale: args.scale.factor(),
        rounds: usize::try_from(args.rounds)?,
        device: args.device,
        ..AllocatorBenchOptions::default()
    };
    if !args.resources.is_empty() {
        options.resources = args.resources;
    }
    if !args.shapes.is_empty() {
        options.shapes = args.shapes;
    }
    let default_cap = options.cap;
    let options = options.fitted_to(props.total_memory);
    let simulated = b.kind() != BackendKind::Cuda;
    let note = "simulated device: the figures measure the resources' bookkeeping only (no \
                driver latency); run on a GPU for real costs";
    let out = args.output;
    if out.text() {
        outln!("backend: {}", b.describe())?;
        outln!(
            "device:  {} {} ({})",
            args.device,
            props.name,
            bytes(props.total_memory as u64)
        )?;
        if simulated {
            outln!("note:    {note}")?;
        }
        if options.cap < default_cap {
            outln!(
                "caps:    {} (random, mt8, mt16) and {} (small), fitted to the device",
                bytes(options.cap as u64),
                bytes(options.small_cap as u64)
            )?;
        }
    } else if simulated && out.progress() {
        errln!("{note}");
    }
    let total = options.resources.len();
    let mut done = 0;
    let report = run_allocators_with(b, &options, |row, failures| {
        done += 1;
        for f in failures {
            errln!("rmm bench: {f}");
        }
        if out.progress() {
            errln!("measured {} ({done}/{total})", row.resource);
        }
    })?;
    if out.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else if out.text() {
        outln!()?;
        out!("{}", report.render(out.table_format()))?;
    }
    match report.failures.len() {
        0 => Ok(()),
        n => Err(format!(
            "{} failed (see above); the table shows them as {}",
            rmm_cli::plural::count(n as u64, "measurement", "measurements"),
            rmm_cli::table::NONE
        )
        .into()),
    }
}
