//! A replacing pool takes live blocks over with their chunks, data in place
//! (`PoolBuilder::adopt_live`), on the simulated device: the data, both pools' accounting,
//! a later free going to the new pool, blocks that cannot move staying with the old pool,
//! with mapped chunks and with `cuMemAlloc` chunks.

mod common;

use std::sync::Arc;

use common::{MIB, pattern};
use rmm_allocator::backend::DevicePtr;
use rmm_allocator::backend::{SimBackend, SimConfig, SimMemoryMode};
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::{CudaMemoryResource, LiveBlock, PoolMemoryResource, VirtualMemory};
use rmm_allocator::{Device, StreamView};

fn backed() -> Device {
    let b = SimBackend::leak(SimConfig {
        devices: 1,
        capacity: 1 << 30,
        mode: SimMemoryMode::Backed,
    })
    .unwrap();
    Device::on(b, 0).unwrap()
}

fn pool(d: Device, mode: VirtualMemory, initial: usize) -> Arc<PoolMemoryResource> {
    Arc::new(
        PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
            .initial_size(initial as u64)
            .growth(4 * MIB as u64)
            .virtual_memory(mode)
            .build()
            .unwrap(),
    )
}

fn replace(
    d: Device,
    old: &Arc<PoolMemoryResource>,
    mode: VirtualMemory,
    initial: usize,
    live: Vec<LiveBlock>,
) -> PoolMemoryResource {
    PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
        .initial_size(initial as u64)
        .growth(4 * MIB as u64)
        .virtual_memory(mode)
        .adopt_from(Arc::clone(old))
        .adopt_live(live)
        .build()
        .unwrap()
}

/// A block of `n` bytes filled with `pattern(n, seed)`.
fn filled(d: Device, p: &PoolMemoryResource, n: usize, seed: u64) -> LiveBlock {
    let ptr = p.allocate(n, StreamView::DEFAULT).unwrap();
    d.copy_to_device(ptr, &pattern(n, seed)).unwrap();
    LiveBlock {
        ptr,
        bytes: n,
        stream: StreamView::DEFAULT,
    }
}

fn holds(d: Device, ptr: DevicePtr, n: usize, seed: u64) -> bool {
    let mut back = vec![0u8; n];
    d.copy_to_host(&mut back, ptr).unwrap();
    back == pattern(n, seed)
}

fn used(d: Device) -> usize {
    let i = d.mem_info().unwrap();
    i.total - i.free
}

#[test]
fn live_blocks_move_with_their_chunks_and_are_freed_to_the_new_pool() {
    let d = backed();
    let s = StreamView::DEFAULT;
    // Four mapped chunks of 4 MiB: A fills the first, B the next two, C the last.
    let old = pool(d, VirtualMemory::On, 16 * MIB);
    let a = filled(d, &old, 4 * MIB, 1);
    let b = filled(d, &old, 8 * MIB, 2);
    let c = filled(d, &old, 4 * MIB, 3);
    assert_eq!(old.validate().unwrap().chunks, 4);
    let before = used(d);
    // C is not handed over: its chunk stays; A and B move with theirs.
    let new = replace(d, &old, VirtualMemory::On, 16 * MIB, vec![a, b]);
    assert_eq!(new.adopted_blocks(), &[a, b]);
    assert_eq!(old.pool_size(), (4 * MIB) as u64, "C's chunk stays");
    assert_eq!(new.pool_size(), (16 * MIB) as u64);
    assert_eq!(
        used(d) - before,
        4 * MIB,
        "only the part of the new pool not adopted is new memory"
    );
    assert!(
        holds(d, a.ptr, a.bytes, 1) && holds(d, b.ptr, b.bytes, 2) && holds(d, c.ptr, c.bytes, 3)
    );
    let n = new.validate().unwrap();
    assert_eq!((n.in_use, n.live_blocks), ((12 * MIB) as u64, 2));
    let o = old.validate().unwrap();
    assert_eq!((o.in_use, o.live_blocks), ((4 * MIB) as u64, 1));
    // A later free goes to the new pool, which serves the memory again.
    new.deallocate(a.ptr, a.bytes, s).unwrap();
    assert_eq!(new.validate().unwrap().in_use, (8 * MIB) as u64);
    let again = new.allocate(4 * MIB, s).unwrap();
    new.deallocate(again, 4 * MIB, s).unwrap();
    new.deallocate(b.ptr, b.bytes, s).unwrap();
    old.deallocate(c.ptr, c.bytes, s).unwrap();
    new.synchronize().unwrap();
    let n = new.validate().unwrap();
    assert_eq!(n.in_use, 0);
    assert!(n.fully_coalesced);
    assert_eq!(new.release().unwrap(), (16 * MIB) as u64);
    assert_eq!(old.release().unwrap(), (4 * MIB) as u64);
}

#[test]
fn a_block_whose_chunks_do_not_fit_stays_live_in_the_old_pool() {
    let d = backed();
    let s = StreamView::DEFAULT;
    let old = pool(d, VirtualMemory::On, 12 * MIB);
    let a = filled(d, &old, 4 * MIB, 4);
    let b = filled(d, &old, 8 * MIB, 5);
    // 4 MiB of initial size: room for A's chunk, not B's two.
    let new = replace(d, &old, VirtualMemory::On, 4 * MIB, vec![a, b]);
    assert_eq!(new.adopted_blocks(), &[a]);
    assert_eq!(
        old.validate().unwrap().in_use,
        (8 * MIB) as u64,
        "B is still the old pool's"
    );
    assert!(holds(d, a.ptr, a.bytes, 4) && holds(d, b.ptr, b.bytes, 5));
    old.deallocate(b.ptr, b.bytes, s).unwrap();
    new.deallocate(a.ptr, a.bytes, s).unwrap();
    assert_eq!(old.validate().unwrap().in_use, 0);
    assert_eq!(new.validate().unwrap().in_use, 0);
}

#[test]
fn allocation_chunks_move_whole_with_the_blocks_in_them_and_bin_blocks_stay() {
    let d = backed();
    let s = StreamView::DEFAULT;
    // One cuMemAlloc chunk of 128 MiB holding every block.
    let old = pool(d, VirtualMemory::Off, 128 * MIB);
    let a = filled(d, &old, 2 * MIB, 6);
    let b = filled(d, &old, 6 * MIB, 7);
    let small = LiveBlock {
        ptr: old.allocate(4096, s).unwrap(),
        bytes: 4096,
        stream: s,
    };
    // A block of the size-class bins never moves (it shares a slab) and keeps its chunk, so
    // nothing moves: every block stays live in the old pool, data in place.
    let pinned = replace(d, &old, VirtualMemory::Off, 128 * MIB, vec![a, b, small]);
    assert!(pinned.adopted_blocks().is_empty());
    assert_eq!(old.pool_size(), (128 * MIB) as u64);
    assert_eq!(old.validate().unwrap().in_use, (8 * MIB + 4096) as u64);
    drop(pinned);
    old.deallocate(small.ptr, small.bytes, s).unwrap();
    let new = replace(d, &old, VirtualMemory::Off, 128 * MIB, vec![a, b]);
    assert_eq!(new.adopted_blocks(), &[a, b]);
    assert_eq!(old.pool_size(), 0);
    assert!(holds(d, a.ptr, a.bytes, 6) && holds(d, b.ptr, b.bytes, 7));
    // Freed on another stream: still the new pool's, reused after that stream's work.
    let other = rmm_allocator::Stream::new(d).unwrap();
    new.deallocate(a.ptr, a.bytes, other.view()).unwrap();
    new.deallocate(b.ptr, b.bytes, s).unwrap();
    new.synchronize().unwrap();
    assert_eq!(new.validate().unwrap().in_use, 0);
}

#[test]
fn a_provisional_adoption_goes_back_to_the_donor_when_the_new_pool_is_dropped_uncommitted() {
    let d = backed();
    let s = StreamView::DEFAULT;
    let old = pool(d, VirtualMemory::On, 16 * MIB);
    let a = filled(d, &old, 4 * MIB, 8);
    let b = filled(d, &old, 8 * MIB, 9);
    let build = || {
        PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
            .initial_size((16 * MIB) as u64)
            .growth(4 * MIB as u64)
            .virtual_memory(VirtualMemory::On)
            .adopt_from(Arc::clone(&old))
            .adopt_live(vec![a, b])
            .adopt_provisionally()
            .build()
            .unwrap()
    };
    let before = used(d);
    let new = build();
    assert_eq!(new.adopted_blocks(), &[a, b]);
    assert_eq!(old.pool_size(), 0, "everything went over");
    drop(new);
    // Back in the old pool, data in place, live as before; nothing went to the device.
    assert_eq!(used(d), before);
    assert_eq!(old.pool_size(), (16 * MIB) as u64);
    let o = old.validate().unwrap();
    assert_eq!((o.in_use, o.live_blocks), ((12 * MIB) as u64, 2));
    assert!(holds(d, a.ptr, a.bytes, 8) && holds(d, b.ptr, b.bytes, 9));
    // Committed, the same adoption stays with the new pool when it is dropped.
    let new = build();
    assert!(new.commit_adoption());
    assert!(!new.commit_adoption(), "only once");
    new.deallocate(a.ptr, a.bytes, s).unwrap();
    new.deallocate(b.ptr, b.bytes, s).unwrap();
    drop(new);
    assert_eq!(old.pool_size(), 0);
    assert_eq!(old.validate().unwrap().in_use, 0);
    assert_eq!(
        used(d),
        before - 16 * MIB,
        "the new pool gave its memory back"
    );
}

#[test]
fn only_blocks_above_the_bins_can_move() {
    assert!(!LiveBlock::movable(4096));
    assert!(!LiveBlock::movable(64 << 10));
    assert!(LiveBlock::movable((64 << 10) + 1));
    assert!(LiveBlock::movable(4 * MIB));
}
