//! Host memory resources: pinned and pageable, sizes 0 B, 1 B, 255 B and 1 GiB, alignment,
//! and pinned staging for asynchronous copies.

mod common;

use common::{GIB, device, pattern};
use rmm_allocator::resource::{CudaMemoryResource, NewDeleteResource, PinnedHostMemoryResource};
use rmm_allocator::resource::{DeviceMemoryResource, HostMemoryResource};
use rmm_allocator::{Error, Stream, StreamView};

fn resources() -> Vec<Box<dyn HostMemoryResource>> {
    vec![
        Box::new(PinnedHostMemoryResource::new().unwrap()),
        Box::new(NewDeleteResource),
    ]
}

#[test]
fn sizes_and_alignment() {
    for mr in resources() {
        for bytes in [0usize, 1, 255, 4096, GIB] {
            for align in [1usize, 64, 256, 4096] {
                if bytes == GIB && align != 256 {
                    continue;
                }
                let mut b = mr.allocate(bytes, align).unwrap();
                assert_eq!(b.len(), bytes);
                assert_eq!(
                    b.as_ptr() as usize % align,
                    0,
                    "{} {bytes} B align {align}",
                    mr.name()
                );
                if bytes > 0 {
                    b.as_mut_slice()[0] = 0x5A;
                    assert_eq!(b.as_slice()[0], 0x5A);
                    b.as_mut_slice()[bytes - 1] = 0xA5;
                    assert_eq!(b.as_slice()[bytes - 1], 0xA5);
                }
                mr.deallocate(b).unwrap();
            }
        }
    }
}

#[test]
fn pinned_blocks_say_so() {
    let pinned = PinnedHostMemoryResource::new()
        .unwrap()
        .allocate(100, 8)
        .unwrap();
    let pageable = NewDeleteResource.allocate(100, 8).unwrap();
    assert!(pinned.is_pinned());
    assert!(!pageable.is_pinned());
    PinnedHostMemoryResource::new()
        .unwrap()
        .deallocate(pinned)
        .unwrap();
    NewDeleteResource.deallocate(pageable).unwrap();
}

#[test]
fn bad_alignment_is_an_error_not_a_panic() {
    let e = NewDeleteResource.allocate(64, 3).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument {
                what: "alignment",
                ..
            }
        ),
        "{e}"
    );
    let e = PinnedHostMemoryResource::new()
        .unwrap()
        .allocate(64, 8192)
        .unwrap_err();
    assert!(e.to_string().contains("alignment = 8192"), "{e}");
}

#[test]
fn pinned_staging_round_trips_asynchronously() {
    let d = device();
    let stream = Stream::new(d).unwrap();
    let pinned = PinnedHostMemoryResource::new().unwrap();
    let mr = CudaMemoryResource::new(d);
    let len = 8 << 20;
    let data = pattern(len, 11);
    let mut src = pinned.allocate(len, 256).unwrap();
    src.as_mut_slice().copy_from_slice(&data);
    let mut dst = pinned.allocate(len, 256).unwrap();
    let p = mr.allocate(len, stream.view()).unwrap();
    // SAFETY: both pinned blocks outlive the copies; the stream is synchronized before they
    // are read or freed.
    unsafe {
        d.backend()
            .memcpy_htod_async(0, p, src.as_ptr(), len, stream.view().raw())
            .unwrap();
        d.backend()
            .memcpy_dtoh_async(0, dst.as_mut_ptr(), p, len, stream.view().raw())
            .unwrap();
    }
    stream.synchronize().unwrap();
    assert_eq!(dst.as_slice(), &data[..]);
    mr.deallocate(p, len, StreamView::DEFAULT).unwrap();
    pinned.deallocate(src).unwrap();
    pinned.deallocate(dst).unwrap();
}

#[test]
fn host_register_pins_existing_memory() {
    let d = device();
    let b = d.backend();
    let len = 1 << 20;
    let data = pattern(len, 11);
    let mr = CudaMemoryResource::new(d);
    let src = mr.allocate(len, StreamView::DEFAULT).unwrap();
    b.memcpy_htod(d.ordinal(), src, &data).unwrap();
    let stream = Stream::new(d).unwrap();
    let mut v = vec![0u8; len];
    let ptr = v.as_mut_ptr();
    // SAFETY: `v` outlives the registration, which is undone below, and is not touched by
    // the host while the copy into it runs (until the stream is synchronized).
    unsafe {
        b.host_register(ptr, len).unwrap();
        // The registration took: the same range cannot be registered twice.
        assert!(b.host_register(ptr, len).is_err());
        // An asynchronous copy lands in the registered memory.
        b.memcpy_dtoh_async(d.ordinal(), ptr, src, len, stream.view().raw())
            .unwrap();
    }
    stream.synchronize().unwrap();
    assert!(v == data, "the copy into registered memory arrived");
    // SAFETY: as above; the range is registered once at a time.
    unsafe {
        b.host_unregister(ptr).unwrap();
        // Undone: a second unregister is refused, and the range can be registered again.
        assert!(b.host_unregister(ptr).is_err());
        b.host_register(ptr, len).unwrap();
        b.host_unregister(ptr).unwrap();
    }
    mr.deallocate(src, len, StreamView::DEFAULT).unwrap();
}
