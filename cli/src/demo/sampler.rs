//! Samples every device's bytes in use and reserved, and its spilled bytes in pinned host
//! memory and on disk, while the demo runs, and marks phases,
//! reinitializes and spilling: the demo's [`Timeline`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rmm::allocator::fmt_bytes;
use rmm::runtime::{Runtime, RuntimeHandle};

use crate::timeline::Recorder;
use crate::timeline::{DeviceTimeline, Mark, MarkKind, Sample, Timeline};

/// Spill marks closer together than this are merged into one.
const MERGE_SPILL_MARKS: f64 = 0.25;

#[derive(Default)]
struct SpillSeen {
    spilled: u64,
    unspilled: u64,
    /// Bytes moved since the last mark of each kind, and when that mark was.
    pending: [(u64, f64); 2],
}

struct Inner {
    start: Instant,
    stop: AtomicBool,
    samples: Mutex<BTreeMap<u32, Vec<Sample>>>,
    /// Marks, with the bytes a spill or unspill mark stands for.
    marks: Mutex<Vec<(Mark, u64)>>,
    spill: Mutex<BTreeMap<u32, SpillSeen>>,
}

impl Inner {
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn sample(&self, rt: &RuntimeHandle) {
        let t = self.now();
        for d in rt.devices() {
            let spill = rt.spill_manager(d).map(|m| m.statistics());
            if let Some(stack) = rt.stack(d) {
                let in_use = stack.statistics().lifetime_bytes().value.max(0) as u64;
                let reserved = stack.reserved_bytes().max(in_use);
                self.samples.lock().entry(d).or_default().push(Sample {
                    t,
                    in_use,
                    reserved,
                    host: spill.as_ref().map_or(0, |s| s.host_bytes),
                    disk: spill.as_ref().map_or(0, |s| s.disk_bytes),
                });
            }
            if let Some(s) = spill {
                let mut seen = self.spill.lock();
                let e = seen.entry(d).or_default();
                let deltas = [
                    s.spilled_bytes.saturating_sub(e.spilled),
                    s.unspilled_bytes.saturating_sub(e.unspilled),
                ];
                e.spilled = s.spilled_bytes;
                e.unspilled = s.unspilled_bytes;
                for (i, kind) in [MarkKind::Spill, MarkKind::Unspill].into_iter().enumerate() {
                    let (pending, last) = &mut e.pending[i];
                    *pending += deltas[i];
                    if *pending > 0 && t - *last >= MERGE_SPILL_MARKS {
                        self.marks.lock().push((
                            Mark {
                                t,
                                device: Some(d),
                                kind,
                                label: fmt_bytes(*pending as usize),
                            },
                            *pending,
                        ));
                        *pending = 0;
                        *last = t;
                    }
                }
            }
        }
    }
}

/// The demo's sampler thread and marks.
pub(crate) struct Sampler {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
    recorder: Option<(
        Arc<Recorder>,
        rmm::allocator::adaptor::hooks::ProcessHookGuard,
    )>,
}

impl Sampler {
    /// Samples `rt` every `every` from now on; with `record_events`, also records every
    /// allocator event (a process-wide memory hook).
    pub(crate) fn start(
        rt: RuntimeHandle,
        start: Instant,
        every: Duration,
        record_events: bool,
    ) -> Sampler {
        let inner = Arc::new(Inner {
            start,
            stop: AtomicBool::new(false),
            samples: Mutex::new(BTreeMap::new()),
            marks: Mutex::new(Vec::new()),
            spill: Mutex::new(BTreeMap::new()),
        });
        let recorder = record_events.then(|| {
            let r = Arc::new(Recorder::new(start));
            let guard = r.register();
            (r, guard)
        });
        let worker = Arc::clone(&inner);
        let thread = std::thread::Builder::new()
            .name("rmm-demo-sampler".into())
            .spawn(move || {
                while !worker.stop.load(Ordering::Relaxed) {
                    worker.sample(&rt);
                    std::thread::sleep(every);
                }
            })
            .map_err(|e| tracing::warn!("no timeline: the sampler thread did not start: {e}"))
            .ok();
        Sampler {
            inner,
            thread,
            recorder,
        }
    }

    fn mark(&self, kind: MarkKind, label: &str) {
        self.inner.marks.lock().push((
            Mark {
                t: self.inner.now(),
                device: None,
                kind,
                label: label.into(),
            },
            0,
        ));
    }

    /// A phase begins.
    pub(crate) fn phase(&self, name: &str) {
        self.mark(MarkKind::Phase, name);
    }

    /// A reinitialize begins.
    pub(crate) fn mark_reinitialize(&self, label: &str) {
        self.mark(MarkKind::Reinitialize, label);
    }

    /// The pools of `devices` gave their memory back (a reinitialize to no pool).
    pub(crate) fn segments_released(&self, devices: &[u32]) {
        if let Some((r, _)) = &self.recorder {
            let t = self.inner.now();
            for &d in devices {
                r.segments_released(d, t);
            }
        }
    }

    /// The most bytes reserved on `device` in samples taken since `since`.
    pub(crate) fn peak_reserved(&self, device: u32, since: Instant) -> u64 {
        let from = since
            .saturating_duration_since(self.inner.start)
            .as_secs_f64();
        self.inner.samples.lock().get(&device).map_or(0, |s| {
            s.iter()
                .filter(|x| x.t >= from)
                .map(|x| x.reserved)
                .max()
                .unwrap_or(0)
        })
    }

    /// Stops sampling (one last sample first) and returns the timeline.
    pub(crate) fn finish(mut self, rt: &Runtime, devices: &[u32], title: String) -> Timeline {
        self.inner.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::warn!("the demo's sampler thread panicked");
        }
        self.inner.sample(&rt.handle());
        let t = self.inner.now();
        let recorder = self.recorder.take().map(|(r, guard)| {
            drop(guard);
            for &d in devices {
                r.segments_released(d, t);
            }
            r
        });
        let mut samples = std::mem::take(&mut *self.inner.samples.lock());
        let marks = coalesce(std::mem::take(&mut *self.inner.marks.lock()), t / 80.0);
        Timeline {
            title,
            devices: devices
                .iter()
                .map(|&d| DeviceTimeline {
                    device: d,
                    total_memory: rmm::allocator::Device::on(rt.backend(), d)
                        .and_then(|x| x.mem_info())
                        .ok()
                        .map(|m| m.total as u64),
                    samples: samples.remove(&d).unwrap_or_default(),
                    events: recorder.as_ref().map(|r| r.events(d)).unwrap_or_default(),
                })
                .collect(),
            marks,
        }
    }
}

/// Merges spill and unspill marks of one device closer than `window` seconds into one (the
/// first's time, the bytes summed), so a long run's picture stays readable.
fn coalesce(marks: Vec<(Mark, u64)>, window: f64) -> Vec<Mark> {
    let mut out: Vec<Mark> = Vec::with_capacity(marks.len());
    // The mark being merged into and its bytes, per (device, kind).
    let mut open: BTreeMap<(Option<u32>, bool), (usize, u64)> = BTreeMap::new();
    for (m, bytes) in marks {
        let spill = match m.kind {
            MarkKind::Spill => true,
            MarkKind::Unspill => false,
            _ => {
                out.push(m);
                continue;
            }
        };
        match open.get_mut(&(m.device, spill)) {
            Some((i, total)) if m.t - out[*i].t < window => {
                *total += bytes;
                out[*i].label = fmt_bytes(*total as usize);
            }
            _ => {
                open.insert((m.device, spill), (out.len(), bytes));
                out.push(m);
            }
        }
    }
    out
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
