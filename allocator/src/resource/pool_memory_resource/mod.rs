//! [`PoolMemoryResource`]: a stream-ordered, coalescing, multi-thread-scalable pool
//! sub-allocator over any upstream resource (RMM's `pool_memory_resource`, rebuilt for
//! many workers).
//!
//! # Design
//! * Memory comes from the upstream in large *chunks* (the initial size, then growth by what
//!   requests need, falling back to smaller tries when the upstream refuses).
//! * Each stream has an *arena* that owns the ranges granted to it: a TLSF heap for requests
//!   above 1 MiB and one for small requests (so small objects never fragment large regions).
//!   Blocks split on allocation and merge with free neighbours on free, in O(1).
//! * A thread finds its stream's arena in a thread-local cache; workers on their own streams
//!   never share a lock, a cache line or a driver call on the fast path. Threads sharing one
//!   stream get one arena each (up to 16 per stream): the stream's work is ordered, so any of
//!   its arenas may serve it, and a block freed by another thread of the same stream goes
//!   straight back to its owner.
//! * Each arena keeps its four most recently freed blocks (up to 16 MiB each) whole, for the
//!   next request of the same size on its stream (a thread cache, as in tcmalloc): a thread
//!   that frees and allocates one size again and again costs a lookup, not a split and a
//!   merge. Cached blocks go back to their heap when it cannot serve a request, and from
//!   every arena on `trim`, `release`, `synchronize` and before the pool grows or fails
//!   for lack of memory.
//! * Stream order: a block freed on the stream that owns it is reusable by that stream at
//!   once. A block freed on another stream waits for an event recorded on the freeing stream.
//!   Memory moves between streams only through the pool's slow path, after the giving
//!   stream's queued work has completed.
//! * A request an arena cannot serve takes, in order: the pool's free space; every arena's
//!   idle memory (whole free regions, cached blocks, settled cross-stream frees, after the
//!   owning stream's queued work); growth by the request's need rounded up to the growth
//!   step (`pool.growth`, 1 GiB by default), never past the maximum; one large enough free
//!   block of some arena; every arena's free blocks, merged across arenas; entirely free
//!   chunks given back and growth again (see `growth.rs`). Only then does it fail, with the
//!   pool's figures and what to try in the error (see `oom_report.rs`).

mod arena;
mod bins;
mod block_cache;
mod chunks;
mod global;
mod growth;
mod handover;
mod oom_report;
mod ptr_map;
mod reclaim;
mod tlsf;
mod vmm;

use std::any::Any;
use std::sync::Arc;

use parking_lot::Mutex;

use self::arena::{Arena, SMALL_LIMIT};
use self::bins::BIN_LIMIT;
use self::chunks::ChunkSource;
pub use self::chunks::VirtualMemory;
use self::global::FreeSpace;
pub use self::growth::DEFAULT_GROWTH;
pub use self::handover::LiveBlock;
pub use self::oom_report::{LISTED_STREAMS, PoolUsage, StreamUsage};
use self::tlsf::GRANULE;
use super::stream_arenas::StreamArenas;
use super::{DeviceMemoryResource, out_of_memory};
use crate::adaptor::hooks;
use crate::backend::{DevicePtr, MemInfo};
use crate::device::Device;
use crate::error::{Error, Result, fmt_bytes};
use crate::resource::SharedResource;
use crate::stream::StreamView;

/// A size given in bytes or as a fraction of the device's total memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PoolSize {
    /// Exactly this many bytes (rounded to 256).
    Bytes(usize),
    /// This fraction (0, 1] of the device's total memory.
    Fraction(f64),
}

impl PoolSize {
    /// The size in bytes on a device of `total` bytes, rounded down to 256 bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when a fraction is not in (0, 1];
    /// `what` names the setting in the error.
    pub fn resolve(self, total: usize, what: &'static str) -> Result<u64> {
        let bytes = match self {
            PoolSize::Bytes(b) => b as u64,
            PoolSize::Fraction(f) if f > 0.0 && f <= 1.0 => (total as f64 * f) as u64,
            PoolSize::Fraction(f) => {
                return Err(Error::invalid_argument(
                    what,
                    f,
                    "a fraction in (0, 1] of device memory",
                ));
            }
        };
        Ok(bytes / GRANULE * GRANULE)
    }
}

/// Smallest range granted to an arena for large requests.
const LARGE_GRANT: u64 = 64 << 20;
/// Range granted to an arena for small requests.
const SMALL_GRANT: u64 = 16 << 20;

/// Builds a [`PoolMemoryResource`].
#[derive(Debug, Clone)]
pub struct PoolBuilder {
    upstream: SharedResource,
    initial: Option<PoolSize>,
    maximum: Option<PoolSize>,
    growth: u64,
    donor: Option<Arc<PoolMemoryResource>>,
    live: Vec<LiveBlock>,
    provisional: bool,
    virtual_memory: VirtualMemory,
}

impl PoolBuilder {
    /// Whether chunks are mapped through CUDA's virtual memory API (default
    /// [`VirtualMemory::Auto`]: over a [`CudaMemoryResource`](crate::resource::CudaMemoryResource)
    /// on a device that supports it, with a maximum size of at least 64 granules). Mapped
    /// chunks lie side by side in one address range per device, so free space stays in one
    /// piece across growth and entirely free chunks go back to the device one by one; sizes
    /// are then multiples of the device's granularity (2 MiB on current GPUs).
    pub fn virtual_memory(mut self, mode: VirtualMemory) -> Self {
        self.virtual_memory = mode;
        self
    }

    /// Memory taken from the upstream at construction (default: half of the device's free
    /// memory, as RMM's Python `reinitialize` does). `Bytes(0)` starts empty.
    pub fn initial_size(mut self, size: PoolSize) -> Self {
        self.initial = Some(size);
        self
    }

    /// The most memory the pool may hold (default: the device's total memory).
    pub fn maximum_size(mut self, size: PoolSize) -> Self {
        self.maximum = Some(size);
        self
    }

    /// The growth step (default [`DEFAULT_GROWTH`], 1 GiB): when nothing the pool holds can
    /// serve a request, it grows by what the request needs rounded up to a multiple of this,
    /// never past the maximum size. Smaller steps keep the pool closer to what is in use at
    /// the price of more upstream allocations; 0 is refused by [`PoolBuilder::build`].
    pub fn growth(mut self, bytes: u64) -> Self {
        self.growth = bytes;
        self
    }

    /// Takes the initial memory from `donor`'s entirely free upstream chunks where it can,
    /// instead of from the upstream: a pool replacing another one of the same device (a
    /// `reinitialize` from pool to pool) then makes no driver call for the memory both want.
    /// Chunks move only when `donor`'s upstream and this one can free each other's memory
    /// ([`DeviceMemoryResource::is_equal`]), and only as many as fit in the initial size;
    /// the donor keeps working and grows again on demand.
    pub fn adopt_from(mut self, donor: Arc<PoolMemoryResource>) -> Self {
        self.donor = Some(donor);
        self
    }

    /// With [`PoolBuilder::adopt_from`]: also takes over these live allocations of the donor
    /// with the chunks that hold them, data in place, as allocations of the new pool (freed
    /// to it, on their stream). A block moves only when every chunk it lies in holds nothing
    /// else live and fits in the initial size (chunks holding blocks go first); blocks of 64
    /// KiB or less never move (they share slabs). [`PoolMemoryResource::adopted_blocks`]
    /// lists those that moved; the others stay the donor's. The caller must not free a moved
    /// block to the donor.
    pub fn adopt_live(mut self, blocks: Vec<LiveBlock>) -> Self {
        self.live = blocks;
        self
    }

    /// With [`PoolBuilder::adopt_from`]: what the pool takes over stays the donor's to take
    /// back until [`PoolMemoryResource::commit_adoption`]; dropping the pool before that gives
    /// the chunks and live blocks back to the donor, data in place, instead of to the
    /// upstream. Commit once the pool is in service; until then, allocate nothing from it.
    pub fn adopt_provisionally(mut self) -> Self {
        self.provisional = true;
        self
    }

    /// Takes the initial memory and builds the pool.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when a size is an invalid
    /// fraction, the initial size exceeds the maximum, or the growth is zero;
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when the upstream cannot provide the
    /// initial memory; [`Error::Driver`](crate::Error::Driver) when the device cannot report its
    /// memory.
    pub fn build(self) -> Result<PoolMemoryResource> {
        let device = self.upstream.device();
        let info = device.mem_info()?;
        let maximum = match self.maximum {
            Some(m) => m.resolve(info.total, "maximum_size")?,
            None => info.total as u64 / GRANULE * GRANULE,
        };
        let initial = match self.initial {
            Some(s) => s.resolve(info.total, "initial_size")?,
            None => (info.free as u64 / 2 / GRANULE * GRANULE).min(maximum),
        };
        if initial > maximum {
            return Err(Error::invalid_argument(
                "initial_size",
                fmt_bytes(initial as usize),
                format!("at most the maximum size {}", fmt_bytes(maximum as usize)),
            ));
        }
        if self.growth == 0 {
            return Err(Error::invalid_argument(
                "pool growth",
                "0 B",
                "a growth step of at least 256 bytes, e.g. 1 GiB (pool.growth)",
            ));
        }
        let growth = self.growth.next_multiple_of(GRANULE);
        let mut mode = self.virtual_memory;
        // A pool too small for whole granules is better served by the upstream.
        if mode == VirtualMemory::Auto && maximum < vmm::AUTO_MINIMUM {
            mode = VirtualMemory::Off;
        }
        // A pool that takes a large initial size at once (RMM's `initial_pool_size` use) is
        // built faster from the upstream: mapping physical memory is paid for up front, per
        // byte, where one `cuMemAlloc` reserves lazily. Virtual memory serves the pools that
        // start small and grow on demand (and give memory back in pieces).
        if mode == VirtualMemory::Auto && initial > vmm::AUTO_MAXIMUM_INITIAL {
            mode = VirtualMemory::Off;
        }
        let source = ChunkSource::choose(mode, &self.upstream)?;
        let (maximum, initial) = match &source {
            ChunkSource::Mapped(space) => {
                let g = space.granularity();
                let rounded = maximum / g * g;
                if rounded == 0 {
                    return Err(Error::invalid_argument(
                        "maximum_size",
                        fmt_bytes(maximum as usize),
                        format!(
                            "at least the device's allocation granularity ({}) with virtual memory",
                            fmt_bytes(g as usize)
                        ),
                    ));
                }
                (rounded, initial.next_multiple_of(g).min(rounded))
            }
            _ => (maximum, initial),
        };
        let mut pool = PoolMemoryResource {
            upstream: self.upstream,
            device,
            maximum,
            growth,
            arenas: StreamArenas::new(),
            global: Mutex::new(source.free_space()),
            source,
            adopted: Vec::new(),
            pending: Mutex::new(None),
        };
        let donor = self.donor.filter(|d| {
            d.device == device
                && d.source.can_swap(&d.upstream, &pool.source, &pool.upstream)
                && initial > 0
        });
        let adopted = pool.take_over(donor, &self.live, initial, self.provisional)?;
        tracing::debug!(
            device = device.ordinal(),
            initial,
            adopted,
            adopted_blocks = pool.adopted.len(),
            maximum,
            growth,
            upstream = pool.upstream.name(),
            chunks = pool.chunk_source(),
            "pool created"
        );
        Ok(pool)
    }
}

/// Figures of a pool at one moment, with the result of its structural checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolSnapshot {
    /// Bytes held from the upstream.
    pub pool_size: u64,
    /// Bytes handed out and not freed.
    pub in_use: u64,
    /// Bytes free in the pool (arenas and unassigned), `cached` included.
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
    /// True when nothing is in use or cached and every granted region is one free block
    /// (empty bin slabs and cached blocks go back to their heap in
    /// [`PoolMemoryResource::synchronize`]).
    pub fully_coalesced: bool,
}

impl PoolSnapshot {
    /// Bytes reserved from the upstream (the pool's size).
    pub fn reserved(&self) -> u64 {
        self.pool_size
    }

    /// 1 − largest free block / free bytes: 0 when the free memory is one block, toward 1
    /// when it is in many small pieces (0 when nothing is free).
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
        f.debug_struct("PoolMemoryResource")
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
        PoolBuilder {
            upstream,
            initial: None,
            maximum: None,
            growth: DEFAULT_GROWTH,
            donor: None,
            live: Vec::new(),
            provisional: false,
            virtual_memory: VirtualMemory::default(),
        }
    }

    /// A pool over `upstream` with the given initial and maximum sizes in bytes.
    ///
    /// # Errors
    /// As [`PoolBuilder::build`]: [`Error::InvalidArgument`](crate::Error::InvalidArgument) when
    /// `initial` exceeds `maximum`, [`Error::OutOfMemory`](crate::Error::OutOfMemory) when the
    /// upstream cannot provide the initial memory.
    pub fn new(upstream: SharedResource, initial: usize, maximum: Option<usize>) -> Result<Self> {
        let mut b = Self::builder(upstream).initial_size(PoolSize::Bytes(initial));
        if let Some(m) = maximum {
            b = b.maximum_size(PoolSize::Bytes(m));
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

    /// Bytes currently held from the upstream.
    pub fn pool_size(&self) -> u64 {
        self.global.lock().pool_size()
    }

    /// This pool as the source of hook events.
    fn hook_source(&self) -> hooks::Source {
        hooks::Source::of(self, self.device.ordinal(), "PoolMemoryResource")
    }

    #[inline]
    fn arena(&self, stream: StreamView) -> Result<&Arena> {
        self.arenas.get(stream.raw(), || Arena::new(stream.raw()))
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
        let backend = self.device.backend();
        let dev = self.device.ordinal();
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
        // A grant can be raced away by nothing (the arena is this stream's), but the slow path
        // of another thread on the same stream may use it first: try a few times.
        for _ in 0..4 {
            match self.grant(need, want, stream)? {
                Some((addr, len)) => {
                    let mut st = arena.state.lock();
                    st.add_grant(size, addr, len);
                    if let Some(addr) = st.try_alloc(size) {
                        return Ok(DevicePtr(addr));
                    }
                }
                None => break,
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
        Err(out_of_memory(
            self.device,
            bytes,
            "PoolMemoryResource",
            Some(usage),
        ))
    }

    /// Waits for every block freed on a foreign stream and returns it to its arena, and gives
    /// every arena's cached blocks back to its heaps, so that
    /// [`PoolMemoryResource::validate`] sees the pool as it is once all streams are idle.
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) when waiting for a foreign stream fails.
    pub fn synchronize(&self) -> Result<()> {
        for arena in self.arenas.all() {
            self.settle_idle(arena)?;
        }
        Ok(())
    }

    /// Gives unused memory back to the upstream until the pool holds at most `to_bytes`
    /// (never less than what is in use). Returns the bytes released.
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) when waiting for pending frees fails, or the
    /// upstream ([`Error::InvalidPointer`](crate::Error::InvalidPointer)) rejects a chunk given
    /// back.
    pub fn trim(&self, to_bytes: u64) -> Result<u64> {
        let _span =
            tracing::debug_span!("pool trim", device = self.device.ordinal(), to_bytes).entered();
        let mut g = self.global.lock();
        self.reclaim(&mut g)?;
        let freed = g.take_free_chunks(to_bytes);
        let mut released = 0;
        for (addr, size) in freed {
            self.return_chunk(addr, size)?;
            released += size;
        }
        tracing::debug!(
            device = self.device.ordinal(),
            released,
            pool_size = g.pool_size(),
            "pool trimmed"
        );
        Ok(released)
    }

    /// Removes entirely free chunks adding up to at most `budget` bytes (after waiting for
    /// the streams that freed into them) and hands them over to an adopting pool.
    fn give_chunks(&self, budget: u64) -> Result<Vec<(u64, u64)>> {
        let mut g = self.global.lock();
        self.reclaim(&mut g)?;
        let chunks = g.adoptable_chunks(budget);
        Ok(g.take_chunks(&chunks))
    }

    /// Gives back to the upstream every unused chunk except those a pool of initial size
    /// `budget` would adopt from this one ([`PoolBuilder::adopt_from`]): the step before a
    /// replacement pool is built, so that the device has room for what it must allocate
    /// anew while the memory it can take over stays. Returns the bytes released.
    ///
    /// # Errors
    /// As [`PoolMemoryResource::trim`]: [`Error::Driver`](crate::Error::Driver) or the upstream's
    /// error when giving a chunk back fails.
    pub fn release_except_adoptable(&self, budget: u64) -> Result<u64> {
        let mut g = self.global.lock();
        self.reclaim(&mut g)?;
        let keep = g.adoptable_chunks(budget);
        let mut released = 0;
        for (addr, size) in g.take_free_chunks_except(&keep) {
            self.return_chunk(addr, size)?;
            released += size;
        }
        Ok(released)
    }

    /// Gives every unused chunk back to the upstream. Returns the bytes released.
    ///
    /// # Errors
    /// As [`PoolMemoryResource::trim`]: [`Error::Driver`](crate::Error::Driver) or the upstream's
    /// error when giving a chunk back fails.
    pub fn release(&self) -> Result<u64> {
        self.trim(0)
    }

    fn snapshot_figures(&self) -> PoolSnapshot {
        let g = self.global.lock();
        let mut s = PoolSnapshot {
            pool_size: g.pool_size(),
            free: g.free_bytes(),
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

    /// Checks the pool's structure and accounting: every heap's lists and bitmaps, the
    /// cached blocks, live blocks aligned to 256 bytes and disjoint, and pool size = in use +
    /// pending + free. Takes every lock in turn: for tests and diagnostics, not for hot
    /// paths. Cached blocks are checked, not flushed: [`PoolMemoryResource::synchronize`]
    /// flushes them.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) (`pool state`) naming the first
    /// inconsistency found; it means a bug in rmm-rs.
    pub fn validate(&self) -> Result<PoolSnapshot> {
        let fail = |what: String| {
            Error::invalid_argument(
                "pool state",
                what,
                "a consistent pool (this is a bug in rmm-rs)",
            )
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
        if g.pool_size() != g.free_bytes() + granted {
            return Err(fail(format!(
                "pool size {} != unassigned {} + granted {}",
                g.pool_size(),
                g.free_bytes(),
                granted
            )));
        }
        live.sort_unstable();
        for &(addr, size) in &live {
            if addr % GRANULE != 0 || size % GRANULE != 0 {
                return Err(fail(format!(
                    "live block {addr:#x}+{size} is not 256-byte aligned"
                )));
            }
            // Inside one chunk, or (mapped side by side) chunks that follow each other.
            let mut at = addr;
            while let Some((c, cs)) = g.chunk_of(at).filter(|_| at < addr + size) {
                at = c + cs;
                if !self.uses_virtual_memory() {
                    break;
                }
            }
            let inside = at >= addr + size;
            if !inside {
                return Err(fail(format!(
                    "live block {addr:#x}+{size} lies outside every chunk"
                )));
            }
        }
        for w in live.windows(2) {
            if w[0].0 + w[0].1 > w[1].0 {
                return Err(fail(format!(
                    "live blocks {:#x}+{} and {:#x} overlap",
                    w[0].0, w[0].1, w[1].0
                )));
            }
        }
        drop(g);
        Ok(self.snapshot_figures())
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
        let Some(size) = (bytes as u64).checked_next_multiple_of(GRANULE) else {
            return Err(out_of_memory(
                self.device,
                bytes,
                "PoolMemoryResource",
                None,
            ));
        };
        let arena = self.arena(stream)?;
        if let Some(addr) = arena.state.lock().try_alloc(size) {
            return Ok(DevicePtr(addr));
        }
        if size > self.maximum {
            return Err(out_of_memory(
                self.device,
                bytes,
                "PoolMemoryResource",
                Some(self.usage()),
            ));
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
        let arena = self.arena(stream)?;
        if arena.state.lock().free_local(ptr.addr()) {
            return Ok(());
        }
        self.deallocate_foreign(ptr, bytes, stream)
    }

    fn device(&self) -> Device {
        self.device
    }

    fn name(&self) -> &'static str {
        "PoolMemoryResource"
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

impl PoolMemoryResource {
    /// A block this thread's arena of `stream` does not own: another thread's arena of the
    /// same stream (freed at once: the stream's work is ordered), or another stream's (reused
    /// once an event recorded on `stream` has completed).
    #[cold]
    #[inline(never)]
    fn deallocate_foreign(&self, ptr: DevicePtr, bytes: usize, stream: StreamView) -> Result<()> {
        let backend = self.device.backend();
        let dev = self.device.ordinal();
        for arena in self.arenas.all() {
            if arena.stream == stream.raw() && arena.state.lock().free_local(ptr.addr()) {
                return Ok(());
            }
        }
        for arena in self.arenas.all() {
            if arena.stream == stream.raw() {
                continue;
            }
            let mut st = arena.state.lock();
            if st.free_deferred(backend, dev, ptr.addr(), stream.raw())? {
                return Ok(());
            }
        }
        Err(Error::InvalidPointer {
            ptr: ptr.addr(),
            bytes,
            resource: "PoolMemoryResource",
        })
    }
}

impl Drop for PoolMemoryResource {
    fn drop(&mut self) {
        let backend = self.device.backend();
        let dev = self.device.ordinal();
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
        let mut g = self.global.lock();
        if let Some(p) = pending {
            p.give_back(&mut g);
        }
        let chunks: Vec<(u64, u64)> = g.chunks().collect();
        drop(g);
        for (addr, size) in chunks {
            if let Err(e) = self.return_chunk(addr, size) {
                tracing::error!(
                    "returning a pool chunk of {size} bytes at {addr:#x} upstream: {e}"
                );
            }
        }
    }
}
