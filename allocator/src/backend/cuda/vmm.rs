//! CUDA's virtual memory management API, as thin functions.

use cudarc::driver::sys;

use super::result::check;
use crate::backend::{DevicePtr, RawPhysical};
use crate::error::Result;

/// Pinned device memory on `dev`: the allocation properties of every chunk.
fn device_memory(dev: u32) -> sys::CUmemAllocationProp {
    // SAFETY: an all-zero CUmemAllocationProp is valid (no handle types or flags); set below.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev as i32;
    prop
}

/// `cuMemGetAllocationGranularity` (minimum) for pinned memory on `dev`.
pub(super) fn granularity(dev: u32) -> Result<usize> {
    let prop = device_memory(dev);
    let mut g = 0usize;
    // SAFETY: valid out-pointer and properties.
    check("cuMemGetAllocationGranularity", dev, unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut g,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })?;
    Ok(g.max(1))
}

/// `cuMemAddressReserve` of `bytes` anywhere, aligned to the granularity.
pub(super) fn address_reserve(dev: u32, bytes: usize) -> Result<DevicePtr> {
    let mut p = 0;
    // SAFETY: valid out-pointer; alignment 0 is the granularity; no fixed address.
    let r = unsafe { sys::cuMemAddressReserve(&mut p, bytes, 0, 0, 0) };
    check("cuMemAddressReserve", dev, r)?;
    Ok(DevicePtr(p))
}

pub(super) fn address_free(dev: u32, ptr: DevicePtr, bytes: usize) -> Result<()> {
    // SAFETY: the driver validates the range against its reservations.
    let r = unsafe { sys::cuMemAddressFree(ptr.0, bytes) };
    check("cuMemAddressFree", dev, r)
}

/// `cuMemCreate` of `bytes` of pinned memory on `dev`.
pub(super) fn create(dev: u32, bytes: usize) -> Result<RawPhysical> {
    let prop = device_memory(dev);
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: valid out-pointer and properties; flags must be 0.
    let r = unsafe { sys::cuMemCreate(&mut h, bytes, &prop, 0) };
    check("cuMemCreate", dev, r)?;
    Ok(h as RawPhysical)
}

pub(super) fn release(dev: u32, handle: RawPhysical) -> Result<()> {
    // SAFETY: the driver validates the handle.
    check("cuMemRelease", dev, unsafe { sys::cuMemRelease(handle) })
}

/// `cuMemMap` of all of `handle` at `ptr`.
pub(super) fn map(dev: u32, ptr: DevicePtr, bytes: usize, handle: RawPhysical) -> Result<()> {
    // SAFETY: the driver validates range (reserved, unmapped) and handle; offset, flags are 0.
    let r = unsafe { sys::cuMemMap(ptr.0, bytes, 0, handle, 0) };
    check("cuMemMap", dev, r)
}

pub(super) fn unmap(dev: u32, ptr: DevicePtr, bytes: usize) -> Result<()> {
    // SAFETY: the driver validates the range; the caller guarantees no queued work uses it.
    check("cuMemUnmap", dev, unsafe { sys::cuMemUnmap(ptr.0, bytes) })
}

/// `cuMemSetAccess`: read and write from `dev`.
pub(super) fn set_access(dev: u32, ptr: DevicePtr, bytes: usize) -> Result<()> {
    // SAFETY: an all-zero CUmemAccessDesc is valid; fields set below.
    let mut desc: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
    desc.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = dev as i32;
    desc.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    // SAFETY: one valid descriptor; the driver validates the range.
    let r = unsafe { sys::cuMemSetAccess(ptr.0, bytes, &desc, 1) };
    check("cuMemSetAccess", dev, r)
}
