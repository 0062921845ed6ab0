//! [`PinnedHostPool`]: a pool of page-locked host memory, pinned once and reused: the host
//! side of spilling.
//!
//! `cuMemHostAlloc` pins page by page inside the driver (431 ms for 1 GiB on an H200, and
//! slower still from several threads at once). The pool instead maps anonymous memory, faults
//! it in on several threads and registers it with `cuMemHostRegister` in chunks, also on
//! several threads ([`PinnedRegion`]: 8 GiB at 15.7 GB/s on an H200 machine), then hands out
//! [`PinnedSlice`]s of it: a first-fit
//! free list per chunk, neighbours merged on return. A slice never crosses a chunk (each chunk
//! is one registration), so the largest slice is [`PinnedHostPool::max_slice`]; larger data
//! is stored as several slices.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::backend::host::{PinnedRegion, PinnedSlice, SliceOwner};
use crate::backend::{self, Backend};
use crate::error::{Error, Result, fmt_bytes};

/// Slices are multiples of this many bytes (and so aligned to it).
pub const PINNED_ALIGNMENT: usize = 256;
/// Smallest registered chunk.
const MIN_CHUNK: usize = 256 << 20;
/// Threads that pre-fault and register at most.
const MAX_THREADS: usize = 8;

/// A pool of pinned host memory. Cheap to clone (shared).
#[derive(Clone)]
pub struct PinnedHostPool {
    inner: Arc<Inner>,
}

struct Inner {
    region: Arc<PinnedRegion>,
    /// Per chunk: free ranges, offset → length.
    free: Mutex<Vec<BTreeMap<usize, usize>>>,
    used: std::sync::atomic::AtomicUsize,
    peak: std::sync::atomic::AtomicUsize,
    pinning: Duration,
}

impl fmt::Debug for PinnedHostPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedHostPool")
            .field("capacity", &self.capacity())
            .field("used", &self.used())
            .finish()
    }
}

impl PinnedHostPool {
    /// Pins `bytes` (rounded up to 2 MiB) through the process-wide backend.
    pub fn new(bytes: usize) -> Result<PinnedHostPool> {
        Self::on(backend::global()?, bytes)
    }

    /// Pins `bytes` (rounded up to 2 MiB) through `backend`.
    pub fn on(backend: &'static dyn Backend, bytes: usize) -> Result<PinnedHostPool> {
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(MAX_THREADS);
        let start = Instant::now();
        let region = PinnedRegion::new(backend, bytes, threads, MIN_CHUNK)?;
        let pinning = start.elapsed();
        let free = region
            .chunks()
            .iter()
            .map(|&(o, l)| BTreeMap::from([(o, l)]))
            .collect();
        tracing::debug!(
            bytes = region.len(),
            chunks = region.chunks().len(),
            ms = pinning.as_secs_f64() * 1e3,
            "pinned host pool made"
        );
        Ok(PinnedHostPool {
            inner: Arc::new(Inner {
                region: Arc::new(region),
                free: Mutex::new(free),
                used: 0.into(),
                peak: 0.into(),
                pinning,
            }),
        })
    }

    /// Bytes pinned.
    pub fn capacity(&self) -> usize {
        self.inner.region.len()
    }

    /// Bytes handed out in live slices.
    pub fn used(&self) -> usize {
        self.inner.used.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The most bytes handed out at once.
    pub fn peak(&self) -> usize {
        self.inner.peak.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The largest slice the pool can ever hand out (one registered chunk).
    pub fn max_slice(&self) -> usize {
        self.inner
            .region
            .chunks()
            .iter()
            .map(|c| c.1)
            .max()
            .unwrap_or(0)
    }

    /// The largest slice it can hand out now.
    pub fn largest_free(&self) -> usize {
        self.inner
            .free
            .lock()
            .iter()
            .flat_map(|m| m.values())
            .copied()
            .max()
            .unwrap_or(0)
    }

    /// How long pinning took.
    pub fn pinning_time(&self) -> Duration {
        self.inner.pinning
    }

    /// A slice of `bytes` (rounded up to [`PINNED_ALIGNMENT`]), first fit. Fails with
    /// [`Error::HostOutOfMemory`] when no free range is large enough.
    pub fn allocate(&self, bytes: usize) -> Result<PinnedSlice> {
        let len = bytes.max(1).next_multiple_of(PINNED_ALIGNMENT);
        let mut free = self.inner.free.lock();
        let found = free.iter_mut().find_map(|ranges| {
            let (&offset, &size) = ranges.iter().find(|(_, s)| **s >= len)?;
            ranges.remove(&offset);
            if size > len {
                ranges.insert(offset + len, size - len);
            }
            Some(offset)
        });
        drop(free);
        let Some(offset) = found else {
            tracing::debug!(
                requested = len,
                used = self.used(),
                capacity = self.capacity(),
                "pinned host pool full"
            );
            return Err(Error::HostOutOfMemory {
                requested: len,
                resource: "PinnedHostPool",
            });
        };
        let used = self
            .inner
            .used
            .fetch_add(len, std::sync::atomic::Ordering::Relaxed)
            + len;
        self.inner
            .peak
            .fetch_max(used, std::sync::atomic::Ordering::Relaxed);
        Ok(PinnedSlice::carve(
            Arc::clone(&self.inner.region),
            Arc::clone(&self.inner) as Arc<dyn SliceOwner>,
            offset,
            len,
        ))
    }
}

impl fmt::Display for PinnedHostPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pinned host pool: {} of {} in use (peak {}), pinned in {:.1} ms",
            fmt_bytes(self.used()),
            fmt_bytes(self.capacity()),
            fmt_bytes(self.peak()),
            self.pinning_time().as_secs_f64() * 1e3
        )
    }
}

impl SliceOwner for Inner {
    fn give_back(&self, offset: usize, len: usize) {
        let chunks = self.region.chunks();
        let Some(c) = chunks
            .iter()
            .position(|&(o, l)| offset >= o && offset < o + l)
        else {
            tracing::error!(
                offset,
                len,
                "a pinned slice outside its pool was given back"
            );
            return;
        };
        let mut free = self.free.lock();
        let ranges = &mut free[c];
        let (mut start, mut size) = (offset, len);
        // Merge with the free range just before, then the one just after.
        if let Some((&o, &l)) = ranges.range(..start).next_back()
            && o + l == start
        {
            ranges.remove(&o);
            start = o;
            size += l;
        }
        if let Some(l) = ranges.remove(&(start + size)) {
            size += l;
        }
        ranges.insert(start, size);
        drop(free);
        self.used
            .fetch_sub(len, std::sync::atomic::Ordering::Relaxed);
    }
}
