//! [`SpillableBuffer`]: device bytes that move to pinned host memory, then disk, while unused, and
//! come back on the next use.
//!
//! A [`DeviceGuard`] brings spilled data back into the device's *current* resource (after a
//! `reinitialize`, the new stack) and blocks spilling while it lives; a [`HostGuard`] holds the
//! data in the host tier. A [`SpillObserver`] (the runtime's spill manager) hears of every use and
//! move. Copies run on the store's copy streams and finish before the source is freed; a failed
//! move leaves the buffer valid where it was.

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

use super::disk::{DiskFile, DiskStore, data_in};
use super::store::SpillStore;
use crate::backend::DevicePtr;
use crate::backend::host::PinnedSlice;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::per_device::get_per_device_resource;
use crate::resource::SharedResource;
use crate::stream::{Event, synchronize_stream};
use crate::stream_view::StreamView;
pub use guard::{DeviceAccess, DeviceGuard, HostGuard, SharedDeviceGuard};

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
    /// About to allocate `bytes` on the device for `id`: spill others if over the limit.
    fn make_room(&self, id: u64, bytes: usize);
    /// No host-tier room for `bytes` of `id` (its lock held): move others' host data to disk.
    ///
    /// # Errors
    /// Moving data to disk failed.
    fn make_host_room(&self, _id: u64, _bytes: usize) -> Result<()> {
        Ok(())
    }
    /// Buffer `id` holds `delta` bytes more (negative: fewer) on the device.
    fn resident(&self, id: u64, delta: i64);
    /// `id` moved `bytes` from `from` to `to`; `nanos` is copy and I/O time, excluding allocation.
    fn moved(&self, id: u64, from: Tier, to: Tier, bytes: usize, nanos: u64);
    /// Free pinned room for `id`'s `bytes` by dropping kept copies
    /// ([`SpillableBuffer::drop_kept_copy`]).
    fn reclaim_host(&self, _id: u64, _bytes: usize) {}
    /// `id` went to the host tier in `nanos` without copying: its host copy was kept.
    fn spilled_without_copy(&self, _id: u64, _bytes: usize, _nanos: u64) {}
    /// Buffer `id` is gone.
    fn dropped(&self, id: u64);
    /// `id`'s last device guard is gone: it may spill again (if held over the limit while in use).
    fn released(&self, _id: u64) {}
}

pub(super) enum State {
    /// On the device; `resource` is `None` for memory borrowed by [`SpillableBuffer::from_device`].
    Device {
        ptr: DevicePtr,
        resource: Option<SharedResource>,
        stream: StreamView,
        /// Host-tier copy kept by a read-only buffer: spilling again only frees device memory.
        kept: Option<Vec<PinnedSlice>>,
    },
    Host(Vec<PinnedSlice>),
    /// In a disk tier's file, kept alive by the buffer (the store may use other tiers since).
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

/// Device bytes spillable to pinned host memory and disk; share with `Arc`. See the module docs.
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
    /// Per stream used through a device guard (see `release_key`), an event recorded as the guard
    /// let go: a spill's copy waits on these, not on later work on the stream.
    pub(super) released_at: Mutex<Vec<(u64, Event)>>,
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

fn nanos_since(start: Instant) -> u64 {
    start.elapsed().as_nanos() as u64
}

impl SpillableBuffer {
    /// `size` uninitialized bytes of the current resource for `stream`; spills to `store`.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`]; [`Error::NoSuchDevice`] (or the backend's error) without a resource.
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

    /// Copies `size` device bytes at `ptr` that the buffer does not own to the host tier (or disk)
    /// after `stream`'s queued work, like a spill, complete on return; `ptr` is never freed.
    ///
    /// # Errors
    /// As [`spill`](Self::spill); nothing is kept then.
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
        buffer.spill_locked(buffer.state.lock())?;
        Ok(buffer)
    }

    /// A buffer holding a copy of `bytes`, complete on return.
    ///
    /// # Errors
    /// As [`SpillableBuffer::new`]; [`Error::Driver`] when the copy fails.
    pub fn from_host(
        store: &Arc<SpillStore>,
        bytes: &[u8],
        stream: StreamView,
        observer: Option<Arc<dyn SpillObserver>>,
    ) -> Result<Arc<SpillableBuffer>> {
        let buffer = Self::new(store, bytes.len(), stream, observer)?;
        let guard = buffer.device_view(stream)?;
        synchronize_stream(buffer.device(), stream)?;
        buffer.device().copy_to_device(guard.ptr(), bytes)?;
        drop(guard);
        Ok(buffer)
    }

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

    /// The device address if resident and not moving; without a guard it may move at any time.
    pub fn device_ptr(&self) -> Option<DevicePtr> {
        match &*self.state.try_lock()? {
            State::Device { ptr, .. } => Some(*ptr),
            _ => None,
        }
    }

    /// Drops a device guard's pin, recording where `stream`'s use of the data ends (`released_at`).
    pub(super) fn unpin(&self, stream: StreamView) {
        // Record before unpinning: once no pins remain a spill may read the list. On failure it is
        // emptied, and a spill waits for the whole stream.
        let copies = self.store.copies();
        let key = release_key(stream);
        let mut released = self.released_at.lock();
        let replaced = released
            .iter()
            .position(|(s, _)| *s == key)
            .map(|i| released.swap_remove(i).1);
        let failed: Vec<Event> = match copies.event().and_then(|e| e.record(stream).map(|()| e)) {
            Ok(e) => {
                released.push((key, e));
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

    /// Gives back the `released_at` events (the data leaves the device, or the buffer drops).
    fn forget_releases(&self) {
        let copies = self.store.copies();
        let events: Vec<Event> = self.released_at.lock().drain(..).map(|(_, e)| e).collect();
        events.into_iter().for_each(|e| copies.recycle(e));
    }

    /// The events a spill's copy waits for instead of the whole stream (see `released_at`).
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

    /// The data on the device for `stream`, brought back if spilled; not spilled while guarded.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`], [`Error::Driver`], [`Error::SpillFile`], [`Error::DataLost`].
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
        Ok(DeviceAccess {
            buffer: self,
            ptr,
            stream,
        })
    }

    /// [`device_view`](Self::device_view) as a guard that holds the buffer.
    ///
    /// # Errors
    /// As `device_view`.
    pub fn shared_device_view(self: &Arc<Self>, stream: StreamView) -> Result<SharedDeviceGuard> {
        let guard = self.device_view(stream)?;
        let ptr = guard.ptr();
        // The pin the guard took now belongs to the shared guard, which gives it back.
        std::mem::forget(guard);
        Ok(DeviceAccess {
            buffer: Arc::clone(self),
            ptr,
            stream,
        })
    }

    /// The data in pinned host memory, moved there first from the device or disk.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] while a device guard lives (use [`to_vec`](Self::to_vec));
    /// [`Error::HostOutOfMemory`]; [`Error::Driver`] or [`Error::SpillFile`].
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
                if !self.spill_to_kept(&mut state)?
                    && let Some(out) = self.start_to_host(&state)?
                {
                    self.complete_to_host(&mut state, out, None)?;
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
    /// [`Error::Driver`] or [`Error::SpillFile`] when the copy or file read fails.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.size];
        self.read_into(&mut out)?;
        Ok(out)
    }

    /// Moves the data to the host pool, or to disk when that is full; returns device bytes freed (0
    /// when in use, busy, spilled or empty). On error the buffer stays valid on the device.
    ///
    /// # Errors
    /// [`Error::HostOutOfMemory`] with no disk tier; else [`Error::Driver`] or
    /// [`Error::SpillFile`].
    pub fn spill(&self) -> Result<usize> {
        let Some(state) = self.lock_idle() else {
            return Ok(0);
        };
        self.spill_locked(state)
    }

    fn spill_locked(&self, state: MutexGuard<'_, State>) -> Result<usize> {
        match self.begin_spill_locked(state)? {
            SpillStep::Skipped => Ok(0),
            SpillStep::Done(bytes) => Ok(bytes),
            SpillStep::Pending(pending) => pending.finish(None),
        }
    }

    /// Moves the data from host or device to disk; returns bytes moved (0 when in use, busy, on
    /// disk or empty). On error the buffer stays valid where it was.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] with no disk tier; else [`Error::Driver`] or
    /// [`Error::SpillFile`].
    pub fn spill_to_disk(&self) -> Result<usize> {
        self.disk()?;
        let Some(mut state) = self.lock_idle() else {
            return Ok(0);
        };
        if self.spill_to_kept(&mut state)? {
            // The host copy goes to disk, not the device data. Device memory is freed either way;
            // unwritten data stays valid on the host.
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

    /// The locked state if the buffer is non-empty, unused and not busy (not waited for: two
    /// threads spilling each other's buffer to make room would deadlock).
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

    /// Pinned slices for the whole buffer, asking the observer for room once if the host tier is
    /// full (and to drop kept copies before a growable pool pins more).
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
                    // Full because making room failed to write to disk: report that failure.
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
        (0..self.size)
            .step_by(chunk)
            .map(|at| host.allocate(chunk.min(self.size - at)))
            .collect()
    }

    fn device_to_disk(&self, state: &mut State) -> Result<()> {
        let start = Instant::now();
        let State::Device { ptr, stream, .. } = &*state else {
            return Ok(());
        };
        let disk = self.disk()?;
        let file =
            disk.write_from_device(self.store.copies(), self.id, *ptr, self.size, *stream)?;
        self.free_device_memory(state)?;
        self.moved(state, State::Disk(file, disk), start);
        Ok(())
    }

    /// Frees the device memory `state` holds, if the buffer owns it (not borrowed).
    fn free_device_memory(&self, state: &State) -> Result<()> {
        if let State::Device {
            ptr,
            resource: Some(resource),
            stream,
            ..
        } = state
        {
            resource.deallocate(*ptr, self.size, *stream)?;
        }
        Ok(())
    }

    fn host_to_disk(&self, state: &mut State) -> Result<()> {
        let start = Instant::now();
        let State::Host(slices) = &*state else {
            return Ok(());
        };
        let disk = self.disk()?;
        let file = disk.write_chunks(self.id, data_in(slices, self.size), self.size)?;
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

    fn data_lost(&self, detail: String) -> Error {
        let (id, bytes) = (self.id, self.size);
        Error::DataLost { id, bytes, detail }
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

/// Which of `released_at`'s entries a guard's release replaces: the stream's own, or for the
/// per-thread default stream, this thread's (each thread's is another stream under one handle).
fn release_key(stream: StreamView) -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        static THREAD: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    if stream.is_per_thread() {
        // Above every handle a driver hands out (addresses of user space).
        (1 << 63) | THREAD.with(|t| *t)
    } else {
        stream.raw()
    }
}
