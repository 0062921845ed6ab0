//! The calling thread's current context: which device it belongs to (the CUDA runtime's
//! current device, which other libraries set with `cudaSetDevice`), and making a device's
//! context current for one call of the backend ([`Bound`]), after which the thread's own
//! context is current again: rmm-rs never changes the caller's current device.

use cudarc::driver::sys;

use super::CudaDevice;
use super::result::check;
use crate::error::Result;

/// The ordinal of the device whose context is current on the calling thread; None when no
/// context is current (or it belongs to no device this process sees).
pub(super) fn current_device(devices: &[CudaDevice]) -> Result<Option<u32>> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: the driver writes the calling thread's current context (or null) into `ctx`, a
    // local that outlives the call.
    check("cuCtxGetCurrent", 0, unsafe {
        sys::cuCtxGetCurrent(&mut ctx)
    })?;
    if ctx.is_null() {
        return Ok(None);
    }
    let mut dev: sys::CUdevice = 0;
    // SAFETY: `ctx` is current on this thread; the driver writes its device into `dev`.
    check("cuCtxGetDevice", 0, unsafe {
        sys::cuCtxGetDevice(&mut dev)
    })?;
    Ok(devices.iter().position(|d| d.dev == dev).map(|i| i as u32))
}

/// A device's context made current for one call of the backend; the context the thread had
/// before (another library's device, or none) is made current again when this goes.
pub(super) struct Bound {
    /// The thread's context before, when it was another; `None` when nothing changed.
    previous: Option<sys::CUcontext>,
    dev: u32,
}

impl Bound {
    /// Makes `ctx` (device `dev`'s retained primary context) current on the calling thread,
    /// unless it already is.
    pub(super) fn to(ctx: sys::CUcontext, dev: u32) -> Result<Bound> {
        let mut current: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the driver writes the thread's current context (or null) into a local.
        check("cuCtxGetCurrent", dev, unsafe {
            sys::cuCtxGetCurrent(&mut current)
        })?;
        if current == ctx {
            return Ok(Bound {
                previous: None,
                dev,
            });
        }
        // SAFETY: `ctx` is a retained primary context, valid for the process's life.
        check("cuCtxSetCurrent", dev, unsafe { sys::cuCtxSetCurrent(ctx) })?;
        Ok(Bound {
            previous: Some(current),
            dev,
        })
    }

    /// Leaves the context current after this goes (a thread that takes the device for good).
    pub(super) fn keep(mut self) {
        self.previous = None;
    }
}

impl Drop for Bound {
    fn drop(&mut self) {
        if let Some(previous) = self.previous {
            // SAFETY: `previous` was current on this thread when this backend call began (or
            // is null, which leaves no context current); a library that destroys the context
            // current on a thread does so from that thread, which is inside this call.
            let restored = unsafe { sys::cuCtxSetCurrent(previous) };
            if let Err(e) = check("cuCtxSetCurrent", self.dev, restored) {
                tracing::warn!("making the thread's own context current again: {e}");
            }
        }
    }
}
