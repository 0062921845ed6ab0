//! The footprint benchmark: how much memory a resource reserves for a multi-stream workload
//! whose live set stays under a cap, phase by phase.
//!
//! One round is four phases, each on new streams that stay alive until the run ends:
//!
//! | phase | threads and streams |
//! |---|---|
//! | `1 stream` | one thread on a stream of its own, the whole cap |
//! | `8 streams` | 8 threads, each on a stream of its own, an eighth of the cap each |
//! | `16 streams` | 16 threads, each on a stream of its own, a sixteenth of the cap each |
//! | `8 threads, 1 stream` | 8 threads sharing one new stream, an eighth of the cap each |
//!
//! Every thread replays the `random` trace (sizes log-uniform 256 B – 16 MiB, allocate with
//! p = 0.55 while its live bytes stay under its share of the cap, else free a random live
//! block; everything freed at the end). A phase's threads start together and, before freeing
//! what they hold at the end, wait for each other, so that their live sets (near their
//! shares of the cap) coexist. After each phase the report holds the bytes the resource
//! reserves and the peak of the live bytes (all threads together) so far. A pool
//! that keeps what idle streams hold for itself grows with every phase; one that reuses it
//! stays near the peak.

use parking_lot::{Condvar, Mutex};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use rmm::allocator::backend::DevicePtr;
use rmm::allocator::resource::SharedResource;
use rmm::allocator::{Device, Result as AllocResult, Stream, StreamView};
use serde::Serialize;

use super::BenchError;
use super::traces::{GIB, MIB, Op, random_trace};

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct FootprintOptions {
    /// Most bytes live at once, all threads together (default 8 GiB).
    pub cap: usize,
    /// Rounds of the four phases (default 3).
    pub rounds: usize,
    /// Trace steps per phase, split evenly over its threads (default 120 000).
    pub steps: usize,
}

impl Default for FootprintOptions {
    fn default() -> Self {
        FootprintOptions {
            cap: 8 * GIB,
            rounds: 3,
            steps: 120_000,
        }
    }
}

/// The figures after one phase.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseFigures {
    /// Round number, from 1.
    pub round: usize,
    /// The phase's name (see the module documentation).
    pub phase: &'static str,
    /// Bytes the resource reserves after the phase.
    pub reserved: u64,
    /// The most bytes live at once during the phase.
    pub phase_peak: u64,
    /// The most bytes live at once since the run began.
    pub peak: u64,
}

impl PhaseFigures {
    /// Reserved bytes over the peak live bytes so far (`inf` before anything was live).
    pub fn ratio(&self) -> f64 {
        self.reserved as f64 / self.peak as f64
    }
}

/// Every phase's figures, in order; prints as a markdown table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FootprintReport {
    /// The resource measured.
    pub resource: String,
    /// One row per phase.
    pub phases: Vec<PhaseFigures>,
}

impl FootprintReport {
    /// The largest reserved / peak ratio over all phases.
    pub fn worst_ratio(&self) -> f64 {
        self.phases
            .iter()
            .map(PhaseFigures::ratio)
            .fold(0.0, f64::max)
    }
}

impl fmt::Display for FootprintReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gib = |b: u64| b as f64 / GIB as f64;
        writeln!(f, "footprint of {}", self.resource)?;
        writeln!(
            f,
            "| round | phase | reserved (GiB) | phase peak live (GiB) | peak live so far (GiB) | reserved / peak |"
        )?;
        writeln!(f, "|---|---|---|---|---|---|")?;
        for p in &self.phases {
            writeln!(
                f,
                "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
                p.round,
                p.phase,
                gib(p.reserved),
                gib(p.phase_peak),
                gib(p.peak),
                p.ratio()
            )?;
        }
        writeln!(f, "worst reserved / peak: {:.2}", self.worst_ratio())
    }
}

/// Live bytes of all threads of a phase, and their peak.
#[derive(Default)]
struct Live {
    now: AtomicU64,
    peak: AtomicU64,
}

impl Live {
    fn add(&self, bytes: usize) {
        let now = self.now.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    fn sub(&self, bytes: usize) {
        self.now.fetch_sub(bytes as u64, Ordering::Relaxed);
    }
}

/// A reusable meeting point of `n` threads (a barrier that can be called off).
struct Meet {
    n: usize,
    /// (threads waiting, meetings held, called off)
    state: Mutex<(usize, u64, bool)>,
    changed: Condvar,
}

impl Meet {
    fn new(n: usize) -> Meet {
        Meet {
            n,
            state: Mutex::new((0, 0, false)),
            changed: Condvar::new(),
        }
    }

    /// Waits until all `n` threads wait here (or the meetings are called off).
    fn wait(&self) {
        let mut s = self.state.lock();
        if s.2 {
            return;
        }
        s.0 += 1;
        if s.0 == self.n {
            *s = (0, s.1 + 1, false);
            self.changed.notify_all();
            return;
        }
        let held = s.1;
        while s.1 == held && !s.2 {
            self.changed.wait(&mut s);
        }
    }

    /// Releases every waiting thread, now and later.
    fn call_off(&self) {
        self.state.lock().2 = true;
        self.changed.notify_all();
    }
}

/// The phases of one round: name, threads, whether they share one stream.
const PHASES: [(&str, usize, bool); 4] = [
    ("1 stream", 1, false),
    ("8 streams", 8, false),
    ("16 streams", 16, false),
    ("8 threads, 1 stream", 8, true),
];

/// Runs the workload on `mr` (on `device`), reading what it reserves with `reserved` after
/// each phase (a pool's size, or the device memory an async resource holds).
///
/// # Errors
/// [`BenchError::InvalidOption`] for invalid options; [`BenchError::Allocator`] when an allocation
/// or `reserved` fails; [`BenchError::Spawn`] or [`BenchError::ThreadPanicked`] when a worker
/// thread cannot start or panics.
pub fn run(
    mr: &SharedResource,
    device: Device,
    options: &FootprintOptions,
    reserved: impl Fn() -> AllocResult<u64>,
    resource: impl Into<String>,
) -> Result<FootprintReport, BenchError> {
    if options.cap < 16 * MIB || options.rounds == 0 || options.steps == 0 {
        return Err(BenchError::invalid(
            "footprint",
            format!(
                "cap {} B, rounds {}, steps {}: the cap must be at least 16 MiB (the largest \
                 request) and rounds and steps at least 1",
                options.cap, options.rounds, options.steps
            ),
        ));
    }
    // Every stream of the run, kept alive to the end as the workload asks.
    let mut streams: Vec<Stream> = Vec::new();
    let mut phases = Vec::new();
    let mut peak = 0u64;
    for round in 1..=options.rounds {
        for (p, &(phase, threads, shared)) in PHASES.iter().enumerate() {
            let views: Vec<StreamView> = if shared {
                streams.push(Stream::new(device)?);
                vec![streams[streams.len() - 1].view(); threads]
            } else {
                (0..threads)
                    .map(|_| {
                        let s = Stream::new(device)?;
                        let v = s.view();
                        streams.push(s);
                        Ok(v)
                    })
                    .collect::<AllocResult<_>>()?
            };
            let seed = (round * 100 + p * 20) as u64;
            let steps = (options.steps / threads).max(1);
            let traces: Vec<Vec<Op>> = (0..threads)
                .map(|t| random_trace(steps, 256, 16 * MIB, options.cap / threads, seed + t as u64))
                .collect();
            let live = Live::default();
            // Every thread reaches both meetings, failed or not; when a thread cannot be
            // spawned the meetings are called off, so that none waits forever.
            let barrier = Meet::new(threads);
            std::thread::scope(|scope| -> Result<(), BenchError> {
                let handles: Vec<_> = traces
                    .iter()
                    .zip(&views)
                    .map(|(ops, &view)| {
                        let (mr, live, barrier) = (&**mr, &live, &barrier);
                        std::thread::Builder::new()
                            .name("rmm-footprint".into())
                            .spawn_scoped(scope, move || {
                                barrier.wait();
                                // The trace's first `steps` operations, then its frees of
                                // what is still live.
                                let (body, tail) = ops.split_at(steps.min(ops.len()));
                                replay_counted(mr, body, tail, view, live, barrier)
                            })
                            .map_err(BenchError::Spawn)
                    })
                    .collect::<Result<_, _>>()
                    .inspect_err(|_| barrier.call_off())?;
                let mut first = Ok(());
                for h in handles {
                    let r = h
                        .join()
                        .map_err(|_| BenchError::ThreadPanicked)
                        .and_then(|r| r.map_err(BenchError::from));
                    if first.is_ok() {
                        first = r;
                    }
                }
                first
            })?;
            for s in &streams {
                s.synchronize()?;
            }
            let phase_peak = live.peak.load(Ordering::Relaxed);
            peak = peak.max(phase_peak);
            phases.push(PhaseFigures {
                round,
                phase,
                reserved: reserved()?,
                phase_peak,
                peak,
            });
        }
    }
    Ok(FootprintReport {
        resource: resource.into(),
        phases,
    })
}

/// Replays `body` then (after every thread of the phase has replayed its body) `tail` on
/// `stream`, counting live bytes in `live`; frees what is live on error.
fn replay_counted(
    mr: &dyn rmm::allocator::resource::DeviceMemoryResource,
    body: &[Op],
    tail: &[Op],
    stream: StreamView,
    live: &Live,
    barrier: &Meet,
) -> AllocResult<()> {
    let mut blocks: Vec<(DevicePtr, usize)> = Vec::with_capacity(1 << 12);
    let mut failed = None;
    let mut at_tail = false;
    for (i, op) in body.iter().chain(tail).enumerate() {
        if i == body.len() {
            barrier.wait();
            at_tail = true;
        }
        match *op {
            Op::Alloc(size) => match mr.allocate(size, stream) {
                Ok(p) => {
                    live.add(size);
                    blocks.push((p, size));
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            },
            Op::Free(i) if i < blocks.len() => {
                let (p, size) = blocks.swap_remove(i);
                live.sub(size);
                if let Err(e) = mr.deallocate(p, size, stream) {
                    failed = Some(e);
                    break;
                }
            }
            Op::Free(_) => {}
        }
    }
    if !at_tail {
        barrier.wait();
    }
    for (p, size) in blocks {
        live.sub(size);
        if let Err(e) = mr.deallocate(p, size, stream) {
            failed.get_or_insert(e);
        }
    }
    failed.map_or(Ok(()), Err)
}
