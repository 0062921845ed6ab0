//! The replay's timeline and PyTorch snapshot, built as the events come, in memory that does
//! not grow with the length of the log, from the one reading of the log the replay does.
//!
//! During the replay, the pool's hook events go to a [`Hooked`] (the sink of a streaming
//! [`Recorder`](rmm_cli::timeline::Recorder)), and the log's own events, as the replay reads
//! them, to a [`LogPass`] ([`LogReader::inspect`](rmm::allocator::event_log::LogReader::inspect)).
//!
//! The plot is on the log's own clock when the log has times: the bytes in use are the log's
//! (its allocations and frees at the times it recorded them); the bytes the pool reserved
//! come from the pool's segment events during the replay, moved onto the log's clock by the
//! allocation each came before (the n-th allocation the pool served is the log's n-th). A log
//! without times keeps the replay's clock. Either way the samples go through a
//! [`Downsampler`](rmm_cli::timeline::Downsampler): exact up to its limit, binned past it.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use rmm::allocator::adaptor::LogAction;
use rmm::allocator::event_log::LogLine;
use rmm_cli::replay::{ReplayFailure, ReplayReport};
use rmm_cli::timeline::{
    Action, DeviceTimeline, Downsampler, Mark, MarkKind, MemoryEvent, Sample, Timeline, TorchTrace,
};
use rmm_cli::units::bytes;

/// Out-of-memory events a [`Hooked`] keeps (a replay stops at its first failure, which
/// makes one or two).
const KEPT_OOMS: usize = 64;

/// Log events a plot on the log's clock holds back at most while the pool has not served
/// their allocations yet (see [`LogPlot`]): past this, they are drawn anyway.
const MAX_WAITING: usize = 1 << 16;

/// Log events between two looks at the pool's segments.
const SETTLE_EVERY: usize = 256;

/// The log's event `line`, at `t` seconds, as an allocator event: allocations, frees of
/// allocations the log made (others are skipped, as the replay skips them) and logged
/// failures as out-of-memory.
fn memory_event(line: &LogLine, t: f64) -> Option<MemoryEvent> {
    let e = &line.event;
    let (action, addr, size) = match (e.action, line.freed.map(|f| f.size)) {
        (LogAction::Allocate, _) if e.ptr != 0 && e.size != 0 => (Action::Alloc, e.ptr, e.size),
        (LogAction::Free, Some(size)) => (Action::FreeCompleted, e.ptr, size),
        (LogAction::AllocateFailure, _) => (Action::Oom, 0, e.size),
        _ => return None,
    };
    Some(MemoryEvent {
        t,
        action,
        addr,
        size: size as u64,
        stream: e.stream,
    })
}

/// The log's clock: microseconds since midnight to seconds since the first timed event (an
/// untimed event takes the time before it; a log that crosses midnight keeps counting).
#[derive(Debug, Default)]
struct LogClock {
    first: Option<u64>,
    last: u64,
    /// Microseconds added for the midnights crossed, and from which line each sum holds.
    wraps: Vec<(usize, u64)>,
    t: f64,
}

impl LogClock {
    const DAY_US: u64 = 86_400_000_000;

    fn wrap(&self) -> u64 {
        self.wraps.last().map_or(0, |w| w.1)
    }

    /// The time of line `line`, logged at `time_us`.
    fn at(&mut self, line: usize, time_us: Option<u64>) -> f64 {
        if let Some(us) = time_us {
            let start = *self.first.get_or_insert(us);
            if us < self.last {
                self.wraps.push((line, self.wrap() + Self::DAY_US));
            }
            self.last = us;
            self.t = (us + self.wrap()).saturating_sub(start) as f64 / 1e6;
        }
        self.t
    }

    /// The time of an earlier line `line`, logged at `time_us` (without one: the last time
    /// read).
    fn of_earlier(&self, line: usize, time_us: Option<u64>) -> f64 {
        let (Some(start), Some(us)) = (self.first, time_us) else {
            return self.t;
        };
        let wrap = self
            .wraps
            .iter()
            .rev()
            .find(|w| w.0 <= line)
            .map_or(0, |w| w.1);
        (us + wrap).saturating_sub(start) as f64 / 1e6
    }
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

    /// Block allocations the pool served so far.
    pub fn served(&self) -> u64 {
        self.served
    }

    /// Takes the segment events so far out (empty without them); later ones are kept.
    pub fn take_segments(&mut self) -> Vec<(u64, MemoryEvent)> {
        self.segments
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
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
///
/// The log is read ahead of the replay (a concurrent replay's queues), so a log allocation
/// waits in `waiting` until the pool has served as many: then every segment the pool took
/// before it is known, and drawn first. At most [`MAX_WAITING`] events wait (a resource
/// whose pool serves fewer allocations than the log has draws them without its segments).
#[derive(Debug)]
struct LogPlot {
    sampler: Downsampler,
    /// Log events not drawn yet, in log order.
    waiting: VecDeque<MemoryEvent>,
    /// The pool's segment events not drawn yet, with the allocations served before each.
    segments: VecDeque<(u64, MemoryEvent)>,
    /// Log allocations drawn.
    allocations: u64,
    /// Waiting events at which the pool is looked at again.
    settle_at: usize,
    /// The latest time of an event drawn.
    end: f64,
}

impl LogPlot {
    fn new() -> Self {
        LogPlot {
            sampler: Downsampler::new(),
            waiting: VecDeque::new(),
            segments: VecDeque::new(),
            allocations: 0,
            settle_at: SETTLE_EVERY,
            end: 0.0,
        }
    }

    /// Takes the log's next event; `hooked`, the pool's events so far.
    fn push(&mut self, e: MemoryEvent, hooked: Option<&Mutex<Hooked>>) {
        self.waiting.push_back(e);
        let Some(hooked) = hooked else {
            // No pool: nothing to wait for.
            self.draw_ready(u64::MAX);
            return;
        };
        if self.waiting.len() < self.settle_at {
            return;
        }
        let served = {
            let mut h = hooked.lock();
            // Segments count only once the pool served something (as at the end).
            if h.served() > 0 {
                self.segments.extend(h.take_segments());
            }
            h.served()
        };
        self.draw_ready(served);
        self.settle_at = self.waiting.len() + SETTLE_EVERY;
    }

    /// Draws the waiting events up to the first allocation the pool has not served yet
    /// (`served` so far), or past it while too many wait.
    fn draw_ready(&mut self, served: u64) {
        while let Some(&e) = self.waiting.front() {
            if e.action == Action::Alloc
                && served <= self.allocations
                && self.waiting.len() <= MAX_WAITING
            {
                break;
            }
            self.waiting.pop_front();
            self.draw(e);
        }
    }

    fn draw(&mut self, e: MemoryEvent) {
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

    /// Draws what waits, with the pool's `segments` not taken yet; segments after the last
    /// allocation the pool served are drawn at the log's last time.
    fn finish(mut self, segments: Vec<(u64, MemoryEvent)>) -> Downsampler {
        self.segments.extend(segments);
        self.draw_ready(u64::MAX);
        for (_, segment) in std::mem::take(&mut self.segments) {
            self.sampler.push(MemoryEvent {
                t: self.end,
                ..segment
            });
        }
        self.sampler
    }
}

/// The log's own events, taken as the replay reads them: whether the log has times, the
/// plot's samples on its clock and the time of a failed line, and a PyTorch trace of them.
#[derive(Debug)]
pub struct LogPass {
    clock: LogClock,
    timed: bool,
    plot: Option<LogPlot>,
    torch: Option<TorchTrace>,
    /// The pool's events, whose segments the plot draws.
    hooked: Option<Arc<Mutex<Hooked>>>,
}

impl LogPass {
    /// A pass that draws the log's events when `plot` (with the segments of `hooked`, the
    /// pool's events) and traces them into `torch`.
    pub fn new(plot: bool, torch: Option<TorchTrace>, hooked: Option<Arc<Mutex<Hooked>>>) -> Self {
        LogPass {
            clock: LogClock::default(),
            timed: false,
            plot: plot.then(LogPlot::new),
            torch,
            hooked,
        }
    }

    /// Takes the log's next event.
    pub fn push(&mut self, line: &LogLine) {
        let t = self.clock.at(line.event.line, line.event.time_us);
        // Timed: an event after the first timed one at another time.
        self.timed |= t > 0.0;
        if let Some(e) = memory_event(line, t) {
            if let Some(p) = &mut self.plot {
                p.push(e, self.hooked.as_deref());
            }
            if let Some(trace) = &mut self.torch {
                trace.push(&e);
            }
        }
    }

    /// What the pass found, once the log has been read: `segments` are the pool's segment
    /// events not taken yet (none when the pool served nothing), `failure` the replay's.
    pub fn finish(
        self,
        segments: Vec<(u64, MemoryEvent)>,
        failure: Option<&ReplayFailure>,
    ) -> LogPassed {
        LogPassed {
            timed: self.timed,
            sampler: self.plot.map(|p| p.finish(segments)),
            torch: self.torch,
            failure_t: failure.map_or(0.0, |f| self.clock.of_earlier(f.line, f.time_us)),
        }
    }
}

/// What a [`LogPass`] found.
#[derive(Debug)]
pub struct LogPassed {
    /// True when the log has times (the plot is on its clock).
    pub timed: bool,
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
    use rmm::allocator::event_log::LogReader;

    use super::*;

    /// Every event of `text`, with its time on the log's clock.
    fn read(text: &str) -> (Vec<(LogLine, f64)>, LogClock) {
        let mut log = LogReader::new(text.as_bytes(), "t.csv").unwrap();
        let (mut clock, mut out) = (LogClock::default(), Vec::new());
        while let Some(line) = log.next_event().unwrap() {
            let t = clock.at(line.event.line, line.event.time_us);
            out.push((line, t));
        }
        (out, clock)
    }

    #[test]
    fn log_times_are_seconds_since_the_first_and_cross_midnight() {
        let (got, clock) = read(
            "Thread,Time,Action,Pointer,Size,Stream\n\
             1,23:59:59.500000,allocate,0x100,256,0x0\n\
             \n\
             1,23:59:59.750000,allocate failure,0x0,512,0x0\n\
             1,00:00:00.250000,free,0x100,256,0x0\n\
             1,23:59:59.000000,allocate,0x200,256,0x0\n",
        );
        let times: Vec<f64> = got.iter().map(|g| g.1).collect();
        assert_eq!(times, vec![0.0, 0.25, 0.75, 86_399.5]);
        let lines: Vec<usize> = got.iter().map(|g| g.0.event.line).collect();
        assert_eq!(
            lines,
            vec![2, 4, 5, 6],
            "the file's lines, blank ones counted"
        );
        let events: Vec<MemoryEvent> = got.iter().filter_map(|g| memory_event(&g.0, g.1)).collect();
        let actions: Vec<Action> = events.iter().map(|e| e.action).collect();
        assert_eq!(
            actions,
            [
                Action::Alloc,
                Action::Oom,
                Action::FreeCompleted,
                Action::Alloc
            ]
        );
        assert_eq!((events[1].size, events[2].size), (512, 256));
        // An earlier line's time, read after the clock crossed midnight: on its own day.
        assert_eq!(clock.of_earlier(4, Some(86_399_750_000)), 0.25);
        assert_eq!(clock.of_earlier(5, Some(250_000)), 0.75);
        assert_eq!(clock.of_earlier(6, Some(86_399_000_000)), 86_399.5);
        // The pass says whether the log has times.
        let timed = |text: &str| {
            let mut pass = LogPass::new(false, None, None);
            let mut log = LogReader::new(text.as_bytes(), "t.csv")
                .unwrap()
                .inspect(|l| pass.push(l));
            while log.next_event().unwrap().is_some() {}
            drop(log);
            pass.finish(Vec::new(), None).timed
        };
        let h = "Thread,Time,Action,Pointer,Size,Stream\n";
        assert!(timed(&format!(
            "{h}1,10:00:00.0,allocate,0x100,256,0x0\n1,10:00:00.5,free,0x100,256,0x0\n"
        )));
        assert!(!timed(&format!(
            "{h}1,x,allocate,0x100,256,0x0\n1,x,free,0x100,256,0x0\n"
        )));
    }

    fn event(t: f64, action: Action, size: u64) -> MemoryEvent {
        MemoryEvent {
            t,
            action,
            addr: 0x100,
            size,
            stream: 0,
        }
    }

    fn segments_drawn(plot: LogPlot, rest: Vec<(u64, MemoryEvent)>) -> Vec<(f64, Action)> {
        let (_, events) = plot.finish(rest).finish();
        events
            .iter()
            .filter(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentFree))
            .map(|e| (e.t, e.action))
            .collect()
    }

    #[test]
    fn segments_move_to_the_time_of_the_allocation_they_came_before() {
        // The replay's hooks: a segment, two allocations, another segment, a third, and a
        // segment given back after the last.
        let hooked = Mutex::new(Hooked::new(0, true, false, None));
        for ev in [
            event(0.001, Action::SegmentAlloc, 1 << 30),
            event(0.002, Action::Alloc, 256),
            event(0.003, Action::Alloc, 256),
            event(0.004, Action::SegmentAlloc, 1 << 30),
            event(0.005, Action::Alloc, 256),
            event(0.009, Action::SegmentFree, 1 << 30),
        ] {
            hooked.lock().event(0, &ev);
        }
        hooked.lock().event(1, &event(0.010, Action::Alloc, 256));
        assert_eq!(
            hooked.lock().served(),
            3,
            "another device's are not counted"
        );
        // The log's clock.
        let mut plot = LogPlot::new();
        for ev in [
            event(1.0, Action::Alloc, 256),
            event(2.0, Action::Alloc, 256),
            event(3.0, Action::Alloc, 256),
            event(4.0, Action::FreeCompleted, 256),
        ] {
            plot.push(ev, Some(&hooked));
        }
        let rest = hooked.lock().take_segments();
        assert_eq!(
            segments_drawn(plot, rest),
            [
                (1.0, Action::SegmentAlloc),
                (3.0, Action::SegmentAlloc),
                (4.0, Action::SegmentFree)
            ]
        );
    }

    #[test]
    fn a_segment_the_pool_takes_after_the_log_was_read_past_it_still_goes_before_its_allocation() {
        // The log is read ahead of the replay: all its allocations before the pool serves any.
        let hooked = Mutex::new(Hooked::new(0, true, false, None));
        let mut plot = LogPlot::new();
        let n = SETTLE_EVERY as u64;
        for i in 1..=n {
            plot.push(event(i as f64, Action::Alloc, 256), Some(&hooked));
        }
        assert_eq!(plot.waiting.len(), SETTLE_EVERY, "nothing served: all wait");
        // Then the pool serves ten, grows, and serves the rest.
        for i in 0..n {
            if i == 10 {
                hooked
                    .lock()
                    .event(0, &event(0.5, Action::SegmentAlloc, 1 << 30));
            }
            hooked.lock().event(0, &event(0.6, Action::Alloc, 256));
        }
        for i in n + 1..=2 * n {
            plot.push(event(i as f64, Action::FreeCompleted, 256), Some(&hooked));
        }
        assert!(plot.waiting.len() < SETTLE_EVERY, "drawn once served");
        assert_eq!(
            segments_drawn(plot, Vec::new()),
            [(11.0, Action::SegmentAlloc)],
            "at the eleventh allocation's time"
        );
        // Allocations the pool never serves (no hooks behind it) wait at most so many.
        let never = Mutex::new(Hooked::new(0, true, false, None));
        let mut plot = LogPlot::new();
        for i in 0..MAX_WAITING + 4 * SETTLE_EVERY {
            plot.push(event(i as f64, Action::Alloc, 256), Some(&never));
            assert!(plot.waiting.len() <= MAX_WAITING + SETTLE_EVERY);
        }
    }
}
