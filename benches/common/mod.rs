//! Shared by the library's benchmarks: the choice of backend and the spilling configuration.
//! (The benchmarks of the ANCHORS.md workload traces are the CLI crate's, `cli/benches`.)
#![allow(dead_code)]

use rmm::allocator::backend::{
    self, Backend, BackendChoice, CudaBackend, SimBackend, SimConfig, SimMemoryMode,
};

/// One mebibyte.
pub const MIB: usize = 1 << 20;
/// One gibibyte.
pub const GIB: usize = 1 << 30;

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

/// `devices` devices (0, 1, …), one worker each, a pool of exactly `pool` per device, and
/// spilling on: eager unspill, no device limit below the pool, a fixed pinned host pool of
/// `host_pool` bytes per device, and a disk tier in `disk` when given.
pub fn spilling_config(
    devices: u32,
    pool: &str,
    host_pool: usize,
    disk: Option<&std::path::Path>,
) -> rmm::config::Config {
    let list: Vec<i64> = (0..i64::from(devices)).collect();
    let mut l = rmm::config::ConfigLoader::new()
        .no_file()
        .no_env()
        .set("devices", list)
        .set("workers_per_device", 1i64)
        .set("pool.enabled", true)
        .set("pool.initial_size", pool)
        .set("pool.maximum_size", pool)
        .set("spill.enabled", true)
        .set("spill.device_memory_limit", pool)
        .set("spill.eager_unspill", true)
        .set("spill.host_pool_size", format!("{}MiB", host_pool >> 20));
    if let Some(d) = disk {
        l = l.set("spill.disk_directory", d.display().to_string());
    }
    l.load().expect("bench configuration")
}
