//! [`DeviceUVector`]: an uninitialized vector of plain-old-data values (RMM's `device_uvector<T>`).

use std::fmt;
use std::marker::PhantomData;
use std::mem::size_of;

use bytemuck::Pod;

use super::staging::Staging;
use super::{DeviceBuffer, ResourceHandle};
use crate::backend::DevicePtr;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::per_device::get_current_device_resource;
use crate::resource::SharedResource;
use crate::stream_view::StreamView;

/// An uninitialized vector of `T` in device memory (RMM's `device_uvector<T>`).
///
/// `T` is [`bytemuck::Pod`] (C++'s "trivially copyable"), so elements move as bytes. Storage is a
/// [`DeviceBuffer`], with its rules (e.g. memory goes back on the stream last set).
///
/// ```
/// # mod rmm { pub use rmm_allocator as allocator; }
/// use rmm::allocator::DeviceUVector;
/// use rmm::allocator::{Device, Stream};
///
/// let stream = Stream::new(Device::current()?)?;
/// let s = stream.view();
/// let mut v = DeviceUVector::<u32>::from_host(&[1, 2, 3], s)?;
/// v.set_element_async(0, 10, s)?; // the value is staged: no borrow outlives the call
/// v.resize(4, s)?;                // beyond capacity: reallocates, copies on `s`
/// v.set_element_to_zero_async(3, s)?;
/// assert_eq!(v.to_vec(s)?, [10, 2, 3, 0]);
/// assert!(v.element(4, s).is_err()); // out of range is an error, not undefined behaviour
/// # Ok::<(), rmm::allocator::Error>(())
/// ```
///
/// `R` is how the vector holds its resource, as for [`DeviceBuffer`] ([`ResourceHandle`]). The
/// vector is `Send` and `Sync` for every `T: Pod` (it holds no `T` on the host) when `R` is.
pub struct DeviceUVector<T: Pod, R: ResourceHandle = SharedResource> {
    // Dropped before `storage`: dropping the slot waits for a pending staged copy. Made on the
    // first staged set.
    staging: Option<Box<Staging>>,
    storage: DeviceBuffer<R>,
    _element: PhantomData<fn() -> T>,
}

impl<T: Pod> DeviceUVector<T> {
    /// Room for `len` uninitialized elements from the current device's resource, on `stream`.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`]; [`Error::InvalidArgument`] if the bytes overflow; the backend's
    /// error.
    pub fn new(len: usize, stream: StreamView) -> Result<Self> {
        Self::new_in(len, stream, get_current_device_resource()?)
    }

    /// A copy of `src` from the current device's resource, after `stream`'s queued work.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`]; [`Error::Driver`] when the copy fails; the backend's error.
    pub fn from_host(src: &[T], stream: StreamView) -> Result<Self> {
        Self::from_host_in(src, stream, get_current_device_resource()?)
    }
}

impl<T: Pod, R: ResourceHandle> DeviceUVector<T, R> {
    /// Bytes per element. Zero-sized element types are refused at compile time.
    const ELEMENT: usize = {
        assert!(
            size_of::<T>() > 0,
            "DeviceUVector needs an element type of at least one byte"
        );
        size_of::<T>()
    };

    /// Room for `len` uninitialized elements from `resource`, allocated on `stream`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `len` elements overflow `usize` bytes.
    #[inline]
    pub fn new_in(len: usize, stream: StreamView, resource: R) -> Result<Self> {
        let bytes = Self::bytes_for("len", len)?;
        Ok(Self::wrap(DeviceBuffer::new_in(bytes, stream, resource)?))
    }

    /// As [`from_host`](DeviceUVector::from_host), from `resource`.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`]; [`Error::Driver`] when the copy fails.
    pub fn from_host_in(src: &[T], stream: StreamView, resource: R) -> Result<Self> {
        let storage = DeviceBuffer::from_host_in(bytemuck::cast_slice(src), stream, resource)?;
        Ok(Self::wrap(storage))
    }

    /// Takes over `buffer` as a vector of `T` (the inverse of [`release`](Self::release)).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the buffer's size or capacity is not a whole number of
    /// elements (the buffer is then dropped).
    pub fn from_buffer(buffer: DeviceBuffer<R>) -> Result<Self> {
        for (what, bytes) in [
            ("buffer size", buffer.size()),
            ("buffer capacity", buffer.capacity()),
        ] {
            if !bytes.is_multiple_of(Self::ELEMENT) {
                return Err(Error::invalid_argument(
                    what,
                    format!("{bytes} bytes"),
                    format!(
                        "a multiple of size_of::<{}>() = {} bytes",
                        std::any::type_name::<T>(),
                        Self::ELEMENT
                    ),
                ));
            }
        }
        Ok(Self::wrap(buffer))
    }

    fn wrap(storage: DeviceBuffer<R>) -> Self {
        DeviceUVector {
            staging: None,
            storage,
            _element: PhantomData,
        }
    }

    /// A deep copy (capacity = len) from the current device's resource, on `stream`.
    ///
    /// # Errors
    /// As [`deep_copy_in`](Self::deep_copy_in), or the backend's error.
    pub fn deep_copy(&self, stream: StreamView) -> Result<DeviceUVector<T>> {
        self.deep_copy_in(stream, get_current_device_resource()?)
    }

    /// A deep copy (capacity = len) from `resource` on `stream`, after pending asynchronous sets.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`]; [`Error::Driver`] when the copy or its ordering cannot be enqueued.
    pub fn deep_copy_in<R2: ResourceHandle>(
        &self,
        stream: StreamView,
        resource: R2,
    ) -> Result<DeviceUVector<T, R2>> {
        self.order_after_sets(stream)?;
        Ok(DeviceUVector::wrap(
            self.storage.deep_copy_in(stream, resource)?,
        ))
    }

    /// The storage as an untyped [`DeviceBuffer`] (RMM's `release`), after any pending set.
    pub fn release(mut self) -> DeviceBuffer<R> {
        // Dropping the slot waits for the last staged copy (or leaks the slot if it cannot).
        self.staging = None;
        self.storage
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.storage.size() / Self::ELEMENT
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.storage.is_empty()
    }

    /// Number of elements the current allocation can hold.
    pub fn capacity(&self) -> usize {
        self.storage.capacity() / Self::ELEMENT
    }

    /// The device address of the first element (null when nothing is allocated).
    pub fn data(&self) -> DevicePtr {
        self.storage.data()
    }

    /// The device address of element `index`.
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`] when `index >= len()`.
    pub fn element_ptr(&self, index: usize) -> Result<DevicePtr> {
        let len = self.len();
        if index >= len {
            return Err(Error::IndexOutOfRange {
                index,
                len,
                container: "DeviceUVector",
                element_type: std::any::type_name::<T>(),
            });
        }
        Ok(self.storage.data().offset(index * Self::ELEMENT))
    }

    /// The stream most recently set; the one the memory is given back on.
    pub fn stream(&self) -> StreamView {
        self.storage.stream()
    }

    /// Sets the stream the memory is given back on (until a reallocating call names another).
    pub fn set_stream(&mut self, stream: StreamView) {
        self.storage.set_stream(stream);
    }

    /// The handle of the resource that allocated the memory and will take it back.
    pub fn memory_resource(&self) -> &R {
        self.storage.memory_resource()
    }

    /// The device the elements live on.
    pub fn device(&self) -> Device {
        self.storage.device()
    }

    /// Element `index`, read after `stream`'s queued work and pending sets (synchronizes `stream`).
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`] if `index >= len()`; [`Error::Driver`] if a sync or copy fails.
    pub fn element(&self, index: usize, stream: StreamView) -> Result<T> {
        let at = self.element_ptr(index)?;
        self.order_after_sets(stream)?;
        crate::stream::synchronize_stream(self.device(), stream)?;
        let mut value = T::zeroed();
        self.device()
            .copy_to_host(bytemuck::bytes_of_mut(&mut value), at)?;
        Ok(value)
    }

    /// The first element. Synchronizes `stream`.
    ///
    /// # Errors
    /// As [`element`](Self::element) (out of range when empty).
    pub fn front_element(&self, stream: StreamView) -> Result<T> {
        self.element(0, stream)
    }

    /// The last element. Synchronizes `stream`.
    ///
    /// # Errors
    /// As [`element`](Self::element) (out of range when empty).
    pub fn back_element(&self, stream: StreamView) -> Result<T> {
        self.element(self.len().saturating_sub(1), stream)
    }

    /// Writes `value` to element `index` after the work queued on `stream`; complete on return.
    ///
    /// # Errors
    /// As [`element`](Self::element).
    pub fn set_element(&mut self, index: usize, value: T, stream: StreamView) -> Result<()> {
        let at = self.element_ptr(index)?;
        self.order_after_sets(stream)?;
        crate::stream::synchronize_stream(self.device(), stream)?;
        self.device().copy_to_device(at, bytemuck::bytes_of(&value))
    }

    /// Enqueues a write of `value` to element `index` on `stream` without waiting. Unlike RMM,
    /// `value` is staged in a pinned slot the vector owns (made on first use), so nothing of the
    /// caller's must outlive the copy; a second staged set waits for the first copy. An all-zero
    /// value is a memset instead.
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`] if `index >= len()`; [`Error::Driver`] if enqueuing fails.
    pub fn set_element_async(&mut self, index: usize, value: T, stream: StreamView) -> Result<()> {
        let at = self.element_ptr(index)?;
        let bytes = bytemuck::bytes_of(&value);
        if bytes.iter().all(|&b| b == 0) {
            self.order_after_sets(stream)?;
            return self.device().memset_async(at, 0, Self::ELEMENT, stream);
        }
        let device = self.device();
        let staging = match &mut self.staging {
            Some(staging) => staging,
            empty => empty.insert(Box::new(Staging::new(device, Self::ELEMENT)?)),
        };
        staging.upload(bytes, at, stream)
    }

    /// Enqueues a memset of element `index` to zero on `stream` without waiting.
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`] unless `index < len()`; [`Error::Driver`] if the memset fails.
    pub fn set_element_to_zero_async(&mut self, index: usize, stream: StreamView) -> Result<()> {
        let at = self.element_ptr(index)?;
        self.order_after_sets(stream)?;
        self.device().memset_async(at, 0, Self::ELEMENT, stream)
    }

    /// Sets the length to `new_len` elements on `stream`, as [`DeviceBuffer::resize`] (within
    /// capacity nothing is allocated or copied; new elements are uninitialized).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the bytes overflow `usize`; else as [`DeviceBuffer::resize`].
    pub fn resize(&mut self, new_len: usize, stream: StreamView) -> Result<()> {
        let bytes = Self::bytes_for("new_len", new_len)?;
        self.order_after_sets(stream)?;
        self.storage.resize(bytes, stream)
    }

    /// Makes the capacity at least `new_capacity` elements, as [`DeviceBuffer::reserve`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the bytes overflow `usize`; else as [`DeviceBuffer::reserve`].
    pub fn reserve(&mut self, new_capacity: usize, stream: StreamView) -> Result<()> {
        let bytes = Self::bytes_for("new_capacity", new_capacity)?;
        self.order_after_sets(stream)?;
        self.storage.reserve(bytes, stream)
    }

    /// Reallocates to exactly `len()` elements, as [`DeviceBuffer::shrink_to_fit`].
    ///
    /// # Errors
    /// As [`DeviceBuffer::shrink_to_fit`].
    pub fn shrink_to_fit(&mut self, stream: StreamView) -> Result<()> {
        self.order_after_sets(stream)?;
        self.storage.shrink_to_fit(stream)
    }

    /// Copies `src` into the vector after the work queued on `stream`; complete on return.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the lengths differ; [`Error::Driver`] if a sync or copy fails.
    pub fn copy_from_host(&mut self, src: &[T], stream: StreamView) -> Result<()> {
        self.check_host_len("src.len()", src.len())?;
        self.order_after_sets(stream)?;
        self.storage
            .copy_from_host(bytemuck::cast_slice(src), stream)
    }

    /// Copies the vector into `dst` after the work queued on `stream`; complete on return.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the lengths differ; [`Error::Driver`] if a sync or copy fails.
    pub fn copy_to_host(&self, dst: &mut [T], stream: StreamView) -> Result<()> {
        self.check_host_len("dst.len()", dst.len())?;
        self.order_after_sets(stream)?;
        self.storage
            .copy_to_host(bytemuck::cast_slice_mut(dst), stream)
    }

    /// The elements, copied to the host after the work queued on `stream`.
    ///
    /// # Errors
    /// [`Error::Driver`] when synchronizing or the copy fails.
    pub fn to_vec(&self, stream: StreamView) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len()];
        self.copy_to_host(&mut out, stream)?;
        Ok(out)
    }

    /// Makes later work on `stream` wait for this vector's pending staged copy, if any.
    #[inline]
    fn order_after_sets(&self, stream: StreamView) -> Result<()> {
        match &self.staging {
            Some(staging) if staging.is_pending() => staging.order_before(stream),
            _ => Ok(()),
        }
    }

    fn check_host_len(&self, what: &'static str, len: usize) -> Result<()> {
        if len == self.len() {
            Ok(())
        } else {
            Err(Error::invalid_argument(
                what,
                len,
                format!(
                    "the vector's length, {} elements (resize the vector or slice the host data)",
                    self.len()
                ),
            ))
        }
    }

    #[inline]
    fn bytes_for(what: &'static str, len: usize) -> Result<usize> {
        len.checked_mul(Self::ELEMENT).ok_or_else(|| {
            Error::invalid_argument(
                what,
                len,
                format!(
                    "at most {} elements of {} ({} bytes each): the size in bytes overflows usize",
                    usize::MAX / Self::ELEMENT,
                    std::any::type_name::<T>(),
                    Self::ELEMENT
                ),
            )
        })
    }
}

impl<T: Pod, R: ResourceHandle> fmt::Debug for DeviceUVector<T, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceUVector")
            .field("element_type", &std::any::type_name::<T>())
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .field("storage", &self.storage)
            .field(
                "set_pending",
                &self.staging.as_ref().is_some_and(|s| s.is_pending()),
            )
            .finish()
    }
}
