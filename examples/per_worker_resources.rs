//! Per-worker resources: every worker runs with its device current and its device's stack as
//! the current resource, so containers built without a resource (`DeviceBuffer::new`,
//! `DeviceUVector::from_host`, `DeviceScalar::with_value`) allocate from that stack. Each
//! worker measures its own allocations with a memory hook registered for its thread only
//! (`with_thread_hook`); the per-worker table is then checked against what each device's
//! statistics adaptor counted.
//!
//! Counter scopes (`push_counters` / `pop_counters` / `measure` on a statistics adaptor) are
//! *not* per thread: a scope counts everything that goes through the adaptor, from every
//! worker of the device. So the per-thread figures come from the hooks, and one scope per
//! device, pushed around the whole run, gives the device totals they must add up to.
//!
//! `cargo run --release --example per_worker_resources` (every device: try `RMM_SIM_DEVICES=2`)

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use rmm::allocator::adaptor::hooks::{HookEvent, MemoryHook, with_thread_hook};
use rmm::allocator::fmt_bytes;
use rmm::allocator::per_device::get_current_device_resource;
use rmm::allocator::{DeviceBuffer, DeviceScalar, DeviceUVector};
use rmm::config::ConfigLoader;
use rmm::runtime::{Runtime, TaskContext, TaskHandle};

const MIB: usize = 1 << 20;
const WORKERS_PER_DEVICE: usize = 3;

/// Counts what one thread allocates and frees through a pool (hooks fire in the pool, on the
/// allocating thread, with the requested and the rounded size).
#[derive(Default)]
struct ThreadCounter {
    allocations: AtomicU64,
    requested_bytes: AtomicU64,
    rounded_bytes: AtomicU64,
    frees: AtomicU64,
    live: AtomicI64,
    peak_live: AtomicI64,
    /// Events from another device's resource (there should be none).
    foreign: AtomicU64,
    device: u32,
}

impl MemoryHook for ThreadCounter {
    fn name(&self) -> &str {
        "ThreadCounter"
    }

    fn malloc_postprocess(&self, e: &HookEvent) {
        if e.ptr.is_null() {
            return; // the allocation failed
        }
        if e.device != self.device {
            self.foreign.fetch_add(1, Ordering::Relaxed);
        }
        self.allocations.fetch_add(1, Ordering::Relaxed);
        self.requested_bytes
            .fetch_add(e.size as u64, Ordering::Relaxed);
        self.rounded_bytes
            .fetch_add(e.mem_size as u64, Ordering::Relaxed);
        let live = self.live.fetch_add(e.size as i64, Ordering::Relaxed) + e.size as i64;
        self.peak_live.fetch_max(live, Ordering::Relaxed);
    }

    fn free_postprocess(&self, e: &HookEvent) {
        self.frees.fetch_add(1, Ordering::Relaxed);
        self.live.fetch_sub(e.size as i64, Ordering::Relaxed);
    }
}

/// One worker's line of the table.
struct Row {
    worker: String,
    device: u32,
    allocations: u64,
    requested: u64,
    rounded: u64,
    peak_live: i64,
    frees: u64,
    live_after: i64,
    foreign: u64,
}

/// The task every worker runs: a workload whose size depends on the worker, allocated
/// through the current resource, with every result checked.
fn workload(ctx: &TaskContext<'_>) -> Result<(), String> {
    let s = ctx.stream();
    let current = get_current_device_resource().map_err(|e| e.to_string())?;
    if !Arc::ptr_eq(&current, ctx.resource()) {
        return Err(format!(
            "worker {}: the current resource is not the device's stack",
            ctx.worker()
        ));
    }
    let w = ctx.worker();
    let (index, device) = (w.index as usize, w.device as usize);
    // Buffers of (index + 1) MiB plus a few odd bytes, 2 + index + device of them.
    let mut buffers = Vec::new();
    for k in 0..2 + index + device {
        let b = DeviceBuffer::new((index + 1) * MIB + 100 * k + device, s)
            .map_err(|e| e.to_string())?;
        if !Arc::ptr_eq(b.memory_resource(), ctx.resource()) {
            return Err(format!("worker {w}: a buffer came from another resource"));
        }
        buffers.push(b);
    }
    // A typed vector: written from the host, read back, checked.
    let data: Vec<f64> = (0..(index + 1) * 50_000)
        .map(|i| (i * (device + 1)) as f64 * 0.5)
        .collect();
    let v = DeviceUVector::from_host(&data, s).map_err(|e| e.to_string())?;
    if v.to_vec(s).map_err(|e| e.to_string())? != data {
        return Err(format!("worker {w}: the vector read back differs"));
    }
    // A scalar (small: served by the pool's size-class bins).
    let x = DeviceScalar::with_value(w.index as u64 * 1000 + w.device as u64, s)
        .map_err(|e| e.to_string())?;
    if x.value(s).map_err(|e| e.to_string())? != w.index as u64 * 1000 + w.device as u64 {
        return Err(format!("worker {w}: the scalar read back differs"));
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = ConfigLoader::new()
        .set("devices", "all")
        .set("workers_per_device", WORKERS_PER_DEVICE as i64)
        // The pool fires the memory hooks (other resources need a HookedResourceAdaptor).
        .set("pool.enabled", true)
        .set("pool.initial_size", "256MiB")
        .set("stats.enabled", true)
        .load()?;
    let runtime = Runtime::start(&config)?;
    let devices = runtime.devices();

    // One counter scope per device around the whole run: it counts every thread.
    for &d in &devices {
        runtime
            .stack(d)
            .ok_or("a device without a stack")?
            .statistics()
            .push_counters();
    }

    let rows: Vec<Result<Row, String>> = TaskHandle::wait_all(runtime.run_on_all(|ctx| {
        let counter = Arc::new(ThreadCounter {
            device: ctx.device().ordinal(),
            ..ThreadCounter::default()
        });
        // Registered for this worker's thread only, until the closure returns.
        let hook: Arc<dyn MemoryHook> = counter.clone();
        with_thread_hook(hook, || workload(ctx))?;
        let c = &*counter;
        Ok(Row {
            worker: ctx.worker().to_string(),
            device: ctx.device().ordinal(),
            allocations: c.allocations.load(Ordering::Relaxed),
            requested: c.requested_bytes.load(Ordering::Relaxed),
            rounded: c.rounded_bytes.load(Ordering::Relaxed),
            peak_live: c.peak_live.load(Ordering::Relaxed),
            frees: c.frees.load(Ordering::Relaxed),
            live_after: c.live.load(Ordering::Relaxed),
            foreign: c.foreign.load(Ordering::Relaxed),
        })
    }))?;
    let rows: Vec<Row> = rows.into_iter().collect::<Result<_, _>>()?;

    println!(
        "{:<8} {:>6} {:>7} {:>12} {:>12} {:>12} {:>6} {:>8}",
        "worker", "device", "allocs", "requested", "rounded", "peak live", "frees", "live now"
    );
    for r in &rows {
        println!(
            "{:<8} {:>6} {:>7} {:>12} {:>12} {:>12} {:>6} {:>8}",
            r.worker,
            r.device,
            r.allocations,
            fmt_bytes(r.requested as usize),
            fmt_bytes(r.rounded as usize),
            fmt_bytes(r.peak_live as usize),
            r.frees,
            r.live_after
        );
        if r.allocations == 0 || r.frees != r.allocations || r.live_after != 0 || r.foreign != 0 {
            return Err(format!(
                "worker {}: {} allocations, {} frees, {} bytes still live, {} events from \
                 another device",
                r.worker, r.allocations, r.frees, r.live_after, r.foreign
            )
            .into());
        }
    }
    if rows.len() != devices.len() * WORKERS_PER_DEVICE {
        return Err(format!("{} workers answered", rows.len()).into());
    }

    // The sums per device against the device's statistics adaptor.
    println!();
    for &d in &devices {
        let stack = runtime.stack(d).ok_or("a device without a stack")?;
        let (bytes, allocations) = stack.statistics().pop_counters()?;
        let mine: Vec<&Row> = rows.iter().filter(|r| r.device == d).collect();
        let sum_allocs: u64 = mine.iter().map(|r| r.allocations).sum();
        let sum_bytes: u64 = mine.iter().map(|r| r.requested).sum();
        println!(
            "device {d}: the workers' hooks counted {sum_allocs} allocations, {}; the device's \
             statistics scope counted {} allocations, {} ({} live now; peak {}, exact to the \
             adaptor's peak tolerance of {} with several threads)",
            fmt_bytes(sum_bytes as usize),
            allocations.total,
            fmt_bytes(bytes.total as usize),
            bytes.value,
            fmt_bytes(bytes.peak as usize),
            fmt_bytes(stack.statistics().peak_tolerance()),
        );
        if allocations.total != sum_allocs as i64 || bytes.total != sum_bytes as i64 {
            return Err(format!(
                "device {d}: the workers' hooks counted {sum_allocs} allocations / {sum_bytes} \
                 bytes, the statistics adaptor {} / {}",
                allocations.total, bytes.total
            )
            .into());
        }
        if bytes.value != 0 || allocations.value != 0 || stack.live().count != 0 {
            return Err(format!("device {d}: allocations are still live").into());
        }
        // The peak across workers is at most the sum of each worker's own peak.
        let sum_peaks: i64 = mine.iter().map(|r| r.peak_live).sum();
        if bytes.peak > sum_peaks + stack.statistics().peak_tolerance() as i64 {
            return Err(format!(
                "device {d}: peak {} above the sum of the workers' peaks {sum_peaks}",
                bytes.peak
            )
            .into());
        }
        println!("{}", stack.memory_report());
    }
    runtime.shutdown()?;
    println!();
    println!("per-worker resources: every check passed");
    Ok(())
}
