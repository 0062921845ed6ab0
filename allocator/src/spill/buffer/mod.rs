//! [`SpillableBuffer`]: device bytes that may move to pinned host memory, and on to disk,
//! while nobody uses them, and come back on the next use.
//!
//! Device access goes through a [`DeviceGuard`]: getting one brings the data back if it was
//! spilled (into the device's *current* resource, which after a `reinitialize` is the new
//! stack), and while a guard lives the buffer is never spilled. Host access goes through a
//! [`HostGuard`], which brings the data to the host tier and holds it there. A
//! [`SpillObserver`] (the runtime's spill manager) hears of every use and every move, and is
//! asked to make room before data comes back or lands on the host.
//!
//! Copies run on the store's copy streams, ordered after the work queued on the buffer's
//! stream, in chunks of at most one pinned slice, and are waited for before the source is
//! given back: a spill returns with the data safe in its new tier and the old memory freed;
//! a failed move leaves the buffer where it was, valid, and frees what the move took.
//!
//! A buffer whose data no longer changes ([`SpillableBuffer::set_read_only`]: a stored value
//! of a Dask worker, say) keeps its host copy when it comes back to the device, like a page
//! that swapping brought back keeps its swap slot: spilling it again frees its device memory
//! and copies nothing. The copy goes first when the host tier needs room
//! ([`SpillableBuffer::drop_kept_copy`]).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use parking_lot::{Mutex, MutexGuard};

mod copies;
mod elsewhere;
mod guard;
mod in_place;
mod kept;

pub use copies::{PendingSpill, SpillStep};
pub use in_place::HeldInPlace;

use super::disk::{DiskFile, DiskStore};
use super::store::SpillStore;
use crate::backend::DevicePtr;
use crate::backend::RawStream;
use crate::backend::host::PinnedSlice;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::per_device::get_per_device_resource;
use crate::resource::SharedResource;
use crate::stream::{Event, synchronize_stream};
use crate::stream_view::StreamView;
pub use guard::{DeviceGuard, HostGuard, SharedDeviceGuard};

/// Where a buffer's data is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Device memory.
    Device,
    /// The pinned host pool.
    Host,
    /// A file under `spill.disk_directory`.
    Disk,
}

impl Tier {
    fn from_u8(v: u8) -> Tier {
        match v {
            0 => Tier::Device,
            1 => Tier::Host,
            _ => Tier::Disk,
        }
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Device => "device",
            Tier::Host => "host",
            Tier::Disk => "disk",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Told by buffers what happens to them; the runtime's spill manager implements it.
pub trait SpillObserver: Send + Sync {
    /// Buffer `id` was used (least-recently-used order).
    fn touched(&self, id: u64);
    /// `bytes` are about to be allocated on the device for buffer `id`: spill others (not
    /// `id`) if that would take the tracked bytes over the limit.
    fn make_room(&self, id: u64, bytes: usize);
    /// The host tier has no room for `bytes` of buffer `id`: move other buffers' host data
    /// on to disk if there is a disk tier. Called with `id`'s own lock held.
    ///
    /// # Errors
    /// The failure that left no room: moving data on to disk failed (a full disk, say).
    fn make_host_room(&self, id: u64, bytes: usize) -> Result<()> {
        let _ = (id, bytes);
        Ok(())
    }
    /// Buffer `id` now holds `bytes` more (or, negative, fewer) bytes on the device.
    fn resident(&self, id: u64, delta: i64);
    /// Buffer `id` moved `bytes` from `from` to `to`; the copy (and file I/O) took `nanos`,
    /// not counting getting the destination memory (making room, pinning more host memory).
    fn moved(&self, id: u64, from: Tier, to: Tier, bytes: usize, nanos: u64);
    /// Buffer `id` needs `bytes` of the host tier: give back copies kept of data on the
    /// device ([`SpillableBuffer::drop_kept_copy`]) until they fit in memory already pinned,
    /// if that can be done. None by default.
    fn reclaim_host(&self, _id: u64, _bytes: usize) {}
    /// Buffer `id` left the device for the host tier without a copy, after `nanos`: its host
    /// copy was kept when it came back ([`SpillableBuffer::set_read_only`]).
    fn spilled_without_copy(&self, _id: u64, _bytes: usize, _nanos: u64) {}
    /// Buffer `id` is gone.
    fn dropped(&self, id: u64);
    /// The last device guard of buffer `id` is gone: it may be spilled again (data held over
    /// the limit while in use can go now).
    fn released(&self, _id: u64) {}
}

pub(super) enum State {
    /// On the device. `resource` made the memory and takes it back; `None` for memory the
    /// buffer only borrows while it copies it off the device ([`SpillableBuffer::from_device`]).
    Device {
        ptr: DevicePtr,
        resource: Option<SharedResource>,
        stream: StreamView,
        /// The same bytes in the host tier, kept from when a read-only buffer came back:
        /// spilling again only frees the device memory.
        kept: Option<Vec<PinnedSlice>>,
    },
    Host(Vec<PinnedSlice>),
    /// In a file of a disk tier, kept alive by the buffer (the store may have moved on to
    /// other tiers since).
    Disk(DiskFile, Arc<DiskStore>),
}

impl State {
    fn tier(&self) -> Tier {
        match self {
            State::Device { .. } => Tier::Device,
            State::Host(_) => Tier::Host,
            State::Disk(..) => Tier::Disk,
        }
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Device bytes that can be spilled to pinned host memory and disk. Share it with `Arc`; see
/// the module documentation.
pub struct SpillableBuffer {
    id: u64,
    pub(super) size: usize,
    store: Arc<SpillStore>,
    observer: Option<Arc<dyn SpillObserver>>,
    state: Mutex<State>,
    /// The state's tier, readable without the lock.
    tier: AtomicU8,
    /// Live device guards.
    pub(super) pins: AtomicUsize,
    /// Per stream the buffer was used on through a device guard, an event recorded as the
    /// guard let go: everything that used the data is ordered before these, so a spill's
    /// copy waits for them rather than for all the work queued on the stream since (a
    /// worker's next task). Empty until a guard lets go, and once the data leaves the device.
    pub(super) released_at: Mutex<Vec<(RawStream, Event)>>,
    /// Set when the data was lost to a copy that could not be waited for.
    lost: AtomicBool,
    /// Set once the data no longer changes: coming back keeps the host copy.
    read_only: AtomicBool,
}

impl fmt::Debug for SpillableBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpillableBuffer")
            .field("id", &self.id)
            .field("size", &self.size)
            .field("tier", &self.tier())
            .finish()
    }
}

/// Time since `start` in nanoseconds.
fn nanos_since(start: Instant) -> u64 {
    start.elapsed().as_nanos() as u64
}

impl SpillableBuffer {
    /// `size` uninitialized bytes on the store's device, from the device's current resource,
    /// used on `stream`; spilled data goes to `store`.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when the device's resource cannot allocate
    /// `size` bytes; [`Error::NoSuchDevice`](crate::Error::NoSuchDevice) (or the backend's error)
    /// when the device has no resource.
    pub fn new(
        store: &Arc<SpillStore>,
        size: usize,
        stream: StreamView,
        observer: Option<Arc<dyn SpillObserver>>,
    ) -> Result<Arc<SpillableBuffer>> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        if let Some(o) = &observer {
            o.make_room(id, size);
        }
        let resource = get_per_device_resource(store.device().ordinal())?;
        let ptr = resource.allocate(size, stream)?;
        if let Some(o) = &observer {
            o.resident(id, size as i64);
            o.touched(id);
        }
        Ok(Self::with_state(
            id,
            store,
            size,
            observer,
            State::Device {
                ptr,
                resource: Some(resource),
                stream,
                kept: None,
            },
        ))
    }

    /// A spilled copy of `size` device bytes at `ptr`, memory this buffer does not own (another
    /// library's allocation, say): the bytes are copied, after the work queued on `stream`, to
    /// the store's host tier (or to disk when the host tier is full and there is a disk tier),
    /// as a spill moves them, and the copy is complete when this returns. `ptr` must stay
    /// valid until then; the buffer never frees it. On use the data comes back into the
    /// device's current resource like any spilled buffer's.
    ///
    /// # Errors
    /// As [`spill`](Self::spill): a full host pool without a disk tier
    /// ([`Error::HostOutOfMemory`]), a failed copy or file write. Nothing is kept then.
    pub fn from_device(
        store: &Arc<SpillStore>,
        ptr: DevicePtr,
        size: usize,
        stream: StreamView,
        observer: Option<Arc<dyn SpillObserver>>,
    ) -> Result<Arc<SpillableBuffer>> {
        let buffer = Self::with_state(
            NEXT_ID.fetch_add(1, Ordering::Relaxed),
            store,
            size,
            observer,
            State::Device {
                ptr,
                resource: None,
                stream,
                kept: None,
            },
        );
        {
            let mut state = buffer.state.lock();
            buffer.spill_locked(&mut state)?;
        }
        Ok(buffer)
    }

    /// A buffer holding a copy of `bytes` (the copy is complete when this returns).
    ///
    /// # Errors
    /// As [`SpillableBuffer::new`]; [`Error::Driver`](crate::Error::Driver) when the copy fails.
    pub fn from_host(
        store: &Arc<SpillStore>,
        bytes: &[u8],
        stream: StreamView,
        observer: Option<Arc<dyn SpillObserver>>,
    ) -> Result<Arc<SpillableBuffer>> {
        let buffer = Self::new(store, bytes.len(), stream, observer)?;
        {
            let guard = buffer.device_view(stream)?;
            synchronize_stream(buffer.device(), stream)?;
            buffer.device().copy_to_device(guard.ptr(), bytes)?;
        }
        Ok(buffer)
    }

    /// A buffer `id` of `size` bytes in `state`, not yet used.
    fn with_state(
        id: u64,
        store: &Arc<SpillStore>,
        size: usize,
        observer: Option<Arc<dyn SpillObserver>>,
        state: State,
    ) -> Arc<SpillableBuffer> {
        Arc::new(SpillableBuffer {
            id,
            size,
            store: Arc::clone(store),
            observer,
            tier: AtomicU8::new(state.tier() as u8),
            state: Mutex::new(state),
            pins: AtomicUsize::new(0),
            released_at: Mutex::new(Vec::new()),
            lost: AtomicBool::new(false),
            read_only: AtomicBool::new(false),
        })
    }

    /// The buffer's identity (for the observer).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.store.device()
    }

    /// The store spilled data goes to.
    pub fn store(&self) -> &Arc<SpillStore> {
        &self.store
    }

    /// Where the data is now (without waiting for a move in progress).
    pub fn tier(&self) -> Tier {
        Tier::from_u8(self.tier.load(Ordering::Acquire))
    }

    /// True while the data is off the device.
    pub fn is_spilled(&self) -> bool {
        self.tier() != Tier::Device
    }

    /// The data's device address while it is on the device and not moving (without waiting
    /// or pinning it: it may move once this returns, unless a guard holds it).
    pub fn device_ptr(&self) -> Option<DevicePtr> {
        match &*self.state.try_lock()? {
            State::Device { ptr, .. } => Some(*ptr),
            _ => None,
        }
    }

    /// Drops one device guard's pin, after recording where the work of `stream` that used the
    /// data ends (see `released_at`); the last pin tells the observer the buffer may move
    /// again.
    pub(super) fn unpin(&self, stream: StreamView) {
        // Recorded before the pin goes: once the pins are gone a spill may start and read
        // the list. A failure empties the list, so the spill orders its copy after the whole
        // stream the buffer was last used on, as without it.
        let copies = self.store.copies();
        let mut released = self.released_at.lock();
        let replaced = released
            .iter()
            .position(|(s, _)| *s == stream.raw())
            .map(|i| released.swap_remove(i).1);
        let failed: Vec<Event> = match copies.event().and_then(|e| e.record(stream).map(|()| e)) {
            Ok(e) => {
                released.push((stream.raw(), e));
                Vec::new()
            }
            Err(e) => {
                tracing::debug!("recording where buffer {} was last used: {e}", self.id);
                released.drain(..).map(|(_, e)| e).collect()
            }
        };
        drop(released);
        replaced
            .into_iter()
            .chain(failed)
            .for_each(|e| copies.recycle(e));
        if self.pins.fetch_sub(1, Ordering::Release) == 1
            && let Some(o) = &self.observer
        {
            o.released(self.id);
        }
    }

    /// Gives the events of `released_at` back (the data leaves the device, or the buffer
    /// goes).
    fn forget_releases(&self) {
        let copies = self.store.copies();
        let events: Vec<Event> = self.released_at.lock().drain(..).map(|(_, e)| e).collect();
        events.into_iter().for_each(|e| copies.recycle(e));
    }

    /// The events a spill's copy of the data waits for instead of the buffer's whole stream
    /// (see `released_at`); empty when there are none.
    pub(super) fn release_events(&self) -> Vec<crate::backend::RawEvent> {
        self.released_at
            .lock()
            .iter()
            .map(|(_, e)| e.raw())
            .collect()
    }

    /// True while a device guard is alive.
    pub fn is_in_use(&self) -> bool {
        self.pins.load(Ordering::Acquire) > 0
    }

    /// The data on the device for use on `stream`, brought back first if it was spilled
    /// (into the device's current resource). The buffer is not spilled while the guard lives.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when bringing spilled data back cannot
    /// allocate; [`Error::Driver`](crate::Error::Driver) or
    /// [`Error::SpillFile`](crate::Error::SpillFile) when the copy or file read fails;
    /// [`Error::DataLost`](crate::Error::DataLost) when a copy failed in a way that lost the data.
    pub fn device_view(&self, stream: StreamView) -> Result<DeviceGuard<'_>> {
        let mut state = self.state.lock();
        if !matches!(*state, State::Device { .. }) {
            self.to_device(&mut state, stream)?;
        }
        let State::Device { ptr, stream: s, .. } = &mut *state else {
            return Err(Error::invalid_argument(
                "buffer",
                self.id,
                "a buffer on the device",
            ));
        };
        *s = stream;
        let ptr = *ptr;
        self.pins.fetch_add(1, Ordering::Acquire);
        drop(state);
        if let Some(o) = &self.observer {
            o.touched(self.id);
        }
        Ok(DeviceGuard {
            buffer: self,
            ptr,
            stream,
        })
    }

    /// [`device_view`](Self::device_view) as a guard that holds the buffer.
    ///
    /// # Errors
    /// As `device_view`: bringing the data back failed (the device is full, a copy failed).
    pub fn shared_device_view(self: &Arc<Self>, stream: StreamView) -> Result<SharedDeviceGuard> {
        let guard = self.device_view(stream)?;
        let ptr = guard.ptr();
        // The pin the guard took now belongs to the shared guard, which gives it back.
        std::mem::forget(guard);
        Ok(SharedDeviceGuard {
            buffer: Arc::clone(self),
            ptr,
            stream,
        })
    }

    /// The data in pinned host memory, moved there first (from the device, after the work
    /// queued on its stream, or from disk). Fails when a device guard is alive (the data is
    /// in use there; [`to_vec`](Self::to_vec) copies instead) or the host tier is full.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when a device guard is alive;
    /// [`Error::HostOutOfMemory`](crate::Error::HostOutOfMemory) when the host tier is full;
    /// [`Error::Driver`](crate::Error::Driver) or [`Error::SpillFile`](crate::Error::SpillFile)
    /// when the copy or file read fails.
    pub fn host_view(&self) -> Result<HostGuard<'_>> {
        let mut state = self.state.lock();
        match &*state {
            State::Host(_) => {}
            State::Device { .. } => {
                if self.is_in_use() {
                    return Err(Error::invalid_argument(
                        "buffer",
                        self.id,
                        "a buffer not in use on the device (drop its DeviceGuard first, or \
                         copy it with to_vec)",
                    ));
                }
                if !self.spill_to_kept(&mut state)? {
                    self.device_to_host(&mut state)?;
                }
            }
            State::Disk(..) => self.disk_to_host(&mut state)?,
        }
        if let Some(o) = &self.observer {
            o.touched(self.id);
        }
        Ok(HostGuard {
            size: self.size,
            state,
        })
    }

    /// A copy of the data, wherever it is (it does not move).
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) when the copy from the device fails;
    /// [`Error::SpillFile`](crate::Error::SpillFile) when reading the file fails.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.size];
        self.read_into(&mut out)?;
        Ok(out)
    }

    /// Moves the data off the device: to the pinned host pool, or to disk when the host tier
    /// is full and there is a disk tier. Returns the device bytes freed (0 when the buffer is
    /// in use, busy, already spilled, or empty). On error (a full host pool without a disk
    /// tier, a failed copy or write) the buffer stays on the device, valid.
    ///
    /// # Errors
    /// [`Error::HostOutOfMemory`](crate::Error::HostOutOfMemory) when the host pool is full and
    /// there is no disk tier; [`Error::Driver`](crate::Error::Driver) or
    /// [`Error::SpillFile`](crate::Error::SpillFile) when the copy or file write fails
    /// ([`Error::InjectedFault`](crate::Error::InjectedFault) on the simulated device when told
    /// to).
    pub fn spill(&self) -> Result<usize> {
        let Some(mut state) = self.lock_idle() else {
            return Ok(0);
        };
        self.spill_locked(&mut state)
    }

    /// [`spill`](Self::spill) with the state locked.
    fn spill_locked(&self, state: &mut State) -> Result<usize> {
        if !matches!(*state, State::Device { .. }) {
            return Ok(0);
        }
        if self.spill_to_kept(state)? {
            return Ok(self.size);
        }
        match self.device_to_host(state) {
            Ok(()) => Ok(self.size),
            Err(Error::HostOutOfMemory { .. }) if self.store.has_disk() => {
                self.device_to_disk(state)?;
                Ok(self.size)
            }
            Err(e) => Err(e),
        }
    }

    /// Moves the data to the disk tier from the host or the device; returns the bytes moved
    /// (0 when in use, busy, already on disk, or empty). Fails without a disk tier; on error
    /// the buffer stays where it was, valid.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when the store has no disk tier;
    /// [`Error::Driver`](crate::Error::Driver) or [`Error::SpillFile`](crate::Error::SpillFile)
    /// when the copy or file write fails ([`Error::InjectedFault`](crate::Error::InjectedFault) on
    /// the simulated device when told to).
    pub fn spill_to_disk(&self) -> Result<usize> {
        self.disk()?;
        let Some(mut state) = self.lock_idle() else {
            return Ok(0);
        };
        if self.spill_to_kept(&mut state)? {
            // Its host copy goes on to disk: the device is not read again. The device memory
            // is free either way; data that could not be written stays on the host, valid.
            if let Err(e) = self.host_to_disk(&mut state) {
                tracing::warn!("buffer {} stays in the host tier: {e}", self.id);
            }
            return Ok(self.size);
        }
        match &*state {
            State::Device { .. } => self.device_to_disk(&mut state)?,
            State::Host(_) => self.host_to_disk(&mut state)?,
            State::Disk(..) => return Ok(0),
        }
        Ok(self.size)
    }

    /// The state, locked, when the buffer is non-empty, not in use and not busy.
    ///
    /// Busy (being read, brought back or spilled by another thread) is not waited for:
    /// waiting could deadlock two threads that each make room by spilling the other's buffer.
    fn lock_idle(&self) -> Option<MutexGuard<'_, State>> {
        if self.size == 0 || self.is_in_use() {
            return None;
        }
        let state = self.state.try_lock()?;
        // Checked again under the lock: guards are taken under it.
        (!self.is_in_use()).then_some(state)
    }

    /// The disk tier new spill files go to.
    fn disk(&self) -> Result<Arc<DiskStore>> {
        self.store.tiers().disk().cloned().ok_or_else(|| {
            Error::invalid_argument(
                "spill.disk_directory",
                "none",
                "a directory, to spill to disk",
            )
        })
    }

    /// Records a move: new state, observer, trace event.
    fn moved(&self, state: &mut State, new: State, start: Instant) {
        let from = state.tier();
        let to = new.tier();
        // Borrowed device memory was never counted as the buffer's.
        let owned = !matches!(state, State::Device { resource: None, .. });
        if from == Tier::Device {
            self.forget_releases();
        }
        *state = new;
        self.tier.store(to as u8, Ordering::Release);
        let nanos = nanos_since(start);
        if let Some(o) = &self.observer {
            match (from, to) {
                (Tier::Device, _) if owned => o.resident(self.id, -(self.size as i64)),
                (_, Tier::Device) => o.resident(self.id, self.size as i64),
                _ => {}
            }
            o.moved(self.id, from, to, self.size, nanos);
        }
        tracing::debug!(
            target: "rmm::spill",
            id = self.id,
            bytes = self.size,
            from = from.name(),
            to = to.name(),
            micros = nanos / 1000,
            "buffer moved"
        );
    }

    /// Pinned slices for the whole buffer; asks the observer for room once if the host tier
    /// is full. Before a growable pool pins more for them, the observer gives back copies
    /// kept of data on the device, if there are any: they are a cache in memory already
    /// pinned, never a reason to pin more.
    fn host_slices(&self) -> Result<Vec<PinnedSlice>> {
        let host = self.store.host();
        if let Some(o) = &self.observer
            && host.is_growable()
            && host.reclaimable() > 0
        {
            o.reclaim_host(self.id, self.size);
        }
        match (self.try_host_slices(), &self.observer) {
            (Err(Error::HostOutOfMemory { .. }), Some(o)) => {
                let room = o.make_host_room(self.id, self.size);
                match (self.try_host_slices(), room) {
                    // Still full because the data that would have made room could not go to
                    // disk: that failure is the cause, not the pool's size.
                    (Err(Error::HostOutOfMemory { .. }), Err(cause)) => Err(cause),
                    (slices, _) => slices,
                }
            }
            (other, _) => other,
        }
    }

    fn try_host_slices(&self) -> Result<Vec<PinnedSlice>> {
        let host = self.store.host();
        let chunk = host.max_slice().max(1);
        let mut slices = Vec::with_capacity(self.size.div_ceil(chunk));
        let mut left = self.size;
        while left > 0 {
            let n = left.min(chunk);
            slices.push(host.allocate(n)?);
            left -= n;
        }
        Ok(slices)
    }

    fn device_to_host(&self, state: &mut State) -> Result<()> {
        match self.start_to_host(state)? {
            Some(out) => self.complete_to_host(state, out, None),
            None => Ok(()),
        }
    }

    fn device_to_disk(&self, state: &mut State) -> Result<()> {
        let start = Instant::now();
        let State::Device {
            ptr,
            resource,
            stream,
            ..
        } = &*state
        else {
            return Ok(());
        };
        let (ptr, stream) = (*ptr, *stream);
        let disk = self.disk()?;
        let file = disk.write_from_device(self.store.copies(), self.id, ptr, self.size, stream)?;
        if let Some(resource) = resource {
            resource.deallocate(ptr, self.size, stream)?;
        }
        self.moved(state, State::Disk(file, disk), start);
        Ok(())
    }

    fn host_to_disk(&self, state: &mut State) -> Result<()> {
        let start = Instant::now();
        let State::Host(slices) = &*state else {
            return Ok(());
        };
        let disk = self.disk()?;
        let file = disk.write_slices(self.id, slices, self.size)?;
        self.moved(state, State::Disk(file, disk), start);
        Ok(())
    }

    fn disk_to_host(&self, state: &mut State) -> Result<()> {
        let State::Disk(file, disk) = &*state else {
            return Ok(());
        };
        let mut slices = self.host_slices()?;
        let start = Instant::now();
        disk.read_slices(file, &mut slices)?;
        self.moved(state, State::Host(slices), start);
        Ok(())
    }

    /// An error when the data was lost to a failed copy (see [`Error::DataLost`]).
    fn check_not_lost(&self) -> Result<()> {
        if self.lost.load(Ordering::Acquire) {
            return Err(Error::DataLost {
                id: self.id,
                bytes: self.size,
                detail: "an earlier unspill could not wait for its copy".into(),
            });
        }
        Ok(())
    }
}

impl Drop for SpillableBuffer {
    fn drop(&mut self) {
        self.forget_releases();
        let state = std::mem::replace(&mut *self.state.get_mut(), State::Host(Vec::new()));
        if let State::Device {
            ptr,
            resource: Some(resource),
            stream,
            ..
        } = state
        {
            if let Err(e) = resource.deallocate(ptr, self.size, stream) {
                tracing::error!("freeing a spillable buffer of {} bytes: {e}", self.size);
            }
            if let Some(o) = &self.observer {
                o.resident(self.id, -(self.size as i64));
            }
        }
        // Host slices and disk files go back as the state drops.
        if let Some(o) = &self.observer {
            o.dropped(self.id);
        }
    }
}
