//! TrackingResourceAdaptor: outstanding allocations with size, stream, thread and backtrace;
//! leak reports.

mod common;

use std::sync::Arc;

use common::{MIB, device};
use rmm_allocator::adaptor::TrackingResourceAdaptor;
use rmm_allocator::per_device::SharedResource;
use rmm_allocator::resource::CudaMemoryResource;
use rmm_allocator::{DeviceMemoryResource, Stream, StreamView};

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
    let upstream = Arc::clone(t.upstream());
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
    static LATER: std::cell::RefCell<Vec<(rmm_allocator::DevicePtr, usize)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

fn return_later(p: rmm_allocator::DevicePtr, b: usize) {
    LATER.with(|l| l.borrow_mut().push((p, b)));
}
