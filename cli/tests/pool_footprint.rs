//! The pool's footprint on the multi-stream workload of the footprint benchmark
//! (`rmm_cli::bench::footprint`), on a simulated H200 in unbacked mode: a pool that starts empty
//! reserves at most 1.5 × the peak live bytes (8 GiB live → at most 12 GiB) after every phase
//! of three rounds, because memory idle on earlier streams serves the later ones before the
//! pool grows.

use std::sync::Arc;

use rmm::allocator::Device;
use rmm::allocator::backend::{SimBackend, SimConfig, SimMemoryMode};
use rmm::allocator::resource::DeviceMemoryResource;
use rmm::allocator::resource::SharedResource;
use rmm::allocator::resource::{CudaMemoryResource, PoolMemoryResource};
use rmm_cli::bench::GIB;
use rmm_cli::bench::footprint::{FootprintOptions, run};

/// An H200's memory (141 GB ≈ 140 GiB), unbacked: addresses only, nothing touched.
fn simulated_h200() -> Device {
    let b = SimBackend::leak(SimConfig {
        devices: 1,
        capacity: 140 * GIB,
        mode: SimMemoryMode::Unbacked,
    })
    .unwrap();
    Device::on(b, 0).unwrap()
}

#[test]
fn an_empty_pool_reserves_at_most_one_and_a_half_times_the_peak_on_every_phase() {
    let d = simulated_h200();
    let pool = Arc::new(
        PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
            .initial_size(0)
            .build()
            .unwrap(),
    );
    let mr: SharedResource = pool.clone();
    let report = run(
        &mr,
        d,
        &FootprintOptions::default(),
        || Ok(pool.pool_size()),
        "pool",
    )
    .unwrap();
    println!("{report}");
    assert_eq!(report.phases.len(), 12, "three rounds of four phases");
    for p in &report.phases {
        assert!(
            p.peak > 6 * GIB as u64,
            "round {} {}: the workload should live near its 8 GiB cap, peak {}",
            p.round,
            p.phase,
            p.peak
        );
        assert!(
            p.reserved as f64 <= 1.5 * p.peak as f64 && p.reserved <= 12 * GIB as u64,
            "round {} {}: the pool reserves {} B for a peak of {} B live\n{report}",
            p.round,
            p.phase,
            p.reserved,
            p.peak
        );
    }
    let s = pool.validate().unwrap();
    assert_eq!(s.in_use, 0, "everything was freed");
    assert_eq!(pool.memory_info().unwrap().total, 140 * GIB);
}
