//! Copies kept of data that no longer changes: a read-only buffer back on the device keeps its host
//! copy ([`SpillableBuffer::set_read_only`]), so spilling it again only frees device memory, like a
//! swapped-in page keeping its swap slot. The host pool counts kept copies as reclaimable room.

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
    /// Marks the data as no longer changing (a stored value its users only read): coming back to
    /// the device then keeps the host copy, so spilling again copies nothing. Writing through a
    /// device view afterwards is an unnoticed error: the next spill keeps the old bytes.
    pub fn set_read_only(&self) {
        self.read_only.store(true, Ordering::Release);
    }

    /// True once [`set_read_only`](Self::set_read_only) was called.
    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
    }

    /// Drops the host copy of device-resident data (the first step of making host-tier room);
    /// returns the bytes freed (0 if none or busy). A later spill copies again.
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

    /// Spills data with a kept host copy without copying: the device memory is freed (after every
    /// using stream's work) and the copy becomes its data. False (nothing done) without one.
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
            if stream.is_per_thread() {
                // The threads that used the data each had their own per-thread stream, which
                // this thread cannot name: their work is done once the device's is.
                device.synchronize()?;
            }
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
