//! Start-up and shutdown: all-or-nothing device set-up, one runtime per device, nothing left
//! allocated after shutdown, leaks reported.

mod common;

use common::{config, device_count, devices, pooled, serial, sim, sim_live};
use rmm_allocator::DeviceBuffer;
use rmm_allocator::per_device::get_per_device_resource;
use rmm_runtime::{Error, Runtime, StackPlan, TaskError};

#[test]
fn shutdown_leaves_every_device_with_nothing_allocated() {
    let _s = serial();
    let n = device_count().min(4);
    let rt = Runtime::start(&pooled(4, 2, &[("stats.enabled", true.into())])).unwrap();
    let handles = rt.map(0..200usize, |ctx, i| {
        let b = DeviceBuffer::new(1024 * (i % 17 + 1), ctx.stream()).unwrap();
        b.size()
    });
    for h in handles {
        h.wait().unwrap();
    }
    if let Some(sim) = sim() {
        for d in 0..n {
            assert!(
                sim.live_allocations(d) > 0,
                "device {d}'s pool holds memory"
            );
        }
    }
    let handle = rt.handle();
    let report = rt.shutdown().unwrap();
    assert!(report.drained);
    assert!(report.leaks.is_empty(), "{:?}", report.leaks);
    for d in 0..n {
        if let Some(live) = sim_live(d) {
            assert_eq!(live, 0, "device {d} has allocations after shutdown");
        }
        let r = get_per_device_resource(d).unwrap();
        assert_eq!(
            r.name(),
            "CudaMemoryResource",
            "device {d} back on plain CUDA"
        );
    }
    assert_eq!(handle.submit(|_| 1).wait(), Err(TaskError::ShutDown));
    // The devices are free for a new runtime.
    Runtime::start(&pooled(4, 1, &[])).unwrap();
}

#[test]
fn shutdown_reports_a_buffer_that_outlives_the_runtime_as_a_leak() {
    let _s = serial();
    let rt = Runtime::start(&pooled(1, 1, &[("tracking.enabled", true.into())])).unwrap();
    let kept = rt
        .submit(|ctx| DeviceBuffer::new(12345, ctx.stream()).unwrap())
        .wait()
        .unwrap();
    let report = rt.shutdown().unwrap();
    assert_eq!(report.leaks.len(), 1);
    assert_eq!(report.leaks[0].count, 1);
    assert_eq!(report.leaks[0].bytes, 12345);
    assert_eq!(report.leaks[0].allocations.len(), 1);
    assert!(report.leaks[0].allocations[0].contains("rmm-worker-0.0"));
    // The buffer keeps its stack alive and still frees into it.
    drop(kept);
    if let Some(live) = sim_live(0) {
        assert_eq!(live, 0);
    }
}

#[test]
fn a_failed_device_set_up_leaves_nothing_running_or_allocated() {
    let _s = serial();
    let Some(sim) = sim() else {
        common::skip(
            "a_failed_device_set_up_leaves_nothing_running_or_allocated",
            "fault injection needs the simulated device (RMM_BACKEND=cuda runs on a GPU)",
        );
        return;
    };
    // The pool's initial allocation on device 1 fails.
    sim.fail_nth_allocation(1, 1).unwrap();
    let err = Runtime::start(&pooled(3, 2, &[])).unwrap_err();
    sim.clear_faults(1).unwrap();
    assert!(matches!(err, Error::DeviceSetup { device: 1, .. }), "{err}");
    assert!(
        err.to_string().starts_with("setting up device 1: "),
        "{err}"
    );
    for d in 0..3 {
        assert_eq!(sim.live_allocations(d), 0, "device {d}");
        let r = get_per_device_resource(d).unwrap();
        assert_eq!(r.name(), "CudaMemoryResource", "device {d} untouched");
    }
    // Nothing claimed the devices: a runtime starts on them now.
    let rt = Runtime::start(&pooled(3, 2, &[])).unwrap();
    assert_eq!(rt.workers().len(), 6);
}

#[test]
fn one_runtime_per_device() {
    let _s = serial();
    let a = Runtime::start(&pooled(1, 1, &[])).unwrap();
    let err = Runtime::start(&pooled(1, 1, &[])).unwrap_err();
    assert!(matches!(err, Error::DeviceInUse { device: 0 }), "{err}");
    drop(a);
    Runtime::start(&pooled(1, 1, &[])).unwrap();
}

#[test]
fn the_stack_is_built_as_configured() {
    let _s = serial();
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    let rt = Runtime::start(&config(&[
        ("devices", devices(2).into()),
        ("pool.enabled", true.into()),
        ("pool.initial_size", "32MiB".into()),
        ("pool.maximum_size", "256MiB".into()),
        ("limits.device_memory_limit", "128MiB".into()),
        ("tracking.enabled", true.into()),
        ("logging.enabled", true.into()),
        ("logging.directory", dir.to_string_lossy().as_ref().into()),
    ]))
    .unwrap();
    for d in rt.devices() {
        let stack = rt.stack(d).unwrap();
        assert_eq!(
            stack.describe(),
            "StatisticsResourceAdaptor > LoggingResourceAdaptor > TrackingResourceAdaptor > \
             LimitingResourceAdaptor > PoolMemoryResource > CudaMemoryResource"
        );
        // The plan `rmm info` prints names the same layers, with their settings.
        let plan = stack.plan().to_string();
        assert!(
            plan.starts_with("StatisticsResourceAdaptor > LoggingResourceAdaptor("),
            "{plan}"
        );
        assert!(
            plan.contains("LimitingResourceAdaptor(128.00 MiB) > PoolMemoryResource(initial 32.00 MiB, maximum 256.00 MiB, growth 1.00 GiB) > CudaMemoryResource"),
            "{plan}"
        );
        assert_eq!(stack.pool().unwrap().pool_size(), 32 << 20);
    }
    // The limit holds.
    let err = rt
        .submit_to_device(0, |ctx| {
            DeviceBuffer::new(200 << 20, ctx.stream()).map(|_| ())
        })
        .wait()
        .unwrap();
    assert!(err.is_err());
    rt.submit(|ctx| DeviceBuffer::new(1000, ctx.stream()).map(|_| ()))
        .wait()
        .unwrap()
        .unwrap();
    drop(rt);
    // One log per device, in the configured directory.
    for d in 0..devices(2).len() {
        let log = std::fs::read_to_string(dir.join(format!("rmm_log.dev{d}.csv"))).unwrap();
        assert!(
            log.starts_with("Thread,Time,Action,Pointer,Size,Stream"),
            "{log}"
        );
    }
}

#[test]
fn plans_for_managed_and_async_name_their_upstream() {
    let _s = serial();
    common::backend();
    let facts =
        rmm_runtime::device_facts(common::backend(), &config(&[("pool.enabled", true.into())]))
            .unwrap();
    let managed = config(&[("pool.managed", true.into())])
        .resolve(&facts)
        .unwrap();
    let plan = StackPlan::new(&managed, &managed.devices[0]);
    assert_eq!(
        plan.to_string(),
        "StatisticsResourceAdaptor > ManagedMemoryResource"
    );
    let asynchronous = config(&[
        ("pool.async", true.into()),
        ("pool.release_threshold", "1GiB".into()),
        ("pool.initial_size", "16MiB".into()),
    ])
    .resolve(&facts)
    .unwrap();
    let plan = StackPlan::new(&asynchronous, &asynchronous.devices[0]);
    assert_eq!(
        plan.to_string(),
        "StatisticsResourceAdaptor > CudaAsyncMemoryResource(release threshold 1.00 GiB, initial 16.00 MiB)"
    );
    let built = plan.build().unwrap();
    assert_eq!(
        built.describe(),
        "StatisticsResourceAdaptor > CudaAsyncMemoryResource"
    );
    if sim().is_none() {
        // The driver's pool keeps the reservation (the simulated one caches nothing).
        assert!(
            built.reserved_bytes() >= 16 << 20,
            "{}",
            built.reserved_bytes()
        );
    }
}

#[test]
fn shutdown_cancels_a_queued_task_that_a_running_task_waits_for() {
    let _s = serial();
    let rt = Runtime::start(&pooled(1, 2, &[])).unwrap();
    let (a, b) = (rt.workers()[0], rt.workers()[1]);
    // Worker b is busy for a while; the awaited task waits in its queue behind that.
    let busy = rt.submit_to_worker(b, |_| {
        std::thread::sleep(std::time::Duration::from_millis(500))
    });
    let awaited = rt.submit_to_worker(b, |_| 1u32);
    let (tx, rx) = crossbeam_channel::bounded::<rmm_runtime::TaskHandle<u32>>(1);
    tx.send(awaited).unwrap();
    let waiter = rt.submit_to_worker(a, move |_| rx.recv().unwrap().wait());
    std::thread::sleep(std::time::Duration::from_millis(50));
    let report = rt
        .shutdown_timeout(std::time::Duration::from_millis(100))
        .unwrap();
    assert!(!report.drained);
    busy.wait().unwrap();
    let got = waiter.wait().unwrap();
    assert!(matches!(got, Err(TaskError::Cancelled { .. })), "{got:?}");
}
