//! [`Downsampler`]: the samples of bytes in use and reserved that [`samples_from_events`]
//! derives from allocator events, built as the events arrive, in memory that does not grow
//! with their number.
//!
//! Up to a limit (by default [`EXACT_EVENTS`]) the events are kept: at the end they are put in
//! time order (at one moment a segment is taken before the blocks it serves and given back
//! after them) and the samples are exactly [`samples_from_events`]'s, one per event. Past it,
//! the kept events are played in that order and dropped, and every later event updates the
//! bytes in use and reserved as it comes: the samples go into time bins of equal width from
//! the first event's time, at most [`MAX_BINS`] of them; when an event lies beyond the last
//! bin, the width doubles and neighbouring bins merge. A bin keeps its first and last sample
//! and those with the least and most bytes in use and reserved, so the picture keeps every
//! peak and trough and the steps between bins.

use std::collections::BTreeMap;

use super::{Action, MemoryEvent, Sample, samples_from_events};

/// Events kept (and drawn one sample each) before the [`Downsampler`] bins them.
pub const EXACT_EVENTS: usize = 20_000;

/// The most time bins a [`Downsampler`] keeps (each gives at most six samples).
pub const MAX_BINS: usize = 2_048;

/// The order events are drawn in: by time; at one moment the pool grows before it serves and
/// shrinks after.
fn rank(a: Action) -> u8 {
    match a {
        Action::SegmentAlloc => 0,
        Action::SegmentFree => 2,
        _ => 1,
    }
}

/// Sorts `events` in drawing order (stable: events of one moment and rank keep their order).
pub fn sort_for_drawing(events: &mut [MemoryEvent]) {
    events.sort_by(|a, b| {
        a.t.total_cmp(&b.t)
            .then(rank(a.action).cmp(&rank(b.action)))
    });
}

/// A sample and when it arrived (ties in time keep arrival order).
#[derive(Debug, Clone, Copy)]
struct Point {
    seq: u64,
    sample: Sample,
}

impl Point {
    /// Time order, then arrival order.
    fn cmp(&self, other: &Point) -> std::cmp::Ordering {
        self.sample
            .t
            .total_cmp(&other.sample.t)
            .then(self.seq.cmp(&other.seq))
    }

    fn before(&self, other: &Point) -> bool {
        self.cmp(other).is_lt()
    }
}

/// One time bin: its first and last samples, and its extremes.
#[derive(Debug, Clone, Copy)]
struct Bin {
    first: Point,
    last: Point,
    most_in_use: Point,
    least_in_use: Point,
    most_reserved: Point,
    least_reserved: Point,
}

impl Bin {
    fn new(p: Point) -> Bin {
        Bin {
            first: p,
            last: p,
            most_in_use: p,
            least_in_use: p,
            most_reserved: p,
            least_reserved: p,
        }
    }

    /// Adds `p` (the earlier point wins ties of value).
    fn add(&mut self, p: Point) {
        self.merge(&Bin::new(p));
    }

    fn merge(&mut self, o: &Bin) {
        if o.first.before(&self.first) {
            self.first = o.first;
        }
        if self.last.before(&o.last) {
            self.last = o.last;
        }
        keep(&mut self.most_in_use, o.most_in_use, |s| s.in_use, true);
        keep(&mut self.least_in_use, o.least_in_use, |s| s.in_use, false);
        keep(
            &mut self.most_reserved,
            o.most_reserved,
            |s| s.reserved,
            true,
        );
        keep(
            &mut self.least_reserved,
            o.least_reserved,
            |s| s.reserved,
            false,
        );
    }

    fn points(&self) -> [Point; 6] {
        [
            self.first,
            self.last,
            self.most_in_use,
            self.least_in_use,
            self.most_reserved,
            self.least_reserved,
        ]
    }
}

/// Replaces `mine` by `theirs` when its `value` is larger (`most`) or smaller, or equal and
/// earlier.
fn keep(mine: &mut Point, theirs: Point, value: fn(&Sample) -> u64, most: bool) {
    let (a, b) = (value(&mine.sample), value(&theirs.sample));
    let better = if most { b > a } else { b < a };
    if better || (a == b && theirs.before(mine)) {
        *mine = theirs;
    }
}

/// The bytes in use and reserved after the events so far (as [`samples_from_events`] counts
/// them); `reserved` here is the live segments' bytes whether or not there are any.
#[derive(Debug, Default)]
struct Bytes {
    blocks: BTreeMap<u64, u64>,
    segments: BTreeMap<u64, u64>,
    in_use: u64,
    reserved: u64,
}

impl Bytes {
    fn apply(&mut self, e: &MemoryEvent) {
        match e.action {
            Action::Alloc => {
                if let Some(old) = self.blocks.insert(e.addr, e.size) {
                    self.in_use = self.in_use.saturating_sub(old);
                }
                self.in_use = self.in_use.saturating_add(e.size);
            }
            Action::FreeCompleted => {
                if let Some(old) = self.blocks.remove(&e.addr) {
                    self.in_use = self.in_use.saturating_sub(old);
                }
            }
            Action::SegmentAlloc => {
                if let Some(old) = self.segments.insert(e.addr, e.size) {
                    self.reserved = self.reserved.saturating_sub(old);
                }
                self.reserved = self.reserved.saturating_add(e.size);
            }
            Action::SegmentFree => {
                if let Some(old) = self.segments.remove(&e.addr) {
                    self.reserved = self.reserved.saturating_sub(old);
                }
            }
            Action::Oom => {}
        }
    }
}

/// The samples past the exact limit: the bytes now and the time bins.
#[derive(Debug)]
struct Binned {
    bytes: Bytes,
    origin: f64,
    width: f64,
    bins: Vec<Option<Bin>>,
}

impl Binned {
    fn add(&mut self, p: Point, max_bins: usize) {
        let t = p.sample.t;
        if !t.is_finite() {
            // Not drawn (the picture skips such samples too).
            return;
        }
        let mut index = ((t - self.origin).max(0.0) / self.width) as usize;
        while index >= max_bins {
            // Twice as wide: bins 2i and 2i + 1 become bin i.
            let old = std::mem::replace(&mut self.bins, vec![None; max_bins]);
            for (i, bin) in old.into_iter().enumerate() {
                if let Some(bin) = bin {
                    match &mut self.bins[i / 2] {
                        Some(merged) => merged.merge(&bin),
                        slot @ None => *slot = Some(bin),
                    }
                }
            }
            self.width *= 2.0;
            index = ((t - self.origin).max(0.0) / self.width) as usize;
        }
        match &mut self.bins[index] {
            Some(bin) => bin.add(p),
            slot @ None => *slot = Some(Bin::new(p)),
        }
    }
}

/// Samples of bytes in use and reserved from events as they arrive, in bounded memory (see
/// the module documentation).
///
/// ```
/// use rmm_cli::timeline::{Action, Downsampler, MemoryEvent};
///
/// let mut d = Downsampler::new();
/// for i in 0..100_000u64 {
///     let t = i as f64 * 1e-6;
///     d.push(MemoryEvent { t, action: Action::Alloc, addr: 0x1000, size: 256, stream: 0 });
///     d.push(MemoryEvent { t, action: Action::FreeCompleted, addr: 0x1000, size: 256, stream: 0 });
/// }
/// let (samples, events) = d.finish();
/// assert!(samples.len() <= 6 * rmm_cli::timeline::MAX_BINS);
/// assert!(events.is_empty(), "binned: the events were not kept");
/// assert_eq!(samples.iter().map(|s| s.in_use).max(), Some(256));
/// ```
#[derive(Debug)]
pub struct Downsampler {
    exact_limit: usize,
    max_bins: usize,
    /// The events while there are at most `exact_limit`.
    kept: Vec<MemoryEvent>,
    binned: Option<Binned>,
    seq: u64,
    has_segments: bool,
    events: u64,
}

impl Default for Downsampler {
    fn default() -> Self {
        Downsampler::new()
    }
}

impl Downsampler {
    /// A downsampler that keeps up to [`EXACT_EVENTS`] events and then [`MAX_BINS`] bins.
    pub fn new() -> Self {
        Downsampler::with_limits(EXACT_EVENTS, MAX_BINS)
    }

    /// A downsampler that keeps up to `exact_events` events and then `max_bins` bins (at
    /// least one).
    pub fn with_limits(exact_events: usize, max_bins: usize) -> Self {
        Downsampler {
            exact_limit: exact_events,
            max_bins: max_bins.max(1),
            kept: Vec::new(),
            binned: None,
            seq: 0,
            has_segments: false,
            events: 0,
        }
    }

    /// Events pushed so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// True once the events are binned (more than the exact limit arrived).
    pub fn is_binned(&self) -> bool {
        self.binned.is_some()
    }

    /// Adds the next event.
    pub fn push(&mut self, e: MemoryEvent) {
        self.events += 1;
        if matches!(e.action, Action::SegmentAlloc | Action::SegmentFree) {
            self.has_segments = true;
        }
        if self.binned.is_none() {
            self.kept.push(e);
            if self.kept.len() <= self.exact_limit {
                return;
            }
            let mut kept = std::mem::take(&mut self.kept);
            sort_for_drawing(&mut kept);
            let origin = kept
                .iter()
                .map(|e| e.t)
                .filter(|t| t.is_finite())
                .fold(f64::INFINITY, f64::min);
            self.binned = Some(Binned {
                bytes: Bytes::default(),
                origin: if origin.is_finite() { origin } else { 0.0 },
                width: 1e-9,
                bins: vec![None; self.max_bins],
            });
            for e in &kept {
                self.play(e);
            }
            return;
        }
        self.play(&e);
    }

    /// Applies `e` to the bytes and bins the sample after it (an `Oom` too: it changes
    /// nothing but belongs on the time axis).
    fn play(&mut self, e: &MemoryEvent) {
        let Some(b) = &mut self.binned else {
            return;
        };
        b.bytes.apply(e);
        let p = Point {
            seq: self.seq,
            sample: Sample {
                t: e.t,
                in_use: b.bytes.in_use,
                reserved: b.bytes.reserved,
                ..Sample::default()
            },
        };
        self.seq += 1;
        b.add(p, self.max_bins);
    }

    /// The samples, in time order, and the events when they were kept (under the exact
    /// limit: in drawing order, as [`sort_for_drawing`] leaves them), else none. As
    /// [`samples_from_events`], the bytes reserved are the bytes in use when no segment event
    /// came.
    pub fn finish(self) -> (Vec<Sample>, Vec<MemoryEvent>) {
        let Some(b) = self.binned else {
            let mut events = self.kept;
            sort_for_drawing(&mut events);
            return (samples_from_events(&events), events);
        };
        let mut points: Vec<Point> = b.bins.iter().flatten().flat_map(Bin::points).collect();
        points.sort_by(Point::cmp);
        points.dedup_by_key(|p| p.seq);
        let samples = points
            .into_iter()
            .map(|p| Sample {
                reserved: if self.has_segments {
                    p.sample.reserved
                } else {
                    p.sample.in_use
                },
                ..p.sample
            })
            .collect();
        (samples, Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_the_limit_the_samples_are_exact_and_in_drawing_order() {
        let events = [
            MemoryEvent::at(2.0, Action::Alloc, 0x100, 10),
            MemoryEvent::at(1.0, Action::Alloc, 0x200, 20),
            MemoryEvent::at(2.0, Action::SegmentAlloc, 0x0, 1000),
            MemoryEvent::at(2.0, Action::SegmentFree, 0x5000, 1000),
            MemoryEvent::at(3.0, Action::Oom, 0, 1 << 40),
            MemoryEvent::at(4.0, Action::FreeCompleted, 0x100, 10),
        ];
        let mut d = Downsampler::with_limits(events.len(), 4);
        for e in events {
            d.push(e);
        }
        assert!(!d.is_binned());
        let (samples, kept) = d.finish();
        let mut sorted = events.to_vec();
        sort_for_drawing(&mut sorted);
        assert_eq!(kept, sorted);
        assert_eq!(samples, samples_from_events(&sorted));
        let actions: Vec<Action> = kept.iter().map(|e| e.action).collect();
        assert_eq!(
            actions,
            [
                Action::Alloc,
                Action::SegmentAlloc,
                Action::Alloc,
                Action::SegmentFree,
                Action::Oom,
                Action::FreeCompleted
            ]
        );
    }

    #[test]
    fn past_the_limit_memory_is_bounded_and_peaks_and_steps_are_kept() {
        let bins = 16;
        let mut d = Downsampler::with_limits(100, bins);
        d.push(MemoryEvent::at(0.0, Action::SegmentAlloc, 0, 1 << 30));
        // The bytes in use after each event, as the events are pushed.
        let mut live = std::collections::HashMap::new();
        let (mut in_use, mut peak) = (0u64, 0u64);
        let mut push = |d: &mut Downsampler, e: MemoryEvent| {
            match e.action {
                Action::Alloc => {
                    live.insert(e.addr, e.size);
                    in_use += e.size;
                }
                _ => in_use -= live.remove(&e.addr).unwrap_or(0),
            }
            peak = peak.max(in_use);
            d.push(e);
        };
        // A sawtooth: up to 50 blocks of 256 B live, then all freed, repeated; one block of
        // 1 MiB among them.
        for i in 0..100_000u64 {
            let t = i as f64 * 1e-3;
            let slot = i % 50;
            if slot == 0 {
                for a in 0..50 {
                    push(
                        &mut d,
                        MemoryEvent::at(t, Action::FreeCompleted, 0x1000 + a * 0x100, 256),
                    );
                }
            }
            let size = if i == 77_777 { 1 << 20 } else { 256 };
            push(
                &mut d,
                MemoryEvent::at(t, Action::Alloc, 0x1000 + slot * 0x100, size),
            );
        }
        assert!(peak > 1 << 20);
        assert!(d.is_binned());
        let binned = d.binned.as_ref().unwrap();
        assert_eq!(binned.bins.len(), bins, "the bins never grow");
        assert!(binned.bytes.blocks.len() <= 50);
        let (samples, events) = d.finish();
        assert!(events.is_empty());
        assert!(samples.len() <= 6 * bins, "{}", samples.len());
        assert!(samples.windows(2).all(|w| w[0].t <= w[1].t));
        let most = samples.iter().map(|s| s.in_use).max().unwrap();
        assert_eq!(most, peak, "the spike is kept");
        assert!(
            samples.iter().any(|s| s.in_use == 0),
            "the troughs are kept"
        );
        assert!(samples.iter().all(|s| s.reserved == 1 << 30));
        assert_eq!(samples.first().unwrap().t, 0.0);
        assert_eq!(samples.last().unwrap().t, 99.999, "the last sample is kept");
    }

    #[test]
    fn without_segments_reserved_is_in_use_and_out_of_order_times_are_sorted() {
        let mut d = Downsampler::with_limits(2, 8);
        for i in 0..1000u64 {
            // Times a little out of order, as threads' clocks in a log can be.
            let t = (i as f64) + if i % 3 == 0 { -0.5 } else { 0.0 };
            d.push(MemoryEvent::at(t, Action::Alloc, i * 0x100, 0x100));
        }
        d.push(MemoryEvent::at(2000.0, Action::Oom, 0, 1));
        let (samples, _) = d.finish();
        assert!(samples.windows(2).all(|w| w[0].t <= w[1].t));
        assert!(samples.iter().all(|s| s.reserved == s.in_use));
        assert_eq!(
            samples.last().unwrap().t,
            2000.0,
            "an Oom is on the time axis"
        );
        assert_eq!(samples.last().unwrap().in_use, 1000 * 0x100);
    }
}
