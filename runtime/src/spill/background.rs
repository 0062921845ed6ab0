//! Making room off the caller's thread: a thread of its own enforces a device's limit after
//! adoptions, so the adopting thread (a Dask worker's event loop storing a result) goes on
//! while the least recently used values are copied off.
//!
//! Requests are counted; [`Background::settle`] waits until all earlier ones are served, so
//! observers (statistics, a value's tier) see a settled state. The thread starts on the first
//! request and ends when what it serves is dropped.

use std::sync::{Arc, Weak};

use parking_lot::{Condvar, Mutex};

/// What the background thread serves: a device's limit (the spill tracker).
pub(crate) trait EnforceLimit: Send + Sync + 'static {
    fn enforce_limit_now(&self);
}

#[derive(Default)]
pub(crate) struct Background {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// A request was made (or the thread must stop).
    wake: Condvar,
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
    /// Has the background thread enforce `tracker`'s limit soon (here, if it cannot start).
    pub(crate) fn request<T: EnforceLimit>(&self, tracker: &Arc<T>) {
        let mut s = self.shared.state.lock();
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
            }
        }
        if s.inline {
            drop(s);
            tracker.enforce_limit_now();
            return;
        }
        s.requested += 1;
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
