//! LoggingResourceAdaptor: RMM's CSV format (the round trip log → replay is in the CLI crate's
//! `replay_round_trip.rs`).

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::{MIB, device};
use rmm_allocator::adaptor::LogAction;
use rmm_allocator::adaptor::{
    LOG_HEADER, LimitingResourceAdaptor, LoggingResourceAdaptor, log_file_path,
};
use rmm_allocator::event_log::EventLog;
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
