//! [`LoggingResourceAdaptor`]: a CSV log of every allocation and free in RMM's format, which the
//! replay (`rmm replay`, and RMM's replay benchmark) can play back; `rmm_allocator::event_log` reads it.
//!
//! The format is RMM's `logging_resource_adaptor`:
//! ```text
//! Thread,Time,Action,Pointer,Size,Stream
//! 140204,14:03:22.123456,allocate,0x7f5a2c000000,1048576,0x0
//! 140204,14:03:22.123502,free,0x7f5a2c000000,1048576,0x0
//! 140207,14:03:22.124010,allocate failure,0x0,85899345920,0x5581e2c0
//! ```
//! * `Thread`: OS thread id (spdlog's `%t`); without `/proc/thread-self`, a process-unique number;
//! * `Time`: `HH:MM:SS.ffffff` (spdlog's `%H:%M:%S.%f`) in UTC, not local time (see *Times*);
//! * `Action`: `allocate`, `free` or `allocate failure`;
//! * `Pointer`, `Stream`: `0x` hex (fmt's pointer format; null and the default stream: `0x0`);
//! * `Size`: bytes requested, in decimal.
//!
//! As in RMM, a free is logged before the upstream sees it and an allocation after it returned, so
//! in line order every pointer is freed before it is handed out again, whatever the threads did
//! (the replay's parser relies on it).
//!
//! # Design: binary records on the hot path, CSV on a writer thread
//!
//! * **Records.** An allocation or free appends a binary record to a chunk the calling thread owns
//!   for this adaptor: no lock, allocation or system call; a release store of the chunk's length
//!   publishes it.
//! * **Order.** Each record takes a sequence number where RMM takes its lock (before the upstream
//!   frees, after it allocated); the writer merges the threads' chunks in exactly that order, which
//!   gives RMM's line-order guarantee. Nothing depends on the times.
//! * **Times.** Records carry the coarse clock (`CLOCK_REALTIME_COARSE`), reading the precise one
//!   every 16th record or when the thread's coarse time changed; the writer raises each time to the
//!   last precise time before it, a lower bound off by under a tick.
//! * **Writer thread.** One per adaptor. A thread announces each chunk before writing to it, so
//!   the writer reads every published record, even of partly filled chunks or exited threads. CSV
//!   is buffered and written when full, every 100 ms while records trickle in, and on
//!   [`LoggingResourceAdaptor::flush`]; dropping the adaptor flushes and joins the writer.
//! * **Bounds.** At most 1024 chunks wait for the writer; a thread needing more waits for it. A
//!   thread logging during its thread-local teardown uses a one-record chunk.
//! * **Errors.** A write error is reported once via `tracing`, stops writing (records are still
//!   consumed) and is returned by every later `flush()`.

mod action;
mod csv;
mod records;
mod writer;

use std::fmt;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use std::collections::{BinaryHeap, HashMap};

pub use action::LogAction;
pub use records::log_thread_id;
use records::{
    FREE_CHUNKS, FlushError, LOCALS, Local, Msg, NEXT_ADAPTOR_ID, NEXT_PRODUCER_ID, RecordQueue,
    SeqCounter,
};
use writer::{OUT_BUFFER, Writer};

use crate::backend::DevicePtr;
use crate::error::{Error, Result};
use crate::resource::{DeviceMemoryResource, LiveBlock, SharedResource};
use crate::stream_view::StreamView;

/// The first line of every log, RMM's header.
pub const LOG_HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

/// `<dir>/rmm_log.dev<device>.csv`: one log file per device.
pub fn log_file_path(dir: impl AsRef<Path>, device: u32) -> PathBuf {
    dir.as_ref().join(format!("rmm_log.dev{device}.csv"))
}

/// Logs every allocation and free through it to a CSV file in RMM's format (see the module
/// documentation). [`LoggingResourceAdaptor::flush`] writes out all logged so far, as does a drop.
pub struct LoggingResourceAdaptor {
    upstream: SharedResource,
    path: Option<PathBuf>,
    auto_flush: bool,
    /// Keys the thread-local chunks.
    id: u64,
    queue: Arc<RecordQueue>,
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

fn io_error(path: &Path, what: &str, e: impl fmt::Display) -> Error {
    Error::event_log(
        path.display().to_string(),
        None,
        format!("{what} failed: {e}"),
        "Check that the directory exists and is writable, or log to another path",
    )
}

impl LoggingResourceAdaptor {
    /// Logs to the file at `path`, created or truncated, starting with the header.
    ///
    /// # Errors
    /// [`Error::EventLog`] when the file cannot be created or the header written.
    pub fn new(upstream: SharedResource, path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = File::create(path).map_err(|e| io_error(path, "creating the log", e))?;
        Self::start(upstream, Box::new(file), Some(path.to_path_buf()))
    }

    /// Logs to `<dir>/rmm_log.dev<N>.csv`, N being the upstream's device ([`log_file_path`]).
    ///
    /// # Errors
    /// [`Error::EventLog`] when the file cannot be created or the header written.
    pub fn in_dir(upstream: SharedResource, dir: impl AsRef<Path>) -> Result<Self> {
        let path = log_file_path(dir, upstream.device().ordinal());
        Self::new(upstream, path)
    }

    /// Logs to `writer` from the writer thread, starting with the header. Output is buffered
    /// (64 KiB), so `writer` needs no buffer.
    ///
    /// # Errors
    /// [`Error::EventLog`] when the header cannot be written.
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
        let name = path.clone().unwrap_or_else(|| "<writer>".into());
        writeln!(sink, "{LOG_HEADER}").map_err(|e| io_error(&name, "writing the header", e))?;
        let (tx, rx) = crossbeam_channel::unbounded();
        let (free_tx, free_rx) = crossbeam_channel::bounded(FREE_CHUNKS);
        let queue = Arc::new(RecordQueue {
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
            queue: Arc::clone(&queue),
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
            queue,
            writer: Some(handle),
        })
    }

    /// When `on`, each allocation and free waits until its line is written and flushed (slow; as
    /// RMM's `auto_flush`, the log survives the process dying).
    pub fn auto_flush(mut self, on: bool) -> Self {
        self.auto_flush = on;
        self.queue.auto_flush.store(on, Ordering::Relaxed);
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

    /// Writes out everything any thread (exited ones too) logged so far and flushes the file.
    ///
    /// # Errors
    /// [`Error::EventLog`]: the first write error (logging stopped), a lost writer, a failed flush.
    pub fn flush(&self) -> Result<()> {
        self.flush_to(self.queue.seq.0.load(Ordering::SeqCst))
    }

    /// Writes out the records with sequence numbers below `target` and flushes.
    fn flush_to(&self, target: u64) -> Result<()> {
        let path = self.path.as_deref().unwrap_or(Path::new("<writer>"));
        let log_error = |problem: String, hint| {
            Error::event_log(path.display().to_string(), None, problem, hint)
        };
        let gone = || {
            let problem = "the log's writer thread has stopped".to_string();
            log_error(problem, "See the error logged before this one")
        };
        let (reply, answer) = crossbeam_channel::bounded(1);
        self.queue
            .tx
            .send(Msg::Flush { target, reply })
            .map_err(|_| gone())?;
        match answer.recv() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(FlushError::Stopped(e))) => Err(log_error(
                format!("a write failed and logging stopped: {e}"),
                "Free space on the log's file system or log to another path",
            )),
            Ok(Err(FlushError::Flush(e))) => Err(io_error(path, "flushing the log", e)),
            Err(_) => Err(gone()),
        }
    }

    /// Logs `blocks`, live allocations of another stack now owned by this stack's resource (a
    /// reinitialize keeping data in place), as allocated now (an `allocate` line each), so their
    /// later `free` lines replay.
    pub fn take_over_live(&self, blocks: &[LiveBlock]) {
        for b in blocks.iter().filter(|b| !b.ptr.is_null()) {
            self.log(LogAction::Allocate, b.ptr, b.bytes, b.stream);
        }
    }

    /// Logs `blocks`, live allocations of this adaptor taken over by another stack, as freed now (a
    /// `free` line each), so this log replays with nothing outstanding.
    pub fn hand_over_live(&self, blocks: &[LiveBlock]) {
        for b in blocks.iter().filter(|b| !b.ptr.is_null()) {
            self.log(LogAction::Free, b.ptr, b.bytes, b.stream);
        }
    }

    #[inline]
    fn log(&self, action: LogAction, ptr: DevicePtr, size: usize, stream: StreamView) {
        let (action, ptr, size, stream) = (action as u64, ptr.addr(), size as u64, stream.raw());
        let seq = LOCALS
            .try_with(|locals| {
                let mut locals = locals.try_borrow_mut().ok()?;
                let i = locals.iter().position(|l| l.adaptor == self.id);
                let i = i.unwrap_or_else(|| self.register(&mut locals));
                Some(self.queue.push(&mut locals[i], action, ptr, size, stream))
            })
            .ok()
            .flatten()
            .unwrap_or_else(|| self.queue.push_alone(action, ptr, size, stream));
        if self.auto_flush {
            // Errors are logged by the writer and returned by the next `flush`.
            let _ = self.flush_to(seq + 1);
        }
    }

    /// Adds this adaptor's chunk to the thread's list (dropping gone adaptors'); returns its index.
    #[cold]
    #[inline(never)]
    fn register(&self, locals: &mut Vec<Local>) -> usize {
        locals.retain(|l| l.queue.strong_count() > 0);
        let producer = NEXT_PRODUCER_ID.fetch_add(1, Ordering::Relaxed);
        let chunk = self.queue.take_chunk(producer, log_thread_id());
        let _ = self.queue.tx.send(Msg::Chunk(Arc::clone(&chunk)));
        locals.push(Local {
            adaptor: self.id,
            queue: Arc::downgrade(&self.queue),
            chunk,
            len: 0,
            coarse: 0,
        });
        locals.len() - 1
    }
}

impl DeviceMemoryResource for LoggingResourceAdaptor {
    fn allocate(&self, bytes: usize, stream: StreamView) -> Result<DevicePtr> {
        let r = self.upstream.allocate(bytes, stream);
        let (action, ptr) = match r {
            Ok(p) => (LogAction::Allocate, p),
            Err(_) => (LogAction::AllocateFailure, DevicePtr::NULL),
        };
        self.log(action, ptr, bytes, stream);
        r
    }

    fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: StreamView) -> Result<()> {
        self.log(LogAction::Free, ptr, bytes, stream);
        self.upstream.deallocate(ptr, bytes, stream)
    }

    crate::adaptor::upstream_tail!("LoggingResourceAdaptor");
}

impl Drop for LoggingResourceAdaptor {
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            tracing::error!("{e}");
        }
        let target = self.queue.seq.0.load(Ordering::SeqCst);
        let _ = self.queue.tx.send(Msg::Shutdown { target });
        if let Some(h) = self.writer.take()
            && h.join().is_err()
        {
            tracing::error!("memory event log: the writer thread panicked");
        }
    }
}
