//! Memory of the simulated device: an allocation table over all devices, host backing in
//! *backed* mode, and a reserved address range per device in *unbacked* mode.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::backend::DevicePtr;
use crate::error::{Error, Result};

/// Alignment of every simulated device allocation (RMM requires at least 256 bytes).
pub(crate) const DEVICE_ALIGNMENT: usize = 256;
/// Alignment of simulated pinned host allocations (a page, as the driver gives).
pub(crate) const HOST_ALIGNMENT: usize = 4096;
/// Size of the address range reserved for each device in unbacked mode (16 TiB).
const UNBACKED_REGION: u64 = 1 << 44;
/// Start of device 0's unbacked address range.
const UNBACKED_BASE: u64 = 1 << 46;

/// Host memory standing in for device memory in backed mode. Freed when the last reference
/// (the allocation table or a queued copy) goes away, so a copy queued before a free never
/// writes into released host memory.
#[derive(Debug)]
pub(crate) struct Backing {
    /// The start of the block, aligned as asked.
    ptr: *mut u8,
    /// What was allocated: `len + align` bytes at the allocator's minimum alignment.
    base: *mut u8,
    layout: Layout,
    len: usize,
}

// SAFETY: `Backing` owns a plain heap block; access to its bytes goes through raw pointers whose
// ordering the stream model provides, exactly as device memory is shared between streams.
unsafe impl Send for Backing {}
// SAFETY: as above; `Backing` itself has no interior state besides the block it owns.
unsafe impl Sync for Backing {}

impl Backing {
    /// Allocates `bytes` (> 0) of zeroed host memory aligned to `align` (a power of two).
    ///
    /// The block is over-allocated at the allocator's minimum alignment and aligned by hand:
    /// that keeps large blocks on `calloc`'s fresh, lazily zeroed mappings (an aligned
    /// `alloc_zeroed` would write every byte), so a 1 GiB simulated allocation costs nothing
    /// until it is touched.
    pub(crate) fn new(bytes: usize, align: usize) -> Option<Backing> {
        let len = bytes.max(1);
        let layout = Layout::from_size_align(len.checked_add(align)?, 16).ok()?;
        // SAFETY: the layout has a non-zero size.
        let base = unsafe { std::alloc::alloc_zeroed(layout) };
        if base.is_null() {
            return None;
        }
        let offset = base.align_offset(align);
        // SAFETY: `offset < align`, so the aligned start plus `len` stays inside the block.
        let ptr = unsafe { base.add(offset) };
        Some(Backing {
            ptr,
            base,
            layout,
            len,
        })
    }

    pub(crate) fn addr(&self) -> u64 {
        self.ptr as u64
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Backing {
    fn drop(&mut self) {
        // SAFETY: `base` was allocated with `layout` in `Backing::new` and is freed only here.
        unsafe { std::alloc::dealloc(self.base, self.layout) }
    }
}

/// What kind of allocation a table entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AllocKind {
    Device,
    Managed,
    /// From a stream-ordered pool (the pool's handle).
    Pool(u64),
}

#[derive(Debug)]
pub(crate) struct Allocation {
    pub(crate) device: u32,
    pub(crate) len: usize,
    pub(crate) kind: AllocKind,
    pub(crate) backing: Option<Arc<Backing>>,
}

/// A validated device range: where to read or write, if anywhere (unbacked mode has no bytes).
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub(crate) backing: Option<Arc<Backing>>,
    /// Offset of the range inside `backing`.
    pub(crate) offset: usize,
}

impl Resolved {
    /// Host address of the range's first byte, when backed.
    pub(crate) fn host_ptr(&self) -> Option<*mut u8> {
        self.backing
            .as_ref()
            // SAFETY: `offset` was checked against the allocation's length in `resolve`.
            .map(|b| unsafe { b.ptr().add(self.offset) })
    }
}

/// The allocation table of all simulated devices.
#[derive(Debug, Default)]
pub(crate) struct AllocationTable {
    live: BTreeMap<u64, Allocation>,
    /// Next candidate address of each device's unbacked range.
    cursors: Vec<u64>,
}

impl AllocationTable {
    pub(crate) fn new(devices: u32) -> Self {
        AllocationTable {
            live: BTreeMap::new(),
            cursors: (0..devices as u64)
                .map(|d| UNBACKED_BASE + d * UNBACKED_REGION)
                .collect(),
        }
    }

    /// Picks an unused, 256-byte aligned address range of `len` bytes in `device`'s region.
    pub(crate) fn reserve_unbacked(&mut self, device: u32, len: usize) -> Option<u64> {
        let region_start = UNBACKED_BASE + device as u64 * UNBACKED_REGION;
        let region_end = region_start + UNBACKED_REGION;
        let len = len as u64;
        if len > UNBACKED_REGION {
            return None;
        }
        let mut cursor = *self.cursors.get(device as usize)?;
        let mut wrapped = false;
        // Bump allocation with wrap-around; skips over live allocations. The region is far
        // larger than any simulated capacity, so the loop ends after a few steps.
        for _ in 0..=self.live.len() + 1 {
            if cursor + len > region_end {
                if wrapped {
                    return None;
                }
                wrapped = true;
                cursor = region_start;
            }
            let overlap = self
                .live
                .range(..cursor + len)
                .next_back()
                .filter(|(start, a)| **start + a.len as u64 > cursor)
                .map(|(start, a)| *start + a.len as u64);
            match overlap {
                Some(end) => cursor = end.next_multiple_of(DEVICE_ALIGNMENT as u64),
                None => {
                    self.cursors[device as usize] =
                        (cursor + len).next_multiple_of(DEVICE_ALIGNMENT as u64);
                    return Some(cursor);
                }
            }
        }
        None
    }

    pub(crate) fn insert(&mut self, addr: u64, allocation: Allocation) {
        self.live.insert(addr, allocation);
    }

    /// Removes the allocation that starts exactly at `addr`.
    pub(crate) fn remove(&mut self, addr: u64) -> Option<Allocation> {
        self.live.remove(&addr)
    }

    pub(crate) fn get(&self, addr: u64) -> Option<&Allocation> {
        self.live.get(&addr)
    }

    /// Checks that `[ptr, ptr + len)` lies inside one live allocation.
    pub(crate) fn resolve(
        &self,
        ptr: DevicePtr,
        len: usize,
        what: &'static str,
    ) -> Result<Resolved> {
        let addr = ptr.addr();
        let found = self
            .live
            .range(..=addr)
            .next_back()
            .filter(|(start, a)| addr + len as u64 <= **start + a.len as u64);
        match found {
            Some((start, a)) => Ok(Resolved {
                backing: a.backing.clone(),
                offset: (addr - start) as usize,
            }),
            None => Err(Error::InvalidPointer {
                ptr: addr,
                bytes: len,
                resource: what,
            }),
        }
    }

    /// Live allocations of `device` (for leak reports in tests).
    pub(crate) fn count_on(&self, device: u32) -> usize {
        self.live.values().filter(|a| a.device == device).count()
    }
}
