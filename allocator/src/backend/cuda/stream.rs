//! The driver's stream and event calls, as thin functions; the caller made `dev`'s context current.
//! The driver does not detect a destroyed stream, so calls on any thread's stream are `unsafe`.

use cudarc::driver::sys;

use super::result::{check, event_handle, stream_handle};
use crate::backend::{RawEvent, RawStream};
use crate::error::Result;

/// `cuStreamCreate(CU_STREAM_NON_BLOCKING)`: does not wait for the legacy default stream.
pub(super) fn create(dev: u32) -> Result<RawStream> {
    let mut s: sys::CUstream = std::ptr::null_mut();
    let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
    // SAFETY: valid out-pointer to a local.
    let r = unsafe { sys::cuStreamCreate(&mut s, flags) };
    check("cuStreamCreate", dev, r)?;
    Ok(s as usize as RawStream)
}

/// `cuStreamDestroy`: queued work still completes.
///
/// # Safety
/// `stream` is a live stream that no call uses during or after this one.
pub(super) unsafe fn destroy(dev: u32, stream: RawStream) -> Result<()> {
    // SAFETY: the caller's guarantee.
    let r = unsafe { sys::cuStreamDestroy_v2(stream_handle(stream)) };
    check("cuStreamDestroy_v2", dev, r)
}

/// `cuStreamSynchronize` (the null handle: the legacy default stream).
///
/// # Safety
/// `stream` is 0, a default stream, or a live stream not destroyed during the call.
pub(super) unsafe fn synchronize(dev: u32, stream: RawStream) -> Result<()> {
    // SAFETY: the caller's guarantee.
    let r = unsafe { sys::cuStreamSynchronize(stream_handle(stream)) };
    check("cuStreamSynchronize", dev, r)
}

/// `cuStreamQuery`: true when `stream`'s queued work has completed.
///
/// # Safety
/// As for [`synchronize`].
pub(super) unsafe fn query(dev: u32, stream: RawStream) -> Result<bool> {
    // SAFETY: the caller's guarantee.
    let r = unsafe { sys::cuStreamQuery(stream_handle(stream)) };
    if r == sys::CUresult::CUDA_ERROR_NOT_READY {
        return Ok(false);
    }
    check("cuStreamQuery", dev, r).map(|_| true)
}

/// `cuStreamWaitEvent`: work queued on `stream` later waits for `event`.
pub(super) fn wait_event(dev: u32, stream: RawStream, event: RawEvent) -> Result<()> {
    // SAFETY: the driver validates both handles.
    let r = unsafe { sys::cuStreamWaitEvent(stream_handle(stream), event_handle(event), 0) };
    check("cuStreamWaitEvent", dev, r)
}

/// `cuEventCreate(CU_EVENT_DISABLE_TIMING)`.
pub(super) fn event_create(dev: u32) -> Result<RawEvent> {
    let mut e: sys::CUevent = std::ptr::null_mut();
    let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
    // SAFETY: valid out-pointer to a local.
    let r = unsafe { sys::cuEventCreate(&mut e, flags) };
    check("cuEventCreate", dev, r)?;
    Ok(e as usize as RawEvent)
}

pub(super) fn event_destroy(dev: u32, event: RawEvent) -> Result<()> {
    // SAFETY: the driver validates the handle; the caller uses it no more.
    let r = unsafe { sys::cuEventDestroy_v2(event_handle(event)) };
    check("cuEventDestroy_v2", dev, r)
}

/// `cuEventRecord` of `stream`'s queued work.
pub(super) fn event_record(dev: u32, event: RawEvent, stream: RawStream) -> Result<()> {
    // SAFETY: the driver validates both handles.
    let r = unsafe { sys::cuEventRecord(event_handle(event), stream_handle(stream)) };
    check("cuEventRecord", dev, r)
}

/// `cuEventQuery`: true when the recorded work has completed.
pub(super) fn event_query(dev: u32, event: RawEvent) -> Result<bool> {
    // SAFETY: the driver validates the handle.
    let r = unsafe { sys::cuEventQuery(event_handle(event)) };
    if r == sys::CUresult::CUDA_ERROR_NOT_READY {
        return Ok(false);
    }
    check("cuEventQuery", dev, r).map(|_| true)
}

pub(super) fn event_synchronize(dev: u32, event: RawEvent) -> Result<()> {
    // SAFETY: the driver validates the handle.
    let r = unsafe { sys::cuEventSynchronize(event_handle(event)) };
    check("cuEventSynchronize", dev, r)
}
