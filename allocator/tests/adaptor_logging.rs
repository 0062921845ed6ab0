//! LoggingResourceAdaptor: RMM's CSV format, and the round trip log → replay with the same
//! peak bytes.

mod common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use common::{MIB, device};
use rmm_allocator::adaptor::LogAction;
use rmm_allocator::adaptor::{
    LOG_HEADER, LimitingResourceAdaptor, LoggingResourceAdaptor, StatisticsResourceAdaptor,
    log_file_path,
};
use rmm_allocator::backend::DevicePtr;
use rmm_allocator::replay::{EventLog, ReplayOptions, ReplayOrder, replay};
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::SharedResource;
use rmm_allocator::resource::{CudaMemoryResource, PoolMemoryResource};
use rmm_allocator::{Stream, StreamView};

const S: StreamView = StreamView::DEFAULT;

fn cuda() -> SharedResource {
    Arc::new(CudaMemoryResource::new(device()))
}

fn pool() -> SharedResource {
    Arc::new(PoolMemoryResource::new(cuda(), 64 * MIB, Some(512 * MIB)).unwrap())
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rmm-adaptor-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn is_time(t: &str) -> bool {
    // HH:MM:SS.ffffff
    let b = t.as_bytes();
    b.len() == 15
        && b[2] == b':'
        && b[5] == b':'
        && b[8] == b'.'
        && t.chars()
            .enumerate()
            .all(|(i, c)| [2, 5, 8].contains(&i) || c.is_ascii_digit())
}

#[test]
fn writes_rmm_format() {
    let dir = temp_dir("format");
    let stream = Stream::new(device()).unwrap();
    let limit: SharedResource = Arc::new(LimitingResourceAdaptor::with_bytes(pool(), 8 * MIB));
    let log = LoggingResourceAdaptor::in_dir(limit, &dir).unwrap();
    let path = log.path().unwrap().to_path_buf();
    assert_eq!(path, log_file_path(&dir, 0));
    assert!(path.ends_with("rmm_log.dev0.csv"));
    let a = log.allocate(1000, S).unwrap();
    let b = log.allocate(MIB, stream.view()).unwrap();
    assert!(log.allocate(16 * MIB, S).is_err());
    log.deallocate(a, 1000, S).unwrap();
    log.deallocate(b, MIB, stream.view()).unwrap();
    log.flush().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], LOG_HEADER);
    assert_eq!(lines.len(), 6, "{text}");
    let rows: Vec<Vec<&str>> = lines[1..].iter().map(|l| l.split(',').collect()).collect();
    for r in &rows {
        assert_eq!(r.len(), 6, "{r:?}");
        assert!(r[0].parse::<u64>().is_ok(), "thread {}", r[0]);
        assert!(is_time(r[1]), "time {}", r[1]);
        assert!(r[3].starts_with("0x") && r[5].starts_with("0x"), "{r:?}");
    }
    assert_eq!(
        rows[0][2..],
        ["allocate", &format!("{:#x}", a.addr()), "1000", "0x0"]
    );
    let s = format!("{:#x}", stream.view().raw());
    assert_eq!(
        rows[1][2..],
        ["allocate", &format!("{:#x}", b.addr()), "1048576", &s]
    );
    assert_eq!(rows[2][2..], ["allocate failure", "0x0", "16777216", "0x0"]);
    assert_eq!(
        rows[3][2..],
        ["free", &format!("{:#x}", a.addr()), "1000", "0x0"]
    );
    assert_eq!(
        rows[4][2..],
        ["free", &format!("{:#x}", b.addr()), "1048576", &s]
    );
    // One thread wrote everything.
    assert!(rows.iter().all(|r| r[0] == rows[0][0]));
    // And it parses back.
    let parsed = EventLog::read(&path).unwrap();
    assert_eq!(parsed.events.len(), 5);
    assert_eq!(parsed.events[2].action, LogAction::AllocateFailure);
    assert_eq!(parsed.logged_failures, 1);
    assert_eq!(parsed.peak_bytes, (MIB + 1000) as u64);
    stream.synchronize().unwrap();
    drop(log);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn drop_flushes() {
    let dir = temp_dir("drop");
    let path = dir.join("log.csv");
    {
        let log = LoggingResourceAdaptor::new(cuda(), &path).unwrap();
        let p = log.allocate(4096, S).unwrap();
        log.deallocate(p, 4096, S).unwrap();
    }
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 3, "{text}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_bad_path_is_an_error_that_names_it() {
    let e = LoggingResourceAdaptor::new(cuda(), "/nonexistent-dir/x/rmm_log.csv").unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("/nonexistent-dir/x/rmm_log.csv"), "{msg}");
    assert!(msg.contains("creating the log failed"), "{msg}");
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
