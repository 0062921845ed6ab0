//! Which device the calling thread's current context belongs to: the CUDA runtime's current
//! device, which other libraries set (`cudaSetDevice`).

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
