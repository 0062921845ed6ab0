//! Keeping idle spillable data in place across a pool-to-pool reinitialize (steps 4 to 7 in
//! `reinitialize.rs`): instead of a copy to the host and back, the new pool takes its blocks
//! over provisionally with their chunks ([`StackPlan::replace`](crate::stack::StackPlan::replace)),
//! and each buffer is repointed to the new stack once installed ([`Kept::commit`]). A failure
//! before that drops the new stacks, whose pools give the blocks back in place; the buffers
//! were never repointed, so nothing is lost.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use super::per_device::map_devices;
use rmm_allocator::resource::{LiveBlock, SharedResource};
use rmm_allocator::spill::{HeldInPlace, SpillableBuffer};
use rmm_config::ResolvedConfig;

use super::setup::DeviceSetup;
use super::{Generation, stack_on};
use crate::error::{Error, LiveMemory, Result};
use crate::spill::{SpillBatch, SpillManager};
use crate::stack::{DeviceStack, StackPlan};

/// The buffers that may stay on their device, per device that can keep data in place.
pub(super) struct Candidates {
    devices: Vec<DeviceCandidates>,
}

struct DeviceCandidates {
    device: u32,
    /// The old stack's top: the resource the buffers' memory must come from.
    old_top: SharedResource,
    /// The most bytes to keep: the new device limit, hard limit and pool initial size.
    room: u64,
    /// Most recently used first.
    buffers: Vec<Arc<SpillableBuffer>>,
}

impl Candidates {
    /// Per device that can keep data in place under `resolved`, its manager's idle buffers.
    pub(super) fn find(
        managers: &BTreeMap<u32, Arc<SpillManager>>,
        old: &Generation,
        resolved: &ResolvedConfig,
    ) -> Candidates {
        let mut devices = Vec::new();
        for d in &resolved.devices {
            let (Some(spill), Some(m)) = (&d.spill, managers.get(&d.ordinal)) else {
                continue;
            };
            let Some(previous) = stack_on(&old.stacks, d.ordinal) else {
                continue;
            };
            let plan = StackPlan::new(resolved, d);
            if !plan.can_keep_live_from(previous) {
                continue;
            }
            let initial = plan.pool.map_or(0, |p| p.initial_size);
            let room = [Some(m.limit_under(spill)), plan.limit, Some(initial)]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(0);
            let buffers: Vec<Arc<SpillableBuffer>> = m
                .idle_on_device()
                .into_iter()
                .filter(|b| LiveBlock::movable(b.size()))
                .collect();
            if buffers.is_empty() {
                continue;
            }
            devices.push(DeviceCandidates {
                device: d.ordinal,
                old_top: Arc::clone(previous.resource()),
                room,
                buffers,
            });
        }
        Candidates { devices }
    }

    /// Holds, per device, the candidates fitting its room, most recent first; held, they are not
    /// used, moved or freed. Those busy, in use or out of the old stack's memory are left to step
    /// 4's spill.
    pub(super) fn hold(&self) -> Kept<'_> {
        let devices = self
            .devices
            .iter()
            .map(|d| {
                let mut left = d.room;
                let mut held = Vec::new();
                for b in &d.buffers {
                    if b.size() as u64 > left {
                        continue;
                    }
                    if let Some(h) = b.hold_in_place(&d.old_top) {
                        left -= h.size() as u64;
                        held.push(h);
                    }
                }
                (d.device, held)
            })
            .collect();
        Kept { devices }
    }
}

/// The buffers held in place, per device (see the module documentation).
pub(super) struct Kept<'a> {
    devices: Vec<(u32, Vec<HeldInPlace<'a>>)>,
}

impl Kept<'_> {
    fn held_on(&self, device: u32) -> &[HeldInPlace<'_>] {
        let on = self.devices.iter().find(|(d, _)| *d == device);
        on.map_or(&[], |(_, held)| held.as_slice())
    }

    pub(super) fn bytes_on(&self, device: u32) -> u64 {
        self.held_on(device).iter().map(|h| h.size() as u64).sum()
    }

    /// The live allocations held on `device`.
    fn blocks_on(&self, device: u32) -> Vec<LiveBlock> {
        let block = |h: &HeldInPlace<'_>| LiveBlock {
            ptr: h.ptr(),
            bytes: h.size(),
            stream: h.stream(),
        };
        self.held_on(device).iter().map(block).collect()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.devices.iter().all(|(_, h)| h.is_empty())
    }

    /// The held allocations of each device of `resolved`, in its order.
    pub(super) fn blocks(&self, resolved: &ResolvedConfig) -> Vec<Vec<LiveBlock>> {
        resolved
            .devices
            .iter()
            .map(|d| self.blocks_on(d.ordinal))
            .collect()
    }

    /// Step 5: what is live in `old`'s stacks apart from held buffers, per device with any.
    pub(super) fn live_elsewhere(&self, old: &Generation) -> Vec<LiveMemory> {
        let stacks = &old.stacks;
        let held: Vec<_> = stacks
            .iter()
            .map(|s| self.blocks_on(s.device().ordinal()))
            .collect();
        map_devices(stacks.len(), |i| stacks[i].live_except(&held[i]))
            .into_iter()
            .filter(|l| l.count > 0)
            .collect()
    }

    /// Spills every held buffer (the new stacks could not be built with them): the device bytes
    /// freed, or [`Error::SpillBeforeSwitch`] (that buffer stays valid in the old stack).
    pub(super) fn spill_all(&mut self) -> Result<u64> {
        self.spill_where(|_, _| true)
    }

    /// Spills the held buffers no new pool took over (still the old pool's), then has each old
    /// stack that lost some give back what they freed. Returns (bytes spilled, bytes released),
    /// or as [`spill_all`](Self::spill_all), or [`Error::DeviceSetup`] (an old pool kept it).
    pub(super) fn spill_refused(
        &mut self,
        setups: &[DeviceSetup],
        old: &Generation,
    ) -> Result<(u64, u64)> {
        // (device, address) of every block a new pool took over.
        let taken: HashSet<(u32, u64)> = setups
            .iter()
            .flat_map(|s| {
                let device = s.stack.device().ordinal();
                s.stack
                    .adopted_live()
                    .iter()
                    .map(move |b| (device, b.ptr.addr()))
            })
            .collect();
        let adopted = |device: u32, h: &HeldInPlace<'_>| taken.contains(&(device, h.ptr().addr()));
        let refused: Vec<u32> = self
            .devices
            .iter()
            .filter(|(d, held)| held.iter().any(|h| !adopted(*d, h)))
            .map(|(d, _)| *d)
            .collect();
        let spilled = self.spill_where(|d, h| !adopted(d, h))?;
        let mut released = 0;
        for s in old
            .stacks
            .iter()
            .filter(|s| refused.contains(&s.device().ordinal()))
        {
            released += s.release().map_err(Error::setup(s.device().ordinal()))?;
        }
        Ok((spilled, released))
    }

    /// Spills the held buffers `which` picks (by device), copies batched; returns the bytes.
    fn spill_where(&mut self, which: impl Fn(u32, &HeldInPlace<'_>) -> bool) -> Result<u64> {
        let mut freed = 0;
        for (device, held) in &mut self.devices {
            let (go, stay): (Vec<_>, Vec<_>) = held.drain(..).partition(|h| which(*device, h));
            *held = stay;
            if go.is_empty() {
                continue;
            }
            let mut batch = SpillBatch::default();
            for h in go {
                let size = h.size();
                batch.add(h.begin_spill(), size);
            }
            batch.complete();
            if let Some(source) = batch.first_error {
                return Err(Error::SpillBeforeSwitch {
                    device: *device,
                    source,
                });
            }
            freed += batch.freed;
        }
        Ok(freed)
    }

    /// Step 7, once `new` (replacing `old`) is installed: each new stack makes the blocks its own
    /// (moving them from the old stack's statistics, limit, tracking and log) and the held buffers
    /// it took free to it. Returns the bytes kept. Cannot fail.
    pub(super) fn commit(self, old: &[Arc<DeviceStack>], new: &[Arc<DeviceStack>]) -> u64 {
        let mut kept = 0;
        for (device, held) in self.devices {
            let (Some(old), Some(new)) = (stack_on(old, device), stack_on(new, device)) else {
                continue;
            };
            kept += new.commit_live(old);
            let taken: HashSet<u64> = new.adopted_live().iter().map(|b| b.ptr.addr()).collect();
            for h in held {
                // Those not taken were spilled before.
                if taken.contains(&h.ptr().addr()) {
                    h.move_to(Arc::clone(new.resource()));
                }
            }
        }
        kept
    }
}
