//! The [`PoolBuilder`]: takes the pool's initial memory from the upstream or a pool it replaces.

use std::sync::Arc;

use parking_lot::Mutex;

use super::chunks::{ChunkSource, VirtualMemory};
use super::footprint::{FootprintLimit, LIMITED_CHUNK};
use super::growth::DEFAULT_GROWTH;
use super::handover::LiveBlock;
use super::tlsf::GRANULE;
use super::{PoolMemoryResource, vmm};
use crate::device::Device;
use crate::error::{Error, Result, fmt_bytes};
use crate::resource::DeviceMemoryResource;
use crate::resource::SharedResource;
use crate::resource::stream_arenas::StreamArenas;

/// RMM's default initial pool size with `free` bytes free: half, rounded down to 256 bytes. Used by
/// the builder without a size and by rmm-config for `pool.initial_size = "auto"`.
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
    /// A builder over `upstream` with default settings ([`PoolMemoryResource::builder`]).
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

    /// Whether chunks are mapped side by side through CUDA's virtual memory API, so free space
    /// stays whole (default [`VirtualMemory::Auto`]); sizes are then granule multiples (2 MiB).
    pub fn virtual_memory(mut self, mode: VirtualMemory) -> Self {
        self.virtual_memory = mode;
        self
    }

    /// Bytes taken from the upstream at construction, rounded down to 256 (default: half the
    /// device's free memory, as RMM's Python `reinitialize`); 0 starts empty.
    pub fn initial_size(mut self, bytes: u64) -> Self {
        self.initial = Some(bytes);
        self
    }

    /// The most bytes the pool may hold, rounded down to 256 (default: the device's total memory).
    pub fn maximum_size(mut self, bytes: u64) -> Self {
        self.maximum = Some(bytes);
        self
    }

    /// The growth step (default [`DEFAULT_GROWTH`]): a pool grows by a request's need rounded up to
    /// this, never past the maximum; [`PoolBuilder::build`] refuses 0.
    pub fn growth(mut self, bytes: u64) -> Self {
        self.growth = bytes;
        self
    }

    /// Keeps the pool within `fraction` above its peak in use (default: no limit), never below the
    /// initial size, by giving free memory back before growing past `peak × (1 + fraction)`. Needs
    /// mapped memory ([`PoolBuilder::virtual_memory`]; `Auto` then chooses it); [`Self::build`]
    /// refuses other pools and negative or non-finite values.
    pub fn max_overhead(mut self, fraction: f64) -> Self {
        self.max_overhead = Some(fraction);
        self
    }

    /// Takes the initial memory from `donor`'s entirely free chunks where it can (a pool replacing
    /// another on the same device), if the upstreams can free each other's memory
    /// ([`DeviceMemoryResource::is_equal`]); the donor keeps working.
    pub fn adopt_from(mut self, donor: Arc<PoolMemoryResource>) -> Self {
        self.donor = Some(donor);
        self
    }

    /// With [`PoolBuilder::adopt_from`]: also takes over these live donor allocations, data in
    /// place, where their chunks hold nothing else live and fit ([`LiveBlock::movable`]).
    /// [`PoolMemoryResource::adopted_blocks`] lists those moved; never free them to the donor.
    pub fn adopt_live(mut self, blocks: Vec<LiveBlock>) -> Self {
        self.live = blocks;
        self
    }

    /// With [`PoolBuilder::adopt_from`]: until [`PoolMemoryResource::commit_adoption`], dropping
    /// the pool returns what it took over to the donor; allocate nothing from it before.
    pub fn adopt_provisionally(mut self) -> Self {
        self.provisional = true;
        self
    }

    /// [`PoolBuilder::virtual_memory`] with `Auto` decided for a pool of these sizes.
    fn mode(&self, initial: u64, maximum: u64) -> VirtualMemory {
        // A footprint limit gives memory back in chunks, which only mapped memory can.
        let limited = self.max_overhead.is_some();
        match self.virtual_memory {
            // Too small for whole granules, or a large start, which the upstream reserves lazily
            // where mapping costs per byte up front.
            VirtualMemory::Auto
                if !limited
                    && (maximum < vmm::AUTO_MINIMUM || initial > vmm::AUTO_MAXIMUM_INITIAL) =>
            {
                VirtualMemory::Off
            }
            mode => mode,
        }
    }

    /// Whether the built pool will map memory through CUDA's virtual memory API (a pool adopts
    /// another's free chunks only if both do the same).
    ///
    /// # Errors
    /// [`Error::Driver`] when the device cannot report its memory.
    pub fn maps_memory(&self) -> Result<bool> {
        let (_, maximum, initial) = self.sizes()?;
        let mode = self.mode(initial, maximum);
        Ok(mode != VirtualMemory::Off && ChunkSource::can_map(&self.upstream)?)
    }

    /// The device, and the maximum and initial sizes (defaults filled in) rounded down to 256.
    fn sizes(&self) -> Result<(Device, u64, u64)> {
        let device = self.upstream.device();
        let total = device.properties()?.total_memory as u64;
        let maximum = self.maximum.unwrap_or(total) / GRANULE * GRANULE;
        let initial = match self.initial {
            Some(bytes) => bytes / GRANULE * GRANULE,
            None => default_initial_size(device.mem_info()?.free as u64).min(maximum),
        };
        Ok((device, maximum, initial))
    }

    /// Takes the initial memory and builds the pool.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for inconsistent settings; [`Error::OutOfMemory`] if the upstream
    /// cannot provide the initial memory; [`Error::Driver`] if the device cannot report its memory.
    pub fn build(self) -> Result<PoolMemoryResource> {
        let (device, maximum, initial) = self.sizes()?;
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
        let (maximum, initial, chunk) = match &source {
            ChunkSource::Mapped(space) => {
                let g = space.granularity;
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
                // With a footprint limit, small chunks (see `footprint.rs`).
                let limited = self.max_overhead.map(|_| growth.min(LIMITED_CHUNK));
                let chunk = limited.map_or(growth, |c| c.next_multiple_of(g));
                (rounded, initial.next_multiple_of(g).min(rounded), chunk)
            }
            _ => (maximum, initial, growth),
        };
        let mut pool = PoolMemoryResource {
            upstream: self.upstream,
            device,
            maximum,
            growth,
            chunk,
            footprint: self.max_overhead.map(|f| FootprintLimit::new(f, initial)),
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
