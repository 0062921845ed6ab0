//! The measurements: one resource on one trace from one thread ([`single`]), and on
//! `threads` traces from as many threads at once ([`multi`]).

use std::sync::Barrier;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use rmm::allocator::resource::DeviceMemoryResource;
use rmm::allocator::resource::SharedResource;
use rmm::allocator::{Device, Stream};

use crate::bench::BenchError;
use crate::bench::traces::{MIB, Op, random_trace, replay};

/// A worker's stream: its own, or the one all workers share.
enum OwnOrShared {
    Own(Stream),
    Shared(rmm::allocator::StreamView),
}

impl OwnOrShared {
    fn view(&self) -> rmm::allocator::StreamView {
        match self {
            OwnOrShared::Own(s) => s.view(),
            OwnOrShared::Shared(v) => *v,
        }
    }
}

/// One warm-up pass over (at most) the first 20 000 operations, then `rounds` timed passes;
/// the best.
pub(super) fn single(
    mr: &dyn DeviceMemoryResource,
    ops: &[Op],
    stream: &Stream,
    rounds: usize,
) -> Result<f64, BenchError> {
    replay(mr, &ops[..ops.len().min(20_000)], stream.view())?;
    stream.synchronize()?;
    let mut best = f64::INFINITY;
    for _ in 0..rounds {
        best = best.min(replay(mr, ops, stream.view())?);
        stream.synchronize()?;
    }
    Ok(best)
}

/// Lets the workers go (`true`) or sends them home (`false`, a sibling failed to start).
struct Gate {
    open: Mutex<Option<bool>>,
    changed: Condvar,
}

impl Gate {
    fn set(&self, go: bool) {
        *self.open.lock() = Some(go);
        self.changed.notify_all();
    }

    fn wait(&self) -> bool {
        let mut open = self.open.lock();
        loop {
            if let Some(go) = *open {
                return go;
            }
            self.changed.wait(&mut open);
        }
    }
}

/// One worker's timed passes: when each started and ended.
type Passes = Vec<(Instant, Instant)>;

/// `threads` threads, each its own `random` trace (`steps` steps, `cap / threads` bytes) and
/// stream; a warm-up pass each, then `rounds` timed passes that start together. A round's wall
/// time runs from the first thread's start to the last thread's end (taken by the workers, so
/// that a descheduled coordinator cannot shorten it); the best round's wall time over all
/// threads' operations.
#[allow(clippy::too_many_arguments)]
pub(super) fn multi(
    mr: &SharedResource,
    device: Device,
    threads: usize,
    steps: usize,
    cap: usize,
    rounds: usize,
    shared: bool,
) -> Result<f64, BenchError> {
    // With `shared`, every thread uses this one stream (kept alive until they are done).
    let one_stream = if shared {
        Some(Stream::new(device)?)
    } else {
        None
    };
    let one_view = one_stream.as_ref().map(Stream::view);
    let traces: Vec<Vec<Op>> = (0..threads)
        .map(|t| random_trace(steps, 256, 16 * MIB, cap / threads, 1000 + t as u64))
        .collect();
    let total_ops: usize = traces.iter().map(Vec::len).sum();
    let gate = Gate {
        open: Mutex::new(None),
        changed: Condvar::new(),
    };
    let barrier = Barrier::new(threads);
    std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(threads);
        let mut spawn_error = None;
        for (t, ops) in traces.iter().enumerate() {
            let (gate, barrier) = (&gate, &barrier);
            let worker = move || -> Result<Passes, BenchError> {
                if !gate.wait() {
                    return Ok(Vec::new());
                }
                let warm = &ops[..ops.len().min(5_000)];
                let mut outcome = match one_view {
                    Some(v) => Ok(OwnOrShared::Shared(v)),
                    None => Stream::new(device).map(OwnOrShared::Own),
                }
                .and_then(|s| {
                    replay(&**mr, warm, s.view())?;
                    rmm::allocator::synchronize_stream(device, s.view())?;
                    Ok(s)
                });
                let mut passes = Vec::with_capacity(rounds);
                // Every worker reaches every barrier, failed or not, so none waits forever.
                for _ in 0..rounds {
                    barrier.wait();
                    let start = Instant::now();
                    if let Ok(s) = &outcome
                        && let Err(e) = replay(&**mr, ops, s.view())
                    {
                        outcome = Err(e);
                    }
                    passes.push((start, Instant::now()));
                }
                outcome.map(|_| passes).map_err(BenchError::from)
            };
            match std::thread::Builder::new()
                .name(format!("rmm-bench-{t}"))
                .spawn_scoped(scope, worker)
            {
                Ok(h) => handles.push(h),
                Err(e) => {
                    spawn_error = Some(e);
                    break;
                }
            }
        }
        gate.set(spawn_error.is_none());
        let mut first_error = spawn_error.map(BenchError::Spawn);
        let mut all = Vec::with_capacity(threads);
        for h in handles {
            match h.join().unwrap_or(Err(BenchError::ThreadPanicked)) {
                Ok(passes) => all.push(passes),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            return Err(BenchError::Threads {
                threads,
                source: Box::new(e),
            });
        }
        let best = (0..rounds)
            .filter_map(|r| {
                let start = all.iter().filter_map(|p| p.get(r)).map(|p| p.0).min()?;
                let end = all.iter().filter_map(|p| p.get(r)).map(|p| p.1).max()?;
                Some(end.duration_since(start).as_nanos() as f64)
            })
            .fold(f64::INFINITY, f64::min);
        Ok(best / total_ops.max(1) as f64)
    })
}
