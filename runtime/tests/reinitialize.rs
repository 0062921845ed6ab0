//! reinitialize: switches every device's stack while the runtime runs; loses no task, runs
//! none twice; refuses (changing nothing) on a bad configuration, on live allocations, from
//! inside a task, and when a device's new stack cannot be built.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use common::{config, device_count, devices, pooled, serial, sim, sim_live};
use rmm_allocator::DeviceBuffer;
use rmm_allocator::per_device::get_per_device_resource;
use rmm_runtime::{Error, Runtime, TaskHandle};

fn chain(rt: &Runtime, device: u32) -> String {
    rt.stack(device).unwrap().describe()
}

#[test]
fn pool_managed_async_pool_while_other_threads_submit() {
    let _s = serial();
    let n = device_count().min(3);
    let rt = Runtime::start(&pooled(3, 2, &[])).unwrap();
    // Each submitter keeps submitting until every phase is done; task ids are t + 2k.
    const MAX: usize = 400_000;
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..MAX).map(|_| AtomicU32::new(0)).collect());
    let stop = AtomicBool::new(false);
    let phases = [
        config(&[
            ("devices", devices(3).into()),
            ("workers_per_device", 2.into()),
            ("pool.managed", true.into()),
        ]),
        config(&[
            ("devices", devices(3).into()),
            ("workers_per_device", 2.into()),
            ("pool.async", true.into()),
        ]),
        pooled(3, 2, &[("pool.initial_size", "32MiB".into())]),
    ];
    let expected = [
        "StatisticsResourceAdaptor > ManagedMemoryResource",
        "StatisticsResourceAdaptor > CudaAsyncMemoryResource",
        "StatisticsResourceAdaptor > PoolMemoryResource > CudaMemoryResource",
    ];
    let submitted = std::thread::scope(|s| {
        let submitters: Vec<_> = (0..2)
            .map(|t| {
                let h = rt.handle();
                let runs = Arc::clone(&runs);
                let stop = &stop;
                s.spawn(move || {
                    // At most 256 tasks outstanding: a client with back-pressure, so the
                    // test measures correctness, not how fast a device allocates.
                    let mut handles = std::collections::VecDeque::new();
                    let mut i = t;
                    let mut n = 0;
                    let check = |(i, h): (usize, TaskHandle<_>)| {
                        let got: rmm_allocator::Result<usize> = h.wait().unwrap();
                        assert_eq!(got.unwrap(), 4096 + i);
                    };
                    while !stop.load(Ordering::SeqCst) && i < MAX {
                        let runs = Arc::clone(&runs);
                        handles.push_back((
                            i,
                            h.submit(move |ctx| {
                                let b = DeviceBuffer::new(4096 + i, ctx.stream())?;
                                runs[i].fetch_add(1, Ordering::SeqCst);
                                Ok::<_, rmm_allocator::Error>(b.size())
                            }),
                        ));
                        i += 2;
                        n += 1;
                        if handles.len() > 256 {
                            check(handles.pop_front().unwrap());
                        }
                    }
                    for pending in handles {
                        check(pending);
                    }
                    n
                })
            })
            .collect();
        for (phase, want) in phases.iter().zip(expected) {
            std::thread::sleep(Duration::from_millis(20));
            let report = rt.reinitialize(phase).unwrap();
            assert!(!report.respawned);
            for d in 0..n {
                assert_eq!(chain(&rt, d), want);
                assert!(Arc::ptr_eq(
                    &get_per_device_resource(d).unwrap(),
                    rt.stack(d).unwrap().resource()
                ));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
        stop.store(true, Ordering::SeqCst);
        submitters
            .into_iter()
            .map(|s| s.join().unwrap())
            .collect::<Vec<_>>()
    });
    for (t, &count) in submitted.iter().enumerate() {
        assert!(count > 100, "submitter {t} submitted only {count} tasks");
        for k in 0..count {
            let i = t + 2 * k;
            let r = runs[i].load(Ordering::SeqCst);
            assert_eq!(r, 1, "task {i} ran {r} times");
        }
    }
    let total: usize = submitted.iter().sum();
    let ran: u32 = runs.iter().map(|r| r.load(Ordering::SeqCst)).sum();
    assert_eq!(ran as usize, total, "a task that was never submitted ran");
    assert_eq!(rt.report().reinitializations, 3);
}

#[test]
fn a_bad_configuration_keeps_the_old_runtime_working() {
    let _s = serial();
    let rt = Runtime::start(&pooled(2, 1, &[])).unwrap();
    let before = Arc::clone(rt.stack(0).unwrap().resource());
    // Larger than the device: resolution fails before anything is touched.
    let err = rt
        .reinitialize(&pooled(2, 1, &[("pool.initial_size", "100000GiB".into())]))
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
    assert!(err.to_string().contains("pool.initial_size"), "{err}");
    // A device that does not exist.
    let err = rt
        .reinitialize(&config(&[("devices", vec![60i64].into())]))
        .unwrap_err();
    assert!(err.to_string().contains("60"), "{err}");
    assert!(Arc::ptr_eq(&before, rt.stack(0).unwrap().resource()));
    assert!(rt.submit(|ctx| ctx.device().ordinal()).wait().unwrap() < 2);
    assert_eq!(rt.report().reinitializations, 0);
}

#[test]
fn live_non_spillable_memory_makes_reinitialize_refuse_and_change_nothing() {
    let _s = serial();
    let rt = Runtime::start(&pooled(2, 1, &[("tracking.enabled", true.into())])).unwrap();
    let before = Arc::clone(rt.stack(0).unwrap().resource());
    let buf = rt
        .submit_to_device(0, |ctx| DeviceBuffer::new(3 << 20, ctx.stream()).unwrap())
        .wait()
        .unwrap();
    let err = rt.reinitialize(&pooled(2, 1, &[])).unwrap_err();
    let Error::LiveAllocations(live) = &err else {
        panic!("expected LiveAllocations, got {err}");
    };
    assert_eq!(live.len(), 1);
    assert_eq!(
        (live[0].device, live[0].count, live[0].bytes),
        (0, 1, 3 << 20)
    );
    let text = err.to_string();
    assert!(
        text.contains("device 0 has 1 allocation(s) of 3.00 MiB"),
        "{text}"
    );
    assert!(
        text.contains("rmm-worker-0.0"),
        "the tracked allocation is listed: {text}"
    );
    assert!(Arc::ptr_eq(&before, rt.stack(0).unwrap().resource()));
    assert!(Arc::ptr_eq(&before, &get_per_device_resource(0).unwrap()));
    // The runtime still runs tasks, and the buffer is still good.
    assert_eq!(rt.submit(|_| 3).wait().unwrap(), 3);
    drop(buf);
    rt.reinitialize(&pooled(2, 1, &[])).unwrap();
    assert!(!Arc::ptr_eq(&before, rt.stack(0).unwrap().resource()));
}

#[test]
fn reinitialize_inside_a_task_is_an_error_not_a_deadlock() {
    let _s = serial();
    let rt = Runtime::start(&pooled(1, 1, &[])).unwrap();
    let cfg = pooled(1, 1, &[]);
    let err = rt
        .submit(move |ctx| ctx.runtime().reinitialize(&cfg).map(|_| ()))
        .wait()
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, Error::InsideWorker { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("reinitialize called from inside a task on worker 0.0")
    );
}

#[test]
fn changing_devices_or_workers_respawns_and_delivers_held_tasks() {
    let _s = serial();
    let n = device_count().min(2);
    let rt = Runtime::start(&pooled(1, 1, &[])).unwrap();
    assert_eq!(rt.workers().len(), 1);
    let report = rt.reinitialize(&pooled(2, 3, &[])).unwrap();
    assert!(report.respawned);
    assert_eq!(rt.workers().len() as u32, n * 3);
    let seen = TaskHandle::wait_all(rt.run_on_all(|ctx| ctx.worker())).unwrap();
    assert_eq!(seen, rt.workers());
    // Tasks submitted while a reinitialize runs are held, then run on the new workers.
    let h = rt.handle();
    let during = std::thread::scope(|s| {
        let submitter = s.spawn(move || {
            (0..500)
                .map(|i| h.submit(move |ctx| (i, ctx.worker())))
                .collect::<Vec<_>>()
        });
        rt.reinitialize(&pooled(1, 2, &[])).unwrap();
        submitter.join().unwrap()
    });
    for (i, h) in during.into_iter().enumerate() {
        let (got, _) = h.wait().unwrap();
        assert_eq!(got, i);
    }
    assert_eq!(rt.workers().len(), 2);
    if n > 1 {
        // Device 1 left the runtime: back on its initial resource, nothing allocated.
        assert_eq!(
            get_per_device_resource(1).unwrap().name(),
            "CudaMemoryResource"
        );
        if let Some(live) = sim_live(1) {
            assert_eq!(live, 0);
        }
    }
}

#[test]
fn a_device_whose_new_stack_fails_keeps_every_old_stack() {
    let _s = serial();
    let Some(sim) = sim() else {
        common::skip(
            "a_device_whose_new_stack_fails_keeps_every_old_stack",
            "fault injection needs the simulated device (RMM_BACKEND=cuda runs on a GPU)",
        );
        return;
    };
    let rt = Runtime::start(&pooled(2, 1, &[])).unwrap();
    let before: Vec<_> = (0..2)
        .map(|d| Arc::clone(rt.stack(d).unwrap().resource()))
        .collect();
    sim.fail_nth_allocation(1, 1).unwrap();
    let err = rt
        .reinitialize(&pooled(2, 1, &[("pool.initial_size", "16MiB".into())]))
        .unwrap_err();
    sim.clear_faults(1).unwrap();
    assert!(matches!(err, Error::DeviceSetup { device: 1, .. }), "{err}");
    for d in 0..2 {
        assert!(Arc::ptr_eq(
            &before[d as usize],
            rt.stack(d).unwrap().resource()
        ));
    }
    // The old stacks still serve allocations (their pools grow back on demand).
    let sizes = TaskHandle::wait_all(
        rt.run_on_all(|ctx| DeviceBuffer::new(8 << 20, ctx.stream()).map(|b| b.size())),
    )
    .unwrap();
    assert!(sizes.into_iter().all(|s| s.unwrap() == 8 << 20));
}

#[test]
fn the_report_times_each_phase_and_serializes() {
    let _s = serial();
    let rt = Runtime::start(&pooled(2, 2, &[("stats.enabled", true.into())])).unwrap();
    let n = rt.devices().len() as u64;
    let live = |d| sim_live(d).unwrap_or(0);
    let before: Vec<usize> = (0..n as u32).map(live).collect();
    // Pool → pool of the same size: the new pools take the old pools' memory over.
    let r = rt.reinitialize(&pooled(2, 2, &[])).unwrap();
    assert!(r.total >= r.build);
    assert_eq!(r.adopted_bytes, n * (64 << 20), "{r}");
    assert_eq!(r.released_bytes, 0, "{r}");
    assert_eq!(
        (0..n as u32).map(live).collect::<Vec<_>>(),
        before,
        "no driver call"
    );
    // Pool → plain: everything goes back.
    let r = rt
        .reinitialize(&config(&[
            ("devices", devices(2).into()),
            ("workers_per_device", 2.into()),
            ("stats.enabled", true.into()),
        ]))
        .unwrap();
    assert_eq!(r.released_bytes, n * (64 << 20), "{r}");
    assert_eq!(r.adopted_bytes, 0, "{r}");
    for d in 0..n as u32 {
        if let Some(l) = sim_live(d) {
            assert_eq!(l, 0);
        }
    }
    rt.reinitialize(&pooled(2, 2, &[("stats.enabled", true.into())]))
        .unwrap();
    assert!(r.to_string().starts_with("reinitialize "));
    let report = rt.report();
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(json["reinitializations"], 3);
    assert_eq!(
        json["workers"].as_array().unwrap().len(),
        rt.workers().len()
    );
    assert!(json["last_reinitialize"]["build"].as_f64().unwrap() >= 0.0);
    let table = report.to_string();
    assert!(table.contains("worker"), "{table}");
    assert!(table.contains("PoolMemoryResource"), "{table}");
}

#[test]
fn a_task_may_ask_for_the_report_while_a_reinitialize_waits_for_it() {
    let _s = serial();
    let rt = Runtime::start(&pooled(1, 1, &[])).unwrap();
    let started = Arc::new(AtomicBool::new(false));
    let reinitializing = Arc::new(AtomicBool::new(false));
    let (s2, r2) = (Arc::clone(&started), Arc::clone(&reinitializing));
    let task = rt.submit(move |ctx| {
        s2.store(true, Ordering::SeqCst);
        while !r2.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        // Long past resolving (tens of ms on a GPU machine): reinitialize is draining.
        std::thread::sleep(Duration::from_millis(400));
        ctx.runtime().report().workers.len()
    });
    while !started.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    reinitializing.store(true, Ordering::SeqCst);
    let r = rt.reinitialize(&pooled(1, 1, &[])).unwrap();
    assert!(r.drain >= Duration::from_millis(20), "{r}");
    assert_eq!(task.wait().unwrap(), 1);
}

#[test]
fn reinitialize_waits_for_running_tasks_not_queued_ones_which_then_use_the_new_stack() {
    let _s = serial();
    let rt = Runtime::start(&pooled(1, 1, &[])).unwrap();
    let started = Arc::new(AtomicBool::new(false));
    let s2 = Arc::clone(&started);
    let running = rt.submit(move |ctx| {
        s2.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(100));
        ctx.stack().describe()
    });
    // Two seconds of queued work behind it.
    let queued: Vec<_> = (0..200)
        .map(|_| {
            rt.submit(|ctx| {
                std::thread::sleep(Duration::from_millis(10));
                ctx.stack().describe()
            })
        })
        .collect();
    while !started.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    let r = rt
        .reinitialize(&config(&[("pool.managed", true.into())]))
        .unwrap();
    assert!(
        r.drain < Duration::from_secs(1),
        "waited for queued tasks: {r}"
    );
    assert_eq!(
        running.wait().unwrap(),
        "StatisticsResourceAdaptor > PoolMemoryResource > CudaMemoryResource"
    );
    let after = TaskHandle::wait_all(queued).unwrap();
    // A task the worker had already taken off its queue when the pause began may have been
    // set aside; every one of them ran after the switch, on the new stack.
    assert!(
        after
            .iter()
            .all(|s| s == "StatisticsResourceAdaptor > ManagedMemoryResource"),
        "{after:?}"
    );
}

#[test]
fn children_of_a_running_task_run_while_reinitialize_waits() {
    let _s = serial();
    let rt = Runtime::start(&pooled(2, 1, &[])).unwrap();
    let started = Arc::new(AtomicBool::new(false));
    let s2 = Arc::clone(&started);
    let parent = rt.submit_to_device(0, move |ctx| {
        s2.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(30));
        // Children sent to every worker (one on another device) while the runtime pauses.
        let children: Vec<_> = ctx
            .runtime()
            .workers()
            .into_iter()
            .map(|w| ctx.runtime().submit_to_worker(w, |ctx| ctx.worker()))
            .collect();
        TaskHandle::wait_all(children).unwrap().len()
    });
    while !started.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    rt.reinitialize(&pooled(2, 1, &[])).unwrap();
    assert_eq!(parent.wait().unwrap(), rt.workers().len());
}

#[test]
fn a_task_waiting_on_a_queued_task_makes_reinitialize_time_out_then_finishes() {
    let _s = serial();
    let rt = Runtime::builder()
        .config(pooled(1, 1, &[]))
        .drain_timeout(Duration::from_millis(300))
        .start()
        .unwrap();
    let (tx, rx) = crossbeam_channel::bounded::<TaskHandle<u32>>(1);
    let started = Arc::new(AtomicBool::new(false));
    let s2 = Arc::clone(&started);
    let waiter = rt.submit(move |_| {
        s2.store(true, Ordering::SeqCst);
        let awaited = rx.recv().unwrap();
        awaited.wait().unwrap() + 1
    });
    while !started.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    // Queued behind the waiter on the only worker: a top-level task.
    let awaited = rt.submit(|_| 41);
    std::thread::scope(|s| {
        let reinit = s.spawn(|| rt.reinitialize(&pooled(1, 1, &[])));
        std::thread::sleep(Duration::from_millis(50));
        tx.send(awaited).unwrap();
        let err = reinit.join().unwrap().unwrap_err();
        assert!(matches!(err, Error::DrainTimeout { .. }), "{err}");
    });
    // Resumed: the waiter runs the awaited task and finishes; the runtime works.
    assert_eq!(waiter.wait_timeout(Duration::from_secs(30)), Ok(42));
    assert_eq!(rt.submit(|_| 5).wait().unwrap(), 5);
    assert_eq!(rt.report().reinitializations, 0);
}

#[test]
fn a_report_right_after_a_reinitialize_shows_the_phase_that_just_ran_and_the_totals() {
    let _s = serial();
    let rt = Runtime::start(&pooled(1, 1, &[])).unwrap();
    let d = rt.devices()[0];
    // Phase 0: 3 × 1 MiB at once.
    rt.submit_to_device(d, |ctx| {
        let held: Vec<DeviceBuffer> = (0..3)
            .map(|_| DeviceBuffer::new(1 << 20, ctx.stream()))
            .collect::<rmm_allocator::Result<_>>()?;
        Ok::<_, rmm_allocator::Error>(held.len())
    })
    .wait()
    .unwrap()
    .unwrap();
    rt.reinitialize(&pooled(1, 1, &[("pool.initial_size", "32MiB".into())]))
        .unwrap();
    let report = rt.report();
    let dev = &report.devices[0];
    assert_eq!(dev.phases.len(), 2, "{:?}", dev.phases);
    let before = dev.phases[0];
    assert_eq!(before.phase, 0);
    assert_eq!(before.peak_bytes, 3 << 20, "{before:?}");
    assert_eq!(before.total_bytes, 3 << 20, "{before:?}");
    assert_eq!(before.total_allocations, 3, "{before:?}");
    assert_eq!(before.peak_allocations, 3, "{before:?}");
    // The new phase starts at zero; the totals carry the one before.
    assert_eq!(dev.phases[1].phase, 1);
    assert_eq!(dev.phases[1].total_bytes, 0);
    assert_eq!(dev.totals.peak_bytes, 3 << 20);
    assert_eq!(dev.totals.total_bytes, 3 << 20);
    // Phase 1: one 2 MiB allocation; the totals add up, the peak is the highest.
    rt.submit_to_device(d, |ctx| {
        DeviceBuffer::new(2 << 20, ctx.stream()).map(|b| b.size())
    })
    .wait()
    .unwrap()
    .unwrap();
    let report = rt.report();
    let dev = &report.devices[0];
    assert_eq!(dev.phases[1].peak_bytes, 2 << 20);
    assert_eq!(dev.totals.total_bytes, 5 << 20);
    assert_eq!(dev.totals.total_allocations, 4);
    assert_eq!(dev.totals.peak_bytes, 3 << 20);
    let text = report.to_string();
    assert!(
        text.contains("phase 0: peak 3.00 MiB (3 allocations)"),
        "{text}"
    );
    assert!(text.contains("all phases: peak 3.00 MiB"), "{text}");
    let json = report.to_json();
    assert!(
        json.contains("\"phases\"") && json.contains("\"totals\""),
        "{json}"
    );
}

#[test]
fn free_memory_is_asked_of_the_device_only_for_a_default_initial_pool_size() {
    let _s = serial();
    let Some(sim) = sim() else {
        common::skip(
            "free_memory_is_asked_of_the_device_only_for_a_default_initial_pool_size",
            "counts driver calls on the simulated device",
        );
        return;
    };
    let queries = || sim.counts(0).unwrap().memory_queries;
    let before = queries();
    let rt = Runtime::start(&pooled(1, 1, &[])).unwrap();
    rt.reinitialize(&config(&[
        ("devices", devices(1).into()),
        ("pool.managed", true.into()),
    ]))
    .unwrap();
    rt.reinitialize(&pooled(1, 1, &[("pool.initial_size", "50%".into())]))
        .unwrap();
    assert_eq!(
        queries(),
        before,
        "sizes given: free memory is not asked for"
    );
    // The default initial size is half the free memory (counting what the old stack gives
    // back), so it is read.
    let report = rt
        .reinitialize(&config(&[
            ("devices", devices(1).into()),
            ("pool.enabled", true.into()),
        ]))
        .unwrap();
    assert!(queries() > before);
    assert_eq!(report.devices, vec![0]);
    let half = (common::SIM_MEMORY as u64 / 2) / 256 * 256;
    assert_eq!(
        rt.stack(0).unwrap().reserved_bytes(),
        half,
        "half of the free memory"
    );
    // Pool to pool: what the old pool holds counts as free, so the new one is as large.
    rt.reinitialize(&config(&[
        ("devices", devices(1).into()),
        ("pool.enabled", true.into()),
        ("tracking.enabled", true.into()),
    ]))
    .unwrap();
    assert_eq!(rt.stack(0).unwrap().reserved_bytes(), half);
    rt.shutdown().unwrap();
}
