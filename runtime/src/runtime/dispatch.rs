//! Generations and task dispatch.
//!
//! A [`Generation`] is one configuration's devices, stacks and workers, published at start and
//! at every reinitialize; submitters read the current one without a lock.
//!
//! Each worker has two queues (top-level tasks; children of running tasks, served first) and a
//! load count (queued + running). A task goes to the least-loaded worker overall
//! ([`RuntimeHandle::submit`]) or of one device ([`RuntimeHandle::submit_to_device`]), to one
//! worker, or to all ([`RuntimeHandle::run_on_all`]). During a reinitialize, outside
//! submissions are held and sent on afterwards; those from inside a task go straight through,
//! as the task may wait for them.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rmm_config::ResolvedConfig;

use super::task::{self, Job, TaskContext, TaskHandle};
use super::worker::{self, Target, WorkerShared};
use super::{RuntimeHandle, Shared};
use crate::error::{Error, Result, TaskError};
use crate::spill::SpillManager;
use crate::stack::DeviceStack;
use crate::worker_id::WorkerId;

/// One configuration's devices, stacks and workers.
pub(crate) struct Generation {
    pub(crate) config: ResolvedConfig,
    pub(crate) stacks: Vec<Arc<DeviceStack>>,
    /// Each device's spill manager, when it spills (same order as `stacks`).
    pub(crate) managers: Vec<Option<Arc<SpillManager>>>,
    pub(super) workers: Vec<Arc<WorkerShared>>,
    /// Indices into `workers` of each device (same order as `stacks`).
    pub(super) by_device: Vec<Range<usize>>,
}

impl Generation {
    pub(super) fn empty(config: ResolvedConfig) -> Generation {
        Generation {
            config,
            stacks: Vec::new(),
            managers: Vec::new(),
            workers: Vec::new(),
            by_device: Vec::new(),
        }
    }

    fn pick(&self, target: Target) -> std::result::Result<&Arc<WorkerShared>, TaskError> {
        let range = match target {
            Target::Any => 0..self.workers.len(),
            Target::Device(d) => self
                .stacks
                .iter()
                .position(|s| s.device().ordinal() == d)
                .map(|i| self.by_device[i].clone())
                .ok_or_else(|| TaskError::NoSuchTarget {
                    target: format!("device {d}"),
                    have: listed("devices", self.stacks.iter().map(|s| s.device().ordinal())),
                })?,
            Target::Worker(id) => {
                return self.workers.iter().find(|w| w.id == id).ok_or_else(|| {
                    TaskError::NoSuchTarget {
                        target: format!("worker {id}"),
                        have: listed("workers", self.workers.iter().map(|w| w.id)),
                    }
                });
            }
        };
        least_loaded(&self.workers[range]).ok_or_else(|| TaskError::NoSuchTarget {
            target: "worker".into(),
            have: "no workers".into(),
        })
    }

    /// Tasks queued or running on every worker.
    pub(super) fn queued(&self) -> usize {
        self.workers
            .iter()
            .map(|w| w.load.load(Ordering::SeqCst))
            .sum()
    }

    /// Tasks running plus queued children on every worker (one counter shared by all).
    pub(super) fn active(&self) -> usize {
        self.workers
            .first()
            .map_or(0, |w| w.active.load(Ordering::SeqCst))
    }
}

/// What workers are laid out by: `config`'s devices and workers per device.
pub(super) fn layout(config: &ResolvedConfig) -> (Vec<u32>, u32) {
    let devices = config.devices.iter().map(|d| d.ordinal).collect();
    (devices, config.workers_per_device)
}

/// `what` and the items, e.g. `devices 0, 1`.
fn listed<T: ToString>(what: &str, items: impl Iterator<Item = T>) -> String {
    let items: Vec<String> = items.map(|i| i.to_string()).collect();
    format!("{what} {}", items.join(", "))
}

thread_local! {
    /// Rotates the scan start so that ties spread over the workers.
    static ROTATE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn least_loaded(workers: &[Arc<WorkerShared>]) -> Option<&Arc<WorkerShared>> {
    let n = workers.len();
    if n == 0 {
        return None;
    }
    let start = ROTATE.with(|r| {
        let v = r.get().wrapping_add(1);
        r.set(v);
        v
    });
    let mut best = &workers[start % n];
    let mut best_load = best.load.load(Ordering::Relaxed);
    for i in 1..n {
        if best_load == 0 {
            break;
        }
        let w = &workers[(start + i) % n];
        let l = w.load.load(Ordering::Relaxed);
        if l < best_load {
            best = w;
            best_load = l;
        }
    }
    Some(best)
}

impl Shared {
    pub(super) fn dispatch(&self, target: Target, job: Box<dyn Job>) {
        let inside = worker::current().is_some_and(|(id, _)| id == self.id);
        if inside {
            // A child of a running task: never held or paused (the task may wait for it).
            let generation = self.generation.load();
            return match generation.pick(target) {
                Ok(w) => w.send_nested(target, job),
                Err(e) => job.cancel(e),
            };
        }
        self.entering.fetch_add(1, Ordering::SeqCst);
        if self.shut_down.load(Ordering::SeqCst) {
            self.entering.fetch_sub(1, Ordering::SeqCst);
            return job.cancel(TaskError::ShutDown);
        }
        if self.holding.load(Ordering::SeqCst) {
            let mut held = self.held.lock();
            if self.holding.load(Ordering::SeqCst) {
                held.push((target, job));
                self.entering.fetch_sub(1, Ordering::SeqCst);
                return;
            }
        }
        self.send(target, job);
        self.entering.fetch_sub(1, Ordering::SeqCst);
    }

    pub(super) fn send(&self, target: Target, job: Box<dyn Job>) {
        let generation = self.generation.load();
        match generation.pick(target) {
            Ok(w) => w.send(target, job),
            Err(e) => job.cancel(e),
        }
    }

    /// Holds outside submissions and stops workers from starting top-level tasks.
    pub(super) fn pause(&self) {
        self.holding.store(true, Ordering::SeqCst);
        self.paused.store(true, Ordering::SeqCst);
    }

    /// Lets workers start tasks again and sends on what was held.
    pub(super) fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
        let held = {
            let mut held = self.held.lock();
            self.holding.store(false, Ordering::SeqCst);
            std::mem::take(&mut *held)
        };
        for (target, job) in held {
            self.send(target, job);
        }
    }

    /// Waits until no outside submitter is mid-send and `busy(generation)` is 0:
    /// [`Generation::active`] for reinitialize, [`Generation::queued`] for shutdown.
    pub(super) fn drain(
        &self,
        what: &'static str,
        timeout: Duration,
        busy: fn(&Generation) -> usize,
    ) -> Result<()> {
        let start = Instant::now();
        let mut rounds = 0u32;
        loop {
            let generation = self.generation.load();
            if self.entering.load(Ordering::SeqCst) == 0 && busy(&generation) == 0 {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(Error::DrainTimeout {
                    what,
                    tasks: busy(&generation),
                    waited: start.elapsed(),
                });
            }
            rounds += 1;
            if rounds < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
}

impl RuntimeHandle {
    /// Runs `f` on the least-loaded worker of any device.
    pub fn submit<F, T>(&self, f: F) -> TaskHandle<T>
    where
        F: FnOnce(&TaskContext<'_>) -> T + Send + 'static,
        T: Send + 'static,
    {
        let (job, handle) = task::job(f, worker::wait_for);
        self.shared.dispatch(Target::Any, job);
        handle
    }

    /// Runs `f` on the least-loaded worker of device `device` (an ordinal).
    pub fn submit_to_device<F, T>(&self, device: u32, f: F) -> TaskHandle<T>
    where
        F: FnOnce(&TaskContext<'_>) -> T + Send + 'static,
        T: Send + 'static,
    {
        let (job, handle) = task::job(f, worker::wait_for);
        self.shared.dispatch(Target::Device(device), job);
        handle
    }

    /// Runs `f` on worker `worker`.
    pub fn submit_to_worker<F, T>(&self, worker: WorkerId, f: F) -> TaskHandle<T>
    where
        F: FnOnce(&TaskContext<'_>) -> T + Send + 'static,
        T: Send + 'static,
    {
        let (job, handle) = task::job(f, worker::wait_for);
        self.shared.dispatch(Target::Worker(worker), job);
        handle
    }

    /// Runs `f` once on every worker (Dask's `client.run`); handles in `workers()` order.
    pub fn run_on_all<F, T>(&self, f: F) -> Vec<TaskHandle<T>>
    where
        F: Fn(&TaskContext<'_>) -> T + Send + Sync + 'static,
        T: Send + 'static,
    {
        let f = Arc::new(f);
        self.workers()
            .into_iter()
            .map(|id| {
                let f = Arc::clone(&f);
                self.submit_to_worker(id, move |ctx| f(ctx))
            })
            .collect()
    }

    /// Runs `f` on each item as its own task on the least-loaded worker; handles in item order.
    pub fn map<I, F, T>(&self, items: impl IntoIterator<Item = I>, f: F) -> Vec<TaskHandle<T>>
    where
        I: Send + 'static,
        F: Fn(&TaskContext<'_>, I) -> T + Send + Sync + 'static,
        T: Send + 'static,
    {
        let f = Arc::new(f);
        items
            .into_iter()
            .map(|item| {
                let f = Arc::clone(&f);
                self.submit(move |ctx| f(ctx, item))
            })
            .collect()
    }
}
