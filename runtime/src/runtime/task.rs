//! Tasks: what a worker runs, the context it runs with, and the handle its submitter waits on.

use std::any::Any;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rmm_allocator::adaptor::StatisticsResourceAdaptor;
use rmm_allocator::resource::SharedResource;
use rmm_allocator::{Device, StreamView};

use super::RuntimeHandle;
use crate::error::TaskError;
use crate::spill::SpillManager;
use crate::stack::DeviceStack;
use crate::worker_id::WorkerId;

/// What a task sees while it runs: its worker, device, stream and the device's resource. The
/// worker's device is the thread's current one, so
/// [`get_current_device_resource`](rmm_allocator::per_device::get_current_device_resource)
/// returns [`TaskContext::resource`] too, as do containers built without a resource.
pub struct TaskContext<'a> {
    pub(crate) worker: WorkerId,
    pub(crate) stream: StreamView,
    pub(crate) stack: &'a DeviceStack,
    pub(crate) spill: Option<&'a SpillManager>,
    pub(crate) runtime: &'a RuntimeHandle,
    /// The worker's count of panicked tasks (counted before a panic is delivered).
    pub(crate) panics: &'a AtomicU64,
}

impl fmt::Debug for TaskContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskContext")
            .field("worker", &self.worker)
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

impl<'a> TaskContext<'a> {
    /// The worker running the task.
    pub fn worker(&self) -> WorkerId {
        self.worker
    }

    /// The worker's device.
    pub fn device(&self) -> Device {
        self.stack.device()
    }

    /// The worker's own non-blocking stream.
    pub fn stream(&self) -> StreamView {
        self.stream
    }

    /// The device's resource stack (its top is what the workers allocate from).
    pub fn stack(&self) -> &'a DeviceStack {
        self.stack
    }

    /// The device's current resource.
    pub fn resource(&self) -> &'a SharedResource {
        self.stack.resource()
    }

    /// The statistics adaptor on top of the device's stack.
    pub fn statistics(&self) -> &'a StatisticsResourceAdaptor {
        self.stack.statistics()
    }

    /// The spill manager (`spill.enabled`): its buffers stay under the limit, survive reinitialize.
    pub fn spill_manager(&self) -> Option<&'a SpillManager> {
        self.spill
    }

    /// The runtime, to submit more tasks from inside this one.
    pub fn runtime(&self) -> &'a RuntimeHandle {
        self.runtime
    }
}

enum State<T> {
    Pending,
    Ready(Result<T, TaskError>),
    Taken,
}

/// Where a task's result lands; shared by the job and its handle.
pub(crate) struct Slot<T> {
    done: AtomicBool,
    state: Mutex<State<T>>,
    ready: Condvar,
}

impl<T> Slot<T> {
    fn complete(&self, result: Result<T, TaskError>) {
        let mut s = self.state.lock();
        if matches!(*s, State::Pending) {
            *s = State::Ready(result);
            self.done.store(true, Ordering::Release);
            drop(s);
            self.ready.notify_all();
        }
    }

    fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Blocks (without helping) until done or `deadline`; true when done.
    fn park_until(&self, deadline: Instant) -> bool {
        let mut s = self.state.lock();
        while matches!(*s, State::Pending) {
            if self.ready.wait_until(&mut s, deadline).timed_out() {
                return !matches!(*s, State::Pending);
            }
        }
        true
    }

    fn take(&self) -> Result<T, TaskError> {
        let mut s = self.state.lock();
        match std::mem::replace(&mut *s, State::Taken) {
            State::Ready(r) => r,
            State::Taken => Err(TaskError::AlreadyTaken),
            State::Pending => {
                *s = State::Pending;
                Err(TaskError::Timeout(Duration::ZERO))
            }
        }
    }
}

/// How a [`TaskHandle`] waits until `done()` or the deadline (true when done), parking with
/// `park(until)`; the workers' way runs queued tasks meanwhile.
pub(crate) type Wait = fn(&dyn Fn() -> bool, &dyn Fn(Instant) -> bool, Option<Instant>) -> bool;

/// A queued unit of work, type-erased.
pub(crate) trait Job: Send {
    /// Runs the task and delivers its result.
    fn run(self: Box<Self>, ctx: &TaskContext<'_>);
    /// Delivers `error` without running the task.
    fn cancel(self: Box<Self>, error: TaskError);
}

struct TaskJob<F, T> {
    f: Option<F>,
    slot: Arc<Slot<T>>,
}

impl<F, T> Job for TaskJob<F, T>
where
    F: FnOnce(&TaskContext<'_>) -> T + Send,
    T: Send,
{
    fn run(mut self: Box<Self>, ctx: &TaskContext<'_>) {
        if let Some(f) = self.f.take() {
            let result = catch_unwind(AssertUnwindSafe(|| f(ctx))).map_err(|payload| {
                // Counted before the waiter can see the panic (and read the report).
                ctx.panics.fetch_add(1, Ordering::Relaxed);
                TaskError::Panicked {
                    worker: ctx.worker,
                    message: panic_message(payload.as_ref()),
                }
            });
            self.slot.complete(result);
        }
    }

    fn cancel(mut self: Box<Self>, error: TaskError) {
        self.f = None;
        self.slot.complete(Err(error));
    }
}

impl<F, T> Drop for TaskJob<F, T> {
    fn drop(&mut self) {
        // A job dropped unrun (its queue went away) still answers its handle.
        if self.f.take().is_some() {
            self.slot.complete(Err(TaskError::Cancelled {
                reason: "its worker's queue was dropped".into(),
            }));
        }
    }
}

/// A job and the handle that waits for it the `wait` way.
pub(crate) fn job<F, T>(f: F, wait: Wait) -> (Box<dyn Job>, TaskHandle<T>)
where
    F: FnOnce(&TaskContext<'_>) -> T + Send + 'static,
    T: Send + 'static,
{
    let slot = Arc::new(Slot {
        done: AtomicBool::new(false),
        state: Mutex::new(State::Pending),
        ready: Condvar::new(),
    });
    let handle = TaskHandle {
        slot: Arc::clone(&slot),
        wait,
    };
    (Box::new(TaskJob { f: Some(f), slot }), handle)
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    let text = payload.downcast_ref::<&str>().copied();
    let text = text.or_else(|| payload.downcast_ref::<String>().map(String::as_str));
    text.unwrap_or("(a panic payload that is not a string)")
        .to_string()
}

/// The result of a submitted task, to wait for. Waiting inside a worker does not block it: it
/// runs its queued tasks meanwhile (the awaited one too, if sent there), so tasks can wait on
/// tasks they submit. But while a reinitialize pauses the runtime, queued top-level tasks do
/// not start, and past 1 024 nested waits on one worker a wait only waits.
#[must_use = "a task's result (and its panic, if any) is only seen through its handle"]
pub struct TaskHandle<T> {
    slot: Arc<Slot<T>>,
    wait: Wait,
}

impl<T> fmt::Debug for TaskHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskHandle")
            .field("done", &self.is_done())
            .finish()
    }
}

impl<T> TaskHandle<T> {
    /// True once the task has finished (or was cancelled).
    pub fn is_done(&self) -> bool {
        self.slot.is_done()
    }

    /// Waits for the task and returns its value, or why there is none.
    ///
    /// # Errors
    /// [`TaskError::Panicked`]; [`TaskError::Cancelled`] or [`TaskError::ShutDown`] when it never
    /// ran; [`TaskError::NoSuchTarget`] when its device or worker does not exist;
    /// [`TaskError::AlreadyTaken`] when a wait already took the result.
    pub fn wait(self) -> Result<T, TaskError> {
        self.wait_until(None);
        self.slot.take()
    }

    /// Waits at most `timeout` (inside a worker, plus the rest of a task it ran meanwhile). After
    /// [`TaskError::Timeout`] the task goes on and can be waited on again; after a value or
    /// another error, later waits return [`TaskError::AlreadyTaken`].
    ///
    /// # Errors
    /// [`TaskError::Timeout`] when not finished in time; else as [`TaskHandle::wait`].
    pub fn wait_timeout(&self, timeout: Duration) -> Result<T, TaskError> {
        if self.wait_until(Some(Instant::now() + timeout)) {
            self.slot.take()
        } else {
            Err(TaskError::Timeout(timeout))
        }
    }

    /// Waits for every handle, in order; the first error wins (the others still finish).
    ///
    /// # Errors
    /// The first handle's error, as [`TaskHandle::wait`].
    pub fn wait_all(handles: impl IntoIterator<Item = TaskHandle<T>>) -> Result<Vec<T>, TaskError> {
        let results: Vec<Result<T, TaskError>> =
            handles.into_iter().map(TaskHandle::wait).collect();
        results.into_iter().collect()
    }

    fn wait_until(&self, deadline: Option<Instant>) -> bool {
        let slot = &*self.slot;
        (self.wait)(
            &|| slot.is_done(),
            &|until| slot.park_until(until),
            deadline,
        )
    }
}
