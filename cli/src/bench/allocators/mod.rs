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
//! [`run`] returns an [`AllocatorReport`]; [`AllocatorReport::render`] gives its tables as aligned
//! text (`rmm bench`) or markdown (`rmm bench --format markdown`, `cargo bench --bench
//! allocators`), and it serializes to JSON.
//!
//! One idea per file: [`Resource`]s and how they are built, the [`Shape`]s and [`Scale`]s of
//! a run, the [`AllocatorBenchOptions`], the measurements (one thread, many threads), and the
//! [`AllocatorReport`] with its same-run ratios.

mod measure;
mod options;
mod report;
mod resources;
mod shapes;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use rmm::allocator::backend::{Backend, BackendKind};
use rmm::allocator::{Device, Stream};

use super::BenchError;
use super::traces::{MIB, Op, churn_trace, random_trace};
use measure::{multi, single};
use report::speedups;
use resources::build_resources;

pub use options::AllocatorBenchOptions;
pub use report::{AllocatorReport, Failure, ResourceRow, SpeedupRow, Speedups};
pub use resources::Resource;
pub use shapes::{Scale, Shape};

/// Runs the benchmark on device `options.device` of `backend`.
///
/// A resource that cannot be created, or a cell that fails (out of memory, say), is recorded
/// in [`AllocatorReport::failures`] and leaves its cells `None`; the run goes on. Errors are
/// invalid options and a device that cannot be opened.
///
/// # Errors
/// [`BenchError::InvalidOption`] for invalid options; [`BenchError::Allocator`] when the device or
/// its stream cannot be opened.
pub fn run(
    backend: &'static dyn Backend,
    options: &AllocatorBenchOptions,
) -> Result<AllocatorReport, BenchError> {
    run_with(backend, options, |_, _| {})
}

/// As [`run`], calling `on_row` with each row (and that resource's failures) as soon as it is
/// measured: progress for long runs.
///
/// # Errors
/// As [`run`]: [`BenchError::InvalidOption`] or [`BenchError::Allocator`].
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
