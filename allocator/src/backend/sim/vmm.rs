//! The virtual memory API on the simulated device, with CUDA's rules: sizes and addresses in
//! granules; a mapping needs a reservation and `cuMemSetAccess`; memory goes back once released and
//! unmapped. Physical memory counts as device memory and fails with `cuMemAlloc`'s faults.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::memory::{AllocKind, Backing};
use super::{SimBackend, oom};
use crate::backend::{DevicePtr, RawPhysical};
use crate::error::{Error, Result};

/// The granularity of physical memory and mappings (2 MiB, as on current GPUs).
pub(super) const GRANULARITY: usize = 2 << 20;
/// Start of device 0's reservable addresses: above all host (user space) and unbacked addresses.
const VMM_BASE: u64 = 1 << 52;
/// Size of each device's region of reservable addresses (64 TiB).
const VMM_REGION: u64 = 1 << 46;

#[derive(Debug)]
struct Physical {
    device: u32,
    len: usize,
    backing: Option<Arc<Backing>>,
    mappings: usize,
    released: bool,
}

/// Reservations and physical memory of every simulated device.
#[derive(Debug, Default)]
pub(super) struct VmmState {
    /// Reserved ranges: start → (device, length).
    reservations: BTreeMap<u64, (u32, u64)>,
    physical: HashMap<RawPhysical, Physical>,
}

impl VmmState {
    /// Physical allocations of `dev` not yet given back.
    pub(super) fn physical_on(&self, dev: u32) -> usize {
        self.physical.values().filter(|p| p.device == dev).count()
    }

    /// The lowest free, aligned start for `len` bytes in `dev`'s region.
    fn place(&self, dev: u32, len: u64) -> Option<u64> {
        let start = VMM_BASE + dev as u64 * VMM_REGION;
        let end = start + VMM_REGION;
        let mut at = start;
        for (&s, &(_, l)) in self.reservations.range(start..end) {
            if s >= at + len {
                break;
            }
            at = (s + l).next_multiple_of(GRANULARITY as u64);
        }
        (at + len <= end).then_some(at)
    }

    /// Whether `[addr, addr + len)` lies inside one reservation of `dev`.
    fn reserved(&self, dev: u32, addr: u64, len: u64) -> bool {
        self.reservations
            .range(..=addr)
            .next_back()
            .is_some_and(|(&s, &(d, l))| d == dev && addr + len <= s + l)
    }
}

fn check_granule(what: &'static str, value: u64) -> Result<()> {
    if value == 0 || !value.is_multiple_of(GRANULARITY as u64) {
        return Err(Error::invalid_argument(
            what,
            value,
            "a non-zero multiple of the allocation granularity (2 MiB on the simulated device)",
        ));
    }
    Ok(())
}

impl SimBackend {
    pub(super) fn vmm_reserve(&self, dev: u32, bytes: usize) -> Result<DevicePtr> {
        self.device(dev)?;
        check_granule("reserved range size", bytes as u64)?;
        let mut v = self.vmm.lock();
        let Some(addr) = v.place(dev, bytes as u64) else {
            return Err(oom(
                dev,
                "cuMemAddressReserve",
                bytes,
                "no room left in the device's address region",
            ));
        };
        v.reservations.insert(addr, (dev, bytes as u64));
        Ok(DevicePtr(addr))
    }

    pub(super) fn vmm_address_free(&self, dev: u32, ptr: DevicePtr, bytes: usize) -> Result<()> {
        let mut v = self.vmm.lock();
        if v.reservations.get(&ptr.addr()) != Some(&(dev, bytes as u64)) {
            return Err(Error::invalid_argument(
                "reserved range",
                format!("{ptr}+{bytes} on device {dev}"),
                "a whole range from cuMemAddressReserve on this device",
            ));
        }
        if self.table.lock().overlaps(ptr.addr(), bytes as u64) {
            return Err(Error::invalid_argument(
                "reserved range",
                format!("{ptr}+{bytes}"),
                "a range with nothing mapped in it (cuMemUnmap first)",
            ));
        }
        v.reservations.remove(&ptr.addr());
        Ok(())
    }

    pub(super) fn vmm_create(&self, dev: u32, bytes: usize) -> Result<RawPhysical> {
        self.device(dev)?;
        check_granule("physical allocation size", bytes as u64)?;
        let len = self.charge(dev, bytes, "cuMemCreate")?;
        let backing = self.back(dev, len, bytes, "cuMemCreate")?;
        let h = self.handle();
        self.vmm.lock().physical.insert(
            h,
            Physical {
                device: dev,
                len,
                backing,
                mappings: 0,
                released: false,
            },
        );
        Ok(h)
    }

    /// Drops `handle`'s physical memory if it is released and unmapped.
    fn reap(&self, v: &mut VmmState, handle: RawPhysical) -> Result<()> {
        if let Some(p) = v.physical.get(&handle)
            && p.released
            && p.mappings == 0
        {
            let dev = p.device;
            let len = p.len;
            v.physical.remove(&handle);
            self.device(dev)?.used.fetch_sub(len, Ordering::SeqCst);
        }
        Ok(())
    }

    pub(super) fn vmm_release(&self, dev: u32, handle: RawPhysical) -> Result<()> {
        let mut v = self.vmm.lock();
        match v.physical.get_mut(&handle) {
            Some(p) if p.device == dev && !p.released => p.released = true,
            _ => {
                return Err(Error::invalid_argument(
                    "physical memory handle",
                    format!("{handle:#x} on device {dev}"),
                    "a handle from cuMemCreate on this device, not yet released",
                ));
            }
        }
        self.reap(&mut v, handle)
    }

    pub(super) fn vmm_map(
        &self,
        dev: u32,
        ptr: DevicePtr,
        bytes: usize,
        handle: RawPhysical,
    ) -> Result<()> {
        check_granule("mapping address", ptr.addr())?;
        let mut v = self.vmm.lock();
        let backing = match v.physical.get(&handle) {
            Some(p) if p.device == dev && !p.released && p.len == bytes => p.backing.clone(),
            _ => {
                return Err(Error::invalid_argument(
                    "physical memory handle",
                    format!("{handle:#x} ({bytes} bytes) on device {dev}"),
                    "a live handle of this device, mapped whole",
                ));
            }
        };
        if !v.reserved(dev, ptr.addr(), bytes as u64) {
            return Err(Error::invalid_argument(
                "mapping",
                format!("{ptr}+{bytes}"),
                "a range inside one cuMemAddressReserve range of this device",
            ));
        }
        let mut table = self.table.lock();
        if table.overlaps(ptr.addr(), bytes as u64) {
            return Err(Error::invalid_argument(
                "mapping",
                format!("{ptr}+{bytes}"),
                "a range not mapped yet (cuMemUnmap first)",
            ));
        }
        let kind = AllocKind::Mapped {
            handle,
            accessible: false,
        };
        table.add(ptr.addr(), dev, bytes, kind, backing);
        if let Some(p) = v.physical.get_mut(&handle) {
            p.mappings += 1;
        }
        Ok(())
    }

    /// The mappings that cover `[ptr, ptr + bytes)` exactly, without a gap.
    fn mappings_covering(
        &self,
        table: &super::memory::AllocationTable,
        dev: u32,
        ptr: DevicePtr,
        bytes: usize,
        call: &'static str,
    ) -> Result<Vec<(u64, RawPhysical)>> {
        let mut at = ptr.addr();
        let end = at + bytes as u64;
        let mut found = Vec::new();
        for (start, a) in table.starting_in(ptr.addr(), bytes as u64) {
            match a.kind {
                AllocKind::Mapped { handle, .. } if start == at && a.device == dev => {
                    found.push((start, handle));
                    at = start + a.len as u64;
                }
                _ => break,
            }
        }
        if at != end || found.is_empty() {
            return Err(Error::invalid_argument(
                call,
                format!("{ptr}+{bytes} on device {dev}"),
                "a range made of whole mappings, without gaps",
            ));
        }
        Ok(found)
    }

    pub(super) fn vmm_unmap(&self, dev: u32, ptr: DevicePtr, bytes: usize) -> Result<()> {
        let mut v = self.vmm.lock();
        let mut table = self.table.lock();
        let found = self.mappings_covering(&table, dev, ptr, bytes, "cuMemUnmap")?;
        for (start, handle) in found {
            table.live.remove(&start);
            if let Some(p) = v.physical.get_mut(&handle) {
                p.mappings -= 1;
            }
            self.reap(&mut v, handle)?;
        }
        Ok(())
    }

    pub(super) fn vmm_set_access(&self, dev: u32, ptr: DevicePtr, bytes: usize) -> Result<()> {
        let mut table = self.table.lock();
        let found = self.mappings_covering(&table, dev, ptr, bytes, "cuMemSetAccess")?;
        for (start, handle) in found {
            if let Some(a) = table.live.get_mut(&start) {
                a.kind = AllocKind::Mapped {
                    handle,
                    accessible: true,
                };
            }
        }
        Ok(())
    }
}
