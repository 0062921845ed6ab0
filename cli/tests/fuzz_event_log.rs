//! Fuzzing RMM's CSV log parser (issue 22): arbitrary text, arbitrary bytes, and logs made of
//! plausible and broken fields, both from memory (`EventLog::parse`) and from a file read a
//! line at a time (`EventLog::read`, `LogReader::open`) and, where a log parses, replays on
//! the unbacked simulated device (in memory and streamed). Every input ends in `Ok` or an
//! `Error::EventLog` naming the source, never a panic, in bounded time; the two agree.
//!
//! A fixed budget per target (`PROPTEST_CASES` raises it for a longer run).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use rmm::allocator::Device;
use rmm::allocator::Error;
use rmm::allocator::backend::{SimBackend, SimConfig, SimMemoryMode};
use rmm::allocator::event_log::{EventLog, LogReader};
use rmm::allocator::resource::CudaMemoryResource;
use rmm_cli::replay::{ReplayOptions, ReplayOrder, replay, replay_streamed};

/// The longest one input may take (parsing, scanning and replaying), far above what any
/// takes: a hang or a blow-up fails the test instead of stalling CI.
const BOUND: Duration = Duration::from_secs(5);

const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(96)
}

/// An unbacked simulated device of 40 GiB: replays touch no memory.
fn device() -> Device {
    static SIM: OnceLock<&'static SimBackend> = OnceLock::new();
    let sim = SIM.get_or_init(|| {
        SimBackend::leak(SimConfig {
            devices: 1,
            capacity: 40 << 30,
            mode: SimMemoryMode::Unbacked,
        })
        .expect("simulated backend")
    });
    Device::on(*sim, 0).expect("device 0")
}

/// Parses `text` both ways, checks they agree, and replays what parses.
fn exercise(text: &str) {
    let start = Instant::now();
    let parsed = EventLog::parse(text, "fuzz.csv");
    if let Err(e) = &parsed {
        assert!(
            matches!(e, Error::EventLog { .. }),
            "not a log error: {e:?}"
        );
        assert!(e.to_string().contains("fuzz.csv"), "{e}");
    }
    let dir = tempfile();
    let path = dir.join("fuzz.csv");
    std::fs::write(&path, text).expect("writing the log");
    let scanned = EventLog::read(&path);
    match (&parsed, &scanned) {
        (Ok(log), Ok(file)) => {
            log.check().expect("a parsed log is consistent");
            assert_eq!(file.events, log.events);
            assert_eq!(file.freed_allocation, log.freed_allocation);
            assert_eq!(file.peak_bytes, log.peak_bytes);
            assert_eq!(file.unmatched_frees, log.unmatched_frees);
            assert_eq!(file.logged_failures, log.logged_failures);
            assert_eq!(file.threads, log.threads);
            let resource = CudaMemoryResource::new(device());
            for order in [ReplayOrder::Logged, ReplayOrder::Concurrent] {
                let options = ReplayOptions {
                    order,
                    ..Default::default()
                };
                // A log that does not fit is a report, not an error; an error must say why.
                if let Err(e) = replay(log, &resource, &options) {
                    assert!(!e.to_string().is_empty());
                }
            }
            let streamed = LogReader::open(&path).expect("a log that parses opens");
            if let Err(e) = replay_streamed(streamed, &resource, &ReplayOptions::default()) {
                assert!(!e.to_string().is_empty());
            }
        }
        (Err(_), Err(e)) => {
            assert!(
                matches!(e, Error::EventLog { .. }),
                "not a log error: {e:?}"
            );
        }
        (p, s) => panic!(
            "the parsers disagree on {text:?}: parse {:?}, scan {:?}",
            p.as_ref().map(|l| l.events.len()),
            s.as_ref().map(|f| f.events.len())
        ),
    }
    let _ = std::fs::remove_file(&path);
    assert!(
        start.elapsed() < BOUND,
        "took {:?} on {text:?}",
        start.elapsed()
    );
}

thread_local! {
    /// The test's own directory for the scanned copies, removed when its thread ends.
    static SCRATCH: tempfile::TempDir = tempfile::Builder::new()
        .prefix("rmm-fuzz-log-")
        .tempdir()
        .expect("a temporary directory");
}

/// A directory of this test for the scanned copies.
fn tempfile() -> std::path::PathBuf {
    SCRATCH.with(|d| d.path().to_path_buf())
}

/// One field: plausible values, edge cases and junk.
fn field() -> impl Strategy<Value = String> {
    prop_oneof![
        // Threads, sizes, decimal numbers, huge ones.
        (0u64..8).prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        Just("18446744073709551616".to_string()),
        Just("-1".to_string()),
        // Pointers and streams, with and without 0x.
        (0u64..16).prop_map(|n| format!("0x{:x}", 0x7f00_0000_0000u64 + (n << 20))),
        (0u64..16).prop_map(|n| format!("{:x}", 0x7f00_0000_0000u64 + (n << 20))),
        any::<u64>().prop_map(|n| format!("0x{n:x}")),
        Just("0x".to_string()),
        // Times.
        (0u32..30, 0u32..70, 0u32..70, 0u32..2_000_000)
            .prop_map(|(h, m, s, f)| format!("{h:02}:{m:02}:{s:02}.{f:06}")),
        Just("99:99:99.999999999999".to_string()),
        // Actions.
        Just("allocate".to_string()),
        Just("free".to_string()),
        Just("allocate failure".to_string()),
        Just("ALLOCATE".to_string()),
        // Junk.
        "[ -~]{0,12}",
        "\\PC{0,6}",
        Just(String::new()),
        Just("\"quoted,comma\"".to_string()),
    ]
}

/// A line of 0 to 8 fields (6 is right), or one biased to be well formed.
fn line() -> impl Strategy<Value = String> {
    let sizes = prop_oneof![
        Just(0usize),
        Just(256),
        Just(4096),
        Just(1 << 20),
        Just(1 << 40),
        Just(usize::MAX)
    ];
    prop_oneof![
        prop::collection::vec(field(), 0..8).prop_map(|f| f.join(",")),
        (
            0u8..3,
            0u64..4,
            prop_oneof![Just("allocate"), Just("free"), Just("allocate failure")],
            0u64..8,
            sizes,
            0u64..3
        )
            .prop_map(|(t, us, action, p, size, s)| {
                format!(
                    "{t},00:00:01.{us:06},{action},0x{:x},{size},0x{s:x}",
                    0x7f00_0000_0000u64 + (p << 20)
                )
            }),
    ]
}

/// A log: a header (right, wrong or missing) and lines, with odd line endings.
fn log_text() -> impl Strategy<Value = String> {
    let header = prop_oneof![
        4 => Just(HEADER.to_string()),
        1 => Just("Thread,Time,Action,Pointer,Size".to_string()),
        1 => Just("Time,Thread,Action,Pointer,Size,Stream,Extra".to_string()),
        1 => Just(String::new()),
        1 => "[ -~]{0,40}",
    ];
    let ending = prop_oneof![Just("\n"), Just("\r\n"), Just("\r"), Just("\n\n")];
    (header, prop::collection::vec((line(), ending), 0..40)).prop_map(|(h, lines)| {
        let mut text = h;
        text.push('\n');
        for (l, e) in lines {
            text.push_str(&l);
            text.push_str(e);
        }
        text
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn arbitrary_text_is_a_log_or_an_error(text in "\\PC{0,400}") {
        exercise(&text);
    }

    #[test]
    fn arbitrary_bytes_are_a_log_or_an_error(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        exercise(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn logs_of_plausible_and_broken_fields_are_a_log_or_an_error(text in log_text()) {
        exercise(&text);
    }
}

#[test]
fn a_scanned_file_that_is_not_utf8_is_an_error_naming_it() {
    let path = tempfile().join("binary.csv");
    std::fs::write(
        &path,
        [
            HEADER.as_bytes(),
            b"\n1,00:00:01.0,allocate,0x1\xff,256,0x0\n",
        ]
        .concat(),
    )
    .unwrap();
    let e = EventLog::read(&path).unwrap_err();
    assert!(matches!(e, Error::EventLog { .. }), "{e:?}");
    assert!(e.to_string().contains("binary.csv line 2"), "{e}");
}
