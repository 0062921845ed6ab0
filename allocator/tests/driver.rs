//! Loading the CUDA driver: a clear error where there is none, the devices where there is.

use rmm_allocator::Error;
use rmm_allocator::backend::{self, Backend, BackendChoice, CudaBackend};

#[test]
fn the_driver_loads_or_says_clearly_why_not() {
    match CudaBackend::load() {
        Ok(cuda) => {
            assert!(
                cuda.device_count() >= 1,
                "a driver without devices on a GPU machine"
            );
            let p = cuda.properties(0).unwrap();
            assert!(p.uuid.starts_with("GPU-"), "{}", p.uuid);
            assert!(p.total_memory > 0);
            assert!(cuda.describe().starts_with("cuda"));
            eprintln!(
                "driver present: {} ({}, {} bytes)",
                cuda.describe(),
                p.name,
                p.total_memory
            );
        }
        Err(e) => {
            assert!(matches!(e, Error::NoDriver { .. }), "{e:?}");
            let msg = e.to_string();
            assert!(msg.starts_with("no CUDA driver found: "), "{msg}");
            assert!(
                msg.contains("RMM_BACKEND=sim"),
                "the message says what to do: {msg}"
            );
            // Asking for CUDA explicitly gives the same error, not a panic.
            let e = backend::open(BackendChoice::Cuda).unwrap_err();
            assert!(e.to_string().starts_with("no CUDA driver found: "), "{e}");
            // Asking for nothing gives the same error: the simulated device is never chosen
            // without being asked for.
            let e = backend::open(BackendChoice::Auto).unwrap_err();
            assert!(matches!(e, Error::NoDriver { .. }), "{e:?}");
            assert!(e.to_string().contains("RMM_BACKEND=sim"), "{e}");
        }
    }
}

#[test]
fn backend_names_parse_and_bad_ones_are_explained() {
    assert_eq!(
        BackendChoice::parse("CUDA", "test").unwrap(),
        BackendChoice::Cuda
    );
    assert_eq!(
        BackendChoice::parse(" sim ", "test").unwrap(),
        BackendChoice::Sim
    );
    assert_eq!(
        BackendChoice::parse("auto", "test").unwrap(),
        BackendChoice::Auto
    );
    let e = BackendChoice::parse("gpux", "RMM_BACKEND").unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown backend \"gpux\" (from RMM_BACKEND): expected \"cuda\", \"sim\" or \"auto\""
    );
}
