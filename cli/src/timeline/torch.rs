//! A [`Timeline`]'s events as a PyTorch memory snapshot: the pickle that
//! `torch.cuda.memory._snapshot()` returns and `torch.cuda.memory._dump_snapshot()` writes, so
//! `torch.cuda._memory_viz` (`trace_plot`, `segment_plot`, `segsum`, `trace`) and
//! <https://pytorch.org/memory_viz> open it.
//!
//! The snapshot is a dict:
//! * `"segments"`: the segments live after the last event, each a dict with `device`,
//!   `address`, `total_size`, `allocated_size`, `active_size`, `requested_size`, `stream`,
//!   `segment_type` (`"small"` up to 2 MiB, as PyTorch's small pool, else `"large"`),
//!   `segment_pool_id` (`(0, 0)`), `is_expandable` (`False`), `frames` (`[]`) and `blocks`:
//!   dicts with `address`, `size`, `requested_size`, `state` (`"active_allocated"` for a live
//!   block, `"inactive"` for the gaps between them) and `frames` (`[]`), tiling the segment in
//!   address order (the viewer computes block addresses by adding up sizes).
//! * `"device_traces"`: one list per device ordinal `0..=max` (empty for devices without
//!   data), each a list of dicts with `action` (`"alloc"`, `"free_requested"` and
//!   `"free_completed"` for each free, `"segment_alloc"`, `"segment_free"`, `"oom"`), `addr`,
//!   `size`, `stream`, `time_us` and `frames` (`[]`); `"oom"` entries also carry
//!   `device_free` (the device's memory less the bytes reserved then, when its total is known,
//!   else 0).
//!
//! A [`TorchTrace`] builds one device's part as the events arrive, keeping the last N trace
//! entries as PyTorch's `torch.cuda.memory._record_memory_history(max_entries=N)` does (so the
//! viewer reads a trace that begins mid-run, as it reads PyTorch's), and the live segments
//! and blocks: its memory does not grow with the number of events. [`torch_snapshot_bytes`] keeps every entry of a [`Timeline`].
//!
//! The viewer needs every block it draws to lie in a segment. Blocks that no recorded segment
//! holds (e.g. from a pool's initial chunk, which no hook reports, or a resource without a
//! pool) get synthetic segments covering them, present for the whole trace (for the blocks of
//! the entries kept and those live at the end); a `SegmentFree` of a segment that is not live
//! is left out of the trace. Integers are written as signed 64-bit
//! (the viewer's unpickler reads no longer ones), with pickle protocol 3.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;

use serde::Serialize;
use serde::ser::SerializeSeq;

use super::{Action, DeviceTimeline, MemoryEvent, Timeline, TimelineError};

/// Trace entries a snapshot of `rmm replay` keeps by default (`--torch-trace-entries`): the
/// last ones, as PyTorch's `_record_memory_history(max_entries=N)` does.
pub const DEFAULT_TRACE_ENTRIES: usize = 100_000;

/// Segments up to this size are PyTorch's "small" pool.
const SMALL_SEGMENT: u64 = 2 << 20;

/// A stack frame (always empty lists here: no call stacks are recorded).
#[derive(Debug, Serialize)]
struct Frame {
    filename: String,
    line: i64,
    name: String,
}

#[derive(Debug, Serialize)]
struct Segment {
    device: i64,
    address: i64,
    total_size: i64,
    allocated_size: i64,
    active_size: i64,
    requested_size: i64,
    stream: i64,
    segment_type: &'static str,
    segment_pool_id: (i64, i64),
    is_expandable: bool,
    frames: Vec<Frame>,
    blocks: Vec<Block>,
}

#[derive(Debug, Serialize)]
struct Block {
    address: i64,
    size: i64,
    requested_size: i64,
    state: &'static str,
    frames: Vec<Frame>,
}

#[derive(Debug, Serialize)]
struct TraceEntry {
    action: &'static str,
    addr: i64,
    size: i64,
    stream: i64,
    time_us: i64,
    frames: Vec<Frame>,
    #[serde(skip_serializing_if = "Option::is_none")]
    device_free: Option<i64>,
}

fn int(field: &'static str, value: u64) -> Result<i64, TimelineError> {
    i64::try_from(value).map_err(|_| TimelineError::OutOfRange { field, value })
}

fn time_us(t: f64) -> i64 {
    if t.is_finite() {
        // Saturating float-to-int conversion.
        (t * 1e6).round() as i64
    } else {
        0
    }
}

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
struct Record {
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
    fn entries(&self) -> impl Iterator<Item = TraceEntry> + '_ {
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
    device: u32,
    total_memory: Option<u64>,
    max_entries: Option<usize>,
    ring: VecDeque<Record>,
    entries: usize,
    dropped: u64,
    segments: Ranges,
    blocks: Ranges,
    segment_bytes: u64,
    block_bytes: u64,
    has_segments: bool,
    /// The first value that does not fit the snapshot's integers.
    error: Option<(&'static str, u64)>,
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
    fn segments(&self) -> Result<Vec<Segment>, TimelineError> {
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

fn inactive(addr: u64, size: u64) -> Result<Block, TimelineError> {
    Ok(Block {
        address: int("address", addr)?,
        size: int("size", size)?,
        requested_size: 0,
        state: "inactive",
        frames: Vec::new(),
    })
}

/// One device's trace: the rings of its [`TorchTrace`]s one after the other, serialized as
/// they are read (the entries are never all built at once).
struct DeviceTraces<'a>(Vec<&'a TorchTrace>);

impl Serialize for DeviceTraces<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let len = self.0.iter().map(|t| t.entries).sum();
        let mut seq = serializer.serialize_seq(Some(len))?;
        for trace in &self.0 {
            for record in &trace.ring {
                for entry in record.entries() {
                    seq.serialize_element(&entry)?;
                }
            }
        }
        seq.end()
    }
}

#[derive(Serialize)]
struct Snapshot<'a> {
    segments: Vec<Segment>,
    device_traces: Vec<DeviceTraces<'a>>,
}

/// The PyTorch memory snapshot of `traces` (see the module documentation) as pickle bytes:
/// one trace list per device ordinal `0..=max` (the traces of one device follow each other),
/// and the segments of every trace.
///
/// # Errors
/// [`TimelineError::OutOfRange`] when a value does not fit the snapshot's fields;
/// [`TimelineError::Encode`] when pickling fails.
pub fn torch_snapshot_of(traces: &[TorchTrace]) -> Result<Vec<u8>, TimelineError> {
    if let Some((field, value)) = traces.iter().find_map(|t| t.error) {
        return Err(TimelineError::OutOfRange { field, value });
    }
    let max_device = traces.iter().map(|t| t.device).max();
    let count = max_device.map_or(0, |m| m as usize + 1);
    let mut snapshot = Snapshot {
        segments: Vec::new(),
        device_traces: (0..count).map(|_| DeviceTraces(Vec::new())).collect(),
    };
    for t in traces {
        snapshot.device_traces[t.device as usize].0.push(t);
        snapshot.segments.extend(t.segments()?);
    }
    serde_pickle::to_vec(&snapshot, serde_pickle::SerOptions::new())
        .map_err(|e| TimelineError::Encode(e.to_string()))
}

/// The PyTorch memory snapshot of `timeline` (see the module documentation) as pickle bytes,
/// with every event in the trace.
///
/// # Errors
/// [`TimelineError::OutOfRange`] when a value does not fit the snapshot's fields;
/// [`TimelineError::Encode`] when pickling fails.
pub fn torch_snapshot_bytes(timeline: &Timeline) -> Result<Vec<u8>, TimelineError> {
    let traces: Vec<TorchTrace> = timeline.devices.iter().map(device_trace).collect();
    torch_snapshot_of(&traces)
}

/// `d`'s events as a trace (all of them).
fn device_trace(d: &DeviceTimeline) -> TorchTrace {
    let mut trace = TorchTrace::new(d.device, d.total_memory, None);
    if d.events
        .iter()
        .any(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentFree))
    {
        trace.expect_segments();
    }
    for e in &d.events {
        trace.push(e);
    }
    trace
}

/// Writes `timeline`'s events to `path` as a PyTorch memory snapshot (a pickle, see the
/// module documentation), for `torch.cuda._memory_viz` or <https://pytorch.org/memory_viz>.
///
/// # Errors
/// As [`torch_snapshot_bytes`]; [`TimelineError::Write`] when `path` cannot be written.
pub fn write_torch_snapshot(timeline: &Timeline, path: &Path) -> Result<(), TimelineError> {
    let bytes = torch_snapshot_bytes(timeline)?;
    std::fs::write(path, bytes).map_err(|source| TimelineError::Write {
        what: "PyTorch memory snapshot",
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::MemoryEvent;
    use serde_pickle::{DeOptions, HashableValue, Value};

    fn ev(t: f64, action: Action, addr: u64, size: u64) -> MemoryEvent {
        MemoryEvent {
            t,
            action,
            addr,
            size,
            stream: 0,
        }
    }

    fn load(bytes: &[u8]) -> Value {
        serde_pickle::value_from_slice(bytes, DeOptions::new()).unwrap()
    }

    fn get<'a>(v: &'a Value, key: &str) -> &'a Value {
        match v {
            Value::Dict(d) => d
                .get(&HashableValue::String(key.into()))
                .unwrap_or_else(|| panic!("no key {key} in {v:?}")),
            _ => panic!("not a dict: {v:?}"),
        }
    }

    fn list(v: &Value) -> &[Value] {
        match v {
            Value::List(l) => l,
            _ => panic!("not a list: {v:?}"),
        }
    }

    fn int_of(v: &Value) -> i64 {
        match v {
            Value::I64(i) => *i,
            _ => panic!("not an int: {v:?}"),
        }
    }

    fn str_of(v: &Value) -> &str {
        match v {
            Value::String(s) => s,
            _ => panic!("not a str: {v:?}"),
        }
    }

    const SEG: u64 = 0x7f00_0000_0000;
    const MIB: u64 = 1 << 20;

    fn scripted() -> Timeline {
        let events = vec![
            ev(0.0, Action::SegmentAlloc, SEG, 64 * MIB),
            ev(0.001, Action::Alloc, SEG, MIB),
            ev(0.002, Action::Alloc, SEG + 2 * MIB, 4 * MIB),
            ev(0.003, Action::FreeCompleted, SEG, MIB),
            ev(0.004, Action::Oom, 0, 1 << 40),
            ev(0.005, Action::SegmentAlloc, SEG + 64 * MIB, 2 * MIB),
            ev(0.006, Action::Alloc, SEG + 64 * MIB, 512),
            ev(0.007, Action::SegmentFree, 0x1234, MIB),
        ];
        Timeline {
            title: "scripted".into(),
            devices: vec![DeviceTimeline {
                device: 1,
                total_memory: Some(1 << 30),
                samples: Vec::new(),
                events,
            }],
            marks: Vec::new(),
        }
    }

    #[test]
    fn round_trip_keys_actions_and_segments() {
        let bytes = torch_snapshot_bytes(&scripted()).unwrap();
        // Protocol 3, as Python 3 and the viewer's unpickler read.
        assert_eq!(&bytes[..2], b"\x80\x03");
        let v = load(&bytes);
        let traces = list(get(&v, "device_traces"));
        assert_eq!(traces.len(), 2, "one list per device 0..=1");
        assert!(list(&traces[0]).is_empty());
        let trace = list(&traces[1]);
        let got: Vec<&str> = trace.iter().map(|e| str_of(get(e, "action"))).collect();
        assert_eq!(
            got,
            [
                "segment_alloc",
                "alloc",
                "alloc",
                "free_requested",
                "free_completed",
                "oom",
                "segment_alloc",
                "alloc"
            ]
        );
        for e in trace {
            for key in ["addr", "size", "stream", "time_us"] {
                int_of(get(e, key));
            }
            assert!(list(get(e, "frames")).is_empty());
        }
        assert_eq!(int_of(get(&trace[1], "addr")), SEG as i64);
        assert_eq!(int_of(get(&trace[2], "time_us")), 2000);
        let oom = &trace[5];
        assert_eq!(int_of(get(oom, "size")), 1 << 40);
        assert_eq!(int_of(get(oom, "device_free")), (1 << 30) - 64 * MIB as i64);

        let segments = list(get(&v, "segments"));
        assert_eq!(segments.len(), 2);
        let large = &segments[0];
        assert_eq!(int_of(get(large, "device")), 1);
        assert_eq!(int_of(get(large, "address")), SEG as i64);
        assert_eq!(int_of(get(large, "total_size")), 64 * MIB as i64);
        assert_eq!(int_of(get(large, "allocated_size")), 4 * MIB as i64);
        assert_eq!(str_of(get(large, "segment_type")), "large");
        assert_eq!(get(large, "is_expandable"), &Value::Bool(false));
        assert_eq!(
            get(large, "segment_pool_id"),
            &Value::Tuple(vec![Value::I64(0), Value::I64(0)])
        );
        let blocks = list(get(large, "blocks"));
        let shape: Vec<(i64, i64, &str)> = blocks
            .iter()
            .map(|b| {
                (
                    int_of(get(b, "address")),
                    int_of(get(b, "size")),
                    str_of(get(b, "state")),
                )
            })
            .collect();
        let s = SEG as i64;
        let m = MIB as i64;
        assert_eq!(
            shape,
            [
                (s, 2 * m, "inactive"),
                (s + 2 * m, 4 * m, "active_allocated"),
                (s + 6 * m, 58 * m, "inactive"),
            ]
        );
        let small = &segments[1];
        assert_eq!(str_of(get(small, "segment_type")), "small");
        let blocks = list(get(small, "blocks"));
        assert_eq!(blocks.len(), 2);
        assert_eq!(int_of(get(&blocks[0], "size")), 512);
        assert_eq!(int_of(get(&blocks[0], "requested_size")), 512);
        assert_eq!(str_of(get(&blocks[1], "state")), "inactive");
        // Blocks tile each segment (the viewer adds up their sizes).
        for seg in segments {
            let total: i64 = list(get(seg, "blocks"))
                .iter()
                .map(|b| int_of(get(b, "size")))
                .sum();
            assert_eq!(total, int_of(get(seg, "total_size")));
        }
    }

    #[test]
    fn blocks_outside_recorded_segments_get_one() {
        let t = Timeline {
            title: String::new(),
            devices: vec![DeviceTimeline {
                device: 0,
                total_memory: None,
                samples: Vec::new(),
                events: vec![
                    ev(0.0, Action::Alloc, 0x1000, 0x100),
                    ev(0.1, Action::Alloc, 0x1100, 0x100),
                    ev(0.2, Action::FreeCompleted, 0x9000, 0x100),
                    ev(0.3, Action::FreeCompleted, 0x1000, 0x100),
                ],
            }],
            marks: Vec::new(),
        };
        let v = load(&torch_snapshot_bytes(&t).unwrap());
        let segments = list(get(&v, "segments"));
        let addrs: Vec<(i64, i64)> = segments
            .iter()
            .map(|s| (int_of(get(s, "address")), int_of(get(s, "total_size"))))
            .collect();
        assert_eq!(addrs, [(0x1000, 0x200), (0x9000, 0x100)]);
        let blocks = list(get(&segments[0], "blocks"));
        let states: Vec<&str> = blocks.iter().map(|b| str_of(get(b, "state"))).collect();
        assert_eq!(states, ["inactive", "active_allocated"]);
    }

    /// (action, addr, size) of each entry of device `d`'s trace.
    fn trace_of(v: &Value, d: usize) -> Vec<(String, i64, i64)> {
        list(&list(get(v, "device_traces"))[d])
            .iter()
            .map(|e| {
                (
                    str_of(get(e, "action")).to_string(),
                    int_of(get(e, "addr")),
                    int_of(get(e, "size")),
                )
            })
            .collect()
    }

    #[test]
    fn a_ring_keeps_the_last_entries_whole_frees_and_the_final_segments() {
        // A segment, blocks in it and outside it, churned; then an out-of-memory error.
        let mut events = vec![ev(0.0, Action::SegmentAlloc, SEG, 64 * MIB)];
        for i in 0..500u64 {
            let inside = SEG + (i % 8) * MIB;
            let outside = 0x1000 + (i % 4) * 0x100;
            events.push(ev(i as f64, Action::Alloc, inside, MIB));
            events.push(ev(i as f64, Action::Alloc, outside, 0x100));
            if i % 8 == 7 {
                for j in 0..8 {
                    events.push(ev(i as f64, Action::FreeCompleted, SEG + j * MIB, MIB));
                }
            }
            if i % 4 == 3 {
                for j in 0..4 {
                    events.push(ev(i as f64, Action::FreeCompleted, 0x1000 + j * 0x100, 0));
                }
            }
        }
        // A free of a block allocated before the trace, outside every segment.
        events.push(ev(600.0, Action::FreeCompleted, 0x9000, 0x100));
        events.push(ev(601.0, Action::Oom, 0, 1 << 40));
        let mut all = TorchTrace::new(0, Some(1 << 30), None);
        all.expect_segments();
        for e in &events {
            all.push(e);
        }
        let whole = load(&torch_snapshot_of(&[all]).unwrap());
        let full = trace_of(&whole, 0);
        for max in [1, 2, 3, 50, 999, full.len(), full.len() + 10] {
            let mut ring = TorchTrace::new(0, Some(1 << 30), Some(max));
            for e in &events {
                ring.push(e);
            }
            assert!(ring.entries() <= max, "{max}");
            assert!(
                ring.entries() + 1 >= max.min(full.len()),
                "{max}: a free is kept whole"
            );
            assert_eq!(
                ring.entries() as u64 + ring.dropped_entries(),
                full.len() as u64
            );
            let v = load(&torch_snapshot_of(&[ring]).unwrap());
            let tail = trace_of(&v, 0);
            assert_eq!(tail[..], full[full.len() - tail.len()..], "{max}");
            assert_ne!(tail.first().map(|e| e.0.as_str()), Some("free_completed"));
            // The out-of-memory entry counts the segment as reserved, in any case.
            let oom = list(&list(get(&v, "device_traces"))[0])
                .last()
                .cloned()
                .unwrap();
            assert_eq!(
                int_of(get(&oom, "device_free")),
                (1 << 30) - 64 * MIB as i64
            );
            // The segments live at the end: the recorded one; the synthetic ones cover the
            // blocks outside it that the kept entries name.
            let segments = list(get(&v, "segments"));
            assert!(
                segments
                    .iter()
                    .any(|s| int_of(get(s, "address")) == SEG as i64)
            );
            let synthetic: Vec<(i64, i64)> = segments
                .iter()
                .map(|s| (int_of(get(s, "address")), int_of(get(s, "total_size"))))
                .filter(|&(a, _)| a != SEG as i64)
                .collect();
            let named = |addr: i64| tail.iter().any(|e| e.1 == addr && e.0 != "oom");
            if named(0x9000) {
                assert!(synthetic.contains(&(0x9000, 0x100)), "{max}: {synthetic:?}");
            } else {
                assert!(!synthetic.iter().any(|&(a, _)| a == 0x9000), "{max}");
            }
            if max >= 50 {
                assert_eq!(synthetic, [(0x1000, 0x400), (0x9000, 0x100)], "{max}");
            }
        }
    }

    #[test]
    fn empty_timeline_and_write_errors() {
        let v = load(&torch_snapshot_bytes(&Timeline::default()).unwrap());
        assert!(list(get(&v, "segments")).is_empty());
        assert!(list(get(&v, "device_traces")).is_empty());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing").join("t.pickle");
        let e = write_torch_snapshot(&scripted(), &path).unwrap_err();
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        let ok = dir.path().join("t.pickle");
        write_torch_snapshot(&scripted(), &ok).unwrap();
        load(&std::fs::read(ok).unwrap());
    }
}
