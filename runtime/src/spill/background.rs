//! Making room off the caller's thread: a device's limit enforced by a thread of its own
//! after values are adopted, so that the thread that adopts (a Dask worker's event loop,
//! storing a task's result) goes on while the least recently used values are copied off the
//! device.
//!
//! Requests are counted; [`Background::settle`] waits until every request made before it
//! has been served, which is how observers (statistics, a value's tier) see a settled state.
//! The thread starts on the first request and ends when what it serves is dropped.

use std::sync::{Arc, Weak};

use parking_lot::{Condvar, Mutex};

/// What the background thread serves: a device's limit, enforced (the spill tracker).
pub(crate) trait EnforceLimit: Send + Sync + 'static {
    /// Spills until the device is under its limit.
    fn enforce_limit_now(&self);
}

/// The background enforcement of one tracker's limit.
#[derive(Default)]
pub(crate) struct Background {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// A request was made (or the thread must stop).
    wake: Condvar,
    /// A request was served.
    served: Condvar,
}

#[derive(Default)]
struct State {
    requested: u64,
    served: u64,
    started: bool,
    /// The thread could not be started: requests are served on the caller's thread.
    inline: bool,
    stop: bool,
}

impl Background {
    /// Asks for `tracker`'s limit to be enforced soon, on the background thread (started now
    /// if it is not running; served here if it cannot be started).
    pub(crate) fn request<T: EnforceLimit>(&self, tracker: &Arc<T>) {
        let mut s = self.shared.state.lock();
        if s.inline {
            drop(s);
            tracker.enforce_limit_now();
            return;
        }
        s.requested += 1;
        if !s.started {
            s.started = true;
            let shared = Arc::clone(&self.shared);
            let weak = Arc::downgrade(tracker);
            let spawned = std::thread::Builder::new()
                .name("rmm-spill-limit".into())
                .spawn(move || run(&shared, &weak));
            if let Err(e) = spawned {
                tracing::warn!("starting the spill-limit thread: {e}; spilling inline instead");
                s.inline = true;
                s.served = s.requested;
                drop(s);
                tracker.enforce_limit_now();
                return;
            }
        }
        self.shared.wake.notify_one();
    }

    /// Waits until every request made so far has been served.
    pub(crate) fn settle(&self) {
        let mut s = self.shared.state.lock();
        let target = s.requested;
        while s.served < target && !s.stop {
            self.shared.served.wait(&mut s);
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let mut s = self.shared.state.lock();
        s.stop = true;
        self.shared.wake.notify_all();
        self.shared.served.notify_all();
    }
}

/// The thread: serves requests until the tracker is gone.
fn run<T: EnforceLimit>(shared: &Shared, tracker: &Weak<T>) {
    loop {
        let target = {
            let mut s = shared.state.lock();
            while s.requested == s.served && !s.stop {
                shared.wake.wait(&mut s);
            }
            if s.stop {
                return;
            }
            s.requested
        };
        // Requests that arrive while this runs are served by the next round.
        match tracker.upgrade() {
            Some(t) => t.enforce_limit_now(),
            None => return,
        }
        let mut s = shared.state.lock();
        s.served = s.served.max(target);
        shared.served.notify_all();
    }
}
