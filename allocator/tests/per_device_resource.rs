//! The per-device current resource: initial resource, set returns the previous one, device
//! checks, and set/get from many threads.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Barrier};

use common::device;
use rmm_allocator::backend;
use rmm_allocator::per_device::{
    get_current_device_resource, get_per_device_resource, reset_per_device_resource,
    set_current_device_resource, set_per_device_resource,
};
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::{CudaAsyncMemoryResource, CudaMemoryResource, SharedResource};
use rmm_allocator::{Device, Error, StreamView};
use rmm_allocator::{set_current_device, with_device};

/// The per-device table is process-wide: under `cargo test` (one process, many threads) these
/// tests would see each other's resources, so they take turns. nextest runs each in its own
/// process anyway.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn id(r: &SharedResource) -> usize {
    Arc::as_ptr(r) as *const () as usize
}

#[test]
fn the_initial_resource_is_the_plain_cuda_resource() {
    let _serial = serial();
    let r = get_current_device_resource().unwrap();
    assert_eq!(r.name(), "CudaMemoryResource");
    assert_eq!(r.device(), device());
    // The same object is returned every time.
    assert_eq!(id(&r), id(&get_per_device_resource(0).unwrap()));
    let p = r.allocate(1000, StreamView::DEFAULT).unwrap();
    r.deallocate(p, 1000, StreamView::DEFAULT).unwrap();
}

#[test]
fn set_returns_the_previous_resource() {
    let _serial = serial();
    let initial = get_current_device_resource().unwrap();
    let mine: SharedResource = Arc::new(CudaAsyncMemoryResource::new(device()).unwrap());
    let prev = set_current_device_resource(Arc::clone(&mine)).unwrap();
    assert_eq!(id(&prev), id(&initial));
    assert_eq!(id(&get_current_device_resource().unwrap()), id(&mine));
    let back = reset_per_device_resource(0).unwrap();
    assert_eq!(id(&back), id(&mine));
    assert_eq!(
        get_current_device_resource().unwrap().name(),
        "CudaMemoryResource"
    );
}

#[test]
fn a_resource_of_another_device_is_refused() {
    let _serial = serial();
    let count = backend::global().unwrap().device_count();
    if count < 2 {
        eprintln!("only one device: checking the out-of-range ordinal instead");
    } else {
        let other: SharedResource = Arc::new(CudaMemoryResource::new(Device::new(1).unwrap()));
        let e = set_per_device_resource(0, other).unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidArgument {
                    what: "resource",
                    ..
                }
            ),
            "{e}"
        );
    }
    let e = get_per_device_resource(count).unwrap_err();
    assert!(
        matches!(e, Error::NoSuchDevice { requested, .. } if requested == count),
        "{e}"
    );
    assert!(set_current_device(count).is_err());
}

#[test]
fn each_device_has_its_own_resource_and_current_device_is_per_thread() {
    let _serial = serial();
    let count = backend::global().unwrap().device_count();
    for d in 0..count {
        let r = get_per_device_resource(d).unwrap();
        assert_eq!(r.device().ordinal(), d);
        let current = with_device(d, || get_current_device_resource().unwrap()).unwrap();
        assert_eq!(id(&current), id(&r));
    }
    // Another thread starts on device 0 whatever this one chose.
    set_current_device(count - 1).unwrap();
    let other = std::thread::spawn(rmm_allocator::current_device)
        .join()
        .unwrap();
    assert_eq!(other, 0);
}

#[test]
fn set_and_get_from_many_threads_lose_nothing() {
    let _serial = serial();
    const THREADS: usize = 16;
    const ROUNDS: usize = 200;
    let d = device();
    let initial = get_per_device_resource(0).unwrap();
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                let mut mine = Vec::new();
                let mut previous = Vec::new();
                for _ in 0..ROUNDS {
                    let r: SharedResource = Arc::new(CudaMemoryResource::new(d));
                    mine.push(id(&r));
                    previous.push(set_per_device_resource(0, Arc::clone(&r)).unwrap());
                    // Whatever another thread set, a get returns a usable resource.
                    let current = get_per_device_resource(0).unwrap();
                    let p = current.allocate(256, StreamView::DEFAULT).unwrap();
                    current.deallocate(p, 256, StreamView::DEFAULT).unwrap();
                }
                (mine, previous.iter().map(id).collect::<Vec<_>>(), previous)
            })
        })
        .collect();
    let mut set_ids = HashSet::new();
    let mut prev_ids = Vec::new();
    let mut keep = Vec::new();
    for h in handles {
        let (mine, prev, arcs) = h.join().unwrap();
        set_ids.extend(mine);
        prev_ids.extend(prev);
        keep.push(arcs);
    }
    let last = id(&get_per_device_resource(0).unwrap());
    // Every swap is atomic: each resource set is returned as "previous" exactly once, except
    // the one still installed; the initial resource is returned exactly once.
    let mut expected: HashSet<usize> = set_ids.clone();
    expected.remove(&last);
    expected.insert(id(&initial));
    let returned: HashSet<usize> = prev_ids.iter().copied().collect();
    assert_eq!(prev_ids.len(), THREADS * ROUNDS);
    assert_eq!(
        returned.len(),
        prev_ids.len(),
        "a resource was returned twice"
    );
    assert_eq!(returned, expected);
}
