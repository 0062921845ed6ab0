//! Shared by the CLI crate's benchmarks: the workload traces (from `rmm_cli::bench`)
//! and the choice of backend (the library's `benches/common/backend.rs`).
#![allow(dead_code)]

// The same backend choice as the library's benchmarks: one file, included by both.
#[path = "../../../benches/common/backend.rs"]
mod backend;

#[allow(unused_imports)] // each bench uses one or the other
pub use backend::{backend_for_bench, backend_for_bench_with};
use rmm::allocator::StreamView;
use rmm::allocator::resource::DeviceMemoryResource;

// The traces live in the library (`rmm_cli::bench`), shared with `rmm bench`; each bench uses
// some of them.
#[allow(unused_imports)]
pub use rmm_cli::bench::{GIB, MIB, Op, Rng, churn_trace, random_trace};

/// Replays `ops`; returns ns per operation ([`rmm_cli::bench::replay`] with the error as text).
pub fn replay(
    mr: &dyn DeviceMemoryResource,
    ops: &[Op],
    stream: StreamView,
) -> Result<f64, String> {
    rmm_cli::bench::replay(mr, ops, stream).map_err(|e| e.to_string())
}
