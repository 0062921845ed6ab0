//! The choice of backend for a benchmark run.

use rmm::allocator::backend::{
    self, Backend, BackendChoice, CudaBackend, SimBackend, SimConfig, SimMemoryMode,
};

/// One gibibyte (the simulated device's size is given in it).
const GIB: usize = 1 << 30;

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
