//! Shutdown: drain with a timeout (then cancel the queue), stop the workers, spill live
//! spillable data, report live allocations as leaks, give every pool back and reset devices.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::claims::unclaim;
use super::{Generation, Runtime, RuntimeHandle};
use crate::error::{Error, Result, TaskError};
use crate::report::ShutdownReport;
use crate::spill::SpillManager;

impl Runtime {
    /// Drains (up to the drain timeout, then cancels what is queued), stops and joins the
    /// workers, reports live allocations as leaks (through `tracing`, with their sites when
    /// tracking is on), gives every pool back and puts each device back on a plain
    /// `CudaMemoryResource`.
    ///
    /// # Errors
    /// [`Error::InsideWorker`] from a worker; [`Error::ShutDown`] if already shut down.
    pub fn shutdown(self) -> Result<ShutdownReport> {
        self.handle.shutdown_inner(self.handle.shared.drain_timeout)
    }

    /// As [`Runtime::shutdown`] with a drain timeout of its own.
    ///
    /// # Errors
    /// As [`Runtime::shutdown`].
    pub fn shutdown_timeout(self, timeout: Duration) -> Result<ShutdownReport> {
        self.handle.shutdown_inner(timeout)
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if !self.handle.shared.shut_down.load(Ordering::SeqCst)
            && let Err(e) = self.handle.shutdown_inner(self.handle.shared.drain_timeout)
        {
            tracing::error!("shutting the runtime down: {e}");
        }
    }
}

impl RuntimeHandle {
    fn shutdown_inner(&self, timeout: Duration) -> Result<ShutdownReport> {
        let shared = &*self.shared;
        shared.check_outside("shutdown")?;
        let start = Instant::now();
        let mut control = shared.control.lock();
        if shared.shut_down.swap(true, Ordering::SeqCst) {
            return Err(Error::ShutDown);
        }
        let _span = tracing::info_span!("runtime shutdown").entered();
        let drained = shared.drain("shutdown", timeout, Generation::queued);
        if let Err(e) = &drained {
            tracing::warn!("{e}; cancelling the queued tasks");
        }
        let why = "the runtime shut down before it ran";
        for (_, job) in self.stop_workers(&mut control, Some(why)) {
            job.cancel(TaskError::Cancelled { reason: why.into() });
        }
        // Live spillable data moves to host memory first: it stays valid without keeping the old
        // pools alive, and comes back into the device's resource of the time when used.
        let managers: Vec<Arc<SpillManager>> = shared.managers.lock().values().cloned().collect();
        for m in managers {
            if let Err(e) = m.spill_all() {
                tracing::warn!(
                    device = m.device().ordinal(),
                    "spilling before shutdown: {e}; unspilled buffers keep their pool alive"
                );
            }
            // Pinned host memory goes back but for spilled data, which frees it as it goes.
            m.stand_down();
        }
        let generation = shared.generation();
        let mut leaks = Vec::new();
        for s in &generation.stacks {
            let live = s.live();
            if live.count > 0 {
                tracing::warn!(
                    device = live.device,
                    allocations = live.count,
                    bytes = live.bytes,
                    sites = %live.allocations.join("\n"),
                    "runtime shut down with live allocations (leaked; their memory goes back \
                     to the device when their last owner drops)"
                );
                leaks.push(live);
            }
            if let Err(e) = s.release() {
                tracing::error!("releasing device {}: {e}", s.device().ordinal());
            }
            if let Err(e) = s.uninstall() {
                tracing::error!("uninstalling device {}'s stack: {e}", s.device().ordinal());
            }
        }
        let config = generation.config.clone();
        drop(generation);
        // Dropping the last reference to each stack frees its pool.
        shared.clear_generation(config);
        // Their pinned host pools go once the last spillable buffer using them does.
        shared.managers.lock().clear();
        unclaim(shared.id);
        Ok(ShutdownReport {
            drained: drained.is_ok(),
            leaks,
            elapsed: start.elapsed(),
        })
    }
}
