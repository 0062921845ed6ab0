//! [`DeviceScalar`]: one plain-old-data value in device memory, RMM's `device_scalar<T>`.

use std::fmt;

use bytemuck::Pod;

use super::{DeviceBuffer, DeviceUVector, ResourceHandle};
use crate::backend::DevicePtr;
use crate::device::Device;
use crate::error::Result;
use crate::per_device::get_current_device_resource;
use crate::resource::SharedResource;
use crate::stream_view::StreamView;

/// One `T` in device memory (RMM's `device_scalar<T>`), a one-element [`DeviceUVector`].
///
/// ```
/// # mod rmm { pub use rmm_allocator as allocator; }
/// use rmm::allocator::DeviceScalar;
/// use rmm::allocator::{Device, Stream};
///
/// let stream = Stream::new(Device::current()?)?;
/// let s = stream.view();
/// let mut counter = DeviceScalar::with_value(41u64, s)?;
/// let next = counter.value(s)? + 1; // copies back and synchronizes `s`
/// counter.set_value_async(next, s)?; // staged: `next` may change right away
/// assert_eq!(counter.value(s)?, 42);
/// # Ok::<(), rmm::allocator::Error>(())
/// ```
///
/// `R` is how the scalar holds its resource, as for [`DeviceBuffer`] ([`ResourceHandle`]); `Send`
/// and `Sync` as [`DeviceUVector`].
pub struct DeviceScalar<T: Pod, R: ResourceHandle = SharedResource> {
    storage: DeviceUVector<T, R>,
}

impl<T: Pod> DeviceScalar<T> {
    /// An uninitialized scalar from the current device's resource, allocated on `stream`.
    ///
    /// # Errors
    /// As [`DeviceUVector::new`].
    pub fn new(stream: StreamView) -> Result<Self> {
        Self::new_in(stream, get_current_device_resource()?)
    }

    /// A scalar from the current device's resource, set to `value` on `stream` without waiting.
    ///
    /// # Errors
    /// As [`new`](DeviceScalar::new), or [`set_value_async`](Self::set_value_async).
    pub fn with_value(value: T, stream: StreamView) -> Result<Self> {
        Self::with_value_in(value, stream, get_current_device_resource()?)
    }
}

impl<T: Pod, R: ResourceHandle> DeviceScalar<T, R> {
    /// An uninitialized scalar from `resource`, allocated on `stream`.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when `resource` cannot allocate.
    #[inline]
    pub fn new_in(stream: StreamView, resource: R) -> Result<Self> {
        Ok(DeviceScalar {
            storage: DeviceUVector::new_in(1, stream, resource)?,
        })
    }

    /// A scalar from `resource`, set to `value` on `stream` without waiting.
    ///
    /// # Errors
    /// As [`new_in`](Self::new_in), or [`set_value_async`](Self::set_value_async).
    pub fn with_value_in(value: T, stream: StreamView, resource: R) -> Result<Self> {
        let mut scalar = Self::new_in(stream, resource)?;
        scalar.set_value_async(value, stream)?;
        Ok(scalar)
    }

    /// A deep copy from the current device's resource, on `stream`.
    ///
    /// # Errors
    /// As [`DeviceUVector::deep_copy`].
    pub fn deep_copy(&self, stream: StreamView) -> Result<DeviceScalar<T>> {
        self.deep_copy_in(stream, get_current_device_resource()?)
    }

    /// A deep copy from `resource`, on `stream` after this scalar's pending set.
    ///
    /// # Errors
    /// As [`DeviceUVector::deep_copy_in`].
    pub fn deep_copy_in<R2: ResourceHandle>(
        &self,
        stream: StreamView,
        resource: R2,
    ) -> Result<DeviceScalar<T, R2>> {
        Ok(DeviceScalar {
            storage: self.storage.deep_copy_in(stream, resource)?,
        })
    }

    /// The value, read after `stream`'s queued work and pending sets (synchronizes `stream`).
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) when synchronizing `stream` or the copy fails.
    pub fn value(&self, stream: StreamView) -> Result<T> {
        self.storage.element(0, stream)
    }

    /// Enqueues a write of `value` on `stream` without waiting, staged as by
    /// [`DeviceUVector::set_element_async`]: unlike in RMM, the caller's value may change at once.
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) if the copy, memset or staging slot fails.
    pub fn set_value_async(&mut self, value: T, stream: StreamView) -> Result<()> {
        self.storage.set_element_async(0, value, stream)
    }

    /// Writes `value` after the work queued on `stream`; complete on return.
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) when synchronizing `stream` or the copy fails.
    pub fn set_value(&mut self, value: T, stream: StreamView) -> Result<()> {
        self.storage.set_element(0, value, stream)
    }

    /// Enqueues a memset of the value to zero on `stream` without waiting.
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) when the memset cannot be enqueued.
    pub fn set_value_to_zero_async(&mut self, stream: StreamView) -> Result<()> {
        self.storage.set_element_to_zero_async(0, stream)
    }

    /// The device address of the value.
    pub fn data(&self) -> DevicePtr {
        self.storage.data()
    }

    /// The stream most recently set; the one the memory is given back on.
    pub fn stream(&self) -> StreamView {
        self.storage.stream()
    }

    /// Sets the stream the memory is given back on.
    pub fn set_stream(&mut self, stream: StreamView) {
        self.storage.set_stream(stream);
    }

    /// The handle of the resource that allocated the memory and will take it back.
    pub fn memory_resource(&self) -> &R {
        self.storage.memory_resource()
    }

    /// The device the value lives on.
    pub fn device(&self) -> Device {
        self.storage.device()
    }

    /// The storage as an untyped [`DeviceBuffer`], after any pending asynchronous set.
    pub fn release(self) -> DeviceBuffer<R> {
        self.storage.release()
    }
}

impl<T: Pod, R: ResourceHandle> fmt::Debug for DeviceScalar<T, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceScalar")
            .field("storage", &self.storage)
            .finish()
    }
}
