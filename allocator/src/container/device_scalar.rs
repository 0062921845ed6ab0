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

/// A single `T` in device memory (RMM's `device_scalar<T>`), stored as a one-element
/// [`DeviceUVector`], whose rules it follows.
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
/// `R` is how the scalar holds its resource, as for [`DeviceBuffer`]: an owning
/// [`SharedResource`] by default, or a borrow (see [`ResourceHandle`]).
///
/// # Threads
/// `Send` and `Sync` for every `T: Pod`, for the reasons given on [`DeviceUVector`].
pub struct DeviceScalar<T: Pod, R: ResourceHandle = SharedResource> {
    storage: DeviceUVector<T, R>,
}

impl<T: Pod> DeviceScalar<T> {
    /// An uninitialized scalar from the current device's resource, allocated on `stream`.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when the resource cannot allocate; the
    /// backend's error (e.g. [`Error::NoSuchDevice`](crate::Error::NoSuchDevice)) when the current
    /// device has no resource.
    pub fn new(stream: StreamView) -> Result<Self> {
        Self::new_in(stream, get_current_device_resource()?)
    }

    /// A scalar from the current device's resource, set to `value` on `stream` without
    /// waiting (see [`set_value_async`](Self::set_value_async)).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when the resource cannot allocate;
    /// [`Error::Driver`](crate::Error::Driver) when the write cannot be enqueued; the backend's
    /// error when the current device has no resource.
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
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when `resource` cannot allocate;
    /// [`Error::Driver`](crate::Error::Driver) when the write cannot be enqueued.
    pub fn with_value_in(value: T, stream: StreamView, resource: R) -> Result<Self> {
        let mut scalar = Self::new_in(stream, resource)?;
        scalar.set_value_async(value, stream)?;
        Ok(scalar)
    }

    /// A deep copy from the current device's resource, copied on `stream`; see
    /// [`DeviceBuffer::deep_copy_in`] for the ordering guarantees.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when the resource cannot allocate;
    /// [`Error::Driver`](crate::Error::Driver) when the copy cannot be enqueued; the backend's
    /// error when the current device has no resource.
    pub fn deep_copy(&self, stream: StreamView) -> Result<DeviceScalar<T>> {
        self.deep_copy_in(stream, get_current_device_resource()?)
    }

    /// A deep copy from `resource`, copied on `stream` after this scalar's own pending set.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when `resource` cannot allocate;
    /// [`Error::Driver`](crate::Error::Driver) when the copy cannot be enqueued.
    pub fn deep_copy_in<R2: ResourceHandle>(
        &self,
        stream: StreamView,
        resource: R2,
    ) -> Result<DeviceScalar<T, R2>> {
        Ok(DeviceScalar {
            storage: self.storage.deep_copy_in(stream, resource)?,
        })
    }

    /// The value, copied to the host after the work queued on `stream` (and after this
    /// scalar's own asynchronous sets). Synchronizes `stream`.
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) when synchronizing `stream` or the copy fails.
    pub fn value(&self, stream: StreamView) -> Result<T> {
        self.storage.element(0, stream)
    }

    /// Enqueues a write of `value` on `stream` and returns without waiting.
    ///
    /// The value is staged in a page-locked slot the scalar owns, so the caller's copy of it
    /// may be dropped or changed at once (RMM requires it to live until the stream has run the
    /// copy). All-zero values take the memset fast path. See
    /// [`DeviceUVector::set_element_async`] for the cost of staging.
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) when the copy or memset cannot be enqueued, or the
    /// staging slot cannot be made.
    pub fn set_value_async(&mut self, value: T, stream: StreamView) -> Result<()> {
        self.storage.set_element_async(0, value, stream)
    }

    /// Writes `value` after the work queued on `stream`; the write has completed when this
    /// returns.
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) when synchronizing `stream` or the copy fails.
    pub fn set_value(&mut self, value: T, stream: StreamView) -> Result<()> {
        self.storage.set_element(0, value, stream)
    }

    /// Enqueues a memset of the value to zero bytes on `stream` and returns without waiting.
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) when the memset cannot be enqueued.
    pub fn set_value_to_zero_async(&mut self, stream: StreamView) -> Result<()> {
        self.storage.set_element_to_zero_async(0, stream)
    }

    /// The device address of the value.
    #[inline]
    pub fn data(&self) -> DevicePtr {
        self.storage.data()
    }

    /// The stream most recently set; the one the memory is given back on.
    #[inline]
    pub fn stream(&self) -> StreamView {
        self.storage.stream()
    }

    /// Sets the stream the memory is given back on.
    #[inline]
    pub fn set_stream(&mut self, stream: StreamView) {
        self.storage.set_stream(stream);
    }

    /// The handle of the resource that allocated the memory and will take it back.
    #[inline]
    pub fn memory_resource(&self) -> &R {
        self.storage.memory_resource()
    }

    /// The device the value lives on.
    #[inline]
    pub fn device(&self) -> Device {
        self.storage.device()
    }

    /// Gives up the storage as an untyped one-element [`DeviceBuffer`]; a pending
    /// asynchronous set is waited for first.
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
