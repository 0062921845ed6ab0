//! [`PoolMemoryResource`]: a stream-ordered, coalescing pool sub-allocator over any upstream
//! resource, scaling across many threads (RMM's `pool_memory_resource`, rebuilt for many workers).
//!
//! # Design
//! Memory comes from the upstream in large *chunks* (`chunks.rs`, `vmm.rs`). Each stream has an
//! *arena* (`arena.rs`) owning the ranges granted to it: TLSF heaps for small and large requests,
//! size-class bins up to 64 KiB, and a cache of its latest freed blocks (`block_cache.rs`).
//! Threads find their stream's arena without a shared lock (`stream_arenas.rs`); threads of one
//! stream get an arena each (up to 16), except for blocks over 16 MiB, which one arena of the
//! stream serves so that one thread's freed large blocks serve another's.
//!
//! A block freed on its owning stream is reusable by that stream at once; one freed on another
//! stream once an event recorded there completes. Memory moves between streams only through the
//! slow path (`growth.rs`, `reclaim.rs`); failing that, the error explains the pool's state
//! (`oom_report.rs`).

mod arena;
mod bins;
mod block_cache;
mod builder;
mod chunks;
mod footprint;
mod global;
mod growth;
mod handover;
mod oom_report;
mod ptr_map;
mod reclaim;
mod tlsf;
mod vmm;

use std::any::Any;

use parking_lot::Mutex;

use self::arena::{Arena, SMALL_LIMIT};
use self::bins::BIN_LIMIT;
pub use self::builder::{PoolBuilder, default_initial_size};
use self::chunks::ChunkSource;
pub use self::chunks::VirtualMemory;
use self::global::FreeSpace;
pub use self::growth::DEFAULT_GROWTH;
pub use self::handover::LiveBlock;
use self::tlsf::GRANULE;
use super::stream_arenas::{self, StreamArenas};
use super::{DeviceMemoryResource, out_of_memory};
use crate::adaptor::hooks;
use crate::backend::{DevicePtr, MemInfo};
use crate::device::Device;
use crate::error::{Error, Result};
pub use crate::pool_usage::{LISTED_STREAMS, PoolUsage, StreamUsage};
use crate::resource::SharedResource;
use crate::stream_view::StreamView;

/// Blocks above this (the largest an arena caches) come from the arena a stream's threads share,
/// so that one thread's freed large blocks serve another's; they are few, so the lock costs little.
const SHARED_ABOVE: u64 = block_cache::MAX_BLOCK;

/// Smallest range granted to an arena for large requests.
const LARGE_GRANT: u64 = 64 << 20;
/// Range granted to an arena for small requests.
const SMALL_GRANT: u64 = 16 << 20;

const NAME: &str = "PoolMemoryResource";

/// Figures of a pool at one moment, with the result of its structural checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolSnapshot {
    /// Bytes held from the upstream.
    pub pool_size: u64,
    /// Bytes handed out and not freed.
    pub in_use: u64,
    /// Bytes free in the pool (arenas and unassigned), cached ones included.
    pub free: u64,
    /// Bytes of freed blocks the arenas' caches keep whole for their next requests.
    pub cached: u64,
    /// Bytes freed on a stream other than their arena's, waiting for that stream.
    pub pending: u64,
    /// The largest free block.
    pub largest_free: u64,
    /// Upstream chunks.
    pub chunks: usize,
    /// Arenas (one per stream and thread lane).
    pub arenas: usize,
    /// Live blocks.
    pub live_blocks: usize,
    /// Free blocks in arenas plus free ranges not granted to any arena.
    pub free_blocks: usize,
    /// True when nothing is in use or cached and every granted region is one free block.
    pub fully_coalesced: bool,
}

impl PoolSnapshot {
    /// 1 − largest free / free bytes: 0 for one free block (or none), near 1 for many small pieces.
    pub fn fragmentation(&self) -> f64 {
        oom_report::fragmentation(self.largest_free, self.free)
    }
}

/// The pool. See the module documentation for the design.
pub struct PoolMemoryResource {
    upstream: SharedResource,
    device: Device,
    maximum: u64,
    /// The growth step in bytes (a multiple of 256).
    growth: u64,
    /// Chunk size of a mapped pool (the growth step, or smaller with a footprint limit).
    chunk: u64,
    /// The most the pool holds beyond its peak in use ([`PoolBuilder::max_overhead`]).
    footprint: Option<footprint::FootprintLimit>,
    arenas: StreamArenas<Arena>,
    global: Mutex<FreeSpace>,
    /// Where chunks come from and go back to.
    source: ChunkSource,
    /// Live blocks taken over from the pool this one replaced.
    adopted: Vec<LiveBlock>,
    /// A provisional hand-over, until committed.
    pending: Mutex<Option<Box<handover::Pending>>>,
}

impl std::fmt::Debug for PoolMemoryResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(NAME)
            .field("device", &self.device)
            .field("upstream", &self.upstream.name())
            .field("maximum", &self.maximum)
            .field("chunks", &self.chunk_source())
            .finish_non_exhaustive()
    }
}

impl PoolMemoryResource {
    /// A builder over `upstream`.
    pub fn builder(upstream: SharedResource) -> PoolBuilder {
        PoolBuilder::over(upstream)
    }

    /// A pool over `upstream` with the given initial and maximum sizes in bytes.
    ///
    /// # Errors
    /// As [`PoolBuilder::build`].
    pub fn new(upstream: SharedResource, initial: usize, maximum: Option<usize>) -> Result<Self> {
        let mut b = Self::builder(upstream).initial_size(initial as u64);
        if let Some(m) = maximum {
            b = b.maximum_size(m as u64);
        }
        b.build()
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &SharedResource {
        &self.upstream
    }

    /// The maximum size in bytes.
    pub fn maximum_size(&self) -> u64 {
        self.maximum
    }

    /// The growth step in bytes ([`PoolBuilder::growth`]).
    pub fn growth(&self) -> u64 {
        self.growth
    }

    /// Allowed holding above peak in use, as a fraction of it ([`PoolBuilder::max_overhead`]).
    pub fn max_overhead(&self) -> Option<f64> {
        self.footprint.as_ref().map(|f| f.overhead)
    }

    /// Bytes currently held from the upstream.
    pub fn pool_size(&self) -> u64 {
        self.global.lock().pool_size
    }

    /// The most [`pool_size`](Self::pool_size) reached since creation or the last reset.
    pub fn peak_pool_size(&self) -> u64 {
        self.global.lock().peak_pool_size()
    }

    /// Makes the peak pool size the size now (PyTorch's `reset_peak_memory_stats`).
    pub fn reset_peak_pool_size(&self) {
        self.global.lock().reset_peak();
    }

    /// This pool as the source of hook events.
    fn hook_source(&self) -> hooks::Source {
        hooks::Source::of(self, self.device.ordinal(), NAME)
    }

    #[inline]
    fn arena(&self, stream: StreamView) -> Result<&Arena> {
        self.arenas.get(stream.raw(), || Arena::new(stream.raw()))
    }

    /// The arena for `size` on `stream`: the thread's own, or the shared one for large sizes.
    #[inline]
    fn arena_for(&self, size: u64, stream: StreamView) -> Result<&Arena> {
        if size > SHARED_ABOVE {
            self.arenas
                .shared(stream.raw(), || Arena::new(stream.raw()))
        } else {
            self.arena(stream)
        }
    }

    /// Where regions around granted `[addr, addr + len)` may join: its chunk, or all mapped memory.
    fn contiguous_around(&self, addr: u64, len: u64) -> (u64, u64) {
        let g = self.global.lock();
        if g.merge_across_chunks {
            return (0, u64::MAX);
        }
        g.chunk_of(addr)
            .map_or((addr, addr + len), |(start, size)| (start, start + size))
    }

    #[cold]
    #[inline(never)]
    fn allocate_slow(
        &self,
        arena: &Arena,
        size: u64,
        bytes: usize,
        stream: StreamView,
    ) -> Result<DevicePtr> {
        let (backend, dev) = (self.device.backend(), self.device.ordinal());
        {
            let mut st = arena.state.lock();
            if st.has_pending() {
                st.settle_pending(backend, dev, false)?;
                if let Some(addr) = st.try_alloc(size) {
                    return Ok(DevicePtr(addr));
                }
            }
        }
        let (need, want) = if size <= BIN_LIMIT {
            (bins::class_of(size).1, SMALL_GRANT)
        } else if size <= SMALL_LIMIT {
            (size, SMALL_GRANT)
        } else {
            (size, size.max(LARGE_GRANT))
        };
        // Another thread of this stream may take the grant first: try a few times.
        for _ in 0..4 {
            let Some((addr, len)) = self.grant(need, want, stream)? else {
                break;
            };
            let within = self.contiguous_around(addr, len);
            let mut st = arena.state.lock();
            st.add_grant(size, addr, len, within);
            if let Some(addr) = st.try_alloc(size) {
                return Ok(DevicePtr(addr));
            }
        }
        let usage = self.usage();
        tracing::warn!(
            device = dev,
            requested = bytes,
            pool_size = usage.pool_size,
            in_use = usage.in_use,
            free = usage.free,
            largest_free = usage.largest_free,
            cached = usage.cached,
            arenas = usage.arenas,
            "pool out of memory"
        );
        Err(out_of_memory(self.device, bytes, NAME, Some(usage)))
    }

    /// Settles cross-stream frees (after those streams' work) and flushes cached blocks, as if
    /// every stream were idle.
    ///
    /// # Errors
    /// [`Error::Driver`] when waiting for a foreign stream fails.
    pub fn synchronize(&self) -> Result<()> {
        for arena in self.arenas.all() {
            self.settle_idle(arena)?;
        }
        Ok(())
    }

    /// Gives unused memory back to the upstream until the pool holds at most `to_bytes` (never
    /// below in use); returns the bytes released.
    ///
    /// # Errors
    /// [`Error::Driver`] waiting for pending frees, or the upstream's error returning a chunk.
    pub fn trim(&self, to_bytes: u64) -> Result<u64> {
        let _span =
            tracing::debug_span!("pool trim", device = self.device.ordinal(), to_bytes).entered();
        let mut g = self.global.lock();
        self.reclaim(&mut g)?;
        let freed = g.take_free_chunks(to_bytes, None);
        let released = self.return_chunks(&mut g, &freed)?;
        tracing::debug!(
            device = self.device.ordinal(),
            released,
            pool_size = g.pool_size,
            "pool trimmed"
        );
        Ok(released)
    }

    /// Removes free chunks up to `budget` bytes (after their freeing streams) for an adopting pool.
    fn give_chunks(&self, budget: u64) -> Result<Vec<(u64, u64)>> {
        let mut g = self.global.lock();
        self.reclaim(&mut g)?;
        let chunks = g.adoptable_chunks(budget);
        Ok(g.take_chunks(&chunks))
    }

    /// Gives back every unused chunk except those a replacement pool of initial size `budget` would
    /// adopt ([`PoolBuilder::adopt_from`]); returns the bytes released.
    ///
    /// # Errors
    /// As [`PoolMemoryResource::trim`].
    pub fn release_except_adoptable(&self, budget: u64) -> Result<u64> {
        let mut g = self.global.lock();
        self.reclaim(&mut g)?;
        let keep = g.adoptable_chunks(budget);
        let freed = g.take_free_chunks_except(&keep);
        self.return_chunks(&mut g, &freed)
    }

    /// Gives every unused chunk back to the upstream; returns the bytes released.
    ///
    /// # Errors
    /// As [`PoolMemoryResource::trim`].
    pub fn release(&self) -> Result<u64> {
        self.trim(0)
    }

    fn snapshot_figures(&self) -> PoolSnapshot {
        let g = self.global.lock();
        let mut s = PoolSnapshot {
            pool_size: g.pool_size,
            free: g.free_bytes,
            largest_free: g.largest_free(),
            chunks: g.chunk_count(),
            free_blocks: g.fragments(),
            fully_coalesced: true,
            ..PoolSnapshot::default()
        };
        for arena in self.arenas.all() {
            let f = arena.state.lock().figures();
            s.arenas += 1;
            s.in_use += f.in_use;
            s.free += f.free_bytes;
            s.cached += f.cached_bytes;
            s.pending += f.pending_bytes;
            s.largest_free = s.largest_free.max(f.largest_free);
            s.live_blocks += f.live_blocks;
            s.free_blocks += f.free_blocks;
            s.fully_coalesced &= f.free_blocks == f.regions;
        }
        s.fully_coalesced &= s.in_use == 0 && s.cached == 0 && s.pending == 0;
        s
    }

    /// Checks structure and accounting (heaps, cached blocks, live blocks 256-aligned and disjoint,
    /// pool size = in use + pending + free). Takes every lock in turn: for tests and diagnostics.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (`pool state`) naming the first inconsistency (a bug in rmm-rs).
    pub fn validate(&self) -> Result<PoolSnapshot> {
        let fail = |what: String| {
            let expected = "a consistent pool (this is a bug in rmm-rs)";
            Error::invalid_argument("pool state", what, expected)
        };
        let g = self.global.lock();
        let mut live: Vec<(u64, u64)> = Vec::new();
        let mut granted = 0u64;
        for arena in self.arenas.all() {
            let st = arena.state.lock();
            st.check().map_err(fail)?;
            let f = st.figures();
            if f.region_bytes != f.free_bytes + f.in_use + f.pending_bytes {
                return Err(fail(format!(
                    "arena of stream {:#x}: regions {} B != free {} + in use {} + pending {}",
                    arena.stream, f.region_bytes, f.free_bytes, f.in_use, f.pending_bytes
                )));
            }
            granted += f.region_bytes;
            live.extend(st.live_blocks());
        }
        let (size, unassigned) = (g.pool_size, g.free_bytes);
        if size != unassigned + granted {
            return Err(fail(format!(
                "pool size {size} != unassigned {unassigned} + granted {granted}"
            )));
        }
        live.sort_unstable();
        for &(addr, size) in &live {
            let block = format!("live block {addr:#x}+{size}");
            if addr % GRANULE != 0 || size % GRANULE != 0 {
                return Err(fail(format!("{block} is not 256-byte aligned")));
            }
            // Inside one chunk, or (mapped side by side) chunks that follow each other.
            let mut at = addr;
            while let Some((c, cs)) = g.chunk_of(at).filter(|_| at < addr + size) {
                at = c + cs;
                if !self.uses_virtual_memory() {
                    break;
                }
            }
            if at < addr + size {
                return Err(fail(format!("{block} lies outside every chunk")));
            }
        }
        for w in live.windows(2) {
            let ((a, s), b) = (w[0], w[1].0);
            if a + s > b {
                return Err(fail(format!("live blocks {a:#x}+{s} and {b:#x} overlap")));
            }
        }
        drop(g);
        Ok(self.snapshot_figures())
    }

    /// A block this thread's arena of `stream` does not own: another lane's of the same stream
    /// (freed at once) or another stream's, such as another thread's per-thread default stream
    /// (reused once an event recorded on `stream` completes).
    #[cold]
    #[inline(never)]
    fn deallocate_foreign(&self, ptr: DevicePtr, bytes: usize, stream: StreamView) -> Result<()> {
        let (backend, dev) = (self.device.backend(), self.device.ordinal());
        let ordered = !stream.is_per_thread();
        for arena in self.arenas.all() {
            if ordered && arena.stream == stream.raw() && arena.state.lock().free_local(ptr.addr())
            {
                return Ok(());
            }
        }
        for arena in self.arenas.all() {
            if ordered && arena.stream == stream.raw() {
                continue;
            }
            let mut st = arena.state.lock();
            if st.free_deferred(backend, dev, ptr.addr(), stream.raw())? {
                return Ok(());
            }
        }
        Err(Error::invalid_pointer(ptr.addr(), bytes, NAME))
    }
}

impl DeviceMemoryResource for PoolMemoryResource {
    #[inline]
    fn allocate(&self, bytes: usize, stream: StreamView) -> Result<DevicePtr> {
        if hooks::active()
            && let Some(r) =
                hooks::dispatch_malloc(self.hook_source(), bytes, GRANULE as usize, stream, || {
                    self.allocate(bytes, stream)
                })
        {
            return r;
        }
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        if stream.is_per_thread() {
            stream_arenas::settle_own_lane(self.device)?;
        }
        let Some(size) = (bytes as u64).checked_next_multiple_of(GRANULE) else {
            return Err(out_of_memory(self.device, bytes, NAME, None));
        };
        let arena = self.arena_for(size, stream)?;
        if let Some(addr) = arena.state.lock().try_alloc(size) {
            return Ok(DevicePtr(addr));
        }
        if size > self.maximum {
            return Err(out_of_memory(self.device, bytes, NAME, Some(self.usage())));
        }
        self.allocate_slow(arena, size, bytes, stream)
    }

    #[inline]
    fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: StreamView) -> Result<()> {
        if hooks::active()
            && let Some(r) = hooks::dispatch_free(
                self.hook_source(),
                ptr,
                bytes,
                GRANULE as usize,
                stream,
                || self.deallocate(ptr, bytes, stream),
            )
        {
            return r;
        }
        if ptr.is_null() {
            return Ok(());
        }
        if stream.is_per_thread() {
            stream_arenas::settle_late_free(self.device)?;
        }
        let size = (bytes as u64).next_multiple_of(GRANULE);
        let arena = self.arena_for(size, stream)?;
        if arena.state.lock().free_local(ptr.addr()) {
            return Ok(());
        }
        self.deallocate_foreign(ptr, bytes, stream)
    }

    fn device(&self) -> Device {
        self.device
    }

    fn name(&self) -> &'static str {
        NAME
    }

    fn memory_info(&self) -> Result<MemInfo> {
        let s = self.snapshot_figures();
        Ok(MemInfo {
            free: (s.free + self.maximum.saturating_sub(s.pool_size)) as usize,
            total: self.maximum as usize,
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn upstream(&self) -> Option<&dyn DeviceMemoryResource> {
        Some(&*self.upstream)
    }
}

impl Drop for PoolMemoryResource {
    fn drop(&mut self) {
        let (backend, dev) = (self.device.backend(), self.device.ordinal());
        let pending = self.pending.get_mut().take();
        let s = self.snapshot_figures();
        if s.in_use > pending.as_ref().map_or(0, |p| p.live_bytes()) {
            tracing::warn!(
                device = dev,
                in_use = s.in_use,
                live_blocks = s.live_blocks,
                "pool dropped with live allocations; their memory is returned to the upstream"
            );
        }
        if let Err(e) = self.device.synchronize() {
            tracing::error!(
                "synchronizing {} before releasing the pool: {e}",
                self.device
            );
        }
        for arena in self.arenas.all() {
            arena.state.lock().destroy_events(backend, dev);
        }
        let g = self.global.get_mut();
        if let Some(p) = pending {
            p.give_back(g);
        }
        let chunks: Vec<(u64, u64)> = g.chunks().collect();
        for (addr, size) in chunks {
            if let Err(e) = self.return_chunk(addr, size) {
                tracing::error!(
                    "returning a pool chunk of {size} bytes at {addr:#x} upstream: {e}"
                );
            }
        }
    }
}
