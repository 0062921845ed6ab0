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
//!   uses local time;
//! * `Action`: `allocate`, `free` or `allocate failure`;
//! * `Pointer` and `Stream`: hexadecimal with `0x` (fmt's pointer format; a null pointer or the
//!   default stream is `0x0`);
//! * `Size`: bytes requested, in decimal.
//!
//! As in RMM, a free is logged before the upstream sees it and an allocation after it
//! returned, so the log's line order is an order in which every pointer is freed before it
//! is handed out again, whatever the threads did.

use std::any::Any;
use std::cell::Cell;
use std::fmt;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

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

/// Writes `HH:MM:SS.ffffff` (UTC) of `now`.
fn write_time(out: &mut String, now: SystemTime) {
    use std::fmt::Write as _;
    let d = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() % 86_400;
    let _ = write!(
        out,
        "{:02}:{:02}:{:02}.{:06}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        d.subsec_micros()
    );
}

struct Sink {
    writer: Box<dyn Write + Send>,
    line: String,
    error: Option<String>,
}

impl Sink {
    fn write_event(
        &mut self,
        thread: u64,
        action: &str,
        ptr: DevicePtr,
        size: usize,
        stream: StreamView,
    ) {
        if self.error.is_some() {
            return;
        }
        use std::fmt::Write as _;
        self.line.clear();
        let _ = write!(self.line, "{thread},");
        write_time(&mut self.line, SystemTime::now());
        let _ = writeln!(
            self.line,
            ",{action},{:#x},{size},{:#x}",
            ptr.addr(),
            stream.raw()
        );
        if let Err(e) = self.writer.write_all(self.line.as_bytes()) {
            tracing::error!("memory event log: writing failed, logging stops: {e}");
            self.error = Some(e.to_string());
        }
    }
}

/// Logs every allocation and free through it to a CSV file in RMM's format (see the module
/// documentation). Lines are buffered; [`LoggingResourceAdaptor::flush`] writes them out, and
/// dropping the adaptor flushes. A write error stops the logging (allocations go on) and is
/// returned by the next `flush`.
pub struct LoggingResourceAdaptor {
    upstream: SharedResource,
    path: Option<PathBuf>,
    auto_flush: bool,
    sink: Mutex<Sink>,
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
        let mut r = Self::to_writer(upstream, BufWriter::with_capacity(1 << 16, file))?;
        r.path = Some(path.to_path_buf());
        Ok(r)
    }

    /// Logs to `<dir>/rmm_log.dev<N>.csv`, N being the upstream's device ([`log_file_path`]).
    pub fn in_dir(upstream: SharedResource, dir: impl AsRef<Path>) -> Result<Self> {
        let path = log_file_path(dir, upstream.device().ordinal());
        Self::new(upstream, path)
    }

    /// Logs to `writer` (give it a buffer of its own if it is unbuffered), starting with the
    /// header.
    pub fn to_writer(
        upstream: SharedResource,
        writer: impl Write + Send + 'static,
    ) -> Result<Self> {
        let mut writer: Box<dyn Write + Send> = Box::new(writer);
        writeln!(writer, "{LOG_HEADER}")
            .map_err(|e| io_error(Path::new("<writer>"), "writing the header", e))?;
        Ok(LoggingResourceAdaptor {
            upstream,
            path: None,
            auto_flush: false,
            sink: Mutex::new(Sink {
                writer,
                line: String::with_capacity(96),
                error: None,
            }),
        })
    }

    /// Flushes after every line when `on` (slow: as RMM's `auto_flush`).
    pub fn auto_flush(mut self, on: bool) -> Self {
        self.auto_flush = on;
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

    /// Writes buffered lines out. Returns the first write error, if logging stopped.
    pub fn flush(&self) -> Result<()> {
        let mut sink = self.sink.lock();
        let path = self.path.as_deref().unwrap_or(Path::new("<writer>"));
        if let Some(e) = &sink.error {
            return Err(Error::EventLog {
                path: path.display().to_string(),
                line: None,
                problem: format!("a write failed and logging stopped: {e}"),
                hint: "Free space on the log's file system or log to another path".to_string(),
            });
        }
        sink.writer
            .flush()
            .map_err(|e| io_error(path, "flushing the log", e))
    }

    fn log(&self, action: &str, ptr: DevicePtr, size: usize, stream: StreamView) {
        let thread = log_thread_id();
        let mut sink = self.sink.lock();
        sink.write_event(thread, action, ptr, size, stream);
        if self.auto_flush
            && let Err(e) = sink.writer.flush()
            && sink.error.is_none()
        {
            tracing::error!("memory event log: flushing failed, logging stops: {e}");
            sink.error = Some(e.to_string());
        }
    }
}

impl DeviceMemoryResource for LoggingResourceAdaptor {
    fn allocate(&self, bytes: usize, stream: StreamView) -> Result<DevicePtr> {
        match self.upstream.allocate(bytes, stream) {
            Ok(p) => {
                self.log("allocate", p, bytes, stream);
                Ok(p)
            }
            Err(e) => {
                self.log("allocate failure", DevicePtr::NULL, bytes, stream);
                Err(e)
            }
        }
    }

    fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: StreamView) -> Result<()> {
        self.log("free", ptr, bytes, stream);
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
    }
}
