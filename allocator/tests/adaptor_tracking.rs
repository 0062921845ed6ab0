//! TrackingResourceAdaptor: outstanding allocations with size, stream, thread and backtrace;
//! leak reports.

mod common;

use std::sync::Arc;

use common::{MIB, device};
use rmm_allocator::adaptor::TrackingResourceAdaptor;
use rmm_allocator::backend::DevicePtr;
use rmm_allocator::resource::CudaMemoryResource;
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::SharedResource;
use rmm_allocator::{Stream, StreamView};

fn cuda() -> SharedResource {
    Arc::new(CudaMemoryResource::new(device()))
}

#[test]
fn records_outstanding_allocations_until_freed() {
    let t = TrackingResourceAdaptor::new(cuda());
    let stream = Stream::new(device()).unwrap();
    let a = t.allocate(MIB, StreamView::DEFAULT).unwrap();
    let b = t.allocate(1000, stream.view()).unwrap();
    assert_eq!(t.outstanding_count(), 2);
    assert_eq!(t.outstanding_bytes(), MIB + 1000);
    let recs = t.outstanding();
    let rb = recs.iter().find(|r| r.ptr == b).unwrap();
    assert_eq!(rb.size, 1000);
    assert_eq!(rb.stream, stream.view());
    assert_eq!(rb.thread.id(), std::thread::current().id());
    assert!(rb.backtrace.is_none());
    t.deallocate(a, MIB, StreamView::DEFAULT).unwrap();
    let report = t.leak_report();
    assert_eq!(report.allocations.len(), 1);
    assert_eq!(report.bytes, 1000);
    assert_eq!(report.device, 0);
    let text = report.to_string();
    assert!(
        text.contains("1 allocation(s) of 1000 B outstanding"),
        "{text}"
    );
    assert!(text.contains(&b.to_string()), "{text}");
    assert!(
        text.contains(&format!("{:#x}", stream.view().raw())),
        "{text}"
    );
    t.deallocate(b, 1000, stream.view()).unwrap();
    stream.synchronize().unwrap();
    assert!(t.leak_report().is_empty());
    assert_eq!(t.outstanding_bytes(), 0);
    assert!(
        t.leak_report()
            .to_string()
            .contains("no allocations outstanding")
    );
}

#[test]
fn backtraces_point_at_the_allocation() {
    let t = TrackingResourceAdaptor::with_backtraces(cuda());
    let p = t.allocate(4096, StreamView::DEFAULT).unwrap();
    let rec = t.outstanding().pop().unwrap();
    let bt = rec.backtrace.expect("backtrace captured").to_string();
    assert!(!bt.is_empty());
    let text = t.leak_report().to_string();
    assert!(text.contains("allocated at"), "{text}");
    t.set_capture_backtraces(false);
    let q = t.allocate(4096, StreamView::DEFAULT).unwrap();
    assert!(
        t.outstanding()
            .iter()
            .find(|r| r.ptr == q)
            .unwrap()
            .backtrace
            .is_none()
    );
    t.deallocate(p, 4096, StreamView::DEFAULT).unwrap();
    t.deallocate(q, 4096, StreamView::DEFAULT).unwrap();
}

#[test]
fn thread_names_and_leaks_at_drop() {
    let t = Arc::new(TrackingResourceAdaptor::new(cuda()));
    let t2 = Arc::clone(&t);
    let p = std::thread::Builder::new()
        .name("worker-7".into())
        .spawn(move || t2.allocate(2048, StreamView::DEFAULT).unwrap())
        .unwrap()
        .join()
        .unwrap();
    let text = t.leak_report().to_string();
    assert!(text.contains("worker-7"), "{text}");
    // Dropping with an allocation outstanding logs the report (and does not panic). Free the
    // memory through the upstream afterwards so the device is left clean.
    let upstream = Arc::clone(TrackingResourceAdaptor::upstream(&t));
    drop(t);
    upstream.deallocate(p, 2048, StreamView::DEFAULT).unwrap();
}

#[test]
fn many_threads() {
    let t = Arc::new(TrackingResourceAdaptor::new(cuda()));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let t = Arc::clone(&t);
            std::thread::spawn(move || {
                let mut v = Vec::new();
                for i in 0..200 {
                    v.push(t.allocate(256 * (i % 7 + 1), StreamView::DEFAULT).unwrap());
                }
                for (i, p) in v.into_iter().enumerate() {
                    if i % 2 == 0 {
                        t.deallocate(p, 256 * (i % 7 + 1), StreamView::DEFAULT)
                            .unwrap();
                    } else {
                        // Leave odd ones for the main thread.
                        return_later(p, 256 * (i % 7 + 1));
                    }
                }
                LATER.with(|l| l.take())
            })
        })
        .collect();
    let mut later = Vec::new();
    for h in handles {
        later.extend(h.join().unwrap());
    }
    assert_eq!(t.outstanding_count(), later.len());
    assert_eq!(
        t.outstanding_bytes(),
        later.iter().map(|x| x.1).sum::<usize>()
    );
    for (p, b) in later {
        t.deallocate(p, b, StreamView::DEFAULT).unwrap();
    }
    assert_eq!(t.outstanding_count(), 0);
}

thread_local! {
    static LATER: std::cell::RefCell<Vec<(rmm_allocator::backend::DevicePtr, usize)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

fn return_later(p: rmm_allocator::backend::DevicePtr, b: usize) {
    LATER.with(|l| l.borrow_mut().push((p, b)));
}

/// A resource that hands out distinct fake pointers (no memory): many allocations, fast.
#[derive(Debug)]
struct Fake(std::sync::atomic::AtomicU64);

impl DeviceMemoryResource for Fake {
    fn allocate(&self, _: usize, _: StreamView) -> rmm_allocator::Result<DevicePtr> {
        Ok(DevicePtr(
            self.0.fetch_add(256, std::sync::atomic::Ordering::Relaxed),
        ))
    }
    fn deallocate(&self, _: DevicePtr, _: usize, _: StreamView) -> rmm_allocator::Result<()> {
        Ok(())
    }
    fn device(&self) -> rmm_allocator::Device {
        device()
    }
    fn name(&self) -> &'static str {
        "Fake"
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

fn fake() -> SharedResource {
    Arc::new(Fake(std::sync::atomic::AtomicU64::new(1 << 20)))
}

/// 8 named threads allocate on their own streams, free some of their blocks, hand others to
/// the next thread, which frees them: at each barrier every outstanding allocation is
/// reported exactly once, with its size, stream and allocating thread, and the leak report
/// adds up.
#[test]
fn eight_threads_every_outstanding_allocation_reported_once_with_cross_thread_frees() {
    use std::collections::HashMap;
    use std::sync::{Barrier, Mutex};
    const THREADS: usize = 8;
    const EACH: usize = 500;
    let t = Arc::new(TrackingResourceAdaptor::new(fake()));
    let streams: Vec<Stream> = (0..THREADS)
        .map(|_| Stream::new(device()).unwrap())
        .collect();
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    // (owner thread, ptr, size) of what each thread hands to the next.
    type Blocks = Vec<(DevicePtr, usize)>;
    let handed: Arc<Mutex<Vec<Blocks>>> = Arc::new(Mutex::new(vec![Vec::new(); THREADS]));
    // What each thread still holds after phase 1, as (ptr, size, stream, thread index).
    type Held = (DevicePtr, usize, StreamView, usize);
    let expected: Arc<Mutex<Vec<Held>>> = Arc::new(Mutex::new(Vec::new()));
    let handles: Vec<_> = (0..THREADS)
        .map(|i| {
            let (t, barrier, handed, expected) = (
                Arc::clone(&t),
                Arc::clone(&barrier),
                Arc::clone(&handed),
                Arc::clone(&expected),
            );
            let stream = streams[i].view();
            std::thread::Builder::new()
                .name(format!("tracker-{i}"))
                .spawn(move || {
                    let mut mine = Vec::new();
                    for k in 0..EACH {
                        let size = 256 * (1 + (k * 31 + i * 7) % 97);
                        let p = t.allocate(size, stream).unwrap();
                        match k % 3 {
                            0 => t.deallocate(p, size, stream).unwrap(),
                            1 => mine.push((p, size)),
                            _ => handed.lock().unwrap()[(i + 1) % THREADS].push((p, size)),
                        }
                    }
                    expected
                        .lock()
                        .unwrap()
                        .extend(mine.iter().map(|&(p, s)| (p, s, stream, i)));
                    barrier.wait(); // phase 1 done: the main thread checks
                    barrier.wait();
                    // Free what the previous thread handed over, and half of our own.
                    let theirs = std::mem::take(&mut handed.lock().unwrap()[i]);
                    for (p, s) in theirs {
                        t.deallocate(p, s, stream).unwrap();
                    }
                    let keep = mine.split_off(mine.len() / 2);
                    for (p, s) in mine {
                        t.deallocate(p, s, stream).unwrap();
                    }
                    barrier.wait(); // phase 2 done
                    barrier.wait();
                    keep
                })
                .unwrap()
        })
        .collect();
    let check = |want: &[(DevicePtr, usize, StreamView, String)]| {
        let recs = t.outstanding();
        assert_eq!(recs.len(), want.len());
        assert_eq!(t.outstanding_count(), want.len());
        let by_ptr: HashMap<DevicePtr, &(DevicePtr, usize, StreamView, String)> =
            want.iter().map(|w| (w.0, w)).collect();
        let mut seen = std::collections::HashSet::new();
        for r in &recs {
            assert!(seen.insert(r.ptr), "{} reported twice", r.ptr);
            let w = by_ptr
                .get(&r.ptr)
                .unwrap_or_else(|| panic!("{} not expected", r.ptr));
            assert_eq!(r.size, w.1);
            assert_eq!(r.stream, w.2);
            assert_eq!(r.thread.name(), Some(w.3.as_str()));
            assert!(r.at.elapsed() < std::time::Duration::from_secs(60));
        }
        assert!(
            recs.windows(2).all(|w| w[0].ptr < w[1].ptr),
            "sorted by address"
        );
        let bytes: usize = want.iter().map(|w| w.1).sum();
        assert_eq!(t.outstanding_bytes(), bytes);
        let report = t.leak_report();
        assert_eq!(
            (report.allocations.len(), report.bytes),
            (want.len(), bytes)
        );
        let text = report.to_string();
        if !want.is_empty() {
            let head = format!("{} allocation(s) of", want.len());
            assert!(text.contains(&head), "{text}");
        }
    };
    barrier.wait();
    // Phase 1: each thread's kept blocks and the handed ones (allocated by the hander).
    let mut want: Vec<(DevicePtr, usize, StreamView, String)> = expected
        .lock()
        .unwrap()
        .iter()
        .map(|&(p, s, st, i)| (p, s, st, format!("tracker-{i}")))
        .collect();
    for (to, blocks) in handed.lock().unwrap().iter().enumerate() {
        let from = (to + THREADS - 1) % THREADS;
        want.extend(
            blocks
                .iter()
                .map(|&(p, s)| (p, s, streams[from].view(), format!("tracker-{from}"))),
        );
    }
    assert_eq!(want.len(), THREADS * (EACH / 3 + EACH / 3 + 1));
    check(&want);
    barrier.wait();
    barrier.wait();
    // Phase 2: only the halves the threads keep.
    let mut kept_by_thread = Vec::new();
    barrier.wait();
    for h in handles {
        kept_by_thread.push(h.join().unwrap());
    }
    let views: Vec<StreamView> = streams.iter().map(Stream::view).collect();
    let want: Vec<_> = kept_by_thread
        .iter()
        .enumerate()
        .flat_map(|(i, keep)| {
            let view = views[i];
            keep.iter()
                .map(move |&(p, s)| (p, s, view, format!("tracker-{i}")))
        })
        .collect();
    // The threads have exited: their records still name them.
    check(&want);
    for (i, keep) in kept_by_thread.into_iter().enumerate() {
        for (p, s) in keep {
            t.deallocate(p, s, streams[i].view()).unwrap();
        }
    }
    check(&[]);
    assert!(t.leak_report().is_empty());
}

/// Many short-lived threads come and go (the adaptor's thread table is pruned of exited
/// threads that own nothing); allocations of exited threads that are still outstanding keep
/// naming their thread.
#[test]
fn short_lived_threads_keep_their_names_on_outstanding_allocations() {
    let t = Arc::new(TrackingResourceAdaptor::new(fake()));
    let mut kept = Vec::new();
    for i in 0..400 {
        let t2 = Arc::clone(&t);
        let p = std::thread::Builder::new()
            .name(format!("short-{i}"))
            .spawn(move || {
                let p = t2.allocate(512, StreamView::DEFAULT).unwrap();
                let q = t2.allocate(256, StreamView::DEFAULT).unwrap();
                t2.deallocate(q, 256, StreamView::DEFAULT).unwrap();
                p
            })
            .unwrap()
            .join()
            .unwrap();
        if i % 10 == 0 {
            kept.push((p, format!("short-{i}")));
        } else {
            t.deallocate(p, 512, StreamView::DEFAULT).unwrap();
        }
    }
    let recs = t.outstanding();
    assert_eq!(recs.len(), kept.len());
    for (p, name) in &kept {
        let r = recs.iter().find(|r| r.ptr == *p).unwrap();
        assert_eq!(r.thread.name(), Some(name.as_str()));
    }
    for (p, _) in kept {
        t.deallocate(p, 512, StreamView::DEFAULT).unwrap();
    }
    assert_eq!(t.outstanding_count(), 0);
    assert_eq!(t.outstanding_bytes(), 0);
}

/// A record's time is when it was allocated (to the coarse clock's tick).
#[test]
fn records_carry_their_allocation_time() {
    let t = TrackingResourceAdaptor::new(fake());
    let a = t.allocate(256, StreamView::DEFAULT).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let b = t.allocate(256, StreamView::DEFAULT).unwrap();
    let recs = t.outstanding();
    let at = |p| recs.iter().find(|r| r.ptr == p).unwrap().at;
    // The clock moves in ticks of a few ms (and its thread may be scheduled late under load).
    let gap = at(b).duration_since(at(a));
    assert!(
        gap >= std::time::Duration::from_millis(100) && gap < std::time::Duration::from_secs(30),
        "{gap:?}"
    );
    assert!(at(a).elapsed() >= std::time::Duration::from_millis(150));
    let text = t.leak_report().to_string();
    assert!(text.contains(" s ago"), "{text}");
    t.deallocate(a, 256, StreamView::DEFAULT).unwrap();
    t.deallocate(b, 256, StreamView::DEFAULT).unwrap();
}

/// An allocation made while the thread's thread-locals are torn down is still recorded with
/// its thread.
#[test]
fn allocations_during_thread_teardown_are_recorded() {
    struct AtExit(Arc<TrackingResourceAdaptor>);
    impl Drop for AtExit {
        fn drop(&mut self) {
            let _ = self.0.allocate(4096, StreamView::DEFAULT);
        }
    }
    thread_local! {
        static GUARD: std::cell::RefCell<Option<AtExit>> = const { std::cell::RefCell::new(None) };
    }
    let t = Arc::new(TrackingResourceAdaptor::new(fake()));
    let t2 = Arc::clone(&t);
    std::thread::Builder::new()
        .name("teardown".into())
        .spawn(move || {
            // The guard's thread-local first, then the adaptor's (thread-locals are usually
            // torn down in reverse order: the guard then allocates after the adaptor's
            // registration is gone).
            GUARD.with(|g| *g.borrow_mut() = Some(AtExit(Arc::clone(&t2))));
            let p = t2.allocate(256, StreamView::DEFAULT).unwrap();
            t2.deallocate(p, 256, StreamView::DEFAULT).unwrap();
        })
        .unwrap()
        .join()
        .unwrap();
    let recs = t.outstanding();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].size, 4096);
    assert_eq!(recs[0].thread.name(), Some("teardown"));
    t.deallocate(recs[0].ptr, 4096, StreamView::DEFAULT)
        .unwrap();
}
