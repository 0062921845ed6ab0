//! The driver's context calls, as thin functions; `dev` names the device in errors.

use cudarc::driver::sys;

use super::result::check;
use crate::error::Result;

/// `cuDevicePrimaryCtxRetain` of device handle `handle` (ordinal `dev`).
pub(super) fn retain_primary(dev: u32, handle: sys::CUdevice) -> Result<sys::CUcontext> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer to a local; the driver validates the device handle.
    let r = unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, handle) };
    check("cuDevicePrimaryCtxRetain", dev, r)?;
    Ok(ctx)
}

/// `cuCtxGetCurrent`: the calling thread's current context, null when none.
pub(super) fn current(dev: u32) -> Result<sys::CUcontext> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: the driver writes the calling thread's current context (or null) into a local.
    let r = unsafe { sys::cuCtxGetCurrent(&mut ctx) };
    check("cuCtxGetCurrent", dev, r)?;
    Ok(ctx)
}

/// `cuCtxSetCurrent` (null leaves no context current).
///
/// # Safety
/// `ctx` is null or stays alive while current (a retained primary context, or one only this thread
/// could destroy).
pub(super) unsafe fn set_current(dev: u32, ctx: sys::CUcontext) -> Result<()> {
    // SAFETY: the caller's guarantee.
    check("cuCtxSetCurrent", dev, unsafe { sys::cuCtxSetCurrent(ctx) })
}

/// `cuCtxGetDevice`: the device handle of the current context (one must be current).
pub(super) fn current_device_handle(dev: u32) -> Result<sys::CUdevice> {
    let mut handle: sys::CUdevice = 0;
    // SAFETY: the driver writes the current context's device into a local.
    let r = unsafe { sys::cuCtxGetDevice(&mut handle) };
    check("cuCtxGetDevice", dev, r)?;
    Ok(handle)
}

/// `cuCtxSynchronize`: waits for all work of the current context.
pub(super) fn synchronize(dev: u32) -> Result<()> {
    // SAFETY: plain synchronization of the current context.
    check("cuCtxSynchronize", dev, unsafe { sys::cuCtxSynchronize() })
}
