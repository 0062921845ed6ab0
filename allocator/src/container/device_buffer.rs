//! [`DeviceBuffer`]: untyped, uninitialized device memory, RMM's `device_buffer`.

use std::fmt;

use super::{ResourceHandle, deallocate_or_log};
use crate::backend::DevicePtr;
use crate::device::{Device, current_device};
use crate::error::{Error, Result};
use crate::per_device::get_current_device_resource;
use crate::resource::{DeviceMemoryResource, SharedResource};
use crate::stream::{self, Event};
use crate::stream_view::StreamView;

/// An owned, untyped, uninitialized device allocation (RMM's `device_buffer`).
///
/// The memory comes from a [`DeviceMemoryResource`] (by default the current device's) and goes back
/// on drop, on the stream last set ([`set_stream`](Self::set_stream) or a reallocating call), with
/// the [`construction_device`](Self::construction_device) current (RMM's rule). The host reads the
/// bytes only by copying them out.
///
/// ```
/// # mod rmm { pub use rmm_allocator as allocator; }
/// use rmm::allocator::DeviceBuffer;
/// use rmm::allocator::{Device, Stream};
///
/// let stream = Stream::new(Device::current()?)?;
/// let mut buf = DeviceBuffer::from_host(b"hello device", stream.view())?;
/// buf.resize(5, stream.view())?; // within capacity: nothing is allocated or copied
/// assert_eq!(buf.to_vec(stream.view())?, b"hello");
/// # Ok::<(), rmm::allocator::Error>(())
/// ```
///
/// `R` is how the buffer holds its resource ([`ResourceHandle`]): an owning [`SharedResource`] by
/// default, or a borrow. The buffer is `Send` and `Sync` when its handle is.
pub struct DeviceBuffer<R: ResourceHandle = SharedResource> {
    ptr: DevicePtr,
    size: usize,
    capacity: usize,
    stream: StreamView,
    /// The thread's current device when the buffer was made (RMM records the same).
    construction_device: u32,
    resource: R,
}

impl DeviceBuffer {
    /// Allocates `size` uninitialized bytes from the current device's resource, on `stream`.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`]; the backend's error when no device is available.
    pub fn new(size: usize, stream: StreamView) -> Result<DeviceBuffer> {
        Self::new_in(size, stream, get_current_device_resource()?)
    }

    /// A copy of `src` from the current device's resource, after `stream`'s queued work.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`]; [`Error::Driver`] when the copy fails; the backend's error.
    pub fn from_host(src: &[u8], stream: StreamView) -> Result<DeviceBuffer> {
        Self::from_host_in(src, stream, get_current_device_resource()?)
    }

    /// A copy of `size` device bytes at `src` from the current device's resource, enqueued on
    /// `stream`; as in RMM, `src` stays valid and unwritten until the copy ran.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`]; [`Error::Driver`] if enqueuing fails; the backend's error.
    pub fn from_device(src: DevicePtr, size: usize, stream: StreamView) -> Result<DeviceBuffer> {
        Self::from_device_in(src, size, stream, get_current_device_resource()?)
    }
}

impl<R: ResourceHandle> DeviceBuffer<R> {
    /// Allocates `size` uninitialized bytes (0: a null pointer) from `resource` on `stream`, also
    /// the deallocation stream.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] (or the resource's own error).
    #[inline]
    pub fn new_in(size: usize, stream: StreamView, resource: R) -> Result<Self> {
        let construction_device = current_device();
        let ptr = if size == 0 {
            DevicePtr::NULL
        } else {
            resource.resource().allocate(size, stream)?
        };
        Ok(DeviceBuffer {
            ptr,
            size,
            capacity: size,
            stream,
            construction_device,
            resource,
        })
    }

    /// As [`from_host`](DeviceBuffer::from_host), from `resource`.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`]; [`Error::Driver`] when the copy fails.
    pub fn from_host_in(src: &[u8], stream: StreamView, resource: R) -> Result<Self> {
        let mut buf = Self::new_in(src.len(), stream, resource)?;
        buf.copy_from_host(src, stream)?;
        Ok(buf)
    }

    /// As [`from_device`](DeviceBuffer::from_device), from `resource`.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`]; [`Error::Driver`] when the copy cannot be enqueued.
    pub fn from_device_in(
        src: DevicePtr,
        size: usize,
        stream: StreamView,
        resource: R,
    ) -> Result<Self> {
        let buf = Self::new_in(size, stream, resource)?;
        buf.device()
            .copy_device_to_device_async(buf.ptr, src, size, stream)?;
        Ok(buf)
    }

    /// A deep copy from the current device's resource on `stream` (RMM's copy constructor).
    ///
    /// # Errors
    /// As [`deep_copy_in`](Self::deep_copy_in), or the backend's error.
    pub fn deep_copy(&self, stream: StreamView) -> Result<DeviceBuffer> {
        self.deep_copy_in(stream, get_current_device_resource()?)
    }

    /// A deep copy (capacity = size) from `resource` on `stream`, enqueued in `stream`'s order (as
    /// in RMM, the caller orders other streams' writes before it). Unlike RMM, this buffer may be
    /// dropped at once: its deallocation waits for the copy (a buffer on the per-thread default
    /// stream waits here instead).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`]; [`Error::Driver`] if the copy or its event cannot be enqueued.
    pub fn deep_copy_in<R2: ResourceHandle>(
        &self,
        stream: StreamView,
        resource: R2,
    ) -> Result<DeviceBuffer<R2>> {
        let copy = DeviceBuffer::new_in(self.size, stream, resource)?;
        copy.device()
            .copy_device_to_device_async(copy.ptr, self.ptr, self.size, stream)?;
        if self.size > 0 {
            self.release_after(stream)?;
        }
        Ok(copy)
    }

    /// Orders deallocation after `user`'s queued work, so no pending copy reads freed memory.
    fn release_after(&self, user: StreamView) -> Result<()> {
        if self.stream.is_per_thread() {
            // The memory goes back on its owner thread's per-thread default stream, which this
            // thread cannot name (nor tell from its own): the copy completes first.
            return stream::synchronize_stream(self.device(), user);
        }
        if user == self.stream {
            return Ok(());
        }
        let done = Event::new(self.device())?;
        done.record(user)?;
        done.wait_on(self.stream)
    }

    /// The number of bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The size of the allocation in bytes (at least [`size`](Self::size)).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// True when the size is zero (the buffer may still hold an allocation).
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The device address of the first byte (null when unallocated); other streams than
    /// [`stream`](Self::stream) need ordering (an event), as in RMM.
    pub fn data(&self) -> DevicePtr {
        self.ptr
    }

    /// The stream most recently set; the one the memory is given back on.
    pub fn stream(&self) -> StreamView {
        self.stream
    }

    /// Sets the stream the memory is given back on (until a reallocating call names another).
    pub fn set_stream(&mut self, stream: StreamView) {
        self.stream = stream;
    }

    /// The handle of the resource that allocated the memory and will take it back.
    pub fn memory_resource(&self) -> &R {
        &self.resource
    }

    /// The device the memory is on (its resource's); streams passed to the buffer must be too.
    pub fn device(&self) -> Device {
        self.resource.resource().device()
    }

    /// The thread's current device at construction (as RMM), current again to free the memory.
    pub fn construction_device(&self) -> u32 {
        self.construction_device
    }

    /// Sets the size to `new_size` bytes on `stream`, which becomes the deallocation stream. Beyond
    /// capacity, exactly `new_size` bytes are allocated and the contents copied, on `stream`; new
    /// bytes are uninitialized. On error only the stream changes.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when growing cannot allocate; [`Error::Driver`] when the copy fails.
    pub fn resize(&mut self, new_size: usize, stream: StreamView) -> Result<()> {
        self.reserve(new_size, stream)?;
        self.size = new_size;
        Ok(())
    }

    /// Makes the capacity at least `new_capacity` bytes on `stream` (the new deallocation stream),
    /// growing as [`resize`](Self::resize).
    ///
    /// # Errors
    /// As [`resize`](Self::resize).
    pub fn reserve(&mut self, new_capacity: usize, stream: StreamView) -> Result<()> {
        self.set_stream(stream);
        if new_capacity > self.capacity {
            self.reallocate(new_capacity, stream)?;
        }
        Ok(())
    }

    /// Reallocates to exactly [`size`](Self::size) bytes on `stream`, the new deallocation stream
    /// (a no-op at capacity; size 0 frees it).
    ///
    /// # Errors
    /// As [`resize`](Self::resize).
    pub fn shrink_to_fit(&mut self, stream: StreamView) -> Result<()> {
        self.set_stream(stream);
        if self.size != self.capacity {
            self.reallocate(self.size, stream)?;
        }
        Ok(())
    }

    /// Moves the bytes into a new `new_capacity`-byte allocation on `stream`; unchanged on error.
    fn reallocate(&mut self, new_capacity: usize, stream: StreamView) -> Result<()> {
        let _span = tracing::debug_span!(
            "DeviceBuffer::reallocate",
            from = self.capacity,
            to = new_capacity
        )
        .entered();
        let (mr, ordinal) = (self.resource.resource(), self.construction_device);
        let device = mr.device();
        let new_ptr = if new_capacity == 0 {
            DevicePtr::NULL
        } else {
            mr.allocate(new_capacity, stream)?
        };
        let keep = self.size.min(new_capacity);
        if let Err(e) = device.copy_device_to_device_async(new_ptr, self.ptr, keep, stream) {
            if new_capacity > 0 {
                let what = "DeviceBuffer reallocation (after a failed copy)";
                deallocate_or_log(what, ordinal, mr, new_ptr, new_capacity, stream);
            }
            return Err(e);
        }
        let (old_ptr, old_capacity) = (self.ptr, self.capacity);
        // Freed on `stream` behind the copy; a failure leaks it, the resize stands.
        if old_capacity > 0 {
            let what = "DeviceBuffer reallocation";
            deallocate_or_log(what, ordinal, mr, old_ptr, old_capacity, stream);
        }
        self.ptr = new_ptr;
        self.capacity = new_capacity;
        Ok(())
    }

    /// Copies `src` into the buffer after the work queued on `stream`; complete on return.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the lengths differ; [`Error::Driver`] if a sync or copy fails.
    pub fn copy_from_host(&mut self, src: &[u8], stream: StreamView) -> Result<()> {
        // Synchronous copies are not ordered with a non-default stream: wait for it first.
        if self.check_host_len("src.len()", src.len())? {
            stream::synchronize_stream(self.device(), stream)?;
            self.device().copy_to_device(self.ptr, src)?;
        }
        Ok(())
    }

    /// Copies the buffer into `dst` after the work queued on `stream`; complete on return.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the lengths differ; [`Error::Driver`] if a sync or copy fails.
    pub fn copy_to_host(&self, dst: &mut [u8], stream: StreamView) -> Result<()> {
        if self.check_host_len("dst.len()", dst.len())? {
            stream::synchronize_stream(self.device(), stream)?;
            self.device().copy_to_host(dst, self.ptr)?;
        }
        Ok(())
    }

    /// The buffer's bytes, copied to the host after the work queued on `stream`.
    ///
    /// # Errors
    /// [`Error::Driver`] when synchronizing or the copy fails.
    pub fn to_vec(&self, stream: StreamView) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.size];
        self.copy_to_host(&mut out, stream)?;
        Ok(out)
    }

    /// Whether there is anything to copy: an error unless `len` is the buffer's size.
    fn check_host_len(&self, what: &'static str, len: usize) -> Result<bool> {
        if len == self.size {
            Ok(len > 0)
        } else {
            Err(Error::invalid_argument(
                what,
                len,
                format!(
                    "the buffer's size, {} bytes (resize the buffer or slice the host data)",
                    self.size
                ),
            ))
        }
    }
}

impl<R: ResourceHandle> Drop for DeviceBuffer<R> {
    #[inline]
    fn drop(&mut self) {
        if self.capacity == 0 {
            return;
        }
        deallocate_or_log(
            "dropping a DeviceBuffer",
            self.construction_device,
            self.resource.resource(),
            self.ptr,
            self.capacity,
            self.stream,
        );
    }
}

impl<R: ResourceHandle> fmt::Debug for DeviceBuffer<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &self.ptr)
            .field("size", &self.size)
            .field("capacity", &self.capacity)
            .field("stream", &self.stream)
            .field("device", &self.device())
            .field("construction_device", &self.construction_device)
            .field("resource", &self.resource.resource().name())
            .finish()
    }
}
