//! How memory idle in one stream's arena goes back to the pool's free space for another
//! stream: whole free regions ([`PoolMemoryResource::reclaim`]), one free block
//! ([`PoolMemoryResource::steal`]) or every free block ([`PoolMemoryResource::scavenge`]),
//! each after the owning stream's work queued before the frees has completed (a wait on that
//! stream, never on the whole device unless the stream is gone). Slow paths only: they take
//! the pool's lock and each arena's lock in turn, so other threads' fast paths wait at most
//! for one arena's bookkeeping, never for the device.

use super::PoolMemoryResource;
use super::arena::Arena;
use super::global::FreeSpace;
use crate::error::Result;

impl PoolMemoryResource {
    /// Moves the entirely free regions of every arena whose stream is idle to the pool's free
    /// space, without waiting for anything: blocks freed on other streams are settled only
    /// when their events have completed, and an arena whose stream still has work queued
    /// (checked after its regions were taken, so no work queued before their frees can be
    /// pending) keeps them. Returns the bytes moved. The first step before the pool grows:
    /// cheap when idle streams hold enough, and it never stalls behind a busy stream.
    pub(super) fn reclaim_idle(&self, g: &mut FreeSpace) -> Result<u64> {
        let backend = self.device.backend();
        let dev = self.device.ordinal();
        let (mut small, mut large) = (Vec::new(), Vec::new());
        let mut moved = 0;
        for arena in self.arenas.all() {
            small.clear();
            large.clear();
            {
                let mut st = arena.state.lock();
                if st.has_pending() {
                    st.settle_pending(backend, dev, false)?;
                }
                st.take_free_regions_by_heap(&mut small, &mut large);
            }
            if small.is_empty() && large.is_empty() {
                continue;
            }
            // A stream the backend cannot vouch for (destroyed, or a library's own stream),
            // or one that fails the query, counts as busy: the blocking reclaim deals with it.
            if let Ok(Some(true)) = backend.stream_query_if_alive(dev, arena.stream) {
                for &(addr, size) in small.iter().chain(&large) {
                    g.insert(addr, size);
                    moved += size;
                }
            } else {
                arena.state.lock().give_back_regions(&small, &large);
            }
        }
        Ok(moved)
    }

    /// Moves every arena's entirely free regions back to the pool's free space, after the
    /// arena's stream has finished the work queued before those frees.
    pub(super) fn reclaim(&self, g: &mut FreeSpace) -> Result<()> {
        let backend = self.device.backend();
        let dev = self.device.ordinal();
        let mut regions = Vec::new();
        for arena in self.arenas.all() {
            self.settle_idle(arena)?;
            let before = regions.len();
            arena.state.lock().take_free_regions(&mut regions);
            if regions.len() > before {
                sync_stream_or_device(backend, dev, arena.stream)?;
            }
        }
        for (addr, size) in regions {
            g.insert(addr, size);
        }
        Ok(())
    }

    /// Waits (without the arena's lock) for the events of `arena`'s blocks freed on other
    /// streams, then returns those blocks, empty bin slabs and cached blocks to the heaps.
    pub(super) fn settle_idle(&self, arena: &Arena) -> Result<()> {
        let backend = self.device.backend();
        let dev = self.device.ordinal();
        let events = arena.state.lock().pending_events();
        for (addr, event) in events {
            if arena.state.lock().still_pending(addr, event) {
                backend.event_synchronize(dev, event)?;
            }
        }
        arena.state.lock().settle_pending(backend, dev, true)
    }

    /// Moves one free block of at least `need` bytes from some arena to the free space, after
    /// that arena's stream has finished the work queued before the block was freed.
    pub(super) fn steal(&self, g: &mut FreeSpace, need: u64) -> Result<bool> {
        let backend = self.device.backend();
        let dev = self.device.ordinal();
        for arena in self.arenas.all() {
            let stolen = arena.state.lock().steal(need);
            if let Some((addr, size)) = stolen {
                sync_stream_or_device(backend, dev, arena.stream)?;
                g.insert(addr, size);
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Moves every free block of every arena to the free space (after each arena's stream has
    /// finished the work queued before the frees), where free pieces of different arenas
    /// that lie side by side merge. Returns the bytes moved. The last resort before the pool
    /// gives chunks back to the upstream or fails: arenas lose the free space inside their
    /// partly used regions and take it back through the pool's slow path.
    pub(super) fn scavenge(&self, g: &mut FreeSpace) -> Result<u64> {
        let backend = self.device.backend();
        let dev = self.device.ordinal();
        let mut blocks = Vec::new();
        for arena in self.arenas.all() {
            self.settle_idle(arena)?;
            let before = blocks.len();
            arena.state.lock().take_free_blocks(&mut blocks);
            if blocks.len() > before {
                sync_stream_or_device(backend, dev, arena.stream)?;
            }
        }
        let mut moved = 0;
        for (addr, size) in blocks {
            g.insert(addr, size);
            moved += size;
        }
        Ok(moved)
    }
}

/// Waits for `stream`, which may be another thread's; when the backend cannot vouch that it
/// still exists (destroyed by its owner after it last used the pool, or a library's own
/// stream), waits for the whole device instead, which covers its work too.
pub(super) fn sync_stream_or_device(
    backend: &dyn crate::backend::Backend,
    dev: u32,
    stream: crate::backend::RawStream,
) -> Result<()> {
    match backend.stream_synchronize_if_alive(dev, stream) {
        Ok(true) => Ok(()),
        Ok(false) => {
            tracing::debug!(
                device = dev,
                stream,
                "stream not known alive; synchronizing the device"
            );
            backend.device_synchronize(dev)
        }
        Err(e) => {
            tracing::debug!(
                device = dev,
                stream,
                "stream wait failed ({e}); synchronizing the device"
            );
            backend.device_synchronize(dev)
        }
    }
}
