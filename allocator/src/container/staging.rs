//! A page-locked staging slot for asynchronous host → device copies of small values.
//!
//! `cuMemcpyHtoDAsync` reads its source when the stream reaches the copy, not when it is
//! enqueued. RMM leaves the source's lifetime to the caller; here the container owns the
//! source: the value is copied into a pinned slot, the copy is enqueued from the slot, and an
//! event is recorded behind it. The slot is overwritten or freed only after that event has
//! completed. If the completion cannot be established (a driver failure), the slot is leaked
//! rather than freed, so a copy still queued can never read freed memory.

use crate::HostMemoryResource;
use crate::backend::DevicePtr;
use crate::backend::host::HostBlock;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::resource::PinnedHostMemoryResource;
use crate::stream::{Event, StreamView};

/// Whether a copy may still read the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    /// No copy reads the slot.
    Idle,
    /// The last copy from the slot is captured by `event`.
    InFlight,
    /// A copy may read the slot and nothing tracks it: the slot must never be reused or freed.
    Lost,
}

/// A pinned slot of a fixed size plus the event that tracks the last copy out of it.
#[derive(Debug)]
pub(crate) struct Staging {
    device: Device,
    bytes: usize,
    /// `None` once a lost slot has been abandoned and before its replacement is made.
    block: Option<HostBlock>,
    event: Event,
    state: SlotState,
}

impl Staging {
    /// A slot of `bytes` (at least 1) for copies to `device`. Slow: creates an event and
    /// allocates page-locked memory; containers make it on first use only.
    #[cold]
    pub(crate) fn new(device: Device, bytes: usize) -> Result<Staging> {
        // The event first: if the block cannot be had, nothing pinned is left behind.
        let event = Event::new(device)?;
        let bytes = bytes.max(1);
        let block = Self::allocate(device, bytes)?;
        Ok(Staging {
            device,
            bytes,
            block: Some(block),
            event,
            state: SlotState::Idle,
        })
    }

    fn allocate(device: Device, bytes: usize) -> Result<HostBlock> {
        PinnedHostMemoryResource::on(device.backend()).allocate(bytes, 1)
    }

    /// True when a copy out of the slot may not have run yet.
    pub(crate) fn is_pending(&self) -> bool {
        self.state != SlotState::Idle
    }

    /// Makes later work on `stream` wait for the last copy out of the slot (device-side; the
    /// host does not block). A no-op when no copy is pending.
    pub(crate) fn order_before(&self, stream: StreamView) -> Result<()> {
        match self.state {
            SlotState::Idle => Ok(()),
            SlotState::InFlight => self.event.wait_on(stream),
            // Nothing tracks the lost copy; the best that can be done is to wait for the
            // whole device.
            SlotState::Lost => self.device.synchronize(),
        }
    }

    /// Copies `value` (at most the slot's size) into the slot and enqueues its copy to `dst`
    /// on `stream`. Waits first for the previous copy out of the slot, if one is pending.
    pub(crate) fn upload(
        &mut self,
        value: &[u8],
        dst: DevicePtr,
        stream: StreamView,
    ) -> Result<()> {
        if value.len() > self.bytes {
            return Err(Error::invalid_argument(
                "staged value",
                format!("{} bytes", value.len()),
                format!("at most the staging slot's {} bytes", self.bytes),
            ));
        }
        let block = self.ready()?;
        block.as_mut_slice()[..value.len()].copy_from_slice(value);
        let src = block.as_ptr();
        // SAFETY: `src` points at `value.len()` bytes of the pinned block owned by `self`. The
        // block is not written again until `ready()` has seen the event recorded below complete,
        // and it is not freed (Drop) before that either; if the copy's completion cannot be
        // tracked, the state becomes `Lost` and the block is leaked instead of reused or freed.
        unsafe {
            self.device.backend().memcpy_htod_async(
                self.device.ordinal(),
                dst,
                src,
                value.len(),
                stream.raw(),
            )
        }?;
        // From here on the copy may read the slot at any time.
        self.state = SlotState::Lost;
        match self.event.record(stream) {
            Ok(()) => {
                self.state = SlotState::InFlight;
                Ok(())
            }
            Err(record_error) => {
                // The event does not capture the copy: wait for the stream instead.
                match crate::stream::synchronize(self.device, stream) {
                    Ok(()) => {
                        self.state = SlotState::Idle;
                        Ok(())
                    }
                    Err(_) => Err(record_error),
                }
            }
        }
    }

    /// The slot, once no copy reads it (waiting for the last one if needed).
    fn ready(&mut self) -> Result<&mut HostBlock> {
        if self.state == SlotState::InFlight {
            self.event.synchronize()?;
            self.state = SlotState::Idle;
        }
        if self.state == SlotState::Lost {
            // Abandon (leak) the slot a copy may still read, and start on a fresh one.
            if let Some(lost) = self.block.take() {
                tracing::warn!(
                    "abandoning a {}-byte pinned staging slot whose last copy to {} could not be \
                     tracked; it is leaked so that the copy cannot read freed memory",
                    lost.len(),
                    self.device
                );
            }
            self.state = SlotState::Idle;
        }
        match &mut self.block {
            Some(block) => Ok(block),
            empty => Ok(empty.insert(Self::allocate(self.device, self.bytes)?)),
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if self.state == SlotState::InFlight {
            match self.event.synchronize() {
                Ok(()) => self.state = SlotState::Idle,
                Err(e) => {
                    tracing::error!(
                        "waiting for the last staged copy to {} failed: {e}; the pinned staging \
                         slot is leaked so that the copy cannot read freed memory",
                        self.device
                    );
                    return;
                }
            }
        }
        if self.state == SlotState::Lost {
            tracing::error!(
                "a staged copy to {} could not be tracked; the pinned staging slot is leaked",
                self.device
            );
            return;
        }
        if let Some(block) = self.block.take()
            && let Err(e) = PinnedHostMemoryResource::on(self.device.backend()).deallocate(block)
        {
            tracing::error!("freeing a pinned staging slot of {}: {e}", self.device);
        }
    }
}
