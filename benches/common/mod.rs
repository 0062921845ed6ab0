//! Shared by the library's benchmarks: the choice of backend and the spilling configuration.
//! (The benchmarks of the workload traces are the CLI crate's, `cli/benches`.)
#![allow(dead_code)]

mod backend;

#[allow(unused_imports)] // each bench uses one or the other
pub use backend::{backend_for_bench, backend_for_bench_with};

/// One mebibyte.
pub const MIB: usize = 1 << 20;
/// One gibibyte.
pub const GIB: usize = 1 << 30;

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
