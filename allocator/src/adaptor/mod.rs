//! Resource adaptors: each wraps an upstream [`SharedResource`](crate::resource::SharedResource)
//! and is a [`DeviceMemoryResource`], so they stack in any order (RMM's `*_resource_adaptor`s).
//!
//! | adaptor | what it adds |
//! |---|---|
//! | [`StatisticsResourceAdaptor`] | current / peak / total bytes and counts, counter scopes, a PyTorch-style report |
//! | [`LimitingResourceAdaptor`] | a hard cap on bytes in use |
//! | [`TrackingResourceAdaptor`] | every outstanding allocation (optionally with a backtrace), leak reports |
//! | [`LoggingResourceAdaptor`] | an RMM-format CSV event log, which `rmm_allocator::event_log` reads and `rmm replay` plays back |
//! | [`FailureCallbackResourceAdaptor`] | a callback on out-of-memory that decides retry or fail |
//! | [`HookedResourceAdaptor`] | CuPy-style memory [`hooks`] around any resource |
//!
//! Order matters as in RMM: an adaptor sees what reaches it (statistics above a limit count its
//! refusals). A failure callback belongs above the resource whose memory it can free (the pool).
//! No adaptor takes a global lock, allocates or traces on a successful allocation or free.

mod failure_callback;
mod hooked;
pub mod hooks;
mod limiting;
mod logging;
mod statistics;
mod tracking;

pub use failure_callback::{AllocationFailure, FailureAction, FailureCallbackResourceAdaptor};
pub use hooked::HookedResourceAdaptor;
pub use limiting::{LimitingResourceAdaptor, MemoryLimit};
pub use logging::{LOG_HEADER, LogAction, LoggingResourceAdaptor, log_file_path, log_thread_id};
pub use statistics::{
    Counter, DEFAULT_PEAK_TOLERANCE, MAX_SHARDS, MemoryReport, StatisticsResourceAdaptor,
};
pub use tracking::{AllocationRecord, LeakReport, TrackingResourceAdaptor};

use std::sync::Arc;

use crate::resource::DeviceMemoryResource;

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

/// The [`DeviceMemoryResource`] methods every adaptor shares, forwarded to its `upstream` field
/// (`memory_info` too unless `own memory_info`); `name` is the given name.
macro_rules! upstream_tail {
    ($name:literal) => {
        fn memory_info(&self) -> $crate::error::Result<$crate::backend::MemInfo> {
            self.upstream.memory_info()
        }

        $crate::adaptor::upstream_tail!($name, own memory_info);
    };
    ($name:literal, own memory_info) => {
        fn device(&self) -> $crate::device::Device {
            self.upstream.device()
        }

        fn name(&self) -> &'static str {
            $name
        }

        fn is_equal(&self, other: &dyn $crate::resource::DeviceMemoryResource) -> bool {
            $crate::adaptor::same_adaptor(self, other, |a: &Self| &a.upstream)
        }

        fn as_any(&self) -> &dyn ::std::any::Any {
            self
        }

        fn upstream(&self) -> Option<&dyn $crate::resource::DeviceMemoryResource> {
            Some($crate::adaptor::Upstream::as_dyn(&*self.upstream))
        }
    };
}
pub(crate) use upstream_tail;

/// RMM's adaptor equality: the same object, or the same adaptor type over an equal upstream.
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

/// `resource` and its upstreams, top first, following [`DeviceMemoryResource::upstream`].
pub fn chain(resource: &dyn DeviceMemoryResource) -> Vec<&dyn DeviceMemoryResource> {
    // The bound guards against cycles.
    std::iter::successors(Some(resource), |r| r.upstream())
        .take(64)
        .collect()
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
