//! The pool takes back what other streams' arenas hold idle before it grows, gathers free
//! pieces scattered over arenas when it cannot grow, and explains an out-of-memory error with
//! every figure a person needs to act on it.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::{GIB, MIB};
use rmm_allocator::backend::DevicePtr;
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::{CudaMemoryResource, PoolMemoryResource, VirtualMemory};
use rmm_allocator::{Device, Error, Stream, StreamView};

use common::unbacked_sim as sim;

fn pool(d: Device, initial: usize, maximum: Option<usize>) -> PoolMemoryResource {
    let mut b = PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
        .initial_size(initial as u64);
    if let Some(m) = maximum {
        b = b.maximum_size(m as u64);
    }
    b.build().unwrap()
}

#[test]
fn memory_idle_on_other_streams_serves_a_request_before_the_pool_grows() {
    let (b, d) = sim(8 * GIB);
    // Room to grow: the old pool grew here instead of looking at the other streams.
    let pool = Arc::new(pool(d, 256 * MIB, None));
    let a = Stream::new(d).unwrap();
    let c = Stream::new(d).unwrap();
    let blocks: Vec<DevicePtr> = (0..30)
        .map(|_| pool.allocate(8 * MIB, a.view()).unwrap())
        .collect();
    // Work queued on A before its frees, held back: the memory is A's until it is done.
    let gate = b.hold_stream(0, a.view().raw()).unwrap();
    d.memset_async(blocks[0], 1, 8 * MIB, a.view()).unwrap();
    // 28 blocks freed on A (four of them stay whole in A's block cache), one on stream C
    // (waits for C's event), one left live... then freed too, so all of A's memory is idle.
    for &p in &blocks[..29] {
        pool.deallocate(p, 8 * MIB, a.view()).unwrap();
    }
    pool.deallocate(blocks[29], 8 * MIB, c.view()).unwrap();
    let before = pool.validate().unwrap();
    assert_eq!(before.pool_size, 256 * MIB as u64);
    assert!(before.cached > 0, "A's cache holds blocks: {before:?}");
    assert!(before.pending > 0, "a block waits for stream C: {before:?}");

    // 200 MiB on B: the pool's free space has 16 MiB; A's arena holds the rest, idle.
    let bstream = Stream::new(d).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let (pool2, done2, bview) = (Arc::clone(&pool), Arc::clone(&done), bstream.view());
    let taker = std::thread::spawn(move || {
        let q = pool2.allocate(200 * MIB, bview).unwrap();
        done2.store(true, Ordering::SeqCst);
        q
    });
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !done.load(Ordering::SeqCst),
        "B got A's memory while A's queued work was pending"
    );
    gate.open();
    let q = taker.join().unwrap();
    assert!(
        a.is_idle().unwrap(),
        "A's work completed before B got its memory"
    );
    assert_eq!(
        pool.pool_size(),
        256 * MIB as u64,
        "the pool grew although A's idle memory was enough"
    );
    let s = pool.validate().unwrap();
    assert_eq!(s.in_use, 200 * MIB as u64);
    assert_eq!((s.cached, s.pending), (0, 0), "{s:?}");
    // A still works, from what is left, without growing either.
    let p = pool.allocate(40 * MIB, a.view()).unwrap();
    assert_eq!(pool.pool_size(), 256 * MIB as u64);
    pool.deallocate(p, 40 * MIB, a.view()).unwrap();
    pool.deallocate(q, 200 * MIB, bview).unwrap();
    pool.validate().unwrap();
}

#[test]
fn memory_of_an_idle_stream_serves_a_request_without_waiting_for_a_busy_one() {
    let (b, d) = sim(8 * GIB);
    let pool = Arc::new(pool(d, 256 * MIB, None));
    let idle = Stream::new(d).unwrap();
    let busy = Stream::new(d).unwrap();
    // Each stream takes half of the pool in 64 MiB regions and frees it: all of it idle in
    // their arenas, but the busy stream still has work queued before its frees.
    let take_half = |s: &Stream| -> Vec<DevicePtr> {
        (0..2)
            .map(|_| pool.allocate(64 * MIB, s.view()).unwrap())
            .collect()
    };
    let mine = take_half(&idle);
    let theirs = take_half(&busy);
    let gate = b.hold_stream(0, busy.view().raw()).unwrap();
    d.memset_async(theirs[0], 1, 64 * MIB, busy.view()).unwrap();
    for (p, s) in mine
        .iter()
        .map(|p| (p, &idle))
        .chain(theirs.iter().map(|p| (p, &busy)))
    {
        pool.deallocate(*p, 64 * MIB, s.view()).unwrap();
    }
    // 100 MiB on a third stream: the idle stream's two regions, side by side, are enough.
    let third = Stream::new(d).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (pool2, view) = (Arc::clone(&pool), third.view());
    let taker = std::thread::spawn(move || {
        let q = pool2.allocate(100 * MIB, view).unwrap();
        let _ = tx.send(());
        q
    });
    let served = rx.recv_timeout(Duration::from_secs(5)).is_ok();
    let busy_was_busy = !busy.is_idle().unwrap();
    gate.open();
    let q = taker.join().unwrap();
    assert!(
        served && busy_was_busy,
        "the request waited for the busy stream although an idle one had enough"
    );
    assert_eq!(pool.pool_size(), 256 * MIB as u64, "the pool grew");
    assert_eq!(q, mine[0], "served from the idle stream's regions");
    pool.deallocate(q, 100 * MIB, view).unwrap();
    pool.validate().unwrap();
}

#[test]
fn a_pool_grows_by_the_need_rounded_to_its_growth_step_not_by_its_size() {
    let (_, d) = sim(64 * GIB);
    // Upstream chunks: each growth a chunk of its own, whose tail a 100 MiB block may not
    // fit (mapped chunks side by side waste no tail: see pool_vmm.rs).
    let pool = PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
        .initial_size(0)
        .virtual_memory(VirtualMemory::Off)
        .build()
        .unwrap();
    let s = Stream::new(d).unwrap();
    let first = pool.allocate(3 * MIB, s.view()).unwrap();
    assert_eq!(pool.pool_size(), GIB as u64, "one growth step");
    // 3 GiB in 100 MiB blocks: the pool grows one step at a time and never holds more than
    // a step beyond what is in use, give or take the first arena's region and each chunk's
    // tail too short for 100 MiB; doubling would reach 5 GiB.
    let mut live = vec![(first, 3 * MIB)];
    for _ in 0..30 {
        live.push((pool.allocate(100 * MIB, s.view()).unwrap(), 100 * MIB));
        let in_use: usize = live.iter().map(|(_, n)| n).sum();
        let size = pool.pool_size();
        assert_eq!(size % GIB as u64, 0, "grown in whole steps: {size}");
        assert!(
            size < (in_use + GIB + 256 * MIB) as u64,
            "{size} B held for {in_use} B in use"
        );
    }
    assert_eq!(pool.pool_size(), 4 * GIB as u64);
    // A request above the step: the need rounded up to the step (3 GiB), not the pool's size.
    let before = pool.pool_size();
    live.push((pool.allocate(5 * GIB / 2, s.view()).unwrap(), 5 * GIB / 2));
    assert_eq!(pool.pool_size() - before, 3 * GIB as u64);
    for (p, n) in live {
        pool.deallocate(p, n, s.view()).unwrap();
    }
    pool.validate().unwrap();
}

#[test]
fn a_smaller_growth_step_keeps_the_pool_closer_to_its_use() {
    let (_, d) = sim(8 * GIB);
    let pool = PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
        .initial_size(0)
        .growth(256 * MIB as u64)
        .build()
        .unwrap();
    assert_eq!(pool.growth(), 256 * MIB as u64);
    let s = Stream::new(d).unwrap();
    let p = pool.allocate(300 * MIB, s.view()).unwrap();
    assert_eq!(pool.pool_size(), 512 * MIB as u64);
    pool.deallocate(p, 300 * MIB, s.view()).unwrap();
    let e = PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
        .growth(0)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("pool.growth"), "{e}");
}

#[test]
fn a_pool_at_its_maximum_serves_a_request_from_free_pieces_scattered_over_streams() {
    let (_, d) = sim(GIB);
    let pool = pool(d, 256 * MIB, Some(256 * MIB));
    let streams: Vec<Stream> = (0..5).map(|_| Stream::new(d).unwrap()).collect();
    let v: Vec<_> = streams.iter().map(Stream::view).collect();
    // Each of the first four streams gets a 64 MiB region, side by side:
    // S0 [live 24 | 40]  S1 [40 | live 24]  S2 [live 64]  S3 [live 64]. Every block is above
    // 16 MiB, so all of a stream's come from the arena its threads share, whatever the
    // thread's own lane (tests run as threads of one process take different lanes).
    let s0_keep = pool.allocate(24 * MIB, v[0]).unwrap();
    let s0_free = pool.allocate(40 * MIB, v[0]).unwrap();
    let s1_free = pool.allocate(40 * MIB, v[1]).unwrap();
    let s1_keep = pool.allocate(24 * MIB, v[1]).unwrap();
    let s2 = pool.allocate(64 * MIB, v[2]).unwrap();
    let s3 = pool.allocate(64 * MIB, v[3]).unwrap();
    assert_eq!(
        s1_free.addr(),
        s0_free.addr() + 40 * MIB as u64,
        "neighbours"
    );
    pool.deallocate(s0_free, 40 * MIB, v[0]).unwrap();
    pool.deallocate(s1_free, 40 * MIB, v[1]).unwrap();
    let before = pool.validate().unwrap();
    assert_eq!(before.free, 80 * MIB as u64);
    assert_eq!(before.largest_free, 40 * MIB as u64, "no block fits 80 MiB");
    assert_eq!(before.fragmentation(), 0.5);

    // 80 MiB on S4: the pool cannot grow, no region is wholly free and no block is large
    // enough; the two 40 MiB pieces of S0 and S1 lie side by side.
    let q = pool.allocate(80 * MIB, v[4]).unwrap();
    assert_eq!(q, s0_free, "served from the merged pieces");
    assert_eq!(pool.pool_size(), 256 * MIB as u64);
    pool.validate().unwrap();
    for (p, n, s) in [
        (q, 80 * MIB, v[4]),
        (s0_keep, 24 * MIB, v[0]),
        (s1_keep, 24 * MIB, v[1]),
        (s2, 64 * MIB, v[2]),
        (s3, 64 * MIB, v[3]),
    ] {
        pool.deallocate(p, n, s).unwrap();
    }
    pool.synchronize().unwrap();
    let s = pool.validate().unwrap();
    assert_eq!(s.in_use, 0);
    assert_eq!(s.free, 256 * MIB as u64);
}

#[test]
fn out_of_memory_at_the_maximum_names_every_figure_and_what_to_try() {
    let (_, d) = sim(GIB);
    let pool = pool(d, 256 * MIB, Some(256 * MIB));
    let small = Stream::new(d).unwrap();
    let large = Stream::new(d).unwrap();
    let other = Stream::new(d).unwrap();
    // Small blocks on one stream, half freed: their slab stays, partly free.
    let smalls: Vec<DevicePtr> = (0..100)
        .map(|_| pool.allocate(4096, small.view()).unwrap())
        .collect();
    for &p in smalls.iter().step_by(2) {
        pool.deallocate(p, 4096, small.view()).unwrap();
    }
    // 32 MiB blocks on another until the pool is full, every other one freed.
    let mut bigs = Vec::new();
    while let Ok(p) = pool.allocate(32 * MIB, large.view()) {
        bigs.push(p);
    }
    assert!(bigs.len() >= 6, "{} blocks", bigs.len());
    let mut live_big = 0;
    for (i, &p) in bigs.iter().enumerate() {
        if i % 2 == 0 {
            pool.deallocate(p, 32 * MIB, large.view()).unwrap();
        } else {
            live_big += 1;
        }
    }
    let requested = 100 * MIB;
    let e = pool.allocate(requested, other.view()).unwrap_err();
    let snap = pool.validate().unwrap();
    let Error::OutOfMemory {
        requested: r,
        resource,
        pool: Some(u),
        ..
    } = &e
    else {
        panic!("expected an out-of-memory error with pool figures, got {e:?}");
    };
    assert_eq!(*r, requested);
    assert_eq!(*resource, "PoolMemoryResource");
    assert_eq!(u.pool_size, 256 * MIB);
    assert_eq!(u.maximum_size, Some(256 * MIB));
    assert_eq!(u.in_use as u64, snap.in_use);
    assert!(u.in_use >= live_big * 32 * MIB + 50 * 4096, "{u:?}");
    assert_eq!(u.free as u64, snap.free);
    assert_eq!(u.free + u.in_use + u.pending, u.pool_size, "{u:?}");
    assert_eq!(u.largest_free as u64, snap.largest_free);
    assert!(
        u.largest_free < requested && u.free >= requested,
        "free but scattered: {u:?}"
    );
    assert_eq!(u.cached as u64, snap.cached);
    assert!(u.unassigned <= u.free);
    assert_eq!(u.arenas, 3, "one arena per stream: {u:?}");
    let listed = u
        .streams
        .iter()
        .find(|s| s.stream == small.view().raw())
        .unwrap_or_else(|| panic!("the small stream's free slots are listed: {u:?}"));
    assert!(
        listed.free >= 50 * 4096 && listed.in_use >= 50 * 4096,
        "{listed:?}"
    );
    assert!(u.fragmentation() > 0.5, "{u:?}");
    let msg = e.to_string();
    for part in [
        "could not allocate 100.00 MiB (104857600 bytes)",
        "pool holds 256.00 MiB of maximum 256.00 MiB",
        "in use",
        "free (largest free block",
        "fragmentation",
        "unassigned",
        "cached",
        "waiting for other streams",
        &format!("free per stream: stream {:#x}", small.view().raw()),
        "fewer streams",
        "raise pool.maximum_size",
    ] {
        assert!(msg.contains(part), "{part:?} missing from: {msg}");
    }
    for (i, &p) in bigs.iter().enumerate() {
        if i % 2 == 1 {
            pool.deallocate(p, 32 * MIB, large.view()).unwrap();
        }
    }
    for &p in smalls.iter().skip(1).step_by(2) {
        pool.deallocate(p, 4096, small.view()).unwrap();
    }
    pool.validate().unwrap();
}

#[test]
fn out_of_memory_below_the_maximum_points_at_the_device_and_trim() {
    let (b, d) = sim(8 * GIB);
    let pool = pool(d, 64 * MIB, Some(4 * GIB));
    let s = Stream::new(d).unwrap();
    // A live block keeps the first chunk (the pool gives wholly free chunks back when it
    // cannot grow, to try for one large range).
    let keep = pool.allocate(10 * MIB, s.view()).unwrap();
    b.fail_allocations_above(0, 100 * MIB).unwrap();
    let e = pool.allocate(200 * MIB, s.view()).unwrap_err();
    b.clear_faults(0).unwrap();
    assert!(e.is_out_of_memory(), "{e}");
    let msg = e.to_string();
    for part in [
        "pool holds 64.00 MiB of maximum 4.00 GiB",
        "could not give the pool 200.00 MiB more",
        "trim() idle pools",
        "pool.maximum_size",
    ] {
        assert!(msg.contains(part), "{part:?} missing from: {msg}");
    }
    assert!(!msg.contains("no block is large enough"), "{msg}");
    // With the device willing again, the same request succeeds.
    let p = pool.allocate(200 * MIB, s.view()).unwrap();
    pool.deallocate(p, 200 * MIB, s.view()).unwrap();
    pool.deallocate(keep, 10 * MIB, s.view()).unwrap();
}

/// An upstream whose `n`-th free fails (the chunk stays the upstream's).
#[derive(Debug)]
struct FailingFree {
    inner: CudaMemoryResource,
    frees: AtomicUsize,
    fail_at: usize,
}

impl DeviceMemoryResource for FailingFree {
    fn allocate(&self, bytes: usize, stream: StreamView) -> rmm_allocator::Result<DevicePtr> {
        self.inner.allocate(bytes, stream)
    }
    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        stream: StreamView,
    ) -> rmm_allocator::Result<()> {
        if self.frees.fetch_add(1, Ordering::SeqCst) + 1 == self.fail_at {
            return Err(rmm_allocator::Error::invalid_argument(
                "ptr",
                "test",
                "a free that works",
            ));
        }
        self.inner.deallocate(ptr, bytes, stream)
    }
    fn device(&self) -> Device {
        self.inner.device()
    }
    fn name(&self) -> &'static str {
        "FailingFree"
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[test]
fn a_chunk_that_cannot_go_back_leaves_the_others_in_the_pool() {
    let (_, d) = sim(4 * GIB);
    let upstream = Arc::new(FailingFree {
        inner: CudaMemoryResource::new(d),
        frees: AtomicUsize::new(0),
        fail_at: 2,
    });
    let p = PoolMemoryResource::builder(upstream)
        .initial_size(0)
        .growth(64 * MIB as u64)
        .build()
        .unwrap();
    let s = StreamView::DEFAULT;
    // Three chunks of 64 MiB, each holding one block, then all free.
    let blocks: Vec<DevicePtr> = (0..3).map(|_| p.allocate(64 * MIB, s).unwrap()).collect();
    assert_eq!(p.validate().unwrap().chunks, 3);
    for b in blocks {
        p.deallocate(b, 64 * MIB, s).unwrap();
    }
    // The second of three fails to go back: the first went, the third is the pool's still.
    assert!(p.trim(0).is_err());
    assert_eq!(
        p.pool_size(),
        64 * MIB as u64,
        "the chunk not tried yet stays"
    );
    let snap = p.validate().unwrap();
    assert_eq!((snap.chunks, snap.in_use), (1, 0));
    let again = p.allocate(64 * MIB, s).unwrap();
    assert_eq!(p.pool_size(), 64 * MIB as u64, "served from it, no growth");
    p.deallocate(again, 64 * MIB, s).unwrap();
}
