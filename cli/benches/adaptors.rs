//! Adaptor benchmark: what each resource adaptor (and memory hooks) adds over the bare pool.
//!
//! Workload `random`: sizes log-uniform 256 B – 16 MiB, allocate with p = 0.55 while live
//! bytes stay under 4 GiB, else free a random live block; everything freed at the end (the
//! trace shape of benches/allocators.rs).
//!
//! 1. Each adaptor over a resource that does nothing: the adaptor's own cost, free of the
//!    pool's noise.
//! 2. Each adaptor over the same pool, plus the pool with hooks registered (on another thread,
//!    a no-op hook on this thread, a no-op process-wide hook).
//! 3. N threads, each its own trace, stream and share of the cap, over the pool and over
//!    statistics (aggregate wall time per operation).
//!
//! `statistics(...)` rows are the default adaptor, whose peak is exact; the `peak tolerance
//! 16 MiB` rows are the approximate mode (the default before issue 14, when the exact peak
//! was the `exact peak` row).
//!
//! Tables 1 and 2 run every configuration in interleaved rounds after a warm-up round and
//! show the best round (ns per operation: one allocate or one free) and the median of the
//! same-round differences to the first row.
//!
//! With a GPU (`RMM_BACKEND=cuda`, or auto with a driver) it measures the real thing;
//! otherwise an unbacked simulated 80 GiB device. `RMM_BENCH_SCALE` (default 1.0) scales the
//! operation counts, `RMM_BENCH_ROUNDS` (default 7) the rounds, `RMM_BENCH_THREADS`
//! (default 8) the threads of table 3; `RMM_BENCH_TABLES` (default `1,2,3`) picks tables and
//! `RMM_BENCH_ONLY` (names separated by `;`) the rows of tables 1 and 2 besides their first.

use std::sync::{Arc, Barrier};
use std::time::Instant;

use rmm::allocator::adaptor::DEFAULT_PEAK_TOLERANCE;
use rmm::allocator::adaptor::hooks::{self, HookEvent, MemoryHook};
use rmm::allocator::adaptor::{
    FailureAction, FailureCallbackResourceAdaptor, HookedResourceAdaptor, LimitingResourceAdaptor,
    LoggingResourceAdaptor, StatisticsResourceAdaptor, TrackingResourceAdaptor,
};
use rmm::allocator::backend::DevicePtr;
use rmm::allocator::resource::DeviceMemoryResource;
use rmm::allocator::resource::SharedResource;
use rmm::allocator::resource::{CudaMemoryResource, PoolMemoryResource};
use rmm::allocator::{Device, Stream, StreamView};

mod common;

use common::{GIB, MIB, Op, backend_for_bench, random_trace, replay};

/// `streams.len()` threads, each its own trace and stream, over `mr`. The streams outlive the
/// run (as workers' streams do): a pool keeps per-stream state.
fn multi(mr: &SharedResource, streams: &[StreamView], steps: usize, cap: usize) -> Option<f64> {
    let threads = streams.len();
    let traces: Vec<Vec<Op>> = (0..threads)
        .map(|t| random_trace(steps, 256, 16 * MIB, cap / threads, 1000 + t as u64))
        .collect();
    let total_ops: usize = traces.iter().map(|t| t.len()).sum();
    let barrier = Barrier::new(threads + 1);
    let mut ns = 0.0;
    let mut ok = true;
    std::thread::scope(|scope| {
        let handles: Vec<_> = traces
            .iter()
            .zip(streams)
            .map(|(ops, &stream)| {
                let barrier = &barrier;
                scope.spawn(move || -> Result<(), String> {
                    let warm = replay(&**mr, &ops[..ops.len().min(5_000)], stream).map(|_| ());
                    barrier.wait();
                    let timed = warm.and_then(|_| replay(&**mr, ops, stream).map(|_| ()));
                    barrier.wait();
                    timed
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        barrier.wait();
        ns = start.elapsed().as_nanos() as f64;
        for h in handles {
            if let Err(e) = h.join().unwrap_or_else(|_| Err("thread panicked".into())) {
                eprintln!("{} with {threads} threads: {e}", mr.name());
                ok = false;
            }
        }
    });
    ok.then_some(ns / total_ops as f64)
}

/// A resource that does nothing (fake, distinct, aligned pointers): the adaptors' own cost.
#[derive(Debug)]
struct NullResource(Device);

thread_local! {
    static NEXT_FAKE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl DeviceMemoryResource for NullResource {
    fn allocate(&self, bytes: usize, _: StreamView) -> rmm::allocator::Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        Ok(DevicePtr(NEXT_FAKE.with(|c| {
            let v = c.get() + 256;
            c.set(v);
            v
        })))
    }
    fn deallocate(&self, _: DevicePtr, _: usize, _: StreamView) -> rmm::allocator::Result<()> {
        Ok(())
    }
    fn device(&self) -> Device {
        self.0
    }
    fn name(&self) -> &'static str {
        "NullResource"
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

struct NoOp;
impl MemoryHook for NoOp {
    fn malloc_preprocess(&self, e: &HookEvent) {
        std::hint::black_box(e);
    }
}

/// Which hooks are registered while a configuration runs.
#[derive(Clone, Copy, PartialEq)]
enum Hooks {
    None,
    /// A hook registered on another thread: this thread's list is empty.
    OtherThread,
    /// A no-op hook on this thread: every operation dispatches.
    ThisThread,
    /// A no-op process-wide hook.
    Process,
}

struct Config {
    name: &'static str,
    mr: SharedResource,
    hooks: Hooks,
}

/// The adaptors over `up`, in table order (the first is `up` itself).
fn adaptor_configs(
    up: &SharedResource,
    base: &'static str,
    log_path: &std::path::Path,
    with_hooks: bool,
    concrete_pool: Option<&Arc<PoolMemoryResource>>,
) -> Vec<Config> {
    let p = || Arc::clone(up);
    let name = |n: &str| -> &'static str { Box::leak(format!("{n}({base})").into_boxed_str()) };
    let mut v = vec![Config {
        name: base,
        mr: p(),
        hooks: Hooks::None,
    }];
    if with_hooks {
        for (label, hooks) in [
            ("hook on another thread", Hooks::OtherThread),
            ("no-op hook on this thread", Hooks::ThisThread),
            ("no-op process hook", Hooks::Process),
        ] {
            v.push(Config {
                name: Box::leak(format!("{base}, {label}").into_boxed_str()),
                mr: p(),
                hooks,
            });
        }
    } else {
        v.push(Config {
            name: name("hooked"),
            mr: Arc::new(HookedResourceAdaptor::new(p())),
            hooks: Hooks::None,
        });
    }
    v.extend([
        // The default: an exact peak.
        Config {
            name: name("statistics"),
            mr: Arc::new(StatisticsResourceAdaptor::new(p())),
            hooks: Hooks::None,
        },
        Config {
            name: Box::leak(format!("statistics({base}), peak tolerance 16 MiB").into_boxed_str()),
            mr: Arc::new(StatisticsResourceAdaptor::with_peak_tolerance(
                p(),
                DEFAULT_PEAK_TOLERANCE,
            )),
            hooks: Hooks::None,
        },
    ]);
    if let Some(pool) = concrete_pool {
        // The upstream as Arc<PoolMemoryResource>: called without dynamic dispatch.
        v.push(Config {
            name: "statistics(Arc<PoolMemoryResource>)",
            mr: Arc::new(StatisticsResourceAdaptor::new(Arc::clone(pool))),
            hooks: Hooks::None,
        });
    }
    v.extend([
        Config {
            name: name("limiting"),
            mr: Arc::new(LimitingResourceAdaptor::with_bytes(p(), 64 * GIB)),
            hooks: Hooks::None,
        },
        Config {
            name: name("failure_callback"),
            mr: Arc::new(FailureCallbackResourceAdaptor::new(p(), |_| {
                FailureAction::Fail
            })),
            hooks: Hooks::None,
        },
        Config {
            name: name("tracking"),
            mr: Arc::new(TrackingResourceAdaptor::new(p())),
            hooks: Hooks::None,
        },
        Config {
            name: name("logging"),
            mr: Arc::new(LoggingResourceAdaptor::new(p(), log_path).expect("log file")),
            hooks: Hooks::None,
        },
    ]);
    v
}

/// Keeps the first configuration and those named in `RMM_BENCH_ONLY`, if set.
fn only(mut configs: Vec<Config>) -> Vec<Config> {
    if let Ok(names) = std::env::var("RMM_BENCH_ONLY") {
        let mut i = 0;
        configs.retain(|c| {
            i += 1;
            i == 1 || names.split(';').any(|n| c.name == n.trim())
        });
    }
    configs
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs every configuration `rounds` times, interleaved, after a warm-up round. Returns
/// (best ns/op, median of the same-round differences to the first configuration).
fn measure(
    configs: &[Config],
    ops: &[Op],
    stream: &Stream,
    rounds: usize,
    hook_holder_ready: &mut dyn FnMut(),
) -> Vec<(f64, f64)> {
    let mut runs: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    let mut deltas: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for round in 0..=rounds {
        let mut this_round = vec![f64::NAN; configs.len()];
        for (i, c) in configs.iter().enumerate() {
            if c.hooks == Hooks::OtherThread {
                hook_holder_ready();
            }
            let _thread_guard =
                (c.hooks == Hooks::ThisThread).then(|| hooks::register_thread_hook(Arc::new(NoOp)));
            let _process_guard =
                (c.hooks == Hooks::Process).then(|| hooks::register_process_hook(Arc::new(NoOp)));
            this_round[i] = replay(&*c.mr, ops, stream.view()).unwrap_or_else(|e| {
                eprintln!("{}: {e}", c.name);
                f64::NAN
            });
            stream.synchronize().expect("synchronize");
        }
        if round == 0 {
            continue; // warm-up: pool growth, arenas, log file
        }
        for i in 0..configs.len() {
            runs[i].push(this_round[i]);
            deltas[i].push(this_round[i] - this_round[0]);
        }
    }
    runs.into_iter()
        .zip(deltas)
        .map(|(r, d)| (r.into_iter().fold(f64::INFINITY, f64::min), median(d)))
        .collect()
}

fn print_table(title: &str, configs: &[Config], results: &[(f64, f64)]) {
    println!();
    println!("{title}");
    println!("| configuration | ns/op (best) | added ns/op (median of same-round differences) |");
    println!("|---|---|---|");
    for (i, (c, (best, delta))) in configs.iter().zip(results).enumerate() {
        let added = if i == 0 {
            "–".to_string()
        } else {
            format!("{delta:+.1}")
        };
        println!("| {} | {best:.1} | {added} |", c.name);
    }
}

fn main() {
    let env = |k: &str| std::env::var(k).ok().and_then(|s| s.parse::<f64>().ok());
    let scale = env("RMM_BENCH_SCALE").unwrap_or(1.0);
    let rounds = env("RMM_BENCH_ROUNDS").map_or(7, |x| x as usize).max(1);
    let threads = env("RMM_BENCH_THREADS").map_or(8, |x| x as usize).max(1);
    let n = |x: usize| ((x as f64 * scale) as usize).max(100);
    let tables = std::env::var("RMM_BENCH_TABLES").unwrap_or_else(|_| "1,2,3".into());
    let table = |t: &str| tables.split(',').any(|x| x.trim() == t);
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
    let random = random_trace(n(1_000_000), 256, 16 * MIB, cap, 1);
    let log_dir = std::env::temp_dir().join(format!("rmm-bench-adaptors-{}", std::process::id()));
    std::fs::create_dir_all(&log_dir).expect("log dir");

    // A thread that holds a hook registration while the hook configurations run.
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let _g = hooks::register_thread_hook(Arc::new(NoOp));
        let _ = ready_tx.send(());
        let _ = stop_rx.recv();
    });
    let mut ready = false;
    let mut wait_ready = || {
        if !ready {
            let _ = ready_rx.recv();
            ready = true;
        }
    };
    let stream = Stream::new(device).expect("stream");

    // 1. The adaptors' own cost, over a resource that does nothing.
    if table("1") {
        let null: SharedResource = Arc::new(NullResource(device));
        let configs = only(adaptor_configs(
            &null,
            "null",
            &log_dir.join("null.csv"),
            false,
            None,
        ));
        let results = measure(&configs, &random, &stream, rounds, &mut wait_ready);
        print_table(
            &format!(
                "adaptor cost over a no-op upstream, random workload ({} ops, {rounds} rounds)",
                random.len()
            ),
            &configs,
            &results,
        );
    }

    // 2. Over the pool.
    let cuda: SharedResource = Arc::new(CudaMemoryResource::new(device));
    let concrete = Arc::new(
        PoolMemoryResource::builder(Arc::clone(&cuda))
            .initial_size((3 * cap) as u64)
            .build()
            .expect("pool"),
    );
    let pool: SharedResource = concrete.clone();
    if table("2") {
        let configs = only(adaptor_configs(
            &pool,
            "pool",
            &log_dir.join("pool.csv"),
            true,
            Some(&concrete),
        ));
        let results = measure(&configs, &random, &stream, rounds, &mut wait_ready);
        print_table(
            &format!(
                "over the pool, random workload ({} ops, {rounds} rounds; {})",
                random.len(),
                props.name
            ),
            &configs,
            &results,
        );
    }
    let _ = stop_tx.send(());
    let _ = holder.join();

    // 3. Several threads, each on its own stream (kept for all configurations).
    if !table("3") {
        std::fs::remove_dir_all(&log_dir).ok();
        return;
    }
    let streams: Vec<Stream> = (0..threads)
        .map(|_| Stream::new(device).expect("stream"))
        .collect();
    let views: Vec<StreamView> = streams.iter().map(Stream::view).collect();
    let stats: SharedResource = Arc::new(StatisticsResourceAdaptor::new(Arc::clone(&pool)));
    let mt: Vec<(&str, SharedResource)> = vec![
        ("pool", Arc::clone(&pool)),
        ("statistics(pool)", Arc::clone(&stats)),
        (
            "statistics(pool), peak tolerance 16 MiB",
            Arc::new(StatisticsResourceAdaptor::with_peak_tolerance(
                Arc::clone(&pool),
                DEFAULT_PEAK_TOLERANCE,
            )),
        ),
        (
            "statistics(Arc<PoolMemoryResource>)",
            Arc::new(StatisticsResourceAdaptor::new(Arc::clone(&concrete))),
        ),
    ];
    println!();
    println!("{threads} threads, aggregate ns per operation (best of 3)");
    println!("| configuration | mt{threads} |");
    println!("|---|---|");
    for (name, mr) in &mt {
        let v = (0..3)
            .filter_map(|_| multi(mr, &views, n(125_000), cap))
            .fold(f64::INFINITY, f64::min);
        println!("| {name} | {v:.1} |");
    }
    if let Some(s) = stats.as_any().downcast_ref::<StatisticsResourceAdaptor>() {
        println!();
        println!("{}", s.report());
    }
    for s in &streams {
        s.synchronize().expect("synchronize");
    }
    std::fs::remove_dir_all(&log_dir).ok();
}
