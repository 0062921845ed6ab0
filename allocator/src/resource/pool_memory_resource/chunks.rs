//! Where the pool's chunks come from and go back to: the upstream's allocations, or physical memory
//! mapped side by side through CUDA's virtual memory API (`vmm.rs`), chosen at build. Slow paths.

use std::sync::Arc;

use super::PoolMemoryResource;
use super::global::FreeSpace;
use super::vmm::AddressSpace;
use crate::adaptor::hooks;
use crate::backend::DevicePtr;
use crate::error::{Error, Result};
use crate::resource::{CudaMemoryResource, DeviceMemoryResource, SharedResource};
use crate::stream_view::StreamView;

/// Whether a pool maps its memory through CUDA's virtual memory API (`pool.vmm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VirtualMemory {
    /// Chunks are allocations of the upstream resource.
    Off,
    /// Chunks are mapped into one reserved address range per device; building fails where
    /// impossible (an upstream other than [`CudaMemoryResource`], or no virtual memory management).
    On,
    /// [`VirtualMemory::On`] where possible for a pool starting at most 2 GiB, else
    /// [`VirtualMemory::Off`]; [`PoolMemoryResource::chunk_source`] says which.
    #[default]
    Auto,
}

/// Where one pool's chunks come from.
pub(super) enum ChunkSource {
    /// The upstream resource's allocations.
    Upstream,
    /// Mapped into the device's reserved address range.
    Mapped(Arc<AddressSpace>),
    /// The upstream, as the device lacks virtual memory management the pool would have used.
    UpstreamNoVmm,
}

impl ChunkSource {
    /// The source `mode` asks for over `upstream`.
    pub(super) fn choose(mode: VirtualMemory, upstream: &SharedResource) -> Result<ChunkSource> {
        if mode == VirtualMemory::Off {
            return Ok(ChunkSource::Upstream);
        }
        let device = upstream.device();
        let supported = device.properties()?.supports_virtual_memory;
        let refused = |expected: String| Err(Error::invalid_argument("pool.vmm", "true", expected));
        match (over_plain_memory(upstream), supported, mode) {
            (true, true, _) => Ok(ChunkSource::Mapped(AddressSpace::of(device)?)),
            (true, false, VirtualMemory::Auto) => Ok(ChunkSource::UpstreamNoVmm),
            (false, _, VirtualMemory::Auto) => Ok(ChunkSource::Upstream),
            (false, _, _) => refused(format!(
                "a pool over CudaMemoryResource for virtual memory (this one is over {}); set \
                 pool.vmm = \"auto\" or false",
                upstream.name()
            )),
            (true, false, _) => refused(format!(
                "a device with virtual memory management ({device} reports none); set pool.vmm = \
                 \"auto\" or false"
            )),
        }
    }

    /// Whether memory over `upstream` can be mapped: plain device memory, VMM-capable device.
    pub(super) fn can_map(upstream: &SharedResource) -> Result<bool> {
        Ok(over_plain_memory(upstream) && upstream.device().properties()?.supports_virtual_memory)
    }

    /// The free space this source's chunks need.
    pub(super) fn free_space(&self) -> FreeSpace {
        let mut space = FreeSpace::default();
        space.merge_across_chunks = matches!(self, ChunkSource::Mapped(_));
        space
    }

    /// Whether chunks of `self` and `other` can move between their pools.
    pub(super) fn can_swap(
        &self,
        mine: &SharedResource,
        other: &ChunkSource,
        theirs: &SharedResource,
    ) -> bool {
        match (self, other) {
            (ChunkSource::Mapped(a), ChunkSource::Mapped(b)) => Arc::ptr_eq(a, b),
            (ChunkSource::Mapped(_), _) | (_, ChunkSource::Mapped(_)) => false,
            _ => mine.is_equal(&**theirs),
        }
    }
}

/// Whether `upstream` hands out plain device memory ([`CudaMemoryResource`]), which can be mapped.
fn over_plain_memory(upstream: &SharedResource) -> bool {
    upstream.as_any().is::<CudaMemoryResource>()
}

impl PoolMemoryResource {
    /// Where this pool's chunks come from: `"virtual memory"`, `"upstream"`, or
    /// `"upstream (no virtual memory on this device)"`.
    pub fn chunk_source(&self) -> &'static str {
        match &self.source {
            ChunkSource::Mapped(_) => "virtual memory",
            ChunkSource::Upstream => "upstream",
            ChunkSource::UpstreamNoVmm => "upstream (no virtual memory on this device)",
        }
    }

    /// Whether the pool maps its chunks through CUDA's virtual memory API.
    pub fn uses_virtual_memory(&self) -> bool {
        matches!(self.source, ChunkSource::Mapped(_))
    }

    /// Adds `size` bytes of new chunks to `g` (through the upstream hooks if `hooked`). Mapped
    /// chunks go at `at` if given (false, nothing taken, if it is not free), else where they fit.
    pub(super) fn add_memory(
        &self,
        g: &mut FreeSpace,
        size: u64,
        at: Option<u64>,
        stream: StreamView,
        hooked: bool,
    ) -> Result<bool> {
        let mut added = Vec::new();
        let mut take = || -> Result<DevicePtr> {
            match &self.source {
                ChunkSource::Mapped(space) => match space.map(size, self.chunk, at)? {
                    Some(chunks) => {
                        let start = chunks.first().map_or(0, |c| c.0);
                        added = chunks;
                        Ok(DevicePtr(start))
                    }
                    None => Ok(DevicePtr::NULL),
                },
                ChunkSource::Upstream | ChunkSource::UpstreamNoVmm => {
                    let p = self.upstream.allocate(size as usize, stream)?;
                    added = vec![(p.addr(), size)];
                    Ok(p)
                }
            }
        };
        if hooked {
            hooks::alloc_from_upstream(self.hook_source(), size as usize, stream, take)?;
        } else {
            take()?;
        }
        let placed = !added.is_empty();
        g.device_allocations += added.len() as u64;
        for (a, s) in added {
            g.add_chunk(a, s);
        }
        Ok(placed)
    }

    /// The size unit of mapped memory; `None` for the upstream's chunks (any size).
    pub(super) fn granularity(&self) -> Option<u64> {
        match &self.source {
            ChunkSource::Mapped(space) => Some(space.granularity),
            _ => None,
        }
    }

    /// `size` rounded up to the source's unit within `room` (rounded down); `None` if < `need`.
    pub(super) fn chunk_round(&self, size: u64, need: u64, room: u64) -> Option<u64> {
        let Some(g) = self.granularity() else {
            return (size >= need && size <= room).then_some(size);
        };
        let size = size.next_multiple_of(g).min(room / g * g);
        (size >= need && size > 0).then_some(size)
    }

    /// Returns `chunks` (out of `g`) to their source; returns their bytes. On failure the untried
    /// ones return to `g` (the failed one, maybe half gone, is dropped).
    pub(super) fn return_chunks(&self, g: &mut FreeSpace, chunks: &[(u64, u64)]) -> Result<u64> {
        let mut released = 0;
        for (i, &(addr, size)) in chunks.iter().enumerate() {
            if let Err(e) = self.return_chunk(addr, size) {
                for &(a, s) in &chunks[i + 1..] {
                    g.add_chunk(a, s);
                }
                return Err(e);
            }
            g.device_frees += 1;
            released += size;
        }
        Ok(released)
    }

    /// Gives one chunk, already out of the free space, back to where it came from.
    pub(super) fn return_chunk(&self, addr: u64, size: u64) -> Result<()> {
        match &self.source {
            ChunkSource::Mapped(space) => space.unmap(addr, size),
            _ => self
                .upstream
                .deallocate(DevicePtr(addr), size as usize, StreamView::DEFAULT),
        }
    }
}
