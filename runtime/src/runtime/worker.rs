//! Worker threads: one device each, its own stream, two queues.
//!
//! A worker makes its device the thread's current one, so `get_current_device_resource()`
//! returns the device's stack there (and its context is current for tasks' own CUDA calls).
//! Tasks from outside go to its *top* queue, children of running tasks to its *nested* queue,
//! served first. While a reinitialize pauses the runtime, workers start no top-level task (one
//! taken meanwhile is set aside until resume) but still run children, so a task waiting for
//! its children can finish.
//!
//! After a task a worker spins briefly before blocking, sparing small tasks a wake-up each. A
//! task waiting on a handle runs the worker's queued tasks meanwhile
//! ([`TaskHandle::wait`](crate::TaskHandle::wait)), so tasks may wait on tasks they submitted.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use rmm_allocator::set_current_device;

use super::RuntimeHandle;
use super::task::{Job, TaskContext};
use crate::error::TaskError;
use crate::streams::WorkerStream;
use crate::worker_id::WorkerId;

/// How long an idle worker (or a waiter) spins before it blocks.
const SPIN: Duration = Duration::from_micros(20);
/// How long a waiting or paused worker blocks on its queues before it looks around again.
const POLL: Duration = Duration::from_micros(100);
/// Waits nested deeper than this in one worker block instead of running more tasks, so chains
/// of waiting tasks cannot exhaust the stack; chains that deep need other workers to unwind.
const MAX_HELP_DEPTH: u32 = 1024;
/// A worker thread's stack: room for [`MAX_HELP_DEPTH`] nested tasks (used pages committed only).
const WORKER_STACK: usize = 256 << 20;

/// Where a task was sent, kept so a task queued for a worker that goes away (its device left)
/// is re-sent, or refused, by the same rule.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target {
    Any,
    Device(u32),
    Worker(WorkerId),
}

pub(crate) enum Msg {
    Run(Target, Box<dyn Job>),
    Stop,
}

/// A task queued or set aside, with where it was sent.
pub(crate) type Queued = (Target, Box<dyn Job>);

/// The part of a worker that submitters, reinitialize and reports see.
pub(crate) struct WorkerShared {
    pub(crate) id: WorkerId,
    /// Index of its device in the generation's stacks.
    pub(crate) slot: usize,
    top: Sender<Msg>,
    nested: Sender<Msg>,
    /// A second receiver of the top queue: what is still queued when the worker goes away.
    top_rx: Receiver<Msg>,
    /// Tasks queued for it (set aside included) plus running: routing load, what shutdown awaits.
    pub(crate) load: AtomicUsize,
    /// Running tasks plus queued children over all workers: what reinitialize waits for. One
    /// shared counter: a child is counted before its parent is counted out, so it never reads 0
    /// while work remains (per-worker counters read in turn could).
    pub(crate) active: Arc<AtomicUsize>,
    pub(crate) tasks_run: AtomicU64,
    pub(crate) busy_ns: AtomicU64,
    pub(crate) panics: AtomicU64,
}

/// The worker thread's ends of its queues.
pub(crate) struct Queues {
    top: Receiver<Msg>,
    nested: Receiver<Msg>,
}

impl WorkerShared {
    pub(crate) fn new(
        id: WorkerId,
        slot: usize,
        active: Arc<AtomicUsize>,
    ) -> (Arc<WorkerShared>, Queues) {
        let (top_tx, top) = crossbeam_channel::unbounded();
        let (nested_tx, nested) = crossbeam_channel::unbounded();
        let w = Arc::new(WorkerShared {
            id,
            slot,
            top: top_tx,
            nested: nested_tx,
            top_rx: top.clone(),
            load: AtomicUsize::new(0),
            active,
            tasks_run: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            panics: AtomicU64::new(0),
        });
        (w, Queues { top, nested })
    }

    /// Queues a top-level task.
    pub(crate) fn send(&self, target: Target, job: Box<dyn Job>) {
        self.load.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = self.top.send(Msg::Run(target, job)) {
            self.load.fetch_sub(1, Ordering::SeqCst);
            self.refuse(e.into_inner());
        }
    }

    /// Queues a child of a running task.
    pub(crate) fn send_nested(&self, target: Target, job: Box<dyn Job>) {
        self.load.fetch_add(1, Ordering::SeqCst);
        self.active.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = self.nested.send(Msg::Run(target, job)) {
            self.active.fetch_sub(1, Ordering::SeqCst);
            self.load.fetch_sub(1, Ordering::SeqCst);
            self.refuse(e.into_inner());
        }
    }

    fn refuse(&self, msg: Msg) {
        if let Msg::Run(_, job) = msg {
            job.cancel(TaskError::Cancelled {
                reason: format!("worker {} has stopped", self.id),
            });
        }
    }

    /// Asks the worker to stop after the task it runs (ahead of queued top-level tasks).
    pub(crate) fn stop(&self) {
        let _ = self.nested.send(Msg::Stop);
    }

    /// Top-level tasks still queued: call once the worker has stopped.
    pub(crate) fn take_queued(&self) -> Vec<Queued> {
        let mut out = Vec::new();
        while let Ok(msg) = self.top_rx.try_recv() {
            if let Msg::Run(target, job) = msg {
                self.load.fetch_sub(1, Ordering::SeqCst);
                out.push((target, job));
            }
        }
        out
    }
}

/// What the worker thread keeps for itself (and for tasks that wait inside it).
struct Local {
    me: Arc<WorkerShared>,
    queues: Queues,
    stream: WorkerStream,
    runtime: RuntimeHandle,
    /// A top-level task taken while the runtime was paused.
    aside: RefCell<Option<Queued>>,
    stop_seen: Cell<bool>,
}

thread_local! {
    static LOCAL: RefCell<Option<Rc<Local>>> = const { RefCell::new(None) };
    /// Waits in progress on this thread that run other tasks meanwhile.
    static HELP_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// The runtime id and worker of the calling thread, if it is a runtime worker.
pub(crate) fn current() -> Option<(u64, WorkerId)> {
    LOCAL.with(|l| {
        l.borrow()
            .as_ref()
            .map(|local| (local.runtime.shared.id, local.me.id))
    })
}

/// Starts worker `me`'s thread, using `stream`; it returns its set-aside task when it stops.
pub(crate) fn spawn(
    runtime: RuntimeHandle,
    me: Arc<WorkerShared>,
    queues: Queues,
    stream: WorkerStream,
) -> std::io::Result<JoinHandle<Option<Queued>>> {
    std::thread::Builder::new()
        .name(format!("rmm-worker-{}", me.id))
        .stack_size(WORKER_STACK)
        .spawn(move || {
            let device = me.id.device;
            if let Err(e) = set_current_device(device) {
                // Cannot happen for a device the runtime resolved; the tasks would fail anyway.
                tracing::error!("worker {}: making device {device} current: {e}", me.id);
            }
            // Its tasks' own CUDA calls (a library's kernels) go to its device too.
            if let Err(e) = rmm_allocator::Device::new(device).and_then(|d| d.bind_thread()) {
                tracing::warn!(
                    "worker {}: making device {device}'s context current: {e}",
                    me.id
                );
            }
            let local = Rc::new(Local {
                me,
                queues,
                stream,
                runtime,
                aside: RefCell::new(None),
                stop_seen: Cell::new(false),
            });
            LOCAL.with(|l| *l.borrow_mut() = Some(Rc::clone(&local)));
            tracing::debug!(worker = %local.me.id, "worker started");
            while !local.stop_seen.get() {
                local.step();
            }
            tracing::debug!(worker = %local.me.id, "worker stopped");
            LOCAL.with(|l| l.borrow_mut().take());
            local.aside.borrow_mut().take()
        })
}

impl Local {
    /// Runs one task (or waits for one), children first, no top-level task while paused.
    fn step(&self) {
        let start = Instant::now();
        let mut spins = 0u32;
        while !self.help() {
            if self.runtime.shared.paused() {
                match self.queues.nested.recv_timeout(POLL) {
                    Ok(msg) => self.handle_nested(msg),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => self.stop_seen.set(true),
                }
                return;
            }
            spins += 1;
            if spins.is_multiple_of(64) && start.elapsed() > SPIN {
                crossbeam_channel::select! {
                    recv(self.queues.nested) -> msg => match msg {
                        Ok(msg) => self.handle_nested(msg),
                        Err(_) => self.stop_seen.set(true),
                    },
                    recv(self.queues.top) -> msg => match msg {
                        Ok(msg) => self.handle_top(msg),
                        Err(_) => self.stop_seen.set(true),
                    },
                }
                return;
            }
            std::hint::spin_loop();
        }
    }

    fn run_nested(&self) -> bool {
        match self.queues.nested.try_recv() {
            Ok(msg) => {
                self.handle_nested(msg);
                true
            }
            Err(TryRecvError::Empty) => false,
            Err(TryRecvError::Disconnected) => {
                self.stop_seen.set(true);
                true
            }
        }
    }

    fn handle_nested(&self, msg: Msg) {
        match msg {
            // Counted active when it was queued.
            Msg::Run(_, job) => self.run(job),
            Msg::Stop => self.stop_seen.set(true),
        }
    }

    fn handle_top(&self, msg: Msg) {
        match msg {
            Msg::Run(target, job) => self.start_top(target, job),
            Msg::Stop => self.stop_seen.set(true),
        }
    }

    /// Runs a top-level task unless the runtime is paused; then sets it aside.
    fn start_top(&self, target: Target, job: Box<dyn Job>) {
        // Active before the check: a reinitialize either sees this task running and waits
        // for it, or this worker sees the pause (both SeqCst).
        self.me.active.fetch_add(1, Ordering::SeqCst);
        if self.runtime.shared.paused() {
            self.me.active.fetch_sub(1, Ordering::SeqCst);
            *self.aside.borrow_mut() = Some((target, job));
            return;
        }
        self.run(job);
    }

    /// Runs a task counted active, then counts it out.
    fn run(&self, job: Box<dyn Job>) {
        let start = Instant::now();
        // Counted before the result is delivered, so the waiter's report includes it.
        self.me.tasks_run.fetch_add(1, Ordering::Relaxed);
        {
            let generation = self.runtime.shared.generation();
            let ctx = TaskContext {
                worker: self.me.id,
                stream: self.stream.view(),
                stack: &generation.stacks[self.me.slot],
                spill: generation
                    .managers
                    .get(self.me.slot)
                    .and_then(|m| m.as_deref()),
                runtime: &self.runtime,
                panics: &self.me.panics,
            };
            job.run(&ctx);
        }
        self.me
            .busy_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.me.active.fetch_sub(1, Ordering::SeqCst);
        self.me.load.fetch_sub(1, Ordering::SeqCst);
    }

    /// Runs one queued task if there is one it may start now; true if it did.
    fn help(&self) -> bool {
        if self.run_nested() {
            return true;
        }
        if self.runtime.shared.paused() {
            return false;
        }
        // A task set aside during a pause that has ended comes first.
        let aside = self.aside.borrow_mut().take();
        if let Some((target, job)) = aside {
            self.start_top(target, job);
            return true;
        }
        self.queues
            .top
            .try_recv()
            .map(|msg| self.handle_top(msg))
            .is_ok()
    }
}

/// Waits until `done()` or `deadline`; true when done. Outside a worker it spins briefly,
/// then blocks in `park(until)`; inside one it runs the worker's queued tasks meanwhile
/// (children always, top-level ones unless paused), so a task can wait for those behind it.
pub(crate) fn wait_for(
    done: &dyn Fn() -> bool,
    park: &dyn Fn(Instant) -> bool,
    deadline: Option<Instant>,
) -> bool {
    if done() {
        return true;
    }
    let local = LOCAL.with(|l| l.borrow().clone());
    // Deep in nested waits, only wait: tasks below finish elsewhere, or here once this unwinds.
    let helping = local.is_some() && HELP_DEPTH.with(Cell::get) < MAX_HELP_DEPTH;
    struct Depth;
    impl Drop for Depth {
        fn drop(&mut self) {
            HELP_DEPTH.with(|d| d.set(d.get() - 1));
        }
    }
    let _depth = helping.then(|| {
        HELP_DEPTH.with(|d| d.set(d.get() + 1));
        Depth
    });
    let spin_until = Instant::now() + SPIN;
    let mut spins = 0u32;
    loop {
        if done() {
            return true;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return done();
        }
        if helping
            && let Some(local) = &local
            && local.help()
        {
            continue;
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
            continue;
        }
        let whole_wait = deadline.unwrap_or(now + Duration::from_secs(3600));
        let until = match &local {
            None => whole_wait,
            Some(_) if !helping => deadline.map_or(now + POLL, |d| d.min(now + POLL)),
            // Wake for a child at once; look at the awaited task every POLL.
            Some(local) => {
                let slice = deadline.map_or(POLL, |d| (d - now).min(POLL));
                match local.queues.nested.recv_timeout(slice) {
                    Ok(msg) => {
                        local.handle_nested(msg);
                        continue;
                    }
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => whole_wait,
                }
            }
        };
        if park(until) {
            return true;
        }
    }
}
