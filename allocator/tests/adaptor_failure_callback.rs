//! FailureCallbackResourceAdaptor: the callback decides retry or fail on out-of-memory;
//! other errors pass through.

mod common;

use std::any::Any;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use common::{MIB, device};
use rmm_allocator::adaptor::{
    FailureAction, FailureCallbackResourceAdaptor, LimitingResourceAdaptor,
};
use rmm_allocator::backend::DevicePtr;
use rmm_allocator::backend::{SimBackend, SimConfig, SimMemoryMode};
use rmm_allocator::resource::CudaMemoryResource;
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::SharedResource;
use rmm_allocator::{Device, Error, Result, StreamView};

const S: StreamView = StreamView::DEFAULT;

fn sim() -> (&'static SimBackend, Device) {
    let b = SimBackend::leak(SimConfig {
        devices: 1,
        capacity: 1 << 30,
        mode: SimMemoryMode::Unbacked,
    })
    .unwrap();
    (b, Device::on(b, 0).unwrap())
}

#[test]
fn retry_after_a_transient_failure() {
    let (b, d) = sim();
    let calls = Arc::new(AtomicU32::new(0));
    let seen = Arc::clone(&calls);
    let fc = FailureCallbackResourceAdaptor::new(Arc::new(CudaMemoryResource::new(d)), move |f| {
        seen.fetch_add(1, Ordering::SeqCst);
        assert_eq!(f.bytes, 4 * MIB);
        assert_eq!(f.attempt, 1);
        assert_eq!(f.device, 0);
        assert!(f.error.is_out_of_memory(), "{}", f.error);
        FailureAction::Retry
    });
    b.fail_nth_allocation(0, 1).unwrap();
    let p = fc.allocate(4 * MIB, S).unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(fc.retry_count(), 1);
    assert_eq!(fc.failure_count(), 0);
    fc.deallocate(p, 4 * MIB, S).unwrap();
}

#[test]
fn bounded_retries_are_the_callbacks_decision() {
    let (b, d) = sim();
    b.fail_allocations_above(0, MIB).unwrap();
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&attempts);
    let fc = FailureCallbackResourceAdaptor::new(Arc::new(CudaMemoryResource::new(d)), move |f| {
        log.lock().unwrap().push(f.attempt);
        FailureAction::retry_if(f.attempt < 3)
    });
    let e = fc.allocate(2 * MIB, S).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert_eq!(*attempts.lock().unwrap(), vec![1, 2, 3]);
    assert_eq!(fc.retry_count(), 2);
    assert_eq!(fc.failure_count(), 1);
    // Below the injected threshold nothing calls back.
    let p = fc.allocate(MIB, S).unwrap();
    fc.deallocate(p, MIB, S).unwrap();
    assert_eq!(attempts.lock().unwrap().len(), 3);
    b.clear_faults(0).unwrap();
}

/// Frees "spillable" memory held elsewhere and retries, as the spill manager will.
#[test]
fn a_callback_that_frees_memory_makes_room() {
    let limit: SharedResource = Arc::new(LimitingResourceAdaptor::with_bytes(
        Arc::new(CudaMemoryResource::new(device())),
        16 * MIB,
    ));
    let spillable: Arc<Mutex<Vec<(DevicePtr, usize)>>> = Arc::new(Mutex::new(Vec::new()));
    for _ in 0..3 {
        let p = limit.allocate(4 * MIB, S).unwrap();
        spillable.lock().unwrap().push((p, 4 * MIB));
    }
    let held = Arc::clone(&spillable);
    let up = Arc::clone(&limit);
    let fc = FailureCallbackResourceAdaptor::new(Arc::clone(&limit), move |_| {
        match held.lock().unwrap().pop() {
            Some((p, b)) => {
                up.deallocate(p, b, S).unwrap();
                FailureAction::Retry
            }
            None => FailureAction::Fail,
        }
    });
    // 12 MiB in use of 16: 10 MiB needs two blocks spilled.
    let p = fc.allocate(10 * MIB, S).unwrap();
    assert_eq!(fc.retry_count(), 2);
    assert_eq!(spillable.lock().unwrap().len(), 1);
    // Nothing left to spill for another 10 MiB: the callback gives up.
    let e = fc.allocate(10 * MIB, S).unwrap_err();
    assert!(matches!(e, Error::LimitExceeded { .. }), "{e}");
    fc.deallocate(p, 10 * MIB, S).unwrap();
    for (p, b) in spillable.lock().unwrap().drain(..) {
        limit.deallocate(p, b, S).unwrap();
    }
}

#[test]
fn rmm_shaped_callback_on_bytes() {
    let limit: SharedResource = Arc::new(LimitingResourceAdaptor::with_bytes(
        Arc::new(CudaMemoryResource::new(device())),
        MIB,
    ));
    let asked = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&asked);
    let fc = FailureCallbackResourceAdaptor::from_bytes_fn(limit, move |bytes| {
        log.lock().unwrap().push(bytes);
        false
    });
    assert!(fc.allocate(2 * MIB, S).is_err());
    assert_eq!(*asked.lock().unwrap(), vec![2 * MIB]);
}

/// A resource that fails every allocation with an error that is not out-of-memory.
#[derive(Debug)]
struct Broken(Device);

impl DeviceMemoryResource for Broken {
    fn allocate(&self, bytes: usize, _: StreamView) -> Result<DevicePtr> {
        Err(Error::invalid_argument(
            "bytes",
            bytes,
            "a working resource",
        ))
    }
    fn deallocate(&self, _: DevicePtr, _: usize, _: StreamView) -> Result<()> {
        Ok(())
    }
    fn device(&self) -> Device {
        self.0
    }
    fn name(&self) -> &'static str {
        "Broken"
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[test]
fn other_errors_pass_through_without_the_callback() {
    let called = Arc::new(AtomicU32::new(0));
    let c = Arc::clone(&called);
    let fc = FailureCallbackResourceAdaptor::new(Arc::new(Broken(device())), move |_| {
        c.fetch_add(1, Ordering::SeqCst);
        FailureAction::Retry
    });
    let e = fc.allocate(256, S).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert_eq!(called.load(Ordering::SeqCst), 0);
}
