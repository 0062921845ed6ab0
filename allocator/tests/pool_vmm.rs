//! The pool over CUDA's virtual memory API, on the simulated device: chunks mapped side by
//! side (free space in one piece across growth), trim giving entirely free chunks back one
//! by one, data across chunk boundaries, adoption of mapped chunks, the fallback where the
//! device has no virtual memory management, and the backend calls' rules.

mod common;

use std::sync::Arc;

use common::{GIB, MIB, pattern};
use rmm_allocator::backend::{Backend, DevicePtr, SimBackend, SimConfig, SimMemoryMode};
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::{
    CudaMemoryResource, ManagedMemoryResource, PoolMemoryResource, SharedResource, VirtualMemory,
};
use rmm_allocator::{Device, StreamView};

fn sim(mode: SimMemoryMode, capacity: usize) -> (&'static SimBackend, Device) {
    let b = SimBackend::leak(SimConfig {
        devices: 1,
        capacity,
        mode,
    })
    .unwrap();
    (b, Device::on(b, 0).unwrap())
}

fn pool(d: Device, initial: usize, growth: usize) -> PoolMemoryResource {
    PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
        .initial_size(initial as u64)
        .growth(growth as u64)
        .virtual_memory(VirtualMemory::On)
        .build()
        .unwrap()
}

fn used(d: Device) -> usize {
    let i = d.mem_info().unwrap();
    i.total - i.free
}

#[test]
fn free_space_stays_in_one_piece_across_growth() {
    let (_, d) = sim(SimMemoryMode::Unbacked, 80 * GIB);
    let p = pool(d, 0, GIB);
    assert!(p.uses_virtual_memory());
    assert_eq!(p.chunk_source(), "virtual memory");
    let s = StreamView::DEFAULT;
    let a = p.allocate(512 * MIB, s).unwrap();
    assert_eq!(p.pool_size(), GIB as u64);
    // 512 MiB are free at the top: the pool maps what the request lacks right after them.
    let b = p.allocate(GIB, s).unwrap();
    assert_eq!(p.pool_size(), 2 * GIB as u64, "one more chunk, not two");
    assert_eq!(
        b.addr(),
        a.addr() + (512 * MIB) as u64,
        "the block spans both chunks"
    );
    p.deallocate(a, 512 * MIB, s).unwrap();
    p.deallocate(b, GIB, s).unwrap();
    p.synchronize().unwrap();
    // Both chunks are one free range: 2 GiB fit without growing.
    let c = p.allocate(2 * GIB, s).unwrap();
    assert_eq!(p.pool_size(), 2 * GIB as u64);
    let snap = p.validate().unwrap();
    assert_eq!(snap.chunks, 2);
    assert_eq!(snap.in_use, 2 * GIB as u64);
    p.deallocate(c, 2 * GIB, s).unwrap();
    p.synchronize().unwrap();
    assert!(p.validate().unwrap().fully_coalesced);
}

#[test]
fn trim_gives_entirely_free_chunks_back_one_by_one() {
    let (b, d) = sim(SimMemoryMode::Unbacked, 80 * GIB);
    let before = used(d);
    let p = pool(d, 9 * GIB, GIB);
    assert_eq!(p.validate().unwrap().chunks, 9);
    assert_eq!(used(d) - before, 9 * GIB);
    let s = StreamView::DEFAULT;
    // One live block holds the first chunk; the other eight are entirely free.
    let live = p.allocate(100 * MIB, s).unwrap();
    let released = p.trim(0).unwrap();
    assert_eq!(released, 8 * GIB as u64);
    assert_eq!(p.pool_size(), GIB as u64);
    assert_eq!(used(d) - before, GIB, "the device has the memory back");
    assert_eq!(b.live_allocations(0), 1, "one physical chunk left");
    p.validate().unwrap();
    // The pool grows again into the same range and still works.
    let big = p.allocate(3 * GIB, s).unwrap();
    assert_eq!(p.pool_size(), 4 * GIB as u64);
    p.deallocate(big, 3 * GIB, s).unwrap();
    p.deallocate(live, 100 * MIB, s).unwrap();
    assert_eq!(p.release().unwrap(), 4 * GIB as u64);
    assert_eq!(used(d), before);
    drop(p);
    assert_eq!(b.live_allocations(0), 0);
}

#[test]
fn data_round_trips_across_chunk_boundaries() {
    let (_, d) = sim(SimMemoryMode::Backed, GIB);
    // 2 MiB chunks (the granularity): an 8 MiB block spans four of them.
    let p = pool(d, 8 * MIB, 2 * MIB);
    assert_eq!(p.validate().unwrap().chunks, 4);
    let s = StreamView::DEFAULT;
    let n = 8 * MIB;
    let a = p.allocate(n, s).unwrap();
    let data = pattern(n, 7);
    d.copy_to_device(a, &data).unwrap();
    let mut back = vec![0u8; n];
    d.copy_to_host(&mut back, a).unwrap();
    assert!(back == data, "bytes across chunk boundaries round-trip");
    // A device-to-device copy across boundaries, into a block of a second growth.
    let b = p.allocate(n, s).unwrap();
    d.copy_device_to_device(b, a.offset(MIB), n - MIB).unwrap();
    let mut out = vec![0u8; n - MIB];
    d.copy_to_host(&mut out, b).unwrap();
    assert!(out[..] == data[MIB..]);
    d.memset(a, 0xab, n).unwrap();
    d.copy_to_host(&mut back, a).unwrap();
    assert!(back.iter().all(|&x| x == 0xab));
    p.deallocate(a, n, s).unwrap();
    p.deallocate(b, n, s).unwrap();
}

#[test]
fn a_replacing_pool_adopts_mapped_chunks_without_new_memory() {
    let (b, d) = sim(SimMemoryMode::Unbacked, 80 * GIB);
    let old = Arc::new(pool(d, 4 * GIB, GIB));
    let chunks_before = b.live_allocations(0);
    let used_before = used(d);
    let new = PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
        .initial_size((4 * GIB) as u64)
        .virtual_memory(VirtualMemory::On)
        .adopt_from(Arc::clone(&old))
        .build()
        .unwrap();
    assert_eq!(old.pool_size(), 0);
    assert_eq!(new.pool_size(), 4 * GIB as u64);
    assert_eq!(
        b.live_allocations(0),
        chunks_before,
        "no physical memory made"
    );
    assert_eq!(used(d), used_before);
    // The adopted chunks are one free range in the new pool, and are its to give back.
    let x = new.allocate(4 * GIB, StreamView::DEFAULT).unwrap();
    new.deallocate(x, 4 * GIB, StreamView::DEFAULT).unwrap();
    drop(old);
    assert_eq!(new.release().unwrap(), 4 * GIB as u64);
    assert_eq!(b.live_allocations(0), 0);
}

#[test]
fn a_pool_that_cannot_map_falls_back_to_upstream_chunks_and_says_so() {
    let (b, d) = sim(SimMemoryMode::Unbacked, 80 * GIB);
    b.set_virtual_memory_supported(false);
    let auto = PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
        .initial_size(GIB as u64)
        .build()
        .unwrap();
    assert!(!auto.uses_virtual_memory());
    assert_eq!(
        auto.chunk_source(),
        "upstream (no virtual memory on this device)"
    );
    let err = PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
        .initial_size(GIB as u64)
        .virtual_memory(VirtualMemory::On)
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("pool.vmm"), "{err}");
    b.set_virtual_memory_supported(true);
    // Managed memory is not mapped: auto keeps the upstream, on is refused.
    let managed: SharedResource = Arc::new(ManagedMemoryResource::new(d).unwrap());
    let m = PoolMemoryResource::builder(Arc::clone(&managed))
        .initial_size(GIB as u64)
        .build()
        .unwrap();
    assert_eq!(m.chunk_source(), "upstream");
    assert!(
        PoolMemoryResource::builder(managed)
            .virtual_memory(VirtualMemory::On)
            .build()
            .is_err()
    );
    // Off keeps cuMemAlloc chunks on a device that could map.
    let off = PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
        .initial_size(GIB as u64)
        .virtual_memory(VirtualMemory::Off)
        .build()
        .unwrap();
    assert!(!off.uses_virtual_memory());
}

#[test]
fn auto_maps_pools_that_grow_and_takes_a_large_initial_size_from_the_upstream() {
    let (_b, d) = sim(SimMemoryMode::Unbacked, 80 * GIB);
    let auto = |initial: usize| {
        PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
            .initial_size(initial as u64)
            .build()
            .unwrap()
    };
    for initial in [0, GIB, 2 * GIB] {
        let p = auto(initial);
        assert!(
            p.uses_virtual_memory(),
            "initial {initial}: {}",
            p.chunk_source()
        );
    }
    // RMM's fixed-pool use: one upstream allocation, as fast as RMM's.
    let large = auto(64 * GIB);
    assert_eq!(large.chunk_source(), "upstream");
    assert_eq!(large.pool_size(), 64 * GIB as u64);
    // Asked for explicitly, a large pool is mapped all the same.
    let on = PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
        .initial_size((8 * GIB) as u64)
        .virtual_memory(VirtualMemory::On)
        .build()
        .unwrap();
    assert!(on.uses_virtual_memory());
}

#[test]
fn the_simulated_virtual_memory_calls_keep_cudas_rules() {
    let (b, d) = sim(SimMemoryMode::Backed, GIB);
    let g = b.mem_granularity(0).unwrap();
    assert_eq!(g, 2 * MIB);
    assert!(
        b.mem_address_reserve(0, g + 1).is_err(),
        "sizes in granules"
    );
    let base = b.mem_address_reserve(0, 4 * g).unwrap();
    let h = b.mem_create(0, g).unwrap();
    assert_eq!(used(d), g, "physical memory counts as used");
    assert!(b.mem_map(0, DevicePtr(base.addr() + 1), g, h).is_err());
    b.mem_map(0, base, g, h).unwrap();
    // Not accessible before cuMemSetAccess.
    assert!(d.copy_to_device(base, &[1, 2, 3]).is_err());
    b.mem_set_access(0, base, g).unwrap();
    d.copy_to_device(base, &[1, 2, 3]).unwrap();
    // Reading past the mapping is an error; so is freeing it with cuMemFree.
    let mut two = vec![0u8; 2 * g];
    assert!(d.copy_to_host(&mut two, base).is_err());
    assert!(b.free(0, base).is_err());
    // Released while mapped: the memory stays until unmapped, then goes back.
    b.mem_release(0, h).unwrap();
    assert_eq!(used(d), g);
    let mut three = [0u8; 3];
    d.copy_to_host(&mut three, base).unwrap();
    assert_eq!(three, [1, 2, 3]);
    assert!(
        b.mem_address_free(0, base, 4 * g).is_err(),
        "a range with a mapping in it"
    );
    b.mem_unmap(0, base, g).unwrap();
    assert_eq!(used(d), 0);
    assert_eq!(b.live_allocations(0), 0);
    b.mem_address_free(0, base, 4 * g).unwrap();
    // Physical memory fails as cuMemAlloc does when the device is full.
    assert!(b.mem_create(0, 2 * GIB).is_err());
}

/// The next sequence length in [64, 1024] from `seed` (a linear congruential step): the
/// same lengths every run.
fn next_length(seed: &mut u64) -> usize {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    64 + (*seed >> 33) as usize % 961
}

/// The pool holds at most 15 % more than the live `peak`, and the growth step (1 GiB) it
/// grows by.
fn assert_near_the_peak(p: &PoolMemoryResource, peak: usize) {
    let reserved = p.pool_size() as usize;
    assert!(
        reserved <= peak + peak * 15 / 100 + GIB,
        "the pool holds {} MiB for a live peak of {} MiB",
        reserved / MIB,
        peak / MIB
    );
}

/// One training step's allocations on one stream, as a framework makes them when the
/// input's size changes every step (a new sequence length `len` in [64, 1024]): per layer,
/// activations whose size follows the length, kept until backward; the logits and their
/// float copy for the loss (the largest blocks, up to 1.5 GiB), freed out of order as
/// backward makes their gradient; the parameters' gradients appearing while the activations
/// go. Returns the step's live peak, counting `base` bytes live throughout.
fn training_step(p: &PoolMemoryResource, s: StreamView, len: usize, base: usize) -> usize {
    let mut bytes = base;
    let mut peak = bytes;
    let mut alloc = |size: usize, bytes: &mut usize| {
        let ptr = p.allocate(size, s).unwrap();
        *bytes += size;
        peak = peak.max(*bytes);
        (ptr, size)
    };
    let free = |(ptr, size): (DevicePtr, usize), bytes: &mut usize| {
        p.deallocate(ptr, size, s).unwrap();
        *bytes -= size;
    };
    let mut acts = Vec::new();
    for layer in 0..12 {
        acts.push(alloc(len * 24 * 1024, &mut bytes));
        let scratch = alloc(len * 96 * 1024, &mut bytes);
        acts.push(alloc(len * (48 + layer) * 1024, &mut bytes));
        free(scratch, &mut bytes);
    }
    let logits = alloc(len * 768 * 1024, &mut bytes);
    let logits_f32 = alloc(len * 1536 * 1024, &mut bytes);
    let loss = alloc(4096, &mut bytes);
    free(logits, &mut bytes);
    let grad = alloc(len * 1536 * 1024, &mut bytes);
    free(logits_f32, &mut bytes);
    let grad_bf16 = alloc(len * 768 * 1024, &mut bytes);
    free(grad, &mut bytes);
    let mut grads = Vec::new();
    while let Some(a) = acts.pop() {
        free(a, &mut bytes);
        if acts.len() % 3 == 0 {
            grads.push(alloc(40 * MIB, &mut bytes));
        }
    }
    free(grad_bf16, &mut bytes);
    free(loss, &mut bytes);
    for g in grads {
        free(g, &mut bytes);
    }
    peak
}

#[test]
fn a_loop_whose_sizes_change_every_step_keeps_the_pool_near_its_live_peak() {
    let (_, d) = sim(SimMemoryMode::Unbacked, 141 * GIB);
    let p = pool(d, GIB, GIB);
    let s = StreamView::DEFAULT;
    // Long-lived parameters and optimizer state.
    let state: Vec<DevicePtr> = (0..3).map(|_| p.allocate(512 * MIB, s).unwrap()).collect();
    let mut seed = 42u64;
    let mut peak = 0;
    for _ in 0..100 {
        let len = next_length(&mut seed);
        peak = peak.max(training_step(&p, s, len, 3 * 512 * MIB));
    }
    assert_near_the_peak(&p, peak);
    for ptr in state {
        p.deallocate(ptr, 512 * MIB, s).unwrap();
    }
}

#[test]
fn two_threads_on_one_stream_share_its_large_blocks() {
    // PyTorch runs forward on one thread and backward on its autograd thread, on one
    // stream: activations made by one are freed by the other, which makes gradients that
    // the first frees. Free memory held apart per thread would make the pool grow.
    let (_, d) = sim(SimMemoryMode::Unbacked, 141 * GIB);
    let p = pool(d, GIB, GIB);
    let s = StreamView::DEFAULT;
    let (to_backward, backward_in) = crossbeam_channel::bounded::<Vec<(DevicePtr, usize)>>(1);
    let (to_forward, forward_in) = crossbeam_channel::bounded::<Vec<(DevicePtr, usize)>>(1);
    let live = std::sync::atomic::AtomicUsize::new(0);
    let peak = std::sync::atomic::AtomicUsize::new(0);
    let add = |n: usize| {
        let now = live.fetch_add(n, std::sync::atomic::Ordering::SeqCst) + n;
        peak.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
    };
    let sub = |n: usize| live.fetch_sub(n, std::sync::atomic::Ordering::SeqCst);
    std::thread::scope(|t| {
        t.spawn(|| {
            // Forward: activations of a changing size; then frees the gradients it is sent.
            let mut seed = 7u64;
            for _ in 0..60 {
                let len = next_length(&mut seed);
                let acts: Vec<(DevicePtr, usize)> = (0..16)
                    .map(|i| {
                        let n = len * (64 + 8 * i) * 1024;
                        add(n);
                        (p.allocate(n, s).unwrap(), n)
                    })
                    .collect();
                to_backward.send(acts).unwrap();
                for (ptr, n) in forward_in.recv().unwrap() {
                    p.deallocate(ptr, n, s).unwrap();
                    sub(n);
                }
            }
            drop(to_backward);
        });
        t.spawn(|| {
            // Backward: frees the activations in reverse, making gradients as it goes, and
            // keeps a little state of its own between them (never all free at once).
            let mut kept = Vec::new();
            for mut acts in backward_in.iter() {
                let mut grads = Vec::new();
                while let Some((ptr, n)) = acts.pop() {
                    p.deallocate(ptr, n, s).unwrap();
                    sub(n);
                    let g = n / 2;
                    add(g);
                    grads.push((p.allocate(g, s).unwrap(), g));
                    if acts.len() % 8 == 0 {
                        add(2 * MIB);
                        kept.push(p.allocate(2 * MIB, s).unwrap());
                    }
                }
                to_forward.send(grads).unwrap();
            }
            for ptr in kept {
                p.deallocate(ptr, 2 * MIB, s).unwrap();
            }
        });
    });
    assert_near_the_peak(&p, peak.into_inner());
}
