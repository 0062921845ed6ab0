//! The inventory of the process: which backend runs and what each device has.

use rmm_allocator::backend::{self, Backend};
use rmm_allocator::{Device, Result};

/// One device as `rmm info` and configuration resolution see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSummary {
    /// Ordinal.
    pub ordinal: u32,
    /// Name, e.g. `NVIDIA H200`.
    pub name: String,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Compute capability.
    pub compute_capability: (u32, u32),
    /// Total memory in bytes.
    pub total_memory: usize,
    /// Free memory in bytes at the time of the inventory.
    pub free_memory: usize,
    /// Stream-ordered allocation support.
    pub supports_memory_pools: bool,
    /// Managed memory support.
    pub supports_managed_memory: bool,
}

/// The backend and its devices.
#[derive(Debug, Clone)]
pub struct Inventory {
    /// One-line description of the backend.
    pub backend: String,
    /// Every device.
    pub devices: Vec<DeviceSummary>,
}

impl Inventory {
    /// Takes the inventory of the process-wide backend.
    ///
    /// # Errors
    /// The backend's opening error ([`Error::NoDriver`](rmm_allocator::Error::NoDriver), …); else
    /// as [`Inventory::of`].
    pub fn collect() -> Result<Inventory> {
        Inventory::of(backend::global()?)
    }

    /// Takes the inventory of `backend`.
    ///
    /// # Errors
    /// [`Error::Driver`](rmm_allocator::Error::Driver): a device's properties or memory unreadable.
    pub fn of(backend: &'static dyn Backend) -> Result<Inventory> {
        let summary = |ordinal| -> Result<DeviceSummary> {
            let dev = Device::on(backend, ordinal)?;
            let p = dev.properties()?;
            let m = dev.mem_info()?;
            Ok(DeviceSummary {
                ordinal,
                name: p.name,
                uuid: p.uuid,
                compute_capability: p.compute_capability,
                total_memory: p.total_memory,
                free_memory: m.free,
                supports_memory_pools: p.supports_memory_pools,
                supports_managed_memory: p.supports_managed_memory,
            })
        };
        let devices = (0..backend.device_count())
            .map(summary)
            .collect::<Result<Vec<_>>>()?;
        Ok(Inventory {
            backend: backend.describe(),
            devices,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmm_allocator::backend::{SimBackend, SimConfig, SimMemoryMode};

    #[test]
    fn inventory_lists_every_simulated_device() {
        let b = SimBackend::leak(SimConfig {
            devices: 3,
            capacity: 1 << 30,
            mode: SimMemoryMode::Unbacked,
        })
        .unwrap();
        let inv = Inventory::of(b).unwrap();
        assert_eq!(inv.devices.len(), 3);
        assert_eq!(inv.devices[2].ordinal, 2);
        assert_eq!(inv.devices[1].total_memory, 1 << 30);
        assert_eq!(inv.devices[1].free_memory, 1 << 30);
        assert!(inv.backend.starts_with("sim (3 devices"));
    }
}
