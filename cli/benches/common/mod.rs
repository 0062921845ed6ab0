//! Shared by the CLI crate's benchmarks: the workload traces of ANCHORS.md (from
//! `rmm_cli::bench`) and the choice of backend (as in the library's `benches/common`).
#![allow(dead_code)]

use rmm::allocator::backend::{
    self, Backend, BackendChoice, CudaBackend, SimBackend, SimConfig, SimMemoryMode,
};
use rmm::allocator::{DeviceMemoryResource, StreamView};

// The traces live in the library (`rmm_cli::bench`), shared with `rmm bench`; each bench uses
// some of them.
#[allow(unused_imports)]
pub use rmm_cli::bench::{GIB, MIB, Op, Rng, churn_trace, random_trace};

/// The process-wide backend for this run: the GPU when there is one (or `RMM_BACKEND=cuda`),
/// else an unbacked simulated device of 80 GiB, so that allocator bookkeeping is measured.
pub fn backend_for_bench() -> &'static dyn Backend {
    backend_for_bench_with(1)
}

/// As [`backend_for_bench`], with `sim_devices` simulated devices when there is no GPU.
pub fn backend_for_bench_with(sim_devices: u32) -> &'static dyn Backend {
    let choice = BackendChoice::from_env().expect("RMM_BACKEND");
    let cuda = match choice {
        BackendChoice::Sim => None,
        _ => CudaBackend::load().ok().filter(|b| b.device_count() > 0),
    };
    let b: &'static dyn Backend = match (choice, cuda) {
        (_, Some(c)) => c,
        (BackendChoice::Cuda, None) => panic!("RMM_BACKEND=cuda but no CUDA device is visible"),
        _ => SimBackend::leak(SimConfig {
            devices: sim_devices,
            capacity: 80 * GIB,
            mode: SimMemoryMode::Unbacked,
        })
        .expect("simulated backend"),
    };
    if backend::install_global(b).is_err() {
        panic!("the process-wide backend was chosen before the benchmark could pick it");
    }
    b
}

/// Replays `ops`; returns ns per operation ([`rmm_cli::bench::replay`] with the error as text).
pub fn replay(
    mr: &dyn DeviceMemoryResource,
    ops: &[Op],
    stream: StreamView,
) -> Result<f64, String> {
    rmm_cli::bench::replay(mr, ops, stream).map_err(|e| e.to_string())
}
