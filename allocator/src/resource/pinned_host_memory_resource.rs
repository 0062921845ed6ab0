//! [`PinnedHostMemoryResource`]: page-locked host memory, RMM's `pinned_memory_resource`.

use crate::backend::{Backend, host};
use crate::error::{Error, Result};

use super::{HostBlock, HostMemoryResource};

/// `cuMemHostAlloc(CU_MEMHOSTALLOC_PORTABLE)` memory: fast async copies on any device, not
/// write-combined (fast host reads). Slow to allocate (pins page by page): reuse blocks.
#[derive(Debug, Clone, Copy)]
pub struct PinnedHostMemoryResource {
    backend: &'static dyn Backend,
}

impl PinnedHostMemoryResource {
    /// A resource on the process-wide backend.
    ///
    /// # Errors
    /// The process-wide backend's error (e.g. [`Error::NoDriver`]) when it cannot be opened.
    pub fn new() -> Result<Self> {
        Ok(Self::on(crate::backend::global()?))
    }

    /// A resource on `backend`.
    pub fn on(backend: &'static dyn Backend) -> Self {
        PinnedHostMemoryResource { backend }
    }
}

impl HostMemoryResource for PinnedHostMemoryResource {
    fn allocate(&self, bytes: usize, alignment: usize) -> Result<HostBlock> {
        if !alignment.is_power_of_two() || alignment > 4096 {
            return Err(Error::invalid_argument(
                "alignment",
                alignment,
                "a power of two up to 4096 (pinned blocks are page-aligned)",
            ));
        }
        host::alloc_pinned(self.backend, bytes)
    }

    fn deallocate(&self, block: HostBlock) -> Result<()> {
        host::free(block)
    }

    fn name(&self) -> &'static str {
        "PinnedHostMemoryResource"
    }
}
