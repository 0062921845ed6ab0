//! CUDA's legacy interprocess memory API (which cannot export virtual memory API memory).

use cudarc::driver::sys;

use super::result::check;
use crate::backend::{DevicePtr, IpcHandle};
use crate::error::Result;

/// `cuIpcGetMemHandle` of the allocation at `ptr` (from `cuMemAlloc`).
pub(super) fn export(dev: u32, ptr: DevicePtr) -> Result<IpcHandle> {
    // SAFETY: an all-zero handle is a valid out-parameter.
    let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer; the driver validates the address.
    let r = unsafe { sys::cuIpcGetMemHandle(&mut h, ptr.0) };
    check("cuIpcGetMemHandle", dev, r)?;
    Ok(IpcHandle(h.reserved.map(|b| b as u8)))
}

/// `cuIpcOpenMemHandle` of `handle` into the current context: the mapping's address and size.
pub(super) fn open(dev: u32, handle: &IpcHandle) -> Result<(DevicePtr, usize)> {
    let h = sys::CUipcMemHandle {
        reserved: handle.0.map(|b| b as std::ffi::c_char),
    };
    let mut p = 0;
    let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
    // SAFETY: valid out-pointer; the driver validates the handle.
    let r = unsafe { sys::cuIpcOpenMemHandle_v2(&mut p, h, flags) };
    check("cuIpcOpenMemHandle", dev, r)?;
    let (mut base, mut len) = (0, 0usize);
    // SAFETY: valid out-pointers; `p` is the mapping just made.
    let r = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut len, p) };
    let sized = check("cuMemGetAddressRange", dev, r);
    if let Err(e) = sized {
        let _ = close(dev, DevicePtr(p));
        return Err(e);
    }
    Ok((DevicePtr(p), len))
}

/// `cuIpcCloseMemHandle` of an address [`open`] returned.
pub(super) fn close(dev: u32, ptr: DevicePtr) -> Result<()> {
    // SAFETY: the driver validates the address against its mappings.
    let r = unsafe { sys::cuIpcCloseMemHandle(ptr.0) };
    check("cuIpcCloseMemHandle", dev, r)
}
