//! Per-stream state for stream-ordered resources, found without a global lock.
//!
//! A resource keeps its arenas in an append-only table, one per (stream, *lane*): threads get lanes
//! round-robin over [`LANES`], so threads sharing a stream get arenas of their own, any of which
//! may serve the stream's ordered work. Each thread caches the (resource, stream) → slot pairs it
//! used last. The per-thread default stream's arenas are one per thread.
//!
//! The first [`FIRST`] slots are inline; the rest come in segments of [`FIRST`], made with their
//! first arena ([`GroupedSlots`]), so building a resource does not touch all [`MAX_ARENAS`].

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::backend::RawStream;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream_view::StreamView;
use crate::sync::{GroupedSlots, SlotCache};

/// Most arenas (streams × lanes in use) one resource has.
pub(crate) const MAX_ARENAS: usize = 4096;
/// Slots held inline, and the size of each segment made later.
pub(crate) const FIRST: usize = 256;
const SEGMENTS: usize = MAX_ARENAS / FIRST - 1;
/// Lanes per stream: threads beyond this many on one stream share arenas.
pub(crate) const LANES: u32 = 16;
const PER_THREAD: RawStream = StreamView::PER_THREAD.raw();

static NEXT_LANE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
static NEXT_THREAD: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
/// Per-thread default stream lanes of exited threads, for new threads to reuse with their arenas.
static FREE_OWN_LANES: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// A thread's lane of the per-thread default stream, given back when the thread exits.
struct OwnLane {
    lane: u32,
    /// An exited thread's: blocks it freed on its stream may still be used by its queued work.
    recycled: bool,
    /// Devices (bit per ordinal below 64) waited for since this thread took a recycled lane.
    settled: std::cell::Cell<u64>,
}

impl OwnLane {
    fn take() -> OwnLane {
        let (lane, recycled) = match FREE_OWN_LANES.lock().pop() {
            Some(lane) => (lane, true),
            None => (fresh_own_lane(), false),
        };
        OwnLane {
            lane,
            recycled,
            settled: std::cell::Cell::new(0),
        }
    }
}

impl Drop for OwnLane {
    fn drop(&mut self) {
        // Thread-locals dropped after this one may still free on the per-thread stream: they take
        // the exiting lane (see `settle_late_free`), never the lane given back.
        let _ = GAVE_BACK.try_with(|g| g.set(true));
        let _ = CACHE.try_with(SlotCache::clear);
        FREE_OWN_LANES.lock().push(self.lane);
    }
}

/// A per-thread lane no thread had: past the shared lanes.
fn fresh_own_lane() -> u32 {
    LANES.saturating_add(NEXT_THREAD.fetch_add(1, Ordering::Relaxed))
}

/// The per-thread default stream's lane of threads whose own lane was given back as they exit,
/// shared by them: every block freed into it was waited for first (`settle_late_free`).
const EXITING_LANE: u32 = u32::MAX;

thread_local! {
    /// Set once this thread's per-thread lane was given back (no destructor: readable to the end).
    static GAVE_BACK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static LANE: u32 = NEXT_LANE.fetch_add(1, Ordering::Relaxed) % LANES;
    /// This thread's lane of the per-thread default stream: its own, past the shared lanes.
    static OWN_LANE: OwnLane = OwnLane::take();
    /// ((resource's arenas, stream), slot) of the streams this thread used last.
    static CACHE: SlotCache<(u64, RawStream), 8> = const { SlotCache::new() };
}

static NEXT_REGISTRY: AtomicU64 = AtomicU64::new(1);
/// Marks the thread cache's key of a stream's shared arena (registry ids stay far below it).
const SHARED_KEY: u64 = 1 << 63;

/// One arena's slot, boxed so that an unused slot costs a pointer, not an arena.
type Slot<A> = OnceLock<Box<A>>;

/// The arenas of one resource, one per stream.
pub(crate) struct StreamArenas<A> {
    id: u64,
    /// Slots `0..FIRST`: the fast path's.
    first: [Slot<A>; FIRST],
    /// Slots `FIRST..MAX_ARENAS`, a segment of [`FIRST`] each, made on first use.
    rest: GroupedSlots<Slot<A>, FIRST, SEGMENTS>,
    /// (stream, lane) → slot.
    index: Mutex<HashMap<(RawStream, u32), u32>>,
}

/// Before a thread's first allocation on `device` through its per-thread default stream: if its
/// lane was an exited thread's, waits for the device, so that blocks that thread freed on its
/// stream (reused at once by the lane's arenas, as a stream's own) are no longer in use.
pub(crate) fn settle_own_lane(device: Device) -> Result<()> {
    if gave_back() {
        return Ok(());
    }
    let Ok((recycled, settled)) = OWN_LANE.try_with(|l| (l.recycled, l.settled.get())) else {
        return Ok(());
    };
    let bit = 1u64.checked_shl(device.ordinal()).unwrap_or(0);
    if !recycled || settled & bit != 0 {
        return Ok(());
    }
    device.synchronize()?;
    let _ = OWN_LANE.try_with(|l| l.settled.set(settled | bit));
    Ok(())
}

/// Before a free on the per-thread default stream by a thread that gave its lane back (a
/// thread-local dropped late as the thread exits): waits for the device, so that the block, freed
/// into the exiting lane other exiting threads share, is no longer in use.
pub(crate) fn settle_late_free(device: Device) -> Result<()> {
    if !gave_back() {
        return Ok(());
    }
    device.synchronize()
}

fn gave_back() -> bool {
    GAVE_BACK.with(std::cell::Cell::get)
}

/// Waits for `stream`, or for the whole device if the backend cannot vouch the stream exists or it
/// is a per-thread default stream (which this thread cannot name for another).
pub(crate) fn sync_stream_or_device(
    backend: &dyn crate::backend::Backend,
    dev: u32,
    stream: crate::backend::RawStream,
) -> Result<()> {
    if stream == StreamView::PER_THREAD.raw() {
        return backend.device_synchronize(dev);
    }
    let why = match backend.stream_synchronize_if_alive(dev, stream) {
        Ok(true) => return Ok(()),
        Ok(false) => "stream not known alive".to_string(),
        Err(e) => format!("stream wait failed ({e})"),
    };
    tracing::debug!(device = dev, stream, "{why}; synchronizing the device");
    backend.device_synchronize(dev)
}

impl<A> StreamArenas<A> {
    pub(crate) fn new() -> Self {
        StreamArenas {
            id: NEXT_REGISTRY.fetch_add(1, Ordering::Relaxed),
            first: [const { OnceLock::new() }; FIRST],
            rest: GroupedSlots::new(),
            index: Mutex::new(HashMap::new()),
        }
    }

    /// The calling thread's arena of `stream`, made with `make` on first use.
    #[inline]
    pub(crate) fn get(&self, stream: RawStream, make: impl FnOnce() -> A) -> Result<&A> {
        self.get_in(self.id, stream, None, make)
    }

    /// `stream`'s arena shared by all its threads (for the per-thread default stream, its own).
    #[inline]
    pub(crate) fn shared(&self, stream: RawStream, make: impl FnOnce() -> A) -> Result<&A> {
        if stream == PER_THREAD {
            return self.get(stream, make);
        }
        self.get_in(self.id | SHARED_KEY, stream, Some(0), make)
    }

    /// `stream`'s arena in `lane` (`None`: the thread's own), via the thread cache under `key`.
    #[inline]
    fn get_in(
        &self,
        key: u64,
        stream: RawStream,
        lane: Option<u32>,
        make: impl FnOnce() -> A,
    ) -> Result<&A> {
        let hit = CACHE.with(|c| c.get((key, stream)));
        if let Some(slot) = hit
            && let Some(a) = self.slot(slot as usize).and_then(OnceLock::get)
        {
            return Ok(&**a);
        }
        self.get_slow(key, stream, lane, make)
    }

    /// Slot `i`, `None` when its segment has not been made (or `i` is past the table).
    #[inline]
    fn slot(&self, i: usize) -> Option<&Slot<A>> {
        self.first.get(i).or_else(|| self.rest_slot(i))
    }

    #[cold]
    fn rest_slot(&self, i: usize) -> Option<&Slot<A>> {
        self.rest.get(i - FIRST)
    }

    /// [`Self::get_in`] past the thread's cache: the index, making the arena on first use.
    #[cold]
    fn get_slow(
        &self,
        key: u64,
        stream: RawStream,
        lane: Option<u32>,
        make: impl FnOnce() -> A,
    ) -> Result<&A> {
        let lane = match lane {
            Some(lane) => lane,
            // A thread that is exiting (its lane given back) takes the exiting lane.
            None if stream == PER_THREAD && gave_back() => EXITING_LANE,
            None if stream == PER_THREAD => OWN_LANE.try_with(|l| l.lane).unwrap_or(EXITING_LANE),
            None => LANE.with(|l| *l),
        };
        let slot = {
            let mut index = self.index.lock();
            let next = index.len();
            match index.get(&(stream, lane)) {
                Some(&s) => s,
                None => {
                    // Every slot below `MAX_ARENAS` exists (its segment made here); none past it.
                    let (first, rest) = (&self.first, &self.rest);
                    let made = first.get(next).or_else(|| rest.make(next - FIRST));
                    let Some(slot) = made else {
                        return Err(Error::invalid_argument(
                            "stream",
                            format!("{stream:#x} (arena number {})", next + 1),
                            format!(
                                "at most {MAX_ARENAS} arenas (distinct streams × up to {LANES} \
                                 threads each) per resource"
                            ),
                        ));
                    };
                    let _ = slot.set(Box::new(make()));
                    index.insert((stream, lane), next as u32);
                    next as u32
                }
            }
        };
        CACHE.with(|c| c.insert((key, stream), slot));
        self.slot(slot as usize)
            .and_then(OnceLock::get)
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
        (0..n).filter_map(|i| self.slot(i).and_then(OnceLock::get).map(|a| &**a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arenas_past_the_inline_slots_live_in_segments_and_every_one_is_found() {
        let arenas: StreamArenas<usize> = StreamArenas::new();
        let n = 3 * FIRST + 7;
        for i in 0..n {
            let stream = 0x1000 + i as RawStream;
            assert_eq!(*arenas.get(stream, || i).unwrap(), i);
        }
        assert_eq!(arenas.rest.made(), 3);
        // Each stream finds its own arena again, whether or not the thread's cache holds it.
        for i in (0..n).rev() {
            let stream = 0x1000 + i as RawStream;
            assert_eq!(*arenas.get(stream, || usize::MAX).unwrap(), i);
        }
        assert_eq!(
            arenas.all().copied().collect::<Vec<_>>(),
            (0..n).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_fresh_table_makes_no_segment() {
        let arenas: StreamArenas<usize> = StreamArenas::new();
        for i in 0..FIRST {
            arenas.get(0x10 + i as RawStream, || i).unwrap();
        }
        assert_eq!(arenas.rest.made(), 0);
        assert_eq!(arenas.all().count(), FIRST);
    }

    #[test]
    fn the_arena_past_the_last_slot_is_refused_with_the_bound() {
        let arenas: StreamArenas<usize> = StreamArenas::new();
        for i in 0..MAX_ARENAS {
            arenas.get(0x10 + i as RawStream, || i).unwrap();
        }
        let err = arenas
            .get(0x10 + MAX_ARENAS as RawStream, || 0)
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&format!("arena number {}", MAX_ARENAS + 1)),
            "{text}"
        );
        assert!(
            text.contains(&format!("at most {MAX_ARENAS} arenas")),
            "{text}"
        );
        // Those made before still serve.
        assert_eq!(
            *arenas
                .get(0x10 + (MAX_ARENAS - 1) as RawStream, || 0)
                .unwrap(),
            MAX_ARENAS - 1
        );
    }
}
