//! Copies kept of data that no longer changes: a read-only buffer brought back to the
//! device keeps its host copy ([`SpillableBuffer::set_read_only`]), so that spilling it again
//! frees the device memory and copies nothing, like a page brought back from swap keeping its
//! swap slot. The copy's slices are reclaimable: the host pool counts them as room, and they
//! are given back ([`SpillableBuffer::drop_kept_copy`]) before more is pinned.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{SpillableBuffer, State, Tier, nanos_since};
use crate::backend::host::PinnedSlice;
use crate::error::Result;

/// `slices`, told they hold a copy that can be dropped (`on`) or data again.
pub(super) fn reclaimable(mut slices: Vec<PinnedSlice>, on: bool) -> Vec<PinnedSlice> {
    slices.iter_mut().for_each(|s| s.set_reclaimable(on));
    slices
}

impl SpillableBuffer {
    /// Marks the data as no longer changing (a stored value, which its users only read):
    /// from now on, coming back to the device keeps its host copy, and spilling it again
    /// frees the device memory without copying anything. Writing through a device view
    /// afterwards is an error that goes unnoticed: the next spill keeps the old bytes.
    pub fn set_read_only(&self) {
        self.read_only.store(true, Ordering::Release);
    }

    /// True once [`set_read_only`](Self::set_read_only) was called.
    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
    }

    /// Gives the host copy of data that is on the device back to the host tier; the host
    /// bytes given back (0 when there is none or the buffer is busy). The data stays on the
    /// device; spilling it again copies it. What making room in the host tier does first.
    pub fn drop_kept_copy(&self) -> usize {
        let Some(mut state) = self.state.try_lock() else {
            return 0;
        };
        match &mut *state {
            State::Device { kept, .. } if kept.is_some() => {
                let copy = kept.take();
                drop(state);
                drop(copy);
                self.size
            }
            _ => 0,
        }
    }

    /// Spills data whose host copy was kept ([`set_read_only`](Self::set_read_only)): its
    /// device memory is freed (on its stream, after the work of every stream that used it)
    /// and the copy is its data again; nothing is copied. False, and nothing done, when
    /// there is no kept copy.
    pub(super) fn spill_to_kept(&self, state: &mut State) -> Result<bool> {
        let State::Device {
            ptr,
            resource,
            stream,
            kept,
        } = state
        else {
            return Ok(false);
        };
        if kept.is_none() {
            return Ok(false);
        }
        let start = Instant::now();
        if let Some(resource) = resource {
            let device = self.device();
            for e in self.release_events() {
                device
                    .backend()
                    .stream_wait_event(device.ordinal(), stream.raw(), e)?;
            }
            resource.deallocate(*ptr, self.size, *stream)?;
        }
        let owned = resource.is_some();
        let slices = reclaimable(kept.take().unwrap_or_default(), false);
        self.forget_releases();
        *state = State::Host(slices);
        self.tier.store(Tier::Host as u8, Ordering::Release);
        if let Some(o) = &self.observer {
            if owned {
                o.resident(self.id, -(self.size as i64));
            }
            o.spilled_without_copy(self.id, self.size, nanos_since(start));
        }
        tracing::debug!(
            target: "rmm::spill",
            id = self.id,
            bytes = self.size,
            "buffer spilled to its kept host copy"
        );
        Ok(true)
    }
}
