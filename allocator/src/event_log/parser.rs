//! [`EventLog`] and the line parser a [`LogReader`](super::LogReader) runs on every line.

use std::collections::HashMap;
use std::time::Duration;

use super::LogFigures;
use crate::adaptor::{LOG_HEADER, LogAction};
use crate::error::{Error, Result};

/// One line of a log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEvent {
    /// 1-based line number in the file.
    pub line: usize,
    /// Index into [`EventLog::threads`] (or [`LogReader::threads`](super::LogReader::threads)).
    pub thread: usize,
    /// Microseconds since midnight; `None` when the `Time` field holds no time (no `:`).
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
    /// For each event: for a free of a logged allocation, that allocation's index; else `None`.
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
    u64::from_str_radix(digits, 16).ok()
}

/// What a `Time` field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Time {
    /// No time at all (no `:`): a log written without times.
    Absent,
    /// Microseconds since midnight.
    At(u64),
    /// Something written as a time that is none (`99:99:99`, `10:00`, `10:00:00.x`).
    Impossible,
}

/// One to two ASCII digits (`u64::from_str` would take `+5` too).
fn clock_digits(text: &str) -> Option<u64> {
    let ok = (1..=2).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit());
    ok.then(|| text.parse().ok()).flatten()
}

/// `HH:MM:SS.ffffff` (or `HH:MM:SS:ffffff`, or no fraction; digits past six ignored) →
/// microseconds since midnight; a leap second is allowed.
fn parse_time(text: &str) -> Time {
    let t = text.trim();
    if !t.contains(':') {
        return Time::Absent;
    }
    let (clock, dotted) = t.split_once('.').map_or((t, None), |(c, f)| (c, Some(f)));
    let mut parts = clock.split(':');
    let (Some(h), Some(m), Some(s)) = (
        parts.next().and_then(clock_digits),
        parts.next().and_then(clock_digits),
        parts.next().and_then(clock_digits),
    ) else {
        return Time::Impossible;
    };
    let fraction = match (parts.next(), dotted, parts.next()) {
        (None, f, None) => f,
        (Some(f), None, None) => Some(f),
        _ => return Time::Impossible,
    };
    if h > 23 || m > 59 || s > 60 {
        return Time::Impossible;
    }
    // Up to six digits of the fraction (microseconds), without allocating.
    let us = match fraction {
        None => 0,
        Some(f) if !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()) => {
            let digits = f.bytes().chain(std::iter::repeat(b'0')).take(6);
            digits.fold(0, |us, d| us * 10 + u64::from(d - b'0'))
        }
        Some(_) => return Time::Impossible,
    };
    Time::At(((h * 60 + m) * 60 + s) * 1_000_000 + us)
}

/// The most columns a log's header may have (RMM's has six).
const MAX_COLUMNS: usize = 16;

/// The allocation a free line frees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Freed {
    /// Index of the allocation's event, counted from the log's first event.
    pub event: usize,
    /// Its size in bytes.
    pub size: usize,
}

#[derive(Debug, Clone, Copy)]
struct LiveAllocation {
    event: usize,
    line: usize,
    size: usize,
}

/// Checks a log one line at a time, keeping only the threads, the live allocations and counts.
#[derive(Debug, Default)]
pub(crate) struct LineParser {
    source: String,
    /// Columns of Thread, Time, Action, Pointer, Size, Stream.
    columns: [usize; 6],
    names: Vec<String>,
    thread_index: HashMap<String, usize>,
    pub(crate) threads: Vec<String>,
    live: HashMap<u64, LiveAllocation>,
    live_bytes: u64,
    /// What the lines so far counted.
    pub(crate) figures: LogFigures,
}

impl LineParser {
    /// The error for a log without a header.
    pub(crate) fn empty(source: &str) -> Error {
        let hint = format!("A log starts with the header `{LOG_HEADER}`");
        Error::event_log(source, None, "the log is empty", hint)
    }

    fn err(&self, line: usize, problem: String, hint: &str) -> Error {
        Error::event_log(&self.source, Some(line), problem, hint)
    }

    /// A parser for the log whose header (at `header_line`) is `header`.
    pub(crate) fn new(source: &str, header_line: usize, header: &str) -> Result<LineParser> {
        let names: Vec<String> = header.split(',').map(|n| n.trim().to_string()).collect();
        let column = |name: &str| names.iter().position(|n| n == name);
        let mut parser = LineParser {
            source: source.to_string(),
            ..LineParser::default()
        };
        let found = ["Thread", "Time", "Action", "Pointer", "Size", "Stream"].map(column);
        if found.contains(&None) {
            return Err(parser.err(
                header_line,
                format!("found header `{header}`, expected `{LOG_HEADER}`"),
                "Give a log written by RMM's logging_resource_adaptor or rmm-rs's \
                 LoggingResourceAdaptor",
            ));
        }
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
        parser.columns = found.map(Option::unwrap_or_default);
        parser.names = names;
        Ok(parser)
    }

    pub(crate) fn source(&self) -> &str {
        &self.source
    }

    /// Parses and checks line `line_no`: the event, and the allocation a free frees.
    pub(crate) fn line(&mut self, line_no: usize, line: &str) -> Result<(LogEvent, Option<Freed>)> {
        let [c_thread, c_time, c_action, c_ptr, c_size, c_stream] = self.columns;
        // The fields, without allocating (the header has at most MAX_COLUMNS).
        let mut fields = [""; MAX_COLUMNS];
        for (slot, field) in fields.iter_mut().zip(line.split(',')) {
            *slot = field.trim();
        }
        let count = line.split(',').count();
        let bad = |problem: String| self.err(line_no, problem, FORMAT_HINT);
        let found = |c: usize, what: &str, expected: &str| {
            bad(format!("found {what} `{}`, expected {expected}", fields[c]))
        };
        if count != self.names.len() {
            let (expected, names) = (self.names.len(), self.names.join(","));
            return Err(bad(format!(
                "found {count} field(s) in `{line}`, expected {expected} ({names})"
            )));
        }
        let thread_text = fields[c_thread];
        if thread_text.is_empty() {
            return Err(bad(format!(
                "found an empty Thread field in `{line}`, expected a thread id"
            )));
        }
        let action = LogAction::parse(fields[c_action]).ok_or_else(|| {
            let expected = "`allocate`, `free` or `allocate failure`";
            found(c_action, "action", expected)
        })?;
        let ptr = parse_hex(fields[c_ptr]).ok_or_else(|| {
            let expected = "a hexadecimal address such as 0x7f5a2c000000";
            found(c_ptr, "pointer", expected)
        })?;
        // Sizes beyond i64::MAX bytes exist on no device; replays count bytes in i64.
        let size: usize = fields[c_size]
            .parse()
            .ok()
            .filter(|&s: &usize| i64::try_from(s).is_ok())
            .ok_or_else(|| found(c_size, "size", "a byte count in decimal (below 2^63)"))?;
        let stream = parse_hex(fields[c_stream]).ok_or_else(|| {
            let expected = "a hexadecimal stream handle such as 0x0";
            found(c_stream, "stream", expected)
        })?;
        let time_us = match parse_time(fields[c_time]) {
            Time::Absent => None,
            Time::At(us) => Some(us),
            Time::Impossible => {
                let expected = "a time of day HH:MM:SS.ffffff (hours below 24, minutes below 60, \
                                seconds below 61), or no `:` in a log without times";
                return Err(found(c_time, "time", expected));
            }
        };
        let thread = match self.thread_index.get(thread_text) {
            Some(&t) => t,
            None => {
                let t = self.threads.len();
                self.thread_index.insert(thread_text.to_string(), t);
                self.threads.push(thread_text.to_string());
                t
            }
        };
        let index = self.figures.events;
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
                self.live_bytes = self.live_bytes.saturating_add(size as u64);
                self.figures.peak_bytes = self.figures.peak_bytes.max(self.live_bytes);
            }
            LogAction::Allocate => {}
            LogAction::Free => match self.live.remove(&ptr) {
                Some(a) => {
                    self.live_bytes = self.live_bytes.saturating_sub(a.size as u64);
                    freed = Some(Freed {
                        event: a.event,
                        size: a.size,
                    });
                }
                None if ptr == 0 => {}
                None => self.figures.unmatched_frees += 1,
            },
            LogAction::AllocateFailure => self.figures.logged_failures += 1,
        }
        self.figures.events += 1;
        self.figures.unfreed = self.live.len();
        Ok((
            LogEvent {
                line: line_no,
                thread,
                time_us,
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
    /// Checks that the public fields agree, so that a log edited by hand cannot derail a replay.
    ///
    /// # Errors
    /// [`Error::EventLog`] naming the first disagreement (e.g. an index out of range).
    pub fn check(&self) -> Result<()> {
        let hint = "Build logs with EventLog::parse or EventLog::read";
        let bad = |problem: String| Error::event_log(&self.source, None, problem, hint);
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

    /// Time from the first to the last event, when both have times (and not across midnight).
    pub fn logged_duration(&self) -> Option<Duration> {
        let first = self.events.first()?.time_us?;
        let last = self.events.last()?.time_us?;
        last.checked_sub(first).map(Duration::from_micros)
    }
}
