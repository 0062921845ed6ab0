//! Memory over time, per device: what `rmm demo --plot` and `rmm replay --plot` draw (SVG or
//! PNG), and what `--torch-snapshot` writes as a PyTorch memory snapshot.
//!
//! A [`Timeline`] holds, per device, samples of bytes in use and reserved (and of spilled bytes
//! in pinned host memory and on disk), the allocator's
//! events (block allocations and frees, segments taken from and given back to the device,
//! out-of-memory errors) when they were recorded, and marks (phases, spills, reinitializes).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

mod downsample;
pub mod font;
mod format;
pub mod labels;
pub mod png;
mod recorder;
mod svg;
mod torch;

pub use downsample::{Downsampler, EXACT_EVENTS, MAX_BINS, sort_for_drawing};
pub use format::PlotFormat;
pub use recorder::{EventSink, Recorder};
pub use svg::{Layout, render, render_svg, render_svg_with_layout, write_plot};
pub use torch::{
    DEFAULT_TRACE_ENTRIES, TorchTrace, torch_snapshot_bytes, torch_snapshot_of,
    write_torch_snapshot,
};

/// What can go wrong rendering or writing a timeline.
#[derive(Debug, thiserror::Error)]
pub enum TimelineError {
    /// Plotters could not draw the plot (a bug, or a figure it cannot lay out).
    #[error(
        "drawing the memory plot failed: {0}; this is a bug in rmm-rs's plotting, please report \
         it with the command that produced it"
    )]
    Render(String),
    /// The PyTorch snapshot could not be encoded as a pickle.
    #[error(
        "encoding the PyTorch memory snapshot failed: {0}; this is a bug in rmm-rs's snapshot \
         writer, please report it with the command that produced it"
    )]
    Encode(String),
    /// A number does not fit the 64-bit signed integers PyTorch's memory viewer reads.
    #[error(
        "the PyTorch memory snapshot cannot hold {field} = {value}: PyTorch's memory viewer \
         reads integers as signed 64-bit; such a value is not a real device address or size"
    )]
    OutOfRange {
        /// Which field (e.g. `"addr"`).
        field: &'static str,
        /// The value.
        value: u64,
    },
    /// Writing the output file failed.
    #[error(
        "writing the {what} to {} failed: {source}; check that the directory exists and is \
         writable, or choose another path",
        path.display()
    )]
    Write {
        /// What was being written (e.g. `"SVG plot"`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl Timeline {
    /// Earliest and latest time of any sample, event or mark (`None` when there are none).
    pub fn time_range(&self) -> Option<(f64, f64)> {
        let times = self
            .devices
            .iter()
            .flat_map(|d| {
                d.samples
                    .iter()
                    .map(|s| s.t)
                    .chain(d.events.iter().map(|e| e.t))
            })
            .chain(self.marks.iter().map(|m| m.t))
            .filter(|t| t.is_finite());
        times.fold(None, |acc, t| match acc {
            None => Some((t, t)),
            Some((lo, hi)) => Some((f64::min(lo, t), f64::max(hi, t))),
        })
    }

    /// The marks that belong on `device`'s panel: its own and those of the whole run.
    pub fn marks_for(&self, device: u32) -> impl Iterator<Item = &Mark> {
        self.marks
            .iter()
            .filter(move |m| m.device.is_none_or(|d| d == device))
    }
}

impl DeviceTimeline {
    /// The samples, or samples derived from the events ([`samples_from_events`]) when there
    /// are none.
    pub fn effective_samples(&self) -> Vec<Sample> {
        if self.samples.is_empty() {
            samples_from_events(&self.events)
        } else {
            self.samples.clone()
        }
    }
}

/// Samples of bytes in use and reserved after each event, from allocator events.
///
/// `in_use` is the sum of the live blocks (`Alloc` not yet `FreeCompleted`); `reserved` is the
/// sum of the live segments (`SegmentAlloc` not yet `SegmentFree`), or `in_use` when the events
/// hold no segment event at all (a resource without a pool). A free of a block (or segment)
/// that is not live changes nothing; `Oom` events make no sample.
pub fn samples_from_events(events: &[MemoryEvent]) -> Vec<Sample> {
    let has_segments = events
        .iter()
        .any(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentFree));
    let mut blocks: BTreeMap<u64, u64> = BTreeMap::new();
    let mut segments: BTreeMap<u64, u64> = BTreeMap::new();
    let (mut in_use, mut reserved) = (0u64, 0u64);
    let mut out = Vec::with_capacity(events.len());
    for e in events {
        match e.action {
            Action::Alloc => {
                if let Some(old) = blocks.insert(e.addr, e.size) {
                    in_use = in_use.saturating_sub(old);
                }
                in_use = in_use.saturating_add(e.size);
            }
            Action::FreeCompleted => {
                if let Some(old) = blocks.remove(&e.addr) {
                    in_use = in_use.saturating_sub(old);
                }
            }
            Action::SegmentAlloc => {
                if let Some(old) = segments.insert(e.addr, e.size) {
                    reserved = reserved.saturating_sub(old);
                }
                reserved = reserved.saturating_add(e.size);
            }
            Action::SegmentFree => {
                if let Some(old) = segments.remove(&e.addr) {
                    reserved = reserved.saturating_sub(old);
                }
            }
            Action::Oom => continue,
        }
        out.push(Sample {
            t: e.t,
            in_use,
            reserved: if has_segments { reserved } else { in_use },
            ..Sample::default()
        });
    }
    out
}

/// Memory over time for every device of a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Timeline {
    /// What ran, for titles (e.g. `"rmm demo --size small"`).
    pub title: String,
    /// One entry per device, in device order.
    pub devices: Vec<DeviceTimeline>,
    /// Marks across the run (`device: None`) or on one device.
    pub marks: Vec<Mark>,
}

/// One device's series.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DeviceTimeline {
    /// The device ordinal.
    pub device: u32,
    /// Total memory of the device, when known (drawn as a limit line).
    pub total_memory: Option<u64>,
    /// Samples in time order.
    pub samples: Vec<Sample>,
    /// Allocator events in time order (empty when none were recorded).
    pub events: Vec<MemoryEvent>,
}

/// Bytes at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Sample {
    /// Seconds since the start of the run.
    pub t: f64,
    /// Bytes allocated and not yet freed (the statistics adaptor's current bytes).
    pub in_use: u64,
    /// Bytes held from the device (the pool's size, or `in_use` without a pool).
    pub reserved: u64,
    /// Bytes of this device's spilled data in pinned host memory.
    pub host: u64,
    /// Bytes of this device's spilled data in spill files on disk.
    pub disk: u64,
}

/// What a mark marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MarkKind {
    /// A phase of the workload began (label: its name).
    Phase,
    /// Data moved off the device (label: bytes).
    Spill,
    /// Data came back to the device.
    Unspill,
    /// The runtime was reinitialized.
    Reinitialize,
    /// An allocation failed for lack of memory.
    OutOfMemory,
}

/// A labelled moment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Mark {
    /// Seconds since the start of the run.
    pub t: f64,
    /// The device, or `None` for the whole run.
    pub device: Option<u32>,
    /// What happened.
    pub kind: MarkKind,
    /// A short label (e.g. `"pooled"`, `"12.0 MiB"`).
    pub label: String,
}

/// PyTorch's trace actions (`torch.cuda.memory._snapshot()["device_traces"]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// A block was handed out.
    Alloc,
    /// A block was given back (and is free for reuse).
    FreeCompleted,
    /// A segment was taken from the device.
    SegmentAlloc,
    /// A segment was given back to the device.
    SegmentFree,
    /// An allocation failed for lack of memory (`size` is the request).
    Oom,
}

/// One allocator event.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MemoryEvent {
    /// Seconds since the start of the run.
    pub t: f64,
    /// What happened.
    pub action: Action,
    /// Device address (0 for `Oom`).
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// The stream's raw handle (0: the default stream).
    pub stream: u64,
}

#[cfg(test)]
impl MemoryEvent {
    /// An event on the default stream (the tests' shorthand).
    pub(crate) fn at(t: f64, action: Action, addr: u64, size: u64) -> Self {
        MemoryEvent {
            t,
            action,
            addr,
            size,
            stream: 0,
        }
    }
}
