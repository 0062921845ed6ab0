//! `rmm demo`: a Dask-shaped workload through the runtime, on every configured device.
//!
//! Three phases with a reinitialize between each, data kept across both:
//!
//! 1. **pooled**: many tasks per worker, each making an input, transforming it on the device
//!    into a spillable result and freeing its temporaries; the results add up to twice the
//!    spill limit the demo sets, so the spill manager spills all along.
//! 2. **plain**: reinitialize to plain `cuMemAlloc` (no pool): every result is spilled to
//!    host memory first, then each worker fills its share of most of the device with plain
//!    allocations, checks them and frees them: the phase that needs the pool's memory back.
//! 3. **pooled again**: reinitialize back to the pool; every result comes back (into the new
//!    pool) on first use, is checked, and is transformed again; at the end every result is
//!    checked wherever it is.
//!
//! Everything is checked against hashes the host computes from the same seeds; a mismatch
//! fails the run. The configuration is `rmm.toml` (and the environment) with the pool and
//! spilling settings each phase needs put on top.

mod report;
mod sampler;
mod workload;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use rmm::allocator::backend::{self, Backend, BackendChoice, SimBackend, SimConfig};
use rmm::allocator::fmt_bytes;
use rmm::config::{Config, ConfigLoader};
use rmm::runtime::{Runtime, SpillStatistics, TaskHandle};
use serde::Serialize;

use crate::timeline::Timeline;
use sampler::Sampler;
use workload::Kept;

/// A task that makes one result (and counts its allocations).
type Produced = TaskHandle<Result<(Kept, u64), DemoError>>;

/// How much work the demo does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DemoSize {
    /// 32 MiB of results per device (simulated: 256 MiB devices): a smoke run in seconds.
    Tiny,
    /// 256 MiB of results per device (a simulated device of 1 GiB): seconds on a 2-core
    /// machine without a GPU.
    Small,
    /// 2 GiB of results per device (simulated: 8 GiB devices).
    Medium,
    /// 24 GiB of results per device (simulated: 32 GiB devices): for real GPUs.
    Large,
}

/// The sizes behind a [`DemoSize`].
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Scale {
    /// Bytes of results per device.
    pub results_per_device: u64,
    /// The spill limit the demo sets (half the results).
    pub spill_limit: u64,
    /// Smallest and largest result.
    pub min_result: usize,
    /// See `min_result`.
    pub max_result: usize,
    /// Plain allocations of phase 2 are this large.
    pub plain_chunk: usize,
    /// Memory of each simulated device when the demo makes the simulated backend.
    pub sim_memory: usize,
}

impl DemoSize {
    /// The sizes.
    pub fn scale(self) -> Scale {
        const MIB: usize = 1 << 20;
        let (results, min, max, chunk, sim) = match self {
            DemoSize::Tiny => (32 * MIB, 16 << 10, 2 * MIB, 16 * MIB, 256 * MIB),
            DemoSize::Small => (256 * MIB, 64 << 10, 8 * MIB, 64 * MIB, 1024 * MIB),
            DemoSize::Medium => (2048 * MIB, 256 << 10, 32 * MIB, 256 * MIB, 8192 * MIB),
            DemoSize::Large => (24576 * MIB, MIB, 128 * MIB, 1024 * MIB, 32768 * MIB),
        };
        Scale {
            results_per_device: results as u64,
            spill_limit: results as u64 / 2,
            min_result: min,
            max_result: max,
            plain_chunk: chunk,
            sim_memory: sim,
        }
    }
}

/// Told how the demo goes (the CLI draws progress bars).
pub trait Progress: Send + Sync {
    /// A phase (or a part of one) of `total` units begins; `unit` names them in the plural
    /// ("tasks", "allocations", "results").
    fn phase(&self, name: &str, total: u64, unit: &str);
    /// One unit is done.
    fn step(&self);
    /// The phase is over.
    fn finish(&self, summary: &str);
    /// Something the person running the demo should know (e.g. that it runs on the simulated
    /// device): printed apart from the report.
    fn note(&self, text: &str);
}

/// No progress output.
#[derive(Debug, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn phase(&self, _name: &str, _total: u64, _unit: &str) {}
    fn step(&self) {}
    fn finish(&self, _summary: &str) {}
    fn note(&self, _text: &str) {}
}

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The configuration could not be loaded or resolved.
    #[error(transparent)]
    Config(#[from] rmm::config::Error),
    /// The runtime failed.
    #[error(transparent)]
    Runtime(#[from] rmm::runtime::Error),
    /// A device operation failed.
    #[error(transparent)]
    Allocator(#[from] rmm::allocator::Error),
    /// A task panicked or was cancelled.
    #[error("a demo task failed: {0}")]
    Task(#[from] rmm::runtime::TaskError),
    /// A result did not hold the expected bytes, or a phase could not run as planned.
    #[error("demo check failed: {0}")]
    Check(String),
    /// The demo cannot run as configured (an unbacked device, too many workers for the
    /// memory): what is wrong and what to do.
    #[error("the demo cannot run: {0}")]
    Setup(String),
}

/// Options of a run.
pub struct DemoOptions {
    /// How much work.
    pub size: DemoSize,
    /// The configuration loader (file and environment); the demo adds its overrides.
    pub loader: ConfigLoader,
    /// Progress output.
    pub progress: Arc<dyn Progress>,
    /// Sample memory every this often for the timeline.
    pub sample_every: Duration,
    /// Record allocator events (for a PyTorch memory snapshot).
    pub record_events: bool,
}

/// One phase on one device.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PhaseDevice {
    /// The device.
    pub device: u32,
    /// Tasks run on it.
    pub tasks: u64,
    /// Device allocations made by the tasks.
    pub allocations: u64,
    /// Allocations per second over the phase.
    pub allocations_per_second: f64,
    /// Most bytes in use at once (the statistics adaptor's peak).
    pub peak_in_use: u64,
    /// Most bytes reserved from the device at once (sampled).
    pub peak_reserved: u64,
    /// Bytes moved off the device during the phase, and the seconds the moves took
    /// (overlapping moves counted once).
    pub spilled_bytes: u64,
    /// See `spilled_bytes`.
    pub spill_seconds: f64,
    /// Bytes brought back during the phase, and the seconds the moves took.
    pub unspilled_bytes: u64,
    /// See `unspilled_bytes`.
    pub unspill_seconds: f64,
}

/// One phase.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseReport {
    /// Its name.
    pub name: String,
    /// Wall time in seconds.
    pub seconds: f64,
    /// Per device.
    pub devices: Vec<PhaseDevice>,
}

/// One reinitialize between phases.
#[derive(Debug, Clone, Serialize)]
pub struct ReinitSummary {
    /// From which phase to which.
    pub transition: String,
    /// Wall time in seconds, as every other duration in the report.
    pub seconds: f64,
    /// Of which spilling, in seconds.
    pub spill_seconds: f64,
    /// Bytes spilled for it.
    pub spilled_bytes: u64,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    /// The backend, e.g. `"cuda (driver API 13.0, 2 devices)"`.
    pub backend: String,
    /// The size chosen, and its sizes.
    pub size: DemoSize,
    /// See `size`.
    pub scale: Scale,
    /// Devices used.
    pub devices: Vec<u32>,
    /// Workers per device.
    pub workers_per_device: u32,
    /// The phases.
    pub phases: Vec<PhaseReport>,
    /// The reinitializes.
    pub reinitializes: Vec<ReinitSummary>,
    /// Results checked (each once after coming back into the new pool, once at the end).
    pub checked: u64,
    /// Each device's spill figures at the end (all phases).
    pub spill: Vec<SpillStatistics>,
    /// Seconds in all.
    pub seconds: f64,
    /// Memory over time (not in the JSON: written as a picture or a snapshot).
    #[serde(skip)]
    pub timeline: Timeline,
}

/// Makes the process-wide backend: the GPU if the configuration (or `auto`) finds one, else
/// a simulated backend whose devices are sized for `scale` unless `RMM_SIM_MEMORY` says. The
/// demo is the one place where asking for nothing falls back to the simulated device (so that
/// it runs on any machine); it says so through `progress`, with the reason.
fn open_backend(
    config: &Config,
    scale: &Scale,
    progress: &dyn Progress,
) -> Result<&'static dyn Backend, DemoError> {
    if let Some(b) = backend::installed() {
        return Ok(b);
    }
    let fallback = match config.backend {
        BackendChoice::Sim => None,
        BackendChoice::Cuda => return Ok(rmm::runtime::open_backend(config.backend)?),
        // Not the process-wide choice (which would keep the error for every later caller).
        BackendChoice::Auto => match backend::open(BackendChoice::Auto) {
            Ok(b) => return Ok(backend::install_global(b).map_or_else(|existing| existing, |()| b)),
            Err(rmm::allocator::Error::NoDriver { detail }) => Some(detail),
            Err(rmm::allocator::Error::NoDevice { .. }) => {
                Some("the CUDA driver sees no device".to_string())
            }
            Err(e) => Some(e.to_string()),
        },
    };
    let mut sim_config = SimConfig::from_env()?;
    if std::env::var_os("RMM_SIM_MEMORY").is_none() {
        sim_config.capacity = scale.sim_memory;
    }
    let b = SimBackend::leak(sim_config)?;
    let b = backend::install_global(b).map_or_else(|existing| existing, |()| b);
    if let Some(why) = fallback {
        progress.note(&format!(
            "no GPU ({why}): running on the simulated device instead, {}, host memory \
             standing in for device memory. RMM_BACKEND=cuda makes this an error; \
             RMM_BACKEND=sim silences this note",
            b.describe()
        ));
    }
    Ok(b)
}

/// Result sizes for one device: log-uniform between the scale's bounds, adding up to its
/// results per device.
fn result_sizes(scale: &Scale, device: u32) -> Vec<(usize, u64)> {
    let mut rng =
        crate::bench::Rng(0x1234_5678_9ABC_DEF1u64 ^ u64::from(device).wrapping_mul(0x9E37_79B9));
    let (lo, hi) = (
        (scale.min_result as f64).ln(),
        (scale.max_result as f64).ln(),
    );
    let mut sizes = Vec::new();
    let mut sum = 0u64;
    while sum < scale.results_per_device {
        let size = ((lo + rng.unit() * (hi - lo)).exp() as usize).next_multiple_of(8);
        sizes.push((size, rng.next()));
        sum += size as u64;
    }
    sizes
}

/// Runs the demo; `Err` when anything failed, a check included.
///
/// # Errors
/// [`DemoError::Config`] when the configuration does not load; [`DemoError::Setup`] when the
/// backend cannot run it (e.g. an unbacked simulated device); [`DemoError::Runtime`],
/// [`DemoError::Allocator`] or [`DemoError::Task`] when a step fails; [`DemoError::Check`] when a
/// result is wrong.
pub fn run(options: DemoOptions) -> Result<DemoReport, DemoError> {
    let started = Instant::now();
    let scale = options.size.scale();
    // The phases' configurations turn the pool and spilling on and off themselves: the
    // sizes a file gives for them apply whatever the file says of the switches.
    let base = options
        .loader
        .clone()
        .set("pool.enabled", true)
        .set("spill.enabled", true)
        .load()?;
    let b = open_backend(&base, &scale, options.progress.as_ref())?;
    if !b.holds_data() {
        return Err(DemoError::Setup(format!(
            "the simulated device is unbacked ({}): its memory is addresses only and holds no bytes, \
             while the demo computes results in device memory and checks them; run it with \
             RMM_SIM_MODE=backed (the default) or on a GPU",
            b.describe()
        )));
    }
    let pooled = options
        .loader
        .clone()
        .set("pool.enabled", true)
        .set("pool.managed", false)
        .set("pool.async", false)
        .set("spill.enabled", true)
        .set("spill.eager_unspill", false)
        .set("spill.device_memory_limit", scale.spill_limit as i64);
    let plain = pooled
        .clone()
        .set("pool.enabled", false)
        .set("limits.device_memory_limit", "none");
    let pooled_config = pooled.load()?;
    let plain_config = plain.load()?;
    let rt = Runtime::start(&pooled_config)?;
    let devices = rt.devices();
    let workers = pooled_config.workers_per_device;
    let sampler = Sampler::start(
        rt.handle(),
        started,
        options.sample_every,
        options.record_events,
    );
    let progress = &options.progress;
    let mut phases = Vec::new();
    let mut reinitializes = Vec::new();

    // Phase 1: produce results, spilling all along.
    sampler.phase("pooled");
    let mut phase = PhaseRun::begin(&rt, &devices);
    let plan: Vec<(u32, usize, u64)> = devices
        .iter()
        .flat_map(|&d| {
            result_sizes(&scale, d)
                .into_iter()
                .map(move |(s, x)| (d, s, x))
        })
        .collect();
    progress.phase("pooled", plan.len() as u64, "tasks");
    let handles: Vec<(u32, Produced)> = plan
        .iter()
        .map(|&(d, size, seed)| {
            let p = Arc::clone(progress);
            let h = rt.submit_to_device(d, move |ctx| {
                let r = workload::produce(ctx, size, seed);
                p.step();
                r
            });
            (d, h)
        })
        .collect();
    let mut kept: Vec<(u32, Kept)> = Vec::with_capacity(handles.len());
    for (d, h) in handles {
        let (k, allocations) = h.wait()??;
        phase.task(d, allocations);
        kept.push((d, k));
    }
    phases.push(phase.end(&rt, "pooled", &sampler));
    progress.finish(&phase_line(phases.last()));

    // Reinitialize to plain allocations: results go to host memory.
    sampler.mark_reinitialize("pooled → plain");
    let r = rt.reinitialize(&plain_config)?;
    reinitializes.push(summary("pooled → plain", &r));
    sampler.segments_released(&devices);

    // Phase 2: most of every device in plain allocations.
    sampler.phase("plain");
    let mut phase = PhaseRun::begin(&rt, &devices);
    let mut shares = Vec::new();
    for &d in &devices {
        let info = rmm::allocator::Device::on(b, d)?.mem_info()?;
        let usable = (info.free as f64 * 0.85) as usize;
        let share = usable / workers as usize;
        let share = share / scale.plain_chunk * scale.plain_chunk;
        let chunks = usable / scale.plain_chunk;
        if share == 0 && chunks > 0 {
            // Memory for some workers' allocations, not for one each: the worker count.
            return Err(DemoError::Setup(format!(
                "device {d} has {} free, room for {chunks} plain allocation(s) of {} in the \
                 plain phase, but each of its {workers} workers needs one: lower \
                 workers_per_device to at most {chunks}, or run a smaller --size",
                fmt_bytes(info.free),
                fmt_bytes(scale.plain_chunk)
            )));
        }
        if share == 0 {
            return Err(DemoError::Setup(format!(
                "device {d} has {} free: too little for the plain phase, whose allocations \
                 are {} each; free memory on it, or run a smaller --size",
                fmt_bytes(info.free),
                fmt_bytes(scale.plain_chunk)
            )));
        }
        shares.push((d, share));
    }
    let steps: u64 = shares
        .iter()
        .map(|(_, s)| (s / scale.plain_chunk) as u64 * u64::from(workers))
        .sum();
    progress.phase("plain", steps, "allocations");
    let mut handles = Vec::new();
    for &(d, share) in &shares {
        for w in 0..workers {
            let p = Arc::clone(progress);
            let chunk = scale.plain_chunk;
            let h = rt.submit_to_worker(
                rmm::runtime::WorkerId {
                    device: d,
                    index: w,
                },
                move |ctx| workload::fill_device(ctx, share, chunk, &|| p.step()),
            );
            handles.push((d, h));
        }
    }
    for (d, h) in handles {
        let allocations = h.wait()??;
        phase.task(d, allocations);
    }
    phases.push(phase.end(&rt, "plain", &sampler));
    progress.finish(&phase_line(phases.last()));

    // Back to the pool; results come back on first use.
    sampler.mark_reinitialize("plain → pooled");
    let r = rt.reinitialize(&pooled_config)?;
    reinitializes.push(summary("plain → pooled", &r));

    // Phase 3: check every result in the new pool, transform it again.
    sampler.phase("pooled again");
    let mut phase = PhaseRun::begin(&rt, &devices);
    progress.phase("pooled again", kept.len() as u64, "tasks");
    let buffers = workload::ReadBuffers::default();
    let handles: Vec<(u32, Produced)> = kept
        .into_iter()
        .map(|(d, k)| {
            let p = Arc::clone(progress);
            let buffers = buffers.clone();
            let h = rt.submit_to_device(d, move |ctx| {
                let r = workload::transform_again(ctx, &k, &buffers);
                p.step();
                r
            });
            (d, h)
        })
        .collect();
    let mut results = Vec::with_capacity(handles.len());
    for (d, h) in handles {
        let (k, allocations) = h.wait()??;
        phase.task(d, allocations);
        results.push(k);
    }
    // The tasks are done: their read buffers go before the final check takes its own.
    drop(buffers);
    let checked_in_phase = results.len() as u64;
    // Every result, wherever it is now (device, host or disk), on all cores.
    progress.phase("checking", results.len() as u64, "results");
    results
        .par_iter()
        .try_for_each_init(Vec::new, |buffer, k| {
            workload::check(k, buffer).map(|()| progress.step())
        })?;
    phases.push(phase.end(&rt, "pooled again", &sampler));
    progress.finish(&phase_line(phases.last()));
    drop(results);

    let spill = devices
        .iter()
        .filter_map(|&d| rt.spill_manager(d).map(|m| m.statistics()))
        .collect();
    let timeline = sampler.finish(
        &rt,
        &devices,
        format!("rmm demo --size {}", options.size.name()),
    );
    rt.shutdown()?;
    Ok(DemoReport {
        backend: b.describe(),
        size: options.size,
        scale,
        devices,
        workers_per_device: workers,
        phases,
        reinitializes,
        checked: checked_in_phase * 2,
        spill,
        seconds: started.elapsed().as_secs_f64(),
        timeline,
    })
}

impl DemoSize {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            DemoSize::Tiny => "tiny",
            DemoSize::Small => "small",
            DemoSize::Medium => "medium",
            DemoSize::Large => "large",
        }
    }
}

fn summary(transition: &str, r: &rmm::runtime::ReinitReport) -> ReinitSummary {
    ReinitSummary {
        transition: transition.into(),
        seconds: r.total.as_secs_f64(),
        spill_seconds: r.spill.as_secs_f64(),
        spilled_bytes: r.spilled_bytes,
    }
}

fn phase_line(p: Option<&PhaseReport>) -> String {
    p.map_or(String::new(), |p| {
        format!(
            "{}: {} in {:.2} s",
            p.name,
            crate::plural::count(
                p.devices.iter().map(|d| d.tasks).sum::<u64>(),
                "task",
                "tasks"
            ),
            p.seconds
        )
    })
}

/// Counts of one phase while it runs.
struct PhaseRun {
    start: Instant,
    spill_before: Vec<SpillStatistics>,
    counts: Vec<(u32, u64, u64)>,
}

impl PhaseRun {
    fn begin(rt: &Runtime, devices: &[u32]) -> PhaseRun {
        PhaseRun {
            start: Instant::now(),
            spill_before: devices
                .iter()
                .map(|&d| {
                    rt.spill_manager(d)
                        .map(|m| m.statistics())
                        .unwrap_or_default()
                })
                .collect(),
            counts: devices.iter().map(|&d| (d, 0, 0)).collect(),
        }
    }

    fn task(&mut self, device: u32, allocations: u64) {
        if let Some(c) = self.counts.iter_mut().find(|c| c.0 == device) {
            c.1 += 1;
            c.2 += allocations;
        }
    }

    fn end(self, rt: &Runtime, name: &str, sampler: &Sampler) -> PhaseReport {
        let seconds = self.start.elapsed().as_secs_f64();
        let devices = self
            .counts
            .into_iter()
            .zip(self.spill_before)
            .map(|((device, tasks, allocations), before)| {
                let after = rt
                    .spill_manager(device)
                    .map(|m| m.statistics())
                    .unwrap_or_default();
                let spilled = after.spilled_bytes - before.spilled_bytes;
                let spill_s = after.spill_seconds - before.spill_seconds;
                let unspilled = after.unspilled_bytes - before.unspilled_bytes;
                let unspill_s = after.unspill_seconds - before.unspill_seconds;
                let peak_in_use = rt
                    .stack(device)
                    .map_or(0, |s| s.statistics().lifetime_bytes().peak.max(0) as u64);
                PhaseDevice {
                    device,
                    tasks,
                    allocations,
                    allocations_per_second: allocations as f64 / seconds.max(1e-9),
                    peak_in_use,
                    // Samples can miss a short peak; reserved is never below in use.
                    peak_reserved: sampler.peak_reserved(device, self.start).max(peak_in_use),
                    spilled_bytes: spilled,
                    spill_seconds: spill_s,
                    unspilled_bytes: unspilled,
                    unspill_seconds: unspill_s,
                }
            })
            .collect();
        PhaseReport {
            name: name.into(),
            seconds,
            devices,
        }
    }
}
