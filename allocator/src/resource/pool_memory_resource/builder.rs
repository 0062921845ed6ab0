//! Building a pool: the builder ([`PoolBuilder`]) that takes its initial memory, from the
//! upstream or from a pool it replaces.

use std::sync::Arc;

use parking_lot::Mutex;

use super::chunks::{ChunkSource, VirtualMemory};
use super::growth::DEFAULT_GROWTH;
use super::handover::LiveBlock;
use super::tlsf::GRANULE;
use super::{PoolMemoryResource, footprint, vmm};
use crate::error::{Error, Result, fmt_bytes};
use crate::resource::DeviceMemoryResource;
use crate::resource::SharedResource;
use crate::resource::stream_arenas::StreamArenas;

/// RAPIDS RMM's default initial pool size on a device with `free` bytes free: half of them,
/// rounded down to 256 bytes. The one place this rule lives: the builder applies it when no
/// size is given, and rmm-config when `pool.initial_size = "auto"`.
pub fn default_initial_size(free: u64) -> u64 {
    free / 2 / GRANULE * GRANULE
}

/// Builds a [`PoolMemoryResource`].
#[derive(Debug, Clone)]
pub struct PoolBuilder {
    upstream: SharedResource,
    initial: Option<u64>,
    maximum: Option<u64>,
    growth: u64,
    donor: Option<Arc<PoolMemoryResource>>,
    live: Vec<LiveBlock>,
    provisional: bool,
    virtual_memory: VirtualMemory,
    max_overhead: Option<f64>,
}

impl PoolBuilder {
    /// A builder over `upstream` with every setting at its default
    /// ([`PoolMemoryResource::builder`]).
    pub(super) fn over(upstream: SharedResource) -> PoolBuilder {
        PoolBuilder {
            upstream,
            initial: None,
            maximum: None,
            growth: DEFAULT_GROWTH,
            donor: None,
            live: Vec::new(),
            provisional: false,
            virtual_memory: VirtualMemory::default(),
            max_overhead: None,
        }
    }

    /// Whether chunks are mapped through CUDA's virtual memory API (default
    /// [`VirtualMemory::Auto`]: over a [`CudaMemoryResource`](crate::resource::CudaMemoryResource)
    /// on a device that supports it, with a maximum size of at least 64 granules). Mapped
    /// chunks lie side by side in one address range per device, so free space stays in one
    /// piece across growth and entirely free chunks go back to the device one by one; sizes
    /// are then multiples of the device's granularity (2 MiB on current GPUs).
    pub fn virtual_memory(mut self, mode: VirtualMemory) -> Self {
        self.virtual_memory = mode;
        self
    }

    /// Bytes taken from the upstream at construction, rounded down to 256 (default: half of
    /// the device's free memory, as RMM's Python `reinitialize` does); 0 starts empty.
    /// (Fractions of the device are the configuration's to resolve: `rmm_config::Size`.)
    pub fn initial_size(mut self, bytes: u64) -> Self {
        self.initial = Some(bytes);
        self
    }

    /// The most bytes the pool may hold, rounded down to 256 (default: the device's total
    /// memory).
    pub fn maximum_size(mut self, bytes: u64) -> Self {
        self.maximum = Some(bytes);
        self
    }

    /// The growth step (default [`DEFAULT_GROWTH`], 1 GiB): when nothing the pool holds can
    /// serve a request, it grows by what the request needs rounded up to a multiple of this,
    /// never past the maximum size. Smaller steps keep the pool closer to what is in use at
    /// the price of more upstream allocations; 0 is refused by [`PoolBuilder::build`].
    pub fn growth(mut self, bytes: u64) -> Self {
        self.growth = bytes;
        self
    }

    /// Keeps the pool within `fraction` above the peak of its bytes in use (default: no
    /// limit). Before the pool grows past `peak × (1 + fraction)`, it gathers every arena's
    /// free blocks (the request may fit among them, merged) and gives entirely free chunks
    /// back to the device, so that new memory replaces free memory instead of adding to it:
    /// what a training loop whose tensor sizes change every step needs to hold no more than
    /// its live peak. Never below the initial size. Needs mapped memory
    /// ([`PoolBuilder::virtual_memory`], which `Auto` then chooses whatever the sizes): the
    /// pool maps chunks of the device's granularity (2 MiB) and gives free memory back in
    /// those pieces; [`PoolBuilder::build`] refuses a pool over the upstream's allocations,
    /// whose free pieces never merge. Costs a wait for the streams that freed the memory when
    /// the limit is reached, and mapping again what was given back. `0.05` is PyTorch's
    /// expandable segments' footprint or better; negative or non-finite values are refused.
    pub fn max_overhead(mut self, fraction: f64) -> Self {
        self.max_overhead = Some(fraction);
        self
    }

    /// Takes the initial memory from `donor`'s entirely free upstream chunks where it can,
    /// instead of from the upstream: a pool replacing another one of the same device (a
    /// `reinitialize` from pool to pool) then makes no driver call for the memory both want.
    /// Chunks move only when `donor`'s upstream and this one can free each other's memory
    /// ([`DeviceMemoryResource::is_equal`]), and only as many as fit in the initial size;
    /// the donor keeps working and grows again on demand.
    pub fn adopt_from(mut self, donor: Arc<PoolMemoryResource>) -> Self {
        self.donor = Some(donor);
        self
    }

    /// With [`PoolBuilder::adopt_from`]: also takes over these live allocations of the donor
    /// with the chunks that hold them, data in place, as allocations of the new pool (freed
    /// to it, on their stream). A block moves only when every chunk it lies in holds nothing
    /// else live and fits in the initial size (chunks holding blocks go first); blocks of 64
    /// KiB or less never move (they share slabs). [`PoolMemoryResource::adopted_blocks`]
    /// lists those that moved; the others stay the donor's. The caller must not free a moved
    /// block to the donor.
    pub fn adopt_live(mut self, blocks: Vec<LiveBlock>) -> Self {
        self.live = blocks;
        self
    }

    /// With [`PoolBuilder::adopt_from`]: what the pool takes over stays the donor's to take
    /// back until [`PoolMemoryResource::commit_adoption`]; dropping the pool before that gives
    /// the chunks and live blocks back to the donor, data in place, instead of to the
    /// upstream. Commit once the pool is in service; until then, allocate nothing from it.
    pub fn adopt_provisionally(mut self) -> Self {
        self.provisional = true;
        self
    }

    /// [`PoolBuilder::virtual_memory`] as it applies to a pool of these sizes: `Auto`
    /// decided.
    fn mode(&self, initial: u64, maximum: u64) -> VirtualMemory {
        // A footprint limit gives memory back in chunks, which only mapped memory can.
        let limited = self.max_overhead.is_some();
        match self.virtual_memory {
            // A pool too small for whole granules is better served by the upstream. A pool
            // that takes a large initial size at once (RMM's `initial_pool_size` use) is
            // built faster from the upstream: mapping physical memory is paid for up front,
            // per byte, where one `cuMemAlloc` reserves lazily. Virtual memory serves the
            // pools that start small and grow on demand (and give memory back in pieces).
            VirtualMemory::Auto
                if !limited
                    && (maximum < vmm::AUTO_MINIMUM || initial > vmm::AUTO_MAXIMUM_INITIAL) =>
            {
                VirtualMemory::Off
            }
            mode => mode,
        }
    }

    /// Whether the pool this builder builds maps its memory through CUDA's virtual memory API
    /// (else it takes the upstream's allocations), as [`PoolBuilder::build`] decides: a pool
    /// adopts another's free chunks only where both do the same.
    ///
    /// # Errors
    /// [`Error::Driver`](crate::Error::Driver) when the device cannot report its memory.
    pub fn maps_memory(&self) -> Result<bool> {
        let device = self.upstream.device();
        let total = device.properties()?.total_memory as u64;
        let maximum = self.maximum.unwrap_or(total);
        let initial = match self.initial {
            Some(bytes) => bytes,
            None => default_initial_size(device.mem_info()?.free as u64).min(maximum),
        };
        let mode = self.mode(initial, maximum);
        Ok(mode != VirtualMemory::Off && ChunkSource::can_map(&self.upstream)?)
    }

    /// Takes the initial memory and builds the pool.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when the initial size exceeds
    /// the maximum, the growth is zero, or a footprint limit is asked of a pool that cannot
    /// map its memory;
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when the upstream cannot provide the
    /// initial memory; [`Error::Driver`](crate::Error::Driver) when the device cannot report its
    /// memory.
    pub fn build(self) -> Result<PoolMemoryResource> {
        let device = self.upstream.device();
        // The device's size is known; free memory is asked of the driver only when needed.
        let total = device.properties()?.total_memory;
        let maximum = self.maximum.unwrap_or(total as u64) / GRANULE * GRANULE;
        let initial = match self.initial {
            Some(bytes) => bytes / GRANULE * GRANULE,
            None => default_initial_size(device.mem_info()?.free as u64).min(maximum),
        };
        if initial > maximum {
            return Err(Error::invalid_argument(
                "initial_size",
                fmt_bytes(initial as usize),
                format!("at most the maximum size {}", fmt_bytes(maximum as usize)),
            ));
        }
        if self.growth == 0 {
            return Err(Error::invalid_argument(
                "pool growth",
                "0 B",
                "a growth step of at least 256 bytes, e.g. 1 GiB (pool.growth)",
            ));
        }
        if let Some(f) = self.max_overhead.filter(|f| !(f.is_finite() && *f >= 0.0)) {
            return Err(Error::invalid_argument(
                "pool max_overhead",
                f,
                "a fraction of the peak in use of at least 0, e.g. 0.05 (pool.max_overhead = \"5%\")",
            ));
        }
        let growth = self.growth.next_multiple_of(GRANULE);
        let mode = self.mode(initial, maximum);
        let source = ChunkSource::choose(mode, &self.upstream)?;
        if let Some(f) = self.max_overhead
            && !matches!(source, ChunkSource::Mapped(_))
        {
            return Err(Error::invalid_argument(
                "pool max_overhead",
                f,
                format!(
                    "a pool that maps its memory through CUDA's virtual memory API (pool.vmm = \
                     true or \"auto\", over plain device memory on a device that supports it); \
                     this one takes its chunks from {} ({}), whose free pieces never merge, so \
                     it cannot keep to a footprint: set pool.max_overhead = \"none\"",
                    self.upstream.name(),
                    source_name(&source)
                ),
            ));
        }
        let (maximum, initial) = match &source {
            ChunkSource::Mapped(space) => {
                let g = space.granularity();
                let rounded = maximum / g * g;
                if rounded == 0 {
                    return Err(Error::invalid_argument(
                        "maximum_size",
                        fmt_bytes(maximum as usize),
                        format!(
                            "at least the device's allocation granularity ({}) with virtual memory",
                            fmt_bytes(g as usize)
                        ),
                    ));
                }
                (rounded, initial.next_multiple_of(g).min(rounded))
            }
            _ => (maximum, initial),
        };
        let chunk = match (&source, self.max_overhead) {
            (ChunkSource::Mapped(space), Some(_)) => growth
                .min(footprint::LIMITED_CHUNK)
                .next_multiple_of(space.granularity()),
            _ => growth,
        };
        let mut pool = PoolMemoryResource {
            upstream: self.upstream,
            device,
            maximum,
            growth,
            chunk,
            footprint: self
                .max_overhead
                .map(|f| footprint::FootprintLimit::new(f, initial)),
            arenas: StreamArenas::new(),
            global: Mutex::new(source.free_space()),
            source,
            adopted: Vec::new(),
            pending: Mutex::new(None),
        };
        let donor = self.donor.filter(|d| {
            d.device == device
                && d.source.can_swap(&d.upstream, &pool.source, &pool.upstream)
                && initial > 0
        });
        let adopted = pool.take_over(donor, &self.live, initial, self.provisional)?;
        tracing::debug!(
            device = device.ordinal(),
            initial,
            adopted,
            adopted_blocks = pool.adopted.len(),
            maximum,
            growth,
            upstream = pool.upstream.name(),
            chunks = pool.chunk_source(),
            "pool created"
        );
        Ok(pool)
    }
}

/// How a pool that does not map its memory came to take the upstream's chunks, for errors.
fn source_name(source: &ChunkSource) -> &'static str {
    match source {
        ChunkSource::UpstreamNoVmm => "the device has no virtual memory management",
        _ => "pool.vmm is false, or the memory is not plain device memory",
    }
}
