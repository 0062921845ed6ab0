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
//! run to a comma-separated list of resources.

use std::sync::{Arc, Barrier};
use std::time::Instant;

use rmm::allocator::backend::BackendKind;
use rmm::allocator::per_device::SharedResource;
use rmm::allocator::resource::{
    BinningMemoryResource, CudaAsyncMemoryResource, CudaMemoryResource, PoolMemoryResource,
    PoolSize,
};
use rmm::allocator::{Device, DeviceMemoryResource, Stream};

mod common;

use common::{GIB, MIB, Op, backend_for_bench, churn_trace, random_trace, replay};

fn single(mr: &dyn DeviceMemoryResource, ops: &[Op], stream: &Stream) -> Option<f64> {
    // Warm-up pass (pool growth, arena creation, driver pool), then the timed pass.
    let run = || -> Result<f64, String> {
        replay(mr, &ops[..ops.len().min(20_000)], stream.view())?;
        stream.synchronize().map_err(|e| e.to_string())?;
        let ns_per_op = replay(mr, ops, stream.view())?;
        stream.synchronize().map_err(|e| e.to_string())?;
        Ok(ns_per_op)
    };
    run().map_err(|e| eprintln!("{}: {e}", mr.name())).ok()
}

fn multi(
    mr: &SharedResource,
    device: Device,
    threads: usize,
    steps: usize,
    cap: usize,
) -> Option<f64> {
    let traces: Vec<Arc<Vec<Op>>> = (0..threads)
        .map(|t| {
            Arc::new(random_trace(
                steps,
                256,
                16 * MIB,
                cap / threads,
                1000 + t as u64,
            ))
        })
        .collect();
    let total_ops: usize = traces.iter().map(|t| t.len()).sum();
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = traces
        .into_iter()
        .map(|ops| {
            let mr = Arc::clone(mr);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || -> Result<(), String> {
                // Every thread reaches both barriers, failed or not, so none waits forever.
                let stream = Stream::new(device).map_err(|e| e.to_string());
                let warm = stream.as_ref().map_err(Clone::clone).and_then(|s| {
                    replay(&*mr, &ops[..ops.len().min(5_000)], s.view())?;
                    s.synchronize().map_err(|e| e.to_string())
                });
                barrier.wait();
                let timed = warm.and_then(|_| {
                    let s = stream.as_ref().map_err(Clone::clone)?;
                    replay(&*mr, &ops, s.view())
                });
                barrier.wait();
                timed.map(|_| ())
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    barrier.wait();
    let ns = start.elapsed().as_nanos() as f64;
    let mut ok = true;
    for h in handles {
        if let Err(e) = h.join().unwrap_or_else(|_| Err("thread panicked".into())) {
            eprintln!("{} with {threads} threads: {e}", mr.name());
            ok = false;
        }
    }
    ok.then_some(ns / total_ops as f64)
}

struct Row {
    name: &'static str,
    cells: [Option<f64>; 5],
}

fn main() {
    let scale: f64 = std::env::var("RMM_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let only: Option<Vec<String>> = std::env::var("RMM_BENCH_ONLY")
        .ok()
        .map(|s| s.split(',').map(|x| x.trim().to_string()).collect());
    let n = |x: usize| ((x as f64 * scale) as usize).max(100);
    let b = backend_for_bench();
    let device = Device::on(b, 0).expect("device 0");
    let props = device.properties().expect("properties");
    println!("backend: {}", b.describe());
    println!(
        "device:  {} ({:.1} GiB)",
        props.name,
        props.total_memory as f64 / GIB as f64
    );
    let cap = 4 * GIB;
    let small_cap = GIB;

    let churn = churn_trace(n(1_000_000));
    let random = random_trace(n(1_000_000), 256, 16 * MIB, cap, 1);
    let small = random_trace(n(1_000_000), 8, 64 * 1024, small_cap, 2);
    let stream = Stream::new(device).expect("stream");

    let cuda: SharedResource = Arc::new(CudaMemoryResource::new(device));
    let mut resources: Vec<(&'static str, SharedResource, bool)> = vec![
        ("cuda", Arc::clone(&cuda), false),
        (
            "async",
            Arc::new(CudaAsyncMemoryResource::new(device).expect("async")),
            true,
        ),
    ];
    let pool: SharedResource = Arc::new(
        PoolMemoryResource::builder(Arc::clone(&cuda))
            .initial_size(PoolSize::Bytes(3 * cap))
            .build()
            .expect("pool"),
    );
    resources.push(("pool", Arc::clone(&pool), true));
    resources.push((
        "binning(pool)",
        Arc::new(BinningMemoryResource::with_bins(Arc::clone(&pool), 8, 17).expect("binning")),
        true,
    ));

    let mut rows = Vec::new();
    for (name, mr, full) in &resources {
        if let Some(o) = &only
            && !o.iter().any(|x| x == name)
        {
            continue;
        }
        let mut cells = [None; 5];
        if *full {
            cells[0] = single(&**mr, &churn, &stream);
            cells[1] = single(&**mr, &random, &stream);
            cells[2] = single(&**mr, &small, &stream);
            cells[3] = multi(mr, device, 8, n(250_000), cap);
            cells[4] = multi(mr, device, 16, n(125_000), cap);
        } else if b.kind() == BackendKind::Cuda {
            // cuMemAlloc costs tens of microseconds: a short trace is enough.
            cells[0] = single(&**mr, &churn_trace(2_000), &stream);
            cells[1] = single(&**mr, &random_trace(5_000, 256, 16 * MIB, cap, 1), &stream);
        } else {
            cells[0] = single(&**mr, &churn_trace(n(100_000)), &stream);
            cells[1] = single(
                &**mr,
                &random_trace(n(100_000), 256, 16 * MIB, cap, 1),
                &stream,
            );
        }
        eprintln!("{name}: {:?}", cells);
        rows.push(Row { name, cells });
    }

    let fmt = |v: Option<f64>| v.map_or("–".to_string(), |x| format!("{x:.0}"));
    let heads = ["churn", "random", "small", "mt8", "mt16"];
    println!();
    println!("ns per operation ({}; lower is better)", props.name);
    println!("| resource | {} |", heads.join(" | "));
    println!("|---|{}", "---|".repeat(5));
    for r in &rows {
        println!(
            "| {} | {} |",
            r.name,
            r.cells
                .iter()
                .map(|c| fmt(*c))
                .collect::<Vec<_>>()
                .join(" | ")
        );
    }
    for base in ["async", "cuda"] {
        let Some(b) = rows.iter().find(|r| r.name == base) else {
            continue;
        };
        println!();
        println!("speed-up over {base} (its ns/op ÷ resource's ns/op, same run)");
        println!("| resource | {} |", heads.join(" | "));
        println!("|---|{}", "---|".repeat(5));
        for r in rows.iter().filter(|r| r.name != base) {
            let ratios: Vec<String> = (0..5)
                .map(|i| match (b.cells[i], r.cells[i]) {
                    (Some(x), Some(y)) if y > 0.0 => format!("{:.1}×", x / y),
                    _ => "–".into(),
                })
                .collect();
            println!("| {} | {} |", r.name, ratios.join(" | "));
        }
    }
}
