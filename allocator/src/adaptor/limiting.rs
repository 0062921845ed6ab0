//! [`LimitingResourceAdaptor`]: a hard cap on the bytes in use through it (RMM's
//! `limiting_resource_adaptor`).
//!
//! The cap counts bytes *in use* (handed out, not freed, each rounded up to 256 bytes), never bytes
//! a pool below merely caches (CuPy's pool-limit problem, cupy#7678). Put it above the pool to cap
//! use, or between pool and device to cap the pool's reservation. A hard cap needs one figure all
//! threads agree on: one shared atomic counter.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::ALLOCATION_ALIGNMENT;
use crate::backend::{DevicePtr, MemInfo};
use crate::error::{Error, Result, fmt_bytes};
use crate::resource::{DeviceMemoryResource, LiveBlock, SharedResource};
use crate::stream_view::StreamView;

/// A limit in bytes or as a fraction of the device's total memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MemoryLimit {
    /// This many bytes.
    Bytes(usize),
    /// This fraction, in (0, 1], of the device's total memory.
    Fraction(f64),
}

/// Refuses allocations taking bytes in use past a limit with [`Error::LimitExceeded`] (an OOM).
pub struct LimitingResourceAdaptor {
    upstream: SharedResource,
    limit: usize,
    limit_source: String,
    used: AtomicUsize,
}

impl fmt::Debug for LimitingResourceAdaptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitingResourceAdaptor")
            .field("upstream", &self.upstream.name())
            .field("limit", &self.limit)
            .field("used", &self.used_bytes())
            .finish()
    }
}

fn rounded(bytes: usize) -> Option<usize> {
    bytes.checked_next_multiple_of(ALLOCATION_ALIGNMENT)
}

/// The bytes `blocks` use here, each rounded as an allocation is.
fn live_bytes(blocks: &[LiveBlock]) -> usize {
    let live = blocks.iter().filter(|b| !b.ptr.is_null());
    live.filter_map(|b| rounded(b.bytes)).sum()
}

impl LimitingResourceAdaptor {
    /// Caps the bytes in use through `upstream` at `limit` (a fraction: of device memory).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a fraction outside (0, 1]; [`Error::Driver`] if the device
    /// cannot report its memory.
    pub fn new(upstream: SharedResource, limit: MemoryLimit) -> Result<Self> {
        let (limit, limit_source) = match limit {
            MemoryLimit::Bytes(b) => return Ok(Self::with_bytes(upstream, b)),
            MemoryLimit::Fraction(f) if f > 0.0 && f <= 1.0 => {
                let total = upstream.device().mem_info()?.total;
                (
                    (total as f64 * f) as usize,
                    format!("{:.1}% of {}", f * 100.0, fmt_bytes(total)),
                )
            }
            MemoryLimit::Fraction(f) => {
                return Err(Error::invalid_argument(
                    "limit",
                    f,
                    "a fraction in (0, 1] of device memory, or a limit in bytes",
                ));
            }
        };
        Ok(Self::with_source(upstream, limit, limit_source))
    }

    /// Caps the bytes in use through `upstream` at `bytes`.
    pub fn with_bytes(upstream: SharedResource, bytes: usize) -> Self {
        Self::with_source(upstream, bytes, format!("{bytes} bytes"))
    }

    fn with_source(upstream: SharedResource, limit: usize, limit_source: String) -> Self {
        LimitingResourceAdaptor {
            upstream,
            limit,
            limit_source,
            used: AtomicUsize::new(0),
        }
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &SharedResource {
        &self.upstream
    }

    /// The limit in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes in use, each allocation rounded up to 256 bytes (RMM's `get_allocated_bytes`).
    pub fn used_bytes(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Bytes that may still be allocated before the limit.
    pub fn available_bytes(&self) -> usize {
        self.limit.saturating_sub(self.used_bytes())
    }

    /// Counts `blocks`, live allocations of another stack now owned by this stack's resource (a
    /// reinitialize keeping data in place), as in use here, each rounded up to 256 bytes. Never
    /// refused: use may exceed the limit, refusing allocations until enough is freed.
    pub fn take_over_live(&self, blocks: &[LiveBlock]) {
        self.used.fetch_add(live_bytes(blocks), Ordering::Relaxed);
    }

    /// Stops counting `blocks`, live allocations of this adaptor taken over by another stack.
    pub fn hand_over_live(&self, blocks: &[LiveBlock]) {
        let bytes = live_bytes(blocks);
        // Never below zero, whatever the caller passed.
        let _ = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(bytes))
            });
    }

    #[cold]
    #[inline(never)]
    fn refuse(&self, bytes: usize, in_use: usize) -> Error {
        let device = self.upstream.device().ordinal();
        tracing::debug!(
            device,
            requested = bytes,
            in_use,
            limit = self.limit,
            "limit reached: allocation refused"
        );
        Error::LimitExceeded {
            requested: bytes,
            device,
            in_use,
            limit: self.limit,
            limit_source: self.limit_source.clone(),
            resource: "LimitingResourceAdaptor",
        }
    }
}

impl DeviceMemoryResource for LimitingResourceAdaptor {
    fn allocate(&self, bytes: usize, stream: StreamView) -> Result<DevicePtr> {
        if bytes == 0 {
            return self.upstream.allocate(0, stream);
        }
        let size = match rounded(bytes) {
            Some(s) if s <= self.limit => s,
            _ => return Err(self.refuse(bytes, self.used_bytes())),
        };
        let before = self.used.fetch_add(size, Ordering::Relaxed);
        if before + size > self.limit {
            self.used.fetch_sub(size, Ordering::Relaxed);
            return Err(self.refuse(bytes, before));
        }
        self.upstream.allocate(bytes, stream).inspect_err(|_| {
            self.used.fetch_sub(size, Ordering::Relaxed);
        })
    }

    fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: StreamView) -> Result<()> {
        self.upstream.deallocate(ptr, bytes, stream)?;
        if !ptr.is_null()
            && let Some(size) = rounded(bytes)
        {
            self.used.fetch_sub(size, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Bytes still allocatable before the limit (at most the upstream's free memory), of the limit.
    fn memory_info(&self) -> Result<MemInfo> {
        let up = self.upstream.memory_info()?;
        Ok(MemInfo {
            free: self.available_bytes().min(up.free),
            total: self.limit,
        })
    }

    crate::adaptor::upstream_tail!("LimitingResourceAdaptor", own memory_info);
}
