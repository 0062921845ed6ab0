//! Every device memory resource against the process-wide backend: sizes 0 B, 1 B, 255 B and
//! 1 GiB, alignment, data round trips, out-of-memory and equality.

mod common;

use common::{GIB, device, on_sim, pattern};
use rmm_allocator::backend::DevicePtr;
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::{CudaAsyncMemoryResource, CudaMemoryResource, ManagedMemoryResource};
use rmm_allocator::{ALLOCATION_ALIGNMENT, Error, Stream, StreamView};

fn resources() -> Vec<Box<dyn DeviceMemoryResource>> {
    let d = device();
    vec![
        Box::new(CudaMemoryResource::new(d)),
        Box::new(ManagedMemoryResource::new(d).expect("managed resource")),
        Box::new(CudaAsyncMemoryResource::new(d).expect("async resource")),
    ]
}

#[test]
fn zero_bytes_is_null_and_frees_cleanly() {
    for mr in resources() {
        let p = mr.allocate(0, StreamView::DEFAULT).unwrap();
        assert!(p.is_null(), "{}: 0 B gave {p}", mr.name());
        mr.deallocate(p, 0, StreamView::DEFAULT).unwrap();
    }
}

#[test]
fn small_sizes_are_aligned_and_keep_their_bytes() {
    let d = device();
    for mr in resources() {
        for (i, bytes) in [1usize, 255, 256, 257, 4097].into_iter().enumerate() {
            let p = mr.allocate(bytes, StreamView::DEFAULT).unwrap();
            assert!(!p.is_null());
            assert_eq!(
                p.addr() % ALLOCATION_ALIGNMENT as u64,
                0,
                "{}: {bytes} B at {p}",
                mr.name()
            );
            let data = pattern(bytes, i as u64 + 7);
            d.copy_to_device(p, &data).unwrap();
            let mut back = vec![0u8; bytes];
            d.copy_to_host(&mut back, p).unwrap();
            assert_eq!(back, data, "{}: {bytes} B did not round-trip", mr.name());
            mr.deallocate(p, bytes, StreamView::DEFAULT).unwrap();
        }
    }
}

#[test]
fn one_gibibyte_allocates_and_both_ends_are_writable() {
    let d = device();
    for mr in resources() {
        let p = mr.allocate(GIB, StreamView::DEFAULT).unwrap();
        assert_eq!(p.addr() % ALLOCATION_ALIGNMENT as u64, 0);
        let head = pattern(4096, 1);
        let tail = pattern(4096, 2);
        d.copy_to_device(p, &head).unwrap();
        d.copy_to_device(p.offset(GIB - 4096), &tail).unwrap();
        let mut back = vec![0u8; 4096];
        d.copy_to_host(&mut back, p.offset(GIB - 4096)).unwrap();
        assert_eq!(back, tail, "{}", mr.name());
        d.copy_to_host(&mut back, p).unwrap();
        assert_eq!(back, head, "{}", mr.name());
        mr.deallocate(p, GIB, StreamView::DEFAULT).unwrap();
    }
}

#[test]
fn many_live_allocations_are_aligned_and_disjoint() {
    for mr in resources() {
        let mut live: Vec<(DevicePtr, usize)> = Vec::new();
        for i in 0..200usize {
            let bytes = 1 + (i * 7919) % 100_000;
            let p = mr.allocate(bytes, StreamView::DEFAULT).unwrap();
            assert_eq!(p.addr() % ALLOCATION_ALIGNMENT as u64, 0, "{}", mr.name());
            live.push((p, bytes));
        }
        let mut sorted = live.clone();
        sorted.sort();
        for w in sorted.windows(2) {
            assert!(
                w[0].0.addr() + w[0].1 as u64 <= w[1].0.addr(),
                "{}: overlap {:?}",
                mr.name(),
                w
            );
        }
        for (p, b) in live {
            mr.deallocate(p, b, StreamView::DEFAULT).unwrap();
        }
    }
}

#[test]
fn more_than_the_device_holds_is_an_out_of_memory_error() {
    let d = device();
    let total = d.mem_info().unwrap().total;
    let request = total + (1 << 20);
    let mut checked = vec![
        Box::new(CudaMemoryResource::new(d)) as Box<dyn DeviceMemoryResource>,
        Box::new(CudaAsyncMemoryResource::new(d).unwrap()),
    ];
    // Managed memory may oversubscribe a real GPU (and asking for more than it has can hang
    // the card), so it is only checked against the simulated capacity.
    if on_sim() {
        checked.push(Box::new(ManagedMemoryResource::new(d).unwrap()));
    }
    for mr in checked {
        match mr.allocate(request, StreamView::DEFAULT) {
            Err(Error::OutOfMemory {
                requested,
                device,
                total: t,
                resource,
                ..
            }) => {
                assert_eq!(requested, request);
                assert_eq!(device, 0);
                assert_eq!(t, total);
                assert_eq!(resource, mr.name());
            }
            other => panic!("{}: expected OutOfMemory, got {other:?}", mr.name()),
        }
        // The resource still works afterwards.
        let p = mr.allocate(1024, StreamView::DEFAULT).unwrap();
        mr.deallocate(p, 1024, StreamView::DEFAULT).unwrap();
    }
}

#[test]
fn async_resource_allocates_in_stream_order_on_its_own_stream() {
    let d = device();
    let mr = CudaAsyncMemoryResource::new(d).unwrap();
    let stream = Stream::new(d).unwrap();
    let data = pattern(1 << 20, 3);
    let p = mr.allocate(data.len(), stream.view()).unwrap();
    d.memset_async(p, 0xAB, data.len(), stream.view()).unwrap();
    stream.synchronize().unwrap();
    let mut back = vec![0u8; data.len()];
    d.copy_to_host(&mut back, p).unwrap();
    assert!(back.iter().all(|&b| b == 0xAB));
    mr.deallocate(p, data.len(), stream.view()).unwrap();
    stream.synchronize().unwrap();
    mr.release().unwrap();
}

#[test]
fn async_resource_release_gives_cached_memory_back() {
    let d = device();
    let mr = CudaAsyncMemoryResource::new(d).unwrap();
    let p = mr.allocate(256 << 20, StreamView::DEFAULT).unwrap();
    assert!(mr.reserved_bytes().unwrap() >= 256 << 20);
    mr.deallocate(p, 256 << 20, StreamView::DEFAULT).unwrap();
    mr.release().unwrap();
    assert_eq!(mr.reserved_bytes().unwrap(), 0);
}

#[test]
fn equality_follows_rmm() {
    let d = device();
    let a = CudaMemoryResource::new(d);
    let b = CudaMemoryResource::new(d);
    assert!(
        a.is_equal(&b),
        "two plain CUDA resources of one device are interchangeable"
    );
    let m1 = ManagedMemoryResource::new(d).unwrap();
    let m2 = ManagedMemoryResource::new(d).unwrap();
    assert!(m1.is_equal(&m2));
    assert!(!a.is_equal(&m1));
    let x = CudaAsyncMemoryResource::new(d).unwrap();
    let y = CudaAsyncMemoryResource::new(d).unwrap();
    assert!(x.is_equal(&x));
    assert!(!x.is_equal(&y), "each async resource owns its pool");
}

#[test]
fn memory_info_reports_the_device() {
    let d = device();
    let mr = CudaMemoryResource::new(d);
    let before = mr.memory_info().unwrap();
    assert!(before.total > 0 && before.free <= before.total);
    assert_eq!(before.total, d.properties().unwrap().total_memory);
}
