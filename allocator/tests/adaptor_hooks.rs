//! Memory hooks (CuPy's MemoryHook): the order and fields of events when the pool serves from
//! its cache and when it grows, thread and process registration, the hooked adaptor, the
//! tracing and line-profile hooks.

mod common;

use std::sync::{Arc, Mutex};

use common::{MIB, device};
use rmm_allocator::StreamView;
use rmm_allocator::adaptor::HookedResourceAdaptor;
use rmm_allocator::adaptor::hooks::{
    self, HookEvent, HookPoint, LineProfileHook, MemoryHook, TracingHook,
};
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::SharedResource;
use rmm_allocator::resource::{CudaMemoryResource, PoolMemoryResource};

const S: StreamView = StreamView::DEFAULT;

#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<HookEvent>>,
}

impl Recorder {
    fn take(&self) -> Vec<HookEvent> {
        std::mem::take(&mut *self.events.lock().unwrap())
    }
    fn push(&self, e: &HookEvent) {
        self.events.lock().unwrap().push(*e);
    }
}

impl MemoryHook for Recorder {
    fn alloc_preprocess(&self, e: &HookEvent) {
        self.push(e)
    }
    fn alloc_postprocess(&self, e: &HookEvent) {
        self.push(e)
    }
    fn malloc_preprocess(&self, e: &HookEvent) {
        self.push(e)
    }
    fn malloc_postprocess(&self, e: &HookEvent) {
        self.push(e)
    }
    fn free_preprocess(&self, e: &HookEvent) {
        self.push(e)
    }
    fn free_postprocess(&self, e: &HookEvent) {
        self.push(e)
    }
}

fn points(events: &[HookEvent]) -> Vec<HookPoint> {
    events.iter().map(|e| e.point).collect()
}

fn cuda() -> SharedResource {
    Arc::new(CudaMemoryResource::new(device()))
}

fn empty_pool() -> Arc<PoolMemoryResource> {
    Arc::new(
        PoolMemoryResource::builder(cuda())
            .initial_size(0)
            .maximum_size((256 * MIB) as u64)
            .build()
            .unwrap(),
    )
}

#[test]
fn pool_growing_then_serving_then_freeing() {
    use HookPoint::*;
    let pool = empty_pool();
    let rec = Arc::new(Recorder::default());
    let _guard = hooks::register_thread_hook(rec.clone());
    let id = hooks::resource_id(&*pool);

    // An empty pool must grow: malloc_pre, alloc_pre, alloc_post, malloc_post.
    let a = pool.allocate(3 * MIB + 1, S).unwrap();
    let ev = rec.take();
    assert_eq!(
        points(&ev),
        vec![MallocPre, AllocPre, AllocPost, MallocPost]
    );
    for e in &ev {
        assert_eq!(e.device, 0);
        assert_eq!(e.resource, "PoolMemoryResource");
        assert_eq!(e.resource_id, id);
        assert_eq!(e.stream, S);
    }
    assert_eq!((ev[0].size, ev[0].mem_size), (3 * MIB + 1, 3 * MIB + 256));
    assert!(ev[0].ptr.is_null());
    // The chunk: at least the request, taken from the upstream.
    assert!(ev[1].mem_size >= 3 * MIB + 256 && ev[1].ptr.is_null());
    assert_eq!(ev[2].mem_size, ev[1].mem_size);
    assert!(!ev[2].ptr.is_null());
    assert_eq!(
        (ev[3].size, ev[3].mem_size, ev[3].ptr),
        (3 * MIB + 1, 3 * MIB + 256, a)
    );

    // Free: free_pre, free_post, with the pointer in both.
    pool.deallocate(a, 3 * MIB + 1, S).unwrap();
    let ev = rec.take();
    assert_eq!(points(&ev), vec![FreePre, FreePost]);
    assert!(
        ev.iter()
            .all(|e| e.ptr == a && e.size == 3 * MIB + 1 && e.mem_size == 3 * MIB + 256)
    );

    // The same request again is served from what the pool holds: no alloc events.
    let b = pool.allocate(3 * MIB + 1, S).unwrap();
    let ev = rec.take();
    assert_eq!(points(&ev), vec![MallocPre, MallocPost]);
    assert_eq!(
        (ev[1].size, ev[1].mem_size, ev[1].ptr),
        (3 * MIB + 1, 3 * MIB + 256, b)
    );
    pool.deallocate(b, 3 * MIB + 1, S).unwrap();
    rec.take();

    // Release gives chunks back to the device: not a hook event (as in CuPy).
    pool.release().unwrap();
    assert!(rec.take().is_empty());
    // Zero bytes: no pool activity, no events.
    let z = pool.allocate(0, S).unwrap();
    pool.deallocate(z, 0, S).unwrap();
    assert!(rec.take().is_empty());
}

#[test]
fn failed_malloc_reports_a_null_pointer() {
    use HookPoint::*;
    let pool = empty_pool();
    let rec = Arc::new(Recorder::default());
    let _guard = hooks::register_thread_hook(rec.clone());
    assert!(pool.allocate(512 * MIB, S).is_err());
    let ev = rec.take();
    assert_eq!(points(&ev).first(), Some(&MallocPre));
    assert_eq!(points(&ev).last(), Some(&MallocPost));
    assert!(ev.last().unwrap().ptr.is_null());
}

#[test]
fn dropping_the_guard_unregisters() {
    let pool = empty_pool();
    let rec = Arc::new(Recorder::default());
    let guard = hooks::register_thread_hook(rec.clone());
    assert!(hooks::active());
    let p = pool.allocate(MIB, S).unwrap();
    drop(guard);
    pool.deallocate(p, MIB, S).unwrap();
    let ev = rec.take();
    assert!(ev.iter().all(|e| e.point != HookPoint::FreePre), "{ev:?}");
    // with_thread_hook: registered only inside the closure.
    let p = hooks::with_thread_hook(rec.clone(), || pool.allocate(MIB, S).unwrap());
    assert_eq!(
        points(&rec.take()),
        vec![HookPoint::MallocPre, HookPoint::MallocPost]
    );
    pool.deallocate(p, MIB, S).unwrap();
    assert!(rec.take().is_empty());
}

#[test]
fn thread_hooks_see_only_their_thread() {
    let pool = empty_pool();
    let rec = Arc::new(Recorder::default());
    let _guard = hooks::register_thread_hook(rec.clone());
    let p2 = Arc::clone(&pool);
    std::thread::spawn(move || {
        let p = p2.allocate(MIB, S).unwrap();
        p2.deallocate(p, MIB, S).unwrap();
    })
    .join()
    .unwrap();
    assert!(rec.take().is_empty());
}

#[test]
fn process_hooks_see_every_thread() {
    let pool = empty_pool();
    let id = hooks::resource_id(&*pool);
    let rec = Arc::new(Recorder::default());
    let guard = hooks::register_process_hook(rec.clone());
    let p2 = Arc::clone(&pool);
    std::thread::spawn(move || {
        let p = p2.allocate(MIB, S).unwrap();
        p2.deallocate(p, MIB, S).unwrap();
    })
    .join()
    .unwrap();
    drop(guard);
    // Other tests run in this process at the same time: keep this pool's events only.
    let mine: Vec<HookPoint> = rec
        .take()
        .into_iter()
        .filter(|e| e.resource_id == id)
        .map(|e| e.point)
        .filter(|p| {
            matches!(
                p,
                HookPoint::MallocPre
                    | HookPoint::MallocPost
                    | HookPoint::FreePre
                    | HookPoint::FreePost
            )
        })
        .collect();
    use HookPoint::*;
    assert_eq!(mine, vec![MallocPre, MallocPost, FreePre, FreePost]);
}

#[test]
fn hooked_adaptor_fires_around_any_resource() {
    use HookPoint::*;
    let hooked = HookedResourceAdaptor::new(cuda());
    let id = hooks::resource_id(&hooked);
    let rec = Arc::new(Recorder::default());
    let _guard = hooks::register_thread_hook(rec.clone());
    let p = hooked.allocate(1000, S).unwrap();
    hooked.deallocate(p, 1000, S).unwrap();
    let ev = rec.take();
    assert_eq!(points(&ev), vec![MallocPre, MallocPost, FreePre, FreePost]);
    assert!(
        ev.iter()
            .all(|e| e.resource == "HookedResourceAdaptor" && e.resource_id == id)
    );
    assert_eq!((ev[1].size, ev[1].mem_size, ev[1].ptr), (1000, 1024, p));
}

/// A hook that allocates from another resource: events raised inside a hook are not
/// dispatched, so there is no recursion.
struct Allocating {
    other: SharedResource,
    rec: Recorder,
}

impl MemoryHook for Allocating {
    fn malloc_preprocess(&self, e: &HookEvent) {
        self.rec.push(e);
        let p = self.other.allocate(256, S).unwrap();
        self.other.deallocate(p, 256, S).unwrap();
    }
}

#[test]
fn hooks_that_allocate_do_not_recurse() {
    let pool = empty_pool();
    let inner: SharedResource = empty_pool();
    let hook = Arc::new(Allocating {
        other: inner,
        rec: Recorder::default(),
    });
    let _guard = hooks::register_thread_hook(hook.clone());
    let p = pool.allocate(MIB, S).unwrap();
    pool.deallocate(p, MIB, S).unwrap();
    assert_eq!(points(&hook.rec.take()), vec![HookPoint::MallocPre]);
}

#[test]
fn pool_over_pool_fires_for_both() {
    use HookPoint::*;
    let inner = empty_pool();
    let outer = PoolMemoryResource::builder(inner.clone())
        .initial_size(0)
        .maximum_size((128 * MIB) as u64)
        .build()
        .unwrap();
    let rec = Arc::new(Recorder::default());
    let _guard = hooks::register_thread_hook(rec.clone());
    let p = outer.allocate(MIB, S).unwrap();
    let ev = rec.take();
    let outer_id = hooks::resource_id(&outer);
    let inner_id = hooks::resource_id(&*inner);
    let seq: Vec<(HookPoint, bool)> = ev
        .iter()
        .map(|e| (e.point, e.resource_id == outer_id))
        .collect();
    // The outer pool grows from the inner one, which itself grows from the device.
    assert_eq!(
        seq,
        vec![
            (MallocPre, true),
            (AllocPre, true),
            (MallocPre, false),
            (AllocPre, false),
            (AllocPost, false),
            (MallocPost, false),
            (AllocPost, true),
            (MallocPost, true),
        ]
    );
    assert!(
        ev.iter()
            .all(|e| e.resource_id == outer_id || e.resource_id == inner_id)
    );
    outer.deallocate(p, MIB, S).unwrap();
}

/// Log output captured in memory, for a `tracing` subscriber.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

#[test]
fn tracing_hook_logs_every_hook_point_with_its_fields() {
    let pool = empty_pool();
    let out = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(out.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    let p = tracing::subscriber::with_default(subscriber, || {
        let _guard = hooks::register_thread_hook(Arc::new(TracingHook));
        let p = pool.allocate(MIB, S).unwrap();
        pool.deallocate(p, MIB, S).unwrap();
        p
    });
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("memory hook")).collect();
    // The pool grows (alloc_*: its upstream), serves (malloc_*), takes the block back (free_*).
    for point in [
        "alloc_preprocess",
        "alloc_postprocess",
        "malloc_preprocess",
        "malloc_postprocess",
        "free_preprocess",
        "free_postprocess",
    ] {
        let line = lines
            .iter()
            .find(|l| l.contains(&format!("event=\"{point}\"")))
            .unwrap_or_else(|| panic!("no {point} line in:\n{text}"));
        assert!(line.contains("device=0"), "{line}");
        assert!(line.contains("resource="), "{line}");
    }
    let served = lines
        .iter()
        .find(|l| l.contains("event=\"malloc_postprocess\""))
        .unwrap();
    assert!(served.contains(&format!("size={MIB}")), "{served}");
    assert!(served.contains(&format!("ptr={p}")), "{served}");
}

#[test]
fn line_profile_aggregates_by_call_site() {
    let pool = empty_pool();
    let profile = Arc::new(LineProfileHook::new());
    let _guard = hooks::register_thread_hook(profile.clone());
    let mut ptrs = Vec::new();
    for _ in 0..3 {
        ptrs.push((hooks::allocate_here(&*pool, 1000, S).unwrap(), 1000)); // site A
    }
    ptrs.push((hooks::allocate_here(&*pool, 2 * MIB, S).unwrap(), 2 * MIB)); // site B
    ptrs.push((pool.allocate(512, S).unwrap(), 512)); // unattributed
    let site_c = hooks::at_call_site(|| {
        ptrs.push((pool.allocate(256, S).unwrap(), 256));
        hooks::current_call_site().unwrap().line()
    });
    let report = profile.report();
    assert_eq!(report.len(), 4, "{report:?}");
    // Most used bytes first: site B (which also made the pool grow).
    assert!(report[0].site.contains("adaptor_hooks.rs"), "{report:?}");
    assert_eq!(
        (report[0].malloc_count, report[0].used_bytes),
        (1, 2 * MIB as u64)
    );
    let a = report.iter().find(|s| s.malloc_count == 3).unwrap();
    assert_eq!(a.used_bytes, 3 * 1024);
    let un = report.iter().find(|s| s.site == "<unattributed>").unwrap();
    assert_eq!((un.malloc_count, un.used_bytes), (1, 512));
    let c = report
        .iter()
        .find(|s| s.site.contains(&format!(":{site_c}:")))
        .unwrap();
    assert_eq!(c.used_bytes, 256);
    // The pool grew once (for the first request), attributed to site A.
    let acquired: u64 = report.iter().map(|s| s.acquired_bytes).sum();
    assert!(acquired >= 2 * MIB as u64, "{report:?}");
    assert!(a.alloc_count == 1 && a.acquired_bytes > 0, "{report:?}");
    let table = profile.to_string();
    assert!(
        table.contains("call site") && table.contains("<unattributed>"),
        "{table}"
    );
    for (p, b) in ptrs {
        pool.deallocate(p, b, S).unwrap();
    }
    // Outside a site, nothing is attributed.
    assert!(hooks::current_call_site().is_none());
}
