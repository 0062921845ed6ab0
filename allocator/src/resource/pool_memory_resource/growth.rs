//! Where an arena's new range comes from when its heaps cannot serve a request, and how much the
//! pool grows when nothing it holds can. Each step runs only if those before found nothing:
//! 1. the pool's free space (memory granted to no arena);
//! 2. every arena's idle memory (free regions, cached blocks, empty bin slabs, settled cross-stream
//!    frees): first from idle streams' arenas without waiting
//!    ([`PoolMemoryResource::reclaim_idle`]), then from all after the owning stream's queued work
//!    ([`PoolMemoryResource::reclaim`]);
//! 3. growth by the need rounded up to the growth step, never past the maximum ([`growth_size`]);
//! 4. one large enough free block taken from some arena's partly used region;
//! 5. every arena's free blocks, so adjacent pieces of different arenas merge in the free space;
//! 6. entirely free chunks returned upstream, then growth again (the upstream may have one large
//!    range where the pool had small ones).
//!
//! So a pool that starts empty holds about its streams' peak use, not a doubling per stream that
//! ever ran: memory idle on one stream serves the next. All slow path.

use super::PoolMemoryResource;
use super::footprint::Within;
use super::global::FreeSpace;
use super::tlsf::GRANULE;
use crate::error::Result;
use crate::stream_view::StreamView;

/// Free ranges beside a gap that growth tries to extend before it maps a range of its own.
const GAPS_TRIED: usize = 4;

/// The default growth step: the pool grows by what a request needs rounded up to this.
pub const DEFAULT_GROWTH: u64 = 1 << 30;

/// Bytes to ask the upstream for: `max(need, want)` rounded up to a multiple of `step`, within
/// the `room` left under the maximum size; `None` when not even `need` fits.
pub(crate) fn growth_size(need: u64, want: u64, step: u64, room: u64) -> Option<u64> {
    if room < need {
        return None;
    }
    let step = step.max(GRANULE);
    let target = need.max(want);
    let rounded = target.div_ceil(step).saturating_mul(step);
    Some(rounded.min(room).max(need))
}

impl PoolMemoryResource {
    /// Finds at least `need` bytes (ideally `want`) for an arena, in the module doc's order.
    pub(super) fn grant(
        &self,
        need: u64,
        want: u64,
        stream: StreamView,
    ) -> Result<Option<(u64, u64)>> {
        let mut g = self.global.lock();
        if let Some(r) = g.take(need, want) {
            return Ok(Some(r));
        }
        let _span = tracing::debug_span!("pool reclaim/grow", device = self.device.ordinal(), need)
            .entered();
        // Idle streams' memory first (no wait), then every stream's, after its queued work.
        if self.reclaim_idle(&mut g)? > 0
            && let Some(r) = g.take(need, want)
        {
            return Ok(Some(r));
        }
        self.reclaim(&mut g)?;
        if let Some(r) = g.take(need, want) {
            return Ok(Some(r));
        }
        // With a footprint limit, free memory goes back first where growing would pass it.
        let (want, cap) = match &self.footprint {
            Some(limit) => match self.keep_within(&mut g, limit, need)? {
                Within::Served(r) => return Ok(Some(r)),
                Within::Grow(cap) => (want.min(cap).max(need), cap),
            },
            None => (want, u64::MAX),
        };
        if self.grow(&mut g, need, want, cap, stream)? {
            return Ok(g.take(need, want));
        }
        // Free memory is scattered over arenas: move one large enough free block.
        if self.steal(&mut g, need)? {
            return Ok(g.take(need, need));
        }
        // Free pieces of several arenas may lie side by side: gather them all.
        if self.scavenge(&mut g)? > 0
            && let Some(r) = g.take(need, need)
        {
            return Ok(Some(r));
        }
        // Give entirely free chunks back so the upstream can hand out one large enough.
        let freed = g.take_free_chunks(0, None);
        if !freed.is_empty() {
            self.device.synchronize()?;
            self.return_chunks(&mut g, &freed)?;
            if self.grow(&mut g, need, want, cap, stream)? {
                return Ok(g.take(need, want));
            }
        }
        Ok(None)
    }

    /// Grows the pool by at most `cap` bytes where that suffices, first right after a free range
    /// ending at a gap (mapped chunks), which then counts toward the need; false if it cannot.
    pub(super) fn grow(
        &self,
        g: &mut FreeSpace,
        need: u64,
        want: u64,
        cap: u64,
        stream: StreamView,
    ) -> Result<bool> {
        let left = self.maximum.saturating_sub(g.pool_size);
        // Room for growth of at least `least`: within the cap (in the source's unit) and maximum.
        let room_for = |least: u64| {
            let cap = cap.max(least);
            let unit = self.granularity().unwrap_or(GRANULE);
            let cap = cap.checked_next_multiple_of(unit).unwrap_or(u64::MAX);
            left.min(cap)
        };
        if self.uses_virtual_memory() {
            for (addr, free) in g.ranges_before_gaps(need, GAPS_TRIED) {
                let (n, w) = (need - free, want.saturating_sub(free));
                if self.grow_by(g, n, w, room_for(n), Some(addr + free), stream)? {
                    return Ok(true);
                }
            }
        }
        self.grow_by(g, need, want, room_for(need), None, stream)
    }

    /// Adds [`growth_size`] bytes rounded to the source's unit within `room` (at `at` if given),
    /// halving toward `need` while the device refuses; false if nothing was added.
    fn grow_by(
        &self,
        g: &mut FreeSpace,
        need: u64,
        want: u64,
        room: u64,
        at: Option<u64>,
        stream: StreamView,
    ) -> Result<bool> {
        let Some(mut size) = growth_size(need, want, self.growth, room)
            .and_then(|s| self.chunk_round(s, need, room))
        else {
            return Ok(false);
        };
        loop {
            let pool = g.pool_size;
            match self.add_memory(g, size, at, stream, true) {
                Ok(added) => {
                    if added {
                        tracing::debug!(
                            device = self.device.ordinal(),
                            need,
                            grew_by = size,
                            pool_size = pool + size,
                            chunks = self.chunk_source(),
                            "pool grew"
                        );
                    }
                    return Ok(added);
                }
                Err(e) if e.is_out_of_memory() => {
                    let half = (size / 2 / GRANULE * GRANULE).max(need);
                    match self.chunk_round(half, need, room) {
                        Some(s) if s < size => size = s,
                        _ => return Ok(false),
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn growth_rounds_the_need_up_to_the_step() {
        assert_eq!(growth_size(MIB, 64 * MIB, GIB, 100 * GIB), Some(GIB));
        assert_eq!(growth_size(GIB + 1, GIB + 1, GIB, 100 * GIB), Some(2 * GIB));
        assert_eq!(growth_size(3 * GIB, 3 * GIB, GIB, 100 * GIB), Some(3 * GIB));
        assert_eq!(
            growth_size(100 * MIB, 100 * MIB, 64 * MIB, GIB),
            Some(128 * MIB)
        );
    }

    #[test]
    fn growth_stops_at_the_maximum_and_refuses_what_does_not_fit() {
        assert_eq!(growth_size(MIB, 64 * MIB, GIB, 300 * MIB), Some(300 * MIB));
        assert_eq!(
            growth_size(200 * MIB, 200 * MIB, GIB, 200 * MIB),
            Some(200 * MIB)
        );
        assert_eq!(growth_size(201 * MIB, 201 * MIB, GIB, 200 * MIB), None);
    }

    #[test]
    fn a_step_below_the_granule_counts_as_one_granule() {
        assert_eq!(growth_size(1000, 1000, 0, GIB), Some(1024));
    }
}
