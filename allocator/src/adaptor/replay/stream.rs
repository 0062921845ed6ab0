//! Replaying a log file as it is read: memory grows with the allocations live at once and
//! the logged threads, never with the length of the log (an in-memory
//! [`EventLog`](super::EventLog) of a
//! 4 M-line log takes hundreds of MB).
//!
//! [`LogFile::scan`] reads the file once, checking every line as [`EventLog::parse`] does
//! (a malformed log fails before anything is replayed) and counting what a report needs;
//! [`replay_streamed`] reads it again and plays it:
//!
//! * [`ReplayOrder::Concurrent`]: one thread per logged thread, each fed its events through
//!   a bounded queue as the file is read; a free of another thread's allocation waits until
//!   that allocation has been replayed. The earliest event not yet replayed can always run
//!   (everything before it in the log has been), so the queues never deadlock.
//! * [`ReplayOrder::Logged`]: every event on the calling thread, in log order: the logged
//!   peak is reproduced without handing each event from thread to thread.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

use super::event_log::LineParser;
use super::lines::Lines;
use super::{LogAction, ReplayFailure, ReplayOptions, ReplayOrder, ReplayReport};
use crate::adaptor::{chain_names, find_in_chain};
use crate::backend::DevicePtr;
use crate::error::{Error, Result};
use crate::resource::{DeviceMemoryResource, PoolMemoryResource};
use crate::stream::{Stream, StreamView};

/// Operations handed to a replay thread at once (one channel message), and batches queued
/// ahead of it.
const BATCH: usize = 256;
const QUEUE: usize = 16;

/// A log file checked by [`LogFile::scan`]: what a report says of the log, without its
/// events.
#[derive(Debug, Clone)]
pub struct LogFile {
    /// The file.
    pub path: PathBuf,
    /// Events (lines after the header).
    pub events: usize,
    /// The logged thread ids, in order of first appearance.
    pub threads: Vec<String>,
    /// The distinct non-default logged streams, in order of first appearance.
    pub streams: Vec<u64>,
    /// Peak of the bytes live in log order.
    pub peak_bytes: u64,
    /// Frees of pointers the log never allocated.
    pub unmatched_frees: usize,
    /// `allocate failure` lines.
    pub logged_failures: usize,
    /// Allocations never freed by the end of the log.
    pub unfreed: usize,
}

fn read_error(path: &Path, e: &std::io::Error) -> Error {
    Error::EventLog {
        path: path.display().to_string(),
        line: None,
        problem: format!("reading the log failed: {e}"),
        hint: "Check the path; logs are text files such as rmm_log.dev0.csv".to_string(),
    }
}

/// Calls `each(parser, line number, line)` for every non-blank line after the header of the
/// file at `path`, reading one line at a time (each at most a log line's length); returns the
/// parser at the end.
fn for_each_line(
    path: &Path,
    mut each: impl FnMut(&mut LineParser, usize, &str) -> Result<bool>,
) -> Result<LineParser> {
    let source = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| read_error(path, &e))?;
    let mut lines = Lines::new(std::io::BufReader::with_capacity(1 << 20, file), &source);
    let mut parser: Option<LineParser> = None;
    while let Some((line_no, line)) = lines.next_line()? {
        match &mut parser {
            None => parser = Some(LineParser::new(&source, line_no, line)?),
            Some(p) => {
                if !each(p, line_no, line)? {
                    break;
                }
            }
        }
    }
    parser.ok_or_else(|| LineParser::empty(&source))
}

impl LogFile {
    /// Reads and checks the log at `path`, line by line (memory: the threads and the
    /// allocations live at once).
    ///
    /// # Errors
    /// [`Error::EventLog`](crate::Error::EventLog) when the file cannot be read or a line does not
    /// parse.
    pub fn scan(path: impl AsRef<Path>) -> Result<LogFile> {
        let path = path.as_ref();
        let mut streams: Vec<u64> = Vec::new();
        let mut seen: HashMap<u64, ()> = HashMap::new();
        let parser = for_each_line(path, |p, line_no, line| {
            let (e, _) = p.line(line_no, line)?;
            if e.stream != 0 && seen.insert(e.stream, ()).is_none() {
                streams.push(e.stream);
            }
            Ok(true)
        })?;
        Ok(LogFile {
            path: path.to_path_buf(),
            events: parser.events,
            unfreed: parser.live_allocations(),
            threads: parser.threads,
            streams,
            peak_bytes: parser.peak_bytes,
            unmatched_frees: parser.unmatched_frees,
            logged_failures: parser.logged_failures,
        })
    }
}

/// Sentinel of a slot whose allocation failed or was skipped (after a failure).
const NONE: u64 = u64::MAX;

/// One replayed allocation: its pointer once made (0 before, [`NONE`] if it never will be).
struct Slot {
    ptr: AtomicU64,
    size: usize,
    line: usize,
    thread: usize,
    stream: StreamView,
}

enum Op {
    Alloc(Arc<Slot>),
    Free {
        slot: Arc<Slot>,
        line: usize,
        thread: usize,
        stream: StreamView,
    },
}

struct State<'a> {
    resource: &'a dyn DeviceMemoryResource,
    threads: &'a [String],
    stop: AtomicBool,
    live_bytes: AtomicI64,
    live_count: AtomicI64,
    peak_bytes: AtomicI64,
    peak_count: AtomicI64,
    failure: Mutex<Option<ReplayFailure>>,
    /// Slots a free gave up on (the replay stopped): freed at the end if they were made.
    leftovers: Mutex<Vec<Arc<Slot>>>,
}

impl State<'_> {
    fn fail(&self, line: usize, thread: usize, action: LogAction, bytes: usize, e: &Error) {
        let mut f = self.failure.lock();
        if f.is_none() {
            *f = Some(ReplayFailure {
                line,
                thread: self.threads.get(thread).cloned().unwrap_or_default(),
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
                if self.stop.load(Ordering::Relaxed) {
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
                        self.fail(slot.line, slot.thread, LogAction::Allocate, slot.size, &e);
                    }
                }
            }
            Op::Free {
                slot,
                line,
                thread,
                stream,
            } => {
                let mut spins = 0u32;
                let p = loop {
                    let p = slot.ptr.load(Ordering::Acquire);
                    if p != 0 {
                        break p;
                    }
                    if self.stop.load(Ordering::Relaxed) {
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
                    Err(e) => self.fail(line, thread, LogAction::Free, slot.size, &e),
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

/// Replays the log `file` (from [`LogFile::scan`]) against `resource`, reading it again line
/// by line (see the module documentation). Returns the report, with
/// [`ReplayReport::failure`] set when an operation failed; `Err` when the replay could not be
/// set up (a stream or a thread could not be created) or the file changed since the scan.
///
/// # Errors
/// [`Error::Driver`](crate::Error::Driver) when a stream cannot be created;
/// [`Error::EventLog`](crate::Error::EventLog) when the file cannot be read again or has changed
/// since the scan.
pub fn replay_streamed(
    file: &LogFile,
    resource: &dyn DeviceMemoryResource,
    options: &ReplayOptions,
) -> Result<ReplayReport> {
    let device = resource.device();
    let mut owned: Vec<Stream> = Vec::new();
    let mut stream_of: HashMap<u64, StreamView> = HashMap::new();
    if !options.default_stream_only {
        for &s in &file.streams {
            let stream = Stream::new(device)?;
            stream_of.insert(s, stream.view());
            owned.push(stream);
        }
    }
    let view = |logged: u64| stream_of.get(&logged).copied().unwrap_or_default();
    let state = State {
        resource,
        threads: &file.threads,
        stop: AtomicBool::new(false),
        live_bytes: AtomicI64::new(0),
        live_count: AtomicI64::new(0),
        peak_bytes: AtomicI64::new(0),
        peak_count: AtomicI64::new(0),
        failure: Mutex::new(None),
        leftovers: Mutex::new(Vec::new()),
    };
    let (mut allocations, mut frees) = (0usize, 0usize);
    // Logged pointer → its replayed slot, while the log has it live.
    let mut live: HashMap<u64, Arc<Slot>> = HashMap::new();
    let mut busy = vec![false; file.threads.len()];
    let _span = tracing::debug_span!(
        "replay",
        log = %file.path.display(),
        events = file.events,
        threads = file.threads.len()
    )
    .entered();
    let start = Instant::now();
    // Turns one line into the operation to replay, if any.
    let mut op_of =
        |p: &mut LineParser, line_no: usize, line: &str| -> Result<Option<(usize, Op)>> {
            let (e, freed) = p.line(line_no, line)?;
            if e.thread >= busy.len() {
                return Err(changed(&file.path));
            }
            Ok(match (e.action, freed) {
                (LogAction::Allocate, _) if e.ptr != 0 && e.size != 0 => {
                    let slot = Arc::new(Slot {
                        ptr: AtomicU64::new(0),
                        size: e.size,
                        line: e.line,
                        thread: e.thread,
                        stream: view(e.stream),
                    });
                    live.insert(e.ptr, Arc::clone(&slot));
                    allocations += 1;
                    busy[e.thread] = true;
                    Some((e.thread, Op::Alloc(slot)))
                }
                (LogAction::Free, Some(f)) if f.size != 0 => match live.remove(&e.ptr) {
                    Some(slot) => {
                        frees += 1;
                        busy[e.thread] = true;
                        Some((
                            e.thread,
                            Op::Free {
                                slot,
                                line: e.line,
                                thread: e.thread,
                                stream: view(e.stream),
                            },
                        ))
                    }
                    None => None,
                },
                (LogAction::Free, Some(_)) => {
                    // A zero-byte allocation was not replayed.
                    live.remove(&e.ptr);
                    None
                }
                _ => None,
            })
        };
    let read = match options.order {
        ReplayOrder::Logged => for_each_line(&file.path, |p, n, line| {
            if let Some((_, op)) = op_of(p, n, line)? {
                state.run(op);
            }
            Ok(!state.stop.load(Ordering::Relaxed))
        }),
        ReplayOrder::Concurrent => std::thread::scope(|scope| {
            let mut queues = Vec::with_capacity(file.threads.len());
            for (n, _) in file.threads.iter().enumerate() {
                let (tx, rx) = crossbeam_channel::bounded::<Vec<Op>>(QUEUE);
                let state = &state;
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
                    Ok(_) => queues.push(tx),
                    Err(e) => {
                        return Err(Error::invalid_argument(
                            "replay threads",
                            file.threads.len(),
                            format!(
                                "as many threads as the log has ({e}); replay it where more \
                                 threads can start, or in logged order"
                            ),
                        ));
                    }
                }
            }
            // Operations are handed over in batches. A free of another thread's allocation
            // first sends that thread's batch, so whatever a thread waits for has been handed
            // over: the earliest operation not yet replayed can always run.
            let mut pending: Vec<Vec<Op>> = (0..queues.len()).map(|_| Vec::new()).collect();
            let send = |queues: &[crossbeam_channel::Sender<Vec<Op>>],
                        pending: &mut [Vec<Op>],
                        t: usize| {
                if !pending[t].is_empty() {
                    let batch = std::mem::replace(&mut pending[t], Vec::with_capacity(BATCH));
                    // A closed queue cannot happen: its thread runs until the queue closes.
                    let _ = queues[t].send(batch);
                }
            };
            let parser = for_each_line(&file.path, |p, n, line| {
                if let Some((thread, op)) = op_of(p, n, line)? {
                    if let Op::Free { slot, .. } = &op
                        && slot.thread != thread
                    {
                        send(&queues, &mut pending, slot.thread);
                    }
                    pending[thread].push(op);
                    if pending[thread].len() >= BATCH {
                        send(&queues, &mut pending, thread);
                    }
                }
                Ok(!state.stop.load(Ordering::Relaxed))
            });
            for t in 0..queues.len() {
                send(&queues, &mut pending, t);
            }
            drop(queues);
            parser
        }),
    };
    let parser = read?;
    let elapsed = start.elapsed();
    if parser.events > file.events && !state.stop.load(Ordering::Relaxed) {
        return Err(changed(&file.path));
    }
    for s in &owned {
        if let Err(e) = s.synchronize() {
            tracing::warn!("replay: synchronizing a stream: {e}");
        }
    }
    let reserved_bytes =
        find_in_chain::<PoolMemoryResource>(resource).map(PoolMemoryResource::pool_size);
    for slot in live.values().chain(state.leftovers.lock().iter()) {
        state.free_left(slot);
    }
    for s in &owned {
        if let Err(e) = s.synchronize() {
            tracing::warn!("replay: synchronizing a stream: {e}");
        }
    }
    let failure = state.failure.into_inner();
    Ok(ReplayReport {
        source: file.path.display().to_string(),
        resource: chain_names(resource),
        device: device.ordinal(),
        order: options.order,
        events: file.events,
        allocations,
        frees,
        threads: match options.order {
            ReplayOrder::Logged => 1,
            ReplayOrder::Concurrent => busy.iter().filter(|b| **b).count(),
        },
        streams: owned.len(),
        elapsed,
        peak_bytes: state.peak_bytes.load(Ordering::Relaxed).max(0) as u64,
        peak_allocations: state.peak_count.load(Ordering::Relaxed).max(0) as u64,
        logged_peak_bytes: file.peak_bytes,
        reserved_bytes,
        skipped_frees: file.unmatched_frees,
        logged_failures: file.logged_failures,
        unfreed: file.unfreed,
        failure,
    })
}

fn changed(path: &Path) -> Error {
    Error::EventLog {
        path: path.display().to_string(),
        line: None,
        problem: "the log changed while it was replayed".to_string(),
        hint: "Replay a log that is no longer being written".to_string(),
    }
}
