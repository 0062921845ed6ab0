//! Replaying a log as it is read, once: memory grows with the allocations live at once and
//! the logged threads, never with the length of the log (an in-memory
//! [`EventLog`](rmm::allocator::event_log::EventLog) of a 4 M-line log takes hundreds of MB),
//! and the log may come from a pipe.
//!
//! [`replay_streamed`] plays each event of a [`LogReader`] as it is read:
//!
//! * [`ReplayOrder::Concurrent`]: each logged thread's events go, in order, to the replay
//!   thread it was given (see [`super`]'s Threads), through a bounded queue per replay thread;
//!   a free of an allocation made on another replay thread waits until that allocation has
//!   been replayed. The earliest event not yet replayed can always run (everything before it
//!   in the log has been), so the queues never deadlock.
//! * [`ReplayOrder::Logged`]: every event on the calling thread, in log order: the logged
//!   peak is reproduced without handing each event from thread to thread.
//!
//! A line that does not parse stops the replay; what it allocated is freed, then the line's
//! error is returned. After an allocation fails, the rest of the log is still read (not
//! replayed), so that the report's figures of the log (its peak, its events) are the whole
//! log's.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::thread::Scope;
use std::time::Instant;

use crossbeam_channel::Sender;
use parking_lot::Mutex;

use rmm::allocator::adaptor::{LogAction, chain_names, find_in_chain};
use rmm::allocator::backend::DevicePtr;
use rmm::allocator::event_log::{Freed, LogEvent, LogLine, LogReader};
use rmm::allocator::resource::{DeviceMemoryResource, PoolMemoryResource};
use rmm::allocator::{Device, Error, Result, Stream, StreamView};

use super::assign::Assignment;
use super::{ReplayFailure, ReplayOptions, ReplayOrder, ReplayReport};

/// Operations handed to a replay thread at once (one channel message), and batches queued
/// ahead of it.
const BATCH: usize = 256;
const QUEUE: usize = 16;

/// Sentinel of a slot whose allocation failed or was skipped (after a failure).
const NONE: u64 = u64::MAX;

/// One replayed allocation: its pointer once made (0 before, [`NONE`] if it never will be).
struct Slot {
    ptr: AtomicU64,
    size: usize,
    line: usize,
    time_us: Option<u64>,
    thread: usize,
    stream: StreamView,
}

enum Op {
    Alloc(Arc<Slot>),
    Free {
        slot: Arc<Slot>,
        line: usize,
        time_us: Option<u64>,
        thread: usize,
        stream: StreamView,
    },
}

impl Op {
    fn thread(&self) -> usize {
        match self {
            Op::Alloc(slot) => slot.thread,
            Op::Free { thread, .. } => *thread,
        }
    }
}

/// The first operation that failed, its logged thread by index (named at the end: the names
/// grow as the log is read).
struct Failed {
    line: usize,
    time_us: Option<u64>,
    thread: usize,
    action: LogAction,
    bytes: usize,
    live_bytes: u64,
    error: String,
}

struct State<'a> {
    resource: &'a dyn DeviceMemoryResource,
    stop: AtomicBool,
    live_bytes: AtomicI64,
    live_count: AtomicI64,
    peak_bytes: AtomicI64,
    peak_count: AtomicI64,
    failure: Mutex<Option<Failed>>,
    /// Slots a free gave up on (the replay stopped): freed at the end if they were made.
    leftovers: Mutex<Vec<Arc<Slot>>>,
}

impl State<'_> {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Records the first failure (`at`: its line, logged time and logged thread) and stops
    /// the replay.
    fn fail(&self, at: (usize, Option<u64>, usize), action: LogAction, bytes: usize, e: &Error) {
        let (line, time_us, thread) = at;
        let mut f = self.failure.lock();
        if f.is_none() {
            *f = Some(Failed {
                line,
                time_us,
                thread,
                action,
                bytes,
                live_bytes: self.live_bytes.load(Ordering::Relaxed).max(0) as u64,
                error: e.to_string(),
            });
        }
        self.stop.store(true, Ordering::Relaxed);
    }

    fn run(&self, op: Op) {
        match op {
            Op::Alloc(slot) => {
                if self.stopped() {
                    slot.ptr.store(NONE, Ordering::Release);
                    return;
                }
                match self.resource.allocate(slot.size, slot.stream) {
                    Ok(p) => {
                        slot.ptr.store(p.addr().max(1), Ordering::Release);
                        let b = self
                            .live_bytes
                            .fetch_add(slot.size as i64, Ordering::Relaxed)
                            + slot.size as i64;
                        let c = self.live_count.fetch_add(1, Ordering::Relaxed) + 1;
                        self.peak_bytes.fetch_max(b, Ordering::Relaxed);
                        self.peak_count.fetch_max(c, Ordering::Relaxed);
                    }
                    Err(e) => {
                        slot.ptr.store(NONE, Ordering::Release);
                        let at = (slot.line, slot.time_us, slot.thread);
                        self.fail(at, LogAction::Allocate, slot.size, &e);
                    }
                }
            }
            Op::Free {
                slot,
                line,
                time_us,
                thread,
                stream,
            } => {
                let mut spins = 0u32;
                let p = loop {
                    let p = slot.ptr.load(Ordering::Acquire);
                    if p != 0 {
                        break p;
                    }
                    if self.stopped() {
                        self.leftovers.lock().push(slot);
                        return;
                    }
                    if spins < 100 {
                        std::hint::spin_loop();
                        spins += 1;
                    } else {
                        std::thread::yield_now();
                    }
                };
                if p == NONE {
                    return;
                }
                slot.ptr.store(0, Ordering::Relaxed);
                match self.resource.deallocate(DevicePtr(p), slot.size, stream) {
                    Ok(()) => {
                        self.live_bytes
                            .fetch_sub(slot.size as i64, Ordering::Relaxed);
                        self.live_count.fetch_sub(1, Ordering::Relaxed);
                    }
                    Err(e) => self.fail((line, time_us, thread), LogAction::Free, slot.size, &e),
                }
            }
        }
    }

    /// Frees `slot`'s allocation if it was made and not freed (at the end of the replay).
    fn free_left(&self, slot: &Slot) {
        let p = slot.ptr.swap(NONE, Ordering::AcqRel);
        if p != 0
            && p != NONE
            && let Err(e) = self
                .resource
                .deallocate(DevicePtr(p), slot.size, slot.stream)
        {
            tracing::warn!(
                "replay: freeing the allocation of line {} ({} bytes) at the end: {e}",
                slot.line,
                slot.size
            );
        }
    }
}

/// Turns the log's events into operations: the slots of the allocations the log has live,
/// and the streams made (as first seen) for the logged ones.
struct Feed {
    device: Device,
    own_streams: bool,
    streams: Vec<Stream>,
    stream_of: HashMap<u64, StreamView>,
    /// Logged pointer → its replayed slot, while the log has it live.
    live: HashMap<u64, Arc<Slot>>,
    allocations: usize,
    frees: usize,
    /// Per logged thread (by index): whether an event of it was replayed.
    busy: Vec<bool>,
    logged_threads: usize,
}

impl Feed {
    fn stream(&mut self, logged: u64) -> Result<StreamView> {
        if logged == 0 || !self.own_streams {
            return Ok(StreamView::DEFAULT);
        }
        if let Some(&view) = self.stream_of.get(&logged) {
            return Ok(view);
        }
        let stream = Stream::new(self.device)?;
        let view = stream.view();
        self.streams.push(stream);
        self.stream_of.insert(logged, view);
        Ok(view)
    }

    /// The operation that replays `e`, if any.
    fn op(&mut self, e: &LogEvent, freed: Option<Freed>) -> Result<Option<Op>> {
        let op = self.make(e, freed)?;
        if op.is_some() {
            if self.busy.len() <= e.thread {
                self.busy.resize(e.thread + 1, false);
            }
            if !std::mem::replace(&mut self.busy[e.thread], true) {
                self.logged_threads += 1;
            }
        }
        Ok(op)
    }

    fn make(&mut self, e: &LogEvent, freed: Option<Freed>) -> Result<Option<Op>> {
        Ok(match (e.action, freed) {
            (LogAction::Allocate, _) if e.ptr != 0 && e.size != 0 => {
                let slot = Arc::new(Slot {
                    ptr: AtomicU64::new(0),
                    size: e.size,
                    line: e.line,
                    time_us: e.time_us,
                    thread: e.thread,
                    stream: self.stream(e.stream)?,
                });
                self.live.insert(e.ptr, Arc::clone(&slot));
                self.allocations += 1;
                Some(Op::Alloc(slot))
            }
            (LogAction::Free, Some(f)) if f.size != 0 => match self.live.remove(&e.ptr) {
                Some(slot) => {
                    self.frees += 1;
                    Some(Op::Free {
                        slot,
                        line: e.line,
                        time_us: e.time_us,
                        thread: e.thread,
                        stream: self.stream(e.stream)?,
                    })
                }
                None => None,
            },
            (LogAction::Free, Some(_)) => {
                // A zero-byte allocation was not replayed.
                self.live.remove(&e.ptr);
                None
            }
            _ => None,
        })
    }
}

/// The replay threads of a concurrent replay and their queues, fed in batches.
struct Workers<'scope, 'env, 'r> {
    scope: &'scope Scope<'scope, 'env>,
    state: &'scope State<'r>,
    assignment: Assignment,
    queues: Vec<Sender<Vec<Op>>>,
    pending: Vec<Vec<Op>>,
}

impl<'scope, 'r: 'scope> Workers<'scope, '_, 'r> {
    /// Hands `op` to its logged thread's replay thread (started if it is the first).
    fn push(&mut self, op: Op) -> Result<()> {
        let (scope, state) = (self.scope, self.state);
        let (queues, pending) = (&mut self.queues, &mut self.pending);
        let mut start = |n: usize| {
            let (tx, rx) = crossbeam_channel::bounded::<Vec<Op>>(QUEUE);
            let started = std::thread::Builder::new()
                .name(format!("rmm-replay-{n}"))
                .spawn_scoped(scope, move || {
                    for batch in rx {
                        for op in batch {
                            state.run(op);
                        }
                    }
                });
            match started {
                Ok(_) => {
                    queues.push(tx);
                    pending.push(Vec::with_capacity(BATCH));
                    true
                }
                Err(e) => {
                    tracing::warn!(
                        "replay: replay thread {n} could not start ({e}): the logged threads \
                         share the {n} that run"
                    );
                    false
                }
            }
        };
        let Some(w) = self.assignment.of(op.thread(), &mut start) else {
            return Err(Error::invalid_argument(
                "replay threads",
                0,
                "a thread to replay on, but none could start; replay in logged order \
                 (ReplayOrder::Logged), which runs on the calling thread",
            ));
        };
        // Whatever a replay thread waits for has been handed over: a free of an allocation
        // made on another replay thread first sends that thread's batch.
        if let Op::Free { slot, .. } = &op
            && let Some(a) = self.assignment.get(slot.thread)
            && a != w
        {
            self.send(a);
        }
        self.pending[w].push(op);
        if self.pending[w].len() >= BATCH {
            self.send(w);
        }
        Ok(())
    }

    fn send(&mut self, w: usize) {
        if !self.pending[w].is_empty() {
            let batch = std::mem::replace(&mut self.pending[w], Vec::with_capacity(BATCH));
            // A closed queue cannot happen: its thread runs until the queue closes.
            let _ = self.queues[w].send(batch);
        }
    }

    /// Sends what is pending and closes the queues (the threads end once they are empty);
    /// returns how many replay threads ran.
    fn finish(mut self) -> usize {
        for w in 0..self.queues.len() {
            self.send(w);
        }
        self.assignment.started()
    }
}

/// Replays `log` on the calling thread, in log order, until its end or a failure.
fn replay_logged(log: &mut LogReader<'_>, feed: &mut Feed, state: &State<'_>) -> Result<()> {
    while let Some(LogLine { event: e, freed }) = log.next_event()? {
        if let Some(op) = feed.op(&e, freed)? {
            state.run(op);
        }
        if state.stopped() {
            break;
        }
    }
    Ok(())
}

/// Replays `log` on at most `limit` replay threads until its end or a failure; returns how
/// many ran.
fn replay_concurrent(
    log: &mut LogReader<'_>,
    feed: &mut Feed,
    state: &State<'_>,
    limit: usize,
) -> Result<usize> {
    std::thread::scope(|scope| {
        let mut workers = Workers {
            scope,
            state,
            assignment: Assignment::new(limit),
            queues: Vec::new(),
            pending: Vec::new(),
        };
        let read = (|| -> Result<()> {
            while let Some(LogLine { event: e, freed }) = log.next_event()? {
                if let Some(op) = feed.op(&e, freed)? {
                    workers.push(op)?;
                }
                if state.stopped() {
                    break;
                }
            }
            Ok(())
        })();
        if read.is_err() {
            // The replay threads skip what is left, and the scope waits for them.
            state.stop.store(true, Ordering::Relaxed);
        }
        let threads = workers.finish();
        read.map(|()| threads)
    })
}

/// Replays the log `log` reads against `resource` as it reads it, once (see the module
/// documentation). Returns the report, with [`ReplayReport::failure`] set when an operation
/// failed; `Err` when a line of the log cannot be read or does not parse (after what the
/// replay allocated has been freed), or the replay could not be set up.
///
/// # Errors
/// [`Error::EventLog`] naming the line that cannot be read or does not
/// parse; [`Error::Driver`] when a stream cannot be created;
/// [`Error::InvalidArgument`] when no replay thread can start.
pub fn replay_streamed(
    mut log: LogReader<'_>,
    resource: &dyn DeviceMemoryResource,
    options: &ReplayOptions,
) -> Result<ReplayReport> {
    let device = resource.device();
    let state = State {
        resource,
        stop: AtomicBool::new(false),
        live_bytes: AtomicI64::new(0),
        live_count: AtomicI64::new(0),
        peak_bytes: AtomicI64::new(0),
        peak_count: AtomicI64::new(0),
        failure: Mutex::new(None),
        leftovers: Mutex::new(Vec::new()),
    };
    let mut feed = Feed {
        device,
        own_streams: !options.default_stream_only,
        streams: Vec::new(),
        stream_of: HashMap::new(),
        live: HashMap::new(),
        allocations: 0,
        frees: 0,
        busy: Vec::new(),
        logged_threads: 0,
    };
    let _span =
        tracing::debug_span!("replay", log = %log.source(), order = %options.order).entered();
    let start = Instant::now();
    let replayed = match options.order {
        ReplayOrder::Logged => replay_logged(&mut log, &mut feed, &state).map(|()| 1),
        ReplayOrder::Concurrent => {
            replay_concurrent(&mut log, &mut feed, &state, options.thread_limit())
        }
    };
    let elapsed = start.elapsed();
    for s in &feed.streams {
        if let Err(e) = s.synchronize() {
            tracing::warn!("replay: synchronizing a stream: {e}");
        }
    }
    let reserved_bytes =
        find_in_chain::<PoolMemoryResource>(resource).map(PoolMemoryResource::peak_pool_size);
    for slot in feed.live.values().chain(state.leftovers.lock().iter()) {
        state.free_left(slot);
    }
    for s in &feed.streams {
        if let Err(e) = s.synchronize() {
            tracing::warn!("replay: synchronizing a stream: {e}");
        }
    }
    let threads = replayed?;
    if state.stopped() {
        // The rest of the log, for its figures (and whoever inspects it): not replayed.
        while log.next_event()?.is_some() {}
    }
    let figures = log.figures();
    let failure = state.failure.into_inner().map(|f| ReplayFailure {
        line: f.line,
        thread: log.threads().get(f.thread).cloned().unwrap_or_default(),
        time_us: f.time_us,
        action: f.action,
        bytes: f.bytes,
        live_bytes: f.live_bytes,
        error: f.error,
    });
    Ok(ReplayReport {
        source: log.source().to_string(),
        resource: chain_names(resource),
        device: device.ordinal(),
        order: options.order,
        events: figures.events,
        allocations: feed.allocations,
        frees: feed.frees,
        threads,
        logged_threads: feed.logged_threads,
        streams: feed.streams.len(),
        elapsed,
        peak_bytes: state.peak_bytes.load(Ordering::Relaxed).max(0) as u64,
        peak_allocations: state.peak_count.load(Ordering::Relaxed).max(0) as u64,
        logged_peak_bytes: figures.peak_bytes,
        reserved_bytes,
        skipped_frees: figures.unmatched_frees,
        logged_failures: figures.logged_failures,
        unfreed: figures.unfreed,
        failure,
    })
}
