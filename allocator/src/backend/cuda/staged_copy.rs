//! Synchronous device → pageable host copies through two pinned staging buffers in turn, on our
//! own stream: `cuMemcpyDtoH` into pageable memory holds the driver's lock (stalling every other
//! thread's driver calls) throughout. Still ordered after the legacy default stream's work.

use parking_lot::Mutex;

use super::{memory, stream};
use crate::backend::{DevicePtr, RawEvent, RawStream};
use crate::error::Result;

/// Bytes per staging buffer.
pub(super) const STAGE: usize = 8 << 20;
/// Shorter copies go straight through `cuMemcpyDtoH` (holding the lock briefly).
pub(super) const STAGED_FROM: usize = 2 << 20;

/// The legacy default stream (the backend uses the non-per-thread entry points).
const LEGACY_STREAM: RawStream = 0;

/// One thread's staging set on a device: a stream, two pinned buffers, their events (0 until made).
struct Stager {
    dev: u32,
    stream: RawStream,
    buffers: [*mut u8; 2],
    filled: [RawEvent; 2],
    /// Captures the legacy default stream's work before a copy starts.
    ordered: RawEvent,
}

// SAFETY: the stager owns its handles and buffers; one thread at a time uses it (a mutex's list).
unsafe impl Send for Stager {}

/// Stagers per device, reused across copies (one per thread copying at once).
#[derive(Default)]
pub(super) struct Stagers {
    free: Mutex<Vec<Stager>>,
}

impl std::fmt::Debug for Stagers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stagers")
            .field("idle", &self.free.lock().len())
            .finish()
    }
}

impl Stagers {
    /// Copies `src` into `dst` through pinned staging; `dev`'s context is current.
    pub(super) fn copy_dtoh(&self, dev: u32, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        let taken = {
            let mut free = self.free.lock();
            free.iter()
                .position(|s| s.dev == dev)
                .map(|i| free.swap_remove(i))
        };
        let stager = taken.map_or_else(|| Stager::new(dev), Ok)?;
        let result = stager.copy(dst, src);
        // After a failure its copies may still run into the buffers: waited for, it is reused.
        // SAFETY: the stager's own stream, live until the stager drops.
        if result.is_ok() || unsafe { stream::synchronize(dev, stager.stream) }.is_ok() {
            self.free.lock().push(stager);
        } else {
            tracing::error!(
                device = dev,
                "a staged copy failed and its stream cannot be waited for: its staging \
                 buffers are left allocated"
            );
            std::mem::forget(stager);
        }
        result
    }
}

impl Stager {
    fn new(dev: u32) -> Result<Stager> {
        // On failure `s` drops and releases what was made (handles still 0 are skipped).
        let mut s = Stager {
            dev,
            stream: 0,
            buffers: [std::ptr::null_mut(); 2],
            filled: [0; 2],
            ordered: 0,
        };
        s.stream = stream::create(dev)?;
        for i in 0..2 {
            s.buffers[i] = memory::alloc_host(dev, STAGE, false)?;
            s.filled[i] = stream::event_create(dev)?;
        }
        s.ordered = stream::event_create(dev)?;
        Ok(s)
    }

    fn copy(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        let dev = self.dev;
        let len = dst.len();
        let chunks = len.div_ceil(STAGE);
        // The offset and length of piece `i`.
        let piece = |i: usize| (i * STAGE, (len - i * STAGE).min(STAGE));
        let enqueue = |i: usize| -> Result<()> {
            let (off, n) = piece(i);
            let slot = i % 2;
            let from = DevicePtr(src.0 + off as u64);
            // SAFETY: the stager's own pinned buffer of STAGE bytes, not read by the host until
            // `filled[slot]` completes; the device range lies in `src`.
            unsafe { memory::copy_dtoh_async(dev, self.buffers[slot], from, n, self.stream) }?;
            stream::event_record(dev, self.filled[slot], self.stream)
        };
        stream::event_record(dev, self.ordered, LEGACY_STREAM)?;
        stream::wait_event(dev, self.stream, self.ordered)?;
        for i in 0..chunks.min(2) {
            enqueue(i)?;
        }
        for i in 0..chunks {
            let slot = i % 2;
            stream::event_synchronize(dev, self.filled[slot])?;
            let (off, n) = piece(i);
            // SAFETY: the copy into this buffer has completed (waited for above) and nothing writes
            // it before the next enqueue; `dst` has room for `n` bytes at `off`.
            let filled = unsafe { std::slice::from_raw_parts(self.buffers[slot], n) };
            dst[off..off + n].copy_from_slice(filled);
            if i + 2 < chunks {
                enqueue(i + 2)?;
            }
        }
        Ok(())
    }
}

impl Drop for Stager {
    fn drop(&mut self) {
        // Errors are ignored: the handles are the stager's own, and nothing else could be done.
        for i in 0..2 {
            if !self.buffers[i].is_null() {
                // SAFETY: the stager's buffer; copies into it are waited for before reuse or drop.
                let _ = unsafe { memory::free_host(self.dev, self.buffers[i]) };
            }
            if self.filled[i] != 0 {
                let _ = stream::event_destroy(self.dev, self.filled[i]);
            }
        }
        if self.ordered != 0 {
            let _ = stream::event_destroy(self.dev, self.ordered);
        }
        if self.stream != 0 {
            // SAFETY: the stager's own stream; nothing uses it after this.
            let _ = unsafe { stream::destroy(self.dev, self.stream) };
        }
    }
}
