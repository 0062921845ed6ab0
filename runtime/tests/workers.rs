//! Workers and task submission: every worker has its device's stack current, tasks land where
//! they are sent, panics are contained, waiting inside a worker does not deadlock.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{device_count, pooled, serial};
use rmm_allocator::current_device;
use rmm_allocator::per_device::get_current_device_resource;
use rmm_allocator::{DeviceBuffer, DeviceUVector};
use rmm_runtime::{Runtime, TaskError, TaskHandle, WorkerId};

#[test]
fn every_worker_has_its_devices_stack_current() {
    let _s = serial();
    let rt = Runtime::start(&pooled(3, 2, &[])).unwrap();
    let n = device_count().min(3);
    assert_eq!(rt.workers().len() as u32, n * 2);
    let seen = rt.run_on_all(|ctx| {
        let current = get_current_device_resource().unwrap();
        (
            ctx.worker(),
            current_device(),
            Arc::ptr_eq(&current, ctx.resource()),
            ctx.device().ordinal(),
            ctx.stack().describe(),
        )
    });
    let seen = TaskHandle::wait_all(seen).unwrap();
    let mut ids: Vec<WorkerId> = seen.iter().map(|s| s.0).collect();
    ids.sort();
    assert_eq!(
        ids,
        rt.workers(),
        "run_on_all reaches every worker exactly once"
    );
    for (id, current, same, ordinal, stack) in seen {
        assert_eq!(current, id.device, "worker {id} has its device current");
        assert_eq!(ordinal, id.device);
        assert!(
            same,
            "worker {id}: the current resource is its device's stack"
        );
        assert_eq!(
            stack,
            "StatisticsResourceAdaptor > PoolMemoryResource > CudaMemoryResource"
        );
    }
    // Each device has its own stack.
    let a = rt.stack(0).unwrap();
    if n > 1 {
        assert!(!Arc::ptr_eq(a.resource(), rt.stack(1).unwrap().resource()));
    }
}

#[test]
fn tasks_land_where_they_are_sent() {
    let _s = serial();
    let rt = Runtime::start(&pooled(2, 3, &[])).unwrap();
    for &w in &rt.workers() {
        let handles: Vec<_> = (0..20)
            .map(|_| rt.submit_to_worker(w, |ctx| ctx.worker()))
            .collect();
        for got in TaskHandle::wait_all(handles).unwrap() {
            assert_eq!(got, w);
        }
    }
    for d in rt.devices() {
        let handles: Vec<_> = (0..50)
            .map(|_| rt.submit_to_device(d, |ctx| (ctx.worker().device, current_device())))
            .collect();
        for (device, current) in TaskHandle::wait_all(handles).unwrap() {
            assert_eq!((device, current), (d, d));
        }
    }
    let missing = rt.submit_to_device(63, |_| ()).wait().unwrap_err();
    assert!(
        matches!(missing, TaskError::NoSuchTarget { .. }),
        "{missing}"
    );
    assert!(missing.to_string().contains("device 63"), "{missing}");
    let missing = rt
        .submit_to_worker(
            WorkerId {
                device: 0,
                index: 9,
            },
            |_| (),
        )
        .wait()
        .unwrap_err();
    assert!(missing.to_string().contains("worker 0.9"), "{missing}");
}

#[test]
fn least_loaded_submission_spreads_over_workers() {
    let _s = serial();
    let rt = Runtime::start(&pooled(2, 2, &[])).unwrap();
    let handles: Vec<_> = (0..rt.workers().len() * 4)
        .map(|_| {
            rt.submit(|ctx| {
                std::thread::sleep(Duration::from_millis(20));
                ctx.worker()
            })
        })
        .collect();
    let mut per_worker = BTreeMap::new();
    for w in TaskHandle::wait_all(handles).unwrap() {
        *per_worker.entry(w).or_insert(0) += 1;
    }
    assert_eq!(per_worker.len(), rt.workers().len(), "{per_worker:?}");
    for (w, n) in per_worker {
        assert_eq!(n, 4, "worker {w} got {n} of the sleeping tasks");
    }
}

#[test]
fn map_keeps_the_items_order_and_tasks_allocate_from_their_stack() {
    let _s = serial();
    let rt = Runtime::start(&pooled(2, 2, &[("stats.enabled", true.into())])).unwrap();
    let handles = rt.map(0..64u32, |ctx, i| {
        let v = DeviceUVector::<u32>::from_host(&[i; 1000], ctx.stream())?;
        let back = v.to_vec(ctx.stream())?;
        Ok::<_, rmm_allocator::Error>((i, back.iter().all(|&x| x == i)))
    });
    for (expect, h) in handles.into_iter().enumerate() {
        let (i, ok) = h.wait().unwrap().unwrap();
        assert_eq!(i as usize, expect);
        assert!(ok);
    }
    let report = rt.report();
    let total: u64 = report
        .devices
        .iter()
        .map(|d| d.statistics.as_ref().unwrap().allocations.total as u64)
        .sum();
    assert!(total >= 64, "statistics counted {total} allocations");
    assert_eq!(report.workers.iter().map(|w| w.tasks_run).sum::<u64>(), 64);
    // Every pooled device reports its pool: reserved against in use, and fragmentation.
    for d in &report.devices {
        let p = d.pool.expect("a pooled device reports its pool's figures");
        assert_eq!(p.reserved_bytes, d.reserved_bytes);
        assert_eq!(p.in_use_bytes + p.free_bytes, p.reserved_bytes, "{p:?}");
        assert!(p.largest_free_block <= p.free_bytes);
        assert!((0.0..=1.0).contains(&p.fragmentation), "{p:?}");
        assert!(p.peak_reserved_bytes >= p.reserved_bytes, "{p:?}");
        assert_eq!(p.max_overhead, None, "no footprint limit by default");
    }
    let text = report.to_string();
    assert!(
        text.contains("pool: reserved") && text.contains("fragmentation"),
        "{text}"
    );
}

#[test]
fn a_panicking_task_is_an_error_and_its_worker_lives_on() {
    let _s = serial();
    let rt = Runtime::start(&pooled(1, 1, &[])).unwrap();
    let w = rt.workers()[0];
    let err = rt
        .submit_to_worker(w, |_| -> u32 { panic!("boom at item 7") })
        .wait()
        .unwrap_err();
    assert_eq!(
        err,
        TaskError::Panicked {
            worker: w,
            message: "boom at item 7".into()
        }
    );
    assert!(err.to_string().contains("boom at item 7"));
    assert_eq!(rt.submit_to_worker(w, |_| 5).wait().unwrap(), 5);
    let report = rt.report();
    assert_eq!(report.workers[0].panics, 1);
    assert_eq!(report.workers[0].tasks_run, 2);
}

#[test]
fn waiting_inside_a_worker_runs_queued_tasks_instead_of_deadlocking() {
    let _s = serial();
    // One worker: the child can only run on the worker that waits for it.
    let rt = Runtime::start(&pooled(1, 1, &[])).unwrap();
    let got = rt
        .submit(|ctx| {
            let child = ctx.runtime().submit(|ctx| ctx.worker().index + 41);
            child.wait().unwrap() + 1
        })
        .wait()
        .unwrap();
    assert_eq!(got, 42);
    drop(rt);

    // Recursive fan-out over several workers: every level waits for the one below.
    fn sum(rt: &rmm_runtime::RuntimeHandle, lo: u64, hi: u64) -> u64 {
        if hi - lo <= 4 {
            return (lo..hi).sum();
        }
        let mid = (lo + hi) / 2;
        let left = {
            let rt2 = rt.clone();
            rt.submit(move |_| sum(&rt2, lo, mid))
        };
        let right = {
            let rt2 = rt.clone();
            rt.submit(move |_| sum(&rt2, mid, hi))
        };
        left.wait().unwrap() + right.wait().unwrap()
    }
    let rt = Runtime::start(&pooled(2, 2, &[])).unwrap();
    let h = rt.handle();
    let total = rt.submit(move |_| sum(&h, 0, 2000)).wait().unwrap();
    assert_eq!(total, (0..2000u64).sum::<u64>());
}

#[test]
fn wait_timeout_leaves_the_task_running_and_the_handle_usable() {
    let _s = serial();
    let rt = Runtime::start(&pooled(1, 1, &[])).unwrap();
    let h = rt.submit(|_| {
        std::thread::sleep(Duration::from_millis(200));
        7
    });
    assert!(!h.is_done());
    assert_eq!(
        h.wait_timeout(Duration::from_millis(5)),
        Err(TaskError::Timeout(Duration::from_millis(5)))
    );
    assert_eq!(h.wait_timeout(Duration::from_secs(30)), Ok(7));
    assert!(h.is_done());
    assert_eq!(h.wait(), Err(TaskError::AlreadyTaken));
}

#[test]
fn many_threads_submitting_lose_no_task() {
    let _s = serial();
    let rt = Runtime::start(&pooled(2, 4, &[])).unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    std::thread::scope(|s| {
        for _ in 0..4 {
            let h = rt.handle();
            let ran = Arc::clone(&ran);
            s.spawn(move || {
                let handles: Vec<_> = (0..2000)
                    .map(|i| {
                        let ran = Arc::clone(&ran);
                        h.submit(move |_| {
                            ran.fetch_add(1, Ordering::Relaxed);
                            i
                        })
                    })
                    .collect();
                for (i, h) in handles.into_iter().enumerate() {
                    assert_eq!(h.wait().unwrap(), i);
                }
            });
        }
    });
    assert_eq!(ran.load(Ordering::Relaxed), 8000);
}

#[test]
fn tasks_see_their_workers_stream_and_buffers_default_to_the_device_stack() {
    let _s = serial();
    let rt = Runtime::start(&pooled(2, 2, &[])).unwrap();
    let results = rt.run_on_all(|ctx| {
        let before = ctx.statistics().lifetime_allocations().total;
        let buf = DeviceBuffer::new(4096, ctx.stream()).unwrap();
        let after = ctx.statistics().lifetime_allocations().total;
        drop(buf);
        (ctx.stream(), after - before)
    });
    let results = TaskHandle::wait_all(results).unwrap();
    let mut streams: Vec<_> = results.iter().map(|r| r.0).collect();
    streams.sort_by_key(|s| s.raw());
    streams.dedup();
    assert_eq!(
        streams.len(),
        rt.workers().len(),
        "each worker owns a stream"
    );
    assert!(streams.iter().all(|s| !s.is_default()));
    // Counted by the stack's statistics; other workers of the device may add their own.
    assert!(results.iter().all(|r| r.1 >= 1));
}
