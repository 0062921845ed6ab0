//! [`SpillManager`]: one device's spilling policy (see the `spill` module documentation).

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytemuck::Pod;
use parking_lot::Mutex;
use rmm_allocator::backend::DevicePtr;
use rmm_allocator::resource::PinnedHostPool;
use rmm_allocator::spill::{
    SpillObserver, SpillStore, SpillTiers, SpillableBuffer, SpillableVector, Tier,
};
use rmm_allocator::{Device, Result, StreamView};
use rmm_config::ResolvedSpill;

use super::foreign::{ForeignData, ForeignOwner};
use super::statistics::{Moves, SpillStatistics, TierStatistics};
use super::tracker::{Spillable, Tracker};

thread_local! {
    /// True on a thread inside [`SpillManager::without_spilling`].
    static NOT_SPILLING: Cell<bool> = const { Cell::new(false) };
}

/// `spill.host_pool_size` and `spill.disk_directory`: what the tiers are made of.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TierSettings {
    host_pool_size: Option<u64>,
    disk_directory: Option<std::path::PathBuf>,
}

impl TierSettings {
    fn of(spill: &ResolvedSpill) -> TierSettings {
        TierSettings {
            host_pool_size: spill.host_pool_size,
            disk_directory: spill.disk_directory.clone(),
        }
    }
}

/// Fills a received value's pinned memory ([`SpillManager::receive`]): `(part, offset, memory)`.
pub type PartFill<'a> = dyn FnMut(usize, usize, &mut [u8]) -> Result<()> + 'a;

/// What [`SpillManager::replace_tiers`] replaced, for [`SpillManager::restore_tiers`].
#[derive(Debug)]
pub struct TierUndo {
    tiers: Arc<SpillTiers>,
    settings: TierSettings,
}

/// A host pool of `bytes` pinned now, or (`None`) one that pins as needed.
fn host_pool(device: Device, bytes: Option<u64>) -> Result<PinnedHostPool> {
    Ok(match bytes {
        Some(bytes) => PinnedHostPool::on(device.backend(), bytes as usize)?,
        None => PinnedHostPool::growable(device.backend(), None),
    })
}

/// Spilling for one device: see the module documentation.
pub struct SpillManager {
    store: Arc<SpillStore>,
    /// `spill.host_pool_size` and `spill.disk_directory` of the tiers new spills go to.
    tiers_made_with: Mutex<TierSettings>,
    tracker: Arc<Tracker>,
    eager_unspill: std::sync::atomic::AtomicBool,
    /// Set by [`fix_limit`](Self::fix_limit): a reinitialize keeps the limit.
    limit_fixed: std::sync::atomic::AtomicBool,
    /// Set by [`fix_disk_directory`](Self::fix_disk_directory): a reinitialize keeps it.
    disk_fixed: Mutex<Option<std::path::PathBuf>>,
    /// `spill.pin_ahead`: cap on the pinned host memory kept free ahead of demand.
    pin_ahead: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for SpillManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpillManager")
            .field("device", &self.device())
            .field("statistics", &self.statistics())
            .finish()
    }
}

impl SpillManager {
    /// A manager for `device` as `spill` configures it (host pool pinned now unless `"none"`).
    ///
    /// # Errors
    /// [`HostOutOfMemory`](rmm_allocator::Error::HostOutOfMemory) or
    /// [`Driver`](rmm_allocator::Error::Driver): the host pool cannot be pinned;
    /// [`InvalidArgument`](rmm_allocator::Error::InvalidArgument): the disk directory is unusable.
    pub fn new(device: Device, spill: &ResolvedSpill) -> Result<SpillManager> {
        let host = host_pool(device, spill.host_pool_size)?;
        let store = SpillStore::new(device, host, spill.disk_directory.as_deref())?;
        let tracker = Arc::new_cyclic(|me| Tracker {
            store: Some(Arc::clone(&store)),
            me: me.clone(),
            ..Tracker::default()
        });
        let manager = SpillManager {
            tiers_made_with: Mutex::new(TierSettings::of(spill)),
            store,
            tracker,
            eager_unspill: spill.eager_unspill.into(),
            limit_fixed: false.into(),
            disk_fixed: Mutex::new(None),
            pin_ahead: spill.pin_ahead.into(),
        };
        manager.set_limit(spill.threshold);
        Ok(manager)
    }

    /// Sends new spills to `spill`'s host pool and disk tier where they differ (spilled data stays
    /// in its old tier); returns the undo for [`restore_tiers`](Self::restore_tiers), if any.
    ///
    /// # Errors
    /// The host pool cannot be pinned or the disk directory is unusable; nothing changed.
    pub fn replace_tiers(&self, spill: &ResolvedSpill) -> Result<Option<TierUndo>> {
        let mut new = TierSettings::of(spill);
        if let Some(dir) = &*self.disk_fixed.lock() {
            new.disk_directory = Some(dir.clone());
        }
        self.replace_tiers_with(new)
    }

    fn replace_tiers_with(&self, new: TierSettings) -> Result<Option<TierUndo>> {
        let mut made_with = self.tiers_made_with.lock();
        if new == *made_with {
            return Ok(None);
        }
        let host = (new.host_pool_size != made_with.host_pool_size)
            .then(|| host_pool(self.device(), new.host_pool_size))
            .transpose()?;
        let disk = (new.disk_directory != made_with.disk_directory)
            .then_some(new.disk_directory.as_deref());
        let previous = self.store.replace_tiers(host.clone(), disk)?;
        if let Some(host) = &host {
            // The old pool stops pinning ahead but keeps its memory until the switch is decided.
            previous.host().keep_free(0);
            host.keep_free(self.ahead());
        }
        tracing::info!(
            device = self.device().ordinal(),
            host_pool_size = ?new.host_pool_size,
            disk_directory = ?new.disk_directory,
            "new spill tiers (data already spilled stays in the old ones until used)"
        );
        let settings = std::mem::replace(&mut *made_with, new);
        Ok(Some(TierUndo {
            tiers: previous,
            settings,
        }))
    }

    /// Keeps [`replace_tiers`](Self::replace_tiers)' switch: the old host pool shrinks to its data.
    pub fn commit_tiers(&self, undo: TierUndo) {
        if !undo.tiers.host().same_pool(&self.store.host()) {
            undo.tiers.host().release_idle(true);
            // Kept copies of device data would hold the old pool's memory.
            self.tracker.drop_all_kept_copies();
        }
    }

    /// Undoes [`replace_tiers`](Self::replace_tiers) (data spilled meanwhile stays where it went).
    pub fn restore_tiers(&self, undo: TierUndo) {
        let mut made_with = self.tiers_made_with.lock();
        let replaced = self.store.tiers();
        self.store.restore_tiers(undo.tiers);
        if !replaced.host().same_pool(&self.store.host()) {
            replaced.host().release_idle(true);
            self.store.host().release_idle(false);
            self.store.host().keep_free(self.ahead());
        }
        *made_with = undo.settings;
    }

    /// Takes `spill`'s limit, pin-ahead and eager unspill; ends [`stand_down`](Self::stand_down).
    pub fn reconfigure(&self, spill: &ResolvedSpill) {
        self.pin_ahead.store(spill.pin_ahead, Ordering::Relaxed);
        let host = self.store.host();
        host.release_idle(false);
        // A fixed pool gave its memory back when spilling stood down.
        if let Err(e) = host.pin_again() {
            tracing::warn!(
                device = self.device().ordinal(),
                "the host pool could not pin its spill.host_pool_size again ({e}); spills that \
                 do not fit what it holds go to disk, or fail without spill.disk_directory: \
                 lower spill.host_pool_size or free host memory"
            );
        }
        self.set_limit(self.limit_under(spill));
        self.eager_unspill
            .store(spill.eager_unspill, Ordering::Relaxed);
    }

    /// Stops spilling here (reinitialized off, or shutdown): nothing pinned ahead, idle host memory
    /// and kept copies freed; data stays. [`reconfigure`](Self::reconfigure) resumes.
    pub fn stand_down(&self) {
        self.tracker.drop_all_kept_copies();
        self.store.host().release_idle(true);
    }

    /// Sets the limit to `bytes` for good, over reinitializations' `spill.device_memory_limit`
    /// (a Dask device store's `device_memory_limit`); spills at once if over.
    ///
    /// # Errors
    /// As [`enforce_limit`](Self::enforce_limit); the limit is set regardless.
    pub fn fix_limit(&self, bytes: u64) -> Result<u64> {
        self.set_limit(bytes);
        self.limit_fixed.store(true, Ordering::Relaxed);
        self.enforce_limit()
    }

    /// Makes `directory` (created if missing) the disk tier for good, over reinitializations'
    /// `spill.disk_directory` (a Dask worker's directory); data on disk elsewhere stays.
    ///
    /// # Errors
    /// The directory is unusable or the staging memory cannot be pinned; nothing changed.
    pub fn fix_disk_directory(&self, directory: &std::path::Path) -> Result<()> {
        let mut fixed = self.disk_fixed.lock();
        let host_pool_size = self.tiers_made_with.lock().host_pool_size;
        self.replace_tiers_with(TierSettings {
            host_pool_size,
            disk_directory: Some(directory.to_path_buf()),
        })?;
        *fixed = Some(directory.to_path_buf());
        Ok(())
    }

    /// True after [`fix_limit`](Self::fix_limit): a device store relies on this device.
    pub fn is_fixed(&self) -> bool {
        self.limit_fixed.load(Ordering::Relaxed)
    }

    /// The limit after [`reconfigure`](Self::reconfigure) to `spill` (the current one if fixed).
    pub(crate) fn limit_under(&self, spill: &ResolvedSpill) -> u64 {
        if self.limit_fixed.load(Ordering::Relaxed) {
            self.tracker.limit.load(Ordering::Relaxed)
        } else {
            spill.threshold
        }
    }

    /// Own buffers on the device and not in use, most recent first (a reinitialize may keep them).
    pub(crate) fn idle_on_device(&self) -> Vec<Arc<SpillableBuffer>> {
        self.tracker
            .oldest_first(None)
            .into_iter()
            .rev()
            .filter(|e| e.tier() == Tier::Device && !e.is_in_use())
            .filter_map(Spillable::into_buffer)
            .collect()
    }

    /// Sets the limit, and the host memory pinned ahead to match.
    fn set_limit(&self, bytes: u64) {
        self.tracker.limit.store(bytes, Ordering::Relaxed);
        self.store.host().keep_free(self.ahead());
    }

    /// Pinned host memory kept free ahead of demand: the limit, up to `spill.pin_ahead`.
    fn ahead(&self) -> usize {
        let limit = self.tracker.limit.load(Ordering::Relaxed);
        usize::try_from(limit.min(self.pin_ahead.load(Ordering::Relaxed))).unwrap_or(usize::MAX)
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.store.device()
    }

    /// Where spilled data goes.
    pub fn store(&self) -> &Arc<SpillStore> {
        &self.store
    }

    fn observer(&self) -> Option<Arc<dyn SpillObserver>> {
        Some(Arc::clone(&self.tracker) as Arc<dyn SpillObserver>)
    }

    /// `size` uninitialized spillable bytes used on `stream`, spilling older data if needed.
    ///
    /// # Errors
    /// [`OutOfMemory`](rmm_allocator::Error::OutOfMemory): no room even after spilling.
    pub fn buffer(&self, size: usize, stream: StreamView) -> Result<Arc<SpillableBuffer>> {
        SpillableBuffer::new(&self.store, size, stream, self.observer())
            .inspect(|b| self.register(b))
    }

    /// A spillable copy of `bytes`.
    ///
    /// # Errors
    /// [`OutOfMemory`](rmm_allocator::Error::OutOfMemory) or
    /// [`Driver`](rmm_allocator::Error::Driver).
    pub fn from_host(&self, bytes: &[u8], stream: StreamView) -> Result<Arc<SpillableBuffer>> {
        SpillableBuffer::from_host(&self.store, bytes, stream, self.observer())
            .inspect(|b| self.register(b))
    }

    /// `len` uninitialized spillable elements, used on `stream`.
    ///
    /// # Errors
    /// [`InvalidArgument`](rmm_allocator::Error::InvalidArgument): bytes overflow `usize`;
    /// [`OutOfMemory`](rmm_allocator::Error::OutOfMemory).
    pub fn vector<T: Pod>(&self, len: usize, stream: StreamView) -> Result<SpillableVector<T>> {
        SpillableVector::new(&self.store, len, stream, self.observer())
            .inspect(|v| self.register(v.buffer()))
    }

    /// A spillable copy of `data`.
    ///
    /// # Errors
    /// [`OutOfMemory`](rmm_allocator::Error::OutOfMemory) or
    /// [`Driver`](rmm_allocator::Error::Driver).
    pub fn vector_from_slice<T: Pod>(
        &self,
        data: &[T],
        stream: StreamView,
    ) -> Result<SpillableVector<T>> {
        SpillableVector::from_slice(&self.store, data, stream, self.observer())
            .inspect(|v| self.register(v.buffer()))
    }

    fn register(&self, b: &Arc<SpillableBuffer>) {
        self.tracker.lru.lock().insert(b.id(), b, None);
    }

    /// Adopts a value whose device memory `owner` holds (`allocations`: (address, bytes), used on
    /// `stream`), counted against the limit and spillable ([`ForeignData`]); spills if over.
    pub fn adopt<O: ForeignOwner + 'static>(
        &self,
        allocations: &[(DevicePtr, usize)],
        stream: StreamView,
        owner: O,
    ) -> Arc<ForeignData<O>> {
        let data = ForeignData::adopt(&self.tracker, &self.store, allocations, stream, owner);
        self.tracker.enforce_limit(None, 0);
        data
    }

    /// [`adopt`](Self::adopt), spilling on the background thread (the limit may be exceeded
    /// meanwhile; a failing allocation spills at once); [`settle`](Self::settle) waits for it.
    pub fn adopt_in_background<O: ForeignOwner + 'static>(
        &self,
        allocations: &[(DevicePtr, usize)],
        stream: StreamView,
        owner: O,
    ) -> Arc<ForeignData<O>> {
        let data = ForeignData::adopt(&self.tracker, &self.store, allocations, stream, owner);
        if self.tracker.is_over_limit() {
            self.tracker.background.request(&self.tracker);
        }
        data
    }

    /// True when `bytes` more fit under the limit now without spilling.
    pub fn has_room(&self, bytes: usize) -> bool {
        self.tracker.has_room(bytes)
    }

    /// A value arriving from elsewhere (a peer worker), adopted with no owner: `fill(part, offset,
    /// memory)` writes its parts (of `sizes` bytes) straight into pinned host memory, one copy. If
    /// all fits under the limit it moves to the device (counted as unspilled), else stays in the
    /// host tier or goes to disk; from then on it is spilled data like any other.
    ///
    /// # Errors
    /// As [`SpillableBuffer::off_device_with`]; moving to the device or `fill` failed. Keeps none.
    pub fn receive<O: ForeignOwner + 'static>(
        &self,
        sizes: &[usize],
        stream: StreamView,
        fill: &mut PartFill<'_>,
    ) -> Result<Arc<ForeignData<O>>> {
        self.receive_parts(sizes, stream, &mut |i, size| {
            SpillableBuffer::off_device_with(
                &self.store,
                size,
                self.observer(),
                &mut |offset, chunk| fill(i, offset, chunk),
            )
        })
    }

    /// [`receive`](Self::receive) of `(address, bytes)` parts mapped here but not owned (another
    /// process's export): copied device to device if all fits under the limit, else to the host.
    ///
    /// # Errors
    /// As [`receive`](Self::receive); a failed copy. Nothing is kept then.
    pub fn receive_from_device<O: ForeignOwner + 'static>(
        &self,
        parts: &[(DevicePtr, usize)],
        stream: StreamView,
    ) -> Result<Arc<ForeignData<O>>> {
        let bytes: usize = parts.iter().map(|p| p.1).sum();
        if self.tracker.has_room(bytes) {
            let buffers = parts
                .iter()
                .map(|&(src, size)| {
                    let b = self.buffer(size, stream)?;
                    {
                        let view = b.device_view(stream)?;
                        let device = b.device();
                        // Waits for this stream only, not for spills in flight.
                        device.copy_device_to_device_async(view.ptr(), src, size, stream)?;
                        rmm_allocator::synchronize_stream(device, stream)?;
                    }
                    Ok(b)
                })
                .collect::<Result<Vec<_>>>()?;
            self.tracker.received[0].fetch_add(bytes as u64, Ordering::Relaxed);
            return Ok(ForeignData::received(
                &self.tracker,
                &self.store,
                buffers,
                stream,
            ));
        }
        let sizes: Vec<usize> = parts.iter().map(|p| p.1).collect();
        self.receive_parts(&sizes, stream, &mut |i, size| {
            SpillableBuffer::off_device_from(&self.store, size, self.observer(), parts[i].0)
        })
    }

    /// Parts of `sizes` made by `make(part, size)`, kept as in [`receive`](Self::receive).
    fn receive_parts<O: ForeignOwner + 'static>(
        &self,
        sizes: &[usize],
        stream: StreamView,
        make: &mut dyn FnMut(usize, usize) -> Result<Arc<SpillableBuffer>>,
    ) -> Result<Arc<ForeignData<O>>> {
        let bytes: usize = sizes.iter().sum();
        let on_device = self.tracker.has_room(bytes);
        let buffers = sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| make(i, size))
            .collect::<Result<Vec<_>>>()?;
        buffers.iter().for_each(|b| {
            self.register(b);
            // Read-only: brought to the device, it keeps its host copy.
            b.set_read_only();
        });
        if on_device {
            for b in &buffers {
                b.device_view(stream)?;
            }
        }
        self.tracker.received[usize::from(!on_device)].fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(ForeignData::received(
            &self.tracker,
            &self.store,
            buffers,
            stream,
        ))
    }

    /// With `on`, room is made off the callers' threads: data brought back and new buffers go ahead
    /// and the background thread spills right after, one copy engine each way (a failing
    /// allocation spills at once). For a task-result store, whose limit is a target; `false` (the
    /// default) makes room first.
    pub fn make_room_in_background(&self, on: bool) {
        self.tracker.room_in_background.store(on, Ordering::Relaxed);
    }

    /// Waits for spilling requested so far by [`adopt_in_background`](Self::adopt_in_background)
    /// or [`make_room_in_background`](Self::make_room_in_background).
    pub fn settle(&self) {
        self.tracker.background.settle();
    }

    /// Spills least recently used data not in use down to the limit; returns the bytes freed.
    ///
    /// # Errors
    /// No room on the host and no disk tier, or a copy failed (what could move has moved).
    pub fn enforce_limit(&self) -> Result<u64> {
        let over = self.tracker.excess();
        if over <= 0 {
            return Ok(0);
        }
        self.tracker.spill_oldest(over as u64, None)
    }

    /// The stack's out-of-memory handler (`spill.on_demand`): spills least recently used buffers,
    /// asking for a retry if any freed; off in [`without_spilling`](Self::without_spilling).
    pub fn oom_handler(&self) -> crate::stack::OomHandler {
        let tracker = Arc::clone(&self.tracker);
        Arc::new(move |bytes| {
            if NOT_SPILLING.with(Cell::get) {
                return false;
            }
            match tracker.spill_oldest(bytes as u64, None) {
                Ok(freed) => freed > 0,
                Err(e) => {
                    tracing::warn!("spilling after an out-of-memory error for {bytes} bytes: {e}");
                    false
                }
            }
        })
    }

    /// Runs `f` with this thread's out-of-memory failures not spilling: for memory worth making
    /// only where the device has room (a transient copy another approach avoids).
    pub fn without_spilling<R>(f: impl FnOnce() -> R) -> R {
        struct Restore(bool);
        impl Drop for Restore {
            fn drop(&mut self) {
                NOT_SPILLING.with(|c| c.set(self.0));
            }
        }
        let _restore = Restore(NOT_SPILLING.with(|c| c.replace(true)));
        f()
    }

    /// Spills every buffer not in use; returns the device bytes freed.
    ///
    /// # Errors
    /// [`HostOutOfMemory`](rmm_allocator::Error::HostOutOfMemory): host full, no disk tier;
    /// [`Driver`](rmm_allocator::Error::Driver) or [`SpillFile`](rmm_allocator::Error::SpillFile).
    pub fn spill_all(&self) -> Result<u64> {
        self.tracker.spill_oldest(u64::MAX, None)
    }

    /// Brings spilled buffers back on `stream`, most recent first, up to the limit; returns bytes.
    ///
    /// # Errors
    /// [`OutOfMemory`](rmm_allocator::Error::OutOfMemory); [`Driver`](rmm_allocator::Error::Driver)
    /// or [`SpillFile`](rmm_allocator::Error::SpillFile).
    pub fn unspill_all(&self, stream: StreamView) -> Result<u64> {
        let mut back = 0;
        for b in self.tracker.oldest_first(None).into_iter().rev() {
            if b.tier() != Tier::Device && self.tracker.has_room(b.size()) {
                b.unspill(stream)?;
                back += b.size() as u64;
            }
        }
        Ok(back)
    }

    /// The live spillable values (buffers and adopted values, on any tier): count and bytes.
    pub fn spillable(&self) -> (u64, u64) {
        let all = self.tracker.oldest_first(None);
        (all.len() as u64, all.iter().map(|e| e.size() as u64).sum())
    }

    /// True when a reinitialize should bring spilled data back at once.
    pub fn eager_unspill(&self) -> bool {
        self.eager_unspill.load(Ordering::Relaxed)
    }

    /// The figures so far.
    pub fn statistics(&self) -> SpillStatistics {
        let t = &self.tracker;
        let m = |from: Tier, to: Tier| &t.moves[from as usize][to as usize];
        let (d, h, k) = (Tier::Device, Tier::Host, Tier::Disk);
        let (spilled_count, spilled_bytes, spill_seconds) = Moves::sum([m(d, h), m(d, k)]);
        let (unspilled_count, unspilled_bytes, unspill_seconds) = Moves::sum([m(h, d), m(k, d)]);
        let counts = t.counts();
        let tier = |into: [&Moves; 2], out: [&Moves; 2], held: u64, held_count: u64| {
            let (spilled_count, spilled_bytes, spill_seconds) = Moves::sum(into);
            let (unspilled_count, unspilled_bytes, unspill_seconds) = Moves::sum(out);
            TierStatistics {
                spilled_count,
                spilled_bytes,
                spill_seconds,
                unspilled_count,
                unspilled_bytes,
                unspill_seconds,
                held_bytes: held,
                held_count,
            }
        };
        let host_bytes = self.store.host_bytes();
        let disk_bytes = self.store.disk_bytes();
        SpillStatistics {
            device: self.device().ordinal(),
            limit: t.limit.load(Ordering::Relaxed),
            tracked_bytes: t.tracked.load(Ordering::Relaxed).max(0) as u64,
            peak_tracked_bytes: t.peak.load(Ordering::Relaxed).max(0) as u64,
            tracked_count: counts[Tier::Device as usize],
            spilled_count,
            spilled_bytes,
            spill_seconds,
            spilled_without_copy_count: t.without_copy[0].load(Ordering::Relaxed),
            spilled_without_copy_bytes: t.without_copy[1].load(Ordering::Relaxed),
            unspilled_count,
            unspilled_bytes,
            unspill_seconds,
            host_bytes,
            host_kept_bytes: self.store.host_kept_bytes(),
            host_pageable_bytes: self.store.host_pageable_bytes(),
            host_pageable_total_bytes: self.store.host_pageable_total_bytes(),
            host_pool_bytes: self.store.host().capacity() as u64,
            host_pinning_seconds: self.store.host().pinning_time().as_secs_f64(),
            host_registering_seconds: self.store.host().registering_time().as_secs_f64(),
            disk_bytes,
            host: tier(
                [m(d, h), m(k, h)],
                [m(h, d), m(h, k)],
                host_bytes,
                counts[Tier::Host as usize],
            ),
            disk: tier(
                [m(d, k), m(h, k)],
                [m(k, d), m(k, h)],
                disk_bytes,
                counts[Tier::Disk as usize],
            ),
            received_on_device_bytes: t.received[0].load(Ordering::Relaxed),
            received_off_device_bytes: t.received[1].load(Ordering::Relaxed),
            unspilled_to_send_bytes: t.unspilled_to_send.load(Ordering::Relaxed),
        }
    }
}
