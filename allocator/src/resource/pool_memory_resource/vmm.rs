//! The pool's memory through CUDA's virtual memory API: one address range per device, reserved once
//! and shared by its pools, each mapping physical chunks side by side as it grows, so free space
//! stays whole across growth and each entirely free chunk goes back on its own. The range goes
//! with the device's last pool. All slow path.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::backend::{DevicePtr, RawPhysical};
use crate::device::Device;
use crate::error::{Error, Result, fmt_bytes};
use crate::resource::{map_oom, out_of_memory};

/// Reserved range per device, × its memory: room for a full-size pool and its replacement.
const RESERVE_FACTOR: u64 = 2;

/// The smallest maximum size for which `VirtualMemory::Auto` maps chunks (64 granules of 2 MiB).
pub(crate) const AUTO_MINIMUM: u64 = 128 << 20;

/// Largest initial size at which [`VirtualMemory::Auto`](super::VirtualMemory::Auto) maps.
pub(crate) const AUTO_MAXIMUM_INITIAL: u64 = 2 << 30;

/// Name in errors and hooks for memory mapped through the virtual memory API.
pub(crate) const VMM_SOURCE: &str = "PoolMemoryResource (virtual memory)";
/// Name in errors when the reserved address range has no room left.
const VMM_FULL: &str = "PoolMemoryResource (its reserved address range is full)";

/// The address spaces alive in this process (one per backend and device).
static SPACES: Mutex<Vec<Weak<AddressSpace>>> = Mutex::new(Vec::new());

/// One device's reserved address range and the chunks mapped in it, by any pool.
pub(crate) struct AddressSpace {
    device: Device,
    base: u64,
    size: u64,
    /// The unit of chunk sizes and addresses.
    pub(crate) granularity: u64,
    /// Mapped chunks: start → (length, physical handle).
    mapped: Mutex<BTreeMap<u64, (u64, RawPhysical)>>,
}

impl AddressSpace {
    /// `device`'s address space, reserved on first use (twice its memory, granularity-aligned).
    pub(crate) fn of(device: Device) -> Result<Arc<AddressSpace>> {
        let mut spaces = SPACES.lock();
        spaces.retain(|w| w.strong_count() > 0);
        if let Some(s) = spaces
            .iter()
            .filter_map(Weak::upgrade)
            .find(|s| s.device == device)
        {
            return Ok(s);
        }
        let (backend, dev) = (device.backend(), device.ordinal());
        let granularity = backend.mem_granularity(dev)? as u64;
        let total = backend.properties(dev)?.total_memory as u64;
        let size = (total.max(granularity) * RESERVE_FACTOR).next_multiple_of(granularity);
        let base = backend.mem_address_reserve(dev, size as usize)?.addr();
        tracing::debug!(
            device = dev,
            base,
            size,
            granularity,
            "reserved the pool address range"
        );
        let space = Arc::new(AddressSpace {
            device,
            base,
            size,
            granularity,
            mapped: Mutex::new(BTreeMap::new()),
        });
        spaces.push(Arc::downgrade(&space));
        Ok(space)
    }

    /// The lowest start of `len` free bytes of the range, or `hint` when that is free.
    fn place(
        mapped: &BTreeMap<u64, (u64, RawPhysical)>,
        base: u64,
        end: u64,
        len: u64,
        hint: Option<u64>,
    ) -> Option<u64> {
        let free_at = |at: u64| {
            at >= base
                && at + len <= end
                && mapped
                    .range(..at + len)
                    .next_back()
                    .is_none_or(|(s, (l, _))| s + l <= at)
        };
        if let Some(h) = hint.filter(|&h| free_at(h)) {
            return Some(h);
        }
        let mut at = base;
        for (&s, &(l, _)) in mapped.iter() {
            if s >= at + len {
                break;
            }
            at = at.max(s + l);
        }
        (at + len <= end).then_some(at)
    }

    /// Maps `total` bytes side by side in chunks of `chunk` bytes at `at` (`None` if taken) or the
    /// lowest free addresses, and makes them accessible; returns the chunks. All or nothing.
    pub(crate) fn map(
        &self,
        total: u64,
        chunk: u64,
        at: Option<u64>,
    ) -> Result<Option<Vec<(u64, u64)>>> {
        let (backend, dev) = (self.device.backend(), self.device.ordinal());
        let mut mapped = self.mapped.lock();
        let placed = Self::place(&mapped, self.base, self.base + self.size, total, at);
        if at.is_some() && placed != at {
            return Ok(None);
        }
        let Some(start) = placed else {
            tracing::warn!(
                device = dev,
                requested = total,
                range = self.size,
                "the pool address range is full (it holds the device's pools side by side); \
                 pool.vmm = false takes memory with cuMemAlloc instead"
            );
            return Err(out_of_memory(self.device, total as usize, VMM_FULL, None));
        };
        let g = self.granularity;
        let chunk = chunk.max(g).next_multiple_of(g);
        let mut made: Vec<(u64, u64, RawPhysical)> = Vec::new();
        let mut at = start;
        let result = (|| {
            while at < start + total {
                let len = chunk.min(start + total - at);
                let h = backend
                    .mem_create(dev, len as usize)
                    .map_err(|e| map_oom(e, self.device, len as usize, VMM_SOURCE))?;
                if let Err(e) = backend.mem_map(dev, DevicePtr(at), len as usize, h) {
                    let _ = backend.mem_release(dev, h);
                    return Err(e);
                }
                made.push((at, len, h));
                at += len;
            }
            backend.mem_set_access(dev, DevicePtr(start), total as usize)
        })();
        if let Err(e) = result {
            for &(a, l, h) in &made {
                if let Err(u) = unmap_one(self.device, a, l, h) {
                    tracing::error!("undoing a pool chunk mapping at {a:#x}: {u}");
                }
            }
            return Err(e);
        }
        for &(a, l, h) in &made {
            mapped.insert(a, (l, h));
        }
        Ok(Some(made.into_iter().map(|(a, l, _)| (a, l)).collect()))
    }

    /// Unmaps the chunk mapped at `addr` and gives its memory back to the device.
    pub(crate) fn unmap(&self, addr: u64, len: u64) -> Result<()> {
        let mut mapped = self.mapped.lock();
        let Some(&(l, h)) = mapped.get(&addr).filter(|(l, _)| *l == len) else {
            return Err(Error::invalid_argument(
                "pool chunk",
                format!("{addr:#x}+{len}"),
                "a chunk mapped in the device's pool address range (this is a bug in rmm-rs)",
            ));
        };
        unmap_one(self.device, addr, l, h)?;
        mapped.remove(&addr);
        Ok(())
    }
}

/// Unmaps one chunk and releases its physical memory.
fn unmap_one(device: Device, addr: u64, len: u64, handle: RawPhysical) -> Result<()> {
    let (backend, dev) = (device.backend(), device.ordinal());
    backend.mem_unmap(dev, DevicePtr(addr), len as usize)?;
    backend.mem_release(dev, handle)
}

impl Drop for AddressSpace {
    fn drop(&mut self) {
        let (backend, dev) = (self.device.backend(), self.device.ordinal());
        for (addr, (len, h)) in std::mem::take(self.mapped.get_mut()) {
            tracing::warn!(
                device = dev,
                addr,
                len,
                "pool chunk still mapped when its address range goes; unmapping it"
            );
            if let Err(e) = unmap_one(self.device, addr, len, h) {
                tracing::error!("unmapping a pool chunk at {addr:#x}: {e}");
            }
        }
        if let Err(e) = backend.mem_address_free(dev, DevicePtr(self.base), self.size as usize) {
            tracing::error!(
                "giving back the pool address range of {} on device {dev}: {e}",
                fmt_bytes(self.size as usize)
            );
        }
    }
}
