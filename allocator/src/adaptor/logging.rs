//! [`LoggingResourceAdaptor`]: a CSV log of every allocation and free in RMM's format, which
//! [`super::replay()`] (and RMM's own replay benchmark) can play back.
//!
//! The format is RMM's `logging_resource_adaptor`:
//! ```text
//! Thread,Time,Action,Pointer,Size,Stream
//! 140204,14:03:22.123456,allocate,0x7f5a2c000000,1048576,0x0
//! 140204,14:03:22.123502,free,0x7f5a2c000000,1048576,0x0
//! 140207,14:03:22.124010,allocate failure,0x0,85899345920,0x5581e2c0
//! ```
//! * `Thread`: the OS thread id (what spdlog's `%t` prints; on systems without
//!   `/proc/thread-self`, a process-unique thread number);
//! * `Time`: `HH:MM:SS.ffffff`, microseconds (spdlog's `%H:%M:%S.%f`), in UTC where spdlog
//!   uses local time (see *Times* below for how precise);
//! * `Action`: `allocate`, `free` or `allocate failure`;
//! * `Pointer` and `Stream`: hexadecimal with `0x` (fmt's pointer format; a null pointer or the
//!   default stream is `0x0`);
//! * `Size`: bytes requested, in decimal.
//!
//! As in RMM, a free is logged before the upstream sees it and an allocation after it
//! returned, so the log's line order is an order in which every pointer is freed before it
//! is handed out again, whatever the threads did ([`super::replay::EventLog::parse`] relies
//! on it).
//!
//! # Design: binary records on the hot path, CSV on a writer thread
//!
//! * **Records.** An allocation or free appends one fixed-size binary record (sequence
//!   number, action and whether the time is precise; time in nanoseconds; pointer; size;
//!   stream: 40 bytes) to a *chunk* of 1024 records owned by the calling thread for this
//!   adaptor. The chunk lives in a thread-local list keyed by the adaptor's id (several
//!   adaptors, e.g. one per device, each get their own chunks). The hot path takes no lock,
//!   allocates nothing and makes no system call: one atomic increment of the adaptor's
//!   sequence counter, a read of the coarse clock, five plain stores and one release store of
//!   the chunk's length, which *publishes* the record.
//! * **Order.** The sequence number is taken where RMM takes its lock (before the upstream
//!   frees, after it allocated), so sequence order is an order in which every pointer is freed
//!   before it is handed out again. The numbers are dense: the writer emits records in exactly
//!   that order, merging the threads' chunks (each thread's records are already in order).
//!   The file therefore has the same guarantee as RMM's (and the previous, synchronous
//!   version's) line order. Nothing depends on the times.
//! * **Times.** Reading the precise clock costs 40–70 ns in an allocation's context on the
//!   virtual machines measured (H100 and H200 hosts; 15–40 ns alone): alone more than this
//!   adaptor's budget. So a record carries the kernel's coarse clock (`CLOCK_REALTIME_COARSE`:
//!   the time of the last timer tick, 1–10 ms old, a few ns to read), and reads the precise
//!   clock only when its sequence number is a multiple of 16 or its thread's coarse time has
//!   changed since that thread's last precise record. The writer gives a record without a
//!   precise time the later of its coarse time and the time of the last precise record
//!   before it (in sequence order): a lower bound, off by at most the time since that record
//!   (at most 15 records back) and never by more than a tick. Every 16th record, and a
//!   thread's first record in each tick (every record of a thread that logs less often), is
//!   exact; under load the others are within microseconds.
//! * **Writer thread.** Each adaptor has one writer thread. A thread announces every chunk it
//!   starts to the writer over a channel (that message also says its previous chunk is full)
//!   *before* it writes a record into it, so the writer holds every chunk and reads published
//!   records directly, including those of partly filled chunks and of threads that have
//!   exited: nothing depends on a thread handing its buffer over. The writer formats the CSV
//!   into a 64 KiB buffer and writes it to the sink when the buffer fills, every 100 ms while
//!   records trickle in, and on [`LoggingResourceAdaptor::flush`]. Consumed chunks go back to
//!   a free list, so a busy thread reuses chunks rather than allocating them.
//! * **Flush and drop.** `flush()` asks the writer to write every record whose sequence number
//!   was taken before the call (so everything every thread logged before it, in whatever
//!   chunk), to flush the sink and to answer; dropping the adaptor flushes, stops the writer
//!   and joins it, so a normal end of the process loses nothing.
//! * **Bounds.** At most 1024 chunks (40 MiB, about a million records) may wait for the
//!   writer; a thread that needs a chunk beyond that waits for the writer to catch up (rather
//!   than memory growing without bound). A thread that logs while its thread-local storage is
//!   being torn down (a thread-local buffer freed at thread exit) logs through a one-record
//!   chunk of its own: slower, but not lost.
//! * **Errors.** A write error is reported through `tracing` once, stops the writing (records
//!   are still consumed, so allocations go on at full speed) and is returned by every later
//!   `flush()`; a failing flush of the sink is returned by that `flush()`.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt;
use std::fs::File;
use std::io::Write;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};

use super::same_adaptor;
use crate::backend::{DevicePtr, MemInfo};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::per_device::SharedResource;
use crate::resource::DeviceMemoryResource;
use crate::stream::StreamView;

/// The first line of every log, RMM's header.
pub const LOG_HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

/// `<dir>/rmm_log.dev<device>.csv`: one log file per device.
pub fn log_file_path(dir: impl AsRef<Path>, device: u32) -> PathBuf {
    dir.as_ref().join(format!("rmm_log.dev{device}.csv"))
}

thread_local! {
    static LOG_THREAD_ID: Cell<u64> = const { Cell::new(0) };
}

static NEXT_THREAD_NUMBER: AtomicU64 = AtomicU64::new(1);

/// The calling thread's id as logs show it: the OS thread id where `/proc/thread-self`
/// exists, else a process-unique number. Read once per thread.
pub fn log_thread_id() -> u64 {
    LOG_THREAD_ID.with(|c| {
        if c.get() == 0 {
            let tid = std::fs::read_link("/proc/thread-self")
                .ok()
                .and_then(|p| p.file_name()?.to_str()?.parse::<u64>().ok())
                .filter(|&t| t != 0)
                .unwrap_or_else(|| NEXT_THREAD_NUMBER.fetch_add(1, Ordering::Relaxed));
            c.set(tid);
        }
        c.get()
    })
}

/// Records per chunk (40 KiB).
const CHUNK_RECORDS: usize = 1024;
/// Chunks that may be waiting for the writer, per adaptor, before logging threads wait.
const MAX_CHUNKS: usize = 1024;
/// Consumed chunks kept for reuse.
const FREE_CHUNKS: usize = 64;
/// CSV bytes buffered before they are written to the sink.
const OUT_BUFFER: usize = 1 << 16;
/// How often an idle writer looks for records in partly filled chunks.
const POLL: Duration = Duration::from_millis(100);
/// How often a writer looks again while a flush waits for a record still being written.
const SHORT_WAIT: Duration = Duration::from_micros(50);
/// How long the writer waits for a record whose sequence number was taken but which was
/// never published (a thread that died in the middle of logging: does not happen in safe
/// code) before it goes on without it.
const GAP_TIMEOUT: Duration = Duration::from_secs(1);

/// Every this many records (by sequence number) read the precise clock.
const PRECISE_EVERY: u64 = 16;

/// A record's first word: `sequence << TAG_SEQ_SHIFT | TAG_PRECISE? | action`.
const TAG_SEQ_SHIFT: u32 = 3;
/// The time is the precise clock's (else the coarse clock's).
const TAG_PRECISE: u64 = 4;
const ACTION_ALLOCATE: u64 = 0;
const ACTION_FREE: u64 = 1;
const ACTION_FAILURE: u64 = 2;

static NEXT_ADAPTOR_ID: AtomicU64 = AtomicU64::new(1);
static NEXT_PRODUCER_ID: AtomicU64 = AtomicU64::new(1);

/// One record: `[tag (sequence number, precise, action), time (ns since the epoch), pointer,
/// size, stream]`.
/// Atomics only so that the writer may read a chunk the owner is still filling; the owner's
/// stores are plain (relaxed) stores, published by the release store of [`Chunk::len`].
type Record = [AtomicU64; 5];

/// A run of records of one thread for one adaptor.
struct Chunk {
    /// The (thread, adaptor) pair that fills it.
    producer: u64,
    /// The thread's id as the log shows it.
    thread: u64,
    /// Records published (written completely); only the owner stores, with `Release`.
    len: AtomicUsize,
    records: Box<[Record]>,
}

impl Chunk {
    fn new(capacity: usize, producer: u64, thread: u64) -> Chunk {
        Chunk {
            producer,
            thread,
            len: AtomicUsize::new(0),
            records: (0..capacity)
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
        }
    }
}

/// The writer's messages.
enum Msg {
    /// A producer starts this chunk; its previous chunk, if any, is full.
    Chunk(Arc<Chunk>),
    /// Look for published records now (a thread waits for a free chunk).
    Wake,
    /// Write every record with a sequence number below `target`, flush the sink, answer.
    Flush {
        target: u64,
        reply: Sender<std::result::Result<(), FlushError>>,
    },
    /// Write every record with a sequence number below `target`, flush the sink and stop.
    Shutdown { target: u64 },
}

/// Why a flush failed, as the writer reports it.
enum FlushError {
    /// An earlier write failed and the writing stopped.
    Stopped(String),
    /// Flushing the sink failed.
    Flush(std::io::Error),
}

/// The adaptor's sequence counter, on a cache line of its own.
#[repr(align(128))]
struct SeqCounter(AtomicU64);

/// What the adaptor, its writer and (weakly) the logging threads share.
struct Shared {
    seq: SeqCounter,
    tx: Sender<Msg>,
    free_rx: Receiver<Arc<Chunk>>,
    /// Chunks allocated and not yet dropped (in use, waiting or free).
    outstanding: AtomicUsize,
    /// False once the writer thread has ended (then records are dropped).
    writer_alive: AtomicBool,
    auto_flush: AtomicBool,
}

/// A thread's chunk for one adaptor.
struct Local {
    adaptor: u64,
    /// For pruning: dead once the adaptor and its writer are gone.
    shared: Weak<Shared>,
    chunk: Arc<Chunk>,
    /// Records written into `chunk` (the owner's copy of `chunk.len`).
    len: usize,
    /// The coarse time of this thread's last precise record.
    coarse: u64,
}

thread_local! {
    static LOCALS: RefCell<Vec<Local>> = const { RefCell::new(Vec::new()) };
}

/// Nanoseconds since the epoch, from the system clock.
fn now_ns() -> u64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    d.as_secs()
        .wrapping_mul(1_000_000_000)
        .wrapping_add(u64::from(d.subsec_nanos()))
}

/// Nanoseconds since the epoch, from the kernel's coarse real-time clock (the last timer
/// tick), a few ns to read where the precise clock takes tens.
#[inline]
fn coarse_ns() -> u64 {
    crate::backend::clock::coarse_realtime_ns()
}

impl Shared {
    /// Writes one record into `local`'s chunk and publishes it. Returns its sequence number.
    #[inline]
    fn push(&self, local: &mut Local, action: u64, ptr: u64, size: u64, stream: u64) -> u64 {
        let seq = self.seq.0.fetch_add(1, Ordering::Relaxed);
        let coarse = coarse_ns();
        let (time, precise) = if seq.is_multiple_of(PRECISE_EVERY) || coarse != local.coarse {
            local.coarse = coarse;
            (now_ns(), TAG_PRECISE)
        } else {
            (coarse, 0)
        };
        let r = &local.chunk.records[local.len];
        r[0].store(seq << TAG_SEQ_SHIFT | precise | action, Ordering::Relaxed);
        r[1].store(time, Ordering::Relaxed);
        r[2].store(ptr, Ordering::Relaxed);
        r[3].store(size, Ordering::Relaxed);
        r[4].store(stream, Ordering::Relaxed);
        local.len += 1;
        local.chunk.len.store(local.len, Ordering::Release);
        if local.len == local.chunk.records.len() {
            self.replace_chunk(local);
        }
        seq
    }

    /// A chunk for `producer`: a free one, a new one, or (past [`MAX_CHUNKS`]) the next one
    /// the writer frees.
    fn take_chunk(&self, producer: u64, thread: u64) -> Arc<Chunk> {
        loop {
            let recycled = match self.free_rx.try_recv() {
                Ok(c) => Some(c),
                Err(_) => {
                    let n = self.outstanding.fetch_add(1, Ordering::Relaxed);
                    if n < MAX_CHUNKS || !self.writer_alive.load(Ordering::Relaxed) {
                        return Arc::new(Chunk::new(CHUNK_RECORDS, producer, thread));
                    }
                    self.outstanding.fetch_sub(1, Ordering::Relaxed);
                    // The writer is behind: wake it and wait for a chunk it frees.
                    let _ = self.tx.send(Msg::Wake);
                    self.free_rx.recv_timeout(Duration::from_millis(10)).ok()
                }
            };
            if let Some(mut c) = recycled
                && let Some(m) = Arc::get_mut(&mut c)
            {
                m.producer = producer;
                m.thread = thread;
                *m.len.get_mut() = 0;
                return c;
            }
        }
    }

    /// Gives `local` a fresh chunk (its chunk is full) and announces it.
    #[cold]
    #[inline(never)]
    fn replace_chunk(&self, local: &mut Local) {
        local.len = 0;
        if !self.writer_alive.load(Ordering::Relaxed)
            && let Some(c) = Arc::get_mut(&mut local.chunk)
        {
            // Nobody reads the records any more: reuse the chunk.
            *c.len.get_mut() = 0;
            return;
        }
        let chunk = self.take_chunk(local.chunk.producer, local.chunk.thread);
        let _ = self.tx.send(Msg::Chunk(Arc::clone(&chunk)));
        local.chunk = chunk;
    }

    /// Logs one record through a one-record chunk of its own (the thread-local list is not
    /// available: the thread is tearing it down, or logging re-entered itself).
    #[cold]
    #[inline(never)]
    fn push_alone(&self, action: u64, ptr: u64, size: u64, stream: u64) -> u64 {
        let producer = NEXT_PRODUCER_ID.fetch_add(1, Ordering::Relaxed);
        let chunk = Arc::new(Chunk::new(1, producer, log_thread_id()));
        let _ = self.tx.send(Msg::Chunk(Arc::clone(&chunk)));
        let seq = self.seq.0.fetch_add(1, Ordering::Relaxed);
        let r = &chunk.records[0];
        r[0].store(
            seq << TAG_SEQ_SHIFT | TAG_PRECISE | action,
            Ordering::Relaxed,
        );
        r[1].store(now_ns(), Ordering::Relaxed);
        r[2].store(ptr, Ordering::Relaxed);
        r[3].store(size, Ordering::Relaxed);
        r[4].store(stream, Ordering::Relaxed);
        chunk.len.store(1, Ordering::Release);
        seq
    }
}

/// Logs every allocation and free through it to a CSV file in RMM's format (see the module
/// documentation). The calling thread appends a binary record to a buffer of its own; a writer
/// thread formats and writes the lines. [`LoggingResourceAdaptor::flush`] writes out
/// everything logged so far, and dropping the adaptor flushes. A write error stops the logging
/// (allocations go on) and is returned by the next `flush`.
pub struct LoggingResourceAdaptor {
    upstream: SharedResource,
    path: Option<PathBuf>,
    auto_flush: bool,
    /// Keys the thread-local chunks.
    id: u64,
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
}

impl fmt::Debug for LoggingResourceAdaptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoggingResourceAdaptor")
            .field("upstream", &self.upstream.name())
            .field("path", &self.path)
            .field("auto_flush", &self.auto_flush)
            .finish()
    }
}

fn io_error(path: &Path, what: &str, e: std::io::Error) -> Error {
    Error::EventLog {
        path: path.display().to_string(),
        line: None,
        problem: format!("{what} failed: {e}"),
        hint: "Check that the directory exists and is writable, or log to another path".to_string(),
    }
}

impl LoggingResourceAdaptor {
    /// Logs to the file at `path`, created or truncated, starting with the header.
    pub fn new(upstream: SharedResource, path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = File::create(path).map_err(|e| io_error(path, "creating the log", e))?;
        Self::start(upstream, Box::new(file), Some(path.to_path_buf()))
    }

    /// Logs to `<dir>/rmm_log.dev<N>.csv`, N being the upstream's device ([`log_file_path`]).
    pub fn in_dir(upstream: SharedResource, dir: impl AsRef<Path>) -> Result<Self> {
        let path = log_file_path(dir, upstream.device().ordinal());
        Self::new(upstream, path)
    }

    /// Logs to `writer`, starting with the header. The adaptor buffers what it writes (64 KiB
    /// at a time), so `writer` needs no buffer of its own; it is written from the adaptor's
    /// writer thread.
    pub fn to_writer(
        upstream: SharedResource,
        writer: impl Write + Send + 'static,
    ) -> Result<Self> {
        Self::start(upstream, Box::new(writer), None)
    }

    fn start(
        upstream: SharedResource,
        mut sink: Box<dyn Write + Send>,
        path: Option<PathBuf>,
    ) -> Result<Self> {
        let name = path
            .as_deref()
            .unwrap_or(Path::new("<writer>"))
            .to_path_buf();
        writeln!(sink, "{LOG_HEADER}").map_err(|e| io_error(&name, "writing the header", e))?;
        let (tx, rx) = crossbeam_channel::unbounded();
        let (free_tx, free_rx) = crossbeam_channel::bounded(FREE_CHUNKS);
        let shared = Arc::new(Shared {
            seq: SeqCounter(AtomicU64::new(0)),
            tx,
            free_rx,
            outstanding: AtomicUsize::new(0),
            writer_alive: AtomicBool::new(true),
            auto_flush: AtomicBool::new(false),
        });
        let writer = Writer {
            rx,
            free_tx,
            shared: Arc::clone(&shared),
            sink,
            out: Vec::with_capacity(OUT_BUFFER + 256),
            error: None,
            producers: HashMap::new(),
            heap: BinaryHeap::new(),
            next_seq: 0,
            flushes: Vec::new(),
            shutdown: None,
            last_progress: Instant::now(),
            read_all: false,
            second: (u64::MAX, [0; 9]),
            precise: 0,
        };
        let handle = std::thread::Builder::new()
            .name("rmm-log-writer".to_string())
            .spawn(move || writer.run())
            .map_err(|e| io_error(&name, "starting the log writer thread", e))?;
        Ok(LoggingResourceAdaptor {
            upstream,
            path,
            auto_flush: false,
            id: NEXT_ADAPTOR_ID.fetch_add(1, Ordering::Relaxed),
            shared,
            writer: Some(handle),
        })
    }

    /// When `on`, every allocation and free waits until its line is written and the sink
    /// flushed (slow: as RMM's `auto_flush`, the log is complete even if the process dies).
    pub fn auto_flush(mut self, on: bool) -> Self {
        self.auto_flush = on;
        self.shared.auto_flush.store(on, Ordering::Relaxed);
        self
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &SharedResource {
        &self.upstream
    }

    /// The log file, when logging to a file.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Writes out everything logged so far, by every thread (those that have exited too), and
    /// flushes the file. Returns the first write error, if logging stopped, or the error of
    /// flushing.
    pub fn flush(&self) -> Result<()> {
        self.flush_to(self.shared.seq.0.load(Ordering::SeqCst))
    }

    /// Writes out the records with sequence numbers below `target` and flushes.
    fn flush_to(&self, target: u64) -> Result<()> {
        let path = self.path.as_deref().unwrap_or(Path::new("<writer>"));
        let gone = || Error::EventLog {
            path: path.display().to_string(),
            line: None,
            problem: "the log's writer thread has stopped".to_string(),
            hint: "See the error logged before this one".to_string(),
        };
        let (reply, answer) = crossbeam_channel::bounded(1);
        self.shared
            .tx
            .send(Msg::Flush { target, reply })
            .map_err(|_| gone())?;
        match answer.recv() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(FlushError::Stopped(e))) => Err(Error::EventLog {
                path: path.display().to_string(),
                line: None,
                problem: format!("a write failed and logging stopped: {e}"),
                hint: "Free space on the log's file system or log to another path".to_string(),
            }),
            Ok(Err(FlushError::Flush(e))) => Err(io_error(path, "flushing the log", e)),
            Err(_) => Err(gone()),
        }
    }

    #[inline]
    fn log(&self, action: u64, ptr: DevicePtr, size: usize, stream: StreamView) {
        let (ptr, size, stream) = (ptr.addr(), size as u64, stream.raw());
        let seq = LOCALS
            .try_with(|locals| {
                let mut locals = locals.try_borrow_mut().ok()?;
                let i = match locals.iter().position(|l| l.adaptor == self.id) {
                    Some(i) => i,
                    None => self.register(&mut locals),
                };
                Some(self.shared.push(&mut locals[i], action, ptr, size, stream))
            })
            .ok()
            .flatten()
            .unwrap_or_else(|| self.shared.push_alone(action, ptr, size, stream));
        if self.auto_flush {
            // Errors are logged by the writer and returned by the next `flush`.
            let _ = self.flush_to(seq + 1);
        }
    }

    /// Adds this adaptor's chunk to the calling thread's list (dropping those of adaptors
    /// that are gone). Returns its index.
    #[cold]
    #[inline(never)]
    fn register(&self, locals: &mut Vec<Local>) -> usize {
        locals.retain(|l| l.shared.strong_count() > 0);
        let producer = NEXT_PRODUCER_ID.fetch_add(1, Ordering::Relaxed);
        let chunk = self.shared.take_chunk(producer, log_thread_id());
        let _ = self.shared.tx.send(Msg::Chunk(Arc::clone(&chunk)));
        locals.push(Local {
            adaptor: self.id,
            shared: Arc::downgrade(&self.shared),
            chunk,
            len: 0,
            coarse: 0,
        });
        locals.len() - 1
    }
}

impl DeviceMemoryResource for LoggingResourceAdaptor {
    fn allocate(&self, bytes: usize, stream: StreamView) -> Result<DevicePtr> {
        match self.upstream.allocate(bytes, stream) {
            Ok(p) => {
                self.log(ACTION_ALLOCATE, p, bytes, stream);
                Ok(p)
            }
            Err(e) => {
                self.log(ACTION_FAILURE, DevicePtr::NULL, bytes, stream);
                Err(e)
            }
        }
    }

    fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: StreamView) -> Result<()> {
        self.log(ACTION_FREE, ptr, bytes, stream);
        self.upstream.deallocate(ptr, bytes, stream)
    }

    fn device(&self) -> Device {
        self.upstream.device()
    }

    fn name(&self) -> &'static str {
        "LoggingResourceAdaptor"
    }

    fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
        same_adaptor(self, other, |a: &Self| &a.upstream)
    }

    fn memory_info(&self) -> Result<MemInfo> {
        self.upstream.memory_info()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for LoggingResourceAdaptor {
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            tracing::error!("{e}");
        }
        let target = self.shared.seq.0.load(Ordering::SeqCst);
        let _ = self.shared.tx.send(Msg::Shutdown { target });
        if let Some(h) = self.writer.take()
            && h.join().is_err()
        {
            tracing::error!("memory event log: the writer thread panicked");
        }
    }
}

/// The writer's view of one producer's chunks.
struct Producer {
    /// `<thread id>,`: how its lines start.
    prefix: Vec<u8>,
    /// Announced chunks, oldest first; the front one is being read. All but the last are
    /// full.
    chunks: VecDeque<Arc<Chunk>>,
    /// Records of the front chunk already written.
    consumed: usize,
    /// Records of the front chunk known to be published.
    published: usize,
    /// Whether the heap holds this producer's next record.
    in_heap: bool,
}

impl Producer {
    /// The sequence number of the next published record, dropping consumed full chunks
    /// (into `done`). With `full_only`, the last chunk (which its owner may be filling) is not
    /// looked at: reading it while the owner writes it costs the owner cache misses.
    fn head(&mut self, done: &mut Vec<Arc<Chunk>>, full_only: bool) -> Option<u64> {
        loop {
            let front = self.chunks.front()?;
            if self.consumed < self.published {
                return Some(
                    front.records[self.consumed][0].load(Ordering::Relaxed) >> TAG_SEQ_SHIFT,
                );
            }
            if full_only && self.chunks.len() == 1 {
                return None;
            }
            self.published = front.len.load(Ordering::Acquire);
            if self.consumed < self.published {
                continue;
            }
            let abandoned = Arc::strong_count(front) == 1 && {
                // The owner dropped its handle (it moved on or exited): after this fence
                // `len` is final.
                std::sync::atomic::fence(Ordering::Acquire);
                self.published = front.len.load(Ordering::Acquire);
                self.consumed == self.published
            };
            if self.consumed < self.published {
                continue;
            }
            if self.consumed == front.records.len() || abandoned {
                done.extend(self.chunks.pop_front());
                self.consumed = 0;
                self.published = 0;
                continue;
            }
            return None;
        }
    }
}

/// The writer thread: merges the producers' records in sequence order and writes the CSV.
struct Writer {
    rx: Receiver<Msg>,
    free_tx: Sender<Arc<Chunk>>,
    shared: Arc<Shared>,
    sink: Box<dyn Write + Send>,
    out: Vec<u8>,
    error: Option<String>,
    producers: HashMap<u64, Producer>,
    /// (sequence number of the next record, producer) of producers with published records.
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    /// The sequence number of the next record to write.
    next_seq: u64,
    flushes: Vec<(u64, Sender<std::result::Result<(), FlushError>>)>,
    /// The target of the shutdown, once asked.
    shutdown: Option<u64>,
    /// When records were last written (or nothing waited).
    last_progress: Instant,
    /// Whether the next pump reads partly filled chunks too.
    read_all: bool,
    /// The second of the last time written, and its `HH:MM:SS.`.
    second: (u64, [u8; 9]),
    /// The time of the last precise record written.
    precise: u64,
}

/// Marks the writer dead when its thread ends, however it ends.
struct AliveGuard(Arc<Shared>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.writer_alive.store(false, Ordering::Relaxed);
        if std::thread::panicking() {
            tracing::error!("memory event log: the writer thread panicked, logging stops");
        }
    }
}

impl Writer {
    fn run(mut self) {
        let _alive = AliveGuard(Arc::clone(&self.shared));
        let mut progressed = false;
        loop {
            let waiting = !self.flushes.is_empty() || self.shutdown.is_some();
            let first = if waiting && progressed {
                self.rx.try_recv().map_err(|e| match e {
                    TryRecvError::Empty => RecvTimeoutError::Timeout,
                    TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
                })
            } else {
                // Woken by the next full chunk, a flush or the shutdown; meanwhile look at
                // partly filled chunks now and then.
                self.rx
                    .recv_timeout(if waiting { SHORT_WAIT } else { POLL })
            };
            match first {
                Ok(m) => self.handle(m),
                Err(RecvTimeoutError::Timeout) => self.read_all = true,
                Err(RecvTimeoutError::Disconnected) => {
                    self.shutdown.get_or_insert(0);
                }
            }
            while let Ok(m) = self.rx.try_recv() {
                self.handle(m);
            }
            if !self.flushes.is_empty() || self.shutdown.is_some() {
                self.read_all = true;
            }
            progressed = self.pump();
            self.answer_flushes();
            if let Some(target) = self.shutdown
                && self.next_seq >= target
                && self.flushes.is_empty()
            {
                // Whatever was published after the target, too.
                self.read_all = true;
                self.pump();
                self.write_out();
                let _ = self.flush_sink();
                return;
            }
            if self.flushes.is_empty() {
                // Write what there is rather than hold it until the buffer fills.
                self.write_out();
            }
        }
    }

    fn handle(&mut self, m: Msg) {
        match m {
            Msg::Chunk(c) => {
                self.producers
                    .entry(c.producer)
                    .or_insert_with(|| Producer {
                        prefix: line_prefix(c.thread),
                        chunks: VecDeque::new(),
                        consumed: 0,
                        published: 0,
                        in_heap: false,
                    })
                    .chunks
                    .push_back(c);
            }
            Msg::Wake => self.read_all = true,
            Msg::Flush { target, reply } => self.flushes.push((target, reply)),
            Msg::Shutdown { target } => self.shutdown = Some(target),
        }
    }

    /// Writes every record that is next in sequence order. Returns whether it wrote any.
    ///
    /// Normally only full chunks are read; partly filled ones when `read_all` is set (a
    /// flush, the shutdown, a thread waiting for a chunk, the periodic look) or when a record
    /// that comes next may be in one (another thread's full chunk has later records).
    fn pump(&mut self) -> bool {
        let mut wrote = self.merge(!self.read_all);
        if !self.read_all && !self.heap.is_empty() {
            wrote |= self.merge(false);
        }
        self.read_all = false;
        wrote
    }

    /// [`Writer::pump`]'s work, reading only full chunks with `full_only`.
    fn merge(&mut self, full_only: bool) -> bool {
        let mut done = Vec::new();
        let mut empty = Vec::new();
        for (&id, p) in &mut self.producers {
            if p.in_heap {
                continue;
            }
            match p.head(&mut done, full_only) {
                Some(seq) => {
                    self.heap.push(Reverse((seq, id)));
                    p.in_heap = true;
                }
                None if p.chunks.is_empty() => empty.push(id),
                None => {}
            }
        }
        for id in empty {
            self.producers.remove(&id);
        }
        let mut wrote = false;
        while let Some(&Reverse((mut seq, id))) = self.heap.peek() {
            if seq > self.next_seq {
                if full_only || self.last_progress.elapsed() < GAP_TIMEOUT {
                    break;
                }
                tracing::warn!(
                    "memory event log: records {}..{seq} were never completed; going on \
                     without them",
                    self.next_seq
                );
                self.next_seq = seq;
            }
            self.heap.pop();
            let Some(p) = self.producers.get_mut(&id) else {
                continue;
            };
            loop {
                let Some(chunk) = p.chunks.front() else {
                    p.in_heap = false;
                    break;
                };
                let r = &chunk.records[p.consumed];
                let record = [
                    r[0].load(Ordering::Relaxed),
                    r[1].load(Ordering::Relaxed),
                    r[2].load(Ordering::Relaxed),
                    r[3].load(Ordering::Relaxed),
                    r[4].load(Ordering::Relaxed),
                ];
                p.consumed += 1;
                self.next_seq = self.next_seq.max(seq + 1);
                wrote = true;
                let mut record = record;
                if record[0] & TAG_PRECISE != 0 {
                    self.precise = self.precise.max(record[1]);
                } else {
                    // At least the time of the last precise record before it, and of its
                    // tick.
                    record[1] = record[1].max(self.precise);
                }
                format_line(&mut self.out, &mut self.second, &p.prefix, &record);
                if self.out.len() >= OUT_BUFFER {
                    write_to(&mut self.sink, &mut self.out, &mut self.error);
                }
                match p.head(&mut done, full_only) {
                    Some(s) if s <= self.next_seq => seq = s,
                    Some(s) => {
                        self.heap.push(Reverse((s, id)));
                        break;
                    }
                    None => {
                        p.in_heap = false;
                        break;
                    }
                }
            }
        }
        if wrote || self.heap.is_empty() {
            self.last_progress = Instant::now();
        }
        for c in done {
            self.recycle(c);
        }
        wrote
    }

    /// A consumed chunk goes back to the free list, or is dropped.
    fn recycle(&mut self, mut c: Arc<Chunk>) {
        if c.records.len() != CHUNK_RECORDS {
            return; // a one-record chunk: not counted
        }
        if let Some(m) = Arc::get_mut(&mut c) {
            *m.len.get_mut() = 0;
            if self.free_tx.try_send(c).is_ok() {
                return;
            }
        }
        self.shared.outstanding.fetch_sub(1, Ordering::Relaxed);
    }

    fn write_out(&mut self) {
        write_to(&mut self.sink, &mut self.out, &mut self.error);
    }

    fn flush_sink(&mut self) -> std::result::Result<(), FlushError> {
        if let Some(e) = &self.error {
            return Err(FlushError::Stopped(e.clone()));
        }
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| self.sink.flush()))
            .unwrap_or_else(|_| Err(std::io::Error::other("the writer panicked while flushing")));
        match r {
            Ok(()) => Ok(()),
            Err(e) => {
                if self.shared.auto_flush.load(Ordering::Relaxed) {
                    tracing::error!("memory event log: flushing failed, logging stops: {e}");
                    self.error = Some(e.to_string());
                }
                Err(FlushError::Flush(e))
            }
        }
    }

    /// Answers the flushes whose records are all written.
    fn answer_flushes(&mut self) {
        if !self.flushes.iter().any(|(t, _)| *t <= self.next_seq) {
            return;
        }
        self.write_out();
        let result = self.flush_sink();
        let next = self.next_seq;
        let mut i = 0;
        while i < self.flushes.len() {
            if self.flushes[i].0 <= next {
                let (_, reply) = self.flushes.swap_remove(i);
                let answer = match &result {
                    Ok(()) => Ok(()),
                    Err(FlushError::Stopped(e)) => Err(FlushError::Stopped(e.clone())),
                    Err(FlushError::Flush(e)) => Err(FlushError::Flush(std::io::Error::new(
                        e.kind(),
                        e.to_string(),
                    ))),
                };
                let _ = reply.send(answer);
            } else {
                i += 1;
            }
        }
    }
}

/// Writes `out` to `sink` (unless writing stopped) and clears it; a failure stops the
/// writing.
fn write_to(sink: &mut Box<dyn Write + Send>, out: &mut Vec<u8>, error: &mut Option<String>) {
    if error.is_none() && !out.is_empty() {
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| sink.write_all(out)))
            .unwrap_or_else(|_| Err(std::io::Error::other("the writer panicked")));
        if let Err(e) = r {
            tracing::error!("memory event log: writing failed, logging stops: {e}");
            *error = Some(e.to_string());
        }
    }
    out.clear();
}

/// `"00"` to `"99"`.
const DIGIT_PAIRS: [u8; 200] = {
    let mut t = [0u8; 200];
    let mut i = 0;
    while i < 100 {
        t[2 * i] = b'0' + (i / 10) as u8;
        t[2 * i + 1] = b'0' + (i % 10) as u8;
        i += 1;
    }
    t
};

/// A CSV line built on the stack: at most 21 (thread and comma) + 15 (time) + 18 (action and
/// commas) + 18 (pointer) + 21 (size and comma) + 19 (stream and newline) = 112 bytes.
struct Line {
    buf: [u8; 128],
    len: usize,
}

impl Line {
    fn new() -> Line {
        Line {
            buf: [0; 128],
            len: 0,
        }
    }

    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    #[inline]
    fn bytes(&mut self, b: &[u8]) {
        self.buf[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
    }

    #[inline]
    fn pair(&mut self, v: u64) {
        let i = 2 * v as usize;
        self.bytes(&DIGIT_PAIRS[i..i + 2]);
    }

    /// `v` in decimal.
    #[inline]
    fn dec(&mut self, mut v: u64) {
        let mut tmp = [0u8; 20];
        let mut i = tmp.len();
        while v >= 100 {
            let r = 2 * (v % 100) as usize;
            v /= 100;
            i -= 2;
            tmp[i..i + 2].copy_from_slice(&DIGIT_PAIRS[r..r + 2]);
        }
        if v >= 10 {
            i -= 2;
            tmp[i..i + 2].copy_from_slice(&DIGIT_PAIRS[2 * v as usize..2 * v as usize + 2]);
        } else {
            i -= 1;
            tmp[i] = b'0' + v as u8;
        }
        self.bytes(&tmp[i..]);
    }

    /// `v` as `{:#x}` writes it: `0x` and lower-case digits.
    #[inline]
    fn hex(&mut self, v: u64) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        self.bytes(b"0x");
        let digits = (16 - v.leading_zeros() as usize / 4).max(1);
        for k in (0..digits).rev() {
            self.buf[self.len] = DIGITS[(v >> (4 * k)) as usize & 15];
            self.len += 1;
        }
    }

    /// `HH:MM:SS.ffffff` (UTC) of `ns` nanoseconds since the epoch; `second` caches the
    /// `HH:MM:SS.` of the last second formatted.
    #[inline]
    fn time(&mut self, second: &mut (u64, [u8; 9]), ns: u64) {
        let secs = ns / 1_000_000_000;
        if second.0 != secs {
            let s = secs % 86_400;
            let two = |v: u64| [b'0' + (v / 10) as u8, b'0' + (v % 10) as u8];
            let (h, m, sec) = (two(s / 3600), two(s / 60 % 60), two(s % 60));
            *second = (
                secs,
                [h[0], h[1], b':', m[0], m[1], b':', sec[0], sec[1], b'.'],
            );
        }
        self.bytes(&second.1);
        let us = (ns % 1_000_000_000) / 1000;
        self.pair(us / 10_000);
        self.pair(us / 100 % 100);
        self.pair(us % 100);
    }
}

/// `<thread>,`: how a thread's lines start.
fn line_prefix(thread: u64) -> Vec<u8> {
    let mut line = Line::new();
    line.dec(thread);
    line.bytes(b",");
    line.as_bytes().to_vec()
}

/// Appends one CSV line for `record`; `prefix` is [`line_prefix`] of its thread.
#[inline]
fn format_line(out: &mut Vec<u8>, second: &mut (u64, [u8; 9]), prefix: &[u8], record: &[u64; 5]) {
    let [tag, time, ptr, size, stream] = *record;
    let mut line = Line::new();
    line.bytes(prefix);
    line.time(second, time);
    line.bytes(match tag & 3 {
        ACTION_ALLOCATE => b",allocate,",
        ACTION_FREE => b",free,",
        _ => b",allocate failure,",
    });
    line.hex(ptr);
    line.bytes(b",");
    line.dec(size);
    line.bytes(b",");
    line.hex(stream);
    line.bytes(b"\n");
    out.extend_from_slice(line.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_as_rmm_does() {
        let mut out = Vec::new();
        let mut second = (u64::MAX, [0; 9]);
        // 1970-01-02 14:03:22.123456789
        let ns = ((86_400 + 14 * 3600 + 3 * 60 + 22) * 1_000_000_000) + 123_456_789;
        format_line(
            &mut out,
            &mut second,
            &line_prefix(140204),
            &[5 << 2 | ACTION_ALLOCATE, ns, 0x7f5a2c000000, 1048576, 0],
        );
        format_line(
            &mut out,
            &mut second,
            &line_prefix(7),
            &[
                6 << 2 | ACTION_FAILURE,
                ns + 1_000,
                0,
                85899345920,
                0x5581e2c0,
            ],
        );
        format_line(
            &mut out,
            &mut second,
            &line_prefix(0),
            &[7 << 2 | ACTION_FREE, 59, u64::MAX, 0, 1],
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "140204,14:03:22.123456,allocate,0x7f5a2c000000,1048576,0x0\n\
             7,14:03:22.123457,allocate failure,0x0,85899345920,0x5581e2c0\n\
             0,00:00:00.000000,free,0xffffffffffffffff,0,0x1\n"
        );
    }

    #[test]
    fn numbers_format_as_std_does() {
        let mut values = vec![0, 1, 9, 10, 15, 16, 99, 100, 101, 255, 256, 999, 1000, 4095];
        values.extend([
            u64::MAX,
            u64::MAX - 1,
            1 << 63,
            0x7f5a_2c00_0000,
            85_899_345_920,
        ]);
        values.extend((0..64).map(|b| 1u64 << b));
        values.extend((1..20).map(|e| 10u64.pow(e) - 1));
        for v in values {
            let mut line = Line::new();
            line.dec(v);
            line.bytes(b" ");
            line.hex(v);
            assert_eq!(
                std::str::from_utf8(line.as_bytes()).unwrap(),
                format!("{v} {v:#x}")
            );
        }
        let mut second = (u64::MAX, [0; 9]);
        for us in [0u64, 1, 9, 10, 99, 100, 999_999, 123_456] {
            let mut line = Line::new();
            line.time(&mut second, (86_399 * 1_000_000 + us) * 1000 + 999);
            assert_eq!(
                std::str::from_utf8(line.as_bytes()).unwrap(),
                format!("23:59:59.{us:06}")
            );
        }
    }
}
