//! A pool's footprint under a training loop whose tensor sizes change every step (a new
//! sequence length each step, as language-model training with variable lengths makes), on the
//! simulated device: with `max_overhead`, the most the pool reserves stays within that share
//! above the peak in use, with the loop on one thread and with forward and backward on two
//! threads of one stream (PyTorch runs backward on its own thread). Each test also runs the
//! loop on a pool without the limit and checks that it goes past the bound: the loop is one
//! that the limit is needed for.

mod common;

use std::sync::Arc;
use std::sync::mpsc;

use common::{GIB, MIB};
use rmm_allocator::backend::DevicePtr;
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::{CudaMemoryResource, PoolMemoryResource, VirtualMemory};
use rmm_allocator::{Device, StreamView};

const S: StreamView = StreamView::DEFAULT;
const STEPS: usize = 40;
const LAYERS: u64 = 12;
/// The limit the tests ask for, and the slack its chunks allow (a chunk and a granule).
const OVERHEAD: f64 = 0.05;
const SLACK: u64 = 18 * MIB as u64;

fn device() -> Device {
    common::unbacked_sim(200 * GIB).1
}

/// A pool from 64 MiB with the default 1 GiB growth step, with or without the limit.
fn pool(d: Device, limit: Option<f64>) -> Arc<PoolMemoryResource> {
    let mut b = PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
        .initial_size(64 * MIB as u64)
        .virtual_memory(VirtualMemory::On);
    if let Some(f) = limit {
        b = b.max_overhead(f);
    }
    Arc::new(b.build().unwrap())
}

/// Sequence lengths in [64, 1024], the same every run (xorshift).
fn lengths() -> Vec<u64> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..STEPS)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            64 + x % 961
        })
        .collect()
}

/// One step's activations, in the order forward makes them (batch 8, width 768, bf16): per
/// layer the hidden states, the MLP's inner states and the attention scores, then the logits.
fn activations(len: u64) -> Vec<u64> {
    let batch_tokens = 8 * len;
    let mut sizes = Vec::new();
    for _ in 0..LAYERS {
        sizes.push(batch_tokens * 768 * 2);
        sizes.push(batch_tokens * 3072 * 2);
        sizes.push(8 * 12 * len * len * 2);
    }
    sizes.push(batch_tokens * 50257 * 2);
    sizes
}

/// Bytes live now and at their peak, counted by the caller's allocations.
#[derive(Default)]
struct Live {
    now: u64,
    peak: u64,
}

impl Live {
    fn alloc(&mut self, p: &PoolMemoryResource, size: u64) -> DevicePtr {
        let ptr = p.allocate(size as usize, S).unwrap();
        self.now += size;
        self.peak = self.peak.max(self.now);
        ptr
    }

    fn free(&mut self, p: &PoolMemoryResource, ptr: DevicePtr, size: u64) {
        p.deallocate(ptr, size as usize, S).unwrap();
        self.now -= size;
    }
}

/// Backward for one step's activations: for each, newest first, a gradient of its size is
/// made, the activation freed, then the gradient freed.
fn backward(p: &PoolMemoryResource, live: &mut Live, acts: Vec<(DevicePtr, u64)>) {
    for (ptr, size) in acts.into_iter().rev() {
        let grad = live.alloc(p, size);
        live.free(p, ptr, size);
        live.free(p, grad, size);
    }
}

/// The loop on one thread; returns the peak in use.
fn train_on_one_thread(p: &PoolMemoryResource) -> u64 {
    let mut live = Live::default();
    // Parameters, their gradients and two optimizer states: long-lived.
    let state: Vec<DevicePtr> = (0..4).map(|_| live.alloc(p, 250 * MIB as u64)).collect();
    for len in lengths() {
        let acts = activations(len)
            .into_iter()
            .map(|size| (live.alloc(p, size), size))
            .collect();
        backward(p, &mut live, acts);
    }
    for ptr in state {
        live.free(p, ptr, 250 * MIB as u64);
    }
    live.peak
}

/// The loop with forward on this thread and backward on another, on the same stream, taking
/// turns step by step; returns the peak in use (both threads' allocations together).
fn train_on_two_threads(p: &Arc<PoolMemoryResource>) -> u64 {
    let state_size = 250 * MIB as u64;
    let mut live = Live::default();
    let state: Vec<DevicePtr> = (0..4).map(|_| live.alloc(p, state_size)).collect();
    let (to_backward, steps) = mpsc::channel::<(Vec<(DevicePtr, u64)>, u64)>();
    let (to_forward, done) = mpsc::channel::<u64>();
    let peak = std::thread::scope(|s| {
        let pool = Arc::clone(p);
        s.spawn(move || {
            let mut live = Live::default();
            for (acts, now) in steps {
                // The forward thread's bytes are live too while backward runs.
                live.now = now;
                live.peak = live.peak.max(now);
                backward(&pool, &mut live, acts);
                to_forward.send(live.peak).unwrap();
            }
        });
        let mut peak = live.peak;
        for len in lengths() {
            let acts: Vec<(DevicePtr, u64)> = activations(len)
                .into_iter()
                .map(|size| (live.alloc(p, size), size))
                .collect();
            let freed: u64 = acts.iter().map(|a| a.1).sum();
            to_backward.send((acts, live.now)).unwrap();
            peak = peak.max(live.peak).max(done.recv().unwrap());
            live.now -= freed;
        }
        drop(to_backward);
        peak
    });
    for ptr in state {
        live.free(p, ptr, state_size);
    }
    peak
}

/// Runs `train` on a pool without a limit and on one with [`OVERHEAD`]: the first must go
/// past the bound (the loop needs the limit), the second stay within it.
fn check(what: &str, train: impl Fn(&Arc<PoolMemoryResource>) -> u64) {
    let d = device();
    let unlimited = pool(d, None);
    let peak = train(&unlimited);
    let bound = (peak as f64 * (1.0 + OVERHEAD)) as u64 + SLACK;
    let reserved = unlimited.peak_pool_size();
    assert!(
        reserved > bound,
        "{what}: without a limit the pool reserved {reserved} for a peak of {peak}, within \
         the bound {bound}: the loop does not show what the limit is for"
    );
    drop(unlimited);

    let limited = pool(d, Some(OVERHEAD));
    assert_eq!(limited.max_overhead(), Some(OVERHEAD));
    let peak = train(&limited);
    let bound = (peak as f64 * (1.0 + OVERHEAD)) as u64 + SLACK;
    let reserved = limited.peak_pool_size();
    assert!(
        reserved <= bound,
        "{what}: with max_overhead {OVERHEAD} the pool reserved {reserved} ({:.3}× the peak \
         {peak}), past the bound {bound}",
        reserved as f64 / peak as f64
    );
    eprintln!(
        "{what}: reserved {:.3}× the peak in use with the limit",
        reserved as f64 / peak as f64
    );
    // Every chunk of a limited pool is one granule: the counts of chunks taken from the
    // device and given back account for its size exactly.
    let u = limited.usage();
    assert_eq!(
        (u.device_allocations - u.device_frees) * 2 * MIB as u64,
        u.pool_size as u64,
        "{what}: {} chunks taken, {} given back",
        u.device_allocations,
        u.device_frees
    );
    limited.synchronize().unwrap();
    let snap = limited.validate().unwrap();
    assert_eq!(snap.in_use, 0, "{what}: {snap:?}");
}

#[test]
fn a_loop_with_a_new_length_every_step_stays_within_the_overhead() {
    check("one thread", |p| train_on_one_thread(p));
}

#[test]
fn forward_and_backward_on_two_threads_of_one_stream_stay_within_the_overhead() {
    check("two threads, one stream", train_on_two_threads);
}

#[test]
fn growth_cut_to_the_limit_hands_out_whole_granules() {
    // 96 MiB in use under a 5 % limit allow 100.8 MiB: what growth and grants are cut to
    // must still be whole granules.
    let p = pool(device(), Some(OVERHEAD));
    let blocks: Vec<DevicePtr> = (0..4).map(|_| p.allocate(32 * MIB, S).unwrap()).collect();
    let snap = p.validate().unwrap();
    assert_eq!(snap.in_use, 128 * MIB as u64);
    for b in blocks {
        p.deallocate(b, 32 * MIB, S).unwrap();
    }
}

#[test]
fn a_limit_needs_mapped_memory_and_auto_maps_for_it_whatever_the_sizes() {
    // The upstream's allocations never merge: a pool over them cannot keep to a footprint.
    let d = device();
    let e = PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
        .initial_size(64 * MIB as u64)
        .virtual_memory(VirtualMemory::Off)
        .max_overhead(OVERHEAD)
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("max_overhead") && e.contains("pool.vmm") && e.contains("\"none\""),
        "{e}"
    );
    // Auto maps a pool with a limit even where its initial size alone would not.
    let p = PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
        .initial_size(4 * GIB as u64)
        .max_overhead(OVERHEAD)
        .build()
        .unwrap();
    assert!(p.uses_virtual_memory());
}

#[test]
fn a_pool_at_its_limit_grows_by_what_the_free_top_lacks_without_giving_memory_back() {
    let d = device();
    let p = PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
        .initial_size(4 * GIB as u64)
        .virtual_memory(VirtualMemory::On)
        .max_overhead(0.0)
        .build()
        .unwrap();
    let chunks = p.validate().unwrap().chunks;
    // 1 GiB at the bottom, 3 GiB free above it: 4 GiB more need 1 GiB of growth, right after.
    let a = p.allocate(GIB, S).unwrap();
    let b = p.allocate(4 * GIB, S).unwrap();
    assert_eq!(
        b.addr(),
        a.addr() + GIB as u64,
        "the block starts in the free top"
    );
    assert_eq!(
        p.peak_pool_size(),
        5 * GIB as u64,
        "reserved the peak in use, exactly"
    );
    let snap = p.validate().unwrap();
    assert_eq!(
        snap.chunks,
        chunks + GIB / (2 * MIB),
        "the initial chunks all stayed"
    );
    p.deallocate(a, GIB, S).unwrap();
    p.deallocate(b, 4 * GIB, S).unwrap();
}

#[test]
fn an_overhead_that_is_no_share_is_refused_naming_the_setting() {
    let d = device();
    for bad in [-0.5, f64::NAN, f64::INFINITY] {
        let e = PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
            .initial_size(0)
            .max_overhead(bad)
            .build()
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_overhead") && e.contains("5%"), "{bad}: {e}");
    }
}

use common::unbacked_sim as sim_of;

fn limited(d: Device, initial: u64) -> PoolMemoryResource {
    PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
        .initial_size(initial)
        .virtual_memory(VirtualMemory::On)
        .max_overhead(OVERHEAD)
        .build()
        .unwrap()
}

#[test]
fn small_blocks_count_toward_the_peak_in_use() {
    // The same bytes in use as 8192 blocks of 64 KiB (the bins) or as one block: growing a
    // freed 512 MiB block to 520 MiB then maps the same few chunks either way, instead of
    // giving the free block back and mapping 520 MiB afresh as if nothing small were live.
    let mut creates = Vec::new();
    for small in [false, true] {
        let (b, d) = sim_of(64 * GIB);
        let p = limited(d, 0);
        let mut live = Vec::new();
        if small {
            for _ in 0..8192 {
                live.push((p.allocate(64 << 10, S).unwrap(), 64 << 10));
            }
        } else {
            live.push((p.allocate(512 * MIB, S).unwrap(), 512 * MIB));
        }
        let x = p.allocate(512 * MIB, S).unwrap();
        p.deallocate(x, 512 * MIB, S).unwrap();
        let before = b.counts(0).unwrap();
        let y = p.allocate(520 * MIB, S).unwrap();
        creates.push(b.counts(0).unwrap().since(&before).allocations);
        p.deallocate(y, 520 * MIB, S).unwrap();
        for (ptr, size) in live {
            p.deallocate(ptr, size, S).unwrap();
        }
    }
    assert_eq!(
        creates[0], creates[1],
        "chunks mapped (one block, small blocks)"
    );
}

#[test]
fn growth_beside_a_free_range_that_the_device_refuses_tries_smaller() {
    // 960 MiB free at the pool's top, 100 MiB free on the device: 1000 MiB need 40 MiB more,
    // though the growth step asks for 1 GiB.
    for limit in [Some(OVERHEAD), None] {
        let (_b, d) = sim_of(4 * GIB);
        let mut b = PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
            .initial_size(0)
            .virtual_memory(VirtualMemory::On);
        if let Some(f) = limit {
            b = b.max_overhead(f);
        }
        let p = b.build().unwrap();
        if limit.is_some() {
            // A 2 GiB peak earlier: the limit allows 2.1 GiB.
            let big = p.allocate(2 * GIB, S).unwrap();
            p.deallocate(big, 2 * GIB, S).unwrap();
            p.release().unwrap();
        }
        let a = p.allocate(8 * MIB, S).unwrap();
        let raw = CudaMemoryResource::new(d);
        let free = d.mem_info().unwrap().free;
        let hog = raw.allocate(free - 100 * MIB, S).unwrap();
        let c = p
            .allocate(1000 * MIB, S)
            .unwrap_or_else(|e| panic!("limit {limit:?}: 1000 MiB fit beside the free top: {e}"));
        p.deallocate(c, 1000 * MIB, S).unwrap();
        raw.deallocate(hog, free - 100 * MIB, S).unwrap();
        p.deallocate(a, 8 * MIB, S).unwrap();
    }
}

#[test]
fn a_limit_maps_memory_and_says_so_before_it_is_built() {
    // A replacing pool adopts the old one's free chunks only where both map, or neither: the
    // builder says which it will be before anything is taken.
    let (_b, d) = sim_of(6 * GIB);
    let over = || PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)));
    let big = over().initial_size(4 * GIB as u64);
    assert!(
        !big.maps_memory().unwrap(),
        "Auto takes a large initial size from cuMemAlloc"
    );
    assert!(
        big.clone().max_overhead(OVERHEAD).maps_memory().unwrap(),
        "unless limited"
    );
    assert!(over().initial_size(GIB as u64).maps_memory().unwrap());
    assert!(
        !over()
            .initial_size(GIB as u64)
            .virtual_memory(VirtualMemory::Off)
            .maps_memory()
            .unwrap()
    );
}
