//! [`ManagedMemoryResource`]: `cuMemAllocManaged`, RMM's `managed_memory_resource`.

use std::any::Any;

use super::{DeviceMemoryResource, map_oom};
use crate::backend::DevicePtr;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream_view::StreamView;

/// Allocates unified memory with `cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL)`, accessible from
/// host and device and migrated on demand; frees with `cuMemFree`.
#[derive(Debug, Clone)]
pub struct ManagedMemoryResource {
    device: Device,
}

impl ManagedMemoryResource {
    /// A resource for `device`; fails if the device has no managed memory support.
    ///
    /// # Errors
    /// [`Error::Unsupported`](crate::Error::Unsupported) when `device` has no managed memory
    /// support; [`Error::Driver`](crate::Error::Driver) when its properties cannot be read.
    pub fn new(device: Device) -> Result<Self> {
        if !device.properties()?.supports_managed_memory {
            return Err(Error::Unsupported {
                what: "managed memory",
                backend: device.backend().kind().name(),
                hint: format!("{device} reports no managed memory support; use CudaMemoryResource"),
            });
        }
        Ok(ManagedMemoryResource { device })
    }
}

impl DeviceMemoryResource for ManagedMemoryResource {
    fn allocate(&self, bytes: usize, _stream: StreamView) -> Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        self.device
            .backend()
            .malloc_managed(self.device.ordinal(), bytes)
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
        "ManagedMemoryResource"
    }

    /// Any two managed resources of one device can free each other's memory.
    fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
        other
            .as_any()
            .downcast_ref::<ManagedMemoryResource>()
            .is_some_and(|o| o.device == self.device)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
