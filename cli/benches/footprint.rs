//! Footprint benchmark: what a resource reserves, phase by phase, for the multi-stream
//! workload of `rmm_cli::bench::footprint` (one stream, then 8 and 16 threads on streams of their
//! own, then 8 threads sharing one stream; three rounds; streams kept alive; 8 GiB live at
//! most). Prints, per phase, the bytes reserved against the peak of the live bytes.
//!
//! Resources: `pool` (a `PoolMemoryResource` that starts empty, default growth step; its
//! reserved bytes are its size) and `async` (`cudaMallocAsync`'s pool, where the device
//! supports it; its reserved bytes are the driver pool's). With a GPU (`RMM_BACKEND=cuda`,
//! or auto with a driver) it measures the real thing; otherwise an unbacked simulated device
//! (whose driver pool keeps nothing once freed: `async` then reads 0 after every phase).
//!
//! `RMM_BENCH_SCALE` (default 1.0) scales the trace steps; `RMM_BENCH_ONLY` limits the run to
//! a comma-separated list of `pool`, `async`.

use std::sync::Arc;

use rmm::allocator::Device;
use rmm::allocator::resource::SharedResource;
use rmm::allocator::resource::{CudaAsyncMemoryResource, CudaMemoryResource, PoolMemoryResource};
use rmm_cli::bench::footprint::{FootprintOptions, FootprintReport, run};

mod common;

use common::backend_for_bench;

/// One resource's run.
type Run = fn(Device, &FootprintOptions) -> Result<FootprintReport, String>;

fn pool(device: Device, options: &FootprintOptions) -> Result<FootprintReport, String> {
    let pool = Arc::new(
        PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(device)))
            .initial_size(0)
            .build()
            .map_err(|e| e.to_string())?,
    );
    let mr: SharedResource = pool.clone();
    let report =
        run(&mr, device, options, || Ok(pool.pool_size()), "pool").map_err(|e| e.to_string())?;
    println!("pool at the end: {}", pool.usage().summary());
    Ok(report)
}

fn cuda_async(device: Device, options: &FootprintOptions) -> Result<FootprintReport, String> {
    let a = Arc::new(CudaAsyncMemoryResource::new(device).map_err(|e| e.to_string())?);
    let mr: SharedResource = a.clone();
    run(&mr, device, options, || a.reserved_bytes(), "async").map_err(|e| e.to_string())
}

fn main() {
    let backend = backend_for_bench();
    let scale: f64 = std::env::var("RMM_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let only = std::env::var("RMM_BENCH_ONLY").unwrap_or_else(|_| "pool,async".into());
    let defaults = FootprintOptions::default();
    let options = FootprintOptions {
        steps: ((defaults.steps as f64 * scale) as usize).max(1),
        ..defaults
    };
    let device = Device::on(backend, 0).expect("device 0");
    println!("backend: {}", backend.describe());
    println!(
        "device:  {} total",
        rmm::allocator::fmt_bytes(device.mem_info().expect("memory info").total)
    );
    let runs: [(&str, Run); 2] = [("pool", pool), ("async", cuda_async)];
    for (name, f) in runs {
        if !only.split(',').any(|x| x.trim() == name) {
            continue;
        }
        match f(device, &options) {
            Ok(report) => println!("{report}"),
            Err(e) => println!("{name}: could not run: {e}\n"),
        }
        // Each resource starts on an idle device.
        if let Err(e) = device.synchronize() {
            println!("synchronizing the device: {e}");
        }
    }
}
