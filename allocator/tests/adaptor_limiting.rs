//! LimitingResourceAdaptor: the cap counts bytes in use (rounded to 256), never cached bytes;
//! refusals are out-of-memory errors that name the limit.

mod common;

use std::sync::Arc;

use common::{MIB, device};
use rmm_allocator::adaptor::{LimitingResourceAdaptor, MemoryLimit};
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::SharedResource;
use rmm_allocator::resource::{CudaMemoryResource, PoolMemoryResource};
use rmm_allocator::{Error, StreamView};

const S: StreamView = StreamView::DEFAULT;

fn cuda() -> SharedResource {
    Arc::new(CudaMemoryResource::new(device()))
}

#[test]
fn refuses_past_the_limit_with_a_message_that_names_it() {
    let limit = LimitingResourceAdaptor::new(cuda(), MemoryLimit::Bytes(10 * MIB)).unwrap();
    assert_eq!(limit.limit(), 10 * MIB);
    let a = limit.allocate(6 * MIB, S).unwrap();
    assert_eq!(limit.used_bytes(), 6 * MIB);
    let e = limit.allocate(5 * MIB, S).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    match &e {
        Error::LimitExceeded {
            requested,
            in_use,
            limit: l,
            device,
            resource,
            ..
        } => {
            assert_eq!(*requested, 5 * MIB);
            assert_eq!(*in_use, 6 * MIB);
            assert_eq!(*l, 10 * MIB);
            assert_eq!(*device, 0);
            assert_eq!(*resource, "LimitingResourceAdaptor");
        }
        other => panic!("expected LimitExceeded, got {other:?}"),
    }
    let msg = e.to_string();
    assert!(msg.contains("limit of 10.00 MiB"), "{msg}");
    assert!(msg.contains("6.00 MiB in use"), "{msg}");
    assert!(msg.contains("Raise the limit"), "{msg}");
    // The refusal left the count alone; what fits still fits.
    assert_eq!(limit.used_bytes(), 6 * MIB);
    let b = limit.allocate(4 * MIB, S).unwrap();
    assert_eq!(limit.available_bytes(), 0);
    limit.deallocate(a, 6 * MIB, S).unwrap();
    limit.deallocate(b, 4 * MIB, S).unwrap();
    assert_eq!(limit.used_bytes(), 0);
    // Larger than the limit on its own.
    assert!(limit.allocate(11 * MIB, S).unwrap_err().is_out_of_memory());
}

#[test]
fn sizes_count_rounded_to_256_bytes() {
    let limit = LimitingResourceAdaptor::with_bytes(cuda(), 1024);
    let ptrs: Vec<_> = (0..4).map(|_| limit.allocate(1, S).unwrap()).collect();
    assert_eq!(limit.used_bytes(), 1024);
    assert!(limit.allocate(1, S).is_err());
    for p in ptrs {
        limit.deallocate(p, 1, S).unwrap();
    }
    assert_eq!(limit.used_bytes(), 0);
    // Zero bytes: null, not counted.
    let z = limit.allocate(0, S).unwrap();
    assert!(z.is_null());
    limit.deallocate(z, 0, S).unwrap();
    assert_eq!(limit.used_bytes(), 0);
}

#[test]
fn cached_pool_bytes_do_not_count_against_a_limit_above_the_pool() {
    let pool: SharedResource =
        Arc::new(PoolMemoryResource::new(cuda(), 32 * MIB, Some(64 * MIB)).unwrap());
    let limit = LimitingResourceAdaptor::with_bytes(Arc::clone(&pool), 16 * MIB);
    // Allocate and free more than the limit in total: the pool keeps the memory cached,
    // the limit counts only what is in use (cupy#7678).
    for _ in 0..8 {
        let p = limit.allocate(12 * MIB, S).unwrap();
        limit.deallocate(p, 12 * MIB, S).unwrap();
    }
    assert_eq!(limit.used_bytes(), 0);
    let info = limit.memory_info().unwrap();
    assert_eq!(info.total, 16 * MIB);
    assert_eq!(info.free, 16 * MIB);
}

#[test]
fn a_limit_under_the_pool_caps_what_the_pool_reserves() {
    let limit: SharedResource = Arc::new(LimitingResourceAdaptor::with_bytes(cuda(), 128 * MIB));
    let pool = PoolMemoryResource::builder(Arc::clone(&limit))
        .initial_size(0)
        .maximum_size((512 * MIB) as u64)
        .build()
        .unwrap();
    let a = pool.allocate(40 * MIB, S).unwrap();
    let b = pool.allocate(40 * MIB, S).unwrap();
    // The pool's growth halves its tries when the limit refuses, and stops at the limit.
    assert!(pool.pool_size() <= 128 * MIB as u64, "{}", pool.pool_size());
    // What the limit let the pool have serves a third request (the pool's free memory is one
    // piece where its chunk is one), not a fourth: the limit refuses more.
    let c = pool.allocate(40 * MIB, S).unwrap();
    let e = pool.allocate(40 * MIB, S).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert!(pool.pool_size() <= 128 * MIB as u64, "{}", pool.pool_size());
    for p in [a, b, c] {
        pool.deallocate(p, 40 * MIB, S).unwrap();
    }
}

#[test]
fn fraction_of_device_memory() {
    let d = device();
    let total = d.mem_info().unwrap().total;
    let limit = LimitingResourceAdaptor::new(cuda(), MemoryLimit::Fraction(0.25)).unwrap();
    assert_eq!(limit.limit(), (total as f64 * 0.25) as usize);
    let e = limit.allocate(limit.limit() + 256, S).unwrap_err();
    assert!(e.to_string().contains("25.0% of"), "{e}");
    for bad in [0.0, -0.5, 1.5, f64::NAN] {
        match LimitingResourceAdaptor::new(cuda(), MemoryLimit::Fraction(bad)) {
            Err(Error::InvalidArgument { what, .. }) => assert_eq!(what, "limit"),
            other => panic!("fraction {bad}: expected InvalidArgument, got {other:?}"),
        }
    }
}
