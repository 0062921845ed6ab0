//! The calling thread's current context: its device, and [`Bound`].

use cudarc::driver::sys;

use super::CudaDevice;
use super::context;
use crate::error::Result;

/// The device of the calling thread's current context; None without one (or if not ours).
pub(super) fn current_device(devices: &[CudaDevice]) -> Result<Option<u32>> {
    if context::current(0)?.is_null() {
        return Ok(None);
    }
    let handle = context::current_device_handle(0)?;
    Ok(devices
        .iter()
        .position(|d| d.handle == handle)
        .map(|i| i as u32))
}

/// A device's context made current for one backend call, the thread's previous one restored after.
pub(super) struct Bound {
    /// The thread's context before, when it was another; `None` when nothing changed.
    previous: Option<sys::CUcontext>,
    dev: u32,
}

impl Bound {
    /// Makes `ctx` (`dev`'s retained primary context) current on this thread unless it is.
    pub(super) fn to(ctx: sys::CUcontext, dev: u32) -> Result<Bound> {
        let current = context::current(dev)?;
        if current == ctx {
            return Ok(Bound {
                previous: None,
                dev,
            });
        }
        // SAFETY: `ctx` is a retained primary context, valid for the process's life.
        unsafe { context::set_current(dev, ctx) }?;
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
            // SAFETY: `previous` was current (or null) when this call began; only this thread,
            // inside this call, could have destroyed it.
            if let Err(e) = unsafe { context::set_current(self.dev, previous) } {
                tracing::warn!("making the thread's own context current again: {e}");
            }
        }
    }
}
