//! The host side of spilling, on the current backend: how fast the pinned host pool is made
//! (beside `cuMemHostAlloc`), and copy bandwidth between the device and pinned or pageable
//! host memory, in the same run (issue goals: pin at ≥ 10 GB/s; spill at ≥ 90 % of the
//! pinned bandwidth measured here).
//!
//! `RMM_BENCH_HOST_POOL` (default `8GiB`; `512MiB` on the simulated device): the pool size.
//! `RMM_BENCH_COPY` (default `1GiB`): bytes per copy. `RMM_BENCH_ROUNDS` (default 5).

mod common;

use std::time::Instant;

use common::{GIB, MIB, backend_for_bench};
use rmm::allocator::backend::BackendKind;
use rmm::allocator::resource::{CudaMemoryResource, PinnedHostMemoryResource, PinnedHostPool};
use rmm::allocator::{Device, DeviceMemoryResource, HostMemoryResource, StreamView};

fn size(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse::<rmm::config::Size>().ok())
        .map_or(default, |s| s.resolve(u64::MAX) as usize)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn gbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

fn main() {
    let b = backend_for_bench();
    let sim = b.kind() == BackendKind::Sim;
    let rounds = std::env::var("RMM_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5usize)
        .max(1);
    let pool_bytes = size("RMM_BENCH_HOST_POOL", if sim { 512 * MIB } else { 8 * GIB });
    let copy = size("RMM_BENCH_COPY", if sim { 64 * MIB } else { GIB });
    let device = Device::on(b, 0).expect("device 0");
    println!("backend: {}", b.describe());
    if let Ok(p) = device.properties() {
        println!("device 0: {}", p.name);
    }
    println!(
        "cores: {}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!();

    // Pinning: the pool (pre-fault + register on several threads) against cuMemHostAlloc.
    let mut pool_rates = Vec::new();
    let mut pool = None;
    for _ in 0..rounds.min(3) {
        drop(pool.take());
        let t = Instant::now();
        let p = PinnedHostPool::on(b, pool_bytes).expect("pinned host pool");
        pool_rates.push(gbps(p.capacity(), t.elapsed().as_secs_f64()));
        pool = Some(p);
    }
    let pool = pool.expect("a pool");
    let alloc_bytes = pool_bytes.min(GIB);
    let host_alloc = PinnedHostMemoryResource::on(b);
    let mut alloc_rates = Vec::new();
    for _ in 0..rounds.min(3) {
        let t = Instant::now();
        let block = host_alloc
            .allocate(alloc_bytes, 4096)
            .expect("cuMemHostAlloc");
        alloc_rates.push(gbps(alloc_bytes, t.elapsed().as_secs_f64()));
        host_alloc.deallocate(block).expect("cuMemFreeHost");
    }
    println!("## Pinning host memory (median)");
    println!();
    println!("| how | bytes | GB/s |");
    println!("|---|---|---|");
    println!(
        "| PinnedHostPool (pre-fault + cuMemHostRegister, {} chunks of ≤ {} MiB) | {} MiB | {:.2} |",
        pool.capacity().div_ceil(pool.max_slice()),
        pool.max_slice() / MIB,
        pool.capacity() / MIB,
        median(pool_rates)
    );
    println!(
        "| cuMemHostAlloc | {} MiB | {:.2} |",
        alloc_bytes / MIB,
        median(alloc_rates)
    );
    println!();

    // Copies: one device buffer, pinned slices of at most one chunk, and pageable memory.
    let copy = copy.min(pool.max_slice());
    let mr = CudaMemoryResource::new(device);
    let dev = mr
        .allocate(copy, StreamView::DEFAULT)
        .expect("device buffer");
    device.memset(dev, 0x5a, copy).expect("memset");
    let mut pinned = pool.allocate(copy).expect("pinned slice");
    let mut pageable = vec![0u8; copy];
    let rates = |f: &mut dyn FnMut()| -> f64 {
        f(); // warm-up
        median(
            (0..rounds)
                .map(|_| {
                    let t = Instant::now();
                    f();
                    gbps(copy, t.elapsed().as_secs_f64())
                })
                .collect(),
        )
    };
    let d2h_pinned = rates(&mut || {
        device
            .copy_to_host(pinned.as_mut_slice(), dev)
            .expect("DtoH")
    });
    let h2d_pinned = rates(&mut || device.copy_to_device(dev, pinned.as_slice()).expect("HtoD"));
    let d2h_pageable = rates(&mut || device.copy_to_host(&mut pageable, dev).expect("DtoH"));
    let h2d_pageable = rates(&mut || device.copy_to_device(dev, &pageable).expect("HtoD"));
    println!("## Copies of {} MiB (median of {rounds}), GB/s", copy / MIB);
    println!();
    println!("| direction | pinned (pool slice) | pageable | pinned / pageable |");
    println!("|---|---|---|---|");
    println!(
        "| device → host | {d2h_pinned:.1} | {d2h_pageable:.1} | {:.1}× |",
        d2h_pinned / d2h_pageable
    );
    println!(
        "| host → device | {h2d_pinned:.1} | {h2d_pageable:.1} | {:.1}× |",
        h2d_pinned / h2d_pageable
    );
    mr.deallocate(dev, copy, StreamView::DEFAULT).expect("free");
    if sim {
        println!();
        println!("(simulated device: copies move no bytes; the figures measure bookkeeping only)");
    }
}
