//! The pickle's records: the dicts a PyTorch memory snapshot holds (segments, blocks, trace
//! entries, frames), with the conversions of this crate's values into the snapshot's signed
//! 64-bit integers.

use serde::Serialize;

use super::super::TimelineError;

/// Segments up to this size are PyTorch's "small" pool.
pub(super) const SMALL_SEGMENT: u64 = 2 << 20;

/// A stack frame (always empty lists here: no call stacks are recorded).
#[derive(Debug, Serialize)]
pub(super) struct Frame {
    pub(super) filename: String,
    pub(super) line: i64,
    pub(super) name: String,
}

#[derive(Debug, Serialize)]
pub(super) struct Segment {
    pub(super) device: i64,
    pub(super) address: i64,
    pub(super) total_size: i64,
    pub(super) allocated_size: i64,
    pub(super) active_size: i64,
    pub(super) requested_size: i64,
    pub(super) stream: i64,
    pub(super) segment_type: &'static str,
    pub(super) segment_pool_id: (i64, i64),
    pub(super) is_expandable: bool,
    pub(super) frames: Vec<Frame>,
    pub(super) blocks: Vec<Block>,
}

#[derive(Debug, Serialize)]
pub(super) struct Block {
    pub(super) address: i64,
    pub(super) size: i64,
    pub(super) requested_size: i64,
    pub(super) state: &'static str,
    pub(super) frames: Vec<Frame>,
}

#[derive(Debug, Serialize)]
pub(super) struct TraceEntry {
    pub(super) action: &'static str,
    pub(super) addr: i64,
    pub(super) size: i64,
    pub(super) stream: i64,
    pub(super) time_us: i64,
    pub(super) frames: Vec<Frame>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) device_free: Option<i64>,
}

/// `value` as the snapshot's signed integer, or the error naming `field`.
pub(super) fn int(field: &'static str, value: u64) -> Result<i64, TimelineError> {
    i64::try_from(value).map_err(|_| TimelineError::OutOfRange { field, value })
}

/// Seconds as the snapshot's microseconds (0 for a time that is not finite).
pub(super) fn time_us(t: f64) -> i64 {
    if t.is_finite() {
        // Saturating float-to-int conversion.
        (t * 1e6).round() as i64
    } else {
        0
    }
}

/// A gap between live blocks of a segment.
pub(super) fn inactive(addr: u64, size: u64) -> Result<Block, TimelineError> {
    Ok(Block {
        address: int("address", addr)?,
        size: int("size", size)?,
        requested_size: 0,
        state: "inactive",
        frames: Vec::new(),
    })
}
