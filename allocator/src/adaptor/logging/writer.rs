//! The writer thread: merges producers' chunks in sequence order, writes the CSV, answers flushes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::io::Write;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};

use super::csv::{format_line, line_prefix};
use super::records::{
    CHUNK_RECORDS, Chunk, FlushError, Msg, RecordQueue, TAG_PRECISE, TAG_SEQ_SHIFT,
};

/// CSV bytes buffered before they are written to the sink.
pub(super) const OUT_BUFFER: usize = 1 << 16;
/// How often an idle writer looks for records in partly filled chunks.
pub(super) const POLL: Duration = Duration::from_millis(100);
/// How often a writer looks again while a flush waits for a record still being written.
pub(super) const SHORT_WAIT: Duration = Duration::from_micros(50);
/// How long the writer waits for a record numbered but never published before skipping it.
pub(super) const GAP_TIMEOUT: Duration = Duration::from_secs(1);

/// The writer's view of one producer's chunks.
#[derive(Default)]
pub(super) struct Producer {
    /// `<thread id>,`: how its lines start.
    pub(super) prefix: Vec<u8>,
    /// Announced chunks, oldest first; the front one is being read; all but the last are full.
    pub(super) chunks: VecDeque<Arc<Chunk>>,
    /// Records of the front chunk already written.
    pub(super) consumed: usize,
    /// Records of the front chunk known to be published.
    pub(super) published: usize,
    /// Whether the heap holds this producer's next record.
    pub(super) in_heap: bool,
}

impl Producer {
    /// The next published record's sequence number, moving spent chunks to `done`. `full_only`
    /// skips the last chunk, which may be being filled.
    pub(super) fn head(&mut self, done: &mut Vec<Arc<Chunk>>, full_only: bool) -> Option<u64> {
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
                // Owner dropped its handle (moved on or exited): after this fence `len` is final.
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
pub(super) struct Writer {
    pub(super) rx: Receiver<Msg>,
    pub(super) free_tx: Sender<Arc<Chunk>>,
    pub(super) queue: Arc<RecordQueue>,
    pub(super) sink: Box<dyn Write + Send>,
    pub(super) out: Vec<u8>,
    pub(super) error: Option<String>,
    pub(super) producers: HashMap<u64, Producer>,
    /// (sequence number of the next record, producer) of producers with published records.
    pub(super) heap: BinaryHeap<Reverse<(u64, u64)>>,
    /// The sequence number of the next record to write.
    pub(super) next_seq: u64,
    pub(super) flushes: Vec<(u64, Sender<std::result::Result<(), FlushError>>)>,
    /// The target of the shutdown, once asked.
    pub(super) shutdown: Option<u64>,
    /// When records were last written (or nothing waited).
    pub(super) last_progress: Instant,
    /// Whether the next pump reads partly filled chunks too.
    pub(super) read_all: bool,
    /// The second of the last time written, and its `HH:MM:SS.`.
    pub(super) second: (u64, [u8; 9]),
    /// The time of the last precise record written.
    pub(super) precise: u64,
}

/// Marks the writer dead when its thread ends, however it ends.
pub(super) struct AliveGuard(Arc<RecordQueue>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.writer_alive.store(false, Ordering::Relaxed);
        if std::thread::panicking() {
            tracing::error!("memory event log: the writer thread panicked, logging stops");
        }
    }
}

impl Writer {
    pub(super) fn run(mut self) {
        let _alive = AliveGuard(Arc::clone(&self.queue));
        let mut progressed = false;
        loop {
            let waiting = !self.flushes.is_empty() || self.shutdown.is_some();
            let first = if waiting && progressed {
                self.rx.try_recv().map_err(|e| match e {
                    TryRecvError::Empty => RecvTimeoutError::Timeout,
                    TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
                })
            } else {
                // Wakes on a full chunk, flush or shutdown; polls partly filled chunks meanwhile.
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

    pub(super) fn handle(&mut self, m: Msg) {
        match m {
            Msg::Chunk(c) => {
                self.producers
                    .entry(c.producer)
                    .or_insert_with(|| Producer {
                        prefix: line_prefix(c.thread),
                        ..Producer::default()
                    })
                    .chunks
                    .push_back(c);
            }
            Msg::Wake => self.read_all = true,
            Msg::Flush { target, reply } => self.flushes.push((target, reply)),
            Msg::Shutdown { target } => self.shutdown = Some(target),
        }
    }

    /// Writes every record next in sequence order; returns whether it wrote any. Partly filled
    /// chunks are read only with `read_all` or when the next record may be in one.
    pub(super) fn pump(&mut self) -> bool {
        let mut wrote = self.merge(!self.read_all);
        if !self.read_all && !self.heap.is_empty() {
            wrote |= self.merge(false);
        }
        self.read_all = false;
        wrote
    }

    /// [`Writer::pump`]'s work, reading only full chunks with `full_only`.
    pub(super) fn merge(&mut self, full_only: bool) -> bool {
        let mut done = Vec::new();
        // A producer out of the heap enters it with its next record, or leaves if it has no chunk.
        self.producers.retain(|&id, p| {
            if !p.in_heap
                && let Some(seq) = p.head(&mut done, full_only)
            {
                self.heap.push(Reverse((seq, id)));
                p.in_heap = true;
            }
            p.in_heap || !p.chunks.is_empty()
        });
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
                let mut record = r.each_ref().map(|w| w.load(Ordering::Relaxed));
                p.consumed += 1;
                self.next_seq = self.next_seq.max(seq + 1);
                wrote = true;
                if record[0] & TAG_PRECISE != 0 {
                    self.precise = self.precise.max(record[1]);
                } else {
                    // At least the last precise record's time before it, and its tick's.
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
    pub(super) fn recycle(&mut self, mut c: Arc<Chunk>) {
        if c.records.len() != CHUNK_RECORDS {
            return; // a one-record chunk: not counted
        }
        if let Some(m) = Arc::get_mut(&mut c) {
            *m.len.get_mut() = 0;
            if self.free_tx.try_send(c).is_ok() {
                return;
            }
        }
        self.queue.outstanding.fetch_sub(1, Ordering::Relaxed);
    }

    pub(super) fn write_out(&mut self) {
        write_to(&mut self.sink, &mut self.out, &mut self.error);
    }

    pub(super) fn flush_sink(&mut self) -> std::result::Result<(), FlushError> {
        if let Some(e) = &self.error {
            return Err(FlushError::Stopped(e.clone()));
        }
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| self.sink.flush()))
            .unwrap_or_else(|_| Err(std::io::Error::other("the writer panicked while flushing")));
        r.map_err(|e| {
            if self.queue.auto_flush.load(Ordering::Relaxed) {
                tracing::error!("memory event log: flushing failed, logging stops: {e}");
                self.error = Some(e.to_string());
            }
            FlushError::Flush(e.to_string())
        })
    }

    /// Answers the flushes whose records are all written.
    pub(super) fn answer_flushes(&mut self) {
        if !self.flushes.iter().any(|(t, _)| *t <= self.next_seq) {
            return;
        }
        self.write_out();
        let result = self.flush_sink();
        let next = self.next_seq;
        self.flushes.retain(|(target, reply)| {
            if *target > next {
                return true;
            }
            let _ = reply.send(result.clone());
            false
        });
    }
}

/// Writes `out` to `sink` (unless writing stopped) and clears it; a failure stops writing.
pub(super) fn write_to(
    sink: &mut Box<dyn Write + Send>,
    out: &mut Vec<u8>,
    error: &mut Option<String>,
) {
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
