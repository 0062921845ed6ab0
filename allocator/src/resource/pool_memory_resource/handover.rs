//! Live blocks that a replacing pool takes over with their chunks, data in place: a
//! reinitialize from pool to pool keeps spillable buffers on the device instead of copying
//! them to host memory and back ([`PoolBuilder::adopt_live`](super::PoolBuilder::adopt_live)).
//!
//! The old pool stops owning the blocks (as if freed, without anyone reusing the memory),
//! gathers all its free memory, and hands over every chunk that holds only free memory and
//! handed-over blocks, within the new pool's initial size: first the chunks the blocks need
//! (a block is taken only when all of its chunks can go), then other entirely free chunks.
//! The new pool adds the chunks and makes each block a live allocation of its own, in the
//! arena of the block's stream, so that its deallocation goes to the new pool. Blocks that
//! cannot move stay live in the old pool (the caller spills them as before). Slow path.

use super::PoolMemoryResource;
use super::bins::BIN_LIMIT;
use super::tlsf::GRANULE;
use crate::backend::DevicePtr;
use crate::error::{Error, Result};
use crate::stream::StreamView;

/// A live allocation a replacing pool may take over: where, how many bytes (as asked for at
/// allocation) and the stream it will be freed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveBlock {
    /// The allocation's address.
    pub ptr: DevicePtr,
    /// Its size as requested.
    pub bytes: usize,
    /// The stream it is used and will be freed on.
    pub stream: StreamView,
}

impl LiveBlock {
    fn size(&self) -> u64 {
        (self.bytes as u64).next_multiple_of(GRANULE)
    }
}

/// What a pool hands over: chunks (start, size) and the live blocks in them.
pub(super) struct Handover {
    pub(super) chunks: Vec<(u64, u64)>,
    pub(super) blocks: Vec<LiveBlock>,
}

impl PoolMemoryResource {
    /// Donor side: see the module documentation. `budget` bounds the bytes of chunks given.
    pub(super) fn hand_over(&self, blocks: &[LiveBlock], budget: u64) -> Result<Handover> {
        let _span = tracing::debug_span!(
            "pool hand-over",
            device = self.device.ordinal(),
            blocks = blocks.len(),
            budget
        )
        .entered();
        let mut g = self.global.lock();
        // Blocks of the size-class bins share slabs with other blocks: they stay.
        let mut released = Vec::new();
        for b in blocks
            .iter()
            .filter(|b| b.size() > BIN_LIMIT && !b.ptr.is_null())
        {
            if self
                .arenas
                .all()
                .any(|a| a.state.lock().free_local(b.ptr.addr()))
            {
                released.push(*b);
            }
        }
        self.reclaim(&mut g)?;
        self.scavenge(&mut g)?;
        let free = g.free_chunks();
        let mut take: Vec<(u64, u64)> = Vec::new();
        let mut left = budget;
        let (mut moved, mut kept) = (Vec::new(), Vec::new());
        for b in released {
            let under = g.chunks_under(b.ptr.addr(), b.size());
            let new: Vec<(u64, u64)> = under
                .iter()
                .filter(|c| !take.contains(c))
                .copied()
                .collect();
            let cost: u64 = new.iter().map(|c| c.1).sum();
            if !under.is_empty() && under.iter().all(|c| free.contains(c)) && cost <= left {
                left -= cost;
                take.extend(new);
                moved.push(b);
            } else {
                kept.push(b);
            }
        }
        for c in free {
            if !take.contains(&c) && c.1 <= left {
                left -= c.1;
                take.push(c);
            }
        }
        // Blocks that cannot move are this pool's again, live as before.
        for b in kept {
            self.relive(&mut g, &b)?;
        }
        let chunks = g.take_chunks(&take);
        tracing::debug!(
            device = self.device.ordinal(),
            chunks = chunks.len(),
            bytes = chunks.iter().map(|c| c.1).sum::<u64>(),
            blocks = moved.len(),
            "pool handed chunks and live blocks over"
        );
        Ok(Handover {
            chunks,
            blocks: moved,
        })
    }

    /// Makes `b`, free in `g`, a live block of the arena of its stream.
    pub(super) fn relive(&self, g: &mut super::global::FreeSpace, b: &LiveBlock) -> Result<()> {
        if !g.take_exact(b.ptr.addr(), b.size()) {
            return Err(Error::invalid_argument(
                "adopted block",
                format!("{}+{}", b.ptr, b.bytes),
                "a block inside the chunks handed over (this is a bug in rmm-rs)",
            ));
        }
        self.arena(b.stream)?
            .state
            .lock()
            .adopt_live(b.ptr.addr(), b.size());
        Ok(())
    }

    /// Undoes a hand-over whose new pool could not be built: the chunks and blocks are this
    /// pool's again.
    pub(super) fn take_back(&self, h: &Handover) -> Result<()> {
        let mut g = self.global.lock();
        for &(a, s) in &h.chunks {
            g.add_chunk(a, s);
        }
        for b in &h.blocks {
            self.relive(&mut g, b)?;
        }
        Ok(())
    }

    /// The live blocks this pool took over from the pool it replaced when it was built
    /// ([`PoolBuilder::adopt_live`](super::PoolBuilder::adopt_live)): they are its
    /// allocations now, to be freed to it.
    pub fn adopted_blocks(&self) -> &[LiveBlock] {
        &self.adopted
    }
}
