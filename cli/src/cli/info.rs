//! `rmm info`: the configuration with the source of every value, the backend, every device
//! with its memory, and what each selected device's resource will be; as tables or JSON.

use clap::Args;
use rmm::config::ConfigLoader;
use rmm::runtime::{Inventory, StackPlan, device_facts, open_backend};
use rmm_cli::plural::count;
use rmm_cli::table::{Align, NONE, Table};
use rmm_cli::units::bytes;
use serde_json::json;

use super::format::OutputArgs;

/// Arguments of `rmm info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// --json, --quiet (only the exit status says whether the configuration is valid and the
    /// devices answer), --format.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// A selected device: its ordinal, its stack, and its spill threshold and host pool size
/// (`None`: spilling off).
type Selected = (u32, String, Option<(u64, Option<u64>)>);

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// Runs `rmm info`.
pub fn run(args: InfoArgs) -> Result<(), Box<dyn std::error::Error>> {
    let out = args.output;
    // A bad configuration stops here with its one error (exit status 1).
    let config = ConfigLoader::new().load()?;
    let b = open_backend(config.backend)?;
    let inv = Inventory::of(b)?;
    let facts = device_facts(b, &config)?;
    let resolved = config.resolve(&facts)?;
    let values = config.effective_values();
    // The same plan the runtime builds each device's stack from.
    let selected: Vec<Selected> = resolved
        .devices
        .iter()
        .map(|d| {
            (
                d.ordinal,
                StackPlan::new(&resolved, d).to_string(),
                d.spill.as_ref().map(|s| (s.threshold, s.host_pool_size)),
            )
        })
        .collect();
    if out.json {
        let doc = json!({
            "backend": inv.backend,
            "devices": inv.devices.iter().map(|d| json!({
                "ordinal": d.ordinal,
                "name": d.name,
                "uuid": d.uuid,
                "compute_capability": [d.compute_capability.0, d.compute_capability.1],
                "total_memory": d.total_memory,
                "free_memory": d.free_memory,
                "supports_memory_pools": d.supports_memory_pools,
                "supports_managed_memory": d.supports_managed_memory,
            })).collect::<Vec<_>>(),
            "configuration": values.iter().map(|v| json!({
                "key": v.key,
                "value": v.value,
                "source": v.source.to_string(),
            })).collect::<Vec<_>>(),
            "workers_per_device": resolved.workers_per_device,
            "selected": selected.iter().map(|(d, plan, spill)| json!({
                "device": d,
                "stack": plan,
                "spill": spill.map(|(threshold, host_pool)| json!({
                    "threshold": threshold,
                    "host_pool_size": host_pool,
                })),
            })).collect::<Vec<_>>(),
        });
        outln!("{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(());
    }
    if !out.text() {
        return Ok(());
    }
    outln!("backend: {}", inv.backend)?;
    outln!("units:   binary (1 GiB = 1024³ bytes)")?;
    outln!()?;
    let mut devices = Table::new([
        ("device", Align::Right),
        ("name", Align::Left),
        ("uuid", Align::Left),
        ("compute", Align::Left),
        ("total", Align::Right),
        ("free", Align::Right),
        ("memory pools", Align::Left),
        ("managed memory", Align::Left),
    ]);
    for d in &inv.devices {
        devices.row([
            d.ordinal.to_string(),
            d.name.clone(),
            d.uuid.clone(),
            format!("{}.{}", d.compute_capability.0, d.compute_capability.1),
            bytes(d.total_memory as u64),
            bytes(d.free_memory as u64),
            yes(d.supports_memory_pools).into(),
            yes(d.supports_managed_memory).into(),
        ]);
    }
    outln!("{}", out.table(&devices))?;
    outln!()?;
    outln!("configuration (every effective value and where it came from):")?;
    let mut config_table = Table::new([
        ("key", Align::Left),
        ("value", Align::Left),
        ("source", Align::Left),
    ]);
    for v in &values {
        config_table.row([v.key.clone(), v.value.clone(), v.source.to_string()]);
    }
    outln!("{}", out.table(&config_table))?;
    outln!()?;
    outln!(
        "selected devices ({} each):",
        count(resolved.workers_per_device, "worker", "workers")
    )?;
    let mut stacks = Table::new([
        ("device", Align::Right),
        ("stack", Align::Left),
        ("spill above", Align::Right),
        ("host pool", Align::Right),
    ]);
    for (d, plan, spill) in &selected {
        let (above, pool) = match spill {
            Some((threshold, pool)) => (bytes(*threshold), pool.map_or("none".into(), bytes)),
            None => ("off".into(), NONE.into()),
        };
        stacks.row([d.to_string(), plan.clone(), above, pool]);
    }
    outln!("{}", out.table(&stacks))?;
    Ok(())
}
