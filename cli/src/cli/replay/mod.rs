//! `rmm replay`: plays a memory event log (RMM's CSV format) against a resource and says how
//! long it took, the peak bytes in use and whether every allocation fit; `--plot` and
//! `--torch-snapshot` write its memory over time as a picture (SVG or PNG, on the log's clock)
//! and as a PyTorch memory snapshot.

use std::any::Any;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use clap::{Args, ValueEnum};
use parking_lot::Mutex;
use rmm::allocator::adaptor::find_in_chain;
use rmm::allocator::backend::DevicePtr;
use rmm::allocator::backend::{self, MemInfo, SimBackend, SimConfig, SimMemoryMode};
use rmm::allocator::event_log::LogReader;
use rmm::allocator::resource::DeviceMemoryResource;
use rmm::allocator::resource::SharedResource;
use rmm::allocator::resource::{
    BinningMemoryResource, CudaAsyncMemoryResource, CudaMemoryResource, ManagedMemoryResource,
    PoolMemoryResource,
};
use rmm::allocator::{Device, StreamView};
use rmm::config::Size;
use rmm_cli::replay::{ReplayOptions, ReplayOrder, replay_streamed};
use rmm_cli::timeline::{
    Action, DEFAULT_TRACE_ENTRIES, MemoryEvent, PlotFormat, Recorder, TorchTrace, render,
    torch_snapshot_of,
};
use rmm_cli::units::bytes;

use super::format::OutputArgs;
use super::output::OutputFile;

mod clock;
mod report;

/// The resource to replay against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ResourceKind {
    /// `cuMemAlloc` / `cuMemFree` for every request.
    Cuda,
    /// A pool over `cuMemAlloc` (sized by --pool-initial / --pool-maximum).
    Pool,
    /// The driver's stream-ordered allocator (`cuMemAllocAsync`).
    Async,
    /// Managed (unified) memory.
    Managed,
    /// Power-of-two bins (256 B – 128 KiB) in front of a pool.
    Binning,
}

/// The order of events across threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Order {
    /// Every event after the one before it in the log, on one thread (the logged peak is
    /// reproduced).
    Logged,
    /// One thread per logged thread (up to the machine's hardware threads, and at least 64;
    /// more logged threads share them), each in its own order; cross-thread frees wait for
    /// their allocation (the default: times the resource as the threads used it).
    Concurrent,
}

/// Arguments of `rmm replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The log: a CSV file with the header Thread,Time,Action,Pointer,Size,Stream, read once
    /// as it is replayed; `-` reads standard input (e.g. `zcat log.csv.gz | rmm replay -`).
    #[arg(value_name = "LOG")]
    pub file: PathBuf,
    /// The resource to replay against.
    #[arg(long, value_enum, default_value_t = ResourceKind::Pool)]
    pub resource: ResourceKind,
    /// Replay on a simulated device of this capacity (e.g. 40GiB) whose memory is addresses
    /// only: answers "would this fit on that GPU" on any machine.
    #[arg(long, value_name = "SIZE", value_parser = parse_capacity)]
    pub simulate_capacity: Option<u64>,
    /// Initial pool size: bytes, a size such as 2GiB, or a share of device memory such as 50%;
    /// 0 starts empty (default: half of the free memory).
    #[arg(long, value_name = "SIZE", value_parser = parse_initial)]
    pub pool_initial: Option<Size>,
    /// Maximum pool size (default: the device's memory).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub pool_maximum: Option<Size>,
    /// Pool growth step: the pool grows by what a request needs rounded up to this (default
    /// 1GiB; a share of device memory such as 5% works too).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub pool_growth: Option<Size>,
    /// Keep the pool within this share above the peak in use (e.g. 5%): before growing past
    /// it, the pool gives free memory back (default: no limit).
    #[arg(long, value_name = "PERCENT", value_parser = parse_overhead)]
    pub pool_max_overhead: Option<f64>,
    /// Order of events across threads. The log is read as it is replayed: memory does not
    /// grow with its length (nor with --plot or --torch-snapshot).
    #[arg(long, value_enum, default_value_t = Order::Concurrent)]
    pub order: Order,
    /// Device ordinal to replay on.
    #[arg(long, default_value_t = 0)]
    pub device: u32,
    /// Draw the replay's memory over time (bytes in use and reserved) on the log's clock: a
    /// PNG file when FILE ends in .png, else SVG. Up to 20000 events are drawn one by one;
    /// past that, each of 2048 time bins by its first, last, highest and lowest values.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Write the replay's allocator events as a PyTorch memory snapshot (a pickle) to this
    /// file, for https://pytorch.org/memory_viz or torch.cuda._memory_viz.
    #[arg(long, value_name = "FILE")]
    pub torch_snapshot: Option<PathBuf>,
    /// The trace entries the PyTorch snapshot keeps: the last N, as PyTorch's
    /// `torch.cuda.memory._record_memory_history(max_entries=N)` (the segments and blocks
    /// live at the end are all there, whatever N).
    #[arg(
        long,
        value_name = "N",
        default_value_t = DEFAULT_TRACE_ENTRIES,
        value_parser = parse_entries,
        requires = "torch_snapshot"
    )]
    pub torch_trace_entries: usize,
    /// --json (sizes in bytes, the time in seconds), --quiet (the exit status says whether
    /// the log fit), --format.
    #[command(flatten)]
    pub output: OutputArgs,
}

fn parse_size(text: &str) -> Result<Size, String> {
    text.parse::<Size>().map_err(|e| {
        format!("{e}: expected bytes, a size with a unit such as 2GiB or 512MB, or a percentage")
    })
}

fn parse_overhead(text: &str) -> Result<f64, String> {
    match parse_size(text)? {
        Size::Fraction(f) => Ok(f),
        Size::Bytes(_) => Err(format!(
            "expected a share of the peak in use such as 5%, not the size {text}"
        )),
    }
}

fn parse_entries(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "expected a number of trace entries of at least 1, such as {DEFAULT_TRACE_ENTRIES}"
        )),
    }
}

fn parse_initial(text: &str) -> Result<Size, String> {
    if text.trim() == "0" {
        return Ok(Size::Bytes(0));
    }
    parse_size(text)
}

fn parse_capacity(text: &str) -> Result<u64, String> {
    match parse_size(text)? {
        Size::Bytes(b) => Ok(b),
        Size::Fraction(_) => Err("expected a capacity in bytes such as 40GiB, not a share".into()),
    }
}

/// A pool's upstream while a timeline is recorded: records the chunks the pool takes at
/// construction and every chunk it gives back as segment events, which no memory hook
/// reports (the pool's growth is reported by its own `alloc_*` hooks, which the recorder
/// sees). Otherwise it is its inner resource: same name, same memory.
#[derive(Debug)]
struct ChunkTap {
    inner: SharedResource,
    recorder: Arc<Recorder>,
    constructing: AtomicBool,
}

impl ChunkTap {
    fn record(&self, action: Action, ptr: DevicePtr, bytes: usize, stream: StreamView) {
        self.recorder.record(
            self.inner.device().ordinal(),
            MemoryEvent {
                t: self.recorder.now(),
                action,
                addr: ptr.0,
                size: bytes as u64,
                stream: stream.raw(),
            },
        );
    }
}

impl DeviceMemoryResource for ChunkTap {
    fn allocate(&self, bytes: usize, stream: StreamView) -> rmm::allocator::Result<DevicePtr> {
        let p = self.inner.allocate(bytes, stream)?;
        if self.constructing.load(Ordering::Relaxed) && !p.is_null() {
            self.record(Action::SegmentAlloc, p, bytes, stream);
        }
        Ok(p)
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        stream: StreamView,
    ) -> rmm::allocator::Result<()> {
        self.inner.deallocate(ptr, bytes, stream)?;
        self.record(Action::SegmentFree, ptr, bytes, stream);
        Ok(())
    }

    fn device(&self) -> Device {
        self.inner.device()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
        match other.as_any().downcast_ref::<ChunkTap>() {
            Some(o) => self.inner.is_equal(&*o.inner),
            None => self.inner.is_equal(other),
        }
    }

    fn memory_info(&self) -> rmm::allocator::Result<MemInfo> {
        self.inner.memory_info()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn build(
    args: &ReplayArgs,
    device: Device,
    recorder: Option<&Arc<Recorder>>,
) -> Result<SharedResource, Box<dyn std::error::Error>> {
    let cuda: SharedResource = Arc::new(CudaMemoryResource::new(device));
    let pool = || -> Result<SharedResource, Box<dyn std::error::Error>> {
        let tap = recorder.map(|r| {
            Arc::new(ChunkTap {
                inner: Arc::clone(&cuda),
                recorder: Arc::clone(r),
                constructing: AtomicBool::new(true),
            })
        });
        let upstream: SharedResource = match &tap {
            Some(t) => Arc::clone(t) as SharedResource,
            None => Arc::clone(&cuda),
        };
        // Fractions are of the device's memory, resolved as the configuration's are.
        let total = device.mem_info()?.total as u64;
        let mut b = PoolMemoryResource::builder(upstream);
        if let Some(s) = args.pool_initial {
            b = b.initial_size(s.resolve(total));
        }
        if let Some(s) = args.pool_maximum {
            b = b.maximum_size(s.resolve(total));
        }
        if let Some(s) = args.pool_growth {
            b = b.growth(s.resolve(total));
        }
        if let Some(f) = args.pool_max_overhead {
            b = b.max_overhead(f);
        }
        let pool = b.build()?;
        if let Some(t) = tap {
            t.constructing.store(false, Ordering::Relaxed);
        }
        Ok(Arc::new(pool))
    };
    Ok(match args.resource {
        ResourceKind::Cuda => Arc::clone(&cuda),
        ResourceKind::Pool => pool()?,
        ResourceKind::Async => Arc::new(CudaAsyncMemoryResource::new(device)?),
        ResourceKind::Managed => Arc::new(ManagedMemoryResource::new(device)?),
        ResourceKind::Binning => Arc::new(BinningMemoryResource::with_bins(pool()?, 8, 17)?),
    })
}

/// Runs `rmm replay`.
pub fn run(args: ReplayArgs) -> Result<(), Box<dyn std::error::Error>> {
    let out = args.output;
    // Output paths first, then the log's header: a bad path, or a file that is no log, is
    // reported before any device is touched.
    let plot_format = args
        .plot
        .as_deref()
        .map(|p| PlotFormat::from_path("--plot", p))
        .transpose()?;
    let plot = OutputFile::open_optional("--plot", args.plot.as_deref())?;
    let snapshot = OutputFile::open_optional("--torch-snapshot", args.torch_snapshot.as_deref())?;
    // The log is opened once and read once, as it is replayed (a pipe works: `-` is standard
    // input); a plot and a snapshot take its events on the way. Memory does not grow with
    // its length.
    let stdin = std::io::stdin();
    let log = if args.file.as_os_str() == "-" {
        LogReader::new(stdin.lock(), "standard input")?
    } else {
        LogReader::open(&args.file)?
    };
    if let Some(capacity) = args.simulate_capacity {
        let sim = SimBackend::leak(SimConfig {
            devices: 1,
            capacity: usize::try_from(capacity)?,
            mode: SimMemoryMode::Unbacked,
        })?;
        if backend::install_global(sim).is_err() {
            return Err("--simulate-capacity: a backend was already chosen in this process".into());
        }
    }
    let b = backend::global()?;
    let device = Device::new(args.device)?;
    let total = device.mem_info()?.total;
    let new_trace = |entries| TorchTrace::new(args.device, Some(total as u64), Some(entries));
    // The pool's events, as they happen: for a plot, both its segments (a plot on the log's
    // clock) and its samples (on the replay's, when the log turns out to have no times).
    let hooked = (plot.is_some() || snapshot.is_some()).then(|| {
        Arc::new(Mutex::new(clock::Hooked::new(
            args.device,
            plot.is_some(),
            plot.is_some(),
            snapshot
                .is_some()
                .then(|| new_trace(args.torch_trace_entries)),
        )))
    });
    let recorder = hooked.as_ref().map(|h| {
        let h = Arc::clone(h);
        Arc::new(Recorder::streaming(
            Instant::now(),
            Box::new(move |device, e: &MemoryEvent| h.lock().event(device, e)),
        ))
    });
    let guard = recorder.as_ref().map(Recorder::register);
    let resource = build(&args, device, recorder.as_ref())?;
    let options = ReplayOptions {
        order: match args.order {
            Order::Logged => ReplayOrder::Logged,
            Order::Concurrent => ReplayOrder::Concurrent,
        },
        default_stream_only: false,
        max_threads: 0,
    };
    // The log's own events: for a plot on its clock (or of a resource without hooks), and for
    // a snapshot of a resource without hooks.
    let mut pass = hooked.as_ref().map(|h| {
        clock::LogPass::new(
            plot.is_some(),
            snapshot
                .is_some()
                .then(|| new_trace(args.torch_trace_entries)),
            Some(Arc::clone(h)),
        )
    });
    let log = match &mut pass {
        Some(pass) => log.inspect(|line| pass.push(line)),
        None => log,
    };
    let report = replay_streamed(log, &*resource, &options)?;
    drop(guard);
    let pool = find_in_chain::<PoolMemoryResource>(&*resource).map(|p| {
        let u = p.usage();
        format!(
            "{}; {} chunks taken from the device, {} given back",
            u.summary(),
            u.device_allocations,
            u.device_frees
        )
    });
    // Files written: (what, path, where the events came from).
    let mut written: Vec<(&str, PathBuf, String)> = Vec::new();
    if let (Some(hooked), Some(pass)) = (hooked, pass) {
        let source = std::path::Path::new(&report.source);
        let name = source.file_name().map_or_else(
            || report.source.clone(),
            |n| n.to_string_lossy().into_owned(),
        );
        // What the hooks saw, taken out now: the resource may still report its end.
        let (from_hooks, snapshot_from_hooks, segments, replay_clock, hook_trace, hook_oom_t) = {
            let mut h = hooked.lock();
            let oom_t = report
                .failure
                .as_ref()
                .map_or(0.0, |f| h.oom_time(f.bytes as u64));
            (
                h.served_any(),
                h.reported_any(),
                h.take_segments(),
                h.take_sampler(),
                h.take_torch(),
                oom_t,
            )
        };
        let segments = if from_hooks { segments } else { Vec::new() };
        let passed = pass.finish(segments, report.failure.as_ref());
        // A plot is on the log's clock when it has times, else on the replay's.
        let timed = passed.timed;
        let log_plot = plot.is_some() && (timed || !from_hooks);
        let (log_sampler, log_trace, failure_t) = (passed.sampler, passed.torch, passed.failure_t);
        if let (Some(file), Some(format)) = (plot, plot_format) {
            let (sampler, oom_t) = if log_plot {
                (log_sampler, failure_t)
            } else {
                (replay_clock, hook_oom_t)
            };
            let sampler = sampler.unwrap_or_default();
            let (events, binned) = (sampler.events(), sampler.is_binned());
            let sampled = sampler.finish();
            let points = sampled.0.len();
            let timeline =
                clock::plot_timeline(&name, args.device, total as u64, &report, sampled, oom_t);
            let path = file.path().to_path_buf();
            file.write(&render(&timeline, format)?)?;
            let mut about = clock::plot_source(timed, from_hooks).to_string();
            if binned {
                about.push_str(&format!("; {events} events drawn as {points} points"));
            }
            written.push(("plot", path, about));
        }
        if let Some(file) = snapshot {
            let (trace, source) = if snapshot_from_hooks {
                (hook_trace, "from the pool's events")
            } else {
                (
                    log_trace,
                    "from the log's events: the resource reports none",
                )
            };
            let trace = trace.unwrap_or_else(|| new_trace(args.torch_trace_entries));
            let kept = if trace.dropped_entries() > 0 {
                format!(
                    " (the last {} of {} trace entries: --torch-trace-entries keeps more)",
                    trace.entries(),
                    trace.entries() as u64 + trace.dropped_entries()
                )
            } else {
                String::new()
            };
            let path = file.path().to_path_buf();
            file.write(&torch_snapshot_of(std::slice::from_ref(&trace))?)?;
            written.push((
                "snapshot",
                path,
                format!(
                    "PyTorch memory snapshot {source}{kept}; open it at \
                     https://pytorch.org/memory_viz"
                ),
            ));
        }
    }
    if out.json {
        let mut doc = report::json(&report, total as u64, &b.describe());
        for (what, path, about) in &written {
            doc[*what] = serde_json::json!({ "path": path, "about": about });
        }
        outln!("{}", serde_json::to_string_pretty(&doc)?)?;
    } else if out.text() {
        outln!("backend: {}", b.describe())?;
        outln!("device:  {} ({} total)", args.device, bytes(total as u64))?;
        outln!("units:   binary (1 GiB = 1024³ bytes)")?;
        outln!()?;
        let mut table = report::table(&report, pool.as_deref());
        for (what, path, about) in &written {
            table.row([what.to_string(), format!("{} ({about})", path.display())]);
        }
        outln!("{}", out.table(&table))?;
    }
    match &report.failure {
        None => Ok(()),
        Some(f) => Err(format!(
            "{} did not fit on device {} ({} total) with {}: line {} needed {} with {} in use; \
             give it more room (a larger --pool-maximum, or device with --simulate-capacity) \
             or lower the workload's peak (the log's is {})",
            args.file.display(),
            args.device,
            bytes(total as u64),
            resource.name(),
            f.line,
            bytes(f.bytes as u64),
            bytes(f.live_bytes),
            bytes(report.logged_peak_bytes),
        )
        .into()),
    }
}
