//! Owned streams and events, as RMM's `cuda_stream` and CUDA events (views: [`StreamView`]).

use crate::backend::{RawEvent, RawStream};
use crate::device::Device;
use crate::error::Result;
use crate::stream_view::StreamView;

/// An owned, non-blocking stream of one device; destroyed on drop (queued work still runs).
#[derive(Debug)]
pub struct Stream {
    device: Device,
    raw: RawStream,
}

impl Stream {
    /// Creates a stream on `device`.
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) when the driver cannot create the stream.
    pub fn new(device: Device) -> Result<Stream> {
        let raw = device.backend().stream_create(device.ordinal())?;
        Ok(Stream { device, raw })
    }

    /// The view to pass to allocations and copies.
    pub fn view(&self) -> StreamView {
        StreamView::from_raw(self.raw)
    }

    /// The device the stream belongs to.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Waits for all work queued so far.
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) when the stream's work or the wait fails.
    pub fn synchronize(&self) -> Result<()> {
        synchronize_stream(self.device, self.view())
    }

    /// True when all queued work has completed.
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) when the driver query fails.
    pub fn is_idle(&self) -> Result<bool> {
        let d = self.device;
        d.backend().stream_query(d.ordinal(), self.raw)
    }

    /// Makes later work on this stream wait for `event`.
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) when the wait cannot be enqueued.
    pub fn wait(&self, event: &Event) -> Result<()> {
        event.wait_on(self.view())
    }
}

impl From<&Stream> for StreamView {
    fn from(s: &Stream) -> StreamView {
        s.view()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let d = self.device;
        if let Err(e) = d.backend().stream_destroy(d.ordinal(), self.raw) {
            tracing::error!("destroying stream {:#x} on {}: {e}", self.raw, self.device);
        }
    }
}

/// Waits for all work queued on `stream` of `device`.
///
/// # Errors
/// [`Error::Driver`](crate::Error::Driver) when the stream's work or the wait fails; the simulated
/// device's [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a destroyed stream.
pub fn synchronize_stream(device: Device, stream: StreamView) -> Result<()> {
    device
        .backend()
        .stream_synchronize(device.ordinal(), stream.raw())
}

/// An event without timing, owned; destroyed on drop.
#[derive(Debug)]
pub struct Event {
    device: Device,
    raw: RawEvent,
}

impl Event {
    /// Creates an event on `device`.
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) when the driver cannot create the event.
    pub fn new(device: Device) -> Result<Event> {
        let raw = device.backend().event_create(device.ordinal())?;
        Ok(Event { device, raw })
    }

    /// The backend's handle.
    pub fn raw(&self) -> RawEvent {
        self.raw
    }

    /// Captures the work queued on `stream` so far.
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) when the record cannot be enqueued.
    pub fn record(&self, stream: StreamView) -> Result<()> {
        let d = self.device;
        d.backend()
            .event_record(d.ordinal(), self.raw, stream.raw())
    }

    /// True when the captured work has completed (or the event was never recorded).
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) when the driver query fails.
    pub fn is_complete(&self) -> Result<bool> {
        let d = self.device;
        d.backend().event_query(d.ordinal(), self.raw)
    }

    /// Waits for the captured work.
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) when the captured work or the wait fails.
    pub fn synchronize(&self) -> Result<()> {
        let d = self.device;
        d.backend().event_synchronize(d.ordinal(), self.raw)
    }

    /// Makes later work on `stream` wait for the captured work.
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) when the wait cannot be enqueued.
    pub fn wait_on(&self, stream: StreamView) -> Result<()> {
        self.device
            .backend()
            .stream_wait_event(self.device.ordinal(), stream.raw(), self.raw)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let d = self.device;
        if let Err(e) = d.backend().event_destroy(d.ordinal(), self.raw) {
            tracing::error!("destroying event {:#x} on {}: {e}", self.raw, self.device);
        }
    }
}
