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

mod format;
#[cfg(test)]
mod tests;
mod trace;

use std::path::Path;

use serde::Serialize;
use serde::ser::SerializeSeq;

use self::format::Segment;
pub use self::trace::TorchTrace;
use super::{Action, DeviceTimeline, Timeline, TimelineError};

/// Trace entries a snapshot of `rmm replay` keeps by default (`--torch-trace-entries`): the
/// last ones, as PyTorch's `_record_memory_history(max_entries=N)` does.
pub const DEFAULT_TRACE_ENTRIES: usize = 100_000;

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
/// module documentation), for `torch.cuda._memory_viz` or <https://pytorch.org/memory_viz>,
/// whole or not at all ([`AtomicFile`](crate::atomic_file::AtomicFile)).
///
/// # Errors
/// As [`torch_snapshot_bytes`]; [`TimelineError::Write`] when `path` cannot be written (it is
/// then as it was).
pub fn write_torch_snapshot(timeline: &Timeline, path: &Path) -> Result<(), TimelineError> {
    let bytes = torch_snapshot_bytes(timeline)?;
    crate::atomic_file::AtomicFile::create(path)
        .and_then(|f| f.commit(&bytes))
        .map_err(|source| TimelineError::Write {
            what: "PyTorch memory snapshot",
            path: path.to_path_buf(),
            source,
        })
}
