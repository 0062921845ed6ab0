//! [`SpillStore`]: where one device's spilled data goes: a pinned host pool, optionally a
//! directory of files behind it, and the copy streams that move data between the tiers.

use std::path::Path;
use std::sync::Arc;

use super::copy::CopyStreams;
use super::disk::DiskStore;
use crate::device::Device;
use crate::error::Result;
use crate::resource::PinnedHostPool;

/// The lower tiers of one device's spillable buffers. Shared (`Arc`) by its buffers.
#[derive(Debug)]
pub struct SpillStore {
    device: Device,
    host: PinnedHostPool,
    disk: Option<DiskStore>,
    copies: CopyStreams,
}

impl SpillStore {
    /// A store for `device` spilling to `host`, and on to files under `disk_directory`
    /// (created if missing) when `host` is full.
    pub fn new(
        device: Device,
        host: PinnedHostPool,
        disk_directory: Option<&Path>,
    ) -> Result<Arc<SpillStore>> {
        let disk = disk_directory
            .map(|dir| DiskStore::new(device, dir))
            .transpose()?;
        Ok(Arc::new(SpillStore {
            device,
            host,
            disk,
            copies: CopyStreams::new(device)?,
        }))
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

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

    /// Bytes held in spill files now.
    pub fn disk_bytes(&self) -> u64 {
        self.disk.as_ref().map_or(0, |d| d.held())
    }

    pub(crate) fn disk(&self) -> Option<&DiskStore> {
        self.disk.as_ref()
    }

    pub(crate) fn copies(&self) -> &CopyStreams {
        &self.copies
    }
}
