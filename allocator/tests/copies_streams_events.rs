//! Copies (sync and async, every direction), memset, streams and events on the process-wide
//! backend.

mod common;

use common::{MIB, device, pattern};
use rmm_allocator::resource::CudaMemoryResource;
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::{Event, Stream, StreamView};

#[test]
fn bytes_copied_to_the_device_come_back_exact() {
    let d = device();
    let mr = CudaMemoryResource::new(d);
    for (i, len) in [1usize, 255, 4096, 3 * MIB + 17].into_iter().enumerate() {
        let data = pattern(len, 100 + i as u64);
        let a = mr.allocate(len, StreamView::DEFAULT).unwrap();
        let b = mr.allocate(len, StreamView::DEFAULT).unwrap();
        d.copy_to_device(a, &data).unwrap();
        d.copy_device_to_device(b, a, len).unwrap();
        let mut back = vec![0u8; len];
        d.copy_to_host(&mut back, b).unwrap();
        assert_eq!(back, data, "{len} B");
        mr.deallocate(a, len, StreamView::DEFAULT).unwrap();
        mr.deallocate(b, len, StreamView::DEFAULT).unwrap();
    }
}

#[test]
fn memset_and_async_copies_keep_stream_order() {
    let d = device();
    let mr = CudaMemoryResource::new(d);
    let s = Stream::new(d).unwrap();
    let len = 4 * MIB;
    let a = mr.allocate(len, s.view()).unwrap();
    let b = mr.allocate(len, s.view()).unwrap();
    for round in 0..8u8 {
        d.memset_async(a, round, len, s.view()).unwrap();
        d.copy_device_to_device_async(b, a, len, s.view()).unwrap();
    }
    s.synchronize().unwrap();
    let mut back = vec![0u8; len];
    d.copy_to_host(&mut back, b).unwrap();
    assert!(back.iter().all(|&x| x == 7), "the last memset must win");
    d.memset(a, 0x11, 100).unwrap();
    d.copy_to_host(&mut back[..100], a).unwrap();
    assert!(back[..100].iter().all(|&x| x == 0x11));
    mr.deallocate(a, len, s.view()).unwrap();
    mr.deallocate(b, len, s.view()).unwrap();
}

#[test]
fn events_order_work_across_streams() {
    let d = device();
    let mr = CudaMemoryResource::new(d);
    let producer = Stream::new(d).unwrap();
    let consumer = Stream::new(d).unwrap();
    let len = 16 * MIB;
    let a = mr.allocate(len, StreamView::DEFAULT).unwrap();
    let b = mr.allocate(len, StreamView::DEFAULT).unwrap();
    d.memset(a, 0, len).unwrap();
    let ready = Event::new(d).unwrap();
    assert!(
        ready.is_complete().unwrap(),
        "an event never recorded is complete"
    );
    for _ in 0..16 {
        d.memset_async(a, 0x42, len, producer.view()).unwrap();
    }
    ready.record(producer.view()).unwrap();
    consumer.wait(&ready).unwrap();
    d.copy_device_to_device_async(b, a, len, consumer.view())
        .unwrap();
    consumer.synchronize().unwrap();
    assert!(ready.is_complete().unwrap());
    let mut back = vec![0u8; len];
    d.copy_to_host(&mut back, b).unwrap();
    assert!(
        back.iter().all(|&x| x == 0x42),
        "the consumer ran before the producer's event"
    );
    ready.synchronize().unwrap();
    assert!(producer.is_idle().unwrap() && consumer.is_idle().unwrap());
    d.synchronize().unwrap();
    mr.deallocate(a, len, StreamView::DEFAULT).unwrap();
    mr.deallocate(b, len, StreamView::DEFAULT).unwrap();
}

#[test]
fn a_copy_to_or_a_free_of_a_foreign_pointer_is_an_error() {
    let d = device();
    let mr = CudaMemoryResource::new(d);
    let data = [1u8; 16];
    // Address 8 is never a device allocation.
    assert!(
        d.copy_to_device(rmm_allocator::backend::DevicePtr(8), &data)
            .is_err()
    );
    assert!(
        mr.deallocate(
            rmm_allocator::backend::DevicePtr(8),
            16,
            StreamView::DEFAULT
        )
        .is_err()
    );
}
