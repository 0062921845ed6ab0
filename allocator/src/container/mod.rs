//! RAII device containers, as RMM's `device_buffer`, `device_uvector<T>` and `device_scalar<T>`.
//!
//! * [`DeviceBuffer`]: untyped, uninitialized device bytes with a size and a capacity.
//! * [`DeviceUVector`]: an uninitialized vector of plain-old-data elements ([`bytemuck::Pod`]).
//! * [`DeviceScalar`]: one plain-old-data value in device memory.
//!
//! # Semantics kept from RMM
//!
//! * Memory comes from a [`DeviceMemoryResource`], by default the
//!   current device's ([`get_current_device_resource`](crate::per_device::get_current_device_resource));
//!   the `*_in` constructors take one explicitly. By default containers own a
//!   [`SharedResource`](crate::resource::SharedResource), so the resource lives as long as
//!   they do; they can also borrow it (`&'a dyn DeviceMemoryResource`, like RMM's non-owning
//!   `device_async_resource_ref` but checked by the compiler): see [`ResourceHandle`].
//! * Contents are uninitialized. Every operation that allocates or copies takes a stream.
//! * Memory is given back on the stream most recently passed to [`DeviceBuffer::set_stream`]
//!   or to an operation that may reallocate (`resize`, `reserve`, `shrink_to_fit`), with the
//!   device that was current when the container was made made current again for the call
//!   (RMM records the current device at construction, and so do these).
//! * Growing beyond the capacity allocates exactly the new size and copies the old contents
//!   on the given stream; shrinking the size never reallocates (`shrink_to_fit` does).
//!
//! # What Rust adds
//!
//! * Device bytes are never exposed as host memory: reading them copies them out
//!   (`to_vec`, `copy_to_host`, `element`, `value`).
//! * Operations that borrow host data return only when the device is done with it. The
//!   asynchronous setters (`set_element_async`, `set_value_async`) take the value by value and
//!   copy it through a small page-locked staging slot that the container owns; the slot is
//!   reused or freed only after the event recorded behind the copy has completed. The source
//!   of the value may therefore be dropped or changed as soon as the call returns.
//! * Reads, reallocations and zeroing through a container are ordered after its own earlier
//!   asynchronous sets, whatever stream those were on.
//! * An index out of range is an [`Error::IndexOutOfRange`](crate::Error::IndexOutOfRange), and
//!   a size that overflows is an [`Error::InvalidArgument`](crate::Error::InvalidArgument).
//! * Errors while giving memory back in `Drop` are logged with `tracing::error!`, never
//!   panicked on.
//!
//! # Cost
//!
//! Construction and drop add no heap allocation, driver call or log event to the resource's
//! own `allocate`/`deallocate`: the staging slot and its event are made on the first
//! asynchronous set that needs them. A borrowed resource handle adds a few nanoseconds; the
//! owning default adds one reference-count increment and decrement (two atomic operations).
//! `benches/containers.rs` measures both.

mod device_buffer;
mod device_scalar;
mod device_uvector;
mod staging;

pub use bytemuck::{Pod, Zeroable};
pub use device_buffer::DeviceBuffer;
pub use device_scalar::DeviceScalar;
pub use device_uvector::DeviceUVector;

use std::sync::Arc;

use crate::DeviceMemoryResource;
use crate::backend::DevicePtr;
use crate::device::{Device, current_device, with_device};
use crate::error::Result;
use crate::stream::StreamView;

/// How a container holds its memory resource.
///
/// * [`SharedResource`](crate::resource::SharedResource) (`Arc<dyn DeviceMemoryResource>`,
///   the default type parameter): the container owns a reference, so the resource lives at
///   least as long as the container. Costs one reference-count increment and decrement per
///   container (two atomic operations).
/// * `&'a R` or `&'a dyn DeviceMemoryResource`: the container borrows the resource, as RMM's
///   non-owning `device_async_resource_ref` does, but with the lifetime checked by the
///   compiler. No reference counting; with a concrete `R`, calls are statically dispatched.
/// * `Arc<R>` for a concrete `R`: owning, statically dispatched.
pub trait ResourceHandle {
    /// The resource type the handle leads to.
    type Resource: DeviceMemoryResource + ?Sized;

    /// The resource.
    fn resource(&self) -> &Self::Resource;
}

impl<R: DeviceMemoryResource + ?Sized> ResourceHandle for Arc<R> {
    type Resource = R;

    #[inline]
    fn resource(&self) -> &R {
        self
    }
}

impl<R: DeviceMemoryResource + ?Sized> ResourceHandle for &R {
    type Resource = R;

    #[inline]
    fn resource(&self) -> &R {
        self
    }
}

/// Gives `ptr` back to `resource` on `stream` with device `ordinal` made the thread's current
/// device (RMM's `cuda_set_device_raii` around the deallocation).
///
/// The fast path, where `ordinal` is already current, is one thread-local read.
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
        // The device cannot be made current (the process-wide backend failed to start): give
        // the memory back without switching. `with_device` did not run the closure.
        Err(_) => resource.deallocate(ptr, bytes, stream),
    }
}

/// Logs a failure to give memory back (from `Drop`, where it cannot be returned).
#[cold]
#[inline(never)]
pub(crate) fn log_deallocation_error(
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
