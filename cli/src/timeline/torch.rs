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
//! The viewer needs every block it draws to lie in a segment. Blocks that no recorded segment
//! holds (e.g. from a pool's initial chunk, which no hook reports, or a resource without a
//! pool) get synthetic segments covering them, present for the whole trace; a `SegmentFree` of
//! a segment that is not live is left out of the trace. Integers are written as signed 64-bit
//! (the viewer's unpickler reads no longer ones), with pickle protocol 3.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use super::{Action, DeviceTimeline, Timeline, TimelineError};

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
struct Snapshot {
    segments: Vec<Segment>,
    device_traces: Vec<Vec<TraceEntry>>,
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

/// One device's trace and final segments.
fn device_snapshot(d: &DeviceTimeline) -> Result<(Vec<TraceEntry>, Vec<Segment>), TimelineError> {
    let mut trace = Vec::with_capacity(d.events.len() + d.events.len() / 2);
    let mut segments = Ranges::new();
    let mut blocks = Ranges::new();
    let has_segments = d
        .events
        .iter()
        .any(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentFree));
    // Ranges of blocks that no recorded segment held while they were live.
    let mut orphans: Vec<(u64, u64)> = Vec::new();
    let entry = |action, addr, size, stream, t, device_free| -> Result<_, TimelineError> {
        Ok(TraceEntry {
            action,
            addr: int("addr", addr)?,
            size: int("size", size)?,
            stream: int("stream", stream)?,
            time_us: time_us(t),
            frames: Vec::new(),
            device_free,
        })
    };
    for e in &d.events {
        match e.action {
            Action::Alloc => {
                if !inside(&segments, e.addr, e.size) {
                    orphans.push((e.addr, e.addr.saturating_add(e.size)));
                }
                blocks.insert(e.addr, (e.size, e.stream));
                trace.push(entry("alloc", e.addr, e.size, e.stream, e.t, None)?);
            }
            Action::FreeCompleted => {
                let live = blocks.remove(&e.addr);
                let size = live.map_or(e.size, |(s, _)| s);
                if live.is_none() && !inside(&segments, e.addr, size) {
                    // Allocated before the trace began, outside any known segment.
                    orphans.push((e.addr, e.addr.saturating_add(size)));
                }
                for action in ["free_requested", "free_completed"] {
                    trace.push(entry(action, e.addr, size, e.stream, e.t, None)?);
                }
            }
            Action::SegmentAlloc => {
                segments.insert(e.addr, (e.size, e.stream));
                trace.push(entry("segment_alloc", e.addr, e.size, e.stream, e.t, None)?);
            }
            Action::SegmentFree => {
                let Some((size, _)) = segments.remove(&e.addr) else {
                    continue;
                };
                trace.push(entry("segment_free", e.addr, size, e.stream, e.t, None)?);
            }
            Action::Oom => {
                let reserved: u64 = if has_segments {
                    segments.values().map(|&(s, _)| s).sum()
                } else {
                    blocks.values().map(|&(s, _)| s).sum()
                };
                let free = d.total_memory.map_or(0, |t| t.saturating_sub(reserved));
                let free = int("device_free", free)?;
                let mut oom = entry("oom", 0, e.size, e.stream, e.t, Some(free))?;
                // PyTorch puts the device's free bytes in `addr` too.
                oom.addr = free;
                trace.push(oom);
            }
        }
    }
    // Blocks live at the end outside every live segment are orphans too.
    for (&a, &(s, _)) in &blocks {
        if !inside(&segments, a, s) {
            orphans.push((a, a.saturating_add(s)));
        }
    }
    let mut all: Vec<(u64, u64, u64)> = segments
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
        for (&a, &(s, _)) in blocks.range(addr..end) {
            let b_end = a.saturating_add(s);
            if a < cursor || b_end > end || placed.contains_key(&a) {
                // Overlapping or straddling (inconsistent events), or in an earlier segment.
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
            device: i64::from(d.device),
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
    Ok((trace, out))
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

/// The PyTorch memory snapshot of `timeline` (see the module documentation) as pickle bytes.
///
/// # Errors
/// [`TimelineError::OutOfRange`] when a value does not fit the snapshot's fields;
/// [`TimelineError::Encode`] when pickling fails.
pub fn torch_snapshot_bytes(timeline: &Timeline) -> Result<Vec<u8>, TimelineError> {
    let max_device = timeline.devices.iter().map(|d| d.device).max();
    let count = max_device.map_or(0, |m| m as usize + 1);
    let mut snapshot = Snapshot {
        segments: Vec::new(),
        device_traces: (0..count).map(|_| Vec::new()).collect(),
    };
    for d in &timeline.devices {
        let (trace, segments) = device_snapshot(d)?;
        // Two entries for one device: their traces follow each other.
        snapshot.device_traces[d.device as usize].extend(trace);
        snapshot.segments.extend(segments);
    }
    serde_pickle::to_vec(&snapshot, serde_pickle::SerOptions::new())
        .map_err(|e| TimelineError::Encode(e.to_string()))
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
