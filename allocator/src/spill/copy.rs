//! [`CopyStreams`]: the streams a device's spills and unspills copy on.
//!
//! Each device has [`LANES`] copy streams per direction (so a spill and an unspill use both copy
//! engines at once). A copy is ordered by an event after the work already queued on its buffer's
//! stream, so later work there does not queue behind it. As every copy queued behind one on a copy
//! stream would wait for that one's buffer stream too, lanes are picked by buffer stream: copies
//! after the same stream share one, and each of the last [`LANES`] buffer streams seen has its own.
//! Copies between this process and a peer's memory are ordered after [`CopyStreams::transfers`],
//! a stream with no work of its own: they wait for nothing and run on a lane per direction of
//! their own, outside the lanes the buffer streams share.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::backend::{RawEvent, RawStream};
use crate::device::Device;
use crate::error::Result;
use crate::stream::Event;
use crate::stream_view::StreamView;

/// Direction of a copy: to the host (spill) or the device (unspill).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    ToHost,
    ToDevice,
}

/// Copy streams per direction.
pub(crate) const LANES: usize = 4;

/// The copy streams of one device and a few reusable events.
#[derive(Debug)]
pub(crate) struct CopyStreams {
    device: Device,
    to_host: [RawStream; LANES],
    to_device: [RawStream; LANES],
    /// See [`CopyStreams::transfers`].
    transfers: RawStream,
    /// The lanes of copies ordered after [`CopyStreams::transfers`], to the host and the device.
    peer_to_host: RawStream,
    peer_to_device: RawStream,
    /// The buffer stream each lane serves and when it was last picked (a counter from 1; 0: never).
    assigned: Mutex<[(RawStream, u64); LANES]>,
    picks: AtomicU64,
    /// Events free for the next copy.
    events: Mutex<Vec<Event>>,
}

impl CopyStreams {
    /// Creates the copy streams of `device` (none is left behind on failure).
    pub(crate) fn new(device: Device) -> Result<CopyStreams> {
        let (b, d) = (device.backend(), device.ordinal());
        let mut made = Vec::with_capacity(2 * LANES + 3);
        for _ in 0..2 * LANES + 3 {
            match b.stream_create(d) {
                Ok(s) => made.push(s),
                Err(e) => {
                    for s in made {
                        let _ = b.stream_destroy(d, s);
                    }
                    return Err(e);
                }
            }
        }
        Ok(CopyStreams {
            device,
            to_host: std::array::from_fn(|i| made[i]),
            to_device: std::array::from_fn(|i| made[LANES + i]),
            transfers: made[2 * LANES],
            peer_to_host: made[2 * LANES + 1],
            peer_to_device: made[2 * LANES + 2],
            assigned: Mutex::new([(RawStream::MAX, 0); LANES]),
            picks: 0.into(),
            events: Mutex::new(Vec::new()),
        })
    }

    pub(crate) fn device(&self) -> Device {
        self.device
    }

    /// A stream on which nothing runs: copies ordered after it ([`ordered_after`]) wait for
    /// nothing, on lanes of their own. For data moving between this process and a peer
    /// worker's memory, which no work of this process is writing.
    ///
    /// [`ordered_after`]: Self::ordered_after
    pub(crate) fn transfers(&self) -> StreamView {
        StreamView::from_raw(self.transfers)
    }

    /// The `direction` lane serving `after`, else the least recently picked, which then serves it.
    fn lane(&self, direction: Direction, after: StreamView) -> RawStream {
        let now = self.picks.fetch_add(1, Ordering::Relaxed) + 1;
        let lane = {
            let mut assigned = self.assigned.lock();
            let lane = assigned
                .iter()
                .position(|&(s, _)| s == after.raw())
                .unwrap_or_else(|| (0..LANES).min_by_key(|&i| assigned[i].1).unwrap_or(0));
            assigned[lane] = (after.raw(), now);
            lane
        };
        match direction {
            Direction::ToHost => self.to_host[lane],
            Direction::ToDevice => self.to_device[lane],
        }
    }

    /// An event for one copy (reused if free); give it back with [`recycle`](Self::recycle).
    pub(crate) fn event(&self) -> Result<Event> {
        self.events
            .lock()
            .pop()
            .map_or_else(|| Event::new(self.device), Ok)
    }

    /// Takes back an event no copy waits on any more.
    pub(crate) fn recycle(&self, event: Event) {
        self.events.lock().push(event);
    }

    /// The `direction` copy stream for a buffer used on `after`, after `after`'s queued work, or
    /// only after `events` (recorded where the buffer's users let go) if there are any.
    pub(crate) fn ordered_after(
        &self,
        direction: Direction,
        after: StreamView,
        events: &[RawEvent],
    ) -> Result<RawStream> {
        if after.raw() == self.transfers && events.is_empty() {
            return Ok(match direction {
                Direction::ToHost => self.peer_to_host,
                Direction::ToDevice => self.peer_to_device,
            });
        }
        let stream = self.lane(direction, after);
        let (b, dev) = (self.device.backend(), self.device.ordinal());
        if after.is_per_thread() {
            // Another thread's per-thread default stream cannot be named from this thread: the
            // data's work is done once the whole device's is.
            b.device_synchronize(dev)?;
        } else if events.is_empty() {
            let e = self.event()?;
            e.record(after)?;
            b.stream_wait_event(dev, stream, e.raw())?;
            // The event may go back to the pool at once: the wait captured its state.
            self.recycle(e);
        }
        for &e in events {
            b.stream_wait_event(dev, stream, e)?;
        }
        Ok(stream)
    }
}

impl Drop for CopyStreams {
    fn drop(&mut self) {
        let (b, d) = (self.device.backend(), self.device.ordinal());
        for &s in self
            .to_host
            .iter()
            .chain(&self.to_device)
            .chain([&self.transfers])
        {
            // Every copy is waited for before its call returns; this only makes sure.
            if let Err(e) = b
                .stream_synchronize(d, s)
                .and_then(|()| b.stream_destroy(d, s))
            {
                tracing::error!("destroying a spill copy stream on device {d}: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{SimBackend, SimConfig};

    #[test]
    fn each_recent_buffer_stream_has_a_lane_of_its_own() {
        let backend = SimBackend::leak(SimConfig::default()).unwrap();
        let copies = CopyStreams::new(Device::on(backend, 0).unwrap()).unwrap();
        let view = |raw| StreamView::from_raw(raw);
        let lanes: Vec<RawStream> = (1..=LANES as u64)
            .map(|s| copies.lane(Direction::ToHost, view(s * 16)))
            .collect();
        let distinct: std::collections::HashSet<_> = lanes.iter().collect();
        assert_eq!(distinct.len(), LANES, "{lanes:?}");
        // The same buffer stream keeps its lane, in both directions' sets.
        assert_eq!(copies.lane(Direction::ToHost, view(16)), lanes[0]);
        let down = copies.lane(Direction::ToDevice, view(16));
        assert!(copies.to_device.contains(&down));
        // A new stream takes the least recently picked lane (stream 32's, the second).
        assert_eq!(copies.lane(Direction::ToHost, view(999)), lanes[1]);
        // Copies after the transfers stream run on lanes of their own, whatever was picked.
        let peer = copies
            .ordered_after(Direction::ToHost, copies.transfers(), &[])
            .unwrap();
        let peer_down = copies
            .ordered_after(Direction::ToDevice, copies.transfers(), &[])
            .unwrap();
        assert!(!copies.to_host.contains(&peer) && !copies.to_device.contains(&peer_down));
        assert_ne!(peer, peer_down);
        assert_eq!(copies.lane(Direction::ToHost, view(16)), lanes[0]);
    }
}
