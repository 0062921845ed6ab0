//! Replaying memory event logs: parse a log in RMM's CSV format (RMM's own, or one written by
//! [`super::LoggingResourceAdaptor`]) and play it against any resource, one thread per logged
//! thread, reporting the wall time, the peak bytes in use and whether every allocation
//! succeeded. On the unbacked simulated device this answers "would this workload fit on a
//! 40 GiB GPU with this pool?" on any machine, as RMM's replay benchmark does.
//!
//! # Order
//! * [`ReplayOrder::Logged`] (the default, as RMM's replay benchmark): every event waits for
//!   the one before it in the log, whichever thread it belongs to. The live bytes go through
//!   exactly the values they had when the log was written, so the peak is the logged peak and
//!   "it fit" means it fits in that order. Hand-offs between threads are part of the wall time.
//! * [`ReplayOrder::Concurrent`]: each thread plays its own events in order as fast as it can;
//!   a free of a pointer allocated by another thread waits until that allocation has been
//!   replayed (the log's order says which allocation a free belongs to). Times the resource
//!   under contention; the peak may differ from the logged one.
//!
//! [`replay`] holds the whole [`EventLog`] in memory; [`replay_streamed`] reads a
//! [`LogFile`] as it replays it (memory independent of the log's length; in logged order on
//! one thread), which is what `rmm replay` uses.
//!
//! Logged streams are mapped to streams created for the replay (the default stream stays the
//! default stream), so cross-stream frees stay cross-stream. `allocate failure` lines are
//! counted and skipped, as are frees of pointers the log never allocated (a log that starts
//! mid-run) and zero-byte allocations.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{chain_names, find_in_chain};
use crate::backend::DevicePtr;
use crate::error::{Error, Result, fmt_bytes};
use crate::resource::{DeviceMemoryResource, PoolMemoryResource};
use crate::stream::{Stream, StreamView};

use super::logging::LOG_HEADER;

mod stream;
pub use stream::{LogFile, replay_streamed};

/// What a log line records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogAction {
    /// A successful allocation.
    Allocate,
    /// A free.
    Free,
    /// A failed allocation (`allocate failure`).
    AllocateFailure,
}

impl LogAction {
    /// The text in the log.
    pub const fn as_str(self) -> &'static str {
        match self {
            LogAction::Allocate => "allocate",
            LogAction::Free => "free",
            LogAction::AllocateFailure => "allocate failure",
        }
    }
}

impl fmt::Display for LogAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One line of a log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEvent {
    /// 1-based line number in the file.
    pub line: usize,
    /// Index into [`EventLog::threads`].
    pub thread: usize,
    /// Microseconds since midnight, when the `Time` field is `HH:MM:SS.ffffff`.
    pub time_us: Option<u64>,
    /// What happened.
    pub action: LogAction,
    /// The pointer (0 for failures).
    pub ptr: u64,
    /// Bytes.
    pub size: usize,
    /// The logged stream handle.
    pub stream: u64,
}

/// A parsed, checked log.
#[derive(Debug, Clone)]
pub struct EventLog {
    /// Where it came from (the path, or the name given to [`EventLog::parse`]).
    pub source: String,
    /// Every event, in log order.
    pub events: Vec<LogEvent>,
    /// The logged thread ids, in order of first appearance.
    pub threads: Vec<String>,
    /// For each event: for a free, the index of the allocation it frees (`None` when the log
    /// never allocated that pointer); for other events, `None`.
    pub freed_allocation: Vec<Option<usize>>,
    /// Peak of the bytes live in log order.
    pub peak_bytes: u64,
    /// Frees of pointers the log never allocated.
    pub unmatched_frees: usize,
    /// `allocate failure` lines.
    pub logged_failures: usize,
    /// Allocations never freed by the end of the log.
    pub unfreed: usize,
}

const FORMAT_HINT: &str = "Every line must be Thread,Time,Action,Pointer,Size,Stream as RMM's \
     logging_resource_adaptor (or rmm-rs's LoggingResourceAdaptor) writes it; fix or remove \
     the line";

fn parse_hex(text: &str) -> Option<u64> {
    let t = text.trim();
    let digits = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    if digits.is_empty() {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

/// `HH:MM:SS.ffffff` (or `HH:MM:SS:ffffff`, or without fraction) → microseconds since midnight.
fn parse_time(text: &str) -> Option<u64> {
    let t = text.trim();
    let (hms, frac) = match t.rfind(['.', ':']) {
        Some(i) if t[..i].matches(':').count() == 2 => (&t[..i], &t[i + 1..]),
        _ => (t, ""),
    };
    let mut parts = hms.split(':');
    let h: u64 = parts.next()?.parse().ok()?;
    let m: u64 = parts.next()?.parse().ok()?;
    let s: u64 = parts.next()?.parse().ok()?;
    if parts.next().is_some() || h > 23 || m > 59 || s > 60 {
        return None;
    }
    // Up to six digits of the fraction (microseconds), without allocating: logs have
    // millions of lines.
    let digits = &frac.as_bytes()[..frac.len().min(6)];
    let us = if digits.is_empty() {
        0
    } else {
        let v: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
        v * 10u64.pow(6 - digits.len() as u32)
    };
    Some(((h * 60 + m) * 60 + s) * 1_000_000 + us)
}

/// The most columns a log's header may have (RMM's has six).
const MAX_COLUMNS: usize = 16;

/// The allocation a free line frees.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Freed {
    /// Index of the allocation's event.
    pub(crate) event: usize,
    /// Its size.
    pub(crate) size: usize,
}

/// A live allocation while parsing.
#[derive(Debug, Clone, Copy)]
struct LiveAllocation {
    event: usize,
    line: usize,
    size: usize,
}

/// Reads a log one line at a time, checking each as [`EventLog::parse`] does, and keeps only
/// what it needs to (the threads, the live allocations, the counts): its memory grows with
/// the live allocations, not with the length of the log.
#[derive(Debug)]
pub(crate) struct LineParser {
    source: String,
    /// Columns of Thread, Time, Action, Pointer, Size, Stream.
    columns: [usize; 6],
    names: Vec<String>,
    thread_index: HashMap<String, usize>,
    /// The logged thread ids, in order of first appearance.
    pub(crate) threads: Vec<String>,
    live: HashMap<u64, LiveAllocation>,
    live_bytes: u64,
    /// Events read so far.
    pub(crate) events: usize,
    /// Peak of the bytes live in log order.
    pub(crate) peak_bytes: u64,
    /// Frees of pointers the log never allocated.
    pub(crate) unmatched_frees: usize,
    /// `allocate failure` lines.
    pub(crate) logged_failures: usize,
}

impl LineParser {
    /// The error for a log without a header.
    pub(crate) fn empty(source: &str) -> Error {
        Error::EventLog {
            path: source.to_string(),
            line: None,
            problem: "the log is empty".to_string(),
            hint: format!("A log starts with the header `{LOG_HEADER}`"),
        }
    }

    fn err(&self, line: usize, problem: String, hint: &str) -> Error {
        Error::EventLog {
            path: self.source.clone(),
            line: Some(line),
            problem,
            hint: hint.to_string(),
        }
    }

    /// A parser for the log whose header (at `header_line`) is `header`.
    pub(crate) fn new(source: &str, header_line: usize, header: &str) -> Result<LineParser> {
        let names: Vec<String> = header.split(',').map(|n| n.trim().to_string()).collect();
        let column = |name: &str| names.iter().position(|n| n == name);
        let mut parser = LineParser {
            source: source.to_string(),
            columns: [0; 6],
            names: Vec::new(),
            thread_index: HashMap::new(),
            threads: Vec::new(),
            live: HashMap::new(),
            live_bytes: 0,
            events: 0,
            peak_bytes: 0,
            unmatched_frees: 0,
            logged_failures: 0,
        };
        let (
            Some(c_thread),
            Some(c_time),
            Some(c_action),
            Some(c_ptr),
            Some(c_size),
            Some(c_stream),
        ) = (
            column("Thread"),
            column("Time"),
            column("Action"),
            column("Pointer"),
            column("Size"),
            column("Stream"),
        )
        else {
            return Err(parser.err(
                header_line,
                format!("found header `{header}`, expected `{LOG_HEADER}`"),
                "Give a log written by RMM's logging_resource_adaptor or rmm-rs's \
                 LoggingResourceAdaptor",
            ));
        };
        if names.len() > MAX_COLUMNS {
            return Err(parser.err(
                header_line,
                format!(
                    "found a header of {} columns, expected at most {MAX_COLUMNS} (`{LOG_HEADER}`)",
                    names.len()
                ),
                FORMAT_HINT,
            ));
        }
        parser.columns = [c_thread, c_time, c_action, c_ptr, c_size, c_stream];
        parser.names = names;
        Ok(parser)
    }

    /// Allocations live at this point of the log.
    pub(crate) fn live_allocations(&self) -> usize {
        self.live.len()
    }

    /// Parses and checks line `line_no` (not blank, without its line end): the event, and
    /// for a free of an allocation the log made, that allocation.
    pub(crate) fn line(&mut self, line_no: usize, line: &str) -> Result<(LogEvent, Option<Freed>)> {
        let [c_thread, c_time, c_action, c_ptr, c_size, c_stream] = self.columns;
        // The fields, without allocating (the header has at most MAX_COLUMNS).
        let mut fields = [""; MAX_COLUMNS];
        let mut count = 0;
        for field in line.split(',') {
            if let Some(slot) = fields.get_mut(count) {
                *slot = field.trim();
            }
            count += 1;
        }
        if count != self.names.len() {
            return Err(self.err(
                line_no,
                format!(
                    "found {} field(s) in `{line}`, expected {} ({})",
                    count,
                    self.names.len(),
                    self.names.join(",")
                ),
                FORMAT_HINT,
            ));
        }
        let thread_text = fields[c_thread];
        if thread_text.is_empty() {
            return Err(self.err(
                line_no,
                format!("found an empty Thread field in `{line}`, expected a thread id"),
                FORMAT_HINT,
            ));
        }
        let action = match fields[c_action] {
            "allocate" => LogAction::Allocate,
            "free" => LogAction::Free,
            "allocate failure" => LogAction::AllocateFailure,
            other => {
                return Err(self.err(
                    line_no,
                    format!(
                        "found action `{other}`, expected `allocate`, `free` or \
                         `allocate failure`"
                    ),
                    FORMAT_HINT,
                ));
            }
        };
        let ptr = parse_hex(fields[c_ptr]).ok_or_else(|| {
            self.err(
                line_no,
                format!(
                    "found pointer `{}`, expected a hexadecimal address such as \
                     0x7f5a2c000000",
                    fields[c_ptr]
                ),
                FORMAT_HINT,
            )
        })?;
        let size: usize = fields[c_size].parse().map_err(|_| {
            self.err(
                line_no,
                format!(
                    "found size `{}`, expected a byte count in decimal",
                    fields[c_size]
                ),
                FORMAT_HINT,
            )
        })?;
        let stream = parse_hex(fields[c_stream]).ok_or_else(|| {
            self.err(
                line_no,
                format!(
                    "found stream `{}`, expected a hexadecimal stream handle such as 0x0",
                    fields[c_stream]
                ),
                FORMAT_HINT,
            )
        })?;
        let thread = match self.thread_index.get(thread_text) {
            Some(&t) => t,
            None => {
                let t = self.threads.len();
                self.thread_index.insert(thread_text.to_string(), t);
                self.threads.push(thread_text.to_string());
                t
            }
        };
        let index = self.events;
        let mut freed = None;
        match action {
            LogAction::Allocate if ptr != 0 => {
                if let Some(prev) = self.live.get(&ptr) {
                    return Err(self.err(
                        line_no,
                        format!(
                            "allocate returned {ptr:#x}, which is still live (allocated at \
                             line {} and not freed since), expected every pointer to be \
                             freed before it is handed out again",
                            prev.line
                        ),
                        "Is the log truncated in the middle, or two logs merged? Replay \
                         one complete log per device",
                    ));
                }
                self.live.insert(
                    ptr,
                    LiveAllocation {
                        event: index,
                        line: line_no,
                        size,
                    },
                );
                self.live_bytes += size as u64;
                self.peak_bytes = self.peak_bytes.max(self.live_bytes);
            }
            LogAction::Allocate => {}
            LogAction::Free => match self.live.remove(&ptr) {
                Some(a) => {
                    self.live_bytes -= a.size as u64;
                    freed = Some(Freed {
                        event: a.event,
                        size: a.size,
                    });
                }
                None if ptr == 0 => {}
                None => self.unmatched_frees += 1,
            },
            LogAction::AllocateFailure => self.logged_failures += 1,
        }
        self.events += 1;
        Ok((
            LogEvent {
                line: line_no,
                thread,
                time_us: parse_time(fields[c_time]),
                action,
                ptr,
                size,
                stream,
            },
            freed,
        ))
    }
}

impl EventLog {
    /// Reads and parses the log at `path`.
    pub fn read(path: impl AsRef<Path>) -> Result<EventLog> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::EventLog {
            path: path.display().to_string(),
            line: None,
            problem: format!("reading the log failed: {e}"),
            hint: "Check the path; logs are text files such as rmm_log.dev0.csv".to_string(),
        })?;
        Self::parse(&text, path.display().to_string())
    }

    /// Parses `text`; `source` names it in errors.
    pub fn parse(text: &str, source: impl Into<String>) -> Result<EventLog> {
        let source = source.into();
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim_end_matches('\r')))
            .filter(|(_, l)| !l.trim().is_empty());
        let Some((header_line, header)) = lines.next() else {
            return Err(LineParser::empty(&source));
        };
        let mut parser = LineParser::new(&source, header_line, header)?;
        let mut events = Vec::new();
        let mut freed_allocation = Vec::new();
        for (line_no, line) in lines {
            let (event, freed) = parser.line(line_no, line)?;
            events.push(event);
            freed_allocation.push(freed.map(|f| f.event));
        }
        Ok(EventLog {
            source,
            events,
            freed_allocation,
            peak_bytes: parser.peak_bytes,
            unmatched_frees: parser.unmatched_frees,
            logged_failures: parser.logged_failures,
            unfreed: parser.live.len(),
            threads: parser.threads,
        })
    }

    /// Checks that the public fields agree with each other (as [`EventLog::parse`] makes
    /// them), so that a log assembled or edited by hand cannot make a replay go wrong.
    pub fn check(&self) -> Result<()> {
        let bad = |problem: String| Error::EventLog {
            path: self.source.clone(),
            line: None,
            problem,
            hint: "Build logs with EventLog::parse or EventLog::read".to_string(),
        };
        if self.freed_allocation.len() != self.events.len() {
            return Err(bad(format!(
                "found {} freed_allocation entries for {} events, expected one per event",
                self.freed_allocation.len(),
                self.events.len()
            )));
        }
        for (i, e) in self.events.iter().enumerate() {
            if e.thread >= self.threads.len() {
                return Err(bad(format!(
                    "event {i} (line {}) names thread index {}, expected one below {}",
                    e.line,
                    e.thread,
                    self.threads.len()
                )));
            }
            if let Some(a) = self.freed_allocation[i] {
                let ok = e.action == LogAction::Free
                    && a < i
                    && self.events[a].action == LogAction::Allocate;
                if !ok {
                    return Err(bad(format!(
                        "event {i} (line {}) frees event {a}, expected a free of an earlier \
                         allocation",
                        e.line
                    )));
                }
            }
        }
        Ok(())
    }

    /// Time from the first to the last logged event, when the times parse (and the log does
    /// not cross midnight).
    pub fn logged_duration(&self) -> Option<Duration> {
        let first = self.events.first()?.time_us?;
        let last = self.events.last()?.time_us?;
        last.checked_sub(first).map(Duration::from_micros)
    }
}

/// In which order threads replay their events (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplayOrder {
    /// Every event after the previous one in the log, across threads.
    #[default]
    Logged,
    /// Each thread in its own order; cross-thread frees wait for their allocation.
    Concurrent,
}

impl fmt::Display for ReplayOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReplayOrder::Logged => "logged",
            ReplayOrder::Concurrent => "concurrent",
        })
    }
}

/// How to replay.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReplayOptions {
    /// The order of events across threads.
    pub order: ReplayOrder,
    /// Replay everything on the default stream instead of one stream per logged stream.
    pub default_stream_only: bool,
}

/// The allocation (or free) that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayFailure {
    /// Its line in the log.
    pub line: usize,
    /// The logged thread.
    pub thread: String,
    /// What was replayed.
    pub action: LogAction,
    /// Bytes asked for.
    pub bytes: usize,
    /// Bytes live in the replay when it failed.
    pub live_bytes: u64,
    /// The resource's error.
    pub error: String,
}

/// What a replay found.
#[derive(Debug, Clone)]
pub struct ReplayReport {
    /// The log.
    pub source: String,
    /// The resource chain replayed against.
    pub resource: String,
    /// Device ordinal.
    pub device: u32,
    /// The order used.
    pub order: ReplayOrder,
    /// Lines in the log (events).
    pub events: usize,
    /// Allocations replayed.
    pub allocations: usize,
    /// Frees replayed.
    pub frees: usize,
    /// Threads (one per logged thread).
    pub threads: usize,
    /// Streams created for the replay (the default stream not counted).
    pub streams: usize,
    /// Wall time of the replay.
    pub elapsed: Duration,
    /// Peak of the bytes live in the replay (requested sizes).
    pub peak_bytes: u64,
    /// Peak of the allocations live in the replay.
    pub peak_allocations: u64,
    /// Peak of the bytes live in the log, in log order.
    pub logged_peak_bytes: u64,
    /// Bytes the first pool in the chain held at the end of the replay (before the replay's
    /// leftovers were freed): the memory the pool needed.
    pub reserved_bytes: Option<u64>,
    /// Frees skipped because the log never allocated their pointer.
    pub skipped_frees: usize,
    /// `allocate failure` lines in the log (skipped).
    pub logged_failures: usize,
    /// Allocations the log never freed (freed by the replay at the end).
    pub unfreed: usize,
    /// The first operation that failed, if any.
    pub failure: Option<ReplayFailure>,
}

impl ReplayReport {
    /// True when every allocation succeeded.
    pub fn fits(&self) -> bool {
        self.failure.is_none()
    }
}

impl fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "log:        {}", self.source)?;
        writeln!(f, "resource:   {} (device {})", self.resource, self.device)?;
        writeln!(
            f,
            "events:     {} ({} allocations, {} frees replayed; {} thread(s), {} stream(s), {} order)",
            self.events, self.allocations, self.frees, self.threads, self.streams, self.order
        )?;
        if self.skipped_frees + self.logged_failures + self.unfreed > 0 {
            writeln!(
                f,
                "skipped:    {} frees of pointers never allocated in the log, {} logged \
                 allocation failures; {} allocations never freed in the log",
                self.skipped_frees, self.logged_failures, self.unfreed
            )?;
        }
        writeln!(f, "time:       {:.3} ms", self.elapsed.as_secs_f64() * 1e3)?;
        writeln!(
            f,
            "peak:       {} ({} bytes) in {} live allocations; the log's peak is {} bytes",
            fmt_bytes(self.peak_bytes as usize),
            self.peak_bytes,
            self.peak_allocations,
            self.logged_peak_bytes
        )?;
        if let Some(r) = self.reserved_bytes {
            writeln!(
                f,
                "reserved:   {} ({r} bytes) held by the pool",
                fmt_bytes(r as usize)
            )?;
        }
        match &self.failure {
            None => write!(f, "fit:        yes"),
            Some(x) => write!(
                f,
                "fit:        NO: {} of {} bytes at line {} (thread {}) failed with {} live: {}",
                x.action,
                x.bytes,
                x.line,
                x.thread,
                fmt_bytes(x.live_bytes as usize),
                x.error
            ),
        }
    }
}

#[derive(Clone, Copy)]
enum StepKind {
    Alloc,
    Free,
}

#[derive(Clone, Copy)]
struct Step {
    seq: usize,
    kind: StepKind,
    /// Index of the allocation event (the slot).
    slot: usize,
    event: usize,
}

struct Shared<'a> {
    log: &'a EventLog,
    resource: &'a dyn DeviceMemoryResource,
    streams: Vec<StreamView>,
    stream_of: HashMap<u64, usize>,
    /// Replayed pointer of each allocation event (0: not allocated, or freed).
    slots: Vec<AtomicU64>,
    turn: AtomicUsize,
    stop: AtomicBool,
    live_bytes: AtomicI64,
    live_count: AtomicI64,
    peak_bytes: AtomicI64,
    peak_count: AtomicI64,
    failure: Mutex<Option<ReplayFailure>>,
}

impl Shared<'_> {
    fn stream(&self, logged: u64) -> StreamView {
        self.stream_of
            .get(&logged)
            .map_or(StreamView::DEFAULT, |&i| self.streams[i])
    }

    fn wait(&self, ready: impl Fn() -> bool) -> bool {
        let mut spins = 0u32;
        loop {
            if ready() {
                return true;
            }
            if self.stop.load(Ordering::Relaxed) {
                return false;
            }
            if spins < 100 {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
    }

    fn fail(&self, step: &Step, error: &Error) {
        let e = &self.log.events[step.event];
        let mut f = self
            .failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if f.is_none() {
            *f = Some(ReplayFailure {
                line: e.line,
                thread: self.log.threads[e.thread].clone(),
                action: e.action,
                bytes: e.size,
                live_bytes: self.live_bytes.load(Ordering::Relaxed).max(0) as u64,
                error: error.to_string(),
            });
        }
        self.stop.store(true, Ordering::Relaxed);
    }

    fn run(&self, steps: &[Step], order: ReplayOrder) {
        for step in steps {
            let ready = match (order, step.kind) {
                (ReplayOrder::Logged, _) => {
                    self.wait(|| self.turn.load(Ordering::Acquire) == step.seq)
                }
                (ReplayOrder::Concurrent, StepKind::Free) => {
                    self.wait(|| self.slots[step.slot].load(Ordering::Acquire) != 0)
                }
                (ReplayOrder::Concurrent, StepKind::Alloc) => !self.stop.load(Ordering::Relaxed),
            };
            if !ready {
                return;
            }
            let e = &self.log.events[step.event];
            let ok = match step.kind {
                StepKind::Alloc => match self.resource.allocate(e.size, self.stream(e.stream)) {
                    Ok(p) => {
                        // A zero pointer means "not allocated" in the slots; a resource
                        // returns null only for zero bytes, which are not replayed.
                        self.slots[step.slot].store(p.addr().max(1), Ordering::Release);
                        let b = self.live_bytes.fetch_add(e.size as i64, Ordering::Relaxed)
                            + e.size as i64;
                        let c = self.live_count.fetch_add(1, Ordering::Relaxed) + 1;
                        self.peak_bytes.fetch_max(b, Ordering::Relaxed);
                        self.peak_count.fetch_max(c, Ordering::Relaxed);
                        true
                    }
                    Err(err) => {
                        self.fail(step, &err);
                        false
                    }
                },
                StepKind::Free => {
                    let alloc = &self.log.events[step.slot];
                    let p = self.slots[step.slot].swap(0, Ordering::AcqRel);
                    match self
                        .resource
                        .deallocate(DevicePtr(p), alloc.size, self.stream(e.stream))
                    {
                        Ok(()) => {
                            self.live_bytes
                                .fetch_sub(alloc.size as i64, Ordering::Relaxed);
                            self.live_count.fetch_sub(1, Ordering::Relaxed);
                            true
                        }
                        Err(err) => {
                            self.fail(step, &err);
                            false
                        }
                    }
                }
            };
            if order == ReplayOrder::Logged {
                self.turn.store(step.seq + 1, Ordering::Release);
            }
            if !ok {
                return;
            }
        }
    }
}

/// Replays `log` against `resource` (see the module documentation). Returns the report, with
/// [`ReplayReport::failure`] set when an allocation failed; `Err` only when the replay could
/// not be set up (e.g. a stream could not be created).
pub fn replay(
    log: &EventLog,
    resource: &dyn DeviceMemoryResource,
    options: &ReplayOptions,
) -> Result<ReplayReport> {
    log.check()?;
    let device = resource.device();
    // Streams: one per distinct non-default logged stream.
    let mut owned: Vec<Stream> = Vec::new();
    let mut stream_of: HashMap<u64, usize> = HashMap::new();
    if !options.default_stream_only {
        for e in &log.events {
            if e.stream != 0 && !stream_of.contains_key(&e.stream) {
                stream_of.insert(e.stream, owned.len());
                owned.push(Stream::new(device)?);
            }
        }
    }
    // Steps per thread, in log order.
    let mut per_thread: Vec<Vec<Step>> = vec![Vec::new(); log.threads.len()];
    let mut seq = 0;
    let (mut allocations, mut frees) = (0, 0);
    for (i, e) in log.events.iter().enumerate() {
        let step = match (e.action, log.freed_allocation[i]) {
            (LogAction::Allocate, _) if e.ptr != 0 && e.size != 0 => {
                allocations += 1;
                Step {
                    seq,
                    kind: StepKind::Alloc,
                    slot: i,
                    event: i,
                }
            }
            (LogAction::Free, Some(a)) if log.events[a].size != 0 => {
                frees += 1;
                Step {
                    seq,
                    kind: StepKind::Free,
                    slot: a,
                    event: i,
                }
            }
            _ => continue,
        };
        per_thread[e.thread].push(step);
        seq += 1;
    }
    let shared = Shared {
        log,
        resource,
        streams: owned.iter().map(Stream::view).collect(),
        stream_of,
        slots: (0..log.events.len()).map(|_| AtomicU64::new(0)).collect(),
        turn: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        live_bytes: AtomicI64::new(0),
        live_count: AtomicI64::new(0),
        peak_bytes: AtomicI64::new(0),
        peak_count: AtomicI64::new(0),
        failure: Mutex::new(None),
    };
    let _span = tracing::debug_span!(
        "replay",
        log = %log.source,
        events = log.events.len(),
        threads = log.threads.len()
    )
    .entered();
    let busy: Vec<&Vec<Step>> = per_thread.iter().filter(|s| !s.is_empty()).collect();
    // The threads wait at this gate until every one has started: `Some(true)` runs them,
    // `Some(false)` (a thread could not be started) sends them home.
    let gate = (Mutex::new(None::<bool>), Condvar::new());
    let open = |go: bool| {
        *gate
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(go);
        gate.1.notify_all();
    };
    let mut start = Instant::now();
    let spawned: std::io::Result<()> = std::thread::scope(|scope| {
        for (n, steps) in busy.iter().enumerate() {
            let shared = &shared;
            let gate = &gate;
            let order = options.order;
            let thread = std::thread::Builder::new()
                .name(format!("rmm-replay-{n}"))
                .spawn_scoped(scope, move || {
                    let mut go = gate
                        .0
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    while go.is_none() {
                        go = gate
                            .1
                            .wait(go)
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                    }
                    let run = *go == Some(true);
                    drop(go);
                    if run {
                        shared.run(steps, order);
                    }
                });
            if let Err(e) = thread {
                open(false);
                return Err(e);
            }
        }
        start = Instant::now();
        open(true);
        Ok(())
    });
    if let Err(e) = spawned {
        return Err(Error::invalid_argument(
            "replay threads",
            busy.len(),
            format!(
                "as many threads as the log has ({e}); replay it where more threads can start, \
                 or a log of fewer threads"
            ),
        ));
    }
    let elapsed = start.elapsed();
    // Synchronize so the last frees have settled before the pool is measured.
    for s in &owned {
        if let Err(e) = s.synchronize() {
            tracing::warn!("replay: synchronizing a stream: {e}");
        }
    }
    let reserved_bytes =
        find_in_chain::<PoolMemoryResource>(resource).map(PoolMemoryResource::pool_size);
    // Free what is still live (never freed in the log, or left by a failure).
    for (i, slot) in shared.slots.iter().enumerate() {
        let p = slot.swap(0, Ordering::AcqRel);
        if p != 0 {
            let e = &log.events[i];
            if let Err(err) = resource.deallocate(DevicePtr(p), e.size, shared.stream(e.stream)) {
                tracing::warn!(
                    "replay: freeing the allocation of line {} ({} bytes) at the end: {err}",
                    e.line,
                    e.size
                );
            }
        }
    }
    for s in &owned {
        if let Err(e) = s.synchronize() {
            tracing::warn!("replay: synchronizing a stream: {e}");
        }
    }
    let failure = shared
        .failure
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(f) = &failure {
        tracing::info!(
            line = f.line,
            bytes = f.bytes,
            "replay: allocation failed: {}",
            f.error
        );
    }
    Ok(ReplayReport {
        source: log.source.clone(),
        resource: chain_names(resource),
        device: device.ordinal(),
        order: options.order,
        events: log.events.len(),
        allocations,
        frees,
        threads: busy.len(),
        streams: owned.len(),
        elapsed,
        peak_bytes: shared.peak_bytes.load(Ordering::Relaxed).max(0) as u64,
        peak_allocations: shared.peak_count.load(Ordering::Relaxed).max(0) as u64,
        logged_peak_bytes: log.peak_bytes,
        reserved_bytes,
        skipped_frees: log.unmatched_frees,
        logged_failures: log.logged_failures,
        unfreed: log.unfreed,
        failure,
    })
}
