//! Replaying memory event logs, a tool over any resource (as RMM's replay benchmark is, not
//! an adaptor): a log in RMM's CSV format (RMM's own, or one written by
//! [`LoggingResourceAdaptor`](rmm::allocator::adaptor::LoggingResourceAdaptor)) played against
//! any resource, each logged thread's events in order on one replay thread, reporting the wall time, the peak bytes in use and
//! whether every allocation succeeded. On the unbacked simulated device this answers "would
//! this workload fit on a 40 GiB GPU with this pool?" on any machine, as RMM's replay
//! benchmark does.
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
//! # Threads
//! A replay runs on at most [`ReplayOptions::max_threads`] threads (by default the machine's
//! hardware threads, and at least 64): a log of more logged threads (a program whose threads
//! come and go leaves thousands of thread ids) has several logged threads share a replay
//! thread, each logged thread on one of them, so its events stay in order. The replay threads
//! are started as logged threads first need one; later ones are shared out in turn.
//!
//! [`replay`] holds the whole [`EventLog`] in memory; [`replay_streamed`] replays a
//! [`LogReader`](rmm::allocator::event_log::LogReader) as it reads it, once (memory independent
//! of the log's length; a pipe works as well as a file; in logged order on the calling thread),
//! which is what `rmm replay` uses.
//!
//! Logged streams are mapped to streams created for the replay (the default stream stays the
//! default stream), so cross-stream frees stay cross-stream. `allocate failure` lines are
//! counted and skipped, as are frees of pointers the log never allocated (a log that starts
//! mid-run) and zero-byte allocations.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use assign::Assignment;
use rmm::allocator::adaptor::{LogAction, chain_names, find_in_chain};
use rmm::allocator::backend::DevicePtr;
use rmm::allocator::event_log::EventLog;
use rmm::allocator::resource::{DeviceMemoryResource, PoolMemoryResource};
use rmm::allocator::{Error, Result, Stream, StreamView, fmt_bytes};

mod assign;
mod streamed;

pub use streamed::replay_streamed;

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
    /// The most threads a replay runs on; 0 (the default): the machine's hardware threads,
    /// and at least 64 (see the module documentation).
    pub max_threads: usize,
}

/// Replay threads at least, when [`ReplayOptions::max_threads`] is 0: logs of up to this many
/// threads get one replay thread per logged thread on any machine.
const DEFAULT_MIN_THREADS: usize = 64;

impl ReplayOptions {
    /// The most threads a replay runs on (at least 1).
    fn thread_limit(&self) -> usize {
        match self.max_threads {
            0 => std::thread::available_parallelism()
                .map_or(DEFAULT_MIN_THREADS, NonZeroUsize::get)
                .max(DEFAULT_MIN_THREADS),
            n => n,
        }
    }
}

/// The allocation (or free) that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayFailure {
    /// Its line in the log.
    pub line: usize,
    /// The logged thread.
    pub thread: String,
    /// The line's logged time (microseconds since midnight), when it has one.
    pub time_us: Option<u64>,
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
    /// Threads the replay ran on (1 in logged order when streamed).
    pub threads: usize,
    /// Logged threads whose events were replayed (as many as [`ReplayReport::threads`], or
    /// more when they shared threads).
    pub logged_threads: usize,
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
    /// The most bytes the first pool in the chain held during the replay: the memory the
    /// pool needed (a pool that gives memory back holds less at the end).
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
            "events:     {} ({} allocations, {} frees replayed; {} thread(s){}, {} stream(s), {} order)",
            self.events,
            self.allocations,
            self.frees,
            self.threads,
            match self.order {
                ReplayOrder::Concurrent if self.logged_threads != self.threads =>
                    format!(" for {} logged threads", self.logged_threads),
                _ => String::new(),
            },
            self.streams,
            self.order
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
                "reserved:   {} ({r} bytes) held by the pool at its peak",
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

struct ReplayState<'a> {
    log: &'a EventLog,
    resource: &'a dyn DeviceMemoryResource,
    streams: Vec<StreamView>,
    stream_of: HashMap<u64, usize>,
    /// Replayed pointer of each allocation event (0: not allocated, or freed).
    slots: Vec<AtomicU64>,
    turn: AtomicUsize,
    /// The replay thread of each step (by `seq`), and each replay thread's handle: in logged
    /// order the thread whose turn comes is woken, not found by threads spinning in turn
    /// (more replay threads than cores would make each turn a round of the scheduler).
    owner: Vec<u32>,
    handles: Vec<OnceLock<std::thread::Thread>>,
    stop: AtomicBool,
    live_bytes: AtomicI64,
    live_count: AtomicI64,
    peak_bytes: AtomicI64,
    peak_count: AtomicI64,
    failure: Mutex<Option<ReplayFailure>>,
}

impl ReplayState<'_> {
    fn stream(&self, logged: u64) -> StreamView {
        self.stream_of
            .get(&logged)
            .map_or(StreamView::DEFAULT, |&i| self.streams[i])
    }

    /// Waits until it is step `seq`'s turn (logged order): a short spin, then parked until
    /// the step before it wakes this thread (an unpark that came before a park makes it
    /// return at once). False when the replay stopped.
    fn wait_turn(&self, seq: usize) -> bool {
        self.spin_then(
            || self.turn.load(Ordering::Acquire) == seq,
            std::thread::park,
        )
    }

    /// Gives the turn to step `seq` and wakes its replay thread.
    fn pass_turn(&self, seq: usize) {
        self.turn.store(seq, Ordering::Release);
        if let Some(&w) = self.owner.get(seq)
            && let Some(thread) = self.handles.get(w as usize).and_then(OnceLock::get)
        {
            thread.unpark();
        }
    }

    fn wait(&self, ready: impl Fn() -> bool) -> bool {
        self.spin_then(ready, std::thread::yield_now)
    }

    /// Waits until `ready`: a short spin, then `idle` between looks. False when the replay
    /// stopped.
    fn spin_then(&self, ready: impl Fn() -> bool, idle: fn()) -> bool {
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
                idle();
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
                time_us: e.time_us,
                action: e.action,
                bytes: e.size,
                live_bytes: self.live_bytes.load(Ordering::Relaxed).max(0) as u64,
                error: error.to_string(),
            });
        }
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.handles.iter().filter_map(OnceLock::get) {
            thread.unpark();
        }
    }

    fn run(&self, steps: &[Step], order: ReplayOrder) {
        for step in steps {
            let ready = match (order, step.kind) {
                (ReplayOrder::Logged, _) => self.wait_turn(step.seq),
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
                self.pass_turn(step.seq + 1);
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
///
/// # Errors
/// [`Error::EventLog`] when `log` fails [`EventLog::check`];
/// [`Error::Driver`] when a stream cannot be created.
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
    // Steps per replay thread, in log order.
    let mut assignment = Assignment::new(options.thread_limit());
    let mut per_thread: Vec<Vec<Step>> = Vec::new();
    let mut owner: Vec<u32> = Vec::new();
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
        let mut start = |_| {
            per_thread.push(Vec::new());
            true
        };
        if let Some(w) = assignment.of(e.thread, &mut start) {
            per_thread[w].push(step);
            // Replay threads are fewer than the limit, itself far below 2^32.
            owner.push(w as u32);
        }
        seq += 1;
    }
    let shared = ReplayState {
        log,
        resource,
        streams: owned.iter().map(Stream::view).collect(),
        stream_of,
        slots: (0..log.events.len()).map(|_| AtomicU64::new(0)).collect(),
        turn: AtomicUsize::new(0),
        owner,
        handles: (0..per_thread.len()).map(|_| OnceLock::new()).collect(),
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
    // The threads wait at this gate until every one has started and said where it can be
    // woken (counted in the gate: the count's lock makes every handle seen before any turn
    // is passed): `Some(true)` runs them, `Some(false)` (a thread could not be started)
    // sends them home.
    let gate = (Mutex::new((0usize, None::<bool>)), Condvar::new());
    let lock = || {
        gate.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    let open = |go: bool| {
        lock().1 = Some(go);
        gate.1.notify_all();
    };
    let mut start = Instant::now();
    let spawned: std::io::Result<()> = std::thread::scope(|scope| {
        for (n, steps) in per_thread.iter().enumerate() {
            let shared = &shared;
            let (lock, gate) = (&lock, &gate);
            let order = options.order;
            let thread = std::thread::Builder::new()
                .name(format!("rmm-replay-{n}"))
                .spawn_scoped(scope, move || {
                    // Set once, by this thread: it cannot fail.
                    let _ = shared.handles[n].set(std::thread::current());
                    let mut g = lock();
                    g.0 += 1;
                    gate.1.notify_all();
                    while g.1.is_none() {
                        g = gate
                            .1
                            .wait(g)
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                    }
                    let run = g.1 == Some(true);
                    drop(g);
                    if run {
                        shared.run(steps, order);
                    }
                });
            if let Err(e) = thread {
                open(false);
                return Err(e);
            }
        }
        let mut g = lock();
        while g.0 < per_thread.len() {
            g = gate
                .1
                .wait(g)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        drop(g);
        start = Instant::now();
        open(true);
        Ok(())
    });
    if let Err(e) = spawned {
        return Err(Error::invalid_argument(
            "replay threads",
            per_thread.len(),
            format!(
                "that many threads can start ({e}); set ReplayOptions::max_threads lower, or \
                 replay where more threads can start"
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
        find_in_chain::<PoolMemoryResource>(resource).map(PoolMemoryResource::peak_pool_size);
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
        threads: per_thread.len(),
        logged_threads: assignment.logged(),
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
