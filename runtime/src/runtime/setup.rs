//! Device set-up: building each device's stack (replacing any previous one) and its workers'
//! streams, installing the stacks, publishing a generation with fresh workers, stopping them.

use std::sync::Arc;

use rmm_allocator::Device;
use rmm_allocator::resource::LiveBlock;
use rmm_config::ResolvedConfig;

use super::worker::{self, Queued, WorkerShared};
use super::{Control, Generation, RuntimeHandle, stack_on};
use crate::error::{Error, Result, TaskError};
use crate::spill::SpillManager;
use crate::stack::{DeviceStack, StackPlan};
use crate::streams::WorkerStream;
use crate::worker_id::WorkerId;

/// One device set up: stack, workers' streams, bytes the replaced stack released.
pub(super) struct DeviceSetup {
    pub(super) stack: Arc<DeviceStack>,
    pub(super) streams: Vec<WorkerStream>,
    pub(super) released: u64,
}

/// Builds every device's stack and `streams_per_device` streams in parallel, each replacing
/// its device's stack in `previous`, if any, and taking over `keep[i]` (device `i`'s live
/// allocations) in place where its pool can ([`StackPlan::replace`]). All or nothing: on a
/// failure all built is dropped (live allocations given back) and the first failing device
/// named.
pub(super) fn set_up_devices(
    config: &ResolvedConfig,
    streams_per_device: u32,
    previous: Option<&Generation>,
    managers: &[Option<Arc<SpillManager>>],
    keep: &[Vec<LiveBlock>],
) -> Result<Vec<DeviceSetup>> {
    let results: Vec<Result<DeviceSetup>> =
        super::per_device::map_devices(config.devices.len(), |i| {
            let device = &config.devices[i];
            let manager = managers.get(i).and_then(Option::as_ref);
            let on_oom = manager.map(|m| m.oom_handler());
            let fail = Error::setup(device.ordinal);
            let replaced = previous.and_then(|g| stack_on(&g.stacks, device.ordinal));
            let plan = StackPlan::new(config, device);
            let (stack, released) = match replaced {
                Some(previous) => {
                    let keep = keep.get(i).map_or(&[][..], Vec::as_slice);
                    plan.replace(previous, on_oom, keep).map_err(fail)?
                }
                None => (plan.build_with(on_oom).map_err(fail)?, 0),
            };
            let streams = (0..streams_per_device)
                .map(|_| WorkerStream::take(stack.device()))
                .collect::<rmm_allocator::Result<Vec<_>>>()
                .map_err(fail)?;
            Ok(DeviceSetup {
                stack: Arc::new(stack),
                streams,
                released,
            })
        });
    // Collecting into Result drops every built stack on the first error.
    results.into_iter().collect()
}

impl RuntimeHandle {
    /// Each device's spill manager under `resolved`, made when a device first spills.
    pub(super) fn managers_for(
        &self,
        resolved: &ResolvedConfig,
    ) -> Result<Vec<Option<Arc<SpillManager>>>> {
        let mut map = self.shared.managers.lock();
        resolved
            .devices
            .iter()
            .map(|d| {
                let Some(spill) = &d.spill else {
                    return Ok(None);
                };
                // An existing manager keeps its settings until the caller reconfigures it.
                if let Some(m) = map.get(&d.ordinal) {
                    return Ok(Some(Arc::clone(m)));
                }
                let device = Device::on(self.shared.backend, d.ordinal)?;
                let m =
                    Arc::new(SpillManager::new(device, spill).map_err(Error::setup(d.ordinal))?);
                map.insert(d.ordinal, Arc::clone(&m));
                Ok(Some(m))
            })
            .collect()
    }

    /// Installs the stacks, calls `installed` with them (nothing can fail in between), publishes
    /// a generation with fresh workers and starts them.
    pub(super) fn install_and_spawn_locked(
        &self,
        control: &mut Control,
        resolved: ResolvedConfig,
        setups: Vec<DeviceSetup>,
        managers: Vec<Option<Arc<SpillManager>>>,
        installed: impl FnOnce(&[Arc<DeviceStack>]),
    ) -> Result<()> {
        let mut stacks = Vec::with_capacity(setups.len());
        let mut workers = Vec::new();
        let mut queues = Vec::new();
        let mut by_device = Vec::with_capacity(setups.len());
        for (slot, setup) in setups.into_iter().enumerate() {
            let device = setup.stack.device().ordinal();
            let first = workers.len();
            for (index, stream) in setup.streams.into_iter().enumerate() {
                let id = WorkerId {
                    device,
                    index: index as u32,
                };
                let (w, q) = WorkerShared::new(id, slot, Arc::clone(&self.shared.active));
                workers.push(w);
                queues.push((q, stream));
            }
            by_device.push(first..workers.len());
            stacks.push(setup.stack);
        }
        if let Err(e) = install(&stacks, &[]) {
            self.shared.clear_generation(resolved);
            return Err(e);
        }
        installed(&stacks);
        self.shared.generation.store(Arc::new(Generation {
            config: resolved,
            stacks,
            managers,
            workers: workers.clone(),
            by_device,
        }));
        for (w, (q, stream)) in workers.into_iter().zip(queues) {
            let id = w.id;
            match worker::spawn(self.clone(), w, q, stream) {
                Ok(thread) => control.threads.push(thread),
                Err(source) => {
                    let why = format!("worker {id} could not be started");
                    for (_, job) in self.stop_workers(control, Some(&why)) {
                        job.cancel(TaskError::Cancelled {
                            reason: why.clone(),
                        });
                    }
                    let generation = self.shared.generation();
                    for s in &generation.stacks {
                        let _ = s.uninstall();
                    }
                    self.shared.clear_generation(generation.config.clone());
                    return Err(Error::Spawn { worker: id, source });
                }
            }
        }
        Ok(())
    }

    /// Stops and joins every worker; returns the top-level tasks they had not started, or with
    /// `cancel`, cancels them (with `why`) before joining, so no running task waits on a stopped
    /// worker.
    pub(super) fn stop_workers(&self, control: &mut Control, cancel: Option<&str>) -> Vec<Queued> {
        let generation = self.shared.generation();
        for w in &generation.workers {
            w.stop();
        }
        let mut left: Vec<Queued> = generation
            .workers
            .iter()
            .flat_map(|w| w.take_queued())
            .collect();
        if let Some(why) = cancel {
            for (_, job) in left.drain(..) {
                job.cancel(TaskError::Cancelled { reason: why.into() });
            }
        }
        for thread in control.threads.drain(..) {
            match thread.join() {
                Ok(aside) => left.extend(aside),
                Err(_) => tracing::error!("a worker thread panicked outside a task"),
            }
        }
        for w in &generation.workers {
            left.extend(w.take_queued());
        }
        left
    }
}

/// Installs every stack as its device's current resource. On failure the devices already
/// switched get `previous`'s stack (or their initial resource) back.
pub(super) fn install(stacks: &[Arc<DeviceStack>], previous: &[Arc<DeviceStack>]) -> Result<()> {
    for (i, s) in stacks.iter().enumerate() {
        if let Err(source) = s.install() {
            for done in &stacks[..i] {
                let restored = match previous.iter().find(|p| p.device() == done.device()) {
                    Some(p) => p.install().map(|_| ()),
                    None => done.uninstall(),
                };
                if let Err(e) = restored {
                    tracing::error!("restoring device {}: {e}", done.device().ordinal());
                }
            }
            return Err(Error::DeviceSetup {
                device: s.device().ordinal(),
                source,
            });
        }
    }
    Ok(())
}
