//! [`LimitingResourceAdaptor`]: a hard cap on the bytes in use through it (RMM's
//! `limiting_resource_adaptor`).
//!
//! The cap counts bytes *in use* (handed out and not freed, each rounded up to 256 bytes as
//! the allocation alignment makes them), never bytes a pool below merely caches: a pool that
//! keeps freed blocks does not eat into the limit (CuPy users hit that with its pool limit,
//! cupy#7678). Put the limit above the pool to cap use, or between the pool and the device to
//! cap what the pool may reserve.
//!
//! A hard cap needs one figure every thread agrees on: each allocation and free is one atomic
//! add on a shared counter (unlike the statistics adaptor's per-thread shards).

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::ALLOCATION_ALIGNMENT;
use crate::backend::{DevicePtr, MemInfo};
use crate::error::{Error, Result, fmt_bytes};
use crate::resource::SharedResource;
use crate::resource::{DeviceMemoryResource, LiveBlock};
use crate::stream_view::StreamView;

/// A limit in bytes or as a fraction of the device's total memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MemoryLimit {
    /// This many bytes.
    Bytes(usize),
    /// This fraction, in (0, 1], of the device's total memory.
    Fraction(f64),
}

/// Refuses allocations that would take the bytes in use past a limit, with
/// [`Error::LimitExceeded`] (an out-of-memory error).
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

impl LimitingResourceAdaptor {
    /// Caps the bytes in use through `upstream` at `limit`. A fraction is taken of the total
    /// memory of the upstream's device.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when a fraction `limit` is not in
    /// (0, 1]; [`Error::Driver`](crate::Error::Driver) when the device cannot report its total
    /// memory.
    pub fn new(upstream: SharedResource, limit: MemoryLimit) -> Result<Self> {
        let (limit, limit_source) = match limit {
            MemoryLimit::Bytes(b) => (b, format!("{} bytes", b)),
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
        Ok(LimitingResourceAdaptor {
            upstream,
            limit,
            limit_source,
            used: AtomicUsize::new(0),
        })
    }

    /// Caps the bytes in use through `upstream` at `bytes`.
    pub fn with_bytes(upstream: SharedResource, bytes: usize) -> Self {
        LimitingResourceAdaptor {
            upstream,
            limit: bytes,
            limit_source: format!("{bytes} bytes"),
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

    /// Bytes in use through the adaptor, each allocation rounded up to 256 bytes (RMM's
    /// `get_allocated_bytes`).
    pub fn used_bytes(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Bytes that may still be allocated before the limit.
    pub fn available_bytes(&self) -> usize {
        self.limit.saturating_sub(self.used_bytes())
    }

    /// Counts `blocks`, live allocations made through another stack whose memory this
    /// stack's resource now owns (a reinitialize that keeps data in place), as in use
    /// through this adaptor, each rounded up to 256 bytes. They are not refused: the bytes
    /// in use may then be above the limit, and allocations are refused until enough is
    /// freed. Slow path.
    pub fn take_over_live(&self, blocks: &[LiveBlock]) {
        let bytes: usize = blocks
            .iter()
            .filter(|b| !b.ptr.is_null())
            .filter_map(|b| rounded(b.bytes))
            .sum();
        self.used.fetch_add(bytes, Ordering::Relaxed);
    }

    /// No longer counts `blocks`, live allocations made through this adaptor that another
    /// stack has taken over, as in use here. Slow path.
    pub fn hand_over_live(&self, blocks: &[LiveBlock]) {
        let bytes: usize = blocks
            .iter()
            .filter(|b| !b.ptr.is_null())
            .filter_map(|b| rounded(b.bytes))
            .sum();
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

    /// What may still be allocated before the limit (at most what the upstream reports
    /// free), of the limit.
    fn memory_info(&self) -> Result<MemInfo> {
        let up = self.upstream.memory_info()?;
        Ok(MemInfo {
            free: self.available_bytes().min(up.free),
            total: self.limit,
        })
    }

    crate::adaptor::upstream_tail!("LimitingResourceAdaptor", own memory_info);
}
