//! Synchronous copies between the device and pageable host memory at sizes around the
//! staging buffers' (large device → host copies go through pinned staging on a GPU): every
//! byte arrives, in order, and the copy sees work queued before it on the default stream.

mod common;

use common::{MIB, device, pattern};
use rmm_allocator::StreamView;
use rmm_allocator::resource::CudaMemoryResource;
use rmm_allocator::resource::DeviceMemoryResource;

#[test]
fn large_copies_to_host_arrive_whole_at_odd_sizes() {
    let d = device();
    let mr = CudaMemoryResource::new(d);
    for (i, &len) in [
        2 * MIB - 1,
        2 * MIB,
        8 * MIB + 1,
        16 * MIB,
        3 * 8 * MIB + 12_345,
    ]
    .iter()
    .enumerate()
    {
        let data = pattern(len, i as u64 + 7);
        let p = mr.allocate(len, StreamView::DEFAULT).unwrap();
        d.copy_to_device(p, &data).unwrap();
        let mut back = vec![0u8; len];
        d.copy_to_host(&mut back, p).unwrap();
        assert!(back == data, "{len} bytes came back different");
        // Work queued on the default stream before the copy is seen by it.
        d.memset_async(p, 0xAB, len, StreamView::DEFAULT).unwrap();
        d.copy_to_host(&mut back, p).unwrap();
        assert!(
            back.iter().all(|&b| b == 0xAB),
            "{len} bytes: the memset was not seen"
        );
        mr.deallocate(p, len, StreamView::DEFAULT).unwrap();
    }
}

#[test]
fn threads_copy_to_host_at_once() {
    let d = device();
    let mr = CudaMemoryResource::new(d);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let mr = &mr;
            s.spawn(move || {
                let len = 10 * MIB + t as usize * 4097;
                let data = pattern(len, t + 100);
                let p = mr.allocate(len, StreamView::DEFAULT).unwrap();
                d.copy_to_device(p, &data).unwrap();
                for _ in 0..3 {
                    let mut back = vec![0u8; len];
                    d.copy_to_host(&mut back, p).unwrap();
                    assert!(back == data, "thread {t}: bytes came back different");
                }
                mr.deallocate(p, len, StreamView::DEFAULT).unwrap();
            });
        }
    });
}
