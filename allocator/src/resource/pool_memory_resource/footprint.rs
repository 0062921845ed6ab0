//! Keeping a pool's footprint near what is in use ([`PoolBuilder::max_overhead`]).
//!
//! A pool that grows on demand holds, at the end of a training step, the free pieces left
//! between the blocks of every size that step used; when the next step asks for a size no
//! piece fits (a sequence length, an image size that changes every step), the pool grows
//! again, and its reserved memory drifts above the most it ever had in use. With a limit,
//! growing past `peak in use × (1 + overhead)` first gathers every arena's free blocks
//! (where the request may now fit, merged), then gives entirely free chunks back to the
//! device, so that the new memory replaces free memory instead of adding to it. Chunks of a
//! mapped pool are then small ([`LIMITED_CHUNK`]), so free memory goes back in pieces the
//! size of the holes that steps leave. Everything here is a slow path: it runs only when an
//! arena cannot serve a request from what it holds.
//!
//! [`PoolBuilder::max_overhead`]: super::PoolBuilder::max_overhead

use std::sync::atomic::{AtomicU64, Ordering};

use super::PoolMemoryResource;
use super::global::FreeSpace;
use super::tlsf::GRANULE;
use crate::error::Result;

/// The chunk size of a mapped pool with a footprint limit (rounded up to the device's
/// granularity, which it is on current GPUs): the unit in which free memory goes back to the
/// device, and in which the pool maps its memory. Larger chunks are fewer driver calls, but
/// the free pieces that sizes changing every step leave are rarely whole chunks of 16 MiB.
pub(super) const LIMITED_CHUNK: u64 = 2 << 20;

/// The most a pool holds beyond the peak of its bytes in use.
#[derive(Debug)]
pub(super) struct FootprintLimit {
    /// Allowed memory beyond the peak in use, as a fraction of it.
    overhead: f64,
    /// Never given back below this: the initial size the pool was asked to hold.
    floor: u64,
    /// The most bytes in use at once (with the request that made the pool grow), as seen
    /// when the pool had to find memory.
    peak_in_use: AtomicU64,
}

/// What keeping to the limit found for a request.
pub(super) enum Within {
    /// A range that serves it, among free pieces gathered from the arenas.
    Served((u64, u64)),
    /// The pool must grow: by at most this many bytes where that is enough for the request.
    Grow(u64),
}

impl FootprintLimit {
    pub(super) fn new(overhead: f64, floor: u64) -> FootprintLimit {
        FootprintLimit {
            overhead,
            floor,
            peak_in_use: AtomicU64::new(0),
        }
    }

    /// The allowed overhead, as a fraction of the peak in use.
    pub(super) fn overhead(&self) -> f64 {
        self.overhead
    }

    /// The most the pool may hold once `in_use` bytes are in use: the peak in use (raised to
    /// `in_use`) plus the overhead, never below the floor, rounded down to 256 bytes.
    fn budget(&self, in_use: u64) -> u64 {
        let peak = self
            .peak_in_use
            .fetch_max(in_use, Ordering::Relaxed)
            .max(in_use);
        let allowed = peak.saturating_add((peak as f64 * self.overhead) as u64);
        // Grants and chunks are whole granules: so is what they are cut to.
        (allowed.max(self.floor) / GRANULE) * GRANULE
    }
}

impl PoolMemoryResource {
    /// Bytes handed out and not freed, over every arena.
    fn in_use_bytes(&self) -> u64 {
        self.arenas
            .all()
            .map(|arena| arena.state.lock().figures().in_use)
            .sum()
    }

    /// Before the pool grows for a request of `need` bytes: when growing would take it past
    /// `limit`, gathers every arena's free blocks (the request may fit among them, merged)
    /// and gives entirely free chunks back, so that growing by `need` stays within the
    /// limit where the free memory allows. Returns a range that serves the request, or how
    /// much the pool may grow by within the limit.
    pub(super) fn keep_within(
        &self,
        g: &mut FreeSpace,
        limit: &FootprintLimit,
        need: u64,
    ) -> Result<Within> {
        let budget = limit.budget(self.in_use_bytes().saturating_add(need));
        // Chunks can go right after a free range that ends at a gap (a pool with a limit maps
        // its memory): growth then adds only what that range lacks.
        let beside = |g: &FreeSpace| g.ranges_before_gaps(need, 1).first().copied();
        let over = |g: &FreeSpace| {
            let lacks = need - beside(g).map_or(0, |r| r.1);
            g.pool_size().saturating_add(lacks) > budget
        };
        if over(g) {
            self.scavenge(g)?;
            if let Some(r) = g.take(need, need) {
                return Ok(Within::Served(r));
            }
        }
        if over(g) {
            // The memory in the free space came there through `reclaim` or `scavenge`, after
            // the streams that freed it finished their work: it can go back at once.
            // Only what growing beside that range needs goes back, and never the range itself.
            let range = beside(g);
            let lacks = need - range.map_or(0, |r| r.1);
            let freed = g.take_free_chunks_outside(budget.saturating_sub(lacks), range);
            let released = self.return_chunks(g, &freed)?;
            tracing::debug!(
                device = self.device.ordinal(),
                need,
                budget,
                released,
                pool_size = g.pool_size(),
                "pool gave free chunks back before growing, to keep to its footprint limit"
            );
        }
        Ok(Within::Grow(budget.saturating_sub(g.pool_size())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn the_budget_follows_the_peak_in_use_and_never_falls_below_the_floor() {
        let limit = FootprintLimit::new(0.05, 4 * GIB);
        assert_eq!(limit.budget(GIB), 4 * GIB, "the initial size is the floor");
        assert_eq!(limit.budget(10 * GIB), 10 * GIB + GIB / 2);
        assert_eq!(limit.budget(GIB), 10 * GIB + GIB / 2, "the peak is kept");
        assert_eq!(FootprintLimit::new(0.0, 0).budget(3 * GIB), 3 * GIB);
        assert_eq!(
            FootprintLimit::new(0.05, 0).budget(1000),
            1024,
            "whole granules, as grants are"
        );
    }
}
