//! Container overhead benchmark: what `DeviceBuffer` / `DeviceUVector` construction and drop
//! cost on top of their resource's own `allocate` + `deallocate`.
//!
//! For each resource and size it times, interleaved in rounds so that drift hits all alike:
//!
//! direct     `mr.allocate(size, s)` + `mr.deallocate(ptr, size, s)`
//! buffer     `DeviceBuffer::new_in(size, s, &*mr)` + drop (the resource borrowed)
//! uvector    `DeviceUVector::<u32, _>::new_in(size / 4, s, &*mr)` + drop (borrowed)
//! buf+arc    `DeviceBuffer::new_in(size, s, Arc::clone(&mr))` + drop (the owning default
//!            handle: adds one reference-count increment and decrement)
//! new        `DeviceBuffer::new(size, s)` + drop, with `mr` set as the current device's
//!            resource (adds the per-device lookup and the reference count)
//!
//! and prints the ns per allocate+deallocate pair (fastest of 15 interleaved rounds), the
//! jitter of `direct` (median − fastest round) and each container's difference (Δ)
//! to `direct`. The goal, a Δ of at most 10 ns, is checked on `buffer` and `uvector`, the
//! containers' own cost; the owning handle's atomic reference count is reported beside it
//! (`arc` below the table: one `Arc` clone + drop alone). `null` is a resource that only
//! hands out addresses, so its row shows the container cost with nothing else in it.
//!
//! With a GPU (`RMM_BACKEND=cuda`, or auto with a driver) the resources talk to the driver;
//! otherwise an unbacked simulated device stands in (no host memory is touched, so what is
//! measured is bookkeeping). `RMM_BENCH_SCALE` (default 1.0) scales the iteration counts.
//!
//! Run: `cargo bench --bench containers`.
//!
//! Figures: `docs/benchmarks.md`.

use std::any::Any;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use rmm::allocator::backend::DevicePtr;
use rmm::allocator::per_device::set_current_device_resource;
use rmm::allocator::resource::DeviceMemoryResource;
use rmm::allocator::resource::SharedResource;
use rmm::allocator::resource::{CudaAsyncMemoryResource, CudaMemoryResource, PoolMemoryResource};
use rmm::allocator::{Device, DeviceBuffer, DeviceUVector, Result, Stream, StreamView};

mod common;

use common::backend_for_bench;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
/// Sizes in bytes (multiples of 4, so the u32 vector has the same size).
const SIZES: [usize; 4] = [256, 64 * KIB, MIB, 16 * MIB];
/// Rounds per measurement; the fastest round is reported.
const ROUNDS: usize = 15;
/// The goal: container overhead per allocate+deallocate pair.
const GOAL_NS: f64 = 10.0;

/// A resource that hands out aligned addresses and touches nothing: the containers' own cost.
#[derive(Debug)]
struct NullResource {
    device: Device,
    next: AtomicU64,
}

impl DeviceMemoryResource for NullResource {
    #[inline]
    fn allocate(&self, bytes: usize, _stream: StreamView) -> Result<DevicePtr> {
        let len = (bytes as u64).next_multiple_of(256);
        Ok(DevicePtr(self.next.fetch_add(len, Ordering::Relaxed)))
    }
    #[inline]
    fn deallocate(&self, _ptr: DevicePtr, _bytes: usize, _stream: StreamView) -> Result<()> {
        Ok(())
    }
    fn device(&self) -> Device {
        self.device
    }
    fn name(&self) -> &'static str {
        "NullResource"
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn resources(device: Device) -> Vec<(&'static str, SharedResource)> {
    let cuda: SharedResource = Arc::new(CudaMemoryResource::new(device));
    let mut list: Vec<(&'static str, SharedResource)> = vec![
        (
            "null",
            Arc::new(NullResource {
                device,
                next: AtomicU64::new(1 << 40),
            }),
        ),
        ("cuda", Arc::clone(&cuda)),
    ];
    match CudaAsyncMemoryResource::new(device) {
        Ok(r) => list.push(("async", Arc::new(r))),
        Err(e) => println!("skipping async: {e}"),
    }
    match PoolMemoryResource::builder(Arc::clone(&cuda))
        .initial_size((256 * MIB) as u64)
        .build()
    {
        Ok(r) => list.push(("pool", Arc::new(r))),
        Err(e) => println!("skipping pool: {e}"),
    }
    list
}

/// Times `iters` runs of `op`; ns per run.
fn time(iters: usize, mut op: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..iters {
        op();
    }
    start.elapsed().as_nanos() as f64 / iters as f64
}

/// The fastest round: interference from other processes only ever adds time, so the
/// minimum is the steadiest estimate of the intrinsic cost on a shared machine.
fn fastest(xs: Vec<f64>) -> f64 {
    xs.into_iter().fold(f64::INFINITY, f64::min)
}

/// Fastest-round ns per pair for each variant, in the order direct, buffer, uvector, buf+arc,
/// new; and the jitter of `direct` (median round − fastest round).
fn measure(mr: &SharedResource, size: usize, owned: &Stream, scale: f64) -> ([f64; 5], f64) {
    let stream = owned.view();
    let direct = || {
        let p = mr.allocate(black_box(size), stream).expect("allocate");
        mr.deallocate(black_box(p), size, stream)
            .expect("deallocate");
    };
    let buffer = || {
        let b = DeviceBuffer::new_in(black_box(size), stream, &**mr).expect("buffer");
        black_box(b.data());
        drop(b);
    };
    let uvector = || {
        let v =
            DeviceUVector::<u32, _>::new_in(black_box(size / 4), stream, &**mr).expect("uvector");
        black_box(v.data());
        drop(v);
    };
    let buffer_arc = || {
        let b = DeviceBuffer::new_in(black_box(size), stream, Arc::clone(mr)).expect("buf+arc");
        black_box(b.data());
        drop(b);
    };
    let new_current = || {
        let b = DeviceBuffer::new(black_box(size), stream).expect("new");
        black_box(b.data());
        drop(b);
    };
    let mut variants: [Box<dyn FnMut()>; 5] = [
        Box::new(direct),
        Box::new(buffer),
        Box::new(uvector),
        Box::new(buffer_arc),
        Box::new(new_current),
    ];
    // Calibrate: about 2 ms per variant and round (at least 20 pairs).
    let probe = time(20, &mut variants[0]).max(1.0);
    let iters = (((2e6 / probe) * scale) as usize).clamp(20, 2_000_000);
    // Between batches (untimed) the stream catches up: stream-ordered resources give memory
    // back when the stream reaches the free, and the simulated one does so on a worker thread
    // that a tight loop could outrun until the device is full.
    let settle = || owned.synchronize().expect("synchronize");
    for _ in 0..2 {
        for v in variants.iter_mut() {
            time(iters / 4 + 1, v);
            settle();
        }
    }
    // Each round starts with another variant, so that no variant always runs in the same
    // position (after the same neighbour).
    let mut samples: [Vec<f64>; 5] = Default::default();
    for round in 0..ROUNDS {
        for k in 0..variants.len() {
            let i = (round + k) % variants.len();
            samples[i].push(time(iters, &mut variants[i]));
            settle();
        }
    }
    let mut direct = samples[0].clone();
    direct.sort_by(f64::total_cmp);
    let jitter = direct[direct.len() / 2] - direct[0];
    (samples.map(fastest), jitter)
}

/// Fastest-round ns of one `Arc` clone + drop (the owning handle's extra cost).
fn arc_round_trip(mr: &SharedResource) -> f64 {
    let mut samples = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        samples.push(time(1_000_000, || drop(black_box(Arc::clone(mr)))));
    }
    fastest(samples)
}

fn fmt_size(bytes: usize) -> String {
    match bytes {
        b if b >= MIB => format!("{} MiB", b / MIB),
        b if b >= KIB => format!("{} KiB", b / KIB),
        b => format!("{b} B"),
    }
}

fn main() {
    let scale: f64 = std::env::var("RMM_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let b = backend_for_bench();
    let device = Device::on(b, 0).expect("device 0");
    let stream = Stream::new(device).expect("stream");
    println!("backend: {}", b.describe());
    println!(
        "ns per allocate+deallocate pair (fastest of {ROUNDS} rounds); Δ = container − direct; \
         goal Δ ≤ {GOAL_NS} ns"
    );
    println!();
    println!(
        "{:<8} {:>7} {:>9} {:>7} {:>9} {:>7} {:>9} {:>7}  {:<5} {:>9} {:>7} {:>9} {:>7}",
        "resource",
        "size",
        "direct",
        "jitter",
        "buffer",
        "Δ",
        "uvector",
        "Δ",
        "goal",
        "buf+arc",
        "Δ",
        "new",
        "Δ"
    );
    let started = Instant::now();
    let mut worst: f64 = f64::NEG_INFINITY;
    let mut judged = 0;
    for (name, mr) in resources(device) {
        // `DeviceBuffer::new` draws from the current device's resource: make it this one.
        let previous = set_current_device_resource(Arc::clone(&mr)).expect("set resource");
        for size in SIZES {
            let (t, jitter) = measure(&mr, size, &stream, scale);
            let d = t.map(|x| x - t[0]);
            let row_worst = d[1].max(d[2]);
            // A row whose resource jitters by more than the goal cannot show a difference
            // that small either way: it is reported, not judged.
            let verdict = if jitter > GOAL_NS {
                "noisy"
            } else {
                worst = worst.max(row_worst);
                judged += 1;
                if row_worst <= GOAL_NS { "ok" } else { "OVER" }
            };
            println!(
                "{:<8} {:>7} {:>9.1} {:>7.1} {:>9.1} {:>+7.1} {:>9.1} {:>+7.1}  {:<5} {:>9.1} {:>+7.1} {:>9.1} {:>+7.1}",
                name,
                fmt_size(size),
                t[0],
                jitter,
                t[1],
                d[1],
                t[2],
                d[2],
                verdict,
                t[3],
                d[3],
                t[4],
                d[4],
            );
        }
        set_current_device_resource(previous).expect("restore resource");
        stream.synchronize().expect("synchronize");
    }
    let arc = arc_round_trip(&resources(device)[0].1);
    println!();
    println!(
        "worst container Δ (buffer, uvector) over the {judged} rows with jitter ≤ {GOAL_NS} ns: \
         {worst:+.1} ns: goal {}",
        if worst <= GOAL_NS { "met" } else { "NOT met" }
    );
    println!("arc: one Arc clone + drop costs {arc:.1} ns here (the owning handle's extra)");
    println!("{:.1} s", started.elapsed().as_secs_f64());
}
