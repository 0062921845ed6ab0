//! Streams and events of the simulated device. Each stream is a worker thread running its jobs in
//! order, truly asynchronous to the host; an event captures how much work its stream had been given.

use std::sync::Arc;
use std::thread;

use crossbeam_channel::{Receiver, Sender, unbounded};
use parking_lot::{Condvar, Mutex};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// How far a stream has come: jobs submitted and jobs completed, in order.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    state: Mutex<Counts>,
    changed: Condvar,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    submitted: u64,
    completed: u64,
}

impl Progress {
    pub(crate) fn submitted(&self) -> u64 {
        self.state.lock().submitted
    }

    pub(crate) fn reached(&self, target: u64) -> bool {
        self.state.lock().completed >= target
    }

    pub(crate) fn wait_for(&self, target: u64) {
        let mut s = self.state.lock();
        while s.completed < target {
            self.changed.wait(&mut s);
        }
    }
}

#[derive(Debug)]
pub(crate) struct SimStream {
    pub(crate) device: u32,
    progress: Arc<Progress>,
    queue: Mutex<Option<Sender<(u64, Job)>>>,
}

impl SimStream {
    /// Starts the stream's worker thread and returns once it runs (under an address-space limit, a
    /// thread that starts late, its signal stack unallocatable, aborts the process).
    pub(crate) fn spawn(device: u32, label: String) -> std::io::Result<Arc<SimStream>> {
        let (tx, rx) = unbounded::<(u64, Job)>();
        let progress = Arc::new(Progress::default());
        let worker_progress = Arc::clone(&progress);
        let (started_tx, started) = crossbeam_channel::bounded::<()>(1);
        thread::Builder::new().name(label).spawn(move || {
            let _ = started_tx.send(());
            run_jobs(rx, worker_progress)
        })?;
        started.recv().map_err(|_| {
            std::io::Error::other("a simulated stream's thread stopped before it started")
        })?;
        Ok(Arc::new(SimStream {
            device,
            progress,
            queue: Mutex::new(Some(tx)),
        }))
    }

    /// Queues `job` behind everything already queued. Returns false if the stream was closed.
    pub(crate) fn submit(&self, job: impl FnOnce() + Send + 'static) -> bool {
        let queue = self.queue.lock();
        let Some(tx) = queue.as_ref() else {
            return false;
        };
        let seq = {
            let mut s = self.progress.state.lock();
            s.submitted += 1;
            s.submitted
        };
        // The receiver lives as long as the worker, which outlives every open sender.
        tx.send((seq, Box::new(job))).is_ok()
    }

    pub(crate) fn synchronize(&self) {
        let target = self.progress.submitted();
        self.progress.wait_for(target);
    }

    pub(crate) fn is_idle(&self) -> bool {
        let s = self.progress.state.lock();
        s.completed >= s.submitted
    }

    /// Stops accepting work; the worker finishes what is queued and exits.
    pub(crate) fn close(&self) {
        self.queue.lock().take();
    }
}

fn run_jobs(rx: Receiver<(u64, Job)>, progress: Arc<Progress>) {
    for (seq, job) in rx {
        job();
        let mut s = progress.state.lock();
        s.completed = seq;
        drop(s);
        progress.changed.notify_all();
    }
}

/// One simulated event: the stream progress it captured at its last record.
#[derive(Debug, Default)]
pub(crate) struct SimEvent {
    pub(crate) device: u32,
    captured: Mutex<Option<(Arc<Progress>, u64)>>,
}

impl SimEvent {
    pub(crate) fn new(device: u32) -> Self {
        SimEvent {
            device,
            captured: Mutex::new(None),
        }
    }

    pub(crate) fn record(&self, stream: &SimStream) {
        let target = stream.progress.submitted();
        *self.captured.lock() = Some((Arc::clone(&stream.progress), target));
    }

    /// What a waiter must wait for: `None` when the event was never recorded (complete).
    pub(crate) fn target(&self) -> Option<(Arc<Progress>, u64)> {
        self.captured.lock().clone()
    }

    pub(crate) fn is_complete(&self) -> bool {
        self.target().is_none_or(|(p, t)| p.reached(t))
    }

    pub(crate) fn synchronize(&self) {
        if let Some((p, t)) = self.target() {
            p.wait_for(t);
        }
    }
}

/// Holds a simulated stream back ([`super::SimBackend::hold_stream`]) until opened or dropped.
#[derive(Debug)]
pub struct StreamGate {
    open: Arc<(Mutex<bool>, Condvar)>,
}

impl StreamGate {
    pub(crate) fn new() -> (StreamGate, impl FnOnce() + Send + 'static) {
        let open = Arc::new((Mutex::new(false), Condvar::new()));
        let waiter = Arc::clone(&open);
        let job = move || {
            let (lock, cv) = &*waiter;
            let mut is_open = lock.lock();
            while !*is_open {
                cv.wait(&mut is_open);
            }
        };
        (StreamGate { open }, job)
    }

    /// Lets the stream go on.
    pub fn open(self) {
        drop(self);
    }
}

impl Drop for StreamGate {
    fn drop(&mut self) {
        let (lock, cv) = &*self.open;
        *lock.lock() = true;
        cv.notify_all();
    }
}
