//! Keeping a pool's footprint near what is in use ([`PoolBuilder::max_overhead`]).
//!
//! A pool growing on demand drifts above its peak in use when sizes change from step to step and no
//! free piece fits. With a limit, growing past `peak in use × (1 + overhead)` first gathers every
//! arena's free blocks, then gives entirely free chunks back, so new memory replaces free memory.
//! A mapped pool's chunks are then small ([`LIMITED_CHUNK`]). Slow path only.
//!
//! [`PoolBuilder::max_overhead`]: super::PoolBuilder::max_overhead

use std::sync::atomic::{AtomicU64, Ordering};

use super::PoolMemoryResource;
use super::global::FreeSpace;
use super::tlsf::GRANULE;
use crate::error::Result;

/// Chunk size of a mapped pool with a footprint limit: small, as holes rarely free large chunks.
pub(super) const LIMITED_CHUNK: u64 = 2 << 20;

/// The most a pool holds beyond the peak of its bytes in use.
#[derive(Debug)]
pub(super) struct FootprintLimit {
    /// Allowed memory beyond the peak in use, as a fraction of it.
    pub(super) overhead: f64,
    /// Never given back below this: the initial size the pool was asked to hold.
    floor: u64,
    /// Peak bytes in use (with the request that grew the pool), as seen when finding memory.
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

    /// The most the pool may hold once `in_use` bytes are in use: the peak in use (raised to
    /// `in_use`) plus the overhead, never below the floor, rounded down to 256 bytes.
    fn budget(&self, in_use: u64) -> u64 {
        let peak = self.peak_in_use.fetch_max(in_use, Ordering::Relaxed);
        let peak = peak.max(in_use);
        let allowed = peak.saturating_add((peak as f64 * self.overhead) as u64);
        // Grants and chunks are whole granules: so is what they are cut to.
        (allowed.max(self.floor) / GRANULE) * GRANULE
    }
}

impl PoolMemoryResource {
    /// Before growing for `need` bytes past `limit`: gathers every arena's free blocks and gives
    /// free chunks back. Returns a serving range, or how much the pool may grow.
    pub(super) fn keep_within(
        &self,
        g: &mut FreeSpace,
        limit: &FootprintLimit,
        need: u64,
    ) -> Result<Within> {
        let in_use = self.arenas.all().map(|a| a.state.lock().figures().in_use);
        let budget = limit.budget(in_use.sum::<u64>().saturating_add(need));
        // Chunks may follow a free range ending at a gap: growth then adds only what it lacks.
        let beside = |g: &FreeSpace| g.ranges_before_gaps(need, 1).first().copied();
        let over = |g: &FreeSpace| {
            let lacks = need - beside(g).map_or(0, |r| r.1);
            g.pool_size.saturating_add(lacks) > budget
        };
        if over(g) {
            self.scavenge(g)?;
            if let Some(r) = g.take(need, need) {
                return Ok(Within::Served(r));
            }
        }
        if over(g) {
            // The free space's memory is past its streams' work: it can go back at once. Never
            // the range growth extends.
            let range = beside(g);
            let lacks = need - range.map_or(0, |r| r.1);
            let freed = g.take_free_chunks(budget.saturating_sub(lacks), range);
            let released = self.return_chunks(g, &freed)?;
            tracing::debug!(
                device = self.device.ordinal(),
                need,
                budget,
                released,
                pool_size = g.pool_size,
                "pool gave free chunks back before growing, to keep to its footprint limit"
            );
        }
        Ok(Within::Grow(budget.saturating_sub(g.pool_size)))
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
