//! The simulated device itself: backed and unbacked memory, capacity, stream order, events,
//! and fault injection. These build their own simulated backends, so they run the same on
//! any machine.

use std::time::Duration;

use rmm_allocator::backend::{Backend, SimBackend, SimConfig, SimMemoryMode};
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::{CudaAsyncMemoryResource, CudaMemoryResource, ManagedMemoryResource};
use rmm_allocator::{Device, Error, Event, Stream, StreamView};

const GIB: usize = 1 << 30;

fn sim(devices: u32, capacity: usize, mode: SimMemoryMode) -> &'static SimBackend {
    SimBackend::leak(SimConfig {
        devices,
        capacity,
        mode,
    })
    .unwrap()
}

#[test]
fn unbacked_mode_simulates_a_device_larger_than_this_machine() {
    let b = sim(1, 80 * GIB, SimMemoryMode::Unbacked);
    let d = Device::on(b, 0).unwrap();
    let mr = CudaMemoryResource::new(d);
    let a = mr.allocate(30 * GIB, StreamView::DEFAULT).unwrap();
    let c = mr.allocate(30 * GIB, StreamView::DEFAULT).unwrap();
    assert_eq!(d.mem_info().unwrap().free, 20 * GIB);
    let e = mr.allocate(30 * GIB, StreamView::DEFAULT).unwrap_err();
    match e {
        Error::OutOfMemory {
            requested,
            free,
            total,
            ..
        } => {
            assert_eq!((requested, free, total), (30 * GIB, 20 * GIB, 80 * GIB));
        }
        other => panic!("expected OutOfMemory, got {other}"),
    }
    // Copies are checked against the allocation table but move nothing.
    d.copy_to_device(a.offset(30 * GIB - 4), &[1, 2, 3, 4])
        .unwrap();
    assert!(
        d.copy_to_device(a.offset(30 * GIB - 3), &[1, 2, 3, 4])
            .is_err()
    );
    let mut back = [9u8; 4];
    d.copy_to_host(&mut back, a).unwrap();
    assert_eq!(back, [0; 4], "unbacked memory reads as zeros");
    mr.deallocate(a, 30 * GIB, StreamView::DEFAULT).unwrap();
    mr.deallocate(c, 30 * GIB, StreamView::DEFAULT).unwrap();
    assert_eq!(d.mem_info().unwrap().free, 80 * GIB);
    assert_eq!(b.live_allocations(0), 0);
}

#[test]
fn unbacked_addresses_are_reused_without_overlap() {
    let b = sim(2, GIB, SimMemoryMode::Unbacked);
    let d = Device::on(b, 1).unwrap();
    let mr = CudaMemoryResource::new(d);
    let mut live = Vec::new();
    for round in 0..20_000usize {
        let bytes = 1 + (round * 104_729) % (8 << 20);
        match mr.allocate(bytes, StreamView::DEFAULT) {
            Ok(p) => live.push((p, bytes)),
            Err(e) => assert!(e.is_out_of_memory(), "{e}"),
        }
        if live.len() > 50 || round % 3 == 0 {
            let (p, n) = live.swap_remove(round % live.len().max(1));
            mr.deallocate(p, n, StreamView::DEFAULT).unwrap();
        }
    }
    live.sort();
    for w in live.windows(2) {
        assert!(w[0].0.addr() + w[0].1 as u64 <= w[1].0.addr());
    }
}

#[test]
fn capacity_counts_every_kind_of_device_allocation() {
    let b = sim(1, GIB, SimMemoryMode::Backed);
    let d = Device::on(b, 0).unwrap();
    let plain = CudaMemoryResource::new(d);
    let managed = ManagedMemoryResource::new(d).unwrap();
    let asynch = CudaAsyncMemoryResource::new(d).unwrap();
    let a = plain.allocate(400 << 20, StreamView::DEFAULT).unwrap();
    let m = managed.allocate(400 << 20, StreamView::DEFAULT).unwrap();
    assert!(
        asynch
            .allocate(400 << 20, StreamView::DEFAULT)
            .unwrap_err()
            .is_out_of_memory()
    );
    let x = asynch.allocate(200 << 20, StreamView::DEFAULT).unwrap();
    assert_eq!(asynch.reserved_bytes().unwrap(), 200 << 20);
    for (mr, p) in [
        (&plain as &dyn DeviceMemoryResource, a),
        (&managed, m),
        (&asynch, x),
    ] {
        mr.deallocate(p, 0, StreamView::DEFAULT).unwrap();
    }
    d.synchronize().unwrap();
    assert_eq!(d.mem_info().unwrap().free, GIB);
}

#[test]
fn injected_allocation_failures() {
    let b = sim(2, GIB, SimMemoryMode::Unbacked);
    let d = Device::on(b, 0).unwrap();
    let mr = CudaMemoryResource::new(d);
    b.fail_nth_allocation(0, 3).unwrap();
    let p1 = mr.allocate(1024, StreamView::DEFAULT).unwrap();
    let p2 = mr.allocate(1024, StreamView::DEFAULT).unwrap();
    let e = mr.allocate(1024, StreamView::DEFAULT).unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfMemory {
                requested: 1024,
                ..
            }
        ),
        "{e}"
    );
    let p4 = mr.allocate(1024, StreamView::DEFAULT).unwrap();
    // Device 1 is unaffected by device 0's faults.
    let other = CudaMemoryResource::new(Device::on(b, 1).unwrap());
    b.fail_allocations_above(0, 1 << 20).unwrap();
    assert!(
        mr.allocate((1 << 20) + 1, StreamView::DEFAULT)
            .unwrap_err()
            .is_out_of_memory()
    );
    let small = mr.allocate(1 << 20, StreamView::DEFAULT).unwrap();
    let big = other.allocate(64 << 20, StreamView::DEFAULT).unwrap();
    b.clear_faults(0).unwrap();
    let big0 = mr.allocate(64 << 20, StreamView::DEFAULT).unwrap();
    for p in [p1, p2, p4, small, big0] {
        mr.deallocate(p, 0, StreamView::DEFAULT).unwrap();
    }
    other.deallocate(big, 0, StreamView::DEFAULT).unwrap();
}

#[test]
fn injected_copy_failure() {
    let b = sim(1, GIB, SimMemoryMode::Backed);
    let d = Device::on(b, 0).unwrap();
    let mr = CudaMemoryResource::new(d);
    let p = mr.allocate(64, StreamView::DEFAULT).unwrap();
    b.fail_nth_copy(0, 2).unwrap();
    d.copy_to_device(p, &[1; 64]).unwrap();
    let e = d.copy_to_device(p, &[2; 64]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InjectedFault {
                what: "copy",
                device: 0
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("simulated fault"), "{e}");
    let mut back = [0u8; 64];
    d.copy_to_host(&mut back, p).unwrap();
    assert_eq!(back, [1; 64], "the failed copy wrote nothing");
    mr.deallocate(p, 64, StreamView::DEFAULT).unwrap();
}

#[test]
fn injected_pin_and_file_write_failures_are_counted_and_leave_nothing_pinned() {
    let b = sim(2, GIB, SimMemoryMode::Backed);
    let before = b.counts(0).unwrap();
    // The second pin fails: the first pool is pinned, the second fails and pins nothing.
    b.fail_nth_pin(2);
    let first = rmm_allocator::resource::PinnedHostPool::on(b, 4 << 20).unwrap();
    let e = rmm_allocator::resource::PinnedHostPool::on(b, 4 << 20).unwrap_err();
    assert!(
        e.to_string().contains("injected failure of this pin"),
        "{e}"
    );
    assert_eq!(
        b.pinned_host_bytes(),
        first.capacity(),
        "the failed pool pinned nothing"
    );
    drop(first);
    assert_eq!(b.pinned_host_bytes(), 0);
    let pins = b.counts(0).unwrap().since(&before).pins;
    assert_eq!(pins, 2);
    // Pins are the backend's: device 1 counts them too.
    assert_eq!(b.counts(1).unwrap().pins, b.counts(0).unwrap().pins);
    // File writes: the N-th on a device fails, on that device only; clearing removes it.
    b.fail_nth_file_write(0, 2).unwrap();
    b.before_file_write(1).unwrap();
    b.before_file_write(0).unwrap();
    let e = b.before_file_write(0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InjectedFault {
                what: "spill file write",
                device: 0
            }
        ),
        "{e}"
    );
    b.before_file_write(0).unwrap();
    b.fail_nth_file_write(0, 1).unwrap();
    b.fail_nth_pin(1);
    b.clear_faults(0).unwrap();
    b.before_file_write(0).unwrap();
    drop(rmm_allocator::resource::PinnedHostPool::on(b, 1 << 20).unwrap());
    let c = b.counts(0).unwrap().since(&before);
    assert_eq!((c.pins, c.file_writes), (3, 4), "{c:?}");
    assert_eq!(b.counts(1).unwrap().file_writes, 1);
}

#[test]
fn a_held_stream_runs_nothing_until_released_and_events_see_it() {
    let b = sim(1, GIB, SimMemoryMode::Backed);
    let d = Device::on(b, 0).unwrap();
    let mr = CudaMemoryResource::new(d);
    let s = Stream::new(d).unwrap();
    let p = mr.allocate(1 << 20, StreamView::DEFAULT).unwrap();
    d.memset(p, 1, 1 << 20).unwrap();
    let gate = b.hold_stream(0, s.view().raw()).unwrap();
    d.memset_async(p, 2, 1 << 20, s.view()).unwrap();
    let done = Event::new(d).unwrap();
    done.record(s.view()).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(!done.is_complete().unwrap());
    assert!(!s.is_idle().unwrap());
    let mut back = vec![0u8; 16];
    d.copy_to_host(&mut back, p).unwrap();
    assert_eq!(
        back,
        vec![1; 16],
        "queued work ran while the stream was held"
    );
    // Another stream that waits on the event is held too.
    let t = Stream::new(d).unwrap();
    t.wait(&done).unwrap();
    d.memset_async(p, 3, 16, t.view()).unwrap();
    let t_done = Event::new(d).unwrap();
    t_done.record(t.view()).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(!t_done.is_complete().unwrap());
    gate.open();
    t.synchronize().unwrap();
    assert!(done.is_complete().unwrap() && t_done.is_complete().unwrap());
    d.copy_to_host(&mut back, p).unwrap();
    assert_eq!(
        back,
        vec![3; 16],
        "stream order across the event was broken"
    );
    mr.deallocate(p, 1 << 20, StreamView::DEFAULT).unwrap();
}

#[test]
fn a_delayed_stream_keeps_async_frees_pending() {
    let b = sim(1, GIB, SimMemoryMode::Backed);
    let d = Device::on(b, 0).unwrap();
    let mr = CudaAsyncMemoryResource::new(d).unwrap();
    let s = Stream::new(d).unwrap();
    let p = mr.allocate(512 << 20, s.view()).unwrap();
    b.delay_stream(0, s.view().raw(), Duration::from_millis(50))
        .unwrap();
    mr.deallocate(p, 512 << 20, s.view()).unwrap();
    assert_eq!(
        d.mem_info().unwrap().free,
        512 << 20,
        "freed before the stream reached the free"
    );
    s.synchronize().unwrap();
    assert_eq!(d.mem_info().unwrap().free, GIB);
}

#[test]
fn streams_and_events_belong_to_their_device() {
    let b = sim(2, GIB, SimMemoryMode::Unbacked);
    let s = b.stream_create(0).unwrap();
    assert!(b.stream_synchronize(1, s).is_err());
    let e = b.event_create(1).unwrap();
    assert!(b.event_record(1, e, s).is_err());
    b.stream_destroy(0, s).unwrap();
    assert!(
        b.stream_synchronize(0, s).is_err(),
        "a destroyed stream is gone"
    );
    assert!(
        b.stream_destroy(0, 0).is_err(),
        "the default stream cannot be destroyed"
    );
    assert!(matches!(
        b.properties(2),
        Err(Error::NoSuchDevice {
            requested: 2,
            count: 2,
            ..
        })
    ));
}

#[test]
fn pinned_host_memory_is_accounted() {
    let b = sim(1, GIB, SimMemoryMode::Backed);
    let p = b.malloc_host(1 << 20).unwrap();
    assert_eq!(b.pinned_host_bytes(), 1 << 20);
    let mut v = vec![0u8; 4096];
    // SAFETY: `p` came from malloc_host; `v` outlives its registration.
    unsafe {
        b.host_register(v.as_mut_ptr(), v.len()).unwrap();
        assert_eq!(b.pinned_host_bytes(), (1 << 20) + 4096);
        assert!(
            b.host_register(v.as_mut_ptr(), v.len()).is_err(),
            "registered twice"
        );
        b.host_unregister(v.as_mut_ptr()).unwrap();
        b.free_host(p).unwrap();
        assert!(b.free_host(p).is_err(), "freed twice");
    }
    assert_eq!(b.pinned_host_bytes(), 0);
}

#[test]
fn configuration_is_checked() {
    assert!(
        SimBackend::new(SimConfig {
            devices: 0,
            capacity: GIB,
            mode: SimMemoryMode::Backed
        })
        .is_err()
    );
    let e = SimBackend::new(SimConfig {
        devices: 1,
        capacity: 0,
        mode: SimMemoryMode::Backed,
    })
    .unwrap_err();
    assert!(e.to_string().contains("capacity"), "{e}");
    let b = sim(3, 5 * GIB, SimMemoryMode::Unbacked);
    assert_eq!(b.describe(), "sim (3 devices × 5.00 GiB, unbacked)");
    assert_eq!(
        b.properties(2).unwrap().uuid,
        "GPU-5111a7ed-0000-4000-8000-000000000002"
    );
}
