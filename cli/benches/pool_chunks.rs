//! Pool chunk benchmark: what the pool's chunks cost to take and to give back, with chunks
//! mapped through CUDA's virtual memory API (`vmm`) and with one `cuMemAlloc` per chunk
//! (`alloc`), in the same run:
//!
//! * `create`: building a pool of `RMM_BENCH_POOL_GIB` GiB (default 64) that takes its
//!   initial size at once (RMM's `pool_memory_resource` with `initial_pool_size`);
//!   (also in chunks of 8 GiB, and in one chunk: what the number of chunks costs);
//! * `trim`: a pool of 9 GiB in 1 GiB chunks (grown one step at a time, so `alloc` has
//!   chunks to give back too), one block live in the first chunk, `trim(0)` giving the 8
//!   entirely free chunks back (the goal: ≤ 10 ms on an H100/H200);
//! * `grow`: an empty pool growing by 1 GiB steps to 8 GiB, per step.
//!
//! Medians of `RMM_BENCH_REPEATS` runs (default 5), in milliseconds. With a GPU
//! (`RMM_BACKEND=cuda`, or auto with a driver) it measures the driver; otherwise an unbacked
//! simulated device (bookkeeping only).

use std::sync::Arc;
use std::time::Instant;

use rmm::allocator::resource::DeviceMemoryResource;
use rmm::allocator::resource::{CudaMemoryResource, PoolMemoryResource, VirtualMemory};
use rmm::allocator::{Device, StreamView};

mod common;

use common::backend_for_bench;

const GIB: usize = 1 << 30;

fn builder(device: Device, mode: VirtualMemory) -> rmm::allocator::resource::PoolBuilder {
    PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(device)))
        .virtual_memory(mode)
        .growth(GIB as u64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Builds and drops a pool of `gib` GiB taken in chunks of `chunk_gib` GiB; the time to
/// build it.
fn create(
    device: Device,
    mode: VirtualMemory,
    gib: usize,
    chunk_gib: usize,
) -> Result<f64, String> {
    let t = Instant::now();
    let pool = builder(device, mode)
        .growth((chunk_gib * GIB) as u64)
        .initial_size((gib * GIB) as u64)
        .build()
        .map_err(|e| e.to_string())?;
    let took = ms(t);
    drop(pool);
    Ok(took)
}

/// A pool of 9 chunks of 1 GiB, one block live in the first: the time of `trim(0)`.
fn trim(device: Device, mode: VirtualMemory) -> Result<f64, String> {
    let pool = builder(device, mode)
        .initial_size(0)
        .build()
        .map_err(|e| e.to_string())?;
    let s = StreamView::DEFAULT;
    // Nine requests of just under a step, each growing the pool by one chunk.
    let blocks: Vec<_> = (0..9)
        .map(|_| pool.allocate(GIB - (64 << 20), s))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let size = pool.pool_size();
    for b in blocks.iter().skip(1) {
        pool.deallocate(*b, GIB - (64 << 20), s)
            .map_err(|e| e.to_string())?;
    }
    pool.synchronize().map_err(|e| e.to_string())?;
    device.synchronize().map_err(|e| e.to_string())?;
    let t = Instant::now();
    let released = pool.trim(0).map_err(|e| e.to_string())?;
    let took = ms(t);
    if released < 7 * GIB as u64 {
        return Err(format!(
            "trim gave back {released} of a {size}-byte pool: expected 8 GiB ({})",
            pool.chunk_source()
        ));
    }
    pool.deallocate(blocks[0], GIB - (64 << 20), s)
        .map_err(|e| e.to_string())?;
    Ok(took)
}

/// An empty pool grown to 8 GiB by 1 GiB steps: the time per step.
fn grow(device: Device, mode: VirtualMemory) -> Result<f64, String> {
    let pool = builder(device, mode)
        .initial_size(0)
        .build()
        .map_err(|e| e.to_string())?;
    let s = StreamView::DEFAULT;
    let n = GIB - (64 << 20);
    let t = Instant::now();
    let blocks: Vec<_> = (0..8)
        .map(|_| pool.allocate(n, s))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let took = ms(t) / 8.0;
    for b in blocks {
        pool.deallocate(b, n, s).map_err(|e| e.to_string())?;
    }
    Ok(took)
}

fn main() {
    let backend = backend_for_bench();
    let device = Device::on(backend, 0).expect("device 0");
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let repeats = env("RMM_BENCH_REPEATS", 5).max(1);
    let gib = env("RMM_BENCH_POOL_GIB", 64);
    let props = device.properties().expect("device properties");
    println!("backend: {}", backend.describe());
    println!(
        "device:  {} ({} total, virtual memory management: {})",
        props.name,
        rmm::allocator::fmt_bytes(props.total_memory),
        if props.supports_virtual_memory {
            "yes"
        } else {
            "no"
        }
    );
    println!("{:<30} {:>14} {:>14}", "shape", "vmm ms", "alloc ms");
    type Shape = Box<dyn Fn(Device, VirtualMemory) -> Result<f64, String>>;
    let shapes: Vec<(String, Shape)> = vec![
        (
            format!("create {gib} GiB"),
            Box::new(move |d, m| create(d, m, gib, 1)),
        ),
        (
            format!("create {gib} GiB, 8 GiB chunks"),
            Box::new(move |d, m| create(d, m, gib, 8)),
        ),
        (
            format!("create {gib} GiB, one chunk"),
            Box::new(move |d, m| create(d, m, gib, gib)),
        ),
        ("trim 8 GiB".into(), Box::new(trim)),
        ("grow 1 GiB".into(), Box::new(grow)),
    ];
    for (name, f) in shapes {
        let mut cells = Vec::new();
        for mode in [VirtualMemory::On, VirtualMemory::Off] {
            // Alternate nothing between modes within a repeat: each mode's runs back to back,
            // after one warm-up run.
            let cell = (|| -> Result<f64, String> {
                f(device, mode)?;
                let runs = (0..repeats)
                    .map(|_| f(device, mode))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(median(runs))
            })();
            cells.push(match cell {
                Ok(v) => format!("{v:>14.3}"),
                Err(e) => {
                    eprintln!("{name} ({mode:?}): {e}");
                    format!("{:>14}", "failed")
                }
            });
        }
        println!("{:<30} {}", name, cells.join(" "));
    }
}
