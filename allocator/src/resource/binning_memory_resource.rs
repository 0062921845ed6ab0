//! [`BinningMemoryResource`]: size-class bins before an upstream (RMM's `binning_memory_resource`).

use std::any::Any;
use std::sync::Arc;

use super::{DeviceMemoryResource, FixedSizeMemoryResource};
use crate::backend::DevicePtr;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::resource::SharedResource;
use crate::stream_view::StreamView;

/// Routes each request to the smallest bin holding it, larger ones to the upstream (bins from
/// [`BinningMemoryResource::add_bin`]). Deallocate with the allocated size: it routes by size.
#[derive(Debug)]
pub struct BinningMemoryResource {
    upstream: SharedResource,
    /// (largest size served, resource), sorted by size.
    bins: Vec<(usize, SharedResource)>,
}

impl BinningMemoryResource {
    /// No bins yet: everything goes to `upstream` until bins are added.
    pub fn new(upstream: SharedResource) -> Self {
        BinningMemoryResource {
            upstream,
            bins: Vec::new(),
        }
    }

    /// [`FixedSizeMemoryResource`] bins over `upstream` of `2^min_exp` to `2^max_exp` bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `min_exp > max_exp` or `max_exp > 40`; [`Error::OutOfMemory`]
    /// if a bin's first chunk fails.
    pub fn with_bins(upstream: SharedResource, min_exp: u32, max_exp: u32) -> Result<Self> {
        if min_exp > max_exp || max_exp > 40 {
            return Err(Error::invalid_argument(
                "bin exponents",
                format!("{min_exp}..={max_exp}"),
                "min_exp <= max_exp <= 40",
            ));
        }
        let mut r = Self::new(upstream);
        for exp in min_exp..=max_exp {
            r.add_bin(1usize << exp, None)?;
        }
        Ok(r)
    }

    /// Adds a bin for sizes up to `size` (above the next smaller bin): `resource`, or a
    /// [`FixedSizeMemoryResource`] of `size` blocks over the upstream.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `resource` is on another device; [`Error::OutOfMemory`] if a
    /// new bin's first chunk fails.
    pub fn add_bin(&mut self, size: usize, resource: Option<SharedResource>) -> Result<()> {
        let resource = match resource {
            Some(r) => r,
            None => {
                let blocks = ((2usize << 20) / size.max(1)).clamp(1, 128);
                Arc::new(FixedSizeMemoryResource::new(
                    Arc::clone(&self.upstream),
                    size,
                    blocks,
                )?)
            }
        };
        if resource.device() != self.upstream.device() {
            return Err(Error::invalid_argument(
                "bin resource",
                resource.name(),
                format!("a resource of {}", self.upstream.device()),
            ));
        }
        match self.bins.binary_search_by_key(&size, |(s, _)| *s) {
            Ok(i) => self.bins[i].1 = resource,
            Err(i) => self.bins.insert(i, (size, resource)),
        }
        Ok(())
    }

    /// The bin sizes.
    pub fn bin_sizes(&self) -> Vec<usize> {
        self.bins.iter().map(|(s, _)| *s).collect()
    }

    #[inline]
    fn route(&self, bytes: usize) -> &SharedResource {
        let i = self.bins.partition_point(|(s, _)| *s < bytes);
        self.bins.get(i).map_or(&self.upstream, |(_, r)| r)
    }
}

impl DeviceMemoryResource for BinningMemoryResource {
    #[inline]
    fn allocate(&self, bytes: usize, stream: StreamView) -> Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        self.route(bytes).allocate(bytes, stream)
    }

    #[inline]
    fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: StreamView) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        self.route(bytes).deallocate(ptr, bytes, stream)
    }

    fn device(&self) -> Device {
        self.upstream.device()
    }

    fn name(&self) -> &'static str {
        "BinningMemoryResource"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
