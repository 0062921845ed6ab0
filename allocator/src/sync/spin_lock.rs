//! [`SpinLock`]: a lock for short, bounded hot-path critical sections. Taking it is one
//! compare-and-swap, releasing it a plain store; a waiter spins `SPINS` rounds, then yields between
//! looks in case the holder was descheduled (parking convoys under several threads).

use std::fmt;

use spin::mutex::{SpinMutex, SpinMutexGuard};

/// Busy-wait rounds before a waiter yields the processor between looks, unless a lock says.
const DEFAULT_SPINS: u32 = 64;

/// A spin-then-yield lock around `T` whose waiters spin `SPINS` rounds before yielding.
#[derive(Default)]
pub(crate) struct SpinLock<T, const SPINS: u32 = DEFAULT_SPINS>(SpinMutex<T, spin::relax::Loop>);

impl<T, const SPINS: u32> SpinLock<T, SPINS> {
    pub(crate) const fn new(value: T) -> Self {
        SpinLock(SpinMutex::new(value))
    }

    /// Takes the lock: one compare-and-swap when it is free.
    #[inline(always)]
    pub(crate) fn lock(&self) -> SpinMutexGuard<'_, T> {
        match self.0.try_lock_weak() {
            Some(guard) => guard,
            None => self.lock_contended(),
        }
    }

    /// Waits for the lock: spins, then yields between looks.
    #[cold]
    #[inline(never)]
    fn lock_contended(&self) -> SpinMutexGuard<'_, T> {
        let mut spins = 0;
        loop {
            while self.0.is_locked() {
                if spins < SPINS {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            if let Some(guard) = self.0.try_lock_weak() {
                return guard;
            }
        }
    }
}

impl<T: fmt::Debug, const SPINS: u32> fmt::Debug for SpinLock<T, SPINS> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}
