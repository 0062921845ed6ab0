//! The pool's per-arena cache of freed blocks: a freed block comes back for the next request
//! of its size on its stream, frees stay checked, and every path that needs the memory back
//! (another thread out of memory, the arena's own heap, trim, synchronize) gets it back.

mod common;

use std::sync::Arc;

use common::{MIB, device};
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::{CudaMemoryResource, PoolMemoryResource};
use rmm_allocator::{Error, Stream, StreamView};

/// A pool of exactly `bytes` that cannot grow.
fn fixed_pool(bytes: usize) -> Arc<PoolMemoryResource> {
    Arc::new(
        PoolMemoryResource::new(
            Arc::new(CudaMemoryResource::new(device())),
            bytes,
            Some(bytes),
        )
        .unwrap(),
    )
}

#[test]
fn a_freed_block_comes_back_for_the_next_request_of_its_size() {
    let pool = fixed_pool(64 * MIB);
    let s = Stream::new(device()).unwrap();
    let p = pool.allocate(MIB, s.view()).unwrap();
    pool.deallocate(p, MIB, s.view()).unwrap();
    let snap = pool.validate().unwrap();
    assert_eq!((snap.in_use, snap.cached), (0, MIB as u64), "{snap:?}");
    assert!(!snap.fully_coalesced, "a cached block is not merged yet");
    // Another size does not take it; the same size does.
    let q = pool.allocate(2 * MIB, s.view()).unwrap();
    assert_ne!(q, p);
    assert_eq!(pool.allocate(MIB, s.view()).unwrap(), p);
    assert_eq!(pool.validate().unwrap().cached, 0);
    pool.deallocate(p, MIB, s.view()).unwrap();
    pool.deallocate(q, 2 * MIB, s.view()).unwrap();
    pool.synchronize().unwrap();
    let snap = pool.validate().unwrap();
    assert_eq!((snap.in_use, snap.cached), (0, 0), "{snap:?}");
    assert!(snap.fully_coalesced, "{snap:?}");
}

#[test]
fn freeing_a_cached_block_again_is_an_error() {
    let pool = fixed_pool(64 * MIB);
    let p = pool.allocate(MIB, StreamView::DEFAULT).unwrap();
    pool.deallocate(p, MIB, StreamView::DEFAULT).unwrap();
    let e = pool.deallocate(p, MIB, StreamView::DEFAULT).unwrap_err();
    assert!(matches!(e, Error::InvalidPointer { .. }), "{e}");
    // Nor may another stream free it.
    let s = Stream::new(device()).unwrap();
    let e = pool.deallocate(p, MIB, s.view()).unwrap_err();
    assert!(matches!(e, Error::InvalidPointer { .. }), "{e}");
    // The block was handed out once and comes back once.
    assert_eq!(pool.allocate(MIB, StreamView::DEFAULT).unwrap(), p);
    assert_ne!(pool.allocate(MIB, StreamView::DEFAULT).unwrap(), p);
}

#[test]
fn a_full_cache_gives_its_oldest_block_back_and_large_blocks_are_not_cached() {
    let pool = fixed_pool(256 * MIB);
    let s = StreamView::DEFAULT;
    let blocks: Vec<_> = (1..=6)
        .map(|i| (pool.allocate(i * MIB, s).unwrap(), i * MIB))
        .collect();
    for &(p, n) in &blocks {
        pool.deallocate(p, n, s).unwrap();
    }
    // Four blocks are kept: the last four freed.
    assert_eq!(
        pool.validate().unwrap().cached,
        (3 + 4 + 5 + 6) as u64 * MIB as u64
    );
    let big = pool.allocate(32 * MIB, s).unwrap();
    pool.deallocate(big, 32 * MIB, s).unwrap();
    assert_eq!(
        pool.validate().unwrap().cached,
        (3 + 4 + 5 + 6) as u64 * MIB as u64,
        "a 32 MiB block goes straight back to the heap"
    );
}

#[test]
fn the_own_heap_takes_cached_blocks_back_when_it_cannot_serve_a_request() {
    // Four 16 MiB blocks fill the pool's 64 MiB; freed, they are all cached. The same thread
    // then asks for 64 MiB on the same stream: merged back, they serve it, and the pool does
    // not grow although it may.
    let pool = Arc::new(
        PoolMemoryResource::new(
            Arc::new(CudaMemoryResource::new(device())),
            64 * MIB,
            Some(1024 * MIB),
        )
        .unwrap(),
    );
    let s = Stream::new(device()).unwrap();
    let blocks: Vec<_> = (0..4)
        .map(|_| pool.allocate(16 * MIB, s.view()).unwrap())
        .collect();
    for p in blocks {
        pool.deallocate(p, 16 * MIB, s.view()).unwrap();
    }
    assert_eq!(pool.validate().unwrap().cached, 64 * MIB as u64);
    let all = pool.allocate(64 * MIB, s.view()).unwrap();
    assert_eq!(pool.pool_size(), 64 * MIB as u64, "the pool grew instead");
    pool.deallocate(all, 64 * MIB, s.view()).unwrap();
    pool.synchronize().unwrap();
    assert!(pool.validate().unwrap().fully_coalesced);
}

/// One thread fills a pool that cannot grow with blocks it frees again (so they sit in its
/// arena's cache); a thread on `other` then needs the whole pool.
fn other_threads_cached_blocks_serve(other_stream: bool) {
    let pool = fixed_pool(64 * MIB);
    let s = Arc::new(Stream::new(device()).unwrap());
    {
        let (pool, s) = (Arc::clone(&pool), Arc::clone(&s));
        std::thread::spawn(move || {
            let blocks: Vec<_> = (0..4)
                .map(|_| pool.allocate(16 * MIB, s.view()).unwrap())
                .collect();
            for p in blocks {
                pool.deallocate(p, 16 * MIB, s.view()).unwrap();
            }
        })
        .join()
        .unwrap();
    }
    let snap = pool.validate().unwrap();
    assert_eq!((snap.in_use, snap.cached), (0, 64 * MIB as u64), "{snap:?}");
    let other = Arc::new(Stream::new(device()).unwrap());
    let stream = if other_stream {
        Arc::clone(&other)
    } else {
        Arc::clone(&s)
    };
    let (pool2, stream2) = (Arc::clone(&pool), Arc::clone(&stream));
    let p = std::thread::spawn(move || pool2.allocate(64 * MIB, stream2.view()))
        .join()
        .unwrap()
        .unwrap_or_else(|e| panic!("the other thread's cached blocks were not reclaimed: {e}"));
    pool.deallocate(p, 64 * MIB, stream.view()).unwrap();
    stream.synchronize().unwrap();
    pool.synchronize().unwrap();
    let snap = pool.validate().unwrap();
    assert_eq!(
        (snap.in_use, snap.cached, snap.pending),
        (0, 0, 0),
        "{snap:?}"
    );
}

#[test]
fn an_allocation_on_another_stream_gets_memory_from_another_threads_cache() {
    other_threads_cached_blocks_serve(true);
}

#[test]
fn an_allocation_on_the_same_stream_gets_memory_from_another_threads_cache() {
    other_threads_cached_blocks_serve(false);
}

#[test]
fn a_small_request_takes_cached_blocks_back_before_the_pool_grows() {
    // Sixteen 1 MiB blocks fill the pool; four are freed (cached in the small heap). A 4 KiB
    // request needs a new bin slab: the cached blocks serve it, the pool does not grow.
    let pool = PoolMemoryResource::new(
        Arc::new(CudaMemoryResource::new(device())),
        16 * MIB,
        Some(1024 * MIB),
    )
    .unwrap();
    let s = StreamView::DEFAULT;
    let blocks: Vec<_> = (0..16).map(|_| pool.allocate(MIB, s).unwrap()).collect();
    for &p in &blocks[..4] {
        pool.deallocate(p, MIB, s).unwrap();
    }
    assert_eq!(pool.validate().unwrap().cached, 4 * MIB as u64);
    let small = pool.allocate(4096, s).unwrap();
    assert_eq!(pool.pool_size(), 16 * MIB as u64, "the pool grew instead");
    pool.deallocate(small, 4096, s).unwrap();
    for &p in &blocks[4..] {
        pool.deallocate(p, MIB, s).unwrap();
    }
}

#[test]
fn trim_gives_cached_blocks_back_upstream() {
    let pool = PoolMemoryResource::new(
        Arc::new(CudaMemoryResource::new(device())),
        0,
        Some(256 * MIB),
    )
    .unwrap();
    let p = pool.allocate(8 * MIB, StreamView::DEFAULT).unwrap();
    pool.deallocate(p, 8 * MIB, StreamView::DEFAULT).unwrap();
    assert_eq!(pool.validate().unwrap().cached, 8 * MIB as u64);
    assert!(pool.pool_size() > 0);
    pool.release().unwrap();
    assert_eq!(pool.pool_size(), 0, "cached memory stayed in the pool");
}
