//! [`CopyStreams`]: the streams a device's spills and unspills copy on.
//!
//! Copies run on two streams of their own per device (device → host and host → device, so a
//! spill and an unspill use both copy engines at once), ordered after the work already
//! queued on the buffer's stream by an event, and waited for through another event. Work
//! queued on the buffer's stream afterwards does not queue behind the copy, and a copy does
//! not wait for unrelated work queued later.

use parking_lot::Mutex;

use crate::backend::{RawEvent, RawStream};
use crate::device::Device;
use crate::error::Result;
use crate::stream::StreamView;

/// Direction of a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Device to host (spill).
    ToHost,
    /// Host to device (unspill).
    ToDevice,
}

/// Two copy streams of one device and a few reusable events.
pub(crate) struct CopyStreams {
    device: Device,
    to_host: RawStream,
    to_device: RawStream,
    events: Mutex<Vec<RawEvent>>,
}

impl std::fmt::Debug for CopyStreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyStreams")
            .field("device", &self.device)
            .finish()
    }
}

/// An event borrowed from [`CopyStreams`]; goes back on drop.
pub(crate) struct PooledEvent<'a> {
    owner: &'a CopyStreams,
    raw: RawEvent,
}

impl PooledEvent<'_> {
    /// Captures the work queued on `stream` so far.
    pub(crate) fn record(&self, stream: RawStream) -> Result<()> {
        let d = self.owner.device;
        d.backend().event_record(d.ordinal(), self.raw, stream)
    }

    /// Waits on the host for the captured work.
    pub(crate) fn synchronize(&self) -> Result<()> {
        let d = self.owner.device;
        d.backend().event_synchronize(d.ordinal(), self.raw)
    }
}

impl Drop for PooledEvent<'_> {
    fn drop(&mut self) {
        self.owner.events.lock().push(self.raw);
    }
}

impl CopyStreams {
    /// Creates the two streams of `device`.
    pub(crate) fn new(device: Device) -> Result<CopyStreams> {
        let b = device.backend();
        let to_host = b.stream_create(device.ordinal())?;
        let to_device = match b.stream_create(device.ordinal()) {
            Ok(s) => s,
            Err(e) => {
                let _ = b.stream_destroy(device.ordinal(), to_host);
                return Err(e);
            }
        };
        Ok(CopyStreams {
            device,
            to_host,
            to_device,
            events: Mutex::new(Vec::new()),
        })
    }

    /// The device.
    pub(crate) fn device(&self) -> Device {
        self.device
    }

    /// The stream for copies in `direction`.
    pub(crate) fn stream(&self, direction: Direction) -> RawStream {
        match direction {
            Direction::ToHost => self.to_host,
            Direction::ToDevice => self.to_device,
        }
    }

    /// An event (reused when one is free).
    pub(crate) fn event(&self) -> Result<PooledEvent<'_>> {
        let raw = match self.events.lock().pop() {
            Some(e) => e,
            None => self.device.backend().event_create(self.device.ordinal())?,
        };
        Ok(PooledEvent { owner: self, raw })
    }

    /// Orders later copies in `direction` after the work queued on `stream` so far.
    pub(crate) fn wait_for(&self, direction: Direction, stream: StreamView) -> Result<()> {
        let e = self.event()?;
        e.record(stream.raw())?;
        self.device.backend().stream_wait_event(
            self.device.ordinal(),
            self.stream(direction),
            e.raw,
        )
        // The event may go back to the pool at once: the wait captured its state.
    }
}

impl Drop for CopyStreams {
    fn drop(&mut self) {
        let (b, d) = (self.device.backend(), self.device.ordinal());
        for s in [self.to_host, self.to_device] {
            // Every copy is waited for before its call returns; this only makes sure.
            if let Err(e) = b
                .stream_synchronize(d, s)
                .and_then(|()| b.stream_destroy(d, s))
            {
                tracing::error!("destroying a spill copy stream on device {d}: {e}");
            }
        }
        for e in self.events.get_mut().drain(..) {
            if let Err(err) = b.event_destroy(d, e) {
                tracing::error!("destroying a spill copy event on device {d}: {err}");
            }
        }
    }
}
