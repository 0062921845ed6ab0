//! `DeviceScalar<T>`: uninitialized or with a value, value() copies back, asynchronous sets
//! that borrow nothing, zeroing, deep copy, deallocation stream.

mod common;
mod container_common;

use std::sync::Arc;

use common::device;
use container_common::{Recording, assert_send_sync, private_sim};
use rmm_allocator::current_device;
use rmm_allocator::per_device::get_current_device_resource;
use rmm_allocator::resource::CudaMemoryResource;
use rmm_allocator::resource::SharedResource;
use rmm_allocator::{ALLOCATION_ALIGNMENT, DeviceScalar, Stream, StreamView};

#[test]
fn an_uninitialized_scalar_can_be_set_and_read() {
    let s = Stream::new(device()).unwrap();
    let mut x = DeviceScalar::<f64>::new(s.view()).unwrap();
    assert_eq!(x.data().addr() % ALLOCATION_ALIGNMENT as u64, 0);
    assert_eq!(x.stream(), s.view());
    assert_eq!(x.device(), device());
    assert!(Arc::ptr_eq(
        x.memory_resource(),
        &get_current_device_resource().unwrap()
    ));
    x.set_value_async(2.5, s.view()).unwrap();
    assert_eq!(x.value(s.view()).unwrap(), 2.5);
    x.set_value(-1.0, s.view()).unwrap();
    assert_eq!(x.value(s.view()).unwrap(), -1.0);
    // -0.0 is not all zero bits: it must be staged, not memset.
    x.set_value_async(-0.0, s.view()).unwrap();
    assert!(x.value(s.view()).unwrap().is_sign_negative());
}

#[test]
fn a_scalar_made_with_a_value_holds_it() {
    let s = Stream::new(device()).unwrap();
    let x = DeviceScalar::with_value(0xDEAD_BEEFu32, s.view()).unwrap();
    assert_eq!(x.value(s.view()).unwrap(), 0xDEAD_BEEF);
    let z = DeviceScalar::with_value(0u128, s.view()).unwrap();
    assert_eq!(z.value(s.view()).unwrap(), 0);
    let rec = Recording::new(device());
    let y = DeviceScalar::with_value_in([1u16, 2, 3], s.view(), rec.shared()).unwrap();
    assert_eq!(rec.allocations(), vec![(y.data(), 6, s.view())]);
    assert_eq!(y.value(s.view()).unwrap(), [1, 2, 3]);
}

#[test]
fn set_value_to_zero_async_zeroes_it() {
    let s = Stream::new(device()).unwrap();
    let mut x = DeviceScalar::with_value(u64::MAX, s.view()).unwrap();
    x.set_value_to_zero_async(s.view()).unwrap();
    assert_eq!(x.value(s.view()).unwrap(), 0);
}

#[test]
fn an_async_set_does_not_borrow_its_value() {
    let (sim, d) = private_sim();
    let mr: SharedResource = Arc::new(CudaMemoryResource::new(d));
    let s = Stream::new(d).unwrap();
    let mut x = DeviceScalar::with_value_in(1u64, s.view(), Arc::clone(&mr)).unwrap();
    let gate = sim.hold_stream(0, s.view().raw()).unwrap();
    {
        let mut v = String::from("12345").parse::<u64>().unwrap();
        let boxed = Box::new(v);
        x.set_value_async(*boxed, s.view()).unwrap();
        drop(boxed);
        v = 0;
        assert_eq!(v, 0);
    }
    gate.open();
    assert_eq!(x.value(s.view()).unwrap(), 12345);
}

#[test]
fn deep_copy_is_independent() {
    let d = device();
    let s = Stream::new(d).unwrap();
    let rec = Recording::new(d);
    let mut x = DeviceScalar::with_value(7i32, s.view()).unwrap();
    let c = x.deep_copy_in(s.view(), rec.shared()).unwrap();
    assert_eq!(rec.allocations(), vec![(c.data(), 4, s.view())]);
    x.set_value_async(8, s.view()).unwrap();
    assert_eq!(c.value(s.view()).unwrap(), 7);
    assert_eq!(x.value(s.view()).unwrap(), 8);
    let c2 = x.deep_copy(s.view()).unwrap();
    drop(x);
    assert_eq!(c2.value(s.view()).unwrap(), 8);
}

#[test]
fn memory_goes_back_on_the_stream_most_recently_set() {
    let d = device();
    let rec = Recording::new(d);
    let s = Stream::new(d).unwrap();
    let t = Stream::new(d).unwrap();
    let mut x = DeviceScalar::<u8>::new_in(s.view(), rec.shared()).unwrap();
    x.set_stream(t.view());
    assert_eq!(x.stream(), t.view());
    let p = x.data();
    drop(x);
    assert_eq!(
        rec.deallocations(),
        vec![(p, 1, t.view(), current_device())]
    );
}

#[test]
fn release_keeps_the_value() {
    let s = StreamView::DEFAULT;
    let x = DeviceScalar::with_value(0x0102_0304u32, s).unwrap();
    let buf = x.release();
    assert_eq!(buf.size(), 4);
    assert_eq!(buf.to_vec(s).unwrap(), 0x0102_0304u32.to_ne_bytes());
}

#[test]
fn scalars_are_send_and_sync() {
    assert_send_sync::<DeviceScalar<u64>>();
    let s = Stream::new(device()).unwrap();
    let x = DeviceScalar::with_value(99u64, s.view()).unwrap();
    let view = s.view();
    let v = std::thread::spawn(move || x.value(view).unwrap())
        .join()
        .unwrap();
    assert_eq!(v, 99);
    assert!(format!("{:?}", DeviceScalar::<u8>::new(view).unwrap()).contains("DeviceScalar"));
}
