//! [`LogReader`]: a log read once, a line at a time (a pipe works as well as a file).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use super::lines::Lines;
use super::parser::{EventLog, Freed, LineParser, LogEvent};
use crate::error::{Error, Result};

/// One event as a [`LogReader`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// The event (its thread is an index into the threads read so far).
    pub event: LogEvent,
    /// For a free of an allocation the log made, that allocation.
    pub freed: Option<Freed>,
}

/// A log read line by line, checked as [`EventLog::parse`] checks it, in memory that grows with
/// the threads and live allocations, not with the log's length.
pub struct LogReader<'a> {
    lines: Lines<Box<dyn BufRead + 'a>>,
    parser: LineParser,
    observer: Option<Observer<'a>>,
}

/// What [`LogReader::inspect`] calls with every event.
type Observer<'a> = Box<dyn FnMut(&LogLine) + 'a>;

impl std::fmt::Debug for LogReader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogReader")
            .field("lines", &self.lines)
            .field("parser", &self.parser)
            .field("inspected", &self.observer.is_some())
            .finish()
    }
}

impl<'a> LogReader<'a> {
    /// Opens the log at `path` (once: a FIFO or `/dev/stdin` works) and reads its header.
    ///
    /// # Errors
    /// [`Error::EventLog`] when the file cannot be opened or read, or its header is not RMM's.
    pub fn open(path: impl AsRef<Path>) -> Result<LogReader<'static>> {
        let path = path.as_ref();
        let source = path.display().to_string();
        let file = File::open(path).map_err(|e| {
            let hint = "Check the path; logs are text files such as rmm_log.dev0.csv";
            Error::event_log(&source, None, format!("opening the log failed: {e}"), hint)
        })?;
        LogReader::new(BufReader::with_capacity(1 << 20, file), source)
    }

    /// Reads the log's header from `input` (e.g. standard input); `source` names it in errors.
    ///
    /// # Errors
    /// [`Error::EventLog`] when `input` cannot be read, or holds no header or not RMM's.
    pub fn new(input: impl BufRead + 'a, source: impl Into<String>) -> Result<LogReader<'a>> {
        let source = source.into();
        let mut lines = Lines::new(Box::new(input) as Box<dyn BufRead + 'a>, &source);
        let parser = match lines.next_line()? {
            Some((n, header)) => LineParser::new(&source, n, header)?,
            None => return Err(LineParser::empty(&source)),
        };
        Ok(LogReader {
            lines,
            parser,
            observer: None,
        })
    }

    /// What errors and reports call the log (its path, or the name given to [`LogReader::new`]).
    pub fn source(&self) -> &str {
        self.parser.source()
    }

    /// Calls `observer` with every event read from now on (replacing an earlier observer).
    pub fn inspect(mut self, observer: impl FnMut(&LogLine) + 'a) -> LogReader<'a> {
        self.observer = Some(Box::new(observer));
        self
    }

    /// The next event, checked; `None` at the end of the log.
    ///
    /// # Errors
    /// [`Error::EventLog`] naming the line when it cannot be read or does not parse.
    pub fn next_event(&mut self) -> Result<Option<LogLine>> {
        let Some((n, line)) = self.lines.next_line()? else {
            return Ok(None);
        };
        let (event, freed) = self.parser.line(n, line)?;
        let line = LogLine { event, freed };
        if let Some(observe) = &mut self.observer {
            observe(&line);
        }
        Ok(Some(line))
    }

    /// The figures of the lines read so far.
    pub fn figures(&self) -> LogFigures {
        self.parser.figures
    }

    /// The logged thread ids read so far, in order of first appearance ([`LogEvent::thread`]).
    pub fn threads(&self) -> &[String] {
        &self.parser.threads
    }
}

/// What a [`LogReader`] counted in the lines it read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogFigures {
    /// Events read.
    pub events: usize,
    /// Peak of the bytes live in log order.
    pub peak_bytes: u64,
    /// Frees of pointers the log never allocated.
    pub unmatched_frees: usize,
    /// `allocate failure` lines.
    pub logged_failures: usize,
    /// Allocations not freed by the last line read.
    pub unfreed: usize,
}

/// Whole logs read into memory, through a [`LogReader`].
impl EventLog {
    /// Reads and parses the log at `path`.
    ///
    /// # Errors
    /// [`Error::EventLog`] when the file cannot be read or a line does not parse.
    pub fn read(path: impl AsRef<Path>) -> Result<EventLog> {
        Self::read_all(LogReader::open(path)?)
    }

    /// Parses `text`; `source` names it in errors.
    ///
    /// # Errors
    /// [`Error::EventLog`] when `text` is empty, the header is not RMM's, or a line does not parse.
    pub fn parse(text: &str, source: impl Into<String>) -> Result<EventLog> {
        Self::read_all(LogReader::new(text.as_bytes(), source)?)
    }

    /// Every event of `log`, in memory.
    fn read_all(mut log: LogReader<'_>) -> Result<EventLog> {
        let mut events = Vec::new();
        let mut freed_allocation = Vec::new();
        while let Some(LogLine { event, freed }) = log.next_event()? {
            events.push(event);
            freed_allocation.push(freed.map(|f| f.event));
        }
        let parser = log.parser;
        Ok(EventLog {
            source: parser.source().to_string(),
            events,
            freed_allocation,
            peak_bytes: parser.figures.peak_bytes,
            unmatched_frees: parser.figures.unmatched_frees,
            logged_failures: parser.figures.logged_failures,
            unfreed: parser.figures.unfreed,
            threads: parser.threads,
        })
    }
}
