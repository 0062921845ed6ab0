//! `DeviceUVector<T>`: RMM's documented behaviour (uninitialized storage, element access,
//! resize/reserve/shrink_to_fit, release, deallocation stream) plus what Rust adds (out-of-range
//! errors, staged asynchronous sets that borrow nothing, ordering after its own sets).

mod common;
mod container_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytemuck::{Pod, Zeroable};
use common::{device, pattern};
use container_common::{Recording, assert_send_sync, open_later, private_sim};
use rmm_allocator::current_device;
use rmm_allocator::per_device::get_current_device_resource;
use rmm_allocator::resource::CudaMemoryResource;
use rmm_allocator::resource::SharedResource;
use rmm_allocator::{ALLOCATION_ALIGNMENT, DeviceBuffer, DeviceUVector, Error, Stream, StreamView};

#[derive(Debug, Clone, Copy, PartialEq, Pod, Zeroable)]
#[repr(C)]
struct Particle {
    position: [f32; 3],
    id: u32,
}

fn particle(i: u32) -> Particle {
    Particle {
        position: [i as f32, -(i as f32), 0.5],
        id: i,
    }
}

#[test]
fn new_allocates_room_for_len_uninitialized_elements() {
    let s = Stream::new(device()).unwrap();
    let v = DeviceUVector::<u64>::new(1000, s.view()).unwrap();
    assert_eq!((v.len(), v.capacity()), (1000, 1000));
    assert!(!v.is_empty());
    assert_eq!(v.data().addr() % ALLOCATION_ALIGNMENT as u64, 0);
    assert_eq!(v.stream(), s.view());
    assert_eq!(v.device(), device());
    assert!(Arc::ptr_eq(
        v.memory_resource(),
        &get_current_device_resource().unwrap()
    ));
    let rec = Recording::new(device());
    let w = DeviceUVector::<u16>::new_in(10, s.view(), rec.shared()).unwrap();
    assert_eq!(rec.allocations(), vec![(w.data(), 20, s.view())]);
    let empty = DeviceUVector::<u8>::new(0, s.view()).unwrap();
    assert!(empty.is_empty());
    assert_eq!(empty.to_vec(s.view()).unwrap(), Vec::<u8>::new());
}

#[test]
fn host_slices_round_trip() {
    let s = Stream::new(device()).unwrap();
    let data: Vec<u32> = (0..100_000u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let v = DeviceUVector::from_host(&data, s.view()).unwrap();
    assert_eq!(v.len(), data.len());
    assert_eq!(v.to_vec(s.view()).unwrap(), data);
    let mut back = vec![0u32; data.len()];
    v.copy_to_host(&mut back, s.view()).unwrap();
    assert_eq!(back, data);

    let mut w = DeviceUVector::<Particle>::new(64, s.view()).unwrap();
    let ps: Vec<Particle> = (0..64).map(particle).collect();
    w.copy_from_host(&ps, s.view()).unwrap();
    assert_eq!(w.to_vec(s.view()).unwrap(), ps);
    assert_eq!(w.element(63, s.view()).unwrap(), particle(63));
}

#[test]
fn host_copies_of_the_wrong_length_are_errors() {
    let mut v = DeviceUVector::<f64>::new(4, StreamView::DEFAULT).unwrap();
    let e = v
        .copy_from_host(&[1.0; 5], StreamView::DEFAULT)
        .unwrap_err();
    assert!(
        matches!(
            &e,
            Error::InvalidArgument {
                what: "src.len()",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("4 elements"), "{e}");
    let mut small = [0.0f64; 3];
    assert!(v.copy_to_host(&mut small, StreamView::DEFAULT).is_err());
}

#[test]
fn elements_are_set_and_read_one_at_a_time() {
    let s = Stream::new(device()).unwrap();
    let mut v = DeviceUVector::<i32>::new(10, s.view()).unwrap();
    for i in 0..10 {
        v.set_element(i, i as i32 * 11, s.view()).unwrap();
    }
    assert_eq!(v.element(3, s.view()).unwrap(), 33);
    assert_eq!(v.front_element(s.view()).unwrap(), 0);
    assert_eq!(v.back_element(s.view()).unwrap(), 99);
    assert_eq!(
        v.element_ptr(4).unwrap(),
        v.data().offset(4 * std::mem::size_of::<i32>())
    );
    v.set_element_to_zero_async(9, s.view()).unwrap();
    assert_eq!(v.back_element(s.view()).unwrap(), 0);
    v.set_element_async(5, -7, s.view()).unwrap();
    v.set_element_async(6, 0, s.view()).unwrap();
    assert_eq!(
        v.to_vec(s.view()).unwrap(),
        [0, 11, 22, 33, 44, -7, 0, 77, 88, 0]
    );
}

#[test]
fn an_index_out_of_range_is_an_error_not_undefined_behaviour() {
    let s = StreamView::DEFAULT;
    let mut v = DeviceUVector::<u32>::new(5, s).unwrap();
    v.copy_from_host(&[1, 2, 3, 4, 5], s).unwrap();
    let check = |e: Error, index: usize, len: usize| match e {
        Error::IndexOutOfRange {
            index: i,
            len: l,
            container,
            element_type,
        } => {
            assert_eq!((i, l), (index, len));
            assert_eq!(container, "DeviceUVector");
            assert_eq!(element_type, "u32");
        }
        other => panic!("expected IndexOutOfRange, got {other}"),
    };
    check(v.element(5, s).unwrap_err(), 5, 5);
    check(v.element(usize::MAX, s).unwrap_err(), usize::MAX, 5);
    check(v.set_element(7, 1, s).unwrap_err(), 7, 5);
    check(v.set_element_async(5, 1, s).unwrap_err(), 5, 5);
    check(v.set_element_async(5, 0, s).unwrap_err(), 5, 5);
    check(v.set_element_to_zero_async(6, s).unwrap_err(), 6, 5);
    check(v.element_ptr(5).unwrap_err(), 5, 5);
    let msg = v.element(5, s).unwrap_err().to_string();
    assert!(
        msg.contains("index 5 is out of range for a DeviceUVector<u32> of 5 element(s)"),
        "{msg}"
    );
    assert!(msg.contains("resize"), "{msg}");
    // Nothing was written by the failed calls.
    assert_eq!(v.to_vec(s).unwrap(), [1, 2, 3, 4, 5]);
    // Within capacity but beyond the length is out of range too.
    v.resize(2, s).unwrap();
    check(v.element(2, s).unwrap_err(), 2, 2);
    let empty = DeviceUVector::<u32>::new(0, s).unwrap();
    check(empty.front_element(s).unwrap_err(), 0, 0);
    check(empty.back_element(s).unwrap_err(), 0, 0);
}

#[test]
fn a_size_that_overflows_is_an_error() {
    let e = DeviceUVector::<u64>::new(usize::MAX / 4, StreamView::DEFAULT).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { what: "len", .. }),
        "{e}"
    );
    assert!(e.to_string().contains("overflows"), "{e}");
    let mut v = DeviceUVector::<u64>::new(1, StreamView::DEFAULT).unwrap();
    assert!(v.resize(usize::MAX, StreamView::DEFAULT).is_err());
    assert!(v.reserve(usize::MAX / 2, StreamView::DEFAULT).is_err());
    assert_eq!(v.len(), 1);
}

#[test]
fn an_async_set_does_not_borrow_its_value() {
    // The stream is held, so the copy runs long after the call returns and after the value's
    // source is gone and its memory reused.
    let (sim, d) = private_sim();
    let mr: SharedResource = Arc::new(CudaMemoryResource::new(d));
    let s = Stream::new(d).unwrap();
    let mut v = DeviceUVector::<u64>::new_in(4, s.view(), mr).unwrap();
    v.copy_from_host(&[0; 4], s.view()).unwrap();
    let gate = sim.hold_stream(0, s.view().raw()).unwrap();
    {
        let source = Box::new(0x1234_5678_9abc_def0u64);
        v.set_element_async(2, *source, s.view()).unwrap();
        drop(source);
        // Scribble over the heap where the source was.
        let junk: Vec<Box<u64>> = (0..64).map(|_| Box::new(u64::MAX)).collect();
        drop(junk);
    }
    let mut local = 42u64;
    v.set_element_to_zero_async(0, s.view()).unwrap();
    local += 1;
    assert_eq!(local, 43);
    gate.open();
    assert_eq!(
        v.to_vec(s.view()).unwrap(),
        [0, 0, 0x1234_5678_9abc_def0, 0]
    );
}

#[test]
fn an_async_set_with_a_dropped_source_on_the_process_wide_backend() {
    let s = Stream::new(device()).unwrap();
    let mut v = DeviceUVector::<[u8; 24]>::new(100, s.view()).unwrap();
    for i in 0..100usize {
        let value: Vec<u8> = pattern(24, i as u64);
        let arr: [u8; 24] = value.as_slice().try_into().unwrap();
        v.set_element_async(i, arr, s.view()).unwrap();
        drop(value);
    }
    for i in [0usize, 57, 99] {
        assert_eq!(
            v.element(i, s.view()).unwrap().to_vec(),
            pattern(24, i as u64)
        );
    }
}

#[test]
fn a_second_staged_set_waits_for_the_first_copy() {
    let (sim, d) = private_sim();
    let mr: SharedResource = Arc::new(CudaMemoryResource::new(d));
    let s = Stream::new(d).unwrap();
    let mut v = DeviceUVector::<u32>::new_in(2, s.view(), mr).unwrap();
    let gate = sim.hold_stream(0, s.view().raw()).unwrap();
    v.set_element_async(0, 1, s.view()).unwrap();
    let opener = open_later(gate, 100);
    let started = Instant::now();
    // The slot still holds the first value until the held stream runs its copy.
    v.set_element_async(1, 2, s.view()).unwrap();
    assert!(started.elapsed() >= Duration::from_millis(50));
    opener.join().unwrap();
    assert_eq!(v.to_vec(s.view()).unwrap(), [1, 2]);
}

#[test]
fn reads_and_writes_are_ordered_after_the_vectors_own_async_sets_on_other_streams() {
    let (sim, d) = private_sim();
    let mr: SharedResource = Arc::new(CudaMemoryResource::new(d));
    let a = Stream::new(d).unwrap();
    let b = Stream::new(d).unwrap();
    let mut v = DeviceUVector::<u32>::new_in(3, a.view(), mr).unwrap();
    v.copy_from_host(&[0, 0, 0], a.view()).unwrap();

    // A set on a held stream `a`, read on `b`: the read waits for it.
    let gate = sim.hold_stream(0, a.view().raw()).unwrap();
    v.set_element_async(1, 77, a.view()).unwrap();
    let opener = open_later(gate, 30);
    assert_eq!(v.element(1, b.view()).unwrap(), 77);
    opener.join().unwrap();

    // A set on `a`, then zeroing on `b`: the zero lands last.
    let gate = sim.hold_stream(0, a.view().raw()).unwrap();
    v.set_element_async(2, 5, a.view()).unwrap();
    v.set_element_to_zero_async(2, b.view()).unwrap();
    let opener = open_later(gate, 30);
    assert_eq!(v.element(2, b.view()).unwrap(), 0);
    opener.join().unwrap();

    // A set on `a`, then a reallocation on `b`: the new storage has the value.
    let gate = sim.hold_stream(0, a.view().raw()).unwrap();
    v.set_element_async(0, 9, a.view()).unwrap();
    v.reserve(1000, b.view()).unwrap();
    let opener = open_later(gate, 30);
    assert_eq!(v.to_vec(b.view()).unwrap(), [9, 77, 0]);
    opener.join().unwrap();
}

#[test]
fn staging_is_made_on_the_first_staged_set_and_freed_on_drop() {
    let (sim, d) = private_sim();
    let mr: SharedResource = Arc::new(CudaMemoryResource::new(d));
    let s = Stream::new(d).unwrap();
    let mut v = DeviceUVector::<u64>::new_in(8, s.view(), mr).unwrap();
    assert_eq!(sim.pinned_host_bytes(), 0, "construction stages nothing");
    v.set_element_async(0, 0, s.view()).unwrap();
    v.set_element_to_zero_async(1, s.view()).unwrap();
    assert_eq!(sim.pinned_host_bytes(), 0, "zeros take the memset path");
    v.set_element_async(2, 3, s.view()).unwrap();
    let staged = sim.pinned_host_bytes();
    assert!(staged >= 8, "{staged}");
    v.set_element_async(3, 4, s.view()).unwrap();
    assert_eq!(sim.pinned_host_bytes(), staged, "the slot is reused");
    drop(v);
    assert_eq!(sim.pinned_host_bytes(), 0);
    assert_eq!(sim.live_allocations(0), 0);
}

#[test]
fn dropping_a_vector_with_a_set_in_flight_waits_for_the_copy() {
    let (sim, d) = private_sim();
    let mr: SharedResource = Arc::new(CudaMemoryResource::new(d));
    let s = Stream::new(d).unwrap();
    let mut v = DeviceUVector::<u32>::new_in(1, s.view(), mr).unwrap();
    let gate = sim.hold_stream(0, s.view().raw()).unwrap();
    v.set_element_async(0, 1, s.view()).unwrap();
    let opener = open_later(gate, 50);
    let started = Instant::now();
    drop(v);
    assert!(started.elapsed() >= Duration::from_millis(25));
    opener.join().unwrap();
    assert_eq!(sim.pinned_host_bytes(), 0);
    assert_eq!(sim.live_allocations(0), 0);
}

#[test]
fn resize_within_capacity_neither_allocates_nor_copies() {
    let d = device();
    let rec = Recording::new(d);
    let s = Stream::new(d).unwrap();
    let data: Vec<u32> = (0..100).collect();
    let mut v = DeviceUVector::from_host_in(&data, s.view(), rec.shared()).unwrap();
    let p = v.data();
    rec.clear();
    v.resize(10, s.view()).unwrap();
    assert_eq!((v.len(), v.capacity(), v.data()), (10, 100, p));
    v.resize(100, s.view()).unwrap();
    assert!(rec.calls().is_empty());
    assert_eq!(v.to_vec(s.view()).unwrap(), data);
}

#[test]
fn resize_beyond_capacity_keeps_the_elements() {
    let d = device();
    let rec = Recording::new(d);
    let s = Stream::new(d).unwrap();
    let t = Stream::new(d).unwrap();
    let data: Vec<u16> = (0..300).collect();
    let mut v = DeviceUVector::from_host_in(&data, s.view(), rec.shared()).unwrap();
    let old = v.data();
    rec.clear();
    v.resize(1000, t.view()).unwrap();
    assert_eq!((v.len(), v.capacity()), (1000, 1000));
    assert_eq!(rec.allocations(), vec![(v.data(), 2000, t.view())]);
    assert_eq!(
        rec.deallocations(),
        vec![(old, 600, t.view(), current_device())]
    );
    assert_eq!(v.to_vec(t.view()).unwrap()[..300], data[..]);
    assert_eq!(v.stream(), t.view());
}

#[test]
fn reserve_and_shrink_to_fit_keep_the_elements() {
    let d = device();
    let rec = Recording::new(d);
    let s = Stream::new(d).unwrap();
    let data: Vec<f32> = (0..50).map(|i| i as f32 * 0.5).collect();
    let mut v = DeviceUVector::from_host_in(&data, s.view(), rec.shared()).unwrap();
    v.reserve(10, s.view()).unwrap();
    assert_eq!(v.capacity(), 50);
    v.reserve(200, s.view()).unwrap();
    assert_eq!((v.len(), v.capacity()), (50, 200));
    assert_eq!(v.to_vec(s.view()).unwrap(), data);
    v.resize(20, s.view()).unwrap();
    rec.clear();
    v.shrink_to_fit(s.view()).unwrap();
    assert_eq!((v.len(), v.capacity()), (20, 20));
    assert_eq!(rec.allocations(), vec![(v.data(), 80, s.view())]);
    assert_eq!(v.to_vec(s.view()).unwrap(), data[..20]);
    rec.clear();
    v.shrink_to_fit(s.view()).unwrap();
    assert!(rec.calls().is_empty(), "already tight: no-op");
}

#[test]
fn release_hands_over_the_allocation_with_its_data() {
    let d = device();
    let rec = Recording::new(d);
    let s = Stream::new(d).unwrap();
    let t = Stream::new(d).unwrap();
    let mut v = DeviceUVector::<u32>::new_in(16, s.view(), rec.shared()).unwrap();
    v.copy_from_host(&(0..16).collect::<Vec<_>>(), s.view())
        .unwrap();
    v.set_element_async(15, 1500, s.view()).unwrap();
    v.reserve(32, s.view()).unwrap();
    v.set_stream(t.view());
    let p = v.data();
    rec.clear();
    let buf: DeviceBuffer = v.release();
    assert!(rec.calls().is_empty(), "release neither frees nor copies");
    assert_eq!((buf.data(), buf.size(), buf.capacity()), (p, 64, 128));
    assert_eq!(buf.stream(), t.view());
    let bytes = buf.to_vec(s.view()).unwrap();
    let back: &[u32] = bytemuck::cast_slice(&bytes);
    assert_eq!(back[..15], (0..15).collect::<Vec<_>>()[..]);
    assert_eq!(back[15], 1500);
    // And back again.
    let v = DeviceUVector::<u32>::from_buffer(buf).unwrap();
    assert_eq!((v.len(), v.capacity(), v.data()), (16, 32, p));
    assert_eq!(v.back_element(s.view()).unwrap(), 1500);
    drop(v);
    assert_eq!(
        rec.deallocations(),
        vec![(p, 128, t.view(), current_device())]
    );
    // A buffer that is not a whole number of elements is refused.
    let odd = DeviceBuffer::new(6, s.view()).unwrap();
    let e = DeviceUVector::<u32>::from_buffer(odd).unwrap_err();
    assert!(e.to_string().contains("multiple of"), "{e}");
}

#[test]
fn memory_goes_back_on_the_stream_most_recently_set() {
    let d = device();
    let rec = Recording::new(d);
    let s = Stream::new(d).unwrap();
    let t = Stream::new(d).unwrap();
    let mut v = DeviceUVector::<u8>::new_in(100, s.view(), rec.shared()).unwrap();
    v.set_element_async(0, 1, s.view()).unwrap();
    v.set_stream(t.view());
    // Element access does not change the stream; only set_stream and reallocating calls do.
    v.element(0, s.view()).unwrap();
    assert_eq!(v.stream(), t.view());
    let p = v.data();
    drop(v);
    assert_eq!(
        rec.deallocations(),
        vec![(p, 100, t.view(), current_device())]
    );
}

#[test]
fn deep_copy_is_independent_of_the_original() {
    let d = device();
    let s = Stream::new(d).unwrap();
    let t = Stream::new(d).unwrap();
    let rec = Recording::new(d);
    let mut v = DeviceUVector::<i64>::from_host(&[1, 2, 3], s.view()).unwrap();
    v.reserve(10, s.view()).unwrap();
    v.set_element_async(1, 20, s.view()).unwrap();
    let c = v.deep_copy_in(t.view(), rec.shared()).unwrap();
    assert_eq!((c.len(), c.capacity()), (3, 3));
    assert_eq!(c.stream(), t.view());
    assert_eq!(c.to_vec(t.view()).unwrap(), [1, 20, 3]);
    v.set_element(0, -1, s.view()).unwrap();
    assert_eq!(c.to_vec(t.view()).unwrap(), [1, 20, 3]);
    let c2 = c.deep_copy(t.view()).unwrap();
    assert!(Arc::ptr_eq(
        c2.memory_resource(),
        &get_current_device_resource().unwrap()
    ));
    drop(v);
    assert_eq!(c2.to_vec(t.view()).unwrap(), [1, 20, 3]);
}

#[test]
fn vectors_are_send_and_sync_for_any_pod_element() {
    assert_send_sync::<DeviceUVector<u8>>();
    assert_send_sync::<DeviceUVector<Particle>>();
    let s = Stream::new(device()).unwrap();
    let mut v = DeviceUVector::<Particle>::new(4, s.view()).unwrap();
    v.set_element_async(2, particle(2), s.view()).unwrap();
    let raw = s.view();
    let got = std::thread::spawn(move || {
        let p = v.element(2, raw).unwrap();
        drop(v);
        p
    })
    .join()
    .unwrap();
    assert_eq!(got, particle(2));
}
