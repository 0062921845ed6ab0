//! The driver's stream-ordered allocator, as thin functions; the caller made `dev`'s context current.

use cudarc::driver::sys;

use super::result::{check, pool_handle, stream_handle};
use crate::backend::{DevicePtr, RawMemPool, RawStream};
use crate::error::Result;

/// `cuMemPoolCreate` on `dev`, keeping up to `release_threshold` bytes across synchronizations.
pub(super) fn create(dev: u32, release_threshold: u64) -> Result<RawMemPool> {
    // SAFETY: an all-zero CUmemPoolProps is the documented default; fields set below.
    let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
    props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
    props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = dev as i32;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: valid pointers to initialized locals.
    let r = unsafe { sys::cuMemPoolCreate(&mut pool, &props) };
    check("cuMemPoolCreate", dev, r)?;
    let raw = pool as usize as RawMemPool;
    let mut threshold = release_threshold;
    // SAFETY: the attribute is a cuuint64_t read from a local; the pool was just made.
    let set = check("cuMemPoolSetAttribute", dev, unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
    });
    if let Err(e) = set {
        // Nothing was allocated from it: destroy it, so the caller keeps no half-made pool.
        let _ = destroy(dev, raw);
        return Err(e);
    }
    Ok(raw)
}

pub(super) fn destroy(dev: u32, pool: RawMemPool) -> Result<()> {
    // SAFETY: the driver validates the handle.
    let r = unsafe { sys::cuMemPoolDestroy(pool_handle(pool)) };
    check("cuMemPoolDestroy", dev, r)
}

/// `cuMemPoolTrimTo`: releases unused memory down to `keep_bytes`.
pub(super) fn trim(dev: u32, pool: RawMemPool, keep_bytes: usize) -> Result<()> {
    // SAFETY: the driver validates the handle.
    let r = unsafe { sys::cuMemPoolTrimTo(pool_handle(pool), keep_bytes) };
    check("cuMemPoolTrimTo", dev, r)
}

/// The pool's `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`.
pub(super) fn reserved(dev: u32, pool: RawMemPool) -> Result<u64> {
    let mut v = 0u64;
    // SAFETY: the attribute is a cuuint64_t written into a local.
    check("cuMemPoolGetAttribute", dev, unsafe {
        sys::cuMemPoolGetAttribute(
            pool_handle(pool),
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            (&mut v as *mut u64).cast(),
        )
    })?;
    Ok(v)
}

/// `cuMemAllocFromPoolAsync` on `stream`.
pub(super) fn alloc_async(
    dev: u32,
    pool: RawMemPool,
    bytes: usize,
    stream: RawStream,
) -> Result<DevicePtr> {
    let mut p = 0;
    // SAFETY: valid out-pointer to a local; the driver validates pool and stream.
    check("cuMemAllocFromPoolAsync", dev, unsafe {
        sys::cuMemAllocFromPoolAsync(&mut p, bytes, pool_handle(pool), stream_handle(stream))
    })?;
    Ok(DevicePtr(p))
}

/// `cuMemFreeAsync` on `stream`.
pub(super) fn free_async(dev: u32, ptr: DevicePtr, stream: RawStream) -> Result<()> {
    // SAFETY: the driver validates pointer and stream.
    let r = unsafe { sys::cuMemFreeAsync(ptr.0, stream_handle(stream)) };
    check("cuMemFreeAsync", dev, r)
}
