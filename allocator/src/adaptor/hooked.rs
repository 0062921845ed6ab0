//! [`HookedResourceAdaptor`]: fires the memory [`hooks`](super::hooks)' `malloc_*` and
//! `free_*` events around any upstream (a pool fires its own).

use super::hooks::{Source, active, dispatch_free, dispatch_malloc};

use crate::backend::DevicePtr;
use crate::error::Result;
use crate::resource::{DeviceMemoryResource, SharedResource};
use crate::stream_view::StreamView;

/// Fires `malloc_*` and `free_*` around resources without built-in hooks (all but
/// [`crate::resource::PoolMemoryResource`]: wrapping a pool fires each event twice). Sizes are
/// reported rounded to 256 bytes.
#[derive(Debug)]
pub struct HookedResourceAdaptor {
    upstream: SharedResource,
}

impl HookedResourceAdaptor {
    /// Wraps `upstream`.
    pub fn new(upstream: SharedResource) -> Self {
        HookedResourceAdaptor { upstream }
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &SharedResource {
        &self.upstream
    }

    fn source(&self) -> Source {
        Source::of(
            self,
            self.upstream.device().ordinal(),
            "HookedResourceAdaptor",
        )
    }
}

impl DeviceMemoryResource for HookedResourceAdaptor {
    #[inline]
    fn allocate(&self, bytes: usize, stream: StreamView) -> Result<DevicePtr> {
        if active()
            && let Some(r) = dispatch_malloc(
                self.source(),
                bytes,
                crate::ALLOCATION_ALIGNMENT,
                stream,
                || self.upstream.allocate(bytes, stream),
            )
        {
            return r;
        }
        self.upstream.allocate(bytes, stream)
    }

    #[inline]
    fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: StreamView) -> Result<()> {
        if active()
            && let Some(r) = dispatch_free(
                self.source(),
                ptr,
                bytes,
                crate::ALLOCATION_ALIGNMENT,
                stream,
                || self.upstream.deallocate(ptr, bytes, stream),
            )
        {
            return r;
        }
        self.upstream.deallocate(ptr, bytes, stream)
    }

    crate::adaptor::upstream_tail!("HookedResourceAdaptor");
}
