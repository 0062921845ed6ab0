//! Replay of RMM-format logs: a hand-written RMM log, malformed logs, and "would this fit on
//! a 40 GiB GPU" on the unbacked simulated device.

use std::fmt::Write as _;
use std::sync::Arc;

use rmm::allocator::adaptor::LogAction;
use rmm::allocator::backend::{SimBackend, SimConfig, SimMemoryMode};
use rmm::allocator::event_log::EventLog;
use rmm::allocator::resource::{
    CudaMemoryResource, PoolMemoryResource, SharedResource, VirtualMemory,
};
use rmm::allocator::{Device, Error};
use rmm_cli::replay::{ReplayOptions, ReplayOrder, replay};

const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

/// Device 0 of the process-wide backend (`RMM_BACKEND` picks it: sim in CI, cuda on a GPU).
fn device() -> Device {
    Device::new(0).expect("device 0 of the process-wide backend")
}

/// A simulated device of its own, of `capacity` bytes, whose memory is addresses only.
fn unbacked_sim(capacity: usize) -> (&'static SimBackend, Device) {
    let b = SimBackend::leak(SimConfig {
        devices: 1,
        capacity,
        mode: SimMemoryMode::Unbacked,
    })
    .expect("a simulated device");
    (
        b,
        Device::on(b, 0).expect("device 0 of the simulated backend"),
    )
}

/// tests/data/rmm_log_sample.csv, embedded so the test binary can run from anywhere.
const SAMPLE_TEXT: &str = include_str!("data/rmm_log_sample.csv");

/// A directory of the test's own, removed when the returned guard goes.
fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("rmm-adaptor-replay-")
        .tempdir()
        .unwrap()
}

/// The sample written to a file of its own in `dir`, to read it the way a user would.
fn sample_path(dir: &std::path::Path) -> String {
    let path = dir.join("rmm_log_sample.csv");
    std::fs::write(&path, SAMPLE_TEXT).unwrap();
    path.to_str().unwrap().to_string()
}

fn pool_on(d: Device, initial: usize) -> PoolMemoryResource {
    PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)) as SharedResource)
        .initial_size(initial as u64)
        .build()
        .unwrap()
}

#[test]
fn parses_a_hand_written_rmm_log() {
    let scratch = scratch();
    let path = sample_path(scratch.path());
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
    let (_, d) = unbacked_sim(40 * GIB);
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

/// A log of `threads` threads, `allocations` allocations in all: each thread allocates, and
/// frees (one free in three is another thread's allocation), on two streams and the default
/// one; with a zero-byte allocation, a free of a pointer never allocated and a logged
/// failure. Written to a file line by line.
fn write_mixed_log(
    dir: &std::path::Path,
    name: &str,
    threads: u64,
    allocations: u64,
) -> std::path::PathBuf {
    use std::io::Write as _;
    let path = dir.join(name);
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    writeln!(f, "Thread,Time,Action,Pointer,Size,Stream").unwrap();
    writeln!(f, "1,10:00:00.000000,free,0xdead0000,256,0x0").unwrap();
    writeln!(f, "1,10:00:00.000000,allocate,0xbeef0000,0,0x0").unwrap();
    writeln!(
        f,
        "1,10:00:00.000000,allocate failure,0x0,1099511627776,0x0"
    )
    .unwrap();
    let mut live: Vec<(u64, u64)> = Vec::new();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for i in 0..allocations {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let thread = 1 + x % threads;
        let size = 256 << (x % 8);
        let stream = [0u64, 0x51, 0x52][(x % 3) as usize];
        let ptr = 0x1_0000_0000 + i * 0x10_0000;
        writeln!(
            f,
            "{thread},10:00:00.000001,allocate,{ptr:#x},{size},{stream:#x}"
        )
        .unwrap();
        live.push((ptr, size));
        if live.len() > 16 {
            let (p, s) = live.remove((x % 16) as usize);
            // One free in three on the next thread: a cross-thread free.
            let by = if x.is_multiple_of(3) {
                1 + (thread % threads)
            } else {
                thread
            };
            writeln!(f, "{by},10:00:00.000002,free,{p:#x},{s},{stream:#x}").unwrap();
        }
    }
    // The last 10 stay live (unfreed in the log).
    for (p, s) in live.drain(10..) {
        writeln!(f, "1,10:00:00.000003,free,{p:#x},{s},0x0").unwrap();
    }
    f.flush().unwrap();
    path
}

#[test]
fn a_streamed_replay_matches_the_in_memory_one() {
    use rmm::allocator::event_log::LogReader;
    use rmm_cli::replay::replay_streamed;
    let scratch = scratch();
    let path = write_mixed_log(scratch.path(), "mixed.csv", 4, 3000);
    let log = EventLog::read(&path).unwrap();
    // Unfreed: the ten left live, and the zero-byte allocation (never replayed).
    assert_eq!(
        (log.unmatched_frees, log.logged_failures, log.unfreed),
        (1, 1, 11)
    );
    for order in [ReplayOrder::Logged, ReplayOrder::Concurrent] {
        let options = ReplayOptions {
            order,
            ..Default::default()
        };
        let pool = pool_on(device(), 64 * MIB);
        let whole = replay(&log, &pool, &options).unwrap();
        assert_eq!(pool.validate().unwrap().in_use, 0);
        let streamed = replay_streamed(LogReader::open(&path).unwrap(), &pool, &options).unwrap();
        assert_eq!(pool.validate().unwrap().in_use, 0, "all given back");
        assert!(whole.fits() && streamed.fits(), "{streamed}");
        assert_eq!(
            (streamed.allocations, streamed.frees, streamed.streams),
            (whole.allocations, whole.frees, whole.streams)
        );
        assert_eq!(streamed.streams, 2, "0x51 and 0x52");
        assert_eq!(streamed.events, whole.events);
        assert_eq!(streamed.logged_peak_bytes, whole.logged_peak_bytes);
        assert_eq!(
            (
                streamed.skipped_frees,
                streamed.logged_failures,
                streamed.unfreed
            ),
            (log.unmatched_frees, log.logged_failures, log.unfreed)
        );
        assert_eq!(streamed.logged_threads, 4);
        assert_eq!(streamed.order, order);
        match order {
            // One thread in log order: exactly the logged peak.
            ReplayOrder::Logged => {
                assert_eq!(streamed.threads, 1);
                assert_eq!(streamed.peak_bytes, log.peak_bytes);
                assert_eq!(streamed.peak_allocations, whole.peak_allocations);
            }
            ReplayOrder::Concurrent => assert_eq!(streamed.threads, 4),
        }
    }
}

#[test]
fn a_streamed_replay_that_does_not_fit_reports_it_and_gives_everything_back() {
    use rmm::allocator::event_log::LogReader;
    use rmm_cli::replay::replay_streamed;
    let (_, d) = unbacked_sim(40 * GIB);
    let scratch = scratch();
    let dir = scratch.path();
    let path = dir.join("climb50.csv");
    std::fs::write(&path, climbing_log(50)).unwrap();
    for order in [ReplayOrder::Logged, ReplayOrder::Concurrent] {
        let pool = pool_on(d, 0);
        let r = replay_streamed(
            LogReader::open(&path).unwrap(),
            &pool,
            &ReplayOptions {
                order,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(!r.fits(), "{r}");
        let f = r.failure.clone().unwrap();
        assert_eq!((f.action, f.bytes), (LogAction::Allocate, GIB));
        assert!((40..=42).contains(&f.line), "{r}");
        // The failed line's logged time: line k is at 00:00:00.(k - 2).
        assert_eq!(f.time_us, Some(f.line as u64 - 2), "{r}");
        // The whole log's figures, though the replay stopped at the failure.
        assert_eq!(r.logged_peak_bytes, 50 * GIB as u64);
        assert_eq!(r.events, 100);
        assert_eq!(pool.validate().unwrap().in_use, 0, "{order}");
    }
    // A malformed line stops the replay with its error, naming it, after what was replayed
    // has been given back.
    let bad = dir.join("bad-stream.csv");
    std::fs::write(
        &bad,
        "Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.0,allocate,0x100,256,0x0\n1,x,allocate\n",
    )
    .unwrap();
    for order in [ReplayOrder::Logged, ReplayOrder::Concurrent] {
        let pool = pool_on(d, 0);
        let options = ReplayOptions {
            order,
            ..Default::default()
        };
        let err = replay_streamed(LogReader::open(&bad).unwrap(), &pool, &options)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("bad-stream.csv line 3") && err.contains("found 3 field(s)"),
            "{err}"
        );
        assert_eq!(pool.validate().unwrap().in_use, 0, "{order}");
    }
    let err = LogReader::open(dir.join("missing.csv"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("missing.csv") && err.contains("opening the log failed"),
        "{err}"
    );
}

/// The process's peak resident memory (`VmHWM`), in KiB.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn a_streamed_replay_holds_memory_independent_of_the_log_length() {
    use rmm::allocator::event_log::LogReader;
    use rmm_cli::replay::replay_streamed;
    let (_, d) = unbacked_sim(40 * GIB);
    // 600 000 lines (about 30 MB of text); at most 17 allocations live at once. The replay's
    // own memory (queues, thread stacks and their malloc arenas) does not depend on that.
    let scratch = scratch();
    let path = write_mixed_log(scratch.path(), "long.csv", 8, 300_000);
    let before = peak_rss_kib();
    let pool = pool_on(d, 64 * MIB);
    let r = replay_streamed(
        LogReader::open(&path).unwrap(),
        &pool,
        &ReplayOptions {
            order: ReplayOrder::Concurrent,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(r.fits(), "{r}");
    assert_eq!(r.allocations, 300_000);
    let streamed_kib = peak_rss_kib().saturating_sub(before);
    assert!(
        streamed_kib < 40 << 10,
        "the streamed replay grew the process by {streamed_kib} KiB"
    );
    // The control: the whole log in memory (its text and its events) takes far more, so the
    // measure can fail.
    let after_stream = peak_rss_kib();
    let log = EventLog::parse(&std::fs::read_to_string(&path).unwrap(), "long.csv").unwrap();
    let whole_kib = peak_rss_kib().saturating_sub(after_stream);
    assert_eq!(log.events.len(), r.events);
    assert!(
        whole_kib > 2 * streamed_kib.max(8 << 10),
        "reading the whole log grew the process by only {whole_kib} KiB (streamed: {streamed_kib})"
    );
}

#[test]
fn an_impossible_time_is_an_error_naming_the_line_and_the_value() {
    const H: &str = "Thread,Time,Action,Pointer,Size,Stream\n";
    let scratch = scratch();
    let dir = scratch.path();
    for time in [
        "99:99:99",
        "24:00:00.000000",
        "10:60:00.000000",
        "10:00:61.000000",
        "10:00",
        "10:00:00.12x",
        "10:00:00.",
        "+1:00:00",
        "10:00:00:00:00",
    ] {
        let text =
            format!("{H}1,10:00:00.000000,allocate,0x100,256,0x0\n1,{time},free,0x100,256,0x0\n");
        expect_log_error(&text, Some(3), &format!("found time `{time}`"));
        // From a file, a line at a time: the same.
        let path = dir.join("bad-time.csv");
        std::fs::write(&path, &text).unwrap();
        let e = EventLog::read(&path).unwrap_err().to_string();
        assert!(
            e.contains("bad-time.csv line 3") && e.contains(&format!("found time `{time}`")),
            "{e}"
        );
    }
    // Times of day (a leap second, no fraction, more than six digits), and fields that hold
    // no time at all (a log without times).
    for (time, us) in [
        ("23:59:60.999999", Some(86_400_999_999)),
        ("7:05:09", Some(((7 * 60 + 5) * 60 + 9) * 1_000_000)),
        ("00:00:01.1234567", Some(1_123_456)),
        ("00:00:01:5", Some(1_500_000)),
        ("x", None),
        ("", None),
    ] {
        let log = EventLog::parse(&format!("{H}1,{time},allocate,0x100,256,0x0\n"), "t").unwrap();
        assert_eq!(log.events[0].time_us, us, "{time}");
    }
}

#[test]
fn a_line_past_the_limit_is_an_error_naming_it_and_the_limit() {
    // A line of a megabyte, without an end: RMM's are about 100 bytes.
    let mut text = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    text.extend(std::iter::repeat_n('1', 1 << 20));
    expect_log_error(&text, Some(2), "found a line longer than 4096 bytes");
}

#[test]
fn an_endless_input_is_an_error_at_the_limit_not_a_read_that_never_ends() {
    use rmm::allocator::event_log::LogReader;
    // An input without line ends, and without an end at all: stops at the limit.
    let zeros = std::io::BufReader::new(std::io::repeat(0));
    let e = LogReader::new(zeros, "zeros").unwrap_err().to_string();
    assert!(
        e.contains("zeros line 1") && e.contains("longer than 4096 bytes"),
        "{e}"
    );
    if std::path::Path::new("/dev/zero").exists() {
        let e = EventLog::read("/dev/zero").unwrap_err().to_string();
        assert!(e.contains("/dev/zero line 1"), "{e}");
    }
}

/// A resource over the simulated device that counts the threads that call it.
#[derive(Debug)]
struct ThreadCounting {
    inner: CudaMemoryResource,
    threads: std::sync::Mutex<std::collections::HashSet<std::thread::ThreadId>>,
}

impl ThreadCounting {
    fn new(d: Device) -> Self {
        ThreadCounting {
            inner: CudaMemoryResource::new(d),
            threads: std::sync::Mutex::new(std::collections::HashSet::new()),
        }
    }

    fn saw(&self) {
        self.threads
            .lock()
            .unwrap()
            .insert(std::thread::current().id());
    }

    /// The threads seen since the last call.
    fn take(&self) -> usize {
        self.threads.lock().unwrap().drain().count()
    }
}

impl rmm::allocator::resource::DeviceMemoryResource for ThreadCounting {
    fn allocate(
        &self,
        bytes: usize,
        stream: rmm::allocator::StreamView,
    ) -> rmm::allocator::Result<rmm::allocator::backend::DevicePtr> {
        self.saw();
        self.inner.allocate(bytes, stream)
    }

    fn deallocate(
        &self,
        ptr: rmm::allocator::backend::DevicePtr,
        bytes: usize,
        stream: rmm::allocator::StreamView,
    ) -> rmm::allocator::Result<()> {
        self.saw();
        self.inner.deallocate(ptr, bytes, stream)
    }

    fn device(&self) -> Device {
        self.inner.device()
    }

    fn name(&self) -> &'static str {
        "thread_counting"
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A log of `threads` threads, each allocating 4 KiB and freeing it; with `cross`, each
/// thread after the first frees the one before it's allocation instead (the first's is freed
/// by the last), so every free waits for another thread.
fn many_threads_log(threads: u64, cross: bool) -> String {
    let mut s = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    let ptr = |t: u64| (t + 1) << 20;
    for t in 0..threads {
        writeln!(s, "{t},10:00:00.000000,allocate,{:#x},4096,0x0", ptr(t)).unwrap();
        let (freed, by) = match (cross, t) {
            (false, _) => (t, t),
            (true, 0) => continue,
            (true, _) => (t - 1, t),
        };
        writeln!(s, "{by},10:00:00.000001,free,{:#x},4096,0x0", ptr(freed)).unwrap();
    }
    if cross {
        writeln!(s, "0,10:00:00.000002,free,{:#x},4096,0x0", ptr(threads - 1)).unwrap();
    }
    s
}

/// The most threads a replay runs on by default: the machine's hardware threads, and at
/// least 64.
fn default_thread_limit() -> usize {
    std::thread::available_parallelism()
        .map_or(64, std::num::NonZeroUsize::get)
        .max(64)
}

#[test]
fn a_log_of_50_000_threads_replays_on_a_bounded_number_of_threads() {
    let log = EventLog::parse(&many_threads_log(50_000, false), "threads.csv").unwrap();
    assert_eq!(log.threads.len(), 50_000);
    let resource = ThreadCounting::new(device());
    let limit = default_thread_limit();
    // Concurrent first: before the bound, one thread per logged thread, each gone after its
    // two events.
    for order in [ReplayOrder::Concurrent, ReplayOrder::Logged] {
        let options = ReplayOptions {
            order,
            ..Default::default()
        };
        let r = replay(&log, &resource, &options).unwrap();
        assert!(r.fits(), "{r}");
        assert_eq!((r.allocations, r.frees), (50_000, 50_000), "{order}");
        let used = resource.take();
        assert!(
            used <= limit && r.threads == used,
            "{order}: {used} threads replayed a log of 50 000 threads (the limit: {limit}); \
             the report says {}",
            r.threads
        );
    }
}

#[test]
fn logged_threads_sharing_replay_threads_keep_their_order_and_cross_thread_frees() {
    use rmm::allocator::event_log::LogReader;
    use rmm_cli::replay::replay_streamed;
    // Every free waits for another logged thread's allocation, whichever replay thread it is
    // on; three replay threads for 600 logged threads.
    let text = many_threads_log(600, true);
    let log = EventLog::parse(&text, "cross.csv").unwrap();
    let resource = ThreadCounting::new(device());
    for order in [ReplayOrder::Logged, ReplayOrder::Concurrent] {
        let options = ReplayOptions {
            order,
            max_threads: 3,
            ..Default::default()
        };
        let whole = replay(&log, &resource, &options).unwrap();
        assert_eq!(resource.take(), 3, "{order}");
        let streamed = replay_streamed(
            LogReader::new(text.as_bytes(), "cross.csv").unwrap(),
            &resource,
            &options,
        )
        .unwrap();
        let used = resource.take();
        for r in [&whole, &streamed] {
            assert!(r.fits(), "{r}");
            assert_eq!((r.allocations, r.frees, r.unfreed), (600, 600, 0), "{r}");
            assert_eq!(r.logged_threads, 600, "{r}");
        }
        assert_eq!(whole.threads, 3);
        match order {
            // Each allocation is freed by the next thread before the one after allocates:
            // never more than two live, as logged.
            ReplayOrder::Logged => {
                assert_eq!(whole.peak_allocations, 2);
                assert_eq!(streamed.peak_allocations, 2);
                assert_eq!((streamed.threads, used), (1, 1), "the calling thread");
            }
            ReplayOrder::Concurrent => {
                assert_eq!((streamed.threads, used), (3, 3));
                assert!(
                    streamed
                        .to_string()
                        .contains("3 thread(s) for 600 logged threads"),
                    "{streamed}"
                );
            }
        }
    }
}

#[test]
fn a_streamed_log_of_50_000_threads_replays_on_a_bounded_number_of_threads() {
    use rmm::allocator::event_log::LogReader;
    use rmm_cli::replay::replay_streamed;
    let text = many_threads_log(50_000, false);
    let resource = ThreadCounting::new(device());
    let options = ReplayOptions {
        order: ReplayOrder::Concurrent,
        ..Default::default()
    };
    let log = LogReader::new(text.as_bytes(), "threads.csv").unwrap();
    let r = replay_streamed(log, &resource, &options).unwrap();
    assert!(r.fits(), "{r}");
    assert_eq!(
        (r.allocations, r.frees, r.logged_threads),
        (50_000, 50_000, 50_000)
    );
    let used = resource.take();
    assert!(
        used <= default_thread_limit() && used == r.threads,
        "{used}: {r}"
    );
}

/// The allocation log of a real training loop, replayed: a GPT-2-size decoder in PyTorch
/// 2.11 on rmm-rs (AdamW, bf16 autocast, batch 8, a new sequence length in [64, 1024] each
/// step), recorded on an H200 through rmm-rs's logging adaptor: its first 30 000 events (10
/// steps, two threads: forward and PyTorch's autograd thread). Replayed in logged order on a
/// simulated device of the H200's size, from a 1 GiB pool as in that run.
#[test]
fn a_recorded_pytorch_training_log_replays_within_the_overhead() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/gpt2_training_log.csv"
    );
    let log = EventLog::read(path).unwrap();
    let (_, d) = unbacked_sim(141 * GIB);
    let options = ReplayOptions {
        order: ReplayOrder::Logged,
        ..ReplayOptions::default()
    };
    let mut reserved = Vec::new();
    // The limit under test and the slack of whole chunks it may leave (as in the allocator's
    // pool_footprint tests).
    const OVERHEAD: f64 = 0.05;
    const SLACK: u64 = 18 * MIB as u64;
    for limit in [None, Some(OVERHEAD)] {
        let mut builder = PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
            .initial_size(GIB as u64)
            .virtual_memory(VirtualMemory::On);
        if let Some(f) = limit {
            builder = builder.max_overhead(f);
        }
        let pool = builder.build().unwrap();
        let report = replay(&log, &pool, &options).unwrap();
        assert!(report.failure.is_none(), "{:?}", report.failure);
        assert_eq!(report.peak_bytes, report.logged_peak_bytes);
        reserved.push((report.peak_bytes, pool.peak_pool_size()));
    }
    let bound = |peak: u64| (peak as f64 * (1.0 + OVERHEAD)) as u64 + SLACK;
    let (peak, without) = reserved[0];
    assert!(
        without > bound(peak),
        "without a limit {without} for a peak of {peak}: the log no longer shows the problem"
    );
    let (peak, with) = reserved[1];
    assert!(
        with <= bound(peak),
        "with max_overhead {OVERHEAD}: {with} reserved for a peak of {peak} ({:.3}×)",
        with as f64 / peak as f64
    );
}
