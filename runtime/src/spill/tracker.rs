//! What a device's spillable data reports to: the spill order (`Place`), device bytes against
//! the limit, moves per tier, and making room. The manager's [`SpillableBuffer`]s and adopted
//! values ([`ForeignData`](super::ForeignData)) share one order as [`Spillable`]s.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rmm_allocator::backend::DevicePtr;
use rmm_allocator::resource::PinnedHostPool;
use rmm_allocator::spill::{
    COPY_WINDOW, PendingSpill, SpillObserver, SpillStep, SpillStore, SpillableBuffer, Tier,
};
use rmm_allocator::{Result, StreamView};

use super::background::{Background, EnforceLimit};
use super::statistics::Moves;

/// An entry of the spill order: something whose device bytes can move off.
pub(crate) trait Spillable: Send + Sync {
    /// Device bytes it frees when spilled (its size).
    fn size(&self) -> usize;
    /// Where its data is now (without waiting for a move in progress).
    fn tier(&self) -> Tier;
    /// True while in use on the device (a cheap check; `begin_spill` may find more).
    fn is_in_use(&self) -> bool;
    /// Starts moving it off the device so several entries' copies overlap
    /// ([`SpillableBuffer::begin_spill`]); skipped when in use, busy or spilled.
    fn begin_spill(&self) -> Result<SpillStep<'_>>;
    /// Moves host data on to disk; the bytes moved.
    fn spill_to_disk(&self) -> Result<usize>;
    fn unspill(&self, stream: StreamView) -> Result<()>;
    /// The entry as a [`SpillableBuffer`] of the manager's own, if it is one.
    fn into_buffer(self: Arc<Self>) -> Option<Arc<SpillableBuffer>> {
        None
    }
    /// Drops a kept host copy of device data ([`SpillableBuffer::drop_kept_copy`]); the bytes.
    fn drop_kept_copy(&self) -> usize {
        0
    }
}

impl Spillable for SpillableBuffer {
    fn size(&self) -> usize {
        SpillableBuffer::size(self)
    }
    fn tier(&self) -> Tier {
        SpillableBuffer::tier(self)
    }
    fn is_in_use(&self) -> bool {
        SpillableBuffer::is_in_use(self)
    }
    fn begin_spill(&self) -> Result<SpillStep<'_>> {
        SpillableBuffer::begin_spill(self)
    }
    fn spill_to_disk(&self) -> Result<usize> {
        SpillableBuffer::spill_to_disk(self)
    }
    fn unspill(&self, stream: StreamView) -> Result<()> {
        self.device_view(stream).map(drop)
    }
    fn into_buffer(self: Arc<Self>) -> Option<Arc<SpillableBuffer>> {
        Some(self)
    }
    fn drop_kept_copy(&self) -> usize {
        SpillableBuffer::drop_kept_copy(self)
    }
}

/// Where an entry stands in the spill order, first to spill first: entries nothing is known to
/// read again, least recently used first; then entries whose next use is known (a task that will
/// read them), furthest first; then the rest, least recently used first (all entries, unless
/// their owner tells next uses). Under a limit smaller than what a shuffle reads in turn, least
/// recently used alone spills just what is read next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Place {
    /// Nothing is known to read it again; last used at this tick.
    Done(u64),
    /// Next read at this position (smaller: sooner).
    NextUse(Reverse<u64>),
    /// Last used at this tick, no next use told.
    Used(u64),
}

/// The spill order of entries, first to spill first; a spilled value's buffers share its place.
#[derive(Default)]
pub(crate) struct Lru {
    next: u64,
    order: BTreeSet<(Place, u64)>,
    /// Id → (place, entry).
    entries: HashMap<u64, (Place, Weak<dyn Spillable>)>,
}

impl Lru {
    fn tick(&mut self) -> u64 {
        let t = self.next;
        self.next += 1;
        t
    }

    /// Adds `entry` at `place` (used now, when `None`).
    pub(crate) fn insert<S: Spillable + 'static>(
        &mut self,
        id: u64,
        entry: &Arc<S>,
        place: Option<Place>,
    ) {
        let entry: Weak<dyn Spillable> = Arc::<S>::downgrade(entry);
        let place = place.unwrap_or_else(|| Place::Used(self.tick()));
        if let Some((old, _)) = self.entries.insert(id, (place, entry)) {
            self.order.remove(&(old, id));
        }
        self.order.insert((place, id));
    }

    /// Removes `id`; its place, if it was there.
    pub(crate) fn remove(&mut self, id: u64) -> Option<Place> {
        let (place, _) = self.entries.remove(&id)?;
        self.order.remove(&(place, id));
        Some(place)
    }

    /// Moves `id` to `place`.
    fn place(&mut self, id: u64, place: Place) {
        if let Some(e) = self.entries.get_mut(&id) {
            let old = std::mem::replace(&mut e.0, place);
            self.order.remove(&(old, id));
            self.order.insert((place, id));
        }
    }

    /// `id` was used now (an entry whose next use is known stays where that puts it).
    fn touch(&mut self, id: u64) {
        let done = match self.entries.get(&id).map(|e| e.0) {
            Some(Place::Used(_)) => false,
            Some(Place::Done(_)) => true,
            _ => return,
        };
        let tick = self.tick();
        self.place(
            id,
            if done {
                Place::Done(tick)
            } else {
                Place::Used(tick)
            },
        );
    }

    /// `id` is next read at position `next` (smaller: sooner), or by nothing known (`None`).
    pub(crate) fn set_next_use(&mut self, id: u64, next: Option<u64>) {
        let place = match next {
            Some(n) => Place::NextUse(Reverse(n)),
            None => Place::Done(self.tick()),
        };
        self.place(id, place);
    }
}

#[derive(Default)]
pub(crate) struct Tracker {
    pub(crate) lru: Mutex<Lru>,
    pub(crate) limit: AtomicU64,
    pub(crate) tracked: AtomicI64,
    pub(crate) peak: AtomicI64,
    /// Moves by (from, to) tier: `moves[from as usize][to as usize]`.
    pub(crate) moves: [[Moves; 3]; 3],
    /// The store whose tiers data spills to (host data moves on to disk if it has a disk tier).
    pub(crate) store: Option<Arc<SpillStore>>,
    /// Adopted allocations on the device: address → (bytes, values holding it), counted once.
    pub(crate) foreign: Mutex<HashMap<u64, (usize, usize)>>,
    /// The limit enforced off the adopting thread.
    pub(crate) background: Background,
    /// Room is made on [`background`](Self::background) only, after data arrives
    /// ([`SpillManager::make_room_in_background`](super::SpillManager::make_room_in_background)).
    pub(crate) room_in_background: AtomicBool,
    /// This tracker, for the background thread (set when made in an `Arc`).
    pub(crate) me: Weak<Tracker>,
    /// Received values' bytes: `[put on the device, kept off it]`.
    pub(crate) received: [AtomicU64; 2],
    /// Bytes brought back to the device only to be sent elsewhere.
    pub(crate) unspilled_to_send: AtomicU64,
    /// Moves off the device that copied nothing (a kept copy became the data): `[count, bytes]`.
    pub(crate) without_copy: [AtomicU64; 2],
}

/// The most spills with copies in flight at once when making room.
pub(crate) const BATCH_ENTRIES: usize = 64;
/// The most bytes a batch keeps enqueued (each copy counting at most [`COPY_WINDOW`]): enough
/// to keep the copy engine busy while host memory is pinned for the next entries, and a bound
/// on what a task's own copies wait behind.
pub(crate) const BATCH_ENQUEUED: u64 = 8 * COPY_WINDOW as u64;
/// The most that enforcing the limit spills beyond the excess.
pub(crate) const SLACK_MAX: u64 = 1 << 30;

/// What enforcing the limit spills beyond the excess: 1/32 of the limit, at most
/// [`SLACK_MAX`]. One buffer at a time, a device making data stalls on each copy's start-up
/// (and host pinning in between); a few at once run at the copy engine's rate.
pub(crate) fn limit_slack(limit: i64) -> i64 {
    (limit / 32).clamp(0, SLACK_MAX as i64)
}

/// Rolling batch of spills: entries start while under [`BATCH_ENTRIES`] in flight and
/// [`BATCH_ENQUEUED`] enqueued, the oldest finishing to make way, so small buffers move at the
/// copy engine's rate, not a round trip each, and the queue never runs dry between batches.
#[derive(Default)]
pub(crate) struct SpillBatch<'a> {
    pending: VecDeque<Box<PendingSpill<'a>>>,
    pending_bytes: u64,
    /// Bytes of the pending entries' copies enqueued (each at most [`COPY_WINDOW`]).
    enqueued: u64,
    /// End of the last finished entry, and host-memory waits since (pinning is not copying).
    last_end: Option<Instant>,
    host_waits: Duration,
    /// Device bytes freed so far.
    pub(crate) freed: u64,
    /// The first error met (the other entries went on).
    pub(crate) first_error: Option<rmm_allocator::Error>,
}

impl<'a> SpillBatch<'a> {
    /// Bytes freed and in flight.
    pub(crate) fn bytes(&self) -> u64 {
        self.freed + self.pending_bytes
    }

    /// Adds one entry's started spill; finishes the oldest while too much is in flight.
    pub(crate) fn add(&mut self, step: Result<SpillStep<'a>>, size: usize) {
        match step {
            Ok(SpillStep::Skipped) => {}
            Ok(SpillStep::Done(n)) => self.record(Ok(n), size),
            Ok(SpillStep::Pending(p)) => {
                // The first entry's own wait came before its copy started.
                if !self.pending.is_empty() || self.last_end.is_some() {
                    self.host_waits += p.host_wait();
                }
                self.pending_bytes += p.size() as u64;
                self.enqueued += p.size().min(COPY_WINDOW) as u64;
                self.pending.push_back(p);
                while self.pending.len() >= BATCH_ENTRIES || self.enqueued >= BATCH_ENQUEUED {
                    self.finish_oldest();
                }
            }
            Err(e) => self.record(Err(e), size),
        }
    }

    /// Counts an entry's freed bytes, or keeps its error if the first (the others go on).
    fn record(&mut self, freed: Result<usize>, size: usize) {
        match freed {
            Ok(n) => self.freed += n as u64,
            Err(e) => {
                tracing::debug!("an entry of {size} bytes could not be spilled: {e}");
                self.first_error.get_or_insert(e);
            }
        }
    }

    /// Finishes the oldest spill in flight. Each move's time runs from the previous one's end,
    /// so a batch's moves add up to its wall time, less host-memory waits.
    fn finish_oldest(&mut self) {
        let Some(p) = self.pending.pop_front() else {
            return;
        };
        let since = self.last_end.unwrap_or_else(|| p.started()) + self.host_waits;
        self.host_waits = Duration::ZERO;
        let size = p.size();
        self.pending_bytes -= size as u64;
        self.enqueued -= size.min(COPY_WINDOW) as u64;
        self.record(p.finish(Some(since)), size);
        self.last_end = Some(Instant::now());
    }

    pub(crate) fn complete(&mut self) {
        while !self.pending.is_empty() {
            self.finish_oldest();
        }
    }
}

impl Tracker {
    /// Live entries in spill order, first to go first (not `except`), collected under the lock and
    /// examined after (a moving entry's owner holds its lock while asking for room).
    pub(crate) fn oldest_first(&self, except: Option<u64>) -> Vec<Arc<dyn Spillable>> {
        let lru = self.lru.lock();
        lru.order
            .iter()
            .filter(|(_, id)| Some(*id) != except)
            .filter_map(|(_, id)| lru.entries.get(id).and_then(|(_, w)| w.upgrade()))
            .collect()
    }

    /// Spills entries in spill order (not `except`) in a [`SpillBatch`] until `need` bytes
    /// are freed or nothing can go; returns the bytes freed.
    pub(crate) fn spill_oldest(&self, need: u64, except: Option<u64>) -> Result<u64> {
        let entries = self.oldest_first(except);
        let mut batch = SpillBatch::default();
        for b in &entries {
            if batch.bytes() >= need {
                break;
            }
            // Skip entries in use, busy or spilled without waiting; a failure skips one entry.
            if b.tier() != Tier::Device || b.is_in_use() {
                continue;
            }
            batch.add(b.begin_spill(), b.size());
        }
        batch.complete();
        match batch.first_error {
            Some(e) if batch.freed < need => Err(e),
            _ => Ok(batch.freed),
        }
    }

    /// Device bytes tracked beyond the limit (negative: the room left).
    pub(crate) fn excess(&self) -> i64 {
        self.tracked.load(Ordering::Relaxed) - self.limit.load(Ordering::Relaxed) as i64
    }

    pub(crate) fn has_room(&self, bytes: usize) -> bool {
        self.excess() + bytes as i64 <= 0
    }

    pub(crate) fn is_over_limit(&self) -> bool {
        self.excess() > 0
    }

    /// Spills entries in spill order (not `except`) while over the limit with `bytes` more,
    /// plus [`limit_slack`] when room is made on the caller's thread, so a device making data
    /// spills in batches, as Dask workers spill to a target below their threshold.
    pub(crate) fn enforce_limit(&self, except: Option<u64>, bytes: usize) {
        let over = self.excess() + bytes as i64;
        let slack = if self.room_in_background.load(Ordering::Relaxed) {
            0
        } else {
            limit_slack(self.limit.load(Ordering::Relaxed) as i64)
        };
        if over > 0
            && let Err(e) = self.spill_oldest((over + slack) as u64, except)
        {
            // The allocation goes ahead; if the device is really full it fails on its own.
            tracing::warn!(
                "spilling to keep the device under its spill limit ({bytes} bytes more asked \
                 for): {e}"
            );
        }
    }

    /// True when `host` can hand out `need` bytes (in slices of at most its largest).
    fn host_fits(host: &PinnedHostPool, need: usize) -> bool {
        let contiguous = need.min(host.max_slice());
        host.free() >= need && host.largest_free() >= contiguous
    }

    pub(crate) fn drop_all_kept_copies(&self) {
        // Entries off the device have no kept copy: dropping one gives back 0.
        for b in self.oldest_first(None) {
            b.drop_kept_copy();
        }
    }

    /// Drops kept host copies of device data, oldest first (not `except`'s), until `host` can
    /// hand out `need` bytes; true when it can.
    fn drop_kept_copies(&self, host: &PinnedHostPool, need: usize, except: u64) -> bool {
        if Self::host_fits(host, need) {
            return true;
        }
        for b in self.oldest_first(Some(except)) {
            if Self::host_fits(host, need) || host.reclaimable() == 0 {
                break;
            }
            if b.tier() == Tier::Device {
                b.drop_kept_copy();
            }
        }
        Self::host_fits(host, need)
    }

    /// Moves the oldest host data (not `except`'s) to disk until `host` can hand out `need`
    /// bytes; returns the bytes moved. A failed write's error counts only if that falls short.
    fn demote_oldest(&self, host: &PinnedHostPool, need: usize, except: u64) -> Result<u64> {
        let mut moved = 0;
        let mut first_error = None;
        for b in self.oldest_first(Some(except)) {
            if Self::host_fits(host, need) {
                break;
            }
            if b.tier() == Tier::Host {
                match b.spill_to_disk() {
                    Ok(n) => moved += n as u64,
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        match first_error {
            Some(e) if !Self::host_fits(host, need) => Err(e),
            _ => Ok(moved),
        }
    }

    /// Counts adopted `allocations` as on the device, each once.
    pub(crate) fn hold_foreign(&self, allocations: &[(DevicePtr, usize)]) {
        let mut foreign = self.foreign.lock();
        let mut added = 0;
        for &(ptr, size) in allocations {
            let e = foreign.entry(ptr.addr()).or_insert((size, 0));
            e.1 += 1;
            if e.1 == 1 {
                added += e.0;
            }
        }
        drop(foreign);
        self.resident(0, added as i64);
    }

    /// Undoes [`hold_foreign`](Self::hold_foreign) for a value whose data left or was dropped;
    /// returns the bytes no value holds any more.
    pub(crate) fn release_foreign(&self, allocations: &[(DevicePtr, usize)]) -> usize {
        let mut foreign = self.foreign.lock();
        let mut freed = 0;
        for &(ptr, _) in allocations {
            if let Some(e) = foreign.get_mut(&ptr.addr()) {
                e.1 -= 1;
                if e.1 == 0 {
                    freed += e.0;
                    foreign.remove(&ptr.addr());
                }
            }
        }
        drop(foreign);
        self.resident(0, -(freed as i64));
        freed
    }

    /// Entries with data on the device, host and disk now.
    pub(crate) fn counts(&self) -> [u64; 3] {
        let mut counts = [0; 3];
        for e in self.oldest_first(None) {
            counts[e.tier() as usize] += 1;
        }
        counts
    }
}

impl EnforceLimit for Tracker {
    fn enforce_limit_now(&self) {
        self.enforce_limit(None, 0);
    }
}

impl SpillObserver for Tracker {
    fn touched(&self, id: u64) {
        self.lru.lock().touch(id);
    }

    fn make_room(&self, id: u64, bytes: usize) {
        // In background mode room is made after the bytes arrive (`resident`), so the copy back
        // and the spill overlap, one copy engine each way.
        if !self.room_in_background.load(Ordering::Relaxed) {
            self.enforce_limit(Some(id), bytes);
        }
    }

    fn make_host_room(&self, id: u64, bytes: usize) -> Result<()> {
        let Some(tiers) = self.store.as_ref().map(|s| s.tiers()) else {
            return Ok(());
        };
        let host = tiers.host();
        // Data larger than a fixed pool goes straight to disk: making room would not help.
        if !host.is_growable() && bytes > host.capacity() {
            return Ok(());
        }
        // Dropping kept copies of device data first moves nothing.
        if self.drop_kept_copies(host, bytes, id) || !tiers.has_disk() {
            return Ok(());
        }
        self.demote_oldest(host, bytes, id)
            .map(drop)
            .inspect_err(|e| {
                tracing::warn!("moving host data to disk to make room for {bytes} bytes: {e}");
            })
    }

    fn resident(&self, _id: u64, delta: i64) {
        let now = self.tracked.fetch_add(delta, Ordering::Relaxed) + delta;
        self.peak.fetch_max(now, Ordering::Relaxed);
        if delta > 0
            && self.room_in_background.load(Ordering::Relaxed)
            && now > self.limit.load(Ordering::Relaxed) as i64
            && let Some(me) = self.me.upgrade()
        {
            self.background.request(&me);
        }
    }

    fn moved(&self, _id: u64, from: Tier, to: Tier, bytes: usize, nanos: u64) {
        self.moves[from as usize][to as usize].add(bytes, nanos);
    }

    fn reclaim_host(&self, id: u64, bytes: usize) {
        if let Some(store) = &self.store {
            self.drop_kept_copies(store.tiers().host(), bytes, id);
        }
    }

    fn spilled_without_copy(&self, _id: u64, bytes: usize, _nanos: u64) {
        self.without_copy[0].fetch_add(1, Ordering::Relaxed);
        self.without_copy[1].fetch_add(bytes as u64, Ordering::Relaxed);
    }

    fn dropped(&self, id: u64) {
        self.lru.lock().remove(id);
    }

    fn released(&self, _id: u64) {
        // Data held over the limit while in use may go now (background mode: on its thread).
        if self.room_in_background.load(Ordering::Relaxed) {
            if self.is_over_limit()
                && let Some(me) = self.me.upgrade()
            {
                self.background.request(&me);
            }
        } else {
            self.enforce_limit(None, 0);
        }
    }
}
