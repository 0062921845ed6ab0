//! The runtime's costs: an empty task's round trip and aggregate task throughput (beside
//! `rayon::spawn` plus a latch, measured in the same run), and start-up and reinitialize on
//! 1, 2, 4 … devices (issue goals: round trip ≤ 2 µs, ≥ 1 M tasks/s with 8 workers, N
//! devices ≤ 1.3× one device).
//!
//! Reinitialize also runs pool → pool keeping live spillable data on every device: the new
//! pools take the data's blocks over where they are (issue 21's goal: ≤ 5 ms for 8 GiB on an
//! H200, no spill move), beside the same data taken through pinned host memory and back
//! (spill everything, reinitialize, eager unspill: what reinitialize did before).
//!
//! `RMM_BENCH_POOL` (default `32GiB`): the pool size of the start-up and reinitialize runs.
//! `RMM_BENCH_LIVE` (default `8GiB`, simulated `512MiB`): live spillable data per device.
//! `RMM_BENCH_PIECE` (default `256MiB`): the size of its buffers.
//! `RMM_BENCH_ROUNDS` (default 5): rounds per figure (the median is reported).
//! `RMM_BENCH_TASKS` (default 200000): tasks in the throughput runs.
//! `RMM_BENCH_ONLY` (default: all): the sections to run, comma-separated, of `tasks`,
//! `lifecycle`, `keeping` (pool → pool with live data) and `driver`.
//! `RMM_BENCH_VERBOSE`: print each reinitialize's report.
//! Without a GPU, an unbacked simulated backend of `RMM_BENCH_DEVICES` (default 4) devices.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::Thread;
use std::time::{Duration, Instant};

use common::{backend_for_bench_with, spilling_config};
use rmm::allocator::backend::BackendKind;
use rmm::allocator::resource::DeviceMemoryResource;
use rmm::config::{Config, ConfigLoader};
use rmm::runtime::{Runtime, TaskHandle};

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn config(devices: u32, workers: u32, pool: Option<&str>) -> Config {
    let list: Vec<i64> = (0..devices as i64).collect();
    let mut l = ConfigLoader::new()
        .no_file()
        .no_env()
        .set("devices", list)
        .set("workers_per_device", i64::from(workers));
    if let Some(size) = pool {
        l = l
            .set("pool.enabled", true)
            .set("pool.initial_size", size)
            .set("pool.maximum_size", size);
    }
    l.load().expect("bench configuration")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A one-shot latch: set by the task, waited for by the submitter (spin, then park), the way
/// a `TaskHandle` waits.
struct Latch {
    set: AtomicBool,
    waiter: Thread,
}

impl Latch {
    fn new() -> Arc<Latch> {
        Arc::new(Latch {
            set: AtomicBool::new(false),
            waiter: std::thread::current(),
        })
    }
    fn set(&self) {
        self.set.store(true, Ordering::Release);
        self.waiter.unpark();
    }
    fn wait(&self) {
        let spin_until = Instant::now() + Duration::from_micros(20);
        while !self.set.load(Ordering::Acquire) {
            if Instant::now() < spin_until {
                std::hint::spin_loop();
            } else {
                std::thread::park();
            }
        }
    }
}

/// Counts down to zero, then wakes the waiter.
struct CountLatch {
    left: AtomicUsize,
    waiter: Thread,
}

fn round_trip_runtime(tasks: usize) -> f64 {
    let rt = Runtime::start(&config(1, 1, None)).expect("runtime");
    for _ in 0..1000 {
        rt.submit(|_| ()).wait().expect("warm-up");
    }
    let start = Instant::now();
    for _ in 0..tasks {
        rt.submit(|_| ()).wait().expect("task");
    }
    start.elapsed().as_nanos() as f64 / tasks as f64
}

fn round_trip_rayon(pool: &rayon::ThreadPool, tasks: usize) -> f64 {
    let run = |n: usize| {
        for _ in 0..n {
            let latch = Latch::new();
            let l = Arc::clone(&latch);
            pool.spawn(move || l.set());
            latch.wait();
        }
    };
    run(1000);
    let start = Instant::now();
    run(tasks);
    start.elapsed().as_nanos() as f64 / tasks as f64
}

fn throughput_runtime(workers: u32, tasks: usize) -> f64 {
    let rt = Runtime::start(&config(1, workers, None)).expect("runtime");
    let run = |n: usize| {
        let handles: Vec<TaskHandle<()>> = (0..n).map(|_| rt.submit(|_| ())).collect();
        for h in handles {
            h.wait().expect("task");
        }
    };
    run(10_000);
    let start = Instant::now();
    run(tasks);
    tasks as f64 / start.elapsed().as_secs_f64()
}

fn throughput_rayon(pool: &rayon::ThreadPool, tasks: usize) -> f64 {
    let run = |n: usize| {
        let latch = Arc::new(CountLatch {
            left: AtomicUsize::new(n),
            waiter: std::thread::current(),
        });
        for _ in 0..n {
            let l = Arc::clone(&latch);
            pool.spawn(move || {
                if l.left.fetch_sub(1, Ordering::AcqRel) == 1 {
                    l.waiter.unpark();
                }
            });
        }
        while latch.left.load(Ordering::Acquire) > 0 {
            std::thread::park();
        }
    };
    run(10_000);
    let start = Instant::now();
    run(tasks);
    tasks as f64 / start.elapsed().as_secs_f64()
}

struct Lifecycle {
    start: f64,
    pool_to_pool: f64,
    pool_to_cuda: f64,
    cuda_to_pool: f64,
    shutdown: f64,
}

fn lifecycle(devices: u32, pool: &str, rounds: usize) -> Lifecycle {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (mut s, mut pp, mut pc, mut cp, mut sd) = (vec![], vec![], vec![], vec![], vec![]);
    let pooled = config(devices, 1, Some(pool));
    let plain = config(devices, 1, None);
    for _ in 0..rounds {
        let t = Instant::now();
        let rt = Runtime::start(&pooled).expect("start");
        s.push(ms(t.elapsed()));
        if std::env::var_os("RMM_BENCH_VERBOSE").is_some() {
            eprintln!("{devices} device(s): {}", rt.report().start);
        }
        pp.push(ms(rt.reinitialize(&pooled).expect("pool → pool").total));
        pc.push(ms(rt.reinitialize(&plain).expect("pool → cuda").total));
        cp.push(ms(rt.reinitialize(&pooled).expect("cuda → pool").total));
        let t = Instant::now();
        rt.shutdown().expect("shutdown");
        sd.push(ms(t.elapsed()));
    }
    Lifecycle {
        start: median(s),
        pool_to_pool: median(pp),
        pool_to_cuda: median(pc),
        cuda_to_pool: median(cp),
        shutdown: median(sd),
    }
}

/// Reinitialize pool → pool keeping live spillable data: medians in ms, and what happened to
/// the data (the least kept in place and the most spilled of any round).
struct Keeping {
    total: f64,
    spill: f64,
    build: f64,
    unspill: f64,
    kept: u64,
    spilled: u64,
    /// Spill moves (device → host or back) during the reinitializes, most of any round.
    moves: u64,
    /// The same data through pinned host memory instead: spill everything (devices in
    /// parallel), then reinitialize (eager unspill brings it back).
    through_host: f64,
}

/// Reinitialize pool → pool on `devices` devices with `live` bytes of spillable data on each
/// (buffers of `piece` bytes), a mark at each end of every buffer checked after the rounds.
fn reinit_keeping(devices: u32, pool: &str, live: usize, piece: usize, rounds: usize) -> Keeping {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let cfg = spilling_config(devices, pool, live + (1 << 30), None);
    let rt = Runtime::start(&cfg).expect("start with spilling");
    let piece = piece.min(live).max(1);
    let managers: Vec<_> = (0..devices)
        .map(|d| rt.spill_manager(d).expect("spill manager"))
        .collect();
    let mut buffers = Vec::new();
    for (d, m) in managers.iter().enumerate() {
        for i in 0..live / piece {
            let b = m
                .buffer(piece, rmm::allocator::StreamView::DEFAULT)
                .expect("spillable buffer");
            // A mark at each end, checked after the rounds.
            let mark = (d * 131 + i) as u8;
            let guard = b.device_view(rmm::allocator::StreamView::DEFAULT).unwrap();
            b.device().memset(guard.ptr(), mark, piece).expect("memset");
            drop(guard);
            buffers.push((b, mark));
        }
    }
    let moves = || -> u64 {
        managers
            .iter()
            .map(|m| {
                let s = m.statistics();
                s.spilled_count + s.unspilled_count
            })
            .sum()
    };
    let expect = (buffers.len() * piece) as u64;
    let verbose = std::env::var_os("RMM_BENCH_VERBOSE").is_some();
    let (mut total, mut spill, mut build, mut unspill) = (vec![], vec![], vec![], vec![]);
    let (mut kept, mut spilled, mut moved) = (u64::MAX, 0, 0);
    for _ in 0..rounds {
        let before = moves();
        let r = rt
            .reinitialize(&cfg)
            .expect("reinitialize keeping live data");
        if verbose {
            eprintln!("{devices} device(s), keeping: {r}");
        }
        assert_eq!(r.kept_in_place_bytes + r.spilled_bytes, expect, "{r}");
        moved = moved.max(moves() - before);
        kept = kept.min(r.kept_in_place_bytes);
        spilled = spilled.max(r.spilled_bytes);
        total.push(ms(r.total));
        spill.push(ms(r.spill));
        build.push(ms(r.build));
        unspill.push(ms(r.unspill));
    }
    let mut host = vec![];
    for _ in 0..rounds {
        let t = Instant::now();
        std::thread::scope(|s| {
            for m in &managers {
                s.spawn(move || m.spill_all().expect("spill everything"));
            }
        });
        let r = rt.reinitialize(&cfg).expect("reinitialize");
        host.push(ms(t.elapsed()));
        if verbose {
            eprintln!("{devices} device(s), through the host: {r}");
        }
        assert_eq!(r.unspilled_bytes, expect, "{r}");
    }
    // The marks (an unbacked simulated device keeps no bytes).
    for (b, mark) in buffers
        .iter()
        .filter(|(b, _)| b.device().backend().kind() != BackendKind::Sim)
    {
        let guard = b
            .device_view(rmm::allocator::StreamView::DEFAULT)
            .expect("on the device");
        let (mut first, mut last) = ([0u8], [0u8]);
        b.device().copy_to_host(&mut first, guard.ptr()).unwrap();
        let end = rmm::allocator::backend::DevicePtr(guard.ptr().addr() + piece as u64 - 1);
        b.device().copy_to_host(&mut last, end).unwrap();
        assert!(
            first[0] == *mark && last[0] == *mark,
            "buffer {} lost its data",
            b.id()
        );
    }
    drop(buffers);
    drop(managers);
    rt.shutdown().expect("shutdown");
    Keeping {
        total: median(total),
        spill: median(spill),
        build: median(build),
        unspill: median(unspill),
        kept,
        spilled,
        moves: moved,
        through_host: median(host),
    }
}

/// Allocates and then frees `bytes` with `cuMemAlloc`/`cuMemFree` on each of `devices` at
/// once, one thread per device; returns the slowest thread's (allocate, free) in ms. With one
/// device this is the driver's own cost; with several, whether the driver serializes them.
fn driver_alloc_free(devices: u32, bytes: usize) -> (f64, f64) {
    let barrier = std::sync::Barrier::new(devices as usize);
    let times: Vec<(f64, f64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..devices)
            .map(|d| {
                let barrier = &barrier;
                s.spawn(move || {
                    let device = rmm::allocator::Device::new(d).expect("device");
                    let r = rmm::allocator::resource::CudaMemoryResource::new(device);
                    barrier.wait();
                    let t = Instant::now();
                    let p = r
                        .allocate(bytes, rmm::allocator::StreamView::DEFAULT)
                        .expect("cuMemAlloc");
                    let alloc = t.elapsed().as_secs_f64() * 1e3;
                    barrier.wait();
                    let t = Instant::now();
                    r.deallocate(p, bytes, rmm::allocator::StreamView::DEFAULT)
                        .expect("cuMemFree");
                    (alloc, t.elapsed().as_secs_f64() * 1e3)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    times
        .into_iter()
        .fold((0.0, 0.0), |(a, f), (x, y)| (a.max(x), f.max(y)))
}

fn main() {
    let sim_devices = env_usize("RMM_BENCH_DEVICES", 4) as u32;
    let b = backend_for_bench_with(sim_devices);
    let rounds = env_usize("RMM_BENCH_ROUNDS", 5).max(1);
    let tasks = env_usize("RMM_BENCH_TASKS", 200_000).max(1000);
    let pool = std::env::var("RMM_BENCH_POOL").unwrap_or_else(|_| "32GiB".into());
    println!("backend: {}", b.describe());
    for d in 0..b.device_count() {
        if let Ok(p) = b.properties(d) {
            println!(
                "device {d}: {} ({:.1} GiB)",
                p.name,
                p.total_memory as f64 / (1u64 << 30) as f64
            );
        }
    }
    println!(
        "cores: {}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!();
    let only = std::env::var("RMM_BENCH_ONLY").unwrap_or_default();
    let run = |section: &str| only.is_empty() || only.split(',').any(|s| s.trim() == section);
    let mut counts = vec![1u32];
    let mut k = 2;
    while k <= b.device_count() {
        counts.push(k);
        k *= 2;
    }
    if run("tasks") {
        tasks_section(rounds, tasks);
    }
    if run("lifecycle") {
        lifecycle_section(&counts, &pool, rounds);
    }
    if run("keeping") {
        let sim = b.kind() == BackendKind::Sim;
        keeping_section(&counts, &pool, rounds, sim);
    }
    if run("driver") {
        driver_section(b, &counts, &pool, rounds);
    }
}

fn tasks_section(rounds: usize, tasks: usize) {
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("rayon pool");
    let eight = rayon::ThreadPoolBuilder::new()
        .num_threads(8)
        .build()
        .expect("rayon pool");
    let rt_rt = median(
        (0..rounds)
            .map(|_| round_trip_runtime(tasks / 10))
            .collect(),
    );
    let ry_rt = median(
        (0..rounds)
            .map(|_| round_trip_rayon(&one, tasks / 10))
            .collect(),
    );
    let rt_tp = median((0..rounds).map(|_| throughput_runtime(8, tasks)).collect());
    let ry_tp = median(
        (0..rounds)
            .map(|_| throughput_rayon(&eight, tasks))
            .collect(),
    );
    println!("## Tasks (median of {rounds} rounds)");
    println!();
    println!("| measure | runtime | rayon::spawn + latch | runtime / rayon |");
    println!("|---|---|---|---|");
    println!(
        "| empty task round trip, 1 worker (µs) | {:.2} | {:.2} | {:.2}× |",
        rt_rt / 1e3,
        ry_rt / 1e3,
        rt_rt / ry_rt
    );
    println!(
        "| empty tasks/s, 8 workers (M/s) | {:.2} | {:.2} | {:.2}× slower |",
        rt_tp / 1e6,
        ry_tp / 1e6,
        ry_tp / rt_tp
    );
    println!();
}

fn lifecycle_section(counts: &[u32], pool: &str, rounds: usize) {
    // One untimed round on every device first, so that one-time driver costs (contexts,
    // first mappings) fall on no row of the table.
    lifecycle(*counts.last().unwrap_or(&1), pool, 1);
    println!("## Start-up and reinitialize, pool {pool} per device, ms (median of {rounds})");
    println!();
    println!("| devices | start | pool → pool | pool → cuda | cuda → pool | shutdown |");
    println!("|---|---|---|---|---|---|");
    let mut base: Option<Lifecycle> = None;
    for &n in counts {
        let l = lifecycle(n, pool, rounds);
        let ratio = |a: f64, b: Option<f64>| match b {
            Some(b) if n > 1 && b > 0.0 => format!(" ({:.2}×)", a / b),
            _ => String::new(),
        };
        println!(
            "| {n} | {:.1}{} | {:.1}{} | {:.1}{} | {:.1}{} | {:.1}{} |",
            l.start,
            ratio(l.start, base.as_ref().map(|b| b.start)),
            l.pool_to_pool,
            ratio(l.pool_to_pool, base.as_ref().map(|b| b.pool_to_pool)),
            l.pool_to_cuda,
            ratio(l.pool_to_cuda, base.as_ref().map(|b| b.pool_to_cuda)),
            l.cuda_to_pool,
            ratio(l.cuda_to_pool, base.as_ref().map(|b| b.cuda_to_pool)),
            l.shutdown,
            ratio(l.shutdown, base.as_ref().map(|b| b.shutdown)),
        );
        if base.is_none() {
            base = Some(l);
        }
    }
    println!();
    println!("(ratios: against 1 device in this run; goal ≤ 1.3×)");
    println!();
}

fn keeping_section(counts: &[u32], pool: &str, rounds: usize, sim: bool) {
    let live = std::env::var("RMM_BENCH_LIVE")
        .ok()
        .and_then(|v| v.parse::<rmm::config::Size>().ok())
        .map_or(if sim { 512 << 20 } else { 8 << 30 }, |s| {
            s.resolve(0) as usize
        });
    let piece = std::env::var("RMM_BENCH_PIECE")
        .ok()
        .and_then(|v| v.parse::<rmm::config::Size>().ok())
        .map_or(256 << 20, |s| s.resolve(0) as usize);
    println!(
        "## Reinitialize pool → pool keeping {} MiB of live spillable data per device ({} buffers of {} KiB), ms (median of {rounds})",
        live >> 20,
        live / piece.min(live).max(1),
        piece.min(live) >> 10
    );
    println!();
    println!(
        "| devices | total | spill | build | unspill | kept in place | spilled | spill moves | through the host instead |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut base: Option<f64> = None;
    for &n in counts {
        let k = reinit_keeping(n, pool, live, piece, rounds);
        let ratio = match base {
            Some(b) if n > 1 && b > 0.0 => format!(" ({:.2}×)", k.total / b),
            _ => String::new(),
        };
        println!(
            "| {n} | {:.2}{ratio} | {:.2} | {:.2} | {:.2} | {} MiB | {} MiB | {} | {:.1} |",
            k.total,
            k.spill,
            k.build,
            k.unspill,
            k.kept >> 20,
            k.spilled >> 20,
            k.moves,
            k.through_host,
        );
        base.get_or_insert(k.total);
    }
    println!();
    println!(
        "(kept in place: the new pools took the data over where it was, no copy; spill moves 0 \
         means no byte went to the host. Goal: total ≤ 5 ms for 8 GiB on an H200. Through the \
         host: spill everything, reinitialize, eager unspill, as reinitialize did before.)"
    );
    println!();
}

fn driver_section(
    b: &'static dyn rmm::allocator::backend::Backend,
    counts: &[u32],
    pool: &str,
    rounds: usize,
) {
    println!(
        "## The driver alone: cuMemAlloc then cuMemFree of {pool} per device, one thread each, ms (median of {rounds})"
    );
    println!();
    println!("| devices at once | cuMemAlloc | cuMemFree |");
    println!("|---|---|---|");
    let total = b.properties(0).map_or(0, |p| p.total_memory as u64);
    let bytes = pool
        .parse::<rmm::config::Size>()
        .map_or(32 << 30, |s| s.resolve(total)) as usize;
    for &n in counts {
        let (mut a, mut f) = (vec![], vec![]);
        for _ in 0..rounds {
            let (x, y) = driver_alloc_free(n, bytes);
            a.push(x);
            f.push(y);
        }
        println!("| {n} | {:.1} | {:.1} |", median(a), median(f));
    }
}
