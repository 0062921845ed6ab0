//! `rmm replay`: plays a memory event log (RMM's CSV format) against a resource and says how
//! long it took, the peak bytes in use and whether every allocation fit.

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use rmm::allocator::adaptor::{EventLog, ReplayOptions, ReplayOrder, replay};
use rmm::allocator::backend::{self, SimBackend, SimConfig, SimMemoryMode};
use rmm::allocator::error::fmt_bytes;
use rmm::allocator::per_device::SharedResource;
use rmm::allocator::resource::{
    BinningMemoryResource, CudaAsyncMemoryResource, CudaMemoryResource, ManagedMemoryResource,
    PoolMemoryResource, PoolSize,
};
use rmm::allocator::{Device, DeviceMemoryResource};
use rmm::config::Size;

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
    /// Every event after the one before it in the log (the logged peak is reproduced).
    Logged,
    /// Each thread in its own order; cross-thread frees wait for their allocation.
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
    /// Order of events across threads.
    #[arg(long, value_enum, default_value_t = Order::Logged)]
    pub order: Order,
    /// Device ordinal to replay on.
    #[arg(long, default_value_t = 0)]
    pub device: u32,
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

fn build(args: &ReplayArgs, device: Device) -> Result<SharedResource, Box<dyn std::error::Error>> {
    let cuda: SharedResource = Arc::new(CudaMemoryResource::new(device));
    let pool = || -> Result<SharedResource, Box<dyn std::error::Error>> {
        let mut b = PoolMemoryResource::builder(Arc::clone(&cuda));
        if let Some(s) = args.pool_initial {
            b = b.initial_size(pool_size(s));
        }
        if let Some(s) = args.pool_maximum {
            b = b.maximum_size(pool_size(s));
        }
        Ok(Arc::new(b.build()?))
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
    // Parse first: a malformed log is reported before any device is touched.
    let log = EventLog::read(&args.file)?;
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
    println!("backend:    {}", b.describe());
    println!("device:     {} ({} total)", args.device, fmt_bytes(total));
    let resource = build(&args, device)?;
    let options = ReplayOptions {
        order: match args.order {
            Order::Logged => ReplayOrder::Logged,
            Order::Concurrent => ReplayOrder::Concurrent,
        },
        default_stream_only: false,
    };
    let report = replay(&log, &*resource, &options)?;
    println!("{report}");
    match &report.failure {
        None => Ok(()),
        Some(f) => Err(format!(
            "{} did not fit on device {} ({} total) with {}: line {} needed {} with {} in use; \
             give it more room (a larger --pool-maximum, or device with --simulate-capacity) \
             or lower the workload's peak (the log's is {})",
            args.file.display(),
            args.device,
            fmt_bytes(total),
            resource.name(),
            f.line,
            fmt_bytes(f.bytes),
            fmt_bytes(f.live_bytes as usize),
            fmt_bytes(log.peak_bytes as usize),
        )
        .into()),
    }
}
