//! [`TorchTrace`]: one device's part of a PyTorch memory snapshot, built as the events
//! arrive (a ring of the last trace entries, and the segments and blocks live now).

use std::collections::{BTreeMap, VecDeque};

use super::super::{Action, MemoryEvent, TimelineError};
use super::format::{Block, SMALL_SEGMENT, Segment, TraceEntry, inactive, int, time_us};

/// A live range: address → (size, stream).
type Ranges = BTreeMap<u64, (u64, u64)>;

/// True when `[addr, addr + size)` lies inside one range of `ranges`.
fn inside(ranges: &Ranges, addr: u64, size: u64) -> bool {
    ranges
        .range(..=addr)
        .next_back()
        .is_some_and(|(&a, &(s, _))| addr.saturating_add(size) <= a.saturating_add(s))
}

/// Merges overlapping or touching ranges `(addr, end)`.
fn merge(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (a, e) in ranges {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(e),
            _ => out.push((a, e)),
        }
    }
    out
}

/// What a trace record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Alloc,
    /// A free: two entries, `free_requested` and `free_completed`.
    Free,
    SegmentAlloc,
    SegmentFree,
    Oom,
}

impl Kind {
    /// Trace entries of one record.
    fn entries(self) -> usize {
        if self == Kind::Free { 2 } else { 1 }
    }
}

/// One record of the ring: one event, as the trace gives it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Record {
    kind: Kind,
    /// For an `Oom`, the device's free bytes (PyTorch puts them in `addr` too).
    addr: u64,
    size: u64,
    stream: u64,
    t: f64,
    /// A block that no recorded segment held when it was allocated (or freed, when it was
    /// allocated before the trace): the snapshot gives it a synthetic segment.
    orphan: bool,
}

/// Every value of a record is checked against the snapshot's integers when it is pushed;
/// this turns a checked one into one.
fn checked(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl Record {
    /// The trace entries of this record (one, or two for a free).
    pub(super) fn entries(&self) -> impl Iterator<Item = TraceEntry> + '_ {
        let actions: &[&'static str] = match self.kind {
            Kind::Alloc => &["alloc"],
            Kind::Free => &["free_requested", "free_completed"],
            Kind::SegmentAlloc => &["segment_alloc"],
            Kind::SegmentFree => &["segment_free"],
            Kind::Oom => &["oom"],
        };
        actions.iter().map(move |&action| TraceEntry {
            action,
            addr: checked(self.addr),
            size: checked(self.size),
            stream: checked(self.stream),
            time_us: time_us(self.t),
            frames: Vec::new(),
            device_free: (self.kind == Kind::Oom).then(|| checked(self.addr)),
        })
    }
}

/// The PyTorch memory snapshot's view of one device, built as its events arrive: the last
/// `max_entries` trace entries (a ring, as PyTorch's
/// `torch.cuda.memory._record_memory_history(max_entries=N)` keeps), and the segments and
/// blocks live now. Memory: the ring, and the blocks and segments live at once; not the
/// number of events.
///
/// ```
/// use rmm_cli::timeline::{Action, MemoryEvent, TorchTrace, torch_snapshot_of};
///
/// let mut trace = TorchTrace::new(0, Some(1 << 30), Some(4));
/// let ev = |action, addr| MemoryEvent { t: 0.0, action, addr, size: 256, stream: 0 };
/// for _ in 0..10 {
///     trace.push(&ev(Action::Alloc, 0x1000));
///     trace.push(&ev(Action::FreeCompleted, 0x1000));
/// }
/// assert_eq!(trace.entries(), 3, "the last alloc and its free's two entries");
/// assert_eq!(trace.dropped_entries(), 27);
/// let pickle = torch_snapshot_of(&[trace]).unwrap();
/// assert_eq!(&pickle[..2], b"\x80\x03");
/// ```
#[derive(Debug)]
pub struct TorchTrace {
    pub(super) device: u32,
    total_memory: Option<u64>,
    max_entries: Option<usize>,
    pub(super) ring: VecDeque<Record>,
    pub(super) entries: usize,
    dropped: u64,
    segments: Ranges,
    blocks: Ranges,
    segment_bytes: u64,
    block_bytes: u64,
    has_segments: bool,
    /// The first value that does not fit the snapshot's integers.
    pub(super) error: Option<(&'static str, u64)>,
}

impl TorchTrace {
    /// An empty trace of `device` (of `total_memory` bytes, when known, for the free bytes of
    /// `oom` entries) that keeps the last `max_entries` trace entries (`None`: all of them).
    pub fn new(device: u32, total_memory: Option<u64>, max_entries: Option<usize>) -> Self {
        TorchTrace {
            device,
            total_memory,
            max_entries,
            ring: VecDeque::new(),
            entries: 0,
            dropped: 0,
            segments: Ranges::new(),
            blocks: Ranges::new(),
            segment_bytes: 0,
            block_bytes: 0,
            has_segments: false,
            error: None,
        }
    }

    /// Counts the device's bytes reserved as its segments' from the start, even before the
    /// first segment event (for a caller that knows segment events will come); otherwise
    /// they are the live blocks' until one does. Only the free bytes of `oom` entries
    /// depend on it.
    pub fn expect_segments(&mut self) {
        self.has_segments = true;
    }

    /// The device.
    pub fn device(&self) -> u32 {
        self.device
    }

    /// Trace entries kept.
    pub fn entries(&self) -> usize {
        self.entries
    }

    /// Trace entries dropped from the front of the ring so far.
    pub fn dropped_entries(&self) -> u64 {
        self.dropped
    }

    fn check(&mut self, field: &'static str, value: u64) {
        if self.error.is_none() && i64::try_from(value).is_err() {
            self.error = Some((field, value));
        }
    }

    fn keep(&mut self, record: Record) {
        self.check(
            if record.kind == Kind::Oom {
                "device_free"
            } else {
                "addr"
            },
            record.addr,
        );
        self.check("size", record.size);
        self.check("stream", record.stream);
        self.entries += record.kind.entries();
        self.ring.push_back(record);
        if let Some(max) = self.max_entries {
            while self.entries > max {
                let Some(old) = self.ring.pop_front() else {
                    break;
                };
                self.entries -= old.kind.entries();
                self.dropped += old.kind.entries() as u64;
            }
        }
    }

    /// Adds the next event (events in the order they happened).
    pub fn push(&mut self, e: &MemoryEvent) {
        let record = |kind, addr, size, orphan| Record {
            kind,
            addr,
            size,
            stream: e.stream,
            t: e.t,
            orphan,
        };
        match e.action {
            Action::Alloc => {
                let orphan = !inside(&self.segments, e.addr, e.size);
                if let Some((old, _)) = self.blocks.insert(e.addr, (e.size, e.stream)) {
                    self.block_bytes = self.block_bytes.saturating_sub(old);
                }
                self.block_bytes = self.block_bytes.saturating_add(e.size);
                self.keep(record(Kind::Alloc, e.addr, e.size, orphan));
            }
            Action::FreeCompleted => {
                let live = self.blocks.remove(&e.addr);
                let size = live.map_or(e.size, |(s, _)| s);
                self.block_bytes = self.block_bytes.saturating_sub(live.map_or(0, |(s, _)| s));
                // Allocated before the trace began, outside any known segment.
                let orphan = live.is_none() && !inside(&self.segments, e.addr, size);
                self.keep(record(Kind::Free, e.addr, size, orphan));
            }
            Action::SegmentAlloc => {
                self.has_segments = true;
                if let Some((old, _)) = self.segments.insert(e.addr, (e.size, e.stream)) {
                    self.segment_bytes = self.segment_bytes.saturating_sub(old);
                }
                self.segment_bytes = self.segment_bytes.saturating_add(e.size);
                self.keep(record(Kind::SegmentAlloc, e.addr, e.size, false));
            }
            Action::SegmentFree => {
                self.has_segments = true;
                let Some((size, _)) = self.segments.remove(&e.addr) else {
                    // Not a live segment: left out of the trace.
                    return;
                };
                self.segment_bytes = self.segment_bytes.saturating_sub(size);
                self.keep(record(Kind::SegmentFree, e.addr, size, false));
            }
            Action::Oom => {
                let reserved = if self.has_segments {
                    self.segment_bytes
                } else {
                    self.block_bytes
                };
                let free = self.total_memory.map_or(0, |t| t.saturating_sub(reserved));
                self.keep(record(Kind::Oom, free, e.size, false));
            }
        }
    }

    /// The segments live now, with their blocks; synthetic segments for the blocks of the
    /// trace and the live blocks that no recorded segment holds.
    pub(super) fn segments(&self) -> Result<Vec<Segment>, TimelineError> {
        let mut orphans: Vec<(u64, u64)> = self
            .ring
            .iter()
            .filter(|r| r.orphan)
            .map(|r| (r.addr, r.addr.saturating_add(r.size)))
            .collect();
        // Blocks live at the end outside every live segment are orphans too.
        for (&a, &(s, _)) in &self.blocks {
            if !inside(&self.segments, a, s) {
                orphans.push((a, a.saturating_add(s)));
            }
        }
        let mut all: Vec<(u64, u64, u64)> = self
            .segments
            .iter()
            .map(|(&a, &(s, stream))| (a, s, stream))
            .collect();
        all.extend(
            merge(orphans)
                .into_iter()
                .filter(|&(a, e)| e > a)
                .map(|(a, e)| (a, e - a, 0)),
        );
        all.sort_unstable();
        let mut out = Vec::with_capacity(all.len());
        let mut placed: Ranges = Ranges::new();
        for (addr, size, stream) in all {
            let end = addr.saturating_add(size);
            let mut seg_blocks = Vec::new();
            let (mut cursor, mut allocated) = (addr, 0u64);
            for (&a, &(s, _)) in self.blocks.range(addr..end) {
                let b_end = a.saturating_add(s);
                if a < cursor || b_end > end || placed.contains_key(&a) {
                    // Overlapping or straddling (inconsistent events), or in an earlier
                    // segment.
                    continue;
                }
                if a > cursor {
                    seg_blocks.push(inactive(cursor, a - cursor)?);
                }
                seg_blocks.push(Block {
                    address: int("address", a)?,
                    size: int("size", s)?,
                    requested_size: int("requested_size", s)?,
                    state: "active_allocated",
                    frames: Vec::new(),
                });
                placed.insert(a, (s, 0));
                allocated += s;
                cursor = b_end;
            }
            if cursor < end {
                seg_blocks.push(inactive(cursor, end - cursor)?);
            }
            let allocated = int("allocated_size", allocated)?;
            out.push(Segment {
                device: i64::from(self.device),
                address: int("address", addr)?,
                total_size: int("total_size", size)?,
                allocated_size: allocated,
                active_size: allocated,
                requested_size: allocated,
                stream: int("stream", stream)?,
                segment_type: if size <= SMALL_SEGMENT {
                    "small"
                } else {
                    "large"
                },
                segment_pool_id: (0, 0),
                is_expandable: false,
                frames: Vec::new(),
                blocks: seg_blocks,
            });
        }
        Ok(out)
    }
}
