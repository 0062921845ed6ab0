//! `DeviceBuffer`: RMM's documented behaviour (sizes, resize within and beyond capacity,
//! reserve, shrink_to_fit, deep copy, deallocation stream, device recorded at construction)
//! plus what Rust adds (errors instead of undefined behaviour, no panics in drop, Send/Sync).

mod common;
mod container_common;

use std::sync::Arc;

use common::{MIB, device, pattern};
use container_common::{Recording, assert_send_sync, private_sim};
use rmm_allocator::backend::DevicePtr;
use rmm_allocator::backend::{SimBackend, SimConfig, SimMemoryMode};
use rmm_allocator::per_device::get_current_device_resource;
use rmm_allocator::resource::SharedResource;
use rmm_allocator::resource::{CudaAsyncMemoryResource, CudaMemoryResource};
use rmm_allocator::{
    ALLOCATION_ALIGNMENT, Device, DeviceBuffer, Error, Stream, StreamView, backend,
};
use rmm_allocator::{current_device, set_current_device};

#[test]
fn new_allocates_size_bytes_from_the_current_device_resource() {
    let s = Stream::new(device()).unwrap();
    let buf = DeviceBuffer::new(1000, s.view()).unwrap();
    assert_eq!(buf.size(), 1000);
    assert_eq!(buf.capacity(), 1000);
    assert!(!buf.is_empty());
    assert!(!buf.data().is_null());
    assert_eq!(buf.data().addr() % ALLOCATION_ALIGNMENT as u64, 0);
    assert_eq!(buf.stream(), s.view());
    assert_eq!(buf.device(), device());
    let current = get_current_device_resource().unwrap();
    assert!(Arc::ptr_eq(buf.memory_resource(), &current));
    assert!(format!("{buf:?}").contains("size: 1000"), "{buf:?}");
}

#[test]
fn new_in_uses_the_given_resource_and_stream() {
    let d = device();
    let rec = Recording::new(d);
    let s = Stream::new(d).unwrap();
    let buf = DeviceBuffer::new_in(4096, s.view(), rec.shared()).unwrap();
    assert_eq!(rec.allocations(), vec![(buf.data(), 4096, s.view())]);
    let ptr = buf.data();
    drop(buf);
    assert_eq!(
        rec.deallocations(),
        vec![(ptr, 4096, s.view(), current_device())]
    );
}

#[test]
fn a_zero_byte_buffer_allocates_nothing() {
    let rec = Recording::new(device());
    let mut buf = DeviceBuffer::new_in(0, StreamView::DEFAULT, rec.shared()).unwrap();
    assert!(buf.is_empty());
    assert!(buf.data().is_null());
    assert_eq!((buf.size(), buf.capacity()), (0, 0));
    assert_eq!(buf.to_vec(StreamView::DEFAULT).unwrap(), Vec::<u8>::new());
    buf.shrink_to_fit(StreamView::DEFAULT).unwrap();
    drop(buf);
    assert!(rec.calls().is_empty(), "{:?}", rec.calls());
}

#[test]
fn bytes_from_the_host_round_trip() {
    let s = Stream::new(device()).unwrap();
    for (i, len) in [1usize, 255, 4096, 2 * MIB + 3].into_iter().enumerate() {
        let data = pattern(len, 7 + i as u64);
        let buf = DeviceBuffer::from_host(&data, s.view()).unwrap();
        assert_eq!(buf.size(), len);
        assert_eq!(buf.to_vec(s.view()).unwrap(), data, "{len} B");
        let mut back = vec![0u8; len];
        buf.copy_to_host(&mut back, s.view()).unwrap();
        assert_eq!(back, data);
    }
}

#[test]
fn copies_are_ordered_after_work_queued_on_the_stream() {
    let d = device();
    let s = Stream::new(d).unwrap();
    let mut buf = DeviceBuffer::new(8 * MIB, s.view()).unwrap();
    for round in 1..=8u8 {
        d.memset_async(buf.data(), round, buf.size(), s.view())
            .unwrap();
    }
    // The read waits for the queued memsets, with no explicit synchronization.
    assert!(buf.to_vec(s.view()).unwrap().iter().all(|&b| b == 8));
    // And a write from the host lands after them.
    d.memset_async(buf.data(), 0xEE, buf.size(), s.view())
        .unwrap();
    let data = pattern(8 * MIB, 3);
    buf.copy_from_host(&data, s.view()).unwrap();
    assert_eq!(buf.to_vec(s.view()).unwrap(), data);
}

#[test]
fn host_copies_of_the_wrong_length_are_errors() {
    let mut buf = DeviceBuffer::new(16, StreamView::DEFAULT).unwrap();
    let e = buf
        .copy_from_host(&[0u8; 17], StreamView::DEFAULT)
        .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument { what: "src.len()", value, .. } if value == "17"),
        "{e}"
    );
    assert!(e.to_string().contains("16 bytes"), "{e}");
    let mut small = [0u8; 3];
    assert!(buf.copy_to_host(&mut small, StreamView::DEFAULT).is_err());
}

#[test]
fn from_device_copies_device_bytes_on_the_stream() {
    let d = device();
    let s = Stream::new(d).unwrap();
    let data = pattern(10_000, 11);
    let src = DeviceBuffer::from_host(&data, s.view()).unwrap();
    let copy = DeviceBuffer::from_device(src.data().offset(100), 5000, s.view()).unwrap();
    assert_eq!(copy.size(), 5000);
    assert_eq!(copy.to_vec(s.view()).unwrap(), data[100..5100]);
}

#[test]
fn deep_copy_copies_size_bytes_with_the_given_stream_and_resource() {
    let d = device();
    let s = Stream::new(d).unwrap();
    let rec = Recording::new(d);
    let data = pattern(3000, 5);
    let mut src = DeviceBuffer::from_host(&data, s.view()).unwrap();
    src.reserve(8000, s.view()).unwrap();
    assert_eq!((src.size(), src.capacity()), (3000, 8000));
    let copy = src.deep_copy_in(s.view(), rec.shared()).unwrap();
    assert_eq!((copy.size(), copy.capacity()), (3000, 3000));
    assert_eq!(rec.allocations(), vec![(copy.data(), 3000, s.view())]);
    assert_ne!(copy.data(), src.data());
    assert_eq!(copy.stream(), s.view());
    assert_eq!(copy.to_vec(s.view()).unwrap(), data);
    // The copies are independent.
    src.copy_from_host(&[0u8; 3000], s.view()).unwrap();
    assert_eq!(copy.to_vec(s.view()).unwrap(), data);
    // The default resource is the current device's, as in RMM.
    let other = copy.deep_copy(s.view()).unwrap();
    let current = get_current_device_resource().unwrap();
    assert!(Arc::ptr_eq(other.memory_resource(), &current));
    assert_eq!(other.to_vec(s.view()).unwrap(), data);
}

#[test]
fn the_source_of_a_deep_copy_may_be_dropped_at_once_on_another_stream() {
    // A stream-ordered resource reuses freed memory in stream order; the source's stream is
    // made to wait for the copy, so freeing the source cannot let its bytes be reused early.
    let d = device();
    let mr: SharedResource = Arc::new(CudaAsyncMemoryResource::new(d).unwrap());
    let a = Stream::new(d).unwrap();
    let b = Stream::new(d).unwrap();
    let len = 16 * MIB;
    let data = pattern(len, 21);
    for _ in 0..4 {
        let src = DeviceBuffer::from_host_in(&data, a.view(), Arc::clone(&mr)).unwrap();
        // Keep `b` busy so the copy is still queued when the source goes.
        let scratch = DeviceBuffer::new_in(len, b.view(), Arc::clone(&mr)).unwrap();
        for v in 0..8 {
            d.memset_async(scratch.data(), v, len, b.view()).unwrap();
        }
        let copy = src.deep_copy_in(b.view(), Arc::clone(&mr)).unwrap();
        drop(src);
        // Reuse on `a` scribbles over whatever the source's memory became.
        let reuse = DeviceBuffer::new_in(len, a.view(), Arc::clone(&mr)).unwrap();
        d.memset_async(reuse.data(), 0xAB, len, a.view()).unwrap();
        assert_eq!(copy.to_vec(b.view()).unwrap(), data);
        drop((scratch, reuse));
    }
}

#[test]
fn resize_within_capacity_changes_only_the_size() {
    let d = device();
    let rec = Recording::new(d);
    let s = Stream::new(d).unwrap();
    let t = Stream::new(d).unwrap();
    let data = pattern(1000, 1);
    let mut buf = DeviceBuffer::from_host_in(&data, s.view(), rec.shared()).unwrap();
    let ptr = buf.data();
    rec.clear();
    buf.resize(10, t.view()).unwrap();
    assert_eq!((buf.size(), buf.capacity(), buf.data()), (10, 1000, ptr));
    assert_eq!(buf.stream(), t.view(), "resize sets the stream");
    buf.resize(1000, s.view()).unwrap();
    assert_eq!((buf.size(), buf.capacity(), buf.data()), (1000, 1000, ptr));
    assert!(rec.calls().is_empty(), "{:?}", rec.calls());
    // Nothing was copied or lost: the bytes are still there.
    assert_eq!(buf.to_vec(s.view()).unwrap(), data);
    buf.resize(0, s.view()).unwrap();
    assert!(buf.is_empty());
    assert_eq!(buf.capacity(), 1000);
}

#[test]
fn resize_beyond_capacity_reallocates_exactly_and_keeps_the_contents() {
    let d = device();
    let rec = Recording::new(d);
    let s = Stream::new(d).unwrap();
    let t = Stream::new(d).unwrap();
    let data = pattern(1000, 2);
    let mut buf = DeviceBuffer::from_host_in(&data, s.view(), rec.shared()).unwrap();
    let old = buf.data();
    rec.clear();
    buf.resize(5000, t.view()).unwrap();
    assert_eq!((buf.size(), buf.capacity()), (5000, 5000));
    assert_ne!(buf.data(), old);
    assert_eq!(buf.stream(), t.view());
    assert_eq!(
        rec.allocations(),
        vec![(buf.data(), 5000, t.view())],
        "one allocation of exactly the new size, on the new stream"
    );
    assert_eq!(
        rec.deallocations(),
        vec![(old, 1000, t.view(), current_device())],
        "the old allocation goes back on the new stream"
    );
    assert_eq!(buf.to_vec(t.view()).unwrap()[..1000], data[..]);
}

#[test]
fn reserve_grows_the_capacity_and_keeps_size_and_contents() {
    let d = device();
    let rec = Recording::new(d);
    let s = Stream::new(d).unwrap();
    let data = pattern(300, 3);
    let mut buf = DeviceBuffer::from_host_in(&data, s.view(), rec.shared()).unwrap();
    rec.clear();
    buf.reserve(100, s.view()).unwrap();
    assert_eq!((buf.size(), buf.capacity()), (300, 300));
    assert!(rec.calls().is_empty(), "reserving less is a no-op");
    buf.reserve(4096, s.view()).unwrap();
    assert_eq!((buf.size(), buf.capacity()), (300, 4096));
    assert_eq!(rec.allocations().len(), 1);
    assert_eq!(rec.deallocations().len(), 1);
    assert_eq!(buf.to_vec(s.view()).unwrap(), data);
    // Growing within the reserved capacity allocates nothing more.
    rec.clear();
    buf.resize(4000, s.view()).unwrap();
    assert!(rec.calls().is_empty());
}

#[test]
fn shrink_to_fit_copies_into_an_allocation_of_exactly_the_size() {
    let d = device();
    let rec = Recording::new(d);
    let s = Stream::new(d).unwrap();
    let t = Stream::new(d).unwrap();
    let data = pattern(10_000, 4);
    let mut buf = DeviceBuffer::from_host_in(&data, s.view(), rec.shared()).unwrap();
    buf.shrink_to_fit(s.view()).unwrap();
    let old = buf.data();
    rec.clear();
    assert!(rec.calls().is_empty(), "size == capacity: no-op");
    buf.resize(2500, s.view()).unwrap();
    buf.shrink_to_fit(t.view()).unwrap();
    assert_eq!((buf.size(), buf.capacity()), (2500, 2500));
    assert_eq!(buf.stream(), t.view());
    assert_eq!(rec.allocations(), vec![(buf.data(), 2500, t.view())]);
    assert_eq!(
        rec.deallocations(),
        vec![(old, 10_000, t.view(), current_device())]
    );
    assert_eq!(buf.to_vec(t.view()).unwrap(), data[..2500]);
    // Shrinking an empty buffer gives the allocation back and leaves a null pointer.
    buf.resize(0, t.view()).unwrap();
    buf.shrink_to_fit(t.view()).unwrap();
    assert!(buf.data().is_null());
    assert_eq!(buf.capacity(), 0);
    rec.clear();
    drop(buf);
    assert!(rec.calls().is_empty(), "nothing left to give back");
}

#[test]
fn memory_goes_back_on_the_stream_most_recently_set() {
    let d = device();
    let rec = Recording::new(d);
    let s = Stream::new(d).unwrap();
    let t = Stream::new(d).unwrap();
    let u = Stream::new(d).unwrap();

    let mut buf = DeviceBuffer::new_in(512, s.view(), rec.shared()).unwrap();
    buf.set_stream(t.view());
    assert_eq!(buf.stream(), t.view());
    let p = buf.data();
    drop(buf);
    assert_eq!(
        rec.deallocations(),
        vec![(p, 512, t.view(), current_device())]
    );

    // A later reallocating call's stream replaces the one set.
    rec.clear();
    let mut buf = DeviceBuffer::new_in(512, s.view(), rec.shared()).unwrap();
    buf.set_stream(t.view());
    buf.resize(100, u.view()).unwrap();
    let p = buf.data();
    drop(buf);
    assert_eq!(
        rec.deallocations(),
        vec![(p, 512, u.view(), current_device())]
    );

    // Copies, reads and deep copies do not change it.
    rec.clear();
    let mut buf = DeviceBuffer::new_in(64, s.view(), rec.shared()).unwrap();
    buf.copy_from_host(&[1; 64], t.view()).unwrap();
    buf.to_vec(u.view()).unwrap();
    let copy = buf.deep_copy(u.view()).unwrap();
    assert_eq!(buf.stream(), s.view());
    let p = buf.data();
    drop(buf);
    assert_eq!(
        rec.deallocations(),
        vec![(p, 64, s.view(), current_device())]
    );
    drop(copy);
}

#[test]
fn memory_goes_back_with_the_device_recorded_at_construction_made_current() {
    let count = backend::global().unwrap().device_count();
    if count < 2 {
        common::skip(
            "memory_goes_back_with_the_device_recorded_at_construction_made_current",
            &format!("needs 2 devices to switch between; the backend has {count}"),
        );
        return;
    }
    let d1 = Device::new(1).unwrap();
    let rec = Recording::new(d1);
    let s = Stream::new(d1).unwrap();
    set_current_device(1).unwrap();
    let buf = DeviceBuffer::new_in(1 << 20, s.view(), rec.shared()).unwrap();
    assert_eq!(buf.device(), d1);
    assert_eq!(buf.construction_device(), 1);
    set_current_device(0).unwrap();
    let p = buf.data();
    drop(buf);
    assert_eq!(
        rec.deallocations(),
        vec![(p, 1 << 20, s.view(), 1)],
        "device 1 is current while its memory is given back"
    );
    assert_eq!(current_device(), 0, "the previous device is restored");

    // Reallocations give the old memory back the same way.
    rec.clear();
    set_current_device(1).unwrap();
    let mut buf = DeviceBuffer::new_in(100, s.view(), rec.shared()).unwrap();
    set_current_device(0).unwrap();
    buf.resize(200, s.view()).unwrap();
    assert_eq!(rec.deallocations()[0].3, 1);
    assert_eq!(current_device(), 0);

    // A thread whose current device is 0 drops it: device 1 is made current there too.
    rec.clear();
    std::thread::spawn(move || {
        assert_eq!(current_device(), 0);
        drop(buf);
        assert_eq!(current_device(), 0);
    })
    .join()
    .unwrap();
    assert_eq!(rec.deallocations()[0].3, 1);

    // As in RMM, the device recorded is the current one, not the resource's: a buffer made
    // with device 0 current from a device-1 resource is given back with device 0 current.
    rec.clear();
    let buf = DeviceBuffer::new_in(100, s.view(), rec.shared()).unwrap();
    assert_eq!((buf.device(), buf.construction_device()), (d1, 0));
    set_current_device(1).unwrap();
    drop(buf);
    assert_eq!(rec.deallocations()[0].3, 0);
    assert_eq!(current_device(), 1);
}

#[test]
fn the_default_resource_follows_the_current_device() {
    let count = backend::global().unwrap().device_count();
    if count < 2 {
        common::skip(
            "the_default_resource_follows_the_current_device",
            &format!("needs 2 devices; the backend has {count}"),
        );
        return;
    }
    set_current_device(1).unwrap();
    let buf = DeviceBuffer::new(256, StreamView::DEFAULT).unwrap();
    set_current_device(0).unwrap();
    assert_eq!(buf.device().ordinal(), 1);
    assert_eq!(buf.memory_resource().device().ordinal(), 1);
    assert_eq!(buf.to_vec(StreamView::DEFAULT).unwrap().len(), 256);
}

#[test]
fn an_allocation_failure_is_an_out_of_memory_error() {
    let (sim, d) = private_sim();
    let mr: SharedResource = Arc::new(CudaMemoryResource::new(d));
    let e = DeviceBuffer::new_in(2 << 30, StreamView::DEFAULT, Arc::clone(&mr)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfMemory {
                requested,
                ..
            } if requested == 2 << 30
        ),
        "{e}"
    );
    // A failed resize leaves the buffer as it was.
    let data = pattern(1000, 9);
    let mut buf = DeviceBuffer::from_host_in(&data, StreamView::DEFAULT, Arc::clone(&mr)).unwrap();
    let p = buf.data();
    sim.fail_nth_allocation(0, 1).unwrap();
    assert!(
        buf.resize(5000, StreamView::DEFAULT)
            .unwrap_err()
            .is_out_of_memory()
    );
    assert_eq!((buf.size(), buf.capacity(), buf.data()), (1000, 1000, p));
    assert_eq!(buf.to_vec(StreamView::DEFAULT).unwrap(), data);
    drop(buf);
    assert_eq!(sim.live_allocations(0), 0);
}

#[test]
fn a_failed_copy_during_a_resize_gives_the_new_allocation_back() {
    let (sim, d) = private_sim();
    let mr: SharedResource = Arc::new(CudaMemoryResource::new(d));
    let s = Stream::new(d).unwrap();
    let data = pattern(4096, 10);
    let mut buf = DeviceBuffer::from_host_in(&data, s.view(), Arc::clone(&mr)).unwrap();
    sim.fail_nth_copy(0, 1).unwrap();
    let e = buf.reserve(1 << 20, s.view()).unwrap_err();
    assert!(
        matches!(e, Error::InjectedFault { what: "copy", .. }),
        "{e}"
    );
    assert_eq!((buf.size(), buf.capacity()), (4096, 4096));
    assert_eq!(
        sim.live_allocations(0),
        1,
        "the new allocation was given back"
    );
    assert_eq!(buf.to_vec(s.view()).unwrap(), data);
    drop(buf);
    assert_eq!(sim.live_allocations(0), 0);
}

#[test]
fn a_failing_deallocation_in_drop_is_logged_not_panicked() {
    let d = device();
    let rec = Recording::failing_deallocate(d);
    let buf = DeviceBuffer::new_in(1024, StreamView::DEFAULT, rec.shared()).unwrap();
    let mut grown = DeviceBuffer::new_in(10, StreamView::DEFAULT, rec.shared()).unwrap();
    // A resize whose old allocation cannot be given back still succeeds.
    grown.resize(20, StreamView::DEFAULT).unwrap();
    assert_eq!(grown.capacity(), 20);
    drop(buf);
    drop(grown);
    assert_eq!(rec.deallocations().len(), 3);
}

#[test]
fn a_buffer_on_a_backend_of_its_own_is_given_back_without_switching_devices() {
    // Device 3 of a private backend is no device of the process-wide backend (2 simulated
    // devices, or the GPUs of the machine), so there is no current device to switch to.
    let sim = SimBackend::leak(SimConfig {
        devices: 4,
        capacity: 1 << 30,
        mode: SimMemoryMode::Backed,
    })
    .unwrap();
    let d = Device::on(sim, 3).unwrap();
    let mr: SharedResource = Arc::new(CudaMemoryResource::new(d));
    let data = pattern(1 << 20, 13);
    let mut buf = DeviceBuffer::from_host_in(&data, StreamView::DEFAULT, mr).unwrap();
    buf.resize(2 << 20, StreamView::DEFAULT).unwrap();
    assert_eq!(sim.live_allocations(3), 1);
    assert_eq!(
        buf.to_vec(StreamView::DEFAULT).unwrap()[..1 << 20],
        data[..]
    );
    drop(buf);
    assert_eq!(sim.live_allocations(3), 0);
    assert_eq!(current_device(), 0);
}

#[test]
fn buffers_are_send_and_sync_and_can_be_dropped_on_another_thread() {
    assert_send_sync::<DeviceBuffer>();
    let d = device();
    let rec = Recording::new(d);
    let data = pattern(777, 12);
    let buf = DeviceBuffer::from_host_in(&data, StreamView::DEFAULT, rec.shared()).unwrap();
    let shared = Arc::new(buf);
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let b = Arc::clone(&shared);
            std::thread::spawn(move || b.to_vec(StreamView::DEFAULT).unwrap())
        })
        .collect();
    for r in readers {
        assert_eq!(r.join().unwrap(), data);
    }
    let buf = Arc::try_unwrap(shared).unwrap();
    std::thread::spawn(move || drop(buf)).join().unwrap();
    assert_eq!(rec.deallocations().len(), 1);
}

#[test]
fn data_is_a_device_pointer_not_host_memory() {
    // The only way to the bytes is a copy; the pointer itself is an opaque address.
    let buf = DeviceBuffer::from_host(&[1, 2, 3], StreamView::DEFAULT).unwrap();
    let p: DevicePtr = buf.data();
    assert!(!p.is_null());
    assert_eq!(buf.to_vec(StreamView::DEFAULT).unwrap(), [1, 2, 3]);
}

#[test]
fn containers_can_borrow_their_resource_instead_of_owning_it() {
    use rmm_allocator::ResourceHandle;
    use rmm_allocator::resource::DeviceMemoryResource;
    use rmm_allocator::{DeviceScalar, DeviceUVector};

    let d = device();
    let s = Stream::new(d).unwrap();
    // A concrete resource borrowed: statically dispatched, no reference counting.
    let plain = CudaMemoryResource::new(d);
    let mut buf = DeviceBuffer::new_in(100, s.view(), &plain).unwrap();
    buf.copy_from_host(&[7; 100], s.view()).unwrap();
    buf.resize(300, s.view()).unwrap();
    assert_eq!(buf.to_vec(s.view()).unwrap()[..100], [7; 100]);
    assert!(std::ptr::eq(*buf.memory_resource(), &plain));
    // A trait object borrowed.
    let rec = Recording::new(d);
    let dyn_ref: &dyn DeviceMemoryResource = &*rec;
    let v = DeviceUVector::<u32, _>::from_host_in(&[1, 2, 3], s.view(), dyn_ref).unwrap();
    let x = DeviceScalar::<u8, _>::with_value_in(9, s.view(), dyn_ref).unwrap();
    assert_eq!(v.memory_resource().resource().name(), "Recording");
    // A deep copy may own what the original borrowed.
    let owned: DeviceUVector<u32> = v.deep_copy(s.view()).unwrap();
    let p = v.data();
    drop(v);
    assert_eq!(x.value(s.view()).unwrap(), 9);
    drop(x);
    assert_eq!(rec.deallocations().len(), 2);
    assert!(rec.deallocations().iter().any(|&(q, ..)| q == p));
    assert_eq!(owned.to_vec(s.view()).unwrap(), [1, 2, 3]);
    assert_send_sync::<DeviceBuffer<&CudaMemoryResource>>();
    assert_send_sync::<DeviceUVector<u64, &dyn DeviceMemoryResource>>();
}
