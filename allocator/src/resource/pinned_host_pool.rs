//! [`PinnedHostPool`]: page-locked host memory, pinned once and reused: the host side of spilling.
//!
//! The pool maps anonymous memory and registers it (`cuMemHostRegister`) in chunks on several
//! threads ([`PinnedRegion`]), faster than `cuMemHostAlloc`'s page-by-page pinning, then hands out
//! [`PinnedSlice`]s first-fit in a chunk: data over [`PinnedHostPool::max_slice`] takes several.
//!
//! A pool is fixed ([`PinnedHostPool::new`]) or growable up to an optional maximum
//! ([`PinnedHostPool::growable`]). A growable pool may pin ahead of demand on a background thread
//! ([`PinnedHostPool::keep_free`]), once a request has needed pinned memory, in small chunks: a
//! registration holds the driver, stalling copies enqueued meanwhile. While it does, a miss of
//! 8 MiB or more takes pageable memory of its own rather than wait (the driver copies it on every
//! device at once, where pinning serializes on one driver lock); smaller misses pin what they need.
//! [`PinnedHostPool::release_idle`] makes a pool hold only what its slices need.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::backend::host::{PinnedRegion, PinnedSlice, SliceOwner};
use crate::backend::{self, Backend};
use crate::error::{Error, Result, fmt_bytes};

/// Slices are multiples of this many bytes (and so aligned to it).
pub const PINNED_ALIGNMENT: usize = 256;
/// Smallest chunk pinned for a request or a fixed pool: larger chunks, larger slices, fewer copies.
const MIN_CHUNK: usize = 256 << 20;
/// Chunk size when pinning ahead: small, so copies enqueued during a registration hardly wait.
const AHEAD_CHUNK: usize = 32 << 20;
/// Threads that pre-fault and register at most.
const MAX_THREADS: usize = 8;
/// Bounds of a growable pool's step, its capacity so far (so it doubles), unless one needs more.
const GROWTH_STEP: usize = 32 << 20;
const MAX_GROWTH_STEP: usize = 4 << 30;
/// Most pinned ahead per step; a step is usable once fully pinned, so smaller ones help sooner.
const AHEAD_STEP: usize = 256 << 20;
/// Smallest pageable request while pinning ahead: each is a mapping of its own, in 2 MiB pages.
const PAGEABLE_MIN: usize = 8 << 20;

/// A pool of pinned host memory. Cheap to clone (shared).
#[derive(Clone)]
pub struct PinnedHostPool {
    inner: Arc<Inner>,
}

/// A handle on a [`PinnedHostPool`] that does not keep it alive ([`PinnedHostPool::downgrade`]).
#[derive(Clone, Debug)]
pub struct WeakPinnedHostPool {
    inner: std::sync::Weak<Inner>,
}

impl WeakPinnedHostPool {
    /// The pool, while it is alive.
    pub fn upgrade(&self) -> Option<PinnedHostPool> {
        self.inner.upgrade().map(|inner| PinnedHostPool { inner })
    }

    /// True when this is a handle on `pool`.
    pub fn is(&self, pool: &PinnedHostPool) -> bool {
        std::ptr::eq(self.inner.as_ptr(), Arc::as_ptr(&pool.inner))
    }
}

/// One registered chunk and its free ranges (offsets within its region).
struct Chunk {
    region: Arc<PinnedRegion>,
    /// Its index among the region's chunks.
    index: usize,
    start: usize,
    len: usize,
    free: BTreeMap<usize, usize>,
}

impl Chunk {
    fn is_free(&self) -> bool {
        self.free.get(&self.start) == Some(&self.len)
    }
}

/// The pool's state; the public accessors of [`PinnedHostPool`] document the counters.
struct Inner {
    backend: &'static dyn Backend,
    chunks: Mutex<Vec<Chunk>>,
    /// Held while pinning another region, so that two threads short of memory pin once.
    growing: Mutex<()>,
    /// `None`: fixed size. `Some(max)`: grows up to `max` bytes (`usize::MAX`: no maximum).
    grow_limit: Option<usize>,
    /// A fixed pool's size (0 if growable), to pin again after [`PinnedHostPool::release_idle`].
    fixed_size: AtomicUsize,
    capacity: AtomicUsize,
    /// Bytes being pinned now (by requests or ahead of demand).
    pinning: AtomicUsize,
    /// Bytes counted against the maximum (pinned, being pinned, pageable), taken in one atomic step
    /// so that requests and pinning ahead never pass it together.
    committed: AtomicUsize,
    max_slice: AtomicUsize,
    used: AtomicUsize,
    /// Bytes in live pinned slices.
    pinned_used: AtomicUsize,
    pageable: AtomicUsize,
    pageable_total: AtomicU64,
    peak: AtomicUsize,
    pinning_ns: AtomicU64,
    /// The part of `pinning_ns` spent registering memory with the driver.
    registering_ns: AtomicU64,
    reclaimable: AtomicUsize,
    headroom: AtomicUsize,
    pinning_ahead: AtomicBool,
    /// Set by [`PinnedHostPool::release_idle`]: emptied chunks go back at once; no pinning ahead.
    release_idle: AtomicBool,
}

impl fmt::Debug for PinnedHostPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedHostPool")
            .field("capacity", &self.capacity())
            .field("used", &self.used())
            .field("growable", &self.inner.grow_limit.is_some())
            .finish()
    }
}

fn pinning_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_THREADS)
}

impl PinnedHostPool {
    /// Pins `bytes` (rounded up to 2 MiB) through the process-wide backend; the pool never grows.
    ///
    /// # Errors
    /// [`Error::HostOutOfMemory`] or [`Error::Driver`] if pinning fails; the backend's open error.
    pub fn new(bytes: usize) -> Result<PinnedHostPool> {
        Self::on(backend::global()?, bytes)
    }

    /// As [`PinnedHostPool::new`], through `backend`.
    ///
    /// # Errors
    /// [`Error::HostOutOfMemory`] or [`Error::Driver`] when pinning fails.
    pub fn on(backend: &'static dyn Backend, bytes: usize) -> Result<PinnedHostPool> {
        let pool = Self::empty(backend, None);
        pool.inner.grow(bytes, MIN_CHUNK)?;
        let size = pool.capacity();
        pool.inner.fixed_size.store(size, Ordering::Relaxed);
        Ok(pool)
    }

    /// Empty pool pinning a region (at least 32 MiB) per miss, up to `maximum` bytes (rounded down
    /// to the 2 MiB pages it pins).
    pub fn growable(backend: &'static dyn Backend, maximum: Option<usize>) -> PinnedHostPool {
        let limit = maximum.map_or(usize::MAX, |m| m - m % PinnedRegion::ALIGNMENT);
        Self::empty(backend, Some(limit))
    }

    fn empty(backend: &'static dyn Backend, grow_limit: Option<usize>) -> PinnedHostPool {
        PinnedHostPool {
            inner: Arc::new(Inner {
                backend,
                chunks: Mutex::new(Vec::new()),
                growing: Mutex::new(()),
                grow_limit,
                fixed_size: 0.into(),
                capacity: 0.into(),
                pinning: 0.into(),
                committed: 0.into(),
                max_slice: 0.into(),
                used: 0.into(),
                pinned_used: 0.into(),
                pageable: 0.into(),
                pageable_total: 0.into(),
                peak: 0.into(),
                pinning_ns: 0.into(),
                registering_ns: 0.into(),
                reclaimable: 0.into(),
                headroom: 0.into(),
                pinning_ahead: false.into(),
                release_idle: false.into(),
            }),
        }
    }

    /// A handle that does not keep the pool alive.
    pub fn downgrade(&self) -> WeakPinnedHostPool {
        WeakPinnedHostPool {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// True when `other` is a handle on the same pool.
    pub fn same_pool(&self, other: &PinnedHostPool) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Bytes pinned.
    pub fn capacity(&self) -> usize {
        self.inner.capacity.load(Ordering::Relaxed)
    }

    /// True when the pool pins more memory as needed.
    pub fn is_growable(&self) -> bool {
        self.inner.grow_limit.is_some()
    }

    /// Bytes handed out in live slices, pageable ones included.
    pub fn used(&self) -> usize {
        self.inner.used.load(Ordering::Relaxed)
    }

    /// Pinned bytes not handed out.
    pub fn free(&self) -> usize {
        self.inner.free()
    }

    /// The part of [`used`](Self::used) in pageable slices (handed out while pinning ahead).
    pub fn pageable(&self) -> usize {
        self.inner.pageable.load(Ordering::Relaxed)
    }

    /// Bytes ever handed out in pageable slices.
    pub fn pageable_total(&self) -> u64 {
        self.inner.pageable_total.load(Ordering::Relaxed)
    }

    /// Bytes of live droppable copies ([`PinnedSlice::set_reclaimable`]): free for pinning ahead.
    pub fn reclaimable(&self) -> usize {
        self.inner.reclaimable.load(Ordering::Relaxed)
    }

    /// The most bytes handed out at once.
    pub fn peak(&self) -> usize {
        self.inner.peak.load(Ordering::Relaxed)
    }

    /// The largest slice without growing (one chunk; at least 32 MiB in a growable pool).
    pub fn max_slice(&self) -> usize {
        let least = if self.is_growable() { GROWTH_STEP } else { 0 };
        self.inner.max_slice.load(Ordering::Relaxed).max(least)
    }

    /// The largest slice it can hand out now without growing.
    pub fn largest_free(&self) -> usize {
        let chunks = self.inner.chunks.lock();
        let sizes = chunks.iter().flat_map(|c| c.free.values());
        sizes.copied().max().unwrap_or(0)
    }

    /// Keeps at least `bytes` pinned ahead of demand (growable pools, within the maximum) once a
    /// request has needed pinned memory. 0 stops it; what is pinned stays until [`Self::trim`].
    pub fn keep_free(&self, bytes: usize) {
        if !self.is_growable() {
            return;
        }
        self.inner.headroom.store(bytes, Ordering::Relaxed);
        if self.capacity() > 0 {
            Inner::pin_ahead(&self.inner);
        }
    }

    /// Unregisters and unmaps every chunk with nothing handed out; returns the bytes given back.
    pub fn trim(&self) -> usize {
        self.inner.trim()
    }

    /// With `on`, the pool holds no more pinned memory than its slices (spilling stopped): no
    /// pinning ahead, free memory back now, each chunk back with its last slice. `false` undoes it.
    pub fn release_idle(&self, on: bool) {
        self.inner.release_idle.store(on, Ordering::Release);
        if on {
            self.inner.headroom.store(0, Ordering::Relaxed);
            self.trim();
        }
    }

    /// Pins a fixed pool back to its size after [`release_idle`](Self::release_idle) (spilling
    /// resumes); nothing for a growable pool or one at its size.
    ///
    /// # Errors
    /// [`Error::HostOutOfMemory`] or [`Error::Driver`] when pinning fails (it keeps what it has).
    pub fn pin_again(&self) -> Result<()> {
        let size = self.inner.fixed_size.load(Ordering::Relaxed);
        let _one_grower = self.inner.growing.lock();
        let missing = size.saturating_sub(self.capacity());
        if missing > 0 {
            self.inner.grow(missing, MIN_CHUNK)?;
        }
        Ok(())
    }

    /// The free bytes kept pinned ahead of demand ([`keep_free`](Self::keep_free)).
    pub fn headroom(&self) -> usize {
        self.inner.headroom.load(Ordering::Relaxed)
    }

    /// True while a background thread is pinning ahead of demand.
    pub fn is_pinning_ahead(&self) -> bool {
        self.inner.pinning_ahead.load(Ordering::Acquire)
    }

    /// Time spent pinning so far.
    pub fn pinning_time(&self) -> Duration {
        Duration::from_nanos(self.inner.pinning_ns.load(Ordering::Relaxed))
    }

    /// The part of [`pinning_time`](Self::pinning_time) spent registering (not mapping, faulting).
    pub fn registering_time(&self) -> Duration {
        Duration::from_nanos(self.inner.registering_ns.load(Ordering::Relaxed))
    }

    /// First-fit slice of `bytes` (rounded to [`PINNED_ALIGNMENT`]); growable pools grow to fit
    /// (see the module docs).
    ///
    /// # Errors
    /// [`Error::HostOutOfMemory`] when nothing fits and the pool cannot grow.
    pub fn allocate(&self, bytes: usize) -> Result<PinnedSlice> {
        let len = bytes.max(1).next_multiple_of(PINNED_ALIGNMENT);
        if let Some(s) = self.try_allocate(len) {
            Inner::pin_ahead(&self.inner);
            return Ok(s);
        }
        if len >= PAGEABLE_MIN
            && self.headroom() > 0
            && !self.inner.release_idle.load(Ordering::Acquire)
            && let Some(s) = self.allocate_pageable(len)
        {
            Inner::pin_ahead(&self.inner);
            return Ok(s);
        }
        if self.inner.grow_limit.is_some() {
            let one_grower = self.inner.growing.lock();
            loop {
                // Read before looking for room: a grow that ends after the look is seen below.
                let was_pinning = self.inner.pinning.load(Ordering::Acquire) > 0;
                // Another thread may have grown the pool (or freed memory) meanwhile.
                if let Some(s) = self.try_allocate(len) {
                    drop(one_grower);
                    // The pool has pinned for a need: from now on it pins ahead, if asked.
                    Inner::pin_ahead(&self.inner);
                    return Ok(s);
                }
                // Double, within the step bounds and the maximum. While pinning ahead, pin only
                // this request's need; the background pins the rest.
                let (step, chunk) = match self.headroom() {
                    0 => (
                        self.capacity().clamp(GROWTH_STEP, MAX_GROWTH_STEP),
                        MIN_CHUNK,
                    ),
                    _ => (AHEAD_CHUNK, AHEAD_CHUNK),
                };
                let (step, chunk) = (len.max(step).min(self.inner.room()), len.max(chunk));
                if step >= len {
                    // Failing to pin is out of host memory, whatever the driver said: callers
                    // fall back to disk on that.
                    match self.inner.grow(step, chunk) {
                        Ok(true) => continue,
                        Ok(false) => {}
                        Err(e) => {
                            tracing::warn!(
                                requested = len,
                                capacity = self.capacity(),
                                "pinning more host memory failed: {e}"
                            );
                            break;
                        }
                    }
                }
                if !was_pinning && self.inner.pinning.load(Ordering::Acquire) == 0 {
                    break;
                }
                // The room left is being pinned ahead of demand: it is ours once pinned.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        tracing::debug!(
            requested = len,
            used = self.used(),
            capacity = self.capacity(),
            "pinned host pool full"
        );
        Err(Error::host_out_of_memory(len, "PinnedHostPool"))
    }

    /// A slice of pageable memory of its own, within the maximum; `None` if over it or unavailable.
    fn allocate_pageable(&self, len: usize) -> Option<PinnedSlice> {
        let bytes = len.next_multiple_of(PinnedRegion::ALIGNMENT);
        let inner = &self.inner;
        if !inner.commit(bytes) {
            return None;
        }
        let region = PinnedRegion::pageable(inner.backend, bytes, pinning_threads())
            .inspect_err(|e| tracing::debug!(bytes, "no pageable memory for a spill: {e}"));
        // A region of its own, never handed to anyone else: carving does not fail.
        let slice = region.ok().and_then(|r| {
            let owner = Arc::new(PageableOwner(Arc::clone(inner)));
            PinnedSlice::carve(Arc::new(r), owner, 0, len)
        });
        let Some(slice) = slice else {
            inner.committed.fetch_sub(bytes, Ordering::AcqRel);
            return None;
        };
        // Counted whole (2 MiB multiples), as the give-back subtracts them.
        inner.pageable.fetch_add(bytes, Ordering::AcqRel);
        inner
            .pageable_total
            .fetch_add(bytes as u64, Ordering::Relaxed);
        let used = inner.used.fetch_add(bytes, Ordering::Relaxed) + bytes;
        inner.peak.fetch_max(used, Ordering::Relaxed);
        Some(slice)
    }

    fn try_allocate(&self, len: usize) -> Option<PinnedSlice> {
        let mut chunks = self.inner.chunks.lock();
        let (region, offset) = chunks.iter_mut().find_map(|c| {
            let offset = crate::free_ranges::take_first_fit(&mut c.free, len)?;
            Some((Arc::clone(&c.region), offset))
        })?;
        // Carved under the lock: chunks leave this list under it before going back, so it succeeds.
        let slice = PinnedSlice::carve(
            region,
            Arc::clone(&self.inner) as Arc<dyn SliceOwner>,
            offset,
            len,
        );
        drop(chunks);
        let slice = slice?;
        self.inner.pinned_used.fetch_add(len, Ordering::Relaxed);
        let used = self.inner.used.fetch_add(len, Ordering::Relaxed) + len;
        self.inner.peak.fetch_max(used, Ordering::Relaxed);
        Some(slice)
    }
}

impl Inner {
    fn free(&self) -> usize {
        self.capacity
            .load(Ordering::Relaxed)
            .saturating_sub(self.pinned_used.load(Ordering::Relaxed))
    }

    /// What to pin ahead now: the step toward the headroom within the maximum, or `None`.
    fn ahead_step(&self) -> Option<usize> {
        if self.release_idle.load(Ordering::Acquire) {
            return None;
        }
        let want = self.headroom.load(Ordering::Relaxed);
        // Copies that can be dropped are room already: never pin more to keep them.
        let free = self.free() + self.reclaimable.load(Ordering::Relaxed);
        self.grow_limit?;
        let room = self.room();
        (want > free && room > 0)
            .then(|| (want - free).clamp(GROWTH_STEP, MAX_GROWTH_STEP).min(room))
    }

    /// Starts a thread pinning toward the headroom unless one runs or none is needed.
    fn pin_ahead(self: &Arc<Self>) {
        if self.ahead_step().is_none() || self.pinning_ahead.swap(true, Ordering::AcqRel) {
            return;
        }
        let pool = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("rmm-pin-ahead".into())
            .spawn(move || {
                // Without the `growing` lock: a short request pins its need, not waiting for this.
                while let Some(inner) = pool.upgrade() {
                    let Some(step) = inner.ahead_step() else {
                        inner.pinning_ahead.store(false, Ordering::Release);
                        return;
                    };
                    match inner.grow(step.min(AHEAD_STEP), AHEAD_CHUNK) {
                        // Told meanwhile to hold no more than its slices: the step goes back.
                        Ok(true) if inner.release_idle.load(Ordering::Acquire) => {
                            inner.trim();
                        }
                        Ok(true) => continue,
                        // A request took the room meanwhile.
                        Ok(false) => {}
                        Err(e) => {
                            tracing::warn!(
                                bytes = step,
                                "pinning host memory ahead of demand failed: {e}"
                            );
                        }
                    }
                    inner.pinning_ahead.store(false, Ordering::Release);
                    return;
                }
            });
        if let Err(e) = spawned {
            self.pinning_ahead.store(false, Ordering::Release);
            tracing::warn!("no thread to pin host memory ahead of demand: {e}");
        }
    }

    fn trim(&self) -> usize {
        let mut chunks = self.chunks.lock();
        let mut released = 0;
        chunks.retain(|c| {
            let gone = c.is_free() && c.region.release_chunk(c.index);
            released += if gone { c.len } else { 0 };
            !gone
        });
        drop(chunks);
        // Room first: the memory is gone already.
        self.committed.fetch_sub(released, Ordering::AcqRel);
        self.capacity.fetch_sub(released, Ordering::AcqRel);
        if released > 0 {
            tracing::debug!(bytes = released, "pinned host memory given back");
        }
        released
    }

    /// Bytes the pool may still pin or hand out pageable under its maximum.
    fn room(&self) -> usize {
        self.grow_limit
            .unwrap_or(usize::MAX)
            .saturating_sub(self.committed.load(Ordering::Acquire))
    }

    /// Counts `bytes` more against the maximum; false (nothing counted) if they do not fit.
    fn commit(&self, bytes: usize) -> bool {
        let limit = self.grow_limit.unwrap_or(usize::MAX);
        self.committed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                c.checked_add(bytes).filter(|&n| n <= limit)
            })
            .is_ok()
    }

    /// Pins and adds `bytes` in chunks of at least `min_chunk`; false (nothing pinned) if over max.
    fn grow(&self, bytes: usize, min_chunk: usize) -> Result<bool> {
        let bytes = bytes.max(1).next_multiple_of(PinnedRegion::ALIGNMENT);
        // Counted as being pinned before it is committed, so that a request finding no room
        // meanwhile waits for it rather than give up.
        self.pinning.fetch_add(bytes, Ordering::AcqRel);
        if !self.commit(bytes) {
            self.pinning.fetch_sub(bytes, Ordering::AcqRel);
            return Ok(false);
        }
        let start = Instant::now();
        let region = PinnedRegion::new(self.backend, bytes, pinning_threads(), min_chunk);
        let region = match region {
            Ok(r) => Arc::new(r),
            Err(e) => {
                self.committed.fetch_sub(bytes, Ordering::AcqRel);
                self.pinning.fetch_sub(bytes, Ordering::AcqRel);
                return Err(e);
            }
        };
        let (took, registering) = (start.elapsed(), region.registering_time());
        let nanos = |d: Duration| d.as_nanos() as u64;
        self.pinning_ns.fetch_add(nanos(took), Ordering::Relaxed);
        self.registering_ns
            .fetch_add(nanos(registering), Ordering::Relaxed);
        let mut chunks = self.chunks.lock();
        // Counted before its chunks can be seen: a trim that gives them back subtracts after.
        self.capacity.fetch_add(region.len(), Ordering::AcqRel);
        for (index, &(o, l)) in region.chunks().iter().enumerate() {
            chunks.push(Chunk {
                region: Arc::clone(&region),
                index,
                start: o,
                len: l,
                free: BTreeMap::from([(o, l)]),
            });
            self.max_slice.fetch_max(l, Ordering::Relaxed);
        }
        drop(chunks);
        self.pinning.fetch_sub(bytes, Ordering::AcqRel);
        tracing::debug!(
            bytes = region.len(),
            chunks = region.chunks().len(),
            ms = took.as_secs_f64() * 1e3,
            "pinned host memory added to the pool"
        );
        Ok(true)
    }
}

impl fmt::Display for PinnedHostPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pinned host pool: {} of {} in use (peak {}), pinned in {:.1} ms",
            fmt_bytes(self.inner.pinned_used.load(Ordering::Relaxed)),
            fmt_bytes(self.capacity()),
            fmt_bytes(self.peak()),
            self.pinning_time().as_secs_f64() * 1e3
        )?;
        if self.pageable() > 0 {
            write!(f, "; {} in pageable memory", fmt_bytes(self.pageable()))?;
        }
        Ok(())
    }
}

/// Takes back a pageable slice: its region goes back to the system with it.
struct PageableOwner(Arc<Inner>);

// Not `reclaimable`: spilled data keeps no copy in pageable memory (see the spill buffer's
// `to_device`), and dropping one would free no pinned room.
impl SliceOwner for PageableOwner {
    fn give_back(&self, region: &PinnedRegion, _offset: usize, _len: usize) {
        // The region's one slice is gone, so its one chunk has none alive.
        region.release_chunk(0);
        let bytes = region.len();
        self.0.used.fetch_sub(bytes, Ordering::Relaxed);
        self.0.pageable.fetch_sub(bytes, Ordering::AcqRel);
        self.0.committed.fetch_sub(bytes, Ordering::AcqRel);
    }
}

impl SliceOwner for Inner {
    fn reclaimable(&self, delta: isize) {
        // Atomic adds wrap: adding a negative delta's two's complement subtracts it.
        self.reclaimable
            .fetch_add(delta as usize, Ordering::Relaxed);
    }

    fn give_back(&self, region: &PinnedRegion, offset: usize, len: usize) {
        let mut chunks = self.chunks.lock();
        let Some(at) = chunks.iter().position(|c| {
            std::ptr::eq(Arc::as_ptr(&c.region), region)
                && (c.start..c.start + c.len).contains(&offset)
        }) else {
            drop(chunks);
            tracing::error!(
                offset,
                len,
                "a pinned slice outside its pool was given back"
            );
            return;
        };
        let chunk = &mut chunks[at];
        crate::free_ranges::give_back(&mut chunk.free, offset, len);
        // A pool that holds only what its slices need gives an emptied chunk back at once.
        let released = (self.release_idle.load(Ordering::Acquire)
            && chunk.is_free()
            && chunk.region.release_chunk(chunk.index))
        .then(|| chunks.swap_remove(at).len);
        drop(chunks);
        self.pinned_used.fetch_sub(len, Ordering::Relaxed);
        self.used.fetch_sub(len, Ordering::Relaxed);
        if let Some(bytes) = released {
            self.committed.fetch_sub(bytes, Ordering::AcqRel);
            self.capacity.fetch_sub(bytes, Ordering::AcqRel);
        }
    }
}
