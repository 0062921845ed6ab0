//! Data that comes from elsewhere or goes elsewhere without the buffer moving: a buffer made
//! off the device from another's bytes (a value a peer sends), and ranges of a buffer's data
//! read where it is, to the host or into device memory (a value sent to a peer).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{NEXT_ID, SpillObserver, SpillableBuffer, State};
use crate::backend::DevicePtr;
use crate::backend::host::PinnedSlice;
use crate::backend::pinned_copy::PinnedCopy;
use crate::error::{Error, Result};
use crate::spill::copy::Direction;
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
    /// A buffer of `size` bytes off the device, which `fill` writes (called with each piece
    /// of the buffer's memory in order: its offset, and the piece): in the store's host tier,
    /// straight into pinned memory, or in a file of its disk tier when the host tier is full
    /// even after the observer made room. The device is not touched; the data comes back into
    /// the device's current resource on first use, like any spilled buffer's. For data that
    /// arrives from elsewhere (a value a peer sends) and is not needed on the device yet.
    ///
    /// # Errors
    /// [`Error::HostOutOfMemory`](crate::Error::HostOutOfMemory) when the host tier is full
    /// and there is no disk tier; [`Error::SpillFile`](crate::Error::SpillFile) when writing
    /// the file fails; what `fill` returns. Nothing is kept then.
    pub fn off_device_with(
        store: &Arc<SpillStore>,
        size: usize,
        observer: Option<Arc<dyn SpillObserver>>,
        fill: &mut dyn FnMut(usize, &mut [u8]) -> Result<()>,
    ) -> Result<Arc<SpillableBuffer>> {
        Self::made_off_device(store, size, observer, Incoming::Filled(fill))
    }

    /// A buffer of `size` bytes off the device, copied from `src`: device memory the store's
    /// device can read that the buffer does not own (another process's exported memory,
    /// mapped here), after the work queued on the default stream. Like
    /// [`off_device_with`](Self::off_device_with), but the bytes go straight into the host
    /// tier's pinned memory on the store's copy streams, at the copy engine's rate (to disk
    /// past a full host tier); the device's own memory is not touched.
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

    /// A buffer of `size` bytes off the device holding `incoming`: in the host tier's pinned
    /// memory, or past a full host tier (with a disk tier) in a file, written from a host copy.
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
                for s in &mut slices {
                    let n = (size - offset).min(s.len());
                    fill(offset, &mut s.as_mut_slice()[..n])?;
                    offset += n;
                }
                State::Host(slices)
            }
            (Ok(slices), Incoming::Device(_)) if size == 0 => State::Host(slices),
            (Ok(slices), Incoming::Device(src)) => {
                let start = Instant::now();
                let copy = buffer
                    .start_copy(
                        Direction::ToHost,
                        StreamView::DEFAULT,
                        &[],
                        |d, lane, event| PinnedCopy::to_host(d, lane, event, src, size, slices),
                    )
                    .map_err(|(e, _)| e)?;
                let enqueued = Instant::now();
                let slices = buffer
                    .finish_copy(Direction::ToHost, copy, enqueued, start)
                    .map_err(|(e, _)| e)?;
                State::Host(slices)
            }
            (Err(Error::HostOutOfMemory { .. }), incoming) if store.has_disk() => {
                let mut bytes = vec![0u8; size];
                match incoming {
                    Incoming::Filled(fill) => fill(0, &mut bytes)?,
                    Incoming::Device(src) => buffer.device().copy_to_host(&mut bytes, src)?,
                }
                let disk = buffer.disk()?;
                let file = disk.write_bytes(buffer.id, &bytes)?;
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

    /// Copies the data into `out` (exactly [`size`](Self::size) bytes), wherever it is: it
    /// does not move.
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

    /// Copies `out.len()` bytes of the data from `offset` into `out`, wherever the data is: it
    /// does not move. Sending spilled data elsewhere reads it this way, straight into the
    /// message's memory.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when the range runs past the
    /// buffer's end; [`Error::Driver`](crate::Error::Driver) when the copy from the device
    /// fails; [`Error::SpillFile`](crate::Error::SpillFile) when reading the file fails.
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
            } => {
                let mut rest = &mut *out;
                for_each_piece(slices, offset, rest.len(), |_, piece| {
                    let (here, after) = std::mem::take(&mut rest).split_at_mut(piece.len());
                    copy_in_parallel(here, piece);
                    rest = after;
                    Ok(())
                })
            }
            State::Disk(file, disk) => disk.read_range_into(file, offset, out),
        }
    }

    /// Copies `len` bytes of the data from `offset` into `dst`, device memory on the buffer's
    /// device, wherever the data is: it does not move (from the host tier the copy runs at the
    /// pinned copy rate). Sending spilled data as device memory reads it this way into memory
    /// that goes with the message.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when the range runs past the
    /// buffer's end; [`Error::Driver`](crate::Error::Driver) when a copy fails;
    /// [`Error::SpillFile`](crate::Error::SpillFile) when reading the file fails.
    pub fn copy_range_to_device(&self, offset: usize, len: usize, dst: DevicePtr) -> Result<()> {
        self.check_range(offset, len)?;
        let device = self.device();
        let state = self.state.lock();
        match &*state {
            State::Device { ptr, stream, .. } => {
                synchronize_stream(device, *stream)?;
                device.copy_device_to_device(dst, DevicePtr(ptr.addr() + offset as u64), len)
            }
            State::Host(slices) => for_each_piece(slices, offset, len, |at, piece| {
                device.copy_to_device(DevicePtr(dst.addr() + at as u64), piece)
            }),
            State::Disk(file, disk) => {
                let mut bytes = vec![0u8; len];
                disk.read_range_into(file, offset, &mut bytes)?;
                device.copy_to_device(dst, &bytes)
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

/// Copies `src` into `dst` (of the same length) on the rayon pool, in stretches of
/// [`COPY_STRETCH`] bytes: a message's memory is fresh, and first touching it (the page
/// faults) costs more than the copy, so one thread would read a spilled value out at a
/// fraction of the rate the host's cores give together.
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

/// Bytes one thread copies at a time in [`copy_in_parallel`].
const COPY_STRETCH: usize = 4 << 20;

/// Calls `f` with each piece of `len` bytes from `offset` of the data held in `slices` (in
/// order), and where the piece starts within the range.
fn for_each_piece(
    slices: &[PinnedSlice],
    offset: usize,
    len: usize,
    mut f: impl FnMut(usize, &[u8]) -> Result<()>,
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
