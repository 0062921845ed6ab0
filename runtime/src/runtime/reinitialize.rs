//! Reinitialize: switching every device to a new configuration while the runtime runs.
//!
//! [`RuntimeHandle::reinitialize`] is a transaction over all devices:
//!
//! 1. Resolve the configuration (free memory counts what the current stack would give back);
//!    failing changes nothing. Old and new devices stay claimed until the switch is decided.
//! 2. Hold outside submissions and pause the workers: no queued top-level task starts.
//! 3. Let running tasks and their children finish (up to the drain timeout).
//! 4. Send new spills to the new host pools and disk tiers. Where a device goes pool to pool
//!    (`cuMemAlloc` chunks both sides) and keeps spilling, hold its idle spillable buffers in
//!    place, most recent first, within the new limits and initial size ([`keep`](super::keep)).
//!    Spill the rest not in use, to come back on use. A failure before installing restores
//!    the old tiers.
//! 5. Refuse, changing nothing, if allocations other than held buffers are live.
//! 6. Per device, in parallel: the old stack gives back what the new one cannot take over, the
//!    new one is built (its pool adopting, without a driver call, the old pool's free memory
//!    and, provisionally, the held buffers' chunks), the old one gives back the rest (leaving
//!    devices: all). Held buffers a new pool refuses are spilled; if building runs out of
//!    device memory, all are, and the stacks are rebuilt. On failure the old stacks stay.
//! 7. Install the new stacks; each takes the held blocks over from the old stack's statistics,
//!    limit, tracking and log, and held buffers free to it
//!    ([`ReinitReport::kept_in_place_bytes`]).
//! 8. Re-spawn the workers if the device list or `workers_per_device` changed (queued tasks
//!    move by the rule they were sent with).
//! 9. With `spill.eager_unspill`, bring spilled data back (up to each limit); failures are
//!    noted in the report and the data stays spilled.
//! 10. Resume, sending on held submissions. The devices in force stay claimed.
//!
//! A running task waiting for a queued top-level task cannot finish while paused:
//! reinitialize then fails with [`Error::DrainTimeout`], changing nothing.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::per_device::map_devices;
use rmm_allocator::StreamView;
use rmm_config::{Config, ConfigLoader, ResolvedConfig};

use super::backend::{open_backend, resolve};
use super::claims::claim;
use super::dispatch::layout;
use super::keep::Candidates;
use super::setup::{install, set_up_devices};
use super::{Control, Generation, RuntimeHandle};
use crate::error::{Error, Result};
use crate::report::ReinitReport;
use crate::spill::SpillManager;
use crate::stack::DeviceStack;
use rmm_allocator::backend::BackendChoice;
use rmm_allocator::fmt_bytes;

/// Looks for unmovable live memory before refusing, [`SETTLE_PAUSE`] apart: threads outside
/// the runtime (a Dask worker's tasks) allocate and free meanwhile, which must not fail it.
const SETTLE_ATTEMPTS: u32 = 25;

/// The pause between two looks ([`SETTLE_ATTEMPTS`]).
const SETTLE_PAUSE: std::time::Duration = std::time::Duration::from_millis(2);

/// Looks at most, while the quick check sees memory that cannot move but the full one finds
/// none live: memory in flight (a buffer allocated and not yet spillable, or the reverse) on a
/// thread that the machine's load keeps from running on.
const SETTLE_ATTEMPTS_IN_FLIGHT: u32 = 4 * SETTLE_ATTEMPTS;

/// True when `e` is a device running out of memory while a new stack was built.
fn out_of_device_memory(e: &Error) -> bool {
    matches!(e, Error::DeviceSetup { source, .. }
        if source.is_out_of_memory() || source.is_driver_out_of_memory())
}

impl RuntimeHandle {
    /// The configuration in force, unresolved (`"all"` stays); [`config`](Self::config) resolves.
    pub fn loaded_config(&self) -> Config {
        self.shared.control.lock().config.clone()
    }

    /// Reinitializes to the configuration in force as `change` alters it, given a loader starting
    /// from it ([`ConfigLoader::from_config`]: every key as it runs, no file, no environment):
    ///
    /// ```no_run
    /// # mod rmm { pub use rmm_runtime as runtime; }
    /// # let runtime = rmm::runtime::Runtime::builder().start()?;
    /// // Devices, workers and spilling stay as they are; only the pool goes.
    /// runtime.reconfigure(|running| running.set("pool.enabled", false))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// Reading the configuration in force and switching are one step: concurrent calls never lose
    /// each other's change.
    ///
    /// # Errors
    /// As [`reinitialize`](Self::reinitialize); a change that does not load changes nothing.
    pub fn reconfigure(
        &self,
        change: impl FnOnce(ConfigLoader) -> ConfigLoader,
    ) -> Result<ReinitReport> {
        self.shared.check_outside("reinitialize")?;
        let mut control = self.shared.control.lock();
        let config = change(ConfigLoader::from_config(&control.config)).load()?;
        self.reinitialize_locked(&mut control, &config)
    }

    /// Switches every device to the stack `config` describes while the runtime runs: hold
    /// submissions, drain, spill idle data (or keep it in place), build the new stacks in
    /// parallel, install them, re-spawn workers if the layout changed, resume. An unresolvable
    /// configuration, live allocations or an unbuildable stack leave the runtime as it was.
    ///
    /// # Errors
    /// [`Error::InsideWorker`], [`Error::ShutDown`], [`Error::Config`] (does not resolve),
    /// [`Error::DrainTimeout`], [`Error::SpillBeforeSwitch`] or [`Error::LiveAllocations`] (memory
    /// in use), [`Error::DeviceSetup`] or [`Error::SpillTiers`] (a stack or tier cannot be built).
    pub fn reinitialize(&self, config: &Config) -> Result<ReinitReport> {
        self.shared.check_outside("reinitialize")?;
        let mut control = self.shared.control.lock();
        self.reinitialize_locked(&mut control, config)
    }

    /// [`reinitialize`](Self::reinitialize) with the control lock held.
    fn reinitialize_locked(&self, control: &mut Control, config: &Config) -> Result<ReinitReport> {
        let shared = &*self.shared;
        if shared.shut_down.load(Ordering::SeqCst) {
            return Err(Error::ShutDown);
        }
        let _span = tracing::info_span!("reinitialize").entered();
        let mut report = ReinitReport::default();
        let total = Instant::now();
        let t = Instant::now();
        let old = shared.generation();
        if let BackendChoice::Cuda | BackendChoice::Sim = config.backend {
            open_backend(config.backend)?;
        }
        let mut resolved = resolve(shared.backend, config, Some(&old))?;
        let store_notes = self.keep_store_spilling(&old, &mut resolved)?;
        let ordinals: Vec<u32> = resolved.devices.iter().map(|d| d.ordinal).collect();
        let old_ordinals: Vec<u32> = old.stacks.iter().map(|s| s.device().ordinal()).collect();
        let both: Vec<u32> = old_ordinals.iter().chain(&ordinals).copied().collect();
        claim(shared.id, &both)?;
        report.resolve = t.elapsed();

        let t = Instant::now();
        shared.pause();
        report.notes = store_notes;
        let result = self.switch(control, &old, resolved, &mut report, t);
        shared.resume();
        // Keep the new configuration's devices (a subset of those claimed: no conflict).
        let keep = if result.is_ok() {
            &ordinals
        } else {
            &old_ordinals
        };
        if let Err(e) = claim(shared.id, keep) {
            tracing::error!("narrowing the devices this runtime claims: {e}");
        }
        result?;
        for note in &report.notes {
            tracing::warn!("reinitialize: {note}");
        }
        control.config = config.clone();
        report.total = total.elapsed();
        report.devices = ordinals;
        let mut history = shared.history.lock();
        // The old stacks served their last allocation: their figures end their phase.
        let ended = history.reinitializations;
        for s in &old.stacks {
            history
                .phases
                .entry(s.device().ordinal())
                .or_default()
                .push(s.phase_statistics(ended));
        }
        history.reinitializations += 1;
        history.last_reinitialize = Some(report.clone());
        drop(history);
        tracing::info!(total_ms = report.total.as_secs_f64() * 1e3, "reinitialized");
        Ok(report)
    }

    /// The part of reinitialize that runs with submissions held.
    fn switch(
        &self,
        control: &mut Control,
        old: &Generation,
        resolved: ResolvedConfig,
        report: &mut ReinitReport,
        drain_start: Instant,
    ) -> Result<()> {
        let shared = &*self.shared;
        shared.drain("reinitialize", shared.drain_timeout, Generation::active)?;
        report.drain = drain_start.elapsed();

        // New spills go to the new tiers from here, so the spill below can use them.
        let t = Instant::now();
        let undo = self.replace_tiers(&resolved)?;
        let mut installed = false;
        let result = self.spill_and_switch(control, old, resolved, report, t, &mut installed);
        if result.is_err() && !installed {
            // The old tiers are back (data spilled into the new ones stays until used).
            undo.into_iter().rev().for_each(|(m, u)| m.restore_tiers(u));
        } else {
            for (m, u) in undo {
                m.commit_tiers(u);
            }
        }
        result
    }

    /// Sends each spilling device's new spills to its changed tiers; all or nothing.
    fn replace_tiers(
        &self,
        resolved: &ResolvedConfig,
    ) -> Result<Vec<(Arc<SpillManager>, crate::spill::TierUndo)>> {
        let managers = self.shared.managers.lock().clone();
        let mut undo = Vec::new();
        for d in &resolved.devices {
            let (Some(spill), Some(m)) = (&d.spill, managers.get(&d.ordinal)) else {
                continue;
            };
            match m.replace_tiers(spill) {
                Ok(Some(u)) => undo.push((Arc::clone(m), u)),
                Ok(None) => {}
                Err(source) => {
                    undo.into_iter().rev().for_each(|(m, u)| m.restore_tiers(u));
                    return Err(Error::SpillTiers {
                        device: d.ordinal,
                        source,
                    });
                }
            }
        }
        Ok(undo)
    }

    /// A device store (a Dask worker's data; its limit is fixed) relies on spilling: where
    /// `resolved` turns it off, it stays on as it is, with a note; a device it leaves out is
    /// refused ([`Error::StoreDeviceLeaves`]).
    fn keep_store_spilling(
        &self,
        old: &Generation,
        resolved: &mut ResolvedConfig,
    ) -> Result<Vec<String>> {
        let stores: Vec<u32> = self
            .shared
            .managers
            .lock()
            .iter()
            .filter(|(_, m)| m.is_fixed())
            .map(|(&device, _)| device)
            .collect();
        let mut notes = Vec::new();
        for device in stores {
            let Some(spilling_now) = old
                .config
                .devices
                .iter()
                .find(|d| d.ordinal == device)
                .and_then(|d| d.spill.clone())
            else {
                continue;
            };
            let Some(d) = resolved.devices.iter_mut().find(|d| d.ordinal == device) else {
                return Err(Error::StoreDeviceLeaves { device });
            };
            if d.spill.is_none() {
                d.spill = Some(spilling_now);
                notes.push(format!(
                    "spilling stays on on device {device}: a device store spills there (its \
                     limit was set with set_device_memory_limit, as a Dask worker's \
                     DeviceStore does), and turning it off would leave the store over its \
                     limit with no on-demand spilling; the spill settings in force are kept. \
                     Change other settings with reinitialize(overrides={{…}})"
                ));
            }
        }
        Ok(notes)
    }

    /// Notes on spillable data alive on devices that leave or stop spilling (still reachable,
    /// but outside the runtime's pools or limits); logged as warnings after the switch.
    fn orphan_notes(&self, resolved: &ResolvedConfig) -> Vec<String> {
        let managers = self.shared.managers.lock().clone();
        let mut notes = Vec::new();
        for (&device, m) in &managers {
            let (count, bytes) = m.spillable();
            if count == 0 {
                continue;
            }
            let alive = format!(
                "{count} spillable value{} of {} alive",
                if count == 1 { "" } else { "s" },
                fmt_bytes(bytes as usize)
            );
            let note = match resolved.devices.iter().find(|d| d.ordinal == device) {
                None => format!(
                    "device {device} leaves the runtime with {alive}: it is spilled now and \
                     comes back on use into device {device}'s plain memory (no pool, no \
                     limit); spill_manager({device}) still reaches it"
                ),
                Some(d) if d.spill.is_none() => format!(
                    "spilling turns off on device {device} with {alive}: it is spilled now \
                     and comes back on use into the new stack, but is no longer spilled for \
                     the device limit or on out-of-memory; spill_manager({device}) still \
                     reaches it"
                ),
                Some(_) => continue,
            };
            notes.push(note);
        }
        notes
    }

    /// Steps 4 to 9; sets `installed` once the new stacks are in force (no rollback after that).
    fn spill_and_switch(
        &self,
        control: &mut Control,
        old: &Generation,
        resolved: ResolvedConfig,
        report: &mut ReinitReport,
        t: Instant,
        installed: &mut bool,
    ) -> Result<()> {
        let shared = &*self.shared;
        report.notes.extend(self.orphan_notes(&resolved));
        // Held idle data stays in place (the spill below passes it by). Declared before the
        // new stacks, so on failure they drop first, giving the data back, before it is let go.
        let all_managers = shared.managers.lock().clone();
        let candidates = Candidates::find(&all_managers, old, &resolved);
        let mut kept = candidates.hold();
        let managers: Vec<Arc<SpillManager>> = all_managers.values().cloned().collect();
        // What must move must fit where it goes: refused before anything moves.
        for m in &managers {
            check_host_room(m, &kept)?;
        }
        let mut check = std::time::Duration::ZERO;
        let mut attempts = 0;
        loop {
            // Refuse unspillable memory before anything moves; wait out brief holds elsewhere.
            let t = Instant::now();
            let stuck = unspillable(old, &all_managers, &kept);
            check += t.elapsed();
            if !stuck.is_empty() {
                attempts += 1;
                if attempts >= SETTLE_ATTEMPTS {
                    let live = kept.live_elsewhere(old);
                    if !live.is_empty() || attempts >= SETTLE_ATTEMPTS_IN_FLIGHT {
                        return Err(Error::LiveAllocations(live));
                    }
                }
                std::thread::sleep(SETTLE_PAUSE);
                continue;
            }
            // The rest moves off, back into the new stacks on use; a buffer in use stays (live).
            let spilled: Vec<rmm_allocator::Result<u64>> =
                map_devices(managers.len(), |i| managers[i].spill_all());
            for (m, r) in managers.iter().zip(spilled) {
                report.spilled_bytes += r.map_err(|source| Error::SpillBeforeSwitch {
                    device: m.device().ordinal(),
                    source,
                })?;
            }
            let t = Instant::now();
            let live = kept.live_elsewhere(old);
            check += t.elapsed();
            if live.is_empty() {
                break;
            }
            attempts += 1;
            if attempts >= SETTLE_ATTEMPTS {
                return Err(Error::LiveAllocations(live));
            }
            std::thread::sleep(SETTLE_PAUSE);
        }
        report.spill = t.elapsed().saturating_sub(check);
        report.check = check;

        let t = Instant::now();
        let respawn = layout(&old.config) != layout(&resolved)
            // A generation left without workers by a failed start of its threads.
            || old.workers.len() != old.stacks.len() * old.config.workers_per_device as usize;
        let streams = if respawn {
            resolved.workers_per_device
        } else {
            0
        };
        let held_before: u64 = old.stacks.iter().map(|s| s.reserved_bytes()).sum();
        let managers = self.managers_for(&resolved)?;
        let keep = kept.blocks(&resolved);
        let setups = match set_up_devices(&resolved, streams, Some(old), &managers, &keep) {
            Ok(setups) => setups,
            // Short of memory with held data in the old pools: spill it too and rebuild.
            Err(e) if !kept.is_empty() && out_of_device_memory(&e) => {
                tracing::warn!(
                    "building the new stacks keeping live spillable data in place failed \
                     ({e}); spilling that data and building them again"
                );
                report.spilled_bytes += kept.spill_all()?;
                set_up_devices(&resolved, streams, Some(old), &managers, &[])?
            }
            Err(e) => return Err(e),
        };
        let (spilled, released) = kept.spill_refused(&setups, old)?;
        report.spilled_bytes += spilled;
        report.released_bytes += released;
        // New spill settings apply once the new stacks exist (a failure keeps the old limits).
        for (d, m) in resolved.devices.iter().zip(&managers) {
            if let (Some(spill), Some(m)) = (&d.spill, m) {
                m.reconfigure(spill);
            }
        }
        // Devices that leave the runtime give everything back.
        for s in &old.stacks {
            if !setups.iter().any(|n| n.stack.device() == s.device()) {
                report.released_bytes += s.release().map_err(Error::setup(s.device().ordinal()))?;
            }
        }
        report.released_bytes += setups.iter().map(|s| s.released).sum::<u64>();
        let held_after: u64 = old.stacks.iter().map(|s| s.reserved_bytes()).sum();
        report.adopted_bytes = held_before
            .saturating_sub(held_after)
            .saturating_sub(report.released_bytes);
        report.build = t.elapsed();

        let t = Instant::now();
        if respawn {
            report.respawned = true;
            // Paused and drained: no worker runs a task, so each stops at once. What was
            // queued for them goes to the new workers by the rule it was sent with.
            let queued = self.stop_workers(control, None);
            *installed = true;
            for s in &old.stacks {
                if !setups.iter().any(|n| n.stack.device() == s.device())
                    && let Err(e) = s.uninstall()
                {
                    tracing::error!("uninstalling device {}'s stack: {e}", s.device().ordinal());
                }
            }
            // From here on the old workers are gone: on failure the generation is left
            // empty, so these tasks (and later ones) are refused rather than stranded.
            let mut kept_bytes = 0;
            let spawned =
                self.install_and_spawn_locked(control, resolved, setups, managers, |stacks| {
                    kept_bytes = kept.commit(&old.stacks, stacks);
                });
            report.kept_in_place_bytes = kept_bytes;
            for (target, job) in queued {
                shared.send(target, job);
            }
            spawned?;
        } else {
            let stacks: Vec<Arc<DeviceStack>> = setups.into_iter().map(|s| s.stack).collect();
            install(&stacks, &old.stacks)?;
            *installed = true;
            report.kept_in_place_bytes = kept.commit(&old.stacks, &stacks);
            shared.generation.store(Arc::new(Generation {
                config: resolved,
                stacks,
                managers,
                workers: old.workers.clone(),
                by_device: old.by_device.clone(),
            }));
        }
        report.install = t.elapsed();

        // Managers the new generation does not use (devices no longer spilling) keep only the
        // pinned memory their spilled data holds.
        let generation = shared.generation();
        let spilling: Vec<&Arc<SpillManager>> = generation.managers.iter().flatten().collect();
        for m in shared.managers.lock().values() {
            if !spilling.iter().any(|s| Arc::ptr_eq(s, m)) {
                m.stand_down();
            }
        }

        let t = Instant::now();
        let eager: Vec<_> = spilling.into_iter().filter(|m| m.eager_unspill()).collect();
        let back: Vec<rmm_allocator::Result<u64>> =
            map_devices(eager.len(), |i| eager[i].unspill_all(StreamView::DEFAULT));
        // The switch is done: what cannot come back stays spilled and comes back on use.
        for (m, r) in eager.iter().zip(back) {
            match r {
                Ok(bytes) => report.unspilled_bytes += bytes,
                Err(e) => report.notes.push(format!(
                    "spill.eager_unspill: bringing device {}'s spilled data back failed ({e}); \
                     what did not come back stays spilled and comes back on use",
                    m.device().ordinal()
                )),
            }
        }
        report.unspill = t.elapsed();
        Ok(())
    }
}

/// Devices whose old stack has more live bytes than the manager's device data (held aside).
fn unspillable(
    old: &Generation,
    managers: &std::collections::BTreeMap<u32, Arc<SpillManager>>,
    kept: &super::keep::Kept<'_>,
) -> Vec<u32> {
    old.stacks
        .iter()
        .filter_map(|s| {
            let device = s.device().ordinal();
            let held = kept.bytes_on(device);
            let live = s.live().bytes.saturating_sub(held);
            let spillable = managers
                .get(&device)
                .map_or(0, |m| m.statistics().tracked_bytes.saturating_sub(held));
            (live > spillable).then_some(device)
        })
        .collect()
}

/// Refuses ([`Error::HostTierTooSmall`]), before anything moves, a spill that cannot fit: `m`'s
/// device data (held data aside) must fit its host tier when that is a fixed-size pool with no
/// disk tier.
fn check_host_room(m: &SpillManager, kept: &super::keep::Kept<'_>) -> Result<()> {
    let store = m.store();
    let host = store.host();
    if host.is_growable() || store.has_disk() {
        return Ok(());
    }
    let device = m.device().ordinal();
    let to_move = m
        .statistics()
        .tracked_bytes
        .saturating_sub(kept.bytes_on(device));
    // Kept host copies are room: data with one spills into it; others can be dropped.
    let room = (host.free() + host.reclaimable()) as u64;
    if to_move > room {
        return Err(Error::HostTierTooSmall {
            device,
            to_move,
            room,
        });
    }
    Ok(())
}
