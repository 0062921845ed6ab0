//! RAII device containers, as RMM's `device_buffer`, `device_uvector<T>` and `device_scalar<T>`;
//! their semantics are on the crate page (`# Containers`).

mod device_buffer;
mod device_scalar;
mod device_uvector;
mod staging;

pub use device_buffer::DeviceBuffer;
pub use device_scalar::DeviceScalar;
pub use device_uvector::DeviceUVector;

use std::sync::Arc;

use crate::backend::DevicePtr;
use crate::device::{Device, current_device, with_device};
use crate::error::Result;
use crate::resource::DeviceMemoryResource;
use crate::stream_view::StreamView;

/// How a container holds its memory resource: an owning `Arc` ([`SharedResource`], the default,
/// or `Arc<R>` for static dispatch), or a borrow `&'a R` (RMM's non-owning
/// `device_async_resource_ref`, with the lifetime checked by the compiler).
///
/// [`SharedResource`]: crate::resource::SharedResource
pub trait ResourceHandle {
    /// The resource type the handle leads to.
    type Resource: DeviceMemoryResource + ?Sized;

    /// The resource.
    fn resource(&self) -> &Self::Resource;
}

impl<R: DeviceMemoryResource + ?Sized> ResourceHandle for Arc<R> {
    type Resource = R;

    fn resource(&self) -> &R {
        self
    }
}

impl<R: DeviceMemoryResource + ?Sized> ResourceHandle for &R {
    type Resource = R;

    fn resource(&self) -> &R {
        self
    }
}

/// Gives `ptr` back to `resource` on `stream` with device `ordinal` current (RMM's
/// `cuda_set_device_raii` around the deallocation).
#[inline]
pub(crate) fn deallocate_on<M: DeviceMemoryResource + ?Sized>(
    ordinal: u32,
    resource: &M,
    ptr: DevicePtr,
    bytes: usize,
    stream: StreamView,
) -> Result<()> {
    if current_device() == ordinal {
        return resource.deallocate(ptr, bytes, stream);
    }
    deallocate_switching(ordinal, resource, ptr, bytes, stream)
}

#[cold]
fn deallocate_switching<M: DeviceMemoryResource + ?Sized>(
    ordinal: u32,
    resource: &M,
    ptr: DevicePtr,
    bytes: usize,
    stream: StreamView,
) -> Result<()> {
    match with_device(ordinal, || resource.deallocate(ptr, bytes, stream)) {
        Ok(result) => result,
        // The device cannot be made current (the process-wide backend failed to start) and the
        // closure did not run: give the memory back without switching.
        Err(_) => resource.deallocate(ptr, bytes, stream),
    }
}

/// [`deallocate_on`], logging a failure (from `Drop` or cleanup, where it cannot be returned);
/// `what` says what was being done.
#[inline]
pub(crate) fn deallocate_or_log<M: DeviceMemoryResource + ?Sized>(
    what: &str,
    ordinal: u32,
    resource: &M,
    ptr: DevicePtr,
    bytes: usize,
    stream: StreamView,
) {
    if let Err(e) = deallocate_on(ordinal, resource, ptr, bytes, stream) {
        let (name, device) = (resource.name(), resource.device());
        log_deallocation_error(what, ptr, bytes, stream, name, device, &e);
    }
}

#[cold]
#[inline(never)]
fn log_deallocation_error(
    what: &str,
    ptr: DevicePtr,
    bytes: usize,
    stream: StreamView,
    resource: &str,
    device: Device,
    error: &crate::Error,
) {
    tracing::error!(
        "{what}: giving {bytes} bytes at {ptr} back to {resource} on {stream:?} of {device} \
         failed: {error}; the memory is leaked",
    );
}
