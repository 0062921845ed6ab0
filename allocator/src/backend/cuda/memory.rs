//! The driver's memory calls, as thin functions; the caller made `dev`'s context current.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::result::{check, stream_handle};
use crate::backend::{DevicePtr, MemInfo, RawStream};
use crate::error::Result;

/// `cuMemGetInfo`: free and total bytes of the current context's device.
pub(super) fn info(dev: u32) -> Result<MemInfo> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers to locals.
    let r = unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) };
    check("cuMemGetInfo_v2", dev, r)?;
    Ok(MemInfo { free, total })
}

pub(super) fn alloc(dev: u32, bytes: usize) -> Result<DevicePtr> {
    let mut p = 0;
    // SAFETY: valid out-pointer to a local.
    let r = unsafe { sys::cuMemAlloc_v2(&mut p, bytes) };
    check("cuMemAlloc_v2", dev, r)?;
    Ok(DevicePtr(p))
}

/// `cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL)`.
pub(super) fn alloc_managed(dev: u32, bytes: usize) -> Result<DevicePtr> {
    let mut p = 0;
    let flags = sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as u32;
    // SAFETY: valid out-pointer to a local.
    let r = unsafe { sys::cuMemAllocManaged(&mut p, bytes, flags) };
    check("cuMemAllocManaged", dev, r)?;
    Ok(DevicePtr(p))
}

pub(super) fn free(dev: u32, ptr: DevicePtr) -> Result<()> {
    // SAFETY: the driver validates the pointer and reports an error for a foreign one.
    check("cuMemFree_v2", dev, unsafe { sys::cuMemFree_v2(ptr.0) })
}

/// `cuMemHostAlloc`; `portable`: usable from every context. Never write-combined (slow host reads).
pub(super) fn alloc_host(dev: u32, bytes: usize, portable: bool) -> Result<*mut u8> {
    let mut p: *mut c_void = std::ptr::null_mut();
    let flags = if portable {
        sys::CU_MEMHOSTALLOC_PORTABLE
    } else {
        0
    };
    // SAFETY: valid out-pointer to a local.
    let r = unsafe { sys::cuMemHostAlloc(&mut p, bytes, flags) };
    check("cuMemHostAlloc", dev, r)?;
    Ok(p.cast())
}

/// `cuMemFreeHost`.
///
/// # Safety
/// `ptr` came from [`alloc_host`] and no copy uses it any more.
pub(super) unsafe fn free_host(dev: u32, ptr: *mut u8) -> Result<()> {
    // SAFETY: the caller's guarantee.
    let r = unsafe { sys::cuMemFreeHost(ptr.cast()) };
    check("cuMemFreeHost", dev, r)
}

/// `cuMemHostRegister(PORTABLE)`: pins a host range for every context.
///
/// # Safety
/// `ptr..ptr + bytes` is a live host allocation that stays allocated while registered.
pub(super) unsafe fn host_register(dev: u32, ptr: *mut u8, bytes: usize) -> Result<()> {
    // SAFETY: the caller's guarantee.
    check("cuMemHostRegister_v2", dev, unsafe {
        sys::cuMemHostRegister_v2(ptr.cast(), bytes, sys::CU_MEMHOSTREGISTER_PORTABLE)
    })
}

/// `cuMemHostUnregister`.
///
/// # Safety
/// `ptr` was registered with [`host_register`] and no copy uses it any more.
pub(super) unsafe fn host_unregister(dev: u32, ptr: *mut u8) -> Result<()> {
    // SAFETY: the caller's guarantee.
    let r = unsafe { sys::cuMemHostUnregister(ptr.cast()) };
    check("cuMemHostUnregister", dev, r)
}

/// `cuMemcpyHtoD`: returns once `src` may be reused (not yet when the bytes are on the device).
pub(super) fn copy_htod(dev: u32, dst: DevicePtr, src: &[u8]) -> Result<()> {
    // SAFETY: `src` is a live slice for the duration of this synchronous call.
    let r = unsafe { sys::cuMemcpyHtoD_v2(dst.0, src.as_ptr().cast(), src.len()) };
    check("cuMemcpyHtoD_v2", dev, r)
}

pub(super) fn copy_dtoh(dev: u32, dst: &mut [u8], src: DevicePtr) -> Result<()> {
    // SAFETY: `dst` is an exclusive live slice for the duration of this synchronous copy.
    let r = unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src.0, dst.len()) };
    check("cuMemcpyDtoH_v2", dev, r)
}

/// `cuMemcpyDtoD` (queued on the legacy default stream).
pub(super) fn copy_dtod(dev: u32, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
    // SAFETY: the driver validates the device ranges (on any devices, with unified addressing).
    let r = unsafe { sys::cuMemcpyDtoD_v2(dst.0, src.0, bytes) };
    check("cuMemcpyDtoD_v2", dev, r)
}

/// `cuMemsetD8` (queued on the legacy default stream).
pub(super) fn set(dev: u32, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
    // SAFETY: the driver validates the device range.
    let r = unsafe { sys::cuMemsetD8_v2(dst.0, value, bytes) };
    check("cuMemsetD8_v2", dev, r)
}

/// `cuMemcpyHtoDAsync` on `stream`.
///
/// # Safety
/// `src..src + bytes` stays valid until the stream has run the copy.
pub(super) unsafe fn copy_htod_async(
    dev: u32,
    dst: DevicePtr,
    src: *const u8,
    bytes: usize,
    stream: RawStream,
) -> Result<()> {
    // SAFETY: the caller's guarantee; the driver validates the device range and stream.
    let r = unsafe { sys::cuMemcpyHtoDAsync_v2(dst.0, src.cast(), bytes, stream_handle(stream)) };
    check("cuMemcpyHtoDAsync_v2", dev, r)
}

/// `cuMemcpyDtoHAsync` on `stream`.
///
/// # Safety
/// `dst..dst + bytes` stays valid, and untouched by the host, until the stream has run the copy.
pub(super) unsafe fn copy_dtoh_async(
    dev: u32,
    dst: *mut u8,
    src: DevicePtr,
    bytes: usize,
    stream: RawStream,
) -> Result<()> {
    // SAFETY: the caller's guarantee; the driver validates the device range and stream.
    let r = unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src.0, bytes, stream_handle(stream)) };
    check("cuMemcpyDtoHAsync_v2", dev, r)
}

/// `cuMemcpyDtoDAsync` on `stream`.
pub(super) fn copy_dtod_async(
    dev: u32,
    dst: DevicePtr,
    src: DevicePtr,
    bytes: usize,
    stream: RawStream,
) -> Result<()> {
    // SAFETY: the driver validates the device ranges and the stream.
    let r = unsafe { sys::cuMemcpyDtoDAsync_v2(dst.0, src.0, bytes, stream_handle(stream)) };
    check("cuMemcpyDtoDAsync_v2", dev, r)
}

/// `cuMemsetD8Async` on `stream`.
pub(super) fn set_async(
    dev: u32,
    dst: DevicePtr,
    value: u8,
    bytes: usize,
    stream: RawStream,
) -> Result<()> {
    // SAFETY: the driver validates the device range and the stream.
    let r = unsafe { sys::cuMemsetD8Async(dst.0, value, bytes, stream_handle(stream)) };
    check("cuMemsetD8Async", dev, r)
}
