//! The replay's timeline and PyTorch snapshot, built as the events come, in memory that does
//! not grow with the length of the log.
//!
//! During the replay, the pool's hook events go to a [`Hooked`] (the sink of a streaming
//! [`Recorder`](rmm_cli::timeline::Recorder)); after it, [`LogPass`] reads the log again, a
//! block of lines at a time ([`read_log`]).
//!
//! The plot is on the log's own clock: the bytes in use are the log's (its allocations and
//! frees at the times it recorded them); the bytes the pool reserved come from the pool's
//! segment events during the replay, moved onto the log's clock by the allocation each came
//! before (the n-th allocation the pool served is the log's n-th). A log without times keeps
//! the replay's clock. Either way the samples go through a
//! [`Downsampler`](rmm_cli::timeline::Downsampler): exact up to its limit, binned past it.

use std::collections::{HashMap, VecDeque};
use std::io::BufRead;
use std::path::Path;

use rmm::allocator::Error;
use rmm::allocator::adaptor::{EventLog, LogAction, LogEvent, ReplayReport};
use rmm_cli::timeline::{
    Action, DeviceTimeline, Downsampler, Mark, MarkKind, MemoryEvent, Sample, Timeline, TorchTrace,
};
use rmm_cli::units::bytes;

/// Lines parsed at once when the log is read again.
const BLOCK_LINES: usize = 4096;

/// Out-of-memory events a [`Hooked`] keeps (a replay stops at its first failure, which
/// makes one or two).
const KEPT_OOMS: usize = 64;

/// One event of the log as [`read_log`] gives it.
#[derive(Debug)]
pub struct Logged<'a> {
    /// Its line in the file.
    pub line: usize,
    /// The event (its `line` is within a block: use [`Logged::line`]).
    pub event: &'a LogEvent,
    /// Seconds since the log's first timed event (an untimed event takes the time before
    /// it; a log that crosses midnight keeps counting).
    pub t: f64,
    /// For a free of an allocation the log made, that allocation's size.
    pub freed: Option<usize>,
}

impl Logged<'_> {
    /// The event as an allocator event: allocations, frees of allocations the log made
    /// (others are skipped, as the replay skips them) and logged failures as out-of-memory.
    pub fn memory_event(&self) -> Option<MemoryEvent> {
        let e = self.event;
        let (action, addr, size) = match (e.action, self.freed) {
            (LogAction::Allocate, _) if e.ptr != 0 && e.size != 0 => (Action::Alloc, e.ptr, e.size),
            (LogAction::Free, Some(size)) => (Action::FreeCompleted, e.ptr, size),
            (LogAction::AllocateFailure, _) => (Action::Oom, 0, e.size),
            _ => return None,
        };
        Some(MemoryEvent {
            t: self.t,
            action,
            addr,
            size: size as u64,
            stream: e.stream,
        })
    }
}

/// The log's clock: microseconds since midnight to seconds since the first timed event.
#[derive(Debug, Default)]
struct LogClock {
    first: Option<u64>,
    last: u64,
    wrap: u64,
    t: f64,
}

impl LogClock {
    fn at(&mut self, time_us: Option<u64>) -> f64 {
        const DAY_US: u64 = 86_400_000_000;
        if let Some(us) = time_us {
            let start = *self.first.get_or_insert(us);
            if us < self.last {
                self.wrap += DAY_US;
            }
            self.last = us;
            self.t = (us + self.wrap).saturating_sub(start) as f64 / 1e6;
        }
        self.t
    }
}

fn read_error(path: &Path, e: &std::io::Error) -> Error {
    Error::EventLog {
        path: path.display().to_string(),
        line: None,
        problem: format!("reading the log again for the plot or snapshot failed: {e}"),
        hint: "Check that the file is still there and readable, and run the replay again"
            .to_string(),
    }
}

/// Calls `each` for every event of the log at `path`, in log order, until it returns false.
/// The log is parsed a block of lines at a time by [`EventLog::parse`]: memory is one block
/// and the allocations live at once, not the length of the log.
///
/// # Errors
/// [`Error::EventLog`] when the file cannot be read, or a line does not parse (naming the
/// line of the file).
pub fn read_log(path: &Path, mut each: impl FnMut(&Logged<'_>) -> bool) -> Result<(), Error> {
    let source = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| read_error(path, &e))?;
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    let (mut text, mut block) = (String::new(), String::new());
    let mut header_len = None;
    // The file's line number of each line of the block after its header.
    let mut lines: Vec<usize> = Vec::with_capacity(BLOCK_LINES);
    let mut line_no = 0;
    let mut clock = LogClock::default();
    // Live allocations: pointer → size.
    let mut live: HashMap<u64, usize> = HashMap::new();
    loop {
        text.clear();
        let end = reader
            .read_line(&mut text)
            .map_err(|e| read_error(path, &e))?
            == 0;
        if !end {
            line_no += 1;
            let line = text.trim_end_matches(['\n', '\r']);
            if line.trim().is_empty() {
                continue;
            }
            block.push_str(line);
            block.push('\n');
            match header_len {
                None => header_len = Some(block.len()),
                Some(_) => lines.push(line_no),
            }
        }
        if lines.len() >= BLOCK_LINES || (end && !lines.is_empty()) {
            let log = EventLog::parse(&block, source.as_str()).map_err(|e| match e {
                // The block's line numbers: line 1 is the header, line k the (k-1)-th line.
                Error::EventLog {
                    path,
                    line,
                    problem,
                    hint,
                } => Error::EventLog {
                    path,
                    line: line.map(|l| {
                        l.checked_sub(2)
                            .and_then(|i| lines.get(i))
                            .map_or(l, |&n| n)
                    }),
                    problem,
                    hint,
                },
                other => other,
            })?;
            for e in &log.events {
                let freed = match e.action {
                    LogAction::Allocate if e.ptr != 0 => {
                        live.insert(e.ptr, e.size);
                        None
                    }
                    LogAction::Free => live.remove(&e.ptr),
                    _ => None,
                };
                let logged = Logged {
                    line: e
                        .line
                        .checked_sub(2)
                        .and_then(|i| lines.get(i))
                        .map_or(e.line, |&n| n),
                    event: e,
                    t: clock.at(e.time_us),
                    freed,
                };
                if !each(&logged) {
                    return Ok(());
                }
            }
            lines.clear();
            block.truncate(header_len.unwrap_or(0));
        }
        if end {
            break;
        }
    }
    match header_len {
        Some(_) => Ok(()),
        None => Err(Error::EventLog {
            path: source,
            line: None,
            problem: "the log is empty".to_string(),
            hint: "Replay a log that is no longer being written".to_string(),
        }),
    }
}

/// True when the log at `path` has times: an event after its first timed one at another
/// time (read until the first such event).
///
/// # Errors
/// As [`read_log`].
pub fn log_is_timed(path: &Path) -> Result<bool, Error> {
    let mut timed = false;
    read_log(path, |e| {
        timed = e.t > 0.0;
        !timed
    })?;
    Ok(timed)
}

/// What the replay's hooks reported on the replayed device, in bounded memory (the sink of
/// the replay's streaming recorder): counts, the segment events for a plot on the log's
/// clock, the samples for one on the replay's clock, and the PyTorch trace.
#[derive(Debug)]
pub struct Hooked {
    device: u32,
    /// Block allocations the pool served.
    served: u64,
    /// The first out-of-memory events, and the last.
    ooms: Vec<MemoryEvent>,
    last_oom: Option<MemoryEvent>,
    last_t: Option<f64>,
    /// Segment events, each with the allocations served before it (a plot on the log's
    /// clock). As many as the pool grew and shrank: not the length of the log.
    segments: Option<Vec<(u64, MemoryEvent)>>,
    /// Samples on the replay's clock (a plot of a log without times).
    sampler: Option<Downsampler>,
    /// The PyTorch trace.
    torch: Option<TorchTrace>,
}

impl Hooked {
    /// Takes the events of `device`: with `segments`, the segment events for a plot on the
    /// log's clock; with `sampler`, samples on the replay's clock; with `torch`, a trace.
    pub fn new(device: u32, segments: bool, sampler: bool, torch: Option<TorchTrace>) -> Self {
        Hooked {
            device,
            served: 0,
            ooms: Vec::new(),
            last_oom: None,
            last_t: None,
            segments: segments.then(Vec::new),
            sampler: sampler.then(Downsampler::new),
            torch,
        }
    }

    /// Takes one recorded event.
    pub fn event(&mut self, device: u32, e: &MemoryEvent) {
        if device != self.device {
            return;
        }
        self.last_t = Some(e.t);
        match e.action {
            Action::Alloc => self.served += 1,
            Action::Oom => {
                if self.ooms.len() < KEPT_OOMS {
                    self.ooms.push(*e);
                }
                self.last_oom = Some(*e);
            }
            Action::SegmentAlloc | Action::SegmentFree => {
                if let Some(s) = &mut self.segments {
                    s.push((self.served, *e));
                }
            }
            Action::FreeCompleted => {}
        }
        if let Some(s) = &mut self.sampler {
            s.push(*e);
        }
        if let Some(t) = &mut self.torch {
            t.push(e);
        }
    }

    /// True when the pool served an allocation (the plot's events come from it).
    pub fn served_any(&self) -> bool {
        self.served > 0
    }

    /// True when the pool served or refused an allocation (the snapshot's events come from
    /// it).
    pub fn reported_any(&self) -> bool {
        self.served > 0 || self.last_oom.is_some()
    }

    /// Takes the trace out.
    pub fn take_torch(&mut self) -> Option<TorchTrace> {
        self.torch.take()
    }

    /// Takes the segment events out (empty without them).
    pub fn take_segments(&mut self) -> Vec<(u64, MemoryEvent)> {
        self.segments.take().unwrap_or_default()
    }

    /// Takes the samples on the replay's clock out.
    pub fn take_sampler(&mut self) -> Option<Downsampler> {
        self.sampler.take()
    }

    /// When, on the replay's clock, an allocation of `bytes` failed: the first out-of-memory
    /// event of that size, else the last one, else the last event.
    pub fn oom_time(&self, bytes: u64) -> f64 {
        self.ooms
            .iter()
            .find(|e| e.size == bytes)
            .or(self.last_oom.as_ref())
            .map(|e| e.t)
            .or(self.last_t)
            .unwrap_or(0.0)
    }
}

/// The plot's samples on the log's clock, with the pool's segments moved onto it.
#[derive(Debug)]
struct LogPlot {
    sampler: Downsampler,
    /// Segment events, with the allocations served before each.
    segments: VecDeque<(u64, MemoryEvent)>,
    /// Log allocations so far.
    allocations: u64,
    /// The latest time of an event drawn.
    end: f64,
}

impl LogPlot {
    fn push(&mut self, e: MemoryEvent) {
        if e.action == Action::Alloc {
            // Segments taken before the pool served this allocation: at its time.
            while let Some(&(served, segment)) = self.segments.front()
                && served <= self.allocations
            {
                self.segments.pop_front();
                self.sampler.push(MemoryEvent { t: e.t, ..segment });
            }
            self.allocations += 1;
        }
        self.end = self.end.max(e.t);
        self.sampler.push(e);
    }

    /// Segments after the last allocation the pool served, at the log's last time.
    fn finish(mut self) -> Downsampler {
        for (_, segment) in std::mem::take(&mut self.segments) {
            self.sampler.push(MemoryEvent {
                t: self.end,
                ..segment
            });
        }
        self.sampler
    }
}

/// What one more reading of the log gives: the plot's samples on the log's clock and the
/// time of a failed line, and a PyTorch trace of the log's own events.
#[derive(Debug, Default)]
pub struct LogPass {
    plot: Option<LogPlot>,
    torch: Option<TorchTrace>,
    failure_line: Option<usize>,
    failure_t: Option<f64>,
}

impl LogPass {
    /// A pass that draws the log's events (with `segments`, the pool's, from a
    /// [`Hooked`]), traces them into `torch`, and finds the time of `failure_line`.
    pub fn new(
        plot: bool,
        segments: Vec<(u64, MemoryEvent)>,
        torch: Option<TorchTrace>,
        failure_line: Option<usize>,
    ) -> Self {
        LogPass {
            plot: plot.then(|| LogPlot {
                sampler: Downsampler::new(),
                segments: segments.into(),
                allocations: 0,
                end: 0.0,
            }),
            torch,
            failure_line,
            failure_t: None,
        }
    }

    /// Reads the log at `path`.
    ///
    /// # Errors
    /// As [`read_log`].
    pub fn run(mut self, path: &Path) -> Result<LogPassed, Error> {
        read_log(path, |logged| {
            if self.failure_t.is_none() && Some(logged.line) == self.failure_line {
                self.failure_t = Some(logged.t);
            }
            if let Some(e) = logged.memory_event() {
                if let Some(p) = &mut self.plot {
                    p.push(e);
                }
                if let Some(t) = &mut self.torch {
                    t.push(&e);
                }
            }
            true
        })?;
        Ok(LogPassed {
            sampler: self.plot.map(LogPlot::finish),
            torch: self.torch,
            failure_t: self.failure_t.unwrap_or(0.0),
        })
    }
}

/// What a [`LogPass`] found.
#[derive(Debug)]
pub struct LogPassed {
    /// The plot's samples on the log's clock.
    pub sampler: Option<Downsampler>,
    /// The trace of the log's events.
    pub torch: Option<TorchTrace>,
    /// The time of the failed line (0 without one).
    pub failure_t: f64,
}

/// Where the plot's events come from, in a few words.
pub fn plot_source(timed: bool, from_hooks: bool) -> &'static str {
    match (timed, from_hooks) {
        (true, true) => "on the log's clock; reserved from the pool's events",
        (true, false) => "on the log's clock, from its events",
        (false, true) => "on the replay's clock (the log has no times), from the pool's events",
        (false, false) => "from the log's events (the log has no times)",
    }
}

/// The timeline `--plot` draws (see the module documentation) from `sampler`'s samples,
/// with a mark at `oom_t` when the replay failed.
pub fn plot_timeline(
    name: &str,
    device: u32,
    total: u64,
    report: &ReplayReport,
    sampled: (Vec<Sample>, Vec<MemoryEvent>),
    oom_t: f64,
) -> Timeline {
    let marks = match &report.failure {
        Some(f) => vec![Mark {
            t: oom_t,
            device: Some(device),
            kind: MarkKind::OutOfMemory,
            label: format!("out of memory: {} (line {})", bytes(f.bytes as u64), f.line),
        }],
        None => Vec::new(),
    };
    let (samples, events) = sampled;
    Timeline {
        title: format!("rmm replay {name}: {}", report.resource),
        devices: vec![DeviceTimeline {
            device,
            total_memory: Some(total),
            samples,
            events,
        }],
        marks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn log_times_are_seconds_since_the_first_and_cross_midnight() {
        let f = log_file(
            "Thread,Time,Action,Pointer,Size,Stream\n\
             1,23:59:59.500000,allocate,0x100,256,0x0\n\
             \n\
             1,23:59:59.750000,allocate failure,0x0,512,0x0\n\
             1,00:00:00.250000,free,0x100,256,0x0\n",
        );
        let (mut times, mut lines, mut events) = (Vec::new(), Vec::new(), Vec::new());
        read_log(f.path(), |e| {
            times.push(e.t);
            lines.push(e.line);
            events.extend(e.memory_event());
            true
        })
        .unwrap();
        assert_eq!(times, vec![0.0, 0.25, 0.75]);
        assert_eq!(lines, vec![2, 4, 5], "the file's lines, blank ones counted");
        let actions: Vec<Action> = events.iter().map(|e| e.action).collect();
        assert_eq!(actions, [Action::Alloc, Action::Oom, Action::FreeCompleted]);
        assert_eq!(events[2].size, 256);
        assert_eq!(events[1].size, 512);
        assert!(log_is_timed(f.path()).unwrap());
        let untimed = log_file(
            "Thread,Time,Action,Pointer,Size,Stream\n1,x,allocate,0x100,256,0x0\n\
             1,x,free,0x100,256,0x0\n",
        );
        assert!(!log_is_timed(untimed.path()).unwrap());
    }

    #[test]
    fn frees_match_allocations_across_blocks_and_errors_name_the_files_line() {
        // More lines than a block: frees find their allocation in an earlier block.
        let mut text = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
        let n = BLOCK_LINES + 10;
        for i in 0..n {
            text.push_str(&format!(
                "1,10:00:00.{i:06},allocate,{:#x},{},0x0\n",
                0x1000 + i * 0x100,
                256 + i
            ));
        }
        for i in 0..n {
            text.push_str(&format!(
                "1,10:00:01.{i:06},free,{:#x},0,0x0\n",
                0x1000 + i * 0x100
            ));
        }
        let f = log_file(&text);
        let mut freed = Vec::new();
        read_log(f.path(), |e| {
            freed.extend(e.freed);
            true
        })
        .unwrap();
        assert_eq!(freed, (0..n).map(|i| 256 + i).collect::<Vec<_>>());
        // A line the file's scan would have refused, in the second block.
        text.push_str("1,10:00:02.000000,allocate,0x100\n");
        let f = log_file(&text);
        let e = read_log(f.path(), |_| true).unwrap_err().to_string();
        assert!(e.contains(&format!(" line {}:", 2 * n + 2)), "{e}");
    }

    #[test]
    fn segments_move_to_the_time_of_the_allocation_they_came_before() {
        let e = |t, action, size| MemoryEvent {
            t,
            action,
            addr: 0x100,
            size,
            stream: 0,
        };
        // The replay's hooks: a segment, two allocations, another segment, a third, and a
        // segment given back after the last.
        let mut hooked = Hooked::new(0, true, false, None);
        for ev in [
            e(0.001, Action::SegmentAlloc, 1 << 30),
            e(0.002, Action::Alloc, 256),
            e(0.003, Action::Alloc, 256),
            e(0.004, Action::SegmentAlloc, 1 << 30),
            e(0.005, Action::Alloc, 256),
            e(0.009, Action::SegmentFree, 1 << 30),
        ] {
            hooked.event(0, &ev);
        }
        hooked.event(1, &e(0.010, Action::Alloc, 256));
        assert!(hooked.served_any());
        // The log's clock.
        let mut pass = LogPass::new(true, hooked.take_segments(), None, None);
        let Some(plot) = &mut pass.plot else {
            panic!("a plot")
        };
        for ev in [
            e(1.0, Action::Alloc, 256),
            e(2.0, Action::Alloc, 256),
            e(3.0, Action::Alloc, 256),
            e(4.0, Action::FreeCompleted, 256),
        ] {
            plot.push(ev);
        }
        let Some(plot) = pass.plot else {
            panic!("a plot")
        };
        let (_, events) = plot.finish().finish();
        let moved: Vec<(f64, Action)> = events
            .iter()
            .filter(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentFree))
            .map(|e| (e.t, e.action))
            .collect();
        assert_eq!(
            moved,
            [
                (1.0, Action::SegmentAlloc),
                (3.0, Action::SegmentAlloc),
                (4.0, Action::SegmentFree)
            ]
        );
    }
}
