//! LoggingResourceAdaptor under load and at thread boundaries: per-thread buffers and the
//! writer thread lose, duplicate and reorder nothing; records of threads that have exited (or
//! are exiting) reach the file; a write error is an error, not a panic.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Barrier, Mutex};

use common::{MIB, device};
use crossbeam_channel::bounded;
use rmm_allocator::StreamView;
use rmm_allocator::adaptor::LogAction;
use rmm_allocator::adaptor::log_thread_id;
use rmm_allocator::adaptor::{LOG_HEADER, LoggingResourceAdaptor};
use rmm_allocator::backend::DevicePtr;
use rmm_allocator::event_log::EventLog;
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::SharedResource;
use rmm_allocator::resource::{CudaMemoryResource, PoolMemoryResource};

const S: StreamView = StreamView::DEFAULT;

fn cuda() -> SharedResource {
    Arc::new(CudaMemoryResource::new(device()))
}

fn pool() -> SharedResource {
    Arc::new(PoolMemoryResource::new(cuda(), 64 * MIB, Some(512 * MIB)).unwrap())
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rmm-logging-load-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

type Expected = Vec<(LogAction, u64, usize)>;

/// The events of each logged thread (by its id in the log), in file order.
fn per_thread(log: &EventLog) -> HashMap<String, Expected> {
    let mut out: HashMap<String, Expected> = HashMap::new();
    for e in &log.events {
        out.entry(log.threads[e.thread].clone())
            .or_default()
            .push((e.action, e.ptr, e.size));
    }
    out
}

/// Logs `(action, ptr, size)` of what `mr` did into `expected`.
fn alloc(mr: &dyn DeviceMemoryResource, size: usize, expected: &mut Expected) -> DevicePtr {
    let p = mr.allocate(size, S).unwrap();
    expected.push((LogAction::Allocate, p.addr(), size));
    p
}

fn free(mr: &dyn DeviceMemoryResource, p: DevicePtr, size: usize, expected: &mut Expected) {
    expected.push((LogAction::Free, p.addr(), size));
    mr.deallocate(p, size, S).unwrap();
}

#[test]
fn eight_threads_lose_duplicate_and_reorder_nothing() {
    const THREADS: usize = 8;
    const PAIRS: usize = 20_000;
    let dir = temp_dir("eight");
    let path = dir.join("log.csv");
    let log = Arc::new(LoggingResourceAdaptor::new(pool(), &path).unwrap());
    let barrier = Arc::new(Barrier::new(THREADS));
    // Every 16th block is freed by the next thread: cross-thread frees.
    let channels: Vec<_> = (0..THREADS)
        .map(|_| bounded::<(DevicePtr, usize)>(64))
        .collect();
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let log = Arc::clone(&log);
            let barrier = Arc::clone(&barrier);
            let inbox = channels[t].1.clone();
            let next = channels[(t + 1) % THREADS].0.clone();
            std::thread::spawn(move || {
                let mut expected = Expected::new();
                let mut live: Vec<(DevicePtr, usize)> = Vec::new();
                barrier.wait();
                for i in 0..PAIRS {
                    // Sizes differ between threads and steps.
                    let size = 256 * (1 + (i * 7 + t) % 97) + t;
                    let p = alloc(&*log, size, &mut expected);
                    if i % 16 == 0 {
                        if let Err(e) = next.try_send((p, size)) {
                            live.push(e.into_inner());
                        }
                    } else {
                        live.push((p, size));
                    }
                    if live.len() > 3 {
                        let (p, s) = live.remove(0);
                        free(&*log, p, s, &mut expected);
                    }
                    while let Ok((p, s)) = inbox.try_recv() {
                        free(&*log, p, s, &mut expected);
                    }
                }
                for (p, s) in live {
                    free(&*log, p, s, &mut expected);
                }
                drop(next);
                // Everyone has stopped sending: free what is still in the inbox.
                barrier.wait();
                while let Ok((p, s)) = inbox.try_recv() {
                    free(&*log, p, s, &mut expected);
                }
                (log_thread_id().to_string(), expected)
            })
        })
        .collect();
    let expected: HashMap<String, Expected> =
        handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(expected.len(), THREADS);
    // The last handle: dropping it flushes and stops the writer.
    drop(Arc::into_inner(log).expect("the only handle"));

    let parsed = EventLog::read(&path).unwrap();
    assert_eq!(parsed.events.len(), THREADS * PAIRS * 2);
    assert_eq!(parsed.threads.len(), THREADS);
    // In file order, every pointer is freed before it is handed out again (parse checks it)
    // and every free follows its allocation, across threads.
    assert_eq!(parsed.unmatched_frees, 0);
    assert_eq!(parsed.unfreed, 0);
    assert_eq!(parsed.logged_failures, 0);
    let logged = per_thread(&parsed);
    for (thread, want) in &expected {
        let got = logged
            .get(thread)
            .unwrap_or_else(|| panic!("thread {thread} is missing from the log"));
        assert_eq!(got.len(), want.len(), "thread {thread}");
        if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
            panic!(
                "thread {thread}: event {i} is {:?} in the log, expected {:?}",
                got[i], want[i]
            );
        }
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn flush_writes_records_of_exited_and_idle_threads() {
    let dir = temp_dir("exited");
    let path = dir.join("log.csv");
    let log = Arc::new(LoggingResourceAdaptor::new(cuda(), &path).unwrap());

    // One thread logs a few events (a partly filled buffer) and exits before the flush.
    let l = Arc::clone(&log);
    let (exited_id, exited) = std::thread::spawn(move || {
        let mut e = Expected::new();
        let a = alloc(&*l, 4096, &mut e);
        let b = alloc(&*l, 8192, &mut e);
        free(&*l, a, 4096, &mut e);
        let _c = alloc(&*l, 512, &mut e); // never freed
        free(&*l, b, 8192, &mut e);
        (log_thread_id().to_string(), e)
    })
    .join()
    .unwrap();

    // Many short-lived threads, one event pair each.
    let short: Vec<(String, Expected)> = (0..64)
        .map(|i| {
            let l = Arc::clone(&log);
            std::thread::spawn(move || {
                let mut e = Expected::new();
                let p = alloc(&*l, 256 * (i + 1), &mut e);
                free(&*l, p, 256 * (i + 1), &mut e);
                (log_thread_id().to_string(), e)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();

    // One thread logs and stays alive, idle, while the main thread flushes.
    let (logged_tx, logged_rx) = bounded::<(String, Expected)>(1);
    let (release_tx, release_rx) = bounded::<()>(1);
    let l = Arc::clone(&log);
    let idle = std::thread::spawn(move || {
        let mut e = Expected::new();
        let p = alloc(&*l, 1 << 20, &mut e);
        logged_tx.send((log_thread_id().to_string(), e)).unwrap();
        release_rx.recv().unwrap();
        l.deallocate(p, 1 << 20, S).unwrap();
    });
    let (idle_id, idle_events) = logged_rx.recv().unwrap();

    log.flush().unwrap();
    let parsed = EventLog::read(&path).unwrap();
    let logged = per_thread(&parsed);
    assert_eq!(logged.get(&exited_id), Some(&exited), "the exited thread");
    for (id, e) in &short {
        assert_eq!(logged.get(id), Some(e), "short-lived thread {id}");
    }
    assert_eq!(logged.get(&idle_id), Some(&idle_events), "the idle thread");
    assert_eq!(parsed.events.len(), 5 + 64 * 2 + 1);

    release_tx.send(()).unwrap();
    idle.join().unwrap();
    drop(log);
    let parsed = EventLog::read(&path).unwrap();
    assert_eq!(parsed.events.len(), 5 + 64 * 2 + 2);
    assert_eq!(parsed.unfreed, 1, "the 512-byte block");
    std::fs::remove_dir_all(dir).ok();
}

/// Frees its block through the adaptor when the thread's locals are destroyed.
struct FreeAtExit(Option<(Arc<LoggingResourceAdaptor>, DevicePtr)>);

impl Drop for FreeAtExit {
    fn drop(&mut self) {
        if let Some((log, p)) = self.0.take() {
            log.deallocate(p, 4096, S).unwrap();
        }
    }
}

thread_local! {
    static AT_EXIT: std::cell::RefCell<FreeAtExit> = const { std::cell::RefCell::new(FreeAtExit(None)) };
}

#[test]
fn a_free_while_the_thread_exits_is_logged() {
    let dir = temp_dir("atexit");
    let path = dir.join("log.csv");
    let log = Arc::new(LoggingResourceAdaptor::new(cuda(), &path).unwrap());
    let l = Arc::clone(&log);
    let (thread, p) = std::thread::spawn(move || {
        // Touch AT_EXIT first: thread-locals are destroyed in the reverse order of first use,
        // so its destructor runs after the adaptor's per-thread buffers are gone.
        AT_EXIT.with(|_| ());
        let p = l.allocate(4096, S).unwrap();
        AT_EXIT.with(|f| f.borrow_mut().0 = Some((Arc::clone(&l), p)));
        (log_thread_id().to_string(), p.addr())
    })
    .join()
    .unwrap();
    drop(Arc::into_inner(log).expect("the thread's handle is gone"));
    let parsed = EventLog::read(&path).unwrap();
    let logged = per_thread(&parsed);
    assert_eq!(
        logged.get(&thread),
        Some(&vec![
            (LogAction::Allocate, p, 4096),
            (LogAction::Free, p, 4096)
        ])
    );
    assert_eq!(parsed.unfreed, 0);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn two_adaptors_on_the_same_threads_keep_their_logs_apart() {
    let dir = temp_dir("two");
    let (pa, pb) = (dir.join("a.csv"), dir.join("b.csv"));
    let a = Arc::new(LoggingResourceAdaptor::new(pool(), &pa).unwrap());
    let b = Arc::new(LoggingResourceAdaptor::new(pool(), &pb).unwrap());
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let (a, b) = (Arc::clone(&a), Arc::clone(&b));
            std::thread::spawn(move || {
                let (mut ea, mut eb) = (Expected::new(), Expected::new());
                for i in 0..3000 {
                    let pa = alloc(&*a, 1000 + i, &mut ea);
                    let pb = alloc(&*b, 2000 + i + t, &mut eb);
                    free(&*a, pa, 1000 + i, &mut ea);
                    free(&*b, pb, 2000 + i + t, &mut eb);
                }
                (log_thread_id().to_string(), ea, eb)
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    a.flush().unwrap();
    drop(b);
    let (la, lb) = (EventLog::read(&pa).unwrap(), EventLog::read(&pb).unwrap());
    assert_eq!(la.events.len(), 4 * 6000);
    assert_eq!(lb.events.len(), 4 * 6000);
    let (ta, tb) = (per_thread(&la), per_thread(&lb));
    for (id, ea, eb) in &results {
        assert_eq!(ta.get(id), Some(ea), "{id} in a");
        assert_eq!(tb.get(id), Some(eb), "{id} in b");
    }
    drop(a);
    std::fs::remove_dir_all(dir).ok();
}

/// A sink that takes `room` bytes and then fails every write.
struct Failing {
    room: usize,
}

impl Write for Failing {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.room == 0 {
            return Err(std::io::Error::other("disk full"));
        }
        let n = buf.len().min(self.room);
        self.room -= n;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_write_error_is_reported_by_flush_and_allocations_go_on() {
    let log = LoggingResourceAdaptor::to_writer(
        cuda(),
        Failing {
            room: LOG_HEADER.len() + 1 + 1000,
        },
    )
    .unwrap();
    log.flush().unwrap();
    // About 70 bytes a line: far more than fits.
    for _ in 0..5000 {
        let p = log.allocate(4096, S).unwrap();
        log.deallocate(p, 4096, S).unwrap();
    }
    let e = log.flush().unwrap_err().to_string();
    assert!(
        e.contains("logging stopped") && e.contains("disk full"),
        "{e}"
    );
    // Later flushes report it too; allocations still work.
    let p = log.allocate(4096, S).unwrap();
    log.deallocate(p, 4096, S).unwrap();
    assert!(log.flush().is_err());
    drop(log); // logs the error, does not panic
}

/// A sink whose content the test can read.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn auto_flush_writes_each_line_before_the_call_returns() {
    let sink = Shared::default();
    let log = LoggingResourceAdaptor::to_writer(cuda(), sink.clone())
        .unwrap()
        .auto_flush(true);
    let lines = || String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
    let p = log.allocate(4096, S).unwrap();
    assert_eq!(lines().lines().count(), 2, "{}", lines());
    log.deallocate(p, 4096, S).unwrap();
    let text = lines();
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(text.lines().nth(2).unwrap().contains(",free,"), "{text}");
    drop(log);
}

/// Microseconds since midnight (UTC) now.
fn now_us_of_day() -> u64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    (d.as_secs() % 86_400) * 1_000_000 + u64::from(d.subsec_micros())
}

#[test]
fn times_are_the_wall_clock_times_of_the_calls() {
    let sink = Shared::default();
    let log = LoggingResourceAdaptor::to_writer(cuda(), sink.clone()).unwrap();
    // Spaced out: more than a coarse-clock tick (at most 10 ms) apart, so every allocation
    // reads the precise clock.
    let mut spaced = Vec::new();
    for _ in 0..5 {
        std::thread::sleep(std::time::Duration::from_millis(12));
        let before = now_us_of_day();
        let p = log.allocate(4096, S).unwrap();
        let after = now_us_of_day();
        spaced.push((before, after));
        log.deallocate(p, 4096, S).unwrap();
    }
    // A burst: most records get interpolated times.
    let burst_start = now_us_of_day();
    for _ in 0..20_000 {
        let p = log.allocate(256, S).unwrap();
        log.deallocate(p, 256, S).unwrap();
    }
    let burst_end = now_us_of_day();
    log.flush().unwrap();
    let flushed = now_us_of_day();
    let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
    let parsed = EventLog::parse(&text, "sink").unwrap();
    // Times of day wrap at midnight: put every one on the test's own time line, where a time
    // well before the start is of the next day, so that a run across midnight checks as much
    // as any other.
    let start = spaced[0].0;
    let line = |us: u64| {
        if us + 3_600_000_000 < start {
            us + 86_400_000_000
        } else {
            us
        }
    };
    let times: Vec<u64> = parsed
        .events
        .iter()
        .map(|e| line(e.time_us.unwrap()))
        .collect();
    assert_eq!(times.len(), 10 + 40_000);
    let spaced: Vec<(u64, u64)> = spaced.iter().map(|&(b, a)| (line(b), line(a))).collect();
    let (burst_start, burst_end, flushed) = (line(burst_start), line(burst_end), line(flushed));
    for (i, (before, after)) in spaced.iter().enumerate() {
        let t = times[2 * i];
        // Exact: the log shows microseconds.
        assert!(
            *before <= t && t <= *after,
            "allocation {i} logged at {t}, called between {before} and {after}"
        );
    }
    // Every 16th record (by sequence number: here, event index) reads the precise clock; the
    // others get the time of the last precise record or of their coarse-clock tick, if later.
    // So times never decrease here (one thread), and the precise ones are exact.
    for i in 10..times.len() {
        assert!(
            times[i - 1] <= times[i],
            "event {i} at {} after {}",
            times[i],
            times[i - 1]
        );
        if i % 16 == 0 {
            assert!(
                burst_start <= times[i] && times[i] <= burst_end,
                "event {i} logged at {}, the burst ran from {burst_start} to {burst_end}",
                times[i]
            );
        }
    }
    assert!(times[10] >= times[8] && times[times.len() - 1] <= flushed);
    drop(log);
}
