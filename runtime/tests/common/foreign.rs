//! Device memory of "another library" (a CuPy array, a PyTorch tensor): the owner the
//! foreign-data tests hand to [`SpillManager::adopt`](rmm_runtime::SpillManager::adopt).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use rmm_allocator::backend::DevicePtr;
use rmm_allocator::per_device::get_per_device_resource;
use rmm_allocator::{Device, StreamView};
use rmm_runtime::ForeignOwner;

/// Allocations from a device's current resource, freed when the owner drops (counted in
/// `dropped`); in use while `in_use` says so.
pub struct LibraryOwner {
    /// The device the allocations are on.
    pub device: u32,
    /// (address, bytes) of each allocation.
    pub allocations: Vec<(DevicePtr, usize)>,
    /// Set by a test while "a task" uses the value.
    pub in_use: Arc<AtomicBool>,
    /// Owners dropped so far (shared by the owners of a test).
    pub dropped: Arc<AtomicUsize>,
}

impl LibraryOwner {
    /// One allocation on `device` per entry of `contents`, each holding its bytes.
    pub fn holding(device: u32, contents: &[&[u8]], dropped: &Arc<AtomicUsize>) -> LibraryOwner {
        let r = get_per_device_resource(device).expect("the device's resource");
        let dev = Device::new(device).expect("the device");
        let allocations = contents
            .iter()
            .map(|bytes| {
                let ptr = r
                    .allocate(bytes.len(), StreamView::DEFAULT)
                    .expect("allocate");
                dev.copy_to_device(ptr, bytes).expect("fill");
                (ptr, bytes.len())
            })
            .collect();
        LibraryOwner {
            device,
            allocations,
            in_use: Arc::default(),
            dropped: Arc::clone(dropped),
        }
    }
}

impl ForeignOwner for LibraryOwner {
    fn is_in_use(&self) -> bool {
        self.in_use.load(Ordering::SeqCst)
    }
}

impl Drop for LibraryOwner {
    fn drop(&mut self) {
        let r = get_per_device_resource(self.device).expect("the device's resource");
        for &(ptr, size) in &self.allocations {
            r.deallocate(ptr, size, StreamView::DEFAULT).expect("free");
        }
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

/// The bytes of an adopted value off its owner (spilled, or received), read through device
/// views: each allocation's, brought back to the device first where it is not there.
pub fn read_back<O: ForeignOwner + 'static>(v: &rmm_runtime::ForeignData<O>) -> Vec<Vec<u8>> {
    let s = StreamView::DEFAULT;
    let views = v
        .device_views(s)
        .expect("the value comes back to the device")
        .expect("the value is off its owner (spilled or received)");
    views
        .iter()
        .map(|g| {
            let mut out = vec![0u8; g.len()];
            rmm_allocator::synchronize_stream(g.buffer().device(), s).expect("synchronize");
            g.buffer()
                .device()
                .copy_to_host(&mut out, g.ptr())
                .expect("copy to the host");
            out
        })
        .collect()
}
