//! How memory idle in one stream's arena returns to the pool's free space for another stream: whole
//! free regions, one free block or all free blocks, each after the owning stream completes the work
//! queued before the frees. Slow paths only: they take each arena's lock in turn, never waiting for
//! the device under it.

use super::PoolMemoryResource;
use super::arena::{Arena, ArenaState};
use super::global::FreeSpace;
use crate::error::Result;
use crate::resource::stream_arenas::sync_stream_or_device;
use crate::stream_view::StreamView;

impl PoolMemoryResource {
    /// Moves the entirely free regions of every idle-stream arena to the free space without
    /// waiting; a stream is checked idle after its regions are taken, so no work queued before
    /// their frees is pending. Returns the bytes moved.
    pub(super) fn reclaim_idle(&self, g: &mut FreeSpace) -> Result<u64> {
        let (backend, dev) = (self.device.backend(), self.device.ordinal());
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
            // Unverifiable or failing streams count as busy, as does a per-thread default stream
            // (this thread's handle names its own): the blocking reclaim handles them.
            let idle = arena.stream != StreamView::PER_THREAD.raw()
                && matches!(
                    backend.stream_query_if_alive(dev, arena.stream),
                    Ok(Some(true))
                );
            if idle {
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

    /// Moves all arenas' free regions to the free space once their streams finish prior work.
    pub(super) fn reclaim(&self, g: &mut FreeSpace) -> Result<u64> {
        self.gather(g, ArenaState::take_free_regions)
    }

    /// Moves what `take` takes out of each settled arena to the free space, after that arena's
    /// stream's prior work; returns the bytes.
    fn gather(
        &self,
        g: &mut FreeSpace,
        take: fn(&mut ArenaState, &mut Vec<(u64, u64)>),
    ) -> Result<u64> {
        let (backend, dev) = (self.device.backend(), self.device.ordinal());
        let mut out = Vec::new();
        let mut per_thread = false;
        for arena in self.arenas.all() {
            self.settle_idle(arena)?;
            let before = out.len();
            take(&mut arena.state.lock(), &mut out);
            if out.len() > before {
                if arena.stream == StreamView::PER_THREAD.raw() {
                    // Threads' own streams, which this thread cannot name: one wait for the
                    // device, once every arena gave its part, covers them all.
                    per_thread = true;
                } else {
                    sync_stream_or_device(backend, dev, arena.stream)?;
                }
            }
        }
        if per_thread {
            backend.device_synchronize(dev)?;
        }
        for &(addr, size) in &out {
            g.insert(addr, size);
        }
        Ok(out.iter().map(|r| r.1).sum())
    }

    /// Waits (without the arena's lock) for the events of `arena`'s blocks freed on other
    /// streams, then returns those blocks, empty bin slabs and cached blocks to the heaps.
    pub(super) fn settle_idle(&self, arena: &Arena) -> Result<()> {
        let (backend, dev) = (self.device.backend(), self.device.ordinal());
        let events = arena.state.lock().pending_events();
        for (addr, event) in events {
            if arena.state.lock().still_pending(addr, event) {
                backend.event_synchronize(dev, event)?;
            }
        }
        arena.state.lock().settle_pending(backend, dev, true)
    }

    /// Moves one free block of at least `need` to the free space after its stream's prior work.
    pub(super) fn steal(&self, g: &mut FreeSpace, need: u64) -> Result<bool> {
        let (backend, dev) = (self.device.backend(), self.device.ordinal());
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

    /// Moves all arenas' free blocks to the free space, where neighbours merge; returns the bytes.
    pub(super) fn scavenge(&self, g: &mut FreeSpace) -> Result<u64> {
        self.gather(g, ArenaState::take_free_blocks)
    }
}
