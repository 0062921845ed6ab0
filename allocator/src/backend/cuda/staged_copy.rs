//! Synchronous device → pageable host copies through pinned staging buffers.
//!
//! `cuMemcpyDtoH` into pageable memory stages the data inside the driver and holds the
//! driver's lock while it does: every other thread's driver calls (the spill manager's
//! copies, kernel launches, event records) wait for the whole copy. With several worker
//! threads checking results on the host, spills and unspills spent most of their time
//! waiting to enqueue. Here the copy runs on a stream of our own into two pinned buffers
//! in turn, and the host copies each filled buffer into the destination while the device
//! fills the other: every driver call is short, and the copy keeps the ordering
//! `cuMemcpyDtoH` has (after all work queued on the legacy default stream).

use std::ffi::c_void;

use cudarc::driver::sys;
use parking_lot::Mutex;

use crate::backend::DevicePtr;
use crate::error::Result;

/// Bytes per staging buffer.
pub(super) const STAGE: usize = 8 << 20;
/// Copies shorter than this go straight through `cuMemcpyDtoH` (the lock is held briefly).
pub(super) const STAGED_FROM: usize = 2 << 20;

/// One thread's staging set: a stream, two pinned buffers and their events.
struct Stager {
    stream: sys::CUstream,
    buffers: [*mut u8; 2],
    filled: [sys::CUevent; 2],
    /// Captures the legacy default stream's work before a copy starts.
    ordered: sys::CUevent,
}

// SAFETY: the handles and pinned buffers are owned by the stager, which one thread uses at a
// time (taken from and returned to a mutex-guarded list).
unsafe impl Send for Stager {}

/// Stagers per device, reused across copies (one per thread copying at once).
#[derive(Default)]
pub(super) struct Stagers {
    free: Mutex<Vec<(u32, Stager)>>,
}

impl std::fmt::Debug for Stagers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stagers")
            .field("idle", &self.free.lock().len())
            .finish()
    }
}

impl Stagers {
    /// Copies `src` into `dst` through pinned staging; `check` turns a driver result into
    /// an error naming the call. The device's context is current.
    pub(super) fn copy_dtoh(
        &self,
        dev: u32,
        dst: &mut [u8],
        src: DevicePtr,
        check: impl Fn(&'static str, sys::CUresult) -> Result<()>,
    ) -> Result<()> {
        let taken = {
            let mut free = self.free.lock();
            free.iter()
                .position(|(d, _)| *d == dev)
                .map(|i| free.swap_remove(i).1)
        };
        let stager = match taken {
            Some(s) => s,
            None => Stager::new(&check)?,
        };
        let result = stager.copy(dst, src, &check);
        if result.is_ok() {
            self.free.lock().push((dev, stager));
        } else {
            // Its copies may still run into the buffers: wait before reuse, or leak it.
            // SAFETY: the stream is the stager's own.
            if unsafe { sys::cuStreamSynchronize(stager.stream) } == sys::CUresult::CUDA_SUCCESS {
                self.free.lock().push((dev, stager));
            } else {
                tracing::error!(
                    device = dev,
                    "a staged copy failed and its stream cannot be waited for: its staging \
                     buffers are left allocated"
                );
                std::mem::forget(stager);
            }
        }
        result
    }
}

impl Stager {
    fn new(check: &impl Fn(&'static str, sys::CUresult) -> Result<()>) -> Result<Stager> {
        let mut s = Stager {
            stream: std::ptr::null_mut(),
            buffers: [std::ptr::null_mut(); 2],
            filled: [std::ptr::null_mut(); 2],
            ordered: std::ptr::null_mut(),
        };
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        let timing = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: valid out-pointers; the caller made the context current. On failure `s`
        // drops and releases what was made (null handles are skipped).
        unsafe {
            check("cuStreamCreate", sys::cuStreamCreate(&mut s.stream, flags))?;
            for i in 0..2 {
                let mut p: *mut c_void = std::ptr::null_mut();
                check("cuMemHostAlloc", sys::cuMemHostAlloc(&mut p, STAGE, 0))?;
                s.buffers[i] = p.cast();
                check(
                    "cuEventCreate",
                    sys::cuEventCreate(&mut s.filled[i], timing),
                )?;
            }
            check("cuEventCreate", sys::cuEventCreate(&mut s.ordered, timing))?;
        }
        Ok(s)
    }

    fn copy(
        &self,
        dst: &mut [u8],
        src: DevicePtr,
        check: &impl Fn(&'static str, sys::CUresult) -> Result<()>,
    ) -> Result<()> {
        let len = dst.len();
        let chunks = len.div_ceil(STAGE);
        let enqueue = |i: usize| -> Result<()> {
            let off = i * STAGE;
            let n = (len - off).min(STAGE);
            let slot = i % 2;
            // SAFETY: the buffer is the stager's own pinned memory of STAGE bytes, not read
            // by the host until `filled[slot]` completes; the device range lies in `src`.
            unsafe {
                check(
                    "cuMemcpyDtoHAsync_v2",
                    sys::cuMemcpyDtoHAsync_v2(
                        self.buffers[slot].cast(),
                        src.0 + off as u64,
                        n,
                        self.stream,
                    ),
                )?;
                check(
                    "cuEventRecord",
                    sys::cuEventRecord(self.filled[slot], self.stream),
                )
            }
        };
        // SAFETY: plain event calls on handles the stager owns; the legacy default stream is
        // always valid.
        unsafe {
            check(
                "cuEventRecord",
                // The null stream: the legacy default stream (the backend uses the non-per-thread
                // entry points).
                sys::cuEventRecord(self.ordered, std::ptr::null_mut()),
            )?;
            check(
                "cuStreamWaitEvent",
                sys::cuStreamWaitEvent(self.stream, self.ordered, 0),
            )?;
        }
        for i in 0..chunks.min(2) {
            enqueue(i)?;
        }
        for i in 0..chunks {
            let slot = i % 2;
            // SAFETY: the event is the stager's own.
            check("cuEventSynchronize", unsafe {
                sys::cuEventSynchronize(self.filled[slot])
            })?;
            let off = i * STAGE;
            let n = (len - off).min(STAGE);
            // SAFETY: the copy into this buffer has completed (waited for above) and nothing
            // writes it until the next enqueue below; `dst` has room for `n` bytes at `off`.
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
        // SAFETY: handles and buffers the stager made (null ones skipped); no copy runs into
        // the buffers any more (every copy is waited for before the stager is reused or
        // dropped).
        unsafe {
            for i in 0..2 {
                if !self.buffers[i].is_null() {
                    sys::cuMemFreeHost(self.buffers[i].cast());
                }
                if !self.filled[i].is_null() {
                    sys::cuEventDestroy_v2(self.filled[i]);
                }
            }
            if !self.ordered.is_null() {
                sys::cuEventDestroy_v2(self.ordered);
            }
            if !self.stream.is_null() {
                sys::cuStreamDestroy_v2(self.stream);
            }
        }
    }
}
