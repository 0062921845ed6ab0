//! The entry points the backend needs, [`check`] (a `CUresult` as a [`Result`]) and handle casts.

use std::ffi::CStr;

use cudarc::driver::sys;

use crate::backend::{RawEvent, RawMemPool, RawStream};
use crate::error::{Error, Result};

/// Every driver entry point the backend uses, separated by white space; checked at load time.
pub(super) const REQUIRED_SYMBOLS: &str = "
    cuInit cuDriverGetVersion cuDeviceGetCount cuDeviceGet cuDeviceGetName cuDeviceGetUuid
    cuDeviceTotalMem_v2 cuDeviceGetAttribute cuDevicePrimaryCtxRetain cuCtxSetCurrent
    cuCtxGetCurrent cuCtxGetDevice cuMemGetAddressRange_v2 cuCtxSynchronize cuGetErrorName
    cuGetErrorString cuMemGetInfo_v2 cuMemAlloc_v2 cuMemFree_v2 cuMemAllocManaged cuIpcGetMemHandle
    cuIpcOpenMemHandle_v2 cuIpcCloseMemHandle cuMemGetAllocationGranularity cuMemAddressReserve
    cuMemAddressFree cuMemCreate cuMemRelease cuMemMap cuMemUnmap cuMemSetAccess cuMemHostAlloc
    cuMemFreeHost cuMemHostRegister_v2 cuMemHostUnregister cuMemPoolCreate cuMemPoolDestroy
    cuMemPoolSetAttribute cuMemPoolGetAttribute cuMemPoolTrimTo cuMemAllocFromPoolAsync
    cuMemFreeAsync cuMemcpyHtoD_v2 cuMemcpyDtoH_v2 cuMemcpyDtoD_v2 cuMemcpyHtoDAsync_v2
    cuMemcpyDtoHAsync_v2 cuMemcpyDtoDAsync_v2 cuMemsetD8_v2 cuMemsetD8Async cuStreamCreate
    cuStreamDestroy_v2 cuStreamSynchronize cuStreamQuery cuStreamWaitEvent cuEventCreate
    cuEventDestroy_v2 cuEventRecord cuEventQuery cuEventSynchronize";

/// Turns a `CUresult` into a `Result`, with the error's name and description.
pub(super) fn check(call: &'static str, device: u32, r: sys::CUresult) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    let mut desc: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: both out-pointers are valid; the driver writes pointers to static strings.
    unsafe {
        let _ = sys::cuGetErrorName(r, &mut name);
        let _ = sys::cuGetErrorString(r, &mut desc);
    }
    let text = |p: *const std::ffi::c_char| {
        if p.is_null() {
            "unknown".to_string()
        } else {
            // SAFETY: the driver returned a NUL-terminated static string.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    Err(Error::Driver {
        call,
        device,
        name: text(name),
        code: r as u32,
        description: text(desc),
    })
}

pub(super) fn stream_handle(raw: RawStream) -> sys::CUstream {
    raw as usize as sys::CUstream
}

pub(super) fn event_handle(raw: RawEvent) -> sys::CUevent {
    raw as usize as sys::CUevent
}

pub(super) fn pool_handle(raw: RawMemPool) -> sys::CUmemoryPool {
    raw as usize as sys::CUmemoryPool
}

/// A device UUID as `nvidia-smi` prints it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub(super) fn format_uuid(bytes: &[u8; 16]) -> String {
    let hex = |range: std::ops::Range<usize>| -> String {
        bytes[range].iter().map(|b| format!("{b:02x}")).collect()
    };
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}
