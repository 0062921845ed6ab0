//! The driver's init and device queries, as thin functions; `ordinal` names the device in errors.

use std::ffi::CStr;

use cudarc::driver::sys;

use super::result::check;
use crate::error::Result;

/// `cuInit(0)`. Every entry point must have been checked present first.
pub(super) fn init() -> Result<()> {
    // SAFETY: a plain call; the library is loaded and has the entry point.
    check("cuInit", 0, unsafe { sys::cuInit(0) })
}

/// `cuDriverGetVersion`: `major * 1000 + minor * 10`.
pub(super) fn driver_version() -> Result<i32> {
    let mut version = 0;
    // SAFETY: valid out-pointer to a local.
    let r = unsafe { sys::cuDriverGetVersion(&mut version) };
    check("cuDriverGetVersion", 0, r)?;
    Ok(version)
}

pub(super) fn count() -> Result<u32> {
    let mut count = 0;
    // SAFETY: valid out-pointer to a local.
    let r = unsafe { sys::cuDeviceGetCount(&mut count) };
    check("cuDeviceGetCount", 0, r)?;
    Ok(count.max(0) as u32)
}

/// `cuDeviceGet`: the handle of device `ordinal`.
pub(super) fn get(ordinal: u32) -> Result<sys::CUdevice> {
    let mut handle: sys::CUdevice = 0;
    // SAFETY: valid out-pointer to a local; the driver validates the ordinal.
    let r = unsafe { sys::cuDeviceGet(&mut handle, ordinal as i32) };
    check("cuDeviceGet", ordinal, r)?;
    Ok(handle)
}

pub(super) fn name(ordinal: u32, handle: sys::CUdevice) -> Result<String> {
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: the buffer and its length are valid; the driver validates the handle.
    let r = unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, handle) };
    check("cuDeviceGetName", ordinal, r)?;
    // SAFETY: the driver wrote a NUL-terminated name into the buffer.
    Ok(unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

/// `cuDeviceGetUuid`: the 16 bytes of the device's UUID.
pub(super) fn uuid(ordinal: u32, handle: sys::CUdevice) -> Result<[u8; 16]> {
    let mut uuid = sys::CUuuid { bytes: [0; 16] };
    // SAFETY: valid out-pointer to a local; the driver validates the handle.
    let r = unsafe { sys::cuDeviceGetUuid(&mut uuid, handle) };
    check("cuDeviceGetUuid", ordinal, r)?;
    Ok(uuid.bytes.map(|b| b as u8))
}

pub(super) fn total_memory(ordinal: u32, handle: sys::CUdevice) -> Result<usize> {
    let mut total = 0usize;
    // SAFETY: valid out-pointer to a local; the driver validates the handle.
    let r = unsafe { sys::cuDeviceTotalMem_v2(&mut total, handle) };
    check("cuDeviceTotalMem_v2", ordinal, r)?;
    Ok(total)
}

pub(super) fn attribute(
    ordinal: u32,
    handle: sys::CUdevice,
    attribute: sys::CUdevice_attribute,
) -> Result<i32> {
    let mut v = 0;
    // SAFETY: valid out-pointer to a local; the driver validates handle and attribute.
    let r = unsafe { sys::cuDeviceGetAttribute(&mut v, attribute, handle) };
    check("cuDeviceGetAttribute", ordinal, r)?;
    Ok(v)
}
