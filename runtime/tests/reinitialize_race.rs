//! Threads outside the runtime that allocate while a reinitialize runs (a Dask worker's
//! tasks while `client.run(rmm_rs.reinitialize, …)` runs): the switch goes through; a switch
//! that must be refused is refused before anything moves, and leaves the data and its tiers
//! as they were.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{config, pattern, serial};
use rmm_allocator::StreamView;
use rmm_runtime::{Error, Runtime};

const MIB: usize = 1 << 20;

/// Values the writers keep, each with the seed of its bytes.
type Slots = Vec<Option<(Arc<rmm_allocator::spill::SpillableBuffer>, u64)>>;

/// Runs `work` on a thread of its own until the returned guard is dropped.
struct Background {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Background {
    fn run(work: impl Fn(u64) + Send + 'static) -> Background {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    work(i);
                    i += 1;
                }
            })
        };
        Background {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("the background thread panicked");
        }
    }
}

#[test]
fn switching_pool_and_plain_while_a_thread_allocates_spillable_buffers_always_succeeds() {
    let _s = serial();
    let rt = Runtime::start(&config(&[
        ("devices", toml::Value::from(vec![0i64])),
        ("pool.enabled", toml::Value::from(true)),
        ("spill.enabled", toml::Value::from(true)),
        ("spill.device_memory_limit", toml::Value::from("64MiB")),
    ]))
    .unwrap();
    let made = Arc::new(AtomicU64::new(0));
    let allocating = {
        let m = rt.spill_manager(0).unwrap();
        let made = Arc::clone(&made);
        Background::run(move |i| {
            let b = m.buffer(MIB + (i as usize % 7) * 4096, StreamView::DEFAULT);
            if b.is_ok() {
                made.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let mut failed = Vec::new();
    let start = Instant::now();
    let mut switches = 0;
    while start.elapsed() < Duration::from_secs(2) {
        let on = switches % 2 == 1;
        if let Err(e) = rt.reconfigure(|running| running.set("pool.enabled", on)) {
            failed.push(e.to_string());
        }
        switches += 1;
    }
    drop(allocating);
    assert!(made.load(Ordering::Relaxed) > 0, "the thread allocated");
    assert!(
        failed.is_empty(),
        "{} of {switches} switches failed, e.g. {}",
        failed.len(),
        failed[0]
    );
    // Nothing of the old stacks is left: the device's memory is all free once the last
    // switch (to plain allocations) is done.
    rt.reconfigure(|running| running.set("pool.enabled", false))
        .unwrap();
    if let Some(sim) = common::sim() {
        assert_eq!(sim.live_allocations(0), 0);
    }
}

#[test]
fn a_switch_whose_spill_cannot_fit_is_refused_before_anything_moves() {
    let _s = serial();
    let rt = Runtime::start(&config(&[
        ("devices", toml::Value::from(vec![0i64])),
        ("spill.enabled", toml::Value::from(true)),
        ("spill.device_memory_limit", toml::Value::from("64MiB")),
        ("spill.host_pool_size", toml::Value::from("128MiB")),
    ]))
    .unwrap();
    let m = rt.spill_manager(0).unwrap();
    // A device store's shape: values written and replaced by three threads under a small
    // limit, while a reinitialize to a smaller host pool is tried again and again.
    m.fix_limit(24 * MIB as u64).unwrap();
    // 12 MiB in use on the device all along (a task reading them): more than the smaller host
    // pool could take, so every attempt must be refused.
    let ballast: Vec<_> = (0..3)
        .map(|i| {
            m.from_host(&pattern(4 * MIB, 900 + i), StreamView::DEFAULT)
                .unwrap()
        })
        .collect();
    let in_use: Vec<_> = ballast
        .iter()
        .map(|b| b.device_view(StreamView::DEFAULT).unwrap())
        .collect();
    let values: Arc<parking_lot::Mutex<Slots>> = Arc::new(parking_lot::Mutex::new(vec![None; 24]));
    let writers: Vec<Background> = (0..3u64)
        .map(|w| {
            let (m, values) = (Arc::clone(&m), Arc::clone(&values));
            Background::run(move |i| {
                let seed = w * 1_000_000 + i;
                let size = MIB + (seed as usize % 3) * MIB;
                let b = m.from_host(&pattern(size, seed), StreamView::DEFAULT);
                if let Ok(b) = b {
                    values.lock()[((w * 8) + i % 8) as usize] = Some((b, seed));
                }
            })
        })
        .collect();
    let start = Instant::now();
    let mut refused = 0;
    let mut peak_device = 0;
    while start.elapsed() < Duration::from_secs(1) {
        let e = rt
            .reconfigure(|running| running.set("spill.host_pool_size", "8MiB"))
            .unwrap_err();
        assert!(
            matches!(e, Error::HostTierTooSmall { device: 0, .. }),
            "{e}"
        );
        // Refused before anything moved: nothing was spilled for it.
        let after = m.statistics();
        assert!(
            after.host_pool_bytes == 128 * MIB as u64,
            "the host tier is the old one: {after:?}"
        );
        peak_device = peak_device.max(after.tracked_bytes);
        refused += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(writers);
    drop(in_use);
    assert!(refused > 10);
    let s = m.statistics();
    assert!(s.host_bytes <= 128 * MIB as u64, "{s:?}");
    // The writers' values stayed under the store's limit (what is in use aside) all along.
    assert!(
        peak_device <= (24 + 12 + 3) * MIB as u64,
        "{peak_device} on the device"
    );
    // Every value left keeps its bytes.
    for (b, seed) in values.lock().iter().flatten() {
        let size = b.size();
        assert!(b.to_vec().unwrap() == pattern(size, *seed), "value {seed}");
    }
    let e = rt
        .reconfigure(|running| running.set("spill.host_pool_size", "8MiB"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("must be spilled before the switch") && e.contains("raise spill.host_pool_size"),
        "{e}"
    );
}
