//! Loading the CUDA driver: a clear error where there is none, the devices where there is.

mod common;

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
fn a_device_gets_a_context_only_once_it_is_used() {
    let Ok(cuda) = CudaBackend::load() else {
        common::skip(
            "a_device_gets_a_context_only_once_it_is_used",
            "no CUDA driver here: contexts are the GPU's",
        );
        return;
    };
    // Loading reads every device's properties without making a context on any (a Dask
    // worker sees every GPU of the machine and uses one; a context holds device memory).
    for d in 0..cuda.device_count() {
        assert!(
            !cuda.uses_device(d),
            "device {d} has a context after loading"
        );
        cuda.properties(d).unwrap();
        assert!(
            !cuda.uses_device(d),
            "reading device {d}'s properties made a context"
        );
    }
    cuda.mem_info(0).unwrap();
    assert!(cuda.uses_device(0), "device 0 was used and has no context");
    for d in 1..cuda.device_count() {
        assert!(
            !cuda.uses_device(d),
            "using device 0 made a context on device {d}"
        );
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

#[test]
fn working_on_a_device_leaves_the_callers_current_context_as_it_was() {
    let Ok(cuda) = CudaBackend::load() else {
        common::skip(
            "working_on_a_device_leaves_the_callers_current_context_as_it_was",
            "no CUDA driver here: contexts are the GPU's",
        );
        return;
    };
    let last = cuda.device_count() - 1;
    std::thread::spawn(move || {
        // A thread without a context keeps none.
        assert_eq!(cuda.context_device().unwrap(), None);
        let ptr = cuda.malloc(last, 1 << 20).unwrap();
        assert_eq!(cuda.context_device().unwrap(), None);
        cuda.free(last, ptr).unwrap();
        // A thread that took a device for good (as a runtime worker does) keeps it, and
        // work on another device leaves it current.
        cuda.bind_thread(0).unwrap();
        assert_eq!(cuda.context_device().unwrap(), Some(0));
        let ptr = cuda.malloc(last, 1 << 20).unwrap();
        cuda.free(last, ptr).unwrap();
        assert_eq!(cuda.context_device().unwrap(), Some(0));
    })
    .join()
    .unwrap();
}
