//! Hooks that come with the library: [`TracingHook`] (every event to `tracing`) and
//! [`LineProfileHook`] (bytes per call site, as CuPy's), with the call sites they attribute
//! allocations to ([`at_call_site`], [`allocate_here`]).

use std::cell::Cell;
use std::collections::HashMap;
use std::fmt;
use std::panic::Location;

use parking_lot::Mutex;
use serde::Serialize;

use super::{CALL_SITE, HookEvent, MemoryHook, set_local};
use crate::backend::DevicePtr;
use crate::error::{Result, fmt_bytes};
use crate::resource::DeviceMemoryResource;
use crate::stream_view::StreamView;

/// Logs every event with `tracing::debug!` (target `rmm_allocator::hooks`).
#[derive(Debug, Default, Clone, Copy)]
pub struct TracingHook;

impl MemoryHook for TracingHook {
    fn name(&self) -> &str {
        "TracingHook"
    }
    fn on_event(&self, e: &HookEvent) {
        tracing::debug!(
            target: "rmm_allocator::hooks",
            event = e.point.name(),
            device = e.device,
            size = e.size,
            mem_size = e.mem_size,
            ptr = %e.ptr,
            stream = e.stream.raw(),
            resource = e.resource,
            "memory hook"
        );
    }
}

/// Runs `f` with the caller's source line as the call site of every allocation inside it (the
/// innermost `at_call_site` or [`allocate_here`] wins).
#[track_caller]
pub fn at_call_site<R>(f: impl FnOnce() -> R) -> R {
    let _site = set_local(&CALL_SITE, Some(Location::caller()));
    f()
}

/// This thread's call site set by [`allocate_here`] / [`at_call_site`], if any.
pub fn current_call_site() -> Option<&'static Location<'static>> {
    CALL_SITE.with(Cell::get)
}

/// What one call site allocated, as CuPy's `LineProfileHook` reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SiteProfile {
    /// `file:line:column`, or `<unattributed>` outside [`allocate_here`] / [`at_call_site`].
    pub site: String,
    /// Requests a pool served (`malloc_postprocess` with a pointer).
    pub malloc_count: u64,
    /// Bytes those requests used, rounded (CuPy's `used_bytes`).
    pub used_bytes: u64,
    /// Chunks taken from the upstream while serving them (`alloc_postprocess` with a pointer).
    pub alloc_count: u64,
    /// Bytes of those chunks (CuPy's `acquired_bytes`).
    pub acquired_bytes: u64,
}

/// Aggregates bytes and counts by call site (CuPy's `LineProfileHook`): the source line given by
/// [`allocate_here`] or [`at_call_site`]. For backtraces, use a
/// [`crate::adaptor::TrackingResourceAdaptor`].
#[derive(Debug, Default)]
pub struct LineProfileHook {
    sites: Mutex<HashMap<Option<&'static Location<'static>>, SiteProfile>>,
}

const UNATTRIBUTED: &str = "<unattributed>";

impl LineProfileHook {
    /// An empty profile.
    pub fn new() -> Self {
        Self::default()
    }

    fn with_site(&self, f: impl FnOnce(&mut SiteProfile)) {
        let site = current_call_site();
        let mut sites = self.sites.lock();
        let entry = sites.entry(site).or_insert_with(|| SiteProfile {
            site: site.map_or_else(|| UNATTRIBUTED.to_string(), |l| l.to_string()),
            ..SiteProfile::default()
        });
        f(entry);
    }

    /// Every call site seen so far, most bytes used first.
    pub fn report(&self) -> Vec<SiteProfile> {
        let mut v: Vec<SiteProfile> = self.sites.lock().values().cloned().collect();
        v.sort_by(|a, b| {
            b.used_bytes
                .cmp(&a.used_bytes)
                .then_with(|| a.site.cmp(&b.site))
        });
        v
    }

    /// Forgets everything seen so far.
    pub fn clear(&self) {
        self.sites.lock().clear();
    }
}

impl MemoryHook for LineProfileHook {
    fn name(&self) -> &str {
        "LineProfileHook"
    }
    fn alloc_postprocess(&self, e: &HookEvent) {
        if !e.ptr.is_null() {
            self.with_site(|s| {
                s.alloc_count += 1;
                s.acquired_bytes += e.mem_size as u64;
            });
        }
    }
    fn malloc_postprocess(&self, e: &HookEvent) {
        if !e.ptr.is_null() {
            self.with_site(|s| {
                s.malloc_count += 1;
                s.used_bytes += e.mem_size as u64;
            });
        }
    }
}

impl fmt::Display for LineProfileHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<48} {:>10} {:>12} {:>8} {:>12}",
            "call site", "mallocs", "used", "allocs", "acquired"
        )?;
        for s in self.report() {
            writeln!(
                f,
                "{:<48} {:>10} {:>12} {:>8} {:>12}",
                s.site,
                s.malloc_count,
                fmt_bytes(s.used_bytes as usize),
                s.alloc_count,
                fmt_bytes(s.acquired_bytes as usize)
            )?;
        }
        Ok(())
    }
}

/// Allocates from `resource` with the caller's line as the call site [`LineProfileHook`] and
/// [`current_call_site`] see.
///
/// # Errors
/// What `resource.allocate` returns.
#[track_caller]
pub fn allocate_here(
    resource: &dyn DeviceMemoryResource,
    bytes: usize,
    stream: StreamView,
) -> Result<DevicePtr> {
    // `at_call_site` is `#[track_caller]` too: the site is this function's caller.
    at_call_site(|| resource.allocate(bytes, stream))
}
