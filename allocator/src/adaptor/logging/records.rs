//! The hot path's side of the log: per-thread chunks of binary records and their sequence counter.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use crate::backend::clock::{coarse_realtime_ns, realtime_ns};

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
pub(super) const CHUNK_RECORDS: usize = 1024;
/// Chunks that may be waiting for the writer, per adaptor, before logging threads wait.
pub(super) const MAX_CHUNKS: usize = 1024;
/// Consumed chunks kept for reuse.
pub(super) const FREE_CHUNKS: usize = 64;

/// Every this many records (by sequence number) read the precise clock.
pub(super) const PRECISE_EVERY: u64 = 16;

/// A record's first word: `sequence << TAG_SEQ_SHIFT | TAG_PRECISE? | action` (`LogAction as u64`).
pub(super) const TAG_SEQ_SHIFT: u32 = 3;
/// The time is the precise clock's (else the coarse clock's).
pub(super) const TAG_PRECISE: u64 = 4;

pub(super) static NEXT_ADAPTOR_ID: AtomicU64 = AtomicU64::new(1);
pub(super) static NEXT_PRODUCER_ID: AtomicU64 = AtomicU64::new(1);

/// `[tag, time (ns since the epoch), pointer, size, stream]`; atomic only so the writer may read a
/// chunk being filled (the owner's stores are published by [`Chunk::len`]'s release store).
pub(super) type Record = [AtomicU64; 5];

#[inline(always)]
fn store(r: &Record, words: [u64; 5]) {
    for (a, w) in r.iter().zip(words) {
        a.store(w, Ordering::Relaxed);
    }
}

/// A run of records of one thread for one adaptor.
pub(super) struct Chunk {
    /// The (thread, adaptor) pair that fills it.
    pub(super) producer: u64,
    /// The thread's id as the log shows it.
    pub(super) thread: u64,
    /// Records published (written completely); only the owner stores, with `Release`.
    pub(super) len: AtomicUsize,
    pub(super) records: Box<[Record]>,
}

impl Chunk {
    pub(super) fn new(capacity: usize, producer: u64, thread: u64) -> Chunk {
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

/// The adaptor's sequence counter, on a cache line of its own.
#[repr(align(128))]
pub(super) struct SeqCounter(pub(super) AtomicU64);

/// What the adaptor, its writer and (weakly) the logging threads share.
pub(super) struct RecordQueue {
    pub(super) seq: SeqCounter,
    pub(super) tx: Sender<Msg>,
    pub(super) free_rx: Receiver<Arc<Chunk>>,
    /// Chunks allocated and not yet dropped (in use, waiting or free).
    pub(super) outstanding: AtomicUsize,
    /// False once the writer thread has ended (then records are dropped).
    pub(super) writer_alive: AtomicBool,
    pub(super) auto_flush: AtomicBool,
}

/// A thread's chunk for one adaptor.
pub(super) struct Local {
    pub(super) adaptor: u64,
    /// For pruning: dead once the adaptor and its writer are gone.
    pub(super) queue: Weak<RecordQueue>,
    pub(super) chunk: Arc<Chunk>,
    /// Records written into `chunk` (the owner's copy of `chunk.len`).
    pub(super) len: usize,
    /// The coarse time of this thread's last precise record.
    pub(super) coarse: u64,
}

thread_local! {
    pub(super) static LOCALS: RefCell<Vec<Local>> = const { RefCell::new(Vec::new()) };
}

impl RecordQueue {
    /// Writes one record into `local`'s chunk and publishes it. Returns its sequence number.
    #[inline]
    pub(super) fn push(
        &self,
        local: &mut Local,
        action: u64,
        ptr: u64,
        size: u64,
        stream: u64,
    ) -> u64 {
        let seq = self.seq.0.fetch_add(1, Ordering::Relaxed);
        let coarse = coarse_realtime_ns();
        let (time, precise) = if seq.is_multiple_of(PRECISE_EVERY) || coarse != local.coarse {
            local.coarse = coarse;
            (realtime_ns(), TAG_PRECISE)
        } else {
            (coarse, 0)
        };
        let tag = seq << TAG_SEQ_SHIFT | precise | action;
        store(
            &local.chunk.records[local.len],
            [tag, time, ptr, size, stream],
        );
        local.len += 1;
        local.chunk.len.store(local.len, Ordering::Release);
        if local.len == local.chunk.records.len() {
            self.replace_chunk(local);
        }
        seq
    }

    /// A chunk for `producer`: a free or new one, or past [`MAX_CHUNKS`] the next the writer frees.
    pub(super) fn take_chunk(&self, producer: u64, thread: u64) -> Arc<Chunk> {
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
    pub(super) fn replace_chunk(&self, local: &mut Local) {
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

    /// Logs one record via its own one-record chunk (thread-local list torn down, or re-entered).
    #[cold]
    #[inline(never)]
    pub(super) fn push_alone(&self, action: u64, ptr: u64, size: u64, stream: u64) -> u64 {
        let producer = NEXT_PRODUCER_ID.fetch_add(1, Ordering::Relaxed);
        let chunk = Arc::new(Chunk::new(1, producer, log_thread_id()));
        let _ = self.tx.send(Msg::Chunk(Arc::clone(&chunk)));
        let seq = self.seq.0.fetch_add(1, Ordering::Relaxed);
        let tag = seq << TAG_SEQ_SHIFT | TAG_PRECISE | action;
        store(&chunk.records[0], [tag, realtime_ns(), ptr, size, stream]);
        chunk.len.store(1, Ordering::Release);
        seq
    }
}

/// The writer's messages.
pub(super) enum Msg {
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

/// Why a flush failed, as the writer reports it (each error as text).
#[derive(Clone)]
pub(super) enum FlushError {
    /// An earlier write failed and the writing stopped.
    Stopped(String),
    /// Flushing the sink failed.
    Flush(String),
}
