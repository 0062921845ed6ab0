//! Guards over a [`SpillableBuffer`]'s data: [`DeviceGuard`] and [`SharedDeviceGuard`] hold it
//! on the device, [`HostGuard`] in pinned host memory, for as long as they live.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use parking_lot::MutexGuard;

use super::{SpillableBuffer, State};
use crate::backend::DevicePtr;
use crate::backend::host::PinnedSlice;
use crate::spill::disk::{data_in, data_in_mut};
use crate::stream_view::StreamView;

/// Access to a buffer's device memory; the buffer stays on the device while it lives. `B` holds the
/// buffer: a borrow ([`DeviceGuard`]) or an `Arc` ([`SharedDeviceGuard`]).
pub struct DeviceAccess<B: Deref<Target = SpillableBuffer>> {
    pub(super) buffer: B,
    pub(super) ptr: DevicePtr,
    /// The stream the data is used on while the guard lives.
    pub(super) stream: StreamView,
}

/// Access to a borrowed buffer's device memory; the buffer stays on the device while it lives.
pub type DeviceGuard<'a> = DeviceAccess<&'a SpillableBuffer>;

/// A [`DeviceGuard`] owning its buffer (`Arc`) instead of borrowing it, for holders no borrow can
/// describe (e.g. a Python object wrapping the memory). The buffer stays on the device at
/// [`ptr`](DeviceAccess::ptr) while it lives.
pub type SharedDeviceGuard = DeviceAccess<Arc<SpillableBuffer>>;

impl<B: Deref<Target = SpillableBuffer>> DeviceAccess<B> {
    /// The device address of the first byte.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.buffer.size
    }

    /// True for a zero-byte buffer.
    pub fn is_empty(&self) -> bool {
        self.buffer.size == 0
    }

    /// The buffer.
    pub fn buffer(&self) -> &B {
        &self.buffer
    }
}

impl<B: Deref<Target = SpillableBuffer>> Drop for DeviceAccess<B> {
    fn drop(&mut self) {
        self.buffer.unpin(self.stream);
    }
}

impl<B: Deref<Target = SpillableBuffer>> fmt::Debug for DeviceAccess<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceAccess")
            .field("buffer", &self.buffer.id())
            .field("ptr", &self.ptr)
            .finish()
    }
}

/// Access to a buffer's bytes in pinned host memory; the buffer stays there and all other access
/// waits while it lives, so do not take a device view of it on the same thread meanwhile.
pub struct HostGuard<'a> {
    pub(super) size: usize,
    pub(super) state: MutexGuard<'a, State>,
}

impl HostGuard<'_> {
    /// The bytes, in order, as one or more contiguous pieces (one per pinned slice).
    pub fn chunks(&self) -> impl Iterator<Item = &[u8]> {
        let slices: &[PinnedSlice] = match &*self.state {
            State::Host(s) => s,
            _ => &[],
        };
        data_in(slices, self.size)
    }

    /// The bytes, writable, in order (changes stay with the buffer).
    pub fn chunks_mut(&mut self) -> impl Iterator<Item = &mut [u8]> {
        let slices: &mut [PinnedSlice] = match &mut *self.state {
            State::Host(s) => s,
            _ => &mut [],
        };
        data_in_mut(slices, self.size)
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.size
    }

    /// True for a zero-byte buffer.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// A copy of the bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.size);
        self.chunks().for_each(|c| out.extend_from_slice(c));
        out
    }
}
