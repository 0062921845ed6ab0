//! Replay of RMM-format logs: a hand-written RMM log, malformed logs, and "would this fit on
//! a 40 GiB GPU" on the unbacked simulated device.

mod common;

use std::fmt::Write as _;
use std::sync::Arc;

use common::{GIB, MIB, device};
use rmm_allocator::adaptor::replay::LogAction;
use rmm_allocator::adaptor::{EventLog, ReplayOptions, ReplayOrder, replay};
use rmm_allocator::backend::{SimBackend, SimConfig, SimMemoryMode};
use rmm_allocator::per_device::SharedResource;
use rmm_allocator::resource::{CudaMemoryResource, PoolMemoryResource, PoolSize};
use rmm_allocator::{Device, Error};

/// tests/data/rmm_log_sample.csv, embedded so the test binary can run from anywhere.
const SAMPLE_TEXT: &str = include_str!("data/rmm_log_sample.csv");

/// The sample written to a file of its own, to read it the way a user would.
fn sample_path() -> String {
    let dir = std::env::temp_dir().join(format!("rmm-adaptor-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rmm_log_sample.csv");
    std::fs::write(&path, SAMPLE_TEXT).unwrap();
    path.to_str().unwrap().to_string()
}

fn pool_on(d: Device, initial: usize) -> PoolMemoryResource {
    PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)) as SharedResource)
        .initial_size(PoolSize::Bytes(initial))
        .build()
        .unwrap()
}

#[test]
fn parses_a_hand_written_rmm_log() {
    let path = sample_path();
    let log = EventLog::read(&path).unwrap();
    assert_eq!(log.source, path);
    assert_eq!(log.events.len(), 9);
    assert_eq!(
        log.threads,
        vec!["140204".to_string(), "140207".to_string()]
    );
    let e = &log.events[2];
    assert_eq!(e.line, 4);
    assert_eq!(e.thread, 1);
    assert_eq!(e.action, LogAction::Allocate);
    assert_eq!(e.ptr, 0x7f5a2c200000);
    assert_eq!(e.size, 2 * MIB);
    assert_eq!(e.stream, 0x5581e2c0);
    assert_eq!(
        e.time_us,
        Some(((14 * 60 + 3) * 60 + 22) * 1_000_000 + 124_010)
    );
    // The cross-thread free belongs to the first allocation; the pointer is reused after.
    assert_eq!(log.freed_allocation[3], Some(0));
    assert_eq!(log.freed_allocation[8], Some(5));
    assert_eq!(log.logged_failures, 1);
    assert_eq!(log.unmatched_frees, 0);
    assert_eq!(log.unfreed, 0);
    assert_eq!(log.peak_bytes, (MIB + 4096 + 2 * MIB) as u64);
    assert_eq!(
        log.logged_duration(),
        Some(std::time::Duration::from_micros(1744))
    );
}

#[test]
fn replays_a_hand_written_rmm_log_in_both_orders() {
    let log = EventLog::parse(SAMPLE_TEXT, "rmm_log_sample.csv").unwrap();
    for order in [ReplayOrder::Logged, ReplayOrder::Concurrent] {
        let pool = pool_on(device(), 16 * MIB);
        let r = replay(
            &log,
            &pool,
            &ReplayOptions {
                order,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(r.fits(), "{r}");
        assert_eq!(r.allocations, 4);
        assert_eq!(r.frees, 4);
        assert_eq!(r.threads, 2);
        assert_eq!(r.streams, 1);
        assert_eq!(r.logged_failures, 1);
        if order == ReplayOrder::Logged {
            assert_eq!(r.peak_bytes, log.peak_bytes);
            assert_eq!(r.peak_allocations, 3);
        }
        let text = r.to_string();
        assert!(text.contains("fit:        yes"), "{text}");
        pool.validate().unwrap();
    }
}

#[test]
fn rapids_logger_format_without_0x_and_unmatched_frees() {
    // Newer RMM (rapids-logger) prints pointers and streams without `0x`; a log that starts
    // mid-run frees pointers it never allocated.
    let text = "Thread,Time,Action,Pointer,Size,Stream\n\
                1,00:00:01.000001,free,7f0000000000,256,0\n\
                1,00:00:01.000002,allocate,7f0000100000,512,0\n\
                1,00:00:01.000003,allocate,7f0000200000,0,0\n\
                1,00:00:01.000004,free,7f0000100000,512,0\n\r\n";
    let log = EventLog::parse(text, "inline").unwrap();
    assert_eq!(log.events.len(), 4);
    assert_eq!(log.unmatched_frees, 1);
    assert_eq!(log.events[1].ptr, 0x7f0000100000);
    let pool = pool_on(device(), 2 * MIB);
    let r = replay(&log, &pool, &ReplayOptions::default()).unwrap();
    assert!(r.fits(), "{r}");
    assert_eq!((r.allocations, r.frees, r.skipped_frees), (1, 1, 1));
    assert_eq!(r.peak_bytes, 512);
}

fn expect_log_error(text: &str, line: Option<usize>, needle: &str) {
    match EventLog::parse(text, "bad.csv") {
        Err(e @ Error::EventLog { .. }) => {
            let msg = e.to_string();
            if let Error::EventLog { line: l, path, .. } = &e {
                assert_eq!(*l, line, "{msg}");
                assert_eq!(path, "bad.csv");
            }
            assert!(msg.contains("bad.csv"), "{msg}");
            if let Some(l) = line {
                assert!(msg.contains(&format!("line {l}")), "{msg}");
            }
            assert!(msg.contains(needle), "expected {needle:?} in: {msg}");
        }
        other => panic!("expected an EventLog error, got {other:?}"),
    }
}

#[test]
fn malformed_logs_name_the_line_and_what_was_expected() {
    const H: &str = "Thread,Time,Action,Pointer,Size,Stream\n";
    expect_log_error("", None, "empty");
    expect_log_error(
        "Thread,When,Action\n",
        Some(1),
        "expected `Thread,Time,Action,Pointer,Size,Stream`",
    );
    expect_log_error(
        &format!("{H}1,00:00:00.000001,allocate,0x100,256\n"),
        Some(2),
        "found 5 field(s)",
    );
    expect_log_error(
        &format!("{H}1,00:00:00.000001,allocate,0x100,256,0x0\n1,t,alloc,0x200,256,0x0\n"),
        Some(3),
        "found action `alloc`, expected `allocate`, `free` or `allocate failure`",
    );
    expect_log_error(
        &format!("{H}1,t,allocate,0xZZ,256,0x0\n"),
        Some(2),
        "found pointer `0xZZ`, expected a hexadecimal address",
    );
    expect_log_error(
        &format!("{H}1,t,allocate,0x100,-5,0x0\n"),
        Some(2),
        "found size `-5`, expected a byte count in decimal",
    );
    expect_log_error(
        &format!("{H}1,t,allocate,0x100,256,stream\n"),
        Some(2),
        "found stream `stream`",
    );
    expect_log_error(
        &format!("{H}1,t,allocate,0x100,256,0x0\n2,t,allocate,0x100,512,0x0\n"),
        Some(3),
        "still live (allocated at line 2",
    );
    // Reading a file that is not there names it.
    let e = EventLog::read("/nonexistent/rmm_log.dev0.csv").unwrap_err();
    assert!(
        e.to_string().contains("/nonexistent/rmm_log.dev0.csv"),
        "{e}"
    );
}

/// A log whose live bytes climb to `peak_gib` GiB in 1 GiB blocks, then go back to zero.
fn climbing_log(peak_gib: usize) -> String {
    let mut s = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    for i in 0..peak_gib {
        writeln!(
            s,
            "7,00:00:00.{i:06},allocate,{:#x},{GIB},0x0",
            (i + 1) << 32
        )
        .unwrap();
    }
    for i in 0..peak_gib {
        writeln!(s, "7,00:00:01.{i:06},free,{:#x},{GIB},0x0", (i + 1) << 32).unwrap();
    }
    s
}

#[test]
fn would_it_fit_on_a_40_gib_gpu() {
    let b = SimBackend::leak(SimConfig {
        devices: 1,
        capacity: 40 * GIB,
        mode: SimMemoryMode::Unbacked,
    })
    .unwrap();
    let d = Device::on(b, 0).unwrap();
    // 30 GiB live at the peak: fits in a pool that grows toward the device's 40 GiB.
    let fits = EventLog::parse(&climbing_log(30), "30GiB").unwrap();
    let pool = pool_on(d, 0);
    let r = replay(&fits, &pool, &ReplayOptions::default()).unwrap();
    assert!(r.fits(), "{r}");
    assert_eq!(r.peak_bytes, 30 * GIB as u64);
    assert!(r.reserved_bytes.unwrap() >= 30 * GIB as u64);
    drop(pool);
    // 50 GiB does not: the report names the line and the error.
    let too_big = EventLog::parse(&climbing_log(50), "50GiB").unwrap();
    let pool = pool_on(d, 0);
    let r = replay(&too_big, &pool, &ReplayOptions::default()).unwrap();
    assert!(!r.fits());
    let f = r.failure.clone().unwrap();
    assert_eq!(f.action, LogAction::Allocate);
    assert_eq!(f.bytes, GIB);
    // Line 42 is the 41st allocation: 40 GiB fit exactly.
    assert!((40..=42).contains(&f.line), "{r}");
    assert!(f.error.contains("out of memory"), "{}", f.error);
    assert!(r.to_string().contains("fit:        NO"), "{r}");
    // Everything the replay allocated was given back.
    pool.validate().unwrap();
    assert_eq!(pool.validate().unwrap().in_use, 0);
}

#[test]
fn an_inconsistent_hand_built_log_is_refused_not_replayed() {
    let mut log = EventLog::parse(SAMPLE_TEXT, "rmm_log_sample.csv").unwrap();
    log.freed_allocation[3] = Some(7);
    let pool = pool_on(device(), 2 * MIB);
    match replay(&log, &pool, &ReplayOptions::default()) {
        Err(Error::EventLog { problem, .. }) => {
            assert!(
                problem.contains("expected a free of an earlier allocation"),
                "{problem}"
            )
        }
        other => panic!("expected an EventLog error, got {other:?}"),
    }
    let mut log = EventLog::parse(SAMPLE_TEXT, "rmm_log_sample.csv").unwrap();
    log.threads.pop();
    assert!(replay(&log, &pool, &ReplayOptions::default()).is_err());
}
