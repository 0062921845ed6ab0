//! Holding a buffer in place on the device while its memory's stack is replaced ([`HeldInPlace`]):
//! a pool-to-pool reinitialize hands the block to the new pool instead of spilling it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::MutexGuard;

use super::{SpillStep, SpillableBuffer, State};
use crate::backend::DevicePtr;
use crate::error::Result;
use crate::resource::SharedResource;
use crate::stream_view::StreamView;

/// A buffer locked in place on the device, its memory from one resource: meanwhile nobody uses,
/// moves or drops it (they wait, or skip it as busy). Ends in [`move_to`](Self::move_to) (new
/// memory owner), [`begin_spill`](Self::begin_spill), or a drop (no change).
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
    /// Holds the buffer in place ([`HeldInPlace`]) if it is idle on the device in memory allocated
    /// by this very `resource`; `None` if in use, busy, spilled, empty, lost, or in other memory.
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

    /// Records that `resource` now owns the buffer's memory (taken over with its data in place),
    /// where the buffer frees it, and releases the buffer. No copy; the observer hears nothing.
    pub fn move_to(mut self, resource: SharedResource) {
        if let State::Device { resource: r, .. } = &mut *self.state {
            *r = Some(resource);
        }
    }

    /// [`SpillableBuffer::begin_spill`] without releasing the buffer in between.
    ///
    /// # Errors
    /// As `begin_spill`; the buffer stays valid on the device and is released.
    pub fn begin_spill(self) -> Result<SpillStep<'a>> {
        self.buffer.begin_spill_locked(self.state)
    }
}
