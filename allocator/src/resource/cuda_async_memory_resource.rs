//! [`CudaAsyncMemoryResource`] (RMM's `cuda_async_memory_resource`): `cuMemAllocFromPoolAsync`.

use std::any::Any;

use super::{DeviceMemoryResource, map_oom};
use crate::backend::{DevicePtr, RawMemPool};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream_view::StreamView;

/// Stream-ordered allocation from a driver memory pool (`cuMemPoolCreate`) it owns, which by
/// default keeps all it takes, as in RMM; [`CudaAsyncMemoryResource::release`] returns the cache.
#[derive(Debug)]
pub struct CudaAsyncMemoryResource {
    device: Device,
    pool: RawMemPool,
    release_threshold: u64,
}

impl CudaAsyncMemoryResource {
    /// A resource with its own pool on `device` that keeps all memory it takes.
    ///
    /// # Errors
    /// As [`CudaAsyncMemoryResource::with_release_threshold`].
    pub fn new(device: Device) -> Result<Self> {
        Self::with_release_threshold(device, u64::MAX)
    }

    /// A resource whose pool releases cached memory above `release_threshold` bytes at each sync.
    ///
    /// # Errors
    /// [`Error::Unsupported`] without pool support; [`Error::Driver`] if pool creation fails.
    pub fn with_release_threshold(device: Device, release_threshold: u64) -> Result<Self> {
        if !device.properties()?.supports_memory_pools {
            return Err(Error::Unsupported {
                what: "stream-ordered allocation (cuMemAllocAsync)",
                backend: device.backend().kind().name(),
                hint: format!(
                    "{device} has no memory pool support; use CudaMemoryResource or a pool"
                ),
            });
        }
        let (backend, dev) = (device.backend(), device.ordinal());
        let pool = backend.mem_pool_create(dev, release_threshold)?;
        tracing::debug!(
            device = dev,
            release_threshold,
            "created CUDA async memory pool"
        );
        Ok(CudaAsyncMemoryResource {
            device,
            pool,
            release_threshold,
        })
    }

    /// Primes the pool with `bytes` (RMM's `initial_pool_size`): allocates and frees them on the
    /// default stream and waits, so the pool holds them as the release threshold allows.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`]; [`Error::Driver`] when the free or the wait fails.
    pub fn reserve(&self, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let ptr = self.allocate(bytes, StreamView::DEFAULT)?;
        self.deallocate(ptr, bytes, StreamView::DEFAULT)?;
        crate::stream::synchronize_stream(self.device, StreamView::DEFAULT)
    }

    /// The configured release threshold in bytes.
    pub fn release_threshold(&self) -> u64 {
        self.release_threshold
    }

    /// Bytes the driver pool currently holds (in use plus cached).
    ///
    /// # Errors
    /// [`Error::Driver`] when the query fails.
    pub fn reserved_bytes(&self) -> Result<u64> {
        let dev = self.device.ordinal();
        self.device.backend().mem_pool_reserved(dev, self.pool)
    }

    /// Waits for the device, then gives every cached unused byte back to the driver.
    ///
    /// # Errors
    /// [`Error::Driver`] when waiting or trimming fails.
    pub fn release(&self) -> Result<()> {
        let dev = self.device.ordinal();
        let _span =
            tracing::debug_span!("CudaAsyncMemoryResource::release", device = dev).entered();
        self.device.synchronize()?;
        self.device.backend().mem_pool_trim(dev, self.pool, 0)
    }
}

impl DeviceMemoryResource for CudaAsyncMemoryResource {
    fn allocate(&self, bytes: usize, stream: StreamView) -> Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        self.device
            .backend()
            .malloc_async(self.device.ordinal(), self.pool, bytes, stream.raw())
            .map_err(|e| map_oom(e, self.device, bytes, self.name()))
    }

    fn deallocate(&self, ptr: DevicePtr, _bytes: usize, stream: StreamView) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        let dev = self.device.ordinal();
        self.device.backend().free_async(dev, ptr, stream.raw())
    }

    fn device(&self) -> Device {
        self.device
    }

    fn name(&self) -> &'static str {
        "CudaAsyncMemoryResource"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for CudaAsyncMemoryResource {
    fn drop(&mut self) {
        // The driver frees the pool once its outstanding allocations are freed.
        let (device, backend) = (self.device, self.device.backend());
        if let Err(e) = backend.mem_pool_destroy(device.ordinal(), self.pool) {
            tracing::error!("destroying the CUDA async memory pool of {device}: {e}");
        }
    }
}
