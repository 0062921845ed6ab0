//! Hooks and statistics: a pool wrapped by a `StatisticsResourceAdaptor`, two process-wide
//! memory hooks (CuPy's `LineProfileHook`, and a small custom `MemoryHook` that tallies events),
//! allocations from a few call sites; then the line profile, the statistics report (text and
//! JSON), counter scopes (`push_counters` / `measure` / `pop_counters`), a hook registered for
//! one thread only, and the hooks going away when their guards drop.
//!
//! `cargo run --release --example hooks_and_statistics`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use rmm::allocator::adaptor::hooks::{
    self, HookEvent, HookPoint, LineProfileHook, MemoryHook, allocate_here, at_call_site,
    register_process_hook, with_thread_hook,
};
use rmm::allocator::adaptor::{Counter, StatisticsResourceAdaptor};
use rmm::allocator::fmt_bytes;
use rmm::allocator::resource::DeviceMemoryResource;
use rmm::allocator::resource::SharedResource;
use rmm::allocator::resource::{CudaMemoryResource, PoolMemoryResource};
use rmm::allocator::{Device, DeviceBuffer, DeviceScalar, DeviceUVector, Stream, StreamView};

const MIB: usize = 1 << 20;

type Error = Box<dyn std::error::Error>;

/// Counts every event by hook point and the bytes requested, and keeps the first few events.
#[derive(Default)]
struct EventTally {
    by_point: [AtomicU64; 6],
    requested_bytes: AtomicU64,
    first: Mutex<Vec<HookEvent>>,
}

const POINTS: [HookPoint; 6] = [
    HookPoint::MallocPre,
    HookPoint::AllocPre,
    HookPoint::AllocPost,
    HookPoint::MallocPost,
    HookPoint::FreePre,
    HookPoint::FreePost,
];

impl EventTally {
    fn note(&self, e: &HookEvent) {
        let i = POINTS.iter().position(|p| *p == e.point).unwrap_or(0);
        self.by_point[i].fetch_add(1, Ordering::Relaxed);
        if e.point == HookPoint::MallocPost && !e.ptr.is_null() {
            self.requested_bytes
                .fetch_add(e.size as u64, Ordering::Relaxed);
        }
        let mut first = self.first.lock();
        if first.len() < 6 {
            first.push(*e);
        }
    }

    fn count(&self, point: HookPoint) -> u64 {
        let i = POINTS.iter().position(|p| *p == point).unwrap_or(0);
        self.by_point[i].load(Ordering::Relaxed)
    }

    fn total(&self) -> u64 {
        self.by_point
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }
}

impl MemoryHook for EventTally {
    fn name(&self) -> &str {
        "EventTally"
    }
    fn alloc_preprocess(&self, e: &HookEvent) {
        self.note(e)
    }
    fn alloc_postprocess(&self, e: &HookEvent) {
        self.note(e)
    }
    fn malloc_preprocess(&self, e: &HookEvent) {
        self.note(e)
    }
    fn malloc_postprocess(&self, e: &HookEvent) {
        self.note(e)
    }
    fn free_preprocess(&self, e: &HookEvent) {
        self.note(e)
    }
    fn free_postprocess(&self, e: &HookEvent) {
        self.note(e)
    }
}

// Three call sites, as a data pipeline might have them. `at_call_site` records the line it is
// called from for every allocation inside it (free at run time: `#[track_caller]`).

fn build_hash_table(r: &SharedResource, s: StreamView) -> rmm::allocator::Result<DeviceBuffer> {
    at_call_site(|| DeviceBuffer::new_in(128 * MIB, s, Arc::clone(r)))
}

fn load_columns(r: &SharedResource, s: StreamView) -> rmm::allocator::Result<Vec<DeviceBuffer>> {
    (0..8)
        .map(|i| at_call_site(|| DeviceBuffer::new_in(4 * MIB + 1000 * i, s, Arc::clone(r))))
        .collect()
}

fn small_scalars(
    r: &SharedResource,
    s: StreamView,
) -> rmm::allocator::Result<Vec<DeviceScalar<u64>>> {
    (0..100u64)
        .map(|i| at_call_site(|| DeviceScalar::with_value_in(i, s, Arc::clone(r))))
        .collect()
}

fn show_counters(what: &str, bytes: Counter, allocations: Counter) {
    println!(
        "  {what:<30} bytes: {:>10} now, {:>10} peak, {:>10} total; allocations: {} now, {} total",
        fmt_bytes(bytes.value.max(0) as usize),
        fmt_bytes(bytes.peak as usize),
        fmt_bytes(bytes.total as usize),
        allocations.value,
        allocations.total
    );
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), Error> {
    if ok { Ok(()) } else { Err(what().into()) }
}

fn main() -> Result<(), Error> {
    let device = Device::current()?;
    println!("backend: {}", device.backend().describe());
    let stream = Stream::new(device)?;
    let s = stream.view();

    // A 64 MiB pool (it may grow to 512 MiB) under a statistics adaptor.
    let pool = Arc::new(
        PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(device)))
            .initial_size((64 * MIB) as u64)
            .maximum_size((512 * MIB) as u64)
            .build()?,
    );
    let stats = Arc::new(StatisticsResourceAdaptor::new(Arc::clone(&pool)));
    let top: SharedResource = stats.clone();

    // Two process-wide hooks, registered until their guards drop.
    let profile = Arc::new(LineProfileHook::new());
    let tally = Arc::new(EventTally::default());
    let profile_guard = register_process_hook(profile.clone());
    let tally_guard = register_process_hook(tally.clone());

    // Allocations from the call sites, one raw allocation with its site, one without a site.
    let table = build_hash_table(&top, s)?; // larger than the pool: it grows
    let columns = load_columns(&top, s)?;
    let scalars = small_scalars(&top, s)?;
    let raw = allocate_here(&*top, MIB, s)?;
    let unattributed = DeviceUVector::from_host_in(&[1.5f32; 1000], s, Arc::clone(&top))?;
    let sum: f64 = scalars
        .iter()
        .map(|x| x.value(s).map(|v| v as f64))
        .sum::<rmm::allocator::Result<f64>>()?;
    check(sum == 4950.0, || format!("the scalars sum to {sum}"))?;
    top.deallocate(raw, MIB, s)?;
    drop((table, columns, scalars, unattributed));

    println!("\n== the first events (the hash table: served after the pool grew)");
    for e in tally.first.lock().iter().take(4) {
        println!(
            "  {:<18} size {:>10}  mem_size {:>10}  from {}",
            e.point.name(),
            fmt_bytes(e.size),
            fmt_bytes(e.mem_size),
            e.resource
        );
    }
    let first: Vec<HookPoint> = tally.first.lock().iter().map(|e| e.point).collect();
    check(
        first.starts_with(&[
            HookPoint::MallocPre,
            HookPoint::AllocPre,
            HookPoint::AllocPost,
            HookPoint::MallocPost,
        ]),
        || {
            format!(
                "first events {first:?}: expected malloc_pre, alloc_pre, alloc_post, malloc_post"
            )
        },
    )?;

    println!("\n== line profile (LineProfileHook)\n{profile}");
    let rows = profile.report();
    let counts: Vec<u64> = rows.iter().map(|r| r.malloc_count).collect();
    let mut sorted = counts.clone();
    sorted.sort_unstable();
    check(sorted == [1, 1, 1, 8, 100], || {
        format!("mallocs per site {counts:?}: expected 100, 8, 1, 1 and 1 (unattributed)")
    })?;
    let table_row = rows
        .iter()
        .find(|r| r.used_bytes == 128 * MIB as u64)
        .ok_or("no site with the 128 MiB hash table")?;
    check(
        table_row.alloc_count >= 1 && table_row.acquired_bytes >= 128 * MIB as u64,
        || format!("the hash table's site took no memory from the device: {table_row:?}"),
    )?;
    check(
        rows.iter()
            .any(|r| r.site == "<unattributed>" && r.malloc_count == 1),
        || "the allocation without a call site is not <unattributed>".into(),
    )?;

    // The statistics adaptor counted the same allocations, at their requested sizes.
    let report = stats.report();
    println!("== statistics report\n{report}\n");
    let mallocs = tally.count(HookPoint::MallocPost);
    check(
        report.allocations.total == mallocs as i64
            && report.allocated_bytes.total == tally.requested_bytes.load(Ordering::Relaxed) as i64
            && report.allocations.value == 0
            && tally.count(HookPoint::FreePost) == mallocs,
        || {
            format!(
                "statistics {} allocations / {} bytes, hooks {mallocs} / {}",
                report.allocations.total,
                report.allocated_bytes.total,
                tally.requested_bytes.load(Ordering::Relaxed)
            )
        },
    )?;
    check(report.reserved_bytes == Some(pool.pool_size()), || {
        format!(
            "reserved {:?}, the pool holds {}",
            report.reserved_bytes,
            pool.pool_size()
        )
    })?;
    let json = report.to_json();
    println!("as JSON:\n{json}");
    let parsed: serde_json::Value = serde_json::from_str(&json)?;
    check(
        parsed["allocations"]["total"].as_i64() == Some(report.allocations.total),
        || "the JSON report disagrees with the report".into(),
    )?;
    println!("as PyTorch's memory_stats():");
    for (k, v) in report.memory_stats() {
        println!("  {k:<36} {v}");
    }

    // Counter scopes: a scope counts from its push; an inner one (measure) is included in the
    // outer one when it pops. They count every thread using the adaptor.
    println!("\n== counter scopes");
    stats.push_counters();
    let a = DeviceBuffer::new_in(2 * MIB, s, Arc::clone(&top))?;
    let (b, inner_bytes, inner_allocs) =
        stats.measure(|| DeviceBuffer::new_in(3 * MIB, s, Arc::clone(&top)));
    let b = b?;
    drop(a);
    let (outer_bytes, outer_allocs) = stats.pop_counters()?;
    show_counters("measure(3 MiB)", inner_bytes, inner_allocs);
    show_counters("outer (2 MiB, then 3, free 2)", outer_bytes, outer_allocs);
    let m = MIB as i64;
    check(
        (inner_bytes.value, inner_bytes.total, inner_allocs.total) == (3 * m, 3 * m, 1)
            && (outer_bytes.value, outer_bytes.peak, outer_bytes.total) == (3 * m, 5 * m, 5 * m)
            && (outer_allocs.value, outer_allocs.total) == (1, 2),
        || "counter scopes disagree with what was allocated".into(),
    )?;
    drop(b);
    check(stats.scope_depth() == 1, || "a scope was left open".into())?;

    // A hook for one thread sees only that thread's allocations; process hooks see all.
    println!("\n== a hook registered for this thread only");
    let mine = Arc::new(EventTally::default());
    let all_before = tally.count(HookPoint::MallocPost);
    with_thread_hook(mine.clone(), || -> Result<(), Error> {
        let _here = DeviceBuffer::new_in(MIB, s, Arc::clone(&top))?;
        let other = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    DeviceBuffer::new_in(MIB, StreamView::DEFAULT, Arc::clone(&top)).map(drop)
                })
                .join()
        });
        other.map_err(|_| "the other thread panicked")??;
        Ok(())
    })?;
    let all = tally.count(HookPoint::MallocPost) - all_before;
    println!(
        "  allocations seen: this thread's hook {}, the process-wide hook {all}",
        mine.count(HookPoint::MallocPost)
    );
    check(mine.count(HookPoint::MallocPost) == 1 && all == 2, || {
        "the thread hook saw another thread's allocation, or the process hook missed one".into()
    })?;

    // Dropping the guards removes the hooks: nothing fires any more, statistics go on.
    drop(profile_guard);
    drop(tally_guard);
    let (events_before, sites_before) = (tally.total(), profile.report());
    let allocs_before = stats.lifetime_allocations().total;
    let after = DeviceBuffer::new_in(MIB, s, Arc::clone(&top))?;
    drop(after);
    println!("\n== hooks removed");
    println!(
        "  hooks active: {}; events since: {}; profile unchanged: {}; statistics counted {} more",
        hooks::active(),
        tally.total() - events_before,
        profile.report() == sites_before,
        stats.lifetime_allocations().total - allocs_before
    );
    check(
        !hooks::active()
            && tally.total() == events_before
            && profile.report() == sites_before
            && stats.lifetime_allocations().total == allocs_before + 1,
        || "a hook still fired after its guard dropped".into(),
    )?;

    println!("\nhooks and statistics: every check passed");
    Ok(())
}
