//! The containers' construction and drop add no heap allocation to their resource's own
//! allocate/deallocate (the design's hot-path rule). A counting global allocator watches this
//! test binary; the resource hands out addresses without allocating.

use std::alloc::{GlobalAlloc, Layout, System};
use std::any::Any;
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rmm_allocator::backend::DevicePtr;
use rmm_allocator::per_device::get_current_device_resource;
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::SharedResource;
use rmm_allocator::{Device, DeviceBuffer, DeviceScalar, DeviceUVector, Result, StreamView};

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// Counts the allocations of the calling thread.
struct Counting;

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// A resource that hands out aligned addresses from a counter and touches nothing.
#[derive(Debug)]
struct Addresses {
    device: Device,
    next: AtomicU64,
}

impl DeviceMemoryResource for Addresses {
    fn allocate(&self, bytes: usize, _stream: StreamView) -> Result<DevicePtr> {
        let len = (bytes as u64).next_multiple_of(256);
        Ok(DevicePtr(self.next.fetch_add(len, Ordering::Relaxed)))
    }
    fn deallocate(&self, _ptr: DevicePtr, _bytes: usize, _stream: StreamView) -> Result<()> {
        Ok(())
    }
    fn device(&self) -> Device {
        self.device
    }
    fn name(&self) -> &'static str {
        "Addresses"
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[test]
fn construction_and_drop_allocate_nothing_on_the_heap() {
    let device = Device::new(0).unwrap();
    let mr: SharedResource = Arc::new(Addresses {
        device,
        next: AtomicU64::new(1 << 40),
    });
    let s = StreamView::DEFAULT;
    // Warm up anything lazily initialized (thread-locals, the per-device table).
    drop(DeviceBuffer::new(16, s).unwrap());
    let _ = get_current_device_resource().unwrap();

    let before = allocations();
    for size in [0usize, 1, 4096, 1 << 30] {
        let b = DeviceBuffer::new_in(size, s, Arc::clone(&mr)).unwrap();
        drop(b);
        let v = DeviceUVector::<u32>::new_in(size / 4, s, Arc::clone(&mr)).unwrap();
        drop(v);
    }
    let x = DeviceScalar::<f64>::new_in(s, Arc::clone(&mr)).unwrap();
    drop(x);
    assert_eq!(
        allocations() - before,
        0,
        "the containers allocated on the heap"
    );
}
