//! Per-stream state for stream-ordered resources, found without a global lock.
//!
//! Each resource keeps its arenas in an append-only table, one per (stream, *lane*): every
//! thread has a lane (threads are numbered round-robin over [`LANES`] lanes), so threads that
//! share one stream (as Dask's threads share the default stream) still get arenas of their
//! own and do not contend on one lock. Work on one stream is ordered, so any of the stream's
//! arenas may serve it: a block one lane freed is reusable by the stream at once, and a block
//! freed by another lane of the same stream goes straight back to its arena, with no event.
//! Every thread caches the (resource, stream) → slot pairs it used last, so the allocation
//! fast path is a thread-local lookup and an index. Arenas live as long as their resource;
//! nothing is reference-counted on the fast path.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::backend::RawStream;
use crate::error::{Error, Result};
use crate::sync::SlotCache;

/// Most arenas (streams × lanes in use) one resource has.
pub(crate) const MAX_ARENAS: usize = 4096;
/// Lanes per stream: threads beyond this many on one stream share arenas.
pub(crate) const LANES: u32 = 16;

static NEXT_LANE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

thread_local! {
    /// This thread's lane.
    static LANE: u32 = NEXT_LANE.fetch_add(1, Ordering::Relaxed) % LANES;
    /// ((resource's arenas, stream), slot) of the streams this thread used last.
    static CACHE: SlotCache<(u64, RawStream), 8> = const { SlotCache::new() };
}

static NEXT_REGISTRY: AtomicU64 = AtomicU64::new(1);

/// The arenas of one resource, one per stream.
pub(crate) struct StreamArenas<A> {
    id: u64,
    /// Boxed so that an unused slot costs a pointer, not a whole arena.
    slots: Box<[OnceLock<Box<A>>]>,
    /// (stream, lane) → slot.
    index: Mutex<HashMap<(RawStream, u32), u32>>,
}

impl<A> std::fmt::Debug for StreamArenas<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamArenas")
            .field("streams", &self.index.lock().len())
            .finish()
    }
}

impl<A> StreamArenas<A> {
    pub(crate) fn new() -> Self {
        StreamArenas {
            id: NEXT_REGISTRY.fetch_add(1, Ordering::Relaxed),
            slots: (0..MAX_ARENAS).map(|_| OnceLock::new()).collect(),
            index: Mutex::new(HashMap::new()),
        }
    }

    /// The calling thread's arena of `stream`, made with `make` on first use.
    #[inline]
    pub(crate) fn get(&self, stream: RawStream, make: impl FnOnce() -> A) -> Result<&A> {
        let hit = CACHE.with(|c| c.get((self.id, stream)));
        if let Some(slot) = hit
            && let Some(a) = self.slots[slot as usize].get()
        {
            return Ok(&**a);
        }
        self.get_slow(stream, make)
    }

    #[cold]
    fn get_slow(&self, stream: RawStream, make: impl FnOnce() -> A) -> Result<&A> {
        let lane = LANE.with(|l| *l);
        let slot = {
            let mut index = self.index.lock();
            let next = index.len();
            match index.get(&(stream, lane)) {
                Some(&s) => s,
                None => {
                    if next >= MAX_ARENAS {
                        return Err(Error::invalid_argument(
                            "stream",
                            format!("{stream:#x} (arena number {})", next + 1),
                            format!(
                                "at most {MAX_ARENAS} arenas (distinct streams × up to {LANES} \
                                 threads each) per resource"
                            ),
                        ));
                    }
                    let _ = self.slots[next].set(Box::new(make()));
                    index.insert((stream, lane), next as u32);
                    next as u32
                }
            }
        };
        CACHE.with(|c| c.insert((self.id, stream), slot));
        self.slots[slot as usize]
            .get()
            .map(|a| &**a)
            .ok_or_else(|| {
                Error::invalid_argument(
                    "stream",
                    format!("{stream:#x}"),
                    "a stream whose arena was set up",
                )
            })
    }

    /// Every arena, for slow paths that look across streams and lanes.
    pub(crate) fn all(&self) -> impl Iterator<Item = &A> {
        let n = self.index.lock().len();
        self.slots[..n].iter().filter_map(|s| s.get().map(|a| &**a))
    }
}
