//! PoolMemoryResource: sizes, alignment, data, growth, out-of-memory, release and trim.

mod common;

use std::sync::Arc;

use common::{GIB, MIB, device, pattern};
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::SharedResource;
use rmm_allocator::resource::{CudaMemoryResource, PoolMemoryResource, VirtualMemory};
use rmm_allocator::{ALLOCATION_ALIGNMENT, Device, Error, StreamView};

fn cuda(d: Device) -> SharedResource {
    Arc::new(CudaMemoryResource::new(d))
}

fn sim(capacity: usize) -> Device {
    common::unbacked_sim(capacity).1
}

#[test]
fn sizes_alignment_and_data() {
    let d = device();
    let pool = PoolMemoryResource::new(cuda(d), 2 * GIB, None).unwrap();
    assert!(pool.allocate(0, StreamView::DEFAULT).unwrap().is_null());
    let mut live = Vec::new();
    for (i, bytes) in [1usize, 255, 256, 257, 4095, MIB, MIB + 1, 3 * MIB + 5, GIB]
        .into_iter()
        .enumerate()
    {
        let p = pool.allocate(bytes, StreamView::DEFAULT).unwrap();
        assert_eq!(
            p.addr() % ALLOCATION_ALIGNMENT as u64,
            0,
            "{bytes} B at {p}"
        );
        let n = bytes.min(1 << 16);
        let data = pattern(n, i as u64);
        d.copy_to_device(p, &data).unwrap();
        let mut back = vec![0u8; n];
        d.copy_to_host(&mut back, p).unwrap();
        assert_eq!(back, data);
        live.push((p, bytes));
    }
    let snap = pool.validate().unwrap();
    assert_eq!(snap.live_blocks, live.len());
    for (p, b) in live {
        pool.deallocate(p, b, StreamView::DEFAULT).unwrap();
    }
    pool.synchronize().unwrap();
    let snap = pool.validate().unwrap();
    assert_eq!(snap.in_use, 0);
    assert!(snap.fully_coalesced, "{snap:?}");
}

#[test]
fn out_of_memory_names_the_pool_figures() {
    let d = device();
    let pool = PoolMemoryResource::new(cuda(d), 32 * MIB, Some(64 * MIB)).unwrap();
    let a = pool.allocate(40 * MIB, StreamView::DEFAULT).unwrap();
    let e = pool.allocate(40 * MIB, StreamView::DEFAULT).unwrap_err();
    match &e {
        Error::OutOfMemory {
            requested,
            resource,
            pool: Some(u),
            ..
        } => {
            assert_eq!(*requested, 40 * MIB);
            assert_eq!(*resource, "PoolMemoryResource");
            assert_eq!(u.in_use, 40 * MIB);
            assert!(u.pool_size <= 64 * MIB);
            assert_eq!(u.maximum_size, Some(64 * MIB));
        }
        other => panic!("expected OutOfMemory with pool figures, got {other:?}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("pool holds") && msg.contains("largest free block"),
        "{msg}"
    );
    // Larger than the maximum: refused at once.
    assert!(
        pool.allocate(65 * MIB, StreamView::DEFAULT)
            .unwrap_err()
            .is_out_of_memory()
    );
    pool.deallocate(a, 40 * MIB, StreamView::DEFAULT).unwrap();
    let b = pool.allocate(60 * MIB, StreamView::DEFAULT).unwrap();
    pool.deallocate(b, 60 * MIB, StreamView::DEFAULT).unwrap();
}

#[test]
fn grows_toward_the_maximum_and_falls_back_when_the_upstream_refuses() {
    let (b, d) = common::unbacked_sim(8 * GIB);
    // Upstream chunks (one allocation per growth), whose size the injected fault limits.
    let pool = PoolMemoryResource::builder(cuda(d))
        .initial_size(0)
        .maximum_size(4 * GIB as u64)
        .growth(64 * MIB as u64)
        .virtual_memory(VirtualMemory::Off)
        .build()
        .unwrap();
    assert_eq!(pool.pool_size(), 0);
    assert_eq!(pool.maximum_size(), 4 * GIB as u64);
    let a = pool.allocate(100 * MIB, StreamView::DEFAULT).unwrap();
    let first = pool.pool_size();
    assert_eq!(
        first,
        128 * MIB as u64,
        "100 MiB rounded up to the 64 MiB growth step"
    );
    // The upstream now refuses anything above 150 MiB: growth halves its try until it fits.
    b.fail_allocations_above(0, 150 * MIB).unwrap();
    let big = pool.allocate(140 * MIB, StreamView::DEFAULT).unwrap();
    let grown = pool.pool_size() - first;
    assert!(
        (140 * MIB as u64..=150 * MIB as u64).contains(&grown),
        "grew by {grown}"
    );
    // Nothing above 150 MiB can come from the upstream now.
    assert!(
        pool.allocate(200 * MIB, StreamView::DEFAULT)
            .unwrap_err()
            .is_out_of_memory()
    );
    b.clear_faults(0).unwrap();
    pool.deallocate(big, 140 * MIB, StreamView::DEFAULT)
        .unwrap();
    pool.deallocate(a, 100 * MIB, StreamView::DEFAULT).unwrap();
    // Past the maximum: out of memory, not a panic.
    let e = pool.allocate(5 * GIB, StreamView::DEFAULT).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    pool.validate().unwrap();
}

#[test]
fn release_gives_everything_unused_back_and_trim_keeps_a_floor() {
    let d = sim(4 * GIB);
    let pool = PoolMemoryResource::new(cuda(d), GIB, None).unwrap();
    assert_eq!(d.mem_info().unwrap().free, 3 * GIB);
    let s1 = rmm_allocator::Stream::new(d).unwrap();
    let keep = pool.allocate(10 * MIB, s1.view()).unwrap();
    let extra: Vec<_> = (0..40)
        .map(|_| pool.allocate(60 * MIB, StreamView::DEFAULT).unwrap())
        .collect();
    let grown = pool.pool_size();
    assert!(grown > GIB as u64, "the pool grew past its initial size");
    for p in extra {
        pool.deallocate(p, 60 * MIB, StreamView::DEFAULT).unwrap();
    }
    // Trim to the initial size: the grown chunk goes back, the in-use one stays.
    let released = pool.trim(GIB as u64).unwrap();
    assert!(released > 0);
    assert!(pool.pool_size() <= grown - released);
    pool.deallocate(keep, 10 * MIB, s1.view()).unwrap();
    pool.release().unwrap();
    assert_eq!(pool.pool_size(), 0);
    assert_eq!(
        d.mem_info().unwrap().free,
        4 * GIB,
        "all memory back with the upstream"
    );
    // The pool still works after a release.
    let p = pool.allocate(MIB, StreamView::DEFAULT).unwrap();
    pool.deallocate(p, MIB, StreamView::DEFAULT).unwrap();
}

#[test]
fn dropping_the_pool_returns_its_memory() {
    let d = sim(2 * GIB);
    {
        let pool = PoolMemoryResource::new(cuda(d), GIB, None).unwrap();
        let p = pool.allocate(MIB, StreamView::DEFAULT).unwrap();
        pool.deallocate(p, MIB, StreamView::DEFAULT).unwrap();
        assert_eq!(d.mem_info().unwrap().free, GIB);
    }
    assert_eq!(d.mem_info().unwrap().free, 2 * GIB);
}

#[test]
fn a_pointer_the_pool_never_gave_is_an_error() {
    let d = sim(GIB);
    let pool = PoolMemoryResource::new(cuda(d), 64 * MIB, None).unwrap();
    let e = pool
        .deallocate(
            rmm_allocator::backend::DevicePtr(0x1000),
            256,
            StreamView::DEFAULT,
        )
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidPointer { ptr: 0x1000, .. }),
        "{e}"
    );
}

#[test]
fn an_initial_size_above_the_maximum_is_refused() {
    let d = sim(GIB);
    let e = PoolMemoryResource::builder(cuda(d))
        .initial_size((512 * MIB) as u64)
        .maximum_size((256 * MIB) as u64)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("initial_size"), "{e}");
    // Default initial size: half of the free memory.
    let pool = PoolMemoryResource::builder(cuda(d)).build().unwrap();
    assert_eq!(pool.pool_size(), (GIB / 2) as u64);
}

/// A pool over plain CUDA memory, on `device()`.
fn cuda_pool(initial: usize) -> Arc<PoolMemoryResource> {
    Arc::new(
        PoolMemoryResource::new(Arc::new(CudaMemoryResource::new(device())), initial, None)
            .unwrap(),
    )
}

#[test]
fn a_new_pool_adopts_the_free_chunks_of_the_pool_it_replaces() {
    let old = cuda_pool(64 * MIB);
    // Used whole and freed: the chunk is entirely free again, in an arena.
    let p = old.allocate(64 * MIB, StreamView::DEFAULT).unwrap();
    old.deallocate(p, 64 * MIB, StreamView::DEFAULT).unwrap();
    let new = PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(device())))
        .initial_size((64 * MIB) as u64)
        .adopt_from(Arc::clone(&old))
        .build()
        .unwrap();
    assert_eq!(new.pool_size(), (64 * MIB) as u64);
    assert_eq!(old.pool_size(), 0, "the chunk moved");
    // The very same memory: no new device memory was taken for it.
    let q = new.allocate(64 * MIB, StreamView::DEFAULT).unwrap();
    assert_eq!(q, p);
    device().memset(q, 7, 64 * MIB).unwrap();
    new.deallocate(q, 64 * MIB, StreamView::DEFAULT).unwrap();
    // The old pool still works: it grows again.
    let r = old.allocate(MIB, StreamView::DEFAULT).unwrap();
    old.deallocate(r, MIB, StreamView::DEFAULT).unwrap();
    assert!(new.validate().unwrap().fully_coalesced);
}

#[test]
fn adoption_takes_only_what_fits_and_only_from_an_equal_upstream() {
    // A 64 MiB chunk does not fit a 32 MiB pool: nothing moves.
    let old = cuda_pool(64 * MIB);
    let small = Arc::new(
        PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(device())))
            .initial_size((32 * MIB) as u64)
            .adopt_from(Arc::clone(&old))
            .build()
            .unwrap(),
    );
    assert_eq!(small.pool_size(), (32 * MIB) as u64);
    assert_eq!(old.pool_size(), (64 * MIB) as u64);
    // A live block keeps its chunk in the old pool.
    let p = old.allocate(MIB, StreamView::DEFAULT).unwrap();
    let other = PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(device())))
        .initial_size((64 * MIB) as u64)
        .adopt_from(Arc::clone(&old))
        .build()
        .unwrap();
    assert_eq!(old.pool_size(), (64 * MIB) as u64);
    assert_eq!(other.pool_size(), (64 * MIB) as u64);
    old.deallocate(p, MIB, StreamView::DEFAULT).unwrap();
    // A pool over another pool's memory cannot free cuMemAlloc chunks: nothing moves.
    let layered = PoolMemoryResource::builder(Arc::clone(&small) as SharedResource)
        .initial_size((16 * MIB) as u64)
        .adopt_from(Arc::clone(&old))
        .build()
        .unwrap();
    assert_eq!(old.pool_size(), (64 * MIB) as u64);
    assert_eq!(layered.pool_size(), (16 * MIB) as u64);
}

#[test]
fn before_adoption_the_old_pool_keeps_the_chunks_that_fit_and_releases_the_rest() {
    // cuMemAlloc chunks: the 100 MiB block lies in the second chunk alone (mapped chunks side
    // by side would let it span both: see pool_vmm.rs).
    let old = Arc::new(
        PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(device())))
            .initial_size((32 * MIB) as u64)
            .virtual_memory(VirtualMemory::Off)
            .build()
            .unwrap(),
    );
    // A request larger than the first chunk makes the pool grow a second, larger one.
    let p = old.allocate(100 * MIB, StreamView::DEFAULT).unwrap();
    old.deallocate(p, 100 * MIB, StreamView::DEFAULT).unwrap();
    let big = old.pool_size() - (32 * MIB) as u64;
    assert!(big >= (100 * MIB) as u64);
    // A new pool of `big` bytes would adopt the big chunk: the small one goes back.
    let released = old.release_except_adoptable(big).unwrap();
    assert_eq!(released, (32 * MIB) as u64);
    assert_eq!(old.pool_size(), big);
    let new = PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(device())))
        .initial_size(big)
        .virtual_memory(VirtualMemory::Off)
        .adopt_from(Arc::clone(&old))
        .build()
        .unwrap();
    assert_eq!(old.pool_size(), 0);
    assert_eq!(new.pool_size(), big);
    let q = new.allocate(100 * MIB, StreamView::DEFAULT).unwrap();
    assert_eq!(q, p, "the same memory");
    new.deallocate(q, 100 * MIB, StreamView::DEFAULT).unwrap();
}

#[test]
fn a_request_beyond_every_size_class_is_out_of_memory_not_a_panic() {
    let d = rmm_allocator::Device::new(0).unwrap();
    let cuda: rmm_allocator::resource::SharedResource =
        std::sync::Arc::new(rmm_allocator::resource::CudaMemoryResource::new(d));
    let pool = rmm_allocator::resource::PoolMemoryResource::new(cuda, 16 << 20, None).unwrap();
    for bytes in [1usize << 55, usize::MAX / 2, usize::MAX] {
        let err = rmm_allocator::resource::DeviceMemoryResource::allocate(
            &pool,
            bytes,
            rmm_allocator::StreamView::DEFAULT,
        )
        .unwrap_err();
        assert!(err.is_out_of_memory(), "{err}");
    }
}
