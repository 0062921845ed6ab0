//! Memory straight from the driver, freed with `cuMemFree`: RMM's `cuda_memory_resource`
//! ([`CudaMemoryResource`], `cuMemAlloc`) and `managed_memory_resource` ([`ManagedMemoryResource`],
//! `cuMemAllocManaged`), one type parameterized by the kind of memory.

use std::any::Any;
use std::fmt;
use std::marker::PhantomData;

use super::{DeviceMemoryResource, map_oom};
use crate::backend::DevicePtr;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream_view::StreamView;

mod sealed {
    use crate::backend::DevicePtr;
    use crate::device::Device;
    use crate::error::Result;

    /// Only this file's kinds of memory; the driver call is not callable from outside.
    pub trait Sealed {
        /// The driver call that allocates `bytes` on `device`.
        fn malloc(device: Device, bytes: usize) -> Result<DevicePtr>;
    }
}

/// Which memory a [`DriverMemoryResource`] allocates: [`Plain`] or [`Managed`].
pub trait DriverMemory: sealed::Sealed + Send + Sync + 'static {
    /// The resource's type name, for errors and reports.
    const NAME: &'static str;
}

/// Device memory (`cuMemAlloc`).
#[derive(Debug, Clone, Copy)]
pub struct Plain;

/// Unified memory, migrated on demand (`cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL)`).
#[derive(Debug, Clone, Copy)]
pub struct Managed;

impl sealed::Sealed for Plain {
    fn malloc(device: Device, bytes: usize) -> Result<DevicePtr> {
        device.backend().malloc(device.ordinal(), bytes)
    }
}

impl sealed::Sealed for Managed {
    fn malloc(device: Device, bytes: usize) -> Result<DevicePtr> {
        device.backend().malloc_managed(device.ordinal(), bytes)
    }
}

impl DriverMemory for Plain {
    const NAME: &'static str = "CudaMemoryResource";
}

impl DriverMemory for Managed {
    const NAME: &'static str = "ManagedMemoryResource";
}

/// `cuMemAlloc`/`cuMemFree`, synchronous and slow: pool it on hot paths. Devices start with it.
pub type CudaMemoryResource = DriverMemoryResource<Plain>;

/// Unified memory from `cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL)`, freed with `cuMemFree`.
pub type ManagedMemoryResource = DriverMemoryResource<Managed>;

/// Memory of kind `M` from the driver, one call per allocation; see [`CudaMemoryResource`],
/// [`ManagedMemoryResource`].
#[derive(Clone)]
pub struct DriverMemoryResource<M: DriverMemory> {
    device: Device,
    memory: PhantomData<M>,
}

impl CudaMemoryResource {
    /// A resource for `device`.
    pub fn new(device: Device) -> Self {
        DriverMemoryResource {
            device,
            memory: PhantomData,
        }
    }
}

impl ManagedMemoryResource {
    /// A resource for `device`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] without managed memory; [`Error::Driver`] reading properties.
    pub fn new(device: Device) -> Result<Self> {
        if !device.properties()?.supports_managed_memory {
            return Err(Error::Unsupported {
                what: "managed memory",
                backend: device.backend().kind().name(),
                hint: format!("{device} reports no managed memory support; use CudaMemoryResource"),
            });
        }
        Ok(DriverMemoryResource {
            device,
            memory: PhantomData,
        })
    }
}

impl<M: DriverMemory> fmt::Debug for DriverMemoryResource<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(M::NAME)
            .field("device", &self.device)
            .finish()
    }
}

impl<M: DriverMemory> DeviceMemoryResource for DriverMemoryResource<M> {
    fn allocate(&self, bytes: usize, _stream: StreamView) -> Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        M::malloc(self.device, bytes).map_err(|e| map_oom(e, self.device, bytes, M::NAME))
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
        M::NAME
    }

    /// Any two resources of one kind and device can free each other's memory.
    fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
        other
            .as_any()
            .downcast_ref::<Self>()
            .is_some_and(|o| o.device == self.device)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
