//! Stream order in the pool: memory freed on one stream is not handed to another stream
//! before the first stream's earlier work has completed.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{MIB, device, on_sim};
use rmm_allocator::backend::{SimBackend, SimConfig, SimMemoryMode};
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::{CudaMemoryResource, PoolMemoryResource};
use rmm_allocator::{Device, Stream, StreamView};

/// A simulated device of 1 GiB (its streams can be held back) and a pool of 64 MiB on it that
/// cannot grow.
fn fixed_sim_pool(mode: SimMemoryMode) -> (&'static SimBackend, Device, PoolMemoryResource) {
    let b = SimBackend::leak(SimConfig {
        devices: 1,
        capacity: 1 << 30,
        mode,
    })
    .unwrap();
    let d = Device::on(b, 0).unwrap();
    let pool = PoolMemoryResource::new(
        Arc::new(CudaMemoryResource::new(d)),
        64 * MIB,
        Some(64 * MIB),
    )
    .unwrap();
    (b, d, pool)
}

#[test]
fn a_block_freed_on_a_held_stream_waits_for_it_before_another_stream_gets_it() {
    // A pool that cannot grow: the second stream can only get memory the first gave back.
    let (b, d, pool) = fixed_sim_pool(SimMemoryMode::Backed);
    let pool = Arc::new(pool);
    let a = Stream::new(d).unwrap();
    let bstream = Stream::new(d).unwrap();
    let p = pool.allocate(60 * MIB, a.view()).unwrap();
    // Work queued on A before the free, held back.
    let gate = b.hold_stream(0, a.view().raw()).unwrap();
    d.memset_async(p, 7, 60 * MIB, a.view()).unwrap();
    pool.deallocate(p, 60 * MIB, a.view()).unwrap();
    // Stream A may reuse it at once.
    let again = pool.allocate(60 * MIB, a.view()).unwrap();
    assert_eq!(again, p, "the freeing stream reuses its block at once");
    pool.deallocate(again, 60 * MIB, a.view()).unwrap();

    let done = Arc::new(AtomicBool::new(false));
    let (pool2, done2, bview) = (Arc::clone(&pool), Arc::clone(&done), bstream.view());
    let taker = std::thread::spawn(move || {
        let q = pool2.allocate(60 * MIB, bview).unwrap();
        done2.store(true, Ordering::SeqCst);
        q
    });
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !done.load(Ordering::SeqCst),
        "stream B got A's block while A's work was pending"
    );
    assert!(!a.is_idle().unwrap());
    gate.open();
    let q = taker.join().unwrap();
    assert_eq!(q, p, "B gets the block once A is done");
    assert!(
        a.is_idle().unwrap(),
        "A's earlier work completed before B got the block"
    );
    let mut back = vec![0u8; 8];
    d.copy_to_host(&mut back, q).unwrap();
    assert_eq!(back, vec![7u8; 8]);
    pool.deallocate(q, 60 * MIB, bview).unwrap();
    pool.validate().unwrap();
}

#[test]
fn a_block_freed_on_another_stream_is_not_reused_before_that_stream_catches_up() {
    let (b, d, pool) = fixed_sim_pool(SimMemoryMode::Backed);
    let a = Stream::new(d).unwrap();
    let other = Stream::new(d).unwrap();
    let p = pool.allocate(8 * MIB, a.view()).unwrap();
    let gate = b.hold_stream(0, other.view().raw()).unwrap();
    // Freed on `other` while `other` still has work queued: pending, not in any arena's
    // cache of freed blocks (8 MiB is a cacheable size).
    pool.deallocate(p, 8 * MIB, other.view()).unwrap();
    let snap = pool.validate().unwrap();
    assert_eq!((snap.pending, snap.cached), (8 * MIB as u64, 0), "{snap:?}");
    let q = pool.allocate(4 * MIB, a.view()).unwrap();
    assert!(
        q.addr() >= p.addr() + 8 * MIB as u64 || q.addr() + 4 * MIB as u64 <= p.addr(),
        "pending block reused early"
    );
    gate.open();
    other.synchronize().unwrap();
    pool.synchronize().unwrap();
    assert_eq!(pool.validate().unwrap().pending, 0);
    let r = pool.allocate(8 * MIB, a.view()).unwrap();
    assert_eq!(r, p, "the block comes back once the freeing stream is done");
    assert_eq!(pool.validate().unwrap().cached, 0);
    pool.deallocate(q, 4 * MIB, a.view()).unwrap();
    pool.deallocate(r, 8 * MIB, a.view()).unwrap();
    pool.synchronize().unwrap();
    assert!(pool.validate().unwrap().fully_coalesced);
}

#[test]
fn on_the_process_backend_reclaim_waits_for_the_giving_stream() {
    // On a GPU: a long run of memsets on A, then B needs A's memory: when B's allocation
    // returns, A's work must be complete. On the simulator the same with a delayed stream.
    let d = device();
    let pool = Arc::new(
        PoolMemoryResource::new(Arc::new(CudaMemoryResource::new(d)), 1 << 30, Some(1 << 30))
            .unwrap(),
    );
    let a = Stream::new(d).unwrap();
    let bstream = Stream::new(d).unwrap();
    let p = pool.allocate(1000 * MIB, a.view()).unwrap();
    // About 70 ms of work on an H200; the simulator's host memsets are slower, so fewer.
    let rounds = if on_sim() { 3 } else { 200 };
    for _ in 0..rounds {
        d.memset_async(p, 1, 1000 * MIB, a.view()).unwrap();
    }
    pool.deallocate(p, 1000 * MIB, a.view()).unwrap();
    let q = pool.allocate(1000 * MIB, bstream.view()).unwrap();
    assert!(
        a.is_idle().unwrap(),
        "B got A's memory while A's memsets were still running"
    );
    assert_eq!(q, p);
    pool.deallocate(q, 1000 * MIB, bstream.view()).unwrap();
}

#[test]
fn memory_of_a_destroyed_stream_is_reclaimed() {
    let (_, d, pool) = fixed_sim_pool(SimMemoryMode::Unbacked);
    {
        let gone = Stream::new(d).unwrap();
        let p = pool.allocate(60 * MIB, gone.view()).unwrap();
        pool.deallocate(p, 60 * MIB, gone.view()).unwrap();
    }
    let s = Stream::new(d).unwrap();
    let q = pool.allocate(60 * MIB, s.view()).unwrap();
    pool.deallocate(q, 60 * MIB, s.view()).unwrap();
}

/// The same on the process-wide backend (the GPU under `RMM_BACKEND=cuda`): reclaiming the
/// arena of a destroyed stream must not touch the dangling stream handle.
#[test]
fn memory_of_a_destroyed_stream_is_reclaimed_on_the_process_backend() {
    let d = common::device();
    let pool = PoolMemoryResource::new(
        Arc::new(CudaMemoryResource::new(d)),
        64 * MIB,
        Some(64 * MIB),
    )
    .unwrap();
    for _ in 0..4 {
        let gone = Stream::new(d).unwrap();
        let p = pool.allocate(60 * MIB, gone.view()).unwrap();
        d.memset_async(p, 1, 60 * MIB, gone.view()).unwrap();
        pool.deallocate(p, 60 * MIB, gone.view()).unwrap();
        drop(gone);
        // Another stream needs the memory: the pool must take it from the dead stream's arena.
        let s = Stream::new(d).unwrap();
        let q = pool.allocate(60 * MIB, s.view()).unwrap();
        pool.deallocate(q, 60 * MIB, s.view()).unwrap();
        s.synchronize().unwrap();
    }
    pool.synchronize().unwrap();
    assert!(pool.validate().unwrap().fully_coalesced);
}

/// The pattern that crashed the 16-thread stress test on an H200: streams die while their
/// arenas hold entirely free regions, the driver hands out new streams and events
/// meanwhile, and every later request that the pool's free space cannot serve first takes
/// the regions of idle streams without waiting, which asks the backend whether each arena's
/// stream is idle. For a destroyed stream that question must be an error (the stream then
/// counts as busy and the blocking reclaim waits for the device), never a `cuStreamQuery` on
/// the dangling handle: that read freed driver memory and died with SIGSEGV. Runs on the
/// process-wide backend (the GPU under `RMM_BACKEND=cuda`).
#[test]
fn idle_first_reclaim_never_queries_a_destroyed_stream_on_the_process_backend() {
    const STREAMS: usize = 16;
    let d = common::device();
    let pool = PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
        .initial_size(0)
        .maximum_size((STREAMS * 64 * MIB) as u64)
        .growth(64 * MIB as u64)
        .build()
        .unwrap();
    for _ in 0..4 {
        // Each stream takes a 64 MiB region into its arena, frees into it and dies.
        for _ in 0..STREAMS {
            let gone = Stream::new(d).unwrap();
            let p = pool.allocate(48 * MIB, gone.view()).unwrap();
            d.memset_async(p, 1, MIB, gone.view()).unwrap();
            pool.deallocate(p, 48 * MIB, gone.view()).unwrap();
            drop(gone);
        }
        // New streams (the driver may reuse the dead ones' memory, or their handles): the
        // pool is at its maximum, so their memory comes from the dead streams' arenas.
        let live: Vec<Stream> = (0..STREAMS).map(|_| Stream::new(d).unwrap()).collect();
        let blocks: Vec<_> = live
            .iter()
            .map(|s| pool.allocate(48 * MIB, s.view()).unwrap())
            .collect();
        for (s, p) in live.iter().zip(blocks) {
            d.memset_async(p, 2, MIB, s.view()).unwrap();
            pool.deallocate(p, 48 * MIB, s.view()).unwrap();
            s.synchronize().unwrap();
        }
    }
    pool.synchronize().unwrap();
    let snap = pool.validate().unwrap();
    assert_eq!(snap.pool_size, (STREAMS * 64 * MIB) as u64, "{snap:?}");
    assert!(snap.fully_coalesced, "{snap:?}");
}

// The per-thread default stream: one handle, a different stream on each thread (cuDF with
// CUDF_PER_THREAD_STREAM=1, CuPy's Stream.ptds, RMM's cuda_stream_per_thread).

#[test]
fn each_thread_has_its_own_per_thread_default_stream_on_the_simulated_device() {
    let (b, d, _pool) = fixed_sim_pool(SimMemoryMode::Backed);
    let gate = b.hold_stream(0, StreamView::PER_THREAD.raw()).unwrap();
    let mine = d
        .backend()
        .stream_query(0, StreamView::PER_THREAD.raw())
        .unwrap();
    let theirs = std::thread::spawn(move || {
        d.backend()
            .stream_query(0, StreamView::PER_THREAD.raw())
            .unwrap()
    })
    .join()
    .unwrap();
    assert!(!mine && theirs, "held here, idle on another thread");
    let synced = std::thread::spawn(move || d.synchronize().unwrap());
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !synced.is_finished(),
        "a device-wide wait covers every thread's stream"
    );
    gate.open();
    synced.join().unwrap();
}

#[test]
fn a_large_block_freed_on_one_threads_per_thread_stream_waits_before_another_thread_gets_it() {
    // Blocks over 16 MiB come from one arena all threads of a stream share; another thread's
    // per-thread stream is not ordered after this one's, so it must not share it.
    let (b, d, pool) = fixed_sim_pool(SimMemoryMode::Backed);
    let pool = Arc::new(pool);
    let ptds = StreamView::PER_THREAD;
    let p = pool.allocate(60 * MIB, ptds).unwrap();
    let gate = b.hold_stream(0, ptds.raw()).unwrap();
    d.memset_async(p, 7, 60 * MIB, ptds).unwrap();
    pool.deallocate(p, 60 * MIB, ptds).unwrap();
    taken_once_the_work_is_done(&pool, d, p, gate, 7);
}

#[test]
fn a_block_another_thread_frees_on_its_per_thread_stream_waits_for_that_stream() {
    let (b, _d, pool) = fixed_sim_pool(SimMemoryMode::Backed);
    let pool = Arc::new(pool);
    let ptds = StreamView::PER_THREAD;
    let p = pool.allocate(8 * MIB, ptds).unwrap();
    // Another thread frees it on its own per-thread stream, which still has work queued.
    let (pool2, (gate_tx, gate_rx)) = (Arc::clone(&pool), std::sync::mpsc::channel());
    std::thread::spawn(move || {
        let gate = b.hold_stream(0, ptds.raw()).unwrap();
        pool2.deallocate(p, 8 * MIB, ptds).unwrap();
        gate_tx.send(gate).unwrap();
    })
    .join()
    .unwrap();
    let gate = gate_rx.recv().unwrap();
    let snap = pool.validate().unwrap();
    assert_eq!(
        snap.pending,
        8 * MIB as u64,
        "pending on the freeing thread's stream: {snap:?}"
    );
    let q = pool.allocate(8 * MIB, ptds).unwrap();
    assert_ne!(q, p, "reused before the freeing thread's stream caught up");
    gate.open();
    pool.synchronize().unwrap();
    pool.deallocate(q, 8 * MIB, ptds).unwrap();
    pool.synchronize().unwrap();
    pool.validate().unwrap();
}

#[test]
fn threads_that_come_and_go_reuse_per_thread_arenas() {
    let (_b, _d, pool) = fixed_sim_pool(SimMemoryMode::Backed);
    let pool = Arc::new(pool);
    for _ in 0..200 {
        let pool = Arc::clone(&pool);
        std::thread::spawn(move || {
            let p = pool.allocate(256, StreamView::PER_THREAD).unwrap();
            pool.deallocate(p, 256, StreamView::PER_THREAD).unwrap();
        })
        .join()
        .unwrap();
    }
    let arenas = pool.validate().unwrap().arenas;
    assert!(
        arenas <= 2,
        "{arenas} arenas for threads that ran one at a time"
    );
}

#[test]
fn a_thread_on_an_exited_threads_per_thread_arena_waits_for_that_threads_work() {
    // The exited thread freed its block on its own stream, which still has work queued: the next
    // thread to take its arena must not get the block before that work is done.
    let (b, d, pool) = fixed_sim_pool(SimMemoryMode::Backed);
    let pool = Arc::new(pool);
    let ptds = StreamView::PER_THREAD;
    let pool1 = Arc::clone(&pool);
    let (p, gate) = std::thread::spawn(move || {
        let p = pool1.allocate(60 * MIB, ptds).unwrap();
        let gate = b.hold_stream(0, ptds.raw()).unwrap();
        d.memset_async(p, 9, 60 * MIB, ptds).unwrap();
        pool1.deallocate(p, 60 * MIB, ptds).unwrap();
        (p, gate)
    })
    .join()
    .unwrap();
    taken_once_the_work_is_done(&pool, d, p, gate, 9);
}

/// A new thread asks the fixed pool for the 60 MiB block `p`, freed on another thread's held
/// per-thread stream after a memset to `fill`: it gets the block only once `gate` opens, with the
/// memset done.
fn taken_once_the_work_is_done(
    pool: &Arc<PoolMemoryResource>,
    d: Device,
    p: rmm_allocator::backend::DevicePtr,
    gate: rmm_allocator::backend::StreamGate,
    fill: u8,
) {
    let ptds = StreamView::PER_THREAD;
    let done = Arc::new(AtomicBool::new(false));
    let (pool2, done2) = (Arc::clone(pool), Arc::clone(&done));
    let taker = std::thread::spawn(move || {
        let q = pool2.allocate(60 * MIB, ptds).unwrap();
        done2.store(true, Ordering::SeqCst);
        let mut back = vec![0u8; 8];
        d.copy_to_host(&mut back, q).unwrap();
        pool2.deallocate(q, 60 * MIB, ptds).unwrap();
        (q, back)
    });
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !done.load(Ordering::SeqCst),
        "another thread got the block while the freeing thread's stream still used it"
    );
    gate.open();
    let (q, back) = taker.join().unwrap();
    assert_eq!(
        q, p,
        "the other thread gets the block once the work is done"
    );
    assert_eq!(
        back,
        vec![fill; 8],
        "the work queued before the free ran first"
    );
    pool.synchronize().unwrap();
    pool.validate().unwrap();
}

#[test]
fn a_deep_copy_on_another_threads_per_thread_stream_survives_dropping_the_source() {
    // The source goes back on its owner's per-thread stream, which the copying thread cannot
    // name: dropped at once and its block reused there, the queued copy would read new data.
    let (b, d, pool) = fixed_sim_pool(SimMemoryMode::Backed);
    let pool = Arc::new(pool);
    let ptds = StreamView::PER_THREAD;
    let src = rmm_allocator::DeviceBuffer::new_in(MIB, ptds, Arc::clone(&pool)).unwrap();
    d.memset(src.data(), 7, MIB).unwrap();
    let (copy, opener) = std::thread::scope(|s| {
        s.spawn(|| {
            // This thread's stream is held for a while: its copy stays queued meanwhile.
            let gate = b.hold_stream(0, ptds.raw()).unwrap();
            let opener = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                gate.open();
            });
            (src.deep_copy_in(ptds, Arc::clone(&pool)).unwrap(), opener)
        })
        .join()
        .unwrap()
    });
    drop(src);
    let q = pool.allocate(MIB, ptds).unwrap();
    d.memset_async(q, 0xEE, MIB, ptds).unwrap();
    opener.join().unwrap();
    d.synchronize().unwrap();
    let mut back = vec![0u8; 16];
    d.copy_to_host(&mut back, copy.data()).unwrap();
    assert_eq!(
        back,
        vec![7u8; 16],
        "the copy read the source's memory after its reuse"
    );
    pool.deallocate(q, MIB, ptds).unwrap();
}

thread_local! {
    /// Made before the pool's per-thread lane on its thread, so dropped after it.
    static LATE_FREE: std::cell::RefCell<Option<LateFree>> =
        const { std::cell::RefCell::new(None) };
}

/// Frees `p` on its thread's held per-thread stream as that thread exits, once the main thread
/// has taken the lane the exiting thread gave back.
struct LateFree {
    b: &'static SimBackend,
    d: Device,
    pool: Arc<PoolMemoryResource>,
    p: rmm_allocator::backend::DevicePtr,
    gave_back: std::sync::mpsc::Sender<()>,
    lane_taken: std::sync::mpsc::Receiver<()>,
    opened: std::sync::mpsc::Sender<std::thread::JoinHandle<std::time::Instant>>,
}

impl Drop for LateFree {
    fn drop(&mut self) {
        let ptds = StreamView::PER_THREAD;
        // The pool's lane of this thread was dropped before this (made after it).
        self.gave_back.send(()).unwrap();
        self.lane_taken.recv().unwrap();
        let gate = self.b.hold_stream(0, ptds.raw()).unwrap();
        self.d.memset_async(self.p, 9, 60 * MIB, ptds).unwrap();
        let opener = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            // Before opening: what waited for the gate returns after this instant.
            let opening = std::time::Instant::now();
            gate.open();
            opening
        });
        self.opened.send(opener).unwrap();
        self.pool.deallocate(self.p, 60 * MIB, ptds).unwrap();
    }
}

#[test]
fn an_exiting_threads_late_free_does_not_reach_the_lane_another_thread_took() {
    // A thread-local dropped after the thread gave its per-thread lane back frees a block whose
    // work is still queued: the thread that took the lane must not get it before that work.
    let (b, d, pool) = fixed_sim_pool(SimMemoryMode::Backed);
    let pool = Arc::new(pool);
    let ptds = StreamView::PER_THREAD;
    let (lane_tx, lane_rx) = std::sync::mpsc::channel();
    let (gave_back_tx, gave_back_rx) = std::sync::mpsc::channel();
    let (opened_tx, opened_rx) = std::sync::mpsc::channel();
    let (p_tx, p_rx) = std::sync::mpsc::channel();
    let pool1 = Arc::clone(&pool);
    let exiting = std::thread::spawn(move || {
        d.backend().stream_query(0, ptds.raw()).unwrap();
        LATE_FREE.with(|_| {});
        let p = pool1.allocate(60 * MIB, ptds).unwrap();
        p_tx.send(p).unwrap();
        LATE_FREE.with(|l| {
            *l.borrow_mut() = Some(LateFree {
                b,
                d,
                pool: pool1,
                p,
                gave_back: gave_back_tx,
                lane_taken: lane_rx,
                opened: opened_tx,
            })
        });
    });
    let p = p_rx.recv().unwrap();
    // The exiting thread gave its lane back: this thread's first allocation takes it.
    gave_back_rx.recv().unwrap();
    let small = pool.allocate(256, ptds).unwrap();
    lane_tx.send(()).unwrap();
    let opener = opened_rx.recv().unwrap();
    let got = pool.allocate(60 * MIB, ptds);
    let at = std::time::Instant::now();
    let opened = opener.join().unwrap();
    exiting.join().unwrap();
    assert!(
        !(matches!(got, Ok(q) if q == p) && at < opened),
        "got the exiting thread's block {p:?} while its work on its stream was held"
    );
    if let Ok(q) = got {
        pool.deallocate(q, 60 * MIB, ptds).unwrap();
    }
    pool.deallocate(small, 256, ptds).unwrap();
}

#[test]
fn fixed_size_blocks_of_another_threads_per_thread_stream_move_only_after_its_work() {
    // The fixed-size resource, its upstream full, takes another thread's per-thread blocks (that
    // thread alive, or exited and its lane reused) only once that thread's queued work is done.
    use rmm_allocator::resource::FixedSizeMemoryResource;
    let ptds = StreamView::PER_THREAD;
    for exit_first in [false, true] {
        let b = SimBackend::leak(SimConfig {
            devices: 1,
            capacity: 4 * MIB,
            mode: SimMemoryMode::Backed,
        })
        .unwrap();
        let d = Device::on(b, 0).unwrap();
        let fixed = Arc::new(
            FixedSizeMemoryResource::new(Arc::new(CudaMemoryResource::new(d)), MIB, 4).unwrap(),
        );
        let f1 = Arc::clone(&fixed);
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let owner = std::thread::spawn(move || {
            let ps: Vec<_> = (0..4).map(|_| f1.allocate(MIB, ptds).unwrap()).collect();
            let gate = b.hold_stream(0, ptds.raw()).unwrap();
            for &p in &ps {
                d.memset_async(p, 9, MIB, ptds).unwrap();
                f1.deallocate(p, MIB, ptds).unwrap();
            }
            tx.send(gate).unwrap();
            if !exit_first {
                let _ = stop_rx.recv();
            }
        });
        let gate = rx.recv().unwrap();
        if exit_first {
            std::thread::sleep(Duration::from_millis(100));
        }
        let opener = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            // Before opening: what waited for the gate returns after this instant.
            let opening = std::time::Instant::now();
            gate.open();
            opening
        });
        let q = fixed.allocate(MIB, ptds).unwrap();
        let at = std::time::Instant::now();
        let mut back = vec![0u8; 8];
        d.copy_to_host(&mut back, q).unwrap();
        let opened = opener.join().unwrap();
        assert!(
            at >= opened,
            "exit_first={exit_first}: taken before the owner's work"
        );
        assert_eq!(back, vec![9u8; 8], "exit_first={exit_first}");
        fixed.deallocate(q, MIB, ptds).unwrap();
        drop(stop_tx);
        owner.join().unwrap();
    }
}
