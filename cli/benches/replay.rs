//! Replay benchmark: how fast `rmm replay` plays a 16-thread log, in logged order (every event
//! on one thread, after the one before it: `--order logged`) and concurrently (one thread per
//! logged thread, each in its own order: `--order concurrent`, the default).
//!
//! The log is a real one: 16 threads, each on a stream of its own, run the `random` trace of
//! `benches/allocators.rs` (sizes log-uniform 256 B – 16 MiB, allocate with p = 0.55 while the
//! thread's live bytes stay under 1/16 of 8 GiB, else free a random live block; everything
//! freed at the end) through `LoggingResourceAdaptor` over a pool, which writes RMM's CSV.
//! Each round then replays that file with `replay_streamed` (what `rmm replay` calls: the file
//! is opened and read once, as it is replayed) against a fresh pool of `rmm replay`'s defaults, in both orders
//! one after the other. Figures: events replayed (allocations and frees) per second of the
//! replay's own clock, best and median of the rounds.
//!
//! With a GPU (`RMM_BACKEND=cuda`, or auto with a driver) it measures the real thing;
//! otherwise an unbacked simulated 80 GiB device. `RMM_BENCH_SCALE` (default 1.0: 20 000
//! steps per thread) scales the log, `RMM_BENCH_ROUNDS` (default 5) the rounds.

use std::sync::{Arc, Barrier};

use rmm::allocator::adaptor::LoggingResourceAdaptor;
use rmm::allocator::event_log::LogReader;
use rmm::allocator::resource::SharedResource;
use rmm::allocator::resource::{CudaMemoryResource, PoolMemoryResource};
use rmm::allocator::{Device, Stream};
use rmm_cli::replay::{ReplayOptions, ReplayOrder, ReplayReport, replay_streamed};

mod common;

use common::{GIB, MIB, backend_for_bench, random_trace, replay};

/// Threads of the logged workload.
const THREADS: usize = 16;
/// Live bytes of the whole workload at most (each thread its share).
const CAP: usize = 8 * GIB;

/// Writes the log of `THREADS` threads running `steps` steps each to `path`; returns the
/// operations logged.
fn write_log(device: Device, path: &std::path::Path, steps: usize) -> Result<usize, String> {
    let pool: SharedResource = Arc::new(
        PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(device)))
            .build()
            .map_err(|e| e.to_string())?,
    );
    let logging = LoggingResourceAdaptor::new(pool, path).map_err(|e| e.to_string())?;
    let traces: Vec<_> = (0..THREADS)
        .map(|t| random_trace(steps, 256, 16 * MIB, CAP / THREADS, 2000 + t as u64))
        .collect();
    let streams = (0..THREADS)
        .map(|_| Stream::new(device))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    // All threads at once, as a worker process's would.
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|scope| {
        let handles: Vec<_> = traces
            .iter()
            .zip(&streams)
            .map(|(ops, stream)| {
                let (barrier, logging) = (&barrier, &logging);
                scope.spawn(move || {
                    barrier.wait();
                    replay(logging, ops, stream.view())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect::<Result<Vec<_>, _>>()
    })?;
    for s in &streams {
        s.synchronize().map_err(|e| e.to_string())?;
    }
    logging.flush().map_err(|e| e.to_string())?;
    Ok(traces.iter().map(Vec::len).sum())
}

/// One replay of the log at `path` in `order` against a fresh pool.
fn replay_once(
    device: Device,
    path: &std::path::Path,
    order: ReplayOrder,
) -> Result<ReplayReport, String> {
    let pool = PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(device)))
        .build()
        .map_err(|e| e.to_string())?;
    let options = ReplayOptions {
        order,
        ..ReplayOptions::default()
    };
    let log = LogReader::open(path).map_err(|e| e.to_string())?;
    let report = replay_streamed(log, &pool, &options).map_err(|e| e.to_string())?;
    if let Some(f) = &report.failure {
        return Err(format!("line {} failed: {}", f.line, f.error));
    }
    Ok(report)
}

/// Events replayed per second of the replay's own clock.
fn rate(report: &ReplayReport) -> f64 {
    (report.allocations + report.frees) as f64 / report.elapsed.as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let env = |name: &str, default: f64| -> f64 {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let steps = ((20_000.0 * env("RMM_BENCH_SCALE", 1.0)) as usize).max(1);
    let rounds = (env("RMM_BENCH_ROUNDS", 5.0) as usize).max(1);
    let backend = backend_for_bench();
    let device = Device::on(backend, 0).expect("device 0");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("rmm_log.dev0.csv");
    let ops = write_log(device, &path, steps).unwrap_or_else(|e| panic!("writing the log: {e}"));
    // A first replay, untimed, says what the log holds.
    let log = replay_once(device, &path, ReplayOrder::Concurrent)
        .unwrap_or_else(|e| panic!("reading the log: {e}"));
    let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
    println!("backend: {}", backend.describe());
    println!(
        "log:     {} threads, {} events ({ops} operations logged), {:.1} MiB, {} streams",
        log.logged_threads,
        log.events,
        bytes as f64 / MIB as f64,
        log.streams
    );
    println!("rounds:  {rounds} (each: logged, then concurrent, on a fresh pool)");
    println!();
    let orders = [
        ("logged", ReplayOrder::Logged),
        ("concurrent", ReplayOrder::Concurrent),
    ];
    let mut figures: Vec<Vec<f64>> = vec![Vec::new(); orders.len()];
    for _ in 0..rounds {
        for (i, &(name, order)) in orders.iter().enumerate() {
            let report = replay_once(device, &path, order)
                .unwrap_or_else(|e| panic!("replaying in {name} order: {e}"));
            figures[i].push(rate(&report));
        }
    }
    println!(
        "{:<12} {:>16} {:>16}",
        "order", "best events/s", "median events/s"
    );
    for ((name, _), rates) in orders.iter().zip(figures) {
        let best = rates.iter().copied().fold(0.0, f64::max);
        println!("{name:<12} {best:>16.0} {:>16.0}", median(rates));
    }
}
