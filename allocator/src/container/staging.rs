//! A pinned staging slot for asynchronous host → device copies of small values: the value is
//! copied into a slot that a [`PinnedCopy`] holds until the copy is known complete.

use crate::backend::DevicePtr;
use crate::backend::host::HostBlock;
use crate::backend::pinned_copy::PinnedCopy;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::resource::{HostMemoryResource, PinnedHostMemoryResource};
use crate::stream::Event;
use crate::stream_view::StreamView;

#[derive(Default)]
enum Slot {
    /// No copy reads the slot.
    Idle(HostBlock, Event),
    /// The last copy from the slot may still be running.
    InFlight(PinnedCopy<HostBlock>),
    /// No slot (a copy that could not be waited for kept it): made anew on use.
    #[default]
    Empty,
}

/// A pinned slot of a fixed size and the copy out of it that may still run.
pub(crate) struct Staging {
    device: Device,
    bytes: usize,
    slot: Slot,
}

impl std::fmt::Debug for Staging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staging")
            .field("device", &self.device)
            .field("bytes", &self.bytes)
            .field("pending", &self.is_pending())
            .finish()
    }
}

impl Staging {
    /// A slot of `bytes` (at least 1) for copies to `device`; slow, so made on first use.
    #[cold]
    pub(crate) fn new(device: Device, bytes: usize) -> Result<Staging> {
        let bytes = bytes.max(1);
        let (block, event) = Self::make(device, bytes)?;
        Ok(Staging {
            device,
            bytes,
            slot: Slot::Idle(block, event),
        })
    }

    fn make(device: Device, bytes: usize) -> Result<(HostBlock, Event)> {
        // The event first: if the block cannot be had, nothing pinned is left behind.
        let event = Event::new(device)?;
        let block = PinnedHostMemoryResource::on(device.backend()).allocate(bytes, 1)?;
        Ok((block, event))
    }

    /// True when a copy out of the slot may still run (the device is asked only on next use).
    pub(crate) fn is_pending(&self) -> bool {
        matches!(self.slot, Slot::InFlight(_))
    }

    /// Makes later work on `stream` wait for the last copy out of the slot, if any.
    pub(crate) fn order_before(&self, stream: StreamView) -> Result<()> {
        match &self.slot {
            Slot::InFlight(copy) => copy.order_before(stream),
            _ => Ok(()),
        }
    }

    /// Copies `value` (at most the slot's size) into the slot and enqueues its copy to `dst` on
    /// `stream`, after waiting for a pending copy out of the slot.
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
        let (mut block, event) = self.ready()?;
        let (device, len) = (self.device, value.len());
        block.as_mut_slice()[..len].copy_from_slice(value);
        match PinnedCopy::to_device(device, stream.raw(), event, vec![block], dst, len) {
            Ok(copy) => {
                self.slot = Slot::InFlight(copy);
                Ok(())
            }
            Err(failed) => {
                let slot = failed.memory.and_then(|mut m| m.pop()).zip(failed.event);
                if let Some((block, event)) = slot {
                    self.slot = Slot::Idle(block, event);
                }
                Err(failed.error)
            }
        }
    }

    /// The slot and its event once no copy reads it (waiting if needed); a new one if a copy kept it.
    fn ready(&mut self) -> Result<(HostBlock, Event)> {
        match std::mem::take(&mut self.slot) {
            Slot::Idle(block, event) => Ok((block, event)),
            Slot::InFlight(copy) => match copy.wait() {
                Ok((mut memory, event)) => match memory.pop() {
                    Some(block) => Ok((block, event)),
                    None => Self::make(self.device, self.bytes),
                },
                Err(failed) => {
                    let slot = failed.memory.and_then(|mut m| m.pop()).zip(failed.event);
                    if let Some(slot) = slot {
                        return Ok(slot);
                    }
                    tracing::warn!(
                        "abandoning a {}-byte pinned staging slot whose last copy to {} could \
                         not be waited for ({}); a new one is made",
                        self.bytes,
                        self.device,
                        failed.error
                    );
                    Self::make(self.device, self.bytes)
                }
            },
            Slot::Empty => Self::make(self.device, self.bytes),
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let block = match std::mem::take(&mut self.slot) {
            Slot::Idle(block, _) => Some(block),
            Slot::InFlight(copy) => match copy.wait() {
                Ok((mut memory, _)) => memory.pop(),
                // The copy kept (leaked) the slot, or gave it back after waiting.
                Err(failed) => failed.memory.and_then(|mut m| m.pop()),
            },
            Slot::Empty => None,
        };
        if let Some(block) = block
            && let Err(e) = PinnedHostMemoryResource::on(self.device.backend()).deallocate(block)
        {
            tracing::error!("freeing a pinned staging slot of {}: {e}", self.device);
        }
    }
}
