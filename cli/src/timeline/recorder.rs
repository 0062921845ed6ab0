//! [`Recorder`]: a memory hook that turns a pool's hook events into [`MemoryEvent`]s per
//! device, on the clock of the run they belong to.
//!
//! | hook event | recorded as |
//! |---|---|
//! | `malloc_postprocess` with a pointer | [`Action::Alloc`] (`size`: the rounded block) |
//! | `malloc_postprocess` with a null pointer | [`Action::Oom`] (`size`: the request) |
//! | `free_postprocess` | [`Action::FreeCompleted`] (`size`: the rounded block) |
//! | `alloc_postprocess` with a pointer | [`Action::SegmentAlloc`] (the chunk taken upstream) |
//! | `alloc_postprocess` with a null pointer | [`Action::Oom`] (`size`: the chunk tried) |
//!
//! Pools give chunks back to the device without a hook event (on reinitialize, shutdown,
//! `release`/`trim`, or to make room for a larger chunk). So a segment that a new one overlaps
//! is recorded as freed just before it, and [`Recorder::segments_released`] records the
//! segments of a device as freed when the caller knows its pool let go of everything.
//! Anything else (e.g. the chunk a pool takes at construction) can be added with
//! [`Recorder::record`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use rmm::allocator::adaptor::hooks::{
    HookEvent, MemoryHook, ProcessHookGuard, register_process_hook,
};

use super::{Action, DeviceTimeline, MemoryEvent, samples_from_events};

/// Where a streaming [`Recorder`] sends each event, in the order recorded: the device and
/// the event (see [`Recorder::streaming`]).
pub type EventSink = Box<dyn FnMut(u32, &MemoryEvent) + Send>;

#[derive(Debug, Default)]
struct DeviceLog {
    /// The events (kept unless the recorder streams them).
    events: Vec<MemoryEvent>,
    /// Events recorded, kept or not.
    recorded: u64,
    /// Live segments: address → (size, stream).
    segments: BTreeMap<u64, (u64, u64)>,
}

impl DeviceLog {
    /// Records `event` on `device` (and the segment frees it implies): kept, or passed to
    /// `sink`.
    fn push(&mut self, device: u32, event: MemoryEvent, sink: &mut Option<EventSink>) {
        match event.action {
            Action::SegmentAlloc => {
                self.free_overlapping(device, &event, sink);
                self.segments.insert(event.addr, (event.size, event.stream));
            }
            // Not a segment this recorder saw: left out, to keep the trace consistent.
            Action::SegmentFree if self.segments.remove(&event.addr).is_none() => return,
            _ => {}
        }
        self.emit(device, event, sink);
    }

    fn emit(&mut self, device: u32, event: MemoryEvent, sink: &mut Option<EventSink>) {
        self.recorded += 1;
        match sink {
            Some(sink) => sink(device, &event),
            None => self.events.push(event),
        }
    }

    /// Records as freed every live segment that overlaps the segment `new`: the pool gave it
    /// back without an event, since the device handed out its range again.
    fn free_overlapping(&mut self, device: u32, new: &MemoryEvent, sink: &mut Option<EventSink>) {
        let end = new.addr.saturating_add(new.size.max(1));
        let overlapping: Vec<(u64, u64, u64)> = self
            .segments
            .range(..end)
            .filter(|&(&a, &(s, _))| a.saturating_add(s) > new.addr)
            .map(|(&a, &(s, stream))| (a, s, stream))
            .collect();
        for (a, s, stream) in overlapping {
            self.segments.remove(&a);
            let freed = MemoryEvent {
                t: new.t,
                action: Action::SegmentFree,
                addr: a,
                size: s,
                stream,
            };
            self.emit(device, freed, sink);
        }
    }
}

/// The recorder's state: per device, and the sink of a streaming recorder.
#[derive(Default)]
struct Devices {
    logs: BTreeMap<u32, DeviceLog>,
    sink: Option<EventSink>,
}

impl Devices {
    /// Records `event` on `device`: kept in its log, or passed to the sink.
    fn record(&mut self, device: u32, event: MemoryEvent) {
        self.logs
            .entry(device)
            .or_default()
            .push(device, event, &mut self.sink);
    }
}

impl std::fmt::Debug for Devices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Devices")
            .field("logs", &self.logs)
            .field("streaming", &self.sink.is_some())
            .finish()
    }
}

/// Records allocator events per device from memory hooks (see the module documentation).
///
/// ```no_run
/// # use std::sync::Arc;
/// # use std::time::Instant;
/// use rmm_cli::timeline::Recorder;
///
/// let recorder = Arc::new(Recorder::new(Instant::now()));
/// let guard = recorder.register();
/// // ... allocate from a pool ...
/// drop(guard);
/// let events = recorder.events(0);
/// ```
#[derive(Debug)]
pub struct Recorder {
    start: Instant,
    devices: Mutex<Devices>,
}

impl Recorder {
    /// A recorder whose times are seconds since `start` (give the start of the run, so the
    /// events line up with its other samples).
    pub fn new(start: Instant) -> Self {
        Recorder {
            start,
            devices: Mutex::new(Devices::default()),
        }
    }

    /// A recorder that keeps no events: each goes to `sink` as it is recorded (with the
    /// segment frees the recorder adds), one at a time, in the order recorded. Its memory is
    /// the live segments, whatever the number of events; [`Recorder::events`] is empty.
    pub fn streaming(start: Instant, sink: EventSink) -> Self {
        Recorder {
            start,
            devices: Mutex::new(Devices {
                logs: BTreeMap::new(),
                sink: Some(sink),
            }),
        }
    }

    /// The start of the run's clock.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// Seconds since the start, now.
    pub fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Registers this recorder as a process-wide memory hook until the guard drops.
    pub fn register(self: &Arc<Self>) -> ProcessHookGuard {
        register_process_hook(Arc::clone(self) as Arc<dyn MemoryHook>)
    }

    /// Adds an event on `device` (one no hook reports, e.g. the chunk a pool takes at
    /// construction). A `SegmentFree` of a segment that is not live is ignored; a
    /// `SegmentAlloc` first frees the live segments it overlaps.
    pub fn record(&self, device: u32, event: MemoryEvent) {
        self.devices.lock().record(device, event);
    }

    /// Records a `SegmentFree` at `t` for every segment of `device` still live: call it when
    /// the device's pool gave all its memory back (reinitialize, shutdown), which no hook
    /// reports.
    pub fn segments_released(&self, device: u32, t: f64) {
        let mut devices = self.devices.lock();
        let Some(log) = devices.logs.get(&device) else {
            return;
        };
        let live: Vec<(u64, (u64, u64))> = log.segments.iter().map(|(&a, &v)| (a, v)).collect();
        for (addr, (size, stream)) in live {
            devices.record(
                device,
                MemoryEvent {
                    t,
                    action: Action::SegmentFree,
                    addr,
                    size,
                    stream,
                },
            );
        }
    }

    /// The events recorded on `device` so far, in the order they were recorded (none for a
    /// [streaming](Recorder::streaming) recorder).
    pub fn events(&self, device: u32) -> Vec<MemoryEvent> {
        self.devices
            .lock()
            .logs
            .get(&device)
            .map(|l| l.events.clone())
            .unwrap_or_default()
    }

    /// The devices with at least one recorded event, in order.
    pub fn devices(&self) -> Vec<u32> {
        self.devices
            .lock()
            .logs
            .iter()
            .filter(|(_, l)| l.recorded > 0)
            .map(|(&d, _)| d)
            .collect()
    }

    /// `device`'s events with the samples derived from them ([`samples_from_events`]);
    /// `total_memory` is left unknown.
    pub fn device_timeline(&self, device: u32) -> DeviceTimeline {
        let events = self.events(device);
        DeviceTimeline {
            device,
            total_memory: None,
            samples: samples_from_events(&events),
            events,
        }
    }

    fn push(&self, e: &HookEvent, action: Action, size: usize) {
        let event = MemoryEvent {
            t: self.now(),
            action,
            addr: if action == Action::Oom { 0 } else { e.ptr.0 },
            size: size as u64,
            stream: e.stream.raw(),
        };
        self.record(e.device, event);
    }
}

impl MemoryHook for Recorder {
    fn name(&self) -> &str {
        "timeline::Recorder"
    }

    fn malloc_postprocess(&self, e: &HookEvent) {
        if e.ptr.is_null() {
            self.push(e, Action::Oom, e.size);
        } else {
            self.push(e, Action::Alloc, e.mem_size);
        }
    }

    fn free_postprocess(&self, e: &HookEvent) {
        if !e.ptr.is_null() {
            self.push(e, Action::FreeCompleted, e.mem_size);
        }
    }

    fn alloc_postprocess(&self, e: &HookEvent) {
        if e.ptr.is_null() {
            self.push(e, Action::Oom, e.mem_size);
        } else {
            self.push(e, Action::SegmentAlloc, e.mem_size);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmm::allocator::adaptor::hooks::register_thread_hook;
    use rmm::allocator::backend::{SimBackend, SimConfig, SimMemoryMode};
    use rmm::allocator::resource::DeviceMemoryResource;
    use rmm::allocator::resource::SharedResource;
    use rmm::allocator::resource::{CudaMemoryResource, PoolMemoryResource};
    use rmm::allocator::{Device, StreamView};

    const MIB: usize = 1 << 20;

    fn sim_pool(capacity: usize, initial: usize) -> PoolMemoryResource {
        let b = SimBackend::leak(SimConfig {
            devices: 1,
            capacity,
            mode: SimMemoryMode::Unbacked,
        })
        .unwrap();
        let cuda: SharedResource = Arc::new(CudaMemoryResource::new(Device::on(b, 0).unwrap()));
        PoolMemoryResource::new(cuda, initial, Some(capacity)).unwrap()
    }

    fn actions(events: &[MemoryEvent]) -> Vec<Action> {
        events.iter().map(|e| e.action).collect()
    }

    #[test]
    fn records_blocks_segments_and_oom_from_a_pool() {
        // An empty pool: every chunk it takes is a hook event.
        let pool = sim_pool(256 * MIB, 0);
        let recorder = Arc::new(Recorder::new(Instant::now()));
        // A thread hook: tests of this binary may run on other threads of the process.
        let guard = register_thread_hook(Arc::clone(&recorder) as Arc<dyn MemoryHook>);
        let s = StreamView::DEFAULT;
        let a = pool.allocate(MIB, s).unwrap();
        let b = pool.allocate(3 * MIB + 5, s).unwrap();
        pool.deallocate(a, MIB, s).unwrap();
        let oom = pool.allocate(1 << 40, s);
        assert!(oom.is_err());
        pool.deallocate(b, 3 * MIB + 5, s).unwrap();
        drop(guard);
        let events = recorder.events(0);
        assert_eq!(recorder.devices(), vec![0]);
        let got = actions(&events);
        assert_eq!(got[0], Action::SegmentAlloc, "{events:?}");
        assert_eq!(got[1], Action::Alloc, "{events:?}");
        let allocs: Vec<&MemoryEvent> = events
            .iter()
            .filter(|e| e.action == Action::Alloc)
            .collect();
        assert_eq!(allocs.len(), 2, "{events:?}");
        assert_eq!(allocs[0].addr, a.0);
        assert_eq!(allocs[0].size, MIB as u64);
        assert_eq!(allocs[1].addr, b.0);
        assert!(allocs[1].size >= (3 * MIB + 5) as u64);
        let frees: Vec<u64> = events
            .iter()
            .filter(|e| e.action == Action::FreeCompleted)
            .map(|e| e.addr)
            .collect();
        assert_eq!(frees, vec![a.0, b.0]);
        // The failed request is an Oom of the requested size, after the block frees of `a`.
        let last_oom = events
            .iter()
            .rev()
            .find(|e| e.action == Action::Oom)
            .unwrap();
        assert_eq!(last_oom.size, 1 << 40);
        // Every block lies in a recorded segment.
        let segments: Vec<(u64, u64)> = events
            .iter()
            .filter(|e| e.action == Action::SegmentAlloc)
            .map(|e| (e.addr, e.size))
            .collect();
        for e in &allocs {
            assert!(
                segments
                    .iter()
                    .any(|&(s, n)| e.addr >= s && e.addr + e.size <= s + n),
                "{e:?} outside {segments:?}"
            );
        }
        // Times are seconds since the start, in order.
        assert!(events.windows(2).all(|w| w[0].t <= w[1].t));
        assert!(events.iter().all(|e| e.t >= 0.0 && e.t < 60.0));
        // Samples: in use back to zero, reserved the segments.
        let samples = samples_from_events(&events);
        let last = samples.last().unwrap();
        assert_eq!(last.in_use, 0);
        assert_eq!(last.reserved, segments.iter().map(|&(_, n)| n).sum::<u64>());
        assert!(samples.iter().any(|s| s.in_use >= (4 * MIB) as u64));
        // Releasing frees every live segment once.
        recorder.segments_released(0, 1.0);
        let after = recorder.events(0);
        let freed = after[events.len()..]
            .iter()
            .filter(|e| e.action == Action::SegmentFree)
            .count();
        assert_eq!(freed, segments.len());
        recorder.segments_released(0, 2.0);
        assert_eq!(recorder.events(0).len(), after.len());
        assert_eq!(samples_from_events(&after).last().unwrap().reserved, 0);
    }

    #[test]
    fn a_segment_over_a_live_one_frees_it_first() {
        let r = Recorder::new(Instant::now());
        r.record(
            3,
            MemoryEvent::at(0.0, Action::SegmentAlloc, 0x1000, 0x1000),
        );
        r.record(
            3,
            MemoryEvent::at(1.0, Action::SegmentAlloc, 0x1800, 0x1000),
        );
        r.record(3, MemoryEvent::at(2.0, Action::SegmentFree, 0x9000, 0x1000));
        let got = r.events(3);
        assert_eq!(
            actions(&got),
            vec![
                Action::SegmentAlloc,
                Action::SegmentFree,
                Action::SegmentAlloc
            ]
        );
        assert_eq!(got[1].addr, 0x1000);
        assert_eq!(got[1].t, 1.0);
        assert!(r.events(0).is_empty());
        assert_eq!(r.devices(), vec![3]);
        let d = r.device_timeline(3);
        assert_eq!(d.samples.last().unwrap().reserved, 0x1000);
    }
}
