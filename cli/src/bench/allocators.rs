//! The allocator benchmark: the workload shapes of the anchors document through every
//! resource in one run, with same-run ratios.
//!
//! | shape | workload |
//! |---|---|
//! | `churn` | allocate 1 MiB, free it, repeated |
//! | `random` | sizes log-uniform 256 B – 16 MiB, allocate with p = 0.55 while live bytes stay under a cap (4 GiB), else free a random live block; everything freed at the end |
//! | `small` | as `random`, 8 B – 64 KiB, cap 1 GiB |
//! | `mt8` / `mt16` | 8 or 16 threads, each `random` with its own seed, stream and share of the cap |
//!
//! Figures are nanoseconds per operation (one allocate or one free): the best of the timed
//! rounds, each after one untimed warm-up pass (pool growth, arena creation, the driver's
//! pool). Multi-thread figures are the aggregate wall time over all threads' operations. On a
//! GPU this measures the real thing; on the simulated device (which has no latency) it
//! measures the resources' own bookkeeping.
//!
//! `cuda` (a `cuMemAlloc` per request) runs `churn` and `random` only, on short traces when
//! the device is a GPU: each call costs tens of microseconds.
//!
//! [`run`] returns an [`AllocatorReport`]; its [`Display`](fmt::Display) is the markdown table
//! `cargo bench --bench allocators` and `rmm bench` print, and it serializes to JSON.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use rmm::allocator::backend::{Backend, BackendKind};
use rmm::allocator::per_device::SharedResource;
use rmm::allocator::resource::{
    BinningMemoryResource, CudaAsyncMemoryResource, CudaMemoryResource, PoolMemoryResource,
    PoolSize,
};
use rmm::allocator::{Device, DeviceMemoryResource, Stream};
use serde::{Deserialize, Serialize};

use super::BenchError;
use super::traces::{GIB, MIB, Op, churn_trace, random_trace, replay};

/// A resource the benchmark measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Resource {
    /// `CudaMemoryResource`: `cuMemAlloc` / `cuMemFree` for every request.
    #[serde(rename = "cuda")]
    Cuda,
    /// `CudaAsyncMemoryResource`: the driver's stream-ordered allocator (`cuMemAllocAsync`).
    #[serde(rename = "async")]
    Async,
    /// `PoolMemoryResource` over `cuda`, created with 3 × the cap.
    #[serde(rename = "pool")]
    Pool,
    /// `BinningMemoryResource` (bins 256 B – 128 KiB) in front of the pool.
    #[serde(rename = "binning(pool)")]
    Binning,
}

impl Resource {
    /// Every resource, in table order.
    pub const ALL: [Resource; 4] = [
        Resource::Cuda,
        Resource::Async,
        Resource::Pool,
        Resource::Binning,
    ];

    /// The name in tables, JSON and `RMM_BENCH_ONLY`: `cuda`, `async`, `pool`,
    /// `binning(pool)`.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Cuda => "cuda",
            Resource::Async => "async",
            Resource::Pool => "pool",
            Resource::Binning => "binning(pool)",
        }
    }

    /// Whether the resource runs every shape (`cuda` runs `churn` and `random` only).
    pub fn runs_every_shape(self) -> bool {
        self != Resource::Cuda
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Resource {
    type Err = BenchError;

    /// Parses a [`Resource::name`]; `binning` is accepted for `binning(pool)`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cuda" => Ok(Resource::Cuda),
            "async" => Ok(Resource::Async),
            "pool" => Ok(Resource::Pool),
            "binning" | "binning(pool)" => Ok(Resource::Binning),
            _ => Err(BenchError::invalid(
                "resource",
                format!("{s:?} is none of cuda, async, pool, binning"),
            )),
        }
    }
}

/// A workload shape (a column of the table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Shape {
    /// Allocate 1 MiB, free it, repeated.
    Churn,
    /// Log-uniform 256 B – 16 MiB under the cap, one thread.
    Random,
    /// Log-uniform 8 B – 64 KiB under the small cap, one thread.
    Small,
    /// `random` on 8 threads, each with its own seed, stream and share of the cap.
    Mt8,
    /// `random` on 16 threads, each with its own seed, stream and share of the cap.
    Mt16,
    /// `mt8` with every thread on one shared stream (as Dask's threads on the default stream).
    #[serde(rename = "mt8-shared")]
    Mt8Shared,
    /// `mt16` with every thread on one shared stream.
    #[serde(rename = "mt16-shared")]
    Mt16Shared,
}

impl Shape {
    /// Every shape, in table order.
    pub const ALL: [Shape; 7] = [
        Shape::Churn,
        Shape::Random,
        Shape::Small,
        Shape::Mt8,
        Shape::Mt16,
        Shape::Mt8Shared,
        Shape::Mt16Shared,
    ];

    /// The column name: `churn`, `random`, `small`, `mt8`, `mt16`.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Churn => "churn",
            Shape::Random => "random",
            Shape::Small => "small",
            Shape::Mt8 => "mt8",
            Shape::Mt16 => "mt16",
            Shape::Mt8Shared => "mt8-shared",
            Shape::Mt16Shared => "mt16-shared",
        }
    }

    /// The number of threads of a multi-thread shape.
    pub fn threads(self) -> Option<usize> {
        match self {
            Shape::Mt8 | Shape::Mt8Shared => Some(8),
            Shape::Mt16 | Shape::Mt16Shared => Some(16),
            _ => None,
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Shape {
    type Err = BenchError;

    /// Parses a [`Shape::name`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Shape::ALL
            .into_iter()
            .find(|x| x.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                BenchError::invalid(
                    "shape",
                    format!(
                        "{s:?} is none of churn, random, small, mt8, mt16, mt8-shared, mt16-shared"
                    ),
                )
            })
    }
}

/// Named sizes of a run, for the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scale {
    /// 1 % of the operations: a smoke test that takes seconds on a laptop without a GPU.
    Tiny,
    /// 10 % of the operations.
    Small,
    /// The full run (a million steps per single-thread trace), as `cargo bench` does.
    Full,
}

impl Scale {
    /// The multiplier of the operation counts: 0.01, 0.1 or 1.
    pub fn factor(self) -> f64 {
        match self {
            Scale::Tiny => 0.01,
            Scale::Small => 0.1,
            Scale::Full => 1.0,
        }
    }
}

impl FromStr for Scale {
    type Err = BenchError;

    /// Parses `tiny`, `small` or `full`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tiny" => Ok(Scale::Tiny),
            "small" => Ok(Scale::Small),
            "full" => Ok(Scale::Full),
            _ => Err(BenchError::invalid(
                "scale",
                format!("{s:?} is none of tiny, small, full"),
            )),
        }
    }
}

/// What to measure, and how much.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocatorBenchOptions {
    /// Multiplier of the operation counts (1.0: a million steps per single-thread trace);
    /// every trace keeps at least 100 steps.
    pub scale: f64,
    /// Timed passes per cell after the warm-up pass; the best is reported (at least 1).
    pub rounds: usize,
    /// The resources (table rows), in order.
    pub resources: Vec<Resource>,
    /// The shapes (table columns), in order.
    pub shapes: Vec<Shape>,
    /// Device ordinal of the backend to run on.
    pub device: u32,
    /// Live-bytes cap of `random` and of `mt8` / `mt16` (shared by their threads); the pool
    /// is created with 3 × this.
    pub cap: usize,
    /// Live-bytes cap of `small`.
    pub small_cap: usize,
}

impl Default for AllocatorBenchOptions {
    /// Everything at full scale, one round, on device 0, caps 4 GiB and 1 GiB.
    fn default() -> Self {
        AllocatorBenchOptions {
            scale: 1.0,
            rounds: 1,
            resources: Resource::ALL.to_vec(),
            shapes: Shape::ALL.to_vec(),
            device: 0,
            cap: 4 * GIB,
            small_cap: GIB,
        }
    }
}

impl AllocatorBenchOptions {
    /// The defaults at a named scale.
    pub fn at_scale(scale: Scale) -> Self {
        AllocatorBenchOptions {
            scale: scale.factor(),
            ..Self::default()
        }
    }

    /// These options with the caps shrunk, where needed, so that the pool (3 × `cap`) takes
    /// at most half of a device of `total_memory` bytes: `cap` at most `total_memory / 6`,
    /// `small_cap` at most `cap`. The defaults fit a device of 24 GiB or more unchanged.
    pub fn fitted_to(mut self, total_memory: usize) -> Self {
        self.cap = self.cap.min((total_memory / 6).max(MIB));
        self.small_cap = self.small_cap.min(self.cap);
        self
    }

    fn validate(&self) -> Result<(), BenchError> {
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return Err(BenchError::invalid(
                "scale",
                format!("{} is not a positive number", self.scale),
            ));
        }
        if self.rounds == 0 {
            return Err(BenchError::invalid("rounds", "must be at least 1"));
        }
        if self.resources.is_empty() || self.shapes.is_empty() {
            return Err(BenchError::invalid(
                "resources/shapes",
                "nothing to measure: name at least one resource and one shape",
            ));
        }
        if self.cap == 0 || self.small_cap == 0 {
            return Err(BenchError::invalid("cap", "caps must be positive"));
        }
        Ok(())
    }

    /// `x` operations scaled, at least 100.
    fn n(&self, x: usize) -> usize {
        ((x as f64 * self.scale) as usize).max(100)
    }
}

/// One row of the table: a resource's ns per operation on every shape of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResourceRow {
    /// The resource.
    pub resource: Resource,
    /// ns per operation by shape; `None` where the shape was not run or failed.
    pub ns_per_op: BTreeMap<Shape, Option<f64>>,
}

/// Same-run speed-ups over one baseline resource: its ns/op ÷ each other resource's ns/op.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Speedups {
    /// The resource every other one is compared with.
    pub baseline: Resource,
    /// One row per other resource, in table order.
    pub rows: Vec<SpeedupRow>,
}

/// One resource's speed-ups over a baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpeedupRow {
    /// The resource.
    pub resource: Resource,
    /// Baseline ns/op ÷ this resource's ns/op by shape; `None` where either is missing.
    pub ratio: BTreeMap<Shape, Option<f64>>,
}

/// A measurement (or a resource's construction) that failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    /// The resource.
    pub resource: Resource,
    /// The shape; `None` when the resource itself could not be created.
    pub shape: Option<Shape>,
    /// What went wrong.
    pub error: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.shape {
            Some(s) => write!(f, "{} on {s}: {}", self.resource, self.error),
            None => write!(f, "{}: {}", self.resource, self.error),
        }
    }
}

/// The result of [`run`]: ns per operation per resource × shape and the same-run ratios.
///
/// `Display` writes the markdown tables (ns per operation, then the speed-ups over `async` and
/// over `cuda` where those ran); `serde` gives the same as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocatorReport {
    /// The backend, as [`Backend::describe`] says it.
    pub backend: String,
    /// Whether the device is simulated (figures then measure bookkeeping only).
    pub simulated: bool,
    /// Device ordinal.
    pub device: u32,
    /// Device name.
    pub device_name: String,
    /// Total device memory in bytes.
    pub total_memory: usize,
    /// The options the run used.
    pub options: AllocatorBenchOptions,
    /// One row per resource, in the order of the options.
    pub rows: Vec<ResourceRow>,
    /// Speed-ups over `async`, then over `cuda`, for those that ran.
    pub speedups: Vec<Speedups>,
    /// What failed (such cells are `None`).
    pub failures: Vec<Failure>,
}

impl AllocatorReport {
    /// The row of `resource`, if it ran.
    pub fn row(&self, resource: Resource) -> Option<&ResourceRow> {
        self.rows.iter().find(|r| r.resource == resource)
    }

    fn write_table<'a>(
        &self,
        f: &mut fmt::Formatter<'_>,
        rows: impl Iterator<Item = (Resource, &'a BTreeMap<Shape, Option<f64>>)>,
        cell: impl Fn(f64) -> String,
    ) -> fmt::Result {
        let shapes = &self.options.shapes;
        let heads: Vec<&str> = shapes.iter().map(|s| s.name()).collect();
        writeln!(f, "| resource | {} |", heads.join(" | "))?;
        writeln!(f, "|---|{}", "---|".repeat(shapes.len()))?;
        for (resource, cells) in rows {
            let cells: Vec<String> = shapes
                .iter()
                .map(|s| {
                    cells
                        .get(s)
                        .copied()
                        .flatten()
                        .map_or_else(|| "–".to_string(), &cell)
                })
                .collect();
            writeln!(f, "| {resource} | {} |", cells.join(" | "))?;
        }
        Ok(())
    }
}

impl fmt::Display for AllocatorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "ns per operation ({}; lower is better)",
            self.device_name
        )?;
        self.write_table(
            f,
            self.rows.iter().map(|r| (r.resource, &r.ns_per_op)),
            |x| format!("{x:.0}"),
        )?;
        for s in &self.speedups {
            writeln!(f)?;
            writeln!(
                f,
                "speed-up over {} (its ns/op ÷ resource's ns/op, same run)",
                s.baseline
            )?;
            self.write_table(f, s.rows.iter().map(|r| (r.resource, &r.ratio)), |x| {
                format!("{x:.1}×")
            })?;
        }
        Ok(())
    }
}

/// Runs the benchmark on device `options.device` of `backend`.
///
/// A resource that cannot be created, or a cell that fails (out of memory, say), is recorded
/// in [`AllocatorReport::failures`] and leaves its cells `None`; the run goes on. Errors are
/// invalid options and a device that cannot be opened.
pub fn run(
    backend: &'static dyn Backend,
    options: &AllocatorBenchOptions,
) -> Result<AllocatorReport, BenchError> {
    run_with(backend, options, |_, _| {})
}

/// As [`run`], calling `on_row` with each row (and that resource's failures) as soon as it is
/// measured: progress for long runs.
pub fn run_with(
    backend: &'static dyn Backend,
    options: &AllocatorBenchOptions,
    mut on_row: impl FnMut(&ResourceRow, &[Failure]),
) -> Result<AllocatorReport, BenchError> {
    options.validate()?;
    let mut options = options.clone();
    dedup(&mut options.resources);
    dedup(&mut options.shapes);
    let o = &options;
    let device = Device::on(backend, o.device)?;
    let props = device.properties()?;
    let stream = Stream::new(device)?;
    let on_gpu = backend.kind() == BackendKind::Cuda;

    let mut failures = Vec::new();
    let resources = build_resources(device, o, &mut failures);
    let wants = |s: Shape| o.shapes.contains(&s);
    let full_traces = o.resources.iter().any(|r| r.runs_every_shape());
    let trace = |s: Shape, steps: usize| -> Vec<Op> {
        if !(wants(s) && full_traces) {
            return Vec::new();
        }
        match s {
            Shape::Churn => churn_trace(steps),
            Shape::Small => random_trace(steps, 8, 64 * 1024, o.small_cap, 2),
            _ => random_trace(steps, 256, 16 * MIB, o.cap, 1),
        }
    };
    let churn = trace(Shape::Churn, o.n(1_000_000));
    let random = trace(Shape::Random, o.n(1_000_000));
    let small = trace(Shape::Small, o.n(1_000_000));

    let mut rows = Vec::new();
    for (resource, mr) in resources {
        let first_failure = failures.len();
        let mut ns_per_op: BTreeMap<Shape, Option<f64>> =
            o.shapes.iter().map(|&s| (s, None)).collect();
        if let Some(mr) = &mr {
            for &shape in &o.shapes {
                let measured = if resource.runs_every_shape() {
                    match shape {
                        Shape::Churn => Some(single(&**mr, &churn, &stream, o.rounds)),
                        Shape::Random => Some(single(&**mr, &random, &stream, o.rounds)),
                        Shape::Small => Some(single(&**mr, &small, &stream, o.rounds)),
                        Shape::Mt8 | Shape::Mt16 | Shape::Mt8Shared | Shape::Mt16Shared => {
                            let threads = shape.threads().unwrap_or(1);
                            let steps = o.n(2_000_000 / threads);
                            let shared = matches!(shape, Shape::Mt8Shared | Shape::Mt16Shared);
                            Some(multi(mr, device, threads, steps, o.cap, o.rounds, shared))
                        }
                    }
                } else {
                    // cuMemAlloc costs tens of microseconds on a GPU: short traces are enough.
                    let (churn_steps, random_steps) = if on_gpu {
                        (2_000, 5_000)
                    } else {
                        (o.n(100_000), o.n(100_000))
                    };
                    match shape {
                        Shape::Churn => Some(churn_trace(churn_steps)),
                        Shape::Random => Some(random_trace(random_steps, 256, 16 * MIB, o.cap, 1)),
                        _ => None,
                    }
                    .map(|ops| single(&**mr, &ops, &stream, o.rounds))
                };
                match measured {
                    Some(Ok(ns)) => {
                        ns_per_op.insert(shape, Some(ns));
                    }
                    Some(Err(e)) => failures.push(Failure {
                        resource,
                        shape: Some(shape),
                        error: e.to_string(),
                    }),
                    None => {}
                }
            }
        }
        let row = ResourceRow {
            resource,
            ns_per_op,
        };
        on_row(&row, &failures[first_failure..]);
        rows.push(row);
    }
    let speedups = [Resource::Async, Resource::Cuda]
        .into_iter()
        .filter_map(|base| speedups(&rows, base))
        .collect();
    Ok(AllocatorReport {
        backend: backend.describe(),
        simulated: backend.kind() != BackendKind::Cuda,
        device: o.device,
        device_name: props.name,
        total_memory: props.total_memory,
        rows,
        speedups,
        failures,
        options,
    })
}

/// A worker's stream: its own, or the one all workers share.
enum OwnOrShared {
    Own(Stream),
    Shared(rmm::allocator::StreamView),
}

impl OwnOrShared {
    fn view(&self) -> rmm::allocator::StreamView {
        match self {
            OwnOrShared::Own(s) => s.view(),
            OwnOrShared::Shared(v) => *v,
        }
    }
}

fn dedup<T: PartialEq + Copy>(v: &mut Vec<T>) {
    let mut seen = Vec::with_capacity(v.len());
    v.retain(|x| {
        let new = !seen.contains(x);
        if new {
            seen.push(*x);
        }
        new
    });
}

/// The selected resources in order, each `None` where it could not be created (the failure is
/// recorded). The pool is created when it or binning is selected.
fn build_resources(
    device: Device,
    o: &AllocatorBenchOptions,
    failures: &mut Vec<Failure>,
) -> Vec<(Resource, Option<SharedResource>)> {
    let cuda: SharedResource = Arc::new(CudaMemoryResource::new(device));
    let mut record = |resource, e: &dyn fmt::Display| {
        failures.push(Failure {
            resource,
            shape: None,
            error: e.to_string(),
        })
    };
    let needs_pool = o
        .resources
        .iter()
        .any(|r| matches!(r, Resource::Pool | Resource::Binning));
    let pool: Option<Result<SharedResource, String>> = needs_pool.then(|| {
        PoolMemoryResource::builder(Arc::clone(&cuda))
            .initial_size(PoolSize::Bytes(o.cap.saturating_mul(3)))
            .build()
            .map(|p| Arc::new(p) as SharedResource)
            .map_err(|e| e.to_string())
    });
    o.resources
        .iter()
        .map(|&r| {
            let mr = match r {
                Resource::Cuda => Ok(Arc::clone(&cuda)),
                Resource::Async => CudaAsyncMemoryResource::new(device)
                    .map(|a| Arc::new(a) as SharedResource)
                    .map_err(|e| e.to_string()),
                Resource::Pool => match &pool {
                    Some(p) => p.clone(),
                    None => Err("no pool".into()),
                },
                Resource::Binning => match &pool {
                    Some(Ok(p)) => BinningMemoryResource::with_bins(Arc::clone(p), 8, 17)
                        .map(|b| Arc::new(b) as SharedResource)
                        .map_err(|e| e.to_string()),
                    Some(Err(e)) => Err(format!("its pool could not be created: {e}")),
                    None => Err("no pool".into()),
                },
            };
            match mr {
                Ok(mr) => (r, Some(mr)),
                Err(e) => {
                    record(r, &e);
                    (r, None)
                }
            }
        })
        .collect()
}

fn speedups(rows: &[ResourceRow], baseline: Resource) -> Option<Speedups> {
    let base = rows.iter().find(|r| r.resource == baseline)?;
    let rows = rows
        .iter()
        .filter(|r| r.resource != baseline)
        .map(|r| SpeedupRow {
            resource: r.resource,
            ratio: base
                .ns_per_op
                .iter()
                .map(|(&shape, &x)| {
                    let y = r.ns_per_op.get(&shape).copied().flatten();
                    let ratio = match (x, y) {
                        (Some(x), Some(y)) if y > 0.0 => Some(x / y),
                        _ => None,
                    };
                    (shape, ratio)
                })
                .collect(),
        })
        .collect();
    Some(Speedups { baseline, rows })
}

/// One warm-up pass over (at most) the first 20 000 operations, then `rounds` timed passes;
/// the best.
fn single(
    mr: &dyn DeviceMemoryResource,
    ops: &[Op],
    stream: &Stream,
    rounds: usize,
) -> Result<f64, BenchError> {
    replay(mr, &ops[..ops.len().min(20_000)], stream.view())?;
    stream.synchronize()?;
    let mut best = f64::INFINITY;
    for _ in 0..rounds {
        best = best.min(replay(mr, ops, stream.view())?);
        stream.synchronize()?;
    }
    Ok(best)
}

/// Lets the workers go (`true`) or sends them home (`false`, a sibling failed to start).
struct Gate {
    open: Mutex<Option<bool>>,
    changed: Condvar,
}

impl Gate {
    fn set(&self, go: bool) {
        *self.open.lock() = Some(go);
        self.changed.notify_all();
    }

    fn wait(&self) -> bool {
        let mut open = self.open.lock();
        loop {
            if let Some(go) = *open {
                return go;
            }
            self.changed.wait(&mut open);
        }
    }
}

/// One worker's timed passes: when each started and ended.
type Passes = Vec<(Instant, Instant)>;

/// `threads` threads, each its own `random` trace (`steps` steps, `cap / threads` bytes) and
/// stream; a warm-up pass each, then `rounds` timed passes that start together. A round's wall
/// time runs from the first thread's start to the last thread's end (taken by the workers, so
/// that a descheduled coordinator cannot shorten it); the best round's wall time over all
/// threads' operations.
#[allow(clippy::too_many_arguments)]
fn multi(
    mr: &SharedResource,
    device: Device,
    threads: usize,
    steps: usize,
    cap: usize,
    rounds: usize,
    shared: bool,
) -> Result<f64, BenchError> {
    // With `shared`, every thread uses this one stream (kept alive until they are done).
    let one_stream = if shared {
        Some(Stream::new(device)?)
    } else {
        None
    };
    let one_view = one_stream.as_ref().map(Stream::view);
    let traces: Vec<Vec<Op>> = (0..threads)
        .map(|t| random_trace(steps, 256, 16 * MIB, cap / threads, 1000 + t as u64))
        .collect();
    let total_ops: usize = traces.iter().map(Vec::len).sum();
    let gate = Gate {
        open: Mutex::new(None),
        changed: Condvar::new(),
    };
    let barrier = Barrier::new(threads);
    std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(threads);
        let mut spawn_error = None;
        for (t, ops) in traces.iter().enumerate() {
            let (gate, barrier) = (&gate, &barrier);
            let worker = move || -> Result<Passes, BenchError> {
                if !gate.wait() {
                    return Ok(Vec::new());
                }
                let warm = &ops[..ops.len().min(5_000)];
                let mut outcome = match one_view {
                    Some(v) => Ok(OwnOrShared::Shared(v)),
                    None => Stream::new(device).map(OwnOrShared::Own),
                }
                .and_then(|s| {
                    replay(&**mr, warm, s.view())?;
                    rmm::allocator::stream::synchronize(device, s.view())?;
                    Ok(s)
                });
                let mut passes = Vec::with_capacity(rounds);
                // Every worker reaches every barrier, failed or not, so none waits forever.
                for _ in 0..rounds {
                    barrier.wait();
                    let start = Instant::now();
                    if let Ok(s) = &outcome
                        && let Err(e) = replay(&**mr, ops, s.view())
                    {
                        outcome = Err(e);
                    }
                    passes.push((start, Instant::now()));
                }
                outcome.map(|_| passes).map_err(BenchError::from)
            };
            match std::thread::Builder::new()
                .name(format!("rmm-bench-{t}"))
                .spawn_scoped(scope, worker)
            {
                Ok(h) => handles.push(h),
                Err(e) => {
                    spawn_error = Some(e);
                    break;
                }
            }
        }
        gate.set(spawn_error.is_none());
        let mut first_error = spawn_error.map(BenchError::Spawn);
        let mut all = Vec::with_capacity(threads);
        for h in handles {
            match h.join().unwrap_or(Err(BenchError::ThreadPanicked)) {
                Ok(passes) => all.push(passes),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            return Err(BenchError::Threads {
                threads,
                source: Box::new(e),
            });
        }
        let best = (0..rounds)
            .filter_map(|r| {
                let start = all.iter().filter_map(|p| p.get(r)).map(|p| p.0).min()?;
                let end = all.iter().filter_map(|p| p.get(r)).map(|p| p.1).max()?;
                Some(end.duration_since(start).as_nanos() as f64)
            })
            .fold(f64::INFINITY, f64::min);
        Ok(best / total_ops.max(1) as f64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmm::allocator::backend::{SimBackend, SimConfig, SimMemoryMode};

    fn sim() -> &'static dyn Backend {
        match SimBackend::leak(SimConfig {
            devices: 1,
            capacity: 80 * GIB,
            mode: SimMemoryMode::Unbacked,
        }) {
            Ok(b) => b,
            Err(e) => panic!("simulated backend: {e}"),
        }
    }

    fn tiny() -> AllocatorBenchOptions {
        AllocatorBenchOptions {
            scale: 0.001,
            ..AllocatorBenchOptions::default()
        }
    }

    #[test]
    fn a_tiny_run_fills_every_cell_it_should() {
        let report = run(sim(), &tiny()).unwrap();
        assert!(report.simulated);
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        assert_eq!(report.rows.len(), 4);
        for row in &report.rows {
            for shape in Shape::ALL {
                let cell = row.ns_per_op[&shape];
                let expected = row.resource.runs_every_shape()
                    || matches!(shape, Shape::Churn | Shape::Random);
                assert_eq!(cell.is_some(), expected, "{} {shape}", row.resource);
                assert!(cell.is_none_or(|x| x.is_finite() && x > 0.0));
            }
        }
        let bases: Vec<_> = report.speedups.iter().map(|s| s.baseline).collect();
        assert_eq!(bases, [Resource::Async, Resource::Cuda]);
        assert!(report.speedups.iter().all(|s| s.rows.len() == 3));
        let text = report.to_string();
        assert!(
            text.starts_with("ns per operation (rmm-rs simulated GPU; lower is better)\n"),
            "{text}"
        );
        assert!(text.contains("| resource | churn | random | small | mt8 | mt16 |"));
        assert!(text.contains("|---|---|---|---|---|---|"));
        assert!(text.contains("| binning(pool) | "));
        assert!(text.contains("| cuda | ") && text.contains(" | – | – | – |"));
        assert!(text.contains("speed-up over async (its ns/op ÷ resource's ns/op, same run)"));
        assert!(text.contains("speed-up over cuda"));
        assert!(text.contains('×'));
    }

    #[test]
    fn a_selection_runs_only_its_rows_and_columns() {
        let options = AllocatorBenchOptions {
            resources: vec![Resource::Binning, Resource::Pool, Resource::Pool],
            shapes: vec![Shape::Small, Shape::Mt8],
            rounds: 2,
            ..tiny()
        };
        let report = run(sim(), &options).unwrap();
        let names: Vec<_> = report.rows.iter().map(|r| r.resource).collect();
        assert_eq!(names, [Resource::Binning, Resource::Pool]);
        assert!(report.speedups.is_empty());
        for row in &report.rows {
            assert_eq!(row.ns_per_op.len(), 2);
            assert!(row.ns_per_op.values().all(Option::is_some));
        }
        let text = report.to_string();
        assert!(
            text.contains("| resource | small | mt8 |\n|---|---|---|\n"),
            "{text}"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["rows"][0]["resource"], "binning(pool)");
        assert!(json["rows"][1]["ns_per_op"]["mt8"].is_f64());
        let back: AllocatorReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, report);
    }

    #[test]
    fn a_pool_that_does_not_fit_is_a_failure_not_an_error() {
        let options = AllocatorBenchOptions {
            resources: vec![Resource::Pool, Resource::Binning],
            shapes: vec![Shape::Churn],
            cap: 40 * GIB,
            ..tiny()
        };
        let report = run(sim(), &options).unwrap();
        assert_eq!(report.failures.len(), 2, "{:?}", report.failures);
        assert!(report.failures.iter().all(|f| f.shape.is_none()));
        assert!(report.failures[1].error.contains("its pool"));
        assert!(report.to_string().contains("| pool | – |"));
    }

    #[test]
    fn bad_options_are_errors() {
        for options in [
            AllocatorBenchOptions {
                scale: 0.0,
                ..tiny()
            },
            AllocatorBenchOptions {
                rounds: 0,
                ..tiny()
            },
            AllocatorBenchOptions {
                shapes: vec![],
                ..tiny()
            },
        ] {
            assert!(matches!(
                run(sim(), &options),
                Err(BenchError::InvalidOption { .. })
            ));
        }
        let options = AllocatorBenchOptions {
            device: 3,
            ..tiny()
        };
        assert!(matches!(
            run(sim(), &options),
            Err(BenchError::Allocator(_))
        ));
    }

    #[test]
    fn caps_fit_small_devices_and_leave_large_ones_alone() {
        let o = AllocatorBenchOptions::default();
        assert_eq!(o.clone().fitted_to(80 * GIB), o);
        assert_eq!(o.clone().fitted_to(24 * GIB), o);
        let small = o.fitted_to(12 * GIB);
        assert_eq!((small.cap, small.small_cap), (2 * GIB, GIB));
    }

    #[test]
    fn names_parse() {
        for r in Resource::ALL {
            assert_eq!(r.name().parse::<Resource>().unwrap(), r);
        }
        assert_eq!("binning".parse::<Resource>().unwrap(), Resource::Binning);
        for s in Shape::ALL {
            assert_eq!(s.name().parse::<Shape>().unwrap(), s);
        }
        assert_eq!("TINY".parse::<Scale>().unwrap(), Scale::Tiny);
        assert!("huge".parse::<Scale>().is_err());
        assert!("arena".parse::<Resource>().is_err());
        assert!("mt4".parse::<Shape>().is_err());
    }
}
