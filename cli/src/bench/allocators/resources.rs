//! The resources the benchmark measures, and building the selected ones on a device.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use rmm::allocator::Device;
use rmm::allocator::resource::SharedResource;
use rmm::allocator::resource::{
    BinningMemoryResource, CudaAsyncMemoryResource, CudaMemoryResource, PoolMemoryResource,
};
use serde::{Deserialize, Serialize};

use super::{AllocatorBenchOptions, Failure};
use crate::bench::BenchError;

/// A resource the benchmark measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Resource {
    /// `CudaMemoryResource`: `cuMemAlloc` / `cuMemFree` for every request.
    #[serde(rename = "cuda")]
    Cuda,
    /// `CudaAsyncMemoryResource`: the driver's stream-ordered allocator (`cuMemAllocAsync`).
    #[serde(rename = "async")]
    Async,
    /// `PoolMemoryResource` over `cuda`, created with 3 × the cap.
    #[serde(rename = "pool")]
    Pool,
    /// `BinningMemoryResource` (bins 256 B – 128 KiB) in front of the pool.
    #[serde(rename = "binning(pool)")]
    Binning,
}

impl Resource {
    /// Every resource, in table order.
    pub const ALL: [Resource; 4] = [
        Resource::Cuda,
        Resource::Async,
        Resource::Pool,
        Resource::Binning,
    ];

    /// The name in tables, JSON and `RMM_BENCH_ONLY`: `cuda`, `async`, `pool`,
    /// `binning(pool)`.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Cuda => "cuda",
            Resource::Async => "async",
            Resource::Pool => "pool",
            Resource::Binning => "binning(pool)",
        }
    }

    /// Whether the resource runs every shape (`cuda` runs `churn` and `random` only).
    pub fn runs_every_shape(self) -> bool {
        self != Resource::Cuda
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Resource {
    type Err = BenchError;

    /// Parses a [`Resource::name`]; `binning` is accepted for `binning(pool)`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cuda" => Ok(Resource::Cuda),
            "async" => Ok(Resource::Async),
            "pool" => Ok(Resource::Pool),
            "binning" | "binning(pool)" => Ok(Resource::Binning),
            _ => Err(BenchError::invalid(
                "resource",
                format!("{s:?} is none of cuda, async, pool, binning"),
            )),
        }
    }
}

/// The selected resources in order, each `None` where it could not be created (the failure is
/// recorded). The pool is created when it or binning is selected.
pub(super) fn build_resources(
    device: Device,
    o: &AllocatorBenchOptions,
    failures: &mut Vec<Failure>,
) -> Vec<(Resource, Option<SharedResource>)> {
    let cuda: SharedResource = Arc::new(CudaMemoryResource::new(device));
    let mut record = |resource, e: &dyn fmt::Display| {
        failures.push(Failure {
            resource,
            shape: None,
            error: e.to_string(),
        })
    };
    let needs_pool = o
        .resources
        .iter()
        .any(|r| matches!(r, Resource::Pool | Resource::Binning));
    let pool: Option<Result<SharedResource, String>> = needs_pool.then(|| {
        PoolMemoryResource::builder(Arc::clone(&cuda))
            .initial_size((o.cap.saturating_mul(3)) as u64)
            .build()
            .map(|p| Arc::new(p) as SharedResource)
            .map_err(|e| e.to_string())
    });
    o.resources
        .iter()
        .map(|&r| {
            let mr = match r {
                Resource::Cuda => Ok(Arc::clone(&cuda)),
                Resource::Async => CudaAsyncMemoryResource::new(device)
                    .map(|a| Arc::new(a) as SharedResource)
                    .map_err(|e| e.to_string()),
                Resource::Pool => match &pool {
                    Some(p) => p.clone(),
                    None => Err("no pool".into()),
                },
                Resource::Binning => match &pool {
                    Some(Ok(p)) => BinningMemoryResource::with_bins(Arc::clone(p), 8, 17)
                        .map(|b| Arc::new(b) as SharedResource)
                        .map_err(|e| e.to_string()),
                    Some(Err(e)) => Err(format!("its pool could not be created: {e}")),
                    None => Err("no pool".into()),
                },
            };
            match mr {
                Ok(mr) => (r, Some(mr)),
                Err(e) => {
                    record(r, &e);
                    (r, None)
                }
            }
        })
        .collect()
}
