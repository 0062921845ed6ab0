//! Spilling, on the current backend, all in one run: how fast the pinned host pool is made
//! (beside `cuMemHostAlloc`); copy bandwidth between the device and pinned or pageable host
//! memory; spill and unspill of `SpillableBuffer`s through a runtime's spill manager, as a
//! fraction of that pinned bandwidth; and reinitialize pool → pool keeping live spillable
//! data (issue goals: pin at ≥ 10 GB/s; spill and unspill of ≥ 64 MiB at ≥ 90 % of the pinned
//! bandwidth; reinitialize keeping 8 GiB within 5 ms, the new pool taking it over in place).
//!
//! `RMM_BENCH_HOST_POOL` (default `8GiB`; `512MiB` on the simulated device): the pool size.
//! `RMM_BENCH_COPY` (default `1GiB`): bytes per copy. `RMM_BENCH_ROUNDS` (default 5).
//! `RMM_BENCH_LIVE` (default `8GiB`; `512MiB` simulated): live spillable data across the
//! reinitialize. `RMM_BENCH_DISK` (default: a temporary directory): the disk tier's directory.

mod common;

use std::time::{Duration, Instant};

use common::{GIB, MIB, backend_for_bench, spilling_config};
use rmm::allocator::backend::BackendKind;
use rmm::allocator::resource::{CudaMemoryResource, PinnedHostMemoryResource, PinnedHostPool};
use rmm::allocator::resource::{DeviceMemoryResource, HostMemoryResource};
use rmm::allocator::{Device, StreamView};
use rmm::config::Config;
use rmm::runtime::Runtime;

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

    // Pinning: the pool (pre-fault on several threads, register chunk by chunk) against
    // cuMemHostAlloc.
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
    drop(pinned);
    drop(pool);

    let live = size("RMM_BENCH_LIVE", if sim { 512 * MIB } else { 8 * GIB });
    spill_unspill(sim, rounds, live, (d2h_pinned, h2d_pinned));
    if sim {
        println!();
        println!("(simulated device: copies move no bytes; the figures measure bookkeeping only)");
    }
}

/// One device, a 32 GiB pool (2 GiB simulated), spilling with a fixed host pool of
/// `host_pool` bytes, eager unspilling, and a disk tier when `disk` is given.
fn spilling(sim: bool, host_pool: usize, disk: Option<&std::path::Path>) -> Config {
    spilling_config(1, if sim { "2GiB" } else { "32GiB" }, host_pool, disk)
}

/// Spill and unspill bandwidth through the spill manager, then reinitialize with `live`
/// bytes of spillable data; `pinned` is the (device → host, host → device) pinned copy
/// bandwidth of this run.
fn spill_unspill(sim: bool, rounds: usize, live: usize, pinned: (f64, f64)) {
    let s = StreamView::DEFAULT;
    let host_pool = live + GIB;
    let rt = Runtime::start(&spilling(sim, host_pool, None)).expect("runtime");
    let m = rt.spill_manager(0).expect("spill manager");
    println!();
    println!(
        "## Spill and unspill through the spill manager (median of {rounds}), GB/s and share of the pinned copy bandwidth above"
    );
    println!();
    println!("| buffer | spill (device → host) | | unspill (host → device) | |");
    println!("|---|---|---|---|---|");
    for bytes in [64 * MIB, 256 * MIB, GIB] {
        let b = m.buffer(bytes, s).expect("spillable buffer");
        let (mut out, mut back) = (Vec::new(), Vec::new());
        for _ in 0..=rounds {
            let t = Instant::now();
            assert_eq!(b.spill().expect("spill"), bytes);
            out.push(gbps(bytes, t.elapsed().as_secs_f64()));
            let t = Instant::now();
            drop(b.device_view(s).expect("unspill"));
            back.push(gbps(bytes, t.elapsed().as_secs_f64()));
        }
        // The first round warms up.
        let (o, i) = (median(out[1..].to_vec()), median(back[1..].to_vec()));
        println!(
            "| {} MiB | {o:.1} | {:.0} % | {i:.1} | {:.0} % |",
            bytes / MIB,
            100.0 * o / pinned.0,
            100.0 * i / pinned.1
        );
    }

    // Reinitialize pool → pool with `live` bytes of spillable data in 256 MiB buffers: the new
    // pool takes them over where they are (what it cannot take goes to the host and, eagerly,
    // comes back into it).
    let piece = (256 * MIB).min(live);
    let buffers: Vec<_> = (0..live / piece)
        .map(|_| m.buffer(piece, s).expect("spillable buffer"))
        .collect();
    let cfg = spilling(sim, host_pool, None);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (mut total, mut spill, mut unspill, mut rest) = (vec![], vec![], vec![], vec![]);
    let mut kept = u64::MAX;
    for _ in 0..rounds {
        let r = rt.reinitialize(&cfg).expect("reinitialize");
        let all = (buffers.len() * piece) as u64;
        assert_eq!(r.kept_in_place_bytes + r.spilled_bytes, all, "{r}");
        assert_eq!(r.unspilled_bytes, r.spilled_bytes, "{r}");
        kept = kept.min(r.kept_in_place_bytes);
        total.push(ms(r.total));
        spill.push(ms(r.spill));
        unspill.push(ms(r.unspill));
        rest.push(ms(r.total - r.spill - r.unspill));
    }
    let bytes = (buffers.len() * piece) as f64;
    let copy_ms = (bytes / (pinned.0 * 1e9) + bytes / (pinned.1 * 1e9)) * 1e3;
    println!();
    println!(
        "## reinitialize pool → pool keeping {} MiB of live spillable data ({} buffers, eager unspill; median of {rounds}), ms",
        buffers.len() * piece / MIB,
        buffers.len()
    );
    println!();
    println!(
        "| total | kept in place | spill | unspill | everything else | goal | copying it all at pinned bandwidth |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {:.2} | {} MiB | {:.2} | {:.2} | {:.2} | 5 | {copy_ms:.1} |",
        median(total),
        kept >> 20,
        median(spill),
        median(unspill),
        median(rest),
    );
    drop(buffers);
    rt.shutdown().expect("shutdown");

    // The disk tier, for scale: a host pool of 64 MiB, so 1 GiB goes straight to disk.
    let dir = std::env::var_os("RMM_BENCH_DISK")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::env::temp_dir().join(format!("rmm-bench-spill-{}", std::process::id()))
        });
    let rt = Runtime::start(&spilling(sim, 64 * MIB, Some(&dir))).expect("runtime");
    let m = rt.spill_manager(0).expect("spill manager");
    let bytes = GIB.min(live);
    let b = m.buffer(bytes, s).expect("spillable buffer");
    let t = Instant::now();
    b.spill().expect("spill to disk");
    let out = gbps(bytes, t.elapsed().as_secs_f64());
    let t = Instant::now();
    drop(b.device_view(s).expect("unspill from disk"));
    let back = gbps(bytes, t.elapsed().as_secs_f64());
    println!();
    println!(
        "## Disk tier ({}): {} MiB device → disk {out:.2} GB/s, disk → device {back:.2} GB/s (page cache included)",
        dir.display(),
        bytes / MIB
    );
    drop(b);
    rt.shutdown().expect("shutdown");
    let _ = std::fs::remove_dir(&dir);
}
