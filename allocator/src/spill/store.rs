//! [`SpillStore`]: where one device's spilled data goes: a pinned host pool, optionally files
//! behind it ([`SpillTiers`]), and the copy streams between the tiers. Replaced tiers
//! ([`SpillStore::replace_tiers`]) live on while spilled data is in them.

use std::path::Path;
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, RwLock};

use super::copy::CopyStreams;
use super::disk::DiskStore;
use crate::device::Device;
use crate::error::Result;
use crate::resource::{PinnedHostPool, WeakPinnedHostPool};

/// The tiers new spills of one device go to: a pinned host pool and optionally a disk tier.
#[derive(Debug)]
pub struct SpillTiers {
    host: PinnedHostPool,
    disk: Option<Arc<DiskStore>>,
}

impl SpillTiers {
    /// The pinned host pool.
    pub fn host(&self) -> &PinnedHostPool {
        &self.host
    }

    /// True when there is a disk tier.
    pub fn has_disk(&self) -> bool {
        self.disk.is_some()
    }

    /// The disk tier's directory.
    pub fn disk_directory(&self) -> Option<&Path> {
        self.disk.as_ref().map(|d| d.directory())
    }

    pub(crate) fn disk(&self) -> Option<&Arc<DiskStore>> {
        self.disk.as_ref()
    }
}

/// Replaced tiers still holding data, watched (not kept alive) so the figures count it until gone.
#[derive(Debug, Default)]
struct Retired {
    hosts: Vec<WeakPinnedHostPool>,
    disks: Vec<Weak<DiskStore>>,
}

impl Retired {
    fn prune(&mut self) {
        self.hosts.retain(|h| h.upgrade().is_some());
        self.disks.retain(|d| d.strong_count() > 0);
    }
}

/// The lower tiers of one device's spillable buffers. Shared (`Arc`) by its buffers.
#[derive(Debug)]
pub struct SpillStore {
    device: Device,
    tiers: RwLock<Arc<SpillTiers>>,
    retired: Mutex<Retired>,
    copies: CopyStreams,
}

impl SpillStore {
    /// A store for `device` spilling to `host`, then to files under `disk_directory` (created if
    /// missing) when `host` is full.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an unusable `disk_directory`;
    /// else pinning staging memory or creating copy streams failed.
    pub fn new(
        device: Device,
        host: PinnedHostPool,
        disk_directory: Option<&Path>,
    ) -> Result<Arc<SpillStore>> {
        let disk = disk_directory
            .map(|dir| DiskStore::new(device, dir).map(Arc::new))
            .transpose()?;
        Ok(Arc::new(SpillStore {
            device,
            tiers: RwLock::new(Arc::new(SpillTiers { host, disk })),
            retired: Mutex::new(Retired::default()),
            copies: CopyStreams::new(device)?,
        }))
    }

    /// Changes the tiers new spills go to (`None` keeps either; `Some(None)` removes the disk tier);
    /// returns the replaced ones for [`restore_tiers`](Self::restore_tiers). Spilled data stays.
    ///
    /// # Errors
    /// Making the disk tier failed (unwritable directory, unpinnable staging); no change.
    pub fn replace_tiers(
        &self,
        host: Option<PinnedHostPool>,
        disk: Option<Option<&Path>>,
    ) -> Result<Arc<SpillTiers>> {
        let current = self.tiers();
        let disk = match disk {
            None => current.disk.clone(),
            Some(None) => None,
            Some(Some(dir)) => Some(Arc::new(DiskStore::new(self.device, dir)?)),
        };
        let host = host.unwrap_or_else(|| current.host.clone());
        Ok(self.install(Arc::new(SpillTiers { host, disk })))
    }

    /// Restores `tiers` from [`replace_tiers`](Self::replace_tiers); spilled data stays.
    pub fn restore_tiers(&self, tiers: Arc<SpillTiers>) {
        self.install(tiers);
    }

    fn install(&self, new: Arc<SpillTiers>) -> Arc<SpillTiers> {
        let old = std::mem::replace(&mut *self.tiers.write(), new);
        let mut retired = self.retired.lock();
        retired.prune();
        if !retired.hosts.iter().any(|h| h.is(&old.host)) {
            retired.hosts.push(old.host.downgrade());
        }
        if let Some(d) = &old.disk
            && !retired
                .disks
                .iter()
                .any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(d)))
        {
            retired.disks.push(Arc::downgrade(d));
        }
        old
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The tiers new spills go to now.
    pub fn tiers(&self) -> Arc<SpillTiers> {
        Arc::clone(&self.tiers.read())
    }

    /// The pinned host pool new spills go to.
    pub fn host(&self) -> PinnedHostPool {
        self.tiers.read().host.clone()
    }

    /// True when new spills can go on to disk.
    pub fn has_disk(&self) -> bool {
        self.tiers.read().has_disk()
    }

    /// The directory new spill files go to.
    pub fn disk_directory(&self) -> Option<std::path::PathBuf> {
        self.tiers
            .read()
            .disk_directory()
            .map(std::path::Path::to_path_buf)
    }

    /// Bytes of spilled data in pinned host memory now, in the current and replaced-but-alive pools
    /// (kept copies: [`host_kept_bytes`](Self::host_kept_bytes)).
    pub fn host_bytes(&self) -> u64 {
        self.over_host_pools(|h| h.used().saturating_sub(h.reclaimable()))
    }

    /// Bytes of pinned host memory holding copies of data back on the device (re-spilling is free).
    pub fn host_kept_bytes(&self) -> u64 {
        self.over_host_pools(PinnedHostPool::reclaimable)
    }

    /// The part of [`host_bytes`](Self::host_bytes) in pageable memory (whole 2 MiB pages).
    pub fn host_pageable_bytes(&self) -> u64 {
        self.over_host_pools(PinnedHostPool::pageable)
    }

    /// Bytes ever spilled into pageable memory, by the current host pool and the replaced ones
    /// still alive.
    pub fn host_pageable_total_bytes(&self) -> u64 {
        self.over_host_pools(|h| h.pageable_total() as usize)
    }

    /// `bytes` summed over the current host pool and the replaced ones still alive.
    fn over_host_pools(&self, bytes: impl Fn(&PinnedHostPool) -> usize) -> u64 {
        let current = self.tiers.read().host.clone();
        let mut retired = self.retired.lock();
        retired.prune();
        let old: usize = retired
            .hosts
            .iter()
            .filter_map(WeakPinnedHostPool::upgrade)
            .filter(|h| !h.same_pool(&current))
            .map(|h| bytes(&h))
            .sum();
        (bytes(&current) + old) as u64
    }

    /// Bytes held in spill files now (under the current disk tier and replaced ones).
    pub fn disk_bytes(&self) -> u64 {
        let current = self.tiers.read().disk.clone();
        let mut retired = self.retired.lock();
        retired.prune();
        let old: u64 = retired
            .disks
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|d| !current.as_ref().is_some_and(|c| Arc::ptr_eq(c, d)))
            .map(|d| d.held())
            .sum();
        current.map_or(0, |d| d.held()) + old
    }

    pub(crate) fn copies(&self) -> &CopyStreams {
        &self.copies
    }
}
