//! Host memory blocks, pageable (system allocator) or page-locked (backend). A [`HostBlock`]
//! records its origin, so the right deallocator frees it and host resources need no `unsafe`.

use std::alloc::Layout;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

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

/// An owned block of host memory; give it back to the resource that made it (dropping it leaks).
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
    let ptr = NonNull::new(ptr).ok_or(Error::host_out_of_memory(bytes, "NewDeleteResource"))?;
    Ok(HostBlock {
        ptr,
        len: bytes,
        origin: Origin::Pageable(layout),
    })
}

/// Refuses to pin `bytes` for `resource` beyond the host memory the process may still take:
/// pinned pages cannot be paged out, so overcommitting gets the process killed.
fn check_pinnable(
    backend: &'static dyn Backend,
    bytes: usize,
    resource: &'static str,
) -> Result<()> {
    let host = backend.host_memory();
    if bytes as u64 > host.available() {
        return Err(Error::HostMemoryLimit {
            requested: bytes,
            resource,
            host: host.to_string(),
        });
    }
    Ok(())
}

/// Pinned allocations from this size up are checked against the memory the process may use.
const CHECKED_PIN: usize = 16 << 20;

/// Allocates `bytes` of page-locked memory from `backend` (page-aligned).
pub fn alloc_pinned(backend: &'static dyn Backend, bytes: usize) -> Result<HostBlock> {
    if bytes == 0 {
        return Ok(empty(4096));
    }
    // Reading the limits is cheap next to pinning this much.
    if bytes >= CHECKED_PIN {
        check_pinnable(backend, bytes, "PinnedHostMemoryResource")?;
    }
    let out_of_memory = || Error::host_out_of_memory(bytes, "PinnedHostMemoryResource");
    let p = backend.malloc_host(bytes).map_err(|e| match e {
        Error::Driver { ref name, .. } if name == "CUDA_ERROR_OUT_OF_MEMORY" => out_of_memory(),
        other => other,
    })?;
    let ptr = NonNull::new(p).ok_or_else(out_of_memory)?;
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

/// Host memory pinned once for reuse: an anonymous mapping faulted in on several threads and
/// registered chunk by chunk as the faulting runs ahead (`cuMemHostRegister`; `cuMemHostAlloc`
/// faults page by page in the driver). A copy must not cross chunks, so users carve slices
/// inside one.
pub struct PinnedRegion {
    backend: &'static dyn Backend,
    ptr: NonNull<u8>,
    len: usize,
    /// (offset, length) of each registered chunk, in order, covering the region.
    chunks: Vec<(usize, usize)>,
    /// Live slices per chunk, or [`RELEASED`] once it went back to the system.
    live: Vec<AtomicUsize>,
    /// Time spent registering chunks with the driver.
    registering: std::time::Duration,
    /// False for a region of [`PinnedRegion::pageable`]: nothing to unregister.
    pinned: bool,
}

/// [`PinnedRegion::live`] of a chunk given back.
const RELEASED: usize = usize::MAX;

// SAFETY: the region owns its bytes; shared access is via disjoint, singly held `PinnedSlice`s.
unsafe impl Send for PinnedRegion {}
// SAFETY: as above.
unsafe impl Sync for PinnedRegion {}

impl fmt::Debug for PinnedRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedRegion")
            .field("len", &self.len)
            .field("chunks", &self.chunks.len())
            .finish()
    }
}

impl PinnedRegion {
    /// Regions are whole multiples of this (2 MiB, a huge page).
    pub const ALIGNMENT: usize = 2 << 20;

    /// Pins `bytes` (rounded up to 2 MiB): faulted in on `threads` threads and registered in
    /// chunks of `min_chunk` bytes (rounded up to 2 MiB; the last possibly shorter), the faulting
    /// running up to two chunks ahead of the registering.
    pub fn new(
        backend: &'static dyn Backend,
        bytes: usize,
        threads: usize,
        min_chunk: usize,
    ) -> Result<PinnedRegion> {
        const HUGE: usize = PinnedRegion::ALIGNMENT;
        let (ptr, len) = Self::map(backend, bytes, "a pinned host pool")?;
        let base = ptr.as_ptr() as usize;
        // One chunk at a time: a registration holds a driver lock that stalls the process's other
        // driver calls, so parallel or larger ones stall them longer and gain nothing.
        let chunk = min_chunk.max(HUGE).next_multiple_of(HUGE).min(len);
        let spans: Vec<(usize, usize)> = (0..len)
            .step_by(chunk)
            .map(|o| (o, chunk.min(len - o)))
            .collect();
        let mut registering = std::time::Duration::ZERO;
        let mut registered = Vec::new();
        let mut first_error = None;
        std::thread::scope(|s| {
            // Faulting (the kernel zeroing pages) runs ahead of registering (the driver locking
            // them), so that the two overlap rather than add. A chunk is registered only once
            // faulted: the driver would otherwise fault it in under its lock.
            let (faulted, ready) = std::sync::mpsc::sync_channel::<()>(1);
            let spans = &spans;
            let faulter = std::thread::Builder::new().spawn_scoped(s, move || {
                for &(o, l) in spans {
                    fault_in(base + o, l, threads);
                    // Registering stopped (an error): fault no more.
                    if faulted.send(()).is_err() {
                        return;
                    }
                }
            });
            // Without the faulting thread (it could not start), each chunk is faulted here.
            let ready = faulter.ok().map(|_| ready);
            for &(o, l) in spans {
                if ready.as_ref().is_none_or(|r| r.recv().is_err()) {
                    fault_in(base + o, l, threads);
                }
                let t = std::time::Instant::now();
                // SAFETY: in the live mapping, which outlives the registration (undone first in
                // drop).
                let r = unsafe { backend.host_register((base + o) as *mut u8, l) };
                registering += t.elapsed();
                if let Err(e) = r {
                    first_error = Some(e);
                    break;
                }
                registered.push((o, l));
            }
            // Stops a faulting thread waiting to hand over a chunk not to be registered.
            drop(ready);
        });
        let region = PinnedRegion {
            backend,
            ptr,
            len,
            live: registered.iter().map(|_| AtomicUsize::new(0)).collect(),
            chunks: registered,
            registering,
            pinned: true,
        };
        // On an error, dropping the region unregisters what was registered and frees the memory.
        first_error.map_or(Ok(region), Err)
    }

    /// `bytes` (rounded up to 2 MiB) of pageable host memory faulted in on `threads` threads, not
    /// registered: one chunk, for a pool's spills that must not wait for pinning.
    pub fn pageable(
        backend: &'static dyn Backend,
        bytes: usize,
        threads: usize,
    ) -> Result<PinnedRegion> {
        let (ptr, len) = Self::map_faulted(backend, bytes, threads, "pageable spill memory")?;
        Ok(PinnedRegion {
            backend,
            ptr,
            len,
            chunks: vec![(0, len)],
            live: vec![AtomicUsize::new(0)],
            registering: std::time::Duration::ZERO,
            pinned: false,
        })
    }

    /// Maps `bytes` (2 MiB aligned and rounded) and faults it in on `threads` threads; `what` names
    /// the memory in errors.
    fn map_faulted(
        backend: &'static dyn Backend,
        bytes: usize,
        threads: usize,
        what: &'static str,
    ) -> Result<(NonNull<u8>, usize)> {
        let (ptr, len) = Self::map(backend, bytes, what)?;
        fault_in(ptr.as_ptr() as usize, len, threads);
        Ok((ptr, len))
    }

    /// Maps `bytes` (2 MiB aligned and rounded), not yet backed; `what` names the memory in errors.
    fn map(
        backend: &'static dyn Backend,
        bytes: usize,
        what: &'static str,
    ) -> Result<(NonNull<u8>, usize)> {
        const HUGE: usize = PinnedRegion::ALIGNMENT;
        let len = bytes.max(1).next_multiple_of(HUGE);
        check_pinnable(backend, len, what)?;
        // An anonymous mapping is zero-filled, so one touch per page (`fault_in`) backs it; 2 MiB
        // alignment and MADV_HUGEPAGE let the kernel use huge pages (far fewer faults).
        let mapped = len + HUGE;
        // SAFETY: a private anonymous mapping of our own; the kernel chooses the address.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Error::host_out_of_memory(len, "PinnedRegion (mmap)"));
        }
        let start = (base as usize).next_multiple_of(HUGE);
        let head = start - base as usize;
        let tail = mapped - head - len;
        // SAFETY: the unaligned head and tail lie inside the mapping just made and nothing refers
        // to them; a failure only leaves them mapped.
        unsafe {
            if head > 0 {
                libc::munmap(base, head);
            }
            if tail > 0 {
                libc::munmap((start + len) as *mut libc::c_void, tail);
            }
            // Advice only: without transparent huge pages it fails and changes nothing.
            libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        let Some(ptr) = NonNull::new(start as *mut u8) else {
            return Err(Error::host_out_of_memory(len, "PinnedRegion (mmap)"));
        };
        Ok((ptr, len))
    }

    /// Bytes in the region.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Time spent registering with the driver, part of the time pinning took.
    pub fn registering_time(&self) -> std::time::Duration {
        self.registering
    }

    /// (offset, length) of each registered chunk.
    pub fn chunks(&self) -> &[(usize, usize)] {
        &self.chunks
    }

    /// The address of byte `offset`.
    pub fn addr(&self, offset: usize) -> *mut u8 {
        self.ptr.as_ptr().wrapping_add(offset)
    }

    /// The index of the chunk holding byte `offset`.
    fn chunk_of(&self, offset: usize) -> usize {
        self.chunks
            .partition_point(|&(o, l)| o + l <= offset)
            .min(self.chunks.len().saturating_sub(1))
    }

    /// Gives chunk `index` back to the system now unless a slice of it is alive; true when it went.
    pub fn release_chunk(&self, index: usize) -> bool {
        let Some(live) = self.live.get(index) else {
            return false;
        };
        if live
            .compare_exchange(0, RELEASED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        let (o, l) = self.chunks[index];
        // SAFETY: a chunk of `new`'s mapping, not released before (the exchange above), with no
        // live slice and none to be carved now: nothing refers to its bytes.
        unsafe { self.unmap(o, l, self.pinned) };
        true
    }

    /// Unregisters `[o, o + l)` if `registered`, then unmaps it.
    ///
    /// # Safety
    /// The range lies in `new`'s mapping, is still mapped (and registered if `registered`), and
    /// nothing uses its bytes any more.
    unsafe fn unmap(&self, o: usize, l: usize, registered: bool) {
        // SAFETY: registered by `new` and unused (the caller's guarantee).
        if registered && let Err(e) = unsafe { self.backend.host_unregister(self.addr(o)) } {
            tracing::error!("unregistering pinned host memory: {e}");
        }
        // SAFETY: mapped and unused (the caller's guarantee).
        if unsafe { libc::munmap(self.addr(o).cast(), l) } != 0 {
            tracing::error!("unmapping {l} bytes of pinned host memory failed");
        }
    }

    /// True when chunk `index` went back to the system.
    pub fn is_released(&self, index: usize) -> bool {
        self.live
            .get(index)
            .is_some_and(|l| l.load(Ordering::Acquire) == RELEASED)
    }
}

/// Faults in `[addr, addr + len)` of a mapping made by [`PinnedRegion::map`] (a zero written per
/// page), one thread per part (2 MiB multiples); a thread that cannot start leaves its part to
/// the caller.
fn fault_in(addr: usize, len: usize, threads: usize) {
    const HUGE: usize = PinnedRegion::ALIGNMENT;
    let part = len
        .div_ceil(threads.max(1))
        .next_multiple_of(HUGE)
        .min(len)
        .max(1);
    let touch = move |o: usize, l: usize| {
        for page in (o..o + l).step_by(4096) {
            // SAFETY: in a live mapping of ours; each thread writes its own part; volatile, so
            // not elided.
            unsafe { std::ptr::write_volatile((addr + page) as *mut u8, 0) };
        }
    };
    std::thread::scope(|s| {
        for o in (0..len).step_by(part) {
            let l = part.min(len - o);
            if std::thread::Builder::new()
                .spawn_scoped(s, move || touch(o, l))
                .is_err()
            {
                touch(o, l);
            }
        }
    });
}

impl Drop for PinnedRegion {
    fn drop(&mut self) {
        // Unmap only what is still ours: the kernel may have reused a released chunk's addresses (a
        // thread's stack, another region), which unmapping the whole region would destroy.
        for (i, &(o, l)) in self.chunks.iter().enumerate() {
            if !self.is_released(i) {
                // SAFETY: a chunk of `new`'s mapping not released; slices hold the region's `Arc`,
                // so none is alive and no copy uses it.
                unsafe { self.unmap(o, l, self.pinned) };
            }
        }
        // What a failed registration left unregistered after the last chunk.
        let covered = self.chunks.last().map_or(0, |&(o, l)| o + l);
        if covered < self.len {
            // SAFETY: the mapped, unregistered rest of `new`'s mapping, which nothing uses.
            unsafe { self.unmap(covered, self.len - covered, false) };
        }
    }
}

/// Gives a slice's range back to whoever carved it.
pub trait SliceOwner: Send + Sync {
    /// `offset..offset + len` of `region` is free again.
    fn give_back(&self, region: &PinnedRegion, offset: usize, len: usize);
    /// `delta` more (negative: fewer) bytes of its slices hold a droppable copy rather than data.
    fn reclaimable(&self, _delta: isize) {}
}

/// A range of a pinned region owned by one holder; given back to its owner on drop.
pub struct PinnedSlice {
    region: std::sync::Arc<PinnedRegion>,
    owner: std::sync::Arc<dyn SliceOwner>,
    offset: usize,
    len: usize,
    /// The chunk it lies in.
    chunk: usize,
    /// Counted by its owner as reclaimable.
    reclaimable: bool,
}

impl fmt::Debug for PinnedSlice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedSlice")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl PinnedSlice {
    /// A slice of `region`, inside one chunk and held by one slice at a time; `None` when that
    /// chunk went back to the system.
    pub(crate) fn carve(
        region: std::sync::Arc<PinnedRegion>,
        owner: std::sync::Arc<dyn SliceOwner>,
        offset: usize,
        len: usize,
    ) -> Option<PinnedSlice> {
        debug_assert!(offset + len <= region.len());
        let chunk = region.chunk_of(offset);
        region.live[chunk]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n != RELEASED).then_some(n + 1)
            })
            .ok()?;
        Some(PinnedSlice {
            region,
            owner,
            offset,
            len,
            chunk,
            reclaimable: false,
        })
    }

    /// Tells its owner whether the slice holds a droppable copy (`true`) or data (`false`).
    pub fn set_reclaimable(&mut self, on: bool) {
        if self.reclaimable != on {
            self.reclaimable = on;
            let len = self.len as isize;
            self.owner.reclaimable(if on { len } else { -len });
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-byte slice.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// False when it lies in pageable memory.
    pub fn is_pinned(&self) -> bool {
        self.region.pinned
    }

    /// The first byte (for asynchronous copies).
    pub fn as_ptr(&self) -> *const u8 {
        self.region.addr(self.offset)
    }

    /// The first byte, writable (for asynchronous copies).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.region.addr(self.offset)
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the range is in the live region (the Arc), initialized, and this slice's alone.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), self.len) }
    }
}

impl Drop for PinnedSlice {
    fn drop(&mut self) {
        self.set_reclaimable(false);
        // Not alive before its range is free again: the owner may give the chunk back then.
        self.region.live[self.chunk].fetch_sub(1, Ordering::AcqRel);
        self.owner.give_back(&self.region, self.offset, self.len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{SimBackend, SimConfig};

    const MIB: usize = 1 << 20;

    #[test]
    fn a_region_registers_every_chunk_once_faulted_in_and_in_order() {
        let sim = SimBackend::leak(SimConfig::default()).unwrap();
        let before = sim.counts(0).unwrap();
        let region = PinnedRegion::new(sim, 64 * MIB, 2, 2 * MIB).unwrap();
        let counts = sim.counts(0).unwrap().since(&before);
        assert_eq!(counts.pins, 32);
        // The driver would fault an unbacked chunk in under its lock, stalling the process.
        assert_eq!(counts.unbacked_registrations, 0);
        let expected: Vec<_> = (0..32).map(|i| (i * 2 * MIB, 2 * MIB)).collect();
        assert_eq!(region.chunks(), &expected[..]);
    }

    #[test]
    fn a_failed_registration_returns_and_leaves_nothing_pinned() {
        let sim = SimBackend::leak(SimConfig::default()).unwrap();
        // The fourth chunk's registration fails: the call returns (the faulting thread, up to
        // two chunks ahead, is stopped rather than left waiting).
        sim.fail_nth_pin(4);
        let err = PinnedRegion::new(sim, 128 * MIB, 2, 2 * MIB).unwrap_err();
        assert!(err.to_string().contains("injected failure"), "{err}");
        // The three chunks registered were unregistered with the region.
        assert_eq!(sim.counts(0).unwrap().pins, 4);
        assert_eq!(sim.pinned_host_bytes(), 0);
    }

    #[test]
    fn dropping_a_region_leaves_what_was_mapped_where_a_released_chunk_was() {
        let sim = SimBackend::leak(SimConfig::default()).unwrap();
        let region = PinnedRegion::new(sim, 8 * MIB, 1, 2 * MIB).unwrap();
        assert_eq!(region.chunks().len(), 4);
        let (o, l) = region.chunks()[1];
        let at = region.addr(o);
        assert!(region.release_chunk(1));
        // The kernel may reuse a released chunk's addresses; map something there on purpose.
        // SAFETY: a new private anonymous mapping; MAP_FIXED_NOREPLACE replaces nothing.
        let other = unsafe {
            libc::mmap(
                at.cast(),
                l,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        assert_eq!(other, at.cast(), "the released chunk's addresses were free");
        // SAFETY: `other` is the mapping just made, `l` bytes long.
        unsafe { std::ptr::write_bytes(other.cast::<u8>(), 0xAB, l) };
        drop(region);
        // Still mapped (msync fails with ENOMEM on addresses nothing maps), bytes intact.
        // SAFETY: msync only looks at the range; `other` is ours.
        assert_eq!(unsafe { libc::msync(other, l, libc::MS_ASYNC) }, 0);
        // SAFETY: still mapped (checked above) and `l` bytes long.
        let kept = unsafe { std::slice::from_raw_parts(other.cast::<u8>(), l) };
        assert!(kept.iter().all(|&b| b == 0xAB));
        // SAFETY: the mapping made above; nothing refers to it after this.
        assert_eq!(unsafe { libc::munmap(other, l) }, 0);
    }
}
