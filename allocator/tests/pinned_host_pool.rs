//! The pinned host pool: pinned once, slices carved and given back, never overlapping, full
//! is an error, data round-trips through the device.

mod common;

use common::{MIB, device, pattern};
use rmm_allocator::backend::{SimBackend, SimConfig, SimMemoryMode};
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::{PINNED_ALIGNMENT, PinnedHostPool};
use rmm_allocator::{Error, StreamView};

#[test]
fn the_pool_pins_once_and_gives_slices_back_merged() {
    let pool = PinnedHostPool::new(64 * MIB).unwrap();
    assert!(pool.capacity() >= 64 * MIB);
    assert_eq!(pool.max_slice(), pool.capacity(), "one chunk below 256 MiB");
    let quarter = pool.capacity() / 4;
    let mut slices: Vec<_> = (0..4).map(|_| pool.allocate(quarter).unwrap()).collect();
    assert_eq!(pool.used(), pool.capacity());
    let err = pool.allocate(1).unwrap_err();
    assert!(
        matches!(err, Error::HostOutOfMemory { requested: 256, .. }),
        "{err}"
    );
    // Distinct contents in each: no two slices overlap.
    for (i, s) in slices.iter_mut().enumerate() {
        s.as_mut_slice()
            .copy_from_slice(&pattern(quarter, i as u64 + 1));
    }
    for (i, s) in slices.iter().enumerate() {
        assert!(
            s.as_slice() == pattern(quarter, i as u64 + 1).as_slice(),
            "slice {i}"
        );
    }
    // Free the two middle ones: they merge into one range of half the pool.
    let last = slices.pop().unwrap();
    let third = slices.pop().unwrap();
    let second = slices.pop().unwrap();
    drop(second);
    drop(third);
    let half = pool.allocate(2 * quarter).unwrap();
    assert_eq!(half.len(), 2 * quarter);
    assert_eq!(pool.used(), pool.capacity());
    assert_eq!(pool.peak(), pool.capacity());
    drop((half, last, slices));
    assert_eq!(pool.used(), 0);
    assert_eq!(pool.largest_free(), pool.capacity());
}

#[test]
fn sizes_round_up_to_the_alignment() {
    let pool = PinnedHostPool::new(4 * MIB).unwrap();
    let a = pool.allocate(1).unwrap();
    let b = pool.allocate(300).unwrap();
    assert_eq!(a.len(), PINNED_ALIGNMENT);
    assert_eq!(b.len(), 2 * PINNED_ALIGNMENT);
    assert_eq!(b.as_ptr() as usize % PINNED_ALIGNMENT, 0);
}

#[test]
fn data_round_trips_between_a_slice_and_the_device() {
    let pool = PinnedHostPool::new(32 * MIB).unwrap();
    let d = device();
    let mr = rmm_allocator::resource::CudaMemoryResource::new(d);
    let n = 8 * MIB;
    let mut slice = pool.allocate(n).unwrap();
    let data = pattern(n, 42);
    slice.as_mut_slice().copy_from_slice(&data);
    let p = mr.allocate(n, StreamView::DEFAULT).unwrap();
    d.copy_to_device(p, slice.as_slice()).unwrap();
    let mut back = pool.allocate(n).unwrap();
    d.copy_to_host(back.as_mut_slice(), p).unwrap();
    assert!(back.as_slice() == data.as_slice());
    mr.deallocate(p, n, StreamView::DEFAULT).unwrap();
}

#[test]
fn eight_threads_share_the_pool_without_overlap() {
    let pool = PinnedHostPool::new(64 * MIB).unwrap();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let pool = pool.clone();
            s.spawn(move || {
                let mut x = t + 1;
                let mut live = Vec::new();
                for step in 0..2000u64 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if live.len() < 8 && x % 3 != 0 {
                        let len = 256 + (x as usize % (512 * 1024));
                        if let Ok(mut s) = pool.allocate(len) {
                            let tag = (t << 32 | step) as u8;
                            s.as_mut_slice().fill(tag);
                            live.push((s, tag));
                        }
                    } else if !live.is_empty() {
                        let (s, tag) = live.swap_remove(x as usize % live.len());
                        assert!(s.as_slice().iter().all(|&b| b == tag), "overwritten");
                    }
                }
            });
        }
    });
    assert_eq!(pool.used(), 0);
    assert_eq!(pool.largest_free(), pool.capacity());
}

#[test]
fn the_region_is_registered_while_the_pool_lives_and_released_after() {
    let sim = backed_sim();
    let pool = PinnedHostPool::on(sim, 600 * MIB).unwrap();
    assert_eq!(sim.pinned_host_bytes(), pool.capacity());
    // Several registered chunks of at least 256 MiB (fewer on a machine with fewer cores).
    assert!(pool.max_slice() >= 256 * MIB);
    let slice = pool.allocate(pool.max_slice()).unwrap();
    assert!(
        pool.allocate(pool.max_slice() + PINNED_ALIGNMENT).is_err(),
        "no slice crosses a chunk"
    );
    drop(pool);
    // A live slice keeps the region.
    assert!(sim.pinned_host_bytes() > 0);
    drop(slice);
    assert_eq!(sim.pinned_host_bytes(), 0);
}

#[test]
fn a_growable_pool_pins_as_needed_and_stops_at_its_maximum() {
    let sim = backed_sim();
    let pool = PinnedHostPool::growable(sim, Some(160 * MIB));
    assert!(pool.is_growable());
    assert_eq!((pool.capacity(), sim.pinned_host_bytes()), (0, 0));
    let a = pool.allocate(3 * MIB).unwrap();
    assert_eq!(pool.capacity(), 32 * MIB, "the first step is the smallest");
    // A request larger than any chunk so far gets a chunk of its own, in one slice.
    let mut b = pool.allocate(100 * MIB).unwrap();
    assert_eq!(b.len(), 100 * MIB);
    b.as_mut_slice()[100 * MIB - 1] = 7;
    assert_eq!(pool.capacity(), 132 * MIB);
    assert_eq!(sim.pinned_host_bytes(), pool.capacity());
    // Growing again would pass the maximum.
    let err = pool.allocate(40 * MIB).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    // What is free is still handed out.
    let c = pool.allocate(20 * MIB).unwrap();
    drop((a, b, c));
    assert_eq!(pool.used(), 0);
}

/// A simulated device of 1 GiB with backed memory, for a pool's pinned host bytes.
fn backed_sim() -> &'static SimBackend {
    SimBackend::leak(SimConfig {
        devices: 1,
        capacity: 1 << 30,
        mode: SimMemoryMode::Backed,
    })
    .unwrap()
}

/// Waits (up to 10 s) until `pool` is not pinning ahead; its capacity then.
fn settled(pool: &PinnedHostPool) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while pool.is_pinning_ahead() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert!(!pool.is_pinning_ahead(), "still pinning after 10 s");
    pool.capacity()
}

#[test]
fn a_growable_pool_keeps_memory_pinned_ahead_of_demand_within_its_maximum() {
    let sim = backed_sim();
    let pool = PinnedHostPool::growable(sim, Some(300 * MIB));
    pool.keep_free(100 * MIB);
    // Nothing is pinned ahead before a request has needed pinned memory...
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!((settled(&pool), sim.pinned_host_bytes()), (0, 0));
    // ... and from the first one on, it is, in the background.
    drop(pool.allocate(MIB).unwrap());
    assert!(settled(&pool) >= 100 * MIB);
    let before = pool.pinning_time();
    // Requests within the headroom (in pieces no larger than a chunk) are served from what
    // was pinned ahead.
    let a: Vec<_> = (0..3).map(|_| pool.allocate(30 * MIB).unwrap()).collect();
    // and the pool pins again behind it, to keep 100 MiB free.
    let capacity = settled(&pool);
    assert!(capacity - pool.used() >= 100 * MIB, "{capacity} pinned");
    assert!(pool.pinning_time() > before);
    // Never past the maximum, however much it is asked to keep free.
    pool.keep_free(1 << 30);
    assert_eq!(settled(&pool), 300 * MIB);
    assert_eq!(sim.pinned_host_bytes(), 300 * MIB);
    // (Slices never cross a registered chunk: large data takes several.) What is free is
    // served without growing, in pieces.
    let b: Vec<_> = (0..100).map(|_| pool.allocate(2 * MIB).unwrap()).collect();
    assert_eq!(pool.used(), 290 * MIB);
    assert_eq!(pool.capacity(), 300 * MIB);
    drop((a, b));
    assert_eq!(pool.used(), 0);
}

#[test]
fn a_growable_pool_pins_ahead_in_small_chunks_and_a_request_it_cannot_serve_gets_pageable_memory() {
    let sim = backed_sim();
    let pool = PinnedHostPool::growable(sim, Some(512 * MIB));
    pool.keep_free(100 * MIB);
    // The first request finds nothing pinned: it does not wait for pinning but gets pageable
    // memory, and the pool starts pinning ahead.
    let first = pool.allocate(8 * MIB - 100).unwrap();
    assert!(!first.is_pinned());
    assert_eq!(pool.pageable(), 8 * MIB, "whole 2 MiB pages");
    drop(first);
    assert_eq!((pool.pageable(), pool.used()), (0, 0));
    assert!(settled(&pool) >= 100 * MIB);
    // Registrations hold the driver while spills enqueue copies: a growable pool's are small.
    assert_eq!(pool.max_slice(), 32 * MIB, "pinned ahead in 32 MiB chunks");
    // A request larger than a chunk (slices never cross chunks) gets pageable memory of its own
    // size rather than pinning a chunk for it...
    let free = pool.free();
    let mut big = pool.allocate(40 * MIB).unwrap();
    assert!(!big.is_pinned() && big.len() == 40 * MIB);
    assert_eq!(pool.free(), free, "pinned memory free as before");
    assert_eq!((pool.pageable(), pool.max_slice()), (40 * MIB, 32 * MIB));
    big.as_mut_slice().copy_from_slice(&pattern(40 * MIB, 3));
    assert!(big.as_slice() == pattern(40 * MIB, 3).as_slice());
    // ... and data in pieces of a chunk is served from what was pinned ahead, which is pinned
    // again behind it.
    let before = settled(&pool);
    let free = pool.free();
    let pieces: Vec<_> = (0..3).map(|_| pool.allocate(32 * MIB).unwrap()).collect();
    assert!(pieces.iter().all(|p| p.is_pinned()));
    assert!(free >= 96 * MIB, "{free} free before, {before} pinned");
    let after = settled(&pool);
    assert!(pool.free() >= 100 * MIB, "{after} pinned");
    // Pageable memory is never registered, and goes back to the system with its slice.
    assert_eq!(sim.pinned_host_bytes(), pool.capacity());
    drop((big, pieces));
    assert_eq!((pool.used(), pool.pageable()), (0, 0));
    assert_eq!(pool.pageable_total() as usize, 48 * MIB);
}

#[test]
fn a_small_request_pins_a_chunk_rather_than_take_pageable_memory() {
    let sim = backed_sim();
    let pool = PinnedHostPool::growable(sim, Some(512 * MIB));
    pool.keep_free(100 * MIB);
    // Each pageable slice is a mapping of its own in whole 2 MiB pages: under 8 MiB the
    // request pins a chunk (at least 32 MiB) that serves the next ones too.
    let small: Vec<_> = (0..8).map(|_| pool.allocate(MIB).unwrap()).collect();
    assert!(small.iter().all(|s| s.is_pinned()));
    assert_eq!((pool.pageable(), pool.pageable_total()), (0, 0));
    drop(small);
    settled(&pool);
}

#[test]
fn pageable_slices_count_against_the_maximum() {
    let sim = backed_sim();
    let pool = PinnedHostPool::growable(sim, Some(64 * MIB));
    pool.keep_free(32 * MIB);
    let first = pool.allocate(8 * MIB).unwrap();
    assert!(!first.is_pinned());
    assert_eq!(settled(&pool), 32 * MIB);
    // Taking the pinned chunk, the pool pins ahead what the maximum leaves: 64 - 32 - 8 MiB.
    let pinned = pool.allocate(32 * MIB).unwrap();
    assert_eq!(settled(&pool), 56 * MIB);
    // No room is left: a request that fits no pinned chunk is refused, neither pageable nor
    // pinned past the maximum.
    let err = pool.allocate(40 * MIB).unwrap_err();
    assert!(matches!(err, Error::HostOutOfMemory { .. }), "{err}");
    assert_eq!(
        (pool.pageable(), sim.pinned_host_bytes()),
        (8 * MIB, 56 * MIB)
    );
    let rest = pool.allocate(24 * MIB).unwrap();
    assert!(rest.is_pinned());
    // Pageable memory given back is room again.
    drop(first);
    let again = pool.allocate(8 * MIB).unwrap();
    assert!(!again.is_pinned());
    assert_eq!(settled(&pool), 56 * MIB);
    drop((pinned, rest, again));
    assert_eq!((pool.used(), pool.pageable()), (0, 0));
}

#[test]
fn without_pinning_ahead_a_request_pins_a_chunk_of_its_size() {
    let sim = backed_sim();
    let pool = PinnedHostPool::growable(sim, Some(512 * MIB));
    let big = pool.allocate(40 * MIB).unwrap();
    assert!(big.is_pinned());
    assert_eq!((pool.pageable(), pool.max_slice()), (0, 40 * MIB));
    assert_eq!(sim.pinned_host_bytes(), pool.capacity());
}

#[test]
fn a_pool_pinning_ahead_goes_when_dropped() {
    let sim = backed_sim();
    let pool = PinnedHostPool::growable(sim, Some(512 * MIB));
    pool.keep_free(512 * MIB);
    drop(pool.allocate(MIB).unwrap());
    assert!(pool.is_pinning_ahead());
    drop(pool);
    // The thread holds the pool only for the step it pins: the memory goes back after it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while sim.pinned_host_bytes() != 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert_eq!(sim.pinned_host_bytes(), 0);
}

#[test]
fn a_fixed_pool_ignores_pinning_ahead() {
    let pool = PinnedHostPool::new(32 * MIB).unwrap();
    pool.keep_free(1 << 30);
    assert!(!pool.is_pinning_ahead());
    assert_eq!(pool.capacity(), 32 * MIB);
    assert_eq!(pool.headroom(), 0);
}

#[test]
fn requests_and_pinning_ahead_together_never_pin_past_the_maximum() {
    let sim = backed_sim();
    let pool = PinnedHostPool::growable(sim, Some(256 * MIB));
    // Pinning ahead and four threads asking for memory at once, all racing for the room.
    pool.keep_free(200 * MIB);
    let served: Vec<usize> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let mut held = Vec::new();
                    for _ in 0..2 {
                        if let Ok(slice) = pool.allocate(20 * MIB) {
                            held.push(slice);
                        }
                        // Pinned and pageable memory together (nothing is trimmed here, so
                        // the two reads cannot cross a give-back).
                        let all = pool.capacity() + pool.pageable();
                        assert!(all <= 256 * MIB, "{all} pinned and pageable");
                    }
                    held.len()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let capacity = settled(&pool);
    assert!(capacity <= 256 * MIB, "{capacity} pinned, maximum 256 MiB");
    assert_eq!(sim.pinned_host_bytes(), capacity);
    // 8 × 20 MiB fit under the maximum with room to spare: every request was served (none
    // gave up while the room was being pinned ahead).
    assert_eq!(served, vec![2; 4]);
    assert_eq!(
        pool.used(),
        0,
        "the slices went back when their threads ended"
    );
}

#[test]
fn trimming_gives_back_the_chunks_nothing_is_handed_out_of() {
    let sim = backed_sim();
    let pool = PinnedHostPool::growable(sim, None);
    // Three requests, each pinning a chunk of its own (the pool doubles: 32, 32, 64 MiB).
    let a = pool.allocate(32 * MIB).unwrap();
    let b = pool.allocate(32 * MIB).unwrap();
    let c = pool.allocate(64 * MIB).unwrap();
    assert_eq!(pool.capacity(), 128 * MIB);
    drop(b);
    assert_eq!(pool.trim(), 32 * MIB, "the chunk b left empty");
    assert_eq!(pool.capacity(), 96 * MIB);
    assert_eq!(sim.pinned_host_bytes(), 96 * MIB);
    // Slices still handed out keep their bytes.
    let mut d = pool.allocate(MIB).unwrap();
    d.as_mut_slice().copy_from_slice(&pattern(MIB, 9));
    assert!(d.as_slice() == pattern(MIB, 9).as_slice());
    assert!(a.len() == 32 * MIB && c.len() == 64 * MIB);
    drop((a, c, d));
    let all = pool.capacity();
    assert_eq!(pool.trim(), all);
    assert_eq!((pool.capacity(), sim.pinned_host_bytes()), (0, 0));
    // It pins again for the next request.
    let e = pool.allocate(MIB).unwrap();
    assert!(pool.capacity() >= MIB);
    drop(e);
}

#[test]
fn a_pool_releasing_idle_memory_holds_no_more_than_its_slices() {
    let sim = backed_sim();
    let pool = PinnedHostPool::growable(sim, None);
    pool.keep_free(64 * MIB);
    // (The first request pins a chunk and starts the pinning ahead.)
    drop(pool.allocate(MIB).unwrap());
    settled(&pool);
    let held: Vec<_> = (0..3).map(|_| pool.allocate(16 * MIB).unwrap()).collect();
    assert!(held.iter().all(|h| h.is_pinned()));
    settled(&pool);
    assert!(pool.capacity() >= 48 * MIB + 64 * MIB, "pinned ahead");
    pool.release_idle(true);
    settled(&pool);
    assert_eq!(pool.headroom(), 0, "no more pinning ahead");
    let kept = pool.capacity();
    assert!(
        (48 * MIB..48 * MIB + 64 * MIB).contains(&kept),
        "{kept} pinned for 48 MiB"
    );
    // Each chunk goes as its last slice does.
    let mut held = held.into_iter();
    drop(held.next());
    assert!(pool.capacity() <= kept);
    drop(held);
    assert_eq!((pool.capacity(), sim.pinned_host_bytes()), (0, 0));
    // A request is still served, and what it pinned goes back with it.
    let s = pool.allocate(3 * MIB).unwrap();
    assert!(pool.capacity() >= 3 * MIB);
    drop(s);
    assert_eq!((pool.capacity(), sim.pinned_host_bytes()), (0, 0));
    // Switched back: it keeps what it pins again.
    pool.release_idle(false);
    drop(pool.allocate(MIB).unwrap());
    assert!(pool.capacity() >= MIB);
}

#[test]
fn reclaimable_slices_count_as_room_and_the_pool_pins_ahead_only_past_them() {
    let sim = backed_sim();
    let pool = PinnedHostPool::growable(sim, Some(1 << 30));
    pool.keep_free(64 * MIB);
    drop(pool.allocate(MIB).unwrap());
    settled(&pool);
    // Two chunks' worth of copies that can be dropped (the pool pins ahead behind them while
    // they are handed out, as for any slice).
    let mut copies: Vec<_> = (0..2).map(|_| pool.allocate(32 * MIB).unwrap()).collect();
    copies.iter_mut().for_each(|s| s.set_reclaimable(true));
    assert_eq!(pool.reclaimable(), 64 * MIB);
    let capacity = settled(&pool);
    // What is free now goes to data: the copies are room enough, nothing more is pinned.
    let data: Vec<_> = (0..(capacity - pool.used()) / (32 * MIB))
        .map(|_| pool.allocate(32 * MIB).unwrap())
        .collect();
    assert!(capacity - pool.used() < 64 * MIB);
    assert_eq!(
        settled(&pool),
        capacity,
        "pinned ahead past copies that can be dropped"
    );
    // Made data again, the copies are not room: the pool pins ahead once more.
    copies.iter_mut().for_each(|s| s.set_reclaimable(false));
    assert_eq!(pool.reclaimable(), 0);
    pool.keep_free(64 * MIB);
    let grown = settled(&pool);
    assert!(grown - pool.used() >= 64 * MIB, "{grown} pinned");
    // A slice dropped while reclaimable takes its bytes out of the count.
    let mut last = pool.allocate(MIB).unwrap();
    last.set_reclaimable(true);
    assert_eq!(pool.reclaimable(), last.len());
    drop((data, copies, last));
    assert_eq!((pool.used(), pool.reclaimable()), (0, 0));
}
