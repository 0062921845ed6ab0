//! Simulated device memory: the allocation table, and host backing or unbacked address ranges.

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

/// Host memory backing device memory. Freed with the last reference (the table or a queued copy),
/// so a copy queued before a free never writes into released memory.
#[derive(Debug)]
pub(crate) struct Backing {
    /// Aligned as asked.
    ptr: *mut u8,
    len: usize,
    storage: Storage,
}

#[derive(Debug)]
pub(crate) enum Storage {
    /// A heap block: `len + align` bytes at the allocator's minimum alignment.
    Heap { base: *mut u8, layout: Layout },
    /// A shared mapping of a memory file (exported or imported), unmapped on drop; the
    /// exporter's file closes then.
    Shared { _file: Option<std::fs::File> },
}

// SAFETY: `Backing` owns a heap block or a shared mapping; its bytes are accessed through raw
// pointers ordered by the stream model, as device memory is shared between streams.
unsafe impl Send for Backing {}
// SAFETY: as above; `Backing` has no interior state besides the block it owns.
unsafe impl Sync for Backing {}

impl Backing {
    /// Allocates `bytes` (> 0) of zeroed host memory aligned to `align` (a power of two), aligned
    /// by hand so large blocks stay on `calloc`'s lazily zeroed mappings (free until touched).
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
            len,
            storage: Storage::Heap { base, layout },
        })
    }

    /// A backing over a shared mapping, unmapped on drop; `file` (the exporter's) stays open until
    /// then.
    ///
    /// # Safety
    /// `ptr` starts a live shared mapping of exactly `len` bytes, owned by the backing from now on.
    pub(crate) unsafe fn shared(ptr: *mut u8, len: usize, file: Option<std::fs::File>) -> Backing {
        Backing {
            ptr,
            len,
            storage: Storage::Shared { _file: file },
        }
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
        match &self.storage {
            // SAFETY: `base` was allocated with `layout` in `Backing::new` and is freed only here.
            Storage::Heap { base, layout } => unsafe { std::alloc::dealloc(*base, *layout) },
            // The file, if any, closes as the storage drops, after the unmap.
            Storage::Shared { .. } => {
                // SAFETY: the backing owns this mapping of `len` bytes (`Backing::shared`).
                unsafe { libc::munmap(self.ptr.cast(), self.len) };
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AllocKind {
    Device,
    Managed,
    /// From a stream-ordered pool (the pool's handle).
    Pool(u64),
    /// Physical memory `handle` mapped in a reservation; usable once `accessible`.
    Mapped {
        handle: u64,
        accessible: bool,
    },
    /// Memory exported to other processes (`ipc_alloc`), in a shared file.
    Exported,
    /// Another process's exported memory mapped here (`ipc_open`).
    Imported,
}

#[derive(Debug)]
pub(crate) struct Allocation {
    pub(crate) device: u32,
    pub(crate) len: usize,
    pub(crate) kind: AllocKind,
    pub(crate) backing: Option<Arc<Backing>>,
}

/// One piece of a validated device range, inside one allocation.
#[derive(Debug, Clone)]
struct Part {
    backing: Option<Arc<Backing>>,
    /// Offset of the piece inside `backing`.
    offset: usize,
    len: usize,
}

/// A validated device range: where to read or write (nowhere if unbacked), in several pieces
/// where it crosses adjacent mappings.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    parts: Vec<Part>,
}

impl Resolved {
    /// The pieces as (host address when backed, length), valid while `self` lives.
    pub(crate) fn pieces(&self) -> Vec<(Option<*mut u8>, usize)> {
        self.parts
            .iter()
            .map(|p| {
                let host = p
                    .backing
                    .as_ref()
                    // SAFETY: `resolve` checked `offset + len` against the allocation's length.
                    .map(|b| unsafe { b.ptr().add(p.offset) });
                (host, p.len)
            })
            .collect()
    }
}

#[derive(Debug, Default)]
pub(crate) struct AllocationTable {
    /// Live allocations by start address.
    pub(super) live: BTreeMap<u64, Allocation>,
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

    /// Enters an allocation of `len` bytes at `addr`.
    pub(crate) fn add(
        &mut self,
        addr: u64,
        device: u32,
        len: usize,
        kind: AllocKind,
        backing: Option<Arc<Backing>>,
    ) {
        let allocation = Allocation {
            device,
            len,
            kind,
            backing,
        };
        self.live.insert(addr, allocation);
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
        // Bump allocation, wrapping around, past live ones (few steps: the region dwarfs capacity).
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

    /// Removes the allocation at `ptr` if it is on `device` and `accept` takes its kind; else
    /// [`Error::InvalidPointer`] naming `resource`.
    pub(crate) fn take(
        &mut self,
        ptr: DevicePtr,
        device: u32,
        accept: impl Fn(AllocKind) -> bool,
        resource: &'static str,
    ) -> Result<Allocation> {
        let addr = ptr.addr();
        let found = self
            .live
            .get(&addr)
            .is_some_and(|a| a.device == device && accept(a.kind));
        found
            .then(|| self.live.remove(&addr))
            .flatten()
            .ok_or(Error::invalid_pointer(addr, 0, resource))
    }

    /// Checks that `[ptr, ptr + len)` lies in one live allocation or gapless, accessible mappings.
    pub(crate) fn resolve(
        &self,
        ptr: DevicePtr,
        len: usize,
        what: &'static str,
    ) -> Result<Resolved> {
        let invalid = || Error::invalid_pointer(ptr.addr(), len, what);
        let addr = ptr.addr();
        let end = addr.checked_add(len as u64).ok_or_else(invalid)?;
        let (start, first) = self.live.range(..=addr).next_back().ok_or_else(invalid)?;
        let mut parts = Vec::with_capacity(1);
        let (mut at, mut start, mut a) = (addr, *start, first);
        loop {
            let a_end = start + a.len as u64;
            if at >= a_end
                || matches!(
                    a.kind,
                    AllocKind::Mapped {
                        accessible: false,
                        ..
                    }
                )
            {
                return Err(invalid());
            }
            let piece_end = a_end.min(end);
            parts.push(Part {
                backing: a.backing.clone(),
                offset: (at - start) as usize,
                len: (piece_end - at) as usize,
            });
            if piece_end == end {
                return Ok(Resolved { parts });
            }
            // Past this allocation, only into the adjacent mapping of the same reservation.
            let next = self.live.get(&a_end).filter(|n| {
                matches!(a.kind, AllocKind::Mapped { .. })
                    && matches!(n.kind, AllocKind::Mapped { .. })
                    && n.device == a.device
            });
            match next {
                Some(n) => (at, start, a) = (a_end, a_end, n),
                None => return Err(invalid()),
            }
        }
    }

    /// The allocations that start in `[addr, addr + len)`, in address order.
    pub(crate) fn starting_in(&self, addr: u64, len: u64) -> Vec<(u64, &Allocation)> {
        self.live
            .range(addr..addr.saturating_add(len))
            .map(|(a, x)| (*a, x))
            .collect()
    }

    /// Whether any allocation overlaps `[addr, addr + len)`.
    pub(crate) fn overlaps(&self, addr: u64, len: u64) -> bool {
        self.live
            .range(..addr + len)
            .next_back()
            .is_some_and(|(s, a)| s + a.len as u64 > addr)
    }

    /// Live allocations of `device` for leak reports, except mappings (counted apart).
    pub(crate) fn count_on(&self, device: u32) -> usize {
        self.live
            .values()
            .filter(|a| a.device == device && !matches!(a.kind, AllocKind::Mapped { .. }))
            .count()
    }
}
