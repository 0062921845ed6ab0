//! 16 threads, each on its own stream (or all on one shared stream), allocate and free at
//! random, hand some blocks to the next thread to free on its stream, and check that no block
//! is ever handed out twice or lost, and that no block's data is overwritten by another owner.
//! With a few sizes only, most requests are served from the arenas' caches of freed blocks.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};

use common::{MIB, device};
use crossbeam_channel::bounded;
use rmm_allocator::Stream;
use rmm_allocator::backend::DevicePtr;
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::SharedResource;
use rmm_allocator::resource::{BinningMemoryResource, CudaMemoryResource, PoolMemoryResource};

const THREADS: usize = 16;
/// Blocks in transit to one thread at most. Bounded so that a thread starved of CPU does not
/// collect an unbounded amount of live memory in its inbox: at most 16 × (64 live + 16 in
/// transit) blocks of ≤ 2 MiB, 2.5 GiB, are live at once, whatever the scheduling.
const IN_TRANSIT: usize = 16;

/// The sizes of the few-sizes runs: a binned size, two small-heap sizes, a large-heap size.
const FEW_SIZES: [usize; 4] = [200, 70_000, MIB, 3 * MIB + 100];

fn stress(mr: SharedResource, steps: usize, shared: bool, few_sizes: bool) {
    let d = device();
    // With `shared`, every thread works on this one stream (as Dask's threads on one stream).
    let one = Arc::new(Stream::new(d).unwrap());
    let handed_out = Arc::new(Mutex::new(HashSet::<u64>::new()));
    let channels: Vec<_> = (0..THREADS)
        .map(|_| bounded::<(DevicePtr, usize)>(IN_TRANSIT))
        .collect();
    let barrier = Arc::new(Barrier::new(THREADS));
    let running = Arc::new(AtomicUsize::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let mr = Arc::clone(&mr);
            let handed_out = Arc::clone(&handed_out);
            let barrier = Arc::clone(&barrier);
            let running = Arc::clone(&running);
            let inbox = channels[t].1.clone();
            let one = Arc::clone(&one);
            let next = channels[(t + 1) % THREADS].0.clone();
            std::thread::spawn(move || {
                // Counts this thread out even if it panics, so the others stop waiting for it
                // and the join below reports the panic instead of the test hanging.
                struct Done(Arc<AtomicUsize>);
                impl Drop for Done {
                    fn drop(&mut self) {
                        self.0.fetch_sub(1, Ordering::SeqCst);
                    }
                }
                let done = Done(Arc::clone(&running));
                let own = Stream::new(d).unwrap();
                let stream = if shared { &*one } else { &own };
                let mut x = (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let mut live: Vec<(DevicePtr, usize, u64)> = Vec::new();
                barrier.wait();
                for step in 0..steps {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if live.len() < 64 && (!x.is_multiple_of(3) || live.is_empty()) {
                        let size = if few_sizes {
                            FEW_SIZES[(x >> 20) as usize % FEW_SIZES.len()]
                        } else {
                            16 + (x >> 20) as usize % (2 * MIB)
                        };
                        let p = mr.allocate(size, stream.view()).unwrap();
                        assert!(
                            handed_out.lock().unwrap().insert(p.addr()),
                            "{p} handed out twice"
                        );
                        let tag = (t as u64) << 32 | step as u64;
                        if step % 16 == 0 {
                            d.copy_to_device(p, &tag.to_le_bytes()).unwrap();
                        }
                        live.push((p, size, tag));
                    } else {
                        let (p, size, tag) = live.swap_remove((x >> 8) as usize % live.len());
                        if (tag as u32).is_multiple_of(16) {
                            let mut back = [0u8; 8];
                            d.copy_to_host(&mut back, p).unwrap();
                            assert_eq!(
                                u64::from_le_bytes(back),
                                tag,
                                "{p} was overwritten by another owner"
                            );
                        }
                        assert!(handed_out.lock().unwrap().remove(&p.addr()), "{p} lost");
                        let keep = if x.is_multiple_of(5) {
                            next.try_send((p, size)).err().map(|e| e.into_inner())
                        } else {
                            Some((p, size))
                        };
                        if let Some((p, size)) = keep {
                            mr.deallocate(p, size, stream.view()).unwrap();
                        }
                    }
                    while let Ok((p, size)) = inbox.try_recv() {
                        mr.deallocate(p, size, stream.view()).unwrap();
                    }
                }
                for (p, size, _) in live {
                    assert!(handed_out.lock().unwrap().remove(&p.addr()));
                    mr.deallocate(p, size, stream.view()).unwrap();
                }
                // Keep freeing what the previous thread hands over until every thread is done.
                drop(done);
                while running.load(Ordering::SeqCst) > 0 {
                    while let Ok((p, size)) = inbox.try_recv() {
                        mr.deallocate(p, size, stream.view()).unwrap();
                    }
                    std::thread::yield_now();
                }
                while let Ok((p, size)) = inbox.try_recv() {
                    mr.deallocate(p, size, stream.view()).unwrap();
                }
                stream.synchronize().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(handed_out.lock().unwrap().is_empty());
}

/// A pool of 512 MiB that may grow to 4 GiB.
fn pool_512m_to_4g() -> Arc<PoolMemoryResource> {
    Arc::new(
        PoolMemoryResource::new(
            Arc::new(CudaMemoryResource::new(device())),
            512 * MIB,
            Some(4096 * MIB),
        )
        .unwrap(),
    )
}

/// After a stress run: nothing in use, cached or pending, and every region one free block.
fn assert_all_back(pool: &PoolMemoryResource) {
    pool.synchronize().unwrap();
    let snap = pool.validate().unwrap();
    assert_eq!(
        (snap.in_use, snap.cached, snap.pending),
        (0, 0, 0),
        "{snap:?}"
    );
    assert!(snap.fully_coalesced, "{snap:?}");
}

#[test]
fn sixteen_threads_on_the_pool_lose_and_duplicate_nothing() {
    let pool = pool_512m_to_4g();
    stress(Arc::clone(&pool) as SharedResource, 20_000, false, false);
    assert_all_back(&pool);
}

#[test]
fn sixteen_threads_on_an_empty_pool_growing_in_small_steps() {
    // Every thread's arena starts empty and the pool grows 64 MiB at a time: the grant path
    // (reclaim from other arenas, growth) runs concurrently with the others' fast paths.
    let pool = Arc::new(
        PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(device())))
            .initial_size(0)
            .maximum_size((4096 * MIB) as u64)
            .growth(64 * MIB as u64)
            .build()
            .unwrap(),
    );
    for shared in [false, true] {
        stress(Arc::clone(&pool) as SharedResource, 20_000, shared, false);
        assert_all_back(&pool);
    }
}

#[test]
fn sixteen_threads_on_binning_over_the_pool() {
    let pool = pool_512m_to_4g();
    let bins = Arc::new(
        BinningMemoryResource::with_bins(Arc::clone(&pool) as SharedResource, 10, 18).unwrap(),
    );
    stress(bins, 10_000, false, false);
}

#[test]
fn sixteen_threads_sharing_one_stream_lose_and_duplicate_nothing() {
    let pool = pool_512m_to_4g();
    stress(Arc::clone(&pool) as SharedResource, 20_000, true, false);
    assert_all_back(&pool);
}

#[test]
fn sixteen_threads_with_a_few_sizes_through_the_block_caches() {
    for shared in [false, true] {
        let pool = pool_512m_to_4g();
        stress(Arc::clone(&pool) as SharedResource, 20_000, shared, true);
        assert_all_back(&pool);
    }
}

#[test]
fn memory_one_thread_freed_on_a_shared_stream_serves_another_when_the_pool_is_full() {
    let pool = Arc::new(
        PoolMemoryResource::new(
            Arc::new(CudaMemoryResource::new(device())),
            256 * MIB,
            Some(256 * MIB),
        )
        .unwrap(),
    );
    let s = Arc::new(Stream::new(device()).unwrap());
    // One thread takes most of the pool into its arena, in pieces, and frees it all: the free
    // memory stays with that thread's arena.
    {
        let (pool, s) = (Arc::clone(&pool), Arc::clone(&s));
        std::thread::spawn(move || {
            let blocks: Vec<_> = (0..60)
                .map(|_| pool.allocate(4 * MIB, s.view()).unwrap())
                .collect();
            for p in blocks {
                pool.deallocate(p, 4 * MIB, s.view()).unwrap();
            }
        })
        .join()
        .unwrap();
    }
    // Another thread on the same stream needs one block of 200 MiB: the pool cannot grow, so
    // only the first thread's freed memory can serve it.
    let (pool2, s2) = (Arc::clone(&pool), Arc::clone(&s));
    let p = std::thread::spawn(move || pool2.allocate(200 * MIB, s2.view()))
        .join()
        .unwrap()
        .unwrap();
    pool.deallocate(p, 200 * MIB, s.view()).unwrap();
    s.synchronize().unwrap();
    assert_eq!(pool.pool_size(), 256 * MIB as u64);
}

#[test]
fn threads_destroy_their_streams_while_others_reclaim_from_their_arenas() {
    // Threads of different lengths each destroy their stream as soon as they finish, while
    // the others keep asking the pool for memory it must reclaim from arenas (the pool is
    // small and grows in small steps): the reclaim must never touch a destroyed stream's
    // handle (on a GPU, a SIGSEGV in the driver).
    let pool = Arc::new(
        PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(device())))
            .initial_size(0)
            .maximum_size((2048 * MIB) as u64)
            .growth(16 * MIB as u64)
            .build()
            .unwrap(),
    );
    for round in 0..3u64 {
        let barrier = Arc::new(Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (pool, barrier) = (Arc::clone(&pool), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    let stream = Stream::new(device()).unwrap();
                    barrier.wait();
                    let mut x = (round * 97 + t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    let mut live = Vec::new();
                    for _ in 0..200 * (t + 1) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        if live.len() < 8 {
                            let size = MIB + (x >> 20) as usize % (8 * MIB);
                            live.push((pool.allocate(size, stream.view()).unwrap(), size));
                        } else {
                            let (p, size) = live.swap_remove((x >> 8) as usize % live.len());
                            pool.deallocate(p, size, stream.view()).unwrap();
                        }
                    }
                    for (p, size) in live {
                        pool.deallocate(p, size, stream.view()).unwrap();
                    }
                    // `stream` is destroyed here, while longer threads still run.
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_all_back(&pool);
    }
}
