//! The round trip log → replay: a workload logged through `LoggingResourceAdaptor`, read back
//! and replayed with the same peak bytes, on one thread and on several with cross-thread frees.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use rmm::allocator::adaptor::{LoggingResourceAdaptor, StatisticsResourceAdaptor};
use rmm::allocator::backend::DevicePtr;
use rmm::allocator::event_log::EventLog;
use rmm::allocator::resource::{
    CudaMemoryResource, DeviceMemoryResource, PoolMemoryResource, SharedResource,
};
use rmm::allocator::{Device, Stream, StreamView};
use rmm_cli::replay::{ReplayOptions, ReplayOrder, replay};

const S: StreamView = StreamView::DEFAULT;
const MIB: usize = 1 << 20;

/// Device 0 of the process-wide backend (`RMM_BACKEND` picks it: sim in CI, cuda on a GPU).
fn device() -> Device {
    Device::new(0).expect("device 0 of the process-wide backend")
}

fn pool() -> SharedResource {
    let cuda = Arc::new(CudaMemoryResource::new(device()));
    Arc::new(PoolMemoryResource::new(cuda, 64 * MIB, Some(512 * MIB)).unwrap())
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rmm-replay-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Random sizes 256 B – 4 MiB, allocate with p = 0.55 under a cap.
fn workload(mr: &dyn DeviceMemoryResource, steps: usize, seed: u64, stream: StreamView) {
    let mut x = seed | 1;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut live: Vec<(DevicePtr, usize)> = Vec::new();
    let mut bytes = 0;
    for _ in 0..steps {
        let size = 256 + (rnd() % (4 * MIB as u64)) as usize;
        if live.is_empty() || (rnd() % 100 < 55 && bytes + size < 64 * MIB) {
            live.push((mr.allocate(size, stream).unwrap(), size));
            bytes += size;
        } else {
            let i = (rnd() % live.len() as u64) as usize;
            let (p, s) = live.swap_remove(i);
            mr.deallocate(p, s, stream).unwrap();
            bytes -= s;
        }
    }
    for (p, s) in live {
        mr.deallocate(p, s, stream).unwrap();
    }
}

#[test]
fn round_trip_single_thread_has_the_same_peak() {
    let dir = temp_dir("roundtrip1");
    let path = dir.join("log.csv");
    let stats = Arc::new(StatisticsResourceAdaptor::new(pool()));
    {
        let log = LoggingResourceAdaptor::new(stats.clone(), &path).unwrap();
        workload(&log, 3000, 42, S);
    }
    let peak = stats.bytes_counter().peak as u64;
    let parsed = EventLog::read(&path).unwrap();
    assert_eq!(
        parsed.events.len() as i64,
        2 * stats.allocations_counter().total
    );
    assert_eq!(parsed.peak_bytes, peak);
    assert_eq!(parsed.threads.len(), 1);
    for order in [ReplayOrder::Logged, ReplayOrder::Concurrent] {
        let fresh = pool();
        let report = replay(
            &parsed,
            &*fresh,
            &ReplayOptions {
                order,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(report.fits(), "{report}");
        assert_eq!(report.peak_bytes, peak, "{order}");
        assert_eq!(report.allocations as i64, stats.allocations_counter().total);
        assert_eq!(report.frees, report.allocations);
        assert!(report.reserved_bytes.unwrap() >= 64 * MIB as u64);
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn round_trip_many_threads_and_cross_thread_frees() {
    let dir = temp_dir("roundtrip4");
    let path = dir.join("log.csv");
    let stats = Arc::new(StatisticsResourceAdaptor::with_peak_tolerance(pool(), 0));
    let log = Arc::new(LoggingResourceAdaptor::new(stats.clone(), &path).unwrap());
    // Blocks handed between threads: each thread frees some of another thread's blocks.
    let shared: Arc<Mutex<Vec<(DevicePtr, usize)>>> = Arc::new(Mutex::new(Vec::new()));
    // The streams outlive the threads: blocks allocated on one are freed on another.
    let streams: Vec<Stream> = (0..4).map(|_| Stream::new(device()).unwrap()).collect();
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            let log = Arc::clone(&log);
            let shared = Arc::clone(&shared);
            let stream = streams[t as usize].view();
            std::thread::spawn(move || {
                workload(&*log, 500, 7 + t, stream);
                for i in 0..50usize {
                    let size = 4096 * (i + 1);
                    let p = log.allocate(size, stream).unwrap();
                    shared.lock().unwrap().push((p, size));
                    if i % 2 == 1 {
                        let (p, s) = shared.lock().unwrap().remove(0);
                        log.deallocate(p, s, stream).unwrap();
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    for (p, s) in shared.lock().unwrap().drain(..) {
        log.deallocate(p, s, S).unwrap();
    }
    for s in &streams {
        s.synchronize().unwrap();
    }
    log.flush().unwrap();
    let parsed = EventLog::read(&path).unwrap();
    assert_eq!(parsed.threads.len(), 5, "4 workers and the main thread");
    assert_eq!(parsed.unmatched_frees, 0);
    assert_eq!(parsed.unfreed, 0);
    // Frees are logged before they happen and allocations after: in the log's order a
    // block is never live longer than it really was, so its peak is at most the one the
    // statistics saw (equal when one thread logs, as in the single-thread round trip).
    assert!(parsed.peak_bytes <= stats.bytes_counter().peak as u64);
    assert!(parsed.peak_bytes > 0);
    let fresh = pool();
    let report = replay(&parsed, &*fresh, &ReplayOptions::default()).unwrap();
    assert!(report.fits(), "{report}");
    assert_eq!(report.peak_bytes, parsed.peak_bytes);
    assert_eq!(report.threads, 5);
    assert_eq!(report.streams, 4);
    // The replay's streams are gone: a pool that served them keeps their arenas, so each
    // replay gets a pool of its own.
    let fresh = pool();
    let report = replay(
        &parsed,
        &*fresh,
        &ReplayOptions {
            order: ReplayOrder::Concurrent,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(report.fits(), "{report}");
    assert_eq!(report.allocations, report.frees);
    drop(log);
    std::fs::remove_dir_all(dir).ok();
}
