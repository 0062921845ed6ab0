//! One stream's share of a pool: two TLSF heaps (small and large requests), the live blocks,
//! and blocks freed on other streams that wait for an event before they can be reused.

use crate::backend::{Backend, RawEvent, RawStream};
use crate::error::Result;

use super::bins::{BIN_LIMIT, Bins};
use super::block_cache::{BlockCache, Cached};
use super::ptr_map::PtrMap;
use super::tlsf::Heap;
use crate::sync::SpinLock;

/// Requests up to this size go to the small heap, so they do not fragment large regions.
pub(crate) const SMALL_LIMIT: u64 = 1 << 20;
/// Tag bit of a live block that lives in the small heap.
const SMALL_TAG: u32 = 1 << 31;

/// A block freed on another stream, reusable once `event` (recorded there at the free) completes.
#[derive(Debug)]
struct Pending {
    addr: u64,
    /// The heap tag, or `None` for a block of the bins.
    tag: Option<u32>,
    size: u64,
    event: RawEvent,
}

/// The bookkeeping of one arena; always used under the arena's lock.
#[derive(Debug)]
pub(crate) struct ArenaState {
    bins: Bins,
    small: Heap,
    large: Heap,
    live: PtrMap,
    /// Heap blocks freed here lately, kept whole for the next request of their size.
    cache: BlockCache,
    pending: Vec<Pending>,
    spare_events: Vec<RawEvent>,
    pub(crate) in_use: u64,
    pub(crate) pending_bytes: u64,
}

/// An arena's lock: contention is rare (an arena is one thread lane's) and nothing waits for the
/// device under it. Waiters yield at once: contention means as many threads of one stream as cores.
pub(crate) type ArenaLock<T> = SpinLock<T, 0>;

#[derive(Debug)]
pub(crate) struct Arena {
    pub(crate) stream: RawStream,
    pub(crate) state: ArenaLock<ArenaState>,
}

impl Arena {
    pub(crate) fn new(stream: RawStream) -> Arena {
        Arena {
            stream,
            state: ArenaLock::new(ArenaState {
                bins: Bins::default(),
                small: Heap::new(),
                large: Heap::new(),
                live: PtrMap::with_capacity(4096),
                cache: BlockCache::default(),
                pending: Vec::new(),
                spare_events: Vec::new(),
                in_use: 0,
                pending_bytes: 0,
            }),
        }
    }
}

/// Heap figures of one arena.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ArenaFigures {
    pub(crate) region_bytes: u64,
    pub(crate) free_bytes: u64,
    /// Of `free_bytes`, those in the block cache.
    pub(crate) cached_bytes: u64,
    pub(crate) in_use: u64,
    pub(crate) pending_bytes: u64,
    pub(crate) largest_free: u64,
    pub(crate) regions: usize,
    pub(crate) free_blocks: usize,
    pub(crate) live_blocks: usize,
}

impl ArenaState {
    /// Serves `size` (a multiple of 256) from the arena's heaps, if they can.
    #[inline]
    pub(crate) fn try_alloc(&mut self, size: u64) -> Option<u64> {
        if size <= BIN_LIMIT {
            if let Some((addr, _)) = self.bins.alloc(size, &mut self.small) {
                return Some(addr);
            }
            if self.cache.is_empty() {
                return None;
            }
            // A new slab may fit once the cached small-heap blocks are merged back.
            self.flush_cache();
            return self.bins.alloc(size, &mut self.small).map(|(addr, _)| addr);
        }
        if let Some(b) = self.cache.take(size) {
            self.live.insert(b.addr, b.tag);
            self.in_use += size;
            return Some(b.addr);
        }
        let tag_bit = if size <= SMALL_LIMIT { SMALL_TAG } else { 0 };
        let idx = match self.heap_of(tag_bit).alloc(size) {
            Some(idx) => idx,
            None if !self.cache.is_empty() => {
                // The cached blocks may be what the heap lacks, once merged back.
                self.flush_cache();
                self.heap_of(tag_bit).alloc(size)?
            }
            None => return None,
        };
        let addr = self.heap_of(tag_bit).block(idx).addr;
        self.live.insert(addr, idx | tag_bit);
        self.in_use += size;
        Some(addr)
    }

    /// Gives cached blocks, then empty bin slabs, back to the heaps, before taking memory out.
    fn flush_all(&mut self) {
        self.flush_cache();
        self.bins.release_empty(&mut self.small);
    }

    /// Gives every cached block back to its heap, where it merges with its free neighbours.
    fn flush_cache(&mut self) {
        for b in self.cache.drain() {
            self.heap_of(b.tag).free(b.tag & !SMALL_TAG);
        }
    }

    #[inline]
    fn heap_of(&mut self, tag: u32) -> &mut Heap {
        if tag & SMALL_TAG != 0 {
            &mut self.small
        } else {
            &mut self.large
        }
    }

    fn heap(&self, tag: u32) -> &Heap {
        if tag & SMALL_TAG != 0 {
            &self.small
        } else {
            &self.large
        }
    }

    /// The size of the heap block `tag` names.
    fn block_size(&self, tag: u32) -> u64 {
        self.heap(tag).block(tag & !SMALL_TAG).size
    }

    /// Frees the live block at `addr` (its stream is done with it); false if not this arena's.
    #[inline]
    pub(crate) fn free_local(&mut self, addr: u64) -> bool {
        match self.live.remove(addr) {
            Some(tag) => {
                self.release(tag);
                true
            }
            None => self.bins.free(addr),
        }
    }

    /// Caches a retired live heap block, evicting the oldest (or itself, if too large) to the heap.
    #[inline]
    fn release(&mut self, tag: u32) {
        let idx = tag & !SMALL_TAG;
        let block = *self.heap_of(tag).block(idx);
        self.in_use -= block.size;
        if let Some(out) = self.cache.put(Cached {
            addr: block.addr,
            size: block.size,
            tag,
        }) {
            self.heap_of(out.tag).free(out.tag & !SMALL_TAG);
        }
    }

    /// Retires block `addr` until `stream`'s queued work completes; false if not this arena's.
    pub(crate) fn free_deferred(
        &mut self,
        backend: &dyn Backend,
        dev: u32,
        addr: u64,
        stream: RawStream,
    ) -> Result<bool> {
        let tag = self.live.get(addr);
        let bin_size = tag.map_or_else(|| self.bins.block_size(addr), |_| None);
        if tag.is_none() && bin_size.is_none() {
            return Ok(false);
        }
        let event = match self.spare_events.pop() {
            Some(e) => e,
            None => backend.event_create(dev)?,
        };
        if let Err(e) = backend.event_record(dev, event, stream) {
            self.spare_events.push(event);
            return Err(e);
        }
        let size = match tag {
            Some(tag) => {
                self.live.remove(addr);
                let size = self.block_size(tag);
                self.in_use -= size;
                size
            }
            // A binned block stays marked as handed out until the event completes.
            None => bin_size.unwrap_or(0),
        };
        self.pending_bytes += size;
        self.pending.push(Pending {
            addr,
            tag,
            size,
            event,
        });
        Ok(true)
    }

    /// The pending blocks and their events, to be waited on without the arena's lock.
    pub(crate) fn pending_events(&self) -> Vec<(u64, RawEvent)> {
        self.pending.iter().map(|p| (p.addr, p.event)).collect()
    }

    /// Whether the block at `addr` still waits for `event` (a settled event may be re-recorded for
    /// another free, which need not be waited for).
    pub(crate) fn still_pending(&self, addr: u64, event: RawEvent) -> bool {
        self.pending
            .iter()
            .any(|p| p.addr == addr && p.event == event)
    }

    /// Settles completed cross-stream frees; with `idle` (waited for), also empty slabs, cache.
    pub(crate) fn settle_pending(
        &mut self,
        backend: &dyn Backend,
        dev: u32,
        idle: bool,
    ) -> Result<()> {
        let mut i = 0;
        while i < self.pending.len() {
            let event = self.pending[i].event;
            if backend.event_query(dev, event)? {
                let p = self.pending.swap_remove(i);
                self.pending_bytes -= p.size;
                if let Some(tag) = p.tag {
                    self.in_use += p.size;
                    self.release(tag);
                } else {
                    self.bins.free(p.addr);
                }
                self.spare_events.push(p.event);
            } else {
                i += 1;
            }
        }
        if idle {
            self.bins.release_empty(&mut self.small);
            self.flush_cache();
        }
        Ok(())
    }

    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Adds a granted range to the heap for `size`; large ranges join neighbours within `within`.
    pub(crate) fn add_grant(&mut self, for_size: u64, addr: u64, len: u64, within: (u64, u64)) {
        if for_size <= SMALL_LIMIT {
            self.small.add_region(addr, len);
        } else {
            self.large.add_region_within(addr, len, within.0, within.1);
        }
    }

    /// Adopts `[addr, addr + size)` (another pool's block) as a live block in its own region.
    pub(crate) fn adopt_live(&mut self, addr: u64, size: u64) {
        let tag_bit = if size <= SMALL_LIMIT { SMALL_TAG } else { 0 };
        let idx = self.heap_of(tag_bit).add_live_region(addr, size);
        self.live.insert(addr, idx | tag_bit);
        self.in_use += size;
    }

    /// Removes every region that is entirely free, for the pool to reuse elsewhere.
    pub(crate) fn take_free_regions(&mut self, out: &mut Vec<(u64, u64)>) {
        self.flush_all();
        self.small.take_free_regions(out);
        self.large.take_free_regions(out);
    }

    /// [`ArenaState::take_free_regions`], small- and large-heap regions apart (to give back).
    pub(crate) fn take_free_regions_by_heap(
        &mut self,
        small: &mut Vec<(u64, u64)>,
        large: &mut Vec<(u64, u64)>,
    ) {
        self.flush_all();
        self.small.take_free_regions(small);
        self.large.take_free_regions(large);
    }

    /// Returns regions taken by [`ArenaState::take_free_regions_by_heap`] to their heaps.
    pub(crate) fn give_back_regions(&mut self, small: &[(u64, u64)], large: &[(u64, u64)]) {
        for &(addr, len) in small {
            self.small.add_region(addr, len);
        }
        for &(addr, len) in large {
            self.large.add_region(addr, len);
        }
    }

    /// Takes one free block of at least `size` bytes out of either heap (see [`Heap::steal`]).
    pub(crate) fn steal(&mut self, size: u64) -> Option<(u64, u64)> {
        self.flush_all();
        self.large.steal(size).or_else(|| self.small.steal(size))
    }

    /// All free blocks of both heaps (after flushing cache and slabs), for cross-arena merging.
    pub(crate) fn take_free_blocks(&mut self, out: &mut Vec<(u64, u64)>) {
        self.flush_all();
        self.small.take_free_blocks(out);
        self.large.take_free_blocks(out);
    }

    /// Live blocks as (address, size).
    pub(crate) fn live_blocks(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let binned = self.pending.iter().filter(|p| p.tag.is_none());
        let pending_bins: Vec<u64> = binned.map(|p| p.addr).collect();
        self.live
            .iter()
            .map(|(addr, tag)| (addr, self.block_size(tag)))
            .chain(
                self.bins
                    .live_blocks()
                    .filter(move |(a, _)| !pending_bins.contains(a)),
            )
    }

    pub(crate) fn figures(&self) -> ArenaFigures {
        // Bin slabs are allocated heap blocks: count their handed-out blocks, less those pending.
        let binned = self.pending.iter().filter(|p| p.tag.is_none());
        let (pending_bins, pending_bin_bytes) =
            binned.fold((0, 0), |(n, bytes), p| (n + 1, bytes + p.size));
        ArenaFigures {
            region_bytes: self.small.region_bytes + self.large.region_bytes,
            free_bytes: self.small.free_bytes
                + self.large.free_bytes
                + self.bins.free_bytes
                + self.cache.bytes,
            cached_bytes: self.cache.bytes,
            in_use: self.in_use + self.bins.live_bytes - pending_bin_bytes,
            pending_bytes: self.pending_bytes,
            largest_free: self.small.largest_free().max(self.large.largest_free()),
            regions: self.small.regions + self.large.regions,
            free_blocks: self.small.free_blocks + self.large.free_blocks,
            live_blocks: self.live.len + self.bins.live_count - pending_bins,
        }
    }

    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        let mut cached = 0;
        for b in self.cache.iter() {
            let block = self.heap(b.tag).get_block(b.tag & !SMALL_TAG);
            let fine = block.is_some_and(|k| !k.is_free() && k.addr == b.addr && k.size == b.size);
            if !fine || self.live.get(b.addr).is_some() {
                return Err(format!(
                    "cached block {:#x}+{} is not its heap's allocated block of that size, \
                     or is also live",
                    b.addr, b.size
                ));
            }
            cached += b.size;
        }
        if cached != self.cache.bytes {
            return Err(format!(
                "cached blocks add up to {cached} B, the cache counts {} B",
                self.cache.bytes
            ));
        }
        self.bins.check().map_err(|e| format!("bins: {e}"))?;
        self.small.check().map_err(|e| format!("small heap: {e}"))?;
        self.large.check().map_err(|e| format!("large heap: {e}"))
    }

    /// Destroys the arena's events (at pool teardown).
    pub(crate) fn destroy_events(&mut self, backend: &dyn Backend, dev: u32) {
        for e in self
            .spare_events
            .drain(..)
            .chain(self.pending.drain(..).map(|p| p.event))
        {
            let _ = backend.event_destroy(dev, e);
        }
    }
}
