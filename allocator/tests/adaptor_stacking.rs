//! Adaptors stack in any order, and each sees what reaches it.

mod common;

use std::sync::Arc;

use common::{MIB, device};
use rmm_allocator::StreamView;
use rmm_allocator::adaptor::{
    self, FailureAction, FailureCallbackResourceAdaptor, HookedResourceAdaptor,
    LimitingResourceAdaptor, LoggingResourceAdaptor, StatisticsResourceAdaptor,
    TrackingResourceAdaptor,
};
use rmm_allocator::per_device;
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::SharedResource;
use rmm_allocator::resource::{CudaMemoryResource, PoolMemoryResource};

const S: StreamView = StreamView::DEFAULT;

fn cuda() -> SharedResource {
    Arc::new(CudaMemoryResource::new(device()))
}

fn pool() -> SharedResource {
    Arc::new(PoolMemoryResource::new(cuda(), 32 * MIB, Some(256 * MIB)).unwrap())
}

#[test]
fn a_limit_under_statistics_is_counted_as_out_of_memory() {
    let limit: SharedResource = Arc::new(LimitingResourceAdaptor::with_bytes(pool(), 4 * MIB));
    let stats = StatisticsResourceAdaptor::new(limit);
    let a = stats.allocate(3 * MIB, S).unwrap();
    let e = stats.allocate(2 * MIB, S).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let r = stats.report();
    assert_eq!(r.num_ooms, 1);
    assert_eq!(r.allocated_bytes.value, 3 * MIB as i64);
    assert_eq!(
        r.resource,
        "StatisticsResourceAdaptor > LimitingResourceAdaptor > PoolMemoryResource > CudaMemoryResource"
    );
    // The pool below the limit is still found for the reserved figures.
    assert!(r.reserved_bytes.unwrap() >= 32 * MIB as u64);
    stats.deallocate(a, 3 * MIB, S).unwrap();
}

#[test]
fn statistics_under_a_limit_never_see_the_refusals() {
    let stats = Arc::new(StatisticsResourceAdaptor::new(pool()));
    let limit = LimitingResourceAdaptor::with_bytes(stats.clone(), 4 * MIB);
    let a = limit.allocate(3 * MIB, S).unwrap();
    assert!(limit.allocate(2 * MIB, S).is_err());
    assert_eq!(stats.out_of_memory_count(), 0);
    assert_eq!(stats.allocations_counter().total, 1);
    limit.deallocate(a, 3 * MIB, S).unwrap();
}

#[test]
fn retries_of_a_failure_callback_show_in_the_report() {
    let limit: SharedResource = Arc::new(LimitingResourceAdaptor::with_bytes(pool(), 4 * MIB));
    let fc: SharedResource = Arc::new(FailureCallbackResourceAdaptor::new(limit, |f| {
        FailureAction::retry_if(f.attempt <= 2)
    }));
    let stats = StatisticsResourceAdaptor::new(fc);
    assert!(stats.allocate(8 * MIB, S).is_err());
    let r = stats.report();
    assert_eq!(r.num_alloc_retries, 2);
    assert_eq!(r.num_ooms, 1);
    assert_eq!(r.memory_stats()["num_alloc_retries"], 2);
}

#[test]
fn everything_stacked_works_and_is_found() {
    let dir = std::env::temp_dir().join(format!("rmm-adaptor-{}-stack", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tracking = Arc::new(TrackingResourceAdaptor::new(pool()));
    let limit: SharedResource = Arc::new(LimitingResourceAdaptor::with_bytes(
        tracking.clone(),
        64 * MIB,
    ));
    let hooked: SharedResource = Arc::new(HookedResourceAdaptor::new(limit));
    let fc: SharedResource = Arc::new(FailureCallbackResourceAdaptor::new(hooked, |_| {
        FailureAction::Fail
    }));
    let stats = Arc::new(StatisticsResourceAdaptor::new(fc));
    let log = Arc::new(LoggingResourceAdaptor::in_dir(stats.clone(), &dir).unwrap());
    let top: SharedResource = log.clone();
    assert_eq!(
        adaptor::chain_names(&*top),
        "LoggingResourceAdaptor > StatisticsResourceAdaptor > FailureCallbackResourceAdaptor > \
         HookedResourceAdaptor > LimitingResourceAdaptor > TrackingResourceAdaptor > \
         PoolMemoryResource > CudaMemoryResource"
    );
    assert!(adaptor::find_in_chain::<TrackingResourceAdaptor>(&*top).is_some());
    assert!(adaptor::find_in_chain::<PoolMemoryResource>(&*top).is_some());
    let mut live = Vec::new();
    for i in 1..=20usize {
        live.push((top.allocate(i * 100_000, S).unwrap(), i * 100_000));
    }
    assert_eq!(tracking.outstanding_count(), 20);
    assert_eq!(stats.allocations_counter().value, 20);
    assert!(top.allocate(64 * MIB, S).is_err());
    assert_eq!(stats.out_of_memory_count(), 1);
    for (p, b) in live {
        top.deallocate(p, b, S).unwrap();
    }
    assert!(tracking.leak_report().is_empty());
    log.flush().unwrap();
    let text = std::fs::read_to_string(adaptor::log_file_path(&dir, 0)).unwrap();
    assert_eq!(text.lines().count(), 1 + 20 + 1 + 20);
    // The stack can be the device's current resource.
    let previous = per_device::set_per_device_resource(0, Arc::clone(&top)).unwrap();
    let current = per_device::get_per_device_resource(0).unwrap();
    assert!(current.is_equal(&*top));
    per_device::set_per_device_resource(0, previous).unwrap();
    drop(current);
    drop(top);
    drop(log);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn equality_of_stacked_adaptors() {
    let up = pool();
    let a = TrackingResourceAdaptor::new(Arc::clone(&up));
    let b = TrackingResourceAdaptor::new(Arc::clone(&up));
    let l = LimitingResourceAdaptor::with_bytes(Arc::clone(&up), MIB);
    assert!(a.is_equal(&b));
    assert!(!a.is_equal(&l));
    assert!(!l.is_equal(&a));
}

#[test]
fn every_adaptor_names_its_upstream() {
    let cuda = cuda();
    assert!(cuda.upstream().is_none());
    let typed_pool = Arc::new(PoolMemoryResource::new(cuda.clone(), 32 * MIB, None).unwrap());
    let typed_stats = StatisticsResourceAdaptor::new(typed_pool);
    assert_eq!(
        adaptor::chain_names(&typed_stats),
        "StatisticsResourceAdaptor > PoolMemoryResource > CudaMemoryResource"
    );
    let hooked = HookedResourceAdaptor::new(cuda.clone());
    let up = DeviceMemoryResource::upstream(&hooked).expect("an adaptor has an upstream");
    assert!(up.is_equal(&*cuda));
}
