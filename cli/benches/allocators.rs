//! Allocator benchmark: the workload shapes of ANCHORS.md through every resource in one run.
//!
//! churn  allocate 1 MiB, free it, repeated
//! random sizes log-uniform 256 B – 16 MiB, allocate with p = 0.55 while live bytes stay
//!        under a cap, else free a random live block; everything freed at the end
//! small  as random, 8 B – 64 KiB, cap 1 GiB
//! mt8 / mt16  8 or 16 threads, each `random` with its own seed, stream and share of the cap
//!
//! Figures are ns per operation (one allocate or one free); multi-thread figures are the
//! aggregate wall time over all threads' operations. With a GPU (`RMM_BACKEND=cuda`, or auto
//! with a driver) it measures the real thing; otherwise an unbacked simulated device, where
//! the pool's own bookkeeping is what is measured (the simulated "driver" has no latency).
//!
//! `RMM_BENCH_SCALE` (default 1.0) scales the operation counts; `RMM_BENCH_ONLY` limits the
//! run to a comma-separated list of resources (`cuda`, `async`, `pool`, `binning(pool)`);
//! `RMM_BENCH_ROUNDS` (default 1) is the number of timed passes per cell, of which the best is
//! shown.
//!
//! The implementation is `rmm_cli::bench` (shared with `rmm bench`); this is its `cargo bench`
//! front end.

use rmm_cli::bench::{AllocatorBenchOptions, Resource, run_allocators_with};

mod common;

use common::{GIB, backend_for_bench};

fn main() {
    let defaults = AllocatorBenchOptions::default();
    let scale: f64 = std::env::var("RMM_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(defaults.scale);
    let rounds: usize = std::env::var("RMM_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(defaults.rounds)
        .max(1);
    let resources: Vec<Resource> = match std::env::var("RMM_BENCH_ONLY") {
        Ok(only) => {
            let named: Vec<Resource> = only
                .split(',')
                .filter_map(|x| {
                    x.parse()
                        .map_err(|e| eprintln!("RMM_BENCH_ONLY: {e} (ignored)"))
                        .ok()
                })
                .collect();
            // Table order, whatever the order of the list.
            Resource::ALL
                .into_iter()
                .filter(|r| named.contains(r))
                .collect()
        }
        Err(_) => defaults.resources.clone(),
    };
    let options = AllocatorBenchOptions {
        scale,
        rounds,
        resources,
        ..defaults
    };
    let b = backend_for_bench();
    let report = run_allocators_with(b, &options, |row, failures| {
        for f in failures {
            eprintln!("{f}");
        }
        let cells: Vec<_> = row.ns_per_op.values().collect();
        eprintln!("{}: {cells:?}", row.resource);
    })
    .unwrap_or_else(|e| panic!("allocator benchmark: {e}"));
    println!("backend: {}", report.backend);
    println!(
        "device:  {} ({:.1} GiB)",
        report.device_name,
        report.total_memory as f64 / GIB as f64
    );
    println!();
    print!("{report}");
}
