//! [`TrackingResourceAdaptor`]: every outstanding allocation with its size, stream, thread and
//! (when enabled) a backtrace, and leak reports (RMM's `tracking_resource_adaptor`).
//!
//! Use it to find what is still allocated before a reinitialize, or at shutdown: dropping the
//! adaptor with allocations outstanding logs a leak report with `tracing::warn!`.

use std::any::Any;
use std::backtrace::Backtrace;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::Thread;
use std::time::Instant;

use parking_lot::Mutex;

use super::same_adaptor;
use crate::backend::{DevicePtr, MemInfo};
use crate::device::Device;
use crate::error::{Result, fmt_bytes};
use crate::per_device::SharedResource;
use crate::resource::DeviceMemoryResource;
use crate::stream::StreamView;

const SHARDS: usize = 16;

/// One outstanding allocation.
#[derive(Debug, Clone)]
pub struct AllocationRecord {
    /// The pointer handed out.
    pub ptr: DevicePtr,
    /// Bytes requested.
    pub size: usize,
    /// The stream it was allocated on.
    pub stream: StreamView,
    /// The allocating thread.
    pub thread: Thread,
    /// When it was allocated.
    pub at: Instant,
    /// Where it was allocated, when backtraces are captured.
    pub backtrace: Option<Arc<Backtrace>>,
}

impl fmt::Display for AllocationRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} on stream {:#x} by thread {}, {:.3} s ago",
            self.ptr,
            fmt_bytes(self.size),
            self.stream.raw(),
            self.thread
                .name()
                .map_or_else(|| format!("{:?}", self.thread.id()), str::to_string),
            self.at.elapsed().as_secs_f64()
        )?;
        if let Some(bt) = &self.backtrace {
            write!(f, "\n    allocated at:\n{bt}")?;
        }
        Ok(())
    }
}

/// What is still allocated through a tracking adaptor.
#[derive(Debug, Clone)]
pub struct LeakReport {
    /// Device ordinal.
    pub device: u32,
    /// The upstream resource's name.
    pub resource: &'static str,
    /// The outstanding allocations, by address.
    pub allocations: Vec<AllocationRecord>,
    /// Their total size in bytes.
    pub bytes: usize,
}

impl LeakReport {
    /// True when nothing is outstanding.
    pub fn is_empty(&self) -> bool {
        self.allocations.is_empty()
    }
}

impl fmt::Display for LeakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.allocations.is_empty() {
            return write!(
                f,
                "no allocations outstanding on device {} ({})",
                self.device, self.resource
            );
        }
        write!(
            f,
            "{} allocation(s) of {} outstanding on device {} ({}); free them (drop their \
             buffers) before the resource is dropped or reinitialized:",
            self.allocations.len(),
            fmt_bytes(self.bytes),
            self.device,
            self.resource
        )?;
        for a in &self.allocations {
            write!(f, "\n  {a}")?;
        }
        Ok(())
    }
}

/// Records every allocation until it is freed.
pub struct TrackingResourceAdaptor {
    upstream: SharedResource,
    backtraces: AtomicBool,
    shards: Box<[Mutex<HashMap<u64, AllocationRecord>>]>,
    bytes: AtomicUsize,
}

impl fmt::Debug for TrackingResourceAdaptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrackingResourceAdaptor")
            .field("upstream", &self.upstream.name())
            .field("outstanding_bytes", &self.outstanding_bytes())
            .field("outstanding", &self.outstanding_count())
            .finish()
    }
}

impl TrackingResourceAdaptor {
    /// Tracks what goes through to `upstream`, without backtraces.
    pub fn new(upstream: SharedResource) -> Self {
        TrackingResourceAdaptor {
            upstream,
            backtraces: AtomicBool::new(false),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            bytes: AtomicUsize::new(0),
        }
    }

    /// Tracks with a backtrace captured at every allocation (microseconds each: for
    /// debugging).
    pub fn with_backtraces(upstream: SharedResource) -> Self {
        let t = Self::new(upstream);
        t.set_capture_backtraces(true);
        t
    }

    /// Turns backtrace capture on or off for later allocations.
    pub fn set_capture_backtraces(&self, on: bool) {
        self.backtraces.store(on, Ordering::Relaxed);
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &SharedResource {
        &self.upstream
    }

    fn shard(&self, ptr: DevicePtr) -> &Mutex<HashMap<u64, AllocationRecord>> {
        // Allocations are 256-byte aligned: mix the bits above that.
        let h = (ptr.addr() >> 8).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60;
        &self.shards[h as usize % SHARDS]
    }

    /// Bytes outstanding (requested sizes).
    pub fn outstanding_bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Number of outstanding allocations.
    pub fn outstanding_count(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Every outstanding allocation, by address.
    pub fn outstanding(&self) -> Vec<AllocationRecord> {
        let mut v: Vec<AllocationRecord> = self
            .shards
            .iter()
            .flat_map(|s| s.lock().values().cloned().collect::<Vec<_>>())
            .collect();
        v.sort_by_key(|a| a.ptr);
        v
    }

    /// What is outstanding now.
    pub fn leak_report(&self) -> LeakReport {
        let allocations = self.outstanding();
        LeakReport {
            device: self.upstream.device().ordinal(),
            resource: self.upstream.name(),
            bytes: allocations.iter().map(|a| a.size).sum(),
            allocations,
        }
    }

    /// Logs the outstanding allocations with `tracing::warn!` (nothing when there are none).
    pub fn log_outstanding(&self) {
        let report = self.leak_report();
        if !report.is_empty() {
            tracing::warn!("{report}");
        }
    }
}

impl DeviceMemoryResource for TrackingResourceAdaptor {
    fn allocate(&self, bytes: usize, stream: StreamView) -> Result<DevicePtr> {
        let ptr = self.upstream.allocate(bytes, stream)?;
        if ptr.is_null() {
            return Ok(ptr);
        }
        let backtrace = self
            .backtraces
            .load(Ordering::Relaxed)
            .then(|| Arc::new(Backtrace::force_capture()));
        let record = AllocationRecord {
            ptr,
            size: bytes,
            stream,
            thread: std::thread::current(),
            at: Instant::now(),
            backtrace,
        };
        if let Some(old) = self.shard(ptr).lock().insert(ptr.addr(), record) {
            // The upstream handed out a pointer we think is live: keep the figures honest.
            tracing::warn!(
                "TrackingResourceAdaptor: {} was allocated again without being freed \
                 (previous allocation of {} bytes); the upstream {} may be broken",
                ptr,
                old.size,
                self.upstream.name()
            );
            self.bytes.fetch_sub(old.size, Ordering::Relaxed);
        }
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok(ptr)
    }

    fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: StreamView) -> Result<()> {
        self.upstream.deallocate(ptr, bytes, stream)?;
        if ptr.is_null() {
            return Ok(());
        }
        match self.shard(ptr).lock().remove(&ptr.addr()) {
            Some(rec) => {
                if rec.size != bytes {
                    tracing::warn!(
                        "TrackingResourceAdaptor: {} freed with size {} but allocated with {}",
                        ptr,
                        bytes,
                        rec.size
                    );
                }
                self.bytes.fetch_sub(rec.size, Ordering::Relaxed);
            }
            None => tracing::warn!(
                "TrackingResourceAdaptor: {} ({} bytes) freed but not allocated through this \
                 adaptor",
                ptr,
                bytes
            ),
        }
        Ok(())
    }

    fn device(&self) -> Device {
        self.upstream.device()
    }

    fn name(&self) -> &'static str {
        "TrackingResourceAdaptor"
    }

    fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
        same_adaptor(self, other, |a: &Self| &a.upstream)
    }

    fn memory_info(&self) -> Result<MemInfo> {
        self.upstream.memory_info()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for TrackingResourceAdaptor {
    fn drop(&mut self) {
        self.log_outstanding();
    }
}
