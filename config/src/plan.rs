//! The memory resource one device gets, as resolution decides it: where its memory comes from
//! ([`UpstreamPlan`]) and the pool over it ([`PoolPlan`]), in bytes. The runtime builds the
//! stack from these as they are (`rmm_runtime::StackPlan`), and `rmm info` describes them.

use serde::Serialize;

use crate::overhead::Overhead;
use crate::types::Switch;

/// Where a device's memory comes from: `pool.managed`, `pool.async`, else plain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum UpstreamPlan {
    /// `cuMemAlloc` (`CudaMemoryResource`).
    Cuda,
    /// `cuMemAllocManaged` (`ManagedMemoryResource`).
    Managed,
    /// `cuMemAllocAsync` on a pool of its own (`CudaAsyncMemoryResource`).
    Async {
        /// Bytes the driver pool keeps at synchronization (`None`: everything).
        release_threshold: Option<u64>,
        /// Bytes reserved at construction (only when no `PoolMemoryResource` sits above).
        initial_size: Option<u64>,
    },
}

/// The `PoolMemoryResource` over the upstream (`pool.enabled`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PoolPlan {
    /// Bytes taken at construction (`pool.initial_size`; by default half the free memory,
    /// within the maximum and the hard limit).
    pub initial_size: u64,
    /// The most the pool may hold (`None`: the device's total memory).
    pub maximum_size: Option<u64>,
    /// The growth step (`pool.growth`): the pool grows by what a request needs rounded up
    /// to a multiple of this.
    pub growth: u64,
    /// Whether the pool maps its chunks through CUDA's virtual memory API (`pool.vmm`).
    pub vmm: Switch,
    /// The most the pool holds above the peak of its bytes in use (`pool.max_overhead`).
    pub max_overhead: Overhead,
}
