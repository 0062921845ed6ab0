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
use rmm::allocator::adaptor::ReplayReport;
use rmm::allocator::adaptor::{
    EventLog, LogFile, ReplayOptions, ReplayOrder, find_in_chain, replay, replay_streamed,
};
use rmm::allocator::backend::DevicePtr;
use rmm::allocator::backend::{self, MemInfo, SimBackend, SimConfig, SimMemoryMode};
use rmm::allocator::resource::DeviceMemoryResource;
use rmm::allocator::resource::SharedResource;
use rmm::allocator::resource::{
    BinningMemoryResource, CudaAsyncMemoryResource, CudaMemoryResource, ManagedMemoryResource,
    PoolMemoryResource, PoolSize,
};
use rmm::allocator::{Device, StreamView};
use rmm::config::Size;
use rmm_cli::timeline::{
    Action, DeviceTimeline, MemoryEvent, PlotFormat, Recorder, Timeline, render,
    samples_from_events, torch_snapshot_bytes,
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
    /// One thread per logged thread, each in its own order; cross-thread frees wait for
    /// their allocation (the default: times the resource as the threads used it).
    Concurrent,
}

/// Arguments of `rmm replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The log: a CSV file with the header Thread,Time,Action,Pointer,Size,Stream.
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
    /// Order of events across threads. The log is read as it is replayed (memory does not
    /// grow with its length), except with --plot or --torch-snapshot, which draw from the
    /// whole log.
    #[arg(long, value_enum, default_value_t = Order::Concurrent)]
    pub order: Order,
    /// Device ordinal to replay on.
    #[arg(long, default_value_t = 0)]
    pub device: u32,
    /// Draw the replay's memory over time (bytes in use and reserved) on the log's clock: a
    /// PNG file when FILE ends in .png, else SVG.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Write the replay's allocator events as a PyTorch memory snapshot (a pickle) to this
    /// file, for https://pytorch.org/memory_viz or torch.cuda._memory_viz.
    #[arg(long, value_name = "FILE")]
    pub torch_snapshot: Option<PathBuf>,
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

fn pool_size(s: Size) -> PoolSize {
    match s {
        Size::Bytes(b) => PoolSize::Bytes(b as usize),
        Size::Fraction(f) => PoolSize::Fraction(f),
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
        let mut b = PoolMemoryResource::builder(upstream);
        if let Some(s) = args.pool_initial {
            b = b.initial_size(pool_size(s));
        }
        if let Some(s) = args.pool_maximum {
            b = b.maximum_size(pool_size(s));
        }
        if let Some(s) = args.pool_growth {
            b = b.growth(s.resolve(device.mem_info()?.total as u64));
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

/// The log: whole in memory (for a timeline), or scanned and read again as it is replayed.
enum Source {
    Whole(EventLog),
    Streamed(LogFile),
}

/// Runs `rmm replay`.
pub fn run(args: ReplayArgs) -> Result<(), Box<dyn std::error::Error>> {
    let out = args.output;
    // Output paths first, then the log: a bad path or a malformed log is reported before
    // any device is touched.
    let plot_format = args
        .plot
        .as_deref()
        .map(|p| PlotFormat::from_path("--plot", p))
        .transpose()?;
    let plot = OutputFile::open_optional("--plot", args.plot.as_deref())?;
    let snapshot = OutputFile::open_optional("--torch-snapshot", args.torch_snapshot.as_deref())?;
    // With a plot or snapshot the whole log is kept (the timeline is drawn from its
    // events); otherwise it is only scanned now, and read again as it is replayed.
    let log = if plot.is_some() || snapshot.is_some() {
        Source::Whole(EventLog::read(&args.file)?)
    } else {
        Source::Streamed(LogFile::scan(&args.file)?)
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
    let recorder = (args.plot.is_some() || args.torch_snapshot.is_some())
        .then(|| Arc::new(Recorder::new(Instant::now())));
    let guard = recorder.as_ref().map(Recorder::register);
    let resource = build(&args, device, recorder.as_ref())?;
    let options = ReplayOptions {
        order: match args.order {
            Order::Logged => ReplayOrder::Logged,
            Order::Concurrent => ReplayOrder::Concurrent,
        },
        default_stream_only: false,
    };
    let report = match &log {
        Source::Whole(log) => replay(log, &*resource, &options)?,
        Source::Streamed(file) => replay_streamed(file, &*resource, &options)?,
    };
    drop(guard);
    let pool = find_in_chain::<PoolMemoryResource>(&*resource).map(|p| p.usage().summary());
    // Files written: (what, path, where the events came from).
    let mut written: Vec<(&str, PathBuf, String)> = Vec::new();
    if let (Some(recorder), Source::Whole(log)) = (&recorder, &log) {
        let recorded = recorder.events(args.device);
        let name = args.file.file_name().map_or_else(
            || args.file.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        if let (Some(file), Some(format)) = (plot, plot_format) {
            let (timeline, source) =
                clock::plot_timeline(log, &name, args.device, total as u64, &report, &recorded);
            let path = file.path().to_path_buf();
            file.write(&render(&timeline, format)?)?;
            written.push(("plot", path, source.to_string()));
        }
        if let Some(file) = snapshot {
            let (timeline, source) =
                snapshot_timeline(&args, &name, log, &report, &recorded, total as u64);
            let path = file.path().to_path_buf();
            file.write(&torch_snapshot_bytes(&timeline)?)?;
            written.push((
                "snapshot",
                path,
                format!(
                    "PyTorch memory snapshot {source}; open it at https://pytorch.org/memory_viz"
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

/// The PyTorch snapshot's timeline: the pool's own events (block and segment addresses that
/// agree, on the replay's clock), or the log's events when the resource reported none.
fn snapshot_timeline(
    args: &ReplayArgs,
    name: &str,
    log: &EventLog,
    report: &ReplayReport,
    recorded: &[MemoryEvent],
    total: u64,
) -> (Timeline, &'static str) {
    let from_hooks = recorded
        .iter()
        .any(|e| matches!(e.action, Action::Alloc | Action::Oom));
    let (events, source) = if from_hooks {
        (recorded.to_vec(), "from the pool's events")
    } else {
        let times = clock::log_times(log);
        (
            clock::log_events(log, &times),
            "from the log's events: the resource reports none",
        )
    };
    let timeline = Timeline {
        title: format!("rmm replay {name}: {}", report.resource),
        devices: vec![DeviceTimeline {
            device: args.device,
            total_memory: Some(total),
            samples: samples_from_events(&events),
            events,
        }],
        marks: Vec::new(),
    };
    (timeline, source)
}
