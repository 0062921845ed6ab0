//! [`DeviceBuffer`]: untyped, uninitialized device memory, RMM's `device_buffer`.

use std::fmt;

use super::{ResourceHandle, deallocate_on, log_deallocation_error};
use crate::backend::DevicePtr;
use crate::device::{Device, current_device};
use crate::error::{Error, Result};
use crate::per_device::get_current_device_resource;
use crate::resource::DeviceMemoryResource;
use crate::resource::SharedResource;
use crate::stream::{self, Event};
use crate::stream_view::StreamView;

/// An owned, untyped, uninitialized device allocation with a size and a capacity
/// (RMM's `device_buffer`).
///
/// The memory comes from a [`DeviceMemoryResource`] (by default the current device's) and goes
/// back to it on drop, on the stream most recently set by [`set_stream`](Self::set_stream),
/// [`resize`](Self::resize), [`reserve`](Self::reserve) or
/// [`shrink_to_fit`](Self::shrink_to_fit), with the device that was current at construction
/// made current again (RMM's rule; see [`construction_device`](Self::construction_device)).
/// The bytes are
/// uninitialized until written; the host reads them only by copying them out
/// ([`to_vec`](Self::to_vec), [`copy_to_host`](Self::copy_to_host)).
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
/// # Resource handle
/// `R` is how the buffer holds its resource (see [`ResourceHandle`]): by default an owning
/// [`SharedResource`]; `&'a dyn DeviceMemoryResource` (or `&'a ConcreteResource`) borrows it
/// for the buffer's lifetime and saves the reference counting.
///
/// # Threads
/// `DeviceBuffer` is `Send` and `Sync` whenever its handle is (always for the owning default
/// and for borrows, since resources are `Send + Sync` by the trait's contract): it owns its
/// allocation exclusively (like a `Box`) and its other fields are plain values. Shared (`&`)
/// access only reads the device bytes (copying them out, or into a new buffer); everything
/// that changes the allocation takes `&mut self`.
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
    /// Allocates `size` uninitialized bytes from the current device's resource, in stream
    /// order on `stream`.
    ///
    /// # Errors
    /// Fails with [`Error::OutOfMemory`] when the resource cannot allocate, or with the
    /// backend's error when no device is available.
    pub fn new(size: usize, stream: StreamView) -> Result<DeviceBuffer> {
        Self::new_in(size, stream, get_current_device_resource()?)
    }

    /// A buffer holding a copy of `src`, from the current device's resource.
    ///
    /// The copy is ordered after the work already queued on `stream`, and has completed when
    /// this returns, so `src` is borrowed only for the call.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when the resource cannot allocate;
    /// [`Error::Driver`](crate::Error::Driver) when the copy fails; the backend's error when the
    /// current device has no resource.
    pub fn from_host(src: &[u8], stream: StreamView) -> Result<DeviceBuffer> {
        Self::from_host_in(src, stream, get_current_device_resource()?)
    }

    /// A buffer holding a copy of `size` device bytes at `src`, from the current device's
    /// resource. The copy is enqueued on `stream` and not waited for.
    ///
    /// As in RMM, the caller keeps `src` valid (not freed, not written by other streams)
    /// until `stream` has run the copy.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when the resource cannot allocate;
    /// [`Error::Driver`](crate::Error::Driver) when the copy cannot be enqueued; the backend's
    /// error when the current device has no resource.
    pub fn from_device(src: DevicePtr, size: usize, stream: StreamView) -> Result<DeviceBuffer> {
        Self::from_device_in(src, size, stream, get_current_device_resource()?)
    }
}

impl<R: ResourceHandle> DeviceBuffer<R> {
    /// Allocates `size` uninitialized bytes from `resource`, in stream order on `stream`.
    ///
    /// Zero bytes allocate nothing (the pointer is null). The deallocation stream is `stream`;
    /// the thread's current device is recorded, to be made current again when the memory is
    /// given back.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) (or the resource's own error) when
    /// `resource` cannot allocate `size` bytes.
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

    /// A buffer holding a copy of `src`, from `resource`; see
    /// [`from_host`](DeviceBuffer::from_host).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when `resource` cannot allocate;
    /// [`Error::Driver`](crate::Error::Driver) when the copy fails.
    pub fn from_host_in(src: &[u8], stream: StreamView, resource: R) -> Result<Self> {
        let mut buf = Self::new_in(src.len(), stream, resource)?;
        buf.copy_from_host(src, stream)?;
        Ok(buf)
    }

    /// A buffer holding a copy of `size` device bytes at `src`, from `resource`; see
    /// [`from_device`](DeviceBuffer::from_device).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when `resource` cannot allocate;
    /// [`Error::Driver`](crate::Error::Driver) when the copy cannot be enqueued.
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

    /// A deep copy of the first [`size`](Self::size) bytes (capacity = size), allocated from
    /// the current device's resource and copied on `stream` (RMM's copy constructor with a
    /// stream).
    ///
    /// See [`deep_copy_in`](Self::deep_copy_in) for the ordering guarantees.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when the resource cannot allocate;
    /// [`Error::Driver`](crate::Error::Driver) when the copy cannot be enqueued; the backend's
    /// error when the current device has no resource.
    pub fn deep_copy(&self, stream: StreamView) -> Result<DeviceBuffer> {
        self.deep_copy_in(stream, get_current_device_resource()?)
    }

    /// A deep copy of the first [`size`](Self::size) bytes (capacity = size), allocated from
    /// `resource` and copied on `stream`, which must belong to `resource`'s device.
    ///
    /// The copy is enqueued, not waited for. It reads this buffer in `stream`'s order: work on
    /// other streams that writes this buffer must be ordered before it by the caller, as in
    /// RMM. Unlike RMM, this buffer may be dropped at once: when its deallocation stream is
    /// not `stream`, that stream is made to wait for the copy first.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when `resource` cannot allocate;
    /// [`Error::Driver`](crate::Error::Driver) when the copy, or the event that orders the
    /// deallocation stream after it, cannot be enqueued.
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

    /// Makes this buffer's deallocation stream wait for the work queued on `user` so far, so
    /// that memory a pending copy on `user` reads cannot be given back before it has run.
    fn release_after(&self, user: StreamView) -> Result<()> {
        if user == self.stream {
            return Ok(());
        }
        let done = Event::new(self.device())?;
        done.record(user)?;
        done.wait_on(self.stream)
    }

    /// The number of bytes.
    #[inline]
    pub fn size(&self) -> usize {
        self.size
    }

    /// The size of the allocation in bytes (at least [`size`](Self::size)).
    #[inline]
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// True when the size is zero (the buffer may still hold an allocation).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The device address of the first byte (null when nothing is allocated).
    ///
    /// Using it on a stream other than [`stream`](Self::stream) needs the usual
    /// inter-stream ordering (an event), as in RMM.
    #[inline]
    pub fn data(&self) -> DevicePtr {
        self.ptr
    }

    /// The stream most recently set; the one the memory is given back on.
    #[inline]
    pub fn stream(&self) -> StreamView {
        self.stream
    }

    /// Sets the stream the memory is given back on (until another reallocating call names
    /// another stream).
    #[inline]
    pub fn set_stream(&mut self, stream: StreamView) {
        self.stream = stream;
    }

    /// The handle of the resource that allocated the memory and will take it back.
    #[inline]
    pub fn memory_resource(&self) -> &R {
        &self.resource
    }

    /// The device the memory lives on (its resource's device). Copies and events of the
    /// buffer are issued to it; streams passed to the buffer must belong to it.
    pub fn device(&self) -> Device {
        self.resource.resource().device()
    }

    /// The ordinal of the device that was the thread's current device when the buffer was
    /// made; it is made current again while the memory is given back (RMM records the same).
    /// With the current device's resource (the default) this is [`device`](Self::device).
    #[inline]
    pub fn construction_device(&self) -> u32 {
        self.construction_device
    }

    /// Sets the size to `new_size` bytes, on `stream` (which also becomes the deallocation
    /// stream).
    ///
    /// Within the capacity only the size changes: nothing is allocated or copied. Beyond it, a
    /// new allocation of exactly `new_size` bytes is made on `stream`, the old contents are
    /// copied to it on `stream`, and the old allocation is given back on `stream`. Bytes past
    /// the old size are uninitialized. On error the buffer is unchanged (apart from its stream).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when growing past the capacity cannot
    /// allocate; [`Error::Driver`](crate::Error::Driver) when the copy fails.
    pub fn resize(&mut self, new_size: usize, stream: StreamView) -> Result<()> {
        self.set_stream(stream);
        if new_size > self.capacity {
            self.reallocate(new_size, stream)?;
        }
        self.size = new_size;
        Ok(())
    }

    /// Makes the capacity at least `new_capacity` bytes, on `stream` (which also becomes the
    /// deallocation stream). The size and contents are kept; see [`resize`](Self::resize)
    /// for how growing works. A capacity already large enough is left alone.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when the new allocation fails;
    /// [`Error::Driver`](crate::Error::Driver) when the copy fails.
    pub fn reserve(&mut self, new_capacity: usize, stream: StreamView) -> Result<()> {
        self.set_stream(stream);
        if new_capacity > self.capacity {
            self.reallocate(new_capacity, stream)?;
        }
        Ok(())
    }

    /// Reallocates to exactly [`size`](Self::size) bytes and copies the contents, on `stream`
    /// (which also becomes the deallocation stream). Nothing happens when size equals
    /// capacity. A size of zero gives the allocation back and leaves a null pointer.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when the new allocation fails;
    /// [`Error::Driver`](crate::Error::Driver) when the copy fails.
    pub fn shrink_to_fit(&mut self, stream: StreamView) -> Result<()> {
        self.set_stream(stream);
        if self.size != self.capacity {
            self.reallocate(self.size, stream)?;
        }
        Ok(())
    }

    /// Moves the first `min(size, new_capacity)` bytes into a fresh allocation of exactly
    /// `new_capacity` bytes, all on `stream`. On error nothing changes.
    fn reallocate(&mut self, new_capacity: usize, stream: StreamView) -> Result<()> {
        let _span = tracing::debug_span!(
            "DeviceBuffer::reallocate",
            from = self.capacity,
            to = new_capacity
        )
        .entered();
        let mr = self.resource.resource();
        let device = mr.device();
        let new_ptr = if new_capacity == 0 {
            DevicePtr::NULL
        } else {
            mr.allocate(new_capacity, stream)?
        };
        let keep = self.size.min(new_capacity);
        if let Err(e) = device.copy_device_to_device_async(new_ptr, self.ptr, keep, stream) {
            if new_capacity > 0
                && let Err(free_error) =
                    deallocate_on(self.construction_device, mr, new_ptr, new_capacity, stream)
            {
                log_deallocation_error(
                    "DeviceBuffer reallocation (after a failed copy)",
                    new_ptr,
                    new_capacity,
                    stream,
                    mr.name(),
                    device,
                    &free_error,
                );
            }
            return Err(e);
        }
        let (old_ptr, old_capacity) = (self.ptr, self.capacity);
        // The old allocation goes back on `stream`, behind the copy that reads it. If that
        // fails the memory is leaked; the resize itself has succeeded.
        if old_capacity > 0
            && let Err(e) =
                deallocate_on(self.construction_device, mr, old_ptr, old_capacity, stream)
        {
            log_deallocation_error(
                "DeviceBuffer reallocation",
                old_ptr,
                old_capacity,
                stream,
                mr.name(),
                device,
                &e,
            );
        }
        self.ptr = new_ptr;
        self.capacity = new_capacity;
        Ok(())
    }

    /// Copies `src` into the buffer, ordered after the work queued on `stream`; the copy has
    /// completed when this returns. `src.len()` must equal [`size`](Self::size).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when `src.len() != size()`;
    /// [`Error::Driver`](crate::Error::Driver) when synchronizing or the copy fails.
    pub fn copy_from_host(&mut self, src: &[u8], stream: StreamView) -> Result<()> {
        self.check_host_len("src.len()", src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        // Synchronous copies are not ordered with a non-default stream: wait for it first.
        let device = self.device();
        stream::synchronize_stream(device, stream)?;
        device.copy_to_device(self.ptr, src)
    }

    /// Copies the buffer into `dst`, ordered after the work queued on `stream`; the copy has
    /// completed when this returns. `dst.len()` must equal [`size`](Self::size).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when `dst.len() != size()`;
    /// [`Error::Driver`](crate::Error::Driver) when synchronizing or the copy fails.
    pub fn copy_to_host(&self, dst: &mut [u8], stream: StreamView) -> Result<()> {
        self.check_host_len("dst.len()", dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        let device = self.device();
        stream::synchronize_stream(device, stream)?;
        device.copy_to_host(dst, self.ptr)
    }

    /// The buffer's bytes, copied to the host after the work queued on `stream`.
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) when synchronizing `stream` or the copy fails.
    pub fn to_vec(&self, stream: StreamView) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.size];
        self.copy_to_host(&mut out, stream)?;
        Ok(out)
    }

    fn check_host_len(&self, what: &'static str, len: usize) -> Result<()> {
        if len == self.size {
            Ok(())
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
        let mr = self.resource.resource();
        if let Err(e) = deallocate_on(
            self.construction_device,
            mr,
            self.ptr,
            self.capacity,
            self.stream,
        ) {
            log_deallocation_error(
                "dropping a DeviceBuffer",
                self.ptr,
                self.capacity,
                self.stream,
                mr.name(),
                mr.device(),
                &e,
            );
        }
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
