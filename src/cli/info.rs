//! `rmm info`: backend, devices, memory.

use rmm::allocator::error::fmt_bytes;
use rmm::runtime::Inventory;

pub fn run() -> Result<(), Box<dyn std::error::Error>> {
    let inv = Inventory::collect()?;
    println!("backend: {}", inv.backend);
    println!("devices: {}", inv.devices.len());
    for d in &inv.devices {
        println!(
            "  [{}] {} ({}) compute {}.{}: {} total, {} free{}{}",
            d.ordinal,
            d.name,
            d.uuid,
            d.compute_capability.0,
            d.compute_capability.1,
            fmt_bytes(d.total_memory),
            fmt_bytes(d.free_memory),
            if d.supports_memory_pools {
                ", memory pools"
            } else {
                ""
            },
            if d.supports_managed_memory {
                ", managed memory"
            } else {
                ""
            },
        );
    }
    Ok(())
}
