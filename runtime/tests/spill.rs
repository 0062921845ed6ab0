//! Spilling: buffers stay under the device limit, data survives spills, unspills and
//! reinitializes (into the new stack), buffers in use are never spilled, failures leave data
//! where it was.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{config, devices, pattern, read_on_device, serial};
use rmm_allocator::StreamView;
use rmm_allocator::spill::SpillableBuffer;
use rmm_runtime::{Error, Runtime};

const MIB: usize = 1 << 20;

fn spilling(more: &[(&str, toml::Value)]) -> rmm_config::Config {
    let mut settings = vec![
        ("devices", toml::Value::from(devices(1))),
        ("workers_per_device", toml::Value::from(2)),
        ("pool.enabled", toml::Value::from(true)),
        ("pool.initial_size", toml::Value::from("256MiB")),
        ("spill.enabled", toml::Value::from(true)),
        ("spill.device_memory_limit", toml::Value::from("64MiB")),
        ("spill.host_pool_size", toml::Value::from("512MiB")),
    ];
    settings.extend(more.iter().cloned());
    config(&settings)
}

#[test]
fn buffers_stay_under_the_limit_and_keep_every_byte() {
    let _s = serial();
    let rt = Runtime::start(&spilling(&[])).unwrap();
    let ok = rt
        .submit(|ctx| {
            let m = ctx.spill_manager().expect("spilling is on");
            let stream = ctx.stream();
            let sizes = [16 * MIB, 3 * MIB, 9 * MIB, MIB + 17, 20 * MIB, 7 * MIB];
            let mut live: Vec<(Arc<SpillableBuffer>, Vec<u8>)> = Vec::new();
            for i in 0..24u64 {
                let data = pattern(sizes[i as usize % sizes.len()], i);
                live.push((m.from_host(&data, stream).unwrap(), data));
                let s = m.statistics();
                assert!(s.tracked_bytes <= s.limit, "{s:?}");
            }
            // Random accesses: every one brings its buffer back with every byte intact.
            let mut x = 7u64;
            for _ in 0..200 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let (b, data) = &live[(x % live.len() as u64) as usize];
                assert!(
                    read_on_device(b, stream) == *data,
                    "buffer {} changed",
                    b.id()
                );
                let s = m.statistics();
                assert!(s.tracked_bytes <= s.limit, "{s:?}");
            }
            for (b, data) in &live {
                assert!(b.to_vec().unwrap() == *data);
            }
            let s = m.statistics();
            assert!(s.spilled_count > 0 && s.unspilled_count > 0, "{s:?}");
            assert!(s.peak_tracked_bytes <= s.limit);
            drop(live);
            let s = m.statistics();
            assert_eq!((s.tracked_bytes, s.host_bytes), (0, 0), "{s:?}");
            true
        })
        .wait()
        .unwrap();
    assert!(ok);
    let report = rt.report();
    assert!(report.devices[0].spill.as_ref().unwrap().spilled_bytes > 0);
    let table = report.to_string();
    assert!(
        table.contains("spill: limit 64.00 MiB") && table.contains("host: holds"),
        "{table}"
    );
}

#[test]
fn live_spillable_data_survives_pool_managed_pool() {
    let _s = serial();
    let rt = Runtime::start(&spilling(&[("spill.device_memory_limit", "1GiB".into())])).unwrap();
    let m = rt.spill_manager(rt.devices()[0]).unwrap();
    let data: Vec<Vec<u8>> = (0..8)
        .map(|i| pattern(5 * MIB + i * 4096, i as u64))
        .collect();
    let buffers: Vec<Arc<SpillableBuffer>> = data
        .iter()
        .map(|d| m.from_host(d, StreamView::DEFAULT).unwrap())
        .collect();
    let phases = [
        spilling(&[
            ("spill.device_memory_limit", "1GiB".into()),
            ("pool.enabled", false.into()),
            ("pool.managed", true.into()),
        ]),
        spilling(&[("spill.device_memory_limit", "1GiB".into())]),
    ];
    for phase in &phases {
        let r = rt.reinitialize(phase).unwrap();
        assert!(r.spilled_bytes > 0, "{r}");
        assert!(buffers.iter().all(|b| b.is_spilled()));
        // Back on first use, into the new stack: it counts them.
        let stack = rt.stack(rt.devices()[0]).unwrap();
        for (b, d) in buffers.iter().zip(&data) {
            assert!(read_on_device(b, StreamView::DEFAULT) == *d);
        }
        assert_eq!(stack.live().count, buffers.len() as u64);
        assert_eq!(
            m.statistics().tracked_bytes,
            stack.live().bytes,
            "tracked bytes agree with the stack's statistics"
        );
    }
}

#[test]
fn eager_unspill_brings_data_back_at_once() {
    let _s = serial();
    let cfg = spilling(&[
        ("spill.device_memory_limit", "1GiB".into()),
        ("spill.eager_unspill", true.into()),
    ]);
    let rt = Runtime::start(&cfg).unwrap();
    let m = rt.spill_manager(rt.devices()[0]).unwrap();
    let d = pattern(3 * MIB, 9);
    let b = m.from_host(&d, StreamView::DEFAULT).unwrap();
    // Spilled before: it comes back at once. On the device: it stays there (pool → pool).
    let e = pattern(2 * MIB, 10);
    let c = m.from_host(&e, StreamView::DEFAULT).unwrap();
    c.spill().unwrap();
    let r = rt.reinitialize(&cfg).unwrap();
    assert_eq!(r.unspilled_bytes, 2 * MIB as u64, "{r}");
    assert_eq!(r.kept_in_place_bytes, 3 * MIB as u64, "{r}");
    assert!(!b.is_spilled() && !c.is_spilled());
    assert!(b.to_vec().unwrap() == d);
    assert!(c.to_vec().unwrap() == e);
}

#[test]
fn a_buffer_in_use_is_not_spilled_and_blocks_reinitialize() {
    let _s = serial();
    let rt = Runtime::start(&spilling(&[])).unwrap();
    let m = rt.spill_manager(rt.devices()[0]).unwrap();
    let b = m.from_host(&pattern(MIB, 1), StreamView::DEFAULT).unwrap();
    let guard = b.device_view(StreamView::DEFAULT).unwrap();
    assert_eq!(b.spill().unwrap(), 0);
    assert_eq!(rt.spill_all(rt.devices()[0]).unwrap(), 0);
    let err = rt.reinitialize(&spilling(&[])).unwrap_err();
    assert!(matches!(err, Error::LiveAllocations(_)), "{err}");
    drop(guard);
    rt.reinitialize(&spilling(&[])).unwrap();
    assert!(b.to_vec().unwrap() == pattern(MIB, 1));
}

#[test]
fn a_full_host_pool_leaves_the_buffer_on_the_device() {
    let _s = serial();
    let rt = Runtime::start(&spilling(&[("spill.host_pool_size", "4MiB".into())])).unwrap();
    let m = rt.spill_manager(rt.devices()[0]).unwrap();
    let data = pattern(8 * MIB, 3);
    let b = m.from_host(&data, StreamView::DEFAULT).unwrap();
    let err = b.spill().unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert!(!b.is_spilled());
    assert!(b.to_vec().unwrap() == data);
    assert_eq!(
        m.statistics().host_bytes,
        0,
        "nothing leaked in the host pool"
    );
}

#[test]
fn eight_workers_share_buffers_while_the_manager_spills() {
    let _s = serial();
    let rt = Runtime::start(&spilling(&[("workers_per_device", 8.into())])).unwrap();
    let m = rt.spill_manager(rt.devices()[0]).unwrap();
    let data: Arc<Vec<Vec<u8>>> = Arc::new((0..16).map(|i| pattern(6 * MIB, i)).collect());
    let buffers: Arc<Vec<Arc<SpillableBuffer>>> = Arc::new(
        data.iter()
            .map(|d| m.from_host(d, StreamView::DEFAULT).unwrap())
            .collect(),
    );
    let handles = rt.run_on_all(move |ctx| {
        let mut x = u64::from(ctx.worker().index) + 1;
        for _ in 0..60 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x % buffers.len() as u64) as usize;
            let got = read_on_device(&buffers[i], ctx.stream());
            assert!(got == data[i], "buffer {i} changed");
        }
    });
    for h in handles {
        h.wait_timeout(Duration::from_secs(120)).unwrap();
    }
    let s = m.statistics();
    assert!(s.spilled_count > 0, "{s:?}");
}

#[test]
fn an_allocation_that_runs_out_of_memory_spills_and_retries() {
    let _s = serial();
    // The pool cannot grow past 128 MiB; the spill limit alone would never spill.
    let rt = Runtime::start(&spilling(&[
        ("pool.initial_size", "128MiB".into()),
        ("pool.maximum_size", "128MiB".into()),
        ("spill.device_memory_limit", "1GiB".into()),
    ]))
    .unwrap();
    let d = rt.devices()[0];
    assert!(
        rt.stack(d)
            .unwrap()
            .describe()
            .contains("FailureCallbackResourceAdaptor > PoolMemoryResource"),
        "{}",
        rt.stack(d).unwrap().describe()
    );
    let m = rt.spill_manager(d).unwrap();
    let data: Vec<Vec<u8>> = (0..6).map(|i| pattern(16 * MIB, i)).collect();
    let buffers: Vec<_> = data
        .iter()
        .map(|x| m.from_host(x, StreamView::DEFAULT).unwrap())
        .collect();
    assert_eq!(m.statistics().spilled_count, 0);
    // 64 MiB more than the pool has left: the stack spills and retries.
    let big = rt
        .submit_to_device(d, |ctx| {
            rmm_allocator::DeviceBuffer::new(64 * MIB, ctx.stream()).map(|b| b.size())
        })
        .wait()
        .unwrap()
        .unwrap();
    assert_eq!(big, 64 * MIB);
    assert!(m.statistics().spilled_count > 0, "{:?}", m.statistics());
    for (b, x) in buffers.iter().zip(&data) {
        assert!(read_on_device(b, StreamView::DEFAULT) == *x);
    }
}

/// What spilling every buffer made of `data` showed while the buffers' stream was held back.
struct HeldSpill {
    /// Host bytes taken by copies enqueued once `spill_all` stopped enqueueing (or
    /// `expected` was reached).
    in_flight: usize,
    /// Buffers whose spill ended behind the held stream (none can).
    spilled_while_held: u64,
    /// Device bytes `spill_all` freed once the stream ran.
    freed: u64,
}

/// Makes spillable buffers of `data` on a stream of their own, uses each there, holds the
/// stream back and spills them all from another thread; records the host memory taken once
/// `expected` bytes are (or after 10 s), then lets the stream go. Checks every buffer was
/// spilled with its bytes. `None` (skipped, said on stderr) on a GPU.
fn spill_all_behind_a_held_stream(data: &[Vec<u8>], expected: usize) -> Option<HeldSpill> {
    let Some(sim) = common::sim() else {
        eprintln!("SKIPPED: holding a stream back needs the simulated device (RMM_BACKEND=cuda)");
        return None;
    };
    let rt = Runtime::start(&spilling(&[("spill.device_memory_limit", "1GiB".into())])).unwrap();
    let d = rt.devices()[0];
    let m = rt.spill_manager(d).unwrap();
    let stream = rmm_allocator::backend::Backend::stream_create(sim, d).unwrap();
    let view = StreamView::from_raw(stream);
    let buffers: Vec<_> = data.iter().map(|x| m.from_host(x, view).unwrap()).collect();
    // Work that uses every buffer is queued on their stream, held back: the copies are
    // ordered after it, so none can run.
    let guards: Vec<_> = buffers
        .iter()
        .map(|b| b.device_view(view).unwrap())
        .collect();
    let gate = sim.hold_stream(d, stream).unwrap();
    drop(guards);
    let spiller = {
        let m = Arc::clone(&m);
        std::thread::spawn(move || m.spill_all())
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while (m.statistics().host_bytes as usize) < expected && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    // Long enough for a spill that would go on enqueueing to show it.
    std::thread::sleep(Duration::from_millis(50));
    let in_flight = m.statistics().host_bytes as usize;
    let spilled_while_held = m.statistics().spilled_count;
    gate.open();
    let freed = spiller.join().unwrap().unwrap();
    for (b, x) in buffers.iter().zip(data) {
        assert!(b.is_spilled());
        assert!(b.to_vec().unwrap() == *x, "buffer {} changed", b.id());
    }
    drop(buffers);
    rmm_allocator::backend::Backend::stream_destroy(sim, d, stream).unwrap();
    Some(HeldSpill {
        in_flight,
        spilled_while_held,
        freed,
    })
}

#[test]
fn making_room_has_the_copies_of_many_buffers_in_flight_at_once() {
    let _s = serial();
    let data: Vec<Vec<u8>> = (0..12)
        .map(|i| pattern(2 * MIB + 4096 * i, i as u64))
        .collect();
    let total: usize = data.iter().map(Vec::len).sum();
    let Some(held) = spill_all_behind_a_held_stream(&data, total) else {
        return;
    };
    // One buffer at a time would take host memory for the first and wait for its copy;
    // batched, every buffer's copy is enqueued (its host memory taken) before any wait.
    assert_eq!(
        held.spilled_while_held, 0,
        "a spill ended behind a held stream"
    );
    assert_eq!(
        held.in_flight, total,
        "host memory taken while the stream was held"
    );
    assert_eq!(held.freed as usize, total);
}

#[test]
fn making_room_enqueues_at_most_a_batch_of_copies_at_once() {
    let _s = serial();
    let data: Vec<Vec<u8>> = (0..80u8).map(|i| vec![i; MIB]).collect();
    // Copies are enqueued for 64 buffers, and then the oldest is waited for: a task's own
    // copy queues behind at most that many, not behind all 80.
    let bound = 64 * MIB;
    let Some(held) = spill_all_behind_a_held_stream(&data, bound) else {
        return;
    };
    assert_eq!(
        held.in_flight, bound,
        "bytes of copies enqueued at once behind a held stream"
    );
    assert_eq!(held.freed as usize, 80 * MIB);
}

/// A runtime spilling on the simulated device, a stream of its own, and a spillable buffer of
/// 4 MiB of pattern `seed` used once through a device guard on that stream (the guard let
/// go): (runtime, device, stream, data, buffer).
fn used_once_on_a_stream(
    sim: &'static rmm_allocator::backend::SimBackend,
    seed: u64,
) -> (
    Runtime,
    u32,
    rmm_allocator::backend::RawStream,
    Vec<u8>,
    Arc<SpillableBuffer>,
) {
    let rt = Runtime::start(&spilling(&[("spill.device_memory_limit", "1GiB".into())])).unwrap();
    let d = rt.devices()[0];
    let m = rt.spill_manager(d).unwrap();
    let stream = rmm_allocator::backend::Backend::stream_create(sim, d).unwrap();
    let view = StreamView::from_raw(stream);
    let data = pattern(4 * MIB, seed);
    let b = m.buffer(data.len(), view).unwrap();
    {
        let g = b.device_view(view).unwrap();
        b.device().copy_to_device(g.ptr(), &data).unwrap();
    }
    (rt, d, stream, data, b)
}

#[test]
fn a_spill_waits_for_the_work_that_used_the_buffer_not_for_what_its_stream_does_next() {
    let _s = serial();
    let Some(sim) = common::sim() else {
        eprintln!("SKIPPED: holding a stream back needs the simulated device (RMM_BACKEND=cuda)");
        return;
    };
    let (_rt, d, stream, data, b) = used_once_on_a_stream(sim, 11);
    // The stream goes on to other work (a worker's next task), held back here: the spill
    // need not wait for it, only for the work queued while the guard lived.
    let gate = sim.hold_stream(d, stream).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let spiller = {
        let b = Arc::clone(&b);
        std::thread::spawn(move || {
            let r = b.spill();
            tx.send(()).unwrap();
            r
        })
    };
    let done = rx.recv_timeout(Duration::from_secs(5));
    gate.open();
    let freed = spiller.join().unwrap().unwrap();
    assert!(
        done.is_ok(),
        "the spill waited for work queued on the stream after the buffer's last use"
    );
    assert_eq!(freed, 4 * MIB);
    assert!(b.to_vec().unwrap() == data);
    drop(b);
    rmm_allocator::backend::Backend::stream_destroy(sim, d, stream).unwrap();
}

#[test]
fn a_spill_still_waits_for_the_work_queued_while_the_buffer_was_in_use() {
    let _s = serial();
    let Some(sim) = common::sim() else {
        eprintln!("SKIPPED: holding a stream back needs the simulated device (RMM_BACKEND=cuda)");
        return;
    };
    let (_rt, d, stream, data, b) = used_once_on_a_stream(sim, 12);
    let view = StreamView::from_raw(stream);
    // Work that uses the buffer is queued (held back) while a guard lives; then it lets go.
    let guard = b.device_view(view).unwrap();
    let gate = sim.hold_stream(d, stream).unwrap();
    drop(guard);
    spill_waits_for_the_gate(&b, gate, &data, "work that used it");
    drop(b);
    rmm_allocator::backend::Backend::stream_destroy(sim, d, stream).unwrap();
}

#[test]
fn keeping_to_the_limit_spills_a_slack_beyond_the_excess() {
    let _s = serial();
    let rt = Runtime::start(&spilling(&[])).unwrap();
    let m = rt.spill_manager(rt.devices()[0]).expect("spilling is on");
    let stream = StreamView::DEFAULT;
    // 64 MiB of 1 MiB buffers: exactly at the 64 MiB limit, nothing spilled.
    let mut live: Vec<Arc<SpillableBuffer>> = (0..64)
        .map(|i| m.from_host(&pattern(MIB, i), stream).unwrap())
        .collect();
    let s = m.statistics();
    assert_eq!((s.tracked_bytes, s.spilled_count), (64 * MIB as u64, 0));
    // One more is 1 MiB over: the excess goes and 1/32 of the limit (2 MiB) with it, so that
    // the next two new buffers do not each stop for a spill.
    live.push(m.from_host(&pattern(MIB, 64), stream).unwrap());
    let s = m.statistics();
    assert_eq!(s.spilled_count, 3, "{s:?}");
    assert_eq!(s.tracked_bytes, 62 * MIB as u64);
    for i in 65..67 {
        live.push(m.from_host(&pattern(MIB, i), stream).unwrap());
    }
    assert_eq!(m.statistics().spilled_count, 3, "no spill for the next two");
    for (i, b) in live.iter().enumerate() {
        assert!(
            read_on_device(b, stream) == pattern(MIB, i as u64),
            "buffer {i}"
        );
    }
}

#[test]
fn making_room_in_the_background_spills_the_excess_only() {
    let _s = serial();
    let rt = Runtime::start(&spilling(&[])).unwrap();
    let m = rt.spill_manager(rt.devices()[0]).expect("spilling is on");
    // A Dask worker's store: room is made by the manager's thread, which takes many values'
    // requests at once already, so it spills no slack.
    m.make_room_in_background(true);
    let stream = StreamView::DEFAULT;
    let live: Vec<Arc<SpillableBuffer>> = (0..65)
        .map(|i| m.from_host(&pattern(MIB, i), stream).unwrap())
        .collect();
    m.settle();
    let s = m.statistics();
    assert_eq!(
        (s.spilled_count, s.tracked_bytes),
        (1, 64 * MIB as u64),
        "{s:?}"
    );
    drop(live);
}

#[test]
fn a_spill_waits_for_every_threads_per_thread_stream_that_used_the_buffer() {
    // The per-thread default stream is one handle for each thread's own stream: one thread
    // letting go on it must not stand for another thread's use.
    let _s = serial();
    let Some((sim, _rt, d, b, data)) = per_thread_buffer(13) else {
        return;
    };
    let ptds = StreamView::PER_THREAD;
    // Thread A uses it with work queued (held back) on its stream, then lets go.
    let gate = {
        let b = Arc::clone(&b);
        std::thread::spawn(move || {
            let guard = b.device_view(ptds).unwrap();
            let gate = sim.hold_stream(d, ptds.raw()).unwrap();
            drop(guard);
            gate
        })
        .join()
        .unwrap()
    };
    // Thread B uses it too, its stream idle.
    {
        let b = Arc::clone(&b);
        std::thread::spawn(move || drop(b.device_view(ptds).unwrap()))
            .join()
            .unwrap();
    }
    spill_waits_for_the_gate(&b, gate, &data, "thread A's work that used it");
}

#[test]
fn a_spill_to_a_kept_copy_waits_for_the_per_thread_stream_that_used_the_data() {
    // Data with a kept host copy goes without a copy: its device memory is freed. Thread A
    // queued work on its own per-thread stream, and thread B let go of the view A used (as a
    // Python object is dropped on whichever thread): B's stream does not stand for A's.
    let _s = serial();
    let Some((sim, _rt, d, b, data)) = per_thread_buffer(14) else {
        return;
    };
    let ptds = StreamView::PER_THREAD;
    // Read-only and spilled once, then back: its host copy is kept.
    b.set_read_only();
    assert_eq!(b.spill().unwrap(), 4 * MIB);
    drop(b.device_view(ptds).unwrap());
    let (guard, gate) = {
        let b = Arc::clone(&b);
        std::thread::spawn(move || {
            let guard = b.shared_device_view(ptds).unwrap();
            let gate = sim.hold_stream(d, ptds.raw()).unwrap();
            (guard, gate)
        })
        .join()
        .unwrap()
    };
    std::thread::spawn(move || drop(guard)).join().unwrap();
    spill_waits_for_the_gate(&b, gate, &data, "thread A's work on its stream");
}

/// What [`per_thread_buffer`] makes: (simulator, runtime, device, buffer, its data).
type PerThreadBuffer = (
    &'static rmm_allocator::backend::SimBackend,
    Runtime,
    u32,
    Arc<SpillableBuffer>,
    Vec<u8>,
);

/// A runtime spilling on the simulated device and a 4 MiB buffer of `pattern(4 MiB, seed)` on
/// the per-thread default stream: (simulator, runtime, device, buffer, data); `None`, saying
/// so, on a GPU (a stream is held back on the simulated device only).
fn per_thread_buffer(seed: u64) -> Option<PerThreadBuffer> {
    let Some(sim) = common::sim() else {
        eprintln!("SKIPPED: holding a stream back needs the simulated device (RMM_BACKEND=cuda)");
        return None;
    };
    let rt = Runtime::start(&spilling(&[("spill.device_memory_limit", "1GiB".into())])).unwrap();
    let d = rt.devices()[0];
    let ptds = StreamView::PER_THREAD;
    let data = pattern(4 * MIB, seed);
    let b = rt
        .spill_manager(d)
        .unwrap()
        .buffer(data.len(), ptds)
        .unwrap();
    {
        let g = b.device_view(ptds).unwrap();
        b.device().copy_to_device(g.ptr(), &data).unwrap();
    }
    Some((sim, rt, d, b, data))
}

/// Spills the 4 MiB buffer `b` on another thread: the spill must wait while `gate` holds back
/// `work` (work queued while `b` was in use), and once it opens, spill and keep `data`.
fn spill_waits_for_the_gate(
    b: &Arc<SpillableBuffer>,
    gate: rmm_allocator::backend::StreamGate,
    data: &[u8],
    work: &str,
) {
    let spiller = {
        let b = Arc::clone(b);
        std::thread::spawn(move || b.spill())
    };
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !spiller.is_finished(),
        "the spill copied the data while {work} was still queued"
    );
    gate.open();
    assert_eq!(spiller.join().unwrap().unwrap(), 4 * MIB);
    assert!(b.to_vec().unwrap() == data);
}
