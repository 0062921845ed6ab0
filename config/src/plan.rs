//! The memory resource resolution gives one device, in bytes: its upstream ([`UpstreamPlan`])
//! and pool ([`PoolPlan`]), built as they are (`rmm_runtime::StackPlan`) and shown by `rmm info`.

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
    /// Bytes taken at construction (`pool.initial_size`).
    pub initial_size: u64,
    /// The most the pool may hold (`None`: the device's total memory).
    pub maximum_size: Option<u64>,
    /// The growth step (`pool.growth`): requests are rounded up to a multiple of it to grow.
    pub growth: u64,
    /// Whether the pool maps its chunks through CUDA's virtual memory API (`pool.vmm`).
    pub vmm: Switch,
    /// The most the pool holds above the peak of its bytes in use (`pool.max_overhead`).
    pub max_overhead: Overhead,
}
