//! Live blocks a replacing pool takes over with their chunks, data in place
//! ([`PoolBuilder::adopt_live`](super::PoolBuilder::adopt_live)).
//!
//! The old pool disowns the blocks and hands over, within the new pool's initial size, the chunks
//! holding only free memory and handed-over blocks (a block goes only if all its chunks can), then
//! other free chunks. The new pool makes each block a live allocation in its stream's arena; blocks
//! that cannot move stay live in the old pool. A provisional hand-over is undone if the new pool
//! drops before [`PoolMemoryResource::commit_adoption`]. Slow path.

use std::collections::HashSet;
use std::sync::Arc;

use super::PoolMemoryResource;
use super::bins::BIN_LIMIT;
use super::tlsf::GRANULE;
use crate::backend::DevicePtr;
use crate::error::{Error, Result};
use crate::stream_view::StreamView;

/// A live allocation a replacing pool may take over.
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

    /// Whether a live allocation of `bytes` can ever move pools: blocks of 64 KiB or less share
    /// slabs and never move, nor let their chunk move (free or spill them first).
    pub fn movable(bytes: usize) -> bool {
        (bytes as u64).next_multiple_of(GRANULE) > BIN_LIMIT
    }
}

/// What a pool hands over: chunks (start, size) and the live blocks in them.
pub(super) struct Handover {
    pub(super) chunks: Vec<(u64, u64)>,
    pub(super) blocks: Vec<LiveBlock>,
}

/// A provisional hand-over, returned to the donor if the taking pool drops before the commit.
pub(super) struct Pending {
    donor: Arc<PoolMemoryResource>,
    handover: Handover,
}

impl Pending {
    /// Bytes of the live blocks taken over (as the pool counts them in use).
    pub(super) fn live_bytes(&self) -> u64 {
        self.handover.blocks.iter().map(LiveBlock::size).sum()
    }

    /// Drop side: returns the taken-over chunks `g` still holds, with their blocks, to the donor.
    pub(super) fn give_back(mut self, g: &mut super::global::FreeSpace) {
        let held: HashSet<(u64, u64)> = g.chunks().collect();
        self.handover.chunks.retain(|c| held.contains(c));
        for &(a, s) in &self.handover.chunks {
            g.forget_chunk(a, s);
        }
        let chunks = &self.handover.chunks;
        self.handover.blocks.retain(|b| {
            chunks
                .iter()
                .any(|&(a, s)| b.ptr.addr() >= a && b.ptr.addr() < a + s)
        });
        let (device, blocks) = (self.donor.device.ordinal(), self.handover.blocks.len());
        match self.donor.take_back(&self.handover) {
            Ok(()) => tracing::info!(
                device,
                chunks = self.handover.chunks.len(),
                blocks,
                "a replacement pool dropped before it was put in service gave its chunks and \
                 live blocks back to the pool it replaced"
            ),
            Err(e) => tracing::error!(
                "giving {blocks} live blocks back to device {device}'s previous pool: {e}"
            ),
        }
    }
}

impl PoolMemoryResource {
    /// Donor side: see the module documentation. `budget` bounds the bytes of chunks given.
    pub(super) fn hand_over(&self, blocks: &[LiveBlock], budget: u64) -> Result<Handover> {
        let (device, n) = (self.device.ordinal(), blocks.len());
        let _span = tracing::debug_span!("pool hand-over", device, blocks = n, budget).entered();
        let mut g = self.global.lock();
        // Blocks of the size-class bins share slabs with other blocks: they stay.
        let disown = |b: &&LiveBlock| {
            let mut arenas = self.arenas.all();
            arenas.any(|a| a.state.lock().free_local(b.ptr.addr()))
        };
        let released: Vec<LiveBlock> = blocks
            .iter()
            .filter(|b| b.size() > BIN_LIMIT && !b.ptr.is_null())
            .filter(disown)
            .copied()
            .collect();
        self.reclaim(&mut g)?;
        self.scavenge(&mut g)?;
        let free = g.free_chunks();
        let free_set: HashSet<(u64, u64)> = free.iter().copied().collect();
        // A list in order and a set: a pool with a footprint limit has thousands of chunks.
        let mut take: Vec<(u64, u64)> = Vec::new();
        let mut taken: HashSet<(u64, u64)> = HashSet::new();
        let mut left = budget;
        let (mut moved, mut kept) = (Vec::new(), Vec::new());
        for b in released {
            let under = g.chunks_under(b.ptr.addr(), b.size());
            let mut new = under.clone();
            new.retain(|c| !taken.contains(c));
            let cost: u64 = new.iter().map(|c| c.1).sum();
            if !under.is_empty() && under.iter().all(|c| free_set.contains(c)) && cost <= left {
                left -= cost;
                taken.extend(new.iter().copied());
                take.extend(new);
                moved.push(b);
            } else {
                kept.push(b);
            }
        }
        for c in free {
            if !taken.contains(&c) && c.1 <= left {
                left -= c.1;
                taken.insert(c);
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
        let arena = self.arena(b.stream)?;
        arena.state.lock().adopt_live(b.ptr.addr(), b.size());
        Ok(())
    }

    /// Undoes a hand-over whose new pool failed to build: chunks and blocks return to this pool.
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

    /// The live blocks taken over from the replaced pool, now this pool's allocations.
    pub fn adopted_blocks(&self) -> &[LiveBlock] {
        &self.adopted
    }

    /// Makes a provisional adoption final, so dropping this pool gives that memory upstream; false
    /// if nothing was provisional.
    pub fn commit_adoption(&self) -> bool {
        self.pending.lock().take().is_some()
    }

    /// Builder side: takes `donor`'s free chunks (and the `live` blocks it can hand over) within
    /// `initial` bytes, the rest from the upstream; returns the bytes taken over.
    pub(super) fn take_over(
        &mut self,
        donor: Option<Arc<PoolMemoryResource>>,
        live: &[LiveBlock],
        initial: u64,
        provisional: bool,
    ) -> Result<u64> {
        let mut adopted = 0;
        let mut handed = None;
        if let Some(donor) = donor {
            let h = if live.is_empty() {
                Handover {
                    chunks: donor.give_chunks(initial)?,
                    blocks: Vec::new(),
                }
            } else {
                donor.hand_over(live, initial)?
            };
            let g = self.global.get_mut();
            for &(addr, size) in &h.chunks {
                g.add_chunk(addr, size);
                adopted += size;
            }
            handed = Some((donor, h));
        }
        let rest = initial.saturating_sub(adopted);
        let made = (|| {
            let mut g = self.global.lock();
            if rest > 0 {
                self.add_memory(&mut g, rest, None, StreamView::DEFAULT, false)?;
            }
            let mut blocks = handed.iter().flat_map(|(_, h)| &h.blocks);
            blocks.try_for_each(|b| self.relive(&mut g, b))
        })();
        if let Err(e) = made {
            // The donor gets back its chunks and blocks in place; we return only what we took.
            if let Some((donor, h)) = &handed {
                let g = self.global.get_mut();
                for &(a, s) in &h.chunks {
                    g.forget_chunk(a, s);
                }
                donor.take_back(h)?;
            }
            return Err(e);
        }
        if let Some((donor, handover)) = handed {
            self.adopted.clone_from(&handover.blocks);
            if provisional {
                *self.pending.get_mut() = Some(Box::new(Pending { donor, handover }));
            }
        }
        Ok(adopted)
    }
}
