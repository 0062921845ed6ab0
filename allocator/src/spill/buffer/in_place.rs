//! Holding a buffer where it is on the device while the stack its memory came from is
//! replaced ([`SpillableBuffer::hold_in_place`], [`HeldInPlace`]): a reinitialize from pool
//! to pool hands the buffer's block to the new pool with its data in place, then repoints
//! the buffer to the new stack, instead of spilling it and bringing it back.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::MutexGuard;

use super::{SpillStep, SpillableBuffer, State};
use crate::backend::DevicePtr;
use crate::error::Result;
use crate::resource::SharedResource;
use crate::stream_view::StreamView;

/// A buffer locked on the device where it is, its memory from one resource: while this
/// lives, nobody uses, moves or drops the buffer (they wait, or skip it as busy). Ends in
/// [`move_to`](Self::move_to) (the memory changed owners), in
/// [`begin_spill`](Self::begin_spill), or by being dropped (nothing changed).
pub struct HeldInPlace<'a> {
    buffer: &'a SpillableBuffer,
    state: MutexGuard<'a, State>,
}

impl std::fmt::Debug for HeldInPlace<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldInPlace")
            .field("id", &self.buffer.id)
            .field("ptr", &self.ptr())
            .field("size", &self.buffer.size)
            .finish()
    }
}

impl SpillableBuffer {
    /// The buffer held where it is ([`HeldInPlace`]) when it is idle on the device in memory
    /// that `resource` (this very object, as `Arc::ptr_eq` would say) allocated; `None` when
    /// it is in use, busy, spilled, empty, its data was lost, or its memory is another
    /// resource's or borrowed ([`from_device`](Self::from_device)).
    pub fn hold_in_place(&self, resource: &SharedResource) -> Option<HeldInPlace<'_>> {
        let state = self.lock_idle()?;
        if self.lost.load(Ordering::Acquire) {
            return None;
        }
        match &*state {
            State::Device {
                resource: Some(r), ..
            } if std::ptr::addr_eq(Arc::as_ptr(r), Arc::as_ptr(resource)) => Some(HeldInPlace {
                buffer: self,
                state,
            }),
            _ => None,
        }
    }
}

impl<'a> HeldInPlace<'a> {
    /// The buffer.
    pub fn buffer(&self) -> &'a SpillableBuffer {
        self.buffer
    }

    /// The data's device address.
    pub fn ptr(&self) -> DevicePtr {
        match &*self.state {
            State::Device { ptr, .. } => *ptr,
            _ => DevicePtr::NULL,
        }
    }

    /// The buffer's bytes (as allocated).
    pub fn size(&self) -> usize {
        self.buffer.size
    }

    /// The stream the buffer was last used on, which its memory is freed on.
    pub fn stream(&self) -> StreamView {
        match &*self.state {
            State::Device { stream, .. } => *stream,
            _ => StreamView::DEFAULT,
        }
    }

    /// Records that `resource` owns the buffer's memory now (it took the allocation over
    /// from the resource that made it, data in place): the buffer frees it there. Nothing
    /// moves and nothing is copied; the observer hears nothing (the device bytes are the
    /// same). Releases the buffer.
    pub fn move_to(mut self, resource: SharedResource) {
        if let State::Device { resource: r, .. } = &mut *self.state {
            *r = Some(resource);
        }
    }

    /// Starts spilling the buffer as [`SpillableBuffer::begin_spill`] does, without letting
    /// go of it in between.
    ///
    /// # Errors
    /// As `begin_spill`; the buffer stays on the device, valid, and is released.
    pub fn begin_spill(self) -> Result<SpillStep<'a>> {
        self.buffer.begin_spill_locked(self.state)
    }
}
