//! [`SpillableVector<T>`]: a typed view of a [`SpillableBuffer`] of plain-old-data elements.

use std::marker::PhantomData;
use std::sync::Arc;

use bytemuck::Pod;

use super::buffer::{DeviceGuard, HostGuard, SpillObserver, SpillableBuffer, Tier};
use super::store::SpillStore;
use crate::error::{Error, Result};
use crate::stream_view::StreamView;

/// `len` elements of `T`, spillable like the [`SpillableBuffer`] it wraps. Clones share data.
#[derive(Clone)]
pub struct SpillableVector<T: Pod> {
    buffer: Arc<SpillableBuffer>,
    len: usize,
    _element: PhantomData<fn() -> T>,
}

impl<T: Pod> std::fmt::Debug for SpillableVector<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpillableVector")
            .field("element", &std::any::type_name::<T>())
            .field("len", &self.len)
            .field("tier", &self.buffer.tier())
            .finish()
    }
}

impl<T: Pod> SpillableVector<T> {
    /// `len` uninitialized elements on the store's device, used on `stream`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `len` elements overflow `usize` bytes; else as
    /// [`SpillableBuffer::new`].
    pub fn new(
        store: &Arc<SpillStore>,
        len: usize,
        stream: StreamView,
        observer: Option<Arc<dyn SpillObserver>>,
    ) -> Result<SpillableVector<T>> {
        let bytes = len.checked_mul(size_of::<T>()).ok_or_else(|| {
            Error::invalid_argument("len", len, "a length whose size in bytes fits in usize")
        })?;
        let buffer = SpillableBuffer::new(store, bytes, stream, observer)?;
        Ok(Self::from_buffer_unchecked(buffer, len))
    }

    /// A vector holding a copy of `data` (complete when this returns).
    ///
    /// # Errors
    /// As [`SpillableBuffer::from_host`].
    pub fn from_slice(
        store: &Arc<SpillStore>,
        data: &[T],
        stream: StreamView,
        observer: Option<Arc<dyn SpillObserver>>,
    ) -> Result<SpillableVector<T>> {
        let buffer =
            SpillableBuffer::from_host(store, bytemuck::cast_slice(data), stream, observer)?;
        Ok(Self::from_buffer_unchecked(buffer, data.len()))
    }

    /// Views `buffer` as elements of `T`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when its size is not a multiple of the element size.
    pub fn from_buffer(buffer: Arc<SpillableBuffer>) -> Result<SpillableVector<T>> {
        let size = size_of::<T>().max(1);
        if !buffer.size().is_multiple_of(size) {
            return Err(Error::invalid_argument(
                "buffer size",
                buffer.size(),
                format!(
                    "a multiple of {size} (the size of {})",
                    std::any::type_name::<T>()
                ),
            ));
        }
        let len = buffer.size().checked_div(size_of::<T>()).unwrap_or(0);
        Ok(Self::from_buffer_unchecked(buffer, len))
    }

    fn from_buffer_unchecked(buffer: Arc<SpillableBuffer>, len: usize) -> SpillableVector<T> {
        SpillableVector {
            buffer,
            len,
            _element: PhantomData,
        }
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The underlying buffer.
    pub fn buffer(&self) -> &Arc<SpillableBuffer> {
        &self.buffer
    }

    /// Where the data is now.
    pub fn tier(&self) -> Tier {
        self.buffer.tier()
    }

    /// The elements on the device for `stream`; see [`SpillableBuffer::device_view`].
    ///
    /// # Errors
    /// As [`SpillableBuffer::device_view`].
    pub fn device_view(&self, stream: StreamView) -> Result<DeviceGuard<'_>> {
        self.buffer.device_view(stream)
    }

    /// The bytes in pinned host memory ([`SpillableBuffer::host_view`]).
    ///
    /// # Errors
    /// As [`SpillableBuffer::host_view`].
    pub fn host_view(&self) -> Result<HostGuard<'_>> {
        self.buffer.host_view()
    }

    /// A copy of the elements, wherever they are.
    ///
    /// # Errors
    /// As [`SpillableBuffer::to_vec`].
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let bytes = self.buffer.to_vec()?;
        // The byte vector's alignment is 1; copy into a vector of T rather than cast.
        let mut out = vec![T::zeroed(); self.len];
        bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(&bytes);
        Ok(out)
    }

    /// Moves the elements off the device (see [`SpillableBuffer::spill`]).
    ///
    /// # Errors
    /// As [`SpillableBuffer::spill`].
    pub fn spill(&self) -> Result<usize> {
        self.buffer.spill()
    }
}
