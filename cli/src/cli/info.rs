//! `rmm info`: the configuration with the source of every value, the backend, every device
//! with its memory, and what each selected device's resource will be.

use rmm::allocator::error::fmt_bytes;
use rmm::config::{ConfigLoader, render};
use rmm::runtime::{Inventory, StackPlan, device_facts, open_backend};

pub fn run() -> Result<(), Box<dyn std::error::Error>> {
    // A bad configuration stops here with its one error (exit status 1).
    let config = ConfigLoader::new().load()?;
    let b = open_backend(config.backend)?;
    let inv = Inventory::of(b)?;
    outln!("backend: {}", inv.backend)?;
    outln!("devices: {}", inv.devices.len())?;
    for d in &inv.devices {
        outln!(
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
        )?;
    }
    let facts = device_facts(b)?;
    let resolved = config.resolve(&facts)?;
    outln!()?;
    outln!("configuration (every effective value and where it came from):")?;
    out!("{}", render(&config.effective_values()))?;
    outln!()?;
    outln!(
        "selected devices ({} each):",
        rmm_cli::plural::count(resolved.workers_per_device, "worker", "workers")
    )?;
    let opt = |v: Option<u64>| v.map_or("none".to_string(), |b| fmt_bytes(b as usize));
    for d in &resolved.devices {
        // The same plan the runtime builds each device's stack from.
        outln!("  [{}] {}", d.ordinal, StackPlan::new(&resolved, d))?;
        outln!(
            "      spill {}",
            d.spill.as_ref().map_or("off".into(), |s| format!(
                "above {}, host pool {}",
                fmt_bytes(s.threshold as usize),
                opt(s.host_pool_size)
            )),
        )?;
    }
    Ok(())
}
