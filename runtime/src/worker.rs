//! Worker threads: one device each, its own stream, a queue of tasks.
//!
//! A worker makes its device the thread's current device, so the device's stack is what
//! `get_current_device_resource()` returns there. It takes tasks from its own crossbeam
//! channel; after a task it spins briefly before blocking, so a stream of small tasks does not
//! pay a thread wake-up each. A task waiting on a handle runs the worker's queued tasks while
//! it waits ([`wait_for`]), so tasks may wait on tasks they submitted.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use rmm_allocator::Stream;
use rmm_allocator::device::set_current_device;
use serde::Serialize;

use crate::error::TaskError;
use crate::runtime::RuntimeHandle;
use crate::task::{Job, TaskContext};

/// How long an idle worker (or a waiter) spins before it blocks.
const SPIN: Duration = Duration::from_micros(20);
/// How long a waiting worker blocks on its queue before it looks at the awaited task again.
const HELP_SLICE: Duration = Duration::from_micros(100);

/// A worker: device ordinal and index among that device's workers (`0.1` is device 0's
/// second worker).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct WorkerId {
    /// The device ordinal.
    pub device: u32,
    /// Index among the device's workers.
    pub index: u32,
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.device, self.index)
    }
}

pub(crate) enum Msg {
    Run(Box<dyn Job>),
    Stop,
}

/// The part of a worker that submitters and reports see.
pub(crate) struct WorkerShared {
    pub(crate) id: WorkerId,
    /// Index of its device in the generation's stacks.
    pub(crate) slot: usize,
    pub(crate) tx: Sender<Msg>,
    /// Tasks queued for it plus the one it runs: the routing load, and what drains wait on.
    pub(crate) load: AtomicUsize,
    pub(crate) tasks_run: AtomicU64,
    pub(crate) busy_ns: AtomicU64,
    pub(crate) panics: AtomicU64,
}

impl WorkerShared {
    pub(crate) fn new(id: WorkerId, slot: usize) -> (Arc<WorkerShared>, Receiver<Msg>) {
        let (tx, rx) = crossbeam_channel::unbounded();
        let w = Arc::new(WorkerShared {
            id,
            slot,
            tx,
            load: AtomicUsize::new(0),
            tasks_run: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            panics: AtomicU64::new(0),
        });
        (w, rx)
    }

    /// Queues `job`; on a closed queue the job is cancelled.
    pub(crate) fn send(&self, job: Box<dyn Job>) {
        self.load.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = self.tx.send(Msg::Run(job)) {
            self.load.fetch_sub(1, Ordering::SeqCst);
            if let Msg::Run(job) = e.into_inner() {
                job.cancel(TaskError::Cancelled {
                    reason: format!("worker {} has stopped", self.id),
                });
            }
        }
    }
}

/// What the worker thread keeps for itself (and for tasks that wait inside it).
struct Local {
    me: Arc<WorkerShared>,
    rx: Receiver<Msg>,
    stream: Stream,
    runtime: RuntimeHandle,
    stop_seen: Cell<bool>,
}

thread_local! {
    static LOCAL: RefCell<Option<Rc<Local>>> = const { RefCell::new(None) };
}

/// The runtime id and worker of the calling thread, if it is a runtime worker.
pub(crate) fn current() -> Option<(u64, WorkerId)> {
    LOCAL.with(|l| {
        l.borrow()
            .as_ref()
            .map(|local| (local.runtime.id(), local.me.id))
    })
}

/// Starts the thread of worker `me`, which owns `stream` on its device.
pub(crate) fn spawn(
    runtime: RuntimeHandle,
    me: Arc<WorkerShared>,
    rx: Receiver<Msg>,
    stream: Stream,
) -> std::io::Result<JoinHandle<()>> {
    let name = format!("rmm-worker-{}", me.id);
    std::thread::Builder::new().name(name).spawn(move || {
        let device = me.id.device;
        if let Err(e) = set_current_device(device) {
            // Cannot happen for a device the runtime resolved; the tasks would fail anyway.
            tracing::error!("worker {}: making device {device} current: {e}", me.id);
        }
        let local = Rc::new(Local {
            me,
            rx,
            stream,
            runtime,
            stop_seen: Cell::new(false),
        });
        LOCAL.with(|l| *l.borrow_mut() = Some(Rc::clone(&local)));
        tracing::debug!(worker = %local.me.id, "worker started");
        while !local.stop_seen.get() {
            match next_message(&local.rx) {
                Some(Msg::Run(job)) => local.run(job),
                Some(Msg::Stop) | None => break,
            }
        }
        tracing::debug!(worker = %local.me.id, "worker stopped");
        LOCAL.with(|l| l.borrow_mut().take());
    })
}

/// The next message: spins for [`SPIN`] first, then blocks. `None` when the queue closed.
fn next_message(rx: &Receiver<Msg>) -> Option<Msg> {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        match rx.try_recv() {
            Ok(m) => return Some(m),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) => {}
        }
        spins += 1;
        if spins.is_multiple_of(64) && start.elapsed() > SPIN {
            return rx.recv().ok();
        }
        std::hint::spin_loop();
    }
}

impl Local {
    fn run(&self, job: Box<dyn Job>) {
        let start = Instant::now();
        let shared = self.runtime.shared();
        if shared.cancelling() {
            job.cancel(TaskError::Cancelled {
                reason: "the runtime shut down before it ran".into(),
            });
        } else {
            let generation = shared.generation();
            let ctx = TaskContext {
                worker: self.me.id,
                stream: self.stream.view(),
                stack: &generation.stacks[self.me.slot],
                runtime: &self.runtime,
            };
            job.run(&ctx);
        }
        self.me.tasks_run.fetch_add(1, Ordering::Relaxed);
        self.me
            .busy_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.me.load.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Counts a panic of a task on the calling worker (for the report).
pub(crate) fn note_panic() {
    LOCAL.with(|l| {
        if let Some(local) = l.borrow().as_ref() {
            local.me.panics.fetch_add(1, Ordering::Relaxed);
        }
    });
}

/// Waits until `done()` or `deadline`; true when done. Outside a worker it spins briefly,
/// then `park(until)` blocks. Inside a worker it runs the worker's queued tasks meanwhile,
/// so a task can wait for tasks queued behind it.
pub(crate) fn wait_for(
    done: impl Fn() -> bool,
    park: impl Fn(Instant) -> bool,
    deadline: Option<Instant>,
) -> bool {
    if done() {
        return true;
    }
    let local = LOCAL.with(|l| l.borrow().clone());
    let spin_until = Instant::now() + SPIN;
    let mut spins = 0u32;
    loop {
        if done() {
            return true;
        }
        if let Some(local) = &local {
            match local.rx.try_recv() {
                Ok(Msg::Run(job)) => {
                    local.run(job);
                    continue;
                }
                Ok(Msg::Stop) => local.stop_seen.set(true),
                Err(_) => {}
            }
        }
        spins += 1;
        if !spins.is_multiple_of(32) {
            std::hint::spin_loop();
            continue;
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return done();
        }
        if now < spin_until {
            std::hint::spin_loop();
            continue;
        }
        match &local {
            None => {
                let until = deadline.unwrap_or(now + Duration::from_secs(3600));
                if park(until) {
                    return true;
                }
            }
            Some(local) => {
                let slice = deadline.map_or(HELP_SLICE, |d| (d - now).min(HELP_SLICE));
                match local.rx.recv_timeout(slice) {
                    Ok(Msg::Run(job)) => local.run(job),
                    Ok(Msg::Stop) => local.stop_seen.set(true),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => {
                        if park(deadline.unwrap_or(now + Duration::from_secs(3600))) {
                            return true;
                        }
                    }
                }
            }
        }
    }
}
