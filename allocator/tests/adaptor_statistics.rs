//! StatisticsResourceAdaptor: counters, peaks, RMM's counter scopes, the PyTorch-style report,
//! and exact peaks across threads.

mod common;

use std::sync::{Arc, Barrier};

use common::{MIB, device};
use rmm_allocator::adaptor::{Counter, MemoryReport, StatisticsResourceAdaptor};
use rmm_allocator::backend::DevicePtr;
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::SharedResource;
use rmm_allocator::resource::{CudaMemoryResource, PoolMemoryResource};
use rmm_allocator::{Error, Stream, StreamView};

const S: StreamView = StreamView::DEFAULT;

fn cuda() -> SharedResource {
    Arc::new(CudaMemoryResource::new(device()))
}

fn pool(initial: usize, maximum: usize) -> SharedResource {
    Arc::new(PoolMemoryResource::new(cuda(), initial, Some(maximum)).unwrap())
}

fn c(value: i64, peak: i64, total: i64) -> Counter {
    Counter { value, peak, total }
}

#[test]
fn counts_current_peak_and_total_bytes_and_allocations() {
    let stats = StatisticsResourceAdaptor::new(pool(64 * MIB, 256 * MIB));
    assert_eq!(stats.bytes_counter(), Counter::default());
    let a = stats.allocate(1000, S).unwrap();
    let b = stats.allocate(3 * MIB, S).unwrap();
    assert_eq!(
        stats.bytes_counter(),
        c(
            1000 + 3 * MIB as i64,
            1000 + 3 * MIB as i64,
            1000 + 3 * MIB as i64
        )
    );
    assert_eq!(stats.allocations_counter(), c(2, 2, 2));
    stats.deallocate(b, 3 * MIB, S).unwrap();
    let d = stats.allocate(500, S).unwrap();
    assert_eq!(
        stats.bytes_counter(),
        c(1500, 1000 + 3 * MIB as i64, 1500 + 3 * MIB as i64)
    );
    assert_eq!(stats.allocations_counter(), c(2, 2, 3));
    stats.deallocate(a, 1000, S).unwrap();
    stats.deallocate(d, 500, S).unwrap();
    assert_eq!(stats.bytes_counter().value, 0);
    assert_eq!(stats.allocations_counter().value, 0);
    // Zero-byte allocations hand out null and are not counted.
    let z = stats.allocate(0, S).unwrap();
    assert!(z.is_null());
    stats.deallocate(z, 0, S).unwrap();
    assert_eq!(stats.allocations_counter(), c(0, 2, 3));
}

#[test]
fn counter_scopes_follow_rmm() {
    let stats = StatisticsResourceAdaptor::new(pool(16 * MIB, 64 * MIB));
    let a = stats.allocate(100 * 256, S).unwrap();
    // Push: returns the outer counters, starts zeroed ones.
    let (outer_bytes, outer_allocs) = stats.push_counters();
    assert_eq!(outer_bytes, c(25_600, 25_600, 25_600));
    assert_eq!(outer_allocs, c(1, 1, 1));
    assert_eq!(stats.bytes_counter(), Counter::default());
    assert_eq!(stats.scope_depth(), 2);
    let b = stats.allocate(50 * 256, S).unwrap();
    stats.deallocate(a, 100 * 256, S).unwrap();
    // Inside the scope: +50, -100 (freed memory allocated outside it).
    assert_eq!(stats.bytes_counter(), c(-12_800, 12_800, 12_800));
    assert_eq!(stats.allocations_counter(), c(0, 1, 1));
    let (inner_bytes, inner_allocs) = stats.pop_counters().unwrap();
    assert_eq!(inner_bytes, c(-12_800, 12_800, 12_800));
    assert_eq!(inner_allocs, c(0, 1, 1));
    // The outer scope takes the inner's figures over: peak = max(100, 100 + 50).
    assert_eq!(stats.bytes_counter(), c(12_800, 38_400, 38_400));
    assert_eq!(stats.allocations_counter(), c(1, 2, 2));
    stats.deallocate(b, 50 * 256, S).unwrap();
    // The outermost scope cannot be popped.
    match stats.pop_counters() {
        Err(Error::InvalidArgument { what, .. }) => assert_eq!(what, "pop_counters"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert_eq!(stats.lifetime_bytes(), c(0, 38_400, 38_400));
}

#[test]
fn nested_scopes_and_measure() {
    let stats = StatisticsResourceAdaptor::new(pool(16 * MIB, 64 * MIB));
    let keep = stats.allocate(MIB, S).unwrap();
    let (_, bytes, allocs) = stats.measure(|| {
        let x = stats.allocate(2 * MIB, S).unwrap();
        let (_, inner, _) = stats.measure(|| {
            let y = stats.allocate(4 * MIB, S).unwrap();
            stats.deallocate(y, 4 * MIB, S).unwrap();
        });
        assert_eq!(inner, c(0, 4 * MIB as i64, 4 * MIB as i64));
        stats.deallocate(x, 2 * MIB, S).unwrap();
    });
    assert_eq!(bytes, c(0, 6 * MIB as i64, 6 * MIB as i64));
    assert_eq!(allocs, c(0, 2, 2));
    assert_eq!(
        stats.bytes_counter(),
        c(MIB as i64, 7 * MIB as i64, 7 * MIB as i64)
    );
    stats.deallocate(keep, MIB, S).unwrap();
}

fn peak_across_threads(tolerance: usize, each: usize) {
    const THREADS: usize = 4;
    let stats = Arc::new(StatisticsResourceAdaptor::with_peak_tolerance(
        pool(THREADS * each + 16 * MIB, THREADS * each + 64 * MIB),
        tolerance,
    ));
    let all_allocated = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let stats = Arc::clone(&stats);
            let all_allocated = Arc::clone(&all_allocated);
            std::thread::spawn(move || {
                let stream = Stream::new(device()).unwrap();
                let p = stats.allocate(each, stream.view()).unwrap();
                all_allocated.wait();
                stats.deallocate(p, each, stream.view()).unwrap();
                stream.synchronize().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let bytes = stats.bytes_counter();
    assert_eq!(bytes.value, 0);
    assert_eq!(bytes.total, (THREADS * each) as i64);
    // Every thread had its block when the last one allocated: the peak is all of them.
    assert_eq!(bytes.peak, (THREADS * each) as i64, "tolerance {tolerance}");
    assert_eq!(
        stats.allocations_counter(),
        c(0, THREADS as i64, THREADS as i64)
    );
    assert_eq!(stats.report().threads, THREADS as u64);
}

#[test]
fn exact_peak_across_threads_with_zero_tolerance() {
    peak_across_threads(0, 3 * MIB);
}

#[test]
fn peak_across_threads_is_exact_for_blocks_above_the_tolerance() {
    peak_across_threads(4 * MIB, 8 * MIB);
}

#[test]
fn many_threads_sum_exactly() {
    let stats = Arc::new(StatisticsResourceAdaptor::new(pool(64 * MIB, 256 * MIB)));
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let stats = Arc::clone(&stats);
            std::thread::spawn(move || {
                let stream = Stream::new(device()).unwrap();
                let mut live = Vec::new();
                for i in 0..500usize {
                    let bytes = 256 + (i * 997 + t * 131) % 20_000;
                    live.push((stats.allocate(bytes, stream.view()).unwrap(), bytes));
                    if i % 3 == 0 {
                        let (p, b) = live.swap_remove(i % live.len());
                        stats.deallocate(p, b, stream.view()).unwrap();
                    }
                }
                let kept: usize = live.iter().map(|x| x.1).sum();
                // Leave some allocated to be freed by the main thread (cross-thread frees).
                (live, kept, stream)
            })
        })
        .collect();
    let mut expected = 0i64;
    let mut leftovers = Vec::new();
    for h in handles {
        let (live, kept, stream) = h.join().unwrap();
        stream.synchronize().unwrap();
        expected += kept as i64;
        leftovers.extend(live);
    }
    assert_eq!(stats.bytes_counter().value, expected);
    assert_eq!(stats.allocations_counter().value, leftovers.len() as i64);
    assert_eq!(stats.allocations_counter().total, 8 * 500);
    assert!(stats.bytes_counter().peak >= expected);
    for (p, b) in leftovers {
        stats.deallocate(p, b, S).unwrap();
    }
    assert_eq!(stats.bytes_counter().value, 0);
}

#[test]
fn report_has_pool_figures_and_round_trips_through_json() {
    let stats = StatisticsResourceAdaptor::new(pool(32 * MIB, 64 * MIB));
    let a = stats.allocate(10 * MIB, S).unwrap();
    let b = stats.allocate(1000, S).unwrap();
    // Over the pool's maximum: out of memory, counted.
    let e = stats.allocate(100 * MIB, S).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let r = stats.report();
    assert_eq!(r.device, 0);
    assert_eq!(
        r.resource,
        "StatisticsResourceAdaptor > PoolMemoryResource > CudaMemoryResource"
    );
    assert_eq!(r.allocated_bytes.value, (10 * MIB + 1000) as i64);
    assert_eq!(r.allocations.value, 2);
    assert_eq!(r.num_ooms, 1);
    assert_eq!(r.num_alloc_retries, 0);
    // The pool took 32 MiB at construction and may have grown up to its maximum.
    let reserved = r.reserved_bytes.unwrap();
    assert!(
        (32 * MIB as u64..=64 * MIB as u64).contains(&reserved),
        "{reserved}"
    );
    assert_eq!(r.reserved_maximum_bytes, Some(64 * MIB as u64));
    // The pool rounds (and may carve small blocks from slabs): in use is at least what was
    // asked for, and cached is the rest of what it holds.
    let in_use = r.pool_in_use_bytes.unwrap();
    assert!(
        (10 * MIB as u64 + 1000..=11 * MIB as u64 + 65_536).contains(&in_use),
        "{in_use}"
    );
    assert_eq!(r.cached_free_bytes, Some(reserved - in_use));
    let largest = r.largest_free_block.unwrap();
    assert!(largest > 0 && largest <= reserved - in_use, "{largest}");
    // Free (nothing waits for another stream here) and fragmentation = 1 − largest / free.
    let free = r.pool_free_bytes.unwrap();
    assert_eq!(free, reserved - in_use);
    let fragmentation = r.fragmentation().unwrap();
    let expected = 1.0 - largest as f64 / free as f64;
    assert!((fragmentation - expected).abs() <= 0.001, "{fragmentation}");
    let json = r.to_json();
    let back: MemoryReport = serde_json::from_str(&json).unwrap();
    assert_eq!(back, r);
    let stats_map = r.memory_stats();
    assert_eq!(
        stats_map["allocated_bytes.all.current"],
        (10 * MIB + 1000) as i64
    );
    assert_eq!(stats_map["reserved_bytes.all.current"], reserved as i64);
    assert_eq!(stats_map["num_ooms"], 1);
    assert_eq!(stats_map["allocation.all.allocated"], 2);
    let text = r.to_string();
    assert!(text.contains("out-of-memory 1"), "{text}");
    assert!(text.contains("fragmentation "), "{text}");
    assert!(stats_map.contains_key("fragmentation_permille"));
    stats.deallocate(a, 10 * MIB, S).unwrap();
    stats.deallocate(b, 1000, S).unwrap();
    assert_eq!(stats.out_of_memory_count(), 1);
}

#[test]
fn report_without_a_pool_has_no_reserved_figures() {
    let stats = StatisticsResourceAdaptor::new(cuda());
    let p = stats.allocate(4096, S).unwrap();
    let r = stats.report();
    assert_eq!(r.reserved_bytes, None);
    assert_eq!(r.largest_free_block, None);
    assert!(!r.memory_stats().contains_key("reserved_bytes.all.current"));
    stats.deallocate(p, 4096, S).unwrap();
}

#[test]
fn equality_follows_the_upstream() {
    let up = pool(16 * MIB, 32 * MIB);
    let a = StatisticsResourceAdaptor::new(Arc::clone(&up));
    let b = StatisticsResourceAdaptor::new(Arc::clone(&up));
    let other = StatisticsResourceAdaptor::new(pool(16 * MIB, 32 * MIB));
    assert!(a.is_equal(&a));
    assert!(a.is_equal(&b));
    assert!(!a.is_equal(&other));
    assert!(!a.is_equal(&*up));
}

#[test]
fn more_threads_than_shards_still_count_exactly() {
    use rmm_allocator::adaptor::MAX_SHARDS;
    let stats = Arc::new(StatisticsResourceAdaptor::new(cuda()));
    let threads = MAX_SHARDS + 8;
    let all_allocated = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let stats = Arc::clone(&stats);
            let all_allocated = Arc::clone(&all_allocated);
            std::thread::spawn(move || {
                let p = stats.allocate(4096, S).unwrap();
                all_allocated.wait();
                let q = stats.allocate(256, S).unwrap();
                stats.deallocate(p, 4096, S).unwrap();
                q
            })
        })
        .collect();
    let left: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(stats.bytes_counter().value, (threads * 256) as i64);
    assert_eq!(stats.bytes_counter().total, (threads * (4096 + 256)) as i64);
    assert_eq!(
        stats.allocations_counter(),
        c(
            threads as i64,
            stats.allocations_counter().peak,
            2 * threads as i64
        )
    );
    // Every thread held its 4 KiB block at the barrier: with the default tolerance the peak
    // may under-read by up to 64 allocations per thread, never over-read.
    let peak = stats.bytes_counter().peak;
    assert!(
        peak >= (threads * 256) as i64 && peak <= (threads * (4096 + 256)) as i64,
        "{peak}"
    );
    assert_eq!(stats.report().threads, threads as u64);
    for q in left {
        stats.deallocate(q, 256, S).unwrap();
    }
    assert_eq!(stats.bytes_counter().value, 0);
    assert_eq!(stats.allocations_counter().value, 0);
}

#[test]
fn a_concrete_pool_upstream_is_called_directly_and_still_found() {
    let pool = Arc::new(PoolMemoryResource::new(cuda(), 16 * MIB, Some(64 * MIB)).unwrap());
    let stats: StatisticsResourceAdaptor<PoolMemoryResource> =
        StatisticsResourceAdaptor::new(Arc::clone(&pool));
    let p = stats.allocate(MIB, S).unwrap();
    assert_eq!(stats.bytes_counter(), c(MIB as i64, MIB as i64, MIB as i64));
    let r = stats.report();
    assert_eq!(
        r.resource,
        "StatisticsResourceAdaptor > PoolMemoryResource > CudaMemoryResource"
    );
    assert!(r.reserved_bytes.is_some());
    // As a shared resource it stacks like any other.
    let shared: SharedResource = Arc::new(stats);
    assert!(rmm_allocator::adaptor::find_in_chain::<PoolMemoryResource>(&*shared).is_some());
    shared.deallocate(p, MIB, S).unwrap();
}

// ---------------------------------------------------------------------------------------
// The exact peak across threads (the default): barriers that fix the live sum, and a
// reference computed under a lock below the adaptor.

/// Hands out distinct fake pointers and tracks the true live sum under a lock: the reference
/// the statistics adaptor above it is checked against.
///
/// Each operation is an *event* under the lock. Between its event and the return of the
/// adaptor's call, an operation is *pending*: the adaptor counts it at some instant in that
/// window. So at each instant the adaptor's sum lies between `live - pending allocations` and
/// `live + pending frees`, and its peak between the maxima of those two envelopes. When the
/// callers hold the lock across the adaptor's call (it is reentrant), nothing else happens in
/// the window and the envelopes meet: the peak must equal the reference exactly.
#[derive(Debug)]
struct Reference {
    state: parking_lot::ReentrantMutex<std::cell::RefCell<RefState>>,
    next: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Default)]
struct RefState {
    live: [i64; 2],
    pending_allocs: [i64; 2],
    pending_frees: [i64; 2],
    /// Maxima of `live`, `live - pending allocations` and `live + pending frees`.
    max: [i64; 2],
    low: [i64; 2],
    high: [i64; 2],
}

impl RefState {
    fn seen(&mut self) {
        for k in 0..2 {
            self.max[k] = self.max[k].max(self.live[k]);
            self.low[k] = self.low[k].max(self.live[k] - self.pending_allocs[k]);
            self.high[k] = self.high[k].max(self.live[k] + self.pending_frees[k]);
        }
    }
}

impl Reference {
    fn new() -> Self {
        Reference {
            state: parking_lot::ReentrantMutex::new(Default::default()),
            next: std::sync::atomic::AtomicU64::new(1 << 20),
        }
    }

    /// The adaptor's call for an allocation of `bytes` returned.
    fn allocated(&self, bytes: usize) {
        let g = self.state.lock();
        let mut s = g.borrow_mut();
        s.pending_allocs[0] -= bytes as i64;
        s.pending_allocs[1] -= 1;
        s.seen();
    }

    /// The adaptor's call for a free of `bytes` returned.
    fn freed(&self, bytes: usize) {
        let g = self.state.lock();
        let mut s = g.borrow_mut();
        s.pending_frees[0] -= bytes as i64;
        s.pending_frees[1] -= 1;
        s.seen();
    }

    /// (peak, lowest and highest peak the adaptor may report) for bytes (0) or counts (1).
    fn peaks(&self, k: usize) -> (i64, i64, i64) {
        let g = self.state.lock();
        let s = g.borrow();
        (s.max[k], s.low[k], s.high[k])
    }
}

impl DeviceMemoryResource for Reference {
    fn allocate(&self, bytes: usize, _: StreamView) -> rmm_allocator::Result<DevicePtr> {
        let g = self.state.lock();
        let mut s = g.borrow_mut();
        s.live[0] += bytes as i64;
        s.live[1] += 1;
        s.pending_allocs[0] += bytes as i64;
        s.pending_allocs[1] += 1;
        s.seen();
        let p = self
            .next
            .fetch_add(256, std::sync::atomic::Ordering::Relaxed);
        Ok(DevicePtr(p))
    }

    fn deallocate(&self, _: DevicePtr, bytes: usize, _: StreamView) -> rmm_allocator::Result<()> {
        let g = self.state.lock();
        let mut s = g.borrow_mut();
        s.live[0] -= bytes as i64;
        s.live[1] -= 1;
        s.pending_frees[0] += bytes as i64;
        s.pending_frees[1] += 1;
        s.seen();
        Ok(())
    }

    fn device(&self) -> rmm_allocator::Device {
        device()
    }

    fn name(&self) -> &'static str {
        "Reference"
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// xorshift64*, for reproducible workloads.
fn rng(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

#[test]
fn the_default_peak_is_exact() {
    let stats = StatisticsResourceAdaptor::new(cuda());
    assert_eq!(stats.peak_tolerance(), 0);
    assert_eq!(stats.report().peak_tolerance_bytes, 0);
}

/// 8 threads in rounds separated by barriers. In each round every thread first only
/// allocates (many blocks, so that headroom runs out and is traded and frozen), so that at the
/// round's barrier the live sum is exactly the sum of what the threads hold, then frees and
/// reallocates without ever holding more than at the barrier, and frees blocks of other
/// threads. The peak is the largest barrier sum, exactly; a scope pushed between rounds sees
/// the peak of its own rounds.
#[test]
fn exact_peak_is_the_live_sum_at_a_barrier_across_8_threads() {
    const THREADS: usize = 8;
    // Per round and thread: the blocks held at the barrier. Round 2 holds less than round 1,
    // round 3 more (the peak rises again), round 4 less.
    let plan = |round: usize, t: usize| -> Vec<usize> {
        let n = [40, 25, 60, 10][round];
        (0..n)
            .map(|i| 256 * (1 + (i * 7 + t * 13 + round * 5) % 50))
            .collect()
    };
    let expected: Vec<(i64, i64)> = (0..4)
        .map(|r| {
            (0..THREADS).fold((0, 0), |(b, c), t| {
                let p = plan(r, t);
                (b + p.iter().sum::<usize>() as i64, c + p.len() as i64)
            })
        })
        .collect();
    let stats = Arc::new(StatisticsResourceAdaptor::new(
        Arc::new(Reference::new()) as SharedResource
    ));
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let exchange = Arc::new(std::sync::Mutex::new(Vec::new()));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (stats, barrier, exchange) = (
                Arc::clone(&stats),
                Arc::clone(&barrier),
                Arc::clone(&exchange),
            );
            std::thread::spawn(move || {
                for round in 0..4 {
                    barrier.wait(); // the main thread may have pushed a scope
                    let mut held: Vec<_> = plan(round, t)
                        .into_iter()
                        .map(|b| (stats.allocate(b, S).unwrap(), b))
                        .collect();
                    barrier.wait(); // every thread holds its plan: the peak
                    barrier.wait(); // the main thread has read the counters
                    // Free and reallocate, never above what this thread held.
                    for blk in &mut held {
                        let (p, b) = *blk;
                        stats.deallocate(p, b, S).unwrap();
                        let smaller = (b / 2).max(1);
                        *blk = (stats.allocate(smaller, S).unwrap(), smaller);
                    }
                    // Hand half to another thread and free it there.
                    let give = held.split_off(held.len() / 2);
                    exchange.lock().unwrap().push(((t + 1) % THREADS, give));
                    barrier.wait();
                    let mine: Vec<_> = {
                        let mut ex = exchange.lock().unwrap();
                        let i = ex.iter().position(|(to, _)| *to == t).unwrap();
                        ex.swap_remove(i).1
                    };
                    for (p, b) in mine.into_iter().chain(held) {
                        stats.deallocate(p, b, S).unwrap();
                    }
                    barrier.wait(); // everything freed
                }
            })
        })
        .collect();
    let mut peak = (0i64, 0i64);
    for (round, &(bytes, count)) in expected.iter().enumerate() {
        // A scope for rounds 2 and 3 together.
        if round == 2 {
            stats.push_counters();
        }
        barrier.wait();
        barrier.wait(); // all hold their plan
        peak = (peak.0.max(bytes), peak.1.max(count));
        let b = stats.bytes_counter();
        let a = stats.allocations_counter();
        assert_eq!(b.value, bytes, "round {round}");
        assert_eq!(a.value, count, "round {round}");
        if round < 2 {
            assert_eq!((b.peak, a.peak), peak, "round {round}");
        }
        barrier.wait();
        barrier.wait();
        barrier.wait();
        assert_eq!(stats.bytes_counter().value, 0);
        if round == 3 {
            let (sb, sa) = stats.pop_counters().unwrap();
            let scope = (
                expected[2].0.max(expected[3].0),
                expected[2].1.max(expected[3].1),
            );
            assert_eq!((sb.peak, sa.peak), scope, "the scope's peak");
            assert_eq!((sb.value, sa.value), (0, 0));
        }
    }
    for h in handles {
        h.join().unwrap();
    }
    let b = stats.bytes_counter();
    let a = stats.allocations_counter();
    assert_eq!((b.peak, a.peak), peak);
    assert_eq!(stats.lifetime_bytes().peak, peak.0);
    assert_eq!(stats.lifetime_allocations().peak, peak.1);
    assert!(peak.0 > expected[0].0, "round 3 raised the peak");
}

/// Runs 8 threads of random allocations and frees (some handed to other threads) through a
/// statistics adaptor over a [`Reference`]; returns the adaptor and the reference.
fn stress(
    serialize: bool,
    ops_per_thread: usize,
) -> (Arc<StatisticsResourceAdaptor>, Arc<Reference>) {
    const THREADS: usize = 8;
    let reference = Arc::new(Reference::new());
    let stats = Arc::new(StatisticsResourceAdaptor::new(
        Arc::clone(&reference) as SharedResource
    ));
    let exchange = Arc::new(std::sync::Mutex::new(Vec::<(DevicePtr, usize)>::new()));
    let start = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (stats, reference, exchange, start) = (
                Arc::clone(&stats),
                Arc::clone(&reference),
                Arc::clone(&exchange),
                Arc::clone(&start),
            );
            std::thread::spawn(move || {
                let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ ((t as u64 + 1) * 0x1234_5678_9ABC_DEF1);
                let cap = 64 * MIB;
                let mut live: Vec<(DevicePtr, usize)> = Vec::new();
                let mut live_bytes = 0usize;
                start.wait();
                for _ in 0..ops_per_thread {
                    let r = rng(&mut seed);
                    // Log-uniform 256 B .. 4 MiB.
                    let size = 256usize << (r % 15);
                    let size = size + (r >> 32) as usize % size;
                    let alloc = live.is_empty() || (r >> 16) % 100 < 52 && live_bytes + size <= cap;
                    let _serial = serialize.then(|| reference.state.lock());
                    if alloc {
                        let p = stats.allocate(size, S).unwrap();
                        reference.allocated(size);
                        live.push((p, size));
                        live_bytes += size;
                    } else if (r >> 8).is_multiple_of(16) {
                        // Hand a block to whichever thread frees from the exchange next.
                        let i = (r >> 24) as usize % live.len();
                        let blk = live.swap_remove(i);
                        live_bytes -= blk.1;
                        exchange.lock().unwrap().push(blk);
                    } else {
                        let theirs = if (r >> 8) % 4 == 1 {
                            exchange.lock().unwrap().pop()
                        } else {
                            None
                        };
                        let (p, b) = theirs.unwrap_or_else(|| {
                            let i = (r >> 24) as usize % live.len();
                            let blk = live.swap_remove(i);
                            live_bytes -= blk.1;
                            blk
                        });
                        stats.deallocate(p, b, S).unwrap();
                        reference.freed(b);
                    }
                }
                for (p, b) in live {
                    let _serial = serialize.then(|| reference.state.lock());
                    stats.deallocate(p, b, S).unwrap();
                    reference.freed(b);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    for (p, b) in exchange.lock().unwrap().drain(..) {
        stats.deallocate(p, b, S).unwrap();
        reference.freed(b);
    }
    (stats, reference)
}

/// With the reference's lock held across each adaptor call, the order of the operations is
/// the lock's: the peaks must equal the reference's exactly.
#[test]
fn exact_peak_equals_a_locked_reference_under_8_threads() {
    let (stats, reference) = stress(true, 20_000);
    let bytes = stats.bytes_counter();
    let allocs = stats.allocations_counter();
    assert_eq!((bytes.value, allocs.value), (0, 0));
    assert_eq!(bytes.peak, reference.peaks(0).0, "bytes");
    assert_eq!(allocs.peak, reference.peaks(1).0, "allocations");
    assert_eq!(stats.lifetime_bytes().peak, reference.peaks(0).0);
    assert!(stats.report().threads >= 8);
}

/// Free-running threads: the peak lies between the reference's envelopes (see
/// [`Reference`]), which differ only by the operations in flight at each instant.
#[test]
fn exact_peak_stays_within_the_reference_envelopes_under_8_free_running_threads() {
    for _ in 0..3 {
        let (stats, reference) = stress(false, 50_000);
        let bytes = stats.bytes_counter();
        let allocs = stats.allocations_counter();
        assert_eq!((bytes.value, allocs.value), (0, 0));
        for (k, peak) in [(0, bytes.peak), (1, allocs.peak)] {
            let (max, low, high) = reference.peaks(k);
            assert!(
                low <= peak && peak <= high,
                "{k}: peak {peak}, reference {max} in [{low}, {high}]"
            );
        }
    }
}

/// Allocates `sizes` on `threads` threads at once (each its own blocks), frees them all.
fn churn_on_threads(stats: &Arc<StatisticsResourceAdaptor>, threads: usize, sizes: &[usize]) {
    std::thread::scope(|t| {
        for _ in 0..threads {
            t.spawn(|| {
                let ptrs: Vec<(DevicePtr, usize)> = sizes
                    .iter()
                    .map(|&n| (stats.allocate(n, S).unwrap(), n))
                    .collect();
                for (p, n) in ptrs {
                    stats.deallocate(p, n, S).unwrap();
                }
            });
        }
    });
}

#[test]
fn reset_peaks_makes_every_peak_the_current_value_exact_or_not() {
    for tolerance in [0, 64 * 1024] {
        let p = Arc::new(PoolMemoryResource::new(cuda(), 16 * MIB, Some(512 * MIB)).unwrap());
        let stats = Arc::new(StatisticsResourceAdaptor::with_peak_tolerance(
            Arc::clone(&p) as SharedResource,
            tolerance,
        ));
        let kept = stats.allocate(MIB, S).unwrap();
        churn_on_threads(&stats, 4, &[4 * MIB, 8 * MIB, 1000]);
        let report = stats.report();
        assert!(report.allocated_bytes.peak >= (MIB + 12 * MIB + 1000) as i64);
        let reserved = report.reserved_bytes.unwrap();
        assert!(reserved > 16 * MIB as u64, "the pool grew");
        assert_eq!(report.reserved_peak_bytes, Some(reserved));
        assert_eq!(
            report.memory_stats()["reserved_bytes.all.peak"],
            reserved as i64
        );
        stats.reset_peaks();
        let after = stats.report();
        assert_eq!(
            (after.allocated_bytes.value, after.allocated_bytes.peak),
            (MIB as i64, MIB as i64),
            "tolerance {tolerance}"
        );
        assert_eq!((after.allocations.value, after.allocations.peak), (1, 1));
        assert_eq!(
            stats.bytes_counter().peak,
            MIB as i64,
            "the innermost scope's too"
        );
        // Trimmed to what is in use, the pool's peak follows it down after a reset.
        p.trim(0).unwrap();
        stats.reset_peaks();
        assert_eq!(p.peak_pool_size(), p.pool_size());
        // And the peaks count from there again, on every thread.
        churn_on_threads(&stats, 2, &[2 * MIB]);
        let again = stats.report();
        assert!(again.allocated_bytes.peak >= (MIB + 2 * MIB) as i64);
        assert!(again.allocated_bytes.peak <= (MIB + 4 * MIB) as i64 + 2 * tolerance as i64);
        stats.deallocate(kept, MIB, S).unwrap();
    }
}
