//! [`CudaMemoryResource`]: `cuMemAlloc` / `cuMemFree`, RMM's `cuda_memory_resource`.

use std::any::Any;

use super::{DeviceMemoryResource, map_oom};
use crate::backend::DevicePtr;
use crate::device::Device;
use crate::error::Result;
use crate::stream_view::StreamView;

/// Allocates with `cuMemAlloc` and frees with `cuMemFree`. Both are synchronous and slow
/// (tens of microseconds); wrap it in a pool for anything on a hot path. This is the initial
/// resource of every device.
#[derive(Debug, Clone)]
pub struct CudaMemoryResource {
    device: Device,
}

impl CudaMemoryResource {
    /// A resource for `device`.
    pub fn new(device: Device) -> Self {
        CudaMemoryResource { device }
    }
}

impl DeviceMemoryResource for CudaMemoryResource {
    fn allocate(&self, bytes: usize, _stream: StreamView) -> Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        self.device
            .backend()
            .malloc(self.device.ordinal(), bytes)
            .map_err(|e| map_oom(e, self.device, bytes, self.name()))
    }

    fn deallocate(&self, ptr: DevicePtr, _bytes: usize, _stream: StreamView) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        self.device.backend().free(self.device.ordinal(), ptr)
    }

    fn device(&self) -> Device {
        self.device
    }

    fn name(&self) -> &'static str {
        "CudaMemoryResource"
    }

    /// Any two plain CUDA resources of one device can free each other's memory.
    fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
        other
            .as_any()
            .downcast_ref::<CudaMemoryResource>()
            .is_some_and(|o| o.device == self.device)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
