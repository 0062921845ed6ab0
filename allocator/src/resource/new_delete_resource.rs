//! [`NewDeleteResource`]: system-allocator pageable host memory (RMM's `new_delete_resource`).

use crate::backend::host;
use crate::error::Result;

use super::{HostBlock, HostMemoryResource};

/// Pageable host memory from the global allocator (zeroed). Copies from it to the device
/// run at a fraction of pinned speed; use [`super::PinnedHostMemoryResource`] for staging.
#[derive(Debug, Clone, Copy, Default)]
pub struct NewDeleteResource;

impl HostMemoryResource for NewDeleteResource {
    fn allocate(&self, bytes: usize, alignment: usize) -> Result<HostBlock> {
        host::alloc_pageable(bytes, alignment)
    }

    fn deallocate(&self, block: HostBlock) -> Result<()> {
        host::free(block)
    }

    fn name(&self) -> &'static str {
        "NewDeleteResource"
    }
}
