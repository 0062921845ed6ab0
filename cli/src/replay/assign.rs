//! Which replay thread each logged thread runs on: a new one for each logged thread while
//! there are fewer than the limit, then the running ones in turn. A logged thread keeps its
//! replay thread, so its events are replayed in their order.

/// The replay thread of each logged thread (by index), given out on its first event.
#[derive(Debug)]
pub(super) struct Assignment {
    limit: usize,
    started: usize,
    of: Vec<Option<usize>>,
    next: usize,
}

impl Assignment {
    /// At most `limit` replay threads (at least 1).
    pub(super) fn new(limit: usize) -> Self {
        Assignment {
            limit: limit.max(1),
            started: 0,
            of: Vec::new(),
            next: 0,
        }
    }

    /// The replay thread of logged thread `thread`, if it has one.
    pub(super) fn get(&self, thread: usize) -> Option<usize> {
        self.of.get(thread).copied().flatten()
    }

    /// The replay thread of logged thread `thread`. On its first event: a new one while fewer
    /// than the limit run, when `start(index)` starts it; else (or when it could not start,
    /// after which no more are tried) a running one, in turn. `None` when no replay thread
    /// runs or could start.
    pub(super) fn of(
        &mut self,
        thread: usize,
        start: &mut dyn FnMut(usize) -> bool,
    ) -> Option<usize> {
        if let Some(w) = self.get(thread) {
            return Some(w);
        }
        let w = if self.started < self.limit && start(self.started) {
            self.started += 1;
            self.started - 1
        } else {
            // Full, or a thread could not start: share the ones that run.
            self.limit = self.started;
            if self.started == 0 {
                return None;
            }
            self.next = (self.next + 1) % self.started;
            self.next
        };
        if self.of.len() <= thread {
            self.of.resize(thread + 1, None);
        }
        self.of[thread] = Some(w);
        Some(w)
    }

    /// Replay threads started.
    pub(super) fn started(&self) -> usize {
        self.started
    }

    /// Logged threads given a replay thread.
    pub(super) fn logged(&self) -> usize {
        self.of.iter().filter(|w| w.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_are_new_up_to_the_limit_then_shared_in_turn_and_kept() {
        let mut a = Assignment::new(3);
        let mut started = Vec::new();
        let mut start = |i| {
            started.push(i);
            true
        };
        let got: Vec<_> = [0, 1, 0, 5, 2, 3, 4, 1]
            .iter()
            .map(|&t| a.of(t, &mut start))
            .collect();
        assert_eq!(
            got,
            [0, 1, 0, 2, 1, 2, 0, 1].map(Some),
            "logged threads 0, 1 and 5 get new ones; 2, 3 and 4 share them"
        );
        assert_eq!(started, [0, 1, 2]);
        assert_eq!((a.started(), a.logged()), (3, 6));
    }

    #[test]
    fn a_thread_that_cannot_start_stops_the_growth() {
        let mut a = Assignment::new(8);
        assert_eq!(a.of(0, &mut |_| false), None, "nothing runs");
        assert_eq!(a.of(0, &mut |_| true), None, "and nothing more is tried");
        let mut b = Assignment::new(8);
        let mut n = 0;
        let mut start = |_| {
            n += 1;
            n == 1
        };
        assert_eq!(b.of(3, &mut start), Some(0));
        assert_eq!(b.of(4, &mut start), Some(0), "shares the one that runs");
        assert_eq!(b.of(5, &mut start), Some(0));
        assert_eq!(n, 2, "one start refused, then no more tries");
        assert_eq!(b.started(), 1);
    }
}
