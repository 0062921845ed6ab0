//! Shared by the workspace's benchmarks (all in this directory): the choice of backend, the
//! spilling configuration, and the workload traces (from `rmm_cli::bench`, shared with
//! `rmm bench`).
#![allow(dead_code)]

mod backend;

#[allow(unused_imports)] // each bench uses one or the other
pub use backend::{backend_for_bench, backend_for_bench_with};
use rmm::allocator::StreamView;
use rmm::allocator::resource::DeviceMemoryResource;

// The traces live in the library (`rmm_cli::bench`), shared with `rmm bench`; each bench uses
// some of them.
#[allow(unused_imports)]
pub use rmm_cli::bench::{GIB, MIB, Op, Rng, churn_trace, random_trace};

/// Replays `ops`; returns ns per operation ([`rmm_cli::bench::replay`] with the error as text).
pub fn replay(
    mr: &dyn DeviceMemoryResource,
    ops: &[Op],
    stream: StreamView,
) -> Result<f64, String> {
    rmm_cli::bench::replay(mr, ops, stream).map_err(|e| e.to_string())
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
