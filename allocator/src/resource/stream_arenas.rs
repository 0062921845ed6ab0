//! Per-stream state for stream-ordered resources, found without a global lock.
//!
//! Each resource keeps its per-stream arenas in an append-only table. Every thread caches
//! the (resource, stream) → slot pairs it used last, so the allocation fast path is a
//! thread-local lookup and an index: workers on their own streams never touch shared state.
//! Arenas live as long as their resource; nothing is reference-counted on the fast path.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::backend::RawStream;
use crate::error::{Error, Result};

/// Most streams one resource serves.
pub(crate) const MAX_STREAMS: usize = 1024;
const CACHE_SLOTS: usize = 8;

#[derive(Clone, Copy)]
struct CacheEntry {
    registry: u64,
    stream: RawStream,
    slot: u32,
}

const EMPTY_ENTRY: CacheEntry = CacheEntry {
    registry: 0,
    stream: 0,
    slot: 0,
};

thread_local! {
    static CACHE: [Cell<CacheEntry>; CACHE_SLOTS] = const { [const { Cell::new(EMPTY_ENTRY) }; CACHE_SLOTS] };
    static NEXT_VICTIM: Cell<usize> = const { Cell::new(0) };
}

static NEXT_REGISTRY: AtomicU64 = AtomicU64::new(1);

/// The arenas of one resource, one per stream.
pub(crate) struct StreamArenas<A> {
    id: u64,
    /// Boxed so that an unused slot costs a pointer, not a whole arena.
    slots: Box<[OnceLock<Box<A>>]>,
    index: Mutex<HashMap<RawStream, u32>>,
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
            slots: (0..MAX_STREAMS).map(|_| OnceLock::new()).collect(),
            index: Mutex::new(HashMap::new()),
        }
    }

    /// The arena of `stream`, made with `make` on first use.
    #[inline]
    pub(crate) fn get(&self, stream: RawStream, make: impl FnOnce() -> A) -> Result<&A> {
        let hit = CACHE.with(|c| {
            c.iter()
                .map(Cell::get)
                .find(|e| e.registry == self.id && e.stream == stream)
                .map(|e| e.slot)
        });
        if let Some(slot) = hit
            && let Some(a) = self.slots[slot as usize].get()
        {
            return Ok(&**a);
        }
        self.get_slow(stream, make)
    }

    #[cold]
    fn get_slow(&self, stream: RawStream, make: impl FnOnce() -> A) -> Result<&A> {
        let slot = {
            let mut index = self.index.lock();
            let next = index.len();
            match index.get(&stream) {
                Some(&s) => s,
                None => {
                    if next >= MAX_STREAMS {
                        return Err(Error::invalid_argument(
                            "stream",
                            format!("{stream:#x} (stream number {})", next + 1),
                            format!("at most {MAX_STREAMS} distinct streams per resource"),
                        ));
                    }
                    let _ = self.slots[next].set(Box::new(make()));
                    index.insert(stream, next as u32);
                    next as u32
                }
            }
        };
        CACHE.with(|c| {
            let victim = NEXT_VICTIM.with(|v| {
                let i = v.get();
                v.set((i + 1) % CACHE_SLOTS);
                i
            });
            c[victim].set(CacheEntry {
                registry: self.id,
                stream,
                slot,
            });
        });
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

    /// Every arena, for slow paths that look across streams.
    pub(crate) fn all(&self) -> impl Iterator<Item = &A> {
        let n = self.index.lock().len();
        self.slots[..n].iter().filter_map(|s| s.get().map(|a| &**a))
    }
}
