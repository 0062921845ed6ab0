//! Host memory blocks: pageable (the system allocator) or page-locked (the backend).
//!
//! A [`HostBlock`] records how it was made, so freeing it can never use the wrong
//! deallocator: host resources hand blocks out and take them back without `unsafe`.

use std::alloc::Layout;
use std::fmt;
use std::ptr::NonNull;

use super::Backend;
use crate::error::{Error, Result};

/// How a [`HostBlock`] was allocated.
#[derive(Clone, Copy)]
enum Origin {
    /// Zero bytes: nothing was allocated.
    Empty,
    /// The system allocator, with this layout.
    Pageable(Layout),
    /// `cuMemHostAlloc` (or the simulator's equivalent) of this backend.
    Pinned(&'static dyn Backend),
}

/// An owned block of host memory. Dropping it leaks the memory; give it back to the resource
/// that made it (or [`free`]).
pub struct HostBlock {
    ptr: NonNull<u8>,
    len: usize,
    origin: Origin,
}

// SAFETY: a HostBlock exclusively owns its bytes, like a Box<[u8]>.
unsafe impl Send for HostBlock {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for HostBlock {}

impl HostBlock {
    /// The first byte.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The first byte, writable.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-byte block.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when the block is page-locked.
    pub fn is_pinned(&self) -> bool {
        matches!(self.origin, Origin::Pinned(_))
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the block owns `len` initialized (zeroed or written) bytes at `ptr`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl fmt::Debug for HostBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBlock")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("pinned", &self.is_pinned())
            .finish()
    }
}

fn empty(alignment: usize) -> HostBlock {
    HostBlock {
        // An aligned, dangling pointer is valid for zero-length slices.
        ptr: NonNull::new(alignment as *mut u8).unwrap_or(NonNull::dangling()),
        len: 0,
        origin: Origin::Empty,
    }
}

/// Allocates `bytes` of zeroed pageable memory aligned to `alignment` (a power of two).
pub fn alloc_pageable(bytes: usize, alignment: usize) -> Result<HostBlock> {
    let layout = Layout::from_size_align(bytes, alignment.max(1)).map_err(|_| {
        Error::invalid_argument(
            "alignment",
            alignment,
            "a power of two, with size + alignment below isize::MAX",
        )
    })?;
    if bytes == 0 {
        return Ok(empty(layout.align()));
    }
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    let ptr = NonNull::new(ptr).ok_or(Error::HostOutOfMemory {
        requested: bytes,
        resource: "NewDeleteResource",
    })?;
    Ok(HostBlock {
        ptr,
        len: bytes,
        origin: Origin::Pageable(layout),
    })
}

/// Allocates `bytes` of page-locked memory from `backend` (page-aligned).
pub fn alloc_pinned(backend: &'static dyn Backend, bytes: usize) -> Result<HostBlock> {
    if bytes == 0 {
        return Ok(empty(4096));
    }
    let p = backend.malloc_host(bytes).map_err(|e| match e {
        Error::Driver { ref name, .. } if name == "CUDA_ERROR_OUT_OF_MEMORY" => {
            Error::HostOutOfMemory {
                requested: bytes,
                resource: "PinnedHostMemoryResource",
            }
        }
        other => other,
    })?;
    let ptr = NonNull::new(p).ok_or(Error::HostOutOfMemory {
        requested: bytes,
        resource: "PinnedHostMemoryResource",
    })?;
    Ok(HostBlock {
        ptr,
        len: bytes,
        origin: Origin::Pinned(backend),
    })
}

/// Frees `block` with the deallocator that made it.
pub fn free(block: HostBlock) -> Result<()> {
    match block.origin {
        Origin::Empty => Ok(()),
        Origin::Pageable(layout) => {
            // SAFETY: the block was allocated with exactly this layout and is consumed here.
            unsafe { std::alloc::dealloc(block.ptr.as_ptr(), layout) };
            Ok(())
        }
        // SAFETY: the block came from this backend's `malloc_host` and is consumed here.
        Origin::Pinned(backend) => unsafe { backend.free_host(block.ptr.as_ptr()) },
    }
}
