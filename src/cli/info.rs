//! `rmm info`: the configuration with the source of every value, the backend, every device
//! with its memory, and what each selected device's resource will be.

use rmm::allocator::backend::{self, BackendChoice};
use rmm::allocator::error::fmt_bytes;
use rmm::config::{ConfigLoader, DeviceFacts, render};
use rmm::runtime::Inventory;

pub fn run() -> Result<(), Box<dyn std::error::Error>> {
    // A bad configuration stops here with its one error (exit status 1).
    let config = ConfigLoader::new().load()?;
    let choice =
        BackendChoice::parse(config.backend.as_str(), "backend (rmm.toml or RMM_BACKEND)")?;
    let b = backend::open(choice)?;
    // `info` is the first user of the backend in this process.
    let _ = backend::install_global(b);
    let inv = Inventory::of(b)?;
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
    let facts: Vec<DeviceFacts> = inv
        .devices
        .iter()
        .map(|d| DeviceFacts {
            ordinal: d.ordinal,
            uuid: d.uuid.clone(),
            total_memory: d.total_memory as u64,
            free_memory: d.free_memory as u64,
        })
        .collect();
    let resolved = config.resolve(&facts)?;
    println!();
    println!("configuration (every effective value and where it came from):");
    print!("{}", render(&config.effective_values()));
    println!();
    println!(
        "selected devices ({} worker(s) each):",
        resolved.workers_per_device
    );
    let opt = |v: Option<u64>| v.map_or("none".to_string(), |b| fmt_bytes(b as usize));
    for d in &resolved.devices {
        let upstream = if d.pool.use_async {
            "cuMemAllocAsync"
        } else if d.pool.managed {
            "cuMemAllocManaged"
        } else {
            "cuMemAlloc"
        };
        let pool = if d.pool.enabled {
            format!(
                "pool over {upstream}, initial {}, maximum {}",
                opt(d.pool.initial_size),
                opt(d.pool.maximum_size)
            )
        } else {
            format!("{upstream}, no pool")
        };
        println!(
            "  [{}] {pool}; limit {}; spill {}; log {}",
            d.ordinal,
            opt(d.memory_limit),
            d.spill.as_ref().map_or("off".into(), |s| format!(
                "above {}",
                fmt_bytes(s.threshold as usize)
            )),
            d.log_file
                .as_ref()
                .map_or("off".into(), |p| p.display().to_string()),
        );
    }
    Ok(())
}
