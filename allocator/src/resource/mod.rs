//! Memory resources: the [`DeviceMemoryResource`] and [`HostMemoryResource`] interfaces and the
//! resources that talk to the device directly.
//!
//! As in RMM, device allocations are aligned to at least 256 bytes, every allocation and
//! deallocation names a stream, and memory freed on a stream is reusable on it at once, on another
//! only after the freeing stream's earlier work completes.

mod binning_memory_resource;
mod cuda_async_memory_resource;
mod driver_memory_resource;
mod fixed_size_memory_resource;
mod new_delete_resource;
mod pinned_host_memory_resource;
mod pinned_host_pool;
mod pool_memory_resource;
mod stream_arenas;

use std::any::Any;
use std::fmt;
use std::sync::Arc;

pub use binning_memory_resource::BinningMemoryResource;
pub use cuda_async_memory_resource::CudaAsyncMemoryResource;
pub use driver_memory_resource::{
    CudaMemoryResource, DriverMemory, DriverMemoryResource, Managed, ManagedMemoryResource, Plain,
};
pub use fixed_size_memory_resource::{
    DEFAULT_BLOCK_SIZE, DEFAULT_BLOCKS_TO_PREALLOCATE, FixedSizeMemoryResource,
};
pub use new_delete_resource::NewDeleteResource;
pub use pinned_host_memory_resource::PinnedHostMemoryResource;
pub use pinned_host_pool::{PINNED_ALIGNMENT, PinnedHostPool, WeakPinnedHostPool};
pub use pool_memory_resource::{
    DEFAULT_GROWTH, LISTED_STREAMS, LiveBlock, PoolBuilder, PoolMemoryResource, PoolSnapshot,
    PoolUsage, StreamUsage, VirtualMemory, default_initial_size,
};

pub use crate::backend::host::{HostBlock, PinnedSlice};
use crate::backend::{DevicePtr, MemInfo};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream_view::StreamView;

/// A source of device memory (RMM's `device_memory_resource`).
///
/// Implementations are `Send + Sync`, align pointers to at least [`crate::ALLOCATION_ALIGNMENT`],
/// return [`DevicePtr::NULL`] for zero bytes, and report exhaustion as [`Error::OutOfMemory`].
pub trait DeviceMemoryResource: Send + Sync + fmt::Debug + 'static {
    /// Allocates at least `bytes`, usable in stream order on `stream`.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`], [`Error::Driver`], or an adaptor's own (e.g.
    /// [`Error::LimitExceeded`]).
    fn allocate(&self, bytes: usize, stream: StreamView) -> Result<DevicePtr>;

    /// Frees `ptr`, returned by this resource's `allocate(bytes, _)`, in stream order on `stream`:
    /// reusable once the stream's earlier work completes.
    ///
    /// # Errors
    /// [`Error::InvalidPointer`] if `ptr` is not live here (where detectable); [`Error::Driver`].
    fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: StreamView) -> Result<()>;

    /// The device the memory lives on.
    fn device(&self) -> Device;

    /// The resource's type name, for errors and reports (e.g. `"CudaMemoryResource"`).
    fn name(&self) -> &'static str;

    /// True when `other` can deallocate memory `self` allocated and vice versa (default: identity).
    fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
        std::ptr::addr_eq(self, other)
    }

    /// Free and total memory as this resource sees it (by default, the device's).
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver cannot report the memory.
    fn memory_info(&self) -> Result<MemInfo> {
        self.device().mem_info()
    }

    /// Lets [`DeviceMemoryResource::is_equal`] implementations look at the concrete type.
    fn as_any(&self) -> &dyn Any;

    /// The resource requests pass to: `Some` for adaptors and the pool, `None` (default) otherwise.
    fn upstream(&self) -> Option<&dyn DeviceMemoryResource> {
        None
    }
}

/// A shared device memory resource, as held by adaptors, pools, containers and the device table.
pub type SharedResource = Arc<dyn DeviceMemoryResource>;

/// A source of host memory (RMM's `host_memory_resource`).
pub trait HostMemoryResource: Send + Sync + fmt::Debug + 'static {
    /// Allocates at least `bytes` aligned to `alignment` (a power of two).
    ///
    /// # Errors
    /// [`Error::HostOutOfMemory`]; [`Error::InvalidArgument`] (bad `alignment`); [`Error::Driver`].
    fn allocate(&self, bytes: usize, alignment: usize) -> Result<HostBlock>;
    /// Gives a block back.
    ///
    /// # Errors
    /// [`Error::InvalidPointer`] for a block not live here; [`Error::Driver`] when unpinning fails.
    fn deallocate(&self, block: HostBlock) -> Result<()>;
    /// The resource's type name.
    fn name(&self) -> &'static str;
}

impl<T: DeviceMemoryResource + ?Sized> DeviceMemoryResource for Arc<T> {
    fn allocate(&self, bytes: usize, stream: StreamView) -> Result<DevicePtr> {
        (**self).allocate(bytes, stream)
    }
    fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: StreamView) -> Result<()> {
        (**self).deallocate(ptr, bytes, stream)
    }
    fn device(&self) -> Device {
        (**self).device()
    }
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
        (**self).is_equal(other)
    }
    fn memory_info(&self) -> Result<MemInfo> {
        (**self).memory_info()
    }
    fn as_any(&self) -> &dyn Any {
        (**self).as_any()
    }
    fn upstream(&self) -> Option<&dyn DeviceMemoryResource> {
        (**self).upstream()
    }
}

/// Builds the out-of-memory error for `resource` on `device`, with the device's free memory.
pub fn out_of_memory(
    device: Device,
    requested: usize,
    resource: &'static str,
    pool: Option<PoolUsage>,
) -> Error {
    let info = device.mem_info().unwrap_or(MemInfo { free: 0, total: 0 });
    tracing::debug!(
        device = device.ordinal(),
        requested,
        resource,
        free = info.free,
        "out of memory"
    );
    Error::OutOfMemory {
        requested,
        device: device.ordinal(),
        free: info.free,
        total: info.total,
        resource,
        pool: pool.map(Box::new),
    }
}

/// Maps a driver out-of-memory error to [`Error::OutOfMemory`]; other errors pass through.
pub(crate) fn map_oom(e: Error, device: Device, requested: usize, resource: &'static str) -> Error {
    if e.is_driver_out_of_memory() {
        out_of_memory(device, requested, resource, None)
    } else {
        e
    }
}
