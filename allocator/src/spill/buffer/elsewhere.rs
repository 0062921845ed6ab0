//! Data moving without the buffer moving: a buffer made off the device from a peer's bytes, and
//! ranges of a buffer's data read where they are (a value sent to a peer).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{NEXT_ID, SpillObserver, SpillableBuffer, State};
use crate::backend::DevicePtr;
use crate::backend::host::PinnedSlice;
use crate::backend::pinned_copy::{PinnedCopy, copy_to_device_and_wait, copy_to_host_and_wait};
use crate::error::{Error, Result};
use crate::spill::copy::Direction;
use crate::spill::disk::data_in_mut;
use crate::spill::store::SpillStore;
use crate::stream::synchronize_stream;
use crate::stream_view::StreamView;

/// Where a buffer made off the device gets its bytes.
enum Incoming<'a> {
    /// Written by the caller, piece by piece (offset, piece).
    Filled(&'a mut dyn FnMut(usize, &mut [u8]) -> Result<()>),
    /// Copied from device memory the buffer does not own.
    Device(DevicePtr),
}

impl SpillableBuffer {
    /// A buffer of `size` bytes made off the device (in the host tier, or on disk past a full host
    /// tier) for data not yet needed there: `fill` writes each piece of its memory in order
    /// (offset, piece). The data comes to the device on first use.
    ///
    /// # Errors
    /// [`Error::HostOutOfMemory`] with the host tier full and no disk tier; [`Error::SpillFile`] on
    /// a failed write; what `fill` returns. Nothing is kept then.
    pub fn off_device_with(
        store: &Arc<SpillStore>,
        size: usize,
        observer: Option<Arc<dyn SpillObserver>>,
        fill: &mut dyn FnMut(usize, &mut [u8]) -> Result<()>,
    ) -> Result<Arc<SpillableBuffer>> {
        Self::made_off_device(store, size, observer, Incoming::Filled(fill))
    }

    /// As [`off_device_with`](Self::off_device_with), copying from `src`: device memory the buffer
    /// does not own (another process's, mapped here, ready to read), waiting for nothing queued in
    /// this process.
    ///
    /// # Errors
    /// As [`off_device_with`](Self::off_device_with); a failed copy.
    pub fn off_device_from(
        store: &Arc<SpillStore>,
        size: usize,
        observer: Option<Arc<dyn SpillObserver>>,
        src: DevicePtr,
    ) -> Result<Arc<SpillableBuffer>> {
        Self::made_off_device(store, size, observer, Incoming::Device(src))
    }

    fn made_off_device(
        store: &Arc<SpillStore>,
        size: usize,
        observer: Option<Arc<dyn SpillObserver>>,
        incoming: Incoming<'_>,
    ) -> Result<Arc<SpillableBuffer>> {
        let buffer = Self::with_state(
            NEXT_ID.fetch_add(1, Ordering::Relaxed),
            store,
            size,
            observer,
            State::Host(Vec::new()),
        );
        let state = match (buffer.host_slices(), incoming) {
            (Ok(mut slices), Incoming::Filled(fill)) => {
                let mut offset = 0;
                for piece in data_in_mut(&mut slices, size) {
                    fill(offset, piece)?;
                    offset += piece.len();
                }
                State::Host(slices)
            }
            (Ok(slices), Incoming::Device(_)) if size == 0 => State::Host(slices),
            (Ok(slices), Incoming::Device(src)) => {
                let start = Instant::now();
                let enqueue =
                    |d, lane, event| PinnedCopy::to_host(d, lane, event, src, size, slices);
                // The peer's memory is ready (it waited for its copies before sending), and no work
                // here uses the new memory: after nothing, in a lane apart from spills.
                let after = store.copies().transfers();
                let copy = buffer.start_copy(Direction::ToHost, after, &[], enqueue);
                let copy = copy.map_err(|(e, _)| e)?;
                let done = buffer.finish_copy(Direction::ToHost, copy, Instant::now(), start);
                State::Host(done.map_err(|(e, _)| e)?)
            }
            (Err(Error::HostOutOfMemory { .. }), incoming) if store.has_disk() => {
                let bytes = match incoming {
                    Incoming::Filled(fill) => {
                        let mut bytes = vec![0u8; size];
                        fill(0, &mut bytes)?;
                        bytes
                    }
                    // As to the host tier: after nothing queued here.
                    Incoming::Device(src) => {
                        let copies = store.copies();
                        let lane =
                            copies.ordered_after(Direction::ToHost, copies.transfers(), &[])?;
                        copy_to_host_and_wait(buffer.device(), lane, src, size)?
                    }
                };
                let disk = buffer.disk()?;
                let file = disk.write_chunks(buffer.id, [&bytes[..]], size)?;
                State::Disk(file, disk)
            }
            (Err(e), _) => return Err(e),
        };
        buffer.tier.store(state.tier() as u8, Ordering::Release);
        *buffer.state.lock() = state;
        if let Some(o) = &buffer.observer {
            o.touched(buffer.id);
        }
        Ok(buffer)
    }

    /// Copies all the data ([`size`](Self::size) bytes) into `out` without moving it.
    ///
    /// # Errors
    /// As [`read_range_into`](Self::read_range_into).
    pub fn read_into(&self, out: &mut [u8]) -> Result<()> {
        if out.len() != self.size {
            return Err(Error::invalid_argument(
                "out",
                out.len(),
                format!("exactly the buffer's {} bytes", self.size),
            ));
        }
        self.read_range_into(0, out)
    }

    /// Copies `out.len()` bytes from `offset` into `out` without moving the data (how spilled data
    /// is sent elsewhere, straight into the message's memory).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] past the buffer's end; [`Error::Driver`] or [`Error::SpillFile`]
    /// when the copy or read fails.
    pub fn read_range_into(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len())?;
        let state = self.state.lock();
        match &*state {
            State::Device {
                ptr,
                stream,
                kept: None,
                ..
            } => {
                synchronize_stream(self.device(), *stream)?;
                self.device()
                    .copy_to_host(out, DevicePtr(ptr.addr() + offset as u64))
            }
            // On the device with its host copy kept: read from the copy.
            State::Host(slices)
            | State::Device {
                kept: Some(slices), ..
            } => for_each_piece(slices, offset, out.len(), |at, piece| {
                copy_in_parallel(&mut out[at..at + piece.len()], piece);
                Ok(())
            }),
            State::Disk(file, disk) => disk.read_range_into(file, offset, out),
        }
    }

    /// Copies `len` bytes from `offset` into `dst`, device memory on the buffer's device used on
    /// the default stream, without moving the data (how spilled data is sent as device memory):
    /// after the default stream's queued work, waiting for its copy lane, not the device.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] past the buffer's end; [`Error::Driver`] or [`Error::SpillFile`]
    /// when a copy or read fails.
    pub fn copy_range_to_device(&self, offset: usize, len: usize, dst: DevicePtr) -> Result<()> {
        self.copy_range_after(offset, len, dst, StreamView::DEFAULT)
    }

    /// [`copy_range_to_device`](Self::copy_range_to_device) into device memory only a peer reads
    /// (an export slot, staged for another process): after nothing this process queued, so
    /// neither waiting for its tasks' work nor queued behind its spills and unspills.
    ///
    /// # Errors
    /// As [`copy_range_to_device`](Self::copy_range_to_device).
    pub fn copy_range_for_peer(&self, offset: usize, len: usize, dst: DevicePtr) -> Result<()> {
        self.copy_range_after(offset, len, dst, self.store.copies().transfers())
    }

    fn copy_range_after(
        &self,
        offset: usize,
        len: usize,
        dst: DevicePtr,
        after: StreamView,
    ) -> Result<()> {
        self.check_range(offset, len)?;
        let device = self.device();
        let mut state = self.state.lock();
        let lane = || {
            let raw = self
                .store
                .copies()
                .ordered_after(Direction::ToDevice, after, &[])?;
            Ok::<_, Error>((raw, StreamView::from_raw(raw)))
        };
        let copied = match &*state {
            // A read-only buffer's kept host copy holds the same bytes: read from there.
            State::Device {
                kept: Some(slices), ..
            }
            | State::Host(slices) => {
                let mut pieces = Vec::new();
                for_each_piece(slices, offset, len, |at, piece| {
                    pieces.push((DevicePtr(dst.addr() + at as u64), piece));
                    Ok(())
                })?;
                copy_to_device_and_wait(device, lane()?.0, &pieces)
            }
            State::Device { ptr, stream, .. } => {
                // After the work that made the data, too, and that of guards on other streams.
                synchronize_stream(device, *stream)?;
                for e in self.release_events() {
                    device.backend().event_synchronize(device.ordinal(), e)?;
                }
                let (_, lane) = lane()?;
                let src = DevicePtr(ptr.addr() + offset as u64);
                device.copy_device_to_device_async(dst, src, len, lane)?;
                return synchronize_stream(device, lane);
            }
            State::Disk(file, disk) => {
                let mut bytes = vec![0u8; len];
                disk.read_range_into(file, offset, &mut bytes)?;
                // Pageable: the driver has taken the bytes when the copy is enqueued.
                return copy_to_device_and_wait(device, lane()?.0, &[(dst, &bytes[..])])
                    .map_err(|(e, _)| e);
            }
        };
        match copied {
            Ok(()) => Ok(()),
            Err((e, true)) => Err(e),
            // A copy may still read the host memory: it is never handed out again.
            Err((e, false)) => {
                std::mem::forget(std::mem::replace(&mut *state, State::Host(Vec::new())));
                Err(self.lost_unless(e, None).0)
            }
        }
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(Error::invalid_argument(
                "range",
                format!("{len} bytes at {offset}"),
                format!("a range within the buffer's {} bytes", self.size),
            ));
        }
        Ok(())
    }
}

/// Copies `src` into equal-length `dst` on the rayon pool: first touching fresh memory (page
/// faults) costs more than the copy, which one thread would do far slower than all cores.
fn copy_in_parallel(dst: &mut [u8], src: &[u8]) {
    use rayon::prelude::*;
    if dst.len() <= COPY_STRETCH {
        dst.copy_from_slice(src);
        return;
    }
    dst.par_chunks_mut(COPY_STRETCH)
        .zip(src.par_chunks(COPY_STRETCH))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

const COPY_STRETCH: usize = 4 << 20;

/// Calls `f` with each piece, in order, of `len` bytes from `offset` of the data in `slices`, and
/// the piece's start within the range.
fn for_each_piece<'a>(
    slices: &'a [PinnedSlice],
    offset: usize,
    len: usize,
    mut f: impl FnMut(usize, &'a [u8]) -> Result<()>,
) -> Result<()> {
    let (mut skip, mut at) = (offset, 0);
    for s in slices {
        if at == len {
            break;
        }
        let bytes = s.as_slice();
        if skip >= bytes.len() {
            skip -= bytes.len();
            continue;
        }
        let n = (bytes.len() - skip).min(len - at);
        f(at, &bytes[skip..skip + n])?;
        at += n;
        skip = 0;
    }
    Ok(())
}
