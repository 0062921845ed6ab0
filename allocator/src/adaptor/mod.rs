//! Resource adaptors: each wraps an upstream
//! [`SharedResource`](crate::per_device::SharedResource) and is itself a
//! [`DeviceMemoryResource`], so they stack in any order (RMM's `*_resource_adaptor`s).
//!
//! | adaptor | what it adds |
//! |---|---|
//! | [`StatisticsResourceAdaptor`] | current / peak / total bytes and counts, counter scopes, a PyTorch-style report |
//! | [`LimitingResourceAdaptor`] | a hard cap on bytes in use |
//! | [`TrackingResourceAdaptor`] | every outstanding allocation (optionally with a backtrace), leak reports |
//! | [`LoggingResourceAdaptor`] | an RMM-format CSV event log, which [`replay()`] plays back |
//! | [`FailureCallbackResourceAdaptor`] | a callback on out-of-memory that decides retry or fail |
//! | [`HookedResourceAdaptor`] | CuPy-style memory [`hooks`] around any resource |
//!
//! Order matters the way it does in RMM: an adaptor sees what reaches it. A limit under
//! statistics makes the statistics count the refusals as out-of-memory; statistics under a
//! limit count only what the limit let through. A failure callback should sit above the
//! resource whose memory it can free (e.g. above the pool, so spilling frees pool blocks).
//!
//! Hot paths: no adaptor takes a global lock, allocates or emits a `tracing` event on a
//! successful allocation or deallocation. The logging adaptor appends a binary record to the
//! calling thread's buffer (a background thread writes RMM's CSV); the tracking adaptor does
//! one sharded map insert.

mod failure_callback;
mod hooked;
pub mod hooks;
mod limiting;
mod logging;
pub mod replay;
pub mod statistics;
mod tracking;

pub use failure_callback::{AllocationFailure, FailureAction, FailureCallbackResourceAdaptor};
pub use hooked::HookedResourceAdaptor;
pub use limiting::{LimitingResourceAdaptor, MemoryLimit};
pub use logging::{LOG_HEADER, LoggingResourceAdaptor, log_file_path, log_thread_id};
pub use replay::{
    EventLog, LogFile, ReplayOptions, ReplayOrder, ReplayReport, replay, replay_streamed,
};
pub use statistics::{Counter, MemoryReport, StatisticsResourceAdaptor};
pub use tracking::{AllocationRecord, LeakReport, TrackingResourceAdaptor};

use std::sync::Arc;

use crate::resource::{DeviceMemoryResource, PoolMemoryResource};

/// A resource an adaptor can wrap: any [`DeviceMemoryResource`], sized or `dyn`.
pub trait Upstream: DeviceMemoryResource {
    /// The resource as a trait object.
    fn as_dyn(&self) -> &dyn DeviceMemoryResource;
}

impl<T: DeviceMemoryResource> Upstream for T {
    fn as_dyn(&self) -> &dyn DeviceMemoryResource {
        self
    }
}

impl Upstream for dyn DeviceMemoryResource {
    fn as_dyn(&self) -> &dyn DeviceMemoryResource {
        self
    }
}

/// RMM's adaptor equality: the same object, or an adaptor of the same type over an equal
/// upstream.
pub(crate) fn same_adaptor<A: DeviceMemoryResource, U: Upstream + ?Sized>(
    this: &A,
    other: &dyn DeviceMemoryResource,
    upstream: impl Fn(&A) -> &Arc<U>,
) -> bool {
    std::ptr::addr_eq(this as *const A, other as *const dyn DeviceMemoryResource)
        || other
            .as_any()
            .downcast_ref::<A>()
            .is_some_and(|o| upstream(this).is_equal((**upstream(o)).as_dyn()))
}

/// The upstream of `resource` when it is one of this crate's adaptors or a pool; `None` for
/// resources that talk to the device (or have several upstreams, like binning).
pub fn upstream_of(resource: &dyn DeviceMemoryResource) -> Option<&dyn DeviceMemoryResource> {
    let any = resource.as_any();
    if let Some(r) = any.downcast_ref::<PoolMemoryResource>() {
        return Some(&**r.upstream());
    }
    if let Some(r) = any.downcast_ref::<StatisticsResourceAdaptor>() {
        return Some(&**r.upstream());
    }
    if let Some(r) = any.downcast_ref::<StatisticsResourceAdaptor<PoolMemoryResource>>() {
        return Some(&**r.upstream());
    }
    if let Some(r) = any.downcast_ref::<LimitingResourceAdaptor>() {
        return Some(&**r.upstream());
    }
    if let Some(r) = any.downcast_ref::<TrackingResourceAdaptor>() {
        return Some(&**r.upstream());
    }
    if let Some(r) = any.downcast_ref::<LoggingResourceAdaptor>() {
        return Some(&**r.upstream());
    }
    if let Some(r) = any.downcast_ref::<FailureCallbackResourceAdaptor>() {
        return Some(&**r.upstream());
    }
    if let Some(r) = any.downcast_ref::<HookedResourceAdaptor>() {
        return Some(&**r.upstream());
    }
    None
}

/// `resource` and its upstreams, top first, as far as [`upstream_of`] can see.
pub fn chain(resource: &dyn DeviceMemoryResource) -> Vec<&dyn DeviceMemoryResource> {
    let mut out = vec![resource];
    let mut cur = resource;
    // Bounded: a chain is a handful of adaptors; the bound guards against cycles.
    while out.len() < 64 {
        match upstream_of(cur) {
            Some(up) => {
                cur = up;
                out.push(cur);
            }
            None => break,
        }
    }
    out
}

/// The first resource of type `T` in `resource`'s chain (itself included).
pub fn find_in_chain<T: 'static>(resource: &dyn DeviceMemoryResource) -> Option<&T> {
    chain(resource)
        .into_iter()
        .find_map(|r| r.as_any().downcast_ref::<T>())
}

/// The chain's names, e.g. `StatisticsResourceAdaptor > PoolMemoryResource > CudaMemoryResource`.
pub fn chain_names(resource: &dyn DeviceMemoryResource) -> String {
    chain(resource)
        .iter()
        .map(|r| r.name())
        .collect::<Vec<_>>()
        .join(" > ")
}
