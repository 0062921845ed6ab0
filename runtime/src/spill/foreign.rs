//! Adopted values: device memory another library owns (a CuPy array, a PyTorch tensor, a Dask
//! task result) kept under the spill manager's limit.
//!
//! An adopted value stays put, counted once per allocation, in the manager's
//! least-recently-used order. Spilling copies each allocation into a [`SpillableBuffer`] off
//! the device, then drops its [`ForeignOwner`], freeing the memory. It is then spilled data
//! like any other, but never changes: brought back, its buffers keep their host copies, so
//! spilling again copies nothing (like a swap slot). A task writing into a value it was given
//! would lose the write at the next spill (Dask never writes values in place). A value in use
//! is never spilled; a failed copy leaves it as it was.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use rmm_allocator::backend::DevicePtr;
use rmm_allocator::spill::{SharedDeviceGuard, SpillObserver, SpillStep, SpillableBuffer, Tier};
use rmm_allocator::{Result, StreamView};

use super::statistics::clock_ns;
use super::tracker::{Spillable, Tracker};

/// Keeps an adopted value's device memory alive; dropping it gives the memory back.
pub trait ForeignOwner: Send + Sync {
    /// True while something besides the spill manager uses the memory (a running task): no spill.
    fn is_in_use(&self) -> bool;
}

enum State<O> {
    /// On the device, in the owner's memory.
    Device(O),
    /// Copied off the device: one buffer per allocation.
    Spilled(Vec<Arc<SpillableBuffer>>),
}

/// Adopted ids have the top bit set, so they never meet buffer ids in the order.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// An adopted value ([`SpillManager::adopt`](super::SpillManager::adopt)); drop drops its owner.
pub struct ForeignData<O: ForeignOwner> {
    id: u64,
    allocations: Vec<(DevicePtr, usize)>,
    size: usize,
    stream: StreamView,
    tracker: Arc<Tracker>,
    store: Arc<rmm_allocator::spill::SpillStore>,
    state: Mutex<State<O>>,
}

/// What [`ForeignData::owner`] found.
#[derive(Debug)]
pub enum OwnerAccess<R> {
    /// On the device, in its owner's memory: what the closure returned.
    Device(R),
    /// Spilled: its data is in buffers ([`ForeignData::device_views`]).
    Spilled,
    /// A move is in progress; wait ([`ForeignData::wait`]) and ask again.
    Busy,
}

impl<O: ForeignOwner + 'static> ForeignData<O> {
    pub(crate) fn adopt(
        tracker: &Arc<Tracker>,
        store: &Arc<rmm_allocator::spill::SpillStore>,
        allocations: &[(DevicePtr, usize)],
        stream: StreamView,
        owner: O,
    ) -> Arc<ForeignData<O>> {
        // One value viewing the same allocation twice holds it once.
        let mut distinct: Vec<(DevicePtr, usize)> = Vec::with_capacity(allocations.len());
        for &(ptr, size) in allocations {
            match distinct.iter_mut().find(|(p, _)| *p == ptr) {
                Some(a) => a.1 = a.1.max(size),
                None => distinct.push((ptr, size)),
            }
        }
        let data = Self::new(tracker, store, distinct, stream, State::Device(owner));
        tracker.hold_foreign(&data.allocations);
        tracker.lru.lock().insert(data.id, &data, None);
        data
    }

    /// A value that arrived already off its owner as `buffers`
    /// ([`SpillManager::receive`](super::SpillManager::receive)); its allocations are the
    /// buffers' sizes at address 0.
    pub(crate) fn received(
        tracker: &Arc<Tracker>,
        store: &Arc<rmm_allocator::spill::SpillStore>,
        buffers: Vec<Arc<SpillableBuffer>>,
        stream: StreamView,
    ) -> Arc<ForeignData<O>> {
        // Written once on arrival, only read from now on (see `spill`).
        buffers.iter().for_each(|b| b.set_read_only());
        let allocations = buffers.iter().map(|b| (DevicePtr(0), b.size())).collect();
        Self::new(tracker, store, allocations, stream, State::Spilled(buffers))
    }

    fn new(
        tracker: &Arc<Tracker>,
        store: &Arc<rmm_allocator::spill::SpillStore>,
        allocations: Vec<(DevicePtr, usize)>,
        stream: StreamView,
        state: State<O>,
    ) -> Arc<ForeignData<O>> {
        Arc::new(ForeignData {
            id: (1 << 63) | NEXT_ID.fetch_add(1, Ordering::Relaxed),
            size: allocations.iter().map(|a| a.1).sum(),
            allocations,
            stream,
            tracker: Arc::clone(tracker),
            store: Arc::clone(store),
            state: Mutex::new(state),
        })
    }

    /// Device bytes of the value's distinct allocations.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The value's distinct allocations: (device address, bytes).
    pub fn allocations(&self) -> &[(DevicePtr, usize)] {
        &self.allocations
    }

    /// Each allocation's device address now, without waiting or pinning (the owner's, or a
    /// buffer's back on the device); `None` off the device or moving.
    pub fn device_allocations(&self) -> Vec<Option<(DevicePtr, usize)>> {
        let Some(state) = self.state.try_lock() else {
            return vec![None; self.allocations.len()];
        };
        match &*state {
            State::Device(_) => self.allocations.iter().copied().map(Some).collect(),
            State::Spilled(buffers) => buffers
                .iter()
                .map(|b| b.device_ptr().map(|p| (p, b.size())))
                .collect(),
        }
    }

    /// The device while the owner holds the data (or every buffer is back), disk when every
    /// buffer is there, else the host.
    pub fn tier(&self) -> Tier {
        let Some(state) = self.state.try_lock() else {
            // Moving: on the device until the move ends.
            return Tier::Device;
        };
        match &*state {
            State::Device(_) => Tier::Device,
            State::Spilled(buffers) => [Tier::Device, Tier::Disk]
                .into_iter()
                .find(|&t| buffers.iter().all(|b| b.tier() == t))
                .unwrap_or(Tier::Host),
        }
    }

    /// Waits for background spilling ([`SpillManager::settle`](super::SpillManager::settle)).
    pub fn settle(&self) {
        self.tracker.background.settle();
    }

    /// True once spilled (the owner is gone; the data lives in buffers).
    pub fn is_spilled(&self) -> bool {
        matches!(self.owner(|_| ()), OwnerAccess::Spilled)
    }

    /// Runs `f` with the owner while in its memory, not waiting for a move ([`OwnerAccess`]).
    pub fn owner<R>(&self, f: impl FnOnce(&O) -> R) -> OwnerAccess<R> {
        match self.state.try_lock() {
            None => OwnerAccess::Busy,
            Some(state) => match &*state {
                State::Device(owner) => OwnerAccess::Device(f(owner)),
                State::Spilled(_) => OwnerAccess::Spilled,
            },
        }
    }

    /// Waits until no move is in progress.
    pub fn wait(&self) {
        drop(self.state.lock());
    }

    /// Marks the value as used now (least recently used values spill first).
    pub fn touch(&self) {
        self.tracker.touched(self.id);
        if let Some(state) = self.state.try_lock()
            && let State::Spilled(buffers) = &*state
        {
            buffers.iter().for_each(|b| self.tracker.touched(b.id()));
        }
    }

    /// Tells when the value is next read: `next` is a position (smaller: sooner; a Dask task's
    /// priority, say), `None` when nothing is known to read it again. Values nothing reads again
    /// spill first (least recently used first), then those read furthest ahead, then values
    /// never told (least recently used first).
    pub fn set_next_use(&self, next: Option<u64>) {
        let mut ids = vec![self.id];
        if let Some(state) = self.state.try_lock()
            && let State::Spilled(buffers) = &*state
        {
            ids.extend(buffers.iter().map(|b| b.id()));
        }
        let mut lru = self.tracker.lru.lock();
        ids.into_iter().for_each(|id| lru.set_next_use(id, next));
    }

    /// Device views of a spilled value's buffers in [`allocations`](Self::allocations) order,
    /// each brought back (for `stream`) and kept there while its view lives; `None` while in the
    /// owner's memory.
    ///
    /// # Errors
    /// Bringing data back failed; the data stays where it was.
    pub fn device_views(&self, stream: StreamView) -> Result<Option<Vec<SharedDeviceGuard>>> {
        self.spilled_buffers()
            .map(|b| b.iter().map(|b| b.shared_device_view(stream)).collect())
            .transpose()
    }

    /// [`device_views`](Self::device_views) for sending: bytes brought back count as
    /// [`SpillStatistics::unspilled_to_send_bytes`](super::SpillStatistics), which sending
    /// from the tier ([`spilled_bytes`](Self::spilled_bytes)) avoids.
    ///
    /// # Errors
    /// As [`device_views`](Self::device_views).
    pub fn device_views_to_send(
        &self,
        stream: StreamView,
    ) -> Result<Option<Vec<SharedDeviceGuard>>> {
        let off_device: usize = self
            .device_allocations()
            .iter()
            .zip(&self.allocations)
            .filter(|(now, _)| now.is_none())
            .map(|(_, (_, n))| n)
            .sum();
        let views = self.device_views(stream)?;
        if views.is_some() {
            self.tracker
                .unspilled_to_send
                .fetch_add(off_device as u64, Ordering::Relaxed);
        }
        Ok(views)
    }

    /// Runs `f` with the allocations `(address, bytes)` while in the owner's memory, keeping the
    /// value there until `f` returns; `None` once spilled.
    pub fn with_own_memory<R>(&self, f: impl FnOnce(&[(DevicePtr, usize)]) -> R) -> Option<R> {
        match &*self.state.lock() {
            State::Device(_) => Some(f(&self.allocations)),
            State::Spilled(_) => None,
        }
    }

    /// The spilled data's buffers, one per allocation (readable with
    /// [`SpillableBuffer::read_into`] without moving); `None` while in the owner's memory.
    pub fn spilled_buffers(&self) -> Option<Vec<Arc<SpillableBuffer>>> {
        match &*self.state.lock() {
            State::Device(_) => None,
            State::Spilled(buffers) => Some(buffers.clone()),
        }
    }

    /// Copies of the spilled data, one per allocation; `None` while in the owner's memory.
    ///
    /// # Errors
    /// A failed copy or file read.
    pub fn spilled_bytes(&self) -> Result<Option<Vec<Vec<u8>>>> {
        self.spilled_buffers()
            .map(|b| b.iter().map(|b| b.to_vec()).collect())
            .transpose()
    }

    /// Copies the allocations off the device, then drops the owner; once spilled, spills its
    /// buffers that came back and are idle. Returns the device bytes no value holds any more (0
    /// when in use, busy or off the device).
    ///
    /// # Errors
    /// A failed copy, or a full host tier without disk: the value stays as it was.
    pub fn spill(&self) -> Result<usize> {
        let Some(mut state) = self.state.try_lock() else {
            return Ok(0);
        };
        let owner = match &*state {
            State::Device(owner) => owner,
            State::Spilled(buffers) => {
                let buffers = buffers.clone();
                drop(state);
                return buffers.iter().map(|b| b.spill()).sum();
            }
        };
        if owner.is_in_use() {
            return Ok(0);
        }
        let staged = Arc::new(Staged {
            tracker: Arc::clone(&self.tracker),
            held: Mutex::new(Some(Vec::new())),
        });
        let observer = Some(Arc::clone(&staged) as Arc<dyn SpillObserver>);
        let buffers = self
            .allocations
            .iter()
            .map(|&(ptr, size)| {
                SpillableBuffer::from_device(&self.store, ptr, size, self.stream, observer.clone())
            })
            .collect::<Result<Vec<_>>>()?;
        // All copied: the moves count now (a failed spill dropped its copies, moving nothing).
        staged.commit();
        // Only read from now on: brought back, it keeps its host copy.
        buffers.iter().for_each(|b| b.set_read_only());
        {
            // The buffers take the value's place in the order.
            let mut lru = self.tracker.lru.lock();
            let place = lru.remove(self.id);
            for b in &buffers {
                lru.insert(b.id(), b, place);
            }
        }
        let old = std::mem::replace(&mut *state, State::Spilled(buffers));
        let freed = self.tracker.release_foreign(&self.allocations);
        // Drop the owner without the lock: it may take others (an interpreter lock, its allocator).
        drop(state);
        drop(old);
        tracing::debug!(
            target: "rmm::spill",
            id = self.id,
            bytes = self.size,
            freed,
            "adopted value spilled"
        );
        Ok(freed)
    }
}

/// Held-back moves off the device: (from, to, bytes, nanos, end on `clock_ns`'s clock).
type HeldMoves = Vec<(Tier, Tier, usize, u64, u64)>;

/// The spilled value's buffers' observer: the tracker, but the spill's moves are held back
/// until all is copied, so a spill failing part way counts none.
struct Staged {
    tracker: Arc<Tracker>,
    /// Moves reported while the spill runs; `None` once it completed.
    held: Mutex<Option<HeldMoves>>,
}

impl Staged {
    /// The spill completed: its moves count, and later ones go straight to the tracker.
    fn commit(&self) {
        let held = self.held.lock().take().unwrap_or_default();
        for (from, to, bytes, nanos, end) in held {
            self.tracker.moves[from as usize][to as usize].add_at(bytes, nanos, end);
        }
    }
}

impl SpillObserver for Staged {
    fn touched(&self, id: u64) {
        self.tracker.touched(id);
    }
    fn make_room(&self, id: u64, bytes: usize) {
        self.tracker.make_room(id, bytes);
    }
    fn make_host_room(&self, id: u64, bytes: usize) -> Result<()> {
        self.tracker.make_host_room(id, bytes)
    }
    fn resident(&self, id: u64, delta: i64) {
        self.tracker.resident(id, delta);
    }
    fn spilled_without_copy(&self, id: u64, bytes: usize, nanos: u64) {
        self.tracker.spilled_without_copy(id, bytes, nanos);
    }
    fn reclaim_host(&self, id: u64, bytes: usize) {
        self.tracker.reclaim_host(id, bytes);
    }
    fn moved(&self, id: u64, from: Tier, to: Tier, bytes: usize, nanos: u64) {
        match &mut *self.held.lock() {
            Some(held) => held.push((from, to, bytes, nanos, clock_ns())),
            None => self.tracker.moved(id, from, to, bytes, nanos),
        }
    }
    fn dropped(&self, id: u64) {
        self.tracker.dropped(id);
    }
    fn released(&self, id: u64) {
        self.tracker.released(id);
    }
}

impl<O: ForeignOwner + 'static> Spillable for ForeignData<O> {
    fn size(&self) -> usize {
        self.size
    }
    fn tier(&self) -> Tier {
        // In the order only while on the device, in the owner's memory.
        Tier::Device
    }
    fn is_in_use(&self) -> bool {
        false
    }
    fn begin_spill(&self) -> Result<SpillStep<'_>> {
        // The whole move at once.
        Ok(match ForeignData::spill(self)? {
            0 => SpillStep::Skipped,
            n => SpillStep::Done(n),
        })
    }
    fn spill_to_disk(&self) -> Result<usize> {
        Ok(0)
    }
    fn unspill(&self, _stream: StreamView) -> Result<()> {
        Ok(())
    }
}

impl<O: ForeignOwner> Drop for ForeignData<O> {
    fn drop(&mut self) {
        self.tracker.lru.lock().remove(self.id);
        if matches!(self.state.get_mut(), State::Device(_)) {
            self.tracker.release_foreign(&self.allocations);
        }
    }
}

impl<O: ForeignOwner> std::fmt::Debug for ForeignData<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForeignData")
            .field("id", &self.id)
            .field("size", &self.size)
            .field("allocations", &self.allocations.len())
            .finish()
    }
}
